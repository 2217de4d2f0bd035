// PrefetchLimiter: takes served from a batch of tokens leased from Redis (`RL.LEASE`), the
// client core's prefetch ledger deciding what is held, when to renew, what a call leaves and
// who in the waiting line a landing serves. This shell only sends the calls the ledger hands
// out through the user's client, keeps the timers, and wakes the takes the ledger names.
// Node runs one call at a time: the ledger lives in one native object, no lock.

import type * as Binding from './binding';
import { Connection, Outage, type BackendOption, type Backend, type RedisClient } from './client';
import { core, fromNative, ServerError } from './errors';
import { Decision, DEFAULT_TIMEOUT_MS, fromSlots } from './limiter';
import { rateCap, type LimitLike } from './limits';
import { native } from './native';
import { share, type Source } from './policy';

const now = (): number => performance.now();

/** How long past a lease call's own bound a take waiting behind it waits at most (the core's `LATE_SLACK`). */
const LATE_SLACK_MS = 1000;

/** Who decided a prefetching take: `lease` when served from the held batch. */
export type PrefetchSource = Source;
const LEASE: Source = 'lease';

export interface PrefetchOptions {
  /** The limit: `{ rate, cap }` here, or `limit` (`'1000/second'` or `{ rate, cap }`). */
  rate?: number;
  cap?: number;
  limit?: LimitLike;
  /** Tokens leased per call (default 20; a take of more leases its own size). At most `cap`. */
  batch?: number;
  /** A lease's lifetime in milliseconds (default 2000): it is spent only until `sent + ttl`. */
  ttlMs?: number;
  /** Renew when the tokens held fall to this fraction of the batch, in [0, 1) (default 0.2). */
  renewAt?: number;
  /** The renewal threshold's spread, a fraction of the batch in [0, 1] (default 0.1). */
  jitter?: number;
  /** `allow` (default) or `deny` while Redis does not answer. */
  failurePolicy?: 'allow' | 'deny';
  /** The instances sharing the limit (the local bucket's share); default 4. */
  instances?: number;
  /** Milliseconds a take's own lease call may take before the failure policy decides (200). */
  timeoutMs?: number | null;
  backend?: BackendOption;
  /** The bucket's tokens when Redis creates it (default: full), and its version. */
  init?: number;
  version?: number;
}

/** A prefetching limiter's counters (this process). */
export interface PrefetchCounters extends Binding.PrefetchCounters {
  granted: number;
  denied: number;
  tokensGranted: number;
}

type Outcome =
  | { kind: 'none' }
  | { kind: 'granted' }
  | { kind: 'denied' }
  | { kind: 'stale' }
  | { kind: 'outage' }
  | { kind: 'failed'; error: unknown };

const NONE: Outcome = { kind: 'none' };

/** A take's place in the ledger's line, and the lease call it made (if any). */
class Place {
  id = 0;
  own = 0;
  private permit = false;
  private resolve: ((woken: boolean) => void) | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;

  constructor(readonly n: number) {}

  notify(): void {
    if (this.resolve === null) {
      this.permit = true;
      return;
    }
    const r = this.resolve;
    this.resolve = null;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    r(true);
  }

  /** Woken (true) or `until` passed (false). */
  wait(until: number): Promise<boolean> {
    if (this.permit) {
      this.permit = false;
      return Promise.resolve(true);
    }
    return new Promise<boolean>((resolve) => {
      this.resolve = resolve;
      if (until !== Infinity) {
        this.timer = setTimeout(() => {
          this.timer = null;
          this.resolve = null;
          resolve(false);
        }, Math.max(0, until - now()));
      }
    });
  }
}

/**
 * A token bucket in Redis spent from memory: `take()` is served from a leased batch (one
 * native call, no Redis round trip) and a background `RL.LEASE` renews the batch as it runs
 * low, settling the older lease in the same call. Across instances at most
 * `cap + rate * t + 2 * batch * instances` tokens are granted in `t` seconds. While Redis
 * does not answer, the failure policy decides (`source: 'fallback'`); an error reply is
 * thrown as a `ServerError`, a malformed reply as a `ProtocolError`. `close()` returns what
 * is held.
 */
