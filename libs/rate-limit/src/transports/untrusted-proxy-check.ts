import { type ExecutionContext, Logger } from '@nestjs/common';
import { httpRequestOf } from './limited-context.js';

/** What of an Express or a Fastify request says whether the app trusts a proxy. */
interface ProxiedRequest {
  headers?: Record<string, string | string[] | undefined>;
  /** Express's app: its `trust proxy` setting. */
  app?: { get?: (setting: string) => unknown };
  /** Fastify's raw request; Fastify defines `ips` only on the requests of a server with `trustProxy`. */
  raw?: object;
  ips?: unknown;
}

const SETTING = {
  express: "Express's 'trust proxy' (app.set('trust proxy', 1) behind one proxy)",
  fastify: "Fastify's 'trustProxy' (new FastifyAdapter({ trustProxy: 1 }) behind one proxy)",
} as const;

/**
 * Says once when requests come through a proxy the app does not trust: they carry
 * `X-Forwarded-For` (or `Forwarded`) while the adapter's trust setting is unset, so every client
 * behind the proxy has the proxy's address and `by: 'ip'` counts them all in one bucket. It changes
 * nothing that is counted: a client that sends the header itself, with no proxy in front, is rightly
 * not believed. Until it has said so, a request costs one header lookup; after, nothing.
 */
export class UntrustedProxyCheck {
  private said = false;

  check(context: ExecutionContext): void {
    if (this.said) return;
    const request = httpRequestOf(context) as ProxiedRequest | undefined;
    const headers = request?.headers;
    if (!headers) return;
    const header =
      headers['x-forwarded-for'] !== undefined
        ? 'X-Forwarded-For'
        : headers.forwarded !== undefined
          ? 'Forwarded'
          : undefined;
    if (!header) return;
    const adapter = untrustingAdapter(request!);
    if (!adapter) return;
    this.said = true;
    new Logger('RateLimit').warn(
      `Requests carry ${header} but the app trusts no proxy: each has the address of the proxy it came through, so clients behind one proxy share its limits. Behind a proxy or load balancer, set ${SETTING[adapter]}; without one, clients send the header themselves and it is rightly ignored. Said once.`,
    );
  }
}

/** The adapter of a request whose app trusts no proxy; undefined when it trusts one, or is neither. */
function untrustingAdapter(request: ProxiedRequest): keyof typeof SETTING | undefined {
  if (typeof request.app?.get === 'function') return request.app.get('trust proxy') ? undefined : 'express';
  if (request.raw !== undefined) return 'ips' in request ? undefined : 'fastify';
  return undefined;
}
