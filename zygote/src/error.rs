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
    /// A daemon not run as root, with no `--socket`, `$ZYGOTE_SOCKET` or
    /// `$XDG_RUNTIME_DIR`, could not create root's default socket.
    #[error(
        "{source}; that is root's default socket, used because XDG_RUNTIME_DIR is not set: set \
         XDG_RUNTIME_DIR, or pass --socket PATH (e.g. --socket $HOME/zygote.sock)"
    )]
    NoRuntimeDir {
        /// The error binding root's default socket.
        #[source]
        source: Box<Error>,
    },
    /// The kernel lacks a feature the daemon needs.
    #[error("this kernel cannot run zygote: {0}")]
    KernelUnsupported(String),
    /// The async runtime could not be built.
    #[error("failed to start the async runtime: {0}")]
    Runtime(#[source] io::Error),
    /// A private zygote's socket is not a connected Unix socket, or could
    /// not be set up.
    #[error("failed to set up the private zygote's socket: {0}")]
    PrivateSocket(#[source] ProtoError),
    /// `--private-fd` named an fd that could not be taken over.
    #[error("failed to take over inherited fd {fd} (--private-fd): {source}")]
    InheritedFd {
        /// The fd number given.
        fd: i32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The peer of a private zygote's socket is of another uid.
    #[error(
        "the private zygote's peer has uid {peer}, but the zygote serves only its owner, uid {uid}"
    )]
    NotOwner {
        /// The peer's uid.
        peer: u32,
        /// Our uid.
        uid: u32,
    },
    /// [`fork_template`](crate::daemon::template::fork_template) was called after
    /// a thread had started.
    #[error(
        "fork_template must be called before any thread starts, but this process already has \
         {threads} threads: call it first in main, before any runtime, thread pool or logger"
    )]
    TemplateTooLate {
        /// Threads found in `/proc/self/task`.
        threads: usize,
    },
    /// Forking the template failed.
    #[error("failed to fork the template zygote: {0}")]
    Fork(#[source] crate::spawn::ForkError),
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
    /// `LISTEN_FDS`/`LISTEN_FDNAMES` are malformed.
    #[error(
        "invalid socket activation variables (LISTEN_FDS, LISTEN_FDNAMES): {0}; \
         check the socket unit"
    )]
    Activation(#[source] io::Error),
    /// A socket-activated fd is not what its name promises.
    #[error("socket-activated socket {name:?} {problem}")]
    ActivatedSocket {
        /// Its `FileDescriptorName=`.
        name: String,
        /// What is wrong and what to change.
        problem: String,
    },
    /// The metrics listener could not be bound or registered.
    #[error("failed to listen for metrics on {address}: {source}")]
    MetricsListen {
        /// The address.
        address: String,
        /// The error from the kernel.
        #[source]
        source: io::Error,
    },
    /// A setting of the daemon's environment has a value it cannot use.
    #[error("invalid setting in the environment: {0}")]
    Setting(String),
    /// Two sources for one listener.
    #[error("{0}")]
    Conflict(String),
    /// The cgroup subtree asked for cannot be used, or the policy needs a
    /// controller that is not delegated.
    #[error("cgroup setup failed: {0}")]
    Cgroup(String),
}
