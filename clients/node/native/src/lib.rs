//! The native part of the npm package `zygote`: spawning through the
//! zygote from Node.js without blocking the event loop.
//!
//! Node cannot pass fds over a Unix socket from JavaScript, so this addon
//! speaks to the zygote through `zygote-client` (its handshake and version
//! negotiation, its reconnection and its pidfd exit fallback) on one tokio
//! thread of its own. The JavaScript thread only validates, makes the
//! socketpairs for the pipes, and queues the request; the spawn reply and
//! later the exit status come back through one thread-safe function.
//!
//! # Layout
//!
//! - `codec`: the frames to and from JSON, for the shared test vectors.
//! - `plan`: the validated spawn call and its fds, made on the JS thread.
//! - `runtime`: the tokio thread, the shared client, the event callback.
//! - `sync`: `spawnSync`, which blocks the JS thread by its nature.
//! - `sys`: the `unsafe` code (duplicating an fd known by number).
//! - `template`: warm templates, kept for JavaScript by number.

mod codec;
mod plan;
mod runtime;
mod sync;
mod sys;
mod template;

use std::collections::HashMap;
use std::os::fd::{IntoRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

use napi::threadsafe_function::{ErrorStrategy, ThreadSafeCallContext, ThreadsafeFunction};
use napi::{Env, JsFunction, JsUnknown};
use napi_derive::napi;
use rustix::process::{Signal, pidfd_send_signal};

pub use crate::codec::{decode_frame, encode_frame};
use crate::plan::SpawnSpec;
use crate::runtime::{Event, Events};
pub use crate::sync::spawn_sync;
use crate::template::TemplateSpec;
pub use crate::template::drop_template;

/// The pidfds of the children that have not been reported exited, by the
/// id JavaScript gave them: `kill` signals through these, never by pid.
static PIDFDS: Mutex<Option<HashMap<u32, Arc<OwnedFd>>>> = Mutex::new(None);

fn with_pidfds<R>(f: impl FnOnce(&mut HashMap<u32, Arc<OwnedFd>>) -> R) -> R {
    let mut guard = PIDFDS.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(HashMap::new))
}

/// Sets the function that receives every event:
/// `(id, kind, a, b, message)`. Called once, at load.
#[napi]
pub fn init(env: Env, callback: JsFunction) -> napi::Result<()> {
    let mut events: ThreadsafeFunction<Event, ErrorStrategy::Fatal> = callback
        .create_threadsafe_function(0, |cx: ThreadSafeCallContext<Event>| {
            let Event {
                id,
                kind,
                a,
                b,
                message,
            } = cx.value;
            let values: Vec<JsUnknown> = vec![
                cx.env.create_uint32(id)?.into_unknown(),
                cx.env.create_uint32(kind as u32)?.into_unknown(),
                cx.env.create_int32(a)?.into_unknown(),
                cx.env.create_int32(b)?.into_unknown(),
                cx.env.create_string(&message)?.into_unknown(),
            ];
            Ok(values)
        })?;
    // Only children that are ref'd keep the loop alive: see `set_ref`.
    events.unref(&env)?;
    env.set_instance_data(Instance { events }, 0, |_| {})?;
    Ok(())
}

/// What one JavaScript environment (the main thread, each worker) keeps:
/// its events go to its own function.
struct Instance {
    events: Events,
}

fn instance(env: &Env) -> napi::Result<&'static mut Instance> {
    env.get_instance_data::<Instance>()?
        .ok_or_else(|| napi::Error::from_reason("the zygote addon was not initialised"))
}

/// Keeps the event loop alive (`true`) while any ref'd child runs, or lets
/// it exit (`false`). JavaScript counts the children.
#[napi]
pub fn set_ref(env: Env, on: bool) -> napi::Result<()> {
    let events = &mut instance(&env)?.events;
    if on {
        events.refer(&env)
    } else {
        events.unref(&env)
    }
}

/// Connects to the zygote at `path` from the next spawn on (`None`:
/// `ZYGOTE_SOCKET`, else the default path). One connection serves the
/// whole process, workers included.
#[napi]
pub fn set_socket(path: Option<String>) {
    runtime::set_socket(path);
}

/// Starts a spawn and returns at once, with the parent's end of each
/// `"pipe"` entry (`-1` for the others). The outcome arrives as a `spawn`
/// or `error` event, then the exit as an `exit` event.
///
/// # Errors
///
/// When a pipe cannot be made or an fd given is not open (`EBADF`).
#[napi]
pub fn spawn(env: Env, id: u32, spec: SpawnSpec) -> napi::Result<Vec<i32>> {
    let events = instance(&env)?.events.clone();
    let (plan, parents) = plan::prepare(spec).map_err(errno_error)?;
    runtime::start_spawn(id, plan, events);
    Ok(parents
        .into_iter()
        .map(|end| end.map_or(-1, IntoRawFd::into_raw_fd))
        .collect())
}

/// Asks the zygote for its hello: a `hello` event whose message is JSON
/// with the protocol version, features and server version.
#[napi]
pub fn hello(env: Env, id: u32) -> napi::Result<()> {
    runtime::start_hello(id, instance(&env)?.events.clone());
    Ok(())
}

/// Finds or starts a warm Python template: a `template` event whose
/// message is JSON `{key, handle, pid, reused}` (`key` names it in a
/// spawn's `template`), or an `error` event.
#[napi]
pub fn python_template(env: Env, id: u32, spec: TemplateSpec) -> napi::Result<()> {
    template::start_template(id, spec, instance(&env)?.events.clone());
    Ok(())
}

/// Lists the zygote's templates: a `templates` event whose message is a
/// JSON array, or an `error` event.
#[napi]
pub fn list_templates(env: Env, id: u32) -> napi::Result<()> {
    template::start_list(id, instance(&env)?.events.clone());
    Ok(())
}

/// Sends `signal` to the child through its pidfd. Returns 0 or the errno
/// (`ESRCH` once the child is reported gone).
#[napi]
pub fn kill(id: u32, signal: i32) -> i32 {
    let Some(pidfd) = with_pidfds(|fds| fds.get(&id).cloned()) else {
        return libc::ESRCH;
    };
    if signal == 0 {
        // Signal 0 checks that the child exists: its pidfd polls readable once it exits.
        return 0;
    }
    let Some(signal) = Signal::from_named_raw(signal) else {
        return libc::EINVAL;
    };
    match pidfd_send_signal(&*pidfd, signal) {
        Ok(()) => 0,
        Err(errno) => errno.raw_os_error(),
    }
}

pub(crate) fn errno_error(error: std::io::Error) -> napi::Error {
    let errno = error.raw_os_error().unwrap_or(libc::EINVAL);
    napi::Error::new(napi::Status::GenericFailure, format!("{errno}:{error}"))
}
