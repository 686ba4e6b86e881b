//! `zygote run -- CMD` against `CMD` run directly: each test runs the same
//! shell script twice, once with `$RUN` empty and once with `$RUN` set to
//! `zygote run --`, and compares what a user would see.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::util::{
    Daemon, eventually, output_within, process_state, start_daemon, start_daemon_with, wait_within,
    zygote_bin,
};

/// `sh -c script` with `$RUN` as given and the daemon's socket in
/// `$ZYGOTE_SOCKET`.
fn shell(socket: &Path, run: &str, script: &str) -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(script)
        .env("ZYGOTE", zygote_bin())
        .env("ZYGOTE_SOCKET", socket)
        .env("RUN", run);
    command
}

fn through_zygote() -> String {
    format!("{} run --", zygote_bin().display())
}

/// The script's output run directly, then through zygote.
fn both(daemon: &Daemon, script: &str) -> (Output, Output) {
    let direct = shell(daemon.socket(), "", script).output().expect("run sh");
    let wrapped = shell(daemon.socket(), &through_zygote(), script)
        .output()
        .expect("run sh");
    (direct, wrapped)
}

/// Asserts that both runs printed the same and ended the same way.
fn assert_same(daemon: &Daemon, script: &str) -> Output {
    let (direct, wrapped) = both(daemon, script);
    assert_eq!(
        String::from_utf8_lossy(&wrapped.stdout),
        String::from_utf8_lossy(&direct.stdout),
        "stdout differs for {script:?}; stderr through zygote: {}",
        String::from_utf8_lossy(&wrapped.stderr)
    );
    assert_eq!(
        (wrapped.status.code(), wrapped.status.signal()),
        (direct.status.code(), direct.status.signal()),
        "exit differs for {script:?}; stderr: {}",
        String::from_utf8_lossy(&wrapped.stderr)
    );
    wrapped
}

/// Reads the pid a script wrote to `path`, waiting for it.
fn read_pid(path: &Path) -> u32 {
    let mut pid = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            pid = std::fs::read_to_string(path)
                .ok()
                .and_then(|text| text.trim().parse().ok());
            pid.is_some()
        }),
        "no pid in {}",
        path.display()
    );
    pid.expect("checked above")
}

fn alive(pid: u32) -> bool {
    process_state(pid).is_some_and(|state| state != 'Z')
}

/// `zygote run FLAGS -- ARGS`, started directly (no shell around the
/// wrapper), and the pid the child writes to `pidfile`.
fn wrapped(
    daemon: &Daemon,
    flags: &[&str],
    args: &[&std::ffi::OsStr],
    pidfile: &Path,
) -> (Child, u32) {
    let _ = std::fs::remove_file(pidfile);
    let wrapper = Command::new(zygote_bin())
        .arg("run")
        .args(flags)
        .arg("--")
        .args(args)
        .env("ZYGOTE_SOCKET", daemon.socket())
        .stdin(Stdio::null())
        // A job of its own, as a shell with job control starts it, whose
        // parent (this test) is in another group of the same session: the
        // kernel discards SIGTSTP, SIGTTIN and SIGTTOU in an orphaned
        // group, which the test's own group may be under CI.
        .process_group(0)
        .spawn()
        .expect("start zygote run");
    let child = read_pid(pidfile);
    (wrapper, child)
}

/// `zygote run -- sh -c 'echo $$ > pidfile; SCRIPT'`, as [`wrapped`].
fn wrapped_shell(daemon: &Daemon, dir: &Path, flags: &[&str], script: &str) -> (Child, u32) {
    let pidfile = dir.join("child.pid");
    let line = format!("echo $$ > '{}'; {script}", pidfile.display());
    wrapped(
        daemon,
        flags,
        &["sh".as_ref(), "-c".as_ref(), line.as_ref()],
        &pidfile,
    )
}

/// `zygote run -- sh -c 'echo $$ > pidfile; exec sleep 30'`, and the
/// sleeping child's pid.
fn wrapped_sleeper(daemon: &Daemon, dir: &Path, flags: &[&str]) -> (Child, u32) {
    wrapped_shell(daemon, dir, flags, "exec sleep 30")
}

/// `kill -SIG -pgid`.
fn signal_group(pgid: u32, signal: i32) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} -{pgid}");
}

