//! [`Command`]: the builder, as `std::process::Command` and
//! `tokio::process::Command`.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Signal, pidfd_send_signal};
use zygote_proto::{CgroupSpec, CpuMax, KillOnClose, ProtocolErrorKind};

use crate::child::{ChildCore, SpawnedParts, read_all};
use crate::connection::{SpawnFailure, SpawnReply};
use crate::request::{Prepared, Spec, StdioDefaults};
use crate::stdio::StdioKind;
use crate::template;
use crate::transparent::Snapshot;
use crate::{Child, Client, Error, ExitStatus, Output, Result, Stdio};

/// A process to start through the zygote, built like
/// [`std::process::Command`].
///
/// By default the child is what this process would have started itself:
/// the request carries this process's environment (with the changes made
/// here), working directory, umask and resource limits, and the child's
/// stdio is this process's own. The departures are listed in the
/// [crate documentation](crate#departures-from-std); the one to know is
/// that the child gets only its stdio and the fds mapped with
/// [`fd`](Command::fd), not every fd this process left inheritable, unless
/// [`inherit_fds`](Command::inherit_fds) is set.
///
/// A command can be spawned more than once: fds given to it are lent to
/// each request, not consumed.
#[derive(Debug)]
pub struct Command {
    client: Client,
    spec: Spec,
    /// The template whose child this is, from
    /// [`Template::command`](crate::Template::command); `None` for a
    /// program to exec.
    template: Option<Arc<template::Shared>>,
}

impl Command {
    /// A command to run `program` through `client`'s zygote. A program
    /// without a `/` is looked up in the child's `PATH`.
    pub fn new(client: &Client, program: impl AsRef<OsStr>) -> Self {
        Self {
            client: client.clone(),
            spec: Spec::new(program.as_ref()),
            template: None,
        }
    }

    /// A command whose child a template forks; its program, for messages
    /// and [`get_program`](Command::get_program), is the interpreter.
    pub(crate) fn from_template(client: &Client, template: Arc<template::Shared>) -> Self {
        Self {
            client: client.clone(),
            spec: Spec::new(template.interpreter()),
            template: Some(template),
        }
    }

