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
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _check, _sandbox, _wire

U64_MAX = _check.U64_MAX
RLIMIT_COUNT = _check.RLIMIT_COUNT
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
        of range, :class:`OverflowError` for ones over their wire type."""
        widths = {"memory_max": 64, "memory_swap_max": 64, "pids_max": 64}
        widths.update(cpu_weight=32, io_weight=32)
        values = {}
        for name, bits in widths.items():
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"cgroup {name} must be a non-negative int, not {value!r}")
            values[name] = _check.unsigned(f"cgroup {name}", value, bits)
        cpu = None
        if self.cpu_max is not None:
            quota, period = self.cpu_max
            if not quota > 0 or not period > 0:
                raise ValueError(
                    f"cgroup cpu_max needs a positive quota and period, not {quota, period}"
                )
            cpu = {
                "quota_micros": max(1, _check.millis("cgroup cpu_max quota", quota * 1000, 0)),
                "period_micros": max(1, _check.millis("cgroup cpu_max period", period * 1000, 0)),
            }
        return {
            "kill_tree": bool(self.kill_tree),
            "wait_tree": bool(self.wait_tree),
            **values,
            "cpu_max": cpu,
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


@dataclass(frozen=True)
class ProcessState:
    """This process's settings that a request copies and programs rarely
    change: the umask, the resource limits, the ignored signals, the nice
    value, the CPU affinity and the OOM score adjustment. A client reads
    them once, at its first spawn, and reuses them, as the Rust and Go
    clients do (:meth:`zygote.Client.refresh_process_state` reads them
    again): reading them costs more than the rest of a request."""

    umask: Optional[int]
    rlimits: Dict[int, Tuple[int, int]]
    #: ``rlimits`` as the request carries them, for the requests that set
    #: none of their own. Shared by those requests: never modified.
    rlimits_wire: Tuple[Dict[str, int], ...]
    #: The request fields of :func:`own_attributes`.
    attributes: Dict[str, Any]


def read_process_state() -> ProcessState:
    """Reads this process's :class:`ProcessState` now. The nice value and
    the CPU affinity are per thread on Linux: they are the calling
    thread's."""
    limits = own_rlimits()
    return ProcessState(
        umask=own_umask(),
        rlimits=limits,
        rlimits_wire=tuple(
            {"resource": number, "soft": soft, "hard": hard}
            for number, (soft, hard) in sorted(limits.items())
        ),
        attributes=own_attributes(),
    )


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


@dataclass(frozen=True)
class ZygoteOptions:
    """zygote's own keywords of :class:`zygote.Popen` and
    ``create_subprocess_exec``."""

    kill_on_close: Union[None, bool, int] = None
    zygote_timeout: Optional[float] = None
    zygote_grace: float = DEFAULT_GRACE_SECONDS
    rlimits: Optional[Mapping[int, Union[int, Tuple[int, int]]]] = None
    cgroup: Optional[Cgroup] = None
    sandbox: Optional[_sandbox.Sandbox] = None


@dataclass(frozen=True)
class ChildSpec:
    """Everything the caller says about one child, as ``subprocess`` has
    parsed it (``stdio``: see :data:`Stdio`; ``umask`` below 0 and
    ``process_group`` ``None`` mean "as this process")."""

    argv: Sequence[Any]
    program: Any
    stdio: Sequence[Stdio]
    close_fds: bool = True
    pass_fds: Sequence[int] = ()
    cwd: Optional[StrOrBytesPath] = None
    env: Optional[Mapping[Any, Any]] = None
    gid: Optional[int] = None
    gids: Optional[Sequence[int]] = None
    uid: Optional[int] = None
    umask: int = -1
    start_new_session: bool = False
    process_group: Optional[int] = None
    options: ZygoteOptions = field(default_factory=ZygoteOptions)
    #: ``defer_spawned``: only for a caller that never sees the child's
    #: object (run, call), whose pipes are its own (PROTOCOL.md section 2).
    defer: bool = False
    #: The handle of the warm template the child is forked from; ``argv``
    #: is then what follows ``python`` on its command line, and
    #: ``program`` is not sent.
    template: Optional[int] = None


