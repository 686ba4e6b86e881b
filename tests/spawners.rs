//! The per-uid spawner processes of a root daemon: a non-root peer's
//! children come from its uid's spawner yet are the daemon's own; the
//! spawner holds nothing but its socket; one that dies is reported and
//! replaced; with spawners off, such children take the fork path.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::{
    Daemon, eventually, open_fds, output_within, parent_of, sched_policy, start_daemon_custom,
    zygote_bin,
};

/// The peer's uid (and gid): `nobody` on Debian.
const PEER: u32 = 65534;

fn skip_unless_root() -> bool {
    !crate::util::root_or_skip("spawner processes (a root daemon and another uid)")
}

/// A root daemon whose socket any uid may use, serving metrics.
fn shared_daemon(name: &str, envs: &[(&str, &str)]) -> (Daemon, SocketAddr) {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, crate::tools::free_port()));
    let address_text = address.to_string();
    let flags = ["--socket-mode", "0666", "--metrics-listen", &address_text];
    let daemon = start_daemon_custom(name, None, None, &flags, &zygote_bin(), envs);
    (daemon, address)
}

/// `zygote run -- sh -c SCRIPT` as [`PEER`], started.
fn start_as_peer(daemon: &Daemon, script: &str) -> std::process::Child {
    Command::new(zygote_bin())
        .args(["run", "--", "/bin/sh", "-c", script])
        .env("ZYGOTE_SOCKET", daemon.socket())
        .current_dir("/")
        .uid(PEER)
        .gid(PEER)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start zygote run")
}

