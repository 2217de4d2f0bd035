'use strict';
// Rules: the rules golden cases (protocol/rules_cases.json: plans, refused documents, checks)
// through the JS shell's own loop (a client scripted by the case: the calls it must make and
// what each gets), then against a real server.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const rl = require('..');
const { start } = require('../test-support/servers');
const { CLIENTS } = require('../test-support/clients');

const REPO = path.join(__dirname, '..', '..');
const CASES = JSON.parse(fs.readFileSync(path.join(REPO, 'protocol', 'rules_cases.json'), 'utf8'));

function documentOf(name) {
  const d = CASES.documents[name];
  return d.file ? fs.readFileSync(path.join(REPO, d.file), 'utf8') : d.text;
}

/** A case's reply as ioredis hands it over. */
function reply(j) {
  if (typeof j === 'string') return Buffer.from(j);
  if (Array.isArray(j)) return j.map(reply);
  return j;
}

class ReplyError extends Error {}

/** A client scripted by a case: each call must be the next one expected; later ones are refunds. */
function scripted(events) {
  const left = [...events];
  const refunds = [];
  return {
    left,
    refunds,
    client: {
      async call(...args) {
        const sent = args.map(String);
        if (left.length === 0) {
          refunds.push(sent);
          return 1;
        }
        const e = left.shift();
        assert.deepEqual(sent, e.send);
        if ('reply' in e) return reply(e.reply);
        if ('error_reply' in e) throw new ReplyError(e.error_reply);
        throw new Error(e.error); // a connection error: an outage
      },
    },
  };
}

test('golden plans', () => {
  for (const c of CASES.plans) {
    const r = new rl.Rules({ call() {} }, documentOf(c.document));
    assert.deepEqual(r.plan(c.attributes).map((a) => [a.layer, a.keys]), c.layers, JSON.stringify(c.attributes));
  }
});

test('golden refusals: the field is named', () => {
  for (const c of CASES.refused) {
    assert.throws(
      () => new rl.Rules({ call() {} }, c.text),
      (e) => e instanceof rl.RulesError && e.problems.some((p) => p.field === c.field),
      c.text,
    );
  }
});

async function runCheck(c, want = c.decision) {
  const s = scripted(c.events ?? []);
  const r = new rl.Rules(s.client, documentOf(c.document), {
    failOpen: c.fail_open ?? true,
    backend: c.backend ?? 'module',
    cluster: c.cluster ?? false,
  });
  const cost = c.cost ?? 1;
  if ('cost_error' in c) {
    await assert.rejects(r.check(c.attributes, cost), (e) => e instanceof RangeError && e.message.includes(c.cost_error));
    return;
  }
  if (want === null) {
    await assert.rejects(r.check(c.attributes, cost), rl.ProtocolError);
  } else {
    const d = await r.check(c.attributes, cost);
    assert.deepEqual(
      {
        granted: d.granted,
        remaining: d.remaining,
        retry_after_ms: d.retryAfterMs,
        reset_after_ms: d.resetAfterMs,
        tokens: d.tokens,
        limit: d.limit,
        layer: d.layer,
        code: d.code,
        key: d.key,
        shadow_denied: d.shadowDenied,
        fallback: d.source === 'fallback',
      },
      want,
    );
  }
  assert.deepEqual(s.left, [], 'calls not made');
  assert.deepEqual(s.refunds, c.refunds);
}

// ReplyError must read as an error reply to the shell (ioredis' class name).
Object.defineProperty(ReplyError, 'name', { value: 'ReplyError' });

test('golden checks through the JS shell', async (t) => {
  for (const c of CASES.checks) await t.test(c.about.slice(0, 60), () => runCheck(c));
});

test('the check runner fails when a case expects otherwise', async () => {
  let broken = 0;
  for (const c of CASES.checks.filter((c) => c.decision)) {
    await assert.rejects(runCheck(c, { ...c.decision, granted: !c.decision.granted }));
    await assert.rejects(runCheck({ ...c, refunds: [['RL.REFUND', 'x', '1']] }));
    broken += 1;
  }
  assert.ok(broken > 0);
});

