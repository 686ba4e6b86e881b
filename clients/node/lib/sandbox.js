'use strict';
// The `sandbox` option: checked field by field against its wire type
// (absolute paths without NUL bytes, u16 ports, strings without NUL
// bytes), and turned into the plan the addon maps onto the request. Every
// check throws before anything reaches the zygote.

const errors = require('./errors');

const MOUNT_TYPES = ['ro', 'rw', 'tmpfs'];
const NETWORKS = ['host', 'none'];
const SANDBOX_KEYS = new Set(['profile', 'mounts', 'network', 'isolate', 'hostname', 'seccomp', 'seccompFilter',
  'landlock']);
const LANDLOCK_KEYS = new Set(['readOnly', 'readExecute', 'readWrite', 'tcpBind', 'tcpConnect', 'require']);

function checkObject(value, name) {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw errors.invalidArgType(name, 'of type object', value);
  }
}

function checkKeys(value, known, name) {
  for (const key of Object.keys(value)) {
    if (!known.has(key)) throw errors.invalidArgValue(`${name}.${key}`, value[key], 'is not a known field');
  }
}

// A lone surrogate (with the u flag, a pair is one code point and does
// not match): it has no UTF-8 form, so the daemon would read another string.
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;

function text(value, name) {
  if (value == null) return undefined;
  if (typeof value !== 'string') throw errors.invalidArgType(name, 'of type string', value);
  if (value.includes('\u0000')) throw errors.invalidArgValue(name, value, 'must be a string without null bytes');
  if (LONE_SURROGATE.test(value)) throw errors.invalidArgValue(name, value, 'must be well-formed Unicode');
  return value;
}

function absolutePath(value, name) {
  if (Buffer.isBuffer(value)) {
    const text = value.toString();
    // The addon carries paths as strings: a path that is not UTF-8 would
    // arrive as another path.
    if (!Buffer.from(text).equals(value)) throw errors.invalidArgValue(name, value, 'must be valid UTF-8');
    value = text;
  }
  if (typeof value !== 'string') throw errors.invalidArgType(name, 'of type string or an instance of Buffer', value);
  if (value.length === 0) throw errors.invalidArgValue(name, value, 'must be an absolute path');
  if (value.includes('\u0000')) throw errors.invalidArgValue(name, value, 'must be a string without null bytes');
  if (!value.startsWith('/')) throw errors.invalidArgValue(name, value, 'must be an absolute path');
  if (LONE_SURROGATE.test(value)) throw errors.invalidArgValue(name, value, 'must be well-formed Unicode');
  return value;
}

function list(value, name, each) {
  if (value == null) return [];
  if (!Array.isArray(value)) throw errors.invalidArgType(name, 'an instance of Array', value);
  return value.map((item, i) => each(item, `${name}[${i}]`));
}

function port(value, name) {
  if (typeof value !== 'number' || !Number.isInteger(value)) throw errors.invalidArgType(name, 'an integer', value);
  if (value < 0 || value > 0xffff) throw errors.outOfRange(name, '>= 0 && <= 65535', value);
  return value;
}

function bool(value, name) {
  if (value == null) return false;
  if (typeof value !== 'boolean') throw errors.invalidArgType(name, 'of type boolean', value);
  return value;
}

function mount(value, name) {
  checkObject(value, name);
  if (!MOUNT_TYPES.includes(value.type)) {
    throw errors.invalidArgValue(`${name}.type`, value.type, "must be one of: 'ro', 'rw', 'tmpfs'");
  }
  if (value.type === 'tmpfs') {
    if (value.source != null) throw errors.invalidArgValue(`${name}.source`, value.source, 'must be absent for tmpfs');
    return { kind: 'tmpfs', destination: absolutePath(value.destination, `${name}.destination`) };
  }
  const source = absolutePath(value.source, `${name}.source`);
  const destination = value.destination == null ? source : absolutePath(value.destination, `${name}.destination`);
  return { kind: value.type, source, destination };
}

function landlock(value, name) {
  checkObject(value, name);
  checkKeys(value, LANDLOCK_KEYS, name);
  return {
    readOnly: list(value.readOnly, `${name}.readOnly`, absolutePath),
    readExecute: list(value.readExecute, `${name}.readExecute`, absolutePath),
    readWrite: list(value.readWrite, `${name}.readWrite`, absolutePath),
    tcpBind: list(value.tcpBind, `${name}.tcpBind`, port),
    tcpConnect: list(value.tcpConnect, `${name}.tcpConnect`, port),
    require: bool(value.require, `${name}.require`),
  };
}

// options.sandbox as the addon's SandboxPlan, or undefined without one.
function sandboxPlan(sandbox) {
  if (sandbox == null) return undefined;
  const name = 'options.sandbox';
  checkObject(sandbox, name);
  checkKeys(sandbox, SANDBOX_KEYS, name);
  const network = sandbox.network == null ? 'host' : sandbox.network;
  if (!NETWORKS.includes(network)) {
    throw errors.invalidArgValue(`${name}.network`, network, "must be one of: 'host', 'none'");
  }
  const isolate = bool(sandbox.isolate, `${name}.isolate`);
  const hostname = text(sandbox.hostname, `${name}.hostname`);
  if (hostname !== undefined && !isolate) {
    throw errors.invalidArgValue(`${name}.hostname`, hostname, 'needs options.sandbox.isolate');
  }
  const seccomp = text(sandbox.seccomp, `${name}.seccomp`);
  const seccompFilter = text(sandbox.seccompFilter, `${name}.seccompFilter`);
  if (seccomp !== undefined && seccompFilter !== undefined) {
    throw errors.invalidArgValue(`${name}.seccompFilter`, seccompFilter, 'cannot be given with options.sandbox.seccomp');
  }
  return {
    profile: text(sandbox.profile, `${name}.profile`),
    mounts: sandbox.mounts == null ? undefined : list(sandbox.mounts, `${name}.mounts`, mount),
    networkNone: network === 'none',
    isolate,
    hostname,
    seccomp,
    seccompFilter,
    landlock: sandbox.landlock == null ? undefined : landlock(sandbox.landlock, `${name}.landlock`),
  };
}

// The applied sandbox the addon reports with 'spawn' (JSON), as the
// object child.sandbox holds; null when nothing confined the child.
function appliedSandbox(json) {
  if (!json) return null;
  const wire = JSON.parse(json);
  return {
    profile: wire.profile,
    namespaces: wire.namespaces,
    seccomp: wire.seccomp,
    landlockAbi: wire.landlock_abi,
    landlockComplete: wire.landlock_complete,
  };
}

module.exports = { sandboxPlan, appliedSandbox };
