'use strict';
// The sandbox option: every field checked before anything is sent, the
// local refusal when the zygote does not offer the feature 'sandbox', and
// the connection still spawning afterwards, against a real zygote.

const test = require('node:test');
const assert = require('node:assert/strict');
const { promisify } = require('node:util');
const { Daemon, sharedDaemon, finished, within } = require('./helpers');
const zygote = require('..');
const { sandboxPlan, appliedSandbox } = require('../lib/sandbox');

const shared = sharedDaemon();

const sample = () => ({
  mounts: [{ type: 'ro', source: '/usr' }, { type: 'tmpfs', destination: '/tmp' }],
  network: 'none',
  isolate: true,
  hostname: 'h',
  seccomp: 'default',
  landlock: { readWrite: ['/w'], tcpConnect: [443], require: true },
});

test('a sandbox becomes the plan the addon maps onto the request', () => {
  assert.deepEqual(sandboxPlan(sample()), {
    profile: undefined,
    mounts: [{ kind: 'ro', source: '/usr', destination: '/usr' }, { kind: 'tmpfs', destination: '/tmp' }],
    networkNone: true,
    isolate: true,
    hostname: 'h',
    seccomp: 'default',
    seccompFilter: undefined,
    landlock: { readOnly: [], readExecute: [], readWrite: ['/w'], tcpBind: [], tcpConnect: [443], require: true },
  });
  assert.equal(sandboxPlan(undefined), undefined);
  assert.deepEqual(sandboxPlan({}).mounts, undefined, 'no mounts: the host filesystem');
  assert.deepEqual(sandboxPlan({ mounts: [] }).mounts, [], 'an empty root');
  assert.deepEqual(sandboxPlan({ mounts: [{ type: 'rw', source: Buffer.from('/data') }] }).mounts,
    [{ kind: 'rw', source: '/data', destination: '/data' }]);
  assert.deepEqual(appliedSandbox('{"profile":null,"namespaces":["net"],"seccomp":"default","landlock_abi":7,'
    + '"landlock_complete":false}'), { profile: null, namespaces: ['net'], seccomp: 'default', landlockAbi: 7,
    landlockComplete: false });
  assert.equal(appliedSandbox(''), null);
});

