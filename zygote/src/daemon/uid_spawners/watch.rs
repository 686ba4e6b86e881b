//! The task that watches one spawner process: it reads the answers and
//! hands each to the spawn that asked, kills a child stalled past the
//! deadline or no longer wanted, retires the spawner when idle, and, when
//! it ends, fails the questions left and reaps it.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracing::info;
use zygote_proto::RECV_BUFFER_BYTES;

use super::wire::Answer;
use super::{
    ANSWER_DEADLINE, IDLE_EXIT, MAX_SPAWNERS, Outcome, Question, Registry, STALLED_AFTER,
    UidSpawner,
};
use crate::service::metrics::Metrics;
use crate::spawn::{self, SandboxFailure, SpawnError};

/// A spawner and what its watching task needs.
pub(super) struct Watched {
    spawner: Arc<UidSpawner>,
    pidfd: AsyncFd<OwnedFd>,
    registry: Weak<Mutex<Registry>>,
    metrics: Metrics,
}

/// Why a spawner's watch ended.
enum End {
    /// Idle, or the daemon is gone: it was asked to exit.
    Retired,
    /// It exited unasked, or broke the protocol.
    Crashed(String),
}

/// How long a retired spawner may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

impl Watched {
    /// The watch of `spawner`, whose pidfd is `pidfd`, listed in `registry`.
    pub(super) fn new(
        spawner: Arc<UidSpawner>,
        pidfd: AsyncFd<OwnedFd>,
        registry: Weak<Mutex<Registry>>,
        metrics: Metrics,
    ) -> Self {
        Self {
            spawner,
            pidfd,
            registry,
            metrics,
        }
    }

    /// Answers the spawner's questions until it retires or crashes; then
    /// fails what is left, and reaps it.
    pub(super) async fn serve(self) {
        let end = self.run().await;
        self.retire();
        let uid = self.spawner.uid;
        let pid = self.spawner.pid;
        let message = match &end {
            End::Retired => format!("the spawner process of uid {uid} stopped"),
            End::Crashed(why) => format!("the spawner process of uid {uid} failed: {why}"),
        };
        let left: Vec<Question> = self.spawner.lock().queue.drain(..).collect();
        let in_flight = left.len();
        for question in left {
            // A child still before exec is nobody's now: it goes.
            for pidfd in &question.stalled {
                let _ = spawn::send_signal(pidfd.as_fd(), libc::SIGKILL);
            }
            let _ = question.answer.send(Outcome::Lost {
                errno: if matches!(end, End::Retired) {
                    libc::ECANCELED
                } else {
                    libc::EIO
                },
                message: message.clone(),
            });
        }
        // It exits at the end of its socket, once its child (if any) has
        // exec'd or died: a child stopped before exec is killed.
        let _ = rustix::net::shutdown(self.spawner.socket.as_fd(), rustix::net::Shutdown::Both);
        spawn::kill_pre_exec_children(pid);
        let status = self.reap().await;
        match end {
            End::Retired => info!(uid, pid, status, "spawner process stopped"),
            End::Crashed(why) => {
                info!(
                    uid,
                    pid,
                    status,
                    reason = why,
                    in_flight,
                    "spawner process failed; its spawns in flight fail, and the uid's next \
                     spawn starts a new one"
                );
                if let Some(registry) = self.registry.upgrade() {
                    let mut registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
                    if registry.crashes.len() >= MAX_SPAWNERS * 16 {
                        registry.crashes.clear();
                    }
                    let crashes = registry.crashes.entry(uid).or_insert((0, Instant::now()));
                    *crashes = (crashes.0 + 1, Instant::now());
                }
            }
        }
    }

    async fn run(&self) -> End {
        let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
        loop {
            let wake = self.next_check();
            tokio::select! {
                biased;
                received = self.spawner.socket.recv_in(&mut scratch) => match received {
                    Ok(Some(received)) => {
                        if let Err(why) = self.answered(&scratch[..received.len], received.fds) {
                            return End::Crashed(why);
                        }
                    }
                    Ok(None) => return self.ended("it closed its socket"),
                    Err(error) => return self.ended(&error.to_string()),
                },
                _ = self.pidfd.readable() => return self.ended("it exited"),
                () = self.spawner.asked.notified() => {}
                () = tokio::time::sleep_until(wake.into()) => {
                    if let Some(end) = self.check() {
                        return end;
                    }
                }
            }
        }
    }