export class PrefetchLimiter {
  readonly key: string;
  readonly rate: number;
  readonly cap: number;
  private readonly core: Binding.PrefetchCore;
  private readonly conn: Connection;
  /** The lease calls' way: the same client, awaited up to the one late-reply bound. */
  private readonly leaseConn: Connection;
  private readonly timeoutMs: number | null;
  private readonly slots = new Float64Array(8);
  private readonly waiters = new Map<number, Place>();
  private last: [number, Outcome] = [0, NONE];
  private tasks = 0;
  private idle: Array<() => void> = [];
  private closed = false;
  private count = { granted: 0, denied: 0, tokensGranted: 0 };

  constructor(client: RedisClient, key: string, options: PrefetchOptions) {
    if (typeof key !== 'string') throw new TypeError('key must be a string');
    if (options === null || typeof options !== 'object') throw new TypeError('options expected: { rate, cap, ... }');
    const { rate, cap } = rateCap(options.limit ?? { rate: options.rate as number, cap: options.cap as number });
    const policy = options.failurePolicy ?? 'allow';
    if (policy !== 'allow' && policy !== 'deny') {
      throw new RangeError(`failurePolicy ${JSON.stringify(policy)}: 'allow' or 'deny'`);
    }
    const timeout = options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : options.timeoutMs;
    this.conn = new Connection(client, timeout, options.backend ?? 'auto');
    this.core = core(
      () =>
        new native.PrefetchCore(
          key,
          rate,
          cap,
          options.batch ?? 20,
          options.ttlMs ?? 2000,
          options.renewAt ?? 0.2,
          options.jitter ?? 0.1,
          timeout,
          policy,
          share(options.instances),
          options.init ?? null,
          options.version ?? null,
        ),
    );
    this.leaseConn = new Connection(client, this.core.lateBoundMs, 'module');
    this.timeoutMs = timeout;
    this.key = key;
    this.rate = this.core.rate;
    this.cap = this.core.cap;
  }

  /**
   * Takes `n` tokens (default 1): from memory when the held batch has them, else through a
   * lease call made for this take (waiting takes are served in arrival order), else (an
   * outage) by the failure policy.
   */
  take(n = 1): Promise<Decision> {
    let d: Decision | null;
    try {
      d = this.takeSync(n);
    } catch (e) {
      // A bad `n` rejects, as every take of this package does.
      return Promise.reject(e);
    }
    return d !== null ? Promise.resolve(d) : this.slow(n);
  }

  /**
   * The take from memory only: the decision when the held batch serves `n` with nothing
   * else to do, else `null` (nothing changed: `take` decides).
   */
  takeSync(n = 1): Decision | null {
    if (this.closed) return null;
    const left = core(() => this.core.grant(n, now()));
    if (left < 0) return null;
    return new Decision(true, n, left, 0, 0, this.cap, LEASE, null);
  }

  /** The tokens held in memory now. */
  get held(): number {
    return this.core.held(now());
  }

