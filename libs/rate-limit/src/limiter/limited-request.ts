import type { ExecutionContext } from '@nestjs/common';

/**
 * A request as the limiter sees it: what its transport (the guard, the interceptor) read of it.
 * The limiter reads these members only; `context` it hands, unread, to the app's own functions of
 * a rule (`by`, `cost`, `settleCost.max`, `tiers.of`, `skipIf`), which take Nest's context.
 */
export interface LimitedRequest {
  /** The client's address (a `by: 'ip'` rule's identity, an address ban, an allow list); none when unknown. */
  readonly address: string | undefined;
  /** Whether the client has gone (closed or shut its connection): asked again while a decision waits. */
  gone(): boolean;
  /**
   * Calls `listener` once, when the client goes (its connection closes or it shuts its side), for a
   * request that waits; returns how to stop listening. A transport that cannot tell never calls it.
   */
  onGone(listener: () => void): () => void;
  /** The client's `User-Agent`, for an allow list of user agents; none when the transport keeps none. */
  userAgent(): string | undefined;
  readonly context: ExecutionContext;
}
