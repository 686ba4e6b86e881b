'use strict';
// A real zygote daemon on a temporary socket, for the tests of one file.

const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const REPO = path.join(__dirname, '..', '..', '..');

function zygoteBin() {
  const binary = process.env.ZYGOTE_BIN || path.join(REPO, 'target', 'debug', 'zygote');
  try {
    fs.accessSync(binary, fs.constants.X_OK);
  } catch {
    throw new Error(`no zygote binary at ${binary}: run \`cargo build\` or set ZYGOTE_BIN`);
  }
  return binary;
}

// Rejects when `promise` has not settled within `ms`.
function within(promise, ms, what) {
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

class Daemon {
  constructor(directory, env = {}) {
    this.directory = directory || fs.mkdtempSync(path.join(os.tmpdir(), 'zygote-node-'));
    this.socket = path.join(this.directory, 'zygote.sock');
    this.logPath = path.join(this.directory, 'zygote.log');
    this.env = env;
    this.process = null;
  }

  async start() {
    try {
      fs.unlinkSync(this.socket);
    } catch {
      // not there yet
    }
    const log = fs.openSync(this.logPath, 'a');
    this.process = childProcess.spawn(
      zygoteBin(),
      ['serve', '--socket', this.socket, '--stop-timeout', '2'],
      { stdio: ['ignore', log, log], env: { ...process.env, ZYGOTE_LOG: 'debug', ...this.env } },
    );
    fs.closeSync(log);
    const deadline = Date.now() + 20000;
    while (!fs.existsSync(this.socket)) {
      if (this.process.exitCode !== null || Date.now() > deadline) {
        throw new Error(`zygote did not start; its log:\n${this.log()}`);
      }
      await sleep(20);
    }
    return this;
  }

  log() {
    try {
      return fs.readFileSync(this.logPath, 'utf8');
    } catch {
      return '';
    }
  }

  async kill(signal = 'SIGKILL') {
    const daemon = this.process;
    if (!daemon || daemon.exitCode !== null || daemon.signalCode !== null) return;
    const gone = new Promise((resolve) => daemon.once('exit', resolve));
    daemon.kill(signal);
    await within(gone, 15000, 'the zygote to exit');
  }

  async stop() {
    await this.kill('SIGTERM').catch(() => this.kill('SIGKILL'));
    fs.rmSync(this.directory, { recursive: true, force: true });
  }
}

// Starts a daemon for this test file, before its tests, and points the
// package at it; stops it after them. Returns a holder whose .daemon is set.
function sharedDaemon() {
  const { before, after } = require('node:test');
  const zygote = require('..');
  const holder = { daemon: null };
  before(async () => {
    holder.daemon = await new Daemon().start();
    zygote.setSocket(holder.daemon.socket);
  });
  after(async () => {
    if (holder.daemon) await holder.daemon.stop();
  });
  return holder;
}

// Resolves with [code, signal] at 'close', with everything read.
function finished(child, ms = 20000) {
  const out = [];
  const err = [];
  if (child.stdout) child.stdout.on('data', (chunk) => out.push(chunk));
  if (child.stderr) child.stderr.on('data', (chunk) => err.push(chunk));
  const closed = new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => resolve({
      code, signal, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(),
    }));
  });
  return within(closed, ms, `the child ${child.spawnfile} to close`);
}

module.exports = { REPO, Daemon, sharedDaemon, within, sleep, finished, zygoteBin };