test('bad input: a clear error, nothing sent', async () => {
  const s = scripted([]);
  const r = new rl.Rules(s.client, documentOf('mixed'));
  await assert.rejects(r.check({ ip: 'a' }, 1.5), RangeError);
  await assert.rejects(r.check({ ip: 'a' }, -1), RangeError);
  await assert.rejects(r.check(null), TypeError);
  assert.throws(() => new rl.Rules(s.client, 42), TypeError);
  assert.throws(() => new rl.Rules(s.client, ':::'), rl.RulesError);
  assert.throws(() => r.replace('layers: []'), rl.RulesError);
  // Inherited properties are no attributes.
  assert.deepEqual(r.plan({}).map((a) => a.layer), []);
  assert.deepEqual(s.refunds, []);
});

for (const c of [CLIENTS[0], CLIENTS[3]]) {
  test(`Rules against a real server, ${c.name}: layers, shadow, refusal, an object document`, async (t) => {
    const server = await start({ module: true });
    t.after(() => server.stop());
    const { client, close } = await c.connect(server.url);
    t.after(close);
    const doc = {
      prefix: 'js:',
      layers: [
        { name: 'trial', key: 'ip:{ip}', limit: '1/day', shadow: true },
        { name: 'ip', key: 'ip:{ip}', limit: '3/day' },
      ],
    };
    const r = new rl.Rules(client, doc, { timeoutMs: 10_000 });
    const ds = [];
    for (let i = 0; i < 4; i++) ds.push(await r.check({ ip: '10.0.0.1' }));
    assert.deepEqual(ds.map((d) => d.granted), [true, true, true, false]);
    assert.deepEqual(ds.map((d) => d.shadowDenied), [[], ['trial'], ['trial'], []]);
    assert.equal(ds[3].layer, 'ip');
    assert.ok(ds[3].retryAfterMs > 0);
    assert.equal(ds[3].headers()['X-RateLimit-Limit'], '3');
    assert.ok(ds.every((d) => d.source === 'server'));
    // Another caller has its own buckets; a cost of 3 takes the whole day.
    await assert.rejects(r.check({ ip: '10.0.0.2' }, 2), /cost 2 exceeds layer trial's cap 1/);
    const enforced = new rl.Rules(client, 'prefix: "js2:"\nlayers:\n  - {name: ip, key: "ip:{ip}", limit: 3/day}\n', { timeoutMs: 10_000 });
    assert.equal((await enforced.check({ ip: '10.0.0.2' }, 3)).granted, true);
    assert.equal((await enforced.check({ ip: '10.0.0.2' })).granted, false);
    await assert.rejects(enforced.check({ ip: '10.0.0.3' }, 4), RangeError);
    // Redis gone: fail open grants as the fallback.
    server.kill();
    const down = new rl.Rules(client, doc, { timeoutMs: 100 });
    const d = await down.check({ ip: '10.0.0.9' });
    assert.deepEqual([d.granted, d.source], [true, 'fallback']);
    const closed = new rl.Rules(client, doc, { timeoutMs: 100, failOpen: false, backend: 'module' });
    const dc = await closed.check({ ip: '10.0.0.9' });
    assert.deepEqual([dc.granted, dc.source, dc.layer], [false, 'fallback', 'ip']);
  });
}

test('a stored document followed live: a new version in force, an invalid one refused, the old kept', async (t) => {
  const server = await start({ module: true });
  t.after(() => server.stop());
  const { client, close } = await CLIENTS[0].connect(server.url);
  t.after(close);
  const store = async (text) => {
    await client.call('HINCRBY', 'rl:rules', 'version', 1);
    await client.call('HSET', 'rl:rules', 'document', text, 'updated_at', String(Date.now()));
  };
  await assert.rejects(rl.Rules.fromRedis(client), rl.RulesError, 'none stored');
  await store('prefix: "f1:"\nlayers:\n  - {name: ip, key: "ip:{ip}", limit: 1/day}\n');
  const r = await rl.Rules.fromRedis(client, 'rl:rules', { timeoutMs: 10_000 });
  t.after(() => r.close());
  assert.equal(r.documentVersion, 1);
  assert.equal(await r.refresh(), false, 'nothing new');
  assert.deepEqual([(await r.check({ ip: 'a' })).granted, (await r.check({ ip: 'a' })).granted], [true, false]);
  await store('prefix: "f2:"\nlayers:\n  - {name: ip, key: "ip:{ip}", limit: 2/day}\n');
  assert.equal(await r.refresh(), true);
  assert.equal(r.documentVersion, 2);
  assert.equal(r.prefix, 'f2:');
  assert.deepEqual([(await r.check({ ip: 'a' })).limit], [2]);
  await store('layers: []');
  assert.equal(await r.refresh(), false);
  assert.equal(await r.refresh(), false, 'refused once');
  assert.deepEqual(r.stats, { reloads: 1, refused: 1, pollErrors: 0 });
  assert.equal(r.prefix, 'f2:', 'the document in force kept');
  r.follow(10);
  await store('prefix: "f4:"\nlayers:\n  - {name: ip, key: "ip:{ip}", limit: 2/day}\n');
  for (let i = 0; i < 500 && r.prefix !== 'f4:'; i++) await new Promise((res) => setTimeout(res, 10));
  assert.equal(r.prefix, 'f4:', 'followed');
  assert.equal(r.documentVersion, 4);
});

test('Express and Fastify middleware over Rules: attributes from a hook, 429 with the layer', async (t) => {
  const express = require('express');
  const Fastify = require('fastify');
  const server = await start({ module: true });
  t.after(() => server.stop());
  const { client, close } = await CLIENTS[0].connect(server.url);
  t.after(close);
  const doc = 'prefix: "mw:"\nlayers:\n  - {name: user, key: "user:{user}", limit: 2/day, code: user_quota}\n';
  const rules = new rl.Rules(client, doc, { timeoutMs: 10_000 });
  const attributes = (req) => (req.headers['x-user'] ? { user: req.headers['x-user'] } : null);
  const app = express();
  app.use(rl.rulesRateLimit({ rules, attributes }));
  app.get('/', (req, res) => res.json({ ok: true }));
  const url = await new Promise((resolve) => {
    const srv = app.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${srv.address().port}`));
    t.after(() => new Promise((r) => srv.close(r)));
  });
  const fa = Fastify();
  fa.addHook('onRequest', rl.fastifyRules({ rules, attributes }));
  fa.get('/', async () => ({ ok: true }));
  const furl = await fa.listen({ port: 0, host: '127.0.0.1' });
  t.after(() => fa.close());
  const got = async (u, user) => {
    const r = await fetch(u, { headers: user ? { 'x-user': user } : {} });
    return { status: r.status, headers: r.headers, body: await r.text() };
  };
  for (const u of [url, furl]) {
    const user = `u-${u}`;
    const a = await got(u, user);
    assert.equal(a.status, 200);
    assert.equal(a.headers.get('x-ratelimit-limit'), '2');
    assert.equal((await got(u, user)).status, 200);
    const denied = await got(u, user);
    assert.equal(denied.status, 429);
    assert.ok(Number(denied.headers.get('retry-after')) >= 1);
    assert.deepEqual(Object.keys(JSON.parse(denied.body)), ['code', 'layer', 'retry_after']);
    assert.equal(JSON.parse(denied.body).code, 'user_quota');
    assert.equal((await got(u, null)).status, 200, 'no attributes: unchecked');
  }
});

test('malformed RL.MTAKE replies through the shell: a ProtocolError, nothing else sent but refunds', async () => {
  const doc = 'prefix: "m:"\nlayers:\n  - {name: ip, key: "ip:{ip}", limit: 5/day}\n';
  for (const bad of ['OK', [1], [1, null], { a: 1 }, Symbol('s'), () => 1, [[[[[[[[[[1]]]]]]]]]], 2 ** 70, [1, null, 0, [4, 5]], [1, null, -1], Buffer.from('x')]) {
    const sent = [];
    const r = new rl.Rules({ call: async (...a) => { sent.push(a); return bad; } }, doc, { backend: 'module' });
    await assert.rejects(r.check({ ip: 'a' }), rl.ProtocolError, String(bad));
    assert.equal(sent.length, 1, String(bad));
  }
});
