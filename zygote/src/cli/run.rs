//! `zygote run -- CMD ARGS...`: a transparent wrapper, like `env` or `nice`,
//! whose child is started by the zygote instead of by a fork.
//!
//! Exit codes follow the shell and `env`: the child's code; death by the
//! child's signal when one killed it; 124 when `--timeout` expired; 127
//! when the program is not found, 126 when it cannot be executed; 125 when
//! zygote itself fails or the command line is wrong.

mod signals;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use zygote_client::{Client, Command};

use crate::cli::{RunArgs, pty};
use crate::spawn;

pub use crate::cli::exit_code::EXIT_ZYGOTE_FAILED;
use crate::cli::exit_code::{EXIT_TIMED_OUT, report_error};

/// Runs the command and returns the exit code for the wrapper; dies by the
/// child's signal instead when a signal killed the child.
pub fn run(args: RunArgs) -> u8 {
    // Before any handler exists: what this process ignores now, it was
    // given ignored, and the child keeps ignoring.
    let ignored = signals::ignored_at_start();
    let Some(runtime) = client_runtime() else {
        return EXIT_ZYGOTE_FAILED;
    };
    match runtime.block_on(run_async(args, ignored)) {
        Outcome::Exit(code) => code,
        Outcome::Signal(signal) => {
            drop(runtime);
            spawn::die_by(signal)
        }
    }
}

/// How the wrapper ends.
enum Outcome {
    Exit(u8),
    Signal(i32),
}

/// The single-threaded runtime of the client subcommands (`run`,
/// `status`); `None`, after saying why on stderr, when it cannot start.
pub(crate) fn client_runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .inspect_err(|error| eprintln!("zygote: failed to start the async runtime: {error}"))
        .ok()
}

/// The socket `run` and `status` use: `--socket`, else `$ZYGOTE_SOCKET`,
/// else the default.
pub(crate) fn socket_path(socket: Option<PathBuf>) -> PathBuf {
    socket
        .or_else(|| std::env::var_os(zygote_client::SOCKET_ENV).map(Into::into))
        .unwrap_or_else(zygote_client::default_socket_path)
}

async fn run_async(args: RunArgs, ignored: u64) -> Outcome {
    if let Some(refused) = template_conflict(&args) {
        eprintln!(
            "zygote: --python-template cannot be combined with {refused}: a warm child is \
             forked from a template that runs as you, unconfined; run the interpreter \
             without --python-template instead"
        );
        return Outcome::Exit(EXIT_ZYGOTE_FAILED);
    }
    let path = socket_path(args.socket.clone());
    let client = match Client::connect(&path).await {
        Ok(client) => client,
        Err(error) => {
            // The error says whether nothing listens (with the one hint
            // on starting a zygote) or the socket refused us.
            eprintln!("zygote: {error}");
            return Outcome::Exit(EXIT_ZYGOTE_FAILED);
        }
    };
    let (mut command, program) = match new_command(&client, &args).await {
        Ok(made) => made,
        Err(code) => return Outcome::Exit(code),
    };
    let program = program.as_path();
    if let Err(message) = configure(&mut command, &args) {
        eprintln!("zygote: {message}");
        return Outcome::Exit(EXIT_ZYGOTE_FAILED);
    }
    for property in &args.properties {
        match Property::parse(property) {
            Ok(parsed) => parsed.apply(&mut command),
            Err(message) => {
                eprintln!("zygote: -p {property}: {message}");
                return Outcome::Exit(EXIT_ZYGOTE_FAILED);
            }
        }
    }
    if args.pty {
        if pty::stdin_is_terminal() {
            // pty::run dies of the child's signal itself, once the
            // terminal is restored.
            return Outcome::Exit(pty::run(&mut command, program).await);
        }
        // As `ssh -t`: run the command all the same, without a terminal.
        eprintln!("zygote: pseudo-terminal will not be allocated because stdin is not a terminal");
    }
    let mut child = match command.spawn().await {
        Ok(child) => child,
        Err(error) => {
            return Outcome::Exit(report_error(&error, program, args.chdir.as_deref()));
        }
    };
    let forwarding = signals::forward(&child, ignored);
    let status = child.wait().await;
    drop(forwarding);
    match status {
        Ok(status) if status.timed_out() => Outcome::Exit(EXIT_TIMED_OUT),
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => Outcome::Exit(code as u8),
            (None, Some(signal)) => Outcome::Signal(signal),
            (None, None) => Outcome::Exit(EXIT_ZYGOTE_FAILED),
        },
        Err(error) => {
            eprintln!("zygote: {error}");
            Outcome::Exit(EXIT_ZYGOTE_FAILED)
        }
    }
}

