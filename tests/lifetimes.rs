//! Child lifetimes and faults: kill-on-close, timeouts, a client SIGKILLed
//! mid-stream, and a daemon SIGKILLed under its clients.

use std::io::{BufRead, BufReader};
use std::process::Stdio as StdStdio;
use std::time::{Duration, Instant};

use zygote_client::Stdio;
use zygote_client::blocking::{Client, Command};

use crate::helper::helper;
use crate::util::{
    children_of, eventually, exit_within, group_members, process_state, root_or_skip, start_daemon,
    start_daemon_as, start_daemon_with, stat_fields,
};

/// True once `pid` is gone or a zombie.
fn dead(pid: u32) -> bool {
    process_state(pid).is_none_or(|state| state == 'Z')
}

/// `sleep 30`, signalled with `signal` when its connection closes.
fn sleep_killed_on_close(client: &Client, signal: i32) -> zygote_client::blocking::Child {
    Command::new(client, "sleep")
        .arg("30")
        .kill_on_close(signal)
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn kill_on_close_signals_children_when_the_client_leaves() {
    let daemon = start_daemon("kill-on-close");
    let steady = Client::connect(daemon.socket()).expect("connect");
    let mut survivor = Command::new(&steady, "sleep")
        .arg("1")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();

    let leaving = Client::connect(daemon.socket()).expect("connect");
    let doomed = sleep_killed_on_close(&leaving, libc::SIGTERM);
    let kept = Command::new(&leaving, "sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let group = Command::new(&leaving, "/bin/sh")
        .args(["-c", "sleep 30 & sleep 30"])
        .process_group(0)
        .kill_process_group_on_close(libc::SIGKILL)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // Kill-on-close of the child alone, though it leads a group of its
    // own: the rest of its group is left running.
    let leader = Command::new(&leaving, "/bin/sh")
        .args(["-c", "sleep 30 & sleep 30"])
        .process_group(0)
        .kill_on_close(libc::SIGKILL)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let (doomed_pid, kept_pid, group_pid) = (doomed.id(), kept.id(), group.id());
    let leader_pid = leader.id();
    assert!(eventually(Duration::from_secs(5), || {
        group_members(group_pid).len() == 3 && group_members(leader_pid).len() == 3
    }));
    drop((doomed, kept, group, leader));
    drop(leaving);

    assert!(eventually(Duration::from_secs(5), || dead(doomed_pid)));
    assert!(
        eventually(Duration::from_secs(5), || group_members(group_pid)
            .is_empty()),
        "group {group_pid} left: {:?}",
        group_members(group_pid)
    );
    // Reaped by the daemon, not left as zombies.
    assert!(eventually(Duration::from_secs(5), || {
        !children_of(daemon.pid()).contains(&doomed_pid)
    }));
    assert!(
        !dead(kept_pid),
        "a child without kill-on-close outlives its client"
    );
    assert!(eventually(Duration::from_secs(5), || dead(leader_pid)));
    let left = group_members(leader_pid);
    assert_eq!(
        left.len(),
        2,
        "kill-on-close of a group leader alone took its group: {left:?}"
    );
    for pid in left {
        sigkill(pid);
    }
    sigkill(kept_pid);
    assert!(
        exit_within(Duration::from_secs(30), "the survivor", || survivor
            .try_wait())
        .success()
    );
    assert!(eventually(Duration::from_secs(5), || daemon
        .zombies()
        .is_empty()));
}

/// Kill-on-close of a child's group reaches the group only while the
/// child still leads it: a child that moved to another group is
/// signalled alone, and neither the group it left nor the one it joined
/// is.
#[test]
fn a_child_that_left_its_group_is_killed_on_close_alone() {
    let daemon = start_daemon("kill-on-close-left-group");
    let leaving = Client::connect(daemon.socket()).expect("connect");
    // A sleep stays in the child's group; a perl makes a group of its own,
    // which the child (exec'd into perl) then joins.
    let script = "sleep 30 & perl -e 'setpgrp(0, 0); sleep 30' & other=$!; \
        exec perl -e 'my $g = shift; \
            select(undef, undef, undef, 0.01) until getpgrp($g) == $g; \
            setpgrp(0, $g) or die \"setpgrp: $!\"; sleep 30' $other";
    let child = Command::new(&leaving, "/bin/sh")
        .args(["-c", script])
        .process_group(0)
        .kill_process_group_on_close(libc::SIGKILL)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let pgid_of = |pid: u32| -> Option<u32> { stat_fields(pid)?.get(2)?.parse().ok() };
    let mut joined = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            joined = pgid_of(pid).filter(|&pgid| pgid != pid);
            joined.is_some() && group_members(pid).len() == 1
        }),
        "the child never moved to the other group: {:?}, its group {:?}",
        pgid_of(pid),
        group_members(pid)
    );
    let joined = joined.expect("the group it joined");
    let left_behind = group_members(pid);
    drop(child);
    drop(leaving);
    assert!(eventually(Duration::from_secs(5), || dead(pid)));
    // The group signal, had it been sent, goes out before the child's own.
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        left_behind.iter().all(|&member| !dead(member)),
        "the group the child left was signalled: {left_behind:?}"
    );
    assert!(!dead(joined), "the group the child joined was signalled");
    for member in left_behind.into_iter().chain([joined]) {
        sigkill(member);
    }
}

