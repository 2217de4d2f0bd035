import type * as Binding from './binding';
import { Connection, Outage, type BackendOption, type RedisClient } from './client';
import { core } from './errors';
import { rateCap, type LimitLike } from './limits';
import { native } from './native';
import { share, type FailurePolicy, type Source } from './policy';

const now = (): number => performance.now();

/** A cost: tokens of the budget's one token limit, or tokens by limit name. */
export type Tokens = number | Record<string, number>;

/** How long a reservation may stay open by default (ms): one open longer stays charged. */
export const DEFAULT_TTL_MS = 600_000;
const REQUESTS = 'requests';

export interface TokenBudgetOptions {
  /** A request limit (1 per reservation), as `{ rate, cap }` or a limit string. */
  requests?: LimitLike;
  /** Limits counted separately (`{ input: "2000000/minute", output: "400000/minute" }`). */
  limits?: Record<string, LimitLike>;
  /** Milliseconds a reservation may stay open; one not settled by then stays charged. */
  ttlMs?: number;
  /** `allow` (default), `last_known` or `deny`. */
  failurePolicy?: FailurePolicy;
  /** The instances sharing the limits (the failure policy's local share); default 4. */
  instances?: number;
  /** Milliseconds each Redis call may take before the failure policy decides; default 200. */
  timeoutMs?: number | null;
  backend?: BackendOption;
}

/** A budget's counters (this process). */
export type BudgetCounters = Binding.BudgetCountersJs;

/**
 * One call's reservation. Settle it once with what the call used (`settle(actual)`); a limit
 * not given settles at its estimate. An outage while settling leaves the estimate charged
 * (counted in `settlesLost`): never thrown, as the call it settles is over.
 */
export class Reservation {
  /** Whether every limit was reserved. */
  readonly granted: boolean;
  /** Milliseconds until a retry could be granted, when denied. */
  readonly retryAfterMs: number;
  /** The limit that refused (its wait is the longest), when denied. */
  readonly deniedBy: string | null;
  /** Each limit's tokens after the call, where known. */
  readonly remaining: Record<string, number> | null;
  /** `server`, or `fallback` when the failure policy decided. */
  readonly source: Source;
  /** What was reserved on each limit. */
  readonly reserved: Record<string, number>;
  /** After settling: each limit's tokens back (positive), charged (negative), or null (expired). */
  settlement: Record<string, number | null> | null = null;
  private used: Tokens | undefined;

  /** @internal */
  constructor(
    private readonly budget: TokenBudget,
    private readonly grant: Binding.Grant,
    costs: number[],
  ) {
    const names = budget.names;
    this.granted = grant.granted;
    this.retryAfterMs = grant.retryAfterMs;
    this.deniedBy = grant.deniedBy == null ? null : (names[grant.deniedBy] ?? null);
    this.remaining = grant.remaining == null ? null : zip(names, grant.remaining);
    this.source = grant.source as Source;
    this.reserved = zip(names, costs);
  }

  /** Whether a settle still has something to close. */
  get open(): boolean {
    return this.grant.open();
  }

  /** Records what the call used, for a later `settle()` without arguments. */
  use(actual: Tokens): void {
    this.budget.actuals(actual); // checked now, where the mistake is
    this.used = actual;
  }

  /**
   * Settles with what the call used (a number for the token limit, or tokens by name). Once: a
   * second settle sends nothing. Each limit's tokens back (positive) or charged (negative), or
   * null if there was nothing to settle.
   */
  async settle(actual?: Tokens): Promise<Record<string, number | null> | null> {
    const b = this.budget;
    const used = b.actuals(actual ?? this.used);
    const step = core(() => b.core.settle(b.backendName(), this.grant, used, now()));
    if (step.kind === 'nothing') return null;
    if (step.kind === 'done') return this.done(step.results ?? []);
    let reply: unknown;
    try {
      reply = await b.conn.call(step.args ?? []);
    } catch (e) {
      if (e instanceof Outage) {
        b.core.settleLost();
        return null;
      }
      throw e;
    }
    return this.done(core(() => b.core.settled(reply)));
  }

  private done(results: Array<number | null | undefined>): Record<string, number | null> {
    const out: Record<string, number | null> = {};
    this.budget.names.forEach((name, i) => (out[name] = results[i] ?? null));
    this.settlement = out;
    return out;
  }
}

function zip(names: string[], xs: number[]): Record<string, number> {
  const out: Record<string, number> = {};
  names.forEach((name, i) => {
    if (xs[i] !== undefined) out[name] = xs[i]!;
  });
  return out;
}

/**
 * A shared token budget: `reserve` an estimate on every limit at once (one `RL.BUDGET`, all or
 * nothing), `settle` the actual (one `RL.SETTLE`). Each limit is the bucket `{key}:<name>`.
 * Every decision (costs, replies, the failure policy's local buckets, settles) is the client
 * core's, the Rust and Python clients' code.
 */
export class TokenBudget {
  /** @internal */ readonly core: Binding.BudgetCore;
  /** @internal */ readonly conn: Connection;
  /** The limits' names, in the order the core keeps them. */
  readonly names: string[];

