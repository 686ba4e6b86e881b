//! The hello/hello-ack exchange that opens every connection.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use zygote_proto::{
    AsyncSeqpacket, ClientMessage, Hello, Limits, MAX_FDS_PER_FRAME, MAX_FRAME_BYTES,
    OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, RECV_BUFFER_BYTES, ServerMessage, decode,
};

use super::{CLIENT_NAME, Connection, message_name};
use crate::{Error, Result};

impl Connection {
    /// Says hello on `socket` and waits for the acknowledgement.
    ///
    /// Returns the connection and the receive buffer for the reader task.
    ///
    /// # Errors
    ///
    /// [`Error::Handshake`] when the peer closes, sends garbage or
    /// something other than `HelloAck`; [`Error::Protocol`] when it refuses
    /// us with a `ProtocolError`.
    pub(crate) async fn handshake(
        socket: OwnedFd,
        endpoint: String,
    ) -> Result<(Arc<Self>, Vec<u8>)> {
        let handshake_error = |reason: String| Error::Handshake {
            endpoint: endpoint.clone(),
            reason,
        };
        let socket = AsyncSeqpacket::new(socket)
            .map_err(|error| handshake_error(format!("cannot use the socket: {error}")))?;
        let hello = ClientMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: CLIENT_NAME.into(),
        });
        socket
            .send_message(&hello, &[])
            .await
            .map_err(|error| handshake_error(format!("sending Hello failed: {error}")))?;
        let mut scratch = vec![0; RECV_BUFFER_BYTES];
        let frame = match socket.recv(&mut scratch).await {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                return Err(handshake_error(
                    "expected HelloAck, but the peer closed the connection".into(),
                ));
            }
            Err(error) => {
                return Err(handshake_error(format!(
                    "expected HelloAck, but receiving failed: {error}"
                )));
            }
        };
        let ack = match decode::<ServerMessage>(&frame.bytes) {
            Ok(ServerMessage::HelloAck(ack)) => ack,
            Ok(ServerMessage::ProtocolError(refusal)) => {
                return Err(Error::Protocol {
                    endpoint,
                    kind: refusal.kind,
                    message: refusal.message,
                });
            }
            Ok(other) => {
                return Err(handshake_error(format!(
                    "expected HelloAck, received {}",
                    message_name(&other)
                )));
            }
            Err(error) => {
                return Err(handshake_error(format!(
                    "expected HelloAck, received an undecodable frame: {error}"
                )));
            }
        };
        // The zygote answers in the newest version both know: ours or
        // older, never one we did not offer.
        if !(OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&ack.protocol_version) {
            return Err(handshake_error(format!(
                "this client speaks protocol versions {OLDEST_PROTOCOL_VERSION} to \
                 {PROTOCOL_VERSION}, the zygote answered in version {}",
                ack.protocol_version
            )));
        }
        // Our own caps apply too: the proto layer enforces them on sending.
        let limits = Limits {
            max_frame_bytes: ack.limits.max_frame_bytes.min(MAX_FRAME_BYTES as u32),
            max_fds_per_frame: ack.limits.max_fds_per_frame.min(MAX_FDS_PER_FRAME as u32),
        };
        let connection = Arc::new(Self {
            socket,
            endpoint,
            server_version: ack.server_version,
            protocol_version: ack.protocol_version,
            features: ack.features,
            limits,
            next_id: AtomicU64::new(1),
            state: Mutex::default(),
            lost: AtomicBool::new(false),
            send_buffer: Mutex::default(),
            last_request_bytes: AtomicUsize::new(0),
        });
        Ok((connection, scratch))
    }
}
