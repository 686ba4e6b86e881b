'use strict';
// Loads the addon and routes its events to the children by id.

const path = require('node:path');

const fs = require('node:fs');

// The per-platform package a release would list in optionalDependencies
// (the napi-rs convention), e.g. zygote-linux-x64-gnu.
function platformPackage() {
  const libc = process.report && process.report.getReport().header.glibcVersionRuntime ? 'gnu' : 'musl';
  return `zygote-${process.platform}-${process.arch}-${libc}`;
}

// ZYGOTE_NODE_ADDON, else the addon built at install, else the
// per-platform package's.
function load() {
  if (process.env.ZYGOTE_NODE_ADDON) return require(process.env.ZYGOTE_NODE_ADDON);
  const built = path.join(__dirname, '..', 'zygote.node');
  if (fs.existsSync(built)) return require(built);
  try {
    return require(platformPackage());
  } catch (error) {
    throw new Error(`zygote: no native addon: ${built} was not built (npm rebuild zygote, with cargo) `
      + `and ${platformPackage()} is not installed (${error.message})`);
  }
}

const addon = load();

// Event kinds, as the addon numbers them.
const SPAWNED = 0;
const FAILED = 1;
const EXITED = 2;
const LOST = 3;
const HELLO = 4;
const TEMPLATE = 5;
const TEMPLATES = 6;

const handlers = new Map();
let nextId = 1;
let refs = 0;

addon.init((id, kind, a, b, message) => {
  const handler = handlers.get(id);
  if (handler === undefined) return;
  if (kind !== SPAWNED) handlers.delete(id);
  handler(kind, a, b, message);
});

// Registers a handler for the events of one request; returns its id.
function register(handler) {
  const id = nextId;
  nextId = nextId >= 0xffffffff ? 1 : nextId + 1;
  handlers.set(id, handler);
  return id;
}

function unregister(id) {
  handlers.delete(id);
}

// Counts what keeps the event loop alive: a running, ref'd child.
function ref() {
  if (refs++ === 0) addon.setRef(true);
}

function unref() {
  if (--refs === 0) addon.setRef(false);
}

// Connects to the zygote at `path` from the next spawn on.
function setSocket(path) {
  module.exports.socket = path == null ? null : String(path);
  addon.setSocket(module.exports.socket);
}

module.exports = {
  platformPackage,
  // The socket set with setSocket(), if any.
  socket: null,
  setSocket,
  addon, register, unregister, ref, unref,
  SPAWNED, FAILED, EXITED, LOST, HELLO, TEMPLATE, TEMPLATES,
};
