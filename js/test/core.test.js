'use strict';
// The JS shell over the compiled core, without a server: golden cases (limit strings, take
// replies as ioredis and node-redis hand them over), malformed replies, panics, headers, the
// OpenAI estimate and stream reader.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const rl = require('..');
const { native } = require('../dist/cjs/native');
const { core: guard } = require('../dist/cjs/errors');
const { taken: decide } = require('../dist/cjs/limiter');
const taken = (limiter, n, reply) => decide(limiter, n, reply, null);

const CASES = path.join(__dirname, '..', '..', 'protocol');
const read = (name) => JSON.parse(fs.readFileSync(path.join(CASES, name), 'utf8')).cases;
const readCases = (name) => read(path.join('cases', name));

test('limit strings: every golden case, message for message', () => {
  const cases = read('limit_strings.json');
  assert.ok(cases.length > 30);
  for (const c of cases) {
    if (c.error !== undefined) {
      assert.throws(() => rl.parseLimits(c.text), (e) => e instanceof RangeError && e.message.includes(c.error), c.text);
    } else {
      const got = rl.parseLimits(c.text).map((l) => [l.amount, l.periodSecs, l.cap]);
      assert.deepEqual(got, c.limits, c.text);
    }
  }
  assert.deepEqual(rl.parseLimit('100/minute'), { rate: 100 / 60, cap: 100 });
  assert.throws(() => rl.parseLimit('1/second;5/minute'), /one is expected/);
});

/** A golden reply as each client hands it over. */
function asClient(v, flavor) {
  if (v === null) return null;
  if (typeof v === 'number') return v;
  if (typeof v === 'string') return flavor === 'ioredis' ? Buffer.from(v) : v;
  if (Array.isArray(v)) return v.map((x) => asClient(x, flavor));
  const [k, x] = Object.entries(v)[0];
  switch (k) {
    case 'ms':
      return x;
    case 'tokens':
    case 'double':
      return x; // RESP3's double: a JS number
    case 'tokens_text':
    case 'double_text':
      return flavor === 'ioredis' ? Buffer.from(String(x)) : String(x);
    default:
      throw new Error(`no golden form ${k}`);
  }
}

const num = (v) => (v !== null && typeof v === 'object' ? Object.values(v)[0] : v);

test('take replies: every golden RL.TAKE ... WITHSTATE case through the JS conversion', () => {
  let seen = 0;
  for (const file of ['take.json', 'pins.json']) {
    for (const c of readCases(file)) {
      if (c.args[0] !== 'RL.TAKE' || !c.args.includes('WITHSTATE')) continue;
      const [, , rate, cap, n] = c.args;
      for (const [proto, flavors] of [
        ['resp2', ['ioredis', 'node-redis']],
        ['resp3', ['node-redis']],
      ]) {
        const want = c[proto];
        if (!Array.isArray(want)) continue;
        for (const flavor of flavors) {
          // The case's own limit: a granted count is n.
          const core = new native.TakeCore('k', Number(rate), Number(cap), 'allow', null);
          const d = taken(core, Number(n), asClient(want, flavor));
          assert.equal(d.granted, num(want[0]) > 0, c.name);
          assert.equal(d.tokens, num(want[0]), c.name);
          assert.equal(d.remaining, num(want[1]), c.name);
          assert.equal(d.retryAfterMs, num(want[2]), c.name);
          assert.equal(d.resetAfterMs, num(want[3]), c.name);
          assert.equal(d.pinned ?? null, want[4] ?? null, c.name);
          seen++;
        }
      }
    }
  }
  assert.ok(seen >= 60, `only ${seen}`);
});