/// `zygote run -- sh -c SCRIPT` as [`PEER`]: its stdout.
fn run_as_peer(daemon: &Daemon, script: &str) -> String {
    let child = start_as_peer(daemon, script);
    let output = output_within(child, Duration::from_secs(20), "zygote run as the peer");
    assert!(
        output.status.success(),
        "zygote run as uid {PEER}: {output:?}\n{}",
        daemon.log()
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A shared daemon that has served one spawn of [`PEER`]: its spawner
/// is running.
fn daemon_with_a_spawner(name: &str) -> (Daemon, SocketAddr, Vec<u32>) {
    let (daemon, metrics) = shared_daemon(name, &[]);
    assert_eq!(run_as_peer(&daemon, "id -u"), format!("{PEER}\n"));
    let spawners = daemon.spawners();
    assert_eq!(spawners.len(), 1, "one spawner for uid {PEER}");
    (daemon, metrics, spawners)
}

/// The value of the metric line that starts with `series` (name and
/// labels), if exported.
pub(crate) fn metric(address: SocketAddr, series: &str) -> Option<f64> {
    let (_, text) = crate::tools::http_get(address, "/metrics").expect("GET /metrics");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// The child reports its parent and uid; the spawner is root, a child of
/// the daemon, and holds fds 0, 1, 2 and its socket only.
#[test]
fn a_non_root_peers_child_comes_from_its_spawner_yet_is_the_daemons() {
    if skip_unless_root() {
        return;
    }
    let (daemon, metrics) = shared_daemon("spawner-child", &[]);
    let out = run_as_peer(&daemon, "echo $PPID; id -u");
    assert_eq!(
        out,
        format!("{}\n{PEER}\n", daemon.pid()),
        "{}",
        daemon.log()
    );
    let spawners = daemon.spawners();
    assert_eq!(spawners.len(), 1, "one spawner for uid {PEER}");
    let spawner = spawners[0];
    assert_eq!(parent_of(spawner), Some(daemon.pid()));
    let status = std::fs::read_to_string(format!("/proc/{spawner}/status")).expect("status");
    assert!(
        status.lines().any(|line| line.starts_with("Uid:\t0\t")),
        "the spawner runs as root: {status}"
    );
    let fds = open_fds(spawner);
    assert_eq!(fds.len(), 4, "0, 1, 2 and its socket: {fds:?}");
    let socket = std::fs::read_link(format!("/proc/{spawner}/fd/{}", fds[3])).expect("readlink");
    assert!(
        socket.to_string_lossy().starts_with("socket:"),
        "{socket:?}"
    );
    assert_eq!(
        metric(metrics, "zygote_spawn_paths_total{path=\"spawner\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(metrics, "zygote_spawn_paths_total{path=\"fork\"}"),
        Some(0.0)
    );
    assert_eq!(metric(metrics, "zygote_uid_spawners"), Some(1.0));
    // `zygote status` shows it to root, and to its uid.
    let row = format!("  {PEER:>10}  {spawner:>10}  {:>10}  {:>8}\n", 1, 0);
    assert!(
        status_text(&daemon, None).contains(&row),
        "{}",
        status_text(&daemon, None)
    );
    assert!(status_text(&daemon, Some(PEER)).contains(&row));
    assert!(
        !status_text(&daemon, Some(PEER - 1)).contains("\nspawners:\n"),
        "another uid sees no spawner of this one"
    );
}

/// `zygote status` against the daemon, as `uid` when given.
fn status_text(daemon: &Daemon, uid: Option<u32>) -> String {
    let mut command = Command::new(zygote_bin());
    command
        .args(["status", "--socket"])
        .arg(daemon.socket())
        .current_dir("/");
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    let output = command.output().expect("zygote status");
    assert!(output.status.success(), "zygote status: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A spawner killed from outside: logged at INFO, counted, and the uid's
/// next spawn starts a new one.
/// A spawner runs under `SCHED_BATCH`, as the daemon's threads do (it
/// never takes its child's CPU mid-exec), and its children start under
/// `SCHED_OTHER`; with `ZYGOTE_SCHED_BATCH=0` the daemon's choice holds
/// for its spawners too.
#[test]
fn a_spawner_runs_under_the_daemons_batch_policy_and_its_children_do_not() {
    if skip_unless_root() {
        return;
    }
    let child_policy = "grep '^policy' /proc/self/sched | tr -d ' \\t'";
    let (daemon, _, spawners) = daemon_with_a_spawner("spawner-batch");
    assert_eq!(sched_policy(daemon.pid()), "3", "the daemon's");
    assert_eq!(sched_policy(spawners[0]), "3", "the spawner's");
    assert_eq!(run_as_peer(&daemon, child_policy), "policy:0\n");
    let (daemon, _) = shared_daemon("spawner-no-batch", &[("ZYGOTE_SCHED_BATCH", "0")]);
    assert_eq!(run_as_peer(&daemon, child_policy), "policy:0\n");
    let spawners = daemon.spawners();
    assert_eq!(spawners.len(), 1, "{spawners:?}");
    assert_eq!(sched_policy(spawners[0]), "0", "kept as the daemon's");
}

#[test]
fn a_spawner_that_dies_is_reported_and_replaced() {
    if skip_unless_root() {
        return;
    }
    let (daemon, metrics, first) = daemon_with_a_spawner("spawner-dies");
    let pid = rustix::process::Pid::from_raw(first[0] as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill the spawner");
    assert!(
        eventually(Duration::from_secs(10), || daemon
            .log()
            .contains("spawner process failed")),
        "no log line for the spawner's end:\n{}",
        daemon.log()
    );
    assert!(
        eventually(Duration::from_secs(5), || daemon.spawners().is_empty()
            && daemon.zombies().is_empty()),
        "the dead spawner was not reaped: {:?}",
        daemon.zombies()
    );
    assert_eq!(run_as_peer(&daemon, "id -u"), format!("{PEER}\n"));
    let second = daemon.spawners();
    assert_eq!(second.len(), 1, "a new spawner");
    assert_ne!(second, first);
    assert_eq!(
        metric(metrics, "zygote_uid_spawner_restarts_total"),
        Some(1.0)
    );
    assert!(
        daemon.logged("restarts=1", Duration::from_secs(10)),
        "{}",
        daemon.log()
    );
    let row = format!("  {PEER:>10}  {:>10}  {:>10}  {:>8}\n", second[0], 1, 1);
    assert!(
        status_text(&daemon, None).contains(&row),
        "{}",
        status_text(&daemon, None)
    );
}

/// A spawner with nothing to do for a minute leaves: reaped, no longer
/// counted, the daemon's fd to it closed; the uid's next spawn starts
/// another.
#[test]
fn an_idle_spawner_exits_after_a_minute_and_the_next_spawn_starts_one() {
    if skip_unless_root() {
        return;
    }
    let (daemon, metrics, first) = daemon_with_a_spawner("spawner-idle");
    assert_eq!(metric(metrics, "zygote_uid_spawners"), Some(1.0));
    let with_spawner = daemon.settled_fd_count();
    // Still there well inside the minute.
    std::thread::sleep(Duration::from_secs(40));
    assert_eq!(daemon.spawners(), first, "left before it was idle a minute");
    assert!(
        eventually(Duration::from_secs(40), || daemon.spawners().is_empty()
            && daemon.zombies().is_empty()),
        "the idle spawner is still there, or not reaped: {:?} {:?}\n{}",
        daemon.spawners(),
        daemon.zombies(),
        daemon.log()
    );
    assert_eq!(metric(metrics, "zygote_uid_spawners"), Some(0.0));
    assert!(
        daemon.settled_fd_count() < with_spawner,
        "the daemon kept its socket to the spawner"
    );
    assert!(
        !daemon.log().contains("spawner process failed"),
        "an idle exit is not a failure:\n{}",
        daemon.log()
    );
    assert_eq!(run_as_peer(&daemon, "id -u"), format!("{PEER}\n"));
    assert_eq!(daemon.spawners().len(), 1, "a new spawner");
}

/// A non-root peer's child started through its spawner, running across a
/// live upgrade: its exit still reaches its client, nothing is left
/// unreaped, and the uid's next spawn is served.
#[test]
fn a_spawners_child_in_flight_across_an_upgrade_is_reported_and_the_uid_served_after() {
    if skip_unless_root() {
        return;
    }
    let (daemon, _metrics) = shared_daemon("spawner-upgrade", &[]);
    let running = start_as_peer(&daemon, "sleep 2; id -u; exit 7");
    assert!(
        eventually(Duration::from_secs(10), || daemon.spawners().len() == 1
            && crate::util::children_of(daemon.pid()).len() >= 2),
        "the child did not start: {}",
        daemon.log()
    );
    let upgrade = Command::new(zygote_bin())
        .args(["upgrade", "--socket"])
        .arg(daemon.socket())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("zygote upgrade");
    let upgraded = output_within(upgrade, Duration::from_secs(60), "zygote upgrade");
    assert!(upgraded.status.success(), "{upgraded:?}\n{}", daemon.log());
    let output = output_within(
        running,
        Duration::from_secs(30),
        "the child across the upgrade",
    );
    assert_eq!(
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).as_ref()
        ),
        (Some(7), format!("{PEER}\n").as_str()),
        "{output:?}\n{}",
        daemon.log()
    );
    assert_eq!(run_as_peer(&daemon, "id -u"), format!("{PEER}\n"));
    assert!(
        eventually(Duration::from_secs(10), || daemon.zombies().is_empty()),
        "left unreaped: {:?}",
        daemon.zombies()
    );
}

/// `ZYGOTE_UID_SPAWNERS=0`: no spawner; the child is forked from the
/// daemon, and still runs as the peer.
#[test]
fn without_spawners_the_child_takes_the_fork_path() {
    if skip_unless_root() {
        return;
    }
    let (daemon, metrics) = shared_daemon("spawner-off", &[("ZYGOTE_UID_SPAWNERS", "0")]);
    let out = run_as_peer(&daemon, "echo $PPID; id -u");
    assert_eq!(out, format!("{}\n{PEER}\n", daemon.pid()));
    assert!(daemon.spawners().is_empty());
    assert_eq!(
        metric(metrics, "zygote_spawn_paths_total{path=\"fork\"}"),
        Some(1.0)
    );
    assert_eq!(metric(metrics, "zygote_uid_spawners"), Some(0.0));
    // The spawner is the daemon's binary: it is not a command for users.
    let help = Command::new(zygote_bin())
        .arg("--help")
        .output()
        .expect("zygote --help");
    assert!(!String::from_utf8_lossy(&help.stdout).contains("uid-spawner"));
}

/// A spawner killed while it waits for a child its peer stopped before
/// exec: the spawn in flight fails (the client is told, nothing hangs),
/// the stopped child, nobody's now, is killed, and the peer's next spawn
/// starts a new spawner.
#[test]
fn a_spawner_killed_while_stalled_fails_its_spawn_and_its_child_goes() {
    if skip_unless_root() {
        return;
    }
    use crate::dos::{ATTACKER, attacker, name_uid_state, stopped_children, stopped_count};
    let daemon = crate::dos::shared_daemon("spawner-stalled-dies", None);
    // A child of root's, the daemon's own: not the spawner's to take along.
    let client = zygote_client::blocking::Client::connect(daemon.socket()).expect("connect");
    let bystander = zygote_client::blocking::Command::new(&client, "sleep")
        .arg("60")
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sleep");
    let mut attack = attacker("stop-before-exec:1", &daemon, ATTACKER);
    assert!(stopped_count(&attack.finding()) >= 1);
    let stalled = || {
        stopped_children(&daemon)
            .into_iter()
            .filter(|pid| {
                name_uid_state(*pid).is_some_and(|(name, uid, _)| {
                    name == crate::util::SPAWNER_NAME && uid == ATTACKER
                })
            })
            .count()
    };
    assert_eq!(
        stalled(),
        1,
        "the attacker's spawner waits for its stopped child"
    );
    // Long enough for the daemon to note the child of a stalled spawn.
    std::thread::sleep(Duration::from_secs(1));
    let spawners = daemon.spawners();
    assert_eq!(spawners.len(), 1);
    let pid = rustix::process::Pid::from_raw(spawners[0] as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill the spawner");
    assert!(
        eventually(Duration::from_secs(10), || stalled() == 0),
        "the stopped child outlived its spawner: {:?}",
        stopped_children(&daemon)
    );
    assert!(
        eventually(Duration::from_secs(10), || daemon
            .log()
            .contains("spawner process failed")),
        "{}",
        daemon.log()
    );
    // The spawner's stalled children were killed before that line; by
    // pidfd, as the exit notice of a child killed by mistake may still
    // be on its way.
    let pidfd = bystander
        .pidfd()
        .try_clone_to_owned()
        .expect("dup the pidfd");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        crate::deferred::pidfd_alive(&pidfd),
        "root's child was killed with the spawner's"
    );
    let log = daemon.log();
    let line = log
        .lines()
        .find(|line| line.contains("spawner process failed"))
        .unwrap_or_default();
    assert!(
        !line.contains("in_flight=0"),
        "a spawn was in flight: {line}"
    );
    // The attacker goes on spawning: through a new spawner.
    assert!(
        eventually(Duration::from_secs(10), || daemon
            .log()
            .contains("restarts=1")),
        "{}",
        daemon.log()
    );
    attack.end();
    crate::dos::kill_stopped_leftovers(&daemon);
    assert_no_zombie_within(&daemon, Duration::from_secs(10));
}

/// Clients that leave just as their spawner answers: a spawn that gives
/// up with its child already in the answer kills and reaps it, so no
/// zombie stays (one listed as the daemon's own is left alone by the
/// orphan reaper).
#[test]
fn clients_leaving_as_their_spawner_answers_leave_no_zombie() {
    if skip_unless_root() {
        return;
    }
    use crate::dos::{ATTACKER, attacker};
    let daemon = crate::dos::shared_daemon("spawner-leave-at-answer", None);
    let mut attack = attacker("leave-at-answer:1500", &daemon, ATTACKER);
    assert_eq!(attack.finding(), "left 1500");
    attack.end();
    assert_no_zombie_within(&daemon, Duration::from_secs(10));
}

/// Asserts that no child of the daemon stays a zombie past `timeout`,
/// naming each one left, with the daemon's log.
fn assert_no_zombie_within(daemon: &Daemon, timeout: Duration) {
    assert!(
        eventually(timeout, || daemon.zombies().is_empty()),
        "zombies left: {:?}\n{}",
        daemon
            .zombies()
            .into_iter()
            .map(|pid| (pid, crate::dos::name_uid_state(pid)))
            .collect::<Vec<_>>(),
        daemon.log()
    );
}

/// A spawner that keeps failing is not restarted at every spawn: after
/// three failures its uid takes the fork path for a while, and is served.
#[test]
fn a_spawner_that_keeps_failing_is_given_a_pause() {
    if skip_unless_root() {
        return;
    }
    let (daemon, metrics) = shared_daemon("spawner-pause", &[]);
    for failures in 1..=3 {
        assert_eq!(run_as_peer(&daemon, "id -u"), format!("{PEER}\n"));
        let spawners = daemon.spawners();
        assert_eq!(spawners.len(), 1, "failure {failures}: a spawner runs");
        let pid = rustix::process::Pid::from_raw(spawners[0] as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill");
        assert!(
            eventually(Duration::from_secs(10), || daemon
                .log()
                .matches("spawner process failed")
                .count()
                == failures),
            "{}",
            daemon.log()
        );
    }
    assert!(eventually(Duration::from_secs(5), || daemon
        .spawners()
        .is_empty()));
    assert_eq!(run_as_peer(&daemon, "id -u"), format!("{PEER}\n"));
    assert!(daemon.spawners().is_empty(), "no fourth spawner so soon");
    assert_eq!(
        metric(metrics, "zygote_spawn_paths_total{path=\"fork\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(metrics, "zygote_spawn_paths_total{path=\"spawner\"}"),
        Some(3.0)
    );
}

/// A child of the peer that fails before exec (no such program, no such
/// directory) is reported as such, and reaped.
#[test]
fn a_non_root_peers_failed_spawn_is_reported_and_reaped() {
    if skip_unless_root() {
        return;
    }
    let (daemon, _) = shared_daemon("spawner-failed", &[]);
    for (args, message) in [
        (
            &["run", "--", "/nonexistent/program"][..],
            "No such file or directory",
        ),
        (
            &["run", "--chdir", "/nonexistent", "--", "/bin/true"][..],
            "/nonexistent",
        ),
    ] {
        let child = Command::new(zygote_bin())
            .args(args)
            .env("ZYGOTE_SOCKET", daemon.socket())
            .current_dir("/")
            .uid(PEER)
            .gid(PEER)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start zygote run");
        let output = output_within(child, Duration::from_secs(20), "zygote run as the peer");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    assert_eq!(daemon.spawners().len(), 1, "started by the peer's spawner");
    assert!(
        eventually(Duration::from_secs(5), || daemon.zombies().is_empty()),
        "failed children left zombies: {:?}",
        daemon.zombies()
    );
}
