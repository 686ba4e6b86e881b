//! Private zygotes: a program grown to 2 GiB spawns through each mode; its
//! children's parent is the zygote; killing the program ends the zygote.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::{
    children_of, eventually, parent_of, process_state, signal_bit, stat_fields, thread_masks,
    zygote_bin,
};

const HELPER: &str = env!("CARGO_BIN_EXE_zygote-private-helper");

/// What the helper reported.
struct Report {
    rss_kib: u64,
    child: u32,
    ppid_seen: u32,
    sleeper: u32,
    child_nice: i32,
    child_policy: u64,
    child_sigblk: String,
}

fn parse(line: &str) -> Report {
    let words: Vec<&str> = line.split_whitespace().collect();
    let field = |name: &str| -> u64 {
        let at = words.iter().position(|w| *w == name).expect(name);
        words[at + 1].parse().expect(name)
    };
    Report {
        rss_kib: field("rss_kib"),
        child: u32::try_from(field("child")).unwrap(),
        ppid_seen: u32::try_from(field("ppid_seen")).unwrap(),
        sleeper: u32::try_from(field("sleeper")).unwrap(),
        child_nice: words
            .iter()
            .position(|w| *w == "child_nice")
            .and_then(|at| words.get(at + 1)?.parse().ok())
            .expect("child_nice"),
        child_policy: field("child_policy"),
        child_sigblk: words
            .iter()
            .position(|w| *w == "child_sigblk")
            .and_then(|at| words.get(at + 1))
            .map(|mask| (*mask).to_owned())
            .expect("child_sigblk"),
    }
}

fn gone(pid: u32) -> bool {
    matches!(process_state(pid), None | Some('Z'))
}

