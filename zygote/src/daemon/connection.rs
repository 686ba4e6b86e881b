//! One client's conversation: identify the peer, handshake, then
//! requests until it leaves.
//!
//! Each spawn runs in a task of its own (`lifetime`), which after replying
//! stays to reap the child and send its exit notice. Replies go through the
//! connection's `outbox`, which one writer sends: no task waits for the
//! client to read, and the connection stops reading requests while the
//! client leaves too many unread. A client that leaves closes its
//! connection at once, and its children are still reaped.
//!
//! When the daemon stops, a connection refuses new spawns, keeps answering
//! signal and status requests and delivering exit notices, and closes once
//! it has nothing in flight and no child running (see `server::run_with`).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::{Notify, Semaphore, watch};
use tracing::{debug, warn};
use zygote_proto::Feature;
use zygote_proto::{
    AsyncSeqpacket, ClientMessage, FEATURES_SINCE, Frame, HelloAck, LIMITS,
    OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, ProtoError, ProtocolError, ProtocolErrorKind,
    RECV_BUFFER_BYTES, RequestFailed, ServerMessage, SignalRequest, SignalSent, SpawnFailed,
    SpawnRequest, SpawnStage, StatusReply, TemplateList, TemplateListRequest, TemplateReady,
    TemplateRequest, UCred, negotiate,
};

use crate::daemon::admission;
use crate::daemon::handover::{Active, SavedConnection};
use crate::daemon::lifetime::{self, Connection, SpawnTask};
use crate::daemon::outbox::{Bounds, Outbox, Wait};
use crate::daemon::peer::Peer;
use crate::daemon::plan::DevNull;
use crate::daemon::policy::{Grant, MAX_UNREAD_FDS};
use crate::daemon::reply::send_reply;
use crate::daemon::shutdown::Shutdown;
use crate::daemon::state::{Closable, Daemon, UpgradeAsk};
use crate::service::metrics::SpawnResult;
use crate::spawn;

/// Spawns of one connection that may be in flight beyond its child limit:
/// refusals being sent, and final replies a slow client has not read.
const IN_FLIGHT_HEADROOM: usize = 256;

/// What a client may leave unanswered or unread on one connection (see
/// `outbox`): spawns read and not yet answered, plus replies not yet read.
/// At the bound the connection stops reading requests, and the client's
/// socket buffer pushes back on it; so a client that never reads its
/// replies starts at most this many children per connection.
const MAX_UNANSWERED: usize = 64;

/// How long a connection may stay held back by its unread replies, its
/// children all finished, before it is closed (its replies dropped): a
/// client that reads nothing for this long has left in all but name.
const STUCK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Connections being refused at once, beyond the connection table.
const REFUSING_AT_ONCE: usize = 64;

/// How long a client has from connecting to sending its `Hello`: a
/// connection that says nothing must not hold a place in the table.
const HANDSHAKE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves one connection until the client closes it or breaks the
/// protocol, or the daemon stops and the connection has become idle.
///
/// `active` is the connection's share of the daemon's pause (taken when it
/// was accepted, so that no upgrade can miss it).
pub async fn serve(
    socket: AsyncSeqpacket,
    cred: UCred,
    daemon: Arc<Daemon>,
    shutdown: Shutdown,
    active: Active,
) {
    daemon.metrics.connection_opened();
    serve_opened(socket, cred, daemon, shutdown, active).await;
}

/// As [`serve`], for a connection already counted as accepted (one an
/// earlier image handed over before its handshake).
async fn serve_opened(
    socket: AsyncSeqpacket,
    cred: UCred,
    daemon: Arc<Daemon>,
    shutdown: Shutdown,
    active: Active,
) {
    // The table itself is checked once the peer is known (`admission`).
    // This bounds the connections being refused on top of it, which hold
    // an fd for up to a second each: beyond it, close without an answer.
    let open = daemon.metrics.connections_open();
    let hard_limit = daemon.policy.limits.max_connections + REFUSING_AT_ONCE;
    if open > hard_limit as u64 {
        debug!(
            peer_pid = cred.pid.as_raw_nonzero(),
            peer_uid = cred.uid.as_raw(),
            peer_gid = cred.gid.as_raw(),
            "closing a connection unanswered: far over the connection limit"
        );
    } else {
        // Held while this connection works: a live upgrade waits for it to
        // be between frames.
        serve_counted(socket, &cred, &daemon, shutdown, active).await;
    }
    daemon.metrics.connection_closed();
}

