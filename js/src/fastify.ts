import { Gate, type MiddlewareOptions, type RequestLike } from './http';
import type { Limiter } from './limiter';
import type { Answer } from './express';

/** The parts of Fastify's `reply` the hook writes. */
export interface FastifyReplyLike {
  code(statusCode: number): FastifyReplyLike;
  header(name: string, value: string): FastifyReplyLike;
  send(payload?: unknown): FastifyReplyLike;
}

export type FastifyHook<R> = ((request: R, reply: FastifyReplyLike) => Promise<FastifyReplyLike | undefined>) & {
  limiter: Limiter;
};

/**
 * Writes `d` to a Fastify reply: its headers, and when denied the 429 with its JSON body
 * (answered, so Fastify stops there); `undefined` lets the request through. Shared by the hooks.
 */
export function reply429(d: Answer | null, reply: FastifyReplyLike): FastifyReplyLike | undefined {
  if (d === null) return undefined;
  const headers = d.headers();
  for (const name of Object.keys(headers)) reply.header(name, headers[name]!);
  if (d.granted) return undefined;
  return reply.code(429).header('content-type', 'application/json').send(d.body());
}

/**
 * A Fastify `onRequest` hook: one bucket per caller (`key`), a 429 with `Retry-After`,
 * `X-RateLimit-*` headers and the Python middleware's JSON body when denied, the headers on
 * the reply when granted.
 *
 *     fastify.addHook('onRequest', fastifyRateLimit({ client: redis, limit: '100/minute' }));
 *     fastify.get('/search', { onRequest: fastifyRateLimit({ client: redis, limit: '5/minute', prefix: 'rl:route:search:' }) }, handler);
 */
export function fastifyRateLimit<R extends RequestLike = RequestLike>(options: MiddlewareOptions<R>): FastifyHook<R> {
  const gate = new Gate<R>(options);
  const hook = async (request: R, reply: FastifyReplyLike): Promise<FastifyReplyLike | undefined> => {
    return reply429(await gate.decide(request), reply);
  };
  return Object.assign(hook, { limiter: gate.limiter });
}
