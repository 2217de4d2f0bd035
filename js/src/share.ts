// `ShareLimiter`: a share of one key's rate (`RL.SHARE`), spent from a local bucket; the share
// is refreshed in the background through the user's client, so a take never waits for Redis.
//
// What a take gets, what the next call asks for and when it goes are the client core's share
// holder (client-core/src/share_holder.rs, bound in js/native/src/share.rs): the same code the
// Rust and Python clients run. This file keeps what is JavaScript: the refresh timers (unref'd:
// a limiter never keeps the process alive), the calls through the user's client, the holder's
// id, close().

import { randomBytes } from 'crypto';
import type * as Binding from './binding';
import { Connection, Outage, type BackendOption, type RedisClient } from './client';
import { core, ServerError } from './errors';
import { Decision } from './limiter';
import { rateCap, type LimitLike } from './limits';
import { native } from './native';
import type { FailurePolicy } from './policy';

const now = (): number => performance.now();
/** How often the refresh looks at the demand between calls (ms): the core's drift tick. */
const DRIFT_TICK_MS = 25;
const PINS: readonly Decision['pinned'][] = [null, 'rate', 'block', 'exempt'];
const slots = new Float64Array(8);

/** What a share limiter holds now (`limiter.share()`). */
export type ShareInfo = Omit<Binding.ShareInfo, 'pinned'> & { pinned: 'rate' | 'block' | 'exempt' | null };
/** A share limiter's counters (this process). */
export type ShareCounters = Binding.ShareCounters;

export interface ShareLimiterOptions {
  /** Tokens per second for the whole fleet (with `cap`), or give `limit`. */
  rate?: number;
  /** The bucket's capacity (the fleet's burst). */
  cap?: number;
  /** A limit instead of `rate` and `cap` (`'100/s'`, `{ rate, cap }`). */
  limit?: LimitLike;
  /** Seconds between share renewals (0.01 to 3600; default 1). */
  period?: number;
  /** Extra want above the measured demand (a fraction, default 0). */
  headroom?: number;
  /** While Redis is unreachable and the share's lease ended: `allow` (default, as Python), `last_known`, `deny`. */
  policy?: FailurePolicy;
  /** Holders assumed before any answer (the `allow` policy's `rate / holders`); default 4. */
  instances?: number;
  /** Seconds the `allow` policy lets through after the share ended (default 30). */
  allowFor?: number;
  /** Seconds each RL.SHARE call may take before it counts as an outage (as `period`, Python's unit); default 0.2; null: no limit. */
  timeout?: number | null;
  /** Seconds between calls while Redis is down (at most a period); default 0.5. */
  probeInterval?: number;
  /** The retry hint of a `deny` fallback decision, in seconds; default 1. */
  denyRetryAfter?: number;
  /** `auto` (default), `module` or `functions`. */
  backend?: BackendOption;
}

function seconds(what: string, x: unknown): number {
  if (!(typeof x === 'number' && Number.isFinite(x) && x >= 0)) throw new RangeError(`${what} must be finite seconds, at least 0`);
  return x;
}

let ids = 0;
/** Unique per limiter object and process (1 to 64 bytes, as the protocol requires). */
function newHolderId(): string {
  return `${process.pid}-${ids++}-${Date.now().toString(16)}-${randomBytes(6).toString('hex')}`;
}

/** Whether a call's failure was a refused connection: the command never left. */
function neverSent(e: unknown): boolean {
  const seen = new Set<unknown>();
  for (let cur: unknown = e; cur instanceof Error && !seen.has(cur); cur = (cur as { cause?: unknown }).cause) {
    seen.add(cur);
    if ((cur as { code?: unknown }).code === 'ECONNREFUSED' || /ECONNREFUSED|Connection refused/.test(cur.message)) {
      return true;
    }
  }
  return false;
}

/**
 * A limiter of one key shared by a fleet, where each instance holds a share of the rate
 * (`RL.SHARE`): `take(n)` is decided by a local bucket at the granted rate and burst, from
 * memory (synchronous, never waits for Redis); the share is refreshed every `period` seconds
 * in the background with the measured demand as its want. Redis unreachable: the share is
 * used until its lease ends, then the failure policy decides (`source: 'fallback'`); an error
 * reply to the refresh is thrown from takes once no share may be used. `close()` gives the
 * share back (`RELEASE`).
 */
export class ShareLimiter {
  readonly key: string;
  readonly rate: number;
  readonly cap: number;
  /** Seconds between share renewals. */
  readonly period: number;
  /** This holder's id. */
  readonly holderId: string = newHolderId();
  private readonly core: Binding.ShareCore;
  private readonly conn: Connection;
  private readonly periodMs: number;
  private readonly probeMs: number;
  private timer: NodeJS.Timeout | null = null;
  /** The call in the air (one at a time per holder: a release waits for it). */
  private inAir: Promise<void> | null = null;
  private failure: Error | null = null;
  /** When the last call was sent: a late reply to an older one is dropped (it would overtake the newer). */
  private lastSent = -1;
  /** A call may have given this holder a share on the server: close() releases it. */
  private mayHold = false;
  private closed = false;

