//! What a cgroup per child costs: the shared daemon without a cgroup
//! subtree, against a second shared daemon given one (`--cgroup`), at
//! concurrency 1 and in interleaved rounds with the floor. The
//! budget: placement raises the ratio to the floor by at most 0.05.
//!
//! Two kinds of spawn go through the daemon with a subtree: a plain one,
//! placed (`CLONE_INTO_CGROUP`) in a spare cgroup the daemon keeps per peer,
//! and one that asks for whole-tree kill, which gets a fresh cgroup, tree
//! accounting read at exit, and the cgroup removed after.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use serde::Serialize;
use zygote_client::Client;

use crate::Bench;
use crate::error::Result;
use crate::methods::{self, Budget, CellRun};
use crate::serve::serve;
use crate::stats::{Summary, Target};

/// The budget for placement, in ratio-to-floor points.
const BUDGET: f64 = 0.05;

/// A shared daemon with a cgroup subtree of its own, removed on drop.
pub struct CgroupDaemon {
    process: Child,
    client: Client,
    root: PathBuf,
}

impl Drop for CgroupDaemon {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        remove_tree(&self.root);
    }
}

/// Starts the second shared daemon, on a cgroup made for it at the top of
/// the cgroup2 mount. `Err(reason)` when this machine cannot (no cgroup2,
/// not root): the report says why instead of a table.
pub fn start(runtime: &tokio::runtime::Runtime, dir: &Path) -> Result<CgroupDaemon, String> {
    let mount = cgroup2_mount().ok_or("no cgroup2 file system is mounted")?;
    if !mount.join("cgroup.procs").exists() || rustix::process::geteuid().as_raw() != 0 {
        return Err(format!(
            "the cgroup2 mount {} is not writable by this user",
            mount.display()
        ));
    }
    let root = mount.join(format!("zygote-bench-{}", std::process::id()));
    let socket = dir.join("zygote-cgroup.sock");
    let (process, client) = serve(runtime, &socket, &["--cgroup".as_ref(), root.as_ref()])
        .map_err(|error| format!("the daemon with --cgroup: {error}"))?;
    let daemon = CgroupDaemon {
        process,
        client,
        root,
    };
    // The daemon falls back to no subtree only without --cgroup; with it,
    // it refuses to start. Check that children really get cgroups.
    if !daemon.root.join("peers").is_dir() {
        return Err(format!("{} has no peers/ subtree", daemon.root.display()));
    }
    Ok(daemon)
}

/// How a spawn went through the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// posix_spawn + waitpid from the C helper.
    Floor,
    /// The shared daemon without a subtree: the child shares its cgroup.
    Off,
    /// A plain spawn, placed in a spare cgroup.
    Placed,
    /// Whole-tree kill asked for: a fresh cgroup, accounting, removal.
    TreeKill,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Placement::Floor => "floor: posix_spawn, tiny C",
            Placement::Off => "zygote, shared, no cgroup",
            Placement::Placed => "zygote, shared, cgroup per child",
            Placement::TreeKill => "zygote, shared, cgroup + kill_tree",
        }
    }
}

/// One row of the table.
#[derive(Debug, Serialize)]
pub struct Row {
    /// `dynamic` or `static`.
    pub child: &'static str,
    /// How it was spawned.
    pub placement: Placement,
    /// The numbers.
    #[serde(flatten)]
    pub summary: Summary,
    /// p50 over the floor's p50 in the same rounds.
    pub p50_vs_floor: f64,
}

/// The section of the report: rows, or why there are none.
#[derive(Debug, Serialize)]
pub struct CgroupCost {
    /// Measured rows.
    pub rows: Vec<Row>,
    /// Why nothing was measured.
    pub skipped: Option<String>,
}

impl CgroupCost {
    /// Not measured, because of `reason`.
    pub fn skipped(reason: String) -> Self {
        Self {
            rows: Vec::new(),
            skipped: Some(reason),
        }
    }

