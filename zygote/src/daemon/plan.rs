//! Checks a spawn request and builds everything the child needs before any
//! process exists, so that the child only applies data.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use rustix::io::Errno;
use rustix::pipe::{PipeFlags, pipe_with};
use rustix::pty::{OpenptFlags, ioctl_tiocgptpeer, openpt, unlockpt};
use rustix::termios::{Winsize, tcsetwinsize};
use zygote_proto::{Env, LargeArgs, PtySpec, SpawnRequest, SpawnStage, StdioSpec, Timeout};

use crate::daemon::peer::Peer;
use crate::daemon::sandbox::AppliedSandbox;
use crate::spawn::SpawnPlan;

/// `PATH` used when the request's environment has none, as `execvp` does.
const DEFAULT_PATH: &[u8] = b"/usr/local/bin:/usr/bin:/bin";

/// Highest fd number a mapping may ask for: the kernel's default `nr_open`.
const MAX_CHILD_FD: i32 = 1 << 20;

/// The kernel's `MAX_ARG_STRLEN`: no single argument or environment string
/// may be longer (32 pages of 4 KiB), or exec fails with `E2BIG`.
const MAX_ARG_STRLEN: usize = 32 * 4096;

/// CPUs an affinity list may name: the kernel's largest `NR_CPUS`.
const MAX_CPUS: u32 = 8192;

/// Seals a [`LargeArgs`] memfd must carry, so that its size and bytes are
/// fixed while the daemon reads it.
const LARGE_ARGS_SEALS: libc::c_int = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK;

/// A request refused before anything was created.
#[derive(Debug)]
pub struct Refusal {
    pub stage: SpawnStage,
    pub errno: Errno,
    pub message: String,
}

impl Refusal {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            stage: SpawnStage::Validate,
            errno: Errno::INVAL,
            message: message.into(),
        }
    }

    fn io(stage: SpawnStage, what: &str, error: std::io::Error) -> Self {
        Self {
            stage,
            errno: Errno::from_io_error(&error).unwrap_or(Errno::IO),
            message: format!("{what}: {error}"),
        }
    }
}

/// A checked request: the plan for the child, plus the client's ends of
/// the pipes to send back once the child runs.
pub struct Prepared {
    pub plan: SpawnPlan,
    /// The client's pipe ends, in stdin, stdout, stderr order, then the
    /// pseudo-terminal's master when one was asked for.
    pub client_ends: Vec<OwnedFd>,
    /// What to signal when the connection closes.
    pub on_close: Option<OnClose>,
    /// When to end the child.
    pub timeout: Option<Timeout>,
    /// The child leads a process group of its own (a new session, or
    /// `process_group` 0): its timeout signals that whole group.
    pub leads_own_group: bool,
    /// What confines the child, once its sandbox is resolved.
    pub sandbox: Option<AppliedSandbox>,
}

/// A checked kill-on-close request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnClose {
    /// The signal to send.
    pub signal: i32,
    /// Which process group to signal instead of the child alone.
    pub group: Option<Group>,
}

/// The process group the child will be in, when it is not the daemon's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// The child leads its own group (new session, or `process_group` 0).
    Own,
    /// The child joined this existing group.
    Joined(i32),
}

fn c_string(what: &str, bytes: &[u8]) -> Result<CString, Refusal> {
    CString::new(bytes).map_err(|_| Refusal::invalid(format!("{what} contains a NUL byte")))
}

/// Checks `request` against the fds that came with it and prepares the
/// child's argv, environment, exec candidates and fd table. The request's
/// args, environment and rlimits move into the plan (they are left empty).
///
/// Every attached fd must be used; unused ones are refused (and closed by
/// the caller dropping them) so that a client cannot park fds here.
///
/// `Null` streams get fds on `dev_null`, the connection's `/dev/null`.
///
/// argv plus environment larger than `max_argv_env_bytes`, or any one
/// string longer than the kernel's `MAX_ARG_STRLEN`, is refused with
/// `E2BIG`, as exec would. A request's [`LargeArgs`] memfd is read here
/// (it must be sealed, and no larger than the limit allows).
pub fn prepare(
    request: &mut SpawnRequest,
    attached: Vec<OwnedFd>,
    max_argv_env_bytes: usize,
    dev_null: &DevNull,
) -> Result<Prepared, Refusal> {
    if request.program.is_empty() {
        return Err(Refusal::invalid("program is empty"));
    }
    check_deferral(request)?;
    let mut fds = FdTable::new(attached);
    let (args, env) = take_args_and_env(request, &mut fds, max_argv_env_bytes)?;
    let rlimits = std::mem::take(&mut request.rlimits);
    let request = &*request;
    check_size(request, &args, &env, max_argv_env_bytes)?;
    check_user(request)?;
    let on_close = check_on_close(request)?;
    check_timeout(request)?;
    let program = c_string("program", &request.program)?;
    let argv = build_argv(request, &program, args)?;
    let path_var = check_env(&env)?;
    let exec_candidates = exec_candidates(&request.program, path_var.unwrap_or(DEFAULT_PATH))?;
    let envp = env;
    let cwd = request
        .cwd
        .as_deref()
        .map(|cwd| c_string("working directory", cwd))
        .transpose()?;

    let attributes = check_attributes(request)?;
    let terminal = match request.pty {
        Some(pty) => Some(open_terminal(request, pty)?),
        None => None,
    };
    let mut client_ends = place_stdio(request, &mut fds, terminal.as_ref(), dev_null)?;
    place_mappings(request, &mut fds)?;
    let fds = fds.finish()?;
    if let Some(terminal) = terminal {
        client_ends.push(terminal.master);
    }

    Ok(Prepared {
        plan: SpawnPlan {
            exec_candidates,
            argv,
            envp,
            cwd,
            fds,
            new_session: request.new_session || request.pty.is_some(),
            controlling_terminal: request.pty.is_some(),
            process_group: request.process_group,
            umask: request.umask,
            rlimits,
            credentials: None,
            cgroup: None,
            ignored_signals: request.ignored_signals,
            nice: request.nice,
            cpu_affinity: attributes,
            oom_score_adj: request.oom_score_adj,
            sandbox: None,
        },
        client_ends,
        on_close,
        timeout: request.timeout,
        leads_own_group: leads_own_group(request),
        sandbox: None,
    })
}

