//! cgroup v2: the daemon's delegated subtree and one cgroup per child.
//!
//! ```text
//! ROOT/                  the daemon's cgroup (systemd's with Delegate=yes,
//! │                      the one it was started in, or --cgroup PATH)
//! ├── daemon/            the daemon itself: v2 allows no process in an
//! │                      inner node that has controllers enabled
//! └── peers/
//!     └── <uid>/         one per peer uid: the policy's per-peer caps
//!         └── <n>/       one per child, made before the child exists and
//!                        removed after its last report
//! ```
//!
//! It lives in `daemon/`, not `service/`: it is the daemon's model of its
//! children (placement, tree kill, accounting), used by `lifetime`, and
//! works without any service manager. It sits beside `policy` in the
//! layering: it knows no connection.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tracing::{info, warn};
use zygote_proto::{CgroupSpec, TreeUsage};

/// `CGROUP2_SUPER_MAGIC` from `<linux/magic.h>`.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Controllers the daemon enables for its children when delegated.
const CONTROLLERS: [&str; 4] = ["cpu", "io", "memory", "pids"];

/// Per-peer caps on a uid's subtree (`peers/<uid>`), from the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerCaps {
    /// `memory.max` of the uid's subtree, in bytes.
    pub memory_max: Option<u64>,
    /// `pids.max` of the uid's subtree.
    pub pids_max: Option<u64>,
}

/// The daemon's delegated subtree.
#[derive(Debug)]
pub struct Subtree {
    root: PathBuf,
    /// Controllers enabled for `peers/` and below.
    controllers: Vec<String>,
    /// `cgroup.kill` exists (Linux 5.14).
    can_kill: bool,
    /// Numbers child cgroups: spawn ids are per connection.
    next: AtomicU64,
    /// Peer uids whose `peers/<uid>` exists and has its caps.
    peers: Mutex<HashSet<u32>>,
    /// Empty cgroups of children that asked for nothing (no limits, no
    /// accounting), per peer uid, for the next such child, opened for
    /// `clone3`: mkdir, open and rmdir cost ~30, ~10 and ~60 µs here, on
    /// the spawn's path.
    spare: Mutex<HashMap<u32, Vec<(PathBuf, OwnedFd)>>>,
}

/// Spare cgroups kept per peer uid.
const SPARE_PER_PEER: usize = 16;

/// A child's cgroup, from before the child exists until it is removed.
#[derive(Debug)]
pub struct ChildCgroup {
    uid: u32,
    path: PathBuf,
    /// The request's whole-tree options.
    pub spec: CgroupSpec,
    can_kill: bool,
    /// The memory controller is enabled: its files exist.
    memory: bool,
    /// The request carried a [`CgroupSpec`]: it gets tree accounting.
    pub requested: bool,
    /// The daemon set out to end the child (timeout, kill-on-close, a
    /// SIGKILL request): with `kill_tree`, the rest of the tree follows.
    doomed: AtomicBool,
    /// `cgroup.kill` was written.
    killed: AtomicBool,
}

impl Subtree {
    /// Sets up the subtree: at `explicit` (created if missing), else in the
    /// daemon's own cgroup. Moves the daemon into `daemon/` and enables the
    /// delegated controllers.
    ///
    /// # Returns
    ///
    /// `Ok(None)` when there is no usable subtree and none was asked for:
    /// the reason is logged once and children share the daemon's cgroup.
    ///
    /// # Errors
    ///
    /// When `explicit` cannot be used, or the policy's caps need a
    /// controller that is not delegated.
    pub fn setup(explicit: Option<&Path>, caps: &[PeerCaps]) -> Result<Option<Self>, String> {
        let root = match explicit {
            Some(path) => path.to_owned(),
            None => match own_cgroup() {
                Ok(path) => path,
                Err(reason) => {
                    info!("children share the daemon's cgroup: {reason}");
                    return check_caps_without_subtree(caps).map(|()| None);
                }
            },
        };
        match Self::setup_at(&root, explicit.is_some()) {
            Ok(subtree) => {
                subtree.check_caps(caps)?;
                Ok(Some(subtree))
            }
            Err(reason) if explicit.is_none() => {
                info!("children share the daemon's cgroup: {reason}");
                check_caps_without_subtree(caps).map(|()| None)
            }
            Err(reason) => Err(reason),
        }
    }

