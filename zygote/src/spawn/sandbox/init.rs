//! The pid namespace's init: forwards signals to the program and
//! reports its exact exit (see [`run_init`]).

use std::collections::HashMap;
use std::ffi::{CStr, c_int, c_long};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::AtomicU32;
use std::sync::{LazyLock, Mutex, PoisonError};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, WaitId, WaitIdOptions};
use zygote_proto::ExitStatus;

use super::{Failed, Step, check, close, drop_capabilities};

/// The exit reports of the pid namespaces' inits: init pid (in the
/// daemon's namespace) to the read end of its report pipe.
static INIT_REPORTS: LazyLock<Mutex<HashMap<i32, OwnedFd>>> = LazyLock::new(Default::default);

/// Remembers where the init `pid` reports its program's exit.
pub(in crate::spawn) fn expect_init_report(pid: i32, report: OwnedFd) {
    INIT_REPORTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(pid, report);
}

/// The exact exit of the program under the init `pid`, which has been
/// reaped: what the init reported, if it is one and reported.
pub(in crate::spawn) fn take_init_report(pid: i32) -> Option<ExitStatus> {
    let report = INIT_REPORTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&pid)?;
    let mut bytes = [0u8; 8];
    let read = rustix::io::read(&report, &mut bytes).ok()?;
    if read != 8 {
        return None;
    }
    let [a, b, c, d, e, f, g, h] = bytes;
    let code = c_int::from_ne_bytes([a, b, c, d]);
    let status = c_int::from_ne_bytes([e, f, g, h]);
    Some(match code {
        libc::CLD_EXITED => ExitStatus::Exited(status),
        libc::CLD_DUMPED => ExitStatus::Signaled {
            signal: status,
            core_dumped: true,
        },
        _ => ExitStatus::Signaled {
            signal: status,
            core_dumped: false,
        },
    })
}

/// In a new pid namespace this child is its init (pid 1): a program run
/// as pid 1 would ignore every signal it has no handler for (`SIGTERM`
/// sent through its pidfd would do nothing). So the child starts the
/// program, and stays as a minimal init: it forwards every signal it
/// gets to the program, reaps orphans, and when the program ends writes
/// its exact exit (code or signal) to `report` and exits with its code
/// (or 128 + signal), which the daemon replaces by the report.
///
/// The program is started by `start` (sharing the init's memory until it
/// execs, on a stack of its own; it calls [`leave_init`] first), and the
/// init never returns. Where `start` is missing or fails with `ENOSYS`,
/// the init forks it instead, and returns in the program's process.
pub(in crate::spawn) fn run_init(
    report: RawFd,
    status_pipe: Option<RawFd>,
    start: Option<impl FnOnce() -> Result<libc::pid_t, c_int>>,
) -> Result<(), Failed> {
    // Every signal blocked before the program starts, so that none meant
    // for the init is lost (pid 1 drops those it has no handler for), and
    // the program's SIGCHLD waits for the init's sigwaitinfo even when the
    // program ends at once.
    let (all, _) = signal_sets();
    // SAFETY: valid pointers to our own sets; this process is single-threaded.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &raw const all, ptr::null_mut()) };
    let started = match start.map(|start| start()) {
        Some(Err(libc::ENOSYS)) | None => None,
        Some(started) => Some(started),
    };
    let program = match started {
        Some(Ok(pid)) => pid,
        Some(Err(errno)) => {
            leave_init();
            return Err(fail_with(errno));
        }
        None => {
            // SAFETY: a raw fork (no CLONE_VM): glibc's fork would take
            // locks that other daemon threads may have held when this child
            // was copied.
            let pid =
                unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as c_long, 0, 0, 0, 0) };
            let program = check(pid, Step::Init, None);
            if !matches!(program, Ok(pid) if pid > 0) {
                // The program (or a failed fork).
                leave_init();
            }
            let program = program? as libc::pid_t;
            if program == 0 {
                close(report);
                return Ok(());
            }
            program
        }
    };
    // The program's exec closes the last copy of the status pipe.
    if let Some(fd) = status_pipe {
        close(fd);
    }
    init_loop(program, report)
}

/// Unblocks every signal the init blocked: in its program (exec keeps
/// the mask), or in an init that failed to start it.
pub(in crate::spawn) fn leave_init() {
    let (_, empty) = signal_sets();
    // SAFETY: a valid pointer to our own set; this process is single-threaded.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &raw const empty, ptr::null_mut()) };
}

/// A failure of the init's step with `errno`.
fn fail_with(errno: c_int) -> Failed {
    (
        super::SANDBOX_STAGE,
        errno,
        Some(super::SandboxFailure {
            step: Step::Init,
            item: None,
        }),
    )
}

/// Every signal, and none.
fn signal_sets() -> (libc::sigset_t, libc::sigset_t) {
    // SAFETY: a zeroed sigset_t is valid, and filled or emptied in place.
    unsafe {
        let mut all = std::mem::zeroed::<libc::sigset_t>();
        let mut empty = std::mem::zeroed::<libc::sigset_t>();
        libc::sigfillset(&raw mut all);
        libc::sigemptyset(&raw mut empty);
        (all, empty)
    }
}

/// The init's life: see [`run_init`]. Never returns.
fn init_loop(program: libc::pid_t, report: RawFd) -> ! {
    // SAFETY: prctl with integer arguments: a program under the same uid
    // must not read this copy of the daemon's memory.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        // Its name in `ps` (its command line stays the daemon's).
        libc::prctl(libc::PR_SET_NAME, c"zygote-init".as_ptr(), 0, 0, 0);
    }
    let _ = drop_capabilities();
    let (all, _) = signal_sets();
    loop {
        // SAFETY: siginfo_t is a plain C struct; zeroed is valid.
        let mut info = unsafe { std::mem::zeroed::<libc::siginfo_t>() };
        // SAFETY: waits on a valid set, writing into a valid siginfo.
        let signal = unsafe { libc::sigwaitinfo(&raw const all, &raw mut info) };
        if signal < 0 {
            continue;
        }
        if signal != libc::SIGCHLD {
            // SAFETY: plain syscall; the program may have gone already.
            unsafe { libc::kill(program, signal) };
            continue;
        }
        reap_children(program, report);
    }
}

