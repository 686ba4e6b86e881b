"""The sandbox: its wire layout (protocol version 3), the checks of every
field before anything is sent, the local refusal when the daemon does not
offer the feature, and what the daemon reports it applied."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from conftest import Daemon

import zygote
from zygote import _conn, _request, _wire

LIMITS = {"max_frame_bytes": 262144, "max_fds_per_frame": 64}


def sample() -> zygote.Sandbox:
    """Every field but profile and seccomp_filter."""
    return zygote.Sandbox(
        mounts=[zygote.Mount.ro("/usr"), zygote.Mount.tmpfs("/tmp")],
        network="none",
        isolate=True,
        hostname="h",
        seccomp="default",
        landlock=zygote.Landlock(read_write=["/w"], tcp_connect=[443], require=True),
    )


# The encoding of sample(), written by hand from the version-3 layout.
SAMPLE_HEX = (
    "01"  # Some(SandboxSpec)
    "00"  # profile: None
    "01" "02" "00" "042f757372" "042f757372" "02" "00" "042f746d70"  # two mounts
    "01"  # network: None
    "01"  # isolate
    "01" "0168"  # hostname "h"
    "01" "00" "0764656661756c74"  # seccomp Profile("default")
    "01" "00" "00" "01022f77" "00" "01bb03" "01"  # landlock
)  # fmt: skip


def spawn_body(sandbox: Optional[zygote.Sandbox]) -> Dict[str, Any]:
    spec = _request.ChildSpec(
        argv=["/bin/true"],
        program="/bin/true",
        stdio=[("null",)] * 3,
        options=_request.ZygoteOptions(sandbox=sandbox),
    )
    message, _ = _request.build_spawn(spec, 1, 64)
    body: Dict[str, Any] = message["Spawn"]
    return body


def test_sandbox_wire_layout() -> None:
    body = spawn_body(sample())
    frame = _wire.encode_spawn(body, 3)
    assert frame.hex().endswith(SAMPLE_HEX)
    # The generic encoder agrees, and the frame decodes back.
    assert _wire.encode(_wire.CLIENT_MESSAGE, {"Spawn": body}) == frame
    assert _wire.decode(_wire.CLIENT_MESSAGE, frame)["Spawn"]["sandbox"] == body["sandbox"]
    # Version 2 has no room for it: refused, never dropped.
    with pytest.raises(ValueError, match="needs protocol version 3"):
        _wire.encode_spawn(body, 2)
    plain = spawn_body(None)
    assert _wire.encode_spawn(plain, 3) == _wire.encode_spawn(plain, 2) + b"\x00"


def test_reply_layouts_follow_the_version() -> None:
    spawned = bytes.fromhex(
        "01" "07" "0a" "01" "010462617365" "02" "036d6e74" "03706964" "00" "0107" "01"
    )  # fmt: skip
    reply = _wire.decode_server(spawned, 3)["Spawned"]
    assert zygote.AppliedSandbox.from_wire(reply["sandbox"]) == zygote.AppliedSandbox(
        profile="base",
        namespaces=("mnt", "pid"),
        seccomp=None,
        landlock_abi=7,
        landlock_complete=True,
    )
    with pytest.raises(_wire.DecodeError):
        _wire.decode_server(spawned, 2)
    assert _wire.decode_server(spawned[:3], 2) == {"Spawned": {"id": 7, "pid": 5}}
    status = {
        "id": 1, "server_version": "t", "pid": 2, "uptime_millis": 3, "connections_open": 4,
        "connections_accepted": 5, "children_running": 6, "spawns_succeeded": 7,
        "spawns_failed": 8,
        "peers": [{"uid": 1000, "connections": 2, "children": 3, "children_limit": 128,
                   "connections_limit": 16, "sandbox_profile": "strict"}],
        "spawners": [{"uid": 1000, "pid": -1, "spawns": 9, "restarts": 1}],
    }  # fmt: skip
    frame = _wire.encode(_wire.SERVER_MESSAGE, {"Status": status})
    peers = "01" "e807" "02" "03" "8001" "10" "0106737472696374"  # fmt: skip
    tail = peers + "01" "e807" "01" "09" "01"  # fmt: skip
    assert frame.hex().endswith(tail)
    assert _wire.decode_server(frame, 3) == {"Status": status}
    # The Sandbox stage exists from version 3 on; a version-2 daemon sends Exec.
    failed = bytes.fromhex("02" "01" "13" "02" "00")  # fmt: skip
    assert _wire.decode_server(failed, 3)["SpawnFailed"]["stage"] == "Sandbox"
    with pytest.raises(_wire.DecodeError):
        _wire.decode_server(failed, 2)


@pytest.mark.parametrize(
    "change, error, text",
    [
        ({"mounts": [zygote.Mount.ro("usr")]}, ValueError, r"\].source 'usr' is not an absolute"),
        (
            {"mounts": [zygote.Mount("rw", "/a", "")]},
            ValueError,
            r"mounts\[0\].destination is empty",
        ),
        ({"mounts": [zygote.Mount.ro("/a\0b")]}, ValueError, "embedded null byte"),
        (
            {"mounts": [zygote.Mount("tmpfs", "/x", "/y")]},
            ValueError,
            "a tmpfs mount has no source",
        ),
        ({"mounts": [zygote.Mount("overlay", "/x")]}, ValueError, "'ro', 'rw' or 'tmpfs'"),
        ({"mounts": ["/usr"]}, TypeError, r"mounts\[0\] must be a zygote.Mount"),
        ({"mounts": [zygote.Mount.ro(5)]}, TypeError, "must be a path"),  # type: ignore[arg-type]
        ({"network": "bridge"}, ValueError, "'host' or 'none'"),
        ({"isolate": False}, ValueError, "needs isolate=True"),
        ({"hostname": "a\0"}, ValueError, "embedded null byte in Sandbox.hostname"),
        ({"profile": "\udcff"}, ValueError, "Sandbox.profile .* is not valid UTF-8"),
        ({"profile": 7}, TypeError, "Sandbox.profile must be a str"),
        ({"seccomp_filter": "x"}, ValueError, "both set"),
        (
            {"landlock": zygote.Landlock(tcp_bind=[65536])},
            OverflowError,
            r"bind\[0\] 65536 is not a TCP port",
        ),
        ({"landlock": zygote.Landlock(tcp_connect=[-1])}, OverflowError, "not a TCP port"),
        ({"landlock": zygote.Landlock(tcp_connect=[True])}, TypeError, "must be an int"),
        (
            {"landlock": zygote.Landlock(read_only=["/", "etc"])},
            ValueError,
            r"read_only\[1\] 'etc'",
        ),
        ({"landlock": zygote.Landlock(read_write="/w")}, TypeError, "must be a list or tuple"),
        ({"landlock": zygote.Landlock(require=1)}, TypeError, "require must be a bool"),  # type: ignore
    ],
)
def test_bad_fields_are_refused_before_encoding(
    change: Dict[str, Any], error: type, text: str
) -> None:
    fields = {**sample().__dict__, **change}
    with pytest.raises(error, match=text):
        spawn_body(zygote.Sandbox(**fields))


class Peer:
    """A scripted daemon of protocol ``version`` offering ``features``: it
    counts the spawns it gets, answers one with a sandbox with Spawned
    (carrying ``applied``) then Exited, and any other with SpawnFailed."""

    def __init__(
        self, path: str, version: int, features: List[str], applied: Optional[Dict[str, Any]]
    ) -> None:
        self.version = version
        self.features = features
        self.applied = applied
        self.spawns: List[Dict[str, Any]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def reply(self, conn: socket.socket, message: Dict[str, Any], pidfd: int = -1) -> None:
        frame = _wire.encode(_wire.server_schema(self.version), message)
        if pidfd >= 0:
            socket.send_fds(conn, [frame], [pidfd])
        else:
            conn.send(frame)

    def serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            while True:
                frame = conn.recv(1 << 18)
                if not frame:
                    return
                message = _wire.decode(_wire.client_schema(self.version), frame)
                if "Hello" in message:
                    ack: Dict[str, Any] = {"protocol_version": self.version,
                                           "server_version": "test", "limits": LIMITS,
                                           "features": self.features}  # fmt: skip
                    self.reply(conn, {"HelloAck": ack})
                    continue
                spawn = message["Spawn"]
                self.spawns.append(spawn)
                if spawn.get("sandbox") is None:
                    failed = {"id": spawn["id"], "stage": "Validate", "errno": 1, "message": "no"}
                    self.reply(conn, {"SpawnFailed": failed})
                    continue
                pidfd = os.pidfd_open(os.getpid())
                try:
                    spawned = {"id": spawn["id"], "pid": 42, "sandbox": self.applied}
                    self.reply(conn, {"Spawned": spawned}, pidfd)
                finally:
                    os.close(pidfd)
                exited = {"id": spawn["id"], "status": {"Exited": 0},
                          "usage": {"user_micros": 0, "system_micros": 0, "max_rss_kib": 0},
                          "timed_out": False, "tree": None, "pid": 42}  # fmt: skip
                self.reply(conn, {"Exited": exited})

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def peer_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "peer.sock")


@pytest.mark.parametrize("version", [3, 2])
def test_sandbox_needs_the_feature(peer_path: str, version: int) -> None:
    """A sandbox is refused before it is sent when the daemon does not
    offer the feature (version 3 without it, or version 2), as the daemon
    would refuse it; the connection carries the next spawn."""
    peer = Peer(peer_path, version, ["pty"], None)
    try:
        with zygote.Client(peer_path) as client:
            with pytest.raises(OSError) as raised:
                client.Popen(["/bin/true"], sandbox=zygote.Sandbox(isolate=True))
            assert raised.value.errno == errno.EOPNOTSUPP
            assert "feature sandbox" in str(raised.value)
            assert raised.value.zygote_stage == "Validate"  # type: ignore[attr-defined]
            assert peer.spawns == []
            with pytest.raises(OSError, match="Operation not permitted"):
                client.run(["/bin/true"])
            assert len(peer.spawns) == 1
    finally:
        peer.close()


def test_applied_sandbox_is_reported(peer_path: str) -> None:
    applied = {"profile": "ci", "namespaces": ["mount", "net"], "seccomp": "default",
               "landlock_abi": 7, "landlock_complete": True}  # fmt: skip
    peer = Peer(peer_path, 3, ["sandbox"], applied)
    try:
        with zygote.Client(peer_path) as client:
            process = client.Popen(["/bin/true"], sandbox=sample())
            assert process.wait(timeout=10) == 0
            assert process.sandbox == zygote.AppliedSandbox(
                profile="ci",
                namespaces=("mount", "net"),
                seccomp="default",
                landlock_abi=7,
                landlock_complete=True,
            )
            assert peer.spawns[0]["sandbox"] == spawn_body(sample())["sandbox"]
    finally:
        peer.close()


def test_real_daemon_without_the_feature(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the real daemon withholding ``sandbox``: refused locally
    naming the feature; bad values are refused with the stdlib's
    exceptions; the connection still spawns; status shows this peer's uid
    with its counts."""
    monkeypatch.setenv("ZYGOTE_MASK_FEATURES", "sandbox")
    daemon = Daemon(tmp_path)
    try:
        with zygote.Client(daemon.socket) as client:
            assert "sandbox" not in client.features
            with pytest.raises(OSError) as raised:
                client.run(["/bin/true"], sandbox=zygote.Sandbox(network="none"))
            assert raised.value.errno == errno.EOPNOTSUPP
            assert "feature sandbox" in str(raised.value)
            with pytest.raises(OSError) as raised:
                asyncio.run(
                    client.create_subprocess_exec("/bin/true", sandbox=zygote.Sandbox(isolate=True))
                )
            assert raised.value.errno == errno.EOPNOTSUPP
            with pytest.raises(ValueError, match="not an absolute path"):
                client.run(["/bin/true"], sandbox=zygote.Sandbox(mounts=[zygote.Mount.ro("x")]))
            with pytest.raises(OverflowError):
                bad_port = zygote.Landlock(tcp_bind=[1 << 16])
                client.run(["/bin/true"], sandbox=zygote.Sandbox(landlock=bad_port))
            sleeper = client.Popen(["sleep", "30"])
            try:
                status = client.status()
            finally:
                sleeper.kill()
                sleeper.wait(timeout=10)
            assert client.run(["/bin/true"]).returncode == 0
        assert client.protocol_version == _wire.PROTOCOL_VERSION
        mine = [peer for peer in status["peers"] if peer["uid"] == os.geteuid()]
        assert len(mine) == 1, status["peers"]
        assert mine[0]["connections"] >= 1
        assert mine[0]["children"] >= 1
        assert mine[0]["children_limit"] >= mine[0]["children"]
        assert mine[0]["connections_limit"] >= mine[0]["connections"]
    finally:
        daemon.stop()