test('a malformed reply is a ProtocolError, never a crash', () => {
  const limiter = new native.TakeCore('k', 1, 10, 'allow', null);
  const deep = [];
  let d = deep;
  for (let i = 0; i < 50; i++) d = d[0] = [];
  const throwing = {};
  Object.defineProperty(throwing, 'x', { enumerable: true, get: () => { throw new Error('getter'); } });
  const weird = [
    1, 'OK', Buffer.from('x'), null, undefined, true, {}, new Map([[1, 2]]), Object.create(null), new Date(),
    () => 1, Symbol('s'), 10n ** 30n, [1, 2, 3], [1, 2, 3, 4, 5, 6], [1, 'x', 0, 0], [1, 'inf', 0, 0], [-1, 1, 0, 0],
    [1, 1, -5, 0], [1, 1, 0.5, 0], [2, 1, 0, 0], [1, 1, 0, 0, 'open'], [1, 1, 0, 0, 7], new Error('ERR boom'),
    [new Error('ERR x'), 1, 0, 0], deep, new Array(10_000).fill(1), [NaN, 1, 0, 0], [1, Infinity, 0, 0], new Uint8Array(3),
    [1, true, 0, 0], Promise.resolve(1), new (class Foo {})(), throwing, [throwing, 1, 0, 0],
  ];
  for (const reply of weird) {
    assert.throws(
      () => taken(limiter, 1, reply),
      (e) => e instanceof rl.ProtocolError || (e instanceof Error && e.message === 'getter'),
      require('node:util').inspect(reply).slice(0, 80),
    );
  }
  // A BigInt that fits, RESP3 maps as objects and Maps are read (and refused here by shape).
  assert.equal(taken(limiter, 1, [1n, 9, 0n, 1000]).remaining, 9);
  assert.ok(limiter.counters().errors >= weird.length - 2);
});

test('no panic reaches Node: an InternalError to catch', () => {
  assert.throws(() => guard(() => native.__panicForTests()), (e) => e instanceof rl.InternalError && /please report it/.test(e.message));
  // And the addon still works afterwards.
  assert.equal(rl.parseLimits('1/s').length, 1);
});

test('bad arguments are RangeErrors with what to do', () => {
  const client = { call: async () => null };
  assert.throws(() => new rl.Limiter(client, 'k', { rate: 0, cap: 1 }), RangeError);
  assert.throws(() => new rl.Limiter(client, 'k', '5/ms'), /not a unit/);
  assert.throws(() => new rl.Limiter(client, 'k', { rate: 1, cap: 1 }, { failurePolicy: 'maybe' }), RangeError);
  assert.throws(() => new rl.Limiter({}, 'k', { rate: 1, cap: 1 }), TypeError);
  assert.throws(() => new rl.TokenBudget(client, 'k', null), TypeError);
  assert.throws(() => new rl.TokenBudget(client, 'k', '1000/minute', { ttlMs: 0 }), /ttl_ms/);
  const l = new rl.Limiter(client, 'k', { rate: 1, cap: 5 });
  return Promise.all([
    assert.rejects(l.take(6), /above the burst/),
    assert.rejects(l.take(0), RangeError),
    assert.rejects(l.take(1.5), RangeError),
  ]);
});

test('headers and the 429 body, as the Python middleware writes them', () => {
  const core = new native.TakeCore('k', 2, 10, 'allow', null);
  const granted = taken(core, 3, [3, Buffer.from('7.5'), 0, 1250]);
  assert.deepEqual(granted.headers(), { 'X-RateLimit-Limit': '10', 'X-RateLimit-Remaining': '7', 'X-RateLimit-Reset': '2' });
  const denied = taken(core, 3, [0, '-0.5', 1001, 5250]);
  assert.deepEqual(denied.headers(), {
    'X-RateLimit-Limit': '10', 'X-RateLimit-Remaining': '0', 'X-RateLimit-Reset': '6', 'Retry-After': '2',
  });
  assert.deepEqual(JSON.parse(denied.body()), { error: { code: 'rate_limit_exceeded', retry_after: 2 } });
  assert.equal(denied.source, 'server');
});

