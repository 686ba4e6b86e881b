//! Checking a sandbox request before anything exists: paths, mounts,
//! the hostname, filters, and whether a request loosens its base.

use std::ffi::CString;

use super::{
    MAX_HOSTNAME, MountKind, MountSpec, NetworkMode, Refusal, SandboxSpec, SeccompSpec, seccomp,
};
use crate::spawn::{MAX_MOUNTS, Mount, MountKind as PlanMountKind};

/// Checks a spec's paths, hostname and seccomp filter, creating
/// nothing: for the policy's profiles, at load.
///
/// # Errors
///
/// A [`Refusal`] naming the item.
pub(crate) fn validate(spec: &SandboxSpec) -> Result<(), Refusal> {
    if let Some(hostname) = &spec.hostname {
        check_hostname(hostname, spec.isolate)?;
    }
    if let Some(filesystem) = &spec.filesystem {
        check_mounts(&filesystem.mounts)?;
    }
    match &spec.seccomp {
        Some(SeccompSpec::Profile(name)) => seccomp::profile(name).map(drop),
        Some(SeccompSpec::Filter(text)) => seccomp::custom(text).map(drop),
        None => Ok(()),
    }
    .map_err(Refusal::invalid)?;
    if let Some(landlock) = &spec.landlock {
        let paths = landlock.read_only.iter().chain(&landlock.read_execute);
        for path in paths.chain(&landlock.read_write) {
            check_path("landlock path", path)?;
        }
    }
    Ok(())
}

/// Refuses a request (not naming its base) that asks for less than the
/// base: see the module's rules.
pub(super) fn check_not_looser(base: &SandboxSpec, request: &SandboxSpec) -> Result<(), Refusal> {
    let looser = [
        (
            base.network == NetworkMode::None && request.network == NetworkMode::Host,
            "network host",
        ),
        (base.isolate && !request.isolate, "no isolate"),
        (
            base.seccomp.is_some() && request.seccomp.is_none(),
            "no seccomp filter",
        ),
        (
            base.landlock.is_some() && request.landlock.is_none(),
            "no landlock rules",
        ),
        (
            base.filesystem.is_some() && request.filesystem.is_none(),
            "the host's filesystem",
        ),
    ];
    match looser.iter().find(|(loosens, _)| *loosens) {
        Some((_, what)) => Err(Refusal::denied(format!(
            "sandbox: {what} would loosen the profile this peer is confined to \
             (name the profile to add to it)"
        ))),
        None => Ok(()),
    }
}

/// The mounts of the layers: the first filesystem, plus only tmpfs
/// mounts from later layers.
pub(super) fn merge_filesystems(
    layers: &[&SandboxSpec],
) -> Result<Option<Vec<MountSpec>>, Refusal> {
    let mut merged: Option<Vec<MountSpec>> = None;
    for layer in layers {
        let Some(filesystem) = &layer.filesystem else {
            continue;
        };
        match &mut merged {
            None => merged = Some(filesystem.mounts.clone()),
            Some(mounts) => {
                if let Some(bind) = filesystem
                    .mounts
                    .iter()
                    .find(|m| m.kind != MountKind::Tmpfs)
                {
                    return Err(Refusal::denied(format!(
                        "sandbox: a bind of {} would loosen the profile's filesystem \
                         (only tmpfs mounts may be added to it)",
                        String::from_utf8_lossy(&bind.source)
                    )));
                }
                mounts.extend(filesystem.mounts.iter().cloned());
            }
        }
    }
    Ok(merged)
}

pub(super) fn check_hostname(hostname: &str, isolate: bool) -> Result<(), Refusal> {
    if !isolate {
        return Err(Refusal::invalid(
            "sandbox hostname: needs isolate (a uts namespace of its own)",
        ));
    }
    if hostname.is_empty() || hostname.len() > MAX_HOSTNAME || hostname.contains('\0') {
        return Err(Refusal::invalid(format!(
            "sandbox hostname {hostname:?}: give 1 to {MAX_HOSTNAME} bytes, no NUL"
        )));
    }
    Ok(())
}

/// Checks every mount and turns it into the child's form.
pub(super) fn check_mounts(mounts: &[MountSpec]) -> Result<Vec<Mount>, Refusal> {
    if mounts.len() > MAX_MOUNTS {
        return Err(Refusal::invalid(format!(
            "sandbox filesystem: {} mounts, more than the {MAX_MOUNTS} allowed",
            mounts.len()
        )));
    }
    mounts
        .iter()
        .map(|mount| {
            let destination = check_path("mount destination", &mount.destination)?;
            let shown = String::from_utf8_lossy(&mount.destination);
            if destination.is_empty() {
                return Err(Refusal::invalid(
                    "mount destination /: the root is the sandbox's own tmpfs",
                ));
            }
            let first = destination.split(|b| *b == b'/').next().unwrap_or_default();
            if first == b"proc" || first == b"dev" {
                return Err(Refusal::invalid(format!(
                    "mount destination {shown}: /proc and /dev are the sandbox's own"
                )));
            }
            let (kind, source) = match mount.kind {
                MountKind::Tmpfs => {
                    if !mount.source.is_empty() {
                        return Err(Refusal::invalid(format!(
                            "tmpfs at {shown}: a tmpfs has no source"
                        )));
                    }
                    (PlanMountKind::Tmpfs, Vec::new())
                }
                MountKind::ReadOnlyBind | MountKind::Bind => {
                    let source = check_path("bind source", &mount.source)?;
                    let kind = if mount.kind == MountKind::Bind {
                        PlanMountKind::Bind
                    } else {
                        PlanMountKind::ReadOnlyBind
                    };
                    let mut absolute = b"/".to_vec();
                    absolute.extend(source);
                    (kind, absolute)
                }
            };
            Ok(Mount {
                kind,
                source: cstring(source)?,
                destination: cstring(destination)?,
            })
        })
        .collect()
}

fn cstring(bytes: Vec<u8>) -> Result<CString, Refusal> {
    CString::new(bytes).map_err(|_| Refusal::invalid("sandbox path contains a NUL byte"))
}

/// An absolute path without `..`, returned relative (no leading `/`),
/// with `.` and empty components dropped.
///
/// # Errors
///
/// A relative path, `..`, a NUL byte, or a component over 255 bytes,
/// naming `what` and the path.
pub(crate) fn check_path(what: &str, path: &[u8]) -> Result<Vec<u8>, Refusal> {
    let shown = String::from_utf8_lossy(path);
    if !path.starts_with(b"/") {
        return Err(Refusal::invalid(format!(
            "{what} {shown:?}: not an absolute path"
        )));
    }
    if path.contains(&0) {
        return Err(Refusal::invalid(format!(
            "{what} {shown:?}: contains a NUL byte"
        )));
    }
    let mut clean = Vec::with_capacity(path.len());
    for part in path.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                return Err(Refusal::invalid(format!(
                    "{what} {shown:?}: `..` is not allowed"
                )));
            }
            part if part.len() > 255 => {
                return Err(Refusal::invalid(format!(
                    "{what} {shown:?}: a component is too long"
                )));
            }
            part => {
                if !clean.is_empty() {
                    clean.push(b'/');
                }
                clean.extend_from_slice(part);
            }
        }
    }
    Ok(clean)
}
