//! The harness: a real `zygote serve` per test, on its own socket.

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// A daemon started for one test; killed and reaped on drop.
pub struct Daemon {
    process: Child,
    /// Stopped on purpose with [`Daemon::terminate`].
    terminated: bool,
    socket: PathBuf,
    /// Its stderr and stdout: the log, printed when the test fails.
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The `zygote` binary: `$ZYGOTE_BIN`, else the one cargo built next to
/// this test binary (`target/<profile>/zygote`).
pub fn zygote_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("ZYGOTE_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/integration-HASH -> target/<profile>/zygote
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .join("zygote");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` before the tests (scripts/test does)",
        path.display()
    );
    path
}

/// Starts `zygote serve` on a fresh socket in a temp dir and waits until
/// it accepts connections.
pub fn start_daemon(test_name: &str) -> Daemon {
    start_daemon_with(test_name, None, &[])
}

/// As [`start_daemon`], with a policy file of this text and extra `serve`
/// flags. The temp dir is world-searchable, so that a client of another
/// uid can reach a socket whose mode lets it in.
pub fn start_daemon_with(test_name: &str, policy: Option<&str>, flags: &[&str]) -> Daemon {
    start_daemon_as(test_name, None, policy, flags)
}

/// As [`start_daemon_with`], with the daemon running as `uid` (and gid
/// `uid`) when given; needs root for that.
pub fn start_daemon_as(
    test_name: &str,
    uid: Option<u32>,
    policy: Option<&str>,
    flags: &[&str],
) -> Daemon {
    start_daemon_custom(test_name, uid, policy, flags, &zygote_bin(), &[])
}

/// A daemon started through the wrapper `script` (a whole file, `#!`
/// line included), which ends by exec'ing [`zygote_bin`] with its
/// arguments.
pub fn start_daemon_wrapped(test_name: &str, script: &str) -> Daemon {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let wrapper = dir.path().join(test_name);
    std::fs::write(&wrapper, script).expect("write the wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    start_daemon_custom(test_name, None, None, &[], &wrapper, &[])
}

/// As [`start_daemon_as`], from the binary at `binary`, with `envs` added
/// to the daemon's environment.
pub fn start_daemon_custom(
    test_name: &str,
    uid: Option<u32>,
    policy: Option<&str>,
    flags: &[&str],
    binary: &Path,
    envs: &[(&str, &str)],
) -> Daemon {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::Builder::new()
        .prefix(&format!("zygote-{test_name}-"))
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod tempdir");
    // The daemon's own directory, where it may create its socket.
    let run = dir.path().join("run");
    std::fs::create_dir(&run).expect("mkdir run");
    if let Some(uid) = uid {
        std::os::unix::fs::chown(&run, Some(uid), Some(uid)).expect("chown run dir");
    }
    let socket = run.join("zygote.sock");
    let mut command = Command::new(binary);
    command.envs(envs.iter().copied());
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    command
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .args(flags);
    if let Some(policy) = policy {
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, policy).expect("write policy");
        command.arg("--policy").arg(path);
    }
    // The log goes to a file, shown only when the test fails, so that the
    // test output is the results. ZYGOTE_TEST_LOG=debug logs more.
    let log = dir.path().join("daemon.log");
    let log_file = std::fs::File::create(&log).expect("create the daemon log");
    let process = command
        .env(
            "ZYGOTE_LOG",
            std::env::var("ZYGOTE_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("dup the daemon log"))
        .stderr(log_file)
        .spawn()
        .expect("start zygote serve");
    let daemon = Daemon {
        process,
        terminated: false,
        socket,
        log,
        _dir: dir,
    };
    daemon.wait_ready();
    daemon
}

impl Daemon {
    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// What the daemon has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|error| format!("(no log: {error})"))
    }

    /// Whether the daemon logs `needle` within `timeout`. Log lines pass
    /// through the daemon's writer thread, so a line can trail the event
    /// it reports.
    pub fn logged(&self, needle: &str, timeout: Duration) -> bool {
        eventually(timeout, || self.log().contains(needle))
    }

    /// Sends `signal` to the daemon, which may exit on its own from now on.
    pub fn signal_stop(&mut self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).expect("pid");
        rustix::process::kill_process(pid, signal).expect("signal the daemon");
        self.terminated = true;
    }

    /// How the daemon exited, if it does within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if zygote_proto::socket::connect_to(&self.socket, false).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "zygote did not listen on {} within 10 s; its log:\n{}",
            self.socket.display(),
            self.log()
        );
    }

