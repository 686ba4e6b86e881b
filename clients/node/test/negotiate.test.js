'use strict';
// Version negotiation: the addon sends Hello with version 4 and reads a
// HelloAck in whichever layout the daemon picked; a daemon answering in
// version 1 (no features) is served.

const test = require('node:test');
const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
const { REPO, within } = require('./helpers');
const zygote = require('..');
const { addon } = require('../lib/native');

const vectors = JSON.parse(fs.readFileSync(path.join(REPO, 'proto', 'vectors', 'frames.json'), 'utf8'));
const frame = (name) => vectors.vectors.find((vector) => vector.name === name).hex;
const vectorsV2 = JSON.parse(fs.readFileSync(path.join(REPO, 'proto', 'vectors', 'v2', 'frames.json'), 'utf8'));
const frameV2 = (name) => vectorsV2.vectors.find((vector) => vector.name === name).hex;

async function scriptedPeer(t, answerHex) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-peer-'));
  const socket = path.join(dir, 'peer.sock');
  const peer = childProcess.spawn('python3', [path.join(__dirname, 'fixtures', 'scripted-peer.py'), socket, answerHex],
    { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => {
    peer.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const lines = readline.createInterface({ input: peer.stdout })[Symbol.asyncIterator]();
  assert.equal((await within(lines.next(), 20000, 'the peer to listen')).value, 'ready');
  return { socket, nextHello: async () => (await within(lines.next(), 20000, 'a Hello')).value };
}

test('a daemon answering in version 1 is served, with no features', { skip: !hasPython() && 'no python3' }, async (t) => {
  const peer = await scriptedPeer(t, frame('hello_ack_v1'));
  zygote.setSocket(peer.socket);
  const hello = await within(zygote.hello(), 20000, 'hello');
  assert.deepEqual(hello, { protocolVersion: 1, features: [], serverVersion: '0.1.0' });
  const sent = JSON.parse(addon.decodeFrame('client', Buffer.from(await peer.nextHello(), 'hex')));
  assert.equal(sent.Hello.protocol_version, 4, 'the client offers its newest version');
  zygote.setSocket(null);
});

test('a daemon answering in version 2 gives its features', { skip: !hasPython() && 'no python3' }, async (t) => {
  const peer = await scriptedPeer(t, frameV2('hello_ack'));
  zygote.setSocket(peer.socket);
  const hello = await within(zygote.hello(), 20000, 'hello');
  assert.deepEqual(hello, { protocolVersion: 2, features: ['pty', 'large_args'], serverVersion: '0.1.0' });
  zygote.setSocket(null);
});

test('a daemon answering in version 2 gets no sandboxed request: ENOTSUP naming the feature',
  { skip: !hasPython() && 'no python3' }, async (t) => {
    const ack = addon.encodeFrame('server', JSON.stringify({ HelloAck: { protocol_version: 2, server_version: 'old',
      limits: { max_frame_bytes: 262144, max_fds_per_frame: 64 }, features: ['pty', 'large_args'] } }));
    const peer = await scriptedPeer(t, ack.toString('hex'));
    zygote.setSocket(peer.socket);
    try {
      const child = zygote.spawn('/bin/true', [], { stdio: 'ignore', sandbox: { isolate: true } });
      const error = await within(new Promise((resolve) => child.once('error', resolve)), 20000, 'the refusal');
      assert.equal(error.code, 'ENOTSUP');
      assert.match(error.message, /does not offer the feature sandbox \(it speaks protocol version 2\)/);
      const sync = zygote.spawnSync('/bin/true', [], { sandbox: {} });
      assert.equal(sync.error.code, 'ENOTSUP');
    } finally {
      zygote.setSocket(null);
    }
  });

function hasPython() {
  try {
    childProcess.execFileSync('python3', ['-c', '']);
    return true;
  } catch {
    return false;
  }
}
