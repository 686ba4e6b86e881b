//! The frozen version-2 layouts of the messages version 3 changed, and
//! their conversions to and from the current ones.
//!
//! Versions 1 and 2 share these layouts (they differ only in
//! [`HelloAck`], which follows its own version). A
//! daemon decodes the frames of a version-1 or version-2 connection with
//! [`ClientMessage`] and converts them ([`SpawnRequest::sandbox`](crate::SpawnRequest::sandbox)
//! becomes `None`); it converts its replies to [`ServerMessage`] before
//! encoding them: the version-3 fields are dropped and
//! [`SpawnStage::Sandbox`](crate::SpawnStage::Sandbox) goes out as
//! [`SpawnStage::Exec`]. Never change a type here: version 2 was released.

use serde::{Deserialize, Serialize};

use crate::env::Env;
use crate::message as current;
use crate::message::{
    CgroupSpec, ContinueNotice, ExitNotice, FdMapping, Hello, HelloAck, KillOnClose, ProtocolError,
    PtySpec, RequestFailed, ResourceLimit, SignalRequest, SignalSent, StatusRequest, StdioSpec,
    StopNotice, Timeout, UpgradeRequest, UserSpec,
};
use crate::template::{TemplateList, TemplateReady};

/// Everything a client of version 1 or 2 may send.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMessage {
    /// As [`current::ClientMessage::Hello`].
    Hello(Hello),
    /// As [`current::ClientMessage::Spawn`], in the version-2 layout.
    Spawn(SpawnRequest),
    /// As [`current::ClientMessage::Signal`].
    Signal(SignalRequest),
    /// As [`current::ClientMessage::Status`].
    Status(StatusRequest),
    /// As [`current::ClientMessage::Upgrade`].
    Upgrade(UpgradeRequest),
}

/// Everything the daemon may send to a client of version 1 or 2.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMessage {
    /// As [`current::ServerMessage::HelloAck`].
    HelloAck(HelloAck),
    /// As [`current::ServerMessage::Spawned`], in the version-2 layout.
    Spawned(Spawned),
    /// As [`current::ServerMessage::SpawnFailed`], with version-2 stages.
    SpawnFailed(SpawnFailed),
    /// As [`current::ServerMessage::Exited`].
    Exited(ExitNotice),
    /// As [`current::ServerMessage::SignalSent`].
    SignalSent(SignalSent),
    /// As [`current::ServerMessage::RequestFailed`].
    RequestFailed(RequestFailed),
    /// As [`current::ServerMessage::ProtocolError`].
    ProtocolError(ProtocolError),
    /// As [`current::ServerMessage::Status`], in the version-2 layout.
    Status(StatusReply),
    /// As [`current::ServerMessage::Stopped`].
    Stopped(StopNotice),
    /// As [`current::ServerMessage::Continued`].
    Continued(ContinueNotice),
}

