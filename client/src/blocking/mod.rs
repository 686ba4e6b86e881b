//! The same API without async: [`Client`], [`Command`], [`Child`], with
//! pipes that are plain `Read`/`Write` files, as in `std::process`.
//!
//! A blocking [`Client`] owns a small current-thread tokio runtime; each
//! blocking call runs the async code on the calling thread, which drives
//! the connection itself while it waits (its reply is read on its own
//! thread), and one background thread drives it between calls. Any number
//! of threads may use one client (and its clones) at once.
//!
//! # Panics
//!
//! The blocking calls panic when made from inside an async runtime (as
//! `reqwest::blocking` does): use the async [`crate::Client`] there.

use std::ffi::OsStr;
use std::future::Future;
use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use zygote_proto::Limits;

use crate::fork::Owner;
use crate::request::StdioDefaults;
pub use crate::{Error, ExitStatus, Output, ResourceUsage, Result, Stdio};

mod child;

pub use child::{Child, ChildStderr, ChildStdin, ChildStdout};

/// The runtime, shared by a client's clones, commands and children, and
/// the background thread that drives it while no caller does; stopped
/// when the last of them is dropped.
///
/// A caller blocked on a reply drives the runtime itself
/// (`Runtime::block_on` of a current-thread runtime: the first thread in
/// takes its IO driver), so it reads its reply on its own thread, with no
/// hop through another thread. Once no caller has come for
/// [`IDLE_BEFORE_DRIVING`], the background thread drives it, so that
/// notices nobody waits for yet are still read; it gives the runtime up
/// as soon as a caller comes.
#[derive(Debug)]
struct Runtime {
    runtime: Option<Arc<tokio::runtime::Runtime>>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The process that started it: in a forked copy the background
    /// thread does not exist, and the runtime may be held by it forever.
    owner: Owner,
}

/// What the callers and the background thread share.
#[derive(Debug, Default)]
struct Shared {
    /// Callers inside [`Runtime::block_on`] now.
    callers: AtomicUsize,
    /// Calls to [`Runtime::block_on`] so far: the background thread drives
    /// only once it has not moved for [`IDLE_BEFORE_DRIVING`].
    calls: AtomicU64,
    /// Ends the background thread's turn at driving the runtime.
    wanted: Notify,
    stop: AtomicBool,
}

impl Runtime {
    fn start() -> Result<Arc<Self>> {
        let runtime = Arc::new(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| Error::io("building the zygote client's runtime", error))?,
        );
        let shared = Arc::new(Shared::default());
        let thread = {
            let runtime = Arc::clone(&runtime);
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("zygote-client".into())
                .spawn(move || drive_when_idle(&runtime, &shared))
                .map_err(|error| Error::io("starting the zygote client's thread", error))?
        };
        Ok(Arc::new(Self {
            runtime: Some(runtime),
            shared,
            thread: Some(thread),
            owner: Owner::current(),
        }))
    }

    /// Runs `future` to completion on this thread.
    ///
    /// # Errors
    ///
    /// [`Error::Forked`] at once in a forked copy of the process that
    /// started the runtime (see `fork`); else `future`'s.
    fn block_on<T>(&self, future: impl Future<Output = Result<T>>) -> Result<T> {
        self.owner.check()?;
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        self.shared.calls.fetch_add(1, Ordering::Relaxed);
        self.shared.callers.fetch_add(1, Ordering::AcqRel);
        // Makes the background thread give the runtime up if it drives it
        // (a stored permit otherwise: no syscall); meanwhile this thread
        // already polls `future` (sending its request).
        self.shared.wanted.notify_one();
        let _leave = Leave(&self.shared);
        runtime.block_on(future)
    }
}

/// Counts a caller out of [`Runtime::block_on`], also when it unwinds.
struct Leave<'a>(&'a Shared);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.callers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long the runtime must have had no caller before the background
/// thread drives it: a program that calls again within this finds the
/// runtime free and takes it without waking anyone.
const IDLE_BEFORE_DRIVING: Duration = Duration::from_millis(10);

