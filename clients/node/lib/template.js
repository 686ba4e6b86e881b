'use strict';
// Warm templates: pythonTemplate() asks the zygote for a Python
// interpreter that has imported a preload list, and the Template's spawn
// and execFile start children that are forks of it, as ChildProcess
// objects like spawn's. Every option is checked here, before anything
// reaches the zygote.

const util = require('node:util');
const native = require('./native');
const errors = require('./errors');
const { hello } = require('./hello');
const { normalize } = require('./options');
const { spawnNormal } = require('./child');
const { execFileWith, promisified } = require('./exec');

const FEATURE = 'templates';
const TEMPLATES_SINCE = 4;
const MAX_PRELOADS = 256;
const MAX_PRELOAD_LENGTH = 256;
// A dotted Python identifier, as the zygote accepts a preload.
const MODULE = /^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$/;
// spawn options a child of a template cannot honour: it is a fork of the
// template, which runs as this process's user, unconfined, as Python.
const REFUSED = ['uid', 'gid', 'sandbox', 'argv0', 'shell'];

function checkPreload(preload) {
  if (preload == null) return [];
  if (!Array.isArray(preload)) throw errors.invalidArgType('options.preload', 'an instance of Array', preload);
  if (preload.length > MAX_PRELOADS) {
    throw errors.outOfRange('options.preload.length', `<= ${MAX_PRELOADS}`, preload.length);
  }
  return preload.map((name, i) => {
    if (typeof name !== 'string') throw errors.invalidArgType(`options.preload[${i}]`, 'of type string', name);
    if (name.length > MAX_PRELOAD_LENGTH) {
      throw errors.invalidArgValue(`options.preload[${i}]`, name, `must be at most ${MAX_PRELOAD_LENGTH} bytes`);
    }
    if (!MODULE.test(name)) {
      throw errors.invalidArgValue(`options.preload[${i}]`, name,
        'must be a module name (dotted identifiers of A-Z, a-z, 0-9 and _)');
    }
    return name;
  });
}

// pythonTemplate's options, checked, as the spec the addon sends.
function templateSpec(options) {
  if (options == null) options = {};
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw errors.invalidArgType('options', 'of type object', options);
  }
  const preload = checkPreload(options.preload);
  let python = options.python == null ? 'python3' : options.python;
  if (typeof python !== 'string') throw errors.invalidArgType('options.python', 'of type string', python);
  if (python.length === 0) throw errors.invalidArgValue('options.python', python, 'cannot be empty');
  // normalize checks env and cwd as spawn does, and the interpreter's name.
  const normal = normalize(python, [], { env: options.env, cwd: options.cwd });
  python = normal.file;
  const { spec } = normal;
  return { python, preload, inheritEnv: spec.inheritEnv, envKeys: spec.envKeys, envValues: spec.envValues,
    cwd: spec.cwd };
}

// The Python arguments of a child: "-c" CODE, "-m" MODULE, or a script.
function checkPythonArgs(args) {
  if (!Array.isArray(args)) throw errors.invalidArgType('args', 'an instance of Array', args);
  const [first] = args;
  if ((first === '-c' || first === '-m') && args.length >= 2) return;
  if (typeof first === 'string' && first !== '' && !first.startsWith('-')) return;
  throw errors.invalidArgValue('args', args, "must begin with '-c', CODE; '-m', MODULE; or a script path");
}

function notOffered(hello) {
  let why = `the zygote does not offer the feature ${FEATURE}`;
  if (hello.protocolVersion < TEMPLATES_SINCE) {
    why += ` (it speaks protocol version ${hello.protocolVersion}; templates need ${TEMPLATES_SINCE})`;
  }
  const error = errors.errnoError(95, 'pythonTemplate', `(${why})`);
  error.message = `zygote: ${why}`;
  return error;
}