test('the failure policy decides locally: ALLOW at a share, DENY refuses', async () => {
  // A client that never answers: every call times out.
  const silent = { call: () => new Promise(() => {}) };
  const allow = new rl.Limiter(silent, 'k', { rate: 1, cap: 8 }, { timeoutMs: 5, backend: 'module', instances: 4 });
  const got = [];
  for (let i = 0; i < 3; i++) got.push(await allow.take());
  assert.deepEqual(got.map((d) => [d.granted, d.source]), [[true, 'fallback'], [true, 'fallback'], [false, 'fallback']]);
  const deny = new rl.Limiter(silent, 'k', { rate: 1, cap: 8 }, { timeoutMs: 5, backend: 'module', failurePolicy: 'deny' });
  const d = await deny.take();
  assert.equal(d.granted, false);
  assert.equal(d.source, 'fallback');
  assert.equal(d.headers()['Retry-After'], '1');
  assert.deepEqual([allow.counters.fallbackGranted, allow.counters.fallbackDenied, allow.counters.outages], [2, 1, 3]);
  // A client that throws a connection error at once.
  const down = { call: async () => { throw Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }); } };
  const l = new rl.Limiter(down, 'k', { rate: 1, cap: 8 }, { instances: 1 });
  assert.equal((await l.take()).source, 'fallback');
});

