//! The non-root client: this binary again, run as uid 65534 and connected
//! to the root shared daemon, so that its children are started as another
//! uid than the daemon's (by the daemon's spawner process for that uid;
//! with `ZYGOTE_UID_SPAWNERS=0` in the bench's environment, by the fork
//! path). It spawns on the bench's request and answers with its samples,
//! as the floor helper does.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::methods::{self, Budget, CellRun, Sample};
use crate::sys;

/// The first argument that makes this binary the helper; the socket
/// path follows.
pub const FLAG: &str = "--nonroot-client-helper";

/// The helper's uid and gid.
pub const UID: u32 = 65534;

/// The helper process, seen from the bench.
pub struct NonRoot {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl NonRoot {
    /// Starts this binary as uid [`UID`], connected to `socket`.
    ///
    /// # Errors
    ///
    /// When it cannot start or does not connect.
    pub fn start(socket: &Path) -> Result<Self> {
        let exe = std::env::current_exe().map_err(Error::io("finding the bench's binary"))?;
        let mut child = std::process::Command::new(exe)
            .arg(FLAG)
            .arg(socket)
            .uid(UID)
            // std drops the supplementary groups when root sets a uid.
            .gid(UID)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(Error::io("starting the non-root client helper"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .map_err(Error::io("reading the non-root client helper"))?;
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Floor(format!(
                "the non-root client helper did not connect: {}",
                line.trim()
            )));
        }
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// One round of `program` in the helper; its CPU comes back in
    /// [`CellRun::client_cpu`].
    ///
    /// # Errors
    ///
    /// When the helper fails or answers nonsense.
    pub fn run(&mut self, program: &Path, budget: Budget) -> Result<CellRun> {
        let left = budget.deadline.saturating_duration_since(Instant::now());
        writeln!(
            self.stdin,
            "{} {} {} {}",
            program.display(),
            budget.n,
            budget.concurrency,
            left.as_nanos()
        )
        .and_then(|()| self.stdin.flush())
        .map_err(Error::io("writing to the non-root client helper"))?;
        let nonsense = |line: &str| Error::Floor(format!("non-root client helper: {line:?}"));
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(Error::io("reading the non-root client helper"))?;
        if let Some(error) = line.strip_prefix("error ") {
            return Err(Error::Floor(format!(
                "non-root client helper: {}",
                error.trim()
            )));
        }
        let samples = line
            .split_whitespace()
            .map(|pair| {
                let (latency, blocked) = pair.split_once('/')?;
                Some(Sample {
                    latency: Duration::from_nanos(latency.parse().ok()?),
                    blocked: Some(Duration::from_nanos(blocked.parse().ok()?)),
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| nonsense(&line))?;
        line.clear();
        self.stdout
            .read_line(&mut line)
            .map_err(Error::io("reading the non-root client helper"))?;
        let numbers: Vec<u64> = line
            .split_whitespace()
            .filter_map(|word| word.parse().ok())
            .collect();
        let [wall, cpu, client_cpu] = numbers[..] else {
            return Err(nonsense(&line));
        };
        Ok(CellRun {
            samples,
            wall: Duration::from_nanos(wall),
            cpu: Some(Duration::from_nanos(cpu)),
            client_cpu: Some(Duration::from_nanos(client_cpu)),
            involuntary_switches: None,
            zygote_cpu: None,
        })
    }
}

impl Drop for NonRoot {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The helper's `main`: connects to `socket`, says `ready`, then runs one
/// round per request line `PROGRAM N CONCURRENCY DEADLINE_NS`.
pub fn helper_main(socket: PathBuf) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            println!("error building a runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let client = match runtime.block_on(zygote_client::Client::connect(&socket)) {
        Ok(client) => client,
        Err(error) => {
            println!("error {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("ready");
    let mut lines = std::io::stdin().lock().lines();
    while let Some(Ok(line)) = lines.next() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [program, n, concurrency, deadline] = words[..] else {
            println!("error bad request {line:?}");
            continue;
        };
        let (Ok(n), Ok(concurrency), Ok(deadline)) =
            (n.parse(), concurrency.parse(), deadline.parse())
        else {
            println!("error bad request {line:?}");
            continue;
        };
        let budget = Budget {
            n,
            concurrency,
            deadline: Instant::now() + Duration::from_nanos(deadline),
        };
        let before = sys::own_cpu();
        match runtime.block_on(methods::run_zygote(
            &client,
            Path::new(program),
            budget,
            |_| {},
        )) {
            Ok(run) => {
                let spent = sys::own_cpu().saturating_sub(before);
                let samples: Vec<String> = run
                    .samples
                    .iter()
                    .map(|s| {
                        format!(
                            "{}/{}",
                            s.latency.as_nanos(),
                            s.blocked.unwrap_or_default().as_nanos()
                        )
                    })
                    .collect();
                println!("{}", samples.join(" "));
                println!(
                    "{} {} {}",
                    run.wall.as_nanos(),
                    run.cpu.unwrap_or_default().as_nanos(),
                    spent.as_nanos()
                );
            }
            Err(error) => println!("error {error}"),
        }
    }
    ExitCode::SUCCESS
}
