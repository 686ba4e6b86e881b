"""``defer_spawned``: run() and subprocess.call()/run() under install() ask
the daemon to skip ``Spawned`` for a child that ends at once, pipes of
ours (capture_output, input) included; the results and errors are those of
an undeferred spawn, and a longer child still gets its pidfd (so its
status survives a lost daemon)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from conftest import Daemon, pidfd_fallback_testable

import zygote
from zygote import _request
from zygote._conn import Connection


class Recorder:
    """The names of the replies each spawn id got, read off the
    connection's dispatch, and each spawn's exit notice."""

    def __init__(self, conn: Connection) -> None:
        self.replies: Dict[int, List[str]] = {}
        self.exits: Dict[int, Dict[str, Any]] = {}
        original = conn._dispatch

        def dispatch(message: Any, fds: List[int]) -> Any:
            ((name, body),) = message.items()
            if name in ("Spawned", "Exited", "SpawnFailed"):
                self.replies.setdefault(body["id"], []).append(name)
            if name == "Exited":
                self.exits[body["id"]] = body
            return original(message, fds)

        conn._dispatch = dispatch  # type: ignore[method-assign]

    def sequences(self) -> List[List[str]]:
        return list(self.replies.values())

    def last(self) -> Tuple[List[str], Optional[Dict[str, Any]]]:
        """The latest spawn's replies and exit notice."""
        spawn_id = max(self.replies)
        return self.replies[spawn_id], self.exits.get(spawn_id)


@pytest.fixture
def recorded(client: zygote.Client) -> Iterator[Recorder]:
    yield Recorder(client._connection())


def test_run_gives_the_right_returncodes(client: zygote.Client, recorded: Recorder) -> None:
    assert client.run(["true"]).returncode == 0
    assert client.run(["sh", "-c", "exit 3"]).returncode == 3
    assert client.run(["sh", "-c", "sleep 0.1; exit 4"]).returncode == 4
    assert client.run(["sh", "-c", "kill -9 $$"]).returncode == -signal.SIGKILL
    with pytest.raises(subprocess.CalledProcessError) as raised:
        client.run(["sh", "-c", "exit 5"], check=True)
    assert raised.value.returncode == 5
    with pytest.raises(FileNotFoundError):
        client.run(["no-such-program-zygote"])
    # Pipes of ours: deferred too, and still right.
    result = client.run(["sh", "-c", "cat; echo out; exit 6"], input=b"in ", capture_output=True)
    assert (result.returncode, result.stdout) == (6, b"in out\n")
    # The longer child got Spawned then Exited; every sequence is valid.
    for sequence in recorded.sequences():
        assert sequence in (["Exited"], ["Spawned", "Exited"], ["SpawnFailed"]), sequence
    assert ["Spawned", "Exited"] in recorded.sequences()


def test_quick_children_of_run_get_no_spawned(client: zygote.Client, recorded: Recorder) -> None:
    for _ in range(10):
        assert client.run(["true"]).returncode == 0
    assert (
        ["Exited"] in recorded.sequences()
    ), f"every run() got a Spawned: the deferral never applied ({recorded.sequences()})"


def test_popen_never_defers(client: zygote.Client, recorded: Recorder) -> None:
    for _ in range(5):
        process = client.Popen(["true"])
        assert process.pid > 0 and process.pidfd is not None
        assert process.wait(10) == 0
    assert recorded.sequences() == [["Spawned", "Exited"]] * 5


def test_installed_call_and_run_defer(client: zygote.Client, recorded: Recorder) -> None:
    zygote.install(client)
    try:
        for _ in range(5):
            assert subprocess.call(["true"]) == 0
            assert subprocess.run(["sh", "-c", "exit 2"]).returncode == 2
        with pytest.raises(subprocess.CalledProcessError):
            subprocess.check_call(["false"])
        assert subprocess.check_output(["echo", "hi"]) == b"hi\n"
        process = subprocess.Popen(["true"])
        assert process.pid > 0 and process.wait(10) == 0
    finally:
        zygote.uninstall()
    assert ["Exited"] in recorded.sequences(), recorded.sequences()


