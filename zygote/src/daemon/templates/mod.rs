//! Warm templates: processes the daemon starts and owns for a peer, with
//! a runtime loaded, which fork children that become programs without an
//! exec. CPython is the one kind (`runner.py`).
//!
//! A template is started through the daemon's own spawn path, as the
//! peer's uid, with the request's environment and working directory, in a
//! cgroup of its own when the daemon has a subtree. Its fd 3 is a
//! `SOCK_SEQPACKET` control socket. It imports its preloads, checks it is
//! still single-threaded, freezes its heap and says "ready". For each warm
//! spawn the daemon sends it the child's plan with the child's fds; it
//! clones the child with `CLONE_PARENT`, so that the child is the
//! daemon's own, and answers its pid. The daemon trusts nothing it says:
//! see [`spawn::claim_sibling`](crate::spawn::claim_sibling).
//!
//! Here: the registry (by handle and by spec) and its bounds;
//! `process`: one template process, its start and its questions;
//! `watch`: the task that reads a template's answers and reaps it;
//! `warm`: a warm spawn, on the spawn task's path.
//!
//! Bounds: [`PER_UID`] templates per uid and [`IN_ALL`] in all; a process
//! is recycled after [`MAX_FORKS`] forks or [`MAX_AGE`]; a template is
//! stopped after [`IDLE_STOP`] without a spawn, or when its uid's last
//! connection closes; a start has [`START_DEADLINE`]; an answer
//! [`ANSWER_DEADLINE`]; the daemon's environment may change the first
//! three and the start deadline ([`Settings`]); after
//! [`FAILED_STARTS_BEFORE_PAUSE`] failed starts in a row a template is not
//! started again before [`START_PAUSE`].

mod process;
mod settings;
mod warm;
mod watch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tracing::info;
use zygote_proto::{Env, PYTHON_TEMPLATE, TemplateInfo, TemplateRequest};

use crate::daemon::peer::Peer;
use crate::daemon::policy::Grant;
use crate::daemon::state::Daemon;
use process::Process;

pub(crate) use settings::Settings;
pub(crate) use warm::check_spawn;

/// Templates one uid may have at once.
pub const PER_UID: usize = 8;

/// Templates the daemon runs at once, for every uid.
pub const IN_ALL: usize = 64;

/// Forks after which a template's process is replaced by a fresh one.
pub const MAX_FORKS: u64 = 10_000;

/// Age after which a template's process is replaced by a fresh one.
pub const MAX_AGE: Duration = Duration::from_secs(3600);

/// Time without a spawn after which a template is stopped (its handle
/// then answers `ENOENT`).
pub const IDLE_STOP: Duration = Duration::from_secs(600);

/// How long a template may take to import its preloads and say ready.
pub const START_DEADLINE: Duration = Duration::from_secs(60);

/// Milliseconds that replace [`START_DEADLINE`], read at daemon start
/// (see [`Settings`]).
pub const START_DEADLINE_ENV: &str = "ZYGOTE_TEMPLATE_START_DEADLINE_MS";

/// Children each template keeps forked ahead, waiting for a request.
pub const POOL_SIZE: usize = 1;

/// `ZYGOTE_TEMPLATE_POOL=N` in the daemon's environment: keep N children
/// forked ahead per template instead of [`POOL_SIZE`] (0: fork each child
/// on its request; at most [`MAX_POOL_SIZE`]).
pub const POOL_ENV: &str = "ZYGOTE_TEMPLATE_POOL";

/// The largest pool [`POOL_ENV`] may ask for.
pub const MAX_POOL_SIZE: usize = 8;

/// How long a template may take to answer a fork, and a child to report
/// its setup, before the spawn fails.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(30);

/// Failed starts in a row after which a template is not started again
/// before [`START_PAUSE`] has passed since the last.
pub const FAILED_STARTS_BEFORE_PAUSE: u32 = 3;

/// See [`FAILED_STARTS_BEFORE_PAUSE`].
pub const START_PAUSE: Duration = Duration::from_secs(60);

/// Preloads in one request, and bytes in one preload's name.
const MAX_PRELOADS: usize = 256;

/// The program of a Python template, passed with `-c`.
const RUNNER: &str = include_str!("runner.py");

/// Why a template could not be had: an errno and a sentence.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub errno: i32,
    pub message: String,
}

impl Failure {
    fn new(errno: i32, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }
}