/// The background thread: drives the runtime once no caller has come for
/// [`IDLE_BEFORE_DRIVING`], until a caller wants it back; checks every
/// [`IDLE_BEFORE_DRIVING`] while callers come (it sleeps in the runtime's
/// IO driver while it drives), until stopped.
fn drive_when_idle(runtime: &tokio::runtime::Runtime, shared: &Shared) {
    let stopped = || shared.stop.load(Ordering::Acquire);
    let mut seen = shared.calls.load(Ordering::Relaxed);
    while !stopped() {
        std::thread::park_timeout(IDLE_BEFORE_DRIVING);
        let calls = shared.calls.load(Ordering::Relaxed);
        if calls != seen || shared.callers.load(Ordering::Acquire) > 0 {
            seen = calls;
            continue;
        }
        if stopped() {
            return;
        }
        // Until a caller (or the stop) wants it; a permit a caller left
        // since makes this return at once.
        runtime.block_on(shared.wanted.notified());
        seen = shared.calls.load(Ordering::Relaxed);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if !self.owner.is_current() {
            // A forked copy: the thread to join does not exist here, and
            // the runtime may be held by it. Both are left as they are.
            std::mem::forget(self.thread.take());
            std::mem::forget(self.runtime.take());
            return;
        }
        // The background thread drops the runtime, outside any runtime.
        drop(self.runtime.take());
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wanted.notify_one();
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// A connection to a zygote, for synchronous code; see [`crate::Client`].
///
/// Cheap to clone, `Send` and `Sync`.
///
/// In a forked copy of the process that made it, every call fails at once
/// with [`Error::Forked`] (its runtime and background thread belong to
/// the parent, and nothing is sent on the parent's connection): make a new
/// client in the copy. Dropping the copy's client there is safe.
#[derive(Debug, Clone)]
pub struct Client {
    // Declared first so the connection is released before the runtime
    // that drives it is stopped.
    inner: crate::Client,
    runtime: Arc<Runtime>,
}

impl Client {
    fn start<F>(connect: impl FnOnce() -> F) -> Result<Self>
    where
        F: Future<Output = Result<crate::Client>>,
    {
        let runtime = Runtime::start()?;
        let inner = runtime.block_on(connect())?;
        Ok(Self { inner, runtime })
    }

    /// Connects to the zygote listening at `path`.
    ///
    /// # Errors
    ///
    /// As [`crate::Client::connect`], and [`Error::Io`] when the
    /// background thread cannot start.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self> {
        Self::start(|| crate::Client::connect(path))
    }

    /// Connects to the zygote named by `ZYGOTE_SOCKET`, or else to
    /// [`default_socket_path`](crate::default_socket_path).
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub fn from_env() -> Result<Self> {
        Self::start(crate::Client::from_env)
    }

    /// Speaks to a zygote over an already-connected SEQPACKET socket.
    ///
    /// # Errors
    ///
    /// As [`crate::Client::from_fd`].
    pub fn from_fd(socket: OwnedFd) -> Result<Self> {
        Self::start(|| crate::Client::from_fd(socket))
    }

    /// Launches a private zygote serving only this process, and connects
    /// to it; see [`crate::Client::launch_private`].
    ///
    /// # Errors
    ///
    /// As [`crate::Client::launch_private`].
    pub fn launch_private() -> Result<Self> {
        Self::start(crate::Client::launch_private)
    }

    /// A [`Command`] for `program` on this connection.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        Command::new(self, program)
    }

    /// The zygote's version, as it announced it on the current connection.
    pub fn server_version(&self) -> String {
        self.inner.server_version()
    }

    /// The protocol version spoken on this connection.
    pub fn protocol_version(&self) -> u32 {
        self.inner.protocol_version()
    }

    /// The names of the optional features the zygote offers.
    pub fn features(&self) -> Vec<String> {
        self.inner.features()
    }

    /// Whether the zygote offers `feature`.
    pub fn offers(&self, feature: crate::Feature) -> bool {
        self.inner.offers(feature)
    }

    /// The limits in force on this connection.
    pub fn limits(&self) -> Limits {
        self.inner.limits()
    }

    /// Asks the zygote for its version, uptime and counters.
    ///
    /// # Errors
    ///
    /// As [`crate::Client::status`].
    pub fn status(&self) -> Result<crate::DaemonStatus> {
        self.runtime.block_on(self.inner.status())
    }

    /// As [`crate::Client::python_template`]: a [`TemplateBuilder`] for a
    /// Python template that imports `preload` before it forks children.
    ///
    /// ```no_run
    /// # fn example() -> zygote_client::Result<()> {
    /// let client = zygote_client::blocking::Client::from_env()?;
    /// let template = client.python_template(["json"]).start()?;
    /// let status = template.command(["-c", "import json"]).status()?;
    /// assert!(status.success());
    /// # Ok(())
    /// # }
    /// ```
    pub fn python_template<I, S>(&self, preload: I) -> TemplateBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        TemplateBuilder {
            inner: self.inner.python_template(preload),
            runtime: Arc::clone(&self.runtime),
        }
    }

    /// As [`crate::Client::templates`].
    ///
    /// # Errors
    ///
    /// As [`crate::Client::templates`].
    pub fn templates(&self) -> Result<Vec<crate::TemplateInfo>> {
        self.runtime.block_on(self.inner.templates())
    }

    /// False once the connection has ended.
    pub fn is_connected(&self) -> bool {
        self.inner.is_connected()
    }

    /// Makes the next spawn read this process's umask and resource limits
    /// again; see [`crate::Client::refresh_process_state`].
    pub fn refresh_process_state(&self) {
        self.inner.refresh_process_state();
    }
}