    /// The target, per child: placement adds at most 0.05 to the
    /// ratio to the floor.
    pub fn targets(&self) -> Vec<Target> {
        ["dynamic", "static"]
            .into_iter()
            .filter_map(|child| {
                let ratio = |placement| {
                    self.rows
                        .iter()
                        .find(|row| row.child == child && row.placement == placement)
                        .map(|row| row.p50_vs_floor)
                };
                let added = ratio(Placement::Placed)? - ratio(Placement::Off)?;
                Some(Target {
                    name: format!(
                        "{child}: cgroup per child, added p50 / floor p50, shared daemon, c=1"
                    ),
                    value: added,
                    target: format!("<= {BUDGET:.2}"),
                    met: added <= BUDGET,
                })
            })
            .collect()
    }

    /// The markdown section.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "\n#### cgroup per child\n\nThe shared daemon without a cgroup subtree, and a \
             second one with `--cgroup`, at concurrency 1, in rounds taking turns with the \
             floor. *placed*: a plain spawn, started in a spare cgroup with \
             `CLONE_INTO_CGROUP`; *kill_tree*: a fresh cgroup per child, tree accounting at \
             exit, then removal.\n\n",
        );
        if let Some(reason) = &self.skipped {
            out.push_str(&format!("Not measured: {reason}.\n"));
            return out;
        }
        out.push_str(
            "| child | method | n | p50 ms | p99 ms | p50 ×floor |\n|---|---|---|---|---|---|\n",
        );
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {:.3} | {:.3} | {:.2} |\n",
                row.child,
                row.placement.name(),
                row.summary.n,
                row.summary.p50_us / 1e3,
                row.summary.p99_us / 1e3,
                row.p50_vs_floor
            ));
        }
        out
    }
}

/// Measures every placement for each child, `rounds` rounds of
/// `iterations / rounds` spawns each.
///
/// # Errors
///
/// The first spawn or wait error.
pub fn measure(
    bench: &mut Bench,
    daemon: &CgroupDaemon,
    children: &[(&'static str, PathBuf)],
    iterations: usize,
    rounds: usize,
) -> Result<CgroupCost> {
    const ORDER: [Placement; 4] = [
        Placement::Floor,
        Placement::Off,
        Placement::Placed,
        Placement::TreeKill,
    ];
    let rounds = rounds.max(1);
    let mut rows = Vec::new();
    for (child, program) in children {
        eprintln!("zygote-bench: cgroup per child, {child}");
        let mut runs: Vec<CellRun> = ORDER.iter().map(|_| CellRun::default()).collect();
        for _ in 0..rounds {
            for (placement, run) in ORDER.iter().zip(&mut runs) {
                let budget = Budget {
                    n: (iterations / rounds).max(1),
                    concurrency: 1,
                    deadline: Instant::now() + Duration::from_secs(3),
                };
                let round = match placement {
                    Placement::Floor => bench.floor.run(program, budget.n, 1)?,
                    Placement::Off => bench.runtime.block_on(methods::run_zygote(
                        &bench.zygotes.shared,
                        program,
                        budget,
                        |_| {},
                    ))?,
                    Placement::Placed => bench.runtime.block_on(methods::run_zygote(
                        &daemon.client,
                        program,
                        budget,
                        |_| {},
                    ))?,
                    Placement::TreeKill => bench.runtime.block_on(methods::run_zygote(
                        &daemon.client,
                        program,
                        budget,
                        |command| {
                            command.kill_tree(true);
                        },
                    ))?,
                };
                run.absorb(round);
            }
        }
        let floor = Summary::of(&runs[0]);
        for (placement, run) in ORDER.into_iter().zip(&runs) {
            let summary = Summary::of(run);
            rows.push(Row {
                child,
                placement,
                p50_vs_floor: summary.p50_us / floor.p50_us,
                summary,
            });
        }
    }
    Ok(CgroupCost {
        rows,
        skipped: None,
    })
}

fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mount_point = before.split_whitespace().nth(4)?;
        (after.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

/// Removes a cgroup directory tree, leaves first (cgroupfs refuses to
/// remove a directory that still has children).
fn remove_tree(path: &Path) {
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(path);
}
