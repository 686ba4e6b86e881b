//! The spawner process itself: `zygote uid-spawner --uid UID`, started by
//! the daemon with its end of a socketpair on fd 3. It reads one plan at a
//! time, starts the child as the daemon's sibling, and answers with the
//! child's pidfd; it exits when the daemon closes the socket.

use std::os::fd::{AsFd, OwnedFd};

use zygote_proto::{RECV_BUFFER_BYTES, SpawnStage, recv_frame_in, send_frame};

use super::wire::{self, Answer, Ask};
use crate::spawn::{self, HeldLandlock, SandboxFailure, SiblingChild, SpawnPlan, Spawner};

/// The fd the daemon passes the spawner's socket on.
pub(crate) const SOCKET_FD: i32 = 3;

/// The process name a spawner shows (`ps`, `/proc/PID/comm`).
pub(crate) const PROCESS_NAME: &std::ffi::CStr = c"zygote-spawner";

/// Serves the daemon on fd 3 until it closes the socket; the process's
/// exit code (0 when the daemon closed, 1 on an error, said on stderr).
/// With `seccomp`, that profile is installed on this process first: every
/// child inherits it (see the parent module).
///
/// Root's spawner and one holding a profile start only sandboxed
/// children: they set `no_new_privs` and clear their capability bounding
/// set first, which each child would otherwise do itself (~50 µs: the
/// bounding set goes one capability at a time); they keep their effective
/// capabilities for the children's setup.
///
/// With `hold_landlock`, every plan's first Landlock ruleset is a policy
/// profile's, the same each time: this process enforces it on itself at
/// the first plan, and its children inherit it (see [`HeldLandlock`]).
///
/// With `parks`, it makes only parked inits and mount templates, each
/// sharing this process's memory until it is set up (see
/// `Spawner::park_sibling`): a spawner of its own, so that no spawn waits
/// behind that. It makes them in the background (`SCHED_IDLE`, see
/// [`spawn::run_in_background`]) unless the daemon says the pool is
/// behind: on CPU time spawns leave (on 2 CPUs, the full sandbox's p50
/// 0.05 to 0.08 ms lower than at the usual priority), and at the usual
/// priority on a busy machine, where it would otherwise starve.
pub fn serve(uid: u32, seccomp: Option<&str>, hold_landlock: bool, parks: bool) -> u8 {
    // Nothing else the daemon passed stays open.
    let socket = match spawn::take_inherited_fd(SOCKET_FD) {
        Ok(socket) => socket,
        Err(error) => {
            eprintln!("zygote uid-spawner: no socket on fd {SOCKET_FD}: {error}");
            return 1;
        }
    };
    // Like the daemon's threads, never preempts on wake-up: woken when
    // its child's exec releases the vfork, it would take the child's CPU
    // mid-exec to answer (measured on 2 CPUs: a filters-only sandbox's
    // p50 0.03 ms lower, and non-root spawns' CPU 10 to 25% lower, with
    // the same throughput at 50 in flight). Children start under
    // `SCHED_OTHER`; `ZYGOTE_SCHED_BATCH=0` keeps it, as for the daemon.
    let _ = spawn::run_daemon_as_batch();
    if parks {
        let _ = spawn::run_in_background(true);
    }
    // Stays in the daemon's process group, as its children must: a ^C
    // there must not end it (the daemon stops it by closing the socket).
    let _held = spawn::hold_stop_signals();
    let _ = rustix::thread::set_name(PROCESS_NAME);
    let confined = uid == 0 || seccomp.is_some();
    if confined {
        if let Err(error) = spawn::confine_like_a_sandboxed_child() {
            eprintln!("zygote uid-spawner: no_new_privs and the bounding set: {error}");
            return 1;
        }
    }
    if let Some(name) = seccomp {
        let installed = crate::daemon::sandbox::seccomp_profile(name)
            .and_then(|program| spawn::install_seccomp_filter(&program).map_err(|e| e.to_string()));
        if let Err(error) = installed {
            eprintln!("zygote uid-spawner: seccomp profile {name}: {error}");
            return 1;
        }
    }
    let spawner = Spawner::with_current_dispositions().unwrap_or_else(Spawner::resetting_all);
    let role = Role {
        uid,
        filtered: seccomp.is_some(),
        confined,
        holds_landlock: hold_landlock,
        parks,
    };
    let mut held = None;
    let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
    loop {
        let received = match recv_frame_in(socket.as_fd(), &mut scratch) {
            Ok(Some(received)) => received,
            Ok(None) => return 0,
            Err(error) => {
                eprintln!("zygote uid-spawner: {error}");
                return 1;
            }
        };
        let plan = wire::decode_plan(&scratch[..received.len], received.fds);
        let (answer, fds) = start(&spawner, plan, &role, &mut held);
        let bytes = zygote_proto::encode(&answer).unwrap_or_default();
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        if let Err(error) = send_frame(socket.as_fd(), &bytes, &borrowed) {
            // Nobody will watch the child: end it, and leave.
            if let Some(pidfd) = fds.first() {
                let _ = spawn::send_signal(pidfd.as_fd(), libc::SIGKILL);
            }
            if !error.is_disconnect() {
                eprintln!("zygote uid-spawner: {error}");
            }
            return 1;
        }
    }
}