#[test]
fn daemon_shutdown_closes_connections_with_their_kill_on_close() {
    let mut daemon = start_daemon("shutdown");
    let client = Client::connect(daemon.socket()).expect("connect");
    let doomed = sleep_killed_on_close(&client, libc::SIGKILL);
    let kept = Command::new(&client, "sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // The first SIGTERM starts a graceful stop, which waits for the
    // children of connected clients; the second ends it at once, closing
    // every connection as a leaving client would.
    let pid = rustix::process::Pid::from_raw(daemon.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !dead(doomed.id()),
        "a graceful stop leaves connected clients' children alone"
    );
    assert!(daemon.terminate().success());
    assert!(eventually(Duration::from_secs(5), || dead(doomed.id())));
    // Children outlive a stopped daemon by default, as the README says.
    assert!(!dead(kept.id()));
    rustix::process::pidfd_send_signal(kept.pidfd(), rustix::process::Signal::KILL).unwrap();
}

#[test]
fn stop_timeout_ends_a_stop_that_a_client_holds_up() {
    let mut daemon = start_daemon_with("stop-timeout", None, &["--stop-timeout", "2"]);
    let client = Client::connect(daemon.socket()).expect("connect");
    let doomed = sleep_killed_on_close(&client, libc::SIGKILL);
    let started = Instant::now();
    daemon.start_stop();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !dead(doomed.id()) && daemon.is_alive(),
        "the graceful stop waits for the connected client's child"
    );
    // One signal only: the deadline ends the stop as a second one would.
    assert!(eventually(Duration::from_secs(5), || dead(doomed.id())));
    assert!(eventually(Duration::from_secs(5), || !daemon.is_alive()));
    assert!(started.elapsed() >= Duration::from_secs(2));
}

#[test]
fn kill_on_drop_kills_when_the_child_handle_is_dropped() {
    let daemon = start_daemon("kill-on-drop");
    let client = Client::connect(daemon.socket()).expect("connect");
    let child = Command::new(&client, "sleep")
        .arg("30")
        .kill_on_drop(true)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    drop(child);
    assert!(eventually(Duration::from_secs(5), || dead(pid)));
    // The connection is still fine.
    assert!(Command::new(&client, "true").status().unwrap().success());
}

#[test]
fn timeout_sends_sigterm_and_reports_it() {
    let daemon = start_daemon("timeout");
    let client = Client::connect(daemon.socket()).expect("connect");
    let status = Command::new(&client, "sleep")
        .arg("30")
        .timeout(Duration::from_millis(200))
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert!(status.timed_out());
    // A child that finishes in time is not marked.
    let status = Command::new(&client, "true")
        .timeout(Duration::from_secs(30))
        .status()
        .unwrap();
    assert!(status.success() && !status.timed_out());
}

/// A shell that starts `sleep 30` in the background and waits, with a
/// 1 s timeout (room for a loaded machine to start the shell), in a process group of its own when `own_group`; returns
/// it and the background sleep's pid.
fn shell_with_a_background_child(
    client: &Client,
    own_group: bool,
) -> (zygote_client::blocking::Child, u32) {
    let mut command = Command::new(client, "/bin/sh");
    command
        .args(["-c", "sleep 30 & echo $!; wait"])
        .timeout(Duration::from_secs(1))
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if own_group {
        command.process_group(0);
    }
    let mut child = command.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().parse().expect("the background pid"))
}

fn sigkill(pid: u32) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
}

#[test]
fn timeout_of_a_group_leader_ends_its_whole_group() {
    let daemon = start_daemon("timeout-group");
    let client = Client::connect(daemon.socket()).expect("connect");
    let (mut leader, background) = shell_with_a_background_child(&client, true);
    let status = exit_within(Duration::from_secs(30), "the leader", || leader.try_wait());
    assert!(status.timed_out());
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert!(
        eventually(Duration::from_secs(5), || dead(background)),
        "the leader's background child outlived the timeout"
    );
    assert!(group_members(leader.id()).is_empty());

    // Without a group of its own, only the child is signalled.
    let (mut child, background) = shell_with_a_background_child(&client, false);
    assert!(exit_within(Duration::from_secs(30), "the child", || child.try_wait()).timed_out());
    assert!(
        !dead(background),
        "a child outside a group of its own is signalled alone"
    );
    sigkill(background);
}

