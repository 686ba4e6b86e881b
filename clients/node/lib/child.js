'use strict';
// ChildProcess: the object spawn() returns, fed by the addon's events.

const EventEmitter = require('node:events');
const net = require('node:net');
const native = require('./native');
const errors = require('./errors');
const { normalize } = require('./options');
const { appliedSandbox } = require('./sandbox');

const kId = Symbol('id');
// EACCES, EAGAIN, EMFILE, ENFILE, ENOENT: the errors Node emits from spawn.
const NODE_SPAWN_ERRNOS = new Set([13, 11, 24, 23, 2]);
const kState = Symbol('state');

function makeSocket(fd, index) {
  // As Node: the child's stdin is written, every other pipe is read
  // (and, beyond fd 2, may be written too).
  return new net.Socket({ fd, readable: index > 0, writable: index === 0 || index > 2 });
}

class ChildProcess extends EventEmitter {
  constructor() {
    super();
    this.pid = undefined;
    this.exitCode = null;
    this.signalCode = null;
    this.killed = false;
    this.connected = false;
    this.spawnfile = undefined;
    this.spawnargs = [];
    this.stdin = null;
    this.stdout = null;
    this.stderr = null;
    this.stdio = [];
    // What confined the child, as the zygote reported it with 'spawn'.
    this.sandbox = null;
    this[kId] = 0;
    this[kState] = {
      running: false, // spawned or spawning, exit not reported yet
      refed: false,
      spawned: false,
      pendingSignals: [],
      closesNeeded: 1,
      closesGot: 0,
      timer: null,
    };
  }

  // Starts the child; called once, by spawn().
  _start(file, args, spec) {
    this.spawnfile = file;
    this.spawnargs = args;
    const state = this[kState];
    const id = native.register((kind, a, b, message) => this._event(kind, a, b, message));
    this[kId] = id;
    let fds;
    try {
      fds = native.addon.spawn(id, spec);
    } catch (error) {
      native.unregister(id);
      const match = /^(\d+):(.*)$/s.exec(error.message);
      if (match) throw errors.errnoError(Number(match[1]), 'spawn');
      throw error;
    }
    state.running = true;
    this.ref();
    this.stdio = fds.map((fd, index) => (fd < 0 ? null : makeSocket(fd, index)));
    [this.stdin, this.stdout, this.stderr] = this.stdio;
    this.stdio.forEach((socket, index) => {
      if (socket === null || index === 0) return;
      state.closesNeeded++;
      socket.on('close', () => this._maybeClose());
    });
  }

  _event(kind, a, b, message) {
    const state = this[kState];
    if (kind === native.SPAWNED) {
      this.pid = a;
      this.sandbox = appliedSandbox(message);
      state.spawned = true;
      this.emit('spawn');
      for (const signal of state.pendingSignals.splice(0)) this._signal(signal);
      return;
    }
    this._finish();
    if (kind === native.EXITED) {
      if (b !== 0) this.signalCode = errors.signalName(b);
      else this.exitCode = a;
      if (this.stdin) this.stdin.destroy();
      this.emit('exit', this.exitCode, this.signalCode);
    } else if (kind === native.FAILED && b === 1) {
      // The program could not be started: as Node, an 'error' and no 'exit'.
      this.exitCode = -a;
      if (this.stdin) this.stdin.destroy();
      // Node's message for the errors libuv reports itself; the zygote's
      // explanation for the others (a cgroup it cannot make, a uid refused).
      const error = errors.errnoError(a, `spawn ${this.spawnfile}`, NODE_SPAWN_ERRNOS.has(a) ? '' : `(${message})`);
      error.path = this.spawnfile;
      error.spawnargs = this.spawnargs.slice(1);
      this.emit('error', error);
    } else {
      // The zygote could not be reached, refused the request, or was lost
      // with the exit status.
      if (this.exitCode === null && this.signalCode === null) this.exitCode = a ? -a : -1;
      if (this.stdin) this.stdin.destroy();
      const error = new Error(message);
      if (kind === native.LOST) error.code = 'ERR_ZYGOTE_LOST';
      else if (b === 0) error.code = 'ERR_ZYGOTE_UNAVAILABLE';
      else error.code = a ? errors.errnoError(a, '').code : 'ERR_ZYGOTE_REFUSED';
      if (a) error.errno = -a;
      error.syscall = `spawn ${this.spawnfile}`;
      error.path = this.spawnfile;
      error.spawnargs = this.spawnargs.slice(1);
      this.emit('error', error);
    }
    process.nextTick(() => this._flushStdio());
    this._maybeClose();
  }

