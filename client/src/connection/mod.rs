//! One connection to the zygote: the handshake, the reader task that
//! dispatches replies by request id, and the request/reply calls built on
//! it.
//!
//! Senders share the socket (`sendmsg` of a SEQPACKET frame is atomic);
//! only the reader task receives. Per-id state lives in one mutex that is
//! never held across an `.await`, so concurrent requests do not queue
//! behind each other.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{oneshot, watch};
use zygote_proto::{
    AppliedSandbox, AsyncSeqpacket, ClientMessage, ExitNotice, InVersion, Limits, RequestFailed,
    ServerMessage, SignalRequest, SpawnFailed, SpawnRequest, StatusReply, StatusRequest,
    TemplateInfo, TemplateListRequest, TemplateReady, TemplateRequest, TemplateSpawnRequest,
    encode_into,
};

use crate::{Error, Result};

mod handshake;
mod reader;

/// The name this client gives in its `Hello`.
const CLIENT_NAME: &str = concat!("zygote-client/", env!("CARGO_PKG_VERSION"));

/// A handshaken connection, shared by the client handles, the reader task
/// and in-flight requests.
#[derive(Debug)]
pub(crate) struct Connection {
    socket: AsyncSeqpacket,
    /// Where we connected, for error messages.
    endpoint: String,
    server_version: String,
    /// The protocol version the zygote answered in.
    protocol_version: u32,
    /// The features the zygote offers, as its `HelloAck` named them.
    features: Vec<String>,
    limits: Limits,
    next_id: AtomicU64,
    state: Mutex<State>,
    /// Whether `state.lost` is set, readable without the lock: every
    /// request asks first, and with many threads on one connection the
    /// lock was contended (a futex wait and wake per spawn at c=50).
    lost: AtomicBool,
    /// The last request's encoding buffer, kept for the next one: a fresh
    /// vector per request grew through every power of two to the size of
    /// the environment, and malloc's consolidation of a large request
    /// showed in the client's profile. Concurrent senders that find it
    /// taken, or its lock held, use a fresh one (nobody waits for it),
    /// made as large as the last request so that it does not grow.
    send_buffer: Mutex<Vec<u8>>,
    /// The size of the last request encoded, for a fresh buffer.
    last_request_bytes: AtomicUsize,
}

/// The largest encoding buffer a connection keeps between requests, so
/// that one huge request does not pin its memory for the connection's life.
const KEPT_SEND_BUFFER: usize = 64 * 1024;

#[derive(Debug, Default)]
struct State {
    /// Set once, when the connection ends; requests fail fast after that.
    lost: Option<Arc<Lost>>,
    /// Requests waiting for their reply, by request id.
    pending: HashMap<u64, Pending>,
    /// Children waiting for their exit notice, by spawn id. Registered when
    /// `Spawned` is dispatched, so an `Exited` right behind it has a slot.
    exits: HashMap<u64, watch::Sender<ExitState>>,
}

#[derive(Debug)]
enum Pending {
    Spawn(oneshot::Sender<SpawnReply>),
    Signal(oneshot::Sender<std::result::Result<(), RequestFailed>>),
    Status(oneshot::Sender<StatusReply>),
    /// A `Template` request: `TemplateReady`, or `RequestFailed`.
    Template(oneshot::Sender<std::result::Result<TemplateReady, RequestFailed>>),
    /// A `ListTemplates` request: `Templates`, or `RequestFailed`.
    Templates(oneshot::Sender<std::result::Result<Vec<TemplateInfo>, RequestFailed>>),
}

/// Why the connection ended.
#[derive(Debug)]
pub(crate) struct Lost {
    endpoint: String,
    reason: String,
}

impl Lost {
    pub(crate) fn error(&self) -> Error {
        Error::ZygoteLost {
            endpoint: self.endpoint.clone(),
            reason: self.reason.clone(),
        }
    }
}

