//! What systemd hands the daemon: socket-activated listeners
//! (`LISTEN_PID`/`LISTEN_FDS`/`LISTEN_FDNAMES`), the notify socket
//! (`NOTIFY_SOCKET`) and the watchdog (`WATCHDOG_USEC`/`WATCHDOG_PID`).
//!
//! [`take`] must run first thing in `zygote serve`, while the process has
//! one thread: it takes all of these and removes them from the daemon's
//! environment. Children never see the daemon's environment anyway (a
//! child's environment is exactly the one in the client's request); the
//! removal keeps the variables from leaking through anything else the
//! daemon might ever exec, and keeps a stale `LISTEN_PID` from being
//! honoured twice.
//!
//! This is the daemon's one module outside `spawn/` with `unsafe`: adopting
//! inherited fds and changing the environment.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use rustix::net::{AddressFamily, SocketType, sockopt};
use sd_notify::NotifyState;
use tracing::warn;

use crate::Error;

/// `FileDescriptorName=` of the spawn socket.
pub const SPAWN_NAME: &str = "spawn";
/// `FileDescriptorName=` of the metrics socket.
pub const METRICS_NAME: &str = "metrics";

/// Variables the service manager sets for the daemon alone.
const SERVICE_VARS: [&str; 7] = [
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "INVOCATION_ID",
];

/// Everything taken from the service manager at startup.
#[derive(Debug, Default)]
pub struct Activation {
    /// The socket-activated SEQPACKET listener, if any.
    pub spawn: Option<OwnedFd>,
    /// The socket-activated metrics listener (TCP), if any.
    pub metrics: Option<OwnedFd>,
    /// Where to send `READY=1` and friends, when run as `Type=notify`.
    pub notifier: Option<Notifier>,
    /// The watchdog interval, when `WatchdogSec=` is set for this process.
    pub watchdog: Option<Duration>,
    /// Problems worth a warning, kept until logging is set up.
    pub warnings: Vec<String>,
}

/// Takes the activation fds and variables and removes the variables from
/// the environment.
///
/// The inherited fds are marked close-on-exec (by `sd-notify`) before
/// anything else can run. `LISTEN_*` meant for another process (a
/// `LISTEN_PID` that is not ours) is ignored, as `sd_listen_fds(3)` does.
///
/// # Errors
///
/// [`Error::Activation`] when the variables are malformed,
/// [`Error::ActivatedSocket`] when a socket is of the wrong kind or has an
/// unknown name.
///
/// Call it while the process has a single thread (before the runtime
/// starts). It checks: with more threads it leaves the environment alone
/// and says so in [`Activation::warnings`].
pub fn take() -> Result<Activation, Error> {
    let named: Vec<(RawFd, String)> = sd_notify::listen_fds_with_names()
        .map_err(Error::Activation)?
        .collect();
    let watchdog = sd_notify::watchdog_enabled();
    let mut warnings = Vec::new();
    let notifier = std::env::var_os("NOTIFY_SOCKET").and_then(|path| {
        Notifier::connect(&path)
            .inspect_err(|error| {
                warnings.push(format!("cannot reach NOTIFY_SOCKET {path:?}: {error}"))
            })
            .ok()
    });
    let fds = named
        .into_iter()
        .map(|(raw, name)| {
            // SAFETY: sd-notify returned fds 3.. only because LISTEN_PID is
            // this process, so the service manager passed them to us and no
            // other owner exists; they are adopted once, here, and the
            // variables naming them are removed below.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            (fd, name)
        })
        .collect();
    if let Err(warning) = clear_service_vars() {
        warnings.push(warning);
    }
    let (spawn, metrics) = sort_by_name(fds)?;
    Ok(Activation {
        spawn,
        metrics,
        notifier,
        watchdog,
        warnings,
    })
}

fn clear_service_vars() -> Result<(), String> {
    match thread_count() {
        Ok(1) => {
            for var in SERVICE_VARS {
                // SAFETY: the process has one thread (checked just above),
                // so nothing reads the environment concurrently.
                unsafe { std::env::remove_var(var) };
            }
            Ok(())
        }
        other => Err(format!(
            "not removing the service manager's variables from the daemon's environment: \
             {other:?} threads run, not 1"
        )),
    }
}

fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Assigns the activated fds by `FileDescriptorName=`: "spawn" and
/// "metrics". A single socket with another name (systemd's default is the
/// socket unit's name) is the spawn socket.
fn sort_by_name(fds: Vec<(OwnedFd, String)>) -> Result<(Option<OwnedFd>, Option<OwnedFd>), Error> {
    let mut spawn = None;
    let mut metrics = None;
    let mut others = Vec::new();
    for (fd, name) in fds {
        match name.as_str() {
            SPAWN_NAME if spawn.is_none() => spawn = Some(fd),
            METRICS_NAME if metrics.is_none() => metrics = Some(fd),
            _ => others.push((fd, name)),
        }
    }
    if spawn.is_none() && others.len() == 1 {
        spawn = others.pop().map(|(fd, _)| fd);
    }
    if let Some((fd, name)) = others.first() {
        return Err(Error::ActivatedSocket {
            name: name.clone(),
            problem: format!(
                "fd {} is not expected; name the SEQPACKET socket \
                 FileDescriptorName={SPAWN_NAME} and the metrics socket \
                 FileDescriptorName={METRICS_NAME}",
                fd.as_raw_fd()
            ),
        });
    }
    if let Some(fd) = &spawn {
        check_listener(
            fd,
            SPAWN_NAME,
            SocketType::SEQPACKET,
            "ListenSequentialPacket=",
        )?;
    }
    if let Some(fd) = &metrics {
        check_listener(fd, METRICS_NAME, SocketType::STREAM, "ListenStream=")?;
        let family = sockopt::socket_domain(fd).map_err(|errno| Error::ActivatedSocket {
            name: METRICS_NAME.into(),
            problem: format!("getsockopt(SO_DOMAIN): {errno}"),
        })?;
        if family != AddressFamily::INET && family != AddressFamily::INET6 {
            return Err(Error::ActivatedSocket {
                name: METRICS_NAME.into(),
                problem: "is not a TCP socket; use ListenStream=127.0.0.1:PORT".into(),
            });
        }
    }
    Ok((spawn, metrics))
}

