'use strict';
// child_process against zygote: spawn latency and throughput of /bin/true
// at concurrency 1 and 50, from a small process and from one holding a
// large heap in 60 KiB Buffers, in interleaved rounds, with the largest
// gap the event loop showed between 1 ms timers; and the posix_spawn
// floor from a tiny C program, when a C compiler is at hand, run in every
// round beside the methods.
//
//   ZYGOTE_SOCKET=/path/to/zygote.sock node bench.js [--heap-gib 0,4]
//       [--rounds 2] [--spawns 50] [--program /bin/true]
//       [--methods child_process,zygote] [--concurrency 1,50] [--json out.json]
//
// Each heap size runs in its own Node process (started by this one).

const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

function flag(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 ? process.argv[at + 1] : fallback;
}

const program = flag('program', '/bin/true');
const spawns = Number(flag('spawns', '50'));
const rounds = Number(flag('rounds', '2'));
const methodNames = flag('methods', 'child_process,zygote').split(',');
const concurrencies = flag('concurrency', '1,50').split(',').map(Number);

function percentile(sorted, p) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

// Runs `count` spawns with `concurrency` in flight through `spawn`;
// gives each one's latency (call to 'close'), the wall time and the
// largest event-loop gap.
async function cell(spawn, concurrency, count) {
  const latencies = [];
  let gap = 0;
  let last = process.hrtime.bigint();
  const timer = setInterval(() => {
    const now = process.hrtime.bigint();
    gap = Math.max(gap, Number(now - last) / 1e6);
    last = now;
  }, 1);
  const started = process.hrtime.bigint();
  let next = 0;
  async function lane() {
    while (next < count) {
      next++;
      const begun = process.hrtime.bigint();
      await new Promise((resolve, reject) => {
        const child = spawn(program, [], { stdio: 'ignore' });
        child.once('error', reject);
        child.once('close', resolve);
      });
      latencies.push(Number(process.hrtime.bigint() - begun) / 1e6);
    }
  }
  await Promise.all(Array.from({ length: concurrency }, lane));
  const wall = Number(process.hrtime.bigint() - started) / 1e9;
  clearInterval(timer);
  latencies.sort((a, b) => a - b);
  return {
    p50_ms: percentile(latencies, 50),
    p99_ms: percentile(latencies, 99),
    per_s: count / wall,
    gap_ms: gap,
  };
}

async function worker() {
  const gib = Number(flag('worker-heap-gib', '0'));
  const held = [];
  const chunk = 60 * 1024;
  for (let bytes = 0; bytes < gib * 2 ** 30; bytes += chunk) {
    held.push(Buffer.alloc(chunk, 1));
  }
  const zygote = require('.');
  const all = { child_process: childProcess.spawn, zygote: zygote.spawn };
  const methods = Object.fromEntries(methodNames.map((name) => [name, all[name]]));
  const floorBinary = flag('floor-binary', null);
  const results = [];
  // Warm every path (the zygote's connection, libuv's signal handling).
  for (const spawn of Object.values(methods)) await cell(spawn, 1, 3);
  for (let round = 0; round < rounds; round++) {
    const names = Object.keys(methods);
    const order = round % 2 === 0 ? names : names.reverse();
    for (const concurrency of concurrencies) {
      if (concurrency === 1 && floorBinary) {
        // The floor's p50 now, from its own small process.
        const p50 = Number(childProcess.execFileSync(floorBinary, [program, String(spawns)]));
        results.push({ heap_gib: gib, method: 'floor', concurrency, round, p50_ms: p50 });
      }
      for (const method of order) {
        const count = concurrency === 1 ? spawns : spawns * 4;
        const result = await cell(methods[method], concurrency, count);
        results.push({ heap_gib: gib, method, concurrency, round, ...result });
      }
    }
  }
  process.stdout.write(JSON.stringify({ results, held: held.length }));
  process.exit(0);
}

