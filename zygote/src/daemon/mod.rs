//! The daemon: accepting clients, checking them, and starting, watching
//! and reaping their children.
//!
//! The modules form layers; each uses only those listed before it:
//!
//! - [`cgroup`]: the delegated cgroup subtree and each child's cgroup.
//! - [`handover`]: what a live upgrade carries from one image to the next,
//!   and the pause that brings every task to a safe point first.
//! - [`sandbox`]: a request's sandbox and the policy's imposed profile
//!   checked and resolved into the child's `SandboxPlan`.
//! - [`policy`], `peer`, `shutdown`, `reply`: who may ask for what, who
//!   the peer is (`SO_PEERCRED`, `SO_PEERPIDFD`, `/proc`), the stop notice,
//!   sending a reply.
//! - [`features`]: the optional features offered, and the refusal of
//!   a request that uses one that is not.
//! - `stray`: the signals that mean nothing to a zygote, logged and
//!   otherwise ignored.
//! - `spawners`: the threads a busy shared daemon clones on, first come
//!   first served.
//! - [`uid_spawners`]: the per-uid spawner processes that start the
//!   children switching to another uid.
//! - [`state`]: what every connection shares: the [`state::Daemon`].
//! - `admission`: child slots per peer and in total.
//! - `plan`: checking a [`SpawnRequest`](zygote_proto::SpawnRequest) and
//!   turning it into a [`SpawnPlan`](crate::spawn::SpawnPlan) before any
//!   process exists.
//! - `reaper`: waiting for each child's exit on its pidfd.
//! - `lifetime`: one spawn from request to exit notice: timeouts and
//!   kill-on-close.
//! - `connection`: one client's conversation: peer check, handshake,
//!   requests, replies.
//! - [`server`]: binding the socket and the accept loop.
//! - [`upgrade`]: the live upgrade: save, check, exec in place, restore.
//! - [`private`]: a zygote serving one owner over one socket, launched
//!   (`zygote serve --private-fd`) or forked ([`template`]).

mod admission;
pub mod cgroup;
mod connection;
pub(crate) mod deferral;
pub mod features;
pub mod handover;
mod lifetime;
mod loglimit;
mod outbox;
mod parked;
pub(crate) mod peer;
pub(crate) mod plan;
pub mod policy;
pub mod private;
mod reaper;
mod reply;
pub mod sandbox;
pub mod server;
mod shutdown;
mod spawners;
pub mod state;
pub(crate) mod stray;
pub mod template;
pub(crate) mod templates;
pub mod uid_spawners;
pub mod upgrade;
