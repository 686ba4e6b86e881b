//! One template process: its start (through the daemon's spawn path, then
//! the wait for "ready") and the questions it is asked (a fork each).

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::Deserialize;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use zygote_proto::{AsyncSeqpacket, RECV_BUFFER_BYTES, SpawnRequest, StdioSpec};

use super::{Failure, RUNNER, Template, watch};
use crate::daemon::cgroup::ChildCgroup;
use crate::daemon::plan::{self, DevNull};
use crate::daemon::state::Daemon;
use crate::daemon::{lifetime, reaper};
use crate::spawn;
use crate::strerror;

/// The template's end of its control socket.
const CONTROL_FD: i32 = 3;

/// What a template answered to one fork.
#[derive(Debug)]
pub(crate) enum Answer {
    /// It cloned this pid (not trusted yet).
    Child(i32),
    /// Its clone failed with this errno.
    Errno(i32),
    /// It could not answer: errno and why.
    Lost(Failure),
}

/// A running template process.
pub(crate) struct Process {
    pub pid: i32,
    pub uid: u32,
    pub started: Instant,
    pub(super) socket: AsyncSeqpacket,
    pub(super) queue: Mutex<Queue>,
    forks: AtomicU64,
    /// Asked to end (recycled, stopped): takes no question.
    retired: AtomicBool,
    /// Its process ended, or its watch gave up on it.
    pub(super) ended: AtomicBool,
    /// Its cgroup, removed once it has ended.
    pub(super) cgroup: Option<Arc<ChildCgroup>>,
    /// When it last forked, for the idle stop.
    pub(super) last_used: Mutex<Instant>,
    /// Wakes its watch for a new question or a retirement.
    pub(super) wake: tokio::sync::Notify,
}

/// The questions in flight, oldest first: the template answers in order.
#[derive(Default)]
pub(super) struct Queue {
    pub asked: VecDeque<(Instant, oneshot::Sender<Answer>)>,
}

impl Process {
    /// Whether it takes questions.
    pub(crate) fn accepting(&self) -> bool {
        !self.retired.load(Ordering::Relaxed) && !self.ended.load(Ordering::Relaxed)
    }

    /// Children forked so far.
    pub(crate) fn forks(&self) -> u64 {
        self.forks.load(Ordering::Relaxed)
    }

    /// Counts one child forked.
    pub(crate) fn forked(&self) {
        self.forks.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Asks it to end: it takes no new question, answers those it has,
    /// and exits at the end of its socket.
    pub(crate) fn retire(&self) {
        if !self.retired.swap(true, Ordering::Relaxed) {
            let _ = rustix::net::shutdown(self.socket.as_fd(), rustix::net::Shutdown::Write);
            self.wake.notify_one();
        }
    }

    /// Sends one fork's plan (`bytes`, with `fds`); the answer comes on
    /// the receiver.
    pub(crate) fn ask(
        &self,
        bytes: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<oneshot::Receiver<Answer>, Failure> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.accepting() {
            return Err(Failure::new(
                libc::EPROTO,
                "the template's process is ending; try again",
            ));
        }
        zygote_proto::send_frame(self.socket.as_fd(), bytes, fds).map_err(|error| {
            Failure::new(
                libc::EPROTO,
                format!("cannot reach the template's process: {error}"),
            )
        })?;
        let (answer, receiver) = oneshot::channel();
        let was_empty = queue.asked.is_empty();
        queue.asked.push_back((Instant::now(), answer));
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        if was_empty {
            self.wake.notify_one();
        }
        Ok(receiver)
    }
}

#[cfg(test)]
impl Process {
    /// A process record over `socket` (no process behind it), started at
    /// `started`, that has forked `forks` children: for the registry's
    /// unit tests.
    pub(super) fn for_tests(socket: OwnedFd, started: Instant, forks: u64) -> Self {
        Self {
            pid: 0,
            uid: 0,
            started,
            socket: AsyncSeqpacket::new(socket).expect("register the socket"),
            queue: Mutex::default(),
            forks: AtomicU64::new(forks),
            retired: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            cgroup: None,
            last_used: Mutex::new(Instant::now()),
            wake: tokio::sync::Notify::new(),
        }
    }
}

/// What a starting template says first.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Hello {
    Ready(i32),
    Failed(String),
}

