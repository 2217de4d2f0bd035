'use strict';
// The Express and Fastify middleware over real HTTP and a real server: 429 with Retry-After,
// X-RateLimit-* and the Python middleware's body; the headers on grants; per-route keys and a
// key function; error replies let through (counted) or passed on; an outage decided by the
// failure policy.

const test = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const Fastify = require('fastify');
const Redis = require('ioredis');

const rl = require('..');
const { start } = require('../test-support/servers');

async function connect(t, server) {
  const client = new Redis(server.url, { lazyConnect: true, retryStrategy: () => 50 });
  client.on('error', () => {});
  await client.connect();
  t.after(() => client.disconnect());
  return client;
}

function listenExpress(t, app) {
  return new Promise((resolve) => {
    const srv = app.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${srv.address().port}`));
    t.after(() => new Promise((r) => srv.close(r)));
  });
}

async function listenFastify(t, app) {
  const url = await app.listen({ port: 0, host: '127.0.0.1' });
  t.after(() => app.close());
  return url;
}

async function get(url, headers = {}) {
  const r = await fetch(url, { headers });
  return { status: r.status, headers: r.headers, body: await r.text() };
}

function assertDenied(r, cap) {
  assert.equal(r.status, 429);
  assert.equal(r.headers.get('x-ratelimit-limit'), String(cap));
  assert.equal(r.headers.get('x-ratelimit-remaining'), '0');
  assert.ok(Number(r.headers.get('retry-after')) >= 1);
  assert.ok(Number(r.headers.get('x-ratelimit-reset')) >= 1);
  assert.match(r.headers.get('content-type'), /application\/json/);
  const body = JSON.parse(r.body);
  assert.deepEqual(Object.keys(body.error), ['code', 'retry_after']);
  assert.equal(body.error.code, 'rate_limit_exceeded');
  assert.equal(String(body.error.retry_after), r.headers.get('retry-after'));
}

const FRAMEWORKS = [
  {
    name: 'Express',
    async serve(t, options, routeOptions) {
      const app = express();
      const mw = rl.rateLimit(options);
      app.use(mw);
      if (routeOptions) {
        app.get('/search', rl.rateLimit(routeOptions), (_req, res) => res.json({ ok: 'search' }));
      }
      app.get('/', (_req, res) => res.json({ ok: true }));
      return { url: await listenExpress(t, app), limiter: mw.limiter };
    },
  },
  {
    name: 'Fastify',
    async serve(t, options, routeOptions) {
      const app = Fastify();
      const hook = rl.fastifyRateLimit(options);
      app.addHook('onRequest', hook);
      if (routeOptions) {
        app.get('/search', { onRequest: rl.fastifyRateLimit(routeOptions) }, async () => ({ ok: 'search' }));
      }
      app.get('/', async () => ({ ok: true }));
      return { url: await listenFastify(t, app), limiter: hook.limiter };
    },
  },
];

for (const f of FRAMEWORKS) {
  test(`${f.name}: 429 with the headers and body, headers on grants, per-route keys`, async (t) => {
    const server = await start({ module: true });
    t.after(() => server.stop());
    const client = await connect(t, server);
    const { url, limiter } = await f.serve(
      t,
      { client, limit: { rate: 0.001, cap: 2 }, key: rl.byHeader('x-api-key'), timeoutMs: 5000 },
      { client, limit: '1/hour', prefix: 'rl:route:search:', key: rl.byRoute },
    );
    const a = { 'x-api-key': 'a' };
    const first = await get(url, a);
    assert.equal(first.status, 200);
    assert.equal(first.headers.get('x-ratelimit-limit'), '2');
    assert.equal(first.headers.get('x-ratelimit-remaining'), '1');
    assert.equal(first.headers.get('retry-after'), null);
    assert.equal((await get(url, a)).status, 200);
    assertDenied(await get(url, a), 2);
    // Another key has its own bucket; no key: not limited.
    assert.equal((await get(url, { 'x-api-key': 'b' })).status, 200);
    const none = await get(url);
    assert.equal(none.status, 200);
    assert.equal(none.headers.get('x-ratelimit-limit'), null);
    // A route's own limit, on its own keys (the global one still applies: key 'c').
    const c = { 'x-api-key': 'c' };
    const s1 = await get(`${url}/search?q=1`, c);
    assert.equal(s1.status, 200);
    assertDenied(await get(`${url}/search?q=2`, c), 1);
    assert.equal(await client.exists('rl:route:search:GET:/search'), 1);
    assert.deepEqual([limiter.counters.granted, limiter.counters.denied], [5, 1]);
  });

  test(`${f.name}: error replies let through and counted (failOpen), or a 500`, async (t) => {
    const server = await start({ module: true });
    t.after(() => server.stop());
    const client = await connect(t, server);
    await client.set('rl:http:127.0.0.1', 'not a bucket');
    const open = await f.serve(t, { client, limit: '10/minute' });
    assert.equal((await get(open.url)).status, 200);
    assert.equal(open.limiter.counters.errorsLetThrough, 1);
    const closed = await f.serve(t, { client, limit: '10/minute', failOpen: false });
    assert.equal((await get(closed.url)).status, 500);
  });

  test(`${f.name}: an outage is decided by the failure policy (fail open counted, or 429)`, async (t) => {
    const server = await start({ module: true });
    t.after(() => server.stop());
    const client = await connect(t, server);
    const open = await f.serve(t, { client, limit: { rate: 0.001, cap: 8 }, timeoutMs: 100, instances: 4 });
    const closed = await f.serve(t, { client, limit: { rate: 0.001, cap: 8 }, timeoutMs: 100, failOpen: false });
    assert.equal(await client.ping(), 'PONG');
    server.kill();
    // A quarter of 8 locally: 2 through, then 429 from the local bucket.
    assert.deepEqual([(await get(open.url)).status, (await get(open.url)).status], [200, 200]);
    assertDenied(await get(open.url), 8);
    assert.deepEqual([open.limiter.counters.fallbackGranted, open.limiter.counters.fallbackDenied], [2, 1]);
    const denied = await get(closed.url);
    assert.equal(denied.status, 429);
    assert.equal(denied.headers.get('retry-after'), '1');
    assert.equal(closed.limiter.counters.fallbackDenied, 1);
  });
}