    /// The spawner left: as asked ([`UidSpawners::stop_all`]), or not.
    fn ended(&self, why: &str) -> End {
        if self.spawner.lock().retired {
            End::Retired
        } else {
            End::Crashed(why.to_owned())
        }
    }

    /// When [`Watched::check`] has something to do next.
    fn next_check(&self) -> Instant {
        let questions = self.spawner.lock();
        match questions.queue.front() {
            Some(oldest) if oldest.killed => oldest.asked + ANSWER_DEADLINE * 2,
            Some(oldest) if oldest.answer.is_closed() => oldest.asked + STALLED_AFTER,
            // Looked at again for a closed answer meanwhile.
            Some(oldest) => (oldest.asked + ANSWER_DEADLINE).min(Instant::now() + STALLED_AFTER),
            None if questions.retired => Instant::now(),
            None => questions.last_answer + IDLE_EXIT,
        }
    }

    /// Kills the child the spawner waits for when its spawn is past the
    /// deadline, or no longer wanted; retires a spawner idle too long, or
    /// gives up on one that does not answer even then.
    fn check(&self) -> Option<End> {
        let mut questions = self.spawner.lock();
        let Some(oldest) = questions.queue.front_mut() else {
            if questions.retired || questions.last_answer.elapsed() >= IDLE_EXIT {
                questions.retired = true;
                return Some(End::Retired);
            }
            return None;
        };
        let waited = oldest.asked.elapsed();
        if oldest.killed {
            return (waited >= ANSWER_DEADLINE * 2).then(|| {
                End::Crashed(format!(
                    "no answer in {} s",
                    (ANSWER_DEADLINE * 2).as_secs()
                ))
            });
        }
        if waited >= STALLED_AFTER && oldest.stalled.is_empty() {
            oldest.stalled = spawn::pre_exec_children(self.spawner.pid);
        }
        let unwanted = oldest.answer.is_closed() && waited >= STALLED_AFTER;
        if waited >= ANSWER_DEADLINE || unwanted {
            oldest.killed = true;
            drop(questions);
            let killed = spawn::kill_pre_exec_children(self.spawner.pid);
            tracing::debug!(
                uid = self.spawner.uid,
                killed,
                unwanted,
                "killed a child that had not exec'd"
            );
        }
        None
    }

    /// One answer, to the oldest question.
    fn answered(&self, bytes: &[u8], fds: Vec<OwnedFd>) -> Result<(), String> {
        let answer: Answer =
            zygote_proto::decode(bytes).map_err(|error| format!("a malformed answer: {error}"))?;
        let question = {
            let mut questions = self.spawner.lock();
            questions.last_answer = Instant::now();
            questions.queue.pop_front()
        };
        let question = question.ok_or("an answer to no question")?;
        let (pid, failure) = match answer {
            Answer::Refused { stage, errno } => {
                let outcome = Outcome::Refused(SpawnError::new(stage, errno));
                if self.spawner.landlock.is_some() && outcome.is_made_ahead_unusable() {
                    // Its Landlock domain names a file replaced since: no
                    // new plan comes; those sent already get this answer.
                    self.retire();
                }
                let _ = question.answer.send(outcome);
                return Ok(());
            }
            Answer::Started { pid, failure } => (pid, failure),
            Answer::Parked { pid } => return self.parked(question, pid, fds),
        };
        let pidfd = fds.into_iter().next().ok_or("a child without its pidfd")?;
        // Listed before the question (and its expectation) goes. Not one
        // that failed before exec: its exit tells nothing, and the orphan
        // reaper may already have taken it (a failure before the switch
        // to the uid it was expected under), which would leave its pid
        // listed as ours.
        if failure.is_none() {
            spawn::adopt_own(pid);
        }
        self.spawner.spawns.fetch_add(1, Ordering::Relaxed);
        let outcome = if question.killed {
            reap_in_background(pidfd);
            Outcome::Lost {
                errno: libc::ETIMEDOUT,
                message: format!(
                    "killed before exec: it was stopped or stuck for {} s, or its client left",
                    ANSWER_DEADLINE.as_secs()
                ),
            }
        } else {
            Outcome::Child {
                pid,
                pidfd,
                failure: failure.map(|(stage, errno, step)| SpawnError {
                    stage,
                    errno,
                    sandbox: SandboxFailure::unpack(step),
                }),
            }
        };
        // Nobody waits any more (its client left): the child goes.
        if let Err(outcome) = question.answer.send(outcome) {
            discard(outcome);
        }
        Ok(())
    }

