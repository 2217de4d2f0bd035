// Fastify: the same limits as an onRequest hook (typechecked by `npm run typecheck`).
import Fastify from 'fastify';
import { createClient } from 'redis';
import { fastifyRateLimit, byRoute } from 'redis-rl';

async function main(): Promise<void> {
  const redis = createClient({ url: 'redis://127.0.0.1:6379' });
  redis.on('error', (e: unknown) => console.error(e));
  await redis.connect();
  const app = Fastify();
  app.addHook('onRequest', fastifyRateLimit({ client: redis, limit: '100/minute' }));
  app.get('/search', { onRequest: fastifyRateLimit({ client: redis, limit: '5/minute', key: byRoute }) }, async () => ({
    results: [],
  }));
  await app.listen({ port: 3000 });
}

void main();
