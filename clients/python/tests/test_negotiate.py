"""Version negotiation: the client sends its newest protocol version, reads
the HelloAck in the layout of the version the daemon picked, and learns the
daemon's optional features."""

from __future__ import annotations

import errno
import socket
import threading
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import Daemon

import zygote
from zygote import _wire
from zygote._conn import CLIENT_NAME

LIMITS = {"max_frame_bytes": 262144, "max_fds_per_frame": 64}


def ack_in(version: int, features: List[str]) -> bytes:
    body = {"protocol_version": version, "server_version": "test", "limits": LIMITS}
    if version >= _wire.FEATURES_SINCE:
        body["features"] = features
    return _wire.encode(_wire.SERVER_MESSAGE, {"HelloAck": body})


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[List[object]]:
    """A listening socket at tmp_path/peer.sock that answers each Hello with
    the frame set in ``script[0]``, recording the Hellos it got."""
    path = str(tmp_path / "peer.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen()
    listener.settimeout(20)
    script: List[object] = [b"", path]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(20)
                hello = _wire.decode(_wire.CLIENT_MESSAGE, conn.recv(65536))
                script.append(hello)
                answer = script[0]
                assert isinstance(answer, bytes)
                conn.send(answer)
                conn.recv(1)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield script
    listener.close()


def test_version_2_ack_gives_features(scripted: List[object]) -> None:
    scripted[0] = ack_in(2, ["pty", "teleport"])
    with zygote.Client(str(scripted[1])) as client:
        assert client.protocol_version == 2
        assert client.features == ("pty", "teleport")
    assert scripted[2] == {
        "Hello": {"protocol_version": _wire.PROTOCOL_VERSION, "client": CLIENT_NAME}
    }


def test_version_1_ack_has_no_features(scripted: List[object]) -> None:
    scripted[0] = ack_in(1, [])
    with zygote.Client(str(scripted[1])) as client:
        assert client.protocol_version == 1
        assert client.features == ()


def test_version_not_offered_is_refused(scripted: List[object]) -> None:
    scripted[0] = ack_in(_wire.PROTOCOL_VERSION + 1, [])
    with pytest.raises(zygote.ZygoteError) as raised:
        zygote.Client(str(scripted[1]))
    assert raised.value.errno == errno.EPROTO
    assert f"protocol version {_wire.PROTOCOL_VERSION + 1}" in str(raised.value)


def test_daemon_with_fewer_features(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real daemon that withholds cgroups, pty, sandbox and templates: the
    client speaks the newest version, sees the features offered, still
    spawns, and a cgroup request is refused naming the feature."""
    monkeypatch.setenv("ZYGOTE_MASK_FEATURES", "cgroups,pty,sandbox,templates")
    daemon = Daemon(tmp_path)
    try:
        with zygote.Client(daemon.socket) as client:
            assert client.protocol_version == _wire.PROTOCOL_VERSION
            assert "large_args" in client.features
            for withheld in ("cgroups", "pty", "sandbox", "templates"):
                assert withheld not in client.features
            assert client.run(["true"]).returncode == 0
            with pytest.raises(OSError) as raised:
                client.run(["true"], cgroup=zygote.Cgroup(kill_tree=True))
            assert raised.value.errno == errno.EOPNOTSUPP
            assert "feature cgroups" in raised.value.zygote_message  # type: ignore[attr-defined]
            assert client.run(["true"]).returncode == 0
    finally:
        daemon.stop()


def test_version_3_daemon_refuses_templates_locally(scripted: List[object]) -> None:
    """A daemon of version 3 cannot take a template request (it would end
    the connection): refused before anything is sent, naming the feature
    and the version, even if its ack listed the name."""
    scripted[0] = ack_in(3, ["sandbox", "templates"])
    with zygote.Client(str(scripted[1])) as client:
        with pytest.raises(OSError) as raised:
            client.python_template(preload=["json"])
        assert raised.value.errno == errno.EOPNOTSUPP
        assert "feature templates" in str(raised.value)
        assert "protocol version 3; templates need 4" in str(raised.value)
        with pytest.raises(OSError, match="feature templates"):
            client.templates()
        assert client.alive
