//! Sandboxes against a real daemon and kernel: a peer whose policy
//! imposes a profile tries to escape it.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::util::{
    Daemon, eventually, output_within, root_or_skip, sched_policy, start_daemon_with, wait_within,
    zygote_bin,
};

/// A profile binding the system read-only and `work` read-write, in
/// every namespace, under the `default` seccomp profile.
fn full_profile(work: &str) -> String {
    format!(
        "[sandbox.box]\nnetwork = \"none\"\nisolate = true\nhostname = \"box\"\n\
         seccomp = \"default\"\nro_bind = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\"]\n\
         bind = [\"{work}\"]\n\n[[peer]]\nuids = [0, 65534]\nsandbox = \"box\"\n"
    )
}

/// `zygote run -- /bin/sh -c SCRIPT` in `cwd`, as `uid` when given.
fn run(daemon: &Daemon, cwd: &str, uid: Option<u32>, script: &str) -> Output {
    run_with(daemon, cwd, uid, &[], script)
}

/// [`run`] with `zygote run` options (`--tmpfs /x`, ...) before the `--`.
fn run_with(
    daemon: &Daemon,
    cwd: &str,
    uid: Option<u32>,
    options: &[&str],
    script: &str,
) -> Output {
    output_within(
        start_run(daemon, cwd, uid, options, script),
        Duration::from_secs(30),
        "zygote run",
    )
}

/// [`run_with`], returning at once with the `zygote run` process.
fn start_run(
    daemon: &Daemon,
    cwd: &str,
    uid: Option<u32>,
    options: &[&str],
    script: &str,
) -> std::process::Child {
    let mut command = Command::new(zygote_bin());
    command
        .arg("run")
        .args(options)
        .args(["--", "/bin/sh", "-c", script])
        .env("ZYGOTE_SOCKET", daemon.socket())
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    command.spawn().expect("start zygote run")
}

/// Python that tries ptrace, keyctl and an AF_INET connect to 127.0.0.1,
/// printing each errno's name.
const SYSCALLS: &str = "
import ctypes, errno, socket
libc = ctypes.CDLL(None, use_errno=True)
for name, number in (('ptrace', 101), ('keyctl', 250)):
    ret = libc.syscall(number, 0, 0, 0, 0)
    print(name, errno.errorcode.get(ctypes.get_errno(), 'ESCAPE') if ret < 0 else 'ESCAPE')
try:
    socket.create_connection(('127.0.0.1', 22), timeout=2)
    print('connect ESCAPE')
except OSError as error:
    print('connect', errno.errorcode.get(error.errno, str(error)))
";

fn work_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("zygote-sandbox-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// What a confined peer tries, each attempt printing ESCAPE-* if it
/// works. /dev/null must work first: a redirection to it that failed
/// would skip each probe below and hide an escape. Last, the shell's
/// parent pid: 1 under an init that started it, 0 when it entered a
/// parked init's namespaces (its parent, the daemon, is outside).
const ESCAPE_SCRIPT: &str = "\
    echo probe >/dev/null && echo dev-null-writable; \
    echo urandom $(head -c 16 /dev/urandom | wc -c) zero $(head -c 4 /dev/zero | wc -c); \
    cat /etc/shadow >/dev/null 2>&1 && echo ESCAPE-shadow; \
    ls /root >/dev/null 2>&1 && echo ESCAPE-root; \
    ls /home >/dev/null 2>&1 && echo ESCAPE-home; \
    touch /usr/escape 2>/dev/null && echo ESCAPE-usr; \
    touch /escape 2>/dev/null && echo ESCAPE-slash; \
    touch inside && echo wrote-inside; \
    mount -t tmpfs none /tmp 2>/dev/null && echo ESCAPE-mount; \
    unshare -U true 2>/dev/null && echo ESCAPE-unshare; \
    python3 syscalls.py; \
    ./id-setuid | grep -q euid= && echo ESCAPE-setuid; \
    echo pids $(ls /proc | grep -c '^[0-9]'); \
    echo host $(hostname); \
    grep -E '^(NoNewPrivs|CapBnd|CapEff|Seccomp):' /proc/self/status; \
    echo ppid $PPID";

/// Puts the escape attempts' helpers in `work`: a setuid-root copy of
/// id(1), which would print euid=0 if it gained, and the syscalls probe.
fn prepare_escape(work: &std::path::Path) {
    let setuid = work.join("id-setuid");
    std::fs::copy("/usr/bin/id", &setuid).unwrap();
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::write(work.join("syscalls.py"), SYSCALLS).unwrap();
}

/// Runs [`ESCAPE_SCRIPT`] in `work` as `uid` under [`full_profile`],
/// checks that every attempt failed, and returns the shell's parent pid.
fn escape_fails(daemon: &Daemon, work: &std::path::Path, uid: Option<u32>) -> u32 {
    let _ = std::fs::remove_file(work.join("inside"));
    let output = run(daemon, work.to_str().unwrap(), uid, ESCAPE_SCRIPT);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!text.contains("ESCAPE"), "{text}");
    for denied in ["ptrace EPERM", "keyctl EPERM", "connect ENETUNREACH"] {
        assert!(text.contains(denied), "{denied}: {text}");
    }
    assert!(text.contains("wrote-inside"), "{text}");
    assert!(text.contains("dev-null-writable"), "{text}");
    assert!(text.contains("urandom 16 zero 4"), "{text}");
    assert!(work.join("inside").exists());
    // The init, the shell, its subshell, ls and grep: only the child's own
    // tree (the host has hundreds).
    let pids: usize = text
        .lines()
        .find_map(|line| line.strip_prefix("pids "))
        .and_then(|n| n.trim().parse().ok())
        .expect("pid count");
    assert!(pids <= 6, "{text}");
    assert!(text.contains("host box"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(text.contains("CapBnd:\t0000000000000000"), "{text}");
    assert!(text.contains("Seccomp:\t2"), "{text}");
    text.lines()
        .find_map(|line| line.strip_prefix("ppid "))
        .and_then(|ppid| ppid.trim().parse().ok())
        .expect("the shell's parent pid")
}

/// A root daemon imposing [`full_profile`] on uids 0 and 65534 (with
/// its work directory, which holds the escape attempts' helpers).
fn escape_daemon(name: &str) -> (tempfile::TempDir, Daemon) {
    let work = work_dir();
    let path = work.path().to_str().unwrap();
    let daemon = start_daemon_with(name, Some(&full_profile(path)), &["--socket-mode", "0666"]);
    prepare_escape(work.path());
    (work, daemon)
}

/// [`escape_daemon`] after a first spawn of uid 65534, once that plan's
/// inits are parked.
fn daemon_with_parked_inits(name: &str) -> (tempfile::TempDir, Daemon) {
    let (work, daemon) = escape_daemon(name);
    let path = work.path().to_str().unwrap();
    assert!(run(&daemon, path, Some(65534), "true").status.success());
    assert!(
        eventually(Duration::from_secs(10), || inits_of(&daemon).len()
            == PARKED_PER_PLAN),
        "no init parked: {:?}\n{}",
        inits_of(&daemon),
        daemon.log()
    );
    (work, daemon)
}

/// Parked inits are made by a spawner of their own (of parks), each
/// sharing its memory instead of a copy: at the usual `SCHED_BATCH` while
/// spawns find none ready (a plan's first), then in the background under
/// `SCHED_IDLE`. The inits themselves run under `SCHED_OTHER`, and the
/// spawner of children keeps `SCHED_BATCH`.
#[test]
fn parked_inits_are_made_in_the_background_sharing_their_makers_memory() {
    if !root_or_skip("a root daemon with spawner processes") {
        return;
    }
    let (work, daemon) = daemon_with_parked_inits("sandbox-park-policy");
    let spawners = daemon.spawners();
    assert_eq!(spawners.len(), 1, "{spawners:?}");
    assert_eq!(sched_policy(spawners[0]), "3", "children's: SCHED_BATCH");
    let maker = the_park_spawner(&daemon);
    assert_eq!(
        sched_policy(maker),
        "3",
        "behind the first spawn: SCHED_BATCH"
    );
    let inits = inits_of(&daemon);
    assert!(!inits.is_empty());
    for init in &inits {
        assert!(same_memory(maker, *init), "init {init} has a copy");
        assert_eq!(sched_policy(*init), "0", "init {init}: SCHED_OTHER");
    }
    // Once the pool keeps up, the next inits are made in the background.
    let path = work.path().to_str().unwrap();
    let mut spawns = 0;
    while sched_policy(maker) != "5" && spawns < 300 {
        assert!(run(&daemon, path, Some(65534), "true").status.success());
        spawns += 1;
    }
    assert_eq!(
        sched_policy(maker),
        "5",
        "after {spawns} spawns: SCHED_IDLE"
    );
    assert_eq!(daemon.park_spawners(), vec![maker]);
    assert_eq!(sched_policy(spawners[0]), "3");
}

/// A parked init shares its maker's memory for life, yet is not a child
/// that maker waits for before exec: when the spawner of parks retires
/// (idle a minute), the sandbox an init of its serves lives on.
#[test]
fn a_sandbox_outlives_the_spawner_that_made_its_init() {
    if !root_or_skip("a root daemon with spawner processes") {
        return;
    }
    let (work, daemon) = daemon_with_parked_inits("sandbox-park-retire");
    let maker = the_park_spawner(&daemon);
    let path = work.path().to_str().unwrap();
    let mut program = start_run(
        &daemon,
        path,
        Some(65534),
        &[],
        "echo started; exec sleep 300",
    );
    let stdout = program.stdout.take().expect("stdout");
    let (sender, started) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = sender.send(line);
    });
    let line = started.recv_timeout(Duration::from_secs(30));
    assert_eq!(line.as_deref(), Ok("started\n"));
    let retired = eventually(Duration::from_secs(90), || {
        !daemon.park_spawners().contains(&maker)
    });
    assert!(retired, "the spawner of parks never retired");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        program.try_wait().expect("try_wait").is_none(),
        "the sandbox ended with the spawner that made its init"
    );
    let _ = program.kill();
    let _ = program.wait();
}

