//! Per-uid spawner processes: the fast path for children that switch to
//! another uid.
//!
//! A child that switches to a peer's uid can be stopped by that peer
//! between the switch and its exec. Cloned with vfork by a daemon thread,
//! it would hold that thread for as long as the peer likes. So each such
//! uid gets a spawner: a small root process (this binary, exec'd as
//! `zygote uid-spawner`, so that it holds nothing of the daemon's) that
//! vforks that uid's children as the daemon's siblings
//! (`clone3(CLONE_PARENT)`, see [`spawn::SiblingChild`]) and passes each
//! pidfd back. The children are the daemon's: it reaps, tracks and
//! reports them like any other. A stopped child stalls only its uid's
//! spawner, which no daemon thread waits for: each spawn's task awaits
//! its answer.
//!
//! Bounds:
//! - at most [`MAX_SPAWNERS`] run; a uid beyond them takes the fork path;
//! - one idle for [`IDLE_EXIT`] is stopped (its socket closed);
//! - an answer not there after [`ANSWER_DEADLINE`] fails its spawn, and
//!   the child the spawner waits for is killed, which frees the spawner;
//! - while the oldest question has waited [`STALLED_AFTER`], that uid's
//!   next spawns take the fork path instead of queueing behind it (asks
//!   for parked inits, bounded by the pool, wait their turn);
//! - a spawner holds only its socket, and a plan's fds while it starts
//!   that plan's child;
//! - one that exits unasked is logged (INFO) and counted; its spawns in
//!   flight fail with a message saying so, and the uid's next spawn starts
//!   a new one (after [`RESTARTS_BEFORE_PAUSE`] failures, not before
//!   [`RESTART_PAUSE`] has passed: the fork path meanwhile);
//! - when one cannot even start, every such child takes the fork path
//!   for [`RESTART_PAUSE`].
//!
//! A sandboxed child whose only confinement needing a syscall of its own
//! is one named seccomp profile (Landlock and capabilities aside: no
//! namespace, no mount) goes to a spawner of its uid that installed that
//! profile on itself at start: the child inherits the filter at clone,
//! where installing it costs each child the kernel's preparation of the
//! filter's action cache (an emulation of the whole filter for every
//! syscall number: ~0.6 ms for `default` on a 2-CPU VM). Nothing the
//! child does before exec is one of the calls the profiles deny.
//!
//! Parked sandbox inits and mount templates are made by a spawner of
//! their uid that does nothing else (`--parks`, see
//! [`process::serve`]): a spawn never queues behind one being made.
//!
//! Here: the registry and the question; `watch`: the task that reads one
//! spawner's answers; `wire`: the plan and answer on the socket;
//! [`process`]: the spawner process's own loop.

pub mod process;
mod watch;
mod wire;

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, oneshot};
use tracing::info;
use zygote_proto::{AsyncSeqpacket, Env, SpawnStage, SpawnerInfo};

use crate::service::metrics::Metrics;
use crate::spawn::{self, ExpectedSibling, SpawnError, SpawnPlan, SpawnedChild};
use watch::Watched;
use wire::Ask;

/// Spawner processes at once.
pub const MAX_SPAWNERS: usize = 64;

/// How long a spawner may take to answer before its spawn fails.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(30);

/// How long the oldest question may wait before the uid's next spawns
/// take the fork path.
pub const STALLED_AFTER: Duration = Duration::from_millis(250);

/// How long a spawner with nothing to do lives on.
pub const IDLE_EXIT: Duration = Duration::from_secs(60);

/// A uid whose spawner failed this many times (since the daemon started)
/// is not given a new one until [`RESTART_PAUSE`] after the last failure.
pub const RESTARTS_BEFORE_PAUSE: u64 = 3;

/// See [`RESTARTS_BEFORE_PAUSE`].
pub const RESTART_PAUSE: Duration = Duration::from_secs(60);

/// `ZYGOTE_UID_SPAWNERS=0` in the daemon's environment: no spawners;
/// children that switch uid take the fork path.
pub const DISABLE_ENV: &str = "ZYGOTE_UID_SPAWNERS";