/// A connection's shared state, new or restored after an upgrade, that
/// speaks protocol `version`; `left` when its client is already gone.
fn new_connection(
    socket: Weak<AsyncSeqpacket>,
    peer: Peer,
    grant: Grant,
    version: u32,
    left: bool,
) -> Arc<Connection> {
    // Running children are capped by admission; the headroom is for
    // requests being refused or replies the client has not read yet.
    let max_in_flight = grant.max_children.saturating_add(IN_FLIGHT_HEADROOM);
    let outbox = Outbox::new(
        Bounds {
            replies: MAX_UNANSWERED,
            fds: MAX_UNREAD_FDS,
        },
        version,
    );
    if left {
        // Nobody to send to: replies are dropped as they come.
        outbox.close(false);
    }
    let (left, _) = watch::channel(left);
    Arc::new(Connection {
        socket,
        peer,
        grant,
        version,
        state: Mutex::default(),
        in_flight: Arc::new(Semaphore::new(max_in_flight)),
        max_in_flight,
        changed: Notify::new(),
        left,
        outbox,
        dev_null: DevNull::default(),
    })
}

async fn serve_counted(
    socket: AsyncSeqpacket,
    cred: &UCred,
    daemon: &Arc<Daemon>,
    mut shutdown: Shutdown,
    mut active: Active,
) {
    let socket = Arc::new(socket);
    let peer = match Peer::identify(socket.as_fd(), cred, Path::new("/proc")) {
        Ok(peer) => peer,
        Err(error) => {
            if let Some(suppressed) = daemon.log_limit.allow(cred.uid.as_raw()) {
                warn!(
                    peer_pid = cred.pid.as_raw_nonzero(),
                    peer_uid = cred.uid.as_raw(),
                    peer_gid = cred.gid.as_raw(),
                    %error,
                    suppressed,
                    "refusing a peer that cannot be identified"
                );
            }
            let message = format!("cannot identify this peer: {error}");
            refuse(
                &socket,
                daemon,
                ProtocolErrorKind::PermissionDenied,
                message,
            )
            .await;
            return;
        }
    };
    let grant = match daemon.policy.admit(&peer, daemon.uid) {
        Ok(grant) => grant,
        Err(denied) => {
            if let Some(suppressed) = daemon.log_limit.allow(peer.uid) {
                warn!(
                    peer_pid = peer.pid,
                    peer_uid = peer.uid,
                    peer_gid = peer.gid,
                    reason = %denied.0,
                    suppressed,
                    "refusing a peer by policy"
                );
            }
            refuse(
                &socket,
                daemon,
                ProtocolErrorKind::PermissionDenied,
                denied.0,
            )
            .await;
            return;
        }
    };
    let _slot = match admission::reserve_connection(daemon, peer.uid, grant.max_connections) {
        Ok(slot) => slot,
        Err(busy) => {
            // DEBUG: one line per attempt would let a peer flood the log.
            debug!(
                peer_pid = peer.pid,
                peer_uid = peer.uid,
                peer_gid = peer.gid,
                reason = %busy,
                "refusing a connection"
            );
            refuse(&socket, daemon, ProtocolErrorKind::Busy, busy).await;
            return;
        }
    };
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let deadline = tokio::time::Instant::now() + HANDSHAKE_DEADLINE;
    let hello = loop {
        tokio::select! {
            received = socket.recv(&mut scratch) => break received,
            () = tokio::time::sleep_until(deadline) => {
                debug!(
                    peer_pid = peer.pid,
                    peer_uid = peer.uid,
                    peer_gid = peer.gid,
                    "closing a connection that sent no hello in time"
                );
                let message = format!(
                    "no Hello within {} s of connecting; closing",
                    HANDSHAKE_DEADLINE.as_secs()
                );
                close_with(&socket, daemon, ProtocolErrorKind::UnexpectedMessage, message).await;
                return;
            }
            // A client that has not said hello has nothing to finish.
            () = shutdown.stopping() => return,
            // Nothing read yet: a new image serves it from the start.
            () = active.requested() => {
                let _parked = ParkedSocket::new(daemon, &socket);
                active.park().await;
            }
        }
    };
    // Once the hello is read, it is answered before any park.
    let handshaken = handshake(&socket, daemon, hello).await;
    let version = match handshaken {
        Ok(version) => version,
        // A probe (connect, then close) is not a protocol error.
        Err(None) => {
            debug!(
                peer_pid = peer.pid,
                peer_uid = peer.uid,
                peer_gid = peer.gid,
                "client left before hello"
            );
            return;
        }
        Err(Some(failure)) => {
            debug!(
                peer_pid = peer.pid,
                peer_uid = peer.uid,
                peer_gid = peer.gid,
                reason = %failure.1,
                "handshake failed"
            );
            close_with(&socket, daemon, failure.0, failure.1).await;
            return;
        }
    };
    // One connection per `zygote run`: DEBUG, as per-spawn lines are.
    debug!(
        peer_pid = peer.pid,
        peer_uid = peer.uid,
        peer_gid = peer.gid,
        peer_groups = ?peer.groups,
        "client connected"
    );
    let connection = new_connection(Arc::downgrade(&socket), peer, grant, version, false);
    daemon.register(&connection);
    serve_requests(&socket, &connection, daemon, shutdown, active, scratch).await;
}