/// SIGKILLs its processes when dropped, through pidfds (never a pid that
/// was reused): a test that fails midway leaves no stopped wrapper and
/// no looping child behind.
struct KillOnDrop(Vec<std::os::fd::OwnedFd>);

impl KillOnDrop {
    fn new(pids: &[u32]) -> Self {
        Self(
            pids.iter()
                .filter_map(|&pid| rustix::process::Pid::from_raw(pid as i32))
                .filter_map(|pid| {
                    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
                })
                .collect(),
        )
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pidfd in &self.0 {
            let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
        }
    }
}

/// kill(1): the real-time signals have no name in rustix.
fn signal(pid: u32, signal: i32) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

#[test]
fn a_killed_wrapper_takes_its_child_with_it() {
    let daemon = start_daemon("run-kill-wrapper");
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut wrapper, child) = wrapped_sleeper(&daemon, dir.path(), &[]);
    signal(wrapper.id(), libc::SIGKILL);
    let status = wrapper.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(
        eventually(Duration::from_secs(10), || !alive(child)),
        "the child {child} outlived its SIGKILLed wrapper"
    );

    // Unless asked otherwise.
    let (mut wrapper, child) = wrapped_sleeper(&daemon, dir.path(), &["--no-kill-on-close"]);
    signal(wrapper.id(), libc::SIGKILL);
    wrapper.wait().expect("wait");
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(child), "--no-kill-on-close child was killed");
    signal(child, libc::SIGKILL);
}

/// A child that reports the signal it gets: `sh child.sh N got pidfile`
/// writes its pid, waits, and on signal N appends N to `got`, then dies by
/// N as an unhandled signal would kill it.
const REPORTING_CHILD: &str = r#"trap 'echo "$1" >> "$2"; kill $! 2>/dev/null; trap - "$1"; kill -"$1" $$' "$1"
echo $$ > "$3"
sleep 30 &
wait
"#;

/// `zygote run -- sh child.sh N got pidfile`, started as in [`wrapped`],
/// and the child's pid.
fn wrapped_reporter(daemon: &Daemon, dir: &Path, number: i32, got: &Path) -> (Child, u32) {
    let script = dir.join("child.sh");
    std::fs::write(&script, REPORTING_CHILD).expect("write the child's script");
    let pidfile = dir.join("child.pid");
    let number = number.to_string();
    let args = [
        "sh".as_ref(),
        script.as_os_str(),
        number.as_ref(),
        got.as_os_str(),
        pidfile.as_os_str(),
    ];
    wrapped(daemon, &[], &args, &pidfile)
}

#[test]
fn every_catchable_signal_reaches_the_child_and_the_wrapper_dies_by_it() {
    let daemon = start_daemon("run-forward");
    let dir = tempfile::tempdir().expect("tempdir");
    for number in [
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGTERM,
        // Ignored by the wrapper's own runtime, not by its caller.
        libc::SIGPIPE,
        libc::SIGRTMIN() + 2,
    ] {
        let got = dir.path().join(format!("got-{number}"));
        let (mut wrapper, child) = wrapped_reporter(&daemon, dir.path(), number, &got);
        // The wrapper installs its handlers right after the spawn.
        std::thread::sleep(Duration::from_millis(200));
        signal(wrapper.id(), number);
        let status = wait_within(&mut wrapper, Duration::from_secs(30), "zygote run");
        // The child itself caught it (a wrapper that only died of it would
        // take the child with it by SIGKILL, kill-on-close).
        assert_eq!(
            std::fs::read_to_string(&got).unwrap_or_default(),
            format!("{number}\n"),
            "signal {number} never reached the child"
        );
        // As the child itself: killed by that signal, seen by the shell as
        // a signal death (not exit 128+N).
        assert_eq!(status.signal(), Some(number), "signal {number}: {status:?}");
        assert!(
            eventually(Duration::from_secs(10), || !alive(child)),
            "signal {number} did not end the child"
        );
    }
}

