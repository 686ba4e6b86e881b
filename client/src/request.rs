//! Turning a command's settings plus the caller's own state into a
//! [`SpawnRequest`] and the list of fds to attach to it. Pure: no socket,
//! no runtime, so it is tested directly.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::fs::{MemfdFlags, SealFlags, fcntl_add_seals, memfd_create};
use zygote_proto::{
    CgroupSpec, Env, FdMapping, KillOnClose, LargeArgs, PtySpec, SpawnRequest, StdioSpec, Timeout,
    UserSpec, WindowSize,
};

use crate::stdio::StdioKind;
use crate::transparent::Snapshot;
use crate::{Error, Result, Stdio};

/// Everything a [`Command`](crate::Command) records, apart from its client.
#[derive(Debug)]
pub(crate) struct Spec {
    pub program: OsString,
    pub argv0: Option<OsString>,
    pub args: Vec<OsString>,
    /// Start from an empty environment instead of the caller's.
    pub env_clear: bool,
    /// Changes to the environment: `None` removes the variable.
    pub env: BTreeMap<OsString, Option<OsString>>,
    pub cwd: Option<PathBuf>,
    /// `None`: the default of the method that spawns.
    pub stdio: [Option<Stdio>; 3],
    /// Extra fds by their number in the child.
    pub fds: BTreeMap<RawFd, OwnedFd>,
    pub inherit_fds: bool,
    pub process_group: Option<i32>,
    pub setsid: bool,
    pub umask: Option<u32>,
    /// `uid`, `gid` and `groups` as set; unset parts default at spawn.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Option<Vec<u32>>,
    pub kill_on_close: Option<KillOnClose>,
    /// Also SIGKILL the child when its `Child` is dropped.
    pub kill_on_drop: bool,
    pub timeout: Option<Duration>,
    pub timeout_grace: Duration,
    /// A pseudo-terminal of this size on the child's stdio.
    pub pty: Option<WindowSize>,
    pub report_stops: bool,
    /// The child's cgroup: limits, whole-tree kill and wait.
    pub cgroup: Option<CgroupSpec>,
    /// Confinement for the child.
    pub sandbox: Option<crate::Sandbox>,
}

/// Grace period between a timeout's SIGTERM and SIGKILL, unless set.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Stdio defaults: `spawn` and `status` inherit all three streams;
/// `output` gives the child `/dev/null` for stdin and pipes for the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StdioDefaults {
    Inherit,
    Output,
}

/// A request ready to send, with the fds it refers to, borrowed from the
/// command, the snapshot, or the process's own stdio.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    pub request: SpawnRequest,
    pub fds: Vec<BorrowedFd<'a>>,
    /// Which of stdin, stdout, stderr will come back as pipes.
    pub piped: [bool; 3],
}

impl Spec {
    pub fn new(program: &OsStr) -> Self {
        Self {
            program: program.to_owned(),
            argv0: None,
            args: Vec::new(),
            env_clear: false,
            env: BTreeMap::new(),
            cwd: None,
            stdio: [None, None, None],
            fds: BTreeMap::new(),
            inherit_fds: false,
            process_group: None,
            setsid: false,
            umask: None,
            uid: None,
            gid: None,
            groups: None,
            kill_on_close: None,
            kill_on_drop: false,
            timeout: None,
            timeout_grace: DEFAULT_GRACE,
            pty: None,
            report_stops: false,
            cgroup: None,
            sandbox: None,
        }
    }

    /// The request's `user`: `None` (the peer's own ids) unless one of
    /// `uid`, `gid`, `groups` was set; unset parts are this process's, except
    /// that a set uid drops the supplementary groups, as std does.
    fn user(&self) -> Option<UserSpec> {
        if self.uid.is_none() && self.gid.is_none() && self.groups.is_none() {
            return None;
        }
        let groups = match (&self.groups, self.uid) {
            (Some(groups), _) => groups.clone(),
            (None, Some(_)) => Vec::new(),
            (None, None) => rustix::process::getgroups()
                .map(|groups| groups.into_iter().map(|gid| gid.as_raw()).collect())
                .unwrap_or_default(),
        };
        Some(UserSpec {
            uid: self
                .uid
                .unwrap_or_else(|| rustix::process::geteuid().as_raw()),
            gid: self
                .gid
                .unwrap_or_else(|| rustix::process::getegid().as_raw()),
            groups,
        })
    }

