//! A child's life on one connection: admission, spawn, the `Spawned`
//! reply, the timeout, kill-on-close, and the reap that sends `Exited`.
//!
//! Nothing is lost: every child is reaped by its own task, whether or not
//! its client is still there, and its exit notice is sent while the client
//! is connected.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};
use zygote_proto::{
    AsyncSeqpacket, ContinueNotice, ExitNotice, ServerMessage, SpawnFailed, SpawnRequest,
    SpawnStage, Spawned, StopNotice, Timeout,
};

use crate::daemon::admission;
use crate::daemon::peer::Peer;
use crate::daemon::plan::{self, Group, OnClose};
use crate::daemon::policy::Grant;
use crate::daemon::reaper;
use crate::daemon::reply::send_reply;
use crate::daemon::shutdown::Shutdown;
use crate::daemon::state::{Closable, Daemon};
use crate::service::metrics::{SpawnResult, errno_name};
use crate::{spawn, strerror};

/// One client's connection, shared by its spawn tasks.
pub struct Connection {
    /// Held weakly: the socket closes when the client leaves, even while
    /// children run.
    pub socket: Weak<AsyncSeqpacket>,
    /// Who the client is.
    pub peer: Peer,
    /// What the policy lets it do.
    pub grant: Grant,
    /// Its children and request ids.
    pub state: Mutex<State>,
    /// Caps the spawn tasks of this connection, each holding a permit
    /// until its child is reaped (or its spawn failed).
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// The semaphore's size: all permits back means nothing is in flight.
    pub max_in_flight: usize,
    /// Woken when a spawn task ends, so that a stopping connection notices
    /// it has become idle.
    pub changed: Notify,
    /// Set when the client has left (or the daemon closed the connection).
    pub left: watch::Sender<bool>,
}

/// The mutable part of a [`Connection`].
#[derive(Default)]
pub struct State {
    /// Started children not yet reaped, by spawn id.
    children: HashMap<u64, Tracked>,
    /// Spawn ids from request until their last reply (`SpawnFailed` or
    /// `Exited`): a request may not reuse one meanwhile.
    ids: HashSet<u64>,
    /// The client has left; children started from now on get their
    /// kill-on-close signal at once.
    closed: bool,
}

struct Tracked {
    pidfd: Arc<AsyncFd<OwnedFd>>,
    pid: i32,
    on_close: Option<OnClose>,
}

impl Connection {
    /// Reserves a spawn id; false when it is in use.
    pub fn claim_id(&self, id: u64) -> bool {
        self.lock().ids.insert(id)
    }

    /// Whether a spawn holds `id`.
    pub fn id_in_use(&self, id: u64) -> bool {
        self.lock().ids.contains(&id)
    }

    /// Nothing in flight and no child running: a stopping daemon may close
    /// the connection.
    pub fn is_idle(&self) -> bool {
        self.in_flight.available_permits() == self.max_in_flight
    }

    /// The pidfd of a running child, by spawn id.
    pub fn pidfd(&self, spawn_id: u64) -> Option<Arc<AsyncFd<OwnedFd>>> {
        self.lock()
            .children
            .get(&spawn_id)
            .map(|tracked| Arc::clone(&tracked.pidfd))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("connection state poisoned")
    }
}

impl Closable for Connection {
    fn close(&self) {
        connection_closed(self);
    }
}

/// The client left: send each kill-on-close child its signal.
pub fn connection_closed(connection: &Connection) {
    {
        let mut state = connection.lock();
        state.closed = true;
        for tracked in state.children.values() {
            if let Some(on_close) = tracked.on_close {
                signal_on_close(tracked, on_close);
            }
        }
    }
    // Only now: during a stop, `left` lets spawn tasks stop tracking their
    // children, which must not happen before the signals above went out.
    connection.left.send_replace(true);
}

fn signal_on_close(tracked: &Tracked, on_close: OnClose) {
    let pidfd = tracked.pidfd.get_ref().as_fd();
    let result = match on_close.group.map(|group| match group {
        Group::Own => tracked.pid,
        Group::Joined(pgid) => pgid,
    }) {
        Some(pgid) if !is_own_group(tracked.pid) => {
            spawn::send_group_signal(pidfd, pgid, on_close.signal)
        }
        _ => spawn::send_signal(pidfd, on_close.signal),
    };
    match result {
        Ok(()) => debug!(pid = tracked.pid, signal = on_close.signal, "kill-on-close"),
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => {}
        Err(error) => warn!(pid = tracked.pid, %error, "kill-on-close signal failed"),
    }
}

/// Whether the child has (re)joined the daemon's own process group, which
/// a group signal must never reach.
fn is_own_group(pid: i32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return true;
    };
    rustix::process::getpgid(Some(pid)).map_or(true, |pgid| pgid == rustix::process::getpgrp())
}

