//! The messages between the daemon and a spawner process: a plan with its
//! fds, and the child (its pidfd attached) or the refusal. Both ends are
//! the same binary, so the layout is private: postcard, no versioning.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use zygote_proto::{Env, ResourceLimit, SpawnStage};

use crate::spawn::{
    Credentials, LandlockPlan, Mount, MountKind, SandboxPlan, SeccompProgram, SpawnPlan,
};

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
    credentials: Option<(u32, u32, &'a [u32])>,
    cgroup: bool,
    ignored_signals: u64,
    nice: Option<i32>,
    cpu_affinity: &'a [u64],
    oom_score_adj: Option<i32>,
    sandbox: Option<SandboxOut<'a>>,
    /// A parked init's: whether made at the usual priority.
    park: Option<bool>,
}

/// A [`SandboxPlan`] as the daemon sends it; its fds (the network
/// namespace, the `/dev` template, one per Landlock ruleset, the parked
/// init's pidfd, then the mount template's) travel after the cgroup's.
#[derive(Serialize)]
struct SandboxOut<'a> {
    clone_flags: i32,
    netns: bool,
    dev_template: bool,
    hostname: Option<&'a [u8]>,
    filesystem: Option<Vec<(u8, &'a CStr, &'a CStr)>>,
    seccomp: Vec<(&'a str, Vec<Instruction>)>,
    landlock: Vec<RulesetOut<'a>>,
    clear_bounding_set: bool,
    enter: bool,
    build_template: bool,
    mount_template: bool,
}

/// A Landlock ruleset's path rules (path, rights), the rights that apply
/// to a file, and the fingerprint of a profile's rules a spawner may hold.
type RulesetOut<'a> = (Vec<(&'a CStr, u64)>, u64, Option<u64>);

/// [`RulesetOut`] as the spawner receives it.
type RulesetIn = (Vec<(CString, u64)>, u64, Option<u64>);

/// A BPF instruction: `code`, `jt`, `jf`, `k`.
type Instruction = (u16, u8, u8, u32);

/// [`SandboxOut`] as the spawner receives it.
#[derive(Deserialize)]
struct SandboxIn {
    clone_flags: i32,
    netns: bool,
    dev_template: bool,
    hostname: Option<Vec<u8>>,
    filesystem: Option<Vec<(u8, CString, CString)>>,
    seccomp: Vec<(String, Vec<Instruction>)>,
    landlock: Vec<RulesetIn>,
    clear_bounding_set: bool,
    enter: bool,
    build_template: bool,
    mount_template: bool,
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
    credentials: Option<(u32, u32, Vec<u32>)>,
    cgroup: bool,
    ignored_signals: u64,
    nice: Option<i32>,
    cpu_affinity: Vec<u64>,
    oom_score_adj: Option<i32>,
    sandbox: Option<SandboxIn>,
    park: Option<bool>,
}

/// The spawner's answer to one plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Answer {
    /// A child exists (its pidfd is attached): exec'd, or failed at
    /// `failure` (the stage, errno and packed sandbox step) and exiting.
    Started {
        pid: i32,
        failure: Option<(SpawnStage, i32, u16)>,
    },
    /// No child was created.
    Refused { stage: SpawnStage, errno: i32 },
    /// A parked init exists, setting up: its pidfd, status pipe (read
    /// end) and release pipe (write end) are attached, in that order.
    Parked { pid: i32 },
}

/// What the daemon asks of a spawner for a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
    /// The plan's child.
    Child,
    /// A parked init for the plan's sandbox (`Spawner::park_sibling`),
    /// made in the background unless `behind`: a spawn just found none
    /// ready, and the next must not be late too.
    Park { behind: bool },
}

