//! The six ways to spawn + wait a child, each timed the same way.

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::pin::Pin;
use std::process::{ChildStdin, ChildStdout, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::task::JoinSet;
use zygote_client::Client;

use crate::error::{Error, Result};
use crate::sys;

/// A way to start the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// posix_spawn + waitpid from a tiny C helper: the floor.
    Floor,
    /// std `Command` from the large parent: posix_spawn (vfork) path.
    StdSpawn,
    /// std `Command` with a no-op `pre_exec`: fork + exec path.
    StdFork,
    /// zygote: the shared daemon (`zygote serve`).
    ZygoteShared,
    /// zygote: a private zygote launched by this process.
    ZygotePrivate,
    /// zygote: a template forked from this process at the start of main.
    ZygoteTemplate,
    /// zygote: the shared daemon, through the blocking client.
    ZygoteSharedBlocking,
    /// zygote: a second launched private zygote, through the blocking
    /// client.
    ZygotePrivateBlocking,
    /// zygote: a second forked template, through the blocking client.
    ZygoteTemplateBlocking,
    /// zygote: the root shared daemon, from a client process running as
    /// uid 65534 (its children switch to that uid).
    ZygoteSharedNonRoot,
    /// zygote: a daemon whose policy confines each child with seccomp
    /// (`default`) and Landlock only.
    ZygoteSandboxFilters,
    /// zygote: a daemon whose policy confines each child in a full
    /// sandbox: network none, new pid/ipc/uts namespaces, a read-only
    /// system on a tmpfs root, seccomp and Landlock.
    ZygoteSandboxFull,
    /// zygote: a daemon whose policy confines each child as the full
    /// sandbox does but for `isolate`: its root and mounts, network none,
    /// seccomp and Landlock, in the pid namespace of the host.
    ZygoteSandboxMounts,
    /// zygote: the shared daemon running the child under `bwrap` (its
    /// own root bound read-only, /dev, /proc, new pid/ipc/uts
    /// namespaces), the wrapper a sandbox in the daemon replaces.
    ZygoteBwrap,
}

impl Method {
    /// Every method, in table order.
    pub const ALL: [Method; 14] = [
        Method::Floor,
        Method::StdSpawn,
        Method::StdFork,
        Method::ZygoteShared,
        Method::ZygotePrivate,
        Method::ZygoteTemplate,
        Method::ZygoteSharedBlocking,
        Method::ZygotePrivateBlocking,
        Method::ZygoteTemplateBlocking,
        Method::ZygoteSharedNonRoot,
        Method::ZygoteSandboxFilters,
        Method::ZygoteSandboxFull,
        Method::ZygoteSandboxMounts,
        Method::ZygoteBwrap,
    ];

    /// Every zygote method without a sandbox.
    pub const ZYGOTES: [Method; 7] = [
        Method::ZygoteShared,
        Method::ZygotePrivate,
        Method::ZygoteTemplate,
        Method::ZygoteSharedBlocking,
        Method::ZygotePrivateBlocking,
        Method::ZygoteTemplateBlocking,
        Method::ZygoteSharedNonRoot,
    ];

    /// The name for `--methods`.
    pub fn key(self) -> &'static str {
        match self {
            Method::Floor => "floor",
            Method::StdSpawn => "std-spawn",
            Method::StdFork => "std-fork",
            Method::ZygoteShared => "zygote-shared",
            Method::ZygotePrivate => "zygote-private",
            Method::ZygoteTemplate => "zygote-template",
            Method::ZygoteSharedBlocking => "zygote-shared-blocking",
            Method::ZygotePrivateBlocking => "zygote-private-blocking",
            Method::ZygoteTemplateBlocking => "zygote-template-blocking",
            Method::ZygoteSharedNonRoot => "zygote-shared-nonroot",
            Method::ZygoteSandboxFilters => "zygote-sandbox-filters",
            Method::ZygoteSandboxFull => "zygote-sandbox-full",
            Method::ZygoteSandboxMounts => "zygote-sandbox-mounts",
            Method::ZygoteBwrap => "zygote-bwrap",
        }
    }

    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Method::Floor => "floor: posix_spawn, tiny C",
            Method::StdSpawn => "std Command (posix_spawn)",
            Method::StdFork => "std Command + pre_exec (fork)",
            Method::ZygoteShared => "zygote, shared daemon",
            Method::ZygotePrivate => "zygote, private launched",
            Method::ZygoteTemplate => "zygote, forked template",
            Method::ZygoteSharedBlocking => "zygote, shared daemon, blocking",
            Method::ZygotePrivateBlocking => "zygote, private launched, blocking",
            Method::ZygoteTemplateBlocking => "zygote, forked template, blocking",
            Method::ZygoteSharedNonRoot => "zygote, shared daemon, client uid 65534",
            Method::ZygoteSandboxFilters => "zygote, sandbox: seccomp + Landlock",
            Method::ZygoteSandboxFull => "zygote, sandbox: full, network none",
            Method::ZygoteSandboxMounts => "zygote, sandbox: full but isolate",
            Method::ZygoteBwrap => "zygote, child wrapped in bwrap",
        }
    }
}

