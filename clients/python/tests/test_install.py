"""zygote.install(): code that only knows subprocess stops forking."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import thirdparty
from conftest import Daemon

import zygote

STDLIB_POPEN = subprocess.Popen


@pytest.fixture
def installed(client: zygote.Client) -> Iterator[zygote.Client]:
    zygote.install(client)
    try:
        yield client
    finally:
        zygote.uninstall()


def test_third_party_call_site_goes_through_the_zygote(
    installed: zygote.Client, shared_daemon: Daemon
) -> None:
    assert zygote.installed()
    assert thirdparty.parent_pid() == shared_daemon.pid
    result = thirdparty.run_text("echo hi; exit 3")
    assert (result.returncode, result.stdout) == (3, "hi\n")
    assert type(result) is subprocess.CompletedProcess
    with pytest.raises(FileNotFoundError):
        subprocess.run(["no-such-program-zygote"])
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.check_call(["false"])
    assert subprocess.getoutput("echo via getoutput") == "via getoutput"
    process = subprocess.Popen(["sleep", "30"])
    assert isinstance(process, STDLIB_POPEN)
    assert process.pidfd is not None  # type: ignore[attr-defined]
    process.kill()
    assert process.wait(10) == -signal.SIGKILL


def test_what_it_cannot_serve_falls_back(installed: zygote.Client) -> None:
    # preexec_fn runs in a forked child: the stdlib does it, and we are the parent.
    assert thirdparty.parent_pid_with_preexec() == os.getpid()
    process = subprocess.Popen(["true"], preexec_fn=lambda: None)
    assert process.wait(10) == 0
    assert process.zygote_fallback_reason is not None  # type: ignore[attr-defined]
    assert "preexec_fn" in process.zygote_fallback_reason  # type: ignore[attr-defined]
    # An ignored signal would stay ignored in a forked child.
    old = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        assert thirdparty.parent_pid() == os.getpid()
    finally:
        signal.signal(signal.SIGUSR2, old)
    # Over the daemon's argv + env budget.
    big = subprocess.Popen(["sh", "-c", "exit 0", "x" * 100000, "y" * 100000])
    assert big.wait(10) == 0
    assert "budget" in (big.zygote_fallback_reason or "")  # type: ignore[attr-defined]


def test_asyncio_subprocess_keeps_the_stdlib(installed: zygote.Client) -> None:
    """asyncio reaps its children with waitpid: routing them through the
    zygote would report 255 for every exit."""

    async def main() -> int:
        process = await asyncio.create_subprocess_exec("sh", "-c", "exit 5")
        return await process.wait()

    assert asyncio.run(main()) == 5


def test_no_daemon_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZYGOTE_SOCKET", str(tmp_path / "none.sock"))
    zygote.install()
    try:
        assert thirdparty.parent_pid() == os.getpid()
    finally:
        zygote.uninstall()


def test_uninstall_restores_the_stdlib(installed: zygote.Client) -> None:
    zygote.uninstall()
    assert subprocess.Popen is STDLIB_POPEN
    assert not zygote.installed()
    assert thirdparty.parent_pid() == os.getpid()