/// What makes two requests one template.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    uid: u32,
    kind: String,
    interpreter: Vec<u8>,
    preload: Vec<String>,
    env: Vec<Vec<u8>>,
    cwd: Option<Vec<u8>>,
}

/// One template: its spec, who it runs as, and its current process.
pub(crate) struct Template {
    handle: u64,
    key: Key,
    env: Env,
    peer: Peer,
    grant: Grant,
    state: Mutex<TemplateState>,
    /// Held while a process is being started: one start at a time.
    starting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct TemplateState {
    process: Option<Arc<Process>>,
    /// Processes started after the first.
    restarts: u64,
    started_once: bool,
    failed_in_row: u32,
    last_failure: Option<Instant>,
    /// Out of the registry: its handle answers `ENOENT`.
    removed: bool,
}

impl Template {
    fn lock(&self) -> std::sync::MutexGuard<'_, TemplateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The uid it runs as and belongs to.
    pub(crate) fn uid(&self) -> u32 {
        self.key.uid
    }

    /// Its interpreter, as requested.
    pub(crate) fn interpreter(&self) -> &[u8] {
        &self.key.interpreter
    }

    /// Its process, when one runs that may fork; one due for recycling is
    /// retired on the way.
    fn usable(&self, settings: &Settings) -> Option<Arc<Process>> {
        let state = self.lock();
        let process = state.process.as_ref()?;
        if !process.accepting() {
            return None;
        }
        if process.forks() >= settings.max_forks || process.started.elapsed() >= settings.max_age {
            info!(
                template = self.handle,
                uid = self.key.uid,
                pid = process.pid,
                forks = process.forks(),
                "recycling a template: a fresh process takes its place at the next request"
            );
            process.retire();
            return None;
        }
        Some(Arc::clone(process))
    }

    /// Its running process, or a new one: `(process, started now)`.
    pub(crate) async fn ensure(
        self: &Arc<Self>,
        daemon: &Arc<Daemon>,
    ) -> Result<(Arc<Process>, bool), Failure> {
        let settings = daemon.templates.settings();
        if let Some(process) = self.usable(settings) {
            return Ok((process, false));
        }
        let _starting = self.starting.lock().await;
        if let Some(process) = self.usable(settings) {
            return Ok((process, false));
        }
        {
            let state = self.lock();
            if state.removed {
                return Err(self.gone());
            }
            let paused = state.failed_in_row >= FAILED_STARTS_BEFORE_PAUSE
                && state
                    .last_failure
                    .is_some_and(|at| at.elapsed() < START_PAUSE);
            if paused {
                return Err(Failure::new(
                    libc::EPROTO,
                    format!(
                        "template {} failed to start {} times in a row; it is not started \
                         again before {} s have passed since the last failure",
                        self.handle,
                        state.failed_in_row,
                        START_PAUSE.as_secs()
                    ),
                ));
            }
        }
        let started = process::start(daemon, self).await;
        let mut state = self.lock();
        match started {
            Ok(process) => {
                daemon.metrics.template_started("ok");
                if state.started_once {
                    state.restarts += 1;
                }
                state.started_once = true;
                state.failed_in_row = 0;
                if let Some(old) = state.process.replace(Arc::clone(&process)) {
                    old.retire();
                }
                if state.removed {
                    process.retire();
                    return Err(self.gone());
                }
                if let Some(suppressed) = daemon.log_limit.allow(self.key.uid) {
                    info!(
                        template = self.handle,
                        uid = self.key.uid,
                        pid = process.pid,
                        restarts = state.restarts,
                        suppressed,
                        "template started"
                    );
                }
                Ok((process, true))
            }
            Err((result, failure)) => {
                daemon.metrics.template_started(result);
                state.failed_in_row += 1;
                state.last_failure = Some(Instant::now());
                if let Some(suppressed) = daemon.log_limit.allow(self.key.uid) {
                    info!(
                        template = self.handle,
                        uid = self.key.uid,
                        errno = failure.errno,
                        reason = %failure.message,
                        suppressed,
                        "template failed to start"
                    );
                }
                Err(failure)
            }
        }
    }

    fn gone(&self) -> Failure {
        Failure::new(
            libc::ENOENT,
            format!(
                "template {} was stopped (idle, its owner's connections all closed, or the \
                 zygote is stopping); request it again",
                self.handle
            ),
        )
    }