def test_a_deferred_run_that_outlives_the_window_survives_a_daemon_sigkill(
    daemon: Daemon,
) -> None:
    client = zygote.Client(daemon.socket)
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["returncode"] = client.run(["sh", "-c", "sleep 0.6; exit 7"]).returncode
        except BaseException as error:  # reported below
            outcome["error"] = error

    runner = threading.Thread(target=run)
    runner.start()
    # Past the deferral window: the Spawned with the pidfd has come.
    threading.Event().wait(0.3)
    daemon.kill()
    runner.join(60)
    assert not runner.is_alive()
    if pidfd_fallback_testable():
        assert outcome == {"returncode": 7}
    else:
        assert isinstance(outcome.get("error"), zygote.ZygoteError), outcome
    client.close()


# --- run() with pipes of ours: deferred, the first reply taken by wait() ---

MIB = 1 << 20


@pytest.fixture
def deferral_flags(monkeypatch: pytest.MonkeyPatch) -> List[bool]:
    """Each spawn request's ``defer_spawned``, as encoded."""
    flags: List[bool] = []
    original = _request.encode_spawn

    def encode(message: Dict[str, Any], max_frame: int, version: int) -> bytes:
        flags.append(message["Spawn"]["defer_spawned"])
        return original(message, max_frame, version)

    monkeypatch.setattr(_request, "encode_spawn", encode)
    return flags


def test_piped_runs_defer_and_quick_ones_get_one_reply(
    client: zygote.Client, recorded: Recorder, deferral_flags: List[bool]
) -> None:
    for _ in range(5):
        assert client.run(["echo", "hi"], capture_output=True).stdout == b"hi\n"
        assert client.run(["cat"], input=b"in", capture_output=True).stdout == b"in"
        assert client.run(["sh", "-c", "cat >/dev/null"], input=b"in").returncode == 0
    zygote.install(client)
    try:
        for _ in range(5):
            assert subprocess.check_output(["echo", "out"]) == b"out\n"
            done = subprocess.run(["sh", "-c", "echo err >&2"], capture_output=True, text=True)
            assert (done.returncode, done.stdout, done.stderr) == (0, "", "err\n")
    finally:
        zygote.uninstall()
    assert deferral_flags == [True] * 25
    for sequence in recorded.sequences():
        assert sequence in (["Exited"], ["Spawned", "Exited"]), sequence
    assert (
        ["Exited"] in recorded.sequences()
    ), f"every piped run() got a Spawned: the deferral never applied ({recorded.sequences()})"


def test_a_popen_with_pipes_is_unchanged(
    client: zygote.Client, recorded: Recorder, deferral_flags: List[bool]
) -> None:
    for _ in range(3):
        with client.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as process:
            # Spawned came before the constructor returned: pid and pidfd.
            assert process.pid > 0 and process.pidfd is not None
            assert recorded.last()[0] == ["Spawned"]
            assert process.communicate(b"x")[0] == b"x"
    assert deferral_flags == [False] * 3
    assert recorded.sequences() == [["Spawned", "Exited"]] * 3


def _script(tmp_path: Path) -> str:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    return str(script)


@pytest.mark.parametrize(
    "how",
    [
        {"capture_output": True},
        {"input": b"in"},
        {"input": b"x" * MIB, "capture_output": True},
        {"stdout": subprocess.PIPE},
        {"capture_output": True, "timeout": 0.0001},
    ],
    ids=["capture", "input", "big-input-and-capture", "stdout", "tiny-timeout"],
)
@pytest.mark.parametrize("program", ["missing", "not-executable"])
def test_piped_spawn_failures_raise_what_popen_raises(
    client: zygote.Client,
    tmp_path: Path,
    deferral_flags: List[bool],
    how: Dict[str, Any],
    program: str,
) -> None:
    argv = ["no-such-program-zygote"] if program == "missing" else [_script(tmp_path)]
    # What the constructor raises, undeferred (and as before deferral).
    with pytest.raises(OSError) as direct:
        client.Popen(argv, stdout=subprocess.PIPE)
    assert isinstance(direct.value, (FileNotFoundError, PermissionError))
    with pytest.raises(OSError) as caught:
        client.run(argv, **how)
    zygote.install(client)
    try:
        with pytest.raises(OSError) as installed:
            subprocess.run(argv, **how)
    finally:
        zygote.uninstall()
    assert deferral_flags == [False, True, True]
    for raised in (caught.value, installed.value):
        assert type(raised) is type(direct.value)
        assert (raised.errno, raised.filename, raised.strerror) == (
            direct.value.errno,
            direct.value.filename,
            direct.value.strerror,
        )
        if "timeout" not in how:  # else it may surface in the timeout's cleanup
            assert raised.__context__ is None
    assert client.run(["echo", "ok"], capture_output=True).stdout == b"ok\n"