/// One spawn, from request to exit notice.
pub struct SpawnTask {
    /// The connection it came on.
    pub connection: Arc<Connection>,
    /// The daemon.
    pub daemon: Arc<Daemon>,
    /// Held until the task ends: the daemon's stop waits for it.
    pub shutdown: Shutdown,
    /// When the request arrived: the start of the spawn's latency.
    pub received_at: Instant,
    /// This task's share of [`Connection::in_flight`].
    pub _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for SpawnTask {
    /// The permit goes back as the task ends: tell a stopping connection.
    fn drop(&mut self) {
        self.connection.changed.notify_one();
    }
}

impl SpawnTask {
    /// Runs the spawn and, once the child exec'd, waits for its exit.
    pub async fn run(self, request: SpawnRequest, attached: Vec<OwnedFd>) {
        let id = request.id;
        let program = String::from_utf8_lossy(&request.program).into_owned();
        match self.start(&request, attached, &program).await {
            Ok(()) => {}
            Err(failed) => {
                let peer = &self.connection.peer;
                let errno = errno_name(failed.errno);
                // A refusal at admission is the daemon at a limit or its
                // policy: an operator's concern. Any other failure, and a
                // refusal because the daemon is stopping, is the client's,
                // which gets it in the reply: one line per spawn, DEBUG.
                if failed.stage == SpawnStage::Admission && failed.errno != libc::ESHUTDOWN {
                    warn!(
                        peer_pid = peer.pid,
                        peer_uid = peer.uid,
                        peer_gid = peer.gid,
                        program,
                        stage = failed.stage.name(),
                        errno,
                        reason = %failed.message,
                        "spawn refused"
                    );
                } else {
                    debug!(
                        peer_pid = peer.pid,
                        peer_uid = peer.uid,
                        peer_gid = peer.gid,
                        program,
                        stage = failed.stage.name(),
                        errno,
                        reason = %failed.message,
                        "spawn failed"
                    );
                }
                let metrics = &self.daemon.metrics;
                let result = match failed.stage {
                    // Refused before anything was created.
                    SpawnStage::Validate | SpawnStage::Admission => SpawnResult::Refused,
                    SpawnStage::Exec => {
                        metrics.exec_failed(failed.errno);
                        SpawnResult::Failed
                    }
                    _ => SpawnResult::Failed,
                };
                self.finish(id, &ServerMessage::SpawnFailed(failed)).await;
                metrics.spawn_done(result, self.received_at.elapsed(), self.connection.peer.uid);
            }
        }
    }

    async fn start(
        &self,
        request: &SpawnRequest,
        attached: Vec<OwnedFd>,
        program: &str,
    ) -> Result<(), SpawnFailed> {
        let id = request.id;
        let peer = &self.connection.peer;
        let refused = |stage, errno, message| SpawnFailed {
            id,
            stage,
            errno,
            message,
        };
        // Policy before capacity, capacity before any work: both fail fast.
        let credentials = self
            .connection
            .grant
            .check(peer, request, &self.daemon.credentials)
            .map_err(|denied| refused(SpawnStage::Admission, libc::EPERM, denied.0))?;
        let slot = admission::reserve(&self.daemon, peer.uid, self.connection.grant.max_children)
            .map_err(|busy| refused(SpawnStage::Admission, libc::EAGAIN, busy))?;
        let limit = self.connection.grant.max_argv_env_bytes;
        let mut prepared = plan::prepare(request, attached, limit).map_err(|refusal| {
            refused(refusal.stage, refusal.errno.raw_os_error(), refusal.message)
        })?;
        prepared.plan.credentials = credentials;
        plan::apply_peer_floor(&mut prepared.plan, peer);
        let clamped = self.connection.grant.clamp_unset_rlimits(
            peer,
            &request.rlimits,
            &self.daemon.own_limits,
        );
        prepared.plan.rlimits.extend(clamped);
        self.daemon.drop_inherited_settings(&mut prepared.plan);
        let spawned = self.daemon.spawn(&prepared.plan);
        // The daemon's copies of the child's fds must not outlive the spawn.
        drop(prepared.plan);
        let child = spawned.map_err(|error| {
            let reason = strerror(error.errno);
            let message = match (error.stage, &request.cwd) {
                // The directory is what is missing, not the program.
                (SpawnStage::Chdir, Some(cwd)) => {
                    format!("chdir {}: {reason}", String::from_utf8_lossy(cwd))
                }
                _ => format!("{program}: {reason}"),
            };
            refused(error.stage, error.errno, message)
        })?;
        let pid = child.pid;
        let pidfd = match zygote_proto::register(child.pidfd, Interest::READABLE) {
            Ok(pidfd) => Arc::new(pidfd),
            Err(error) => {
                // Cannot happen short of epoll failing; the child is then
                // neither watched nor reported, so say so loudly.
                warn!(pid, %error, "failed to watch a child's pidfd; it will not be reaped");
                self.connection.lock().ids.remove(&id);
                return Ok(());
            }
        };
        self.daemon.metrics.child_started();
        {
            let tracked = Tracked {
                pidfd: Arc::clone(&pidfd),
                pid,
                on_close: prepared.on_close,
            };
            let mut state = self.connection.lock();
            // The client may have left while we spawned.
            if let (true, Some(on_close)) = (state.closed, tracked.on_close) {
                signal_on_close(&tracked, on_close);
            }
            state.children.insert(id, tracked);
        }
        let mut fds: Vec<BorrowedFd<'_>> = vec![pidfd.get_ref().as_fd()];
        fds.extend(prepared.client_ends.iter().map(AsFd::as_fd));
        self.reply(&ServerMessage::Spawned(Spawned { id, pid }), &fds)
            .await;
        let latency = self.received_at.elapsed();
        self.daemon
            .metrics
            .spawn_done(SpawnResult::Ok, latency, peer.uid);
        drop(fds);
        drop(prepared.client_ends);
        debug!(
            peer_pid = peer.pid,
            peer_uid = peer.uid,
            peer_gid = peer.gid,
            program,
            pid,
            latency_us = latency.as_micros() as u64,
            "spawned"
        );

        let stops = async {
            if !request.report_stops {
                return std::future::pending().await;
            }
            reaper::follow_stops(pidfd.get_ref().as_fd(), |change| {
                debug!(pid, ?change, "child stopped or continued");
                let message = match change {
                    reaper::JobChange::Stopped(signal) => {
                        ServerMessage::Stopped(StopNotice { id, signal })
                    }
                    reaper::JobChange::Continued => ServerMessage::Continued(ContinueNotice { id }),
                };
                async move { self.reply(&message, &[]).await }
            })
            .await;
        };
        // Polled in this order: once the child has exited, no stop notice
        // can follow its `Exited`.
        let (exit, timed_out) = tokio::select! {
            biased;
            exit = wait_with_timeout(&pidfd, pid, prepared.timeout, prepared.leads_own_group) => exit,
            () = stops => unreachable!("following stops never ends"),
            () = self.abandoned() => {
                debug!(pid, "leaving a child to the system's reaper: the daemon is stopping and its client has left");
                self.connection.lock().children.remove(&id);
                return Ok(());
            }
        };
        self.connection.lock().children.remove(&id);
        let status = exit.as_ref().ok().map(|(status, _)| status);
        self.daemon.metrics.child_reaped(status);
        drop(slot);
        match exit {
            Ok((status, usage)) => {
                debug!(pid, ?status, timed_out, "child exited");
                let notice = ExitNotice {
                    id,
                    status,
                    usage,
                    timed_out,
                };
                self.finish(id, &ServerMessage::Exited(notice)).await;
            }
            Err(error) => {
                warn!(pid, %error, "failed to reap a child");
                self.connection.lock().ids.remove(&id);
            }
        }
        Ok(())
    }

