//! The daemon's counters, kept once as Prometheus metrics: `/metrics`
//! exports them and the `Status` reply reads the same values.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::process_collector::ProcessCollector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Counter, Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use zygote_proto::{ExitStatus, ProtocolErrorKind};

/// Spawn latency buckets, in seconds: 50 µs (a static child on an idle
/// machine) to 10 s (a machine in trouble). Between 0.1 and 5 ms, where a
/// healthy zygote's p50 and p99 sit, buckets are at most 1.34x apart, so
/// that a quantile does not snap to a bucket edge twice its size.
const LATENCY_BUCKETS: [f64; 31] = [
    0.000_05, // below the range that matters
    0.000_1, 0.000_125, 0.000_15, 0.000_2, 0.000_25, 0.000_3, 0.000_4, 0.000_5, 0.000_6, 0.000_7,
    0.000_8, 0.000_9, 0.001, 0.001_25, 0.001_5, 0.002, 0.002_5, 0.003, 0.004, 0.005,
    // a loaded machine, then one in trouble
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The name both the prometheus crate's process collector and ours give
/// the daemon's CPU time.
const CPU_SECONDS: &str = "process_cpu_seconds_total";

/// How a spawn request ended, the `result` label of `zygote_spawns_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnResult {
    /// The child exec'd.
    Ok,
    /// Creating or setting up the child failed (exec errors included).
    Failed,
    /// The request was refused before anything was created.
    Refused,
}

impl SpawnResult {
    const ALL: [Self; 3] = [Self::Ok, Self::Failed, Self::Refused];

    fn index(self) -> usize {
        self as usize
    }

    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Refused => "refused",
        }
    }
}

/// How a child was started, the `path` label of `zygote_spawn_paths_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnPath {
    /// vfork'd by a daemon thread: the child keeps the daemon's uid.
    Vfork,
    /// vfork'd by the per-uid spawner process of the uid it switches to.
    Spawner,
    /// Forked: a copy of the daemon, for a uid without a spawner.
    Fork,
}

impl SpawnPath {
    const ALL: [Self; 3] = [Self::Vfork, Self::Spawner, Self::Fork];

    fn label(self) -> &'static str {
        match self {
            Self::Vfork => "vfork",
            Self::Spawner => "spawner",
            Self::Fork => "fork",
        }
    }
}

/// One counter's value: `(metric, labels as (name, value), count)`.
pub type CounterValue = (String, Vec<(String, String)>, u64);

/// The daemon's metrics and the registry that exports them.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    spawn_duration: Histogram,
    spawns: IntCounterVec,
    peer_spawns: IntCounterVec,
    exec_errors: IntCounterVec,
    sandboxed_spawns: IntCounterVec,
    sandbox_failures: IntCounterVec,
    parked_inits: IntCounterVec,
    parked_inits_ready: IntGauge,
    children_running: IntGauge,
    child_exits: IntCounterVec,
    connections_open: IntGauge,
    connections_accepted: IntCounter,
    protocol_errors: IntCounterVec,
    oom_kills: IntCounterVec,
    tree_kills: IntCounterVec,
    spawn_paths: IntCounterVec,
    uid_spawners: IntGauge,
    uid_spawner_restarts: IntCounter,
    /// Handles resolved once: a label lookup hashes its strings and takes
    /// the vector's lock, on every spawn otherwise.
    spawns_by_result: [IntCounter; 3],
    exits_by_kind: [IntCounter; 2],
    spawns_by_path: [IntCounter; 3],
    /// `peer_spawns` by uid then result, filled on a uid's first spawn.
    /// As few entries as the vector has series (the policy bounds them).
    peer_spawns_by_uid: Arc<Mutex<HashMap<u32, [IntCounter; 3]>>>,
    templates: TemplateMetrics,
}