/// The child's `argv[1..]` and environment: read from the request's
/// [`LargeArgs`] memfd when it names one (taken from `fds`), else moved
/// out of the request.
fn take_args_and_env(
    request: &mut SpawnRequest,
    fds: &mut FdTable,
    max_argv_env_bytes: usize,
) -> Result<(Vec<Vec<u8>>, Env), Refusal> {
    match request.large_args {
        Some(index) => {
            if !request.args.is_empty() || !request.env.is_empty() {
                return Err(Refusal::invalid(
                    "large_args is set: args and env must come in the memfd alone",
                ));
            }
            let memfd = fds.take_attached(index)?;
            let large = read_large_args(&memfd, max_argv_env_bytes)?;
            Ok((large.args, large.env))
        }
        // Moved: the environment's buffer becomes the child's `envp`.
        None => Ok((
            std::mem::take(&mut request.args),
            std::mem::take(&mut request.env),
        )),
    }
}

/// Refuses id -1 as a uid, gid or group.
fn check_user(request: &SpawnRequest) -> Result<(), Refusal> {
    if let Some(user) = &request.user {
        // -1 tells setresuid/setresgid "leave unchanged": the child would
        // keep the daemon's id.
        let ids = [user.uid, user.gid]
            .into_iter()
            .chain(user.groups.iter().copied());
        if ids.into_iter().any(|id| id == u32::MAX) {
            return Err(Refusal::invalid(
                "user: id 4294967295 (-1) is not a valid uid or gid",
            ));
        }
    }
    Ok(())
}

fn check_timeout(request: &SpawnRequest) -> Result<(), Refusal> {
    if let Some(timeout) = request.timeout {
        if timeout.millis == 0 {
            return Err(Refusal::invalid("timeout of 0 ms: give at least 1 ms"));
        }
    }
    Ok(())
}

/// `argv`: `argv0` (else the program), then `args`.
fn build_argv(
    request: &SpawnRequest,
    program: &CString,
    args: Vec<Vec<u8>>,
) -> Result<Vec<CString>, Refusal> {
    let mut argv = Vec::with_capacity(args.len() + 1);
    argv.push(match &request.argv0 {
        Some(argv0) => c_string("argv0", argv0)?,
        None => program.clone(),
    });
    for (index, arg) in args.into_iter().enumerate() {
        // The received bytes become the string: no copy.
        argv.push(CString::new(arg).map_err(|_| {
            Refusal::invalid(format!("argument {} contains a NUL byte", index + 1))
        })?);
    }
    Ok(argv)
}

/// Checks the environment for NUL bytes and returns its `PATH`, if any.
///
/// The environment is used as received: each variable is already
/// `KEY=VALUE\0` in one buffer, which the child's `envp` points into. A
/// key may be empty or hold `=` (inherited entries such as `=A=B`): the
/// child sees the entry as sent. `PATH` is what the child's own
/// `getenv("PATH")` finds: the first entry that starts with `PATH=`.
fn check_env(env: &Env) -> Result<Option<&[u8]>, Refusal> {
    let mut path_var = None;
    for ((key, value), entry) in env.iter().zip(env.entries()) {
        if key.contains(&0) || value.contains(&0) {
            return Err(Refusal::invalid("environment contains a NUL byte"));
        }
        if path_var.is_none() {
            path_var = entry
                .strip_prefix(b"PATH=")
                .and_then(|rest| rest.strip_suffix(b"\0"));
        }
    }
    Ok(path_var)
}

/// Places the child's fds 0, 1 and 2: the terminal's slave on all three
/// when there is one, else each as its [`StdioSpec`] says. Returns the
/// client's ends of the pipes, in stdin, stdout, stderr order.
fn place_stdio(
    request: &SpawnRequest,
    fds: &mut FdTable,
    terminal: Option<&Terminal>,
    dev_null: &DevNull,
) -> Result<Vec<OwnedFd>, Refusal> {
    let mut client_ends = Vec::new();
    for (child_fd, spec) in [request.stdin, request.stdout, request.stderr]
        .into_iter()
        .enumerate()
    {
        if let Some(terminal) = terminal {
            let slave = terminal.slave.try_clone().map_err(|error| {
                Refusal::io(SpawnStage::Dup, "failed to duplicate the terminal", error)
            })?;
            fds.place(slave, child_fd as RawFd);
            continue;
        }
        let child_fd = child_fd as RawFd;
        let source = match spec {
            StdioSpec::Null => dev_null.get()?,
            StdioSpec::Fd(index) => {
                fds.place_attached(index, child_fd)?;
                continue;
            }
            StdioSpec::Pipe => {
                let (read, write) = pipe_with(PipeFlags::CLOEXEC).map_err(|errno| Refusal {
                    stage: SpawnStage::Pipe,
                    errno,
                    message: format!("failed to create a pipe: {errno}"),
                })?;
                if child_fd == 0 {
                    client_ends.push(write);
                    read
                } else {
                    client_ends.push(read);
                    write
                }
            }
        };
        fds.place(source, child_fd);
    }
    Ok(client_ends)
}

