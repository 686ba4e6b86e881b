// Compiled by `tsc --noEmit` only: the public types accept what the
// README shows and catch what they should.
import * as zygote from '..';
import { promisify } from 'node:util';

const child: zygote.ChildProcess = zygote.spawn('ls', ['-l'], {
  cwd: '/tmp', stdio: ['ignore', 'pipe', 'inherit'], zygote: { killOnClose: true, timeout: 1000 },
});
child.on('exit', (code: number | null, signal: NodeJS.Signals | null) => void [code, signal]);
child.stdout?.on('data', (chunk: Buffer) => void chunk);
const killed: boolean = child.kill('SIGTERM');
void killed;

zygote.execFile('echo', ['hi'], (error, stdout: string) => void [error?.code, stdout]);
zygote.exec('echo hi', { encoding: 'buffer' }, (_error, stdout: Buffer) => void stdout);

async function promised(): Promise<string> {
  const { stdout } = await promisify(zygote.execFile)('echo', ['hi']);
  const hello = await zygote.hello();
  return stdout + hello.protocolVersion;
}
void promised;

const text: string = zygote.execFileSync('echo', ['hi'], { encoding: 'utf8' });
const bytes: Buffer = zygote.spawnSync('echo').stdout;
void [text, bytes];

// @ts-expect-error: the command must be a string
zygote.spawn(42);

const boxed = zygote.spawn('ls', [], {
  sandbox: {
    mounts: [{ type: 'ro', source: '/usr' }, { type: 'tmpfs', destination: '/tmp' }],
    network: 'none', isolate: true, hostname: 'box', seccomp: 'default',
    landlock: { readWrite: ['/tmp'], tcpConnect: [443], require: true },
  },
});
const abi: number | null | undefined = boxed.sandbox?.landlockAbi;
void abi;
// @ts-expect-error: the network is 'host' or 'none'
zygote.spawn('ls', [], { sandbox: { network: 'bridge' } });
// @ts-expect-error: a tmpfs mount has no source
zygote.spawn('ls', [], { sandbox: { mounts: [{ type: 'tmpfs', source: '/x', destination: '/y' }] } });
const confined: zygote.AppliedSandbox | null = zygote.spawnSync('true').sandbox;
void confined;

async function warm(): Promise<string> {
  const template: zygote.Template = await zygote.pythonTemplate({ preload: ['json'], python: 'python3', cwd: '/' });
  const child: zygote.ChildProcess = template.spawn(['-c', 'print(1)'], { stdio: 'pipe', zygote: { timeout: 1000 } });
  void child;
  // @ts-expect-error: a child of a template runs as this user
  template.spawn(['-c', 'pass'], { uid: 0 });
  const { stdout } = await promisify(template.execFile)(['-c', 'print(2)']);
  const list: zygote.TemplateInfo[] = await zygote.templates();
  return stdout + template.pid + list.length;
}
void warm;
