"""Who reads the replies: a waiting caller while nobody else does, the
reader thread for those left waiting, for callbacks and for the end."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from typing import Any, Dict, List

import pytest

import zygote
from zygote._conn import Connection


class SignalHandlerError(Exception):
    """What the test's signal handler raises."""


def _dispatching_threads(conn: Connection) -> List[str]:
    """Records the name of the thread that dispatches each spawn reply."""
    names: List[str] = []
    original = conn._dispatch

    def dispatch(message: Any, fds: List[int]) -> Any:
        ((name, _),) = message.items()
        if name in ("Spawned", "Exited", "SpawnFailed"):
            names.append(threading.current_thread().name)
        return original(message, fds)

    conn._dispatch = dispatch  # type: ignore[method-assign]
    return names


def test_a_lone_caller_reads_its_own_replies(client: zygote.Client) -> None:
    names = _dispatching_threads(client._connection())
    for code in range(5):
        assert client.run(["sh", "-c", f"exit {code}"]).returncode == code
    process = client.Popen(["sh", "-c", "exit 9"])
    assert process.wait(timeout=30) == 9
    assert len(names) >= 7, names  # an early exit of run() may be its only reply
    assert set(names) == {threading.current_thread().name}, names


def _reader_held_until(conn: Connection, released: threading.Event) -> None:
    """Keeps the reader thread from taking the receiving role until
    ``released`` is set, so that a caller must lead first."""
    original = conn._reader_wanted

    def wanted() -> bool:
        if threading.current_thread() is conn._reader and not released.is_set():
            return False
        return original()

    conn._reader_wanted = wanted  # type: ignore[method-assign]


def _release(conn: Connection, released: threading.Event) -> None:
    with conn._lock:
        released.set()
        conn._reader_wake.notify()


