//! Denial of service against a shared root daemon: each attack runs as an
//! unprivileged peer (uid 65534) against a real root daemon whose socket
//! is mode 0666, while a well-behaved root client keeps spawning. The
//! test asserts that its spawns keep succeeding with a p99 latency under
//! [`P99_BOUND`], and that the daemon's zombies, RSS and fd count stay
//! bounded during the attack and come back after it.
//!
//! The attackers are this test binary re-executed ([`attacker`]) under
//! another uid; they print their findings as `ATTACK ` lines.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdout, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zygote_proto::{
    ClientMessage, Hello, PROTOCOL_VERSION, ProtocolErrorKind, RECV_BUFFER_BYTES, ServerMessage,
    SpawnRequest, decode, encode, recv_frame, send_frame, socket,
};

use crate::util::{
    Daemon, children_of, eventually, process_state, start_daemon, start_daemon_with,
};

/// The unprivileged attacker's uid (and gid): `nobody` on Debian.
pub(crate) const ATTACKER: u32 = 65534;
/// A second unprivileged uid, which must not be locked out by the first.
const NEIGHBOUR: u32 = 65533;

pub const MODE_ENV: &str = "ZYGOTE_DOS_ATTACK";
const SOCKET_ENV: &str = "ZYGOTE_DOS_SOCKET";
const DAEMON_ENV: &str = "ZYGOTE_DOS_DAEMON";

/// The well-behaved client's p99 spawn-and-wait latency must stay under
/// this during an attack, or under [`QUIET_FACTOR`] times its p99 against
/// a daemon nobody attacks, measured at the same time, when the machine
/// is so busy that the latter is higher. A spawn
/// and wait of `/bin/true` takes 1-5 ms on an idle machine; a stalled
/// daemon makes every spawn time out (10 s).
const P99_BOUND: Duration = Duration::from_millis(50);

/// How much slower than against a daemon nobody attacks the well-behaved
/// client may get.
const QUIET_FACTOR: u32 = 8;

/// The daemon's bound on what one connection may leave unanswered or
/// unread (`MAX_UNANSWERED` in `connection.rs`).
const MAX_UNANSWERED: usize = 64;

/// The daemon's bound on the fds of the replies one connection has not
/// read (`policy::MAX_UNREAD_FDS`).
const MAX_UNREAD_FDS: usize = 64;

fn skip_unless_root() -> bool {
    !crate::util::root_or_skip("the attacks (a root daemon and another uid)")
}

pub(crate) fn shared_daemon(name: &str, policy: Option<&str>) -> Daemon {
    start_daemon_with(name, policy, &["--socket-mode", "0666"])
}

