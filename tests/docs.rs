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
        "--python-template",
        "Warm Python children:",
    ] {
        assert!(
            help.contains(needle),
            "`zygote run --help` lacks {needle:?}:\n{help}"
        );
    }
}

/// `man -l PAGE` at 80 columns: the text, after asserting that groff
/// rendered it without a warning.
fn render_man(page: &std::path::Path) -> String {
    let rendered = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("MANWIDTH", "80")
        .env("MAN_KEEP_FORMATTING", "")
        .stderr(Stdio::piped())
        .output()
        .expect("run man -l");
    assert!(
        rendered.status.success(),
        "man -l {}: {}\n{}",
        page.display(),
        rendered.status,
        String::from_utf8_lossy(&rendered.stderr)
    );
    // groff warns on stderr about roff it cannot place.
    let warnings = String::from_utf8_lossy(&rendered.stderr);
    assert!(
        warnings.trim().is_empty(),
        "man -l {} warned:\n{warnings}",
        page.display()
    );
    String::from_utf8_lossy(&rendered.stdout).into_owned()
}

fn assert_contains_all(text: &str, what: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{what} lacks {needle:?}:\n{text}");
    }
}

#[test]
fn man_pages_generate_and_render() {
    let page = stdout(&["man"]);
    assert!(page.contains(".TH zygote 1"), "not a roff page:\n{page}");
    let tmp = tempfile::tempdir().expect("tempdir");
    // A directory that does not exist yet, two levels deep: created, as
    // `install -d` would.
    let dir = tmp.path().join("share/man");
    let dir_arg = dir.to_str().expect("UTF-8 temp path");
    zygote(&["man", "--out-dir", dir_arg]);
    for name in [
        "zygote.1",
        "zygote-serve.1",
        "zygote-run.1",
        "zygote-status.1",
        "zygote-policy.5",
    ] {
        assert!(
            dir.join(name).exists(),
            "zygote man --out-dir wrote no {name}"
        );
    }
    // Written twice into the same directory, the serve page gains its
    // sections once.
    zygote(&["man", "--out-dir", dir_arg]);
    let serve = std::fs::read_to_string(dir.join("zygote-serve.1")).expect("read serve page");
    assert_eq!(serve.matches(".SH ENVIRONMENT").count(), 1, "{serve}");
    if !have_tool("man", "man-db") {
        return;
    }
    let run = render_man(&dir.join("zygote-run.1"));
    assert_contains_all(
        &run,
        "man -l zygote-run.1",
        &[
            "zygote-run",
            "SYNOPSIS",
            "--close-fds",
            "Exit status:",
            "File descriptors:",
        ],
    );
    let serve = render_man(&dir.join("zygote-serve.1"));
    assert_contains_all(
        &serve,
        "man -l zygote-serve.1",
        &[
            "ENVIRONMENT",
            "ZYGOTE_SOCKET",
            "ZYGOTE_LOG",
            "LISTEN_FDS",
            "FILES",
            "/run/zygote/zygote.sock",
            "EXIT STATUS",
            "125",
            // Hyphenation may break the name itself.
            "policy(5)",
        ],
    );
    let policy = render_man(&dir.join("zygote-policy.5"));
    assert_contains_all(
        &policy,
        "man -l zygote-policy.5",
        &[
            "zygote-policy(5)",
            "[connect]",
            "[limits]",
            "[[peer]]",
            "EXAMPLE",
        ],
    );
}

/// Every key the policy file accepts is in zygote-policy(5): each one the
/// page names is accepted by `zygote serve --policy` (an unknown key
/// stops the daemon), and the page names as many keys as the parser
/// knows.
#[test]
fn policy_page_documents_every_policy_key() {
    let page = zygote::cli::docs::POLICY_PAGE;
    let mut keys: Vec<(String, String)> = Vec::new();
    let mut table = String::new();
    let mut previous = "";
    for line in page.lines() {
        if let Some(name) = line
            .strip_prefix(".SH \"")
            .and_then(|l| l.strip_suffix('"'))
        {
            table = name.to_owned();
        }
        // A key's entry is the tag line of a `.TP` paragraph.
        let tag = previous == ".TP";
        previous = line;
        if !tag || !table.starts_with('[') {
            continue;
        }
        for part in line.split("\\fB").skip(1) {
            let key = part.split("\\fR").next().unwrap_or_default();
            if key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                keys.push((table.clone(), key.to_owned()));
            }
        }
    }
    let mut policy = String::new();
    for section in ["[connect]", "[limits]", "[[peer]]"] {
        policy.push_str(section);
        policy.push('\n');
        for (_, key) in keys.iter().filter(|(table, _)| table == section) {
            let value = match key.as_str() {
                "any" | "run_as_any" | "raise_rlimits" => "false",
                "uids" | "gids" | "run_as_uids" | "run_as_gids" => "[1000]",
                "sandbox" => "\"p\"",
                _ => "100000",
            };
            policy.push_str(&format!("{key} = {value}\n"));
        }
    }
    // Every profile key in one table, but a custom filter (which excludes a
    // named seccomp profile) in another.
    for (name, filter) in [("p", false), ("q", true)] {
        policy.push_str(&format!("[sandbox.{name}]\n"));
        let profile_keys = keys.iter().filter(|(table, _)| table == "[sandbox.NAME]");
        for (_, key) in profile_keys {
            if (key == "seccomp_filter") != filter {
                continue;
            }
            let value = match key.as_str() {
                "network" => "\"none\"",
                "isolate" | "landlock_require" => "true",
                "hostname" => "\"box\"",
                "seccomp" => "\"default\"",
                "seccomp_filter" => "\"default allow\\nptrace\\n\"",
                "landlock_tcp_bind" | "landlock_tcp_connect" => "[80]",
                _ => "[\"/usr\"]",
            };
            policy.push_str(&format!("{key} = {value}\n"));
        }
    }
    // 3 + 7 + 12 keys: the fields of the parser's three tables; 14 of a
    // sandbox profile.
    assert_eq!(keys.len(), 36, "keys named in zygote-policy(5): {keys:?}");
    let parsed = zygote::daemon::policy::Policy::parse(&policy, 0);
    assert!(parsed.is_ok(), "{policy}\n{:?}", parsed.err());
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
        assert!(
            !script.contains("uid-spawner") && !script.contains("check-state"),
            "{shell} completions offer a hidden command:\n{script}"
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
