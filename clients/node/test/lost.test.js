'use strict';
// A lost zygote: children spawned before keep their exit status (from
// the pidfd) and their kill; the next spawn reconnects to a new zygote on
// the same path; ref() and unref() decide whether a child keeps Node up.

const test = require('node:test');
const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { Daemon, finished, within, sleep } = require('./helpers');
const zygote = require('..');

function kernelKeepsExitStatus() {
  const [major, minor] = require('node:os').release().split(/[.-]/).map(Number);
  return major > 6 || (major === 6 && minor >= 15);
}

// Whether orphans get reaped here (by init or a subreaper above us): the
// kernel hands a pidfd the exit status only once the child is reaped.
function orphansAreReaped() {
  const pid = Number(childProcess.execFileSync('sh', ['-c', 'sleep 0.05 >/dev/null & echo $!']));
  const deadline = Date.now() + 15000;
  while (fs.existsSync(`/proc/${pid}`) && Date.now() < deadline) {
    childProcess.execFileSync('sleep', ['0.02']);
  }
  return !fs.existsSync(`/proc/${pid}`);
}

test('a child outlives a lost zygote; the next spawn reconnects', async (t) => {
  const daemon = await new Daemon().start();
  t.after(() => daemon.stop());
  zygote.setSocket(daemon.socket);

  const survivor = zygote.spawn('sh', ['-c', 'sleep 0.5; exit 7'], { stdio: 'ignore' });
  await within(new Promise((resolve) => survivor.once('spawn', resolve)), 20000, 'spawn');
  const killable = zygote.spawn('sleep', ['30'], { stdio: 'ignore' });
  await within(new Promise((resolve) => killable.once('spawn', resolve)), 20000, 'spawn');
  await daemon.kill('SIGKILL');

  const fallback = kernelKeepsExitStatus() && orphansAreReaped();
  if (fallback) {
    const { code } = await finished(survivor);
    assert.equal(code, 7, 'the exit status read from the pidfd');
    assert.equal(killable.kill('SIGKILL'), true, 'kill through the pidfd after the loss');
    const { signal } = await finished(killable);
    assert.equal(signal, 'SIGKILL');
  } else {
    t.diagnostic('SKIPPED the pidfd fallback: the kernel predates 6.15 or orphans are not reaped here');
    const error = await within(new Promise((resolve) => survivor.once('error', resolve)), 20000, 'loss');
    assert.equal(error.code, 'ERR_ZYGOTE_LOST');
    killable.on('error', () => {});
    killable.kill('SIGKILL');
  }

  await daemon.start();
  const again = await finished(zygote.spawn('echo', ['reconnected']), 30000);
  assert.equal(again.stdout, 'reconnected\n');
});

test('a zygote that is not there is an error event, not a throw', async () => {
  zygote.setSocket(path.join(require('node:os').tmpdir(), `zygote-none-${process.pid}.sock`));
  const child = zygote.spawn('echo', ['x']);
  const error = await within(new Promise((resolve) => child.once('error', resolve)), 30000, 'error');
  assert.match(error.message, /zygote/);
  assert.equal(error.code, 'ERR_ZYGOTE_UNAVAILABLE', 'not mistaken for a missing program');
});

// Runs a small program with the package; resolves with its wall time.
function timeScript(daemon, body) {
  const script = `const zygote = require(${JSON.stringify(path.join(__dirname, '..'))});\n${body}`;
  const started = Date.now();
  childProcess.execFileSync(process.execPath, ['-e', script], {
    env: { ...process.env, ZYGOTE_SOCKET: daemon.socket }, stdio: 'inherit', timeout: 30000,
  });
  return Date.now() - started;
}

test('a running child keeps Node alive unless unref\'d', async (t) => {
  const daemon = await new Daemon().start();
  t.after(() => daemon.stop());
  const held = timeScript(daemon, "zygote.spawn('sleep', ['1.5'], { stdio: 'ignore' });");
  assert.ok(held >= 1400, `Node exited after ${held} ms, before its child`);
  const spawned = 'const c = zygote.spawn(\'sleep\', [\'5\'], { stdio: \'ignore\' });'
    + ' c.on(\'spawn\', () => { c.unref(); setTimeout(() => {}, 50); });';
  const left = timeScript(daemon, spawned);
  assert.ok(left < 4000, `Node waited ${left} ms for an unref'd child`);
  await sleep(1);
});
