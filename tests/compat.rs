//! Protocol compatibility: a client built against an earlier protocol
//! version keeps being served, in its own layout, by this daemon.
//!
//! The old clients are fixtures: the frames they sent, recorded in
//! `proto/vectors/v1/conversation.json` by the encoder of protocol version 1
//! and in `proto/vectors/v2/conversation.json` in the layout of version 2,
//! and [`v1`], a decoder of version-1 replies written from that version's
//! `PROTOCOL.md` and frozen with it. Neither follows later changes to
//! `zygote-proto`: that is the point.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use zygote_client::{Client, Feature, PROTOCOL_VERSION};
use zygote_proto::{
    ClientMessage, Hello, ProtocolErrorKind, RECV_BUFFER_BYTES, ServerMessage, decode, encode,
    recv_frame, send_frame, socket,
};

use crate::util::{runtime, start_daemon, start_daemon_custom, zygote_bin};

const CONVERSATION: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../proto/vectors/v1/conversation.json"
);
const CONVERSATION_V2: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../proto/vectors/v2/conversation.json"
);
const VECTORS_V1: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../proto/vectors/v1/frames.json"
);

/// How long any one reply may take.
const REPLY_DEADLINE: Duration = Duration::from_secs(20);

/// `(name, bytes)` of every frame in a recorded file: the `"name"` and
/// `"hex"` lines, in order (the files are written one key per line).
fn recorded(path: &str) -> Vec<(String, Vec<u8>)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{path}: {error}"));
    let value = |line: &str, key: &str| {
        let rest = line.trim().strip_prefix(&format!("\"{key}\": \""))?;
        Some(rest.trim_end_matches(',').trim_end_matches('"').to_owned())
    };
    let mut frames = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(found) = value(line, "name") {
            name = Some(found);
        } else if let Some(hex) = value(line, "hex") {
            let name = name
                .take()
                .unwrap_or_else(|| panic!("{path}: hex without a name"));
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            frames.push((name, bytes));
        }
    }
    frames
}

/// The recorded client frame called `name`.
fn frame<'a>(recorded: &'a [(String, Vec<u8>)], name: &str) -> &'a [u8] {
    &recorded
        .iter()
        .find(|(found, _)| found == name)
        .unwrap_or_else(|| panic!("no recorded frame {name}"))
        .1
}

/// The next reply, decoded in the version-1 layout, with its fds.
fn receive_v1(fd: &OwnedFd) -> (v1::Reply, Vec<OwnedFd>) {
    let mut buffer = vec![0; RECV_BUFFER_BYTES];
    let received = rustix::event::poll(
        &mut [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)],
        Some(&REPLY_DEADLINE.try_into().expect("timespec")),
    )
    .expect("poll");
    assert_eq!(received, 1, "no reply within {REPLY_DEADLINE:?}");
    let frame = recv_frame(fd.as_fd(), &mut buffer)
        .expect("receive")
        .expect("the daemon closed the connection");
    let reply = v1::decode(&frame.bytes).unwrap_or_else(|error| {
        panic!(
            "a reply does not decode in the version-1 layout: {error}: {:02x?}",
            frame.bytes
        )
    });
    (reply, frame.fds)
}

/// Replays the recorded conversation of a version-1 client: its hello, a spawn
/// it then signals, a spawn with a pipe, a spawn that fails, a status
/// request and a signal to an unknown child. Every reply must decode, in
/// full, in the version-1 layout.
#[test]
fn version_1_conversation_is_served_in_the_version_1_layout() {
    let conversation = recorded(CONVERSATION);
    assert_eq!(conversation.len(), 7, "{CONVERSATION}: frames");
    let daemon = start_daemon("compat-v1-conversation");
    let fd = socket::connect_to(daemon.socket(), false).expect("connect");
    send_frame(fd.as_fd(), frame(&conversation, "hello"), &[]).expect("send");
    match receive_v1(&fd).0 {
        v1::Reply::HelloAck {
            protocol_version,
            server_version,
            max_frame_bytes,
            max_fds_per_frame,
        } => {
            assert_eq!(protocol_version, 1);
            assert!(server_version.starts_with(env!("CARGO_PKG_VERSION")));
            assert_eq!((max_frame_bytes, max_fds_per_frame), (262_144, 64));
        }
        other => panic!("expected a version-1 HelloAck, got {other:?}"),
    }
    replay_after_hello(&conversation, &fd);
}

