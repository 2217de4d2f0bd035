// The ESM entry's types (`import` from an ES module), typechecked by `npm run typecheck`.
import { Limiter, TokenBudget, type Decision, type RedisClient } from 'redis-rl';

export async function check(client: RedisClient): Promise<Decision> {
  const budget = new TokenBudget(client, 'org', '100000/minute', { requests: '500/minute' });
  const res = await budget.reserve(1200);
  if (res.granted) await res.settle(800);
  return new Limiter(client, 'user:42', { rate: 5, cap: 10 }).take();
}
