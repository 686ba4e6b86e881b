"""Client.launch_private(): a zygote of this process's own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import zygote_bin

import zygote


def test_launch_private(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZYGOTE_BIN", zygote_bin())
    client = zygote.Client.launch_private()
    pid = client.private_pid
    assert pid is not None
    result = client.run(["sh", "-c", "echo $PPID"], capture_output=True, text=True)
    assert int(result.stdout) == pid
    client.close()
    # It exits once our end closes and its children are reaped.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/status").exists():
        status = Path(f"/proc/{pid}/status").read_text()
        if "State:\tZ" in status:
            break
        assert time.monotonic() < deadline, "the private zygote did not exit"
        time.sleep(0.02)


def test_missing_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZYGOTE_BIN", str(tmp_path / "zygote"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(zygote.ZygoteError) as caught:
        zygote.Client.launch_private()
    assert "ZYGOTE_BIN" in str(caught.value) and str(tmp_path) in str(caught.value)


def test_a_private_zygote_serves_warm_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """A template of a private zygote: its children are the private
    zygote's own, forked with the preloads in, and the zygote still exits
    when its client closes (the template with it)."""
    monkeypatch.setenv("ZYGOTE_BIN", zygote_bin())
    client = zygote.Client.launch_private()
    pid = client.private_pid
    assert pid is not None
    template = client.python_template(preload=["json"])
    code = "import os, sys; print(os.getppid(), 'json' in sys.modules); sys.exit(3)"
    result = template.run(["-c", code], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout.split()) == (3, [str(pid), "True"]), result
    client.close()
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}/status").exists():
        if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
            break
        assert time.monotonic() < deadline, "the private zygote did not exit"
        time.sleep(0.02)