const bad = [
  [{ mounts: [{ type: 'ro', source: 'usr' }] }, 'ERR_INVALID_ARG_VALUE', /mounts\[0\]\.source' must be an absolute/],
  [{ mounts: [{ type: 'rw', source: '/a', destination: '' }] }, 'ERR_INVALID_ARG_VALUE', /destination' must be an abs/],
  [{ mounts: [{ type: 'ro', source: '/a\u0000b' }] }, 'ERR_INVALID_ARG_VALUE', /without null bytes/],
  [{ mounts: [{ type: 'tmpfs', source: '/x', destination: '/y' }] }, 'ERR_INVALID_ARG_VALUE', /absent for tmpfs/],
  [{ mounts: [{ type: 'overlay', source: '/x' }] }, 'ERR_INVALID_ARG_VALUE', /'ro', 'rw', 'tmpfs'/],
  [{ mounts: '/usr' }, 'ERR_INVALID_ARG_TYPE', /options\.sandbox\.mounts" property must be an instance of Array/],
  [{ mounts: [{ type: 'ro', source: 5 }] }, 'ERR_INVALID_ARG_TYPE', /source" property must be of type string/],
  [{ mounts: [{ type: 'ro', source: Buffer.from([0x2f, 0xff]) }] }, 'ERR_INVALID_ARG_VALUE', /must be valid UTF-8/],
  [{ network: 'bridge' }, 'ERR_INVALID_ARG_VALUE', /'host', 'none'/],
  [{ hostname: 'h' }, 'ERR_INVALID_ARG_VALUE', /needs options\.sandbox\.isolate/],
  [{ isolate: true, hostname: 'a\u0000' }, 'ERR_INVALID_ARG_VALUE', /hostname' must be a string without null/],
  [{ profile: '\ud800' }, 'ERR_INVALID_ARG_VALUE', /profile' must be well-formed Unicode/],
  [{ profile: 7 }, 'ERR_INVALID_ARG_TYPE', /profile" property must be of type string/],
  [{ seccomp: 'default', seccompFilter: 'x' }, 'ERR_INVALID_ARG_VALUE', /cannot be given with/],
  [{ isolate: 'yes' }, 'ERR_INVALID_ARG_TYPE', /isolate" property must be of type boolean/],
  [{ landlock: { tcpBind: [65536] } }, 'ERR_OUT_OF_RANGE', /tcpBind\[0\]" is out of range/],
  [{ landlock: { tcpConnect: [-1] } }, 'ERR_OUT_OF_RANGE', /tcpConnect\[0\]" is out of range/],
  [{ landlock: { tcpConnect: [1.5] } }, 'ERR_INVALID_ARG_TYPE', /must be an integer/],
  [{ landlock: { readOnly: ['/', 'etc'] } }, 'ERR_INVALID_ARG_VALUE', /readOnly\[1\]' must be an absolute/],
  [{ landlock: { readonly: ['/etc'] } }, 'ERR_INVALID_ARG_VALUE', /landlock\.readonly' is not a known field/],
  [{ netwrok: 'none' }, 'ERR_INVALID_ARG_VALUE', /sandbox\.netwrok' is not a known field/],
  [{ landlock: { require: 1 } }, 'ERR_INVALID_ARG_TYPE', /require" property must be of type boolean/],
  ['strict', 'ERR_INVALID_ARG_TYPE', /options\.sandbox" property must be of type object/],
];

test('every bad field is refused before anything is sent, and the zygote still spawns', async () => {
  for (const [sandbox, code, message] of bad) {
    assert.throws(() => zygote.spawn('/bin/true', [], { sandbox }), { code, message }, JSON.stringify(sandbox));
    assert.throws(() => zygote.spawnSync('/bin/true', [], { sandbox }), { code, message });
    assert.throws(() => zygote.execFile('/bin/true', [], { sandbox }, () => {}), { code, message });
  }
  const { code } = await finished(zygote.spawn('/bin/true', [], { stdio: 'ignore' }));
  assert.equal(code, 0);
});

test('a zygote that does not offer sandbox gets no request: ENOTSUP naming the feature', async (t) => {
  const masked = await new Daemon(null, { ZYGOTE_MASK_FEATURES: 'sandbox' }).start();
  zygote.setSocket(masked.socket);
  t.after(async () => {
    zygote.setSocket(shared.daemon.socket);
    await masked.stop();
  });
  const hello = await within(zygote.hello(), 20000, 'hello');
  assert.ok(!hello.features.includes('sandbox'), `withheld, yet offered: ${hello.features}`);
  const child = zygote.spawn('/bin/true', [], { stdio: 'ignore', sandbox: { isolate: true } });
  const error = await within(new Promise((resolve) => child.once('error', resolve)), 20000, 'the refusal');
  assert.equal(error.code, 'ENOTSUP');
  assert.equal(error.errno, -95);
  assert.match(error.message, /does not offer the feature sandbox \(it speaks protocol version \d\)/);
  assert.equal(child.pid, undefined);
  assert.equal(child.sandbox, null);

  const sync = zygote.spawnSync('/bin/true', [], { sandbox: { network: 'none' } });
  assert.equal(sync.error.code, 'ENOTSUP');
  assert.match(sync.error.message, /feature sandbox/);

  await assert.rejects(promisify(zygote.execFile)('/bin/true', [], { sandbox: {} }), { code: 'ENOTSUP' });

  const after = zygote.spawn('/bin/echo', ['still'], { stdio: ['ignore', 'pipe', 'ignore'] });
  assert.deepEqual(await finished(after), { code: 0, signal: null, stdout: 'still\n', stderr: '' });
  assert.equal(after.sandbox, null, 'an unsandboxed child reports none');
});

test('a zygote that offers sandbox confines the child: network none, seccomp default', async (t) => {
  const hello = await within(zygote.hello(), 20000, 'hello');
  if (!hello.features.includes('sandbox')) {
    t.skip('this zygote does not offer sandbox (it needs root or user namespaces)');
    return;
  }
  const listing = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '";
  const confined = zygote.spawn('/bin/sh', ['-c', listing],
    { stdio: ['ignore', 'pipe', 'ignore'], sandbox: { network: 'none' } });
  assert.deepEqual(await finished(confined), { code: 0, signal: null, stdout: 'lo\n', stderr: '' });
  assert.ok(confined.sandbox && confined.sandbox.namespaces.includes('net'), JSON.stringify(confined.sandbox));

  const free = zygote.spawnSync('unshare', ['--ipc', 'true']);
  assert.equal(free.status, 0, 'unshare without a sandbox');
  const filtered = zygote.spawnSync('unshare', ['--ipc', 'true'], { sandbox: { seccomp: 'default' } });
  assert.notEqual(filtered.status, 0, 'unshare under the default seccomp profile');
  assert.equal(filtered.sandbox.seccomp, 'default');
});

function hasPython() {
  try {
    require('node:child_process').execFileSync('python3', ['-c', 'import os; os.pidfd_open']);
    return true;
  } catch {
    return false;
  }
}

test('a zygote that offers sandbox gets the request; what it reports it applied is child.sandbox',
  { skip: !hasPython() && 'no python3 with os.pidfd_open' }, async (t) => {
  const childProcess = require('node:child_process');
  const fs = require('node:fs');
  const os = require('node:os');
  const path = require('node:path');
  const readline = require('node:readline');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-peer-'));
  const socket = path.join(dir, 'peer.sock');
  const applied = { profile: 'ci', namespaces: ['mount', 'net'], seccomp: 'default', landlock_abi: 7,
    landlock_complete: true };
  const peer = childProcess.spawn('python3', [path.join(__dirname, 'fixtures', 'confining-peer.py'), socket,
    JSON.stringify(applied)], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => {
    peer.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
    zygote.setSocket(shared.daemon.socket);
  });
  const lines = readline.createInterface({ input: peer.stdout })[Symbol.asyncIterator]();
  assert.equal((await within(lines.next(), 20000, 'the peer to listen')).value, 'ready');
  zygote.setSocket(socket);
  const want = { profile: 'ci', namespaces: ['mount', 'net'], seccomp: 'default', landlockAbi: 7,
    landlockComplete: true };
  const received = async () => JSON.parse((await within(lines.next(), 20000, 'a spawn')).value);
  // finished() listens from the start: the child closes as soon as the
  // zygote reports its exit, maybe while this test awaits something else.
  const child = zygote.spawn('/bin/true', [], { stdio: 'ignore' });
  const spawned = within(new Promise((resolve) => child.once('spawn', resolve)), 20000, 'spawn');
  const closed = finished(child);
  await spawned;
  assert.equal(await received(), null, 'a spawn that asked for no sandbox');
  assert.deepEqual(child.sandbox, want);
  assert.equal(child.pid, 4242);
  assert.deepEqual(await closed, { code: 0, signal: null, stdout: '', stderr: '' });
  assert.deepEqual(zygote.spawnSync('/bin/true', [], { stdio: 'ignore' }).sandbox, want);
  assert.equal(await received(), null);

  // A zygote that offers sandbox gets the request, field by field.
  const boxed = zygote.spawn('/bin/true', [], { stdio: 'ignore', sandbox: { ...sample(), profile: 'ci' } });
  const boxedClosed = finished(boxed);
  const bytes = (text) => [...Buffer.from(text)];
  assert.deepEqual(await received(), {
    profile: 'ci',
    filesystem: { mounts: [
      { kind: 'ReadOnlyBind', source: bytes('/usr'), destination: bytes('/usr') },
      { kind: 'Tmpfs', source: [], destination: bytes('/tmp') },
    ] },
    network: 'None',
    isolate: true,
    hostname: 'h',
    seccomp: { Profile: 'default' },
    landlock: { read_only: [], read_execute: [], read_write: [bytes('/w')], tcp_bind: [], tcp_connect: [443],
      require: true },
  });
  assert.equal((await boxedClosed).code, 0);
  assert.deepEqual(boxed.sandbox, want);
});