/// Asks for parked inits wait their turn behind a spawner of parks slow
/// to answer (a busy machine; here, a stopped one) instead of being
/// dropped until the plan's next spawn: every init asked for is made.
#[test]
fn inits_asked_of_a_slow_spawner_of_parks_are_all_made() {
    use rustix::process::{Pid, Signal, kill_process};
    if !root_or_skip("a root daemon with spawner processes") {
        return;
    }
    let (work, daemon) = daemon_with_parked_inits("sandbox-park-slow");
    let maker = Pid::from_raw(the_park_spawner(&daemon) as i32).expect("a pid");
    kill_process(maker, Signal::STOP).expect("SIGSTOP the spawner of parks");
    let path = work.path().to_str().unwrap();
    // Each spawn takes a parked init and asks for the next; the second
    // asks once the first ask has waited longer than a spawn ever would.
    for _ in 0..PARKED_PER_PLAN {
        let output = run(&daemon, path, Some(65534), "true");
        std::thread::sleep(Duration::from_millis(400));
        assert!(output.status.success(), "{output:?}");
    }
    kill_process(maker, Signal::CONT).expect("SIGCONT the spawner of parks");
    assert!(
        eventually(Duration::from_secs(10), || inits_of(&daemon).len()
            == PARKED_PER_PLAN),
        "not every init was made: {:?}\n{}",
        inits_of(&daemon),
        daemon.log()
    );
}

/// The daemon's one spawner of parks (its parked inits' maker).
fn the_park_spawner(daemon: &Daemon) -> u32 {
    let makers = daemon.park_spawners();
    assert_eq!(makers.len(), 1, "{makers:?}");
    makers[0]
}

/// Whether processes `a` and `b` share their memory (`kcmp(KCMP_VM)`).
fn same_memory(a: u32, b: u32) -> bool {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp takes two pids, a type and two unused indexes.
    unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_VM, 0, 0) == 0 }
}

#[test]
fn imposed_sandbox_confines_a_peer_that_tries_to_escape() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let (work, daemon) = escape_daemon("sandbox-escape");
    assert_eq!(
        escape_fails(&daemon, work.path(), Some(65534)),
        1,
        "under its init"
    );
}

/// How many inits the daemon keeps parked for one plan and peer.
const PARKED_PER_PLAN: usize = 2;

/// The daemon's fds each parked init holds: its pidfd twice (one to
/// enter, one to reap) and its release pipe.
const FDS_PER_PARKED_INIT: usize = 3;

/// The daemon's children named `zygote-init`: parked inits, and the
/// inits of sandboxes that made their own namespaces.
fn inits_of(daemon: &Daemon) -> Vec<u32> {
    children_named(daemon, "zygote-init")
}

/// The processes holding the daemon's mount templates.
fn templates_of(daemon: &Daemon) -> Vec<u32> {
    children_named(daemon, "zygote-template")
}

fn children_named(daemon: &Daemon, name: &str) -> Vec<u32> {
    crate::util::children_of(daemon.pid())
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
        .collect()
}

/// The namespaces a process is in, and those its children start in.
fn namespaces_of(pid: u32) -> Vec<String> {
    ["mnt", "pid_for_children", "ipc", "uts", "net"]
        .iter()
        .map(|kind| {
            std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
                .map(|link| link.display().to_string())
                .unwrap_or_else(|error| format!("{kind}: {error}"))
        })
        .collect()
}

/// After a spawn of a sandbox with a pid namespace, the daemon parks an
/// init for the same plan and peer; the next such spawn enters its
/// namespaces instead of making its own, and is confined as tightly.
/// Another peer never enters it, and the spawner that entered comes back
/// to its own namespaces.
#[test]
fn a_spawn_that_enters_a_parked_init_is_confined_as_one_that_made_its_own() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let (work, daemon) = escape_daemon("sandbox-parked");
    let path = work.path().to_str().unwrap();
    let output = run(&daemon, path, Some(65534), "echo ppid $PPID");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "ppid 1",
        "the first spawn of a plan makes its own namespaces: {output:?}"
    );
    let parked = || inits_of(&daemon).len() == PARKED_PER_PLAN;
    for _ in 0..2 {
        assert!(
            eventually(Duration::from_secs(10), parked),
            "no init parked: {:?}\n{}",
            inits_of(&daemon),
            daemon.log()
        );
        assert_eq!(
            escape_fails(&daemon, work.path(), Some(65534)),
            0,
            "entered one"
        );
    }
    // The spawner that entered is back in the daemon's namespaces.
    let spawners = daemon.spawners();
    assert!(!spawners.is_empty());
    for spawner in spawners {
        assert_eq!(namespaces_of(spawner), namespaces_of(daemon.pid()));
    }
    // Root's plan is another (its paths are resolved as root): it makes
    // its own namespaces while 65534's inits wait.
    assert!(eventually(Duration::from_secs(10), parked));
    let output = run(&daemon, path, None, "echo ppid $PPID");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "ppid 1",
        "root entered another peer's init: {output:?}"
    );
    // An entering program is pid 2, and its own exit code or signal comes
    // back from its own pidfd (no init reports it). Root's plan has its
    // inits parked now too.
    let parked = || inits_of(&daemon).len() == 2 * PARKED_PER_PLAN;
    assert!(eventually(Duration::from_secs(10), parked));
    let output = run(
        &daemon,
        path,
        Some(65534),
        "echo $$ $PPID; kill -TERM $$; sleep 5",
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "2 0");
    assert_eq!(output.status.signal(), Some(libc::SIGTERM), "{output:?}");
    assert!(eventually(Duration::from_secs(10), parked));
    let output = run(&daemon, path, Some(65534), "echo $PPID; exit 7");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "0");
    assert_eq!(output.status.code(), Some(7), "{output:?}");
}

/// A bind source replaced after an init was parked for its plan (a work
/// directory made anew per job) is never served from that init: the
/// spawn makes its own namespaces and binds the new one, and the plan's
/// inits are made anew.
#[test]
fn a_spawn_whose_bind_source_was_replaced_binds_the_new_one() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let (work, daemon) = daemon_with_parked_inits("sandbox-replaced");
    let path = work.path();
    let old = path.with_extension("old");
    std::fs::rename(path, &old).unwrap();
    std::fs::create_dir(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(path.join("marker"), "new\n").unwrap();
    let spawn = || {
        let _ = std::fs::remove_file(path.join("written"));
        let output = run(
            &daemon,
            path.to_str().unwrap(),
            Some(65534),
            "echo ppid $PPID; cat marker; touch written",
        );
        let _ = std::fs::remove_dir_all(&old);
        (String::from_utf8_lossy(&output.stdout).into_owned(), output)
    };
    let (text, output) = spawn();
    assert_eq!(text, "ppid 1\nnew\n", "made its own: {output:?}");
    assert!(
        path.join("written").exists(),
        "written to the old directory"
    );
    // The inits parked since bind the new directory, and are entered.
    assert!(
        eventually(Duration::from_secs(10), || inits_of(&daemon).len()
            == PARKED_PER_PLAN),
        "no init parked: {:?}",
        inits_of(&daemon)
    );
    let (text, output) = spawn();
    assert_eq!(text, "ppid 0\nnew\n", "entered one: {output:?}");
    assert!(path.join("written").exists());
}

/// The mounts of a process's mount namespace: (mount point, options,
/// device, filesystem type), from its `mountinfo`.
fn mounts_of(pid: u32) -> Vec<(String, String, String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().position(|field| *field == "-").expect("-");
            (
                fields[4].to_owned(),
                fields[5].to_owned(),
                fields[2].to_owned(),
                fields[separator + 1].to_owned(),
            )
        })
        .collect()
}

