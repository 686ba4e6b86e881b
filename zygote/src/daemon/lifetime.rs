//! A child's life on one connection: admission, spawn, the `Spawned`
//! reply, the timeout, kill-on-close, and the reap that sends `Exited`.
//!
//! Nothing is lost: every child is reaped by its own task, whether or not
//! its client is still there, and its exit notice is sent while the client
//! is connected.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};
use zygote_proto::{
    AsyncSeqpacket, ContinueNotice, ExitNotice, Feature, ServerMessage, SpawnFailed, SpawnRequest,
    SpawnStage, Spawned, StopNotice,
};

use crate::daemon::admission;
use crate::daemon::cgroup::ChildCgroup;
use crate::daemon::features;
use crate::daemon::handover::{
    Active, SavedChild, SavedClient, SavedConnection, SavedExit, SavedPeer, Timer,
};
use crate::daemon::outbox::{self, Outbox, Owed, ReplyFd};
use crate::daemon::parked;
use crate::daemon::peer::Peer;
use crate::daemon::plan::{self, Group, OnClose};
use crate::daemon::policy::Grant;
use crate::daemon::reaper;
use crate::daemon::reply::clip;
use crate::daemon::sandbox;
use crate::daemon::sandbox::pool::Recipe;
use crate::daemon::shutdown::Shutdown;
use crate::daemon::state::{Closable, Daemon};
use crate::daemon::templates;
use crate::daemon::uid_spawners;
use crate::service::metrics::{SpawnPath, SpawnResult, errno_name};
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
    /// The protocol version negotiated in its hello: requests are decoded
    /// and replies encoded in its layouts.
    pub version: u32,
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
    /// Its replies on their way to the client, and what the client has
    /// left unanswered or unread: at the bounds the connection stops
    /// reading requests.
    pub outbox: Arc<Outbox>,
    /// The `/dev/null` of its children's `Null` streams.
    pub dev_null: plan::DevNull,
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
    /// `None` once reaped (its tree is being waited for).
    pidfd: Option<Arc<AsyncFd<OwnedFd>>>,
    pid: i32,
    on_close: Option<OnClose>,
    cgroup: Option<Arc<ChildCgroup>>,
    /// What an upgrade needs to carry the watch over.
    report_stops: bool,
    leads_own_group: bool,
    timer: Option<Arc<Mutex<Timer>>>,
    exited: Option<SavedExit>,
}

impl Tracked {
    fn save(&self, id: u64) -> SavedChild {
        SavedChild {
            id,
            pid: self.pid,
            pidfd: self.pidfd.as_ref().map(|pidfd| pidfd.get_ref().as_raw_fd()),
            on_close: self
                .on_close
                .map(|on_close| (on_close.signal, on_close.group == Some(Group::Own))),
            cgroup: self.cgroup.as_ref().map(|cgroup| cgroup.save()),
            report_stops: self.report_stops,
            leads_own_group: self.leads_own_group,
            timer: self
                .timer
                .as_ref()
                .map(|timer| timer.lock().expect("timer poisoned").save()),
            exited: self.exited.clone(),
        }
    }
}

impl Connection {
    /// Reserves a spawn id; false when it is in use.
    pub fn claim_id(&self, id: u64) -> bool {
        self.lock().ids.insert(id)
    }

    /// Frees a spawn id whose child will never be reported.
    pub(crate) fn forget_id(&self, id: u64) {
        self.lock().ids.remove(&id);
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
            .and_then(|tracked| tracked.pidfd.clone())
    }

    /// The cgroup of a running child, by spawn id.
    pub fn cgroup(&self, spawn_id: u64) -> Option<Arc<ChildCgroup>> {
        self.lock()
            .children
            .get(&spawn_id)
            .and_then(|tracked| tracked.cgroup.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("connection state poisoned")
    }

    /// Queues a reply without fds; only from a task that holds a share of
    /// the daemon's pause.
    pub fn reply(&self, daemon: &Daemon, message: ServerMessage) {
        self.outbox.push(message, Vec::new(), daemon.pause.hold());
    }

    /// A connection as an earlier image of this daemon saved it: its ids
    /// and whether its client left; its children are restored with
    /// [`resume`].
    pub fn restore_state(&self, ids: &[u64], closed: bool) {
        let mut state = self.lock();
        state.ids.extend(ids.iter().copied());
        state.closed = closed;
    }
}

impl Closable for Connection {
    fn close(&self) {
        connection_closed(self);
    }