    /// Number of fds the daemon has open.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("read daemon fds")
            .count()
    }

    /// The fds the daemon holds for its spawner processes, of children
    /// and of parks: two each (the socket and the pidfd) while they run.
    pub fn spawner_fds(&self) -> usize {
        2 * (self.spawners().len() + self.park_spawners().len())
    }

    /// The daemon's per-uid spawner processes that start the children
    /// that switch to another uid (or are sandboxed).
    pub fn spawners(&self) -> Vec<u32> {
        self.spawner_processes(false)
    }

    /// The daemon's per-uid spawner processes that make parked inits and
    /// mount templates (`--parks`).
    pub fn park_spawners(&self) -> Vec<u32> {
        self.spawner_processes(true)
    }

    /// Spawner processes: named [`SPAWNER_NAME`], and exec'd (a spawner's
    /// child has its name too until its own exec, but is still marked
    /// `PF_FORKNOEXEC`), of parks or not.
    fn spawner_processes(&self, parks: bool) -> Vec<u32> {
        const PF_FORKNOEXEC: u64 = 0x40;
        children_of(self.pid())
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim_end() == SPAWNER_NAME)
            })
            .filter(|pid| {
                let flags = stat_fields(*pid).and_then(|fields| fields.get(6)?.parse::<u64>().ok());
                flags.is_some_and(|flags| flags & PF_FORKNOEXEC == 0)
            })
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let of_parks = cmdline
                    .split(|byte| *byte == 0)
                    .any(|arg| arg == b"--parks");
                of_parks == parks
            })
            .collect()
    }

    /// The daemon's fd count once it has stopped changing (five equal
    /// reads 20 ms apart, within 5 s): connections a client just closed
    /// take the daemon a moment to notice.
    pub fn settled_fd_count(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = self.fd_count();
        let mut same = 0;
        while same < 5 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.fd_count();
            same = if now == last { same + 1 } else { 0 };
            last = now;
        }
        last
    }

    /// The daemon's resident set size in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read daemon status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// Pids of the daemon's zombie children.
    pub fn zombies(&self) -> Vec<u32> {
        children_of(self.pid())
            .into_iter()
            .filter(|pid| process_state(*pid) == Some('Z'))
            .collect()
    }

    /// SIGKILLs the daemon and reaps it.
    pub fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }

    /// Stops the daemon with SIGTERM, as systemd would, and returns how it
    /// exited.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.start_stop();
        self.process.wait().expect("wait for the daemon")
    }

    /// Sends SIGTERM without waiting: from now on the daemon may exit on
    /// its own.
    pub fn start_stop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        self.terminated = true;
    }

    /// True while the daemon process runs.
    pub fn is_alive(&mut self) -> bool {
        self.process.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.process.kill();
        if let Ok(status) = self.process.wait() {
            if std::thread::panicking() {
                // The test failed: its output (captured by the harness and
                // shown with the failure) gets the daemon's log.
                eprintln!(
                    "--- log of zygote serve on {} ({status}) ---\n{}--- end of log ---",
                    self.socket.display(),
                    self.log()
                );
            } else if status.signal() != Some(libc::SIGKILL) && !self.terminated {
                // A daemon that died on its own (not by our SIGKILL) is a bug.
                panic!(
                    "zygote exited unexpectedly: {status}; its log:\n{}",
                    self.log()
                );
            }
        }
    }
}

/// The name (`comm`) of the daemon's per-uid spawner processes, which
/// their children keep until exec.
pub const SPAWNER_NAME: &str = "zygote-spawner";

/// Direct children of `pid`, from /proc.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return children;
    };
    for entry in entries.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if parent_of(child) == Some(pid) {
            children.push(child);
        }
    }
    children
}

/// `/proc/PID/stat` fields after the command name.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    Some(after_comm.split_whitespace().map(str::to_owned).collect())
}

/// The parent pid of `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// Pids of live processes in process group `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|end| &stat[end + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|f| f.parse().ok()) == Some(pgid) && fields[0] != "Z" {
            members.push(pid);
        }
    }
    members
}

/// The state letter of `pid` (R, S, Z, ...).
pub fn process_state(pid: u32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// The fd numbers open in process `pid`, sorted.
pub fn open_fds(pid: u32) -> Vec<i32> {
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/PID/fd")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    fds
}

/// A raw protocol connection to `socket` (no hello sent) whose reads
/// fail after `deadline`: a silent daemon fails the test, not hangs it.
pub fn connect_with_deadline(socket: &Path, deadline: Duration) -> std::os::fd::OwnedFd {
    let fd = zygote_proto::socket::connect_to(socket, false).expect("connect");
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Recv,
        Some(deadline),
    )
    .expect("SO_RCVTIMEO");
    fd
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A two-worker tokio runtime, as a client program would have.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A signal mask line (`SigBlk`, `SigCgt`, ...) of `/proc/PID/task/TID/status`
/// for each thread of `pid`, by thread id.
pub fn thread_masks(pid: u32, field: &str) -> Vec<(u32, u64)> {
    let mut masks = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return masks;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        if let Some(mask) = mask_in(&status, field) {
            masks.push((tid, mask));
        }
    }
    masks
}

