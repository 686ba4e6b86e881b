"""Cold against warm Python children through zygote, in one run.

For each preload set (``--sets``):

- ``stdlib``: asyncio, json, email, http.client, decimal, unittest, xml,
  sqlite3, ssl, urllib, multiprocessing, with this interpreter;
- ``numeric``: numpy and pandas, installed by the benchmark (pip, from
  PyPI) into a venv under target/ and run with that venv's interpreter
  (``OPENBLAS_NUM_THREADS=1`` and the like, for cold and warm alike: a
  template refuses a preload that starts threads);

it measures, round by round (methods interleaved, so that drift hits
both alike):

- ``cold``: ``python -c "import MODULES; pass"`` spawned through the
  zygote;
- ``warm``: ``-c pass`` forked from a template with MODULES preloaded,
  each spawn as soon as the last one's exit status is in;
- ``warm paced``: the same, ``--pace-ms`` apart (20 ms), so that the
  template has forked its next pooled child before the request comes, as
  it has whenever spawns are not back to back;

the wall time of a spawn and wait (p50, p99), the CPU per spawn (the
child's own, from the exit status, plus the server side: the daemon's
process tree, its spawners and templates, and the processes it reaped
other than the children measured, such as those a warm child leaves its
memory's teardown to, from /proc/PID/stat), the PSS
of each of ``--live`` children alive at once (blocked on stdin, from
/proc/PID/smaps_rollup), and the time to create a template against a
cold start made right after it. It prints markdown tables, the second
with the targets: warm p50 <= 5 ms where the cold start takes >= 100 ms
(back to back and paced); warm PSS <= 1/3 of cold; creation <= cold
start + 10%.

    cargo build --release --bins --locked
    ZYGOTE_BIN=target/release/zygote python clients/python/bench_templates.py

``--quick`` is a smoke run (the stdlib set, a few spawns, numbers meaningless).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zygote

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STDLIB_SET = [
    "asyncio",
    "json",
    "email",
    "http.client",
    "decimal",
    "unittest",
    "xml",
    "sqlite3",
    "ssl",
    "urllib",
    "multiprocessing",
]
NUMERIC_SET = ["numpy", "pandas"]
#: BLAS and OpenMP pools start threads at import unless told not to.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TICKS = os.sysconf("SC_CLK_TCK")
WARM_P50_MS = 5.0
COLD_FLOOR_MS = 100.0
PSS_RATIO = 1 / 3
CREATION_SLACK = 1.10
#: Spawns timed; PSS is measured for the first two only.
METHODS = ("cold", "warm", "warm paced")


def lists_per_method() -> Dict[str, List[float]]:
    return {method: [] for method in METHODS}


def totals_per_method() -> Dict[str, float]:
    return dict.fromkeys(METHODS, 0.0)


@dataclass
class Workload:
    """One preload set, with the interpreter and environment its cold and
    warm children share."""

    name: str
    python: str
    preload: List[str]
    env: Dict[str, str]
    template: Optional[zygote.Template] = None
    latency: Dict[str, List[float]] = field(default_factory=lists_per_method)
    child_cpu: Dict[str, float] = field(default_factory=totals_per_method)
    server_cpu: Dict[str, float] = field(default_factory=totals_per_method)
    pss_kib: Dict[str, List[int]] = field(default_factory=lambda: {"cold": [], "warm": []})
    template_pss_kib: int = 0
    creation: List[float] = field(default_factory=list)
    creation_cold: List[float] = field(default_factory=list)

    def cold_argv(self, code: str = "pass") -> List[str]:
        return [self.python, "-c", f"import {', '.join(self.preload)}; {code}"]


def start_daemon(directory: str) -> Tuple["subprocess.Popen[bytes]", str]:
    socket_path = os.path.join(directory, "zygote.sock")
    log = open(os.path.join(directory, "zygote.log"), "wb")
    daemon = subprocess.Popen(
        [zygote.find_binary(), "serve", "--socket", socket_path],
        stdout=log,
        stderr=log,
        env=dict(os.environ, ZYGOTE_LOG="warn"),
    )
    deadline = time.monotonic() + 20
    while not os.path.exists(socket_path):
        if time.monotonic() > deadline or daemon.poll() is not None:
            raise SystemExit(f"zygote did not start (log in {directory})")
        time.sleep(0.02)
    return daemon, socket_path


def numeric_python(quiet: bool) -> str:
    """The interpreter of target/bench-templates-X.Y, a venv with numpy and
    pandas, made (pip from PyPI) when it has not got them yet."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    venv = os.path.join(REPO, "target", f"bench-templates-{version}")
    python = os.path.join(venv, "bin", "python")
    probe = [python, "-c", "import numpy, pandas"]
    if os.path.exists(python) and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"installing numpy and pandas into {venv} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    subprocess.run([*pip, *(["-q"] if quiet else []), "numpy", "pandas"], check=True)
    return python


