//! The listening socket and the accept loop.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{error, info, warn};
use zygote_proto::{AsyncSeqpacketListener, ProtoError, socket};

use crate::activation::Notifier;
use crate::admission::ChildCounts;
use crate::lifetime::{self, Connection};
use crate::metrics::{Metrics, SpawnResult};
use crate::policy::Policy;
use crate::shutdown::Coordinator;
use crate::spawn::{self, Credentials, SpawnError, SpawnPlan, SpawnedChild, Spawner};
use crate::{Error, connection, exporter};

/// Default mode of a socket the daemon binds itself: only its own uid may
/// connect. A wider audience is the job of `--socket-mode` or a socket
/// unit's `SocketMode=`.
pub const SOCKET_MODE: u32 = 0o600;

/// How often the `STATUS=` line is refreshed for `systemctl status`.
const STATUS_EVERY: Duration = Duration::from_secs(5);

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
    /// Whether the daemon's real uid and gid equal its effective ones, so
    /// that a child meant to run with [`Daemon::credentials`] already does.
    pub(crate) plain_ids: bool,
    /// Open connections, so that a shutdown closes them all the way a
    /// leaving client does (kill-on-close included).
    pub(crate) connections: std::sync::Mutex<Vec<std::sync::Weak<Connection>>>,
    /// When the daemon started serving.
    pub started: Instant,
    /// Every counter, as Prometheus metrics; the `Status` reply reads them
    /// too, so the two never disagree.
    pub metrics: Metrics,
    /// Signal dispositions read at the first spawn (see [`Daemon::spawn`]).
    spawner: OnceLock<Option<Spawner>>,
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
            plain_ids: rustix::process::getuid() == rustix::process::geteuid()
                && rustix::process::getgid() == rustix::process::getegid(),
            started: Instant::now(),
            metrics: Metrics::new(),
            spawner: OnceLock::new(),
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

    /// Starts a child. The daemon's signal dispositions are read once, at
    /// the first spawn, when `serve` has long installed its handlers; its
    /// children then skip reading them from procfs.
    pub(crate) fn spawn(&self, plan: &SpawnPlan) -> Result<SpawnedChild, SpawnError> {
        match self.spawner.get_or_init(Spawner::with_current_dispositions) {
            Some(spawner) => spawner.spawn(plan),
            None => spawn::spawn(plan),
        }
    }

    /// Removes from `plan` what the child inherits from the daemon anyway:
    /// a credential switch to the daemon's own ids, and resource limits
    /// equal to the daemon's. Each of those syscalls runs in the child
    /// while the spawning thread waits (16 `setrlimit` cost ~30 µs, the
    /// switch ~20 µs). The daemon's limits are the ones read at its start:
    /// it never changes them, but a `prlimit` from outside would go
    /// unnoticed.
    pub(crate) fn drop_inherited_settings(&self, plan: &mut SpawnPlan) {
        if self.plain_ids && plan.credentials.as_ref() == Some(&self.credentials) {
            plan.credentials = None;
        }
        plan.rlimits.retain(|limit| {
            !self
                .own_limits
                .contains(&(limit.resource, limit.soft, limit.hard))
        });
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

/// What the daemon serves besides the spawn socket, and how it talks to
/// the service manager.
#[derive(Debug, Default)]
pub struct Options {
    /// The socket file the daemon bound itself; removed when accepting
    /// stops, so that new clients fail fast instead of queueing.
    pub bound: Option<BoundSocket>,
    /// Where to serve `/metrics`.
    pub metrics_listener: Option<std::net::TcpListener>,
    /// The service manager's notify socket (`Type=notify`).
    pub notifier: Option<Notifier>,
    /// The watchdog interval; pinged at half of it from the accept loop.
    pub watchdog: Option<Duration>,
    /// Who may connect and what each peer may ask for; the default policy
    /// for the daemon's uid when absent.
    pub policy: Option<Policy>,
}

/// Accepts and serves connections until `shutdown` resolves, then stops
/// gracefully; see [`run_with`].
///
/// # Errors
///
/// As [`run_with`].
pub async fn run(listener: OwnedFd, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    run_with(listener, Options::default(), shutdown).await
}

/// Accepts and serves connections until `shutdown` resolves, then stops
/// gracefully and returns:
///
/// 1. it stops accepting, and removes the socket file it bound;
/// 2. spawns in flight finish and their replies are sent; new spawn
///    requests are refused (`Admission`, `ESHUTDOWN`), while signal and
///    status requests are still answered;
/// 3. children keep being reaped and their exit notices delivered to
///    clients still connected; a connection with no spawn in flight and no
///    child running is closed;
/// 4. it returns once every connection is closed. Children whose client
///    has left are not waited for: they are left to the system's reaper.
///
/// A client that keeps a long-running child holds the stop up; the
/// caller's backstop (a second signal, systemd's `TimeoutStopSec=`) ends
/// it. When serving ends, by a finished stop or by this future being
/// dropped, connections still open are closed as if their clients had
/// left: kill-on-close children get their signal.
///
/// # Errors
///
/// [`Error::Accept`] when the listener cannot be registered,
/// [`Error::MetricsListen`] when the metrics listener cannot be.
pub async fn run_with(
    listener: OwnedFd,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let listener = AsyncSeqpacketListener::new(listener).map_err(Error::Accept)?;
    let daemon = Arc::new(match options.policy {
        Some(policy) => Daemon::with_policy(policy),
        None => Daemon::new(),
    });
    // However the serving ends (a finished stop, or this future dropped by
    // a second signal), every connection still open ends as if its client
    // had left, so kill-on-close children get their signal.
    let _close_all = CloseAllOnDrop(Arc::clone(&daemon));
    let exporter = match options.metrics_listener {
        Some(metrics) => {
            let address = metrics.local_addr().ok();
            let metrics = metrics
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(metrics))
                .map_err(|source| Error::MetricsListen {
                    address: address.map_or_else(|| "(unknown)".into(), |a| a.to_string()),
                    source,
                })?;
            if let Some(address) = address {
                info!(%address, "serving /metrics");
            }
            Some(AbortOnDrop(tokio::spawn(exporter::serve(
                metrics,
                daemon.metrics.clone(),
            ))))
        }
        None => None,
    };
    let notifier = options.notifier;
    let notify = |states: &[NotifyState<'_>]| {
        if let Some(notifier) = &notifier {
            notifier.notify(states);
        }
    };
    // WATCHDOG=1 at half the service manager's interval, as
    // sd_watchdog_enabled(3) advises, from this loop: a stuck loop is
    // what the watchdog must catch.
    let mut watchdog = Ticker::every(options.watchdog.map(|interval| interval / 2));
    let coordinator = Coordinator::new();
    info!("serving");
    notify(&[NotifyState::Ready, NotifyState::Status("serving")]);
    // `systemctl status` shows the last STATUS= line; keep it current.
    let mut status_every = Ticker::every(notifier.as_ref().map(|_| STATUS_EVERY));
    let serving = || {
        let metrics = &daemon.metrics;
        format!(
            "serving: {} connections, {} children running, {} spawns ok, {} failed",
            metrics.connections_open(),
            metrics.children_running(),
            metrics.spawns(SpawnResult::Ok),
            metrics.spawns(SpawnResult::Failed) + metrics.spawns(SpawnResult::Refused),
        )
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = watchdog.tick() => notify(&[NotifyState::Watchdog]),
            () = status_every.tick() => notify(&[NotifyState::Status(&serving())]),
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let task = connection::serve(socket, peer, Arc::clone(&daemon), coordinator.handle());
                    tokio::spawn(task);
                }
                Err(error) => back_off(&error).await,
            },
        }
    }
    drop(listener);
    drop(options.bound);
    let metrics = &daemon.metrics;
    let draining = || {
        format!(
            "stopping: {} connections, {} children running",
            metrics.connections_open(),
            metrics.children_running()
        )
    };
    info!(
        connections = metrics.connections_open(),
        children = metrics.children_running(),
        "stopping: no longer accepting; finishing spawns in flight"
    );
    notify(&[NotifyState::Stopping, NotifyState::Status(&draining())]);
    let stopped = coordinator.stop();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => break,
            () = watchdog.tick() => notify(&[NotifyState::Watchdog, NotifyState::Status(&draining())]),
        }
    }
    drop(exporter);
    info!("stopped");
    Ok(())
}

