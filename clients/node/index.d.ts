// Types of the npm package zygote: child_process's spawn, execFile and
// exec, served by the zygote spawn server.

/// <reference types="node" />

import { EventEmitter } from 'node:events';
import { Readable, Writable, Stream } from 'node:stream';
import { URL } from 'node:url';

export type StdioEntry = 'pipe' | 'overlapped' | 'ignore' | 'inherit' | number | Stream | null | undefined;
export type StdioOptions = 'pipe' | 'overlapped' | 'ignore' | 'inherit' | StdioEntry[];

/** zygote's own options, beyond child_process's. */
export interface ZygoteOptions {
  /** The signal the zygote sends the child when this process's connection
   * closes (e.g. this process died); `true` means SIGKILL. */
  killOnClose?: boolean | NodeJS.Signals | number;
  /** A limit the zygote enforces, in ms: SIGTERM, then SIGKILL after 5 s. */
  timeout?: number;
  /** cgroup memory.max of the child's tree, in bytes. */
  memoryMax?: number;
  /** cgroup pids.max of the child's tree. */
  pidsMax?: number;
}

/** One mount of a sandbox's filesystem view. */
export type SandboxMount =
  | { type: 'ro' | 'rw'; source: string | Buffer; destination?: string | Buffer }
  | { type: 'tmpfs'; destination: string | Buffer };

/** Landlock rules: the only paths, and TCP ports, the child may use. */
export interface LandlockOptions {
  readOnly?: Array<string | Buffer>;
  readExecute?: Array<string | Buffer>;
  readWrite?: Array<string | Buffer>;
  tcpBind?: number[];
  tcpConnect?: number[];
  /** Refuse the spawn when the kernel cannot enforce every rule (default: best effort). */
  require?: boolean;
}

/** Confines the child. The zygote must offer the feature 'sandbox' (see
 * hello()); otherwise the spawn fails before anything is sent, with an
 * ENOTSUP error naming the feature. A sandbox is never weakened silently. */
export interface SandboxOptions {
  /** A profile of the zygote's policy file, applied first; the rest only tightens it. */
  profile?: string;
  /** Absent: the host's filesystem. Present: an empty root with these mounts, in order. */
  mounts?: SandboxMount[];
  /** 'none': an empty network namespace. Default 'host'. */
  network?: 'host' | 'none';
  /** New pid, ipc and uts namespaces. */
  isolate?: boolean;
  /** The hostname inside; needs isolate. */
  hostname?: string;
  /** A seccomp profile: 'default', 'strict', or one of the policy's. */
  seccomp?: string;
  /** A custom seccomp filter's text, instead of seccomp. */
  seccompFilter?: string;
  landlock?: LandlockOptions;
}

/** What confined a child, as the zygote reported it. */
export interface AppliedSandbox {
  profile: string | null;
  /** 'mount', 'pid', 'ipc', 'uts', 'net', 'user'. */
  namespaces: string[];
  /** A profile name, 'custom', or null. */
  seccomp: string | null;
  /** The Landlock ABI enforced; null when Landlock was not applied. */
  landlockAbi: number | null;
  /** false when best-effort Landlock could not enforce every rule. */
  landlockComplete: boolean;
}

export interface SpawnOptions {
  cwd?: string | URL | Buffer;
  env?: NodeJS.ProcessEnv;
  argv0?: string;
  stdio?: StdioOptions;
  detached?: boolean;
  uid?: number;
  gid?: number;
  shell?: boolean | string;
  timeout?: number;
  killSignal?: NodeJS.Signals | number;
  signal?: AbortSignal;
  /** Accepted and ignored, as on every platform but Windows. */
  windowsHide?: boolean;
  windowsVerbatimArguments?: boolean;
  zygote?: ZygoteOptions;
  sandbox?: SandboxOptions;
}

export interface ExecFileOptions extends SpawnOptions {
  maxBuffer?: number;
  encoding?: BufferEncoding | 'buffer' | null;
}

export interface ExecOptions extends ExecFileOptions {
  shell?: string;
}

