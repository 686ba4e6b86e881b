'use strict';
// execFile and exec: callbacks, util.promisify, maxBuffer, encoding, errors.

const test = require('node:test');
const assert = require('node:assert/strict');
const util = require('node:util');
const { sharedDaemon, within } = require('./helpers');
const zygote = require('..');

sharedDaemon();

const execFileP = util.promisify(zygote.execFile);
const execP = util.promisify(zygote.exec);

test('execFile calls back with stdout and stderr as strings', async () => {
  const result = await within(new Promise((resolve) => {
    zygote.execFile('sh', ['-c', 'echo out; echo err >&2'], (error, stdout, stderr) => resolve({ error, stdout, stderr }));
  }), 20000, 'execFile');
  assert.deepEqual(result, { error: null, stdout: 'out\n', stderr: 'err\n' });
});

test('exec runs the line through /bin/sh -c', async () => {
  const child = zygote.exec('echo $0 "$((1 + 2))"', () => {});
  assert.deepEqual(child.spawnargs, ['/bin/sh', '-c', 'echo $0 "$((1 + 2))"']);
  const { stdout } = await within(execP('echo $0 "$((1 + 2))"'), 20000, 'exec');
  assert.equal(stdout, '/bin/sh 3\n');
});

test('promisified execFile resolves { stdout, stderr } and has .child', async () => {
  const promise = execFileP('echo', ['a', 'b']);
  assert.ok(promise.child, 'the child on the promise');
  assert.deepEqual(await within(promise, 20000, 'execFile'), { stdout: 'a b\n', stderr: '' });
});

test('a failing command rejects with code, signal, cmd, stdout and stderr', async () => {
  await assert.rejects(within(execP('echo partial; echo bad >&2; exit 4'), 20000, 'exec'), (error) => {
    assert.equal(error.code, 4);
    assert.equal(error.signal, null);
    assert.equal(error.killed, false);
    assert.equal(error.cmd, 'echo partial; echo bad >&2; exit 4');
    assert.equal(error.stdout, 'partial\n');
    assert.equal(error.stderr, 'bad\n');
    assert.equal(error.message, 'Command failed: echo partial; echo bad >&2; exit 4\nbad\n');
    return true;
  });
});

test('a missing program rejects with ENOENT', async () => {
  await assert.rejects(within(execFileP('no-such-program-zygote', ['x']), 20000, 'execFile'), (error) => {
    assert.equal(error.code, 'ENOENT');
    assert.equal(error.errno, -2);
    assert.equal(error.path, 'no-such-program-zygote');
    assert.equal(error.stdout, '');
    return true;
  });
});

test('maxBuffer ends the child and reports what fitted', async () => {
  await assert.rejects(within(execFileP('head', ['-c', '100000', '/dev/zero'], { maxBuffer: 100 }),
    20000, 'execFile'), (error) => {
    assert.equal(error.code, 'ERR_CHILD_PROCESS_STDIO_MAXBUFFER');
    assert.equal(error.message, 'stdout maxBuffer length exceeded');
    assert.equal(error.stdout.length, 100);
    return true;
  });
});

test('encoding buffer gives Buffers; latin1 decodes', async () => {
  const raw = await within(execFileP('printf', ['\\377'], { encoding: 'buffer' }), 20000, 'execFile');
  assert.ok(Buffer.isBuffer(raw.stdout));
  assert.deepEqual([...raw.stdout], [0xff]);
  const latin = await within(execFileP('printf', ['\\377'], { encoding: 'latin1' }), 20000, 'execFile');
  assert.equal(latin.stdout, '\u00ff');
});

test('timeout kills with killSignal and says so', async () => {
  await assert.rejects(within(execFileP('sleep', ['30'], { timeout: 100, killSignal: 'SIGKILL' }), 20000, 'execFile'),
    (error) => {
      assert.equal(error.killed, true);
      assert.equal(error.signal, 'SIGKILL');
      assert.equal(error.code, null);
      return true;
    });
});

test('an AbortSignal rejects with AbortError', async () => {
  const controller = new AbortController();
  const promise = execFileP('sleep', ['30'], { signal: controller.signal });
  setTimeout(() => controller.abort(), 50);
  await assert.rejects(within(promise, 20000, 'execFile'), { name: 'AbortError' });
});
