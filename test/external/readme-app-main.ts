/**
 * The entry of the README's plans app as `readme-examples.spec.ts` starts it, written beside the
 * README's blocks: what the README leaves to the app, done the plainest way. `x-customer: acme:pro`
 * stands in for an auth guard (customer `acme` on plan `pro`; it runs before every guard, as
 * middleware does), `trust proxy` lets a test name the client address it is counted by
 * (`X-Forwarded-For`), and `POST /incident/ban?address=…`,
 * `/incident/override?customer=…&plan=…&count=…` and `/incident/changes` stand in for an
 * operator's tools: they call the README's `IncidentService`, and answer 500 with the error's
 * message when the call fails.
 */
export const README_APP_MAIN = `
import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { IncidentService } from './incident.service.js';
import { PlansAppModule } from './plans.module.js';

interface Request {
  url: string;
  headers: Record<string, string | undefined>;
  user?: { id: string; plan?: string };
}
interface Response {
  statusCode: number;
  setHeader(name: string, value: string): void;
  end(body: string): void;
}

async function bootstrap() {
  // abortOnError off: a provider that app.get cannot find is an error to answer with, not an exit.
  const app = await NestFactory.create(PlansAppModule, { abortOnError: false });
  const express = app.getHttpAdapter().getInstance() as { set(setting: string, value: unknown): void };
  express.set('trust proxy', 1);
  app.use((req: Request, _res: Response, next: () => void) => {
    const [id, plan] = (req.headers['x-customer'] ?? '').split(':');
    if (id) req.user = { id, plan: plan || undefined };
    next();
  });
  // Resolved when asked: an app without the service still starts, and the call says why it failed.
  const incident = () => app.get(IncidentService, { strict: false });
  const calls: Record<string, (query: Record<string, string>) => Promise<unknown>> = {
    '/ban': ({ address }) => incident().ban(address),
    '/override': ({ customer, plan, count }) =>
      incident().raiseReportsLimit(customer, plan as 'pro' | 'partner', Number(count)),
    '/changes': () => incident().changes(),
  };
  app.use('/incident', (req: Request, res: Response) => {
    const url = new URL(req.url, 'http://app');
    const answer = (status: number, body: unknown) => {
      res.statusCode = status;
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(body ?? null));
    };
    Promise.resolve()
      .then(() => calls[url.pathname](Object.fromEntries(url.searchParams)))
      .then(
        (result) => answer(200, result),
        (error: Error) => answer(500, { message: error.message }),
      );
  });
  await app.listen(process.env.PORT ?? 3000);
}
void bootstrap();
`;
