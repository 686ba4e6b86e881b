'use strict';
// Warm templates: every option checked before anything is sent, the local
// refusal when the zygote does not offer the feature 'templates', and,
// against a real zygote that offers it, children of a template.

const test = require('node:test');
const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { promisify } = require('node:util');
const { Daemon, finished, sleep, within } = require('./helpers');
const zygote = require('..');
const { Template, templateSpec } = require('../lib/template');
const { addon } = require('../lib/native');

const spec = { python: 'python3', preload: [] };
// A Template the addon does not know: for the checks made before sending.
const unknown = new Template(spec, { key: 0, handle: 0, pid: 0, reused: false });

const badOptions = [
  [{ preload: ['1json'] }, 'ERR_INVALID_ARG_VALUE', /preload\[0\]' must be a module name/],
  [{ preload: ['email..mime'] }, 'ERR_INVALID_ARG_VALUE', /module name/],
  [{ preload: ['a-b'] }, 'ERR_INVALID_ARG_VALUE', /module name/],
  [{ preload: ['é'] }, 'ERR_INVALID_ARG_VALUE', /module name/],
  [{ preload: [''] }, 'ERR_INVALID_ARG_VALUE', /module name/],
  [{ preload: ['a'.repeat(257)] }, 'ERR_INVALID_ARG_VALUE', /at most 256 bytes/],
  [{ preload: new Array(257).fill('m') }, 'ERR_OUT_OF_RANGE', /preload\.length/],
  [{ preload: 'json' }, 'ERR_INVALID_ARG_TYPE', /preload" property must be an instance of Array/],
  [{ preload: [7] }, 'ERR_INVALID_ARG_TYPE', /preload\[0\]" property must be of type string/],
  [{ python: '' }, 'ERR_INVALID_ARG_VALUE', /python' cannot be empty/],
  [{ python: 'py\u0000' }, 'ERR_INVALID_ARG_VALUE', /without null bytes/],
  [{ python: 3 }, 'ERR_INVALID_ARG_TYPE', /python" property must be of type string/],
  [{ env: { A: 'x\u0000' } }, 'ERR_INVALID_ARG_VALUE', /without null bytes/],
  [{ cwd: '/tmp/\u0000' }, 'ERR_INVALID_ARG_VALUE', /without null bytes/],
  ['json', 'ERR_INVALID_ARG_TYPE', /"options" argument must be of type object/],
];

test('pythonTemplate checks every option before anything is sent', async () => {
  for (const [options, code, message] of badOptions) {
    await assert.rejects(zygote.pythonTemplate(options), (error) => {
      assert.equal(error.code, code, `${JSON.stringify(options)}: ${error.message}`);
      assert.match(error.message, message);
      return true;
    });
  }
  const good = templateSpec({ preload: ['json', 'email.mime.text', '_x1', 'a'.repeat(256)], env: { A: '1' },
    cwd: '/tmp' });
  assert.deepEqual(good, { python: 'python3', preload: ['json', 'email.mime.text', '_x1', 'a'.repeat(256)],
    inheritEnv: false, envKeys: ['A'], envValues: ['1'], cwd: '/tmp' });
  assert.equal(templateSpec(undefined).inheritEnv, true, "no env: this process's");
  assert.equal(templateSpec({ preload: new Array(256).fill('m') }).preload.length, 256);
});

test("a template's spawn checks its arguments and refuses what a fork cannot honour", () => {
  for (const args of [[], ['-c'], ['-m'], ['-x', 'y'], [''], ['-'], 'print(1)']) {
    assert.throws(() => unknown.spawn(args), (error) => /ERR_INVALID_ARG_(VALUE|TYPE)/.test(error.code),
      JSON.stringify(args));
  }
  for (const key of ['uid', 'gid', 'sandbox', 'argv0', 'shell']) {
    const value = key === 'sandbox' ? {} : key === 'shell' ? true : key === 'argv0' ? 'x' : 1;
    assert.throws(() => unknown.spawn(['-c', 'pass'], { [key]: value }),
      { code: 'ERR_INVALID_ARG_VALUE', message: new RegExp(`options\\.${key}' cannot be honoured`) });
  }
  assert.throws(() => unknown.spawn(['-c', 'pass'], { stdio: 'bogus' }), { code: 'ERR_INVALID_ARG_VALUE' });
});

// A peer that answers each Hello with `ack` and never anything else: a
// request sent to it would be answered by the connection's end, not ENOTSUP.
async function scriptedPeer(t, ack) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-peer-'));
  const socket = path.join(dir, 'peer.sock');
  const peer = childProcess.spawn('python3', [path.join(__dirname, 'fixtures', 'scripted-peer.py'), socket,
    ack.toString('hex')], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => {
    peer.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const ready = new Promise((resolve) => peer.stdout.once('data', resolve));
  await within(ready, 20000, 'the peer to listen');
  return socket;
}

function helloAck(version, features) {
  return addon.encodeFrame('server', JSON.stringify({ HelloAck: { protocol_version: version, server_version: 'old',
    limits: { max_frame_bytes: 262144, max_fds_per_frame: 64 }, features } }), version);
}

for (const [version, features, why] of [[3, ['pty', 'sandbox'], / \(it speaks protocol version 3; templates need 4\)/],
  [4, ['pty'], /templates$/]]) {
  test(`a version-${version} daemon without the feature templates gets no template request: ENOTSUP naming it`,
    { skip: !hasPython() && 'SKIP: no python3' }, async (t) => {
      const socket = await scriptedPeer(t, helloAck(version, features));
      zygote.setSocket(socket);
      try {
        const refused = (error) => {
          assert.equal(error.code, 'ENOTSUP');
          assert.match(error.message, /the zygote does not offer the feature templates/);
          assert.match(error.message, why);
          return true;
        };
        await within(assert.rejects(zygote.pythonTemplate({ preload: ['json'] }), refused), 20000, 'the refusal');
        await within(assert.rejects(zygote.templates(), refused), 20000, 'the refusal');
        assert.equal((await zygote.hello()).protocolVersion, version, 'the connection still serves');
      } finally {
        zygote.setSocket(null);
      }
    });
}

// Against a real zygote. The template tests need python3 and a zygote
// that offers templates; they skip, saying so, otherwise.
let daemon = null;
let offered = false;
test.before(async () => {
  daemon = await new Daemon().start();
  zygote.setSocket(daemon.socket);
  offered = hasPython() && (await within(zygote.hello(), 20000, 'hello')).features.includes('templates');
});
test.after(async () => {
  zygote.setSocket(null);
  if (daemon) await daemon.stop();
});

function needsTemplates(t) {
  if (offered) return false;
  t.skip(hasPython() ? 'SKIP: the zygote does not offer templates' : 'SKIP: no python3');
  return true;
}

test("a template's child runs -c with its argv, stdout and exit code", async (t) => {
  if (needsTemplates(t)) return;
  zygote.setSocket(daemon.socket);
  const template = await within(zygote.pythonTemplate({ preload: ['json'] }), 90000, 'the template');
  assert.ok(template.pid > 0 && template.handle > 0, JSON.stringify(template));
  const child = template.spawn(['-c', 'import json, sys; print(json.dumps(sys.argv)); sys.exit(3)', 'a', 'b']);
  const { code, stdout } = await finished(child);
  assert.equal(code, 3);
  assert.equal(stdout, '["-c", "a", "b"]\n');
  assert.ok(child.pid > 0 && child.pid !== template.pid);

  const { stdout: env } = await within(promisify(template.execFile)(['-c',
    'import os; print(os.environ.get("ZYGOTE_NODE_TPL"), os.getcwd())'], { env: { ZYGOTE_NODE_TPL: 'child' },
    cwd: os.tmpdir() }), 20000, 'execFile');
  assert.equal(env, `child ${fs.realpathSync(os.tmpdir())}\n`);

  const again = await within(zygote.pythonTemplate({ preload: ['json'] }), 90000, 'the template again');
  assert.equal(again.reused, true);
  assert.equal(again.handle, template.handle);
  const listed = (await within(zygote.templates(), 20000, 'the list')).find((info) => info.handle === template.handle);
  assert.ok(listed, 'the template is listed');
  assert.deepEqual([listed.kind, listed.python, listed.preload, listed.uid], ['python', 'python3', ['json'],
    process.getuid()]);
  assert.ok(listed.forks >= 2, `forks ${listed.forks}`);

  const sleeper = template.spawn(['-c', 'import time; time.sleep(60)'], { stdio: 'ignore' });
  await within(new Promise((resolve) => sleeper.once('spawn', resolve)), 20000, 'the sleeper');
  assert.equal(sleeper.kill('SIGKILL'), true);
  const ended = await finished(sleeper);
  assert.equal(ended.signal, 'SIGKILL');
});

test("a template's child ends on an AbortSignal and on the zygote's timeout", async (t) => {
  if (needsTemplates(t)) return;
  zygote.setSocket(daemon.socket);
  const template = await within(zygote.pythonTemplate({}), 90000, 'the template');
  const controller = new AbortController();
  const aborted = template.spawn(['-c', 'import time; time.sleep(60)'], { stdio: 'ignore', signal: controller.signal });
  await within(new Promise((resolve) => aborted.once('spawn', resolve)), 20000, 'the child');
  const error = new Promise((resolve) => aborted.once('error', resolve));
  controller.abort();
  assert.equal((await within(error, 20000, 'the abort')).name, 'AbortError');
  const exit = await within(new Promise((resolve) => aborted.once('exit', (code, signal) => resolve(signal))), 20000,
    'the exit');
  assert.equal(exit, 'SIGTERM');

  const began = Date.now();
  const timed = template.spawn(['-c', 'import time; time.sleep(60)'], { stdio: 'ignore', zygote: { timeout: 300 } });
  const ended = await within(new Promise((resolve) => timed.once('exit', (code, signal) => resolve(signal))), 20000,
    'the timeout');
  assert.equal(ended, 'SIGTERM');
  assert.ok(Date.now() - began < 15000);
});

test('a preload that raises fails the template with its traceback; a missing interpreter with ENOENT', async (t) => {
  if (needsTemplates(t)) return;
  zygote.setSocket(daemon.socket);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-node-preload-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.writeFileSync(path.join(dir, 'zygote_node_raises.py'), "raise RuntimeError('preload went wrong')\n");
  await within(assert.rejects(zygote.pythonTemplate({ preload: ['zygote_node_raises'],
    env: { ...process.env, PYTHONPATH: dir } }), (error) => {
    assert.equal(error.code, 'EPROTO', error.message);
    assert.match(error.message, /Traceback/);
    assert.match(error.message, /RuntimeError: preload went wrong/);
    assert.deepEqual(error.preload, ['zygote_node_raises']);
    return true;
  }), 90000, 'the failing template');
  await within(assert.rejects(zygote.pythonTemplate({ python: '/nonexistent/python3' }), { code: 'ENOENT' }), 20000,
    'the missing interpreter');
  const { stdout } = await within(promisify(zygote.execFile)('/bin/echo', ['still']), 20000, 'a spawn after');
  assert.equal(stdout, 'still\n');
});

// A module directory with `stamp`, which records the pid of the process
// that imported it: a child prints the pid of the template it came from.
function stampDir(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-node-stamp-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.writeFileSync(path.join(dir, 'stamp.py'), 'import os\nPID = os.getpid()\n');
  return { ...process.env, PYTHONPATH: dir };
}

async function forkedFrom(template) {
  const { code, stdout, stderr } = await finished(template.spawn(['-c', 'import stamp; print(stamp.PID)']));
  assert.equal(code, 0, stderr);
  return Number(stdout);
}

async function gone(pid) {
  const deadline = Date.now() + 20000;
  while (fs.existsSync(`/proc/${pid}`)) {
    assert.ok(Date.now() < deadline, `process ${pid} still exists`);
    await sleep(20);
  }
}

test('a template killed between two spawns: the second spawn runs, from a fresh process', async (t) => {
  if (needsTemplates(t)) return;
  zygote.setSocket(daemon.socket);
  const template = await within(zygote.pythonTemplate({ preload: ['stamp'], env: stampDir(t) }), 90000,
    'the template');
  assert.equal(await forkedFrom(template), template.pid);
  process.kill(template.pid, 'SIGKILL');
  await gone(template.pid);
  const fresh = await forkedFrom(template);
  assert.notEqual(fresh, template.pid);
  const listed = (await within(zygote.templates(), 20000, 'the list')).find((info) => info.handle === template.handle);
  assert.deepEqual([listed.pid, listed.restarts], [fresh, 1]);
});

test('a template the zygote stopped while idle is asked for once more, and the spawn runs', async (t) => {
  if (needsTemplates(t)) return;
  const own = await new Daemon(null, { ZYGOTE_TEMPLATE_IDLE_MS: '2000' }).start();
  zygote.setSocket(own.socket);
  t.after(async () => {
    zygote.setSocket(daemon.socket);
    await own.stop();
  });
  const template = await within(zygote.pythonTemplate({ preload: ['stamp'], env: stampDir(t) }), 90000,
    'the template');
  assert.equal(await forkedFrom(template), template.pid);
  await gone(template.pid);
  assert.deepEqual(await within(zygote.templates(), 20000, 'the list'), [], 'stopped while idle');
  const fresh = await forkedFrom(template);
  assert.notEqual(fresh, template.pid);
  const listed = await within(zygote.templates(), 20000, 'the list');
  assert.equal(listed.length, 1);
  assert.notEqual(listed[0].handle, template.handle, 'requested again, under a new handle');
  assert.equal(listed[0].pid, fresh);
  assert.match(own.log(), /stopping an idle template/);
});

function hasPython() {
  try {
    childProcess.execFileSync('python3', ['-c', '']);
    return true;
  } catch {
    return false;
  }
}
