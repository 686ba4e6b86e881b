//! Warm templates against a real daemon and a real CPython: a template's
//! start and its failures, children run as `python ARGS` would run them,
//! their hygiene (RNG, fds, signals), and every guarantee of a cold spawn
//! (timeout, kill-on-close, cgroup, the daemon as parent).

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use zygote_proto::{
    ClientMessage, Env, ExitNotice, ExitStatus, KillOnClose, PYTHON_TEMPLATE, RequestFailed,
    ServerMessage, SpawnFailed, SpawnRequest, SpawnStage, StdioSpec, TemplateInfo,
    TemplateListRequest, TemplateReady, TemplateRequest, TemplateSpawnRequest, Timeout,
};

use crate::deferred::{connect, receive, send};
use crate::util::{
    Daemon, eventually, parent_of, process_state, skip, start_daemon, start_daemon_custom,
};

/// Names the CPython to test with, in place of the default below.
const PYTHON_ENV: &str = "ZYGOTE_TEST_PYTHON";

/// A CPython to test with: [`PYTHON_ENV`], else pyenv's 3.12 when there,
/// else `python3` on `PATH`; `None` (the test skips) without any.
fn python() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(PYTHON_ENV).filter(|path| !path.is_empty()) {
        return Some(path.into());
    }
    let pyenv_root = std::process::Command::new("pyenv")
        .arg("root")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    let pyenv = pyenv_root.and_then(|root| {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
            .ok()?
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| {
                path.file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with("3.12"))
            })
            .map(|path| path.join("bin/python3"))
            .filter(|path| path.exists())
            .collect();
        found.sort();
        found.pop()
    });
    pyenv.or_else(|| {
        std::env::var_os("PATH")?
            .to_string_lossy()
            .split(':')
            .map(|dir| Path::new(dir).join("python3"))
            .find(|path| path.exists())
    })
}

/// The interpreter, or a visible skip.
fn python_or_skip() -> Option<PathBuf> {
    let found = python();
    if found.is_none() {
        skip("no CPython: neither pyenv's 3.12 nor python3 on PATH");
    }
    found
}

/// An environment with this process's PATH and HOME.
fn base_env() -> Env {
    let mut env = Env::new();
    for key in ["PATH", "HOME"] {
        if let Some(value) = std::env::var_os(key) {
            env.push(key.as_bytes(), value.as_encoded_bytes());
        }
    }
    env
}

/// Asks for a template.
fn template(
    fd: &OwnedFd,
    id: u64,
    python: &Path,
    preload: &[&str],
    env: Env,
) -> Result<TemplateReady, RequestFailed> {
    send(
        fd,
        &ClientMessage::Template(TemplateRequest {
            id,
            kind: PYTHON_TEMPLATE.into(),
            interpreter: python.as_os_str().as_encoded_bytes().to_vec(),
            preload: preload.iter().map(|name| (*name).to_owned()).collect(),
            env,
            cwd: None,
        }),
    );
    match receive(fd).0 {
        ServerMessage::TemplateReady(ready) => {
            assert_eq!(ready.id, id);
            Ok(ready)
        }
        ServerMessage::RequestFailed(failed) => {
            assert_eq!(failed.id, id);
            Err(failed)
        }
        other => panic!("unexpected reply to a template request: {other:?}"),
    }
}

/// A spawn from `handle` with these python args.
fn warm_request(id: u64, args: &[&str]) -> SpawnRequest {
    SpawnRequest {
        args: args.iter().map(|arg| arg.as_bytes().to_vec()).collect(),
        env: base_env(),
        ..SpawnRequest::new(id, Vec::new())
    }
}

/// What a warm spawn got.
#[derive(Debug)]
struct Ran {
    pid: i32,
    stdout: String,
    stderr: String,
    exited: ExitNotice,
}

impl Ran {
    fn code(&self) -> Option<i32> {
        match self.exited.status {
            ExitStatus::Exited(code) => Some(code),
            ExitStatus::Signaled { .. } => None,
        }
    }
}

/// Runs a warm child with piped stdout and stderr to its end.
fn run_warm(fd: &OwnedFd, handle: u64, request: SpawnRequest) -> Result<Ran, SpawnFailed> {
    run_warm_with_fds(fd, handle, request, Vec::new())
}

/// Sends a warm spawn with `attached` fds.
fn send_warm(fd: &OwnedFd, handle: u64, request: SpawnRequest, attached: &[OwnedFd]) {
    let message = ClientMessage::SpawnFromTemplate(TemplateSpawnRequest {
        template: handle,
        spawn: request,
    });
    let fds: Vec<_> = attached.iter().map(AsFd::as_fd).collect();
    zygote_proto::send_frame(fd.as_fd(), &zygote_proto::encode(&message).unwrap(), &fds)
        .expect("send");
}

/// As [`run_warm`], with `attached` fds sent along.
fn run_warm_with_fds(
    fd: &OwnedFd,
    handle: u64,
    request: SpawnRequest,
    attached: Vec<OwnedFd>,
) -> Result<Ran, SpawnFailed> {
    let id = request.id;
    let request = SpawnRequest {
        stdout: StdioSpec::Pipe,
        stderr: StdioSpec::Pipe,
        ..request
    };
    send_warm(fd, handle, request, &attached);
    drop(attached);
    let (reply, fds) = receive(fd);
    let (pid, mut fds) = match reply {
        ServerMessage::Spawned(spawned) => {
            assert_eq!(spawned.id, id);
            (spawned.pid, fds)
        }
        ServerMessage::SpawnFailed(failed) => {
            assert_eq!(failed.id, id);
            return Err(failed);
        }
        other => panic!("unexpected reply to a warm spawn: {other:?}"),
    };
    assert_eq!(fds.len(), 3, "Spawned carries the pidfd, stdout and stderr");
    let stderr = read_all(fds.pop().unwrap());
    let stdout = read_all(fds.pop().unwrap());
    let exited = match receive(fd).0 {
        ServerMessage::Exited(exited) => exited,
        other => panic!("expected Exited, got {other:?}"),
    };
    assert_eq!(exited.id, id);
    Ok(Ran {
        pid,
        stdout,
        stderr,
        exited,
    })
}

/// Sends a warm spawn and waits for its end, reading nothing: the last
/// fd `Spawned` carried (stdout, or a pty's master), and the exit notice.
fn last_fd_and_exit(warm: &Warm, request: SpawnRequest) -> (OwnedFd, ExitNotice) {
    send_warm(&warm.fd, warm.handle, request, &[]);
    let (reply, mut fds) = receive(&warm.fd);
    assert!(
        matches!(reply, ServerMessage::Spawned(_)),
        "{reply:?}\n{}",
        warm.daemon.log()
    );
    let last = fds.pop().expect("the child's fd");
    let exited = match receive(&warm.fd).0 {
        ServerMessage::Exited(exited) => exited,
        other => panic!("expected Exited, got {other:?}"),
    };
    (last, exited)
}