/// Why a spawn request got no reply.
#[derive(Debug)]
pub(crate) enum SpawnFailure {
    /// It never reached the zygote: the connection was lost before the
    /// request was registered, or its own send found the zygote gone. It
    /// may be sent again on a new connection.
    Unsent(Error),
    /// Anything else, a loss after the send included: the zygote may have
    /// acted on the request.
    Failed(Error),
}

impl From<Error> for SpawnFailure {
    fn from(error: Error) -> Self {
        Self::Failed(error)
    }
}

/// The reply to a spawn request.
#[derive(Debug)]
pub(crate) enum SpawnReply {
    /// The child exec'd; `fds` are the pidfd, then the pipe ends.
    Spawned {
        /// The spawn request's id, which names the child in later requests.
        id: u64,
        pid: i32,
        fds: Vec<OwnedFd>,
        exit: ExitWatch,
        /// What confined the child.
        sandbox: Option<AppliedSandbox>,
    },
    /// The zygote could not start it.
    Failed(SpawnFailed),
    /// A `defer_spawned` child ended before its `Spawned` was due.
    Exited(ExitNotice),
}

/// Where a child's exit notice will appear.
#[derive(Debug, Clone)]
pub(crate) enum ExitState {
    Running,
    /// Running, but stopped by this signal (only reported when the request
    /// asked for stop notices).
    Stopped(i32),
    Exited(ExitNotice),
    Lost(Arc<Lost>),
}

/// A child's stops and continues, as the zygote reports them for a
/// request made with [`Command::report_stops`](crate::Command::report_stops).
#[derive(Debug)]
pub struct JobEvents(watch::Receiver<ExitState>);

/// Whether a running child is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Running (again, after a stop).
    Running,
    /// Stopped by this signal (`SIGTSTP`, `SIGSTOP`, `SIGTTIN`, `SIGTTOU`).
    Stopped(i32),
}

impl JobEvents {
    /// Waits for the next change; `None` once the child has exited or the
    /// connection is lost (then [`Child::wait`](crate::Child::wait) says
    /// which). Changes that follow each other quickly may be seen as one:
    /// this reports the latest state. A child that was already stopped
    /// when these events were taken reports that stop first.
    pub async fn changed(&mut self) -> Option<JobState> {
        self.0.changed().await.ok()?;
        match *self.0.borrow_and_update() {
            ExitState::Running => Some(JobState::Running),
            ExitState::Stopped(signal) => Some(JobState::Stopped(signal)),
            ExitState::Exited(_) | ExitState::Lost(_) => None,
        }
    }
}

/// The receiving side of one child's exit slot.
#[derive(Debug)]
pub(crate) struct ExitWatch(watch::Receiver<ExitState>);

impl ExitWatch {
    /// Another view of the same slot, for following stops and continues.
    /// A child already stopped is its first change: a stop reported before
    /// the caller asked is not lost.
    pub(crate) fn job_events(&self) -> JobEvents {
        let mut receiver = self.0.clone();
        if matches!(*receiver.borrow(), ExitState::Stopped(_)) {
            receiver.mark_changed();
        } else {
            receiver.mark_unchanged();
        }
        JobEvents(receiver)
    }

    /// The notice if it has arrived, without waiting.
    pub(crate) fn poll(&self) -> Result<Option<ExitNotice>> {
        match &*self.0.borrow() {
            ExitState::Running | ExitState::Stopped(_) => Ok(None),
            ExitState::Exited(notice) => Ok(Some(notice.clone())),
            ExitState::Lost(lost) => Err(lost.error()),
        }
    }