test('the OpenAI estimate, usage and stream reader are the core\'s', () => {
  const e = rl.estimateChat(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hello there' }], max_tokens: 50, stream: true }));
  assert.equal(e.output, 50);
  assert.equal(e.stream, true);
  assert.ok(e.input > 0);
  assert.ok(e.body !== null && e.hideUsage);
  assert.deepEqual(rl.chatUsage('{"usage": {"prompt_tokens": 12, "completion_tokens": 30}}'), { input: 12, output: 30 });
  assert.equal(rl.chatUsage('{"error": {}}'), null);
  assert.deepEqual(rl.splitUsage(['input', 'output', 'requests'], { input: 3, output: 4 }), { input: 3, output: 4 });
  assert.deepEqual(rl.splitUsage(['tokens'], { input: 3, output: 4 }), { tokens: 7 });
  const s = new rl.StreamUsage(true);
  const passed = Buffer.concat([
    s.feed('data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'),
    s.feed('data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}\n\ndata: [DONE]\n\n'),
    s.finish(),
  ]).toString();
  assert.deepEqual(s.usage(), { input: 5, output: 2 });
  assert.ok(!passed.includes('usage'), passed);
  assert.throws(() => rl.estimateChat('not json'), RangeError);
});

test('the ESM entry exports the same classes', async () => {
  const esm = await import('redis-rl');
  assert.equal(esm.Limiter, rl.Limiter);
  assert.equal(esm.TokenBudget, rl.TokenBudget);
  assert.equal(typeof esm.rateLimit, 'function');
});

test('a budget grant that arrives after the timeout is given back at once', async () => {
  const sent = [];
  const fake = {
    call: (...args) => {
      sent.push(args);
      if (args[0] === 'RL.BUDGET') return new Promise((r) => setTimeout(() => r([1, 42, null, 0, ['900']]), 40));
      return Promise.resolve([100]);
    },
  };
  const b = new rl.TokenBudget(fake, 'org', { rate: 1, cap: 1000 }, { timeoutMs: 5, backend: 'module', instances: 1 });
  const res = await b.reserve(100);
  assert.deepEqual([res.granted, res.source], [true, 'fallback']);
  await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(sent[1], ['RL.SETTLE', '42', '{org}:tokens', '0']);
  assert.equal(b.counters.refundedTokens, 100);
  // The local grant settles locally: nothing sent.
  assert.deepEqual(await res.settle(30), { tokens: 70 });
  assert.equal(sent.length, 2);
});

test('an error reply is a ServerError; LOADING and READONLY are outages', async () => {
  class ReplyError extends Error {}
  let message = 'WRONGTYPE Operation against a key holding the wrong kind of value';
  const fake = { call: async () => { throw new ReplyError(message); } };
  const b = new rl.TokenBudget(fake, 'org', '1000/minute', { backend: 'functions', failurePolicy: 'deny' });
  await assert.rejects(b.reserve(1), (e) => e instanceof rl.ServerError && /WRONGTYPE/.test(e.message));
  const l = new rl.Limiter(fake, 'k', '10/second', { backend: 'module' });
  await assert.rejects(l.take(), rl.ServerError);
  for (message of ['LOADING Redis is loading the dataset in memory', 'READONLY You can\'t write against a read only replica.']) {
    assert.equal((await b.reserve(1)).source, 'fallback');
    assert.equal((await l.take()).source, 'fallback');
  }
});

test('commands handed over as patches are the whole commands a fresh core makes', () => {
  const { LastCommands } = require('../dist/cjs/patch');
  const patched = new native.TakeCore('user:42', 5, 10, 'allow', null);
  const p = new LastCommands();
  const keys = [null, 'rl:a', 'rl:b', 'rl:b', 'a-much-longer-key:with:parts', 'rl:a', null];
  let i = 0;
  for (const backend of ['module', 'functions', 'module']) {
    for (const key of keys) {
      const n = 1 + (i++ % 3);
      const got = p.apply(backend, patched.command(backend, n, key, p.has(backend), p.positions));
      const fresh = new native.TakeCore('user:42', 5, 10, 'allow', null);
      assert.deepEqual(got, fresh.command(backend, n, key, false, new Uint32Array(64)), `${backend} ${key} ${n}`);
    }
  }
  const specs = [{ name: 'tokens', rate: 100, cap: 10000 }, { name: 'requests', rate: 1, cap: 10 }];
  const budget = new native.BudgetCore('org', specs, 60000, 'allow', null);
  const b = new LastCommands();
  for (const backend of ['module', 'functions', 'module', 'functions']) {
    for (const cost of [500, 500, 9999, 1, 42]) {
      const costs = Float64Array.of(cost, 1);
      const got = b.apply(backend, budget.reserveCommand(backend, costs, b.has(backend), b.positions));
      const fresh = new native.BudgetCore('org', specs, 60000, 'allow', null);
      assert.deepEqual(got, fresh.reserveCommand(backend, costs, false, new Uint32Array(64)), `${backend} ${cost}`);
    }
  }
});

test('typed arrays of the wrong kind or size are refused before anything is decided', () => {
  const take = new native.TakeCore('k', 1, 5, 'allow', null);
  assert.throws(() => guard(() => take.taken(1, [1, 4, 0, 1000], null, new Float32Array(8), 0)), RangeError);
  assert.throws(() => guard(() => take.outage(1, 0, null, new Uint32Array(8))), RangeError);
  assert.throws(() => guard(() => take.command('module', 1, 'x', true, new Float64Array(8))), RangeError);
  assert.deepEqual(
    [take.counters().granted, take.counters().outages, take.counters().fallbackGranted],
    [0, 0, 0],
    'nothing counted',
  );
  const budget = new native.BudgetCore('org', [{ name: 'tokens', rate: 100, cap: 10000 }], 60000, 'allow', null);
  const reply = [1, 77, null, 0, [Buffer.from('9500')]];
  assert.throws(() => guard(() => budget.reserved(new Float64Array([500]), reply, new Float64Array(2))), RangeError);
  assert.throws(() => guard(() => budget.reserved([500], reply, new Float64Array(8))), RangeError);
  assert.equal(budget.counters().granted, 0);
  const out = new Float64Array(8);
  const ticket = budget.reserved(Float64Array.of(500), reply, out);
  assert.ok(ticket > 0 && budget.open(ticket));
  assert.deepEqual([...out.subarray(0, 6)], [1, 0, -1, 0, 1, 9500]);
  // A settle whose positions are of the wrong kind keeps the ticket open.
  assert.throws(() => guard(() => budget.settle('module', ticket, Float64Array.of(NaN), 0, new Float64Array(2), false, new Float64Array(8))), RangeError);
  assert.ok(budget.open(ticket));
  const args = budget.settle('module', ticket, Float64Array.of(400), 0, new Float64Array(2), false, new Uint32Array(64));
  assert.deepEqual(args, ['RL.SETTLE', '77', '{org}:tokens', '400']);
  assert.equal(budget.open(ticket), false, 'a settled ticket is let go');
  assert.equal(budget.settle('module', ticket, Float64Array.of(400), 0, out, false, new Uint32Array(64)), null);
  assert.equal(out[0], 0, 'nothing to settle a second time');
  budget.forget(ticket); // forgetting a settled (or unknown) ticket is harmless
  budget.forget(12345);
});
