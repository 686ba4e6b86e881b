//! `zygote run -t` under a real terminal emulator (tmux): each interactive
//! scenario runs once directly and once through the zygote, and both must
//! show the same thing. Assertions poll the screen with generous deadlines;
//! no fixed sleep decides an outcome.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Signal, pidfd_send_signal};
use zygote_client::{Client, JobState};
use zygote_proto::{
    ClientMessage, ContinueNotice, Hello, PROTOCOL_VERSION, PtySpec, RECV_BUFFER_BYTES,
    ServerMessage, SpawnRequest, SpawnStage, StdioSpec, StopNotice, WindowSize, decode, encode,
    recv_frame, send_frame, socket,
};

use crate::util::{Daemon, children_of, start_daemon, within, zygote_bin};

/// How long a screen may take to show what a step expects, on a loaded
/// 2-core machine.
const DEADLINE: Duration = Duration::from_secs(30);

/// The shell's prompt inside tmux; distinct from anything a program prints.
const PROMPT: &str = "ready$ ";

/// One tmux server with one window running `bash`, on its own socket.
struct Tmux {
    socket: PathBuf,
    /// Stops the server once this test process is gone, even when no
    /// Drop ran (a test stopped by its deadline or by fail-fast).
    watchdog: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Tmux {
    /// Starts tmux with a `cols` × `rows` window running an interactive
    /// bash that knows `$ZYGOTE` and the daemon's socket; `None`, after
    /// saying so loudly, when tmux is not installed.
    fn start(daemon: &Daemon, cols: u16, rows: u16) -> Option<Self> {
        if !crate::tools::have_tool("tmux", "tmux") {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("tmux.sock");
        let status = Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args(["-f", "/dev/null", "new-session", "-d", "-s", "t", "-c"])
            .arg(dir.path())
            .args(["-x", &cols.to_string(), "-y", &rows.to_string()])
            .args(["env", "-i"])
            .arg(format!(
                "PATH={}",
                std::env::var("PATH").unwrap_or_default()
            ))
            .arg(format!("HOME={}", dir.path().display()))
            .arg("TERM=xterm")
            .arg(format!("PS1={PROMPT}"))
            .arg(format!("ZYGOTE={}", zygote_bin().display()))
            .arg(format!("ZYGOTE_SOCKET={}", daemon.socket().display()))
            .args(["bash", "--norc", "--noprofile", "-i"])
            .status()
            .expect("run tmux");
        assert!(status.success(), "tmux new-session failed");
        let watchdog = Command::new("/bin/sh")
            .args([
                "-c",
                "while kill -0 \"$1\" 2>/dev/null; do sleep 1; done; tmux -S \"$2\" kill-server",
                "watchdog",
            ])
            .arg(std::process::id().to_string())
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the tmux watchdog");
        let tmux = Self {
            socket,
            watchdog,
            _dir: dir,
        };
        // A fixed size: the window must not follow a client's (there is none).
        tmux.tmux(&["set-option", "-g", "window-size", "manual"]);
        tmux.wait_prompt();
        Some(tmux)
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` literally.
    fn type_text(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "t", "-l", text]);
    }

    /// Types `text` and Enter.
    fn line(&self, text: &str) {
        self.type_text(text);
        self.key("Enter");
    }

    /// Presses a key by tmux's name for it (`C-c`, `Escape`, ...).
    fn key(&self, key: &str) {
        self.tmux(&["send-keys", "-t", "t", key]);
    }

    /// The visible screen.
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "t"])
    }

    /// Clears the screen and the history, so later waits see only what
    /// follows.
    fn clear(&self) {
        self.line("clear");
        self.wait_for("a cleared screen", |screen| screen.trim() == PROMPT.trim());
    }

    /// Polls the screen until `ready` holds; panics with the screen when
    /// the deadline passes.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited {DEADLINE:?} for {what}; the screen shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the last line shows our shell's prompt (tmux trims the
    /// blank at its end).
    fn wait_prompt(&self) -> String {
        self.wait_for("the shell's prompt", |screen| {
            screen
                .lines()
                .rev()
                .find(|line| !line.trim().is_empty())
                .is_some_and(|line| line.trim_end() == PROMPT.trim_end())
        })
    }

    /// Waits until the screen contains `text`.
    fn wait_text(&self, text: &str) -> String {
        self.wait_for(&format!("{text:?}"), |screen| screen.contains(text))
    }

    /// Waits for a line that is exactly `line` (after trimming).
    fn wait_line(&self, line: &str) -> String {
        self.wait_for(&format!("a line {line:?}"), |screen| {
            screen.lines().any(|l| l.trim_end() == line)
        })
    }

    fn resize(&self, cols: u16, rows: u16) {
        self.tmux(&[
            "resize-window",
            "-t",
            "t",
            "-x",
            &cols.to_string(),
            "-y",
            &rows.to_string(),
        ]);
    }

    /// The pid of the shell in the window.
    fn shell_pid(&self) -> u32 {
        self.tmux(&["display-message", "-p", "-t", "t", "#{pane_pid}"])
            .trim()
            .parse()
            .expect("pane pid")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .status();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}

/// How a scenario runs its command: directly, or through `zygote run -t`.
#[derive(Debug, Clone, Copy)]
enum Via {
    Direct,
    Zygote,
}

impl Via {
    fn prefix(self) -> &'static str {
        match self {
            Self::Direct => "",
            Self::Zygote => "\"$ZYGOTE\" run -t -- ",
        }
    }
}

/// Runs `scenario` directly, then through the zygote, each in a fresh
/// window, and checks that the terminal's settings afterwards are the ones
/// from before.
fn both_ways(name: &str, scenario: impl Fn(&Tmux, Via, &Daemon)) {
    let daemon = start_daemon(name);
    for via in [Via::Direct, Via::Zygote] {
        let Some(tmux) = Tmux::start(&daemon, 100, 30) else {
            return;
        };
        tmux.line("stty -g > before");
        tmux.clear();
        eprintln!("{name}: {via:?}");
        scenario(&tmux, via, &daemon);
        tmux.clear();
        tmux.line("stty -g | cmp -s - before && echo TERMINAL-SAME || echo TERMINAL-CHANGED");
        tmux.wait_text("TERMINAL-");
        let screen = tmux.screen();
        assert!(
            screen.contains("TERMINAL-SAME"),
            "{name} {via:?}: the terminal was not restored:\n{screen}"
        );
    }
}

#[test]
fn bash_has_job_control_on_its_terminal() {
    both_ways("pty-bash", |tmux, via, _| {
        tmux.line(&format!(
            "{}env PS1='inner$ ' bash --norc --noprofile -i",
            via.prefix()
        ));
        let screen = tmux.wait_text("inner$");
        assert!(
            !screen.contains("no job control"),
            "{via:?}: bash has no job control:\n{screen}"
        );
        let sleep = Sleep("100.5");
        tmux.line(&format!("{} &", sleep.command()));
        tmux.wait_text("[1] ");
        tmux.line("jobs");
        tmux.wait_text("Running");
        tmux.line("fg");
        tmux.wait_line(&sleep.command());
        tmux.key("C-z");
        tmux.wait_text("Stopped");
        tmux.clear_inner();
        tmux.line("jobs; tty");
        let screen = tmux.wait_text("/dev/pts/");
        assert!(screen.contains("Stopped"), "{via:?}:\n{screen}");
        // Back to the foreground, then interrupted: no job is left.
        tmux.line("fg");
        wait_until(tmux, "sleep to run again", || !sleep.stopped());
        tmux.key("C-c");
        wait_until(tmux, "sleep to die", || sleep.pids().is_empty());
        tmux.line("jobs; echo no-more-jobs");
        tmux.wait_line("no-more-jobs");
        tmux.line("exit 7");
        tmux.wait_prompt();
        tmux.line("echo rc=$?");
        tmux.wait_line("rc=7");
    });
}

impl Tmux {
    /// Clears the screen of a shell other than ours (no prompt check).
    fn clear_inner(&self) {
        self.line("clear");
        self.wait_for("a cleared screen", |screen| {
            screen
                .lines()
                .filter(|line| !line.trim().is_empty())
                .count()
                <= 1
        });
    }
}

#[test]
fn ctrl_c_and_ctrl_backslash_end_sleep_and_a_shell_loop() {
    both_ways("pty-ctrl-c", |tmux, via, _| {
        let sleep = Sleep("100.1");
        let prefix = format!("{}{}", via.prefix(), sleep.command());
        // On its own line: bash drops the rest of a list after a command
        // that died of SIGINT.
        tmux.line(&prefix);
        sleep.wait_started(tmux);
        tmux.key("C-c");
        tmux.wait_prompt();
        tmux.line("echo rc=$?");
        tmux.wait_line("rc=130");
        tmux.clear();
        // Ctrl-\ quits it, with SIGQUIT.
        tmux.line(&prefix);
        sleep.wait_started(tmux);
        tmux.key("C-\\");
        tmux.wait_prompt();
        tmux.line("echo rc=$?");
        tmux.wait_line("rc=131");
        tmux.clear();
        // A loop is interrupted, not only its current command.
        tmux.line(&format!(
            "for i in 1 2; do {prefix}; echo round$i; done; echo done"
        ));
        sleep.wait_started(tmux);
        tmux.key("C-c");
        let screen = tmux.wait_prompt();
        assert!(
            !screen.contains("round1") && !screen.contains("\ndone"),
            "{via:?}: the loop went on after Ctrl-C:\n{screen}"
        );
    });
}

/// A child killed by SIGKILL or by a real-time signal: the wrapper dies
/// by it too, which an interactive bash reports by the signal's name (an
/// exit with 128 + N prints nothing).
#[test]
fn a_child_killed_by_sigkill_or_a_realtime_signal_is_reported_so() {
    both_ways("pty-kill", |tmux, via, _| {
        tmux.line(&format!("{}sh -c 'kill -KILL $$'", via.prefix()));
        tmux.wait_prompt();
        tmux.line("echo rc=$?");
        let screen = tmux.wait_line("rc=137");
        assert!(screen.contains("Killed"), "{via:?}:\n{screen}");
        tmux.line("clear");
        tmux.line(&format!("{}sh -c 'kill -s RTMIN $$'", via.prefix()));
        tmux.wait_prompt();
        tmux.line("echo rc=$?");
        let screen = tmux.wait_line("rc=162");
        assert!(screen.contains("Real-time signal 0"), "{via:?}:\n{screen}");
    });
}

/// A `sleep` with an argument of its own, so that a test finds its own
/// process among those of tests running in parallel (here and elsewhere
/// on the machine).
#[derive(Debug, Clone, Copy)]
struct Sleep(&'static str);

impl Sleep {
    /// The command line to type.
    fn command(self) -> String {
        format!("sleep {}", self.0)
    }

    /// Its pids: one at most, in practice.
    fn pids(self) -> Vec<u32> {
        let cmdline = format!("sleep\0{}\0", self.0);
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .filter(|pid: &u32| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|cmd| cmd == cmdline.as_bytes())
            })
            .collect()
    }

    /// Whether it is stopped (state `T`).
    fn stopped(self) -> bool {
        self.pids()
            .into_iter()
            .any(|pid| crate::util::process_state(pid) == Some('T'))
    }

    /// Waits until it runs.
    fn wait_started(self, tmux: &Tmux) {
        wait_until(tmux, "sleep to start", || !self.pids().is_empty());
    }
}

fn wait_until(tmux: &Tmux, what: &str, condition: impl FnMut() -> bool) {
    assert!(
        crate::util::eventually(DEADLINE, condition),
        "waited {DEADLINE:?} for {what}; the screen shows:\n{}",
        tmux.screen()
    );
}

#[test]
fn ctrl_z_stops_a_program_and_fg_resumes_it() {
    both_ways("pty-ctrl-z", |tmux, via, _| {
        let sleep = Sleep("100.2");
        tmux.line(&format!("{}{}", via.prefix(), sleep.command()));
        sleep.wait_started(tmux);
        tmux.key("C-z");
        tmux.wait_prompt();
        tmux.clear();
        tmux.line("jobs");
        tmux.wait_for("a stopped job", |screen| {
            screen
                .lines()
                .any(|line| line.starts_with("[1]+  Stopped ") && line.contains("sleep 100.2"))
        });
        assert!(sleep.stopped(), "{via:?}: sleep is not stopped");
        tmux.clear();
        tmux.line("fg");
        wait_until(tmux, "sleep to run again", || !sleep.stopped());
        tmux.key("C-c");
        tmux.wait_prompt();
        tmux.line("echo rc=$?");
        tmux.wait_line("rc=130");
    });
}

#[test]
fn a_stop_signal_to_the_child_stops_the_wrapper_too() {
    both_ways("pty-sigstop", |tmux, via, daemon| {
        let sleep = Sleep("100.3");
        tmux.line(&format!("{}{}", via.prefix(), sleep.command()));
        sleep.wait_started(tmux);
        let parent = match via {
            Via::Direct => tmux.shell_pid(),
            Via::Zygote => daemon.pid(),
        };
        let pid = sleep.pids()[0];
        assert!(
            children_of(parent).contains(&pid),
            "{via:?}: sleep is not a child of the shell or the zygote"
        );
        let status = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        tmux.wait_text("Stopped");
        tmux.wait_prompt();
        tmux.clear();
        tmux.line("fg");
        wait_until(tmux, "sleep to run again", || !sleep.stopped());
        // Continued: Ctrl-C reaches a running sleep.
        tmux.key("C-c");
        tmux.wait_prompt();
        tmux.line("echo rc=$?");
        tmux.wait_line("rc=130");
    });
}

#[test]
fn python_repl_evaluates_and_is_interrupted() {
    both_ways("pty-python", |tmux, via, _| {
        tmux.line(&format!("{}python3 -q", via.prefix()));
        tmux.wait_text(">>>");
        tmux.line("import os; print(6 * 7, os.isatty(0))");
        tmux.wait_line("42 True");
        tmux.type_text("while True: pass");
        tmux.key("Enter");
        tmux.key("Enter");
        tmux.wait_for("the loop to run", |screen| {
            screen.matches(">>> ").count() == 2
        });
        tmux.key("C-c");
        tmux.wait_text("KeyboardInterrupt");
        tmux.line("raise SystemExit(5)");
        tmux.wait_prompt();
        tmux.line("echo rc=$?");
        tmux.wait_line("rc=5");
    });
}

#[test]
fn vi_edits_a_file_full_screen() {
    both_ways("pty-vi", |tmux, via, _| {
        tmux.line("rm -f edited.txt");
        tmux.line(&format!("{}vi -u NONE -N edited.txt", via.prefix()));
        // Full screen: empty lines shown as '~' down to the status line.
        tmux.wait_for("vi's screen", |screen| {
            screen.lines().filter(|line| line.starts_with('~')).count() >= 20
        });
        tmux.type_text("ihello from vi");
        tmux.key("Escape");
        tmux.type_text(":wq");
        tmux.key("Enter");
        tmux.wait_prompt();
        tmux.clear();
        tmux.line("cat edited.txt; echo rc=$?");
        tmux.wait_line("rc=0");
        assert!(tmux.screen().contains("hello from vi"), "{via:?}");
    });
}

#[test]
fn a_resize_reaches_the_child() {
    both_ways("pty-resize", |tmux, via, _| {
        tmux.line(&format!(
            "{}env PS1='inner$ ' bash --norc --noprofile -i",
            via.prefix()
        ));
        tmux.wait_text("inner$");
        tmux.line("stty size");
        tmux.wait_line("30 100");
        tmux.resize(90, 25);
        tmux.clear_inner();
        tmux.line("stty size");
        tmux.wait_line("25 90");
        tmux.line("exit");
        tmux.wait_prompt();
        tmux.resize(100, 30);
    });
}

#[test]
fn a_signal_to_the_wrapper_restores_the_terminal() {
    let daemon = start_daemon("pty-killed");
    let Some(tmux) = Tmux::start(&daemon, 100, 30) else {
        return;
    };
    tmux.line("stty -g > before");
    tmux.clear();
    let sleep = Sleep("100.4");
    tmux.line(&format!(
        "\"$ZYGOTE\" run -t -- {}; echo rc=$?",
        sleep.command()
    ));
    sleep.wait_started(&tmux);
    let wrapper = children_of(tmux.shell_pid())
        .into_iter()
        .next()
        .expect("the wrapper runs under the shell");
    assert!(
        eventually_raw(wrapper_terminal(&tmux)),
        "the wrapper's terminal never went raw"
    );
    let status = Command::new("kill")
        .args(["-TERM", &wrapper.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    // Forwarded: sleep dies of it, and so does the wrapper, as a shell sees.
    tmux.wait_line(&format!("rc={}", 128 + libc::SIGTERM));
    tmux.line("stty -g | cmp -s - before && echo TERMINAL-SAME || echo TERMINAL-CHANGED");
    let screen = tmux.wait_text("TERMINAL-");
    assert!(screen.contains("TERMINAL-SAME"), "{screen}");
}

/// `timeout` puts the command it runs in a process group of its own,
/// which is in the background when the shell that started `timeout` has no
/// job control (a script). The wrapper then stops at once, as `stty raw`
/// does, before it changes the terminal or starts the child, and the
/// `SIGINT` that `timeout` sends after a second ends it: exit 124, no child
/// left, the terminal as before. With `--foreground`, it runs in the
/// shell's group: the child gets the terminal, `SIGINT` is forwarded, and
/// nothing stray (`^@`) shows on the terminal.
#[test]
fn timeout_ends_a_wrapper_started_in_a_background_group() {
    let daemon = start_daemon("pty-background-group");
    let Some(tmux) = Tmux::start(&daemon, 100, 30) else {
        return;
    };
    tmux.line("stty -g > before");
    tmux.clear();
    let sleep = Sleep("100.6");
    for flag in ["", "--foreground "] {
        tmux.line(&format!(
            "bash -c 'timeout {flag}-s INT 1 \"$ZYGOTE\" run -t -- {}; echo rc=$?'",
            sleep.command()
        ));
        let screen = tmux.wait_line("rc=124");
        assert!(!screen.contains("^@"), "timeout {flag}: {screen}");
        wait_until(&tmux, "no sleep left", || sleep.pids().is_empty());
        tmux.line("stty -g | cmp -s - before && echo TERMINAL-SAME || echo TERMINAL-CHANGED");
        let screen = tmux.wait_text("TERMINAL-");
        assert!(screen.contains("TERMINAL-SAME"), "timeout {flag}: {screen}");
        tmux.clear();
    }
}

/// Started in the background by an interactive shell, the wrapper stops
/// (`Stopped`, as vi or `stty raw` would) before it starts its command,
/// and runs it once brought to the foreground.
#[test]
fn a_wrapper_started_in_the_background_waits_for_the_foreground() {
    let daemon = start_daemon("pty-background-job");
    let Some(tmux) = Tmux::start(&daemon, 100, 30) else {
        return;
    };
    let tty = wrapper_terminal(&tmux);
    let sleep = Sleep("100.7");
    tmux.line(&format!("\"$ZYGOTE\" run -t -- {} &", sleep.command()));
    tmux.wait_text("[1] ");
    let shell = tmux.shell_pid();
    wait_until(&tmux, "the wrapper to stop", || {
        children_of(shell)
            .into_iter()
            .any(|pid| crate::util::process_state(pid) == Some('T'))
    });
    tmux.line("jobs");
    tmux.wait_text("Stopped");
    assert!(
        sleep.pids().is_empty(),
        "the child started in the background"
    );
    tmux.line("fg");
    sleep.wait_started(&tmux);
    assert!(
        eventually_raw(tty),
        "the terminal never went raw in the foreground"
    );
    tmux.key("C-c");
    tmux.wait_prompt();
    tmux.line("echo rc=$?");
    tmux.wait_line("rc=130");
}

/// The tty of the window, as the shell sees it.
fn wrapper_terminal(tmux: &Tmux) -> PathBuf {
    let pid = tmux.shell_pid();
    std::fs::read_link(format!("/proc/{pid}/fd/0")).expect("the shell's tty")
}

/// Whether `tty` goes to raw mode (no ICANON) within the deadline.
fn eventually_raw(tty: PathBuf) -> bool {
    crate::util::eventually(DEADLINE, || is_raw(&tty))
}

fn is_raw(tty: &Path) -> bool {
    let Ok(file) = std::fs::File::open(tty) else {
        return false;
    };
    rustix::termios::tcgetattr(&file).is_ok_and(|settings| {
        !settings
            .local_modes
            .contains(rustix::termios::LocalModes::ICANON)
    })
}

#[test]
fn without_a_terminal_on_stdin_it_warns_and_runs_without_one() {
    let daemon = start_daemon("pty-no-tty");
    let out = Command::new(zygote_bin())
        .args([
            "run",
            "-t",
            "--",
            "sh",
            "-c",
            "test -t 0 || echo no-tty; exit 3",
        ])
        .env("ZYGOTE_SOCKET", daemon.socket())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run zygote");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, b"no-tty\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pseudo-terminal will not be allocated because stdin is not a terminal"),
        "{stderr}"
    );
}

/// A raw connection that has said hello.
fn raw_connection(daemon: &Daemon) -> OwnedFd {
    let fd = socket::connect_to(daemon.socket(), false).expect("connect");
    let hello = ClientMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "terminal test".into(),
    });
    send_frame(fd.as_fd(), &encode(&hello).unwrap(), &[]).expect("send hello");
    let (reply, _) = receive(&fd);
    assert!(matches!(reply, ServerMessage::HelloAck(_)), "{reply:?}");
    fd
}

fn receive(fd: &OwnedFd) -> (ServerMessage, Vec<OwnedFd>) {
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let frame = recv_frame(fd.as_fd(), &mut scratch)
        .expect("recv")
        .expect("the daemon closed the connection");
    (decode(&frame.bytes).expect("decode"), frame.fds)
}

/// Spawns `sleep 100` on a raw connection, then stops, continues and kills
/// it, each step once the previous one shows; returns every message that
/// followed `Spawned`. With `report_stops`, each step waits for its notice
/// too: the kernel keeps only a child's latest change, so a continue sent
/// before the daemon looked would hide the stop.
fn stop_continue_kill(daemon: &Daemon, report_stops: bool) -> Vec<ServerMessage> {
    let fd = raw_connection(daemon);
    let request = ClientMessage::Spawn(SpawnRequest {
        args: vec![b"100".to_vec()],
        report_stops,
        ..SpawnRequest::new(1, "/bin/sleep")
    });
    send_frame(fd.as_fd(), &encode(&request).unwrap(), &[]).expect("send spawn");
    let (reply, fds) = receive(&fd);
    let ServerMessage::Spawned(spawned) = reply else {
        panic!("expected Spawned, got {reply:?}");
    };
    let pidfd = &fds[0];
    let state = |wanted: char| {
        let pid = spawned.pid.unsigned_abs();
        crate::util::eventually(DEADLINE, || crate::util::process_state(pid) == Some(wanted))
    };
    let mut messages = Vec::new();
    pidfd_send_signal(pidfd, Signal::STOP).expect("SIGSTOP");
    assert!(state('T'), "the child never stopped");
    if report_stops {
        messages.push(receive(&fd).0);
    }
    pidfd_send_signal(pidfd, Signal::CONT).expect("SIGCONT");
    assert!(state('S'), "the child never continued");
    if report_stops {
        messages.push(receive(&fd).0);
    }
    pidfd_send_signal(pidfd, Signal::KILL).expect("SIGKILL");
    loop {
        let (message, _) = receive(&fd);
        let last = matches!(message, ServerMessage::Exited(_));
        messages.push(message);
        if last {
            return messages;
        }
    }
}

#[test]
fn stops_and_continues_are_reported_only_when_asked() {
    let daemon = start_daemon("pty-stop-notices");
    let messages = stop_continue_kill(&daemon, true);
    assert_eq!(
        messages[..2],
        [
            ServerMessage::Stopped(StopNotice {
                id: 1,
                signal: libc::SIGSTOP
            }),
            ServerMessage::Continued(ContinueNotice { id: 1 }),
        ],
        "{messages:?}"
    );
    assert_eq!(messages.len(), 3, "{messages:?}");
    // Without `report_stops`, an old client sees what it always saw.
    let messages = stop_continue_kill(&daemon, false);
    assert_eq!(messages.len(), 1, "{messages:?}");
}

#[test]
fn a_pty_request_with_stdio_is_refused_and_the_daemon_serves_on() {
    let daemon = start_daemon("pty-refused");
    let fd = raw_connection(&daemon);
    let request = ClientMessage::Spawn(SpawnRequest {
        pty: Some(PtySpec {
            window: WindowSize { rows: 24, cols: 80 },
        }),
        stdout: StdioSpec::Pipe,
        ..SpawnRequest::new(1, "/bin/true")
    });
    send_frame(fd.as_fd(), &encode(&request).unwrap(), &[]).expect("send spawn");
    let (reply, fds) = receive(&fd);
    let ServerMessage::SpawnFailed(failed) = reply else {
        panic!("expected SpawnFailed, got {reply:?}");
    };
    assert_eq!(
        (failed.stage, failed.errno),
        (SpawnStage::Validate, libc::EINVAL)
    );
    assert!(failed.message.contains("Null"), "{}", failed.message);
    assert!(fds.is_empty());
    // The same connection still spawns.
    let request = ClientMessage::Spawn(SpawnRequest::new(2, "/bin/true"));
    send_frame(fd.as_fd(), &encode(&request).unwrap(), &[]).expect("send spawn");
    assert!(matches!(receive(&fd).0, ServerMessage::Spawned(_)));
}

/// The Rust client: `Command::pty` gives a session leader on a terminal of
/// the asked size, and its master; `job_events` follows its stops.
#[test]
fn the_client_gets_the_master_and_job_events() {
    let daemon = start_daemon("pty-client");
    crate::util::runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let mut child = zygote_client::Command::new(&client, "/bin/sh")
            .args([
                "-c",
                // Session leader ($$ is the session id), terminal on 0-2,
                // /dev/tty usable, then wait for a line.
                "read -r _ _ _ _ _ sid _ </proc/$$/stat && test $sid -eq $$ \
                 && test -t 0 -a -t 1 -a -t 2 && stty size </dev/tty && echo leader; \
                 read line; echo got:$line",
            ])
            .pty(33, 111)
            .report_stops(true)
            .spawn()
            .await
            .expect("spawn");
        let master = child.pty.take().expect("the master comes back");
        let mut jobs = child.job_events();
        let mut terminal = std::fs::File::from(master);
        let read_until = |terminal: &mut std::fs::File, needle: &str| {
            let mut seen = String::new();
            let mut buffer = [0u8; 1024];
            while !seen.contains(needle) {
                let read = terminal.read(&mut buffer).expect("read the master");
                assert!(read > 0, "the terminal closed; it showed {seen:?}");
                seen.push_str(&String::from_utf8_lossy(&buffer[..read]));
            }
            seen
        };
        let shown = read_until(&mut terminal, "leader");
        assert!(shown.contains("33 111"), "{shown:?}");
        pidfd_send_signal(child.pidfd(), Signal::STOP).expect("SIGSTOP");
        assert_eq!(jobs.changed().await, Some(JobState::Stopped(libc::SIGSTOP)));
        pidfd_send_signal(child.pidfd(), Signal::CONT).expect("SIGCONT");
        assert_eq!(jobs.changed().await, Some(JobState::Running));
        terminal.write_all(b"hi\n").expect("write the master");
        read_until(&mut terminal, "got:hi");
        let status = within(Duration::from_secs(60), "wait", child.wait())
            .await
            .expect("wait");
        assert_eq!(status.code(), Some(0));
        assert_eq!(jobs.changed().await, None);
    });
}