fn read_all(fd: OwnedFd) -> String {
    let mut text = String::new();
    std::fs::File::from(fd)
        .read_to_string(&mut text)
        .expect("read a child's output");
    text
}

/// A daemon, a connection, and a template preloading `preload`.
struct Warm {
    daemon: Daemon,
    fd: OwnedFd,
    handle: u64,
    python: PathBuf,
}

fn warm_setup(test: &str, preload: &[&str]) -> Option<Warm> {
    warm_setup_with(test, preload, base_env())
}

/// As [`warm_setup`], the template started with `env` (a [`modules`]
/// directory on its `PYTHONPATH`, say).
fn warm_setup_with(test: &str, preload: &[&str], env: Env) -> Option<Warm> {
    let python = python_or_skip()?;
    let daemon = start_daemon(test);
    let fd = connect(daemon.socket());
    let ready = template(&fd, 1, &python, preload, env)
        .unwrap_or_else(|failed| panic!("template failed: {failed:?}\n{}", daemon.log()));
    assert!(!ready.reused);
    Some(Warm {
        daemon,
        fd,
        handle: ready.template,
        python,
    })
}

#[test]
fn a_c_child_prints_gets_its_argv_and_exit_code() {
    let Some(warm) = warm_setup("tpl-c", &["json"]) else {
        return;
    };
    let code = "import sys, json; print(json.dumps(sys.argv)); sys.exit(7)";
    let ran = run_warm(
        &warm.fd,
        warm.handle,
        warm_request(10, &["-c", code, "a", "b c"]),
    )
    .unwrap_or_else(|failed| panic!("{failed:?}\n{}", warm.daemon.log()));
    assert_eq!(
        ran.stdout, "[\"-c\", \"a\", \"b c\"]\n",
        "stderr: {}",
        ran.stderr
    );
    assert_eq!(ran.code(), Some(7));
    assert_eq!(ran.exited.pid, ran.pid);
}

/// Runs `code` in a warm child of `warm` with `args` after it, expecting
/// exit 0: its stdout.
fn python_output(warm: &Warm, id: u64, code: &str) -> String {
    let ran = run_warm(&warm.fd, warm.handle, warm_request(id, &["-c", code]))
        .unwrap_or_else(|failed| panic!("{failed:?}\n{}", warm.daemon.log()));
    assert_eq!(ran.code(), Some(0), "stderr: {}", ran.stderr);
    ran.stdout
}

#[test]
fn m_and_script_children_get_argv_main_and_path0() {
    let Some(warm) = warm_setup("tpl-m-script", &[]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let show = "import sys\nprint(__name__, sys.argv, sys.path[0], sep='|')\n";
    std::fs::write(dir.path().join("shown.py"), show).unwrap();
    let scripts = dir.path().join("scripts");
    std::fs::create_dir(&scripts).unwrap();
    std::fs::write(scripts.join("run.py"), show).unwrap();
    let cwd = dir.path().to_str().unwrap();
    let module = SpawnRequest {
        cwd: Some(cwd.into()),
        ..warm_request(10, &["-m", "shown", "x", "y"])
    };
    let ran = run_warm(&warm.fd, warm.handle, module).expect("-m");
    let module_file = dir.path().join("shown.py");
    assert_eq!(
        ran.stdout,
        format!("__main__|['{}', 'x', 'y']|{cwd}\n", module_file.display()),
        "stderr: {}",
        ran.stderr
    );
    let script = scripts.join("run.py");
    let script = script.to_str().unwrap();
    let ran = run_warm(&warm.fd, warm.handle, warm_request(11, &[script, "z"])).expect("script");
    assert_eq!(
        ran.stdout,
        format!("__main__|['{script}', 'z']|{}\n", scripts.display()),
        "stderr: {}",
        ran.stderr
    );
    let ran = run_warm(
        &warm.fd,
        warm.handle,
        warm_request(12, &["/nonexistent/x.py"]),
    )
    .expect("a missing script still starts");
    assert_eq!(ran.code(), Some(2));
    assert!(ran.stderr.contains("can't open file"), "{}", ran.stderr);
}

#[test]
fn an_uncaught_exception_exits_1_with_its_traceback_and_system_exit_sets_the_code() {
    let Some(warm) = warm_setup("tpl-exc", &[]) else {
        return;
    };
    let code = "def fail():\n    raise ValueError('boom')\nfail()\n";
    let ran = run_warm(&warm.fd, warm.handle, warm_request(10, &["-c", code])).expect("spawn");
    assert_eq!(ran.code(), Some(1));
    assert!(
        ran.stderr
            .starts_with("Traceback (most recent call last):\n"),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("ValueError: boom"), "{}", ran.stderr);
    assert!(ran.stderr.contains("in fail"), "{}", ran.stderr);
    // The traceback starts in the program: no frame of the template's.
    let frames = ran.stderr.matches("  File ").count();
    assert_eq!(frames, 2, "the module and fail(): {}", ran.stderr);
    let ran = run_warm(
        &warm.fd,
        warm.handle,
        warm_request(11, &["-c", "raise SystemExit(3)"]),
    )
    .expect("spawn");
    assert_eq!(ran.code(), Some(3));
    assert_eq!(ran.stderr, "");
    // As `python`: a KeyboardInterrupt ends the child by SIGINT.
    let ran = run_warm(
        &warm.fd,
        warm.handle,
        warm_request(13, &["-c", "raise KeyboardInterrupt"]),
    )
    .expect("spawn");
    assert!(
        matches!(ran.exited.status, ExitStatus::Signaled { signal, .. } if signal == libc::SIGINT),
        "{:?} {}",
        ran.exited.status,
        ran.stderr
    );
    assert!(ran.stderr.contains("KeyboardInterrupt"), "{}", ran.stderr);
    // atexit handlers run, and buffered output is flushed, at the end.
    let code = "import atexit, sys\natexit.register(lambda: print('bye'))\nsys.stdout.write('hi ')";
    let ran = run_warm(&warm.fd, warm.handle, warm_request(12, &["-c", code])).expect("spawn");
    assert_eq!((ran.code(), ran.stdout.as_str()), (Some(0), "hi bye\n"));
}

#[test]
fn two_children_never_share_random_output() {
    let Some(warm) = warm_setup("tpl-rng", &["random"]) else {
        return;
    };
    let code = "import random, os; print(random.random(), os.urandom(8).hex())";
    let first = python_output(&warm, 10, code);
    let second = python_output(&warm, 11, code);
    let (first_random, first_urandom) = first.trim().split_once(' ').unwrap();
    let (second_random, second_urandom) = second.trim().split_once(' ').unwrap();
    assert_ne!(
        first_random, second_random,
        "random is reseeded in each child"
    );
    assert_ne!(first_urandom, second_urandom);
}

/// A directory of preload modules, on the template's `PYTHONPATH`.
fn modules(files: &[(&str, &str)]) -> (tempfile::TempDir, Env) {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, source) in files {
        std::fs::write(dir.path().join(format!("{name}.py")), source).expect("write a module");
    }
    let mut env = base_env();
    env.push(b"PYTHONPATH", dir.path().as_os_str().as_encoded_bytes());
    (dir, env)
}

