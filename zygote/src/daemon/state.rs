//! State shared by every connection of one daemon: who it is, its policy,
//! the child slots, the open connections and the metrics. It sits below
//! the modules that serve connections, which all read it; it knows none
//! of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use crate::daemon::cgroup::{ChildCgroup, Subtree};
use zygote_proto::ResourceLimit;

use crate::daemon::deferral::DeferralClock;
use crate::daemon::handover::{Pause, SavedConnection};
use crate::daemon::loglimit::LogLimit;
use crate::daemon::peer;
use crate::daemon::policy::Policy;
use crate::daemon::sandbox::Sandboxes;
use crate::daemon::spawners::SpawnerPool;
use crate::daemon::templates::Templates;
use crate::daemon::uid_spawners::UidSpawners;
use crate::service::metrics::Metrics;
use crate::spawn::{self, Credentials, SpawnError, SpawnPlan, SpawnedChild, Spawner, StartedChild};
use zygote_proto::{AsyncSeqpacket, Feature, PeerUse};

/// An open connection, as the daemon's shutdown sees it.
pub(crate) trait Closable: Send + Sync {
    /// Ends the connection as if its client had left (kill-on-close
    /// included).
    fn close(&self);

    /// Its state, for a live upgrade (the daemon is paused).
    fn save(&self) -> SavedConnection;
}

/// A request to upgrade in place, to the accept loop.
pub(crate) struct UpgradeAsk {
    /// The connection that asked (`zygote upgrade`), its socket and its
    /// request id; `None` for SIGHUP.
    pub from: Option<(Weak<dyn Closable>, Weak<AsyncSeqpacket>, u64)>,
}

/// The registry of open connections; weak, so that it never keeps one
/// open.
#[derive(Default)]
struct OpenConnections(Mutex<Vec<Weak<dyn Closable>>>);

impl std::fmt::Debug for OpenConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = self.0.lock().map_or(0, |list| list.len());
        write!(f, "OpenConnections({open})")
    }
}

/// Children running or being started (or connections open), per peer uid
/// and in total.
#[derive(Debug, Default)]
pub struct ChildCounts {
    pub(crate) total: usize,
    pub(crate) by_uid: HashMap<u32, usize>,
    /// Each counted uid's cap, as its latest reservation was allowed
    /// (for `zygote status`).
    pub(crate) caps: HashMap<u32, usize>,
}

impl ChildCounts {
    /// Counts one more for `uid`, whose cap is `cap`.
    pub(crate) fn add(&mut self, uid: u32, cap: usize) {
        *self.by_uid.entry(uid).or_insert(0) += 1;
        self.total += 1;
        // A restored connection is counted without a cap of its own.
        if cap != usize::MAX {
            self.caps.insert(uid, cap);
        }
    }

    /// Counts one less for `uid`.
    pub(crate) fn remove(&mut self, uid: u32) {
        self.total -= 1;
        if let Some(own) = self.by_uid.get_mut(&uid) {
            *own -= 1;
            if *own == 0 {
                self.by_uid.remove(&uid);
                self.caps.remove(&uid);
            }
        }
    }
}