/// Starts the helper (its zygote's log at WARN) and reads its report line.
fn start_helper(command: &mut Command, mode: &str) -> (std::process::Child, Report) {
    let mut helper = command
        .env("ZYGOTE_BIN", zygote_bin())
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the helper");
    let mut line = String::new();
    BufReader::new(helper.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read the helper's report");
    assert!(!line.is_empty(), "the helper reported nothing ({mode})");
    (helper, parse(&line))
}

fn private_zygote_serves_a_large_owner(mode: &str) {
    let (mut helper, report) = start_helper(Command::new(HELPER).args([mode, "2"]), mode);
    assert!(
        report.rss_kib >= 2 << 20,
        "helper RSS {} KiB is under 2 GiB",
        report.rss_kib
    );

    let helper_pid = helper.id();
    let zygotes = children_of(helper_pid);
    assert_eq!(zygotes.len(), 1, "helper's children: {zygotes:?}");
    let zygote = zygotes[0];
    assert_eq!(parent_of(report.child), Some(zygote), "cat's parent");
    assert_eq!(report.ppid_seen, zygote, "$PPID seen by a child");
    assert_ne!(zygote, helper_pid);
    let leaked: Vec<String> = std::fs::read_dir(format!("/proc/{zygote}/fd"))
        .expect("list the zygote's fds")
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .map(|target| target.display().to_string())
        .filter(|target| target == "/dev/zero")
        .collect();
    assert!(
        leaked.is_empty(),
        "{mode} zygote kept the owner's fd: {leaked:?}"
    );
    // SIGCHLD is read from a signalfd: blocked in every thread of the
    // zygote, in none of its children.
    let sigchld = signal_bit(libc::SIGCHLD);
    let blocked = thread_masks(zygote, "SigBlk");
    assert!(
        !blocked.is_empty() && blocked.iter().all(|(_, mask)| mask & sigchld != 0),
        "{mode} zygote's threads' SigBlk: {blocked:?}"
    );
    assert_eq!(
        u64::from_str_radix(&report.child_sigblk, 16),
        Ok(0),
        "a child of the {mode} zygote starts with signals blocked"
    );
    // SIGHUP, SIGTERM and SIGINT, held while the zygote started, are
    // released in it; the owner's own mask is as it was (a template's
    // fork holds them only in the template).
    let stop = signal_bit(libc::SIGHUP) | signal_bit(libc::SIGTERM) | signal_bit(libc::SIGINT);
    let zygote_main = thread_masks(zygote, "SigBlk")
        .into_iter()
        .find(|(tid, _)| *tid == zygote);
    assert!(
        zygote_main.is_some_and(|(_, mask)| mask & stop == 0),
        "{mode} zygote's main thread SigBlk: {zygote_main:?}"
    );
    let owner = thread_masks(helper_pid, "SigBlk");
    assert!(
        !owner.is_empty() && owner.iter().all(|(_, mask)| mask & stop == 0),
        "the owner's ({mode}) threads' SigBlk: {owner:?}"
    );
    // The zygote runs under SCHED_BATCH while idle; its children never.
    assert_eq!(
        report.child_policy, 0,
        "a child of the {mode} zygote starts under SCHED_OTHER"
    );

    helper.kill().expect("SIGKILL the helper");
    helper.wait().expect("reap the helper");
    // The owner's end closes with it: cat sees EOF, the zygote reaps it,
    // waits for the sleeper (~3 s more) and reaps it too, then exits.
    assert!(
        eventually(Duration::from_secs(15), || gone(zygote)),
        "{mode} zygote {zygote} still runs 15 s after its owner died"
    );
    assert!(
        gone(report.child),
        "cat {} outlived its zygote",
        report.child
    );
    assert!(
        gone(report.sleeper),
        "the zygote exited before reaping sleep {} (now a child of {:?})",
        report.sleeper,
        parent_of(report.sleeper)
    );
}

#[test]
fn launched_private_zygote_serves_a_2gib_owner_and_exits_with_it() {
    private_zygote_serves_a_large_owner("launched");
}

#[test]
fn forked_template_serves_a_2gib_owner_and_exits_with_it() {
    private_zygote_serves_a_large_owner("template");
}

#[test]
fn fork_template_refuses_once_threads_exist() {
    // The test harness runs this on a thread of its own: always too late.
    let error = zygote::template::fork_template().expect_err("must refuse");
    assert!(
        matches!(error, zygote::Error::TemplateTooLate { threads } if threads > 1),
        "{error:?}"
    );
    assert!(error.to_string().contains("first in main"), "{error}");
}

#[test]
fn private_fd_that_is_not_a_socket_is_refused() {
    let output = Command::new(zygote_bin())
        .args(["serve", "--private-fd", "0"])
        .env("ZYGOTE_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .expect("run zygote serve --private-fd");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("private zygote's socket") && stderr.contains("non-socket"),
        "{stderr}"
    );
}

/// A private zygote raises its spawner to nice -10 (root only) while two
/// or more children run, so that at high concurrency its children cannot
/// starve it; its children still run at their owner's nice value, not at
/// -10. The helper starts `sh` while `cat` and `sleep` run.
fn private_zygote_outranks_its_children(mode: &str) {
    if !crate::util::root_or_skip(&format!(
        "raising the {mode} zygote's priority (CAP_SYS_NICE)"
    )) {
        return;
    }
    let (mut helper, report) = start_helper(
        Command::new("nice").args(["-n", "3", HELPER, mode, "0"]),
        mode,
    );
    let nice_of = |pid: u32| -> Option<i32> { stat_fields(pid)?.get(16)?.parse().ok() };
    assert_eq!(nice_of(helper.id()), Some(3), "the owner runs at nice 3");
    assert_eq!(
        nice_of(report.ppid_seen),
        Some(-10),
        "the {mode} zygote's spawner is raised while busy"
    );
    assert_eq!(
        report.child_nice, 3,
        "a child of the {mode} zygote runs at its owner's nice, not the zygote's"
    );
    // SCHED_BATCH while idle, SCHED_OTHER while busy (field 41: policy).
    let policy_of = |pid: u32| -> Option<u32> { stat_fields(pid)?.get(38)?.parse().ok() };
    assert_eq!(
        policy_of(report.ppid_seen),
        Some(0),
        "the busy {mode} zygote's spawner runs under SCHED_OTHER"
    );
    helper.kill().expect("SIGKILL the helper");
    helper.wait().expect("reap the helper");
    // Its owner gone, the private zygote ends too (it holds only the
    // owner's socket).
    let zygote = report.ppid_seen;
    assert!(
        eventually(Duration::from_secs(10), || gone(zygote)),
        "the {mode} zygote {zygote} outlived its owner"
    );
}

#[test]
fn launched_private_zygote_outranks_its_children_who_keep_the_owners_nice() {
    private_zygote_outranks_its_children("launched");
}

#[test]
fn forked_template_outranks_its_children_who_keep_the_owners_nice() {
    private_zygote_outranks_its_children("template");
}

/// A launched private zygote (`serve --private-fd`) reports stops while
/// other children exit. It is no subreaper: nothing reads SIGCHLD until a
/// request follows stops, so the first stop may find it long pending.
#[test]
fn private_zygote_reports_stops_among_exits() {
    let (ours, theirs) = zygote_proto::socket::pair(false).expect("socketpair");
    // As the client library launches one: the socket on its stdin.
    let zygote = Command::new(zygote_bin())
        .args(["serve", "--private-fd", "0"])
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .spawn()
        .expect("start a private zygote");
    let mut zygote = KillOnDrop(zygote);
    crate::util::runtime().block_on(async {
        let client = zygote_client::Client::from_fd(ours)
            .await
            .expect("connect to the private zygote");
        // Exits before anyone follows stops: SIGCHLD left pending.
        for _ in 0..3 {
            let status = zygote_client::Command::new(&client, "true")
                .status()
                .await
                .expect("true runs");
            assert!(status.success());
        }
        crate::daemon::stops_reported_among_exits(&client).await;
    });
    assert!(
        eventually(Duration::from_secs(10), || zygote
            .0
            .try_wait()
            .is_ok_and(|status| status.is_some())),
        "the private zygote outlived its owner's socket"
    );
}

/// Kills and reaps a process when dropped (a failed test's).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