/// A plan's binds and `/dev` are built once, read-only, in a mount
/// template; each parked init copies it and mounts its own `/proc`,
/// devpts and tmpfs, so that nothing one spawn writes reaches the next.
#[test]
fn parked_inits_copy_a_read_only_mount_template_and_mount_their_own_tmpfs() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let (work, daemon) = escape_daemon("sandbox-template");
    let path = work.path().to_str().unwrap();
    let script = "echo ppid $PPID; ls -A /scratch; touch /scratch/left; \
                  touch /slash 2>&1 | grep -o 'Read-only file system'";
    let spawn = || {
        run_with(
            &daemon,
            path,
            Some(65534),
            &["--sandbox", "box", "--tmpfs", "/scratch"],
            script,
        )
    };
    let first = spawn();
    assert_eq!(
        String::from_utf8_lossy(&first.stdout),
        "ppid 1\nRead-only file system\n",
        "made its own root: {first:?}"
    );
    let ready = || inits_of(&daemon).len() == PARKED_PER_PLAN && templates_of(&daemon).len() == 1;
    assert!(
        eventually(Duration::from_secs(10), ready),
        "inits {:?}, templates {:?}\n{}",
        inits_of(&daemon),
        templates_of(&daemon),
        daemon.log()
    );
    // The template: binds and /dev, a read-only root, no /proc, devpts
    // or tmpfs of its own.
    let template = mounts_of(templates_of(&daemon)[0]);
    let at = |mounts: &[(String, String, String, String)], point: &str| {
        mounts
            .iter()
            .rev()
            .find(|mount| mount.0 == point)
            .cloned()
            .unwrap_or_else(|| panic!("{point}: {mounts:?}"))
    };
    let root = at(&template, "/");
    assert!(root.1.starts_with("ro,"), "{template:?}");
    assert!(at(&template, "/usr").1.starts_with("ro,"), "{template:?}");
    assert!(at(&template, "/dev").1.starts_with("ro,"), "{template:?}");
    for own in ["/proc", "/dev/pts", "/scratch"] {
        assert!(
            template.iter().all(|mount| mount.0 != own),
            "{own}: {template:?}"
        );
    }
    // Each init: the template's root (the same tmpfs), and its own /proc,
    // devpts and /scratch.
    let inits: Vec<_> = inits_of(&daemon).into_iter().map(mounts_of).collect();
    let copies: Vec<_> = inits
        .iter()
        .filter(|init| at(init, "/").2 == root.2)
        .collect();
    assert!(!copies.is_empty(), "no init copied the template: {inits:?}");
    for init in &copies {
        assert!(at(init, "/").1.starts_with("ro,"), "{init:?}");
        assert_eq!(at(init, "/proc").3, "proc", "{init:?}");
        assert_eq!(at(init, "/dev/pts").3, "devpts", "{init:?}");
        assert_eq!(at(init, "/scratch").3, "tmpfs", "{init:?}");
    }
    for own in ["/proc", "/dev/pts", "/scratch"] {
        let devices: std::collections::HashSet<_> =
            inits.iter().map(|init| at(init, own).2).collect();
        assert_eq!(devices.len(), inits.len(), "{own} shared: {inits:?}");
    }
    // Entered in turn: each finds its /scratch empty, and / read-only.
    for _ in 0..PARKED_PER_PLAN {
        let output = spawn();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "ppid 0\nRead-only file system\n",
            "entered one: {output:?}"
        );
    }
    // A template whose process was killed is built anew, and spawns go
    // on meanwhile.
    let killed = templates_of(&daemon)[0];
    let pid = rustix::process::Pid::from_raw(i32::try_from(killed).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    let rebuilt = || {
        let templates = templates_of(&daemon);
        templates.len() == 1 && templates[0] != killed
    };
    for _ in 0..3 {
        let output = spawn();
        assert!(output.status.success(), "{output:?}");
        if eventually(Duration::from_secs(2), rebuilt) {
            break;
        }
    }
    assert!(
        eventually(Duration::from_secs(10), rebuilt),
        "templates {:?}\n{}",
        templates_of(&daemon),
        daemon.log()
    );
}

/// A sandbox with a filesystem but no pid namespace of its own (vforked
/// by a spawner, never parked) copies its plan's mount template once one
/// is built, and is confined alike; a bind source replaced since is
/// caught: that spawn builds its own root, and the template is made anew.
#[test]
fn a_sandbox_without_a_pid_namespace_copies_its_mount_template() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let work = work_dir();
    let path = work.path().to_str().unwrap();
    let policy = format!(
        "[sandbox.flat]\nnetwork = \"none\"\nseccomp = \"default\"\n\
         ro_bind = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\"]\nbind = [\"{path}\"]\n\
         tmpfs = [\"/scratch\"]\n\n[[peer]]\nuids = [65534]\nsandbox = \"flat\"\n"
    );
    let daemon = start_daemon_with(
        "sandbox-flat-template",
        Some(&policy),
        &["--socket-mode", "0666"],
    );
    let script = "cat marker; ls -A /scratch; touch /scratch/left inside; \
                  touch /slash 2>&1 | grep -o 'Read-only file system'; \
                  grep ' / / ' /proc/self/mountinfo | cut -d' ' -f3";
    let spawn = |marker: &str| {
        std::fs::write(work.path().join("marker"), format!("{marker}\n")).unwrap();
        let _ = std::fs::remove_file(work.path().join("inside"));
        let output = run(&daemon, path, Some(65534), script);
        assert!(output.status.success(), "{output:?}");
        assert!(work.path().join("inside").exists(), "{output:?}");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        let Some((root, confined)) = lines.split_last() else {
            panic!("{output:?}");
        };
        assert_eq!(confined, [marker, "Read-only file system"], "{output:?}");
        (*root).to_owned()
    };
    // The first builds its own root, and has the template built.
    spawn("first");
    assert!(
        eventually(Duration::from_secs(10), || templates_of(&daemon).len() == 1),
        "no template\n{}",
        daemon.log()
    );
    let template_root = |daemon: &Daemon| {
        let template = mounts_of(templates_of(daemon)[0]);
        template
            .iter()
            .find(|mount| mount.0 == "/")
            .map(|mount| mount.2.clone())
            .expect("the template's root")
    };
    let root = template_root(&daemon);
    let holder = templates_of(&daemon)[0];
    assert_eq!(spawn("second"), root, "copied the template's root");
    assert_eq!(spawn("third"), root, "copied it again");
    // Replaced: caught, its own root; the template is made anew.
    let old = work.path().with_extension("old");
    std::fs::rename(work.path(), &old).unwrap();
    std::fs::create_dir(work.path()).unwrap();
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // A copy of the template would bind the old directory: its marker
    // read, `inside` written there. Not told by the root's device number,
    // which the new root's tmpfs may reuse once the template is gone.
    spawn("fourth");
    let _ = std::fs::remove_dir_all(&old);
    let renewed = || templates_of(&daemon) != [holder] && templates_of(&daemon).len() == 1;
    for marker in ["fifth", "sixth"] {
        spawn(marker);
        if eventually(Duration::from_secs(2), renewed) {
            break;
        }
    }
    assert!(eventually(Duration::from_secs(10), renewed));
    let root = template_root(&daemon);
    assert_eq!(spawn("seventh"), root, "copies the new template");
}

/// CPU time (user and system, in clock ticks) and voluntary context
/// switches of a process so far.
fn cpu_and_wakeups(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .expect("stat's comm")
        .1
        .split(' ')
        .collect();
    // utime and stime: fields 14 and 15, the 12th and 13th after the comm.
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let wakeups = status
        .lines()
        .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
        .expect("voluntary_ctxt_switches")
        .trim()
        .parse()
        .unwrap();
    (ticks, wakeups)
}

/// A program that leaves orphans to its init: one that lives on, and a
/// process group of five killed at once (their exits may come to the
/// init as one signal); the shell then counts the zombies left in its
/// pid namespace.
const ORPHAN_SCRIPT: &str = "(sleep 30 &); \
    (setsid sh -c 'echo $$ > group; sleep 30 & sleep 30 & sleep 30 & sleep 30 & wait' &); \
    sleep 0.2; kill -s KILL -- -$(cat group) && echo killed; sleep 0.7; \
    echo zombies $(grep -l '^State:.Z' /proc/[0-9]*/status 2>/dev/null | wc -l); echo alive";

