//! Signal dispositions of the `zygote run` process itself: stopping by a
//! signal and dying by one, as the child did, so that a shell sees the
//! wrapper as it would have seen the child.

use std::io;
use std::ptr;

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

/// Ends this process by `signal`, with its default action, as the child
/// ended; without a core file of its own (the child's, if any, is the
/// one that matters). Falls back to exit code `128 + signal` when the
/// signal does not end the process (e.g. SIGCHLD).
pub fn die_by(signal: i32) -> ! {
    // A core of the wrapper would only overwrite the child's.
    let core = rustix::process::Resource::Core;
    let hard = rustix::process::getrlimit(core).maximum;
    let _ = rustix::process::setrlimit(
        core,
        rustix::process::Rlimit {
            current: Some(0),
            maximum: hard,
        },
    );
    // SIGKILL's action cannot be changed (sigaction fails), nor need be.
    if signal == libc::SIGKILL || set_default(signal).is_ok() {
        unblock(signal);
        // SAFETY: raise is a plain libc call; with SIG_DFL a fatal signal
        // ends the process here.
        unsafe { libc::raise(signal) };
    }
    std::process::exit(128 + (signal & 0x7f))
}
