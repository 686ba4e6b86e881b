//! The replies of one connection on their way to its client.
//!
//! Spawn tasks and the request loop queue replies here without waiting;
//! one writer per connection sends them, in the order queued. So a client
//! that does not read holds up nobody: its children are reaped at once,
//! their exit notices wait here (the pidfd of a `Spawned` with them), and
//! no task waits on its socket.
//!
//! What a client has not taken is bounded. The request loop reads the
//! next request only while this connection's *unread* replies stay under
//! [`Bounds`]: spawns read and not yet answered, replies queued here, and
//! replies sent that the client has not read yet (`SIOCOUTQ` tells when it
//! has read them all). Fds count too: those queued here, those sent and
//! unread, and the most a spawn not yet answered may bring. So a client
//! that never reads can start a bounded number of children, holds a
//! bounded number of the daemon's fds, and has a bounded number of fds in
//! flight towards it, far below the kernel's `SCM_RIGHTS` in-flight limit.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use zygote_proto::{AsyncSeqpacket, ServerMessage};

use crate::daemon::handover::Active;
use crate::daemon::reply::send_reply_checked;
use crate::daemon::shutdown::Shutdown;
use crate::spawn;

/// The most fds one reply carries: a `Spawned`'s pidfd and three pipe
/// ends (or a terminal's master).
pub const MAX_FDS_PER_REPLY: usize = 4;

/// How long a closing connection's queued replies may take to go out.
const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// Stop and continue notices queued at most: a child its client stops
/// and continues over and over, unread, waits for room past this.
const MAX_QUEUED_NOTICES: usize = 256;

/// How often a connection held back for its unread replies looks again
/// whether its client has read them, or left.
const RECHECK: Duration = Duration::from_millis(5);

/// The limits on what a client has not taken.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Spawns not yet answered plus replies not yet read.
    pub replies: usize,
    /// Fds of replies not yet read, plus [`MAX_FDS_PER_REPLY`] for each
    /// spawn not yet answered.
    pub fds: usize,
}

/// An fd sent with a reply.
pub enum ReplyFd {
    /// One the reply owns: a pipe end for the client.
    Owned(OwnedFd),
    /// A child's pidfd, shared with its watcher.
    Pidfd(Arc<AsyncFd<OwnedFd>>),
}

impl ReplyFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Owned(fd) => fd.as_fd(),
            Self::Pidfd(pidfd) => pidfd.get_ref().as_fd(),
        }
    }
}

/// A reply waiting to be sent.
struct Outgoing {
    message: ServerMessage,
    fds: Vec<ReplyFd>,
    /// Keeps a live upgrade from pausing before it is sent.
    _hold: Active,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Outgoing>,
    /// Fds of the replies in `queue`.
    queued_fds: usize,
    /// Replies sent (or being sent) that the client may not have read.
    sent: usize,
    /// Their fds.
    sent_fds: usize,
    /// Spawns read and not yet answered.
    owed: usize,
    /// No more replies are taken; `drain` says whether the queued ones
    /// still go out (the daemon closes), or not (the client left).
    closed: Option<bool>,
}

/// One connection's queue of replies; see the module's documentation.
pub struct Outbox {
    bounds: Bounds,
    /// The connection's negotiated protocol version: replies go out in
    /// its layout.
    version: u32,
    state: Mutex<State>,
    /// Wakes the writer: a reply was queued, or the outbox closed.
    queued: Notify,
    /// Wakes the request loop and waiting notices: something was taken.
    room: Notify,
}

/// A spawn read and not yet answered; answered when dropped.
pub struct Owed(Arc<Outbox>);

impl Drop for Owed {
    fn drop(&mut self) {
        self.0.lock().owed -= 1;
        self.0.room.notify_waiters();
    }
}

/// Why the request loop stopped waiting for room.
#[derive(Debug, PartialEq, Eq)]
pub enum Wait {
    /// The client read enough: read its next request.
    Room,
    /// The client hung up.
    Left,
}

