//! Dispatcher tests against a scripted fake daemon on the other end of a
//! socketpair. The real daemon's end-to-end tests live in the `tests/`
//! crate; these check the client's side of the protocol on its own: reply
//! dispatch by id, fds, exit notices, and failing fast when the peer goes.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, pidfd_open};
use tokio::io::AsyncReadExt;
use zygote_proto::{
    ClientMessage, ExitNotice, HelloAck, LIMITS, PROTOCOL_VERSION, ProtocolError,
    ProtocolErrorKind, RECV_BUFFER_BYTES, RequestFailed, ResourceUsage as WireUsage, ServerMessage,
    SignalSent, SpawnFailed, SpawnStage, Spawned, StdioSpec, decode, encode, recv_frame,
    send_frame, socket,
};

use crate::{Client, Command, Error, Stdio, blocking};

/// Generous bound on anything that should be prompt.
const PROMPTLY: Duration = Duration::from_secs(20);

/// The daemon's end of the socketpair, driven synchronously from a thread.
struct FakeDaemon {
    socket: OwnedFd,
    scratch: Vec<u8>,
}

impl FakeDaemon {
    /// The next message and its fds; `None` when the client has closed.
    fn recv(&mut self) -> Option<(ClientMessage, Vec<OwnedFd>)> {
        let frame = recv_frame(self.socket.as_fd(), &mut self.scratch).unwrap()?;
        Some((decode(&frame.bytes).unwrap(), frame.fds))
    }

    fn send(&self, message: ServerMessage, fds: &[BorrowedFd<'_>]) {
        send_frame(self.socket.as_fd(), &encode(&message).unwrap(), fds).unwrap();
    }

    fn accept_hello(&mut self) {
        match self.recv() {
            Some((ClientMessage::Hello(hello), fds)) => {
                assert_eq!(hello.protocol_version, PROTOCOL_VERSION);
                assert!(hello.client.starts_with("zygote-client/"));
                assert!(fds.is_empty());
            }
            other => panic!("expected Hello, got {other:?}"),
        }
        self.send(
            ServerMessage::HelloAck(HelloAck {
                protocol_version: PROTOCOL_VERSION,
                server_version: "fake/1".into(),
                limits: LIMITS,
                features: vec!["pty".into(), "teleport".into()],
            }),
            &[],
        );
    }

    fn spawned(&self, id: u64, pid: i32, fds: &[OwnedFd]) {
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        let spawned = Spawned {
            id,
            pid,
            sandbox: None,
        };
        self.send(ServerMessage::Spawned(spawned), &borrowed);
    }

    fn exited(&self, id: u64, code: i32) {
        self.send(
            ServerMessage::Exited(ExitNotice {
                id,
                status: zygote_proto::ExitStatus::Exited(code),
                usage: WireUsage {
                    user_micros: 1000,
                    system_micros: 2000,
                    max_rss_kib: 3000,
                },
                timed_out: false,
                tree: None,
                pid: 4242,
            }),
            &[],
        );
    }
}

/// Runs `script` as the daemon on a thread; returns the client's end.
fn fake_daemon<T: Send + 'static>(
    script: impl FnOnce(FakeDaemon) -> T + Send + 'static,
) -> (OwnedFd, JoinHandle<T>) {
    let (client_end, daemon_end) = socket::pair(false).unwrap();
    let daemon = FakeDaemon {
        socket: daemon_end,
        scratch: vec![0; RECV_BUFFER_BYTES],
    };
    (client_end, std::thread::spawn(move || script(daemon)))
}

/// Joins the fake daemon's thread without blocking the runtime, whose
/// reader task must run to close the client's end.
async fn join<T: Send + 'static>(daemon: JoinHandle<T>) -> T {
    tokio::task::spawn_blocking(move || daemon.join().unwrap())
        .await
        .unwrap()
}

/// A real process to stand in for the child, with a pidfd on it.
fn sleeper() -> (std::process::Child, OwnedFd) {
    let child = std::process::Command::new("sleep")
        .arg("60")
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pidfd = pidfd_open(Pid::from_child(&child), PidfdFlags::empty()).unwrap();
    (child, pidfd)
}

