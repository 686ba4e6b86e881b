//! Turning a sandbox request, and the profile a policy imposes, into a
//! checked [`SandboxPlan`] for the child, refusing bad input before any
//! process exists. The child applies the plan (`spawn::sandbox`).
//!
//! # Layering and tightening
//!
//! The base is the policy's imposed profile, else the profile the request
//! names, else nothing. The request's own fields then only add
//! restrictions:
//!
//! - `network`: `None` replaces `Host`; under a base of `None`, a request
//!   that does not name the base profile and says `Host` is refused.
//! - `isolate`: `true` adds the namespaces; under an isolating base, a
//!   request that does not name it and says `false` is refused.
//! - `hostname`: set when the result isolates.
//! - `filesystem`: with a base that has none, the request's is used;
//!   over a base's filesystem a request may only add `Tmpfs` mounts
//!   (which hide, never reveal); anything else is refused.
//! - `seccomp`, `landlock`: stacked on the base's (a second filter or
//!   ruleset, each of which can only take rights away); a request without
//!   one under a base with one is refused unless it names the base.
//!
//! A request naming a profile other than the imposed one is refused.

mod checks;
mod landlock;
pub mod pool;
pub mod profile;
mod seccomp;
pub mod spec;

use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};

use crate::spawn::{SandboxFailure, SandboxPlan, SandboxStep};
pub use profile::Profiles;
pub use seccomp::{
    MAX_FILTER_BYTES, MAX_FILTER_SYSCALLS, PROFILES as SECCOMP_PROFILES,
    prepare as prepare_seccomp, profile as seccomp_profile,
};
pub use spec::{
    AppliedSandbox, FilesystemSpec, LandlockSpec, MountKind, MountSpec, NetworkMode, SandboxSpec,
    SeccompSpec,
};

/// The longest hostname (the kernel's `HOST_NAME_MAX`).
const MAX_HOSTNAME: usize = 64;

/// A sandbox refused before anything was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `true`: bad input (stage `Validate`); `false`: what this kernel or
    /// daemon cannot do (stage `Sandbox`).
    pub invalid: bool,
    /// The errno to report.
    pub errno: i32,
    /// What is wrong, naming the item.
    pub message: String,
}

impl Refusal {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            invalid: true,
            errno: libc::EINVAL,
            message: message.into(),
        }
    }

    fn denied(message: impl Into<String>) -> Self {
        Self {
            invalid: true,
            errno: libc::EPERM,
            message: message.into(),
        }
    }

    fn sandbox(errno: i32, message: impl Into<String>) -> Self {
        Self {
            invalid: false,
            errno,
            message: message.into(),
        }
    }
}

/// What the daemon keeps for sandboxes: the profiles, and the empty
/// network namespace, made on first use.
#[derive(Debug, Default)]
pub struct Sandboxes {
    /// The policy's profiles.
    pub profiles: Profiles,
    /// Whether the daemon is rootless (not uid 0): children get a user
    /// namespace of their own, mapping the daemon's ids to themselves.
    pub rootless: Option<(u32, u32)>,
    /// Inits parked for the next spawn of their sandbox.
    pub pool: Arc<pool::Pool>,
    netns: OnceLock<Result<Arc<OwnedFd>, String>>,
    dev_template: OnceLock<Option<Arc<OwnedFd>>>,
}

impl Sandboxes {
    /// For a daemon running as `uid`/`gid` with these profiles.
    pub fn new(profiles: Profiles, uid: u32, gid: u32) -> Self {
        Self {
            profiles,
            rootless: (uid != 0).then_some((uid, gid)),
            pool: Arc::default(),
            netns: OnceLock::new(),
            dev_template: OnceLock::new(),
        }
    }

    /// The `/dev` a root daemon's sandboxes clone, made on first use;
    /// `None` where it cannot be made (each child then builds its own,
    /// the same `/dev`, at more cost).
    fn dev_template(&self) -> Option<Arc<OwnedFd>> {
        self.dev_template
            .get_or_init(|| match crate::spawn::dev_template() {
                Ok(dev) => Some(Arc::new(dev)),
                Err(error) => {
                    tracing::info!(%error, "sandboxes build their /dev one by one: no template of it");
                    None
                }
            })
            .clone()
    }

