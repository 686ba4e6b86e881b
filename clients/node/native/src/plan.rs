//! Turning what JavaScript asked for into a checked plan with its fds
//! ready, on the JavaScript thread, before anything is sent.

use std::ffi::OsString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::time::Duration;

use napi_derive::napi;
use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
use zygote_client::{Client, Command, Feature, Sandbox, Stdio};

use crate::sys::dup_cloexec;

/// One entry of the `stdio` option, normalised by `lib/options.js`.
#[napi(object)]
pub struct StdioSpec {
    /// `"pipe"`, `"ignore"`, `"inherit"` or `"fd"`.
    pub kind: String,
    /// For `"fd"`: the parent's fd to give the child.
    pub fd: Option<i32>,
}

/// A spawn call, validated and normalised by `lib/options.js`.
#[napi(object)]
pub struct SpawnSpec {
    /// The program, looked up in `PATH` when it has no slash.
    pub file: String,
    /// The whole argv, argv[0] included.
    pub args: Vec<String>,
    /// The child gets this process's environment, read here, on the JS
    /// thread (the one that changes it), instead of `env_keys`. Reading
    /// `environ` once in Rust costs a few µs; walking `process.env` from
    /// JavaScript costs ~70 µs.
    pub inherit_env: bool,
    /// Environment names, in order; the child gets exactly these.
    pub env_keys: Vec<String>,
    /// Environment values, matching `env_keys`.
    pub env_values: Vec<String>,
    /// The working directory, or this process's.
    pub cwd: Option<String>,
    /// One entry per child fd, from 0.
    pub stdio: Vec<StdioSpec>,
    /// A new session (`setsid`), as Node's `detached`.
    pub detached: bool,
    /// `setuid` in the child.
    pub uid: Option<u32>,
    /// `setgid` in the child.
    pub gid: Option<u32>,
    /// The signal the zygote sends the child when this process's
    /// connection closes.
    pub kill_on_close: Option<i32>,
    /// The zygote's own timeout, in milliseconds.
    pub timeout_ms: Option<u32>,
    /// cgroup `memory.max`, in bytes.
    pub memory_max: Option<i64>,
    /// cgroup `pids.max`.
    pub pids_max: Option<u32>,
    /// The sandbox, checked by `lib/sandbox.js`.
    pub sandbox: Option<SandboxPlan>,
    /// The template (its key from `python_template`) whose child this
    /// is; `args[1..]` are then its Python arguments and `file` only
    /// names it.
    pub template: Option<u32>,
}

/// The `sandbox` option, checked and normalised by `lib/sandbox.js`.
#[napi(object)]
pub struct SandboxPlan {
    /// A profile of the daemon's policy.
    pub profile: Option<String>,
    /// The filesystem view; `None` keeps the host's.
    pub mounts: Option<Vec<MountPlan>>,
    /// An empty network namespace instead of the host's network.
    pub network_none: bool,
    /// New pid, ipc and uts namespaces.
    pub isolate: bool,
    /// The hostname inside.
    pub hostname: Option<String>,
    /// A seccomp profile name.
    pub seccomp: Option<String>,
    /// A custom seccomp filter's text.
    pub seccomp_filter: Option<String>,
    /// Landlock rules.
    pub landlock: Option<LandlockPlan>,
}

/// One mount of [`SandboxPlan::mounts`].
#[napi(object)]
pub struct MountPlan {
    /// `"ro"`, `"rw"` or `"tmpfs"`.
    pub kind: String,
    /// The host path; `None` for `"tmpfs"`.
    pub source: Option<String>,
    /// The path inside.
    pub destination: String,
}

/// [`SandboxPlan::landlock`].
#[napi(object)]
pub struct LandlockPlan {
    /// Paths readable.
    pub read_only: Vec<String>,
    /// Paths readable and executable.
    pub read_execute: Vec<String>,
    /// Paths readable and writable.
    pub read_write: Vec<String>,
    /// TCP ports the child may bind.
    pub tcp_bind: Vec<u32>,
    /// TCP ports the child may connect to.
    pub tcp_connect: Vec<u32>,
    /// Refuse the spawn when the kernel cannot enforce every rule.
    pub require: bool,
}

/// What the child gets at one fd.
enum ChildFd {
    Null,
    Inherit,
    Fd(OwnedFd),
}

