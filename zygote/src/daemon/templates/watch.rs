//! The task that watches one template process: it hands each answer to
//! the spawn that asked, gives up on a template that does not answer in
//! time, stops an idle one, and when the process ends fails the questions
//! left, reaps it and removes its cgroup.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::io::unix::AsyncFd;
use tracing::info;
use zygote_proto::RECV_BUFFER_BYTES;

use super::process::{Answer, Process};
use super::{ANSWER_DEADLINE, Failure, Registry, Template, remove_idle};
use crate::daemon::state::Daemon;
use crate::daemon::{lifetime, reaper};
use crate::spawn;

/// How long a retired template may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// A template's answer to one fork.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Said {
    Pid(i32),
    Errno(i32),
}

/// Why a watch ended.
enum End {
    /// Asked to end: recycled, idle, or its owner left.
    Retired,
    /// It exited unasked, or broke the protocol, or stopped answering.
    Crashed(String),
}

/// One template process and what its watch needs.
pub(super) struct Watch {
    process: Arc<Process>,
    pidfd: AsyncFd<OwnedFd>,
    template: Weak<Template>,
    registry: Weak<Mutex<Registry>>,
    daemon: Arc<Daemon>,
}

impl Watch {
    pub(super) fn new(
        process: Arc<Process>,
        pidfd: AsyncFd<OwnedFd>,
        template: &Arc<Template>,
        daemon: &Arc<Daemon>,
    ) -> Self {
        Self {
            process,
            pidfd,
            template: Arc::downgrade(template),
            registry: daemon.templates.weak(),
            daemon: Arc::clone(daemon),
        }
    }

    /// Watches in a task of its own.
    pub(super) fn run(self) {
        tokio::spawn(self.serve());
    }

    async fn serve(self) {
        let end = self.watch().await;
        self.process
            .ended
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let left: Vec<_> = {
            let mut queue = self
                .process
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            queue.asked.drain(..).collect()
        };
        let in_flight = left.len();
        let why = match &end {
            End::Retired => "the template's process was stopped".to_owned(),
            End::Crashed(why) => format!("the template's process failed: {why}"),
        };
        for (_, answer) in left {
            let _ = answer.send(Answer::Lost(Failure::new(libc::EPROTO, why.clone())));
        }
        let kill = || spawn::send_signal(self.pidfd.get_ref().as_fd(), libc::SIGKILL);
        // One that crashed or stopped answering goes at once; a retired
        // one has a grace to finish.
        let crashed = matches!(end, End::Crashed(_));
        if crashed
            || tokio::time::timeout(EXIT_GRACE, self.pidfd.readable())
                .await
                .is_err()
        {
            let _ = kill();
        }
        let status = match reaper::wait_exit(&self.pidfd).await {
            Ok((status, _)) => format!("{status:?}"),
            Err(error) => format!("not reaped: {error}"),
        };
        self.log_end(end, &status, in_flight);
        if let Some(cgroup) = &self.process.cgroup {
            lifetime::remove_when_empty(&self.daemon, Arc::clone(cgroup));
        }
    }

    /// Counts and logs how the template ended, at most a few lines per
    /// uid and window: a peer's templates must not flood the log.
    fn log_end(&self, end: End, status: &str, in_flight: usize) {
        let (pid, uid) = (self.process.pid, self.process.uid);
        let template = self
            .template
            .upgrade()
            .map_or(0, |template| template.handle);
        if matches!(end, End::Crashed(_)) {
            self.daemon.metrics.template_exited_unasked();
        }
        let Some(suppressed) = self.daemon.log_limit.allow(uid) else {
            return;
        };
        match end {
            End::Retired => info!(template, uid, pid, status, suppressed, "template stopped"),
            End::Crashed(why) => info!(
                template,
                uid,
                pid,
                status,
                reason = why,
                in_flight,
                suppressed,
                "template ended unasked; its spawns in flight fail, and the next request starts \
                 it again"
            ),
        }
    }