fn reap(mut child: std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Answers every spawn at once: pid 1000 + N and exit code N, where N is
/// the first argument; piped stdout gets "out:N", piped stderr "err:N".
/// A deferred spawn (`output()`, with pipes of the client's) gets the same
/// in the attached fds, and its `Exited` alone.
fn serve_echo(mut daemon: FakeDaemon, pidfd: OwnedFd) {
    daemon.accept_hello();
    // Stdin read ends stay open so that the client's writes succeed.
    let mut stdin_readers = Vec::new();
    while let Some((message, attached)) = daemon.recv() {
        match message {
            ClientMessage::Spawn(request) if request.defer_spawned => {
                let arg = String::from_utf8_lossy(&request.args[0]).into_owned();
                let streams = [(request.stdout, "out"), (request.stderr, "err")];
                // status() passes this process's own stdio: left alone.
                let output = request.stdin == StdioSpec::Null;
                for (spec, name) in streams.into_iter().filter(|_| output) {
                    let StdioSpec::Fd(index) = spec else {
                        panic!("output() attaches its own pipes: {spec:?}");
                    };
                    let mut pipe = File::from(attached[index as usize].try_clone().unwrap());
                    pipe.write_all(format!("{name}:{arg}").as_bytes()).unwrap();
                }
                drop(attached);
                daemon.exited(request.id, arg.parse().unwrap());
            }
            ClientMessage::Spawn(request) => {
                let arg = request
                    .args
                    .first()
                    .map(|arg| String::from_utf8_lossy(arg).into_owned())
                    .unwrap_or_default();
                let code: i32 = arg.parse().unwrap_or(0);
                let mut fds = vec![pidfd.try_clone().unwrap()];
                let mut writers = Vec::new();
                let streams = [request.stdin, request.stdout, request.stderr];
                for (stream, spec) in streams.into_iter().enumerate() {
                    if spec == StdioSpec::Pipe {
                        let (read, write) = rustix::pipe::pipe().unwrap();
                        if stream == 0 {
                            fds.push(write);
                            stdin_readers.push(read);
                        } else {
                            fds.push(read);
                            writers.push((stream, write));
                        }
                    }
                }
                daemon.spawned(request.id, 1000 + code, &fds);
                drop(fds);
                for (stream, write) in writers {
                    let name = if stream == 1 { "out" } else { "err" };
                    File::from(write)
                        .write_all(format!("{name}:{arg}").as_bytes())
                        .unwrap();
                }
                daemon.exited(request.id, code);
            }
            ClientMessage::Signal(signal) => {
                daemon.send(ServerMessage::SignalSent(SignalSent { id: signal.id }), &[]);
            }
            ClientMessage::Hello(_) => panic!("second Hello"),
            ClientMessage::Status(_) => panic!("this client never asks for status"),
            ClientMessage::Upgrade(_) => panic!("this client never asks for an upgrade"),
            other => panic!("these tests use no templates: {other:?}"),
        }
    }
}

#[tokio::test]
async fn spawn_delivers_pidfd_pipes_signals_and_exit() {
    let (client_end, daemon) = fake_daemon(|mut daemon| {
        daemon.accept_hello();
        let Some((ClientMessage::Spawn(request), fds)) = daemon.recv() else {
            panic!("expected Spawn");
        };
        // stdin null, stdout piped, stderr inherited: one fd, the client's 2.
        assert_eq!(request.program, b"sleep");
        assert_eq!(request.args, [b"60".to_vec()]);
        assert_eq!(
            [request.stdin, request.stdout, request.stderr],
            [StdioSpec::Null, StdioSpec::Pipe, StdioSpec::Fd(0)]
        );
        assert_eq!(fds.len(), 1);
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            request.cwd.as_deref(),
            Some(cwd.as_os_str().as_encoded_bytes())
        );
        let own_env: Vec<(Vec<u8>, Vec<u8>)> = std::env::vars_os()
            .map(|(key, value)| (key.into_encoded_bytes(), value.into_encoded_bytes()))
            .collect();
        let sent_env: Vec<(Vec<u8>, Vec<u8>)> = request
            .env
            .iter()
            .map(|(key, value)| (key.to_vec(), value.to_vec()))
            .collect();
        assert_eq!(sent_env, own_env);
        assert_eq!(request.rlimits.len(), 16);

        let (sleep, pidfd) = sleeper();
        let (read, write) = rustix::pipe::pipe().unwrap();
        daemon.spawned(
            request.id,
            i32::try_from(sleep.id()).unwrap(),
            &[pidfd, read],
        );
        File::from(write).write_all(b"hello\n").unwrap();

        // First signal: delivered; second: the child is gone.
        for errno in [None, Some(libc::ESRCH)] {
            let Some((ClientMessage::Signal(signal), _)) = daemon.recv() else {
                panic!("expected Signal");
            };
            assert_eq!(signal.spawn_id, request.id);
            assert_eq!(signal.signal, libc::SIGTERM);
            let reply = match errno {
                None => ServerMessage::SignalSent(SignalSent { id: signal.id }),
                Some(errno) => ServerMessage::RequestFailed(RequestFailed {
                    id: signal.id,
                    errno,
                    message: "no such process".into(),
                }),
            };
            daemon.send(reply, &[]);
        }
        // The client has killed the sleeper through its pidfd by now and
        // says so with one more request.
        let Some((ClientMessage::Signal(sync), _)) = daemon.recv() else {
            panic!("expected Signal");
        };
        let mut sleep = sleep;
        let status = sleep.wait().unwrap();
        daemon.send(ServerMessage::SignalSent(SignalSent { id: sync.id }), &[]);
        daemon.exited(request.id, 3);
        assert!(daemon.recv().is_none(), "client should close");
        status
    });

    let run = async {
        let client = Client::from_fd(client_end).await.unwrap();
        assert_eq!(client.server_version(), "fake/1");
        assert!(client.is_connected());
        let mut child = Command::new(&client, "sleep")
            .arg("60")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .await
            .unwrap();
        assert!(child.stdin.is_none() && child.stderr.is_none());
        let mut line = Vec::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_end(&mut line)
            .await
            .unwrap();
        assert_eq!(line, b"hello\n");
        assert!(child.try_wait().unwrap().is_none());

        child.signal(libc::SIGTERM).await.unwrap();
        let error = child.signal(libc::SIGTERM).await.unwrap_err();
        assert!(
            matches!(error, Error::Request { op: "signal", .. }),
            "{error}"
        );
        assert_eq!(error.raw_os_error(), Some(libc::ESRCH));

        child.start_kill().unwrap();
        child.signal(libc::SIGTERM).await.unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(child.try_wait().unwrap(), Some(status));
        let usage = child.usage().unwrap();
        assert_eq!(usage.user_time, Duration::from_millis(1));
        assert_eq!(usage.max_rss_kib, 3000);
    };
    tokio::time::timeout(PROMPTLY, run).await.unwrap();
    let sleeper_status = join(daemon).await;
    assert_eq!(sleeper_status.signal(), Some(libc::SIGKILL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_spawns_are_dispatched_by_id() {
    const COUNT: usize = 50;
    let (client_end, daemon) = fake_daemon(|mut daemon| {
        daemon.accept_hello();
        let (sleep, pidfd) = sleeper();
        // Every request must arrive before any reply: spawns that queued
        // behind one another would deadlock here.
        let mut requests = Vec::new();
        while requests.len() < COUNT {
            let Some((ClientMessage::Spawn(request), _)) = daemon.recv() else {
                panic!("expected Spawn");
            };
            requests.push(request);
        }
        // Reply in reverse order, each exit right behind its Spawned.
        for request in requests.iter().rev() {
            let n: i32 = std::str::from_utf8(&request.args[0])
                .unwrap()
                .parse()
                .unwrap();
            daemon.spawned(request.id, 1000 + n, &[pidfd.try_clone().unwrap()]);
            daemon.exited(request.id, n);
        }
        assert!(daemon.recv().is_none());
        reap(sleep);
    });

    let client = Client::from_fd(client_end).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..COUNT {
        let client = client.clone();
        tasks.spawn(async move {
            let mut child = Command::new(&client, "worker")
                .arg(n.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .await
                .unwrap();
            assert_eq!(child.id(), 1000 + n as u32);
            let status = child.wait().await.unwrap();
            assert_eq!(status.code(), Some(n as i32));
        });
    }
    drop(client);
    tokio::time::timeout(PROMPTLY, async {
        while let Some(result) = tasks.join_next().await {
            result.unwrap();
        }
    })
    .await
    .unwrap();
    join(daemon).await;
}

#[tokio::test]
async fn losing_the_zygote_fails_waiters_and_requests() {
    let (client_end, daemon) = fake_daemon(|mut daemon| {
        daemon.accept_hello();
        let (sleep, pidfd) = sleeper();
        let Some((ClientMessage::Spawn(first), _)) = daemon.recv() else {
            panic!("expected Spawn");
        };
        daemon.spawned(first.id, i32::try_from(sleep.id()).unwrap(), &[pidfd]);
        // Take the second spawn, never answer it, and go away.
        let Some((ClientMessage::Spawn(_), _)) = daemon.recv() else {
            panic!("expected Spawn");
        };
        sleep
    });

    let client = Client::from_fd(client_end).await.unwrap();
    let mut command = Command::new(&client, "sleep");
    command.stdin(Stdio::null());
    let run = async {
        let mut child = command.spawn().await.unwrap();
        let error = command.spawn().await.unwrap_err();
        assert!(error.is_zygote_lost(), "{error}");
        assert!(
            error
                .to_string()
                .contains("the zygote closed the connection"),
            "{error}"
        );
        // Still running: no status yet, and no error (the pidfd stands in
        // for the lost zygote).
        assert!(matches!(child.try_wait(), Ok(None)));
        assert!(!client.is_connected());
        // New requests fail at once: a client of an fd cannot reconnect.
        let error = command.spawn().await.unwrap_err();
        assert!(error.is_zygote_lost(), "{error}");
        assert!(error.to_string().contains("cannot reconnect"), "{error}");
        // Killing still works, through the pidfd; the pidfd confirms it,
        // without waiting for the child to be reaped.
        child.kill().await.unwrap();
    };
    tokio::time::timeout(PROMPTLY, run).await.unwrap();
    let mut sleep = join(daemon).await;
    assert_eq!(sleep.wait().unwrap().signal(), Some(libc::SIGKILL));
}

/// A request whose reply came leaves nothing registered (its entry is
/// not removed a second time, so it must be gone already), nor does one
/// whose caller gave up; a late reply to the latter is dropped and the
/// connection carries on.
#[tokio::test]
async fn answered_and_cancelled_requests_leave_nothing_pending() {
    let (cancelled_tx, cancelled_rx) = std::sync::mpsc::channel::<()>();
    let (client_end, daemon) = fake_daemon(move |mut daemon| {
        daemon.accept_hello();
        let (sleep, pidfd) = sleeper();
        let next_spawn = |daemon: &mut FakeDaemon| match daemon.recv() {
            Some((ClientMessage::Spawn(request), _)) => request.id,
            other => panic!("expected Spawn, got {other:?}"),
        };
        let answered = next_spawn(&mut daemon);
        daemon.exited(answered, 3);
        let cancelled = next_spawn(&mut daemon);
        // Answer the cancelled request only once its caller has gone.
        cancelled_rx.recv().unwrap();
        daemon.spawned(cancelled, 4242, &[pidfd]);
        let last = next_spawn(&mut daemon);
        daemon.exited(last, 5);
        assert!(daemon.recv().is_none());
        reap(sleep);
    });
    let client = Client::from_fd(client_end).await.unwrap();
    let run = async {
        let status = Command::new(&client, "true").status().await.unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(client.pending_requests(), 0);

        let mut command = Command::new(&client, "sleep");
        command.stdin(Stdio::null());
        let give_up = tokio::time::timeout(Duration::from_millis(50), command.spawn()).await;
        assert!(give_up.is_err(), "the fake daemon does not answer yet");
        assert_eq!(client.pending_requests(), 0);
        cancelled_tx.send(()).unwrap();

        let status = Command::new(&client, "true").status().await.unwrap();
        assert_eq!(status.code(), Some(5));
        assert_eq!(client.pending_requests(), 0);
        assert!(client.is_connected());
    };
    tokio::time::timeout(PROMPTLY, run).await.unwrap();
    drop(client);
    join(daemon).await;
}

#[tokio::test]
async fn spawn_failure_carries_stage_and_errno() {
    let (client_end, daemon) = fake_daemon(|mut daemon| {
        daemon.accept_hello();
        let Some((ClientMessage::Spawn(request), _)) = daemon.recv() else {
            panic!("expected Spawn");
        };
        daemon.send(
            ServerMessage::SpawnFailed(SpawnFailed {
                id: request.id,
                stage: SpawnStage::Exec,
                errno: libc::ENOENT,
                message: "execve(\"nosuch\") failed".into(),
            }),
            &[],
        );
        assert!(daemon.recv().is_none());
    });
    let client = Client::from_fd(client_end).await.unwrap();
    let error = Command::new(&client, "nosuch").status().await.unwrap_err();
    match &error {
        Error::Spawn {
            program,
            stage,
            errno,
            ..
        } => {
            assert_eq!(program, "nosuch");
            assert_eq!(*stage, SpawnStage::Exec);
            assert_eq!(*errno, libc::ENOENT);
        }
        other => panic!("expected Spawn, got {other:?}"),
    }
    assert_eq!(
        std::io::Error::from(error).kind(),
        std::io::ErrorKind::NotFound
    );
    // A failed spawn does not end the connection.
    assert!(client.is_connected());
    drop(client);
    join(daemon).await;
}

/// The zygote answers in the newest version both know: the client reads
/// the `HelloAck` in that version's layout, keeps the features it names
/// (unknown ones too), and refuses a version it did not offer.
#[tokio::test]
async fn handshake_reads_the_version_the_zygote_picked() {
    let (client_end, daemon) = fake_daemon(|mut daemon| daemon.accept_hello());
    let client = Client::from_fd(client_end).await.unwrap();
    assert_eq!(client.protocol_version(), PROTOCOL_VERSION);
    assert!(client.offers(crate::Feature::Pty));
    assert!(!client.offers(crate::Feature::Cgroups));
    assert_eq!(client.features(), ["pty", "teleport"]);
    drop(client);
    join(daemon).await;

    let answer_in = |protocol_version| {
        fake_daemon(move |mut daemon| {
            assert!(matches!(daemon.recv(), Some((ClientMessage::Hello(_), _))));
            daemon.send(
                ServerMessage::HelloAck(HelloAck {
                    protocol_version,
                    server_version: "fake/1".into(),
                    limits: LIMITS,
                    features: Vec::new(),
                }),
                &[],
            );
            // Until the client closes.
            daemon.recv().map(|_| ())
        })
    };
    let (client_end, daemon) = answer_in(1);
    let client = Client::from_fd(client_end).await.unwrap();
    assert_eq!(client.protocol_version(), 1);
    assert!(client.features().is_empty());
    drop(client);
    join(daemon).await;

    let (client_end, daemon) = answer_in(PROTOCOL_VERSION + 1);
    let error = Client::from_fd(client_end).await.unwrap_err();
    assert!(matches!(error, Error::Handshake { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains(&format!("answered in version {}", PROTOCOL_VERSION + 1)),
        "{error}"
    );
    join(daemon).await;
}

#[tokio::test]
async fn handshake_refusal_is_a_protocol_error() {
    let (client_end, daemon) = fake_daemon(|mut daemon| {
        assert!(matches!(daemon.recv(), Some((ClientMessage::Hello(_), _))));
        daemon.send(
            ServerMessage::ProtocolError(ProtocolError {
                kind: ProtocolErrorKind::UnsupportedVersion,
                message: "this daemon speaks version 2".into(),
            }),
            &[],
        );
    });
    let error = Client::from_fd(client_end).await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Protocol {
                kind: ProtocolErrorKind::UnsupportedVersion,
                ..
            }
        ),
        "{error}"
    );
    join(daemon).await;

    let (client_end, daemon) = fake_daemon(|mut daemon| {
        assert!(matches!(daemon.recv(), Some((ClientMessage::Hello(_), _))));
    });
    let error = Client::from_fd(client_end).await.unwrap_err();
    assert!(matches!(error, Error::Handshake { .. }), "{error}");
    assert!(error.to_string().contains("expected HelloAck"), "{error}");
    join(daemon).await;
}

#[tokio::test]
async fn protocol_error_mid_connection_fails_pending_requests() {
    let (client_end, daemon) = fake_daemon(|mut daemon| {
        daemon.accept_hello();
        assert!(matches!(daemon.recv(), Some((ClientMessage::Spawn(_), _))));
        daemon.send(
            ServerMessage::ProtocolError(ProtocolError {
                kind: ProtocolErrorKind::Malformed,
                message: "bad frame".into(),
            }),
            &[],
        );
    });
    let client = Client::from_fd(client_end).await.unwrap();
    let error = tokio::time::timeout(PROMPTLY, Command::new(&client, "x").spawn())
        .await
        .unwrap()
        .unwrap_err();
    assert!(error.is_zygote_lost(), "{error}");
    assert!(error.to_string().contains("malformed"), "{error}");
    join(daemon).await;
}

#[tokio::test]
async fn output_reads_both_pipes_concurrently() {
    const SIZE: usize = 10 << 20;
    let (client_end, daemon) = fake_daemon(|mut daemon| {
        daemon.accept_hello();
        let Some((ClientMessage::Spawn(request), fds)) = daemon.recv() else {
            panic!("expected Spawn");
        };
        // output()'s defaults: pipes of its own, so Spawned may be skipped.
        assert_eq!(
            [request.stdin, request.stdout, request.stderr],
            [StdioSpec::Null, StdioSpec::Fd(0), StdioSpec::Fd(1)]
        );
        assert!(request.defer_spawned);
        let [out_write, err_write]: [OwnedFd; 2] = fds.try_into().unwrap();
        // A child still running after the window: Spawned, the pidfd alone.
        let (sleep, pidfd) = sleeper();
        daemon.spawned(request.id, 42, &[pidfd]);
        // All of stderr before any stdout, from one thread: a client that
        // drained stdout first would deadlock.
        File::from(err_write).write_all(&vec![b'e'; SIZE]).unwrap();
        File::from(out_write).write_all(&vec![b'o'; SIZE]).unwrap();
        daemon.exited(request.id, 0);
        assert!(daemon.recv().is_none());
        reap(sleep);
    });
    let client = Client::from_fd(client_end).await.unwrap();
    let output = tokio::time::timeout(PROMPTLY, Command::new(&client, "big").output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(output.stdout.len(), SIZE);
    assert_eq!(output.stderr.len(), SIZE);
    assert!(output.stdout.iter().all(|byte| *byte == b'o'));
    drop(client);
    join(daemon).await;
}

#[test]
fn blocking_client_serves_many_threads() {
    let (sleep, pidfd) = sleeper();
    let (client_end, daemon) = fake_daemon(move |daemon| serve_echo(daemon, pidfd));
    let client = blocking::Client::from_fd(client_end).unwrap();
    assert_eq!(client.server_version(), "fake/1");
    std::thread::scope(|scope| {
        for thread in 0..8 {
            let client = &client;
            scope.spawn(move || {
                for round in 0..5 {
                    let n = thread * 10 + round;
                    let output = blocking::Command::new(client, "echo")
                        .arg(n.to_string())
                        .output()
                        .unwrap();
                    assert_eq!(output.status.code(), Some(n));
                    assert_eq!(output.stdout, format!("out:{n}").as_bytes());
                    assert_eq!(output.stderr, format!("err:{n}").as_bytes());
                }
            });
        }
    });

    let mut child = client
        .command("echo")
        .arg("7")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(child.id(), 1007);
    child.stdin.as_mut().unwrap().write_all(b"ignored").unwrap();
    let mut text = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "out:7");
    child.signal(libc::SIGTERM).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(7));
    assert!(child.usage().is_some());

    let output = client
        .command("echo")
        .arg("9")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert_eq!(output.stdout, b"out:9");
    assert_eq!(
        client.command("x").arg("5").status().unwrap().code(),
        Some(5)
    );

    // The connection closes with the last client handle and child.
    drop(child);
    drop(client);
    daemon.join().unwrap();
    reap(sleep);
}

#[test]
fn blocking_wait_reads_the_pidfd_when_the_zygote_goes() {
    let (client_end, daemon) = fake_daemon(|mut daemon| {
        daemon.accept_hello();
        let (sleep, pidfd) = sleeper();
        let Some((ClientMessage::Spawn(request), _)) = daemon.recv() else {
            panic!("expected Spawn");
        };
        daemon.spawned(request.id, 7, &[pidfd]);
        sleep
    });
    let client = blocking::Client::from_fd(client_end).unwrap();
    let mut child = client
        .command("sleep")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let sleep = daemon.join().unwrap();
    // Running: the pidfd says so, with no error.
    assert!(matches!(child.try_wait(), Ok(None)));
    child.kill().unwrap();
    reap(sleep);
    // Reaped by its parent (this process): the pidfd gives the status on
    // Linux 6.15 and later; before, the loss stays the error.
    if kernel_keeps_exit_status() {
        let status = child.wait().expect("the status from the pidfd");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        assert!(status.zygote_lost());
        assert_eq!(child.usage(), None);
    } else {
        let error = child.wait().expect_err("no status before Linux 6.15");
        assert!(error.is_zygote_lost(), "{error}");
        assert!(error.to_string().contains("6.15"), "{error}");
    }
}

/// Whether this kernel keeps a reaped child's exit status for its pidfd
/// (`PIDFD_INFO_EXIT`, Linux 6.15).
fn kernel_keeps_exit_status() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("kernel release");
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse::<u32>().ok());
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0)) >= (6, 15)
}

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Client>();
    send_sync::<blocking::Client>();
    send_sync::<Command>();
    send_sync::<crate::Child>();
    send_sync::<blocking::Child>();
}