    /// Waits for the notice, or for the connection to end.
    pub(crate) async fn wait(&mut self) -> Result<ExitNotice> {
        let state = match self
            .0
            .wait_for(|state| !matches!(state, ExitState::Running | ExitState::Stopped(_)))
            .await
        {
            Ok(state) => state.clone(),
            // The slot is always resolved before it is dropped; this is a
            // fallback should that ever change.
            Err(_) => {
                return Err(Error::ZygoteLost {
                    endpoint: String::from("(unknown)"),
                    reason: "the connection state was dropped".into(),
                });
            }
        };
        match state {
            ExitState::Exited(notice) => Ok(notice),
            ExitState::Lost(lost) => Err(lost.error()),
            ExitState::Running | ExitState::Stopped(_) => {
                unreachable!("wait_for returned a running state")
            }
        }
    }
}

/// Removes a pending request when its caller stops waiting (the future
/// was dropped, or sending failed), so late replies find nothing.
struct Unregister<'a> {
    connection: &'a Connection,
    id: u64,
}

impl Unregister<'_> {
    /// For a request whose reply channel has resolved: the reader removed
    /// its entry before sending (or `lose` took them all), so there is
    /// nothing to remove, and taking the lock again only contended with
    /// the reader.
    fn resolved(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.connection.lock().pending.remove(&self.id);
    }
}

impl Connection {
    pub(crate) fn server_version(&self) -> &str {
        &self.server_version
    }

    pub(crate) fn protocol_version(&self) -> u32 {
        self.protocol_version
    }

    pub(crate) fn features(&self) -> &[String] {
        &self.features
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Requests still waiting for a reply.
    #[cfg(test)]
    pub(crate) fn pending_requests(&self) -> usize {
        self.lock().pending.len()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// The state lock. A panic while it was held cannot leave the maps
    /// inconsistent (each update is one insert or remove), so poisoning is
    /// ignored.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn lost_error(&self) -> Error {
        match &self.lock().lost {
            Some(lost) => lost.error(),
            None => Error::ZygoteLost {
                endpoint: self.endpoint.clone(),
                reason: "the connection driver stopped".into(),
            },
        }
    }

    /// Registers a pending request, unless the connection is already lost.
    fn register(&self, id: u64, pending: Pending) -> Result<Unregister<'_>> {
        let mut state = self.lock();
        if let Some(lost) = &state.lost {
            return Err(lost.error());
        }
        state.pending.insert(id, pending);
        Ok(Unregister {
            connection: self,
            id,
        })
    }

    /// Sends one request frame.
    async fn send(&self, message: &ClientMessage, fds: &[BorrowedFd<'_>]) -> Result<()> {
        let bytes = self.encode(message, fds.len())?;
        self.send_encoded(bytes, fds).await
    }

    /// Encodes a request into the connection's kept buffer, checking it
    /// against the limits first.
    fn encode(&self, message: &ClientMessage, fd_count: usize) -> Result<Vec<u8>> {
        let limit = self.limits.max_fds_per_frame as usize;
        if fd_count > limit {
            return Err(Error::TooManyFds {
                count: fd_count,
                limit,
                inherited: false,
            });
        }
        let mut buffer = match self.send_buffer.try_lock() {
            Ok(mut kept) => std::mem::take(&mut *kept),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                std::mem::take(&mut *poisoned.into_inner())
            }
            Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
        };
        buffer.clear();
        // Taken by another sender: one allocation of the usual size, not
        // a growth through every power of two up to it.
        let last = self.last_request_bytes.load(Ordering::Relaxed);
        if buffer.capacity() < last {
            buffer.reserve_exact(last.min(KEPT_SEND_BUFFER));
        }
        // In the layout of the version the zygote answered in.
        let bytes = encode_into(&InVersion::new(message, self.protocol_version), buffer)
            .map_err(|error| Error::proto("encoding a request", error))?;
        self.last_request_bytes
            .store(bytes.len(), Ordering::Relaxed);
        let limit = self.limits.max_frame_bytes as usize;
        if bytes.len() > limit {
            return Err(Error::RequestTooLarge {
                size: bytes.len(),
                limit,
            });
        }
        Ok(bytes)
    }

