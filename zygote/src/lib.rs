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

/// The C library's message for `errno`, without std's " (os error N)":
/// the number travels and is printed apart.
pub(crate) fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(end) => text[..end].to_owned(),
        None => text,
    }
}
