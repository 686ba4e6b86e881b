//! The tokio thread that talks to the zygote, the client it shares, and
//! the events it sends back to JavaScript.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use napi::threadsafe_function::{ErrorStrategy, ThreadsafeFunction, ThreadsafeFunctionCallMode};
use zygote_client::Client;

use crate::plan::Plan;
use crate::with_pidfds;

/// What an event is about; JavaScript reads the number.
#[derive(Clone, Copy)]
pub enum Kind {
    /// The child runs: `a` is its pid, `message` what confined it (the
    /// JSON of the zygote's `AppliedSandbox`, empty when nothing did).
    Spawned = 0,
    /// The spawn failed: `a` is the errno (0 if none), `b` says who
    /// failed: 1 the program itself could not be started (as Node's
    /// ENOENT), 0 the zygote could not be reached, 2 it refused the
    /// request (an option it does not offer, a bad value).
    Failed = 1,
    /// The child exited: `a` is its code (-1 if signalled), `b` the signal.
    Exited = 2,
    /// The exit status was lost with the zygote: `message` says why.
    Lost = 3,
    /// The zygote's hello: `message` is JSON.
    Hello = 4,
    /// A template is ready: `message` is JSON (`{key, handle, pid, reused}`).
    Template = 5,
    /// The zygote's templates: `message` is a JSON array.
    Templates = 6,
}

/// The function of one JavaScript environment (the main thread or a
/// worker) that receives the events of the spawns it started.
pub type Events = ThreadsafeFunction<Event, ErrorStrategy::Fatal>;

/// One message for JavaScript.
pub struct Event {
    pub id: u32,
    pub kind: Kind,
    pub a: i32,
    pub b: i32,
    pub message: String,
}

pub struct Shared {
    pub runtime: tokio::runtime::Runtime,
    /// The client, made at the first request; it reconnects on its own.
    client: tokio::sync::Mutex<Option<Client>>,
    /// The socket path set by JavaScript, if any.
    socket: Mutex<Option<String>>,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

pub fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("zygote-node")
            .enable_all()
            .build()
            .expect("the zygote addon cannot start its thread");
        Shared {
            runtime,
            client: tokio::sync::Mutex::new(None),
            socket: Mutex::new(None),
        }
    })
}

pub fn set_socket(path: Option<String>) {
    let shared = shared();
    *shared.socket.lock().unwrap_or_else(PoisonError::into_inner) = path;
    // The next request connects to the new path.
    if let Ok(mut client) = shared.client.try_lock() {
        *client = None;
    } else {
        shared
            .runtime
            .spawn(async { *crate::runtime::shared().client.lock().await = None });
    }
}

pub fn event(events: &Events, id: u32, kind: Kind, a: i32, b: i32, message: String) {
    let event = Event {
        id,
        kind,
        a,
        b,
        message,
    };
    events.call(event, ThreadsafeFunctionCallMode::NonBlocking);
}

pub async fn client(shared: &Shared) -> zygote_client::Result<Client> {
    let mut slot = shared.client.lock().await;
    if let Some(client) = slot.as_ref() {
        return Ok(client.clone());
    }
    let path = shared
        .socket
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let client = match path {
        Some(path) => Client::connect(path).await?,
        None => Client::from_env().await?,
    };
    *slot = Some(client.clone());
    Ok(client)
}

/// Who failed, as [`Kind::Failed`] numbers it.
pub fn who_failed(error: &zygote_client::Error) -> i32 {
    use zygote_client::Error;
    match error {
        Error::Spawn { .. } => 1,
        Error::Connect { .. } | Error::Handshake { .. } | Error::ZygoteLost { .. } => 0,
        _ => 2,
    }
}

pub fn failed(events: &Events, id: u32, error: &zygote_client::Error) {
    let errno = error.raw_os_error().unwrap_or(0);
    event(
        events,
        id,
        Kind::Failed,
        errno,
        who_failed(error),
        error.to_string(),
    );
}

pub fn start_spawn(id: u32, plan: Plan, events: Events) {
    shared().runtime.spawn(async move {
        let client = match client(shared()).await {
            Ok(client) => client,
            Err(error) => return failed(&events, id, &error),
        };
        let mut command = match plan.command(&client) {
            Ok(command) => command,
            Err(refused) => {
                return event(&events, id, Kind::Failed, refused.errno, 2, refused.message);
            }
        };
        let spawned = command.spawn().await;
        // The command holds the child's ends of the pipes: close them here.
        drop(command);
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => return failed(&events, id, &error),
        };
        if let Ok(pidfd) = child.pidfd().try_clone_to_owned() {
            with_pidfds(|fds| fds.insert(id, Arc::new(pidfd)));
        }
        let pid = i32::try_from(child.id()).unwrap_or(0);
        event(&events, id, Kind::Spawned, pid, 0, applied_json(&child));
        let status = child.wait().await;
        with_pidfds(|fds| fds.remove(&id));
        match status {
            Ok(status) => event(
                &events,
                id,
                Kind::Exited,
                status.code().unwrap_or(-1),
                status.signal().unwrap_or(0),
                String::new(),
            ),
            Err(error) => event(&events, id, Kind::Lost, 0, 0, error.to_string()),
        }
    });
}

/// What confined the child, as JSON for `lib/sandbox.js`; empty when
/// nothing did.
pub fn applied_json(child: &zygote_client::Child) -> String {
    child
        .sandbox()
        .and_then(|applied| serde_json::to_string(applied).ok())
        .unwrap_or_default()
}

pub fn start_hello(id: u32, events: Events) {
    shared().runtime.spawn(async move {
        match client(shared()).await {
            Ok(client) => {
                let features: Vec<String> = client
                    .features()
                    .iter()
                    .map(|name| format!("{name:?}"))
                    .collect();
                let json = format!(
                    "{{\"protocolVersion\":{},\"features\":[{}],\"serverVersion\":{:?}}}",
                    client.protocol_version(),
                    features.join(","),
                    client.server_version()
                );
                event(&events, id, Kind::Hello, 0, 0, json);
            }
            Err(error) => failed(&events, id, &error),
        }
    });
}