/// Encodes `plan` and lists the fds to attach; `None` when it must take
/// another path: neither credentials nor a sandbox, a sandbox a vforked
/// child cannot set up (unless parked: an init is forked), too large, or
/// too many fds. With `seccomp_inherited`, the sandbox's seccomp programs
/// stay behind: the spawner holds the filter, and its child inherits it.
pub(super) fn encode_plan(
    plan: &SpawnPlan,
    seccomp_inherited: bool,
    ask: Ask,
) -> Option<(Vec<u8>, Vec<BorrowedFd<'_>>)> {
    if plan.credentials.is_none() && plan.sandbox.is_none() {
        return None;
    }
    let park = matches!(ask, Ask::Park { .. });
    let sandbox = match &plan.sandbox {
        Some(sandbox) if !park && !sandbox.suits_vfork() => return None,
        Some(sandbox) => Some(encode_sandbox(sandbox, seccomp_inherited)),
        None => None,
    };
    let mut fds: Vec<BorrowedFd<'_>> = plan.fds.iter().map(|(fd, _)| fd.as_fd()).collect();
    fds.extend(plan.cgroup.as_ref().map(AsFd::as_fd));
    if let Some(sandbox) = &plan.sandbox {
        fds.extend(sandbox.netns.iter().map(|netns| netns.as_fd()));
        fds.extend(sandbox.dev_template.iter().map(|dev| dev.as_fd()));
        fds.extend(
            sandbox
                .landlock
                .iter()
                .map(|landlock| landlock.ruleset.as_fd()),
        );
        fds.extend(sandbox.enter.iter().map(|init| init.as_fd()));
        fds.extend(
            sandbox
                .mount_template
                .iter()
                .map(|template| template.as_fd()),
        );
    }
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
        credentials: plan
            .credentials
            .as_ref()
            .map(|c| (c.uid, c.gid, c.groups.as_slice())),
        cgroup: plan.cgroup.is_some(),
        ignored_signals: plan.ignored_signals,
        nice: plan.nice,
        cpu_affinity: &plan.cpu_affinity,
        oom_score_adj: plan.oom_score_adj,
        sandbox,
        park: match ask {
            Ask::Park { behind } => Some(behind),
            Ask::Child => None,
        },
    };
    let bytes = zygote_proto::encode(&out).ok()?;
    (bytes.len() <= MAX_PLAN_BYTES).then_some((bytes, fds))
}

fn encode_sandbox(plan: &SandboxPlan, seccomp_inherited: bool) -> SandboxOut<'_> {
    let seccomp = if seccomp_inherited {
        &[][..]
    } else {
        plan.seccomp.as_slice()
    };
    SandboxOut {
        clone_flags: plan.clone_flags,
        netns: plan.netns.is_some(),
        dev_template: plan.dev_template.is_some(),
        hostname: plan.hostname.as_deref(),
        filesystem: plan.filesystem.as_ref().map(|mounts| {
            mounts
                .iter()
                .map(|mount| {
                    let kind = MOUNT_KINDS
                        .iter()
                        .position(|kind| *kind == mount.kind)
                        .and_then(|index| u8::try_from(index).ok())
                        .unwrap_or(u8::MAX);
                    (kind, mount.source.as_c_str(), mount.destination.as_c_str())
                })
                .collect()
        }),
        seccomp: seccomp
            .iter()
            .map(|program| {
                let filter = program
                    .filter
                    .iter()
                    .map(|op| (op.code, op.jt, op.jf, op.k))
                    .collect();
                (program.name.as_str(), filter)
            })
            .collect(),
        landlock: plan
            .landlock
            .iter()
            .map(|landlock| {
                let paths = landlock
                    .paths
                    .iter()
                    .map(|(path, access)| (path.as_c_str(), *access))
                    .collect();
                (paths, landlock.file_access, landlock.held)
            })
            .collect(),
        clear_bounding_set: plan.clear_bounding_set,
        enter: plan.enter.is_some(),
        build_template: plan.build_template,
        mount_template: plan.mount_template.is_some(),
    }
}

/// Mount kinds by their number on the wire.
const MOUNT_KINDS: [MountKind; 4] = [
    MountKind::ReadOnlyBind,
    MountKind::Bind,
    MountKind::Tmpfs,
    MountKind::Proc,
];

