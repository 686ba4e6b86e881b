//! The listening socket and the accept loop.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tracing::{error, info, warn};
use zygote_proto::{AsyncSeqpacketListener, ProtoError, ResourceLimit, socket};

use crate::Error;
use crate::daemon::cgroup::Subtree;
use crate::daemon::connection;
use crate::daemon::policy::Policy;
use crate::daemon::shutdown::Coordinator;
use crate::daemon::state::{Daemon, UpgradeAsk};
use crate::daemon::upgrade;
use crate::service::activation::Notifier;
use crate::service::exporter;
use crate::service::metrics::SpawnResult;
use std::os::fd::{AsFd, AsRawFd};
use tokio::signal::unix::{SignalKind, signal};

/// Default mode of a socket the daemon binds itself: only its own uid may
/// connect. A wider audience is the job of `--socket-mode` or a socket
/// unit's `SocketMode=`.
pub const SOCKET_MODE: u32 = 0o600;

/// How often the `STATUS=` line is refreshed for `systemctl status`.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// `RLIMIT_NOFILE` as the protocol's resource number: libc types it `u32`
/// on glibc and `c_int` on musl.
#[allow(clippy::unnecessary_cast)]
const NOFILE: u32 = libc::RLIMIT_NOFILE as u32;

/// A socket path the daemon bound, removed again on drop.
#[derive(Debug)]
pub struct BoundSocket {
    /// The listening socket.
    pub fd: OwnedFd,
    path: PathBuf,
}

impl BoundSocket {
    /// A socket an earlier image of this daemon bound at `path` (a live
    /// upgrade); removed on drop as if bound here.
    pub fn adopt(fd: OwnedFd, path: PathBuf) -> Self {
        Self { fd, path }
    }
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
        std::fs::create_dir_all(dir)
            .map_err(|error| match error.kind() {
                // create_dir_all's EEXIST: a part of the path is a file.
                io::ErrorKind::AlreadyExists => io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", dir.display()),
                ),
                _ => error,
            })
            .map_err(path_error)?;
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
    // Bound and listening under a temporary name, given its mode, then
    // linked into place: a client that sees the path can connect (no
    // ECONNREFUSED between bind and listen), only with the final mode,
    // and a daemon that lost a start-up race fails instead of replacing
    // the winner's socket. A short name, for `sun_path`'s 108 bytes.
    let temporary = path.with_file_name(format!(".z{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    // Errors name the path asked for: the temporary name means nothing to
    // the user.
    let fd = socket::listen_at(&temporary, true).map_err(|source| Error::Listen {
        path: path.to_owned(),
        source,
    })?;
    let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))
        .and_then(|()| std::fs::hard_link(&temporary, path));
    let _ = std::fs::remove_file(&temporary);
    match placed {
        Ok(()) => Ok(BoundSocket {
            fd,
            path: path.to_owned(),
        }),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            Err(Error::AlreadyListening {
                path: path.to_owned(),
            })
        }
        Err(error) => Err(path_error(error)),
    }
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
    /// The delegated cgroup subtree, set up by [`Subtree::setup`]; each
    /// child gets its own cgroup in it.
    pub cgroups: Option<Subtree>,
    /// Why there is no subtree, told to clients whose requests need one.
    pub no_cgroups: Option<String>,
    /// Serve live upgrades: on SIGHUP and on `Upgrade` requests (see
    /// [`upgrade`]).
    pub upgrades: bool,
    /// What an earlier image handed over, when this one was started by a
    /// live upgrade.
    pub restored: Option<Restored>,
}