/// Places the attached fds the request maps to child fds 3 and up, each
/// target once.
fn place_mappings(request: &SpawnRequest, fds: &mut FdTable) -> Result<(), Refusal> {
    let mut targets = HashSet::new();
    for mapping in &request.fd_mappings {
        if !(3..=MAX_CHILD_FD).contains(&mapping.child_fd) {
            return Err(Refusal::invalid(format!(
                "fd mapping targets fd {}, outside 3..={MAX_CHILD_FD}",
                mapping.child_fd
            )));
        }
        if !targets.insert(mapping.child_fd) {
            return Err(Refusal::invalid(format!(
                "fd {} is mapped twice",
                mapping.child_fd
            )));
        }
        fds.place_attached(mapping.attached_index, mapping.child_fd)?;
    }
    Ok(())
}

fn leads_own_group(request: &SpawnRequest) -> bool {
    request.new_session || request.pty.is_some() || request.process_group == Some(0)
}

/// Both ends of a new pseudo-terminal.
struct Terminal {
    master: OwnedFd,
    slave: OwnedFd,
}

/// A deferred `Spawned` may never be sent: nothing the client needs may
/// travel in it but the pidfd.
fn check_deferral(request: &SpawnRequest) -> Result<(), Refusal> {
    if !request.defer_spawned {
        return Ok(());
    }
    if request.pty.is_some() {
        return Err(Refusal::invalid(
            "defer_spawned with a pty: the terminal's master only travels in Spawned",
        ));
    }
    let stdio = [request.stdin, request.stdout, request.stderr];
    if stdio.contains(&StdioSpec::Pipe) {
        return Err(Refusal::invalid(
            "defer_spawned with a Pipe stdio: the pipe's client end only travels in Spawned; \
             attach a pipe of your own as Fd instead",
        ));
    }
    Ok(())
}

