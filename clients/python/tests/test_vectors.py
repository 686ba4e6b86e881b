"""The shared test vectors (proto/vectors/frames.json): every frame decodes
to its message and the message re-encodes to exactly the frame."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
from conftest import REPO

from zygote import _wire

# This package speaks protocol 2: the frames of version 2, frozen.
VECTORS = REPO / "proto" / "vectors" / "v2" / "frames.json"


def load() -> List[Dict[str, Any]]:
    if not VECTORS.exists():
        pytest.fail(f"the shared vectors file {VECTORS} is missing")
    data = json.loads(VECTORS.read_text())
    assert data["protocol_version"] == _wire.PROTOCOL_VERSION
    vectors: List[Dict[str, Any]] = data["vectors"]
    return vectors


def schema(vector: Dict[str, Any]) -> _wire.Schema:
    return _wire.CLIENT_MESSAGE if vector["direction"] == "client" else _wire.SERVER_MESSAGE


@pytest.mark.parametrize("vector", load(), ids=lambda vector: vector["name"])
def test_vector_round_trips(vector: Dict[str, Any]) -> None:
    frame = bytes.fromhex(vector["hex"])
    decoded = _wire.decode(schema(vector), frame)
    assert _wire.to_json(decoded) == vector["message"]
    assert _wire.encode(schema(vector), vector["message"]).hex() == vector["hex"]
    # The decoded form (bytes, not lists of ints) encodes the same.
    assert _wire.encode(schema(vector), decoded) == frame
    if "Spawn" in vector["message"]:
        # The hand-written spawn encoder the client uses, too.
        assert _wire.encode_spawn(vector["message"]["Spawn"]) == frame
        assert _wire.encode_spawn(decoded["Spawn"]) == frame


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
