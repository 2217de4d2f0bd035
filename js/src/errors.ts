/** Every error redis-rl throws (besides `RangeError` / `TypeError` for bad arguments). */
export class RedisRlError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/**
 * Redis answered an error (`OOM`, `WRONGTYPE`, `NOPERM`, a missing backend...): raised to the
 * caller, never decided by the failure policy (Redis is up; the failure policy is for outages).
 */
export class ServerError extends RedisRlError {
  /** The error the Redis client threw, when there was one. */
  readonly cause?: unknown;
  constructor(message: string, cause?: unknown) {
    super(message);
    if (cause !== undefined) this.cause = cause;
  }
}

/** A reply that is not what the command answers (another server, a proxy, a truncated reply). */
export class ProtocolError extends ServerError {}

/** Neither the module nor the Functions library is on the server. */
export class BackendNotFound extends ServerError {}

/** A bug in redis-rl (a panic in the compiled core, stopped at the boundary): please report it. */
export class InternalError extends RedisRlError {}

const PROTOCOL = 'unexpected reply from redis-rl:';
const INTERNAL = 'redis-rl internal error';

/** The compiled core's error as this package's: bad arguments, malformed replies, panics. */
export function fromNative(e: unknown): unknown {
  if (!(e instanceof Error)) return e;
  const code = (e as { code?: unknown }).code;
  if (e.message.startsWith(INTERNAL)) return new InternalError(e.message);
  if (code === 'InvalidArg') return new RangeError(e.message);
  if (e.message.startsWith(PROTOCOL)) return new ProtocolError(e.message);
  return e;
}

/** Runs a call into the compiled core, its errors as this package's. */
export function core<T>(body: () => T): T {
  try {
    return body();
  } catch (e) {
    throw fromNative(e);
  }
}
