import type { INestApplication } from '@nestjs/common';
import request from 'supertest';

/** Sends `n` GET requests one after another and returns their statuses. */
export async function statuses(
  app: INestApplication,
  path: string,
  n: number,
  headers: Record<string, string> = {},
): Promise<number[]> {
  const result: number[] = [];
  for (let i = 0; i < n; i += 1) result.push((await request(app.getHttpServer()).get(path).set(headers)).status);
  return result;
}
