"""zygote: :mod:`subprocess` through a zygote spawn server.

A zygote is a small daemon that starts children on request over a Unix
socket (see the project README), so that a large process, one with many
threads or fds, or one that would fork (``preexec_fn``, ``user=``) never
forks. This package speaks its protocol (proto/PROTOCOL.md, versions 1
to 4, negotiated at connect) directly; it is pure Python with no
dependencies.

The API is :mod:`subprocess`'s, with the same names and the stdlib's own
exception and result classes::

    import zygote
    result = zygote.run(["git", "status"], capture_output=True, text=True, check=True)

:class:`Client` is one connection (``Client(path)``, ``$ZYGOTE_SOCKET``, the
default path, or :meth:`Client.launch_private`) with ``run``, ``Popen``
and asyncio's ``create_subprocess_exec``; the module-level :func:`run` and
:class:`Popen` use a default client. :func:`install` makes
``subprocess.Popen`` itself use the zygote. :meth:`Client.python_template`
(and :func:`python_template`) asks the daemon for a warm Python
interpreter with modules imported, whose children are forks of it
(:class:`Template`: a child with numpy imported in milliseconds; it is not
a fresh interpreter).

What differs from :mod:`subprocess`:

- **The parent is the zygote.** The child's ``getppid()`` is the daemon;
  this process cannot ``waitpid`` it. The exit status comes from the
  daemon; :attr:`Popen.pidfd` is the child's pidfd, :attr:`Popen.usage` its
  resource usage.
- **The fd table.** The child gets fds 0-2, ``pass_fds``, and with
  ``close_fds=False`` this process's inheritable fds, at most 64 in all;
  never anything else, whatever this process holds.
- **Copied state.** Environment, working directory, umask and every
  resource limit are copied into each request, so the child sees this
  process's values, and so are the nice value, CPU affinity, OOM score
  adjustment and ignored signals. Other dispositions are default and the
  mask empty. The cgroup and namespaces are the daemon's.
  The environment is :data:`os.environ`'s: an ``environ`` entry that it
  skips (one without ``=``, or a later one with the same name up to its
  first ``=``) does not reach the child, where :mod:`subprocess` passes
  it on with ``env=None``. An entry such as ``=A=B`` (name ``""``)
  arrives byte for byte. As in :mod:`subprocess`, an ``env`` name with
  ``=`` raises :class:`ValueError`; an empty one is allowed.
- **Not supported:** ``preexec_fn`` (:class:`ValueError`; the installed
  drop-in falls back to the stdlib for it).
- **Errors:** a spawn failure raises what :mod:`subprocess` raises
  (:class:`FileNotFoundError`, :class:`PermissionError`, :class:`OSError`
  with the errno), with the stdlib's ``strerror`` (``os.strerror(errno)``)
  and ``filename``; the failed setup step and zygote's message are in
  ``zygote_stage`` and ``zygote_message`` (and ``__notes__`` on 3.11+). A
  value out of range (``user=2**64``, a negative id, a closed fd) raises
  the stdlib's exception before anything is sent. A missing or lost
  daemon raises :class:`ZygoteError`, an :class:`OSError`.
- **os.fork():** a forked child never uses its parent's connection: its
  clients (and the default client) dial a connection of their own at the
  child's first request. A client of a private zygote cannot, and says
  so. Python 3.12+ warns (``DeprecationWarning``) about forking a process
  with threads: the client's reader thread is one.
- **Extra keywords:** ``kill_on_close``, ``zygote_timeout``,
  ``zygote_grace``, ``rlimits``, ``cgroup`` (a :class:`Cgroup`: limits
  and whole-tree kill and wait) and ``sandbox`` (a :class:`Sandbox`; see
  :class:`Popen`).
- **A lost daemon:** a child's exit status is read from its pidfd (Linux
  6.15+; :attr:`Popen.zygote_lost`), and a :class:`Client` reconnects to
  its path for new spawns (see :class:`Client`). A :func:`run` child that
  the daemon had not reported yet has no pidfd (see :meth:`Client.run`).
"""

from __future__ import annotations

from subprocess import (
    DEVNULL,
    PIPE,
    STDOUT,
    CalledProcessError,
    CompletedProcess,
    SubprocessError,
    TimeoutExpired,
)
from typing import Any

from ._asyncio import Process
from ._client import (
    RECONNECT_ATTEMPTS,
    Client,
    default_client,
    default_socket_path,
    find_binary,
    python_template,
    refresh_process_state,
    run,
)
from ._errors import ZygoteError
from ._install import install, installed, uninstall
from ._popen import Popen
from ._request import Cgroup
from ._sandbox import AppliedSandbox, Landlock, Mount, Sandbox
from ._template import Template, TemplateError

__version__ = "0.1.0"


async def create_subprocess_exec(program: Any, *args: Any, **kwargs: Any) -> Process:
    """:func:`asyncio.create_subprocess_exec` through the default client."""
    from ._asyncio import create_subprocess_exec as spawn

    return await spawn(default_client(), program, *args, **kwargs)


__all__ = [
    "DEVNULL",
    "PIPE",
    "RECONNECT_ATTEMPTS",
    "STDOUT",
    "AppliedSandbox",
    "CalledProcessError",
    "Cgroup",
    "Client",
    "CompletedProcess",
    "Landlock",
    "Mount",
    "Popen",
    "Process",
    "Sandbox",
    "SubprocessError",
    "Template",
    "TemplateError",
    "TimeoutExpired",
    "ZygoteError",
    "create_subprocess_exec",
    "default_client",
    "default_socket_path",
    "find_binary",
    "install",
    "installed",
    "python_template",
    "refresh_process_state",
    "run",
    "uninstall",
]