/// The command to run, and the program its errors name: `CMD ARGS`, or,
/// with `--python-template`, `ARGS` in a child of the template, which is
/// found or started here. `Err` holds the exit code, the reason said.
async fn new_command(client: &Client, args: &RunArgs) -> Result<(Command, PathBuf), u8> {
    let Some(modules) = &args.python_template else {
        let (program, rest) = args.command.split_first().expect("clap requires a command");
        let mut command = Command::new(client, program);
        command.args(rest);
        return Ok((command, PathBuf::from(program)));
    };
    let interpreter = args
        .python
        .clone()
        .unwrap_or_else(|| zygote_client::DEFAULT_PYTHON.into());
    let preload: Vec<&str> = if modules.is_empty() {
        Vec::new()
    } else {
        modules.split(',').collect()
    };
    let template = client
        .python_template(preload)
        .python(&interpreter)
        .start()
        .await
        .map_err(|error| report_template_error(&error, Path::new(&interpreter)))?;
    Ok((template.command(&args.command), PathBuf::from(interpreter)))
}

/// With `--python-template`, the first option given that a template's
/// child cannot honour.
fn template_conflict(args: &RunArgs) -> Option<&'static str> {
    if args.python_template.is_none() {
        None
    } else if args.uid.is_some() {
        Some("--uid")
    } else if args.gid.is_some() {
        Some("--gid")
    } else if args.sandbox.any() {
        Some("a sandbox option")
    } else {
        None
    }
}

/// Says why a template could not be had and returns the exit code: 127 for
/// an interpreter not found, 126 for one that cannot be executed, as for a
/// program; 125 for the rest (a preload that failed: the zygote's message
/// holds the traceback).
fn report_template_error(error: &zygote_client::Error, interpreter: &Path) -> u8 {
    match error {
        zygote_client::Error::Request {
            op: "template",
            errno,
            ..
        } if *errno == libc::ENOENT || *errno == libc::EACCES => {
            eprintln!(
                "zygote: {}: {}",
                interpreter.display(),
                crate::strerror(*errno)
            );
            if *errno == libc::ENOENT { 127 } else { 126 }
        }
        other => {
            eprintln!("zygote: {other}");
            EXIT_ZYGOTE_FAILED
        }
    }
}

/// Applies the command-line options to `command`; a usage error says why.
fn configure(command: &mut Command, args: &RunArgs) -> Result<(), String> {
    if !args.close_fds {
        command.inherit_fds();
    }
    for unset in &args.unset {
        if unset.is_empty() || unset.as_bytes().contains(&b'=') {
            return Err(format!("cannot unset {unset:?}: not a variable name"));
        }
        command.env_remove(unset);
    }
    for setting in &args.setenv {
        let bytes = setting.as_bytes();
        match bytes.iter().position(|byte| *byte == b'=') {
            Some(0) => return Err(format!("cannot set {setting:?}: the name is empty")),
            Some(at) => {
                command.env(
                    OsStr::from_bytes(&bytes[..at]),
                    OsStr::from_bytes(&bytes[at + 1..]),
                );
            }
            None if bytes.is_empty() => return Err("cannot set an empty name".to_owned()),
            None => {
                if let Some(value) = std::env::var_os(setting) {
                    command.env(setting, value);
                }
            }
        }
    }
    if let Some(dir) = &args.chdir {
        command.current_dir(dir);
    }
    if let Some(user) = &args.uid {
        command.uid(lookup_id(user, "/etc/passwd", "user")?);
    }
    if let Some(group) = &args.gid {
        command.gid(lookup_id(group, "/etc/group", "group")?);
    }
    if let Some(limit) = args.timeout {
        command.timeout(limit).timeout_grace(args.kill_after);
    }
    if let Some(sandbox) = args.sandbox.sandbox()? {
        command.sandbox(sandbox);
    }
    command.setsid(args.setsid);
    if !args.no_kill_on_close {
        // Whatever ends this tool, SIGKILL included, ends the child.
        command.kill_on_close(libc::SIGKILL);
    }
    Ok(())
}