/// Serves a connection an earlier image of this daemon handed over, past
/// its handshake, sending `first` before anything else (the answer to the
/// `Upgrade` request that asked for the new image).
pub(crate) async fn serve_restored(
    socket: Arc<AsyncSeqpacket>,
    connection: Arc<Connection>,
    daemon: Arc<Daemon>,
    shutdown: Shutdown,
    active: Active,
    first: Option<u64>,
) {
    let _slot = admission::reserve_connection(&daemon, connection.peer.uid, usize::MAX).ok();
    daemon.metrics.connection_restored();
    if let Some(id) = first {
        let status = daemon.status(id, &connection.peer);
        send_reply(
            &socket,
            &ServerMessage::Status(status),
            connection.version,
            &[],
        )
        .await;
    }
    let scratch = vec![0u8; RECV_BUFFER_BYTES];
    serve_requests(&socket, &connection, &daemon, shutdown, active, scratch).await;
    daemon.metrics.connection_closed();
}

/// Requests after the handshake, until the client leaves.
async fn serve_requests(
    socket: &Arc<AsyncSeqpacket>,
    connection: &Arc<Connection>,
    daemon: &Arc<Daemon>,
    mut shutdown: Shutdown,
    mut active: Active,
    mut scratch: Vec<u8>,
) {
    let outbox = &connection.outbox;
    tokio::spawn(Arc::clone(outbox).write(Arc::clone(socket), shutdown.clone()));
    let mut stopping = false;
    // Since when the client's unread replies hold the connection back.
    let mut held_since = None;
    // Whether the replies still queued go out once the loop ends.
    let drain = loop {
        if stopping && connection.is_idle() {
            debug!(
                peer_pid = connection.peer.pid,
                peer_uid = connection.peer.uid,
                peer_gid = connection.peer.gid,
                "closing an idle connection: stopping"
            );
            break true;
        }
        let room = outbox.room_for_request(socket);
        let now = tokio::time::Instant::now();
        held_since = if room { None } else { held_since.or(Some(now)) };
        let stuck_at = held_since.map_or(now, |since| since + STUCK_DEADLINE);
        let received = tokio::select! {
            received = socket.recv_in(&mut scratch), if room => received,
            // Held back: the client has too much unanswered or unread.
            wait = outbox.wait_for_room(socket), if !room => match wait {
                Wait::Room => continue,
                Wait::Left => break false,
            },
            () = tokio::time::sleep_until(stuck_at), if !room => {
                if connection.is_idle() {
                    if let Some(suppressed) = daemon.log_limit.allow(connection.peer.uid) {
                        warn!(
                            peer_pid = connection.peer.pid,
                            peer_uid = connection.peer.uid,
                            peer_gid = connection.peer.gid,
                            suppressed,
                            "closing a connection that reads none of its replies"
                        );
                    }
                    break false;
                }
                // Its children still run: look again in a second.
                let again = STUCK_DEADLINE - std::time::Duration::from_secs(1);
                held_since = Some(now.checked_sub(again).unwrap_or(now));
                continue;
            }
            () = shutdown.stopping(), if !stopping => {
                stopping = true;
                continue;
            }
            () = connection.changed.notified(), if stopping => continue,
            // Between frames: nothing read is left unanswered.
            () = active.requested() => {
                active.park().await;
                continue;
            }
        };
        let received_at = Instant::now();
        let received = match received {
            Ok(Some(received)) => received,
            Ok(None) => break false,
            Err(error) if error.is_disconnect() => break false,
            Err(error) => {
                let kind = match error {
                    ProtoError::FrameTooLarge { .. } | ProtoError::TooManyFds { .. } => {
                        ProtocolErrorKind::TooLarge
                    }
                    _ => ProtocolErrorKind::Malformed,
                };
                if let Some(suppressed) = daemon.log_limit.allow(connection.peer.uid) {
                    warn!(
                        peer_pid = connection.peer.pid,
                        peer_uid = connection.peer.uid,
                        peer_gid = connection.peer.gid,
                        %error,
                        suppressed,
                        "closing connection"
                    );
                }
                fail_connection(connection, daemon, kind, error.to_string());
                break true;
            }
        };
        // Decoded where it was received: no copy per request.
        let request = Request {
            bytes: &scratch[..received.len],
            fds: received.fds,
            received_at,
            stopping,
        };
        if let Err((kind, message)) =
            dispatch(request, socket, connection, daemon, &shutdown, &active).await
        {
            if let Some(suppressed) = daemon.log_limit.allow(connection.peer.uid) {
                warn!(
                    peer_pid = connection.peer.pid,
                    peer_uid = connection.peer.uid,
                    peer_gid = connection.peer.gid,
                    reason = %message,
                    suppressed,
                    "closing connection"
                );
            }
            fail_connection(connection, daemon, kind, message);
            break true;
        }
    };
    outbox.close(drain);
    lifetime::connection_closed(connection);
    debug!(
        peer_pid = connection.peer.pid,
        peer_uid = connection.peer.uid,
        peer_gid = connection.peer.gid,
        "client left"
    );
}

