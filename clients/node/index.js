'use strict';
// The npm package zygote: child_process's spawn, execFile and exec,
// served by the zygote spawn server so that this process never forks.

const native = require('./lib/native');
const { ChildProcess, spawn } = require('./lib/child');
const { execFile, exec } = require('./lib/exec');
const { spawnSync, execFileSync, execSync } = require('./lib/sync');
const { hello } = require('./lib/hello');
const { pythonTemplate, templates, Template } = require('./lib/template');

// Connects to the zygote at `path` from the next spawn on; with no path,
// to $ZYGOTE_SOCKET or the default path.
function setSocket(path) {
  native.setSocket(path);
}

module.exports = {
  spawn, execFile, exec, spawnSync, execFileSync, execSync, ChildProcess, hello, setSocket,
  pythonTemplate, templates, Template,
};

const install = require('./lib/install');

module.exports.install = install.install;
module.exports.uninstall = install.uninstall;
module.exports.lastFallback = install.lastFallback;
