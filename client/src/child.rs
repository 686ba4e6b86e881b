//! [`Child`]: a running child on tokio, with its pipes.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Signal, pidfd_send_signal};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, Interest, ReadBuf};
use tokio::net::unix::pipe;
use zygote_proto::AppliedSandbox;

use crate::client::Session;
use crate::connection::{ExitWatch, JobEvents};
use crate::{Error, ExitStatus, Output, ResourceUsage, Result, Stdio};

/// How long a child whose zygote was lost may stay unreaped once it has
/// exited (its new parent, a subreaper or init, reaps it; the kernel
/// gives its status only then) before `wait` gives up.
const REAP_WAIT: Duration = Duration::from_secs(30);
/// The longest pause between two looks at an exited, unreaped child.
const REAP_POLL: Duration = Duration::from_millis(50);
/// How long a reaped child's pidfd may read as gone without a status
/// before this kernel is taken to keep none (6.13, 6.14): for a moment
/// after the reaping, the status is not there yet.
const STATUS_GRACE: Duration = Duration::from_millis(200);

/// What the pidfd says about a child whose zygote was lost.
#[derive(Debug, PartialEq, Eq)]
enum PidfdExit {
    /// Still running.
    Running,
    /// Exited, not reaped yet: its status comes once it is.
    Unreaped,
    /// Reaped, with this `wait(2)` status.
    Status(i32),
    /// This kernel keeps no exit status for pidfds (before 6.15).
    Unsupported(String),
}

/// What an exited child's `PIDFD_GET_INFO` answer (`answer`, read after
/// a poll that said `reaped` or not) means at `now`. A reaped child's
/// pidfd can read as gone, or without a status, for a moment before the
/// kernel keeps its status: only when that lasts [`STATUS_GRACE`] from
/// the first sighting (`first_gone`) does it mean a kernel that keeps
/// none.
fn judge_pidfd_answer(
    answer: io::Result<Option<i32>>,
    reaped: bool,
    first_gone: &mut Option<Instant>,
    now: Instant,
) -> io::Result<PidfdExit> {
    let unsupported = || {
        PidfdExit::Unsupported(
            "this kernel keeps no exit status for pidfds (PIDFD_GET_INFO with \
             PIDFD_INFO_EXIT needs Linux 6.15)"
                .into(),
        )
    };
    let errno = answer.as_ref().err().and_then(io::Error::raw_os_error);
    if matches!(answer, Ok(None) if reaped) || errno == Some(libc::ESRCH) {
        let since = *first_gone.get_or_insert(now);
        return Ok(if now.duration_since(since) < STATUS_GRACE {
            PidfdExit::Unreaped
        } else {
            unsupported()
        });
    }
    match answer {
        Ok(Some(raw)) => Ok(PidfdExit::Status(raw)),
        Ok(None) => Ok(PidfdExit::Unreaped),
        Err(_) if matches!(errno, Some(libc::ENOTTY | libc::EINVAL | libc::EOPNOTSUPP)) => {
            Ok(unsupported())
        }
        Err(error) => Err(error),
    }
}

/// What both flavours of child share: identity, pidfd, exit slot.
#[derive(Debug)]
pub(crate) struct ChildCore {
    /// The connection the child was spawned on, kept open while the child
    /// is tracked (a reconnected client has a new one).
    session: Arc<Session>,
    /// The spawn request's id, which names the child to the zygote.
    spawn_id: u64,
    pid: u32,
    pidfd: OwnedFd,
    exit: ExitWatch,
    /// The status, and the usage unless the zygote was lost.
    finished: Option<(ExitStatus, Option<ResourceUsage>)>,
    /// SIGKILL the child on drop unless it was seen to exit.
    kill_on_drop: bool,
    /// `kill` ends the child's whole cgroup, through the zygote.
    kill_tree: bool,
    /// What confined the child, as the zygote reported it.
    sandbox: Option<AppliedSandbox>,
    /// When its pidfd first read as reaped without a status.
    reaped_without_status: Option<Instant>,
}