def test_threads_sharing_a_connection_get_their_own_exit_codes(client: zygote.Client) -> None:
    conn = client._connection()
    names = _dispatching_threads(conn)
    # Held until a caller has dispatched a reply, or for at most 10 s, so
    # that callers unable to lead fail the last assertion, not hang.
    released = threading.Event()
    _reader_held_until(conn, released)
    original_dispatch = conn._dispatch

    def dispatch(message: Any, fds: List[int]) -> Any:
        result = original_dispatch(message, fds)
        if threading.current_thread().name.startswith("caller-") and not released.is_set():
            _release(conn, released)
        return result

    conn._dispatch = dispatch  # type: ignore[method-assign]
    timer = threading.Timer(10, _release, (conn, released))
    timer.start()
    threads_count, rounds = 12, 15
    barrier = threading.Barrier(threads_count)
    codes: Dict[int, List[int]] = {}
    errors: List[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait(30)
            got = []
            for round_ in range(rounds):
                code = (index * rounds + round_) % 256
                if round_ % 3 == 0:
                    process = client.Popen(["sh", "-c", f"exit {code}"])
                    got.append(process.wait(timeout=60))
                else:
                    got.append(client.run(["sh", "-c", f"exit {code}"], timeout=60).returncode)
            codes[index] = got
        except BaseException as error:
            errors.append(error)

    threads = [
        threading.Thread(target=worker, args=(index,), name=f"caller-{index}")
        for index in range(threads_count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    timer.cancel()
    assert not any(thread.is_alive() for thread in threads), "a caller never heard its reply"
    assert not errors, errors[:3]
    for index in range(threads_count):
        assert codes[index] == [(index * rounds + r) % 256 for r in range(rounds)]
    # A caller read replies while the others waited, not only the reader
    # thread; the reader joined in once released.
    assert any(name.startswith("caller-") for name in names), set(names)


def test_a_callback_hears_an_exit_while_no_thread_waits(client: zygote.Client) -> None:
    async def scenario() -> int:
        process = await client.create_subprocess_exec("sh", "-c", "sleep 0.2; exit 3")
        return await asyncio.wait_for(process.wait(), 30)

    assert asyncio.run(scenario()) == 3


def test_poll_sees_an_exit_that_nobody_waited_for(client: zygote.Client) -> None:
    process = client.Popen(["sh", "-c", "exit 4"])
    deadline = time.monotonic() + 30
    while process.poll() is None:
        assert time.monotonic() < deadline, "poll never saw the exit"
        time.sleep(0.01)
    assert process.returncode == 4


def test_a_receiving_wait_honours_its_timeout(client: zygote.Client) -> None:
    process = client.Popen(["sleep", "30"])
    outcome: Dict[str, Any] = {}

    def wait() -> None:
        started = time.monotonic()
        try:
            process.wait(timeout=0.3)
        except subprocess.TimeoutExpired:
            outcome["seconds"] = time.monotonic() - started

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(20)
    timed_out = not waiter.is_alive()
    process.kill()
    assert process.wait(timeout=30) == -signal.SIGKILL
    waiter.join(30)
    assert timed_out, "the wait ran past its timeout"
    assert 0.3 <= outcome["seconds"] < 15, outcome


def test_an_interrupt_while_receiving_leaves_the_connection_serving(
    client: zygote.Client,
) -> None:
    """A signal handler raises in the main thread while it reads for itself
    and for another thread: that thread still gets its reply, and the
    connection serves the next call."""
    conn = client._connection()
    main = threading.main_thread().ident
    assert main == threading.get_ident()

    def interrupt(signum: int, frame: Any) -> None:
        raise SignalHandlerError

    previous = signal.signal(signal.SIGUSR1, interrupt)
    sleeper = client.Popen(["sleep", "30"])
    other: Dict[str, Any] = {}

    def follow() -> None:
        # Sent once the main thread is reading: this thread waits on it.
        deadline = time.monotonic() + 20
        while not conn._receiving and time.monotonic() < deadline:
            time.sleep(0.005)
        other["leader_was_reading"] = conn._receiving
        try:
            other["code"] = client.run(["sh", "-c", "sleep 0.5; exit 5"], timeout=60).returncode
        except BaseException as error:
            other["error"] = error

    follower = threading.Thread(target=follow)
    follower.start()
    assert main is not None
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGUSR1))
    timer.start()
    try:
        with pytest.raises(SignalHandlerError):
            sleeper.wait(timeout=60)
    finally:
        timer.join(30)
        signal.signal(signal.SIGUSR1, previous)
    follower.join(60)
    assert not follower.is_alive(), "the other thread never heard its reply"
    assert other.get("leader_was_reading"), other
    assert other.get("code") == 5, other
    assert client.run(["sh", "-c", "exit 6"], timeout=60).returncode == 6
    sleeper.kill()
    assert sleeper.wait(timeout=30) == -signal.SIGKILL


#: Enough replies that raises land in every gap between two bytecodes.
WORKER_SPAWNS = 300


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_storm_of_raising_signal_handlers_loses_no_frame(client: zygote.Client) -> None:
    """The main thread spawns and receives (for itself and for a worker)
    while a signal whose handler raises comes every few hundred
    microseconds: each raise lands before a frame is taken or after it is
    dispatched, never between, so the worker hears every reply, and no fd
    that a reply carried is left behind."""
    conn = client._connection()
    client.run(["true"], timeout=60)
    baseline = _open_fds()
    main = threading.main_thread().ident
    assert main is not None and main == threading.get_ident()

    # Plain flags, not threading.Event: an Event takes a lock, and a
    # handler raising in the main thread between its acquire and release
    # would leave it held, hanging the test (not the client) for ever.
    flags = {"armed": False, "go": False, "stop": False, "worker_done": False}

    def interrupt(signum: int, frame: Any) -> None:
        # One raise per arming: the test's own retry code (the except
        # clause, the loop's back edge) runs disarmed, so only the code
        # inside the try, the client's, is ever interrupted.
        if flags["armed"]:
            flags["armed"] = False
            raise SignalHandlerError

    def wait_for_go() -> None:
        until = time.monotonic() + 60
        while not flags["go"] and time.monotonic() < until:
            time.sleep(0.001)

    def storm() -> None:
        wait_for_go()
        while not flags["stop"]:
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.0001)

    worker_codes: List[int] = []
    worker_errors: List[BaseException] = []

    def work() -> None:
        wait_for_go()
        try:
            for _ in range(WORKER_SPAWNS):
                worker_codes.append(client.run(["true"], timeout=20).returncode)
        except BaseException as error:
            worker_errors.append(error)
        finally:
            flags["worker_done"] = True

    storming = threading.Thread(target=storm)
    worker = threading.Thread(target=work)
    storming.start()
    worker.start()
    previous = signal.signal(signal.SIGUSR1, interrupt)
    interrupted = completed = 0
    deadline = time.monotonic() + 90
    # While armed, the main thread may raise at any bytecode: all of that
    # is inside the inner try, and takes no lock of its own (only the
    # client's code does).
    try:
        while True:
            try:
                flags["armed"] = True
                flags["go"] = True
                while not flags["worker_done"] and time.monotonic() < deadline:
                    assert client.run(["true"], timeout=20).returncode == 0
                    completed += 1
                flags["armed"] = False
                break
            except SignalHandlerError:
                interrupted += 1
    finally:
        flags["armed"] = False
        flags["stop"] = True
    storming.join(30)
    signal.signal(signal.SIGUSR1, previous)
    worker.join(60)
    assert not worker.is_alive(), "the worker never heard a reply"
    assert worker_errors == [], worker_errors
    assert worker_codes == [0] * WORKER_SPAWNS, worker_codes
    assert interrupted > 0, "the storm never interrupted the main thread"
    # The children the interrupted calls gave up are killed and reported:
    # once every report is in, the fds are back where they were.
    deadline = time.monotonic() + 30
    while (conn._abandoned or _open_fds() != baseline) and time.monotonic() < deadline:
        time.sleep(0.05)
        conn.collect()
    assert not conn._abandoned, "a given-up spawn's reply never came"
    assert _open_fds() == baseline, (completed, interrupted)
