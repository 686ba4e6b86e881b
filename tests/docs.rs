//! Generated documentation: `zygote run --help`, the manual pages and the
//! shell completions come from the CLI definition and must render.

use std::process::{Command, Output, Stdio};

use crate::tools::have_tool;
use crate::util::zygote_bin;

fn zygote(args: &[&str]) -> Output {
    let output = Command::new(zygote_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run zygote");
    assert!(
        output.status.success(),
        "zygote {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(args: &[&str]) -> String {
    String::from_utf8(zygote(args).stdout).expect("UTF-8 output")
}

#[test]
fn run_help_documents_exit_codes_signals_and_fds() {
    let help = stdout(&["run", "--help"]);
    for needle in [
        "Exit status:",
        "124",
        "125",
        "126",
        "127",
        "Signals:",
        "forwarded to",
        "SIGTSTP",
        "kill-on-close",
        "File descriptors:",
        "close-on-exec",
        "--close-fds",
    ] {
        assert!(
            help.contains(needle),
            "`zygote run --help` lacks {needle:?}:\n{help}"
        );
    }
}

#[test]
fn man_pages_generate_and_render() {
    let page = stdout(&["man"]);
    assert!(page.contains(".TH zygote 1"), "not a roff page:\n{page}");
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_arg = dir.path().to_str().expect("UTF-8 temp path");
    zygote(&["man", "--out-dir", dir_arg]);
    for name in ["zygote", "zygote-serve", "zygote-run", "zygote-status"] {
        let path = dir.path().join(format!("{name}.1"));
        assert!(path.exists(), "zygote man --out-dir wrote no {name}.1");
    }
    if !have_tool("man", "man-db") {
        return;
    }
    let rendered = Command::new("man")
        .arg("-l")
        .arg(dir.path().join("zygote-run.1"))
        .env("MANWIDTH", "80")
        .env("MAN_KEEP_FORMATTING", "")
        .stderr(Stdio::piped())
        .output()
        .expect("run man -l");
    let text = String::from_utf8_lossy(&rendered.stdout);
    assert!(
        rendered.status.success(),
        "man -l zygote-run.1: {}\n{}",
        rendered.status,
        String::from_utf8_lossy(&rendered.stderr)
    );
    for needle in [
        "zygote-run",
        "SYNOPSIS",
        "--close-fds",
        "Exit status:",
        "File descriptors:",
    ] {
        assert!(
            text.contains(needle),
            "man -l zygote-run.1 lacks {needle:?}:\n{text}"
        );
    }
    // groff warns on stderr about roff it cannot place.
    let warnings = String::from_utf8_lossy(&rendered.stderr);
    assert!(warnings.trim().is_empty(), "man -l warned:\n{warnings}");
}

#[test]
fn bash_completion_completes_subcommands_and_flags() {
    let script = stdout(&["completions", "bash"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("zygote.bash");
    std::fs::write(&path, script).expect("write completion script");
    // Bash's completion protocol: COMP_WORDS/COMP_CWORD in, COMPREPLY out.
    let probe = r#"source "$1"
        COMP_WORDS=(zygote s); COMP_CWORD=1; _zygote zygote s zygote
        echo "subcommands: ${COMPREPLY[*]}"
        COMP_WORDS=(zygote run --c); COMP_CWORD=2; _zygote zygote --c run
        echo "run flags: ${COMPREPLY[*]}""#;
    let output = Command::new("bash")
        .args(["--norc", "-c", probe, "probe"])
        .arg(&path)
        .output()
        .expect("run bash");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("subcommands: serve status") && text.contains("run flags: --close-fds"),
        "bash completion: {}\n{text}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn completions_generate_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&["completions", shell]);
        assert!(
            script.contains("serve") && script.contains("close-fds"),
            "{shell} completions name no subcommand or flag:\n{script}"
        );
    }
    // Syntax checks by the shells themselves (scripts/test installs them).
    for (shell, check) in [("zsh", "-n"), ("fish", "--no-execute")] {
        if !have_tool(shell, shell) {
            continue;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("zygote");
        std::fs::write(&path, stdout(&["completions", shell])).expect("write script");
        let status = Command::new(shell)
            .arg(check)
            .arg(&path)
            .status()
            .expect("run shell");
        assert!(
            status.success(),
            "{shell} {check} on the completions: {status}"
        );
    }
}
