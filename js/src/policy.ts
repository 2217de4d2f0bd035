/**
 * What a limiter or budget decides while Redis is unreachable or slower than the timeout:
 * - `allow` (fail open): a local token bucket per key at `1 / instances` of the limit (default
 *   4), starting full, debited by what Redis grants and carried across outages;
 * - `last_known` (budgets only): the local buckets start from the levels Redis last reported;
 * - `deny` (fail closed): refused until Redis answers.
 * An error reply (Redis answered) is never decided by the policy: it is thrown (`ServerError`).
 */
export type FailurePolicy = 'allow' | 'last_known' | 'deny';

export const ALLOW = 'allow' as const;
export const LAST_KNOWN = 'last_known' as const;
export const DENY = 'deny' as const;

/** Who decided: Redis, a batch leased earlier (`PrefetchLimiter`), the share held
 * (`ShareLimiter`), or the failure policy. */
export type Source = 'server' | 'lease' | 'share' | 'fallback';

/** `1 / instances`, or null (the core's default: 4 instances). */
export function share(instances: number | undefined): number | null {
  if (instances === undefined) return null;
  if (!Number.isSafeInteger(instances) || instances < 1) {
    throw new RangeError('instances must be a positive integer');
  }
  return 1 / instances;
}
