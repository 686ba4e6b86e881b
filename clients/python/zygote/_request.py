"""Building a ``Spawn`` request from ``subprocess``-style arguments plus this
process's own state, so that the child looks as if this process had
started it: environment, working directory, umask and resource limits are
copied, as the Rust client does (client/src/transparent.rs).
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import signal
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _wire

U64_MAX = (1 << 64) - 1
#: Every resource ``getrlimit(2)`` knows on Linux (``RLIM_NLIMITS``).
RLIMIT_COUNT = 16
#: The daemon's default argv + env budget (PROTOCOL.md 5.4), counted as it
#: counts: each string's length + 1 + 8.
ARGV_ENV_BUDGET = 196608
#: The daemon's default grace between a timeout's SIGTERM and SIGKILL.
DEFAULT_GRACE_SECONDS = 5.0

StrOrBytesPath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
#: How one of fd 0, 1, 2 is set up: ("inherit",), ("null",), ("pipe",) or
#: ("fd", fd).
Stdio = Tuple[Any, ...]


@dataclass(frozen=True)
class Cgroup:
    """The child's own cgroup (the daemon needs a cgroup subtree: run by
    systemd with ``Delegate=yes``, or ``zygote serve --cgroup PATH``).

    Limits apply to the child's whole tree: ``memory_max`` and
    ``memory_swap_max`` in bytes, ``pids_max`` processes and threads,
    ``cpu_max`` as ``(quota, period)`` in seconds, ``cpu_weight`` and
    ``io_weight`` from 1 to 10000. A limit whose controller is not
    delegated to the daemon is refused (the spawn raises
    :class:`OSError`), never silently ignored. ``kill_tree``: timeouts,
    ``kill_on_close`` and :meth:`Popen.kill` end the whole tree
    (``cgroup.kill``), grandchildren that left the process group too.
    ``wait_tree``: waiting returns once every process of the tree has
    exited. Either way the result carries the tree's usage
    (:attr:`Popen.tree_usage`) and whether the OOM killer struck
    (:attr:`Popen.oom_killed`).
    """

    memory_max: Optional[int] = None
    memory_swap_max: Optional[int] = None
    pids_max: Optional[int] = None
    cpu_max: Optional[Tuple[float, float]] = None
    cpu_weight: Optional[int] = None
    io_weight: Optional[int] = None
    kill_tree: bool = False
    wait_tree: bool = False

    def to_wire(self) -> Dict[str, Any]:
        """The request's ``CgroupSpec``; :class:`ValueError` for values out
        of range."""
        for name in ("memory_max", "memory_swap_max", "pids_max", "cpu_weight", "io_weight"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"cgroup {name} must be a non-negative int, not {value!r}")
        cpu = None
        if self.cpu_max is not None:
            quota, period = self.cpu_max
            if quota <= 0 or period <= 0:
                raise ValueError(
                    f"cgroup cpu_max needs a positive quota and period, not {quota, period}"
                )
            cpu = {
                "quota_micros": max(1, int(quota * 1_000_000)),
                "period_micros": max(1, int(period * 1_000_000)),
            }
        return {
            "kill_tree": bool(self.kill_tree),
            "wait_tree": bool(self.wait_tree),
            "memory_max": self.memory_max,
            "memory_swap_max": self.memory_swap_max,
            "pids_max": self.pids_max,
            "cpu_max": cpu,
            "cpu_weight": self.cpu_weight,
            "io_weight": self.io_weight,
        }


class UnservableError(Exception):
    """The zygote cannot start this child exactly as asked; the installed
    drop-in falls back to the stdlib on it."""


def own_umask() -> Optional[int]:
    """This process's umask from /proc (umask(2) can only read it by setting
    it, racing with other threads); ``None`` when /proc does not say."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


#: Signals Python ignores at start and ``subprocess`` resets for its
#: children (``restore_signals``): SIGPIPE, SIGXFZ, SIGXFSZ.
_RESTORED_SIGNALS = sum(
    1 << (int(getattr(signal, name)) - 1)
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
    if hasattr(signal, name)
)


def own_attributes() -> Dict[str, Any]:
    """What a child inherits across fork and exec besides the above: the
    ignored signals (less those ``subprocess`` restores), the nice value,
    the CPU affinity and the OOM score adjustment; each left to the zygote
    when this process cannot read it."""
    ignored = 0
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"SigIgn:"):
                    ignored = int(line.split()[1], 16) & ~_RESTORED_SIGNALS
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        nice: Optional[int] = os.getpriority(os.PRIO_PROCESS, 0)
    except OSError:
        nice = None
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except OSError:
        cpus = []
    try:
        with open("/proc/self/oom_score_adj", "rb") as adj_file:
            adj: Optional[int] = int(adj_file.read())
    except (OSError, ValueError):
        adj = None
    return {
        "ignored_signals": ignored,
        "nice": nice,
        "cpu_affinity": cpus,
        "oom_score_adj": adj,
        "large_args": None,
    }


