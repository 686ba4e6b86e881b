'use strict';
// Checks a spawn call as Node's normalizeSpawnArguments does, and turns it
// into the plan the addon sends. Everything here throws before anything
// reaches the zygote, so a bad call never touches the shared connection.

const { URL, fileURLToPath } = require('node:url');
const errors = require('./errors');
const { sandboxPlan } = require('./sandbox');

const MAX_ID = 0xffffffff;

function checkNul(value, name) {
  if (value.includes('\u0000')) {
    throw errors.invalidArgValue(name, value, 'must be a string without null bytes');
  }
}

function checkBool(options, key) {
  const value = options[key];
  if (value != null && typeof value !== 'boolean') {
    throw errors.invalidArgType(`options.${key}`, 'of type boolean', value);
  }
}

function checkId(options, key) {
  const value = options[key];
  if (value == null) return undefined;
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw errors.invalidArgType(`options.${key}`, 'int32', value);
  }
  if (value < 0 || value > MAX_ID) {
    throw errors.outOfRange(`options.${key}`, `>= 0 && <= ${MAX_ID}`, value);
  }
  return value;
}

function validPath(value, name) {
  if (value instanceof URL) return fileURLToPath(value);
  if (Buffer.isBuffer(value)) value = value.toString();
  if (typeof value !== 'string') {
    throw errors.invalidArgType(name, 'of type string or an instance of Buffer or URL', value);
  }
  checkNul(value, name);
  return value;
}

// The command, its args and options, as spawn(command[, args][, options]) takes them.
function splitArgs(file, args, options) {
  if (typeof file !== 'string') throw errors.invalidArgType('file', 'of type string', file);
  if (file.length === 0) throw errors.invalidArgValue('file', file, 'cannot be empty');
  checkNul(file, 'file');
  if (Array.isArray(args)) {
    args = args.slice();
  } else if (args == null) {
    args = [];
  } else if (typeof args !== 'object') {
    throw errors.invalidArgType('args', 'an instance of Array', args);
  } else {
    options = args;
    args = [];
  }
  if (options === undefined || options === null) options = {};
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw errors.invalidArgType('options', 'of type object', options);
  }
  return { file, args, options };
}

// The environment the child gets: with no options.env, this process's,
// which the addon reads itself (process.env writes go to the real
// environment); otherwise exactly the object's own and inherited
// enumerable keys whose value is not undefined, as Node takes them.
function envPairs(options) {
  const keys = [];
  const values = [];
  if (options.env == null) return { inherit: true, keys, values };
  // eslint-disable-next-line guard-for-in
  for (const key in options.env) {
    const value = options.env[key];
    if (value === undefined) continue;
    checkNul(key, `options.env['${key}']`);
    checkNul(String(value), `options.env['${key}']`);
    keys.push(key);
    values.push(String(value));
  }
  return { inherit: false, keys, values };
}

function stdioEntry(entry, index) {
  if (entry == null) entry = index < 3 ? 'pipe' : 'ignore';
  if (entry === 'pipe' || entry === 'overlapped') return { kind: 'pipe' };
  if (entry === 'ignore') return { kind: 'ignore' };
  if (entry === 'inherit') return { kind: 'inherit' };
  if (entry === 'ipc') throw errors.unsupported("give a child an IPC channel ('ipc' in stdio)");
  if (typeof entry === 'number') {
    if (!Number.isInteger(entry) || entry < 0) throw errors.invalidArgValue('stdio', entry);
    return { kind: 'fd', fd: entry };
  }
  if (typeof entry === 'object') {
    if (typeof entry.fd === 'number' && entry.fd >= 0) return { kind: 'fd', fd: entry.fd };
    const handle = entry._handle || entry.handle;
    if (handle && typeof handle.fd === 'number' && handle.fd >= 0) return { kind: 'fd', fd: handle.fd };
  }
  throw errors.invalidArgValue('stdio', entry);
}