#[test]
fn death_by_signal_is_seen_by_the_shell_like_the_childs() {
    let daemon = start_daemon("run-die-by");
    // The shell sees 128+N either way.
    assert_same(&daemon, r#"$RUN sh -c 'kill -TERM $$'; echo "status $?""#);
    assert_same(&daemon, r#"$RUN sh -c 'exit 130'"#);
    // bash execs the last command of `-c`, so bash's own end is the
    // command's: a death by the signal, which an exit 128+N would not be.
    for (number, script) in [
        (
            libc::SIGUSR1,
            r#"exec bash -c "true; $RUN sh -c 'kill -USR1 \$\$'""#,
        ),
        (
            libc::SIGINT,
            r#"exec bash -c "true; $RUN sh -c 'kill -INT \$\$'""#,
        ),
        (
            libc::SIGKILL,
            r#"exec bash -c "true; $RUN sh -c 'kill -KILL \$\$'""#,
        ),
    ] {
        let (direct, wrapped) = both(&daemon, script);
        assert_eq!(direct.status.signal(), Some(number), "{script}: {direct:?}");
        assert_eq!(
            wrapped.status.signal(),
            Some(number),
            "{script}: {wrapped:?}"
        );
    }
}

/// A wrapper that inherited the child's signal blocked (through exec)
/// still dies by it, as the child did, rather than exit 128+N.
#[test]
fn a_wrapper_started_with_the_signal_blocked_still_dies_by_it() {
    let daemon = start_daemon("run-die-blocked");
    let block_then_exec = "import os, signal, sys\n\
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n\
        os.execv(sys.argv[1], sys.argv[1:])";
    let mut command = Command::new("python3");
    command
        .arg("-c")
        .arg(block_then_exec)
        .arg(zygote_bin())
        .args(["run", "--", "sh", "-c", "kill -USR1 $$"])
        .env("ZYGOTE_SOCKET", daemon.socket())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = output_within(
        command.spawn().expect("start python3"),
        Duration::from_secs(30),
        "zygote run",
    );
    assert_eq!(output.status.signal(), Some(libc::SIGUSR1), "{output:?}");
}

/// Ctrl-C: SIGINT to the whole foreground process group, bash's loop and
/// its command alike. The command is [`REPORTING_CHILD`], which appends
/// "2" to `got` when SIGINT reaches it.
fn ctrl_c_in_a_loop(daemon: &Daemon, run: &str, dir: &Path, got: &Path) -> Output {
    let script = dir.join("child.sh");
    std::fs::write(&script, REPORTING_CHILD).expect("write the child's script");
    let loop_ = shell(
        daemon.socket(),
        run,
        r#"exec bash -c 'for i in 1 2 3; do $RUN sh "$CHILD" 2 "$GOT" /dev/null; echo $i; done'"#,
    )
    .env("CHILD", &script)
    .env("GOT", got)
    .process_group(0)
    .stdout(Stdio::piped())
    .spawn()
    .expect("start bash");
    // Long enough for the wrapper to have installed its handlers.
    std::thread::sleep(Duration::from_millis(700));
    signal_group(loop_.id(), libc::SIGINT);
    output_within(loop_, Duration::from_secs(60), "bash's loop")
}

#[test]
fn ctrl_c_breaks_a_shell_loop() {
    let daemon = start_daemon("run-ctrl-c");
    let dir = tempfile::tempdir().expect("tempdir");
    let (direct_got, wrapped_got) = (dir.path().join("direct"), dir.path().join("wrapped"));
    let direct = ctrl_c_in_a_loop(&daemon, "", dir.path(), &direct_got);
    let wrapped = ctrl_c_in_a_loop(&daemon, &through_zygote(), dir.path(), &wrapped_got);
    // The command itself got the SIGINT, once, through the wrapper too
    // (a wrapper that only died of it would take it down by SIGKILL).
    let got = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    assert_eq!(got(&direct_got), "2\n", "{direct:?}");
    assert_eq!(got(&wrapped_got), "2\n", "{wrapped:?}");
    // bash ends the loop, and dies of SIGINT itself, only when its command
    // died of SIGINT; after an exit 130 it would print 1, 2, 3.
    assert_eq!(direct.status.signal(), Some(libc::SIGINT), "{direct:?}");
    assert_eq!(wrapped.status.signal(), Some(libc::SIGINT), "{wrapped:?}");
    assert_eq!(wrapped.stdout, direct.stdout);
}

#[test]
fn ignored_signals_stay_ignored_in_the_child() {
    let daemon = start_daemon("run-ignored");
    // As nohup, or a background job of a script, leaves them.
    let (direct, wrapped) = both(
        &daemon,
        r#"trap '' HUP INT USR1; $RUN sh -c 'grep SigIgn /proc/self/status'"#,
    );
    let mask = |out: &Output| {
        let text = String::from_utf8_lossy(&out.stdout);
        let hex = text.trim().trim_start_matches("SigIgn:").trim();
        u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("SigIgn in {out:?}"))
    };
    // glibc's own signal 33 (SIGSETXID) is the one exception: glibc takes
    // it over at the wrapper's start, so the wrapper cannot tell whether it
    // was ignored; no program can use it.
    let setxid = 1 << 32;
    assert_eq!(mask(&wrapped) & !setxid, mask(&direct) & !setxid);
    for number in [libc::SIGHUP, libc::SIGINT, libc::SIGUSR1] {
        assert_ne!(mask(&wrapped) & (1 << (number - 1)), 0, "signal {number}");
    }
    // And the child survives them, as run directly.
    assert_same(
        &daemon,
        r#"trap '' HUP; $RUN sh -c 'kill -HUP $$; echo survived'"#,
    );
    // nohup itself.
    assert_same(
        &daemon,
        r#"nohup $RUN sh -c 'kill -HUP $$; echo survived' 2>/dev/null"#,
    );
}

/// A child that reinstalls handlers for SIGUSR1 and SIGUSR2 (Python may,
/// even when started with them ignored): `python3 -c CHILD got pidfile`
/// appends each one's name to `got`.
const HANDLING_CHILD: &str = r#"import os, signal, sys, time
def note(number, frame):
    with open(sys.argv[1], "a") as got:
        got.write(signal.Signals(number).name + "\n")
signal.signal(signal.SIGUSR1, note)
signal.signal(signal.SIGUSR2, note)
with open(sys.argv[2], "w") as pidfile:
    pidfile.write(str(os.getpid()))
time.sleep(30)
"#;

#[test]
fn a_signal_the_wrapper_was_given_ignored_is_not_passed_on() {
    let daemon = start_daemon("run-ignored-kept");
    let dir = tempfile::tempdir().expect("tempdir");
    let (got, pidfile) = (dir.path().join("got"), dir.path().join("child.pid"));
    // As `trap '' USR1` in a script leaves the programs it runs.
    let mut wrapper = Command::new("sh")
        .arg("-c")
        .arg(r#"trap '' USR1; exec "$ZYGOTE" run -- python3 -c "$CHILD" "$GOT" "$PIDFILE""#)
        .env("ZYGOTE", zygote_bin())
        .env("ZYGOTE_SOCKET", daemon.socket())
        .env("CHILD", HANDLING_CHILD)
        .env("GOT", &got)
        .env("PIDFILE", &pidfile)
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start zygote run");
    let child = read_pid(&pidfile);
    std::thread::sleep(Duration::from_millis(200));
    signal(wrapper.id(), libc::SIGUSR1);
    // SIGUSR2, which it was not given ignored, is passed on: once it has
    // arrived, SIGUSR1 would have too.
    signal(wrapper.id(), libc::SIGUSR2);
    let read = || std::fs::read_to_string(&got).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(10), || read().contains("SIGUSR2")),
        "SIGUSR2 never reached the child: {:?}",
        read()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(read(), "SIGUSR2\n", "the ignored SIGUSR1 was passed on");
    signal(wrapper.id(), libc::SIGTERM);
    let status = wait_within(&mut wrapper, Duration::from_secs(30), "zygote run");
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert!(eventually(Duration::from_secs(10), || !alive(child)));
}

#[test]
fn stop_and_continue_reach_the_child_and_the_wrapper() {
    let daemon = start_daemon("run-stop");
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut wrapper, child) = wrapped_sleeper(&daemon, dir.path(), &[]);
    std::thread::sleep(Duration::from_millis(200));
    for stop in [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
        signal(wrapper.id(), stop);
        assert!(
            eventually(Duration::from_secs(10), || {
                process_state(child) == Some('T') && process_state(wrapper.id()) == Some('T')
            }),
            "signal {stop}: child {:?}, wrapper {:?}",
            process_state(child),
            process_state(wrapper.id())
        );
        signal(wrapper.id(), libc::SIGCONT);
        assert!(
            eventually(Duration::from_secs(10), || {
                process_state(child) == Some('S') && process_state(wrapper.id()) == Some('S')
            }),
            "after SIGCONT: child {:?}, wrapper {:?}",
            process_state(child),
            process_state(wrapper.id())
        );
    }
    signal(wrapper.id(), libc::SIGTERM);
    assert_eq!(wrapper.wait().expect("wait").signal(), Some(libc::SIGTERM));
}

