//! Summaries of one cell's samples.

use std::time::Duration;

use serde::Serialize;

use crate::methods::CellRun;

/// What the table shows for one cell.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Spawns measured.
    pub n: usize,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// Spawns completed per second of wall time.
    pub spawns_per_s: f64,
    /// Median time the calling thread was busy per spawn, µs.
    pub blocked_p50_us: Option<f64>,
    /// Calling thread's CPU time per spawn, µs (async zygote methods).
    pub cpu_per_spawn_us: Option<f64>,
    /// Calling thread's involuntary context switches per spawn (async
    /// zygote methods).
    pub nivcsw_per_spawn: Option<f64>,
    /// The client process's CPU time per spawn, µs (zygote methods).
    pub client_cpu_per_spawn_us: Option<f64>,
    /// The zygote process's CPU time per spawn, µs (zygote methods).
    pub zygote_cpu_per_spawn_us: Option<f64>,
}

/// One of the targets.
#[derive(Debug, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured value.
    pub value: f64,
    /// The target, as text (e.g. "<= 1.25").
    pub target: String,
    /// Whether it is met.
    pub met: bool,
}

/// The nearest-rank percentile `p` (0..=1) of sorted `values`.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn us(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

impl Summary {
    /// Client + zygote CPU per spawn, µs, when both were measured.
    pub fn total_cpu_per_spawn_us(&self) -> Option<f64> {
        Some(self.client_cpu_per_spawn_us? + self.zygote_cpu_per_spawn_us?)
    }

    /// Summarises a cell.
    pub fn of(run: &CellRun) -> Self {
        let mut latencies: Vec<Duration> = run.samples.iter().map(|s| s.latency).collect();
        latencies.sort_unstable();
        let mut blocked: Vec<Duration> = run.samples.iter().filter_map(|s| s.blocked).collect();
        blocked.sort_unstable();
        let n = latencies.len();
        let total: Duration = latencies.iter().sum();
        Self {
            n,
            p50_us: us(percentile(&latencies, 0.5)),
            p99_us: us(percentile(&latencies, 0.99)),
            mean_us: if n == 0 { 0.0 } else { us(total) / n as f64 },
            spawns_per_s: if run.wall.is_zero() {
                0.0
            } else {
                n as f64 / run.wall.as_secs_f64()
            },
            blocked_p50_us: (!blocked.is_empty()).then(|| us(percentile(&blocked, 0.5))),
            cpu_per_spawn_us: run.cpu.map(|cpu| us(cpu) / n.max(1) as f64),
            nivcsw_per_spawn: run
                .involuntary_switches
                .map(|switches| switches as f64 / n.max(1) as f64),
            client_cpu_per_spawn_us: run.client_cpu.map(|cpu| us(cpu) / n.max(1) as f64),
            zygote_cpu_per_spawn_us: run.zygote_cpu.map(|cpu| us(cpu) / n.max(1) as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&values, 0.5), Duration::from_micros(50));
        assert_eq!(percentile(&values, 0.99), Duration::from_micros(99));
        assert_eq!(percentile(&values[..1], 0.99), Duration::from_micros(1));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
