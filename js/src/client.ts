// The user's own Redis client, whichever it is: ioredis (`call` / `callBuffer`, also its
// Cluster) or node-redis v4 and later (`sendCommand`). No second connection layer: every
// command goes through the client the caller passed, with a timeout per call.

import { BackendNotFound, ServerError } from './errors';

/** ioredis' `Redis` or `Cluster` (anything with `call`). */
export interface IoredisLike {
  call(command: string, ...args: Array<string | Buffer | number>): Promise<unknown>;
  callBuffer?(command: string, ...args: Array<string | Buffer | number>): Promise<unknown>;
}

/** node-redis v4 and later (`createClient()`): anything with `sendCommand(args)`. */
export interface NodeRedisLike {
  sendCommand(args: Array<string | Buffer>, options?: unknown): Promise<unknown>;
}

/**
 * node-redis' cluster (`createCluster()`): `sendCommand(firstKey, isReadonly, args)`, the key
 * routing the command to its slot's master (it follows `MOVED` and `ASK` itself).
 */
export interface NodeRedisClusterLike {
  sendCommand(firstKey: string | Buffer | undefined, isReadonly: boolean | undefined, args: Array<string | Buffer>, options?: unknown): Promise<unknown>;
  readonly masters: unknown;
  readonly slots: unknown;
}

/** The user's client: ioredis (`Redis`, `Cluster`) or node-redis (a client or a cluster). */
export type RedisClient = IoredisLike | NodeRedisLike | NodeRedisClusterLike;

/** Which server-side implementation: the module (`RL.*`) or the Functions library. */
export type Backend = 'module' | 'functions';
/** `auto` asks the server once (the module first). */
export type BackendOption = Backend | 'auto';

/** Redis did not answer: unreachable, or slower than the timeout (decided by the failure policy). */
export class Outage extends Error {
  constructor(
    message: string,
    readonly cause?: unknown,
  ) {
    super(message);
    this.name = 'Outage';
  }
}

/** Error replies that stand for Redis not being able to answer (as the Rust and Python clients). */
const UNAVAILABLE = /^(LOADING|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|READONLY)\b/;
/** The classes ioredis and node-redis throw an error reply as. */
const REPLY_ERRORS = new Set(['ReplyError', 'ErrorReply', 'SimpleError', 'BlobError']);

/** Whether `e` is an error reply (Redis answered), as either client throws it. */
export function isReplyError(e: unknown): e is Error {
  if (!(e instanceof Error)) return false;
  for (let p: unknown = Object.getPrototypeOf(e); p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = (p as { constructor?: { name?: string } }).constructor?.name;
    if (name !== undefined && REPLY_ERRORS.has(name)) return true;
  }
  return false;
}

/** Sends a command; `key`, the key it works on, routes it on a node-redis cluster. */
type Send = (args: string[], key: string | undefined) => Promise<unknown>;

function sender(client: RedisClient): Send {
  const c = client as Partial<IoredisLike & NodeRedisLike> | null;
  if (c === null || typeof c !== 'object' && typeof c !== 'function') {
    throw new TypeError('redis-rl: a client is expected (ioredis or node-redis v4+)');
  }
  if (typeof c.callBuffer === 'function') {
    // ioredis: replies with Buffers for bulk strings.
    const call = c.callBuffer.bind(c);
    return (args) => call(args[0]!, ...args.slice(1));
  }
  if (typeof c.call === 'function') {
    const call = c.call.bind(c);
    return (args) => call(args[0]!, ...args.slice(1));
  }
  if (typeof c.sendCommand === 'function' && 'masters' in c && 'slots' in c) {
    // node-redis' cluster: the first key picks the node (ioredis' Cluster finds it itself).
    const send = (c as unknown as NodeRedisClusterLike).sendCommand.bind(c);
    return (args, key) => send(key, false, args);
  }
  if (typeof c.sendCommand === 'function') {
    const send = c.sendCommand.bind(c);
    // node-redis: `sendCommand(args)` (v4: strings or Buffers in; strings out).
    return (args) => send(args);
  }
  throw new TypeError(
    'redis-rl: the client has neither call (ioredis) nor sendCommand (node-redis v4+)',
  );
}

