//! A cgroup per child, against a real daemon with a cgroup
//! subtree of its own: whole-tree kill, tree-wide accounting, no cgroup
//! left behind, and limits refused where the kernel cannot enforce them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

use zygote_client::Stdio;
use zygote_client::blocking::{Client, Command};

use crate::util::{
    Daemon, eventually, exit_within, process_state, start_daemon, start_daemon_custom,
    start_daemon_with, zygote_bin,
};

/// A cgroup v2 directory for one test daemon; on drop, whatever is left in
/// it is killed and the whole tree removed.
pub(crate) struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    /// `None` (after saying why on stderr) where there is no writable
    /// cgroup2 mount with `cgroup.kill`.
    pub(crate) fn new(test: &str) -> Option<Self> {
        let Some(mount) = cgroup2_mount() else {
            crate::util::skip(&format!("{test}: no cgroup2 file system mounted"));
            return None;
        };
        if !mount.join("cgroup.procs").exists() || rustix::process::geteuid().as_raw() != 0 {
            crate::util::skip(&format!(
                "{test}: cgroup2 at {} is not writable here",
                mount.display()
            ));
            return None;
        }
        let path = mount.join(format!("zygote-test-{test}-{}", std::process::id()));
        std::fs::create_dir(&path).expect("create the test's cgroup");
        if !path.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&path);
            crate::util::skip(&format!("{test}: no cgroup.kill (needs Linux 5.14)"));
            return None;
        }
        Some(Self { path })
    }

    pub(crate) fn arg(&self) -> String {
        self.path.display().to_string()
    }

    /// Child cgroups under `peers/<uid>/`.
    fn children(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let Ok(uids) = std::fs::read_dir(self.path.join("peers")) else {
            return found;
        };
        for uid in uids.flatten().filter(|entry| entry.path().is_dir()) {
            for child in std::fs::read_dir(uid.path()).unwrap().flatten() {
                if child.path().is_dir() {
                    found.push(child.path());
                }
            }
        }
        found
    }

    fn controllers(&self) -> String {
        std::fs::read_to_string(self.path.join("cgroup.controllers")).unwrap_or_default()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(self.path.join("cgroup.events"))
                .is_ok_and(|events| events.contains("populated 0"))
        });
        remove_tree(&self.path);
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        (after.split_whitespace().next()? == "cgroup2")
            .then(|| before.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

/// Gone entirely: not even a zombie, so the subreaper reaped it.
fn gone(pid: u32) -> bool {
    process_state(pid).is_none()
}

fn daemon_in(cgroup: &TestCgroup, test: &str) -> Daemon {
    start_daemon_with(test, None, &["--cgroup", &cgroup.arg()])
}

/// A shell whose grandchild double-forks and `setsid`s: it leaves the
/// child's process group and session, and is orphaned at once. Returns the
/// child and the grandchild's pid.
fn escaping_grandchild(command: &mut Command) -> (zygote_client::blocking::Child, u32) {
    command
        .args([
            "-c",
            "(setsid sh -c 'echo $$; exec sleep 300' &); exec sleep 300",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_tree(true);
    let mut child = command.spawn().expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .unwrap();
    let grandchild = line.trim().parse().expect("the grandchild's pid");
    (child, grandchild)
}

/// A child started into a cgroup of its own (`clone3` with
/// `CLONE_INTO_CGROUP`, or joining it itself on older kernels) starts
/// under `SCHED_OTHER`, though the daemon runs under `SCHED_BATCH`.
#[test]
fn a_child_in_a_cgroup_of_its_own_starts_under_sched_other() {
    let Some(cgroup) = TestCgroup::new("sched") else {
        return;
    };
    let daemon = daemon_in(&cgroup, "cgroup-sched");
    let client = Client::connect(daemon.socket()).expect("connect");
    let output = Command::new(&client, "/bin/sh")
        .args([
            "-c",
            "cut -d ' ' -f 41 /proc/self/stat; cat /proc/self/cgroup",
        ])
        .kill_tree(true)
        .stdout(Stdio::piped())
        .output()
        .expect("run sh");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("0"), "SCHED_OTHER\n{}", daemon.log());
    assert!(
        lines.any(|line| line.starts_with("0::") && line.contains("/peers/")),
        "in a cgroup of its own: {text}"
    );
}

/// A child in a new pid namespace is forked, not vforked with
/// `CLONE_INTO_CGROUP`: it joins its cgroup itself, first thing.
#[test]
fn a_forked_child_joins_its_cgroup_itself() {
    let Some(cgroup) = TestCgroup::new("forked") else {
        return;
    };
    let daemon = daemon_in(&cgroup, "cgroup-forked");
    let client = Client::connect(daemon.socket()).expect("connect");
    let output = Command::new(&client, "/bin/cat")
        .arg("/proc/self/cgroup")
        .sandbox(zygote_client::Sandbox::new().isolate())
        .kill_tree(true)
        .stdout(Stdio::piped())
        .output()
        .expect("run cat");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}\n{}", daemon.log());
    assert!(
        text.lines()
            .any(|line| line.starts_with("0::") && line.contains("/peers/")),
        "in a cgroup of its own: {text}"
    );
}

#[test]
fn a_timeout_kills_a_grandchild_that_escaped_by_setsid() {
    let Some(cgroup) = TestCgroup::new("timeout-tree") else {
        return;
    };
    let daemon = daemon_in(&cgroup, "cgroup-timeout-tree");
    let client = Client::connect(daemon.socket()).expect("connect");
    let mut command = Command::new(&client, "/bin/sh");
    command
        .timeout(Duration::from_millis(300))
        .timeout_grace(Duration::from_millis(200));
    let (mut child, grandchild) = escaping_grandchild(&mut command);
    assert_ne!(process_state(grandchild), None, "the grandchild runs");
    let status = exit_within(Duration::from_secs(30), "the timed-out child", || {
        child.try_wait()
    });
    assert!(status.timed_out());
    assert!(
        eventually(Duration::from_secs(10), || gone(grandchild)),
        "the setsid grandchild outlived the timeout (state {:?})",
        process_state(grandchild)
    );
    assert!(
        eventually(Duration::from_secs(10), || cgroup.children().is_empty()),
        "cgroups left: {:?}",
        cgroup.children()
    );
    assert!(daemon.zombies().is_empty(), "the subreaper left zombies");
}

#[test]
fn kill_on_close_kills_a_grandchild_that_escaped_by_setsid() {
    let Some(cgroup) = TestCgroup::new("close-tree") else {
        return;
    };
    let daemon = daemon_in(&cgroup, "cgroup-close-tree");
    let client = Client::connect(daemon.socket()).expect("connect");
    let mut command = Command::new(&client, "/bin/sh");
    command.kill_on_close(libc::SIGKILL);
    let (child, grandchild) = escaping_grandchild(&mut command);
    assert_eq!(cgroup.children().len(), 1, "one cgroup for the child");
    drop(child);
    drop(command);
    drop(client);
    assert!(
        eventually(Duration::from_secs(10), || gone(grandchild)),
        "the setsid grandchild outlived kill-on-close (state {:?})",
        process_state(grandchild)
    );
    assert!(
        eventually(Duration::from_secs(10), || cgroup.children().is_empty()),
        "cgroups left: {:?}",
        cgroup.children()
    );
}

#[test]
fn child_kill_with_kill_tree_ends_the_whole_tree() {
    let Some(cgroup) = TestCgroup::new("kill-tree") else {
        return;
    };
    let daemon = daemon_in(&cgroup, "cgroup-kill-tree");
    let client = Client::connect(daemon.socket()).expect("connect");
    let mut command = Command::new(&client, "/bin/sh");
    let (mut child, grandchild) = escaping_grandchild(&mut command);
    child.kill().unwrap();
    let status = exit_within(Duration::from_secs(30), "the killed child", || {
        child.try_wait()
    });
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(
        eventually(Duration::from_secs(10), || gone(grandchild)),
        "the setsid grandchild outlived Child::kill"
    );
    assert!(eventually(Duration::from_secs(10), || cgroup
        .children()
        .is_empty()));
}

#[test]
fn tree_cpu_time_counts_a_grandchild_the_child_never_waited_for() {
    let Some(cgroup) = TestCgroup::new("cpu-tree") else {
        return;
    };
    let daemon = daemon_in(&cgroup, "cgroup-cpu-tree");
    let client = Client::connect(daemon.socket()).expect("connect");
    // The child exits at once; its orphaned grandchild burns CPU after.
    let burn = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";
    let mut child = Command::new(&client, "/bin/sh")
        .args(["-c", &format!("(sh -c '{burn}' &); exit 0")])
        .stdin(Stdio::null())
        .wait_tree(true)
        .spawn()
        .unwrap();
    let status = exit_within(Duration::from_secs(30), "the child", || child.try_wait());
    assert!(status.success());
    let tree = status.tree_usage().expect("tree usage in the exit notice");
    let tree_cpu = tree.user_micros + tree.system_micros;
    let own = child.usage().expect("the child's rusage");
    let usage = u64::try_from((own.user_time + own.system_time).as_micros()).unwrap();
    assert!(
        tree_cpu > usage + 50_000,
        "tree CPU {tree_cpu} µs should exceed the child's own {usage} µs by the grandchild's work"
    );
    assert_eq!(tree.oom_kills, 0);
    assert!(eventually(Duration::from_secs(10), || cgroup
        .children()
        .is_empty()));
}

#[test]
fn no_cgroup_is_left_after_1000_spawns() {
    let Some(cgroup) = TestCgroup::new("churn") else {
        return;
    };
    let daemon = daemon_in(&cgroup, "cgroup-churn");
    let client = Client::connect(daemon.socket()).expect("connect");
    // Plain spawns reuse a few spare cgroups; spawns with a CgroupSpec get
    // fresh ones, removed after their exit notice.
    for i in 0..1000 {
        let mut command = Command::new(&client, "true");
        if i % 2 == 0 {
            command.wait_tree(true);
        }
        assert!(command.status().unwrap().success());
    }
    let settled = || {
        let left = cgroup.children();
        left.len() <= 16
            && left.iter().all(|path| {
                std::fs::read_to_string(path.join("cgroup.events"))
                    .is_ok_and(|events| events.contains("populated 0"))
            })
    };
    assert!(
        eventually(Duration::from_secs(10), settled),
        "{} cgroups left after 1000 spawns (at most 16 empty spares expected)",
        cgroup.children().len()
    );
    assert!(daemon.zombies().is_empty());
}

#[test]
fn limits_without_a_delegated_controller_are_refused() {
    let Some(cgroup) = TestCgroup::new("refused") else {
        return;
    };
    let daemon = daemon_in(&cgroup, "cgroup-refused");
    let client = Client::connect(daemon.socket()).expect("connect");
    let controllers = cgroup.controllers();
    if controllers.split_whitespace().any(|name| name == "memory") {
        eprintln!("memory controller delegated here: the refusal path is not reachable");
    } else {
        let error = Command::new(&client, "true")
            .memory_max(512 << 20)
            .status()
            .expect_err("memory.max cannot be enforced here");
        let message = error.to_string();
        assert!(
            message.contains("memory.max requested")
                && message.contains("memory controller is not delegated"),
            "{message}"
        );
        assert!(
            cgroup.children().is_empty(),
            "a refused spawn left a cgroup"
        );
    }
    // The connection carries on.
    assert!(Command::new(&client, "true").status().unwrap().success());
}

#[test]
fn a_peer_cannot_exceed_its_pids_cap() {
    let Some(cgroup) = TestCgroup::new("pids") else {
        return;
    };
    let policy = "[limits]\npeer_pids_max = 4\n";
    if !cgroup
        .controllers()
        .split_whitespace()
        .any(|name| name == "pids")
    {
        crate::util::skip(&format!(
            "the cap's enforcement: pids controller not delegated to {} (testing the refusal \
             instead)",
            cgroup.path.display()
        ));
        let output = std::process::Command::new(crate::util::zygote_bin())
            .args(["serve", "--socket", "/nonexistent/zygote.sock", "--cgroup"])
            .arg(&cgroup.path)
            .arg("--policy")
            .arg(write_policy(policy).path())
            .output()
            .expect("run zygote serve");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(
            stderr.contains("pids_max requested")
                && stderr.contains("pids controller is not delegated"),
            "{stderr}"
        );
        return;
    }
    let daemon = start_daemon_with("cgroup-pids", Some(policy), &["--cgroup", &cgroup.arg()]);
    let client = Client::connect(daemon.socket()).expect("connect");
    let output = Command::new(&client, "/bin/sh")
        .args(["-c", "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait"])
        .stderr(Stdio::piped())
        .kill_tree(true)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("fork"),
        "the shell should fail to fork past pids.max"
    );
}

