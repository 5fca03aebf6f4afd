// Makes the links of the package's Markdown files work where the package is read (node_modules, an
// editor, npm's site). In the repository they are relative to the repository's layout; in the
// package, a link to a file the package ships becomes relative to the package's layout, and a link
// to one it does not ship (CONTRIBUTING.md, the demo) an absolute link into the repository named
// by package.json's `repository`. Run after bundle-docs.mjs, on the same folder. A link to a file
// the repository does not have either, or to a heading its target lacks, stops it.
// Usage: node package-links.mjs [package folder, default: this package]
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join, posix, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const packageInRepository = 'libs/rate-limit';
const target = resolve(process.argv[2] ?? fileURLToPath(new URL('..', import.meta.url)));
const manifest = JSON.parse(readFileSync(join(target, 'package.json'), 'utf8'));
const repositoryUrl = repositoryWebUrl(manifest.repository);

// What `npm pack` ships, as paths inside the package.
const [{ files }] = JSON.parse(
  execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts', '--loglevel=error'], {
    cwd: target,
    encoding: 'utf8',
  }),
);
const shipped = new Set(files.map((file) => file.path));

/** Where a shipped file comes from: bundle-docs.mjs copies the README and docs/ from the root. */
const repositoryPathOf = (path) =>
  path === 'README.md' || path.startsWith('docs/') ? path : `${packageInRepository}/${path}`;
const packagePathOf = (path) => {
  if (path === 'README.md' || path.startsWith('docs/')) return shipped.has(path) ? path : undefined;
  const inside = path.startsWith(`${packageInRepository}/`) ? path.slice(packageInRepository.length + 1) : undefined;
  return inside !== undefined && shipped.has(inside) ? inside : undefined;
};

const problems = [];
for (const file of [...shipped].filter((path) => path.endsWith('.md'))) {
  const from = repositoryPathOf(file);
  const text = readFileSync(join(target, file), 'utf8');
  const rewritten = mapLinks(text, (link) => {
    if (/^[a-z][a-z0-9+.-]*:/i.test(link) || link.startsWith('#')) return link;
    const [path, anchor] = splitAnchor(link);
    const inRepository = posix.normalize(posix.join(posix.dirname(from), path));
    const source = join(root, inRepository);
    if (inRepository.startsWith('../') || !existsSync(source)) {
      problems.push(`${file}: (${link}) names ${inRepository}, which the repository does not have`);
      return link;
    }
    if (anchor && inRepository.endsWith('.md') && !headingAnchors(readFileSync(source, 'utf8')).has(anchor)) {
      problems.push(`${file}: (${link}) names a heading ${inRepository} does not have`);
      return link;
    }
    const inPackage = packagePathOf(inRepository);
    const fragment = anchor ? `#${anchor}` : '';
    if (inPackage !== undefined) return posix.relative(posix.dirname(file), inPackage) + fragment;
    const kind = statSync(source).isDirectory() ? 'tree' : 'blob';
    // HEAD: the default branch, whatever its name.
    return `${repositoryUrl}/${kind}/HEAD/${inRepository}${fragment}`;
  });
  if (rewritten !== text) writeFileSync(join(target, file), rewritten);
}
if (problems.length > 0) {
  console.error(`Broken links in the package's Markdown:\n  ${problems.join('\n  ')}`);
  process.exit(1);
}

/** `git+https://github.com/owner/name.git` as `https://github.com/owner/name`. */
function repositoryWebUrl(repository) {
  const url = typeof repository === 'string' ? repository : repository?.url;
  const match = /^(?:git\+)?(https:\/\/[^\s]+?)(?:\.git)?$/.exec(url ?? '');
  if (!match) throw new Error(`package.json: 'repository.url' must be an https URL, got ${JSON.stringify(url)}`);
  return match[1];
}

function splitAnchor(link) {
  const hash = link.indexOf('#');
  return hash < 0 ? [link, ''] : [link.slice(0, hash), link.slice(hash + 1)];
}

/**
 * Applies `map` to the target of every inline link (`[text](target)`, `![alt](target)`) outside
 * fenced code blocks and code spans.
 */
function mapLinks(text, map) {
  let fenced = false;
  return text
    .split('\n')
    .map((line) => {
      if (/^\s*(```|~~~)/.test(line)) {
        fenced = !fenced;
        return line;
      }
      if (fenced) return line;
      // Odd pieces are code spans.
      return line
        .split(/(`+[^`]*`+)/)
        .map((piece, i) =>
          i % 2 === 1
            ? piece
            : piece.replace(/(\]\()(<[^>]*>|[^()\s]+)((?:\s+"[^"]*")?\))/g, (_, open, link, close) => {
                const bare = link.startsWith('<') ? link.slice(1, -1) : link;
                return `${open}${map(bare)}${close}`;
              }),
        )
        .join('');
    })
    .join('\n');
}

/** The anchors GitHub and npm give a document's headings: lower case, punctuation dropped, spaces as hyphens. */
function headingAnchors(text) {
  const anchors = new Set();
  const seen = new Map();
  let fenced = false;
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    const match = fenced ? null : /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!match) continue;
    const base = match[1]
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}
