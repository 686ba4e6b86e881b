"""Stands for a library that has never heard of zygote: it only knows
subprocess, looked up at call time as most code does."""

import subprocess


def parent_pid() -> int:
    """The parent pid its child sees."""
    return int(subprocess.check_output(["sh", "-c", "echo $PPID"]))


def parent_pid_with_preexec() -> int:
    return int(subprocess.check_output(["sh", "-c", "echo $PPID"], preexec_fn=lambda: None))


def run_text(command: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