// The posix_spawn floor: a tiny C program spawning `program` and waiting,
// printing the p50 in ms; its path, or null without a C compiler.
function buildFloor(dir) {
  try {
    const source = path.join(dir, 'floor.c');
    fs.writeFileSync(source, `#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
  int n = atoi(argv[2]); double *t = malloc(sizeof(double) * n);
  char *args[] = { argv[1], NULL };
  for (int i = 0; i < n; i++) {
    struct timespec a, b; pid_t pid; int status;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (posix_spawn(&pid, argv[1], NULL, NULL, args, environ) != 0) return 1;
    waitpid(pid, &status, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    t[i] = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
  }
  qsort(t, n, sizeof(double), cmp);
  printf("%f\\n", t[n / 2]);
  return 0;
}
`);
    const binary = path.join(dir, 'floor');
    childProcess.execFileSync('cc', ['-O2', '-o', binary, source], { stdio: 'ignore' });
    return binary;
  } catch {
    return null;
  }
}

// One line per heap, concurrency and method: medians over the rounds (the
// loop gap: the largest), and at concurrency 1 the p50 over the floor's
// p50 in the same rounds.
function summarize(all, floorBinary) {
  const rows = new Map();
  for (const r of all) {
    const key = `${r.heap_gib}|${r.concurrency}|${r.method}`;
    if (!rows.has(key)) rows.set(key, []);
    rows.get(key).push(r);
  }
  const median = (values) => values.sort((a, b) => a - b)[Math.floor(values.length / 2)];
  const floors = (gib) => (rows.get(`${gib}|1|floor`) || []).map((r) => r.p50_ms);
  console.log(`program ${program}; ${rounds} interleaved rounds; posix_spawn floor: ${
    floorBinary === null ? 'n/a (no C compiler)' : `${spawns} spawns a round, beside the methods`}`);
  console.log('heap GiB  conc  method          p50 ms    p99 ms    spawns/s   loop gap ms  p50/floor');
  for (const [key, list] of rows) {
    const [gib, concurrency, method] = key.split('|');
    const row = (field) => median(list.map((r) => r[field]));
    const p50 = row('p50_ms');
    const floor = floors(gib);
    const ratio = concurrency === '1' && floor.length ? (p50 / median(floor)).toFixed(2) : '';
    if (method === 'floor') {
      console.log(`${gib.padStart(8)}  ${concurrency.padStart(4)}  ${'floor'.padEnd(14)}  ${
        p50.toFixed(2).padStart(8)}  ${''.padStart(8)}  ${''.padStart(9)}  ${''.padStart(11)}  ${ratio.padStart(9)}`);
      continue;
    }
    console.log(`${gib.padStart(8)}  ${concurrency.padStart(4)}  ${method.padEnd(14)}  ${
      p50.toFixed(2).padStart(8)}  ${row('p99_ms').toFixed(2).padStart(8)}  ${
      row('per_s').toFixed(1).padStart(9)}  ${Math.max(...list.map((r) => r.gap_ms)).toFixed(1).padStart(11)}  ${
      ratio.padStart(9)}`);
  }
}

function main() {
  const heaps = flag('heap-gib', '0,4').split(',').map(Number);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-floor-'));
  try {
    const floorBinary = buildFloor(dir);
    const all = [];
    for (const gib of heaps) {
      const out = childProcess.execFileSync(process.execPath, [
        '--max-old-space-size=16384', __filename, '--worker', '--worker-heap-gib', String(gib),
        '--rounds', String(rounds), '--spawns', String(spawns), '--program', program,
        '--methods', methodNames.join(','), '--concurrency', concurrencies.join(','),
        ...(floorBinary ? ['--floor-binary', floorBinary] : []),
      ], { maxBuffer: 64 * 1024 * 1024, stdio: ['ignore', 'pipe', 'inherit'] });
      all.push(...JSON.parse(out).results);
    }
    summarize(all, floorBinary);
    const json = flag('json', null);
    if (json) fs.writeFileSync(json, JSON.stringify({ program, rounds, spawns, results: all }, null, 1));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv.includes('--worker')) worker();
else main();
