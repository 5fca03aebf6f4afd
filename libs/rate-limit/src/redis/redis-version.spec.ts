import { describe, expect, it } from 'vitest';
import { unsupportedRedis } from './redis-version.js';

const info = (version: string) =>
  `# Server\r\nredis_version:${version}\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n`;

describe('unsupportedRedis', () => {
  it('names a server older than 7.0 and what the scripts need', () => {
    expect(unsupportedRedis(info('6.2.14'))).toBe(
      'runs Redis 6.2.14; the rate-limit scripts need Redis 7.0 or later (PEXPIRETIME)',
    );
  });

  it('accepts 7.0 and later, and a server that does not say its version', () => {
    expect(unsupportedRedis(info('7.0.15'))).toBeUndefined();
    expect(unsupportedRedis(info('8.2.1'))).toBeUndefined();
    expect(unsupportedRedis('# Server\r\nproxy_version:1.0\r\n')).toBeUndefined();
  });
});