/// [`current::SpawnRequest`] without `sandbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// Unique among this connection's requests; replies carry it back.
    pub id: u64,
    /// Program to execute. Without a `/` it is looked up in `PATH` from
    /// [`env`](Self::env), like `execvp(3)`.
    #[serde(with = "crate::bytes::one")]
    pub program: Vec<u8>,
    /// `argv[0]`; the program when absent.
    #[serde(with = "crate::bytes::optional")]
    pub argv0: Option<Vec<u8>>,
    /// `argv[1..]`.
    #[serde(with = "crate::bytes::list")]
    pub args: Vec<Vec<u8>>,
    /// The child's whole environment.
    pub env: Env,
    /// Working directory; the daemon's own when absent.
    #[serde(with = "crate::bytes::optional")]
    pub cwd: Option<Vec<u8>>,
    /// The child's fd 0.
    pub stdin: StdioSpec,
    /// The child's fd 1.
    pub stdout: StdioSpec,
    /// The child's fd 2.
    pub stderr: StdioSpec,
    /// Further fds, each placed at a chosen number.
    pub fd_mappings: Vec<FdMapping>,
    /// Start a new session (`setsid(2)`).
    pub new_session: bool,
    /// Join or create a process group (`setpgid(0, pgid)`; 0 makes a new
    /// group led by the child). Ignored with `new_session`.
    pub process_group: Option<i32>,
    /// The child's umask; the daemon's when absent.
    pub umask: Option<u32>,
    /// Resource limits set in the child before exec.
    pub rlimits: Vec<ResourceLimit>,
    /// Credentials to run the child with; the peer's own when absent.
    pub user: Option<UserSpec>,
    /// Signal the child when this connection closes, as `PR_SET_PDEATHSIG`
    /// does for a direct parent.
    pub kill_on_close: Option<KillOnClose>,
    /// End the child if it runs longer than this.
    pub timeout: Option<Timeout>,
    /// Give the child a new pseudo-terminal: it leads a new session with
    /// the terminal as its controlling tty on fds 0 to 2, and the master
    /// comes back with [`Spawned`]. The stdio specs must then be `Null`.
    pub pty: Option<PtySpec>,
    /// Send [`ServerMessage::Stopped`] and [`ServerMessage::Continued`]
    /// when the child stops or continues.
    pub report_stops: bool,
    /// Limits and whole-tree behaviour for the child's own cgroup; the
    /// daemon refuses the request when it has no cgroup subtree, or when a
    /// limit's controller is not delegated to it.
    pub cgroup: Option<CgroupSpec>,
    /// Signals the child starts with ignored (`SIG_IGN`), bit `n - 1` for
    /// signal `n`, as `execve(2)` keeps a caller's ignored signals. Every
    /// other signal starts with its default action.
    pub ignored_signals: u64,
    /// The child's nice value; the daemon's when absent. A peer without
    /// privilege gets no lower (higher priority) value than its own.
    pub nice: Option<i32>,
    /// The CPUs the child may run on (`sched_setaffinity(2)`); the
    /// daemon's affinity when empty.
    pub cpu_affinity: Vec<u32>,
    /// The child's `/proc/PID/oom_score_adj`; the daemon's when absent. A
    /// peer without privilege gets no lower value than its own.
    pub oom_score_adj: Option<i32>,
    /// Index, among the attached fds, of a sealed memfd holding
    /// [`LargeArgs`](crate::LargeArgs): the arguments and environment of a request too large
    /// for one frame. `args` and `env` are then empty.
    pub large_args: Option<u32>,
    /// Send [`Spawned`] (with the pidfd) only if the child still runs
    /// about 10 ms after it started: a child that ends sooner gets its
    /// [`ExitNotice`] alone. For callers that only want the exit status.
    /// Refused with a `Pipe` stdio or a `pty`, whose ends only travel in
    /// `Spawned`.
    pub defer_spawned: bool,
}

/// [`current::SpawnStage`] without `Sandbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SpawnStage {
    /// The request was refused before anything was created.
    Validate,
    /// Creating a stdio pipe or opening `/dev/null`.
    Pipe,
    /// Creating the child process.
    Clone,
    /// Resetting signal dispositions and mask.
    Signals,
    /// `setsid(2)`.
    Setsid,
    /// `setpgid(2)`.
    Setpgid,
    /// `setrlimit(2)`.
    Setrlimit,
    /// `chdir(2)`.
    Chdir,
    /// Placing fds at their numbers (`dup2(2)` and friends).
    Dup,
    /// Closing every fd that was not asked for.
    CloseFds,
    /// `execve(2)`.
    Exec,
    /// The daemon refused for lack of capacity or by policy, before
    /// anything was created (`EAGAIN` when busy, `EPERM` by policy).
    Admission,
    /// `setgroups(2)`.
    Setgroups,
    /// `setresgid(2)`.
    Setgid,
    /// `setresuid(2)`.
    Setuid,
    /// Creating, limiting or joining the child's cgroup.
    Cgroup,
    /// `setpriority(2)`: the nice value.
    Nice,
    /// `sched_setaffinity(2)`.
    Affinity,
    /// Writing `/proc/self/oom_score_adj`.
    OomScoreAdj,
}

