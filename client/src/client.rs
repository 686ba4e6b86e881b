//! [`Client`]: a handle on one connection to the zygote.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::oneshot;
use zygote_proto::{Limits, ProtoError};

use crate::connection::Connection;
use crate::fork::Owner;
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
///
/// # When the zygote goes away
///
/// A client made with [`connect`](Client::connect) or
/// [`from_env`](Client::from_env) reconnects on its own: the first request
/// after the connection was lost (the zygote crashed, was killed or
/// restarted) connects to the same path again, retrying
/// [`RECONNECT_ATTEMPTS`] times with a backoff from 25 ms doubling to 1 s
/// (about 5 s in all) before it fails with [`Error::ZygoteLost`]. A
/// request already sent when the connection dropped fails with
/// `ZygoteLost` and is not retried (the zygote may have acted on it).
/// Children spawned before the loss keep working through their pidfds:
/// [`Child::wait`](crate::Child::wait) reads their exit status from the
/// pidfd (Linux 6.15), and kill and signals go through the pidfd. A
/// client on a private zygote ([`launch_private`](Client::launch_private))
/// or an inherited socket ([`from_fd`](Client::from_fd)) has nothing to
/// reconnect to: its requests fail with `ZygoteLost`, which says so.
///
/// # After `fork(2)`
///
/// A forked copy of the process never uses the parent's connection. A
/// client of a socket path connects again in the copy, at its first
/// request there (run on a tokio runtime the copy builds: the parent's
/// runtime threads are not copied); a client of a private zygote or an
/// inherited socket fails there with [`Error::Forked`]. A
/// [`Child`](crate::Child) copied into the fork cannot be waited for or
/// signalled through the zygote there (`Error::Forked`), and its
/// `kill_on_drop` leaves the parent's child alone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// How many times a client tries to reconnect to its socket path before a
/// request fails; see [`Client`].
pub const RECONNECT_ATTEMPTS: u32 = 10;
/// The pause after the first failed reconnection attempt; it doubles up to
/// [`RECONNECT_MAX_PAUSE`].
const RECONNECT_FIRST_PAUSE: Duration = Duration::from_millis(25);
const RECONNECT_MAX_PAUSE: Duration = Duration::from_secs(1);

struct Inner {
    /// The current connection; replaced when a lost one is reconnected.
    /// Read by every request, written only on reconnection: a read lock
    /// lets threads spawning at once pass without queueing.
    session: RwLock<Arc<Session>>,
    /// The socket path to reconnect to; `None` for a private zygote or an
    /// inherited socket.
    path: Option<PathBuf>,
    /// Held while reconnecting, so that concurrent requests make one
    /// attempt between them.
    redial: tokio::sync::Mutex<()>,
    /// umask and rlimits, read at the first spawn and kept until
    /// [`Client::refresh_process_state`]; read-locked by every spawn.
    settings: RwLock<Option<Arc<ProcessSettings>>>,
}

/// One connection and its reader task, which stops when the last holder
/// (a client, or a child spawned on this connection) drops it.
#[derive(Debug)]
pub(crate) struct Session {
    connection: Arc<Connection>,
    _stop_reader: oneshot::Sender<()>,
    /// The process that connected: a forked copy never uses the
    /// connection (see `fork`).
    pub(crate) owner: Owner,
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.owner.is_current() {
            // A forked copy: dropping the socket would deregister it from
            // the runtime's epoll instance, which is the parent's too (an
            // epoll fd is shared across fork), and the parent's reader
            // would never wake again. The copy keeps it instead.
            std::mem::forget(Arc::clone(&self.connection));
        }
    }
}

