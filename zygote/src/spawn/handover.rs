//! The process-level steps of a live upgrade: taking over the fds an
//! earlier image handed down, and re-executing the daemon in place; and
//! holding the stop signals pending until their handlers exist, at any
//! start.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::process::{Child, Command, ExitStatus};
use std::ptr;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// The signals that stop or upgrade `zygote serve` (a private zygote
/// ignores SIGHUP and SIGINT): held pending from the start, and across an
/// upgrade's exec, so that none arriving before their handlers exist
/// kills the process by their default action.
const HELD: [i32; 3] = [libc::SIGHUP, libc::SIGTERM, libc::SIGINT];

fn held_set() -> libc::sigset_t {
    // SAFETY: sigset_t is a plain C struct; all-zero bytes are valid, and
    // sigemptyset/sigaddset only write into it.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&raw mut set);
        for signal in HELD {
            libc::sigaddset(&raw mut set, signal);
        }
        set
    }
}

fn mask_held(how: libc::c_int) {
    let set = held_set();
    // SAFETY: `set` is a valid sigset_t; this changes this thread's mask.
    unsafe { libc::pthread_sigmask(how, &raw const set, ptr::null_mut()) };
}

/// Unblocks the stop and upgrade signals on this thread: call it once
/// their handlers are installed (signals that came since
/// [`hold_stop_signals`], or during an upgrade's exec, are delivered
/// then).
pub fn release_held_signals() {
    mask_held(libc::SIG_UNBLOCK);
}

/// The calling thread's signal mask before [`hold_stop_signals`].
pub struct SignalMask(libc::sigset_t);

impl std::fmt::Debug for SignalMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignalMask")
    }
}

impl SignalMask {
    /// Puts this mask back on the calling thread: a signal that came
    /// meanwhile and is no longer blocked is delivered now.
    pub fn restore(self) {
        // SAFETY: a mask read by pthread_sigmask; this changes this
        // thread's mask only.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &raw const self.0, ptr::null_mut()) };
    }
}

/// Blocks SIGHUP, SIGTERM and SIGINT on the calling thread, and so on
/// every thread it starts later, until [`release_held_signals`]: call it
/// first thing, while the process has one thread, so that these signals
/// are held pending, not fatal, until their handlers exist. Children never
/// inherit the mask (each sets an empty one before exec).
pub fn hold_stop_signals() -> SignalMask {
    let set = held_set();
    // SAFETY: sigset_t is a plain C struct; all-zero bytes are valid, and
    // pthread_sigmask overwrites it with the old mask.
    let mut old = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    // SAFETY: both sets are valid; this changes this thread's mask only.
    // It cannot fail with a valid `how` and valid pointers.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, &raw mut old) };
    SignalMask(old)
}

/// Takes ownership of an fd an earlier image of this process handed down
/// by number, and marks it close-on-exec again.
///
/// # Errors
///
/// `EBADF` when nothing is open at `raw`.
pub fn adopt_fd(raw: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only reads the flags of whatever is at `raw`.
    if raw < 3 || unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: `raw` is open, and nothing else in this image owns it: it
    // was handed down by number for exactly this owner, and is adopted
    // once.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
    Ok(fd)
}

/// Replaces this process's image with `path`, keeping its pid, its
/// children and every fd not marked close-on-exec. Returns only on
/// failure, with everything as before.
pub fn exec_in_place(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut args: Vec<*const libc::c_char> = argv.iter().map(|arg| arg.as_ptr()).collect();
    args.push(ptr::null());
    let mut env: Vec<*const libc::c_char> = envp.iter().map(|var| var.as_ptr()).collect();
    env.push(ptr::null());
    mask_held(libc::SIG_BLOCK);
    // The next image blocks it again first thing; one that does not (an
    // older version, rolled back to) must still get its SIGCHLD. Exits
    // meanwhile are found by its first look, as at any start.
    super::sigchld::unblock_child_signal();
    // SAFETY: `path`, `args` and `env` are NUL-terminated strings in
    // NULL-terminated arrays that outlive the call; execve only returns on
    // failure, with the process unchanged.
    unsafe { libc::execve(path.as_ptr(), args.as_ptr(), env.as_ptr()) };
    let error = io::Error::last_os_error();
    let _ = super::sigchld::block_child_signal();
    mask_held(libc::SIG_UNBLOCK);
    error
}

/// Runs `command` to its end, at most `timeout` (killed past it), and
/// returns its status and output. Its pid is listed as the daemon's own
/// child, so that the orphan reaper leaves its exit to us.
///
/// # Errors
///
/// When it cannot start, cannot be waited for, or overran `timeout`.
pub fn run_own(mut command: Command, timeout: Duration) -> io::Result<(ExitStatus, String)> {
    let gate = super::OWN
        .gate
        .read()
        .unwrap_or_else(PoisonError::into_inner);
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child: Child = child?;
    let pid = child.id() as i32;
    super::OWN
        .pids
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pid);
    drop(gate);
    let deadline = Instant::now() + timeout;
    let outcome = loop {
        match child.try_wait() {
            Ok(Some(_)) => {
                break child
                    .wait_with_output()
                    .map(|output| (output.status, output));
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("did not finish within {} s", timeout.as_secs()),
                ));
            }
            Err(error) => break Err(error),
        }
    };
    super::forget_own(pid);
    outcome.map(|(status, output)| {
        let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stdout));
        (status, text)
    })
}

/// Clears (`inherit`) or sets close-on-exec on `raw`, an fd this process
/// owns and keeps open: the fds a live upgrade hands to the new image.
///
/// # Errors
///
/// The `fcntl` error (`EBADF` when nothing is open at `raw`).
pub fn set_inheritable(raw: RawFd, inherit: bool) -> io::Result<()> {
    let flags = if inherit { 0 } else { libc::FD_CLOEXEC };
    // SAFETY: F_SETFD only changes the close-on-exec flag of `raw`; it
    // neither closes nor creates an fd.
    if unsafe { libc::fcntl(raw, libc::F_SETFD, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The fds above 2 open without close-on-exec: right after an exec, the
/// ones the earlier image handed down (whatever this image opened itself
/// is close-on-exec).
pub fn inherited_fds() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<RawFd>().ok())
        .filter(|fd| *fd > 2)
        // SAFETY: F_GETFD only reads the flags of whatever is at `fd`.
        .filter(|fd| unsafe { libc::fcntl(*fd, libc::F_GETFD) } == 0)
        .collect()
}
