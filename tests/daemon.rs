use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::process::{Signal, pidfd_send_signal};
use tokio::io::AsyncWriteExt;
use zygote_client::{Client, Command, JobState, Sandbox, Stdio};
use zygote_proto::{
    ClientMessage, Hello, PROTOCOL_VERSION, ProtocolErrorKind, RECV_BUFFER_BYTES, ServerMessage,
    SpawnRequest, StatusReply, StatusRequest, StdioSpec, decode, encode, recv_frame, send_frame,
    socket,
};

use crate::sched::{SCHED_BATCH, SCHED_OTHER, thread_policies};
use crate::util::{
    Daemon, children_of, eventually, kernel_release, mask_in, process_state, runtime, signal_bit,
    skip, start_daemon, start_daemon_wrapped, thread_masks, within, zygote_bin,
};

/// Spawns `/bin/true` `count` times, `parallel` at a time, and waits for
/// every exit status.
fn churn(daemon: &Daemon, count: usize, parallel: usize) {
    churn_with(daemon, count, parallel, "/bin/true", &[]);
}

/// As [`churn`], running `program` with `args`; each must succeed.
fn churn_with(
    daemon: &Daemon,
    count: usize,
    parallel: usize,
    program: &'static str,
    args: &'static [&'static str],
) {
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let mut started = 0;
        while started < count {
            let batch = parallel.min(count - started);
            let tasks: Vec<_> = (0..batch)
                .map(|_| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        Command::new(&client, program)
                            .args(args)
                            .stdin(Stdio::null())
                            .stdout(Stdio::piped())
                            .stderr(Stdio::null())
                            .status()
                            .await
                    })
                })
                .collect();
            for task in tasks {
                let status = task.await.expect("task").expect("spawn and wait");
                assert!(status.success());
            }
            started += batch;
        }
    });
}

#[test]
fn daemon_fd_count_is_unchanged_after_1000_spawns_and_no_zombies() {
    let daemon = start_daemon("leaks");
    // Warm up: the runtime's worker threads and their stacks come first.
    churn(&daemon, 20, 10);
    let before = daemon.settled_fd_count();
    churn(&daemon, 1000, 16);
    assert!(
        eventually(Duration::from_secs(5), || daemon.fd_count() == before),
        "daemon fds: {before} before, {} after",
        daemon.fd_count()
    );
    assert!(
        eventually(Duration::from_secs(5), || daemon.zombies().is_empty()),
        "zombies: {:?}",
        daemon.zombies()
    );
}

/// A raw connection that has said hello.
fn raw_connection(daemon: &Daemon) -> std::os::fd::OwnedFd {
    let fd = socket::connect_to(daemon.socket(), false).expect("connect");
    let hello = ClientMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "raw test".into(),
    });
    send_frame(fd.as_fd(), &encode(&hello).unwrap(), &[]).expect("send hello");
    let reply = receive(&fd).expect("hello ack");
    assert!(matches!(reply, ServerMessage::HelloAck(_)), "{reply:?}");
    fd
}

fn receive(fd: &std::os::fd::OwnedFd) -> Option<ServerMessage> {
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let frame = recv_frame(fd.as_fd(), &mut scratch).expect("recv")?;
    Some(decode(&frame.bytes).expect("decode"))
}

/// The daemon's counters, through the protocol.
fn status(daemon: &Daemon) -> StatusReply {
    let fd = raw_connection(daemon);
    let request = ClientMessage::Status(StatusRequest { id: 1 });
    send_frame(fd.as_fd(), &encode(&request).unwrap(), &[]).expect("send status");
    match receive(&fd) {
        Some(ServerMessage::Status(status)) => status,
        other => panic!("expected a status reply, got {other:?}"),
    }
}

fn sleep_request(id: u64, seconds: &str) -> ClientMessage {
    ClientMessage::Spawn(SpawnRequest {
        args: vec![seconds.as_bytes().to_vec()],
        stdout: StdioSpec::Pipe,
        ..SpawnRequest::new(id, "/bin/sleep")
    })
}