/// [`current::Spawned`] without `sandbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawned {
    /// The request's id.
    pub id: u64,
    /// The child's pid in the daemon's pid namespace.
    pub pid: i32,
}

/// [`current::SpawnFailed`] with a version-2 [`SpawnStage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnFailed {
    /// The request's id.
    pub id: u64,
    /// Where it failed.
    pub stage: SpawnStage,
    /// The `errno` value.
    pub errno: i32,
    /// A sentence for humans.
    pub message: String,
}

/// [`current::StatusReply`] without `peers` and `spawners`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReply {
    /// The status request's id.
    pub id: u64,
    /// The daemon's package version.
    pub server_version: String,
    /// The daemon's pid.
    pub pid: i32,
    /// Time since the daemon started, in milliseconds.
    pub uptime_millis: u64,
    /// Connections open now, this one included.
    pub connections_open: u64,
    /// Connections accepted since start.
    pub connections_accepted: u64,
    /// Children started and not yet reaped.
    pub children_running: u64,
    /// Spawns whose child exec'd, since start.
    pub spawns_succeeded: u64,
    /// Spawns that failed or were refused, since start.
    pub spawns_failed: u64,
}

impl From<SpawnRequest> for current::SpawnRequest {
    /// The request as version 3 reads it: no sandbox.
    fn from(request: SpawnRequest) -> Self {
        let SpawnRequest {
            id,
            program,
            argv0,
            args,
            env,
            cwd,
            stdin,
            stdout,
            stderr,
            fd_mappings,
            new_session,
            process_group,
            umask,
            rlimits,
            user,
            kill_on_close,
            timeout,
            pty,
            report_stops,
            cgroup,
            ignored_signals,
            nice,
            cpu_affinity,
            oom_score_adj,
            large_args,
            defer_spawned,
        } = request;
        Self {
            id,
            program,
            argv0,
            args,
            env,
            cwd,
            stdin,
            stdout,
            stderr,
            fd_mappings,
            new_session,
            process_group,
            umask,
            rlimits,
            user,
            kill_on_close,
            timeout,
            pty,
            report_stops,
            cgroup,
            ignored_signals,
            nice,
            cpu_affinity,
            oom_score_adj,
            large_args,
            defer_spawned,
            sandbox: None,
        }
    }
}

/// A request that uses a field or message of version 3 or newer cannot go
/// out in version 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{field} needs protocol version {version}; the connection speaks version 2 or older")]
pub struct NeedsVersion3 {
    /// The field or message that has no place in the older layout.
    pub field: &'static str,
    /// The version that introduced it.
    pub version: u32,
}

impl TryFrom<current::SpawnRequest> for SpawnRequest {
    type Error = NeedsVersion3;

    /// The request in the version-2 layout; refused when it asks for a
    /// sandbox, which that layout cannot carry (never dropped silently).
    fn try_from(request: current::SpawnRequest) -> Result<Self, NeedsVersion3> {
        let current::SpawnRequest {
            id,
            program,
            argv0,
            args,
            env,
            cwd,
            stdin,
            stdout,
            stderr,
            fd_mappings,
            new_session,
            process_group,
            umask,
            rlimits,
            user,
            kill_on_close,
            timeout,
            pty,
            report_stops,
            cgroup,
            ignored_signals,
            nice,
            cpu_affinity,
            oom_score_adj,
            large_args,
            defer_spawned,
            sandbox,
        } = request;
        if sandbox.is_some() {
            return Err(NeedsVersion3 {
                field: "sandbox",
                version: crate::SANDBOX_SINCE,
            });
        }
        Ok(Self {
            id,
            program,
            argv0,
            args,
            env,
            cwd,
            stdin,
            stdout,
            stderr,
            fd_mappings,
            new_session,
            process_group,
            umask,
            rlimits,
            user,
            kill_on_close,
            timeout,
            pty,
            report_stops,
            cgroup,
            ignored_signals,
            nice,
            cpu_affinity,
            oom_score_adj,
            large_args,
            defer_spawned,
        })
    }
}

