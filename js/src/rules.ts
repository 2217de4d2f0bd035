// Rules: a rules document (layers of limits chosen by a request's attributes) checked with
// one RL.MTAKE for every enforced bucket that applies, shadow layers after. The document's
// validation, the plan, the calls, what a reply or a failure leaves and the decision are the
// client core's (the same as the Rust and Python `Rules`); this shell sends the calls through
// the user's client and gives back the refunds the core names.

import type * as Binding from './binding';
import { Connection, Outage, type Backend, type BackendOption, type RedisClient } from './client';
import { core, ProtocolError, RedisRlError, ServerError } from './errors';
import { DEFAULT_TIMEOUT_MS } from './limiter';
import { native } from './native';
import type { Source } from './policy';

/** One problem of a document that does not validate: where and what. */
export type RulesProblem = Binding.RulesProblem;

/** A rules document that does not validate: every problem found. */
export class RulesError extends RedisRlError {
  constructor(readonly problems: RulesProblem[]) {
    super(
      `invalid rules document, ${problems.length} problem(s): ` +
        problems.map((p) => `${p.line != null ? `line ${p.line}: ` : ''}${p.field}: ${p.message}`).join('; '),
    );
  }
}

/** A request's attributes (`ip`, `user`, `path`, the document's own): absent, null or a value (read as a string). */
export type Attributes = Record<string, unknown> | Map<string, unknown>;

/** A check's answer. */
export class RuleDecision {
  /** @internal */
  constructor(
    /** Whether the request is let through. */
    readonly granted: boolean,
    /** The deciding bucket's tokens left. */
    readonly remaining: number,
    readonly retryAfterMs: number,
    readonly resetAfterMs: number,
    /** Tokens taken from each enforced bucket (0 when refused). */
    readonly tokens: number,
    /** The deciding bucket's cap (0 when no enforced layer applied). */
    readonly limit: number,
    /** The refusing layer, or the binding one when granted (null: none applied, or fail-open). */
    readonly layer: string | null,
    /** The deciding layer's error code. */
    readonly code: string | null,
    /** The deciding bucket's key. */
    readonly key: string | null,
    /** Shadow layers that would have refused (reported, never enforced). */
    readonly shadowDenied: string[],
    /** `fallback` when Redis failed and the failure policy decided. */
    readonly source: Source,
  ) {}

  /** Seconds until a retry may be granted (at least 1), as `Retry-After` says. */
  get retryAfterSecs(): number {
    return Math.max(1, Math.ceil(this.retryAfterMs / 1000));
  }

  /**
   * The binding layer's `X-RateLimit-Limit`, `-Remaining`, `-Reset`, and `Retry-After` when
   * refused; none when no layer applied (only `Retry-After` if refused).
   */
  headers(): Record<string, string> {
    if (this.layer === null) return this.granted ? {} : { 'Retry-After': String(this.retryAfterSecs) };
    const flat = core(() =>
      native.decisionHeaders(this.granted, this.remaining, this.retryAfterMs, this.resetAfterMs, this.limit),
    );
    const out: Record<string, string> = {};
    for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]!] = flat[i + 1]!;
    return out;
  }

  /** The 429 body, as the Rust and Python clients write it: `{"code", "layer", "retry_after"}`. */
  body(): string {
    return JSON.stringify({ code: this.code, layer: this.layer, retry_after: this.retryAfterSecs });
  }
}

export interface RulesOptions {
  /** Redis failing (no reply, an error reply) grants (true, default) or refuses with the first enforced layer. */
  failOpen?: boolean;
  /** Milliseconds each call may take before it counts as failed (200; null: none). */
  timeoutMs?: number | null;
  backend?: BackendOption;
  /** One RL.MTAKE per hash slot (a cluster client); default: whether the client is an ioredis `Cluster`. */
  cluster?: boolean;
}

