//! The daemon's `SIGCHLD`: blocked in every thread from the start and read
//! from a signalfd (Linux 2.6.22), so that no handler runs, and no signal
//! frame is built, for each child's exit.
//!
//! A standard signal already pending is not queued again and wakes no
//! signalfd reader: while SIGCHLD is left pending, further exits cost the
//! kernel a bit test. Children never inherit the mask: every child sets
//! its own (empty) before exec, see `child::reset_signals`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr;

/// A set holding `SIGCHLD` alone.
fn child_set() -> libc::sigset_t {
    // SAFETY: sigset_t is a plain C struct; all-zero bytes are valid, and
    // sigemptyset/sigaddset only write into it.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&raw mut set);
        libc::sigaddset(&raw mut set, libc::SIGCHLD);
        set
    }
}

fn mask_child_signal(how: libc::c_int) -> io::Result<()> {
    let set = child_set();
    // SAFETY: `set` is a valid sigset_t; this changes this thread's mask.
    let ret = unsafe { libc::pthread_sigmask(how, &raw const set, ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(())
}

/// Gives `SIGCHLD` its default action and blocks it in the calling
/// thread, and so in every thread it starts later. A daemon calls it
/// first, while it has one thread: a thread that left it unblocked would
/// take the signal (and, with the default action, discard it) before the
/// signalfd sees it. An ignored `SIGCHLD` (inherited across exec, or a
/// template's program's) would have the kernel reap every child at exit,
/// before its pidfd's `waitid`.
///
/// # Errors
///
/// The `sigaction` or `pthread_sigmask` error (none is expected).
pub fn block_child_signal() -> io::Result<()> {
    // SAFETY: `sigaction` is a plain C struct for which all-zero bytes are
    // valid: handler SIG_DFL (0), no flags, an empty mask.
    let default_action = unsafe { std::mem::zeroed::<libc::sigaction>() };
    // SAFETY: a valid struct for the call's duration; the old action is
    // not asked for. No handler of ours is installed for SIGCHLD.
    if unsafe { libc::sigaction(libc::SIGCHLD, &raw const default_action, ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    mask_child_signal(libc::SIG_BLOCK)
}

/// Unblocks `SIGCHLD` in the calling thread: before a live upgrade's
/// exec, so that the next image starts as from a shell whatever it does
/// with `SIGCHLD` (this one blocks it again first thing).
pub(super) fn unblock_child_signal() {
    let _ = mask_child_signal(libc::SIG_UNBLOCK);
}

/// A `signalfd` for `SIGCHLD`, close-on-exec and non-blocking; each read
/// of [`SIGNALFD_SIGINFO_BYTES`] takes one pending `SIGCHLD`.
///
/// # Errors
///
/// The `signalfd` error.
pub fn child_signal_fd() -> io::Result<OwnedFd> {
    let set = child_set();
    // SAFETY: `set` is a valid sigset_t for the call's duration; -1 asks
    // for a new fd.
    let fd = unsafe { libc::signalfd(-1, &raw const set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this fd; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The size of one `struct signalfd_siginfo`, what a read of a signalfd
/// returns per signal.
pub const SIGNALFD_SIGINFO_BYTES: usize = std::mem::size_of::<libc::signalfd_siginfo>();

/// The threads of this process that do not block `SIGCHLD` (from
/// `SigBlk` in `/proc/self/task/*/status`): a signalfd for it only works
/// when there are none.
///
/// # Errors
///
/// When `/proc/self/task` cannot be listed.
pub fn threads_taking_child_signal() -> io::Result<Vec<i32>> {
    let bit = 1u64 << (libc::SIGCHLD - 1);
    let mut taking = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")?.flatten() {
        // A thread that just ended has no status left: not one that takes it.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let blocked = status
            .lines()
            .find_map(|line| line.strip_prefix("SigBlk:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok());
        if blocked.is_none_or(|mask| mask & bit == 0) {
            taking.extend(
                task.file_name()
                    .to_str()
                    .and_then(|tid| tid.parse::<i32>().ok()),
            );
        }
    }
    Ok(taking)
}