impl From<current::SpawnStage> for SpawnStage {
    /// The same stage; `Sandbox`, which version 2 lacks, as `Exec`.
    fn from(stage: current::SpawnStage) -> Self {
        use current::SpawnStage as S;
        match stage {
            S::Validate => Self::Validate,
            S::Pipe => Self::Pipe,
            S::Clone => Self::Clone,
            S::Signals => Self::Signals,
            S::Setsid => Self::Setsid,
            S::Setpgid => Self::Setpgid,
            S::Setrlimit => Self::Setrlimit,
            S::Chdir => Self::Chdir,
            S::Dup => Self::Dup,
            S::CloseFds => Self::CloseFds,
            S::Exec | S::Sandbox | S::Template => Self::Exec,
            S::Admission => Self::Admission,
            S::Setgroups => Self::Setgroups,
            S::Setgid => Self::Setgid,
            S::Setuid => Self::Setuid,
            S::Cgroup => Self::Cgroup,
            S::Nice => Self::Nice,
            S::Affinity => Self::Affinity,
            S::OomScoreAdj => Self::OomScoreAdj,
        }
    }
}

impl From<SpawnStage> for current::SpawnStage {
    fn from(stage: SpawnStage) -> Self {
        use SpawnStage as S;
        match stage {
            S::Validate => Self::Validate,
            S::Pipe => Self::Pipe,
            S::Clone => Self::Clone,
            S::Signals => Self::Signals,
            S::Setsid => Self::Setsid,
            S::Setpgid => Self::Setpgid,
            S::Setrlimit => Self::Setrlimit,
            S::Chdir => Self::Chdir,
            S::Dup => Self::Dup,
            S::CloseFds => Self::CloseFds,
            S::Exec => Self::Exec,
            S::Admission => Self::Admission,
            S::Setgroups => Self::Setgroups,
            S::Setgid => Self::Setgid,
            S::Setuid => Self::Setuid,
            S::Cgroup => Self::Cgroup,
            S::Nice => Self::Nice,
            S::Affinity => Self::Affinity,
            S::OomScoreAdj => Self::OomScoreAdj,
        }
    }
}

impl From<current::Spawned> for Spawned {
    fn from(spawned: current::Spawned) -> Self {
        Self {
            id: spawned.id,
            pid: spawned.pid,
        }
    }
}

impl From<Spawned> for current::Spawned {
    fn from(spawned: Spawned) -> Self {
        Self {
            id: spawned.id,
            pid: spawned.pid,
            sandbox: None,
        }
    }
}

impl From<current::SpawnFailed> for SpawnFailed {
    fn from(failed: current::SpawnFailed) -> Self {
        Self {
            id: failed.id,
            stage: failed.stage.into(),
            errno: failed.errno,
            message: failed.message,
        }
    }
}

impl From<SpawnFailed> for current::SpawnFailed {
    fn from(failed: SpawnFailed) -> Self {
        Self {
            id: failed.id,
            stage: failed.stage.into(),
            errno: failed.errno,
            message: failed.message,
        }
    }
}

impl From<current::StatusReply> for StatusReply {
    fn from(status: current::StatusReply) -> Self {
        Self {
            id: status.id,
            server_version: status.server_version,
            pid: status.pid,
            uptime_millis: status.uptime_millis,
            connections_open: status.connections_open,
            connections_accepted: status.connections_accepted,
            children_running: status.children_running,
            spawns_succeeded: status.spawns_succeeded,
            spawns_failed: status.spawns_failed,
        }
    }
}

