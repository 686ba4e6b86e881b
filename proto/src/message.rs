//! The messages that cross the socket, one type per concept.
//!
//! Field order is wire order: postcard encodes struct fields in declaration
//! order and enum variants by their index, so reordering anything here is a
//! protocol change and must bump [`PROTOCOL_VERSION`](crate::PROTOCOL_VERSION),
//! with the previous layout kept for the clients that speak it.

use serde::{Deserialize, Serialize};

use crate::env::Env;
pub use crate::env::EnvVar;
use crate::sandbox::{AppliedSandbox, SandboxSpec};
use crate::template::{
    TemplateList, TemplateListRequest, TemplateReady, TemplateRequest, TemplateSpawnRequest,
};

/// Everything a client may send.
// One message lives per frame, briefly; boxing the spawn request would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMessage {
    /// First frame on every connection.
    Hello(Hello),
    /// Start a child. The frame carries the fds that the request refers to.
    Spawn(SpawnRequest),
    /// Send a signal to a child started on this connection.
    Signal(SignalRequest),
    /// Ask for the daemon's counters (`zygote status`).
    Status(StatusRequest),
    /// Ask a shared daemon to re-execute its binary in place (`zygote
    /// upgrade`). Answered by [`ServerMessage::Status`] from the new image,
    /// or [`ServerMessage::RequestFailed`] when refused or when the upgrade
    /// failed and the old image carries on.
    Upgrade(UpgradeRequest),
    /// Find or start a warm template (version 4, feature `templates`).
    Template(TemplateRequest),
    /// Start a child from a template (version 4, feature `templates`).
    SpawnFromTemplate(TemplateSpawnRequest),
    /// List the templates this peer may see (version 4).
    ListTemplates(TemplateListRequest),
}

/// Everything the daemon may send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMessage {
    /// Answer to [`Hello`]: the connection is ready for requests.
    HelloAck(HelloAck),
    /// The child has exec'd. The frame carries the pidfd, then the client's
    /// ends of the requested pipes in stdin, stdout, stderr order.
    Spawned(Spawned),
    /// The child could not be started; nothing is left running.
    SpawnFailed(SpawnFailed),
    /// A child started on this connection has exited and was reaped.
    Exited(ExitNotice),
    /// The signal of a [`SignalRequest`] was delivered.
    SignalSent(SignalSent),
    /// A request other than a spawn failed.
    RequestFailed(RequestFailed),
    /// The connection is unusable; the daemon closes it after this frame.
    ProtocolError(ProtocolError),
    /// Answer to a [`StatusRequest`].
    Status(StatusReply),
    /// A child whose request set [`SpawnRequest::report_stops`] was stopped
    /// by a signal.
    Stopped(StopNotice),
    /// A child whose request set [`SpawnRequest::report_stops`] was
    /// continued after a stop.
    Continued(ContinueNotice),
    /// Answer to a [`TemplateRequest`] (version 4).
    TemplateReady(TemplateReady),
    /// Answer to a [`TemplateListRequest`] (version 4).
    Templates(TemplateList),
}

/// Opens the conversation and states the protocol version the client speaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The newest protocol version the client speaks; the daemon answers
    /// in the newest version both know. This layout is the same in every
    /// version, so that any daemon can read it.
    pub protocol_version: u32,
    /// Free-form client name and version, for the daemon's logs.
    pub client: String,
}

/// The daemon's side of the handshake.
///
/// Its layout is that of the version in its first field (`PROTOCOL.md`
/// §4.4): version 1 ends after `limits`, as released; version 2 adds
/// `features`. A client reads the version, then the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloAck {
    /// The protocol version both sides now speak: the newest both know.
    pub protocol_version: u32,
    /// The daemon's package version, for diagnostics.
    pub server_version: String,
    /// Limits the daemon enforces on this connection.
    pub limits: Limits,
    /// The names of the optional features the daemon offers (see
    /// [`Feature`](crate::Feature)); always empty in version 1, whose
    /// layout has no room for them. A client ignores names it does not
    /// know.
    pub features: Vec<String>,
}

/// Limits a client must respect, announced in [`HelloAck`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest frame, in bytes, the daemon accepts.
    pub max_frame_bytes: u32,
    /// Most fds one frame may carry.
    pub max_fds_per_frame: u32,
}

/// What a child's stdin, stdout or stderr is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StdioSpec {
    /// `/dev/null`.
    Null,
    /// A new pipe; the client's end comes back in [`Spawned`]'s fds.
    Pipe,
    /// The fd at this index among the fds attached to the spawn frame.
    Fd(u32),
}

