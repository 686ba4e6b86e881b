"""A child whose zygote was lost (crash, SIGKILL, restart): its exit status
read from its pidfd, as the Rust client does (client/src/child.rs).

Once the child has exited and its new parent (a subreaper, or init) has
reaped it, Linux 6.15 and later keep the ``wait(2)`` status for the pidfd:
``PIDFD_GET_INFO`` with ``PIDFD_INFO_EXIT``. Resource usage is then
unknown. Before 6.15 the loss stays the error.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import select
import struct
import time
from typing import Optional, Tuple

from ._errors import ZygoteError

#: ``_IOWR(0xFF, 11, struct pidfd_info)`` with the 64-byte first version.
PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11
PIDFD_INFO_EXIT = 1 << 3
#: Offset of ``exit_code`` in ``struct pidfd_info``.
_EXIT_CODE_OFFSET = 60
#: How long an exited child may stay unreaped by its new parent before a
#: wait gives up (the kernel gives its status only once it is reaped).
REAP_WAIT_SECONDS = 30.0
_REAP_POLL_SECONDS = 0.05
_UNSUPPORTED = (
    "this kernel keeps no exit status for pidfds "
    "(PIDFD_GET_INFO with PIDFD_INFO_EXIT needs Linux 6.15)"
)

RUNNING = "running"
UNREAPED = "unreaped"
#: How long a reaped child's pidfd may read as gone, or without a status,
#: before this kernel is taken to keep none (6.13, 6.14): for a moment
#: after the reaping, the status is not there yet.
STATUS_GRACE_SECONDS = 0.2


class GoneClock:
    """When a child's pidfd first read as reaped without a status."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: Optional[float] = None

    def lasting(self, now: float) -> bool:
        """Whether, seen so at ``now``, it has lasted the grace."""
        if self.since is None:
            self.since = now
        return now - self.since >= STATUS_GRACE_SECONDS


def returncode_of_wait_status(raw: int) -> int:
    """``subprocess``'s returncode from a ``wait(2)`` status."""
    if os.WIFSIGNALED(raw):
        return -os.WTERMSIG(raw)
    return os.WEXITSTATUS(raw)


def not_recovered(lost: ZygoteError, pid: int, why: str) -> ZygoteError:
    """The loss, saying why the pidfd could not stand in."""
    return ZygoteError(lost.errno, f"{lost.strerror}; the exit status of pid {pid} is lost: {why}")


def state(pidfd: int, pid: int, lost: ZygoteError, gone: GoneClock) -> Tuple[str, Optional[int]]:
    """``(RUNNING, None)``, ``(UNREAPED, None)`` or ``("exited", status)``;
    raises the loss when this kernel cannot give the status. A reaped child
    without a status counts as unreaped until that lasts (``gone``)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    events = 0
    for _, revents in poller.poll(0):
        events |= revents
    if not events & select.POLLIN:
        return RUNNING, None
    # HUP: reaped, and read before the status.
    reaped = bool(events & select.POLLHUP)
    info = bytearray(64)
    struct.pack_into("Q", info, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, info)
    except OSError as error:
        if error.errno == errno.ESRCH and not gone.lasting(time.monotonic()):
            return UNREAPED, None
        if error.errno in (errno.ENOTTY, errno.EINVAL, errno.ESRCH, errno.EOPNOTSUPP):
            raise not_recovered(lost, pid, _UNSUPPORTED) from None
        raise ZygoteError(
            error.errno,
            f"reading the exit status of pid {pid} from its pidfd failed: {error.strerror}",
        ) from None
    (mask,) = struct.unpack_from("Q", info, 0)
    if mask & PIDFD_INFO_EXIT:
        (raw,) = struct.unpack_from("i", info, _EXIT_CODE_OFFSET)
        return "exited", raw
    if reaped and gone.lasting(time.monotonic()):
        raise not_recovered(lost, pid, _UNSUPPORTED)
    return UNREAPED, None


def _unreaped_error(lost: ZygoteError, pid: int) -> ZygoteError:
    return not_recovered(
        lost,
        pid,
        f"it exited, but its new parent has not reaped it within {REAP_WAIT_SECONDS:.0f} s",
    )


def wait(
    pidfd: int, pid: int, lost: ZygoteError, gone: GoneClock, timeout: Optional[float]
) -> Optional[int]:
    """Blocks until the status can be read (the ``wait(2)`` status), or
    ``timeout`` passes (``None``)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    reap_deadline: Optional[float] = None
    pause = 0.001
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        found, raw = state(pidfd, pid, lost, gone)
        if found == "exited":
            return raw
        if found == RUNNING:
            if not poller.poll(None if left is None else left * 1000):
                return None
            continue
        now = time.monotonic()
        if reap_deadline is None:
            reap_deadline = now + REAP_WAIT_SECONDS
        if now >= reap_deadline:
            raise _unreaped_error(lost, pid)
        if left is not None and left <= 0:
            return None
        time.sleep(pause if left is None else min(pause, left))
        pause = min(pause * 2, _REAP_POLL_SECONDS)


async def wait_async(pidfd: int, pid: int, lost: ZygoteError, gone: GoneClock) -> int:
    """As :func:`wait`, on the running event loop, never blocking it."""
    loop = asyncio.get_running_loop()
    reap_deadline: Optional[float] = None
    pause = 0.001
    while True:
        found, raw = state(pidfd, pid, lost, gone)
        if found == "exited":
            assert raw is not None
            return raw
        if found == RUNNING:
            readable: "asyncio.Future[None]" = loop.create_future()

            def ready(future: "asyncio.Future[None]" = readable) -> None:
                if not future.done():
                    future.set_result(None)

            loop.add_reader(pidfd, ready)
            try:
                await readable
            finally:
                loop.remove_reader(pidfd)
            continue
        now = time.monotonic()
        if reap_deadline is None:
            reap_deadline = now + REAP_WAIT_SECONDS
        if now >= reap_deadline:
            raise _unreaped_error(lost, pid)
        await asyncio.sleep(pause)
        pause = min(pause * 2, _REAP_POLL_SECONDS)
