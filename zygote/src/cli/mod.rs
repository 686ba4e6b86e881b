//! The `zygote` binary's commands and their arguments.
//!
//! - [`serve`]: `zygote serve`, the daemon around
//!   [`server::run_with`](crate::daemon::server::run_with).
//! - [`run`]: `zygote run`, a client of the daemon; [`pty`], its `-t`.
//! - [`status`]: `zygote status`.
//! - [`upgrade`]: `zygote upgrade` and `zygote check-state`.
//! - [`docs`]: `zygote man` and `zygote completions`.

pub mod docs;
mod exit_code;
pub mod pty;
pub mod run;
pub mod sandbox;
pub mod serve;
pub mod status;
pub mod upgrade;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::service::logging::LogFormat;

/// A spawn server: large processes start children without forking.
#[derive(Debug, Parser)]
#[command(name = "zygote", version = VERSION, about, long_about = LONG_ABOUT)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `zygote --version`: the package version and the protocol versions
/// served, which move independently (`tests` below keeps the numbers in
/// step with zygote-proto's).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (protocol 4; serves protocol versions 1 to 4)"
);

/// `zygote --help` and the DESCRIPTION of zygote(1).
const LONG_ABOUT: &str = "\
A spawn server for Linux: large processes start children without forking.

zygote serve runs the daemon, a small process started before anything
large or sensitive exists. Clients ask it over a Unix socket to start a
child; it passes back the child's pipes and a pidfd, and later its exit
status. zygote run -- CMD runs CMD through it, as if run directly.
zygote status prints a running daemon's counters.";

/// The end of `zygote serve --help`: its scheduling, and how to keep it.
const SERVE_AFTER_HELP: &str = "\
Scheduling: the daemon's threads run under SCHED_BATCH (no wake-up
preemption of the client that woke them; a private zygote leaves it while
two or more children run), and every child starts under SCHED_OTHER.
ZYGOTE_SCHED_BATCH=0 in the environment keeps the policy the daemon was
started with.

Signals: SIGTERM or SIGINT stops the daemon gracefully (a second one, or
--stop-timeout, closes every connection and exits); SIGHUP upgrades it in
place. SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
SIGWINCH, SIGURG, SIGSTKFLT, SIGXCPU, SIGXFSZ and the real-time signals,
which a child may send its parent, are ignored and logged (at most 10
lines per 10 seconds). SIGPIPE is ignored; the others keep their default
action.";

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: listen on a socket and spawn children for clients.
    #[command(after_long_help = SERVE_AFTER_HELP)]
    Serve(ServeArgs),
    /// Run a command through a running zygote, as if run directly.
    Run(RunArgs),
    /// Ask a running zygote for its version, uptime and counters.
    Status(StatusArgs),
    /// Ask a running zygote to upgrade in place: re-execute the binary at
    /// its path, keeping its pid, connections and children.
    Upgrade(UpgradeArgs),
    /// Check that this binary reads a daemon state file (used by the
    /// daemon before an upgrade; FILE defaults to stdin).
    #[command(hide = true)]
    CheckState(CheckStateArgs),
    /// Serve one uid's spawns for the daemon that started this process,
    /// over the socket on fd 3 (started by the daemon only).
    #[command(hide = true)]
    UidSpawner(UidSpawnerArgs),
    /// Print the manual page (roff): `zygote man | man -l -`.
    Man(docs::ManArgs),
    /// Print a shell completion script.
    Completions(docs::CompletionsArgs),
}

/// Arguments of `zygote uid-spawner`.
#[derive(Debug, Args)]
pub struct UidSpawnerArgs {
    /// The uid whose children this spawner starts.
    #[arg(long)]
    pub uid: u32,
    /// A seccomp profile this spawner installs on itself at start, which
    /// its children inherit instead of each installing its own.
    #[arg(long)]
    pub seccomp: Option<String>,
    /// Enforce the first Landlock ruleset of the first plan on itself,
    /// which its children then inherit (every plan carries the same).
    #[arg(long)]
    pub hold_landlock: bool,
    /// Make parked inits and mount templates only: under `SCHED_IDLE`,
    /// unless the daemon says its pool is behind.
    #[arg(long, conflicts_with_all = ["seccomp", "hold_landlock"])]
    pub parks: bool,
}

/// Arguments of `zygote serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Socket to listen on [default: $ZYGOTE_SOCKET, else
    /// $XDG_RUNTIME_DIR/zygote.sock, or /run/zygote/zygote.sock as root].
    ///
    /// Not allowed when systemd passes the spawn socket (socket activation).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9478). systemd can pass this socket instead, named
    /// "metrics".
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log format; auto is the journal when stderr is the journal, else
    /// text. The filter comes from ZYGOTE_LOG, else RUST_LOG (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
    /// Policy file (TOML): who may connect, as whom they may run children,
    /// and limits [default: built-in policy; see zygote-policy(5)].
    #[arg(long, value_name = "PATH")]
    pub policy: Option<PathBuf>,
    /// Permission bits of the socket, in octal: who may connect at all
    /// (e.g. 0666 for every local user of a root zygote).
    #[arg(long, value_name = "MODE", default_value = "0600", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// cgroup v2 directory to run children in (created if missing): the
    /// daemon moves into PATH/daemon and gives each child
    /// PATH/peers/UID/N [default: the daemon's own cgroup when delegated].
    #[arg(long, value_name = "PATH", conflicts_with = "private_fd")]
    pub cgroup: Option<PathBuf>,
    /// Private mode: serve only the connected socket inherited at fd FD,
    /// for its owner (same uid), and exit once it closes and every child
    /// is reaped. `zygote_client`'s `launch_private` passes fd 0.
    #[arg(long, value_name = "FD", conflicts_with_all = ["socket", "metrics_listen"])]
    pub private_fd: Option<i32>,
    /// Longest graceful stop, in seconds: after the first SIGTERM or
    /// SIGINT (SIGHUP is a live upgrade), the daemon waits at most this long
    /// for connected clients' children before it closes every connection
    /// (kill-on-close children get their signal) and exits, as a second
    /// signal does. Keep it below
    /// systemd's TimeoutStopSec=, whose SIGKILL leaves no time for that. 0
    /// waits without limit.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 25,
        conflicts_with = "private_fd"
    )]
    pub stop_timeout: u64,
}

