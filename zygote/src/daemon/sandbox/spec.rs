//! The sandbox request's types, laid out as the protocol's version 3
//! carries them: the daemon builds on these until the wire has them.

/// Confinement for one child.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSpec {
    /// A profile defined in the daemon's policy file, applied first; every
    /// other field here can only tighten it.
    pub profile: Option<String>,
    /// The child's filesystem view; `None`: the host's.
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilesystemSpec {
    /// Mounted in this order on an empty tmpfs root.
    pub mounts: Vec<MountSpec>,
}

/// One mount of a [`FilesystemSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// What is mounted.
    pub kind: MountKind,
    /// Absolute host path; empty for [`MountKind::Tmpfs`].
    pub source: Vec<u8>,
    /// Absolute path inside the sandbox.
    pub destination: Vec<u8>,
}

/// The kind of a [`MountSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MountKind {
    /// A read-only bind mount of the source.
    ReadOnlyBind,
    /// A read-write bind mount of the source.
    Bind,
    /// A fresh tmpfs.
    Tmpfs,
}

/// The network a sandboxed child sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum NetworkMode {
    /// The host's network.
    #[default]
    Host,
    /// An empty network namespace (loopback down).
    None,
}

/// A seccomp filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeccompSpec {
    /// A named profile: `default` or `strict`.
    Profile(String),
    /// A custom filter: the text of a filter file.
    Filter(String),
}

/// Landlock rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockSpec {
    /// Paths readable.
    pub read_only: Vec<Vec<u8>>,
    /// Paths readable and executable.
    pub read_execute: Vec<Vec<u8>>,
    /// Paths readable and writable.
    pub read_write: Vec<Vec<u8>>,
    /// TCP ports the child may bind.
    pub tcp_bind: Vec<u16>,
    /// TCP ports the child may connect to.
    pub tcp_connect: Vec<u16>,
    /// Refuse when the kernel cannot enforce every rule.
    pub require: bool,
}

/// What confined a child.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppliedSandbox {
    /// The profile applied, if any.
    pub profile: Option<String>,
    /// Namespaces the child got, by name.
    pub namespaces: Vec<String>,
    /// The seccomp filter installed: a profile name, or `custom`.
    pub seccomp: Option<String>,
    /// The Landlock ABI version enforced.
    pub landlock_abi: Option<u32>,
    /// `false` when best-effort Landlock could not enforce every rule.
    pub landlock_complete: bool,
}