def test_piped_run_moves_more_than_a_pipe_buffer_both_ways(client: zygote.Client) -> None:
    both = "head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2"
    result = client.run(["sh", "-c", both], capture_output=True)
    assert (len(result.stdout), len(result.stderr)) == (MIB, MIB)
    data = os.urandom(MIB)
    assert client.run(["cat"], input=data, capture_output=True).stdout == data
    counted = client.run(["sh", "-c", "wc -c"], input=data, stdout=subprocess.PIPE)
    assert counted.stdout.strip() == str(MIB).encode()
    # stdin alone: the stdlib's plain write, no selector.
    assert client.run(["sh", "-c", "cat >/dev/null; exit 4"], input=data).returncode == 4
    zygote.install(client)
    try:
        assert subprocess.check_output(["cat"], input=data) == data
        result = subprocess.run(["sh", "-c", both], capture_output=True)
        assert (len(result.stdout), len(result.stderr)) == (MIB, MIB)
    finally:
        zygote.uninstall()


def test_piped_check_raises_with_the_output(client: zygote.Client) -> None:
    script = "cat; echo out; echo err >&2; exit 3"
    with pytest.raises(subprocess.CalledProcessError) as caught:
        client.run(["sh", "-c", script], input=b"in ", capture_output=True, check=True)
    assert type(caught.value) is subprocess.CalledProcessError
    assert caught.value.returncode == 3
    assert (caught.value.stdout, caught.value.stderr) == (b"in out\n", b"err\n")
    zygote.install(client)
    try:
        with pytest.raises(subprocess.CalledProcessError) as installed:
            subprocess.check_output(["sh", "-c", script], input=b"in ", stderr=subprocess.PIPE)
    finally:
        zygote.uninstall()
    assert installed.value.returncode == 3
    assert (installed.value.output, installed.value.stderr) == (b"in out\n", b"err\n")


def _killed(notice: Optional[Dict[str, Any]]) -> bool:
    return notice is not None and notice["status"] == {
        "Signaled": {"signal": int(signal.SIGKILL), "core_dumped": False}
    }


@pytest.mark.parametrize("installed", [False, True])
def test_piped_timeout_kills_and_reaps_before_and_after_spawned(
    client: zygote.Client, recorded: Recorder, installed: bool
) -> None:
    run = subprocess.run if installed else client.run
    if installed:
        zygote.install(client)
    try:
        early = []
        for how in ({"capture_output": True}, {"input": b"x"}) * 3:
            started = time.monotonic()
            with pytest.raises(subprocess.TimeoutExpired):
                run(["sleep", "30"], timeout=0.005, **how)
            assert time.monotonic() - started < 10, "killed, not waited for"
            # run() returned after the child's Exited: killed and reaped.
            replies, notice = recorded.last()
            assert _killed(notice) and replies[-1] == "Exited", (replies, notice)
            early.append(replies)
        # Before the deferred Spawned could come: the kill went by spawn id.
        assert ["Exited"] in early, early
        with pytest.raises(subprocess.TimeoutExpired):
            run(["sleep", "30"], capture_output=True, timeout=0.3)
        replies, notice = recorded.last()
        assert replies == ["Spawned", "Exited"] and _killed(notice), (replies, notice)
    finally:
        zygote.uninstall()
    assert run(["echo", "ok"], capture_output=True).stdout == b"ok\n"


def _outcome(target: Any) -> Dict[str, Any]:
    """Runs ``target`` in a thread; its result or error, which must come."""
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = target()
        except BaseException as error:  # reported by the caller
            outcome["error"] = error

    runner = threading.Thread(target=run)
    runner.start()
    return {"thread": runner, "outcome": outcome}


