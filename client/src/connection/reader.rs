//! The reader task: the only receiver on the socket. It hands each reply
//! to the request waiting for it, and each exit notice to its child's slot.

use std::os::fd::AsFd;
use std::sync::{Arc, MutexGuard};

use tokio::sync::{oneshot, watch};
use zygote_proto::{Frame, ProtoError, ServerMessage, decode_server};

use super::{Connection, ExitState, ExitWatch, Pending, SpawnReply, State};

impl Connection {
    /// Hands one frame from the zygote to whoever waits for it.
    ///
    /// # Errors
    ///
    /// A reason to end the connection: an undecodable frame, a reply of the
    /// wrong kind, or the zygote's `ProtocolError`.
    fn dispatch(&self, frame: Frame) -> std::result::Result<(), String> {
        let message = decode_server(&frame.bytes, self.protocol_version)
            .map_err(|error| format!("received an undecodable frame: {error}"))?;
        let fds = frame.fds;
        // Each waiter is woken after the lock is released: a wake-up can
        // be a futex syscall, and callers on other threads wait for this
        // lock to register their requests.
        let mut state = self.lock();
        match message {
            ServerMessage::Spawned(spawned) => match state.pending.remove(&spawned.id) {
                Some(Pending::Spawn(reply)) => {
                    if spawned.pid <= 0 {
                        // Put it back so that `lose` fails it with the
                        // reason below.
                        state.pending.insert(spawned.id, Pending::Spawn(reply));
                        return Err(format!(
                            "Spawned for request {} carries invalid pid {}",
                            spawned.id, spawned.pid
                        ));
                    }
                    // Register the exit slot before the spawner sees the
                    // child: an `Exited` may be the very next frame.
                    let (slot, exit) = watch::channel(ExitState::Running);
                    state.exits.insert(spawned.id, slot);
                    drop(state);
                    // A dropped receiver means the spawn was cancelled: the
                    // fds close here and the child runs on unobserved; its
                    // exit slot is removed when its `Exited` arrives.
                    let _ = reply.send(SpawnReply::Spawned {
                        id: spawned.id,
                        pid: spawned.pid,
                        fds,
                        exit: ExitWatch(exit),
                        sandbox: spawned.sandbox,
                    });
                }
                Some(other) => {
                    state.pending.insert(spawned.id, other);
                    return Err(wrong_reply("Spawned", spawned.id));
                }
                // A cancelled spawn; closing the fds is all there is to do.
                None => {}
            },
            ServerMessage::SpawnFailed(failed) => match state.pending.remove(&failed.id) {
                Some(Pending::Spawn(reply)) => {
                    drop(state);
                    let _ = reply.send(SpawnReply::Failed(failed));
                }
                Some(other) => {
                    state.pending.insert(failed.id, other);
                    return Err(wrong_reply("SpawnFailed", failed.id));
                }
                None => {}
            },
            ServerMessage::Exited(notice) => {
                if let Some(slot) = state.exits.remove(&notice.id) {
                    drop(state);
                    slot.send_replace(ExitState::Exited(notice));
                } else if let Some(pending) = state.pending.remove(&notice.id) {
                    // A deferred spawn whose child ended without `Spawned`.
                    match pending {
                        Pending::Spawn(reply) => {
                            drop(state);
                            let _ = reply.send(SpawnReply::Exited(notice));
                        }
                        other => {
                            state.pending.insert(notice.id, other);
                            return Err(wrong_reply("Exited", notice.id));
                        }
                    }
                }
            }
            ServerMessage::Stopped(notice) => {
                if let Some(slot) = state.exits.get(&notice.id) {
                    slot.send_replace(ExitState::Stopped(notice.signal));
                }
            }
            ServerMessage::Continued(notice) => {
                if let Some(slot) = state.exits.get(&notice.id) {
                    slot.send_replace(ExitState::Running);
                }
            }
            ServerMessage::HelloAck(_) => {
                return Err("expected a reply, received a second HelloAck".into());
            }
            ServerMessage::ProtocolError(error) => {
                return Err(format!(
                    "the zygote reported a protocol error ({}): {}",
                    error.kind.name(),
                    error.message
                ));
            }
            answer => return Self::dispatch_answer(state, answer),
        }
        Ok(())
    }

