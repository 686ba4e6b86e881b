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

use crate::{Error, connection};

/// Mode of a socket the daemon binds itself: only its own uid may connect.
/// A wider audience is the job of a socket unit's `SocketMode=`.
const SOCKET_MODE: u32 = 0o600;

/// State shared by every connection.
#[derive(Debug)]
pub struct Daemon {
    /// The daemon's effective uid; peers of this uid (and root) are served.
    pub uid: u32,
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
    /// State for a daemon starting now.
    pub fn new() -> Self {
        Self {
            uid: rustix::process::geteuid().as_raw(),
            started: Instant::now(),
            children_running: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            connections_accepted: AtomicU64::new(0),
            spawns_succeeded: AtomicU64::new(0),
            spawns_failed: AtomicU64::new(0),
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

/// Binds a listening socket at `path`, mode 0600, creating its directory.
///
/// A leftover socket file that nobody listens on is replaced; a live one is
/// [`Error::AlreadyListening`].
///
/// # Errors
///
/// [`Error::AlreadyListening`], [`Error::SocketPath`] or [`Error::Listen`].
pub fn bind(path: &Path) -> Result<BoundSocket, Error> {
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(path_error)?;
    Ok(bound)
}

/// Accepts and serves connections until `shutdown` resolves.
///
/// Children are reaped by their own tasks, which end with the runtime; see
/// the README's known limits for what a stop does to running children.
///
/// # Errors
///
/// [`Error::Accept`] when the listener cannot be registered.
pub async fn run(listener: OwnedFd, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let listener = AsyncSeqpacketListener::new(listener).map_err(Error::Accept)?;
    let daemon = Arc::new(Daemon::new());
    info!("serving");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => {
                info!("shutting down");
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
