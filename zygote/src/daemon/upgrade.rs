//! Live upgrade in place: the daemon re-executes the binary at its path,
//! keeping its pid, so that its children stay its children.
//!
//! 1. The accept loop stops accepting, and every task is brought to a safe
//!    point ([`Pause`](crate::daemon::handover::Pause)): connections
//!    between frames (a SEQPACKET frame is read whole or not at all, and
//!    every frame read is answered first), spawns in flight finished up to
//!    their `Spawned` or `SpawnFailed`, child watchers between two looks
//!    at their child. Past [`DRAIN_BOUND`] the upgrade is abandoned.
//! 2. The state (listener, connections, children's pidfds, ids, deadlines,
//!    kill-on-close, policy, counters, uptime origin) goes into a sealed
//!    memfd, in a versioned, checksummed format ([`handover`]).
//! 3. Safety net: the binary at the path is run as `check-state` on that
//!    memfd first; unless it reads the state, the upgrade is abandoned.
//! 4. Close-on-exec is cleared on exactly the handed-over fds, and the
//!    binary is exec'd with the same arguments; the memfd's number is in
//!    `ZYGOTE_UPGRADE_STATE`, the listener's in `ZYGOTE_UPGRADE_LISTENER`.
//!
//! An abandoned upgrade (drain too slow, check failed, exec failed) puts
//! close-on-exec back, resumes every task where it stopped, logs why and
//! answers the `Upgrade` request with `RequestFailed`.
//!
//! If the new image cannot read the state after all, it serves on: it
//! keeps the listener (its number travels apart from the state), closes
//! every other fd it inherited (those clients see their connection drop;
//! their pidfds still give exit codes), and reaps the old children as
//! orphans.

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{error, info, warn};
use zygote_proto::{RequestFailed, ServerMessage};

use crate::daemon::cgroup::{ChildCgroup, SavedCgroup};
use crate::daemon::connection;
use crate::daemon::handover::{self, SavedConnection, SavedCounter, SavedDaemon, StateError};
use crate::daemon::lifetime;
use crate::daemon::reply::send_reply;
use crate::daemon::shutdown::Coordinator;
use crate::daemon::state::{Daemon, UpgradeAsk};
use crate::spawn;

/// The memfd holding the state, in the new image's environment.
pub const STATE_ENV: &str = "ZYGOTE_UPGRADE_STATE";
/// The listening socket, in the new image's environment: kept even when
/// the state cannot be read.
pub const LISTENER_ENV: &str = "ZYGOTE_UPGRADE_LISTENER";
/// Test hook: the old image writes a state cut short (`truncate`), and
/// with `truncate-unchecked` also skips the check, so that the tests can
/// see both safety nets work.
pub const CORRUPT_ENV: &str = "ZYGOTE_TEST_CORRUPT_STATE";

/// Test hook: the old image also writes the state to this file (the
/// compatibility fixture is made this way).
pub const DUMP_ENV: &str = "ZYGOTE_TEST_DUMP_STATE";

/// How long tasks have to reach a safe point.
pub const DRAIN_BOUND: Duration = Duration::from_secs(3);
/// How long the new binary has to check the state.
const CHECK_BOUND: Duration = Duration::from_secs(10);

/// The binary and arguments this process was started with.
struct Invocation {
    exe: PathBuf,
    args: Vec<OsString>,
}

static INVOCATION: OnceLock<Invocation> = OnceLock::new();

/// Remembers the binary's path and the arguments, at start: after a
/// package upgrade `/proc/self/exe` names a deleted file, and the upgrade
/// must exec the new one at the path.
pub fn remember_invocation() {
    INVOCATION.get_or_init(|| Invocation {
        exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
        args: std::env::args_os().collect(),
    });
}

/// What a new image finds at its start after an upgrade.
#[derive(Debug)]
pub struct Handover {
    /// The state, or why it cannot be used.
    pub state: Result<SavedDaemon, StateError>,
    /// The listening socket's number.
    pub listener: Option<RawFd>,
    /// Every fd inherited above 2.
    inherited: Vec<RawFd>,
}