/// A user or group given as a number, or as a name looked up in `file`
/// (`/etc/passwd` or `/etc/group`: name, password, id, ...).
fn lookup_id(name: &str, file: &str, what: &str) -> Result<u32, String> {
    if let Ok(id) = name.parse::<u32>() {
        return Ok(id);
    }
    let table =
        std::fs::read_to_string(file).map_err(|error| format!("reading {file}: {error}"))?;
    table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let entry = fields.next()?;
            let id = fields.nth(1)?.parse::<u32>().ok()?;
            (entry == name).then_some(id)
        })
        .next()
        .ok_or_else(|| format!("no {what} named {name:?} in {file}"))
}

/// One `-p NAME=VALUE` cgroup property, spelled as in systemd-run.
#[derive(Debug, PartialEq, Eq)]
enum Property {
    MemoryMax(u64),
    MemorySwapMax(u64),
    TasksMax(u64),
    CpuWeight(u32),
    IoWeight(u32),
    CpuQuota {
        quota: std::time::Duration,
        period: std::time::Duration,
    },
}

impl Property {
    /// Reads `NAME=VALUE`; a usage error says why it cannot.
    fn parse(property: &str) -> Result<Self, String> {
        let (name, value) = property
            .split_once('=')
            .ok_or("expected NAME=VALUE, e.g. MemoryMax=512M")?;
        let number = |value: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{value:?} is not a number"))
        };
        Ok(match name {
            "MemoryMax" => Self::MemoryMax(bytes(value)?),
            "MemorySwapMax" => Self::MemorySwapMax(bytes(value)?),
            "TasksMax" => Self::TasksMax(number(value)?),
            "CPUWeight" => Self::CpuWeight(weight(value)?),
            "IOWeight" => Self::IoWeight(weight(value)?),
            "CPUQuota" => {
                let percent = number(
                    value
                        .strip_suffix('%')
                        .ok_or("expected a percentage, e.g. 50%")?,
                )?;
                // systemd's period: the quota is a share of 100 ms.
                let period = std::time::Duration::from_millis(100);
                Self::CpuQuota {
                    quota: period * u32::try_from(percent).unwrap_or(u32::MAX) / 100,
                    period,
                }
            }
            _ => {
                return Err(format!(
                    "unknown property {name:?}; known: MemoryMax, MemorySwapMax, TasksMax, \
                     CPUQuota, CPUWeight, IOWeight"
                ));
            }
        })
    }

    fn apply(self, command: &mut Command) {
        match self {
            Self::MemoryMax(bytes) => command.memory_max(bytes),
            Self::MemorySwapMax(bytes) => command.memory_swap_max(bytes),
            Self::TasksMax(pids) => command.pids_max(pids),
            Self::CpuWeight(weight) => command.cpu_weight(weight),
            Self::IoWeight(weight) => command.io_weight(weight),
            Self::CpuQuota { quota, period } => command.cpu_max(quota, period),
        };
    }
}