    /// Adds an argument.
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.spec.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for arg in args {
            self.arg(arg);
        }
        self
    }

    /// Sets `argv[0]`, which otherwise is the program as given.
    pub fn arg0(&mut self, arg0: impl AsRef<OsStr>) -> &mut Self {
        self.spec.argv0 = Some(arg0.as_ref().to_owned());
        self
    }

    /// Sets an environment variable for the child.
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.spec.set_env(key.as_ref(), value.as_ref());
        self
    }

    /// Sets several environment variables.
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (key, value) in vars {
            self.env(key, value);
        }
        self
    }

    /// Removes a variable from the child's environment.
    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Self {
        self.spec.remove_env(key.as_ref());
        self
    }

    /// Starts the child's environment empty instead of from this
    /// process's, dropping earlier changes.
    pub fn env_clear(&mut self) -> &mut Self {
        self.spec.clear_env();
        self
    }

    /// Sets the child's working directory. A relative path is taken from
    /// this process's working directory at spawn time, so it means what it
    /// would mean to std.
    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.spec.cwd = Some(dir.as_ref().to_owned());
        self
    }

    /// Sets the child's stdin.
    pub fn stdin(&mut self, stdio: impl Into<Stdio>) -> &mut Self {
        self.spec.stdio[0] = Some(stdio.into());
        self
    }

    /// Sets the child's stdout.
    pub fn stdout(&mut self, stdio: impl Into<Stdio>) -> &mut Self {
        self.spec.stdio[1] = Some(stdio.into());
        self
    }

    /// Sets the child's stderr.
    pub fn stderr(&mut self, stdio: impl Into<Stdio>) -> &mut Self {
        self.spec.stdio[2] = Some(stdio.into());
        self
    }

    /// Gives the child `fd` as its fd number `child_fd` (3 or more), like
    /// systemd's `LISTEN_FDS`. A second call with the same number replaces
    /// the first.
    pub fn fd(&mut self, child_fd: RawFd, fd: impl Into<OwnedFd>) -> &mut Self {
        self.spec.fds.insert(child_fd, fd.into());
        self
    }

    /// Passes every fd of this process that is not close-on-exec to the
    /// child at the same number, as `fork` + `exec` would. Fds mapped with
    /// [`fd`](Command::fd) take precedence. Opt-in, because leaking fds into
    /// children is what the zygote exists to prevent.
    ///
    /// The fds are listed at each spawn; more than the zygote's per-request
    /// limit (64) is an [`Error::TooManyFds`].
    pub fn inherit_fds(&mut self) -> &mut Self {
        self.spec.inherit_fds = true;
        self
    }

    /// Puts the child in process group `pgid` (`setpgid(0, pgid)`); 0
    /// makes it the leader of a new group. The group must be in the
    /// zygote's session.
    pub fn process_group(&mut self, pgid: i32) -> &mut Self {
        self.spec.process_group = Some(pgid);
        self
    }

    /// Starts the child in a new session (`setsid(2)`).
    pub fn setsid(&mut self, setsid: bool) -> &mut Self {
        self.spec.setsid = setsid;
        self
    }

    /// Sets the child's umask instead of copying this process's.
    pub fn umask(&mut self, mask: u32) -> &mut Self {
        self.spec.umask = Some(mask);
        self
    }

    /// Runs the child as `uid` (as std's `CommandExt::uid`). Without
    /// [`groups`](Command::groups) the child then has no supplementary
    /// groups. The zygote refuses (stage `Admission`, `EPERM`) ids other
    /// than this process's own unless its policy allows them.
    pub fn uid(&mut self, uid: u32) -> &mut Self {
        self.spec.uid = Some(uid);
        self
    }

    /// Runs the child with primary group `gid`; see [`uid`](Command::uid).
    pub fn gid(&mut self, gid: u32) -> &mut Self {
        self.spec.gid = Some(gid);
        self
    }

    /// Sets the child's supplementary groups; see [`uid`](Command::uid).
    pub fn groups(&mut self, groups: &[u32]) -> &mut Self {
        self.spec.groups = Some(groups.to_vec());
        self
    }

    /// Kills the child with SIGKILL when its [`Child`] is dropped before
    /// the child exited, and (by the zygote) when this client's connection
    /// closes, e.g. because this process died. As tokio's `kill_on_drop`,
    /// plus the `PR_SET_PDEATHSIG`-like second half.
    pub fn kill_on_drop(&mut self, kill: bool) -> &mut Self {
        self.spec.kill_on_drop = kill;
        self.spec.kill_on_close = kill.then_some(KillOnClose {
            signal: libc::SIGKILL,
            process_group: false,
        });
        self
    }

    /// Has the zygote send `signal` to the child when this client's
    /// connection closes (every [`Client`] clone dropped, or this process
    /// died), as `PR_SET_PDEATHSIG` does for a direct parent.
    pub fn kill_on_close(&mut self, signal: i32) -> &mut Self {
        self.spec.kill_on_close = Some(KillOnClose {
            signal,
            process_group: false,
        });
        self
    }

    /// As [`kill_on_close`](Command::kill_on_close), but signals the
    /// child's whole process group. The child must lead or join a group of
    /// its own ([`process_group`](Command::process_group) or
    /// [`setsid`](Command::setsid)); the zygote refuses otherwise.
    pub fn kill_process_group_on_close(&mut self, signal: i32) -> &mut Self {
        self.spec.kill_on_close = Some(KillOnClose {
            signal,
            process_group: true,
        });
        self
    }

    /// Ends the child if it runs longer than `limit`: SIGTERM, then SIGKILL
    /// after the grace period ([`timeout_grace`](Command::timeout_grace),
    /// 5 s by default). Its [`ExitStatus::timed_out`] is then true. A child
    /// that leads its own process group ([`setsid`](Command::setsid) or
    /// [`process_group(0)`](Command::process_group)) gets both signals as a
    /// group, as coreutils `timeout` does; otherwise the child alone.
    pub fn timeout(&mut self, limit: Duration) -> &mut Self {
        self.spec.timeout = Some(limit);
        self
    }

    /// Sets `memory.max` of the child's own cgroup, in bytes: the whole
    /// tree's memory. The zygote refuses the spawn when it has no cgroup
    /// subtree or the memory controller is not delegated to it; a child
    /// the OOM killer ended says so in [`ExitStatus::oom_killed`].
    pub fn memory_max(&mut self, bytes: u64) -> &mut Self {
        self.cgroup().memory_max = Some(bytes);
        self
    }

    /// Sets `memory.swap.max` of the child's cgroup, in bytes.
    pub fn memory_swap_max(&mut self, bytes: u64) -> &mut Self {
        self.cgroup().memory_swap_max = Some(bytes);
        self
    }

    /// Sets `pids.max` of the child's cgroup: at most this many processes
    /// and threads in the whole tree.
    pub fn pids_max(&mut self, pids: u64) -> &mut Self {
        self.cgroup().pids_max = Some(pids);
        self
    }

    /// Sets `cpu.max` of the child's cgroup: `quota` of CPU time per
    /// `period`.
    pub fn cpu_max(&mut self, quota: Duration, period: Duration) -> &mut Self {
        self.cgroup().cpu_max = Some(CpuMax {
            quota_micros: u64::try_from(quota.as_micros()).unwrap_or(u64::MAX),
            period_micros: u64::try_from(period.as_micros()).unwrap_or(u64::MAX),
        });
        self
    }

    /// Sets `cpu.weight` of the child's cgroup (1 to 10000, default 100).
    pub fn cpu_weight(&mut self, weight: u32) -> &mut Self {
        self.cgroup().cpu_weight = Some(weight);
        self
    }

    /// Sets `io.weight` of the child's cgroup (1 to 10000, default 100).
    pub fn io_weight(&mut self, weight: u32) -> &mut Self {
        self.cgroup().io_weight = Some(weight);
        self
    }

    /// Makes timeouts, kill-on-close and [`Child::kill`] end the child's
    /// whole cgroup (`cgroup.kill`, Linux 5.14): grandchildren that left
    /// its process group or session too.
    pub fn kill_tree(&mut self, on: bool) -> &mut Self {
        self.cgroup().kill_tree = on;
        self
    }

    /// Makes [`Child::wait`] return only once every process of the child's
    /// cgroup has exited, not just the child.
    pub fn wait_tree(&mut self, on: bool) -> &mut Self {
        self.cgroup().wait_tree = on;
        self
    }

    fn cgroup(&mut self) -> &mut CgroupSpec {
        self.spec.cgroup.get_or_insert_with(CgroupSpec::default)
    }

    /// Time between the timeout's SIGTERM and its SIGKILL.
    pub fn timeout_grace(&mut self, grace: Duration) -> &mut Self {
        self.spec.timeout_grace = grace;
        self
    }

    /// The program, as given to [`new`](Command::new).
    pub fn get_program(&self) -> &OsStr {
        &self.spec.program
    }

    /// The arguments, without `argv[0]`.
    pub fn get_args(&self) -> impl Iterator<Item = &OsStr> {
        self.spec.args.iter().map(|arg| arg.as_os_str())
    }

    /// The environment changes made so far (`None`: removed).
    pub fn get_envs(&self) -> impl Iterator<Item = (&OsStr, Option<&OsStr>)> {
        self.spec
            .env
            .iter()
            .map(|(key, value)| (key.as_os_str(), value.as_deref()))
    }

    /// The working directory set with [`current_dir`](Command::current_dir).
    pub fn get_current_dir(&self) -> Option<&Path> {
        self.spec.cwd.as_deref()
    }

    /// Gives the child a new pseudo-terminal of `rows` × `cols` cells, as
    /// `ssh -t` and `docker run -t` do: the child leads a new session with
    /// the terminal as its controlling tty on stdin, stdout and stderr.
    /// The master end comes back as [`Child::pty`]; the caller relays it.
    /// Leave stdin, stdout and stderr unset: the terminal is all three.
    pub fn pty(&mut self, rows: u16, cols: u16) -> &mut Self {
        self.spec.pty = Some(zygote_proto::WindowSize { rows, cols });
        self
    }

    /// Confines the child in `sandbox` (see [`Sandbox`](crate::Sandbox)).
    /// A zygote that does not offer the feature `sandbox` is not asked:
    /// the spawn fails with `EOPNOTSUPP` naming the feature, before
    /// anything is sent.
    pub fn sandbox(&mut self, sandbox: crate::Sandbox) -> &mut Self {
        self.spec.sandbox = Some(sandbox);
        self
    }

    /// Asks the zygote to report when the child stops (e.g. on Ctrl-Z at
    /// its terminal) and continues; follow them with [`Child::job_events`].
    pub fn report_stops(&mut self, report: bool) -> &mut Self {
        self.spec.report_stops = report;
        self
    }

    /// Starts the child and returns once it has exec'd, or its setup
    /// failed, as `std::process::Command::spawn` does. Stdio not set
    /// explicitly is inherited.
    ///
    /// Unlike tokio's `spawn`, this is async: the zygote's answer is
    /// awaited, not the fork.
    ///
    /// # Errors
    ///
    /// [`Error::Spawn`] with the failing step and errno (match
    /// [`Error::kind`] or [`Error::raw_os_error`] for `ENOENT`, `EACCES`,
    /// ...), [`Error::InvalidInput`], [`Error::TooManyFds`],
    /// [`Error::RequestTooLarge`], [`Error::ZygoteLost`].
    pub async fn spawn(&mut self) -> Result<Child> {
        Child::from_parts(self.spawn_parts(StdioDefaults::Inherit).await?)
    }

    /// Runs the child to completion and collects its output. Unless set
    /// explicitly, stdin is `/dev/null` and stdout and stderr are piped,
    /// as in std; both are read concurrently.
    ///
    /// The output pipes are made here and passed as fds, so that (unless
    /// stdin is piped or a pty is set) the zygote can skip `Spawned` for a
    /// child that ends within 10 to 20 ms, as for [`status`](Self::status).
    ///
    /// # Errors
    ///
    /// As [`spawn`](Command::spawn) and [`Child::wait_with_output`].
    pub async fn output(&mut self) -> Result<Output> {
        let stdin_piped = matches!(self.spec.stdio[0], Some(Stdio(StdioKind::Piped)));
        if stdin_piped || self.spec.pty.is_some() {
            return Child::from_parts(self.spawn_parts(StdioDefaults::Output).await?)?
                .wait_with_output()
                .await;
        }
        // The output pipes are made here, not by the zygote: nothing then
        // needs `Spawned`, which the zygote may skip for a short child.
        let saved = [self.spec.stdio[1].take(), self.spec.stdio[2].take()];
        let mut readers = [None, None];
        for (index, stdio) in saved.iter().enumerate() {
            if matches!(stdio, None | Some(Stdio(StdioKind::Piped))) {
                match output_pipe() {
                    Ok((read, write)) => {
                        readers[index] = Some(read);
                        self.spec.stdio[index + 1] = Some(Stdio::from(write));
                    }
                    Err(error) => {
                        let [stdout, stderr] = saved;
                        self.spec.stdio[1] = stdout;
                        self.spec.stdio[2] = stderr;
                        return Err(error);
                    }
                }
            }
        }
        let [stdout_reader, stderr_reader] = readers;
        let run = async {
            let started = self.start(StdioDefaults::Output, true).await;
            // Our write ends close here: the reads end with the child's.
            let [stdout, stderr] = saved;
            self.spec.stdio[1] = stdout;
            self.spec.stdio[2] = stderr;
            match started? {
                Started::Child(parts) => Child::from_parts(parts)?.wait().await,
                Started::Exited(notice) => Ok(ExitStatus::from(&notice)),
            }
        };
        let (status, stdout, stderr) = tokio::try_join!(
            run,
            read_all(stdout_reader, "stdout"),
            read_all(stderr_reader, "stderr"),
        )?;
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }

    /// Runs the child to completion with inherited stdio (unless set) and
    /// returns its exit status.
    ///
    /// Unless a stream is piped or a pty is set, the zygote answers a child
    /// that ends within 10 to 20 ms with its exit notice alone (no
    /// `Spawned`, no pidfd), which saves a wake-up. Should the zygote be
    /// lost within that window, the error is [`Error::ZygoteLost`] rather
    /// than a status read from the pidfd.
    ///
    /// # Errors
    ///
    /// As [`spawn`](Command::spawn) and [`Child::wait`].
    pub async fn status(&mut self) -> Result<ExitStatus> {
        // The reply is taken apart before the wait, so that this future
        // does not keep it as well as the child.
        let mut child = match self.start(StdioDefaults::Inherit, true).await? {
            Started::Child(parts) => Child::from_parts(parts)?,
            Started::Exited(notice) => return Ok(ExitStatus::from(&notice)),
        };
        child.wait().await
    }

    /// Sends the request and splits the reply into a child and its raw
    /// pipe ends; both flavours build on this.
    pub(crate) async fn spawn_parts(&self, defaults: StdioDefaults) -> Result<SpawnedParts> {
        match self.start(defaults, false).await? {
            Started::Child(parts) => Ok(parts),
            Started::Exited(_) => unreachable!("only a deferred spawn ends without Spawned"),
        }
    }

    /// Sends the request; with `defer`, and no pipe or pty to hand back,
    /// asks the zygote to skip `Spawned` for a child that ends at once (the
    /// caller only wants the status).
    pub(crate) async fn start(&self, defaults: StdioDefaults, defer: bool) -> Result<Started> {
        let (mut resent, mut stdio_checked, mut recreated) = (false, false, false);
        loop {
            let error = match self.start_once(defaults, defer).await {
                Ok(started) => return Ok(started),
                // Lost at the instant of sending: the request never left,
                // so it goes once more, on a new connection.
                Err(SpawnFailure::Unsent(_)) if !resent => {
                    resent = true;
                    continue;
                }
                Err(SpawnFailure::Unsent(error) | SpawnFailure::Failed(error)) => error,
            };
            // This process closed one of its fds 0 to 2: again, leaving
            // the closed ones out.
            if !stdio_checked && crate::request::retry_with_checked_stdio(&error) {
                stdio_checked = true;
                continue;
            }
            // The zygote stopped the template (idle, or every connection
            // of this uid closed, or it restarted): ask for the same
            // template once more, then spawn once more. Never a loop.
            if let Some(template) = &self.template
                && !recreated
                && template::is_unknown_template(&error)
            {
                recreated = true;
                template.create(&self.client).await?;
                continue;
            }
            return Err(error);
        }
    }

    async fn start_once(
        &self,
        defaults: StdioDefaults,
        defer: bool,
    ) -> std::result::Result<Started, SpawnFailure> {
        // Reconnects first when the connection was lost, so that the
        // limits are the new zygote's.
        let session = self.client.session().await?;
        self.check_before_sending(&session)?;
        let settings = self.client.process_settings();
        let snapshot = Snapshot::capture(self.spec.inherit_fds, settings)?;
        // Kept open until the request is sent.
        let large_args;
        // In a block, so that the prepared request is not kept in this
        // future across the wait (the request is encoded before it).
        let (request, attached, piped, deferred) = {
            let max_fds = session.limits().max_fds_per_frame as usize;
            let mut prepared = self.spec.prepare(&snapshot, defaults, max_fds)?;
            let frame_limit = session.limits().max_frame_bytes as usize;
            large_args = crate::request::move_large_args(&mut prepared.request, frame_limit)?;
            if let Some(memfd) = &large_args {
                prepared.attach(memfd.as_fd(), max_fds)?;
            }
            let Prepared {
                mut request,
                fds,
                piped,
            } = prepared;
            if self.template.is_some() {
                // The template is the program.
                request.program = Vec::new();
            }
            let deferred = defer && piped == [false; 3] && self.spec.pty.is_none();
            request.defer_spawned = deferred;
            (request, fds, piped, deferred)
        };
        let template = self.template.as_ref().map(|template| template.handle());
        let reply = session.spawn(request, &attached, template).await?;
        drop(large_args);
        self.started(session, reply, piped, deferred)
    }

    /// The child of a reply: its pidfd, pipe ends and pty taken from the
    /// fds in their order; a deferred child's early exit; or the error.
    fn started(
        &self,
        session: Arc<crate::client::Session>,
        reply: SpawnReply,
        piped: [bool; 3],
        deferred: bool,
    ) -> std::result::Result<Started, SpawnFailure> {
        let (spawn_id, pid, fds, exit, sandbox) = match reply {
            SpawnReply::Spawned {
                id,
                pid,
                fds,
                exit,
                sandbox,
            } => (id, pid, fds, exit, sandbox),
            SpawnReply::Exited(notice) if deferred => return Ok(Started::Exited(notice)),
            SpawnReply::Exited(notice) => {
                return Err(Error::Protocol {
                    endpoint: session.endpoint().to_owned(),
                    kind: ProtocolErrorKind::UnexpectedMessage,
                    message: format!(
                        "Exited without Spawned for {:?} (pid {}), which did not defer Spawned",
                        self.spec.program, notice.pid
                    ),
                }
                .into());
            }
            SpawnReply::Failed(failed) => {
                return Err(Error::Spawn {
                    program: self.spec.program.clone(),
                    stage: failed.stage,
                    errno: failed.errno,
                    message: failed.message,
                }
                .into());
            }
        };
        let with_pty = self.spec.pty.is_some();
        let expected = 1 + piped.iter().filter(|piped| **piped).count() + usize::from(with_pty);
        if fds.len() != expected {
            // Without all its fds the caller could not manage the child.
            if let Some(pidfd) = fds.first() {
                let _ = pidfd_send_signal(pidfd, Signal::KILL);
            }
            return Err(Error::Protocol {
                endpoint: session.endpoint().to_owned(),
                kind: ProtocolErrorKind::UnexpectedFds,
                message: format!(
                    "Spawned for {:?} (pid {pid}) carried {} fds, expected {expected} \
                     (the pidfd, one per piped stream, then a pty's master); the child was killed",
                    self.spec.program,
                    fds.len()
                ),
            }
            .into());
        }
        let mut fds = fds.into_iter();
        let pidfd = fds.next().expect("count checked above");
        let mut take = |wanted: bool| if wanted { fds.next() } else { None };
        let (stdin, stdout, stderr) = (take(piped[0]), take(piped[1]), take(piped[2]));
        let pty = take(with_pty);
        let pid = pid.unsigned_abs(); // the dispatcher only passes pid > 0
        Ok(Started::Child(SpawnedParts {
            core: ChildCore::new(session, spawn_id, pid, pidfd, exit)
                .kill_on_drop(self.spec.kill_on_drop)
                .kill_tree(self.spec.cgroup.is_some_and(|cgroup| cgroup.kill_tree))
                .confined_by(sandbox),
            stdin,
            stdout,
            stderr,
            pty,
        }))
    }
}

