//! Signals a process sends itself: `zygote run` stops when its child
//! stops, and dies of the signal its child died of, so that a shell sees
//! what it would see without the wrapper.

use std::ptr;

use rustix::process::{Resource, Rlimit, Signal, getpid, kill_process, setrlimit};

/// Ends this process with `signal`, as its child ended: the handler is
/// reset to the default and the signal unblocked, then raised. Core dumps
/// are turned off first: the child dumped core, the wrapper has nothing
/// worth dumping.
///
/// Returns only if the default action of `signal` does not end a process
/// (e.g. `SIGCHLD`) or it cannot be raised; the caller then exits with
/// 128 + `signal`, as a shell would report it.
pub fn die_of_signal(signal: i32) {
    let Some(named) = Signal::from_named_raw(signal) else {
        return;
    };
    let _ = setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: None,
        },
    );
    // SAFETY: sets the default action from a zeroed (SIG_DFL, no flags,
    // empty mask) struct; no handler of ours can be running concurrently
    // on this thread, and others keep working with the default action.
    let reset = unsafe {
        let default_action = std::mem::zeroed::<libc::sigaction>();
        libc::sigaction(signal, &raw const default_action, ptr::null_mut())
    };
    // SIGKILL's action cannot be changed (sigaction fails), nor need be.
    if reset != 0 && signal != libc::SIGKILL {
        return;
    }
    // SAFETY: unblocks one signal in this thread's mask from a valid set.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&raw mut set);
        libc::sigaddset(&raw mut set, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const set, ptr::null_mut());
    }
    // A process-directed signal may be taken by another thread; with the
    // default action it ends the whole process either way.
    let _ = kill_process(getpid(), named);
    // Give a pending signal the chance to be delivered before returning.
    std::thread::sleep(std::time::Duration::from_millis(100));
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