    fn empty_netns(&self) -> Result<Arc<OwnedFd>, Refusal> {
        self.netns
            .get_or_init(|| {
                crate::spawn::empty_network_namespace()
                    .map(Arc::new)
                    .map_err(|error| error.to_string())
            })
            .clone()
            .map_err(|error| {
                Refusal::sandbox(
                    libc::EPERM,
                    format!("network none: failed to create the empty network namespace: {error}"),
                )
            })
    }

    /// The plan for a request's sandbox under an imposed profile, and
    /// what it applies; `None` when neither asks for one.
    ///
    /// # Errors
    ///
    /// A [`Refusal`] naming the item.
    pub fn resolve(
        &self,
        request: Option<&SandboxSpec>,
        imposed: Option<&str>,
    ) -> Result<Option<(SandboxPlan, AppliedSandbox)>, Refusal> {
        let base_name = match (imposed, request.and_then(|r| r.profile.as_deref())) {
            (Some(imposed), Some(named)) if imposed != named => {
                return Err(Refusal::denied(format!(
                    "sandbox profile {named:?}: this peer is confined to profile {imposed:?}"
                )));
            }
            (Some(name), _) | (None, Some(name)) => Some(name),
            (None, None) => None,
        };
        let base =
            match base_name {
                Some(name) => Some(self.profiles.get(name).ok_or_else(|| {
                    Refusal::invalid(format!("unknown sandbox profile {name:?}"))
                })?),
                None => None,
            };
        let named = request.is_some_and(|r| r.profile.is_some());
        let layers: Vec<&SandboxSpec> = base.into_iter().chain(request).collect();
        if layers.is_empty() {
            return Ok(None);
        }
        if let (Some(base), Some(request), false) = (base, request, named) {
            check_not_looser(base, request)?;
        }
        self.plan(&layers, base_name).map(Some)
    }

    fn plan(
        &self,
        layers: &[&SandboxSpec],
        profile: Option<&str>,
    ) -> Result<(SandboxPlan, AppliedSandbox), Refusal> {
        let mut plan = SandboxPlan::default();
        let mut applied = AppliedSandbox {
            profile: profile.map(str::to_owned),
            landlock_complete: true,
            ..AppliedSandbox::default()
        };
        let isolate = layers.iter().any(|layer| layer.isolate);
        let network_none = layers.iter().any(|l| l.network == NetworkMode::None);
        let hostname = layers.iter().rev().find_map(|l| l.hostname.as_deref());
        if let Some(hostname) = hostname {
            check_hostname(hostname, isolate)?;
            plan.hostname = Some(hostname.as_bytes().to_vec());
        }
        let filesystem = merge_filesystems(layers)?;
        if let Some(mounts) = &filesystem {
            if self.rootless.is_some() && !isolate {
                return Err(Refusal::sandbox(
                    libc::EPERM,
                    "filesystem: a zygote not running as root needs isolate with it \
                     (a fresh /proc needs a new pid namespace there)",
                ));
            }
            plan.filesystem = Some(check_mounts(mounts)?);
            plan.clone_flags |= libc::CLONE_NEWNS;
            applied.namespaces.push("mount".into());
        }
        if isolate {
            plan.clone_flags |= libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
            applied
                .namespaces
                .extend(["pid", "ipc", "uts"].map(String::from));
            if plan.filesystem.is_none() {
                // The host's view, with a /proc of the new pid namespace.
                plan.fresh_proc = true;
                plan.clone_flags |= libc::CLONE_NEWNS;
                applied.namespaces.push("mount".into());
            }
        }
        if network_none {
            if self.rootless.is_some() {
                plan.clone_flags |= libc::CLONE_NEWNET;
            } else {
                plan.netns = Some(self.empty_netns()?);
            }
            applied.namespaces.push("net".into());
        }
        if let Some(ids) = self.rootless {
            if plan.clone_flags != 0 {
                plan.clone_flags |= libc::CLONE_NEWUSER;
                plan.map_ids = Some(ids);
                applied.namespaces.push("user".into());
            }
        }
        if plan.filesystem.is_some() && self.rootless.is_none() {
            plan.dev_template = self.dev_template();
        }
        plan.clear_bounding_set = self.rootless.is_none() || plan.map_ids.is_some();
        self.add_filters(layers, profile, &mut plan, &mut applied)?;
        Ok((plan, applied))
    }

