"""The client: a connection to a zygote, shared by every thread, and the
module's default client."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import threading
import weakref
from typing import Any, Dict, List, Optional

from ._conn import Connection
from ._errors import ZygoteError
from ._popen import Popen, run_with

#: The environment variable naming the daemon's socket.
SOCKET_ENV = "ZYGOTE_SOCKET"
#: The environment variable naming the ``zygote`` binary for private zygotes.
BINARY_ENV = "ZYGOTE_BIN"

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
    connection; children keep running, but their exit status is lost.
    """

    def __init__(self, path: Optional[str] = None) -> None:
        self._private: Optional["subprocess.Popen[bytes]"] = None
        if path is None:
            path = os.environ.get(SOCKET_ENV) or default_socket_path()
        self.path: str = os.fspath(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.path)
        except OSError as error:
            sock.close()
            raise ZygoteError(
                error.errno,
                f"cannot connect to the zygote at {self.path}: {error.strerror} "
                f"(start one with `zygote serve`, or set {SOCKET_ENV})",
            ) from None
        self._conn = self._handshake(sock, self.path)
        # Dropping the last reference closes the connection, as close() does.
        weakref.finalize(self, self._conn.close)

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
            self._conn = cls._handshake(ours, self.path)
        except BaseException:
            process.kill()
            process.wait()
            raise
        weakref.finalize(self, self._conn.close)
        return self

    def _connection(self) -> Connection:
        self._conn.check()
        return self._conn

    @property
    def alive(self) -> bool:
        """Whether the connection is still up."""
        return self._conn.alive and self._conn.pid == os.getpid()

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
        :class:`subprocess.TimeoutExpired`."""
        return run_with(self.Popen, args, **kwargs)

    async def create_subprocess_exec(self, program: Any, *args: Any, **kwargs: Any) -> Any:
        """:func:`asyncio.create_subprocess_exec` through this zygote; see
        :class:`zygote.Process`. Never blocks the event loop on the daemon."""
        from ._asyncio import create_subprocess_exec

        return await create_subprocess_exec(self, program, *args, **kwargs)

    async def create_subprocess_shell(self, cmd: Any, **kwargs: Any) -> Any:
        """:func:`asyncio.create_subprocess_shell` through this zygote."""
        from ._asyncio import create_subprocess_exec

        return await create_subprocess_exec(self, "/bin/sh", "-c", cmd, **kwargs)

    def status(self) -> Dict[str, Any]:
        """The daemon's counters (``zygote status``), as a dict."""
        conn = self._connection()
        reply = conn.request({"Status": {"id": conn.next_id()}})
        if "Status" not in reply:
            raise ZygoteError(errno.EPROTO, f"unexpected reply to Status: {reply!r}")
        return dict(reply["Status"])

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


_default: Optional[Client] = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The module's client, connected on first use (``$ZYGOTE_SOCKET`` or
    the default path) and again after its connection was lost or this
    process forked."""
    global _default
    client = _default
    if client is not None and client.alive:
        return client
    with _default_lock:
        if _default is None or not _default.alive:
            _default = Client()
        return _default


def run(args: Any, **kwargs: Any) -> "subprocess.CompletedProcess[Any]":
    """:func:`subprocess.run` through the default client."""
    return run_with(Popen, args, **kwargs)
