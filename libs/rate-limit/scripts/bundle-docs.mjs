// Copies the repository's README.md and docs/ into a package folder before it is packed, so the
// README's links to docs/ work where npm and node_modules show it.
// Usage: node bundle-docs.mjs [package folder, default: this package]
import { cpSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const target = resolve(process.argv[2] ?? fileURLToPath(new URL('..', import.meta.url)));
cpSync(join(root, 'README.md'), join(target, 'README.md'));
rmSync(join(target, 'docs'), { recursive: true, force: true });
cpSync(join(root, 'docs'), join(target, 'docs'), { recursive: true });
