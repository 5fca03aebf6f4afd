import { PATH_METADATA } from '@nestjs/common/constants.js';
import type { Reflector } from '@nestjs/core';

// eslint-disable-next-line @typescript-eslint/no-unsafe-function-type -- what ExecutionContext.getHandler() returns
export type Handler = Function;

// Metadata keys of the decorators of @nestjs/microservices, @nestjs/graphql and @nestjs/websockets,
// read by key so that those packages stay optional.
export const MESSAGE_PATTERN_METADATA = 'microservices:pattern';
export const RESOLVER_TYPE_METADATA = 'graphql:resolver_type';
const RESOLVER_PROPERTY_METADATA = 'graphql:resolve_property';
export const GATEWAY_METADATA = 'websockets:is_gateway';
const MESSAGE_MAPPING_METADATA = 'websockets:message_mapping';

/** What the guard limits; the rest of a message naming a handler it cannot. */
export const SUPPORTED_HANDLERS =
  'only HTTP routes of controllers, GraphQL queries and mutations of resolvers, and @SubscribeMessage handlers of WebSocket gateways are limited';

/**
 * What Nest makes of a method, as the metadata of its decorators tells: one the guard limits
 * (`route`, `operation`, `ws-message`), one it cannot (`message`, `subscription`, `field`), or no
 * handler at all (`none`).
 */
export type HandlerKind = 'route' | 'operation' | 'ws-message' | 'message' | 'subscription' | 'field' | 'none';

/** The handlers the guard limits. */
export const LIMITED_KINDS: readonly HandlerKind[] = ['route', 'operation', 'ws-message'];

/** The classes whose handlers the guard limits, and what it cannot limit on each. */
export interface HandlerClass {
  /** How messages name it: `controller`, `resolver`, `gateway`. */
  role: string;
  limited: HandlerKind;
  /** Handler kinds of such a class the guard cannot limit, and what each is. */
  unsupported: Partial<Record<HandlerKind, string>>;
  /** The decorator a method needs to be a handler the guard limits. */
  needs: string;
}

export const CONTROLLER: HandlerClass = {
  role: 'controller',
  limited: 'route',
  unsupported: { message: 'a microservice handler (@MessagePattern or @EventPattern)' },
  needs: '@Get, @Post or another route decorator',
};
export const RESOLVER: HandlerClass = {
  role: 'resolver',
  limited: 'operation',
  unsupported: {
    subscription: 'a GraphQL subscription (its events are not requests the guard sees)',
    field: 'a GraphQL field resolver (@ResolveField runs once per parent object, not per request)',
  },
  needs: '@Query or @Mutation',
};
export const GATEWAY: HandlerClass = {
  role: 'gateway',
  limited: 'ws-message',
  unsupported: {},
  needs: '@SubscribeMessage',
};

/** What Nest makes of a method, from the metadata of its decorators. */
export function handlerKindOf(reflector: Reflector, handler: Handler): HandlerKind {
  if (reflector.get(MESSAGE_PATTERN_METADATA, handler) !== undefined) return 'message';
  // Nest's router makes a route of every method with a path, and of no other.
  if (reflector.get(PATH_METADATA, handler) !== undefined) return 'route';
  const resolverType = reflector.get<string | undefined>(RESOLVER_TYPE_METADATA, handler);
  if (resolverType === 'Query' || resolverType === 'Mutation') return 'operation';
  if (resolverType === 'Subscription') return 'subscription';
  if (reflector.get(RESOLVER_PROPERTY_METADATA, handler) === true) return 'field';
  if (reflector.get(MESSAGE_MAPPING_METADATA, handler) === true) return 'ws-message';
  return 'none';
}
