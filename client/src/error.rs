//! The crate's one error type.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use zygote_proto::{ProtocolErrorKind, SpawnStage};

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while talking to the zygote.
///
/// Messages say what failed, on what, and why. Convert to
/// [`std::io::Error`] with `?` or `into()` when a caller wants the std
/// shape: the [`kind`](Error::kind) is kept (a missing program is still
/// [`io::ErrorKind::NotFound`]), and the original `Error` stays reachable
/// through [`io::Error::get_ref`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Connecting to the zygote's socket failed.
    #[error("{}", connect_message(.path, .source))]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The error from `connect(2)`.
        source: io::Error,
    },
    /// The peer did not complete the hello/hello-ack exchange.
    #[error("handshake with the zygote at {endpoint} failed: {reason}")]
    Handshake {
        /// Where we connected (a path, or an inherited socket).
        endpoint: String,
        /// What we expected and what happened instead.
        reason: String,
    },
    /// The zygote could not start the child.
    #[error(
        "failed to spawn {program:?}: the {} step failed: {message} ({})",
        .stage.name(),
        io::Error::from_raw_os_error(*.errno)
    )]
    Spawn {
        /// The program as given to [`Command::new`](crate::Command::new).
        program: OsString,
        /// The setup step that failed.
        stage: SpawnStage,
        /// The `errno` value; see [`Error::raw_os_error`].
        errno: i32,
        /// The zygote's description.
        message: String,
    },
    /// The connection to the zygote closed or broke. Every request in
    /// flight fails with this; nothing hangs. A child waiting for its exit
    /// status gets it from its pidfd instead, where the kernel keeps it
    /// (Linux 6.15); before that, it fails with this too.
    #[error("lost the connection to the zygote at {endpoint}: {reason}")]
    ZygoteLost {
        /// Where we were connected.
        endpoint: String,
        /// Why the connection ended, as far as the client knows.
        reason: String,
    },
    /// The zygote refused the connection (e.g. a version mismatch or a
    /// denied peer), or one side broke the protocol.
    #[error("protocol error with the zygote at {endpoint} ({}): {message}", .kind.name())]
    Protocol {
        /// Where we were connected.
        endpoint: String,
        /// What went wrong.
        kind: ProtocolErrorKind,
        /// The details.
        message: String,
    },
    /// A local operation failed (reading `/proc`, a pipe, starting a
    /// runtime, ...).
    #[error("{op} failed: {source}")]
    Io {
        /// What we were doing.
        op: String,
        /// The error.
        source: io::Error,
    },
    /// A request would carry more fds than the zygote accepts in one frame.
    #[error(
        "the request carries {count} fds but the zygote accepts at most {limit}{}",
        if *.inherited { " (inherit_fds() passes every fd of this process that is not close-on-exec)" } else { "" }
    )]
    TooManyFds {
        /// How many fds the request needed.
        count: usize,
        /// The zygote's limit.
        limit: usize,
        /// Whether [`inherit_fds`](crate::Command::inherit_fds) was on.
        inherited: bool,
    },
    /// The encoded request (argv plus environment) does not fit in one
    /// frame; the analogue of `E2BIG` from `execve(2)`.
    #[error(
        "the spawn request is {size} bytes, over the zygote's limit of {limit} bytes per frame (argv and environment must fit)"
    )]
    RequestTooLarge {
        /// The encoded size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A request other than a spawn failed in the zygote.
    #[error("{op} request failed in the zygote: {message} ({})", io::Error::from_raw_os_error(*.errno))]
    Request {
        /// The request, e.g. "signal".
        op: &'static str,
        /// The `errno` value.
        errno: i32,
        /// The zygote's description.
        message: String,
    },
    /// No `zygote` binary to launch a private zygote from.
    #[error("{}", not_found_message(.env.as_deref(), .exe_dir.as_deref()))]
    ZygoteNotFound {
        /// `$ZYGOTE_BIN`, if it was set.
        env: Option<PathBuf>,
        /// The current executable's directory, if known.
        exe_dir: Option<PathBuf>,
    },
    /// Starting the `zygote` binary failed.
    #[error("failed to launch a private zygote from {binary}: {source}")]
    Launch {
        /// The binary.
        binary: PathBuf,
        /// The error from spawning it.
        source: io::Error,
    },
    /// The client was made by another process, of which this one is a
    /// forked copy: the connection (and a blocking client's runtime)
    /// belong to that process, and nothing was sent on it. An async client
    /// of a socket path connects again on its own instead; a blocking
    /// client, or a client of a private zygote or an inherited socket,
    /// cannot: make a new client in this process.
    #[error(
        "this zygote client belongs to process {owner}, and this is a forked copy of it (pid \
         {pid}): make a new client in this process"
    )]
    Forked {
        /// The process that made the client.
        owner: u32,
        /// This process.
        pid: u32,
    },
    /// The command cannot be expressed (a NUL byte in an argument, a child
    /// fd number below 3, ...). Nothing was sent.
    #[error("invalid command: {reason}")]
    InvalidInput {
        /// What is wrong.
        reason: String,
    },
}

