//! The zygote daemon: a small template process that starts children for
//! clients over a SEQPACKET Unix socket.
//!
//! # Layout
//!
//! - [`server`]: binding the socket and the accept loop ([`server::run`]).
//! - `connection`: one client's conversation: peer check, handshake,
//!   requests, replies.
//! - `peer`: who the peer is, from `SO_PEERCRED`, `SO_PEERPIDFD` and
//!   `/proc`.
//! - [`policy`]: the policy file; who may connect and ask for what.
//! - `admission`: child slots per peer and in total.
//! - `lifetime`: one spawn from request to exit notice: timeouts and
//!   kill-on-close.
//! - `plan`: checking a [`SpawnRequest`](zygote_proto::SpawnRequest) and
//!   turning it into a [`spawn::SpawnPlan`] before any process exists.
//! - [`spawn`]: creating the child; the only module with unsafe process
//!   code.
//! - `reaper`: waiting for each child's exit on its pidfd.
//! - `shutdown`: the stop notice and completion guard of a graceful stop.
//! - [`metrics`]: the counters, as Prometheus metrics; `exporter` serves
//!   them over HTTP.
//! - [`activation`]: what systemd hands over: sockets, the notify socket,
//!   the watchdog.
//! - [`serve`]: the `zygote serve` command around [`server::run_with`].
//! - [`private`]: a zygote serving one owner over one socket, launched
//!   (`zygote serve --private-fd`) or forked ([`template`]).
//! - [`template`]: [`template::fork_template`], first in a Rust `main`.
//! - [`run`]: the `zygote run` command, a client of the daemon.
//! - [`status`]: the `zygote status` command.
//! - [`cli`], [`logging`]: flags and log setup of the binary.

pub mod activation;
mod admission;
pub mod cli;
mod connection;
mod error;
mod exporter;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod lifetime;
pub mod logging;
pub mod metrics;
mod peer;
mod plan;
pub mod policy;
pub mod private;
mod reaper;
pub mod run;
pub mod serve;
pub mod server;
mod shutdown;
pub mod spawn;
pub mod status;
pub mod template;

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