/// Rebuilds a sandbox from its data and its fds, taken from `fds` in the
/// order [`encode_plan`] attached them.
fn decode_sandbox(
    sandbox: SandboxIn,
    fds: &mut impl Iterator<Item = OwnedFd>,
    park: bool,
) -> Option<SandboxPlan> {
    let netns = if sandbox.netns {
        Some(Arc::new(fds.next()?))
    } else {
        None
    };
    let dev_template = if sandbox.dev_template {
        Some(Arc::new(fds.next()?))
    } else {
        None
    };
    let filesystem = match sandbox.filesystem {
        Some(mounts) => Some(
            mounts
                .into_iter()
                .map(|(kind, source, destination)| {
                    Some(Mount {
                        kind: *MOUNT_KINDS.get(usize::from(kind))?,
                        source,
                        destination,
                    })
                })
                .collect::<Option<Vec<_>>>()?,
        ),
        None => None,
    };
    let seccomp = sandbox
        .seccomp
        .into_iter()
        .map(|(name, filter)| {
            let filter = filter
                .into_iter()
                .map(|(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
                .collect();
            Arc::new(SeccompProgram { name, filter })
        })
        .collect();
    let landlock = sandbox
        .landlock
        .into_iter()
        .map(|(paths, file_access, held)| {
            Some(LandlockPlan {
                ruleset: fds.next()?,
                paths,
                file_access,
                held,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let enter = if sandbox.enter {
        Some(Arc::new(fds.next()?))
    } else {
        None
    };
    let mount_template = if sandbox.mount_template {
        Some(Arc::new(fds.next()?))
    } else {
        None
    };
    let plan = SandboxPlan {
        clone_flags: sandbox.clone_flags,
        netns,
        dev_template,
        hostname: sandbox.hostname,
        filesystem,
        seccomp,
        landlock,
        inherited_landlock: Vec::new(),
        map_ids: None,
        fresh_proc: false,
        clear_bounding_set: sandbox.clear_bounding_set,
        enter,
        build_template: sandbox.build_template,
        mount_template,
    };
    (park || plan.suits_vfork()).then_some(plan)
}

/// Rebuilds the plan from its bytes and fds, and what is asked of it;
/// `None` when they do not fit together (the daemon never sends such a
/// frame).
pub(super) fn decode_plan(bytes: &[u8], fds: Vec<OwnedFd>) -> Option<(SpawnPlan, Ask)> {
    let plan: PlanIn = zygote_proto::decode(bytes).ok()?;
    let sandbox_fds = plan.sandbox.as_ref().map_or(0, |sandbox| {
        usize::from(sandbox.netns)
            + usize::from(sandbox.dev_template)
            + sandbox.landlock.len()
            + usize::from(sandbox.enter)
            + usize::from(sandbox.mount_template)
    });
    if fds.len() != plan.targets.len() + usize::from(plan.cgroup) + sandbox_fds {
        return None;
    }
    let mut fds = fds.into_iter();
    let mapped: Vec<(OwnedFd, RawFd)> = fds
        .by_ref()
        .take(plan.targets.len())
        .zip(plan.targets)
        .collect();
    let cgroup = if plan.cgroup { fds.next() } else { None };
    let sandbox = match plan.sandbox {
        Some(sandbox) => Some(decode_sandbox(sandbox, &mut fds, plan.park.is_some())?),
        None => None,
    };
    let ask = match plan.park {
        Some(behind) => Ask::Park { behind },
        None => Ask::Child,
    };
    let plan = SpawnPlan {
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
        credentials: plan
            .credentials
            .map(|(uid, gid, groups)| Credentials { uid, gid, groups }),
        cgroup,
        ignored_signals: plan.ignored_signals,
        nice: plan.nice,
        cpu_affinity: plan.cpu_affinity,
        oom_score_adj: plan.oom_score_adj,
        sandbox,
    };
    Some((plan, ask))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

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
        let (bytes, fds) = encode_plan(&plan, false, Ask::Child).expect("encodes");
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|fd| fd.try_clone_to_owned().expect("dup"))
            .collect();
        assert_eq!(owned.len(), 5, "four mapped fds and the cgroup");
        let (back, _) = decode_plan(&bytes, owned).expect("decodes");
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
        let (bytes, _) = encode_plan(&plan, false, Ask::Child).expect("encodes");
        assert!(decode_plan(&bytes, vec![null()]).is_none());
    }

    #[test]
    fn plans_without_credentials_or_too_large_take_another_path() {
        let mut plan = sample();
        plan.credentials = None;
        assert!(
            encode_plan(&plan, false, Ask::Child).is_none(),
            "no credentials"
        );
        let mut plan = sample();
        plan.argv = vec![CString::new(vec![b'a'; MAX_PLAN_BYTES]).expect("no NUL")];
        assert!(encode_plan(&plan, false, Ask::Child).is_none(), "too large");
        let mut plan = sample();
        plan.sandbox = Some(SandboxPlan {
            clone_flags: libc::CLONE_NEWNS | libc::CLONE_NEWPID,
            ..SandboxPlan::default()
        });
        assert!(
            encode_plan(&plan, false, Ask::Child).is_none(),
            "a new pid namespace's init would hold the spawner's vfork"
        );
        plan.credentials = None;
        plan.sandbox = Some(SandboxPlan::default());
        assert!(
            encode_plan(&plan, false, Ask::Child).is_some(),
            "a sandbox that keeps the daemon's ids goes to root's spawner"
        );
    }

    /// Every part of a sandbox arrives, its fds after the plan's own.
    #[test]
    fn a_sandbox_arrives_whole_with_its_fds() {
        let mut plan = sample();
        let filter = vec![libc::sock_filter {
            code: 6,
            jt: 1,
            jf: 2,
            k: 0x7fff_0000,
        }];
        plan.sandbox = Some(SandboxPlan {
            clone_flags: libc::CLONE_NEWNS | libc::CLONE_NEWIPC,
            netns: Some(Arc::new(null())),
            dev_template: Some(Arc::new(null())),
            hostname: Some(b"box".to_vec()),
            filesystem: Some(vec![
                Mount {
                    kind: MountKind::ReadOnlyBind,
                    source: c"/usr".to_owned(),
                    destination: c"usr".to_owned(),
                },
                Mount {
                    kind: MountKind::Tmpfs,
                    source: CString::default(),
                    destination: c"tmp".to_owned(),
                },
            ]),
            seccomp: vec![Arc::new(SeccompProgram {
                name: "default".into(),
                filter,
            })],
            landlock: vec![LandlockPlan {
                ruleset: null(),
                paths: vec![(c"/work".to_owned(), 0x1fff)],
                file_access: 0x0f,
                held: Some(0x5eed),
            }],
            inherited_landlock: Vec::new(),
            map_ids: None,
            fresh_proc: false,
            clear_bounding_set: true,
            enter: None,
            build_template: false,
            mount_template: None,
        });
        let (bytes, fds) = encode_plan(&plan, false, Ask::Child).expect("encodes");
        assert_eq!(
            fds.len(),
            8,
            "four mapped, the cgroup, netns, /dev, ruleset"
        );
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|fd| fd.try_clone_to_owned().expect("dup"))
            .collect();
        let (back, _) = decode_plan(&bytes, owned).expect("decodes");
        assert_eq!(back.fds.len(), 4);
        assert!(back.cgroup.is_some());
        let sandbox = back.sandbox.expect("a sandbox");
        assert_eq!(sandbox.clone_flags, libc::CLONE_NEWNS | libc::CLONE_NEWIPC);
        assert!(sandbox.netns.is_some());
        assert!(sandbox.dev_template.is_some());
        assert_eq!(sandbox.hostname.as_deref(), Some(&b"box"[..]));
        let mounts = sandbox.filesystem.expect("mounts");
        let mounts: Vec<_> = mounts
            .iter()
            .map(|m| (m.kind, m.source.as_c_str(), m.destination.as_c_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                (MountKind::ReadOnlyBind, c"/usr", c"usr"),
                (MountKind::Tmpfs, c"", c"tmp")
            ]
        );
        let [program] = sandbox.seccomp.as_slice() else {
            panic!("one program: {:?}", sandbox.seccomp);
        };
        assert_eq!(program.name, "default");
        let op = program.filter[0];
        assert_eq!((op.code, op.jt, op.jf, op.k), (6, 1, 2, 0x7fff_0000));
        let [landlock] = sandbox.landlock.as_slice() else {
            panic!("one ruleset: {:?}", sandbox.landlock);
        };
        assert_eq!(landlock.paths, [(c"/work".to_owned(), 0x1fff)]);
        assert_eq!(landlock.file_access, 0x0f);
        assert_eq!(landlock.held, Some(0x5eed));
        assert!(sandbox.clear_bounding_set);
        assert!(sandbox.enter.is_none());
        // One fd short: refused, not shifted.
        let short: Vec<OwnedFd> = fds
            .iter()
            .skip(1)
            .map(|fd| fd.try_clone_to_owned().expect("dup"))
            .collect();
        assert!(decode_plan(&bytes, short).is_none());
    }

    /// A plan entering a parked init (which has a new pid namespace, yet
    /// is vforked: the init exists) arrives with the init's pidfd last.
    #[test]
    fn a_plan_entering_a_parked_init_arrives_with_its_pidfd() {
        let mut plan = sample();
        let init = null();
        let init_number = init.as_raw_fd();
        plan.sandbox = Some(SandboxPlan {
            clone_flags: libc::CLONE_NEWNS | libc::CLONE_NEWPID,
            netns: Some(Arc::new(null())),
            enter: Some(Arc::new(init)),
            ..SandboxPlan::default()
        });
        let (sandbox, ask, last) = round_trip(&plan, Ask::Child);
        assert_eq!((ask, last), (Ask::Child, Some(init_number)));
        assert!(sandbox.enter.is_some());
        assert!(sandbox.netns.is_some());
        assert_eq!(sandbox.namespaces_to_make(), 0);
        plan.sandbox.as_mut().expect("a sandbox").enter = None;
        assert!(
            encode_plan(&plan, false, Ask::Child).is_none(),
            "without an init to enter, its own init would hold the spawner's vfork"
        );
        // A parked init for it is forked: it may go to a spawner.
        let (sandbox, ask, _) = round_trip(&plan, Ask::Park { behind: true });
        assert_eq!(ask, Ask::Park { behind: true });
        assert!(sandbox.enter.is_none());
    }

    /// The sandbox of `plan` sent with `ask`, as the spawner gets it, what
    /// it is asked, and the number of the last fd sent.
    fn round_trip(plan: &SpawnPlan, ask: Ask) -> (SandboxPlan, Ask, Option<RawFd>) {
        let (bytes, fds) = encode_plan(plan, false, ask).expect("a spawner takes it");
        let last = fds.last().map(|fd| fd.as_raw_fd());
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|fd| fd.try_clone_to_owned().expect("dup"))
            .collect();
        let (back, asked) = decode_plan(&bytes, owned).expect("decodes");
        (back.sandbox.expect("a sandbox"), asked, last)
    }

    /// A mount template is built from a plan that says so, and an init
    /// that copies one gets its holder's pidfd, after the netns's.
    #[test]
    fn a_parked_init_copying_a_mount_template_arrives_with_its_pidfd() {
        let mut plan = sample();
        let template = null();
        let template_number = template.as_raw_fd();
        plan.sandbox = Some(SandboxPlan {
            clone_flags: libc::CLONE_NEWNS | libc::CLONE_NEWPID,
            netns: Some(Arc::new(null())),
            filesystem: Some(Vec::new()),
            mount_template: Some(Arc::new(template)),
            ..SandboxPlan::default()
        });
        let (sandbox, ask, last) = round_trip(&plan, Ask::Park { behind: false });
        assert_eq!(ask, Ask::Park { behind: false }, "made in the background");
        assert_eq!(last, Some(template_number));
        assert!(sandbox.mount_template.is_some());
        assert!(!sandbox.build_template);
        assert_eq!(sandbox.namespaces_to_make(), libc::CLONE_NEWPID);
        let sandbox = plan.sandbox.as_mut().expect("a sandbox");
        sandbox.mount_template = None;
        sandbox.build_template = true;
        let (sandbox, _, _) = round_trip(&plan, Ask::Park { behind: true });
        assert!(sandbox.build_template);
        assert!(sandbox.mount_template.is_none());
    }
}
