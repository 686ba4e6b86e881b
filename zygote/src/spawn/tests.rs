//! These really spawn processes. Each test reaps every child it makes.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustix::pipe::{PipeFlags, pipe_with};
use zygote_proto::{ExitStatus, ResourceLimit, ResourceUsage, SpawnStage};

use super::{
    Credentials, SpawnError, SpawnPlan, SpawnedChild, check_kernel_support, send_signal, spawn,
    try_reap,
};

fn c(text: &str) -> CString {
    CString::new(text).unwrap()
}

fn dev_null() -> OwnedFd {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .unwrap()
        .into()
}

fn pipe() -> (OwnedFd, OwnedFd) {
    pipe_with(PipeFlags::CLOEXEC).unwrap()
}

/// A plan running `argv` (argv[0] is the path), with stdio on /dev/null.
fn plan(argv: &[&str]) -> SpawnPlan {
    SpawnPlan {
        exec_candidates: vec![c(argv[0])],
        argv: argv.iter().map(|arg| c(arg)).collect(),
        envp: {
            let mut env = zygote_proto::Env::new();
            env.push(b"PATH", b"/usr/bin:/bin");
            env
        },
        cwd: None,
        fds: vec![(dev_null(), 0), (dev_null(), 1), (dev_null(), 2)],
        new_session: false,
        controlling_terminal: false,
        process_group: None,
        umask: None,
        rlimits: Vec::new(),
        credentials: None,
        cgroup: None,
        ignored_signals: 0,
        nice: None,
        cpu_affinity: Vec::new(),
        oom_score_adj: None,
        sandbox: None,
    }
}

fn sh(script: &str) -> SpawnPlan {
    plan(&["/bin/sh", "-c", script])
}

/// Replaces the child's stdout with a pipe; returns its read end.
fn capture_stdout(plan: &mut SpawnPlan) -> OwnedFd {
    let (read, write) = pipe();
    plan.fds.retain(|(_, target)| *target != 1);
    plan.fds.push((write, 1));
    read
}

fn read_all(fd: OwnedFd) -> String {
    let mut text = String::new();
    File::from(fd).read_to_string(&mut text).unwrap();
    text
}

/// Polls `try_reap` until the child has exited.
fn wait(child: &SpawnedChild) -> (ExitStatus, ResourceUsage) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(exit) = try_reap(child.pidfd.as_fd()).unwrap() {
            return exit;
        }
        assert!(
            Instant::now() < deadline,
            "child {} did not exit",
            child.pid
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Spawns, drops the daemon's copies of the fds, and waits for the exit.
fn run(plan: SpawnPlan) -> ExitStatus {
    let child = spawn(&plan).unwrap();
    drop(plan);
    wait(&child).0
}

/// Runs `plan` and returns its stdout once it has exited 0.
fn output(mut plan: SpawnPlan) -> String {
    let stdout = capture_stdout(&mut plan);
    let child = spawn(&plan).unwrap();
    drop(plan);
    let text = read_all(stdout);
    assert_eq!(wait(&child).0, ExitStatus::Exited(0));
    text
}

fn kill_and_reap(child: &SpawnedChild) {
    send_signal(child.pidfd.as_fd(), libc::SIGKILL).unwrap();
    let signaled = ExitStatus::Signaled {
        signal: libc::SIGKILL,
        core_dumped: false,
    };
    assert_eq!(wait(child).0, signaled);
}

/// Fields 3.. of /proc/<pid>/stat, after the command name.
fn stat_fields(pid: &str) -> Vec<i64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    after_comm
        .split_whitespace()
        .skip(1)
        .take(3)
        .map(|field| field.parse().unwrap())
        .collect()
}