/// State shared by every connection.
#[derive(Debug)]
pub struct Daemon {
    /// The daemon's effective uid.
    pub uid: u32,
    /// The daemon's own credentials, which children keep unless they
    /// switch.
    pub credentials: Credentials,
    /// Who may connect, and what each peer may ask for.
    pub policy: Policy,
    /// The policy's sandbox profiles and what sandboxes share.
    pub sandboxes: Sandboxes,
    /// Children running or being started, per peer uid and in total.
    pub(crate) child_counts: Mutex<ChildCounts>,
    /// Connections past their peer check, per peer uid and in total
    /// (see `admission`).
    pub(crate) connection_counts: Mutex<ChildCounts>,
    /// The daemon's own `(resource, soft, hard)` limits, which children
    /// inherit for resources a request leaves unset.
    pub(crate) own_limits: Vec<(u32, u64, u64)>,
    /// The fd limit a child gets when its request leaves it unset: the
    /// one the daemon started with, when the daemon raised its own.
    pub(crate) child_nofile: Option<ResourceLimit>,
    /// Whether the daemon's real uid and gid equal its effective ones, so
    /// that a child meant to run with [`Daemon::credentials`] already does.
    pub(crate) plain_ids: bool,
    /// The nice value, OOM score adjustment and CPU mask (words, trailing
    /// zeros trimmed) that children inherit, as read at start.
    own_attributes: OwnAttributes,
    /// Open connections, so that a shutdown closes them all the way a
    /// leaving client does (kill-on-close included).
    connections: OpenConnections,
    /// When the daemon started serving.
    pub started: Instant,
    /// Every counter, as Prometheus metrics; the `Status` reply reads them
    /// too, so the two never disagree.
    pub metrics: Metrics,
    /// The delegated cgroup subtree; children share the daemon's cgroup
    /// when absent.
    pub cgroups: Option<Subtree>,
    /// Why there is no subtree, for refusals of cgroup requests.
    pub(crate) no_cgroups: String,
    /// Features withheld although the daemon has them (see
    /// [`features`](crate::daemon::features)): neither announced nor served.
    pub masked_features: Vec<Feature>,
    /// Signal dispositions read at the first spawn (see [`Daemon::spawn`]),
    /// shared with the spawner threads.
    spawner: Arc<OnceLock<Option<Spawner>>>,
    /// The spawner threads of a shared daemon; `None` in a private one,
    /// which clones on its one thread.
    pool: Option<SpawnerPool>,
    /// Brings every task to a safe point for a live upgrade.
    pub(crate) pause: Pause,
    /// Cgroups of reaped children whose tree lives on, removed once empty
    /// (an upgrade carries them over).
    pub(crate) lingering_cgroups: Mutex<Vec<Weak<ChildCgroup>>>,
    /// Sockets of connections parked before their handshake.
    pub(crate) parked_sockets: Mutex<Vec<Weak<AsyncSeqpacket>>>,
    /// Where `Upgrade` requests go; `None` where upgrades are not served
    /// (private zygotes, or before serving).
    pub(crate) upgrades: Mutex<Option<tokio::sync::mpsc::Sender<UpgradeAsk>>>,
    /// Deadlines of deferred `Spawned` replies.
    pub(crate) deferrals: Arc<DeferralClock>,
    /// How many lines each peer uid may still make the daemon log.
    pub(crate) log_limit: LogLimit,
    /// Spawns of each peer uid between admission and exec.
    launches: Mutex<HashMap<u32, Arc<tokio::sync::Semaphore>>>,
    /// The per-uid spawner processes, which start the children that
    /// switch to another uid.
    pub(crate) uid_spawners: UidSpawners,
    /// The warm templates, by handle and by spec.
    pub(crate) templates: Templates,
}

impl Daemon {
    /// State for a daemon starting now, under the default policy.
    pub fn new() -> Self {
        Self::with_policy(Policy::default_for(rustix::process::geteuid().as_raw()))
    }

    /// State for a daemon starting now, under `policy`.
    pub fn with_policy(policy: Policy) -> Self {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let groups = rustix::process::getgroups()
            .map(|groups| groups.into_iter().map(|gid| gid.as_raw()).collect())
            .unwrap_or_default();
        Self {
            uid,
            credentials: Credentials { uid, gid, groups },
            sandboxes: Sandboxes::new(policy.sandbox_profiles(), uid, gid),
            policy,
            child_counts: Mutex::default(),
            connection_counts: Mutex::default(),
            connections: OpenConnections::default(),
            own_limits: peer::own_limits(),
            child_nofile: None,
            plain_ids: rustix::process::getuid() == rustix::process::geteuid()
                && rustix::process::getgid() == rustix::process::getegid(),
            own_attributes: OwnAttributes::read(),
            started: Instant::now(),
            metrics: Metrics::new(),
            cgroups: None,
            no_cgroups: "the daemon was started without a cgroup subtree".to_owned(),
            masked_features: crate::daemon::features::mask_from_env(),
            spawner: Arc::default(),
            pool: None,
            pause: Pause::default(),
            lingering_cgroups: Mutex::default(),
            parked_sockets: Mutex::default(),
            upgrades: Mutex::default(),
            deferrals: Arc::default(),
            log_limit: LogLimit::default(),
            launches: Mutex::default(),
            uid_spawners: UidSpawners::new(uid),
            templates: Templates::new(),
        }
    }
}

