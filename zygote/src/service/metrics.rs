//! The daemon's counters, kept once as Prometheus metrics: `/metrics`
//! exports them and the `Status` reply reads the same values.

use std::time::Duration;

use prometheus::process_collector::ProcessCollector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use zygote_proto::{ExitStatus, ProtocolErrorKind};

/// Spawn latency buckets, in seconds: 50 µs (a static child on an idle
/// machine) to 10 s (a machine in trouble).
const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

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
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Refused => "refused",
        }
    }
}

/// The daemon's metrics and the registry that exports them.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    spawn_duration: Histogram,
    spawns: IntCounterVec,
    peer_spawns: IntCounterVec,
    exec_errors: IntCounterVec,
    children_running: IntGauge,
    child_exits: IntCounterVec,
    connections_open: IntGauge,
    connections_accepted: IntCounter,
    protocol_errors: IntCounterVec,
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
        let spawn_duration = Histogram::with_opts(
            HistogramOpts::new(
                "zygote_spawn_duration_seconds",
                "Time from receiving a spawn request to sending its reply.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        let spawns = IntCounterVec::new(
            Opts::new(
                "zygote_spawns_total",
                "Spawn requests by result: ok (exec'd), failed (setup or exec failed), \
                 refused (rejected before any process was created).",
            ),
            &["result"],
        )
        .expect("valid counter");
        // By peer uid: the policy bounds which uids may connect, so the
        // series stay few; pids would not.
        let peer_spawns = IntCounterVec::new(
            Opts::new(
                "zygote_peer_spawns_total",
                "Spawn requests by the peer's uid and result.",
            ),
            &["uid", "result"],
        )
        .expect("valid counter");
        let exec_errors = IntCounterVec::new(
            Opts::new(
                "zygote_exec_errors_total",
                "Spawns whose execve failed, by errno name.",
            ),
            &["errno"],
        )
        .expect("valid counter");
        let children_running = IntGauge::new(
            "zygote_children_running",
            "Children started and not yet reaped.",
        )
        .expect("valid gauge");
        let child_exits = IntCounterVec::new(
            Opts::new(
                "zygote_child_exits_total",
                "Children reaped, by how they ended: exited or signaled.",
            ),
            &["kind"],
        )
        .expect("valid counter");
        let connections_open =
            IntGauge::new("zygote_connections_open", "Client connections open now.")
                .expect("valid gauge");
        let connections_accepted = IntCounter::new(
            "zygote_connections_accepted_total",
            "Client connections accepted since start.",
        )
        .expect("valid counter");
        let protocol_errors = IntCounterVec::new(
            Opts::new(
                "zygote_protocol_errors_total",
                "Connections closed for a protocol error, by reason.",
            ),
            &["reason"],
        )
        .expect("valid counter");
        for result in [SpawnResult::Ok, SpawnResult::Failed, SpawnResult::Refused] {
            spawns.with_label_values(&[result.label()]);
        }
        for kind in ["exited", "signaled"] {
            child_exits.with_label_values(&[kind]);
        }
        // Every reason's series exists from the start, at 0, rather than
        // appearing on the first error.
        for kind in ProtocolErrorKind::ALL {
            protocol_errors.with_label_values(&[kind.name()]);
        }
        let collectors: [Box<dyn prometheus::core::Collector>; 10] = [
            Box::new(spawn_duration.clone()),
            Box::new(spawns.clone()),
            Box::new(peer_spawns.clone()),
            Box::new(exec_errors.clone()),
            Box::new(children_running.clone()),
            Box::new(child_exits.clone()),
            Box::new(connections_open.clone()),
            Box::new(connections_accepted.clone()),
            Box::new(protocol_errors.clone()),
            Box::new(ProcessCollector::for_self()),
        ];
        for collector in collectors {
            registry.register(collector).expect("unique metric names");
        }
        Self {
            registry,
            spawn_duration,
            spawns,
            peer_spawns,
            exec_errors,
            children_running,
            child_exits,
            connections_open,
            connections_accepted,
            protocol_errors,
        }
    }

    /// Records a spawn's outcome, its latency (request to reply) and the
    /// peer's uid.
    pub fn spawn_done(&self, result: SpawnResult, latency: Duration, peer_uid: u32) {
        self.spawns.with_label_values(&[result.label()]).inc();
        self.peer_spawns
            .with_label_values(&[&peer_uid.to_string(), result.label()])
            .inc();
        self.spawn_duration.observe(latency.as_secs_f64());
    }

    /// Records an `execve` failure.
    pub fn exec_failed(&self, errno: i32) {
        self.exec_errors
            .with_label_values(&[&errno_name(errno)])
            .inc();
    }

    /// A child was started.
    pub fn child_started(&self) {
        self.children_running.inc();
    }

    /// A child was reaped (`status` is `None` when reaping failed).
    pub fn child_reaped(&self, status: Option<&ExitStatus>) {
        self.children_running.dec();
        let kind = match status {
            Some(ExitStatus::Exited(_)) => "exited",
            Some(ExitStatus::Signaled { .. }) => "signaled",
            None => return,
        };
        self.child_exits.with_label_values(&[kind]).inc();
    }

    /// A connection was accepted.
    pub fn connection_opened(&self) {
        self.connections_accepted.inc();
        self.connections_open.inc();
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
        self.spawns.with_label_values(&[result.label()]).get()
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

    #[test]
    fn errno_names_are_symbolic() {
        assert_eq!(errno_name(libc::EACCES), "EACCES");
        assert_eq!(errno_name(9999), "E9999");
    }
}