    /// A parked init the spawner forked, its fds attached: listed as our
    /// own before the question (and its expectation) goes.
    fn parked(&self, question: Question, pid: i32, fds: Vec<OwnedFd>) -> Result<(), String> {
        let [pidfd, status, release] = <[OwnedFd; 3]>::try_from(fds)
            .map_err(|fds| format!("a parked init with {} fds, not 3", fds.len()))?;
        spawn::adopt_own(pid);
        let init = spawn::ParkedInit {
            pid,
            pidfd,
            status,
            release,
        };
        if question.killed {
            let _ = spawn::send_signal(init.pidfd.as_fd(), libc::SIGKILL);
            reap_in_background(init.pidfd);
            return Ok(());
        }
        // Nobody waits any more: the init goes.
        if let Err(outcome) = question.answer.send(Outcome::Parked(init)) {
            discard(outcome);
        }
        Ok(())
    }

    /// Takes this spawner out of the registry: no question comes any more.
    fn retire(&self) {
        self.spawner.lock().retired = true;
        if let Some(registry) = self.registry.upgrade() {
            let mut registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
            let ours = registry
                .running
                .get(&self.spawner.key())
                .is_some_and(|running| Arc::ptr_eq(running, &self.spawner));
            if ours {
                registry.running.remove(&self.spawner.key());
            }
            self.metrics.set_uid_spawners(registry.running.len());
        }
    }

    /// Waits for the spawner's exit (killing it past [`EXIT_GRACE`]) and
    /// reaps it: how it ended, for the log.
    async fn reap(&self) -> String {
        let exited = tokio::time::timeout(EXIT_GRACE, self.pidfd.readable()).await;
        if exited.is_err() {
            let _ = spawn::send_signal(self.pidfd.get_ref().as_fd(), libc::SIGKILL);
        }
        match wait_exit(&self.pidfd).await {
            Ok(status) => format!("{status:?}"),
            Err(error) => format!("not reaped: {error}"),
        }
    }
}

/// Waits for the exit of the child behind `pidfd` and reaps it.
async fn wait_exit(pidfd: &AsyncFd<OwnedFd>) -> std::io::Result<zygote_proto::ExitStatus> {
    loop {
        let mut guard = pidfd.readable().await?;
        match spawn::try_reap(pidfd.get_ref().as_fd())? {
            Some((status, _)) => return Ok(status),
            None => guard.clear_ready(),
        }
    }
}

/// Kills and reaps the child or parked init of an answer nobody takes.
pub(super) fn discard(outcome: Outcome) {
    let pidfd = match outcome {
        Outcome::Child { pidfd, .. } => pidfd,
        Outcome::Parked(init) => init.pidfd,
        Outcome::Refused(_) | Outcome::Lost { .. } => return,
    };
    let _ = spawn::send_signal(pidfd.as_fd(), libc::SIGKILL);
    reap_in_background(pidfd);
}

/// Reaps a child nobody waits for once it exits.
fn reap_in_background(pidfd: OwnedFd) {
    // Only a daemon that is exiting has no runtime left to do it.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Ok(pidfd) = zygote_proto::register(pidfd, Interest::READABLE) else {
        return;
    };
    runtime.spawn(async move {
        let _ = wait_exit(&pidfd).await;
    });
}