def process_cpu(pid: int, reaped: bool = False) -> float:
    """utime + stime of a live process (all its threads), in seconds;
    with ``reaped``, plus that of the children it has reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def tree(root: int) -> List[int]:
    """``root`` and its live descendants."""
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    queue.extend(int(child) for child in children.read().split())
            except OSError:
                pass
    return found


def server_cpu(daemon_pid: int) -> float:
    """CPU of the daemon's process tree: the daemon, its spawners and its
    templates, and every child the daemon reaped: the children measured
    (whose own CPU the caller takes away) and the processes a warm child
    leaves its memory's teardown to."""
    live = sum(process_cpu(pid) for pid in tree(daemon_pid) if pid != daemon_pid)
    return live + process_cpu(daemon_pid, reaped=True)


def pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss line for {pid}")


def spawn(client: zygote.Client, work: Workload, method: str, code: str, **kwargs: Any) -> Any:
    if method == "cold":
        return client.Popen(work.cold_argv(code), env=work.env, **kwargs)
    assert work.template is not None
    return work.template.Popen(["-c", code], env=work.env, **kwargs)


def latency_round(
    client: zygote.Client, daemon_pid: int, work: Workload, method: str, count: int, pace: float
) -> None:
    before = server_cpu(daemon_pid)
    children = 0.0
    for _ in range(count):
        if method == "warm paced":
            time.sleep(pace)
        started = time.perf_counter()
        process = spawn(client, work, method, "pass", stdout=subprocess.DEVNULL)
        code = process.wait()
        work.latency[method].append((time.perf_counter() - started) * 1000)
        if code != 0:
            raise SystemExit(f"{method} {work.name} child exited {code}")
        usage = process.usage or {}
        children += (usage["user_micros"] + usage["system_micros"]) / 1e6
    # The last warm child's teardown ends, and is reaped, in this round.
    time.sleep(0.1)
    work.child_cpu[method] += children
    work.server_cpu[method] += server_cpu(daemon_pid) - before - children