/// The template's own state a child must not keep: a signal handler, a
/// blocked signal, an open file, a variable of its environment.
const DIRTY_PRELOAD: &str = "\
import os, signal
signal.signal(signal.SIGUSR2, lambda *args: None)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGHUP])
kept = open(os.devnull)
";

#[test]
fn a_child_has_only_its_own_fds_signals_env_and_cwd() {
    let Some(python) = python_or_skip() else {
        return;
    };
    // Forked on its request, and forked ahead (prepared before it).
    for pool in ["0", "1"] {
        child_hygiene(&python, pool);
    }
}

fn child_hygiene(python: &Path, pool: &str) {
    let daemon = start_daemon_custom(
        "tpl-hygiene",
        None,
        None,
        &[],
        &crate::util::zygote_bin(),
        &[("ZYGOTE_TEMPLATE_POOL", pool)],
    );
    let fd = connect(daemon.socket());
    let (_dir, mut env) = modules(&[("dirty", DIRTY_PRELOAD)]);
    env.push(b"FROM_TEMPLATE", b"1");
    env.push(b"SHARED", b"template's");
    let ready = template(&fd, 1, python, &["dirty"], env).expect("template");
    let code = "\
import os, signal
fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
blocked = [l for l in open('/proc/self/status') if l.startswith('SigBlk')][0].split()[1]
os.write(5, b'mapped')
print(fds, int(blocked, 16), signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL,
      signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN,
      signal.getsignal(signal.SIGINT) is signal.default_int_handler,
      os.environ.get('FROM_TEMPLATE'), os.environ.get('ASKED'), os.environ.get('SHARED'),
      os.getcwd(), os.getppid())
";
    let (read_end, write_end) = rustix::pipe::pipe().expect("pipe");
    let mut env = base_env();
    env.push(b"ASKED", b"yes");
    env.push(b"SHARED", b"child's");
    let request = SpawnRequest {
        env,
        cwd: Some(b"/tmp".to_vec()),
        ignored_signals: 1 << (libc::SIGUSR1 - 1),
        fd_mappings: vec![zygote_proto::FdMapping {
            attached_index: 0,
            child_fd: 5,
        }],
        ..warm_request(10, &["-c", code])
    };
    let ran = run_warm_with_fds(&fd, ready.template, request, vec![write_end])
        .unwrap_or_else(|failed| panic!("{failed:?}\n{}", daemon.log()));
    assert_eq!(ran.code(), Some(0), "stderr: {}", ran.stderr);
    let daemon_pid = daemon.pid();
    assert_eq!(
        ran.stdout,
        format!("[5] 0 True True True None yes child's /tmp {daemon_pid}\n"),
        "only the mapped fd; no signal blocked; the template's handler reset, the request's \
         ignored signal kept; only the request's environment; its cwd; the daemon as parent \
         (pool of {pool})"
    );
    assert_eq!(read_all(read_end), "mapped");
}

#[test]
fn a_template_that_cannot_start_says_why_and_the_connection_lives_on() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let daemon = start_daemon_custom(
        "tpl-bad",
        None,
        None,
        &[],
        &crate::util::zygote_bin(),
        // A preload that hangs fails at this deadline, not 60 s.
        &[("ZYGOTE_TEMPLATE_START_DEADLINE_MS", "1500")],
    );
    let fd = connect(daemon.socket());
    let (_dir, env) = modules(&[
        ("raising", "raise RuntimeError('broken preload')\n"),
        (
            "threading_preload",
            "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n",
        ),
        ("hanging", "import time\ntime.sleep(60)\n"),
    ]);
    let failed = |id, preload: &[&str], python: &Path| {
        template(&fd, id, python, preload, env.clone()).expect_err("the template fails")
    };
    let raised = failed(1, &["json", "raising"], &python);
    assert_eq!(raised.errno, libc::EPROTO);
    assert!(
        raised.message.contains("preload raising raised"),
        "{}",
        raised.message
    );
    assert!(raised.message.contains("Traceback"), "{}", raised.message);
    assert!(
        raised.message.contains("RuntimeError: broken preload"),
        "{}",
        raised.message
    );
    let missing = failed(2, &["no_such_module_here"], &python);
    assert_eq!(missing.errno, libc::EPROTO);
    assert!(
        missing
            .message
            .contains("No module named 'no_such_module_here'"),
        "{}",
        missing.message
    );
    let threaded = failed(3, &["threading_preload"], &python);
    assert_eq!(threaded.errno, libc::EPROTO);
    assert!(
        threaded
            .message
            .contains("preload threading_preload started a thread"),
        "{}",
        threaded.message
    );
    let no_interpreter = failed(4, &[], Path::new("/nonexistent/python3"));
    assert_eq!(
        no_interpreter.errno,
        libc::ENOENT,
        "{}",
        no_interpreter.message
    );
    let started = std::time::Instant::now();
    let hung = failed(5, &["hanging"], &python);
    assert_eq!(hung.errno, libc::ETIMEDOUT, "{}", hung.message);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the deadline holds"
    );
    let bad_kind = {
        send(
            &fd,
            &ClientMessage::Template(TemplateRequest {
                id: 6,
                kind: "node".into(),
                interpreter: b"node".to_vec(),
                preload: Vec::new(),
                env: base_env(),
                cwd: None,
            }),
        );
        receive(&fd).0
    };
    assert!(
        matches!(&bad_kind, ServerMessage::RequestFailed(failed) if failed.errno == libc::EOPNOTSUPP),
        "{bad_kind:?}"
    );
    let bad_name = failed(7, &["os; import x"], &python);
    assert_eq!(bad_name.errno, libc::EINVAL, "{}", bad_name.message);
    // None of those left a template behind, and the connection still works.
    assert!(list(&fd, 8).is_empty());
    let last = template(&fd, 9, &python, &["json"], env.clone()).expect("a good template");
    // No template process is left of the failed ones: only the last, and
    // the one child its pool keeps forked ahead.
    let children = crate::util::children_of(daemon.pid());
    assert!(
        children.contains(&(last.pid as u32)) && children.len() <= 2,
        "{children:?}\n{}",
        daemon.log()
    );
}

