//! Waits for one child's exit on its pidfd and reaps it, follows its
//! stops and continues for the requests that ask, and reaps adopted
//! orphans; the last two on the daemon's one reader of `SIGCHLD`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rustix::process::{WaitId, WaitIdOptions, waitid};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use zygote_proto::{ExitStatus, ResourceUsage};

use crate::spawn;

/// Resolves once the child behind `pidfd` has exited, and reaps it.
///
/// A pidfd polls readable when its process exits (Linux 5.3); the reap
/// itself is `waitid(P_PIDFD)` (5.4), so no other child is disturbed.
///
/// # Errors
///
/// When polling or `waitid` fails, which means the child was reaped
/// elsewhere: a bug, logged by the caller.
pub async fn wait_exit(pidfd: &AsyncFd<OwnedFd>) -> io::Result<(ExitStatus, ResourceUsage)> {
    // A child that exited before its pidfd was watched (a short one, whose
    // start was reported after its exit) is reaped without waiting for the
    // event loop's next turn to say so.
    if let Some(exit) = spawn::try_reap(pidfd.get_ref().as_fd())? {
        return Ok(exit);
    }
    loop {
        let mut guard = pidfd.readable().await?;
        match spawn::try_reap(pidfd.get_ref().as_fd())? {
            Some(exit) => return Ok(exit),
            None => guard.clear_ready(),
        }
    }
}

/// A child stopped (by this signal) or continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobChange {
    /// Stopped by this signal.
    Stopped(i32),
    /// Continued after a stop.
    Continued,
}

/// How long exits may wait, left pending, before the reader looks for
/// orphans again while nobody follows stops: an orphan stays a zombie at
/// most this much longer, and a burst of exits costs one look.
const ORPHAN_PACE: Duration = Duration::from_millis(20);

/// How soon orphans queued behind an exited child of ours are looked for
/// by a scan (see [`spawn::reap_orphans`]), and looked for again while a
/// scan leaves an exited child of a uid a spawner is starting a child of.
const RESCAN: Duration = Duration::from_millis(100);

/// The daemon's `SIGCHLD`, read by one task and passed on to the requests
/// that follow stops, and to the orphan reaper.
///
/// `SIGCHLD` is blocked in every thread and read from a signalfd (see
/// [`spawn::child_signal_fd`]). A pidfd reports each child's exit, so
/// most `SIGCHLD`s matter to nobody: while no request follows stops the
/// reader leaves the signal pending for [`ORPHAN_PACE`] after each look,
/// and exits meanwhile neither queue it again nor wake anyone. While
/// some request follows stops, it is read at once, so stop reports stay
/// immediate. With neither followers nor orphans to reap (a private
/// zygote, mostly), no reader runs at all.
struct ChildSignals {
    /// Bumped after each read that took a `SIGCHLD`; followers wait on it.
    seen: watch::Sender<u64>,
    /// Who needs the reader, and the source while none runs.
    readers: Mutex<Readers>,
    /// Tells the reader to look now: a first follower came (a pacing
    /// reader left SIGCHLD pending), or the last left.
    wake: Notify,
}

/// Who needs `SIGCHLD` read.
#[derive(Default)]
struct Readers {
    /// Requests following stops now.
    followers: usize,
    /// Whether orphans are reaped (a subreaper: the shared daemon).
    orphans: bool,
    /// The source, while no reader runs; `None` before the first.
    idle: Option<Source>,
    /// Whether a source was opened (a reader runs or ran).
    opened: bool,
}

impl Readers {
    /// Starts the reader on the current runtime if none runs.
    fn start(&mut self) {
        let source = match self.idle.take() {
            Some(source) => source,
            None if !self.opened => Source::open(),
            None => return,
        };
        self.opened = true;
        tokio::spawn(read_child_signals(child_signals(), source));
    }
}

static CHILD_SIGNALS: LazyLock<ChildSignals> = LazyLock::new(|| ChildSignals {
    seen: watch::Sender::new(0),
    readers: Mutex::default(),
    wake: Notify::new(),
});

fn child_signals() -> &'static ChildSignals {
    &CHILD_SIGNALS
}

