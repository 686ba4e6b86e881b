//! Warm templates: the templates JavaScript asked for, kept by the number
//! it knows them by, and the list of the zygote's templates.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use napi_derive::napi;
use serde::Serialize;
use zygote_client::{Template, TemplateInfo};

use crate::runtime::{self, Events, Kind};

/// `pythonTemplate`'s options, checked and normalised by `lib/template.js`.
#[napi(object)]
pub struct TemplateSpec {
    /// The interpreter: a path, or a name looked up in the template's `PATH`.
    pub python: String,
    /// The modules to import, in order.
    pub preload: Vec<String>,
    /// The template gets this process's environment instead of `env_keys`.
    pub inherit_env: bool,
    /// Environment names, in order; the template gets exactly these.
    pub env_keys: Vec<String>,
    /// Environment values, matching `env_keys`.
    pub env_values: Vec<String>,
    /// The template's working directory while it imports, or this process's.
    pub cwd: Option<String>,
}

/// The templates JavaScript holds, by the number it was given; dropped
/// when its `Template` object is collected.
static TEMPLATES: Mutex<Option<HashMap<u32, Template>>> = Mutex::new(None);
static NEXT_KEY: AtomicU32 = AtomicU32::new(1);

fn with_templates<R>(f: impl FnOnce(&mut HashMap<u32, Template>) -> R) -> R {
    let mut guard = TEMPLATES.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(HashMap::new))
}

/// The template JavaScript knows as `key`.
pub fn template(key: u32) -> Option<Template> {
    with_templates(|templates| templates.get(&key).cloned())
}

/// The reply JavaScript reads from a `template` event's message.
#[derive(Serialize)]
struct Ready {
    key: u32,
    handle: u64,
    pid: i32,
    reused: bool,
}

/// One entry of a `templates` event's message.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Listed {
    handle: u64,
    uid: u32,
    pid: i32,
    kind: String,
    python: String,
    preload: Vec<String>,
    forks: u64,
    restarts: u64,
    age_ms: u64,
    rss_bytes: u64,
}

impl From<TemplateInfo> for Listed {
    fn from(info: TemplateInfo) -> Self {
        Self {
            handle: info.template,
            uid: info.uid,
            pid: info.pid,
            kind: info.kind,
            python: String::from_utf8_lossy(&info.interpreter).into_owned(),
            preload: info.preload,
            forks: info.forks,
            restarts: info.restarts,
            age_ms: info.age_millis,
            rss_bytes: info.rss_bytes,
        }
    }
}

/// Finds or starts the template: a `template` event (the message
/// `{key, handle, pid, reused}`), or an `error` event.
pub fn start_template(id: u32, spec: TemplateSpec, events: Events) {
    runtime::shared().runtime.spawn(async move {
        let client = match runtime::client(runtime::shared()).await {
            Ok(client) => client,
            Err(error) => return runtime::failed(&events, id, &error),
        };
        let mut builder = client.python_template(spec.preload);
        builder.python(&spec.python);
        if !spec.inherit_env {
            builder.env_clear();
            builder.envs(spec.env_keys.into_iter().zip(spec.env_values));
        }
        if let Some(cwd) = &spec.cwd {
            builder.current_dir(cwd);
        }
        let template = match builder.start().await {
            Ok(template) => template,
            Err(error) => return runtime::failed(&events, id, &error),
        };
        let ready = Ready {
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
            handle: template.handle(),
            pid: template.pid(),
            reused: template.reused(),
        };
        with_templates(|templates| templates.insert(ready.key, template));
        let message = serde_json::to_string(&ready).unwrap_or_default();
        runtime::event(&events, id, Kind::Template, 0, 0, message);
    });
}

/// Lists the templates: a `templates` event whose message is a JSON
/// array, or an `error` event.
pub fn start_list(id: u32, events: Events) {
    runtime::shared().runtime.spawn(async move {
        let client = match runtime::client(runtime::shared()).await {
            Ok(client) => client,
            Err(error) => return runtime::failed(&events, id, &error),
        };
        match client.templates().await {
            Ok(list) => {
                let list: Vec<Listed> = list.into_iter().map(Listed::from).collect();
                let message = serde_json::to_string(&list).unwrap_or_default();
                runtime::event(&events, id, Kind::Templates, 0, 0, message);
            }
            Err(error) => runtime::failed(&events, id, &error),
        }
    });
}

/// Forgets the template JavaScript knew as `key` (its object was
/// collected). The zygote keeps the template until it is idle.
#[napi]
pub fn drop_template(key: u32) {
    with_templates(|templates| templates.remove(&key));
}