    fn setup_at(root: &Path, create: bool) -> Result<Self, String> {
        let shown = root.display();
        if create {
            fs::create_dir_all(root).map_err(|error| format!("cannot create {shown}: {error}"))?;
        }
        let stat = rustix::fs::statfs(root).map_err(|error| format!("{shown}: {error}"))?;
        // f_type is i64 on x86_64 but narrower on some architectures.
        #[allow(clippy::useless_conversion)]
        let fs_type = i64::from(stat.f_type);
        if fs_type != CGROUP2_SUPER_MAGIC {
            return Err(format!("{shown} is not on a cgroup2 file system"));
        }
        let daemon = root.join("daemon");
        make_dir(&daemon)?;
        write(
            &daemon.join("cgroup.procs"),
            &std::process::id().to_string(),
        )
        .map_err(|error| format!("cannot move the daemon into {}: {error}", daemon.display()))?;
        let available = read(&root.join("cgroup.controllers")).unwrap_or_default();
        let wanted: Vec<String> = available
            .split_whitespace()
            .filter(|name| CONTROLLERS.contains(name))
            .map(str::to_owned)
            .collect();
        let peers = root.join("peers");
        make_dir(&peers)?;
        let mut controllers = Vec::new();
        for name in wanted {
            let enable = format!("+{name}");
            match write(&root.join("cgroup.subtree_control"), &enable)
                .and_then(|()| write(&peers.join("cgroup.subtree_control"), &enable))
            {
                Ok(()) => controllers.push(name),
                Err(error) => {
                    warn!(controller = name, %error, cgroup = %shown, "cannot enable a controller for children");
                }
            }
        }
        let subtree = Self {
            can_kill: root.join("cgroup.kill").exists(),
            root: root.to_owned(),
            controllers,
            next: AtomicU64::new(1),
            peers: Mutex::default(),
            spare: Mutex::default(),
        };
        subtree.remove_stale();
        info!(
            cgroup = %shown,
            controllers = ?subtree.controllers,
            tree_kill = subtree.can_kill,
            "every child gets its own cgroup"
        );
        Ok(subtree)
    }

