'use strict';
// Limiter against real servers: every client (ioredis, node-redis v4, v5 under RESP2 and
// RESP3) on both backends (the module, the Functions library), error replies, malformed
// replies, an outage (the server killed mid-run), and 5,000 concurrent takes.

const test = require('node:test');
const assert = require('node:assert/strict');

const rl = require('..');
const { start } = require('../test-support/servers');
const { CLIENTS } = require('../test-support/clients');

const BACKENDS = [
  { name: 'module', server: { module: true }, backend: 'module' },
  { name: 'functions', server: { module: false, functions: true }, backend: 'functions' },
];

for (const b of BACKENDS) {
  test(`Limiter on the ${b.name}`, async (t) => {
    const server = await start(b.server);
    t.after(() => server.stop());
    for (const c of CLIENTS) {
      await t.test(c.name, async () => {
        const { client, close } = await c.connect(server.url);
        try {
          const key = `rl:${c.name}:${b.name}`;
          // A rate so slow nothing refills within the test: the numbers are exact.
          const l = new rl.Limiter(client, key, { rate: 0.001, cap: 3 }, { timeoutMs: 5000 });
          const d1 = await l.take();
          assert.deepEqual([d1.granted, d1.tokens, d1.source, d1.pinned, d1.limit], [true, 1, 'server', null, 3]);
          assert.ok(Math.abs(d1.remaining - 2) < 1e-3, String(d1.remaining));
          const d2 = await l.take(2);
          assert.equal(d2.granted, true);
          const d3 = await l.take();
          assert.equal(d3.granted, false);
          assert.ok(d3.retryAfterMs > 900_000, String(d3.retryAfterMs));
          assert.equal(d3.headers()['X-RateLimit-Remaining'], '0');
          assert.ok(Number(d3.headers()['Retry-After']) >= 900);
          // A limit string, and a per-call key under the same limit.
          const s = new rl.Limiter(client, `${key}:s`, '2/hour', { backend: b.backend });
          assert.equal((await s.take(1, { key: `${key}:other` })).granted, true);
          assert.equal((await s.take(2, { key: `${key}:other` })).granted, false);
          assert.equal((await s.take(2)).granted, true);
          assert.deepEqual(
            [l.counters.granted, l.counters.denied, l.counters.tokensGranted, l.counters.outages],
            [2, 1, 3, 0],
          );
          // An error reply is thrown (Redis answered), never decided by the failure policy.
          await sendRaw(client, ['SET', `${key}:str`, 'x']);
          const w = new rl.Limiter(client, `${key}:str`, { rate: 1, cap: 1 });
          await assert.rejects(w.take(), (e) => e instanceof rl.ServerError && /WRONGTYPE/.test(e.message));
          assert.equal(w.counters.errors, 1);
        } finally {
          await close();
        }
      });
    }
  });
}

/** A command through either client (ioredis `call`, node-redis `sendCommand`). */
function sendRaw(client, args) {
  return typeof client.call === 'function' ? client.call(...args) : client.sendCommand(args);
}

test('auto finds either backend; neither is BackendNotFound', async (t) => {
  const none = await start({ module: false });
  t.after(() => none.stop());
  const { client, close } = await CLIENTS[0].connect(none.url);
  t.after(close);
  const l = new rl.Limiter(client, 'k', { rate: 1, cap: 1 });
  await assert.rejects(l.take(), rl.BackendNotFound);
  await sendRaw(client, ['FUNCTION', 'LOAD', require('node:fs').readFileSync(require('node:path').join(__dirname, '..', '..', 'functions', 'rl.lua'), 'utf8')]);
  assert.equal((await l.take()).granted, true, 'found once loaded');
});

test('a malformed reply from the client is a ProtocolError, the next take still works', async () => {
  let reply = 'OK';
  const fake = { call: async () => reply };
  const l = new rl.Limiter(fake, 'k', { rate: 1, cap: 5 }, { backend: 'module' });
  for (const bad of ['OK', [1, 2], [1, 'x', 0, 0], { a: 1 }, [true, 1, 0, 0], Buffer.from('1')]) {
    reply = bad;
    await assert.rejects(l.take(), rl.ProtocolError);
  }
  reply = [1, '4', 0, 1000];
  assert.equal((await l.take()).granted, true);
  const ns = { sendCommand: async () => [7, 1, 0, 0] };
  await assert.rejects(new rl.Limiter(ns, 'k', { rate: 1, cap: 5 }, { backend: 'functions' }).take(), /granted: 7/);
});

for (const c of CLIENTS) {
  for (const policy of ['allow', 'deny']) {
    test(`an outage (the server killed) under ${policy}, ${c.name}: the policy decides, never throws`, async (t) => {
      const server = await start({ module: true });
      t.after(() => server.stop());
      const { client, close } = await c.connect(server.url);
      t.after(close);
      // Redis answers first (a timeout of its own: a slow machine is no outage here).
      const up = new rl.Limiter(client, 'k', { rate: 0.001, cap: 8 }, { timeoutMs: 10_000 });
      assert.equal((await up.take()).source, 'server');
      const l = new rl.Limiter(client, 'k', { rate: 0.001, cap: 8 }, { failurePolicy: policy, timeoutMs: 100, instances: 4 });
      server.kill();
      const ds = [];
      for (let i = 0; i < 3; i++) ds.push(await l.take());
      assert.ok(ds.every((d) => d.source === 'fallback'), JSON.stringify(ds));
      if (policy === 'allow') {
        // A quarter of 8: 2 tokens locally.
        assert.deepEqual(ds.map((d) => d.granted), [true, true, false]);
      } else {
        assert.deepEqual(ds.map((d) => d.granted), [false, false, false]);
      }
      assert.equal(l.counters.outages, 3);
    });
  }
}

test('5,000 concurrent takes on one Limiter: exactly the bucket granted', async (t) => {
  const server = await start({ module: true });
  t.after(() => server.stop());
  for (const c of [CLIENTS[0], CLIENTS[3]]) {
    const { client, close } = await c.connect(server.url);
    try {
      const l = new rl.Limiter(client, `burst:${c.name}`, { rate: 0.0001, cap: 1000 }, { timeoutMs: null });
      const ds = await Promise.all(Array.from({ length: 5000 }, () => l.take()));
      const granted = ds.filter((d) => d.granted).length;
      assert.equal(granted, 1000, c.name);
      assert.ok(ds.every((d) => d.source === 'server'));
      assert.deepEqual([l.counters.granted, l.counters.denied], [1000, 4000]);
    } finally {
      await close();
    }
  }
});
