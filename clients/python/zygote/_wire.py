"""The wire format of proto/PROTOCOL.md: postcard encoding of the client and
server messages, driven by a schema.

A message is a value in serde_json's externally tagged form (the shape of the
shared test vectors): an enum variant with contents is ``{"Variant":
contents}``, a unit variant is the string ``"Variant"``, a struct is a dict
keyed by field name, an option is ``None`` or the value, a list is a list.
``bytes`` fields decode to :class:`bytes`; the encoder also takes a list of
ints for them. Integers are Python ints.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Tuple, Union

#: The newest protocol version this package speaks, sent in ``Hello``; the
#: daemon answers in the newest version both know.
PROTOCOL_VERSION = 4
#: The oldest version this package reads a ``HelloAck`` in.
OLDEST_PROTOCOL_VERSION = 1
#: The first version whose ``HelloAck`` lists the daemon's features.
FEATURES_SINCE = 2
#: The first version with ``SpawnRequest.sandbox``, ``Spawned.sandbox``,
#: ``SpawnStage::Sandbox`` and ``StatusReply``'s ``peers`` and ``spawners``;
#: an older connection uses the layouts without them.
SANDBOX_SINCE = 3
#: The first version with warm templates: ``ClientMessage``'s ``Template``,
#: ``SpawnFromTemplate`` and ``ListTemplates``, ``ServerMessage``'s
#: ``TemplateReady`` and ``Templates``, and ``SpawnStage::Template``. It only
#: appends variants: every other layout is version 3's.
TEMPLATES_SINCE = 4
#: The limits of PROTOCOL.md section 1, used until ``HelloAck`` gives the
#: daemon's own.
MAX_FRAME_BYTES = 262144
MAX_FDS_PER_FRAME = 64

# A schema is a primitive name, or a tuple: ("option", T), ("list", T),
# ("struct", ((name, T), ...)), ("enum", ((name, T or None), ...)).
Schema = Union[str, Tuple[Any, ...]]


class DecodeError(ValueError):
    """A frame that does not decode as PROTOCOL.md section 3 says."""


def _struct(*fields: Tuple[str, Schema]) -> Schema:
    return ("struct", fields)


def _enum(*variants: Tuple[str, Optional[Schema]]) -> Schema:
    return ("enum", variants)


def _opt(inner: Schema) -> Schema:
    return ("option", inner)


def _list(inner: Schema) -> Schema:
    return ("list", inner)


def _by_version(
    fields: Tuple[Tuple[str, Schema], ...], since: int, *extra: Tuple[str, Schema]
) -> Schema:
    """A struct whose layout follows its ``protocol_version`` field: the
    ``extra`` fields follow ``fields`` from version ``since`` on."""
    return ("by_version", fields, since, extra)


_STDIO = _enum(("Null", None), ("Pipe", None), ("Fd", "u32"))
_SANDBOX = _struct(
    ("profile", _opt("string")),
    (
        "filesystem",
        _opt(
            _struct(
                (
                    "mounts",
                    _list(
                        _struct(
                            (
                                "kind",
                                _enum(("ReadOnlyBind", None), ("Bind", None), ("Tmpfs", None)),
                            ),
                            ("source", "bytes"),
                            ("destination", "bytes"),
                        )
                    ),
                ),
            )
        ),
    ),
    ("network", _enum(("Host", None), ("None", None))),
    ("isolate", "bool"),
    ("hostname", _opt("string")),
    ("seccomp", _opt(_enum(("Profile", "string"), ("Filter", "string")))),
    (
        "landlock",
        _opt(
            _struct(
                ("read_only", _list("bytes")),
                ("read_execute", _list("bytes")),
                ("read_write", _list("bytes")),
                ("tcp_bind", _list("u16")),
                ("tcp_connect", _list("u16")),
                ("require", "bool"),
            )
        ),
    ),
)
_SPAWN_V2 = _struct(
    ("id", "u64"),
    ("program", "bytes"),
    ("argv0", _opt("bytes")),
    ("args", _list("bytes")),
    ("env", _list(_struct(("key", "bytes"), ("value", "bytes")))),
    ("cwd", _opt("bytes")),
    ("stdin", _STDIO),
    ("stdout", _STDIO),
    ("stderr", _STDIO),
    ("fd_mappings", _list(_struct(("attached_index", "u32"), ("child_fd", "i32")))),
    ("new_session", "bool"),
    ("process_group", _opt("i32")),
    ("umask", _opt("u32")),
    ("rlimits", _list(_struct(("resource", "u32"), ("soft", "u64"), ("hard", "u64")))),
    ("user", _opt(_struct(("uid", "u32"), ("gid", "u32"), ("groups", _list("u32"))))),
    ("kill_on_close", _opt(_struct(("signal", "i32"), ("process_group", "bool")))),
    ("timeout", _opt(_struct(("millis", "u64"), ("grace_millis", "u64")))),
    ("pty", _opt(_struct(("window", _struct(("rows", "u16"), ("cols", "u16")))))),
    ("report_stops", "bool"),
    (
        "cgroup",
        _opt(
            _struct(
                ("kill_tree", "bool"),
                ("wait_tree", "bool"),
                ("memory_max", _opt("u64")),
                ("memory_swap_max", _opt("u64")),
                ("pids_max", _opt("u64")),
                ("cpu_max", _opt(_struct(("quota_micros", "u64"), ("period_micros", "u64")))),
                ("cpu_weight", _opt("u32")),
                ("io_weight", _opt("u32")),
            )
        ),
    ),
    ("ignored_signals", "u64"),
    ("nice", _opt("i32")),
    ("cpu_affinity", _list("u32")),
    ("oom_score_adj", _opt("i32")),
    ("large_args", _opt("u32")),
    # Spawned only for a child still running 10 to 20 ms after exec.
    ("defer_spawned", "bool"),
)
_SPAWN = _struct(*_SPAWN_V2[1], ("sandbox", _opt(_SANDBOX)))


_ENV = _list(_struct(("key", "bytes"), ("value", "bytes")))
_TEMPLATE_REQUEST = _struct(
    ("id", "u64"),
    ("kind", "string"),
    ("interpreter", "bytes"),
    ("preload", _list("string")),
    ("env", _ENV),
    ("cwd", _opt("bytes")),
)


def _client_message(spawn: Schema, templates: bool) -> Schema:
    variants: Tuple[Tuple[str, Optional[Schema]], ...] = (
        ("Hello", _struct(("protocol_version", "u32"), ("client", "string"))),
        ("Spawn", spawn),
        ("Signal", _struct(("id", "u64"), ("spawn_id", "u64"), ("signal", "i32"))),
        ("Status", _struct(("id", "u64"))),
        # `zygote upgrade`: a live upgrade in place (PROTOCOL.md §5.12).
        ("Upgrade", _struct(("id", "u64"))),
    )
    if templates:
        variants += (
            ("Template", _TEMPLATE_REQUEST),
            ("SpawnFromTemplate", _struct(("template", "u64"), ("spawn", spawn))),
            ("ListTemplates", _struct(("id", "u64"))),
        )
    return _enum(*variants)


#: ``ClientMessage`` in the newest layout, in that of version 3 (without
#: the template requests), and in that of versions 1 and 2.
CLIENT_MESSAGE: Schema = _client_message(_SPAWN, templates=True)
CLIENT_MESSAGE_V3: Schema = _client_message(_SPAWN, templates=False)
CLIENT_MESSAGE_V2: Schema = _client_message(_SPAWN_V2, templates=False)

SPAWN_STAGES = (
    "Validate",
    "Pipe",
    "Clone",
    "Signals",
    "Setsid",
    "Setpgid",
    "Setrlimit",
    "Chdir",
    "Dup",
    "CloseFds",
    "Exec",
    "Admission",
    "Setgroups",
    "Setgid",
    "Setuid",
    "Cgroup",
    "Nice",
    "Affinity",
    "OomScoreAdj",
    "Sandbox",
    "Template",
)

_APPLIED_SANDBOX = _struct(
    ("profile", _opt("string")),
    ("namespaces", _list("string")),
    ("seccomp", _opt("string")),
    ("landlock_abi", _opt("u32")),
    ("landlock_complete", "bool"),
)
_STATUS_V2 = (
    ("id", "u64"),
    ("server_version", "string"),
    ("pid", "i32"),
    ("uptime_millis", "u64"),
    ("connections_open", "u64"),
    ("connections_accepted", "u64"),
    ("children_running", "u64"),
    ("spawns_succeeded", "u64"),
    ("spawns_failed", "u64"),
)
_STATUS_V3 = (
    *_STATUS_V2,
    (
        "peers",
        _list(
            _struct(
                ("uid", "u32"),
                ("connections", "u64"),
                ("children", "u64"),
                ("children_limit", "u64"),
                ("connections_limit", "u64"),
                ("sandbox_profile", _opt("string")),
            )
        ),
    ),
    (
        "spawners",
        _list(_struct(("uid", "u32"), ("pid", "i32"), ("spawns", "u64"), ("restarts", "u64"))),
    ),
)


_HELLO_ACK = _by_version(
    (
        ("protocol_version", "u32"),
        ("server_version", "string"),
        ("limits", _struct(("max_frame_bytes", "u32"), ("max_fds_per_frame", "u32"))),
    ),
    FEATURES_SINCE,
    ("features", _list("string")),
)
_EXITED = _struct(
    ("id", "u64"),
    (
        "status",
        _enum(
            ("Exited", "i32"),
            ("Signaled", _struct(("signal", "i32"), ("core_dumped", "bool"))),
        ),
    ),
    (
        "usage",
        _struct(("user_micros", "u64"), ("system_micros", "u64"), ("max_rss_kib", "u64")),
    ),
    ("timed_out", "bool"),
    (
        "tree",
        _opt(
            _struct(
                ("user_micros", "u64"),
                ("system_micros", "u64"),
                ("memory_peak_bytes", _opt("u64")),
                ("oom_kills", "u64"),
                ("memory_max", _opt("u64")),
            )
        ),
    ),
    ("pid", "i32"),
)
_PROTOCOL_ERROR = _struct(
    (
        "kind",
        _enum(
            ("Malformed", None),
            ("TooLarge", None),
            ("UnsupportedVersion", None),
            ("UnexpectedMessage", None),
            ("UnexpectedFds", None),
            ("PermissionDenied", None),
            ("Busy", None),
        ),
    ),
    ("message", "string"),
)


_TEMPLATE_INFO = _struct(
    ("template", "u64"),
    ("uid", "u32"),
    ("pid", "i32"),
    ("kind", "string"),
    ("interpreter", "bytes"),
    ("preload", _list("string")),
    ("forks", "u64"),
    ("restarts", "u64"),
    ("age_millis", "u64"),
    ("rss_bytes", "u64"),
)
_TEMPLATE_REPLIES = (
    (
        "TemplateReady",
        _struct(("id", "u64"), ("template", "u64"), ("pid", "i32"), ("reused", "bool")),
    ),
    ("Templates", _struct(("id", "u64"), ("templates", _list(_TEMPLATE_INFO)))),
)


def _server_message(version: int) -> Schema:
    new = version >= SANDBOX_SINCE
    templates = version >= TEMPLATES_SINCE
    spawned: Tuple[Tuple[str, Schema], ...] = (("id", "u64"), ("pid", "i32"))
    if new:
        spawned += (("sandbox", _opt(_APPLIED_SANDBOX)),)
    # Version 3 ends its stages at Sandbox, 1 and 2 at OomScoreAdj.
    stages = SPAWN_STAGES if templates else SPAWN_STAGES[:-1] if new else SPAWN_STAGES[:-2]
    return _enum(
        ("HelloAck", _HELLO_ACK),
        ("Spawned", _struct(*spawned)),
        (
            "SpawnFailed",
            _struct(
                ("id", "u64"),
                ("stage", _enum(*((name, None) for name in stages))),
                ("errno", "i32"),
                ("message", "string"),
            ),
        ),
        ("Exited", _EXITED),
        ("SignalSent", _struct(("id", "u64"))),
        ("RequestFailed", _struct(("id", "u64"), ("errno", "i32"), ("message", "string"))),
        ("ProtocolError", _PROTOCOL_ERROR),
        ("Status", _struct(*(_STATUS_V3 if new else _STATUS_V2))),
        ("Stopped", _struct(("id", "u64"), ("signal", "i32"))),
        ("Continued", _struct(("id", "u64"))),
        *(_TEMPLATE_REPLIES if templates else ()),
    )


#: ``ServerMessage`` in the newest layout, in that of version 3, and in
#: that of versions 1 and 2 (whose ``HelloAck`` follows its own version
#: field).
SERVER_MESSAGE: Schema = _server_message(PROTOCOL_VERSION)
SERVER_MESSAGE_V3: Schema = _server_message(3)
SERVER_MESSAGE_V2: Schema = _server_message(2)


def client_schema(version: int) -> Schema:
    """``ClientMessage`` in the layout of protocol ``version``."""
    if version >= TEMPLATES_SINCE:
        return CLIENT_MESSAGE
    return CLIENT_MESSAGE_V3 if version >= SANDBOX_SINCE else CLIENT_MESSAGE_V2


def server_schema(version: int) -> Schema:
    """``ServerMessage`` in the layout of protocol ``version``."""
    if version >= TEMPLATES_SINCE:
        return SERVER_MESSAGE
    return SERVER_MESSAGE_V3 if version >= SANDBOX_SINCE else SERVER_MESSAGE_V2


_UINT_BITS = {"u16": 16, "u32": 32, "u64": 64}


def _varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _encode(out: bytearray, schema: Schema, value: Any) -> None:
    if isinstance(schema, str):
        if schema in _UINT_BITS:
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{schema} must be an int, not {value!r}")
            if not 0 <= value < 1 << _UINT_BITS[schema]:
                raise ValueError(f"{value} is out of range for {schema}")
            _varint(out, value)
        elif schema == "i32":
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"i32 must be an int, not {value!r}")
            if not -(1 << 31) <= value < 1 << 31:
                raise ValueError(f"{value} is out of range for i32")
            _varint(out, ((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)
        elif schema == "bool":
            if not isinstance(value, bool):
                raise TypeError(f"bool must be a bool, not {value!r}")
            out.append(1 if value else 0)
        elif schema == "bytes":
            if not isinstance(value, (bytes, bytearray, list)):
                # bytes(3) would be three zero bytes, bytes("x") a TypeError
                # without the field's name.
                raise TypeError(f"bytes must be bytes or a list of ints, not {value!r}")
            data = bytes(value)
            _varint(out, len(data))
            out += data
        elif schema == "string":
            if not isinstance(value, str):
                raise TypeError(f"string must be a str, not {value!r}")
            data = value.encode("utf-8")
            _varint(out, len(data))
            out += data
        else:  # pragma: no cover - the schemas above are fixed
            raise AssertionError(schema)
        return
    kind = schema[0]
    if kind == "option":
        if value is None:
            out.append(0)
        else:
            out.append(1)
            _encode(out, schema[1], value)
    elif kind == "list":
        _varint(out, len(value))
        for item in value:
            _encode(out, schema[1], item)
    elif kind == "struct":
        for name, field in schema[1]:
            _encode(out, field, value[name])
    elif kind == "by_version":
        _, fields, since, extra = schema
        for name, field in fields + (extra if value["protocol_version"] >= since else ()):
            _encode(out, field, value[name])
    else:
        if isinstance(value, str):
            name, contents = value, None
        elif isinstance(value, dict) and len(value) == 1:
            ((name, contents),) = value.items()
        else:
            raise TypeError(f"an enum value is a str or a one-key dict, not {value!r}")
        for index, (variant, inner) in enumerate(schema[1]):
            if variant == name:
                if (inner is None) != isinstance(value, str):
                    raise TypeError(f"variant {name} given the wrong shape: {value!r}")
                _varint(out, index)
                if inner is not None:
                    _encode(out, inner, contents)
                return
        raise ValueError(f"no variant {name!r}")


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise DecodeError("frame ends early")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self, bits: int) -> int:
        result = 0
        shift = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift >= bits + 7:
                raise DecodeError(f"varint longer than a u{bits}")
        if result >> bits:
            raise DecodeError(f"varint out of range for u{bits}")
        return result

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise DecodeError("frame ends early")
        value = self.data[self.pos : self.pos + n]
        self.pos += n
        return value


def _decode(reader: _Reader, schema: Schema) -> Any:
    if isinstance(schema, str):
        if schema in _UINT_BITS:
            return reader.varint(_UINT_BITS[schema])
        if schema == "i32":
            n = reader.varint(32)
            return (n >> 1) ^ -(n & 1)
        if schema == "bool":
            byte = reader.byte()
            if byte > 1:
                raise DecodeError(f"bool byte {byte:#04x}")
            return byte == 1
        if schema == "bytes":
            return bytes(reader.take(reader.varint(64)))
        if schema == "string":
            try:
                return reader.take(reader.varint(64)).decode("utf-8")
            except UnicodeDecodeError as error:
                raise DecodeError(f"string is not UTF-8: {error}") from None
        raise AssertionError(schema)  # pragma: no cover
    kind = schema[0]
    if kind == "option":
        tag = reader.byte()
        if tag > 1:
            raise DecodeError(f"option tag {tag:#04x}")
        return _decode(reader, schema[1]) if tag else None
    if kind == "list":
        count = reader.varint(64)
        if count > len(reader.data) - reader.pos:
            raise DecodeError("list longer than the frame")
        return [_decode(reader, schema[1]) for _ in range(count)]
    if kind == "struct":
        return {name: _decode(reader, field) for name, field in schema[1]}
    if kind == "by_version":
        _, fields, since, extra = schema
        value = {name: _decode(reader, field) for name, field in fields}
        if value["protocol_version"] >= since:
            value.update((name, _decode(reader, field)) for name, field in extra)
        return value
    index = reader.varint(32)
    variants = schema[1]
    if index >= len(variants):
        raise DecodeError(f"enum variant {index} out of range")
    name, inner = variants[index]
    if inner is None:
        return name
    return {name: _decode(reader, inner)}


def _uvar(n: int, bits: int = 64) -> bytes:
    """An unsigned varint of a value that must fit ``bits`` bits: a value
    out of range raises instead of becoming a frame the daemon rejects."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    if n < 0 or n >> bits:
        raise ValueError(f"{n} is out of range for u{bits}")
    return _uvar_large(n)


