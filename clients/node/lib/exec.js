'use strict';
// execFile and exec, with their callbacks and util.promisify forms.

const util = require('node:util');
const { spawn } = require('./child');
const errors = require('./errors');

const DEFAULTS = {
  encoding: 'utf8',
  timeout: 0,
  maxBuffer: 1024 * 1024,
  killSignal: 'SIGTERM',
};

function maxBufferError(name) {
  const error = new RangeError(`${name} maxBuffer length exceeded`);
  error.code = 'ERR_CHILD_PROCESS_STDIO_MAXBUFFER';
  return error;
}

// execFile(file[, args][, options][, callback]) as Node splits it.
function splitExecFileArgs(file, args, options, callback) {
  if (typeof args === 'function') {
    callback = args;
    args = [];
    options = undefined;
  } else if (!Array.isArray(args) && args != null && typeof args === 'object') {
    callback = options;
    options = args;
    args = [];
  } else if (typeof options === 'function') {
    callback = options;
    options = undefined;
  }
  if (callback != null && typeof callback !== 'function') {
    throw errors.invalidArgType('callback', 'of type function', callback);
  }
  return { file, args: args == null ? [] : args, options: { ...DEFAULTS, ...(options || {}) }, callback };
}

function collect(stream, name, state, onOverflow) {
  if (!stream) return [];
  const chunks = [];
  stream.on('data', (chunk) => {
    state.sizes[name] += chunk.length;
    if (state.sizes[name] > state.maxBuffer) {
      const room = state.maxBuffer - (state.sizes[name] - chunk.length);
      if (room > 0) chunks.push(chunk.subarray(0, room));
      onOverflow(maxBufferError(name));
      return;
    }
    chunks.push(chunk);
  });
  return chunks;
}

function decode(chunks, encoding) {
  const bytes = Buffer.concat(chunks);
  return encoding && encoding !== 'buffer' && Buffer.isEncoding(encoding) ? bytes.toString(encoding) : bytes;
}

function execFile(fileIn, argsIn, optionsIn, callbackIn) {
  return execFileWith(spawn, fileIn, argsIn, optionsIn, callbackIn);
}

// execFile with the child started by start(file, args, options), which
// spawn is for execFile and a template's spawn for its execFile.
function execFileWith(start, fileIn, argsIn, optionsIn, callbackIn) {
  const { file, args, options, callback } = splitExecFileArgs(fileIn, argsIn, optionsIn, callbackIn);
  const child = start(file, args, {
    ...options,
    // execFile keeps its own timer and signal handling, as Node's does.
    timeout: undefined,
    signal: undefined,
  });
  const state = { sizes: { stdout: 0, stderr: 0 }, maxBuffer: options.maxBuffer };
  let error = null;
  let exited = false;
  let killed = false;
  let timer = null;

  const kill = () => {
    if (child.stdout) child.stdout.destroy();
    if (child.stderr) child.stderr.destroy();
    killed = true;
    try {
      child.kill(options.killSignal);
    } catch (caught) {
      error = caught;
      finish();
    }
  };
  const overflow = (caught) => {
    if (!error) error = caught;
    kill();
  };
  const out = collect(child.stdout, 'stdout', state, overflow);
  const err = collect(child.stderr, 'stderr', state, overflow);

  function finish(code, signal) {
    if (exited) return;
    exited = true;
    if (timer) clearTimeout(timer);
    if (!callback) return;
    const stdout = decode(out, options.encoding);
    const stderr = decode(err, options.encoding);
    if (!error && code === 0 && signal === null) {
      callback(null, stdout, stderr);
      return;
    }
    const cmd = args.length ? `${file} ${args.join(' ')}` : file;
    if (!error) {
      error = new Error(`Command failed: ${cmd}\n${stderr}`);
      error.code = code < 0 ? util.getSystemErrorName(code) : code;
      error.killed = child.killed || killed;
      error.signal = signal;
    }
    error.cmd = cmd;
    callback(error, stdout, stderr);
  }

  if (options.timeout > 0) timer = setTimeout(kill, options.timeout);
  if (options.signal) {
    const onAbort = () => {
      error = errors.abortError(options.signal.reason);
      kill();
    };
    if (options.signal.aborted) process.nextTick(onAbort);
    else {
      options.signal.addEventListener('abort', onAbort, { once: true });
      child.once('close', () => options.signal.removeEventListener('abort', onAbort));
    }
  }
  child.addListener('close', finish);
  child.addListener('error', (caught) => {
    if (!error) error = caught;
    if (child.stdout) child.stdout.destroy();
    if (child.stderr) child.stderr.destroy();
    finish();
  });
  return child;
}

function exec(command, options, callback) {
  if (typeof options === 'function') {
    callback = options;
    options = undefined;
  }
  const opts = { ...(options || {}) };
  opts.shell = typeof opts.shell === 'string' ? opts.shell : true;
  return execFile(command, opts, callback);
}

// util.promisify(execFile) and (exec): { stdout, stderr }, or an error
// carrying them; the promise has the child as .child, as Node's.
function promisified(original) {
  return (...args) => {
    let child;
    const promise = new Promise((resolve, reject) => {
      child = original(...args, (error, stdout, stderr) => {
        if (error) {
          error.stdout = stdout;
          error.stderr = stderr;
          reject(error);
        } else {
          resolve({ stdout, stderr });
        }
      });
    });
    promise.child = child;
    return promise;
  };
}

Object.defineProperty(execFile, util.promisify.custom, { value: promisified(execFile), enumerable: false });
Object.defineProperty(exec, util.promisify.custom, { value: promisified(exec), enumerable: false });

module.exports = { execFile, exec, execFileWith, promisified };
