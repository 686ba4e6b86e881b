"""The sandbox of one child (``sandbox=zygote.Sandbox(...)``): what the
caller asks for, checked against its wire type before anything is
encoded, and what the daemon reports it applied."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

#: The feature a daemon lists in ``HelloAck`` when it enforces sandboxes.
FEATURE = "sandbox"

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

_MOUNT_KINDS = {"ro": "ReadOnlyBind", "rw": "Bind", "tmpfs": "Tmpfs"}
_NETWORKS = {"host": "Host", "none": "None"}


def _path(what: str, value: Any) -> bytes:
    """An absolute path for the daemon: non-empty, starting with ``/``,
    without NUL (``ValueError``, the stdlib's text for NUL)."""
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"{what} must be a path (str, bytes or os.PathLike), not {value!r}")
    data = os.fsencode(value)
    if b"\0" in data:
        raise ValueError(f"embedded null byte in {what} {value!r}")
    if not data:
        raise ValueError(f"{what} is empty; it must be an absolute path")
    if not data.startswith(b"/"):
        raise ValueError(f"{what} {value!r} is not an absolute path")
    return data


def _text(what: str, value: Any) -> Optional[str]:
    """An optional wire string: ``None``, or a str without NUL that
    encodes as UTF-8."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {value!r}")
    if "\0" in value:
        raise ValueError(f"embedded null byte in {what} {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {value!r} is not valid UTF-8 text") from None
    return value


def _port(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {value!r}")
    if not 0 <= value <= 0xFFFF:
        raise OverflowError(f"{what} {value} is not a TCP port (0 to 65535)")
    return int(value)


def _items(what: str, value: Any) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list or tuple, not {value!r}")
    return list(value)


@dataclass(frozen=True)
class Mount:
    """One mount of a sandbox's filesystem view. ``kind`` is ``"ro"`` (a
    read-only bind of ``source``), ``"rw"`` (a read-write bind) or
    ``"tmpfs"`` (an empty tmpfs, no ``source``); ``destination`` is where
    it appears inside, ``source`` by default."""

    kind: str
    source: Optional[PathLike] = None
    destination: Optional[PathLike] = None

    @classmethod
    def ro(cls, source: PathLike, destination: Optional[PathLike] = None) -> "Mount":
        """A read-only bind of ``source`` at ``destination`` (default: the same path)."""
        return cls("ro", source, destination)

    @classmethod
    def rw(cls, source: PathLike, destination: Optional[PathLike] = None) -> "Mount":
        """A read-write bind of ``source`` at ``destination`` (default: the same path)."""
        return cls("rw", source, destination)

    @classmethod
    def tmpfs(cls, destination: PathLike) -> "Mount":
        """An empty tmpfs at ``destination``."""
        return cls("tmpfs", None, destination)

    def to_wire(self, what: str) -> Dict[str, Any]:
        """The request's ``MountSpec``; ``what`` names it in errors."""
        if self.kind not in _MOUNT_KINDS:
            raise ValueError(f"{what}.kind must be 'ro', 'rw' or 'tmpfs', not {self.kind!r}")
        if self.kind == "tmpfs":
            if self.source is not None:
                raise ValueError(f"{what}: a tmpfs mount has no source, got {self.source!r}")
            if self.destination is None:
                raise ValueError(f"{what}: a tmpfs mount needs a destination")
            source = b""
        else:
            source = _path(f"{what}.source", self.source)
        target = self.destination if self.destination is not None else self.source
        return {
            "kind": _MOUNT_KINDS[self.kind],
            "source": source,
            "destination": _path(f"{what}.destination", target),
        }


@dataclass(frozen=True)
class Landlock:
    """Landlock rules: the child may only read (``read_only``), read and
    execute (``read_execute``) or read and write (``read_write``) below
    these paths, and only bind or connect these TCP ports. ``require``
    refuses the spawn when the kernel cannot enforce every rule; without
    it Landlock is best effort (:attr:`AppliedSandbox.landlock_complete`
    says whether every rule held)."""

    read_only: Sequence[PathLike] = ()
    read_execute: Sequence[PathLike] = ()
    read_write: Sequence[PathLike] = ()
    tcp_bind: Sequence[int] = ()
    tcp_connect: Sequence[int] = ()
    require: bool = False

    def to_wire(self) -> Dict[str, Any]:
        """The request's ``LandlockSpec``."""
        wire: Dict[str, Any] = {}
        for name in ("read_only", "read_execute", "read_write"):
            paths = _items(f"Landlock.{name}", getattr(self, name))
            wire[name] = [_path(f"Landlock.{name}[{i}]", p) for i, p in enumerate(paths)]
        for name in ("tcp_bind", "tcp_connect"):
            ports = _items(f"Landlock.{name}", getattr(self, name))
            wire[name] = [_port(f"Landlock.{name}[{i}]", p) for i, p in enumerate(ports)]
        if not isinstance(self.require, bool):
            raise TypeError(f"Landlock.require must be a bool, not {self.require!r}")
        wire["require"] = self.require
        return wire