/// The child's fd numbers, once they equal `expected` or after 2 s. The
/// dynamic loader of a just-exec'd program briefly holds an fd of its own;
/// a leaked fd would never go away.
fn settled_fds(child: &SpawnedChild, expected: &BTreeSet<RawFd>) -> BTreeSet<RawFd> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let fds: BTreeSet<RawFd> = fs::read_dir(format!("/proc/{}/fd", child.pid))
            .unwrap()
            .map(|entry| {
                entry
                    .unwrap()
                    .file_name()
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        if &fds == expected || Instant::now() > deadline {
            return fds;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// (pgid, sid) of a process.
fn pgid_and_sid(pid: &str) -> (i64, i64) {
    let fields = stat_fields(pid);
    (fields[1], fields[2])
}

/// A file path unique to this test run.
fn temp_path(name: &str) -> std::path::PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("zygote-spawn-{}-{n}-{name}", std::process::id()))
}

/// The children of the calling thread (the kernel tracks them per thread).
fn own_children() -> Option<String> {
    fs::read_to_string("/proc/thread-self/children").ok()
}

fn assert_fails(plan: &SpawnPlan, stage: SpawnStage, errno: i32) {
    // A program this test process just wrote can be ETXTBSY for a moment:
    // another test's child, forked before it execs, holds a copy of the
    // writable fd. That is the test harness, not the spawner.
    let mut error = spawn(plan).unwrap_err();
    for _ in 0..100 {
        if error.errno != libc::ETXTBSY || errno == libc::ETXTBSY {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        error = spawn(plan).unwrap_err();
    }
    assert_eq!(error, SpawnError::new(stage, errno));
}

#[test]
fn kernel_is_supported() {
    check_kernel_support().unwrap();
}

#[test]
fn true_exits_zero() {
    assert_eq!(run(plan(&["/bin/true"])), ExitStatus::Exited(0));
}

#[test]
fn exit_code_is_reported() {
    assert_eq!(run(sh("exit 7")), ExitStatus::Exited(7));
}

#[test]
fn death_by_signal_is_reported() {
    let expected = ExitStatus::Signaled {
        signal: libc::SIGTERM,
        core_dumped: false,
    };
    assert_eq!(run(sh("kill -TERM $$")), expected);
}

#[test]
fn sigpipe_is_default_in_child() {
    // The Rust runtime ignores SIGPIPE in this process; the child must not.
    let expected = ExitStatus::Signaled {
        signal: libc::SIGPIPE,
        core_dumped: false,
    };
    assert_eq!(run(sh("kill -PIPE $$; exit 3")), expected);
}

#[test]
fn child_has_no_blocked_or_ignored_signals() {
    // spawn blocks every signal in the parent around clone; none may stick.
    // (The child reads its own status: a dynamic program may briefly block
    // signals while it starts, so reading it from outside would race.)
    let text = output(plan(&[
        "/bin/grep",
        "-E",
        "^Sig(Blk|Ign)",
        "/proc/self/status",
    ]));
    assert_eq!(
        text,
        "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"
    );
}

#[test]
fn signals_asked_ignored_are_ignored_but_never_sigkill_or_sigstop() {
    let mut plan = plan(&["/bin/grep", "^SigIgn", "/proc/self/status"]);
    let bit = |signal: i32| 1u64 << (signal - 1);
    // A raw request may name the two that cannot be ignored: skipped.
    plan.ignored_signals = bit(libc::SIGUSR1) | bit(libc::SIGKILL) | bit(libc::SIGSTOP);
    assert_eq!(
        output(plan),
        format!("SigIgn:\t{:016x}\n", bit(libc::SIGUSR1))
    );
}

/// Spawns a child that prints its blocked and ignored signal sets, through
/// `spawn`, and checks both are empty.
fn assert_child_signals_are_clean(
    spawn: impl FnOnce(&SpawnPlan) -> Result<SpawnedChild, SpawnError>,
) {
    let mut plan = plan(&["/bin/grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"]);
    let stdout = capture_stdout(&mut plan);
    let child = spawn(&plan).unwrap();
    drop(plan);
    let text = read_all(stdout);
    assert_eq!(wait(&child).0, ExitStatus::Exited(0));
    assert_eq!(
        text,
        "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"
    );
}

#[test]
fn signals_are_reset_without_proc_too() {
    assert_child_signals_are_clean(|plan| {
        super::spawn_with(plan, &super::SignalReset::without_proc())
    });
}

#[test]
fn spawner_resets_the_dispositions_it_read_once() {
    let spawner = super::Spawner::with_current_dispositions().expect("procfs says");
    // The Rust runtime's SIGPIPE ignore was there when it read them.
    assert_ne!(spawner.signals.known() & (1 << (libc::SIGPIPE - 1)), 0);
    for _ in 0..2 {
        assert_child_signals_are_clean(|plan| spawner.spawn(plan));
    }
}

#[test]
fn argv_and_env_are_passed() {
    let mut plan = sh("printf '%s|%s|%s' \"$0\" \"$1\" \"$GREETING\"");
    plan.argv.extend([c("zero"), c("one")]);
    plan.envp.push(b"GREETING", b"hello");
    assert_eq!(output(plan), "zero|one|hello");
}

#[test]
fn rusage_is_reported() {
    let child = spawn(&plan(&["/bin/true"])).unwrap();
    let (status, usage) = wait(&child);
    assert_eq!(status, ExitStatus::Exited(0));
    assert!(usage.max_rss_kib > 0, "{usage:?}");
}

#[test]
fn missing_program_is_enoent() {
    assert_fails(
        &plan(&["/nonexistent/program"]),
        SpawnStage::Exec,
        libc::ENOENT,
    );
}

#[test]
fn error_message_names_stage_and_errno() {
    let error = spawn(&plan(&["/nonexistent/program"])).unwrap_err();
    assert_eq!(error.to_string(), "exec failed: No such file or directory");
}

#[test]
fn non_executable_is_eacces_even_as_root() {
    let path = temp_path("not-executable");
    fs::write(&path, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let path_text = path.to_str().unwrap();

    assert_fails(&plan(&[path_text]), SpawnStage::Exec, libc::EACCES);

    // EACCES is remembered past a later ENOENT, as execvp does.
    let mut later_missing = plan(&[path_text]);
    later_missing
        .exec_candidates
        .push(c("/nonexistent/program"));
    assert_fails(&later_missing, SpawnStage::Exec, libc::EACCES);

    // ...and a later candidate that works still wins.
    let mut later_works = plan(&[path_text]);
    later_works.exec_candidates.push(c("/bin/true"));
    assert_eq!(run(later_works), ExitStatus::Exited(0));
    fs::remove_file(&path).unwrap();
}

#[test]
fn candidates_are_tried_in_order() {
    let mut plan = plan(&["true"]);
    plan.exec_candidates = vec![
        c("/nonexistent/true"),
        c("/etc/passwd/true"),
        c("/bin/true"),
    ];
    assert_eq!(run(plan), ExitStatus::Exited(0));
}

#[test]
fn other_exec_errors_stop_the_search() {
    // ENOEXEC is not retried: a later good candidate is not reached.
    let path = temp_path("garbage");
    fs::write(&path, [0x7f, b'E', b'L', b'F', 0, 0, 0, 0]).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    let mut plan = plan(&[path.to_str().unwrap()]);
    plan.exec_candidates.push(c("/bin/true"));
    assert_fails(&plan, SpawnStage::Exec, libc::ENOEXEC);
    fs::remove_file(&path).unwrap();
}

#[test]
fn missing_cwd_is_chdir_enoent() {
    let mut plan = plan(&["/bin/true"]);
    plan.cwd = Some(c("/nonexistent/directory"));
    assert_fails(&plan, SpawnStage::Chdir, libc::ENOENT);
}

/// Says that `test` (a path, or a name in this module), or the part of it that `reason` names, did not run,
/// and records it in the file named by `ZYGOTE_TEST_SKIPS`, where
/// `scripts/test` counts it as skipped rather than passed. What these
/// tests need, CI provides (root, no opt-out variable): under CI (`CI`
/// set) a skip is a failure.
pub(crate) fn skip(test: &str, reason: &str) {
    let in_ci = std::env::var_os("CI").is_some_and(|value| !value.is_empty() && value != "false");
    assert!(!in_ci, "{test}: {reason}; under CI this must run");
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("ZYGOTE_TEST_SKIPS") {
        let line = if test.contains("::") {
            format!("{test}\t{reason}\n")
        } else {
            format!("spawn::tests::{test}\t{reason}\n")
        };
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| std::io::Write::write_all(&mut file, line.as_bytes()))
            .expect("record the skip");
    }
}

/// `CAP_SYS_RESOURCE` from `<linux/capability.h>`.
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether the calling thread has capability `cap` in its effective set.
fn has_effective_capability(cap: u32) -> bool {
    let status = fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << cap) != 0)
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn credentials_are_switched() {
    if !is_root() {
        skip(
            "credentials_are_switched",
            "a child of another uid needs root",
        );
        return;
    }
    let mut plan = sh("echo $(id -u) $(id -g) $(id -G)");
    plan.credentials = Some(Credentials {
        uid: 65534,
        gid: 65534,
        groups: vec![65534, 4242],
    });
    assert_eq!(output(plan), "65534 65534 65534 4242\n");
}

#[test]
fn cwd_is_checked_with_the_child_credentials() {
    if !is_root() {
        skip(
            "cwd_is_checked_with_the_child_credentials",
            "a child of another uid needs root",
        );
        return;
    }
    let dir = temp_path("private-dir");
    let _ = fs::remove_dir(&dir);
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let mut plan = plan(&["/bin/true"]);
    plan.cwd = Some(c(dir.to_str().unwrap()));
    plan.credentials = Some(Credentials {
        uid: 65534,
        gid: 65534,
        groups: vec![],
    });
    assert_fails(&plan, SpawnStage::Chdir, libc::EACCES);
    fs::remove_dir(&dir).unwrap();
}

#[test]
fn daemon_credentials_are_untouched_by_a_switch() {
    if !is_root() {
        skip(
            "daemon_credentials_are_untouched_by_a_switch",
            "a child of another uid needs root",
        );
        return;
    }
    let mut plan = plan(&["/bin/true"]);
    plan.credentials = Some(Credentials {
        uid: 65534,
        gid: 65534,
        groups: vec![],
    });
    assert_eq!(run(plan), ExitStatus::Exited(0));
    // The child's raw syscalls changed only the child.
    assert!(is_root());
    assert_eq!(rustix::process::getgid().as_raw(), 0);
}

#[test]
fn cwd_is_applied() {
    let mut plan = sh("pwd");
    plan.cwd = Some(c("/usr"));
    assert_eq!(output(plan), "/usr\n");
}

#[test]
fn failed_spawn_leaves_no_zombie() {
    let Some(before) = own_children() else {
        skip(
            "failed_spawn_leaves_no_zombie",
            "no /proc/thread-self/children (CONFIG_PROC_CHILDREN)",
        );
        return;
    };
    assert_eq!(before.trim(), "");
    for _ in 0..10 {
        assert!(spawn(&plan(&["/nonexistent/program"])).is_err());
    }
    assert_eq!(own_children().unwrap().trim(), "");
}

#[test]
fn fd_table_is_exactly_the_mapping() {
    let (_read, write) = pipe();
    let mut plan = plan(&["/bin/sleep", "5"]);
    plan.fds.push((write, 5));
    let child = spawn(&plan).unwrap();
    drop(plan);
    assert!(try_reap(child.pidfd.as_fd()).unwrap().is_none());

    let fds = settled_fds(&child, &BTreeSet::from([0, 1, 2, 5]));
    kill_and_reap(&child);
    assert_eq!(fds, BTreeSet::from([0, 1, 2, 5]));
}

#[test]
fn mapped_fd_is_writable_and_inherited() {
    let (read, write) = pipe();
    let mut plan = sh("echo hi >&5");
    plan.fds.push((write, 5));
    let child = spawn(&plan).unwrap();
    drop(plan);
    assert_eq!(read_all(read), "hi\n");
    assert_eq!(wait(&child).0, ExitStatus::Exited(0));
}

#[test]
fn sources_that_collide_with_targets_are_swapped_correctly() {
    let (read_a, write_a) = pipe();
    let (read_b, write_b) = pipe();
    let (a, b) = (write_a.as_raw_fd(), write_b.as_raw_fd());
    // Pipe A's write end goes to B's number and vice versa: each source
    // number is the other mapping's target.
    let mut plan = sh("echo to-a >/proc/self/fd/$1; echo to-b >/proc/self/fd/$2");
    plan.argv
        .extend([c("sh"), c(&b.to_string()), c(&a.to_string())]);
    plan.fds.push((write_a, b));
    plan.fds.push((write_b, a));

    let child = spawn(&plan).unwrap();
    drop(plan);
    assert_eq!(read_all(read_a), "to-a\n");
    assert_eq!(read_all(read_b), "to-b\n");
    assert_eq!(wait(&child).0, ExitStatus::Exited(0));
}

#[test]
fn umask_is_applied() {
    let mut plan = sh("umask");
    plan.umask = Some(0o027);
    assert_eq!(output(plan), "0027\n");
}

#[test]
fn rlimit_is_applied() {
    let _core = CORE_LIMIT.lock().unwrap_or_else(PoisonError::into_inner);
    let mut plan = sh("ulimit -n; ulimit -c");
    plan.rlimits = vec![
        ResourceLimit {
            resource: libc::RLIMIT_NOFILE,
            soft: 200,
            hard: 300,
        },
        ResourceLimit {
            resource: libc::RLIMIT_CORE,
            soft: u64::MAX,
            hard: u64::MAX,
        },
    ];
    assert_eq!(output(plan), "200\nunlimited\n");
}

#[test]
fn low_nofile_limit_does_not_break_fd_placement() {
    // rlimits come after fd placement, which needs numbers above the targets.
    let (_read, write) = pipe();
    let mut plan = plan(&["/bin/sleep", "5"]);
    plan.fds.push((write, 5));
    plan.rlimits = vec![ResourceLimit {
        resource: libc::RLIMIT_NOFILE,
        soft: 6,
        hard: 6,
    }];
    let child = spawn(&plan).unwrap();
    drop(plan);
    let limits = fs::read_to_string(format!("/proc/{}/limits", child.pid)).unwrap();
    let fds = settled_fds(&child, &BTreeSet::from([0, 1, 2, 5]));
    kill_and_reap(&child);
    let open_files = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        open_files.split_whitespace().collect::<Vec<_>>()[3..5],
        ["6", "6"]
    );
    assert_eq!(fds, BTreeSet::from([0, 1, 2, 5]));
}