// A template the zygote could not find or start, as an Error with the
// errno's code (ENOENT: no interpreter; EPROTO: a preload raised, with
// the traceback in the message, or started a thread; ETIMEDOUT...).
function templateError(spec, errno, message) {
  const error = errno ? errors.errnoError(errno, 'pythonTemplate') : new Error(message);
  error.message = `zygote: python template of ${spec.python} (preload ${spec.preload.join(',')}): ${message}`;
  if (!errno) error.code = 'ERR_ZYGOTE_UNAVAILABLE';
  error.python = spec.python;
  error.preload = spec.preload.slice();
  return error;
}

function request(start, onReply) {
  return new Promise((resolve, reject) => {
    const id = native.register((kind, a, b, message) => {
      native.unref();
      try {
        resolve(onReply(kind, a, b, message));
      } catch (error) {
        reject(error);
      }
    });
    native.ref();
    try {
      start(id);
    } catch (error) {
      native.unregister(id);
      native.unref();
      reject(error);
    }
  });
}

// The addon keeps each template JavaScript holds until its object goes.
const collected = new FinalizationRegistry((key) => native.addon.dropTemplate(key));

class Template {
  // Made by pythonTemplate() from the addon's reply; `key` is the
  // addon's number for the template, which it forgets when this object is
  // collected.
  constructor(spec, reply) {
    Object.defineProperty(this, 'key', { value: reply.key });
    collected.register(this, reply.key);
    /** The interpreter, as asked for. */
    this.python = spec.python;
    /** The modules it preloaded. */
    this.preload = spec.preload.slice();
    /** The zygote's handle for it, as in templates(). */
    this.handle = reply.handle;
    /** The template process's pid. */
    this.pid = reply.pid;
    /** The zygote found it running (started by an earlier request of this user). */
    this.reused = reply.reused;
    // execFile(args[, options][, callback]), as child_process.execFile
    // with the template's child; util.promisify(template.execFile) works
    // as for child_process.execFile.
    const execFile = (args, opts, callback) => execFileWith((file, a, o) => this.spawn(a, o), this.python, args,
      opts, callback);
    Object.defineProperty(execFile, util.promisify.custom, { value: promisified(execFile), enumerable: false });
    Object.defineProperty(this, 'execFile', { value: execFile, enumerable: false });
  }

  // spawn(args[, options]): a child of the template, with `args` what
  // would follow `python` on its command line; a ChildProcess as spawn's.
  spawn(args, options) {
    checkPythonArgs(args);
    if (options != null && typeof options === 'object') {
      for (const key of REFUSED) {
        if (options[key] != null && options[key] !== false) {
          throw errors.invalidArgValue(`options.${key}`, options[key], 'cannot be honoured for a child of a template');
        }
      }
    }
    const normal = normalize(this.python, args, options);
    normal.spec.template = this.key;
    return spawnNormal(normal);
  }
}

// Resolves with a Template once the zygote has one ready: found running,
// or started and done importing `preload` (which takes what the imports
// take; the zygote gives up after its start deadline). Rejects with
// ENOTSUP, before asking, when the zygote does not offer templates.
async function pythonTemplate(options) {
  const spec = templateSpec(options);
  const offered = await hello();
  if (!offered.features.includes(FEATURE)) throw notOffered(offered);
  return request((id) => native.addon.pythonTemplate(id, spec), (kind, a, b, message) => {
    if (kind !== native.TEMPLATE) throw templateError(spec, a, message);
    return new Template(spec, JSON.parse(message));
  });
}

// Resolves with the templates this process's user may see (root: every
// user's): [{ handle, uid, pid, kind, python, preload, forks, restarts,
// ageMs, rssBytes }].
async function templates() {
  const offered = await hello();
  if (!offered.features.includes(FEATURE)) throw notOffered(offered);
  return request((id) => native.addon.listTemplates(id), (kind, a, b, message) => {
    if (kind !== native.TEMPLATES) {
      const error = a ? errors.errnoError(a, 'templates') : new Error(message);
      error.message = `zygote: listing templates: ${message}`;
      throw error;
    }
    return JSON.parse(message);
  });
}

module.exports = { pythonTemplate, templates, Template, checkPythonArgs, templateSpec };
