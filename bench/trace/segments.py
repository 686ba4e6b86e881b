#!/usr/bin/env python3
"""Splits zygote round trips into steps, from a `perf script` trace.

Reads the output of `perf script -F comm,tid,cpu,time,event,trace` over a
concurrency-1 zygote-bench run (see round-trip.sh) and prints, per step,
the p50 and mean in microseconds, for the zygote and for the floor.

A zygote round trip, as seen in the trace:

  client sendmsg (Spawn) -> daemon recvmsg -> daemon clone -> child exec
  -> child exit -> daemon waitid -> daemon sendmsg (Exited)
  -> client recvmsg of Exited -> client's next sendmsg

The daemon's spawning thread is the one that calls clone with CLONE_VM and
CLONE_VFORK; the client is the thread named by --client (the bench's main
thread is "zygote-bench"); the floor is what the thread named by --floor
starts ("floor", zygote-bench's helper; for bench.py, the Python process
itself, whose posix_spawn calls are the only children it starts).
"""

import argparse
import re
import statistics
import sys

LINE = re.compile(r"^\s*(\S.*?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
CLONE_VM_VFORK = 0x4100
# Exited replies are a few bytes; Spawned too. A Spawn request carries the
# environment, so it is far larger.
LARGE_FRAME = 200
WINDOW_US = 5000


def parse(stream):
    events = []
    for line in stream:
        match = LINE.match(line)
        if not match:
            continue
        comm, tid, _cpu, time, event, rest = match.groups()
        events.append((float(time) * 1e6, comm, int(tid), event, rest))
    return events


def returned(rest):
    """The return value of a sys_exit event, as a signed integer."""
    value = int(rest.strip(), 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def zygote_round_trips(events, client):
    trips = []
    for index, (time, _comm, tid, event, rest) in enumerate(events):
        if event != "syscalls:sys_enter_clone":
            continue
        flags = re.search(r"clone_flags: (0x[0-9a-f]+)", rest)
        if not flags or int(flags.group(1), 16) & CLONE_VM_VFORK != CLONE_VM_VFORK:
            continue
        daemon = tid
        # Back: the daemon's receipt of the request, and the client's send.
        received = sent = None
        for back in range(index - 1, -1, -1):
            b_time, b_comm, b_tid, b_event, b_rest = events[back]
            if time - b_time > WINDOW_US:
                break
            if received is None:
                if (b_tid == daemon and b_event == "syscalls:sys_exit_recvmsg"
                        and returned(b_rest) > LARGE_FRAME):
                    received = b_time
            elif b_comm == client and b_event == "syscalls:sys_enter_sendmsg":
                sent = b_time
                break
        # Forward: the child's exec and exit, the daemon's reap and reply,
        # the client's receipt.
        child = execed = exited = reaped = replied = seen = None
        for f_time, f_comm, f_tid, f_event, f_rest in events[index + 1:]:
            if f_time - time > WINDOW_US * 4:
                break
            if child is None:
                if f_event == "sched:sched_wakeup_new" and f_tid == daemon:
                    child = int(re.search(r"pid=(\d+)", f_rest).group(1))
            elif f_event == "sched:sched_process_exec" and f_tid == child:
                execed = f_time
            elif f_event == "sched:sched_process_exit" and f_tid == child:
                exited = f_time
            elif exited and reaped is None:
                if f_event == "syscalls:sys_enter_waitid" and f_tid == daemon:
                    reaped = f_time
            elif reaped and replied is None:
                if f_event == "syscalls:sys_enter_sendmsg" and f_tid == daemon:
                    replied = f_time
            elif replied and f_comm == client and f_event == "syscalls:sys_exit_recvmsg":
                if 0 < returned(f_rest) <= LARGE_FRAME:
                    seen = f_time
                    break
        steps = (sent, received, execed, exited, reaped, replied, seen)
        if None in steps:
            continue
        trips.append({
            "client send -> daemon receives": received - sent,
            "daemon receives -> clone": time - received,
            "clone -> child exec": execed - time,
            "child exec -> exit": exited - execed,
            "child exit -> daemon waitid": reaped - exited,
            "daemon waitid -> Exited sent": replied - reaped,
            "Exited sent -> client receives": seen - replied,
            "client send -> client receives Exited": seen - sent,
        })
    # The client's own time between the Exited and its next request.
    thinking = []
    last_exited = None
    for time, comm, _tid, event, rest in events:
        if comm != client:
            continue
        if event == "syscalls:sys_exit_recvmsg" and 0 < returned(rest) <= LARGE_FRAME:
            last_exited = time
        elif event == "syscalls:sys_enter_sendmsg" and last_exited is not None:
            if time - last_exited < WINDOW_US:
                thinking.append(time - last_exited)
            last_exited = None
    return trips, thinking


def floor_cycles(events, floor):
    cycles = []
    current = None
    for time, comm, tid, event, rest in events:
        if comm == floor and event == "sched:sched_wakeup_new":
            if current and "exit" in current and "exec" in current:
                cycles.append({
                    "posix_spawn -> child exec": current["exec"] - current["new"],
                    "child exec -> exit": current["exit"] - current["exec"],
                    "child exit -> next posix_spawn": time - current["exit"],
                })
            current = {"new": time, "pid": int(re.search(r"pid=(\d+)", rest).group(1))}
        elif current and tid == current["pid"]:
            if event == "sched:sched_process_exec":
                current["exec"] = time
            elif event == "sched:sched_process_exit":
                current["exit"] = time
    return cycles


def table(title, rows):
    if not rows:
        print(f"{title}: nothing found in the trace\n")
        return
    print(f"{title} ({len(rows)} round trips)\n")
    print("| step | p50 µs | mean µs |")
    print("|---|---|---|")
    for key in rows[0]:
        values = [row[key] for row in rows]
        print(f"| {key} | {statistics.median(values):.0f} | {statistics.mean(values):.0f} |")
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", default="zygote-bench",
                        help="the client thread's name (default: zygote-bench)")
    parser.add_argument("--floor", default="floor",
                        help="the name of the thread that runs the floor (default: floor)")
    args = parser.parse_args()
    events = parse(sys.stdin)
    trips, thinking = zygote_round_trips(events, args.client)
    table("zygote", trips)
    if thinking:
        print(f"client, Exited received -> next request sent: p50 "
              f"{statistics.median(thinking):.0f} µs, mean {statistics.mean(thinking):.0f} µs\n")
    table("floor", floor_cycles(events, args.floor))


if __name__ == "__main__":
    main()