/// A daemon that is not root signals a root peer's group with its own
/// rights (it could not take root's): the whole group still ends.
#[test]
fn a_daemon_not_root_ends_the_group_of_a_root_peers_child() {
    if !root_or_skip("a daemon of another uid that root connects to") {
        return;
    }
    let daemon = start_daemon_as(
        "timeout-group-nobody",
        Some(65534),
        Some("[connect]\nany = true\n"),
        &["--socket-mode", "0666"],
    );
    let client = Client::connect(daemon.socket()).expect("connect");
    let (mut leader, background) = shell_with_a_background_child(&client, true);
    let status = exit_within(Duration::from_secs(30), "the leader", || leader.try_wait());
    assert!(status.timed_out());
    assert!(
        eventually(Duration::from_secs(5), || dead(background)),
        "the leader's background child outlived the timeout"
    );
}

#[test]
fn timeout_escalates_to_sigkill_when_sigterm_is_ignored() {
    let daemon = start_daemon("timeout-kill");
    let client = Client::connect(daemon.socket()).expect("connect");
    let status = Command::new(&client, "/bin/sh")
        .args(["-c", "trap '' TERM; exec sleep 30"])
        .timeout(Duration::from_millis(200))
        .timeout_grace(Duration::from_millis(300))
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(status.timed_out());
}

#[test]
fn timeout_leaves_the_grace_period_to_a_child_that_handles_sigterm() {
    let daemon = start_daemon("timeout-grace");
    let client = Client::connect(daemon.socket()).expect("connect");
    // The handler takes 300 ms, well within the grace period.
    let script = "sleep 30 & pid=$!; trap 'sleep 0.3; kill $pid; exit 7' TERM; wait";
    let status = Command::new(&client, "/bin/sh")
        .args(["-c", script])
        .timeout(Duration::from_millis(200))
        .timeout_grace(Duration::from_secs(20))
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7), "{status:?}");
    assert!(status.timed_out());
}

#[test]
fn client_sigkilled_mid_stream() {
    let daemon = start_daemon("client-killed");
    // Another client, untouched throughout.
    let steady = Client::connect(daemon.socket()).expect("connect");
    let mut bystander = Command::new(&steady, "sleep")
        .arg("1")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();

    let mut client = helper("fault", daemon.socket())
        .stdout(StdStdio::piped())
        .spawn()
        .expect("start the client process");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let pids = lines
        .find_map(|line| {
            let line = line.ok()?;
            line.strip_prefix("HELPER pids ").map(str::to_owned)
        })
        .expect("the client reports its children");
    let pids: Vec<u32> = pids.split(' ').map(|pid| pid.parse().unwrap()).collect();
    let (doomed, survivor) = (pids[0], pids[1]);
    client.kill().unwrap();
    client.wait().unwrap();

    assert!(eventually(Duration::from_secs(5), || dead(doomed)));
    assert!(!dead(survivor), "its other child lives on");
    // ... until it exits (after 3 s) and is reaped: no zombies, ever.
    assert!(eventually(Duration::from_secs(10), || {
        !children_of(daemon.pid()).contains(&survivor)
    }));
    assert!(
        exit_within(Duration::from_secs(30), "the bystander", || bystander
            .try_wait())
        .success()
    );
    assert!(daemon.zombies().is_empty());
}

#[test]
fn zygote_killed_leaves_the_pidfd_working() {
    let mut daemon = start_daemon("zygote-killed");
    let client = Client::connect(daemon.socket()).expect("connect");
    let mut child = Command::new(&client, "sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    daemon.kill();
    assert!(eventually(Duration::from_secs(5), || !client.is_connected()));
    // Running: no status yet, and no error (tests/lost.rs covers the
    // status read from the pidfd once it exits).
    assert!(matches!(child.try_wait(), Ok(None)));
    // The pidfd polls "not exited", then signals and polls "exited".
    let poll = |timeout: i32| {
        let pidfd = child.pidfd();
        let mut fds = [rustix::event::PollFd::new(
            &pidfd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: i64::from(timeout) * 1_000_000,
        };
        rustix::event::poll(&mut fds, Some(&timeout)).unwrap()
    };
    assert_eq!(poll(0), 0, "the child still runs");
    rustix::process::pidfd_send_signal(child.pidfd(), rustix::process::Signal::KILL).unwrap();
    assert!(eventually(Duration::from_secs(5), || poll(0) == 1));
}