#[test]
fn spawn_future_is_send() {
    fn send<T: Send>(_: T) {}
    // Type-level only: never polled.
    fn check(command: &mut Command, socket: OwnedFd) {
        send(Client::from_fd(socket));
        send(Client::connect("/nonexistent"));
        send(command.spawn());
        send(command.output());
        send(command.status());
    }
    let _ = check;
}

/// Against a zygote of protocol version 2: the client sends its requests
/// in version 2's layouts and reads the replies in them (a version-3
/// `Spawned` would have a byte left over); a status reply from it has no
/// per-peer use.
#[tokio::test]
async fn a_version_2_zygote_is_spoken_to_in_its_layouts() {
    use zygote_proto::v2;
    let (sleeper, pidfd) = sleeper();
    let (client_end, daemon) = fake_daemon(move |mut daemon| {
        let frame = recv_frame(daemon.socket.as_fd(), &mut daemon.scratch)
            .unwrap()
            .unwrap();
        assert!(matches!(
            decode::<v2::ClientMessage>(&frame.bytes),
            Ok(v2::ClientMessage::Hello(_))
        ));
        daemon.send(
            ServerMessage::HelloAck(HelloAck {
                protocol_version: 2,
                server_version: "fake/2".into(),
                limits: LIMITS,
                features: vec!["pty".into()],
            }),
            &[],
        );
        let mut replies = Vec::new();
        while let Some(frame) = recv_frame(daemon.socket.as_fd(), &mut daemon.scratch).unwrap() {
            let reply = match decode::<v2::ClientMessage>(&frame.bytes) {
                Ok(v2::ClientMessage::Spawn(request)) => v2::ServerMessage::Spawned(v2::Spawned {
                    id: request.id,
                    pid: 4242,
                }),
                Ok(v2::ClientMessage::Status(request)) => {
                    v2::ServerMessage::Status(v2::StatusReply {
                        id: request.id,
                        server_version: "fake/2".into(),
                        pid: 1,
                        uptime_millis: 1,
                        connections_open: 1,
                        connections_accepted: 1,
                        children_running: 1,
                        spawns_succeeded: 1,
                        spawns_failed: 0,
                    })
                }
                other => panic!("not a version-2 request: {other:?}"),
            };
            let fds = match reply {
                v2::ServerMessage::Spawned(_) => vec![pidfd.as_fd()],
                _ => Vec::new(),
            };
            send_frame(daemon.socket.as_fd(), &encode(&reply).unwrap(), &fds).unwrap();
            replies.push(reply);
        }
        replies.len()
    });
    let client = Client::from_fd(client_end).await.unwrap();
    assert_eq!(client.protocol_version(), 2);
    let child = client.command("sleep").spawn().await.unwrap();
    assert_eq!(child.id(), 4242);
    assert_eq!(child.sandbox(), None);
    let status = client.status().await.unwrap();
    assert!(status.peers.is_empty() && status.spawners.is_empty());
    assert_eq!(status.server_version, "fake/2");
    drop(child);
    drop(client);
    assert_eq!(join(daemon).await, 2);
    reap(sleeper);
}

