//! `zygote run -t`: the child gets a new pseudo-terminal from the daemon,
//! and this wrapper relays between it and the terminal it runs on, as
//! `ssh -t`, `docker run -t` and `systemd-run --pty` do.
//!
//! - Started outside the terminal's foreground process group (`cmd &`, or
//!   `timeout` in a script), the wrapper first stops as `stty raw` does,
//!   before it starts the child or installs a handler, until it is in the
//!   foreground; a signal meanwhile ends it by its default action.
//! - The wrapper's terminal goes to raw mode, so that every key (Ctrl-C,
//!   Ctrl-Z, Ctrl-\ included) reaches the child's terminal, whose line
//!   discipline signals the child's foreground job as a terminal would.
//! - The terminal's settings are restored on every way out that runs code:
//!   the child's exit, an error, a panic, and catchable signals (which are
//!   forwarded to the child; the wrapper leaves when the child does).
//!   SIGKILL leaves the terminal raw: `reset` or `stty sane` repairs it.
//! - SIGWINCH copies the terminal's size to the child's (`TIOCSWINSZ`).
//! - When the child stops (the daemon reports it), the wrapper restores its
//!   terminal and stops itself with the same signal; once continued, it
//!   goes back to raw mode and continues the child.
//! - The child leads its session, so its own process group is orphaned and
//!   the kernel discards the `SIGTSTP` of a Ctrl-Z typed while that group
//!   is in the foreground. The wrapper sees the key go by and stops the
//!   child with `SIGSTOP` instead, then itself with `SIGTSTP`: a program
//!   run alone stops as it would under a shell. A program that reads keys
//!   raw (vi) gets the key and decides, as under `ssh -t`; jobs of a
//!   shell run on the terminal stop by the kernel as usual.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use rustix::io::Errno;
use rustix::process::{Signal, pidfd_send_signal};
use rustix::termios::{
    LocalModes, OptionalActions, SpecialCodeIndex, Termios, Winsize, tcgetattr, tcgetpgrp,
    tcgetwinsize, tcsetattr,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use zygote_client::{Child, Command, ExitStatus, JobState};

use crate::cli::exit_code::{EXIT_ZYGOTE_FAILED, report_error};
use crate::spawn;

/// The size a terminal reports when it reports none.
const FALLBACK_SIZE: (u16, u16) = (24, 80);

/// Signals passed on to the child. Ctrl-C and friends never reach the
/// wrapper (its terminal is raw); these come from `kill`, a supervisor or
/// a terminal that hangs up.
const FORWARDED: [SignalKind; 7] = [
    SignalKind::interrupt(),
    SignalKind::terminate(),
    SignalKind::hangup(),
    SignalKind::quit(),
    SignalKind::user_defined1(),
    SignalKind::user_defined2(),
    SignalKind::alarm(),
];

/// Whether `zygote run -t` can give the child a terminal: stdin must be
/// one, as for `ssh -t`.
pub fn stdin_is_terminal() -> bool {
    rustix::termios::isatty(rustix::stdio::stdin())
}

/// Runs `command` on a new pseudo-terminal and returns the wrapper's exit
/// code; dies of the child's signal instead, once the terminal is
/// restored, when a signal ended the child.
pub async fn run(command: &mut Command, program: &Path) -> u8 {
    let stdin = rustix::stdio::stdin();
    let saved = match tcgetattr(stdin) {
        Ok(saved) => saved,
        Err(errno) => {
            eprintln!("zygote: cannot read the terminal settings of stdin: {errno}");
            return EXIT_ZYGOTE_FAILED;
        }
    };
    if let Err(errno) = wait_for_foreground(stdin, &saved) {
        eprintln!("zygote: cannot take the terminal: {errno}");
        return EXIT_ZYGOTE_FAILED;
    }
    let size = window_size(stdin);
    command.pty(size.ws_row, size.ws_col).report_stops(true);
    let mut child = match command.spawn().await {
        Ok(child) => child,
        Err(error) => return report_error(&error, program, None),
    };
    let Some(master) = child.pty.take() else {
        eprintln!("zygote: the zygote sent no terminal for the child");
        let _ = child.start_kill();
        return EXIT_ZYGOTE_FAILED;
    };
    // Before raw mode: a signal that arrives from here on is forwarded,
    // never the end of a wrapper that leaves the terminal raw.
    forward_signals(&child);
    let raw = match RawMode::enter(saved) {
        Ok(raw) => raw,
        Err(errno) => {
            eprintln!("zygote: cannot put the terminal in raw mode: {errno}");
            let _ = child.start_kill();
            return EXIT_ZYGOTE_FAILED;
        }
    };
    let outcome = relay(&mut child, master, &raw).await;
    drop(raw);
    match outcome {
        Ok(status) => exit_code(status),
        Err(error) => {
            eprintln!("zygote: {error}");
            EXIT_ZYGOTE_FAILED
        }
    }
}

/// Returns once this process's group is the terminal's foreground group,
/// as `stty raw` or Python's `tty.setraw` would: the terminal's own
/// settings are set again, unchanged, which from a background group gets
/// `SIGTTOU` and stops the process until `fg` (or fails with `EIO` in an
/// orphaned group). Nothing is changed on a terminal that another group
/// holds.
///
/// It runs before the child exists and before any signal handler of the
/// wrapper: a signal that comes meanwhile (`timeout`'s `SIGINT` to a
/// command it put in a background group) ends the wrapper by its default
/// action, with no terminal to restore and no child left behind.
fn wait_for_foreground(terminal: BorrowedFd<'_>, settings: &Termios) -> rustix::io::Result<()> {
    tcsetattr(terminal, OptionalActions::Now, settings)
}

/// The child's code, or death by its signal as a shell expects.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => {
            spawn::die_of_signal(signal);
            128u8.wrapping_add(signal as u8)
        }
        (None, None) => EXIT_ZYGOTE_FAILED,
    }
}

