'use strict';
// The shared test vectors (proto/vectors/frames.json), through the
// addon's codec: every frame decodes to its message, and the message
// encodes back to exactly the frame.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { REPO } = require('./helpers');
const { addon } = require('../lib/native');

const file = path.join(REPO, 'proto', 'vectors', 'frames.json');

// JSON numbers past 2^53 (u64 maxima) lose digits in a JS number: they
// are carried as strings "big:<digits>" and put back before encoding.
const BIG = /(?<=[:,[]\s*)(\d{16,})(?=\s*[,\]}])/g;
function parse(text) {
  return JSON.parse(text.replace(BIG, '"big:$1"'));
}
function stringify(value) {
  return JSON.stringify(value).replace(/"big:(\d+)"/g, '$1');
}

const vectors = parse(fs.readFileSync(file, 'utf8'));

test('the vectors are of the protocol version the package speaks', async () => {
  assert.equal(vectors.protocol_version, 4);
  assert.ok(vectors.vectors.length > 10);
});

for (const vector of vectors.vectors) {
  test(`vector ${vector.name} round-trips`, () => {
    const frame = Buffer.from(vector.hex, 'hex');
    const decoded = parse(addon.decodeFrame(vector.direction, frame));
    assert.deepEqual(decoded, vector.message);
    const encoded = addon.encodeFrame(vector.direction, stringify(vector.message));
    assert.equal(encoded.toString('hex'), vector.hex);
  });
}

// Each older version's frozen frames, in that version's layouts: what
// the addon reads from and writes to a daemon of that version.
for (let version = 1; version < vectors.protocol_version; version++) {
  const older = parse(fs.readFileSync(path.join(REPO, 'proto', 'vectors', `v${version}`, 'frames.json'), 'utf8'));
  test(`the frames of version ${version} are of that version`, () => {
    assert.equal(older.protocol_version, version);
    assert.ok(older.vectors.length > 10);
  });
  for (const vector of older.vectors) {
    test(`version ${version} vector ${vector.name} round-trips`, () => {
      const frame = Buffer.from(vector.hex, 'hex');
      assert.deepEqual(parse(addon.decodeFrame(vector.direction, frame, version)), vector.message);
      assert.equal(addon.encodeFrame(vector.direction, stringify(vector.message), version).toString('hex'), vector.hex);
    });
  }
}

test('a version-3 reply does not decode in the version-2 layout', () => {
  const spawned = vectors.vectors.find((vector) => vector.name === 'spawned_sandbox');
  assert.ok(spawned, 'a Spawned vector with a sandbox');
  assert.throws(() => addon.decodeFrame('server', Buffer.from(spawned.hex, 'hex'), 2), /decoding/);
});

test('a frame with a byte left over is refused', () => {
  const signalSent = vectors.vectors.find((vector) => vector.name === 'signal_sent' || vector.message.SignalSent);
  assert.ok(signalSent, 'a SignalSent vector');
  const frame = Buffer.concat([Buffer.from(signalSent.hex, 'hex'), Buffer.from([0xff])]);
  assert.throws(() => addon.decodeFrame('server', frame), /decoding/);
});