def _env_pairs(env: Optional[Mapping[Any, Any]]) -> List[Tuple[bytes, bytes]]:
    """The child's environment. An empty key is sent as is: os.environ
    reads an inherited "=A=B" as key "" and value "A=B", and the child gets
    "=A=B" back (PROTOCOL.md 4.7). A key with "=" is refused, as subprocess
    refuses it."""
    if env is None:
        # os.environ keeps its variables encoded in this dict (POSIX
        # CPython): read at C speed instead of through the mapping's
        # per-item checks, a third of the request's building.
        data = getattr(os.environ, "_data", None)
        if isinstance(data, dict):
            return list(data.items())
        return list(os.environb.items())
    pairs = []
    for key, value in env.items():
        key_bytes = _bytes("environment variable name", key)
        if b"=" in key_bytes:
            raise ValueError("illegal environment variable name")
        pairs.append((key_bytes, _bytes("environment value", value)))
    return pairs


#: The last environment sent and its field, reused while the environment
#: is unchanged (most programs never change it): building and encoding
#: ~35 variables was most of a request's encoding.
_last_env: Tuple[List[Tuple[bytes, bytes]], "_wire.EncodedEnv"] = ([], _wire.EncodedEnv())


def _env_field(env_pairs: List[Tuple[bytes, bytes]]) -> "_wire.EncodedEnv":
    """The request's ``env`` field (with its encoding) for ``env_pairs``."""
    global _last_env
    pairs, field = _last_env
    if env_pairs == pairs and field.wire:
        return field
    field = _wire.EncodedEnv({"key": key, "value": value} for key, value in env_pairs)
    field.wire = _wire.encode_env(field)
    _last_env = (env_pairs, field)
    return field


def _check_budget(args: Sequence[bytes], env_pairs: Sequence[Tuple[bytes, bytes]]) -> None:
    budget = sum(len(arg) + 9 for arg in args) + sum(len(k) + len(v) + 10 for k, v in env_pairs)
    if budget > ARGV_ENV_BUDGET:
        raise UnservableError(
            f"argv + environment need {budget} bytes, over the zygote's budget of {ARGV_ENV_BUDGET}"
        )


def _cwd_bytes(cwd: Optional[StrOrBytesPath]) -> bytes:
    """The child starts in ours unless told otherwise, always as an
    absolute path."""
    if cwd is not None:
        return os.path.join(os.getcwdb(), _bytes("working directory", cwd))
    try:
        return os.getcwdb()
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, "the current directory no longer exists (the child would start there)"
        ) from None


class _Attachments:
    """The fds attached to the frame, each once, by their index."""

    def __init__(self) -> None:
        self.fds: List[int] = []
        self._index_of: Dict[int, int] = {}

    def add(self, fd: int) -> int:
        if fd not in self._index_of:
            self._index_of[fd] = len(self.fds)
            self.fds.append(fd)
        return self._index_of[fd]

    def stdio(self, number: int, how: Stdio) -> Any:
        if how[0] == "inherit":
            return {"Fd": self.add(number)} if _fd_open(number) else "Null"
        if how[0] == "null":
            return "Null"
        if how[0] == "pipe":
            return "Pipe"
        fd = _check.c_int("fd", how[1])
        if not _fd_open(fd):
            # What the stdlib's child reports when its dup2 fails.
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return {"Fd": self.add(fd)}

    def mappings(self, close_fds: bool, pass_fds: Sequence[Any]) -> List[Dict[str, int]]:
        mapped: Dict[int, int] = {}
        if not close_fds and not pass_fds:
            for fd in inheritable_fds():
                mapped[fd] = fd
        for fd in (_check.pass_fd(fd) for fd in pass_fds):
            if fd <= 2:
                continue
            if not _fd_open(fd):
                raise OSError(errno.EBADF, os.strerror(errno.EBADF))
            mapped[fd] = fd
        return [
            {"attached_index": self.add(fd), "child_fd": child_fd}
            for child_fd, fd in sorted(mapped.items())
        ]


def _merged_rlimits(
    rlimits: Optional[Mapping[Any, Any]], state: ProcessState
) -> Sequence[Dict[str, int]]:
    """This process's limits, with ``rlimits`` on top."""
    if not rlimits:
        return state.rlimits_wire
    limits = dict(state.rlimits)
    for number, value in rlimits.items():
        resource_number, soft, hard = _check.rlimit(number, value)
        limits[resource_number] = (soft, hard)
    return [
        {"resource": number, "soft": soft, "hard": hard}
        for number, (soft, hard) in sorted(limits.items())
    ]


def _user(spec: ChildSpec) -> Optional[Dict[str, Any]]:
    """As subprocess: unset parts stay ours, and the supplementary groups
    are kept unless extra_groups replaces them."""
    if spec.uid is None and spec.gid is None and spec.gids is None:
        return None
    return {
        "uid": os.geteuid() if spec.uid is None else _check.user_id("uid", spec.uid),
        "gid": os.getegid() if spec.gid is None else _check.user_id("gid", spec.gid),
        "groups": _check.group_ids(os.getgroups() if spec.gids is None else spec.gids),
    }


