import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { RequestMethod, type Type } from '@nestjs/common';
import { METHOD_METADATA, MODULE_METADATA, PATH_METADATA } from '@nestjs/common/constants.js';
import { describe, expect, it } from 'vitest';
import { AppModule } from '../../apps/demo/src/app.module.js';
import { ROOT } from './package-copy.js';

/** What the documentation says that code can check: the demo's routes, the Quick start's ports, tables of contents. */

const read = (path: string) => readFileSync(join(ROOT, path), 'utf8');

/** The lines of a Markdown section (from its heading to the next heading of its level or above, outside code blocks). */
function section(text: string, heading: string): string[] {
  const lines = text.split('\n');
  const start = lines.indexOf(heading);
  if (start < 0) throw new Error(`no heading '${heading}'`);
  const level = /^#+/.exec(heading)![0].length;
  let fenced = false;
  const end = lines.findIndex((line, i) => {
    if (line.startsWith('```')) fenced = !fenced;
    return i > start && !fenced && new RegExp(`^#{1,${level}} `).test(line);
  });
  return lines.slice(start + 1, end < 0 ? undefined : end);
}

/** Each route of the demo as `METHOD /path`, from the Nest metadata of its controllers. */
function demoRoutes(): string[] {
  const controllers = Reflect.getMetadata(MODULE_METADATA.CONTROLLERS, AppModule) as Type[];
  return controllers.flatMap((controller) => {
    const base = String(Reflect.getMetadata(PATH_METADATA, controller) ?? '');
    const prototype = controller.prototype as Record<string, unknown>;
    return Object.getOwnPropertyNames(prototype).flatMap((name) => {
      const handler = prototype[name];
      if (name === 'constructor' || typeof handler !== 'function') return [];
      const method = Reflect.getMetadata(METHOD_METADATA, handler) as RequestMethod | undefined;
      const path = Reflect.getMetadata(PATH_METADATA, handler) as string | undefined;
      if (method === undefined || path === undefined) return [];
      const full = [base, path].filter((part) => part !== '' && part !== '/').join('/');
      return [`${RequestMethod[method]} /${full}`];
    });
  });
}

/** The dotted anchors GitHub and npm give headings. */
function anchorOf(heading: string): string {
  return heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

describe('the documentation against the code', () => {
  it('apps/demo/README.md lists every route of the demo, and no route it does not have', () => {
    const readme = read('apps/demo/README.md');
    const documented = [...readme.matchAll(/^\| `(GET|POST|PUT|PATCH|DELETE) (\/[^`?\s]*)[^`]*`/gm)].map(
      ([, method, path]) => `${method} ${path}`,
    );
    const routes = demoRoutes();
    expect(routes.length).toBeGreaterThan(20);
    expect([...documented].sort()).toEqual([...routes].sort());
  });

  it('the README’s Quick start never starts a demo on a port one it started still holds, nor calls one that is not running', () => {
    const main = read('apps/demo/src/main.ts');
    const defaultPort = /process\.env\.PORT \?\? (\d+)/.exec(main)?.[1];
    expect(defaultPort, 'the demo listens on PORT, with a default').toBeDefined();
    const running = new Set<string>();
    const problems: string[] = [];
    let inBash = false;
    for (const line of section(read('README.md'), '## Quick start')) {
      if (line.startsWith('```')) {
        inBash = line === '```bash';
        continue;
      }
      // Told to stop the demo that runs (in prose or in a comment): it no longer holds its port.
      if (/Ctrl-C/.test(line)) running.clear();
      if (!inBash) continue;
      const command = line.split('#')[0];
      if (/\bnpm run demo\b/.test(command)) {
        const port = /\bPORT=(\d+)/.exec(command)?.[1] ?? defaultPort!;
        if (running.has(port)) problems.push(`'${line.trim()}' starts a demo on ${port}, which a demo still holds`);
        running.add(port);
      }
      for (const [, port] of command.matchAll(/http:\/\/127\.0\.0\.1:(\d+)/g)) {
        if (!running.has(port)) problems.push(`'${line.trim()}' calls port ${port}, where no demo runs`);
      }
    }
    expect(problems).toEqual([]);
  });

  it('docs/options.md: its table of contents lists every section', () => {
    const options = read('docs/options.md');
    const toc = new Set([...options.split('\n## ')[0].matchAll(/\]\(#([^)]+)\)/g)].map(([, anchor]) => anchor));
    let fenced = false;
    const headings: string[] = [];
    for (const line of options.split('\n')) {
      if (line.startsWith('```')) fenced = !fenced;
      const heading = fenced ? null : /^#{2,3} (.*)$/.exec(line);
      if (heading) headings.push(heading[1]);
    }
    expect(headings.filter((heading) => !toc.has(anchorOf(heading)))).toEqual([]);
  });
});