/// The templates this connection sees.
fn list(fd: &OwnedFd, id: u64) -> Vec<TemplateInfo> {
    send(
        fd,
        &ClientMessage::ListTemplates(TemplateListRequest { id }),
    );
    match receive(fd).0 {
        ServerMessage::Templates(list) => {
            assert_eq!(list.id, id);
            list.templates
        }
        other => panic!("expected Templates, got {other:?}"),
    }
}

#[test]
fn the_same_spec_reuses_one_template_and_the_list_shows_it() {
    let Some(warm) = warm_setup("tpl-reuse", &["json"]) else {
        return;
    };
    let again = template(&warm.fd, 2, &warm.python, &["json"], base_env()).expect("again");
    assert!(again.reused);
    assert_eq!(again.template, warm.handle);
    let other = template(&warm.fd, 3, &warm.python, &["json", "email"], base_env()).expect("other");
    assert!(!other.reused);
    assert_ne!(other.template, warm.handle);
    assert_eq!(python_output(&warm, 10, "print(1)"), "1\n");
    let templates = list(&warm.fd, 4);
    assert_eq!(templates.len(), 2, "{templates:?}");
    let info = templates
        .iter()
        .find(|info| info.template == warm.handle)
        .unwrap();
    assert_eq!(info.uid, rustix::process::geteuid().as_raw());
    assert_eq!(info.pid, again.pid);
    assert_eq!(info.preload, vec!["json".to_owned()]);
    assert_eq!(info.kind, PYTHON_TEMPLATE);
    assert_eq!(info.interpreter, warm.python.as_os_str().as_encoded_bytes());
    assert_eq!((info.forks, info.restarts), (1, 0));
    assert!(info.rss_bytes > 1 << 20, "{info:?}");
}

#[test]
fn a_killed_template_is_reported_and_the_next_request_starts_a_new_one() {
    let Some(warm) = warm_setup("tpl-killed", &["json"]) else {
        return;
    };
    assert_eq!(python_output(&warm, 10, "print(1)"), "1\n");
    let first_pid = list(&warm.fd, 2)[0].pid;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first_pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .expect("kill the template");
    assert!(
        eventually(Duration::from_secs(10), || warm
            .daemon
            .log()
            .contains("template ended unasked")),
        "{}",
        warm.daemon.log()
    );
    assert_eq!(python_output(&warm, 11, "print(2)"), "2\n");
    let info = list(&warm.fd, 3).remove(0);
    assert_ne!(info.pid, first_pid);
    assert_eq!((info.restarts, info.forks), (1, 1));
}

/// The live (not zombie) children of `parent`, from /proc.
fn live_children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent_of(pid) == Some(parent) && process_state(pid) != Some('Z'))
        .collect()
}

#[test]
fn a_template_keeps_its_pool_forked_ahead_and_the_pool_ends_with_it() {
    let Some(python) = python_or_skip() else {
        return;
    };
    for pool in [0, 3] {
        let daemon = start_daemon_custom(
            "tpl-pool",
            None,
            None,
            &[],
            &crate::util::zygote_bin(),
            &[("ZYGOTE_TEMPLATE_POOL", &pool.to_string())],
        );
        let fd = connect(daemon.socket());
        let ready = template(&fd, 1, &python, &["json"], base_env())
            .unwrap_or_else(|failed| panic!("{failed:?}\n{}", daemon.log()));
        let warm = Warm {
            daemon,
            fd,
            handle: ready.template,
            python: python.clone(),
        };
        // More children than the pool holds: it is refilled between them.
        for id in 10..15 {
            let printed = python_output(&warm, id, &format!("print({id})"));
            assert_eq!(printed, format!("{id}\n"), "pool of {pool}");
        }
        let daemon_pid = warm.daemon.pid();
        let waiting = || {
            let mut children = live_children_of(daemon_pid);
            children.retain(|&pid| pid != ready.pid as u32);
            children
        };
        assert!(
            eventually(Duration::from_secs(10), || waiting().len() == pool),
            "a pool of {pool} keeps {pool} children waiting: {:?}",
            waiting()
        );
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(ready.pid).unwrap(),
            rustix::process::Signal::KILL,
        )
        .expect("kill the template");
        assert!(
            eventually(Duration::from_secs(10), || waiting().is_empty()),
            "the pool ends with its template: {:?} still run",
            waiting()
        );
    }
}

#[test]
fn a_child_setup_step_that_fails_is_its_stage() {
    let Some(warm) = warm_setup("tpl-chdir", &[]) else {
        return;
    };
    let request = SpawnRequest {
        cwd: Some(b"/nonexistent/dir".to_vec()),
        ..warm_request(10, &["-c", "pass"])
    };
    let failed = run_warm(&warm.fd, warm.handle, request).expect_err("no such cwd");
    assert_eq!(
        (failed.stage, failed.errno),
        (SpawnStage::Chdir, libc::ENOENT),
        "{failed:?}"
    );
    for (id, args) in [(11, &["-x"][..]), (12, &["-c"][..]), (13, &[][..])] {
        let failed = run_warm(&warm.fd, warm.handle, warm_request(id, args)).expect_err("bad args");
        assert_eq!(
            (failed.stage, failed.errno),
            (SpawnStage::Validate, libc::EINVAL),
            "{failed:?}"
        );
    }
    let unknown = run_warm(
        &warm.fd,
        warm.handle + 1000,
        warm_request(14, &["-c", "pass"]),
    )
    .expect_err("no such template");
    assert_eq!(
        (unknown.stage, unknown.errno),
        (SpawnStage::Validate, libc::ENOENT)
    );
    let argv0 = SpawnRequest {
        argv0: Some(b"x".to_vec()),
        ..warm_request(15, &["-c", "pass"])
    };
    let refused = run_warm(&warm.fd, warm.handle, argv0).expect_err("argv0");
    assert_eq!(
        (refused.stage, refused.errno),
        (SpawnStage::Validate, libc::EOPNOTSUPP)
    );
    assert_eq!(python_output(&warm, 16, "print('still')"), "still\n");
}

#[test]
fn warm_children_time_out_and_die_with_their_connection() {
    let Some(warm) = warm_setup("tpl-lifetime", &[]) else {
        return;
    };
    let request = SpawnRequest {
        timeout: Some(Timeout {
            millis: 300,
            grace_millis: 5000,
        }),
        ..warm_request(10, &["-c", "import time; time.sleep(30)"])
    };
    let ran = run_warm(&warm.fd, warm.handle, request).expect("spawn");
    assert!(ran.exited.timed_out);
    assert!(
        matches!(ran.exited.status, ExitStatus::Signaled { signal, .. } if signal == libc::SIGTERM),
        "{:?}",
        ran.exited.status
    );
    // A second connection of the same uid: the template outlives it.
    let second = connect(warm.daemon.socket());
    let request = SpawnRequest {
        kill_on_close: Some(KillOnClose {
            signal: libc::SIGKILL,
            process_group: false,
        }),
        ..warm_request(11, &["-c", "import time; time.sleep(30)"])
    };
    send_warm(&second, warm.handle, request, &[]);
    let pid = match receive(&second).0 {
        ServerMessage::Spawned(spawned) => spawned.pid,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        parent_of(pid as u32),
        Some(warm.daemon.pid()),
        "the daemon's own child"
    );
    drop(second);
    assert!(
        eventually(Duration::from_secs(10), || crate::util::process_state(
            pid as u32
        )
        .is_none()),
        "the warm child was killed and reaped when its connection closed"
    );
    assert_eq!(python_output(&warm, 12, "print(3)"), "3\n");
}

