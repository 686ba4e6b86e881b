//! Daemon threads confined as a sandboxed child is, one per seccomp
//! profile, that vfork the filters-only sandboxed children of peers with
//! the daemon's own ids (root's, for the shared daemon).
//!
//! seccomp, `no_new_privs` and the capability bounding set belong to a
//! thread, and a child inherits its cloning thread's. Such a thread sets
//! all three once, and its children skip installing the profile (the
//! kernel's preparation of its action cache) and clearing the bounding
//! set one capability at a time. It does what a per-uid spawner holding
//! the profile does (see `uid_spawners`), without the hop to another
//! process: the plan is not encoded, no fd crosses a socket, and the
//! pidfd comes back from the clone.
//!
//! Only children that keep the daemon's ids come here: their peer could
//! stop them before exec, but it may already signal or trace the daemon.
//! A thread busy with a child sends the next one to the spawner instead,
//! so a child stopped before exec holds back no other spawn.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use tokio::sync::oneshot;
use tracing::info;

use crate::spawn::{self, SpawnError, SpawnPlan, SpawnedChild, Spawner};

/// A spawn for a confined thread, and where its child goes.
type Job = (SpawnPlan, oneshot::Sender<Result<SpawnedChild, SpawnError>>);

/// The confined threads, by seccomp profile, each started at its first
/// spawn.
#[derive(Default)]
pub(crate) struct ConfinedThreads {
    threads: Mutex<HashMap<&'static str, Arc<Confined>>>,
}

impl std::fmt::Debug for ConfinedThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfinedThreads")
            .field("profiles", &self.lock().keys().collect::<Vec<_>>())
            .finish()
    }
}

/// One profile's thread.
#[derive(Default)]
struct Confined {
    slot: Mutex<Slot>,
    ready: Condvar,
}

#[derive(Default)]
struct Slot {
    job: Option<Job>,
    /// A child is being started.
    busy: bool,
    /// The thread could not confine itself (or start): never used.
    unusable: bool,
}

impl ConfinedThreads {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Arc<Confined>>> {
        self.threads.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the child of `plan`, which keeps the daemon's ids and whose
    /// one confinement needing a syscall of its own is the seccomp
    /// `profile`, on that profile's thread.
    ///
    /// # Errors
    ///
    /// The plan back when the thread is busy or cannot be used.
    pub(crate) fn spawn(
        &self,
        profile: &'static str,
        mut plan: SpawnPlan,
    ) -> Result<oneshot::Receiver<Result<SpawnedChild, SpawnError>>, Box<SpawnPlan>> {
        let confined = self.thread_for(profile);
        let mut slot = confined.lock();
        if slot.busy || slot.unusable {
            return Err(Box::new(plan));
        }
        if let Some(sandbox) = plan.sandbox.as_mut() {
            // Both inherited from the thread.
            sandbox.seccomp.clear();
            sandbox.clear_bounding_set = false;
        }
        let (done, child) = oneshot::channel();
        slot.job = Some((plan, done));
        slot.busy = true;
        drop(slot);
        confined.ready.notify_one();
        Ok(child)
    }

    /// The thread of `profile`, started now if there is none (marked
    /// unusable when it cannot start or confine itself).
    fn thread_for(&self, profile: &'static str) -> Arc<Confined> {
        let mut threads = self.lock();
        if let Some(confined) = threads.get(profile) {
            return Arc::clone(confined);
        }
        let confined = Arc::new(Confined::default());
        let (told, confinement) = std::sync::mpsc::sync_channel(1);
        let serving = Arc::clone(&confined);
        // Started from a runtime worker: it inherits its signal mask,
        // SIGCHLD blocked (see `reaper`).
        let started = std::thread::Builder::new()
            .name(format!("zygote-{profile}"))
            .spawn(move || serve(&serving, profile, &told));
        let confinement = match started {
            Ok(_) => confinement
                .recv()
                .unwrap_or_else(|_| Err("the thread ended".to_owned())),
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = confinement {
            info!(
                profile,
                %error,
                "cannot confine a thread for a seccomp profile; its sandboxed children start \
                 elsewhere"
            );
            confined.lock().unusable = true;
        }
        threads.insert(profile, Arc::clone(&confined));
        confined
    }
}

impl Confined {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The thread: confines itself, says how that went, then starts each
/// child it is given, for the daemon's lifetime.
fn serve(
    confined: &Confined,
    profile: &str,
    told: &std::sync::mpsc::SyncSender<Result<(), String>>,
) {
    let confinement = spawn::confine_like_a_sandboxed_child()
        .map_err(|error| format!("no_new_privs and the bounding set: {error}"))
        .and_then(|()| crate::daemon::sandbox::seccomp_profile(profile))
        .and_then(|program| {
            spawn::install_seccomp_filter(&program).map_err(|error| error.to_string())
        });
    let failed = confinement.is_err();
    let _ = told.send(confinement);
    if failed {
        return;
    }
    let spawner = Spawner::with_current_dispositions().unwrap_or_else(Spawner::resetting_all);
    loop {
        let (plan, done) = {
            let mut slot = confined.lock();
            loop {
                if let Some(job) = slot.job.take() {
                    break job;
                }
                slot = confined
                    .ready
                    .wait(slot)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        let child = spawner.spawn(&plan);
        drop(plan);
        confined.lock().busy = false;
        // The spawn's task is gone only when the runtime is (the daemon
        // is exiting): the child's pidfd is closed with it.
        let _ = done.send(child);
    }
}
