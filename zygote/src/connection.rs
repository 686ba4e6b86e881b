//! One client's conversation: handshake, then requests until it leaves.
//!
//! Each spawn runs in a task of its own, which after replying stays to reap
//! the child and send its exit notice. That task holds the socket only
//! weakly: a client that leaves closes its connection at once, and its
//! children are still reaped.
//!
//! When the daemon stops, a connection refuses new spawns, keeps answering
//! signal and status requests and delivering exit notices, and closes once
//! it has nothing in flight and no child running (see `server::run_with`).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};
use zygote_proto::{
    AsyncSeqpacket, ClientMessage, ExitNotice, Frame, HelloAck, LIMITS, PROTOCOL_VERSION,
    ProtoError, ProtocolError, ProtocolErrorKind, RECV_BUFFER_BYTES, RequestFailed, ServerMessage,
    SignalRequest, SignalSent, SpawnFailed, SpawnRequest, SpawnStage, Spawned, StatusReply, UCred,
    decode,
};

use crate::metrics::SpawnResult;
use crate::server::Daemon;
use crate::shutdown::Shutdown;
use crate::{plan, reaper, spawn, strerror};

/// Children started on one connection that have not been reaped yet, by
/// spawn id, for [`SignalRequest`]s.
type Children = Arc<Mutex<HashMap<u64, Arc<AsyncFd<OwnedFd>>>>>;

/// What one connection's tasks share.
#[derive(Clone)]
struct Shared {
    daemon: Arc<Daemon>,
    peer: Peer,
    children: Children,
    /// Spawns whose reply has not been sent yet.
    in_flight: Arc<AtomicUsize>,
    /// Woken when a spawn is answered or a child is reaped, so that a
    /// stopping connection notices it has become idle.
    changed: Arc<Notify>,
    /// Set when the connection has ended: its children's exits have
    /// nobody left to be told.
    left: watch::Receiver<bool>,
}

/// The peer's kernel-reported credentials, for logs.
#[derive(Debug, Clone, Copy)]
struct Peer {
    pid: i32,
    uid: u32,
}

impl Shared {
    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
            && self
                .children
                .lock()
                .expect("children lock poisoned")
                .is_empty()
    }
}

/// Serves one connection until the client closes it or breaks the
/// protocol, or the daemon stops and the connection has become idle.
pub async fn serve(socket: AsyncSeqpacket, peer: UCred, daemon: Arc<Daemon>, shutdown: Shutdown) {
    daemon.metrics.connection_opened();
    let (left_tx, left) = watch::channel(false);
    let shared = Shared {
        daemon: Arc::clone(&daemon),
        peer: Peer {
            pid: peer.pid.as_raw_nonzero().get(),
            uid: peer.uid.as_raw(),
        },
        children: Arc::default(),
        in_flight: Arc::default(),
        changed: Arc::default(),
        left,
    };
    serve_counted(socket, &shared, shutdown).await;
    left_tx.send_replace(true);
    daemon.metrics.connection_closed();
}

async fn serve_counted(socket: AsyncSeqpacket, shared: &Shared, mut shutdown: Shutdown) {
    let socket = Arc::new(socket);
    let daemon = &shared.daemon;
    let Peer { pid, uid } = shared.peer;
    if !daemon.may_connect(uid) {
        warn!(
            peer_pid = pid,
            peer_uid = uid,
            "refusing a peer of another uid"
        );
        let message = format!(
            "uid {uid} may not use this zygote, which serves uid {}",
            daemon.uid
        );
        close_with(
            &socket,
            daemon,
            ProtocolErrorKind::PermissionDenied,
            message,
        )
        .await;
        return;
    }
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let handshaken = tokio::select! {
        handshaken = handshake(&socket, &mut scratch) => handshaken,
        // A client that has not said hello has nothing to finish.
        () = shutdown.stopping() => return,
    };
    match handshaken {
        Ok(()) => {}
        // A probe (connect, then close) is not a protocol error.
        Err(None) => {
            debug!(peer_pid = pid, peer_uid = uid, "client left before hello");
            return;
        }
        Err(Some(failure)) => {
            debug!(peer_pid = pid, peer_uid = uid, reason = %failure.1, "handshake failed");
            close_with(&socket, daemon, failure.0, failure.1).await;
            return;
        }
    }
    debug!(peer_pid = pid, peer_uid = uid, "client connected");
    let mut stopping = false;
    loop {
        if stopping && shared.is_idle() {
            debug!(
                peer_pid = pid,
                peer_uid = uid,
                "closing an idle connection: stopping"
            );
            break;
        }
        let received = tokio::select! {
            received = socket.recv(&mut scratch) => received,
            () = shutdown.stopping(), if !stopping => {
                stopping = true;
                continue;
            }
            () = shared.changed.notified(), if stopping => continue,
        };
        let received_at = Instant::now();
        let frame = match received {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(error) if error.is_disconnect() => break,
            Err(error) => {
                let kind = match error {
                    ProtoError::FrameTooLarge { .. } | ProtoError::TooManyFds { .. } => {
                        ProtocolErrorKind::TooLarge
                    }
                    _ => ProtocolErrorKind::Malformed,
                };
                warn!(peer_pid = pid, peer_uid = uid, %error, "closing connection");
                close_with(&socket, daemon, kind, error.to_string()).await;
                break;
            }
        };
        let request = Request {
            frame,
            received_at,
            stopping,
        };
        if let Err((kind, message)) = dispatch(request, &socket, shared, &shutdown).await {
            warn!(peer_pid = pid, peer_uid = uid, reason = %message, "closing connection");
            close_with(&socket, daemon, kind, message).await;
            break;
        }
    }
    debug!(peer_pid = pid, peer_uid = uid, "client left");
}

