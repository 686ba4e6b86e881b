//! The sandbox request's types: the protocol's.

pub use zygote_proto::{
    AppliedSandbox, FilesystemSpec, LandlockSpec, MountKind, MountSpec, NetworkMode, SandboxSpec,
    SeccompSpec,
};
