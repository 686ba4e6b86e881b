//! A warm spawn on the spawn task's path: the request's checks, and the
//! launch that asks the template for the child in place of a clone. What
//! comes after (tracking, `Spawned`, the watch to `Exited`) is a cold
//! spawn's.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use serde::Serialize;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracing::debug;
use zygote_proto::{AsyncSeqpacket, ResourceLimit, SpawnFailed, SpawnRequest, SpawnStage};

use super::process::{Answer, Process};
use super::{ANSWER_DEADLINE, Failure, Template};
use crate::daemon::cgroup::ChildCgroup;
use crate::daemon::lifetime::{Connection, SpawnTask};
use crate::daemon::reaper;
use crate::daemon::state::Daemon;
use crate::spawn::{self, SpawnPlan};

/// A child's plan as the runner reads it (JSON). Bytes travel as
/// Latin-1 strings: one char per byte, exact both ways.
#[derive(Serialize)]
struct Plan {
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    targets: Vec<i32>,
    new_session: bool,
    controlling_terminal: bool,
    process_group: Option<i32>,
    umask: Option<u32>,
    rlimits: Vec<(u32, u64, u64)>,
    ignored_signals: u64,
    nice: Option<i32>,
    cpu_affinity: Vec<u64>,
    oom_score_adj: Option<i32>,
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&byte| char::from(byte)).collect()
}

fn refused(id: u64, stage: SpawnStage, failure: Failure) -> SpawnFailed {
    SpawnFailed {
        id,
        stage,
        errno: failure.errno,
        message: failure.message,
    }
}

/// Checks a spawn from template `handle` before admission: the template
/// is the peer's, and the request is one a warm child can honour. Sets
/// the request's program to the template's interpreter (the child's
/// `argv[0]` in the plan).
pub(crate) fn check_spawn(
    daemon: &Daemon,
    connection: &Connection,
    handle: u64,
    request: &mut SpawnRequest,
) -> Result<Arc<Template>, SpawnFailed> {
    let id = request.id;
    let invalid = |errno, message: &str| {
        Err(refused(
            id,
            SpawnStage::Validate,
            Failure::new(errno, message),
        ))
    };
    let template = daemon
        .templates
        .get(handle, connection.peer.uid)
        .map_err(|failure| refused(id, SpawnStage::Validate, failure))?;
    if !request.program.is_empty() {
        return invalid(
            libc::EINVAL,
            "a spawn from a template takes no program: its args are what would follow the \
             interpreter",
        );
    }
    if request.user.is_some() || request.sandbox.is_some() || request.argv0.is_some() {
        return invalid(
            libc::EOPNOTSUPP,
            "a warm child cannot switch user, be sandboxed or take an argv0: use a cold spawn",
        );
    }
    if connection.grant.sandbox_profile().is_some() {
        return invalid(
            libc::EOPNOTSUPP,
            "the policy confines this peer's children in a sandbox, and templates cannot be \
             confined",
        );
    }
    if request.large_args.is_none() {
        check_args(&request.args).map_err(|message| {
            refused(
                id,
                SpawnStage::Validate,
                Failure::new(libc::EINVAL, message),
            )
        })?;
    }
    request.program = template.interpreter().to_vec();
    Ok(template)
}

/// `-c CODE ...`, `-m MODULE ...`, or `SCRIPT ...`.
fn check_args(args: &[Vec<u8>]) -> Result<(), &'static str> {
    match args.first().map(Vec::as_slice) {
        Some(b"-c" | b"-m") if args.len() >= 2 => Ok(()),
        Some(b"-c") => Err("-c needs the code to run"),
        Some(b"-m") => Err("-m needs the module to run"),
        Some(script) if !script.is_empty() && !script.starts_with(b"-") => Ok(()),
        Some(_) => Err(
            "the args must begin with -c CODE, -m MODULE, or a script path (not starting with -)",
        ),
        None => Err("no args: give -c CODE, -m MODULE, or a script path"),
    }
}

