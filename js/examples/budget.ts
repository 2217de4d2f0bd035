// A token budget shared by a fleet calling an LLM provider (typechecked by `npm run typecheck`).
import Redis from 'ioredis';
import { TokenBudget, estimateChat, chatUsage, splitUsage } from 'redis-rl';

const redis = new Redis();
const budget = new TokenBudget(redis, 'openai:gpt-4o', null, {
  limits: { input: '2000000/minute', output: '400000/minute' },
  requests: '5000/minute',
});

export async function complete(body: string): Promise<string | null> {
  const e = estimateChat(body);
  const res = await budget.reserve({ input: e.input, output: e.output });
  if (!res.granted) return null; // retry after res.retryAfterMs (res.deniedBy says which limit)
  const reply = await fetch('https://api.openai.com/v1/chat/completions', { method: 'POST', body: e.body ? e.body.toString() : body });
  const text = await reply.text();
  const usage = chatUsage(text);
  await res.settle(usage ? splitUsage(budget.names, usage) : undefined); // the estimate if unknown
  return text;
}