@dataclass(frozen=True)
class Sandbox:
    """Confines one child; the daemon sets it up between clone and exec.

    - ``profile``: a profile of the daemon's policy file, applied first;
      the other fields can only tighten it.
    - ``mounts``: ``None`` keeps the host's filesystem; a sequence of
      :class:`Mount` gives the child a new mount namespace whose root is
      an empty, read-only tmpfs with these mounts, in order (and a
      minimal ``/dev``).
    - ``network``: ``"host"`` or ``"none"`` (an empty network namespace).
    - ``isolate``: new pid, ipc and uts namespaces; ``hostname`` (which
      needs ``isolate``) is the hostname inside.
    - ``seccomp``: a seccomp profile name (``"default"``, ``"strict"``, or
      one of the policy's); ``seccomp_filter`` instead the text of a custom
      filter. At most one of them.
    - ``landlock``: :class:`Landlock` rules.

    The daemon must offer the feature ``sandbox``: otherwise the spawn is
    refused before it is sent (:class:`OSError` ``EOPNOTSUPP`` naming the
    feature). A sandbox the daemon cannot honour is refused, never
    weakened. What was applied is :attr:`zygote.Popen.sandbox`.
    """

    profile: Optional[str] = None
    mounts: Optional[Sequence[Mount]] = None
    network: str = "host"
    isolate: bool = False
    hostname: Optional[str] = None
    seccomp: Optional[str] = None
    seccomp_filter: Optional[str] = None
    landlock: Optional[Landlock] = None

    def to_wire(self) -> Dict[str, Any]:
        """The request's ``SandboxSpec``: :class:`TypeError`,
        :class:`ValueError` or :class:`OverflowError` for a value its wire
        type cannot carry, naming the field."""
        if self.network not in _NETWORKS:
            raise ValueError(f"Sandbox.network must be 'host' or 'none', not {self.network!r}")
        if not isinstance(self.isolate, bool):
            raise TypeError(f"Sandbox.isolate must be a bool, not {self.isolate!r}")
        hostname = _text("Sandbox.hostname", self.hostname)
        if hostname is not None and not self.isolate:
            raise ValueError(
                f"Sandbox.hostname {hostname!r} needs isolate=True (a uts namespace of its own)"
            )
        if self.seccomp is not None and self.seccomp_filter is not None:
            raise ValueError("Sandbox.seccomp and Sandbox.seccomp_filter are both set; give one")
        seccomp: Optional[Dict[str, str]] = None
        if self.seccomp is not None:
            seccomp = {"Profile": _text("Sandbox.seccomp", self.seccomp) or ""}
        elif self.seccomp_filter is not None:
            seccomp = {"Filter": _text("Sandbox.seccomp_filter", self.seccomp_filter) or ""}
        filesystem = None
        if self.mounts is not None:
            mounts = _items("Sandbox.mounts", self.mounts)
            checked = []
            for i, mount in enumerate(mounts):
                if not isinstance(mount, Mount):
                    raise TypeError(f"Sandbox.mounts[{i}] must be a zygote.Mount, not {mount!r}")
                checked.append(mount.to_wire(f"Sandbox.mounts[{i}]"))
            filesystem = {"mounts": checked}
        landlock = None
        if self.landlock is not None:
            if not isinstance(self.landlock, Landlock):
                raise TypeError(
                    f"Sandbox.landlock must be a zygote.Landlock, not {self.landlock!r}"
                )
            landlock = self.landlock.to_wire()
        return {
            "profile": _text("Sandbox.profile", self.profile),
            "filesystem": filesystem,
            "network": _NETWORKS[self.network],
            "isolate": self.isolate,
            "hostname": hostname,
            "seccomp": seccomp,
            "landlock": landlock,
        }


@dataclass(frozen=True)
class AppliedSandbox:
    """What confined a child, as the daemon reported it
    (:attr:`zygote.Popen.sandbox`)."""

    #: The profile applied (the policy's imposed one, or the request's).
    profile: Optional[str]
    #: Namespaces the child got: "mount", "pid", "ipc", "uts", "net", "user".
    namespaces: Tuple[str, ...]
    #: The seccomp filter installed: a profile name, or "custom".
    seccomp: Optional[str]
    #: The Landlock ABI version enforced; ``None`` when Landlock was not applied.
    landlock_abi: Optional[int]
    #: False when best-effort Landlock could not enforce every requested rule.
    landlock_complete: bool

    @classmethod
    def from_wire(cls, wire: Optional[Mapping[str, Any]]) -> Optional["AppliedSandbox"]:
        """From a ``Spawned`` reply's ``sandbox``; ``None`` when nothing confined the child."""
        if wire is None:
            return None
        return cls(
            profile=wire["profile"],
            namespaces=tuple(wire["namespaces"]),
            seccomp=wire["seccomp"],
            landlock_abi=wire["landlock_abi"],
            landlock_complete=bool(wire["landlock_complete"]),
        )


def check_offered(sandbox: Optional[Sandbox], features: Sequence[str], version: int) -> None:
    """Refuses, before anything is sent, a sandbox the daemon does not
    offer, as the daemon would refuse it: ``OSError(EOPNOTSUPP)`` whose
    message names the feature."""
    if sandbox is None or FEATURE in features:
        return
    why = f"the zygote does not offer the feature {FEATURE}"
    if version < 3:
        why += f" (it speaks protocol version {version}; a sandbox needs 3)"
    error = OSError(errno.EOPNOTSUPP, f"{os.strerror(errno.EOPNOTSUPP)}: {why}")
    error.zygote_stage = "Validate"  # type: ignore[attr-defined]
    error.zygote_message = why  # type: ignore[attr-defined]
    raise error


def wire_of(sandbox: Any) -> Optional[Dict[str, Any]]:
    """The request's ``sandbox`` field for the ``sandbox=`` keyword."""
    if sandbox is None:
        return None
    if not isinstance(sandbox, Sandbox):
        raise TypeError(f"sandbox must be a zygote.Sandbox, not {type(sandbox).__name__}")
    return sandbox.to_wire()


__all__: List[str] = ["AppliedSandbox", "Landlock", "Mount", "Sandbox"]