#[test]
fn client_that_disconnects_mid_spawn_leaves_the_daemon_serving() {
    let mut daemon = start_daemon("disconnect");
    churn(&daemon, 5, 5);
    let before = daemon.settled_fd_count();
    for id in 0..20 {
        let fd = raw_connection(&daemon);
        let request = encode(&sleep_request(id, "0.2")).unwrap();
        send_frame(fd.as_fd(), &request, &[]).expect("send spawn");
        drop(fd); // gone before the reply
    }
    // The children still ran and were reaped; the daemon's fds are back.
    let settled = eventually(Duration::from_secs(10), || {
        let status = status(&daemon);
        status.spawns_succeeded == 25 && status.children_running == 0
    });
    assert!(settled, "{:?}", status(&daemon));
    assert!(children_of(daemon.pid()).is_empty());
    assert!(
        eventually(Duration::from_secs(5), || daemon.fd_count() == before),
        "daemon fds: {before} before, {} after",
        daemon.fd_count()
    );
    assert!(daemon.is_alive());
    churn(&daemon, 5, 5);
}

#[test]
fn other_clients_children_survive_a_client_leaving() {
    let daemon = start_daemon("isolation");
    runtime().block_on(async {
        let steady = Client::connect(daemon.socket()).await.expect("connect");
        let mut child = Command::new(&steady, "sleep")
            .arg("1")
            .spawn()
            .await
            .expect("sleep");
        let leaving = Client::connect(daemon.socket()).await.expect("connect");
        let _orphan = Command::new(&leaving, "sleep")
            .arg("0.5")
            .spawn()
            .await
            .expect("sleep");
        drop(leaving);
        assert!(
            within(Duration::from_secs(60), "wait", child.wait())
                .await
                .expect("wait")
                .success()
        );
    });
}