/// An attacker process: this binary, re-executed as `uid` in `mode`.
pub(crate) fn attacker(mode: &str, daemon: &Daemon, uid: u32) -> Attacker {
    let mut process = crate::util::reexec(MODE_ENV, mode)
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

pub(crate) struct Attacker {
    process: Child,
    stdout: BufReader<ChildStdout>,
}

impl Attacker {
    /// The next `ATTACK ` line; panics when the attacker ends first.
    pub(crate) fn finding(&mut self) -> String {
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
    pub(crate) fn end(mut self) {
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
    probe: JoinHandle<(u64, usize, usize)>,
    /// A daemon nobody attacks, and the same client's loop against it.
    control: (Daemon, JoinHandle<Vec<Result<Duration, String>>>),
}

/// What a [`Bystander`] saw.
struct Seen {
    latencies: Vec<Duration>,
    failures: Vec<String>,
    max_rss_kib: u64,
    max_fds: usize,
    max_zombies: usize,
    /// The same client's p99 against a daemon nobody attacks, meanwhile.
    control_p99: Duration,
}

/// Spawns `/bin/true` and waits for it in a loop until `stop`; each
/// spawn's latency, or why it failed.
fn spawn_loop(
    socket: std::path::PathBuf,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<Result<Duration, String>>> {
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
                let result = tokio::time::timeout(Duration::from_secs(10), command.status()).await;
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
}

/// The p99 of the successful `results`; `None` with fewer than 10.
fn p99_of(results: &[Result<Duration, String>]) -> Option<Duration> {
    let mut latencies: Vec<Duration> = results.iter().filter_map(|r| r.clone().ok()).collect();
    latencies.sort_unstable();
    (latencies.len() >= 10).then(|| latencies[latencies.len() * 99 / 100])
}

impl Bystander {
    fn start(daemon: &Daemon) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let spawner = spawn_loop(daemon.socket().to_owned(), Arc::clone(&stop));
        // The same client against a daemon nobody attacks, at the same
        // time: what the machine's own load does to the latency.
        let control = start_daemon("dos-control");
        let control_spawner = spawn_loop(control.socket().to_owned(), Arc::clone(&stop));
        let probe = {
            let stop = Arc::clone(&stop);
            let pid = daemon.pid();
            std::thread::spawn(move || {
                let (mut rss, mut fds, mut zombies) = (0, 0, 0);
                while !stop.load(Ordering::Relaxed) {
                    rss = rss.max(rss_kib(pid));
                    fds = fds.max(fd_count(pid));
                    zombies = zombies.max(zombie_count(pid));
                    std::thread::sleep(Duration::from_millis(20));
                }
                (rss, fds, zombies)
            })
        };
        Self {
            stop,
            spawner,
            probe,
            control: (control, control_spawner),
        }
    }

    fn finish(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        let results = self.spawner.join().expect("bystander thread");
        let (max_rss_kib, max_fds, max_zombies) = self.probe.join().expect("probe thread");
        let (control, control_spawner) = self.control;
        let control_results = control_spawner.join().expect("control thread");
        drop(control);
        // Unknown (too few spawns): the bound alone applies.
        let control_p99 = p99_of(&control_results).unwrap_or_default();
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
            max_zombies,
            control_p99,
        }
    }
}

impl Seen {
    /// Every spawn succeeded, enough of them, with a p99 under
    /// [`P99_BOUND`], or [`QUIET_FACTOR`] times the control's if that is
    /// more.
    fn assert_served(&self, what: &str) {
        let quiet = self.control_p99;
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
            "{what}: {} spawns, p50 {:?}, p99 {p99:?}, max {:?} (unattacked daemon meanwhile: \
             p99 {:?}); daemon peaks: {} KiB RSS, {} fds, {} zombies",
            self.latencies.len(),
            self.latencies[self.latencies.len() / 2],
            self.latencies.last().expect("latencies"),
            self.control_p99,
            self.max_rss_kib,
            self.max_fds,
            self.max_zombies
        );
        let bound = P99_BOUND.max(quiet * QUIET_FACTOR);
        assert!(
            p99 < bound,
            "{what}: p99 latency {p99:?} is over {bound:?} (a daemon nobody attacks, meanwhile: {quiet:?})"
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

fn zombie_count(pid: u32) -> usize {
    children_of(pid)
        .into_iter()
        .filter(|child| process_state(*child) == Some('Z'))
        .count()
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// `Name`, real uid and state of `pid`, from `/proc/PID/status`.
pub(crate) fn name_uid_state(pid: u32) -> Option<(String, u32, char)> {
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
pub(crate) fn stopped_children(daemon: &Daemon) -> Vec<u32> {
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
pub(crate) fn kill_stopped_leftovers(daemon: &Daemon) {
    for pid in children_of(daemon.pid()) {
        if process_state(pid) == Some('T') {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

pub(crate) fn stopped_count(finding: &str) -> usize {
    finding
        .strip_prefix("stopped ")
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

/// The daemon's spawns of one uid between admission and exec at once.
fn launches_per_uid() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get) * 2 + 2
}

/// How many children the stop-before-exec attack stops: more than the
/// daemon has runtime threads (one per CPU it may use), so that a stop
/// that held a thread again would hold them all.
fn children_to_stop() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get) + 2
}

/// A peer SIGSTOPs its children between their switch to its uid and their
/// exec (a 6,000-entry PATH makes that window milliseconds wide). Such a
/// child is started by the peer's own spawner process, which waits for
/// its exec: the stop stalls that spawner, and so the peer's own spawns,
/// never a daemon thread. Root and another uid (through its own spawner)
/// are served meanwhile; the peer leaving kills the stopped children, and
/// so does the daemon's stop.
#[test]
fn a_peer_stopping_its_children_before_exec_stalls_only_itself() {
    if skip_unless_root() {
        return;
    }
    let mut daemon = shared_daemon("dos-stop", None);
    let count = children_to_stop();
    let mode = format!("stop-before-exec:{count}");

    let mut attack = attacker(&mode, &daemon, ATTACKER);
    let stopped = stopped_count(&attack.finding());
    assert!(stopped >= 1, "the attacker could stop no child before exec");
    let stalled = || {
        stopped_children(&daemon).into_iter().any(|pid| {
            name_uid_state(pid)
                .is_some_and(|(name, uid, _)| name == crate::util::SPAWNER_NAME && uid == ATTACKER)
        })
    };
    assert!(
        stalled(),
        "no child of the attacker's spawner is stopped before exec: {:?}",
        stopped_children(&daemon)
    );
    // Served meanwhile: root, and another uid through its own spawner.
    let bystander = Bystander::start(&daemon);
    let neighbour = attacker("spawn-loop:40", &daemon, NEIGHBOUR).finding();
    std::thread::sleep(Duration::from_secs(2));
    bystander
        .finish()
        .assert_served(&format!("with {stopped} children stopped before exec"));
    let served = neighbour_served(&neighbour);
    eprintln!("uid {NEIGHBOUR} meanwhile: {neighbour}");
    assert_eq!(served.0, 40, "uid {NEIGHBOUR} was not served: {neighbour}");
    assert!(
        served.1 < NEIGHBOUR_P99_BOUND,
        "uid {NEIGHBOUR}'s p99 {:?} is over {NEIGHBOUR_P99_BOUND:?}",
        served.1
    );
    assert!(stalled(), "the attacker's spawner is no longer stalled");

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
    let mut attack = attacker(&mode, &daemon, ATTACKER);
    let finding = attack.finding();
    assert!(stopped_count(&finding) >= 1, "{finding}");
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

/// The p99 of another uid's spawns while a peer's spawner is stalled:
/// its first spawn starts its own spawner process (an exec of the
/// daemon's binary); a stalled daemon would take the 30 s answer deadline.
const NEIGHBOUR_P99_BOUND: Duration = Duration::from_millis(500);

/// `(spawns served, p99)` from a `spawn-loop` finding
/// (`served N p99_us P failed F`).
fn neighbour_served(finding: &str) -> (usize, Duration) {
    let words: Vec<&str> = finding.split_whitespace().collect();
    match words.as_slice() {
        ["served", served, "p99_us", p99, "failed", "0"] => (
            served.parse().unwrap_or(0),
            Duration::from_micros(p99.parse().unwrap_or(u64::MAX)),
        ),
        _ => (0, Duration::MAX),
    }
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
        daemon.settled_fd_count() <= fds_before + 1 + daemon.spawner_fds(),
        "the daemon kept fds of closed connections"
    );
}

/// Two connections send spawns refused with a message that quotes a
/// 120 KiB program path, far more than their socket buffers hold, and
/// never read a reply. A connection stops being read at
/// [`MAX_UNANSWERED`] unanswered or unread replies, and each refusal's
/// text is clipped to 1 KiB: the daemon reads a bounded number of
/// requests and grows by little.
#[test]
fn a_client_that_never_reads_cannot_grow_the_daemon() {
    if skip_unless_root() {
        return;
    }
    let daemon = shared_daemon("dos-unread", None);
    let fds_before = daemon.settled_fd_count();
    let rss_before = daemon.rss_kib();

    let bystander = Bystander::start(&daemon);
    let mut attack = attacker("never-read:2:1300:refused", &daemon, ATTACKER);
    let sent = sent_counts(&attack.finding());
    let rss_during = daemon.rss_kib();
    let fds_during = daemon.fd_count();
    let seen = bystander.finish();
    seen.assert_served("with 2 connections that never read");
    eprintln!(
        "attacker sent {sent:?}; daemon: {rss_before} KiB, {fds_before} fds before; \
         {rss_during} KiB, {fds_during} fds during"
    );
    // Read by the daemon, plus the eight 120 KiB frames the attacker's
    // socket buffer (1 MiB) holds.
    for count in &sent {
        assert!(
            *count <= MAX_UNANSWERED + 8,
            "the daemon read {count} requests of a connection that reads nothing"
        );
    }
    // The spawns read and not yet answered hold their 120 KiB program
    // name: 2 connections of 64 is 15 MiB at worst; their refusals,
    // clipped, 128 KiB. Unclipped, the refusals alone would be 15 MiB
    // more.
    let peak_rss = seen.max_rss_kib.max(rss_during);
    assert!(
        peak_rss < rss_before + 16 * 1024,
        "RSS grew from {rss_before} to {peak_rss} KiB"
    );
    // Two connections, and the pidfds, status pipes and /dev/null of the
    // children being started at once.
    let fds_bound = fds_before + 6 + 3 * launches_per_uid() + 8;
    assert!(
        seen.max_fds.max(fds_during) <= fds_bound,
        "fds grew from {fds_before} to {} (bound {fds_bound})",
        seen.max_fds.max(fds_during)
    );

    attack.end();
    assert!(
        daemon.settled_fd_count() <= fds_before + 1 + daemon.spawner_fds(),
        "fds stayed after the attack"
    );
    let settled = eventually(Duration::from_secs(10), || {
        daemon.rss_kib() < rss_before + 8 * 1024
    });
    assert!(
        settled,
        "RSS stayed at {} KiB after the attack (before: {rss_before})",
        daemon.rss_kib()
    );
}

/// The counts of a `sent A B ...` finding.
fn sent_counts(finding: &str) -> Vec<usize> {
    finding
        .strip_prefix("sent ")
        .unwrap_or_else(|| panic!("not a sent line: {finding}"))
        .split(' ')
        .map(|count| count.parse().expect("count"))
        .collect()
}

/// The root client's view of the daemon's counters.
fn daemon_status(daemon: &Daemon) -> zygote_client::DaemonStatus {
    let client = zygote_client::blocking::Client::connect(daemon.socket()).expect("connect");
    client.status().expect("status")
}

/// `connections` connections each send 1,300 spawns of `/bin/true` and
/// never read a reply. Every child is reaped at once, though its
/// `Spawned` and `Exited` are never delivered; each connection starts at
/// most [`MAX_UNANSWERED`] children before it is no longer read; the
/// others keep being served.
fn never_reader_of_spawns(connections: usize) {
    let daemon = shared_daemon(&format!("dos-unread-{connections}"), None);
    let fds_before = daemon.settled_fd_count();
    let rss_before = daemon.rss_kib();
    let before = daemon_status(&daemon);

    let bystander = Bystander::start(&daemon);
    let mut attack = attacker(
        &format!("never-read:{connections}:1300:true"),
        &daemon,
        ATTACKER,
    );
    let sent = sent_counts(&attack.finding());
    // The attacker still holds its connections, every reply unread.
    std::thread::sleep(Duration::from_secs(2));
    let no_zombies = eventually(Duration::from_secs(5), || daemon.zombies().is_empty());
    let zombies = daemon.zombies().len();
    let fds_during = daemon.fd_count();
    let seen = bystander.finish();
    let after = daemon_status(&daemon);
    let what = format!("with {connections} connections that never read their spawns");
    eprintln!("{what}: attacker sent {sent:?}; {zombies} zombies, {fds_during} fds");
    seen.assert_served(&what);
    assert!(
        no_zombies,
        "{zombies} zombies stay while their client does not read"
    );
    let started = after.spawns_succeeded - before.spawns_succeeded;
    let attackers = started - seen.latencies.len() as u64;
    assert!(
        attackers <= (connections * MAX_UNANSWERED) as u64,
        "a client that never reads started {attackers} children on {connections} connections"
    );
    assert!(
        attackers >= connections as u64,
        "the attack started only {attackers} children: it did not run"
    );
    assert!(
        after.children_running <= 1,
        "{} children counted as running, their exits undelivered",
        after.children_running
    );
    assert!(
        seen.max_zombies <= MAX_UNANSWERED,
        "{} zombies at once",
        seen.max_zombies
    );
    // Per connection: its socket, the duplicate a blocked send waits on,
    // its children's /dev/null, and the pidfds of replies it has not read
    // (64 at most, in the daemon or in flight); and the fds of the few
    // children being started at once.
    let fds_bound =
        fds_before + 3 * connections + MAX_UNREAD_FDS * connections + 3 * launches_per_uid() + 8;
    assert!(
        seen.max_fds.max(fds_during) <= fds_bound,
        "fds grew from {fds_before} to {} (bound {fds_bound})",
        seen.max_fds.max(fds_during)
    );
    assert!(
        seen.max_rss_kib < rss_before + 16 * 1024,
        "RSS grew from {rss_before} to {} KiB",
        seen.max_rss_kib
    );

    attack.end();
    assert!(
        daemon.settled_fd_count() <= fds_before + 1 + daemon.spawner_fds(),
        "fds stayed after the attack"
    );
    assert!(
        daemon.zombies().is_empty(),
        "zombies stayed after the attack"
    );
    let settled = eventually(Duration::from_secs(10), || {
        daemon.rss_kib() < rss_before + 8 * 1024
    });
    assert!(
        settled,
        "RSS stayed at {} KiB after the attack (before: {rss_before})",
        daemon.rss_kib()
    );
}

#[test]
fn a_client_that_never_reads_on_2_connections_leaves_no_zombies() {
    if skip_unless_root() {
        return;
    }
    never_reader_of_spawns(2);
}

#[test]
fn a_client_that_never_reads_on_16_connections_leaves_no_zombies() {
    if skip_unless_root() {
        return;
    }
    never_reader_of_spawns(16);
}

/// A client that reads none of its replies, its children all finished,
/// is closed after 30 s held back: its unread replies and their fds are
/// dropped, its place in the table freed.
#[test]
fn a_client_that_never_reads_is_closed_once_its_children_are_done() {
    if skip_unless_root() {
        return;
    }
    let daemon = shared_daemon("dos-stuck", None);
    let fds_before = daemon.settled_fd_count();
    let mut attack = attacker("never-read:1:1300:true", &daemon, ATTACKER);
    let sent = sent_counts(&attack.finding());
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    assert!(
        daemon.fd_count() > fds_before,
        "the connection was closed before its deadline"
    );
    let closed = eventually(Duration::from_secs(40), || {
        daemon.fd_count() <= fds_before + daemon.spawner_fds()
    });
    eprintln!("sent {sent:?}; closed after {:?}", started.elapsed());
    assert!(
        closed,
        "a connection that reads nothing stayed open: {} fds (before: {fds_before})",
        daemon.fd_count()
    );
    let logged = eventually(Duration::from_secs(5), || {
        daemon
            .log()
            .contains("closing a connection that reads none of its replies")
    });
    assert!(logged, "the closure was not logged");
    attack.end();
}

/// A child table of 64, as the defaults are shaped: each unprivileged
/// uid may run a quarter of it, and root keeps a reserve.
const SMALL_TABLE: &str = "[limits]\nmax_children = 64\n";

/// A peer starts `sleep` children until it is refused: it gets its share
/// of the table (a quarter), no more; another uid and root still spawn.
#[test]
fn a_peer_spawning_sleepers_gets_its_share_of_the_table() {
    if skip_unless_root() {
        return;
    }
    let daemon = shared_daemon("dos-share", Some(SMALL_TABLE));
    let bystander = Bystander::start(&daemon);
    let mut attack = attacker("sleepers", &daemon, ATTACKER);
    let finding = attack.finding();
    let neighbour = attacker("spawn-once", &daemon, NEIGHBOUR).finding();
    let status = daemon_status(&daemon);
    std::thread::sleep(Duration::from_secs(2));
    let seen = bystander.finish();
    seen.assert_served("with one uid at its share of the table");
    assert_eq!(finding, "sleepers 16", "a quarter of 64 children");
    assert_eq!(neighbour, "spawned", "uid {NEIGHBOUR} was locked out");
    assert!(
        status.children_running >= 16,
        "the sleepers are not counted: {}",
        status.children_running
    );
    assert!(seen.max_zombies <= 4, "{} zombies", seen.max_zombies);

    attack.end();
    let gone = eventually(Duration::from_secs(10), || {
        daemon_status(&daemon).children_running == 0 && daemon.zombies().is_empty()
    });
    assert!(gone, "the sleepers outlived their kill-on-close client");
}

/// A table of 8 children whose every uid may use it all, served by a
/// daemon of [`NEIGHBOUR`]'s uid that any uid may use: root's reserve is
/// the last 2 (a quarter).
const RESERVE_TABLE: &str = "[connect]\nany = true\n\n[limits]\nmax_children = 8\n\
                             max_children_per_peer = 8\nmax_connections = 8\n\
                             max_connections_per_peer = 8\n";

/// The last places in the child and connection tables are kept for root
/// and the daemon's own uid: an unprivileged peer allowed the whole table
/// stops short of them, and root then takes them. The daemon runs as
/// another uid than root, so that root is privileged as root, not as the
/// daemon's uid.
#[test]
fn the_last_children_and_connections_are_kept_for_root() {
    if skip_unless_root() {
        return;
    }
    let daemon = crate::util::start_daemon_as(
        "dos-reserve",
        Some(NEIGHBOUR),
        Some(RESERVE_TABLE),
        &["--socket-mode", "0666"],
    );
    let fds_before = daemon.settled_fd_count();
    let mut peer = attacker("sleepers", &daemon, ATTACKER);
    assert_eq!(
        peer.finding(),
        "sleepers 6",
        "8 children less root's reserve of 2\n{}",
        daemon.log()
    );
    let mut root = attacker("sleepers", &daemon, 0);
    assert_eq!(root.finding(), "sleepers 2", "root takes the reserve");
    root.end();
    peer.end();
    // The sleepers' connections count until the daemon has seen them
    // close, which may be a moment after their processes are gone.
    let closed = eventually(Duration::from_secs(10), || {
        daemon.fd_count() <= fds_before + daemon.spawner_fds()
    });
    assert!(closed, "the sleepers' connections stayed open");
    // Connections: 6 of 8 for the peer (each over is refused at once),
    // the other 2 for root; all close at the handshake deadline.
    let mut peer = attacker("idle-connections:8", &daemon, ATTACKER);
    assert_eq!(peer.finding(), "open 8");
    // Root connects once the daemon has taken the peer's 6 (one fd
    // each), lest root's be counted first.
    let taken = eventually(Duration::from_secs(10), || {
        daemon.fd_count() == fds_before + 6
    });
    assert!(
        taken,
        "the peer's connections were not taken: {} fds",
        daemon.fd_count()
    );
    let mut root = attacker("idle-connections:2", &daemon, 0);
    assert_eq!(root.finding(), "open 2");
    assert_eq!(peer.finding(), "busy 2 deadline 6 other 0");
    assert_eq!(root.finding(), "busy 0 deadline 2 other 0");
    root.end();
    peer.end();
}

/// A peer reads each `Spawned` but never an `Exited`: its children are
/// reaped when they exit and stop counting against its share, their exit
/// notices wait for it, and it can start at most its share plus
/// [`MAX_UNANSWERED`] more before it is no longer read.
#[test]
fn a_peer_that_reads_spawned_but_never_exited_holds_no_children() {
    if skip_unless_root() {
        return;
    }
    let daemon = shared_daemon("dos-exits", Some(SMALL_TABLE));
    let before = daemon_status(&daemon);
    let bystander = Bystander::start(&daemon);
    let mut attack = attacker("spawned-not-exited", &daemon, ATTACKER);
    let finding = attack.finding();
    // Its sleepers have exited; their notices are unread.
    let idle = eventually(Duration::from_secs(10), || {
        daemon_status(&daemon).children_running <= 1 && daemon.zombies().is_empty()
    });
    let seen = bystander.finish();
    let after = daemon_status(&daemon);
    eprintln!("attacker: {finding}");
    seen.assert_served("with a peer that never reads its exits");
    assert!(
        finding.starts_with("spawned 16 "),
        "the peer did not get exactly its share: {finding}"
    );
    assert!(
        idle,
        "children whose exit is undelivered still count as running ({}), or stay zombies ({:?})",
        daemon_status(&daemon).children_running,
        daemon.zombies()
    );
    let started = after.spawns_succeeded - before.spawns_succeeded - seen.latencies.len() as u64;
    assert!(
        started <= (16 + MAX_UNANSWERED) as u64,
        "the peer started {started} children"
    );
    assert!(seen.max_zombies <= 16, "{} zombies", seen.max_zombies);
    attack.end();
}

/// A peer floods the daemon with spawns its policy refuses: each is
/// answered, but the daemon logs a few lines for it per window, not one
/// per refusal.
#[test]
fn a_peer_flooding_refusals_cannot_flood_the_log() {
    if skip_unless_root() {
        return;
    }
    let daemon = shared_daemon("dos-log", None);
    let bystander = Bystander::start(&daemon);
    let started = Instant::now();
    let mut attack = attacker("refusals:2000", &daemon, ATTACKER);
    let finding = attack.finding();
    let elapsed = started.elapsed();
    let seen = bystander.finish();
    seen.assert_served("with a peer flooding refusals");
    assert_eq!(finding, "refused 2000");
    let log = daemon.log();
    let lines = log
        .lines()
        .filter(|line| line.contains("spawn refused") && line.contains(&ATTACKER.to_string()))
        .count();
    // 10 lines per uid per 10 s window.
    let windows = elapsed.as_secs() / 10 + 2;
    eprintln!("{lines} lines logged for 2000 refusals in {elapsed:?}");
    assert!(
        lines as u64 <= 10 * windows,
        "{lines} log lines for 2000 refusals in {elapsed:?}"
    );
    assert!(lines >= 1, "the refusals were not logged at all");
    attack.end();
}

/// Kill-on-close of a child that joined an existing group, and the
/// timeout of a child that moved to another group, still end the child:
/// the child itself always gets the signal, and only a group it leads is
/// signalled as a group.
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

/// The attackers' entry point (`util::ENTRY_POINTS`), run instead of the
/// test harness in a process [`attacker`] starts.
pub fn attacker_process() {
    let mode = std::env::var(MODE_ENV).expect("the attack mode");
    let socket = std::env::var(SOCKET_ENV).expect("socket path");
    let socket = Path::new(&socket);
    let daemon: u32 = std::env::var(DAEMON_ENV)
        .expect("daemon pid")
        .parse()
        .expect("daemon pid");
    match mode.split(':').collect::<Vec<_>>().as_slice() {
        ["stop-before-exec", count] => {
            stop_before_exec(socket, daemon, count.parse().expect("count"));
        }
        ["idle-connections", count] => idle_connections(socket, count.parse().expect("count")),
        ["spawn-once"] => spawn_once(socket),
        ["spawn-loop", count] => spawn_loop_of(socket, count.parse().expect("count")),
        ["never-read", connections, requests, kind] => never_read(
            socket,
            connections.parse().expect("connections"),
            requests.parse().expect("requests"),
            kind,
        ),
        ["sleepers"] => sleepers(socket),
        ["spawned-not-exited"] => spawned_not_exited(socket),
        ["refusals", count] => refusals(socket, count.parse().expect("count")),
        ["groups"] => groups(socket),
        ["leave-at-answer", count] => leave_at_answer(socket, count.parse().expect("count")),
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

/// Spawns `true` through a 6,000-entry PATH, `count + 2` at a time, and
/// SIGSTOPs each child of ours that has not exec'd yet, until `count` are
/// stopped or 5 s have passed.
fn stop_before_exec(socket: &Path, daemon: u32, count: usize) {
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
    for _ in 0..count + 2 {
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
    // A stop stalls our spawner, and with it our next spawns: report what
    // we have after a while, even short of `count`.
    let deadline = Instant::now() + Duration::from_secs(5);
    while stopped.len() < count && Instant::now() < deadline {
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

/// Spawns `/bin/true` `count` times, one after the other; reports how
/// many succeeded and their p99.
fn spawn_loop_of(socket: &Path, count: usize) {
    let client = zygote_client::blocking::Client::connect(socket).expect("connect");
    let mut latencies = Vec::with_capacity(count);
    let mut failed = 0;
    for _ in 0..count {
        let started = Instant::now();
        let status = zygote_client::blocking::Command::new(&client, "/bin/true")
            .stdin(zygote_client::Stdio::null())
            .status();
        match status {
            Ok(status) if status.success() => latencies.push(started.elapsed()),
            _ => failed += 1,
        }
    }
    latencies.sort_unstable();
    let p99 = latencies
        .get(latencies.len().saturating_sub(1) * 99 / 100)
        .map_or(u128::MAX, Duration::as_micros);
    say(&format!(
        "served {} p99_us {p99} failed {failed}",
        latencies.len()
    ));
}

fn spawn_once(socket: &Path) {
    let client = zygote_client::blocking::Client::connect(socket).expect("connect");
    let status = zygote_client::blocking::Command::new(&client, "/bin/true")
        .stdin(zygote_client::Stdio::null())
        .status();
    match status {
        Ok(status) if status.success() => say("spawned"),
        Ok(status) => say(&format!("exited {status:?}")),
        Err(error) => say(&format!("refused: {error}")),
    }
}

/// A connection past its handshake, in blocking mode.
fn raw_connect(socket: &Path) -> OwnedFd {
    let connection = socket::connect_to(socket, false).expect("connect");
    let hello = ClientMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "dos".into(),
    });
    send_frame(connection.as_fd(), &encode(&hello).expect("encode"), &[]).expect("hello");
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    recv_frame(connection.as_fd(), &mut scratch)
        .expect("hello ack")
        .expect("hello ack");
    connection
}

/// The next reply on `connection`; its fds are closed.
fn next_reply(connection: &OwnedFd) -> ServerMessage {
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let frame = recv_frame(connection.as_fd(), &mut scratch)
        .expect("receive")
        .expect("the daemon closed the connection");
    decode(&frame.bytes).expect("decode")
}

fn send_request(connection: &OwnedFd, request: SpawnRequest) -> bool {
    let request = ClientMessage::Spawn(request);
    send_frame(connection.as_fd(), &encode(&request).expect("encode"), &[]).is_ok()
}

/// Spawns `/bin/true` `count` times, each on a connection of its own
/// closed 0 to 1.2 ms after the request (spread over the rounds): some
/// leave just as their child is reported started.
fn leave_at_answer(socket: &Path, count: usize) {
    for round in 0..count {
        let connection = raw_connect(socket);
        let _ = send_request(&connection, SpawnRequest::new(1, "/bin/true"));
        let delay = u64::try_from(round).unwrap_or(0).wrapping_mul(37) % 1200;
        std::thread::sleep(Duration::from_micros(delay));
        drop(connection);
    }
    say(&format!("left {count}"));
    hold();
}

/// A spawn of `sleep seconds`, killed when its client leaves.
fn sleeper(id: u64, seconds: &str) -> SpawnRequest {
    SpawnRequest {
        args: vec![seconds.as_bytes().to_vec()],
        kill_on_close: Some(zygote_proto::KillOnClose {
            signal: libc::SIGKILL,
            process_group: false,
        }),
        ..SpawnRequest::new(id, "/bin/sleep")
    }
}

/// Starts `sleep 1000` children, reading each reply, until one is
/// refused; reports how many run.
fn sleepers(socket: &Path) {
    let connection = raw_connect(socket);
    let mut running = 0;
    for id in 0..10_000 {
        assert!(send_request(&connection, sleeper(id, "1000")));
        match next_reply(&connection) {
            ServerMessage::Spawned(_) => running += 1,
            ServerMessage::SpawnFailed(failed) if failed.errno == libc::EAGAIN => break,
            other => panic!("unexpected reply {other:?}"),
        }
    }
    say(&format!("sleepers {running}"));
    hold();
}

/// Starts `sleep 1` children, reading only their `Spawned`, until one is
/// refused; then, their exits unread, sends `/bin/true` spawns without
/// reading until the daemon stops taking them (2 s without progress).
fn spawned_not_exited(socket: &Path) {
    let connection = raw_connect(socket);
    let mut spawned = 0;
    let mut id = 0;
    loop {
        assert!(send_request(&connection, sleeper(id, "1")));
        id += 1;
        match next_reply(&connection) {
            ServerMessage::Spawned(_) => spawned += 1,
            ServerMessage::SpawnFailed(failed) if failed.errno == libc::EAGAIN => break,
            other => panic!("unexpected reply {other:?}"),
        }
    }
    // Their exits come, unread.
    std::thread::sleep(Duration::from_secs(2));
    rustix::io::ioctl_fionbio(&connection, true).expect("non-blocking");
    let mut sent = 0;
    let mut stuck_since = None;
    loop {
        if send_request(&connection, SpawnRequest::new(id, "/bin/true")) {
            id += 1;
            sent += 1;
            stuck_since = None;
        } else {
            let since = *stuck_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(2) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    say(&format!("spawned {spawned} sent {sent}"));
    hold();
}

/// Sends `count` spawns that ask to run as root, which the policy
/// refuses, reading each refusal.
fn refusals(socket: &Path, count: u64) {
    let connection = raw_connect(socket);
    let mut refused = 0;
    for id in 0..count {
        let request = SpawnRequest {
            user: Some(zygote_proto::UserSpec {
                uid: 0,
                gid: 0,
                groups: Vec::new(),
            }),
            ..SpawnRequest::new(id, "/bin/true")
        };
        assert!(send_request(&connection, request));
        match next_reply(&connection) {
            ServerMessage::SpawnFailed(failed) if failed.errno == libc::EPERM => refused += 1,
            other => panic!("unexpected reply {other:?}"),
        }
    }
    say(&format!("refused {refused}"));
    hold();
}

/// On each of `connections` connections, sends up to `requests` spawn
/// requests and never reads a reply: of `/bin/true` (`kind` "true"), or
/// of a 120 KiB program path, refused with a message quoting it
/// ("refused").
fn never_read(socket: &Path, connections: usize, requests: usize, kind: &str) {
    let connections: Vec<OwnedFd> = (0..connections)
        .map(|_| {
            let connection = raw_connect(socket);
            rustix::io::ioctl_fionbio(&connection, true).expect("non-blocking");
            connection
        })
        .collect();
    let program = match kind {
        "true" => "/bin/true".to_owned(),
        "refused" => format!("/{}", "A".repeat(120 * 1024)),
        _ => panic!("unknown request kind {kind}"),
    };
    let mut sent = vec![0usize; connections.len()];
    let mut stuck_since = None;
    while sent.iter().any(|count| *count < requests) {
        let mut progress = false;
        for (connection, count) in connections.iter().zip(&mut sent) {
            if *count >= requests {
                continue;
            }
            if send_request(
                connection,
                SpawnRequest::new(*count as u64, program.as_str()),
            ) {
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