  constructor(client: RedisClient, key: string, options: ShareLimiterOptions = {}) {
    if (typeof key !== 'string') throw new TypeError('key must be a string');
    const { rate, cap } =
      options.limit !== undefined ? rateCap(options.limit) : rateCap({ rate: options.rate!, cap: options.cap! } as LimitLike);
    const period = options.period ?? 1;
    if (!(typeof period === 'number' && period >= 0.01 && period <= 3600)) {
      throw new RangeError('period must be between 0.01 and 3600 seconds');
    }
    const instances = options.instances ?? 4;
    if (!Number.isSafeInteger(instances) || instances < 1) throw new RangeError('instances must be a positive integer');
    const allowFor = options.allowFor ?? 30;
    if (!(typeof allowFor === 'number' && allowFor >= 0 && Number.isFinite(allowFor))) {
      throw new RangeError('allowFor must be finite seconds, at least 0');
    }
    this.periodMs = Math.max(10, Math.min(3_600_000, Math.round(period * 1000)));
    this.core = core(
      () =>
        new native.ShareCore(
          key,
          rate,
          cap,
          this.periodMs,
          null,
          options.headroom ?? 0,
          options.policy ?? 'allow',
          1,
          instances,
          allowFor * 1000,
          seconds('denyRetryAfter', options.denyRetryAfter ?? 1) * 1000,
          now(),
        ),
    );
    this.probeMs = seconds('probeInterval', options.probeInterval ?? 0.5) * 1000;
    if (this.probeMs <= 0) throw new RangeError('probeInterval must be positive seconds');
    const timeout = options.timeout === undefined ? 0.2 : options.timeout;
    if (timeout !== null && !(typeof timeout === 'number' && timeout > 0)) {
      throw new RangeError('timeout must be positive seconds (or null: no limit)');
    }
    this.conn = new Connection(client, timeout === null ? null : timeout * 1000, options.backend ?? 'auto');
    this.key = key;
    this.rate = rate;
    this.cap = cap;
    this.period = period;
    this.schedule(0);
  }

  /**
   * Decides on `n` tokens (default 1) from the local bucket: synchronous, never waits for
   * Redis. Throws `RangeError` for an `n` never grantable, an `Error` after `close()`, and the
   * error reply the last refresh got (`ServerError`) once no share may be used.
   */
  take(n = 1): Decision {
    if (this.closed) throw new Error(`redis-rl: take on a closed ShareLimiter (${this.key})`);
    if (typeof n !== 'number') throw new TypeError('n must be a number (a positive integer)');
    if (!core(() => this.core.take(n, slots, now()))) {
      throw this.failure ?? new ServerError('RL.SHARE failed');
    }
    return new Decision(
      slots[0] === 1,
      slots[1]!,
      slots[2]!,
      slots[3]!,
      slots[4]!,
      slots[5]!,
      slots[6] === 1 ? 'fallback' : 'share',
      PINS[slots[7]!] ?? null,
    );
  }

  /** The share held now, the local bucket and the holders seen. */
  share(): ShareInfo {
    const i = core(() => this.core.info(now()));
    return { ...i, pinned: (i.pinned ?? null) as ShareInfo['pinned'] };
  }

  /** What this limiter counted so far. */
  get counters(): ShareCounters {
    return this.core.counters();
  }

  private schedule(ms: number): void {
    if (this.closed) return;
    const due = now() + ms;
    const tick = (): void => {
      this.timer = null;
      if (this.closed) return;
      const left = due - now();
      if (left > 0 && !core(() => this.core.drifted(now()))) {
        this.timer = setTimeout(tick, Math.min(left, DRIFT_TICK_MS));
        this.timer.unref();
        return;
      }
      const call = this.refresh().then(
        (next) => this.schedule(next),
        () => this.schedule(this.periodMs),
      );
      this.inAir = call.finally(() => {
        this.inAir = null;
      });
    };
    this.timer = setTimeout(tick, Math.min(ms, DRIFT_TICK_MS));
    this.timer.unref();
  }

  /** One RL.SHARE call and its outcome: milliseconds until the next. Never rejects. */
  private async refresh(): Promise<number> {
    const c = this.core;
    let backend;
    try {
      backend = await this.conn.resolve();
    } catch (e) {
      return this.outcome(0, e);
    }
    if (this.closed) return 0;
    const sent = now();
    const args = core(() => c.send(backend, this.holderId, sent));
    this.lastSent = sent;
    try {
      const reply = await this.conn.call(args, (late) => this.late(late, sent), this.key);
      return this.outcome(sent, undefined, reply);
    } catch (e) {
      return this.outcome(sent, e);
    }
  }

  /** A reply after the timeout is still an answer, while no newer call was sent. */
  private late(reply: unknown, sent: number): void {
    if (this.closed || this.lastSent !== sent) return;
    try {
      core(() => this.core.answered(reply, sent, now(), 0));
      this.mayHold = true;
    } catch {
      // a malformed late reply changes nothing
    }
  }

  private outcome(sent: number, e: unknown, reply?: unknown): number {
    const c = this.core;
    if (e === undefined) {
      try {
        const next = core(() => c.answered(reply, sent, now(), Math.random()));
        this.mayHold = true;
        this.failure = null;
        return next;
      } catch (err) {
        this.failure = err instanceof Error ? err : new ServerError(String(err));
        return c.failed();
      }
    }
    if (e instanceof Outage) {
      const refused = neverSent(e);
      this.mayHold = this.mayHold || !refused;
      return c.outage(refused, now(), this.probeMs);
    }
    this.failure = e instanceof Error ? e : new ServerError(String(e));
    return c.failed();
  }

  /**
   * Gives the share back (`RELEASE`: the others get it once its hold ends) and stops
   * refreshing; later takes throw. Waits for a refresh in the air first (a release it
   * overtook would not count); rejects with the release's failure (an outage: the share ends
   * with its lease on the server).
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.inAir !== null) await this.inAir;
    const backend = this.conn.backend;
    if (backend === null || !this.mayHold) return; // never given a share: nothing to release
    const args = core(() => this.core.releaseCommand(backend, this.holderId));
    const reply = await this.conn.call(args, undefined, this.key);
    core(() => native.checkShareReply(reply));
  }
}