    /// The subtree's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether `controller` is enabled for children.
    pub fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|name| name == controller)
    }

    fn check_caps(&self, caps: &[PeerCaps]) -> Result<(), String> {
        for cap in caps {
            if cap.memory_max.is_some() {
                self.require("memory", "the policy's memory_max")?;
            }
            if cap.pids_max.is_some() {
                self.require("pids", "the policy's pids_max")?;
            }
        }
        Ok(())
    }

    fn require(&self, controller: &str, what: &str) -> Result<(), String> {
        if self.has(controller) {
            return Ok(());
        }
        Err(format!(
            "{what} requested, but the {controller} controller is not delegated to {} \
             (enabled there: {})",
            self.root.display(),
            if self.controllers.is_empty() {
                "none".to_owned()
            } else {
                self.controllers.join(" ")
            }
        ))
    }

    /// Checks that every limit of `spec` can be enforced here.
    ///
    /// # Errors
    ///
    /// Names the first limit whose controller is not delegated.
    pub fn check(&self, spec: &CgroupSpec) -> Result<(), String> {
        let needs = [
            (spec.memory_max.is_some(), "memory", "memory.max"),
            (spec.memory_swap_max.is_some(), "memory", "memory.swap.max"),
            (spec.pids_max.is_some(), "pids", "pids.max"),
            (spec.cpu_max.is_some(), "cpu", "cpu.max"),
            (spec.cpu_weight.is_some(), "cpu", "cpu.weight"),
            (spec.io_weight.is_some(), "io", "io.weight"),
        ];
        for (wanted, controller, file) in needs {
            if wanted {
                self.require(controller, file)?;
            }
        }
        if (spec.kill_tree) && !self.can_kill {
            return Err(
                "kill_tree requested, but this kernel has no cgroup.kill (Linux 5.14)".into(),
            );
        }
        Ok(())
    }

    /// Makes the cgroup of one child of peer `uid`, with the request's
    /// limits, and opens it for `clone3`.
    ///
    /// # Errors
    ///
    /// A message and errno; nothing is left behind.
    pub fn create(
        &self,
        uid: u32,
        caps: PeerCaps,
        spec: Option<&CgroupSpec>,
    ) -> Result<(ChildCgroup, OwnedFd), (String, i32)> {
        let requested = spec.is_some();
        let spec = spec.copied().unwrap_or_default();
        self.check(&spec)
            .map_err(|message| (message, libc::EOPNOTSUPP))?;
        let peer = self.peer_dir(uid, caps)?;
        let failed = |what: &str, path: &Path, error: io::Error| {
            let errno = error.raw_os_error().unwrap_or(libc::EIO);
            (format!("{what} {}: {error}", path.display()), errno)
        };
        let spare = if requested {
            None
        } else {
            self.spare
                .lock()
                .expect("spare cgroups poisoned")
                .get_mut(&uid)
                .and_then(Vec::pop)
        };
        let (path, opened) = match spare {
            Some((path, dir)) => (path, Some(dir)),
            None => loop {
                let number = self.next.fetch_add(1, Ordering::Relaxed);
                let path = peer.join(number.to_string());
                match fs::create_dir(&path) {
                    Ok(()) => break (path, None),
                    // Still populated by an earlier run's orphans (a
                    // crash): skip the number, never share the cgroup.
                    Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(error) => {
                        return Err(failed("cannot create the child's cgroup", &path, error));
                    }
                }
            },
        };
        let child = ChildCgroup {
            uid,
            path,
            spec,
            can_kill: self.can_kill,
            memory: self.has("memory"),
            requested,
            doomed: AtomicBool::new(false),
            killed: AtomicBool::new(false),
        };
        let limits = [
            ("memory.max", spec.memory_max.map(|v| v.to_string())),
            (
                "memory.swap.max",
                spec.memory_swap_max.map(|v| v.to_string()),
            ),
            ("pids.max", spec.pids_max.map(|v| v.to_string())),
            (
                "cpu.max",
                spec.cpu_max
                    .map(|max| format!("{} {}", max.quota_micros, max.period_micros)),
            ),
            ("cpu.weight", spec.cpu_weight.map(|v| v.to_string())),
            ("io.weight", spec.io_weight.map(|v| format!("default {v}"))),
        ];
        for (file, value) in limits {
            if let Some(value) = value {
                let target = child.path.join(file);
                if let Err(error) = write(&target, &value) {
                    let _ = child.remove();
                    return Err(failed(&format!("cannot set {value} in"), &target, error));
                }
            }
        }
        if let Some(dir) = opened {
            return Ok((child, dir));
        }
        match fs::File::open(&child.path) {
            Ok(dir) => Ok((child, OwnedFd::from(dir))),
            Err(error) => {
                let _ = child.remove();
                Err(failed("cannot open", &child.path.clone(), error))
            }
        }
    }

    /// `peers/<uid>`, made with the peer's caps on first use.
    fn peer_dir(&self, uid: u32, caps: PeerCaps) -> Result<PathBuf, (String, i32)> {
        let dir = self.root.join("peers").join(uid.to_string());
        let mut peers = self.peers.lock().expect("cgroup peers poisoned");
        if peers.contains(&uid) {
            return Ok(dir);
        }
        let failed = |error: io::Error| {
            let errno = error.raw_os_error().unwrap_or(libc::EIO);
            (format!("cannot set up {}: {error}", dir.display()), errno)
        };
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(failed(error)),
        }
        for name in &self.controllers {
            write(&dir.join("cgroup.subtree_control"), &format!("+{name}")).map_err(failed)?;
        }
        if let Some(max) = caps.memory_max {
            write(&dir.join("memory.max"), &max.to_string()).map_err(failed)?;
        }
        if let Some(max) = caps.pids_max {
            write(&dir.join("pids.max"), &max.to_string()).map_err(failed)?;
        }
        peers.insert(uid);
        Ok(dir)
    }

    /// Done with an empty child cgroup: kept, opened, for the next child
    /// that asks for nothing (it never had limits, and its counters are
    /// never read), else removed. Called after the exit notice is sent, so
    /// the open is off the next spawn's path.
    ///
    /// # Errors
    ///
    /// When `rmdir` fails.
    pub fn release(&self, cgroup: &ChildCgroup) -> io::Result<()> {
        if !cgroup.requested && !cgroup.was_killed() {
            let room = |spare: &HashMap<u32, Vec<(PathBuf, OwnedFd)>>| {
                spare.get(&cgroup.uid).map_or(0, Vec::len) < SPARE_PER_PEER
            };
            if room(&self.spare.lock().expect("spare cgroups poisoned")) {
                if let Ok(dir) = fs::File::open(&cgroup.path) {
                    let mut spare = self.spare.lock().expect("spare cgroups poisoned");
                    if room(&spare) {
                        let list = spare.entry(cgroup.uid).or_default();
                        list.push((cgroup.path.clone(), OwnedFd::from(dir)));
                        return Ok(());
                    }
                }
            }
        }
        cgroup.remove()
    }

    /// Removes the empty child cgroups a previous daemon left behind.
    fn remove_stale(&self) {
        let Ok(uids) = fs::read_dir(self.root.join("peers")) else {
            return;
        };
        let mut kept = 0;
        for uid in uids.flatten().filter(|entry| entry.path().is_dir()) {
            let Ok(children) = fs::read_dir(uid.path()) else {
                continue;
            };
            for child in children.flatten().filter(|entry| entry.path().is_dir()) {
                if fs::remove_dir(child.path()).is_err() {
                    kept += 1;
                }
            }
        }
        if kept > 0 {
            warn!(
                kept,
                cgroup = %self.root.display(),
                "cgroups of an earlier run still hold processes; left alone"
            );
        }
    }
}

