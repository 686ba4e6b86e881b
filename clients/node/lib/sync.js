'use strict';
// spawnSync, execFileSync and execSync. They block the calling thread, as
// Node's do; the addon's own thread does the work, so other threads and
// spawns already in flight carry on.

const native = require('./native');
const errors = require('./errors');
const { normalize } = require('./options');
const { appliedSandbox } = require('./sandbox');

function inputBytes(input) {
  if (input == null) return undefined;
  if (typeof input === 'string') return Buffer.from(input);
  if (ArrayBuffer.isView(input)) return Buffer.from(input.buffer, input.byteOffset, input.byteLength);
  throw errors.invalidArgType('options.input', 'of type string or an instance of Buffer, TypedArray, or DataView',
    input);
}

function decode(bytes, encoding) {
  return encoding && encoding !== 'buffer' && Buffer.isEncoding(encoding) ? bytes.toString(encoding) : bytes;
}

function spawnSync(command, args, options) {
  const normal = normalize(command, args, options);
  const opts = normal.options;
  const killSignal = errors.signalNumber(opts.killSignal === undefined ? 'SIGTERM' : opts.killSignal);
  if (opts.timeout != null && (!Number.isInteger(opts.timeout) || opts.timeout < 0)) {
    throw errors.outOfRange('timeout', 'an unsigned integer', opts.timeout);
  }
  const input = inputBytes(opts.input);
  for (let i = 3; i < normal.spec.stdio.length; i++) {
    if (normal.spec.stdio[i].kind === 'pipe') throw errors.unsupported('give spawnSync a pipe beyond fd 2');
  }
  const raw = native.addon.spawnSync(normal.spec, input, {
    timeoutMs: opts.timeout || 0,
    maxBuffer: opts.maxBuffer == null ? 1024 * 1024 : opts.maxBuffer,
    killSignal,
  });
  const piped = (index) => normal.spec.stdio[index].kind === 'pipe';
  const out = piped(1) && raw.stdout ? decode(raw.stdout, opts.encoding) : null;
  const err = piped(2) && raw.stderr ? decode(raw.stderr, opts.encoding) : null;
  const result = {
    pid: raw.pid,
    output: [null, out, err],
    stdout: out,
    stderr: err,
    status: raw.status === undefined || raw.status === null ? null : raw.status,
    signal: raw.signal ? errors.signalName(raw.signal) : null,
    sandbox: appliedSandbox(raw.sandbox),
  };
  const syscall = `spawnSync ${normal.file}`;
  if (raw.errno !== 0 || raw.message) {
    if (raw.who === 1) {
      result.error = errors.errnoError(raw.errno, syscall);
      result.error.path = normal.file;
      result.error.spawnargs = normal.args.slice(1);
    } else {
      result.error = new Error(raw.message);
      result.error.code = raw.who === 0 ? 'ERR_ZYGOTE_UNAVAILABLE' : errors.errnoError(raw.errno || 22, '').code;
    }
  } else if (raw.timedOut) {
    result.error = errors.errnoError(110, syscall); // ETIMEDOUT, as Node
    result.error.path = normal.file;
    result.error.spawnargs = normal.args.slice(1);
  } else if (raw.overflowed) {
    result.error = errors.errnoError(105, syscall); // ENOBUFS, as Node
    result.error.path = normal.file;
    result.error.spawnargs = normal.args.slice(1);
  }
  return result;
}

// Node's checkExecSyncError: the error execFileSync and execSync throw.
function checkExecSyncError(result, args, cmd) {
  let error;
  if (result.error) {
    error = result.error;
    Object.assign(error, result);
  } else if (result.status !== 0) {
    let message = 'Command failed: ';
    message += cmd || args.join(' ');
    if (result.stderr && result.stderr.length > 0) message += `\n${result.stderr.toString()}`;
    error = Object.assign(new Error(message), result);
  }
  return error;
}

function execFileSync(file, args, options) {
  if (!Array.isArray(args) && args != null && typeof args === 'object') {
    options = args;
    args = [];
  }
  const opts = { ...(options || {}) };
  const inheritStderr = !opts.stdio;
  const result = spawnSync(file, args || [], opts);
  if (inheritStderr && result.stderr) process.stderr.write(result.stderr);
  const error = checkExecSyncError(result, [file, ...(args || [])], undefined);
  if (error) throw error;
  return result.stdout;
}

function execSync(command, options) {
  const opts = { ...(options || {}) };
  opts.shell = typeof opts.shell === 'string' ? opts.shell : true;
  const inheritStderr = !opts.stdio;
  const result = spawnSync(command, [], opts);
  if (inheritStderr && result.stderr) process.stderr.write(result.stderr);
  const error = checkExecSyncError(result, [], command);
  if (error) throw error;
  return result.stdout;
}

module.exports = { spawnSync, execFileSync, execSync };
