//! `defer_spawned`: a child that ends within the deferral window
//! gets `Exited` alone, one that runs longer gets `Spawned` (with a working
//! pidfd) then `Exited`; pipes and ptys are refused; a signal by spawn id
//! works inside the window; the client APIs' `status()` use it.
//!
//! The window is about 10 ms and the machine may be loaded, so a test that
//! needs a child to end inside it tries a few times: every attempt must be
//! a valid reply sequence, and at least one must show the deferral.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use zygote_proto::{
    ClientMessage, ExitNotice, ExitStatus, Hello, PROTOCOL_VERSION, PtySpec, RECV_BUFFER_BYTES,
    ServerMessage, SignalRequest, SpawnRequest, SpawnStage, StatusRequest, StdioSpec, WindowSize,
    decode, encode, recv_frame, send_frame,
};

use crate::util::{Daemon, connect_with_deadline, runtime, start_daemon};

/// How many times a test that races the window tries.
const ATTEMPTS: usize = 8;

/// A raw connection that has said hello, with a receive timeout so that a
/// silent daemon fails the test instead of hanging it.
pub(crate) fn connect(socket_path: &std::path::Path) -> OwnedFd {
    let fd = connect_with_deadline(socket_path, Duration::from_secs(10));
    send(
        &fd,
        &ClientMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: "deferred test".into(),
        }),
    );
    let (reply, _) = receive(&fd);
    assert!(matches!(reply, ServerMessage::HelloAck(_)), "{reply:?}");
    fd
}

pub(crate) fn send(fd: &OwnedFd, message: &ClientMessage) {
    send_frame(fd.as_fd(), &encode(message).unwrap(), &[]).expect("send");
}

/// The next frame and its fds.
pub(crate) fn receive(fd: &OwnedFd) -> (ServerMessage, Vec<OwnedFd>) {
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let frame = recv_frame(fd.as_fd(), &mut scratch)
        .expect("recv (timed out?)")
        .expect("the daemon closed the connection");
    (decode(&frame.bytes).expect("decode"), frame.fds)
}

/// A deferred spawn of `program` with `args`.
pub(crate) fn deferred(id: u64, program: &str, args: &[&str]) -> ClientMessage {
    ClientMessage::Spawn(SpawnRequest {
        args: args.iter().map(|arg| arg.as_bytes().to_vec()).collect(),
        defer_spawned: true,
        ..SpawnRequest::new(id, program)
    })
}

/// Whether the process behind a pidfd still runs (its pidfd is not
/// readable yet).
pub(crate) fn pidfd_alive(pidfd: &OwnedFd) -> bool {
    let mut poll = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut poll, Some(&now)).expect("poll a pidfd") == 0
}

/// What one spawn got: the `Spawned` (pid, pidfd, when) if any, then its
/// `Exited`. Asserts the sequence is one the protocol allows.
struct Replies {
    spawned: Option<(i32, OwnedFd, Instant)>,
    exited: ExitNotice,
}

fn collect(fd: &OwnedFd, id: u64) -> Replies {
    let mut spawned = None;
    loop {
        let (message, mut fds) = receive(fd);
        match message {
            ServerMessage::Spawned(reply) => {
                assert_eq!(reply.id, id);
                assert!(spawned.is_none(), "a second Spawned for {id}");
                assert_eq!(fds.len(), 1, "a deferred Spawned carries the pidfd alone");
                spawned = Some((reply.pid, fds.remove(0), Instant::now()));
            }
            ServerMessage::Exited(exited) => {
                assert_eq!(exited.id, id);
                assert!(fds.is_empty());
                if let Some((pid, _, _)) = &spawned {
                    assert_eq!(exited.pid, *pid, "Exited names the child Spawned named");
                }
                return Replies { spawned, exited };
            }
            other => panic!("unexpected reply to spawn {id}: {other:?}"),
        }
    }
}

/// Nothing more comes for the spawn: the next frame answers a `Status`.
fn nothing_follows(fd: &OwnedFd, status_id: u64) {
    send(fd, &ClientMessage::Status(StatusRequest { id: status_id }));
    match receive(fd).0 {
        ServerMessage::Status(status) => assert_eq!(status.id, status_id),
        other => panic!("expected only the Status reply, got {other:?}"),
    }
}