/// The child's plan, as JSON, and the fds that go with it: the child's
/// end of its report socket, then the plan's sources in order.
fn encode<'a>(
    plan: &'a SpawnPlan,
    report: BorrowedFd<'a>,
) -> Result<(Vec<u8>, Vec<BorrowedFd<'a>>), Failure> {
    let args: Vec<&[u8]> = plan.argv.iter().skip(1).map(|arg| arg.to_bytes()).collect();
    check_args(&args.iter().map(|arg| arg.to_vec()).collect::<Vec<_>>())
        .map_err(|message| Failure::new(libc::EINVAL, message))?;
    let out = Plan {
        args: args.iter().map(|arg| latin1(arg)).collect(),
        env: plan
            .envp
            .iter()
            .map(|(key, value)| (latin1(key), latin1(value)))
            .collect(),
        cwd: plan.cwd.as_ref().map(|cwd| latin1(cwd.to_bytes())),
        targets: plan.fds.iter().map(|(_, target)| *target).collect(),
        new_session: plan.new_session,
        controlling_terminal: plan.controlling_terminal,
        process_group: plan.process_group,
        umask: plan.umask,
        rlimits: plan
            .rlimits
            .iter()
            .map(
                |ResourceLimit {
                     resource,
                     soft,
                     hard,
                 }| (*resource, *soft, *hard),
            )
            .collect(),
        ignored_signals: plan.ignored_signals,
        nice: plan.nice,
        cpu_affinity: plan.cpu_affinity.clone(),
        oom_score_adj: plan.oom_score_adj,
    };
    let bytes =
        serde_json::to_vec(&out).map_err(|error| Failure::new(libc::EIO, error.to_string()))?;
    if bytes.len() > zygote_proto::MAX_FRAME_BYTES {
        return Err(Failure::new(
            libc::E2BIG,
            format!(
                "the child's args and environment take {} bytes as the template reads them; a \
                 warm spawn takes at most {}",
                bytes.len(),
                zygote_proto::MAX_FRAME_BYTES
            ),
        ));
    }
    let mut fds = Vec::with_capacity(1 + plan.fds.len());
    fds.push(report);
    fds.extend(plan.fds.iter().map(|(source, _)| source.as_fd()));
    if fds.len() > zygote_proto::MAX_FDS_PER_FRAME {
        return Err(Failure::new(
            libc::EMFILE,
            format!(
                "a warm child takes at most {} fds",
                zygote_proto::MAX_FDS_PER_FRAME - 1
            ),
        ));
    }
    Ok((bytes, fds))
}

/// What the child said on its report socket.
enum Report {
    Ok,
    Failed(SpawnStage, i32, String),
    /// It ended, or said nothing understandable.
    Gone,
}

fn stage_named(name: &str) -> SpawnStage {
    SpawnStage::ALL
        .into_iter()
        .find(|stage| stage.name() == name)
        .unwrap_or(SpawnStage::Template)
}

async fn read_report(report: &AsyncSeqpacket) -> Report {
    let mut scratch = vec![0u8; zygote_proto::RECV_BUFFER_BYTES];
    let mut received = report.recv_in(&mut scratch).await;
    if received.is_err() {
        // A child that failed a step exits without reading the "go" sent
        // meanwhile, and a socket closed with unread data leaves its peer
        // an error (ECONNRESET) that the first read returns ahead of the
        // report still queued: the second read has the report.
        received = report.recv_in(&mut scratch).await;
    }
    let Ok(Some(received)) = received else {
        return Report::Gone;
    };
    let said: Result<serde_json::Value, _> = serde_json::from_slice(&scratch[..received.len]);
    match said {
        Ok(serde_json::Value::Array(words)) => match words.as_slice() {
            [serde_json::Value::String(ok)] if ok == "ok" => Report::Ok,
            [stage, errno, message] => Report::Failed(
                stage_named(stage.as_str().unwrap_or("template")),
                errno
                    .as_i64()
                    .and_then(|errno| i32::try_from(errno).ok())
                    .unwrap_or(libc::EIO),
                message.as_str().unwrap_or("").to_owned(),
            ),
            _ => Report::Gone,
        },
        _ => Report::Gone,
    }
}