impl ChildSignals {
    fn readers(&self) -> std::sync::MutexGuard<'_, Readers> {
        self.readers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reaps the orphans this process adopts as a child subreaper: looks at
/// once, then after each `SIGCHLD`, at most every [`ORPHAN_PACE`].
pub fn reap_adopted_orphans() {
    let signals = child_signals();
    let mut readers = signals.readers();
    readers.orphans = true;
    readers.start();
    signals.wake.notify_one();
}

/// Counts a request following stops while alive.
struct Following(&'static ChildSignals);

impl Following {
    fn new(signals: &'static ChildSignals) -> Self {
        let mut readers = signals.readers();
        readers.followers += 1;
        if readers.followers == 1 {
            readers.start();
            // A pacing reader left SIGCHLD pending: no exit wakes it.
            signals.wake.notify_one();
        }
        Self(signals)
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut readers = self.0.readers();
        readers.followers -= 1;
        if readers.followers == 0 && !readers.orphans {
            // The reader ends: a private zygote waits for its last task.
            self.0.wake.notify_one();
        }
    }
}

/// Where `SIGCHLD` is read from.
enum Source {
    /// A signalfd, SIGCHLD blocked in every thread: the daemon's way.
    Fd(AsyncFd<OwnedFd>),
    /// tokio's handler, when SIGCHLD is not blocked everywhere (a library
    /// caller that did not block it) or no signalfd could be made.
    Handler(tokio::signal::unix::Signal),
    /// Neither: stops are not reported, orphans found by rescans only.
    Nothing,
}

impl Source {
    fn open() -> Self {
        let fd = match spawn::threads_taking_child_signal() {
            Ok(threads) if threads.is_empty() => spawn::child_signal_fd()
                .and_then(|fd| zygote_proto::register(fd, tokio::io::Interest::READABLE)),
            Ok(threads) => Err(io::Error::other(format!(
                "threads {threads:?} do not block SIGCHLD"
            ))),
            Err(error) => Err(error),
        };
        let error = match fd {
            Ok(fd) => return Self::Fd(fd),
            Err(error) => error,
        };
        tracing::info!(%error, "no signalfd for SIGCHLD: using a signal handler");
        match signal(SignalKind::child()) {
            Ok(handler) => Self::Handler(handler),
            Err(error) => {
                tracing::warn!(%error, "cannot watch SIGCHLD: stops of children will not be reported");
                Self::Nothing
            }
        }
    }

    /// Takes a `SIGCHLD` that is pending, without waiting: whether one was.
    fn take(&mut self) -> bool {
        match self {
            Self::Fd(fd) => read_signal(fd.get_ref()).unwrap_or(false),
            Self::Handler(handler) => {
                let mut context = Context::from_waker(Waker::noop());
                let mut took = false;
                while let Poll::Ready(Some(())) = handler.poll_recv(&mut context) {
                    took = true;
                }
                took
            }
            Self::Nothing => false,
        }
    }

    /// Waits for a `SIGCHLD` and takes it.
    async fn next(&mut self) {
        match self {
            Self::Fd(fd) => loop {
                let Ok(mut guard) = fd.readable().await else {
                    return std::future::pending().await;
                };
                // EAGAIN clears the readiness: the signal was taken already.
                if let Ok(Ok(true)) = guard.try_io(|fd| read_signal(fd.get_ref())) {
                    return;
                }
            },
            Self::Handler(handler) => {
                if handler.recv().await.is_none() {
                    std::future::pending().await
                }
            }
            Self::Nothing => std::future::pending().await,
        }
    }
}

/// One read of the signalfd: `Ok(true)` when it took a `SIGCHLD`, the
/// `WouldBlock` error when none was pending.
fn read_signal(fd: &OwnedFd) -> io::Result<bool> {
    let mut info = [0u8; spawn::SIGNALFD_SIGINFO_BYTES];
    Ok(rustix::io::read(fd, &mut info)? == info.len())
}

/// The reader: takes `SIGCHLD`, wakes the followers, reaps orphans; ends,
/// leaving `source` idle, when nobody needs it any more.
async fn read_child_signals(signals: &'static ChildSignals, mut source: Source) {
    let mut rescan: Option<Instant> = None;
    let mut took = source.take();
    loop {
        if took {
            signals
                .seen
                .send_modify(|seen| *seen = seen.wrapping_add(1));
        }
        let (prompt, orphans) = {
            let mut readers = signals.readers();
            if readers.followers == 0 && !readers.orphans {
                readers.idle = Some(source);
                return;
            }
            (readers.followers > 0, readers.orphans)
        };
        if orphans && spawn::reap_orphans().blocked_by_own && rescan.is_none() {
            rescan = Some(Instant::now() + RESCAN);
        }
        if took && orphans && !prompt {
            // Left pending meanwhile: exits queue nothing and wake nobody.
            tokio::select! {
                () = tokio::time::sleep(ORPHAN_PACE) => {}
                () = signals.wake.notified() => {}
            }
            took = source.take();
            continue;
        }
        took = tokio::select! {
            () = source.next() => true,
            () = signals.wake.notified() => source.take(),
            () = tokio::time::sleep_until(rescan.unwrap_or_else(Instant::now)), if rescan.is_some() => {
                // An orphan of a uid whose spawner is starting a child is
                // left until that child is listed: look again.
                rescan = spawn::reap_orphans_by_scan()
                    .blocked_by_own
                    .then(|| Instant::now() + RESCAN);
                false
            }
        };
    }
}

/// Calls `report` for each stop and continue of the child behind `pidfd`,
/// until the future is dropped (it never ends by itself).
///
/// Each `SIGCHLD` wakes every follower; each asks the kernel only about
/// its own child (`waitid(P_PIDFD, WSTOPPED | WCONTINUED | WNOHANG)`,
/// which never reaps), so another child's exit is never taken.
pub async fn follow_stops<F, Fut>(pidfd: BorrowedFd<'_>, mut report: F)
where
    F: FnMut(JobChange) -> Fut,
    Fut: Future<Output = ()>,
{
    let signals = child_signals();
    // Before the first look: a SIGCHLD after it is then seen below.
    let mut seen = signals.seen.subscribe();
    let _following = Following::new(signals);
    loop {
        while let Some(change) = job_change(pidfd) {
            report(change).await;
        }
        if seen.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

fn job_change(pidfd: BorrowedFd<'_>) -> Option<JobChange> {
    let options = WaitIdOptions::STOPPED | WaitIdOptions::CONTINUED | WaitIdOptions::NOHANG;
    let status = waitid(WaitId::PidFd(pidfd), options).ok()??;
    if status.continued() {
        Some(JobChange::Continued)
    } else {
        status.stopping_signal().map(JobChange::Stopped)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use super::*;

    /// The test harness's threads do not block `SIGCHLD`, as a library
    /// caller's might not: the reader falls back to a signal handler, and
    /// stops are still followed.
    #[test]
    fn stops_are_followed_through_a_handler_when_sigchld_is_not_blocked() {
        let taking = spawn::threads_taking_child_signal().expect("list threads");
        assert!(!taking.is_empty(), "the harness's threads take SIGCHLD");
        let mut child = Command::new("sh")
            .args(["-c", "kill -STOP $$; read _"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("start sh");
        let pid = rustix::process::Pid::from_child(&child);
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .expect("pidfd_open");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let seen = runtime.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let follow = follow_stops(pidfd.as_fd(), |change| {
                let _ = tx.send(change);
                async {}
            });
            let first = async {
                let stopped = rx.recv().await;
                rustix::process::kill_process(pid, rustix::process::Signal::CONT).expect("CONT");
                (stopped, rx.recv().await)
            };
            tokio::select! {
                () = follow => unreachable!("following never ends"),
                seen = tokio::time::timeout(Duration::from_secs(10), first) => seen,
            }
        });
        let _ = child.stdin.take().map(|mut stdin| stdin.write_all(b"\n"));
        let _ = child.wait();
        assert_eq!(
            seen.expect("no stop and continue within 10 s"),
            (
                Some(JobChange::Stopped(libc::SIGSTOP)),
                Some(JobChange::Continued)
            )
        );
    }
}
