//! The listening socket and the accept loop.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};
use zygote_proto::{AsyncSeqpacketListener, ProtoError, socket};

use crate::admission::ChildCounts;
use crate::lifetime::{self, Connection};
use crate::policy::Policy;
use crate::spawn::Credentials;
use crate::{Error, connection};

/// Default mode of a socket the daemon binds itself: only its own uid may
/// connect. A wider audience is the job of `--socket-mode` or a socket
/// unit's `SocketMode=`.
pub const SOCKET_MODE: u32 = 0o600;

/// State shared by every connection.
#[derive(Debug)]
pub struct Daemon {
    /// The daemon's effective uid.
    pub uid: u32,
    /// The daemon's own credentials, which children keep unless they
    /// switch.
    pub credentials: Credentials,
    /// Who may connect, and what each peer may ask for.
    pub policy: Policy,
    /// Children running or being started, per peer uid and in total.
    pub(crate) child_counts: std::sync::Mutex<ChildCounts>,
    /// The daemon's own `(resource, soft, hard)` limits, which children
    /// inherit for resources a request leaves unset.
    pub(crate) own_limits: Vec<(u32, u64, u64)>,
    /// Open connections, so that a shutdown closes them all the way a
    /// leaving client does (kill-on-close included).
    pub(crate) connections: std::sync::Mutex<Vec<std::sync::Weak<Connection>>>,
    /// When the daemon started serving.
    pub started: Instant,
    /// Children started and not yet reaped.
    pub children_running: AtomicU64,
    /// Connections open now.
    pub connections_open: AtomicU64,
    /// Connections accepted since start.
    pub connections_accepted: AtomicU64,
    /// Spawns whose child exec'd.
    pub spawns_succeeded: AtomicU64,
    /// Spawns that failed or were refused.
    pub spawns_failed: AtomicU64,
}

impl Daemon {
    /// State for a daemon starting now, under the default policy.
    pub fn new() -> Self {
        Self::with_policy(Policy::default_for(rustix::process::geteuid().as_raw()))
    }

    /// State for a daemon starting now, under `policy`.
    pub fn with_policy(policy: Policy) -> Self {
        let uid = rustix::process::geteuid().as_raw();
        let groups = rustix::process::getgroups()
            .map(|groups| groups.into_iter().map(|gid| gid.as_raw()).collect())
            .unwrap_or_default();
        Self {
            uid,
            credentials: Credentials {
                uid,
                gid: rustix::process::getegid().as_raw(),
                groups,
            },
            policy,
            child_counts: std::sync::Mutex::default(),
            connections: std::sync::Mutex::default(),
            own_limits: crate::peer::own_limits(),
            started: Instant::now(),
            children_running: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            connections_accepted: AtomicU64::new(0),
            spawns_succeeded: AtomicU64::new(0),
            spawns_failed: AtomicU64::new(0),
        }
    }
}

impl Daemon {
    /// Remembers an open connection; forgets closed ones on the way.
    pub(crate) fn register(&self, connection: &Arc<Connection>) {
        let mut connections = self.connections.lock().expect("connections poisoned");
        connections.retain(|weak| weak.strong_count() > 0);
        connections.push(Arc::downgrade(connection));
    }

    /// At shutdown: every connection ends as if its client had left, so
    /// kill-on-close children get their signal.
    fn close_all(&self) {
        let connections = std::mem::take(&mut *self.connections.lock().expect("poisoned"));
        for connection in connections.iter().filter_map(std::sync::Weak::upgrade) {
            lifetime::connection_closed(&connection);
        }
    }
}

impl Default for Daemon {
    fn default() -> Self {
        Self::new()
    }
}

/// A socket path the daemon bound, removed again on drop.
#[derive(Debug)]
pub struct BoundSocket {
    /// The listening socket.
    pub fd: OwnedFd,
    path: PathBuf,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds a listening socket at `path` with permission bits `mode`,
/// creating its directory.
///
/// A leftover socket file that nobody listens on is replaced; a live one is
/// [`Error::AlreadyListening`].
///
/// # Errors
///
/// [`Error::AlreadyListening`], [`Error::SocketPath`] or [`Error::Listen`].
pub fn bind(path: &Path, mode: u32) -> Result<BoundSocket, Error> {
    let path_error = |source: io::Error| Error::SocketPath {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(path_error)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if socket::connect_to(path, false).is_ok() {
                return Err(Error::AlreadyListening {
                    path: path.to_owned(),
                });
            }
            std::fs::remove_file(path).map_err(path_error)?;
        }
        Ok(_) => {
            return Err(path_error(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            )));
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(path_error(error)),
    }
    let fd = socket::listen_at(path, true).map_err(|source| Error::Listen {
        path: path.to_owned(),
        source,
    })?;
    let bound = BoundSocket {
        fd,
        path: path.to_owned(),
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(path_error)?;
    Ok(bound)
}

/// Accepts and serves connections under `policy` until `shutdown`
/// resolves.
///
/// Children are reaped by their own tasks, which end with the runtime; see
/// the README's known limits for what a stop does to running children.
///
/// # Errors
///
/// [`Error::Accept`] when the listener cannot be registered.
pub async fn run(
    listener: OwnedFd,
    policy: Policy,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let listener = AsyncSeqpacketListener::new(listener).map_err(Error::Accept)?;
    let daemon = Arc::new(Daemon::with_policy(policy));
    info!("serving");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => {
                info!("shutting down");
                daemon.close_all();
                return Ok(());
            }
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    tokio::spawn(connection::serve(socket, peer, Arc::clone(&daemon)));
                }
                Err(error) => back_off(&error).await,
            },
        }
    }
}

/// Accept errors are about one connection or a passing shortage (EMFILE);
/// the daemon must not die of them.
async fn back_off(error: &ProtoError) {
    let transient = matches!(error, ProtoError::Io { source, .. }
        if matches!(source.raw_os_error(), Some(libc::ECONNABORTED | libc::EPROTO | libc::EINTR)));
    if transient {
        warn!(%error, "accept failed");
    } else {
        error!(%error, "accept failed; pausing before the next try");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