/// A child that handles SIGTSTP gets SIGTSTP itself (its handler runs,
/// then it stops itself); a child that could not be stopped by it, in a
/// session of its own (an orphaned process group, where the kernel
/// discards SIGTSTP), gets SIGSTOP instead. Either way both end stopped.
#[test]
fn a_stop_reaches_the_child_as_the_signal_it_can_act_on() {
    let daemon = start_daemon("run-stop-handled");
    let dir = tempfile::tempdir().expect("tempdir");
    let got = dir.path().join("got");
    let script = format!(
        "trap 'sleep 0.05; echo TSTP > \"{}\"; kill -STOP $$' TSTP; \
         while :; do sleep 0.02; done",
        got.display()
    );
    let (mut handler, child) = wrapped_shell(&daemon, dir.path(), &[], &script);
    let _cleanup = KillOnDrop::new(&[handler.id(), child]);
    std::thread::sleep(Duration::from_millis(200));
    signal(handler.id(), libc::SIGTSTP);
    // The wrapper stops only once the child has: the child's handler
    // takes 50 to 70 ms to stop it, so a wrapper that did not wait would
    // be seen stopped first.
    let mut child_when_wrapper_stopped = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            if process_state(handler.id()) != Some('T') {
                return false;
            }
            child_when_wrapper_stopped = process_state(child);
            true
        }),
        "the wrapper did not stop: {:?}",
        process_state(handler.id())
    );
    assert_eq!(
        child_when_wrapper_stopped,
        Some('T'),
        "the wrapper stopped before its child did"
    );
    assert_eq!(
        std::fs::read_to_string(&got).unwrap_or_default(),
        "TSTP\n",
        "the child's SIGTSTP handler never ran: it was sent SIGSTOP"
    );
    // Killed while stopped: kill-on-close takes the child with it.
    signal(handler.id(), libc::SIGKILL);
    wait_within(&mut handler, Duration::from_secs(30), "zygote run");

    let (mut orphan, child) = wrapped_sleeper(&daemon, dir.path(), &["--setsid"]);
    let _cleanup_orphan = KillOnDrop::new(&[orphan.id(), child]);
    std::thread::sleep(Duration::from_millis(200));
    signal(orphan.id(), libc::SIGTSTP);
    assert!(
        eventually(Duration::from_secs(10), || process_state(child)
            == Some('T')),
        "a child in an orphaned group was not stopped (sent SIGTSTP?): {:?}",
        process_state(child)
    );
    // Killed while stopped: kill-on-close takes the child with it.
    signal(orphan.id(), libc::SIGKILL);
    wait_within(&mut orphan, Duration::from_secs(30), "zygote run");
}

