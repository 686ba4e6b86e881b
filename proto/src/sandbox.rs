//! The confinement a spawn request asks for ([`SandboxSpec`]), and what the
//! daemon reports it applied ([`AppliedSandbox`]). Version 3 of the
//! protocol; `PROTOCOL.md` §4 gives the tables.
//!
//! Paths are byte strings, as [`SpawnRequest::program`](crate::SpawnRequest::program)
//! is; every one must be absolute.

use serde::{Deserialize, Serialize};

/// Confinement for one child (see [`SpawnRequest::sandbox`](crate::SpawnRequest::sandbox)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// A profile defined in the daemon's policy file, applied first; every
    /// other field here can only tighten it (add restrictions), never
    /// loosen it.
    pub profile: Option<String>,
    /// The child's filesystem view. `None`: the host's (no new mount
    /// namespace). `Some`: a new mount namespace, `pivot_root` into an
    /// empty tmpfs mounted read-only, then these mounts in order; a
    /// minimal `/dev` is always provided.
    pub filesystem: Option<FilesystemSpec>,
    /// The network the child sees.
    pub network: NetworkMode,
    /// New pid, ipc and uts namespaces.
    pub isolate: bool,
    /// The hostname inside; requires `isolate`.
    pub hostname: Option<String>,
    /// A seccomp filter, installed last before exec.
    pub seccomp: Option<SeccompSpec>,
    /// Landlock rules.
    pub landlock: Option<LandlockSpec>,
}

/// The mounts of a sandbox's own filesystem view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemSpec {
    /// Mounted in this order on an empty tmpfs root.
    pub mounts: Vec<MountSpec>,
}

/// One mount of a [`FilesystemSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    /// What is mounted.
    pub kind: MountKind,
    /// Absolute host path; empty for [`MountKind::Tmpfs`].
    #[serde(with = "crate::bytes::one")]
    pub source: Vec<u8>,
    /// Absolute path inside the sandbox.
    #[serde(with = "crate::bytes::one")]
    pub destination: Vec<u8>,
}

/// The kind of a [`MountSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MountKind {
    /// A read-only bind mount of the source.
    ReadOnlyBind,
    /// A read-write bind mount of the source.
    Bind,
    /// A fresh tmpfs.
    Tmpfs,
}

/// The network a sandboxed child sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NetworkMode {
    /// The host's network.
    #[default]
    Host,
    /// An empty network namespace (loopback down).
    None,
}

/// A seccomp filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SeccompSpec {
    /// A named profile: `default` or `strict` (or one defined in policy).
    Profile(String),
    /// A custom filter: the text of a filter file in the documented
    /// format.
    Filter(String),
}

/// Landlock rules: what the child may reach, and how strictly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockSpec {
    /// Paths readable (files and directories beneath).
    #[serde(with = "crate::bytes::list")]
    pub read_only: Vec<Vec<u8>>,
    /// Paths readable and executable.
    #[serde(with = "crate::bytes::list")]
    pub read_execute: Vec<Vec<u8>>,
    /// Paths readable and writable.
    #[serde(with = "crate::bytes::list")]
    pub read_write: Vec<Vec<u8>>,
    /// TCP ports the child may bind.
    pub tcp_bind: Vec<u16>,
    /// TCP ports the child may connect to.
    pub tcp_connect: Vec<u16>,
    /// `true`: refuse the spawn when the kernel's Landlock ABI cannot
    /// enforce every rule. `false`: best effort (what was enforced is
    /// reported in [`AppliedSandbox`]).
    pub require: bool,
}

/// What confined a child, reported in [`Spawned::sandbox`](crate::Spawned::sandbox).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedSandbox {
    /// The profile applied (the policy's imposed one, or the request's),
    /// if any.
    pub profile: Option<String>,
    /// Namespaces the child got, by name: `mount`, `pid`, `ipc`, `uts`,
    /// `net`, `user`.
    pub namespaces: Vec<String>,
    /// The seccomp filter installed: a profile name, or `custom`.
    pub seccomp: Option<String>,
    /// The Landlock ABI version enforced; `None` when Landlock was not
    /// applied.
    pub landlock_abi: Option<u32>,
    /// `false` when best-effort Landlock could not enforce every requested
    /// rule.
    pub landlock_complete: bool,
}