export class ChildProcess extends EventEmitter {
  /** Set when 'spawn' is emitted (the zygote answers asynchronously). */
  pid: number | undefined;
  exitCode: number | null;
  signalCode: NodeJS.Signals | null;
  killed: boolean;
  readonly connected: boolean;
  spawnfile: string;
  spawnargs: string[];
  stdin: Writable | null;
  stdout: Readable | null;
  stderr: Readable | null;
  readonly stdio: Array<Readable | Writable | null>;
  /** What confined the child, set when 'spawn' is emitted; null when nothing did. */
  sandbox: AppliedSandbox | null;
  kill(signal?: NodeJS.Signals | number): boolean;
  ref(): void;
  unref(): void;
  on(event: 'spawn', listener: () => void): this;
  on(event: 'error', listener: (error: Error) => void): this;
  on(event: 'exit' | 'close', listener: (code: number | null, signal: NodeJS.Signals | null) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
  once(event: 'spawn', listener: () => void): this;
  once(event: 'error', listener: (error: Error) => void): this;
  once(event: 'exit' | 'close', listener: (code: number | null, signal: NodeJS.Signals | null) => void): this;
  once(event: string | symbol, listener: (...args: any[]) => void): this;
}

export interface ExecException extends Error {
  cmd?: string;
  killed?: boolean;
  code?: number | string | null;
  signal?: NodeJS.Signals | null;
  stdout?: string | Buffer;
  stderr?: string | Buffer;
}

export type ExecCallback<T = string> = (error: ExecException | null, stdout: T, stderr: T) => void;

export function spawn(command: string, options?: SpawnOptions): ChildProcess;
export function spawn(command: string, args?: readonly string[], options?: SpawnOptions): ChildProcess;

export function execFile(file: string, callback?: ExecCallback): ChildProcess;
export function execFile(file: string, args: readonly string[] | null | undefined, callback?: ExecCallback): ChildProcess;
export function execFile(file: string, options: ExecFileOptions & { encoding: 'buffer' | null },
  callback?: ExecCallback<Buffer>): ChildProcess;
export function execFile(file: string, args: readonly string[] | null | undefined,
  options: ExecFileOptions & { encoding: 'buffer' | null }, callback?: ExecCallback<Buffer>): ChildProcess;
export function execFile(file: string, options: ExecFileOptions, callback?: ExecCallback): ChildProcess;
export function execFile(file: string, args: readonly string[] | null | undefined, options: ExecFileOptions,
  callback?: ExecCallback): ChildProcess;
export namespace execFile {
  function __promisify__(file: string, args?: readonly string[] | null, options?: ExecFileOptions):
    Promise<{ stdout: string; stderr: string }> & { child: ChildProcess };
}

export function exec(command: string, callback?: ExecCallback): ChildProcess;
export function exec(command: string, options: ExecOptions & { encoding: 'buffer' | null },
  callback?: ExecCallback<Buffer>): ChildProcess;
export function exec(command: string, options: ExecOptions, callback?: ExecCallback): ChildProcess;
export namespace exec {
  function __promisify__(command: string, options?: ExecOptions):
    Promise<{ stdout: string; stderr: string }> & { child: ChildProcess };
}

export interface SpawnSyncOptions extends ExecFileOptions {
  input?: string | NodeJS.ArrayBufferView;
}

export interface SpawnSyncReturns<T> {
  pid: number;
  output: Array<T | null>;
  stdout: T;
  stderr: T;
  status: number | null;
  signal: NodeJS.Signals | null;
  error?: Error;
  /** What confined the child, as the zygote reported it; null when nothing did. */
  sandbox: AppliedSandbox | null;
}

export function spawnSync(command: string, options: SpawnSyncOptions & { encoding: BufferEncoding }):
  SpawnSyncReturns<string>;
export function spawnSync(command: string, args: readonly string[], options: SpawnSyncOptions & { encoding: BufferEncoding }):
  SpawnSyncReturns<string>;
export function spawnSync(command: string, args?: readonly string[], options?: SpawnSyncOptions): SpawnSyncReturns<Buffer>;

export function execFileSync(file: string, options: SpawnSyncOptions & { encoding: BufferEncoding }): string;
export function execFileSync(file: string, args: readonly string[], options: SpawnSyncOptions & { encoding: BufferEncoding }):
  string;
export function execFileSync(file: string, args?: readonly string[], options?: SpawnSyncOptions): Buffer;

export function execSync(command: string, options: SpawnSyncOptions & { encoding: BufferEncoding }): string;
export function execSync(command: string, options?: SpawnSyncOptions): Buffer;

export interface Hello {
  protocolVersion: number;
  features: string[];
  serverVersion: string;
}

/** Connects (if not yet connected) and gives the zygote's hello. */
export function hello(): Promise<Hello>;

/** The socket of the zygote used from the next spawn on; no argument:
 * $ZYGOTE_SOCKET, else the default path. */
export function setSocket(path?: string | null): void;

/** Routes child_process.spawn, execFile and exec through the zygote when
 * it can reproduce the call exactly; the rest go to the originals. */
export function install(options?: { onFallback?: (reason: string, api: string) => void; socket?: string }): void;
/** The last call install() sent to the original child_process, and why. */
export function lastFallback(): { api: string; reason: string } | null;
/** Puts the original child_process functions back. */
export function uninstall(): void;

/** The options of pythonTemplate(). */
export interface TemplateOptions {
  /** Modules imported, in this order, before the template is ready: dotted
   * Python names ('json', 'email.mime.text'), at most 256 of at most 256 bytes. */
  preload?: string[];
  /** The interpreter: a path, or a name looked up in the PATH of env. Default 'python3'. */
  python?: string;
  /** The template's environment while it imports; default this process's.
   * Each child gets its own spawn's env. */
  env?: NodeJS.ProcessEnv;
  /** The template's working directory while it imports. Each child gets its own spawn's cwd. */
  cwd?: string | URL | Buffer;
}

/** Options of a template's child: spawn's, but a fork of the template cannot
 * run as another user, be confined, or have another argv[0] or a shell. */
export type TemplateSpawnOptions = Omit<SpawnOptions, 'uid' | 'gid' | 'sandbox' | 'argv0' | 'shell'>;
export type TemplateExecFileOptions = Omit<ExecFileOptions, 'uid' | 'gid' | 'sandbox' | 'argv0' | 'shell'>;

/** A warm Python template of the zygote: an interpreter that has imported its
 * preloads, whose children are forks of it instead of new interpreters. */
export interface Template {
  /** The interpreter, as asked for. */
  readonly python: string;
  /** The modules it preloaded. */
  readonly preload: string[];
  /** The zygote's handle for it, as in templates(). */
  readonly handle: number;
  /** The template process's pid. */
  readonly pid: number;
  /** The zygote found it already running (an earlier request of this user). */
  readonly reused: boolean;
  /** A child of the template: args are what would follow `python` on its
   * command line, beginning with '-c', CODE; '-m', MODULE; or a script path. */
  spawn(args: readonly string[], options?: TemplateSpawnOptions): ChildProcess;
  /** execFile with a child of the template; util.promisify works on it. */
  readonly execFile: TemplateExecFile;
}

/** Template.execFile: child_process.execFile's forms, with the Python arguments. */
export interface TemplateExecFile {
  (args: readonly string[], callback?: ExecCallback): ChildProcess;
  (args: readonly string[], options: TemplateExecFileOptions & { encoding: 'buffer' | null },
    callback?: ExecCallback<Buffer>): ChildProcess;
  (args: readonly string[], options: TemplateExecFileOptions, callback?: ExecCallback): ChildProcess;
  __promisify__(args: readonly string[], options?: TemplateExecFileOptions):
    Promise<{ stdout: string; stderr: string }> & { child: ChildProcess };
}

/** Finds or starts a warm Python template. Rejects with ENOTSUP, before asking,
 * when the zygote does not offer the feature 'templates'; with the zygote's errno
 * when it cannot start it (ENOENT: no interpreter; EPROTO: a preload raised,
 * with the traceback in the message, or started a thread; ETIMEDOUT). */
export function pythonTemplate(options?: TemplateOptions): Promise<Template>;

/** One template in the zygote's list. */
export interface TemplateInfo {
  handle: number;
  uid: number;
  /** 0 while no process runs (between a recycle or a crash and the next request). */
  pid: number;
  kind: string;
  python: string;
  preload: string[];
  forks: number;
  restarts: number;
  ageMs: number;
  rssBytes: number;
}

/** The templates this process's user may see (root: every user's). */
export function templates(): Promise<TemplateInfo[]>;
