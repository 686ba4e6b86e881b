//! The wire protocol of the zygote spawn server.
//!
//! A client and the daemon exchange [`ClientMessage`]s and
//! [`ServerMessage`]s over a `SOCK_SEQPACKET` Unix socket: one message per
//! frame, with the fds it refers to attached as `SCM_RIGHTS`. Messages are
//! encoded with postcard ([`encode`], [`decode`]). `PROTOCOL.md` beside this
//! crate specifies the bytes for implementers in other languages.
//!
//! This crate knows sockets and bytes, nothing of processes.
//!
//! # Layout
//!
//! - [`message`]: the message types, one per concept.
//! - [`codec`]: [`encode`] and [`decode`], pure functions, and the
//!   same per negotiated version ([`InVersion`], [`decode_client`],
//!   [`decode_server`]).
//! - `bytes`: byte-string fields encoded as one length and the bytes.
//! - `env`: [`Env`], an environment packed in one buffer.
//! - [`fdpass`]: one frame in or out with its fds (`sendmsg`/`recvmsg`).
//! - [`socket`]: creating close-on-exec SEQPACKET sockets.
//! - [`version`]: protocol versions, features and their negotiation.
//! - [`v2`]: the frozen version-2 layouts of the messages version 3
//!   changed, and their conversions.
//! - `sandbox`: the confinement a request asks for and the one applied.
//! - `template`: warm templates, their children and their list.
//! - `hello_ack`: [`HelloAck`]'s layout, which follows its version.
//! - `asyncio` (feature `tokio`): the same on tokio's reactor.

mod bytes;
pub mod codec;
mod env;
mod error;
pub mod fdpass;
mod hello_ack;
pub mod message;
mod sandbox;
pub mod socket;
mod template;
pub mod v2;
pub mod version;

#[cfg(feature = "tokio")]
mod asyncio;

#[cfg(feature = "tokio")]
pub use asyncio::{AsyncSeqpacket, AsyncSeqpacketListener, register};
pub use codec::{InVersion, decode, decode_client, decode_server, encode, encode_into};
pub use env::Env;
pub use error::ProtoError;
pub use fdpass::{Frame, RECV_BUFFER_BYTES, Received, recv_frame, recv_frame_in, send_frame};
pub use message::*;
pub use rustix::net::UCred;
pub use sandbox::{
    AppliedSandbox, FilesystemSpec, LandlockSpec, MountKind, MountSpec, NetworkMode, SandboxSpec,
    SeccompSpec,
};
pub use template::{
    PYTHON_TEMPLATE, TemplateInfo, TemplateList, TemplateListRequest, TemplateReady,
    TemplateRequest, TemplateSpawnRequest,
};
pub use version::{
    FEATURES_SINCE, Feature, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, SANDBOX_SINCE,
    TEMPLATES_SINCE, VersionMismatch, negotiate,
};

/// Largest frame either side sends or accepts, in bytes. A spawn request's
/// argv and environment must fit in one frame.
pub const MAX_FRAME_BYTES: usize = 256 * 1024;

/// Most fds one frame may carry (the kernel's own cap is 253).
pub const MAX_FDS_PER_FRAME: usize = 64;

/// The limits this crate enforces, as announced in [`HelloAck`].
pub const LIMITS: Limits = Limits {
    max_frame_bytes: MAX_FRAME_BYTES as u32,
    max_fds_per_frame: MAX_FDS_PER_FRAME as u32,
};