/// Queues a `ProtocolError` as the connection's last reply.
fn fail_connection(
    connection: &Connection,
    daemon: &Daemon,
    kind: ProtocolErrorKind,
    message: String,
) {
    daemon.metrics.protocol_error(kind);
    let reply = ServerMessage::ProtocolError(ProtocolError { kind, message });
    connection.reply(daemon, reply);
}

/// One frame from the client, as received.
struct Request<'a> {
    /// The frame's bytes, in the connection's receive buffer.
    bytes: &'a [u8],
    /// The fds that came with it.
    fds: Vec<OwnedFd>,
    /// When it arrived: the start of a spawn's latency.
    received_at: Instant,
    /// Whether the daemon was stopping then.
    stopping: bool,
}

type Fatal = (ProtocolErrorKind, String);

/// The handshake, from the first frame received: the version negotiated;
/// `Err(None)` when the client left before saying hello.
async fn handshake(
    socket: &AsyncSeqpacket,
    daemon: &Daemon,
    received: Result<Option<Frame>, ProtoError>,
) -> Result<u32, Option<Fatal>> {
    let frame = match received {
        Ok(Some(frame)) => frame,
        Ok(None) => return Err(None),
        Err(error) if error.is_disconnect() => return Err(None),
        Err(error) => return Err(Some((ProtocolErrorKind::Malformed, error.to_string()))),
    };
    answer_hello(socket, daemon, &frame).await.map_err(Some)
}

/// Answers a hello in the newest protocol version both sides know, in that
/// version's layout; the features are those this daemon offers.
async fn answer_hello(
    socket: &AsyncSeqpacket,
    daemon: &Daemon,
    frame: &Frame,
) -> Result<u32, Fatal> {
    // `Hello` has the same layout in every version; another message sent
    // first is named, in whichever layout it decodes.
    let first = decode_client(&frame.bytes, PROTOCOL_VERSION)
        .or_else(|error| decode_client(&frame.bytes, OLDEST_PROTOCOL_VERSION).map_err(|_| error))?;
    let hello = match first {
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
    let version = negotiate(hello.protocol_version)
        .map_err(|mismatch| (ProtocolErrorKind::UnsupportedVersion, mismatch.to_string()))?;
    debug!(client = hello.client, protocol_version = version, "hello");
    let features = if version >= FEATURES_SINCE {
        let mut features = daemon.offered_features();
        // A sandbox cannot be asked for before version 3, nor a
        // template before version 4.
        if version < zygote_proto::SANDBOX_SINCE {
            features.retain(|name| name != Feature::Sandbox.name());
        }
        if version < zygote_proto::TEMPLATES_SINCE {
            features.retain(|name| name != Feature::Templates.name());
        }
        features
    } else {
        Vec::new()
    };
    let ack = ServerMessage::HelloAck(HelloAck {
        protocol_version: version,
        server_version: crate::version(),
        limits: LIMITS,
        features,
    });
    socket
        .send_message(&ack, &[])
        .await
        .map_err(|error| (ProtocolErrorKind::Malformed, error.to_string()))?;
    Ok(version)
}

/// A client's frame, in the layout of the connection's `version`.
fn decode_client(bytes: &[u8], version: u32) -> Result<ClientMessage, Fatal> {
    zygote_proto::decode_client(bytes, version)
        .map_err(|error| (ProtocolErrorKind::Malformed, error.to_string()))
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
        ClientMessage::Upgrade(_) => "Upgrade",
        ClientMessage::Template(_) => "Template",
        ClientMessage::SpawnFromTemplate(_) => "SpawnFromTemplate",
        ClientMessage::ListTemplates(_) => "ListTemplates",
    }
}

