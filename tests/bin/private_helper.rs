//! A program for the private-zygote tests: starts a private zygote
//! (`launched` or `template`), grows to the given GiB of touched memory,
//! then spawns through it and reports on stdout:
//!
//! ```text
//! rss_kib <VmRSS> child <pid of a running cat> ppid_seen <$PPID of a child> sleeper <pid> child_nice <its nice value> child_policy <its scheduling policy> child_sigblk <a child's SigBlk, hex>
//! ```
//!
//! It then waits until its stdin closes. The `cat` reads a pipe from this
//! process, so it exits when this process dies; the sleeper (`sleep 3`)
//! outlives it, so the zygote must wait for it.
//!
//! With `lines` in place of GIB it reports `zygote <pid>` instead, then
//! runs each line of its stdin with `sh -c`, writing `exit <code>` (or
//! `signal <number>`) for each, until its stdin closes.
//!
//! Before anything else it opens `/dev/zero` on an inheritable fd: neither
//! kind of private zygote may keep it open.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use zygote_client::Stdio;
use zygote_client::blocking::{Client, Command};

fn main() -> ExitCode {
    // Opening a file starts no thread; the zygote must not keep it.
    let leak = std::fs::File::open("/dev/zero").expect("open /dev/zero");
    let leak = rustix::io::dup(&leak).expect("dup without close-on-exec");
    // Then the template, while this is the only thread.
    let mode = std::env::args().nth(1).unwrap_or_default();
    let client = match mode.as_str() {
        "template" => zygote::template::fork_template()
            .map_err(|error| error.to_string())
            .and_then(|template| template.blocking_client().map_err(|e| e.to_string())),
        "launched" => Client::launch_private().map_err(|error| error.to_string()),
        other => Err(format!(
            "usage: private_helper launched|template GIB (got {other:?})"
        )),
    };
    let client = match client {
        Ok(client) => client,
        Err(error) => {
            eprintln!("private_helper: {error}");
            return ExitCode::FAILURE;
        }
    };
    if std::env::args().nth(2).as_deref() == Some("lines") {
        return run_lines(&client);
    }
    let gib: usize = std::env::args()
        .nth(2)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(2);
    let ballast = grow(gib);

    let mut cat = Command::new(&client, "cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn cat");
    // With cat and the sleeper running, the zygote is busy when it starts
    // sh: its spawner runs raised (as root), and sh must not inherit that.
    let sleeper = Command::new(&client, "sleep")
        .arg("3")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep");
    let output = Command::new(&client, "sh")
        .args([
            "-c",
            "echo $PPID $(nice) $(cut -d ' ' -f 41 /proc/self/stat)",
        ])
        .output()
        .expect("run sh");
    let seen = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut seen = seen.split_whitespace();
    let ppid_seen = seen.next().unwrap_or("?").to_owned();
    let child_nice = seen.next().unwrap_or("?").to_owned();
    let child_policy = seen.next().unwrap_or("?").to_owned();
    let masks = Command::new(&client, "grep")
        .args(["^SigBlk:", "/proc/self/status"])
        .output()
        .expect("run grep");
    let masks = String::from_utf8_lossy(&masks.stdout).into_owned();
    let child_sigblk = masks.split_whitespace().nth(1).unwrap_or("?").to_owned();
    println!(
        "rss_kib {} child {} ppid_seen {ppid_seen} sleeper {} child_nice {child_nice} \
         child_policy {child_policy} child_sigblk {child_sigblk}",
        rss_kib(),
        cat.id(),
        sleeper.id()
    );
    std::io::stdout().flush().expect("flush");

    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    std::hint::black_box((&ballast, &leak));
    drop(cat.stdin.take());
    let _ = cat.wait();
    ExitCode::SUCCESS
}

/// The `lines` mode: the zygote's pid, then one `sh -c` per stdin line.
fn run_lines(client: &Client) -> ExitCode {
    let ppid = Command::new(client, "sh")
        .args(["-c", "echo $PPID"])
        .output()
        .expect("run sh");
    print!("zygote {}", String::from_utf8_lossy(&ppid.stdout));
    std::io::stdout().flush().expect("flush");
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("read stdin");
        let report = match Command::new(client, "sh").args(["-c", &line]).status() {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(signal)) => format!("signal {signal}"),
                (None, None) => format!("status {status:?}"),
            },
            Err(error) => format!("error {error}"),
        };
        println!("{report}");
        std::io::stdout().flush().expect("flush");
    }
    ExitCode::SUCCESS
}

/// `gib` GiB of memory with every page written.
fn grow(gib: usize) -> Vec<u8> {
    let len = gib << 30;
    let mut ballast = vec![0u8; len];
    for page in ballast.chunks_mut(4096) {
        page[0] = 1;
    }
    ballast
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
