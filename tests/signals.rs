//! Signals with no meaning to a zygote (USR1, USR2, ALRM, VTALRM, PROF,
//! IO, PWR, WINCH, URG, STKFLT, XCPU, XFSZ, the real-time ones): the shared
//! daemon, a private zygote and a template keep serving through them, lose
//! no child's status, and log each with its sender, a bounded number of
//! times. SIGTERM still stops them; children see the signals at their
//! default action.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child as StdChild, ChildStdin, ChildStdout, Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
use zygote_client::blocking::{Client, Command};

use crate::util::{
    eventually, mask_in, process_state, signal_bit, start_daemon, thread_masks, zygote_bin,
};

/// As many lines as the daemon logs one by one per window.
const LOG_LIMIT: usize = 10;

/// What the daemon logs for each stray signal it logs one by one.
const IGNORED: &str = "ignored a signal that has no meaning here";

/// Every signal with no meaning to a zygote whose default action would
/// end it (or that it could be asked to act on), and two real-time ones.
fn stray_signals() -> Vec<i32> {
    vec![
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGIO,
        libc::SIGPWR,
        libc::SIGWINCH,
        libc::SIGURG,
        libc::SIGSTKFLT,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGRTMIN(),
        libc::SIGRTMAX(),
    ]
}

fn send(pid: u32, signal: i32) {
    let pid = libc::pid_t::try_from(pid).expect("pid");
    // SAFETY: kill has no memory effects; the pid is a zygote of this test.
    let ret = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        ret,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

/// Sends every stray signal to `pid`.
fn send_every_stray_signal(pid: u32) {
    for signal in stray_signals() {
        send(pid, signal);
    }
}

/// The signal bits of a process that must stay at their default in a
/// child: none of them blocked, ignored or caught.
fn stray_bits() -> u64 {
    stray_signals()
        .into_iter()
        .map(signal_bit)
        .fold(0, |a, b| a | b)
}

/// Waits until `text()` contains `needle`, within `timeout`.
fn wait_for_text(timeout: Duration, needle: &str, mut text: impl FnMut() -> String) -> bool {
    eventually(timeout, || text().contains(needle))
}

#[test]
fn daemon_survives_signals_with_no_meaning_and_logs_their_sender() {
    let mut daemon = start_daemon("stray-signals");
    let client = Client::connect(daemon.socket()).expect("connect");
    // A child that announces itself to its parent, as Xvfb does.
    let mut announcer = Command::new(&client, "sh")
        .args(["-c", "kill -USR1 $PPID; exit 3"])
        .spawn()
        .expect("spawn the announcer");
    let announcer_pid = announcer.id();
    assert_eq!(
        announcer.wait().expect("announcer's status").code(),
        Some(3)
    );
    let from_child = format!("signal=SIGUSR1 number=10 sender_pid={announcer_pid} ");
    assert!(
        wait_for_text(Duration::from_secs(10), &from_child, || daemon.log()),
        "no log line for the child's SIGUSR1 ({from_child}); log:\n{}",
        daemon.log()
    );

    // A child running while every stray signal, and 20 more queued
    // real-time ones, reach the daemon.
    let started = Instant::now();
    let mut runner = Command::new(&client, "sh")
        .args(["-c", "sleep 1; exit 7"])
        .spawn()
        .expect("spawn the runner");
    send_every_stray_signal(daemon.pid());
    for _ in 0..20 {
        send(daemon.pid(), libc::SIGRTMIN() + 3);
    }
    assert_eq!(runner.wait().expect("runner's status").code(), Some(7));
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(daemon.is_alive(), "the daemon died; log:\n{}", daemon.log());
    assert!(
        Command::new(&client, "true")
            .status()
            .expect("spawn after")
            .success()
    );
    let other = Client::connect(daemon.socket()).expect("a new client after the signals");
    assert!(
        Command::new(&other, "true")
            .status()
            .expect("new client spawns")
            .success()
    );

    // Each logged with its sender, up to the limit; the rest counted, and
    // the count logged when the window ends (10 s).
    let ours = format!(
        "sender_pid={} sender_uid={} ",
        std::process::id(),
        rustix::process::getuid().as_raw()
    );
    assert!(
        wait_for_text(
            Duration::from_secs(10),
            "counted, not logged one by one",
            || daemon.log()
        ),
        "no notice that the limit was reached; log:\n{}",
        daemon.log()
    );
    let log = daemon.log();
    assert!(
        log.contains(&ours),
        "no line names this test as the sender ({ours}):\n{log}"
    );
    assert!(log.contains("signal=SIGUSR2 "), "{log}");
    assert_eq!(log.matches(IGNORED).count(), LOG_LIMIT, "{log}");
    assert!(
        !log.contains("cannot block the signals with no meaning"),
        "{log}"
    );
    assert!(
        wait_for_text(
            Duration::from_secs(30),
            "ignored more signals with no meaning here count=",
            || daemon.log()
        ),
        "the count of signals past the limit was never logged; log:\n{}",
        daemon.log()
    );

    // SIGTERM still stops it, gracefully.
    let status = daemon.terminate();
    assert!(status.success(), "{status}; log:\n{}", daemon.log());
    assert!(
        daemon
            .log()
            .contains("stopping gracefully signal=\"SIGTERM\""),
        "{}",
        daemon.log()
    );
}

/// The daemon blocks the stray signals in every thread (they are read from
/// a signalfd); its children start with each at its default action,
/// unblocked: SIGUSR1 kills a child that sends it to itself.
#[test]
fn children_see_signals_with_no_meaning_to_the_daemon_at_their_default() {
    let daemon = start_daemon("stray-child-default");
    let client = Client::connect(daemon.socket()).expect("connect");
    let killed = Command::new(&client, "sh")
        .args(["-c", "kill -USR1 $$; exit 0"])
        .status()
        .expect("spawn sh");
    assert_eq!(killed.signal(), Some(libc::SIGUSR1), "{killed:?}");
    let output = Command::new(&client, "cat")
        .arg("/proc/self/status")
        .output()
        .expect("spawn cat");
    let status = String::from_utf8_lossy(&output.stdout);
    for field in ["SigBlk", "SigIgn", "SigCgt", "SigPnd"] {
        let mask = mask_in(&status, field).unwrap_or_else(|| panic!("no {field}: {status}"));
        assert_eq!(mask & stray_bits(), 0, "a child's {field}: {mask:x}");
    }
    let blocked = thread_masks(daemon.pid(), "SigBlk");
    assert!(
        !blocked.is_empty()
            && blocked
                .iter()
                .all(|(_, mask)| mask & stray_bits() == stray_bits()),
        "daemon threads not blocking every stray signal: {blocked:x?}"
    );
}

/// `zygote serve --private-fd 0` on a new socketpair, logging at INFO into
/// `log`: our end, and the zygote.
fn start_private_zygote(log: &std::path::Path) -> (Client, StdChild) {
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .expect("socketpair");
    let zygote = StdCommand::new(zygote_bin())
        .args(["serve", "--private-fd", "0"])
        .env("ZYGOTE_LOG", "info")
        .stdin(Stdio::from(theirs))
        .stderr(std::fs::File::create(log).expect("create the log"))
        .spawn()
        .expect("start a private zygote");
    // The handshake: its signal handling is in place once it answers.
    (Client::from_fd(ours).expect("handshake"), zygote)
}

#[test]
fn private_zygote_survives_signals_with_no_meaning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("zygote.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let (client, mut zygote) = start_private_zygote(&log_path);
    let mut runner = Command::new(&client, "sh")
        .args(["-c", "kill -USR2 $PPID; sleep 1; exit 7"])
        .spawn()
        .expect("spawn the runner");
    send_every_stray_signal(zygote.id());
    assert_eq!(runner.wait().expect("runner's status").code(), Some(7));
    assert!(
        zygote.try_wait().expect("try_wait").is_none(),
        "the private zygote died; log:\n{}",
        log()
    );
    assert!(
        Command::new(&client, "true")
            .status()
            .expect("spawn after")
            .success()
    );
    assert!(
        wait_for_text(Duration::from_secs(10), "signal=SIGUSR1 ", log),
        "no log line for SIGUSR1; log:\n{}",
        log()
    );
    assert!(
        log().contains(&format!("sender_pid={} ", std::process::id())),
        "{}",
        log()
    );
    // SIGTERM ends a private zygote at once (its owner stops it by
    // closing the socket).
    send(zygote.id(), libc::SIGTERM);
    let ended = eventually(Duration::from_secs(10), || {
        zygote.try_wait().expect("try_wait").is_some()
    });
    assert!(ended, "SIGTERM did not end the private zygote");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(zygote.wait().expect("wait").signal(), Some(libc::SIGTERM));
}

/// The private-zygote helper in its `lines` mode, with a template.
struct TemplateOwner {
    helper: StdChild,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    zygote: u32,
}

impl TemplateOwner {
    fn start() -> Self {
        let mut helper = StdCommand::new(env!("CARGO_BIN_EXE_zygote-private-helper"))
            .args(["template", "lines"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the helper");
        let stdin = helper.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(helper.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the zygote's pid");
        let zygote = line
            .strip_prefix("zygote ")
            .and_then(|pid| pid.trim().parse().ok())
            .unwrap_or_else(|| panic!("the helper said {line:?}"));
        Self {
            helper,
            stdin,
            stdout,
            zygote,
        }
    }

    /// Starts `sh -c script` through the template.
    fn start_script(&mut self, script: &str) {
        writeln!(self.stdin, "{script}").expect("write to the helper");
    }

    /// The last started script's `exit N` or `signal N` line.
    fn result(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read a result");
        line.trim().to_owned()
    }
}

impl Drop for TemplateOwner {
    fn drop(&mut self) {
        let _ = self.helper.kill();
        let _ = self.helper.wait();
    }
}

#[test]
fn template_survives_signals_with_no_meaning() {
    let mut owner = TemplateOwner::start();
    let zygote = owner.zygote;
    owner.start_script("kill -USR1 $PPID; sleep 1; exit 7");
    send_every_stray_signal(zygote);
    assert_eq!(owner.result(), "exit 7");
    assert!(
        !matches!(process_state(zygote), None | Some('Z')),
        "the template died"
    );
    owner.start_script("exit 5");
    assert_eq!(owner.result(), "exit 5");
    let blocked = thread_masks(zygote, "SigBlk");
    assert!(
        blocked
            .iter()
            .all(|(_, mask)| mask & stray_bits() == stray_bits()),
        "template threads not blocking every stray signal: {blocked:x?}"
    );
    // The program that forked it keeps its own mask.
    let program = thread_masks(owner.helper.id(), "SigBlk");
    assert!(
        program
            .iter()
            .all(|(_, mask)| mask & signal_bit(libc::SIGUSR1) == 0),
        "the owner's SigBlk: {program:x?}"
    );
    // SIGTERM ends the template.
    send(zygote, libc::SIGTERM);
    assert!(
        eventually(Duration::from_secs(10), || matches!(
            process_state(zygote),
            None | Some('Z')
        )),
        "SIGTERM did not end the template"
    );
}