  // The exit is known: the child no longer keeps the loop alive.
  _finish() {
    const state = this[kState];
    state.running = false;
    if (state.timer) clearTimeout(state.timer);
    if (state.refed) {
      state.refed = false;
      native.unref();
    }
  }

  // Streams nobody reads would never end: let them drain, as Node does.
  _flushStdio() {
    for (const stream of this.stdio) {
      if (!stream || !stream.readable || stream.readableFlowing !== null ||
          stream.listenerCount('data') > 0 || stream.listenerCount('readable') > 0) continue;
      stream.resume();
    }
  }

  _maybeClose() {
    const state = this[kState];
    if (++state.closesGot === state.closesNeeded) this.emit('close', this.exitCode, this.signalCode);
  }

  _signal(number) {
    const errno = native.addon.kill(this[kId], number);
    if (errno === 0) {
      if (number !== 0) this.killed = true;
      return true;
    }
    if (errno !== 3 /* ESRCH: already gone */) {
      this.emit('error', errors.errnoError(errno, 'kill'));
    }
    return false;
  }

  kill(signal) {
    const number = signal === 0 ? 0 : errors.signalNumber(signal === undefined ? 'SIGTERM' : signal);
    const state = this[kState];
    if (!state.running) return false;
    if (!state.spawned) {
      // The zygote has not answered yet: signal the child as soon as it does.
      state.pendingSignals.push(number);
      if (number !== 0) this.killed = true;
      return true;
    }
    return this._signal(number);
  }

  ref() {
    const state = this[kState];
    if (state.running && !state.refed) {
      state.refed = true;
      native.ref();
    }
  }

  unref() {
    const state = this[kState];
    if (state.refed) {
      state.refed = false;
      native.unref();
    }
  }

  disconnect() {
    throw errors.unsupported('disconnect a child without an IPC channel');
  }

  [Symbol.dispose]() {
    if (this.exitCode === null && this.signalCode === null) this.kill();
  }
}

function setTimer(child, options) {
  const { timeout } = options;
  if (timeout == null || timeout === 0) return;
  if (!Number.isInteger(timeout) || timeout < 0) {
    throw errors.outOfRange('timeout', 'an unsigned integer', timeout);
  }
  const killSignal = options.killSignal === undefined ? 'SIGTERM' : options.killSignal;
  child[kState].timer = setTimeout(() => child.kill(killSignal), timeout);
  child[kState].timer.unref();
}

function watchAbort(child, options) {
  const { signal } = options;
  if (signal == null) return;
  if (typeof signal !== 'object' || !('aborted' in signal)) {
    throw errors.invalidArgType('options.signal', 'an instance of AbortSignal', signal);
  }
  const killSignal = options.killSignal === undefined ? 'SIGTERM' : options.killSignal;
  const onAbort = () => {
    if (child.kill(killSignal)) child.emit('error', errors.abortError(signal.reason));
  };
  if (signal.aborted) {
    process.nextTick(onAbort);
  } else {
    signal.addEventListener('abort', onAbort, { once: true });
    child.once('exit', () => signal.removeEventListener('abort', onAbort));
    child.once('error', () => signal.removeEventListener('abort', onAbort));
  }
}

function spawn(command, args, options) {
  return spawnNormal(normalize(command, args, options));
}

// Starts a child from a call that normalize() checked (and the caller
// may have completed, as a template does).
function spawnNormal(normal) {
  if (normal.options.killSignal !== undefined) errors.signalNumber(normal.options.killSignal);
  const child = new ChildProcess();
  child._start(normal.file, normal.args, normal.spec);
  setTimer(child, normal.options);
  watchAbort(child, normal.options);
  return child;
}

// instanceof child_process.ChildProcess holds, for code that checks it.
Object.setPrototypeOf(ChildProcess.prototype, require('node:child_process').ChildProcess.prototype);

module.exports = { ChildProcess, spawn, spawnNormal };