def _kill_on_close(spec: ChildSpec, process_group: Optional[int]) -> Optional[Dict[str, Any]]:
    kill_on_close = spec.options.kill_on_close
    if kill_on_close is None or kill_on_close is False:
        return None
    number = int(signal.SIGKILL) if kill_on_close is True else kill_on_close
    leads_group = spec.start_new_session or process_group == 0
    return {"signal": _check.signal_number(number), "process_group": bool(leads_group)}


def _timeout(options: ZygoteOptions) -> Optional[Dict[str, int]]:
    if options.zygote_timeout is None:
        return None
    return {
        "millis": _check.millis("zygote_timeout", options.zygote_timeout, 1),
        "grace_millis": _check.millis("zygote_grace", options.zygote_grace, 0),
    }


def _umask(umask: int, state: ProcessState) -> Optional[int]:
    """A negative umask is ours; umask(2) keeps only the permission bits."""
    value = _check.c_int("umask", umask)
    return state.umask if value < 0 else value & 0o777


def _process_group(process_group: Optional[int]) -> Optional[int]:
    if process_group is None:
        return None
    value = _check.c_int("process_group", process_group)
    return None if value < 0 else value


def build_spawn(
    spec: ChildSpec,
    request_id: int,
    max_fds: int,
    state: Optional[ProcessState] = None,
) -> Tuple[Dict[str, Any], List[int]]:
    """The ``Spawn`` message and the fds to attach to its frame, copying
    ``state`` (read now when not given).

    Every value is checked against its wire type first. Raises what
    ``subprocess`` raises for arguments it would also refuse
    (:class:`ValueError`, :class:`OverflowError`, :class:`TypeError`,
    ``OSError(EBADF)``), and :class:`UnservableError` for a request the
    zygote cannot carry (too many fds, argv + env over its budget).
    """
    if state is None:
        state = read_process_state()
    cgroup = spec.options.cgroup
    if cgroup is not None and not isinstance(cgroup, Cgroup):
        raise TypeError(f"cgroup must be a zygote.Cgroup, not {type(cgroup).__name__}")
    args = [_bytes("argument", arg) for arg in spec.argv]
    if spec.template is None:
        program = _bytes("program", spec.program)
        argv0 = args[0] if args[0] != program else None
        rest = args[1:]
    else:
        check_template_args(args)
        program, argv0, rest = b"", None, args
    env_pairs = _env_pairs(spec.env)
    _check_budget(args, env_pairs)
    process_group = _process_group(spec.process_group)
    attachments = _Attachments()
    stdio = [attachments.stdio(number, how) for number, how in enumerate(spec.stdio)]
    fd_mappings = attachments.mappings(spec.close_fds, spec.pass_fds)
    if len(attachments.fds) > max_fds:
        raise UnservableError(
            f"the child needs {len(attachments.fds)} fds passed, "
            f"over the zygote's limit of {max_fds} per spawn"
        )
    body: Dict[str, Any] = {
        "id": request_id,
        "program": program,
        "argv0": argv0,
        "args": rest,
        "env": _env_field(env_pairs),
        "cwd": _cwd_bytes(spec.cwd),
        "stdin": stdio[0],
        "stdout": stdio[1],
        "stderr": stdio[2],
        "fd_mappings": fd_mappings,
        "new_session": bool(spec.start_new_session),
        "process_group": process_group,
        "umask": _umask(spec.umask, state),
        "rlimits": _merged_rlimits(spec.options.rlimits, state),
        "user": _user(spec),
        "kill_on_close": _kill_on_close(spec, process_group),
        "timeout": _timeout(spec.options),
        "pty": None,
        "report_stops": False,
        "cgroup": cgroup.to_wire() if cgroup is not None else None,
        **state.attributes,
        "defer_spawned": bool(spec.defer),
        "sandbox": _sandbox.wire_of(spec.options.sandbox),
    }
    if spec.template is None:
        return {"Spawn": body}, attachments.fds
    if body["user"] is not None or body["sandbox"] is not None:
        raise ValueError("a template's child cannot change user or have a sandbox")
    template = _check.unsigned("template", spec.template, 64)
    return {"SpawnFromTemplate": {"template": template, "spawn": body}}, attachments.fds


