'use strict';
// spawn(): the ChildProcess shape, stdio, options, signals and errors,
// against a real zygote.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { sharedDaemon, finished, within, sleep } = require('./helpers');
const zygote = require('..');

const shared = sharedDaemon();

test('the zygote answers in protocol version 4 with its features', async () => {
  const hello = await within(zygote.hello(), 20000, 'hello');
  assert.equal(hello.protocolVersion, 4);
  assert.ok(Array.isArray(hello.features));
  assert.ok(shared.daemon.socket);
});

test('pipes carry stdin, stdout and stderr; exit and close give the code', async () => {
  const child = zygote.spawn('sh', ['-c', 'read line; echo "got $line"; echo oops >&2; exit 3']);
  const events = [];
  child.on('spawn', () => events.push('spawn'));
  child.on('exit', (code, signal) => events.push(['exit', code, signal]));
  child.stdin.end('hello\n');
  const result = await finished(child);
  assert.deepEqual(result, { code: 3, signal: null, stdout: 'got hello\n', stderr: 'oops\n' });
  assert.deepEqual(events, ['spawn', ['exit', 3, null]]);
  assert.equal(child.exitCode, 3);
  assert.equal(child.signalCode, null);
  assert.ok(Number.isInteger(child.pid) && child.pid > 0);
  assert.equal(child.stdio[0], child.stdin);
  assert.equal(child.stdio[1], child.stdout);
  assert.equal(child.stdio[2], child.stderr);
  assert.deepEqual(child.spawnargs, ['sh', '-c', 'read line; echo "got $line"; echo oops >&2; exit 3']);
  assert.equal(child.spawnfile, 'sh');
});

test('kill sends the signal through the pidfd; exit reports its name', async () => {
  const child = zygote.spawn('sleep', ['30'], { stdio: 'ignore' });
  await within(new Promise((resolve) => child.once('spawn', resolve)), 20000, 'spawn');
  assert.equal(child.kill('SIGTERM'), true);
  assert.equal(child.killed, true);
  const { code, signal } = await finished(child);
  assert.equal(code, null);
  assert.equal(signal, 'SIGTERM');
  assert.equal(child.signalCode, 'SIGTERM');
  assert.equal(child.kill(), false, 'a child already gone');
  assert.throws(() => child.kill('SIGNOPE'), { code: 'ERR_UNKNOWN_SIGNAL' });
});

test('kill before the zygote answered reaches the child', async () => {
  const child = zygote.spawn('sleep', ['30'], { stdio: 'ignore' });
  assert.equal(child.kill('SIGKILL'), true);
  const { signal } = await finished(child);
  assert.equal(signal, 'SIGKILL');
});

test('a missing program is an ENOENT error as Node gives it, then close', async () => {
  const child = zygote.spawn('no-such-program-zygote', ['a', 'b']);
  // Both listeners first: 'close' may follow 'error' in the same tick.
  const closed = new Promise((resolve) => child.once('close', (...a) => resolve(a)));
  const error = await within(new Promise((resolve) => child.once('error', resolve)), 20000, 'error');
  assert.equal(error.code, 'ENOENT');
  assert.equal(error.errno, -2);
  assert.equal(error.syscall, 'spawn no-such-program-zygote');
  assert.equal(error.path, 'no-such-program-zygote');
  assert.deepEqual(error.spawnargs, ['a', 'b']);
  assert.equal(error.message, 'spawn no-such-program-zygote ENOENT');
  const [code] = await within(closed, 20000, 'close');
  assert.equal(code, -2);
  assert.equal(child.pid, undefined);
});

test('bad input throws Node\'s errors before anything is sent', () => {
  assert.throws(() => zygote.spawn(42), { code: 'ERR_INVALID_ARG_TYPE', name: 'TypeError' });
  assert.throws(() => zygote.spawn(''), { code: 'ERR_INVALID_ARG_VALUE' });
  assert.throws(() => zygote.spawn('echo', ['a\u0000b']), { code: 'ERR_INVALID_ARG_VALUE', message: /args\[0\]/ });
  assert.throws(() => zygote.spawn('echo\u0000'), { code: 'ERR_INVALID_ARG_VALUE' });
  assert.throws(() => zygote.spawn('echo', [], { env: { A: 'x\u0000' } }), { code: 'ERR_INVALID_ARG_VALUE' });
  assert.throws(() => zygote.spawn('echo', [1]), { code: 'ERR_INVALID_ARG_TYPE' });
  assert.throws(() => zygote.spawn('echo', 'a'), { code: 'ERR_INVALID_ARG_TYPE' });
  assert.throws(() => zygote.spawn('echo', [], { stdio: 'sideways' }), { code: 'ERR_INVALID_ARG_VALUE' });
  assert.throws(() => zygote.spawn('echo', [], { stdio: ['pipe', {}, 'pipe'] }), { code: 'ERR_INVALID_ARG_VALUE' });
  assert.throws(() => zygote.spawn('echo', [], { uid: 1.5 }), { code: 'ERR_INVALID_ARG_TYPE' });
  assert.throws(() => zygote.spawn('echo', [], { uid: 2 ** 32 }), { code: 'ERR_OUT_OF_RANGE' });
  assert.throws(() => zygote.spawn('echo', [], { gid: -1 }), { code: 'ERR_OUT_OF_RANGE' });
  assert.throws(() => zygote.spawn('echo', [], { detached: 'yes' }), { code: 'ERR_INVALID_ARG_TYPE' });
  assert.throws(() => zygote.spawn('echo', [], { killSignal: 'SIGNOPE' }), { code: 'ERR_UNKNOWN_SIGNAL' });
  assert.throws(() => zygote.spawn('echo', [], { stdio: ['pipe', 'pipe', 'pipe', 'ipc'] }),
    { code: 'ERR_ZYGOTE_UNSUPPORTED' });
});

