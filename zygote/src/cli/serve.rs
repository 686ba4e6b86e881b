//! `zygote serve`: take what systemd hands over, check the kernel, bind,
//! and serve until SIGTERM/SIGINT; or, with `--private-fd`, serve one
//! inherited socket as a private zygote.

use std::thread::available_parallelism;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::cli::ServeArgs;
use crate::daemon::cgroup::Subtree;
use crate::daemon::policy::Policy;
use crate::daemon::private;
use crate::daemon::server::{self, Options};
use crate::service::activation::Activation;
use crate::{Error, spawn};

/// Runs the daemon until SIGTERM, SIGINT or SIGHUP, then stops gracefully
/// (see [`server::run_with`]); a second signal, or `--stop-timeout`
/// passing, ends the stop at once.
///
/// `activation` is what [`crate::service::activation::take`] took at startup.
///
/// # Errors
///
/// When the kernel is too old, a socket cannot be bound or was passed
/// twice, or the runtime cannot start.
pub fn serve(args: &ServeArgs, activation: Activation) -> Result<(), Error> {
    // Before any thread exists or any fd of ours is opened (the activated
    // sockets already are close-on-exec).
    if let Err(error) = spawn::mark_inherited_fds_cloexec() {
        tracing::warn!(%error, "could not mark inherited fds close-on-exec (needs Linux 5.11)");
    }
    spawn::check_kernel_support().map_err(Error::KernelUnsupported)?;
    if let Some(fd) = args.private_fd {
        let socket =
            spawn::take_inherited_fd(fd).map_err(|source| Error::InheritedFd { fd, source })?;
        return private::serve_private(socket);
    }
    let Activation {
        spawn: activated_spawn,
        metrics: activated_metrics,
        notifier,
        watchdog,
        warnings,
    } = activation;
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let uid = rustix::process::geteuid().as_raw();
    let policy = match &args.policy {
        Some(path) => Policy::load(path, uid)?,
        None => Policy::default_for(uid),
    };
    tracing::info!(limits = ?policy.limits, "policy loaded");
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
        ..Options::default()
    };
    let listener = match (activated_spawn, &args.socket) {
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
            let path = path
                .clone()
                .or_else(|| std::env::var_os(zygote_client::SOCKET_ENV).map(Into::into))
                .unwrap_or_else(zygote_client::default_socket_path);
            let bound = server::bind(&path, args.socket_mode)?;
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
    // Sized by the cgroup-aware CPU count: threads a CPU quota cannot run
    // only add latency.
    let workers = available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    let stop_timeout = (args.stop_timeout > 0).then(|| Duration::from_secs(args.stop_timeout));
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

/// Counts SIGTERM, SIGINT and SIGHUP deliveries.
///
/// SIGHUP is a graceful stop, as SIGTERM is: the daemon has nothing to
/// reload (the policy is read at start) and no live upgrade yet. Under
/// socket activation the next connection starts the binary afresh, so a
/// SIGHUP amounts to a restart that keeps connected clients' children.
fn count_signals() -> Result<watch::Receiver<u32>, Error> {
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::Runtime)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Runtime)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(Error::Runtime)?;
    let (count_tx, count) = watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
                _ = hangup.recv() => "SIGHUP",
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