/// The same conversation recorded by a client of version 2: its
/// `HelloAck` lists features (the frozen version-2 layout), and every
/// later reply is in the layout versions 1 and 2 share, which the frozen
/// version-1 decoder reads in full.
#[test]
fn version_2_conversation_is_served_in_the_version_2_layout() {
    let conversation = recorded(CONVERSATION_V2);
    assert_eq!(conversation.len(), 7, "{CONVERSATION_V2}: frames");
    // Each recorded frame is a version-2 frame, as that layout encodes it.
    for (name, bytes) in &conversation {
        let message: zygote_proto::v2::ClientMessage =
            decode(bytes).unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(&encode(&message).expect("encode"), bytes, "{name}");
    }
    let daemon = start_daemon("compat-v2-conversation");
    let fd = socket::connect_to(daemon.socket(), false).expect("connect");
    send_frame(fd.as_fd(), frame(&conversation, "hello"), &[]).expect("send");
    let mut buffer = vec![0; RECV_BUFFER_BYTES];
    let ack = recv_frame(fd.as_fd(), &mut buffer)
        .expect("receive")
        .expect("a HelloAck");
    match decode::<zygote_proto::v2::ServerMessage>(&ack.bytes) {
        Ok(zygote_proto::v2::ServerMessage::HelloAck(ack)) => {
            assert_eq!(ack.protocol_version, 2);
            assert!(ack.features.iter().any(|name| name == "pty"), "{ack:?}");
            assert!(
                !ack.features
                    .iter()
                    .any(|name| name == "sandbox" || name == "templates"),
                "{ack:?}"
            );
        }
        other => panic!("expected a version-2 HelloAck, got {other:?}"),
    }
    replay_after_hello(&conversation, &fd);
}

/// Replays the rest of a recorded conversation (after its hello) and
/// checks every reply in the layout versions 1 and 2 share.
fn replay_after_hello(conversation: &[(String, Vec<u8>)], fd: &OwnedFd) {
    let send = |name: &str| send_frame(fd.as_fd(), frame(conversation, name), &[]).expect("send");

    // sleep 30, then SIGTERM: Spawned, SignalSent, Exited by signal 15
    // (the last two in either order).
    send("spawn_sleep");
    let (reply, fds) = receive_v1(fd);
    let v1::Reply::Spawned { id: 1, pid } = reply else {
        panic!("expected Spawned for spawn 1, got {reply:?}");
    };
    assert!(pid > 0);
    assert_eq!(fds.len(), 1, "Spawned carries the pidfd alone");
    send("signal_sleep");
    let mut signal_sent = false;
    let mut exited = false;
    while !(signal_sent && exited) {
        match receive_v1(fd).0 {
            v1::Reply::SignalSent { id: 2 } => signal_sent = true,
            v1::Reply::Exited {
                id: 1,
                status: v1::Status::Signaled(15, false),
                pid: exited_pid,
                ..
            } => {
                assert_eq!(exited_pid, pid);
                exited = true;
            }
            other => panic!("expected SignalSent 2 and Exited 1, got {other:?}"),
        }
    }

    // sh -c 'echo replayed; exit 3' with stdout a pipe.
    send("spawn_echo_pipe");
    let (reply, fds) = receive_v1(fd);
    assert!(
        matches!(reply, v1::Reply::Spawned { id: 3, .. }),
        "expected Spawned for spawn 3, got {reply:?}"
    );
    assert_eq!(fds.len(), 2, "the pidfd, then stdout's read end");
    let mut stdout = std::fs::File::from(fds.into_iter().nth(1).expect("stdout"));
    let mut output = String::new();
    stdout.read_to_string(&mut output).expect("read stdout");
    assert_eq!(output, "replayed\n");
    match receive_v1(fd).0 {
        v1::Reply::Exited {
            id: 3,
            status: v1::Status::Exited(3),
            timed_out: false,
            ..
        } => {}
        other => panic!("expected Exited 3 with code 3, got {other:?}"),
    }

    send("spawn_missing");
    match receive_v1(fd).0 {
        v1::Reply::SpawnFailed {
            id: 4,
            stage,
            errno,
            message,
        } => {
            assert_eq!((stage, errno), (10, libc::ENOENT), "Exec, ENOENT");
            assert!(message.contains("zygote-replay"), "{message}");
        }
        other => panic!("expected SpawnFailed for spawn 4, got {other:?}"),
    }

    send("status");
    match receive_v1(fd).0 {
        v1::Reply::Status {
            id: 5,
            server_version,
            spawns_succeeded,
            ..
        } => {
            assert!(server_version.starts_with(env!("CARGO_PKG_VERSION")));
            assert!(spawns_succeeded >= 2, "{spawns_succeeded}");
        }
        other => panic!("expected Status 5, got {other:?}"),
    }

    send("signal_unknown");
    match receive_v1(fd).0 {
        v1::Reply::RequestFailed { id: 6, errno, .. } => assert_eq!(errno, libc::ESRCH),
        other => panic!("expected RequestFailed 6, got {other:?}"),
    }
}