#[test]
fn new_session_is_created() {
    let mut plan = plan(&["/bin/sleep", "5"]);
    plan.new_session = true;
    plan.process_group = Some(12345); // ignored with new_session
    let child = spawn(&plan).unwrap();
    let (pgid, sid) = pgid_and_sid(&child.pid.to_string());
    kill_and_reap(&child);
    assert_eq!((pgid, sid), (child.pid.into(), child.pid.into()));
}

#[test]
fn process_group_is_created() {
    let mut plan = plan(&["/bin/sleep", "5"]);
    plan.process_group = Some(0);
    let child = spawn(&plan).unwrap();
    let (pgid, sid) = pgid_and_sid(&child.pid.to_string());
    kill_and_reap(&child);
    let (_, own_sid) = pgid_and_sid("self");
    assert_eq!((pgid, sid), (child.pid.into(), own_sid));
}

#[test]
fn bad_process_group_is_setpgid_error() {
    let mut plan = plan(&["/bin/true"]);
    plan.process_group = Some(i32::MAX - 1);
    assert_fails(&plan, SpawnStage::Setpgid, libc::EPERM);
}

#[test]
fn an_affinity_of_no_present_cpu_is_an_affinity_error() {
    let mut plan = plan(&["/bin/true"]);
    // CPU 1023 alone: the kernel finds no CPU it has in the mask.
    plan.cpu_affinity = vec![0; 16];
    plan.cpu_affinity[15] = 1 << 63;
    assert_fails(&plan, SpawnStage::Affinity, libc::EINVAL);
}

/// Lowering the OOM score needs `CAP_SYS_RESOURCE`, which a container
/// may withhold even from root: then the spawn fails at its stage, never
/// silently with the score unchanged.
#[test]
fn an_oom_score_adj_is_applied_or_fails_the_spawn() {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .expect("CapEff");
    let mut plan = plan(&["/bin/cat", "/proc/self/oom_score_adj"]);
    plan.oom_score_adj = Some(-1000);
    // CAP_SYS_RESOURCE is capability 24.
    if effective & (1 << 24) == 0 {
        assert_fails(&plan, SpawnStage::OomScoreAdj, libc::EACCES);
    } else {
        assert_eq!(output(plan), "-1000\n");
    }
}

#[test]
fn duplicate_targets_are_refused() {
    let mut plan = plan(&["/bin/true"]);
    plan.fds.push((dev_null(), 1));
    assert_fails(&plan, SpawnStage::Validate, libc::EINVAL);
}

