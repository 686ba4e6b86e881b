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
        ("0a", "out of range"),  # no ServerMessage variant 10
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
