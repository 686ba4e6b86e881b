"""``zygote.install()``: ``subprocess.Popen`` through the zygote for every
call it can serve exactly, the stdlib for the rest."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, Optional

from ._client import _STDLIB_POPEN, Client
from ._popen import Popen

_lock = threading.Lock()
#: Modules that start a Popen and then reap the pid themselves, which only
#: works for a child of this process.
_REAPING_CALLERS = frozenset({"asyncio.unix_events"})
# subprocess's own functions that make a Popen only to wait for it (and
# check_call, check_output and getoutput through them).
_WAITING_CALLERS = frozenset({"run", "call"})


class InstalledPopen(Popen):
    """What ``subprocess.Popen`` is while installed. Each call decides on
    its own: through the zygote, or (see :func:`zygote.install`) the
    stdlib; :attr:`zygote_fallback_reason` says why it fell back."""

    _zygote_installed = True
    _installed_client: Optional[Client] = None

    def __init__(self, args: Any, *posargs: Any, **kwargs: Any) -> None:
        if "client" not in kwargs and self._installed_client is not None:
            kwargs["client"] = self._installed_client
        frame = sys._getframe(1)
        caller = frame.f_globals.get("__name__")
        if caller in _REAPING_CALLERS:
            self._zygote_forced_fallback = f"{caller} reaps its children with waitpid"
        if caller == "subprocess" and frame.f_code.co_name in _WAITING_CALLERS:
            # They only wait for the status: the object never escapes.
            kwargs["_zygote_defer"] = True
        super().__init__(args, *posargs, **kwargs)


# It stands in for subprocess.Popen: its name (and so the stdlib's repr,
# "<Popen: returncode: ... args: ...>") is that one's.
InstalledPopen.__name__ = InstalledPopen.__qualname__ = "Popen"


def install(client: Optional[Client] = None) -> None:
    """Routes ``subprocess.Popen`` (and so ``subprocess.run``, ``call``,
    ``check_call``, ``check_output``, ``getoutput``, and libraries that use
    them) through the zygote: ``client``, or the default client.

    It replaces the ``subprocess.Popen`` attribute, so code that copied the
    name before (``from subprocess import Popen`` at import time) keeps the
    stdlib's. A call falls back to the stdlib, unchanged, when the zygote
    cannot give exactly what a fork would:

    - ``preexec_fn``: Python code that must run in the forked child;
    - a signal ignored or blocked in the calling thread (other than those
      ``restore_signals`` resets): a forked child keeps it, a zygote child
      starts with default dispositions and an empty mask;
    - more fds to pass than the daemon takes per spawn (64), e.g.
      ``close_fds=False`` in a process with many inheritable fds;
    - argv + environment over the daemon's budget (192 KiB), or a request
      over its frame limit;
    - no zygote reachable (not running, lost, or refusing the connection);
    - calls from asyncio's own ``create_subprocess_*``: its child watcher
      reaps the pid with ``waitpid``, which only works for a child of this
      process (use :func:`zygote.create_subprocess_exec` instead).

    Code that reaps a ``Popen``'s pid itself (``os.waitpid(p.pid)``) gets
    ``ChildProcessError``: the child's parent is the zygote.

    Everything else, including ``user``/``group``/``extra_groups``/``umask``,
    ``pass_fds``, ``cwd``, ``env``, ``start_new_session`` and
    ``process_group``, goes through the zygote. What still differs for
    those: the child's parent is the zygote (its ``getppid()``), and any
    process state the protocol does not carry (cgroup, namespaces,
    capabilities) is the zygote's, not this process's.
    """
    with _lock:
        InstalledPopen._installed_client = client
        subprocess.Popen = InstalledPopen  # type: ignore[misc]


def uninstall() -> None:
    """Puts the stdlib's ``subprocess.Popen`` back."""
    with _lock:
        subprocess.Popen = _STDLIB_POPEN  # type: ignore[misc]
        InstalledPopen._installed_client = None


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return subprocess.Popen is InstalledPopen