async fn dispatch(
    request: Request<'_>,
    socket: &Arc<AsyncSeqpacket>,
    connection: &Arc<Connection>,
    daemon: &Arc<Daemon>,
    shutdown: &Shutdown,
    active: &Active,
) -> Result<(), Fatal> {
    let Request {
        bytes,
        fds,
        received_at,
        stopping,
    } = request;
    let message = decode_client(bytes, connection.version)?;
    let name = message_name(&message);
    if matches!(
        message,
        ClientMessage::Template(_)
            | ClientMessage::SpawnFromTemplate(_)
            | ClientMessage::ListTemplates(_)
    ) {
        templates_version(name, connection.version)?;
    }
    let takes_fds = matches!(
        message,
        ClientMessage::Hello(_) | ClientMessage::Spawn(_) | ClientMessage::SpawnFromTemplate(_)
    );
    if !takes_fds && !fds.is_empty() {
        return Err(unexpected_fds(name, fds.len()));
    }
    match message {
        ClientMessage::Hello(_) => {
            return Err((
                ProtocolErrorKind::UnexpectedMessage,
                "received a second Hello".into(),
            ));
        }
        ClientMessage::Spawn(request) => {
            let spawn = Spawn {
                request,
                fds,
                template: None,
                received_at,
                stopping,
            };
            start_spawn(spawn, connection, daemon, shutdown, active).await;
        }
        ClientMessage::Signal(request) => connection.reply(daemon, signal(&request, connection)),
        ClientMessage::Status(request) => {
            let reply = if connection.id_in_use(request.id) {
                in_use(request.id)
            } else {
                ServerMessage::Status(daemon.status(request.id, &connection.peer))
            };
            connection.reply(daemon, reply);
        }
        ClientMessage::Upgrade(request) => {
            if let Err(reply) = ask_upgrade(request.id, socket, connection, daemon) {
                connection.reply(daemon, reply);
            }
        }
        ClientMessage::SpawnFromTemplate(request) => {
            if !daemon.offers(Feature::Templates) {
                drop(fds);
                let failed = SpawnFailed {
                    id: request.spawn.id,
                    stage: SpawnStage::Validate,
                    errno: libc::EOPNOTSUPP,
                    message: "this zygote does not offer the templates feature".into(),
                };
                connection.reply(daemon, ServerMessage::SpawnFailed(failed));
                return Ok(());
            }
            let spawn = Spawn {
                request: request.spawn,
                fds,
                template: Some(request.template),
                received_at,
                stopping,
            };
            start_spawn(spawn, connection, daemon, shutdown, active).await;
        }
        ClientMessage::Template(request) => {
            start_template(request, stopping, connection, daemon, active).await;
        }
        ClientMessage::ListTemplates(TemplateListRequest { id }) => {
            connection.reply(daemon, list_templates(id, connection, daemon));
        }
    }
    Ok(())
}

/// The reply to `ListTemplates`: root and the daemon's own uid see every
/// template, any other peer its own.
fn list_templates(id: u64, connection: &Connection, daemon: &Daemon) -> ServerMessage {
    if connection.id_in_use(id) {
        in_use(id)
    } else if !daemon.offers(Feature::Templates) {
        not_offered(id)
    } else {
        let uid = connection.peer.uid;
        let all = uid == 0 || uid == daemon.uid;
        ServerMessage::Templates(TemplateList {
            id,
            templates: daemon.templates.list(all, uid),
        })
    }
}