#[test]
fn protocol_errors_close_only_that_connection() {
    let daemon = start_daemon("protocol");
    // Garbage instead of a hello.
    let fd = socket::connect_to(daemon.socket(), false).expect("connect");
    send_frame(
        fd.as_fd(),
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        &[],
    )
    .unwrap();
    match receive(&fd) {
        Some(ServerMessage::ProtocolError(error)) => {
            assert_eq!(error.kind, ProtocolErrorKind::Malformed)
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert!(receive(&fd).is_none(), "connection closed after the error");

    // A protocol version older than any released (a newer one is answered
    // in the newest both know).
    let fd = socket::connect_to(daemon.socket(), false).expect("connect");
    let hello = ClientMessage::Hello(Hello {
        protocol_version: 0,
        client: "ancient".into(),
    });
    send_frame(fd.as_fd(), &encode(&hello).unwrap(), &[]).unwrap();
    match receive(&fd) {
        Some(ServerMessage::ProtocolError(error)) => {
            assert_eq!(error.kind, ProtocolErrorKind::UnsupportedVersion);
            assert!(error.message.contains("version"), "{}", error.message);
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }

    // A request before the handshake.
    let fd = socket::connect_to(daemon.socket(), false).expect("connect");
    send_frame(fd.as_fd(), &encode(&sleep_request(1, "0")).unwrap(), &[]).unwrap();
    match receive(&fd) {
        Some(ServerMessage::ProtocolError(error)) => {
            assert_eq!(error.kind, ProtocolErrorKind::UnexpectedMessage)
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }

    // The daemon still serves.
    churn(&daemon, 3, 3);
}

/// `flags:` of `/proc/PID/fdinfo/FD`, in octal as the kernel prints it.
fn fd_flags(pid: u32, fd: i32) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    let flags = info.lines().find_map(|line| line.strip_prefix("flags:"))?;
    u32::from_str_radix(flags.trim(), 8).ok()
}

#[test]
fn every_daemon_fd_beyond_stdio_is_close_on_exec() {
    let daemon = start_daemon("cloexec");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        // A child running and a connection open, so that their fds exist.
        let mut child = Command::new(&client, "sleep")
            .arg("30")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .await
            .expect("sleep");
        let fds = crate::util::open_fds(daemon.pid());
        assert!(fds.len() > 3, "{fds:?}");
        for fd in fds.into_iter().filter(|fd| *fd > 2) {
            // The fd may close between listing and reading; skip it then.
            if let Some(flags) = fd_flags(daemon.pid(), fd) {
                assert_ne!(
                    flags & libc::O_CLOEXEC as u32,
                    0,
                    "daemon fd {fd} is not close-on-exec (flags {flags:o})"
                );
            }
        }
        child.kill().await.expect("kill");
    });
}

/// A socket path under a file says which part is not a directory, not
/// `create_dir_all`'s bare "File exists".
#[test]
fn socket_path_under_a_file_names_the_file() {
    let output = std::process::Command::new(crate::util::zygote_bin())
        .args(["serve", "--socket", "/dev/null/zygote.sock"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run zygote serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/dev/null/zygote.sock: /dev/null is not a directory"),
        "{stderr}"
    );
}

/// Orphans (grandchildren whose parent exited) come to the daemon, a child
/// subreaper, and are reaped even when they exit together with the
/// daemon's own children: the orphan reaper looks at one exited child per
/// `SIGCHLD`, and a rescan finds orphans queued behind one of its own.
#[test]
fn orphans_exiting_among_own_children_are_all_reaped() {
    let daemon = start_daemon("orphans");
    // The subshell exits at once: its sleep is orphaned and exits when the
    // child does.
    churn_with(
        &daemon,
        100,
        20,
        "/bin/sh",
        &["-c", "(sleep 0.1 &); sleep 0.1"],
    );
    assert!(
        eventually(Duration::from_secs(5), || daemon.zombies().is_empty()),
        "zombies left: {:?}",
        daemon.zombies()
    );
}

/// The daemon is a child subreaper: a child's orphaned grandchild is
/// re-parented to the daemon, not to an init above it, and the daemon
/// reaps it when it exits.
#[test]
fn an_orphaned_grandchild_is_the_daemons_to_reap() {
    let daemon = start_daemon("subreaper");
    let grandchild: u32 = runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let output = Command::new(&client, "/bin/sh")
            .args(["-c", "sleep 30 >/dev/null 2>&1 & echo $!"])
            .output()
            .await
            .expect("sh runs");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("the grandchild's pid")
    });
    let parent = || {
        let status = std::fs::read_to_string(format!("/proc/{grandchild}/status")).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("PPid:"))
            .and_then(|ppid| ppid.trim().parse::<u32>().ok())
    };
    let adopted = eventually(Duration::from_secs(5), || parent() == Some(daemon.pid()));
    let pid = rustix::process::Pid::from_raw(i32::try_from(grandchild).unwrap()).unwrap();
    let _ = rustix::process::kill_process(pid, Signal::KILL);
    assert!(
        adopted,
        "the orphan's parent is {:?}, not the daemon",
        parent()
    );
    assert!(
        eventually(Duration::from_secs(5), || process_state(grandchild)
            .is_none()),
        "the orphan was left {:?}",
        process_state(grandchild)
    );
}

