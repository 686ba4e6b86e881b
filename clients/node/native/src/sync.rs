//! `spawnSync`: the JavaScript thread waits, by the API's nature, while
//! the addon's tokio thread spawns, feeds stdin, reads the pipes and
//! waits for the exit. Other JavaScript threads (workers) and the
//! addon's asynchronous spawns are not held up.

use std::os::fd::OwnedFd;
use std::time::Duration;

use napi::bindgen_prelude::Buffer;
use napi_derive::napi;
use rustix::process::{Signal, pidfd_send_signal};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::plan::{self, SpawnSpec};
use crate::runtime::{applied_json, client, shared, who_failed};

/// What `spawnSync` returns to `lib/sync.js`.
#[napi(object)]
pub struct SyncResult {
    /// The child's pid, 0 when it did not start.
    pub pid: i32,
    /// The exit code, when it exited.
    pub status: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// What it wrote to a piped stdout.
    pub stdout: Option<Buffer>,
    /// What it wrote to a piped stderr.
    pub stderr: Option<Buffer>,
    /// The errno of a failure (0 if none).
    pub errno: i32,
    /// Who failed, as the asynchronous `Failed` event's `b`.
    pub who: i32,
    /// The failure's description.
    pub message: String,
    /// The timeout fired and the child was sent the kill signal.
    pub timed_out: bool,
    /// A pipe passed `max_buffer` and the child was sent the kill signal.
    pub overflowed: bool,
    /// What confined the child: the JSON of the zygote's `AppliedSandbox`,
    /// empty when nothing did.
    pub sandbox: String,
}

/// Limits of one `spawnSync`.
#[napi(object)]
pub struct SyncLimits {
    /// Milliseconds before the child is sent `kill_signal` (0: none).
    pub timeout_ms: u32,
    /// Bytes kept of stdout and of stderr each, before the child is sent
    /// `kill_signal`.
    pub max_buffer: f64,
    /// The signal for the timeout and the overflow.
    pub kill_signal: i32,
}

fn result(errno: i32, who: i32, message: String) -> SyncResult {
    SyncResult {
        pid: 0,
        status: None,
        signal: None,
        stdout: None,
        stderr: None,
        errno,
        who,
        message,
        timed_out: false,
        overflowed: false,
        sandbox: String::new(),
    }
}

fn stream(fd: Option<OwnedFd>) -> Option<UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd?);
    socket.set_nonblocking(true).ok()?;
    UnixStream::from_std(socket).ok()
}

/// Reads `from` to its end, keeping at most `limit` bytes; true when
/// there was more.
async fn read_capped(from: Option<UnixStream>, limit: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let Some(mut from) = from else {
        return (kept, false);
    };
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return (kept, false),
            Ok(n) if kept.len() + n > limit => {
                kept.extend_from_slice(&chunk[..limit - kept.len()]);
                return (kept, true);
            }
            Ok(n) => kept.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Spawns and waits, blocking the calling (JavaScript) thread.
///
/// # Errors
///
/// When a pipe cannot be made or an fd given is not open.
#[napi]
pub fn spawn_sync(
    spec: SpawnSpec,
    input: Option<Buffer>,
    limits: SyncLimits,
) -> napi::Result<SyncResult> {
    let (plan, parents) = plan::prepare(spec).map_err(crate::errno_error)?;
    let input = input.map(|bytes| bytes.to_vec());
    let run = async move {
        let client = match client(shared()).await {
            Ok(client) => client,
            Err(error) => return result(error.raw_os_error().unwrap_or(0), 0, error.to_string()),
        };
        let mut command = match plan.command(&client) {
            Ok(command) => command,
            Err(refused) => return result(refused.errno, 2, refused.message),
        };
        let spawned = command.spawn().await;
        drop(command);
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => {
                let who = who_failed(&error);
                return result(error.raw_os_error().unwrap_or(0), who, error.to_string());
            }
        };
        let mut parents = parents.into_iter().chain(std::iter::repeat_with(|| None));
        let (stdin, stdout, stderr) = (
            stream(parents.next().flatten()),
            stream(parents.next().flatten()),
            stream(parents.next().flatten()),
        );
        let sandbox = applied_json(&child);
        let limit = usize::try_from(limits.max_buffer as u64).unwrap_or(usize::MAX);
        let pidfd = child.pidfd().try_clone_to_owned().ok();
        let kill = || {
            if let (Some(pidfd), Some(signal)) =
                (&pidfd, Signal::from_named_raw(limits.kill_signal))
            {
                let _ = pidfd_send_signal(pidfd, signal);
            }
        };
        let feed = async move {
            if let Some(mut stdin) = stdin {
                if let Some(input) = input {
                    let _ = stdin.write_all(&input).await;
                }
                let _ = stdin.shutdown().await;
            }
        };
        let pipes =
            async { tokio::join!(feed, read_capped(stdout, limit), read_capped(stderr, limit)) };
        let timeout = async {
            if limits.timeout_ms == 0 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(u64::from(limits.timeout_ms))).await;
        };
        let mut timed_out = false;
        tokio::pin!(pipes, timeout);
        let ((), (out, out_over), (err, err_over)) = tokio::select! {
            done = &mut pipes => done,
            () = &mut timeout => {
                timed_out = true;
                kill();
                pipes.await
            }
        };
        let overflowed = out_over || err_over;
        if overflowed {
            kill();
        }
        let status = tokio::select! {
            status = child.wait() => status,
            () = &mut timeout, if !timed_out => {
                timed_out = true;
                kill();
                child.wait().await
            }
        };
        let mut done = result(0, 0, String::new());
        done.pid = i32::try_from(child.id()).unwrap_or(0);
        match status {
            Ok(status) => {
                done.status = status.code();
                done.signal = status.signal();
            }
            Err(error) => {
                done.errno = error.raw_os_error().unwrap_or(0);
                done.message = error.to_string();
            }
        }
        done.stdout = Some(out.into());
        done.stderr = Some(err.into());
        done.timed_out = timed_out;
        done.overflowed = overflowed;
        done.sandbox = sandbox;
        done
    };
    Ok(shared().runtime.block_on(run))
}