/// One frame from the client, as received.
struct Request {
    frame: Frame,
    /// When it arrived: the start of a spawn's latency.
    received_at: Instant,
    /// Whether the daemon was stopping then.
    stopping: bool,
}

type Fatal = (ProtocolErrorKind, String);

/// The handshake; `Err(None)` when the client left before saying hello.
async fn handshake(socket: &AsyncSeqpacket, scratch: &mut [u8]) -> Result<(), Option<Fatal>> {
    let frame = match socket.recv(scratch).await {
        Ok(Some(frame)) => frame,
        Ok(None) => return Err(None),
        Err(error) if error.is_disconnect() => return Err(None),
        Err(error) => return Err(Some((ProtocolErrorKind::Malformed, error.to_string()))),
    };
    answer_hello(socket, &frame).await.map_err(Some)
}

async fn answer_hello(socket: &AsyncSeqpacket, frame: &Frame) -> Result<(), Fatal> {
    let hello = match decode_client(frame)? {
        ClientMessage::Hello(hello) => hello,
        other => {
            return Err((
                ProtocolErrorKind::UnexpectedMessage,
                format!("expected Hello first, received {}", message_name(&other)),
            ));
        }
    };
    if !frame.fds.is_empty() {
        return Err(unexpected_fds("Hello", frame.fds.len()));
    }
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err((
            ProtocolErrorKind::UnsupportedVersion,
            format!(
                "client speaks protocol version {}, this zygote speaks {PROTOCOL_VERSION}",
                hello.protocol_version
            ),
        ));
    }
    let ack = ServerMessage::HelloAck(HelloAck {
        protocol_version: PROTOCOL_VERSION,
        server_version: env!("CARGO_PKG_VERSION").to_owned(),
        limits: LIMITS,
    });
    socket
        .send_message(&ack, &[])
        .await
        .map_err(|error| (ProtocolErrorKind::Malformed, error.to_string()))
}

fn decode_client(frame: &Frame) -> Result<ClientMessage, Fatal> {
    decode(&frame.bytes).map_err(|error| (ProtocolErrorKind::Malformed, error.to_string()))
}

fn unexpected_fds(message: &str, count: usize) -> Fatal {
    (
        ProtocolErrorKind::UnexpectedFds,
        format!("{message} takes no fds, but the frame carried {count}"),
    )
}

fn message_name(message: &ClientMessage) -> &'static str {
    match message {
        ClientMessage::Hello(_) => "Hello",
        ClientMessage::Spawn(_) => "Spawn",
        ClientMessage::Signal(_) => "Signal",
        ClientMessage::Status(_) => "Status",
    }
}