impl Daemon {
    /// Whether this daemon offers `feature`: it has it and does not
    /// withhold it.
    pub fn offers(&self, feature: Feature) -> bool {
        if self.masked_features.contains(&feature) {
            return false;
        }
        match feature {
            Feature::Cgroups => self.cgroups.is_some(),
            Feature::Pty | Feature::LargeArgs => true,
            Feature::Sandbox => crate::daemon::sandbox::enforceable(),
            // The runner clones through the syscall's number, which it
            // knows for these.
            Feature::Templates => cfg!(any(target_arch = "x86_64", target_arch = "aarch64")),
        }
    }

    /// The names of the features offered, as `HelloAck` lists them.
    pub fn offered_features(&self) -> Vec<String> {
        Feature::ALL
            .into_iter()
            .filter(|feature| self.offers(*feature))
            .map(|feature| feature.name().to_owned())
            .collect()
    }

    /// What the peers of each uid use, for a `Status` reply to a peer of
    /// `viewer`: every uid for root and the daemon's own uid, its own
    /// alone for any other, by uid. A cap not known from a reservation is
    /// the policy's default share.
    pub(crate) fn peer_use(&self, viewer: u32) -> Vec<PeerUse> {
        let sees_all = viewer == 0 || viewer == self.uid;
        let children = self.child_counts.lock().expect("child counts poisoned");
        let connections = self
            .connection_counts
            .lock()
            .expect("connection counts poisoned");
        let mut uids: Vec<u32> = if sees_all {
            children
                .by_uid
                .keys()
                .chain(connections.by_uid.keys())
                .copied()
                .collect()
        } else {
            vec![viewer]
        };
        uids.sort_unstable();
        uids.dedup();
        let limits = &self.policy.limits;
        uids.into_iter()
            .map(|uid| {
                let privileged = uid == 0 || uid == self.uid;
                let count = |counts: &ChildCounts| counts.by_uid.get(&uid).copied().unwrap_or(0);
                let children_limit = children.caps.get(&uid).copied();
                let connections_limit = connections.caps.get(&uid).copied();
                PeerUse {
                    uid,
                    connections: count(&connections) as u64,
                    children: count(&children) as u64,
                    children_limit: children_limit
                        .unwrap_or_else(|| limits.children_per_peer(privileged))
                        as u64,
                    connections_limit: connections_limit
                        .unwrap_or_else(|| limits.connections_per_peer(privileged))
                        as u64,
                    sandbox_profile: self.policy.imposed_profile_of_uid(uid),
                }
            })
            .collect()
    }

    /// Remembers an open connection; forgets closed ones on the way.
    pub(crate) fn register(&self, connection: &Arc<impl Closable + 'static>) {
        let mut connections = self.connections.0.lock().expect("connections poisoned");
        connections.retain(|weak| weak.strong_count() > 0);
        let connection: Arc<dyn Closable> = connection.clone();
        connections.push(Arc::downgrade(&connection));
    }

    /// Starts a child. The daemon's signal dispositions are read once, at
    /// the first spawn, when `serve` has long installed its handlers; its
    /// children then skip reading them from procfs.
    pub(crate) fn spawn(&self, plan: &SpawnPlan) -> Result<SpawnedChild, SpawnError> {
        // A private zygote's spawner outranks its children while several
        // run (a no-op elsewhere).
        spawn::set_busy(self.metrics.children_running() >= BUSY_CHILDREN);
        match self.spawner.get_or_init(Spawner::with_current_dispositions) {
            Some(spawner) => spawner.spawn(plan),
            None => spawn::spawn(plan),
        }
    }

    /// Clones on spawner threads while busy (see `spawners`): for the
    /// shared daemon, whose runtime workers must not wait in a clone.
    pub(crate) fn use_spawner_threads(&mut self) {
        self.pool = Some(SpawnerPool::new(Arc::clone(&self.spawner)));
    }

    /// Starts a child, and drops `plan` (with the daemon's copies of the
    /// child's fds) once the clone returned. While other children run, a
    /// shared daemon clones on a spawner thread, first come first served,
    /// and this task waits without holding its worker; otherwise, as
    /// [`Daemon::spawn`].
    pub(crate) async fn spawn_plan(&self, plan: SpawnPlan) -> Result<SpawnedChild, SpawnError> {
        if let Some(pool) = &self.pool {
            if self.metrics.children_running() >= BUSY_CHILDREN {
                return pool.spawn(plan).await;
            }
        }
        let child = self.spawn(&plan);
        drop(plan);
        child
    }

