//! One frame in, one frame out: `sendmsg`/`recvmsg` with SCM_RIGHTS.
//!
//! These work on blocking and non-blocking sockets alike; on a non-blocking
//! socket they return [`std::io::ErrorKind::WouldBlock`] inside
//! [`ProtoError::Io`] and the caller waits for readiness.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

use crate::{MAX_FDS_PER_FRAME, MAX_FRAME_BYTES, ProtoError};

/// Size of the scratch buffer [`recv_frame`] needs: one byte over the frame
/// limit, so that an oversized frame is seen as such even without
/// `MSG_TRUNC`.
pub const RECV_BUFFER_BYTES: usize = MAX_FRAME_BYTES + 1;

/// A received frame: the message bytes and the fds that came with them.
///
/// The fds are owned, close-on-exec, and closed on drop unless taken.
#[derive(Debug, Default)]
pub struct Frame {
    /// The message bytes.
    pub bytes: Vec<u8>,
    /// The fds, in the order the sender attached them.
    pub fds: Vec<OwnedFd>,
}

/// Sends one frame. SEQPACKET keeps it whole: the peer receives exactly
/// these bytes with exactly these fds, or nothing.
///
/// # Errors
///
/// [`ProtoError::FrameTooLarge`] / [`ProtoError::TooManyFds`] before sending
/// when the frame is over the limits, [`ProtoError::Io`] when `sendmsg`
/// fails (`EPIPE` when the peer is gone: `SIGPIPE` is suppressed).
pub fn send_frame(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), ProtoError> {
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(ProtoError::FrameTooLarge {
            size: bytes.len(),
            limit: MAX_FRAME_BYTES,
        });
    }
    if fds.len() > MAX_FDS_PER_FRAME {
        return Err(ProtoError::TooManyFds {
            limit: MAX_FDS_PER_FRAME,
        });
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        let pushed = control.push(SendAncillaryMessage::ScmRights(fds));
        debug_assert!(pushed, "cmsg space is sized for MAX_FDS_PER_FRAME");
    }
    loop {
        match sendmsg(
            socket,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(errno) => return Err(ProtoError::io("sendmsg", errno)),
        }
    }
}

/// Receives one frame. `Ok(None)` means the peer closed the connection.
///
/// Fds arrive close-on-exec (`MSG_CMSG_CLOEXEC`). A frame whose data or
/// control part the kernel had to truncate is an error, and any fds that did
/// arrive with it are closed before returning.
///
/// `scratch` is a reusable receive buffer of [`RECV_BUFFER_BYTES`]; the
/// frame's bytes are copied out of it.
///
/// # Errors
///
/// [`ProtoError::FrameTooLarge`], [`ProtoError::TooManyFds`], or
/// [`ProtoError::Io`] (including `WouldBlock` on a non-blocking socket).
///
/// # Panics
///
/// If `scratch` is shorter than [`RECV_BUFFER_BYTES`].
pub fn recv_frame(socket: BorrowedFd<'_>, scratch: &mut [u8]) -> Result<Option<Frame>, ProtoError> {
    Ok(recv_frame_in(socket, scratch)?.map(|received| Frame {
        bytes: scratch[..received.len].to_vec(),
        fds: received.fds,
    }))
}

/// A frame received into the caller's buffer: its bytes are the first
/// [`len`](Self::len) bytes there.
#[derive(Debug)]
pub struct Received {
    /// How many bytes of the buffer the frame filled.
    pub len: usize,
    /// The fds, in the order the sender attached them.
    pub fds: Vec<OwnedFd>,
}

/// As [`recv_frame`], leaving the frame's bytes in `scratch` instead of
/// copying them out: for a receiver that decodes each frame before it
/// receives the next.
///
/// # Errors
///
/// As [`recv_frame`].
///
/// # Panics
///
/// As [`recv_frame`].
pub fn recv_frame_in(
    socket: BorrowedFd<'_>,
    scratch: &mut [u8],
) -> Result<Option<Received>, ProtoError> {
    assert!(
        scratch.len() >= RECV_BUFFER_BYTES,
        "receive buffer too small"
    );
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut scratch[..RECV_BUFFER_BYTES])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::TRUNC,
        ) {
            Ok(received) => break received,
            Err(Errno::INTR) => continue,
            Err(errno) => return Err(ProtoError::io("recvmsg", errno)),
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    // The control buffer is rounded up to whole words, so the kernel can
    // deliver a few fds over the limit without truncating: count them.
    if received.flags.contains(ReturnFlags::CTRUNC) || fds.len() > MAX_FDS_PER_FRAME {
        return Err(ProtoError::TooManyFds {
            limit: MAX_FDS_PER_FRAME,
        });
    }
    if received.flags.contains(ReturnFlags::TRUNC) || received.bytes > MAX_FRAME_BYTES {
        return Err(ProtoError::FrameTooLarge {
            size: received.bytes,
            limit: MAX_FRAME_BYTES,
        });
    }
    if received.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some(Received {
        len: received.bytes,
        fds,
    }))
}