    /// Hands the answer to a request other than a spawn (a signal, a
    /// status, a template or its list) to its waiter.
    ///
    /// # Errors
    ///
    /// A reason to end the connection: an answer of the wrong kind.
    fn dispatch_answer(
        mut state: MutexGuard<'_, State>,
        message: ServerMessage,
    ) -> std::result::Result<(), String> {
        match message {
            ServerMessage::SignalSent(sent) => match state.pending.remove(&sent.id) {
                Some(Pending::Signal(reply)) => {
                    drop(state);
                    let _ = reply.send(Ok(()));
                }
                Some(other) => {
                    state.pending.insert(sent.id, other);
                    return Err(wrong_reply("SignalSent", sent.id));
                }
                None => {}
            },
            ServerMessage::RequestFailed(failed) => match state.pending.remove(&failed.id) {
                Some(Pending::Signal(reply)) => {
                    drop(state);
                    let _ = reply.send(Err(failed));
                }
                Some(Pending::Template(reply)) => {
                    drop(state);
                    let _ = reply.send(Err(failed));
                }
                Some(Pending::Templates(reply)) => {
                    drop(state);
                    let _ = reply.send(Err(failed));
                }
                Some(other) => {
                    state.pending.insert(failed.id, other);
                    return Err(wrong_reply("RequestFailed", failed.id));
                }
                None => {}
            },
            ServerMessage::TemplateReady(ready) => match state.pending.remove(&ready.id) {
                Some(Pending::Template(reply)) => {
                    drop(state);
                    let _ = reply.send(Ok(ready));
                }
                Some(other) => {
                    state.pending.insert(ready.id, other);
                    return Err(wrong_reply("TemplateReady", ready.id));
                }
                None => {}
            },
            ServerMessage::Templates(list) => match state.pending.remove(&list.id) {
                Some(Pending::Templates(reply)) => {
                    drop(state);
                    let _ = reply.send(Ok(list.templates));
                }
                Some(other) => {
                    state.pending.insert(list.id, other);
                    return Err(wrong_reply("Templates", list.id));
                }
                None => {}
            },
            ServerMessage::Status(status) => match state.pending.remove(&status.id) {
                Some(Pending::Status(reply)) => {
                    drop(state);
                    let _ = reply.send(status);
                }
                Some(other) => {
                    state.pending.insert(status.id, other);
                    return Err(wrong_reply("Status", status.id));
                }
                None => {}
            },
            other => {
                return Err(format!(
                    "received {} where only an answer to a request belongs",
                    super::message_name(&other)
                ));
            }
        }
        Ok(())
    }

    /// The reader task: receives every frame and dispatches it until the
    /// zygote closes, something breaks, or `stop` fires (the last client
    /// handle was dropped).
    pub(crate) async fn run_reader(
        self: Arc<Self>,
        mut scratch: Vec<u8>,
        mut stop: oneshot::Receiver<()>,
    ) {
        // Whatever ends this task (including a runtime shutting down and
        // dropping it), waiters must not hang.
        let _guard = LoseOnDrop(&self);
        let reason = loop {
            let received = tokio::select! {
                biased;
                _ = &mut stop => break "the client was dropped".to_string(),
                received = self.socket.recv(&mut scratch) => received,
            };
            match received {
                Ok(Some(frame)) => {
                    if let Err(reason) = self.dispatch(frame) {
                        // Tell the zygote we are done; it would otherwise
                        // keep our children's slots until we exit.
                        let _ =
                            rustix::net::shutdown(self.socket.as_fd(), rustix::net::Shutdown::Both);
                        break reason;
                    }
                }
                Ok(None) => break "the zygote closed the connection".to_string(),
                Err(error) => break receive_failure(&error),
            }
        };
        self.lose(reason);
    }
}

struct LoseOnDrop<'a>(&'a Connection);

impl Drop for LoseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.lose("the connection driver stopped".into());
    }
}

fn receive_failure(error: &ProtoError) -> String {
    format!("receiving from the zygote failed: {error}")
}

fn wrong_reply(reply: &str, id: u64) -> String {
    format!("received {reply} for request {id}, which is not a request of that kind")
}
