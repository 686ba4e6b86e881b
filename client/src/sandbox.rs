//! [`Sandbox`]: the confinement a [`Command`](crate::Command) asks for.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use zygote_proto::{
    FilesystemSpec, LandlockSpec, MountKind, MountSpec, NetworkMode, SandboxSpec, SeccompSpec,
};

use crate::{Error, Result};

/// A sandbox for one child, built with chained calls and given to
/// [`Command::sandbox`](crate::Command::sandbox). The zygote sets it up
/// between clone and exec, and reports what it applied in
/// [`Child::sandbox`](crate::Child::sandbox).
///
/// Every path must be absolute; a relative one makes the spawn fail with
/// [`Error::InvalidInput`] before anything is sent. A zygote that does not
/// offer the feature `sandbox` gets no request at all: the spawn fails
/// with `EOPNOTSUPP` naming the feature, never silently unconfined.
///
/// ```no_run
/// # async fn example(client: &zygote_client::Client) -> zygote_client::Result<()> {
/// use zygote_client::Sandbox;
///
/// let sandbox = Sandbox::new()
///     .ro_bind("/usr", "/usr")
///     .bind("/srv/work", "/work")
///     .tmpfs("/tmp")
///     .network_none()
///     .isolate()
///     .seccomp_profile("default");
/// let status = client.command("/usr/bin/make").sandbox(sandbox).status().await?;
/// # let _ = status;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    spec: SandboxSpec,
}

fn bytes(path: &Path) -> Vec<u8> {
    path.as_os_str().as_bytes().to_vec()
}

impl Sandbox {
    /// A sandbox that asks for nothing yet: the host's filesystem and
    /// network, no namespaces, no seccomp filter, no Landlock rules.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts from `name`, a profile of the zygote's policy file; what
    /// else is set here can only tighten it.
    pub fn profile(mut self, name: impl Into<String>) -> Self {
        self.spec.profile = Some(name.into());
        self
    }

    fn mount(mut self, kind: MountKind, source: &Path, destination: &Path) -> Self {
        self.spec
            .filesystem
            .get_or_insert_with(FilesystemSpec::default)
            .mounts
            .push(MountSpec {
                kind,
                source: bytes(source),
                destination: bytes(destination),
            });
        self
    }

    /// Binds host path `source` read-only at `destination`. The first
    /// mount gives the child a filesystem of its own: an empty, read-only
    /// tmpfs root with these mounts, in the order given, and a minimal
    /// `/dev`.
    pub fn ro_bind(self, source: impl AsRef<Path>, destination: impl AsRef<Path>) -> Self {
        self.mount(
            MountKind::ReadOnlyBind,
            source.as_ref(),
            destination.as_ref(),
        )
    }

    /// Binds host path `source` read-write at `destination`; see
    /// [`ro_bind`](Sandbox::ro_bind).
    pub fn bind(self, source: impl AsRef<Path>, destination: impl AsRef<Path>) -> Self {
        self.mount(MountKind::Bind, source.as_ref(), destination.as_ref())
    }

    /// Mounts a fresh tmpfs at `destination`; see
    /// [`ro_bind`](Sandbox::ro_bind).
    pub fn tmpfs(self, destination: impl AsRef<Path>) -> Self {
        self.mount(MountKind::Tmpfs, Path::new(""), destination.as_ref())
    }

    /// Gives the child an empty network namespace (loopback down).
    pub fn network_none(mut self) -> Self {
        self.spec.network = NetworkMode::None;
        self
    }

    /// New pid, ipc and uts namespaces.
    pub fn isolate(mut self) -> Self {
        self.spec.isolate = true;
        self
    }

    /// The hostname inside; needs [`isolate`](Sandbox::isolate).
    pub fn hostname(mut self, name: impl Into<String>) -> Self {
        self.spec.hostname = Some(name.into());
        self
    }

    /// Installs the named seccomp profile (`default`, `strict`, or one of
    /// the policy's) last before exec.
    pub fn seccomp_profile(mut self, name: impl Into<String>) -> Self {
        self.spec.seccomp = Some(SeccompSpec::Profile(name.into()));
        self
    }

    /// Installs a custom seccomp filter, given as the text of a filter
    /// file, last before exec.
    pub fn seccomp_filter(mut self, text: impl Into<String>) -> Self {
        self.spec.seccomp = Some(SeccompSpec::Filter(text.into()));
        self
    }

    fn landlock(&mut self) -> &mut LandlockSpec {
        self.spec.landlock.get_or_insert_with(LandlockSpec::default)
    }

    /// Landlock: the child may read `path` (and beneath it).
    pub fn landlock_ro(mut self, path: impl AsRef<Path>) -> Self {
        self.landlock().read_only.push(bytes(path.as_ref()));
        self
    }