#[test]
fn templates_stop_when_their_uid_has_no_connection_left() {
    let Some(warm) = warm_setup("tpl-owner", &[]) else {
        return;
    };
    let pid = list(&warm.fd, 2)[0].pid;
    let Warm {
        daemon, fd, handle, ..
    } = warm;
    drop(fd);
    assert!(
        eventually(Duration::from_secs(10), || crate::util::process_state(
            pid as u32
        )
        .is_none()),
        "the template ended with its owner's last connection\n{}",
        daemon.log()
    );
    let fd = connect(daemon.socket());
    let failed = run_warm(&fd, handle, warm_request(10, &["-c", "pass"])).expect_err("stopped");
    assert_eq!(
        (failed.stage, failed.errno),
        (SpawnStage::Validate, libc::ENOENT),
        "{failed:?}"
    );
}

#[test]
fn a_warm_child_runs_in_its_own_cgroup_and_is_accounted() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let Some(cgroup) = crate::cgroup::TestCgroup::new("tpl-cgroup") else {
        return;
    };
    let daemon = crate::util::start_daemon_with("tpl-cgroup", None, &["--cgroup", &cgroup.arg()]);
    let fd = connect(daemon.socket());
    let ready = template(&fd, 1, &python, &[], base_env()).expect("template");
    let template_cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", ready.pid)).unwrap();
    let code =
        "import sys\nn = sum(range(3_000_000))\nprint(open('/proc/self/cgroup').read(), end='')";
    let request = SpawnRequest {
        cgroup: Some(zygote_proto::CgroupSpec {
            kill_tree: true,
            ..Default::default()
        }),
        ..warm_request(10, &["-c", code])
    };
    let ran = run_warm(&fd, ready.template, request)
        .unwrap_or_else(|failed| panic!("{failed:?}\n{}", daemon.log()));
    assert_eq!(ran.code(), Some(0), "{}", ran.stderr);
    let subtree = cgroup.arg();
    let under = Path::new(&subtree).file_name().unwrap().to_str().unwrap();
    let unified = |text: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix("0::"))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let child = unified(&ran.stdout);
    assert!(
        child.contains(&format!("/{under}/peers/")),
        "the child ran in the daemon's subtree: {} (subtree {under})",
        ran.stdout
    );
    assert_ne!(
        child,
        unified(&template_cgroup),
        "not in its template's cgroup"
    );
    let tree = ran.exited.tree.expect("tree usage of a requested cgroup");
    assert!(tree.user_micros + tree.system_micros > 0, "{tree:?}");
}

/// The system's own CPython, which any uid may run (pyenv's lives under
/// root's home).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// A helper run as another uid: tries a template of root's, then starts
/// its own and runs a child in it. Says what it got.
pub(crate) fn other_uid_client(socket: &Path, handle: u64) {
    let say = |line: String| println!("HELPER {line}");
    let fd = connect(socket);
    match run_warm(&fd, handle, warm_request(1, &["-c", "pass"])) {
        Ok(_) => say("others spawned".into()),
        Err(failed) => say(format!("others {} {}", failed.stage.name(), failed.errno)),
    }
    match template(&fd, 2, Path::new(SYSTEM_PYTHON), &["json"], base_env()) {
        Ok(ready) => {
            let code = "import os; print(os.getuid(), os.getgid(), os.getppid())";
            match run_warm(&fd, ready.template, warm_request(3, &["-c", code])) {
                Ok(ran) => say(format!("own {}", ran.stdout.trim())),
                Err(failed) => say(format!("own failed {failed:?}")),
            }
            let seen: Vec<u32> = list(&fd, 4).iter().map(|info| info.uid).collect();
            say(format!("sees {seen:?}"));
        }
        Err(failed) => say(format!("own template failed {failed:?}")),
    }
    say("done".into());
    // Connected (its template alive) until the test closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Runs [`other_uid_client`] as nobody against `handle`: its lines up to
/// "done", and the helper, connected until its stdin closes.
fn nobody_helper(daemon: &crate::util::Daemon, handle: u64) -> (std::process::Child, Vec<String>) {
    let mut helper = crate::helper::helper(&format!("templates:{handle}"), daemon.socket())
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the helper as nobody");
    let lines = std::io::BufRead::lines(std::io::BufReader::new(helper.stdout.take().unwrap()));
    let mut found = Vec::new();
    for line in lines {
        let line = line.expect("the helper's output");
        if line == "HELPER done" {
            break;
        }
        found.extend(line.strip_prefix("HELPER ").map(str::to_owned));
    }
    (helper, found)
}

#[test]
fn a_template_is_its_uids_alone() {
    if !crate::util::root_or_skip("a peer of another uid") {
        return;
    }
    let Some(python) = python_or_skip() else {
        return;
    };
    if !Path::new(SYSTEM_PYTHON).exists() {
        skip("no /usr/bin/python3 for a peer of another uid");
        return;
    }
    let daemon = crate::util::start_daemon_with("tpl-uids", None, &["--socket-mode", "0666"]);
    let fd = connect(daemon.socket());
    let ready = template(&fd, 1, &python, &[], base_env()).expect("root's template");
    let (mut helper, found) = nobody_helper(&daemon, ready.template);
    assert!(
        found.contains(&format!("others validate {}", libc::EPERM)),
        "{found:?}\n{}",
        daemon.log()
    );
    assert!(
        found.contains(&format!("own 65534 65534 {}", daemon.pid())),
        "the other uid's own template runs as that uid: {found:?}\n{}",
        daemon.log()
    );
    assert!(found.contains(&"sees [65534]".to_owned()), "{found:?}");
    // Root sees both while both are connected.
    let mut uids: Vec<u32> = list(&fd, 2).iter().map(|info| info.uid).collect();
    uids.sort_unstable();
    assert_eq!(uids, [0, 65534]);
    drop(helper.stdin.take());
    crate::util::wait_within(&mut helper, Duration::from_secs(10), "the helper");
    assert!(
        eventually(Duration::from_secs(10), || list(&fd, 3).len() == 1),
        "the other uid's template stopped with its last connection"
    );
}

#[test]
fn an_interpreter_older_than_3_8_is_refused_by_name() {
    // pyenv's versions directory, next to the CPython tested.
    let Some(old) = python_or_skip().and_then(|python| {
        let versions = python.parent()?.parent()?.parent()?.to_path_buf();
        std::fs::read_dir(versions)
            .ok()?
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("3.7."))
            .map(|entry| entry.path().join("bin/python3"))
            .find(|path| path.exists())
    }) else {
        skip("no pyenv CPython 3.7 next to the one tested");
        return;
    };
    let daemon = start_daemon("tpl-old");
    let fd = connect(daemon.socket());
    let failed = template(&fd, 1, &old, &[], base_env()).expect_err("3.7 is refused");
    assert_eq!(failed.errno, libc::EPROTO);
    assert!(
        failed.message.contains("needs CPython 3.8 or later"),
        "{}",
        failed.message
    );
}

