//! One client's conversation: handshake, then requests until it leaves.
//!
//! Each spawn runs in a task of its own, which after replying stays to reap
//! the child and send its exit notice. That task holds the socket only
//! weakly: a client that leaves closes its connection at once, and its
//! children are still reaped.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracing::{debug, warn};
use zygote_proto::{
    AsyncSeqpacket, ClientMessage, ExitNotice, Frame, HelloAck, LIMITS, PROTOCOL_VERSION,
    ProtoError, ProtocolError, ProtocolErrorKind, RECV_BUFFER_BYTES, RequestFailed, ServerMessage,
    SignalRequest, SignalSent, SpawnFailed, SpawnRequest, Spawned, StatusReply, UCred, decode,
};

use crate::server::Daemon;
use crate::{plan, reaper, spawn, strerror};

/// Children started on one connection that have not been reaped yet, by
/// spawn id, for [`SignalRequest`]s.
type Children = Arc<Mutex<HashMap<u64, Arc<AsyncFd<OwnedFd>>>>>;

/// Serves one connection until the client closes it or breaks the
/// protocol.
pub async fn serve(socket: AsyncSeqpacket, peer: UCred, daemon: Arc<Daemon>) {
    daemon.connections_accepted.fetch_add(1, Ordering::Relaxed);
    daemon.connections_open.fetch_add(1, Ordering::Relaxed);
    serve_counted(socket, peer, &daemon).await;
    daemon.connections_open.fetch_sub(1, Ordering::Relaxed);
}

async fn serve_counted(socket: AsyncSeqpacket, peer: UCred, daemon: &Arc<Daemon>) {
    let socket = Arc::new(socket);
    let peer_desc = format!(
        "pid {} uid {}",
        peer.pid.as_raw_nonzero(),
        peer.uid.as_raw()
    );
    if !daemon.may_connect(&peer) {
        warn!(peer = %peer_desc, "refusing a peer of another uid");
        let message = format!(
            "uid {} may not use this zygote, which serves uid {}",
            peer.uid.as_raw(),
            daemon.uid
        );
        close_with(&socket, ProtocolErrorKind::PermissionDenied, message).await;
        return;
    }
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    if let Err(failure) = handshake(&socket, &mut scratch).await {
        debug!(peer = %peer_desc, reason = %failure.1, "handshake failed");
        close_with(&socket, failure.0, failure.1).await;
        return;
    }
    debug!(peer = %peer_desc, "client connected");
    let children: Children = Arc::default();
    loop {
        let frame = match socket.recv(&mut scratch).await {
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
                warn!(peer = %peer_desc, %error, "closing connection");
                close_with(&socket, kind, error.to_string()).await;
                break;
            }
        };
        if let Err((kind, message)) = dispatch(frame, &socket, &children, daemon).await {
            warn!(peer = %peer_desc, reason = %message, "closing connection");
            close_with(&socket, kind, message).await;
            break;
        }
    }
    debug!(peer = %peer_desc, "client left");
}

type Fatal = (ProtocolErrorKind, String);

