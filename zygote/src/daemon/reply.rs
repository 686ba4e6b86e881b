//! Sending a reply to a client, shared by the connection loop and the
//! spawn tasks.

use std::os::fd::BorrowedFd;

use tracing::warn;
use zygote_proto::{AsyncSeqpacket, ServerMessage};

/// Sends a reply; a client that already left is not an error.
pub(crate) async fn send_reply(
    socket: &AsyncSeqpacket,
    message: &ServerMessage,
    fds: &[BorrowedFd<'_>],
) {
    if let Err(error) = socket.send_message(message, fds).await {
        if !error.is_disconnect() {
            warn!(%error, "failed to send a reply");
        }
    }
}
