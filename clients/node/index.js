'use strict';
// The npm package zygote: child_process's spawn, execFile and exec,
// served by the zygote spawn server so that this process never forks.

const native = require('./lib/native');
const { ChildProcess, spawn } = require('./lib/child');
const { execFile, exec } = require('./lib/exec');
const { spawnSync, execFileSync, execSync } = require('./lib/sync');

// The zygote's hello: { protocolVersion, features, serverVersion }.
function hello() {
  return new Promise((resolve, reject) => {
    const id = native.register((kind, a, b, message) => {
      native.unref();
      if (kind === native.HELLO) resolve(JSON.parse(message));
      else reject(Object.assign(new Error(message), { errno: -a }));
    });
    native.ref();
    native.addon.hello(id);
  });
}

// Connects to the zygote at `path` from the next spawn on; with no path,
// to $ZYGOTE_SOCKET or the default path.
function setSocket(path) {
  native.setSocket(path);
}

module.exports = {
  spawn, execFile, exec, spawnSync, execFileSync, execSync, ChildProcess, hello, setSocket,
};

const install = require('./lib/install');

module.exports.install = install.install;
module.exports.uninstall = install.uninstall;
module.exports.lastFallback = install.lastFallback;