/// A process to start through the zygote, for synchronous code; the same
/// builder as [`crate::Command`] and [`std::process::Command`].
#[derive(Debug)]
pub struct Command {
    inner: crate::Command,
    runtime: Arc<Runtime>,
}

/// Builder methods that only forward to the async command.
macro_rules! forward {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&mut self, $($arg: $ty),*) -> &mut Self {
                self.inner.$name($($arg),*);
                self
            }
        )*
    };
}

impl Command {
    /// A command to run `program` through `client`'s zygote.
    pub fn new(client: &Client, program: impl AsRef<OsStr>) -> Self {
        Self {
            inner: crate::Command::new(&client.inner, program),
            runtime: Arc::clone(&client.runtime),
        }
    }

    forward! {
        /// Adds an argument.
        fn arg(arg: impl AsRef<OsStr>);
        /// Sets `argv[0]`.
        fn arg0(arg0: impl AsRef<OsStr>);
        /// Sets an environment variable for the child.
        fn env(key: impl AsRef<OsStr>, value: impl AsRef<OsStr>);
        /// Removes a variable from the child's environment.
        fn env_remove(key: impl AsRef<OsStr>);
        /// Starts the child's environment empty.
        fn env_clear();
        /// Sets the child's working directory (relative: from this
        /// process's).
        fn current_dir(dir: impl AsRef<Path>);
        /// Sets the child's stdin.
        fn stdin(stdio: impl Into<Stdio>);
        /// Sets the child's stdout.
        fn stdout(stdio: impl Into<Stdio>);
        /// Sets the child's stderr.
        fn stderr(stdio: impl Into<Stdio>);
        /// Gives the child `fd` as its fd number `child_fd` (3 or more).
        fn fd(child_fd: RawFd, fd: impl Into<OwnedFd>);
        /// Passes every non-close-on-exec fd at its own number; see
        /// [`crate::Command::inherit_fds`].
        fn inherit_fds();
        /// Puts the child in process group `pgid` (0: a new group).
        fn process_group(pgid: i32);
        /// Starts the child in a new session.
        fn setsid(setsid: bool);
        /// Gives the child a new pseudo-terminal; see [`crate::Command::pty`].
        fn pty(rows: u16, cols: u16);
        /// Confines the child; see [`crate::Command::sandbox`].
        fn sandbox(sandbox: crate::Sandbox);
        /// Sets the child's umask instead of copying this process's.
        fn umask(mask: u32);
        /// Runs the child as `uid`; see [`crate::Command::uid`].
        fn uid(uid: u32);
        /// Runs the child with primary group `gid`.
        fn gid(gid: u32);
        /// Sets the child's supplementary groups.
        fn groups(groups: &[u32]);
        /// SIGKILL the child when its `Child` is dropped or this client's
        /// connection closes; see [`crate::Command::kill_on_drop`].
        fn kill_on_drop(kill: bool);
        /// Signal the child when this client's connection closes.
        fn kill_on_close(signal: i32);
        /// Signal the child's process group when the connection closes.
        fn kill_process_group_on_close(signal: i32);
        /// SIGTERM past `limit`, SIGKILL after the grace period.
        fn timeout(limit: std::time::Duration);
        /// Time between the timeout's SIGTERM and SIGKILL.
        fn timeout_grace(grace: std::time::Duration);
        /// `memory.max` of the child's cgroup, in bytes.
        fn memory_max(bytes: u64);
        /// `memory.swap.max` of the child's cgroup, in bytes.
        fn memory_swap_max(bytes: u64);
        /// `pids.max` of the child's cgroup.
        fn pids_max(pids: u64);
        /// `cpu.max` of the child's cgroup: `quota` per `period`.
        fn cpu_max(quota: std::time::Duration, period: std::time::Duration);
        /// `cpu.weight` of the child's cgroup.
        fn cpu_weight(weight: u32);
        /// `io.weight` of the child's cgroup.
        fn io_weight(weight: u32);
        /// Timeouts, kill-on-close and SIGKILL requests end the whole tree.
        fn kill_tree(on: bool);
        /// `wait` returns once the child's whole cgroup is empty.
        fn wait_tree(on: bool);
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.inner.args(args);
        self
    }

