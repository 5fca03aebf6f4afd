import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import { type FollowedMaster, movesClient, withoutIdleSwitches } from './switch-master-announcement.js';

const onNew: FollowedMaster = {
  name: 'mymaster',
  socket: { remoteAddress: '127.0.0.1', remotePort: 6380 },
  natMap: undefined,
};

describe('movesClient', () => {
  it('follows an announcement naming another server for its master, and lets be one naming where it is', () => {
    expect(movesClient('mymaster 127.0.0.1 6379 127.0.0.1 6381', onNew)).toBe(true);
    expect(movesClient('mymaster 127.0.0.1 6379 127.0.0.1 6380', onNew)).toBe(false);
    // An IPv4 peer of a dual-stack socket.
    const dualStack = { ...onNew, socket: { remoteAddress: '::ffff:127.0.0.1', remotePort: 6380 } };
    expect(movesClient('mymaster 127.0.0.1 6379 127.0.0.1 6380', dualStack)).toBe(false);
  });

  it("lets be another master's announcement", () => {
    expect(movesClient('other 127.0.0.1 6379 127.0.0.1 6381', onNew)).toBe(false);
  });

  it('follows one while no socket is open, as ioredis would', () => {
    expect(movesClient('mymaster 127.0.0.1 6379 127.0.0.1 6380', { ...onNew, socket: undefined })).toBe(true);
    expect(movesClient('mymaster 127.0.0.1 6379 127.0.0.1 6380', { ...onNew, socket: {} })).toBe(true);
  });

  it('reads the announced address through natMap, as the client connects to it', () => {
    const mapped = { host: '127.0.0.1', port: 6380 };
    const natMap = { '10.0.0.2:6379': mapped };
    expect(movesClient('mymaster 10.0.0.1 6379 10.0.0.2 6379', { ...onNew, natMap })).toBe(false);
    expect(movesClient('mymaster 10.0.0.1 6379 10.0.0.2 6379', { ...onNew, natMap: () => mapped })).toBe(false);
    expect(movesClient('mymaster 10.0.0.2 6379 10.0.0.1 6379', { ...onNew, natMap })).toBe(true);
  });
});

describe('withoutIdleSwitches', () => {
  it("keeps from the sentinel client's listeners only the announcements that do not move the client", () => {
    const heard: unknown[][] = [];
    const sentinel = withoutIdleSwitches(new EventEmitter(), () => onNew);
    sentinel.on('message', (...args: unknown[]) => heard.push(args));
    sentinel.emit('message', '+switch-master', 'mymaster 127.0.0.1 6379 127.0.0.1 6380');
    sentinel.emit('message', '+switch-master', 'mymaster 127.0.0.1 6380 127.0.0.1 6381');
    sentinel.emit('message', 'another-channel', 'mymaster 127.0.0.1 6379 127.0.0.1 6380');
    expect(heard).toEqual([
      ['+switch-master', 'mymaster 127.0.0.1 6380 127.0.0.1 6381'],
      ['another-channel', 'mymaster 127.0.0.1 6379 127.0.0.1 6380'],
    ]);
  });
});
