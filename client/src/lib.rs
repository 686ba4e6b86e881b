//! Client of the zygote spawn server: start child processes without
//! forking this (possibly large, busy) process.
//!
//! [`Command`] reads like [`std::process::Command`] and
//! `tokio::process::Command`; a program switches by changing one import
//! and passing a [`Client`]. The zygote starts the child and hands back its
//! pipes, a pidfd and, later, its exit status with resource usage.
//!
//! ```no_run
//! use zygote_client::{Client, Command, Stdio};
//!
//! # async fn example() -> zygote_client::Result<()> {
//! let client = Client::from_env().await?;
//!
//! let output = Command::new(&client, "ls").arg("-l").current_dir("/tmp").output().await?;
//! println!("{}: {}", output.status, String::from_utf8_lossy(&output.stdout));
//!
//! let mut child = Command::new(&client, "sleep")
//!     .arg("60")
//!     .stdin(Stdio::null())
//!     .spawn()
//!     .await?;
//! child.kill().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Synchronous code uses [`blocking`], which has the same names:
//!
//! ```no_run
//! use zygote_client::blocking::{Client, Command};
//!
//! # fn example() -> zygote_client::Result<()> {
//! let client = Client::from_env()?;
//! let status = Command::new(&client, "true").status()?;
//! assert!(status.success());
//! # Ok(())
//! # }
//! ```
//!
//! # Transparent by default
//!
//! A spawn request carries this process's own state, read at spawn time
//! (the umask and limits excepted, see below), so the child looks as if
//! this process had started it:
//! - the environment (`environ`, with the command's changes);
//! - the working directory (a relative `current_dir` is joined onto it);
//! - the umask, read from `/proc/self/status` (reading it with `umask(2)`
//!   would briefly change it under other threads);
//! - every resource limit (`getrlimit` of each `RLIMIT_*`);
//! - the umask and limits are read at a client's first spawn and reused,
//!   not read again at every spawn: that reading cost ~35 µs, most of a
//!   spawn's cost to the calling thread. A program that changes either
//!   later calls [`Client::refresh_process_state`];
//! - stdio: [`Stdio::inherit`] passes this process's own fd 0, 1 or 2.
//!
//! # Departures from std
//!
//! - **Fds.** The child gets its three stdio fds plus those mapped with
//!   [`Command::fd`], nothing else. A std child inherits every fd not
//!   marked close-on-exec; that leak is what the zygote exists to stop.
//!   [`Command::inherit_fds`] restores std's behaviour (at most 64 fds).
//! - **Parent.** The child's parent is the zygote, which reaps it and
//!   reports the status; [`Child::id`] is a pid in the zygote's pid
//!   namespace, while [`Child::pidfd`] is always right.
//! - **Session and process group.** The child starts in the zygote's
//!   session and process group, not this process's, so a terminal's job
//!   control (Ctrl-C) does not reach it unless the zygote shares the group.
//! - **Signals.** The zygote starts the child with default signal
//!   dispositions and an empty signal mask; signals this process ignores or
//!   blocks are not carried over (std carries them, except `SIGPIPE`).
//! - **Closed stdio.** If this process's fd 0, 1 or 2 is closed,
//!   [`Stdio::inherit`] gives the child `/dev/null` rather than a closed fd.
//! - **umask.** On kernels before 4.7, `/proc` does not report it, and the
//!   zygote's umask applies unless [`Command::umask`] sets one.
//! - **Async spawn.** [`Command::spawn`] is `async` (tokio's is not): it
//!   waits for the zygote's answer, which arrives after the child's exec.
//! - **Environment entries without `=`.** The environment is read with
//!   [`std::env::vars_os`], which skips an `environ` entry that has no `=`
//!   after its first byte (it names no variable); std passes such an entry
//!   on when the command changes nothing. Other odd entries, such as
//!   `=A=B` (name `=A`), reach the child byte for byte, as with std.
//! - **Errors.** Failures are this crate's [`Error`], which names the
//!   setup step that failed; it converts into [`std::io::Error`] keeping
//!   the [`ErrorKind`](std::io::ErrorKind) (e.g. `NotFound` for a missing
//!   program), with the errno available from [`Error::raw_os_error`].
//!
//! # Layout
//!
//! - [`client`](Client): connecting, the default socket path.
//! - `connection`: the handshake, and the reader task that dispatches
//!   replies by request id; no lock is held across an `.await`, so
//!   concurrent spawns do not queue.
//! - [`command`](Command) and `request`: the builder, and turning it plus
//!   the caller's state into a `SpawnRequest` with its fds (pure).
//! - `transparent`: reading the caller's environment, cwd, umask, rlimits
//!   and inheritable fds.
//! - [`child`](Child): the running child, its pidfd and tokio pipes.
//! - [`Stdio`], [`ExitStatus`], [`Output`], [`ResourceUsage`], [`Error`].
//! - [`DaemonStatus`]: the zygote's counters, from [`Client::status`].
//! - `template`: warm templates ([`Client::python_template`],
//!   [`Template`]) and [`Client::templates`].
//! - [`blocking`]: the synchronous flavour.
//! - [`private`]: finding and launching the `zygote` binary as a private
//!   zygote ([`Client::launch_private`]).
//! - `sys`: the `unsafe` code: borrowing an fd known only by number, and
//!   the `PIDFD_GET_INFO` ioctl that reads a lost child's exit status.

pub mod blocking;
mod child;
mod client;
mod command;
mod connection;
mod daemon_status;
mod error;
mod fork;
pub mod private;
mod request;
mod sandbox;
mod status;
mod stdio;
mod sys;
mod template;
mod transparent;

#[cfg(test)]
mod tests;

pub use child::{Child, ChildStderr, ChildStdin, ChildStdout};
pub use client::{Client, RECONNECT_ATTEMPTS, SOCKET_ENV, default_socket_path};
pub use command::Command;
pub use connection::{JobEvents, JobState};
pub use daemon_status::DaemonStatus;
pub use error::{Error, Result};
pub use sandbox::Sandbox;
pub use status::{ExitStatus, Output, ResourceUsage};
pub use stdio::Stdio;
pub use template::{
    DEFAULT_PYTHON, MAX_PRELOAD, MAX_PRELOAD_NAME_BYTES, Template, TemplateBuilder,
};
pub use zygote_proto::{
    AppliedSandbox, Feature, Limits, PROTOCOL_VERSION, PeerUse, ProtocolErrorKind, SpawnStage,
    SpawnerInfo, TemplateInfo,
};