    async fn watch(&self) -> End {
        let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
        let mut idle_stopped = false;
        loop {
            let wake = self.next_check();
            tokio::select! {
                biased;
                received = self.process.socket.recv_in(&mut scratch) => match received {
                    Ok(Some(received)) => {
                        if let Err(why) = self.answered(&scratch[..received.len]) {
                            return End::Crashed(why);
                        }
                    }
                    Ok(None) => return self.ended("it closed its socket"),
                    Err(error) => return self.ended(&error.to_string()),
                },
                _ = self.pidfd.readable() => return self.ended("it exited"),
                () = self.process.wake.notified() => {}
                () = tokio::time::sleep_until(wake.into()), if !idle_stopped => {
                    match self.check() {
                        Some(End::Retired) => idle_stopped = true,
                        Some(end) => return end,
                        None => {}
                    }
                }
            }
        }
    }

    fn ended(&self, why: &str) -> End {
        if self.process.retired() {
            End::Retired
        } else {
            End::Crashed(why.to_owned())
        }
    }

    /// When [`Watch::check`] has something to do next.
    fn next_check(&self) -> Instant {
        let queue = self
            .process
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match queue.asked.front() {
            Some((asked, _)) => *asked + ANSWER_DEADLINE,
            None => {
                *self
                    .process
                    .last_used
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    + self.daemon.templates.settings().idle_stop
            }
        }
    }

    /// Gives up on a template past the answer deadline; stops one idle
    /// too long (`Retired`: it ends once its socket does).
    fn check(&self) -> Option<End> {
        let queue = self
            .process
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((asked, _)) = queue.asked.front() {
            return (asked.elapsed() >= ANSWER_DEADLINE)
                .then(|| End::Crashed(format!("no answer in {} s", ANSWER_DEADLINE.as_secs())));
        }
        drop(queue);
        let last = *self
            .process
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let idle_stop = self.daemon.templates.settings().idle_stop;
        if last.elapsed() < idle_stop {
            return None;
        }
        if let Some(template) = self.template.upgrade() {
            info!(
                template = template.handle,
                uid = self.process.uid,
                idle_ms = idle_stop.as_millis() as u64,
                "stopping an idle template"
            );
            remove_idle(&self.registry, &template);
        }
        self.process.retire();
        Some(End::Retired)
    }

    /// One answer, to the oldest question.
    fn answered(&self, bytes: &[u8]) -> Result<(), String> {
        let said: Said = serde_json::from_slice(bytes)
            .map_err(|error| format!("a malformed answer: {error}"))?;
        let question = self
            .process
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .asked
            .pop_front();
        let (_, answer) = question.ok_or("an answer to no question")?;
        let _ = answer.send(match said {
            Said::Pid(pid) => Answer::Child(pid),
            Said::Errno(errno) => Answer::Errno(errno),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::IDLE_STOP;
    use super::*;
    use zygote_proto::{Env, PYTHON_TEMPLATE, TemplateRequest};

    #[tokio::test]
    async fn an_idle_template_is_stopped_and_its_handle_forgotten() {
        let Some(idle_since) = Instant::now().checked_sub(IDLE_STOP) else {
            return;
        };
        let daemon = Arc::new(Daemon::new());
        let (peer, grant) = super::super::tests::own_peer();
        let request = TemplateRequest {
            id: 1,
            kind: PYTHON_TEMPLATE.into(),
            interpreter: b"python3".to_vec(),
            preload: Vec::new(),
            env: Env::new(),
            cwd: None,
        };
        let template = daemon
            .templates
            .find_or_add(&peer, &grant, request)
            .expect("added");
        let (ours, _theirs) = zygote_proto::socket::pair(false).expect("socketpair");
        let process = Arc::new(Process::for_tests(ours, Instant::now(), 0));
        template.lock().process = Some(Arc::clone(&process));
        // Stands in for the pidfd, which the check does not use.
        let (placeholder, _other) = zygote_proto::socket::pair(true).expect("socketpair");
        let placeholder =
            zygote_proto::register(placeholder, tokio::io::Interest::READABLE).expect("register");
        let watch = Watch::new(Arc::clone(&process), placeholder, &template, &daemon);
        assert!(watch.check().is_none(), "just used: kept");
        *process.last_used.lock().unwrap() = idle_since;
        assert!(matches!(watch.check(), Some(End::Retired)));
        assert!(process.retired(), "its process is asked to end");
        let gone = daemon.templates.get(template.handle, peer.uid);
        assert_eq!(gone.err().map(|failure| failure.errno), Some(libc::ENOENT));
    }
}