/// A spawn with its fds made: what the runtime thread sends.
pub struct Plan {
    spec: SpawnSpec,
    env: Vec<(OsString, OsString)>,
    fds: Vec<Option<ChildFd>>,
}

/// Builds the plan and returns it with the parent's ends of the pipes
/// (`None` where a stdio entry has none).
///
/// # Errors
///
/// When a socketpair cannot be made or an fd given is not open.
pub fn prepare(mut spec: SpawnSpec) -> io::Result<(Plan, Vec<Option<OwnedFd>>)> {
    let mut fds = Vec::with_capacity(spec.stdio.len());
    let mut parents = Vec::with_capacity(spec.stdio.len());
    for (index, entry) in spec.stdio.iter().enumerate() {
        let (child, parent) = match entry.kind.as_str() {
            "pipe" => {
                let (parent, child) = socketpair(
                    AddressFamily::UNIX,
                    SocketType::STREAM,
                    SocketFlags::CLOEXEC,
                    None,
                )?;
                (Some(ChildFd::Fd(child)), Some(parent))
            }
            "ignore" if index < 3 => (Some(ChildFd::Null), None),
            "ignore" => (None, None),
            "inherit" if index < 3 => (Some(ChildFd::Inherit), None),
            "inherit" => (Some(ChildFd::Fd(dup_cloexec(fd_number(index)?)?)), None),
            "fd" => {
                let fd = entry.fd.ok_or_else(|| invalid("an fd entry without fd"))?;
                (Some(ChildFd::Fd(dup_cloexec(fd)?)), None)
            }
            other => return Err(invalid(&format!("unknown stdio kind {other}"))),
        };
        fds.push(child);
        parents.push(parent);
    }
    spec.stdio.clear();
    let env = if spec.inherit_env {
        std::env::vars_os().collect()
    } else {
        let keys = std::mem::take(&mut spec.env_keys)
            .into_iter()
            .map(OsString::from);
        let values = std::mem::take(&mut spec.env_values)
            .into_iter()
            .map(OsString::from);
        keys.zip(values).collect()
    };
    Ok((Plan { spec, env, fds }, parents))
}

fn fd_number(index: usize) -> io::Result<RawFd> {
    RawFd::try_from(index).map_err(|_| invalid("stdio index out of range"))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_owned())
}

/// A plan the zygote cannot be sent: its errno and what to say.
pub struct Refused {
    /// The errno JavaScript sees.
    pub errno: i32,
    /// The message, naming what was refused.
    pub message: String,
}

impl From<io::Error> for Refused {
    fn from(error: io::Error) -> Self {
        Self {
            errno: error.raw_os_error().unwrap_or(libc::EINVAL),
            message: error.to_string(),
        }
    }
}

impl Plan {
    /// The zygote command for this plan. The command holds the child's
    /// ends: drop it once spawned, so that the child alone keeps them.
    ///
    /// # Errors
    ///
    /// A value the request cannot carry, or a feature the zygote does not
    /// offer (`EOPNOTSUPP`).
    pub fn command(self, client: &Client) -> Result<Command, Refused> {
        let Plan { spec, env, fds } = self;
        let mut command = match spec.template {
            Some(key) => crate::template::template(key)
                .ok_or_else(|| Refused {
                    errno: libc::EINVAL,
                    message: format!("no template {key} in this process"),
                })?
                .command(spec.args.iter().skip(1)),
            None => {
                let mut command = Command::new(client, &spec.file);
                if let Some((arg0, rest)) = spec.args.split_first() {
                    command.arg0(arg0).args(rest);
                }
                command
            }
        };
        command.env_clear();
        command.envs(env);
        if let Some(cwd) = &spec.cwd {
            command.current_dir(cwd);
        }
        command.setsid(spec.detached);
        if let Some(uid) = spec.uid {
            command.uid(uid);
        }
        if let Some(gid) = spec.gid {
            command.gid(gid);
        }
        // libuv drops the supplementary groups whenever it changes a uid or gid.
        if spec.uid.is_some() || spec.gid.is_some() {
            command.groups(&[]);
        }
        if let Some(signal) = spec.kill_on_close {
            command.kill_on_close(signal);
        }
        if let Some(ms) = spec.timeout_ms {
            command.timeout(Duration::from_millis(u64::from(ms)));
        }
        if let Some(bytes) = spec.memory_max {
            let bytes = u64::try_from(bytes).map_err(|_| invalid("memoryMax below 0"))?;
            command.memory_max(bytes);
        }
        if let Some(pids) = spec.pids_max {
            command.pids_max(u64::from(pids));
        }
        if let Some(sandbox) = spec.sandbox {
            apply_sandbox(client, &mut command, sandbox)?;
        }
        apply_fds(&mut command, fds)?;
        Ok(command)
    }
}

