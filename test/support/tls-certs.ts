import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** A certificate authority and a server certificate it signed, for 127.0.0.1 and localhost. */
export interface TlsFiles {
  /** The CA certificate (PEM), for a client's `tls.ca`. */
  readonly ca: string;
  readonly caFile: string;
  readonly certFile: string;
  readonly keyFile: string;
  remove(): void;
}

/** Generates a CA and a server certificate with `openssl`, valid a day, in a directory of their own. */
export function createTlsFiles(): TlsFiles {
  const dir = mkdtempSync(join(tmpdir(), 'rl-tls-'));
  const file = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe' });
  openssl(
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-days',
    '1',
    '-subj',
    '/CN=rate-limit test CA',
    '-keyout',
    file('ca.key'),
    '-out',
    file('ca.crt'),
  );
  openssl(
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-subj',
    '/CN=localhost',
    '-keyout',
    file('server.key'),
    '-out',
    file('server.csr'),
  );
  writeFileSync(file('san.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  openssl(
    'x509',
    '-req',
    '-in',
    file('server.csr'),
    '-CA',
    file('ca.crt'),
    '-CAkey',
    file('ca.key'),
    '-CAcreateserial',
    '-days',
    '1',
    '-extfile',
    file('san.cnf'),
    '-out',
    file('server.crt'),
  );
  return {
    ca: readFileSync(file('ca.crt'), 'utf8'),
    caFile: file('ca.crt'),
    certFile: file('server.crt'),
    keyFile: file('server.key'),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
