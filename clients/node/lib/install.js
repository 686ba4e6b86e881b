'use strict';
// install(): child_process.spawn, execFile and exec (and their Sync
// forms) go through the zygote
// when it can reproduce the call exactly, and to the originals otherwise,
// with a reason the caller can read. uninstall() puts the originals back.

const childProcess = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const util = require('node:util');
const native = require('./native');
const { spawn } = require('./child');
const { execFile, exec } = require('./exec');
const sync = require('./sync');

const originals = {
  spawn: childProcess.spawn,
  execFile: childProcess.execFile,
  exec: childProcess.exec,
  spawnSync: childProcess.spawnSync,
  execFileSync: childProcess.execFileSync,
  execSync: childProcess.execSync,
};
let installed = null;
let lastFallback = null;

// The socket the addon will connect to, as zygote-client picks it.
function socketPath() {
  if (native.socket) return native.socket;
  if (process.env.ZYGOTE_SOCKET) return process.env.ZYGOTE_SOCKET;
  const runtimeDir = process.env.XDG_RUNTIME_DIR;
  if (process.geteuid() !== 0 && runtimeDir) return path.join(runtimeDir, 'zygote.sock');
  return '/run/zygote/zygote.sock';
}

function stdioEntries(options) {
  const stdio = options && typeof options === 'object' ? options.stdio : undefined;
  if (Array.isArray(stdio)) return stdio;
  return [];
}

// Why the zygote cannot reproduce this call exactly, or null when it can.
function fallbackReason(args) {
  const options = args.find((arg, i) => i > 0 && arg && typeof arg === 'object' && !Array.isArray(arg));
  // Only the zygote can confine a child: the originals would ignore the
  // option and run it unconfined. Such a call is served or refused here.
  if (options && options.sandbox != null) return null;
  for (const entry of stdioEntries(options)) {
    if (entry === 'ipc') return "stdio has 'ipc': the zygote does not give children an IPC channel";
    if (entry && typeof entry === 'object') {
      const fd = typeof entry.fd === 'number' ? entry.fd : (entry._handle || entry.handle || {}).fd;
      if (typeof fd !== 'number' || fd < 0) return 'a stdio stream has no fd (yet) to pass to the zygote';
    }
  }
  // `serialization` only shapes an IPC channel, which was refused above:
  // Node ignores it without one, and execa always passes 'advanced'.
  const socket = socketPath();
  if (!fs.existsSync(socket)) return `no zygote listens at ${socket}`;
  return null;
}

// Whether this call goes to the zygote; reports the reason when not.
function routable(name, args) {
  const reason = fallbackReason(args);
  if (reason === null) return true;
  lastFallback = { api: name, reason };
  if (installed.onFallback) installed.onFallback(reason, name);
  else if (process.env.ZYGOTE_DEBUG) process.stderr.write(`zygote: child_process.${name} not routed: ${reason}\n`);
  return false;
}

function route(name, ours) {
  const original = originals[name];
  return function routed(...args) {
    return routable(name, args) ? ours(...args) : original.apply(this, args);
  };
}

function install(options = {}) {
  if (installed) return;
  installed = { onFallback: options.onFallback || null };
  if (options.socket) native.setSocket(options.socket);
  const routed = {
    spawn: route('spawn', spawn),
    execFile: route('execFile', execFile),
    exec: route('exec', exec),
    spawnSync: route('spawnSync', sync.spawnSync),
    execFileSync: route('execFileSync', sync.execFileSync),
    execSync: route('execSync', sync.execSync),
  };
  for (const name of ['execFile', 'exec']) {
    const promisified = util.promisify.custom;
    const ours = name === 'exec' ? exec : execFile;
    const original = originals[name];
    Object.defineProperty(routed[name], promisified, {
      value: (...args) => (routable(name, args) ? ours : original)[promisified](...args),
    });
  }
  Object.assign(childProcess, routed);
  // ESM named imports of node:child_process follow the module object.
  require('node:module').syncBuiltinESMExports();
}

function uninstall() {
  if (!installed) return;
  Object.assign(childProcess, originals);
  require('node:module').syncBuiltinESMExports();
  installed = null;
}

module.exports = {
  install,
  uninstall,
  lastFallback: () => lastFallback,
};