/// What an earlier image of the daemon handed over, besides the sockets
/// and the policy passed in [`Options`].
#[derive(Debug)]
pub struct Restored {
    /// When the daemon first started serving.
    pub started: std::time::Instant,
    /// The counters.
    pub counters: Vec<crate::daemon::handover::SavedCounter>,
    /// The fd limit children get when their request leaves it unset.
    pub child_nofile: Option<ResourceLimit>,
    /// Connections and children.
    pub connections: Vec<crate::daemon::handover::SavedConnection>,
    /// Cgroups of reaped children whose tree lives on.
    pub leftover_cgroups: Vec<crate::daemon::cgroup::SavedCgroup>,
    /// The `Upgrade` request to answer.
    pub reply_to: Option<(usize, u64)>,
    /// The version of the image that handed over.
    pub written_by: String,
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
    let Options {
        bound,
        metrics_listener,
        notifier,
        watchdog,
        policy,
        cgroups,
        no_cgroups,
        upgrades,
        restored,
    } = options;
    let (policy, nofile) = fitted_policy(policy);
    let daemon = Arc::new(new_daemon(
        policy,
        &nofile,
        cgroups,
        no_cgroups,
        restored.as_ref(),
    ));
    let coordinator = Coordinator::new();
    let (upgrade_tx, upgrade_rx) = tokio::sync::mpsc::channel::<UpgradeAsk>(1);
    let mut hangups = None;
    if upgrades {
        *daemon.upgrades.lock().expect("upgrades poisoned") = Some(upgrade_tx);
        hangups = Some(signal(SignalKind::hangup()).map_err(Error::Runtime)?);
    }
    // Signals held pending across an upgrade's exec get their handlers now.
    crate::spawn::release_held_signals();
    if let Some(restored) = restored {
        restore(&daemon, restored, &coordinator).await;
    }
    adopt_orphans();
    // However the serving ends (a finished stop, or this future dropped by
    // a second signal), every connection still open ends as if its client
    // had left, so kill-on-close children get their signal.
    let _close_all = CloseAllOnDrop(Arc::clone(&daemon));
    let upgrade_context = upgrade::Context {
        listener: listener.as_fd().as_raw_fd(),
        bound_path: bound.as_ref().map(|bound| bound.path.clone()),
        metrics_listener: metrics_listener.as_ref().map(AsRawFd::as_raw_fd),
        notify_socket: notifier.as_ref().map(Notifier::as_raw_fd),
        watchdog,
    };
    let exporter = serve_metrics(metrics_listener, &daemon)?;
    let mut serving = Serving {
        daemon: &daemon,
        notifier: notifier.as_ref(),
        // WATCHDOG=1 at half the service manager's interval, as
        // sd_watchdog_enabled(3) advises, from this loop: a stuck loop is
        // what the watchdog must catch.
        watchdog: Ticker::every(watchdog.map(|interval| interval / 2)),
    };
    serving
        .accept_until(
            &coordinator,
            listener,
            upgrade_rx,
            hangups,
            &upgrade_context,
            shutdown,
        )
        .await;
    // The socket file goes with the listener: new clients fail fast.
    drop(bound);
    serving.drain(coordinator).await;
    drop(exporter);
    info!("stopped");
    Ok(())
}

/// The policy given, or the default one for the daemon's uid, with its
/// defaulted limits lowered to fit the fd limit (raised first); logged.
fn fitted_policy(policy: Option<Policy>) -> (Policy, FdLimit) {
    let mut policy =
        policy.unwrap_or_else(|| Policy::default_for(rustix::process::geteuid().as_raw()));
    let nofile = raise_fd_limit();
    // Defaults the fd limit cannot hold are lowered; raise LimitNOFILE=
    // to serve more. One line: the journal's queue is short at start.
    let lowered = policy.fit_fds(nofile.raised);
    let limits = &policy.limits;
    info!(
        fd_limit = nofile.raised,
        lowered_to_fit_fd_limit = lowered,
        max_connections = limits.max_connections,
        max_connections_per_peer = limits.max_connections_per_peer,
        root_reserve = limits.root_reserve(),
        child_reserve = limits.child_reserve(),
        max_children = limits.max_children,
        max_children_per_peer = limits.max_children_per_peer,
        "limits"
    );
    (policy, nofile)
}

/// The daemon's shared state, with what an earlier image handed over.
fn new_daemon(
    policy: Policy,
    nofile: &FdLimit,
    cgroups: Option<Subtree>,
    no_cgroups: Option<String>,
    restored: Option<&Restored>,
) -> Daemon {
    let mut daemon = Daemon::with_policy(policy);
    daemon.use_spawner_threads();
    // Children keep the fd limit the daemon started with, not its raised
    // one: a soft limit above 1024 breaks programs that use select(2).
    daemon.child_nofile = (nofile.raised != nofile.original).then_some(ResourceLimit {
        resource: NOFILE,
        soft: nofile.original,
        hard: nofile.hard,
    });
    daemon.cgroups = cgroups;
    if let Some(reason) = no_cgroups {
        daemon.no_cgroups = reason;
    }
    if let Some(restored) = restored {
        daemon.started = restored.started;
        daemon.child_nofile = restored.child_nofile;
        let counters: Vec<_> = restored
            .counters
            .iter()
            .map(|counter| (counter.name.clone(), counter.labels.clone(), counter.value))
            .collect();
        daemon.metrics.restore_counters(&counters);
    }
    daemon
}

/// Takes over the connections and children an earlier image handed over.
async fn restore(daemon: &Arc<Daemon>, restored: Restored, coordinator: &Coordinator) {
    info!(from = restored.written_by, to = %crate::version(), "upgraded in place: restoring");
    upgrade::restore_connections(
        daemon,
        restored.connections,
        restored.leftover_cgroups,
        restored.reply_to,
        coordinator,
    )
    .await;
}

/// Serves `/metrics` on `listener`, if any, until the returned guard drops.
fn serve_metrics(
    listener: Option<std::net::TcpListener>,
    daemon: &Daemon,
) -> Result<Option<AbortOnDrop>, Error> {
    let Some(metrics) = listener else {
        return Ok(None);
    };
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
    Ok(Some(AbortOnDrop(tokio::spawn(exporter::serve(
        metrics,
        daemon.metrics.clone(),
    )))))
}