def _u32(n: int) -> bytes:
    return _uvar(n, 32)


@functools.lru_cache(maxsize=1024)
def _uvar_large(n: int) -> bytes:
    # Mostly resource limits (u64::MAX is 10 bytes) and ids.
    out = bytearray()
    _varint(out, n)
    return bytes(out)


_SMALL = [bytes((n,)) for n in range(0x80)]


def _zig(n: int) -> bytes:
    if not -(1 << 31) <= n < 1 << 31:
        raise ValueError(f"{n} is out of range for i32")
    return _uvar(((n << 1) ^ (n >> 31)) & 0xFFFFFFFF)


def _stdio(spec: Any) -> bytes:
    if spec == "Null":
        return b"\x00"
    if spec == "Pipe":
        return b"\x01"
    return b"\x02" + _u32(spec["Fd"])


def encode_spawn(body: Dict[str, Any], version: int = PROTOCOL_VERSION) -> bytes:
    """``ClientMessage::Spawn`` by hand: the generic encoder walks the
    schema for every environment byte string, which showed in the
    per-spawn cost. The vectors test checks both give the same bytes.
    A value out of its field's range raises :class:`ValueError` (the
    caller checks them first, with the stdlib's exceptions); no input
    gives a frame the daemon cannot decode. ``version`` is the
    connection's: before version 3 the request has no ``sandbox``, and one
    that asks for a sandbox raises :class:`ValueError` rather than lose it."""
    return b"\x01" + _spawn_body(body, version)