#[test]
fn send_signal_after_reap_fails() {
    let child = spawn(&plan(&["/bin/true"])).unwrap();
    wait(&child);
    let error = send_signal(child.pidfd.as_fd(), libc::SIGTERM).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ESRCH));
    let error = try_reap(child.pidfd.as_fd()).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ECHILD));
}

#[test]
fn concurrent_spawns_from_many_threads() {
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                for _ in 0..20 {
                    assert_eq!(run(sh(&format!("exit {i}"))), ExitStatus::Exited(i));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

/// Spawn + reap latency of this module against std, for the table at the
/// top of `spawn/mod.rs`. Set `ZYGOTE_BENCH_STATIC` to a static binary's
/// path to measure it too (`gcc -static` of `int main(){return 0;}`).
#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn measure() {
    const RUNS: usize = 1000;
    fn report(name: &str, mut micros: Vec<f64>) {
        micros.sort_by(f64::total_cmp);
        let p50 = micros[micros.len() / 2];
        let p99 = micros[micros.len() * 99 / 100];
        println!("{name:<40} p50 {p50:>5.0} us   p99 {p99:>5.0} us");
    }

    let mut programs = vec!["/bin/true".to_owned()];
    programs.extend(std::env::var("ZYGOTE_BENCH_STATIC"));
    for program in &programs {
        let plan = plan(&[program]);
        let mut blocked = Vec::with_capacity(RUNS);
        let mut total = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let start = Instant::now();
            let child = spawn(&plan).unwrap();
            blocked.push(start.elapsed().as_secs_f64() * 1e6);
            super::clone::waitid(child.pidfd.as_fd(), true).unwrap();
            total.push(start.elapsed().as_secs_f64() * 1e6);
        }
        let std = (0..RUNS)
            .map(|_| {
                let start = Instant::now();
                let status = std::process::Command::new(program)
                    .env_clear()
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .unwrap();
                assert!(status.success());
                start.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        report(&format!("{program}: clone-vfork spawn+reap"), total);
        report(&format!("{program}: std Command status()"), std);
        report(&format!("{program}: clone-vfork spawn() alone"), blocked);
    }
}

/// Waits (polling) for a fork-path child's report.
fn exec_report(started: &super::StartedChild) -> super::ExecReport {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match super::read_exec_report(started.status.as_fd()) {
            Ok(report) => return report,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => panic!("reading the status pipe: {error}"),
        }
        assert!(Instant::now() < deadline, "no exec report");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Starts `/bin/true` under `sandbox` on a thread that first unshares
/// `namespace` (so that a sandbox step the child should refuse changes
/// only that thread's namespace) and checks the child failed `step` with
/// `EPERM`; skips where the thread cannot unshare.
fn assert_refused_beside_a_thread_namespace(
    test: &str,
    namespace: libc::c_int,
    sandbox: super::SandboxPlan,
    step: crate::spawn::sandbox::Step,
) {
    let report = std::thread::spawn(move || {
        // SAFETY: unshares this thread's own namespace (and fs) only.
        if unsafe { libc::unshare(namespace) } != 0 {
            return None;
        }
        let mut plan = plan(&["/bin/true"]);
        plan.sandbox = Some(sandbox);
        let started = super::start(&plan).unwrap();
        let report = exec_report(&started);
        wait(&SpawnedChild {
            pid: started.pid,
            pidfd: started.pidfd,
        });
        Some(report)
    })
    .join()
    .unwrap();
    let Some(report) = report else {
        skip(test, "cannot unshare a namespace (needs root)");
        return;
    };
    let super::ExecReport::Failed(error) = report else {
        panic!("the child did {step:?} in its parent's namespace: {report:?}");
    };
    assert_eq!(
        (error.stage, error.errno),
        (SpawnStage::Sandbox, libc::EPERM)
    );
    assert_eq!(error.sandbox.map(|failure| failure.step), Some(step));
}

/// A sandbox with a filesystem whose clone flags lack `CLONE_NEWNS`
/// fails before its first mount.
#[test]
fn a_filesystem_without_a_new_mount_namespace_is_refused() {
    assert_refused_beside_a_thread_namespace(
        "a_filesystem_without_a_new_mount_namespace_is_refused",
        libc::CLONE_NEWNS,
        super::SandboxPlan {
            filesystem: Some(system_binds()),
            ..super::SandboxPlan::default()
        },
        crate::spawn::sandbox::Step::Propagation,
    );
}

/// The same for a hostname without `CLONE_NEWUTS`.
#[test]
fn a_hostname_without_a_new_uts_namespace_is_refused() {
    assert_refused_beside_a_thread_namespace(
        "a_hostname_without_a_new_uts_namespace_is_refused",
        libc::CLONE_NEWUTS,
        super::SandboxPlan {
            hostname: Some(b"renamed".to_vec()),
            ..super::SandboxPlan::default()
        },
        crate::spawn::sandbox::Step::Hostname,
    );
}

#[test]
fn fork_path_reports_exec_and_output() {
    let mut plan = sh("echo forked; ls /proc/self/fd");
    let stdout = capture_stdout(&mut plan);
    let started = super::start(&plan).unwrap();
    drop(plan);
    assert_eq!(exec_report(&started), super::ExecReport::Execd);
    let child = SpawnedChild {
        pid: started.pid,
        pidfd: started.pidfd,
    };
    assert_eq!(wait(&child).0, ExitStatus::Exited(0));
    let text = read_all(stdout);
    // The status pipe's write end closed at exec: only 0, 1, 2 and the
    // fd `ls` opened itself.
    let fds: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(text.lines().next(), Some("forked"));
    assert_eq!(fds, ["0", "1", "2", "3"], "{text}");
}

#[test]
fn fork_path_reports_the_failed_step() {
    for (plan, stage, errno) in [
        (
            plan(&["/nonexistent/program"]),
            SpawnStage::Exec,
            libc::ENOENT,
        ),
        (
            SpawnPlan {
                cwd: Some(c("/nonexistent/dir")),
                ..plan(&["/bin/true"])
            },
            SpawnStage::Chdir,
            libc::ENOENT,
        ),
    ] {
        let started = super::start(&plan).unwrap();
        assert_eq!(
            exec_report(&started),
            super::ExecReport::Failed(SpawnError::new(stage, errno))
        );
        let child = SpawnedChild {
            pid: started.pid,
            pidfd: started.pidfd,
        };
        assert_eq!(wait(&child).0, ExitStatus::Exited(127));
    }
}

#[test]
fn fork_path_keeps_a_high_target_fd() {
    // A target above the status pipe's usual number must still be placed.
    let mut plan = sh("ls /proc/self/fd");
    let stdout = capture_stdout(&mut plan);
    plan.fds.push((dev_null(), 40));
    let started = super::start(&plan).unwrap();
    drop(plan);
    assert_eq!(exec_report(&started), super::ExecReport::Execd);
    let child = SpawnedChild {
        pid: started.pid,
        pidfd: started.pidfd,
    };
    assert_eq!(wait(&child).0, ExitStatus::Exited(0));
    let text = read_all(stdout);
    let fds: Vec<&str> = text.lines().collect();
    assert_eq!(fds, ["0", "1", "2", "3", "40"], "{text}");
}

/// A raised spawner (a private zygote at nice -10 while busy) must not
/// hand its priority to its children: they start at 0
/// (`SCHED_RESET_ON_FORK`), at the spawner's former nice value when their
/// plan sets none, or at the one the plan sets.
#[test]
fn boosted_spawner_children_keep_their_own_nice() {
    if !is_root() {
        skip(
            "boosted_spawner_children_keep_their_own_nice",
            "raising a thread's priority needs CAP_SYS_NICE; run as root",
        );
        return;
    }
    let nice_of_child = |nice: Option<i32>| {
        let mut plan = sh("nice");
        plan.nice = nice;
        output(plan)
            .trim()
            .parse::<i32>()
            .expect("nice prints a number")
    };
    let own = || rustix::process::getpriority_process(None).unwrap();
    // Nice values and the reset flag are per thread; the boost is
    // process-wide state.
    let _state = SPAWNER_STATE.lock().unwrap_or_else(PoisonError::into_inner);
    std::thread::spawn(move || {
        rustix::process::setpriority_process(None, 3).unwrap();
        assert_eq!(super::prepare_boost(-10).unwrap(), Some(3));
        assert_eq!(own(), 3, "not raised until busy");
        super::set_busy(true);
        assert_eq!(own(), -10, "raised while busy");
        assert_eq!(nice_of_child(None), 3, "the spawner's former nice");
        assert_eq!(nice_of_child(Some(5)), 5, "the requested nice");
        assert_eq!(nice_of_child(Some(0)), 0, "the requested nice");
        std::thread::spawn(move || {
            assert_eq!(own(), 0, "threads of a raised thread start reset too");
        })
        .join()
        .unwrap();
        super::set_busy(false);
        assert_eq!(own(), 3, "back when idle");
        super::forget_boost();
    })
    .join()
    .unwrap();
}

/// Serializes the tests that change the process-wide spawner state (the
/// boost, the children's policy reset).
static SPAWNER_STATE: Mutex<()> = Mutex::new(());

/// Serializes the tests that lower or raise this process's `RLIMIT_CORE`,
/// which is process-wide: a child asking for an unlimited one must not
/// start while another test holds the hard limit down.
static CORE_LIMIT: Mutex<()> = Mutex::new(());

/// The (nice value, policy) a child reports from its own `/proc` stat.
fn nice_and_policy(stat: &str) -> (i64, i64) {
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    (fields[16].parse().unwrap(), fields[38].parse().unwrap())
}

/// A child's (nice value, policy), on the vfork path.
fn child_scheduling(nice: Option<i32>) -> (i64, i64) {
    let mut plan = plan(&["/bin/cat", "/proc/self/stat"]);
    plan.nice = nice;
    nice_and_policy(&output(plan))
}

/// The calling thread's policy, without `SCHED_RESET_ON_FORK`.
fn own_policy() -> i32 {
    super::sched::thread_policy().unwrap() & !libc::SCHED_RESET_ON_FORK
}

const OTHER: i64 = libc::SCHED_OTHER as i64;

/// A daemon thread under `SCHED_BATCH` (inherited by the threads it
/// starts) starts its children under `SCHED_OTHER`, at their own nice
/// value, on the vfork and the fork path.
#[test]
fn batch_daemon_children_start_under_sched_other() {
    let _state = SPAWNER_STATE.lock().unwrap_or_else(PoisonError::into_inner);
    std::thread::spawn(|| {
        let policy = super::run_daemon_as_batch().unwrap();
        if policy == super::DaemonPolicy::Disabled {
            skip(
                "batch_daemon_children_start_under_sched_other",
                &format!("{}=0 in the environment", super::NO_BATCH_ENV),
            );
            return;
        }
        assert!(
            matches!(
                policy,
                super::DaemonPolicy::Batch | super::DaemonPolicy::AlreadyBatch
            ),
            "{policy:?}"
        );
        assert_eq!(own_policy(), libc::SCHED_BATCH);
        std::thread::spawn(|| assert_eq!(own_policy(), libc::SCHED_BATCH, "inherited"))
            .join()
            .unwrap();
        let own = i64::from(rustix::process::getpriority_process(None).unwrap());
        assert_eq!(child_scheduling(None), (own, OTHER), "vfork path");
        assert_eq!(child_scheduling(Some(7)), (7, OTHER), "a requested nice");
        if is_root() {
            let mut plan = plan(&["/bin/cat", "/proc/self/stat"]);
            plan.nice = Some(4);
            plan.credentials = Some(Credentials {
                uid: 65534,
                gid: 65534,
                groups: Vec::new(),
            });
            let stdout = capture_stdout(&mut plan);
            let started = super::start(&plan).unwrap();
            drop(plan);
            assert_eq!(exec_report(&started), super::ExecReport::Execd);
            let child = SpawnedChild {
                pid: started.pid,
                pidfd: started.pidfd,
            };
            assert_eq!(wait(&child).0, ExitStatus::Exited(0));
            assert_eq!(
                nice_and_policy(&read_all(stdout)),
                (4, OTHER),
                "fork path, uid 65534"
            );
        } else {
            skip(
                "batch_daemon_children_start_under_sched_other",
                "the fork path under SCHED_BATCH: another uid needs root",
            );
        }
        // Without the reset, the child would inherit SCHED_BATCH.
        super::sched::forget_batch();
        assert_eq!(
            child_scheduling(None),
            (own, i64::from(libc::SCHED_BATCH)),
            "not reset"
        );
    })
    .join()
    .unwrap();
}

/// A single-threaded zygote's spawner under `SCHED_BATCH` leaves it, and
/// is raised, while busy, and goes back when idle; its children start
/// under `SCHED_OTHER` at the spawner's former nice value either way.
#[test]
fn batch_spawner_is_other_and_raised_while_busy() {
    if !is_root() {
        skip(
            "batch_spawner_is_other_and_raised_while_busy",
            "raising a thread's priority needs CAP_SYS_NICE; run as root",
        );
        return;
    }
    let _state = SPAWNER_STATE.lock().unwrap_or_else(PoisonError::into_inner);
    std::thread::spawn(|| {
        let own = || rustix::process::getpriority_process(None).unwrap();
        rustix::process::setpriority_process(None, 3).unwrap();
        if super::run_daemon_as_batch().unwrap() == super::DaemonPolicy::Disabled {
            skip(
                "batch_spawner_is_other_and_raised_while_busy",
                &format!("{}=0 in the environment", super::NO_BATCH_ENV),
            );
            return;
        }
        assert_eq!(super::prepare_boost(-10).unwrap(), Some(3));
        assert!(super::batch_only_while_idle().unwrap());
        let with_reset = super::sched::thread_policy().unwrap();
        assert_eq!(
            with_reset,
            libc::SCHED_BATCH | libc::SCHED_RESET_ON_FORK,
            "idle"
        );
        super::set_busy(true);
        assert_eq!(
            (own_policy(), own()),
            (libc::SCHED_OTHER, -10),
            "busy: other, raised"
        );
        assert_ne!(
            super::sched::thread_policy().unwrap() & libc::SCHED_RESET_ON_FORK,
            0,
            "reset on fork kept"
        );
        assert_eq!(child_scheduling(None), (3, OTHER), "spawned while busy");
        super::set_busy(false);
        assert_eq!((own_policy(), own()), (libc::SCHED_BATCH, 3), "idle again");
        assert_eq!(child_scheduling(None), (3, OTHER), "spawned while idle");
        super::forget_boost();
        super::sched::forget_batch();
    })
    .join()
    .unwrap();
}

/// A deny-list as libseccomp's tree (as the daemon compiles profiles).
fn tree_filter() -> std::sync::Arc<super::SeccompProgram> {
    let names = [
        "ptrace",
        "mount",
        "umount2",
        "pivot_root",
        "keyctl",
        "add_key",
        "bpf",
        "kexec_load",
        "init_module",
        "finit_module",
        "delete_module",
        "unshare",
        "setns",
        "reboot",
        "swapon",
        "perf_event_open",
    ];
    let rules: Vec<_> = names
        .iter()
        .map(|name| super::libseccomp::TreeRule {
            syscall: (*name).to_owned(),
            arg0_has_bits: None,
        })
        .collect();
    let filter = super::libseccomp::compile_tree(0x7fff_0000, 0x0005_0001, &rules)
        .expect("libseccomp compiles the tree");
    std::sync::Arc::new(super::SeccompProgram {
        name: "tree".into(),
        filter,
    })
}

/// The system's directories bound read-only, as a full sandbox has them.
fn system_binds() -> Vec<super::Mount> {
    ["usr", "bin", "lib", "lib64"]
        .into_iter()
        .filter(|dir| std::path::Path::new("/").join(dir).exists())
        .map(|dir| super::Mount {
            kind: super::MountKind::ReadOnlyBind,
            source: c(&format!("/{dir}")),
            destination: c(dir),
        })
        .collect()
}

/// The daemon's `/dev` template, made once for the measurement.
fn dev_template() -> std::sync::Arc<OwnedFd> {
    static TEMPLATE: std::sync::OnceLock<std::sync::Arc<OwnedFd>> = std::sync::OnceLock::new();
    std::sync::Arc::clone(
        TEMPLATE.get_or_init(|| std::sync::Arc::new(super::dev_template().expect("/dev template"))),
    )
}

/// A sandbox plan made from the shared network namespace.
type SandboxFor = fn(&std::sync::Arc<OwnedFd>) -> Option<super::SandboxPlan>;

/// The namespaces' own cost on the fork path (as root): joining the
/// daemon's one empty network namespace against a fresh one per child,
/// and the other namespaces a sandbox adds. Rerun with `cargo test -p
/// zygote-server --release --lib spawn::tests::measure_sandbox_namespaces
/// -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: run by hand, as root"]
fn measure_sandbox_namespaces() {
    const RUNS: usize = 300;
    let shared_netns = std::sync::Arc::new(super::empty_network_namespace().unwrap());
    let variants: [(&str, SandboxFor); 11] = [
        ("fork path, no sandbox", |_| None),
        ("setns into the shared empty netns", |netns| {
            Some(super::SandboxPlan {
                netns: Some(std::sync::Arc::clone(netns)),
                ..super::SandboxPlan::default()
            })
        }),
        ("a fresh CLONE_NEWNET", |_| {
            Some(super::SandboxPlan {
                clone_flags: libc::CLONE_NEWNET,
                ..super::SandboxPlan::default()
            })
        }),
        ("new pid, ipc, uts (under an init)", |_| {
            Some(super::SandboxPlan {
                clone_flags: libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS,
                ..super::SandboxPlan::default()
            })
        }),
        ("bounding set and caps dropped, nnp", |_| {
            Some(super::SandboxPlan {
                clear_bounding_set: true,
                ..super::SandboxPlan::default()
            })
        }),
        ("the same and a one-instruction seccomp filter", |_| {
            let allow_all = libc::sock_filter {
                code: 0x06, // BPF_RET | BPF_K
                jt: 0,
                jf: 0,
                k: 0x7fff_0000, // SECCOMP_RET_ALLOW
            };
            Some(super::SandboxPlan {
                clear_bounding_set: true,
                seccomp: vec![std::sync::Arc::new(super::SeccompProgram {
                    name: "allow".into(),
                    filter: vec![allow_all],
                })],
                ..super::SandboxPlan::default()
            })
        }),
        ("the same and a 244-instruction linear filter", |_| {
            let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
            let mut filter = vec![
                op(0x20, 0, 0, 4),           // ld arch
                op(0x15, 1, 0, 0xc000_003e), // jeq x86_64
                op(0x06, 0, 0, 0),           // ret kill
                op(0x20, 0, 0, 0),           // ld nr
            ];
            for i in 0..240u8 {
                filter.push(op(0x15, 240 - i, 0, 600 + u32::from(i)));
            }
            filter.push(op(0x06, 0, 0, 0x7fff_0000));
            filter.push(op(0x06, 0, 0, 0x0005_0001));
            Some(super::SandboxPlan {
                clear_bounding_set: true,
                seccomp: vec![std::sync::Arc::new(super::SeccompProgram {
                    name: "long".into(),
                    filter,
                })],
                ..super::SandboxPlan::default()
            })
        }),
        ("the same and a libseccomp tree of 16 rules", |_| {
            Some(super::SandboxPlan {
                clear_bounding_set: true,
                seccomp: vec![tree_filter()],
                ..super::SandboxPlan::default()
            })
        }),
        ("a new root: system binds, /dev built", |_| {
            Some(super::SandboxPlan {
                clone_flags: libc::CLONE_NEWNS,
                filesystem: Some(system_binds()),
                ..super::SandboxPlan::default()
            })
        }),
        ("a new root: system binds, /dev cloned", |_| {
            Some(super::SandboxPlan {
                clone_flags: libc::CLONE_NEWNS,
                filesystem: Some(system_binds()),
                dev_template: Some(dev_template()),
                ..super::SandboxPlan::default()
            })
        }),
        ("the full sandbox, with a tree filter", |netns| {
            Some(super::SandboxPlan {
                clone_flags: libc::CLONE_NEWNS
                    | libc::CLONE_NEWPID
                    | libc::CLONE_NEWIPC
                    | libc::CLONE_NEWUTS,
                netns: Some(std::sync::Arc::clone(netns)),
                filesystem: Some(system_binds()),
                dev_template: Some(dev_template()),
                clear_bounding_set: true,
                seccomp: vec![tree_filter()],
                ..super::SandboxPlan::default()
            })
        }),
    ];
    // The variants take turns, so that the machine's drift hits them alike.
    let mut micros = vec![Vec::with_capacity(RUNS); variants.len()];
    for _ in 0..RUNS {
        for ((name, sandbox), micros) in variants.iter().zip(&mut micros) {
            let mut plan = plan(&["/bin/true"]);
            plan.sandbox = sandbox(&shared_netns);
            let start = Instant::now();
            let child = super::start(&plan).unwrap();
            loop {
                match super::read_exec_report(child.status.as_fd()) {
                    Ok(super::ExecReport::Execd) => break,
                    Ok(super::ExecReport::Failed(error)) => panic!("{name}: {error}"),
                    Err(_) => std::thread::sleep(Duration::from_micros(20)),
                }
            }
            let (status, _) = super::clone::waitid(child.pidfd.as_fd(), true)
                .unwrap()
                .unwrap();
            assert_eq!(status, ExitStatus::Exited(0), "{name}");
            micros.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    for ((name, _), mut micros) in variants.into_iter().zip(micros) {
        micros.sort_by(f64::total_cmp);
        println!(
            "{name:<40} p50 {:>6.0} us   p99 {:>6.0} us",
            micros[RUNS / 2],
            micros[RUNS * 99 / 100]
        );
    }
}

#[test]
fn a_sibling_is_claimed_only_when_every_uid_is_the_expected_one() {
    if !is_root() {
        skip(
            "a_sibling_is_claimed_only_when_every_uid_is_the_expected_one",
            "a child with another effective uid needs root",
        );
        return;
    }
    let effective_uid = |pid: u32| {
        fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                let uids = status.lines().find_map(|line| line.strip_prefix("Uid:"))?;
                uids.split_whitespace().nth(1).map(str::to_owned)
            })
    };
    let mut plain = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    // Real uid 0, every other uid 65534: what a set-user-ID exec gives.
    let mut raised = std::process::Command::new("setpriv")
        .args(["--euid", "65534", "sleep", "30"])
        .spawn()
        .expect("spawn setpriv");
    let deadline = Instant::now() + Duration::from_secs(10);
    while effective_uid(raised.id()).as_deref() != Some("65534") {
        assert!(Instant::now() < deadline, "setpriv did not switch its euid");
        std::thread::sleep(Duration::from_millis(5));
    }
    let claimed = super::claim_sibling(plain.id() as i32, 0);
    let refused = super::claim_sibling(raised.id() as i32, 0);
    super::forget_own(plain.id() as i32);
    super::forget_own(raised.id() as i32);
    for child in [&mut plain, &mut raised] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(claimed.is_ok(), "{claimed:?}");
    assert_eq!(
        refused.map(drop).map_err(|error| error.raw_os_error()),
        Err(Some(libc::EPERM)),
        "a process whose effective uid is another is not the peer's child"
    );
}

/// `pidfd_open` of a pid that is gone is an error (`ESRCH`), never an fd.
#[test]
fn a_pidfd_of_a_process_that_is_gone_is_esrch() {
    let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
    let pid = i32::try_from(child.id()).unwrap();
    child.wait().unwrap();
    let error = super::open_pidfd(pid).expect_err("no process is left behind that pid");
    assert_eq!(error.raw_os_error(), Some(libc::ESRCH));
}

/// Only a sandbox with a pid namespace of its own, made here (no user
/// namespace, no parked init entered), can be parked; any other plan is
/// refused before anything is forked.
#[test]
fn only_a_plan_with_a_pid_namespace_of_its_own_can_be_parked() {
    let spawner = super::Spawner::resetting_all();
    let isolated = |sandbox: super::SandboxPlan| {
        let mut plan = plan(&["/bin/true"]);
        plan.sandbox = Some(super::SandboxPlan {
            clone_flags: libc::CLONE_NEWPID | libc::CLONE_NEWNS,
            ..sandbox
        });
        plan
    };
    let no_pid_namespace = {
        let mut plan = plan(&["/bin/true"]);
        plan.sandbox = Some(super::SandboxPlan {
            clone_flags: libc::CLONE_NEWNS | libc::CLONE_NEWIPC,
            ..super::SandboxPlan::default()
        });
        plan
    };
    let unparkable = [
        ("no sandbox", plan(&["/bin/true"])),
        ("no pid namespace", no_pid_namespace),
        (
            "a user namespace",
            isolated(super::SandboxPlan {
                map_ids: Some((1000, 1000)),
                ..super::SandboxPlan::default()
            }),
        ),
        (
            "a parked init entered",
            isolated(super::SandboxPlan {
                enter: Some(std::sync::Arc::new(dev_null())),
                ..super::SandboxPlan::default()
            }),
        ),
    ];
    for (what, plan) in unparkable {
        let refused = spawner.park_sibling(&plan).map(|parked| parked.pid);
        assert_eq!(
            refused,
            Err(SpawnError::new(SpawnStage::Validate, libc::EINVAL)),
            "{what}"
        );
    }
}

/// An unprivileged single-threaded zygote's spawner (no boost: it may not
/// raise itself) still leaves `SCHED_BATCH` while busy and goes back when
/// idle, at its own nice value, and gains no `SCHED_RESET_ON_FORK` on the
/// way: not from the failed boost, nor from the switches.
#[test]
fn an_unprivileged_batch_spawner_is_other_only_while_busy() {
    let _state = SPAWNER_STATE.lock().unwrap_or_else(PoisonError::into_inner);
    std::thread::spawn(|| {
        let own = || rustix::process::getpriority_process(None).unwrap();
        rustix::process::setpriority_process(None, 5).unwrap();
        if is_root() {
            // This thread only (the raw syscall): its capabilities go too.
            let nobody = rustix::process::Uid::from_raw(65534);
            rustix::thread::set_thread_res_uid(nobody, nobody, nobody).unwrap();
        }
        if super::run_daemon_as_batch().unwrap() == super::DaemonPolicy::Disabled {
            skip(
                "an_unprivileged_batch_spawner_is_other_only_while_busy",
                &format!("{}=0 in the environment", super::NO_BATCH_ENV),
            );
            return;
        }
        let refused = super::prepare_boost(-10).expect_err("raising needs CAP_SYS_NICE");
        assert!(
            matches!(refused.raw_os_error(), Some(libc::EPERM | libc::EACCES)),
            "{refused}"
        );
        assert_eq!(
            super::sched::thread_policy().unwrap(),
            libc::SCHED_BATCH,
            "the failed boost leaves the thread as it was"
        );
        assert!(super::batch_only_while_idle().unwrap());
        super::set_busy(true);
        assert_eq!(
            (super::sched::thread_policy().unwrap(), own()),
            (libc::SCHED_OTHER, 5),
            "busy: other, at its own nice, no reset flag"
        );
        super::set_busy(false);
        assert_eq!(
            (super::sched::thread_policy().unwrap(), own()),
            (libc::SCHED_BATCH, 5),
            "idle again"
        );
        super::forget_boost();
        super::sched::forget_batch();
    })
    .join()
    .unwrap();
}

/// The child's end of a pipe for the fork path lands at or above the
/// floor and stays open in the child; the daemon's end is close-on-exec
/// (no other child inherits it) and non-blocking (the event loop reads
/// it).
#[test]
fn a_pipe_for_the_child_is_close_on_exec_and_non_blocking() {
    let plan = plan(&["/bin/true"]);
    let mut prepared = super::Prepared::new(&plan).unwrap();
    let floor = prepared.dup_floor + 20;
    for child_writes in [true, false] {
        let (ours, theirs) = super::pipe_for_child(&mut prepared, floor, child_writes).unwrap();
        assert!(theirs.as_raw_fd() >= floor, "{child_writes}");
        let kept = u32::try_from(theirs.as_raw_fd()).unwrap();
        assert!(
            prepared
                .close_ranges
                .iter()
                .all(|&(first, last)| kept < first || kept > last),
            "the child keeps its end open: {:?}",
            prepared.close_ranges
        );
        let fd_flags = rustix::io::fcntl_getfd(&ours).unwrap();
        assert!(
            fd_flags.contains(rustix::io::FdFlags::CLOEXEC),
            "{child_writes}"
        );
        let status_flags = rustix::fs::fcntl_getfl(&ours).unwrap();
        assert!(
            status_flags.contains(rustix::fs::OFlags::NONBLOCK),
            "{child_writes}: {status_flags:?}"
        );
    }
}

/// Stdio is never adopted as a handed-down fd: a corrupt handover naming
/// fd 2 would otherwise close it with the adopted fd.
#[test]
fn stdio_is_never_adopted_as_a_handed_down_fd() {
    let refused = super::adopt_fd(2).map(drop).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EBADF));
    let closed = i32::try_from(
        rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1 << 20),
    )
    .unwrap_or(i32::MAX)
        - 1;
    let refused = super::adopt_fd(closed).map(drop).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EBADF));
}

