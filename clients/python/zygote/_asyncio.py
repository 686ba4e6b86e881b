"""asyncio: :func:`create_subprocess_exec` through the zygote.

The request is sent with ``MSG_DONTWAIT`` (waiting for writability on the
loop if the socket buffer is ever full), and the reader thread hands the
replies to the loop with ``call_soon_threadsafe``: no call here blocks the
event loop on the daemon.
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import signal
import subprocess
import weakref
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import _lost, _request, _sandbox, _spawn
from ._conn import Connection, SpawnSlot
from ._errors import ZygoteError
from ._popen import kill_tree, returncode_of, tree_of

PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT
DEVNULL = subprocess.DEVNULL


class Process:
    """Mirrors :class:`asyncio.subprocess.Process`: ``pid``, ``returncode``,
    ``stdin`` (a :class:`asyncio.StreamWriter`), ``stdout``/``stderr``
    (:class:`asyncio.StreamReader`), ``wait()``, ``communicate()``,
    ``send_signal()``, ``terminate()``, ``kill()``; plus ``pidfd``,
    ``usage``, ``timed_out``, ``tree_usage``, ``oom_killed`` and
    ``zygote_lost`` (see :class:`zygote.Popen`: when the daemon is lost,
    ``wait()`` reads the status from the pidfd on Linux 6.15+)."""

    def __init__(
        self,
        pid: int,
        pidfd: int,
        exited: "asyncio.Future[None]",
        slot: SpawnSlot,
        stdin: Optional[asyncio.StreamWriter],
        stdout: Optional[asyncio.StreamReader],
        stderr: Optional[asyncio.StreamReader],
        client: _spawn.Endpoint,
        conn: Connection,
        spawn_id: int,
        cgroup: Optional[_request.Cgroup],
    ) -> None:
        self.pid = pid
        self.pidfd: Optional[int] = pidfd
        self._gone = _lost.GoneClock()
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: Optional[int] = None
        self.usage: Optional[Dict[str, int]] = None
        self.timed_out = False
        self.tree_usage: Optional[Dict[str, Any]] = None
        self.oom_killed = False
        #: What confined the child, as the daemon reported it.
        self.sandbox: Optional[_sandbox.AppliedSandbox] = None
        self.zygote_lost = False
        self._conn = conn
        self._spawn_id = spawn_id
        self._cgroup = cgroup
        self._exited = exited
        self._slot = slot
        self._client = client  # keeps the connection open while this lives
        weakref.finalize(self, os.close, pidfd)

    def __repr__(self) -> str:
        return f"<zygote.Process {self.pid}>"

    def _collect(self) -> None:
        if self.returncode is not None or not self._slot.exited.is_set():
            return
        exit_notice = self._slot.exit
        if exit_notice is None:
            error = self._slot.error
            assert error is not None and self.pidfd is not None
            _, raw = _lost.state(self.pidfd, self.pid, error, self._gone)
            if raw is not None:
                self._lost_status(raw)
            return
        self.usage = dict(exit_notice["usage"])
        self.timed_out = bool(exit_notice["timed_out"])
        self.tree_usage = tree_of(exit_notice)
        self.oom_killed = bool(self.tree_usage and self.tree_usage["oom_kills"])
        self.returncode = returncode_of(exit_notice)

    def _lost_status(self, raw: int) -> None:
        if self.returncode is None:
            self.zygote_lost = True
            self.usage = None
            self.returncode = _lost.returncode_of_wait_status(raw)

    async def wait(self) -> int:
        """Waits for the child to exit and returns its returncode."""
        if not self._slot.exited.is_set():
            await asyncio.shield(self._exited)
        self._collect()
        if self.returncode is None:
            # The daemon is gone: the pidfd stands in.
            error = self._slot.error
            assert error is not None and self.pidfd is not None
            self._lost_status(await _lost.wait_async(self.pidfd, self.pid, error, self._gone))
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signals the child through its pidfd; nothing once it has exited.
        ``SIGKILL`` with ``Cgroup(kill_tree=True)`` ends the whole tree."""
        try:
            self._collect()
        except ZygoteError:
            pass
        if self.returncode is not None or self.pidfd is None:
            return
        if (
            sig == signal.SIGKILL
            and self._cgroup is not None
            and self._cgroup.kill_tree
            and kill_tree(self._conn, self._spawn_id, wait=False)
        ):
            return
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def _feed(self, data: Optional[bytes]) -> None:
        assert self.stdin is not None
        try:
            if data:
                self.stdin.write(data)
                await self.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child does not read its input, as in asyncio
        self.stdin.close()

    async def _read(self, stream: Optional[asyncio.StreamReader]) -> Optional[bytes]:
        if stream is None:
            return None
        return await stream.read()

    async def communicate(
        self, input: Optional[bytes] = None
    ) -> Tuple[Optional[bytes], Optional[bytes]]:
        """Sends ``input``, reads stdout and stderr to their end, waits."""
        feeding = self._feed(input) if self.stdin is not None else asyncio.sleep(0)
        _, out, err = await asyncio.gather(
            feeding, self._read(self.stdout), self._read(self.stderr)
        )
        await self.wait()
        return out, err


