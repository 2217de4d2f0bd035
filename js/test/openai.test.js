'use strict';
// budgetFetch under the openai SDK, against a real server with the module and the repository's
// fake provider (python3 -m provider): settles from the reply's usage, streams with and
// without include_usage, the budget refusing (429 without calling the provider), the
// provider's own 429 settling the tokens at 0. The twin of python/tests/test_openai.py.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const readline = require('node:readline');

const Redis = require('ioredis');
const { default: OpenAI, RateLimitError } = require('openai');

const rl = require('..');
const { start } = require('../test-support/servers');

const ROOT = path.join(__dirname, '..', '..');

/** The fake provider on a free port; its URL once it prints it. */
function provider(args) {
  const proc = spawn('python3', ['-m', 'provider', '--port', '0', ...args], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    proc.once('exit', (code) => reject(new Error(`the fake provider exited (${code})`)));
    readline.createInterface({ input: proc.stdout }).once('line', (line) => {
      const url = line.trim().split(' ').pop();
      resolve({
        url,
        stats: async () => (await fetch(`${url}/stats`)).json(),
        stop: () => {
          if (proc.exitCode === null) proc.kill('SIGTERM');
        },
      });
    });
  });
}

async function peek(redis, key) {
  const reply = await redis.call('RL.PEEK', key);
  if (reply === null) return null;
  const out = {};
  for (let i = 0; i < reply.length; i += 2) out[reply[i]] = Number(reply[i + 1]);
  return out.tokens;
}

const near = (x, want) => assert.ok(Math.abs(x - want) < 0.05, `${x} is not ${want}`);

