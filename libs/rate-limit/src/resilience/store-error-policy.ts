/**
 * What a request gets when the store cannot decide it (Redis failing, too slow, circuit open):
 * `'local'` this instance decides from what Redis last reported, pessimistically; `'allow'`
 * admits; `'deny'` refuses.
 */
export type RateLimitStoreErrorPolicy = 'local' | 'allow' | 'deny';
export const STORE_ERROR_POLICIES: readonly RateLimitStoreErrorPolicy[] = ['local', 'allow', 'deny'];
