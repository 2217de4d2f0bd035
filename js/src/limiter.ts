import type * as Binding from './binding';
import { Connection, Outage, type BackendOption, type RedisClient } from './client';
import { core, ServerError } from './errors';
import { rateCap, type LimitLike } from './limits';
import { native } from './native';
import { LastCommands } from './patch';
import { share, type Source } from './policy';

/** Milliseconds on a monotonic clock (what the core's local buckets run on). */
const now = (): number => performance.now();

const SOURCES: readonly Source[] = ['server', 'fallback'];
const PINS: readonly Decision['pinned'][] = [null, 'rate', 'block', 'exempt'];

/** What the core writes a decision into (one per process: Node runs one call at a time). */
const slots = new Float64Array(8);

/** @internal The decision the core wrote into `slots`. */
export function fromSlots(s: Float64Array = slots): Decision {
  return new Decision(
    s[0] === 1,
    s[1]!,
    s[2]!,
    s[3]!,
    s[4]!,
    s[5]!,
    SOURCES[s[6]!] ?? 'server',
    PINS[s[7]!] ?? null,
  );
}

/** @internal The decision of Redis's reply to a take (a `ProtocolError` if it is malformed). */
export function taken(c: Binding.TakeCore, n: number, reply: unknown, key: string | null): Decision {
  core(() => c.taken(n, reply, key, slots, now()));
  return fromSlots();
}

/** A take's answer: truthy fields in camelCase, as the Python client's `Decision`. */
export class Decision {
  /** Whether the tokens were granted. */
  readonly granted: boolean;
  /** Tokens granted: the `n` asked for, or 0. */
  readonly tokens: number;
  /** The bucket's tokens after the call (Redis's, or the local fallback's). */
  readonly remaining: number;
  /** Milliseconds until a retry could be granted (0 when granted). */
  readonly retryAfterMs: number;
  /** Milliseconds until the bucket is full. */
  readonly resetAfterMs: number;
  /** The bucket's capacity (`X-RateLimit-Limit`). */
  readonly limit: number;
  /** `server`, or `fallback` when the failure policy decided (Redis did not answer). */
  readonly source: Source;
  /** The kind of the operator's pin (`RL.PIN`) that decided, if one did. */
  readonly pinned: 'rate' | 'block' | 'exempt' | null;

  /** @internal */
  constructor(
    granted: boolean,
    tokens: number,
    remaining: number,
    retryAfterMs: number,
    resetAfterMs: number,
    limit: number,
    source: Source,
    pinned: Decision['pinned'],
  ) {
    this.granted = granted;
    this.tokens = tokens;
    this.remaining = remaining;
    this.retryAfterMs = retryAfterMs;
    this.resetAfterMs = resetAfterMs;
    this.limit = limit;
    this.source = source;
    this.pinned = pinned;
  }

  /** `X-RateLimit-Limit`, `-Remaining`, `-Reset`, and `Retry-After` when denied. */
  headers(): Record<string, string> {
    const flat = core(() =>
      native.decisionHeaders(this.granted, this.remaining, this.retryAfterMs, this.resetAfterMs, this.limit),
    );
    const out: Record<string, string> = {};
    for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]!] = flat[i + 1]!;
    return out;
  }

  /** The JSON body of a 429: `{"error": {"code": "rate_limit_exceeded", "retry_after": N}}`. */
  body(): string {
    return core(() => native.tooManyBody(this.retryAfterMs));
  }
}

/** A limiter's counters (this process). */
export type LimiterCounters = Binding.TakeCounters;

export interface LimiterOptions {
  /** `allow` (default: fail open, a local bucket at `1 / instances` of the limit) or `deny`. */
  failurePolicy?: 'allow' | 'deny';
  /** The instances sharing the limit (the local bucket's share); default 4. */
  instances?: number;
  /** Milliseconds each Redis call may take before the failure policy decides; default 200. */
  timeoutMs?: number | null;
  /** `auto` (default: asks the server once), `module` or `functions`. */
  backend?: BackendOption;
}

export const DEFAULT_TIMEOUT_MS = 200;

/**
 * A token bucket in Redis: `await limiter.take(n)` is one `RL.TAKE key rate cap n WITHSTATE`
 * (or `FCALL rl_take`) through your own ioredis or node-redis client. While Redis does not
 * answer within `timeoutMs`, the failure policy decides (`source: 'fallback'`): never thrown.
 * An error reply is thrown as a `ServerError`, a malformed reply as a `ProtocolError`.
 */
export class Limiter {
  readonly key: string;
  readonly rate: number;
  readonly cap: number;
  private readonly core: Binding.TakeCore;
  private readonly conn: Connection;
  private readonly args = new Map<number, string[]>();
  private readonly commands = new LastCommands();
  private closed = false;

  constructor(client: RedisClient, key: string, limit: LimitLike, options: LimiterOptions = {}) {
    if (typeof key !== 'string') throw new TypeError('key must be a string');
    const { rate, cap } = rateCap(limit);
    const policy = options.failurePolicy ?? 'allow';
    if (policy !== 'allow' && policy !== 'deny') {
      throw new RangeError(`failurePolicy ${JSON.stringify(policy)}: 'allow' or 'deny'`);
    }
    this.core = core(() => new native.TakeCore(key, rate, cap, policy, share(options.instances)));
    this.key = key;
    this.rate = this.core.rate;
    this.cap = this.core.cap;
    const timeout = options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : options.timeoutMs;
    this.conn = new Connection(client, timeout, options.backend ?? 'auto');
  }

  /**
   * Takes `n` tokens (default 1) on the limiter's key, or on `options.key` (a middleware's
   * per-caller key, under the same limit).
   */
  async take(n = 1, options: { key?: string } = {}): Promise<Decision> {
    if (this.closed) throw new Error('redis-rl: take on a closed Limiter');
    const key = options.key;
    if (key !== undefined && typeof key !== 'string') throw new TypeError('key must be a string');
    core(() => this.core.check(n));
    let backend;
    try {
      backend = await this.conn.resolve();
    } catch (e) {
      return this.failed(e, n, key);
    }
    let args: string[];
    const id = backend === 'module' ? n : -n;
    const cached = key === undefined ? this.args.get(id) : undefined;
    if (cached !== undefined) {
      args = cached;
    } else {
      // The core's last command and the shell's are one: every command made goes through it.
      const p = this.commands;
      args = p.apply(backend, core(() => this.core.command(backend, n, key ?? null, p.has(backend), p.positions)));
      if (key === undefined) this.cached(id, args);
    }
    let reply: unknown;
    try {
      reply = await this.conn.call(args, undefined, key ?? this.key);
    } catch (e) {
      return this.failed(e, n, key);
    }
    return taken(this.core, n, reply, key ?? null);
  }

  private cached(id: number, args: string[]): string[] {
    if (this.args.size >= 64) this.args.clear();
    this.args.set(id, args);
    return args;
  }

  private failed(e: unknown, n: number, key: string | undefined): Decision {
    if (e instanceof Outage) {
      core(() => this.core.outage(n, now(), key ?? null, slots));
      return fromSlots();
    }
    if (e instanceof ServerError) this.core.error();
    throw e;
  }

  /** A request a fail-open integration let through on an error (counted). */
  letThrough(): void {
    this.core.letThrough();
  }

  /** What this limiter counted so far. */
  get counters(): LimiterCounters {
    return this.core.counters();
  }

  /** Gives back what the limiter holds (a plain limiter holds nothing in Redis): later takes throw. */
  async close(): Promise<void> {
    this.closed = true;
  }
}