def own_rlimits() -> Dict[int, Tuple[int, int]]:
    """Every resource limit of this process; infinity is ``u64::MAX``."""
    limits: Dict[int, Tuple[int, int]] = {}
    for number in range(RLIMIT_COUNT):
        try:
            soft, hard = resource.getrlimit(number)
        except (ValueError, OSError):
            continue
        limits[number] = (_rlim(soft), _rlim(hard))
    return limits


def _rlim(value: int) -> int:
    if value < 0 or value >= U64_MAX or value == resource.RLIM_INFINITY:
        return U64_MAX
    return value


def _fd_open(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return False
    return True


def inheritable_fds() -> List[int]:
    """Every fd above 2 that is not close-on-exec (what ``close_fds=False``
    hands a child)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue  # the listing's own fd, closed by now
        if not flags & fcntl.FD_CLOEXEC:
            found.append(fd)
    return sorted(found)


def _bytes(what: str, value: StrOrBytesPath) -> bytes:
    data = os.fsencode(value)
    if b"\0" in data:
        raise ValueError(f"embedded null byte in {what} {value!r}")
    return data


def normalize_args(
    args: Any, shell: bool, executable: Optional[StrOrBytesPath]
) -> Tuple[List[Any], Any]:
    """``args`` as ``subprocess`` reads them, and the program to execute."""
    if isinstance(args, (str, bytes)):
        argv: List[Any] = [args]
    elif isinstance(args, os.PathLike):
        if shell:
            raise TypeError("path-like args is not allowed when shell is true")
        argv = [args]
    else:
        argv = list(args)
    if shell:
        argv = ["/bin/sh", "-c", *argv]
        if executable:
            argv[0] = executable
    if not argv:
        raise IndexError("list index out of range")  # what subprocess raises
    return argv, executable if executable is not None else argv[0]


def build_spawn(
    *,
    request_id: int,
    argv: Sequence[Any],
    executable: Any,
    stdio: Sequence[Stdio],
    close_fds: bool,
    pass_fds: Sequence[int],
    cwd: Optional[StrOrBytesPath],
    env: Optional[Mapping[Any, Any]],
    gid: Optional[int],
    gids: Optional[Sequence[int]],
    uid: Optional[int],
    umask: int,
    start_new_session: bool,
    process_group: Optional[int],
    kill_on_close: Union[None, bool, int],
    zygote_timeout: Optional[float],
    zygote_grace: float,
    rlimits: Optional[Mapping[int, Union[int, Tuple[int, int]]]],
    max_fds: int,
    max_frame: int,
    cgroup: Optional[Cgroup] = None,
) -> Tuple[Dict[str, Any], List[int]]:
    """The ``Spawn`` message and the fds to attach to its frame.

    Raises :class:`ValueError`/:class:`TypeError` for arguments
    ``subprocess`` would also refuse, and :class:`UnservableError` for a request
    the zygote cannot carry (too many fds, argv + env over its budget).
    """
    if cgroup is not None and not isinstance(cgroup, Cgroup):
        raise TypeError(f"cgroup must be a zygote.Cgroup, not {type(cgroup).__name__}")
    cgroup_spec = cgroup.to_wire() if cgroup is not None else None
    program = _bytes("program", executable)
    args = [_bytes("argument", arg) for arg in argv]
    argv0 = args[0] if args[0] != program else None

    # An empty key is sent as is: os.environ reads an inherited "=A=B" as
    # key "" and value "A=B", and the child gets "=A=B" back (PROTOCOL.md
    # 4.7). A key with "=" is refused, as subprocess refuses it.
    if env is None:
        env_pairs = list(os.environb.items())
    else:
        env_pairs = []
        for key, value in env.items():
            key_bytes = _bytes("environment variable name", key)
            if b"=" in key_bytes:
                raise ValueError("illegal environment variable name")
            env_pairs.append((key_bytes, _bytes("environment value", value)))
    budget = sum(len(arg) + 9 for arg in args) + sum(len(k) + len(v) + 10 for k, v in env_pairs)
    if budget > ARGV_ENV_BUDGET:
        raise UnservableError(
            f"argv + environment need {budget} bytes, over the zygote's budget of {ARGV_ENV_BUDGET}"
        )

    # The child starts in ours unless told otherwise, always as an absolute path.
    if cwd is None:
        try:
            cwd_bytes: Optional[bytes] = os.getcwdb()
        except FileNotFoundError:
            raise FileNotFoundError(
                errno.ENOENT, "the current directory no longer exists (the child would start there)"
            ) from None
    else:
        cwd_bytes = os.path.join(os.getcwdb(), _bytes("working directory", cwd))

    attached: List[int] = []
    index_of: Dict[int, int] = {}

    def attach(fd: int) -> int:
        if fd not in index_of:
            index_of[fd] = len(attached)
            attached.append(fd)
        return index_of[fd]

    specs: List[Any] = []
    for number, how in enumerate(stdio):
        if how[0] == "inherit":
            specs.append({"Fd": attach(number)} if _fd_open(number) else "Null")
        elif how[0] == "null":
            specs.append("Null")
        elif how[0] == "pipe":
            specs.append("Pipe")
        else:
            specs.append({"Fd": attach(int(how[1]))})

    mapped: Dict[int, int] = {}
    if not close_fds and not pass_fds:
        for fd in inheritable_fds():
            mapped[fd] = fd
    for fd in pass_fds:
        fd = int(fd)
        if fd > 2:
            mapped[fd] = fd
    fd_mappings = [
        {"attached_index": attach(fd), "child_fd": child_fd}
        for child_fd, fd in sorted(mapped.items())
    ]
    if len(attached) > max_fds:
        raise UnservableError(
            f"the child needs {len(attached)} fds passed, "
            f"over the zygote's limit of {max_fds} per spawn"
        )

    limits = own_rlimits()
    for number, value in (rlimits or {}).items():
        soft, hard = (value, value) if isinstance(value, int) else value
        limits[int(number)] = (_rlim(soft), _rlim(hard))

    user = None
    if uid is not None or gid is not None or gids is not None:
        # As subprocess: unset parts stay ours, and the supplementary groups
        # are kept unless extra_groups replaces them.
        user = {
            "uid": os.geteuid() if uid is None else uid,
            "gid": os.getegid() if gid is None else gid,
            "groups": list(os.getgroups() if gids is None else gids),
        }

    leads_group = start_new_session or process_group == 0
    kill = None
    if kill_on_close is not None and kill_on_close is not False:
        number = int(signal.SIGKILL) if kill_on_close is True else int(kill_on_close)
        kill = {"signal": number, "process_group": leads_group}

    timeout = None
    if zygote_timeout is not None:
        timeout = {
            "millis": max(1, int(zygote_timeout * 1000)),
            "grace_millis": max(0, int(zygote_grace * 1000)),
        }

    message = {
        "Spawn": {
            "id": request_id,
            "program": program,
            "argv0": argv0,
            "args": args[1:],
            "env": [{"key": key, "value": value} for key, value in env_pairs],
            "cwd": cwd_bytes,
            "stdin": specs[0],
            "stdout": specs[1],
            "stderr": specs[2],
            "fd_mappings": fd_mappings,
            "new_session": bool(start_new_session),
            "process_group": process_group,
            "umask": own_umask() if umask < 0 else umask,
            "rlimits": [
                {"resource": number, "soft": soft, "hard": hard}
                for number, (soft, hard) in sorted(limits.items())
            ],
            "user": user,
            "kill_on_close": kill,
            "timeout": timeout,
            "pty": None,
            "report_stops": False,
            "cgroup": cgroup_spec,
            **own_attributes(),
            "defer_spawned": False,
        }
    }
    return message, attached


def encode_spawn(message: Dict[str, Any], max_frame: int) -> bytes:
    """The frame, or :class:`UnservableError` when it is over the frame limit."""
    frame = _wire.encode_spawn(message["Spawn"])
    if len(frame) > max_frame:
        raise UnservableError(
            f"the request is {len(frame)} bytes, over the zygote's frame limit of {max_frame}"
        )
    return frame


def spawn_error(failure: Dict[str, Any], executable: Any, cwd: Any) -> OSError:
    """The exception ``subprocess`` would raise for a ``SpawnFailed``.

    ``OSError(errno, ...)`` is the errno's own subclass
    (``FileNotFoundError``, ``PermissionError``, ...). The message names the
    setup step the zygote reported.
    """
    code = int(failure["errno"])
    stage = failure["stage"]
    text = f"{os.strerror(code)} (zygote: {stage} step failed: {failure['message']})"
    if stage == "Exec":
        return OSError(code, text, executable)
    if stage == "Chdir" and cwd is not None:
        return OSError(code, text, cwd)
    return OSError(code, text)