#[test]
fn nice_affinity_and_oom_score_adj_are_the_callers() {
    let daemon = start_daemon("run-attributes");
    let out = assert_same(
        &daemon,
        r#"echo 300 > /proc/self/oom_score_adj; exec nice -n 7 taskset -c 0 $RUN sh -c 'nice; grep Cpus_allowed_list /proc/self/status; cat /proc/self/oom_score_adj'"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "7\nCpus_allowed_list:\t0\n300\n"
    );
}

#[test]
fn argument_lists_up_to_the_kernels_limit() {
    let daemon = start_daemon("run-argmax");
    // Over a frame: 100,000 arguments, ~590 KB.
    let out = assert_same(&daemon, r#"$RUN /bin/echo $(seq 100000) | md5sum"#);
    assert!(out.status.success());
    // xargs sizes its batches for exec, pointers and all (its batches
    // differ by the wrapper's own words, hence one number per line).
    let out = assert_same(
        &daemon,
        r#"seq 100000 | xargs $RUN /bin/echo | tr ' ' '\n' | md5sum; seq 100000 | xargs $RUN /bin/true"#,
    );
    assert!(out.status.success());
}

#[test]
fn a_per_peer_limit_caps_argument_lists() {
    let policy = "[limits]\nmax_argv_env_bytes = 100000\n\n\
                  [[peer]]\nuids = [0]\nmax_argv_env_bytes = 300000\n";
    let daemon = start_daemon_with("run-argmax-peer", Some(policy), &[]);
    let run = |count: u32| {
        shell(
            daemon.socket(),
            &through_zygote(),
            &format!("$RUN /bin/true $(seq {count})"),
        )
        .output()
        .expect("run sh")
    };
    // ~20,000 args take ~250 KB as the kernel counts: over the default,
    // under the rule's limit for uid 0.
    assert!(run(20_000).status.success());
    let out = run(40_000);
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Argument list too long"));
}

#[test]
fn usage_errors_exit_125() {
    let daemon = start_daemon("run-usage");
    for script in [
        r#""$ZYGOTE" run"#,
        r#""$ZYGOTE" run --no-such-flag -- true"#,
        r#""$ZYGOTE" run --timeout soon -- true"#,
        r#""$ZYGOTE" frobnicate"#,
    ] {
        let out = shell(daemon.socket(), "", script).output().expect("sh");
        assert_eq!(out.status.code(), Some(125), "{script}: {out:?}");
    }
    let out = shell(daemon.socket(), "", r#""$ZYGOTE" run --help"#)
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Exit status"), "{help}");
}

#[test]
fn messages_name_what_failed() {
    let daemon = start_daemon("run-messages");
    let out = shell(
        daemon.socket(),
        "",
        r#""$ZYGOTE" run -C /nonexistent-dir -- true"#,
    )
    .output()
    .expect("sh");
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "zygote: chdir /nonexistent-dir: No such file or directory"
    );

    // bash says "Is a directory" and exits 126.
    let out = shell(daemon.socket(), "", r#""$ZYGOTE" run -- /tmp"#)
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(126));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "zygote: /tmp: Is a directory"
    );

    // No daemon: one hint.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = shell(
        &dir.path().join("none.sock"),
        "",
        r#""$ZYGOTE" run -- true"#,
    )
    .output()
    .expect("sh");
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("start one with").count(), 1, "{stderr}");

    // A socket that refuses us says so.
    let out = shell(
        daemon.socket(),
        "",
        r#"setpriv --reuid 65534 --regid 65534 --clear-groups "$ZYGOTE" run -- true"#,
    )
    .output()
    .expect("sh");
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(!stderr.contains("no zygote"), "{stderr}");
}

