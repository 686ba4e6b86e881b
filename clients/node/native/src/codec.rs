//! The protocol codec, exposed for the shared test vectors: JavaScript
//! checks that the frames the addon would send and read are the recorded
//! ones, in the newest layout and in each older version's.

use napi::bindgen_prelude::Buffer;
use napi_derive::napi;
use serde::Serialize;
use serde::de::DeserializeOwned;
use zygote_proto::{ClientMessage, PROTOCOL_VERSION, ServerMessage, codec, v2};

/// The first version whose layouts are this crate's current ones; older
/// versions use the frozen layouts of [`v2`].
const CURRENT_LAYOUTS_SINCE: u32 = 3;

fn failure(what: &str, error: impl std::fmt::Display) -> napi::Error {
    napi::Error::from_reason(format!("{what}: {error}"))
}

fn decode_as<T: DeserializeOwned + Serialize>(frame: &[u8]) -> napi::Result<String> {
    let message = codec::decode::<T>(frame).map_err(|error| failure("decoding", error))?;
    serde_json::to_string(&message).map_err(|error| failure("to JSON", error))
}

fn encode_as<T: DeserializeOwned + Serialize>(json: &str) -> napi::Result<Buffer> {
    let message = serde_json::from_str::<T>(json).map_err(|error| failure("from JSON", error))?;
    let bytes = codec::encode(&message).map_err(|error| failure("encoding", error))?;
    Ok(bytes.into())
}

fn current(version: Option<u32>) -> bool {
    version.unwrap_or(PROTOCOL_VERSION) >= CURRENT_LAYOUTS_SINCE
}

/// Decodes one frame of `direction` (`"client"` or `"server"`) to its JSON
/// form, in the layout of `version` (the newest when absent).
///
/// # Errors
///
/// When the frame does not decode, or the direction is neither.
#[napi]
pub fn decode_frame(
    direction: String,
    frame: Buffer,
    version: Option<u32>,
) -> napi::Result<String> {
    match (direction.as_str(), current(version)) {
        ("client", true) => decode_as::<ClientMessage>(&frame),
        ("client", false) => decode_as::<v2::ClientMessage>(&frame),
        ("server", true) => decode_as::<ServerMessage>(&frame),
        ("server", false) => decode_as::<v2::ServerMessage>(&frame),
        (other, _) => Err(failure("unknown direction", other)),
    }
}

/// Encodes the JSON form of a message of `direction` to its frame, in the
/// layout of `version` (the newest when absent).
///
/// # Errors
///
/// When the JSON is not a message of that direction.
#[napi]
pub fn encode_frame(direction: String, json: String, version: Option<u32>) -> napi::Result<Buffer> {
    match (direction.as_str(), current(version)) {
        ("client", true) => encode_as::<ClientMessage>(&json),
        ("client", false) => encode_as::<v2::ClientMessage>(&json),
        ("server", true) => encode_as::<ServerMessage>(&json),
        ("server", false) => encode_as::<v2::ServerMessage>(&json),
        (other, _) => Err(failure("unknown direction", other)),
    }
}