def test_real_daemon_confines_the_child(tmp_path: Path) -> None:
    """Children in sandboxes of the real daemon: an empty network
    namespace shows only loopback, the default seccomp profile refuses
    unshare, and Popen.sandbox says what confined the child."""
    daemon = Daemon(tmp_path)
    try:
        with zygote.Client(daemon.socket) as client:
            if "sandbox" not in client.features:
                pytest.skip("this daemon does not offer sandbox (it needs root or user namespaces)")
            listing = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
            with client.Popen(
                ["/bin/sh", "-c", listing],
                stdout=subprocess.PIPE,
                sandbox=zygote.Sandbox(network="none"),
            ) as child:
                out, _ = child.communicate(timeout=30)
            assert out == b"lo\n"
            assert child.sandbox is not None and "net" in child.sandbox.namespaces
            assert client.run(["unshare", "--ipc", "true"]).returncode == 0
            with client.Popen(
                ["unshare", "--ipc", "true"],
                stderr=subprocess.DEVNULL,
                sandbox=zygote.Sandbox(seccomp="default"),
            ) as child:
                assert child.wait(timeout=30) != 0
            assert child.sandbox is not None and child.sandbox.seccomp == "default"
    finally:
        daemon.stop()


def test_version_2_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real daemon spoken to in version 2, as a daemon that knows no
    newer version answers: spawns and status work without the new fields,
    and a sandbox is refused before it is sent."""
    monkeypatch.setattr(_conn, "HELLO_VERSION", 2)
    daemon = Daemon(tmp_path)
    try:
        with zygote.Client(daemon.socket) as client:
            assert client.protocol_version == 2
            assert client.run(["echo", "two"], capture_output=True).stdout == b"two\n"
            status = client.status()
            assert status["spawns_succeeded"] >= 1
            assert status["peers"] == [] and status["spawners"] == []
            with pytest.raises(OSError) as raised:
                client.run(["/bin/true"], sandbox=zygote.Sandbox(isolate=True))
            assert raised.value.errno == errno.EOPNOTSUPP
            assert "protocol version 2" in str(raised.value)
            assert client.run(["/bin/true"]).returncode == 0
    finally:
        daemon.stop()


def test_installed_popen_never_drops_a_sandbox() -> None:
    """A call the installed drop-in would hand to the stdlib (here for its
    preexec_fn) is refused when it asks for a sandbox: the stdlib cannot
    apply one."""
    import subprocess

    zygote.install()
    try:
        with pytest.raises(zygote.ZygoteError) as raised:
            subprocess.Popen(["/bin/true"], preexec_fn=lambda: None, sandbox=zygote.Sandbox())  # type: ignore[call-overload]
        assert raised.value.errno == errno.EOPNOTSUPP
        assert "cannot apply its sandbox" in str(raised.value)
        assert "preexec_fn" in str(raised.value)
    finally:
        zygote.uninstall()