  private async slow(n: number): Promise<Decision> {
    core(() => this.core.check(n));
    const timeout = this.timeoutMs ?? Infinity;
    let deadline = now() + timeout;
    let asked = false;
    // This take made a lease call of its own (its deadline was renewed for it).
    let started = false;
    const place = new Place(n);
    try {
      for (;;) {
        if (this.closed) throw closedError();
        const local = this.decideLocally(n);
        if (local !== null) {
          // Counted already; after a call of its own, Redis's grant.
          if (asked && local.granted) return new Decision(true, n, local.remaining, 0, 0, this.cap, 'server', null);
          return local;
        }
        let backend: Backend;
        try {
          backend = await this.conn.resolve();
        } catch (e) {
          if (e instanceof Outage) {
            this.core.callFailed(now());
            return this.fallback(n);
          }
          throw e;
        }
        if (this.closed) throw closedError();
        const t = now();
        const flying = this.core.inFlight;
        // The call waited for: another's (`seen`) or its own.
        let seen = 0;
        let own = 0;
        if (!flying && started && t >= deadline) {
          // Others spent what this take's own call brought, and its time is up.
          return this.decided(this.denied(0, 'server'));
        }
        if (!flying && !this.core.mayCall(t)) return this.fallback(n);
        // A probe is in flight, or the call's own caller judged it an outage: do not wait
        // for a Redis believed down.
        if (flying && this.core.down) return this.fallback(n);
        const b = core(() => this.core.begin(backend, n, t));
        if (b.kind === 'closed') {
          if (this.closed) throw closedError();
          return this.fallback(n);
        }
        if (b.kind === 'busy') {
          this.enter(place, false);
          seen = b.flight;
        } else {
          if (!started) {
            // A take that waited behind other calls gives its own the whole timeout.
            started = true;
            deadline = t + timeout;
          }
          place.own = b.flight;
          own = b.flight;
          this.enter(place, true);
          this.fetch(b.flight, b.command!);
        }
        asked = true;
        // Only a call's own caller judges it by its timeout; a take behind another's call
        // waits for it up to the call's own bound (a busy process is no outage).
        const until = own !== 0 ? deadline : Math.max(deadline, now() + this.core.lateBoundMs + LATE_SLACK_MS);
        const woken = await place.wait(until);
        let last: Outcome | null;
        if (own !== 0) {
          const ended = this.core.hasEnded(own);
          // Redis is slow (not woken, not ended): an outage for this caller and the next
          // ones; the call goes on, and its outcome ends the outage if it succeeds.
          const claimed = ended ? this.core.claim(own) : !woken ? this.core.giveUp(own) : null;
          last = this.last[0] === own ? this.last[1] : null;
          if (!ended && claimed === null && !woken) {
            this.core.callFailed(now());
            this.wakeIds(this.core.wake(false));
          }
          const t2 = now();
          const left = this.core.held(t2);
          place.own = 0;
          if (claimed !== null) {
            // Its grant may leave the batch at the threshold: renew as a take from memory would.
            if (!this.closed && this.core.renewalDue(t2, this.core.down)) this.renew(backend, t2);
            return this.decided(new Decision(true, claimed, left, 0, 0, this.cap, 'server', null));
          }
          if (!ended && !woken) return this.fallback(n);
        } else {
          last = this.last[0] === seen ? this.last[1] : null;
          // Past the call's own bound: the call is not this take's to judge.
          if (last === null && !woken) return this.fallback(n);
        }
        switch (last?.kind) {
          case 'outage':
            return this.fallback(n);
          case 'failed':
            throw last.error;
          case 'stale':
            return this.decided(this.denied(0, 'server'));
          default:
            // Granted or denied: the ledger says what is there now.
            continue;
        }
      }
    } finally {
      this.leave(place);
    }
  }

  /** A grant from the held batch or a recent denial (starting a renewal when due); null: ask Redis. */
  private decideLocally(n: number): Decision | null {
    const t = now();
    const local = core(() => this.core.take(n, t, this.core.down || this.closed));
    if (local.kind === 'ask') return null;
    if (local.kind === 'denied') return this.decided(this.denied(local.value, LEASE));
    // A lease exists only after a call, which resolved the backend.
    const backend = this.conn.backend;
    if (local.renew && backend !== null) this.renew(backend, t);
    return this.decided(new Decision(true, n, local.value, 0, 0, this.cap, LEASE, null));
  }

  private renew(backend: Backend, t: number): void {
    const b = this.core.begin(backend, 0, t);
    if (b.kind === 'send') this.fetch(b.flight, b.command!);
  }

  private decided(d: Decision): Decision {
    if (d.granted) {
      this.count.granted += 1;
      this.count.tokensGranted += d.tokens;
    } else {
      this.count.denied += 1;
    }
    return d;
  }

  private denied(retryAfterMs: number, source: Source): Decision {
    return new Decision(false, 0, 0, retryAfterMs, 0, this.cap, source, null);
  }

  private fallback(n: number): Decision {
    core(() => this.core.outage(n, now(), this.slots));
    return fromSlots(this.slots);
  }

  /** Stands in line (at the front for its own call, else in arrival order), unless there already. */
  private enter(place: Place, front: boolean): void {
    const id = this.core.enterLine(place.n, front, place.id === 0 ? null : place.id);
    place.id = id;
    this.waiters.set(id, place);
  }

  /** Leaving (served, timed out, failed), a take gives back what its call spent for it if it never took it. */
  private leave(place: Place): void {
    if (place.id === 0 && place.own === 0) return;
    if (place.own !== 0) this.core.release(place.own, false, now());
    this.waiters.delete(place.id);
    if (place.id !== 0) {
      const next = this.core.leaveLine(place.id);
      if (next !== null) {
        const w = this.waiters.get(next);
        if (w !== undefined) {
          this.waiters.delete(next);
          w.notify();
        }
      }
    }
  }