/// Takes the handed-over state out of the environment, if this image was
/// started by an upgrade. Call it first thing, while the only fds above 2
/// are the inherited ones.
pub fn take_handover() -> Option<Handover> {
    remember_invocation();
    let state_fd = std::env::var(STATE_ENV).ok()?;
    let listener = std::env::var(LISTENER_ENV)
        .ok()
        .and_then(|fd| fd.parse().ok());
    // The variables stay in the environment (removing them is unsafe in
    // a process that may have threads); the next upgrade replaces them.
    let state_number = state_fd.parse::<RawFd>().ok();
    let inherited: Vec<RawFd> = spawn::inherited_fds()
        .into_iter()
        .filter(|fd| Some(*fd) != state_number)
        .collect();
    let state = state_fd
        .parse::<RawFd>()
        .map_err(|_| StateError::Decode(format!("{STATE_ENV}={state_fd} is not an fd")))
        .and_then(|fd| spawn::adopt_fd(fd).map_err(StateError::Io))
        .and_then(|fd| handover::read(&std::fs::File::from(fd)))
        .map(handover::latest);
    Some(Handover {
        state,
        listener,
        inherited,
    })
}

impl Handover {
    /// The state could not be read: closes every inherited fd but the
    /// listener, and returns it.
    pub fn discard(self) -> Option<OwnedFd> {
        for fd in self.inherited {
            if Some(fd) != self.listener {
                if let Ok(fd) = spawn::adopt_fd(fd) {
                    drop(fd);
                }
            }
        }
        self.listener.and_then(|fd| spawn::adopt_fd(fd).ok())
    }
}

/// `zygote check-state`: reads a state from `file` and summarizes it.
///
/// # Errors
///
/// [`StateError`] naming what is wrong.
pub fn check_state(file: &std::fs::File) -> Result<String, StateError> {
    let versioned = handover::read(file)?;
    let format = versioned.format();
    let state = handover::latest(versioned);
    let clients = || {
        state
            .connections
            .iter()
            .filter_map(|connection| connection.client.as_ref())
    };
    let children: usize = clients().map(|client| client.children.len()).sum();
    let mut versions: Vec<u32> = clients().map(|client| client.protocol_version).collect();
    versions.sort_unstable();
    versions.dedup();
    let versions: Vec<String> = versions.iter().map(u32::to_string).collect();
    Ok(format!(
        "state format {format} written by zygote {}: {} connections, {} children, \
         protocol versions [{}]; this zygote {} reads it",
        state.written_by,
        state.connections.len(),
        children,
        versions.join(", "),
        crate::version(),
    ))
}

/// What the accept loop hands over besides the daemon's state.
#[derive(Debug)]
pub struct Context {
    /// The listening socket.
    pub listener: RawFd,
    /// The socket path the daemon bound itself.
    pub bound_path: Option<PathBuf>,
    /// The `/metrics` listener.
    pub metrics_listener: Option<RawFd>,
    /// The notify socket.
    pub notify_socket: Option<RawFd>,
    /// The watchdog interval.
    pub watchdog: Option<Duration>,
}