/// Reaps every exited child; when the program is one, reports and exits.
fn reap_children(program: libc::pid_t, report: RawFd) {
    loop {
        // SAFETY: siginfo_t is a plain C struct; zeroed is valid.
        let mut info = unsafe { std::mem::zeroed::<libc::siginfo_t>() };
        // SAFETY: writes into a valid siginfo.
        let ret =
            unsafe { libc::waitid(libc::P_ALL, 0, &raw mut info, libc::WEXITED | libc::WNOHANG) };
        // SAFETY: a SIGCHLD siginfo (or zeroed), whose pid/status are valid.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if ret < 0 || pid == 0 {
            return;
        }
        if pid != program {
            continue;
        }
        let mut bytes = [0u8; 8];
        let (first, second) = bytes.split_at_mut(4);
        first.copy_from_slice(&info.si_code.to_ne_bytes());
        second.copy_from_slice(&status.to_ne_bytes());
        // SAFETY: writes 8 bytes from a valid buffer to our pipe end.
        unsafe { libc::write(report, bytes.as_ptr().cast(), bytes.len()) };
        let code = if info.si_code == libc::CLD_EXITED {
            status
        } else {
            128 + status
        };
        // SAFETY: ends the init, and with it the namespace.
        unsafe { libc::_exit(code) };
    }
}

/// The program a parked init waits for: the first process of its pid
/// namespace after the init itself.
const PROGRAM_IN_NAMESPACE: libc::pid_t = 2;

/// A parked init ([`crate::spawn::Spawner::park_sibling`]): the namespaces and
/// the root are made, and this child waits in them, as pid 1, for the
/// one program that will enter them. It says it is ready by closing
/// `report` (the status pipe's end of file), then waits until the daemon
/// closes `release`: by then the program exists, or never will. It then
/// lives exactly as long as that program (pid 2 of its namespace), which
/// ends the namespace and anything left in it when it goes, as an init
/// that started its program does. Reaps the orphans that come to it
/// meanwhile. Returns only the step that failed before it was ready.
/// `name` is its name in `ps`: a mount template's holder (which no
/// program enters) has one of its own.
///
/// With `hand_off`, it shares its maker's memory (see
/// `clone::clone_parked`): it hands off once set up, and from then on
/// touches only its own stack, through raw syscalls that set no `errno`
/// (its maker's, as is all thread-local state here).
pub(in crate::spawn) fn park(
    release: RawFd,
    report: Option<RawFd>,
    name: &CStr,
    hand_off: Option<&AtomicU32>,
) -> Failed {
    let (all, _) = signal_sets();
    // SAFETY: a valid pointer to our own set; this process is single-threaded.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &raw const all, ptr::null_mut()) };
    // SAFETY: a zeroed sigset_t is valid, and filled in place.
    let mut child_exits = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    // SAFETY: as above; SIGCHLD is a valid signal number.
    unsafe {
        libc::sigemptyset(&raw mut child_exits);
        libc::sigaddset(&raw mut child_exits, libc::SIGCHLD);
    }
    // SAFETY: makes a new fd from a valid set.
    let exits = unsafe {
        libc::signalfd(
            -1,
            &raw const child_exits,
            libc::SFD_CLOEXEC | libc::SFD_NONBLOCK,
        )
    };
    if exits < 0 {
        return fail_with(super::errno());
    }
    // SAFETY: prctl with integer arguments and a static name.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0);
    }
    if let Err(failed) = drop_capabilities() {
        return failed;
    }
    if let Some(life) = hand_off {
        crate::spawn::clone::hand_off(life);
    }
    // From here on: this stack, and syscalls that set no errno.
    // SAFETY: these fds are this process's own, and closed once each.
    let (exits, release, report) = unsafe {
        (
            OwnedFd::from_raw_fd(exits),
            OwnedFd::from_raw_fd(release),
            report.map(|report| OwnedFd::from_raw_fd(report)),
        )
    };
    drop(report);
    wait_readable(release.as_fd(), exits.as_fd());
    drop(release);
    let program = Pid::from_raw(PROGRAM_IN_NAMESPACE)
        .and_then(|pid| rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok());
    if let Some(program) = program {
        wait_readable(program.as_fd(), exits.as_fd());
    }
    // SAFETY: ends the init, and with it the namespace.
    unsafe { libc::_exit(0) }
}

/// Waits until `fd` is readable (or hung up), reaping every exited child
/// whenever `exits`, a signalfd of `SIGCHLD`, says one came.
fn wait_readable(fd: BorrowedFd<'_>, exits: BorrowedFd<'_>) {
    loop {
        let mut polled = [
            PollFd::new(&fd, PollFlags::IN),
            PollFd::new(&exits, PollFlags::IN),
        ];
        match rustix::event::poll(&mut polled, None) {
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(_) => return,
        }
        let [watched, signals] = polled;
        if !signals.revents().is_empty() {
            let mut drained = [0u8; 128];
            while rustix::io::read(exits, &mut drained).is_ok_and(|read| read > 0) {}
            reap_orphans();
        }
        if !watched.revents().is_empty() {
            return;
        }
    }
}

/// Reaps every exited child of this init.
fn reap_orphans() {
    let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG;
    while let Ok(Some(_)) = rustix::process::waitid(WaitId::All, options) {}
}
