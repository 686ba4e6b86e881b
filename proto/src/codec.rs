//! The two functions that turn messages into bytes and back.
//!
//! Decoding is pure and never touches a socket, so it can be tested and
//! fuzzed on plain byte slices.

use serde::{Serialize, de::DeserializeOwned};

use crate::ProtoError;

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