/// The label of a failed start in the metrics, and why.
pub(super) type StartFailure = (&'static str, Failure);

/// Starts `template`'s process and waits for it to be ready; its watch
/// runs from then on.
pub(super) async fn start(
    daemon: &Arc<Daemon>,
    template: &Arc<Template>,
) -> Result<Arc<Process>, StartFailure> {
    let began = Instant::now();
    let deadline = began + daemon.templates.start_deadline();
    let (ours, stderr, plan, cgroup) = plan_for(daemon, template).map_err(|f| ("refused", f))?;
    let started = daemon.start(&plan);
    drop(plan);
    let remove_cgroup = || {
        if let Some(cgroup) = &cgroup {
            let _ = cgroup.remove();
        }
    };
    let started = started.map_err(|error| {
        remove_cgroup();
        let failure = Failure::new(
            error.errno,
            format!("cannot start the template: {}", strerror(error.errno)),
        );
        ("failed", failure)
    })?;
    let pid = started.pid;
    let pidfd = zygote_proto::register(started.pidfd, Interest::READABLE)
        .map_err(|error| ("failed", Failure::new(libc::EIO, error.to_string())))?;
    let interpreter = String::from_utf8_lossy(template.interpreter()).into_owned();
    if let Err(failure) = await_exec(started.status, &pidfd, &interpreter, deadline).await {
        let _ = reaper::wait_exit(&pidfd).await;
        remove_cgroup();
        return Err(("exec_failed", failure));
    }
    // Read while it starts, so that it never blocks on a full pipe; it
    // points its stderr at /dev/null once ready.
    let stderr = tokio::spawn(drain(stderr));
    let socket = AsyncSeqpacket::new(ours)
        .map_err(|error| ("failed", Failure::new(libc::EIO, error.to_string())))?;
    let ready = tokio::time::timeout_at(deadline.into(), wait_ready(&socket, &pidfd, pid)).await;
    let failed = match ready {
        Ok(Ok(())) => None,
        Ok(Err(failure)) => Some(("preload_failed", failure)),
        Err(_) => Some((
            "timeout",
            Failure::new(
                libc::ETIMEDOUT,
                format!(
                    "the template was not ready within {} ms (its preloads still importing?)",
                    daemon.templates.start_deadline().as_millis()
                ),
            ),
        )),
    };
    if let Some((result, mut failure)) = failed {
        let _ = spawn::send_signal(pidfd.get_ref().as_fd(), libc::SIGKILL);
        let _ = reaper::wait_exit(&pidfd).await;
        remove_cgroup();
        if let Ok(Ok(said)) = tokio::time::timeout(STDERR_WAIT, stderr).await {
            let said = said.trim_ascii();
            if !said.is_empty() {
                failure.message.push_str("; its stderr:\n");
                failure.message.push_str(&String::from_utf8_lossy(said));
            }
        }
        crate::daemon::reply::clip_middle(&mut failure.message);
        return Err((result, failure));
    }
    let process = Arc::new(Process {
        pid,
        // Its children's: the peer's, or the daemon's own when the daemon
        // does not switch uids (a root peer of a daemon run as a user).
        uid: real_uid(pid).unwrap_or_else(|| template.uid()),
        started: Instant::now(),
        socket,
        queue: Mutex::default(),
        forks: AtomicU64::new(0),
        retired: AtomicBool::new(false),
        ended: AtomicBool::new(false),
        cgroup,
        last_used: Mutex::new(Instant::now()),
        wake: tokio::sync::Notify::new(),
    });
    watch::Watch::new(Arc::clone(&process), pidfd, template, daemon).run();
    Ok(process)
}

/// What of a template's stderr is kept, from its start until it is ready.
const STDERR_CAP: usize = 4096;

/// How long a template that failed to start may take to close its stderr.
const STDERR_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Reads `pipe` to its end, keeping the first [`STDERR_CAP`] bytes.
async fn drain(pipe: OwnedFd) -> Vec<u8> {
    let mut kept = Vec::new();
    if rustix::io::ioctl_fionbio(&pipe, true).is_err() {
        return kept;
    }
    let Ok(pipe) = zygote_proto::register(pipe, Interest::READABLE) else {
        return kept;
    };
    let mut buffer = [0u8; 4096];
    loop {
        let Ok(mut guard) = pipe.readable().await else {
            return kept;
        };
        match rustix::io::read(pipe.get_ref(), &mut buffer) {
            Ok(0) => return kept,
            Ok(read) => {
                let room = STDERR_CAP.saturating_sub(kept.len()).min(read);
                kept.extend_from_slice(&buffer[..room]);
            }
            Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return kept,
        }
    }
}

/// A template's plan, and what the daemon keeps of it.
type Planned = (OwnedFd, OwnedFd, spawn::SpawnPlan, Option<Arc<ChildCgroup>>);

/// The template's plan: its interpreter with the runner, its pool's
/// size and the preloads,
/// as the template's peer, with the control socket as fd 3 and its stderr
/// on a pipe; the daemon's end of that socket, the pipe's read end, the
/// plan, and the template's cgroup.
fn plan_for(daemon: &Arc<Daemon>, template: &Template) -> Result<Planned, Failure> {
    let pool_size = daemon.templates.pool_size().to_string().into_bytes();
    let mut args = vec![b"-c".to_vec(), RUNNER.as_bytes().to_vec(), pool_size];
    args.extend(
        template
            .key
            .preload
            .iter()
            .map(|name| name.as_bytes().to_vec()),
    );
    let mut request = SpawnRequest {
        args,
        env: template.env.clone(),
        cwd: template.key.cwd.clone(),
        stderr: StdioSpec::Pipe,
        ..SpawnRequest::new(0, template.key.interpreter.clone())
    };
    let (peer, grant) = (&template.peer, &template.grant);
    let credentials = grant
        .check(peer, &request, &daemon.credentials)
        .map_err(|denied| Failure::new(libc::EPERM, denied.0))?;
    let limit = grant.max_argv_env_bytes;
    let prepared = plan::prepare(&mut request, Vec::new(), limit, &DevNull::default())
        .map_err(|refusal| Failure::new(refusal.errno.raw_os_error(), refusal.message))?;
    let mut plan = prepared.plan;
    let stderr = prepared
        .client_ends
        .into_iter()
        .next()
        .ok_or_else(|| Failure::new(libc::EIO, "no pipe for the template's stderr"))?;
    plan.credentials = credentials;
    lifetime::limit_plan(daemon, grant, peer, &mut plan);
    daemon.drop_inherited_settings(&mut plan);
    let (ours, theirs) = zygote_proto::socket::pair(false)
        .map_err(|error| Failure::new(libc::EIO, error.to_string()))?;
    plan.fds.push((theirs, CONTROL_FD));
    let cgroup = match &daemon.cgroups {
        Some(subtree) => {
            let (cgroup, dir) = subtree
                .create(peer.uid, grant.caps, None)
                .map_err(|(message, errno)| Failure::new(errno, message))?;
            plan.cgroup = Some(dir);
            Some(Arc::new(cgroup))
        }
        None => None,
    };
    Ok((ours, stderr, plan, cgroup))
}

/// Waits for the template's exec: the exec's errno when it failed.
async fn await_exec(
    status: OwnedFd,
    pidfd: &AsyncFd<OwnedFd>,
    interpreter: &str,
    deadline: Instant,
) -> Result<(), Failure> {
    let status = zygote_proto::register(status, Interest::READABLE)
        .map_err(|error| Failure::new(libc::EIO, error.to_string()))?;
    let report = tokio::select! {
        report = lifetime::read_exec_report(&status) => report,
        // Stopped before exec by its peer: killed at the deadline.
        () = tokio::time::sleep_until(deadline.into()) => {
            let _ = spawn::send_signal(pidfd.get_ref().as_fd(), libc::SIGKILL);
            return Err(Failure::new(libc::ETIMEDOUT, "the template did not exec in time"));
        }
    };
    match report {
        Ok(spawn::ExecReport::Execd) => Ok(()),
        Ok(spawn::ExecReport::Failed(error)) => Err(Failure::new(
            error.errno,
            format!(
                "cannot start template interpreter {interpreter}: {} (at {})",
                strerror(error.errno),
                error.stage.name()
            ),
        )),
        Err(error) => {
            let _ = spawn::send_signal(pidfd.get_ref().as_fd(), libc::SIGKILL);
            Err(Failure::new(
                error.raw_os_error().unwrap_or(libc::EIO),
                format!("cannot read the template's start: {error}"),
            ))
        }
    }
}

/// Waits for the template's first word: ready, or why not.
async fn wait_ready(
    socket: &AsyncSeqpacket,
    pidfd: &AsyncFd<OwnedFd>,
    pid: i32,
) -> Result<(), Failure> {
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let received = tokio::select! {
        received = socket.recv_in(&mut scratch) => received,
        _ = pidfd.readable() => {
            // Its last words may still be queued.
            match zygote_proto::recv_frame_in(socket.as_fd(), &mut scratch) {
                Ok(Some(received)) => Ok(Some(received)),
                _ => Ok(None),
            }
        }
    };
    let received = match received {
        Ok(Some(received)) => received,
        Ok(None) | Err(_) => {
            return Err(Failure::new(
                libc::EPROTO,
                "the template exited while it started (its interpreter is not CPython 3.8 or \
                 later, or it crashed)",
            ));
        }
    };
    match serde_json::from_slice::<Hello>(&scratch[..received.len]) {
        Ok(Hello::Ready(said)) if said == pid => Ok(()),
        Ok(Hello::Ready(said)) => Err(Failure::new(
            libc::EPROTO,
            format!("the template said it was pid {said}, not {pid}"),
        )),
        Ok(Hello::Failed(message)) => Err(Failure::new(libc::EPROTO, message)),
        Err(error) => Err(Failure::new(
            libc::EPROTO,
            format!("the template said something unexpected while starting: {error}"),
        )),
    }
}

/// The real uid of `pid`, from `/proc/PID/status`.
fn real_uid(pid: i32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
