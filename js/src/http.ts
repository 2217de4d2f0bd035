// What the Express and Fastify middleware share: the limiter they make, the key functions.

import type { RedisClient, BackendOption } from './client';
import { ServerError } from './errors';
import { Decision, Limiter } from './limiter';
import type { LimitLike } from './limits';

/** A request as both frameworks have it (the parts the key functions read). */
export interface RequestLike {
  ip?: string;
  method?: string;
  url?: string;
  headers?: Record<string, string | string[] | undefined>;
  socket?: { remoteAddress?: string | undefined };
}

/** Maps a request to its bucket's key suffix; null or undefined lets it through unlimited. */
export type KeyFunc<R> = (req: R) => string | null | undefined | Promise<string | null | undefined>;

export interface MiddlewareOptions<R> {
  /** Your ioredis or node-redis client (or pass `limiter`). */
  client?: RedisClient;
  /** The limit: `{ rate, cap }` or a limit string; default `{ rate: 10, cap: 20 }`. */
  limit?: LimitLike;
  /** The caller's key: default the peer address (`byIp`). */
  key?: KeyFunc<R>;
  /** The buckets' key prefix (one per route gives per-route limits); default `rl:http:`. */
  prefix?: string;
  /**
   * `true` (default): let requests through while Redis is unavailable (a local bucket per
   * key) and when it answers an error (counted in `errorsLetThrough`); `false`: 429 to
   * outages, the error passed on (a 500) for error replies.
   */
  failOpen?: boolean;
  /** The app's instances: each falls back to `1 / instances` of the limit; default 4. */
  instances?: number;
  timeoutMs?: number | null;
  backend?: BackendOption;
  /** Tokens per request; default 1. */
  cost?: number;
  /** Bring your own limiter (its limit, policy and timeout). */
  limiter?: Limiter;
}

/** The peer address (behind a proxy, key by a trusted forwarded header instead). */
export function byIp(req: RequestLike): string {
  return req.ip ?? req.socket?.remoteAddress ?? 'unknown';
}

/** A request header's value (`byHeader('x-api-key')`). */
export function byHeader(name: string, fallback?: string): (req: RequestLike) => string | undefined {
  const wanted = name.toLowerCase();
  return (req) => {
    const v = req.headers?.[wanted];
    return (Array.isArray(v) ? v[0] : v) ?? fallback;
  };
}

/** Method and path (without the query): one bucket per endpoint and caller-agnostic. */
export function byRoute(req: RequestLike): string {
  const path = (req.url ?? '').split('?')[0];
  return `${req.method ?? ''}:${path}`;
}

/** @internal What a request gets: a decision to render, or nothing (let through). */
export class Gate<R> {
  readonly limiter: Limiter;
  private readonly key: KeyFunc<R>;
  private readonly prefix: string;
  private readonly cost: number;
  private readonly failOpen: boolean;

  constructor(options: MiddlewareOptions<R>) {
    this.prefix = options.prefix ?? 'rl:http:';
    this.cost = options.cost ?? 1;
    this.failOpen = options.failOpen ?? true;
    this.key = options.key ?? (byIp as unknown as KeyFunc<R>);
    if (options.limiter !== undefined) {
      this.limiter = options.limiter;
    } else {
      if (options.client === undefined) throw new TypeError('redis-rl middleware: client or limiter is needed');
      this.limiter = new Limiter(options.client, this.prefix, options.limit ?? { rate: 10, cap: 20 }, {
        failurePolicy: this.failOpen ? 'allow' : 'deny',
        ...(options.instances !== undefined ? { instances: options.instances } : {}),
        ...(options.timeoutMs !== undefined ? { timeoutMs: options.timeoutMs } : {}),
        ...(options.backend !== undefined ? { backend: options.backend } : {}),
      });
    }
  }

  /** The decision for `req` (null: not limited, or let through on an error reply). */
  async decide(req: R): Promise<Decision | null> {
    let suffix = this.key(req);
    if (suffix instanceof Promise) suffix = await suffix;
    if (suffix === null || suffix === undefined) return null;
    try {
      return await this.limiter.take(this.cost, { key: this.prefix + suffix });
    } catch (e) {
      if (this.failOpen && e instanceof ServerError) {
        this.limiter.letThrough();
        return null;
      }
      throw e;
    }
  }
}