/// The fixture's decoder reads every server frame recorded for version 1,
/// so a failure of the replay means the daemon moved, not the fixture.
#[test]
fn frozen_decoder_reads_the_recorded_version_1_replies() {
    let vectors = recorded(VECTORS_V1);
    let server = [
        "hello_ack",
        "spawned",
        "spawn_failed",
        "exited_code",
        "exited_signal",
        "signal_sent",
        "request_failed",
        "protocol_error",
        "status_reply",
        "spawned_max",
        "spawn_failed_validate",
        "exited_core_dumped",
        "exited_max",
        "protocol_error_busy",
        "status_reply_max",
        "stopped",
        "continued",
        "exited_tree",
    ];
    for name in server {
        let bytes = frame(&vectors, name);
        let reply = v1::decode(bytes).unwrap_or_else(|error| panic!("{name}: {error}"));
        if name == "exited_code" {
            assert!(
                matches!(
                    reply,
                    v1::Reply::Exited {
                        id: 7,
                        status: v1::Status::Exited(0),
                        pid: 4242,
                        ..
                    }
                ),
                "{reply:?}"
            );
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(v1::decode(&longer).is_err(), "{name}: a trailing byte");
        assert!(
            v1::decode(&bytes[..bytes.len() - 1]).is_err(),
            "{name}: one byte short"
        );
    }
}

/// Sends `hello` on a fresh connection and returns the first reply.
fn first_reply(daemon: &crate::util::Daemon, hello: &ClientMessage) -> ServerMessage {
    let fd = socket::connect_to(daemon.socket(), false).expect("connect");
    send_frame(fd.as_fd(), &encode(hello).expect("encode"), &[]).expect("send");
    let mut buffer = vec![0; RECV_BUFFER_BYTES];
    let frame = recv_frame(fd.as_fd(), &mut buffer)
        .expect("receive")
        .expect("a reply");
    decode(&frame.bytes).expect("decodes")
}

/// A client newer than the daemon is answered in the newest version both
/// know; one older than version 1 is refused with both sides' versions.
#[test]
fn hello_negotiates_the_newest_common_version() {
    let daemon = start_daemon("compat-negotiate");
    let hello = |protocol_version| {
        ClientMessage::Hello(Hello {
            protocol_version,
            client: "compat-test".into(),
        })
    };
    match first_reply(&daemon, &hello(PROTOCOL_VERSION + 5)) {
        ServerMessage::HelloAck(ack) => {
            assert_eq!(ack.protocol_version, PROTOCOL_VERSION);
            assert!(ack.features.iter().any(|name| name == "pty"), "{ack:?}");
        }
        other => panic!("expected HelloAck, got {other:?}"),
    }
    match first_reply(&daemon, &hello(0)) {
        ServerMessage::ProtocolError(error) => {
            assert_eq!(error.kind, ProtocolErrorKind::UnsupportedVersion);
            assert!(
                error.message.contains("version 0")
                    && error.message.contains(&format!("1 to {PROTOCOL_VERSION}")),
                "{}",
                error.message
            );
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
}

/// The Rust client against a daemon that withholds pty and large_args: it
/// speaks the newest version, sees the features offered, still spawns, and
/// a pty request is refused with EOPNOTSUPP naming the feature.
#[test]
fn rust_client_against_a_daemon_with_fewer_features() {
    let daemon = start_daemon_custom(
        "compat-masked",
        None,
        None,
        &[],
        &zygote_bin(),
        &[("ZYGOTE_MASK_FEATURES", "pty,large_args,sandbox,templates")],
    );
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        assert_eq!(client.protocol_version(), PROTOCOL_VERSION);
        assert!(!client.offers(Feature::Pty), "{:?}", client.features());
        assert!(
            !client.offers(Feature::LargeArgs),
            "{:?}",
            client.features()
        );
        assert!(!client.offers(Feature::Sandbox));
        assert!(!client.offers(Feature::Templates));
        let status = client.command("true").status().await.expect("plain spawn");
        assert!(status.success());
        let started = Instant::now();
        let error = client
            .command("true")
            .pty(24, 80)
            .spawn()
            .await
            .expect_err("pty is withheld");
        assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP), "{error}");
        assert!(error.to_string().contains("feature pty"), "{error}");
        assert!(started.elapsed() < REPLY_DEADLINE);
        assert!(client.is_connected(), "a refusal keeps the connection");
    });
    let full = start_daemon("compat-unmasked");
    runtime().block_on(async {
        let client = Client::connect(full.socket()).await.expect("connect");
        assert!(client.offers(Feature::Pty), "{:?}", client.features());
        assert!(client.offers(Feature::LargeArgs), "{:?}", client.features());
        assert!(client.offers(Feature::Templates), "{:?}", client.features());
    });
}