/// A fake zygote of version 3 that offers `features` and answers spawns
/// with `Spawned` (the sandbox echoed back as applied) and `Exited`;
/// returns the spawn requests it received.
fn sandbox_daemon(
    features: &'static [&'static str],
    pidfd: OwnedFd,
) -> (OwnedFd, JoinHandle<Vec<zygote_proto::SpawnRequest>>) {
    fake_daemon(move |mut daemon| {
        assert!(matches!(daemon.recv(), Some((ClientMessage::Hello(_), _))));
        daemon.send(
            ServerMessage::HelloAck(HelloAck {
                protocol_version: PROTOCOL_VERSION,
                server_version: "fake/3".into(),
                limits: LIMITS,
                features: features.iter().map(|name| (*name).to_owned()).collect(),
            }),
            &[],
        );
        let mut requests = Vec::new();
        while let Some((message, _)) = daemon.recv() {
            let ClientMessage::Spawn(request) = message else {
                panic!("expected Spawn, got {message:?}");
            };
            let applied = request
                .sandbox
                .as_ref()
                .map(|spec| zygote_proto::AppliedSandbox {
                    profile: spec.profile.clone(),
                    namespaces: vec!["mount".into()],
                    seccomp: Some("default".into()),
                    landlock_abi: Some(7),
                    landlock_complete: true,
                });
            let spawned = Spawned {
                id: request.id,
                pid: 4242,
                sandbox: applied,
            };
            daemon.send(ServerMessage::Spawned(spawned), &[pidfd.as_fd()]);
            daemon.exited(request.id, 0);
            requests.push(request);
        }
        requests
    })
}