#[test]
fn a_short_child_gets_exited_alone_with_its_pid() {
    let daemon = start_daemon("deferred-short");
    let dir = tempfile::tempdir().expect("tempdir");
    let fd = connect(daemon.socket());
    let mut alone = 0;
    for attempt in 0..ATTEMPTS as u64 {
        let id = attempt * 2 + 1;
        let file = dir.path().join(format!("pid{attempt}"));
        let script = format!("echo $$ > {}; exit 3", file.display());
        send(&fd, &deferred(id, "/bin/sh", &["-c", &script]));
        let replies = collect(&fd, id);
        assert_eq!(replies.exited.status, ExitStatus::Exited(3));
        let pid: i32 = std::fs::read_to_string(&file)
            .expect("the child wrote its pid")
            .trim()
            .parse()
            .expect("a pid");
        assert_eq!(replies.exited.pid, pid, "Exited.pid is the child's pid");
        nothing_follows(&fd, id + 1);
        if replies.spawned.is_none() {
            alone += 1;
        }
    }
    assert!(
        alone > 0,
        "every one of {ATTEMPTS} quick children got a Spawned: the deferral never applied; log:\n{}",
        daemon.log()
    );
    // /bin/true as well, the benchmark's child.
    let mut alone = 0;
    for attempt in 0..ATTEMPTS as u64 {
        let id = 100 + attempt * 2;
        send(&fd, &deferred(id, "/bin/true", &[]));
        let replies = collect(&fd, id);
        assert_eq!(replies.exited.status, ExitStatus::Exited(0));
        assert!(replies.exited.pid > 0);
        nothing_follows(&fd, id + 1);
        alone += usize::from(replies.spawned.is_none());
    }
    assert!(alone > 0, "/bin/true always got a Spawned");
}

#[test]
fn a_longer_child_gets_spawned_with_a_working_pidfd_then_exited() {
    let daemon = start_daemon("deferred-long");
    let fd = connect(daemon.socket());
    let sent = Instant::now();
    send(&fd, &deferred(1, "/bin/sleep", &["0.2"]));
    let replies = collect(&fd, 1);
    let (pid, pidfd, at) = replies
        .spawned
        .expect("a child running 200 ms gets its Spawned");
    assert!(
        at - sent >= Duration::from_millis(10),
        "Spawned came {:?} after the request: it was not deferred",
        at - sent
    );
    assert!(pid > 0);
    assert_eq!(replies.exited.status, ExitStatus::Exited(0));
    assert_eq!(replies.exited.pid, pid);
    // The pidfd is the child's: it reports the exit.
    assert!(!pidfd_alive(&pidfd), "the pidfd reports the child's exit");
    nothing_follows(&fd, 2);
}

#[test]
fn the_pidfd_of_a_deferred_spawned_signals_the_running_child() {
    let daemon = start_daemon("deferred-pidfd");
    let fd = connect(daemon.socket());
    send(&fd, &deferred(1, "/bin/sleep", &["10"]));
    let (message, mut fds) = receive(&fd);
    let ServerMessage::Spawned(spawned) = message else {
        panic!("expected Spawned for a 10 s child, got {message:?}");
    };
    let pidfd = fds.remove(0);
    assert!(pidfd_alive(&pidfd));
    rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::TERM)
        .expect("SIGTERM through the deferred pidfd");
    let (message, _) = receive(&fd);
    let ServerMessage::Exited(exited) = message else {
        panic!("expected Exited, got {message:?}");
    };
    assert_eq!((exited.id, exited.pid), (1, spawned.pid));
    assert_eq!(
        exited.status,
        ExitStatus::Signaled {
            signal: libc::SIGTERM,
            core_dumped: false
        }
    );
}

#[test]
fn pipes_and_ptys_are_refused_with_a_deferral() {
    let daemon = start_daemon("deferred-refused");
    let fd = connect(daemon.socket());
    let pipe = ClientMessage::Spawn(SpawnRequest {
        stdout: StdioSpec::Pipe,
        defer_spawned: true,
        ..SpawnRequest::new(1, "/bin/true")
    });
    let pty = ClientMessage::Spawn(SpawnRequest {
        pty: Some(PtySpec {
            window: WindowSize { rows: 24, cols: 80 },
        }),
        defer_spawned: true,
        ..SpawnRequest::new(2, "/bin/true")
    });
    for (id, request, what) in [(1, pipe, "Pipe"), (2, pty, "pty")] {
        send(&fd, &request);
        match receive(&fd) {
            (ServerMessage::SpawnFailed(failed), fds) => {
                assert!(fds.is_empty());
                assert_eq!(failed.id, id);
                assert_eq!(
                    (failed.stage, failed.errno),
                    (SpawnStage::Validate, libc::EINVAL),
                    "{}",
                    failed.message
                );
                assert!(
                    failed.message.contains("defer_spawned") && failed.message.contains(what),
                    "the refusal says why: {}",
                    failed.message
                );
            }
            other => panic!("expected SpawnFailed for deferral with a {what}, got {other:?}"),
        }
    }
    // The connection carries on.
    send(&fd, &deferred(3, "/bin/true", &[]));
    assert_eq!(collect(&fd, 3).exited.status, ExitStatus::Exited(0));
}