    /// Sends an encoded request, then keeps its buffer for the next one.
    async fn send_encoded(&self, bytes: Vec<u8>, fds: &[BorrowedFd<'_>]) -> Result<()> {
        let sent = match self.socket.send(&bytes, fds).await {
            Ok(()) => Ok(()),
            Err(error) if error.is_disconnect() => Err(Error::ZygoteLost {
                endpoint: self.endpoint.clone(),
                reason: format!("sending a request failed: {error}"),
            }),
            Err(error) => Err(Error::proto("sending a request to the zygote", error)),
        };
        if bytes.capacity() <= KEPT_SEND_BUFFER {
            let kept = match self.send_buffer.try_lock() {
                Ok(kept) => Some(kept),
                Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            if let Some(mut kept) = kept
                && kept.capacity() < bytes.capacity()
            {
                *kept = bytes;
            }
        }
        sent
    }

    /// Sends a spawn request (its id is assigned here) with its fds and
    /// waits for the reply; with `template`, as a spawn from that
    /// template.
    ///
    /// The request is encoded at the call, not in the returned future, so
    /// that the future holds its bytes instead of the request: the
    /// caller's spawn future is boxed by the runtime, and a smaller one
    /// is cheaper to allocate and move.
    ///
    /// # Errors
    ///
    /// [`SpawnFailure::Unsent`] with [`Error::ZygoteLost`] when the
    /// connection was found lost before the request left; otherwise
    /// [`SpawnFailure::Failed`] with `ZygoteLost` when the connection ends
    /// first, or the errors of sending.
    pub(crate) fn spawn<'a>(
        &'a self,
        mut request: SpawnRequest,
        fds: &'a [BorrowedFd<'a>],
        template: Option<u64>,
    ) -> impl Future<Output = std::result::Result<SpawnReply, SpawnFailure>> + 'a {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        let message = match template {
            Some(template) => ClientMessage::SpawnFromTemplate(TemplateSpawnRequest {
                template,
                spawn: request,
            }),
            None => ClientMessage::Spawn(request),
        };
        let encoded = self.encode(&message, fds.len());
        async move {
            let bytes = encoded?;
            let (reply_tx, reply_rx) = oneshot::channel();
            let registered = self
                .register(id, Pending::Spawn(reply_tx))
                .map_err(SpawnFailure::Unsent)?;
            if let Err(error) = self.send_encoded(bytes, fds).await {
                return Err(match error {
                    Error::ZygoteLost { ref reason, .. } => {
                        // The reader may not have seen the end yet: end
                        // the connection here, so the next request
                        // reconnects instead of meeting it again.
                        let _ =
                            rustix::net::shutdown(self.socket.as_fd(), rustix::net::Shutdown::Both);
                        self.lose(reason.clone());
                        SpawnFailure::Unsent(error)
                    }
                    error => SpawnFailure::Failed(error),
                });
            }
            let reply = reply_rx.await;
            registered.resolved();
            reply.map_err(|_| SpawnFailure::Failed(self.lost_error()))
        }
    }

    /// Asks the zygote to send `signal` to the child of spawn `spawn_id`.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] when the zygote refuses or fails (e.g. `ESRCH`),
    /// [`Error::ZygoteLost`] when the connection ends first.
    pub(crate) async fn signal(&self, spawn_id: u64, signal: i32) -> Result<()> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply_tx, reply_rx) = oneshot::channel();
        let registered = self.register(id, Pending::Signal(reply_tx))?;
        let request = ClientMessage::Signal(SignalRequest {
            id,
            spawn_id,
            signal,
        });
        self.send(&request, &[]).await?;
        let reply = reply_rx.await;
        registered.resolved();
        match reply {
            Ok(Ok(())) => Ok(()),
            Ok(Err(failed)) => Err(Error::Request {
                op: "signal",
                errno: failed.errno,
                message: failed.message,
            }),
            Err(_) => Err(self.lost_error()),
        }
    }

    /// Asks the zygote for its counters.
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteLost`] when the connection ends first (a zygote
    /// that predates status requests closes it with a protocol error).
    pub(crate) async fn status(&self) -> Result<StatusReply> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply_tx, reply_rx) = oneshot::channel();
        let registered = self.register(id, Pending::Status(reply_tx))?;
        self.send(&ClientMessage::Status(StatusRequest { id }), &[])
            .await?;
        let reply = reply_rx.await;
        registered.resolved();
        reply.map_err(|_| self.lost_error())
    }

    /// Asks the zygote to find or start a template; the request's id is
    /// assigned here.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] (op `template`) when the zygote refuses it or
    /// the template fails to start, [`Error::ZygoteLost`] when the
    /// connection ends first.
    pub(crate) async fn template(&self, mut request: TemplateRequest) -> Result<TemplateReady> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        let (reply_tx, reply_rx) = oneshot::channel();
        let registered = self.register(id, Pending::Template(reply_tx))?;
        self.send(&ClientMessage::Template(request), &[]).await?;
        let reply = reply_rx.await;
        registered.resolved();
        request_reply("template", reply.map_err(|_| self.lost_error())?)
    }

    /// Asks the zygote for the templates this peer may see.
    ///
    /// # Errors
    ///
    /// [`Error::Request`] (op `list templates`) when the zygote refuses,
    /// [`Error::ZygoteLost`] when the connection ends first.
    pub(crate) async fn list_templates(&self) -> Result<Vec<TemplateInfo>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply_tx, reply_rx) = oneshot::channel();
        let registered = self.register(id, Pending::Templates(reply_tx))?;
        self.send(
            &ClientMessage::ListTemplates(TemplateListRequest { id }),
            &[],
        )
        .await?;
        let reply = reply_rx.await;
        registered.resolved();
        request_reply("list templates", reply.map_err(|_| self.lost_error())?)
    }

    /// Ends the connection: fails every pending request and every exit
    /// slot with `reason`. Only the first call has an effect.
    pub(crate) fn lose(&self, reason: String) {
        let (pending, exits, lost) = {
            let mut state = self.lock();
            if state.lost.is_some() {
                return;
            }
            let lost = Arc::new(Lost {
                endpoint: self.endpoint.clone(),
                reason,
            });
            state.lost = Some(Arc::clone(&lost));
            self.lost.store(true, Ordering::Release);
            (
                std::mem::take(&mut state.pending),
                std::mem::take(&mut state.exits),
                lost,
            )
        };
        // Dropping a reply sender wakes its waiter, which then reads the
        // reason from `state.lost`.
        drop(pending);
        for (_, slot) in exits {
            slot.send_replace(ExitState::Lost(Arc::clone(&lost)));
        }
    }
}

/// A reply that is either the answer or the zygote's `RequestFailed`.
fn request_reply<T>(op: &'static str, reply: std::result::Result<T, RequestFailed>) -> Result<T> {
    reply.map_err(|failed| Error::Request {
        op,
        errno: failed.errno,
        message: failed.message,
    })
}

fn message_name(message: &ServerMessage) -> &'static str {
    match message {
        ServerMessage::HelloAck(_) => "HelloAck",
        ServerMessage::Spawned(_) => "Spawned",
        ServerMessage::SpawnFailed(_) => "SpawnFailed",
        ServerMessage::Exited(_) => "Exited",
        ServerMessage::Stopped(_) => "Stopped",
        ServerMessage::Continued(_) => "Continued",
        ServerMessage::SignalSent(_) => "SignalSent",
        ServerMessage::RequestFailed(_) => "RequestFailed",
        ServerMessage::ProtocolError(_) => "ProtocolError",
        ServerMessage::Status(_) => "Status",
        ServerMessage::TemplateReady(_) => "TemplateReady",
        ServerMessage::Templates(_) => "Templates",
    }
}
