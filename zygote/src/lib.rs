//! The zygote daemon: a small template process that starts children for
//! clients over a SEQPACKET Unix socket.
//!
//! # Layout
//!
//! - [`daemon`]: the daemon itself: the accept loop, connections, peer
//!   policy, admission, child lifetimes and reaping; private zygotes and
//!   the forked [`template`].
//! - [`spawn`]: creating the child; the only module with unsafe process
//!   code.
//! - [`service`]: glue to the system around the daemon: systemd
//!   activation and notification, Prometheus metrics and their exporter,
//!   logging.
//! - [`cli`]: the `zygote` binary's commands: `serve`, `run`, `status`.

pub mod cli;
pub mod daemon;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod service;
pub mod spawn;

pub use daemon::template;
pub use error::Error;

/// A build tag that a copy of the binary may carry, patched into the file
/// in place (the upgrade tests make a "newer" binary this way, without a
/// second build): `ZYGOTE_BUILD_TAG:` then the tag, NUL-padded.
static BUILD_TAG: [u8; 64] = *b"ZYGOTE_BUILD_TAG:\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

/// The marker before the build tag in the binary.
pub const BUILD_TAG_MARKER: &[u8] = b"ZYGOTE_BUILD_TAG:";

/// This binary's version: the package version, plus `+TAG` when the file
/// carries a build tag.
pub fn version() -> String {
    // Read through black_box: the bytes in the file decide, not the
    // compiler's view of the constant.
    let tag = std::hint::black_box(&BUILD_TAG);
    let tag = &tag[BUILD_TAG_MARKER.len()..];
    let end = tag.iter().position(|byte| *byte == 0).unwrap_or(tag.len());
    match std::str::from_utf8(&tag[..end]) {
        Ok(tag) if !tag.is_empty() => format!("{}+{tag}", env!("CARGO_PKG_VERSION")),
        _ => env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// The C library's message for `errno`, without std's " (os error N)":
/// the number travels and is printed apart.
pub(crate) fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(end) => text[..end].to_owned(),
        None => text,
    }
}
