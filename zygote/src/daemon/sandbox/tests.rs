use super::*;
use crate::daemon::policy::Policy;
use crate::spawn::MAX_MOUNTS;

fn policy(profile: &str) -> Result<Policy, String> {
    Policy::parse(&format!("[sandbox.p]\n{profile}\n"), 0)
}

#[test]
fn bad_profiles_are_refused_at_load_naming_the_item() {
    let cases = [
        ("ro_bind = [\"usr\"]", "not an absolute path"),
        ("ro_bind = [\"/usr/../etc\"]", "`..`"),
        ("ro_bind = [\"/usr:/proc/x\"]", "/proc"),
        ("seccomp = \"lenient\"", "\"lenient\""),
        ("seccomp_filter = \"ptrace now\"", "line 1"),
        ("hostname = \"box\"", "needs isolate"),
        ("network = \"maybe\"", "\"maybe\""),
        ("landlock_rw = [\"tmp\"]", "not an absolute path"),
    ];
    for (profile, expected) in cases {
        let error = policy(profile).unwrap_err();
        assert!(error.contains(expected), "{profile}: {error}");
        assert!(error.contains("[sandbox.p]"), "{profile}: {error}");
    }
    let many: Vec<String> = (0..=MAX_MOUNTS).map(|i| format!("\"/t{i}\"")).collect();
    let error = policy(&format!("tmpfs = [{}]", many.join(","))).unwrap_err();
    assert!(error.contains("more than the 64"), "{error}");
    let error = Policy::parse("[[peer]]\nuids = [1]\nsandbox = \"none\"\n", 0).unwrap_err();
    assert!(error.contains("\"none\""), "{error}");
}

fn sandboxes(profile: &str) -> Sandboxes {
    let policy = policy(profile).unwrap();
    Sandboxes::new(policy.sandbox_profiles(), 0, 0)
}

#[test]
fn an_imposed_profile_cannot_be_loosened() {
    let sandboxes = sandboxes("isolate = true\nseccomp = \"default\"\nro_bind = [\"/usr\"]");
    let loosen = [
        SandboxSpec {
            isolate: false,
            seccomp: Some(SeccompSpec::Profile("default".into())),
            ..SandboxSpec::default()
        },
        SandboxSpec {
            isolate: true,
            ..SandboxSpec::default()
        },
        SandboxSpec {
            profile: Some("other".into()),
            ..SandboxSpec::default()
        },
    ];
    for request in &loosen {
        let refusal = sandboxes.resolve(Some(request), Some("p")).unwrap_err();
        assert_eq!(refusal.errno, libc::EPERM, "{request:?}: {refusal:?}");
    }
    // Naming the profile, a request adds to it: a tmpfs, not a bind.
    let mut adds = SandboxSpec {
        profile: Some("p".into()),
        filesystem: Some(FilesystemSpec {
            mounts: vec![MountSpec {
                kind: MountKind::Tmpfs,
                source: Vec::new(),
                destination: b"/tmp".to_vec(),
            }],
        }),
        ..SandboxSpec::default()
    };
    let (plan, applied) = sandboxes.resolve(Some(&adds), Some("p")).unwrap().unwrap();
    assert_eq!(plan.filesystem.as_ref().map(Vec::len), Some(2));
    assert_eq!(applied.profile.as_deref(), Some("p"));
    assert_eq!(applied.seccomp.as_deref(), Some("default"));
    assert!(plan.clone_flags & libc::CLONE_NEWPID != 0);
    if let Some(filesystem) = &mut adds.filesystem {
        filesystem.mounts[0].kind = MountKind::Bind;
        filesystem.mounts[0].source = b"/etc".to_vec();
    }
    let refusal = sandboxes.resolve(Some(&adds), Some("p")).unwrap_err();
    assert!(refusal.message.contains("/etc"), "{refusal:?}");
    // No request at all: the imposed profile, whole.
    let (plan, _) = sandboxes.resolve(None, Some("p")).unwrap().unwrap();
    assert_eq!(plan.seccomp.len(), 1);
}

/// Only a policy profile's own Landlock rules may be held by a spawner:
/// marked with a fingerprint of the profile and its rules, which a
/// request's rules never get.
#[test]
fn only_a_profiles_landlock_rules_are_marked_to_be_held() {
    if crate::spawn::landlock_abi() == 0 {
        eprintln!("skipped: this kernel has no Landlock");
        return;
    }
    let sandboxes = sandboxes("landlock_rx = [\"/\"]\nlandlock_rw = [\"/tmp\"]");
    let fingerprint = |plan: &SandboxPlan| -> Vec<Option<u64>> {
        plan.landlock.iter().map(|ruleset| ruleset.held).collect()
    };
    let (imposed, _) = sandboxes.resolve(None, Some("p")).unwrap().unwrap();
    let (again, _) = sandboxes.resolve(None, Some("p")).unwrap().unwrap();
    let [Some(held)] = fingerprint(&imposed)[..] else {
        panic!("{imposed:?}");
    };
    assert_eq!(fingerprint(&again), [Some(held)]);
    let narrower = SandboxSpec {
        landlock: Some(LandlockSpec {
            read_execute: vec![b"/".to_vec()],
            ..LandlockSpec::default()
        }),
        ..SandboxSpec::default()
    };
    let (stacked, _) = sandboxes
        .resolve(Some(&narrower), Some("p"))
        .unwrap()
        .unwrap();
    assert_eq!(fingerprint(&stacked), [Some(held), None]);
    let (alone, _) = sandboxes.resolve(Some(&narrower), None).unwrap().unwrap();
    assert_eq!(fingerprint(&alone), [None]);
    let other = super::landlock::fingerprint("p", &LandlockSpec::default());
    assert_ne!(other, held, "other rules, another fingerprint");
}

#[test]
fn paths_are_checked_and_made_relative() {
    assert_eq!(check_path("x", b"/usr//lib/./x").unwrap(), b"usr/lib/x");
    assert!(check_path("x", b"usr").is_err());
    assert!(check_path("x", b"/a/../b").is_err());
    assert!(check_path("x", b"/a\0b").is_err());
}