/// A decoder of the daemon's replies in the layout of protocol version 1,
/// written from that version's `PROTOCOL.md` §3–4 and frozen: it must not
/// follow later changes to the protocol.
mod v1 {
    /// A version-1 `ServerMessage`, with the fields the tests look at.
    #[derive(Debug)]
    pub enum Reply {
        HelloAck {
            protocol_version: u32,
            server_version: String,
            max_frame_bytes: u32,
            max_fds_per_frame: u32,
        },
        Spawned {
            id: u64,
            pid: i32,
        },
        SpawnFailed {
            id: u64,
            stage: u32,
            errno: i32,
            message: String,
        },
        Exited {
            id: u64,
            status: Status,
            timed_out: bool,
            pid: i32,
        },
        SignalSent {
            id: u64,
        },
        RequestFailed {
            id: u64,
            errno: i32,
        },
        ProtocolError,
        Status {
            id: u64,
            server_version: String,
            spawns_succeeded: u64,
        },
        Stopped,
        Continued,
    }

    /// `ExitStatus`: a code, or a signal and whether it dumped core.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Status {
        Exited(i32),
        Signaled(i32, bool),
    }

    struct Reader<'a> {
        bytes: &'a [u8],
    }

    type Result<T> = std::result::Result<T, String>;

    impl Reader<'_> {
        fn byte(&mut self) -> Result<u8> {
            let (&first, rest) = self.bytes.split_first().ok_or("the frame ends early")?;
            self.bytes = rest;
            Ok(first)
        }

        fn varint(&mut self, max_bytes: u32) -> Result<u64> {
            let mut value = 0_u64;
            for index in 0..max_bytes {
                let byte = self.byte()?;
                value |= u64::from(byte & 0x7f) << (7 * index);
                if byte & 0x80 == 0 {
                    return Ok(value);
                }
            }
            Err("a varint is too long".into())
        }

        fn u32(&mut self) -> Result<u32> {
            u32::try_from(self.varint(5)?).map_err(|_| "a u32 is out of range".into())
        }

        fn u64(&mut self) -> Result<u64> {
            self.varint(10)
        }

        fn i32(&mut self) -> Result<i32> {
            let zigzag = self.u32()?;
            Ok(((zigzag >> 1) as i32) ^ -((zigzag & 1) as i32))
        }

        fn bool(&mut self) -> Result<bool> {
            match self.byte()? {
                0 => Ok(false),
                1 => Ok(true),
                other => Err(format!("bool {other}")),
            }
        }

        fn present(&mut self) -> Result<bool> {
            self.bool().map_err(|_| "a bad option tag".into())
        }

        fn string(&mut self) -> Result<String> {
            let length = usize::try_from(self.u64()?).map_err(|_| "a length is too large")?;
            if length > self.bytes.len() {
                return Err("the frame ends early".into());
            }
            let (text, rest) = self.bytes.split_at(length);
            self.bytes = rest;
            String::from_utf8(text.to_vec()).map_err(|_| "a string is not UTF-8".into())
        }

        fn status(&mut self) -> Result<Status> {
            match self.u32()? {
                0 => Ok(Status::Exited(self.i32()?)),
                1 => Ok(Status::Signaled(self.i32()?, self.bool()?)),
                other => Err(format!("ExitStatus variant {other}")),
            }
        }

        /// `ResourceUsage`, then `timed_out`, then `option<TreeUsage>`.
        fn usage_and_tree(&mut self) -> Result<bool> {
            for _ in 0..3 {
                self.u64()?;
            }
            let timed_out = self.bool()?;
            if self.present()? {
                self.u64()?;
                self.u64()?;
                if self.present()? {
                    self.u64()?;
                }
                self.u64()?;
                if self.present()? {
                    self.u64()?;
                }
            }
            Ok(timed_out)
        }
    }

    /// Decodes one whole frame; anything left over is an error.
    pub fn decode(bytes: &[u8]) -> Result<Reply> {
        let mut r = Reader { bytes };
        let reply = match r.u32()? {
            0 => Reply::HelloAck {
                protocol_version: r.u32()?,
                server_version: r.string()?,
                max_frame_bytes: r.u32()?,
                max_fds_per_frame: r.u32()?,
            },
            1 => Reply::Spawned {
                id: r.u64()?,
                pid: r.i32()?,
            },
            2 => {
                let id = r.u64()?;
                let stage = r.u32()?;
                if stage > 18 {
                    return Err(format!("SpawnStage {stage}"));
                }
                Reply::SpawnFailed {
                    id,
                    stage,
                    errno: r.i32()?,
                    message: r.string()?,
                }
            }
            3 => Reply::Exited {
                id: r.u64()?,
                status: r.status()?,
                timed_out: r.usage_and_tree()?,
                pid: r.i32()?,
            },
            4 => Reply::SignalSent { id: r.u64()? },
            5 => {
                let id = r.u64()?;
                let errno = r.i32()?;
                r.string()?;
                Reply::RequestFailed { id, errno }
            }
            6 => {
                let kind = r.u32()?;
                if kind > 6 {
                    return Err(format!("ProtocolErrorKind {kind}"));
                }
                r.string()?;
                Reply::ProtocolError
            }
            7 => {
                let id = r.u64()?;
                let server_version = r.string()?;
                r.i32()?;
                for _ in 0..4 {
                    r.u64()?;
                }
                let spawns_succeeded = r.u64()?;
                r.u64()?;
                Reply::Status {
                    id,
                    server_version,
                    spawns_succeeded,
                }
            }
            8 => {
                r.u64()?;
                r.i32()?;
                Reply::Stopped
            }
            9 => {
                r.u64()?;
                Reply::Continued
            }
            other => return Err(format!("ServerMessage variant {other}")),
        };
        if !r.bytes.is_empty() {
            return Err(format!("{} bytes after the message", r.bytes.len()));
        }
        Ok(reply)
    }
}