/// An init, parked or not, sleeps while it waits (no polling), reaps the
/// orphans that come to it without spinning, and keeps its program
/// running through them; a parked init that was entered ends with its
/// program.
#[test]
fn an_init_sleeps_while_it_waits_and_reaps_orphans() {
    use zygote_client::Stdio;
    use zygote_client::blocking::{Client, Command};

    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let (work, daemon) = daemon_with_parked_inits("sandbox-orphans");
    let path = work.path().to_str().unwrap();
    let before = inits_of(&daemon);
    let counts: Vec<(u64, u64)> = before.iter().map(|pid| cpu_and_wakeups(*pid)).collect();
    std::thread::sleep(Duration::from_millis(500));
    for (pid, (ticks, wakeups)) in before.iter().zip(counts) {
        let (ticks_after, wakeups_after) = cpu_and_wakeups(*pid);
        assert!(
            wakeups_after - wakeups < 10 && ticks_after - ticks < 10,
            "a parked init woke {} times in 0.5 s, using {} ticks",
            wakeups_after - wakeups,
            ticks_after - ticks
        );
    }
    let running = start_run(&daemon, path, Some(65534), &[], ORPHAN_SCRIPT);
    let counts: Vec<(u64, u64)> = before.iter().map(|pid| cpu_and_wakeups(*pid)).collect();
    // The orphans have exited and been reaped by the init entered.
    std::thread::sleep(Duration::from_millis(600));
    for (pid, (ticks, _)) in before.iter().zip(counts) {
        let (ticks_after, _) = cpu_and_wakeups(*pid);
        assert!(
            ticks_after - ticks < 10,
            "a parked init spun: {} ticks",
            ticks_after - ticks
        );
    }
    let output = output_within(running, Duration::from_secs(30), "zygote run");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "killed\nzombies 0\nalive\n",
        "{output:?}"
    );
    // The init it entered ended with it; the other is still parked.
    let left = || {
        before
            .iter()
            .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            .count()
    };
    assert!(
        eventually(Duration::from_secs(10), || left() == 1),
        "{before:?}: {}",
        left()
    );

    // An init that starts its program (no spawners: none is parked).
    let daemon = daemon_without_spawners("sandbox-orphans-init", &full_profile(path));
    let client = Client::connect(daemon.socket()).expect("connect");
    let child = Command::new(&client, "/bin/sh")
        .args(["-c", ORPHAN_SCRIPT])
        .current_dir(path)
        .timeout(Duration::from_secs(30))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn under the imposed profile");
    let init = child.id();
    let comm = std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap_or_default();
    assert_eq!(
        comm.trim_end(),
        "zygote-init",
        "the spawn's pid is its init's"
    );
    let (ticks, _) = cpu_and_wakeups(init);
    std::thread::sleep(Duration::from_millis(600));
    let (ticks_after, _) = cpu_and_wakeups(init);
    assert!(
        ticks_after - ticks < 10,
        "the init spun: {} ticks",
        ticks_after - ticks
    );
    let output = child.wait_with_output().expect("wait");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "killed\nzombies 0\nalive\n",
        "{output:?}"
    );
}

/// A parked init that dies before its spawn (only root or the OOM killer
/// can kill it) is passed over: the spawn makes its own namespaces, and
/// runs.
#[test]
fn a_parked_init_that_died_is_passed_over() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let (work, daemon) = daemon_with_parked_inits("sandbox-parked-dead");
    let path = work.path().to_str().unwrap();
    for pid in inits_of(&daemon) {
        let pid = rustix::process::Pid::from_raw(pid.cast_signed()).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill an init");
    }
    // Dead, not dying: one still exiting can be taken (a known gap).
    assert!(eventually(Duration::from_secs(10), || inits_of(&daemon).is_empty()));
    let output = run(&daemon, path, Some(65534), "echo ppid $PPID");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "ppid 1",
        "{output:?}\n{}",
        daemon.log()
    );
}

/// Checks the output of a script run as `uid` under a sandbox: it ran,
/// escaped nothing, wrote inside, and ran with `no_new_privs`, no
/// capability and a seccomp filter; its stdout.
fn assert_confined(uid: Option<u32>, output: &Output, daemon: &Daemon) -> String {
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{uid:?}: {text} {output:?}\n{}",
        daemon.log()
    );
    assert!(!text.contains("ESCAPE"), "{uid:?}: {text}");
    assert!(text.contains("wrote-inside"), "{uid:?}: {text}");
    for line in [
        "NoNewPrivs:\t1",
        "CapBnd:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "Seccomp:\t2",
    ] {
        assert!(text.contains(line), "{uid:?}: {line}: {text}");
    }
    text
}

/// The value of `zygote_spawn_paths_total{path="PATH"}`.
fn spawns_by_path(metrics: std::net::SocketAddr, path: &str) -> Option<f64> {
    let (_, text) = crate::tools::http_get(metrics, "/metrics").expect("GET /metrics");
    let series = format!("zygote_spawn_paths_total{{path=\"{path}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
}

/// A sandbox without a new pid namespace (filesystem, network none,
/// seccomp, Landlock) is vforked by a spawner process, root's for a root
/// peer, and confines as on the fork path; one that isolates forks.
#[test]
fn a_sandbox_without_a_pid_namespace_is_set_up_by_a_spawner_and_confines() {
    if !root_or_skip("a root daemon with spawner processes") {
        return;
    }
    let work = work_dir();
    let other = work_dir();
    let path = work.path().to_str().unwrap();
    let policy = format!(
        "[sandbox.flat]\nnetwork = \"none\"\nseccomp = \"default\"\n\
         ro_bind = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\"]\nbind = [\"{path}\"]\n\
         landlock_rx = [\"/\"]\nlandlock_rw = [\"{path}\", \"/dev\"]\n\n\
         [[peer]]\nuids = [0, 65534]\nsandbox = \"flat\"\n"
    );
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], crate::tools::free_port()));
    let metrics_text = metrics.to_string();
    let daemon = start_daemon_with(
        "sandbox-spawner",
        Some(&policy),
        &["--socket-mode", "0666", "--metrics-listen", &metrics_text],
    );
    let script = format!(
        "cat /etc/shadow >/dev/null 2>&1 && echo ESCAPE-shadow; \
         ls /home >/dev/null 2>&1 && echo ESCAPE-home; \
         touch {}/outside 2>/dev/null && echo ESCAPE-outside; \
         unshare --ipc true 2>/dev/null && echo ESCAPE-unshare; \
         touch inside-$(id -u) && echo wrote-inside; \
         echo links $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '); \
         grep -E '^(NoNewPrivs|CapBnd|CapEff|Seccomp):' /proc/self/status",
        other.path().display()
    );
    for uid in [Some(65534), None] {
        let output = run(&daemon, path, uid, &script);
        let text = assert_confined(uid, &output, &daemon);
        assert!(text.contains("links lo\n"), "{uid:?}: {text}");
    }
    assert!(work.path().join("inside-65534").exists());
    assert!(work.path().join("inside-0").exists());
    assert!(!other.path().join("outside").exists());
    assert_eq!(daemon.spawners().len(), 2, "one for 65534, one for root");
    assert_eq!(spawns_by_path(metrics, "spawner"), Some(2.0));
    assert_eq!(spawns_by_path(metrics, "fork"), Some(0.0));
    // Tightened with isolate: an init that never execs, so forked.
    let output = Command::new(zygote_bin())
        .args(["run", "--sandbox", "flat", "--isolate", "--", "/bin/true"])
        .env("ZYGOTE_SOCKET", daemon.socket())
        .current_dir(path)
        .stdin(Stdio::null())
        .output()
        .expect("zygote run");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(spawns_by_path(metrics, "fork"), Some(1.0));
    // Its plan's inits are parked since, and counted while ready.
    let gauge = || crate::spawners::metric(metrics, "zygote_parked_inits");
    let parked = f64::from(u32::try_from(PARKED_PER_PLAN).expect("small"));
    assert!(
        eventually(Duration::from_secs(10), || gauge() == Some(parked)),
        "zygote_parked_inits: {:?}",
        gauge()
    );
}

/// A sandbox of one seccomp profile, Landlock and no namespace: its
/// child inherits the filter from a spawner that installed that profile
/// on itself, and is confined as if it had installed it.
#[test]
fn a_filters_only_sandbox_inherits_its_seccomp_profile_from_a_spawner_holding_it() {
    if !root_or_skip("a root daemon with spawner processes") {
        return;
    }
    let work = work_dir();
    let other = work_dir();
    let path = work.path().to_str().unwrap();
    let policy = format!(
        "[sandbox.filters]\nseccomp = \"default\"\nlandlock_rx = [\"/\"]\n\
         landlock_rw = [\"{path}\", \"/dev\"]\n\n[[peer]]\nuids = [0, 65534]\n\
         sandbox = \"filters\"\n"
    );
    let daemon = start_daemon_with("sandbox-inherit", Some(&policy), &["--socket-mode", "0666"]);
    let script = format!(
        "touch {}/outside 2>/dev/null && echo ESCAPE-outside; \
         unshare --ipc true 2>/dev/null && echo ESCAPE-unshare; \
         touch inside-$(id -u) && echo wrote-inside; \
         grep -E '^(NoNewPrivs|CapBnd|CapEff|Seccomp|Seccomp_filters):' /proc/self/status",
        other.path().display()
    );
    for uid in [Some(65534), None] {
        let output = run(&daemon, path, uid, &script);
        let text = assert_confined(uid, &output, &daemon);
        // One filter, the inherited one: none installed on top.
        assert!(text.contains("Seccomp_filters:\t1"), "{uid:?}: {text}");
    }
    assert!(!other.path().join("outside").exists());
    let spawners = daemon.spawners();
    assert_eq!(spawners.len(), 2, "one for 65534, one for root");
    for spawner in spawners {
        let cmdline = std::fs::read(format!("/proc/{spawner}/cmdline")).unwrap();
        assert!(
            String::from_utf8_lossy(&cmdline).contains("--seccomp\0default"),
            "{cmdline:?}"
        );
        let status = std::fs::read_to_string(format!("/proc/{spawner}/status")).unwrap();
        assert!(
            status.contains("Seccomp:\t2"),
            "the spawner holds it: {status}"
        );
        // And the rest its children would each do: inherited at clone.
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
        assert!(status.contains("CapBnd:\t0000000000000000"), "{status}");
        // Its own capabilities stay, for the children's setup.
        assert!(!status.contains("CapEff:\t0000000000000000"), "{status}");
    }
}

