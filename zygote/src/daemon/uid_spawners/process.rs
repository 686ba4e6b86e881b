//! The spawner process itself: `zygote uid-spawner --uid UID`, started by
//! the daemon with its end of a socketpair on fd 3. It reads one plan at a
//! time, starts the child as the daemon's sibling, and answers with the
//! child's pidfd; it exits when the daemon closes the socket.

use std::os::fd::{AsFd, OwnedFd};

use zygote_proto::{RECV_BUFFER_BYTES, recv_frame_in, send_frame};

use super::wire::{self, Answer, Ask};
use crate::spawn::{self, SandboxFailure, SiblingChild, SpawnPlan, Spawner};

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
pub fn serve(uid: u32, seccomp: Option<&str>) -> u8 {
    // Nothing else the daemon passed stays open.
    let socket = match spawn::take_inherited_fd(SOCKET_FD) {
        Ok(socket) => socket,
        Err(error) => {
            eprintln!("zygote uid-spawner: no socket on fd {SOCKET_FD}: {error}");
            return 1;
        }
    };
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
        let (answer, fds) = start(&spawner, plan, uid, seccomp.is_some(), confined);
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

/// Starts the child of one plan, or its parked init (the plan's fds are
/// closed on return): the answer, and the fds to attach (the child's
/// pidfd first). `filtered`: this spawner holds a seccomp profile;
/// `confined`: its bounding set is empty.
fn start(
    spawner: &Spawner,
    plan: Option<(SpawnPlan, Ask)>,
    uid: u32,
    filtered: bool,
    confined: bool,
) -> (Answer, Vec<OwnedFd>) {
    let refused = |stage, errno| (Answer::Refused { stage, errno }, Vec::new());
    let Some((plan, ask)) = plan else {
        return refused(zygote_proto::SpawnStage::Validate, libc::EINVAL);
    };
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
    if let (true, Some(sandbox)) = (confined, plan.sandbox.as_mut()) {
        // Cleared on this process at start: inherited empty.
        sandbox.clear_bounding_set = false;
    }
    if ask == Ask::Park {
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