/// Arguments of `zygote status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Socket of the zygote [default: $ZYGOTE_SOCKET, else as for serve].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print one JSON object, for scripts.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `zygote upgrade`.
#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// Socket of the zygote [default: $ZYGOTE_SOCKET, else as for serve].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

/// Arguments of `zygote check-state`.
#[derive(Debug, Args)]
pub struct CheckStateArgs {
    /// The state file [default: stdin].
    pub file: Option<PathBuf>,
}

fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| format!("{text:?} is not an octal mode such as 0660"))
}

/// Arguments of `zygote run`.
#[derive(Debug, Args)]
#[command(after_help = docs::RUN_AFTER_HELP)]
pub struct RunArgs {
    /// Socket of the zygote [default: $ZYGOTE_SOCKET, else as for serve].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Give the child only fds 0, 1 and 2, not every inheritable fd.
    #[arg(long)]
    pub close_fds: bool,
    /// Give the child a new pseudo-terminal, relayed to this one, as
    /// `ssh -t` does. Without a terminal on stdin, warns and runs the
    /// command without one.
    #[arg(short = 't', long = "pty")]
    pub pty: bool,
    /// A limit on the child's own cgroup, as systemd-run spells it:
    /// MemoryMax=512M, MemorySwapMax=, TasksMax=, CPUQuota=50%, CPUWeight=,
    /// IOWeight=. Refused by a zygote that cannot enforce it.
    #[arg(short = 'p', long = "property", value_name = "NAME=VALUE")]
    pub properties: Vec<String>,
    /// Set an environment variable; NAME alone copies this process's value.
    #[arg(short = 'E', long = "setenv", value_name = "NAME[=VALUE]")]
    pub setenv: Vec<OsString>,
    /// Remove a variable from the child's environment.
    #[arg(short = 'u', long = "unset", value_name = "NAME")]
    pub unset: Vec<OsString>,
    /// Run the child in DIR (relative to the current directory).
    #[arg(short = 'C', long = "chdir", value_name = "DIR")]
    pub chdir: Option<PathBuf>,
    /// Run the child as this user (name or number); needs the zygote's
    /// policy to allow it.
    #[arg(long, value_name = "USER")]
    pub uid: Option<String>,
    /// Run the child with this group (name or number).
    #[arg(long, value_name = "GROUP")]
    pub gid: Option<String>,
    /// End the child with SIGTERM after DURATION (e.g. 90, 1.5s, 2m, 1h);
    /// the tool then exits 124, as timeout(1) does.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// After the timeout's SIGTERM, SIGKILL the child after DURATION.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        default_value = "5s",
        requires = "timeout"
    )]
    pub kill_after: Duration,
    /// Start the child in a new session (setsid(2)).
    #[arg(long)]
    pub setsid: bool,
    /// Let the child outlive this tool: by default the zygote SIGKILLs it
    /// when this tool ends, whatever ends it.
    #[arg(long)]
    pub no_kill_on_close: bool,
    /// Run the command in a child forked from a warm Python template that
    /// has imported MODULES (comma-separated, in order): CMD is then what
    /// follows `python` (-c CODE, -m MODULE or SCRIPT, and their
    /// arguments). The template runs as you, with this process's
    /// environment and working directory, and is kept by the zygote for
    /// the next run. Not with --uid, --gid or a sandbox option.
    #[arg(long, value_name = "MODULES")]
    pub python_template: Option<String>,
    /// The template's interpreter: a path, or a name looked up in PATH
    /// [default: python3].
    #[arg(long, value_name = "INTERPRETER", requires = "python_template")]
    pub python: Option<OsString>,
    /// The sandbox options (boxed: most runs have none).
    #[command(flatten)]
    pub sandbox: Box<sandbox::SandboxArgs>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Parses `90`, `1.5s`, `2m`, `1h` or `1d`, as timeout(1) does.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.char_indices().last() {
        Some((at, unit @ ('s' | 'm' | 'h' | 'd'))) => (&text[..at], unit),
        _ => (text, 's'),
    };
    let scale = match unit {
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86_400.0,
        _ => 1.0,
    };
    number
        .parse::<f64>()
        .ok()
        .filter(|value| value.is_finite() && *value > 0.0)
        .and_then(|value| Duration::try_from_secs_f64(value * scale).ok())
        .ok_or_else(|| format!("{text:?} is not a duration such as 90, 1.5s, 2m or 1h"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_the_protocol_versions_served() {
        let expected = format!(
            "{} (protocol {}; serves protocol versions {} to {})",
            env!("CARGO_PKG_VERSION"),
            zygote_proto::PROTOCOL_VERSION,
            zygote_proto::OLDEST_PROTOCOL_VERSION,
            zygote_proto::PROTOCOL_VERSION
        );
        assert_eq!(VERSION, expected);
    }

    #[test]
    fn durations_parse_like_timeout() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