fn check_listener(
    fd: &OwnedFd,
    name: &str,
    want: SocketType,
    directive: &str,
) -> Result<(), Error> {
    let problem = |problem: String| Error::ActivatedSocket {
        name: name.to_owned(),
        problem,
    };
    let kind = sockopt::socket_type(fd.as_fd())
        .map_err(|errno| problem(format!("is not a socket ({errno}); use {directive}")))?;
    if kind != want {
        return Err(problem(format!(
            "has socket type {kind:?}, expected {want:?}; use {directive}"
        )));
    }
    if !sockopt::socket_acceptconn(fd.as_fd()).unwrap_or(false) {
        return Err(problem(
            "is not listening (Accept=yes is not supported)".into(),
        ));
    }
    Ok(())
}

/// A connection to the service manager's notify socket, opened once at
/// startup so that the variable can leave the environment.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
}

impl Notifier {
    /// Connects to `NOTIFY_SOCKET` (a path, or `@name` in the abstract
    /// namespace).
    ///
    /// # Errors
    ///
    /// When the socket cannot be created or reached.
    pub fn connect(path: &std::ffi::OsStr) -> io::Result<Self> {
        let socket = UnixDatagram::unbound()?;
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path);
        match bytes.strip_prefix(b"@") {
            Some(name) => socket.connect_addr(&SocketAddr::from_abstract_name(name)?)?,
            None => socket.connect(path)?,
        }
        // A full notify queue must never stall the serving loop.
        socket.set_nonblocking(true)?;
        Ok(Self { socket })
    }

    /// The notify socket's fd, for a live upgrade to hand over.
    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.socket)
    }

    /// The notify socket an earlier image of the daemon handed over,
    /// connected.
    ///
    /// # Errors
    ///
    /// When it cannot be made non-blocking.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        let socket = UnixDatagram::from(fd);
        socket.set_nonblocking(true)?;
        Ok(Self { socket })
    }

    /// Sends state changes, as `sd_notify(3)`; failures are logged, as the
    /// service manager's absence must not stop the daemon.
    pub fn notify(&self, states: &[NotifyState<'_>]) {
        let message: String = states.iter().map(|state| format!("{state}\n")).collect();
        if let Err(error) = self.socket.send(message.as_bytes()) {
            warn!(%error, message = message.trim_end(), "failed to notify the service manager");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqpacket_listener(dir: &std::path::Path) -> OwnedFd {
        zygote_proto::socket::listen_at(&dir.join("s"), false).unwrap()
    }

    #[test]
    fn a_lone_socket_of_any_name_is_the_spawn_socket() {
        let dir = tempfile::tempdir().unwrap();
        let fd = seqpacket_listener(dir.path());
        let (spawn, metrics) = sort_by_name(vec![(fd, "zygote.socket".into())]).unwrap();
        assert!(spawn.is_some());
        assert!(metrics.is_none());
    }

    #[test]
    fn unknown_names_beside_spawn_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let spawn = seqpacket_listener(dir.path());
        let other = zygote_proto::socket::listen_at(&dir.path().join("t"), false).unwrap();
        let error = sort_by_name(vec![(spawn, "spawn".into()), (other, "x".into())]).unwrap_err();
        assert!(
            error.to_string().contains("FileDescriptorName=spawn"),
            "{error}"
        );
    }

    #[test]
    fn a_stream_socket_is_not_a_spawn_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let error = sort_by_name(vec![(listener.into(), "spawn".into())]).unwrap_err();
        assert!(
            error.to_string().contains("ListenSequentialPacket="),
            "{error}"
        );
    }

    #[test]
    fn metrics_must_be_tcp() {
        let dir = tempfile::tempdir().unwrap();
        let unix = std::os::unix::net::UnixListener::bind(dir.path().join("m")).unwrap();
        let error = sort_by_name(vec![(unix.into(), "metrics".into())]).unwrap_err();
        assert!(error.to_string().contains("TCP"), "{error}");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (spawn, metrics) = sort_by_name(vec![(tcp.into(), "metrics".into())]).unwrap();
        assert!(spawn.is_none() && metrics.is_some());
    }

    #[test]
    fn notifier_sends_one_datagram_per_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::connect(path.as_os_str()).unwrap();
        notifier.notify(&[NotifyState::Ready, NotifyState::Status("serving")]);
        let mut buf = [0u8; 256];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving\n");
    }
}