    fn save(&self) -> SavedConnection {
        let socket = self.socket.upgrade();
        let state = self.lock();
        let mut ids: Vec<u64> = state.ids.iter().copied().collect();
        ids.sort_unstable();
        let mut children: Vec<SavedChild> = state
            .children
            .iter()
            .map(|(id, tracked)| tracked.save(*id))
            .collect();
        children.sort_unstable_by_key(|child| child.id);
        SavedConnection {
            socket: socket.map(|socket| socket.as_fd().as_raw_fd()),
            client: Some(SavedClient {
                peer: SavedPeer::from(&self.peer),
                grant: self.grant.clone(),
                ids,
                closed: state.closed,
                protocol_version: self.version,
                children,
            }),
        }
    }
}

/// The client left: send each kill-on-close child its signal.
pub fn connection_closed(connection: &Connection) {
    {
        let mut state = connection.lock();
        state.closed = true;
        for tracked in state.children.values() {
            if let Some(on_close) = tracked.on_close {
                signal_on_close(tracked, on_close, connection.peer.uid);
            }
        }
    }
    // Only now: during a stop, `left` lets spawn tasks stop tracking their
    // children, which must not happen before the signals above went out.
    connection.left.send_replace(true);
}

fn signal_on_close(tracked: &Tracked, on_close: OnClose, peer_uid: u32) {
    // Reaped, its tree being waited for: kill-on-close no longer applies.
    if tracked.exited.is_some() {
        return;
    }
    if let Some(cgroup) = &tracked.cgroup
        && cgroup.doom(on_close.signal)
    {
        debug!(pid = tracked.pid, cgroup = %cgroup.path().display(), "kill-on-close: whole tree");
        return;
    }
    let group = on_close.group == Some(Group::Own);
    let Some(pidfd) = &tracked.pidfd else {
        return;
    };
    let pidfd = pidfd.get_ref().as_fd();
    match signal_child(pidfd, tracked.pid, group, on_close.signal, peer_uid) {
        Ok(()) => debug!(pid = tracked.pid, signal = on_close.signal, "kill-on-close"),
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => {}
        Err(error) => warn!(pid = tracked.pid, %error, "kill-on-close signal failed"),
    }
}

/// Sends `signal` to a child and, when `group` asks for it, to the process
/// group the child leads: the one made for it at spawn (`setsid`, or
/// `setpgid(0, 0)`), and only while the child still leads it. A group the
/// child joined, or moved to, is never signalled: it may hold processes
/// its peer could not signal. The group signal goes out with the peer's
/// uid, so members the peer could not signal (a setuid program) are
/// spared. Whatever happens to the group, the child itself gets the signal.
fn signal_child(
    pidfd: BorrowedFd<'_>,
    pid: i32,
    group: bool,
    signal: i32,
    peer_uid: u32,
) -> std::io::Result<()> {
    if group && leads_own_group(pid) {
        if let Err(error) = spawn::send_group_signal_as(pidfd, pid, signal, peer_uid) {
            debug!(pid, %error, "group signal failed; signalling the child alone");
        }
    }
    // Directly as well: the child may have left the group, or run with ids
    // its peer cannot signal. (A signal already pending is not doubled.)
    spawn::send_signal(pidfd, signal)
}

/// Whether the child leads its own process group (its pgid is its pid).
/// Unreaped, it keeps its pid, so that group cannot be anyone else's.
fn leads_own_group(pid: i32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    rustix::process::getpgid(Some(pid)).is_ok_and(|pgid| pgid == pid)
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
    /// Counts this spawn as not yet answered (see [`Connection::outbox`])
    /// until its first reply is queued.
    pub answer_slot: Mutex<Option<Owed>>,
    /// What confines the child, for its `Spawned` (sent now or deferred).
    pub applied_sandbox: Mutex<Option<sandbox::AppliedSandbox>>,
    /// The template that forks the child (a warm spawn), by handle.
    pub template: Option<u64>,
}

impl Drop for SpawnTask {
    /// The permit goes back as the task ends: tell a stopping connection.
    fn drop(&mut self) {
        self.connection.changed.notify_one();
    }
}

impl SpawnTask {
    /// Runs the spawn and, once the child exec'd, waits for its exit.
    pub async fn run(self, request: SpawnRequest, attached: Vec<OwnedFd>, mut active: Active) {
        let id = request.id;
        let mut program = match self.template {
            Some(handle) => format!("template {handle}"),
            None => String::from_utf8_lossy(&request.program).into_owned(),
        };
        clip(&mut program);
        match self.start(request, attached, &program, &mut active).await {
            Ok(()) => {}
            Err(mut failed) => {
                clip(&mut failed.message);
                let peer = &self.connection.peer;
                let errno = errno_name(failed.errno);
                // A refusal at admission is the daemon at a limit or its
                // policy: an operator's concern. Any other failure, and a
                // refusal because the daemon is stopping, is the client's,
                // which gets it in the reply: one line per spawn, DEBUG.
                // At most a few lines per uid and window: a peer must not
                // flood the log with its own refusals.
                let refused =
                    failed.stage == SpawnStage::Admission && failed.errno != libc::ESHUTDOWN;
                let allowed = refused.then(|| self.daemon.log_limit.allow(peer.uid));
                if let Some(Some(suppressed)) = allowed {
                    warn!(
                        peer_pid = peer.pid,
                        peer_uid = peer.uid,
                        peer_gid = peer.gid,
                        program,
                        stage = failed.stage.name(),
                        errno,
                        reason = %failed.message,
                        suppressed,
                        "spawn refused"
                    );
                } else if !refused {
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
                self.finish(id, ServerMessage::SpawnFailed(failed));
                metrics.spawn_done(result, self.received_at.elapsed(), self.connection.peer.uid);
            }
        }
    }

    async fn start(
        &self,
        mut request: SpawnRequest,
        attached: Vec<OwnedFd>,
        program: &str,
        active: &mut Active,
    ) -> Result<(), SpawnFailed> {
        let id = request.id;
        let warm = self
            .template
            .map(|handle| {
                templates::check_spawn(&self.daemon, &self.connection, handle, &mut request)
            })
            .transpose()?;
        let (credentials, slot) = self.admit(&request)?;
        // A warm child has its template's credentials.
        let credentials = credentials.filter(|_| warm.is_none());
        // One peer's burst waits here, behind its own spawns only, before
        // it holds any fd.
        let turn = self.daemon.launch_turn(self.connection.peer.uid).await;
        let mut prepared = self.plan(&mut request, attached, credentials)?;
        // A queued request holds no more than its reply from here on.
        let report_stops = request.report_stops;
        let defer_spawned = request.defer_spawned;
        let cgroup_spec = request.cgroup.take();
        let cwd = request.cwd.take();
        drop(request);
        self.daemon.drop_inherited_settings(&mut prepared.plan);
        let cgroup = self.place_in_cgroup(id, cgroup_spec.as_ref(), &mut prepared.plan)?;
        let plan::Prepared {
            plan,
            client_ends,
            on_close,
            timeout,
            leads_own_group,
            sandbox: applied_sandbox,
        } = prepared;
        let launched = match &warm {
            Some(template) => {
                self.launch_warm(template, id, plan, cgroup.as_deref())
                    .await
            }
            None => {
                self.launch(id, plan, cgroup.as_deref(), cwd.as_deref(), program)
                    .await
            }
        };
        drop(turn);
        let Some((pid, pidfd)) = launched? else {
            return Ok(());
        };
        self.daemon.metrics.child_started();
        if let Some(applied) = &applied_sandbox {
            self.daemon.metrics.sandboxed_spawn(SpawnResult::Ok);
            debug!(pid, ?applied, "child sandboxed");
        }
        *self
            .applied_sandbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = applied_sandbox;
        let timer = timeout.map(start_timer);
        self.track(
            id,
            Tracked {
                pidfd: Some(Arc::clone(&pidfd)),
                pid,
                on_close,
                cgroup: cgroup.clone(),
                report_stops,
                leads_own_group,
                timer: timer.clone(),
                exited: None,
            },
        );
        // Deferred: `watch` sends it if the child outlives the delay.
        let deferred = defer_spawned.then(|| {
            self.daemon
                .deferrals
                .deadline(DEFERRED_SPAWNED_AFTER)
                .into_std()
        });
        if deferred.is_none() {
            self.send_spawned(id, pid, &pidfd, client_ends);
        } else {
            drop(client_ends);
        }
        self.spawned(program, pid);
        let watched = Watched {
            id,
            pid,
            pidfd: Some(pidfd),
            cgroup,
            timer,
            report_stops,
            leads_own_group,
            exited: None,
            deferred,
        };
        self.watch(watched, Some(slot), active).await;
        Ok(())
    }

    /// Policy before capacity, capacity before any work: both fail fast.
    /// The credentials the child switches to, and its child slot.
    fn admit(
        &self,
        request: &SpawnRequest,
    ) -> Result<(Option<spawn::Credentials>, admission::Slot), SpawnFailed> {
        let peer = &self.connection.peer;
        // A feature this daemon withholds or lacks is refused by its name
        // (cgroups without a subtree are refused below, saying why).
        let withheld = |feature: &Feature| {
            self.daemon.masked_features.contains(feature)
                || (*feature != Feature::Cgroups && !self.daemon.offers(*feature))
        };
        if let Some(feature) = features::used_by(request).find(withheld) {
            let (stage, errno, message) = features::refusal(feature);
            return Err(refused(request.id, stage, errno, message));
        }
        let credentials = self
            .connection
            .grant
            .check(peer, request, &self.daemon.credentials)
            .map_err(|denied| refused(request.id, SpawnStage::Admission, libc::EPERM, denied.0))?;
        let slot =
            admission::reserve(&self.daemon, peer.uid, self.connection.grant.max_children)
                .map_err(|busy| refused(request.id, SpawnStage::Admission, libc::EAGAIN, busy))?;
        Ok((credentials, slot))
    }

    /// The checked plan: the request's, with the peer's floor and the
    /// resource limits it leaves unset.
    fn plan(
        &self,
        request: &mut SpawnRequest,
        attached: Vec<OwnedFd>,
        credentials: Option<spawn::Credentials>,
    ) -> Result<plan::Prepared, SpawnFailed> {
        let peer = &self.connection.peer;
        let grant = &self.connection.grant;
        let limit = grant.max_argv_env_bytes;
        let mut prepared = plan::prepare(request, attached, limit, &self.connection.dev_null)
            .map_err(|refusal| {
                refused(
                    request.id,
                    refusal.stage,
                    refusal.errno.raw_os_error(),
                    refusal.message,
                )
            })?;
        prepared.plan.credentials = credentials;
        self.sandbox(request, &mut prepared)?;
        limit_plan(&self.daemon, grant, peer, &mut prepared.plan);
        Ok(prepared)
    }

    /// Resolves the request's sandbox under the profile the policy
    /// imposes on this peer into the plan.
    fn sandbox(
        &self,
        request: &SpawnRequest,
        prepared: &mut plan::Prepared,
    ) -> Result<(), SpawnFailed> {
        let imposed = self.connection.grant.sandbox_profile();
        match self
            .daemon
            .sandboxes
            .resolve(request.sandbox.as_ref(), imposed)
        {
            Ok(Some((plan, applied))) => {
                prepared.plan.sandbox = Some(plan);
                prepared.sandbox = Some(applied);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(refusal) => {
                let metrics = &self.daemon.metrics;
                let stage = if refusal.invalid {
                    SpawnStage::Validate
                } else {
                    spawn::SANDBOX_STAGE
                };
                metrics.sandbox_failed(stage.name(), "request");
                metrics.sandboxed_spawn(SpawnResult::Refused);
                Err(refused(request.id, stage, refusal.errno, refusal.message))
            }
        }
    }

    /// The child's own cgroup, made and named in `plan`, when the daemon
    /// has a subtree.
    fn place_in_cgroup(
        &self,
        id: u64,
        spec: Option<&zygote_proto::CgroupSpec>,
        plan: &mut spawn::SpawnPlan,
    ) -> Result<Option<Arc<ChildCgroup>>, SpawnFailed> {
        match (&self.daemon.cgroups, spec) {
            (Some(subtree), spec) => {
                let (cgroup, dir) = subtree
                    .create(self.connection.peer.uid, self.connection.grant.caps, spec)
                    .map_err(|(message, errno)| refused(id, SpawnStage::Cgroup, errno, message))?;
                plan.cgroup = Some(dir);
                Ok(Some(Arc::new(cgroup)))
            }
            (None, Some(_)) => {
                let message = format!(
                    "this zygote does not offer the feature cgroups: cgroup options requested, but {}",
                    self.daemon.no_cgroups
                );
                Err(refused(id, SpawnStage::Cgroup, libc::EOPNOTSUPP, message))
            }
            (None, None) => Ok(None),
        }
    }

    /// Starts the child and waits for its exec: its pid and watched
    /// pidfd, or `None` when it cannot be watched (logged).
    async fn launch(
        &self,
        id: u64,
        plan: spawn::SpawnPlan,
        cgroup: Option<&ChildCgroup>,
        cwd: Option<&[u8]>,
        program: &str,
    ) -> Result<Option<(i32, Arc<AsyncFd<OwnedFd>>)>, SpawnFailed> {
        // No child is left in a cgroup made for a spawn that failed.
        let remove_cgroup = || {
            if let Some(cgroup) = cgroup {
                let _ = cgroup.remove();
            }
        };
        let names = plan.sandbox.as_ref().map(sandbox::FailureNames::of);
        let metrics = &self.daemon.metrics;
        let failed = |error: spawn::SpawnError| {
            remove_cgroup();
            let reason = strerror(error.errno);
            if names.is_some() {
                metrics.sandboxed_spawn(SpawnResult::Failed);
            }
            if let (Some(names), Some(failure)) = (&names, error.sandbox) {
                metrics.sandbox_failed("sandbox", failure.step.name());
                let message = names.describe(failure, &reason);
                return refused(id, error.stage, error.errno, message);
            }
            let message = match (error.stage, cwd) {
                // The directory is what is missing, not the program.
                (SpawnStage::Chdir, Some(cwd)) => {
                    format!("chdir {}: {reason}", String::from_utf8_lossy(cwd))
                }
                _ => format!("{program}: {reason}"),
            };
            refused(id, error.stage, error.errno, message)
        };
        // A child that keeps the daemon's ids cannot be stopped by its
        // peer: vfork, the fastest. One that switches to the peer's ids
        // could be, between the switch and exec: see `start_switching`.
        // A sandboxed child resolves the peer's paths as the peer, which
        // can block: never on this thread, but on its uid's spawner
        // (root's for a root peer) or the fork path.
        let (pid, pidfd, status) = if plan.credentials.is_none() && plan.sandbox.is_none() {
            // The daemon's copies of the child's fds go with the plan.
            let child = self.daemon.spawn_plan(plan).await.map_err(failed)?;
            self.daemon.metrics.spawn_path(SpawnPath::Vfork);
            (child.pid, child.pidfd, None)
        } else {
            let mut plan = plan;
            // A sandbox with a pid namespace enters the init parked for
            // its plan, if there is one, and has the next one made.
            let parked = parked::enter(&self.daemon, &mut plan);
            // One without (a spawner vforks it) copies its mount template.
            let templated = match parked {
                None => parked::copy_template(&self.daemon, &mut plan),
                Some(_) => None,
            };
            let recipe = parked.as_ref().map(|(recipe, _)| recipe);
            let started = self
                .start_switching(plan, recipe.or(templated.as_ref()))
                .await;
            if let Some((recipe, taken)) = parked {
                let missed = taken.is_none();
                let behind = self.daemon.sandboxes.pool.behind(&recipe.key, missed);
                drop(taken);
                parked::refill(&self.daemon, &recipe, behind);
            }
            started.map_err(|error| match error {
                Switching::Spawn(error) => failed(error),
                Switching::Lost { errno, message } => {
                    remove_cgroup();
                    let message = format!("{program}: {message}");
                    refused(id, uid_spawners::LOST_STAGE, errno, message)
                }
                Switching::Cancelled => {
                    remove_cgroup();
                    killed_before_exec(id, program)
                }
            })?
        };
        let pidfd = match zygote_proto::register(pidfd, Interest::READABLE) {
            Ok(pidfd) => Arc::new(pidfd),
            Err(error) => {
                // Cannot happen short of epoll failing; the child is then
                // neither watched nor reported, so say so loudly.
                warn!(pid, %error, "failed to watch a child's pidfd; it will not be reaped");
                self.connection.lock().ids.remove(&id);
                return Ok(None);
            }
        };
        if let Some(status) = status {
            self.await_exec(status, &pidfd, pid)
                .await
                .map_err(|error| match error {
                    Some(error) => failed(error),
                    None => {
                        remove_cgroup();
                        killed_before_exec(id, program)
                    }
                })?;
        }
        Ok(Some((pid, pidfd)))
    }

    /// Starts a child that switches to another uid, which could stop it
    /// between the switch and exec, so that no daemon thread may wait for
    /// that exec: the spawner process of that uid vforks it (and only that
    /// spawner waits), or, where it cannot, a fork of the daemon whose exec
    /// this task awaits (only this spawn waits). Returns the child's pid,
    /// pidfd and, on the fork path, its status pipe.
    ///
    /// A plan entering a parked init or copying a mount template made for
    /// `recipe` whose spawner finds it unusable takes the fork path; every
    /// init and the template of that recipe then go (one bind source at
    /// least was replaced, or the process holding it ended).
    async fn start_switching(
        &self,
        plan: spawn::SpawnPlan,
        recipe: Option<&Recipe>,
    ) -> Result<(i32, OwnedFd, Option<OwnedFd>), Switching> {
        let daemon = &self.daemon;
        let answer = daemon
            .uid_spawners
            .ask(plan, &daemon.metrics, |plan| daemon.spawn(plan));
        let plan = match answer {
            Ok((answer, kept)) => {
                let outcome = tokio::select! {
                    outcome = answer => outcome.unwrap_or_else(|_| uid_spawners::Outcome::Lost {
                        errno: libc::EIO,
                        message: "the spawner process went away".to_owned(),
                    }),
                    // The spawner kills the child when it answers.
                    () = self.cancelled() => return Err(Switching::Cancelled),
                };
                match kept {
                    Some(plan) if outcome.is_made_ahead_unusable() => {
                        daemon.metrics.parked_init("unusable");
                        if let Some(recipe) = recipe {
                            daemon.sandboxes.pool.forget(&recipe.key);
                            daemon
                                .metrics
                                .set_parked_inits(daemon.sandboxes.pool.parked());
                        }
                        plan
                    }
                    kept => {
                        drop(kept);
                        return Self::switched(daemon, outcome).await;
                    }
                }
            }
            Err(plan) => plan,
        };
        let mut plan = plan;
        // The fork path makes the sandbox's namespaces and root itself
        // (only a spawner checks what was made ahead before using it).
        if let Some(sandbox) = plan.sandbox.as_mut() {
            sandbox.enter = None;
            sandbox.mount_template = None;
        }
        let started = daemon.start(&plan);
        drop(plan);
        let child = started.map_err(Switching::Spawn)?;
        daemon.metrics.spawn_path(SpawnPath::Fork);
        Ok((child.pid, child.pidfd, Some(child.status)))
    }

    /// What a spawner's `outcome` for a child means for its spawn.
    async fn switched(
        daemon: &Daemon,
        outcome: uid_spawners::Outcome,
    ) -> Result<(i32, OwnedFd, Option<OwnedFd>), Switching> {
        match outcome {
            uid_spawners::Outcome::Child {
                pid,
                pidfd,
                failure,
            } => {
                if let Some(error) = failure {
                    reap_failed(pid, pidfd).await;
                    return Err(Switching::Spawn(error));
                }
                daemon.metrics.spawn_path(SpawnPath::Spawner);
                Ok((pid, pidfd, None))
            }
            uid_spawners::Outcome::Refused(error) => Err(Switching::Spawn(error)),
            uid_spawners::Outcome::Lost { errno, message } => {
                Err(Switching::Lost { errno, message })
            }
            uid_spawners::Outcome::Parked(init) => {
                // Never asked for here: it goes.
                let _ = spawn::send_signal(init.pidfd.as_fd(), libc::SIGKILL);
                reap_failed(init.pid, init.pidfd).await;
                Err(Switching::Lost {
                    errno: libc::EPROTO,
                    message: "the spawner parked an init instead of starting the child".to_owned(),
                })
            }
        }
    }

    /// Tracks a started child on its connection; one started after its
    /// client left gets its kill-on-close signal at once.
    fn track(&self, id: u64, tracked: Tracked) {
        let mut state = self.connection.lock();
        // The client may have left while we spawned.
        if let (true, Some(on_close)) = (state.closed, tracked.on_close) {
            signal_on_close(&tracked, on_close, self.connection.peer.uid);
        }
        state.children.insert(id, tracked);
    }

    /// Queues `Spawned` with the pidfd and the client's ends of the pipes.
    fn send_spawned(
        &self,
        id: u64,
        pid: i32,
        pidfd: &Arc<AsyncFd<OwnedFd>>,
        client_ends: Vec<OwnedFd>,
    ) {
        debug_assert!(client_ends.len() < outbox::MAX_FDS_PER_REPLY);
        let mut fds = Vec::with_capacity(1 + client_ends.len());
        fds.push(ReplyFd::Pidfd(Arc::clone(pidfd)));
        fds.extend(client_ends.into_iter().map(ReplyFd::Owned));
        self.reply(
            ServerMessage::Spawned(Spawned {
                id,
                pid,
                sandbox: self.applied(),
            }),
            fds,
        );
    }

    /// What confines the child, for its `Spawned`.
    fn applied(&self) -> Option<sandbox::AppliedSandbox> {
        self.applied_sandbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Counts and logs a spawn whose child exec'd.
    fn spawned(&self, program: &str, pid: i32) {
        let peer = &self.connection.peer;
        let latency = self.received_at.elapsed();
        self.daemon
            .metrics
            .spawn_done(SpawnResult::Ok, latency, peer.uid);
        if self.template.is_some() {
            self.daemon.metrics.warm_spawn_done(latency);
        }
        debug!(
            peer_pid = peer.pid,
            peer_uid = peer.uid,
            peer_gid = peer.gid,
            program,
            pid,
            latency_us = latency.as_micros() as u64,
            "spawned"
        );
    }

    /// Waits for a started child's exit (timeouts, stops) and sends its
    /// exit notice; parks at each upgrade, so that the child's state can
    /// be carried over.
    async fn watch(&self, watched: Watched, slot: Option<admission::Slot>, active: &mut Active) {
        let Watched {
            id,
            pid,
            pidfd,
            cgroup,
            timer,
            report_stops,
            leads_own_group,
            exited,
            deferred,
        } = watched;
        let peer_uid = self.connection.peer.uid;
        let pending = AtomicBool::new(deferred.is_some());
        let exit = match (exited, pidfd) {
            (Some(exited), _) => Ok((exited.status, exited.usage, exited.timed_out)),
            (None, None) => Err(std::io::Error::from_raw_os_error(libc::ECHILD)),
            (None, Some(pidfd)) => loop {
                let pidfd_ref = &pidfd;
                let pending_ref = &pending;
                let due = async {
                    if let Some(at) = deferred.filter(|_| pending.load(Ordering::Relaxed)) {
                        tokio::time::sleep_until(at.into()).await;
                        self.send_deferred(&pending, id, pid, &pidfd);
                    }
                };
                let stops = async {
                    if !report_stops {
                        return std::future::pending().await;
                    }
                    reaper::follow_stops(pidfd.get_ref().as_fd(), |change| {
                        debug!(pid, ?change, "child stopped or continued");
                        let message = match change {
                            reaper::JobChange::Stopped(signal) => {
                                ServerMessage::Stopped(StopNotice { id, signal })
                            }
                            reaper::JobChange::Continued => {
                                ServerMessage::Continued(ContinueNotice { id })
                            }
                        };
                        async move {
                            // `Spawned` comes before any stop notice.
                            self.send_deferred(pending_ref, id, pid, pidfd_ref);
                            let hold = self.daemon.pause.hold();
                            self.connection.outbox.push_notice(message, hold).await;
                        }
                    })
                    .await;
                };
                // Polled in this order: once the child has exited, no stop
                // notice can follow its `Exited`.
                tokio::select! {
                    biased;
                    (exit, timed_out) = wait_with_timeout(&pidfd, pid, timer.as_deref(), leads_own_group, peer_uid, cgroup.as_deref()) => {
                        break exit.map(|(status, usage)| (status, usage, timed_out));
                    }
                    _ = async { tokio::join!(due, stops) } => unreachable!("following stops never ends"),
                    () = self.abandoned() => {
                        debug!(pid, "leaving a child to the system's reaper: the daemon is stopping and its client has left");
                        self.connection.lock().children.remove(&id);
                        return;
                    }
                    // Nothing was reaped or signalled since the last look:
                    // the saved state is exact. A deferred `Spawned` goes
                    // out first: the saved state has no room for it.
                    () = active.requested() => {
                        self.send_deferred(&pending, id, pid, &pidfd);
                        active.park().await;
                    }
                }
            },
        };
        if let Ok((status, usage, timed_out)) = &exit {
            // Reaped: kept in the table until reported, for an upgrade.
            if let Some(tracked) = self.connection.lock().children.get_mut(&id) {
                tracked.pidfd = None;
                tracked.exited = Some(SavedExit {
                    status: *status,
                    usage: *usage,
                    timed_out: *timed_out,
                });
            }
        }
        let tree = match &cgroup {
            Some(cgroup) => self.end_tree(cgroup, active).await,
            None => None,
        };
        self.connection.lock().children.remove(&id);
        let status = exit.as_ref().ok().map(|(status, _, _)| status);
        self.daemon.metrics.child_reaped(status);
        drop(slot);
        match exit {
            Ok((status, usage, timed_out)) => {
                debug!(pid, ?status, timed_out, "child exited");
                let notice = ExitNotice {
                    id,
                    status,
                    usage,
                    timed_out,
                    tree,
                    pid,
                };
                self.finish(id, ServerMessage::Exited(notice));
                if let Some(cgroup) = cgroup {
                    remove_when_empty(&self.daemon, cgroup);
                }
            }
            Err(error) => {
                warn!(pid, %error, "failed to reap a child");
                self.connection.lock().ids.remove(&id);
            }
        }
    }

    /// After the child's exit: ends the rest of a doomed tree, waits for
    /// the tree when asked to, and reads what it used.
    ///
    /// The accounting (a `cpu.stat` read, ~40 µs) only for a request that
    /// asked for cgroup features: the rest get placement alone.
    async fn end_tree(
        &self,
        cgroup: &ChildCgroup,
        active: &mut Active,
    ) -> Option<zygote_proto::TreeUsage> {
        let uid = self.connection.peer.uid;
        if cgroup.finish_doomed() {
            debug!(cgroup = %cgroup.path().display(), "tree kill after the child's end");
        }
        if cgroup.was_killed() {
            self.daemon.metrics.tree_killed(uid);
        }
        if cgroup.spec.wait_tree || cgroup.is_doomed() {
            // The exit is in the table: an upgrade carries it over.
            loop {
                tokio::select! {
                    () = cgroup.wait_empty() => break,
                    () = active.requested() => active.park().await,
                }
            }
        }
        if !cgroup.requested {
            return None;
        }
        let usage = cgroup.usage();
        if usage.oom_kills > 0 {
            self.daemon.metrics.oom_killed(uid);
        }
        Some(usage)
    }

    /// Waits for a child on the fork path to exec, without holding any
    /// thread: `Err(Some(_))` when it failed before exec, `Err(None)` when
    /// it was killed because its client left or the daemon is stopping.
    /// A failed child is reaped before this returns.
    async fn await_exec(
        &self,
        status: OwnedFd,
        pidfd: &AsyncFd<OwnedFd>,
        pid: i32,
    ) -> Result<(), Option<spawn::SpawnError>> {
        let kill = || {
            let _ = spawn::send_signal(pidfd.get_ref().as_fd(), libc::SIGKILL);
        };
        let outcome = match zygote_proto::register(status, Interest::READABLE) {
            Ok(status) => tokio::select! {
                report = read_exec_report(&status) => report.map_err(|error| {
                    warn!(pid, %error, "failed to read a child's status pipe; killing it");
                    kill();
                    Some(spawn::SpawnError::new(SpawnStage::Pipe, error.raw_os_error().unwrap_or(libc::EIO)))
                }),
                () = self.cancelled() => {
                    debug!(pid, "killing a child that has not exec'd: its spawn was cancelled");
                    kill();
                    Err(None)
                }
            },
            Err(error) => {
                kill();
                Err(Some(spawn::SpawnError::new(
                    SpawnStage::Pipe,
                    error.raw_os_error().unwrap_or(libc::EIO),
                )))
            }
        };
        let error = match outcome {
            Ok(spawn::ExecReport::Execd) => return Ok(()),
            Ok(spawn::ExecReport::Failed(error)) => Some(error),
            Err(error) => error,
        };
        // The child is exiting; its peer could still stop it on the way.
        let reaped = tokio::select! {
            reaped = reaper::wait_exit(pidfd) => reaped,
            () = self.cancelled() => {
                kill();
                reaper::wait_exit(pidfd).await
            }
        };
        if let Err(reap) = reaped {
            warn!(pid, error = %reap, "failed to reap a child that failed before exec");
        }
        Err(error)
    }

    /// Resolves when a child that has not exec'd yet is no longer wanted:
    /// its client left, or the daemon has been stopping for
    /// [`EXEC_GRACE_ON_STOP`].
    pub(crate) async fn cancelled(&self) {
        let mut left = self.connection.left.subscribe();
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            _ = left.wait_for(|left| *left) => {}
            () = async {
                shutdown.stopping().await;
                tokio::time::sleep(EXEC_GRACE_ON_STOP).await;
            } => {}
        }
    }

    /// Resolves when nobody will ever want this child's exit: the daemon
    /// is stopping and the child's client has gone.
    async fn abandoned(&self) {
        let mut shutdown = self.shutdown.clone();
        let mut left = self.connection.left.subscribe();
        shutdown.stopping().await;
        let _ = left.wait_for(|left| *left).await;
    }

    /// Frees the id, then queues the spawn's last reply: a client that
    /// reuses the id as soon as it sees the reply is not refused.
    fn finish(&self, id: u64, message: ServerMessage) {
        self.connection.lock().ids.remove(&id);
        self.reply(message, Vec::new());
    }

    /// Queues a reply; the spawn is answered.
    fn reply(&self, message: ServerMessage, fds: Vec<ReplyFd>) {
        self.connection
            .outbox
            .push(message, fds, self.daemon.pause.hold());
        // Answered: the connection may read another request.
        self.release_answer_slot();
    }

    /// Queues the `Spawned` of a deferred spawn, unless it was queued
    /// already or the spawn was not deferred.
    fn send_deferred(
        &self,
        pending: &AtomicBool,
        id: u64,
        pid: i32,
        pidfd: &Arc<AsyncFd<OwnedFd>>,
    ) {
        if pending.swap(false, Ordering::Relaxed) {
            debug!(pid, "child still running: sending its deferred Spawned");
            let fds = vec![ReplyFd::Pidfd(Arc::clone(pidfd))];
            self.reply(
                ServerMessage::Spawned(Spawned {
                    id,
                    pid,
                    sandbox: self.applied(),
                }),
                fds,
            );
        }
    }

    fn release_answer_slot(&self) {
        self.answer_slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

/// A child's timeout, running from now.
fn start_timer(timeout: zygote_proto::Timeout) -> Arc<Mutex<Timer>> {
    Arc::new(Mutex::new(Timer {
        term_at: Instant::now() + Duration::from_millis(timeout.millis),
        grace: Duration::from_millis(timeout.grace_millis),
        kill_at: None,
    }))
}

/// Applies the peer's floor and the resource limits its request leaves
/// unset to `plan` (whose rlimits are the request's).
pub(crate) fn limit_plan(daemon: &Daemon, grant: &Grant, peer: &Peer, plan: &mut spawn::SpawnPlan) {
    plan::apply_peer_floor(plan, peer);
    let clamped = grant.clamp_unset_rlimits(peer, &plan.rlimits, &daemon.own_limits);
    plan.rlimits.extend(clamped);
    if let Some(nofile) = daemon.child_nofile {
        if !plan
            .rlimits
            .iter()
            .any(|limit| limit.resource == nofile.resource)
        {
            plan.rlimits.push(nofile);
        }
    }
}

/// Why a child that switches uid did not start.
enum Switching {
    /// It failed at this step (a failed child has been reaped).
    Spawn(spawn::SpawnError),
    /// Its spawner could not answer: errno and why.
    Lost { errno: i32, message: String },
    /// Its client left, or the daemon is stopping, before it exec'd.
    Cancelled,
}

/// Reaps a spawner's child that failed before exec (already exiting).
/// Such a child is not listed as the daemon's own, so the orphan reaper
/// may take it first: nothing is lost then.
async fn reap_failed(pid: i32, pidfd: OwnedFd) {
    let reaped = match zygote_proto::register(pidfd, Interest::READABLE) {
        Ok(pidfd) => reaper::wait_exit(&pidfd).await.map(|_| ()),
        Err(error) => Err(error),
    };
    if let Err(error) = reaped {
        debug!(pid, %error, "a child that failed before exec was reaped elsewhere");
    }
}

/// The refusal of a spawn whose child was killed before exec.
fn killed_before_exec(id: u64, program: &str) -> SpawnFailed {
    refused(
        id,
        SpawnStage::Exec,
        libc::ECANCELED,
        format!(
            "{program}: killed before exec: its client left, or the zygote is stopping (the \
             child was stopped or stuck before exec)"
        ),
    )
}

/// A refusal of spawn `id`.
fn refused(id: u64, stage: SpawnStage, errno: i32, message: String) -> SpawnFailed {
    SpawnFailed {
        id,
        stage,
        errno,
        message,
    }
}

/// How long a `defer_spawned` child must run before its `Spawned` is sent.
const DEFERRED_SPAWNED_AFTER: Duration = Duration::from_millis(10);

/// How long a stopping daemon lets a spawn in flight reach exec before it
/// kills the child: a child its peer stopped must not hold the stop up.
const EXEC_GRACE_ON_STOP: Duration = Duration::from_secs(2);

/// Reads a started child's status pipe until it says how the start ended.
pub(crate) async fn read_exec_report(
    status: &AsyncFd<OwnedFd>,
) -> std::io::Result<spawn::ExecReport> {
    loop {
        let mut guard = status.readable().await?;
        match spawn::read_exec_report(status.get_ref().as_fd()) {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => guard.clear_ready(),
            result => return result,
        }
    }
}

/// Waits for the child's exit; past the timeout sends SIGTERM, and past
/// the grace period SIGKILL. Returns whether the timeout fired.
///
/// A child leading its own process group gets the signals as a group, as
/// coreutils `timeout` does, so that what it started ends with it (see
/// [`signal_child`]); the child itself always gets them.
async fn wait_with_timeout(
    pidfd: &AsyncFd<OwnedFd>,
    pid: i32,
    timer: Option<&Mutex<Timer>>,
    leads_own_group: bool,
    peer_uid: u32,
    cgroup: Option<&ChildCgroup>,
) -> (
    std::io::Result<(zygote_proto::ExitStatus, zygote_proto::ResourceUsage)>,
    bool,
) {
    let Some(timer) = timer else {
        return (reaper::wait_exit(pidfd).await, false);
    };
    let signal = |signal| {
        if cgroup.is_some_and(|cgroup| cgroup.doom(signal)) {
            return Ok(());
        }
        signal_child(
            pidfd.get_ref().as_fd(),
            pid,
            leads_own_group,
            signal,
            peer_uid,
        )
    };
    // Absolute deadlines, in the shared timer: a wait resumed after an
    // upgrade (or a parked one) keeps them, and never sends SIGTERM twice.
    let current = *timer.lock().expect("timer poisoned");
    let kill_at = match current.kill_at {
        Some(kill_at) => kill_at,
        None => {
            let expire = tokio::time::sleep_until(current.term_at.into());
            tokio::select! {
                exit = reaper::wait_exit(pidfd) => return (exit, false),
                () = expire => {}
            }
            let kill_at = Instant::now() + current.grace;
            timer.lock().expect("timer poisoned").kill_at = Some(kill_at);
            debug!(pid, group = leads_own_group, "timeout: SIGTERM");
            let _ = signal(libc::SIGTERM);
            kill_at
        }
    };
    let grace = tokio::time::sleep_until(kill_at.into());
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

/// Removes a child's cgroup once nothing is left in it: at once for a tree
/// that ended with its child, later for one whose grandchildren live on.
pub(crate) fn remove_when_empty(daemon: &Arc<Daemon>, cgroup: Arc<ChildCgroup>) {
    let Some(subtree) = &daemon.cgroups else {
        return;
    };
    if !cgroup.populated() {
        if let Err(error) = subtree.release(&cgroup) {
            warn!(cgroup = %cgroup.path().display(), %error, "cannot remove a child's cgroup");
        }
        return;
    }
    debug!(cgroup = %cgroup.path().display(), "the child's tree outlives it; removing its cgroup later");
    {
        let mut lingering = daemon
            .lingering_cgroups
            .lock()
            .expect("lingering cgroups poisoned");
        lingering.retain(|weak| weak.strong_count() > 0);
        lingering.push(Arc::downgrade(&cgroup));
    }
    let daemon = Arc::clone(daemon);
    tokio::spawn(async move {
        cgroup.wait_empty().await;
        let released = daemon
            .cgroups
            .as_ref()
            .map(|subtree| subtree.release(&cgroup));
        if let Some(Err(error)) = released {
            warn!(cgroup = %cgroup.path().display(), %error, "cannot remove a child's cgroup");
        }
    });
}

/// A started child, as its watcher needs it.
struct Watched {
    id: u64,
    pid: i32,
    pidfd: Option<Arc<AsyncFd<OwnedFd>>>,
    cgroup: Option<Arc<ChildCgroup>>,
    timer: Option<Arc<Mutex<Timer>>>,
    report_stops: bool,
    leads_own_group: bool,
    exited: Option<SavedExit>,
    /// When to send a deferred `Spawned`, if the child still runs.
    deferred: Option<Instant>,
}

/// Takes over a child an earlier image of this daemon started: tracks it
/// on `connection` and watches it to its exit notice, as the task that
/// started it would have. The fds named in `saved` must be this process's
/// own and open.
pub fn resume(
    connection: &Arc<Connection>,
    daemon: &Arc<Daemon>,
    shutdown: Shutdown,
    saved: SavedChild,
    active: Active,
) {
    let peer_uid = connection.peer.uid;
    let pidfd = saved.pidfd.and_then(|fd| {
        let fd = spawn::adopt_fd(fd).and_then(|fd| zygote_proto::register(fd, Interest::READABLE));
        match fd {
            Ok(fd) => Some(Arc::new(fd)),
            Err(error) => {
                warn!(pid = saved.pid, %error, "cannot take over a child's pidfd; it will not be reported");
                None
            }
        }
    });
    if saved.exited.is_none() && pidfd.is_none() {
        return;
    }
    spawn::adopt_own(saved.pid);
    let cgroup = saved
        .cgroup
        .map(|cgroup| Arc::new(ChildCgroup::restore(cgroup)));
    let timer = saved
        .timer
        .map(|timer| Arc::new(Mutex::new(Timer::restore(timer))));
    let on_close = saved.on_close.map(|(signal, own)| OnClose {
        signal,
        group: own.then_some(Group::Own),
    });
    let tracked = Tracked {
        pidfd: pidfd.clone(),
        pid: saved.pid,
        on_close,
        cgroup: cgroup.clone(),
        report_stops: saved.report_stops,
        leads_own_group: saved.leads_own_group,
        timer: timer.clone(),
        exited: saved.exited.clone(),
    };
    connection.lock().children.insert(saved.id, tracked);
    let slot = admission::reserve(daemon, peer_uid, usize::MAX).ok();
    let Ok(permit) = Arc::clone(&connection.in_flight).try_acquire_owned() else {
        warn!(
            pid = saved.pid,
            "no room to take over a child; it will not be reported"
        );
        return;
    };
    daemon.metrics.child_started();
    let task = SpawnTask {
        connection: Arc::clone(connection),
        daemon: Arc::clone(daemon),
        shutdown,
        received_at: Instant::now(),
        _permit: permit,
        answer_slot: Mutex::new(None),
        applied_sandbox: Mutex::new(None),
        template: None,
    };
    let watched = Watched {
        id: saved.id,
        pid: saved.pid,
        pidfd,
        cgroup,
        timer,
        report_stops: saved.report_stops,
        leads_own_group: saved.leads_own_group,
        exited: saved.exited,
        deferred: None,
    };
    tokio::spawn(async move {
        let mut active = active;
        task.watch(watched, slot, &mut active).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future an async fn of four arguments returns,
    /// without calling it.
    fn future_size<A, B, C, D, F: Future>(_: impl FnOnce(A, B, C, D) -> F) -> usize {
        size_of::<F>()
    }

    fn future_size5<A, B, C, D, E, F: Future>(_: impl FnOnce(A, B, C, D, E) -> F) -> usize {
        size_of::<F>()
    }

    /// A measurement, not a check: the sizes of a spawn task's futures,
    /// which tokio copies when they are not boxed. `cargo test -p zygote-server
    /// --release --lib print_future_sizes -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement: prints sizes"]
    fn print_future_sizes() {
        eprintln!(
            "run {} start {} watch {} SpawnRequest {}",
            future_size(SpawnTask::run),
            future_size5(SpawnTask::start),
            future_size(SpawnTask::watch),
            size_of::<SpawnRequest>(),
        );
    }
}