/// An fd passed with the spawn frame and the number it gets in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdMapping {
    /// Index among the fds attached to the spawn frame.
    pub attached_index: u32,
    /// The fd number in the child; 3 or more (0 to 2 are set by stdio).
    pub child_fd: i32,
}

/// One resource limit, as `setrlimit(2)` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceLimit {
    /// The `RLIMIT_*` number.
    pub resource: u32,
    /// Soft limit; `u64::MAX` is `RLIM_INFINITY`.
    pub soft: u64,
    /// Hard limit; `u64::MAX` is `RLIM_INFINITY`.
    pub hard: u64,
}

/// Everything needed to start one child, computed by the client.
///
/// The daemon applies exactly this and nothing of its own state: the
/// environment is complete, not a diff against the daemon's.
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
    /// [`LargeArgs`]: the arguments and environment of a request too large
    /// for one frame. `args` and `env` are then empty.
    pub large_args: Option<u32>,
    /// Send [`Spawned`] (with the pidfd) only if the child still runs
    /// about 10 ms after it started: a child that ends sooner gets its
    /// [`ExitNotice`] alone. For callers that only want the exit status.
    /// Refused with a `Pipe` stdio or a `pty`, whose ends only travel in
    /// `Spawned`.
    pub defer_spawned: bool,
    /// Confine the child (version 3). `None`: no sandbox requested (a
    /// policy may still impose one). Refused with `EOPNOTSUPP` by a daemon
    /// that does not offer the `sandbox` feature.
    pub sandbox: Option<SandboxSpec>,
}

/// The arguments and environment of a large request, postcard-encoded in a
/// memfd sealed against writing, growing and shrinking (see
/// [`SpawnRequest::large_args`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LargeArgs {
    /// `argv[1..]`.
    #[serde(with = "crate::bytes::list")]
    pub args: Vec<Vec<u8>>,
    /// The child's whole environment.
    pub env: Env,
}

impl SpawnRequest {
    /// A request to run `program` and nothing more: no arguments, an empty
    /// environment, the daemon's working directory and umask, `/dev/null`
    /// on stdio. Set other fields with struct update syntax.
    pub fn new(id: u64, program: impl Into<Vec<u8>>) -> Self {
        Self {
            id,
            program: program.into(),
            argv0: None,
            args: Vec::new(),
            env: Env::new(),
            cwd: None,
            stdin: StdioSpec::Null,
            stdout: StdioSpec::Null,
            stderr: StdioSpec::Null,
            fd_mappings: Vec::new(),
            new_session: false,
            process_group: None,
            umask: None,
            rlimits: Vec::new(),
            user: None,
            kill_on_close: None,
            timeout: None,
            pty: None,
            report_stops: false,
            cgroup: None,
            ignored_signals: 0,
            nice: None,
            cpu_affinity: Vec::new(),
            oom_score_adj: None,
            large_args: None,
            defer_spawned: false,
            sandbox: None,
        }
    }
}

/// A pseudo-terminal for the child, as `openpty(3)` makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySpec {
    /// Its initial size, as `TIOCSWINSZ` sets it.
    pub window: WindowSize,
}

/// A terminal's size in character cells (`struct winsize` without the
/// pixel fields, which terminals leave 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// What a child's own cgroup (`peers/<uid>/<n>` under the daemon's
/// subtree) does beyond holding the child. Every limit is optional;
/// `None` leaves the kernel default (`max`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupSpec {
    /// Timeouts, kill-on-close and `SIGKILL` signal requests end the whole
    /// tree with `cgroup.kill`, grandchildren that left the process group
    /// included.
    pub kill_tree: bool,
    /// Send the exit notice only once every process of the tree has exited
    /// (`cgroup.events` `populated 0`), not as soon as the child has.
    pub wait_tree: bool,
    /// `memory.max`, in bytes.
    pub memory_max: Option<u64>,
    /// `memory.swap.max`, in bytes.
    pub memory_swap_max: Option<u64>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// `cpu.max`: this much CPU time per period.
    pub cpu_max: Option<CpuMax>,
    /// `cpu.weight`, 1 to 10000.
    pub cpu_weight: Option<u32>,
    /// `io.weight`, 1 to 10000.
    pub io_weight: Option<u32>,
}

/// A CPU bandwidth limit, as `cpu.max` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuMax {
    /// CPU time allowed per period, in microseconds.
    pub quota_micros: u64,
    /// The period, in microseconds (the kernel's default is 100000).
    pub period_micros: u64,
}

