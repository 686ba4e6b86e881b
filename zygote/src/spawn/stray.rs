//! Stray signals: those that mean nothing to a zygote (the shared daemon,
//! a private zygote, a template) yet whose default action would end it.
//!
//! A child that announces itself with `kill(getppid(), SIGUSR1)` (Xvfb
//! does, and so do many test programs) signals its zygote, not the program
//! that asked for it. These signals are blocked in every thread from the
//! start and read from a signalfd, so that each is logged with its sender
//! and otherwise has no effect. Their dispositions stay `SIG_DFL`, and
//! every child sets an empty mask before exec (`child::reset_signals`), so
//! children see them with their default action.
//!
//! Not stray, and left alone: SIGTERM and SIGINT (stop), SIGHUP (upgrade,
//! or ignored by a private zygote), SIGQUIT (quit with a core, for
//! debugging), the stop signals (a zygote in a terminal can be suspended),
//! the faults (SEGV, BUS, FPE, ILL, TRAP, SYS, ABRT), SIGKILL and SIGSTOP,
//! SIGPIPE (ignored by the Rust runtime), SIGCHLD (see `sigchld`), and
//! the two real-time signals glibc keeps for itself (32 and 33: thread
//! cancellation and `setuid` across threads).

use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::ptr;

/// The fixed-number stray signals. Real-time signals from `SIGRTMIN()`
/// to `SIGRTMAX()` are stray too.
pub const STRAY_SIGNALS: [i32; 12] = [
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO,
    libc::SIGPWR,
    libc::SIGWINCH,
    libc::SIGURG,
    libc::SIGSTKFLT,
    libc::SIGXCPU,
    libc::SIGXFSZ,
];

/// Every stray signal: [`STRAY_SIGNALS`] and the real-time signals the C
/// library leaves to programs.
fn stray_set() -> libc::sigset_t {
    // SAFETY: sigset_t is a plain C struct; all-zero bytes are valid, and
    // sigemptyset/sigaddset only write into it.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&raw mut set);
        for signal in STRAY_SIGNALS {
            libc::sigaddset(&raw mut set, signal);
        }
        for signal in libc::SIGRTMIN()..=libc::SIGRTMAX() {
            libc::sigaddset(&raw mut set, signal);
        }
        set
    }
}

/// Blocks every stray signal in the calling thread, and so in every thread
/// it starts later: call it while the process has one thread, before
/// [`stray_signal_fd`]. A thread that left them unblocked would take one
/// with its default action, which ends the process.
///
/// # Errors
///
/// The `pthread_sigmask` error (none is expected).
pub fn block_stray_signals() -> io::Result<()> {
    let set = stray_set();
    // SAFETY: `set` is a valid sigset_t; this changes this thread's mask.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(())
}

/// A `signalfd` for every stray signal, close-on-exec and non-blocking.
///
/// # Errors
///
/// The `signalfd` error.
pub fn stray_signal_fd() -> io::Result<OwnedFd> {
    let set = stray_set();
    // SAFETY: `set` is a valid sigset_t for the call's duration; -1 asks
    // for a new fd.
    let fd = unsafe { libc::signalfd(-1, &raw const set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this fd; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One signal taken from a [`stray_signal_fd`], and who sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StraySignal {
    /// The signal number.
    pub signal: i32,
    /// The sender's pid as the kernel recorded it (0 for the kernel).
    pub sender_pid: u32,
    /// The sender's real uid.
    pub sender_uid: u32,
}

/// Takes one pending stray signal from `fd`, a [`stray_signal_fd`].
///
/// # Errors
///
/// `WouldBlock` when none is pending; any other read error.
pub fn read_stray_signal(fd: impl AsFd) -> io::Result<StraySignal> {
    // SAFETY: signalfd_siginfo is a plain C struct; all-zero bytes are valid.
    let mut info = unsafe { std::mem::zeroed::<libc::signalfd_siginfo>() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: `info` is a writable struct of exactly `size` bytes, which is
    // what one read of a signalfd fills.
    let read = unsafe {
        libc::read(
            std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd()),
            (&raw mut info).cast(),
            size,
        )
    };
    match usize::try_from(read) {
        Ok(read) if read == size => Ok(StraySignal {
            signal: i32::try_from(info.ssi_signo).unwrap_or(0),
            sender_pid: info.ssi_pid,
            sender_uid: info.ssi_uid,
        }),
        Ok(read) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("signalfd read {read} bytes of {size}"),
        )),
        Err(_) => Err(io::Error::last_os_error()),
    }
}

/// The signal's name without `SIG`, as `kill -l` prints it (`RTMIN+3` for
/// a real-time one).
pub fn signal_name(signal: i32) -> String {
    let fixed = match signal {
        libc::SIGUSR1 => "USR1",
        libc::SIGUSR2 => "USR2",
        libc::SIGALRM => "ALRM",
        libc::SIGVTALRM => "VTALRM",
        libc::SIGPROF => "PROF",
        libc::SIGIO => "IO",
        libc::SIGPWR => "PWR",
        libc::SIGWINCH => "WINCH",
        libc::SIGURG => "URG",
        libc::SIGSTKFLT => "STKFLT",
        libc::SIGXCPU => "XCPU",
        libc::SIGXFSZ => "XFSZ",
        _ if signal >= libc::SIGRTMIN() && signal <= libc::SIGRTMAX() => {
            return format!("RTMIN+{}", signal - libc::SIGRTMIN());
        }
        _ => return signal.to_string(),
    };
    fixed.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_every_stray_signal() {
        for signal in STRAY_SIGNALS {
            assert!(
                signal_name(signal).parse::<i32>().is_err(),
                "{signal} has no name"
            );
        }
        assert_eq!(signal_name(libc::SIGRTMIN() + 2), "RTMIN+2");
    }

    #[test]
    fn stray_set_leaves_meaningful_and_glibc_signals_alone() {
        let set = stray_set();
        for signal in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGCHLD,
            libc::SIGPIPE,
            libc::SIGTSTP,
            32,
            33,
        ] {
            // SAFETY: a valid, initialised set.
            assert_eq!(unsafe { libc::sigismember(&raw const set, signal) }, 0);
        }
        for signal in STRAY_SIGNALS.into_iter().chain([libc::SIGRTMAX()]) {
            // SAFETY: a valid, initialised set.
            assert_eq!(unsafe { libc::sigismember(&raw const set, signal) }, 1);
        }
    }
}
