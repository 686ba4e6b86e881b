//! Creating SEQPACKET Unix sockets: every fd is close-on-exec from birth.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::net::{
    AddressFamily, SocketAddrUnix, SocketFlags, SocketType, UCred, accept_with, bind, connect,
    listen, socket_with, socketpair, sockopt,
};

use crate::{MAX_FRAME_BYTES, ProtoError};

/// Backlog of pending connections on a listening socket.
const LISTEN_BACKLOG: i32 = 256;

fn flags(nonblocking: bool) -> SocketFlags {
    if nonblocking {
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK
    } else {
        SocketFlags::CLOEXEC
    }
}

/// Raises the send buffer so that a frame of [`MAX_FRAME_BYTES`] fits: a
/// Unix datagram larger than the sender's buffer fails with `EMSGSIZE`.
/// The kernel caps the value at `net.core.wmem_max`; that is not an error.
fn size_send_buffer(socket: BorrowedFd<'_>) -> Result<(), ProtoError> {
    sockopt::set_socket_send_buffer_size(socket, 2 * MAX_FRAME_BYTES)
        .map_err(|errno| ProtoError::io("setsockopt(SO_SNDBUF)", errno))
}

/// Binds and listens on a SEQPACKET socket at `path`.
///
/// # Errors
///
/// [`ProtoError::Io`] from `socket`, `bind` (e.g. `EADDRINUSE` when `path`
/// exists) or `listen`.
pub fn listen_at(path: &Path, nonblocking: bool) -> Result<OwnedFd, ProtoError> {
    let socket = socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        flags(nonblocking),
        None,
    )
    .map_err(|errno| ProtoError::io("socket", errno))?;
    let address = SocketAddrUnix::new(path).map_err(|errno| ProtoError::io("bind", errno))?;
    bind(&socket, &address).map_err(|errno| ProtoError::io("bind", errno))?;
    listen(&socket, LISTEN_BACKLOG).map_err(|errno| ProtoError::io("listen", errno))?;
    Ok(socket)
}

/// Accepts one connection, close-on-exec, and returns it with the peer's
/// kernel-reported credentials (`SO_PEERCRED`).
///
/// # Errors
///
/// [`ProtoError::Io`], including `WouldBlock` on a non-blocking listener.
pub fn accept_peer(
    listener: BorrowedFd<'_>,
    nonblocking: bool,
) -> Result<(OwnedFd, UCred), ProtoError> {
    let connection = accept_with(listener, flags(nonblocking))
        .map_err(|errno| ProtoError::io("accept4", errno))?;
    let peer = sockopt::socket_peercred(&connection)
        .map_err(|errno| ProtoError::io("getsockopt(SO_PEERCRED)", errno))?;
    size_send_buffer(connection.as_fd())?;
    Ok((connection, peer))
}

/// Connects to the SEQPACKET socket at `path`.
///
/// # Errors
///
/// [`ProtoError::Io`]; `ENOENT` or `ECONNREFUSED` mean no daemon listens.
pub fn connect_to(path: &Path, nonblocking: bool) -> Result<OwnedFd, ProtoError> {
    let socket = socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        flags(false),
        None,
    )
    .map_err(|errno| ProtoError::io("socket", errno))?;
    let address = SocketAddrUnix::new(path).map_err(|errno| ProtoError::io("connect", errno))?;
    connect(&socket, &address).map_err(|errno| ProtoError::io("connect", errno))?;
    size_send_buffer(socket.as_fd())?;
    if nonblocking {
        rustix::io::ioctl_fionbio(&socket, true)
            .map_err(|errno| ProtoError::io("ioctl(FIONBIO)", errno))?;
    }
    Ok(socket)
}

/// A connected pair of SEQPACKET sockets, for a private zygote.
///
/// # Errors
///
/// [`ProtoError::Io`] from `socketpair`.
pub fn pair(nonblocking: bool) -> Result<(OwnedFd, OwnedFd), ProtoError> {
    let (a, b) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        flags(nonblocking),
        None,
    )
    .map_err(|errno| ProtoError::io("socketpair", errno))?;
    size_send_buffer(a.as_fd())?;
    size_send_buffer(b.as_fd())?;
    Ok((a, b))
}

/// The credentials of the process at the other end of `socket`.
///
/// # Errors
///
/// [`ProtoError::Io`] from `getsockopt(SO_PEERCRED)`.
pub fn peer_credentials(socket: BorrowedFd<'_>) -> Result<UCred, ProtoError> {
    sockopt::socket_peercred(socket)
        .map_err(|errno| ProtoError::io("getsockopt(SO_PEERCRED)", errno))
}
