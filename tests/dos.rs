//! Denial of service against a shared root daemon: each attack
//! runs as an unprivileged peer (uid 65534) against a real root daemon
//! whose socket is mode 0666, while a well-behaved root client keeps
//! spawning. The test asserts that its spawns keep succeeding with bounded
//! latency, and that the daemon's RSS and fd count stay bounded during
//! the attack and come back after it.
//!
//! The attackers are this test binary re-executed ([`attacker`]) under
//! another uid; they print their findings as `ATTACK ` lines.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zygote_proto::{
    ClientMessage, EnvVar, Hello, PROTOCOL_VERSION, ProtocolErrorKind, RECV_BUFFER_BYTES,
    ServerMessage, SpawnRequest, decode, encode, recv_frame, send_frame, socket,
};

use crate::util::{Daemon, children_of, eventually, process_state, start_daemon_with};

/// The unprivileged attacker's uid (and gid): `nobody` on Debian.
const ATTACKER: u32 = 65534;
/// A second unprivileged uid, which must not be locked out by the first.
const NEIGHBOUR: u32 = 65533;

const MODE_ENV: &str = "ZYGOTE_DOS_ATTACK";
const SOCKET_ENV: &str = "ZYGOTE_DOS_SOCKET";
const DAEMON_ENV: &str = "ZYGOTE_DOS_DAEMON";

/// The well-behaved client's p99 spawn-and-wait latency must stay under
/// this during an attack. Generous for a loaded 2-core machine; a stalled
/// daemon makes every spawn time out (10 s).
const P99_BOUND: Duration = Duration::from_secs(2);

fn skip_unless_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return false;
    }
    eprintln!("SKIPPED: the attacks need a root daemon and another uid, so root");
    true
}

fn shared_daemon(name: &str, policy: Option<&str>) -> Daemon {
    start_daemon_with(name, policy, &["--socket-mode", "0666"])
}

