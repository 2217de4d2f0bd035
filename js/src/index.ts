// redis-rl for Node: a distributed token bucket in Redis (the redis-rl module, or its Redis
// Functions library) through your own ioredis or node-redis client. The decisions are the
// client core's (Rust, compiled in): the same code as the Rust and Python clients.

export { ShareLimiter, type ShareLimiterOptions, type ShareInfo, type ShareCounters } from './share';
export { Limiter, Decision, DEFAULT_TIMEOUT_MS, type LimiterOptions, type LimiterCounters } from './limiter';
export {
  TokenBudget,
  Reservation,
  DEFAULT_TTL_MS,
  type Tokens,
  type TokenBudgetOptions,
  type BudgetCounters,
} from './budget';
export { parseLimit, parseLimits, type RateCap, type LimitLike, type ParsedLimit } from './limits';
export { ALLOW, DENY, LAST_KNOWN, type FailurePolicy, type Source } from './policy';
export { RedisRlError, ServerError, ProtocolError, BackendNotFound, InternalError } from './errors';
export type { RedisClient, IoredisLike, NodeRedisLike, NodeRedisClusterLike, Backend, BackendOption } from './client';
export { rateLimit, type ExpressMiddleware, type ResponseLike } from './express';
export { fastifyRateLimit, type FastifyHook, type FastifyReplyLike } from './fastify';
export { byIp, byHeader, byRoute, type KeyFunc, type MiddlewareOptions, type RequestLike } from './http';
export {
  estimateChat,
  chatUsage,
  splitUsage,
  StreamUsage,
  DEFAULT_MAX_TOKENS,
  type ChatEstimate,
  type ChatUsage,
} from './openai';
export { budgetFetch, type BudgetFetchOptions } from './openai-fetch';
export { PrefetchLimiter, type PrefetchOptions, type PrefetchCounters, type PrefetchSource } from './prefetch';
export { Rules, RuleDecision, RulesError, type RulesOptions, type RulesProblem, type Attributes } from './rules';
export { rulesRateLimit, fastifyRules, type RulesMiddlewareOptions } from './rules-middleware';