/// The hex mask on the `field:` line of a `/proc/.../status` text.
pub fn mask_in(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Bit `signal - 1`: `signal`'s place in a `/proc` signal mask.
pub fn signal_bit(signal: i32) -> u64 {
    1 << (signal - 1)
}

/// Where a process stands with its stop signals, from the
/// `/proc/PID/status` of its main thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignals {
    /// SIGHUP, SIGTERM and SIGINT blocked, and not as glibc blocks every
    /// signal for a moment (while it starts a thread): held pending.
    Held,
    /// SIGTERM or SIGINT has a handler, and they are not held.
    Caught,
    /// Neither yet (or no such process): a stop signal would kill it.
    Default,
}

/// [`StopSignals`] of `pid` now.
pub fn stop_signals(pid: u32) -> StopSignals {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return StopSignals::Default;
    };
    let stop = signal_bit(libc::SIGHUP) | signal_bit(libc::SIGTERM) | signal_bit(libc::SIGINT);
    let blocked = mask_in(&status, "SigBlk").unwrap_or(0);
    let caught = mask_in(&status, "SigCgt").unwrap_or(0);
    // SIGQUIT is never blocked by a zygote (the signals with no meaning
    // to it, such as SIGUSR1, are, for its whole life).
    if blocked & stop == stop && blocked & signal_bit(libc::SIGQUIT) == 0 {
        StopSignals::Held
    } else if caught & (signal_bit(libc::SIGTERM) | signal_bit(libc::SIGINT)) != 0 {
        StopSignals::Caught
    } else {
        StopSignals::Default
    }
}

/// Polls [`stop_signals`] of `pid` as fast as it can until they are held
/// or caught, within 10 s; true when it saw them held.
pub fn wait_stop_signals_handled(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match stop_signals(pid) {
            StopSignals::Held => return true,
            StopSignals::Caught => return false,
            StopSignals::Default => assert!(
                Instant::now() < deadline,
                "process {pid} neither holds nor catches its stop signals after 10 s"
            ),
        }
    }
}

/// Polls `poll` every 10 ms until it gives a value; `None` once `timeout`
/// has passed without one.
pub fn poll_within<T>(timeout: Duration, mut poll: impl FnMut() -> Option<T>) -> Option<T> {
    let mut found = None;
    eventually(timeout, || {
        found = poll();
        found.is_some()
    });
    found
}

/// Waits for `child` to end, for at most `timeout`: past it, kills and
/// reaps it and fails the test, which a lost exit would otherwise hang.
pub fn wait_within(child: &mut Child, timeout: Duration, what: &str) -> ExitStatus {
    let status = poll_within(timeout, || child.try_wait().expect("try_wait"));
    status.unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} did not end within {timeout:?}");
    })
}

/// [`Child::wait_with_output`] with a deadline: the exit as in
/// [`wait_within`], then the piped output, which a process left behind
/// may hold open; past `timeout` either way the test fails.
pub fn output_within(mut child: Child, timeout: Duration, what: &str) -> Output {
    let deadline = Instant::now() + timeout;
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    let status = wait_within(&mut child, timeout, what);
    let collect = |pipe: Receiver<Vec<u8>>, name: &str| {
        pipe.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("{what}: its {name} stayed open past {timeout:?}"))
    };
    Output {
        status,
        stdout: collect(stdout, "stdout"),
        stderr: collect(stderr, "stderr"),
    }
}

/// Reads `pipe` to its end on a thread of its own.
fn read_in_background(pipe: Option<impl Read + Send + 'static>) -> Receiver<Vec<u8>> {
    let (send, receive) = std::sync::mpsc::channel();
    match pipe {
        Some(mut pipe) => {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                let _ = send.send(bytes);
            });
        }
        None => {
            let _ = send.send(Vec::new());
        }
    }
    receive
}

/// Awaits `future` for at most `timeout`, failing the test past it: an
/// exit notice that never comes is a failure, not a hang.
pub async fn within<T>(timeout: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(timeout, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {timeout:?}"))
}

/// Whether this run is CI's (`CI` set), where `scripts/test` runs as root
/// and has installed every tool the tests use.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|value| !value.is_empty() && value != "false")
}