    pub fn set_env(&mut self, key: &OsStr, value: &OsStr) {
        self.env.insert(key.to_owned(), Some(value.to_owned()));
    }

    pub fn remove_env(&mut self, key: &OsStr) {
        // After a clear there is nothing to remove, as in std.
        if self.env_clear {
            self.env.remove(key);
        } else {
            self.env.insert(key.to_owned(), None);
        }
    }

    pub fn clear_env(&mut self) {
        self.env_clear = true;
        self.env.clear();
    }

    /// The child's whole environment: the caller's (kept in its order)
    /// unless cleared, with this command's changes applied. Takes the
    /// caller's by value: copying every variable once more per spawn
    /// showed in the client's profile.
    fn environment(&self, base: Vec<(OsString, OsString)>) -> Vec<(OsString, OsString)> {
        let mut env = if self.env_clear { Vec::new() } else { base };
        for (key, change) in &self.env {
            let existing = env.iter().position(|(name, _)| name == key);
            match (change, existing) {
                (Some(value), Some(index)) => env[index].1 = value.clone(),
                (Some(value), None) => env.push((key.clone(), value.clone())),
                (None, Some(index)) => {
                    env.remove(index);
                }
                (None, None) => {}
            }
        }
        env
    }

    /// Builds the request for one spawn.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for NUL bytes or child
    /// fd numbers below 3; [`Error::Io`] when the caller's working
    /// directory is needed but unknown; [`Error::TooManyFds`] over
    /// `max_fds`.
    ///
    /// The snapshot's environment moves into the request: a snapshot
    /// serves one spawn.
    pub fn prepare<'a>(
        &'a self,
        snapshot: &'a Snapshot,
        defaults: StdioDefaults,
        max_fds: usize,
    ) -> Result<Prepared<'a>> {
        let program = bytes("program", &self.program)?;
        let argv0 = self
            .argv0
            .as_deref()
            .map(|arg| bytes("argv[0]", arg))
            .transpose()?;
        let args = self
            .args
            .iter()
            .map(|arg| bytes("argument", arg))
            .collect::<Result<Vec<_>>>()?;
        let vars = self.environment(snapshot.env.take());
        // Packed in one buffer sized once (see `Env`).
        let bytes = vars
            .iter()
            .map(|(key, value)| key.len() + value.len())
            .sum();
        let mut env = Env::with_capacity(vars.len(), bytes);
        for (key, value) in &vars {
            check_env_var(key, value)?;
            env.push(key.as_bytes(), value.as_bytes());
        }
        let cwd = self.working_directory(snapshot)?;

        let mut fds: Vec<BorrowedFd<'a>> = Vec::new();
        let mut attach = |fd: BorrowedFd<'a>| {
            fds.push(fd);
            u32::try_from(fds.len() - 1).expect("fd count is far below u32::MAX")
        };
        let mut specs = [StdioSpec::Null; 3];
        let mut piped = [false; 3];
        for (stream, stdio) in self.stdio.iter().enumerate() {
            if self.pty.is_some() {
                if stdio.is_some() {
                    return Err(Error::invalid(
                        "a pty is the child's stdin, stdout and stderr: do not set them as well",
                    ));
                }
                continue;
            }
            let kind = match (stdio, defaults) {
                (Some(stdio), _) => &stdio.0,
                (None, StdioDefaults::Inherit) => &StdioKind::Inherit,
                (None, StdioDefaults::Output) if stream == 0 => &StdioKind::Null,
                (None, StdioDefaults::Output) => &StdioKind::Piped,
            };
            specs[stream] = match kind {
                StdioKind::Inherit => match own_stdio(stream) {
                    Some(fd) => StdioSpec::Fd(attach(fd)),
                    None => StdioSpec::Null,
                },
                StdioKind::Null => StdioSpec::Null,
                StdioKind::Piped => {
                    piped[stream] = true;
                    StdioSpec::Pipe
                }
                StdioKind::Fd(fd) => StdioSpec::Fd(attach(fd.as_fd())),
            };
        }

        // Explicit mappings win over inherited fds of the same number.
        let mut mapped: BTreeMap<RawFd, BorrowedFd<'a>> = snapshot
            .inherited_fds
            .iter()
            .map(|(number, fd)| (*number, fd.as_fd()))
            .collect();
        for (&child_fd, fd) in &self.fds {
            if child_fd < 3 {
                return Err(Error::invalid(format!(
                    "child fd {child_fd} is stdio; set it with stdin/stdout/stderr, and map extra fds at 3 or above"
                )));
            }
            mapped.insert(child_fd, fd.as_fd());
        }
        let fd_mappings = mapped
            .into_iter()
            .map(|(child_fd, fd)| FdMapping {
                attached_index: attach(fd),
                child_fd,
            })
            .collect();

        if fds.len() > max_fds {
            return Err(Error::TooManyFds {
                count: fds.len(),
                limit: max_fds,
                inherited: self.inherit_fds,
            });
        }
        let request = SpawnRequest {
            id: 0,
            program,
            argv0,
            args,
            env,
            cwd: Some(cwd),
            stdin: specs[0],
            stdout: specs[1],
            stderr: specs[2],
            fd_mappings,
            new_session: self.setsid,
            process_group: self.process_group,
            umask: self.umask.or(snapshot.settings.umask),
            rlimits: snapshot.settings.rlimits.clone(),
            user: self.user(),
            kill_on_close: self.kill_on_close,
            timeout: self.timeout.map(|limit| Timeout {
                millis: millis(limit).max(1),
                grace_millis: millis(self.timeout_grace),
            }),
            pty: self.pty.map(|window| PtySpec { window }),
            report_stops: self.report_stops,
            cgroup: self.cgroup,
            ignored_signals: snapshot.settings.attributes.ignored_signals,
            nice: snapshot.settings.attributes.nice,
            cpu_affinity: snapshot.settings.attributes.cpu_affinity.clone(),
            oom_score_adj: snapshot.settings.attributes.oom_score_adj,
            large_args: None,
            defer_spawned: false,
            sandbox: self
                .sandbox
                .as_ref()
                .map(crate::Sandbox::to_spec)
                .transpose()?,
        };
        Ok(Prepared {
            request,
            fds,
            piped,
        })
    }

    /// The child's working directory, always absolute: the one set (joined
    /// onto the caller's when relative) or the caller's own.
    fn working_directory(&self, snapshot: &Snapshot) -> Result<Vec<u8>> {
        const WHAT: &str = "working directory";
        if let Some(dir) = &self.cwd
            && dir.is_absolute()
        {
            return bytes(WHAT, dir.as_os_str());
        }
        let own = snapshot.cwd.as_ref().map_err(|error| {
            Error::io(
                "reading the current directory (the child starts in the caller's)",
                copy_io_error(error),
            )
        })?;
        match &self.cwd {
            Some(relative) => bytes(WHAT, own.join(relative).as_os_str()),
            // Copied once, into the request.
            None => bytes(WHAT, own.as_os_str()),
        }
    }
}

