"""Range checks for every value a ``Spawn`` request carries, made before
anything is encoded, so that no argument can produce a frame the daemon
cannot decode (it would close the connection, failing every other request
on it).

Where :mod:`subprocess` (or the call it stands for: ``setrlimit``,
``kill``) refuses the same value, the exception and its text are the
stdlib's.
"""

from __future__ import annotations

import math
import signal
import sys
from typing import Any, Optional, Tuple

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
INT_MAX = (1 << 31) - 1
#: Every resource ``getrlimit(2)`` knows on Linux (``RLIM_NLIMITS``).
RLIMIT_COUNT = 16
#: ``resource.RLIM_INFINITY`` on Linux.
RLIM_INFINITY = -1
#: The highest signal number (``SIGRTMAX``).
SIGNAL_MAX = max(int(number) for number in signal.valid_signals())


def _int(what: str, value: Any) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}")
    return int(value)


def c_int(what: str, value: Any) -> int:
    """A value the stdlib hands to C as an ``int`` (umask, process_group,
    fd numbers of ``stdin``/``stdout``/``stderr``)."""
    number = _int(what, value)
    if -INT_MAX - 1 <= number <= INT_MAX:
        return number
    # CPython's own texts, which changed in 3.12.
    if sys.version_info >= (3, 12):
        raise OverflowError("Python int too large to convert to C int")
    side = "greater than maximum" if number > 0 else "less than minimum"
    raise OverflowError(f"signed integer is {side}")


def user_id(kind: str, value: Any) -> int:
    """A uid or gid as ``subprocess`` checks it (``kind`` is ``"uid"`` or
    ``"gid"``): negative is :class:`ValueError`, over 32 bits
    :class:`OverflowError`."""
    number = _int("User" if kind == "uid" else "Group", value)
    if number < 0:
        name = "User" if kind == "uid" else "Group"
        raise ValueError(f"{name} ID cannot be negative, got {number}")
    if number > U32_MAX:
        # CPython's own texts: a value that fits a C long is "less than
        # minimum" (it would wrap), a larger one "greater than maximum".
        side = "less than minimum" if number < 1 << 63 else "greater than maximum"
        raise OverflowError(f"{kind} is {side}")
    return number


def group_ids(values: Any) -> list[int]:
    """``extra_groups`` ids: ``subprocess`` says "invalid group id" for one
    over 32 bits, and refuses negative ones."""
    checked = []
    for value in values:
        number = _int("Items in extra_groups", value)
        if number < 0:
            raise ValueError(f"Group ID cannot be negative, got {number}")
        if number > U32_MAX:
            raise ValueError("invalid group id")
        checked.append(number)
    return checked


def pass_fd(value: Any) -> int:
    """A ``pass_fds`` entry, as ``_posixsubprocess`` checks it."""
    number = int(value)
    if number < 0 or number > INT_MAX:
        raise ValueError("bad value(s) in fds_to_keep")
    return number


def rlimit_value(value: Any) -> int:
    """A limit for ``rlimits=``: ``RLIM_INFINITY`` (-1) or 0 to 2**64 - 1
    (anything from ``u64::MAX`` up is infinity on the wire, as in the
    kernel)."""
    number = _int("a resource limit", value)
    if number == RLIM_INFINITY:
        return U64_MAX
    if number < 0:
        raise ValueError(f"a resource limit is RLIM_INFINITY or not negative, not {number}")
    if number > U64_MAX:
        raise OverflowError("Python int too large to convert to C long")
    return number


def rlimit(resource_number: Any, value: Any) -> Tuple[int, int, int]:
    """One ``rlimits=`` entry as ``(resource, soft, hard)``, refused as
    ``resource.setrlimit`` refuses it."""
    number = _int("a resource", resource_number)
    if not 0 <= number < RLIMIT_COUNT:
        raise ValueError("invalid resource specified")
    if isinstance(value, int):
        soft = hard = rlimit_value(value)
    else:
        try:
            soft_value, hard_value = value
        except (TypeError, ValueError):
            raise ValueError("expected a tuple of 2 integers") from None
        soft, hard = rlimit_value(soft_value), rlimit_value(hard_value)
    if soft > hard:
        raise ValueError("current limit exceeds maximum limit")
    return number, soft, hard


def signal_number(value: Any) -> int:
    """A signal to send: over a C ``int`` is :class:`OverflowError` (as
    ``os.kill``), outside 1 to ``SIGRTMAX`` :class:`ValueError` (as
    ``signal.signal``)."""
    number = c_int("signal number", value)
    if not 1 <= number <= SIGNAL_MAX:
        raise ValueError("signal number out of range")
    return number


def millis(what: str, seconds: Any, least: int) -> int:
    """Seconds as whole milliseconds (at least ``least``) for a ``u64``."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{what} must not be negative, not {seconds!r}")
    value = seconds * 1000
    if value >= U64_MAX:
        raise OverflowError(f"{what} is too large: {seconds!r} s")
    return max(least, int(value))


def unsigned(what: str, value: Optional[Any], bits: int) -> Optional[int]:
    """``None``, or a non-negative int that fits ``bits`` bits."""
    if value is None:
        return None
    number = _int(what, value)
    if number < 0:
        raise ValueError(f"{what} must not be negative, not {number}")
    if number >> bits:
        raise OverflowError(f"{what} is too large for {bits} bits: {number}")
    return number