#[test]
fn an_upgrade_stops_templates_and_keeps_their_children() {
    let Some(warm) = warm_setup("tpl-upgrade", &["json"]) else {
        return;
    };
    let template_pid = list(&warm.fd, 2)[0].pid;
    let request = SpawnRequest {
        stdout: StdioSpec::Pipe,
        ..warm_request(
            10,
            &["-c", "import time; time.sleep(1.5); print('survived')"],
        )
    };
    send_warm(&warm.fd, warm.handle, request, &[]);
    let (reply, mut fds) = receive(&warm.fd);
    assert!(matches!(reply, ServerMessage::Spawned(_)), "{reply:?}");
    let stdout = fds.pop().expect("stdout");
    send(
        &warm.fd,
        &ClientMessage::Upgrade(zygote_proto::UpgradeRequest { id: 20 }),
    );
    let (reply, _) = receive(&warm.fd);
    assert!(
        matches!(&reply, ServerMessage::Status(status) if status.id == 20),
        "{reply:?}\n{}",
        warm.daemon.log()
    );
    // The new image has no template: the old one ended, its handle is
    // unknown, and its running child is still reported.
    assert!(
        eventually(Duration::from_secs(10), || {
            crate::util::process_state(template_pid as u32).is_none()
        }),
        "the template process ended and was reaped\n{}",
        warm.daemon.log()
    );
    send_warm(
        &warm.fd,
        warm.handle,
        warm_request(11, &["-c", "pass"]),
        &[],
    );
    let mut exited = None;
    let mut refused = None;
    while exited.is_none() || refused.is_none() {
        match receive(&warm.fd).0 {
            ServerMessage::Exited(notice) => exited = Some(notice),
            ServerMessage::SpawnFailed(failed) => refused = Some(failed),
            other => panic!("unexpected {other:?}"),
        }
    }
    let refused = refused.unwrap();
    assert_eq!(
        (refused.id, refused.stage, refused.errno),
        (11, SpawnStage::Validate, libc::ENOENT)
    );
    let exited = exited.unwrap();
    assert_eq!((exited.id, exited.status), (10, ExitStatus::Exited(0)));
    assert_eq!(read_all(stdout), "survived\n");
    let again =
        template(&warm.fd, 30, &warm.python, &["json"], base_env()).expect("a new template");
    assert_ne!(again.template, warm.handle, "handles are never reused");
    assert!(!again.reused);
}

#[test]
fn metrics_count_template_starts_forks_crashes_and_warm_latency() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let address =
        std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, crate::tools::free_port()));
    let daemon = crate::util::start_daemon_with(
        "tpl-metrics",
        None,
        &["--metrics-listen", &address.to_string()],
    );
    let fd = connect(daemon.socket());
    template(&fd, 1, &python, &["no_such_module_here"], base_env()).expect_err("missing");
    let ready = template(&fd, 2, &python, &[], base_env()).expect("template");
    for id in [10, 11] {
        run_warm(&fd, ready.template, warm_request(id, &["-c", "pass"])).expect("warm");
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(ready.pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .expect("kill the template");
    let sample = |text: &str, series: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse::<f64>().ok())
    };
    let scrape = || {
        crate::tools::http_get(address, "/metrics")
            .expect("GET /metrics")
            .1
    };
    assert!(
        eventually(Duration::from_secs(10), || {
            sample(&scrape(), "zygote_template_exits_unasked_total") == Some(1.0)
        }),
        "{}",
        scrape()
    );
    let text = scrape();
    for (series, value) in [
        ("zygote_template_starts_total{result=\"ok\"}", 1.0),
        (
            "zygote_template_starts_total{result=\"preload_failed\"}",
            1.0,
        ),
        ("zygote_template_starts_total{result=\"timeout\"}", 0.0),
        ("zygote_template_forks_total", 2.0),
        ("zygote_warm_spawn_duration_seconds_count", 2.0),
        ("zygote_spawns_total{result=\"ok\"}", 2.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
}

#[test]
fn a_daemon_run_as_a_user_runs_templates_and_warm_children_as_that_user() {
    if !crate::util::root_or_skip("a daemon of another uid") {
        return;
    }
    if !Path::new(SYSTEM_PYTHON).exists() {
        skip("no /usr/bin/python3 for a daemon of another uid");
        return;
    }
    let daemon = crate::util::start_daemon_as("tpl-user-daemon", Some(65534), None, &[]);
    let fd = connect(daemon.socket());
    let ready = template(&fd, 1, Path::new(SYSTEM_PYTHON), &[], base_env())
        .unwrap_or_else(|failed| panic!("{failed:?}\n{}", daemon.log()));
    let code = "import os; print(os.getuid())";
    let request = SpawnRequest {
        cwd: Some(b"/".to_vec()),
        ..warm_request(10, &["-c", code])
    };
    let ran = run_warm(&fd, ready.template, request)
        .unwrap_or_else(|failed| panic!("{failed:?}\n{}", daemon.log()));
    assert_eq!(ran.stdout, "65534\n", "{}", ran.stderr);
    // Root and the daemon's own uid see every peer's templates.
    let (mut helper, found) = nobody_helper(&daemon, ready.template);
    assert!(
        found.contains(&"sees [0, 65534]".to_owned()),
        "{found:?}\n{}",
        daemon.log()
    );
    let mut uids: Vec<u32> = list(&fd, 20).iter().map(|info| info.uid).collect();
    uids.sort_unstable();
    assert_eq!(uids, [0, 65534]);
    drop(helper.stdin.take());
    crate::util::wait_within(&mut helper, Duration::from_secs(10), "the helper");
}

/// A preload that makes the template lie about the children it forks:
/// it names `LIE` (evaluated in the template) in place of the pid.
fn liar(lie: &str) -> String {
    format!(
        "import json, os\n\
         _dumps = json.dumps\n\
         def dumps(value, *args, **kwargs):\n\
         \x20   if isinstance(value, dict) and 'pid' in value:\n\
         \x20       value = {{'pid': {lie}}}\n\
         \x20   return _dumps(value, *args, **kwargs)\n\
         json.dumps = dumps\n"
    )
}

#[test]
fn a_template_naming_a_process_that_is_not_its_new_child_is_not_believed() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let ran_marker = Path::new("/tmp/zygote-liar-ran");
    let _ = std::fs::remove_file(ran_marker);
    let daemon = start_daemon("tpl-liar");
    let fd = connect(daemon.socket());
    let (_dir, env) = modules(&[
        ("init_liar", &liar("1")),
        ("self_liar", &liar("os.getpid()")),
    ]);
    // Not the daemon's child; the daemon's child, but one it tracks.
    for (id, preload, errno) in [
        (1, "init_liar", libc::ECHILD),
        (2, "self_liar", libc::EEXIST),
    ] {
        let ready = template(&fd, id, &python, &[preload], env.clone()).expect("template");
        let code = "open('/tmp/zygote-liar-ran', 'w')";
        let failed = run_warm(&fd, ready.template, warm_request(10 + id, &["-c", code]))
            .expect_err("the lie is not believed");
        assert_eq!(
            (failed.stage, failed.errno),
            (SpawnStage::Template, libc::EPROTO),
            "{failed:?}"
        );
        let why = std::io::Error::from_raw_os_error(errno).to_string();
        assert!(failed.message.contains(&why), "{why}: {}", failed.message);
    }
    assert!(
        !ran_marker.exists(),
        "a child the daemon did not take never runs its program"
    );
}

