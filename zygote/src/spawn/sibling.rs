//! Children that a per-uid spawner process starts for the daemon.
//!
//! The spawner clones with `clone3(CLONE_PARENT | CLONE_VM | CLONE_VFORK |
//! CLONE_PIDFD)`: the child is the daemon's (its parent, which reaps it
//! and gets its `SIGCHLD`), while the spawner's thread, not a daemon
//! thread, waits for its exec. The pidfd then reaches the daemon over the
//! spawner's socket. Until it has, the daemon holds an
//! [`ExpectedSibling`] for the child's uid, so that its orphan reaper
//! leaves an exited child of that uid alone.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::PoisonError;

use zygote_proto::SpawnStage;

use super::child::Failure;
use super::{OWN, Prepared, SpawnError, SpawnPlan, Spawner, clone};

/// A child started by [`Spawner::spawn_sibling`]: exec'd, or failed
/// before (then it has exited, and its parent must reap it).
#[derive(Debug)]
pub struct SiblingChild {
    /// Its pid.
    pub pid: i32,
    /// A close-on-exec pidfd.
    pub pidfd: OwnedFd,
    /// The step that failed before exec, if one did.
    pub failure: Option<SpawnError>,
}

impl Spawner {
    /// Starts a child as `plan` says, as a sibling of this process (see
    /// the module), and returns once it has exec'd or failed. For a
    /// spawner process: the child's parent is the spawner's parent, and
    /// only it can reap the child.
    ///
    /// # Errors
    ///
    /// `Validate`, `Pipe`, `Cgroup` or `Clone` when no child was created
    /// (`Clone` with `ENOSYS` where `clone3` is missing or filtered;
    /// `Validate` for a sandbox a vforked child cannot set up, see
    /// [`super::SandboxPlan::suits_vfork`]).
    pub fn spawn_sibling(&self, plan: &SpawnPlan) -> Result<SiblingChild, SpawnError> {
        let mut prepared = Prepared::new(plan)?;
        let failure = Failure::default();
        if plan.sandbox.as_ref().is_some_and(|s| !s.suits_vfork()) {
            return Err(SpawnError::new(SpawnStage::Validate, libc::EINVAL));
        }
        let sandbox_fds = prepared
            .sandbox_fds(plan)
            .map_err(|errno| SpawnError::new(SpawnStage::Pipe, errno.raw_os_error()))?;
        let sandbox_raw: Vec<RawFd> = sandbox_fds.iter().map(AsRawFd::as_raw_fd).collect();
        let mut args = prepared.child_args(&self.signals, &failure);
        args.sandbox_fds = &sandbox_raw;
        let namespaces = plan
            .sandbox
            .as_ref()
            .map_or(0, super::SandboxPlan::namespaces_to_make);
        let cgroup = plan.cgroup.as_ref().map(AsFd::as_fd);
        // Below 5.7 the child joins by itself, as on the daemon's paths.
        let procs = match cgroup {
            Some(dir) if !clone::into_cgroup_works() => Some(
                clone::open_cgroup_procs(dir)
                    .map_err(|errno| SpawnError::new(SpawnStage::Cgroup, errno))?,
            ),
            _ => None,
        };
        args.join_cgroup = procs.as_ref().map(AsRawFd::as_raw_fd);
        let into = if procs.is_none() { cgroup } else { None };
        // In a parked init's namespaces for this one clone, if the plan
        // enters some.
        let entered = match &plan.sandbox {
            Some(sandbox) => super::sandbox::Entered::enter(sandbox)
                .map_err(|errno| SpawnError::new(SpawnStage::Clone, errno))?,
            None => None,
        };
        let cloned = clone::clone_sibling(&args, into, namespaces);
        drop(entered);
        let (pid, pidfd) = cloned.map_err(|(stage, errno)| SpawnError::new(stage, errno))?;
        let failure = failure.get().map(|(stage, errno, sandbox)| SpawnError {
            stage,
            errno,
            sandbox,
        });
        Ok(SiblingChild {
            pid,
            pidfd,
            failure,
        })
    }
}

/// Held by the daemon from before it asks a spawner for a child of `uid`
/// until that child is listed as its own ([`super::adopt_own`]) or can no
/// longer come: meanwhile the orphan reaper leaves every exited child of
/// that uid alone (a spawner's child is not listed yet when it may
/// already have exited).
#[derive(Debug)]
pub struct ExpectedSibling {
    uid: u32,
}

/// Starts expecting a spawner's child of `uid`: see [`ExpectedSibling`].
pub fn expect_sibling(uid: u32) -> ExpectedSibling {
    // Under the gate: the orphan reaper, which holds it for writing while
    // it decides, sees the count before or after, never half-way.
    let _gate = OWN.gate.read().unwrap_or_else(PoisonError::into_inner);
    *OWN.expected
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(uid)
        .or_insert(0) += 1;
    ExpectedSibling { uid }
}

impl Drop for ExpectedSibling {
    fn drop(&mut self) {
        let mut expected = OWN.expected.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = expected.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                expected.remove(&self.uid);
            }
        }
    }
}

/// Pidfds of the children of this process that share the memory of the
/// process `spawner` and still bear its name: the child a spawner has
/// cloned and still waits for, before its exec (stopped by its uid, say),
/// or a parked init still setting up. Not a parked init that has handed
/// off (it shares its maker's memory for life, but renamed itself). Signal
/// them with [`super::send_signal`]: a `SIGKILL` ends the spawner's wait,
/// and still reaches them once the spawner is gone.
pub fn pre_exec_children(spawner: i32) -> Vec<OwnedFd> {
    let comm = |pid: i32| std::fs::read(format!("/proc/{pid}/comm")).ok();
    let Some(name) = comm(spawner) else {
        return Vec::new();
    };
    super::children_of_self()
        .into_iter()
        .filter(|pid| *pid != spawner)
        // By pidfd, so that a pid reaped and reused meanwhile is not hit:
        // a new process never shares the spawner's memory.
        .filter_map(|pid| clone::pidfd_open(pid).ok().map(|pidfd| (pid, pidfd)))
        .filter(|(pid, _)| clone::share_memory(spawner, *pid))
        .filter(|(pid, _)| comm(*pid).as_ref() == Some(&name))
        .map(|(_, pidfd)| pidfd)
        .collect()
}

/// Kills (`SIGKILL`) the [`pre_exec_children`] of `spawner`; how many.
pub fn kill_pre_exec_children(spawner: i32) -> usize {
    pre_exec_children(spawner)
        .iter()
        .filter(|pidfd| clone::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL).is_ok())
        .count()
}

impl Spawner {
    /// A spawner whose children reset every signal (for when procfs
    /// cannot tell this process's dispositions).
    pub fn resetting_all() -> Self {
        Self {
            signals: super::child::SignalReset::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held expectations nest per uid, and end with the last one: the
    /// orphan reaper leaves that uid's exited children alone meanwhile.
    #[test]
    fn a_uid_is_expected_while_any_expectation_of_it_is_held() {
        // A uid no other test spawns as.
        let uid = 4_000_321;
        assert!(!super::super::sibling_expected(uid));
        let first = expect_sibling(uid);
        let second = expect_sibling(uid);
        assert!(super::super::sibling_expected(uid));
        assert!(!super::super::sibling_expected(uid + 1));
        drop(first);
        assert!(super::super::sibling_expected(uid), "one is still held");
        drop(second);
        assert!(!super::super::sibling_expected(uid));
    }
}