/** The document in `doc`: YAML or JSON text, or an object (written as JSON). Throws `RulesError`. */
function parseDocument(doc: string | object): Binding.RulesDocument {
  let text: string;
  if (typeof doc === 'string') text = doc;
  else if (doc !== null && typeof doc === 'object') text = JSON.stringify(doc);
  else throw new TypeError('a rules document is YAML or JSON text, or an object');
  const problems = core(() => native.rulesProblems(text));
  if (problems.length > 0) throw new RulesError(problems);
  return core(() => new native.RulesDocument(text));
}

/** The rules of `doc` checked against Redis through `client`. */
export class Rules {
  private readonly conn: Connection;
  private readonly failOpen: boolean;
  private readonly cluster: boolean;
  private doc: Binding.RulesDocument;
  private names: string[];
  private used: boolean[];
  /** The stored document's hash (`fromRedis`), and the version in force / last refused. */
  private source: string | null = null;
  private version: number | null = null;
  private refusedVersion: number | null = null;
  private timer: ReturnType<typeof setInterval> | null = null;
  /** New documents put in force, stored ones refused (invalid), polls that failed. */
  readonly stats = { reloads: 0, refused: 0, pollErrors: 0 };

  constructor(client: RedisClient, doc: string | object, options: RulesOptions = {}) {
    this.doc = parseDocument(doc);
    this.names = this.doc.attributes;
    this.used = this.doc.used;
    this.failOpen = options.failOpen ?? true;
    this.cluster = options.cluster ?? (client as { isCluster?: unknown }).isCluster === true;
    const timeout = options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : options.timeoutMs;
    this.conn = new Connection(client, timeout, options.backend ?? 'auto');
  }

  /**
   * The document stored in the hash `key` (`version`, `document`, `updated_at`: what
   * `python -m redis_rl rules apply` writes), as the Rust and Python `Rules.from_redis`.
   * Follow it with `follow(everyMs)` (or `refresh()`). Throws if none is stored.
   */
  static async fromRedis(client: RedisClient, key = 'rl:rules', options: RulesOptions = {}): Promise<Rules> {
    const timeout = options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : options.timeoutMs;
    const conn = new Connection(client, timeout, 'module');
    const [version, text] = await fetchStored(conn, key);
    if (version === null || text === null) throw new RulesError([{ field: '(document)', message: `no rules document stored under ${key}` }]);
    const rules = new Rules(client, text, options);
    rules.source = key;
    rules.version = version;
    return rules;
  }

  /** The stored version in force (null: a document given directly). */
  get documentVersion(): number | null {
    return this.version;
  }

  /**
   * Polls the stored version once; a new valid document is put in force (true). An invalid
   * one is refused (counted, the one in force kept); a failed poll is counted, never thrown.
   */
  async refresh(): Promise<boolean> {
    const key = this.source;
    if (key === null) return false;
    try {
      const raw = await this.conn.call(['HGET', key, 'version']);
      const version = asInt(raw);
      if (version === null || version === this.version || version === this.refusedVersion) return false;
      const [v, text] = await fetchStored(this.conn, key);
      if (v === null || text === null) return false;
      try {
        this.replace(text);
      } catch (e) {
        if (!(e instanceof RulesError)) throw e;
        this.refusedVersion = v;
        this.stats.refused += 1;
        return false;
      }
      this.version = v;
      this.stats.reloads += 1;
      return true;
    } catch {
      this.stats.pollErrors += 1;
      return false;
    }
  }

  /** Polls the stored document every `everyMs` (default 1000) until `close()`; the timer does not keep Node alive. */
  follow(everyMs = 1000): void {
    if (this.source === null) throw new Error('redis-rl: only a stored document (Rules.fromRedis) is followed');
    if (this.timer !== null) return;
    this.timer = setInterval(() => void this.refresh(), everyMs);
    this.timer.unref?.();
  }