/// A sandbox goes out to a zygote that offers it, in both flavours of
/// `Command`, and the child reports what was applied; to one that does
/// not, nothing is sent and the spawn fails with EOPNOTSUPP naming the
/// feature.
#[tokio::test]
async fn a_sandbox_is_sent_only_to_a_zygote_that_offers_it() {
    let (sleeper, pidfd) = sleeper();
    let (client_end, daemon) = sandbox_daemon(&["sandbox"], pidfd.try_clone().unwrap());
    let client = Client::from_fd(client_end).await.unwrap();
    let sandbox = crate::Sandbox::new()
        .profile("build")
        .ro_bind("/usr", "/usr");
    let mut child = client
        .command("true")
        .sandbox(sandbox.clone())
        .spawn()
        .await
        .unwrap();
    let applied = child.sandbox().expect("applied").clone();
    assert_eq!(applied.profile.as_deref(), Some("build"));
    assert_eq!(applied.landlock_abi, Some(7));
    child.wait().await.unwrap();
    let mut plain = client.command("true").spawn().await.unwrap();
    assert_eq!(plain.sandbox(), None);
    // Its exit read before the client leaves: the fake daemon sends it.
    plain.wait().await.unwrap();
    drop((child, plain));
    drop(client);
    let requests = join(daemon).await;
    assert_eq!(requests.len(), 2);
    let spec = requests[0].sandbox.as_ref().expect("the sandbox was sent");
    assert_eq!(spec.profile.as_deref(), Some("build"));
    assert_eq!(spec.filesystem.as_ref().unwrap().mounts[0].source, b"/usr");
    assert_eq!(requests[1].sandbox, None);

    let (client_end, daemon) = sandbox_daemon(&["pty"], pidfd);
    let client = Client::from_fd(client_end).await.unwrap();
    let error = client
        .command("true")
        .sandbox(sandbox)
        .spawn()
        .await
        .expect_err("not offered");
    assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP), "{error}");
    assert!(error.to_string().contains("feature sandbox"), "{error}");
    let relative = client
        .command("true")
        .sandbox(crate::Sandbox::new().landlock_rw("out"))
        .spawn()
        .await
        .expect_err("a relative path");
    assert!(
        matches!(relative, Error::Spawn { errno, .. } if errno == libc::EOPNOTSUPP),
        "{relative}"
    );
    assert!(client.command("true").status().await.unwrap().success());
    drop(client);
    let requests = join(daemon).await;
    assert_eq!(requests.len(), 1, "only the plain spawn was sent");
    assert_eq!(requests[0].sandbox, None);
    reap(sleeper);
}