/// A check command that overruns its bound is killed, and reported as
/// timed out, at the bound.
#[test]
fn a_command_run_to_its_end_is_killed_at_its_bound() {
    let (sender, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut command = std::process::Command::new("/bin/sleep");
        command.arg("30");
        let _ = sender.send(super::run_own(command, Duration::from_millis(200)));
    });
    let outcome = answer
        .recv_timeout(Duration::from_secs(10))
        .expect("run_own returns within 10 s for a 200 ms bound");
    let error = outcome.expect_err("sleep 30 overran its bound");
    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
}

/// A reaped child is no longer listed as this process's own: the list
/// would otherwise grow with every spawn, and an orphan that later got a
/// listed pid would be left unreaped as if it were ours.
#[test]
fn a_reaped_child_is_no_longer_listed_as_own() {
    let listed = |pid: i32| {
        super::OWN
            .pids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&pid)
    };
    let child = spawn(&plan(&["/bin/true"])).unwrap();
    assert!(listed(child.pid), "listed from its start");
    assert_eq!(wait(&child).0, ExitStatus::Exited(0));
    assert!(!listed(child.pid), "forgotten once reaped");
}

/// The fds a live upgrade hands down are found as the ones open without
/// close-on-exec, and their flag is flipped both ways; a closed fd is an
/// error, never a silent success.
#[test]
fn handed_down_fds_are_the_ones_without_close_on_exec() {
    let kept = dev_null();
    let handed = rustix::io::dup(&kept).unwrap();
    assert!(
        !super::inherited_fds().contains(&kept.as_raw_fd()),
        "close-on-exec: not handed down"
    );
    assert!(super::inherited_fds().contains(&handed.as_raw_fd()));
    // Stdio (inheritable here, as in every process) is never handed down.
    assert!(
        super::inherited_fds().iter().all(|fd| *fd > 2),
        "{:?}",
        super::inherited_fds()
    );
    super::set_inheritable(handed.as_raw_fd(), false).unwrap();
    assert!(!super::inherited_fds().contains(&handed.as_raw_fd()));
    super::set_inheritable(kept.as_raw_fd(), true).unwrap();
    assert!(super::inherited_fds().contains(&kept.as_raw_fd()));
    let closed = handed.as_raw_fd();
    drop(handed);
    let refused = super::set_inheritable(closed, true).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EBADF));
}

