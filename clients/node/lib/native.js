'use strict';
// Loads the addon and routes its events to the children by id.

const path = require('node:path');

const addonPath = process.env.ZYGOTE_NODE_ADDON || path.join(__dirname, '..', 'zygote.node');
const addon = require(addonPath);

// Event kinds, as the addon numbers them.
const SPAWNED = 0;
const FAILED = 1;
const EXITED = 2;
const LOST = 3;
const HELLO = 4;

const handlers = new Map();
let nextId = 1;
let refs = 0;

addon.init((id, kind, a, b, message) => {
  const handler = handlers.get(id);
  if (handler === undefined) return;
  if (kind === EXITED || kind === LOST || kind === FAILED || kind === HELLO) handlers.delete(id);
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
  // The socket set with setSocket(), if any.
  socket: null,
  setSocket,
  addon, register, unregister, ref, unref,
  SPAWNED, FAILED, EXITED, LOST, HELLO,
};
