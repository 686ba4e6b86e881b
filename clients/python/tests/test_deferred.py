"""``defer_spawned``: run() and subprocess.call()/run() under install() ask
the daemon to skip ``Spawned`` for a child that ends at once; the results
are those of an undeferred spawn, and a longer child still gets its pidfd
(so its status survives a lost daemon)."""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import Any, Dict, Iterator, List

import pytest
from conftest import Daemon, pidfd_fallback_testable

import zygote
from zygote._conn import Connection


class Recorder:
    """The names of the replies each spawn id got, read off the reader
    thread's dispatch."""

    def __init__(self, conn: Connection) -> None:
        self.replies: Dict[int, List[str]] = {}
        original = conn._dispatch

        def dispatch(message: Any, fds: List[int]) -> Any:
            ((name, body),) = message.items()
            if name in ("Spawned", "Exited"):
                self.replies.setdefault(body["id"], []).append(name)
            return original(message, fds)

        conn._dispatch = dispatch  # type: ignore[method-assign]

    def sequences(self) -> List[List[str]]:
        return list(self.replies.values())


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
    # Pipes of ours: not deferred (the child may wait on them), still right.
    result = client.run(["sh", "-c", "cat; echo out; exit 6"], input=b"in ", capture_output=True)
    assert (result.returncode, result.stdout) == (6, b"in out\n")
    # The longer child got Spawned then Exited; every sequence is valid.
    for sequence in recorded.sequences():
        assert sequence in (["Exited"], ["Spawned", "Exited"]), sequence
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