/// Opens a pseudo-terminal of the requested size, both ends close-on-exec
/// and neither becoming the daemon's controlling terminal.
///
/// The slave is opened through the master (`TIOCGPTPEER`, Linux 4.13), not
/// by its `/dev/pts` path, which may not be this pty's in our mount
/// namespace.
fn open_terminal(request: &SpawnRequest, pty: PtySpec) -> Result<Terminal, Refusal> {
    if [request.stdin, request.stdout, request.stderr] != [StdioSpec::Null; 3] {
        return Err(Refusal::invalid(
            "a pty request puts the terminal on fds 0 to 2: stdin, stdout and stderr must be Null",
        ));
    }
    let failed = |what: &str, errno: Errno| Refusal {
        stage: SpawnStage::Pipe,
        errno,
        message: format!("failed to {what}: {errno}"),
    };
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = openpt(flags).map_err(|errno| failed("open /dev/ptmx", errno))?;
    unlockpt(&master).map_err(|errno| failed("unlock a pseudo-terminal", errno))?;
    let slave = ioctl_tiocgptpeer(&master, flags)
        .map_err(|errno| failed("open a pseudo-terminal's slave", errno))?;
    let size = Winsize {
        ws_row: pty.window.rows,
        ws_col: pty.window.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    tcsetwinsize(&master, size).map_err(|errno| failed("set a terminal's size", errno))?;
    Ok(Terminal { master, slave })
}

/// Checks the nice value, OOM score adjustment and CPU list; returns the
/// CPU list as `sched_setaffinity(2)`'s mask words (empty: unchanged).
fn check_attributes(request: &SpawnRequest) -> Result<Vec<u64>, Refusal> {
    if let Some(nice) = request.nice.filter(|nice| !(-20..=19).contains(nice)) {
        return Err(Refusal::invalid(format!(
            "nice value {nice} is outside -20..=19"
        )));
    }
    if let Some(adj) = request
        .oom_score_adj
        .filter(|adj| !(-1000..=1000).contains(adj))
    {
        return Err(Refusal::invalid(format!(
            "oom_score_adj {adj} is outside -1000..=1000"
        )));
    }
    let mut mask = Vec::new();
    for &cpu in &request.cpu_affinity {
        if cpu >= MAX_CPUS {
            return Err(Refusal::invalid(format!(
                "cpu_affinity names CPU {cpu}, beyond the kernel's limit of {MAX_CPUS}"
            )));
        }
        let word = (cpu / 64) as usize;
        if mask.len() <= word {
            mask.resize(word + 1, 0u64);
        }
        mask[word] |= 1 << (cpu % 64);
    }
    Ok(mask)
}

/// Keeps a peer without the privilege from giving its child a lower nice
/// value (`CAP_SYS_NICE`) or OOM score adjustment (`CAP_SYS_RESOURCE`)
/// than its own when it connected: such a request gets the peer's own, as
/// `nice -n -5` run by a user still runs the command at the user's nice.
pub fn apply_peer_floor(plan: &mut SpawnPlan, peer: &Peer) {
    if let Some(nice) = plan.nice.as_mut().filter(|_| !peer.can_nice) {
        *nice = (*nice).max(peer.nice);
    }
    if let Some(adj) = plan
        .oom_score_adj
        .as_mut()
        .filter(|_| !peer.can_raise_limits)
    {
        *adj = (*adj).max(peer.oom_score_adj);
    }
}

/// Reads and decodes a request's [`LargeArgs`] memfd: refused unless it
/// is sealed against writing, growing and shrinking (a plain file, pipe
/// or socket could change under us or block this thread), and no larger
/// than `limit` allows.
fn read_large_args(memfd: &OwnedFd, limit: usize) -> Result<LargeArgs, Refusal> {
    let seals = rustix::fs::fcntl_get_seals(memfd)
        .map_err(|_| Refusal::invalid("large_args fd is not a memfd (it has no seals)"))?;
    if (seals.bits() as libc::c_int) & LARGE_ARGS_SEALS != LARGE_ARGS_SEALS {
        return Err(Refusal::invalid(
            "large_args memfd must be sealed with F_SEAL_WRITE, F_SEAL_GROW and F_SEAL_SHRINK",
        ));
    }
    let file = File::from(memfd.try_clone().map_err(|error| {
        Refusal::io(
            SpawnStage::Validate,
            "failed to duplicate the large_args memfd",
            error,
        )
    })?);
    let size = file
        .metadata()
        .map_err(|error| {
            Refusal::io(
                SpawnStage::Validate,
                "failed to stat the large_args memfd",
                error,
            )
        })?
        .len();
    // The encoding takes fewer bytes per string (a length of at most 3
    // bytes) than the kernel's count (a NUL and a pointer).
    let most = limit.saturating_add(64 * 1024) as u64;
    if size > most {
        return Err(Refusal {
            stage: SpawnStage::Validate,
            errno: Errno::TOOBIG,
            message: format!(
                "argv and environment take at least {size} bytes, over this zygote's limit of {limit}"
            ),
        });
    }
    let mut bytes = vec![0; size as usize];
    file.read_exact_at(&mut bytes, 0).map_err(|error| {
        Refusal::io(
            SpawnStage::Validate,
            "failed to read the large_args memfd",
            error,
        )
    })?;
    zygote_proto::decode(&bytes)
        .map_err(|error| Refusal::invalid(format!("large_args memfd does not decode: {error}")))
}

/// Refuses argv plus environment beyond the limit, counted as the kernel
/// counts them: each string with its NUL, plus a pointer for each.
fn check_size(
    request: &SpawnRequest,
    args: &[Vec<u8>],
    env: &Env,
    limit: usize,
) -> Result<(), Refusal> {
    let argv0 = request.argv0.as_ref().unwrap_or(&request.program);
    let strings = std::iter::once(argv0.len())
        .chain(args.iter().map(Vec::len))
        .chain(env.iter().map(|(key, value)| key.len() + 1 + value.len()));
    let mut total: usize = 0;
    for len in strings {
        if len > MAX_ARG_STRLEN {
            return Err(Refusal {
                stage: SpawnStage::Validate,
                errno: Errno::TOOBIG,
                message: format!(
                    "an argument or environment string of {len} bytes exceeds the kernel's \
                     limit of {MAX_ARG_STRLEN} bytes per string"
                ),
            });
        }
        total = total.saturating_add(len + 1 + size_of::<usize>());
    }
    if total > limit {
        return Err(Refusal {
            stage: SpawnStage::Validate,
            errno: Errno::TOOBIG,
            message: format!(
                "argv and environment take {total} bytes, over this zygote's limit of {limit}"
            ),
        });
    }
    Ok(())
}

fn check_on_close(request: &SpawnRequest) -> Result<Option<OnClose>, Refusal> {
    let Some(kill) = request.kill_on_close else {
        return Ok(None);
    };
    if !(1..=libc::SIGRTMAX()).contains(&kill.signal) {
        return Err(Refusal::invalid(format!(
            "kill_on_close signal {} is not a signal number",
            kill.signal
        )));
    }
    let group = if !kill.process_group {
        None
    } else if leads_own_group(request) {
        Some(Group::Own)
    } else if let Some(pgid) = request.process_group.filter(|pgid| *pgid > 0) {
        Some(Group::Joined(pgid))
    } else {
        // Its group would be the daemon's own.
        return Err(Refusal::invalid(
            "kill_on_close of the process group needs the child in its own group: \
             set new_session or process_group",
        ));
    };
    Ok(Some(OnClose {
        signal: kill.signal,
        group,
    }))
}

/// The paths to try with `execve`, in order, as `execvp` would.
fn exec_candidates(program: &[u8], path: &[u8]) -> Result<Vec<CString>, Refusal> {
    if program.contains(&b'/') {
        return Ok(vec![c_string("program", program)?]);
    }
    path.split(|&byte| byte == b':')
        .map(|dir| {
            // An empty PATH entry means the working directory.
            let dir = if dir.is_empty() { b".".as_slice() } else { dir };
            let mut full = Vec::with_capacity(dir.len() + 1 + program.len());
            full.extend_from_slice(dir);
            full.push(b'/');
            full.extend_from_slice(program);
            c_string("PATH entry", &full)
        })
        .collect()
}

/// The `/dev/null` behind one connection's `Null` streams: opened at the
/// first, then duplicated for each (a dup costs about a fifth of an open,
/// which allocates and sets up a new file), so that the streams of all of
/// that client's children share one open file description, as children
/// that inherit their parent's stdio do.
#[derive(Debug, Default)]
pub struct DevNull(OnceLock<OwnedFd>);

impl DevNull {
    /// A new fd on this connection's `/dev/null`, close-on-exec.
    fn get(&self) -> Result<OwnedFd, Refusal> {
        let fd = match self.0.get() {
            Some(fd) => fd,
            None => {
                // Another spawn task may set it first: then ours closes.
                let _ = self.0.set(open_dev_null()?);
                self.0.get().expect("just set")
            }
        };
        fd.try_clone()
            .map_err(|error| Refusal::io(SpawnStage::Pipe, "failed to duplicate /dev/null", error))
    }
}

fn open_dev_null() -> Result<OwnedFd, Refusal> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|error| Refusal::io(SpawnStage::Pipe, "failed to open /dev/null", error))
}

