//! The two functions that turn messages into bytes and back.
//!
//! Decoding is pure and never touches a socket, so it can be tested and
//! fuzzed on plain byte slices.

use serde::{Serialize, de::DeserializeOwned};

use crate::message::{ClientMessage, ServerMessage};
use crate::version::{SANDBOX_SINCE, TEMPLATES_SINCE};
use crate::{ProtoError, RequestFailed, SpawnFailed, SpawnStage, v2};

/// Encodes a message as one frame's bytes (postcard).
///
/// # Errors
///
/// [`ProtoError::Encode`] if serde refuses the value, which for the types in
/// [`message`](crate::message) does not happen.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, ProtoError> {
    postcard::to_stdvec(message).map_err(ProtoError::Encode)
}

/// As [`encode`], appending to `buffer` and returning it: a sender that
/// keeps its buffer between messages allocates once instead of growing a
/// new vector through every power of two on each message.
///
/// # Errors
///
/// As [`encode`].
pub fn encode_into<T: Serialize>(message: &T, buffer: Vec<u8>) -> Result<Vec<u8>, ProtoError> {
    postcard::to_extend(message, buffer).map_err(ProtoError::Encode)
}

/// Decodes one frame's bytes. The whole frame must be consumed.
///
/// # Errors
///
/// [`ProtoError::Truncated`] when the bytes end mid-message,
/// [`ProtoError::TrailingBytes`] when bytes are left over, and
/// [`ProtoError::Malformed`] for anything else that does not decode.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ProtoError> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((message, [])) => Ok(message),
        Ok((_, rest)) => Err(ProtoError::TrailingBytes { count: rest.len() }),
        Err(postcard::Error::DeserializeUnexpectedEnd) => Err(ProtoError::Truncated),
        Err(source) => Err(ProtoError::Malformed(source)),
    }
}

/// A message to encode in the layout of a negotiated protocol version:
/// versions 3 and 4 as it is (version 4 only appended variants), versions
/// 1 and 2 in the frozen layouts of [`v2`]. Only the messages whose layout
/// changed are converted (a copy); the others encode as they are.
///
/// Encoding a [`ClientMessage`] whose spawn asks for a sandbox in an older
/// version fails: that layout has no room for it, and a sandbox is never
/// dropped silently. So does a template message below version 4. The
/// daemon's answers to template messages, which an older connection cannot
/// make, go to it as `RequestFailed` (`EPROTO`), and
/// [`SpawnStage::Template`] as [`SpawnStage::Exec`]: never as a variant
/// that connection cannot decode.
#[derive(Debug, Clone, Copy)]
pub struct InVersion<'a, T> {
    /// The message.
    pub message: &'a T,
    /// The connection's negotiated version.
    pub version: u32,
}

impl<'a, T> InVersion<'a, T> {
    /// `message` in the layout of `version`.
    pub fn new(message: &'a T, version: u32) -> Self {
        Self { message, version }
    }
}

impl Serialize for InVersion<'_, ServerMessage> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.version >= TEMPLATES_SINCE {
            return self.message.serialize(serializer);
        }
        if self.version >= SANDBOX_SINCE {
            return match self.message {
                ServerMessage::TemplateReady(crate::TemplateReady { id, .. })
                | ServerMessage::Templates(crate::TemplateList { id, .. }) => {
                    ServerMessage::RequestFailed(RequestFailed {
                        id: *id,
                        errno: rustix::io::Errno::PROTO.raw_os_error(),
                        message: "templates need protocol version 4".to_owned(),
                    })
                    .serialize(serializer)
                }
                ServerMessage::SpawnFailed(failed) if failed.stage == SpawnStage::Template => {
                    ServerMessage::SpawnFailed(SpawnFailed {
                        stage: SpawnStage::Exec,
                        ..failed.clone()
                    })
                    .serialize(serializer)
                }
                _ => self.message.serialize(serializer),
            };
        }
        match self.message {
            ServerMessage::Spawned(_)
            | ServerMessage::SpawnFailed(_)
            | ServerMessage::Status(_)
            | ServerMessage::TemplateReady(_)
            | ServerMessage::Templates(_) => {
                v2::ServerMessage::from(self.message.clone()).serialize(serializer)
            }
            // The same layout in every version, and the same variant index.
            _ => self.message.serialize(serializer),
        }
    }
}

impl Serialize for InVersion<'_, ClientMessage> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.version >= TEMPLATES_SINCE {
            return self.message.serialize(serializer);
        }
        if let ClientMessage::Template(_)
        | ClientMessage::SpawnFromTemplate(_)
        | ClientMessage::ListTemplates(_) = self.message
        {
            return Err(serde::ser::Error::custom(format!(
                "templates need protocol version {TEMPLATES_SINCE}; the connection speaks version {}",
                self.version
            )));
        }
        if self.version >= SANDBOX_SINCE {
            return self.message.serialize(serializer);
        }
        match self.message {
            ClientMessage::Spawn(_) => v2::ClientMessage::try_from(self.message.clone())
                .map_err(serde::ser::Error::custom)?
                .serialize(serializer),
            _ => self.message.serialize(serializer),
        }
    }
}

/// Decodes a client's frame in the layout of the connection's negotiated
/// `version` (see [`InVersion`]).
///
/// # Errors
///
/// As [`decode`].
pub fn decode_client(bytes: &[u8], version: u32) -> Result<ClientMessage, ProtoError> {
    if version >= SANDBOX_SINCE {
        decode(bytes)
    } else {
        decode::<v2::ClientMessage>(bytes).map(Into::into)
    }
}

/// Decodes the daemon's frame in the layout of the connection's
/// negotiated `version` (see [`InVersion`]).
///
/// # Errors
///
/// As [`decode`].
pub fn decode_server(bytes: &[u8], version: u32) -> Result<ServerMessage, ProtoError> {
    if version >= SANDBOX_SINCE {
        decode(bytes)
    } else {
        decode::<v2::ServerMessage>(bytes).map(Into::into)
    }
}