/// A size with an optional K, M, G or T suffix (powers of 1024, as
/// systemd reads them).
fn bytes(value: &str) -> Result<u64, String> {
    let (digits, shift) = match value.as_bytes().last() {
        Some(b'K') => (&value[..value.len() - 1], 10),
        Some(b'M') => (&value[..value.len() - 1], 20),
        Some(b'G') => (&value[..value.len() - 1], 30),
        Some(b'T') => (&value[..value.len() - 1], 40),
        _ => (value, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|number| number.checked_mul(1 << shift))
        .ok_or_else(|| format!("{value:?} is not a size such as 512M"))
}

fn weight(value: &str) -> Result<u32, String> {
    value
        .parse::<u32>()
        .ok()
        .filter(|weight| (1..=10_000).contains(weight))
        .ok_or_else(|| format!("{value:?} is not a weight from 1 to 10000"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Property, bytes, lookup_id, weight};

    #[test]
    fn sizes_read_as_systemd_reads_them() {
        assert_eq!(bytes("512M"), Ok(512 << 20));
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("3K"), Ok(3 << 10));
        assert_eq!(bytes("2G"), Ok(2 << 30));
        assert_eq!(bytes("1T"), Ok(1 << 40));
        assert!(bytes("12X").is_err());
        assert!(bytes("").is_err());
        assert!(bytes("K").is_err());
        assert!(bytes("99999999999T").is_err(), "an overflow is no size");
    }

    #[test]
    fn weights_run_from_1_to_10000() {
        assert_eq!(weight("1"), Ok(1));
        assert_eq!(weight("10000"), Ok(10_000));
        assert!(weight("0").is_err());
        assert!(weight("10001").is_err());
        assert!(weight("heavy").is_err());
    }

    #[test]
    fn each_property_sets_its_own_limit() {
        let parsed = |text: &str| Property::parse(text);
        assert_eq!(parsed("MemoryMax=512M"), Ok(Property::MemoryMax(512 << 20)));
        assert_eq!(
            parsed("MemorySwapMax=1G"),
            Ok(Property::MemorySwapMax(1 << 30))
        );
        assert_eq!(parsed("TasksMax=64"), Ok(Property::TasksMax(64)));
        assert_eq!(parsed("CPUWeight=50"), Ok(Property::CpuWeight(50)));
        assert_eq!(parsed("IOWeight=200"), Ok(Property::IoWeight(200)));
        let period = Duration::from_millis(100);
        assert_eq!(
            parsed("CPUQuota=50%"),
            Ok(Property::CpuQuota {
                quota: Duration::from_millis(50),
                period
            })
        );
        assert_eq!(
            parsed("CPUQuota=250%"),
            Ok(Property::CpuQuota {
                quota: Duration::from_millis(250),
                period
            })
        );
    }

    #[test]
    fn a_bad_property_says_what_is_wrong() {
        let error = |text: &str| Property::parse(text).expect_err(text);
        assert!(error("MemoryMax").contains("NAME=VALUE"));
        assert!(error("MemoryLimit=1G").contains("unknown property \"MemoryLimit\""));
        assert!(error("TasksMax=many").contains("not a number"));
        assert!(error("CPUQuota=50").contains("percentage"));
        assert!(error("CPUWeight=0").contains("weight from 1 to 10000"));
    }

    #[test]
    fn users_and_groups_are_numbers_or_names_in_their_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let table = dir.path().join("passwd");
        std::fs::write(
            &table,
            "root:x:0:0::/root:/bin/sh\nbuilder:x:1042:100::/:/bin/sh\n",
        )
        .expect("write");
        let table = table.to_str().expect("utf-8");
        assert_eq!(lookup_id("builder", table, "user"), Ok(1042));
        assert_eq!(lookup_id("root", table, "user"), Ok(0));
        assert_eq!(
            lookup_id("77", table, "user"),
            Ok(77),
            "a number is not looked up"
        );
        let missing = lookup_id("nobody-here", table, "user").expect_err("no such user");
        assert!(
            missing.contains("no user named \"nobody-here\""),
            "{missing}"
        );
        let unreadable = lookup_id("builder", "/nonexistent/passwd", "user").expect_err("no file");
        assert!(
            unreadable.contains("reading /nonexistent/passwd"),
            "{unreadable}"
        );
    }
}
