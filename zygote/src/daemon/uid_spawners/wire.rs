//! The messages between the daemon and a spawner process: a plan with its
//! fds, and the child (its pidfd attached) or the refusal. Both ends are
//! the same binary, so the layout is private: postcard, no versioning.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};
use zygote_proto::{Env, ResourceLimit, SpawnStage};

use crate::spawn::{Credentials, SpawnPlan};

/// The largest plan sent to a spawner, a frame the spawner receives
/// whole: a larger one (a large argv and environment, or a long PATH's
/// thousands of exec candidates) takes the fork path, which copies
/// nothing.
pub(super) const MAX_PLAN_BYTES: usize = zygote_proto::MAX_FRAME_BYTES;

/// A [`SpawnPlan`] as the daemon sends it, borrowing the plan; the fds
/// travel beside it (the plan's in order, then the cgroup directory).
#[derive(Serialize)]
struct PlanOut<'a> {
    exec_candidates: &'a [CString],
    argv: &'a [CString],
    envp: &'a Env,
    cwd: Option<&'a CStr>,
    targets: Vec<RawFd>,
    new_session: bool,
    controlling_terminal: bool,
    process_group: Option<i32>,
    umask: Option<u32>,
    rlimits: &'a [ResourceLimit],
    credentials: (u32, u32, &'a [u32]),
    cgroup: bool,
    ignored_signals: u64,
    nice: Option<i32>,
    cpu_affinity: &'a [u64],
    oom_score_adj: Option<i32>,
}

/// [`PlanOut`] as the spawner receives it, field for field.
#[derive(Deserialize)]
struct PlanIn {
    exec_candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Env,
    cwd: Option<CString>,
    targets: Vec<RawFd>,
    new_session: bool,
    controlling_terminal: bool,
    process_group: Option<i32>,
    umask: Option<u32>,
    rlimits: Vec<ResourceLimit>,
    credentials: (u32, u32, Vec<u32>),
    cgroup: bool,
    ignored_signals: u64,
    nice: Option<i32>,
    cpu_affinity: Vec<u64>,
    oom_score_adj: Option<i32>,
}

/// The spawner's answer to one plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Answer {
    /// A child exists (its pidfd is attached): exec'd, or failed at
    /// `failure` and exiting.
    Started {
        pid: i32,
        failure: Option<(SpawnStage, i32)>,
    },
    /// No child was created.
    Refused { stage: SpawnStage, errno: i32 },
}

/// Encodes `plan` and lists the fds to attach; `None` when it must take
/// another path: no credentials, too large, or too many fds.
pub(super) fn encode_plan(plan: &SpawnPlan) -> Option<(Vec<u8>, Vec<BorrowedFd<'_>>)> {
    // A sandbox is set up by the daemon's own child, never a spawner's:
    // the plan would lose it on the way.
    if plan.sandbox.is_some() {
        return None;
    }
    let credentials = plan.credentials.as_ref()?;
    let mut fds: Vec<BorrowedFd<'_>> = plan.fds.iter().map(|(fd, _)| fd.as_fd()).collect();
    fds.extend(plan.cgroup.as_ref().map(AsFd::as_fd));
    if fds.len() > zygote_proto::MAX_FDS_PER_FRAME {
        return None;
    }
    let out = PlanOut {
        exec_candidates: &plan.exec_candidates,
        argv: &plan.argv,
        envp: &plan.envp,
        cwd: plan.cwd.as_deref(),
        targets: plan.fds.iter().map(|(_, target)| *target).collect(),
        new_session: plan.new_session,
        controlling_terminal: plan.controlling_terminal,
        process_group: plan.process_group,
        umask: plan.umask,
        rlimits: &plan.rlimits,
        credentials: (credentials.uid, credentials.gid, &credentials.groups),
        cgroup: plan.cgroup.is_some(),
        ignored_signals: plan.ignored_signals,
        nice: plan.nice,
        cpu_affinity: &plan.cpu_affinity,
        oom_score_adj: plan.oom_score_adj,
    };
    let bytes = zygote_proto::encode(&out).ok()?;
    (bytes.len() <= MAX_PLAN_BYTES).then_some((bytes, fds))
}