impl<'a> Prepared<'a> {
    /// Attaches the [`LargeArgs`] memfd and names it in the request.
    ///
    /// # Errors
    ///
    /// [`Error::TooManyFds`] over `max_fds`.
    pub fn attach(&mut self, memfd: BorrowedFd<'a>, max_fds: usize) -> Result<()> {
        if self.fds.len() >= max_fds {
            return Err(Error::TooManyFds {
                count: self.fds.len() + 1,
                limit: max_fds,
                inherited: false,
            });
        }
        self.request.large_args =
            Some(u32::try_from(self.fds.len()).expect("fd count is far below u32::MAX"));
        self.fds.push(memfd);
        Ok(())
    }
}

/// Room kept in a frame for the request's other fields when deciding
/// whether its argv and environment fit.
const FRAME_HEADROOM: usize = 16 * 1024;

/// When `request` would not fit in a frame of `frame_limit` bytes, moves
/// its arguments and environment into a sealed memfd (see
/// [`LargeArgs`]) and returns the memfd to attach; the daemon's own
/// argv/env limit still applies.
///
/// # Errors
///
/// [`Error::Io`] when the memfd cannot be made.
pub(crate) fn move_large_args(
    request: &mut SpawnRequest,
    frame_limit: usize,
) -> Result<Option<OwnedFd>> {
    // An upper bound of the encoded size: each length takes at most 5
    // bytes. Most requests are far below and skip the encoding.
    let strings = request
        .args
        .iter()
        .map(|arg| arg.len() + 5)
        .chain(
            request
                .env
                .iter()
                .map(|(key, value)| key.len() + value.len() + 10),
        )
        .sum::<usize>();
    if strings + FRAME_HEADROOM <= frame_limit {
        return Ok(None);
    }
    let large = LargeArgs {
        args: std::mem::take(&mut request.args),
        env: std::mem::take(&mut request.env),
    };
    let bytes = zygote_proto::encode(&large)
        .map_err(|error| Error::io("encoding a large argument list", io::Error::other(error)))?;
    let fail = |op: &str, errno: rustix::io::Errno| Error::io(op, io::Error::from(errno));
    let memfd = memfd_create(
        "zygote-args",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|errno| fail("creating a memfd for a large argument list", errno))?;
    let mut file = std::fs::File::from(memfd);
    std::io::Write::write_all(&mut file, &bytes)
        .map_err(|error| Error::io("writing a large argument list to a memfd", error))?;
    let memfd = OwnedFd::from(file);
    fcntl_add_seals(
        &memfd,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )
    .map_err(|errno| fail("sealing the large argument list's memfd", errno))?;
    Ok(Some(memfd))
}