/// The daemon reads `SIGCHLD` from a signalfd: every thread blocks it, no
/// handler is installed for it, and a signalfd is open. Its children
/// start with nothing blocked all the same, on the vfork path and (as
/// root, asking for another uid) from that uid's spawner process.
#[test]
fn sigchld_is_blocked_in_every_daemon_thread_and_in_no_child() {
    let daemon = start_daemon("sigchld-mask");
    let sigchld = signal_bit(libc::SIGCHLD);
    let child_masks = |uid: Option<u32>| -> String {
        runtime().block_on(async {
            let client = Client::connect(daemon.socket()).await.expect("connect");
            let mut command = Command::new(&client, "grep");
            command.args(["-E", "^Sig(Blk|Pnd)", "/proc/self/status"]);
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
            let output = command.output().await.expect("grep runs");
            assert!(output.status.success(), "{output:?}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        })
    };
    let vforked = child_masks(None);
    assert_eq!(mask_in(&vforked, "SigBlk"), Some(0), "{vforked}");
    assert_eq!(mask_in(&vforked, "SigPnd"), Some(0), "{vforked}");
    if crate::util::root_or_skip("the spawner's child's mask (a child of another uid)") {
        let switched = child_masks(Some(4321));
        assert_eq!(
            mask_in(&switched, "SigBlk"),
            Some(0),
            "spawner path: {switched}"
        );
        assert_eq!(
            daemon.spawners().len(),
            1,
            "started by the spawner of uid 4321"
        );
    }
    // After spawns, so that every worker thread exists.
    let blocked = thread_masks(daemon.pid(), "SigBlk");
    assert!(blocked.len() > 1, "threads: {blocked:?}");
    let taking: Vec<_> = blocked
        .iter()
        .filter(|(_, mask)| mask & sigchld == 0)
        .collect();
    assert!(
        taking.is_empty(),
        "threads not blocking SIGCHLD: {taking:?}"
    );
    let caught = thread_masks(daemon.pid(), "SigCgt");
    assert!(
        caught.iter().all(|(_, mask)| mask & sigchld == 0),
        "a SIGCHLD handler is installed: {caught:?}"
    );
    let signalfds = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .expect("list the daemon's fds")
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter(|target| target.to_string_lossy() == "anon_inode:[signalfd]")
        .count();
    // One for SIGCHLD, one for the signals with no meaning to the daemon.
    assert_eq!(signalfds, 2, "the daemon's signalfds");
    let log = daemon.log();
    assert!(!log.contains("cannot block SIGCHLD"), "{log}");
}

/// While no request follows stops, the daemon leaves `SIGCHLD` pending
/// between looks; while one does, it reads it at once. Stops and continues
/// are still each reported, with other children exiting all the while
/// (their exits and the stops share the one pending `SIGCHLD`).
#[test]
fn stops_are_reported_while_other_children_exit() {
    let daemon = start_daemon("sigchld-stops");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        stops_reported_among_exits(&client).await;
    });
}

/// A stop reported before the caller takes `job_events()` is its first
/// event, not lost.
#[test]
fn a_stop_reported_before_job_events_are_taken_is_not_lost() {
    let daemon = start_daemon("stop-before-events");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let mut child = Command::new(&client, "sh")
            .args(["-c", "kill -STOP $$; exit 4"])
            .report_stops(true)
            .kill_on_drop(true)
            .spawn()
            .await
            .expect("spawn sh");
        let pid = child.id();
        assert!(
            eventually(Duration::from_secs(10), || process_state(pid) == Some('T')),
            "sh did not stop"
        );
        // Time for the daemon's report to reach the client first.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut jobs = child.job_events();
        let first = tokio::time::timeout(Duration::from_secs(10), jobs.changed()).await;
        assert_eq!(first, Ok(Some(JobState::Stopped(libc::SIGSTOP))));
        pidfd_send_signal(child.pidfd(), Signal::CONT).expect("SIGCONT");
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("sh exits")
            .expect("wait");
        assert_eq!(status.code(), Some(4));
    });
}