async fn dispatch(
    request: Request,
    socket: &Arc<AsyncSeqpacket>,
    shared: &Shared,
    shutdown: &Shutdown,
) -> Result<(), Fatal> {
    let Request {
        frame,
        received_at,
        stopping,
    } = request;
    match decode_client(&frame)? {
        ClientMessage::Hello(_) => Err((
            ProtocolErrorKind::UnexpectedMessage,
            "received a second Hello".into(),
        )),
        ClientMessage::Spawn(request) if stopping => {
            drop(frame.fds);
            let refused = SpawnFailed {
                id: request.id,
                stage: SpawnStage::Admission,
                errno: libc::ESHUTDOWN,
                message: "the zygote is shutting down".into(),
            };
            send_reply(socket, &ServerMessage::SpawnFailed(refused), &[]).await;
            shared
                .daemon
                .metrics
                .spawn_done(SpawnResult::Refused, received_at.elapsed());
            Ok(())
        }
        ClientMessage::Spawn(request) => {
            shared.in_flight.fetch_add(1, Ordering::AcqRel);
            let task = SpawnTask {
                socket: Arc::downgrade(socket),
                shared: shared.clone(),
                shutdown: shutdown.clone(),
                received_at,
                answered: false,
            };
            // A task per spawn, so that concurrent requests on one
            // connection do not queue behind each other's exec.
            tokio::spawn(task.run(request, frame.fds));
            Ok(())
        }
        ClientMessage::Signal(request) => {
            if !frame.fds.is_empty() {
                return Err(unexpected_fds("Signal", frame.fds.len()));
            }
            let reply = signal(&request, &shared.children);
            send_reply(socket, &reply, &[]).await;
            Ok(())
        }
        ClientMessage::Status(request) => {
            if !frame.fds.is_empty() {
                return Err(unexpected_fds("Status", frame.fds.len()));
            }
            let reply = ServerMessage::Status(shared.daemon.status(request.id));
            send_reply(socket, &reply, &[]).await;
            Ok(())
        }
    }
}

fn signal(request: &SignalRequest, children: &Children) -> ServerMessage {
    let pidfd = children
        .lock()
        .expect("children lock poisoned")
        .get(&request.spawn_id)
        .cloned();
    let result = match pidfd {
        None => Err((
            libc::ESRCH,
            format!(
                "no running child of spawn {} on this connection",
                request.spawn_id
            ),
        )),
        Some(pidfd) => {
            spawn::send_signal(pidfd.get_ref().as_fd(), request.signal).map_err(|error| {
                (
                    error.raw_os_error().unwrap_or(libc::EIO),
                    format!("failed to send signal {}: {error}", request.signal),
                )
            })
        }
    };
    match result {
        Ok(()) => ServerMessage::SignalSent(SignalSent { id: request.id }),
        Err((errno, message)) => ServerMessage::RequestFailed(RequestFailed {
            id: request.id,
            errno,
            message,
        }),
    }
}