/// A version-3 request for a sandbox, which this daemon withholds, is
/// refused before anything is created, as `EOPNOTSUPP` naming the
/// feature at stage `Validate`; the connection carries on.
#[test]
fn a_sandbox_request_is_refused_while_the_daemon_does_not_offer_it() {
    use zygote_proto::{SandboxSpec, SpawnRequest, SpawnStage};
    let daemon = start_daemon_custom(
        "compat-sandbox-refused",
        None,
        None,
        &[],
        &zygote_bin(),
        &[("ZYGOTE_MASK_FEATURES", "sandbox")],
    );
    let fd = crate::util::connect_with_deadline(daemon.socket(), REPLY_DEADLINE);
    let send = |message: &ClientMessage| {
        send_frame(fd.as_fd(), &encode(message).expect("encode"), &[]).expect("send");
    };
    let mut buffer = vec![0; RECV_BUFFER_BYTES];
    let mut receive = || -> ServerMessage {
        let frame = recv_frame(fd.as_fd(), &mut buffer)
            .expect("receive")
            .expect("a reply");
        decode(&frame.bytes).expect("a version-3 reply")
    };
    send(&ClientMessage::Hello(Hello {
        protocol_version: 3,
        client: "compat-test".into(),
    }));
    match receive() {
        ServerMessage::HelloAck(ack) => {
            assert_eq!(ack.protocol_version, 3);
            // Templates are listed to version-4 connections only.
            assert!(
                !ack.features
                    .iter()
                    .any(|name| name == "sandbox" || name == "templates"),
                "{ack:?}"
            );
        }
        other => panic!("expected HelloAck, got {other:?}"),
    }
    let sandboxed = SpawnRequest {
        sandbox: Some(SandboxSpec {
            isolate: true,
            ..SandboxSpec::default()
        }),
        ..SpawnRequest::new(1, "/bin/true")
    };
    send(&ClientMessage::Spawn(sandboxed));
    match receive() {
        ServerMessage::SpawnFailed(failed) => {
            assert_eq!(failed.id, 1);
            assert_eq!(failed.stage, SpawnStage::Validate);
            assert_eq!(failed.errno, libc::EOPNOTSUPP);
            assert!(
                failed.message.contains("feature sandbox"),
                "{}",
                failed.message
            );
        }
        other => panic!("expected SpawnFailed, got {other:?}"),
    }
    send(&ClientMessage::Spawn(SpawnRequest::new(2, "/bin/true")));
    match receive() {
        ServerMessage::Spawned(spawned) => {
            assert_eq!(spawned.id, 2);
            assert_eq!(spawned.sandbox, None, "nothing confined it");
        }
        other => panic!("expected Spawned, got {other:?}"),
    }
}

