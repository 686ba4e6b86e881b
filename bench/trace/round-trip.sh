#!/usr/bin/env bash
# Traces concurrency-1 round trips of one zygote mode with perf's scheduler
# and syscall tracepoints, then splits them into steps (segments.py).
#
#   bench/trace/round-trip.sh [zygote-shared|zygote-private|zygote-template]
#   bench/trace/round-trip.sh python [PYTHON]
#   bench/trace/round-trip.sh node
#
# "python" traces the Python client (clients/python/bench.py, one thread,
# against os.posix_spawn in the same process) run by PYTHON (default
# python3); "node" the Node.js client (clients/node/bench.js from a small
# process, with its posix_spawn floor), on a daemon of its own, with the
# addon as it was last built. Needs root (tracepoints), perf and python3;
# builds the release binaries.
set -euo pipefail

method="${1:-zygote-shared}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$(mktemp -d /tmp/zygote-trace-XXXXXX)"

if [ ! -e /sys/kernel/tracing/events ]; then
    mount -t tracefs nodev /sys/kernel/tracing
fi
cargo build --release --workspace --bins --locked --manifest-path "$root/Cargo.toml"

events=(
    sched:sched_wakeup sched:sched_wakeup_new sched:sched_switch
    sched:sched_process_exec sched:sched_process_exit
    syscalls:sys_enter_sendmsg syscalls:sys_exit_recvmsg
    syscalls:sys_enter_clone syscalls:sys_enter_waitid
)
if [[ $method == python ]]; then
    python="${2:-python3}"
    # The interpreter's thread name: the file it was started as.
    names=(--client "$(basename "$(realpath -s "$(command -v "$python")")")")
    names+=(--floor "${names[1]}")
    command=(env ZYGOTE_BIN="$root/target/release/zygote" "$python"
        "$root/clients/python/bench.py" --methods posix_spawn,zygote
        --rss-gib 0 --fds 0 --concurrency 1 --iterations 400 --rounds 1)
elif [[ $method == node ]]; then
    # The addon's runtime thread sends the requests and reads the replies.
    names=(--client zygote-node)
    "$root/target/release/zygote" serve --socket "$out/zygote.sock" 2>"$out/daemon.log" &
    daemon=$!
    trap 'kill $daemon' EXIT
    while [ ! -S "$out/zygote.sock" ]; do sleep 0.05; done
    command=(env ZYGOTE_SOCKET="$out/zygote.sock" node "$root/clients/node/bench.js"
        --heap-gib 0 --methods zygote --concurrency 1 --rounds 1 --spawns 400)
else
    names=()
    command=("$root/target/release/zygote-bench" --methods "$method"
        --rss-gib 0 --fds 0 --concurrency 1 --iterations 400 --rounds 1
        --cow-rounds 1 --resident-children 5)
fi
perf record -a -o "$out/perf.data" -e "$(IFS=,; echo "${events[*]}")" -- \
    "${command[@]}" >"$out/bench.md"
perf script -i "$out/perf.data" -F comm,tid,cpu,time,event,trace 2>/dev/null \
    | python3 "$root/bench/trace/segments.py" "${names[@]}"
echo "trace and bench output kept in $out"