/// A daemon started under a policy other than `SCHED_OTHER` or
/// `SCHED_BATCH` (`chrt --idle`) keeps it: the administrator chose it.
#[test]
fn a_daemon_started_under_sched_idle_keeps_it() {
    let _state = SPAWNER_STATE.lock().unwrap_or_else(PoisonError::into_inner);
    std::thread::spawn(|| {
        super::sched::set_thread_policy(libc::SCHED_IDLE).unwrap();
        assert_eq!(
            super::run_daemon_as_batch().unwrap(),
            super::DaemonPolicy::Other(libc::SCHED_IDLE)
        );
        assert_eq!(super::sched::thread_policy().unwrap(), libc::SCHED_IDLE);
        super::sched::forget_batch();
    })
    .join()
    .unwrap();
}

/// Signals are named as `kill -l` names them; a number that is neither a
/// known signal nor a real-time one stays a number.
#[test]
fn signals_are_named_as_kill_l_names_them() {
    assert_eq!(super::signal_name(libc::SIGUSR1), "USR1");
    assert_eq!(super::signal_name(libc::SIGRTMIN() + 3), "RTMIN+3");
    assert_eq!(super::signal_name(0), "0");
    let past = libc::SIGRTMAX() + 1;
    assert_eq!(super::signal_name(past), past.to_string());
}

