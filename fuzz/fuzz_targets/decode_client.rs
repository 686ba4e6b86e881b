//! The daemon's decoder on arbitrary frames: it must return an error, never
//! panic, and whatever decodes must encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zygote_proto::{ClientMessage, decode, encode};

fuzz_target!(|bytes: &[u8]| {
    if let Ok(message) = decode::<ClientMessage>(bytes) {
        let again = encode(&message).expect("a decoded message encodes");
        let back: ClientMessage = decode(&again).expect("its encoding decodes");
        assert_eq!(back, message);
    }
});