/// What a spawner process is, for each plan.
struct Role {
    /// The uid it serves.
    uid: u32,
    /// It holds a seccomp profile.
    filtered: bool,
    /// Its bounding set is empty.
    confined: bool,
    /// It holds the Landlock rules of its plans' first ruleset, once
    /// enforced on itself.
    holds_landlock: bool,
    /// It makes parked inits and mount templates, and nothing else.
    parks: bool,
}

/// Starts the child of one plan, or its parked init (the plan's fds are
/// closed on return): the answer, and the fds to attach (the child's
/// pidfd first). `held`: the Landlock domain this process enforced on
/// itself, if any yet.
fn start(
    spawner: &Spawner,
    plan: Option<(SpawnPlan, Ask)>,
    role: &Role,
    held: &mut Option<HeldLandlock>,
) -> (Answer, Vec<OwnedFd>) {
    let Role {
        uid,
        filtered,
        confined,
        holds_landlock,
        parks,
    } = *role;
    let refused = |stage, errno| (Answer::Refused { stage, errno }, Vec::new());
    let Some((plan, ask)) = plan else {
        return refused(zygote_proto::SpawnStage::Validate, libc::EINVAL);
    };
    // Children are never started in the background, nor inits in the way.
    if parks != matches!(ask, Ask::Park { .. }) {
        return refused(zygote_proto::SpawnStage::Validate, libc::EINVAL);
    }
    // Only the uid this spawner serves: a daemon bug must not turn into a
    // child of another uid. Root's spawner starts only sandboxed children
    // that keep its ids (a root peer's); the daemon vforks the others.
    let serves = match &plan.credentials {
        Some(credentials) => credentials.uid == uid && uid != 0,
        None => uid == 0 && plan.sandbox.is_some(),
    };
    if !serves {
        return refused(zygote_proto::SpawnStage::Validate, libc::EPERM);
    }
    // Under the profile, such a child would fail before exec: never sent.
    if filtered && super::needs_calls_profiles_deny(&plan) {
        return refused(zygote_proto::SpawnStage::Validate, libc::EINVAL);
    }
    let mut plan = plan;
    if holds_landlock {
        if let Err((stage, errno)) = inherit_landlock(&mut plan, held) {
            return refused(stage, errno);
        }
    }
    if let (true, Some(sandbox)) = (confined, plan.sandbox.as_mut()) {
        // Cleared on this process at start: inherited empty.
        sandbox.clear_bounding_set = false;
    }
    if let Ask::Park { behind } = ask {
        let _ = spawn::run_in_background(!behind);
        return match spawner.park_sibling(&plan) {
            Ok(init) => (
                Answer::Parked { pid: init.pid },
                vec![init.pidfd, init.status, init.release],
            ),
            Err(error) => refused(error.stage, error.errno),
        };
    }
    match spawner.spawn_sibling(&plan) {
        Ok(SiblingChild {
            pid,
            pidfd,
            failure,
        }) => {
            let failure = failure.map(|error| {
                let step = SandboxFailure::pack(error.sandbox);
                (error.stage, error.errno, step)
            });
            (Answer::Started { pid, failure }, vec![pidfd])
        }
        Err(error) => refused(error.stage, error.errno),
    }
}

/// Replaces the plan's first Landlock ruleset, the one this spawner
/// holds, by the checks its child makes of the domain it inherits: the
/// rules enforced on this process at its first plan, while each path
/// still names the file it did then.
///
/// # Errors
///
/// `ESTALE` (stage `Clone`) when a path names another file now (a
/// directory made anew): the daemon starts that child another way, and
/// gives this spawner no more plans. `EINVAL` for a plan with other
/// rules (the daemon never sends one).
fn inherit_landlock(
    plan: &mut SpawnPlan,
    held: &mut Option<HeldLandlock>,
) -> Result<(), (SpawnStage, i32)> {
    let invalid = (SpawnStage::Validate, libc::EINVAL);
    let sandbox = plan.sandbox.as_mut().ok_or(invalid)?;
    let first = sandbox
        .landlock
        .first()
        .filter(|first| first.held.is_some())
        .ok_or(invalid)?;
    let held = match held {
        Some(held) if !held.holds(first) => return Err(invalid),
        Some(held) if !held.still_names_its_files() => {
            return Err((SpawnStage::Clone, libc::ESTALE));
        }
        Some(held) => held,
        None => match HeldLandlock::hold(first) {
            Ok(enforced) => held.insert(enforced),
            // Nothing enforced (a path gone, say): the child enforces the
            // rules itself, and names the path at fault.
            Err(_) => return Ok(()),
        },
    };
    sandbox.landlock.remove(0);
    sandbox.inherited_landlock = held.paths().to_vec();
    Ok(())
}