/** One limiter's or budget's way to Redis: the user's client, a timeout per call. */
export class Connection {
  private readonly send: Send;
  private resolving: Promise<Backend> | null = null;
  backend: Backend | null;

  constructor(
    readonly client: RedisClient,
    readonly timeoutMs: number | null,
    backend: BackendOption,
  ) {
    if (timeoutMs !== null && !(typeof timeoutMs === 'number' && timeoutMs > 0)) {
      throw new RangeError('timeoutMs must be positive milliseconds (or null: no timeout)');
    }
    if (backend !== 'auto' && backend !== 'module' && backend !== 'functions') {
      throw new RangeError(`backend ${JSON.stringify(backend)}: 'auto', 'module' or 'functions'`);
    }
    this.send = sender(client);
    this.backend = backend === 'auto' ? null : backend;
  }

  /**
   * Sends `args` and waits at most the timeout: the reply, a `ServerError` for an error reply,
   * or an `Outage` (no connection, a timeout, an error reply that stands for one). `late`
   * gets a reply that arrives after the timeout (a grant to give back); `key` is the key the
   * command works on (a cluster client routes by it).
   */
  call(args: string[], late?: (reply: unknown) => void, key?: string): Promise<unknown> {
    let raw: Promise<unknown>;
    try {
      raw = this.send(args, key);
    } catch (e) {
      return Promise.reject(classify(e));
    }
    if (this.timeoutMs === null) return raw.then(undefined, (e: unknown) => Promise.reject(classify(e)));
    const ms = this.timeoutMs;
    return new Promise<unknown>((resolve, reject) => {
      let done = false;
      const timer = setTimeout(() => {
        done = true;
        reject(new Outage(`redis-rl: no reply within ${ms} ms`));
      }, ms);
      raw.then(
        (reply) => {
          if (done) {
            if (late) late(reply);
            return;
          }
          done = true;
          clearTimeout(timer);
          resolve(reply);
        },
        (e: unknown) => {
          if (done) return;
          done = true;
          clearTimeout(timer);
          reject(classify(e));
        },
      );
    });
  }

  /** The backend: as configured, or asked of the server once (`auto`: the module first). */
  resolve(): Promise<Backend> {
    if (this.backend !== null) return Promise.resolve(this.backend);
    if (this.resolving === null) {
      const probe = this.probe().then(
        (b) => {
          this.backend = b;
          return b;
        },
        (e: unknown) => {
          this.resolving = null; // asked again by the next call
          throw e;
        },
      );
      this.resolving = probe;
    }
    return this.resolving;
  }

  private async probe(): Promise<Backend> {
    const ask = async (args: string[]): Promise<unknown> => {
      try {
        return await this.call(args);
      } catch (e) {
        if (e instanceof ServerError) return e;
        throw e;
      }
    };
    const unknown = (r: unknown) => r instanceof ServerError && /unknown command/i.test(r.message);
    // RL.TAKE without arguments: the module answers a wrong number of arguments.
    const module = await ask(['RL.TAKE']);
    if (!unknown(module)) return 'module';
    const functions = await ask(['FUNCTION', 'LIST', 'LIBRARYNAME', 'rl']);
    // A user refused FUNCTION LIST (NOPERM) may still call the library: assumed.
    if (functions instanceof ServerError ? !unknown(functions) : Array.isArray(functions) && functions.length > 0) {
      return 'functions';
    }
    throw new BackendNotFound(
      'redis-rl: neither backend is available on this server: load the module ' +
        "(loadmodule /path/to/libredis_rl.so, backend: 'module') or the Functions library " +
        "(FUNCTION LOAD REPLACE with functions/rl.lua, backend: 'functions')",
    );
  }
}

/** A Redis client's error as an `Outage` or a `ServerError`. */
export function classify(e: unknown): Error {
  if (e instanceof Outage || e instanceof ServerError) return e;
  if (isReplyError(e)) {
    const message = e.message;
    if (UNAVAILABLE.test(message)) return new Outage(message, e);
    return new ServerError(message, e);
  }
  const message = e instanceof Error ? e.message : String(e);
  return new Outage(message, e);
}
