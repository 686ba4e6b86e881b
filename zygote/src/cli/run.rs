//! `zygote run -- CMD ARGS...`: a transparent wrapper, like `env` or `nice`,
//! whose child is started by the zygote instead of by a fork.
//!
//! Exit codes follow the shell and `env`: the child's code, 128+N for
//! signal N, 127 when the program is not found, 126 when it cannot be
//! executed, 125 when zygote itself fails.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use zygote_client::{Child, Client, Command, Error};
use zygote_proto::SpawnStage;

use crate::cli::{RunArgs, pty};
use crate::{spawn, strerror};

/// Exit code when zygote itself fails (no daemon, protocol error, ...).
const EXIT_ZYGOTE_FAILED: u8 = 125;
/// Exit code when the program exists but cannot be executed.
const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit code when the program is not found.
const EXIT_NOT_FOUND: u8 = 127;

/// Signals a terminal or supervisor sends to the wrapper, which the child
/// is not in the process group to receive itself.
const FORWARDED: [SignalKind; 5] = [
    SignalKind::interrupt(),
    SignalKind::terminate(),
    SignalKind::hangup(),
    SignalKind::quit(),
    SignalKind::user_defined1(),
];

/// Runs the command and returns the exit code for the wrapper.
pub fn run(args: RunArgs) -> u8 {
    let Some(runtime) = client_runtime() else {
        return EXIT_ZYGOTE_FAILED;
    };
    runtime.block_on(run_async(args))
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

async fn run_async(args: RunArgs) -> u8 {
    let path = args
        .socket
        .or_else(|| std::env::var_os("ZYGOTE_SOCKET").map(Into::into))
        .unwrap_or_else(zygote_client::default_socket_path);
    let client = match Client::connect(&path).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("zygote: {error}");
            eprintln!(
                "zygote: start one with: zygote serve --socket {}",
                path.display()
            );
            return EXIT_ZYGOTE_FAILED;
        }
    };
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut command = Command::new(&client, program);
    command.args(rest);
    if !args.close_fds {
        command.inherit_fds();
    }
    for property in &args.properties {
        if let Err(message) = apply_property(&mut command, property) {
            eprintln!("zygote: -p {property}: {message}");
            return EXIT_ZYGOTE_FAILED;
        }
    }
    if args.pty {
        if pty::stdin_is_terminal() {
            return pty::run(&mut command, Path::new(program)).await;
        }
        // As `ssh -t`: run the command all the same, without a terminal.
        eprintln!("zygote: pseudo-terminal will not be allocated because stdin is not a terminal");
    }
    let mut child = match command.spawn().await {
        Ok(child) => child,
        Err(error) => return report_spawn_error(&error, Path::new(program)),
    };
    forward_signals(&child);
    let status = child.wait().await;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
            (None, None) => EXIT_ZYGOTE_FAILED,
        },
        Err(error) => {
            eprintln!("zygote: {error}");
            EXIT_ZYGOTE_FAILED
        }
    }
}

/// Passes the wrapper's terminal and supervisor signals on to the child,
/// through a pidfd so that a recycled pid is never hit.
fn forward_signals(child: &Child) {
    let pidfd = match child.pidfd().try_clone_to_owned() {
        Ok(pidfd) => Arc::new(pidfd),
        Err(error) => {
            eprintln!("zygote: signals will not be forwarded: {error}");
            return;
        }
    };
    for kind in FORWARDED {
        let mut stream = match signal(kind) {
            Ok(stream) => stream,
            Err(error) => {
                eprintln!("zygote: signal {kind:?} will not be forwarded: {error}");
                continue;
            }
        };
        let pidfd = Arc::clone(&pidfd);
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                // The child may already be gone; nothing to do then.
                let _ = spawn::send_signal(pidfd.as_fd(), kind.as_raw_value());
            }
        });
    }
}

pub(super) fn report_spawn_error(error: &Error, program: &Path) -> u8 {
    match error {
        Error::Spawn { stage, errno, .. } if *stage == SpawnStage::Exec => {
            eprintln!("zygote: {}: {}", program.display(), strerror(*errno));
            if *errno == libc::ENOENT {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXECUTE
            }
        }
        other => {
            eprintln!("zygote: {other}");
            EXIT_ZYGOTE_FAILED
        }
    }
}

/// Applies one `-p NAME=VALUE` cgroup property, spelled as in systemd-run.
fn apply_property(command: &mut Command, property: &str) -> Result<(), String> {
    let (name, value) = property
        .split_once('=')
        .ok_or("expected NAME=VALUE, e.g. MemoryMax=512M")?;
    let number = |value: &str| {
        value
            .parse::<u64>()
            .map_err(|_| format!("{value:?} is not a number"))
    };
    match name {
        "MemoryMax" => command.memory_max(bytes(value)?),
        "MemorySwapMax" => command.memory_swap_max(bytes(value)?),
        "TasksMax" => command.pids_max(number(value)?),
        "CPUWeight" => command.cpu_weight(weight(value)?),
        "IOWeight" => command.io_weight(weight(value)?),
        "CPUQuota" => {
            let percent = number(
                value
                    .strip_suffix('%')
                    .ok_or("expected a percentage, e.g. 50%")?,
            )?;
            let period = std::time::Duration::from_millis(100);
            command.cpu_max(
                period * u32::try_from(percent).unwrap_or(u32::MAX) / 100,
                period,
            )
        }
        _ => {
            return Err(format!(
                "unknown property {name:?}; known: MemoryMax, MemorySwapMax, TasksMax, CPUQuota, \
                 CPUWeight, IOWeight"
            ));
        }
    };
    Ok(())
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
    use super::bytes;

    #[test]
    fn sizes_read_as_systemd_reads_them() {
        assert_eq!(bytes("512M"), Ok(512 << 20));
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("1T"), Ok(1 << 40));
        assert!(bytes("12X").is_err());
        assert!(bytes("").is_err());
    }
}
