//! The private zygote: one owner, one connection, no listening socket.
//!
//! Both private modes end up here: `zygote serve --private-fd N` (a
//! binary the client library launched) and a forked template
//! ([`crate::daemon::template`]). The zygote serves the one connected socket it
//! was given, through the same per-connection code as the shared daemon,
//! and only if the peer is of its own uid.
//!
//! # Lifetime
//!
//! The owner's end closing (the owner dropped its client, or died) ends
//! the connection. The zygote then calls `owner_gone`, where
//! kill-on-close children are signalled, and keeps running until every
//! child has been reaped, then exits. Children that are not kill-on-close
//! outlive their owner, as with std, and keep the zygote (a few MiB)
//! alive until they exit: a child is never left unreaped.
//!
//! The zygote does not use `PR_SET_PDEATHSIG`: it fires when the *thread*
//! that started the zygote exits, not the owner process, and the socket
//! closing already reports the owner's death, including by SIGKILL.
//! SIGINT is caught and ignored, so that Ctrl-C in a terminal, which
//! reaches the whole process group, does not kill the zygote under an
//! owner that handles it; the owner's exit still ends the zygote.
//! Signals with no meaning to it (SIGUSR1 from a child announcing itself,
//! and the like) are logged and ignored (see `daemon::stray`);
//! SIGTERM ends it.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tracing::{debug, info};
use zygote_proto::{AsyncSeqpacket, socket};

use crate::Error;
use crate::daemon::connection;
use crate::daemon::shutdown::Coordinator;
use crate::daemon::state::Daemon;
use crate::daemon::stray;

/// How often the exit path checks whether every child has been reaped.
const REAP_POLL: Duration = Duration::from_millis(10);

/// The spawner's nice value while busy: its one thread competes with every
/// running child for the CPU, and at 50 spawns in flight lost to them
/// (0.81 of posix_spawn's throughput, 0.88 with this). Children start at
/// nice 0 (`SCHED_RESET_ON_FORK`) and get their requested or the owner's
/// value.
const SPAWNER_NICE: i32 = -10;

/// Serves `socket`, one end of a socketpair whose other end the owner
/// holds, on a new single-threaded runtime, until the owner's end closes
/// and every child has been reaped.
///
/// # Errors
///
/// [`Error::Runtime`] when the runtime cannot start, [`Error::NotOwner`]
/// when the peer is of another uid, [`Error::PrivateSocket`] when
/// `socket` is not a connected Unix socket.
pub fn serve_private(socket: OwnedFd) -> Result<(), Error> {
    // On the thread that will spawn, before the runtime starts others: a
    // forked template sets its policy here (`zygote serve` did already).
    let policy = crate::spawn::run_daemon_as_batch();
    let boost = crate::spawn::prepare_boost(SPAWNER_NICE);
    if let Err(error) = crate::spawn::batch_only_while_idle() {
        tracing::debug!(%error, "the spawner stays under its policy when busy");
    }
    // Every thread of the zygote blocks SIGCHLD (see `reaper`): `zygote
    // serve` did already, a forked template does it here, while single.
    if let Err(error) = crate::spawn::block_child_signal() {
        tracing::warn!(%error, "cannot block SIGCHLD; it is handled by a signal handler");
    }
    // Likewise the signals with no meaning here, read by
    // `stray::log_stray_signals` (a template blocked them before its fork).
    if let Err(error) = crate::spawn::block_stray_signals() {
        tracing::warn!(%error, "cannot block the signals with no meaning here");
    }
    // One thread: the zygote does little besides clone, and a forked
    // template must stay single-threaded anyway.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    crate::spawn::log_daemon_policy(&policy);
    runtime.block_on(serve_owner(socket, boost))
}

async fn serve_owner(socket: OwnedFd, boost: std::io::Result<Option<i32>>) -> Result<(), Error> {
    let owner = socket::peer_credentials(socket.as_fd()).map_err(Error::PrivateSocket)?;
    let uid = rustix::process::geteuid();
    if owner.uid != uid {
        return Err(Error::NotOwner {
            peer: owner.uid.as_raw(),
            uid: uid.as_raw(),
        });
    }
    // Held (not read) for the zygote's life: the signals are then recorded,
    // not fatal. A terminal's ^C or hangup reaches the owner's whole process
    // group; the owner decides, and its exit ends the zygote. Children get
    // default dispositions back at exec.
    let _ignore_interrupt = signal(SignalKind::interrupt()).map_err(Error::Runtime)?;
    let _ignore_hangup = signal(SignalKind::hangup()).map_err(Error::Runtime)?;
    // Held since the start (`main`, or the template's fork): a SIGINT or
    // SIGHUP that came meanwhile is ignored now; SIGTERM, which has no
    // handler here, ends the zygote now as it would have then.
    crate::spawn::release_held_signals();
    let socket = AsyncSeqpacket::new(socket).map_err(Error::PrivateSocket)?;
    let daemon = Arc::new(Daemon::new());
    info!(owner = owner.pid.as_raw_nonzero(), "private zygote serving");
    match boost {
        Ok(Some(former)) => debug!(
            former,
            nice = SPAWNER_NICE,
            "spawner priority raised when busy"
        ),
        Ok(None) => debug!("spawner priority already high"),
        // Unprivileged owners: the zygote runs at their priority.
        Err(error) => debug!(%error, "spawner priority not raised"),
    }
    // A private zygote has no stop of its own: the owner leaving is its end.
    let coordinator = Coordinator::new();
    let active = daemon.pause.enter().await;
    let serving = async {
        connection::serve(
            socket,
            owner,
            Arc::clone(&daemon),
            coordinator.handle(),
            active,
        )
        .await;
        owner_gone(&daemon);
        reap_remaining(&daemon).await;
    };
    // Inside this future, not a task: `reap_remaining` waits for every task.
    tokio::select! {
        () = serving => {}
        never = stray::log_stray_signals() => match never {},
    }
    info!("owner gone and every child reaped; exiting");
    Ok(())
}

/// Called once when the owner's end has closed, before the remaining
/// children are reaped: the place where a private zygote signals its
/// kill-on-close children.
///
/// Kill-on-close itself belongs to each connection (the shared daemon
/// needs it too), so it happens as `connection::serve` returns; this hook
/// is where anything specific to losing the owner goes.
fn owner_gone(daemon: &Daemon) {
    debug!(children = daemon.metrics.children_running(), "owner gone");
    // No `Spawned` goes out any more; its grid's timer must not hold the
    // runtime (and the zygote's exit) for a second.
    daemon.deferrals.close();
}

/// Waits until no task is left on this runtime: each spawn's task lives
/// until its child is reaped, so this is "every child reaped", including
/// spawns that were still starting when the owner left.
async fn reap_remaining(daemon: &Daemon) {
    let metrics = tokio::runtime::Handle::current().metrics();
    while metrics.num_alive_tasks() > 0 {
        tokio::time::sleep(REAP_POLL).await;
    }
    debug_assert_eq!(daemon.metrics.children_running(), 0);
}