def test_a_piped_run_whose_daemon_is_lost_before_reading_it_fails_clearly(
    daemon: Daemon,
) -> None:
    client = zygote.Client(daemon.socket)
    assert client.run(["true"]).returncode == 0
    # Stopped, the daemon never reads the request, and dies with its fds
    # (our pipes' other ends) still queued: the pipes end, wait() raises.
    os.kill(daemon.pid, signal.SIGSTOP)
    running = _outcome(lambda: client.run(["cat"], input=b"in", capture_output=True))
    time.sleep(0.2)
    daemon.kill()
    running["thread"].join(60)
    assert not running["thread"].is_alive(), "run() hangs after the daemon was lost"
    error = running["outcome"].get("error")
    assert isinstance(error, zygote.ZygoteError), running["outcome"]
    # The loss's own reason, then what it means here.
    assert f"zygote at {daemon.socket}" in str(error), error
    assert "the exit status of cat is lost" in str(error), error
    client.close()


def test_a_piped_run_whose_daemon_is_lost_in_the_window_fails_or_recovers(
    daemon: Daemon, tmp_path: Path
) -> None:
    client = zygote.Client(daemon.socket)
    recorded = Recorder(client._connection())
    marker = tmp_path / "started"
    script = f"touch {marker}; sleep 0.3; echo done; exit 5"
    running = _outcome(lambda: client.run(["sh", "-c", script], capture_output=True))
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.0005)
    # Stopped before it could send the deferred Spawned, most likely.
    os.kill(daemon.pid, signal.SIGSTOP)
    daemon.kill()
    running["thread"].join(60)
    assert not running["thread"].is_alive(), "run() hangs after the daemon was lost"
    outcome = running["outcome"]
    if recorded.sequences() == [["Spawned"]] and pidfd_fallback_testable():
        # Spawned came first: the pidfd had the status.
        assert outcome["result"].returncode == 5, outcome
        assert outcome["result"].stdout == b"done\n"
    else:
        error = outcome.get("error")
        assert isinstance(error, zygote.ZygoteError), (recorded.sequences(), outcome)
        if recorded.sequences() == []:
            assert "the exit status of sh is lost" in str(error), error
    client.close()


def test_a_piped_run_whose_daemon_is_lost_after_spawned_keeps_its_status(
    daemon: Daemon,
) -> None:
    client = zygote.Client(daemon.socket)
    running = _outcome(
        lambda: client.run(["sh", "-c", "sleep 0.6; echo done; exit 7"], capture_output=True)
    )
    # Past the deferral window: the Spawned with the pidfd has come.
    time.sleep(0.3)
    daemon.kill()
    running["thread"].join(60)
    assert not running["thread"].is_alive()
    outcome = running["outcome"]
    if pidfd_fallback_testable():
        assert (outcome["result"].returncode, outcome["result"].stdout) == (7, b"done\n")
    else:
        assert isinstance(outcome.get("error"), zygote.ZygoteError), outcome
    client.close()


def _exit_of_latest(recorded: Recorder, seconds: float = 20.0) -> Optional[Dict[str, Any]]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        notice = recorded.last()[1] if recorded.replies else None
        if notice is not None:
            return notice
        time.sleep(0.01)
    return None


@pytest.mark.parametrize("where", ["send", "close_pipe_fds"])
@pytest.mark.parametrize(
    "how", [{"capture_output": True}, {"input": b"x"}, {}], ids=["capture", "input", "no-pipes"]
)
def test_an_interrupt_right_after_the_request_left_kills_the_child(
    client: zygote.Client,
    recorded: Recorder,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    how: Dict[str, Any],
) -> None:
    """A KeyboardInterrupt between the send and the constructor's end (where
    run() has no Popen to kill): the child is killed once reported."""
    conn = client._connection()
    if where == "send":
        send = conn.send

        def interrupted_send(frame: bytes, fds: Any, receipt: Any = None) -> None:
            send(frame, fds, receipt)
            raise KeyboardInterrupt

        monkeypatch.setattr(conn, "send", interrupted_send)
    else:
        close = zygote.Popen._close_pipe_fds  # type: ignore[attr-defined]

        def interrupted_close(self: Any, *fds: int) -> None:
            close(self, *fds)
            raise KeyboardInterrupt

        monkeypatch.setattr(zygote.Popen, "_close_pipe_fds", interrupted_close)
    with pytest.raises(KeyboardInterrupt):
        client.run(["sleep", "30"], **how)
    monkeypatch.undo()
    assert _killed(_exit_of_latest(recorded)), recorded.last()
    assert client.run(["echo", "ok"], capture_output=True).stdout == b"ok\n"