def encode_template_spawn(
    template: int, body: Dict[str, Any], version: int = PROTOCOL_VERSION
) -> bytes:
    """``ClientMessage::SpawnFromTemplate``: the template's handle, then
    the spawn request as :func:`encode_spawn` encodes it. Refused
    (:class:`ValueError`) on a connection older than version 4."""
    if version < TEMPLATES_SINCE:
        raise ValueError(
            f"a template spawn needs protocol version {TEMPLATES_SINCE}; "
            f"the connection speaks {version}"
        )
    return b"\x06" + _uvar(template) + _spawn_body(body, version)


def _spawn_body(body: Dict[str, Any], version: int) -> bytes:
    """A ``SpawnRequest`` (without the message's variant index)."""
    parts: List[bytes] = [_uvar(body["id"])]
    add = parts.append
    program = bytes(body["program"])
    add(_uvar(len(program)))
    add(program)
    argv0 = body["argv0"]
    if argv0 is None:
        add(b"\x00")
    else:
        argv0 = bytes(argv0)
        add(b"\x01" + _uvar(len(argv0)))
        add(argv0)
    args = body["args"]
    add(_uvar(len(args)))
    for arg in args:
        arg = bytes(arg)
        add(_uvar(len(arg)))
        add(arg)
    env = body["env"]
    wire = getattr(env, "wire", None)
    if isinstance(wire, bytes):
        add(wire)
    else:
        add(encode_env(env))
    cwd = body["cwd"]
    if cwd is None:
        add(b"\x00")
    else:
        cwd = bytes(cwd)
        add(b"\x01" + _uvar(len(cwd)))
        add(cwd)
    add(_stdio(body["stdin"]))
    add(_stdio(body["stdout"]))
    add(_stdio(body["stderr"]))
    mappings = body["fd_mappings"]
    add(_uvar(len(mappings)))
    for mapping in mappings:
        add(_u32(mapping["attached_index"]) + _zig(mapping["child_fd"]))
    add(b"\x01" if body["new_session"] else b"\x00")
    group = body["process_group"]
    add(b"\x00" if group is None else b"\x01" + _zig(group))
    umask = body["umask"]
    add(b"\x00" if umask is None else b"\x01" + _u32(umask))
    limits = body["rlimits"]
    add(_uvar(len(limits)))
    for limit in limits:
        add(_u32(limit["resource"]) + _uvar(limit["soft"]) + _uvar(limit["hard"]))
    user = body["user"]
    if user is None:
        add(b"\x00")
    else:
        add(b"\x01" + _u32(user["uid"]) + _u32(user["gid"]) + _uvar(len(user["groups"])))
        parts.extend(_u32(gid) for gid in user["groups"])
    kill = body["kill_on_close"]
    if kill is None:
        add(b"\x00")
    else:
        add(b"\x01" + _zig(kill["signal"]) + (b"\x01" if kill["process_group"] else b"\x00"))
    timeout = body["timeout"]
    if timeout is None:
        add(b"\x00")
    else:
        add(b"\x01" + _uvar(timeout["millis"]) + _uvar(timeout["grace_millis"]))
    pty = body.get("pty")
    if pty is None:
        add(b"\x00")
    else:
        add(b"\x01" + _uvar(pty["window"]["rows"], 16) + _uvar(pty["window"]["cols"], 16))
    add(b"\x01" if body.get("report_stops") else b"\x00")
    cgroup = body.get("cgroup")
    if cgroup is None:
        add(b"\x00")
    else:
        add(_encode_cgroup(cgroup))
    add(_uvar(body.get("ignored_signals", 0)))
    nice = body.get("nice")
    add(b"\x00" if nice is None else b"\x01" + _zig(nice))
    cpus = body.get("cpu_affinity", [])
    add(_uvar(len(cpus)))
    parts.extend(_u32(cpu) for cpu in cpus)
    adj = body.get("oom_score_adj")
    add(b"\x00" if adj is None else b"\x01" + _zig(adj))
    large = body.get("large_args")
    add(b"\x00" if large is None else b"\x01" + _u32(large))
    add(b"\x01" if body.get("defer_spawned") else b"\x00")
    sandbox = body.get("sandbox")
    if version >= SANDBOX_SINCE:
        out = bytearray()
        _encode(out, _opt(_SANDBOX), sandbox)
        add(bytes(out))
    elif sandbox is not None:
        raise ValueError(
            f"a sandbox needs protocol version {SANDBOX_SINCE}; the connection speaks {version}"
        )
    return b"".join(parts)


