"""run and Popen against a real daemon: return codes, signals, pipes,
fds, working directory, environment, credentials, errors."""

from __future__ import annotations

import fcntl
import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Daemon, kernel_keeps_exit_status

import zygote
from zygote import _request


def test_return_codes_and_signals(client: zygote.Client) -> None:
    assert client.run(["true"]).returncode == 0
    assert client.run(["sh", "-c", "exit 3"]).returncode == 3
    assert client.run(["sh", "-c", "kill -TERM $$"]).returncode == -signal.SIGTERM
    assert client.run(["sh", "-c", "kill -KILL $$"]).returncode == -signal.SIGKILL


def test_check_raises_the_stdlib_error(client: zygote.Client) -> None:
    with pytest.raises(subprocess.CalledProcessError) as caught:
        client.run(["sh", "-c", "echo out; exit 4"], check=True, capture_output=True)
    assert type(caught.value) is subprocess.CalledProcessError
    assert caught.value.returncode == 4
    assert caught.value.stdout == b"out\n"
    completed = client.run(["true"], check=True)
    assert type(completed) is subprocess.CompletedProcess
    assert completed.args == ["true"]


def test_timeout_kills_and_raises(client: zygote.Client) -> None:
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        client.run(["sleep", "30"], timeout=0.3)
    assert type(caught.value) is subprocess.TimeoutExpired
    assert 0 < (caught.value.timeout or 0) <= 0.3
    assert time.monotonic() - start < 10  # killed, not waited for