impl Outbox {
    /// An empty outbox with these bounds, for a connection that speaks
    /// protocol `version`.
    pub fn new(bounds: Bounds, version: u32) -> Arc<Self> {
        Arc::new(Self {
            bounds,
            version,
            state: Mutex::default(),
            queued: Notify::new(),
            room: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a reply; `hold` is a share of the daemon's pause, held until
    /// it is sent. Dropped at once when the client has left.
    pub fn push(&self, message: ServerMessage, fds: Vec<ReplyFd>, hold: Active) {
        let mut state = self.lock();
        if state.closed.is_some() {
            return;
        }
        state.queued_fds += fds.len();
        state.queue.push_back(Outgoing {
            message,
            fds,
            _hold: hold,
        });
        drop(state);
        self.queued.notify_one();
    }

    /// As [`Outbox::push`], for a stop or continue notice: waits while
    /// [`MAX_QUEUED_NOTICES`] replies are queued.
    pub async fn push_notice(&self, message: ServerMessage, hold: Active) {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let state = self.lock();
                if state.queue.len() < MAX_QUEUED_NOTICES || state.closed.is_some() {
                    break;
                }
            }
            room.await;
        }
        self.push(message, Vec::new(), hold);
    }

    /// Counts a spawn read and not yet answered, until the guard drops.
    pub fn owe(self: &Arc<Self>) -> Owed {
        self.lock().owed += 1;
        Owed(Arc::clone(self))
    }

    /// Whether the client's unread replies leave room for another request.
    fn has_room(&self, state: &State) -> bool {
        let replies = state.owed + state.queue.len() + state.sent;
        let fds = state.owed * MAX_FDS_PER_REPLY + state.queued_fds + state.sent_fds;
        replies < self.bounds.replies && fds < self.bounds.fds
    }

    /// Whether the request loop may read another request now: forgets the
    /// replies sent once the client has read them all.
    pub fn room_for_request(&self, socket: &AsyncSeqpacket) -> bool {
        let mut state = self.lock();
        if self.has_room(&state) {
            return true;
        }
        if state.sent > 0 && spawn::unread_bytes(socket.as_fd()).is_ok_and(|bytes| bytes == 0) {
            state.sent = 0;
            state.sent_fds = 0;
        }
        self.has_room(&state)
    }

    /// Waits until the request loop may read another request, or the
    /// client hangs up (it is not read meanwhile, so its hang-up is looked
    /// for here).
    pub async fn wait_for_room(&self, socket: &AsyncSeqpacket) -> Wait {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if self.room_for_request(socket) {
                return Wait::Room;
            }
            if hung_up(socket) {
                return Wait::Left;
            }
            tokio::select! {
                () = room => {}
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }

    /// No more replies: with `drain`, those queued still go out (for up
    /// to [`DRAIN_WAIT`]); without, they are dropped (the client left, or
    /// did not read them in time).
    pub fn close(&self, drain: bool) {
        let dropped = {
            let mut state = self.lock();
            match state.closed {
                Some(false) => return,
                Some(true) if drain => return,
                _ => {}
            }
            state.closed = Some(drain);
            if drain {
                VecDeque::new()
            } else {
                state.queued_fds = 0;
                std::mem::take(&mut state.queue)
            }
        };
        drop(dropped);
        self.queued.notify_one();
        self.room.notify_waiters();
    }

    /// The next reply to send, counted as sent; `None` when closed and
    /// nothing is left to send.
    async fn next(&self) -> Option<Outgoing> {
        loop {
            let queued = self.queued.notified();
            {
                let mut state = self.lock();
                if let Some(outgoing) = state.queue.pop_front() {
                    state.queued_fds -= outgoing.fds.len();
                    state.sent += 1;
                    state.sent_fds += outgoing.fds.len();
                    return Some(outgoing);
                }
                if state.closed.is_some() {
                    return None;
                }
            }
            queued.await;
        }
    }

    /// Whether the queued replies still go out: not closed, or closed to
    /// drain.
    fn draining(&self) -> Option<bool> {
        self.lock().closed
    }

    /// Sends the queued replies in order until the outbox is closed and
    /// empty, or the client has left. Holds the socket open meanwhile,
    /// and `shutdown`, so that a stopping daemon sends them first.
    pub async fn write(self: Arc<Self>, socket: Arc<AsyncSeqpacket>, _shutdown: Shutdown) {
        let mut deadline = None;
        while let Some(outgoing) = self.next().await {
            if self.draining() == Some(false) {
                continue;
            }
            let sent = {
                let fds: Vec<BorrowedFd<'_>> = outgoing.fds.iter().map(ReplyFd::as_fd).collect();
                let send = send_reply_checked(&socket, &outgoing.message, self.version, &fds);
                tokio::pin!(send);
                loop {
                    if deadline.is_none() && self.draining().is_some() {
                        deadline = Some(tokio::time::Instant::now() + DRAIN_WAIT);
                    }
                    match deadline {
                        Some(deadline) => {
                            break tokio::time::timeout_at(deadline, &mut send)
                                .await
                                .unwrap_or(Err(()));
                        }
                        None => tokio::select! {
                            sent = &mut send => break sent,
                            // Closed meanwhile: the rest get DRAIN_WAIT.
                            () = self.closed_to_drain() => {}
                        },
                    }
                }
            };
            if sent.is_err() {
                // The client left, or did not read in time.
                self.close(false);
            }
            drop(outgoing);
            self.room.notify_waiters();
        }
    }

    /// Resolves once the outbox is closed (to drain or not).
    async fn closed_to_drain(&self) {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if self.draining().is_some() {
                return;
            }
            room.await;
        }
    }
}

/// Whether the client hung up (`POLLHUP`/`POLLRDHUP`), whatever it left
/// unread.
fn hung_up(socket: &AsyncSeqpacket) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(socket, PollFlags::RDHUP)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&zero)).is_ok_and(|ready| {
        ready > 0
            && fds[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::handover::Pause;
    use crate::daemon::shutdown::Coordinator;
    use zygote_proto::{RECV_BUFFER_BYTES, SignalSent, recv_frame, socket};

    fn reply(id: u64) -> ServerMessage {
        ServerMessage::SignalSent(SignalSent { id })
    }

    /// Replies the client has not read hold the connection back at the
    /// bound; once it has read them all, it has room again. A client that
    /// left gets nothing more queued.
    #[test]
    fn unread_replies_hold_back_requests_until_read() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let (ours, theirs) = socket::pair(false).expect("socketpair");
            let socket = Arc::new(AsyncSeqpacket::new(ours).expect("register"));
            let outbox = Outbox::new(
                Bounds { replies: 4, fds: 8 },
                zygote_proto::PROTOCOL_VERSION,
            );
            let pause = Pause::default();
            let active = pause.enter().await;
            let coordinator = Coordinator::new();
            let writer =
                tokio::spawn(Arc::clone(&outbox).write(Arc::clone(&socket), coordinator.handle()));
            assert!(outbox.room_for_request(&socket));
            let owed = outbox.owe();
            for id in 0..3 {
                outbox.push(reply(id), Vec::new(), pause.hold());
            }
            assert!(!outbox.room_for_request(&socket), "3 replies and 1 owed");
            drop(owed);
            assert!(outbox.room_for_request(&socket), "answered");
            outbox.push(reply(3), Vec::new(), pause.hold());
            // Sent, but not read.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!outbox.room_for_request(&socket), "sent is not read");
            let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
            for _ in 0..4 {
                recv_frame(theirs.as_fd(), &mut scratch)
                    .expect("receive")
                    .expect("a reply");
            }
            let room = tokio::time::timeout(Duration::from_secs(5), outbox.wait_for_room(&socket))
                .await
                .expect("room once read");
            assert_eq!(room, Wait::Room);
            // Four owed spawns may bring 16 fds: over the fd bound of 8.
            let owed: Vec<Owed> = (0..2).map(|_| outbox.owe()).collect();
            assert!(!outbox.room_for_request(&socket), "owed fds count");
            drop(owed);
            drop(theirs);
            assert_eq!(
                tokio::time::timeout(Duration::from_secs(5), outbox.wait_for_room(&socket))
                    .await
                    .expect("a hang-up is seen"),
                Wait::Room
            );
            outbox.close(false);
            outbox.push(reply(4), Vec::new(), pause.hold());
            assert!(outbox.lock().queue.is_empty(), "nothing queued once closed");
            tokio::time::timeout(Duration::from_secs(5), writer)
                .await
                .expect("the writer ends once closed")
                .expect("writer");
            drop(active);
            tokio::time::timeout(Duration::from_secs(5), pause.pause())
                .await
                .expect("every reply's hold is given back");
        });
    }
}