/// Who the child runs as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserSpec {
    /// Real, effective and saved uid.
    pub uid: u32,
    /// Real, effective and saved gid.
    pub gid: u32,
    /// Supplementary groups, replacing the daemon's.
    pub groups: Vec<u32>,
}

/// What to do to a child when its client's connection closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillOnClose {
    /// The signal to send.
    pub signal: i32,
    /// Signal the child's whole process group instead of the child alone.
    pub process_group: bool,
}

/// A limit on a child's run time: SIGTERM when it expires, then SIGKILL
/// after the grace period; to the child's whole process group when the
/// request made the child lead one of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeout {
    /// Run time before SIGTERM, in milliseconds.
    pub millis: u64,
    /// Time between SIGTERM and SIGKILL, in milliseconds.
    pub grace_millis: u64,
}

/// The step of child setup that failed.
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
    /// Setting up the sandbox (version 3): the message names the step,
    /// the path if any, and the errno. Sent as [`SpawnStage::Exec`] to a
    /// connection of an older version.
    Sandbox,
    /// The template could not start the child (version 4): it is gone,
    /// crashed, or did not answer in time. Failures of the child's own
    /// setup steps inside a template carry those steps' stages.
    Template,
}

impl SpawnStage {
    /// Every stage, in wire (variant index) order.
    pub const ALL: [Self; 21] = [
        Self::Validate,
        Self::Pipe,
        Self::Clone,
        Self::Signals,
        Self::Setsid,
        Self::Setpgid,
        Self::Setrlimit,
        Self::Chdir,
        Self::Dup,
        Self::CloseFds,
        Self::Exec,
        Self::Admission,
        Self::Setgroups,
        Self::Setgid,
        Self::Setuid,
        Self::Cgroup,
        Self::Nice,
        Self::Affinity,
        Self::OomScoreAdj,
        Self::Sandbox,
        Self::Template,
    ];

    /// Lowercase name, as used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Validate => "validate",
            Self::Pipe => "pipe",
            Self::Clone => "clone",
            Self::Signals => "signals",
            Self::Setsid => "setsid",
            Self::Setpgid => "setpgid",
            Self::Setrlimit => "setrlimit",
            Self::Chdir => "chdir",
            Self::Dup => "dup",
            Self::CloseFds => "close_fds",
            Self::Exec => "exec",
            Self::Admission => "admission",
            Self::Setgroups => "setgroups",
            Self::Setgid => "setgid",
            Self::Setuid => "setuid",
            Self::Cgroup => "cgroup",
            Self::Nice => "nice",
            Self::Affinity => "affinity",
            Self::OomScoreAdj => "oom_score_adj",
            Self::Sandbox => "sandbox",
            Self::Template => "template",
        }
    }
}

/// Reply to a spawn whose child has exec'd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawned {
    /// The request's id.
    pub id: u64,
    /// The child's pid in the daemon's pid namespace.
    pub pid: i32,
    /// What confined the child (version 3); `None` when nothing did.
    pub sandbox: Option<AppliedSandbox>,
}

/// Reply to a spawn that failed.
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

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    /// It called `exit` with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled {
        /// The signal number.
        signal: i32,
        /// Whether it dumped core.
        core_dumped: bool,
    },
}

/// Resources a child used, from `waitid(2)`'s rusage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceUsage {
    /// User CPU time, in microseconds.
    pub user_micros: u64,
    /// System CPU time, in microseconds.
    pub system_micros: u64,
    /// Peak resident set size, in KiB.
    pub max_rss_kib: u64,
}

/// A child exited and the daemon reaped it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitNotice {
    /// The id of the spawn request that started the child.
    pub id: u64,
    /// How it ended.
    pub status: ExitStatus,
    /// What it used.
    pub usage: ResourceUsage,
    /// The daemon ended it because its [`Timeout`] expired.
    pub timed_out: bool,
    /// What the child's whole cgroup used, grandchildren included; absent
    /// when the daemon placed the child in no cgroup, or the request had no
    /// [`CgroupSpec`].
    pub tree: Option<TreeUsage>,
    /// The child's pid, in the daemon's pid namespace: the one [`Spawned`]
    /// gave, for a client that got no `Spawned`
    /// ([`SpawnRequest::defer_spawned`]).
    pub pid: i32,
}

