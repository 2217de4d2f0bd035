import { Gate, type MiddlewareOptions, type RequestLike } from './http';
import type { Limiter } from './limiter';

/** The parts of Node's `ServerResponse` (Express's `res`) the middleware writes. */
export interface ResponseLike {
  statusCode: number;
  setHeader(name: string, value: string | number): unknown;
  end(body?: string): unknown;
}

export type ExpressMiddleware<R> = ((req: R, res: ResponseLike, next: (err?: unknown) => void) => void) & {
  limiter: Limiter;
};

/** What a middleware answers from: a limiter's or a rules check's decision. */
export interface Answer {
  readonly granted: boolean;
  headers(): Record<string, string>;
  body(): string;
}

/**
 * Writes `d` to an Express (or `http`) response: its headers, then `next()` when granted (or
 * no decision: let through), else the 429 with its JSON body. Shared by the middlewares.
 */
export function respond(d: Answer | null, res: ResponseLike, next: (err?: unknown) => void): void {
  if (d === null) return next();
  const headers = d.headers();
  for (const name of Object.keys(headers)) res.setHeader(name, headers[name]!);
  if (d.granted) return next();
  const body = d.body();
  res.statusCode = 429;
  res.setHeader('Content-Type', 'application/json');
  res.setHeader('Content-Length', Buffer.byteLength(body));
  res.end(body);
}

/**
 * Express (or connect, or plain `http`) middleware: one bucket per caller (`key`), a 429 with
 * `Retry-After`, `X-RateLimit-*` headers and the Python middleware's JSON body when denied, the
 * `X-RateLimit-*` headers on the response when granted.
 *
 *     app.use(rateLimit({ client: redis, limit: '100/minute', key: byIp }));
 *     app.get('/search', rateLimit({ client: redis, limit: '5/minute', prefix: 'rl:route:search:' }), handler);
 */
export function rateLimit<R extends RequestLike = RequestLike>(options: MiddlewareOptions<R>): ExpressMiddleware<R> {
  const gate = new Gate<R>(options);
  const middleware = (req: R, res: ResponseLike, next: (err?: unknown) => void): void => {
    gate.decide(req).then(
      (d) => respond(d, res, next),
      (e: unknown) => next(e),
    );
  };
  return Object.assign(middleware, { limiter: gate.limiter });
}
