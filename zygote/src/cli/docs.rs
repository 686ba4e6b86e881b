//! `zygote man` and `zygote completions`: the manual pages and shell
//! completions, generated from the CLI definition so that they cannot
//! drift from it; and the long help of `zygote run`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Cli;

/// Exit code of `man` and `completions` when writing fails.
const EXIT_FAILED: u8 = 1;

/// What `zygote run --help` (and zygote-run(1)) adds after the options:
/// how the wrapper stays transparent.
pub const RUN_AFTER_HELP: &str = "\
Exit status:
  N    the child exited with status N
  -    a signal killed the child: zygote run resets its own
       handler for that signal and raises it, so that its
       caller sees the same death (a shell shows 128+N)
  124  --timeout expired, as with timeout(1)
  125  zygote run itself failed: a wrong command line, no zygote
       on the socket (the message names it and how to start
       one), the connection to the zygote lost
  126  the program was found but could not be executed
       (permission denied, a directory, argument list too long)
  127  the program was not found (with --python-template, the
       interpreter)

Signals:
  Every catchable signal sent to zygote run is forwarded to
  the child. SIGTSTP, SIGTTIN and SIGTTOU stop the child, then
  zygote run; SIGCONT continues both. Signals ignored in
  zygote run (under nohup, in a background job) stay ignored
  in the child, as exec keeps them. SIGKILL cannot be caught:
  the child is kill-on-close instead, so the zygote kills it
  when zygote run dies of anything (--no-kill-on-close opts
  out). With -t, started outside the terminal's foreground
  process group, zygote run stops (SIGTTOU) before it touches
  the terminal or starts the command, as stty raw does, and
  carries on once in the foreground (fg).

File descriptors:
  The child gets zygote run's stdin, stdout and stderr, and
  every other fd that is not close-on-exec, at the same
  number, so process substitution and a make jobserver keep
  working; --close-fds gives it only 0, 1 and 2. Its
  environment, working directory, umask and resource limits
  are zygote run's own. Its parent is the zygote.

Warm Python children:
  --python-template MODULES runs CMD as the arguments of a
  Python interpreter (-c CODE, -m MODULE or SCRIPT) in a
  child forked from a template that has imported MODULES
  once: `zygote run --python-template numpy,pandas -- -c
  'import pandas'` starts in milliseconds. The zygote keeps
  the template, per user, for the next run (zygote status
  lists them). The child is not a fresh interpreter: state
  set while importing is shared. --uid, --gid and the
  sandbox options are refused with it; the other options
  apply to the child as to any command.";

/// What zygote-serve(1) adds after its options: ENVIRONMENT, FILES, EXIT
/// STATUS and SEE ALSO, in roff.
const SERVE_SECTIONS: &str = include_str!("zygote-serve.sections.roff");

/// zygote-policy(5): the policy file, in roff.
pub const POLICY_PAGE: &str = include_str!("zygote-policy.5");

/// Arguments of `zygote man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write one page per command (zygote.1, zygote-serve.1,
    /// zygote-run.1, ...) and zygote-policy.5 into DIR, created if missing,
    /// instead of zygote(1) to stdout.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// Arguments of `zygote completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// `zygote man`: roff for man(1), e.g. `zygote man | man -l -`.
pub fn man(args: &ManArgs) -> u8 {
    let command = Cli::command();
    let result = match &args.out_dir {
        Some(dir) => write_pages(command, dir).map_err(|error| {
            format!(
                "cannot write the manual pages into {}: {error}",
                dir.display()
            )
        }),
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .and_then(|()| std::io::stdout().lock().write_all(&page))
                .map_err(|error| format!("cannot write the manual page to stdout: {error}"))
        }
    };
    report(result)
}

/// Every page into `dir` (created with its parents, as `install -d`
/// does): one per command, the serve page with its extra sections, and
/// the policy file's.
fn write_pages(command: clap::Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(command, dir)?;
    let mut serve = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("zygote-serve.1"))?;
    serve.write_all(SERVE_SECTIONS.as_bytes())?;
    std::fs::write(dir.join("zygote-policy.5"), POLICY_PAGE)
}

/// The CLI without its hidden commands (`check-state`, `uid-spawner`, for
/// the daemon's own use), which clap_complete would offer otherwise.
fn visible_command() -> clap::Command {
    let full = Cli::command();
    clap::Command::new("zygote")
        .version(super::VERSION)
        .args(
            full.get_arguments()
                .filter(|arg| !arg.is_hide_set())
                .cloned(),
        )
        .subcommands(
            full.get_subcommands()
                .filter(|command| !command.is_hide_set())
                .cloned(),
        )
}

/// `zygote completions SHELL`: a completion script on stdout, e.g.
/// `zygote completions bash > /usr/share/bash-completion/completions/zygote`.
pub fn completions(args: &CompletionsArgs) -> u8 {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut visible_command(), "zygote", &mut script);
    report(
        std::io::stdout()
            .lock()
            .write_all(&script)
            .map_err(|error| {
                format!(
                    "cannot write the {} completions to stdout: {error}",
                    args.shell
                )
            }),
    )
}

fn report(result: Result<(), String>) -> u8 {
    match result {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("zygote: {message}");
            EXIT_FAILED
        }
    }
}