#[test]
fn landlock_alone_denies_writes_outside_its_read_write_list() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let work = work_dir();
    let other = work_dir();
    let path = work.path().to_str().unwrap();
    let policy = format!(
        "[sandbox.lock]\nlandlock_rx = [\"/\"]\nlandlock_rw = [\"{path}\", \"/dev/null\"]\n\
         landlock_require = true\n\n[[peer]]\nuids = [65534]\nsandbox = \"lock\"\n"
    );
    let daemon = start_daemon_with(
        "sandbox-landlock",
        Some(&policy),
        &["--socket-mode", "0666"],
    );
    let script = format!(
        "touch {}/outside 2>/dev/null && echo ESCAPE-outside; touch inside && echo wrote-inside",
        other.path().display()
    );
    let output = run(&daemon, path, Some(65534), &script);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("wrote-inside"), "{text} {output:?}");
    assert!(!text.contains("ESCAPE"), "{text}");
    assert!(!other.path().join("outside").exists());
}

/// A policy profile's Landlock rules are held by a spawner process that
/// enforced them on itself, and its children inherit them at clone: each
/// is confined alike, and a request's own rules on top still narrow them.
#[test]
fn a_profiles_landlock_rules_are_inherited_from_a_spawner_holding_them() {
    if !root_or_skip("a root daemon with spawner processes") {
        return;
    }
    let work = work_dir();
    let other = work_dir();
    let path = work.path().to_str().unwrap();
    let policy = format!(
        "[sandbox.lock]\nlandlock_rx = [\"/\"]\nlandlock_rw = [\"{path}\", \"/dev/null\"]\n\n\
         [[peer]]\nuids = [65534]\nsandbox = \"lock\"\n"
    );
    let daemon = start_daemon_with("sandbox-held", Some(&policy), &["--socket-mode", "0666"]);
    let script = format!(
        "touch {}/outside 2>/dev/null && echo ESCAPE-outside; \
         touch inside 2>/dev/null && echo wrote-inside; echo done",
        other.path().display()
    );
    for round in ["first", "second"] {
        let _ = std::fs::remove_file(work.path().join("inside"));
        let output = run(&daemon, path, Some(65534), &script);
        let text = String::from_utf8_lossy(&output.stdout);
        assert_eq!(text, "wrote-inside\ndone\n", "{round}: {output:?}");
    }
    let spawners = daemon.spawners();
    assert_eq!(spawners.len(), 1, "{spawners:?}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", spawners[0])).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("\0--hold-landlock"),
        "{cmdline:?}"
    );
    // The request's rules on top: the work directory read-only.
    let _ = std::fs::remove_file(work.path().join("inside"));
    let output = run_with(
        &daemon,
        path,
        Some(65534),
        &["--landlock-rx", "/", "--landlock-rw", "/dev/null"],
        &script,
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(text, "done\n", "{output:?}");
    assert!(!work.path().join("inside").exists());
    assert!(!other.path().join("outside").exists());
}

/// Landlock paths are resolved at each spawn, as the peer: each spawn of
/// the same rules is confined alike, a path replaced since (a work
/// directory made anew) is the new one's, and a path the peer can no
/// longer reach fails the spawn by name.
#[test]
fn landlock_paths_are_resolved_at_each_spawn_as_the_peer() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let parent = work_dir();
    let other = work_dir();
    let work = parent.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = work.to_str().unwrap();
    let policy = format!(
        "[sandbox.lock]\nlandlock_rx = [\"/\"]\nlandlock_rw = [\"{path}\", \"/dev/null\"]\n\
         landlock_require = true\n\n[[peer]]\nuids = [65534]\nsandbox = \"lock\"\n"
    );
    let daemon = start_daemon_with(
        "sandbox-landlock-paths",
        Some(&policy),
        &["--socket-mode", "0666"],
    );
    let script = format!(
        "touch {}/outside 2>/dev/null && echo ESCAPE-outside; touch inside && echo wrote-inside",
        other.path().display()
    );
    let confined = |round: &str| {
        let _ = std::fs::remove_file(work.join("inside"));
        let output = run(&daemon, path, Some(65534), &script);
        let text = String::from_utf8_lossy(&output.stdout);
        assert_eq!(text, "wrote-inside\n", "{round}: {output:?}");
        assert!(work.join("inside").exists(), "{round}");
        assert!(!other.path().join("outside").exists(), "{round}");
    };
    for round in ["first", "second", "third"] {
        confined(round);
    }
    let holding = daemon.spawners();
    // Made anew: a rule on the old directory would deny every write here.
    std::fs::rename(&work, parent.path().join("old")).unwrap();
    std::fs::create_dir(&work).unwrap();
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o777)).unwrap();
    confined("replaced");
    confined("replaced, again");
    // The spawner that held rules on the old directory serves no more.
    let gone = || holding.iter().all(|pid| !daemon.spawners().contains(pid));
    assert!(eventually(Duration::from_secs(10), gone), "{holding:?}");
    // Out of the peer's reach (root's would be): refused, naming the path.
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let output = run(&daemon, "/", Some(65534), "true");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{output:?}");
    assert!(
        stderr.contains("landlock path") && stderr.contains(path),
        "{stderr}"
    );
}

/// A root daemon with `policy` and no spawner processes (so no parked
/// inits): every sandboxed child makes its own namespaces.
fn daemon_without_spawners(name: &str, policy: &str) -> Daemon {
    crate::util::start_daemon_custom(
        name,
        None,
        Some(policy),
        &[],
        &zygote_bin(),
        &[("ZYGOTE_UID_SPAWNERS", "0")],
    )
}

/// On the fork path (no spawner processes), a sandboxed child keeps its
/// own pipes clear of the fds it is given: with a pid namespace, the
/// init's report of the program's exit does not land on the program's
/// highest fd (40, just below the pipes' floor); without one there is no
/// init, and the pid the spawn reports is the program's own.
#[test]
fn a_forked_sandbox_child_keeps_its_own_pipes_apart_from_its_fds() {
    use std::io::Read;
    use zygote_client::blocking::{Client, Command};
    use zygote_client::{Sandbox, Stdio};

    if !root_or_skip("a root daemon with pid namespaces") {
        return;
    }
    let daemon = daemon_without_spawners("sandbox-fork-fds", "");
    let client = Client::connect(daemon.socket()).expect("connect");
    let (read, write) = std::io::pipe().expect("pipe");
    let status = Command::new(&client, "/bin/sh")
        .args(["-c", "exit 3"])
        .sandbox(Sandbox::new().isolate())
        .timeout(Duration::from_secs(30))
        .fd(40, OwnedFd::from(write))
        .stdin(Stdio::null())
        .status()
        .expect("spawn under isolate");
    assert_eq!(status.code(), Some(3), "the init reported the exit");
    // Every copy of the write end is gone with the child: EOF, and nothing
    // written (a misplaced report would be).
    let mut read = std::fs::File::from(OwnedFd::from(read));
    let (sender, got) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = sender.send(read.read_to_end(&mut bytes).map(|_| bytes));
    });
    let got = got
        .recv_timeout(Duration::from_secs(10))
        .expect("EOF on fd 40's pipe within 10 s");
    assert_eq!(got.expect("read fd 40's pipe"), b"", "nothing on fd 40");

    let child = Command::new(&client, "/bin/sh")
        .args(["-c", "echo $$"])
        .sandbox(Sandbox::new().network_none())
        .timeout(Duration::from_secs(30))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn with network none");
    let reported = child.id();
    let output = child.wait_with_output().expect("wait");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        reported.to_string(),
        "no init: the spawned pid is the shell's"
    );
}

