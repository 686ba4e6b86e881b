//! Warm templates (version 4): a process the daemon starts and owns for a
//! peer, which has a runtime loaded and forks children that become
//! programs without an exec. `PROTOCOL.md` §4 gives the tables.
//!
//! The messages are generic over the runtime: [`TemplateRequest::kind`]
//! names it (`"python"` is the only kind today), so that another runtime
//! needs a new kind, not a new protocol version.

use serde::{Deserialize, Serialize};

use crate::env::Env;
use crate::message::SpawnRequest;

/// The kind of template a daemon offers today: CPython.
pub const PYTHON_TEMPLATE: &str = "python";

/// Find or start a template ([`ClientMessage::Template`](crate::ClientMessage::Template)).
///
/// The same (kind, interpreter, preload, env, cwd) from the same uid finds
/// the running one; templates are never shared between uids. Answered by
/// [`TemplateReady`], or by [`RequestFailed`](crate::RequestFailed) naming
/// what failed (a missing interpreter, a preload that raised, with its
/// traceback, a preload that started a thread, the start deadline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRequest {
    /// Unique among this connection's requests; the reply carries it back.
    pub id: u64,
    /// The runtime: [`PYTHON_TEMPLATE`]. Another kind is refused with
    /// `EOPNOTSUPP`.
    pub kind: String,
    /// The interpreter to exec. Without a `/` it is looked up in `PATH`
    /// from [`env`](Self::env), like `execvp(3)`.
    #[serde(with = "crate::bytes::one")]
    pub interpreter: Vec<u8>,
    /// Modules imported, in this order, before the template is ready.
    pub preload: Vec<String>,
    /// The template's whole environment, as the preloads see it. Each
    /// child gets its own request's environment after the fork.
    pub env: Env,
    /// The template's working directory while it imports; the daemon's
    /// when absent.
    #[serde(with = "crate::bytes::optional")]
    pub cwd: Option<Vec<u8>>,
}

/// A template is ready ([`ServerMessage::TemplateReady`](crate::ServerMessage::TemplateReady)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateReady {
    /// The template request's id.
    pub id: u64,
    /// The template's handle, for [`TemplateSpawnRequest::template`].
    /// Unique for the daemon's lifetime, never reused.
    pub template: u64,
    /// The template process's pid.
    pub pid: i32,
    /// `true` when a running template was found; `false` when this request
    /// started it.
    pub reused: bool,
}

/// Start a child from a template
/// ([`ClientMessage::SpawnFromTemplate`](crate::ClientMessage::SpawnFromTemplate)).
///
/// Answered as a spawn is: [`Spawned`](crate::Spawned) once the child has
/// set itself up and is about to run the program, or
/// [`SpawnFailed`](crate::SpawnFailed), then [`ExitNotice`](crate::ExitNotice).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateSpawnRequest {
    /// A handle from [`TemplateReady`]. One of another uid, or one that no
    /// longer exists, is refused (`EPERM`, `ENOENT`; stage `Validate`).
    pub template: u64,
    /// The child. `program` must be empty, and `args` are what the runtime
    /// would take on its command line (for Python: `-c CODE ...`,
    /// `-m MODULE ...` or `SCRIPT ...`). Fields a warm child cannot honour
    /// (`user`, `sandbox`, `argv0`) are refused, never ignored.
    pub spawn: SpawnRequest,
}

/// List templates ([`ClientMessage::ListTemplates`](crate::ClientMessage::ListTemplates)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateListRequest {
    /// This request's own id.
    pub id: u64,
}

/// The templates a peer may see ([`ServerMessage::Templates`](crate::ServerMessage::Templates)):
/// root and the daemon's own uid see every uid's, any other peer its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateList {
    /// The list request's id.
    pub id: u64,
    /// One entry per template.
    pub templates: Vec<TemplateInfo>,
}

/// One template, in a [`TemplateList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateInfo {
    /// Its handle.
    pub template: u64,
    /// The uid it runs as and belongs to.
    pub uid: u32,
    /// Its process's pid; 0 while none runs (between a recycle or a crash
    /// and the next request).
    pub pid: i32,
    /// Its runtime, as in [`TemplateRequest::kind`].
    pub kind: String,
    /// The interpreter, as requested.
    #[serde(with = "crate::bytes::one")]
    pub interpreter: Vec<u8>,
    /// The modules it preloaded.
    pub preload: Vec<String>,
    /// Children forked by its current process.
    pub forks: u64,
    /// Times its process was started again (recycled, or after a crash).
    pub restarts: u64,
    /// Age of its current process, in milliseconds.
    pub age_millis: u64,
    /// Resident memory of its current process, in bytes.
    pub rss_bytes: u64,
}
