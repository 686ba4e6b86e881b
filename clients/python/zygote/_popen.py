"""``Popen`` and ``run`` through the zygote.

:class:`Popen` subclasses :class:`subprocess.Popen`: the stdlib parses the
arguments, makes the pipes and wraps them in file objects, and implements
``communicate``, text mode and the context manager. Only the steps that
touch the child are replaced: starting it (a ``Spawn`` request instead of
fork/exec), waiting for it (the daemon's ``Exited`` notice instead of
``waitpid``) and signalling it (through its pidfd).
"""

from __future__ import annotations

import builtins
import errno
import locale
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from . import _lost, _request, _sandbox, _spawn, _wire
from ._conn import Connection, SpawnSlot
from ._errors import ZygoteError

_HAS_PROCESS_GROUP = sys.version_info >= (3, 11)
#: The returncode a deferred run() takes once it raised its spawn's failure
#: or loss, so that the kill and wait of its cleanup do nothing. The object
#: dies with the exception; 255 is what the stdlib's forked child exits
#: with when its exec fails.
_NO_STATUS = 255
#: The longest pause between signals by spawn id answered ESRCH (the child
#: not started yet).
_SIGNAL_RETRY_SECONDS = 0.016
#: Signals the stdlib resets in the child when ``restore_signals`` is true.
_RESTORED = {
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name)
}


def _signals_match_zygote(restore_signals: bool) -> bool:
    """Whether a forked child would start with default dispositions and an
    empty mask, as every zygote child does."""
    if signal.pthread_sigmask(signal.SIG_BLOCK, []):
        return False
    for number in signal.valid_signals():
        if restore_signals and number in _RESTORED:
            continue
        try:
            if signal.getsignal(number) is signal.SIG_IGN:
                return False
        except (ValueError, OSError):
            continue
    return True


#: This package's directory: its frames are skipped when a warning names
#: the caller's line.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: ``universal_newlines``' place among :class:`subprocess.Popen`'s
#: positional arguments after ``args``.
_UNIVERSAL_NEWLINES_POSITION = 10


def _caller_stacklevel() -> int:
    """The ``stacklevel`` for :func:`warnings.warn` called by this module's
    caller that names the first frame outside zygote and :mod:`subprocess`,
    the line the stdlib's own warning would name."""
    skipped = (_PACKAGE_DIR + os.sep, subprocess.__file__)
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(skipped):
        frame = frame.f_back
        level += 1
    return level