#[test]
fn a_warm_child_on_a_pty_has_it_as_its_controlling_terminal() {
    let Some(warm) = warm_setup("tpl-pty", &[]) else {
        return;
    };
    let code = "import os, sys\n\
                print(sys.stdout.isatty(), sys.stdout.line_buffering, os.getsid(0) == os.getpid(), \
                os.tcgetpgrp(0) == os.getpgrp())";
    let request = SpawnRequest {
        pty: Some(zygote_proto::PtySpec {
            window: zygote_proto::WindowSize { rows: 24, cols: 80 },
        }),
        ..warm_request(10, &["-c", code])
    };
    let (master, exited) = last_fd_and_exit(&warm, request);
    assert_eq!(exited.status, ExitStatus::Exited(0));
    // The slave is closed: the master reads what is left, then EIO.
    let mut output = Vec::new();
    let mut buffer = [0u8; 4096];
    while let Ok(read @ 1..) = rustix::io::read(&master, &mut buffer) {
        output.extend_from_slice(&buffer[..read]);
    }
    assert_eq!(String::from_utf8_lossy(&output), "True True True True\r\n");
}

#[test]
fn a_template_that_keeps_failing_to_restart_is_paused_not_looped() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let daemon = start_daemon("tpl-pause");
    let fd = connect(daemon.socket());
    let (dir, env) = modules(&[("flaky", "")]);
    let ready = template(&fd, 1, &python, &["flaky"], env).expect("template");
    // From now on the preload raises; the running template is killed.
    std::fs::write(dir.path().join("flaky.py"), "raise OSError('gone bad')\n").unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(ready.pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .expect("kill the template");
    assert!(eventually(Duration::from_secs(10), || list(&fd, 2)[0].pid == 0));
    for id in 10..13 {
        let failed = run_warm(&fd, ready.template, warm_request(id, &["-c", "pass"]))
            .expect_err("the restart fails");
        assert_eq!(
            (failed.stage, failed.errno),
            (SpawnStage::Template, libc::EPROTO)
        );
        assert!(
            failed.message.contains("OSError: gone bad"),
            "{}",
            failed.message
        );
    }
    let started = std::time::Instant::now();
    let paused =
        run_warm(&fd, ready.template, warm_request(13, &["-c", "pass"])).expect_err("paused");
    assert_eq!(
        (paused.stage, paused.errno),
        (SpawnStage::Template, libc::EPROTO)
    );
    assert!(
        paused.message.contains("failed to start 3 times in a row"),
        "{}",
        paused.message
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused without a start"
    );
    // The log is written by a thread of its own, after the reply.
    let starts = || daemon.log().matches("template failed to start").count();
    assert!(
        eventually(Duration::from_secs(10), || starts() >= 3),
        "{}",
        daemon.log()
    );
    assert_eq!(starts(), 3, "{}", daemon.log());
}

#[test]
fn a_template_s_stderr_while_it_starts_is_read_and_shown_when_it_fails() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let daemon = start_daemon("tpl-stderr");
    let fd = connect(daemon.socket());
    let (_dir, env) = modules(&[
        // More than a pipe holds: the template must not block on it.
        (
            "chatty",
            "import sys\nsys.stderr.write('x' * 200_000)\nsys.stderr.flush()\n",
        ),
        (
            "crashing",
            "import os, sys\nsys.stderr.write('about to crash\\n')\nsys.stderr.flush()\nos.abort()\n",
        ),
    ]);
    let ready = template(&fd, 1, &python, &["chatty"], env.clone())
        .unwrap_or_else(|failed| panic!("{failed:?}\n{}", daemon.log()));
    let warm = Warm {
        daemon,
        fd,
        handle: ready.template,
        python: python.clone(),
    };
    assert_eq!(python_output(&warm, 10, "print('ok')"), "ok\n");
    let crashed = template(&warm.fd, 2, &python, &["crashing"], env).expect_err("it aborts");
    assert_eq!(crashed.errno, libc::EPROTO);
    assert!(
        crashed.message.contains("exited while it started")
            && crashed.message.contains("about to crash"),
        "{}",
        crashed.message
    );
}

/// A preload that records the pid of the process that imported it: a
/// child prints the pid of the template it was forked from.
const STAMP: (&str, &str) = ("stamp", "import os\nPID = os.getpid()\n");

/// A daemon started with these template settings, a connection, and a
/// template preloading [`STAMP`]; the module directory lives as long as
/// the returned guard.
fn stamped(test: &str, settings: &[(&str, &str)]) -> Option<(Warm, tempfile::TempDir, Env)> {
    let python = python_or_skip()?;
    let daemon = start_daemon_custom(test, None, None, &[], &crate::util::zygote_bin(), settings);
    let fd = connect(daemon.socket());
    let (dir, env) = modules(&[STAMP]);
    let ready = template(&fd, 1, &python, &["stamp"], env.clone())
        .unwrap_or_else(|failed| panic!("template failed: {failed:?}\n{}", daemon.log()));
    let warm = Warm {
        daemon,
        fd,
        handle: ready.template,
        python,
    };
    Some((warm, dir, env))
}

/// The pid of the template process a fresh child of `warm` came from.
fn forked_from(warm: &Warm, id: u64) -> i32 {
    let printed = python_output(warm, id, "import stamp; print(stamp.PID)");
    printed.trim().parse().expect("a pid")
}

