"""zygote.Cgroup against a real daemon with a cgroup subtree of its own
(``zygote serve --cgroup PATH``): whole-tree kill and wait, tree usage,
and limits refused where their controller is not delegated."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest
from conftest import Daemon

import zygote


def _cgroup2_mount() -> Optional[Path]:
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            before, _, after = line.partition(" - ")
            if after.split()[:1] == ["cgroup2"]:
                return Path(before.split()[4])
    return None


def _eventually(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _gone(pid: int) -> bool:
    """Not even a zombie: the daemon, a subreaper, reaped it."""
    return not os.path.exists(f"/proc/{pid}")


def _remove_tree(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir():
            _remove_tree(child)
    path.rmdir()


class OwnCgroup:
    """A cgroup of one test's daemon; killed and removed afterwards."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def controllers(self) -> str:
        return (self.path / "cgroup.controllers").read_text()

    def children(self) -> list:  # type: ignore[type-arg]
        peers = self.path / "peers"
        if not peers.is_dir():
            return []
        return [
            child
            for uid in peers.iterdir()
            if uid.is_dir()
            for child in uid.iterdir()
            if child.is_dir()
        ]


@pytest.fixture
def cgroup(request: pytest.FixtureRequest) -> Iterator[OwnCgroup]:
    mount = _cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 file system mounted")
    if os.geteuid() != 0 or not os.access(mount / "cgroup.procs", os.W_OK):
        pytest.skip(f"cgroup2 at {mount} is not writable here")
    path = mount / f"zygote-pytest-{os.getpid()}-{request.node.name[:40]}"
    path.mkdir()
    if not (path / "cgroup.kill").exists():
        path.rmdir()
        pytest.skip("no cgroup.kill (needs Linux 5.14)")
    own = OwnCgroup(path)
    yield own
    (path / "cgroup.kill").write_text("1")
    _eventually(lambda: "populated 0" in (path / "cgroup.events").read_text())
    _remove_tree(path)


@pytest.fixture
def cgroup_daemon(tmp_path: Path, cgroup: OwnCgroup) -> Iterator[Daemon]:
    own = Daemon(tmp_path, extra=["--cgroup", str(cgroup.path)])
    yield own
    own.kill()
    own.stop()


ESCAPING = "(setsid sh -c 'echo $$; exec sleep 300' &); exec sleep 300"


def _grandchild(process: zygote.Popen) -> int:
    """The pid the escaping grandchild printed; it left the child's process
    group and session."""
    assert process.stdout is not None
    return int(process.stdout.readline())


def test_a_timeout_kills_a_grandchild_that_escaped_by_setsid(
    cgroup_daemon: Daemon, cgroup: OwnCgroup
) -> None:
    with zygote.Client(cgroup_daemon.socket) as client:
        process = client.Popen(
            ["sh", "-c", ESCAPING],
            stdout=zygote.PIPE,
            zygote_timeout=0.3,
            zygote_grace=0.2,
            cgroup=zygote.Cgroup(kill_tree=True),
        )
        grandchild = _grandchild(process)
        assert not _gone(grandchild), "the grandchild runs"
        assert process.wait(timeout=30) in (-signal.SIGTERM, -signal.SIGKILL)
        assert process.timed_out
        assert process.tree_usage is not None and not process.oom_killed
        assert _eventually(lambda: _gone(grandchild)), "the setsid grandchild outlived the timeout"
        assert _eventually(lambda: not cgroup.children()), cgroup.children()
        process.stdout.close()  # type: ignore[union-attr]


def test_kill_with_kill_tree_ends_the_whole_tree(cgroup_daemon: Daemon) -> None:
    with zygote.Client(cgroup_daemon.socket) as client:
        process = client.Popen(
            ["sh", "-c", ESCAPING], stdout=zygote.PIPE, cgroup=zygote.Cgroup(kill_tree=True)
        )
        grandchild = _grandchild(process)
        process.kill()
        assert process.wait(timeout=30) == -signal.SIGKILL
        assert _eventually(lambda: _gone(grandchild)), "the setsid grandchild outlived kill()"
        process.stdout.close()  # type: ignore[union-attr]


