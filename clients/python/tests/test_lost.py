"""A lost daemon (SIGKILL, restart): children keep their exit status, read
from the pidfd on Linux 6.15+, and a client reconnects to its path."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import (
    Daemon,
    kernel_keeps_exit_status,
    orphans_are_reaped,
    pidfd_fallback_testable,
    zygote_bin,
)

import zygote
from zygote import _lost


def test_a_reaped_child_without_a_status_is_gone_only_once_that_lasts() -> None:
    """For a moment after the reaping, a pidfd reads as gone without a
    status: only a lasting one means a kernel that keeps none."""
    clock = _lost.GoneClock()
    start = 1000.0
    assert not clock.lasting(start)
    assert not clock.lasting(start + _lost.STATUS_GRACE_SECONDS / 2)
    assert clock.lasting(start + _lost.STATUS_GRACE_SECONDS)
    assert clock.lasting(start + 10 * _lost.STATUS_GRACE_SECONDS)


def _eventually(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _expect(process: zygote.Popen, returncode: int) -> None:
    """The exact returncode on 6.15+, else the loss as the error."""
    if not pidfd_fallback_testable():
        with pytest.raises(zygote.ZygoteError, match="6.15"):
            process.wait(timeout=40)
        return
    assert process.wait(timeout=40) == returncode
    assert process.zygote_lost
    assert process.usage is None, "no rusage without the daemon"
    assert not process.timed_out


@pytest.mark.parametrize("round_", range(3))
def test_wait_after_a_daemon_sigkill_gives_the_exact_status(daemon: Daemon, round_: int) -> None:
    client = zygote.Client(daemon.socket)
    exits = client.Popen(["sh", "-c", "sleep 0.3; exit 7"])
    segv = client.Popen(["sh", "-c", "sleep 0.3; kill -SEGV $$"])
    time.sleep(round_ * 0.02)
    daemon.kill()
    _expect(exits, 7)
    _expect(segv, -signal.SIGSEGV)
    client.close()


@pytest.mark.parametrize("round_", range(3))
def test_a_wait_in_progress_survives_the_daemon_sigkill(daemon: Daemon, round_: int) -> None:
    client = zygote.Client(daemon.socket)
    process = client.Popen(["sh", "-c", "sleep 0.5; exit 42"])
    killer = threading.Timer(0.1 + round_ * 0.05, daemon.kill)
    killer.start()
    try:
        _expect(process, 42)
    finally:
        killer.join()
    client.close()


def test_asyncio_wait_survives_the_daemon_sigkill(daemon: Daemon) -> None:
    async def scenario() -> None:
        client = zygote.Client(daemon.socket)
        process = await client.create_subprocess_exec("sh", "-c", "sleep 0.3; exit 9")
        daemon.kill()
        if pidfd_fallback_testable():
            assert await asyncio.wait_for(process.wait(), 40) == 9
            assert process.zygote_lost and process.usage is None
        else:
            with pytest.raises(zygote.ZygoteError, match="6.15"):
                await process.wait()
        client.close()

    asyncio.run(scenario())


def test_signals_go_through_the_pidfd_once_the_daemon_is_lost(daemon: Daemon) -> None:
    client = zygote.Client(daemon.socket)
    process = client.Popen(["sleep", "30"])
    daemon.kill()
    assert _eventually(lambda: not client.alive), "the client sees the loss"
    assert process.poll() is None, "still running: no status, no error"
    process.terminate()
    _expect(process, -signal.SIGTERM)
    client.close()


def test_a_client_reconnects_after_a_restart_on_the_same_path(
    daemon: Daemon, tmp_path: Path
) -> None:
    client = zygote.Client(daemon.socket)
    assert client.run(["true"]).returncode == 0
    current = daemon
    restarts = []
    try:
        for again in range(3):
            old = client.Popen(["sh", "-c", "sleep 0.5; exit 5"])
            current.kill()
            assert _eventually(lambda: not client.alive)
            current = Daemon(tmp_path / f"restart-{again}", socket_path=daemon.socket)
            restarts.append(current)
            result = client.run(["echo", "again"], capture_output=True)
            assert result.stdout == b"again\n"
            assert client.alive
            assert isinstance(client.status(), dict), "status requests reconnect too"
            if not kernel_keeps_exit_status() or orphans_are_reaped():
                _expect(old, 5)
            else:  # reconnecting is tested anyway; the old status is not kept here
                old.kill()

            async def spawn_async() -> int:
                process = await client.create_subprocess_exec("sh", "-c", "exit 4")
                return await process.wait()

            assert asyncio.run(spawn_async()) == 4
    except BaseException:
        for restarted in restarts:
            print(f"--- log of {restarted.log_path} ---\n{restarted.log()}")
        raise
    finally:
        client.close()
        for restarted in restarts:
            restarted.kill()
            restarted.stop()


def test_no_daemon_coming_back_fails_after_the_bound(daemon: Daemon) -> None:
    client = zygote.Client(daemon.socket)
    daemon.kill()
    assert _eventually(lambda: not client.alive)
    started = time.monotonic()
    with pytest.raises(zygote.ZygoteError) as caught:
        client.run(["true"])
    elapsed = time.monotonic() - started
    text = str(caught.value)
    assert f"reconnecting failed {zygote.RECONNECT_ATTEMPTS} times" in text, text
    assert "cannot connect" in text, text
    # The backoff sums to about 4.6 s: it retried, and did not hang.
    assert 2 <= elapsed < 30, elapsed
    client.close()


def test_a_private_client_cannot_reconnect_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZYGOTE_BIN", zygote_bin())
    client = zygote.Client.launch_private()
    assert client.run(["true"]).returncode == 0
    pid = client.private_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert _eventually(lambda: not client.alive)
    started = time.monotonic()
    with pytest.raises(zygote.ZygoteError, match="cannot reconnect"):
        client.run(["true"])
    assert time.monotonic() - started < 1, "fails at once"
    client.close()


def test_a_loss_found_by_the_send_itself_reconnects_and_sends_again(daemon: Daemon) -> None:
    """The daemon is stopped, so the client's reader cannot have seen the
    loss: only the send finds it (EPIPE). The request never left, so the
    client reconnects and sends it again, in Popen and in asyncio alike."""
    client = zygote.Client(daemon.socket)
    try:
        assert client.run(["true"]).returncode == 0
        for spawn in ("popen", "asyncio"):
            first = client._conn
            os.kill(daemon.pid, signal.SIGSTOP)
            resume = threading.Timer(0.3, os.kill, (daemon.pid, signal.SIGCONT))
            resume.start()
            try:
                first._sock.shutdown(socket.SHUT_WR)
                assert client.alive, "the reader must not have seen anything yet"
                if spawn == "popen":
                    assert client.run(["sh", "-c", "exit 3"]).returncode == 3
                else:

                    async def spawn_async() -> int:
                        process = await client.create_subprocess_exec("sh", "-c", "exit 3")
                        return await process.wait()

                    assert asyncio.run(spawn_async()) == 3
            finally:
                resume.join()
                os.kill(daemon.pid, signal.SIGCONT)
            assert client._conn is not first, f"{spawn}: no new connection"
            assert first._lost is not None, f"{spawn}: the old connection was not found lost"
    finally:
        client.close()
