"""The shared test vectors (proto/vectors/frames.json): every frame decodes
to its message and the message re-encodes to exactly the frame."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from conftest import REPO

from zygote import _wire

VECTORS = REPO / "proto" / "vectors" / "frames.json"


def load(path: Path = VECTORS, version: int = _wire.PROTOCOL_VERSION) -> List[Dict[str, Any]]:
    if not path.exists():
        pytest.fail(f"the shared vectors file {path} is missing")
    data = json.loads(path.read_text())
    assert data["protocol_version"] == version
    vectors: List[Dict[str, Any]] = data["vectors"]
    return vectors


def schema(vector: Dict[str, Any], version: int = _wire.PROTOCOL_VERSION) -> _wire.Schema:
    if vector["direction"] == "client":
        return _wire.client_schema(version)
    return _wire.server_schema(version)


def check_round_trip(vector: Dict[str, Any], version: int) -> None:
    frame = bytes.fromhex(vector["hex"])
    decoded = _wire.decode(schema(vector, version), frame)
    assert _wire.to_json(decoded) == vector["message"]
    assert _wire.encode(schema(vector, version), vector["message"]).hex() == vector["hex"]
    # The decoded form (bytes, not lists of ints) encodes the same.
    assert _wire.encode(schema(vector, version), decoded) == frame
    if "Spawn" in vector["message"]:
        # The hand-written spawn encoder the client uses, too.
        assert _wire.encode_spawn(vector["message"]["Spawn"], version) == frame
        assert _wire.encode_spawn(decoded["Spawn"], version) == frame
    if "SpawnFromTemplate" in vector["message"]:
        outer = decoded["SpawnFromTemplate"]
        assert _wire.encode_template_spawn(outer["template"], outer["spawn"], version) == frame


@pytest.mark.parametrize("vector", load(), ids=lambda vector: vector["name"])
def test_vector_round_trips(vector: Dict[str, Any]) -> None:
    check_round_trip(vector, _wire.PROTOCOL_VERSION)


def older_vectors() -> List[Tuple[int, Dict[str, Any]]]:
    """The frozen frames of every older version, proto/vectors/vN/."""
    found = []
    for version in range(_wire.OLDEST_PROTOCOL_VERSION, _wire.PROTOCOL_VERSION):
        path = REPO / "proto" / "vectors" / f"v{version}" / "frames.json"
        found += [(version, vector) for vector in load(path, version)]
    return found


@pytest.mark.parametrize(
    "version, vector",
    older_vectors(),
    ids=lambda item: str(item) if isinstance(item, int) else item["name"],
)
def test_older_version_vector_round_trips(version: int, vector: Dict[str, Any]) -> None:
    """A connection of an older version decodes and encodes that version's
    frames byte for byte."""
    check_round_trip(vector, version)


def test_the_file_covers_every_variant() -> None:
    seen = set()
    for vector in load():
        message = vector["message"]
        seen.add(
            (vector["direction"], next(iter(message)) if isinstance(message, dict) else message)
        )
    for direction, enum in (("client", _wire.CLIENT_MESSAGE), ("server", _wire.SERVER_MESSAGE)):
        for name, _ in enum[1]:
            assert (direction, name) in seen, f"no vector for {direction} {name}"


@pytest.mark.parametrize(
    "hex_frame, problem",
    [
        ("0408ff", "left after"),  # SignalSent with a trailing byte
        ("04", "ends early"),
        ("0c", "out of range"),  # no ServerMessage variant 12
        ("0107a4", "ends early"),  # varint cut short
        ("04ffffffffffffffffff02", "out of range"),  # id over u64
        ("0307000000000002", "bool"),  # timed_out = 2
        ("05010402fffe", "UTF-8"),  # RequestFailed message not UTF-8
    ],
)
def test_bad_frames_are_refused(hex_frame: str, problem: str) -> None:
    with pytest.raises(_wire.DecodeError, match=problem):
        _wire.decode_server(bytes.fromhex(hex_frame))


def test_encoder_refuses_out_of_range_values() -> None:
    with pytest.raises(ValueError):
        _wire.encode_client({"Status": {"id": 1 << 64}})
    with pytest.raises(ValueError):
        _wire.encode_client({"Signal": {"id": 1, "spawn_id": 2, "signal": 1 << 31}})
    with pytest.raises(TypeError):
        _wire.encode_client({"Status": {"id": "1"}})


def a_spawn() -> Dict[str, Any]:
    """A spawn request from the vectors, decoded."""
    vector = next(v for v in load() if "Spawn" in v["message"])
    body: Dict[str, Any] = _wire.decode(_wire.CLIENT_MESSAGE, bytes.fromhex(vector["hex"]))["Spawn"]
    return body


def test_version_3_has_no_template_messages() -> None:
    """A version-3 connection neither decodes the version-4 replies nor
    encodes the template requests (the daemon would end it)."""
    ready = _wire.encode_client({"ListTemplates": {"id": 1}})
    assert ready == bytes([7, 1])
    with pytest.raises(ValueError, match="no variant"):
        _wire.encode_client({"ListTemplates": {"id": 1}}, 3)
    frame = _wire.encode(_wire.SERVER_MESSAGE, {"Templates": {"id": 1, "templates": []}})
    assert _wire.decode_server(frame) == {"Templates": {"id": 1, "templates": []}}
    with pytest.raises(_wire.DecodeError, match="out of range"):
        _wire.decode_server(frame, 3)
    failed = {"SpawnFailed": {"id": 1, "stage": "Template", "errno": 71, "message": ""}}
    frame = _wire.encode(_wire.SERVER_MESSAGE, failed)
    with pytest.raises(_wire.DecodeError, match="out of range"):
        _wire.decode_server(frame, 3)
    body = a_spawn()
    with pytest.raises(ValueError, match="version 4"):
        _wire.encode_template_spawn(1, body, 3)


def test_template_spawn_encoders_agree() -> None:
    """The hand-written template spawn encoder gives the generic encoder's
    bytes: the handle, then the spawn request."""
    body = a_spawn()
    body["program"] = b""
    for handle in (0, 1, 300, (1 << 64) - 1):
        generic = _wire.encode_client({"SpawnFromTemplate": {"template": handle, "spawn": body}})
        assert _wire.encode_template_spawn(handle, body) == generic
    with pytest.raises(ValueError):
        _wire.encode_template_spawn(1 << 64, body)


def test_bytes_fields_refuse_other_types() -> None:
    """An int or a str in a bytes field is refused, never encoded as zero
    bytes or in some encoding."""
    for bad in (3, "python"):
        message = {
            "Template": {
                "id": 1,
                "kind": "python",
                "interpreter": bad,
                "preload": [],
                "env": [],
                "cwd": None,
            }
        }
        with pytest.raises(TypeError, match="bytes must be"):
            _wire.encode_client(message)
