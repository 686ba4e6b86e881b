//! The security invariant and admission control against a real daemon:
//! peers of another uid, run-as policy, rlimits, and the limits that fail
//! fast with "busy".

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::Stdio as StdStdio;

use zygote_client::blocking::{Client, Command};
use zygote_client::{Error, ProtocolErrorKind, SpawnStage, Stdio};

use crate::helper::{findings, helper};
use crate::util::{
    connect_with_deadline, root_or_skip, start_daemon_as, start_daemon_with, start_daemon_wrapped,
    zygote_bin,
};

#[test]
fn root_zygote_runs_children_as_the_peer_and_refuses_more() {
    if !root_or_skip("a peer of another uid") {
        return;
    }
    let policy = "[[peer]]\nuids = [65534]\nrun_as_uids = [4321]\n";
    let daemon = start_daemon_with("other-uid", Some(policy), &["--socket-mode", "0666"]);
    let output = helper("other-uid", daemon.socket())
        .uid(65534)
        .gid(65534)
        .stdout(StdStdio::piped())
        .output()
        .expect("run helper as nobody");
    assert!(
        output.status.success(),
        "helper failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let found = findings(&output.stdout);
    // By default the child has exactly the peer's uid, gid and groups.
    assert!(
        found.contains(&"own 65534 65534 65534".to_owned()),
        "{found:?}"
    );
    // Root is refused by policy, before anything runs.
    let eperm = format!("root refused admission {}", libc::EPERM);
    assert!(found.contains(&eperm), "{found:?}");
    // The one uid the policy allows works (a set uid drops the groups).
    assert!(
        found.contains(&"allowed 4321 65534 65534".to_owned()),
        "{found:?}"
    );
    // Limits above the peer's own hard limit are refused.
    let rlimit = found
        .iter()
        .find(|line| line.starts_with("rlimit"))
        .expect("rlimit finding");
    assert!(
        rlimit.starts_with(&format!("rlimit refused {}", libc::EPERM)),
        "{rlimit}"
    );
    assert!(rlimit.contains("hard limit"), "{rlimit}");
    // Limits a request leaves unset are clamped to the peer's own.
    assert!(found.contains(&"unset-rlimit 200".to_owned()), "{found:?}");
}

#[test]
fn socket_mode_decides_who_may_connect_at_all() {
    if !root_or_skip("a peer of another uid") {
        return;
    }
    // Default mode 0600: nobody cannot even connect.
    let daemon = start_daemon_with("mode", None, &[]);
    let output = helper("other-uid", daemon.socket())
        .uid(65534)
        .gid(65534)
        .stdout(StdStdio::piped())
        .stderr(StdStdio::piped())
        .output()
        .expect("run helper as nobody");
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr) + String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("ermission denied"), "{text}");
}

#[test]
fn non_root_zygote_serves_only_its_uid_and_root_and_cannot_switch() {
    if !root_or_skip("a zygote of another uid") {
        return;
    }
    let daemon = start_daemon_as("non-root", Some(65534), None, &["--socket-mode", "0666"]);
    // Root may connect; its children run as the daemon, never as root.
    let client = Client::connect(daemon.socket()).expect("root connects");
    let output = Command::new(&client, "id")
        .arg("-u")
        .current_dir("/")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "65534");
    // Asking for root is passed to the kernel, which refuses it.
    match Command::new(&client, "true")
        .uid(0)
        .gid(0)
        .current_dir("/")
        .status()
    {
        Err(Error::Spawn { stage, errno, .. }) => {
            assert_eq!((stage, errno), (SpawnStage::Setgroups, libc::EPERM));
        }
        other => panic!("expected a setgroups failure, got {other:?}"),
    }
    // A third uid may not connect at all.
    let output = helper("other-uid", daemon.socket())
        .uid(4242)
        .gid(4242)
        .stdout(StdStdio::piped())
        .stderr(StdStdio::piped())
        .output()
        .expect("run helper as uid 4242");
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr) + String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("PermissionDenied"), "{text}");
    assert!(text.contains("uid 4242 may not use this zygote"), "{text}");
}

#[test]
fn children_per_peer_are_limited_and_refused_fast() {
    let policy = "[limits]\nmax_children_per_peer = 2\n";
    let daemon = start_daemon_with("per-peer", Some(policy), &[]);
    let client = Client::connect(daemon.socket()).expect("connect");
    let waiting = || {
        Command::new(&client, "/bin/sh")
            .args(["-c", "read line"])
            .stdin(Stdio::piped())
            .spawn()
    };
    let mut first = waiting().expect("first child");
    let _second = waiting().expect("second child");
    match waiting() {
        Err(Error::Spawn {
            stage: SpawnStage::Admission,
            errno,
            message,
            ..
        }) => {
            assert_eq!(errno, libc::EAGAIN);
            assert!(message.contains("busy"), "{message}");
        }
        other => panic!("expected a busy refusal, got {other:?}"),
    }
    // A slot frees when a child is reaped.
    first.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(first.wait().unwrap().success());
    let mut third = waiting().expect("a slot is free again");
    third.kill().unwrap();
}