fn window_size(terminal: BorrowedFd<'_>) -> Winsize {
    match tcgetwinsize(terminal) {
        Ok(size) if size.ws_row > 0 && size.ws_col > 0 => size,
        _ => Winsize {
            ws_row: FALLBACK_SIZE.0,
            ws_col: FALLBACK_SIZE.1,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    }
}

/// The wrapper's terminal in raw mode; its settings come back on drop.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter(saved: Termios) -> rustix::io::Result<Self> {
        let raw = Self { saved };
        raw.resume()?;
        Ok(raw)
    }

    /// Raw mode again, after [`suspend`](Self::suspend).
    fn resume(&self) -> rustix::io::Result<()> {
        let mut raw = self.saved.clone();
        raw.make_raw();
        tcsetattr(rustix::stdio::stdin(), OptionalActions::Drain, &raw)
    }

    /// The settings as they were, while the wrapper is stopped.
    fn suspend(&self) {
        let _ = tcsetattr(rustix::stdio::stdin(), OptionalActions::Drain, &self.saved);
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        self.suspend();
    }
}

/// Passes the wrapper's catchable signals on to the child through its
/// pidfd: the wrapper itself leaves only when the child does, restoring
/// the terminal.
fn forward_signals(child: &Child) {
    let pidfd = match child.pidfd().try_clone_to_owned() {
        Ok(pidfd) => Arc::new(pidfd),
        Err(error) => {
            eprintln!("zygote: signals will not be forwarded: {error}");
            return;
        }
    };
    for kind in FORWARDED {
        let Ok(mut stream) = signal(kind) else {
            continue;
        };
        let pidfd = Arc::clone(&pidfd);
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                let _ = spawn::send_signal(pidfd.as_fd(), kind.as_raw_value());
            }
        });
    }
}

/// Reads the wrapper's stdin on a thread of its own: stdin is shared with
/// the shell and other programs, so it stays in blocking mode (making it
/// non-blocking would change it for all of them). The thread ends with the
/// process.
fn read_stdin() -> mpsc::Receiver<Vec<u8>> {
    let (sender, receiver) = mpsc::channel(4);
    std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        loop {
            match rustix::io::read(rustix::stdio::stdin(), &mut buffer) {
                Ok(0) => break,
                Ok(read) => {
                    if sender.blocking_send(buffer[..read].to_vec()).is_err() {
                        break;
                    }
                }
                Err(Errno::INTR | Errno::AGAIN) => {}
                Err(_) => break,
            }
        }
    });
    receiver
}

