//! [`Client`]: a handle on one connection to the zygote.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use zygote_proto::{Limits, ProtoError};

use crate::connection::Connection;
use crate::transparent::ProcessSettings;
use crate::{Command, DaemonStatus, Error, Result};

/// The environment variable naming the zygote's socket, read by
/// [`Client::from_env`].
pub const SOCKET_ENV: &str = "ZYGOTE_SOCKET";

/// The socket path of a zygote started with defaults:
/// `$XDG_RUNTIME_DIR/zygote.sock` for a non-root user whose
/// `XDG_RUNTIME_DIR` is set, `/run/zygote/zygote.sock` otherwise.
pub fn default_socket_path() -> PathBuf {
    socket_path_for(
        rustix::process::geteuid().is_root(),
        std::env::var_os("XDG_RUNTIME_DIR"),
    )
}

fn socket_path_for(is_root: bool, runtime_dir: Option<OsString>) -> PathBuf {
    match runtime_dir {
        Some(dir) if !is_root && !dir.is_empty() => PathBuf::from(dir).join("zygote.sock"),
        _ => PathBuf::from("/run/zygote/zygote.sock"),
    }
}

/// A connection to a zygote, on tokio.
///
/// Cheap to clone: clones share the connection, and any number of tasks
/// may spawn through it at once. The connection closes when the last clone
/// and the last [`Child`](crate::Child) spawned through it are dropped.
///
/// A reader task is spawned on the current tokio runtime to receive
/// replies; it needs the runtime's IO driver (`enable_io`).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Arc<Connection>,
    /// umask and rlimits, read at the first spawn and kept until
    /// [`Client::refresh_process_state`].
    settings: Mutex<Option<Arc<ProcessSettings>>>,
    /// Dropped with the last handle, which stops the reader task.
    _stop_reader: oneshot::Sender<()>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.inner.connection.endpoint())
            .field("server_version", &self.server_version())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the zygote listening at `path` and says hello.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when nothing listens there (the message says
    /// so), [`Error::Handshake`] or [`Error::Protocol`] when the peer does
    /// not accept us.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let target = path.clone();
        // connect(2) blocks while the listener's backlog is full; keep that
        // off the async worker threads.
        let connected =
            tokio::task::spawn_blocking(move || zygote_proto::socket::connect_to(&target, false))
                .await
                .map_err(|error| Error::io("connecting", std::io::Error::other(error)))?;
        let socket = connected.map_err(|error| match error {
            ProtoError::Io { source, .. } => Error::Connect {
                path: path.clone(),
                source,
            },
            other => Error::proto(format!("connecting to {}", path.display()), other),
        })?;
        Self::start(socket, path.display().to_string()).await
    }

    /// Connects to the zygote named by `ZYGOTE_SOCKET`, or else to
    /// [`default_socket_path`].
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub async fn from_env() -> Result<Self> {
        match std::env::var_os(SOCKET_ENV) {
            Some(path) if !path.is_empty() => Self::connect(path).await,
            _ => Self::connect(default_socket_path()).await,
        }
    }

    /// Speaks to a zygote over an already-connected SEQPACKET socket, such
    /// as one end of a socketpair whose other end a private zygote holds.
    ///
    /// # Errors
    ///
    /// [`Error::Handshake`] or [`Error::Protocol`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub async fn from_fd(socket: OwnedFd) -> Result<Self> {
        let endpoint = format!("socket fd {}", socket.as_raw_fd());
        Self::start(socket, endpoint).await
    }

    /// Launches a private zygote, serving only this process, and connects
    /// to it; see [`crate::private`] for where the binary is found and
    /// how long the zygote lives. Call it at program start, before the
    /// process grows or opens anything sensitive.
    ///
    /// ```no_run
    /// # async fn example() -> zygote_client::Result<()> {
    /// let client = zygote_client::Client::launch_private().await?;
    /// let status = client.command("true").status().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteNotFound`], [`Error::Launch`], or as
    /// [`Client::from_fd`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub async fn launch_private() -> Result<Self> {
        let (socket, zygote) = crate::private::launch()?;
        let endpoint = format!("private zygote pid {}", zygote.id());
        Self::start(socket, endpoint).await
    }

    async fn start(socket: OwnedFd, endpoint: String) -> Result<Self> {
        let (connection, scratch) = Connection::handshake(socket, endpoint).await?;
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(Arc::clone(&connection).run_reader(scratch, stop_rx));
        Ok(Self {
            inner: Arc::new(Inner {
                connection,
                settings: Mutex::new(None),
                _stop_reader: stop_tx,
            }),
        })
    }

    /// A [`Command`] for `program` on this connection; the same as
    /// `Command::new(&client, program)`.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        Command::new(self, program)
    }

    /// The zygote's version, as it announced it.
    pub fn server_version(&self) -> &str {
        self.inner.connection.server_version()
    }

    /// The limits in force on this connection (the tighter of the zygote's
    /// and this crate's).
    pub fn limits(&self) -> Limits {
        self.inner.connection.limits()
    }

    /// Asks the zygote for its version, uptime and counters (what
    /// `zygote status` prints).
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteLost`] when the connection ends first.
    pub async fn status(&self) -> Result<DaemonStatus> {
        self.inner
            .connection
            .status()
            .await
            .map(DaemonStatus::from_reply)
    }

    /// False once the connection has ended; every request then fails with
    /// [`Error::ZygoteLost`] and a new `Client` is needed.
    pub fn is_connected(&self) -> bool {
        !self.inner.connection.is_lost()
    }

    /// Makes the next spawn read this process's umask and resource limits
    /// again. A client reads them at its first spawn and reuses them, as
    /// reading them costs more than the rest of a request; call this after
    /// changing either (`umask(2)`, `setrlimit(2)`) for children to see
    /// the change. Clones share one copy.
    pub fn refresh_process_state(&self) {
        *self.inner.settings.lock().expect("settings lock poisoned") = None;
    }

    /// The umask and rlimits for a request, read on first use.
    pub(crate) fn process_settings(&self) -> Arc<ProcessSettings> {
        let mut cached = self.inner.settings.lock().expect("settings lock poisoned");
        Arc::clone(cached.get_or_insert_with(|| Arc::new(ProcessSettings::read())))
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.inner.connection
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_path_follows_runtime_dir_for_users() {
        assert_eq!(
            socket_path_for(false, Some("/run/user/1000".into())),
            Path::new("/run/user/1000/zygote.sock")
        );
        assert_eq!(
            socket_path_for(false, None),
            Path::new("/run/zygote/zygote.sock")
        );
        assert_eq!(
            socket_path_for(false, Some("".into())),
            Path::new("/run/zygote/zygote.sock")
        );
        assert_eq!(
            socket_path_for(true, Some("/run/user/0".into())),
            Path::new("/run/zygote/zygote.sock")
        );
    }

    #[tokio::test]
    async fn connect_to_nothing_says_so() {
        let error = Client::connect("/nonexistent/zygote.sock")
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Connect { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .starts_with("no zygote is listening at /nonexistent/zygote.sock"),
            "{error}"
        );
    }
}