/// `Status` in version 3 lists the use of each peer uid: the asking
/// root client sees its own connection and child, with its caps.
#[test]
fn status_reports_the_use_of_each_peer() {
    let daemon = start_daemon("compat-peer-use");
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        let other = Client::connect(daemon.socket()).await.expect("connect");
        let mut child = client
            .command("sleep")
            .arg("30")
            .kill_on_close(libc::SIGKILL)
            .spawn()
            .await
            .expect("spawn");
        let status = other.status().await.expect("status");
        let me = rustix::process::getuid().as_raw();
        let mine: Vec<_> = status.peers.iter().filter(|peer| peer.uid == me).collect();
        assert_eq!(mine.len(), 1, "{:?}", status.peers);
        assert_eq!(mine[0].connections, 2, "{:?}", mine[0]);
        assert_eq!(mine[0].children, 1, "{:?}", mine[0]);
        assert!(mine[0].children_limit >= 1 && mine[0].connections_limit >= 2);
        assert_eq!(mine[0].sandbox_profile, None);
        assert!(status.spawners.is_empty());
        child.kill().await.expect("kill");
        child.wait().await.expect("wait");
        let status = other.status().await.expect("status");
        let mine = status
            .peers
            .iter()
            .find(|peer| peer.uid == me)
            .expect("own entry");
        assert_eq!(mine.children, 0, "{mine:?}");
    });
}