/// Twenty rounds of: a child stops, is continued and exits, each
/// reported, while other children keep exiting.
pub async fn stops_reported_among_exits(client: &Client) {
    let liveness = Duration::from_secs(10);
    let churning = Arc::new(AtomicBool::new(true));
    let churn = tokio::spawn({
        let (client, churning) = (client.clone(), Arc::clone(&churning));
        async move {
            let mut exits = 0u32;
            while churning.load(Ordering::Relaxed) {
                let status = Command::new(&client, "true").status().await;
                assert!(status.expect("true runs").success());
                exits += 1;
            }
            exits
        }
    });
    for round in 0..20 {
        let mut child = Command::new(client, "sh")
            // Stops when told to, exits when its stdin closes.
            .args(["-c", "read _; kill -STOP $$; read _; exit 3"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .report_stops(true)
            .kill_on_drop(true)
            .spawn()
            .await
            .expect("spawn sh");
        let mut jobs = child.job_events();
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"stop\n").await.expect("tell sh to stop");
        let stopped = tokio::time::timeout(liveness, jobs.changed()).await;
        assert_eq!(
            stopped,
            Ok(Some(JobState::Stopped(libc::SIGSTOP))),
            "round {round}: no stop report"
        );
        pidfd_send_signal(child.pidfd(), Signal::CONT).expect("SIGCONT");
        let continued = tokio::time::timeout(liveness, jobs.changed()).await;
        assert_eq!(
            continued,
            Ok(Some(JobState::Running)),
            "round {round}: no continue report"
        );
        drop(stdin);
        let status = tokio::time::timeout(liveness, child.wait())
            .await
            .expect("sh exits")
            .expect("wait");
        assert_eq!(status.code(), Some(3), "round {round}");
    }
    churning.store(false, Ordering::Relaxed);
    let exits = churn.await.expect("churn");
    assert!(exits > 0, "no child exited among the stops");
}

/// A daemon started with `SIGCHLD` ignored (inherited across exec) gives
/// it back its default action: ignored, the kernel would reap each child
/// at exit, and its exit status would be lost.
#[test]
fn a_daemon_started_with_sigchld_ignored_still_reports_exits() {
    // perl-base is essential on Debian: ignore SIGCHLD, exec the daemon.
    let script = format!(
        "#!/usr/bin/perl\n$SIG{{CHLD}} = 'IGNORE';\nexec {{ '{}' }} 'zygote', @ARGV or die \"exec: $!\";\n",
        zygote_bin().display()
    );
    let daemon = start_daemon_wrapped("sigchld-ignored", &script);
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid()))
        .expect("the daemon's status");
    assert_eq!(
        mask_in(&status, "SigIgn").map(|mask| mask & signal_bit(libc::SIGCHLD)),
        Some(0),
        "{status}"
    );
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let status = Command::new(&client, "sh")
            .args(["-c", "exit 7"])
            .status()
            .await
            .expect("sh runs");
        assert_eq!(status.code(), Some(7));
    });
}

/// An fd the daemon's parent left open without close-on-exec is marked
/// close-on-exec as the daemon starts, so that nothing the daemon execs
/// (spawners, templates, its own upgrade) can inherit it.
#[test]
fn fds_the_daemon_inherits_are_made_close_on_exec() {
    const INHERITED: i32 = 9;
    let script = format!(
        "#!/bin/sh\nexec {INHERITED}</dev/null\nexec '{}' \"$@\"\n",
        zygote_bin().display()
    );
    let daemon = start_daemon_wrapped("inherited-fd", &script);
    let fdinfo = std::fs::read_to_string(format!("/proc/{}/fdinfo/{INHERITED}", daemon.pid()))
        .expect("the daemon still holds the inherited fd");
    let flags = fdinfo
        .lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .and_then(|flags| u32::from_str_radix(flags.trim(), 8).ok())
        .expect("the fd's flags");
    let cloexec = u32::try_from(libc::O_CLOEXEC).expect("O_CLOEXEC");
    assert_ne!(
        flags & cloexec,
        0,
        "fd {INHERITED} is inheritable: {fdinfo}"
    );
    let log = daemon.log();
    assert!(!log.contains("could not mark inherited fds"), "{log}");
}

/// On Linux 6.5 and later the daemon knows each peer by the pidfd its
/// socket gives (`SO_PEERPIDFD`), with no pid-reuse window, and does not
/// fall back to `pidfd_open`.
#[test]
fn peers_are_known_by_the_pidfd_their_socket_gives() {
    let (release, version) = kernel_release();
    if version < (6, 5) {
        skip(&format!("kernel {release} predates SO_PEERPIDFD (6.5)"));
        return;
    }
    let daemon = start_daemon("peer-pidfd");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let status = Command::new(&client, "true").status().await.expect("true");
        assert!(status.success());
    });
    let log = daemon.log();
    assert!(!log.contains("SO_PEERPIDFD"), "{log}");
}

