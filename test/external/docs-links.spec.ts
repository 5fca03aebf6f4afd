import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, copyPackage, packedFiles } from './package-copy.js';

/**
 * The Markdown the package ships (README, CHANGELOG, docs/) as a reader of node_modules or of
 * npm's site gets it: every relative link names a file the package ships, and a heading that file
 * has; links to what it does not ship go to the repository its package.json names.
 */

/** Each inline link's target (`[text](target)`) outside fenced code blocks and code spans, with its line. */
function linksOf(text: string): { target: string; line: number }[] {
  const links: { target: string; line: number }[] = [];
  let fenced = false;
  text.split('\n').forEach((line, i) => {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    if (fenced) return;
    const prose = line.replace(/`+[^`]*`+/g, '');
    for (const [, target] of prose.matchAll(/\]\(<?([^()\s>]+)>?(?:\s+"[^"]*")?\)/g)) {
      links.push({ target, line: i + 1 });
    }
  });
  return links;
}

/** The anchors of a document's headings, as GitHub and npm make them. */
function anchorsOf(text: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  let fenced = false;
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    const heading = fenced ? null : /^#{1,6}\s+(.*?)\s*$/.exec(line);
    if (!heading) continue;
    const anchor = heading[1]
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(anchor) ?? 0;
    seen.set(anchor, n + 1);
    anchors.add(n === 0 ? anchor : `${anchor}-${n}`);
  }
  return anchors;
}

describe('the links of the packed package’s Markdown', () => {
  let dir: string;
  let files: string[];
  let markdown: string[];
  const read = (file: string) => readFileSync(join(dir, file), 'utf8');

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rl-docs-links-'));
    await copyPackage(dir);
    files = await packedFiles(dir);
    markdown = files.filter((file) => file.endsWith('.md'));
  }, 60_000);

  afterAll(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('ships the README, the CHANGELOG and the docs', () => {
    expect(markdown).toEqual(expect.arrayContaining(['README.md', 'CHANGELOG.md', 'docs/options.md']));
  });

  it('every relative link names a file the package ships, and a heading of it', () => {
    const broken: string[] = [];
    for (const file of markdown) {
      for (const { target, line } of linksOf(read(file))) {
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
        const hash = target.indexOf('#');
        const path = hash < 0 ? target : target.slice(0, hash);
        const anchor = hash < 0 ? '' : target.slice(hash + 1);
        const named = path === '' ? file : posix.normalize(posix.join(posix.dirname(file), path));
        if (!files.includes(named)) {
          broken.push(`${file}:${line} (${target}): ${named} is not in the package`);
        } else if (anchor && named.endsWith('.md') && !anchorsOf(read(named)).has(anchor)) {
          broken.push(`${file}:${line} (${target}): ${named} has no heading #${anchor}`);
        }
      }
    }
    expect(broken).toEqual([]);
  });

  it('package.json names the repository, and links into it name files and headings it has', () => {
    const { repository } = JSON.parse(read('package.json')) as { repository?: { type: string; url: string } };
    expect(repository).toMatchObject({ type: 'git', url: expect.stringMatching(/^git\+https:\/\/\S+\.git$/) });
    const web = repository!.url.replace(/^git\+/, '').replace(/\.git$/, '');
    const broken: string[] = [];
    for (const file of markdown) {
      for (const { target, line } of linksOf(read(file))) {
        const into = /^(?:blob|tree)\/[^/]+\/([^#]+)(?:#(.*))?$/.exec(
          target.startsWith(`${web}/`) ? target.slice(web.length + 1) : '',
        );
        if (!into) continue;
        const [, path, anchor] = into;
        if (!existsSync(join(ROOT, path))) broken.push(`${file}:${line} (${target}): the repository has no ${path}`);
        else if (anchor && !anchorsOf(readFileSync(join(ROOT, path), 'utf8')).has(anchor)) {
          broken.push(`${file}:${line} (${target}): ${path} has no heading #${anchor}`);
        }
      }
    }
    expect(broken).toEqual([]);
  });
});
