use std::io;
use std::path::PathBuf;

use zygote_proto::ProtoError;

/// Errors of the daemon and the `zygote` tool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket path is taken by a live daemon.
    #[error("another zygote is already listening on {path}")]
    AlreadyListening {
        /// The socket path.
        path: PathBuf,
    },
    /// Creating the socket's directory, removing a stale socket, or setting
    /// its mode failed.
    #[error("failed to prepare socket path {path}: {source}")]
    SocketPath {
        /// The socket path.
        path: PathBuf,
        /// The error from the kernel.
        #[source]
        source: io::Error,
    },
    /// Binding or listening failed.
    #[error("failed to listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: ProtoError,
    },
    /// The kernel lacks a feature the daemon needs.
    #[error("this kernel cannot run zygote: {0}")]
    KernelUnsupported(String),
    /// The async runtime could not be built.
    #[error("failed to start the async runtime: {0}")]
    Runtime(#[source] io::Error),
    /// The policy file could not be read or parsed.
    #[error("failed to load policy {path}: {message}")]
    Policy {
        /// The policy file.
        path: PathBuf,
        /// What went wrong, with line and column for a parse error.
        message: String,
    },
    /// Accepting connections failed for good.
    #[error("failed to accept connections: {0}")]
    Accept(#[source] ProtoError),
}