#[test]
fn a_signal_by_id_in_the_deferral_window_kills_the_child() {
    let daemon = start_daemon("deferred-signal");
    let fd = connect(daemon.socket());
    let mut in_window = 0;
    let mut next_id = 1;
    for _ in 0..ATTEMPTS {
        let id = next_id;
        next_id += 1;
        send(&fd, &deferred(id, "/bin/sleep", &["10"]));
        // A signal read before the child is started gets ESRCH (as for any
        // spawn): send again until it is delivered.
        let mut spawned = false;
        let mut delivered_before_spawned = false;
        let exited = loop {
            let signal_id = next_id;
            next_id += 1;
            send(
                &fd,
                &ClientMessage::Signal(SignalRequest {
                    id: signal_id,
                    spawn_id: id,
                    signal: libc::SIGKILL,
                }),
            );
            let mut exited = None;
            loop {
                match receive(&fd).0 {
                    ServerMessage::SignalSent(sent) => {
                        assert_eq!(sent.id, signal_id);
                        delivered_before_spawned = !spawned;
                        break;
                    }
                    ServerMessage::RequestFailed(failed) => {
                        assert_eq!(failed.id, signal_id);
                        assert_eq!(failed.errno, libc::ESRCH, "{}", failed.message);
                        assert!(exited.is_none(), "ESRCH for a child already reported");
                        std::thread::sleep(Duration::from_micros(200));
                        break;
                    }
                    ServerMessage::Spawned(reply) => {
                        assert_eq!(reply.id, id);
                        assert!(!spawned, "a second Spawned");
                        spawned = true;
                    }
                    ServerMessage::Exited(notice) => exited = Some(notice),
                    other => panic!("unexpected reply: {other:?}"),
                }
            }
            if let Some(exited) = exited {
                break exited;
            }
            if delivered_before_spawned || spawned {
                let exited = loop {
                    match receive(&fd).0 {
                        ServerMessage::Exited(notice) => break notice,
                        ServerMessage::Spawned(reply) => {
                            assert_eq!(reply.id, id);
                            assert!(!spawned, "a second Spawned");
                            spawned = true;
                        }
                        other => panic!("unexpected reply: {other:?}"),
                    }
                };
                break exited;
            }
        };
        assert_eq!(exited.id, id);
        assert!(exited.pid > 0);
        assert_eq!(
            exited.status,
            ExitStatus::Signaled {
                signal: libc::SIGKILL,
                core_dumped: false
            }
        );
        nothing_follows(&fd, next_id);
        next_id += 1;
        in_window += usize::from(delivered_before_spawned);
    }
    assert!(
        in_window > 0,
        "no signal was ever delivered inside the deferral window; log:\n{}",
        daemon.log()
    );
}

/// `Command::status()` defers: its results are those of an undeferred
/// spawn, short or long, exit code or signal, async and blocking.
#[test]
fn status_is_right_with_and_without_a_spawned() {
    let daemon: Daemon = start_daemon("deferred-status");
    let rt = runtime();
    rt.block_on(async {
        let client = zygote_client::Client::connect(daemon.socket())
            .await
            .expect("connect");
        let cases = [
            ("exit 0", Some(0)),
            ("exit 3", Some(3)),
            ("sleep 0.1; exit 4", Some(4)),
            ("kill -9 $$", None),
        ];
        for (script, code) in cases {
            let status = client
                .command("sh")
                .args(["-c", script])
                .status()
                .await
                .expect("status");
            assert_eq!(status.code(), code, "{script}: {status}");
        }
        let status = client
            .command("sh")
            .args(["-c", "kill -9 $$"])
            .status()
            .await
            .expect("status");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // A piped stdout is not deferred (the pipe comes with Spawned).
        let status = client
            .command("true")
            .stdout(zygote_client::Stdio::piped())
            .status()
            .await
            .expect("status with a pipe");
        assert!(status.success());
        let error = client
            .command("/nonexistent/program")
            .status()
            .await
            .expect_err("no such program");
        assert_eq!(error.raw_os_error(), Some(libc::ENOENT), "{error}");
    });
    let client = zygote_client::blocking::Client::connect(daemon.socket()).expect("connect");
    for (script, code) in [("exit 5", 5), ("sleep 0.05; exit 6", 6)] {
        let status = zygote_client::blocking::Command::new(&client, "sh")
            .args(["-c", script])
            .status()
            .expect("blocking status");
        assert_eq!(status.code(), Some(code), "{script}");
    }
}