/// Dying by a signal turns the wrapper's core dumps off without asking
/// for a hard limit an unprivileged process may not set; a signal whose
/// default action is to be ignored returns to the caller.
#[test]
fn dying_turns_core_dumps_off_within_a_finite_hard_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    if !is_root() {
        skip(
            "dying_turns_core_dumps_off_within_a_finite_hard_limit",
            "needs root to run a thread as another uid",
        );
        return;
    }
    // Without CAP_SYS_RESOURCE the hard limit, once lowered, stays so for
    // the rest of this process: only where it runs alone (nextest).
    let alone =
        std::env::var_os("NEXTEST_EXECUTION_MODE").is_some_and(|mode| mode == "process-per-test");
    if !alone && !has_effective_capability(CAP_SYS_RESOURCE) {
        skip(
            "dying_turns_core_dumps_off_within_a_finite_hard_limit",
            "without CAP_SYS_RESOURCE its lowered core limit would stay for the other tests \
             of this process; runs under nextest, a process per test",
        );
        return;
    }
    let _core = CORE_LIMIT.lock().unwrap_or_else(PoisonError::into_inner);
    let saved = getrlimit(Resource::Core);
    let finite = Rlimit {
        current: Some(1000),
        maximum: Some(1000),
    };
    setrlimit(Resource::Core, finite).unwrap();
    let after = std::thread::spawn(|| {
        // This thread only (the raw syscall): its capabilities go too.
        let nobody = rustix::process::Uid::from_raw(65534);
        rustix::thread::set_thread_res_uid(nobody, nobody, nobody).unwrap();
        super::die_of_signal(libc::SIGWINCH);
        getrlimit(Resource::Core)
    })
    .join();
    // Back as it was, where this process may raise its hard limit
    // (CAP_SYS_RESOURCE).
    let _ = setrlimit(Resource::Core, saved);
    let after = after.unwrap();
    assert_eq!((after.current, after.maximum), (Some(0), Some(1000)));
}