#[test]
fn sandboxed_init_forwards_signals_and_reports_exact_exits() {
    if !root_or_skip("a root daemon with pid namespaces") {
        return;
    }
    let work = work_dir();
    let path = work.path().to_str().unwrap();
    let policy = full_profile(path);
    // Without spawners no init is parked: every program here is started
    // by its init, whose forwarding and exit report this guards.
    let daemon = daemon_without_spawners("sandbox-init", &policy);
    // As pid 1 the shell would ignore SIGTERM: under the init it dies.
    let output = run(&daemon, path, None, "echo $$; kill -TERM $$; sleep 5");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "2");
    assert_eq!(output.status.signal(), Some(libc::SIGTERM), "{output:?}");
    let output = run(&daemon, path, None, "exit 7");
    assert_eq!(output.status.code(), Some(7), "{output:?}");
    // SIGTERM from outside (zygote run passes it on through the pidfd,
    // to the init), for a shell with no handler: the init forwards it.
    let ready = work.path().join("ready");
    let mut child = Command::new(zygote_bin())
        .args(["run", "--", "/bin/sh", "-c", "touch ready; sleep 30"])
        .env("ZYGOTE_SOCKET", daemon.socket())
        .current_dir(path)
        .stdin(Stdio::null())
        .spawn()
        .expect("start zygote run");
    assert!(eventually(Duration::from_secs(10), || ready.exists()));
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = wait_within(&mut child, Duration::from_secs(10), "zygote run");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

/// The program an init starts has no signal blocked (the init blocks
/// them all for itself), and its death with a core dump is reported as
/// such.
#[test]
fn a_program_under_an_init_starts_unblocked_and_its_core_dump_is_reported() {
    use zygote_client::blocking::{Client, Command};
    use zygote_client::{Sandbox, Stdio};

    if !root_or_skip("a root daemon with pid namespaces") {
        return;
    }
    // The core file goes to the program's working directory (a
    // core_pattern that pipes it elsewhere still marks the status).
    let work = work_dir();
    let daemon = daemon_without_spawners("sandbox-init-core", "");
    let client = Client::connect(daemon.socket()).expect("connect");
    // grep itself, not under a shell, which would clear its mask.
    let output = Command::new(&client, "grep")
        .args(["^SigBlk:", "/proc/self/status"])
        .sandbox(Sandbox::new().isolate())
        .timeout(Duration::from_secs(30))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .output()
        .expect("spawn under isolate");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "SigBlk:\t0000000000000000",
        "{output:?}"
    );
    let output = Command::new(&client, "/bin/sh")
        .args(["-c", "ulimit -c unlimited; kill -SEGV $$"])
        .current_dir(work.path())
        .sandbox(Sandbox::new().isolate())
        .timeout(Duration::from_secs(30))
        .stdin(Stdio::null())
        .output()
        .expect("spawn under isolate");
    assert_eq!(output.status.signal(), Some(libc::SIGSEGV), "{output:?}");
    assert!(output.status.core_dumped(), "{output:?}");
}

/// Without spawner processes no child can enter a parked init: none is
/// made, and each spawn makes its own namespaces.
#[test]
fn without_spawners_no_init_is_parked() {
    if !root_or_skip("a root daemon with pid namespaces") {
        return;
    }
    let work = work_dir();
    let path = work.path().to_str().unwrap();
    let policy = full_profile(path);
    let daemon = daemon_without_spawners("sandbox-unparked", &policy);
    for _ in 0..3 {
        let output = run(&daemon, path, None, "echo ppid $PPID");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "ppid 1",
            "{output:?}"
        );
    }
    assert!(
        eventually(Duration::from_secs(5), || inits_of(&daemon).is_empty()),
        "inits parked: {:?}",
        inits_of(&daemon)
    );
}

#[test]
fn a_peer_cannot_bind_a_path_it_cannot_reach() {
    if !root_or_skip("a root daemon that confines another uid") {
        return;
    }
    let work = work_dir();
    let secret = tempfile::Builder::new()
        .prefix("zygote-secret-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // The directory is open to all, but inside one only root can search:
    // bound as root, it would show its file to anyone.
    std::fs::set_permissions(secret.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let inner = secret.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(inner.join("key"), "SECRET-CONTENT").unwrap();
    let path = work.path().to_str().unwrap();
    let policy = format!(
        "[sandbox.box]\nro_bind = [\"/usr\", \"/bin\", \"/lib\", \"/lib64\", \"{}:/secret\"]\n\
         bind = [\"{path}\"]\n\n[[peer]]\nuids = [65534]\nsandbox = \"box\"\n",
        inner.display()
    );
    let daemon = start_daemon_with("sandbox-reach", Some(&policy), &["--socket-mode", "0666"]);
    let output = run(&daemon, path, Some(65534), "cat /secret/key");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!text.contains("SECRET-CONTENT"), "{text}");
    assert!(!output.status.success(), "{output:?}");
    // Root, which can reach it, gets it bound (the same profile as root).
    let root_policy = policy.replace("uids = [65534]", "uids = [0]");
    let daemon = start_daemon_with("sandbox-reach-root", Some(&root_policy), &[]);
    let output = run(&daemon, path, None, "cat /secret/key");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("SECRET-CONTENT"),
        "{output:?}"
    );
}

#[test]
fn isolate_alone_mounts_a_proc_of_the_new_pid_namespace() {
    if !root_or_skip("a root daemon with pid namespaces") {
        return;
    }
    let policy = "[sandbox.iso]\nisolate = true\n\n[[peer]]\nuids = [0]\nsandbox = \"iso\"\n";
    let daemon = start_daemon_with("sandbox-isolate", Some(policy), &[]);
    let output = run(
        &daemon,
        "/",
        None,
        "echo $$ $(ls /proc | grep -c '^[0-9]'); \
         awk '$5 == \"/proc\" { options = $6 } END { print options }' /proc/self/mountinfo",
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let (counts, proc_options) = text.trim().split_once('\n').expect("two lines");
    // The shell is pid 2 (under the init) and sees the init, itself, its
    // subshell, ls and grep at most; the host has hundreds.
    let (pid, count) = counts.split_once(' ').expect("two numbers");
    assert_eq!(pid, "2", "{text}");
    assert!(count.parse::<usize>().unwrap() <= 5, "{text}");
    // The new /proc, on top, runs nothing and holds no device.
    let options: Vec<&str> = proc_options.split(',').collect();
    for wanted in ["nosuid", "nodev", "noexec"] {
        assert!(options.contains(&wanted), "{wanted}: {text}");
    }
    // The status says which uid is confined, and by what.
    let client = zygote_client::blocking::Client::connect(daemon.socket()).expect("connect");
    let status = client.status().expect("status");
    let root = status
        .peers
        .iter()
        .find(|peer| peer.uid == 0)
        .expect("root's use");
    assert_eq!(root.sandbox_profile.as_deref(), Some("iso"), "{root:?}");
}

/// Each mount is of the kind asked for, read-only where asked, and none
/// holds suid or device files; a bind source is opened by path only, as
/// the peer: a FIFO binds without blocking, a directory the peer may
/// search but not list binds all the same, and a missing one is named.
#[test]
fn mounts_are_of_their_kind_and_bind_sources_are_opened_by_path_only() {
    if !root_or_skip("a root daemon with mount namespaces") {
        return;
    }
    let work = work_dir();
    let fifo = work.path().join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o666),
        0,
    )
    .expect("mkfifo");
    std::fs::set_permissions(&fifo, std::fs::Permissions::from_mode(0o666)).unwrap();
    let search_only = work.path().join("search-only");
    std::fs::create_dir(&search_only).unwrap();
    std::fs::set_permissions(&search_only, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::os::unix::fs::symlink("search-only", work.path().join("link")).unwrap();
    let work_bind = format!("{}:/work", work.path().display());
    // Over the FIFO in the bound work directory: a destination that exists
    // is mounted over, never opened (which would block on a FIFO).
    let fifo_over_fifo = format!("{}:/work/fifo", fifo.display());
    let fifo_bind = format!("{}:/fifo", fifo.display());
    let search_only_bind = format!("{}:/search-only", search_only.display());
    let system = [
        "--ro-bind",
        "/usr",
        "--ro-bind",
        "/bin",
        "--ro-bind",
        "/lib",
        "--ro-bind",
        "/lib64",
    ];
    let mut options = system.to_vec();
    options.extend([
        "--tmpfs",
        "/scratch",
        "--bind",
        &work_bind,
        "--ro-bind",
        &fifo_bind,
        "--ro-bind",
        &search_only_bind,
        "--ro-bind",
        &fifo_over_fifo,
    ]);
    let script = "stat -f -c 'scratch %T' /scratch; touch /scratch/made && echo scratch-writable; \
                  touch /work/made-$(id -u) && echo work-writable; \
                  touch /usr/zygote-escape 2>/dev/null || echo usr-read-only; \
                  test -p /fifo && echo fifo-bound; test -d /search-only && echo search-only-bound; \
                  sed -n 's|^[^ ]* [^ ]* [^ ]* [^ ]* \\([^ ]*\\) \\([^ ]*\\) .*|mount \\1 \\2|p' \
                  /proc/self/mountinfo";
    let daemon = start_daemon_with("sandbox-mounts", None, &["--socket-mode", "0666"]);
    // Root's sources are opened as root, another uid's as that uid.
    for uid in [None, Some(65534)] {
        let output = run_with(&daemon, "/", uid, &options, script);
        let text = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{uid:?}: {text} {output:?}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[..6],
            [
                "scratch tmpfs",
                "scratch-writable",
                "work-writable",
                "usr-read-only",
                "fifo-bound",
                "search-only-bound"
            ],
            "{uid:?}: {text}"
        );
        // Each mount point's options, the topmost mount's where several.
        let mounts: std::collections::HashMap<&str, Vec<&str>> = lines[6..]
            .iter()
            .filter_map(|line| line.strip_prefix("mount ")?.split_once(' '))
            .map(|(point, options)| (point, options.split(',').collect()))
            .collect();
        let wanted: [(&str, &[&str]); 15] = [
            // Read-only: a mount template's copies share its root.
            ("/", &["ro", "nosuid", "nodev"]),
            ("/usr", &["ro", "nosuid", "nodev"]),
            ("/work", &["rw", "nosuid", "nodev"]),
            ("/fifo", &["ro", "nosuid", "nodev"]),
            ("/work/fifo", &["ro", "nosuid", "nodev"]),
            ("/scratch", &["rw", "nosuid", "nodev"]),
            ("/proc", &["nosuid", "nodev"]),
            ("/dev", &["ro", "nosuid", "nodev"]),
            // Device nodes must open: not nodev, but noexec.
            ("/dev/null", &["nosuid", "noexec"]),
            ("/dev/zero", &["nosuid", "noexec"]),
            ("/dev/full", &["nosuid", "noexec"]),
            ("/dev/random", &["nosuid", "noexec"]),
            ("/dev/urandom", &["nosuid", "noexec"]),
            ("/dev/tty", &["nosuid", "noexec"]),
            ("/dev/pts", &["rw", "nosuid", "noexec"]),
        ];
        for (point, options) in wanted {
            let found = mounts
                .get(point)
                .unwrap_or_else(|| panic!("{point}: {text}"));
            for option in options {
                assert!(found.contains(option), "{uid:?} {point} {option}: {text}");
            }
        }
    }
    // A missing source, resolved as the peer, is named; so is a
    // destination through the peer's symlink, never followed.
    let through_link = ["--bind", &work_bind, "--ro-bind", "/usr:/work/link/usr"];
    let refused = [
        (
            &["--ro-bind", "/nonexistent/zygote:/x"][..],
            "sandbox step bind source: /nonexistent/zygote",
        ),
        (
            &through_link[..],
            "sandbox step mount destination: /work/link/usr: Not a directory",
        ),
    ];
    for (refused, named) in refused {
        let mut options = system.to_vec();
        options.extend(refused);
        let output = run_with(&daemon, "/", Some(65534), &options, "true");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{output:?}");
        assert!(stderr.contains(named), "{named}: {stderr}");
    }
}