/// A freshly spawned child with its raw pipe ends, before a flavour wraps
/// them.
#[derive(Debug)]
pub(crate) struct SpawnedParts {
    pub core: ChildCore,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub pty: Option<OwnedFd>,
}

impl ChildCore {
    pub(crate) fn new(
        session: Arc<Session>,
        spawn_id: u64,
        pid: u32,
        pidfd: OwnedFd,
        exit: ExitWatch,
    ) -> Self {
        Self {
            session,
            spawn_id,
            pid,
            pidfd,
            exit,
            finished: None,
            sandbox: None,
            kill_on_drop: false,
            kill_tree: false,
            reaped_without_status: None,
        }
    }

    pub(crate) fn kill_tree(mut self, kill: bool) -> Self {
        self.kill_tree = kill;
        self
    }

    /// Whether `kill` ends the whole cgroup.
    pub(crate) fn kills_tree(&self) -> bool {
        self.kill_tree
    }

    pub(crate) fn kill_on_drop(mut self, kill: bool) -> Self {
        self.kill_on_drop = kill;
        self
    }

    /// Records what confined the child.
    pub(crate) fn confined_by(mut self, sandbox: Option<AppliedSandbox>) -> Self {
        self.sandbox = sandbox;
        self
    }

    pub(crate) fn sandbox(&self) -> Option<&AppliedSandbox> {
        self.sandbox.as_ref()
    }

    pub(crate) fn id(&self) -> u32 {
        self.pid
    }

    pub(crate) fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    pub(crate) fn job_events(&self) -> JobEvents {
        self.exit.job_events()
    }

    pub(crate) fn usage(&self) -> Option<ResourceUsage> {
        self.finished.and_then(|(_, usage)| usage)
    }

    fn finish(&mut self, notice: zygote_proto::ExitNotice) -> ExitStatus {
        let status = ExitStatus::from(&notice);
        self.finished = Some((status, Some(notice.usage.into())));
        status
    }