test('budgetFetch under the openai SDK', async (t) => {
  const server = await start({ module: true });
  t.after(() => server.stop());
  const prov = await provider([]);
  t.after(() => prov.stop());
  const redis = new Redis(server.url, { lazyConnect: true });
  redis.on('error', () => {});
  await redis.connect();
  t.after(() => redis.disconnect());

  // Rates so slow nothing refills within the test: the numbers are exact.
  const budget = (key, opts = {}) =>
    new rl.TokenBudget(redis, key, null, {
      limits: { input: { rate: 0.0001, cap: 100000 }, output: { rate: 0.0001, cap: 100000 } },
      requests: { rate: 0.0001, cap: 100 },
      timeoutMs: 5000,
      ...opts,
    });
  const client = (b, opts) =>
    new OpenAI({ apiKey: 'test', baseURL: `${prov.url}/v1`, fetch: rl.budgetFetch(b, opts), maxRetries: 0 });
  const used = async (b) => {
    const out = {};
    for (const [name, l] of Object.entries(b.limits)) {
      const tokens = await peek(redis, l.key);
      out[name] = tokens === null ? 0 : l.cap - tokens;
    }
    return out;
  };
  const messages = [{ role: 'user', content: 'Say something about token buckets, please.' }];

  await t.test('a whole reply settles to its usage', async () => {
    const b = budget('openai:whole');
    const reply = await client(b).chat.completions.create(
      { model: 'fake', messages, max_tokens: 200 },
      { headers: { 'x-fake-output-tokens': '17' } },
    );
    assert.equal(reply.usage.completion_tokens, 17);
    const u = await used(b);
    near(u.input, reply.usage.prompt_tokens);
    near(u.output, 17);
    near(u.requests, 1);
    assert.equal(b.counters.granted, 1);
  });

  await t.test('a stream without include_usage: no usage chunk, settled', async () => {
    const b = budget('openai:stream');
    const stream = await client(b).chat.completions.create(
      { model: 'fake', messages, max_tokens: 200, stream: true },
      { headers: { 'x-fake-output-tokens': '9' } },
    );
    let text = 0;
    for await (const chunk of stream) {
      assert.ok(chunk.choices.length > 0, 'no usage chunk reaches the caller');
      assert.ok(chunk.usage == null);
      if (chunk.choices[0].delta.content) text++;
    }
    assert.equal(text, 9);
    const u = await used(b);
    near(u.output, 9);
    near(u.requests, 1);
    assert.ok(u.input > 0 && u.input < 100);
  });

  await t.test('a stream with include_usage: the caller gets it', async () => {
    const b = budget('openai:usage');
    const stream = await client(b).chat.completions.create(
      { model: 'fake', messages, max_tokens: 200, stream: true, stream_options: { include_usage: true } },
      { headers: { 'x-fake-output-tokens': '6' } },
    );
    let usage = null;
    for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
    assert.equal(usage.completion_tokens, 6);
    const u = await used(b);
    near(u.input, usage.prompt_tokens);
    near(u.output, 6);
  });

  await t.test('a stream broken off by the caller settles', async () => {
    const b = budget('openai:cancel');
    const stream = await client(b).chat.completions.create(
      { model: 'fake', messages, max_tokens: 200, stream: true },
      { headers: { 'x-fake-output-tokens': '50' } },
    );
    for await (const _chunk of stream) break; // eslint-disable-line no-unused-vars
    // The settle follows the cancel: poll the bucket (no timing threshold, only a bound).
    for (let i = 0; i < 500 && b.counters.settled === 0; i++) await new Promise((r) => setTimeout(r, 10));
    assert.ok(b.counters.settled > 0);
  });

  await t.test('the budget refusing: RateLimitError, the provider not called', async () => {
    const before = (await prov.stats()).requests;
    const b = new rl.TokenBudget(redis, 'openai:refused', { rate: 0.0001, cap: 1000 }, { timeoutMs: 5000 });
    const c = client(b);
    // 1000 tokens: the estimate of max_tokens 900 plus the prompt fits once.
    await c.chat.completions.create({ model: 'fake', messages, max_tokens: 900 }, { headers: { 'x-fake-output-tokens': '900' } });
    const err = await c.chat.completions.create({ model: 'fake', messages, max_tokens: 900 }).then(
      () => assert.fail('granted'),
      (e) => e,
    );
    assert.ok(err instanceof RateLimitError, String(err));
    assert.equal(err.status, 429);
    assert.equal(err.headers.get('x-redis-rl-denied-by'), 'tokens');
    assert.ok(Number(err.headers.get('retry-after-ms')) > 0);
    assert.ok(Number(err.headers.get('retry-after')) >= 1);
    assert.equal(err.code, 'rate_limit_exceeded');
    assert.equal(err.type, 'tokens');
    // Above the burst: too large, no retry-after.
    const big = await c.chat.completions.create({ model: 'fake', messages, max_tokens: 5000 }).then(
      () => assert.fail('granted'),
      (e) => e,
    );
    assert.ok(big instanceof RateLimitError);
    assert.match(big.message, /too large/);
    assert.equal(big.headers.get('retry-after'), null);
    assert.equal((await prov.stats()).requests - before, 1, 'only the granted call reached the provider');
  });

  await t.test('a request that is no chat completion passes untouched', async () => {
    const b = budget('openai:other');
    const f = rl.budgetFetch(b);
    const r = await f(`${prov.url}/stats`);
    assert.equal(r.status, 200);
    const bad = await f(`${prov.url}/v1/chat/completions`, { method: 'POST', body: 'not json' });
    assert.equal(bad.status, 400);
    assert.equal(b.counters.granted, 0);
  });
});

test("budgetFetch: the provider's 429 settles the tokens at 0", async (t) => {
  const server = await start({ module: true });
  t.after(() => server.stop());
  const prov = await provider(['--rpm', '1']);
  t.after(() => prov.stop());
  const redis = new Redis(server.url, { lazyConnect: true });
  redis.on('error', () => {});
  await redis.connect();
  t.after(() => redis.disconnect());
  const b = new rl.TokenBudget(redis, 'openai:provider429', { rate: 0.0001, cap: 100000 }, {
    requests: { rate: 0.0001, cap: 100 },
    timeoutMs: 5000,
  });
  const c = new OpenAI({ apiKey: 'test', baseURL: `${prov.url}/v1`, fetch: rl.budgetFetch(b), maxRetries: 0 });
  const messages = [{ role: 'user', content: 'hello' }];
  const ok = await c.chat.completions.create({ model: 'fake', messages, max_tokens: 100 }, { headers: { 'x-fake-output-tokens': '5' } });
  const first = ok.usage.total_tokens;
  const err = await c.chat.completions.create({ model: 'fake', messages, max_tokens: 100 }).then(
    () => assert.fail('the provider admitted a second request at 1 rpm'),
    (e) => e,
  );
  assert.ok(err instanceof RateLimitError);
  assert.equal(err.headers.get('x-redis-rl-denied-by'), null, "the provider's own 429");
  const tokens = await peek(redis, b.limits.tokens.key);
  near(100000 - tokens, first);
  near(100 - (await peek(redis, b.limits.requests.key)), 2);
});
