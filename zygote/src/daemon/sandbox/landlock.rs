//! Landlock: the ruleset built with the `landlock` crate in the daemon
//! (handled rights, TCP port rules); the path rules are added by the child,
//! which opens each path as the peer (see `spawn::sandbox`).

use std::ffi::CString;
use std::os::fd::OwnedFd;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, Ruleset,
    RulesetAttr, RulesetCreatedAttr,
};

use super::spec::LandlockSpec;
use super::{Refusal, check_path};
use crate::spawn::{self, LandlockPlan};

/// The ABI whose rights a sandbox handles: every filesystem right up to
/// `IoctlDev` (ABI 5), TCP bind and connect (ABI 4). `require` needs a
/// kernel at this ABI or later.
const TARGET_VERSION: u32 = 5;
/// The most paths one Landlock spec may list.
pub const MAX_LANDLOCK_PATHS: usize = 256;

/// A built ruleset and what it enforces.
pub struct Built {
    /// For the child.
    pub plan: LandlockPlan,
    /// The kernel's ABI version.
    pub abi: u32,
    /// Whether every rule is enforced (always, under `require`).
    pub complete: bool,
}

/// Builds the ruleset for `spec`.
///
/// # Errors
///
/// A relative path or `..` (naming it), too many paths, or, under
/// `require`, a kernel whose Landlock cannot enforce every rule.
pub fn build(spec: &LandlockSpec) -> Result<Option<Built>, Refusal> {
    let count = spec.read_only.len() + spec.read_execute.len() + spec.read_write.len();
    if count > MAX_LANDLOCK_PATHS {
        return Err(Refusal::invalid(format!(
            "landlock: {count} paths, more than the {MAX_LANDLOCK_PATHS} allowed"
        )));
    }
    let kernel = spawn::landlock_abi();
    let abi = ABI::from(i32::try_from(kernel.min(TARGET_VERSION)).unwrap_or(0));
    let needs_net = !spec.tcp_bind.is_empty() || !spec.tcp_connect.is_empty();
    let complete = kernel >= TARGET_VERSION;
    if spec.require && !complete {
        return Err(Refusal::sandbox(
            libc::EOPNOTSUPP,
            format!(
                "landlock: required, but this kernel's Landlock ABI is {kernel}, \
                 and every rule needs {TARGET_VERSION}"
            ),
        ));
    }
    if kernel == 0 {
        // Best effort on a kernel without Landlock: reported, not applied.
        return Ok(None);
    }
    let fs_all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let mut paths = Vec::with_capacity(count);
    let lists: [(&[Vec<u8>], BitFlags<AccessFs>); 3] = [
        (&spec.read_only, read & !AccessFs::Execute),
        (&spec.read_execute, read),
        (&spec.read_write, fs_all),
    ];
    for (list, access) in lists {
        for path in list {
            let mut absolute = b"/".to_vec();
            absolute.extend(check_path("landlock path", path)?);
            let path = CString::new(absolute)
                .map_err(|_| Refusal::invalid("landlock path contains a NUL byte"))?;
            paths.push((path, access.bits()));
        }
    }
    let ruleset = create(spec, abi, needs_net)
        .map_err(|error| Refusal::sandbox(libc::EOPNOTSUPP, format!("landlock: {error}")))?;
    Ok(ruleset.map(|ruleset| Built {
        plan: LandlockPlan {
            ruleset,
            paths,
            file_access: AccessFs::from_file(abi).bits(),
            held: None,
        },
        abi: kernel,
        complete,
    }))
}

fn create(
    spec: &LandlockSpec,
    abi: ABI,
    needs_net: bool,
) -> Result<Option<OwnedFd>, landlock::RulesetError> {
    let level = if spec.require {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(abi))?;
    if needs_net {
        let mut net = BitFlags::<AccessNet>::empty();
        if !spec.tcp_bind.is_empty() {
            net |= AccessNet::BindTcp;
        }
        if !spec.tcp_connect.is_empty() {
            net |= AccessNet::ConnectTcp;
        }
        ruleset = ruleset.handle_access(net)?;
    }
    let mut created = ruleset.create()?;
    for port in &spec.tcp_bind {
        created = created.add_rule(NetPort::new(*port, AccessNet::BindTcp))?;
    }
    for port in &spec.tcp_connect {
        created = created.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
    }
    Ok(created.into())
}

/// A fingerprint of a policy profile's Landlock rules (its name and
/// spec): the spawner processes that hold a profile's rules are told
/// apart by it, so that a profile changed by a policy reload gets new ones.
pub fn fingerprint(profile: &str, spec: &LandlockSpec) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    profile.hash(&mut hasher);
    spec.read_only.hash(&mut hasher);
    spec.read_execute.hash(&mut hasher);
    spec.read_write.hash(&mut hasher);
    spec.tcp_bind.hash(&mut hasher);
    spec.tcp_connect.hash(&mut hasher);
    spec.require.hash(&mut hasher);
    hasher.finish()
}