#[test]
fn cli_flags_spell_like_env_and_systemd_run() {
    let daemon = start_daemon("run-flags");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = shell(
        daemon.socket(),
        "",
        &format!(
            r#"KEEP=1 DROP=2 COPY=3 "$ZYGOTE" run -E NEW=x=y -E COPY -u DROP -C '{}' --setsid -- sh -c 'echo "$KEEP.$DROP.$COPY.$NEW"; pwd; cut -d" " -f6 /proc/$$/stat; echo $$'"#,
            dir.path().display()
        ),
    )
    .output()
    .expect("sh");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "1..3.x=y");
    assert_eq!(
        lines[1],
        dir.path().canonicalize().unwrap().display().to_string()
    );
    // A session of its own: its id is the child's pid.
    assert_eq!(lines[2].trim(), lines[3].trim());

    // --timeout ends it and exits 124, as timeout(1) does.
    let out = shell(
        daemon.socket(),
        "",
        r#""$ZYGOTE" run --timeout 0.2s --kill-after 1s -- sleep 30"#,
    )
    .output()
    .expect("sh");
    assert_eq!(out.status.code(), Some(124), "{out:?}");
}

#[test]
fn status_json_is_one_object() {
    let daemon = start_daemon("run-status-json");
    let out = shell(daemon.socket(), "", r#""$ZYGOTE" status --json"#)
        .output()
        .expect("sh");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.trim().starts_with('{') && text.trim().ends_with('}'),
        "{text}"
    );
    assert!(
        text.contains(&format!("\"pid\":{}", daemon.pid())),
        "{text}"
    );
    assert!(text.contains("\"children_running\":0"), "{text}");
}

#[test]
fn serve_takes_zygote_socket_and_says_each_error_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("from-env.sock");
    let mut serve = Command::new(zygote_bin())
        .arg("serve")
        .env("ZYGOTE_SOCKET", &socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start zygote serve");
    let listening = eventually(Duration::from_secs(10), || {
        zygote_proto::socket::connect_to(&socket, false).is_ok()
    });
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(listening, "serve did not listen on $ZYGOTE_SOCKET");

    let out = Command::new(zygote_bin())
        .args(["serve", "--socket", "/dev/null/x.sock"])
        .output()
        .expect("run zygote serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("/dev/null/x.sock").count(), 1, "{stderr}");
}