def encode_env(env: List[Dict[str, Any]]) -> bytes:
    """A request's ``env`` field: its length, then each key and value."""
    parts: List[bytes] = [_uvar(len(env))]
    add = parts.append
    for var in env:
        key = bytes(var["key"])
        value = bytes(var["value"])
        add(_uvar(len(key)))
        add(key)
        add(_uvar(len(value)))
        add(value)
    return b"".join(parts)


class EncodedEnv(List[Dict[str, Any]]):
    """A request's ``env`` list that carries its encoding (``wire``), made
    once for the requests that copy an unchanged environment:
    :func:`encode_spawn` sends those bytes as they are."""

    wire: bytes = b""


def _encode_cgroup(cgroup: Dict[str, Any]) -> bytes:
    """``option<CgroupSpec>`` present: PROTOCOL.md section 4.6d."""

    def opt(value: Optional[int], bits: int = 64) -> bytes:
        return b"\x00" if value is None else b"\x01" + _uvar(value, bits)

    cpu = cgroup["cpu_max"]
    return b"".join(
        [
            b"\x01",
            b"\x01" if cgroup["kill_tree"] else b"\x00",
            b"\x01" if cgroup["wait_tree"] else b"\x00",
            opt(cgroup["memory_max"]),
            opt(cgroup["memory_swap_max"]),
            opt(cgroup["pids_max"]),
            b"\x00"
            if cpu is None
            else b"\x01" + _uvar(cpu["quota_micros"]) + _uvar(cpu["period_micros"]),
            opt(cgroup["cpu_weight"], 32),
            opt(cgroup["io_weight"], 32),
        ]
    )