/// Creates metrics and registers them in one step, so that a metric can
/// neither be forgotten in the registry nor registered twice.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn register(&self, collector: impl Collector + 'static) {
        self.0
            .register(Box::new(collector))
            .expect("unique metric names");
    }

    /// Registers `collector` and gives back a handle on the same metric.
    fn add<C: Collector + Clone + 'static>(&self, collector: C) -> C {
        self.register(collector.clone());
        collector
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help).expect("valid counter"))
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help).expect("valid gauge"))
    }

    fn latency(&self, name: &str, help: &str) -> Histogram {
        let options = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
        self.add(Histogram::with_opts(options).expect("valid histogram"))
    }

    /// The process's own metrics, and which zygote and protocol it is.
    fn process_and_build(&self) {
        self.register(ProcessMetrics::new());
        let build_info = self.add(
            IntGaugeVec::new(
                Opts::new(
                    "zygote_build_info",
                    "Always 1; the labels say which zygote and protocol version runs.",
                ),
                &["version", "protocol_version"],
            )
            .expect("valid gauge"),
        );
        build_info
            .with_label_values(&[
                &crate::version(),
                &zygote_proto::PROTOCOL_VERSION.to_string(),
            ])
            .set(1);
    }
}

/// The warm templates' metrics.
#[derive(Debug, Clone)]
struct TemplateMetrics {
    starts: IntCounterVec,
    exits_unasked: IntCounter,
    forks: IntCounter,
    warm_spawn_duration: Histogram,
}

impl TemplateMetrics {
    /// Every result's series exists from the start, at 0.
    const START_RESULTS: [&'static str; 5] =
        ["ok", "refused", "failed", "exec_failed", "preload_failed"];

    fn register(metrics: &Registrar<'_>) -> Self {
        let starts = metrics.counters(
            "zygote_template_starts_total",
            "Template processes started, by result (timeout: not ready within the start \
             deadline).",
            &["result"],
        );
        for result in Self::START_RESULTS.into_iter().chain(["timeout"]) {
            starts.with_label_values(&[result]);
        }
        Self {
            starts,
            exits_unasked: metrics.counter(
                "zygote_template_exits_unasked_total",
                "Template processes that ended without being asked to (crashed, killed).",
            ),
            forks: metrics.counter(
                "zygote_template_forks_total",
                "Children forked by templates and taken by the daemon.",
            ),
            warm_spawn_duration: metrics.latency(
                "zygote_warm_spawn_duration_seconds",
                "Time from receiving a spawn from a template to sending its Spawned.",
            ),
        }
    }
}

impl Metrics {
    /// Creates and registers every metric, plus the process collector
    /// (`process_open_fds`, `process_resident_memory_bytes`, ...).
    ///
    /// # Panics
    ///
    /// On an invalid metric definition, which is a bug caught by the unit
    /// tests.
    pub fn new() -> Self {
        let registry = Registry::new();
        let metrics = Registrar(&registry);
        let spawns = metrics.counters(
            "zygote_spawns_total",
            "Spawn requests by result: ok (exec'd), failed (setup or exec failed), \
             refused (rejected before any process was created).",
            &["result"],
        );
        let child_exits = metrics.counters(
            "zygote_child_exits_total",
            "Children reaped, by how they ended: exited or signaled.",
            &["kind"],
        );
        let protocol_errors = metrics.counters(
            "zygote_protocol_errors_total",
            "Connections closed for a protocol error, by reason.",
            &["reason"],
        );
        // Every reason's series exists from the start, at 0, rather than
        // appearing on the first error.
        for kind in ProtocolErrorKind::ALL {
            protocol_errors.with_label_values(&[kind.name()]);
        }
        let spawn_paths = metrics.counters(
            "zygote_spawn_paths_total",
            "Children started, by path: vfork (by a daemon thread, keeping the daemon's \
             uid), spawner (by the per-uid spawner process of the uid switched to), fork \
             (a copy of the daemon, for a uid without a spawner).",
            &["path"],
        );
        metrics.process_and_build();
        Self {
            spawn_duration: metrics.latency(
                "zygote_spawn_duration_seconds",
                "Time from receiving a spawn request to sending its reply.",
            ),
            spawns_by_result: SpawnResult::ALL
                .map(|result| spawns.with_label_values(&[result.label()])),
            spawns,
            // By peer uid: the policy bounds which uids may connect, so the
            // series stay few; pids would not.
            peer_spawns: metrics.counters(
                "zygote_peer_spawns_total",
                "Spawn requests by the peer's uid and result.",
                &["uid", "result"],
            ),
            exec_errors: metrics.counters(
                "zygote_exec_errors_total",
                "Spawns whose execve failed, by errno name.",
                &["errno"],
            ),
            sandboxed_spawns: metrics.counters(
                "zygote_sandboxed_spawns_total",
                "Spawns with a sandbox (requested or imposed by policy), by result: \
                 ok, failed, refused.",
                &["result"],
            ),
            sandbox_failures: metrics.counters(
                "zygote_sandbox_failures_total",
                "Sandboxes refused or failed, by stage (validate, sandbox) and step.",
                &["stage", "step"],
            ),
            parked_inits: metrics.counters(
                "zygote_parked_inits_total",
                "Sandbox namespaces made ahead (parked inits), by event: made, failed, \
                 entered (a spawn used one), missed (a spawn of a sandbox with a pid \
                 namespace found none), expired; copied (made from a mount template), \
                 template (a mount template built), template_failed, template_copied (a \
                 spawn without a pid namespace copied one); unusable (a spawn found its \
                 init or template ended or a bind source replaced, and made its own).",
                &["event"],
            ),
            parked_inits_ready: metrics.gauge(
                "zygote_parked_inits",
                "Parked inits ready now: sandbox namespaces made ahead, each a process \
                 of its peer's uid waiting for that peer's next spawn.",
            ),
            children_running: metrics.gauge(
                "zygote_children_running",
                "Children started and not yet reaped.",
            ),
            exits_by_kind: ["exited", "signaled"]
                .map(|kind| child_exits.with_label_values(&[kind])),
            child_exits,
            connections_open: metrics
                .gauge("zygote_connections_open", "Client connections open now."),
            connections_accepted: metrics.counter(
                "zygote_connections_accepted_total",
                "Client connections accepted since start.",
            ),
            protocol_errors,
            oom_kills: metrics.counters(
                "zygote_oom_kills_total",
                "Children whose cgroup saw an OOM kill, by the peer's uid.",
                &["uid"],
            ),
            tree_kills: metrics.counters(
                "zygote_tree_kills_total",
                "Whole child cgroups ended with cgroup.kill, by the peer's uid.",
                &["uid"],
            ),
            spawns_by_path: SpawnPath::ALL
                .map(|path| spawn_paths.with_label_values(&[path.label()])),
            spawn_paths,
            uid_spawners: metrics.gauge(
                "zygote_uid_spawners",
                "Per-uid spawner processes running now.",
            ),
            uid_spawner_restarts: metrics.counter(
                "zygote_uid_spawner_restarts_total",
                "Spawner processes started for a uid whose previous one failed.",
            ),
            peer_spawns_by_uid: Arc::default(),
            templates: TemplateMetrics::register(&metrics),
            registry,
        }
    }

