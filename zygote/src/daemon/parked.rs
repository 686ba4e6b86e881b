//! The daemon's side of parked inits (see `sandbox::pool`): a spawn of a
//! sandbox with a pid namespace of its own takes the one parked for its
//! plan, and has the next one made, off its path.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracing::debug;

use crate::daemon::reaper;
use crate::daemon::sandbox::pool::{IDLE, Recipe, RootFrom, TEMPLATE_AGE, Taken};
use crate::daemon::state::Daemon;
use crate::daemon::uid_spawners::Outcome;
use crate::spawn::{self, ExecReport, ParkedInit, SpawnPlan};

/// How long a parked init may take to make its namespaces and root (its
/// paths are the peer's, which may be slow): then it is ended.
const READY_DEADLINE: Duration = Duration::from_secs(10);

/// For a spawn whose sandbox could enter a parked init: the recipe of
/// the next one, and the one parked now, if any, which `plan` then
/// enters. Keep the [`Taken`] until the child has started (or failed):
/// dropping it releases the init.
pub(crate) fn enter(daemon: &Daemon, plan: &mut SpawnPlan) -> Option<(Recipe, Option<Taken>)> {
    // Only a spawner process enters one: without them, none is made.
    if !daemon.uid_spawners.enabled() {
        return None;
    }
    let recipe = Recipe::of(plan)?;
    let taken = daemon.sandboxes.pool.take(&recipe.key);
    daemon
        .metrics
        .set_parked_inits(daemon.sandboxes.pool.parked());
    let sandbox = plan.sandbox.as_mut()?;
    match &taken {
        Some(taken) => {
            sandbox.enter = Some(Arc::clone(&taken.pidfd));
            daemon.metrics.parked_init("entered");
        }
        None => daemon.metrics.parked_init("missed"),
    }
    Some((recipe, taken))
}

/// For a spawn whose sandbox has a filesystem but no pid namespace of
/// its own (a spawner vforks it; never parked): has `plan` copy its
/// plan's mount template when one is ready, or has one built off the
/// spawn's path for the next. The recipe, when `plan` copies one.
pub(crate) fn copy_template(daemon: &Arc<Daemon>, plan: &mut SpawnPlan) -> Option<Recipe> {
    if !daemon.uid_spawners.enabled() {
        return None;
    }
    let recipe = Recipe::of_filesystem(plan)?;
    match daemon.sandboxes.pool.template_for(&recipe) {
        RootFrom::Template(pidfd, _) => {
            plan.sandbox.as_mut()?.mount_template = Some(pidfd);
            daemon.metrics.parked_init("template_copied");
            Some(recipe)
        }
        RootFrom::NewTemplate => {
            let daemon = Arc::clone(daemon);
            tokio::spawn(async move { build_template(&daemon, &recipe).await });
            None
        }
        RootFrom::Whole => None,
    }
}

/// Has inits parked for `recipe` up to the pool's depth and bounds, each
/// made in a task of its own: in the background, unless `behind` (the
/// spawn found none ready; see `UidSpawners::park`).
pub(crate) fn refill(daemon: &Arc<Daemon>, recipe: &Recipe, behind: bool) {
    while daemon.sandboxes.pool.start_making(&recipe.key) {
        make_one(daemon, recipe.clone(), behind);
    }
}

/// Parks one init for `recipe`, which `Pool::start_making` counted.
fn make_one(daemon: &Arc<Daemon>, recipe: Recipe, behind: bool) {
    let daemon = Arc::clone(daemon);
    tokio::spawn(async move {
        let pool = Arc::clone(&daemon.sandboxes.pool);
        let (template, resolved) = match root_from(&daemon, &recipe).await {
            Some((template, resolved)) => (Some(template), resolved),
            None => (None, Instant::now()),
        };
        let copied = template.is_some();
        let made = match recipe.park_plan(template) {
            Ok(plan) => make(&daemon, plan, behind).await,
            Err(error) => Err(error.to_string()),
        };
        let key = recipe.key;
        let (pidfd, release) = match made {
            Ok(made) => made,
            Err(error) => {
                pool.abandon(&key);
                daemon.metrics.parked_init("failed");
                debug!(%error, "a sandbox's namespaces could not be made ahead");
                return;
            }
        };
        let generation = pool.put(key.clone(), pidfd, release);
        daemon.metrics.parked_init("made");
        if copied {
            daemon.metrics.parked_init("copied");
        }
        daemon.metrics.set_parked_inits(pool.parked());
        tokio::time::sleep(IDLE.saturating_sub(resolved.elapsed())).await;
        if pool.expire(&key, generation) {
            daemon.metrics.parked_init("expired");
            daemon.metrics.set_parked_inits(pool.parked());
        }
    });
}

/// The mount template an init for `recipe` copies, and when it resolved
/// its binds: the live one, or one built now; `None`: the init builds
/// its whole root.
async fn root_from(daemon: &Arc<Daemon>, recipe: &Recipe) -> Option<(Arc<OwnedFd>, Instant)> {
    let pool = &daemon.sandboxes.pool;
    match pool.template_for(recipe) {
        RootFrom::Template(pidfd, resolved) => Some((pidfd, resolved)),
        RootFrom::Whole => None,
        RootFrom::NewTemplate => build_template(daemon, recipe).await,
    }
}

