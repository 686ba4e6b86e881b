//! `zygote serve`: check the kernel, bind, and serve until SIGTERM/SIGINT.

use std::thread::available_parallelism;

use tokio::signal::unix::{SignalKind, signal};

use crate::cli::ServeArgs;
use crate::policy::Policy;
use crate::{Error, server, spawn};

/// Runs the daemon until SIGTERM or SIGINT.
///
/// # Errors
///
/// When the kernel is too old, the socket cannot be bound, or the runtime
/// cannot start.
pub fn serve(args: &ServeArgs) -> Result<(), Error> {
    spawn::check_kernel_support().map_err(Error::KernelUnsupported)?;
    let uid = rustix::process::geteuid().as_raw();
    let policy = match &args.policy {
        Some(path) => Policy::load(path, uid)?,
        None => Policy::default_for(uid),
    };
    tracing::info!(limits = ?policy.limits, "policy loaded");
    let path = args
        .socket
        .clone()
        .unwrap_or_else(zygote_client::default_socket_path);
    let bound = server::bind(&path, args.socket_mode)?;
    tracing::info!(socket = %path.display(), "listening");
    // Sized by the cgroup-aware CPU count: threads a CPU quota cannot run
    // only add latency.
    let workers = available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    let listener = bound.fd.try_clone().map_err(Error::Runtime)?;
    runtime.block_on(async {
        let mut terminate = signal(SignalKind::terminate()).map_err(Error::Runtime)?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Runtime)?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        server::run(listener, policy, shutdown).await
    })?;
    drop(bound);
    Ok(())
}
