"""Fixtures: a real zygote daemon built from the workspace, on a temporary
socket, with its log kept in a file that a failing test prints."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

import zygote

REPO = Path(__file__).resolve().parents[3]


def zygote_bin() -> str:
    binary = os.environ.get("ZYGOTE_BIN") or str(REPO / "target" / "debug" / "zygote")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no zygote binary at {binary}: run `cargo build` or set ZYGOTE_BIN")
    return binary


def kernel_keeps_exit_status() -> bool:
    """Whether a reaped child's exit status stays readable from its pidfd
    (``PIDFD_INFO_EXIT``, Linux 6.15); says so when it does not."""
    release = os.uname().release
    numbers = []
    for part in release.replace("-", ".").split(".")[:2]:
        if not part.isdigit():
            break
        numbers.append(int(part))
    keeps = tuple(numbers) >= (6, 15)
    if not keeps:
        print(f"SKIPPED the pidfd fallback: kernel {release} predates 6.15 (no PIDFD_INFO_EXIT)")
    return keeps


_ORPHANS_REAPED: Optional[bool] = None


def orphans_are_reaped() -> bool:
    """Whether orphans of this process's children get reaped (by init or a
    subreaper above us): the kernel keeps a child's exit status for its
    pidfd only once it is reaped. Probed once, with an orphaned sleep."""
    global _ORPHANS_REAPED
    if _ORPHANS_REAPED is None:
        pid = int(subprocess.check_output(["sh", "-c", "sleep 0.05 >/dev/null & echo $!"]))
        deadline = time.monotonic() + 15
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)
        _ORPHANS_REAPED = not os.path.exists(f"/proc/{pid}")
    return _ORPHANS_REAPED


def pidfd_fallback_testable() -> bool:
    """Whether the pidfd fallback can be tested here: the kernel keeps exit
    statuses, or does not (the loss stays the error), and in the first case
    orphans are reaped. Skips the calling test, loudly, otherwise."""
    if kernel_keeps_exit_status() and not orphans_are_reaped():
        pytest.skip(
            "orphans are not reaped here (init or the subreaper above this test leaves "
            "them zombies), so the kernel never hands over their exit status"
        )
    return kernel_keeps_exit_status()


class Daemon:
    """One `zygote serve` process on its own socket."""

    def __init__(
        self, directory: Path, socket_path: Optional[str] = None, extra: Sequence[str] = ()
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.socket = socket_path or str(directory / "zygote.sock")
        self.log_path = directory / "zygote.log"
        self._log = open(self.log_path, "wb")
        env = dict(os.environ, ZYGOTE_LOG="debug")
        self.process: Optional["subprocess.Popen[bytes]"] = subprocess.Popen(
            [zygote_bin(), "serve", "--socket", self.socket, "--stop-timeout", "2", *extra],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=env,
        )
        deadline = time.monotonic() + 20
        while not self._accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"zygote did not start; its log:\n{self.log()}")
            time.sleep(0.02)

    def _accepts(self) -> bool:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            probe.close()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.stash_failed = True  # type: ignore[attr-defined]


def _print_log_on_failure(request: pytest.FixtureRequest, daemon: Daemon) -> None:
    failed = any(getattr(item, "stash_failed", False) for item in request.session.items)
    if failed:
        print(
            f"\n--- zygote log ({daemon.log_path}) ---\n{daemon.log()[-20000:]}--- end of log ---"
        )


@pytest.fixture(scope="session")
def shared_daemon(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path_factory.mktemp("shared-zygote"))
    yield daemon
    daemon.stop()
    _print_log_on_failure(request, daemon)


@pytest.fixture
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """A daemon of the test's own, for tests that kill or stop it."""
    own = Daemon(tmp_path)
    yield own
    own.kill()
    own.stop()
    if getattr(request.node, "stash_failed", False):
        print(f"\n--- zygote log ({own.log_path}) ---\n{own.log()[-20000:]}--- end of log ---")


@pytest.fixture
def client(shared_daemon: Daemon) -> Iterator[zygote.Client]:
    with zygote.Client(shared_daemon.socket) as own:
        yield own


@pytest.fixture
def default_socket(shared_daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> str:
    """Points the module-level default client at the shared daemon."""
    monkeypatch.setenv("ZYGOTE_SOCKET", shared_daemon.socket)
    return shared_daemon.socket
