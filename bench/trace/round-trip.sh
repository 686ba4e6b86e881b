#!/usr/bin/env bash
# Traces concurrency-1 round trips of one zygote mode with perf's scheduler
# and syscall tracepoints, then splits them into steps (segments.py).
#
#   bench/trace/round-trip.sh [zygote-shared|zygote-private|zygote-template]
#
# Needs root (tracepoints), perf and python3; builds the release binaries.
set -euo pipefail

method="${1:-zygote-shared}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$(mktemp -d /tmp/zygote-trace-XXXXXX)"

if [ ! -e /sys/kernel/tracing/events ]; then
    mount -t tracefs nodev /sys/kernel/tracing
fi
cargo build --release --workspace --bins --manifest-path "$root/Cargo.toml"

events=(
    sched:sched_wakeup sched:sched_wakeup_new sched:sched_switch
    sched:sched_process_exec sched:sched_process_exit
    syscalls:sys_enter_sendmsg syscalls:sys_exit_recvmsg
    syscalls:sys_enter_clone syscalls:sys_enter_waitid
)
perf record -a -o "$out/perf.data" -e "$(IFS=,; echo "${events[*]}")" -- \
    "$root/target/release/zygote-bench" --methods "$method" \
    --rss-gib 0 --fds 0 --concurrency 1 --iterations 400 --rounds 1 \
    --cow-rounds 1 --resident-children 5 >"$out/bench.md"
perf script -i "$out/perf.data" -F comm,tid,cpu,time,event,trace 2>/dev/null \
    | python3 "$root/bench/trace/segments.py"
echo "trace and bench output kept in $out"