/// What the accept loop and the stop share: the daemon, and the
/// service manager's notify socket with its watchdog.
struct Serving<'a> {
    daemon: &'a Arc<Daemon>,
    notifier: Option<&'a Notifier>,
    watchdog: Ticker,
}

impl Serving<'_> {
    fn notify(&self, states: &[NotifyState<'_>]) {
        if let Some(notifier) = self.notifier {
            notifier.notify(states);
        }
    }

    /// Accepts connections, and performs upgrades, until `shutdown`
    /// resolves (or an upgrade gave way to it); then stops accepting.
    async fn accept_until(
        &mut self,
        coordinator: &Coordinator,
        listener: AsyncSeqpacketListener,
        mut upgrade_rx: tokio::sync::mpsc::Receiver<UpgradeAsk>,
        mut hangups: Option<tokio::signal::unix::Signal>,
        upgrade_context: &upgrade::Context,
        shutdown: impl Future<Output = ()>,
    ) {
        let daemon = self.daemon;
        info!("serving");
        self.notify(&[NotifyState::Ready, NotifyState::Status("serving")]);
        // `systemctl status` shows the last STATUS= line; keep it current.
        let mut status_every = Ticker::every(self.notifier.map(|_| STATUS_EVERY));
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
        let notify = |states: &[NotifyState<'_>]| {
            if let Some(notifier) = self.notifier {
                notifier.notify(states);
            }
        };
        let watchdog = &mut self.watchdog;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                () = watchdog.tick() => notify(&[NotifyState::Watchdog]),
                () = status_every.tick() => notify(&[NotifyState::Status(&serving())]),
                Some(ask) = upgrade_rx.recv() => {
                    if upgrade::perform(ask, daemon, upgrade_context, &notify, shutdown.as_mut()).await {
                        break;
                    }
                }
                Some(()) = next_hangup(&mut hangups) => {
                    info!(signal = "SIGHUP", "upgrade requested");
                    let ask = UpgradeAsk { from: None };
                    if upgrade::perform(ask, daemon, upgrade_context, &notify, shutdown.as_mut()).await {
                        break;
                    }
                }
                accepted = listener.accept() => match accepted {
                    Ok((socket, peer)) => {
                        // No upgrade is under way while this loop runs: at once.
                        let active = daemon.pause.enter().await;
                        let task = connection::serve(socket, peer, Arc::clone(daemon), coordinator.handle(), active);
                        tokio::spawn(task);
                    }
                    Err(error) => back_off(&error).await,
                },
            }
        }
        // Upgrade requests from now on are refused: the daemon is stopping.
        drop(upgrade_rx);
        drop(listener);
    }

    /// The stop: waits for every connection to finish, keeping the
    /// watchdog fed.
    async fn drain(&mut self, coordinator: Coordinator) {
        let metrics = &self.daemon.metrics;
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
        self.notify(&[NotifyState::Stopping, NotifyState::Status(&draining())]);
        let stopped = coordinator.stop();
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                () = &mut stopped => break,
                () = self.watchdog.tick() => self.notify(&[NotifyState::Watchdog, NotifyState::Status(&draining())]),
            }
        }
    }
}

/// The daemon's soft `RLIMIT_NOFILE` before and after [`raise_fd_limit`].
struct FdLimit {
    original: u64,
    raised: u64,
    hard: u64,
}

/// Raises the soft fd limit to the hard one: at the usual soft 1,024 the
/// default connection and child limits cannot be reached, and an fd
/// mapped to a number above it could not be placed in a child.
fn raise_fd_limit() -> FdLimit {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let original = limit.current.unwrap_or(u64::MAX);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let mut raised = original;
    if original < hard {
        let wanted = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match rustix::process::setrlimit(rustix::process::Resource::Nofile, wanted) {
            Ok(()) => raised = hard,
            Err(error) => warn!(%error, from = original, to = hard, "could not raise the fd limit"),
        }
    }
    FdLimit {
        original,
        raised,
        hard,
    }
}

/// The next SIGHUP, or never.
async fn next_hangup(hangups: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hangups {
        Some(hangups) => hangups.recv().await,
        None => std::future::pending().await,
    }
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

/// Makes the daemon a child subreaper and reaps the orphans it adopts:
/// grandchildren whose parent exited come to it, not to init, and do not
/// stay zombies. Our own children are reaped by pidfd; `spawn::reap_orphans`
/// never takes one of those.
fn adopt_orphans() {
    if let Err(error) = crate::spawn::become_subreaper() {
        warn!(%error, "cannot become a child subreaper; orphaned grandchildren go to init");
        return;
    }
    crate::daemon::reaper::reap_adopted_orphans();
}
