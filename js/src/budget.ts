import type * as Binding from './binding';
import { Connection, Outage, type BackendOption, type RedisClient } from './client';
import { core } from './errors';
import { rateCap, type LimitLike } from './limits';
import { native } from './native';
import { LastCommands } from './patch';
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

/** How many numbers the core writes for a grant before each limit's remaining tokens. */
const GRANT_HEAD = 5;
const SETTLE_NOTHING = 0;
const SETTLE_DONE = 2;
const NO_COSTS = new Float64Array(0);

/**
 * The core keeps each open reservation's ticket (a number here): a reservation collected before
 * it was settled is forgotten there (it expires charged in Redis, as any unsettled one).
 */
const unsettled = new FinalizationRegistry<{ core: Binding.BudgetCore; ticket: number }>((held) => {
  try {
    held.core.forget(held.ticket);
  } catch {
    // nothing to give back: a finalizer must not throw
  }
});

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
  /** The core's ticket of this reservation (0: nothing to settle). */
  private ticket: number;

  /** @internal `out`: the grant the core just wrote (`GRANT_HEAD`, then each limit's remaining). */
  constructor(
    private readonly budget: TokenBudget,
    ticket: number,
    out: Float64Array,
    costs: Float64Array,
  ) {
    const names = budget.names;
    this.granted = out[0] === 1;
    this.retryAfterMs = out[1]!;
    const deniedBy = out[2]!;
    this.deniedBy = deniedBy < 0 ? null : (names[deniedBy] ?? null);
    const known = out[4]!;
    this.remaining = known < 0 ? null : zip(names, out.subarray(GRANT_HEAD, GRANT_HEAD + known));
    this.source = out[3] === 1 ? 'fallback' : 'server';
    this.reserved = zip(names, costs);
    this.ticket = ticket;
    if (ticket !== 0) unsettled.register(this, { core: budget.core, ticket });
  }

  /** Whether a settle still has something to close. */
  get open(): boolean {
    return this.ticket !== 0 && this.budget.core.open(this.ticket);
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
    const out = b.settleOut;
    const args = b.settleCommand(this.ticket, used);
    this.ticket = 0; // the core let go of it: settled once
    if (out[0] === SETTLE_NOTHING) return null;
    if (out[0] === SETTLE_DONE) return this.done(out.subarray(1));
    let reply: unknown;
    try {
      reply = await b.conn.call(args, undefined, b.routeKey);
    } catch (e) {
      if (e instanceof Outage) {
        b.core.settleLost();
        return null;
      }
      throw e;
    }
    const n = core(() => b.core.settled(reply, b.settleOut));
    return this.done(b.settleOut.subarray(0, n));
  }

  /** `results`: each limit's, NaN for none (the core's form). */
  private done(results: Float64Array): Record<string, number | null> {
    const out: Record<string, number | null> = {};
    this.budget.names.forEach((name, i) => {
      const r = results[i];
      out[name] = r === undefined || Number.isNaN(r) ? null : r;
    });
    this.settlement = out;
    return out;
  }
}

function zip(names: string[], xs: ArrayLike<number>): Record<string, number> {
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
  /** @internal Where the core writes a grant (read at once, before any await). */
  readonly grantOut: Float64Array;
  /** @internal Where the core writes a settle's kind and results (likewise). */
  readonly settleOut: Float64Array;
  private readonly commands = new LastCommands();
  private readonly settles = new LastCommands();
  /** @internal A key of the budget's (all share one slot): what routes its commands on a cluster. */
  readonly routeKey: string;

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
    const limits = this.core.limits();
    this.names = limits.map((l) => l.name);
    this.routeKey = limits[0]!.key;
    this.grantOut = new Float64Array(GRANT_HEAD + this.names.length);
    this.settleOut = new Float64Array(1 + this.names.length);
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

  /**
   * @internal Settles `ticket` in the core: its kind and results in `settleOut`, and the
   * command to send when there is one (empty otherwise).
   */
  settleCommand(ticket: number, used: Float64Array): string[] {
    const backend = this.backendName();
    const p = this.settles;
    const strings = core(() => this.core.settle(backend, ticket, used, now(), this.settleOut, p.has(backend), p.positions));
    return strings === null ? [] : p.apply(backend, strings);
  }

  /** @internal */
  backendName(): 'module' | 'functions' {
    return this.conn.backend ?? 'module';
  }

  /** @internal Each limit's actual use (NaN: its estimate; the core checks the rest). */
  actuals(actual: Tokens | undefined): Float64Array {
    const out = new Float64Array(this.names.length).fill(NaN);
    if (actual === undefined || actual === null) return out;
    if (typeof actual === 'number') {
      if (Number.isNaN(actual)) throw new RangeError('actual: a non-negative integer expected, got NaN');
      // One number: the token limits' use (a request is a request).
      this.names.forEach((name, i) => {
        if (name !== REQUESTS) out[i] = actual;
      });
      return out;
    }
    if (typeof actual !== 'object') throw new TypeError('actual: a number of tokens, or tokens by limit name');
    for (const name of Object.keys(actual)) {
      if (!this.names.includes(name)) {
        throw new RangeError(`this budget has no limit ${JSON.stringify(name)} (its limits: ${this.names.join(', ')})`);
      }
    }
    this.names.forEach((name, i) => {
      if (!(name in actual)) return;
      const x = actual[name];
      if (typeof x !== 'number' || Number.isNaN(x)) {
        throw new RangeError(`actual ${JSON.stringify(name)}: a non-negative integer expected, got ${String(x)}`);
      }
      out[i] = x;
    });
    return out;
  }

  private costs(tokens: Tokens): Float64Array {
    const out = new Float64Array(this.names.length);
    if (typeof tokens === 'number') {
      core(() => this.core.costs(tokens, [], NO_COSTS, out));
      return out;
    }
    if (tokens === null || typeof tokens !== 'object') {
      throw new TypeError('tokens: a number, or tokens by limit name ({ input, output })');
    }
    const names = Object.keys(tokens);
    const amounts = new Float64Array(names.length);
    names.forEach((name, i) => {
      const x = tokens[name];
      if (typeof x !== 'number') throw new TypeError(`tokens ${JSON.stringify(name)}: a number expected, got ${typeof x}`);
      amounts[i] = x;
    });
    core(() => this.core.costs(null, names, amounts, out));
    return out;
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

  private async once(costs: Float64Array): Promise<Reservation> {
    let reply: unknown;
    try {
      const backend = await this.conn.resolve();
      const p = this.commands;
      const args = p.apply(backend, core(() => this.core.reserveCommand(backend, costs, p.has(backend), p.positions)));
      reply = await this.conn.call(args, (late) => this.giveBack(costs, late), this.routeKey);
    } catch (e) {
      if (e instanceof Outage) {
        const ticket = core(() => this.core.outage(costs, now(), this.grantOut));
        return new Reservation(this, ticket, this.grantOut, costs);
      }
      throw e;
    }
    const ticket = core(() => this.core.reserved(costs, reply, this.grantOut));
    return new Reservation(this, ticket, this.grantOut, costs);
  }

  /** A reservation granted after its caller stopped waiting: settled at once with nothing used. */
  private giveBack(costs: Float64Array, reply: unknown): void {
    try {
      const ticket = this.core.reserved(costs, reply, this.grantOut);
      const args = this.settleCommand(ticket, new Float64Array(costs.length));
      if (args.length > 0) {
        this.conn.call(args, undefined, this.routeKey).then(
          (settled) => {
            try {
              this.core.settled(settled, this.settleOut);
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
