"""Spawn + wait of /bin/true from Python, four ways, in one run.

Methods (interleaved round by round, so drift hits all alike; ``--methods``
picks some):

- ``posix_spawn``: ``os.posix_spawn`` + ``os.waitpid``, the floor from
  Python;
- ``vfork``: ``subprocess.run`` (CPython's vfork/posix_spawn path);
- ``fork``: ``subprocess.run`` with a no-op ``preexec_fn`` (the fork path);
- ``zygote``: ``zygote.run`` on a shared daemon;
- ``installed``: ``subprocess.run`` after ``zygote.install()``.

Conditions: the process holds each ``--rss-gib`` of touched memory and each
``--fds`` extra open fds, at each ``--concurrency`` (threads spawning back to
back; at 1, the main thread). ``--capture`` runs every method with
``capture_output=True``. Reports p50 and p99 per method, this process's
CPU time per spawn (all its threads, the zygote client's reader included;
not the child's, not the daemon's), and the target ratios, all within one
condition.

    ZYGOTE_BIN=target/release/zygote python clients/python/bench.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zygote

STDLIB_RUN = subprocess.run
TRUE = ["/bin/true"]
METHODS = ("posix_spawn", "vfork", "fork", "zygote", "installed")


def start_daemon(directory: str) -> Tuple["subprocess.Popen[bytes]", str]:
    socket_path = os.path.join(directory, "zygote.sock")
    log = open(os.path.join(directory, "zygote.log"), "wb")
    binary = zygote.find_binary()
    daemon = subprocess.Popen(
        [binary, "serve", "--socket", socket_path],
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


def grow(ballast: List[bytearray], gib: int) -> None:
    """Touches memory until ``gib`` GiB are held."""
    chunk = 64 << 20
    have = sum(len(block) for block in ballast)
    ones = b"\x01" * chunk
    while have < gib << 30:
        block = bytearray(chunk)
        block[:] = ones  # touch every page
        ballast.append(block)
        have += chunk


def hold_fds(held: List[int], count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 1000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1000), hard))
    while len(held) < count:
        held.append(os.open("/dev/null", os.O_RDONLY))
    while len(held) > count:
        os.close(held.pop())


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(spawn: Callable[[], object], count: int, threads: int) -> List[float]:
    """Latencies (µs) of ``count`` spawns, ``threads`` at a time."""
    samples: List[float] = []
    left = [count]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            start = time.perf_counter()
            spawn()
            elapsed = (time.perf_counter() - start) * 1e6
            with lock:
                samples.append(elapsed)

    if threads == 1:
        # One caller spawns from the main thread, as most programs do.
        worker()
        return samples
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return samples


def pct(samples: List[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rss-gib", default="0,4")
    parser.add_argument("--fds", default="0,19000")
    parser.add_argument("--concurrency", default="1,50")
    parser.add_argument("--iterations", type=int, default=200, help="spawns per method per cell")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--cell-seconds", type=float, default=4.0, help="at most this long per method per cell"
    )
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="some of " + ", ".join(METHODS)
    )
    parser.add_argument(
        "--capture", action="store_true", help="every method with capture_output=True"
    )
    parser.add_argument("--json", help="write the results here")
    options = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="zygote-bench-")
    daemon, socket_path = start_daemon(directory)
    client = zygote.Client(socket_path)

    def preexec() -> None:
        pass

    extra: Dict[str, Any] = {"capture_output": True} if options.capture else {}

    def installed_run() -> None:
        zygote.install(client)
        try:
            subprocess.run(TRUE, check=True, **extra)
        finally:
            zygote.uninstall()

    def posix_spawn() -> None:
        pid = os.posix_spawn(TRUE[0], TRUE, os.environ)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"{TRUE[0]} exited with wait status {status}")

    every: Dict[str, Callable[[], object]] = {
        "posix_spawn": posix_spawn,
        "vfork": lambda: STDLIB_RUN(TRUE, check=True, **extra) and None,
        "fork": lambda: STDLIB_RUN(TRUE, check=True, preexec_fn=preexec, **extra) and None,
        "zygote": lambda: client.run(TRUE, check=True, **extra) and None,
        "installed": installed_run,
    }
    chosen = options.methods.split(",")
    if not set(chosen) <= set(every):
        raise SystemExit(f"--methods: pick from {', '.join(METHODS)}")
    methods = {name: every[name] for name in chosen}
    ballast: List[bytearray] = []
    held: List[int] = []
    results = []
    try:
        for gib in (int(x) for x in options.rss_gib.split(",")):
            grow(ballast, gib)
            for fds in (int(x) for x in options.fds.split(",")):
                hold_fds(held, fds)
                for threads in (int(x) for x in options.concurrency.split(",")):
                    samples: Dict[str, List[float]] = {name: [] for name in methods}
                    per_round = max(1, options.iterations // options.rounds)
                    spent = dict.fromkeys(methods, 0.0)
                    cpu = dict.fromkeys(methods, 0.0)
                    for _ in range(options.rounds):
                        for name, spawn in methods.items():
                            if spent[name] > options.cell_seconds:
                                continue
                            start, start_cpu = time.monotonic(), cpu_seconds()
                            samples[name] += timed(spawn, per_round, threads)
                            cpu[name] += cpu_seconds() - start_cpu
                            spent[name] += time.monotonic() - start
                    cell = {
                        "rss_gib": gib,
                        "fds": fds,
                        "concurrency": threads,
                        "methods": {
                            name: {
                                "n": len(values),
                                "p50_us": pct(values, 0.5),
                                "p99_us": pct(values, 0.99),
                                "mean_us": statistics.fmean(values),
                                "cpu_us": cpu[name] * 1e6 / len(values),
                            }
                            for name, values in samples.items()
                        },
                    }
                    results.append(cell)
                    print_cell(cell)
    finally:
        client.close()
        daemon.terminate()
        daemon.wait()
    print_targets(results)
    if options.json:
        with open(options.json, "w") as out:
            json.dump(results, out, indent=1)


def print_cell(cell: Dict[str, object]) -> None:
    methods = cell["methods"]
    assert isinstance(methods, dict)
    vfork = methods["vfork"]["p50_us"] if "vfork" in methods else None
    for name, stats in methods.items():
        ratio = f"{stats['p50_us'] / vfork:.2f}" if vfork else "-"
        print(
            f"| {cell['rss_gib']} GiB | {cell['fds']} | {cell['concurrency']} | {name} "
            f"| {stats['n']} | {stats['p50_us'] / 1000:.2f} | {stats['p99_us'] / 1000:.2f} "
            f"| {ratio} | {stats['cpu_us']:.0f} |",
            flush=True,
        )


def print_targets(results: List[Dict[str, object]]) -> None:
    print("\n| target (largest RSS measured) | measured | wanted |\n|---|---|---|")
    top = max(int(cell["rss_gib"]) for cell in results)  # type: ignore[call-overload]

    def find(fds: int, threads: int) -> Dict[str, Dict[str, float]]:
        for cell in results:
            if (cell["rss_gib"], cell["fds"], cell["concurrency"]) == (top, fds, threads):
                return cell["methods"]  # type: ignore[return-value]
        return {}

    least = min(int(cell["rss_gib"]) for cell in results)  # type: ignore[call-overload]
    for cell in results:
        methods = cell["methods"]
        assert isinstance(methods, dict)
        if (cell["rss_gib"], cell["fds"], cell["concurrency"]) != (least, 0, 1):
            continue
        if {"posix_spawn", "zygote"} <= set(methods):
            ratio = methods["zygote"]["p50_us"] / methods["posix_spawn"]["p50_us"]
            where = f"{least} GiB, 0 fds, c=1"
            print(f"| zygote p50 / os.posix_spawn p50, {where} | {ratio:.2f} | <= 1.20 |")
    few = find(0, 1)
    many_fds = max(int(cell["fds"]) for cell in results)  # type: ignore[call-overload]
    many = find(many_fds, 1)
    measured = results[0]["methods"]
    assert isinstance(measured, dict)
    if not {"vfork", "fork", "zygote"} <= set(measured):
        print("| (needs the vfork, fork and zygote methods) | - | - |")
        return
    if few:
        ratio = few["fork"]["p50_us"] / few["zygote"]["p50_us"]
        print(f"| fork p50 / zygote p50, {top} GiB, c=1 | {ratio:.1f} | >= 50 |")
        ratio = few["zygote"]["p50_us"] / few["vfork"]["p50_us"]
        print(f"| zygote p50 / vfork p50, {top} GiB, 0 fds, c=1 | {ratio:.2f} | <= 1.5 |")
    if many:
        ratio = many["zygote"]["p50_us"] / many["vfork"]["p50_us"]
        print(f"| zygote p50 / vfork p50, {top} GiB, {many_fds} fds, c=1 | {ratio:.2f} | <= 0.5 |")


if __name__ == "__main__":
    print("| RSS | fds | threads | method | n | p50 ms | p99 ms | p50 / vfork | CPU µs/spawn |")
    print("|---|---|---|---|---|---|---|---|---|")
    main()
