'use strict';
// TokenBudget against real servers: every client on both backends (reserve, settle, denials
// naming their limit, limits counted separately), and outages (the server killed) under each
// failure policy, settles lost. The same semantics as the Python TokenBudget: the core's.

const test = require('node:test');
const assert = require('node:assert/strict');

const rl = require('..');
const { start } = require('../test-support/servers');
const { CLIENTS } = require('../test-support/clients');

const near = (x, want) => assert.ok(Math.abs(x - want) < 0.01, `${x} is not ${want}`);

for (const b of [
  { name: 'module', server: { module: true } },
  { name: 'functions', server: { module: false, functions: true } },
]) {
  test(`TokenBudget on the ${b.name}`, async (t) => {
    const server = await start(b.server);
    t.after(() => server.stop());
    for (const c of CLIENTS) {
      await t.test(c.name, async () => {
        const { client, close } = await c.connect(server.url);
        try {
          const key = `org:${c.name}:${b.name}`;
          // Rates so slow nothing refills within the test: the numbers are exact.
          const budget = new rl.TokenBudget(client, key, { rate: 0.001, cap: 1000 }, {
            requests: { rate: 0.0005, cap: 2 },
            timeoutMs: 5000,
          });
          assert.deepEqual(Object.keys(budget.limits), ['tokens', 'requests']);
          assert.equal(budget.limits.tokens.key, `{${key}}:tokens`);
          const res = await budget.reserve(300);
          assert.deepEqual([res.granted, res.source, res.deniedBy], [true, 'server', null]);
          assert.deepEqual(res.reserved, { tokens: 300, requests: 1 });
          near(res.remaining.tokens, 700);
          assert.ok(res.open);
          assert.deepEqual(await res.settle(100), { tokens: 200, requests: 0 });
          assert.equal(res.open, false);
          assert.equal(await res.settle(5), null, 'a second settle sends nothing');
          const big = await budget.reserve(900);
          assert.equal(big.granted, true);
          const denied = await budget.reserve(1);
          assert.deepEqual([denied.granted, denied.deniedBy, denied.source], [false, 'requests', 'server']);
          assert.ok(denied.retryAfterMs > 1_000_000);
          big.use(950);
          assert.deepEqual(await big.settle(), { tokens: -50, requests: 0 });
          const cnt = budget.counters;
          assert.deepEqual(
            [cnt.granted, cnt.denied, cnt.settled, cnt.refundedTokens, cnt.overageTokens, cnt.outages],
            [2, 1, 4, 200, 50, 0], // settled: per limit
          );

          // Limits counted separately, by name.
          const split = new rl.TokenBudget(client, `${key}:split`, null, {
            limits: { input: '1000/hour', output: { rate: 0.001, cap: 500 } },
          });
          const r = await split.reserve({ input: 100, output: 400 });
          assert.equal(r.granted, true);
          assert.deepEqual(await r.settle({ input: 40, output: 450 }), { input: 60, output: -50 });
          await assert.rejects(split.reserve(5), /by name/);
          await assert.rejects(split.reserve({ inptu: 5 }), /no limit "inptu"/);
          await assert.rejects(split.reserve({ input: 1, output: 501 }), /burst/);
        } finally {
          await close();
        }
      });
    }
  });
}

for (const [c, policies] of [
  [CLIENTS[0], ['allow', 'last_known', 'deny']],
  [CLIENTS[1], ['allow']],
  [CLIENTS[3], ['allow', 'deny']],
]) {
  for (const policy of policies) {
    test(`TokenBudget outage under ${policy}, ${c.name}: decided locally, never thrown`, async (t) => {
      const server = await start({ module: true });
      t.after(() => server.stop());
      const { client, close } = await c.connect(server.url);
      t.after(close);
      const budget = new rl.TokenBudget(client, 'org', { rate: 0.001, cap: 1000 }, {
        failurePolicy: policy,
        instances: 2,
        // Long enough that the call before the kill is never taken for an outage on a slow
        // machine; each call after it waits this long.
        timeoutMs: 400,
      });
      const before = await budget.reserve(800);
      assert.equal(before.source, 'server');
      server.kill();
      // The server's grant, its settle lost: counted, never thrown.
      assert.equal(await before.settle(10), null);
      assert.equal(budget.counters.settlesLost, 1);
      const res = await budget.reserve(400);
      assert.equal(res.source, 'fallback');
      if (policy === 'deny') {
        assert.equal(res.granted, false);
      } else if (policy === 'allow') {
        // Half of the limit, full: 500 tokens locally.
        assert.equal(res.granted, true);
        assert.deepEqual(await res.settle(100), { tokens: 300 });
        assert.equal((await budget.reserve(500)).granted, false, '400 left locally');
      } else {
        // Half of what Redis last reported (200): 100 tokens locally.
        assert.equal(res.granted, false);
        assert.equal((await budget.reserve(100)).granted, true);
      }
      assert.ok(budget.counters.outages >= 2);
    });
  }
}