def _resolve_user(
    user: Any, group: Any, extra_groups: Any
) -> Tuple[Optional[int], Optional[int], Optional[List[int]]]:
    uid = pwd.getpwnam(user).pw_uid if isinstance(user, str) else user
    gid = grp.getgrnam(group).gr_gid if isinstance(group, str) else group
    gids = None
    if extra_groups is not None:
        gids = [grp.getgrnam(g).gr_gid if isinstance(g, str) else int(g) for g in extra_groups]
    return uid, gid, gids


def _set_once(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


async def _send(
    loop: asyncio.AbstractEventLoop, conn: Connection, frame: bytes, fds: List[int]
) -> None:
    while not conn.try_send(frame, fds):
        writable: "asyncio.Future[None]" = loop.create_future()
        loop.add_writer(conn.fileno(), _set_once, writable)
        try:
            await asyncio.wait_for(writable, 30)
        except asyncio.TimeoutError:
            raise ZygoteError(
                0, f"the zygote at {conn.where} has not read a request for 30 s"
            ) from None
        finally:
            loop.remove_writer(conn.fileno())


def _stdio(spec: Any, number: int) -> Tuple[Any, ...]:
    if spec is None:
        return ("inherit",)
    if spec == PIPE:
        return ("pipe",)
    if spec == DEVNULL:
        return ("null",)
    if isinstance(spec, int):
        return ("fd", spec)
    return ("fd", spec.fileno())


class _NotSentError(Exception):
    """The connection was found gone by the send itself: the request never
    left, so it may go again on a new connection."""

    def __init__(self, error: ZygoteError) -> None:
        super().__init__(error)
        self.error = error


async def create_subprocess_exec(
    client: _spawn.Endpoint, program: Any, *args: Any, **kwargs: Any
) -> Process:
    """See :meth:`zygote.Client.create_subprocess_exec`."""
    try:
        return await _create_once(client, program, *args, **kwargs)
    except _NotSentError:
        pass  # lost at the instant of sending: one more try reconnects
    try:
        return await _create_once(client, program, *args, **kwargs)
    except _NotSentError as lost:
        raise lost.error from None


async def _create_once(
    client: _spawn.Endpoint,
    program: Any,
    *args: Any,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    limit: int = 2**16,
    cwd: Any = None,
    env: Optional[Mapping[Any, Any]] = None,
    executable: Any = None,
    close_fds: bool = True,
    pass_fds: Any = (),
    start_new_session: bool = False,
    process_group: Optional[int] = None,
    user: Any = None,
    group: Any = None,
    extra_groups: Any = None,
    umask: int = -1,
    _zygote_template: Optional[Tuple[Any, int]] = None,
    **zygote_options: Any,
) -> Process:
    """One try of :func:`create_subprocess_exec`; ``zygote_options`` are
    :class:`zygote._request.ZygoteOptions`' (``kill_on_close``,
    ``zygote_timeout``, ``zygote_grace``, ``rlimits``, ``cgroup``, ``sandbox``).
    With ``_zygote_template`` (a template and its handle) the child is a
    fork of that template, and ``program, *args`` what follows ``python``."""
    options = _request.ZygoteOptions(**zygote_options)
    handle: Optional[int] = None
    if _zygote_template is not None:
        _request.refuse_for_template(executable, False, user, group, extra_groups, options.sandbox)
        handle = _zygote_template[1]
    loop = asyncio.get_running_loop()
    if client.alive:
        conn = client._connection()
    else:
        # Reconnecting sleeps between attempts: not on the loop.
        conn = await loop.run_in_executor(None, client._connection)
    uid, gid, gids = _resolve_user(user, group, extra_groups)
    local_pipe: Optional[Tuple[int, int]] = None
    specs = [_stdio(stdin, 0), _stdio(stdout, 1), _stdio(stderr, 2)]
    if stderr == STDOUT:
        if specs[1][0] == "pipe":
            # One pipe for both: the daemon's pipes are one per stream.
            local_pipe = os.pipe()
            specs[1] = specs[2] = ("fd", local_pipe[1])
        else:
            specs[2] = specs[1]
    spec = _request.ChildSpec(
        argv=[program, *args],
        program=program if executable is None else executable,
        stdio=specs,
        close_fds=close_fds,
        pass_fds=pass_fds,
        cwd=cwd,
        env=env,
        gid=gid,
        gids=gids,
        uid=uid,
        umask=umask,
        start_new_session=start_new_session,
        process_group=process_group,
        options=options,
        template=handle,
    )
    try:
        request = _spawn.Outgoing(conn, spec, SpawnSlot(), client._process_state())
    except BaseException as error:
        if local_pipe is not None:
            os.close(local_pipe[0])
            os.close(local_pipe[1])
        if isinstance(error, _request.UnservableError):
            raise ValueError(f"the zygote cannot start this child: {error}") from None
        raise
    exited = await _submit(loop, request, local_pipe)
    slot = request.slot
    if slot.reply is None or "SpawnFailed" in slot.reply:
        if local_pipe is not None:
            os.close(local_pipe[0])
        if slot.reply is None:
            assert slot.error is not None
            raise ZygoteError(slot.error.errno, slot.error.strerror)
        raise _request.spawn_error(slot.reply["SpawnFailed"], program, cwd)
    streams = await _streams(loop, slot, specs, local_pipe, limit)
    process = Process(
        slot.reply["Spawned"]["pid"],
        slot.fds[0],
        exited,
        slot,
        *streams,
        client,
        conn,
        request.request_id,
        options.cgroup,
    )
    process.sandbox = _sandbox.AppliedSandbox.from_wire(slot.reply["Spawned"].get("sandbox"))
    return process


async def _submit(
    loop: asyncio.AbstractEventLoop,
    request: _spawn.Outgoing,
    local_pipe: Optional[Tuple[int, int]],
) -> "asyncio.Future[None]":
    """Registers and sends the request, closes our copy of the child's end
    of ``local_pipe``, and waits for the first reply; returns the future
    of the exit notice. Raises :class:`_NotSentError` when the request
    never left because the connection was found gone."""
    conn = request.conn
    spawned: "asyncio.Future[None]" = loop.create_future()
    exited: "asyncio.Future[None]" = loop.create_future()

    def wake(future: "asyncio.Future[None]") -> None:
        def set_it() -> None:
            if not future.done():
                future.set_result(None)

        try:
            loop.call_soon_threadsafe(set_it)
        except RuntimeError:
            pass  # the loop is closed; nobody waits any more

    slot = request.slot
    slot.on_spawn = lambda: wake(spawned)
    slot.on_exit = lambda: wake(exited)
    sent = False
    try:
        try:
            request.register()
            await _send(loop, conn, request.frame, request.fds)
            sent = True
        finally:
            if local_pipe is not None:
                os.close(local_pipe[1])
        await spawned
    except BaseException as error:
        request.abandon(sent)
        if local_pipe is not None:
            os.close(local_pipe[0])
        if (
            not sent
            and isinstance(error, ZygoteError)
            and await loop.run_in_executor(None, conn.ended_by_send, error)
        ):
            raise _NotSentError(error) from None
        raise
    return exited


async def _streams(
    loop: asyncio.AbstractEventLoop,
    slot: SpawnSlot,
    specs: List[Tuple[Any, ...]],
    local_pipe: Optional[Tuple[int, int]],
    limit: int,
) -> Tuple[
    Optional[asyncio.StreamWriter], Optional[asyncio.StreamReader], Optional[asyncio.StreamReader]
]:
    """The asyncio streams on the pipe ends the daemon returned (after the
    pidfd, in stream order) or on ``local_pipe``."""
    pipe_iter = iter(slot.fds[1:])
    writer = reader_out = reader_err = None
    if specs[0][0] == "pipe":
        write_pipe = open(next(pipe_iter), "wb", buffering=0)
        protocol_for_writer = asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=limit))
        transport, _ = await loop.connect_write_pipe(lambda: protocol_for_writer, write_pipe)
        writer = asyncio.StreamWriter(transport, protocol_for_writer, None, loop)
    out_fd = (
        local_pipe[0]
        if local_pipe is not None
        else (next(pipe_iter) if specs[1][0] == "pipe" else None)
    )
    if out_fd is not None:
        reader_out = await _reader(loop, out_fd, limit)
    if specs[2][0] == "pipe":
        reader_err = await _reader(loop, next(pipe_iter), limit)
    return writer, reader_out, reader_err


async def _reader(loop: asyncio.AbstractEventLoop, fd: int, limit: int) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), open(fd, "rb", buffering=0)
    )
    return reader
