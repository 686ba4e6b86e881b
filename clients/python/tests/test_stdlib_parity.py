"""Where zygote stands in for subprocess, what a program sees is the
stdlib's: exceptions for bad values (and a shared connection that never
suffers for them), OSError texts, repr, and EncodingWarning's line."""

from __future__ import annotations

import math
import os
import random
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
from conftest import Daemon

import zygote
from zygote import _request, _wire

STDLIB_POPEN = subprocess.Popen


@pytest.fixture
def installed(client: zygote.Client) -> Iterator[zygote.Client]:
    zygote.install(client)
    try:
        yield client
    finally:
        zygote.uninstall()


def _stdlib_raises(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except BaseException as error:
        return error
    raise AssertionError("the stdlib did not raise")


# --- values out of range ----------------------------------------------------


def test_out_of_range_ids_raise_what_subprocess_raises_and_spare_the_connection(
    installed: zygote.Client,
) -> None:
    conn = installed._conn
    in_flight = subprocess.Popen(["sleep", "30"])
    for kwargs, kind in [
        ({"user": 2**64}, OverflowError),
        ({"group": 2**64}, OverflowError),
        ({"user": 2**32}, OverflowError),
        ({"user": -1}, ValueError),
        ({"group": -5}, ValueError),
        ({"extra_groups": [2**32]}, ValueError),
        ({"extra_groups": [-1]}, ValueError),
        ({"umask": 2**40}, OverflowError),
        *([({"process_group": 2**31}, OverflowError)] if sys.version_info >= (3, 11) else []),
        ({"pass_fds": [2**31]}, ValueError),
        ({"pass_fds": [-3]}, ValueError),
        ({"stdout": 2**40}, OverflowError),
    ]:
        stdlib_error = _stdlib_raises(lambda kw=kwargs: STDLIB_POPEN(["true"], **kw).wait())
        assert type(stdlib_error) is kind, (kwargs, stdlib_error)
        with pytest.raises(kind) as caught:
            subprocess.check_call(["true"], **kwargs)
        assert not isinstance(caught.value, zygote.ZygoteError), kwargs
        assert str(caught.value) == str(stdlib_error), kwargs
    with pytest.raises(OSError) as bad_fd:
        subprocess.check_call(["true"], pass_fds=[999])
    assert bad_fd.value.errno == 9 and not isinstance(bad_fd.value, zygote.ZygoteError)
    # Nothing reached the daemon: the connection and the child on it are fine.
    assert installed._conn is conn and conn.alive
    assert subprocess.run(["true"]).returncode == 0
    in_flight.kill()
    assert in_flight.wait(20) == -signal.SIGKILL


def test_out_of_range_zygote_options_are_refused_before_sending(client: zygote.Client) -> None:
    conn = client._conn
    for kwargs, kind in [
        ({"rlimits": {resource.RLIMIT_NOFILE: 2**64}}, OverflowError),
        ({"rlimits": {resource.RLIMIT_NOFILE: -5}}, ValueError),
        ({"rlimits": {resource.RLIMIT_NOFILE: (10, 5)}}, ValueError),
        ({"rlimits": {99: 1}}, ValueError),
        ({"rlimits": {2**40: 1}}, ValueError),
        ({"kill_on_close": 2**40}, OverflowError),
        ({"kill_on_close": 0}, ValueError),
        ({"zygote_timeout": 1e30}, OverflowError),
        ({"zygote_timeout": math.inf}, OverflowError),
        ({"zygote_timeout": -1.0}, ValueError),
        ({"zygote_timeout": math.nan}, ValueError),
        ({"zygote_timeout": 1.0, "zygote_grace": 1e30}, OverflowError),
        ({"cgroup": zygote.Cgroup(memory_max=2**64)}, OverflowError),
        ({"cgroup": zygote.Cgroup(cpu_weight=2**32)}, OverflowError),
        ({"cgroup": zygote.Cgroup(cpu_max=(1e30, 0.1))}, OverflowError),
        # process_group, which zygote also takes before Python 3.11.
        ({"process_group": 2**31}, OverflowError),
    ]:
        with pytest.raises(kind):
            client.run(["true"], **kwargs)
    assert client._conn is conn and conn.alive
    # The stdlib's RLIM_INFINITY is infinity.
    unlimited = client.run(
        ["sh", "-c", "ulimit -c"],
        rlimits={resource.RLIMIT_CORE: resource.RLIM_INFINITY},
        capture_output=True,
        text=True,
    )
    assert unlimited.stdout == "unlimited\n"


#: Values that sit at or across the edge of some wire type, and some that
#: are not ints at all.
_EDGES: List[Any] = [
    *(sign * 2**bits + delta for bits in (7, 16, 31, 32, 63, 64, 70) for sign in (1, -1)
      for delta in (-1, 0, 1)),
    0, 1, 2, 3, 9, 0o777, True, False, 1.5, -0.5, math.nan, math.inf, 1e30, None, "7",
]  # fmt: skip


def _random_options(rng: random.Random) -> Dict[str, Any]:
    """One to three of the spawn's fields, each a random edge value."""

    def edge() -> Any:
        return rng.choice(_EDGES)

    makers: List[Callable[[], Tuple[str, Any]]] = [
        lambda: ("user", edge()),
        lambda: ("group", edge()),
        lambda: ("extra_groups", [edge()]),
        lambda: ("umask", edge()),
        lambda: ("process_group", edge()),
        lambda: ("pass_fds", [edge()]),
        lambda: ("stdout", edge()),
        lambda: ("rlimits", {edge(): edge()}),
        lambda: ("rlimits", {resource.RLIMIT_NOFILE: (edge(), edge())}),
        lambda: ("kill_on_close", edge()),
        lambda: ("zygote_timeout", edge()),
        lambda: ("zygote_grace", edge()),
        lambda: ("cgroup", zygote.Cgroup(memory_max=edge())),
        lambda: ("cgroup", zygote.Cgroup(pids_max=edge(), io_weight=edge())),
        lambda: ("cgroup", zygote.Cgroup(cpu_max=(edge(), edge()))),
    ]
    return dict(rng.choice(makers)() for _ in range(rng.randint(1, 3)))


def _spec(options: Dict[str, Any]) -> _request.ChildSpec:
    """What zygote.Popen hands the encoder for ``options`` (without the
    stdlib's own checks in front, so that the encoder gets them raw)."""
    zygote_keys = {"rlimits", "kill_on_close", "zygote_timeout", "zygote_grace", "cgroup"}
    zygote_options = {k: v for k, v in options.items() if k in zygote_keys}
    stdout = options.get("stdout")
    return _request.ChildSpec(
        argv=["true"],
        program="true",
        stdio=[("inherit",), ("inherit",) if stdout is None else ("fd", stdout), ("inherit",)],
        pass_fds=options.get("pass_fds", ()),
        uid=options.get("user"),
        gid=options.get("group"),
        gids=options.get("extra_groups"),
        umask=options.get("umask", -1),
        process_group=options.get("process_group"),
        options=_request.ZygoteOptions(**zygote_options),
    )


#: What a refused value may raise: never anything that reached the daemon.
_REFUSALS = (ValueError, OverflowError, TypeError)


def _encoded(options: Dict[str, Any]) -> Optional[bytes]:
    """The frame for ``options``, or None when a value is refused."""
    try:
        message, _ = _request.build_spawn(_spec(options), 1, _wire.MAX_FDS_PER_FRAME)
        return _request.encode_spawn(message, _wire.MAX_FRAME_BYTES)
    except _REFUSALS:
        return None
    except OSError as error:  # a closed fd number: EBADF, as the stdlib
        assert error.errno == 9 and not isinstance(error, zygote.ZygoteError), error
        return None


def test_the_encoder_never_makes_a_frame_out_of_its_wire_types() -> None:
    """Thousands of random edge values straight into the encoder: each is
    refused, or its frame decodes under the protocol's types (every varint
    within its field's width), which is what the daemon checks."""
    rng = random.Random(0x5EED)
    encoded = 0
    for _ in range(3000):
        options = _random_options(rng)
        frame = _encoded(options)
        if frame is None:
            continue
        encoded += 1
        decoded = _wire.decode(_wire.CLIENT_MESSAGE, frame)
        assert "Spawn" in decoded, options
    assert encoded > 300, "too few valid values to say anything"


def test_random_values_never_poison_the_shared_connection(
    client: zygote.Client, shared_daemon: Daemon
) -> None:
    """The same random values through the real daemon: each spawn is
    refused before sending, or the daemon answers it (Spawned or
    SpawnFailed); the connection, and a child in flight on it, never
    notice."""
    conn = client._conn
    in_flight = client.Popen(["sleep", "60"])
    rng = random.Random(0xF00D)
    answered = 0
    for _ in range(150):
        options = _random_options(rng)
        try:
            client.run(["true"], timeout=30, **options)
            answered += 1
        except subprocess.TimeoutExpired:
            raise
        except zygote.ZygoteError as error:
            pytest.fail(f"{options!r} broke the connection: {error}")
        except OSError:  # SpawnFailed (EPERM, EINVAL...) or EBADF before sending
            answered += 1
        except (*_REFUSALS, KeyError):  # KeyError: no user or group named "7"
            pass
        assert client._conn is conn and conn.alive, f"{options!r} lost the connection"
    assert answered > 10
    assert in_flight.poll() is None, "the child in flight was disturbed"
    in_flight.kill()
    assert in_flight.wait(20) == -signal.SIGKILL


# --- OSError ------------------------------------------------------------------


def _compare_spawn_failure(
    zygote_call: Callable[[], Any], stdlib_call: Callable[[], Any], stage: str
) -> None:
    expected = _stdlib_raises(stdlib_call)
    with pytest.raises(OSError) as caught:
        zygote_call()
    got = caught.value
    assert isinstance(expected, OSError)
    assert type(got) is type(expected)
    assert (got.errno, got.strerror, got.filename) == (
        expected.errno,
        expected.strerror,
        expected.filename,
    )
    assert got.strerror == os.strerror(got.errno)
    assert str(got) == str(expected)
    assert got.zygote_stage == stage  # type: ignore[attr-defined]
    assert got.zygote_message  # type: ignore[attr-defined]
    if sys.version_info >= (3, 11):
        assert any(stage in note for note in got.__notes__), got.__notes__


def test_spawn_failures_are_the_stdlibs_oserrors(client: zygote.Client, tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    for argv in (["no-such-program-zygote"], ["/no/such/dir/program"], [str(script)]):

        def stdlib(a: List[str] = argv) -> int:
            return STDLIB_POPEN(a).wait()

        _compare_spawn_failure(lambda a=argv: client.run(a), stdlib, "Exec")
        _compare_spawn_failure(lambda a=argv: client.Popen(a).wait(), stdlib, "Exec")
    missing = tmp_path / "missing"
    for cwd in (missing, str(missing), os.fsencode(missing)):
        _compare_spawn_failure(
            lambda c=cwd: client.run(["true"], cwd=c),
            lambda c=cwd: STDLIB_POPEN(["true"], cwd=c).wait(),
            "Chdir",
        )


# --- repr ---------------------------------------------------------------------


def _stdlib_repr(returncode: Optional[int], args: List[str]) -> str:
    text = f"<Popen: returncode: {returncode} args: {args!r}>"
    return text[:76] + "...>" if len(text) > 80 else text


def test_repr_is_the_stdlibs(installed: zygote.Client) -> None:
    for args in (["true"], ["true", *["an-argument"] * 20]):
        ours = subprocess.Popen(args)
        theirs = STDLIB_POPEN(args)
        try:
            assert repr(ours) == repr(theirs) == _stdlib_repr(None, args)
        finally:
            ours.wait(20)
            theirs.wait(20)
        assert repr(ours) == repr(theirs) == _stdlib_repr(0, args)
        direct = installed.Popen(args)
        direct.wait(20)
        assert repr(direct) == repr(theirs)


# --- EncodingWarning ----------------------------------------------------------


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="subprocess emits no EncodingWarning before Python 3.11 (PEP 597 left it out)",
)
def test_encoding_warning_names_the_callers_line(shared_daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "caller.py"
    script.write_text(
        textwrap.dedent(
            """\
            import subprocess, sys, warnings
            import zygote
            warnings.simplefilter("always")
            client = zygote.Client(sys.argv[1])
            def report(call):
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    call()
                print(*sorted({f"{w.category.__name__}:{w.lineno}" for w in seen
                               if w.filename == __file__}), len(seen))
            report(lambda: subprocess.run(["true"], text=True, capture_output=True))
            report(lambda: client.run(["true"], text=True, capture_output=True))
            report(lambda: client.Popen(["true"], universal_newlines=True).wait())
            zygote.install(client)
            report(lambda: subprocess.run(["true"], text=True, capture_output=True))
            report(lambda: subprocess.check_output(["true"], text=True))
            report(lambda: subprocess.run(["true"], encoding="utf-8", capture_output=True))
            """
        )
    )
    env = dict(os.environ, PYTHONWARNINGS="")
    result = STDLIB_POPEN(
        [sys.executable, "-X", "warn_default_encoding", str(script), shared_daemon.socket],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    out, err = result.communicate(timeout=60)
    assert result.returncode == 0, err
    assert out.decode().splitlines() == [
        "EncodingWarning:11 1",
        "EncodingWarning:12 1",
        "EncodingWarning:13 1",
        "EncodingWarning:15 1",
        "EncodingWarning:16 1",
        "0",
    ], err