def live_children(client: zygote.Client, work: Workload, method: str, count: int) -> None:
    """PSS of ``count`` children alive at once, each once it is ready."""
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    children = [
        spawn(client, work, method, code, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(count)
    ]
    try:
        for child in children:
            if child.stdout.readline() != b"ready\n":
                raise SystemExit(f"a {method} {work.name} child did not start")
        work.pss_kib[method] = [pss_kib(child.pid) for child in children]
        if method == "warm" and work.template is not None:
            work.template_pss_kib = pss_kib(work.template.pid)
    finally:
        for child in children:
            child.stdin.close()
            child.stdout.close()
            child.wait(60)


def creations(socket_path: str, work: Workload, count: int) -> None:
    """Fresh templates, each on a connection of its own that then closes
    (this uid's last, so that the daemon stops the template), each with an
    environment of its own (never one found running), and each followed
    by a cold start, against which it is compared: the machine's speed
    drifts over a run more than the two differ."""
    for number in range(count):
        env = dict(work.env, ZYGOTE_BENCH_CREATION=str(number))
        with zygote.Client(socket_path) as client:
            started = time.perf_counter()
            template = client.python_template(preload=work.preload, python=work.python, env=env)
            work.creation.append((time.perf_counter() - started) * 1000)
            if template.reused:
                raise SystemExit("a template meant to be fresh was found running")
            started = time.perf_counter()
            if client.Popen(work.cold_argv(), env=env).wait() != 0:
                raise SystemExit(f"a cold {work.name} start failed")
            work.creation_cold.append((time.perf_counter() - started) * 1000)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{template.pid}") and time.monotonic() < deadline:
            time.sleep(0.01)


def pct(samples: List[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(work: Workload) -> Dict[str, Any]:
    row: Dict[str, Any] = {"set": work.name, "preload": work.preload}
    for method in METHODS:
        samples = work.latency[method]
        row[f"{method}_p50_ms"] = pct(samples, 0.5)
        row[f"{method}_p99_ms"] = pct(samples, 0.99)
        row[f"{method}_child_cpu_ms"] = work.child_cpu[method] / len(samples) * 1000
        row[f"{method}_server_cpu_ms"] = work.server_cpu[method] / len(samples) * 1000
    for method in ("cold", "warm"):
        row[f"{method}_pss_kib"] = statistics.mean(work.pss_kib[method])
    row["template_pss_kib"] = work.template_pss_kib
    row["creation_p50_ms"] = statistics.median(work.creation)
    row["creation_cold_p50_ms"] = statistics.median(work.creation_cold)
    return row


def print_tables(rows: List[Dict[str, Any]]) -> None:
    print("| preload | method | p50 ms | p99 ms | CPU/spawn ms (child + server) | PSS/child MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for row in rows:
        for method in METHODS:
            child, server = row[f"{method}_child_cpu_ms"], row[f"{method}_server_cpu_ms"]
            pss = row.get(f"{method}_pss_kib")
            print(
                f"| {row['set']} | {method} | {row[f'{method}_p50_ms']:.2f} "
                f"| {row[f'{method}_p99_ms']:.2f} | {child + server:.2f} "
                f"({child:.2f} + {server:.2f}) | {'' if pss is None else f'{pss / 1024:.1f}'} |"
            )
        print(
            f"| {row['set']} | template | creation {row['creation_p50_ms']:.2f} "
            f"(cold start beside it {row['creation_cold_p50_ms']:.2f}) | | "
            f"| {row['template_pss_kib'] / 1024:.1f} (the template) |"
        )
    print()
    print("| target | preload | measured | target | met |")
    print("|---|---|---:|---:|---|")
    for row in rows:
        cold = row["cold_p50_ms"]
        for method in ("warm", "warm paced"):
            warm = row[f"{method}_p50_ms"]
            applies = cold >= COLD_FLOOR_MS
            met = ("yes" if warm <= WARM_P50_MS else "NO") if applies else "n/a (cold < 100 ms)"
            print(
                f"| {method} p50 | {row['set']} | {warm:.2f} ms (cold {cold:.1f} ms, "
                f"{cold / warm:.0f}x) | <= {WARM_P50_MS:.0f} ms | {met} |"
            )
        ratio = row["warm_pss_kib"] / row["cold_pss_kib"]
        met = "yes" if ratio <= PSS_RATIO else "NO"
        print(f"| warm PSS / cold PSS | {row['set']} | {ratio:.2f} | <= 0.33 | {met} |")
        ratio = row["creation_p50_ms"] / row["creation_cold_p50_ms"]
        met = "yes" if ratio <= CREATION_SLACK else "NO"
        print(f"| creation / cold start | {row['set']} | {ratio:.2f} | <= 1.10 | {met} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default="stdlib,numeric", help="stdlib, numeric or both")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=10, help="spawns per method per round")
    parser.add_argument(
        "--pace-ms", type=float, default=20.0, help="the pause before each paced warm spawn"
    )
    parser.add_argument("--live", type=int, default=20, help="children alive at once for PSS")
    parser.add_argument("--creations", type=int, default=5, help="templates created")
    parser.add_argument("--quick", action="store_true", help="a smoke run: stdlib, few spawns")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.quick:
        args.sets, args.rounds, args.per_round, args.live, args.creations = "stdlib", 2, 3, 3, 2
    workloads = []
    for name in args.sets.split(","):
        if name == "stdlib":
            workloads.append(Workload(name, sys.executable, STDLIB_SET, dict(os.environ)))
        elif name == "numeric":
            python = numeric_python(args.quick)
            env = dict(os.environ, **ONE_THREAD)
            workloads.append(Workload("numpy+pandas", python, NUMERIC_SET, env))
        else:
            raise SystemExit(f"no preload set {name!r}")
    with tempfile.TemporaryDirectory(prefix="zygote-bench-templates-") as directory:
        daemon, socket_path = start_daemon(directory)
        try:
            rows = measure(daemon.pid, socket_path, workloads, args)
        finally:
            daemon.terminate()
            daemon.wait(30)
    print(f"python {sys.version.split()[0]}, zygote {zygote.find_binary()}, {os.cpu_count()} CPUs")
    print_tables(rows)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)


def measure(
    daemon_pid: int, socket_path: str, workloads: List[Workload], args: argparse.Namespace
) -> List[Dict[str, Any]]:
    # Creations first, while no other connection of this uid keeps the
    # templates they start alive.
    for work in workloads:
        creations(socket_path, work, args.creations)
    with zygote.Client(socket_path) as client:
        if "templates" not in client.features:
            raise SystemExit(f"the zygote does not offer templates ({client.features})")
        for work in workloads:
            work.template = client.python_template(
                preload=work.preload, python=work.python, env=work.env
            )
            for method in METHODS:  # warm-up, not counted
                spawn(client, work, method, "pass").wait()
        for number in range(args.rounds):
            for work in workloads:
                order = METHODS if number % 2 == 0 else METHODS[::-1]
                for method in order:
                    latency_round(
                        client, daemon_pid, work, method, args.per_round, args.pace_ms / 1000
                    )
        for work in workloads:
            for method in ("cold", "warm"):
                live_children(client, work, method, args.live)
    return [summary(work) for work in workloads]


if __name__ == "__main__":
    main()
