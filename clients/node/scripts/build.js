'use strict';
// npm's install script: builds the addon from the Rust workspace with
// cargo and puts it at zygote.node. A prebuilt addon (ZYGOTE_NODE_ADDON,
// or a zygote.node already in place from a release) skips the build.
//
// ZYGOTE_NODE_PROFILE=debug builds the debug profile (faster to build;
// the tests use it), release otherwise.

const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const here = path.join(__dirname, '..');
const target = path.join(here, 'zygote.node');
const workspace = path.join(here, '..', '..');
const profile = process.env.ZYGOTE_NODE_PROFILE === 'debug' ? 'debug' : 'release';

if (process.env.ZYGOTE_NODE_ADDON) {
  console.log(`zygote: using the addon at ${process.env.ZYGOTE_NODE_ADDON}`);
  process.exit(0);
}
if (!fs.existsSync(path.join(workspace, 'Cargo.toml'))) {
  // An installed package: the addon ships in it or in a per-platform package.
  if (fs.existsSync(target)) process.exit(0);
  const libc = process.report.getReport().header.glibcVersionRuntime ? 'gnu' : 'musl';
  const platform = `zygote-${process.platform}-${process.arch}-${libc}`;
  try {
    require.resolve(platform);
    process.exit(0);
  } catch {
    console.error(`zygote: no prebuilt addon (${platform}) and no Rust workspace to build one from`);
    process.exit(1);
  }
}
const args = ['build', '--locked', '-p', 'zygote-node'];
if (profile === 'release') args.push('--release');
execFileSync('cargo', args, { cwd: workspace, stdio: 'inherit' });
const targetDir = process.env.CARGO_TARGET_DIR || path.join(workspace, 'target');
const built = path.join(targetDir, profile, 'libzygote_node.so');
// Copy, then rename: a process that has the old addon loaded keeps it.
fs.copyFileSync(built, `${target}.tmp`);
fs.renameSync(`${target}.tmp`, target);
console.log(`zygote: built ${target} (${profile})`);
