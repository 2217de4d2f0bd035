import { native } from './native';
import { core } from './errors';

/** A limit as numbers: tokens per second and the burst. */
export interface RateCap {
  rate: number;
  cap: number;
}

/** A limit: numbers, or one limit string (`"100/minute"`, `"10/second, burst 20"`). */
export type LimitLike = RateCap | string;

/** One limit of a limit string. */
export interface ParsedLimit {
  /** Tokens per period. */
  amount: number;
  /** The period in seconds. */
  periodSecs: number;
  /** Tokens per second (`amount / periodSecs`). */
  rate: number;
  /** The burst: `amount` unless a burst was given. */
  cap: number;
}

/**
 * Every limit of a limit string (`"10/second;500/minute, burst 20"`), parsed by the client core
 * (the Rust and Python clients' parser): a `RangeError` says what is wrong and how to write it.
 */
export function parseLimits(text: string): ParsedLimit[] {
  if (typeof text !== 'string') throw new TypeError('a limit string expected');
  return core(() => native.parseLimits(text)).map((l) => ({
    amount: l.amount,
    periodSecs: l.periodSecs,
    rate: l.rate,
    cap: l.cap,
  }));
}

/** One limit (`"100/minute"`) as `{ rate, cap }`. */
export function parseLimit(text: string): RateCap {
  const all = parseLimits(text);
  if (all.length !== 1) {
    throw new RangeError(
      `${JSON.stringify(text)} has ${all.length} limits: one is expected here (one bucket)`,
    );
  }
  const [l] = all as [ParsedLimit];
  return { rate: l.rate, cap: l.cap };
}

/** A limit given as numbers or a string, as `{ rate, cap }`. */
export function rateCap(limit: LimitLike, what = 'limit'): RateCap {
  if (typeof limit === 'string') return parseLimit(limit);
  if (
    limit === null ||
    typeof limit !== 'object' ||
    typeof limit.rate !== 'number' ||
    typeof limit.cap !== 'number'
  ) {
    throw new TypeError(`${what}: { rate, cap } (numbers) or a limit string ("100/minute")`);
  }
  return { rate: limit.rate, cap: limit.cap };
}