    pub(crate) fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        if let Some((status, _)) = self.finished {
            return Ok(Some(status));
        }
        self.session.owner.check()?;
        match self.exit.poll() {
            Ok(notice) => Ok(notice.map(|notice| self.finish(notice))),
            Err(lost @ Error::ZygoteLost { .. }) => match self.pidfd_exit()? {
                PidfdExit::Running | PidfdExit::Unreaped => Ok(None),
                PidfdExit::Status(raw) => Ok(Some(self.finish_lost(raw))),
                PidfdExit::Unsupported(why) => Err(not_recovered(lost, &why)),
            },
            Err(error) => Err(error),
        }
    }

    pub(crate) async fn wait(&mut self) -> Result<ExitStatus> {
        if let Some((status, _)) = self.finished {
            return Ok(status);
        }
        // Its exit notice would come to the parent's reader, never here.
        self.session.owner.check()?;
        match self.exit.wait().await {
            Ok(notice) => Ok(self.finish(notice)),
            // Boxed: this rare path's future (a pidfd registration and a
            // timer) would otherwise make every wait's as large.
            Err(lost @ Error::ZygoteLost { .. }) => Box::pin(self.wait_lost(lost)).await,
            Err(error) => Err(error),
        }
    }

    fn finish_lost(&mut self, raw: i32) -> ExitStatus {
        let status = ExitStatus::from_pidfd(raw);
        self.finished = Some((status, None));
        status
    }

    /// The zygote was lost before it reported the exit: waits on the
    /// pidfd for the exit, then reads the status the kernel kept
    /// (`PIDFD_INFO_EXIT`, Linux 6.15) once the child's new parent has
    /// reaped it.
    async fn wait_lost(&mut self, lost: Error) -> Result<ExitStatus> {
        self.terminated().await?;
        let mut waited = Duration::ZERO;
        let mut pause = Duration::from_millis(1);
        loop {
            match self.pidfd_exit()? {
                PidfdExit::Status(raw) => return Ok(self.finish_lost(raw)),
                PidfdExit::Unsupported(why) => return Err(not_recovered(lost, &why)),
                PidfdExit::Running | PidfdExit::Unreaped => {}
            }
            if waited >= REAP_WAIT {
                return Err(not_recovered(
                    lost,
                    &format!(
                        "pid {} exited, but its new parent has not reaped it within {} s, \
                         so its exit status cannot be read",
                        self.pid,
                        REAP_WAIT.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            waited += pause;
            pause = (pause * 2).min(REAP_POLL);
        }
    }

    /// Asks the pidfd how the child stands.
    fn pidfd_exit(&mut self) -> Result<PidfdExit> {
        use rustix::event::{PollFd, PollFlags, poll};
        let what = || format!("polling the pidfd of pid {}", self.pid);
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        poll(&mut fds, Some(&rustix::event::Timespec::default()))
            .map_err(|errno| Error::io(what(), errno))?;
        let events = fds[0].revents();
        if !events.contains(PollFlags::IN) {
            return Ok(PidfdExit::Running);
        }
        // HUP: reaped, and read before the status.
        let reaped = events.contains(PollFlags::HUP);
        let answer = crate::sys::pidfd_exit_status(self.pidfd.as_fd());
        judge_pidfd_answer(
            answer,
            reaped,
            &mut self.reaped_without_status,
            Instant::now(),
        )
        .map_err(|error| {
            Error::io(
                format!("reading the exit status of pid {} from its pidfd", self.pid),
                error,
            )
        })
    }

    /// SIGKILL through the pidfd: no pid-reuse race, and no need for the
    /// zygote. A child already reaped counts as killed, as in std.
    pub(crate) fn start_kill(&self) -> Result<()> {
        match pidfd_send_signal(&self.pidfd, Signal::KILL) {
            Ok(()) | Err(Errno::SRCH) => Ok(()),
            Err(errno) => Err(Error::io(
                format!("pidfd_send_signal(SIGKILL) to pid {}", self.pid),
                errno,
            )),
        }
    }

    /// Through the zygote, the child's parent; through the pidfd once the
    /// zygote is lost.
    pub(crate) async fn signal(&self, signal: i32) -> Result<()> {
        // Never a request on the parent's connection.
        self.session.owner.check()?;
        if !self.session.is_lost() {
            match self.session.signal(self.spawn_id, signal).await {
                Err(Error::ZygoteLost { .. }) => {}
                done => return done,
            }
        }
        let Some(named) = Signal::from_named_raw(signal) else {
            return Err(Error::invalid(format!(
                "signal {signal} is not one the pidfd can send without the zygote"
            )));
        };
        match pidfd_send_signal(&self.pidfd, named) {
            Ok(()) => Ok(()),
            Err(errno) => Err(Error::Request {
                op: "signal",
                errno: errno.raw_os_error(),
                message: format!(
                    "pidfd_send_signal({signal}) to pid {} (the zygote was lost)",
                    self.pid
                ),
            }),
        }
    }

    /// Waits until the pidfd reports the process has terminated, which
    /// works without the zygote (but gives no status).
    async fn terminated(&self) -> Result<()> {
        let what = || format!("waiting on the pidfd of pid {}", self.pid);
        let pidfd = self
            .pidfd
            .try_clone()
            .map_err(|error| Error::io(what(), error))?;
        let pidfd = zygote_proto::register(pidfd, Interest::READABLE)
            .map_err(|error| Error::io(what(), error))?;
        let _ready = pidfd
            .readable()
            .await
            .map_err(|error| Error::io(what(), error))?;
        Ok(())
    }

    /// Kills the child and waits until it is gone; when the zygote is lost
    /// meanwhile, the pidfd confirms the death instead.
    pub(crate) async fn kill(&mut self) -> Result<()> {
        self.session.owner.check()?;
        // With kill_tree the zygote's SIGKILL is `cgroup.kill`; when that
        // request fails (the child already gone, the zygote lost), the
        // pidfd still reaches the child.
        if !self.kill_tree || self.signal(libc::SIGKILL).await.is_err() {
            self.start_kill()?;
        }
        if self.finished.is_some() {
            return Ok(());
        }
        match self.exit.wait().await {
            Ok(notice) => {
                self.finish(notice);
                Ok(())
            }
            // The death is all a kill waits for: the status comes later,
            // when the new parent reaps the child, if ever.
            Err(Error::ZygoteLost { .. }) => {
                self.terminated().await?;
                if let Ok(PidfdExit::Status(raw)) = self.pidfd_exit() {
                    self.finish_lost(raw);
                }
                Ok(())
            }
            Err(error) => Err(error),
        }
    }
}

impl Drop for ChildCore {
    fn drop(&mut self) {
        // A forked copy dropping its copy leaves the parent's child alone.
        if self.kill_on_drop && self.finished.is_none() && self.session.owner.is_current() {
            // Through the pidfd: a reaped child's pid may be reused, its
            // pidfd never is. An exited child makes this ESRCH, ignored.
            let _ = pidfd_send_signal(&self.pidfd, Signal::KILL);
        }
    }
}

/// The zygote's `ZygoteLost`, saying why the pidfd could not stand in.
fn not_recovered(lost: Error, why: &str) -> Error {
    match lost {
        Error::ZygoteLost { endpoint, reason } => Error::ZygoteLost {
            endpoint,
            reason: format!("{reason}; the exit status is lost: {why}"),
        },
        other => other,
    }
}

/// Reads a pipe to its end; an absent pipe reads as empty.
pub(crate) async fn read_all<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    stream: &str,
) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        pipe.read_to_end(&mut bytes)
            .await
            .map_err(|error| Error::io(format!("reading the child's {stream}"), error))?;
    }
    Ok(bytes)
}

