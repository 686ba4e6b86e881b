//! Hostile and broken input on the raw protocol. Each case checks that the
//! daemon answers with an error or closes only that connection, that fds
//! sent to it are closed (its fd count returns to where it was), and that
//! it keeps serving: another client's long-lived child survives and its
//! exit status is delivered, and a new client can spawn.

use std::io::Write;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
use zygote_client::Stdio;
use zygote_client::blocking::{Child, Client, Command};
use zygote_proto::{
    ClientMessage, EnvVar, FdMapping, Hello, PROTOCOL_VERSION, ProtocolErrorKind,
    RECV_BUFFER_BYTES, ServerMessage, SignalRequest, SpawnFailed, SpawnRequest, SpawnStage,
    StatusRequest, StdioSpec, UserSpec, decode, encode, recv_frame, send_frame,
};

use crate::tools::{free_port, http_get};
use crate::util::{Daemon, connect_with_deadline, eventually, start_daemon_with};

/// Another client with a child that waits for a line on stdin, then
/// exits 7: it must outlive whatever the hostile client does.
struct Bystander {
    client: Client,
    child: Child,
}

impl Bystander {
    fn start(daemon: &Daemon) -> Self {
        let client = Client::connect(daemon.socket()).expect("bystander connects");
        let child = Command::new(&client, "/bin/sh")
            .args(["-c", "read line; exit 7"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("bystander's child");
        Self { client, child }
    }

    /// Lets the child finish and checks its status arrives.
    fn finish(mut self) {
        let mut stdin = self.child.stdin.take().expect("stdin");
        stdin
            .write_all(b"done\n")
            .expect("write to bystander child");
        drop(stdin);
        let status = self.child.wait().expect("bystander's exit status");
        assert_eq!(status.code(), Some(7));
        assert!(
            Command::new(&self.client, "true")
                .status()
                .unwrap()
                .success()
        );
    }
}

/// Runs `attack` against a fresh daemon with a bystander, then checks the
/// daemon is alive, has closed every fd the attack left with it, and
/// still serves the bystander and new clients.
fn survives(name: &str, attack: impl FnOnce(&Daemon)) {
    survives_with(name, None, attack);
}

/// As [`survives`], with a policy file of this text.
fn survives_with(name: &str, policy: Option<&str>, attack: impl FnOnce(&Daemon)) {
    let mut daemon = start_daemon_with(name, policy, &[]);
    let bystander = Bystander::start(&daemon);
    let before = daemon.settled_fd_count();
    attack(&daemon);
    assert!(daemon.is_alive(), "the daemon died of {name}");
    // Less those of spawner processes the attack started (a spawn as
    // another uid): bounded, and stopped when idle.
    let after = daemon.settled_fd_count() - daemon.spawner_fds();
    assert_eq!(
        after, before,
        "daemon fds: {before} before {name}, {after} after (spawners' left out)"
    );
    bystander.finish();
    let fresh = Client::connect(daemon.socket()).expect("a new client connects");
    assert!(Command::new(&fresh, "true").status().unwrap().success());
}

/// A raw connection with a receive timeout, so a silent daemon fails the
/// test instead of hanging it.
fn connect(daemon: &Daemon) -> OwnedFd {
    connect_with_deadline(daemon.socket(), Duration::from_secs(10))
}

fn hello(fd: &OwnedFd) {
    let hello = ClientMessage::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "hostile test".into(),
    });
    send(fd, &encode(&hello).unwrap());
    assert!(matches!(receive(fd), Some(ServerMessage::HelloAck(_))));
}

fn send(fd: &OwnedFd, bytes: &[u8]) {
    send_frame(fd.as_fd(), bytes, &[]).expect("send");
}

fn receive(fd: &OwnedFd) -> Option<ServerMessage> {
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let frame = recv_frame(fd.as_fd(), &mut scratch).expect("recv (timed out?)")?;
    Some(decode(&frame.bytes).expect("decode the daemon's reply"))
}