def refuse_for_template(
    executable: Any, shell: bool, uid: Any, gid: Any, gids: Any, sandbox: Any
) -> None:
    """The arguments a template's child cannot honour, refused by name."""
    given = [
        name
        for name, value in (
            ("executable", executable),
            ("user", uid),
            ("group", gid),
            ("extra_groups", gids),
            ("sandbox", sandbox),
        )
        if value is not None
    ]
    if shell:
        given.insert(0, "shell=True")
    if given:
        raise ValueError(
            f"a template's child cannot take {', '.join(given)}: it is a fork of the "
            "template's interpreter, running as its user and unconfined; use a cold spawn"
        )


#: The feature a daemon lists in ``HelloAck`` when it offers templates.
TEMPLATES_FEATURE = "templates"


def check_templates_offered(features: Sequence[str], version: int) -> None:
    """Refuses, before anything is sent, a template request to a daemon
    that does not offer templates (it would refuse it, or, before version
    4, end the connection): ``OSError(EOPNOTSUPP)`` naming the feature."""
    if TEMPLATES_FEATURE in features and version >= _wire.TEMPLATES_SINCE:
        return
    why = f"the zygote does not offer the feature {TEMPLATES_FEATURE}"
    if version < _wire.TEMPLATES_SINCE:
        why += f" (it speaks protocol version {version}; templates need {_wire.TEMPLATES_SINCE})"
    error = OSError(errno.EOPNOTSUPP, f"{os.strerror(errno.EOPNOTSUPP)}: {why}")
    error.zygote_stage = "Validate"  # type: ignore[attr-defined]
    error.zygote_message = why  # type: ignore[attr-defined]
    raise error


def check_template_args(args: Sequence[bytes]) -> None:
    """What a template's child runs, as ``python ARGS`` would: ``-c CODE``,
    ``-m MODULE`` or a script path, each with its own arguments after it.
    Interpreter options cannot change in a running interpreter."""
    first = args[0] if args else b""
    if first in (b"-c", b"-m"):
        if len(args) < 2 or (first == b"-m" and not args[1]):
            what = "code" if first == b"-c" else "a module name"
            raise ValueError(f"a template's args {first.decode()} must be followed by {what}")
        return
    if not first or first.startswith(b"-"):
        raise ValueError(
            "a template's args must begin with -c CODE, -m MODULE or a script path, "
            f"not {first!r} (the interpreter is running: its options cannot change)"
        )


def encode_spawn(
    message: Dict[str, Any], max_frame: int, version: int = _wire.PROTOCOL_VERSION
) -> bytes:
    """The frame in the layout of ``version``, or :class:`UnservableError`
    when it is over the frame limit."""
    if "SpawnFromTemplate" in message:
        outer = message["SpawnFromTemplate"]
        frame = _wire.encode_template_spawn(outer["template"], outer["spawn"], version)
    else:
        frame = _wire.encode_spawn(message["Spawn"], version)
    if len(frame) > max_frame:
        raise UnservableError(
            f"the request is {len(frame)} bytes, over the zygote's frame limit of {max_frame}"
        )
    return frame


#: Steps of the zygote's own, which ``subprocess`` never reports: an
#: errno alone would not say what failed.
_ZYGOTE_STEPS = frozenset({"Template", "Sandbox", "Cgroup", "Admission"})


def spawn_error(failure: Dict[str, Any], executable: Any, cwd: Any) -> OSError:
    """The exception ``subprocess`` would raise for a ``SpawnFailed``.

    ``OSError(errno, os.strerror(errno)[, filename])`` is the errno's own
    subclass (``FileNotFoundError``, ``PermissionError``, ...), with the
    filename the stdlib sets: the program when exec failed, the working
    directory when chdir did, none otherwise. The step the zygote reported
    and its message are in ``zygote_stage`` and ``zygote_message`` (and in
    ``__notes__`` on Python 3.11+); for a step of the zygote's own
    (template, sandbox, cgroup, admission), in the text too.
    """
    code = int(failure["errno"])
    stage = failure["stage"]
    if stage == "Exec":
        error = OSError(code, os.strerror(code), executable)
    elif stage == "Chdir" and cwd is not None:
        error = OSError(code, os.strerror(code), cwd)
    elif stage in _ZYGOTE_STEPS:
        error = OSError(code, f"{os.strerror(code)} ({stage.lower()}: {failure['message']})")
    else:
        error = OSError(code, os.strerror(code))
    error.zygote_stage = stage  # type: ignore[attr-defined]
    error.zygote_message = failure["message"]  # type: ignore[attr-defined]
    if hasattr(error, "add_note"):
        error.add_note(f"zygote: the {stage} step failed: {failure['message']}")
    return error