/// A child started by the zygote, as `tokio::process::Child`.
///
/// Dropping it neither kills nor waits for the child: it runs on, and the
/// zygote reaps it.
#[derive(Debug)]
pub struct Child {
    /// The write end of the child's stdin, when it was
    /// [`piped`](Stdio::piped).
    pub stdin: Option<ChildStdin>,
    /// The read end of the child's stdout, when it was piped.
    pub stdout: Option<ChildStdout>,
    /// The read end of the child's stderr, when it was piped.
    pub stderr: Option<ChildStderr>,
    /// The master end of the child's pseudo-terminal, when it was asked
    /// for with [`Command::pty`](crate::Command::pty): read the child's
    /// output from it, write its input to it, and set its size with
    /// `TIOCSWINSZ`. Close-on-exec, in blocking mode.
    pub pty: Option<OwnedFd>,
    core: ChildCore,
}

impl Child {
    /// Wraps the pipe ends for tokio. On failure the child is killed, since
    /// the caller would get no handle on it.
    pub(crate) fn from_parts(parts: SpawnedParts) -> Result<Self> {
        let SpawnedParts {
            core,
            stdin,
            stdout,
            stderr,
            pty,
        } = parts;
        // tokio's checked constructors spend an fstat and an F_GETFL per
        // pipe to learn what the protocol already says (a pipe end of the
        // right direction); FIONBIO is the one call needed. Should the
        // zygote send something else, registering it or using it fails.
        let nonblocking = |fd: OwnedFd| rustix::io::ioctl_fionbio(&fd, true).map(|()| fd);
        let wrapped = (|| {
            let stdin = stdin
                .map(|fd| pipe::Sender::from_owned_fd_unchecked(nonblocking(fd)?))
                .transpose()?;
            let stdout = stdout
                .map(|fd| pipe::Receiver::from_owned_fd_unchecked(nonblocking(fd)?))
                .transpose()?;
            let stderr = stderr
                .map(|fd| pipe::Receiver::from_owned_fd_unchecked(nonblocking(fd)?))
                .transpose()?;
            io::Result::Ok((stdin, stdout, stderr))
        })();
        match wrapped {
            Ok((stdin, stdout, stderr)) => Ok(Self {
                stdin: stdin.map(ChildStdin),
                stdout: stdout.map(ChildStdout),
                stderr: stderr.map(ChildStderr),
                pty,
                core,
            }),
            Err(error) => {
                let _ = core.start_kill();
                Err(Error::io("registering the child's pipes with tokio", error))
            }
        }
    }

