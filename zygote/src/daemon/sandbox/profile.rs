//! Sandbox profiles defined in the policy file (`[sandbox.NAME]`), which
//! a `[[peer]]` rule can impose (`sandbox = "NAME"`) and a request can
//! name. See `zygote-policy(5)`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::spec::{
    FilesystemSpec, LandlockSpec, MountKind, MountSpec, NetworkMode, SandboxSpec, SeccompSpec,
};

/// One `[sandbox.NAME]` table, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// `"none"` or `"host"`.
    #[serde(default)]
    pub network: Option<String>,
    /// New pid, ipc and uts namespaces.
    #[serde(default)]
    pub isolate: bool,
    /// The hostname inside (needs `isolate`).
    pub hostname: Option<String>,
    /// A seccomp profile name: `default` or `strict`.
    pub seccomp: Option<String>,
    /// A custom seccomp filter, in the filter file format.
    pub seccomp_filter: Option<String>,
    /// Read-only binds, `SRC` or `SRC:DST`.
    #[serde(default)]
    pub ro_bind: Vec<String>,
    /// Read-write binds, `SRC` or `SRC:DST`.
    #[serde(default)]
    pub bind: Vec<String>,
    /// Fresh tmpfs directories.
    #[serde(default)]
    pub tmpfs: Vec<String>,
    /// Landlock read-only paths.
    pub landlock_ro: Option<Vec<String>>,
    /// Landlock read-execute paths.
    pub landlock_rx: Option<Vec<String>>,
    /// Landlock read-write paths.
    pub landlock_rw: Option<Vec<String>>,
    /// Landlock TCP ports the child may bind.
    pub landlock_tcp_bind: Option<Vec<u16>>,
    /// Landlock TCP ports the child may connect to.
    pub landlock_tcp_connect: Option<Vec<u16>>,
    /// Refuse when the kernel cannot enforce every Landlock rule.
    #[serde(default)]
    pub landlock_require: bool,
}

/// The policy's profiles by name, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profiles {
    specs: BTreeMap<String, SandboxSpec>,
}

impl Profiles {
    /// Checks and converts the policy file's tables.
    ///
    /// # Errors
    ///
    /// A message naming the profile and what is wrong with it.
    pub fn from_file(files: &BTreeMap<String, ProfileFile>) -> Result<Self, String> {
        let mut specs = BTreeMap::new();
        for (name, file) in files {
            let spec = convert(file).map_err(|error| format!("[sandbox.{name}]: {error}"))?;
            specs.insert(name.clone(), spec);
        }
        for (name, spec) in &specs {
            // Paths, hostname and filter now, at load: creating nothing.
            super::validate(spec)
                .map_err(|refusal| format!("[sandbox.{name}]: {}", refusal.message))?;
        }
        Ok(Self { specs })
    }

    /// The profile called `name`.
    pub fn get(&self, name: &str) -> Option<&SandboxSpec> {
        self.specs.get(name)
    }

    /// Whether a profile is called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.specs.contains_key(name)
    }
}

fn convert(file: &ProfileFile) -> Result<SandboxSpec, String> {
    let network = match file.network.as_deref() {
        None | Some("host") => NetworkMode::Host,
        Some("none") => NetworkMode::None,
        Some(other) => return Err(format!("network {other:?}: give \"none\" or \"host\"")),
    };
    let seccomp = match (&file.seccomp, &file.seccomp_filter) {
        (Some(_), Some(_)) => return Err("give seccomp or seccomp_filter, not both".into()),
        (Some(name), None) => Some(SeccompSpec::Profile(name.clone())),
        (None, Some(text)) => Some(SeccompSpec::Filter(text.clone())),
        (None, None) => None,
    };
    let mut mounts = Vec::new();
    for (list, kind) in [
        (&file.ro_bind, MountKind::ReadOnlyBind),
        (&file.bind, MountKind::Bind),
    ] {
        for entry in list {
            let (source, destination) = entry.split_once(':').unwrap_or((entry, entry));
            mounts.push(MountSpec {
                kind,
                source: source.as_bytes().to_vec(),
                destination: destination.as_bytes().to_vec(),
            });
        }
    }
    mounts.extend(file.tmpfs.iter().map(|dir| MountSpec {
        kind: MountKind::Tmpfs,
        source: Vec::new(),
        destination: dir.as_bytes().to_vec(),
    }));
    let has_filesystem =
        !file.ro_bind.is_empty() || !file.bind.is_empty() || !file.tmpfs.is_empty();
    let landlock_set = file.landlock_ro.is_some()
        || file.landlock_rx.is_some()
        || file.landlock_rw.is_some()
        || file.landlock_tcp_bind.is_some()
        || file.landlock_tcp_connect.is_some();
    let bytes = |list: &Option<Vec<String>>| {
        list.iter()
            .flatten()
            .map(|path| path.as_bytes().to_vec())
            .collect()
    };
    Ok(SandboxSpec {
        profile: None,
        filesystem: has_filesystem.then_some(FilesystemSpec { mounts }),
        network,
        isolate: file.isolate,
        hostname: file.hostname.clone(),
        seccomp,
        landlock: landlock_set.then(|| LandlockSpec {
            read_only: bytes(&file.landlock_ro),
            read_execute: bytes(&file.landlock_rx),
            read_write: bytes(&file.landlock_rw),
            tcp_bind: file.landlock_tcp_bind.clone().unwrap_or_default(),
            tcp_connect: file.landlock_tcp_connect.clone().unwrap_or_default(),
            require: file.landlock_require,
        }),
    })
}