/// Expects a protocol error of `kind`, then the end of the connection.
fn expect_closed_with(fd: &OwnedFd, kind: ProtocolErrorKind) {
    match receive(fd) {
        Some(ServerMessage::ProtocolError(error)) => {
            assert_eq!(error.kind, kind, "{}", error.message);
            assert!(!error.message.is_empty());
        }
        other => panic!("expected a {kind:?} protocol error, got {other:?}"),
    }
    assert!(receive(fd).is_none(), "the connection is closed after it");
}

fn expect_spawn_failed(fd: &OwnedFd, stage: SpawnStage, errno: i32) -> SpawnFailed {
    match receive(fd) {
        Some(ServerMessage::SpawnFailed(failed)) => {
            assert_eq!(
                (failed.stage, failed.errno),
                (stage, errno),
                "{}",
                failed.message
            );
            failed
        }
        other => panic!("expected SpawnFailed({stage:?}, {errno}), got {other:?}"),
    }
}

fn expect_request_failed(fd: &OwnedFd, id: u64, errno: i32) {
    match receive(fd) {
        Some(ServerMessage::RequestFailed(failed)) => {
            assert_eq!((failed.id, failed.errno), (id, errno), "{}", failed.message);
        }
        other => panic!("expected RequestFailed({id}, {errno}), got {other:?}"),
    }
}

fn request(id: u64, program: &str) -> SpawnRequest {
    SpawnRequest::new(id, program)
}

fn spawn_frame(request: SpawnRequest) -> Vec<u8> {
    encode(&ClientMessage::Spawn(request)).unwrap()
}

/// Sends `bytes` with `fds` with a plain `sendmsg`, beyond the protocol
/// crate's own frame and fd caps.
fn send_with_fds(fd: &OwnedFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(128))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    sendmsg(
        fd,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .expect("sendmsg with fds");
}

fn dev_nulls(count: usize) -> Vec<OwnedFd> {
    (0..count)
        .map(|_| std::fs::File::open("/dev/null").unwrap().into())
        .collect()
}

#[test]
fn truncated_frame() {
    survives("truncated", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        let mut frame = spawn_frame(request(1, "/bin/true"));
        frame.truncate(frame.len() / 2);
        send(&fd, &frame);
        expect_closed_with(&fd, ProtocolErrorKind::Malformed);
    });
}

#[test]
fn oversized_frame() {
    survives("oversized", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        // Room in our send buffer for one frame over the 256 KiB cap.
        rustix::net::sockopt::set_socket_send_buffer_size(&fd, 1 << 20).unwrap();
        let mut big = request(1, "/bin/true");
        big.env = vec![EnvVar {
            key: b"BIG".to_vec(),
            value: vec![b'x'; 300 * 1024],
        }]
        .into();
        // Past the protocol crate's own check, which refuses to send it.
        send_with_fds(&fd, &spawn_frame(big), &[]);
        expect_closed_with(&fd, ProtocolErrorKind::TooLarge);
        // And as the very first frame: an answer, not a silent close.
        let fd = connect(daemon);
        rustix::net::sockopt::set_socket_send_buffer_size(&fd, 1 << 20).unwrap();
        send_with_fds(&fd, &vec![0u8; 300 * 1024], &[]);
        expect_closed_with(&fd, ProtocolErrorKind::Malformed);
    });
}

#[test]
fn garbage_bytes() {
    survives("garbage", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        send(&fd, &[0xff; 64]);
        expect_closed_with(&fd, ProtocolErrorKind::Malformed);
        // And as the very first frame.
        let fd = connect(daemon);
        send(&fd, b"GET / HTTP/1.1\r\n\r\n");
        expect_closed_with(&fd, ProtocolErrorKind::Malformed);
    });
}

#[test]
fn wrong_protocol_version() {
    survives("version", |daemon| {
        let fd = connect(daemon);
        let hello = ClientMessage::Hello(Hello {
            protocol_version: 0,
            client: "from before version 1".into(),
        });
        send(&fd, &encode(&hello).unwrap());
        expect_closed_with(&fd, ProtocolErrorKind::UnsupportedVersion);
    });
}

#[test]
fn unknown_message_kind() {
    survives("unknown-kind", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        // Variant index 8: the first past the end of ClientMessage.
        send(&fd, &[8, 1, 2, 3]);
        expect_closed_with(&fd, ProtocolErrorKind::Malformed);
    });
}