impl std::ops::Deref for Session {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.connection
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.current().endpoint())
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
        let session = Self::dial(&path).await?;
        Ok(Self::with(session, Some(path)))
    }

    /// Connects to `path` and says hello: one attempt.
    async fn dial(path: &Path) -> Result<Session> {
        let path = path.to_path_buf();
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
        Ok(Self::with(Self::start(socket, endpoint).await?, None))
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
        Ok(Self::with(Self::start(socket, endpoint).await?, None))
    }

    async fn start(socket: OwnedFd, endpoint: String) -> Result<Session> {
        let (connection, scratch) = Connection::handshake(socket, endpoint).await?;
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(Arc::clone(&connection).run_reader(scratch, stop_rx));
        Ok(Session {
            connection,
            _stop_reader: stop_tx,
            owner: Owner::current(),
        })
    }

    fn with(session: Session, path: Option<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Inner {
                session: RwLock::new(Arc::new(session)),
                path,
                redial: tokio::sync::Mutex::new(()),
                settings: RwLock::new(None),
            }),
        }
    }

    /// The current connection, lost or not.
    fn current(&self) -> Arc<Session> {
        Arc::clone(&self.inner.session.read().expect("session lock poisoned"))
    }

    /// The connection for a new request: the current one, or, when it was
    /// lost, a new one to the same path.
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteLost`] when the connection was lost and cannot be
    /// reconnected (no path, or every attempt failed), or when the zygote
    /// refused the new connection.
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let current = self.current();
        if !current.owner.is_current() {
            return Box::pin(self.reconnect_after_fork(&current)).await;
        }
        if !current.is_lost() {
            return Ok(current);
        }
        // Boxed: this rare path's future is large, and every request's
        // future would otherwise be as large.
        Box::pin(self.reconnect(&current)).await
    }

    /// In a forked copy of the process that connected: a connection of
    /// this process's own to the same path, never the parent's.
    ///
    /// # Errors
    ///
    /// [`Error::Forked`] when there is no path to connect to; the errors
    /// of [`Client::connect`].
    async fn reconnect_after_fork(&self, parents: &Session) -> Result<Arc<Session>> {
        let Some(path) = &self.inner.path else {
            return Err(parents.owner.forked());
        };
        // No lock that a thread of the parent may have held at the fork:
        // concurrent first requests may each connect; the last one stays.
        let session = Arc::new(Self::dial(path).await?);
        *self.inner.session.write().expect("session lock poisoned") = Arc::clone(&session);
        Ok(session)
    }

    async fn reconnect(&self, lost: &Session) -> Result<Arc<Session>> {
        let lost_error = lost.lost_error();
        let Some(path) = &self.inner.path else {
            return Err(match lost_error {
                Error::ZygoteLost { endpoint, reason } => Error::ZygoteLost {
                    endpoint,
                    reason: format!(
                        "{reason}; a client of a private zygote or an inherited socket \
                         cannot reconnect: make a new one (Client::launch_private)"
                    ),
                },
                other => other,
            });
        };
        let _redialing = self.inner.redial.lock().await;
        // Another request may have reconnected while this one waited.
        let current = self.current();
        if !current.is_lost() {
            return Ok(current);
        }
        let started = tokio::time::Instant::now();
        let mut pause = RECONNECT_FIRST_PAUSE;
        let mut attempt = 1;
        let last_error = loop {
            match Self::dial(path).await {
                Ok(session) => {
                    let session = Arc::new(session);
                    *self.inner.session.write().expect("session lock poisoned") =
                        Arc::clone(&session);
                    return Ok(session);
                }
                // A zygote that answers and refuses us will not change its
                // mind: say so at once.
                Err(error @ Error::Protocol { .. }) => return Err(error),
                Err(error) if attempt >= RECONNECT_ATTEMPTS => break error,
                Err(_) => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RECONNECT_MAX_PAUSE);
            attempt += 1;
        };
        let reason = match lost_error {
            Error::ZygoteLost { reason, .. } => reason,
            other => other.to_string(),
        };
        Err(Error::ZygoteLost {
            endpoint: path.display().to_string(),
            reason: format!(
                "{reason}, and reconnecting failed {RECONNECT_ATTEMPTS} times over {:.1} s: \
                 {last_error}",
                started.elapsed().as_secs_f64()
            ),
        })
    }

    /// A [`Command`] for `program` on this connection; the same as
    /// `Command::new(&client, program)`.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        Command::new(self, program)
    }

    /// The zygote's version, as it announced it on the current
    /// connection.
    pub fn server_version(&self) -> String {
        self.current().server_version().to_owned()
    }

    /// The protocol version spoken on the current connection: the newest
    /// that both this crate and the zygote know.
    pub fn protocol_version(&self) -> u32 {
        self.current().protocol_version()
    }

    /// The names of the optional features the zygote offers on the current
    /// connection (see [`Feature`](crate::Feature)), as it announced them;
    /// names this crate does not know are kept.
    pub fn features(&self) -> Vec<String> {
        self.current().features().to_vec()
    }

    /// Whether the zygote offers `feature` on the current connection. A
    /// request using a feature it does not offer fails with `EOPNOTSUPP`
    /// and a message naming the feature.
    pub fn offers(&self, feature: crate::Feature) -> bool {
        let connection = self.current();
        connection
            .features()
            .iter()
            .any(|name| name == feature.name())
    }

    /// The limits in force on the current connection (the tighter of the
    /// zygote's and this crate's).
    pub fn limits(&self) -> Limits {
        self.current().limits()
    }

    /// Asks the zygote for its version, uptime and counters (what
    /// `zygote status` prints).
    ///
    /// # Errors
    ///
    /// [`Error::ZygoteLost`] when the connection ends first.
    pub async fn status(&self) -> Result<DaemonStatus> {
        self.session()
            .await?
            .status()
            .await
            .map(DaemonStatus::from_reply)
    }

    /// False once the connection has ended, until the next request
    /// reconnects (clients of a socket path only; see [`Client`]).
    pub fn is_connected(&self) -> bool {
        !self.current().is_lost()
    }

    /// Makes the next spawn read this process's umask and resource limits
    /// again. A client reads them at its first spawn and reuses them, as
    /// reading them costs more than the rest of a request; call this after
    /// changing either (`umask(2)`, `setrlimit(2)`) for children to see
    /// the change. Clones share one copy.
    pub fn refresh_process_state(&self) {
        *self.inner.settings.write().expect("settings lock poisoned") = None;
    }

    /// Requests on the current connection still waiting for a reply.
    #[cfg(test)]
    pub(crate) fn pending_requests(&self) -> usize {
        self.current().pending_requests()
    }

    /// The umask and rlimits for a request, read on first use.
    pub(crate) fn process_settings(&self) -> Arc<ProcessSettings> {
        let cached = self.inner.settings.read().expect("settings lock poisoned");
        if let Some(settings) = &*cached {
            return Arc::clone(settings);
        }
        drop(cached);
        let mut cached = self.inner.settings.write().expect("settings lock poisoned");
        Arc::clone(cached.get_or_insert_with(|| Arc::new(ProcessSettings::read())))
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
