//! Warm templates against a real daemon and a real CPython: a template's
//! start and its failures, children run as `python ARGS` would run them,
//! their hygiene (RNG, fds, signals), and every guarantee of a cold spawn
//! (timeout, kill-on-close, cgroup, the daemon as parent).

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use zygote_proto::{
    ClientMessage, Env, ExitNotice, ExitStatus, PYTHON_TEMPLATE, RequestFailed, ServerMessage,
    SpawnFailed, SpawnRequest, StdioSpec, TemplateReady, TemplateRequest, TemplateSpawnRequest,
};

use crate::deferred::{connect, receive, send};
use crate::util::{Daemon, skip, start_daemon};

/// A CPython to test with: pyenv's 3.12 when there, else `python3` on
/// `PATH`; `None` (the test skips) without either.
fn python() -> Option<PathBuf> {
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
    let id = request.id;
    let request = SpawnRequest {
        stdout: StdioSpec::Pipe,
        stderr: StdioSpec::Pipe,
        ..request
    };
    send(
        fd,
        &ClientMessage::SpawnFromTemplate(TemplateSpawnRequest {
            template: handle,
            spawn: request,
        }),
    );
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
}

fn warm_setup(test: &str, preload: &[&str]) -> Option<Warm> {
    let python = python_or_skip()?;
    let daemon = start_daemon(test);
    let fd = connect(daemon.socket());
    let ready = template(&fd, 1, &python, preload, base_env())
        .unwrap_or_else(|failed| panic!("template failed: {failed:?}\n{}", daemon.log()));
    assert!(!ready.reused);
    Some(Warm {
        daemon,
        fd,
        handle: ready.template,
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