#[test]
fn requests_before_the_handshake() {
    survives("before-hello", |daemon| {
        let fd = connect(daemon);
        send(&fd, &spawn_frame(request(1, "/bin/true")));
        expect_closed_naming(&fd, "received Spawn");
        let fd = connect(daemon);
        let status = ClientMessage::Status(StatusRequest { id: 1 });
        send(&fd, &encode(&status).unwrap());
        expect_closed_naming(&fd, "received Status");
    });
}

/// Expects an `UnexpectedMessage` error whose text holds `naming`, then
/// the end of the connection.
fn expect_closed_naming(fd: &OwnedFd, naming: &str) {
    match receive(fd) {
        Some(ServerMessage::ProtocolError(error)) => {
            assert_eq!(error.kind, ProtocolErrorKind::UnexpectedMessage);
            assert!(error.message.contains(naming), "{}", error.message);
        }
        other => panic!("expected an UnexpectedMessage protocol error, got {other:?}"),
    }
    assert!(receive(fd).is_none(), "the connection is closed after it");
}

/// A client that closes with replies still unread leaves the daemon a
/// reset connection: that is a client leaving, not a protocol error, and
/// is neither logged nor counted as one.
#[test]
fn a_client_leaving_with_replies_unread_is_no_protocol_error() {
    survives("leaves-unread", |daemon| {
        for id in 1..=3 {
            let fd = connect(daemon);
            hello(&fd);
            let status = ClientMessage::Status(StatusRequest { id });
            send(&fd, &encode(&status).unwrap());
            // The reply is in this socket's queue before it closes.
            let deadline = Duration::from_secs(10).try_into().expect("timespec");
            let ready = rustix::event::poll(
                &mut [rustix::event::PollFd::new(
                    &fd,
                    rustix::event::PollFlags::IN,
                )],
                Some(&deadline),
            )
            .expect("poll");
            assert_eq!(ready, 1, "no reply within 10 s");
            drop(fd);
        }
        // The daemon reads each reset before the bystander's next request.
        let client = Client::connect(daemon.socket()).expect("connect");
        assert!(Command::new(&client, "true").status().unwrap().success());
        let log = daemon.log();
        assert!(!log.contains("closing connection"), "{log}");
    });
}

#[test]
fn too_many_fds() {
    survives("too-many-fds", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        let fds = dev_nulls(100);
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        send_with_fds(&fd, &spawn_frame(request(1, "/bin/true")), &borrowed);
        expect_closed_with(&fd, ProtocolErrorKind::TooLarge);
    });
}

#[test]
fn fds_on_a_message_that_takes_none_are_closed() {
    survives("stray-fds", |daemon| {
        let fds = dev_nulls(10);
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        let fd = connect(daemon);
        hello(&fd);
        let status = ClientMessage::Status(StatusRequest { id: 1 });
        send_with_fds(&fd, &encode(&status).unwrap(), &borrowed);
        expect_closed_with(&fd, ProtocolErrorKind::UnexpectedFds);
        // On the hello too.
        let fd = connect(daemon);
        let hello = ClientMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: "fds".into(),
        });
        send_with_fds(&fd, &encode(&hello).unwrap(), &borrowed);
        expect_closed_with(&fd, ProtocolErrorKind::UnexpectedFds);
        // A spawn that does not use its fds is refused, and they are closed.
        let fd = connect(daemon);
        self::hello(&fd);
        send_with_fds(&fd, &spawn_frame(request(1, "/bin/true")), &borrowed);
        let failed = expect_spawn_failed(&fd, SpawnStage::Validate, libc::EINVAL);
        assert!(
            failed.message.contains("not referenced"),
            "{}",
            failed.message
        );
    });
}

