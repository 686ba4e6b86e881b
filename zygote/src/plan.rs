//! Checks a spawn request and builds everything the child needs before any
//! process exists, so that the child only applies data.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::fd::{OwnedFd, RawFd};

use rustix::io::Errno;
use rustix::pipe::{PipeFlags, pipe_with};
use zygote_proto::{SpawnRequest, SpawnStage, StdioSpec};

use crate::spawn::SpawnPlan;

/// `PATH` used when the request's environment has none, as `execvp` does.
const DEFAULT_PATH: &[u8] = b"/usr/local/bin:/usr/bin:/bin";

/// Highest fd number a mapping may ask for: the kernel's default `nr_open`.
const MAX_CHILD_FD: i32 = 1 << 20;

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
    /// The client's pipe ends, in stdin, stdout, stderr order.
    pub client_ends: Vec<OwnedFd>,
}

fn c_string(what: &str, bytes: &[u8]) -> Result<CString, Refusal> {
    CString::new(bytes).map_err(|_| Refusal::invalid(format!("{what} contains a NUL byte")))
}

/// Checks `request` against the fds that came with it and prepares the
/// child's argv, environment, exec candidates and fd table.
///
/// Every attached fd must be used; unused ones are refused (and closed by
/// the caller dropping them) so that a client cannot park fds here.
pub fn prepare(request: &SpawnRequest, attached: Vec<OwnedFd>) -> Result<Prepared, Refusal> {
    if request.user.is_some() || request.kill_on_close.is_some() || request.timeout.is_some() {
        return Err(Refusal {
            stage: SpawnStage::Validate,
            errno: Errno::OPNOTSUPP,
            message: "user, kill_on_close and timeout are not supported yet".into(),
        });
    }
    if request.program.is_empty() {
        return Err(Refusal::invalid("program is empty"));
    }
    let program = c_string("program", &request.program)?;
    let mut argv = Vec::with_capacity(request.args.len() + 1);
    argv.push(match &request.argv0 {
        Some(argv0) => c_string("argv0", argv0)?,
        None => program.clone(),
    });
    for (index, arg) in request.args.iter().enumerate() {
        argv.push(c_string(&format!("argument {}", index + 1), arg)?);
    }

    let mut envp = Vec::with_capacity(request.env.len());
    let mut path_var = None;
    for var in &request.env {
        if var.key.is_empty() || var.key.contains(&b'=') {
            return Err(Refusal::invalid(format!(
                "environment variable name {:?} is empty or contains '='",
                String::from_utf8_lossy(&var.key)
            )));
        }
        if var.key == b"PATH" {
            path_var = Some(var.value.as_slice());
        }
        let mut entry = Vec::with_capacity(var.key.len() + 1 + var.value.len());
        entry.extend_from_slice(&var.key);
        entry.push(b'=');
        entry.extend_from_slice(&var.value);
        envp.push(c_string("environment", &entry)?);
    }

    let exec_candidates = exec_candidates(&request.program, path_var.unwrap_or(DEFAULT_PATH))?;
    let cwd = request
        .cwd
        .as_deref()
        .map(|cwd| c_string("working directory", cwd))
        .transpose()?;

    let mut fds = FdTable::new(attached);
    let mut client_ends = Vec::new();
    for (child_fd, spec) in [request.stdin, request.stdout, request.stderr]
        .into_iter()
        .enumerate()
    {
        let child_fd = child_fd as RawFd;
        let source = match spec {
            StdioSpec::Null => open_dev_null()?,
            StdioSpec::Fd(index) => fds.take(index)?,
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
        let source = fds.take(mapping.attached_index)?;
        fds.place(source, mapping.child_fd);
    }
    let fds = fds.finish()?;

    Ok(Prepared {
        plan: SpawnPlan {
            exec_candidates,
            argv,
            envp,
            cwd,
            fds,
            new_session: request.new_session,
            process_group: request.process_group,
            umask: request.umask,
            rlimits: request.rlimits.clone(),
        },
        client_ends,
    })
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

fn open_dev_null() -> Result<OwnedFd, Refusal> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|error| Refusal::io(SpawnStage::Pipe, "failed to open /dev/null", error))
}

/// The attached fds, handed out by index. An index used twice gets a
/// duplicate, so that e.g. stdout and stderr can share one fd.
struct FdTable {
    attached: Vec<Option<OwnedFd>>,
    used: Vec<bool>,
    placed: Vec<(OwnedFd, RawFd)>,
}

impl FdTable {
    fn new(attached: Vec<OwnedFd>) -> Self {
        let used = vec![false; attached.len()];
        Self {
            attached: attached.into_iter().map(Some).collect(),
            used,
            placed: Vec::with_capacity(3),
        }
    }

    fn take(&mut self, index: u32) -> Result<OwnedFd, Refusal> {
        let slot = self.attached.get(index as usize).ok_or_else(|| {
            Refusal::invalid(format!(
                "request refers to attached fd #{index}, but the frame carries {}",
                self.attached.len()
            ))
        })?;
        let fd = match slot {
            Some(fd) => fd.try_clone().map_err(|error| {
                Refusal::io(SpawnStage::Dup, "failed to duplicate an fd", error)
            })?,
            None => unreachable!("attached fds stay in the table until finish"),
        };
        self.used[index as usize] = true;
        Ok(fd)
    }

    fn place(&mut self, fd: OwnedFd, child_fd: RawFd) {
        self.placed.push((fd, child_fd));
    }

    fn finish(self) -> Result<Vec<(OwnedFd, RawFd)>, Refusal> {
        if let Some(unused) = self.used.iter().position(|used| !used) {
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
        SpawnRequest {
            id: 1,
            program: b"true".to_vec(),
            argv0: None,
            args: vec![],
            env: vec![],
            cwd: None,
            stdin: StdioSpec::Null,
            stdout: StdioSpec::Null,
            stderr: StdioSpec::Null,
            fd_mappings: vec![],
            new_session: false,
            process_group: None,
            umask: None,
            rlimits: vec![],
            user: None,
            kill_on_close: None,
            timeout: None,
        }
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
        }];
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
        assert_eq!(prepared.plan.envp[0].to_bytes(), b"PATH=/opt/a::/usr/bin");
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
