// Express and Fastify middleware over `Rules`: the request's attributes from a hook, the
// rules' decision answered as the limiter middleware answers (429 with the binding layer's
// headers and the rules' body when refused, the headers on the response when granted).

import type { ResponseLike } from './express';
import type { FastifyReplyLike } from './fastify';
import type { Attributes, RuleDecision, Rules } from './rules';

export interface RulesMiddlewareOptions<R> {
  rules: Rules;
  /** The request's attributes (`ip`, `user`, `path`, the document's own); null lets it through unchecked. */
  attributes: (req: R) => Attributes | null | undefined | Promise<Attributes | null | undefined>;
  /** Tokens a request takes from every bucket (default 1), or a function of the request. */
  cost?: number | ((req: R) => number);
}

async function decide<R>(o: RulesMiddlewareOptions<R>, req: R): Promise<RuleDecision | null> {
  const attrs = await o.attributes(req);
  if (attrs === null || attrs === undefined) return null;
  const cost = typeof o.cost === 'function' ? o.cost(req) : (o.cost ?? 1);
  return o.rules.check(attrs, cost);
}

/** Express (or connect, or plain `http`) middleware checking each request against `rules`. */
export function rulesRateLimit<R>(
  options: RulesMiddlewareOptions<R>,
): (req: R, res: ResponseLike, next: (err?: unknown) => void) => void {
  return (req, res, next) => {
    decide(options, req).then(
      (d) => {
        if (d === null) return next();
        const headers = d.headers();
        for (const name of Object.keys(headers)) res.setHeader(name, headers[name]!);
        if (d.granted) return next();
        const body = d.body();
        res.statusCode = 429;
        res.setHeader('Content-Type', 'application/json');
        res.setHeader('Content-Length', Buffer.byteLength(body));
        res.end(body);
      },
      (e: unknown) => next(e),
    );
  };
}

/** A Fastify `onRequest` hook checking each request against `rules`. */
export function fastifyRules<R>(
  options: RulesMiddlewareOptions<R>,
): (request: R, reply: FastifyReplyLike) => Promise<FastifyReplyLike | undefined> {
  return async (request, reply) => {
    const d = await decide(options, request);
    if (d === null) return undefined;
    const headers = d.headers();
    for (const name of Object.keys(headers)) reply.header(name, headers[name]!);
    if (d.granted) return undefined;
    return reply.code(429).header('content-type', 'application/json').send(d.body());
  };
}