  private wakeIds(ids: number[]): void {
    for (const id of ids) {
      const w = this.waiters.get(id);
      if (w !== undefined) {
        this.waiters.delete(id);
        w.notify();
      }
    }
  }

  /** One lease call, as the ledger built it: what it brings is installed or returned; the line is woken. */
  private fetch(flight: number, command: string[]): void {
    this.tasks += 1;
    this.leaseConn.call(command).then(
      (reply) => this.landed(flight, reply),
      (e: unknown) => this.failed(flight, e),
    );
  }

  private landed(flight: number, reply: unknown): void {
    let outcome: Outcome;
    let back: number[][] = [];
    try {
      const l = this.core.landed(flight, reply, now(), Math.random());
      this.core.callSucceeded();
      back = l.giveBack;
      outcome =
        l.kind === 'granted'
          ? { kind: 'granted' }
          : l.kind === 'denied'
            ? { kind: 'denied' }
            : l.kind === 'stale'
              ? { kind: 'stale' }
              : { kind: 'failed', error: closedError() };
    } catch (e) {
      outcome = { kind: 'failed', error: fromNative(e) };
    }
    this.ended(flight, outcome, back);
  }

  private failed(flight: number, e: unknown): void {
    let outcome: Outcome;
    let kind: string;
    if (e instanceof Outage) {
      // Neither client says whether a command that failed was written: a lease it may have
      // opened is counted lost, never reused.
      kind = 'unknown';
      this.core.callFailed(now());
      outcome = { kind: 'outage' };
    } else {
      kind = 'refused';
      if (e instanceof ServerError) this.core.error();
      outcome = { kind: 'failed', error: e };
    }
    const back = this.core.failed(flight, kind, now());
    this.ended(flight, outcome, back);
  }

  private ended(flight: number, outcome: Outcome, back: number[][]): void {
    for (const [id, left] of back) {
      this.tasks += 1;
      this.giveBack(id!, left!).then(
        () => this.taskDone(),
        () => this.taskDone(),
      );
    }
    const woken = this.core.wake(outcome.kind === 'granted');
    this.last = [flight, outcome];
    this.wakeIds(woken);
    this.taskDone();
  }

  private taskDone(): void {
    this.tasks -= 1;
    if (this.tasks === 0 && !this.core.inFlight) {
      const idle = this.idle;
      this.idle = [];
      for (const f of idle) f();
    }
  }

  /** `RL.RETURN` of a lease's leftover: the tokens credited back; a failed return counts the lease lost. */
  private async giveBack(id: number, left: number): Promise<number> {
    try {
      const backend = await this.conn.resolve();
      const args = core(() => this.core.returnCommand(backend, id, left));
      const reply = await this.conn.call(args);
      const credited = core(() => this.core.parseReturn(reply));
      this.core.returned(id, left, true);
      return credited;
    } catch (e) {
      this.core.returned(id, left, false);
      throw e;
    }
  }

  /**
   * Stops leasing and returns the held leftovers (`RL.RETURN` per live lease): the tokens
   * Redis credited back. Waits for a lease call in flight up to the timeout (what it brings
   * later is returned when it lands). Later takes throw.
   */
  async close(): Promise<number> {
    if (this.closed) return 0;
    this.closed = true;
    const leases = this.core.close(now());
    if (this.tasks > 0 || this.core.inFlight) {
      await new Promise<void>((resolve) => {
        const timer = this.timeoutMs === null ? null : setTimeout(resolve, this.timeoutMs);
        this.idle.push(() => {
          if (timer !== null) clearTimeout(timer);
          resolve();
        });
      });
    }
    let credited = 0;
    let failure: unknown = null;
    for (const [id, left] of leases) {
      try {
        credited += await this.giveBack(id!, left!);
      } catch (e) {
        failure ??= e;
      }
    }
    if (failure !== null) throw failure;
    return credited;
  }

  /** What this limiter counted so far. */
  get counters(): PrefetchCounters {
    const c = this.core.counters();
    return {
      ...c,
      granted: this.count.granted + c.memoryGrants,
      denied: this.count.denied,
      tokensGranted: this.count.tokensGranted + c.memoryTokens,
    };
  }
}

function closedError(): Error {
  return new Error('redis-rl: take on a closed PrefetchLimiter');
}