    /// Resolves when nobody will ever want this child's exit: the daemon
    /// is stopping and the child's client has gone.
    async fn abandoned(&self) {
        let mut shutdown = self.shutdown.clone();
        let mut left = self.connection.left.subscribe();
        shutdown.stopping().await;
        let _ = left.wait_for(|left| *left).await;
    }

    /// Frees the id, then sends the spawn's last reply: a client that
    /// reuses the id as soon as it sees the reply is not refused.
    async fn finish(&self, id: u64, message: &ServerMessage) {
        self.connection.lock().ids.remove(&id);
        self.reply(message, &[]).await;
    }

    async fn reply(&self, message: &ServerMessage, fds: &[BorrowedFd<'_>]) {
        if let Some(socket) = self.connection.socket.upgrade() {
            send_reply(&socket, message, fds).await;
        }
    }
}

/// Waits for the child's exit; past the timeout sends SIGTERM, and past
/// the grace period SIGKILL. Returns whether the timeout fired.
///
/// A child leading its own process group gets the signals as a group, as
/// coreutils `timeout` does, so that what it started ends with it.
async fn wait_with_timeout(
    pidfd: &AsyncFd<OwnedFd>,
    pid: i32,
    timeout: Option<Timeout>,
    leads_own_group: bool,
) -> (
    std::io::Result<(zygote_proto::ExitStatus, zygote_proto::ResourceUsage)>,
    bool,
) {
    let Some(timeout) = timeout else {
        return (reaper::wait_exit(pidfd).await, false);
    };
    let signal = |signal| {
        let pidfd = pidfd.get_ref().as_fd();
        // Re-checked each time: the child may have joined another group.
        if leads_own_group && !is_own_group(pid) {
            spawn::send_group_signal(pidfd, pid, signal)
        } else {
            spawn::send_signal(pidfd, signal)
        }
    };
    let expire = tokio::time::sleep(Duration::from_millis(timeout.millis));
    tokio::select! {
        exit = reaper::wait_exit(pidfd) => return (exit, false),
        () = expire => {}
    }
    debug!(pid, group = leads_own_group, "timeout: SIGTERM");
    let _ = signal(libc::SIGTERM);
    let grace = tokio::time::sleep(Duration::from_millis(timeout.grace_millis));
    tokio::select! {
        exit = reaper::wait_exit(pidfd) => return (exit, true),
        () = grace => {}
    }
    debug!(
        pid,
        group = leads_own_group,
        "timeout: grace period over, SIGKILL"
    );
    let _ = signal(libc::SIGKILL);
    (reaper::wait_exit(pidfd).await, true)
}