/// Set once a request failed because one of this process's fds 0 to 2
/// was closed. Until then they are assumed open (std opens `/dev/null` in
/// place of a closed one at start), which saves three `fcntl` per spawn;
/// from then on each spawn checks them.
static STDIO_MAY_BE_CLOSED: AtomicBool = AtomicBool::new(false);

/// The calling process's fd 0, 1 or 2, when it is open (see
/// [`STDIO_MAY_BE_CLOSED`]).
fn own_stdio(stream: usize) -> Option<BorrowedFd<'static>> {
    let fd = match stream {
        0 => rustix::stdio::stdin(),
        1 => rustix::stdio::stdout(),
        _ => rustix::stdio::stderr(),
    };
    if !STDIO_MAY_BE_CLOSED.load(Ordering::Relaxed) {
        return Some(fd);
    }
    rustix::io::fcntl_getfd(fd).ok().map(|_| fd)
}

/// Whether a request that failed with `error` should be prepared and sent
/// again (once), checking this process's stdio from now on: `EBADF` from
/// sending. Every other fd a request attaches is owned, so only a closed
/// fd 0 to 2 makes `sendmsg` fail so. Concurrent spawns that failed
/// together each retry.
pub(crate) fn retry_with_checked_stdio(error: &Error) -> bool {
    // `Io` only: a `Spawn` error's errno is the zygote's, after it acted.
    let Error::Io { source, .. } = error else {
        return false;
    };
    if source.raw_os_error() != Some(libc::EBADF) {
        return false;
    }
    STDIO_MAY_BE_CLOSED.store(true, Ordering::Relaxed);
    true
}

fn bytes(what: &str, value: &OsStr) -> Result<Vec<u8>> {
    no_nul(what, value)?;
    Ok(value.as_bytes().to_vec())
}

/// Checks without copying, for strings the request takes by value.
fn no_nul(what: &str, value: &OsStr) -> Result<()> {
    if value.as_bytes().contains(&0) {
        return Err(Error::invalid(format!(
            "{what} {value:?} contains a NUL byte"
        )));
    }
    Ok(())
}