test('one bad call does not poison the connection others share', async () => {
  const before = zygote.spawn('echo', ['before']);
  assert.throws(() => zygote.spawn('echo', ['x\u0000']));
  const missing = zygote.spawn('no-such-program-zygote');
  missing.on('error', () => {});
  const after = zygote.spawn('echo', ['after']);
  const [first, second] = await Promise.all([finished(before), finished(after)]);
  assert.equal(first.stdout, 'before\n');
  assert.equal(second.stdout, 'after\n');
});

test('cwd, env and argv0 reach the child exactly', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-cwd-'));
  try {
    const child = zygote.spawn('sh', ['-c', 'pwd; echo "$ONLY|${HOME-unset}"; echo $0'], {
      cwd: dir, env: { ONLY: 'this', SKIPPED: undefined, PATH: process.env.PATH }, argv0: 'renamed',
    });
    const { stdout, code } = await finished(child);
    assert.equal(code, 0);
    assert.equal(stdout, `${fs.realpathSync(dir)}\nthis|unset\nrenamed\n`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('the default environment is process.env, changes included', async () => {
  process.env.ZYGOTE_NODE_TEST_VAR = 'set-from-js';
  try {
    const { stdout } = await finished(zygote.spawn('sh', ['-c', 'echo $ZYGOTE_NODE_TEST_VAR']));
    assert.equal(stdout, 'set-from-js\n');
  } finally {
    delete process.env.ZYGOTE_NODE_TEST_VAR;
  }
});

test('stdio ignore, inherit, fd numbers and streams with an fd', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-stdio-'));
  try {
    const file = path.join(dir, 'out');
    const fd = fs.openSync(file, 'w');
    const child = zygote.spawn('sh', ['-c', 'echo to-fd; echo to-err >&2'], { stdio: ['ignore', fd, 'pipe'] });
    fs.closeSync(fd);
    assert.equal(child.stdin, null);
    assert.equal(child.stdout, null);
    const result = await finished(child);
    assert.equal(result.stderr, 'to-err\n');
    assert.equal(fs.readFileSync(file, 'utf8'), 'to-fd\n');

    const stream = fs.createWriteStream(file);
    await new Promise((resolve) => stream.once('open', resolve));
    const viaStream = zygote.spawn('echo', ['via-stream'], { stdio: ['ignore', stream, 'inherit'] });
    await finished(viaStream);
    stream.close();
    assert.equal(fs.readFileSync(file, 'utf8'), 'via-stream\n');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('ignore gives the child /dev/null; inherit gives it this process\'s fd', async () => {
  const child = zygote.spawn('sh', ['-c', 'readlink /proc/self/fd/0; readlink /proc/self/fd/2 >&1'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const { stdout } = await finished(child);
  const [stdin, stderr] = stdout.trim().split('\n');
  assert.equal(stdin, '/dev/null');
  assert.equal(stderr, fs.readlinkSync('/proc/self/fd/2'));
});

test('extra pipes beyond fd 2 reach the child at their index', async () => {
  const child = zygote.spawn('sh', ['-c', 'echo three >&3; read x <&4; echo "four:$x"'], {
    stdio: ['ignore', 'pipe', 'inherit', 'pipe', 'pipe'],
  });
  assert.equal(child.stdio.length, 5);
  child.stdio[4].end('in\n');
  const three = [];
  child.stdio[3].on('data', (chunk) => three.push(chunk));
  const { stdout, code } = await finished(child);
  assert.equal(code, 0);
  assert.equal(Buffer.concat(three).toString(), 'three\n');
  assert.equal(stdout, 'four:in\n');
});

test('shell runs the command line through /bin/sh -c', async () => {
  const child = zygote.spawn('echo $((6 * 7)) | tr 4 x', { shell: true });
  assert.deepEqual(child.spawnargs, ['/bin/sh', '-c', 'echo $((6 * 7)) | tr 4 x']);
  const { stdout } = await finished(child);
  assert.equal(stdout, 'x2\n');
});

test('detached starts a new session', async () => {
  const child = zygote.spawn('sh', ['-c', 'ps -o sid= -p $$; echo $$'], { detached: true });
  const { stdout } = await finished(child);
  const [sid, pid] = stdout.trim().split(/\s+/);
  assert.equal(sid, pid);
});

test('uid and gid are applied (needs root to change them)', { skip: process.getuid() !== 0 && 'not root' }, async () => {
  const child = zygote.spawn('sh', ['-c', 'id -u; id -g; id -G'], { uid: 65534, gid: 65534 });
  const { stdout } = await finished(child);
  assert.deepEqual(stdout.trim().split('\n'), ['65534', '65534', '65534']);
});

test('timeout sends killSignal', async () => {
  const started = Date.now();
  const child = zygote.spawn('sleep', ['30'], { timeout: 100, killSignal: 'SIGINT', stdio: 'ignore' });
  const { signal } = await finished(child);
  assert.equal(signal, 'SIGINT');
  assert.ok(Date.now() - started < 15000);
});

test('the zygote timeout ends the child from the daemon side', async () => {
  const child = zygote.spawn('sleep', ['30'], { stdio: 'ignore', zygote: { timeout: 100 } });
  const { signal } = await finished(child);
  assert.equal(signal, 'SIGTERM');
});

test('an AbortSignal kills the child and emits an AbortError', async () => {
  const controller = new AbortController();
  const child = zygote.spawn('sleep', ['30'], { signal: controller.signal, stdio: 'ignore' });
  const errored = new Promise((resolve) => child.once('error', resolve));
  await within(new Promise((resolve) => child.once('spawn', resolve)), 20000, 'spawn');
  controller.abort();
  const error = await within(errored, 20000, 'abort error');
  assert.equal(error.name, 'AbortError');
  assert.equal(error.code, 'ABORT_ERR');
  const signal = await within(new Promise((resolve) => child.once('exit', (_, s) => resolve(s))), 20000, 'exit');
  assert.equal(signal, 'SIGTERM');
});

test('50 spawns in flight all finish with their own output', async () => {
  const children = Array.from({ length: 50 }, (_, i) => finished(zygote.spawn('echo', [String(i)]), 60000));
  const results = await Promise.all(children);
  results.forEach((result, i) => assert.equal(result.stdout, `${i}\n`));
});

test('the event loop keeps running while spawns are in flight', async () => {
  let ticks = 0;
  const timer = setInterval(() => { ticks++; }, 1);
  const children = Array.from({ length: 20 }, () => finished(zygote.spawn('sleep', ['0.2'], { stdio: 'ignore' })));
  await Promise.all(children);
  clearInterval(timer);
  assert.ok(ticks > 10, `the loop ran ${ticks} timers while 20 children ran`);
  await sleep(1);
});

test('a request the zygote refuses is an error with the errno\'s code', async () => {
  const hello = await within(zygote.hello(), 20000, 'hello');
  if (hello.features.includes('cgroups')) {
    assert.ok(true, 'this zygote has cgroups: nothing to refuse');
    return;
  }
  const child = zygote.spawn('true', [], { zygote: { memoryMax: 1 << 30 } });
  const error = await within(new Promise((resolve) => child.once('error', resolve)), 20000, 'error');
  assert.match(error.code, /^(EOPNOTSUPP|ENOTSUP)$/, 'errno 95, by either of its names');
  assert.match(error.message, /cgroups/);
});

test('spawns from a worker thread report to that worker', async () => {
  const { Worker } = require('node:worker_threads');
  const worker = new Worker(`
    const { parentPort, workerData } = require('node:worker_threads');
    const zygote = require(workerData.pkg);
    zygote.setSocket(workerData.socket);
    const child = zygote.spawn('echo', ['from-worker']);
    let out = '';
    child.stdout.on('data', (chunk) => { out += chunk; });
    child.on('close', (code) => parentPort.postMessage({ out, code }));
  `, { eval: true, workerData: { pkg: path.join(__dirname, '..'), socket: shared.daemon.socket } });
  const main = finished(zygote.spawn('echo', ['from-main']));
  const fromWorker = await within(new Promise((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  }), 20000, 'the worker');
  assert.deepEqual(fromWorker, { out: 'from-worker\n', code: 0 });
  assert.equal((await main).stdout, 'from-main\n');
  await worker.terminate();
});