/// Upgrades in place. Returns only when the upgrade was abandoned, with
/// every task resumed; on success this process is the new image. Returns
/// true when `stop` (the daemon's stop signal) resolved meanwhile: the
/// upgrade gave way to the stop, which the caller must now carry out.
pub(crate) async fn perform<F: Future<Output = ()>>(
    ask: UpgradeAsk,
    daemon: &Arc<Daemon>,
    context: &Context,
    notify: &dyn Fn(&[NotifyState<'_>]),
    stop: Pin<&mut F>,
) -> bool {
    let began = Instant::now();
    info!(
        connections = daemon.metrics.connections_open(),
        children = daemon.metrics.children_running(),
        "upgrading in place: pausing"
    );
    notify(&[
        NotifyState::Reloading,
        NotifyState::MonotonicUsec(i128::from(handover::mono_now_ns() / 1000)),
        NotifyState::Status("upgrading"),
    ]);
    let mut stopping = false;
    let failure = match tokio::time::timeout(DRAIN_BOUND, daemon.pause.pause()).await {
        Err(_) => format!(
            "tasks did not reach a safe point within {} s (a spawn stuck before exec, or a \
             client not reading its replies); try again",
            DRAIN_BOUND.as_secs()
        ),
        Ok(paused) => {
            let failure = match hand_over(&ask, daemon, context, began, stop, &mut stopping).await {
                Ok(never) => match never {},
                Err(failure) => failure,
            };
            drop(paused);
            failure
        }
    };
    error!(reason = %failure, "upgrade abandoned; carrying on in this image");
    if !stopping {
        notify(&[NotifyState::Ready, NotifyState::Status("serving")]);
    }
    if let Some((_, socket, id)) = ask.from {
        let reply = ServerMessage::RequestFailed(RequestFailed {
            id,
            errno: libc::ECANCELED,
            message: format!("upgrade abandoned, the daemon carries on: {failure}"),
        });
        tokio::spawn(async move {
            if let Some(socket) = socket.upgrade() {
                // `RequestFailed` has the same layout in every version.
                send_reply(&socket, &reply, zygote_proto::OLDEST_PROTOCOL_VERSION, &[]).await;
            }
        });
    }
    stopping
}

enum Never {}

/// Saves, checks and execs; returns only why it could not.
async fn hand_over<F: Future<Output = ()>>(
    ask: &UpgradeAsk,
    daemon: &Arc<Daemon>,
    context: &Context,
    began: Instant,
    stop: Pin<&mut F>,
    stopping: &mut bool,
) -> Result<Never, String> {
    let Some(invocation) = INVOCATION.get() else {
        return Err("the daemon's binary path was not recorded at start".into());
    };
    let state = collect(ask, daemon, context);
    let mut bytes = handover::encode(&state).map_err(|error| format!("encoding: {error}"))?;
    if let Some(path) = std::env::var_os(DUMP_ENV) {
        if let Err(error) = std::fs::write(&path, &bytes) {
            warn!(%error, "{DUMP_ENV}: cannot write the state");
        }
    }
    let corrupt = std::env::var(CORRUPT_ENV).ok();
    if corrupt.is_some() {
        warn!("{CORRUPT_ENV} is set: writing a truncated state (test hook)");
        bytes.truncate(bytes.len() / 2);
    }
    let memfd = write_memfd(&bytes).map_err(|error| format!("writing the state: {error}"))?;
    let exe = &invocation.exe;
    if corrupt.as_deref() != Some("truncate-unchecked") {
        check(exe, &memfd).await?;
    }
    let (path, argv, envp) = exec_args(invocation, memfd.as_raw_fd(), context.listener)?;
    let mut fds = handed_fds(&state);
    fds.push(memfd.as_raw_fd());
    let cleared: Vec<RawFd> = fds
        .iter()
        .copied()
        .filter(|fd| spawn::set_inheritable(*fd, true).is_ok())
        .collect();
    let restore_cloexec = || {
        for fd in &cleared {
            let _ = spawn::set_inheritable(*fd, false);
        }
    };
    if cleared.len() != fds.len() {
        restore_cloexec();
        return Err("cannot clear close-on-exec on every handed-over fd".into());
    }
    info!(
        binary = %exe.display(),
        fds = fds.len(),
        state_bytes = bytes.len(),
        paused_ms = began.elapsed().as_secs_f64() * 1000.0,
        "upgrading in place: exec"
    );
    // Queued log lines would die with this image.
    crate::service::log_sink::drain(Duration::from_millis(200));
    // A stop asked for during the pause would die with this image (its
    // signal was taken by the handler here): it wins over the upgrade.
    let mut waker = std::task::Context::from_waker(std::task::Waker::noop());
    if stop.poll(&mut waker).is_ready() {
        *stopping = true;
        restore_cloexec();
        return Err("a stop was asked for during the upgrade".into());
    }
    let error = spawn::exec_in_place(&path, &argv, &envp);
    restore_cloexec();
    Err(format!("exec {}: {error}", exe.display()))
}

/// Runs `EXE check-state` on the state: the new binary must start and
/// read it.
async fn check(exe: &std::path::Path, memfd: &OwnedFd) -> Result<(), String> {
    let stdin = memfd
        .try_clone()
        .map_err(|error| format!("duplicating the state fd: {error}"))?;
    let mut command = std::process::Command::new(exe);
    command.arg("check-state").stdin(stdin);
    let checked = tokio::task::spawn_blocking(move || spawn::run_own(command, CHECK_BOUND))
        .await
        .map_err(|error| format!("the check task failed: {error}"))?;
    match checked {
        Ok((status, _)) if status.success() => Ok(()),
        Ok((status, output)) => Err(format!(
            "the new binary {} refused the state ({status}): {}",
            exe.display(),
            output.trim()
        )),
        Err(error) => Err(format!(
            "the new binary {} could not check the state: {error}",
            exe.display()
        )),
    }
}

fn collect(ask: &UpgradeAsk, daemon: &Daemon, context: &Context) -> SavedDaemon {
    let mut connections = Vec::new();
    let mut reply_to = None;
    for (weak, saved) in daemon.save_connections() {
        if let Some((asker, _, id)) = &ask.from {
            if weak.ptr_eq(asker) && saved.socket.is_some() {
                reply_to = Some((connections.len(), *id));
            }
        }
        connections.push(saved);
    }
    let parked = daemon
        .parked_sockets
        .lock()
        .expect("parked sockets poisoned")
        .clone();
    for socket in parked.iter().filter_map(std::sync::Weak::upgrade) {
        connections.push(SavedConnection {
            socket: Some(socket.as_fd().as_raw_fd()),
            client: None,
        });
    }
    let started = daemon.started;
    SavedDaemon {
        written_by: crate::version(),
        started_mono_ns: handover::to_mono_ns(started),
        listener: context.listener,
        bound_path: context.bound_path.clone(),
        metrics_listener: context.metrics_listener,
        notify_socket: context.notify_socket,
        watchdog_usec: context.watchdog.map(|watchdog| watchdog.as_micros() as u64),
        policy: daemon.policy.clone(),
        child_nofile: daemon.child_nofile,
        cgroups: daemon.cgroups.as_ref().map(|subtree| subtree.save()),
        no_cgroups: daemon.no_cgroups.clone(),
        counters: daemon
            .metrics
            .counters()
            .into_iter()
            .map(|(name, labels, value)| SavedCounter {
                name,
                labels,
                value,
            })
            .collect(),
        connections,
        leftover_cgroups: daemon
            .lingering_cgroups
            .lock()
            .expect("lingering cgroups poisoned")
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .map(|cgroup| cgroup.save())
            .collect(),
        reply_to,
    }
}

/// Every fd the state names.
fn handed_fds(state: &SavedDaemon) -> Vec<RawFd> {
    let mut fds = vec![state.listener];
    fds.extend(state.metrics_listener);
    fds.extend(state.notify_socket);
    for connection in &state.connections {
        fds.extend(connection.socket);
        if let Some(client) = &connection.client {
            fds.extend(client.children.iter().filter_map(|child| child.pidfd));
        }
    }
    fds
}

fn write_memfd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let memfd = rustix::fs::memfd_create(
        "zygote-upgrade-state",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let file = std::fs::File::from(memfd);
    std::io::Write::write_all(&mut &file, bytes)?;
    rustix::fs::fcntl_add_seals(
        file.as_fd(),
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    Ok(OwnedFd::from(file))
}

type ExecArgs = (CString, Vec<CString>, Vec<CString>);

fn exec_args(invocation: &Invocation, state: RawFd, listener: RawFd) -> Result<ExecArgs, String> {
    let c_string = |bytes: &[u8]| {
        CString::new(bytes)
            .map_err(|_| "a NUL byte in the binary's path, arguments or environment".to_owned())
    };
    let path = c_string(invocation.exe.as_os_str().as_bytes())?;
    let argv = invocation
        .args
        .iter()
        .map(|arg| c_string(arg.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut envp = Vec::new();
    for (name, value) in std::env::vars_os() {
        if name == STATE_ENV || name == LISTENER_ENV {
            continue;
        }
        let mut var = name.as_bytes().to_vec();
        var.push(b'=');
        var.extend_from_slice(value.as_bytes());
        envp.push(c_string(&var)?);
    }
    envp.push(c_string(format!("{STATE_ENV}={state}").as_bytes())?);
    envp.push(c_string(format!("{LISTENER_ENV}={listener}").as_bytes())?);
    Ok((path, argv, envp))
}

/// Takes over the connections and children an earlier image handed over.
/// Call it before the orphan reaper starts: the children must be listed
/// as the daemon's own first.
pub(crate) async fn restore_connections(
    daemon: &Arc<Daemon>,
    connections: Vec<SavedConnection>,
    leftover_cgroups: Vec<SavedCgroup>,
    reply_to: Option<(usize, u64)>,
    coordinator: &Coordinator,
) {
    for cgroup in leftover_cgroups {
        lifetime::remove_when_empty(daemon, Arc::new(ChildCgroup::restore(cgroup)));
    }
    let count = connections.len();
    for (index, saved) in connections.into_iter().enumerate() {
        let reply = reply_to.and_then(|(at, id)| (at == index).then_some(id));
        connection::restore(saved, daemon, coordinator, reply).await;
    }
    info!(
        connections = count,
        children = daemon.metrics.children_running(),
        "upgraded in place: restored"
    );
}