impl SpawnTask {
    /// Has `template` fork the child as `plan` says, and waits until the
    /// child has set itself up: its pid and watched pidfd. The child is
    /// the daemon's own from then on.
    pub(crate) async fn launch_warm(
        &self,
        template: &Arc<Template>,
        id: u64,
        mut plan: SpawnPlan,
        cgroup: Option<&ChildCgroup>,
    ) -> Result<Option<(i32, Arc<AsyncFd<OwnedFd>>)>, SpawnFailed> {
        let remove_cgroup = || {
            if let Some(cgroup) = cgroup {
                let _ = cgroup.remove();
            }
        };
        let failed = |stage, failure| {
            remove_cgroup();
            refused(id, stage, failure)
        };
        let (process, _) = template
            .ensure(&self.daemon)
            .await
            .map_err(|failure| failed(SpawnStage::Template, failure))?;
        let (ours, theirs) = zygote_proto::socket::pair(false).map_err(|error| {
            failed(
                SpawnStage::Pipe,
                Failure::new(libc::EMFILE, error.to_string()),
            )
        })?;
        let report = AsyncSeqpacket::new(ours).map_err(|error| {
            failed(SpawnStage::Pipe, Failure::new(libc::EIO, error.to_string()))
        })?;
        let cgroup_dir = plan.cgroup.take();
        // Expected from before the child can exist until it is listed.
        let expected = spawn::expect_sibling(process.uid);
        let asked = {
            let (bytes, fds) = encode(&plan, theirs.as_fd())
                .map_err(|failure| failed(SpawnStage::Validate, failure))?;
            process.ask(&bytes, &fds)
        };
        // The daemon's copies of the child's fds.
        drop(plan);
        drop(theirs);
        let answer = asked.map_err(|failure| failed(SpawnStage::Template, failure))?;
        let answer = match tokio::time::timeout(ANSWER_DEADLINE, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Answer::Lost(Failure::new(
                libc::EPROTO,
                "the template's process went away",
            )),
            Err(_) => Answer::Lost(Failure::new(
                libc::ETIMEDOUT,
                format!(
                    "the template did not answer in {} s",
                    ANSWER_DEADLINE.as_secs()
                ),
            )),
        };
        let pid = match answer {
            Answer::Child(pid) => pid,
            Answer::Errno(errno) => {
                let message = format!("the template's clone failed: {}", crate::strerror(errno));
                return Err(failed(SpawnStage::Clone, Failure::new(errno, message)));
            }
            Answer::Lost(failure) => return Err(failed(SpawnStage::Template, failure)),
        };
        let pidfd = spawn::claim_sibling(pid, process.uid).map_err(|error| {
            let message =
                format!("the template named pid {pid}, which is not a child it forked: {error}");
            failed(SpawnStage::Template, Failure::new(libc::EPROTO, message))
        })?;
        drop(expected);
        process.forked();
        self.daemon.metrics.template_forked();
        let pidfd = match zygote_proto::register(pidfd, Interest::READABLE) {
            Ok(pidfd) => Arc::new(pidfd),
            Err(error) => {
                tracing::warn!(pid, %error, "failed to watch a warm child's pidfd; it will not be reaped");
                self.connection.forget_id(id);
                return Ok(None);
            }
        };
        match self
            .release_child(&process, pid, &report, cgroup_dir.as_ref())
            .await
        {
            Ok(()) => Ok(Some((pid, pidfd))),
            Err(failure) => {
                let _ = spawn::send_signal(pidfd.get_ref().as_fd(), libc::SIGKILL);
                if let Err(error) = reaper::wait_exit(&pidfd).await {
                    debug!(pid, %error, "failed to reap a warm child that did not start");
                }
                remove_cgroup();
                Err(refused(id, failure.0, failure.1))
            }
        }
    }

    /// Moves the child into its cgroup and tells it to go on, then waits
    /// for its setup report: the stage that failed, if one did. The "go"
    /// is sent first so that it is waiting in the socket when the child,
    /// set up, reads it: the child's setup and the daemon's steps overlap.
    async fn release_child(
        &self,
        process: &Process,
        pid: i32,
        report: &AsyncSeqpacket,
        cgroup_dir: Option<&OwnedFd>,
    ) -> Result<(), (SpawnStage, Failure)> {
        // In its cgroup before any code of the program runs.
        if let Some(dir) = cgroup_dir {
            spawn::join_cgroup(dir.as_fd(), pid).map_err(|error| {
                let errno = error.raw_os_error().unwrap_or(libc::EIO);
                let message = format!("cannot move the warm child into its cgroup: {error}");
                (SpawnStage::Cgroup, Failure::new(errno, message))
            })?;
        }
        // A child that failed a step has said so and gone: its report,
        // still readable, says more than the failed send.
        let went = zygote_proto::send_frame(report.as_fd(), b"go", &[]).err();
        let said = tokio::select! {
            said = tokio::time::timeout(ANSWER_DEADLINE, read_report(report)) => said,
            () = self.cancelled() => {
                return Err((SpawnStage::Exec, Failure::new(
                    libc::ECANCELED,
                    "killed as it started: its client left, or the zygote is stopping",
                )));
            }
        };
        match said {
            Ok(Report::Ok) => match went {
                None => Ok(()),
                Some(error) => {
                    let message = format!("the warm child went away before it started: {error}");
                    Err((SpawnStage::Template, Failure::new(libc::EPROTO, message)))
                }
            },
            Ok(Report::Failed(stage, errno, message)) => Err((stage, Failure::new(errno, message))),
            Ok(Report::Gone) => {
                let message = format!(
                    "the warm child of template process {} ended before it was set up",
                    process.pid
                );
                Err((SpawnStage::Template, Failure::new(libc::EPROTO, message)))
            }
            Err(_) => {
                let message = format!(
                    "the warm child did not set itself up in {} s",
                    ANSWER_DEADLINE.as_secs()
                );
                Err((SpawnStage::Template, Failure::new(libc::ETIMEDOUT, message)))
            }
        }
    }
}