/// Only a NUL is refused, as `std::process::Command` does: an empty key or
/// one with `=` (inherited `=A=B` is key `=A` to `std::env::vars_os`)
/// reaches the child as `KEY=VALUE`.
fn check_env_var(key: &OsStr, value: &OsStr) -> Result<()> {
    no_nul("environment variable", key)?;
    no_nul("environment value", value)
}

fn copy_io_error(error: &io::Error) -> io::Error {
    match error.raw_os_error() {
        Some(errno) => io::Error::from_raw_os_error(errno),
        None => io::Error::new(error.kind(), error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;

    use zygote_proto::ResourceLimit;

    use super::*;
    use std::sync::Arc;

    use crate::transparent::{Attributes, ProcessSettings};

    fn snapshot() -> Snapshot {
        Snapshot {
            env: RefCell::new(vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("HOME".into(), "/home/u".into()),
                ("LANG".into(), "C".into()),
            ]),
            cwd: Ok(PathBuf::from("/srv/work")),
            settings: Arc::new(ProcessSettings {
                umask: Some(0o027),
                rlimits: vec![ResourceLimit {
                    resource: 7,
                    soft: 1024,
                    hard: u64::MAX,
                }],
                attributes: Attributes {
                    ignored_signals: 1,
                    nice: Some(7),
                    cpu_affinity: vec![0],
                    oom_score_adj: Some(300),
                },
            }),
            inherited_fds: Vec::new(),
        }
    }

    fn env_of(request: &SpawnRequest) -> Vec<(&[u8], &[u8])> {
        request.env.iter().collect()
    }

    #[test]
    fn transparent_defaults() {
        let spec = Spec::new(OsStr::new("ls"));
        let snapshot = snapshot();
        let prepared = spec.prepare(&snapshot, StdioDefaults::Output, 64).unwrap();
        let request = &prepared.request;
        assert_eq!(request.program, b"ls");
        assert_eq!(request.argv0, None);
        assert_eq!(
            env_of(request),
            [
                (&b"PATH"[..], &b"/usr/bin:/bin"[..]),
                (b"HOME", b"/home/u"),
                (b"LANG", b"C")
            ]
        );
        assert_eq!(request.cwd.as_deref(), Some(&b"/srv/work"[..]));
        assert_eq!(request.umask, Some(0o027));
        assert_eq!(request.rlimits, snapshot.settings.rlimits);
        assert_eq!(
            (
                request.ignored_signals,
                request.nice,
                &request.cpu_affinity[..],
                request.oom_score_adj
            ),
            (1, Some(7), &[0][..], Some(300))
        );
        assert_eq!(
            [request.stdin, request.stdout, request.stderr],
            [StdioSpec::Null, StdioSpec::Pipe, StdioSpec::Pipe]
        );
        assert_eq!(prepared.piped, [false, true, true]);
        assert!(prepared.fds.is_empty());
        assert!(!request.new_session);
        assert_eq!(request.user, None);
        assert_eq!(request.kill_on_close, None);
        assert_eq!(request.timeout, None);
    }

    #[test]
    fn user_lifetime_and_timeout_are_carried() {
        let mut spec = Spec::new(OsStr::new("ls"));
        spec.uid = Some(65534);
        spec.kill_on_close = Some(KillOnClose {
            signal: 15,
            process_group: false,
        });
        spec.timeout = Some(Duration::from_micros(1500));
        let snapshot = snapshot();
        let request = spec
            .prepare(&snapshot, StdioDefaults::Output, 64)
            .unwrap()
            .request;
        let user = request.user.expect("uid set");
        // A set uid drops the groups, as std does; the gid stays ours.
        assert_eq!(
            (user.uid, user.gid, user.groups),
            (65534, rustix::process::getegid().as_raw(), vec![])
        );
        assert_eq!(request.kill_on_close.unwrap().signal, 15);
        // Rounded down to 1 ms, never 0; the default grace is 5 s.
        assert_eq!(
            request.timeout,
            Some(Timeout {
                millis: 1,
                grace_millis: 5000
            })
        );
    }

    #[test]
    fn env_changes_apply_like_std() {
        let snapshot = snapshot();
        let mut spec = Spec::new(OsStr::new("env"));
        spec.set_env(OsStr::new("LANG"), OsStr::new("fr_FR.UTF-8"));
        spec.remove_env(OsStr::new("HOME"));
        spec.set_env(OsStr::new("NEW"), OsStr::from_bytes(b"\xff\xfe"));
        spec.remove_env(OsStr::new("ABSENT"));
        let prepared = spec.prepare(&snapshot, StdioDefaults::Inherit, 64).unwrap();
        assert_eq!(
            env_of(&prepared.request),
            [
                (&b"PATH"[..], &b"/usr/bin:/bin"[..]),
                (b"LANG", b"fr_FR.UTF-8"),
                (b"NEW", b"\xff\xfe")
            ]
        );

        // A clear drops the caller's variables and earlier changes; later
        // changes still apply.
        spec.clear_env();
        spec.set_env(OsStr::new("ONLY"), OsStr::new("1"));
        spec.remove_env(OsStr::new("PATH"));
        let prepared = spec.prepare(&snapshot, StdioDefaults::Inherit, 64).unwrap();
        assert_eq!(env_of(&prepared.request), [(&b"ONLY"[..], &b"1"[..])]);
    }

    #[test]
    fn relative_cwd_joins_the_callers() {
        let snapshot = snapshot();
        let mut spec = Spec::new(OsStr::new("pwd"));
        spec.cwd = Some("sub/dir".into());
        let prepared = spec.prepare(&snapshot, StdioDefaults::Inherit, 64).unwrap();
        assert_eq!(
            prepared.request.cwd.as_deref(),
            Some(&b"/srv/work/sub/dir"[..])
        );

        spec.cwd = Some("/abs".into());
        let unknown = Snapshot {
            cwd: Err(io::Error::from_raw_os_error(libc::ENOENT)),
            ..snapshot
        };
        // An absolute directory does not need the caller's.
        let prepared = spec.prepare(&unknown, StdioDefaults::Inherit, 64).unwrap();
        assert_eq!(prepared.request.cwd.as_deref(), Some(&b"/abs"[..]));
        spec.cwd = None;
        let error = spec
            .prepare(&unknown, StdioDefaults::Inherit, 64)
            .unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOENT), "{error}");
    }

    #[test]
    fn non_utf8_args_and_argv0_pass_through() {
        let snapshot = snapshot();
        let mut spec = Spec::new(OsStr::from_bytes(b"/bin/\xe9cho"));
        spec.argv0 = Some(OsStr::from_bytes(b"\xffzero").to_owned());
        spec.args = vec![OsStr::from_bytes(b"a\x80b").to_owned(), OsString::new()];
        let prepared = spec.prepare(&snapshot, StdioDefaults::Inherit, 64).unwrap();
        assert_eq!(prepared.request.program, b"/bin/\xe9cho");
        assert_eq!(prepared.request.argv0.as_deref(), Some(&b"\xffzero"[..]));
        assert_eq!(prepared.request.args, [b"a\x80b".to_vec(), Vec::new()]);
    }

    /// As `std::process::Command`: names that are empty or hold `=`, set
    /// or inherited, go to the child as `KEY=VALUE`.
    #[test]
    fn odd_names_are_sent_as_std_sends_them() {
        let snapshot = snapshot();
        snapshot.env.borrow_mut().push(("=A".into(), "B".into()));
        let mut spec = Spec::new(OsStr::new("x"));
        spec.set_env(OsStr::new("C=D"), OsStr::new("e"));
        spec.set_env(OsStr::new(""), OsStr::new("f"));
        let prepared = spec.prepare(&snapshot, StdioDefaults::Inherit, 64).unwrap();
        let entries: Vec<_> = prepared.request.env.entries().collect();
        assert_eq!(
            entries[3..],
            [&b"=A=B\0"[..], b"=f\0", b"C=D=e\0"],
            "{entries:?}"
        );
    }

    #[test]
    fn rejects_nul_and_low_fds() {
        let snapshot = snapshot();
        let mut spec = Spec::new(OsStr::new("x"));
        spec.args = vec![OsStr::from_bytes(b"a\0b").to_owned()];
        let error = spec
            .prepare(&snapshot, StdioDefaults::Inherit, 64)
            .unwrap_err();
        assert!(matches!(error, Error::InvalidInput { .. }), "{error}");

        let mut spec = Spec::new(OsStr::new("x"));
        spec.set_env(OsStr::new("A"), OsStr::from_bytes(b"1\0"));
        assert!(spec.prepare(&snapshot, StdioDefaults::Inherit, 64).is_err());

        let mut spec = Spec::new(OsStr::new("x"));
        spec.fds
            .insert(2, std::fs::File::open("/dev/null").unwrap().into());
        let error = spec
            .prepare(&snapshot, StdioDefaults::Inherit, 64)
            .unwrap_err();
        assert!(error.to_string().contains("child fd 2"), "{error}");
    }

    #[test]
    fn stdio_and_mapped_fds_are_attached_in_order() {
        let file = |path: &str| std::fs::File::open(path).unwrap();
        let stdin_file = file("/dev/null");
        let stdin_raw = stdin_file.as_raw_fd();
        let five = OwnedFd::from(file("/dev/zero"));
        let five_raw = five.as_raw_fd();
        let four = OwnedFd::from(file("/dev/zero"));
        let four_raw = four.as_raw_fd();
        let inherited_four = OwnedFd::from(file("/dev/null"));
        let inherited_nine = OwnedFd::from(file("/dev/null"));
        let nine_raw = inherited_nine.as_raw_fd();

        let mut spec = Spec::new(OsStr::new("cat"));
        spec.stdio = [
            Some(Stdio::from(stdin_file)),
            Some(Stdio::piped()),
            Some(Stdio::null()),
        ];
        spec.fds.insert(5, five);
        spec.fds.insert(4, four);
        spec.setsid = true;
        spec.process_group = Some(0);
        spec.umask = Some(0o077);
        let snapshot = Snapshot {
            inherited_fds: vec![(4, inherited_four), (9, inherited_nine)],
            ..snapshot()
        };
        let prepared = spec.prepare(&snapshot, StdioDefaults::Inherit, 64).unwrap();
        let request = &prepared.request;
        assert_eq!(
            [request.stdin, request.stdout, request.stderr],
            [StdioSpec::Fd(0), StdioSpec::Pipe, StdioSpec::Null]
        );
        assert_eq!(prepared.piped, [false, true, false]);
        let raw: Vec<RawFd> = prepared.fds.iter().map(AsRawFd::as_raw_fd).collect();
        // stdin's fd, then mappings by child number; the explicit fd 4 wins
        // over the inherited one.
        assert_eq!(raw, [stdin_raw, four_raw, five_raw, nine_raw]);
        assert_eq!(
            request.fd_mappings,
            [
                FdMapping {
                    attached_index: 1,
                    child_fd: 4
                },
                FdMapping {
                    attached_index: 2,
                    child_fd: 5
                },
                FdMapping {
                    attached_index: 3,
                    child_fd: 9
                },
            ]
        );
        assert!(request.new_session);
        assert_eq!(request.process_group, Some(0));
        assert_eq!(request.umask, Some(0o077));

        let error = spec
            .prepare(&snapshot, StdioDefaults::Inherit, 3)
            .unwrap_err();
        assert!(
            matches!(
                error,
                Error::TooManyFds {
                    count: 4,
                    limit: 3,
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn inherit_borrows_own_stdio() {
        let spec = Spec::new(OsStr::new("true"));
        let snapshot = snapshot();
        let prepared = spec.prepare(&snapshot, StdioDefaults::Inherit, 64).unwrap();
        // The test harness has its fds 0 to 2 open.
        let raw: Vec<RawFd> = prepared.fds.iter().map(AsRawFd::as_raw_fd).collect();
        assert_eq!(raw, [0, 1, 2]);
        assert_eq!(
            [
                prepared.request.stdin,
                prepared.request.stdout,
                prepared.request.stderr
            ],
            [StdioSpec::Fd(0), StdioSpec::Fd(1), StdioSpec::Fd(2)]
        );
    }
}