#[test]
fn a_template_is_recycled_after_max_forks() {
    let Some((warm, _dir, _env)) = stamped("tpl-max-forks", &[("ZYGOTE_TEMPLATE_MAX_FORKS", "3")])
    else {
        return;
    };
    let first = list(&warm.fd, 2)[0].pid;
    for id in 10..13 {
        assert_eq!(forked_from(&warm, id), first, "fork {id} of 3");
    }
    let second = forked_from(&warm, 13);
    assert_ne!(second, first, "the fourth child comes from a fresh process");
    let info = list(&warm.fd, 3).remove(0);
    assert_eq!(info.template, warm.handle, "behind the same handle");
    assert_eq!(
        (info.pid, info.restarts, info.forks),
        (second, 1, 1),
        "{info:?}"
    );
    assert!(
        eventually(Duration::from_secs(10), || process_state(first as u32)
            .is_none()),
        "the recycled process ended and was reaped\n{}",
        warm.daemon.log()
    );
    assert!(
        warm.daemon
            .logged("recycling a template", Duration::from_secs(10)),
        "{}",
        warm.daemon.log()
    );
}

#[test]
fn a_template_is_recycled_after_max_age() {
    let max_age = Duration::from_millis(1500);
    let Some((warm, _dir, _env)) = stamped(
        "tpl-max-age",
        &[(
            "ZYGOTE_TEMPLATE_MAX_AGE_MS",
            &max_age.as_millis().to_string(),
        )],
    ) else {
        return;
    };
    let first = forked_from(&warm, 10);
    assert_eq!(list(&warm.fd, 2)[0].pid, first);
    std::thread::sleep(max_age + Duration::from_millis(200));
    let second = forked_from(&warm, 11);
    assert_ne!(
        second, first,
        "a child after MAX_AGE comes from a fresh process"
    );
    let info = list(&warm.fd, 3).remove(0);
    assert_eq!(
        (info.template, info.pid, info.restarts),
        (warm.handle, second, 1)
    );
}

#[test]
fn an_idle_template_is_stopped_and_its_handle_answers_enoent() {
    let Some((warm, _dir, env)) = stamped("tpl-idle", &[("ZYGOTE_TEMPLATE_IDLE_MS", "3000")])
    else {
        return;
    };
    let pid = forked_from(&warm, 10);
    // Used a moment ago: still listed.
    assert_eq!(list(&warm.fd, 2).len(), 1);
    let mut id = 100;
    assert!(
        eventually(Duration::from_secs(15), || {
            id += 1;
            list(&warm.fd, id).is_empty()
        }),
        "the idle template is no longer listed\n{}",
        warm.daemon.log()
    );
    assert!(
        eventually(Duration::from_secs(10), || process_state(pid as u32)
            .is_none()),
        "its process ended and was reaped\n{}",
        warm.daemon.log()
    );
    assert!(
        warm.daemon
            .logged("stopping an idle template", Duration::from_secs(10)),
        "{}",
        warm.daemon.log()
    );
    let failed =
        run_warm(&warm.fd, warm.handle, warm_request(11, &["-c", "pass"])).expect_err("stopped");
    assert_eq!(
        (failed.stage, failed.errno),
        (SpawnStage::Validate, libc::ENOENT),
        "{failed:?}"
    );
    // The documented way back: request it again, under a new handle.
    let again = template(&warm.fd, 3, &warm.python, &["stamp"], env).expect("requested again");
    assert!(!again.reused);
    assert_ne!(again.template, warm.handle);
    let fresh = Warm {
        handle: again.template,
        ..warm
    };
    assert_eq!(forked_from(&fresh, 12), again.pid);
}

#[test]
fn serve_refuses_a_bad_template_setting_by_name() {
    for (name, bad) in [
        ("ZYGOTE_TEMPLATE_MAX_FORKS", "0"),
        ("ZYGOTE_TEMPLATE_MAX_AGE_MS", "an hour"),
        ("ZYGOTE_TEMPLATE_IDLE_MS", "-5"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("zygote.sock");
        let serve = std::process::Command::new(crate::util::zygote_bin())
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .env(name, bad)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run zygote serve");
        let output = crate::util::output_within(serve, Duration::from_secs(10), "zygote serve");
        assert!(!output.status.success(), "{name}={bad} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("{name}=\"{bad}\" is not a whole number")),
            "{stderr}"
        );
        assert!(!socket.exists(), "refused before binding");
    }
}

/// Spawns `args` from `warm`'s template with stdout piped, waits for the
/// exit notice, and then looks at stdout: its exit notice, and whether
/// the pipe's write end was already closed by then.
fn exit_then_stdout(warm: &Warm, id: u64, args: &[&str]) -> (ExitNotice, bool) {
    let request = SpawnRequest {
        stdout: StdioSpec::Pipe,
        ..warm_request(id, args)
    };
    let (stdout, exited) = last_fd_and_exit(warm, request);
    let mut polled = [rustix::event::PollFd::new(
        &stdout,
        rustix::event::PollFlags::IN,
    )];
    // What holds now: the exit notice came last.
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut polled, Some(&now)).expect("poll");
    let hung_up = polled[0].revents().contains(rustix::event::PollFlags::HUP);
    (exited, hung_up)
}

/// A warm child's exit leaves the teardown of its copy of the template's
/// memory to a process that shares that memory and holds none of its
/// fds: the exit notice comes without waiting for it, and every pipe of
/// the child is at its end by then.
#[test]
fn a_warm_child_leaves_its_memory_teardown_to_a_process_holding_no_fd() {
    // 256 MiB written at import: 65,536 pages whose mappings a child's
    // exit would take down.
    let (_dir, env) = modules(&[("big", "heap = b'x' * (256 << 20)\n")]);
    let Some(warm) = warm_setup_with("tpl-teardown", &["big"], env) else {
        return;
    };
    // os._exit ends the child before the template's exit path: the
    // teardown is its own. Three of each, compared by their medians: one
    // child's system time varies by a millisecond on a busy machine.
    let mut own = Vec::new();
    let mut left = Vec::new();
    for round in 0..3 {
        let (torn_down, _) =
            exit_then_stdout(&warm, 10 + 2 * round, &["-c", "import os; os._exit(0)"]);
        let (handed_off, hung_up) =
            exit_then_stdout(&warm, 11 + 2 * round, &["-c", "print('done')"]);
        assert_eq!(handed_off.status, ExitStatus::Exited(0));
        assert!(hung_up, "the child's stdout was still open after its exit");
        own.push(torn_down.usage.system_micros);
        left.push(handed_off.usage.system_micros);
    }
    own.sort_unstable();
    left.sort_unstable();
    let (own_median, left_median) = (own[1], left[1]);
    assert!(own_median >= 2_000, "tearing 256 MiB down took {own:?} µs");
    assert!(
        left_median * 2 < own_median,
        "system CPU with the teardown left: {left:?} µs, done itself: {own:?} µs"
    );
}