/// The attached fds, handed out by index. The first use of an index
/// moves the received fd itself; a later use gets a duplicate of it, so
/// that e.g. stdout and stderr can share one fd without a dup per spawn.
/// `FdTable::placed_at` of an fd the daemon took for itself: used, never
/// placed.
const TAKEN: usize = usize::MAX;

struct FdTable {
    attached: Vec<Option<OwnedFd>>,
    /// Where in `placed` each attached fd went on its first use.
    placed_at: Vec<Option<usize>>,
    placed: Vec<(OwnedFd, RawFd)>,
}

impl FdTable {
    fn new(attached: Vec<OwnedFd>) -> Self {
        Self {
            placed_at: vec![None; attached.len()],
            attached: attached.into_iter().map(Some).collect(),
            placed: Vec::with_capacity(3),
        }
    }

    /// Takes an attached fd for the daemon's own use (not the child's).
    fn take_attached(&mut self, index: u32) -> Result<OwnedFd, Refusal> {
        let slot = index as usize;
        match self.attached.get_mut(slot).and_then(Option::take) {
            Some(fd) => {
                self.placed_at[slot] = Some(TAKEN);
                Ok(fd)
            }
            None => Err(Refusal::invalid(format!(
                "request refers to attached fd #{index} for large_args, but the frame carries {} \
                 (or the fd is used twice)",
                self.attached.len()
            ))),
        }
    }

    fn place_attached(&mut self, index: u32, child_fd: RawFd) -> Result<(), Refusal> {
        let slot = index as usize;
        if slot >= self.attached.len() {
            return Err(Refusal::invalid(format!(
                "request refers to attached fd #{index}, but the frame carries {}",
                self.attached.len()
            )));
        }
        let fd = match (self.attached[slot].take(), self.placed_at[slot]) {
            (Some(fd), _) => fd,
            (None, Some(TAKEN)) => {
                return Err(Refusal::invalid(format!(
                    "attached fd #{index} is the large_args memfd; it cannot also go to the child"
                )));
            }
            (None, Some(first)) => self.placed[first].0.try_clone().map_err(|error| {
                Refusal::io(SpawnStage::Dup, "failed to duplicate an fd", error)
            })?,
            (None, None) => unreachable!("an attached fd leaves the table only to be placed"),
        };
        self.placed_at[slot].get_or_insert(self.placed.len());
        self.place(fd, child_fd);
        Ok(())
    }

    fn place(&mut self, fd: OwnedFd, child_fd: RawFd) {
        self.placed.push((fd, child_fd));
    }