/// Names the file that collects the skips, one `test<TAB>reason` line
/// each, which `scripts/test` counts as skipped rather than passed.
const SKIPS_ENV: &str = "ZYGOTE_TEST_SKIPS";

/// Says that the running test (the whole of it, or the part that
/// `reason` names) did not run because this machine lacks what it needs:
/// a kernel feature, a delegated cgroup controller, a reaping init. The
/// caller then returns, or goes on to its other parts.
pub fn skip(reason: &str) {
    // The harness names each test's thread after the test.
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test on an unnamed thread");
    eprintln!("SKIPPED {test}: {reason}");
    let Some(path) = std::env::var_os(SKIPS_ENV) else {
        return;
    };
    let line = format!("{test}\t{}\n", reason.replace(['\t', '\n'], " "));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .unwrap_or_else(|error| panic!("record the skip in {}: {error}", path.to_string_lossy()));
}

/// As [`skip`], for what CI provides (root, the tools `scripts/test`
/// installs): under CI the skip is a failure.
pub fn skip_unless_ci(reason: &str) {
    assert!(
        !in_ci(),
        "{reason}: CI runs as root with every tool scripts/test installs, so this must run there"
    );
    skip(reason);
}

/// The kernel's release string, and its `(major, minor)`.
pub fn kernel_release() -> (String, (u32, u32)) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("read the kernel release")
        .trim()
        .to_owned();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse::<u32>().ok());
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (release, version)
}

/// Whether the caller runs as root; when not, [`skip_unless_ci`] says
/// that `what` needs it.
pub fn root_or_skip(what: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    if !root {
        skip_unless_ci(&format!("{what} needs root"));
    }
    root
}

/// Processes of their own re-executed from this test binary (a client to
/// SIGKILL, another uid): each entry runs instead of the test harness when
/// its environment variable is set. They are not tests, so a test run
/// neither runs nor counts them. [`reexec`] starts one.
const ENTRY_POINTS: &[(&str, fn())] = &[
    (crate::helper::MODE_ENV, crate::helper::client_process),
    (crate::dos::MODE_ENV, crate::dos::attacker_process),
];

/// This test binary, to run the entry point that `variable` (one of
/// [`ENTRY_POINTS`]) selects, with `variable` set to `mode`.
pub fn reexec(variable: &str, mode: &str) -> Command {
    assert!(
        ENTRY_POINTS.iter().any(|(name, _)| *name == variable),
        "{variable} selects no entry point"
    );
    let mut command = Command::new(std::env::current_exe().expect("current_exe"));
    command.env(variable, mode);
    command
}

/// Runs the selected entry point, if any, before the harness's `main`:
/// exit status 0 when it returns, 101 (a failed test's) when it panics.
extern "C" fn run_entry_point() {
    let Some((_, entry)) = ENTRY_POINTS
        .iter()
        .find(|(variable, _)| std::env::var_os(variable).is_some())
    else {
        return;
    };
    let code = if std::panic::catch_unwind(entry).is_ok() {
        0
    } else {
        101
    };
    std::process::exit(code);
}

// SAFETY: an `.init_array` entry is a function pointer that the C runtime
// calls before `main`, with no arguments; `run_entry_point` takes none and
// returns nothing, and only reads the environment (set up before any
// initializer) unless an entry point was selected.
#[used]
#[unsafe(link_section = ".init_array")]
static ENTRY_POINT_HOOK: extern "C" fn() = run_entry_point;

/// A zygote child's exit, polling `try_wait` (of the blocking client) for
/// at most `timeout`: past it, or on an error, the test fails.
pub fn exit_within<T, E: std::fmt::Debug>(
    timeout: Duration,
    what: &str,
    mut try_wait: impl FnMut() -> Result<Option<T>, E>,
) -> T {
    let exit = poll_within(timeout, || {
        try_wait().unwrap_or_else(|error| panic!("{what}: {error:?}"))
    });
    exit.unwrap_or_else(|| panic!("{what}: no exit within {timeout:?}"))
}

/// The scheduling policy of a process's main thread, from
/// `/proc/PID/sched`: `0` for `SCHED_OTHER`, `3` for `SCHED_BATCH`.
pub fn sched_policy(pid: u32) -> String {
    let sched = std::fs::read_to_string(format!("/proc/{pid}/sched")).expect("sched");
    sched
        .lines()
        .find_map(|line| line.strip_prefix("policy")?.split(':').nth(1))
        .map(|value| value.trim().to_owned())
        .expect("a policy line")
}
