//! SEQPACKET sockets on tokio's reactor.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use rustix::net::UCred;
use serde::Serialize;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::fdpass::{Frame, Received, recv_frame_in, send_frame};
use crate::{ProtoError, encode, socket};

/// A connected SEQPACKET socket that sends and receives whole frames.
///
/// Sending takes `&self`: the kernel keeps each frame whole, so tasks may
/// send concurrently through a shared reference.
///
/// The socket is registered for readability only. Registered for
/// writability too, epoll would wake this process each time the peer
/// drains a frame, which on the spawn path is a wasted wake-up per
/// message on each side. A send that finds the peer's queue full waits on
/// a short-lived second registration instead (see [`Self::send`]).
#[derive(Debug)]
pub struct AsyncSeqpacket {
    fd: AsyncFd<OwnedFd>,
    /// The writability registration of [`Self::send`]'s slow path: made
    /// at the first full queue and shared by every waiting send, so that
    /// a client that never reads costs one fd, not one per queued reply.
    writable: Mutex<Option<Arc<AsyncFd<OwnedFd>>>>,
}

/// Registers an owned fd with tokio's reactor for `interest`.
///
/// # Errors
///
/// When there is no runtime, or epoll refuses the fd.
pub fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` stays open, and `as_raw_fd` returns the same
    // number, for as long as it is owned, which is as long as the `AsyncFd`.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|error| error.into_parts().1)
}

/// Largest message [`AsyncSeqpacket::send_message`] encodes on the stack.
const SMALL_MESSAGE_BYTES: usize = 256;

fn would_block(error: &ProtoError) -> bool {
    matches!(error, ProtoError::Io { source, .. } if source.kind() == io::ErrorKind::WouldBlock)
}

impl AsyncSeqpacket {
    /// Wraps a connected socket, switching it to non-blocking mode.
    ///
    /// # Errors
    ///
    /// When the fd cannot be made non-blocking or registered with tokio
    /// (which needs a running runtime).
    pub fn new(fd: OwnedFd) -> Result<Self, ProtoError> {
        rustix::io::ioctl_fionbio(&fd, true)
            .map_err(|errno| ProtoError::io("ioctl(FIONBIO)", errno))?;
        let fd = register(fd, Interest::READABLE)
            .map_err(|error| ProtoError::io("register with tokio", error))?;
        Ok(Self {
            fd,
            writable: Mutex::default(),
        })
    }

    /// Sends one frame, waiting while the peer's queue is full.
    ///
    /// # Errors
    ///
    /// As [`send_frame`].
    pub async fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), ProtoError> {
        match send_frame(self.fd.get_ref().as_fd(), bytes, fds) {
            // Boxed: the slow path's future would otherwise make every
            // send's (and its callers') as large.
            Err(error) if would_block(&error) => {
                Box::pin(self.send_when_writable(bytes, fds)).await
            }
            result => result,
        }
    }

    /// The rare slow path of [`Self::send`]: a duplicate of the socket,
    /// registered for writability from the first full queue on. epoll keys
    /// registrations by fd and open file, so the duplicate does not clash
    /// with the readable one. One per socket, however many sends wait.
    async fn send_when_writable(
        &self,
        bytes: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), ProtoError> {
        let writable = self.writable_registration()?;
        loop {
            let mut guard = writable
                .writable()
                .await
                .map_err(|error| ProtoError::io("poll", error))?;
            match send_frame(self.fd.get_ref().as_fd(), bytes, fds) {
                Err(error) if would_block(&error) => guard.clear_ready(),
                result => return result,
            }
        }
    }

    fn writable_registration(&self) -> Result<Arc<AsyncFd<OwnedFd>>, ProtoError> {
        let mut slot = self
            .writable
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(writable) = &*slot {
            return Ok(Arc::clone(writable));
        }
        let duplicate = rustix::io::fcntl_dupfd_cloexec(self.fd.get_ref(), 0)
            .map_err(|errno| ProtoError::io("fcntl(F_DUPFD_CLOEXEC)", errno))?;
        let writable = Arc::new(
            register(duplicate, Interest::WRITABLE)
                .map_err(|error| ProtoError::io("register with tokio", error))?,
        );
        *slot = Some(Arc::clone(&writable));
        Ok(writable)
    }

    /// Encodes and sends one message with its fds.
    ///
    /// # Errors
    ///
    /// As [`encode`] and [`send_frame`].
    pub async fn send_message<T: Serialize>(
        &self,
        message: &T,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), ProtoError> {
        // Most messages are a few dozen bytes and the peer's queue has
        // room: encoded on the stack and sent at once, with no allocation.
        if let Some(sent) = self.try_send_small(message, fds) {
            return sent;
        }
        let bytes = encode(message)?;
        self.send(&bytes, fds).await
    }

    /// Sends `message` now if it encodes in [`SMALL_MESSAGE_BYTES`] and
    /// the socket takes it without waiting; `None` when it does not.
    fn try_send_small<T: Serialize>(
        &self,
        message: &T,
        fds: &[BorrowedFd<'_>],
    ) -> Option<Result<(), ProtoError>> {
        let mut buffer = [0u8; SMALL_MESSAGE_BYTES];
        let bytes = postcard::to_slice(message, &mut buffer).ok()?;
        match send_frame(self.fd.get_ref().as_fd(), bytes, fds) {
            Err(error) if would_block(&error) => None,
            result => Some(result),
        }
    }

    /// Receives one frame; `Ok(None)` when the peer has closed.
    ///
    /// `scratch` must hold [`RECV_BUFFER_BYTES`](crate::RECV_BUFFER_BYTES).
    /// Only one task should receive at a time, or frames are split between
    /// them arbitrarily.
    ///
    /// # Errors
    ///
    /// As [`recv_frame`](crate::fdpass::recv_frame).
    pub async fn recv(&self, scratch: &mut [u8]) -> Result<Option<Frame>, ProtoError> {
        let received = self.recv_in(scratch).await?;
        Ok(received.map(|received| Frame {
            bytes: scratch[..received.len].to_vec(),
            fds: received.fds,
        }))
    }

    /// As [`Self::recv`], leaving the frame's bytes in `scratch` (see
    /// [`recv_frame_in`]): the daemon decodes each request there, without
    /// a copy of it per request.
    ///
    /// # Errors
    ///
    /// As [`recv_frame_in`].
    pub async fn recv_in(&self, scratch: &mut [u8]) -> Result<Option<Received>, ProtoError> {
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|error| ProtoError::io("poll", error))?;
            match recv_frame_in(self.fd.get_ref().as_fd(), scratch) {
                Err(error) if would_block(&error) => guard.clear_ready(),
                result => return result,
            }
        }
    }

    /// The peer's credentials as the kernel saw them at connect time.
    ///
    /// # Errors
    ///
    /// As [`socket::peer_credentials`].
    pub fn peer_credentials(&self) -> Result<UCred, ProtoError> {
        socket::peer_credentials(self.fd.get_ref().as_fd())
    }
}

impl AsRawFd for AsyncSeqpacket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.get_ref().as_raw_fd()
    }
}

impl AsFd for AsyncSeqpacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

/// A listening SEQPACKET socket on tokio's reactor.
#[derive(Debug)]
pub struct AsyncSeqpacketListener {
    fd: AsyncFd<OwnedFd>,
}

impl AsyncSeqpacketListener {
    /// Wraps a listening socket (bound here, or inherited from systemd).
    ///
    /// # Errors
    ///
    /// As [`AsyncSeqpacket::new`].
    pub fn new(fd: OwnedFd) -> Result<Self, ProtoError> {
        rustix::io::ioctl_fionbio(&fd, true)
            .map_err(|errno| ProtoError::io("ioctl(FIONBIO)", errno))?;
        let fd = register(fd, Interest::READABLE)
            .map_err(|error| ProtoError::io("register with tokio", error))?;
        Ok(Self { fd })
    }

    /// Waits for a connection and returns it with the peer's credentials.
    ///
    /// # Errors
    ///
    /// As [`socket::accept_peer`].
    pub async fn accept(&self) -> Result<(AsyncSeqpacket, UCred), ProtoError> {
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|error| ProtoError::io("poll", error))?;
            match socket::accept_peer(self.fd.get_ref().as_fd(), true) {
                Err(error) if would_block(&error) => guard.clear_ready(),
                Err(error) => return Err(error),
                Ok((connection, peer)) => return Ok((AsyncSeqpacket::new(connection)?, peer)),
            }
        }
    }
}

impl AsFd for AsyncSeqpacketListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}
