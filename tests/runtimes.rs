//! The shared daemon's runtimes: connections spread over them, and each
//! connection's spawns run on its own runtime's thread.

use std::collections::HashMap;

use zygote_client::{Client, Command, Stdio};

use crate::util::{Daemon, runtime, start_daemon_with};

/// Voluntary context switches of each thread that serves connections:
/// the main one (`zygote`) and the other runtimes' (`zygote-rt-N`).
fn switches_by_thread(daemon: &Daemon) -> HashMap<String, u64> {
    let tasks = format!("/proc/{}/task", daemon.pid());
    let mut switches = HashMap::new();
    for entry in std::fs::read_dir(&tasks).expect("read the daemon's threads") {
        let status = std::fs::read_to_string(entry.expect("thread entry").path().join("status"));
        let Ok(status) = status else { continue };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|value| value.trim().to_owned())
        };
        let name = field("Name:").unwrap_or_default();
        if name == "zygote" || name.starts_with("zygote-rt-") {
            let count = field("voluntary_ctxt_switches:")
                .and_then(|value| value.parse().ok())
                .unwrap_or(0);
            switches.insert(name, count);
        }
    }
    switches
}

/// The thread that switched most between two snapshots, and how often.
fn busiest(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> (String, u64) {
    after
        .iter()
        .map(|(name, count)| (name.clone(), count - before.get(name).copied().unwrap_or(0)))
        .max_by_key(|(_, delta)| *delta)
        .expect("a serving thread")
}

async fn spawn_some(client: &Client, count: usize) {
    for _ in 0..count {
        let status = Command::new(client, "/bin/true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .expect("spawn and wait");
        assert!(status.success());
    }
}

#[test]
fn two_connections_are_served_by_two_runtime_threads() {
    const SPAWNS: usize = 100;
    let daemon = start_daemon_with("runtimes", None, &["--runtimes", "2"]);
    let threads = switches_by_thread(&daemon);
    assert!(
        threads.contains_key("zygote-rt-1"),
        "no second runtime thread: {threads:?}\n{}",
        daemon.log()
    );
    let runtime = runtime();
    let (first, second) = runtime.block_on(async {
        // Both open at once: the second goes to the runtime with none.
        let first = Client::connect(daemon.socket()).await.expect("connect");
        let second = Client::connect(daemon.socket()).await.expect("connect");
        spawn_some(&first, 2).await;
        spawn_some(&second, 2).await;
        (first, second)
    });
    let start = switches_by_thread(&daemon);
    runtime.block_on(spawn_some(&first, SPAWNS));
    let after_first = switches_by_thread(&daemon);
    runtime.block_on(spawn_some(&second, SPAWNS));
    let after_second = switches_by_thread(&daemon);
    let (first_thread, first_switches) = busiest(&start, &after_first);
    let (second_thread, second_switches) = busiest(&after_first, &after_second);
    // Each spawn waits in epoll at least once on the thread serving it.
    assert!(
        first_switches >= SPAWNS as u64 && second_switches >= SPAWNS as u64,
        "{first_thread}: {first_switches}, {second_thread}: {second_switches} switches"
    );
    assert_ne!(
        first_thread,
        second_thread,
        "both connections were served on one thread: {start:?} {after_first:?} {after_second:?}\n{}",
        daemon.log()
    );
    assert!(daemon.log().contains("runtimes=2"), "{}", daemon.log());
}
