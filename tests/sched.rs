//! Scheduling: the daemon's threads run under `SCHED_BATCH` (a task the
//! kernel never lets preempt the client that wakes it), and every child
//! starts under `SCHED_OTHER`, with its nice value as the rules say, on
//! each spawn path: vfork (the daemon's credentials), the spawner process
//! and fork (another uid), clone3 into a cgroup, and the private zygotes.

use std::path::Path;

use zygote_client::Stdio;
use zygote_client::blocking::{Client, Command};

use crate::util::{Daemon, start_daemon, start_daemon_custom, zygote_bin};

pub(crate) const SCHED_OTHER: u32 = 0;
pub(crate) const SCHED_BATCH: u32 = 3;

/// The policy of the task at `path` (`/proc/PID/task/TID`): its `stat`'s
/// field 41.
fn policy_of(path: &Path) -> Option<u32> {
    let stat = std::fs::read_to_string(path.join("stat")).ok()?;
    stat[stat.rfind(')')? + 2..]
        .split_whitespace()
        .nth(38)?
        .parse()
        .ok()
}

/// The policy of every thread of `pid`, by thread id.
pub(crate) fn thread_policies(pid: u32) -> Vec<(u32, u32)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("read /proc/PID/task");
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            Some((tid, policy_of(&task.path())?))
        })
        .collect()
}

fn assert_all_batch(pid: u32, what: &str, log: &dyn Fn() -> String) {
    let policies = thread_policies(pid);
    assert!(!policies.is_empty(), "the {what} runs");
    assert!(
        policies.iter().all(|(_, policy)| *policy == SCHED_BATCH),
        "every thread of the {what} runs under SCHED_BATCH (3): {policies:?}\n{}",
        log()
    );
}

/// What a child says of itself: (parent pid, nice value, policy), from
/// the `/proc/self/stat` it printed.
fn parse_stat(stat: &[u8]) -> (u32, i32, u32) {
    let stat = String::from_utf8_lossy(stat);
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
        .split_whitespace()
        .collect();
    (
        fields[1].parse().expect("ppid"),
        fields[16].parse().expect("nice"),
        fields[38].parse().expect("policy"),
    )
}

/// A child started by `client` running `cat /proc/self/stat`: its (parent
/// pid, nice value, policy).
fn child_stat(client: &Client) -> (u32, i32, u32) {
    let output = Command::new(client, "cat")
        .arg("/proc/self/stat")
        .stdout(Stdio::piped())
        .output()
        .expect("run cat /proc/self/stat");
    assert!(output.status.success(), "{output:?}");
    parse_stat(&output.stdout)
}

/// `zygote run -- cat /proc/self/stat` through `daemon`, run by `sh -c`
/// with `prefix` before it (`nice -n 7`, `setpriv ...`).
fn run_stat(daemon: &Daemon, prefix: &str) -> (u32, i32, u32) {
    let output = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            r#"{prefix} "$ZYGOTE" run --socket "$SOCKET" -- cat /proc/self/stat"#
        ))
        .env("ZYGOTE", zygote_bin())
        .env("SOCKET", daemon.socket())
        .output()
        .expect("sh");
    assert!(
        output.status.success(),
        "{prefix} zygote run: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
    parse_stat(&output.stdout)
}

#[test]
fn shared_daemon_threads_are_batch_and_its_children_start_under_sched_other() {
    let daemon = start_daemon("sched-shared");
    let log = || daemon.log();
    assert_all_batch(daemon.pid(), "shared daemon", &log);
    let client = Client::connect(daemon.socket()).expect("connect");

    // The vfork path (the daemon's own credentials).
    let (ppid, nice, policy) = child_stat(&client);
    assert_eq!(ppid, daemon.pid(), "started by the daemon");
    assert_eq!(
        (nice, policy),
        (0, SCHED_OTHER),
        "a child starts under SCHED_OTHER at its client's nice value"
    );
    // A caller's nice value still applies.
    let (ppid, nice, policy) = run_stat(&daemon, "nice -n 7");
    assert_eq!(ppid, daemon.pid(), "started by the daemon");
    assert_eq!((nice, policy), (7, SCHED_OTHER), "nice 7, SCHED_OTHER");
    // Still under SCHED_BATCH after spawning.
    assert_all_batch(daemon.pid(), "shared daemon", &log);
}

#[test]
fn children_of_another_uid_start_under_sched_other_on_the_spawner_and_fork_paths() {
    if !crate::util::root_or_skip("the policy of another uid's children (a root daemon)") {
        return;
    }
    for (path, envs) in [
        ("spawner", &[][..]),
        ("fork", &[("ZYGOTE_UID_SPAWNERS", "0")][..]),
    ] {
        let flags = ["--socket-mode", "0666"];
        let name = format!("sched-{path}-path");
        let daemon = start_daemon_custom(&name, None, None, &flags, &zygote_bin(), envs);
        let (ppid, nice, policy) = run_stat(
            &daemon,
            "nice -n 5 setpriv --reuid 65534 --regid 65534 --clear-groups",
        );
        assert_eq!(ppid, daemon.pid(), "{path} path: started for the daemon");
        assert_eq!(
            (nice, policy),
            (5, SCHED_OTHER),
            "{path} path: a child of uid 65534 starts under SCHED_OTHER at its peer's nice value"
        );
        assert_eq!(daemon.spawners().len(), usize::from(path == "spawner"));
        assert_all_batch(daemon.pid(), "shared daemon", &|| daemon.log());
    }
}

#[test]
fn the_opt_out_keeps_the_daemon_under_sched_other() {
    let daemon = start_daemon_custom(
        "sched-opt-out",
        None,
        None,
        &[],
        &zygote_bin(),
        &[("ZYGOTE_SCHED_BATCH", "0")],
    );
    let policies = thread_policies(daemon.pid());
    assert!(
        policies.iter().all(|(_, policy)| *policy == SCHED_OTHER),
        "ZYGOTE_SCHED_BATCH=0: every thread keeps SCHED_OTHER: {policies:?}"
    );
    let client = Client::connect(daemon.socket()).expect("connect");
    assert_eq!(child_stat(&client).2, SCHED_OTHER);
    // Said once, at INFO, as the start of the daemon.
    assert!(
        daemon.logged(
            "ZYGOTE_SCHED_BATCH is off: daemon threads keep SCHED_OTHER",
            std::time::Duration::from_secs(10)
        ),
        "{}",
        daemon.log()
    );
}

/// A launched private zygote (`serve --private-fd`) runs under
/// `SCHED_BATCH` while idle; its children start under `SCHED_OTHER`.
#[test]
fn launched_private_zygote_is_batch_while_idle_and_its_children_are_not() {
    let (ours, theirs) = zygote_proto::socket::pair(false).expect("socketpair");
    let zygote = std::process::Command::new(zygote_bin())
        .args(["serve", "--private-fd", "0"])
        .env("ZYGOTE_LOG", "warn")
        .stdin(std::process::Stdio::from(theirs))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start a private zygote");
    let mut zygote = KillOnDrop(zygote);
    let pid = zygote.0.id();
    let client = Client::from_fd(ours).expect("connect to the private zygote");
    let (ppid, nice, policy) = child_stat(&client);
    assert_eq!(ppid, pid, "started by the private zygote");
    assert_eq!((nice, policy), (0, SCHED_OTHER), "the child");
    // Idle (no child running at the spawn): under batch.
    assert_all_batch(pid, "private zygote", &String::new);
    drop(client);
    let _ = zygote.0.wait();
}

/// Kills and reaps a process when dropped (a failed test's).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