    /// Waits for a turn to start a child of a peer of `uid`: each uid has
    /// [`launches_per_uid`] at once, so that one peer's burst of spawns
    /// queues behind itself, not in front of every other peer's.
    pub(crate) async fn launch_turn(&self, uid: u32) -> tokio::sync::OwnedSemaphorePermit {
        let turns = {
            let mut launches = self.launches.lock().expect("launches poisoned");
            if launches.len() > 1024 {
                // Forget uids with no spawn under way.
                launches.retain(|_, turns| Arc::strong_count(turns) > 1);
            }
            Arc::clone(
                launches
                    .entry(uid)
                    .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(launches_per_uid()))),
            )
        };
        turns
            .acquire_owned()
            .await
            .expect("the launch semaphore is never closed")
    }

    /// Starts a child on the fork path, without waiting for its exec (see
    /// [`Spawner::start`]).
    pub(crate) fn start(&self, plan: &SpawnPlan) -> Result<StartedChild, SpawnError> {
        match self.spawner.get_or_init(Spawner::with_current_dispositions) {
            Some(spawner) => spawner.start(plan),
            None => spawn::start(plan),
        }
    }

    /// Removes from `plan` what the child inherits from the daemon anyway:
    /// a credential switch to the daemon's own ids, resource limits equal
    /// to the daemon's, and a nice value, OOM score adjustment or CPU mask
    /// equal to the daemon's (clients send their own with every request).
    /// Each of those syscalls runs in the child while the spawning thread
    /// waits (16 `setrlimit` cost ~30 µs, the switch ~20 µs, the
    /// `oom_score_adj` write ~10 µs). The daemon's values are the ones
    /// read at its start: it never changes them (a private zygote's raised
    /// spawner is reset in its children, see `spawn::prepare_boost`), but
    /// a change from outside would go unnoticed.
    pub(crate) fn drop_inherited_settings(&self, plan: &mut SpawnPlan) {
        if self.plain_ids && plan.credentials.as_ref() == Some(&self.credentials) {
            plan.credentials = None;
        }
        let own = &self.own_attributes;
        if plan.nice.is_some() && plan.nice == own.nice {
            plan.nice = None;
        }
        if plan.oom_score_adj.is_some() && plan.oom_score_adj == own.oom_score_adj {
            plan.oom_score_adj = None;
        }
        if !plan.cpu_affinity.is_empty()
            && own
                .cpu_affinity
                .as_deref()
                .is_some_and(|mask| trimmed(&plan.cpu_affinity) == mask)
        {
            plan.cpu_affinity = Vec::new();
        }
        plan.rlimits.retain(|limit| {
            !self
                .own_limits
                .contains(&(limit.resource, limit.soft, limit.hard))
        });
    }

    /// Every connection's state, with the connection (a live upgrade, the
    /// daemon paused).
    pub(crate) fn save_connections(&self) -> Vec<(Weak<dyn Closable>, SavedConnection)> {
        let connections = self.connections.0.lock().expect("connections poisoned");
        connections
            .iter()
            .filter_map(|weak| weak.upgrade().map(|open| (Weak::clone(weak), open.save())))
            .collect()
    }

    /// At shutdown: every connection ends as if its client had left, so
    /// kill-on-close children get their signal.
    pub(crate) fn close_all(&self) {
        let connections = std::mem::take(&mut *self.connections.0.lock().expect("poisoned"));
        for connection in connections.iter().filter_map(Weak::upgrade) {
            connection.close();
        }
        self.uid_spawners.stop_all();
        self.templates.stop_all();
    }
}

/// Spawns of one peer uid between admission and exec at once: two per CPU
/// the daemon may use, and two more, so that clones on every CPU and exec
/// waits overlap.
fn launches_per_uid() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get) * 2 + 2
}

/// Children running from which a private zygote's spawner is raised, and
/// a shared daemon clones on its spawner threads.
const BUSY_CHILDREN: u64 = 2;

/// What children inherit from the daemon unless told otherwise; `None`
/// where it could not be read (then nothing is dropped).
#[derive(Debug, Default)]
struct OwnAttributes {
    nice: Option<i32>,
    oom_score_adj: Option<i32>,
    cpu_affinity: Option<Vec<u64>>,
}

