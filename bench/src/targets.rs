//! The targets, evaluated from one run's cells.

use crate::Args;
use crate::methods::Method;
use crate::report::{C_ZYGOTE_CPU_US, Cell, Cow, Resident};
use crate::stats::Target;

/// The modes the older targets (fork ratio, fd ratio) were set for.
const FIRST_ZYGOTES: [Method; 3] = [
    Method::ZygoteShared,
    Method::ZygotePrivate,
    Method::ZygoteTemplate,
];

/// p50 over the floor's, at concurrency 1.
const LATENCY_RATIO: f64 = 1.10;
/// spawns/s over the floor's, at the highest concurrency.
const THROUGHPUT_RATIO: f64 = 0.90;
/// A non-root peer's p50 over a root peer's, at concurrency 1.
const NONROOT_LATENCY_RATIO: f64 = 1.10;
/// A non-root peer's zygote CPU per spawn (daemon and spawner processes)
/// over a root peer's.
const NONROOT_CPU_RATIO: f64 = 1.2;

/// The targets: latency at the smallest and largest parent and
/// with the most fds, throughput at the largest parent, CPU, and the
/// earlier targets that must not regress.
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
    let mut push = |name: String, value: f64, target: String, met: bool| {
        targets.push(Target {
            name,
            value,
            target,
            met,
        });
    };
    let mut latency_conditions = vec![(max_rss, fds0)];
    if min_rss != max_rss {
        latency_conditions.insert(0, (min_rss, fds0));
    }
    if max_fds > fds0 {
        latency_conditions.push((min_rss, max_fds));
    }
    for child in ["dynamic", "static"] {
        for method in Method::ZYGOTES {
            let name = method.name();
            for &(rss, fds) in &latency_conditions {
                if let Some(cell) = find(child, rss, fds, conc1, method) {
                    let ratio = cell.p50_vs_floor;
                    push(
                        format!("{child}: {name} p50 / floor p50, {rss} GiB, {fds} fds, c={conc1}"),
                        ratio,
                        format!("<= {LATENCY_RATIO:.2}"),
                        ratio <= LATENCY_RATIO,
                    );
                }
            }
            if max_conc > conc1 {
                if let Some(cell) = find(child, max_rss, fds0, max_conc, method) {
                    let ratio = cell.throughput_vs_floor;
                    push(
                        format!("{child}: {name} spawns/s / floor, c={max_conc}, {max_rss} GiB"),
                        ratio,
                        format!(">= {THROUGHPUT_RATIO:.2}"),
                        ratio >= THROUGHPUT_RATIO,
                    );
                }
            }
        }
        for method in FIRST_ZYGOTES {
            let name = method.name();
            if let (Some(cell), Some(fork)) = (
                find(child, max_rss, fds0, conc1, method),
                find(child, max_rss, fds0, conc1, Method::StdFork),
            ) {
                let speedup = fork.summary.p50_us / cell.summary.p50_us;
                push(
                    format!("{child}: fork path p50 / {name} p50, {max_rss} GiB"),
                    speedup,
                    ">= 50".to_owned(),
                    speedup >= 50.0,
                );
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
                        "<= 0.5".to_owned(),
                        ratio <= 0.5,
                    );
                }
            }
        }
    }
    nonroot_targets(&find, &latency_conditions, conc1, max_rss, fds0, &mut push);
    let cpu_limit = 1.5 * C_ZYGOTE_CPU_US;
    for method in Method::ZYGOTES {
        let name = method.name();
        if let Some(cell) = find("dynamic", max_rss, fds0, conc1, method) {
            if let Some(cpu) = cell.summary.total_cpu_per_spawn_us() {
                push(
                    format!(
                        "{name}: zygote + client CPU per spawn µs (C zygote: {C_ZYGOTE_CPU_US:.0}), dynamic, {max_rss} GiB, c={conc1}"
                    ),
                    cpu,
                    format!("<= {cpu_limit:.0}"),
                    cpu <= cpu_limit,
                );
            }
            // The blocking API blocks by design: the goal is the async one's.
            if let (Some(blocked), true) = (
                cell.summary.blocked_p50_us,
                cell.summary.cpu_per_spawn_us.is_some(),
            ) {
                push(
                    format!("{name}: calling thread blocked per spawn µs (p50), {max_rss} GiB"),
                    blocked,
                    "<= 20 (goal; 50 before)".to_owned(),
                    blocked <= 20.0,
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
                "<= 1.1".to_owned(),
                tax.vs_baseline <= 1.1,
            );
        }
        if let Some(size) = resident.iter().find(|r| r.method == method) {
            let mib = size.rss_kib as f64 / 1024.0;
            push(
                format!("{name}: RSS MiB with {} children", size.children),
                mib,
                "< 16".to_owned(),
                mib < 16.0,
            );
        }
    }
    targets
}

/// A non-root peer of the shared daemon against a root peer of it, in the
/// same run: p50 at concurrency 1 (each child and condition) and the
/// zygote's CPU per spawn (its spawns/s at the highest concurrency are
/// among every method's above).
fn nonroot_targets<'a>(
    find: &impl Fn(&str, usize, usize, usize, Method) -> Option<&'a Cell>,
    latency_conditions: &[(usize, usize)],
    conc1: usize,
    max_rss: usize,
    fds0: usize,
    push: &mut impl FnMut(String, f64, String, bool),
) {
    let pair = |child, rss, fds, conc| {
        find(child, rss, fds, conc, Method::ZygoteSharedNonRoot).zip(find(
            child,
            rss,
            fds,
            conc,
            Method::ZygoteShared,
        ))
    };
    for child in ["dynamic", "static"] {
        for &(rss, fds) in latency_conditions {
            if let Some((nonroot, root)) = pair(child, rss, fds, conc1) {
                let ratio = nonroot.summary.p50_us / root.summary.p50_us;
                push(
                    format!(
                        "{child}: non-root peer p50 / root peer p50, {rss} GiB, {fds} fds, c={conc1}"
                    ),
                    ratio,
                    format!("<= {NONROOT_LATENCY_RATIO:.2}"),
                    ratio <= NONROOT_LATENCY_RATIO,
                );
            }
        }
    }
    if let Some((nonroot, root)) = pair("dynamic", max_rss, fds0, conc1) {
        if let (Some(ours), Some(theirs)) = (
            nonroot.summary.zygote_cpu_per_spawn_us,
            root.summary.zygote_cpu_per_spawn_us,
        ) {
            let ratio = ours / theirs;
            push(
                format!(
                    "non-root peer zygote CPU per spawn / root peer's (daemon and spawners), dynamic, {max_rss} GiB, c={conc1}"
                ),
                ratio,
                format!("<= {NONROOT_CPU_RATIO:.1}"),
                ratio <= NONROOT_CPU_RATIO,
            );
        }
    }
}
