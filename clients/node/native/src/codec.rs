//! The protocol codec, exposed for the shared test vectors: JavaScript
//! checks that the frames the addon would send and read are the recorded
//! ones.

use napi::bindgen_prelude::Buffer;
use napi_derive::napi;
use zygote_proto::{ClientMessage, ServerMessage, codec};

fn failure(what: &str, error: impl std::fmt::Display) -> napi::Error {
    napi::Error::from_reason(format!("{what}: {error}"))
}

/// Decodes one frame of `direction` (`"client"` or `"server"`) to its JSON form.
///
/// # Errors
///
/// When the frame does not decode, or the direction is neither.
#[napi]
pub fn decode_frame(direction: String, frame: Buffer) -> napi::Result<String> {
    let json = match direction.as_str() {
        "client" => codec::decode::<ClientMessage>(&frame).map(|m| serde_json::to_string(&m)),
        "server" => codec::decode::<ServerMessage>(&frame).map(|m| serde_json::to_string(&m)),
        other => return Err(failure("unknown direction", other)),
    };
    json.map_err(|error| failure("decoding", error))?
        .map_err(|error| failure("to JSON", error))
}

/// Encodes the JSON form of a message of `direction` to its frame.
///
/// # Errors
///
/// When the JSON is not a message of that direction.
#[napi]
pub fn encode_frame(direction: String, json: String) -> napi::Result<Buffer> {
    let bytes = match direction.as_str() {
        "client" => serde_json::from_str::<ClientMessage>(&json)
            .map_err(|error| failure("from JSON", error))
            .and_then(|m| codec::encode(&m).map_err(|error| failure("encoding", error))),
        "server" => serde_json::from_str::<ServerMessage>(&json)
            .map_err(|error| failure("from JSON", error))
            .and_then(|m| codec::encode(&m).map_err(|error| failure("encoding", error))),
        other => Err(failure("unknown direction", other)),
    }?;
    Ok(bytes.into())
}