def _warn_default_encoding(posargs: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
    """Text mode without an ``encoding`` under ``-X warn_default_encoding``:
    the stdlib's ``EncodingWarning`` (Python 3.11+, where subprocess warns),
    pointing at the caller's line, not at this package's call into
    :mod:`subprocess`; the encoding the stdlib would pick is then passed
    on, so that it does not warn again from here."""
    if sys.version_info < (3, 11) or not sys.flags.warn_default_encoding:
        return
    if kwargs.get("encoding") is not None:
        return
    universal_newlines = kwargs.get("universal_newlines")
    if len(posargs) > _UNIVERSAL_NEWLINES_POSITION:
        universal_newlines = posargs[_UNIVERSAL_NEWLINES_POSITION]
    text = kwargs.get("text")
    if (
        text is not None
        and universal_newlines is not None
        and bool(text) != bool(universal_newlines)
    ):
        return  # subprocess raises for it first
    if not (kwargs.get("errors") or text or universal_newlines):
        return
    warnings.warn(
        "'encoding' argument not specified.",
        getattr(builtins, "EncodingWarning"),  # noqa: B009 - Python 3.10+
        _caller_stacklevel(),
    )
    kwargs["encoding"] = "utf-8" if sys.flags.utf8_mode else locale.getencoding()


def returncode_of(exit_notice: Mapping[str, Any]) -> int:
    """``subprocess``'s returncode: the exit code, or ``-N`` for signal N."""
    status = exit_notice["status"]
    if "Exited" in status:
        return int(status["Exited"])
    return -int(status["Signaled"]["signal"])


def tree_of(exit_notice: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The cgroup's usage from an exit notice, as a dict, if it has one."""
    tree = exit_notice.get("tree")
    return dict(tree) if tree is not None else None


def kill_tree(conn: Optional[Connection], spawn_id: int, wait: bool = True) -> bool:
    """Asks the daemon to SIGKILL the child's whole cgroup (``cgroup.kill``);
    False when it cannot (lost, or the child is gone), and the pidfd must do.
    Without ``wait`` the request is only sent (asyncio must not block on
    the daemon); its reply is dropped."""
    if conn is None or not conn.alive:
        return False
    message = {
        "Signal": {"id": conn.next_id(), "spawn_id": spawn_id, "signal": int(signal.SIGKILL)}
    }
    try:
        if not wait:
            return conn.try_send(_wire.encode_client(message), ())
        reply = conn.request(message)
    except ZygoteError:
        return False
    return "SignalSent" in reply


class Popen(subprocess.Popen):  # type: ignore[type-arg]
    """:class:`subprocess.Popen`, with the child started by a zygote.

    Takes every argument of :class:`subprocess.Popen` (``process_group``
    also on Python < 3.11) plus zygote's own, keyword-only:

    - ``client``: the :class:`~zygote.Client` to use (default: the
      module's default client, ``$ZYGOTE_SOCKET`` or the default path);
    - ``kill_on_close``: ``True`` for ``SIGKILL``, or a signal number, sent
      by the daemon to the child (to its process group when it leads one)
      when the connection closes, e.g. when this process dies;
    - ``zygote_timeout``/``zygote_grace`` (seconds): the daemon sends
      ``SIGTERM`` after ``zygote_timeout`` and ``SIGKILL`` ``zygote_grace``
      later (default 5 s); :attr:`timed_out` then says so;
    - ``rlimits``: ``{resource.RLIMIT_X: (soft, hard) or value}`` set in the
      child on top of this process's own limits, which it gets anyway;
    - ``cgroup``: a :class:`zygote.Cgroup` with limits for the child's own
      cgroup (``memory_max``, ``pids_max``, ``cpu_max``, ...), and
      ``kill_tree``/``wait_tree``; :attr:`tree_usage` then holds the whole
      tree's CPU time and peak memory, :attr:`oom_killed` whether the OOM
      killer ended a process of it;
    - ``sandbox``: a :class:`zygote.Sandbox` that confines the child (the
      daemon must offer the feature ``sandbox``, or the spawn raises
      :class:`OSError` ``EOPNOTSUPP`` before anything is sent);
      :attr:`sandbox` is then what the daemon applied.

    Differences from the stdlib: the child's parent is the zygote, not this
    process (``os.getppid()`` in the child, ``waitpid`` here fails); it gets
    only fds 0-2 plus ``pass_fds`` (and with ``close_fds=False`` every
    inheritable fd, at most the daemon's 64 per spawn); its signal
    dispositions are all default and its mask empty; ``preexec_fn`` is not
    supported (:class:`ValueError`). :attr:`pidfd` is the child's pidfd,
    :attr:`usage` its resource usage once it has exited.

    When the daemon is lost (crash, SIGKILL, restart) before it reports the
    exit, waiting reads the exit status from the pidfd instead (Linux 6.15
    and later, once the child's new parent has reaped it):
    :attr:`zygote_lost` is then true and :attr:`usage` ``None``. Before
    6.15 waiting raises :class:`ZygoteError`.
    """

    _zygote_fallback = False
    _zygote_installed = False
    pidfd: Optional[int] = None
    usage: Optional[Dict[str, int]] = None
    timed_out: bool = False
    #: The cgroup's usage (``user_micros``, ``system_micros``,
    #: ``memory_peak_bytes``, ``oom_kills``, ``memory_max``), when the
    #: request had a :class:`zygote.Cgroup`.
    tree_usage: Optional[Dict[str, Any]] = None
    oom_killed: bool = False
    #: What confined the child, as the daemon reported it; ``None`` when
    #: nothing did (or, for a child of run() that ended at once, when the
    #: daemon sent its exit alone).
    sandbox: Optional[_sandbox.AppliedSandbox] = None
    #: True when the status was read from the pidfd (the daemon was lost).
    zygote_lost: bool = False
    _zygote_slot: Optional[SpawnSlot] = None
    _zygote_conn: Optional[Connection] = None
    _zygote_spawn_id: int = 0
    _zygote_defer: bool = False
    #: A deferred spawn with pipes of ours whose first reply is not taken
    #: yet: ``pid`` is ``None`` until then (see :meth:`_zygote_settle`).
    _zygote_pending: bool = False
    _zygote_release: Optional[weakref.finalize] = None
    _zygote_program: Any = None
    _zygote_cwd: Any = None
    #: Why the installed drop-in used the stdlib for this call, if it did.
    zygote_fallback_reason: Optional[str] = None
    _zygote_forced_fallback: Optional[str] = None

    def __init__(
        self,
        args: Any,
        *posargs: Any,
        client: Optional[_spawn.Endpoint] = None,
        kill_on_close: Union[None, bool, int] = None,
        zygote_timeout: Optional[float] = None,
        zygote_grace: float = _request.DEFAULT_GRACE_SECONDS,
        rlimits: Optional[Mapping[int, Union[int, Tuple[int, int]]]] = None,
        cgroup: Optional[_request.Cgroup] = None,
        sandbox: Optional[_sandbox.Sandbox] = None,
        _zygote_defer: bool = False,
        _zygote_template: Optional[Tuple[Any, int]] = None,
        **kwargs: Any,
    ) -> None:
        self._zygote_client = client
        self._zygote_defer = _zygote_defer
        #: The template (a zygote.Template) and its handle, for a child of one.
        self._zygote_template = _zygote_template
        self._zygote_options = _request.ZygoteOptions(
            kill_on_close=kill_on_close,
            zygote_timeout=zygote_timeout,
            zygote_grace=zygote_grace,
            rlimits=rlimits,
            cgroup=cgroup,
            sandbox=sandbox,
        )
        self._zygote_process_group: Optional[int] = None
        if not _HAS_PROCESS_GROUP and "process_group" in kwargs:
            self._zygote_process_group = kwargs.pop("process_group")
        self._zygote_exit_lock = threading.Lock()
        _warn_default_encoding(posargs, kwargs)
        super().__init__(args, *posargs, **kwargs)

    # --- starting ---------------------------------------------------------

    def _execute_child(
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: int,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: bool,
        gid: Optional[int],
        gids: Optional[List[int]],
        uid: Optional[int],
        umask: int,
        start_new_session: bool,
        *rest: Any,
    ) -> None:
        stdlib_args = (
            args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
            creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
            restore_signals, gid, gids, uid, umask, start_new_session, *rest,
        )  # fmt: skip
        process_group = rest[0] if rest else self._zygote_process_group
        if process_group is not None and process_group < 0:
            process_group = None

        def fall_back(reason: str) -> None:
            if self._zygote_options.sandbox is not None:
                # The stdlib cannot confine the child: refused, never run
                # without its sandbox.
                raise ZygoteError(
                    errno.EOPNOTSUPP,
                    f"the zygote cannot start this child ({reason}), and subprocess "
                    "cannot apply its sandbox",
                )
            self._zygote_fallback = True
            self.zygote_fallback_reason = reason
            super(Popen, self)._execute_child(*stdlib_args)  # type: ignore[misc]

        if preexec_fn is not None:
            if self._zygote_installed:
                return fall_back("preexec_fn runs Python code in a forked child")
            raise ValueError("preexec_fn cannot run in a zygote child; use subprocess for it")
        if self._zygote_installed and self._zygote_forced_fallback is not None:
            return fall_back(self._zygote_forced_fallback)
        if self._zygote_installed and not _signals_match_zygote(restore_signals):
            return fall_back("a signal is ignored or blocked here, which a forked child would keep")

        template = self._zygote_template
        handle: Optional[int] = None
        if template is not None:
            _request.refuse_for_template(
                executable, shell, uid, gid, gids, self._zygote_options.sandbox
            )
            argv, _ = _request.normalize_args(args, False, None)
            template_object, handle = template
            program = template_object.python
            sys.audit("subprocess.Popen", program, [program, *argv], cwd, env)
        else:
            argv, program = _request.normalize_args(args, shell, executable)
            sys.audit("subprocess.Popen", program, argv, cwd, env)
        spec = _request.ChildSpec(
            argv=argv,
            program=program,
            stdio=[
                ("inherit",) if p2cread == -1 else ("fd", p2cread),
                ("inherit",) if c2pwrite == -1 else ("fd", c2pwrite),
                ("inherit",) if errwrite == -1 else ("fd", errwrite),
            ],
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
            options=self._zygote_options,
            defer=self._zygote_defer,
            template=handle,
        )
        try:
            client = self._zygote_client
            request = _spawn.send(client if client is not None else _spawn.default(), spec)
        except _request.UnservableError as error:
            if self._zygote_installed:
                return fall_back(str(error))
            raise ValueError(f"the zygote cannot start this child: {error}") from None
        except ZygoteError as error:
            if self._zygote_installed:
                return fall_back(f"no zygote: {error}")
            raise
        # The daemon holds its own copies now; ours of the child's ends go.
        pipes = (p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._zygote_take(request, pipes, program, cwd)

    def _zygote_take(
        self, request: _spawn.Outgoing, pipes: Tuple[int, ...], program: Any, cwd: Any
    ) -> None:
        """After the request left: our copies of the child's pipe ends
        close, and the child is waited for (or, deferred, left to wait())."""
        slot, conn, request_id = request.slot, request.conn, request.request_id
        p2cwrite, c2pread, errread = pipes[1], pipes[2], pipes[4]
        try:
            self._close_pipe_fds(*pipes)  # type: ignore[attr-defined]
            self._zygote_slot = slot
            self._zygote_conn = conn
            self._zygote_spawn_id = request_id
            if self._zygote_defer and (p2cwrite != -1 or c2pread != -1 or errread != -1):
                # A child blocked on our pipes (a full stdout, an unread
                # stdin) would hold its Spawned back until the daemon's
                # deadline: the caller's communicate() runs first and its
                # wait() takes the first reply. A failed spawn's fds are
                # closed by the daemon, so the pipes end at once.
                self._zygote_pending = True
                self._zygote_program = program
                self._zygote_cwd = cwd
                # Dropped with its reply not taken (a KeyboardInterrupt in
                # run()'s cleanup): the child is killed once reported, and
                # its pidfd closed. At exit it is left running, as the
                # stdlib does.
                self._zygote_release = weakref.finalize(self, conn.unregister, request_id, True)
                self._zygote_release.atexit = False
                self._child_created = True
                return
            conn.wait(slot.spawned)
        except BaseException:
            conn.unregister(request_id, sent=True)
            raise
        if slot.reply is None:
            assert slot.error is not None
            raise ZygoteError(slot.error.errno, slot.error.strerror)
        if "SpawnFailed" in slot.reply:
            raise _request.spawn_error(slot.reply["SpawnFailed"], program, cwd)
        self._child_created = True
        self._zygote_adopt(slot)

    def _zygote_adopt(self, slot: SpawnSlot) -> None:
        """Takes the child of a ``Spawned``, or of an ``Exited`` alone."""
        assert slot.reply is not None
        if "Exited" in slot.reply:
            # Deferred, and already over: no pidfd, the notice has it all.
            self.pid = slot.reply["Exited"]["pid"]
            return
        pidfd, *extra = slot.fds
        for fd in extra:
            os.close(fd)
        self.pid = slot.reply["Spawned"]["pid"]
        self.sandbox = _sandbox.AppliedSandbox.from_wire(slot.reply["Spawned"].get("sandbox"))
        self.pidfd = pidfd
        self._zygote_gone = _lost.GoneClock()
        weakref.finalize(self, os.close, pidfd)

    def _zygote_settle(self) -> None:
        """Takes a pending spawn's first reply, which has come: its child,
        or its failure (the stdlib's exception, as from ``__init__``) or the
        daemon's loss, raised once."""
        slot = self._zygote_slot
        assert slot is not None and slot.spawned.is_set()
        if not self._zygote_pending:
            return
        self._zygote_pending = False
        if self._zygote_release is not None:
            self._zygote_release.detach()
        reply = slot.reply
        if reply is not None and "SpawnFailed" not in reply:
            self._zygote_adopt(slot)
            return
        self._child_created = False
        self.returncode = _NO_STATUS
        if reply is not None:
            raise _request.spawn_error(reply["SpawnFailed"], self._zygote_program, self._zygote_cwd)
        assert slot.error is not None
        raise ZygoteError(
            slot.error.errno,
            f"{slot.error.strerror}; the exit status of {self._zygote_program} is lost: "
            "run() asked the daemon to defer the child's pidfd, and the daemon was lost "
            "before it reported the child",
        )

    # --- waiting ----------------------------------------------------------

    def _zygote_collect(self) -> bool:
        """Takes the exit notice if it came (or, the daemon lost, the
        pidfd's status); True once returncode is set."""
        slot = self._zygote_slot
        if self.returncode is not None:
            return True
        if slot is None or not slot.exited.is_set():
            return False
        if slot.exit is None:
            assert slot.error is not None and self.pidfd is not None
            _, raw = _lost.state(self.pidfd, self.pid, slot.error, self._zygote_gone)
            if raw is None:
                return False
            self._zygote_lost_status(raw)
            return True
        with self._zygote_exit_lock:
            if self.returncode is None:
                self.usage = dict(slot.exit["usage"])
                self.timed_out = bool(slot.exit["timed_out"])
                self.tree_usage = tree_of(slot.exit)
                self.oom_killed = bool(self.tree_usage and self.tree_usage["oom_kills"])
                self.returncode = returncode_of(slot.exit)
        return True

    def _zygote_lost_status(self, raw: int) -> None:
        with self._zygote_exit_lock:
            if self.returncode is None:
                self.zygote_lost = True
                self.usage = None
                self.returncode = _lost.returncode_of_wait_status(raw)

    def _internal_poll(self, *args: Any, **kwargs: Any) -> Optional[int]:
        if self._zygote_fallback:
            return super()._internal_poll(*args, **kwargs)  # type: ignore[misc,no-any-return]
        deadstate = kwargs.get("_deadstate", args[0] if args else None)
        if self.returncode is None and self._zygote_conn is not None:
            self._zygote_conn.collect()  # the replies that have come, if nobody reads them
        if self._zygote_pending:
            assert self._zygote_slot is not None
            if not self._zygote_slot.spawned.is_set():
                return None
            try:
                self._zygote_settle()
            except OSError:
                if deadstate is None:
                    raise
                return self.returncode
        try:
            self._zygote_collect()
        except ZygoteError:
            if deadstate is None:
                raise
            self.returncode = deadstate
        return self.returncode

    def _wait(self, timeout: Optional[float]) -> int:
        if self._zygote_fallback:
            return super()._wait(timeout)  # type: ignore[misc,no-any-return]
        if self.returncode is not None:
            return self.returncode
        slot, conn = self._zygote_slot, self._zygote_conn
        assert slot is not None and conn is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._zygote_pending:
            if not conn.wait(slot.spawned, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
            self._zygote_settle()
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())
        if not conn.wait(slot.exited, timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        if slot.exit is None and self.returncode is None:
            # The daemon is gone: the pidfd stands in.
            assert slot.error is not None and self.pidfd is not None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            raw = _lost.wait(self.pidfd, self.pid, slot.error, self._zygote_gone, left)
            if raw is None:
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
            self._zygote_lost_status(raw)
        self._zygote_collect()
        assert self.returncode is not None
        return self.returncode

    # --- signalling -------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` through the pidfd, unless the child is known to
        have exited (then nothing, as in the stdlib)."""
        if self._zygote_fallback:
            super().send_signal(sig)
            return
        if self._zygote_pending and not self._zygote_signal_pending(sig):
            return
        try:
            self.poll()
        except ZygoteError:
            pass
        if self.returncode is not None or self.pidfd is None:
            return
        cgroup = self._zygote_options.cgroup
        if (
            sig == signal.SIGKILL
            and cgroup is not None
            and cgroup.kill_tree
            and kill_tree(self._zygote_conn, self._zygote_spawn_id)
        ):
            return
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            pass

    def _zygote_signal_pending(self, sig: int) -> bool:
        """Signals a pending spawn's child by spawn id while its first
        reply has not come. True once it has, with a child to signal the
        usual way; False when the signal went, or there is no child to
        signal (a failure or loss, which ``wait`` raises)."""
        slot, conn = self._zygote_slot, self._zygote_conn
        assert slot is not None and conn is not None
        pause = 0.001
        while not slot.spawned.is_set():
            body = {"id": conn.next_id(), "spawn_id": self._zygote_spawn_id, "signal": int(sig)}
            message = {"Signal": body}
            try:
                reply = conn.request(message)
            except ZygoteError:
                return False  # lost: wait() says so
            if "SignalSent" in reply:
                return False
            failure = reply["RequestFailed"]
            if failure["errno"] != errno.ESRCH:
                raise ZygoteError(
                    failure["errno"],
                    f"signalling {self._zygote_program} through the zygote at {conn.where} "
                    f"failed: {failure['message']}",
                )
            # Not started yet, or reaped with its Exited on the way
            # (PROTOCOL.md section 5.6): the first reply tells them apart.
            conn.wait(slot.spawned, pause)
            pause = min(2 * pause, _SIGNAL_RETRY_SECONDS)
        if slot.reply is None or "SpawnFailed" in slot.reply:
            return False
        self._zygote_settle()
        return True


def run_with(
    factory: Any,
    args: Any,
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: Optional[float] = None,
    check: bool = False,
    **kwargs: Any,
) -> "subprocess.CompletedProcess[Any]":
    """:func:`subprocess.run` semantics on top of ``factory`` (a Popen)."""
    if input is not None:
        if kwargs.get("stdin") is not None:
            raise ValueError("stdin and input arguments may not both be used.")
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        if kwargs.get("stdout") is not None or kwargs.get("stderr") is not None:
            raise ValueError("stdout and stderr arguments may not be used with capture_output.")
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with factory(args, _zygote_defer=True, **kwargs) as process:
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        except BaseException:
            process.kill()
            raise
        code = process.poll()
        if check and code:
            raise subprocess.CalledProcessError(code, process.args, output=out, stderr=err)
    return subprocess.CompletedProcess(process.args, code, out, err)