/// A policy file, removed when the returned handle is dropped.
fn write_policy(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new()
        .prefix("zygote-policy-")
        .suffix(".toml")
        .tempfile()
        .expect("create a policy file");
    std::fs::write(file.path(), text).expect("write the policy file");
    file
}

/// A daemon that withholds `cgroups` (as a test asks with
/// `ZYGOTE_MASK_FEATURES`) refuses a cgroup request by the feature's
/// name, although its subtree could take it, and keeps serving.
#[test]
fn a_withheld_cgroups_feature_is_refused_by_name_though_a_subtree_exists() {
    let test = "cgroup-withheld";
    let Some(cgroup) = TestCgroup::new(test) else {
        return;
    };
    let masked = [("ZYGOTE_MASK_FEATURES", "cgroups")];
    let flags = ["--cgroup", &cgroup.arg()];
    let daemon = start_daemon_custom(test, None, None, &flags, &zygote_bin(), &masked);
    let client = Client::connect(daemon.socket()).expect("connect");
    let error = Command::new(&client, "true")
        .kill_tree(true)
        .status()
        .expect_err("cgroups are withheld");
    assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP), "{error}");
    assert!(error.to_string().contains("feature cgroups"), "{error}");
    assert!(Command::new(&client, "true").status().unwrap().success());
}

#[test]
fn cgroup_options_without_a_subtree_are_refused() {
    let daemon = start_daemon("cgroup-none");
    let client = Client::connect(daemon.socket()).expect("connect");
    let error = Command::new(&client, "true")
        .pids_max(10)
        .status()
        .expect_err("this daemon has no subtree");
    assert!(error.to_string().contains("no cgroup subtree"), "{error}");
}
