'use strict';
// install(), uninstall() and `node -r zygote/register`: a program written
// against child_process runs unchanged, its spawns served by the zygote,
// and what the zygote cannot reproduce goes to the original with a reason.

const test = require('node:test');
const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const path = require('node:path');
const { sharedDaemon, within } = require('./helpers');
const zygote = require('..');

const shared = sharedDaemon();
const app = path.join(__dirname, 'fixtures', 'plain-app.js');

function runApp(extraArgs) {
  const out = childProcess.execFileSync(process.execPath, [...extraArgs, app], {
    env: { ...process.env, ZYGOTE_SOCKET: shared.daemon.socket }, timeout: 60000,
  });
  return JSON.parse(out);
}

test('an unchanged child_process program runs under -r zygote/register', () => {
  const plain = runApp([]);
  const routed = runApp(['-r', path.join(__dirname, '..', 'register.js')]);
  const daemonPid = String(shared.daemon.process.pid);
  assert.equal(plain.spawn.out, String(plain.self), 'without the hook, the app is the parent');
  assert.equal(routed.spawn.out, daemonPid, 'spawn went through the zygote');
  assert.equal(routed.spawn.code, 0);
  assert.equal(routed.spawn.instance, true, 'instanceof ChildProcess');
  assert.equal(routed.execFile.out, daemonPid, 'execFile went through the zygote');
  assert.equal(routed.execFile.code, 3);
  assert.equal(routed.exec.out, daemonPid, 'promisified exec went through the zygote');
  assert.equal(routed.execSync.out, daemonPid, 'execSync went through the zygote');
  assert.equal(plain.execSync.out, String(plain.self));
  assert.equal(routed.ipc.out, String(routed.self), "an 'ipc' child went to the original");
});

test('install routes, names why it falls back, and uninstall restores', async () => {
  const original = childProcess.spawn;
  const reasons = [];
  zygote.install({ onFallback: (reason, api) => reasons.push([api, reason]) });
  try {
    assert.notEqual(childProcess.spawn, original);
    const { stdout } = await within(require('node:util').promisify(childProcess.execFile)('sh', ['-c', 'echo $PPID']),
      20000, 'execFile');
    assert.equal(stdout.trim(), String(shared.daemon.process.pid));
    const ipc = childProcess.spawn(process.execPath, ['-e', ''], { stdio: ['pipe', 'pipe', 'pipe', 'ipc'] });
    await within(new Promise((resolve) => ipc.once('exit', resolve)), 20000, 'the ipc child');
    assert.equal(reasons.length, 1);
    assert.equal(reasons[0][0], 'spawn');
    assert.match(reasons[0][1], /IPC channel/);
    assert.equal(zygote.lastFallback().api, 'spawn');
  } finally {
    zygote.uninstall();
  }
  assert.equal(childProcess.spawn, original);
});

test('libraries built on child_process (cross-spawn, execa, simple-git) are served once installed', async () => {
  const reasons = [];
  const daemonPid = String(shared.daemon.process.pid);
  zygote.install({ onFallback: (reason, api) => reasons.push([api, reason]) });
  try {
    const crossSpawn = require('cross-spawn');
    const child = crossSpawn('sh', ['-c', 'echo $PPID']);
    let out = '';
    child.stdout.on('data', (chunk) => { out += chunk; });
    const code = await within(new Promise((resolve) => child.once('close', resolve)), 20000, 'cross-spawn');
    assert.equal(code, 0);
    assert.equal(out.trim(), daemonPid, 'cross-spawn went through the zygote');

    const { execa } = await import('execa');
    const { stdout } = await within(execa('sh', ['-c', 'echo $PPID']), 20000, 'execa');
    assert.equal(stdout, daemonPid, 'execa went through the zygote');

    // git runs the alias through a shell whose parent is git: git's own
    // parent is the zygote.
    const git = require('simple-git').simpleGit({ unsafe: { allowUnsafeAlias: true } });
    const parent = await within(git.raw(['-c', "alias.parent=!awk '{print $4}' /proc/$PPID/stat", 'parent']),
      20000, 'simple-git');
    assert.equal(parent.trim(), daemonPid, 'simple-git went through the zygote');
  } finally {
    zygote.uninstall();
  }
  assert.deepEqual(reasons, [], 'nothing fell back');
});

test('with no zygote at the socket, install falls back to child_process', async () => {
  const reasons = [];
  zygote.setSocket(path.join(require('node:os').tmpdir(), `zygote-absent-${process.pid}.sock`));
  zygote.install({ onFallback: (reason) => reasons.push(reason) });
  try {
    const { stdout } = await within(require('node:util').promisify(childProcess.execFile)('echo', ['fell back']),
      20000, 'execFile');
    assert.equal(stdout, 'fell back\n');
    assert.equal(reasons.length, 1);
    assert.match(reasons[0], /no zygote listens at .*zygote-absent/);
  } finally {
    zygote.uninstall();
    zygote.setSocket(shared.daemon.socket);
  }
});

test('a call with a sandbox is never handed to child_process, which would run it unconfined', async () => {
  const reasons = [];
  zygote.setSocket(path.join(require('node:os').tmpdir(), `zygote-absent-${process.pid}.sock`));
  zygote.install({ onFallback: (reason) => reasons.push(reason) });
  try {
    const child = childProcess.spawn('/bin/true', [], { stdio: 'ignore', sandbox: { network: 'none' } });
    const error = await within(new Promise((resolve) => child.once('error', resolve)), 20000, 'the refusal');
    assert.equal(error.code, 'ERR_ZYGOTE_UNAVAILABLE');
    assert.equal(child.pid, undefined);
    assert.throws(() => childProcess.spawn(process.execPath, ['-e', ''], { stdio: ['pipe', 'pipe', 'pipe', 'ipc'],
      sandbox: {} }), { code: 'ERR_ZYGOTE_UNSUPPORTED' });
    assert.deepEqual(reasons, []);
  } finally {
    zygote.uninstall();
    zygote.setSocket(shared.daemon.socket);
  }
});
