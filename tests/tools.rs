//! The harness for tests that drive real outside tools (systemd's,
//! Prometheus's) and daemons started in unusual ways.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Whether `tool` is on `PATH`. When it is not, the test is skipped
/// ([`crate::util::skip_unless_ci`]): under CI `scripts/test` has
/// installed it, and its absence is a failure.
pub fn have_tool(tool: &str, package: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
    if !found {
        crate::util::skip_unless_ci(&format!(
            "`{tool}` is not installed (Debian package `{package}`; scripts/test installs it)"
        ));
    }
    found
}

/// A loopback port that was free a moment ago. The tools under test take
/// a port number, not a socket, so a small race remains.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// `GET path` over HTTP/1.1 on loopback; returns the status code and body.
pub fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no header end in {response:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok((status, body.to_owned()))
}

/// A process started by a test; SIGKILLed and reaped on drop unless the
/// test already waited for it.
pub struct Process {
    child: Child,
    what: String,
}

impl Process {
    /// Starts `command`, described as `what` in failures.
    pub fn start(command: &mut Command, what: &str) -> Self {
        let child = command
            .spawn()
            .unwrap_or_else(|error| panic!("start {what}: {error}"));
        Self {
            child,
            what: what.to_owned(),
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: i32) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).expect("pid");
        let signal = rustix::process::Signal::from_named_raw(signal).expect("signal");
        rustix::process::kill_process(pid, signal).expect("kill");
    }

    /// Waits up to `timeout` for it to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `timeout` for it to exit; panics if it does not.
    pub fn expect_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.wait_timeout(timeout)
            .unwrap_or_else(|| panic!("{} did not exit within {timeout:?}", self.what))
    }

    /// Its stderr, once it has exited (requires `Stdio::piped()`).
    pub fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = stderr.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `zygote serve --socket DIR/zygote.sock` with extra `args` and
/// `env`, stdin null and stderr piped, and waits until it accepts.
pub fn serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Process, PathBuf) {
    let socket = dir.join("zygote.sock");
    let mut command = Command::new(crate::util::zygote_bin());
    command
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .args(args)
        .env("ZYGOTE_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let process = Process::start(&mut command, "zygote serve");
    let ready = crate::util::eventually(Duration::from_secs(10), || {
        zygote_proto::socket::connect_to(&socket, false).is_ok()
    });
    assert!(ready, "zygote did not listen on {}", socket.display());
    (process, socket)
}

/// A temp dir named for the test.
pub fn temp_dir(test_name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("zygote-{test_name}-"))
        .tempdir()
        .expect("tempdir")
}
