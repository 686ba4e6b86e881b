//! Signals `zygote run` sends itself: it stops when its child stops, and
//! dies of the signal its child died of, so that a shell sees the wrapper
//! as it would have seen the child.

use std::io;
use std::ptr;

use rustix::process::{Resource, Rlimit, Signal, getpid, getrlimit, kill_process, setrlimit};

/// Sets `signal`'s action to `SIG_DFL` and returns the previous one.
fn set_default(signal: i32) -> io::Result<libc::sigaction> {
    // SAFETY: `sigaction` is a plain C struct for which all-zero bytes are
    // valid: handler SIG_DFL (0), no flags, an empty mask.
    let default_action = unsafe { std::mem::zeroed::<libc::sigaction>() };
    // SAFETY: as above; the kernel overwrites it.
    let mut old = unsafe { std::mem::zeroed::<libc::sigaction>() };
    // SAFETY: valid pointers to initialised structs; a bad signal number
    // fails with EINVAL.
    if unsafe { libc::sigaction(signal, &raw const default_action, &raw mut old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
}

/// Unblocks `signal` in the calling thread.
fn unblock(signal: i32) {
    // SAFETY: `sigset_t` is a plain C struct; sigemptyset initialises it.
    let mut set = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    // SAFETY: valid, writable set; a bad number fails without effect.
    unsafe {
        libc::sigemptyset(&raw mut set);
        libc::sigaddset(&raw mut set, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const set, ptr::null_mut());
    }
}

/// Ends this process by `signal` with its default action, as its child
/// ended: the action is reset, the signal unblocked in this thread and
/// raised at it, so no other thread can take it. Core dumps are turned
/// off first: the child dumped core, the wrapper has nothing worth
/// dumping, and its core would only overwrite the child's.
///
/// Returns only if the default action of `signal` does not end a process
/// (e.g. `SIGCHLD`) or cannot be set; the caller then exits with 128 +
/// `signal`, as a shell would report it.
pub fn die_of_signal(signal: i32) {
    // The hard limit is kept: raising it back would need privilege.
    let hard = getrlimit(Resource::Core).maximum;
    let _ = setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: hard,
        },
    );
    // SIGKILL's action cannot be changed (sigaction fails), nor need be.
    if signal != libc::SIGKILL && set_default(signal).is_err() {
        return;
    }
    unblock(signal);
    // SAFETY: raise is a plain libc call; with SIG_DFL a fatal signal ends
    // the process before it returns.
    unsafe { libc::raise(signal) };
}

/// [`die_of_signal`], or exit code 128 + `signal` where it returns.
pub fn die_by(signal: i32) -> ! {
    die_of_signal(signal);
    std::process::exit(128 + (signal & 0x7f))
}

/// Stops this process by `signal` (SIGTSTP, SIGTTIN or SIGTTOU) with its
/// default action, as if no handler were installed, and restores the
/// handler once a SIGCONT continues it.
///
/// # Errors
///
/// When the action cannot be changed (a bad signal number).
pub fn stop_self_by(signal: i32) -> io::Result<()> {
    let old = set_default(signal)?;
    unblock(signal);
    // SAFETY: raise is a plain libc call; with SIG_DFL the process stops
    // here (or, in an orphaned process group, the kernel discards it).
    unsafe { libc::raise(signal) };
    // SAFETY: restores the action read above, a valid struct.
    if unsafe { libc::sigaction(signal, &raw const old, ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Stops this process with `signal` (`SIGTSTP`, `SIGTTIN`, `SIGTTOU` or
/// `SIGSTOP`) and returns once it is continued. The stop signals other
/// than `SIGSTOP` must have their default action, which they keep in
/// `zygote run`. In an orphaned process group the kernel discards them and
/// this returns at once.
pub fn stop_self(signal: i32) {
    let named = Signal::from_named_raw(signal).unwrap_or(Signal::STOP);
    let _ = kill_process(getpid(), named);
}
