//! The targets, evaluated from one run's cells.

use crate::Args;
use crate::methods::Method;
use crate::report::{Cell, Cow, Resident, Target};

const ZYGOTES: [Method; 3] = [
    Method::ZygoteShared,
    Method::ZygotePrivate,
    Method::ZygoteTemplate,
];

/// The targets, from the largest parent measured.
pub fn evaluate(cells: &[Cell], cow: &[Cow], resident: &[Resident], args: &Args) -> Vec<Target> {
    let mut targets = Vec::new();
    let Some(max_rss) = cells.iter().map(|c| c.rss_gib).max() else {
        return targets;
    };
    let min_rss = cells.iter().map(|c| c.rss_gib).min().unwrap_or(0);
    let fds0 = cells.iter().map(|c| c.fds).min().unwrap_or(0);
    let max_fds = cells.iter().map(|c| c.fds).max().unwrap_or(0);
    let conc1 = args.concurrency.iter().copied().min().unwrap_or(1);
    let max_conc = args.concurrency.iter().copied().max().unwrap_or(1);
    let find = |child: &str, rss, fds, conc, method| {
        cells.iter().find(|c| {
            c.child == child
                && c.rss_gib == rss
                && c.fds == fds
                && c.concurrency == conc
                && c.method == method
        })
    };
    let mut push = |name: String, value: f64, target: &str, met: bool| {
        targets.push(Target {
            name,
            value,
            target: target.to_owned(),
            met,
        });
    };
    for child in ["dynamic", "static"] {
        for method in ZYGOTES {
            let name = method.name();
            if let Some(cell) = find(child, max_rss, fds0, conc1, method) {
                let ratio = cell.p50_vs_floor;
                push(
                    format!("{child}: {name} p50 / floor p50, {max_rss} GiB, c={conc1}"),
                    ratio,
                    "<= 1.25",
                    ratio <= 1.25,
                );
                if let Some(fork) = find(child, max_rss, fds0, conc1, Method::StdFork) {
                    let speedup = fork.summary.p50_us / cell.summary.p50_us;
                    push(
                        format!("{child}: fork path p50 / {name} p50, {max_rss} GiB"),
                        speedup,
                        ">= 50",
                        speedup >= 50.0,
                    );
                }
            }
            if max_fds > fds0 {
                if let (Some(cell), Some(std)) = (
                    find(child, min_rss, max_fds, conc1, method),
                    find(child, min_rss, max_fds, conc1, Method::StdSpawn),
                ) {
                    let ratio = cell.summary.p50_us / std.summary.p50_us;
                    push(
                        format!("{child}: {name} p50 / std posix_spawn p50, {max_fds} fds"),
                        ratio,
                        "<= 0.5",
                        ratio <= 0.5,
                    );
                }
            }
            if max_conc > conc1 {
                if let Some(cell) = find(child, max_rss, fds0, max_conc, method) {
                    let ratio = cell.throughput_vs_floor;
                    push(
                        format!("{child}: {name} spawns/s / floor, c={max_conc}, {max_rss} GiB"),
                        ratio,
                        ">= 0.75",
                        ratio >= 0.75,
                    );
                }
            }
        }
    }
    for method in ZYGOTES {
        let name = method.name();
        if let Some(cell) = find("dynamic", max_rss, fds0, conc1, method) {
            if let Some(blocked) = cell.summary.blocked_p50_us {
                push(
                    format!("{name}: calling thread blocked per spawn µs (p50), {max_rss} GiB"),
                    blocked,
                    "<= 50",
                    blocked <= 50.0,
                );
            }
        }
        if let Some(tax) = cow
            .iter()
            .find(|c| c.rss_gib == max_rss && c.method == Some(method))
        {
            push(
                format!("{name}: copy-on-write tax, {max_rss} GiB"),
                tax.vs_baseline,
                "<= 1.1",
                tax.vs_baseline <= 1.1,
            );
        }
        if let Some(size) = resident.iter().find(|r| r.method == method) {
            let mib = size.rss_kib as f64 / 1024.0;
            push(
                format!("{name}: RSS MiB with {} children", size.children),
                mib,
                "< 16",
                mib < 16.0,
            );
        }
    }
    targets
}