    /// The child's pid, in the zygote's pid namespace. Prefer
    /// [`pidfd`](Child::pidfd), which cannot refer to a recycled pid.
    pub fn id(&self) -> u32 {
        self.core.id()
    }

    /// What confined the child, as the zygote reported it: the profile,
    /// namespaces, seccomp filter and Landlock ABI applied. `None` when
    /// nothing did (and always from a zygote of protocol version 2 or
    /// older).
    pub fn sandbox(&self) -> Option<&AppliedSandbox> {
        self.core.sandbox()
    }

    /// A pidfd for the child (`pidfd_open(2)`), to poll or signal it
    /// without pid-reuse races.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.core.pidfd()
    }

    /// Follows the child's stops and continues; the zygote reports them
    /// only when the command asked with
    /// [`Command::report_stops`](crate::Command::report_stops).
    pub fn job_events(&self) -> crate::JobEvents {
        self.core.job_events()
    }

    /// Waits for the child to exit. Closes the child's stdin first, so a
    /// child reading it sees end-of-file, as tokio and std do. Cancel-safe.
    ///
    /// When the zygote is lost (crash, SIGKILL, restart) before it reports
    /// the exit, waits on the pidfd instead and reads the exit status the
    /// kernel kept (Linux 6.15 and later) once the child's new parent has
    /// reaped it; [`ExitStatus::zygote_lost`] then says so, and
    /// [`usage`](Child::usage) is `None`.
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteLost`] when the connection to the zygote ends before
    /// the exit is reported and the pidfd cannot stand in: before Linux
    /// 6.15, or when the exited child is not reaped within 30 s.
    pub async fn wait(&mut self) -> Result<ExitStatus> {
        drop(self.stdin.take());
        self.core.wait().await
    }

    /// The exit status if the zygote has already reported it (or, once the
    /// zygote is lost, the pidfd has it); never waits.
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteLost`] when the connection ended before the exit
    /// was reported and the pidfd cannot stand in (before Linux 6.15).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        self.core.try_wait()
    }

    /// Sends SIGKILL through the pidfd and returns at once. Works even when
    /// the zygote has died.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when `pidfd_send_signal` fails; a child already gone
    /// is not an error.
    pub fn start_kill(&mut self) -> Result<()> {
        self.core.start_kill()
    }

    /// Sends SIGKILL and waits for the child to be gone, as tokio's
    /// `Child::kill`. If the zygote is lost meanwhile, the pidfd confirms
    /// the death instead.
    ///
    /// # Errors
    ///
    /// As [`start_kill`](Child::start_kill) and [`wait`](Child::wait).
    pub async fn kill(&mut self) -> Result<()> {
        self.core.kill().await
    }

    /// Asks the zygote, the child's parent, to send `signal` (e.g.
    /// `libc::SIGTERM`); once the zygote is lost, sends it through the
    /// pidfd.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] with the errno (`ESRCH` once the child is gone).
    pub async fn signal(&self, signal: i32) -> Result<()> {
        self.core.signal(signal).await
    }

    /// CPU time and peak memory, once the exit has been seen by
    /// [`wait`](Child::wait) or [`try_wait`](Child::try_wait); `None`
    /// when the zygote was lost before it reported them.
    pub fn usage(&self) -> Option<ResourceUsage> {
        self.core.usage()
    }

    /// Closes stdin, then reads stdout and stderr to their ends
    /// concurrently while waiting for the exit.
    ///
    /// # Errors
    ///
    /// As [`wait`](Child::wait), and [`Error::Io`] when reading fails.
    pub async fn wait_with_output(mut self) -> Result<Output> {
        drop(self.stdin.take());
        let stdout = self.stdout.take();
        let stderr = self.stderr.take();
        let (status, stdout, stderr) = tokio::try_join!(
            self.core.wait(),
            read_all(stdout, "stdout"),
            read_all(stderr, "stderr"),
        )?;
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }
}