    /// Sets several environment variables.
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        self.inner.envs(vars);
        self
    }

    /// The program, as given to [`new`](Command::new).
    pub fn get_program(&self) -> &OsStr {
        self.inner.get_program()
    }

    /// The arguments, without `argv[0]`.
    pub fn get_args(&self) -> impl Iterator<Item = &OsStr> {
        self.inner.get_args()
    }

    /// The environment changes made so far (`None`: removed).
    pub fn get_envs(&self) -> impl Iterator<Item = (&OsStr, Option<&OsStr>)> {
        self.inner.get_envs()
    }

    /// The working directory set with [`current_dir`](Command::current_dir).
    pub fn get_current_dir(&self) -> Option<&Path> {
        self.inner.get_current_dir()
    }

    /// Starts the child; returns once it has exec'd or failed to.
    ///
    /// # Errors
    ///
    /// As [`crate::Command::spawn`].
    pub fn spawn(&mut self) -> Result<Child> {
        let parts = self
            .runtime
            .block_on(self.inner.spawn_parts(StdioDefaults::Inherit))?;
        Child::from_parts(parts, Arc::clone(&self.runtime))
    }

    /// Runs the child to completion and collects its output (stdin
    /// `/dev/null`, stdout and stderr piped unless set; read concurrently).
    ///
    /// # Errors
    ///
    /// As [`crate::Command::output`].
    pub fn output(&mut self) -> Result<Output> {
        self.runtime.block_on(self.inner.output())
    }

    /// Runs the child to completion with inherited stdio (unless set).
    ///
    /// # Errors
    ///
    /// As [`crate::Command::status`].
    pub fn status(&mut self) -> Result<ExitStatus> {
        self.runtime.block_on(self.inner.status())
    }
}

/// As [`crate::TemplateBuilder`], blocking: made by
/// [`Client::python_template`].
#[derive(Debug, Clone)]
pub struct TemplateBuilder {
    inner: crate::TemplateBuilder,
    runtime: Arc<Runtime>,
}

impl TemplateBuilder {
    /// As [`crate::TemplateBuilder::python`].
    pub fn python(&mut self, interpreter: impl AsRef<OsStr>) -> &mut Self {
        self.inner.python(interpreter);
        self
    }

    /// As [`crate::TemplateBuilder::env`].
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.inner.env(key, value);
        self
    }

    /// As [`crate::TemplateBuilder::envs`].
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        self.inner.envs(vars);
        self
    }

    /// As [`crate::TemplateBuilder::env_remove`].
    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Self {
        self.inner.env_remove(key);
        self
    }

    /// As [`crate::TemplateBuilder::env_clear`].
    pub fn env_clear(&mut self) -> &mut Self {
        self.inner.env_clear();
        self
    }

    /// As [`crate::TemplateBuilder::current_dir`].
    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.inner.current_dir(dir);
        self
    }

    /// As [`crate::TemplateBuilder::start`]: returns once the template is
    /// ready, or failed.
    ///
    /// # Errors
    ///
    /// As [`crate::TemplateBuilder::start`].
    pub fn start(&self) -> Result<Template> {
        let inner = self.runtime.block_on(self.inner.start())?;
        Ok(Template {
            inner,
            runtime: Arc::clone(&self.runtime),
        })
    }
}

/// As [`crate::Template`], blocking.
#[derive(Debug, Clone)]
pub struct Template {
    inner: crate::Template,
    runtime: Arc<Runtime>,
}

impl Template {
    /// As [`crate::Template::command`]: a blocking [`Command`] whose
    /// child this template forks.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Command {
            inner: self.inner.command(args),
            runtime: Arc::clone(&self.runtime),
        }
    }

    /// As [`crate::Template::handle`].
    pub fn handle(&self) -> u64 {
        self.inner.handle()
    }

    /// As [`crate::Template::pid`].
    pub fn pid(&self) -> i32 {
        self.inner.pid()
    }

    /// As [`crate::Template::reused`].
    pub fn reused(&self) -> bool {
        self.inner.reused()
    }

    /// As [`crate::Template::interpreter`].
    pub fn interpreter(&self) -> &OsStr {
        self.inner.interpreter()
    }

    /// As [`crate::Template::preload`].
    pub fn preload(&self) -> &[String] {
        self.inner.preload()
    }
}