    fn info(&self) -> TemplateInfo {
        let state = self.lock();
        let process = state.process.as_ref().filter(|process| process.accepting());
        TemplateInfo {
            template: self.handle,
            uid: self.key.uid,
            pid: process.map_or(0, |process| process.pid),
            kind: self.key.kind.clone(),
            interpreter: self.key.interpreter.clone(),
            preload: self.key.preload.clone(),
            forks: process.map_or(0, |process| process.forks()),
            restarts: state.restarts,
            age_millis: process.map_or(0, |process| process.started.elapsed().as_millis() as u64),
            rss_bytes: process.map_or(0, |process| rss_bytes(process.pid)),
        }
    }

    /// Takes it out of service: its process ends, its handle answers
    /// `ENOENT`.
    fn remove(&self) {
        let mut state = self.lock();
        state.removed = true;
        if let Some(process) = state.process.take() {
            process.retire();
        }
    }
}

/// Resident memory of `pid`, from `/proc/PID/statm`; 0 when unknown.
fn rss_bytes(pid: i32) -> u64 {
    let pages = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    pages * rustix::param::page_size() as u64
}

#[derive(Default)]
struct Registry {
    by_handle: HashMap<u64, Arc<Template>>,
    by_key: HashMap<Key, u64>,
    stopping: bool,
}

/// The daemon's templates.
pub struct Templates {
    registry: Arc<Mutex<Registry>>,
    next_handle: AtomicU64,
    settings: Settings,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates")
            .field("templates", &self.lock().by_handle.len())
            .finish()
    }
}

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

impl Templates {
    /// No templates yet, under the [`Settings`] of the environment (the
    /// defaults, with a warning, when it holds a bad value: `zygote
    /// serve` refuses to start with one before it gets here). Handles
    /// start from the clock's microseconds, so that an image started by
    /// an upgrade never hands out one the previous image did.
    pub fn new() -> Self {
        let settings = Settings::from_env().unwrap_or_else(|error| {
            tracing::warn!(%error, "template settings: using the defaults");
            Settings::default()
        });
        Self::with_settings(settings)
    }

