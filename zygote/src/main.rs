//! The `zygote` binary: `zygote serve` runs the daemon, `zygote run` runs a
//! command through it, `zygote status` asks it for its counters. Exit codes
//! are decided here and nowhere else.

use std::process::ExitCode;

use clap::Parser;
use zygote::cli::{Cli, Command};
use zygote::cli::{docs, run, serve, status};
use zygote::service::{activation, logging};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            // First, while this is the only thread: take systemd's fds
            // (close-on-exec) and variables out of the environment.
            let activation = activation::take();
            logging::init(args.log_format);
            match activation.and_then(|activation| serve::serve(&args, activation)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!("{error}");
                    eprintln!("zygote: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => ExitCode::from(run::run(args)),
        Command::Status(args) => ExitCode::from(status::status(&args)),
        Command::Man(args) => ExitCode::from(docs::man(&args)),
        Command::Completions(args) => ExitCode::from(docs::completions(&args)),
    }
}