/// The client's sandbox for a plan `lib/sandbox.js` checked. The values
/// are checked again against their wire types here (a port over 65535, an
/// unknown mount type), as the addon's functions can be called directly;
/// zygote-client checks that every path is absolute.
fn sandbox_of(plan: SandboxPlan) -> io::Result<Sandbox> {
    let mut sandbox = Sandbox::new();
    if let Some(profile) = plan.profile {
        sandbox = sandbox.profile(profile);
    }
    for mount in plan.mounts.unwrap_or_default() {
        let source = mount.source.unwrap_or_default();
        sandbox = match mount.kind.as_str() {
            "ro" => sandbox.ro_bind(source, mount.destination),
            "rw" => sandbox.bind(source, mount.destination),
            "tmpfs" => sandbox.tmpfs(mount.destination),
            other => return Err(invalid(&format!("unknown mount type {other}"))),
        };
    }
    if plan.network_none {
        sandbox = sandbox.network_none();
    }
    if plan.isolate {
        sandbox = sandbox.isolate();
    }
    if let Some(hostname) = plan.hostname {
        sandbox = sandbox.hostname(hostname);
    }
    sandbox = match (plan.seccomp, plan.seccomp_filter) {
        (Some(_), Some(_)) => return Err(invalid("both seccomp and seccompFilter")),
        (Some(name), None) => sandbox.seccomp_profile(name),
        (None, Some(text)) => sandbox.seccomp_filter(text),
        (None, None) => sandbox,
    };
    if let Some(rules) = plan.landlock {
        sandbox = landlock_of(sandbox, rules)?;
    }
    Ok(sandbox)
}

fn landlock_of(mut sandbox: Sandbox, rules: LandlockPlan) -> io::Result<Sandbox> {
    // Also for rules that name nothing: Landlock is then on, allowing
    // nothing, as asked.
    sandbox = sandbox.landlock_require(rules.require);
    for path in rules.read_only {
        sandbox = sandbox.landlock_ro(path);
    }
    for path in rules.read_execute {
        sandbox = sandbox.landlock_rx(path);
    }
    for path in rules.read_write {
        sandbox = sandbox.landlock_rw(path);
    }
    for port in rules.tcp_bind {
        sandbox = sandbox.tcp_bind(port_of(port)?);
    }
    for port in rules.tcp_connect {
        sandbox = sandbox.tcp_connect(port_of(port)?);
    }
    Ok(sandbox)
}

fn port_of(port: u32) -> io::Result<u16> {
    u16::try_from(port).map_err(|_| invalid(&format!("TCP port {port} over 65535")))
}

/// Confines the command; refuses, before anything is sent, a sandbox the
/// zygote does not offer, as the zygote would refuse it: `EOPNOTSUPP`,
/// naming the feature (zygote-client refuses it too, but as a failure of
/// the program, whose errno alone Node reports).
fn apply_sandbox(client: &Client, command: &mut Command, plan: SandboxPlan) -> Result<(), Refused> {
    let sandbox = sandbox_of(plan)?;
    if !client.offers(Feature::Sandbox) {
        return Err(Refused {
            errno: libc::EOPNOTSUPP,
            message: format!(
                "the zygote does not offer the feature {} (it speaks protocol version {}); \
                 the child was not started",
                Feature::Sandbox,
                client.protocol_version()
            ),
        });
    }
    command.sandbox(sandbox);
    Ok(())
}