/// One spawn + wait.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// From the call until the exit is seen.
    pub latency: Duration,
    /// How long the calling thread was busy with it: the whole `spawn()`
    /// call for std, the time inside the spawn and wait futures' polls for
    /// the async zygote client. None for the floor.
    pub blocked: Option<Duration>,
}

/// The samples of one cell, and its wall time.
#[derive(Debug, Default)]
pub struct CellRun {
    /// One per spawn.
    pub samples: Vec<Sample>,
    /// From the first spawn to the last exit.
    pub wall: Duration,
    /// CPU time of the calling thread over the whole cell (async zygote
    /// methods only; includes the client's reader task, which runs on the
    /// same thread).
    pub cpu: Option<Duration>,
    /// CPU time of the whole client process over the cell (zygote
    /// methods): every thread of it, the blocking client's included.
    pub client_cpu: Option<Duration>,
    /// Involuntary context switches of the calling thread over the cell
    /// (async zygote methods): preemptions, e.g. by the zygote's thread
    /// woken on the client's CPU inside the client's `sendmsg`.
    pub involuntary_switches: Option<u64>,
    /// CPU time of the zygote process over the cell (every thread of it;
    /// its children's time is theirs, not counted).
    pub zygote_cpu: Option<Duration>,
}

fn add(mine: Option<Duration>, theirs: Option<Duration>) -> Option<Duration> {
    match (mine, theirs) {
        (Some(mine), Some(theirs)) => Some(mine + theirs),
        (mine, theirs) => mine.or(theirs),
    }
}

impl CellRun {
    /// Adds another round of the same cell.
    pub fn absorb(&mut self, round: CellRun) {
        self.cpu = add(self.cpu, round.cpu);
        self.client_cpu = add(self.client_cpu, round.client_cpu);
        self.involuntary_switches = match (self.involuntary_switches, round.involuntary_switches) {
            (Some(mine), Some(theirs)) => Some(mine + theirs),
            (mine, theirs) => mine.or(theirs),
        };
        self.zygote_cpu = add(self.zygote_cpu, round.zygote_cpu);
        self.samples.extend(round.samples);
        self.wall += round.wall;
    }
}