    /// Landlock: the child may read and execute `path`.
    pub fn landlock_rx(mut self, path: impl AsRef<Path>) -> Self {
        self.landlock().read_execute.push(bytes(path.as_ref()));
        self
    }

    /// Landlock: the child may read and write `path`.
    pub fn landlock_rw(mut self, path: impl AsRef<Path>) -> Self {
        self.landlock().read_write.push(bytes(path.as_ref()));
        self
    }

    /// Landlock: the child may bind TCP `port`.
    pub fn tcp_bind(mut self, port: u16) -> Self {
        self.landlock().tcp_bind.push(port);
        self
    }

    /// Landlock: the child may connect to TCP `port`.
    pub fn tcp_connect(mut self, port: u16) -> Self {
        self.landlock().tcp_connect.push(port);
        self
    }

    /// With `true`, a spawn whose Landlock rules the kernel cannot all
    /// enforce is refused; with `false` (the default) they are enforced as
    /// far as the kernel can, and [`AppliedSandbox`](crate::AppliedSandbox)
    /// says whether all were.
    pub fn landlock_require(mut self, require: bool) -> Self {
        self.landlock().require = require;
        self
    }

    /// The request's field, checked: every path absolute.
    pub(crate) fn to_spec(&self) -> Result<SandboxSpec> {
        let absolute = |what: &str, path: &[u8]| {
            if path.first() == Some(&b'/') {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "sandbox: the {what} {:?} is not an absolute path",
                    String::from_utf8_lossy(path)
                )))
            }
        };
        if let Some(filesystem) = &self.spec.filesystem {
            for mount in &filesystem.mounts {
                if mount.kind != MountKind::Tmpfs {
                    absolute("mount source", &mount.source)?;
                }
                absolute("mount destination", &mount.destination)?;
            }
        }
        if let Some(landlock) = &self.spec.landlock {
            let lists = [
                ("Landlock read-only path", &landlock.read_only),
                ("Landlock read-execute path", &landlock.read_execute),
                ("Landlock read-write path", &landlock.read_write),
            ];
            for (what, paths) in lists {
                for path in paths {
                    absolute(what, path)?;
                }
            }
        }
        Ok(self.spec.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_fills_the_wire_fields_in_order() {
        let spec = Sandbox::new()
            .profile("build")
            .ro_bind("/usr", "/usr")
            .bind("/srv/work", "/work")
            .tmpfs("/tmp")
            .network_none()
            .isolate()
            .hostname("box")
            .seccomp_profile("default")
            .landlock_ro("/usr")
            .landlock_rx("/usr/bin")
            .landlock_rw("/work")
            .tcp_bind(8080)
            .tcp_connect(443)
            .landlock_require(true)
            .to_spec()
            .expect("absolute paths");
        let mounts = &spec.filesystem.as_ref().expect("a filesystem").mounts;
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[1].kind, MountKind::Bind);
        assert_eq!(mounts[1].source, b"/srv/work");
        assert_eq!(mounts[1].destination, b"/work");
        assert_eq!(mounts[2].kind, MountKind::Tmpfs);
        assert!(mounts[2].source.is_empty());
        assert_eq!(spec.network, NetworkMode::None);
        assert!(spec.isolate);
        assert_eq!(spec.hostname.as_deref(), Some("box"));
        assert_eq!(spec.seccomp, Some(SeccompSpec::Profile("default".into())));
        let landlock = spec.landlock.expect("landlock");
        assert_eq!(landlock.read_execute, [b"/usr/bin".to_vec()]);
        assert_eq!(
            (landlock.tcp_bind, landlock.tcp_connect),
            (vec![8080], vec![443])
        );
        assert!(landlock.require);
        let filter = Sandbox::new()
            .seccomp_filter("deny ptrace\n")
            .to_spec()
            .unwrap();
        assert_eq!(
            filter.seccomp,
            Some(SeccompSpec::Filter("deny ptrace\n".into()))
        );
        assert_eq!(filter.filesystem, None, "no mount: the host's filesystem");
    }

    #[test]
    fn relative_paths_are_refused_by_name() {
        let refused = |sandbox: Sandbox, needle: &str| {
            let error = sandbox.to_spec().expect_err("a relative path");
            assert!(matches!(error, Error::InvalidInput { .. }), "{error}");
            assert!(error.to_string().contains(needle), "{error}");
        };
        refused(
            Sandbox::new().ro_bind("usr", "/usr"),
            "mount source \"usr\"",
        );
        refused(
            Sandbox::new().bind("/srv", "work"),
            "mount destination \"work\"",
        );
        refused(Sandbox::new().tmpfs("tmp"), "mount destination \"tmp\"");
        refused(
            Sandbox::new().landlock_rw("./out"),
            "read-write path \"./out\"",
        );
        refused(Sandbox::new().landlock_ro(""), "read-only path \"\"");
    }
}