/// A daemon holding inheritable capabilities (a unit's
/// `AmbientCapabilities=` gives it some) hands none to a sandboxed root
/// child, which would otherwise gain them at its exec as root.
#[test]
fn a_sandboxed_root_child_inherits_no_capability_from_the_daemon() {
    if !root_or_skip("a root daemon that holds inheritable capabilities") {
        return;
    }
    let script = format!(
        "#!/bin/sh\nexec setpriv --inh-caps +net_raw,+sys_ptrace {} \"$@\"\n",
        zygote_bin().display()
    );
    let daemon = crate::util::start_daemon_wrapped("sandbox-inheritable-caps", &script);
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    assert!(
        status.contains("CapInh:\t0000000000082000"),
        "the daemon holds them: {status}"
    );
    let output = run_with(
        &daemon,
        "/",
        None,
        &["--seccomp", "default"],
        "grep -E '^Cap(Inh|Prm|Eff|Amb):' /proc/self/status",
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{text} {output:?}");
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            "CapInh:\t0000000000000000",
            "CapPrm:\t0000000000000000",
            "CapEff:\t0000000000000000",
            "CapAmb:\t0000000000000000",
        ],
        "{text}"
    );
}

mod wire {
    //! Sandboxes a request asks for, on the raw protocol: bad input is
    //! refused by name and the connection goes on serving.

    use std::os::fd::{AsFd, OwnedFd};
    use std::time::Duration;

    use zygote_proto::{
        ClientMessage, FilesystemSpec, Hello, MountKind, MountSpec, NetworkMode, PROTOCOL_VERSION,
        RECV_BUFFER_BYTES, SandboxSpec, SeccompSpec, ServerMessage, SpawnRequest, SpawnStage,
        decode, encode, recv_frame, send_frame, socket,
    };

    use crate::util::{eventually, root_or_skip, start_daemon};

    fn receive(fd: &OwnedFd) -> ServerMessage {
        let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
        let frame = recv_frame(fd.as_fd(), &mut scratch)
            .expect("recv (timed out?)")
            .expect("a frame");
        decode(&frame.bytes).expect("decode the daemon's reply")
    }

    fn send(fd: &OwnedFd, message: &ClientMessage) {
        send_frame(fd.as_fd(), &encode(message).unwrap(), &[]).expect("send");
    }

    fn system() -> Vec<MountSpec> {
        ["/usr", "/bin", "/lib", "/lib64"]
            .into_iter()
            .map(|path| MountSpec {
                kind: MountKind::ReadOnlyBind,
                source: path.into(),
                destination: path.into(),
            })
            .collect()
    }

    fn request(id: u64, sandbox: SandboxSpec) -> ClientMessage {
        let mut request = SpawnRequest::new(id, "/bin/true");
        request.cwd = Some(b"/".to_vec());
        request.sandbox = Some(sandbox);
        ClientMessage::Spawn(request)
    }

