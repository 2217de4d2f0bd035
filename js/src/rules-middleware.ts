// Express and Fastify middleware over `Rules`: the request's attributes from a hook, the
// rules' decision answered as the limiter middleware answers (429 with the binding layer's
// headers and the rules' body when refused, the headers on the response when granted).

import { respond, type ResponseLike } from './express';
import { reply429, type FastifyReplyLike } from './fastify';
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
      (d) => respond(d, res, next),
      (e: unknown) => next(e),
    );
  };
}

/** A Fastify `onRequest` hook checking each request against `rules`. */
export function fastifyRules<R>(
  options: RulesMiddlewareOptions<R>,
): (request: R, reply: FastifyReplyLike) => Promise<FastifyReplyLike | undefined> {
  return async (request, reply) => {
    return reply429(await decide(options, request), reply);
  };
}
