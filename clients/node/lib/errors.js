'use strict';
// Errors shaped as Node's own (code, errno, syscall, path, spawnargs).

const util = require('node:util');
const os = require('node:os');

function describe(value) {
  if (value == null) return ` Received ${value}`;
  if (typeof value === 'function') return ` Received function ${value.name || '<anonymous>'}`;
  if (typeof value === 'object') {
    if (value.constructor && value.constructor.name) {
      return ` Received an instance of ${value.constructor.name}`;
    }
    return ` Received ${util.inspect(value, { depth: -1 })}`;
  }
  let shown = util.inspect(value, { colors: false });
  if (shown.length > 28) shown = `${shown.slice(0, 25)}...`;
  return ` Received type ${typeof value} (${shown})`;
}

function withCode(error, code) {
  error.code = code;
  // Node's own show the code after the name: "TypeError [ERR_...]: ...".
  error.stack = error.stack.replace(/^(\w+)/, `$1 [${code}]`);
  Object.defineProperty(error, 'toString', {
    value() { return `${this.name} [${code}]: ${this.message}`; },
    configurable: true,
    writable: true,
  });
  return error;
}

function invalidArgType(name, expected, value) {
  const noun = name.includes('.') ? 'property' : 'argument';
  return withCode(
    new TypeError(`The "${name}" ${noun} must be ${expected}.${describe(value)}`),
    'ERR_INVALID_ARG_TYPE',
  );
}

function invalidArgValue(name, value, reason = 'is invalid') {
  const noun = name.includes('.') || name.includes('[') ? 'property' : 'argument';
  return withCode(
    new TypeError(`The ${noun} '${name}' ${reason}. Received ${util.inspect(value)}`),
    'ERR_INVALID_ARG_VALUE',
  );
}

function outOfRange(name, range, value) {
  return withCode(
    new RangeError(`The value of "${name}" is out of range. It must be ${range}. Received ${util.inspect(value)}`),
    'ERR_OUT_OF_RANGE',
  );
}

function unknownSignal(signal) {
  return withCode(new TypeError(`Unknown signal: ${signal}`), 'ERR_UNKNOWN_SIGNAL');
}

function unsupported(what) {
  return withCode(new Error(`zygote cannot ${what}`), 'ERR_ZYGOTE_UNSUPPORTED');
}

// An error as libuv's, from a positive errno: "spawn ls ENOENT".
function errnoError(errno, syscall, detail) {
  const negative = -Math.abs(errno);
  let code;
  try {
    code = util.getSystemErrorName(negative);
  } catch {
    code = 'UNKNOWN';
  }
  const error = new Error(`${syscall} ${code}${detail ? ` ${detail}` : ''}`);
  error.errno = negative;
  error.code = code;
  error.syscall = syscall;
  return error;
}

function abortError(reason) {
  const error = new Error('The operation was aborted', reason === undefined ? undefined : { cause: reason });
  error.name = 'AbortError';
  error.code = 'ABORT_ERR';
  return error;
}

const signalNumbers = os.constants.signals;
const signalNames = new Map(Object.entries(signalNumbers).map(([name, number]) => [number, name]));

// A signal name or number as its number; throws ERR_UNKNOWN_SIGNAL.
function signalNumber(signal) {
  if (typeof signal === 'number') {
    if (signalNames.has(signal) || signal === 0) return signal;
    throw unknownSignal(signal);
  }
  if (typeof signal === 'string') {
    const number = signalNumbers[signal.toUpperCase()];
    if (number !== undefined) return number;
    throw unknownSignal(signal);
  }
  throw invalidArgType('signal', 'of type string or number', signal);
}

function signalName(number) {
  return signalNames.get(number) || null;
}

module.exports = {
  invalidArgType, invalidArgValue, outOfRange, unknownSignal, unsupported,
  errnoError, abortError, signalNumber, signalName,
};