/// What an upgrade carries of a [`Subtree`]: the new image takes it over
/// as it is, without setting it up again.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SavedSubtree {
    root: PathBuf,
    controllers: Vec<String>,
    can_kill: bool,
    next: u64,
    peers: Vec<u32>,
    spare: Vec<(u32, Vec<PathBuf>)>,
}

/// What an upgrade carries of a [`ChildCgroup`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SavedCgroup {
    uid: u32,
    path: PathBuf,
    spec: CgroupSpec,
    can_kill: bool,
    memory: bool,
    requested: bool,
    doomed: bool,
    killed: bool,
}

impl Subtree {
    /// Its state, for an upgrade.
    pub fn save(&self) -> SavedSubtree {
        SavedSubtree {
            root: self.root.clone(),
            controllers: self.controllers.clone(),
            can_kill: self.can_kill,
            next: self.next.load(Ordering::Relaxed),
            peers: self
                .peers
                .lock()
                .expect("cgroup peers poisoned")
                .iter()
                .copied()
                .collect(),
            spare: self
                .spare
                .lock()
                .expect("spare cgroups poisoned")
                .iter()
                .map(|(uid, list)| (*uid, list.iter().map(|(path, _)| path.clone()).collect()))
                .collect(),
        }
    }

    /// The subtree an earlier image of this daemon saved, taken over as it
    /// is: the daemon is already in `daemon/`, and the children's cgroups
    /// are in use.
    pub fn restore(saved: SavedSubtree) -> Self {
        Self {
            root: saved.root,
            controllers: saved.controllers,
            can_kill: saved.can_kill,
            next: AtomicU64::new(saved.next),
            peers: Mutex::new(saved.peers.into_iter().collect()),
            // Kept open, as when made here; one that cannot be is dropped.
            spare: Mutex::new(
                saved
                    .spare
                    .into_iter()
                    .map(|(uid, paths)| {
                        let opened = paths
                            .into_iter()
                            .filter_map(|path| {
                                let dir = fs::File::open(&path).ok()?;
                                Some((path, OwnedFd::from(dir)))
                            })
                            .collect();
                        (uid, opened)
                    })
                    .collect(),
            ),
        }
    }
}

impl ChildCgroup {
    /// Its state, for an upgrade.
    pub fn save(&self) -> SavedCgroup {
        SavedCgroup {
            uid: self.uid,
            path: self.path.clone(),
            spec: self.spec,
            can_kill: self.can_kill,
            memory: self.memory,
            requested: self.requested,
            doomed: self.doomed.load(Ordering::Relaxed),
            killed: self.killed.load(Ordering::Relaxed),
        }
    }

    /// A child's cgroup as an earlier image of this daemon saved it.
    pub fn restore(saved: SavedCgroup) -> Self {
        Self {
            uid: saved.uid,
            path: saved.path,
            spec: saved.spec,
            can_kill: saved.can_kill,
            memory: saved.memory,
            requested: saved.requested,
            doomed: AtomicBool::new(saved.doomed),
            killed: AtomicBool::new(saved.killed),
        }
    }
}

fn check_caps_without_subtree(caps: &[PeerCaps]) -> Result<(), String> {
    if caps.iter().any(|cap| *cap != PeerCaps::default()) {
        return Err(
            "the policy caps peers' memory or pids, but the daemon has no cgroup subtree \
             (pass --cgroup PATH, or run it with Delegate=yes)"
                .into(),
        );
    }
    Ok(())
}

