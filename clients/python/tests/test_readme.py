"""The README's Python example runs, as written, against a real daemon."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, Daemon

PACKAGE = Path(__file__).resolve().parents[1]


def python_example() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "no python block in the README's Python section"
    return "\n".join(blocks)


def test_readme_example_runs(shared_daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_example())
    env = dict(os.environ, ZYGOTE_SOCKET=shared_daemon.socket, PYTHONPATH=str(PACKAGE))
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "pidfd" in result.stdout and "No such file or directory" in result.stdout