/// What a child's cgroup used, read just before the daemon removed it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeUsage {
    /// `cpu.stat` `user_usec`: user CPU time of every process that ran in
    /// the cgroup.
    pub user_micros: u64,
    /// `cpu.stat` `system_usec`.
    pub system_micros: u64,
    /// `memory.peak` in bytes; absent without the memory controller or
    /// before Linux 5.19.
    pub memory_peak_bytes: Option<u64>,
    /// `memory.events` `oom_kill`: processes the OOM killer ended.
    pub oom_kills: u64,
    /// The `memory.max` in force, when one was set.
    pub memory_max: Option<u64>,
}

/// A child stopped (`waitid` `WSTOPPED`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopNotice {
    /// The id of the spawn request that started the child.
    pub id: u64,
    /// The signal that stopped it (`SIGTSTP`, `SIGSTOP`, `SIGTTIN` or
    /// `SIGTTOU`).
    pub signal: i32,
}

/// A stopped child continued (`waitid` `WCONTINUED`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueNotice {
    /// The id of the spawn request that started the child.
    pub id: u64,
}

/// Asks the daemon to signal a child this connection started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    /// This request's own id.
    pub id: u64,
    /// The id of the spawn request that started the child.
    pub spawn_id: u64,
    /// The signal number.
    pub signal: i32,
}

/// The signal was delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalSent {
    /// The signal request's id.
    pub id: u64,
}

/// A request other than a spawn failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestFailed {
    /// The request's id.
    pub id: u64,
    /// The `errno` value.
    pub errno: i32,
    /// A sentence for humans.
    pub message: String,
}

/// Why the daemon is giving up on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProtocolErrorKind {
    /// The frame did not decode.
    Malformed,
    /// The frame was larger than [`Limits::max_frame_bytes`], or carried
    /// more fds than [`Limits::max_fds_per_frame`].
    TooLarge,
    /// The client's newest protocol version is older than every version
    /// the daemon serves; the message names both sides' versions.
    UnsupportedVersion,
    /// A message arrived that is not valid in this state (e.g. a request
    /// before [`Hello`], or a second [`Hello`]).
    UnexpectedMessage,
    /// A frame carried fds that its message does not use.
    UnexpectedFds,
    /// The peer is not allowed to use this daemon.
    PermissionDenied,
    /// The daemon is at its connection limit.
    Busy,
}

impl ProtocolErrorKind {
    /// Every kind, in wire (variant index) order.
    pub const ALL: [Self; 7] = [
        Self::Malformed,
        Self::TooLarge,
        Self::UnsupportedVersion,
        Self::UnexpectedMessage,
        Self::UnexpectedFds,
        Self::PermissionDenied,
        Self::Busy,
    ];

    /// Lowercase name, as used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::TooLarge => "too_large",
            Self::UnsupportedVersion => "unsupported_version",
            Self::UnexpectedMessage => "unexpected_message",
            Self::UnexpectedFds => "unexpected_fds",
            Self::PermissionDenied => "permission_denied",
            Self::Busy => "busy",
        }
    }
}

/// The last frame on a connection the daemon closes for cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolError {
    /// What went wrong.
    pub kind: ProtocolErrorKind,
    /// A sentence for humans.
    pub message: String,
}

/// Asks for the daemon's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusRequest {
    /// This request's own id.
    pub id: u64,
}

/// Asks the daemon to upgrade in place: re-execute the binary at its path,
/// keeping its pid, its connections and its children.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeRequest {
    /// This request's own id.
    pub id: u64,
}

/// The daemon's counters, as `zygote status` prints them.
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
    /// Use per peer uid (version 3). Root (and the daemon's own uid) sees
    /// every uid; any other peer sees only its own entry.
    pub peers: Vec<PeerUse>,
    /// The per-uid spawner processes (version 3); empty when the daemon
    /// has none.
    pub spawners: Vec<SpawnerInfo>,
}

/// What the peers of one uid use of the daemon, in a [`StatusReply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerUse {
    /// The peer uid.
    pub uid: u32,
    /// Connections open.
    pub connections: u64,
    /// Children running (started, not yet reaped).
    pub children: u64,
    /// The uid's share of the child table (its cap).
    pub children_limit: u64,
    /// The uid's share of the connections (its cap).
    pub connections_limit: u64,
    /// The sandbox profile the policy imposes on this uid, if any.
    pub sandbox_profile: Option<String>,
}

/// One per-uid spawner process, in a [`StatusReply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnerInfo {
    /// The uid it spawns for.
    pub uid: u32,
    /// Its pid.
    pub pid: i32,
    /// Spawns served since this spawner started.
    pub spawns: u64,
    /// Times a spawner for this uid was restarted after a crash.
    pub restarts: u64,
}