impl From<StatusReply> for current::StatusReply {
    fn from(status: StatusReply) -> Self {
        Self {
            id: status.id,
            server_version: status.server_version,
            pid: status.pid,
            uptime_millis: status.uptime_millis,
            connections_open: status.connections_open,
            connections_accepted: status.connections_accepted,
            children_running: status.children_running,
            spawns_succeeded: status.spawns_succeeded,
            spawns_failed: status.spawns_failed,
            peers: Vec::new(),
            spawners: Vec::new(),
        }
    }
}

impl From<ClientMessage> for current::ClientMessage {
    fn from(message: ClientMessage) -> Self {
        match message {
            ClientMessage::Hello(hello) => Self::Hello(hello),
            ClientMessage::Spawn(request) => Self::Spawn(request.into()),
            ClientMessage::Signal(request) => Self::Signal(request),
            ClientMessage::Status(request) => Self::Status(request),
            ClientMessage::Upgrade(request) => Self::Upgrade(request),
        }
    }
}

impl TryFrom<current::ClientMessage> for ClientMessage {
    type Error = NeedsVersion3;

    fn try_from(message: current::ClientMessage) -> Result<Self, NeedsVersion3> {
        Ok(match message {
            current::ClientMessage::Hello(hello) => Self::Hello(hello),
            current::ClientMessage::Spawn(request) => Self::Spawn(request.try_into()?),
            current::ClientMessage::Signal(request) => Self::Signal(request),
            current::ClientMessage::Status(request) => Self::Status(request),
            current::ClientMessage::Upgrade(request) => Self::Upgrade(request),
            current::ClientMessage::Template(_)
            | current::ClientMessage::SpawnFromTemplate(_)
            | current::ClientMessage::ListTemplates(_) => {
                return Err(NeedsVersion3 {
                    field: "templates",
                    version: crate::TEMPLATES_SINCE,
                });
            }
        })
    }
}

impl From<current::ServerMessage> for ServerMessage {
    /// The reply as a version-2 client reads it: version-3 fields dropped,
    /// `SpawnStage::Sandbox` as `Exec`.
    fn from(message: current::ServerMessage) -> Self {
        use current::ServerMessage as M;
        match message {
            M::HelloAck(ack) => Self::HelloAck(ack),
            M::Spawned(spawned) => Self::Spawned(spawned.into()),
            M::SpawnFailed(failed) => Self::SpawnFailed(failed.into()),
            M::Exited(notice) => Self::Exited(notice),
            M::SignalSent(sent) => Self::SignalSent(sent),
            M::RequestFailed(failed) => Self::RequestFailed(failed),
            M::ProtocolError(error) => Self::ProtocolError(error),
            M::Status(status) => Self::Status(status.into()),
            M::Stopped(notice) => Self::Stopped(notice),
            M::Continued(notice) => Self::Continued(notice),
            // Only answers to version-4 requests, which an older
            // connection cannot make.
            M::TemplateReady(TemplateReady { id, .. }) | M::Templates(TemplateList { id, .. }) => {
                Self::RequestFailed(RequestFailed {
                    id,
                    errno: rustix::io::Errno::PROTO.raw_os_error(),
                    message: "templates need protocol version 4".to_owned(),
                })
            }
        }
    }
}

impl From<ServerMessage> for current::ServerMessage {
    fn from(message: ServerMessage) -> Self {
        use ServerMessage as M;
        match message {
            M::HelloAck(ack) => Self::HelloAck(ack),
            M::Spawned(spawned) => Self::Spawned(spawned.into()),
            M::SpawnFailed(failed) => Self::SpawnFailed(failed.into()),
            M::Exited(notice) => Self::Exited(notice),
            M::SignalSent(sent) => Self::SignalSent(sent),
            M::RequestFailed(failed) => Self::RequestFailed(failed),
            M::ProtocolError(error) => Self::ProtocolError(error),
            M::Status(status) => Self::Status(status.into()),
            M::Stopped(notice) => Self::Stopped(notice),
            M::Continued(notice) => Self::Continued(notice),
        }
    }
}