#[test]
fn duplicate_request_ids_are_refused_not_overwritten() {
    survives("duplicate-ids", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        let mut slow = request(5, "/bin/sleep");
        slow.args = vec![b"0.3".to_vec()];
        send(&fd, &spawn_frame(slow.clone()));
        assert!(matches!(receive(&fd), Some(ServerMessage::Spawned(s)) if s.id == 5));
        send(&fd, &spawn_frame(request(5, "/bin/true")));
        let failed = expect_spawn_failed(&fd, SpawnStage::Validate, libc::EEXIST);
        assert!(
            failed.message.contains("already in use"),
            "{}",
            failed.message
        );
        // Nor may another kind of request take it: its reply would carry
        // the running spawn's id.
        let status = ClientMessage::Status(StatusRequest { id: 5 });
        send(&fd, &encode(&status).unwrap());
        expect_request_failed(&fd, 5, libc::EEXIST);
        let signal = ClientMessage::Signal(SignalRequest {
            id: 5,
            spawn_id: 5,
            signal: libc::SIGKILL,
        });
        send(&fd, &encode(&signal).unwrap());
        expect_request_failed(&fd, 5, libc::EEXIST);
        // The first spawn still owns id 5, unsignalled: its exit arrives
        // under it.
        match receive(&fd) {
            Some(ServerMessage::Exited(notice)) => {
                assert_eq!(notice.id, 5);
                assert_eq!(notice.status, zygote_proto::ExitStatus::Exited(0));
            }
            other => panic!("expected the first spawn's exit, got {other:?}"),
        }
        // Once its exit was sent, the id is free again.
        send(&fd, &spawn_frame(request(5, "/bin/true")));
        assert!(matches!(receive(&fd), Some(ServerMessage::Spawned(s)) if s.id == 5));
        assert!(matches!(receive(&fd), Some(ServerMessage::Exited(n)) if n.id == 5));
    });
}

#[test]
fn argv_with_interior_nul() {
    survives("nul", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        let mut bad = request(1, "/bin/echo");
        bad.args = vec![b"a\0b".to_vec()];
        let failed = expect_and_send(&fd, bad, SpawnStage::Validate, libc::EINVAL);
        assert!(failed.message.contains("NUL"), "{}", failed.message);
        let mut bad = request(2, "/bin/echo");
        bad.env = vec![EnvVar {
            key: b"K".to_vec(),
            value: b"v\0w".to_vec(),
        }]
        .into();
        expect_and_send(&fd, bad, SpawnStage::Validate, libc::EINVAL);
    });
}

fn expect_and_send(
    fd: &OwnedFd,
    request: SpawnRequest,
    stage: SpawnStage,
    errno: i32,
) -> SpawnFailed {
    send(fd, &spawn_frame(request));
    expect_spawn_failed(fd, stage, errno)
}

#[test]
fn huge_env_is_e2big() {
    let policy = "[limits]\nmax_argv_env_bytes = 196608\n";
    survives_with("e2big", Some(policy), |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        // 200 KiB in many variables: fits a frame, over the argv+env limit.
        let mut big = request(1, "/bin/true");
        big.env = (0..200)
            .map(|index| EnvVar {
                key: format!("VAR{index}").into_bytes(),
                value: vec![b'x'; 1024],
            })
            .collect();
        let failed = expect_and_send(&fd, big, SpawnStage::Validate, libc::E2BIG);
        assert!(failed.message.contains("limit"), "{}", failed.message);
        // One string over the kernel's 128 KiB per string.
        let mut long = request(2, "/bin/true");
        long.args = vec![vec![b'y'; 129 * 1024]];
        expect_and_send(&fd, long, SpawnStage::Validate, libc::E2BIG);
    });
}

#[test]
fn negative_or_absurd_fd_mappings() {
    survives("fd-mapping", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        let fds = dev_nulls(1);
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        for (index, child_fd) in [
            (0, -1),
            (0, i32::MIN),
            (0, i32::MAX),
            (0, 1),
            (7, 3),
            (u32::MAX, 3),
        ] {
            let mut bad = request(1, "/bin/true");
            bad.fd_mappings = vec![FdMapping {
                attached_index: index,
                child_fd,
            }];
            send_with_fds(&fd, &spawn_frame(bad), &borrowed);
            expect_spawn_failed(&fd, SpawnStage::Validate, libc::EINVAL);
        }
        let mut bad = request(1, "/bin/true");
        bad.stdout = StdioSpec::Fd(u32::MAX);
        expect_and_send(&fd, bad, SpawnStage::Validate, libc::EINVAL);
    });
}