/// What a spawn gets from a spawner.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The child exec'd (`failure` is `None`) or failed before exec and
    /// is exiting: reap it.
    Child {
        pid: i32,
        pidfd: OwnedFd,
        failure: Option<SpawnError>,
    },
    /// No child was created.
    Refused(SpawnError),
    /// The spawner could not answer: an errno, and why, for the client.
    Lost { errno: i32, message: String },
    /// A parked init exists, listed as the daemon's own child.
    Parked(spawn::ParkedInit),
}

impl Outcome {
    /// Whether the spawner could not use the parked init or mount template
    /// the plan named, and started nothing: its process had ended
    /// (`ESRCH`), or a bind source names another file than the one it
    /// bound (`ESTALE`). The plan can still make its own namespaces and
    /// root.
    pub(crate) fn is_made_ahead_unusable(&self) -> bool {
        matches!(
            self,
            Self::Refused(error) if error.stage == zygote_proto::SpawnStage::Clone
                && matches!(error.errno, libc::ESRCH | libc::ESTALE)
        )
    }
}

/// The answer a spawn awaits.
///
/// Dropped unread, it kills and reaps the child or parked init it may
/// already hold: its spawn was cancelled (the client left, a deadline)
/// just as the answer came. That child is listed as the daemon's own, so
/// the orphan reaper leaves it alone, and it would stay a zombie.
pub(crate) struct PendingAnswer(oneshot::Receiver<Outcome>);

impl Future for PendingAnswer {
    type Output = Result<Outcome, oneshot::error::RecvError>;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(context)
    }
}

impl Drop for PendingAnswer {
    fn drop(&mut self) {
        // Closed first: an answer not sent yet then stays with the
        // spawner's watch, which disposes of it the same way.
        self.0.close();
        if let Ok(outcome) = self.0.try_recv() {
            watch::discard(outcome);
        }
    }
}

/// A question in flight.
struct Question {
    asked: Instant,
    answer: oneshot::Sender<Outcome>,
    /// Its child was killed for the deadline: the answer is a failure.
    killed: bool,
    /// Its child, once it has waited [`STALLED_AFTER`] for its exec: killed
    /// should the spawner die meanwhile (it is then nobody's).
    stalled: Vec<OwnedFd>,
    /// Keeps the orphan reaper off the child until it is listed.
    _expected: ExpectedSibling,
}

/// A spawner's uid, the seccomp profile it holds, if any, the
/// fingerprint of the policy profile's Landlock rules it holds, if any,
/// and what it does.
type Key = (u32, Option<&'static str>, Option<u64>, Work);

/// What a spawner process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Work {
    /// Starts its uid's children.
    Children,
    /// Makes parked inits and mount templates, in the background (see
    /// `process::serve`): never on a spawn's path, and never in the way
    /// of one.
    Parks,
}

/// One uid's spawner process.
struct UidSpawner {
    uid: u32,
    /// The seccomp profile installed on the spawner, inherited by its
    /// children.
    seccomp: Option<&'static str>,
    /// The fingerprint of the Landlock rules the spawner holds, inherited
    /// by its children.
    landlock: Option<u64>,
    work: Work,
    pid: i32,
    socket: AsyncSeqpacket,
    questions: Mutex<Questions>,
    /// Wakes the reader when a question arrives at an empty queue.
    asked: Notify,
    spawns: AtomicU64,
    restarts: u64,
}

struct Questions {
    queue: VecDeque<Question>,
    last_answer: Instant,
    /// Out of the registry: no question may be added.
    retired: bool,
}

#[derive(Default)]
struct Registry {
    running: HashMap<Key, Arc<UidSpawner>>,
    /// Crashes per uid, carried to its next spawner's `restarts`, and
    /// when the last one was.
    crashes: HashMap<u32, (u64, Instant)>,
    /// When a spawner last could not even start (the binary gone, fds
    /// exhausted): every such child takes the fork path for
    /// [`RESTART_PAUSE`] after (logged once per pause).
    failed_start: Option<Instant>,
}

/// The daemon's spawner processes.
pub struct UidSpawners {
    enabled: bool,
    registry: Arc<Mutex<Registry>>,
}