    /// Adds each layer's seccomp program and Landlock ruleset; `profile`
    /// names the first layer when it is a policy profile.
    fn add_filters(
        &self,
        layers: &[&SandboxSpec],
        profile: Option<&str>,
        plan: &mut SandboxPlan,
        applied: &mut AppliedSandbox,
    ) -> Result<(), Refusal> {
        for (index, layer) in layers.iter().enumerate() {
            if let Some(seccomp) = &layer.seccomp {
                let program = match seccomp {
                    SeccompSpec::Profile(name) => seccomp::profile(name),
                    SeccompSpec::Filter(text) => seccomp::custom(text),
                }
                .map_err(Refusal::invalid)?;
                applied.seccomp = Some(program.name.clone());
                plan.seccomp.push(program);
            }
            if let Some(spec) = &layer.landlock {
                match landlock::build(spec)? {
                    Some(mut built) => {
                        applied.landlock_abi = Some(built.abi);
                        applied.landlock_complete &= built.complete;
                        // A policy profile's rules may be held by a
                        // spawner process; a request's are built per child.
                        if let (0, Some(profile)) = (index, profile) {
                            built.plan.held = Some(landlock::fingerprint(profile, spec));
                        }
                        plan.landlock.push(built.plan);
                    }
                    None => applied.landlock_complete = false,
                }
            }
        }
        Ok(())
    }
}

use checks::{check_hostname, check_mounts, check_not_looser, merge_filesystems};
pub(crate) use checks::{check_path, validate};

/// Whether this daemon can enforce sandboxes: it runs as root, or
/// unprivileged user namespaces are open to it (checked once).
pub fn enforceable() -> bool {
    static ENFORCEABLE: OnceLock<bool> = OnceLock::new();
    *ENFORCEABLE.get_or_init(|| {
        rustix::process::geteuid().is_root() || crate::spawn::user_namespaces_work()
    })
}

/// The paths a sandbox plan names, by the index a child's failure
/// report gives: kept for the message after the plan is gone.
#[derive(Debug, Default)]
pub struct FailureNames {
    mounts: Vec<(String, String)>,
    landlock: Vec<String>,
}

impl FailureNames {
    /// The names in `plan`.
    pub fn of(plan: &SandboxPlan) -> Self {
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        Self {
            mounts: plan
                .filesystem
                .iter()
                .flatten()
                .map(|mount| {
                    (
                        text(mount.source.to_bytes()),
                        format!("/{}", text(mount.destination.to_bytes())),
                    )
                })
                .collect(),
            landlock: plan
                .landlock
                .iter()
                .flat_map(|ruleset| &ruleset.paths)
                .map(|(path, _)| text(path.to_bytes()))
                .collect(),
        }
    }

    /// The message for a child's sandbox failure: the step, the path if
    /// any, and the errno's text.
    pub fn describe(&self, failure: SandboxFailure, reason: &str) -> String {
        let item = failure.item.map(usize::from);
        let path = match failure.step {
            SandboxStep::Source => item.and_then(|i| self.mounts.get(i)).map(|m| m.0.as_str()),
            SandboxStep::Mount | SandboxStep::Destination => item
                .and_then(|i| self.mounts.get(i))
                .map(|m| m.1.as_str())
                .or(Some("/proc")),
            SandboxStep::Dev => Some("/dev"),
            SandboxStep::LandlockPath | SandboxStep::Landlock => {
                item.and_then(|i| self.landlock.get(i)).map(String::as_str)
            }
            _ => None,
        };
        match path {
            Some(path) => format!("sandbox step {}: {path}: {reason}", failure.step.name()),
            None => format!("sandbox step {}: {reason}", failure.step.name()),
        }
    }
}

#[cfg(test)]
mod tests;