    fn finish(self) -> Result<Vec<(OwnedFd, RawFd)>, Refusal> {
        if let Some(unused) = self.placed_at.iter().position(Option::is_none) {
            return Err(Refusal::invalid(format!(
                "attached fd #{unused} is not referenced by stdio or any fd mapping"
            )));
        }
        Ok(self.placed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zygote_proto::{EnvVar, FdMapping};

    fn request() -> SpawnRequest {
        SpawnRequest::new(1, "true")
    }

    fn prepare(request: &SpawnRequest, attached: Vec<OwnedFd>) -> Result<Prepared, Refusal> {
        super::prepare(
            &mut request.clone(),
            attached,
            192 * 1024,
            &DevNull::default(),
        )
    }

    fn refusal(request: &SpawnRequest, attached: Vec<OwnedFd>) -> Refusal {
        match prepare(request, attached) {
            Ok(_) => panic!("request was accepted"),
            Err(refusal) => refusal,
        }
    }

    #[test]
    fn path_lookup_uses_the_request_environment() {
        let mut request = request();
        request.env = vec![EnvVar {
            key: b"PATH".to_vec(),
            value: b"/opt/a::/usr/bin".to_vec(),
        }]
        .into();
        let prepared = prepare(&request, vec![]).expect("valid request");
        let candidates: Vec<_> = prepared
            .plan
            .exec_candidates
            .iter()
            .map(|c| c.to_bytes().to_vec())
            .collect();
        assert_eq!(
            candidates,
            vec![
                b"/opt/a/true".to_vec(),
                b"./true".to_vec(),
                b"/usr/bin/true".to_vec()
            ]
        );
        assert_eq!(prepared.plan.argv[0].to_bytes(), b"true");
        let entries: Vec<_> = prepared.plan.envp.entries().collect();
        assert_eq!(entries, [b"PATH=/opt/a::/usr/bin\0"]);
    }

    #[test]
    fn program_with_slash_is_not_looked_up() {
        let mut request = request();
        request.program = b"./x".to_vec();
        let prepared = prepare(&request, vec![]).expect("valid request");
        assert_eq!(prepared.plan.exec_candidates.len(), 1);
    }

    #[test]
    fn interior_nul_is_refused() {
        let mut request = request();
        request.args = vec![b"a\0b".to_vec()];
        let refused = refusal(&request, vec![]);
        assert_eq!(refused.stage, SpawnStage::Validate);
        assert!(
            refused.message.contains("argument 1"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_nul_in_the_environment_is_refused() {
        for (key, value) in [(&b"K"[..], &b"a\0b"[..]), (b"K\0", b"v"), (b"\0", b"")] {
            let mut request = request();
            request.env.push(b"OK", b"1");
            request.env.push(key, value);
            let refused = refusal(&request, vec![]);
            assert_eq!(
                (refused.stage, refused.errno),
                (SpawnStage::Validate, Errno::INVAL)
            );
            assert!(refused.message.contains("NUL"), "{}", refused.message);
        }
    }

    /// Inherited environments hold entries such as `=A=B`, which clients
    /// send as key `""` or `=A`: each reaches the child as `KEY=VALUE`.
    #[test]
    fn empty_keys_and_keys_with_equals_signs_are_kept() {
        let mut request = request();
        for (key, value) in [
            (&b""[..], &b"A=B"[..]),
            (b"=A", b"B"),
            (b"", b""),
            (b"C=D", b"e"),
            (b"OK", b"1"),
        ] {
            request.env.push(key, value);
        }
        let prepared = prepare(&request, vec![]).expect("valid request");
        let entries: Vec<_> = prepared.plan.envp.entries().collect();
        assert_eq!(
            entries,
            [&b"=A=B\0"[..], b"=A=B\0", b"=\0", b"C=D=e\0", b"OK=1\0"]
        );
    }

    /// The lookup uses the `PATH` the child's `getenv` finds: the first
    /// entry that starts with `PATH=`, whatever the key's split.
    #[test]
    fn path_lookup_uses_the_first_path_entry_the_child_sees() {
        for (vars, expected) in [
            (
                &[(&b"PATH"[..], &b"/first"[..]), (b"PATH", b"/second")][..],
                &b"/first/true"[..],
            ),
            (&[(b"PATH=/a", b"b"), (b"PATH", b"/c")], b"/a=b/true"),
            (
                &[(b"=PATH", b"/x"), (b"", b"PATH=/y")],
                b"/usr/local/bin/true",
            ),
        ] {
            let mut request = request();
            for (key, value) in vars {
                request.env.push(key, value);
            }
            let prepared = prepare(&request, vec![]).expect("valid request");
            assert_eq!(prepared.plan.exec_candidates[0].to_bytes(), expected);
        }
    }

    #[test]
    fn bad_fd_mappings_are_refused() {
        for child_fd in [-1, 0, 2, MAX_CHILD_FD + 1] {
            let mut request = request();
            request.fd_mappings = vec![FdMapping {
                attached_index: 0,
                child_fd,
            }];
            let fd = open_dev_null().expect("open /dev/null");
            assert_eq!(refusal(&request, vec![fd]).errno, Errno::INVAL);
        }
        let mut request = request();
        request.stdout = StdioSpec::Fd(3);
        assert!(refusal(&request, vec![]).message.contains("#3"));
    }

    #[test]
    fn null_streams_share_their_connection_dev_null() {
        use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
        let prepare_with = |dev_null: &DevNull| {
            super::prepare(&mut request(), vec![], 192 * 1024, dev_null).expect("valid request")
        };
        let connection = DevNull::default();
        let first = prepare_with(&connection);
        let second = prepare_with(&connection);
        let elsewhere = prepare_with(&DevNull::default());
        let targets: Vec<_> = first.plan.fds.iter().map(|(_, target)| *target).collect();
        assert_eq!(targets, [0, 1, 2]);
        // Status flags belong to the open file description: one set through
        // one fd shows through every fd that shares it.
        fcntl_setfl(&first.plan.fds[0].0, OFlags::APPEND).expect("F_SETFL");
        for (fd, target) in first.plan.fds.iter().chain(&second.plan.fds) {
            let flags = fcntl_getfl(fd).expect("F_GETFL");
            assert!(flags.contains(OFlags::APPEND), "fd for {target}: {flags:?}");
            assert!(flags.contains(OFlags::RDWR), "fd for {target}: {flags:?}");
        }
        for (fd, target) in &elsewhere.plan.fds {
            let flags = fcntl_getfl(fd).expect("F_GETFL");
            assert!(
                !flags.contains(OFlags::APPEND),
                "another connection's fd for {target}"
            );
        }
    }

    #[test]
    fn unused_attached_fd_is_refused() {
        let fd = open_dev_null().expect("open /dev/null");
        let refused = refusal(&request(), vec![fd]);
        assert!(
            refused.message.contains("not referenced"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn id_minus_one_is_refused() {
        for (uid, gid, groups) in [
            (u32::MAX, 1, vec![]),
            (1, u32::MAX, vec![]),
            (1, 1, vec![u32::MAX]),
        ] {
            let mut request = request();
            request.user = Some(zygote_proto::UserSpec { uid, gid, groups });
            assert!(refusal(&request, vec![]).message.contains("-1"));
        }
    }

    #[test]
    fn huge_argv_or_env_is_e2big() {
        let mut request = request();
        request.env = vec![EnvVar {
            key: b"BIG".to_vec(),
            value: vec![b'x'; MAX_ARG_STRLEN],
        }]
        .into();
        let refused = refusal(&request, vec![]);
        assert_eq!(
            (refused.stage, refused.errno),
            (SpawnStage::Validate, Errno::TOOBIG)
        );
        let mut request = self::request();
        request.args = vec![vec![b'a'; 1000]; 200];
        let refused = refusal(&request, vec![]);
        assert_eq!(refused.errno, Errno::TOOBIG);
        assert!(refused.message.contains("limit"), "{}", refused.message);
        request.args.truncate(150);
        assert!(prepare(&request, vec![]).is_ok());
    }

    #[test]
    fn kill_on_close_of_a_group_needs_an_own_group() {
        use zygote_proto::KillOnClose;
        let mut request = request();
        request.kill_on_close = Some(KillOnClose {
            signal: libc::SIGKILL,
            process_group: true,
        });
        assert_eq!(refusal(&request, vec![]).errno, Errno::INVAL);
        request.process_group = Some(0);
        let prepared = prepare(&request, vec![]).expect("own group");
        assert_eq!(prepared.on_close.unwrap().group, Some(Group::Own));
        request.kill_on_close = Some(KillOnClose {
            signal: 0,
            process_group: false,
        });
        assert!(refusal(&request, vec![]).message.contains("signal"));
    }

    #[test]
    fn an_fd_used_twice_is_moved_once_and_duplicated_once() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;

        let (read, write) = pipe_with(PipeFlags::CLOEXEC).expect("pipe");
        let received = write.as_raw_fd();
        let mut request = request();
        request.stdout = StdioSpec::Fd(0);
        request.stderr = StdioSpec::Fd(0);
        let prepared = prepare(&request, vec![write]).expect("valid request");
        let placed: Vec<(RawFd, RawFd)> = prepared
            .plan
            .fds
            .iter()
            .map(|(fd, target)| (fd.as_raw_fd(), *target))
            .collect();
        // stdout takes the received fd itself; stderr gets a new fd.
        assert_eq!(placed[1], (received, 1));
        assert_eq!(placed[2].1, 2);
        assert_ne!(placed[2].0, received);
        // Both write into the one pipe.
        let mut plan = prepared.plan;
        for (fd, target) in plan.fds.drain(1..) {
            let mut file = std::fs::File::from(fd);
            file.write_all(&[b'0' + target as u8]).expect("write");
        }
        drop(plan);
        let mut file = std::fs::File::from(read);
        let mut got = String::new();
        file.read_to_string(&mut got).expect("read");
        assert_eq!(got, "12");
    }

    fn sealed_memfd(bytes: &[u8], seals: rustix::fs::SealFlags) -> OwnedFd {
        use rustix::fs::{MemfdFlags, memfd_create};
        use std::io::Write;
        let memfd = memfd_create("test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .expect("memfd_create");
        let mut file = File::from(memfd);
        file.write_all(bytes).expect("write");
        let memfd = OwnedFd::from(file);
        rustix::fs::fcntl_add_seals(&memfd, seals).expect("seal");
        memfd
    }

    #[test]
    fn large_args_come_from_a_sealed_memfd() {
        use rustix::fs::SealFlags;
        let large = LargeArgs {
            args: vec![b"one".to_vec(), b"two".to_vec()],
            env: vec![EnvVar {
                key: b"K".to_vec(),
                value: b"v".to_vec(),
            }]
            .into(),
        };
        let bytes = zygote_proto::encode(&large).expect("encode");
        let all = SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK;
        let mut request = request();
        request.large_args = Some(0);
        let prepared = prepare(&request, vec![sealed_memfd(&bytes, all)]).expect("valid");
        let argv: Vec<_> = prepared.plan.argv.iter().map(|a| a.to_bytes()).collect();
        assert_eq!(argv, [&b"true"[..], b"one", b"two"]);
        assert_eq!(prepared.plan.envp.get(0), Some((&b"K"[..], &b"v"[..])));
        // The memfd is not the child's.
        assert_eq!(prepared.plan.fds.len(), 3);

        // Unsealed, or a pipe: refused, never read.
        let refused = refusal(&request, vec![sealed_memfd(&bytes, SealFlags::GROW)]);
        assert!(refused.message.contains("sealed"), "{}", refused.message);
        let (read, _write) = pipe_with(PipeFlags::CLOEXEC).expect("pipe");
        let refused = refusal(&request, vec![read]);
        assert!(
            refused.message.contains("not a memfd"),
            "{}",
            refused.message
        );
        // Also used as stdio: refused.
        request.stdout = StdioSpec::Fd(0);
        let refused = refusal(&request, vec![sealed_memfd(&bytes, all)]);
        assert!(
            refused.message.contains("large_args"),
            "{}",
            refused.message
        );
        // Over the limit: E2BIG, like the kernel.
        let mut request = self::request();
        request.large_args = Some(0);
        let huge = LargeArgs {
            args: vec![vec![b'a'; 1000]; 400],
            env: Default::default(),
        };
        let bytes = zygote_proto::encode(&huge).expect("encode");
        let refused = refusal(&request, vec![sealed_memfd(&bytes, all)]);
        assert_eq!(refused.errno, Errno::TOOBIG);
    }

    #[test]
    fn attributes_are_checked_and_carried() {
        let mut request = request();
        request.nice = Some(7);
        request.oom_score_adj = Some(300);
        request.cpu_affinity = vec![0, 65];
        request.ignored_signals = 1;
        let plan = prepare(&request, vec![]).expect("valid").plan;
        assert_eq!(plan.nice, Some(7));
        assert_eq!(plan.oom_score_adj, Some(300));
        assert_eq!(plan.cpu_affinity, vec![1, 2]);
        assert_eq!(plan.ignored_signals, 1);
        for bad in [
            SpawnRequest {
                nice: Some(20),
                ..self::request()
            },
            SpawnRequest {
                oom_score_adj: Some(-1001),
                ..self::request()
            },
            SpawnRequest {
                cpu_affinity: vec![MAX_CPUS],
                ..self::request()
            },
        ] {
            assert_eq!(refusal(&bad, vec![]).errno, Errno::INVAL);
        }
    }

    #[test]
    fn an_unprivileged_peer_gets_no_lower_nice_or_oom_score_adj_than_its_own() {
        let mut peer = Peer {
            pid: 1,
            uid: 1000,
            gid: 1000,
            groups: vec![],
            hard_limits: vec![],
            can_setid: false,
            can_raise_limits: false,
            nice: 5,
            can_nice: false,
            oom_score_adj: 200,
        };
        let mut request = request();
        request.nice = Some(-10);
        request.oom_score_adj = Some(-500);
        let mut plan = prepare(&request, vec![]).expect("valid").plan;
        apply_peer_floor(&mut plan, &peer);
        assert_eq!((plan.nice, plan.oom_score_adj), (Some(5), Some(200)));
        // Higher is always allowed.
        request.nice = Some(10);
        request.oom_score_adj = Some(900);
        let mut plan = prepare(&request, vec![]).expect("valid").plan;
        apply_peer_floor(&mut plan, &peer);
        assert_eq!((plan.nice, plan.oom_score_adj), (Some(10), Some(900)));
        // With the capabilities, as asked.
        peer.can_nice = true;
        peer.can_raise_limits = true;
        request.nice = Some(-10);
        request.oom_score_adj = Some(-500);
        let mut plan = prepare(&request, vec![]).expect("valid").plan;
        apply_peer_floor(&mut plan, &peer);
        assert_eq!((plan.nice, plan.oom_score_adj), (Some(-10), Some(-500)));
    }

    #[test]
    fn a_pty_takes_stdio_and_its_master_comes_last() {
        let mut request = request();
        request.pty = Some(PtySpec {
            window: zygote_proto::WindowSize { rows: 7, cols: 9 },
        });
        let prepared = prepare(&request, vec![]).expect("valid request");
        assert!(prepared.plan.new_session && prepared.plan.controlling_terminal);
        assert!(prepared.leads_own_group);
        let targets: Vec<_> = prepared.plan.fds.iter().map(|(_, to)| *to).collect();
        assert_eq!(targets, vec![0, 1, 2]);
        for (fd, _) in &prepared.plan.fds {
            assert!(rustix::termios::isatty(fd));
        }
        let [master] = prepared.client_ends.as_slice() else {
            panic!("one client end, the master");
        };
        let size = rustix::termios::tcgetwinsize(master).expect("TIOCGWINSZ");
        assert_eq!((size.ws_row, size.ws_col), (7, 9));
        let flags = rustix::io::fcntl_getfd(master).expect("F_GETFD");
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));

        request.stdout = StdioSpec::Pipe;
        let refused = refusal(&request, vec![]);
        assert_eq!(refused.errno, Errno::INVAL);
        assert!(refused.message.contains("Null"), "{}", refused.message);
    }

    #[test]
    fn deferral_refuses_pipes_and_ptys() {
        let mut request = request();
        request.defer_spawned = true;
        prepare(&request, vec![]).expect("deferral with Null stdio is valid");
        request.stderr = StdioSpec::Pipe;
        let refused = refusal(&request, vec![]);
        assert_eq!(
            (refused.stage, refused.errno),
            (SpawnStage::Validate, Errno::INVAL)
        );
        assert!(
            refused.message.contains("defer_spawned"),
            "{}",
            refused.message
        );
        request.stderr = StdioSpec::Null;
        request.pty = Some(PtySpec {
            window: zygote_proto::WindowSize { rows: 7, cols: 9 },
        });
        let refused = refusal(&request, vec![]);
        assert_eq!(refused.errno, Errno::INVAL);
        assert!(refused.message.contains("pty"), "{}", refused.message);
    }

    #[test]
    fn pipes_give_the_client_the_right_ends() {
        let mut request = request();
        request.stdin = StdioSpec::Pipe;
        request.stdout = StdioSpec::Pipe;
        let prepared = prepare(&request, vec![]).expect("valid request");
        assert_eq!(prepared.client_ends.len(), 2);
        let mode = |fd: &OwnedFd| rustix::fs::fcntl_getfl(fd).expect("F_GETFL");
        // The client writes the child's stdin and reads its stdout.
        assert!(mode(&prepared.client_ends[0]).contains(rustix::fs::OFlags::WRONLY));
        assert!(!mode(&prepared.client_ends[1]).contains(rustix::fs::OFlags::WRONLY));
        let targets: Vec<_> = prepared.plan.fds.iter().map(|(_, to)| *to).collect();
        assert_eq!(targets, vec![0, 1, 2]);
    }
}