def test_tree_cpu_time_counts_a_grandchild_the_child_never_waited_for(
    cgroup_daemon: Daemon,
) -> None:
    burn = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"
    with zygote.Client(cgroup_daemon.socket) as client:
        process = client.Popen(
            ["sh", "-c", f"(sh -c '{burn}' &); exit 0"], cgroup=zygote.Cgroup(wait_tree=True)
        )
        assert process.wait(timeout=60) == 0
        tree, own = process.tree_usage, process.usage
        assert tree is not None and own is not None
        tree_cpu = tree["user_micros"] + tree["system_micros"]
        own_cpu = own["user_micros"] + own["system_micros"]
        assert tree_cpu > own_cpu + 50_000, (tree, own)
        assert tree["oom_kills"] == 0 and not process.oom_killed


def test_asyncio_reports_tree_usage(cgroup_daemon: Daemon) -> None:
    async def scenario() -> None:
        with zygote.Client(cgroup_daemon.socket) as client:
            process = await client.create_subprocess_exec(
                "sh", "-c", "exit 3", cgroup=zygote.Cgroup(wait_tree=True)
            )
            assert await process.wait() == 3
            assert process.tree_usage is not None
            assert not process.oom_killed

    asyncio.run(scenario())


def test_asyncio_kill_with_kill_tree_ends_the_whole_tree(cgroup_daemon: Daemon) -> None:
    async def scenario() -> int:
        with zygote.Client(cgroup_daemon.socket) as client:
            process = await client.create_subprocess_exec(
                "sh", "-c", ESCAPING, stdout=zygote.PIPE, cgroup=zygote.Cgroup(kill_tree=True)
            )
            assert process.stdout is not None
            grandchild = int(await process.stdout.readline())
            process.kill()
            assert await asyncio.wait_for(process.wait(), 30) == -signal.SIGKILL
            return grandchild

    grandchild = asyncio.run(scenario())
    assert _eventually(lambda: _gone(grandchild)), "the setsid grandchild outlived kill()"


def test_memory_max_is_refused_without_the_memory_controller(
    cgroup_daemon: Daemon, cgroup: OwnCgroup
) -> None:
    if "memory" in cgroup.controllers().split():
        pytest.skip("the memory controller is delegated here: the refusal path is not reachable")
    with zygote.Client(cgroup_daemon.socket) as client:
        with pytest.raises(OSError) as caught:
            client.run(["true"], cgroup=zygote.Cgroup(memory_max=512 << 20))
        assert not isinstance(caught.value, zygote.ZygoteError), "a refusal, not a lost daemon"
        text = caught.value.zygote_message  # type: ignore[attr-defined]
        assert "memory.max requested" in text and "memory controller is not delegated" in text
        assert not cgroup.children(), "a refused spawn left a cgroup"
        assert client.run(["true"]).returncode == 0, "the connection carries on"


def test_cgroup_options_without_a_subtree_are_refused(client: zygote.Client) -> None:
    with pytest.raises(OSError) as caught:
        client.run(["true"], cgroup=zygote.Cgroup(pids_max=10))
    assert "no cgroup subtree" in caught.value.zygote_message  # type: ignore[attr-defined]
    assert client.run(["true"]).returncode == 0


def test_bad_cgroup_values_are_refused_before_sending(client: zygote.Client) -> None:
    with pytest.raises(ValueError, match="memory_max"):
        client.run(["true"], cgroup=zygote.Cgroup(memory_max=-1))
    with pytest.raises(ValueError, match="cpu_max"):
        client.run(["true"], cgroup=zygote.Cgroup(cpu_max=(0, 0.1)))
    with pytest.raises(TypeError, match="zygote.Cgroup"):
        client.run(["true"], cgroup={"memory_max": 1})