def test_capture_output_text_and_bytes(client: zygote.Client) -> None:
    script = "printf 'caf\\303\\251\\n'; echo err >&2"
    raw = client.run(["sh", "-c", script], capture_output=True)
    assert raw.stdout == "café\n".encode() and raw.stderr == b"err\n"
    text = client.run(["sh", "-c", script], capture_output=True, text=True)
    assert text.stdout == "café\n" and text.stderr == "err\n"
    latin = client.run(["sh", "-c", script], capture_output=True, encoding="latin-1")
    assert latin.stdout == "cafÃ©\n"
    merged = client.run(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert sorted(merged.stdout.splitlines()) == sorted(["café".encode(), b"err"])
    assert client.run(["cat"], input="in", capture_output=True, text=True).stdout == "in"


def test_ten_mib_through_cat(client: zygote.Client) -> None:
    data = os.urandom(10 * 1024 * 1024)
    with client.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as process:
        out, err = process.communicate(data, timeout=60)
    assert out == data and err is None
    assert process.returncode == 0


def test_popen_api(client: zygote.Client) -> None:
    process = client.Popen(["sh", "-c", "echo $$; exec sleep 30"], stdout=subprocess.PIPE)
    assert isinstance(process, subprocess.Popen)
    assert process.stdout is not None
    assert int(process.stdout.readline()) == process.pid
    assert process.poll() is None and process.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    assert process.pidfd is not None
    assert select.select([process.pidfd], [], [], 0)[0] == []  # still running
    process.terminate()
    assert process.wait(timeout=10) == -signal.SIGTERM
    assert process.returncode == -signal.SIGTERM
    assert select.select([process.pidfd], [], [], 10)[0] == [process.pidfd]
    process.kill()  # after exit: nothing, as in the stdlib
    process.stdout.close()
    assert process.usage is not None and process.usage["max_rss_kib"] > 0
    assert process.args == ["sh", "-c", "echo $$; exec sleep 30"]

    with client.Popen(["sleep", "30"]) as sleeper:
        sleeper.send_signal(signal.SIGKILL)
    assert sleeper.returncode == -signal.SIGKILL


def test_received_fds_are_cloexec(client: zygote.Client) -> None:
    with client.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as process:
        assert process.stdin is not None and process.stdout is not None
        for fd in (process.pidfd, process.stdin.fileno(), process.stdout.fileno()):
            assert fd is not None
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        process.communicate(b"")


LIST_FDS = """
import os, sys
if len(sys.argv) > 1:
    os.write(int(sys.argv[1]), b"through\\n")
fds = os.listdir("/proc/self/fd")
print(*(fd for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")))
"""


def test_pass_fds_and_nothing_else_leaks(client: zygote.Client) -> None:
    read_end, write_end = os.pipe()
    leak = os.open("/dev/null", os.O_RDONLY)
    os.set_inheritable(leak, True)
    try:
        result = client.run(
            [sys.executable, "-c", LIST_FDS, str(write_end)],
            pass_fds=[write_end],
            capture_output=True,
            text=True,
        )
        os.close(write_end)
        assert os.read(read_end, 100) == b"through\n"
        fds = sorted(int(fd) for fd in result.stdout.split())
        # 0-2 and the passed fd: never `leak`.
        assert fds == [0, 1, 2, write_end], fds
        inherited = client.run(
            [sys.executable, "-c", LIST_FDS], close_fds=False, capture_output=True, text=True
        )
        assert str(leak) in inherited.stdout.split()
    finally:
        os.close(read_end)
        os.close(leak)


def test_cwd(client: zygote.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        client.run(["pwd"], cwd=tmp_path, capture_output=True, text=True).stdout == f"{tmp_path}\n"
    )
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    # The caller's directory by default, and a relative cwd joins onto it.
    assert client.run(["pwd"], capture_output=True, text=True).stdout == f"{tmp_path}\n"
    relative = client.run(["pwd"], cwd="sub", capture_output=True, text=True)
    assert relative.stdout == f"{tmp_path / 'sub'}\n"
    with pytest.raises(FileNotFoundError) as caught:
        client.run(["pwd"], cwd=tmp_path / "missing")
    assert caught.value.filename == tmp_path / "missing"
    assert caught.value.zygote_stage == "Chdir"  # type: ignore[attr-defined]


def test_env(client: zygote.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    exact = client.run(["/usr/bin/env"], env={"A": "1", b"B": b"\xff"}, capture_output=True)
    assert exact.stdout == b"A=1\nB=\xff\n"
    monkeypatch.setenv("ZYGOTE_PY_TEST", "inherited")
    inherited = client.run(["sh", "-c", "echo $ZYGOTE_PY_TEST"], capture_output=True, text=True)
    assert inherited.stdout == "inherited\n"
    with pytest.raises(ValueError):
        client.run(["true"], env={"A=B": "1"})
    with pytest.raises(ValueError):
        client.run(["true\0"])


# Execs argv[2:] with the environment listed (one entry a line) in argv[1],
# exactly: entries that os.execve and subprocess refuse ("NOEQ") included.
EXEC_WITH_RAW_ENVIRONMENT = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
argv = [os.fsencode(arg) for arg in sys.argv[2:]]
env = os.fsencode(sys.argv[1]).split(b"\\n")
libc.execve(argv[0], (ctypes.c_char_p * (len(argv) + 1))(*argv, None),
            (ctypes.c_char_p * (len(env) + 1))(*env, None))
raise OSError(ctypes.get_errno(), "execve")
"""

# Prints the environment of children spawned through the zygote with the
# inherited environment (run, asyncio, and the usual dict(os.environ, ...)),
# after this process's own.
SPAWN_WITH_INHERITED_ENVIRONMENT = """
import asyncio, os, subprocess, zygote
cat = ["/bin/cat", "/proc/self/environ"]
with open("/proc/self/environ", "rb") as own:
    print(repr(own.read()))
with zygote.Client(os.environ["ZYGOTE_SOCKET"]) as client:
    print(repr(client.run(cat, stdout=subprocess.PIPE, check=True).stdout))
    async def main():
        process = await client.create_subprocess_exec(*cat, stdout=subprocess.PIPE)
        return (await process.communicate())[0]
    print(repr(asyncio.run(main())))
    env = dict(os.environ, ADDED="1")
    print(repr(client.run(cat, env=env, stdout=subprocess.PIPE, check=True).stdout))
"""


def test_an_inherited_environment_with_odd_entries_reaches_the_child(
    shared_daemon: Daemon,
) -> None:
    """A program whose environment holds ``=A=B`` (left by some shells and
    Windows-ported tools; key "" in os.environ) and ``NOEQ`` still spawns,
    and the child gets ``=A=B`` byte for byte. What os.environ skips (an
    entry without "=", a second entry named "") does not arrive."""
    socket_var = f"ZYGOTE_SOCKET={shared_daemon.socket}"
    # No locale coercion: it would add LC_CTYPE to the environment.
    raw = ["=A=B", "NOEQ", "K=v", "==x", "PYTHONCOERCECLOCALE=0", socket_var]
    result = subprocess.run(
        [
            *(sys.executable, "-c", EXEC_WITH_RAW_ENVIRONMENT, "\n".join(raw)),
            *(sys.executable, "-c", SPAWN_WITH_INHERITED_ENVIRONMENT),
        ],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    kept = f"=A=B\0K=v\0PYTHONCOERCECLOCALE=0\0{socket_var}\0".encode()
    assert result.stdout.decode().splitlines() == [
        repr("\0".join([*raw, ""]).encode()),
        repr(kept),
        repr(kept),
        repr(kept + b"ADDED=1\0"),
    ]


def test_explicit_env_names_are_checked_as_subprocess_checks_them(
    client: zygote.Client,
) -> None:
    """An empty name is allowed (the child gets ``=VALUE``); one with "="
    raises ValueError, as in subprocess."""
    out = client.run(
        ["/bin/cat", "/proc/self/environ"], env={"": "A=B", "K": "v"}, capture_output=True
    )
    assert out.stdout == b"=A=B\0K=v\0"
    with pytest.raises(ValueError, match="illegal environment variable name"):
        client.run(["true"], env={"=A": "B"})
    with pytest.raises(ValueError, match="illegal environment variable name"):
        subprocess.run(["true"], env={"=A": "B"})


def test_umask_and_rlimits_are_copied(client: zygote.Client) -> None:
    old_mask = os.umask(0o027)
    try:
        assert client.run(["sh", "-c", "umask"], capture_output=True, text=True).stdout == "0027\n"
    finally:
        os.umask(old_mask)
    assert (
        client.run(["sh", "-c", "umask"], umask=0o077, capture_output=True, text=True).stdout
        == "0077\n"
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
    client.refresh_process_state()
    try:
        copied = client.run(["sh", "-c", "ulimit -n"], capture_output=True, text=True)
        assert copied.stdout == "200\n"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        client.refresh_process_state()
    asked = client.run(
        ["sh", "-c", "ulimit -n"],
        rlimits={resource.RLIMIT_NOFILE: (100, hard)},
        capture_output=True,
        text=True,
    )
    assert asked.stdout == "100\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="SKIPPED LOUDLY: user/group need root")
def test_user_and_group(client: zygote.Client) -> None:
    result = client.run(
        ["sh", "-c", "id -u; id -g; id -G"],
        user=65534,
        group=65534,
        extra_groups=[65534, 100],
        capture_output=True,
        text=True,
    )
    assert result.stdout.split("\n")[:3] == ["65534", "65534", "65534 100"]
    # Unset parts are ours, as with subprocess.
    only_user = client.run(["id", "-u"], user="nobody", capture_output=True, text=True)
    assert only_user.stdout == "65534\n"


def test_spawn_errors(client: zygote.Client, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        client.run(["no-such-program-zygote"])
    assert missing.value.filename == "no-such-program-zygote"
    assert missing.value.errno == 2
    assert missing.value.zygote_stage == "Exec"  # type: ignore[attr-defined]
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError) as denied:
        client.run([str(script)])
    assert denied.value.filename == str(script)
    with pytest.raises(ValueError, match="preexec_fn"):
        client.run(["true"], preexec_fn=lambda: None)
    # The connection is fine after failures.
    assert client.run(["true"]).returncode == 0


def test_zygote_options(client: zygote.Client, shared_daemon: Daemon) -> None:
    timed = client.Popen(["sleep", "30"], zygote_timeout=0.2, zygote_grace=0.1)
    assert timed.wait(timeout=20) == -signal.SIGTERM
    assert timed.timed_out

    with zygote.Client(shared_daemon.socket) as other:
        sleeper = other.Popen(["sleep", "30"], kill_on_close=True)
        pidfd = os.dup(sleeper.pidfd or -1)
    try:
        # The daemon kills it when the connection closes.
        assert select.select([pidfd], [], [], 10)[0] == [pidfd]
    finally:
        os.close(pidfd)
    # The connection is closed, but the status is kept for the pidfd
    # (Linux 6.15+); before, it is lost.
    if kernel_keeps_exit_status():
        assert sleeper.wait(timeout=30) == -signal.SIGKILL
        assert sleeper.zygote_lost and sleeper.usage is None
    else:
        with pytest.raises(zygote.ZygoteError, match="6.15"):
            sleeper.wait(timeout=30)


def test_missing_daemon_is_a_zygote_error(tmp_path: Path) -> None:
    with pytest.raises(zygote.ZygoteError) as caught:
        zygote.Client(str(tmp_path / "none.sock"))
    assert isinstance(caught.value, OSError)
    assert not isinstance(caught.value, FileNotFoundError)
    assert caught.value.errno == 2
    assert "none.sock" in str(caught.value)


def test_module_level_api(default_socket: str) -> None:
    result = zygote.run(
        [sys.executable, "-c", "import os; print(os.getppid())"], capture_output=True
    )
    assert int(result.stdout) != os.getpid()  # the zygote is the parent
    with zygote.Popen(["true"]) as process:
        pass
    assert process.returncode == 0
    status = zygote.default_client().status()
    assert status["spawns_succeeded"] >= 2
    assert status["connections_open"] >= 1


def test_module_level_asyncio(default_socket: str) -> None:
    import asyncio

    async def main() -> bytes:
        process = await zygote.create_subprocess_exec("echo", "async", stdout=subprocess.PIPE)
        out, _ = await process.communicate()
        assert process.returncode == 0 and process.pidfd is not None
        return out or b""

    assert asyncio.run(main()) == b"async\n"


def test_client_from_environment(default_socket: str) -> None:
    with zygote.Client() as own:
        assert own.path == default_socket
        assert own.run(["true"]).returncode == 0


def test_process_state_is_read_once_until_refreshed(client: zygote.Client) -> None:
    # Read at the first spawn and reused: a later umask, limit or ignored
    # signal is not seen until refresh_process_state(), then it is.
    def umask() -> str:
        return client.run(["sh", "-c", "umask"], capture_output=True, text=True).stdout

    def ignored() -> int:
        status = client.run(["grep", "SigIgn", "/proc/self/status"], capture_output=True)
        return int(status.stdout.split()[1], 16)

    reads = []
    real_read = _request.read_process_state

    def counting_read() -> _request.ProcessState:
        reads.append(1)
        return real_read()

    old_mask = os.umask(0o022)
    old_handler = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    _request.read_process_state = counting_read  # type: ignore[assignment]
    try:
        assert umask() == "0022\n"
        assert ignored() & (1 << (signal.SIGUSR1 - 1)) == 0
        os.umask(0o027)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        assert umask() == "0022\n", "read once: the change is not seen yet"
        assert ignored() & (1 << (signal.SIGUSR1 - 1)) == 0
        assert len(reads) == 1, "one read for four spawns"
        client.refresh_process_state()
        assert umask() == "0027\n", "seen after refresh_process_state()"
        assert ignored() & (1 << (signal.SIGUSR1 - 1)) != 0
        os.umask(0o077)
        zygote.refresh_process_state()
        assert umask() == "0077\n", "the module's refresh reaches every client"
        assert len(reads) == 3
    finally:
        _request.read_process_state = real_read  # type: ignore[assignment]
        os.umask(old_mask)
        signal.signal(signal.SIGUSR1, old_handler)
        client.refresh_process_state()


def test_every_spawn_copies_the_environment_as_it_is_then(client: zygote.Client) -> None:
    # The environment's encoding is reused only while it is unchanged.
    def seen() -> str:
        script = 'echo "${ZYGOTE_TEST_VALUE-unset}"'
        return client.run(["sh", "-c", script], capture_output=True, text=True).stdout

    try:
        for value in ("one", "two", "two", "three"):
            os.environ["ZYGOTE_TEST_VALUE"] = value
            assert seen() == f"{value}\n"
        del os.environ["ZYGOTE_TEST_VALUE"]
        assert seen() == "unset\n"
    finally:
        os.environ.pop("ZYGOTE_TEST_VALUE", None)


def test_process_attributes_are_ours(client: zygote.Client) -> None:
    # The same script, run by subprocess and through the zygote, sees the
    # same ignored signals, nice value, CPUs and OOM score adjustment.
    script = (
        "grep SigIgn /proc/self/status; nice; "
        "grep Cpus_allowed_list /proc/self/status; cat /proc/self/oom_score_adj"
    )
    old_handler = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    old_nice = os.getpriority(os.PRIO_PROCESS, 0)
    # 19 is the ceiling (a test run under `nice -n 19` starts there).
    new_nice = min(old_nice + 3, 19)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, new_nice)
        direct = subprocess.run(["sh", "-c", script], capture_output=True, check=True)
        zygoted = client.run(["sh", "-c", script], capture_output=True, check=True)
    finally:
        signal.signal(signal.SIGUSR1, old_handler)
        try:
            os.setpriority(os.PRIO_PROCESS, 0, old_nice)
        except PermissionError:
            pass  # without privilege the rest of the session runs nicer
    assert zygoted.stdout == direct.stdout
    assert f"\n{new_nice}\n".encode() in zygoted.stdout
