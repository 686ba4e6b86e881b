//! `zygote serve`: check the kernel, bind, and serve until SIGTERM/SIGINT;
//! or, with `--private-fd`, serve one inherited socket as a private zygote.

use std::thread::available_parallelism;

use tokio::signal::unix::{SignalKind, signal};

use crate::cli::ServeArgs;
use crate::{Error, private, server, spawn};

/// Runs the daemon until SIGTERM or SIGINT.
///
/// # Errors
///
/// When the kernel is too old, the socket cannot be bound, or the runtime
/// cannot start.
pub fn serve(args: &ServeArgs) -> Result<(), Error> {
    spawn::check_kernel_support().map_err(Error::KernelUnsupported)?;
    if let Some(fd) = args.private_fd {
        let socket =
            spawn::take_inherited_fd(fd).map_err(|source| Error::InheritedFd { fd, source })?;
        return private::serve_private(socket);
    }
    let path = args
        .socket
        .clone()
        .unwrap_or_else(zygote_client::default_socket_path);
    let bound = server::bind(&path)?;
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
        server::run(listener, shutdown).await
    })?;
    drop(bound);
    Ok(())
}