fn connect_message(path: &Path, source: &io::Error) -> String {
    match source.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => format!(
            "no zygote is listening at {} ({source}); start one with `zygote serve`, \
             or point ZYGOTE_SOCKET at a running one",
            path.display()
        ),
        _ => format!(
            "failed to connect to the zygote at {}: {source}",
            path.display()
        ),
    }
}

fn not_found_message(env: Option<&Path>, exe_dir: Option<&Path>) -> String {
    let env = match env {
        Some(path) => format!("ZYGOTE_BIN={} is not an executable file", path.display()),
        None => "ZYGOTE_BIN is not set".to_owned(),
    };
    let exe = match exe_dir {
        Some(dir) => format!("{} does not exist", dir.join("zygote").display()),
        None => "the current executable's directory is unknown".to_owned(),
    };
    format!(
        "no zygote binary found to launch a private zygote: {env}, {exe}, and no `zygote` \
         is on PATH; install it, or set ZYGOTE_BIN to its path"
    )
}

impl Error {
    /// The OS error number behind this error, when there is one: the
    /// zygote's `errno` for [`Spawn`](Error::Spawn) and
    /// [`Request`](Error::Request), the local one for `Connect` and `Io`,
    /// and `E2BIG` for [`RequestTooLarge`](Error::RequestTooLarge).
    ///
    /// `io::Error::from_raw_os_error(e.raw_os_error()?)` gives the bare
    /// std error, as `std::process::Command::spawn` would have returned.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Self::Spawn { errno, .. } | Self::Request { errno, .. } => Some(*errno),
            Self::Connect { source, .. }
            | Self::Io { source, .. }
            | Self::Launch { source, .. } => source.raw_os_error(),
            Self::RequestTooLarge { .. } => Some(libc::E2BIG),
            _ => None,
        }
    }

    /// The [`io::ErrorKind`] that fits this error.
    pub fn kind(&self) -> io::ErrorKind {
        if let Some(errno) = self.raw_os_error() {
            return io::Error::from_raw_os_error(errno).kind();
        }
        match self {
            Self::Connect { source, .. }
            | Self::Io { source, .. }
            | Self::Launch { source, .. } => source.kind(),
            Self::ZygoteNotFound { .. } => io::ErrorKind::NotFound,
            Self::ZygoteLost { .. } => io::ErrorKind::ConnectionAborted,
            Self::Protocol {
                kind: ProtocolErrorKind::PermissionDenied,
                ..
            } => io::ErrorKind::PermissionDenied,
            Self::Protocol {
                kind: ProtocolErrorKind::UnsupportedVersion,
                ..
            } => io::ErrorKind::Unsupported,
            Self::Handshake { .. } | Self::Protocol { .. } => io::ErrorKind::InvalidData,
            Self::TooManyFds { .. } | Self::InvalidInput { .. } => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::Other,
        }
    }

    /// True when the connection to the zygote is gone. A client of a
    /// socket path reconnects at its next request; one of a private
    /// zygote or an inherited socket cannot (see [`Client`](crate::Client)).
    pub fn is_zygote_lost(&self) -> bool {
        matches!(self, Self::ZygoteLost { .. })
    }

    pub(crate) fn io(op: impl Into<String>, source: impl Into<io::Error>) -> Self {
        Self::Io {
            op: op.into(),
            source: source.into(),
        }
    }

    /// A local failure of the proto layer: its io::Error when it has one.
    pub(crate) fn proto(op: impl Into<String>, error: zygote_proto::ProtoError) -> Self {
        match error {
            zygote_proto::ProtoError::Io { source, .. } => Self::io(op, source),
            other => Self::io(op, io::Error::other(other)),
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            reason: reason.into(),
        }
    }
}

impl From<Error> for io::Error {
    fn from(error: Error) -> Self {
        io::Error::new(error.kind(), error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_enoent_says_no_zygote_listens() {
        let error = Error::Connect {
            path: "/run/zygote/zygote.sock".into(),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        let text = error.to_string();
        assert!(
            text.starts_with("no zygote is listening at /run/zygote/zygote.sock"),
            "{text}"
        );
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn spawn_error_keeps_errno_and_kind() {
        let error = Error::Spawn {
            program: "nosuch".into(),
            stage: SpawnStage::Exec,
            errno: libc::ENOENT,
            message: "execve failed".into(),
        };
        assert_eq!(error.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(
            error.to_string(),
            "failed to spawn \"nosuch\": the exec step failed: execve failed \
             (No such file or directory (os error 2))"
        );
        let io_error = io::Error::from(error);
        assert_eq!(io_error.kind(), io::ErrorKind::NotFound);
        let inner = io_error.get_ref().and_then(|e| e.downcast_ref::<Error>());
        assert!(matches!(inner, Some(Error::Spawn { .. })));
    }

    #[test]
    fn zygote_lost_is_connection_aborted() {
        let error = Error::ZygoteLost {
            endpoint: "x".into(),
            reason: "closed".into(),
        };
        assert!(error.is_zygote_lost());
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
    }
}