/// The blocking `Command` sends a sandbox too, and its child reports what
/// was applied; a relative path is refused before anything is sent.
#[test]
fn the_blocking_command_sends_a_sandbox() {
    let (sleeper, pidfd) = sleeper();
    let (client_end, daemon) = sandbox_daemon(&["sandbox"], pidfd);
    let client = blocking::Client::from_fd(client_end).unwrap();
    let relative = blocking::Command::new(&client, "true")
        .sandbox(crate::Sandbox::new().bind("/srv", "work"))
        .spawn()
        .expect_err("a relative destination");
    assert!(matches!(relative, Error::InvalidInput { .. }), "{relative}");
    assert!(relative.to_string().contains("\"work\""), "{relative}");
    let mut child = blocking::Command::new(&client, "true")
        .sandbox(crate::Sandbox::new().isolate().network_none())
        .spawn()
        .unwrap();
    assert_eq!(
        child.sandbox().map(|applied| applied.namespaces.clone()),
        Some(vec!["mount".to_owned()])
    );
    child.wait().unwrap();
    drop(child);
    drop(client);
    let requests = daemon.join().unwrap();
    assert_eq!(requests.len(), 1, "the refused one was not sent");
    let spec = requests[0].sandbox.as_ref().expect("sent");
    assert!(spec.isolate);
    assert_eq!(spec.network, zygote_proto::NetworkMode::None);
    reap(sleeper);
}

mod templates;