/// A spawn request, cold or warm, as received.
struct Spawn {
    request: SpawnRequest,
    fds: Vec<OwnedFd>,
    /// The template that forks the child, for a warm spawn.
    template: Option<u64>,
    received_at: Instant,
    stopping: bool,
}

/// Starts a spawn's task, or refuses it at once (the daemon is stopping,
/// or its id is in use).
async fn start_spawn(
    spawn: Spawn,
    connection: &Arc<Connection>,
    daemon: &Arc<Daemon>,
    shutdown: &Shutdown,
    active: &Active,
) {
    let Spawn {
        request,
        fds,
        template,
        received_at,
        stopping,
    } = spawn;
    let refusal = if stopping {
        Some((
            SpawnStage::Admission,
            libc::ESHUTDOWN,
            "the zygote is shutting down".to_owned(),
        ))
    } else if !connection.claim_id(request.id) {
        // Never overwrite: the running spawn keeps the id; the frame's
        // fds are closed with `fds`.
        Some((
            SpawnStage::Validate,
            libc::EEXIST,
            format!(
                "request id {} is already in use on this connection",
                request.id
            ),
        ))
    } else {
        None
    };
    if let Some((stage, errno, message)) = refusal {
        drop(fds);
        let refused = SpawnFailed {
            id: request.id,
            stage,
            errno,
            message,
        };
        connection.reply(daemon, ServerMessage::SpawnFailed(refused));
        daemon.metrics.spawn_done(
            SpawnResult::Refused,
            received_at.elapsed(),
            connection.peer.uid,
        );
        return;
    }
    // Backpressure, not an unbounded pile of tasks: at the cap we stop
    // reading this client's socket until a spawn finishes.
    let Ok(permit) = Arc::clone(&connection.in_flight).acquire_owned().await else {
        return;
    };
    let answer_slot = connection.outbox.owe();
    let task = SpawnTask {
        connection: Arc::clone(connection),
        daemon: Arc::clone(daemon),
        shutdown: shutdown.clone(),
        received_at,
        _permit: permit,
        answer_slot: Mutex::new(Some(answer_slot)),
        applied_sandbox: Mutex::new(None),
        template,
    };
    // A task per spawn, so that concurrent requests on one connection do
    // not queue behind each other's exec. Boxed: the future is about
    // 7 KiB (it holds the whole child's watch), which tokio would
    // otherwise copy through each layer of its spawn path; so it is
    // copied once, and tokio moves a pointer.
    tokio::spawn(Box::pin(task.run(request, fds, active.share())));
}

/// Finds or starts a template in a task of its own (a start may take
/// seconds), which answers `TemplateReady` or `RequestFailed`.
async fn start_template(
    request: TemplateRequest,
    stopping: bool,
    connection: &Arc<Connection>,
    daemon: &Arc<Daemon>,
    active: &Active,
) {
    let id = request.id;
    let failed = move |errno, message: String| {
        ServerMessage::RequestFailed(RequestFailed { id, errno, message })
    };
    let refusal = if connection.id_in_use(id) {
        Some(in_use(id))
    } else if !daemon.offers(Feature::Templates) {
        Some(not_offered(id))
    } else if stopping {
        Some(failed(
            libc::ESHUTDOWN,
            "the zygote is shutting down".into(),
        ))
    } else {
        None
    };
    if let Some(reply) = refusal {
        connection.reply(daemon, reply);
        return;
    }
    // Counted as a spawn in flight: a client's starts are bounded too.
    let Ok(permit) = Arc::clone(&connection.in_flight).acquire_owned().await else {
        return;
    };
    let connection = Arc::clone(connection);
    let daemon = Arc::clone(daemon);
    let active = active.share();
    tokio::spawn(async move {
        let _active = active;
        let _permit = permit;
        let peer = &connection.peer;
        let reply = match daemon
            .templates
            .request(&daemon, peer, &connection.grant, request)
            .await
        {
            Ok((template, pid, reused)) => ServerMessage::TemplateReady(TemplateReady {
                id,
                template,
                pid,
                reused,
            }),
            Err(failure) => {
                debug!(
                    peer_pid = peer.pid,
                    peer_uid = peer.uid,
                    errno = failure.errno,
                    reason = %failure.message,
                    "template request failed"
                );
                let mut message = failure.message;
                crate::daemon::reply::clip(&mut message);
                failed(failure.errno, message)
            }
        };
        connection.reply(&daemon, reply);
        connection.changed.notify_one();
    });
}