  /** Stops following. */
  close(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** The document's key prefix. */
  get prefix(): string {
    return this.doc.prefix;
  }

  /** The layers that apply to `attrs`, and their buckets' keys (no call). */
  plan(attrs: Attributes): Array<{ layer: string; keys: string[] }> {
    return core(() => this.doc.plan(this.values(attrs)));
  }

  /**
   * Takes `cost` tokens (default 1) from every bucket of every enforced layer that applies
   * to `attrs`, all or nothing. Redis failing is decided by the failure policy (never
   * thrown); a malformed reply is a `ProtocolError`; a cost no bucket could grant a `RangeError`.
   */
  async check(attrs: Attributes, cost = 1): Promise<RuleDecision> {
    const c = core(() => this.doc.check(this.values(attrs), cost, this.failOpen, this.cluster));
    let backend: Backend | null = this.conn.backend;
    let malformed: string | null = null;
    for (;;) {
      // The backend is looked up only once a call is due.
      if (backend === null && c.command(false) !== null) {
        try {
          backend = await this.conn.resolve();
        } catch (e) {
          if (!(e instanceof Outage || e instanceof ServerError)) throw e;
          c.failed();
          continue;
        }
      }
      const functions = backend === 'functions';
      const args = c.command(functions);
      if (args === null) break;
      try {
        const reply = await this.conn.call(args);
        malformed = c.reply(reply) ?? malformed;
      } catch (e) {
        if (e instanceof ServerError) c.errorReply(e.message);
        else if (e instanceof Outage) c.failed();
        else throw e;
      }
    }
    const functions = backend === 'functions';
    for (const refund of c.refunds(functions)) {
      // Best effort: a refund lost costs its tokens until they refill, never mints any.
      await this.conn.call(refund).catch(() => undefined);
    }
    const d = c.decision();
    if (d === null) throw new ProtocolError(malformed ?? 'unexpected reply from redis-rl: a rules check');
    return new RuleDecision(
      d.granted,
      d.remaining,
      d.retryAfterMs,
      d.resetAfterMs,
      d.tokens,
      d.limit,
      d.layer ?? null,
      d.code ?? null,
      d.key ?? null,
      d.shadowDenied,
      d.fallback ? 'fallback' : 'server',
    );
  }

  /** Replaces the document in force (a new one from the operator); an invalid one throws and changes nothing. */
  replace(doc: string | object): void {
    const next = parseDocument(doc);
    this.doc = next;
    this.names = next.attributes;
    this.used = next.used;
  }

  /** The request's value of each attribute the document knows, in its order (only those a layer reads). */
  private values(attrs: Attributes): Array<string | null> {
    if (attrs === null || typeof attrs !== 'object') throw new TypeError('attributes: an object or a Map');
    const get = attrs instanceof Map ? (k: string) => attrs.get(k) : (k: string) => (Object.prototype.hasOwnProperty.call(attrs, k) ? (attrs as Record<string, unknown>)[k] : undefined);
    const out: Array<string | null> = new Array(this.names.length);
    for (let i = 0; i < this.names.length; i++) {
      const v = this.used[i] ? get(this.names[i]!) : undefined;
      out[i] = v === undefined || v === null ? null : String(v);
    }
    return out;
  }
}

function asInt(raw: unknown): number | null {
  if (raw === null || raw === undefined) return null;
  const n = Number(Buffer.isBuffer(raw) ? raw.toString() : raw);
  return Number.isSafeInteger(n) ? n : null;
}

/** `(version, text)` as stored under `key` (nulls when there is none). */
async function fetchStored(conn: Connection, key: string): Promise<[number | null, string | null]> {
  const r = await conn.call(['HMGET', key, 'version', 'document', 'updated_at']);
  if (!Array.isArray(r)) throw new ProtocolError(`unexpected reply from redis-rl: HMGET ${key}`);
  const text = r[1] === null || r[1] === undefined ? null : Buffer.isBuffer(r[1]) ? r[1].toString('utf8') : String(r[1]);
  return [asInt(r[0]), text];
}