/// Rebuilds the plan from its bytes and fds; `None` when they do not fit
/// together (the daemon never sends such a frame).
pub(super) fn decode_plan(bytes: &[u8], fds: Vec<OwnedFd>) -> Option<SpawnPlan> {
    let plan: PlanIn = zygote_proto::decode(bytes).ok()?;
    if fds.len() != plan.targets.len() + usize::from(plan.cgroup) {
        return None;
    }
    let mut fds = fds.into_iter();
    let mapped: Vec<(OwnedFd, RawFd)> = fds.by_ref().zip(plan.targets).collect();
    let cgroup = fds.next();
    let (uid, gid, groups) = plan.credentials;
    Some(SpawnPlan {
        exec_candidates: plan.exec_candidates,
        argv: plan.argv,
        envp: plan.envp,
        cwd: plan.cwd,
        fds: mapped,
        new_session: plan.new_session,
        controlling_terminal: plan.controlling_terminal,
        process_group: plan.process_group,
        umask: plan.umask,
        rlimits: plan.rlimits,
        credentials: Some(Credentials { uid, gid, groups }),
        cgroup,
        ignored_signals: plan.ignored_signals,
        nice: plan.nice,
        cpu_affinity: plan.cpu_affinity,
        oom_score_adj: plan.oom_score_adj,
        sandbox: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn null() -> OwnedFd {
        std::fs::File::open("/dev/null").expect("/dev/null").into()
    }

    fn sample() -> SpawnPlan {
        let mut envp = Env::new();
        envp.push(b"PATH", b"/bin");
        SpawnPlan {
            exec_candidates: vec![c"/bin/true".to_owned()],
            argv: vec![c"true".to_owned(), c"x".to_owned()],
            envp,
            cwd: Some(c"/tmp".to_owned()),
            fds: vec![(null(), 0), (null(), 1), (null(), 2), (null(), 7)],
            new_session: true,
            controlling_terminal: false,
            process_group: Some(3),
            umask: Some(0o27),
            rlimits: vec![ResourceLimit {
                resource: 7,
                soft: 10,
                hard: 20,
            }],
            credentials: Some(Credentials {
                uid: 1901,
                gid: 1902,
                groups: vec![4, 5],
            }),
            cgroup: Some(null()),
            ignored_signals: 1 << 12,
            nice: Some(5),
            cpu_affinity: vec![3],
            oom_score_adj: Some(100),
            sandbox: None,
        }
    }

    #[test]
    fn a_plan_arrives_whole_with_its_fds_in_place() {
        let plan = sample();
        let (bytes, fds) = encode_plan(&plan).expect("encodes");
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|fd| fd.try_clone_to_owned().expect("dup"))
            .collect();
        assert_eq!(owned.len(), 5, "four mapped fds and the cgroup");
        let back = decode_plan(&bytes, owned).expect("decodes");
        assert_eq!(back.exec_candidates, plan.exec_candidates);
        assert_eq!(back.argv, plan.argv);
        assert_eq!(back.envp, plan.envp);
        assert_eq!(back.cwd, plan.cwd);
        let targets: Vec<RawFd> = back.fds.iter().map(|(_, target)| *target).collect();
        assert_eq!(targets, [0, 1, 2, 7]);
        assert!(back.cgroup.is_some());
        assert_eq!(back.credentials, plan.credentials);
        assert_eq!(
            (back.new_session, back.process_group, back.umask),
            (true, Some(3), Some(0o27))
        );
        assert_eq!(back.rlimits, plan.rlimits);
        assert_eq!(
            (back.ignored_signals, back.nice, back.oom_score_adj),
            (1 << 12, Some(5), Some(100))
        );
        assert_eq!(back.cpu_affinity, [3]);
    }

    #[test]
    fn fds_that_do_not_match_the_plan_are_refused() {
        let plan = sample();
        let (bytes, _) = encode_plan(&plan).expect("encodes");
        assert!(decode_plan(&bytes, vec![null()]).is_none());
    }

    #[test]
    fn plans_without_credentials_or_too_large_take_another_path() {
        let mut plan = sample();
        plan.credentials = None;
        assert!(encode_plan(&plan).is_none(), "no credentials");
        let mut plan = sample();
        plan.argv = vec![CString::new(vec![b'a'; MAX_PLAN_BYTES]).expect("no NUL")];
        assert!(encode_plan(&plan).is_none(), "too large");
        let mut plan = sample();
        plan.sandbox = Some(crate::spawn::SandboxPlan::default());
        assert!(
            encode_plan(&plan).is_none(),
            "a sandbox is the daemon's own child's to set up"
        );
    }
}
