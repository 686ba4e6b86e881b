//! What a sandbox costs: three more shared daemons whose policies impose
//! a profile on this process's uid (seccomp + Landlock only; the full
//! sandbox; the full sandbox without `isolate`), and the `bwrap` wrapper
//! run through the plain shared daemon, which the daemon's own sandbox
//! replaces.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;

use zygote_client::Client;

use crate::error::Result;
use crate::methods::{self, Budget, CellRun};
use crate::serve::serve;

/// bwrap's flags, as the cost is commonly quoted: the host's root
/// read-only, a /dev and /proc of its own, new pid, ipc and uts
/// namespaces.
const BWRAP_FLAGS: [&str; 11] = [
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--",
];

/// A daemon confining every child of ours in one profile.
pub struct SandboxDaemon {
    process: Child,
    /// Its client.
    pub client: Client,
}

impl SandboxDaemon {
    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }
}

impl Drop for SandboxDaemon {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The sandbox daemons, and bwrap's path when it is installed.
pub struct Sandboxes {
    /// seccomp + Landlock only.
    pub filters: SandboxDaemon,
    /// The full sandbox, network none.
    pub full: SandboxDaemon,
    /// The full sandbox without `isolate`.
    pub mounts: SandboxDaemon,
    /// `bwrap`, when found on `PATH`.
    pub bwrap: Option<PathBuf>,
}

/// The profile for seccomp + Landlock only: the system readable and
/// executable, `/tmp` and `/dev` writable.
fn filters_policy(uid: u32) -> String {
    format!(
        "[sandbox.filters]\nseccomp = \"default\"\nlandlock_rx = [\"/\"]\n\
         landlock_rw = [\"/tmp\", \"/dev\"]\n\n[[peer]]\nuids = [{uid}]\nsandbox = \"filters\"\n"
    )
}

/// The full profile: `dir` (where the static child lies) and the system
/// bound read-only on a tmpfs root, network none, isolate (unless
/// `name` is `mounts`), seccomp and Landlock.
fn full_policy(uid: u32, dir: &Path, name: &str) -> String {
    let mut binds: Vec<String> = ["/usr", "/bin", "/lib", "/lib64"]
        .into_iter()
        .filter(|path| Path::new(path).exists())
        .map(|path| format!("\"{path}\""))
        .collect();
    binds.push(format!("\"{}\"", dir.display()));
    let isolate = name != "mounts";
    format!(
        "[sandbox.{name}]\nnetwork = \"none\"\nisolate = {isolate}\nseccomp = \"default\"\n\
         ro_bind = [{}]\nlandlock_rx = [\"/\"]\nlandlock_rw = [\"/dev\"]\n\n\
         [[peer]]\nuids = [{uid}]\nsandbox = \"{name}\"\n",
        binds.join(", ")
    )
}

/// Starts the three daemons on sockets in `dir`.
///
/// # Errors
///
/// A reason to print instead of the cells: a daemon that does not start
/// or answer (one that cannot sandbox refuses the spawns later).
pub fn start(runtime: &tokio::runtime::Runtime, dir: &Path) -> Result<Sandboxes, String> {
    let uid = rustix::process::geteuid().as_raw();
    let filters = start_one(runtime, dir, "filters", &filters_policy(uid))?;
    let full = start_one(runtime, dir, "full", &full_policy(uid, dir, "full"))?;
    let mounts = start_one(runtime, dir, "mounts", &full_policy(uid, dir, "mounts"))?;
    let bwrap = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("bwrap"))
            .find(|candidate| candidate.is_file())
    });
    Ok(Sandboxes {
        filters,
        full,
        mounts,
        bwrap,
    })
}

fn start_one(
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    name: &str,
    policy: &str,
) -> Result<SandboxDaemon, String> {
    let policy_path = dir.join(format!("policy-{name}.toml"));
    std::fs::write(&policy_path, policy).map_err(|error| error.to_string())?;
    let socket = dir.join(format!("zygote-{name}.sock"));
    let (process, client) = serve(
        runtime,
        &socket,
        &["--policy".as_ref(), policy_path.as_ref()],
    )
    .map_err(|error| format!("the {name} sandbox daemon: {error}"))?;
    Ok(SandboxDaemon { process, client })
}

/// `program` under bwrap, through `client` (the plain shared daemon).
///
/// # Errors
///
/// The first spawn or wait error.
pub async fn run_bwrap(
    client: &Client,
    bwrap: &Path,
    program: &Path,
    budget: Budget,
) -> Result<CellRun> {
    let mut args: Vec<OsString> = BWRAP_FLAGS.iter().map(OsString::from).collect();
    args.push(program.as_os_str().to_owned());
    methods::run_zygote_with_args(client, bwrap, Arc::from(args), budget, |_| {}).await
}
