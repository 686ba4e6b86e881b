"""Warm templates: a Python interpreter the daemon starts for this peer,
with modules imported, whose children are forks of it (PROTOCOL.md
section 4, protocol version 4, feature ``templates``).

A child of a template is not a fresh interpreter: it starts with the
template's modules imported and their module-level state as it was after
the imports (``random`` is reseeded, ``os.register_at_fork`` child hooks
run). Prefer a cold spawn for a program that must not see that state.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import subprocess
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _asyncio, _request, _spawn, _wire
from ._errors import ZygoteError
from ._popen import Popen, run_with

#: The template kind this module starts (``TemplateRequest.kind``).
PYTHON_KIND = "python"
#: The most modules a preload list may name, and the longest name, in
#: bytes (the daemon refuses more with ``EINVAL``).
MAX_PRELOAD = 256
MAX_MODULE_NAME_BYTES = 256
#: How long a template request may take: the daemon's start deadline
#: (60 s) and some margin for its reply.
CREATE_SECONDS = 90.0
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


class TemplateError(OSError):
    """A template could not be started: a missing interpreter (its exec's
    errno, ``ENOENT``...), a preload that raised (``EPROTO``; the message
    holds its traceback), a preload that started a thread (``EPROTO``;
    the message names the module), the start deadline (``ETIMEDOUT``),
    too many templates (``EAGAIN``), or templates not offered
    (``EOPNOTSUPP``). :attr:`zygote_message` is the daemon's message,
    whole."""

    zygote_message: str = ""
    zygote_stage: str = "Template"


def _template_error(code: int, message: str, interpreter: bytes) -> TemplateError:
    where = os.fsdecode(interpreter)
    error = TemplateError(code, f"{os.strerror(code)}: template of {where}: {message}")
    error.filename = where
    error.zygote_message = message
    return error


def check_preload(preload: Any) -> List[str]:
    """The preload list as sent: a sequence of dotted module names, each
    checked as the daemon checks it (:class:`TypeError` for a value that is
    not a str, :class:`ValueError` for a bad name or too many)."""
    if isinstance(preload, (str, bytes)):
        raise TypeError("preload must be a list of module names, not one string")
    names = list(preload)
    if len(names) > MAX_PRELOAD:
        raise ValueError(f"preload names {len(names)} modules; at most {MAX_PRELOAD}")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a preload module name must be a str, not {name!r}")
        if len(name.encode("utf-8")) > MAX_MODULE_NAME_BYTES or not _MODULE_NAME.match(name):
            raise ValueError(
                f"{name!r} is not a module name (dotted Python identifiers, "
                f"at most {MAX_MODULE_NAME_BYTES} bytes)"
            )
    return names


def _interpreter(python: Any) -> bytes:
    if python is None or python in ("", b""):
        raise ValueError("no Python interpreter: sys.executable is empty; pass python=")
    data = os.fsencode(python)
    if b"\0" in data:
        raise ValueError(f"embedded null byte in interpreter {python!r}")
    return data


def _template_gone(error: BaseException) -> bool:
    """Whether a spawn failed because its template is gone (stopped while
    idle, its owner's connections all closed, the daemon restarted)."""
    return (
        isinstance(error, OSError)
        and error.errno == errno.ENOENT
        and getattr(error, "zygote_stage", None) == "Validate"
    )


class Template:
    """A warm Python template; see :meth:`zygote.Client.python_template`.

    :meth:`Popen`, :meth:`run` and :meth:`create_subprocess_exec` start
    children that are forks of it: ``args`` is what follows ``python`` on
    its command line (``["-c", CODE, ...]``, ``["-m", MODULE, ...]``,
    ``[SCRIPT, ...]``), run as ``python ARGS`` would run it (``sys.argv``,
    ``__main__``, ``sys.path[0]``, the exit code). Every other keyword
    means what it means for :class:`zygote.Popen`: stdio, ``env``, ``cwd``,
    ``pass_fds``, ``umask``, sessions and process groups, ``rlimits``,
    ``cgroup``, ``kill_on_close``, ``zygote_timeout``. ``user``, ``group``,
    ``extra_groups``, ``executable``, ``shell=True`` and ``sandbox`` are
    refused (:class:`ValueError`): a fork of this interpreter can be none
    of them.

    The daemon stops a template after 10 minutes without a spawn, or when
    this uid's last connection to it closes; a spawn that finds it gone
    starts it again (once) and retries.
    """

    def __init__(
        self,
        client: Optional[_spawn.Endpoint],
        preload: Sequence[str],
        python: Any,
        env: Optional[Mapping[Any, Any]],
        cwd: Any,
    ) -> None:
        self._client = client
        #: The modules imported before the template is ready.
        self.preload: Tuple[str, ...] = tuple(check_preload(preload))
        self._interpreter = _interpreter(python)
        #: The interpreter, as given.
        self.python = python
        self._env_pairs = _request._env_pairs(env)
        self._cwd = _request._cwd_bytes(cwd)
        self._lock = threading.Lock()
        #: The daemon's handle, its process's pid, and whether a running
        #: template was found (rather than started) by the last request.
        self.handle = 0
        self.pid = 0
        self.reused = False
        self._create()

    def _endpoint(self) -> _spawn.Endpoint:
        return self._client if self._client is not None else _spawn.default()

    def _message(self, request_id: int) -> Dict[str, Any]:
        return {
            "Template": {
                "id": request_id,
                "kind": PYTHON_KIND,
                "interpreter": self._interpreter,
                "preload": list(self.preload),
                "env": [{"key": key, "value": value} for key, value in self._env_pairs],
                "cwd": self._cwd,
            }
        }

    def _create(self) -> None:
        """Sends the template request and waits for the template."""
        conn = self._endpoint()._connection()
        _request.check_templates_offered(conn.features, conn.protocol_version)
        message = self._message(conn.next_id())
        frame = _wire.encode_client(message, conn.protocol_version)
        if len(frame) > conn.max_frame:
            raise ValueError(
                f"the template request is {len(frame)} bytes, over the zygote's frame "
                f"limit of {conn.max_frame} (the environment is too large)"
            )
        reply = conn.request(message, CREATE_SECONDS)
        if "TemplateReady" in reply:
            ready = reply["TemplateReady"]
            self.handle, self.pid, self.reused = ready["template"], ready["pid"], ready["reused"]
            return
        if "RequestFailed" in reply:
            failure = reply["RequestFailed"]
            raise _template_error(failure["errno"], failure["message"], self._interpreter)
        raise ZygoteError(errno.EPROTO, f"unexpected reply to a template request: {reply!r}")

    def _recreate(self, stale: int) -> int:
        """After a spawn found the template ``stale`` gone: asks for it
        again, unless another thread did already; the handle to use."""
        with self._lock:
            if self.handle == stale:
                self._create()
            return self.handle

    def _with_retry(self, start: Callable[[int], Any]) -> Any:
        """``start(handle)``, and once more after re-creating the template
        when the first found it gone."""
        handle = self.handle
        try:
            return start(handle)
        except OSError as error:
            if not _template_gone(error):
                raise
        return start(self._recreate(handle))

    def Popen(self, args: Any, **kwargs: Any) -> Popen:  # noqa: N802
        """:class:`zygote.Popen` of a child of this template."""
        client = self._endpoint()
        process: Popen = self._with_retry(
            lambda handle: Popen(args, client=client, _zygote_template=(self, handle), **kwargs)
        )
        return process

    def run(self, args: Any, **kwargs: Any) -> "subprocess.CompletedProcess[Any]":
        """:func:`subprocess.run` of a child of this template (see
        :meth:`zygote.Client.run`)."""
        client = self._endpoint()

        def start(handle: int) -> "subprocess.CompletedProcess[Any]":
            def factory(*posargs: Any, **more: Any) -> Popen:
                return Popen(*posargs, client=client, _zygote_template=(self, handle), **more)

            return run_with(factory, args, **kwargs)

        result: "subprocess.CompletedProcess[Any]" = self._with_retry(start)
        return result

    async def create_subprocess_exec(self, *args: Any, **kwargs: Any) -> _asyncio.Process:
        """:func:`asyncio.create_subprocess_exec` of a child of this
        template: ``args`` as for :meth:`Popen`. Never blocks the event
        loop (re-creating a template that was found gone runs on the
        loop's default executor)."""
        client = self._endpoint()
        handle = self.handle
        try:
            return await _asyncio.create_subprocess_exec(
                client, *args, _zygote_template=(self, handle), **kwargs
            )
        except OSError as error:
            if not _template_gone(error):
                raise
        handle = await asyncio.get_running_loop().run_in_executor(None, self._recreate, handle)
        return await _asyncio.create_subprocess_exec(
            client, *args, _zygote_template=(self, handle), **kwargs
        )

    def __repr__(self) -> str:
        modules = ",".join(self.preload)
        return f"<zygote.Template {self.handle} {os.fsdecode(self._interpreter)} [{modules}]>"


def list_templates(endpoint: _spawn.Endpoint) -> List[Dict[str, Any]]:
    """The daemon's ``ListTemplates`` answer, one dict per template."""
    conn = endpoint._connection()
    _request.check_templates_offered(conn.features, conn.protocol_version)
    reply = conn.request({"ListTemplates": {"id": conn.next_id()}})
    if "Templates" in reply:
        return [dict(info) for info in reply["Templates"]["templates"]]
    if "RequestFailed" in reply:
        failure = reply["RequestFailed"]
        raise ZygoteError(failure["errno"], f"listing templates failed: {failure['message']}")
    raise ZygoteError(errno.EPROTO, f"unexpected reply to ListTemplates: {reply!r}")