impl OwnAttributes {
    /// This thread's: the spawning threads start from it.
    fn read() -> Self {
        let cpu_affinity = rustix::thread::sched_getaffinity(None).ok().map(|set| {
            let mut words = Vec::new();
            for cpu in (0..rustix::thread::CpuSet::MAX_CPU).filter(|cpu| set.is_set(*cpu)) {
                if words.len() <= cpu / 64 {
                    words.resize(cpu / 64 + 1, 0u64);
                }
                words[cpu / 64] |= 1 << (cpu % 64);
            }
            words
        });
        Self {
            nice: rustix::process::getpriority_process(None).ok(),
            oom_score_adj: std::fs::read_to_string("/proc/self/oom_score_adj")
                .ok()
                .and_then(|text| text.trim().parse().ok()),
            cpu_affinity,
        }
    }
}

/// `mask` without its trailing zero words.
fn trimmed(mask: &[u64]) -> &[u64] {
    let end = mask
        .iter()
        .rposition(|word| *word != 0)
        .map_or(0, |last| last + 1);
    &mask[..end]
}

impl Default for Daemon {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_proto::ResourceLimit;

    fn plan(rlimits: Vec<ResourceLimit>, credentials: Option<Credentials>) -> SpawnPlan {
        SpawnPlan {
            exec_candidates: vec![c"/bin/true".to_owned()],
            argv: vec![c"true".to_owned()],
            envp: zygote_proto::Env::new(),
            cwd: None,
            fds: Vec::new(),
            new_session: false,
            controlling_terminal: false,
            process_group: None,
            umask: None,
            rlimits,
            credentials,
            cgroup: None,
            ignored_signals: 0,
            nice: None,
            cpu_affinity: Vec::new(),
            oom_score_adj: None,
            sandbox: None,
        }
    }

    #[test]
    fn settings_the_child_inherits_anyway_are_dropped() {
        let daemon = Daemon::new();
        let (resource, soft, hard) = daemon.own_limits[7];
        let same = ResourceLimit {
            resource,
            soft,
            hard,
        };
        let lower = ResourceLimit {
            resource,
            soft: soft.min(hard) / 2,
            hard,
        };
        let other = Credentials {
            uid: daemon.credentials.uid.wrapping_add(1),
            ..daemon.credentials.clone()
        };

        let mut kept = plan(vec![same, lower], Some(other.clone()));
        daemon.drop_inherited_settings(&mut kept);
        assert_eq!(kept.rlimits, vec![lower], "only the differing limit stays");
        assert_eq!(kept.credentials, Some(other), "a real switch stays");

        let own_attributes = &daemon.own_attributes;
        let mut own = plan(vec![same], Some(daemon.credentials.clone()));
        own.nice = own_attributes.nice;
        own.oom_score_adj = own_attributes.oom_score_adj;
        own.cpu_affinity = own_attributes.cpu_affinity.clone().unwrap();
        own.cpu_affinity.push(0);
        daemon.drop_inherited_settings(&mut own);
        assert!(own.rlimits.is_empty());
        assert_eq!(own.nice, None, "the daemon's nice value is inherited");
        assert_eq!(own.oom_score_adj, None, "so is its OOM score adjustment");
        assert!(own.cpu_affinity.is_empty(), "and its CPU mask");

        let mut other_attributes = plan(Vec::new(), None);
        other_attributes.nice = own_attributes.nice.map(|nice| nice + 1);
        other_attributes.oom_score_adj = own_attributes.oom_score_adj.map(|adj| adj + 1);
        other_attributes.cpu_affinity = vec![1];
        let expected_mask =
            (own_attributes.cpu_affinity.as_deref() != Some(&[1][..])).then(|| vec![1]);
        daemon.drop_inherited_settings(&mut other_attributes);
        assert_eq!(
            other_attributes.nice,
            own_attributes.nice.map(|nice| nice + 1)
        );
        assert_eq!(
            other_attributes.oom_score_adj,
            own_attributes.oom_score_adj.map(|adj| adj + 1)
        );
        assert_eq!(
            Some(other_attributes.cpu_affinity),
            expected_mask.or(Some(Vec::new())),
            "a different mask stays"
        );
        assert_eq!(
            own.credentials.is_none(),
            daemon.plain_ids,
            "a switch to the daemon's own ids is dropped when real ids match"
        );
    }
}
