"""The client: a connection to a zygote, shared by every thread, and the
module's default client."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _asyncio, _request, _spawn, _template
from ._conn import Connection
from ._errors import ZygoteError
from ._popen import Popen, run_with

#: The environment variable naming the daemon's socket.
SOCKET_ENV = "ZYGOTE_SOCKET"
#: The environment variable naming the ``zygote`` binary for private zygotes.
BINARY_ENV = "ZYGOTE_BIN"
#: How many times a client tries to reconnect to its socket path after its
#: connection was lost, pausing 25 ms, then twice as long each time up to
#: 1 s (about 5 s in all), before a request fails.
RECONNECT_ATTEMPTS = 10
_RECONNECT_FIRST_PAUSE = 0.025
_RECONNECT_MAX_PAUSE = 1.0


def _close_current(box: List[Connection]) -> None:
    box[0].close()


# The stdlib's Popen, kept before install() can replace it.
_STDLIB_POPEN = subprocess.Popen


def default_socket_path() -> str:
    """``$XDG_RUNTIME_DIR/zygote.sock`` for a non-root user whose
    ``XDG_RUNTIME_DIR`` is set, ``/run/zygote/zygote.sock`` otherwise (the
    daemon's own default)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if os.geteuid() != 0 and runtime:
        return os.path.join(runtime, "zygote.sock")
    return "/run/zygote/zygote.sock"


def find_binary() -> str:
    """The ``zygote`` binary for :meth:`Client.launch_private`:
    ``$ZYGOTE_BIN``, then next to the Python executable, then ``PATH``."""
    import shutil
    import sys

    candidates: List[str] = []
    env_bin = os.environ.get(BINARY_ENV)
    if env_bin:
        candidates.append(env_bin)
    exe_dir = os.path.dirname(sys.executable) if sys.executable else ""
    if exe_dir:
        candidates.append(os.path.join(exe_dir, "zygote"))
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which("zygote")
    if on_path:
        return on_path
    env_text = f"ZYGOTE_BIN={env_bin}" if env_bin else "ZYGOTE_BIN is not set"
    raise ZygoteError(
        errno.ENOENT,
        f"no zygote binary found ({env_text}; not in {exe_dir or 'the executable directory'}; "
        "not on PATH): build it with `cargo build` and set ZYGOTE_BIN",
    )


class Client:
    """A connection to one zygote, safe to share between threads.

    ``Client(path)`` connects to ``path``, else ``$ZYGOTE_SOCKET``, else
    :func:`default_socket_path`, and raises :class:`ZygoteError` when no
    zygote answers there. Many threads may spawn at once: requests are
    multiplexed on the one connection and no lock is held across a round
    trip. Closing the client (or leaving its ``with`` block) closes the
    connection; children keep running, and their exit status then comes
    from their pidfds (Linux 6.15+; lost before).

    When the daemon goes away (crash, SIGKILL, restart), the next request
    connects to the same path again, retrying :data:`RECONNECT_ATTEMPTS`
    times with a backoff (about 5 s in all) before it raises
    :class:`ZygoteError`; a request in flight at the loss fails and is not
    retried. Children spawned before keep working through their pidfds:
    waiting reads their exit status from the pidfd (Linux 6.15), signals go
    through it. A client of a private zygote (:meth:`launch_private`)
    cannot reconnect, and says so.
    """

    def __init__(self, path: Optional[str] = None) -> None:
        self._private: Optional["subprocess.Popen[bytes]"] = None
        if path is None:
            path = os.environ.get(SOCKET_ENV) or default_socket_path()
        self.path: str = os.fspath(path)
        self._adopt(self._connect(self.path))

    def _adopt(self, conn: Connection) -> None:
        self._redial = threading.Lock()
        self._box = [conn]
        self._state: Optional[_request.ProcessState] = None
        # Dropping the last reference closes the connection (the current
        # one, after a reconnect), as close() does.
        weakref.finalize(self, _close_current, self._box)
        _clients.add(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child: the connection is the parent's, and this
        process must never read or write it (its requests would go out
        under the parent's ids, and the replies to the parent). It is
        given up here; the next request dials a connection of this
        process's own."""
        # Another thread of the parent may have held it at the fork.
        self._redial = threading.Lock()
        self._conn.forsake_after_fork()

    @property
    def _conn(self) -> Connection:
        return self._box[0]

    @classmethod
    def _connect(cls, path: str) -> Connection:
        """One attempt: connect to ``path`` and say hello."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(path)
        except OSError as error:
            sock.close()
            raise ZygoteError(
                error.errno,
                f"cannot connect to the zygote at {path}: {error.strerror} "
                f"(start one with `zygote serve`, or set {SOCKET_ENV})",
            ) from None
        return cls._handshake(sock, path)

    @staticmethod
    def _handshake(sock: socket.socket, where: str) -> Connection:
        try:
            return Connection(sock, where)
        except BaseException:
            sock.close()
            raise

    @classmethod
    def launch_private(cls) -> "Client":
        """Starts a private zygote (``zygote serve --private-fd 0``) over a
        socketpair, serving only this process, and connects to it.

        Call it early, while this process is small: the zygote itself is
        started the ordinary way. It exits once the client is closed (or
        this process dies) and its children are reaped.
        """
        binary = find_binary()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        if "ZYGOTE_LOG" not in env and "RUST_LOG" not in env:
            env["ZYGOTE_LOG"] = "warn"
        try:
            process = _STDLIB_POPEN(
                [binary, "serve", "--private-fd", "0"],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                env=env,
            )
        except OSError as error:
            ours.close()
            raise ZygoteError(
                error.errno, f"cannot start the private zygote {binary}: {error.strerror}"
            ) from None
        finally:
            theirs.close()
        self = cls.__new__(cls)
        self.path = f"private zygote pid {process.pid}"
        self._private = process
        try:
            self._adopt(cls._handshake(ours, self.path))
        except BaseException:
            process.kill()
            process.wait()
            raise
        return self

    def _connection(self) -> Connection:
        """The connection for a new request: the current one, or a new one
        to the same path when it was lost."""
        conn = self._conn
        if conn.pid != os.getpid() and conn.lost is None:
            # Forked by a call that ran no at-fork handlers.
            self._after_fork_in_child()
        if conn.lost is None:
            conn.check()
            return conn
        if self._private is not None:
            raise ZygoteError(
                conn.lost.errno,
                f"{conn.lost.strerror}; a client of a private zygote cannot reconnect: "
                "start a new one with Client.launch_private()",
            )
        with self._redial:
            if self._conn is not conn:  # another thread reconnected meanwhile
                return self._connection()
            started = time.monotonic()
            pause = _RECONNECT_FIRST_PAUSE
            for attempt in range(1, RECONNECT_ATTEMPTS + 1):
                try:
                    fresh = self._connect(self.path)
                except ZygoteError as error:
                    if error.errno in (errno.EACCES, errno.EPROTO):
                        raise  # the zygote answered and refused us
                    last = error
                else:
                    self._box[0] = fresh
                    conn.close()
                    return fresh
                if attempt < RECONNECT_ATTEMPTS:
                    time.sleep(pause)
                    pause = min(pause * 2, _RECONNECT_MAX_PAUSE)
            raise ZygoteError(
                conn.lost.errno,
                f"{conn.lost.strerror}, and reconnecting failed {RECONNECT_ATTEMPTS} times "
                f"over {time.monotonic() - started:.1f} s: {last.strerror}",
            )

    def _process_state(self) -> _request.ProcessState:
        """The settings every request copies, read at the first spawn."""
        state = self._state
        if state is None:
            state = self._state = _request.read_process_state()
        return state

    def refresh_process_state(self) -> None:
        """Makes the next spawn read this process's umask, resource limits,
        ignored signals, nice value, CPU affinity and OOM score adjustment
        again. A client reads them at its first spawn and copies them into
        every request, as reading them costs more than the rest of a
        request; call this after changing any of them (``os.umask``,
        ``resource.setrlimit``, ``signal.signal(..., SIG_IGN)``,
        ``os.nice``, ``os.sched_setaffinity``) for children to see the
        change. The nice value and the affinity are per thread on Linux:
        they are read on the thread of that next spawn. A child's own
        ``umask=`` and ``rlimits=`` arguments always apply."""
        self._state = None

    @property
    def alive(self) -> bool:
        """Whether the connection is up; after a loss, False until the next
        request reconnects."""
        return self._conn.alive and self._conn.pid == os.getpid()

    @property
    def protocol_version(self) -> int:
        """The protocol version spoken with the zygote: the newest that both
        this package and the zygote know."""
        return self._conn.protocol_version

    @property
    def features(self) -> Tuple[str, ...]:
        """The names of the optional features the zygote offers
        (``"cgroups"``, ``"pty"``, ``"large_args"``, ...). A request using one
        it does not offer fails with ``EOPNOTSUPP`` and a message naming it."""
        return self._conn.features

    @property
    def private_pid(self) -> Optional[int]:
        """The pid of the zygote :meth:`launch_private` started, if any."""
        return self._private.pid if self._private is not None else None

    def Popen(self, args: Any, *posargs: Any, **kwargs: Any) -> Popen:  # noqa: N802
        """:class:`subprocess.Popen` through this zygote (see :class:`zygote.Popen`)."""
        return Popen(args, *posargs, client=self, **kwargs)

    def run(self, args: Any, **kwargs: Any) -> "subprocess.CompletedProcess[Any]":
        """:func:`subprocess.run` through this zygote: returns a
        :class:`subprocess.CompletedProcess`, raises
        :class:`subprocess.CalledProcessError` and
        :class:`subprocess.TimeoutExpired`.

        The daemon is asked to defer the child's pidfd (``defer_spawned``):
        a child that ends within 10 to 20 ms costs one reply. Should the
        daemon be lost before it reported the child, the exit status is
        lost with it (:class:`ZygoteError`)."""
        return run_with(self.Popen, args, **kwargs)

    async def create_subprocess_exec(
        self, program: Any, *args: Any, **kwargs: Any
    ) -> _asyncio.Process:
        """:func:`asyncio.create_subprocess_exec` through this zygote; see
        :class:`zygote.Process`. Never blocks the event loop on the daemon."""
        return await _asyncio.create_subprocess_exec(self, program, *args, **kwargs)

    async def create_subprocess_shell(self, cmd: Any, **kwargs: Any) -> _asyncio.Process:
        """:func:`asyncio.create_subprocess_shell` through this zygote."""
        return await _asyncio.create_subprocess_exec(self, "/bin/sh", "-c", cmd, **kwargs)

    def status(self) -> Dict[str, Any]:
        """The daemon's counters (``zygote status``), as a dict. ``peers``
        lists the use per peer uid (``uid``, ``connections``, ``children``,
        ``children_limit``, ``connections_limit``, ``sandbox_profile``):
        every uid for root and the daemon's own uid, only its own for any
        other peer. ``spawners`` lists the per-uid spawner processes
        (``uid``, ``pid``, ``spawns``, ``restarts``). Both are empty from a
        daemon older than protocol version 3."""
        conn = self._connection()
        reply = conn.request({"Status": {"id": conn.next_id()}})
        if "Status" not in reply:
            raise ZygoteError(errno.EPROTO, f"unexpected reply to Status: {reply!r}")
        return {"peers": [], "spawners": [], **reply["Status"]}

    def python_template(
        self,
        preload: Sequence[str] = (),
        python: Any = None,
        env: Optional[Mapping[Any, Any]] = None,
        cwd: Any = None,
    ) -> _template.Template:
        """A warm template: a Python interpreter (``python``, default
        :data:`sys.executable`; a name without ``/`` is looked up in the
        ``PATH`` of ``env``) that the daemon starts as this process's user,
        with ``env`` (default: this process's environment) and ``cwd``
        (default: this process's directory), imports ``preload`` in it and
        keeps it ready; its children are forks of it (see
        :class:`zygote.Template`). The same interpreter, preload, env and
        cwd from the same user find the running one; another env (with
        ``env=None``, any change to :data:`os.environ`) starts another
        template, and a user has at most 8 (``EAGAIN`` past them). The
        template's environment is what its interpreter started with
        (``PYTHONPATH`` and the other ``PYTHON*`` variables); a child's
        ``env=`` sets only the child's :data:`os.environ`.

        Blocks until the template is ready. Raises
        :class:`zygote.TemplateError` with the daemon's message when it
        cannot start (the traceback of a preload that raised, the module
        that started a thread, the interpreter's exec error), and
        :class:`OSError` ``EOPNOTSUPP`` naming the feature ``templates``,
        before anything is sent, from a daemon that does not offer them.
        A child of a template is not a fresh interpreter: what the
        preloads set up at import time is there, shared by every child."""
        return _template.Template(
            self, preload, sys.executable if python is None else python, env, cwd
        )

    def templates(self) -> List[Dict[str, Any]]:
        """The templates this peer may see (every uid's for root and the
        daemon's own uid), one dict each: ``template`` (the handle),
        ``uid``, ``pid``, ``kind``, ``interpreter`` (bytes), ``preload``,
        ``forks``, ``restarts``, ``age_millis``, ``rss_bytes``."""
        return _template.list_templates(self)

    def close(self) -> None:
        """Closes the connection. Children keep running."""
        self._conn.close()
        process = self._private
        if process is not None:
            # It exits once its children are reaped; reap it then.
            threading.Thread(target=process.wait, name="zygote-private-reaper", daemon=True).start()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zygote.Client {self.path} {'connected' if self.alive else 'closed'}>"


#: Every client of this process, for the at-fork handler.
_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
_spawn.set_default_factory(Client)


def refresh_process_state() -> None:
    """:meth:`Client.refresh_process_state` for every client of this process,
    the default one (which :func:`run` and the installed drop-in use)
    included."""
    for client in list(_clients):
        client.refresh_process_state()


def default_client() -> Client:
    """The module's client, connected on first use (``$ZYGOTE_SOCKET`` or
    the default path) and again after its connection was lost or this
    process forked."""
    client = _spawn.default()
    assert isinstance(client, Client)
    return client


def run(args: Any, **kwargs: Any) -> "subprocess.CompletedProcess[Any]":
    """:func:`subprocess.run` through the default client."""
    return run_with(Popen, args, **kwargs)


def python_template(
    preload: Sequence[str] = (),
    python: Any = None,
    env: Optional[Mapping[Any, Any]] = None,
    cwd: Any = None,
) -> _template.Template:
    """:meth:`Client.python_template` through the default client (the one
    current at each spawn, reconnected after a loss or a fork)."""
    return _template.Template(None, preload, sys.executable if python is None else python, env, cwd)
