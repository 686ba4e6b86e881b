"""os.fork() after the client was used: each forked child dials a
connection of its own, never writes on the parent's, and the parent carries
on as if nothing happened (prefork servers: gunicorn, celery,
multiprocessing's fork start method)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from typing import Callable, Dict, Iterator, List

import pytest

import zygote

WORKERS = 8
SPAWNS_PER_WORKER = 100
#: How long the whole exercise may take before it counts as hung.
DEADLINE_SECONDS = 90.0


def _fork(work: Callable[[], None]) -> int:
    """Forks a worker that runs ``work`` and exits 0, or prints why not and
    exits 1. Python 3.12+ warns that forking a threaded process is risky:
    that is the very case under test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.alarm(int(DEADLINE_SECONDS))  # a hung worker ends itself too
        work()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _reap(pids: List[int], deadline: float) -> Dict[int, int]:
    """Each worker's exit status; kills and fails on the ones still running
    at the deadline."""
    statuses: Dict[int, int] = {}
    while len(statuses) < len(pids):
        for pid in pids:
            if pid not in statuses:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    statuses[pid] = status
        if time.monotonic() > deadline:
            hung = [pid for pid in pids if pid not in statuses]
            for pid in hung:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            pytest.fail(f"forked workers {hung} hung")
        time.sleep(0.01)
    return statuses


def _prefork_exercise(spawn: Callable[[], int]) -> None:
    """``spawn`` once here, then in 8 forked workers 100 times each while
    this process keeps spawning: every spawn succeeds, nothing hangs."""
    assert spawn() == 0, "the client is used before the fork"
    deadline = time.monotonic() + DEADLINE_SECONDS

    def worker() -> None:
        for _ in range(SPAWNS_PER_WORKER):
            assert spawn() == 0

    pids = [_fork(worker) for _ in range(WORKERS)]
    parent_spawns = 0
    parent_failures: List[BaseException] = []
    stop = threading.Event()

    def parent_loop() -> None:
        nonlocal parent_spawns
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                assert spawn() == 0
            except BaseException as error:  # reported below, with the workers'
                parent_failures.append(error)
                return
            parent_spawns += 1

    spawner = threading.Thread(target=parent_loop, daemon=True)
    spawner.start()
    try:
        statuses = _reap(pids, deadline)
    finally:
        stop.set()
        spawner.join(max(1.0, deadline - time.monotonic()))
    assert not spawner.is_alive(), "the parent's spawns hung"
    assert not parent_failures, f"the parent's spawns failed: {parent_failures!r}"
    failed = {pid: status for pid, status in statuses.items() if status != 0}
    assert not failed, f"workers failed (their tracebacks are above): {failed}"
    assert parent_spawns > 0, "the parent did not spawn while the workers ran"
    assert spawn() == 0, "the parent's client is fine afterwards"


def test_forked_workers_and_the_parent_share_a_client_object(client: zygote.Client) -> None:
    _prefork_exercise(lambda: client.run(["true"]).returncode)


def test_forked_workers_of_an_installed_default_client(default_socket: str) -> None:
    zygote.install()
    try:
        assert zygote.default_client().path == default_socket
        _prefork_exercise(lambda: subprocess.run(["true"]).returncode)
    finally:
        zygote.uninstall()
        # The next test's default client reads $ZYGOTE_SOCKET afresh.
        zygote.default_client().close()


@pytest.fixture
def forked_pipe() -> Iterator[List[int]]:
    read_end, write_end = os.pipe()
    yield [read_end, write_end]
    for fd in (read_end, write_end):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_forked_child_never_uses_the_parents_connection(
    client: zygote.Client, forked_pipe: List[int]
) -> None:
    client.run(["true"])
    parents = client._conn
    read_end, write_end = forked_pipe

    def child() -> None:
        os.close(read_end)
        inherited = client._conn
        assert not client.alive, "a forked child's client is not connected until it asks"
        assert client.run(["true"]).returncode == 0
        assert client._conn is not inherited, "the child dialled a connection of its own"
        assert client._conn.pid == os.getpid()
        os.write(write_end, b"ok")

    pid = _fork(child)
    os.close(write_end)
    assert _reap([pid], time.monotonic() + 60) == {pid: 0}
    assert os.read(read_end, 16) == b"ok"
    # The parent's connection is the one it had, and its request ids are
    # its own: no "already in use" from a child's request under its id.
    assert client.run(["true"]).returncode == 0
    assert client._conn is parents and client.alive


def test_a_forked_child_of_a_private_zygote_says_why_it_cannot_spawn(
    forked_pipe: List[int],
) -> None:
    read_end, write_end = forked_pipe
    with zygote.Client.launch_private() as private:
        private.run(["true"])

        def child() -> None:
            os.close(read_end)
            try:
                private.run(["true"])
            except zygote.ZygoteError as error:
                os.write(write_end, str(error).encode())

        pid = _fork(child)
        os.close(write_end)
        assert _reap([pid], time.monotonic() + 60) == {pid: 0}
        said = os.read(read_end, 4096).decode()
        assert "forked this one" in said and "cannot reconnect" in said, said
        assert private.run(["true"]).returncode == 0, "the parent's private zygote carries on"