    /// A template process was started, or failed to (`result`).
    pub fn template_started(&self, result: &str) {
        self.templates.starts.with_label_values(&[result]).inc();
    }

    /// A template process ended without being asked to.
    pub fn template_exited_unasked(&self) {
        self.templates.exits_unasked.inc();
    }

    /// A template forked a child the daemon took.
    pub fn template_forked(&self) {
        self.templates.forks.inc();
    }

    /// A warm spawn was answered `Spawned`, `latency` after its request.
    pub fn warm_spawn_done(&self, latency: Duration) {
        self.templates
            .warm_spawn_duration
            .observe(latency.as_secs_f64());
    }

    /// The OOM killer ended a process in a child's cgroup.
    pub fn oom_killed(&self, peer_uid: u32) {
        self.oom_kills
            .with_label_values(&[&peer_uid.to_string()])
            .inc();
    }

    /// A child's whole cgroup was ended with `cgroup.kill`.
    pub fn tree_killed(&self, peer_uid: u32) {
        self.tree_kills
            .with_label_values(&[&peer_uid.to_string()])
            .inc();
    }

    /// Records a spawn's outcome, its latency (request to reply) and the
    /// peer's uid.
    pub fn spawn_done(&self, result: SpawnResult, latency: Duration, peer_uid: u32) {
        self.spawns_by_result[result.index()].inc();
        self.count_peer_spawn(peer_uid, result);
        self.spawn_duration.observe(latency.as_secs_f64());
    }