function stdioEntries(stdio) {
  if (stdio == null) stdio = 'pipe';
  if (typeof stdio === 'string') {
    if (!['pipe', 'overlapped', 'ignore', 'inherit'].includes(stdio)) {
      throw errors.invalidArgValue('stdio', stdio);
    }
    stdio = [stdio, stdio, stdio];
  } else if (!Array.isArray(stdio)) {
    throw errors.invalidArgValue('stdio', stdio);
  } else {
    stdio = stdio.slice();
  }
  while (stdio.length < 3) stdio.push(undefined);
  return stdio.map(stdioEntry);
}

function checkOptional(options, key, type) {
  const value = options[key];
  if (value != null && typeof value !== type) {
    throw errors.invalidArgType(`options.${key}`, `of type ${type}`, value);
  }
}

function zygoteOptions(options) {
  const own = options.zygote;
  if (own == null) return {};
  if (typeof own !== 'object') throw errors.invalidArgType('options.zygote', 'of type object', own);
  const plan = {};
  if (own.killOnClose != null && own.killOnClose !== false) {
    plan.killOnClose = errors.signalNumber(own.killOnClose === true ? 'SIGKILL' : own.killOnClose);
  }
  for (const [key, field, max] of [['timeout', 'timeoutMs', MAX_ID], ['pidsMax', 'pidsMax', MAX_ID],
    ['memoryMax', 'memoryMax', Number.MAX_SAFE_INTEGER]]) {
    const value = own[key];
    if (value == null) continue;
    if (typeof value !== 'number' || !Number.isInteger(value)) {
      throw errors.invalidArgType(`options.zygote.${key}`, 'an integer', value);
    }
    if (value < 0 || value > max) throw errors.outOfRange(`options.zygote.${key}`, `>= 0 && <= ${max}`, value);
    plan[field] = value;
  }
  return plan;
}

// spawn's arguments, checked, as { file, args (argv), spec, options }.
function normalize(command, argsIn, optionsIn) {
  let { file, args, options } = splitArgs(command, argsIn, optionsIn);
  args.forEach((arg, i) => {
    if (typeof arg !== 'string') throw errors.invalidArgType(`args[${i}]`, 'of type string', arg);
    checkNul(arg, `args[${i}]`);
  });
  const cwd = options.cwd == null ? undefined : validPath(options.cwd, 'options.cwd');
  checkBool(options, 'detached');
  checkBool(options, 'windowsHide');
  checkBool(options, 'windowsVerbatimArguments');
  checkOptional(options, 'argv0', 'string');
  if (options.shell != null && typeof options.shell !== 'boolean' && typeof options.shell !== 'string') {
    throw errors.invalidArgType('options.shell', 'of type boolean or string', options.shell);
  }
  if (options.argv0 != null) checkNul(options.argv0, 'options.argv0');
  if (typeof options.shell === 'string') checkNul(options.shell, 'options.shell');
  const uid = checkId(options, 'uid');
  const gid = checkId(options, 'gid');
  if (options.env != null && typeof options.env !== 'object') {
    throw errors.invalidArgType('options.env', 'of type object', options.env);
  }
  if (options.shell) {
    const line = [file, ...args].join(' ');
    file = typeof options.shell === 'string' ? options.shell : '/bin/sh';
    args = ['-c', line];
  }
  args.unshift(typeof options.argv0 === 'string' ? options.argv0 : file);
  const stdio = stdioEntries(options.stdio);
  const env = envPairs(options);
  const spec = {
    file,
    args,
    inheritEnv: env.inherit,
    envKeys: env.keys,
    envValues: env.values,
    cwd,
    stdio,
    detached: Boolean(options.detached),
    uid,
    gid,
    ...zygoteOptions(options),
    sandbox: sandboxPlan(options.sandbox),
  };
  return { file, args, spec, options };
}

module.exports = { normalize, stdioEntries };