/// The Rust client does not send a sandbox to this daemon, which does not
/// offer it: the spawn fails at once with `EOPNOTSUPP` naming the
/// feature, and the client carries on.
#[test]
fn rust_client_refuses_a_sandbox_the_daemon_does_not_offer() {
    let daemon = start_daemon_custom(
        "compat-sandbox-client",
        None,
        None,
        &[],
        &zygote_bin(),
        &[("ZYGOTE_MASK_FEATURES", "sandbox")],
    );
    runtime().block_on(async {
        let client = Client::connect(daemon.socket()).await.expect("connect");
        assert!(!client.offers(Feature::Sandbox));
        let error = client
            .command("true")
            .sandbox(zygote_client::Sandbox::new().isolate())
            .spawn()
            .await
            .expect_err("sandbox is not offered");
        assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP), "{error}");
        assert!(error.to_string().contains("feature sandbox"), "{error}");
        let status = client.status().await.expect("status");
        assert_eq!(status.spawns_failed, 0, "nothing reached the daemon");
        assert!(
            client
                .command("true")
                .status()
                .await
                .expect("spawn")
                .success()
        );
    });
}

/// Each version's `HelloAck` lists the features its layouts can carry: a
/// sandbox from version 3, templates from version 4.
#[test]
fn each_version_is_offered_the_features_its_layouts_carry() {
    let daemon = start_daemon("compat-features-per-version");
    for (version, sandbox, templates) in [(3, true, false), (4, true, true)] {
        let fd = crate::util::connect_with_deadline(daemon.socket(), REPLY_DEADLINE);
        let hello = ClientMessage::Hello(Hello {
            protocol_version: version,
            client: "compat-test".into(),
        });
        send_frame(fd.as_fd(), &encode(&hello).expect("encode"), &[]).expect("send");
        let mut buffer = vec![0; RECV_BUFFER_BYTES];
        let frame = recv_frame(fd.as_fd(), &mut buffer)
            .expect("receive")
            .expect("a HelloAck");
        let Ok(ServerMessage::HelloAck(ack)) = decode(&frame.bytes) else {
            panic!("expected a HelloAck to version {version}");
        };
        assert_eq!(ack.protocol_version, version);
        let lists = |name: &str| ack.features.iter().any(|listed| listed == name);
        assert_eq!(
            (lists("sandbox"), lists("templates")),
            (sandbox, templates),
            "version {version}: {:?}",
            ack.features
        );
        // A template message is answered from version 4 on, and ends an
        // older connection.
        let list = ClientMessage::ListTemplates(zygote_proto::TemplateListRequest { id: 1 });
        send_frame(fd.as_fd(), &encode(&list).expect("encode"), &[]).expect("send");
        let frame = recv_frame(fd.as_fd(), &mut buffer)
            .expect("receive")
            .expect("a reply");
        match decode(&frame.bytes) {
            Ok(ServerMessage::Templates(_)) if templates => {}
            Ok(ServerMessage::ProtocolError(error)) if !templates => {
                assert_eq!(error.kind, ProtocolErrorKind::UnexpectedMessage);
                assert!(error.message.contains("version 4"), "{}", error.message);
            }
            other => panic!("version {version}: ListTemplates got {other:?}"),
        }
    }
}