    fn hello(fd: &OwnedFd) {
        send(
            fd,
            &ClientMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                client: "sandbox test".into(),
            }),
        );
        assert!(matches!(receive(fd), ServerMessage::HelloAck(_)));
    }

    #[test]
    fn a_request_cannot_loosen_the_profile_imposed_on_its_peer() {
        if !root_or_skip("a root daemon with namespaces") {
            return;
        }
        let policy = "[sandbox.box]\nnetwork = \"none\"\nisolate = true\n\n\
                      [[peer]]\nuids = [0]\nsandbox = \"box\"\n";
        let daemon = crate::util::start_daemon_with("sandbox-loosen", Some(policy), &[]);
        let fd = socket::connect_to(daemon.socket(), false).expect("connect");
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(Duration::from_secs(10)),
        )
        .unwrap();
        hello(&fd);
        let loosen = [
            SandboxSpec {
                isolate: true,
                ..SandboxSpec::default()
            },
            SandboxSpec {
                network: NetworkMode::None,
                ..SandboxSpec::default()
            },
            SandboxSpec {
                profile: Some("other".into()),
                ..SandboxSpec::default()
            },
        ];
        for (id, sandbox) in (1..).zip(loosen) {
            send(&fd, &request(id, sandbox));
            match receive(&fd) {
                ServerMessage::SpawnFailed(failed) => {
                    assert_eq!(failed.errno, libc::EPERM, "{failed:?}");
                }
                other => panic!("{other:?}"),
            }
        }
        // Naming the profile, a request adds to it: a seccomp filter.
        let tighter = SandboxSpec {
            profile: Some("box".into()),
            seccomp: Some(SeccompSpec::Profile("default".into())),
            ..SandboxSpec::default()
        };
        send(&fd, &request(9, tighter));
        match receive(&fd) {
            ServerMessage::Spawned(spawned) => {
                let applied = spawned.sandbox.expect("applied");
                assert_eq!(applied.profile.as_deref(), Some("box"), "{applied:?}");
                assert_eq!(applied.seccomp.as_deref(), Some("default"), "{applied:?}");
                assert!(applied.namespaces.iter().any(|n| n == "net"), "{applied:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_sandboxes_are_refused_by_name_and_the_connection_serves_on() {
        if !root_or_skip("a root daemon with namespaces") {
            return;
        }
        let daemon = start_daemon("sandbox-wire");
        let fds_before = daemon.settled_fd_count();
        let fd = socket::connect_to(daemon.socket(), false).expect("connect");
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(Duration::from_secs(10)),
        )
        .unwrap();
        send(
            &fd,
            &ClientMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                client: "sandbox test".into(),
            }),
        );
        match receive(&fd) {
            ServerMessage::HelloAck(ack) => {
                assert!(ack.features.iter().any(|f| f == "sandbox"), "{ack:?}")
            }
            other => panic!("{other:?}"),
        }
        let with_mount = |kind, source: &str, destination: &str| {
            let mut mounts = system();
            mounts.push(MountSpec {
                kind,
                source: source.into(),
                destination: destination.into(),
            });
            SandboxSpec {
                filesystem: Some(FilesystemSpec { mounts }),
                ..SandboxSpec::default()
            }
        };
        let too_many = SandboxSpec {
            filesystem: Some(FilesystemSpec {
                mounts: (0..65)
                    .map(|i| MountSpec {
                        kind: MountKind::Tmpfs,
                        source: Vec::new(),
                        destination: format!("/t{i}").into(),
                    })
                    .collect(),
            }),
            ..SandboxSpec::default()
        };
        let bad = [
            (
                with_mount(MountKind::Bind, "tmp", "/tmp"),
                "\"tmp\": not an absolute path",
            ),
            (with_mount(MountKind::Bind, "/tmp/../etc", "/x"), "`..`"),
            (
                with_mount(MountKind::ReadOnlyBind, "/etc", "/proc/x"),
                "/proc",
            ),
            (
                SandboxSpec {
                    profile: Some("nosuch".into()),
                    ..SandboxSpec::default()
                },
                "\"nosuch\"",
            ),
            (
                SandboxSpec {
                    seccomp: Some(SeccompSpec::Profile("lenient".into())),
                    ..SandboxSpec::default()
                },
                "\"lenient\"",
            ),
            (
                SandboxSpec {
                    seccomp: Some(SeccompSpec::Filter("default allow\nptrace now\n".into())),
                    ..SandboxSpec::default()
                },
                "line 2",
            ),
            (too_many, "more than the 64"),
        ];
        for (id, (sandbox, named)) in (1..).zip(bad) {
            send(&fd, &request(id, sandbox));
            match receive(&fd) {
                ServerMessage::SpawnFailed(failed) => {
                    assert_eq!(failed.stage, SpawnStage::Validate, "{failed:?}");
                    assert!(failed.message.contains(named), "{named}: {failed:?}");
                }
                other => panic!("{named}: {other:?}"),
            }
        }
        // A missing source is found by the child, resolving it as the peer
        // (vforked by root's spawner: no pid namespace); the step and the
        // item come back through the spawner.
        let missing = with_mount(MountKind::Bind, "/nonexistent/zygote", "/work");
        send(&fd, &request(20, missing));
        match receive(&fd) {
            ServerMessage::SpawnFailed(failed) => {
                assert_eq!(
                    (failed.stage, failed.errno),
                    (SpawnStage::Sandbox, libc::ENOENT),
                    "{failed:?}"
                );
                assert!(failed.message.contains("/nonexistent/zygote"), "{failed:?}");
                assert!(
                    failed.message.contains("sandbox step bind source"),
                    "{failed:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        // The same connection still spawns, and says what confined it.
        let good = SandboxSpec {
            filesystem: Some(FilesystemSpec { mounts: system() }),
            network: NetworkMode::None,
            isolate: true,
            seccomp: Some(SeccompSpec::Profile("strict".into())),
            landlock: Some(zygote_proto::LandlockSpec {
                read_execute: vec![b"/".to_vec()],
                read_write: vec![b"/dev".to_vec()],
                ..zygote_proto::LandlockSpec::default()
            }),
            ..SandboxSpec::default()
        };
        send(&fd, &request(21, good));
        match receive(&fd) {
            ServerMessage::Spawned(spawned) => {
                let applied = spawned.sandbox.expect("applied sandbox");
                assert_eq!(applied.seccomp.as_deref(), Some("strict"));
                // This kernel's ABI (7) enforces every rule.
                assert!(
                    applied.landlock_abi.is_some_and(|abi| abi >= 5),
                    "{applied:?}"
                );
                assert!(applied.landlock_complete, "{applied:?}");
                for namespace in ["mount", "pid", "ipc", "uts", "net"] {
                    assert!(
                        applied.namespaces.iter().any(|n| n == namespace),
                        "{applied:?}"
                    );
                }
            }
            other => panic!("{other:?}"),
        }
        match receive(&fd) {
            ServerMessage::Exited(exit) => {
                assert_eq!(exit.id, 21, "{exit:?}");
                assert_eq!(exit.status, zygote_proto::ExitStatus::Exited(0), "{exit:?}");
            }
            other => panic!("{other:?}"),
        }
        // Nothing of the refused, failed or finished sandboxes stays open
        // but the one empty network namespace and the one template of
        // `/dev`, kept for the next, root's spawner processes (of children
        // and of parks: socket and pidfd each), and the inits parked for
        // the next spawn with their mount template.
        drop(fd);
        let parked = || super::inits_of(&daemon).len();
        assert!(
            eventually(Duration::from_secs(10), || parked()
                == super::PARKED_PER_PLAN),
            "inits: {:?}",
            super::inits_of(&daemon)
        );
        let parked = parked() + super::templates_of(&daemon).len();
        assert_eq!(
            daemon.settled_fd_count(),
            fds_before + 2 + daemon.spawner_fds() + super::FDS_PER_PARKED_INIT * parked
        );
        assert_eq!(daemon.spawner_fds(), 4, "root's two spawners");
    }
}

#[test]
fn a_rootless_daemon_confines_children_in_a_user_namespace() {
    if !root_or_skip("a daemon started as another uid") {
        return;
    }
    let work = work_dir();
    let path = work.path().to_str().unwrap();
    let daemon = crate::util::start_daemon_as(
        "sandbox-rootless",
        Some(65534),
        Some(&full_profile(path)),
        &[],
    );
    // /dev/null must work first: a redirection to it that failed would
    // skip each probe below and hide an escape.
    let script = "\
        echo probe >/dev/null && echo dev-null-writable; \
        echo urandom $(head -c 16 /dev/urandom | wc -c) zero $(head -c 4 /dev/zero | wc -c); \
        cat /etc/shadow >/dev/null 2>&1 && echo ESCAPE-shadow; \
        touch /usr/escape 2>/dev/null && echo ESCAPE-usr; \
        touch inside && echo wrote-inside; \
        echo pids $(ls /proc | grep -c '^[0-9]') host $(hostname) id $(id -u); \
        grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status; exit 4";
    let output = run(&daemon, path, None, script);
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(4), "{text} {output:?}");
    assert!(!text.contains("ESCAPE"), "{text}");
    assert!(text.contains("wrote-inside"), "{text}");
    assert!(text.contains("dev-null-writable"), "{text}");
    assert!(text.contains("urandom 16 zero 4"), "{text}");
    // The daemon's uid, mapped to itself; the sandbox's hostname and pids.
    assert!(text.contains("host box id 65534"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(text.contains("Seccomp:\t2"), "{text}");
    // It offers sandboxes to requests too, not only imposes them.
    let output = run_with(&daemon, path, None, &["--sandbox", "box"], "hostname");
    assert_eq!(
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).trim()
        ),
        (Some(0), "box"),
        "{output:?}"
    );
}

#[test]
fn an_imposed_profile_survives_a_live_upgrade() {
    if !root_or_skip("a root daemon with pid namespaces") {
        return;
    }
    let policy = "[sandbox.iso]\nisolate = true\nhostname = \"kept\"\n\n[[peer]]\nuids = [0]\nsandbox = \"iso\"\n";
    let daemon = start_daemon_with("sandbox-upgrade", Some(policy), &[]);
    let output = Command::new(zygote_bin())
        .arg("upgrade")
        .env("ZYGOTE_SOCKET", daemon.socket())
        .output()
        .expect("zygote upgrade");
    assert!(output.status.success(), "{output:?}\n{}", daemon.log());
    // The new image read the profile from the state, not the file.
    let output = run(&daemon, "/", None, "echo $$ $(hostname)");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "2 kept",
        "{output:?}"
    );
}

#[test]
fn zygote_run_sandbox_flags_confine_the_command() {
    // /dev is read-only, even to a root peer (a template's clone, its
    // tmpfs shared by every sandbox).
    const SCRIPT: &str = "echo $$ $(hostname) $(ls / | tr '\\n' ' '); touch made; \
                          unshare -U true 2>/dev/null || echo denied; \
                          touch /dev/made 2>/dev/null || echo dev-read-only; \
                          echo x >/dev/null && echo dev-null-writable";
    if !root_or_skip("a root daemon with namespaces") {
        return;
    }
    let work = work_dir();
    let path = work.path().to_str().unwrap();
    let daemon = crate::util::start_daemon("sandbox-cli");
    let output = Command::new(zygote_bin())
        .args([
            "run",
            "--ro-bind",
            "/usr",
            "--ro-bind",
            "/bin",
            "--ro-bind",
            "/lib",
        ])
        .args([
            "--ro-bind",
            "/lib64",
            "--bind",
            path,
            "--network",
            "none",
            "--isolate",
        ])
        .args(["--hostname", "cli", "--seccomp", "default", "--"])
        .args(["/bin/sh", "-c", SCRIPT])
        .env("ZYGOTE_SOCKET", daemon.socket())
        .current_dir(path)
        .stdin(Stdio::null())
        .output()
        .expect("zygote run");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    // The work directory lives under /var/tmp.
    assert!(
        text.starts_with("2 cli bin dev lib lib64 proc usr var"),
        "{text}"
    );
    assert!(text.contains("denied"), "{text}");
    assert!(text.contains("dev-read-only"), "{text}");
    assert!(text.contains("dev-null-writable"), "{text}");
    assert!(work.path().join("made").exists());
    // A missing bind source: refused, naming it, the command not run.
    let output = Command::new(zygote_bin())
        .args(["run", "--ro-bind", "/nonexistent/zygote", "--", "/bin/true"])
        .env("ZYGOTE_SOCKET", daemon.socket())
        .current_dir(path)
        .output()
        .expect("zygote run");
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("/nonexistent/zygote"), "{error}");
}