/// The floor helper process, started while the bench is still small.
pub struct Floor {
    child: std::process::Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Floor {
    /// Starts the compiled helper at `binary`.
    ///
    /// # Errors
    ///
    /// When it cannot be started.
    pub fn start(binary: &Path) -> Result<Self> {
        let mut child = std::process::Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(Error::io("starting the floor helper"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// `n` spawns of `program`, `concurrency` at a time, in the helper.
    ///
    /// # Errors
    ///
    /// When the helper fails or answers nonsense.
    pub fn run(&mut self, program: &Path, n: usize, concurrency: usize) -> Result<CellRun> {
        writeln!(self.stdin, "{} {n} {concurrency}", program.display())
            .and_then(|()| self.stdin.flush())
            .map_err(Error::io("writing to the floor helper"))?;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(Error::io("reading the floor helper"))?;
        let samples = line
            .split_whitespace()
            .map(|ns| {
                ns.parse::<u64>().map(|ns| Sample {
                    latency: Duration::from_nanos(ns),
                    blocked: None,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| Error::Floor(format!("unexpected answer {line:?}")))?;
        line.clear();
        self.stdout
            .read_line(&mut line)
            .map_err(Error::io("reading the floor helper"))?;
        let wall = line
            .strip_prefix("wall ")
            .and_then(|ns| ns.trim().parse().ok())
            .map(Duration::from_nanos)
            .ok_or_else(|| Error::Floor(format!("unexpected wall line {line:?}")))?;
        Ok(CellRun {
            samples,
            wall,
            ..CellRun::default()
        })
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// When a cell stops: after `n` spawns, or once `deadline` has passed
/// (each worker still does at least one).
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Spawns wanted.
    pub n: usize,
    /// Spawns in flight.
    pub concurrency: usize,
    /// No new spawn starts after this.
    pub deadline: Instant,
}

/// `budget.concurrency` threads, each calling `spawn_and_wait` in turn
/// until the budget is spent, as a synchronous program would.
fn run_threads<E: Send>(
    budget: Budget,
    spawn_and_wait: impl Fn() -> Result<Sample, E> + Sync,
) -> Result<CellRun, E> {
    let taken = AtomicUsize::new(0);
    let started = Instant::now();
    let per_thread = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..budget.concurrency)
            .map(|_| {
                scope.spawn(|| -> Result<Vec<Sample>, E> {
                    let mut samples = Vec::new();
                    while taken.fetch_add(1, Ordering::Relaxed) < budget.n
                        && (samples.is_empty() || Instant::now() < budget.deadline)
                    {
                        samples.push(spawn_and_wait()?);
                    }
                    Ok(samples)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("spawning thread panicked"))
            .collect::<Result<Vec<_>, E>>()
    })?;
    Ok(CellRun {
        samples: per_thread.into_iter().flatten().collect(),
        wall: started.elapsed(),
        ..CellRun::default()
    })
}

/// std `Command` from this (large) process, `concurrency` threads.
///
/// # Errors
///
/// The first spawn or wait error.
pub fn run_std(program: &Path, fork_path: bool, budget: Budget) -> Result<CellRun> {
    run_threads(budget, || {
        let mut command = std::process::Command::new(program);
        if fork_path {
            sys::force_fork_path(&mut command);
        }
        let start = Instant::now();
        let mut child = command.spawn()?;
        let blocked = start.elapsed();
        child.wait()?;
        Ok(Sample {
            latency: start.elapsed(),
            blocked: Some(blocked),
        })
    })
    .map_err(Error::io("std Command spawn"))
}

/// Through a zygote `client`, `concurrency` tasks on the current
/// (single-threaded) runtime; `configure` adds options to each command.
///
/// # Errors
///
/// The first spawn or wait error.
pub async fn run_zygote(
    client: &Client,
    program: &Path,
    budget: Budget,
    configure: fn(&mut zygote_client::Command),
) -> Result<CellRun> {
    run_zygote_with_args(client, program, Arc::from([]), budget, configure).await
}

/// As [`run_zygote`], with these arguments for each child.
///
/// # Errors
///
/// The first spawn or wait error.
pub async fn run_zygote_with_args(
    client: &Client,
    program: &Path,
    args: Arc<[std::ffi::OsString]>,
    budget: Budget,
    configure: fn(&mut zygote_client::Command),
) -> Result<CellRun> {
    let taken = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let cpu_before = thread_cpu();
    let switches_before = sys::thread_involuntary_switches();
    let mut tasks = JoinSet::new();
    for _ in 0..budget.concurrency {
        let client = client.clone();
        let program = program.to_owned();
        let taken = Arc::clone(&taken);
        let args = Arc::clone(&args);
        tasks.spawn(async move {
            let mut samples = Vec::new();
            while taken.fetch_add(1, Ordering::Relaxed) < budget.n
                && (samples.is_empty() || Instant::now() < budget.deadline)
            {
                let mut blocked = Duration::ZERO;
                let start = Instant::now();
                let mut command = client.command(&program);
                command.args(args.iter());
                configure(&mut command);
                // status(), as a caller that only wants the exit status
                // would: the zygote may then skip `Spawned`.
                Timed::new(command.status(), &mut blocked).await?;
                samples.push(Sample {
                    latency: start.elapsed(),
                    blocked: Some(blocked),
                });
            }
            Ok::<_, zygote_client::Error>(samples)
        });
    }
    let mut samples = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        samples.extend(joined.expect("zygote task panicked")?);
    }
    Ok(CellRun {
        wall: started.elapsed(),
        cpu: Some(thread_cpu().saturating_sub(cpu_before)),
        involuntary_switches: switches_before
            .and_then(|before| Some(sys::thread_involuntary_switches()?.saturating_sub(before))),
        samples,
        ..CellRun::default()
    })
}

/// The threads that call the blocking client, started once and kept from
/// round to round, as a program's own long-lived threads would be.
///
/// Starting `concurrency` new threads per round, as `run_threads` does,
/// charged their creation, their stacks' first-touch faults (glibc drops
/// a dead thread's stack pages) and their exits to the blocking methods,
/// at 200 spawns per round of c=50 one new thread per 4 spawns: 10 to 25
/// µs of client CPU per spawn that neither the floor (one C thread) nor
/// the async client (tasks) pays.
pub struct Callers {
    threads: Vec<Caller>,
}

struct Caller {
    jobs: std::sync::mpsc::Sender<Job>,
    thread: std::thread::JoinHandle<()>,
}

type Job = Box<dyn FnOnce() + Send>;

impl Callers {
    /// Starts `count` idle threads.
    ///
    /// # Errors
    ///
    /// When a thread cannot be started.
    pub fn start(count: usize) -> Result<Self> {
        let threads = (0..count)
            .map(|index| {
                let (jobs, queue) = std::sync::mpsc::channel::<Job>();
                let thread = std::thread::Builder::new()
                    .name(format!("blocking-caller-{index}"))
                    .spawn(move || {
                        for job in queue {
                            job();
                        }
                    })
                    .map_err(Error::io("starting a blocking caller thread"))?;
                Ok(Caller { jobs, thread })
            })
            .collect::<Result<_>>()?;
        Ok(Self { threads })
    }

    /// `budget.concurrency` of the threads, each calling `status()` in turn
    /// until the budget is spent (as `run_threads`, without starting them).
    fn run(
        &self,
        client: &zygote_client::blocking::Client,
        program: &Path,
        budget: Budget,
    ) -> Result<CellRun> {
        assert!(
            budget.concurrency <= self.threads.len(),
            "the blocking callers were started for a lower concurrency"
        );
        let taken = Arc::new(AtomicUsize::new(0));
        let (results, finished) = std::sync::mpsc::channel();
        let started = Instant::now();
        for caller in &self.threads[..budget.concurrency] {
            let (taken, results) = (Arc::clone(&taken), results.clone());
            let (client, program) = (client.clone(), program.to_path_buf());
            let job: Job = Box::new(move || {
                let mut samples = Vec::new();
                let outcome = loop {
                    if taken.fetch_add(1, Ordering::Relaxed) >= budget.n
                        || (!samples.is_empty() && Instant::now() >= budget.deadline)
                    {
                        break Ok(samples);
                    }
                    let start = Instant::now();
                    // status(), which blocks until the exit: no separate
                    // blocked time.
                    if let Err(error) = client.command(&program).status() {
                        break Err(error);
                    }
                    samples.push(Sample {
                        latency: start.elapsed(),
                        blocked: None,
                    });
                };
                let _ = results.send(outcome);
            });
            caller
                .jobs
                .send(job)
                .expect("blocking caller threads live as long as the pool");
        }
        drop(results);
        let mut run = CellRun::default();
        for _ in 0..budget.concurrency {
            let samples = finished
                .recv()
                .expect("every blocking caller reports, or panics the bench")?;
            run.samples.extend(samples);
        }
        run.wall = started.elapsed();
        Ok(run)
    }
}

impl Drop for Callers {
    fn drop(&mut self) {
        for Caller { jobs, thread } in self.threads.drain(..) {
            drop(jobs);
            let _ = thread.join();
        }
    }
}

/// The blocking client: `status()` from `budget.concurrency` of
/// `callers`' threads.
///
/// # Errors
///
/// The first spawn or wait error.
pub fn run_blocking(
    callers: &Callers,
    client: &zygote_client::blocking::Client,
    program: &Path,
    budget: Budget,
) -> Result<CellRun> {
    callers.run(client, program, budget)
}

/// CPU time of the calling thread.
pub fn thread_cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// A future that adds the time spent inside its `poll` calls to a
/// counter: how long it kept the calling thread busy, waiting excluded.
struct Timed<'a, F> {
    inner: Pin<Box<F>>,
    spent: &'a mut Duration,
}

impl<'a, F> Timed<'a, F> {
    fn new(inner: F, spent: &'a mut Duration) -> Self {
        Self {
            inner: Box::pin(inner),
            spent,
        }
    }
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let start = Instant::now();
        let result = self.inner.as_mut().poll(cx);
        *self.spent += start.elapsed();
        result
    }
}