fn not_offered(id: u64) -> ServerMessage {
    ServerMessage::RequestFailed(RequestFailed {
        id,
        errno: libc::EOPNOTSUPP,
        message: "this zygote does not offer the templates feature".into(),
    })
}

/// A template message on a connection of a version before templates.
fn templates_version(message: &str, version: u32) -> Result<(), Fatal> {
    if version >= zygote_proto::TEMPLATES_SINCE {
        return Ok(());
    }
    Err((
        ProtocolErrorKind::UnexpectedMessage,
        format!(
            "{message} needs protocol version {}; this connection speaks version {version}",
            zygote_proto::TEMPLATES_SINCE
        ),
    ))
}

/// Hands an `Upgrade` request to the accept loop; the answer comes from
/// the new image (`Status`), or from the upgrade's failure
/// (`RequestFailed`). Only root and the daemon's own uid may ask.
// The refusal is queued as it is: boxing it would only add an allocation.
#[allow(clippy::result_large_err)]
fn ask_upgrade(
    id: u64,
    socket: &Arc<AsyncSeqpacket>,
    connection: &Arc<Connection>,
    daemon: &Daemon,
) -> Result<(), ServerMessage> {
    let failed =
        |errno, message: String| ServerMessage::RequestFailed(RequestFailed { id, errno, message });
    if connection.id_in_use(id) {
        return Err(in_use(id));
    }
    let uid = connection.peer.uid;
    if uid != 0 && uid != daemon.uid {
        return Err(failed(
            libc::EPERM,
            format!(
                "only root or uid {} (the daemon's) may upgrade it; this peer is uid {uid}",
                daemon.uid
            ),
        ));
    }
    let upgrades = daemon.upgrades.lock().expect("upgrades poisoned");
    let Some(upgrades) = upgrades.as_ref() else {
        return Err(failed(
            libc::EOPNOTSUPP,
            "this zygote cannot upgrade in place (a private zygote)".into(),
        ));
    };
    let closable: Arc<dyn Closable> = connection.clone();
    let ask = UpgradeAsk {
        from: Some((Arc::downgrade(&closable), Arc::downgrade(socket), id)),
    };
    upgrades.try_send(ask).map_err(|error| match error {
        tokio::sync::mpsc::error::TrySendError::Full(_) => failed(
            libc::EBUSY,
            "an upgrade is already under way; try again when it is over".into(),
        ),
        tokio::sync::mpsc::error::TrySendError::Closed(_) => {
            failed(libc::ESHUTDOWN, "the zygote is stopping".into())
        }
    })
}

/// A socket parked before its handshake, listed for the upgrade while
/// parked.
struct ParkedSocket<'a> {
    daemon: &'a Daemon,
    socket: Weak<AsyncSeqpacket>,
}

impl<'a> ParkedSocket<'a> {
    fn new(daemon: &'a Daemon, socket: &Arc<AsyncSeqpacket>) -> Self {
        let socket = Arc::downgrade(socket);
        daemon
            .parked_sockets
            .lock()
            .expect("parked sockets poisoned")
            .push(Weak::clone(&socket));
        Self { daemon, socket }
    }
}

impl Drop for ParkedSocket<'_> {
    fn drop(&mut self) {
        self.daemon
            .parked_sockets
            .lock()
            .expect("parked sockets poisoned")
            .retain(|socket| !socket.ptr_eq(&self.socket));
    }
}

fn in_use(id: u64) -> ServerMessage {
    ServerMessage::RequestFailed(RequestFailed {
        id,
        errno: libc::EEXIST,
        message: format!("request id {id} is already in use by a spawn on this connection"),
    })
}

