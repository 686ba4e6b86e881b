//! Load and soak: 10,000 spawns at concurrency 64 from four client
//! processes, then the daemon's fds, memory and children are checked.

use std::process::Stdio;
use std::time::Duration;

use crate::helper::{findings, helper};
use crate::util::{Daemon, children_of, output_within, start_daemon};

/// Runs `processes` helper clients of `count` spawns each, `parallel` at a
/// time each; returns how many exit statuses they saw.
fn load(daemon: &Daemon, processes: usize, count: usize, parallel: usize) -> usize {
    let clients: Vec<_> = (0..processes)
        .map(|_| {
            helper(&format!("load:{count}:{parallel}"), daemon.socket())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a load client")
        })
        .collect();
    let mut delivered = 0;
    for client in clients {
        let output = output_within(client, Duration::from_secs(600), "a load client");
        assert!(output.status.success(), "a load client failed");
        for finding in findings(&output.stdout) {
            let count: usize = finding
                .strip_prefix("ok ")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected finding {finding:?}"));
            delivered += count;
        }
    }
    delivered
}

#[test]
fn ten_thousand_spawns_at_concurrency_64_leave_nothing_behind() {
    let daemon = start_daemon("soak");
    // Warm up at full concurrency: worker threads, their stacks and the
    // allocator's arenas are made once, and are not a leak.
    assert_eq!(load(&daemon, 4, 250, 16), 1000);
    let fds_before = daemon.settled_fd_count();
    let rss_before = daemon.rss_kib();

    assert_eq!(
        load(&daemon, 4, 2500, 16),
        10_000,
        "every exit status arrives"
    );

    let fds_after = daemon.settled_fd_count();
    assert_eq!(fds_after, fds_before, "daemon fds");
    // Allocators keep some freed memory, so RSS is compared with a margin:
    // 8 MiB, far below what a per-spawn leak would show after 10,000 spawns
    // (1 KiB each would be 10 MiB).
    let rss_after = daemon.rss_kib();
    eprintln!("daemon RSS: {rss_before} KiB after warm-up, {rss_after} KiB after 10,000 spawns");
    assert!(
        rss_after <= rss_before + 8 * 1024,
        "daemon RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    assert!(children_of(daemon.pid()).is_empty(), "children left");
    assert!(daemon.zombies().is_empty(), "zombies left");
}