/// An attacker process: this binary, re-executed as `uid` in `mode`.
fn attacker(mode: &str, daemon: &Daemon, uid: u32) -> Attacker {
    let mut process = Command::new(std::env::current_exe().expect("current_exe"))
        .args([
            "--exact",
            "dos::attacker_process",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(MODE_ENV, mode)
        .env(SOCKET_ENV, daemon.socket())
        .env(DAEMON_ENV, daemon.pid().to_string())
        .current_dir("/")
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start an attacker");
    let stdout = BufReader::new(process.stdout.take().expect("stdout"));
    Attacker { process, stdout }
}

struct Attacker {
    process: Child,
    stdout: BufReader<ChildStdout>,
}

impl Attacker {
    /// The next `ATTACK ` line; panics when the attacker ends first.
    fn finding(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.stdout.read_line(&mut line).expect("read attacker");
            assert!(read > 0, "the attacker ended without reporting");
            if let Some(finding) = line.trim_end().strip_prefix("ATTACK ") {
                return finding.to_owned();
            }
        }
    }

    /// Closes its stdin, which ends it (and so its connections).
    fn end(mut self) {
        drop(self.process.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.process.try_wait().expect("try_wait").is_none() {
            if Instant::now() > deadline {
                let _ = self.process.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A well-behaved root client spawning `/bin/true` in a loop, and a probe
/// of the daemon's RSS and fd count, until stopped.
struct Bystander {
    stop: Arc<AtomicBool>,
    spawner: JoinHandle<Vec<Result<Duration, String>>>,
    probe: JoinHandle<(u64, usize)>,
}

/// What a [`Bystander`] saw.
struct Seen {
    latencies: Vec<Duration>,
    failures: Vec<String>,
    max_rss_kib: u64,
    max_fds: usize,
}

impl Bystander {
    fn start(daemon: &Daemon) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let socket = daemon.socket().to_owned();
        let spawner = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                crate::util::runtime().block_on(async move {
                    let mut results = Vec::new();
                    let client = match tokio::time::timeout(
                        Duration::from_secs(10),
                        zygote_client::Client::connect(&socket),
                    )
                    .await
                    {
                        Ok(Ok(client)) => client,
                        Ok(Err(error)) => return vec![Err(format!("connect: {error}"))],
                        Err(_) => return vec![Err("connect: no answer in 10 s".into())],
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let mut command = client.command("/bin/true");
                        command.stdin(zygote_client::Stdio::null());
                        let result =
                            tokio::time::timeout(Duration::from_secs(10), command.status()).await;
                        results.push(match result {
                            Ok(Ok(status)) if status.success() => Ok(started.elapsed()),
                            Ok(Ok(status)) => Err(format!("exit {status:?}")),
                            Ok(Err(error)) => Err(error.to_string()),
                            Err(_) => Err("no exit within 10 s".into()),
                        });
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    results
                })
            })
        };
        let probe = {
            let stop = Arc::clone(&stop);
            let pid = daemon.pid();
            std::thread::spawn(move || {
                let (mut rss, mut fds) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    rss = rss.max(rss_kib(pid));
                    fds = fds.max(fd_count(pid));
                    std::thread::sleep(Duration::from_millis(20));
                }
                (rss, fds)
            })
        };
        Self {
            stop,
            spawner,
            probe,
        }
    }

    fn finish(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        let results = self.spawner.join().expect("bystander thread");
        let (max_rss_kib, max_fds) = self.probe.join().expect("probe thread");
        let (mut latencies, mut failures) = (Vec::new(), Vec::new());
        for result in results {
            match result {
                Ok(latency) => latencies.push(latency),
                Err(failure) => failures.push(failure),
            }
        }
        latencies.sort_unstable();
        Seen {
            latencies,
            failures,
            max_rss_kib,
            max_fds,
        }
    }
}

impl Seen {
    /// Every spawn succeeded, enough of them, with a bounded p99.
    fn assert_served(&self, what: &str) {
        assert!(
            self.failures.is_empty(),
            "{what}: the well-behaved client's spawns failed: {:?}",
            &self.failures[..self.failures.len().min(5)]
        );
        assert!(
            self.latencies.len() >= 10,
            "{what}: only {} spawns completed",
            self.latencies.len()
        );
        let p99 = self.latencies[self.latencies.len() * 99 / 100];
        eprintln!(
            "{what}: {} spawns, p50 {:?}, p99 {p99:?}, max {:?}; daemon peaks: {} KiB RSS, {} fds",
            self.latencies.len(),
            self.latencies[self.latencies.len() / 2],
            self.latencies.last().expect("latencies"),
            self.max_rss_kib,
            self.max_fds
        );
        assert!(
            p99 < P99_BOUND,
            "{what}: p99 latency {p99:?} is over {P99_BOUND:?}"
        );
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// `Name`, real uid and state of `pid`, from `/proc/PID/status`.
fn name_uid_state(pid: u32) -> Option<(String, u32, char)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .map(str::trim)
    };
    let name = field("Name:")?.to_owned();
    let uid = field("Uid:")?.split_whitespace().next()?.parse().ok()?;
    let state = field("State:")?.chars().next()?;
    Some((name, uid, state))
}

/// The daemon's children that are stopped before exec (not yet `true`).
fn stopped_children(daemon: &Daemon) -> Vec<u32> {
    children_of(daemon.pid())
        .into_iter()
        .filter(|pid| {
            name_uid_state(*pid).is_some_and(|(name, _, state)| state == 'T' && name != "true")
        })
        .collect()
}

/// Kills the daemon's children that are stopped after exec: a stop that
/// landed just after the exec leaves the peer a stopped `true`, which is
/// its own business, not the daemon's.
fn kill_stopped_leftovers(daemon: &Daemon) {
    for pid in children_of(daemon.pid()) {
        if process_state(pid) == Some('T') {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

fn stopped_count(finding: &str) -> usize {
    finding
        .strip_prefix("stopped ")
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

/// A peer SIGSTOPs its children between their switch to its uid
/// and their exec (a 6,000-entry PATH makes that window milliseconds
/// wide). Each stop used to hold a daemon runtime thread in vfork; two
/// hung every client, and SIGTERM. Now each stalls only its own spawn;
/// the peer leaving kills them, and so does the daemon's stop.
#[test]
fn a_peer_stopping_its_children_before_exec_stalls_only_itself() {
    if skip_unless_root() {
        return;
    }
    let mut daemon = shared_daemon("dos-stop", None);

    let mut attack = attacker("stop-before-exec", &daemon, ATTACKER);
    let finding = attack.finding();
    assert!(
        stopped_count(&finding) >= 4,
        "the attacker could not stop 4 children before exec: {finding}"
    );
    assert!(
        stopped_children(&daemon).len() >= 4,
        "the stopped children are gone early"
    );
    let bystander = Bystander::start(&daemon);
    std::thread::sleep(Duration::from_secs(3));
    bystander
        .finish()
        .assert_served("with 4 children stopped before exec");

    // The peer leaves: its children that never exec'd are killed and
    // reaped.
    attack.end();
    assert!(
        eventually(Duration::from_secs(10), || stopped_children(&daemon)
            .is_empty()
            && daemon.zombies().is_empty()),
        "children stopped before exec outlived their client: {:?}",
        stopped_children(&daemon)
    );

    kill_stopped_leftovers(&daemon);

    // Again, and now the daemon stops while they are stopped.
    let mut attack = attacker("stop-before-exec", &daemon, ATTACKER);
    let finding = attack.finding();
    assert!(stopped_count(&finding) >= 4, "{finding}");
    let started = Instant::now();
    daemon.start_stop();
    assert!(
        eventually(Duration::from_secs(15), || !daemon.is_alive()),
        "the daemon did not stop within 15 s with children stopped before exec"
    );
    eprintln!("stopped in {:?}", started.elapsed());
    assert!(
        stopped_children(&daemon).is_empty(),
        "the stopping daemon left children stopped before exec"
    );
    kill_stopped_leftovers(&daemon);
    attack.end();
}

/// 1,030 connections that never say hello used to lock every
/// other client out with `Busy`. Now one uid gets at most
/// `max_connections_per_peer`, root keeps a reserve, and a silent
/// connection is closed after 5 s.
#[test]
fn idle_connections_of_one_uid_lock_nobody_out() {
    if skip_unless_root() {
        return;
    }
    // Small numbers, same shape as the defaults.
    let policy =
        "[limits]\nmax_connections = 64\nmax_connections_per_peer = 16\nmax_children = 64\n";
    let daemon = shared_daemon("dos-idle", Some(policy));
    let fds_before = daemon.settled_fd_count();

    let mut attack = attacker("idle-connections:40", &daemon, ATTACKER);
    assert_eq!(attack.finding(), "open 40");
    let bystander = Bystander::start(&daemon);
    // Another unprivileged uid still gets in.
    let neighbour = attacker("spawn-once", &daemon, NEIGHBOUR).finding();
    assert_eq!(neighbour, "spawned", "uid {NEIGHBOUR} was locked out");
    std::thread::sleep(Duration::from_secs(2));
    let seen = bystander.finish();
    seen.assert_served("with 40 idle connections from one uid");
    assert!(
        seen.max_fds < fds_before + 64,
        "{} fds for 40 connections",
        seen.max_fds
    );

    // The 24 over the per-uid cap were refused as busy at once; the 16
    // others closed at the handshake deadline.
    let outcome = attack.finding();
    assert_eq!(outcome, "busy 24 deadline 16 other 0", "{outcome}");
    attack.end();
    assert!(
        daemon.settled_fd_count() <= fds_before + 1,
        "the daemon kept fds of closed connections"
    );
}

/// Hole 3: two connections that sent refused spawns quoting a 120 KiB env
/// name, and never read, took the daemon from 22 MB to 954 MB and from 11
/// to 2,573 fds. Now a connection stops being read at 64 unanswered
/// spawns, refusal texts are clipped, and no fd is duplicated per reply.
#[test]
fn a_client_that_never_reads_cannot_grow_the_daemon() {
    if skip_unless_root() {
        return;
    }
    let daemon = shared_daemon("dos-unread", None);
    let fds_before = daemon.settled_fd_count();
    let rss_before = daemon.rss_kib();

    let bystander = Bystander::start(&daemon);
    let mut attack = attacker("never-read:2:1300", &daemon, ATTACKER);
    let sent = attack.finding();
    eprintln!("attacker: {sent}");
    let rss_during = daemon.rss_kib();
    let fds_during = daemon.fd_count();
    let seen = bystander.finish();
    seen.assert_served("with 2 connections that never read");
    eprintln!(
        "daemon: {rss_before} KiB, {fds_before} fds before; {rss_during} KiB, {fds_during} fds during"
    );
    let peak_rss = seen.max_rss_kib.max(rss_during);
    assert!(
        peak_rss < rss_before + 64 * 1024,
        "RSS grew from {rss_before} to {peak_rss} KiB"
    );
    assert!(
        seen.max_fds.max(fds_during) < fds_before + 32,
        "fds grew from {fds_before} to {}",
        seen.max_fds.max(fds_during)
    );

    attack.end();
    assert!(
        daemon.settled_fd_count() <= fds_before + 1,
        "fds stayed after the attack"
    );
    let settled = eventually(Duration::from_secs(10), || {
        daemon.rss_kib() < rss_before + 16 * 1024
    });
    assert!(
        settled,
        "RSS stayed at {} KiB after the attack (before: {rss_before})",
        daemon.rss_kib()
    );
}

/// Hole 4: kill-on-close of a child that joined an existing group killed
/// nobody, and a child with a timeout that moved to another group was
/// never killed. Now the child itself always gets the signal, and only
/// the group it leads is signalled as a group.
#[test]
fn timeouts_and_kill_on_close_always_end_the_child() {
    if skip_unless_root() {
        return;
    }
    let daemon = shared_daemon("dos-groups", None);
    let bystander = Bystander::start(&daemon);
    let mut attack = attacker("groups", &daemon, ATTACKER);
    let timed = attack.finding();
    assert_eq!(
        timed, "timed out: true signal 15",
        "a child that left its group outlived its timeout"
    );
    let pids = attack.finding();
    let pids: Vec<u32> = pids
        .strip_prefix("pids ")
        .expect("pids line")
        .split(' ')
        .map(|pid| pid.parse().expect("pid"))
        .collect();
    let (leader, joined) = (pids[0], pids[1]);
    attack.end();
    // The child that joined the leader's group dies with its client; the
    // group it joined is not signalled as a group.
    assert!(
        eventually(Duration::from_secs(5), || {
            !children_of(daemon.pid()).contains(&joined)
        }),
        "kill-on-close missed child {joined}, which had joined group {leader}"
    );
    assert!(
        children_of(daemon.pid()).contains(&leader),
        "the group {leader} the child joined was signalled as a group"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(leader as i32).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the leader");
    bystander
        .finish()
        .assert_served("while group signals went out");
}

/// Not a test of its own: the attackers' entry point; returns at once in
/// a normal run.
#[test]
fn attacker_process() {
    let Ok(mode) = std::env::var(MODE_ENV) else {
        return;
    };
    let socket = std::env::var(SOCKET_ENV).expect("socket path");
    let socket = Path::new(&socket);
    let daemon: u32 = std::env::var(DAEMON_ENV)
        .expect("daemon pid")
        .parse()
        .expect("daemon pid");
    match mode.split(':').collect::<Vec<_>>().as_slice() {
        ["stop-before-exec"] => stop_before_exec(socket, daemon),
        ["idle-connections", count] => idle_connections(socket, count.parse().expect("count")),
        ["spawn-once"] => spawn_once(socket),
        ["never-read", connections, requests] => never_read(
            socket,
            connections.parse().expect("connections"),
            requests.parse().expect("requests"),
        ),
        ["groups"] => groups(socket),
        _ => panic!("unknown attack {mode}"),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ATTACK {line}").expect("stdout");
    out.flush().expect("flush");
}

/// Waits until the test closes our stdin.
fn hold() {
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
}

/// Spawns `true` through a 6,000-entry PATH, six at a time, and SIGSTOPs
/// each child of ours that has not exec'd yet, until four are stopped.
fn stop_before_exec(socket: &Path, daemon: u32) {
    let runtime = crate::util::runtime();
    let client = runtime
        .block_on(zygote_client::Client::connect(socket))
        .expect("connect");
    let client = Arc::new(client);
    let path = (0..6000)
        .map(|i| format!("/nonexistent/{i}"))
        .chain(["/usr/bin".into(), "/bin".into()])
        .collect::<Vec<_>>()
        .join(":");
    for _ in 0..6 {
        let client = Arc::clone(&client);
        let path = path.clone();
        runtime.spawn(async move {
            loop {
                let mut command = client.command("true");
                command
                    .env_clear()
                    .env("PATH", &path)
                    .stdin(zygote_client::Stdio::null());
                let _ = command.status().await;
            }
        });
    }
    let me = rustix::process::getuid().as_raw();
    let mut stopped = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while stopped.len() < 4 && Instant::now() < deadline {
        for pid in children_of(daemon) {
            if stopped.contains(&pid) {
                continue;
            }
            // Ours, and not `true` yet: between the switch and exec.
            let Some((name, uid, _)) = name_uid_state(pid) else {
                continue;
            };
            if uid != me || name == "true" {
                continue;
            }
            let Some(target) = rustix::process::Pid::from_raw(pid as i32) else {
                continue;
            };
            if rustix::process::kill_process(target, rustix::process::Signal::STOP).is_err() {
                continue;
            }
            // Once it is stopped its name is settled: the pre-exec one,
            // or `true` when the stop landed after the exec.
            let mut settled = None;
            for _ in 0..50 {
                match name_uid_state(pid) {
                    Some((name, _, 'T')) => {
                        settled = Some(name);
                        break;
                    }
                    Some(_) => std::thread::sleep(Duration::from_millis(1)),
                    None => break,
                }
            }
            match settled {
                Some(name) if name != "true" => {
                    stopped.insert(pid);
                }
                // Exec'd meanwhile: let it go on.
                _ => {
                    let _ = rustix::process::kill_process(target, rustix::process::Signal::CONT);
                }
            }
        }
    }
    say(&format!("stopped {}", stopped.len()));
    hold();
    // Leaving closes the connection; the runtime's tasks die with us.
    std::process::exit(0);
}

/// Opens `count` connections that never say hello; reports how each ended.
fn idle_connections(socket: &Path, count: usize) {
    let connections: Vec<OwnedFd> = (0..count)
        .map(|_| socket::connect_to(socket, false).expect("connect"))
        .collect();
    say(&format!("open {}", connections.len()));
    let waiters: Vec<_> = connections
        .into_iter()
        .map(|connection| {
            std::thread::spawn(move || {
                rustix::net::sockopt::set_socket_timeout(
                    &connection,
                    rustix::net::sockopt::Timeout::Recv,
                    Some(Duration::from_secs(20)),
                )
                .expect("SO_RCVTIMEO");
                let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
                match recv_frame(connection.as_fd(), &mut scratch) {
                    Ok(Some(frame)) => match decode::<ServerMessage>(&frame.bytes) {
                        Ok(ServerMessage::ProtocolError(error)) => match error.kind {
                            ProtocolErrorKind::Busy if error.message.contains("try again") => {
                                "busy"
                            }
                            ProtocolErrorKind::UnexpectedMessage
                                if error.message.contains("no Hello") =>
                            {
                                "deadline"
                            }
                            _ => "other",
                        },
                        _ => "other",
                    },
                    _ => "other",
                }
            })
        })
        .collect();
    let outcomes: Vec<&str> = waiters
        .into_iter()
        .map(|waiter| waiter.join().expect("waiter"))
        .collect();
    let count = |what: &str| outcomes.iter().filter(|outcome| **outcome == what).count();
    say(&format!(
        "busy {} deadline {} other {}",
        count("busy"),
        count("deadline"),
        count("other")
    ));
    hold();
}

fn spawn_once(socket: &Path) {
    let client = zygote_client::blocking::Client::connect(socket).expect("connect");
    let status = zygote_client::blocking::Command::new(&client, "/bin/true")
        .stdin(zygote_client::Stdio::null())
        .status()
        .expect("spawn");
    assert!(status.success());
    say("spawned");
}

/// On each of `connections` connections, sends up to `requests` spawn
/// requests that are refused with a message quoting a 120 KiB env name,
/// and never reads a reply.
fn never_read(socket: &Path, connections: usize, requests: usize) {
    let connections: Vec<OwnedFd> = (0..connections)
        .map(|_| {
            let connection = socket::connect_to(socket, false).expect("connect");
            let hello = ClientMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                client: "never-read".into(),
            });
            send_frame(connection.as_fd(), &encode(&hello).expect("encode"), &[]).expect("hello");
            let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
            recv_frame(connection.as_fd(), &mut scratch)
                .expect("hello ack")
                .expect("hello ack");
            rustix::io::ioctl_fionbio(&connection, true).expect("non-blocking");
            connection
        })
        .collect();
    // Refused for its NUL, after the daemon has read all 120 KiB. (An env
    // name with `=`, which this used before, is now a valid spawn.)
    let mut key = vec![b'A'; 120 * 1024];
    key.push(0);
    let mut sent = vec![0usize; connections.len()];
    let mut stuck_since = None;
    while sent.iter().any(|count| *count < requests) {
        let mut progress = false;
        for (connection, count) in connections.iter().zip(&mut sent) {
            if *count >= requests {
                continue;
            }
            let request = ClientMessage::Spawn(SpawnRequest {
                env: vec![EnvVar {
                    key: key.clone(),
                    value: b"x".to_vec(),
                }]
                .into(),
                ..SpawnRequest::new(*count as u64, "/bin/true")
            });
            if send_frame(connection.as_fd(), &encode(&request).expect("encode"), &[]).is_ok() {
                *count += 1;
                progress = true;
            }
        }
        if progress {
            stuck_since = None;
        } else {
            // The daemon stopped reading and our buffer is full: that is
            // the push-back we want. Stop after 2 s of it.
            let since = *stuck_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(2) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    say(&format!(
        "sent {}",
        sent.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    ));
    hold();
}

/// A child with a 1 s timeout that moves itself out of its own group into
/// the daemon's; then a leader, and a kill-on-close child that joins the
/// leader's group. Reports how the first ended, then both pids, and
/// leaves.
fn groups(socket: &Path) {
    use zygote_client::blocking::Command as Blocking;
    let client = zygote_client::blocking::Client::connect(socket).expect("connect");
    let mut mover = Blocking::new(&client, "perl")
        .args([
            "-e",
            "setpgrp(0, getpgrp(getppid())) or die \"setpgrp: $!\"; sleep 1000",
        ])
        .process_group(0)
        .timeout(Duration::from_secs(1))
        .timeout_grace(Duration::from_secs(1))
        .stdin(zygote_client::Stdio::null())
        .spawn()
        .expect("spawn the mover");
    // The client waits for the exit notice; a missed timeout never sends
    // one, so wait in a thread and give up after 15 s.
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(mover.wait());
    });
    let line = match receiver.recv_timeout(Duration::from_secs(15)) {
        Ok(Ok(status)) => {
            let signal = status
                .signal()
                .map_or_else(|| "none".to_owned(), |s| s.to_string());
            format!("timed out: {} signal {signal}", status.timed_out())
        }
        Ok(Err(error)) => format!("error {error}"),
        Err(_) => "still running after 15 s".to_owned(),
    };
    say(&line);

    let leader = Blocking::new(&client, "sleep")
        .arg("1000")
        .process_group(0)
        .stdin(zygote_client::Stdio::null())
        .spawn()
        .expect("spawn the leader");
    let joined = Blocking::new(&client, "sleep")
        .arg("1000")
        .process_group(leader.id() as i32)
        .kill_process_group_on_close(libc::SIGKILL)
        .stdin(zygote_client::Stdio::null())
        .spawn()
        .expect("spawn the joiner");
    say(&format!("pids {} {}", leader.id(), joined.id()));
    std::mem::forget(leader);
    std::mem::forget(joined);
    hold();
}
