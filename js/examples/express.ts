// The README's Express quick start (typechecked by `npm run typecheck`).
import express from 'express';
import Redis from 'ioredis';
import { rateLimit, byIp, byHeader, Limiter } from 'redis-rl';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const app = express();

// 100 requests a minute per client address; 429 with Retry-After and X-RateLimit-* beyond.
app.use(rateLimit({ client: redis, limit: '100/minute', key: byIp, instances: 4 }));

// A route's own limit, per API key.
app.get(
  '/search',
  rateLimit({ client: redis, limit: '5/minute', prefix: 'rl:route:search:', key: byHeader('x-api-key') }),
  (_req, res) => {
    res.json({ results: [] });
  },
);

// Or decide yourself.
const exports_ = new Limiter(redis, 'exports', { rate: 1, cap: 5 }, { failurePolicy: 'deny' });
app.post('/export', async (_req, res) => {
  const d = await exports_.take();
  res.set(d.headers());
  if (!d.granted) {
    res.status(429).type('application/json').send(d.body());
    return;
  }
  res.json({ started: true, source: d.source });
});

app.listen(3000);