macro_rules! pipe_end {
    ($(#[$doc:meta])* $name:ident, $inner:ty, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name($inner);

        impl $name {
            /// The fd, switched back to blocking mode, e.g. to hand it
            /// to code that is not async.
            ///
            /// # Errors
            ///
            /// When the fd cannot be switched to blocking mode.
            pub fn into_owned_fd(self) -> io::Result<OwnedFd> {
                self.0.into_blocking_fd()
            }
        }

        impl AsFd for $name {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.0.as_fd()
            }
        }

        impl AsRawFd for $name {
            fn as_raw_fd(&self) -> RawFd {
                self.0.as_raw_fd()
            }
        }

        #[doc = concat!("Connects another child's stream to this ", $what, " pipe.")]
        impl TryFrom<$name> for Stdio {
            type Error = io::Error;

            fn try_from(pipe: $name) -> io::Result<Stdio> {
                Ok(Stdio::from(pipe.into_owned_fd()?))
            }
        }
    };
}

pipe_end!(
    /// The parent's end of a child's stdin: [`AsyncWrite`]. Dropping it
    /// closes the pipe.
    ChildStdin,
    pipe::Sender,
    "stdin"
);
pipe_end!(
    /// The parent's end of a child's stdout: [`AsyncRead`].
    ChildStdout,
    pipe::Receiver,
    "stdout"
);
pipe_end!(
    /// The parent's end of a child's stderr: [`AsyncRead`].
    ChildStderr,
    pipe::Receiver,
    "stderr"
);

impl AsyncWrite for ChildStdin {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl AsyncRead for ChildStdout {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncRead for ChildStderr {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod pidfd_answer_tests {
    use super::*;

    fn gone() -> io::Result<Option<i32>> {
        Err(io::Error::from_raw_os_error(libc::ESRCH))
    }

    #[test]
    fn a_reaped_child_without_a_status_is_waited_for_until_the_grace_ends() {
        let start = Instant::now();
        let later = start + STATUS_GRACE / 2;
        let after = start + STATUS_GRACE;
        for (first, second) in [(gone(), gone()), (Ok(None), Ok(None)), (gone(), Ok(None))] {
            let mut first_gone = None;
            let answer = judge_pidfd_answer(first, true, &mut first_gone, start).unwrap();
            assert_eq!(answer, PidfdExit::Unreaped);
            let answer = judge_pidfd_answer(second, true, &mut first_gone, later).unwrap();
            assert_eq!(answer, PidfdExit::Unreaped);
            let answer = judge_pidfd_answer(gone(), true, &mut first_gone, after).unwrap();
            assert!(matches!(answer, PidfdExit::Unsupported(_)), "{answer:?}");
        }
    }

    #[test]
    fn a_status_is_taken_and_an_old_kernel_is_named_at_once() {
        let now = Instant::now();
        let mut first_gone = Some(now);
        let answer = judge_pidfd_answer(Ok(Some(7 << 8)), true, &mut first_gone, now).unwrap();
        assert_eq!(answer, PidfdExit::Status(7 << 8));
        let mut first_gone = None;
        let answer = judge_pidfd_answer(Ok(None), false, &mut first_gone, now).unwrap();
        assert_eq!(answer, PidfdExit::Unreaped);
        assert_eq!(first_gone, None, "an unreaped child is not gone");
        for errno in [libc::ENOTTY, libc::EINVAL, libc::EOPNOTSUPP] {
            let error = io::Error::from_raw_os_error(errno);
            let answer = judge_pidfd_answer(Err(error), true, &mut first_gone, now).unwrap();
            assert!(matches!(answer, PidfdExit::Unsupported(_)), "{answer:?}");
        }
        let error = io::Error::from_raw_os_error(libc::EBADF);
        let answer = judge_pidfd_answer(Err(error), true, &mut first_gone, now);
        assert_eq!(answer.unwrap_err().raw_os_error(), Some(libc::EBADF));
    }
}