/// Relays between the wrapper's terminal and the child's until the child
/// exits, then hands over what the child wrote last.
async fn relay(child: &mut Child, master: OwnedFd, raw: &RawMode) -> Result<ExitStatus, String> {
    rustix::io::ioctl_fionbio(&master, true).map_err(master_failed)?;
    let master = zygote_proto::register(master, Interest::READABLE | Interest::WRITABLE)
        .map_err(master_failed)?;
    let mut resized = signal(SignalKind::window_change())
        .map_err(|error| format!("cannot watch for terminal resizes: {error}"))?;
    let mut input = read_stdin();
    let mut jobs = child.job_events();
    let (mut input_open, mut output_open, mut jobs_open) = (true, true, true);
    // The child was sent SIGSTOP for a Ctrl-Z the kernel would discard.
    let mut suspending = false;
    // Input read but not yet taken by the child's terminal.
    let mut pending: Vec<u8> = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|error| error.to_string())?;
                if output_open {
                    drain(&master, &mut buffer);
                }
                return Ok(status);
            }
            change = jobs.changed(), if jobs_open => match change {
                Some(JobState::Stopped(signal)) => {
                    raw.suspend();
                    // Our SIGSTOP stands for the user's Ctrl-Z.
                    let signal = if std::mem::take(&mut suspending) && signal == libc::SIGSTOP {
                        libc::SIGTSTP
                    } else {
                        signal
                    };
                    spawn::stop_self(signal);
                    // Continued (`fg`): take the terminal back, then the child.
                    let _ = raw.resume();
                    copy_size(master.get_ref().as_fd());
                    let _ = pidfd_send_signal(child.pidfd(), Signal::CONT);
                }
                Some(JobState::Running) => {}
                None => jobs_open = false,
            },
            _ = resized.recv() => copy_size(master.get_ref().as_fd()),
            guard = master.readable(), if output_open => {
                let mut guard = guard.map_err(master_failed)?;
                match guard.try_io(|master| read_nonblocking(master.get_ref(), &mut buffer)) {
                    Ok(Ok(0)) | Ok(Err(_)) => output_open = false,
                    Ok(Ok(read)) => write_stdout(&buffer[..read]),
                    Err(_would_block) => {}
                }
            }
            guard = master.writable(), if !pending.is_empty() => {
                let mut guard = guard.map_err(master_failed)?;
                match guard.try_io(|master| {
                    rustix::io::write(master.get_ref(), &pending).map_err(io::Error::from)
                }) {
                    Ok(Ok(written)) => {
                        pending.drain(..written);
                    }
                    // The child's side is gone; its exit follows.
                    Ok(Err(_)) => pending.clear(),
                    Err(_would_block) => {}
                }
            }
            data = input.recv(), if input_open && pending.is_empty() => match data {
                Some(data) => {
                    if suspend_is_lost(master.get_ref(), child.id(), &data) {
                        suspending = true;
                        let _ = pidfd_send_signal(child.pidfd(), Signal::STOP);
                    }
                    pending = data;
                }
                // The terminal hung up; the child hears of it by SIGHUP.
                None => input_open = false,
            },
        }
    }
}

/// Whether `input` holds the terminal's suspend key (Ctrl-Z) that the
/// kernel will turn into a `SIGTSTP` for the child's own process group,
/// and then discard because that group is orphaned (the child leads the
/// session; its parent, the daemon, is outside it).
fn suspend_is_lost(master: &OwnedFd, child_pid: u32, input: &[u8]) -> bool {
    let Ok(settings) = tcgetattr(master) else {
        return false;
    };
    let suspend = settings.special_codes[SpecialCodeIndex::VSUSP];
    // 0 is _POSIX_VDISABLE: no suspend key.
    if suspend == 0 || !input.contains(&suspend) {
        return false;
    }
    if !settings.local_modes.contains(LocalModes::ISIG) {
        return false;
    }
    tcgetpgrp(master).is_ok_and(|group| group.as_raw_nonzero().get() as u32 == child_pid)
}

/// Reads what the child's terminal holds now, without waiting for more:
/// a background job may keep it open long after the child exits.
fn drain(master: &AsyncFd<OwnedFd>, buffer: &mut [u8]) {
    while let Ok(read) = read_nonblocking(master.get_ref(), buffer) {
        if read == 0 {
            break;
        }
        write_stdout(&buffer[..read]);
    }
}

/// One read from the master: `Ok(0)` also when the child's side is closed
/// (Linux says `EIO`), `WouldBlock` when nothing is there yet.
fn read_nonblocking(master: &OwnedFd, buffer: &mut [u8]) -> io::Result<usize> {
    loop {
        match rustix::io::read(master, &mut *buffer) {
            Ok(read) => return Ok(read),
            Err(Errno::INTR) => {}
            Err(Errno::IO) => return Ok(0),
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// Writes all of `bytes` to stdout, which stays in whatever mode it is in
/// (shared, like stdin); output is dropped once stdout is gone.
fn write_stdout(mut bytes: &[u8]) {
    let stdout = rustix::stdio::stdout();
    while !bytes.is_empty() {
        match rustix::io::write(stdout, bytes) {
            Ok(written) => bytes = &bytes[written..],
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                let mut fds = [rustix::event::PollFd::new(
                    &stdout,
                    rustix::event::PollFlags::OUT,
                )];
                let _ = rustix::event::poll(&mut fds, None);
            }
            Err(_) => return,
        }
    }
}

/// Gives the child's terminal the size of the wrapper's; the kernel then
/// sends SIGWINCH to the child's foreground job.
fn copy_size(master: BorrowedFd<'_>) {
    let size = window_size(rustix::stdio::stdin());
    let _ = rustix::termios::tcsetwinsize(master, size);
}

fn master_failed(error: impl Into<io::Error>) -> String {
    format!("relaying the child's terminal failed: {}", error.into())
}