/// Builds the mount template of `recipe`, which `Pool::template_for`
/// counted, and keeps it for [`TEMPLATE_AGE`]: its process's pidfd, and
/// when its binds were resolved.
async fn build_template(daemon: &Arc<Daemon>, recipe: &Recipe) -> Option<(Arc<OwnedFd>, Instant)> {
    let pool = &daemon.sandboxes.pool;
    let resolved = Instant::now();
    let built = match recipe.template_plan() {
        // Rare (one per plan and [`TEMPLATE_AGE`]), and every init of its
        // plan waits for it: never in the background.
        Ok(plan) => make(daemon, plan, true).await,
        Err(error) => Err(error.to_string()),
    };
    let (pidfd, release) = match built {
        Ok(built) => built,
        Err(error) => {
            pool.abandon_template(&recipe.key);
            daemon.metrics.parked_init("template_failed");
            debug!(%error, "a sandbox's mount template could not be made");
            return None;
        }
    };
    daemon.metrics.parked_init("template");
    let generation = pool.put_template(recipe.key.clone(), Arc::clone(&pidfd), release, resolved);
    let pool = Arc::clone(pool);
    let key = recipe.key.clone();
    tokio::spawn(async move {
        tokio::time::sleep(TEMPLATE_AGE).await;
        pool.expire_template(&key, generation);
    });
    Some((pidfd, resolved))
}

/// Starts a parked process for `plan` (an init, or a mount template's)
/// and waits until it is ready: its pidfd and the write end of its
/// release pipe. A task reaps it when it ends.
async fn make(
    daemon: &Daemon,
    plan: SpawnPlan,
    behind: bool,
) -> Result<(Arc<OwnedFd>, OwnedFd), String> {
    let parked = start(daemon, plan, behind).await?;
    let enter = parked
        .pidfd
        .try_clone()
        .map_err(|error| error.to_string())?;
    let watched = zygote_proto::register(parked.pidfd, Interest::READABLE)
        .map_err(|error| error.to_string())?;
    let pid = parked.pid;
    tokio::spawn(async move {
        if let Err(error) = reaper::wait_exit(&watched).await {
            debug!(pid, %error, "failed to reap a parked init");
        }
    });
    let ready = tokio::time::timeout(READY_DEADLINE, ready(parked.status)).await;
    match ready {
        Ok(Ok(())) => Ok((Arc::new(enter), parked.release)),
        Ok(Err(error)) => Err(error),
        Err(_) => {
            let _ = spawn::send_signal(enter.as_fd(), libc::SIGKILL);
            Err(format!(
                "not ready in {} s: ended",
                READY_DEADLINE.as_secs()
            ))
        }
    }
}

/// Reaps the daemon's child behind `pidfd` whenever it ends.
fn reap_later(pid: i32, pidfd: OwnedFd) {
    let watched = match zygote_proto::register(pidfd, Interest::READABLE) {
        Ok(watched) => watched,
        Err(error) => {
            tracing::warn!(pid, %error, "failed to watch a parked init's pidfd; it will not be reaped");
            return;
        }
    };
    tokio::spawn(async move {
        if let Err(error) = reaper::wait_exit(&watched).await {
            debug!(pid, %error, "failed to reap a parked init");
        }
    });
}

/// Starts a parked init (or a mount template's holder) for `plan`, made
/// by the spawner of parks of the plan's uid, in the background unless
/// `behind`. It waits its turn behind the spawner's earlier parks; none
/// is made where no spawner can take it (retired, paused after failures,
/// or none left to start): only a spawner enters one, and
/// the spawns meanwhile take the fork path; a fork of the daemon, which
/// copies far more, would mostly wait there unused.
async fn start(daemon: &Daemon, plan: SpawnPlan, behind: bool) -> Result<ParkedInit, String> {
    let asked = daemon
        .uid_spawners
        .park(plan, &daemon.metrics, |plan| daemon.spawn(plan), behind);
    let Ok(answer) = asked else {
        return Err("no spawner process can make it now".to_owned());
    };
    match tokio::time::timeout(READY_DEADLINE, answer).await {
        Ok(Ok(Outcome::Parked(init))) => Ok(init),
        Ok(Ok(Outcome::Refused(error))) => Err(error.to_string()),
        Ok(Ok(Outcome::Lost { message, .. })) => Err(message),
        Ok(Ok(Outcome::Child { pid, pidfd, .. })) => {
            let _ = spawn::send_signal(pidfd.as_fd(), libc::SIGKILL);
            reap_later(pid, pidfd);
            Err("the spawner started a child instead of parking an init".to_owned())
        }
        Ok(Err(_)) => Err("the spawner process went away".to_owned()),
        Err(_) => Err(format!(
            "the spawner did not answer in {} s",
            READY_DEADLINE.as_secs()
        )),
    }
}

/// Waits for a parked init's status pipe to say it is ready.
async fn ready(status: OwnedFd) -> Result<(), String> {
    let status: AsyncFd<OwnedFd> =
        zygote_proto::register(status, Interest::READABLE).map_err(|error| error.to_string())?;
    loop {
        let mut guard = status.readable().await.map_err(|error| error.to_string())?;
        match spawn::read_exec_report(status.get_ref().as_fd()) {
            Ok(ExecReport::Execd) => return Ok(()),
            Ok(ExecReport::Failed(error)) => return Err(error.to_string()),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => guard.clear_ready(),
            Err(error) => return Err(error.to_string()),
        }
    }
}