    /// No templates yet, under `settings`.
    pub fn with_settings(settings: Settings) -> Self {
        let first = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |since| since.as_micros() as u64);
        Self {
            registry: Arc::default(),
            next_handle: AtomicU64::new(first.max(1)),
            settings,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Finds or starts the template `request` names for `peer`: its
    /// handle, pid, and whether it was running already.
    pub(crate) async fn request(
        &self,
        daemon: &Arc<Daemon>,
        peer: &Peer,
        grant: &Grant,
        request: TemplateRequest,
    ) -> Result<(u64, i32, bool), Failure> {
        check_request(&request)?;
        if grant.sandbox_profile().is_some() {
            return Err(Failure::new(
                libc::EOPNOTSUPP,
                "the policy confines this peer's children in a sandbox, and templates cannot \
                 be confined",
            ));
        }
        let template = self.find_or_add(peer, grant, request)?;
        match template.ensure(daemon).await {
            Ok((process, started)) => Ok((template.handle, process.pid, !started)),
            Err(failure) => {
                // A template that never ran is not kept.
                let never_ran = !template.lock().started_once;
                if never_ran {
                    self.forget(&template);
                }
                Err(failure)
            }
        }
    }

    fn find_or_add(
        &self,
        peer: &Peer,
        grant: &Grant,
        request: TemplateRequest,
    ) -> Result<Arc<Template>, Failure> {
        let key = Key {
            uid: peer.uid,
            kind: request.kind,
            interpreter: request.interpreter,
            preload: request.preload,
            env: request.env.entries().map(<[u8]>::to_vec).collect(),
            cwd: request.cwd,
        };
        let mut registry = self.lock();
        if registry.stopping {
            return Err(Failure::new(libc::ESHUTDOWN, "the zygote is shutting down"));
        }
        if let Some(template) = registry
            .by_key
            .get(&key)
            .and_then(|handle| registry.by_handle.get(handle))
        {
            return Ok(Arc::clone(template));
        }
        let own = registry
            .by_handle
            .values()
            .filter(|template| template.key.uid == peer.uid)
            .count();
        if own >= PER_UID {
            return Err(Failure::new(
                libc::EAGAIN,
                format!("uid {} already has {own} templates, its limit", peer.uid),
            ));
        }
        if registry.by_handle.len() >= IN_ALL {
            return Err(Failure::new(
                libc::EAGAIN,
                format!(
                    "the zygote runs {} templates, its limit",
                    registry.by_handle.len()
                ),
            ));
        }
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let template = Arc::new(Template {
            handle,
            key: key.clone(),
            env: request.env,
            peer: peer.clone(),
            grant: grant.clone(),
            state: Mutex::default(),
            starting: tokio::sync::Mutex::new(()),
        });
        registry.by_key.insert(key, handle);
        registry.by_handle.insert(handle, Arc::clone(&template));
        Ok(template)
    }

    /// Takes `template` out of the registry, and out of service.
    fn forget(&self, template: &Template) {
        let mut registry = self.lock();
        let listed = registry
            .by_handle
            .get(&template.handle)
            .is_some_and(|listed| std::ptr::eq(&**listed, template));
        if listed {
            registry.by_handle.remove(&template.handle);
            registry.by_key.remove(&template.key);
        }
        drop(registry);
        template.remove();
    }

    /// The template `handle`, for a spawn of a peer of `uid`.
    pub(crate) fn get(&self, handle: u64, uid: u32) -> Result<Arc<Template>, Failure> {
        let registry = self.lock();
        let Some(template) = registry.by_handle.get(&handle) else {
            return Err(Failure::new(
                libc::ENOENT,
                format!(
                    "no template {handle}: it does not exist, or was stopped (idle, or its \
                     owner's connections all closed); request it again"
                ),
            ));
        };
        if template.key.uid != uid {
            return Err(Failure::new(
                libc::EPERM,
                format!("template {handle} belongs to another uid"),
            ));
        }
        Ok(Arc::clone(template))
    }

    /// The templates a peer of `viewer` sees: every one when `all`.
    pub(crate) fn list(&self, all: bool, viewer: u32) -> Vec<TemplateInfo> {
        let templates: Vec<Arc<Template>> = self
            .lock()
            .by_handle
            .values()
            .filter(|template| all || template.key.uid == viewer)
            .cloned()
            .collect();
        let mut infos: Vec<TemplateInfo> = templates.iter().map(|t| t.info()).collect();
        infos.sort_unstable_by_key(|info| info.template);
        infos
    }

    /// The last connection of `uid` closed: its templates stop.
    pub(crate) fn owner_left(&self, uid: u32) {
        let gone: Vec<Arc<Template>> = {
            let mut registry = self.lock();
            let handles: Vec<u64> = registry
                .by_handle
                .iter()
                .filter(|(_, template)| template.key.uid == uid)
                .map(|(handle, _)| *handle)
                .collect();
            handles
                .into_iter()
                .filter_map(|handle| {
                    let template = registry.by_handle.remove(&handle)?;
                    registry.by_key.remove(&template.key);
                    Some(template)
                })
                .collect()
        };
        for template in gone {
            info!(
                template = template.handle,
                uid, "stopping a template: its owner's last connection closed"
            );
            template.remove();
        }
    }

    /// Stops every template (the daemon is stopping); no new one starts.
    pub(crate) fn stop_all(&self) {
        let all: Vec<Arc<Template>> = {
            let mut registry = self.lock();
            registry.stopping = true;
            registry.by_key.clear();
            registry.by_handle.drain().map(|(_, t)| t).collect()
        };
        for template in all {
            template.remove();
        }
    }

    /// The registry, weakly, for a template's watch.
    fn weak(&self) -> Weak<Mutex<Registry>> {
        Arc::downgrade(&self.registry)
    }

    /// The bounds in force.
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Children each template keeps forked ahead.
    fn pool_size(&self) -> usize {
        self.settings.pool_size
    }

    /// The start deadline in force.
    fn start_deadline(&self) -> Duration {
        self.settings.start_deadline
    }
}

/// Takes an idle template out of `registry` (its watch saw no spawn for
/// [`Settings::idle_stop`]).
fn remove_idle(registry: &Weak<Mutex<Registry>>, template: &Template) {
    if let Some(registry) = registry.upgrade() {
        let mut registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
        let listed = registry
            .by_handle
            .get(&template.handle)
            .is_some_and(|listed| std::ptr::eq(&**listed, template));
        if listed {
            registry.by_handle.remove(&template.handle);
            registry.by_key.remove(&template.key);
        }
    }
    template.remove();
}

/// Checks a template request's fields: `EOPNOTSUPP` for another kind,
/// `EINVAL` for a malformed one.
fn check_request(request: &TemplateRequest) -> Result<(), Failure> {
    if request.kind != PYTHON_TEMPLATE {
        return Err(Failure::new(
            libc::EOPNOTSUPP,
            format!(
                "template kind {:?} is not offered; this zygote offers {PYTHON_TEMPLATE:?}",
                request.kind
            ),
        ));
    }
    let invalid = |message: String| Err(Failure::new(libc::EINVAL, message));
    if request.interpreter.is_empty() {
        return invalid("the interpreter is empty".into());
    }
    if request.interpreter.contains(&0) {
        return invalid("the interpreter contains a NUL byte".into());
    }
    if request.preload.len() > MAX_PRELOADS {
        return invalid(format!(
            "{} preloads; at most {MAX_PRELOADS}",
            request.preload.len()
        ));
    }
    if let Some(bad) = request.preload.iter().find(|name| !module_name(name)) {
        return invalid(format!(
            "preload {bad:?} is not a dotted module name of at most {MAX_PRELOADS} bytes"
        ));
    }
    Ok(())
}

/// A dotted Python identifier (ASCII), at most [`MAX_PRELOADS`] bytes.
fn module_name(name: &str) -> bool {
    name.len() <= MAX_PRELOADS
        && name.split('.').all(|part| {
            let mut bytes = part.bytes();
            bytes
                .next()
                .is_some_and(|first| first.is_ascii_alphabetic() || first == b'_')
                && bytes.all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
        })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::daemon::policy::Policy;

    /// A peer of this process's uid, and what the default policy grants it.
    pub(super) fn own_peer() -> (Peer, Grant) {
        let uid = rustix::process::geteuid().as_raw();
        let peer = Peer {
            pid: 1,
            uid,
            gid: 0,
            groups: Vec::new(),
            hard_limits: Vec::new(),
            can_setid: false,
            can_raise_limits: false,
            nice: 0,
            can_nice: false,
            oom_score_adj: 0,
        };
        let grant = Policy::default_for(uid)
            .admit(&peer, uid)
            .expect("the daemon's own uid is admitted");
        (peer, grant)
    }

    fn template() -> Template {
        let (peer, grant) = own_peer();
        let uid = peer.uid;
        Template {
            handle: 1,
            key: Key {
                uid,
                kind: PYTHON_TEMPLATE.into(),
                interpreter: b"python3".to_vec(),
                preload: Vec::new(),
                env: Vec::new(),
                cwd: None,
            },
            env: Env::new(),
            peer,
            grant,
            state: Mutex::default(),
            starting: tokio::sync::Mutex::new(()),
        }
    }

    /// A template running a process record started at `started` that has
    /// forked `forks` children; the record, and its socket's peer end.
    fn running(started: Instant, forks: u64) -> (Template, Arc<Process>, std::os::fd::OwnedFd) {
        let (ours, theirs) = zygote_proto::socket::pair(false).expect("socketpair");
        let process = Arc::new(Process::for_tests(ours, started, forks));
        let template = template();
        template.lock().process = Some(Arc::clone(&process));
        (template, process, theirs)
    }

    #[tokio::test]
    async fn a_process_past_its_forks_or_age_is_retired_for_a_fresh_one() {
        let (young, process, _peer) = running(Instant::now(), MAX_FORKS - 1);
        assert!(
            young.usable(&Settings::default()).is_some(),
            "below both bounds it forks"
        );
        assert!(!process.retired());
        let (used, process, _peer) = running(Instant::now(), MAX_FORKS);
        assert!(
            used.usable(&Settings::default()).is_none(),
            "at MAX_FORKS it is replaced"
        );
        assert!(process.retired(), "and asked to end");
        let Some(long_ago) = Instant::now().checked_sub(MAX_AGE) else {
            return;
        };
        let (old, process, _peer) = running(long_ago, 0);
        assert!(
            old.usable(&Settings::default()).is_none(),
            "at MAX_AGE it is replaced"
        );
        assert!(process.retired());
        assert_eq!(old.info().pid, 0, "listed without a process meanwhile");
    }

    #[test]
    fn preload_names_are_dotted_identifiers() {
        for good in ["json", "email.mime.text", "_x1", "a.b_c"] {
            assert!(module_name(good), "{good}");
        }
        for bad in ["", "1a", "a..b", "a.", ".a", "a-b", "a b", "é"] {
            assert!(!module_name(bad), "{bad}");
        }
        assert!(!module_name(&"a".repeat(MAX_PRELOADS + 1)));
    }
}