#[test]
fn connections_over_the_limit_get_busy() {
    let policy = "[limits]\nmax_connections = 2\n";
    let daemon = start_daemon_with("connections", Some(policy), &[]);
    let first = Client::connect(daemon.socket()).expect("first");
    let _second = Client::connect(daemon.socket()).expect("second");
    match Client::connect(daemon.socket()) {
        Err(Error::Protocol { kind, message, .. }) => {
            assert_eq!(kind, ProtocolErrorKind::Busy);
            assert!(message.contains("busy"), "{message}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    // The others still work, and a closed connection frees its place.
    assert!(Command::new(&first, "true").status().unwrap().success());
    drop(first);
    assert!(crate::util::eventually(
        std::time::Duration::from_secs(5),
        || Client::connect(daemon.socket()).is_ok()
    ));
}

#[test]
fn policy_parse_errors_stop_the_daemon_with_path_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[limits]\nmax_children = -3\n").unwrap();
    let output = std::process::Command::new(crate::util::zygote_bin())
        .arg("serve")
        .arg("--socket")
        .arg(dir.path().join("z.sock"))
        .arg("--policy")
        .arg(&path)
        .output()
        .expect("run zygote serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.toml"), "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");
}

/// The daemon raises its own open-file soft limit to the hard one; a
/// request that sets no limits (a raw one: the client libraries send
/// their caller's) gets the soft limit the daemon started with, as a
/// child of its shell would, even when it sets another limit; one that
/// sets the open-file limit keeps its own.
#[test]
fn children_get_the_open_file_limit_the_daemon_started_with() {
    use std::os::fd::AsFd;
    use zygote_proto::{
        ClientMessage, Hello, PROTOCOL_VERSION, RECV_BUFFER_BYTES, ResourceLimit, ServerMessage,
        SpawnRequest, StdioSpec, decode, encode, recv_frame, send_frame,
    };
    let script = format!(
        "#!/bin/sh\nulimit -Sn 1000 && exec '{}' \"$@\"\n",
        zygote_bin().display()
    );
    let daemon = start_daemon_wrapped("child-nofile", &script);
    let fd = connect_with_deadline(daemon.socket(), std::time::Duration::from_secs(10));
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let hello = ClientMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "open-file limit test".into(),
    });
    send_frame(fd.as_fd(), &encode(&hello).unwrap(), &[]).expect("hello");
    recv_frame(fd.as_fd(), &mut scratch).expect("hello ack");
    // The socket listens before the daemon raises its limit; a hello is
    // answered only after.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", daemon.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|line| line.starts_with("Max open files"));
    assert!(
        !open_files.unwrap_or_default().contains(" 1000 "),
        "the daemon raised its own soft limit: {open_files:?}"
    );
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .expect("a finite hard limit");
    let limit = |resource, soft, hard| ResourceLimit {
        resource,
        soft,
        hard,
    };
    let cases = [
        (vec![], "1000"),
        (vec![limit(libc::RLIMIT_CORE, 0, 0)], "1000"),
        (vec![limit(libc::RLIMIT_NOFILE, 500, hard)], "500"),
    ];
    for (id, (rlimits, expected)) in (1u64..).zip(cases) {
        let request = SpawnRequest {
            args: vec![b"-c".to_vec(), b"ulimit -Sn".to_vec()],
            stdout: StdioSpec::Pipe,
            rlimits: rlimits.clone(),
            ..SpawnRequest::new(id, "/bin/sh")
        };
        let frame = encode(&ClientMessage::Spawn(request)).unwrap();
        send_frame(fd.as_fd(), &frame, &[]).expect("spawn");
        // Replies to earlier requests (their exits) may come first.
        let stdout = loop {
            let frame = recv_frame(fd.as_fd(), &mut scratch)
                .expect("recv")
                .expect("a reply");
            match decode(&frame.bytes).expect("decode") {
                ServerMessage::Spawned(spawned) if spawned.id == id => {
                    break frame.fds.into_iter().nth(1).expect("the stdout pipe");
                }
                ServerMessage::Exited(_) => {}
                other => panic!("request {id}: {other:?}"),
            }
        };
        let mut out = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(stdout), &mut out).unwrap();
        assert_eq!(out.trim(), expected, "rlimits {rlimits:?}");
    }
}

/// A daemon holding inheritable capabilities (a unit's
/// `AmbientCapabilities=` gives it some) passes none to the child of
/// another uid, on the spawner path and on the fork path: kept, they
/// would become a program's own through its file capabilities.
#[test]
fn a_child_of_another_uid_inherits_no_capability_from_the_daemon() {
    if !root_or_skip("a root daemon that holds inheritable capabilities") {
        return;
    }
    for (name, spawners) in [("inh-caps-spawner", "1"), ("inh-caps-fork", "0")] {
        let script = format!(
            "#!/bin/sh\nexport ZYGOTE_UID_SPAWNERS={spawners}\n\
             exec setpriv --inh-caps +net_raw {} \"$@\" --socket-mode 0666\n",
            zygote_bin().display()
        );
        let daemon = start_daemon_wrapped(name, &script);
        let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
        assert!(
            status.contains("CapInh:\t0000000000002000"),
            "the daemon holds it: {status}"
        );
        let output = crate::util::output_within(
            std::process::Command::new(zygote_bin())
                .args(["run", "--", "grep", "^CapInh:", "/proc/self/status"])
                .env("ZYGOTE_SOCKET", daemon.socket())
                .current_dir("/")
                .uid(65534)
                .gid(65534)
                .stdin(StdStdio::null())
                .stdout(StdStdio::piped())
                .stderr(StdStdio::piped())
                .spawn()
                .expect("start zygote run"),
            std::time::Duration::from_secs(30),
            "zygote run",
        );
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "CapInh:\t0000000000000000",
            "{name}: {output:?}"
        );
    }
}