  constructor(
    client: RedisClient,
    readonly key: string,
    limit: LimitLike | null | undefined,
    options: TokenBudgetOptions = {},
  ) {
    if (typeof key !== 'string') throw new TypeError('key must be a string');
    const specs: Binding.BudgetLimitSpec[] = [];
    if (options.limits !== undefined) {
      if (limit != null) throw new TypeError('give a limit or options.limits ({ name: limit }), not both');
      for (const [name, spec] of Object.entries(options.limits)) {
        specs.push({ name, ...rateCap(spec, `limit ${JSON.stringify(name)}`) });
      }
    } else if (limit != null) {
      specs.push({ name: 'tokens', ...rateCap(limit) });
    } else {
      throw new TypeError('give the token limit ({ rate, cap } or "100000/minute") or options.limits');
    }
    if (options.requests !== undefined) specs.push({ name: REQUESTS, ...rateCap(options.requests, 'requests') });
    const ttlMs = options.ttlMs ?? DEFAULT_TTL_MS;
    const policy = options.failurePolicy ?? 'allow';
    this.core = core(() => new native.BudgetCore(key, specs, Math.ceil(ttlMs), policy, share(options.instances)));
    this.names = this.core.limits().map((l) => l.name);
    const timeout = options.timeoutMs === undefined ? 200 : options.timeoutMs;
    this.conn = new Connection(client, timeout, options.backend ?? 'auto');
  }

  /** Each limit: its bucket key, rate (tokens per second) and burst. */
  get limits(): Record<string, { key: string; rate: number; cap: number }> {
    const out: Record<string, { key: string; rate: number; cap: number }> = {};
    for (const l of this.core.limits()) out[l.name] = { key: l.key, rate: l.rate, cap: l.cap };
    return out;
  }

  /** What this budget counted so far. */
  get counters(): BudgetCounters {
    return this.core.counters();
  }

  /** @internal */
  backendName(): 'module' | 'functions' {
    return this.conn.backend ?? 'module';
  }

  /** @internal Each limit's actual use (null: its estimate). */
  actuals(actual: Tokens | undefined): Array<number | null> {
    if (actual === undefined || actual === null) return this.names.map(() => null);
    if (typeof actual === 'number') {
      // One number: the token limits' use (a request is a request).
      return this.names.map((name) => (name === REQUESTS ? null : actual));
    }
    if (typeof actual !== 'object') throw new TypeError('actual: a number of tokens, or tokens by limit name');
    for (const name of Object.keys(actual)) {
      if (!this.names.includes(name)) {
        throw new RangeError(`this budget has no limit ${JSON.stringify(name)} (its limits: ${this.names.join(', ')})`);
      }
    }
    return this.names.map((name) => (name in actual ? actual[name]! : null));
  }

  private costs(tokens: Tokens): number[] {
    if (typeof tokens === 'number') return core(() => this.core.costs(tokens, []));
    if (tokens === null || typeof tokens !== 'object') {
      throw new TypeError('tokens: a number, or tokens by limit name ({ input, output })');
    }
    const named = Object.entries(tokens).map(([name, n]) => ({ name, tokens: n }));
    return core(() => this.core.costs(null, named));
  }

  /**
   * Reserves `tokens` (a number for the token limit, or tokens by limit name; `requests`
   * costs 1) on every limit, or nothing on any. Denied by Redis, it waits and retries while
   * the wait Redis names fits in `waitMs` (default 0: answers at once).
   */
  async reserve(tokens: Tokens, options: { waitMs?: number } = {}): Promise<Reservation> {
    const costs = this.costs(tokens);
    const waitMs = options.waitMs ?? 0;
    if (!(Number.isFinite(waitMs) && waitMs >= 0 && waitMs <= 86_400_000)) {
      throw new RangeError('waitMs must be milliseconds between 0 and 86400000');
    }
    const deadline = now() + waitMs;
    for (;;) {
      const res = await this.once(costs);
      if (res.granted || res.source === 'fallback' || res.retryAfterMs > deadline - now()) return res;
      await new Promise((r) => setTimeout(r, Math.max(res.retryAfterMs, 1)));
    }
  }

  private async once(costs: number[]): Promise<Reservation> {
    let reply: unknown;
    try {
      const backend = await this.conn.resolve();
      const args = core(() => this.core.reserveCommand(backend, costs));
      reply = await this.conn.call(args, (late) => this.giveBack(costs, late));
    } catch (e) {
      if (e instanceof Outage) return new Reservation(this, core(() => this.core.outage(costs, now())), costs);
      throw e;
    }
    return new Reservation(this, core(() => this.core.reserved(costs, reply)), costs);
  }

  /** A reservation granted after its caller stopped waiting: settled at once with nothing used. */
  private giveBack(costs: number[], reply: unknown): void {
    try {
      const grant = this.core.reserved(costs, reply);
      const step = this.core.settle(this.backendName(), grant, costs.map(() => 0), now());
      if (step.kind === 'send' && step.args) {
        this.conn.call(step.args).then(
          (settled) => {
            try {
              this.core.settled(settled);
            } catch {
              // unknown: it expires charged
            }
          },
          () => undefined,
        );
      }
    } catch {
      // a malformed late reply: it expires charged
    }
  }
}
