'use strict';
// spawnSync, execFileSync and execSync.

const test = require('node:test');
const assert = require('node:assert/strict');
const { sharedDaemon } = require('./helpers');
const zygote = require('..');

sharedDaemon();

test('spawnSync gives status, output and the input fed to stdin', () => {
  const result = zygote.spawnSync('sh', ['-c', 'cat; echo err >&2; exit 5'], { input: 'fed\n', encoding: 'utf8' });
  assert.equal(result.status, 5);
  assert.equal(result.signal, null);
  assert.equal(result.stdout, 'fed\n');
  assert.equal(result.stderr, 'err\n');
  assert.deepEqual(result.output, [null, 'fed\n', 'err\n']);
  assert.ok(result.pid > 0);
  assert.equal(result.error, undefined);
});

test('spawnSync of a missing program has an ENOENT error', () => {
  const result = zygote.spawnSync('no-such-program-zygote', ['a']);
  assert.equal(result.error.code, 'ENOENT');
  assert.equal(result.error.syscall, 'spawnSync no-such-program-zygote');
  assert.deepEqual(result.error.spawnargs, ['a']);
  assert.equal(result.status, null);
});

test('spawnSync timeout kills with killSignal and says ETIMEDOUT', () => {
  const started = Date.now();
  const result = zygote.spawnSync('sleep', ['30'], { timeout: 100, killSignal: 'SIGKILL' });
  assert.equal(result.error.code, 'ETIMEDOUT');
  assert.equal(result.signal, 'SIGKILL');
  assert.ok(Date.now() - started < 15000);
});

test('spawnSync maxBuffer ends the child with ENOBUFS', () => {
  const result = zygote.spawnSync('head', ['-c', '100000', '/dev/zero'], { maxBuffer: 100 });
  assert.equal(result.error.code, 'ENOBUFS');
  assert.equal(result.stdout.length, 100);
});

test('execFileSync returns stdout; a failure throws with status and stderr', () => {
  assert.equal(zygote.execFileSync('echo', ['a', 'b'], { encoding: 'utf8' }), 'a b\n');
  assert.ok(Buffer.isBuffer(zygote.execFileSync('echo', ['x'])));
  assert.throws(() => zygote.execFileSync('sh', ['-c', 'echo bad >&2; exit 2'], { stdio: 'pipe' }), (error) => {
    assert.equal(error.status, 2);
    assert.equal(error.stderr.toString(), 'bad\n');
    assert.match(error.message, /^Command failed: sh -c echo bad >&2; exit 2\nbad\n/);
    return true;
  });
});

test('execSync runs the line through /bin/sh', () => {
  assert.equal(zygote.execSync('echo $0 $((2 + 3))', { encoding: 'utf8' }), '/bin/sh 5\n');
});
