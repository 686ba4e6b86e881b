//! The `zygote` binary: `zygote serve` runs the daemon, `zygote run` runs a
//! command through it. Exit codes are decided here and nowhere else.

use std::process::ExitCode;

use clap::Parser;
use zygote::cli::{Cli, Command};
use zygote::{logging, run, serve};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            logging::init();
            match serve::serve(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!("{error}");
                    eprintln!("zygote: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => ExitCode::from(run::run(args)),
    }
}