#[test]
fn nonexistent_cwd() {
    survives("cwd", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        let mut bad = request(1, "/bin/true");
        bad.cwd = Some(b"/nonexistent/directory".to_vec());
        expect_and_send(&fd, bad, SpawnStage::Chdir, libc::ENOENT);
    });
}

#[test]
fn nonexistent_or_invalid_uid() {
    survives("uid", |daemon| {
        let fd = connect(daemon);
        hello(&fd);
        let as_user = |id, uid| {
            let mut request = request(id, "/bin/true");
            request.user = Some(UserSpec {
                uid,
                gid: uid,
                groups: vec![],
            });
            request
        };
        // -1 would mean "keep the daemon's id" to setresuid: refused.
        let failed = expect_and_send(
            &fd,
            as_user(1, u32::MAX),
            SpawnStage::Validate,
            libc::EINVAL,
        );
        assert!(failed.message.contains("-1"), "{}", failed.message);
        let peer_is_root = rustix::process::geteuid().is_root();
        if peer_is_root {
            // A uid without a passwd entry is still a uid: root may use
            // it, as with std's `Command::uid`.
            send(&fd, &spawn_frame(as_user(2, 3_999_999)));
            assert!(matches!(receive(&fd), Some(ServerMessage::Spawned(_))));
            assert!(matches!(receive(&fd), Some(ServerMessage::Exited(_))));
        } else {
            // Anyone else may not ask for another uid.
            expect_and_send(
                &fd,
                as_user(2, 3_999_999),
                SpawnStage::Admission,
                libc::EPERM,
            );
        }
    });
}

/// Beyond the connection table and the 64 connections being refused at
/// once, a connection is closed at once without an answer: a flood of
/// them holds no fd longer than it takes to close it. A refused
/// connection waits a second for its hello before its answer, so each
/// round must open its connections within that second; a round that
/// did not is tried again.
#[test]
fn connections_far_over_the_limit_are_closed_unanswered() {
    let address = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, free_port()));
    let daemon = crate::util::start_daemon_with(
        "far-over-the-limit",
        Some("[limits]\nmax_connections = 2\n"),
        &["--metrics-listen", &address.to_string()],
    );
    let open_now = || {
        let (_, text) = http_get(address, "/metrics").ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix("zygote_connections_open "))
            .and_then(|value| value.trim().parse::<u64>().ok())
    };
    let counted = |count: u64| eventually(Duration::from_millis(500), || open_now() == Some(count));
    for _round in 0..5 {
        assert!(counted(0), "connections of an earlier round are still open");
        let started = std::time::Instant::now();
        // The table (2) and the 64 refused at once: each still answered.
        let held: Vec<OwnedFd> = (0..66).map(|_| connect(&daemon)).collect();
        // None of the 66 is closed unanswered (the 66th counted may be
        // any of them).
        if !counted(66) {
            assert!(
                started.elapsed() >= Duration::from_millis(900)
                    || !any_readable_within(&held, Duration::ZERO),
                "the 66th connection was closed unanswered"
            );
            continue;
        }
        assert!(
            !any_readable_within(&held, Duration::from_millis(200)),
            "the 66th connection was closed unanswered"
        );
        let over = connect(&daemon);
        let closed = any_readable_within(std::slice::from_ref(&over), Duration::from_millis(200));
        if started.elapsed() >= Duration::from_millis(900) {
            continue; // the refused ones may have been answered and closed
        }
        assert!(closed, "the 67th connection was not closed at once");
        let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
        assert!(
            matches!(recv_frame(over.as_fd(), &mut scratch), Ok(None)),
            "the 67th connection got an answer"
        );
        return;
    }
    panic!("five rounds could not open 67 connections within a second");
}

/// Whether any of `fds` has something to read (or its end) within `wait`.
fn any_readable_within(fds: &[OwnedFd], wait: Duration) -> bool {
    let wait = wait.try_into().expect("timespec");
    let mut poll: Vec<_> = fds
        .iter()
        .map(|fd| rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN))
        .collect();
    rustix::event::poll(&mut poll, Some(&wait)).expect("poll") > 0
}
