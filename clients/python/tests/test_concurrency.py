"""Many threads and many asyncio processes on one connection, and a daemon
that dies or stops while clients wait."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from typing import List, Optional

import pytest
from conftest import Daemon, pidfd_fallback_testable

import zygote

COUNT = 200


def test_200_threads_spawning_at_once(client: zygote.Client, shared_daemon: Daemon) -> None:
    barrier = threading.Barrier(COUNT)
    results: List[Optional[str]] = [None] * COUNT
    errors: List[BaseException] = []
    running_peak = [0]

    def worker(index: int) -> None:
        try:
            barrier.wait(30)
            # Each child lives ~1 s: unless the spawns overlap, 200 of them
            # could not all be running at once (checked below).
            result = client.run(
                ["sh", "-c", 'echo "$0"; sleep 1', str(index)],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
            results[index] = result.stdout
        except BaseException as error:
            errors.append(error)

    def watch() -> None:
        with zygote.Client(shared_daemon.socket) as observer:
            while any(thread.is_alive() for thread in threads):
                running_peak[0] = max(running_peak[0], observer.status()["children_running"])
                time.sleep(0.05)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(COUNT)]
    for thread in threads:
        thread.start()
    watcher = threading.Thread(target=watch)
    watcher.start()
    for thread in threads:
        thread.join(180)
    watcher.join(30)
    assert not errors, errors[:3]
    assert results == [f"{index}\n" for index in range(COUNT)]
    # Many children were running at the same moment: the threads did not
    # queue behind one another.
    assert running_peak[0] >= COUNT // 4, running_peak[0]


async def _spawn_many(client: zygote.Client) -> List[bytes]:
    async def one(index: int) -> bytes:
        process = await client.create_subprocess_exec(
            "sh", "-c", 'read line; echo "$0 $line"', str(index),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        out, err = await process.communicate(b"in\n")
        assert err is None
        assert process.returncode == 0
        return out or b""

    return await asyncio.gather(*(one(index) for index in range(COUNT)))


def test_asyncio_200_concurrent_processes(client: zygote.Client) -> None:
    outputs = asyncio.run(_spawn_many(client))
    assert outputs == [f"{index} in\n".encode() for index in range(COUNT)]


def test_asyncio_process_api(client: zygote.Client) -> None:
    async def main() -> None:
        process = await client.create_subprocess_exec(
            "sh", "-c", "echo out; echo err >&2; exec sleep 30",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert process.stdout is not None and process.stderr is not None
        assert await process.stdout.readline() == b"out\n"
        assert await process.stderr.readline() == b"err\n"
        assert process.returncode is None
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) == -signal.SIGTERM
        merged = await client.create_subprocess_exec(
            "sh", "-c", "echo a; echo b >&2", stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        out, err = await merged.communicate()
        assert sorted((out or b"").split()) == [b"a", b"b"] and err is None
        with pytest.raises(FileNotFoundError):
            await client.create_subprocess_exec("no-such-program-zygote")
        shell = await client.create_subprocess_shell("exit 7")
        assert await shell.wait() == 7

    asyncio.run(main())


def test_asyncio_never_blocks_the_loop(daemon: Daemon) -> None:
    """With the daemon stopped (SIGSTOP), a spawn waits without blocking
    the loop: other tasks keep running, and it completes on SIGCONT."""
    client = zygote.Client(daemon.socket)

    async def main() -> None:
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            spawn = asyncio.ensure_future(client.create_subprocess_exec("true"))
            ticks = 0
            for _ in range(10):
                await asyncio.sleep(0.02)
                ticks += 1
            assert ticks == 10 and not spawn.done()
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        process = await asyncio.wait_for(spawn, 10)
        assert await asyncio.wait_for(process.wait(), 10) == 0

    try:
        asyncio.run(main())
    finally:
        client.close()


def test_daemon_death_while_waiting(daemon: Daemon) -> None:
    """Waits in progress outlive the daemon: they wait on the pidfds, and
    get the status from them (Linux 6.15+; test_lost.py has more)."""
    client = zygote.Client(daemon.socket)
    keeps = pidfd_fallback_testable()

    async def main() -> None:
        process = client.Popen(["sleep", "30"])
        async_process = await client.create_subprocess_exec("sleep", "30")
        pidfd = process.pidfd
        assert pidfd is not None
        try:
            threading.Timer(0.3, daemon.kill).start()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(async_process.wait(), 1)
            assert not client.alive
            assert process.poll() is None, "still running: no status, no error"
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=0.2)
        finally:
            # The orphans outlive the daemon; end them through their pidfds.
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            async_process.kill()
        if keeps:
            assert process.wait(timeout=40) == -signal.SIGKILL
            assert await asyncio.wait_for(async_process.wait(), 40) == -signal.SIGKILL
            assert process.zygote_lost and async_process.zygote_lost
        else:
            with pytest.raises(zygote.ZygoteError, match="lost"):
                process.wait(timeout=40)
        with pytest.raises(zygote.ZygoteError, match="reconnecting failed"):
            client.run(["true"])

    try:
        asyncio.run(main())
    finally:
        client.close()


def test_daemon_gone_before_spawn(daemon: Daemon) -> None:
    client = zygote.Client(daemon.socket)
    daemon.kill()
    deadline = time.monotonic() + 10
    while client.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(zygote.ZygoteError):
        client.run(["true"])
    with pytest.raises(zygote.ZygoteError):
        zygote.Client(daemon.socket)


def test_cancelled_spawn_kills_its_child(daemon: Daemon) -> None:
    """A spawn given up before its reply does not leave a child behind."""
    client = zygote.Client(daemon.socket)

    async def main() -> None:
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            spawn = asyncio.ensure_future(client.create_subprocess_exec("sleep", "30"))
            await asyncio.sleep(0.1)
            spawn.cancel()
            with pytest.raises(asyncio.CancelledError):
                await spawn
        finally:
            os.kill(daemon.pid, signal.SIGCONT)

    try:
        asyncio.run(main())
        deadline = time.monotonic() + 10
        while True:
            status = client.status()
            if status["spawns_succeeded"] == 1 and status["children_running"] == 0:
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
    finally:
        client.close()


def test_dropping_a_client_closes_its_connection(shared_daemon: Daemon) -> None:
    import gc

    with zygote.Client(shared_daemon.socket) as observer:
        before = observer.status()["connections_open"]
        dropped = zygote.Client(shared_daemon.socket)
        assert observer.status()["connections_open"] == before + 1
        del dropped
        gc.collect()
        deadline = time.monotonic() + 10
        while observer.status()["connections_open"] != before:
            assert time.monotonic() < deadline
            time.sleep(0.02)