impl Command {
    /// Refuses what the zygote would not honour, before anything is sent:
    /// a sandbox it does not offer, and a template child it would refuse.
    fn check_before_sending(&self, session: &crate::client::Session) -> Result<()> {
        if let Some(template) = &self.template {
            self.check_template_child(session, template)?;
        }
        // Never sent to a zygote that would not enforce it (nor could
        // read it, in a version before 3).
        if self.spec.sandbox.is_some()
            && !session
                .features()
                .iter()
                .any(|name| name == crate::Feature::Sandbox.name())
        {
            return Err(Error::Spawn {
                program: self.spec.program.clone(),
                stage: zygote_proto::SpawnStage::Validate,
                errno: libc::EOPNOTSUPP,
                message: format!(
                    "this zygote does not offer the feature sandbox (it offers: {}; protocol \
                     version {}): the request was not sent",
                    offered(session.features()),
                    session.protocol_version()
                ),
            });
        }
        Ok(())
    }

    /// Refuses, before anything is sent, a template child the zygote would
    /// refuse: templates not offered, arguments that are not `-c CODE`,
    /// `-m MODULE` or a script, or a setting a forked child cannot take.
    fn check_template_child(
        &self,
        session: &crate::client::Session,
        template: &template::Shared,
    ) -> Result<()> {
        let refuse = |errno: i32, message: String| {
            Err(Error::Spawn {
                program: template.interpreter().to_owned(),
                stage: zygote_proto::SpawnStage::Validate,
                errno,
                message,
            })
        };
        if !session
            .features()
            .iter()
            .any(|name| name == crate::Feature::Templates.name())
        {
            return refuse(
                libc::EOPNOTSUPP,
                format!(
                    "this zygote does not offer the feature templates (it offers: {}; protocol                      version {}): the request was not sent",
                    offered(session.features()),
                    session.protocol_version()
                ),
            );
        }
        template::check_args(&self.spec.args)?;
        let unsupported = [
            (self.spec.argv0.is_some(), "argv[0] (arg0)"),
            (
                self.spec.uid.is_some() || self.spec.gid.is_some() || self.spec.groups.is_some(),
                "another user (uid, gid, groups)",
            ),
            (self.spec.sandbox.is_some(), "a sandbox"),
        ];
        for (set, what) in unsupported {
            if set {
                return refuse(
                    libc::EOPNOTSUPP,
                    format!(
                        "a template's child cannot take {what}: it is forked from the                          template, which runs as this peer, unconfined; use a cold spawn"
                    ),
                );
            }
        }
        Ok(())
    }
}

/// What a spawn request came to.
pub(crate) enum Started {
    /// The child exec'd and runs (or ran) on.
    Child(SpawnedParts),
    /// A deferred spawn's child ended before its `Spawned` was due.
    Exited(zygote_proto::ExitNotice),
}

/// A pipe for a child's output: the read end for tokio, the write end
/// (blocking, as a child expects) for the child. Both close-on-exec.
fn output_pipe() -> Result<(tokio::net::unix::pipe::Receiver, OwnedFd)> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|errno| Error::io("creating a pipe for the child's output", errno))?;
    // Known to be a pipe's read end: one FIONBIO instead of the checked
    // constructor's fstat and two fcntl.
    rustix::io::ioctl_fionbio(&read, true)
        .map_err(|errno| Error::io("making an output pipe non-blocking", errno))?;
    let read = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(read)
        .map_err(|error| Error::io("registering an output pipe with tokio", error))?;
    Ok((read, write))
}

/// The features a zygote offers, for a message.
pub(crate) fn offered(features: &[String]) -> String {
    if features.is_empty() {
        "none".to_owned()
    } else {
        features.join(", ")
    }
}
