//! The results: a markdown table on stdout and the same data as JSON.

use std::fmt::Write;

use serde::Serialize;

use crate::cgroups::CgroupCost;
use crate::methods::Method;
use crate::stats::{Summary, Target};

/// Daemon + client CPU per spawn of a minimal zygote written in C (blocking
/// calls, one reply per spawn), measured on the same 2-CPU machine, µs.
pub const C_ZYGOTE_CPU_US: f64 = 84.0;

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// When and where.
    pub meta: Meta,
    /// One per (child, condition, method).
    pub cells: Vec<Cell>,
    /// Copy-on-write tax per parent size and method.
    pub cow: Vec<Cow>,
    /// Zygote RSS with many children running.
    pub resident: Vec<Resident>,
    /// The cost of a cgroup per child.
    pub cgroup: CgroupCost,
    /// The targets, evaluated.
    pub targets: Vec<Target>,
}

/// The run's circumstances.
#[derive(Debug, Serialize)]
pub struct Meta {
    /// UTC date and time.
    pub date: String,
    /// The exact command line.
    pub command: String,
    /// CPUs available.
    pub cpus: usize,
    /// `uname -r`.
    pub kernel: String,
    /// Whether this was a release build.
    pub release_build: bool,
    /// The static child: built with libc, or bare.
    pub static_child: String,
}

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// `dynamic` (/bin/true) or `static`.
    pub child: &'static str,
    /// Parent's touched memory, GiB.
    pub rss_gib: usize,
    /// Extra open fds in the parent.
    pub fds: usize,
    /// Spawns in flight.
    pub concurrency: usize,
    /// How.
    pub method: Method,
    /// The numbers.
    #[serde(flatten)]
    pub summary: Summary,
    /// p50 over the floor's p50 in the same condition.
    pub p50_vs_floor: f64,
    /// spawns/s over the floor's in the same condition.
    pub throughput_vs_floor: f64,
}

/// Copy-on-write tax of one method at one parent size.
#[derive(Debug, Serialize)]
pub struct Cow {
    /// Parent's touched memory, GiB.
    pub rss_gib: usize,
    /// The method spawned once before the rewrite; None: the baseline.
    pub method: Option<Method>,
    /// Median time to write every page once, ms.
    pub rewrite_ms: f64,
    /// Over the median rewrite just before the spawns of the same rounds.
    pub vs_baseline: f64,
}

/// A zygote's memory with children running.
#[derive(Debug, Serialize)]
pub struct Resident {
    /// Which zygote.
    pub method: Method,
    /// Children running at the time.
    pub children: usize,
    /// Its VmRSS, KiB.
    pub rss_kib: u64,
}

fn opt(value: Option<f64>) -> String {
    value.map_or_else(|| "".to_owned(), |v| format!("{v:.0}"))
}

impl Report {
    /// CPU per spawn of client + zygote at concurrency 1 and 0 extra fds,
    /// beside the minimal C zygote's.
    fn cpu_table(&self, out: &mut String) {
        let Some(conc1) = self.cells.iter().map(|c| c.concurrency).min() else {
            return;
        };
        let fds0 = self.cells.iter().map(|c| c.fds).min().unwrap_or(0);
        let _ = write!(
            out,
            "\n#### CPU per spawn\n\nClient + zygote CPU per spawn at c={conc1}, {fds0} extra fds, \
             against the minimal C zygote's {:.0} µs (the child's own time excluded).\n\n\
             | child | RSS GiB | method | client µs | zygote µs | total µs | ×C zygote |\n|---|---|---|---|---|---|---|\n",
            C_ZYGOTE_CPU_US
        );
        for cell in self
            .cells
            .iter()
            .filter(|c| c.concurrency == conc1 && c.fds == fds0)
        {
            let s = &cell.summary;
            if let Some(total) = s.total_cpu_per_spawn_us() {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {total:.0} | {:.2} |",
                    cell.child,
                    cell.rss_gib,
                    cell.method.name(),
                    opt(s.client_cpu_per_spawn_us),
                    opt(s.zygote_cpu_per_spawn_us),
                    total / C_ZYGOTE_CPU_US
                );
            }
        }
    }

    /// The markdown tables.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let meta = &self.meta;
        let _ = writeln!(
            out,
            "Run {} on {} CPUs, kernel {}, {} build; static child: {}.\n\n`{}`\n",
            meta.date,
            meta.cpus,
            meta.kernel,
            if meta.release_build {
                "release"
            } else {
                "debug"
            },
            meta.static_child,
            meta.command
        );
        out.push_str("#### Targets\n\n| target | measured | wanted | met |\n|---|---|---|---|\n");
        for target in &self.targets {
            let _ = writeln!(
                out,
                "| {} | {:.2} | {} | {} |",
                target.name,
                target.value,
                target.target,
                if target.met { "yes" } else { "**no**" }
            );
        }
        out.push_str(
            "\n#### Spawn + wait\n\nLatency from the call until the exit is seen. \
             *blocked*: the calling thread's busy time per spawn (std: the whole `spawn()`; \
             zygote clients call `status()`: async, the time inside its future's polls; \
             blocking, none: it blocks until the exit). *thread cpu*: the calling thread's CPU per spawn, including the \
             async client's reply reader. *nivcsw*: the calling thread's involuntary context \
             switches per spawn (async: preemptions, e.g. by the zygote woken on its CPU). *client cpu*, *zygote cpu*: CPU per spawn of the \
             whole client process and of the zygote process (every thread; the child's own \
             time excluded), from their process CPU clocks before and after each round.\n\n\
             | child | RSS GiB | fds | conc | method | n | p50 ms | p99 ms | mean ms | spawns/s | p50 ×floor | spawns/s ×floor | blocked p50 µs | thread cpu µs | nivcsw | client cpu µs | zygote cpu µs |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for cell in &self.cells {
            let s = &cell.summary;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.0} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
                cell.child,
                cell.rss_gib,
                cell.fds,
                cell.concurrency,
                cell.method.name(),
                s.n,
                s.p50_us / 1e3,
                s.p99_us / 1e3,
                s.mean_us / 1e3,
                s.spawns_per_s,
                cell.p50_vs_floor,
                cell.throughput_vs_floor,
                opt(s.blocked_p50_us),
                opt(s.cpu_per_spawn_us),
                s.nivcsw_per_spawn
                    .map_or_else(String::new, |n| format!("{n:.2}")),
                opt(s.client_cpu_per_spawn_us),
                opt(s.zygote_cpu_per_spawn_us),
            );
        }
        self.cpu_table(&mut out);
        out.push_str(
            "\n#### Copy-on-write tax\n\nTime for the parent to write one byte in every page \
             of its memory right after one spawn + wait, against the same just before the \
             spawn (medians over the rounds; the baseline row is the median of all \
             before-rewrites).\n\n| RSS GiB | spawned by | rewrite ms | ×baseline |\n|---|---|---|---|\n",
        );
        for cow in &self.cow {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {:.2} |",
                cow.rss_gib,
                cow.method.map_or("(no spawn: baseline)", Method::name),
                cow.rewrite_ms,
                cow.vs_baseline
            );
        }
        out.push_str(
            "\n#### Zygote size\n\n| zygote | children running | RSS MiB |\n|---|---|---|\n",
        );
        for resident in &self.resident {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} |",
                resident.method.name(),
                resident.children,
                resident.rss_kib as f64 / 1024.0
            );
        }
        out.push_str(&self.cgroup.markdown());
        out
    }
}
