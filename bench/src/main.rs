//! `zygote-bench`: spawn + wait of the same child by six methods, side by
//! side in one run, from a parent grown to the sizes asked for; plus the
//! parent's own cost (calling-thread block, copy-on-write tax) and the
//! zygote's size. Prints markdown, writes JSON with `--json`.
//!
//! BENCHMARKS.md says how to read it.
//!
//! # Layout
//!
//! - this file: flags, the run loop over conditions, the CoW tax;
//! - `helpers`: the C floor helper and static child, built with `cc`;
//! - `zygotes`: starting the three zygotes, and their size;
//! - `cgroups`: the cost of a cgroup per child (a second shared daemon);
//! - `sandboxes`: daemons confining each child (seccomp + Landlock; the
//!   full sandbox, with and without `isolate`), and the `bwrap` wrapper
//!   they replace;
//! - `methods`: the six ways to spawn + wait, each timed the same way;
//! - `ballast`: growing the parent (memory, fds);
//! - `stats`, `report`, `targets`: summaries, markdown/JSON, the
//!   targets;
//! - `sys`: the one `unsafe` (std's fork path).

mod ballast;
mod cgroups;
mod error;
mod helpers;
mod methods;
mod nonroot;
mod report;
mod sandboxes;
mod serve;
mod stats;
mod sys;
mod targets;
mod zygotes;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::Parser;

use ballast::{Fds, Memory};
use error::{Error, Result};
use methods::{Budget, CellRun, Floor, Method};
use report::{Cell, Cow, Meta, Report};
use stats::Summary;
use zygotes::Zygotes;

/// Fds kept free for pipes, pidfds and sockets while the parent holds
/// "max" fds (50 spawns in flight need a few each).
const FD_HEADROOM: usize = 300;