def encode(schema: Schema, message: Any) -> bytes:
    """Encodes one message (a whole frame)."""
    out = bytearray()
    _encode(out, schema, message)
    return bytes(out)


def decode(schema: Schema, frame: bytes) -> Any:
    """Decodes one whole frame; trailing bytes are an error."""
    reader = _Reader(frame)
    value = _decode(reader, schema)
    if reader.pos != len(frame):
        raise DecodeError(f"{len(frame) - reader.pos} bytes left after the message")
    return value


def encode_client(message: Dict[str, Any], version: int = PROTOCOL_VERSION) -> bytes:
    """Encodes a ``ClientMessage`` in the layout of ``version``."""
    return encode(client_schema(version), message)


def decode_server(frame: bytes, version: int = PROTOCOL_VERSION) -> Any:
    """Decodes a ``ServerMessage`` in the layout of ``version``."""
    return decode(server_schema(version), frame)


def to_json(value: Any) -> Any:
    """A decoded value in the vectors' JSON shape: bytes become lists of ints."""
    if isinstance(value, bytes):
        return list(value)
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_json(item) for item in value]
    return value


__all__: List[str] = [
    "CLIENT_MESSAGE",
    "CLIENT_MESSAGE_V2",
    "CLIENT_MESSAGE_V3",
    "SERVER_MESSAGE",
    "SERVER_MESSAGE_V2",
    "SERVER_MESSAGE_V3",
    "DecodeError",
    "decode",
    "encode",
]