/// Closes every connection still open when dropped.
struct CloseAllOnDrop(Arc<Daemon>);

impl Drop for CloseAllOnDrop {
    fn drop(&mut self) {
        self.0.close_all();
    }
}

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A periodic tick in a `select!` loop, or never.
struct Ticker(Option<tokio::time::Interval>);

impl Ticker {
    /// Ticks every `period` (the first after one period); never for `None`
    /// or zero.
    fn every(period: Option<Duration>) -> Self {
        Self(period.filter(|p| !p.is_zero()).map(|period| {
            let start = tokio::time::Instant::now() + period;
            let mut ticks = tokio::time::interval_at(start, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks
        }))
    }

    async fn tick(&mut self) {
        match &mut self.0 {
            Some(ticks) => {
                ticks.tick().await;
            }
            None => std::future::pending().await,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spawn::{Credentials, SpawnPlan};
    use zygote_proto::ResourceLimit;

    fn plan(rlimits: Vec<ResourceLimit>, credentials: Option<Credentials>) -> SpawnPlan {
        SpawnPlan {
            exec_candidates: vec![c"/bin/true".to_owned()],
            argv: vec![c"true".to_owned()],
            envp: Vec::new(),
            cwd: None,
            fds: Vec::new(),
            new_session: false,
            process_group: None,
            umask: None,
            rlimits,
            credentials,
        }
    }

    #[test]
    fn settings_the_child_inherits_anyway_are_dropped() {
        let daemon = Daemon::new();
        let (resource, soft, hard) = daemon.own_limits[7];
        let same = ResourceLimit {
            resource,
            soft,
            hard,
        };
        let lower = ResourceLimit {
            resource,
            soft: soft.min(hard) / 2,
            hard,
        };
        let other = Credentials {
            uid: daemon.credentials.uid.wrapping_add(1),
            ..daemon.credentials.clone()
        };

        let mut kept = plan(vec![same, lower], Some(other.clone()));
        daemon.drop_inherited_settings(&mut kept);
        assert_eq!(kept.rlimits, vec![lower], "only the differing limit stays");
        assert_eq!(kept.credentials, Some(other), "a real switch stays");

        let mut own = plan(vec![same], Some(daemon.credentials.clone()));
        daemon.drop_inherited_settings(&mut own);
        assert!(own.rlimits.is_empty());
        assert_eq!(
            own.credentials.is_none(),
            daemon.plain_ids,
            "a switch to the daemon's own ids is dropped when real ids match"
        );
    }
}