/// Measures spawn + wait by posix_spawn (floor), std Command (both paths)
/// and zygote (shared, private, template) from a parent of growing size.
#[derive(Debug, Parser)]
#[command(name = "zygote-bench", version)]
pub(crate) struct Args {
    /// Parent sizes: GiB of touched memory, grown in this order.
    #[arg(long, value_delimiter = ',', default_value = "0,1,4,8")]
    rss_gib: Vec<usize>,
    /// Extra open fds in the parent: numbers, or `max` (the hard
    /// RLIMIT_NOFILE minus headroom; the soft limit is raised to it).
    #[arg(long, value_delimiter = ',', default_value = "0,10000,max")]
    fds: Vec<String>,
    /// Spawns in flight at once.
    #[arg(long, value_delimiter = ',', default_value = "1,8,50")]
    pub(crate) concurrency: Vec<usize>,
    /// Spawns per cell (fewer when --cell-seconds runs out first).
    #[arg(long, default_value_t = 400)]
    iterations: usize,
    /// Time budget per cell: no new spawn starts after it (the fork path
    /// from 8 GiB takes ~0.25 s per spawn).
    #[arg(long, default_value_t = 3.0)]
    cell_seconds: f64,
    /// Rounds per cell: the methods take turns this many times, so that
    /// the machine's drift cancels out of the ratios (fewer when a round
    /// would hold under four times the concurrency).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Measure every combination of fds and concurrency; by default
    /// concurrency is swept only with the first fds value, and fds only at
    /// the first concurrency.
    #[arg(long)]
    full: bool,
    /// Rounds per method for the copy-on-write tax (each: rewrite, spawn,
    /// rewrite).
    #[arg(long, default_value_t = 7)]
    cow_rounds: usize,
    /// Children kept running while each zygote's RSS is read.
    #[arg(long, default_value_t = 100)]
    resident_children: usize,
    /// Only these methods besides the floor (for profiling one): std-spawn,
    /// std-fork, zygote-shared, zygote-private, zygote-template,
    /// zygote-shared-blocking, zygote-private-blocking,
    /// zygote-template-blocking, zygote-shared-nonroot,
    /// zygote-sandbox-filters, zygote-sandbox-full, zygote-sandbox-mounts,
    /// zygote-bwrap.
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,
    /// Rounds of the cgroup-per-child comparison (shared daemon with and
    /// without a cgroup subtree, concurrency 1, --iterations spawns per
    /// method and child); 0 skips it.
    #[arg(long, default_value_t = 5)]
    cgroup_rounds: usize,
    /// Also write the results as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

impl Args {
    fn wants(&self, method: Method) -> bool {
        method == Method::Floor
            || self.methods.is_empty()
            || self.methods.iter().any(|name| name == method.key())
    }
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os().skip(1);
    if argv.next().is_some_and(|first| first == nonroot::FLAG) {
        return nonroot::helper_main(argv.next().unwrap_or_default().into());
    }
    // First, while this process is small and has only one thread: one
    // template for the async client, one for the blocking one.
    let templates = match zygote::template::fork_template()
        .and_then(|first| Ok([first, zygote::template::fork_template()?]))
    {
        Ok(templates) => templates,
        Err(error) => {
            eprintln!("zygote-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let args = Args::parse();
    match run(templates, &args) {
        Ok(report) => {
            print!("{}", report.markdown());
            if let Some(path) = &args.json {
                let json = serde_json::to_string_pretty(&report).expect("serializable");
                if let Err(error) = std::fs::write(path, json + "\n") {
                    eprintln!("zygote-bench: failed to write {}: {error}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("zygote-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What the cells run on: the async runtime, the floor helper, the
/// zygotes.
pub(crate) struct Bench {
    /// Drives the zygote clients.
    pub(crate) runtime: tokio::runtime::Runtime,
    floor: Floor,
    pub(crate) zygotes: Zygotes,
    /// The threads that call the blocking clients.
    callers: methods::Callers,
    /// The sandbox daemons; `None` when they could not start (said once).
    sandboxes: Option<sandboxes::Sandboxes>,
}

impl Bench {
    /// Whether `method` can run here (the non-root client needs root).
    fn has(&self, method: Method) -> bool {
        match method {
            Method::ZygoteSharedNonRoot => self.zygotes.nonroot.is_some(),
            Method::ZygoteSandboxFilters
            | Method::ZygoteSandboxFull
            | Method::ZygoteSandboxMounts => self.sandboxes.is_some(),
            Method::ZygoteBwrap => self
                .sandboxes
                .as_ref()
                .is_some_and(|sandboxes| sandboxes.bwrap.is_some()),
            _ => true,
        }
    }

    fn run_cell(&mut self, method: Method, program: &Path, budget: Budget) -> Result<CellRun> {
        let zygotes = &mut self.zygotes;
        let sandboxes = self.sandboxes.as_ref();
        let zygote_pid = match method {
            Method::ZygoteSandboxFilters => sandboxes.map(|s| s.filters.pid()),
            Method::ZygoteSandboxFull => sandboxes.map(|s| s.full.pid()),
            Method::ZygoteSandboxMounts => sandboxes.map(|s| s.mounts.pid()),
            Method::ZygoteBwrap => zygotes.pid(Method::ZygoteShared),
            _ => zygotes.pid(method),
        };
        let zygote_before = zygote_pid.and_then(sys::zygote_cpu);
        let client_before = sys::own_cpu();
        let mut run = match method {
            Method::Floor => return self.floor.run(program, budget.n, budget.concurrency),
            Method::StdSpawn => return methods::run_std(program, false, budget),
            Method::StdFork => return methods::run_std(program, true, budget),
            Method::ZygoteShared => self.runtime.block_on(methods::run_zygote(
                &zygotes.shared,
                program,
                budget,
                |_| {},
            ))?,
            Method::ZygotePrivate => self.runtime.block_on(methods::run_zygote(
                &zygotes.private,
                program,
                budget,
                |_| {},
            ))?,
            Method::ZygoteTemplate => self.runtime.block_on(methods::run_zygote(
                &zygotes.template,
                program,
                budget,
                |_| {},
            ))?,
            Method::ZygoteSharedBlocking => {
                methods::run_blocking(&self.callers, &zygotes.shared_blocking, program, budget)?
            }
            Method::ZygotePrivateBlocking => {
                methods::run_blocking(&self.callers, &zygotes.private_blocking, program, budget)?
            }
            Method::ZygoteTemplateBlocking => {
                methods::run_blocking(&self.callers, &zygotes.template_blocking, program, budget)?
            }
            Method::ZygoteSharedNonRoot => match zygotes.nonroot.as_mut() {
                Some(helper) => helper.run(program, budget)?,
                None => return Ok(CellRun::default()),
            },
            Method::ZygoteSandboxFilters
            | Method::ZygoteSandboxFull
            | Method::ZygoteSandboxMounts => {
                let Some(sandboxes) = sandboxes else {
                    return Ok(CellRun::default());
                };
                let daemon = match method {
                    Method::ZygoteSandboxFull => &sandboxes.full,
                    Method::ZygoteSandboxMounts => &sandboxes.mounts,
                    _ => &sandboxes.filters,
                };
                // The sandbox's root holds the bench's own directory only
                // where the profile binds it: start in `/`.
                self.runtime.block_on(methods::run_zygote(
                    &daemon.client,
                    program,
                    budget,
                    |command| {
                        command.current_dir("/");
                    },
                ))?
            }
            Method::ZygoteBwrap => match sandboxes.and_then(|s| s.bwrap.as_deref()) {
                Some(bwrap) => self.runtime.block_on(sandboxes::run_bwrap(
                    &zygotes.shared,
                    bwrap,
                    program,
                    budget,
                ))?,
                None => return Ok(CellRun::default()),
            },
        };
        // The helper measured its own process; we are the client otherwise.
        if run.client_cpu.is_none() {
            run.client_cpu = Some(sys::own_cpu().saturating_sub(client_before));
        }
        run.zygote_cpu = zygote_before
            .zip(zygote_pid.and_then(sys::zygote_cpu))
            .map(|(before, after)| after.saturating_sub(before));
        Ok(run)
    }

    /// One cell per method, measured in rounds that take turns (floor,
    /// then each method, then the floor again...), so that drift in the
    /// machine's speed hits every method alike, at every concurrency.
    /// Each round runs at least four times `concurrency` spawns, so that
    /// ramp-up and drain stay a small part of it: a cell holds at least
    /// `rounds * 4 * concurrency`. `methods[0]` must be the floor.
    fn run_interleaved(
        &mut self,
        methods: &[Method],
        program: &Path,
        concurrency: usize,
        args: &Args,
    ) -> Result<Vec<CellRun>> {
        let rounds = args.rounds.max(1);
        let n = args.iterations.max(rounds * 4 * concurrency);
        let round_seconds = args.cell_seconds / rounds as f64;
        let mut runs: Vec<CellRun> = methods.iter().map(|_| CellRun::default()).collect();
        for round in 0..rounds {
            // Spread n over the rounds; the first rounds take the remainder.
            let share = n / rounds + usize::from(round < n % rounds);
            for (method, run) in methods.iter().zip(&mut runs) {
                let budget = Budget {
                    n: share.max(concurrency),
                    concurrency,
                    deadline: Instant::now() + Duration::from_secs_f64(round_seconds),
                };
                run.absorb(self.run_cell(*method, program, budget)?);
            }
        }
        Ok(runs)
    }
}

fn run(templates: [zygote::template::Template; 2], args: &Args) -> Result<Report> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::io("building the runtime"))?;
    let dir = tempfile::Builder::new()
        .prefix("zygote-bench-")
        .tempdir()
        .map_err(Error::io("creating a temp dir"))?;
    let (static_child, static_kind) = helpers::build_static_child(dir.path())?;
    let floor = Floor::start(&helpers::build_floor(dir.path())?)?;
    // The non-root client runs the static child from here and connects to
    // the socket here.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(Error::io("opening the temp dir to the non-root client"))?;
    let zygotes = zygotes::start_zygotes(&runtime, templates, dir.path())?;
    let cgroup_daemon = if args.cgroup_rounds > 0 {
        cgroups::start(&runtime, dir.path())
    } else {
        Err("--cgroup-rounds 0".to_owned())
    };
    let sandboxes = match sandboxes::start(&runtime, dir.path()) {
        Ok(sandboxes) => Some(sandboxes),
        Err(reason) => {
            eprintln!("zygote-bench: no sandbox cells: {reason}");
            None
        }
    };
    let callers = methods::Callers::start(args.concurrency.iter().copied().max().unwrap_or(1))?;
    let mut bench = Bench {
        runtime,
        floor,
        zygotes,
        callers,
        sandboxes,
    };
    let meta = meta(static_kind);

    let resident = zygotes::measure_resident(&bench, args.resident_children)?;

    let mut fd_table = Fds::new()?;
    let fd_levels = args
        .fds
        .iter()
        .map(|value| match value.as_str() {
            "max" => Ok(fd_table.max_extra(FD_HEADROOM)),
            number => number.parse().map_err(|_| Error::Flag {
                flag: "fds",
                value: value.clone(),
                reason: "expected a number or `max`",
            }),
        })
        .collect::<Result<Vec<usize>>>()?;
    let mut rss_levels = args.rss_gib.clone();
    rss_levels.sort_unstable();
    rss_levels.dedup();
    let children = [
        ("dynamic", PathBuf::from("/bin/true")),
        ("static", static_child),
    ];
    // While the parent is small: the daemons' cost does not depend on it.
    let cgroup = match &cgroup_daemon {
        Ok(daemon) => cgroups::measure(
            &mut bench,
            daemon,
            &children,
            args.iterations,
            args.cgroup_rounds,
        )?,
        Err(reason) => cgroups::CgroupCost::skipped(reason.clone()),
    };
    drop(cgroup_daemon);

    let mut memory = Memory::default();
    let mut cells = Vec::new();
    let mut cow = Vec::new();
    for &rss in &rss_levels {
        eprintln!("zygote-bench: growing to {rss} GiB");
        memory.grow_to(rss);
        for (fi, &fds) in fd_levels.iter().enumerate() {
            fd_table.set(fds)?;
            for (ci, &concurrency) in args.concurrency.iter().enumerate() {
                if !(args.full || fi == 0 || ci == 0) {
                    continue;
                }
                for (child, program) in &children {
                    let methods: Vec<Method> = Method::ALL
                        .into_iter()
                        .filter(|m| args.wants(*m) && bench.has(*m))
                        .collect();
                    eprintln!("zygote-bench: {child} rss={rss} fds={fds} c={concurrency}");
                    let runs = bench.run_interleaved(&methods, program, concurrency, args)?;
                    let floor = Summary::of(&runs[0]);
                    for (method, run) in methods.into_iter().zip(&runs) {
                        let summary = Summary::of(run);
                        cells.push(Cell {
                            child,
                            rss_gib: memory.gib(),
                            fds,
                            concurrency,
                            method,
                            p50_vs_floor: summary.p50_us / floor.p50_us,
                            throughput_vs_floor: summary.spawns_per_s / floor.spawns_per_s,
                            summary,
                        });
                    }
                }
            }
        }
        fd_table.set(0)?;
        if rss > 0 && args.cow_rounds > 0 {
            cow.extend(measure_cow(
                &mut bench,
                &mut memory,
                args.cow_rounds,
                |m| args.wants(m),
            )?);
        }
    }

    let mut targets = targets::evaluate(&cells, &cow, &resident, args);
    targets.extend(cgroup.targets());
    Ok(Report {
        meta,
        cells,
        cow,
        resident,
        cgroup,
        targets,
    })
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

/// Rewrite time after one spawn by each parent-side method, against the
/// same without a spawn. Each round measures both back to back, so that
/// other load on the machine hits both alike.
fn measure_cow(
    bench: &mut Bench,
    memory: &mut Memory,
    rounds: usize,
    wants: impl Fn(Method) -> bool,
) -> Result<Vec<Cow>> {
    eprintln!("zygote-bench: copy-on-write tax at {} GiB", memory.gib());
    let program = Path::new("/bin/true");
    // Earlier fork-path cells left pages write-protected: clear that.
    memory.rewrite();
    let mut baselines = Vec::new();
    let mut out = Vec::new();
    // The non-root client is another process: its CoW tax is not ours.
    for method in Method::ALL.into_iter().filter(|m| {
        !matches!(
            m,
            Method::Floor
                | Method::ZygoteSharedNonRoot
                | Method::ZygoteSandboxFilters
                | Method::ZygoteSandboxFull
                | Method::ZygoteSandboxMounts
                | Method::ZygoteBwrap
        ) && wants(*m)
    }) {
        let mut before = Vec::with_capacity(rounds);
        let mut after = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            before.push(memory.rewrite());
            let budget = Budget {
                n: 1,
                concurrency: 1,
                deadline: Instant::now(),
            };
            bench.run_cell(method, program, budget)?;
            after.push(memory.rewrite());
        }
        baselines.extend(before.iter().copied());
        let (before, after) = (median(before), median(after));
        out.push(Cow {
            rss_gib: memory.gib(),
            method: Some(method),
            rewrite_ms: after.as_secs_f64() * 1e3,
            vs_baseline: after.as_secs_f64() / before.as_secs_f64(),
        });
    }
    if !baselines.is_empty() {
        out.insert(
            0,
            Cow {
                rss_gib: memory.gib(),
                method: None,
                rewrite_ms: median(baselines).as_secs_f64() * 1e3,
                vs_baseline: 1.0,
            },
        );
    }
    Ok(out)
}

fn meta(static_kind: &str) -> Meta {
    let output = |program: &str, arg: &str| {
        Command::new(program)
            .arg(arg)
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    Meta {
        date: output("date", "-u"),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: output("uname", "-r"),
        release_build: !cfg!(debug_assertions),
        static_child: static_kind.to_owned(),
    }
}