/// A stop notice never comes before `Spawned`: a child that stops inside
/// the window gets its `Spawned` first.
#[test]
fn a_stop_in_the_window_sends_spawned_first() {
    let daemon = start_daemon("deferred-stops");
    let fd = connect(daemon.socket());
    send(
        &fd,
        &ClientMessage::Spawn(SpawnRequest {
            args: vec![b"-c".to_vec(), b"kill -STOP $$; exit 2".to_vec()],
            report_stops: true,
            defer_spawned: true,
            ..SpawnRequest::new(1, "/bin/sh")
        }),
    );
    let (first, fds) = receive(&fd);
    let ServerMessage::Spawned(spawned) = first else {
        panic!("expected Spawned before anything else, got {first:?}");
    };
    assert_eq!(fds.len(), 1);
    match receive(&fd).0 {
        ServerMessage::Stopped(stopped) => {
            assert_eq!((stopped.id, stopped.signal), (1, libc::SIGSTOP));
        }
        other => panic!("expected Stopped, got {other:?}"),
    }
    send(
        &fd,
        &ClientMessage::Signal(SignalRequest {
            id: 2,
            spawn_id: 1,
            signal: libc::SIGCONT,
        }),
    );
    let mut exited = None;
    let mut signal_sent = false;
    while exited.is_none() || !signal_sent {
        match receive(&fd).0 {
            ServerMessage::SignalSent(sent) => {
                assert_eq!(sent.id, 2);
                signal_sent = true;
            }
            ServerMessage::Continued(continued) => assert_eq!(continued.id, 1),
            ServerMessage::Exited(notice) => exited = Some(notice),
            other => panic!("unexpected reply: {other:?}"),
        }
    }
    let exited = exited.expect("loop ends with it");
    assert_eq!(
        (exited.pid, exited.status),
        (spawned.pid, ExitStatus::Exited(2))
    );
}

/// `output()` makes its own pipes so that it can defer too: its output,
/// large or small, and status are those of an undeferred spawn, and it
/// leaves no fd behind.
#[test]
fn output_with_client_made_pipes_is_complete() {
    let daemon = start_daemon("deferred-output");
    let rt = runtime();
    let fds = || std::fs::read_dir("/proc/self/fd").expect("fd dir").count();
    rt.block_on(async {
        let client = zygote_client::Client::connect(daemon.socket())
            .await
            .expect("connect");
        let output = client
            .command("sh")
            .args(["-c", "echo out; echo err >&2; exit 3"])
            .output()
            .await
            .expect("output");
        assert_eq!(output.status.code(), Some(3));
        assert_eq!(
            (&output.stdout[..], &output.stderr[..]),
            (&b"out\n"[..], &b"err\n"[..])
        );
        // More than a pipe holds, and a child that outlives the window.
        let output = client
            .command("sh")
            .args([
                "-c",
                "head -c 300000 /dev/zero; sleep 0.05; head -c 70000 /dev/zero >&2",
            ])
            .output()
            .await
            .expect("large output");
        assert!(output.status.success());
        assert_eq!(
            (output.stdout.len(), output.stderr.len()),
            (300_000, 70_000)
        );
        // stdin piped: the zygote's pipes, as before.
        let output = client
            .command("cat")
            .stdin(zygote_client::Stdio::piped())
            .output()
            .await
            .expect("output with a piped stdin");
        assert!(output.status.success() && output.stdout.is_empty());
        // A stream set to null stays so; the command can run again.
        let mut command = client.command("sh");
        command.args(["-c", "echo out; echo err >&2"]);
        command.stderr(zygote_client::Stdio::null());
        for _ in 0..2 {
            let output = command.output().await.expect("output");
            assert_eq!(
                (&output.stdout[..], output.stderr.len()),
                (&b"out\n"[..], 0)
            );
        }
        let error = client
            .command("/nonexistent/program")
            .output()
            .await
            .expect_err("no such program");
        assert_eq!(error.raw_os_error(), Some(libc::ENOENT), "{error}");
        // Other tests share this process's fd table: a leak shows as
        // growth with the number of calls, not as a small difference.
        let before = fds();
        for _ in 0..100 {
            let output = client
                .command("echo")
                .arg("x")
                .output()
                .await
                .expect("output");
            assert_eq!(output.stdout, b"x\n");
        }
        let after = fds();
        assert!(
            after < before + 50,
            "output() leaked fds: {before} before 100 calls, {after} after"
        );
    });
    let client = zygote_client::blocking::Client::connect(daemon.socket()).expect("connect");
    let output = zygote_client::blocking::Command::new(&client, "sh")
        .args(["-c", "echo blocking; exit 4"])
        .output()
        .expect("blocking output");
    assert_eq!(
        (output.status.code(), &output.stdout[..]),
        (Some(4), &b"blocking\n"[..])
    );
}
