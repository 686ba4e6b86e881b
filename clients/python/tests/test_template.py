"""Warm templates against a real daemon: a Python interpreter the daemon
keeps with modules imported, whose children are forks of it and run
``python ARGS`` as a cold interpreter would."""

from __future__ import annotations

import asyncio
import errno
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon

import zygote
from zygote import _conn, _wire

PRELOAD = ["json", "decimal"]
#: The environment of the templates the tests share. A template's is part
#: of what finds it again, and pytest's own variable changes per test: with
#: it, each test would start a template of its own (8 per uid at most).
ENV = {key: value for key, value in os.environ.items() if key != "PYTEST_CURRENT_TEST"}


def offers_templates(client: zygote.Client) -> None:
    """Every daemon built from this tree offers templates: a missing
    feature is a failure, not a skip."""
    if "templates" not in client.features:
        pytest.fail(f"the daemon does not offer templates (it offers {client.features})")


@pytest.fixture
def template(client: zygote.Client) -> zygote.Template:
    offers_templates(client)
    return client.python_template(preload=PRELOAD, env=ENV)


def modules_dir(tmp_path: Path, **modules: str) -> Path:
    """A directory of modules named by the keywords, with their code."""
    directory = tmp_path / "modules"
    directory.mkdir(exist_ok=True)
    for name, code in modules.items():
        (directory / f"{name}.py").write_text(textwrap.dedent(code))
    return directory


def with_path(directory: Path) -> "dict[str, str]":
    return dict(ENV, PYTHONPATH=str(directory))