impl std::fmt::Debug for UidSpawners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UidSpawners")
            .field("enabled", &self.enabled)
            .field("running", &self.lock().running.len())
            .finish()
    }
}

impl UidSpawners {
    /// Spawners for a daemon running as `euid`: only root switches uids;
    /// off with [`DISABLE_ENV`]`=0`, where `clone3` is not ours
    /// (x86_64 only), or where `fs.suid_dumpable` is 1 (a peer could then
    /// trace its child before exec, and with it the spawner's memory).
    pub fn new(euid: u32) -> Self {
        let wanted = std::env::var_os(DISABLE_ENV).is_none_or(|value| value != "0");
        let dumpable = std::fs::read_to_string("/proc/sys/fs/suid_dumpable")
            .is_ok_and(|value| value.trim() == "1");
        Self {
            enabled: euid == 0 && wanted && !dumpable && cfg!(target_arch = "x86_64"),
            registry: Arc::default(),
        }
    }

    /// Whether spawner processes run at all: without them no child can
    /// enter a parked init.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The spawners running now, by uid: every one when `all`, else only
    /// that of `uid` (`zygote status` shows a peer its own).
    pub fn infos(&self, all: bool, uid: u32) -> Vec<SpawnerInfo> {
        let registry = self.lock();
        let mut infos: Vec<SpawnerInfo> = registry
            .running
            .values()
            .filter(|spawner| all || spawner.uid == uid)
            .map(|spawner| SpawnerInfo {
                uid: spawner.uid,
                pid: spawner.pid,
                spawns: spawner.spawns.load(Ordering::Relaxed),
                restarts: spawner.restarts,
            })
            .collect();
        infos.sort_unstable_by_key(|info| info.uid);
        infos
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops every spawner (the daemon is stopping): each exits at the end
    /// of its socket; a child one waits for before exec is killed, so that
    /// none outlives the daemon stopped.
    pub fn stop_all(&self) {
        let running: Vec<Arc<UidSpawner>> = self.lock().running.values().cloned().collect();
        for spawner in running {
            spawner.lock().retired = true;
            let _ = rustix::net::shutdown(spawner.socket.as_fd(), rustix::net::Shutdown::Both);
            spawn::kill_pre_exec_children(spawner.pid);
        }
    }

    /// Asks the spawner of the plan's uid for its child, starting the
    /// spawner with `start` when there is none. The plan (with the
    /// daemon's copies of its fds) is dropped once sent, unless it enters
    /// a parked init or copies a mount template: then it comes back beside
    /// the answer, for the fork path should the spawner find that gone or
    /// its binds replaced ([`Outcome::is_made_ahead_unusable`]).
    ///
    /// # Errors
    ///
    /// The plan back, for the fork path: spawners are off, at their cap,
    /// or this uid's is stalled or cannot take it (too large, start failed).
    pub(crate) fn ask(
        &self,
        plan: SpawnPlan,
        metrics: &Metrics,
        start: impl FnOnce(&SpawnPlan) -> Result<SpawnedChild, SpawnError>,
    ) -> Result<(PendingAnswer, Option<Box<SpawnPlan>>), Box<SpawnPlan>> {
        self.ask_for(plan, metrics, start, Ask::Child)
    }

    /// As [`Self::ask`], for a parked init of the plan's sandbox
    /// ([`Outcome::Parked`]), or a mount template's holder: the uid's
    /// spawner of parks makes it, sharing its memory, which costs far
    /// less than a fork of the daemon. In the background (`SCHED_IDLE`)
    /// unless `behind`: a spawn found none ready, so the pool does not
    /// keep up with the spawns on CPU time nobody else wants (a busy
    /// machine), and this one is made at the spawners' usual priority.
    ///
    /// # Errors
    ///
    /// As [`Self::ask`].
    pub(crate) fn park(
        &self,
        plan: SpawnPlan,
        metrics: &Metrics,
        start: impl FnOnce(&SpawnPlan) -> Result<SpawnedChild, SpawnError>,
        behind: bool,
    ) -> Result<PendingAnswer, Box<SpawnPlan>> {
        self.ask_for(plan, metrics, start, Ask::Park { behind })
            .map(|(answer, _)| answer)
    }

    fn ask_for(
        &self,
        plan: SpawnPlan,
        metrics: &Metrics,
        start: impl FnOnce(&SpawnPlan) -> Result<SpawnedChild, SpawnError>,
        what: Ask,
    ) -> Result<(PendingAnswer, Option<Box<SpawnPlan>>), Box<SpawnPlan>> {
        // A child that keeps the daemon's ids (a root peer's) comes here
        // only with a sandbox, which root's spawner sets up.
        let uid = match &plan.credentials {
            Some(credentials) if credentials.uid != 0 => credentials.uid,
            Some(_) => return Err(Box::new(plan)),
            None if plan.sandbox.is_some() => 0,
            None => return Err(Box::new(plan)),
        };
        if !self.enabled {
            return Err(Box::new(plan));
        }
        let key = match what {
            Ask::Child => (
                uid,
                inheritable_profile(&plan),
                held_landlock(&plan),
                Work::Children,
            ),
            Ask::Park { .. } => (uid, None, None, Work::Parks),
        };
        let (_, seccomp, landlock, _) = key;
        let Some(spawner) = self.spawner_for(key, metrics, start) else {
            return Err(Box::new(plan));
        };
        let Some((bytes, fds)) = wire::encode_plan(&plan, seccomp.is_some(), what) else {
            return Err(Box::new(plan));
        };
        let (answer, outcome) = oneshot::channel();
        {
            let mut questions = spawner.lock();
            // A park keeps no spawn waiting, and the pool bounds how many
            // are asked for: it queues behind a slow one (a busy machine)
            // instead of being dropped until the plan's next spawn.
            let stalled = matches!(what, Ask::Child)
                && questions
                    .queue
                    .front()
                    .is_some_and(|oldest| oldest.asked.elapsed() >= STALLED_AFTER);
            if questions.retired || stalled {
                drop(fds);
                return Err(Box::new(plan));
            }
            // Expected before the child can exist: before the plan is sent.
            // A parked init keeps the spawner's ids (root's).
            let expected = spawn::expect_sibling(match what {
                Ask::Park { .. } => 0,
                Ask::Child => uid,
            });
            // A full socket (a stalled spawner) takes the fork path too.
            if zygote_proto::send_frame(spawner.socket.as_fd(), &bytes, &fds).is_err() {
                drop(fds);
                return Err(Box::new(plan));
            }
            let was_empty = questions.queue.is_empty();
            questions.queue.push_back(Question {
                asked: Instant::now(),
                answer,
                killed: false,
                stalled: Vec::new(),
                _expected: expected,
            });
            if was_empty {
                spawner.asked.notify_one();
            }
        }
        let made_ahead = landlock.is_some()
            || plan
                .sandbox
                .as_ref()
                .is_some_and(|sandbox| sandbox.enter.is_some() || sandbox.mount_template.is_some());
        Ok((PendingAnswer(outcome), made_ahead.then(|| Box::new(plan))))
    }

    /// The running spawner of `uid`, or a new one; `None` at the cap or
    /// when one cannot start (logged).
    fn spawner_for(
        &self,
        key: Key,
        metrics: &Metrics,
        start: impl FnOnce(&SpawnPlan) -> Result<SpawnedChild, SpawnError>,
    ) -> Option<Arc<UidSpawner>> {
        let (uid, seccomp, landlock, work) = key;
        let mut registry = self.lock();
        if let Some(spawner) = registry.running.get(&key) {
            return Some(Arc::clone(spawner));
        }
        let start_failed = registry
            .failed_start
            .is_some_and(|at| at.elapsed() < RESTART_PAUSE);
        if start_failed || registry.running.len() >= MAX_SPAWNERS {
            return None;
        }
        // One that keeps failing is not restarted at every spawn (each
        // start and end is logged): its uid takes the fork path a while.
        let crashes = registry.crashes.get(&uid).copied();
        let restarts = crashes.map_or(0, |(count, _)| count);
        let paused = crashes.is_some_and(|(count, last)| {
            count >= RESTARTS_BEFORE_PAUSE && last.elapsed() < RESTART_PAUSE
        });
        if paused {
            return None;
        }
        let (spawner, pidfd) = match launch(key, start) {
            Ok(launched) => launched,
            Err(error) => {
                registry.failed_start = Some(Instant::now());
                info!(
                    uid,
                    %error,
                    pause_s = RESTART_PAUSE.as_secs(),
                    "failed to start a spawner process; children that switch uid take the fork \
                     path for a while"
                );
                return None;
            }
        };
        if restarts > 0 {
            metrics.uid_spawner_restarted();
        }
        let spawner = Arc::new(UidSpawner {
            restarts,
            ..spawner
        });
        registry.running.insert(key, Arc::clone(&spawner));
        metrics.set_uid_spawners(registry.running.len());
        info!(
            uid,
            pid = spawner.pid,
            restarts,
            seccomp = seccomp.unwrap_or("none"),
            holds_landlock = landlock.is_some(),
            parks = work == Work::Parks,
            "spawner process started"
        );
        let watched = Watched::new(
            Arc::clone(&spawner),
            pidfd,
            Arc::downgrade(&self.registry),
            metrics.clone(),
        );
        tokio::spawn(watched.serve());
        Some(spawner)
    }
}

impl UidSpawner {
    fn key(&self) -> Key {
        (self.uid, self.seccomp, self.landlock, self.work)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Questions> {
        self.questions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts the spawner process of `key` with `start`: its pidfd, watched.
fn launch(
    key: Key,
    start: impl FnOnce(&SpawnPlan) -> Result<SpawnedChild, SpawnError>,
) -> std::io::Result<(UidSpawner, AsyncFd<OwnedFd>)> {
    let (uid, seccomp, landlock, work) = key;
    let uid_text = uid.to_string();
    let mut argv = vec!["zygote-spawner", "uid-spawner", "--uid", &uid_text];
    if let Some(profile) = seccomp {
        argv.extend(["--seccomp", profile]);
    }
    if landlock.is_some() {
        argv.push("--hold-landlock");
    }
    if work == Work::Parks {
        argv.push("--parks");
    }
    let (ours, theirs) = zygote_proto::socket::pair(false).map_err(std::io::Error::other)?;
    let null = || std::fs::File::open("/dev/null").map(OwnedFd::from);
    let stderr = std::io::stderr().as_fd().try_clone_to_owned()?;
    let plan = SpawnPlan {
        // The running image, even if its file was replaced or removed.
        exec_candidates: vec![c"/proc/self/exe".to_owned()],
        argv: argv
            .into_iter()
            .map(|arg| std::ffi::CString::new(arg).map_err(std::io::Error::other))
            .collect::<Result<_, _>>()?,
        // Nothing of the daemon's, but its choice of scheduling policy.
        envp: {
            let mut env = Env::new();
            if let Some(value) = std::env::var_os(spawn::NO_BATCH_ENV) {
                env.push(spawn::NO_BATCH_ENV.as_bytes(), value.as_encoded_bytes());
            }
            env
        },
        cwd: None,
        fds: vec![
            (null()?, 0),
            (null()?, 1),
            (stderr, 2),
            (theirs, process::SOCKET_FD),
        ],
        new_session: false,
        controlling_terminal: false,
        process_group: None,
        umask: None,
        rlimits: Vec::new(),
        credentials: None,
        cgroup: None,
        ignored_signals: 0,
        nice: None,
        cpu_affinity: Vec::new(),
        oom_score_adj: None,
        sandbox: None,
    };
    let child = start(&plan).map_err(|error| std::io::Error::from_raw_os_error(error.errno))?;
    drop(plan);
    let pidfd = zygote_proto::register(child.pidfd, Interest::READABLE)?;
    let socket = AsyncSeqpacket::new(ours).map_err(std::io::Error::other)?;
    Ok((
        UidSpawner {
            uid,
            seccomp,
            landlock,
            work,
            pid: child.pid,
            socket,
            questions: Mutex::new(Questions {
                queue: VecDeque::new(),
                last_answer: Instant::now(),
                retired: false,
            }),
            asked: Notify::new(),
            spawns: AtomicU64::new(0),
            restarts: 0,
        },
        pidfd,
    ))
}

/// The seccomp profile a spawner of the plan's uid may hold for its
/// child: its sandbox's one seccomp program when that is a named profile
/// and the child needs no call a profile denies before exec (`setns`,
/// `mount`, `pivot_root`, `unshare`: no namespace, network or
/// filesystem of its own).
fn inheritable_profile(plan: &SpawnPlan) -> Option<&'static str> {
    let sandbox = plan.sandbox.as_ref()?;
    let [program] = sandbox.seccomp.as_slice() else {
        return None;
    };
    if needs_calls_profiles_deny(plan) {
        return None;
    }
    crate::daemon::sandbox::SECCOMP_PROFILES
        .into_iter()
        .find(|name| *name == program.name)
}

/// The fingerprint of the Landlock rules a spawner of the plan's uid may
/// hold for its child: those of its first ruleset when that is a policy
/// profile's, for a child a vfork sets up without namespaces of its own.
/// The domain confines the child from its clone, not from its last step:
/// so not for a child that mounts, nor one that writes its
/// `oom_score_adj` (a file the rules need not allow).
fn held_landlock(plan: &SpawnPlan) -> Option<u64> {
    let sandbox = plan.sandbox.as_ref()?;
    if needs_calls_profiles_deny(plan) || sandbox.enter.is_some() || plan.oom_score_adj.is_some() {
        return None;
    }
    sandbox.landlock.first()?.held
}

/// Whether the plan's child makes, before exec, a call that a seccomp
/// profile denies: it has namespaces, a network or a filesystem of its
/// own to set up.
fn needs_calls_profiles_deny(plan: &SpawnPlan) -> bool {
    plan.sandbox.as_ref().is_some_and(|sandbox| {
        sandbox.clone_flags != 0
            || sandbox.netns.is_some()
            || sandbox.filesystem.is_some()
            || sandbox.hostname.is_some()
            || sandbox.fresh_proc
            || sandbox.map_ids.is_some()
    })
}

/// The spawn stage a lost answer is reported at.
pub(crate) const LOST_STAGE: SpawnStage = SpawnStage::Clone;

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a refusal to enter an init that ended or whose binds went
    /// stale sends a spawn to the fork path: any other failure is the
    /// spawn's own.
    #[test]
    fn only_an_init_gone_or_stale_is_unusable() {
        let refused = |stage, errno| Outcome::Refused(SpawnError::new(stage, errno));
        assert!(refused(SpawnStage::Clone, libc::ESRCH).is_made_ahead_unusable());
        assert!(refused(SpawnStage::Clone, libc::ESTALE).is_made_ahead_unusable());
        assert!(!refused(SpawnStage::Clone, libc::EPERM).is_made_ahead_unusable());
        assert!(!refused(SpawnStage::Exec, libc::ESTALE).is_made_ahead_unusable());
        let lost = Outcome::Lost {
            errno: libc::ESRCH,
            message: String::new(),
        };
        assert!(!lost.is_made_ahead_unusable());
    }

    /// A spawn cancelled just as its answer came leaves the child in the
    /// answer, listed as the daemon's own: dropping the answer unread
    /// kills and reaps it, or it would stay a zombie nobody reaps.
    #[test]
    fn a_child_in_an_answer_dropped_unread_is_killed_and_reaped() {
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("start sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        let pidfd = spawn::open_pidfd(pid).expect("pidfd_open");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let proc_entry = std::path::PathBuf::from(format!("/proc/{pid}"));
        let reaped = runtime.block_on(async {
            let (sender, receiver) = oneshot::channel();
            sender
                .send(Outcome::Child {
                    pid,
                    pidfd,
                    failure: None,
                })
                .expect("send the answer");
            drop(PendingAnswer(receiver));
            let deadline = Instant::now() + Duration::from_secs(10);
            while proc_entry.exists() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            !proc_entry.exists()
        });
        assert!(reaped, "the child of an answer nobody read is still there");
        drop(child);
    }
}
