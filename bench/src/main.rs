//! `zygote-bench`: spawn + wait of the same child by six methods, side by
//! side in one run, from a parent grown to the sizes asked for; plus the
//! parent's own cost (calling-thread block, copy-on-write tax) and the
//! zygote's size. Prints markdown, writes JSON with `--json`.
//!
//! See the README's "Benchmark" section for how to read it.

mod ballast;
mod error;
mod helpers;
mod methods;
mod report;
mod stats;
mod sys;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use zygote_client::Client;

use ballast::{Fds, Memory};
use error::{Error, Result};
use methods::{Budget, CellRun, Floor, Method};
use report::{Cell, Cow, Meta, Report, Resident, Target};
use stats::Summary;

/// Fds kept free for pipes, pidfds and sockets while the parent holds
/// "max" fds (50 spawns in flight need a few each).
const FD_HEADROOM: usize = 300;

/// Measures spawn + wait by posix_spawn (floor), std Command (both paths)
/// and zygote (shared, private, template) from a parent of growing size.
#[derive(Debug, Parser)]
#[command(name = "zygote-bench", version)]
struct Args {
    /// Parent sizes: GiB of touched memory, grown in this order.
    #[arg(long, value_delimiter = ',', default_value = "0,1,4,8")]
    rss_gib: Vec<usize>,
    /// Extra open fds in the parent: numbers, or `max` (the hard
    /// RLIMIT_NOFILE minus headroom; the soft limit is raised to it).
    #[arg(long, value_delimiter = ',', default_value = "0,10000,max")]
    fds: Vec<String>,
    /// Spawns in flight at once.
    #[arg(long, value_delimiter = ',', default_value = "1,8,50")]
    concurrency: Vec<usize>,
    /// Spawns per cell (fewer when --cell-seconds runs out first).
    #[arg(long, default_value_t = 400)]
    iterations: usize,
    /// Time budget per cell: no new spawn starts after it (the fork path
    /// from 8 GiB takes ~0.25 s per spawn).
    #[arg(long, default_value_t = 3.0)]
    cell_seconds: f64,
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
    /// std-fork, zygote-shared, zygote-private, zygote-template.
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,
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
    // First, while this process is small and has only one thread.
    let template = match zygote::template::fork_template() {
        Ok(template) => template,
        Err(error) => {
            eprintln!("zygote-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let args = Args::parse();
    match run(template, &args) {
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

/// The zygote clients, one per mode, and the shared daemon's process.
struct Zygotes {
    shared: Client,
    private: Client,
    template: Client,
    daemon: Child,
    private_pid: Option<u32>,
    template_pid: u32,
}

impl Drop for Zygotes {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

struct Bench {
    runtime: tokio::runtime::Runtime,
    floor: Floor,
    zygotes: Zygotes,
}

impl Bench {
    fn run_cell(&mut self, method: Method, program: &Path, budget: Budget) -> Result<CellRun> {
        let client = match method {
            Method::Floor => return self.floor.run(program, budget.n, budget.concurrency),
            Method::StdSpawn => return methods::run_std(program, false, budget),
            Method::StdFork => return methods::run_std(program, true, budget),
            Method::ZygoteShared => &self.zygotes.shared,
            Method::ZygotePrivate => &self.zygotes.private,
            Method::ZygoteTemplate => &self.zygotes.template,
        };
        self.runtime
            .block_on(methods::run_zygote(client, program, budget))
    }
}

fn run(template: zygote::template::Template, args: &Args) -> Result<Report> {
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
    let zygotes = start_zygotes(&runtime, template, dir.path())?;
    let mut bench = Bench {
        runtime,
        floor,
        zygotes,
    };
    let meta = meta(static_kind);

    let resident = measure_resident(&bench, args.resident_children)?;

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
                    let mut floor_summary = None;
                    for method in Method::ALL {
                        if !args.wants(method) {
                            continue;
                        }
                        eprintln!(
                            "zygote-bench: {child} rss={rss} fds={fds} c={concurrency} {}",
                            method.name()
                        );
                        let budget = Budget {
                            n: args.iterations.max(concurrency),
                            concurrency,
                            deadline: Instant::now() + Duration::from_secs_f64(args.cell_seconds),
                        };
                        let summary = Summary::of(&bench.run_cell(method, program, budget)?);
                        let floor: &Summary = floor_summary.get_or_insert_with(|| summary.clone());
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

    let targets = evaluate(&cells, &cow, &resident, args);
    Ok(Report {
        meta,
        cells,
        cow,
        resident,
        targets,
    })
}

fn start_zygotes(
    runtime: &tokio::runtime::Runtime,
    template: zygote::template::Template,
    dir: &Path,
) -> Result<Zygotes> {
    let binary = zygote_client::private::find_binary()?;
    let socket = dir.join("zygote.sock");
    let daemon = Command::new(&binary)
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(Error::io(format!("starting {}", binary.display())))?;
    let daemon_pid = daemon.id();
    let template_pid = template.pid().unsigned_abs();
    let (shared, private, template) = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        let shared = loop {
            match Client::connect(&socket).await {
                Ok(client) => break client,
                Err(error) if Instant::now() > deadline => return Err(Error::from(error)),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let private = Client::launch_private().await?;
        let template = template.client().await?;
        Ok::<_, Error>((shared, private, template))
    })?;
    Ok(Zygotes {
        shared,
        private,
        template,
        daemon,
        private_pid: private_zygote_pid(daemon_pid),
        template_pid,
    })
}

/// The launched private zygote: our child named `zygote` that is not the
/// shared daemon.
fn private_zygote_pid(daemon_pid: u32) -> Option<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let comm = &stat[stat.find('(')? + 1..stat.rfind(')')?];
            let ppid: u32 = stat[stat.rfind(')')? + 2..]
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == me && comm == "zygote" && pid != daemon_pid).then_some(pid)
        })
}

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Each zygote's RSS while `count` children (`cat`, waiting on a pipe
/// from us) run.
fn measure_resident(bench: &Bench, count: usize) -> Result<Vec<Resident>> {
    let zygotes = &bench.zygotes;
    let list = [
        (
            Method::ZygoteShared,
            &zygotes.shared,
            Some(zygotes.daemon.id()),
        ),
        (Method::ZygotePrivate, &zygotes.private, zygotes.private_pid),
        (
            Method::ZygoteTemplate,
            &zygotes.template,
            Some(zygotes.template_pid),
        ),
    ];
    let mut resident = Vec::new();
    for (method, client, pid) in list {
        let Some(pid) = pid else {
            eprintln!("zygote-bench: cannot find the pid of {}", method.name());
            continue;
        };
        let rss_kib = bench.runtime.block_on(async {
            let mut children = Vec::with_capacity(count);
            for _ in 0..count {
                let child = client
                    .command("cat")
                    .stdin(zygote_client::Stdio::piped())
                    .stdout(zygote_client::Stdio::null())
                    .spawn()
                    .await?;
                children.push(child);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let rss = vm_rss_kib(pid).unwrap_or(0);
            for child in &mut children {
                drop(child.stdin.take());
            }
            for child in &mut children {
                child.wait().await?;
            }
            Ok::<_, Error>(rss)
        })?;
        resident.push(Resident {
            method,
            children: count,
            rss_kib,
        });
    }
    Ok(resident)
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
    for method in Method::ALL
        .into_iter()
        .filter(|m| *m != Method::Floor && wants(*m))
    {
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

const ZYGOTES: [Method; 3] = [
    Method::ZygoteShared,
    Method::ZygotePrivate,
    Method::ZygoteTemplate,
];

/// The issue's targets, from the largest parent measured.
fn evaluate(cells: &[Cell], cow: &[Cow], resident: &[Resident], args: &Args) -> Vec<Target> {
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
