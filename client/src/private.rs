//! Launching a private zygote: the `zygote` binary, started by this
//! process over a socketpair, serving only this process.
//!
//! The binary is looked up in [`BINARY_ENV`] (`ZYGOTE_BIN`), then next to
//! the current executable, then on `PATH`. It is started with
//! `std::process::Command` (at program start this process is still small,
//! so how it is started does not matter) with the zygote's end of the
//! socketpair as its stdin: std moves it there in the child, so no other
//! fd of this process is ever made inheritable, not even for a moment.
//! The zygote then moves the socket off fd 0, puts `/dev/null` there, and
//! closes every other fd it may have inherited. It writes to this
//! program's stderr, warnings only unless `ZYGOTE_LOG` or `RUST_LOG` says
//! otherwise.
//!
//! The zygote exits once this process's end of the socket closes (the last
//! [`Client`](crate::Client) handle and child are dropped, or the process
//! dies) and it has reaped its children. Until this process reaps it, an
//! exited zygote stays a zombie, as any child would.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use std::os::fd::OwnedFd;

use crate::{Error, Result};

/// The environment variable naming the `zygote` binary to launch.
pub const BINARY_ENV: &str = "ZYGOTE_BIN";

/// The zygote's log filter variable.
const LOG_ENV: &str = "ZYGOTE_LOG";

/// The binary's file name, next to the executable and on `PATH`.
const BINARY_NAME: &str = "zygote";

/// Where [`find_binary`] looks, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SearchPlaces {
    /// `$ZYGOTE_BIN`, if set and not empty.
    pub env: Option<PathBuf>,
    /// The directory of the current executable, if known.
    pub exe_dir: Option<PathBuf>,
    /// `$PATH`, if set.
    pub path: Option<OsString>,
}

impl SearchPlaces {
    fn from_process() -> Self {
        Self {
            env: std::env::var_os(BINARY_ENV)
                .filter(|value| !value.is_empty())
                .map(PathBuf::from),
            exe_dir: std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(Path::to_path_buf)),
            path: std::env::var_os("PATH"),
        }
    }

    /// The first executable file found, in the order of the module doc.
    pub(crate) fn find(&self) -> Result<PathBuf> {
        let candidates = self
            .env
            .iter()
            .cloned()
            .chain(self.exe_dir.iter().map(|dir| dir.join(BINARY_NAME)))
            .chain(
                self.path
                    .iter()
                    .flat_map(std::env::split_paths)
                    .filter(|dir| !dir.as_os_str().is_empty())
                    .map(|dir| dir.join(BINARY_NAME)),
            );
        for candidate in candidates {
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
        Err(Error::ZygoteNotFound {
            env: self.env.clone(),
            exe_dir: self.exe_dir.clone(),
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The `zygote` binary a private zygote would be launched from.
///
/// # Errors
///
/// [`Error::ZygoteNotFound`], naming the three places searched.
pub fn find_binary() -> Result<PathBuf> {
    SearchPlaces::from_process().find()
}

/// Starts `zygote serve --private-fd 0` on a new socketpair and returns
/// our end and the zygote's process.
pub(crate) fn launch() -> Result<(OwnedFd, std::process::Child)> {
    let binary = find_binary()?;
    let (ours, theirs) = zygote_proto::socket::pair(false)
        .map_err(|error| Error::proto("creating the private zygote's socketpair", error))?;
    let mut command = std::process::Command::new(&binary);
    command
        .args(["serve", "--private-fd", "0"])
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null());
    // It shares this program's stderr: only warnings, unless asked.
    if std::env::var_os(LOG_ENV).is_none() && std::env::var_os("RUST_LOG").is_none() {
        command.env(LOG_ENV, "warn");
    }
    let child = command.spawn().map_err(|source| Error::Launch {
        binary: binary.clone(),
        source,
    })?;
    Ok((ours, child))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(env: Option<&Path>, exe_dir: Option<&Path>, path: Option<&str>) -> SearchPlaces {
        SearchPlaces {
            env: env.map(Path::to_path_buf),
            exe_dir: exe_dir.map(Path::to_path_buf),
            path: path.map(OsString::from),
        }
    }

    fn fake_binary(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(BINARY_NAME);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn search_order_is_env_then_exe_dir_then_path() {
        let [a, b, c] = [(); 3].map(|()| tempfile::tempdir().unwrap());
        let env_bin = fake_binary(a.path());
        let exe_bin = fake_binary(b.path());
        let path_bin = fake_binary(c.path());
        let path_var = format!("/nonexistent:{}", c.path().display());
        let all = places(Some(&env_bin), Some(b.path()), Some(&path_var));
        assert_eq!(all.find().unwrap(), env_bin);
        let no_env = places(None, Some(b.path()), Some(&path_var));
        assert_eq!(no_env.find().unwrap(), exe_bin);
        let path_only = places(
            Some(Path::new("/nonexistent/zygote")),
            None,
            Some(&path_var),
        );
        assert_eq!(path_only.find().unwrap(), path_bin);
    }

    #[test]
    fn not_found_names_all_three_places() {
        let error = places(
            Some(Path::new("/nonexistent/zygote")),
            Some(Path::new("/nowhere/bin")),
            Some("/nonexistent"),
        )
        .find()
        .unwrap_err();
        let text = error.to_string();
        for needle in [
            "ZYGOTE_BIN",
            "/nonexistent/zygote",
            "/nowhere/bin/zygote",
            "PATH",
        ] {
            assert!(text.contains(needle), "{needle} missing from: {text}");
        }
        let unset = places(None, None, None).find().unwrap_err().to_string();
        assert!(unset.contains("ZYGOTE_BIN is not set"), "{unset}");
    }
}