/// On a kernel without a call it needs, the daemon refuses to start and
/// names the call and the Linux version that brings it. A seccomp filter
/// makes each call fail with `ENOSYS`, as an older kernel would.
#[test]
fn a_daemon_on_a_kernel_without_a_call_it_needs_names_it_and_exits() {
    let daemon = start_daemon("kernel-support");
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        for (call, version) in [("close_range", "5.9"), ("pidfd_open", "5.3")] {
            let socket = dir.path().join(format!("{call}.sock"));
            let filter = format!("action errno ENOSYS\n{call}\n");
            let output = Command::new(&client, zygote_bin())
                .arg("serve")
                .arg("--socket")
                .arg(&socket)
                .sandbox(Sandbox::new().seccomp_filter(filter))
                .timeout(Duration::from_secs(20))
                .stdin(Stdio::null())
                .output()
                .await
                .expect("zygote serve runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !output.status.success() && !output.status.timed_out(),
                "{call}: {:?}\n{stderr}",
                output.status
            );
            let named = format!("does not provide {call}(2), which zygote needs; Linux {version}");
            assert!(stderr.contains(&named), "{call}: {stderr}");
        }
    });
}

/// While children run, the shared daemon clones on its spawner threads
/// (`daemon::spawners`), first come first served: each of 64 spawns made
/// at once still gets its own child, output and exit status.
#[test]
fn spawns_made_at_once_while_children_run_each_get_their_own_child() {
    let daemon = start_daemon("spawner-threads");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        // Two children that outlive the burst: the daemon is busy from here.
        let mut sleepers = Vec::new();
        for _ in 0..2 {
            let sleeper = Command::new(&client, "sleep")
                .arg("30")
                .kill_on_drop(true)
                .spawn()
                .await
                .expect("spawn sleep");
            sleepers.push(sleeper);
        }
        let tasks: Vec<_> = (0..64u8)
            .map(|n| {
                let client = client.clone();
                tokio::spawn(async move {
                    // Its number, then its scheduling policy (field 41).
                    let script = format!("echo {n}; cut -d' ' -f41 /proc/self/stat; exit {n}");
                    let output = Command::new(&client, "sh")
                        .args(["-c", &script])
                        .output()
                        .await
                        .expect("spawn sh");
                    (n, output)
                })
            })
            .collect();
        for task in tasks {
            let (n, output) = task.await.expect("task");
            assert_eq!(output.status.code(), Some(i32::from(n)), "spawn {n}");
            assert_eq!(
                String::from_utf8_lossy(&output.stdout),
                format!("{n}\n{SCHED_OTHER}\n"),
                "spawn {n}: its own output, and SCHED_OTHER"
            );
        }
        drop(sleepers);
    });
    // Their SIGCHLD is blocked, as in every daemon thread (see `reaper`),
    // and they run under SCHED_BATCH, as every daemon thread does.
    let spawner_tasks: Vec<_> = std::fs::read_dir(format!("/proc/{}/task", daemon.pid()))
        .expect("list the daemon's threads")
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with("zygote-spawner"))
        })
        .collect();
    let spawners: Vec<u64> = spawner_tasks
        .iter()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .filter_map(|status| mask_in(&status, "SigBlk"))
        .collect();
    let policies: Vec<u32> = spawner_tasks
        .iter()
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .filter_map(|tid: u32| {
            thread_policies(daemon.pid())
                .into_iter()
                .find(|(id, _)| *id == tid)
        })
        .map(|(_, policy)| policy)
        .collect();
    assert!(
        policies.iter().all(|policy| *policy == SCHED_BATCH),
        "spawner threads' policies: {policies:?}"
    );
    assert!(
        !spawners.is_empty(),
        "no spawner thread: the burst was cloned on the runtime's workers"
    );
    let sigchld = signal_bit(libc::SIGCHLD);
    assert!(
        spawners.iter().all(|mask| mask & sigchld != 0),
        "a spawner thread takes SIGCHLD: {spawners:x?}"
    );
}