def test_c_runs_with_the_preload_imported(template: zygote.Template) -> None:
    code = "import sys; print(sys.argv, __name__, sys.path[0] == '', 'decimal' in sys.modules)"
    result = template.run(["-c", code, "a", "b"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("]")[0] + "]" == "['-c', 'a', 'b']"
    assert result.stdout.split("]")[1].split() == ["__main__", "True", "True"]


def test_m_runs_a_module_as_main(template: zygote.Template, tmp_path: Path) -> None:
    directory = modules_dir(
        tmp_path, greet="import sys\nprint(__name__, sys.argv[1:])\nsys.exit(4)\n"
    )
    # As `python -m`: the working directory is first on the path.
    result = template.run(["-m", "greet", "x"], capture_output=True, text=True, cwd=directory)
    assert (result.returncode, result.stdout) == (4, "__main__ ['x']\n"), result.stderr


def test_script_runs_with_its_directory_first_on_the_path(
    template: zygote.Template, tmp_path: Path
) -> None:
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(sys.argv, sys.path[0], __name__)\n")
    result = template.run([str(script), "arg"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{[str(script), 'arg']} {tmp_path} __main__\n"


def test_exit_codes_are_those_of_python(template: zygote.Template) -> None:
    assert template.run(["-c", "raise SystemExit(7)"]).returncode == 7
    assert template.run(["-c", "import os; os._exit(9)"]).returncode == 9
    failed = template.run(["-c", "raise KeyError('lost-key')"], capture_output=True, text=True)
    assert failed.returncode == 1
    assert "Traceback" in failed.stderr and "lost-key" in failed.stderr
    killed = template.run(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert killed.returncode == -signal.SIGKILL
    with pytest.raises(subprocess.CalledProcessError):
        template.run(["-c", "raise SystemExit(2)"], check=True)


def test_popen_pipes_input_and_usage(template: zygote.Template) -> None:
    with template.Popen(
        ["-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as process:
        assert process.pid > 0 and process.pidfd is not None
        out, _ = process.communicate(b"warm child", timeout=30)
    assert (process.returncode, out) == (0, b"WARM CHILD")
    assert process.usage is not None


def test_env_and_cwd_are_the_request_s(template: zygote.Template, tmp_path: Path) -> None:
    code = "import os; print(os.getcwd(), os.environ.get('WARM_VAR'), 'PATH' in os.environ)"
    result = template.run(
        ["-c", code], capture_output=True, text=True, cwd=tmp_path, env={"WARM_VAR": "here"}
    )
    assert result.stdout == f"{tmp_path} here False\n", result.stderr


def test_children_never_share_random_output(template: zygote.Template) -> None:
    code = "import random; print(random.getrandbits(64))"
    outputs = [template.run(["-c", code], capture_output=True).stdout for _ in range(6)]
    assert len(set(outputs)) == len(outputs), outputs


def test_a_failing_preload_raises_its_traceback(client: zygote.Client) -> None:
    offers_templates(client)
    # A short path: the daemon clips a reply's message at 1 KiB, and the
    # traceback's frames of importlib come first.
    with tempfile.TemporaryDirectory(prefix="zt") as short:
        directory = modules_dir(Path(short), broken="raise ValueError('preload-marker')\n")
        with pytest.raises(zygote.TemplateError) as raised:
            client.python_template(preload=["json", "broken"], env=with_path(directory))
    assert raised.value.errno == errno.EPROTO
    assert "broken" in raised.value.zygote_message
    assert "Traceback" in raised.value.zygote_message
    assert "ValueError: preload-marker" in str(raised.value)
    assert client.run(["true"]).returncode == 0  # the connection survives


def test_a_missing_preload_module_is_named(client: zygote.Client) -> None:
    offers_templates(client)
    with pytest.raises(zygote.TemplateError) as raised:
        client.python_template(preload=["json", "no_such_module_here"], env=ENV)
    assert raised.value.errno == errno.EPROTO
    assert "no_such_module_here" in raised.value.zygote_message


def test_a_thread_starting_preload_is_refused_by_name(
    client: zygote.Client, tmp_path: Path
) -> None:
    offers_templates(client)
    code = "import threading, time\n"
    code += "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    directory = modules_dir(tmp_path, spinner=code)
    with pytest.raises(zygote.TemplateError) as raised:
        client.python_template(preload=["spinner"], env=with_path(directory))
    assert raised.value.errno == errno.EPROTO
    assert "spinner" in raised.value.zygote_message


def test_a_missing_interpreter_raises_its_errno(client: zygote.Client, tmp_path: Path) -> None:
    offers_templates(client)
    missing = tmp_path / "no-python"
    with pytest.raises(zygote.TemplateError) as raised:
        client.python_template(preload=["json"], python=str(missing), env=ENV)
    assert raised.value.errno == errno.ENOENT
    assert raised.value.filename == str(missing)


def test_timeouts_end_warm_children(template: zygote.Template) -> None:
    sleeper = ["-c", "import time; time.sleep(60)"]
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        template.run(sleeper, timeout=0.5)
    with template.Popen(sleeper, zygote_timeout=0.3, zygote_grace=0.2) as process:
        assert process.wait(timeout=30) == -signal.SIGTERM
    assert process.timed_out
    assert time.monotonic() - started < 30


def test_kill_on_close_ends_a_warm_child(shared_daemon: Daemon, client: zygote.Client) -> None:
    offers_templates(client)
    with zygote.Client(shared_daemon.socket) as other:
        child = other.python_template(preload=PRELOAD, env=ENV).Popen(
            ["-c", "import time; time.sleep(60)"], kill_on_close=True
        )
        pidfd = os.dup(child.pidfd or -1)
    try:
        readable, _, _ = select.select([pidfd], [], [], 30)
        assert readable, "the warm child outlived its connection"
    finally:
        os.close(pidfd)


def test_another_client_reuses_the_template(shared_daemon: Daemon, client: zygote.Client) -> None:
    offers_templates(client)
    first = client.python_template(preload=PRELOAD, env=ENV)
    with zygote.Client(shared_daemon.socket) as other:
        second = other.python_template(preload=PRELOAD, env=ENV)
        assert (second.handle, second.pid, second.reused) == (first.handle, first.pid, True)
        assert second.run(["-c", "pass"]).returncode == 0
    listed = [info for info in client.templates() if info["template"] == first.handle]
    assert len(listed) == 1
    assert listed[0]["preload"] == PRELOAD and listed[0]["kind"] == "python"
    assert listed[0]["interpreter"] == os.fsencode(sys.executable)
    assert listed[0]["forks"] >= 1 and listed[0]["uid"] == os.geteuid()


def test_a_gone_template_is_started_again_once(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module-level template outlives the default client's connection:
    its handle answers ENOENT once the last connection closed, and the
    next spawn asks for the template again and runs."""
    monkeypatch.setenv("ZYGOTE_SOCKET", daemon.socket)
    offers_templates(zygote.default_client())
    template = zygote.python_template(preload=PRELOAD)
    first = template.handle
    assert template.run(["-c", "pass"]).returncode == 0
    zygote.default_client().close()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{template.pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert template.run(["-c", "raise SystemExit(3)"]).returncode == 3
    assert template.handle != first
    with template.Popen(["-c", "pass"]) as process:
        assert process.wait(timeout=30) == 0
    zygote.default_client().close()


def test_asyncio_children_of_a_template(template: zygote.Template) -> None:
    async def main() -> "tuple[int, bytes]":
        process = await template.create_subprocess_exec(
            "-c", "import sys; print(sys.argv[1:])", "x", stdout=subprocess.PIPE
        )
        out, _ = await process.communicate()
        return await process.wait(), out

    assert asyncio.run(main()) == (0, b"['x']\n")


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"shell": True}, "shell=True"),
        ({"executable": "/bin/sh"}, "executable"),
        ({"user": 0}, "user"),
        ({"group": 0}, "group"),
        ({"extra_groups": [0]}, "extra_groups"),
        ({"sandbox": zygote.Sandbox(isolate=True)}, "sandbox"),
    ],
)
def test_what_a_warm_child_cannot_be_is_refused(
    template: zygote.Template, kwargs: "dict[str, object]", named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        template.run(["-c", "pass"], **kwargs)
    if "shell" not in kwargs:  # not an argument of create_subprocess_exec
        with pytest.raises(ValueError, match=named):
            asyncio.run(template.create_subprocess_exec("-c", "pass", **kwargs))


@pytest.mark.parametrize(
    "args", [[], ["-u", "-c", "pass"], ["-c"], ["-m"], ["-m", ""], ["-"], [""]]
)
def test_args_python_would_not_run_as_a_program_are_refused(
    template: zygote.Template, args: "list[str]"
) -> None:
    with pytest.raises((ValueError, IndexError)):
        template.run(args)


@pytest.mark.parametrize(
    "preload, error",
    [
        ("json", TypeError),
        ([b"json"], TypeError),
        (["json-x"], ValueError),
        (["1json"], ValueError),
        (["a..b"], ValueError),
        (["a" * 257], ValueError),
        (["json"] * 257, ValueError),
    ],
)
def test_bad_preload_lists_are_refused_before_sending(
    client: zygote.Client, preload: object, error: type
) -> None:
    with pytest.raises(error):
        client.python_template(preload=preload)  # type: ignore[arg-type]
    assert client.run(["true"]).returncode == 0


def test_without_the_feature_templates_are_refused_locally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZYGOTE_MASK_FEATURES", "templates")
    daemon = Daemon(tmp_path)
    try:
        with zygote.Client(daemon.socket) as client:
            assert "templates" not in client.features
            with pytest.raises(OSError) as raised:
                client.python_template(preload=["json"])
            assert raised.value.errno == errno.EOPNOTSUPP
            assert "feature templates" in str(raised.value)
            with pytest.raises(OSError, match="feature templates"):
                client.templates()
            assert client.run(["true"]).returncode == 0
    finally:
        daemon.stop()


def test_a_version_3_connection_gets_no_templates(
    shared_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon lists the feature only to version-4 connections; a
    client speaking version 3 refuses templates locally, naming the
    version, and its connection carries on."""
    monkeypatch.setattr(_conn, "HELLO_VERSION", 3)
    with zygote.Client(shared_daemon.socket) as client:
        assert client.protocol_version == 3
        assert "templates" not in client.features
        with pytest.raises(OSError) as raised:
            client.python_template(preload=["json"])
        assert raised.value.errno == errno.EOPNOTSUPP
        assert "protocol version 3; templates need 4" in str(raised.value)
        assert client.run(["true"]).returncode == 0


class TemplatePeer:
    """A scripted daemon of version 4 offering templates: each template
    request gets a new handle; a spawn from a handle in ``gone`` fails as
    one from a stopped template does (``Validate``, ``ENOENT``), any other
    is reported spawned (with this process's pidfd) and exited 0. It records every request."""

    def __init__(self, path: str, gone: "set[int]") -> None:
        self.gone = gone
        self.requests: "list[tuple[str, object]]" = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen()
        threading.Thread(target=self.serve, daemon=True).start()

    def reply(self, conn: socket.socket, message: "dict[str, object]") -> None:
        conn.send(_wire.encode(_wire.SERVER_MESSAGE, message))

    def answer(self, conn: socket.socket, name: str, body: "dict[str, Any]") -> None:
        if name == "Hello":
            ack = {"protocol_version": 4, "server_version": "test", "features": ["templates"],
                   "limits": {"max_frame_bytes": 262144, "max_fds_per_frame": 64}}  # fmt: skip
            self.reply(conn, {"HelloAck": ack})
        elif name == "Template":
            self.requests.append((name, body))
            handle = sum(1 for request in self.requests if request[0] == name)
            ready = {"id": body["id"], "template": handle, "pid": 4000 + handle, "reused": False}
            self.reply(conn, {"TemplateReady": ready})
        elif name == "SpawnFromTemplate":
            self.requests.append((name, body["template"]))
            spawn_id = body["spawn"]["id"]
            if body["template"] in self.gone:
                failed = {"id": spawn_id, "stage": "Validate", "errno": errno.ENOENT,
                          "message": f"no template {body['template']}"}  # fmt: skip
                self.reply(conn, {"SpawnFailed": failed})
                return
            pidfd = os.pidfd_open(os.getpid())
            try:
                spawned = _wire.encode(
                    _wire.SERVER_MESSAGE, {"Spawned": {"id": spawn_id, "pid": 42, "sandbox": None}}
                )
                socket.send_fds(conn, [spawned], [pidfd])
            finally:
                os.close(pidfd)
            exited = {"id": spawn_id, "status": {"Exited": 0},
                      "usage": {"user_micros": 0, "system_micros": 0, "max_rss_kib": 0},
                      "timed_out": False, "tree": None, "pid": 42}  # fmt: skip
            self.reply(conn, {"Exited": exited})

    def serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            while True:
                frame = conn.recv(1 << 18)
                if not frame:
                    return
                ((name, body),) = _wire.decode(_wire.CLIENT_MESSAGE, frame).items()
                self.answer(conn, name, body)


@pytest.mark.parametrize("how", ["run", "Popen", "asyncio"])
def test_a_gone_template_is_asked_for_again_once(tmp_path: Path, how: str) -> None:
    """A spawn answered ENOENT at Validate sends the same template request
    again, then the spawn once more with the new handle; a second ENOENT
    is raised, never looped on."""
    peer = TemplatePeer(str(tmp_path / "peer.sock"), gone={1, 3})
    try:
        with zygote.Client(str(tmp_path / "peer.sock")) as client:
            template = client.python_template(preload=["json"], env={"A": "1"}, cwd="/")

            def start() -> int:
                if how == "run":
                    return template.run(["-c", "pass"]).returncode
                if how == "Popen":
                    return template.Popen(["-c", "pass"]).wait(timeout=30)

                async def spawn_and_wait() -> int:
                    process = await template.create_subprocess_exec("-c", "pass")
                    return await process.wait()

                return asyncio.run(spawn_and_wait())

            assert start() == 0
            assert template.handle == 2
            assert [name for name, _ in peer.requests] == [
                "Template", "SpawnFromTemplate", "Template", "SpawnFromTemplate"
            ]  # fmt: skip
            first, again = peer.requests[0][1], peer.requests[2][1]
            assert isinstance(first, dict) and isinstance(again, dict)
            assert {**first, "id": 0} == {**again, "id": 0}  # the same spec
            assert [handle for name, handle in peer.requests if name != "Template"] == [1, 2]
            assert start() == 0  # handle 2 stays
            peer.gone.add(2)
            peer.gone.add(3)
            with pytest.raises(FileNotFoundError) as raised:
                start()
            assert raised.value.zygote_stage == "Validate"  # type: ignore[attr-defined]
            assert [handle for name, handle in peer.requests if name != "Template"][-2:] == [2, 3]
    finally:
        peer.listener.close()


def _wait_gone(pid: int) -> None:
    """Waits until process ``pid`` is gone (reaped), for 30 s at most."""
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, f"process {pid} still exists"
        time.sleep(0.02)


def test_a_killed_template_is_started_again_and_the_next_request_runs(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A template killed between two spawns: the second spawn gets a child
    of a fresh process behind the same handle."""
    directory = modules_dir(tmp_path, stamp="import os\nPID = os.getpid()\n")
    code = "import stamp; print(stamp.PID)"
    with zygote.Client(daemon.socket) as client:
        offers_templates(client)
        template = client.python_template(preload=["stamp"], env=with_path(directory))
        first = template.run(["-c", code], capture_output=True, text=True, timeout=30)
        assert first.stdout == f"{template.pid}\n", first.stderr
        os.kill(template.pid, signal.SIGKILL)
        _wait_gone(template.pid)
        second = template.run(["-c", code], capture_output=True, text=True, timeout=30)
        assert second.returncode == 0, second.stderr
        assert second.stdout != first.stdout, "a fresh template process"
        (listed,) = client.templates()
        assert listed["template"] == template.handle
        assert (listed["pid"], listed["restarts"]) == (int(second.stdout), 1)


def test_a_template_that_keeps_crashing_raises_and_is_not_looped(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A template whose restart fails raises a clear error once per spawn,
    each spawn tries one start at most, and after 3 failures in a row the
    daemon refuses without trying."""
    starts = tmp_path / "starts"
    directory = modules_dir(tmp_path, flaky=f"open({str(starts)!r}, 'a').write('x')\n")
    with zygote.Client(daemon.socket) as client:
        offers_templates(client)
        template = client.python_template(preload=["flaky"], env=with_path(directory))
        (directory / "flaky.py").write_text(
            f"open({str(starts)!r}, 'a').write('x')\nraise OSError('gone bad')\n"
        )
        os.kill(template.pid, signal.SIGKILL)
        _wait_gone(template.pid)
        for attempt in range(1, 4):
            with pytest.raises(OSError) as failed:
                template.run(["-c", "pass"], timeout=30)
            assert failed.value.errno == errno.EPROTO
            assert failed.value.zygote_stage == "Template"  # type: ignore[attr-defined]
            message = failed.value.zygote_message  # type: ignore[attr-defined]
            assert "OSError: gone bad" in message
            assert "(template: " in str(failed.value) and "gone bad" in str(failed.value)
            assert starts.read_text() == "x" * (1 + attempt), "one start per spawn"
        began = time.monotonic()
        with pytest.raises(OSError) as paused:
            template.run(["-c", "pass"], timeout=30)
        message = paused.value.zygote_message  # type: ignore[attr-defined]
        assert "failed to start 3 times in a row" in message
        assert time.monotonic() - began < 5
        assert starts.read_text() == "xxxx", "refused without a start"


def _spawn_as_nobody(template: zygote.Template, socket_path: str) -> str:
    """Runs a child of ``template`` (another uid's) from a forked process
    that became uid and gid 65534: what it raised, as "ERRNO STAGE"."""
    read_end, write_end = os.pipe()
    # The child only connects, spawns and exits; a lock held by another
    # thread at the fork would show as "no answer", not as a hang.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            with zygote.Client(socket_path) as other:
                template._client = other
                try:
                    template.run(["-c", "pass"], timeout=30)
                    said = "ran"
                except OSError as error:
                    said = f"{error.errno} {getattr(error, 'zygote_stage', None)}"
            os.write(write_end, said.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 30)
        said = os.read(read_end, 200).decode() if ready else "no answer in 30 s"
    finally:
        os.close(read_end)
        deadline = time.monotonic() + 10
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.02)
    return said


def test_a_template_of_another_uid_is_refused_with_eperm() -> None:
    if os.geteuid() != 0:
        pytest.skip("a peer of another uid needs root")
    # Reachable by uid 65534: a searchable directory, a socket open to all.
    directory = Path(tempfile.mkdtemp(prefix="zygote-tpl-uid-"))
    directory.chmod(0o755)
    own = Daemon(directory, extra=["--socket-mode", "0666"])
    try:
        with zygote.Client(own.socket) as client:
            offers_templates(client)
            template = client.python_template(preload=["json"], env=ENV)
            assert template.run(["-c", "pass"]).returncode == 0
            handle = template.handle
            said = _spawn_as_nobody(template, own.socket)
            assert said == f"{errno.EPERM} Validate", own.log()
            # Refused, not re-requested: root's template is untouched.
            (listed,) = client.templates()
            assert (listed["template"], listed["uid"], listed["forks"]) == (handle, 0, 1)
    finally:
        own.kill()
        own.stop()
        for name in os.listdir(directory):
            os.unlink(directory / name)
        os.rmdir(directory)