fn apply_fds(command: &mut Command, fds: Vec<Option<ChildFd>>) -> io::Result<()> {
    // Node closes a standard stream that the stdio array leaves out; the
    // zygote's default for one not set would be this process's own.
    for index in fds.len()..3 {
        set_std(command, index, Stdio::null());
    }
    for (index, child) in fds.into_iter().enumerate() {
        let Some(child) = child else { continue };
        let stdio = match child {
            ChildFd::Null => Stdio::null(),
            ChildFd::Inherit => Stdio::inherit(),
            ChildFd::Fd(fd) if index >= 3 => {
                command.fd(fd_number(index)?, fd);
                continue;
            }
            ChildFd::Fd(fd) => Stdio::from(fd),
        };
        set_std(command, index, stdio);
    }
    Ok(())
}

fn set_std(command: &mut Command, index: usize, stdio: Stdio) {
    match index {
        0 => command.stdin(stdio),
        1 => command.stdout(stdio),
        _ => command.stderr(stdio),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(stdio: &[(&str, Option<i32>)]) -> SpawnSpec {
        SpawnSpec {
            file: "true".into(),
            args: vec!["true".into()],
            inherit_env: false,
            env_keys: Vec::new(),
            env_values: Vec::new(),
            cwd: None,
            stdio: stdio
                .iter()
                .map(|(kind, fd)| StdioSpec {
                    kind: (*kind).into(),
                    fd: *fd,
                })
                .collect(),
            detached: false,
            uid: None,
            gid: None,
            kill_on_close: None,
            timeout_ms: None,
            memory_max: None,
            pids_max: None,
            sandbox: None,
            template: None,
        }
    }

    #[test]
    fn pipes_give_the_parent_an_end_and_the_rest_none() {
        let (plan, parents) = prepare(spec(&[
            ("pipe", None),
            ("ignore", None),
            ("inherit", None),
            ("pipe", None),
            ("ignore", None),
        ]))
        .expect("prepares");
        let has_end: Vec<bool> = parents.iter().map(Option::is_some).collect();
        assert_eq!(has_end, [true, false, false, true, false]);
        let child_has: Vec<bool> = plan.fds.iter().map(Option::is_some).collect();
        assert_eq!(child_has, [true, true, true, true, false]);
    }

    fn landlock_plan(tcp_bind: Vec<u32>) -> LandlockPlan {
        LandlockPlan {
            read_only: vec!["/etc".into()],
            read_execute: Vec::new(),
            read_write: vec!["/w".into()],
            tcp_bind,
            tcp_connect: vec![443],
            require: true,
        }
    }

    #[test]
    fn a_sandbox_plan_maps_onto_the_client_sandbox_field_by_field() {
        let plan = SandboxPlan {
            profile: Some("ci".into()),
            mounts: Some(vec![
                MountPlan {
                    kind: "ro".into(),
                    source: Some("/usr".into()),
                    destination: "/usr".into(),
                },
                MountPlan {
                    kind: "rw".into(),
                    source: Some("/srv".into()),
                    destination: "/work".into(),
                },
                MountPlan {
                    kind: "tmpfs".into(),
                    source: None,
                    destination: "/tmp".into(),
                },
            ]),
            network_none: true,
            isolate: true,
            hostname: Some("h".into()),
            seccomp: None,
            seccomp_filter: Some("deny ptrace".into()),
            landlock: Some(landlock_plan(Vec::new())),
        };
        let want = Sandbox::new()
            .profile("ci")
            .ro_bind("/usr", "/usr")
            .bind("/srv", "/work")
            .tmpfs("/tmp")
            .network_none()
            .isolate()
            .hostname("h")
            .seccomp_filter("deny ptrace")
            .landlock_require(true)
            .landlock_ro("/etc")
            .landlock_rw("/w")
            .tcp_connect(443);
        assert_eq!(sandbox_of(plan).expect("maps"), want);
        let over = SandboxPlan {
            profile: None,
            mounts: None,
            network_none: false,
            isolate: false,
            hostname: None,
            seccomp: None,
            seccomp_filter: None,
            landlock: Some(landlock_plan(vec![65536])),
        };
        let error = sandbox_of(over).expect_err("a port over 65535 is refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_closed_fd_is_ebadf_and_an_unknown_kind_is_refused() {
        let error = prepare(spec(&[("fd", Some(1_000_000))]))
            .err()
            .expect("fails");
        assert_eq!(error.raw_os_error(), Some(libc::EBADF));
        let error = prepare(spec(&[("sideways", None)])).err().expect("fails");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }
}