/// Sends a reply; a client that already left is not an error.
async fn send_reply(socket: &AsyncSeqpacket, message: &ServerMessage, fds: &[BorrowedFd<'_>]) {
    if let Err(error) = socket.send_message(message, fds).await {
        if !error.is_disconnect() {
            warn!(%error, "failed to send a reply");
        }
    }
}

async fn close_with(
    socket: &AsyncSeqpacket,
    daemon: &Daemon,
    kind: ProtocolErrorKind,
    message: String,
) {
    daemon.metrics.protocol_error(kind);
    let reply = ServerMessage::ProtocolError(ProtocolError { kind, message });
    send_reply(socket, &reply, &[]).await;
}

/// One spawn, from request to exit notice.
struct SpawnTask {
    socket: Weak<AsyncSeqpacket>,
    shared: Shared,
    /// Held until the task ends: the daemon's stop waits for it.
    shutdown: Shutdown,
    received_at: Instant,
    /// Whether the reply has been sent (and `in_flight` decremented).
    answered: bool,
}

impl SpawnTask {
    async fn run(mut self, request: SpawnRequest, attached: Vec<OwnedFd>) {
        let id = request.id;
        let program = String::from_utf8_lossy(&request.program).into_owned();
        let Peer {
            pid: peer_pid,
            uid: peer_uid,
        } = self.shared.peer;
        let prepared = match plan::prepare(&request, attached) {
            Ok(prepared) => prepared,
            Err(refusal) => {
                let failed = SpawnFailed {
                    id,
                    stage: refusal.stage,
                    errno: refusal.errno.raw_os_error(),
                    message: refusal.message,
                };
                warn!(peer_pid, peer_uid, program, stage = failed.stage.name(), reason = %failed.message, "spawn refused");
                self.answer(
                    &ServerMessage::SpawnFailed(failed),
                    &[],
                    SpawnResult::Refused,
                )
                .await;
                return;
            }
        };
        let spawned = spawn::spawn(&prepared.plan);
        // The daemon's copies of the child's fds must not outlive the spawn.
        drop(prepared.plan);
        let child = match spawned {
            Ok(child) => child,
            Err(error) => {
                let reason = strerror(error.errno);
                warn!(
                    peer_pid,
                    peer_uid,
                    program,
                    stage = error.stage.name(),
                    errno = error.errno,
                    reason,
                    "spawn failed"
                );
                if error.stage == SpawnStage::Exec {
                    self.shared.daemon.metrics.exec_failed(error.errno);
                }
                let failed = SpawnFailed {
                    id,
                    stage: error.stage,
                    errno: error.errno,
                    message: format!("{program}: {reason}"),
                };
                self.answer(
                    &ServerMessage::SpawnFailed(failed),
                    &[],
                    SpawnResult::Failed,
                )
                .await;
                return;
            }
        };
        let pid = child.pid;
        let pidfd = match zygote_proto::register(child.pidfd, Interest::READABLE) {
            Ok(pidfd) => Arc::new(pidfd),
            Err(error) => {
                // Cannot happen short of epoll failing; the child is then
                // neither watched nor reported, so say so loudly.
                warn!(pid, %error, "failed to watch a child's pidfd; it will not be reaped");
                self.finish_in_flight();
                return;
            }
        };
        let metrics = &self.shared.daemon.metrics;
        metrics.child_started();
        self.shared
            .children
            .lock()
            .expect("children lock poisoned")
            .insert(id, Arc::clone(&pidfd));
        let mut fds: Vec<BorrowedFd<'_>> = vec![pidfd.get_ref().as_fd()];
        fds.extend(prepared.client_ends.iter().map(AsFd::as_fd));
        let latency = self
            .answer(
                &ServerMessage::Spawned(Spawned { id, pid }),
                &fds,
                SpawnResult::Ok,
            )
            .await;
        drop(fds);
        drop(prepared.client_ends);
        debug!(
            peer_pid,
            peer_uid,
            program,
            pid,
            latency_us = latency.as_micros() as u64,
            "spawned"
        );

        let exit = tokio::select! {
            exit = reaper::wait_exit(&pidfd) => exit,
            () = self.abandoned() => {
                debug!(pid, "leaving a child to the system's reaper: the daemon is stopping and its client has left");
                return;
            }
        };
        self.shared
            .children
            .lock()
            .expect("children lock poisoned")
            .remove(&id);
        let metrics = &self.shared.daemon.metrics;
        metrics.child_reaped(exit.as_ref().ok().map(|(status, _)| status));
        match exit {
            Ok((status, usage)) => {
                debug!(pid, ?status, "child exited");
                let notice = ExitNotice {
                    id,
                    status,
                    usage,
                    timed_out: false,
                };
                self.reply(&ServerMessage::Exited(notice), &[]).await;
            }
            Err(error) => warn!(pid, %error, "failed to reap a child"),
        }
        self.shared.changed.notify_one();
    }

    /// Resolves when nobody will ever want this child's exit: the daemon
    /// is stopping and the child's client has gone.
    async fn abandoned(&self) {
        let mut shutdown = self.shutdown.clone();
        let mut left = self.shared.left.clone();
        shutdown.stopping().await;
        let _ = left.wait_for(|left| *left).await;
    }

    /// Sends the spawn's reply, records its result and latency, and
    /// returns the latency.
    async fn answer(
        &mut self,
        message: &ServerMessage,
        fds: &[BorrowedFd<'_>],
        result: SpawnResult,
    ) -> std::time::Duration {
        self.reply(message, fds).await;
        let latency = self.received_at.elapsed();
        self.shared.daemon.metrics.spawn_done(result, latency);
        self.finish_in_flight();
        latency
    }

    fn finish_in_flight(&mut self) {
        if !self.answered {
            self.answered = true;
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.shared.changed.notify_one();
        }
    }

    async fn reply(&self, message: &ServerMessage, fds: &[BorrowedFd<'_>]) {
        if let Some(socket) = self.socket.upgrade() {
            send_reply(&socket, message, fds).await;
        }
    }
}

impl Drop for SpawnTask {
    /// A task that ends early (the runtime is dropped) must not leave its
    /// connection waiting for it.
    fn drop(&mut self) {
        self.finish_in_flight();
    }
}

impl Daemon {
    fn status(&self, id: u64) -> StatusReply {
        let metrics = &self.metrics;
        StatusReply {
            id,
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: rustix::process::getpid().as_raw_nonzero().get(),
            uptime_millis: self.started.elapsed().as_millis() as u64,
            connections_open: metrics.connections_open(),
            connections_accepted: metrics.connections_accepted(),
            children_running: metrics.children_running(),
            spawns_succeeded: metrics.spawns(SpawnResult::Ok),
            spawns_failed: metrics.spawns(SpawnResult::Failed)
                + metrics.spawns(SpawnResult::Refused),
        }
    }

    fn may_connect(&self, uid: u32) -> bool {
        uid == self.uid || uid == 0
    }
}
