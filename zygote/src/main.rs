//! The `zygote` binary: `zygote serve` runs the daemon, `zygote run` runs a
//! command through it, `zygote status` asks it for its counters. Exit codes
//! are decided here and nowhere else.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use clap::error::ErrorKind;
use zygote::cli::{Cli, Command};
use zygote::cli::{docs, run, serve, status, upgrade};
use zygote::daemon::upgrade as live_upgrade;
use zygote::service::{activation, log_sink, logging};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return match error.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                // As env, nice and timeout: a code no child returns by
                // accident of its own (clap's default is 2).
                _ => ExitCode::from(run::EXIT_ZYGOTE_FAILED),
            };
        }
    };
    match cli.command {
        Command::Serve(args) => {
            // First: SIGTERM, SIGINT and SIGHUP stay pending, not fatal,
            // until their handlers exist (the socket appears before the
            // runtime does); every thread started from here inherits the
            // mask, and the thread that installs the handlers releases it.
            let _ = zygote::spawn::hold_stop_signals();
            // Before any thread (the log writer, the runtime's) exists,
            // so that every thread inherits it: SIGCHLD is read from a
            // signalfd, never by a handler.
            let blocked = zygote::spawn::block_child_signal();
            // Likewise: a signal with no meaning here (a child's
            // `kill(getppid(), SIGUSR1)`) is read and logged, never fatal.
            let stray_blocked = zygote::spawn::block_stray_signals();
            // Likewise inherited by every thread: the daemon's threads never
            // preempt a client that wakes them (`spawn::run_daemon_as_batch`).
            let policy = zygote::spawn::run_daemon_as_batch();
            // First, while this is the only thread and no fd of ours is
            // open: what an upgrade handed over, then systemd's fds
            // (close-on-exec) and variables.
            let handover = live_upgrade::take_handover();
            let activation = activation::take();
            logging::init(args.log_format);
            zygote::spawn::log_daemon_policy(&policy);
            if let Err(error) = blocked {
                tracing::warn!(%error, "cannot block SIGCHLD; it is handled by a signal handler");
            }
            if let Err(error) = stray_blocked {
                tracing::warn!(%error, "cannot block the signals with no meaning here");
            }
            let served =
                activation.and_then(|activation| serve::serve(&args, activation, handover));
            let code = match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    // Once: the log is on stderr (or the journal), unless
                    // the log filter hides errors.
                    if tracing::enabled!(tracing::Level::ERROR) {
                        tracing::error!("{error}");
                    } else {
                        eprintln!("zygote: {error}");
                    }
                    ExitCode::FAILURE
                }
            };
            // The last lines ("stopped", the error) are still queued.
            log_sink::flush(Duration::from_secs(1));
            code
        }
        Command::Run(args) => ExitCode::from(run::run(args)),
        Command::Status(args) => ExitCode::from(status::status(&args)),
        Command::Upgrade(args) => ExitCode::from(upgrade::upgrade(&args)),
        Command::CheckState(args) => ExitCode::from(upgrade::check_state(&args)),
        Command::UidSpawner(args) => {
            let seccomp = args.seccomp.as_deref();
            ExitCode::from(zygote::daemon::uid_spawners::process::serve(
                args.uid,
                seccomp,
                args.hold_landlock,
                args.parks,
            ))
        }
        Command::Man(args) => ExitCode::from(docs::man(&args)),
        Command::Completions(args) => ExitCode::from(docs::completions(&args)),
    }
}
