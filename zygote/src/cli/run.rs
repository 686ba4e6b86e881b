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

use crate::cli::RunArgs;
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

fn report_spawn_error(error: &Error, program: &Path) -> u8 {
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