async fn handshake(socket: &AsyncSeqpacket, scratch: &mut [u8]) -> Result<(), Fatal> {
    let frame = match socket.recv(scratch).await {
        Ok(Some(frame)) => frame,
        Ok(None) => return Err((ProtocolErrorKind::Malformed, "closed before hello".into())),
        Err(error) => return Err((ProtocolErrorKind::Malformed, error.to_string())),
    };
    let hello = match decode_client(&frame)? {
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
    frame: Frame,
    socket: &Arc<AsyncSeqpacket>,
    children: &Children,
    daemon: &Arc<Daemon>,
) -> Result<(), Fatal> {
    match decode_client(&frame)? {
        ClientMessage::Hello(_) => Err((
            ProtocolErrorKind::UnexpectedMessage,
            "received a second Hello".into(),
        )),
        ClientMessage::Spawn(request) => {
            let task = SpawnTask {
                socket: Arc::downgrade(socket),
                children: Arc::clone(children),
                daemon: Arc::clone(daemon),
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
            let reply = signal(&request, children);
            send_reply(socket, &reply, &[]).await;
            Ok(())
        }
        ClientMessage::Status(request) => {
            if !frame.fds.is_empty() {
                return Err(unexpected_fds("Status", frame.fds.len()));
            }
            let reply = ServerMessage::Status(daemon.status(request.id));
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

async fn close_with(socket: &AsyncSeqpacket, kind: ProtocolErrorKind, message: String) {
    let reply = ServerMessage::ProtocolError(ProtocolError { kind, message });
    send_reply(socket, &reply, &[]).await;
}

/// One spawn, from request to exit notice.
struct SpawnTask {
    socket: Weak<AsyncSeqpacket>,
    children: Children,
    daemon: Arc<Daemon>,
}

impl SpawnTask {
    async fn run(self, request: SpawnRequest, attached: Vec<OwnedFd>) {
        let started = Instant::now();
        let id = request.id;
        let program = String::from_utf8_lossy(&request.program).into_owned();
        let prepared = match plan::prepare(&request, attached) {
            Ok(prepared) => prepared,
            Err(refusal) => {
                let failed = SpawnFailed {
                    id,
                    stage: refusal.stage,
                    errno: refusal.errno.raw_os_error(),
                    message: refusal.message,
                };
                warn!(program, reason = %failed.message, "spawn refused");
                self.daemon.spawns_failed.fetch_add(1, Ordering::Relaxed);
                self.reply(&ServerMessage::SpawnFailed(failed), &[]).await;
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
                warn!(program, stage = error.stage.name(), reason, "spawn failed");
                self.daemon.spawns_failed.fetch_add(1, Ordering::Relaxed);
                let failed = SpawnFailed {
                    id,
                    stage: error.stage,
                    errno: error.errno,
                    message: format!("{program}: {reason}"),
                };
                self.reply(&ServerMessage::SpawnFailed(failed), &[]).await;
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
                return;
            }
        };
        self.daemon.spawns_succeeded.fetch_add(1, Ordering::Relaxed);
        self.daemon.children_running.fetch_add(1, Ordering::Relaxed);
        self.children
            .lock()
            .expect("children lock poisoned")
            .insert(id, Arc::clone(&pidfd));
        let mut fds: Vec<BorrowedFd<'_>> = vec![pidfd.get_ref().as_fd()];
        fds.extend(prepared.client_ends.iter().map(AsFd::as_fd));
        self.reply(&ServerMessage::Spawned(Spawned { id, pid }), &fds)
            .await;
        drop(fds);
        drop(prepared.client_ends);
        debug!(
            program,
            pid,
            latency_us = started.elapsed().as_micros() as u64,
            "spawned"
        );

        let exit = reaper::wait_exit(&pidfd).await;
        self.children
            .lock()
            .expect("children lock poisoned")
            .remove(&id);
        self.daemon.children_running.fetch_sub(1, Ordering::Relaxed);
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
    }

    async fn reply(&self, message: &ServerMessage, fds: &[BorrowedFd<'_>]) {
        if let Some(socket) = self.socket.upgrade() {
            send_reply(&socket, message, fds).await;
        }
    }
}

impl Daemon {
    fn status(&self, id: u64) -> StatusReply {
        let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        StatusReply {
            id,
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: rustix::process::getpid().as_raw_nonzero().get(),
            uptime_millis: self.started.elapsed().as_millis() as u64,
            connections_open: load(&self.connections_open),
            connections_accepted: load(&self.connections_accepted),
            children_running: load(&self.children_running),
            spawns_succeeded: load(&self.spawns_succeeded),
            spawns_failed: load(&self.spawns_failed),
        }
    }

    fn may_connect(&self, peer: &UCred) -> bool {
        let uid = peer.uid.as_raw();
        uid == self.uid || uid == 0
    }
}