impl ChildCgroup {
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ends every process in the cgroup with `cgroup.kill` (Linux 5.14).
    ///
    /// # Errors
    ///
    /// When the write fails (e.g. no `cgroup.kill`).
    pub fn kill(&self) -> io::Result<()> {
        if !self.can_kill {
            return Err(io::Error::from_raw_os_error(libc::ENOSYS));
        }
        write(&self.path.join("cgroup.kill"), "1")?;
        self.killed.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `cgroup.kill` ended the tree.
    pub fn was_killed(&self) -> bool {
        self.killed.load(Ordering::Relaxed)
    }

    /// Notes that the daemon set out to end the child; with `kill_tree`,
    /// a SIGKILL goes to the whole tree at once. Returns whether the tree
    /// was killed.
    pub fn doom(&self, signal: i32) -> bool {
        if !self.spec.kill_tree {
            return false;
        }
        self.doomed.store(true, Ordering::Relaxed);
        signal == libc::SIGKILL && self.kill().is_ok()
    }

    /// After the child's exit: ends the rest of a doomed tree. Returns
    /// whether it killed anything.
    pub fn finish_doomed(&self) -> bool {
        self.doomed.load(Ordering::Relaxed) && self.populated() && self.kill().is_ok()
    }

    /// Whether the daemon set out to end the whole tree.
    pub fn is_doomed(&self) -> bool {
        self.doomed.load(Ordering::Relaxed)
    }

    /// Whether any process is still in the cgroup (`cgroup.events`).
    pub fn populated(&self) -> bool {
        read(&self.path.join("cgroup.events"))
            .is_ok_and(|events| events.lines().any(|line| line.trim() == "populated 1"))
    }

    /// Resolves once no process is left in the cgroup.
    pub async fn wait_empty(&self) {
        let mut pause = Duration::from_millis(1);
        while self.populated() {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// What the whole tree used so far.
    pub fn usage(&self) -> TreeUsage {
        // Each read costs ~40 µs (cpu.stat flushes the kernel's per-CPU
        // counters): only files that exist are read.
        let cpu = read(&self.path.join("cpu.stat")).unwrap_or_default();
        let (memory_events, memory_peak_bytes) = if self.memory {
            (
                read(&self.path.join("memory.events")).unwrap_or_default(),
                read(&self.path.join("memory.peak"))
                    .ok()
                    .and_then(|peak| peak.trim().parse().ok()),
            )
        } else {
            (String::new(), None)
        };
        TreeUsage {
            user_micros: field(&cpu, "user_usec").unwrap_or(0),
            system_micros: field(&cpu, "system_usec").unwrap_or(0),
            memory_peak_bytes,
            oom_kills: field(&memory_events, "oom_kill").unwrap_or(0),
            memory_max: self.spec.memory_max,
        }
    }

    /// Removes the cgroup; it must be empty.
    ///
    /// # Errors
    ///
    /// `EBUSY` while a process is still in it.
    pub fn remove(&self) -> io::Result<()> {
        fs::remove_dir(&self.path)
    }
}

/// The daemon's own cgroup, when it may make a subtree there.
fn own_cgroup() -> Result<PathBuf, String> {
    let mount = cgroup2_mount().ok_or("no cgroup2 file system is mounted")?;
    let own = read(Path::new("/proc/self/cgroup"))
        .map_err(|error| format!("cannot read /proc/self/cgroup: {error}"))?;
    let relative = own
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or("the daemon is in no cgroup v2 (hybrid or v1-only hierarchy)")?
        .trim();
    if relative == "/" {
        return Err(format!(
            "the daemon runs in the root cgroup of {}; pass --cgroup PATH to give it a subtree",
            mount.display()
        ));
    }
    let mut path = mount.join(relative.trim_start_matches('/'));
    // Started in its own leaf already (a restart, or DelegateSubgroup=).
    if path.ends_with("daemon")
        && path
            .parent()
            .is_some_and(|root| root.join("peers").is_dir())
    {
        path.pop();
    }
    let name = path
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("");
    let delegated = ["trusted.delegate", "user.delegate"]
        .iter()
        .any(|attr| rustix::fs::getxattr(&path, *attr, &mut [0u8; 8]).is_ok());
    if (name.ends_with(".scope") || name.ends_with(".slice")) && !delegated {
        return Err(format!(
            "{} belongs to systemd and was not delegated to the daemon",
            path.display()
        ));
    }
    if rustix::fs::access(&path, rustix::fs::Access::WRITE_OK).is_err() {
        return Err(format!("{} is not writable by the daemon", path.display()));
    }
    Ok(path)
}

/// Where cgroup2 is mounted, from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = read(Path::new("/proc/self/mountinfo")).ok()?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        (after.split_whitespace().next()? == "cgroup2")
            .then(|| before.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
}

fn make_dir(path: &Path) -> Result<(), String> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(format!("cannot create {}: {error}", path.display())),
    }
}

fn read(path: &Path) -> io::Result<String> {
    fs::read_to_string(path)
}

/// One `write(2)` of `value`, as cgroup files want.
fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value)
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn fields_are_read_by_name() {
        let stat = "usage_usec 30\nuser_usec 20\nsystem_usec 10\n";
        assert_eq!(field(stat, "user_usec"), Some(20));
        assert_eq!(field(stat, "system_usec"), Some(10));
        assert_eq!(field(stat, "nr_throttled"), None);
    }
}
