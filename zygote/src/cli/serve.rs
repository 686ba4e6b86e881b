//! `zygote serve`: take what systemd hands over, check the kernel, bind,
//! and serve until SIGTERM/SIGINT; or, with `--private-fd`, serve one
//! inherited socket as a private zygote.

use std::thread::available_parallelism;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::cli::ServeArgs;
use crate::daemon::cgroup::Subtree;
use crate::daemon::handover::{self, SavedDaemon};
use crate::daemon::policy::Policy;
use crate::daemon::private;
use crate::daemon::server::{self, Options, Restored};
use crate::daemon::templates::Settings;
use crate::daemon::upgrade::Handover;
use crate::service::activation::Activation;
use crate::service::activation::Notifier;
use crate::{Error, spawn};

/// Runs the daemon until SIGTERM or SIGINT, then stops gracefully (see
/// [`server::run_with`]); a second signal, or `--stop-timeout` passing,
/// ends the stop at once. SIGHUP upgrades in place
/// ([`crate::daemon::upgrade`]); `handover` is what an earlier image
/// handed over, when this one was started that way.
///
/// `activation` is what [`crate::service::activation::take`] took at startup.
///
/// # Errors
///
/// When the kernel is too old, a template setting of the environment is
/// bad, a socket cannot be bound or was passed twice, or the runtime
/// cannot start.
pub fn serve(
    args: &ServeArgs,
    activation: Activation,
    handover: Option<Handover>,
) -> Result<(), Error> {
    // Before any thread exists or any fd of ours is opened (the activated
    // sockets already are close-on-exec).
    if let Err(error) = spawn::mark_inherited_fds_cloexec() {
        tracing::warn!(%error, "could not mark inherited fds close-on-exec (needs Linux 5.11)");
    }
    spawn::check_kernel_support().map_err(Error::KernelUnsupported)?;
    // A live upgrade keeps serving whatever the environment says (the
    // templates then use their defaults for a bad value, with a warning).
    if handover.is_none() {
        Settings::from_env().map_err(Error::Setting)?;
    }
    if let Some(fd) = args.private_fd {
        let socket =
            spawn::take_inherited_fd(fd).map_err(|source| Error::InheritedFd { fd, source })?;
        return private::serve_private(socket);
    }
    let Activation {
        spawn: mut activated_spawn,
        metrics: activated_metrics,
        notifier,
        watchdog,
        warnings,
    } = activation;
    let mut upgraded_afresh = false;
    match handover.map(|handover| (handover.state.is_ok(), handover)) {
        Some((true, handover)) => {
            let Ok(state) = handover.state else {
                unreachable!("checked above")
            };
            return serve_restored(args, state);
        }
        Some((false, handover)) => {
            if let Err(error) = &handover.state {
                tracing::error!(
                    %error,
                    "upgraded in place, but the state handed over cannot be read: serving afresh \
                     on the same listening socket; clients connected before the upgrade lost \
                     their connection, and the old children are reaped as orphans"
                );
            }
            activated_spawn = handover.discard();
            upgraded_afresh = activated_spawn.is_some();
        }
        None => {}
    }
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let uid = rustix::process::geteuid().as_raw();
    let policy = match &args.policy {
        Some(path) => Policy::load(path, uid)?,
        None => Policy::default_for(uid),
    };
    tracing::info!(limits = ?policy.limits, "policy loaded");
    crate::daemon::sandbox::prepare_seccomp();
    // Before the runtime's threads exist: the daemon moves into a leaf.
    let cgroups =
        Subtree::setup(args.cgroup.as_deref(), &policy.peer_caps()).map_err(Error::Cgroup)?;
    let mut options = Options {
        notifier,
        watchdog,
        policy: Some(policy),
        no_cgroups: cgroups.is_none().then(|| {
            "this zygote has no cgroup subtree (see its log; run it with --cgroup PATH or \
             Delegate=yes)"
                .to_owned()
        }),
        cgroups,
        upgrades: true,
        ..Options::default()
    };
    let listener = match (activated_spawn, &args.socket) {
        (Some(fd), Some(_)) if upgraded_afresh => fd,
        (Some(_), Some(path)) => {
            return Err(Error::Conflict(format!(
                "systemd passed a spawn socket, and --socket {} names another; drop --socket",
                path.display()
            )));
        }
        (Some(fd), None) => {
            tracing::info!("listening on the socket-activated spawn socket");
            fd
        }
        (None, path) => {
            let given = path
                .clone()
                .or_else(|| std::env::var_os(zygote_client::SOCKET_ENV).map(Into::into));
            let roots_default = given.is_none() && falls_back_to_roots_socket();
            let path = given.unwrap_or_else(zygote_client::default_socket_path);
            let bound = server::bind(&path, args.socket_mode).map_err(|error| {
                if roots_default {
                    Error::NoRuntimeDir {
                        source: Box::new(error),
                    }
                } else {
                    error
                }
            })?;
            tracing::info!(socket = %path.display(), "listening");
            let fd = bound.fd.try_clone().map_err(Error::Runtime)?;
            options.bound = Some(bound);
            fd
        }
    };
    options.metrics_listener = match (activated_metrics, args.metrics_listen) {
        (Some(_), Some(address)) => {
            return Err(Error::Conflict(format!(
                "systemd passed a metrics socket, and --metrics-listen {address} names another; \
                 drop --metrics-listen"
            )));
        }
        (Some(fd), None) => Some(std::net::TcpListener::from(fd)),
        (None, Some(address)) => {
            Some(
                std::net::TcpListener::bind(address).map_err(|source| Error::MetricsListen {
                    address: address.to_string(),
                    source,
                })?,
            )
        }
        (None, None) => None,
    };
    run(args, listener, options)
}