fn signal(request: &SignalRequest, connection: &Connection) -> ServerMessage {
    if connection.id_in_use(request.id) {
        return in_use(request.id);
    }
    let pidfd = connection.pidfd(request.spawn_id);
    let result = match pidfd {
        None => Err((
            libc::ESRCH,
            format!(
                "no running child of spawn {} on this connection",
                request.spawn_id
            ),
        )),
        // With kill_tree, SIGKILL ends the whole cgroup.
        Some(_)
            if connection
                .cgroup(request.spawn_id)
                .is_some_and(|cgroup| cgroup.doom(request.signal)) =>
        {
            Ok(())
        }
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

/// Refuses a connection before its handshake: reads the client's hello
/// first (waiting a second at most), then answers it with the error.
/// Closing with the hello unread would make the kernel report
/// `ECONNRESET` to the client instead of our reason.
async fn refuse(
    socket: &AsyncSeqpacket,
    daemon: &Daemon,
    kind: ProtocolErrorKind,
    message: String,
) {
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    let _ = tokio::time::timeout(REFUSAL_WAIT, socket.recv(&mut scratch)).await;
    close_with(socket, daemon, kind, message).await;
}

/// How long a refused client has to send its hello.
const REFUSAL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

async fn close_with(
    socket: &AsyncSeqpacket,
    daemon: &Daemon,
    kind: ProtocolErrorKind,
    message: String,
) {
    daemon.metrics.protocol_error(kind);
    let reply = ServerMessage::ProtocolError(ProtocolError { kind, message });
    // The same layout in every version.
    send_reply(socket, &reply, OLDEST_PROTOCOL_VERSION, &[]).await;
}

impl Daemon {
    /// The `Status` reply to `peer`, which sees the use of its own uid
    /// (of every uid when privileged).
    pub(crate) fn status(&self, id: u64, peer: &Peer) -> StatusReply {
        let metrics = &self.metrics;
        StatusReply {
            id,
            server_version: crate::version(),
            pid: rustix::process::getpid().as_raw_nonzero().get(),
            uptime_millis: self.started.elapsed().as_millis() as u64,
            connections_open: metrics.connections_open(),
            connections_accepted: metrics.connections_accepted(),
            children_running: metrics.children_running(),
            spawns_succeeded: metrics.spawns(SpawnResult::Ok),
            spawns_failed: metrics.spawns(SpawnResult::Failed)
                + metrics.spawns(SpawnResult::Refused),
            peers: self.peer_use(peer.uid),
            // As for `peers`: root and the daemon's uid see every one.
            spawners: self
                .uid_spawners
                .infos(peer.uid == 0 || peer.uid == self.uid, peer.uid),
        }
    }
}

/// Takes over a connection an earlier image of this daemon handed over
/// (a live upgrade): its socket, peer, grant, ids and children. Answers
/// the `Upgrade` request `reply_to` once serving.
pub(crate) async fn restore(
    saved: SavedConnection,
    daemon: &Arc<Daemon>,
    coordinator: &crate::daemon::shutdown::Coordinator,
    reply_to: Option<u64>,
) {
    let socket = saved.socket.and_then(|fd| {
        let socket = spawn::adopt_fd(fd).and_then(|fd| {
            AsyncSeqpacket::new(fd).map_err(|error| std::io::Error::other(error.to_string()))
        });
        match socket {
            Ok(socket) => Some(socket),
            Err(error) => {
                warn!(fd, %error, "cannot take over a client's socket; it is closed");
                None
            }
        }
    });
    let Some(client) = saved.client else {
        // Not past its handshake: served from the start.
        if let Some(socket) = socket {
            match socket.peer_credentials() {
                Ok(cred) => {
                    let active = daemon.pause.enter().await;
                    daemon.metrics.connection_restored();
                    tokio::spawn(serve_opened(
                        socket,
                        cred,
                        Arc::clone(daemon),
                        coordinator.handle(),
                        active,
                    ));
                }
                Err(error) => warn!(%error, "cannot identify a handed-over client; closing it"),
            }
        }
        return;
    };
    let socket = socket.map(Arc::new);
    let connection = new_connection(
        socket.as_ref().map_or_else(Weak::new, Arc::downgrade),
        client.peer.into(),
        client.grant,
        client.protocol_version,
        socket.is_none() || client.closed,
    );
    connection.restore_state(&client.ids, socket.is_none() || client.closed);
    daemon.register(&connection);
    for child in client.children {
        let active = daemon.pause.enter().await;
        lifetime::resume(&connection, daemon, coordinator.handle(), child, active);
    }
    if let Some(socket) = socket {
        let active = daemon.pause.enter().await;
        tokio::spawn(serve_restored(
            socket,
            connection,
            Arc::clone(daemon),
            coordinator.handle(),
            active,
            reply_to,
        ));
    }
}