    /// Counts a spawn in the `peer_spawns` series of `uid` and `result`,
    /// looked up by label only on the uid's first spawn.
    fn count_peer_spawn(&self, uid: u32, result: SpawnResult) {
        let mut by_uid = self
            .peer_spawns_by_uid
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let counters = by_uid.entry(uid).or_insert_with(|| {
            let uid = uid.to_string();
            SpawnResult::ALL.map(|result| {
                self.peer_spawns
                    .with_label_values(&[uid.as_str(), result.label()])
            })
        });
        counters[result.index()].inc();
    }

    /// Counts a sandboxed spawn by its result.
    pub fn sandboxed_spawn(&self, result: SpawnResult) {
        self.sandboxed_spawns
            .with_label_values(&[result.label()])
            .inc();
    }

    /// Counts a sandbox refused (`stage` validate) or failed in the child
    /// (`stage` sandbox) at `step`.
    pub fn sandbox_failed(&self, stage: &str, step: &str) {
        self.sandbox_failures
            .with_label_values(&[stage, step])
            .inc();
    }

    /// Counts a parked init's `event` (see the metric's help).
    pub fn parked_init(&self, event: &str) {
        self.parked_inits.with_label_values(&[event]).inc();
    }

    /// Sets how many parked inits are ready now.
    pub fn set_parked_inits(&self, ready: usize) {
        self.parked_inits_ready
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    /// Records an `execve` failure.
    pub fn exec_failed(&self, errno: i32) {
        self.exec_errors
            .with_label_values(&[&errno_name(errno)])
            .inc();
    }

    /// A child was started on `path`.
    pub fn spawn_path(&self, path: SpawnPath) {
        self.spawns_by_path[path as usize].inc();
    }

    /// Per-uid spawner processes running now.
    pub fn set_uid_spawners(&self, running: usize) {
        self.uid_spawners
            .set(i64::try_from(running).unwrap_or(i64::MAX));
    }

    /// A spawner process was started for a uid whose previous one failed.
    pub fn uid_spawner_restarted(&self) {
        self.uid_spawner_restarts.inc();
    }

    /// Per-uid spawner processes running now.
    pub fn uid_spawners(&self) -> u64 {
        self.uid_spawners.get().max(0) as u64
    }

    /// A child was started.
    pub fn child_started(&self) {
        self.children_running.inc();
    }

    /// A child was reaped (`status` is `None` when reaping failed).
    pub fn child_reaped(&self, status: Option<&ExitStatus>) {
        self.children_running.dec();
        let kind = match status {
            Some(ExitStatus::Exited(_)) => 0,
            Some(ExitStatus::Signaled { .. }) => 1,
            None => return,
        };
        self.exits_by_kind[kind].inc();
    }

    /// A connection was accepted.
    pub fn connection_opened(&self) {
        self.connections_accepted.inc();
        self.connections_open.inc();
    }

    /// A connection handed over by an earlier image (a live upgrade):
    /// open, and already counted as accepted.
    pub fn connection_restored(&self) {
        self.connections_open.inc();
    }

    /// Every counter (not gauges or histograms) as `(name, labels,
    /// value)`, for a live upgrade.
    pub fn counters(&self) -> Vec<CounterValue> {
        let mut counters = Vec::new();
        for (name, vec) in self.counter_vecs() {
            for family in prometheus::core::Collector::collect(vec) {
                for metric in family.get_metric() {
                    let labels = metric
                        .get_label()
                        .iter()
                        .map(|pair| (pair.name().to_owned(), pair.value().to_owned()))
                        .collect();
                    let value = metric.get_counter().get_value() as u64;
                    counters.push((name.to_owned(), labels, value));
                }
            }
        }
        counters.push((
            "connections_accepted".to_owned(),
            Vec::new(),
            self.connections_accepted.get(),
        ));
        counters.push((
            "uid_spawner_restarts".to_owned(),
            Vec::new(),
            self.uid_spawner_restarts.get(),
        ));
        counters
    }

    /// Adds counters an earlier image saved with [`Metrics::counters`];
    /// unknown names and labels are skipped.
    pub fn restore_counters(&self, counters: &[CounterValue]) {
        let vecs = self.counter_vecs();
        for (name, labels, value) in counters {
            if name == "connections_accepted" {
                self.connections_accepted.inc_by(*value);
                continue;
            }
            if name == "uid_spawner_restarts" {
                self.uid_spawner_restarts.inc_by(*value);
                continue;
            }
            let Some((_, vec)) = vecs.iter().find(|(known, _)| known == name) else {
                continue;
            };
            let labels: std::collections::HashMap<&str, &str> = labels
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect();
            if let Ok(counter) = vec.get_metric_with(&labels) {
                counter.inc_by(*value);
            }
        }
    }

    fn counter_vecs(&self) -> [(&'static str, &IntCounterVec); 11] {
        [
            ("spawn_paths", &self.spawn_paths),
            ("sandboxed_spawns", &self.sandboxed_spawns),
            ("sandbox_failures", &self.sandbox_failures),
            ("parked_inits", &self.parked_inits),
            ("spawns", &self.spawns),
            ("peer_spawns", &self.peer_spawns),
            ("exec_errors", &self.exec_errors),
            ("child_exits", &self.child_exits),
            ("protocol_errors", &self.protocol_errors),
            ("oom_kills", &self.oom_kills),
            ("tree_kills", &self.tree_kills),
        ]
    }

    /// A connection ended.
    pub fn connection_closed(&self) {
        self.connections_open.dec();
    }

    /// The daemon closed a connection for a protocol error.
    pub fn protocol_error(&self, kind: ProtocolErrorKind) {
        self.protocol_errors.with_label_values(&[kind.name()]).inc();
    }

    /// Children started and not yet reaped.
    pub fn children_running(&self) -> u64 {
        self.children_running.get().max(0) as u64
    }

    /// Connections open now.
    pub fn connections_open(&self) -> u64 {
        self.connections_open.get().max(0) as u64
    }

    /// Connections accepted since start.
    pub fn connections_accepted(&self) -> u64 {
        self.connections_accepted.get()
    }

    /// Spawns with `result` since start.
    pub fn spawns(&self, result: SpawnResult) -> u64 {
        self.spawns_by_result[result.index()].get()
    }

    /// Every metric in Prometheus's text format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        // Encoding into a Vec fails only on a malformed family, a bug.
        if let Err(error) = TextEncoder::new().encode(&self.registry.gather(), &mut buffer) {
            tracing::error!(%error, "failed to encode metrics");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The prometheus crate's process metrics (`process_open_fds`,
/// `process_resident_memory_bytes`, ...), except `process_cpu_seconds_total`,
/// which it counts in whole seconds (it divides clock ticks as integers): a
/// daemon that uses 0.4 s of CPU an hour would show 0 for hours. Ours reads
/// `CLOCK_PROCESS_CPUTIME_ID` (every thread, user and system, in ns) at each
/// scrape.
struct ProcessMetrics {
    inner: ProcessCollector,
    cpu_seconds: Counter,
    descs: Vec<Desc>,
}

impl ProcessMetrics {
    fn new() -> Self {
        let inner = ProcessCollector::for_self();
        let cpu_seconds = Counter::new(
            CPU_SECONDS,
            "Total user and system CPU time spent in seconds.",
        )
        .expect("valid counter");
        let descs = inner
            .desc()
            .into_iter()
            .filter(|desc| desc.fq_name != CPU_SECONDS)
            .chain(cpu_seconds.desc())
            .cloned()
            .collect();
        Self {
            inner,
            cpu_seconds,
            descs,
        }
    }
}

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let seconds = now.tv_sec as f64 + now.tv_nsec as f64 / 1e9;
        // A counter only goes up; the clock does too, but two scrapes may
        // race here, so add only what is new.
        let delta = seconds - self.cpu_seconds.get();
        if delta > 0.0 {
            self.cpu_seconds.inc_by(delta);
        }
        let mut families: Vec<MetricFamily> = self
            .inner
            .collect()
            .into_iter()
            .filter(|family| family.name() != CPU_SECONDS)
            .collect();
        families.extend(self.cpu_seconds.collect());
        families
    }
}

/// The symbolic name of the errnos `execve` reports, for a low-cardinality,
/// readable label; others become `E<number>`.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENOEXEC => "ENOEXEC",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ELOOP => "ELOOP",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::E2BIG => "E2BIG",
        libc::ENOMEM => "ENOMEM",
        libc::ETXTBSY => "ETXTBSY",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        libc::EIO => "EIO",
        libc::EINVAL => "EINVAL",
        libc::ELIBBAD => "ELIBBAD",
        libc::EFAULT => "EFAULT",
        libc::EAGAIN => "EAGAIN",
        _ => return format!("E{errno}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandboxed_spawns_and_failures_are_counted_by_result_and_step() {
        let metrics = Metrics::new();
        metrics.sandboxed_spawn(SpawnResult::Ok);
        metrics.sandboxed_spawn(SpawnResult::Failed);
        metrics.sandbox_failed("sandbox", "bind source");
        let text = metrics.render();
        assert!(
            text.contains("zygote_sandboxed_spawns_total{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("zygote_sandboxed_spawns_total{result=\"failed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "zygote_sandbox_failures_total{stage=\"sandbox\",step=\"bind source\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn render_has_help_for_every_metric_and_zeroed_series() {
        let metrics = Metrics::new();
        metrics.spawn_done(SpawnResult::Ok, Duration::from_micros(120), 1000);
        metrics.exec_failed(libc::ENOENT);
        let text = metrics.render();
        for name in [
            "zygote_spawn_duration_seconds",
            "zygote_spawns_total",
            "zygote_peer_spawns_total",
            "zygote_exec_errors_total",
            "zygote_children_running",
            "zygote_child_exits_total",
            "zygote_connections_open",
            "zygote_connections_accepted_total",
            "zygote_protocol_errors_total",
            "zygote_spawn_paths_total",
            "zygote_uid_spawners",
            "zygote_uid_spawner_restarts_total",
            "zygote_parked_inits",
            "process_open_fds",
            "process_resident_memory_bytes",
        ] {
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} in\n{text}"
            );
        }
        assert!(text.contains("zygote_spawns_total{result=\"refused\"} 0"));
        assert!(text.contains("zygote_spawns_total{result=\"ok\"} 1"));
        assert!(text.contains("zygote_peer_spawns_total{result=\"ok\",uid=\"1000\"} 1"));
        assert!(text.contains("zygote_exec_errors_total{errno=\"ENOENT\"} 1"));
        assert!(text.contains("zygote_spawn_duration_seconds_bucket{le=\"0.00005\"} 0"));
        assert!(text.contains("zygote_spawn_duration_seconds_bucket{le=\"0.00025\"} 1"));
        assert!(text.contains("zygote_protocol_errors_total{reason=\"busy\"} 0"));
    }

    /// Each path counts into its own series; restarts carry over an
    /// upgrade like every counter.
    #[test]
    fn spawn_paths_and_spawner_restarts_are_counted() {
        let metrics = Metrics::new();
        metrics.spawn_path(SpawnPath::Spawner);
        metrics.spawn_path(SpawnPath::Spawner);
        metrics.spawn_path(SpawnPath::Fork);
        metrics.set_uid_spawners(3);
        metrics.uid_spawner_restarted();
        let text = metrics.render();
        assert!(
            text.contains("zygote_spawn_paths_total{path=\"spawner\"} 2"),
            "{text}"
        );
        assert!(text.contains("zygote_spawn_paths_total{path=\"fork\"} 1"));
        assert!(text.contains("zygote_spawn_paths_total{path=\"vfork\"} 0"));
        assert!(text.contains("zygote_uid_spawners 3"));
        assert!(text.contains("zygote_uid_spawner_restarts_total 1"));
        let next = Metrics::new();
        next.restore_counters(&metrics.counters());
        let text = next.render();
        assert!(
            text.contains("zygote_spawn_paths_total{path=\"spawner\"} 2"),
            "{text}"
        );
        assert!(text.contains("zygote_uid_spawner_restarts_total 1"));
    }

    /// The handles resolved once count into the exported series, per uid,
    /// together with what an earlier image's counters add.
    #[test]
    fn cached_handles_count_into_the_exported_series() {
        let metrics = Metrics::new();
        for _ in 0..3 {
            metrics.spawn_done(SpawnResult::Ok, Duration::from_micros(100), 1000);
        }
        metrics.spawn_done(SpawnResult::Refused, Duration::from_micros(100), 1000);
        metrics.spawn_done(SpawnResult::Ok, Duration::from_micros(100), 0);
        metrics.child_reaped(Some(&ExitStatus::Signaled {
            signal: libc::SIGKILL,
            core_dumped: false,
        }));
        let saved = metrics.counters();
        let next = Metrics::new();
        next.restore_counters(&saved);
        next.spawn_done(SpawnResult::Ok, Duration::from_micros(100), 1000);
        let text = next.render();
        let ok_1000 = "zygote_peer_spawns_total{result=\"ok\",uid=\"1000\"}";
        assert_eq!(sample(&text, ok_1000), 4.0);
        let refused_1000 = "zygote_peer_spawns_total{result=\"refused\",uid=\"1000\"}";
        assert_eq!(sample(&text, refused_1000), 1.0);
        assert_eq!(
            sample(&text, "zygote_peer_spawns_total{result=\"ok\",uid=\"0\"}"),
            1.0
        );
        assert_eq!(next.spawns(SpawnResult::Ok), 5);
        assert_eq!(next.spawns(SpawnResult::Refused), 1);
        assert_eq!(
            sample(&text, "zygote_child_exits_total{kind=\"signaled\"}"),
            1.0
        );
    }

    /// The value of the sample line `series` in `text`.
    fn sample(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .expect("a number")
    }

    #[test]
    fn latency_buckets_are_fine_where_spawns_land() {
        let metrics = Metrics::new();
        // A p99 just above 1 ms falls in (1, 1.25] ms, not in (1, 2.5].
        metrics.spawn_done(SpawnResult::Ok, Duration::from_micros(1100), 1000);
        let text = metrics.render();
        assert_eq!(
            sample(&text, "zygote_spawn_duration_seconds_bucket{le=\"0.001\"}"),
            0.0
        );
        assert_eq!(
            sample(
                &text,
                "zygote_spawn_duration_seconds_bucket{le=\"0.00125\"}"
            ),
            1.0
        );
        let in_range: Vec<f64> = LATENCY_BUCKETS
            .iter()
            .copied()
            .filter(|le| (0.000_1..=0.005).contains(le))
            .collect();
        assert_eq!(in_range.first(), Some(&0.000_1));
        assert_eq!(in_range.last(), Some(&0.005));
        for pair in in_range.windows(2) {
            assert!(
                pair[1] / pair[0] <= 1.34,
                "buckets {pair:?} are too far apart"
            );
        }
    }

    #[test]
    fn build_info_and_sub_second_cpu_time() {
        let metrics = Metrics::new();
        let series = format!(
            "zygote_build_info{{protocol_version=\"{}\",version=\"{}\"}}",
            zygote_proto::PROTOCOL_VERSION,
            env!("CARGO_PKG_VERSION")
        );
        let text = metrics.render();
        assert_eq!(sample(&text, &series), 1.0);
        assert!(text.contains("# HELP zygote_build_info "));
        assert!(text.contains("# TYPE process_cpu_seconds_total counter"));
        assert_eq!(text.matches("# HELP process_cpu_seconds_total ").count(), 1);
        // Burn a little CPU: the counter moves by a fraction of a second,
        // which whole seconds would round away.
        let before = sample(&text, "process_cpu_seconds_total");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = sample(&metrics.render(), "process_cpu_seconds_total");
        assert!(after > before, "CPU time did not move: {before} -> {after}");
    }

    #[test]
    fn errno_names_are_symbolic() {
        assert_eq!(errno_name(libc::EACCES), "EACCES");
        assert_eq!(errno_name(9999), "E9999");
    }
}