/// Serves what an earlier image handed over (a live upgrade): the policy,
/// the cgroup subtree and every socket come from the state, not from the
/// arguments or the environment.
fn serve_restored(args: &ServeArgs, state: SavedDaemon) -> Result<(), Error> {
    let adopt = |fd: i32| spawn::adopt_fd(fd).map_err(|source| Error::InheritedFd { fd, source });
    let listener = adopt(state.listener)?;
    let bound = match &state.bound_path {
        Some(path) => Some(server::BoundSocket::adopt(
            listener.try_clone().map_err(Error::Runtime)?,
            path.clone(),
        )),
        None => None,
    };
    let metrics_listener = state
        .metrics_listener
        .map(|fd| adopt(fd).map(std::net::TcpListener::from))
        .transpose()?;
    let notifier = match state.notify_socket {
        Some(fd) => Some(
            Notifier::from_fd(adopt(fd)?).map_err(|source| Error::InheritedFd { fd, source })?,
        ),
        None => None,
    };
    let options = Options {
        bound,
        metrics_listener,
        notifier,
        watchdog: state.watchdog_usec.map(Duration::from_micros),
        policy: Some(state.policy),
        cgroups: state.cgroups.map(Subtree::restore),
        no_cgroups: Some(state.no_cgroups),
        upgrades: true,
        restored: Some(Restored {
            started: handover::from_mono_ns(state.started_mono_ns),
            counters: state.counters,
            child_nofile: state.child_nofile,
            connections: state.connections,
            leftover_cgroups: state.leftover_cgroups,
            reply_to: state.reply_to,
            written_by: state.written_by,
        }),
    };
    run(args, listener, options)
}

/// Runs the runtime and serves until stopped.
fn run(args: &ServeArgs, listener: std::os::fd::OwnedFd, options: Options) -> Result<(), Error> {
    // Sized by the cgroup-aware CPU count: threads a CPU quota cannot run
    // only add latency.
    let workers = available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    let stop_timeout = (args.stop_timeout > 0).then(|| Duration::from_secs(args.stop_timeout));
    // The runtime's threads keep the stop signals blocked (held since
    // `main`); this thread, in `block_on` for the daemon's life, releases
    // them in `run_with` once SIGHUP's handler too is in place, and takes
    // them from then on.
    runtime.block_on(async {
        let signals = count_signals()?;
        let first = wait_for_signals(signals.clone(), 1);
        let second = wait_for_signals(signals.clone(), 2);
        let deadline = async {
            wait_for_signals(signals, 1).await;
            match stop_timeout {
                Some(timeout) => tokio::time::sleep(timeout).await,
                None => std::future::pending().await,
            }
        };
        // Either ending drops the serving future, whose guard closes every
        // open connection as if its client had left.
        tokio::select! {
            served = server::run_with(listener, options, first) => served,
            () = second => {
                tracing::warn!("second signal: exiting without waiting for the stop to finish");
                Ok(())
            }
            never = crate::daemon::stray::log_stray_signals() => match never {},
            () = deadline => {
                tracing::warn!(
                    stop_timeout_secs = args.stop_timeout,
                    "stop timeout: closing every connection and exiting without waiting for their children"
                );
                Ok(())
            }
        }
    })
}

/// Whether the default socket of this process is root's
/// (`/run/zygote/zygote.sock`) although it does not run as root: its
/// `XDG_RUNTIME_DIR` is unset or empty.
fn falls_back_to_roots_socket() -> bool {
    !rustix::process::geteuid().is_root()
        && std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|dir| dir.is_empty())
}

/// Counts SIGTERM and SIGINT deliveries. (SIGHUP is a live upgrade, see
/// [`crate::daemon::upgrade`].)
fn count_signals() -> Result<watch::Receiver<u32>, Error> {
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::Runtime)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Runtime)?;
    let (count_tx, count) = watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            count_tx.send_modify(|count| *count += 1);
            if *count_tx.borrow() == 1 {
                tracing::info!(signal = name, "stopping gracefully");
            }
        }
    });
    Ok(count)
}

async fn wait_for_signals(mut count: watch::Receiver<u32>, at_least: u32) {
    let _ = count.wait_for(|count| *count >= at_least).await;
}
