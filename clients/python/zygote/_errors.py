"""The one exception of zygote's own."""

from __future__ import annotations


class ZygoteError(OSError):
    """The zygote is not there, refused the connection, or went away.

    A subclass of :class:`OSError`, so code that catches ``OSError`` around
    a spawn keeps working. ``errno`` is set when a system call failed (e.g.
    ``ENOENT`` or ``ECONNREFUSED`` for a missing daemon socket). Spawn
    failures of the program itself are never a ``ZygoteError``: they raise
    what :mod:`subprocess` raises.
    """
