'use strict';
// PrefetchLimiter: the prefetch ledger's golden cases (protocol/client-cases/prefetch.json)
// through the compiled core as the TS shell calls it, then against real servers: concurrent
// takes within the bound with no false outage, an outage mid-run, malformed lease replies,
// and close() returning the leftovers.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const rl = require('..');
const native = require('../redis-rl.node');
const { start } = require('../test-support/servers');
const { CLIENTS } = require('../test-support/clients');

const CASES = JSON.parse(
  fs.readFileSync(path.join(__dirname, '..', '..', 'protocol', 'client-cases', 'prefetch.json'), 'utf8'),
).cases;

/** A case's reply as ioredis hands it over (Buffers for bulk strings). */
function reply(j) {
  if (typeof j === 'string') return Buffer.from(j);
  if (Array.isArray(j)) return j.map(reply);
  return j;
}

function ledger(s) {
  return new native.PrefetchCore(
    s.key, s.rate, s.cap, s.batch, s.ttl_ms, s.renew_at, s.jitter, s.timeout_ms,
    'allow', null, s.init ?? null, s.version ?? null,
  );
}

function local(got) {
  if (got.kind === 'granted') return { granted: got.value, renew: got.renew };
  if (got.kind === 'denied') return { denied: got.value };
  return 'ask';
}

function landed(l) {
  if (l.kind === 'granted') return { granted: true, served: l.served, left: l.value };
  if (l.kind === 'denied') return { denied: l.value };
  return l.kind;
}

const SNAKE = (k) => k.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/** Runs one case; `mutate` (a test of the runner) changes a step's expectation first. */
function run(c, mutate) {
  const lg = ledger(c.ledger);
  c.steps.forEach((step0, i) => {
    const step = mutate ? mutate(structuredClone(step0), i) : step0;
    const at = `${c.name}, step ${i}`;
    const t = step.at_ms ?? 0;
    const backend = step.backend ?? 'module';
    if ('take' in step) {
      assert.deepEqual(local(lg.take(step.take, t, step.down ?? false)), step.local, at);
    } else if ('begin' in step) {
      const b = lg.begin(backend, step.begin, t);
      if (b.kind === 'send') assert.deepEqual({ flight: b.flight, command: b.command }, step.send, at);
      else if (b.kind === 'busy') assert.equal(b.flight, step.busy, at);
      else assert.ok(step.closed, at);
    } else if ('reply' in step) {
      const r = reply(step.reply);
      if (step.protocol_error) {
        assert.throws(() => lg.landed(step.flight, r, t, step.draw ?? 0.5), /unexpected reply/, at);
        return;
      }
      const l = lg.landed(step.flight, r, t, step.draw ?? 0.5);
      assert.deepEqual(landed(l), step.landed, at);
      assert.deepEqual(l.giveBack, step.give_back, at);
    } else if ('error' in step) {
      assert.deepEqual(lg.failed(step.flight, step.error, t), step.give_back, at);
    } else if ('timeout' in step) {
      assert.equal(lg.giveUp(step.timeout), step.claimed, at);
    } else if ('cancel' in step) {
      lg.release(step.cancel, false, t);
    } else if ('judge' in step) {
      assert.equal(lg.judge(step.judge, t, step.limit_ms), step.judged, at);
    } else if ('close' in step) {
      assert.deepEqual(lg.close(t), step.give_back, at);
    } else if ('held' in step) {
      assert.equal(lg.held(t), step.held, at);
    } else if ('late_bound_ms' in step) {
      assert.equal(Math.floor(lg.lateBoundMs), step.late_bound_ms, at);
    } else if ('enter' in step) {
      assert.equal(lg.enterLine(step.enter, step.front, step.again ?? null), step.waiter, at);
    } else if ('leave' in step) {
      assert.equal(lg.leaveLine(step.leave), step.next, at);
    } else if ('wake' in step) {
      assert.deepEqual(lg.wake(step.wake), step.woken, at);
    } else if ('grant' in step) {
      const left = lg.grant(step.grant, t);
      assert.equal(left === -1 ? null : left, step.left ?? null, at);
    } else if ('forget' in step) {
      lg.forget();
    } else if ('counters' in step) {
      const got = lg.counters();
      for (const [k, v] of Object.entries(step.counters)) assert.equal(got[SNAKE(k)], v, `${at}: counter ${k}`);
    } else {
      assert.fail(`${at}: no event in ${JSON.stringify(step)}`);
    }
  });
}

test('the prefetch golden cases through the JS shell', async (t) => {
  for (const c of CASES) await t.test(c.name.slice(0, 60), () => run(c));
});

test('the runner fails when a case expects otherwise', () => {
  // Each kind of expectation, changed, must fail (a case that cannot fail is a defect).
  const changes = {
    local: (s) => { s.local = s.local === 'ask' ? { granted: 1, renew: false } : 'ask'; },
    send: (s) => { if (s.send) s.send.flight += 1; else s.busy = (s.busy ?? 0) + 1; },
    landed: (s) => { s.landed = 'stale-not'; },
    give_back: (s) => { s.give_back = [[999, 1]]; },
    held: (s) => { s.held += 1; },
    counters: (s) => { const k = Object.keys(s.counters)[0]; s.counters[k] += 1; },
  };
  for (const [field, change] of Object.entries(changes)) {
    let broken = 0;
    for (const c of CASES) {
      c.steps.forEach((s, i) => {
        if (!(field in s) && !(field === 'send' && 'busy' in s)) return;
        assert.throws(() => run(c, (st, j) => { if (j === i) change(st); return st; }), `${field} in ${c.name}`);
        broken += 1;
      });
    }
    assert.ok(broken > 0, `no step expects ${field}`);
  }
});

test('anything handed back is read or refused, never a crash', () => {
  const lg = new native.PrefetchCore('k', 10, 100, 20, 1000, 0.2, 0.1, 200, 'allow', null, null, null);
  const { flight } = lg.begin('module', 1, 0);
  for (const bad of [{}, { a: 1 }, [Buffer.from('x'), 1, 2, 3], [1, 2], 2 ** 70, [[[[[[[[[[1]]]]]]]]]], 'OK', true, Symbol('s'), () => 1, -1, [-1, 1, 1000, 0], [1.5, 1, 1000, 0], new Error('x')]) {
    assert.throws(() => lg.landed(flight, bad, 1, 0.5), (e) => /unexpected reply/.test(e.message), String(bad));
  }
  for (const f of [flight, 999, 0]) {
    lg.landed(f, [20, 1, 1000, 0], 2, 0.5);
    lg.failed(f, 'unknown', 3);
    lg.giveUp(f);
    lg.claim(f);
    lg.release(f, true, 4);
    lg.judge(f, 5, 0);
  }
  assert.throws(() => lg.failed(flight, 'nonsense', 0), (e) => e.code === 'InvalidArg');
  assert.throws(() => lg.begin('redis', 1, 0), (e) => e.code === 'InvalidArg');
  assert.throws(() => lg.take(-1, 0, false), (e) => e.code === 'InvalidArg');
  assert.throws(() => lg.take(1.5, 0, false), (e) => e.code === 'InvalidArg');
  assert.throws(() => lg.grant(1, NaN), (e) => e.code === 'InvalidArg');
  assert.throws(() => new native.PrefetchCore('k', 10, 5, 20, 1000, 0.2, 0.1, 200, 'allow', null, null, null), (e) => e.code === 'InvalidArg');
  for (const opts of [{ rate: 10, cap: 5, batch: 20 }, { rate: 10, cap: 100, renewAt: 1 }, { rate: 10, cap: 100, jitter: 2 }, { rate: 10, cap: 100, ttlMs: 0 }, { rate: 10, cap: 100, failurePolicy: 'last_known' }]) {
    assert.throws(() => new rl.PrefetchLimiter({ call() {} }, 'k', opts), RangeError, JSON.stringify(opts));
  }
});

test('the late-reply bound is the one every client keeps', () => {
  for (const [ttlMs, timeoutMs, bound] of [[2000, 200, 10_000], [60_000, 2000, 63_000], [9000, 500, 10_500]]) {
    const lg = new native.PrefetchCore('k', 10, 100, 20, ttlMs, 0.2, 0.1, timeoutMs, 'allow', null, null, null);
    assert.equal(lg.lateBoundMs, bound);
  }
});

// ---- against real servers ----

const { spawn } = require('node:child_process');
const os = require('node:os');
const { raw, SERVER, MODULE } = require('../test-support/servers');

const BACKENDS = [
  { name: 'module', server: { module: true }, backend: 'module' },
  { name: 'functions', server: { module: false, functions: true }, backend: 'functions' },
];

function sendRaw(client, args) {
  return typeof client.call === 'function' ? client.call(...args) : client.sendCommand(args);
}

for (const b of BACKENDS) {
  test(`PrefetchLimiter on the ${b.name}: takes from memory, close() returns the leftovers`, async (t) => {
    const server = await start(b.server);
    t.after(() => server.stop());
    for (const c of CLIENTS) {
      await t.test(c.name, async () => {
        const { client, close } = await c.connect(server.url);
        try {
          const key = `rl:pf:${c.name}:${b.name}`;
          // Nothing refills within the test; no jitter: the threshold is 2 of 10.
          const p = new rl.PrefetchLimiter(client, key, {
            rate: 0.001, cap: 100, batch: 10, ttlMs: 60_000, renewAt: 0.2, jitter: 0, timeoutMs: 10_000, backend: b.backend,
          });
          const d1 = await p.take();
          assert.deepEqual([d1.granted, d1.tokens, d1.source, d1.remaining, d1.limit], [true, 1, 'server', 9, 100]);
          const d2 = await p.take(2);
          assert.deepEqual([d2.granted, d2.source, d2.remaining], [true, 'lease', 7]);
          assert.equal(p.takeSync(1).source, 'lease');
          assert.equal(p.held, 6);
          assert.equal(d2.headers()['X-RateLimit-Remaining'], '7');
          await assert.rejects(p.take(101), RangeError);
          const credited = await p.close();
          assert.equal(credited, 6);
          await assert.rejects(p.take(), /closed/);
          assert.equal(p.takeSync(), null);
          // The bucket holds what was not taken: 100 - 4.
          const l = new rl.Limiter(client, key, { rate: 0.001, cap: 100 }, { timeoutMs: 10_000, backend: b.backend });
          const after = await l.take(96);
          assert.equal(after.granted, true);
          assert.ok(after.remaining < 0.01, String(after.remaining));
          const cs = p.counters;
          assert.deepEqual(
            [cs.leases, cs.leaseTokens, cs.returns, cs.tokensReturned, cs.outages, cs.granted, cs.tokensGranted],
            [1, 10, 1, 6, 0, 3, 4],
          );
          // An error reply is thrown, never decided by the policy.
          await sendRaw(client, ['SET', `${key}:str`, 'x']);
          const w = new rl.PrefetchLimiter(client, `${key}:str`, { rate: 1, cap: 10, batch: 5, backend: b.backend, timeoutMs: 10_000 });
          await assert.rejects(w.take(), (e) => e instanceof rl.ServerError && /WRONGTYPE/.test(e.message));
          assert.equal(w.counters.errors, 1);
          await w.close();
        } finally {
          await close();
        }
      });
    }
  });
}

test('10,000 concurrent takes on one PrefetchLimiter: no false outage, grants within the bound', async (t) => {
  const server = await start({ module: true });
  t.after(() => server.stop());
  for (const [c, takes] of [[CLIENTS[0], 10_000], [CLIENTS[3], 5000]]) {
    const { client, close } = await c.connect(server.url);
    try {
      // A slow refill: once the bucket is empty, one denied lease denies the whole line.
      const rate = 1;
      const cap = 1000;
      const batch = 50;
      const p = new rl.PrefetchLimiter(client, `pf:burst:${c.name}`, { rate, cap, batch, ttlMs: 5000, timeoutMs: 5000 });
      const t0 = performance.now();
      const ds = await Promise.all(Array.from({ length: takes }, () => p.take()));
      const secs = (performance.now() - t0) / 1000;
      const granted = ds.filter((d) => d.granted).length;
      assert.ok(ds.every((d) => d.source !== 'fallback'), `${c.name}: a false outage`);
      assert.equal(p.counters.outages, 0);
      // One instance: at most cap + rate * t + 2 * batch (the elapsed time bounds t from above).
      assert.ok(granted <= cap + rate * (secs + 1) + 2 * batch, `${c.name}: ${granted} granted in ${secs}s`);
      assert.ok(granted >= cap - 2 * batch, `${c.name}: only ${granted} granted`);
      assert.equal(p.counters.granted, granted);
      await p.close();
      assert.equal(p.counters.leasesLost, 0);
    } finally {
      await close();
    }
  }
});

/** A redis-server on `port` in `dir` (the same port again after a stop: an outage and a return). */
async function serverOn(port, dir) {
  const proc = spawn(SERVER, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, '--loadmodule', MODULE], { stdio: 'ignore' });
  for (let i = 0; ; i++) {
    try {
      if ((await raw(port, ['PING'])).startsWith('+PONG')) break;
    } catch {
      // not listening yet
    }
    if (proc.exitCode !== null || i > 500) throw new Error('redis-server did not start');
    await new Promise((r) => setTimeout(r, 10));
  }
  const stop = () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
    const gone = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGKILL');
    return gone;
  };
  process.once('exit', () => proc.kill('SIGKILL'));
  return { stop };
}

for (const c of CLIENTS) {
  test(`a Redis outage mid-run (stopped, started again), ${c.name}: the policy decides, then leases again`, async (t) => {
    const first = await start({ module: true });
    const port = first.port;
    const { client, close } = await c.connect(first.url);
    t.after(close);
    const p = new rl.PrefetchLimiter(client, 'pf:outage', { rate: 0.001, cap: 100, batch: 10, ttlMs: 60_000, jitter: 0, timeoutMs: 200 });
    t.after(() => p.close().catch(() => {}));
    assert.equal((await p.take()).source, 'server');
    for (let i = 0; i < 8; i++) assert.equal((await p.take()).source, 'lease');
    await first.stop();
    // At most two batches are held (20 tokens): once they run out the policy decides, never throws.
    const during = [];
    for (let i = 0; i < 25; i++) during.push(await p.take());
    assert.ok(during.some((d) => d.source === 'fallback'), JSON.stringify(during.map((d) => d.source)));
    assert.ok(p.counters.outages > 0);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rl-js-pf-'));
    const again = await serverOn(port, dir);
    t.after(async () => {
      await again.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    });
    // Back: within a bounded number of probes, a take is Redis's again.
    let back = null;
    for (let i = 0; i < 200 && back === null; i++) {
      const d = await p.take();
      if (d.source !== 'fallback') back = d;
      else await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(back !== null && back.granted, 'leases again once Redis is back');
  });
}

test('malformed lease replies are ProtocolErrors; the next take still works', async () => {
  let reply = 'OK';
  const fake = { call: async () => reply };
  const p = new rl.PrefetchLimiter(fake, 'k', { rate: 1, cap: 50, batch: 10, backend: 'module' });
  for (const bad of ['OK', [1, 2], [1, 'x', 0, 0], { a: 1 }, [true, 1, 0, 0], Buffer.from('1'), [11, 1, 1000, 0], [-1, 1, 1000, 0], null]) {
    reply = bad;
    await assert.rejects(p.take(), rl.ProtocolError, JSON.stringify(bad));
  }
  reply = [10, 5, 1000, 0];
  const d = await p.take();
  assert.deepEqual([d.granted, d.source, d.remaining], [true, 'server', 9]);
  assert.equal(p.counters.outages, 0);
});

/** A client whose replies the test hands over when it wants (each call waits for `answer`). */
function held() {
  const calls = [];
  return {
    calls,
    client: {
      call: (...args) =>
        new Promise((resolve, reject) => {
          calls.push({ args: args.map(String), resolve, reject });
        }),
    },
  };
}

const tick = () => new Promise((r) => setImmediate(r));

test('event orders: a lease landing after its take timed out, after close(); waiters in line', async () => {
  const h = held();
  const p = new rl.PrefetchLimiter(h.client, 'k', { rate: 0.001, cap: 100, batch: 10, ttlMs: 60_000, jitter: 0, timeoutMs: 50, backend: 'module' });
  // Three takes: the first sends the lease call, the others stand in line behind it.
  const takes = [p.take(), p.take(2), p.take()];
  await tick();
  assert.equal(h.calls.length, 1, 'one call in the air');
  assert.deepEqual(h.calls[0].args.slice(0, 2), ['RL.LEASE', 'k']);
  // Its caller gives up after its timeout: an outage for it (the failure policy decides)...
  const first = await takes[0];
  assert.equal(first.source, 'fallback');
  // ...and the ones behind it do not wait for a Redis believed down.
  const rest = await Promise.all(takes.slice(1));
  assert.ok(rest.every((d) => d.source === 'fallback'), JSON.stringify(rest));
  // The late reply still lands: its tokens are installed for the next takes (never lost).
  h.calls[0].resolve([10, 7, 60_000, 0]);
  await tick();
  assert.equal(p.held, 10);
  const d = await p.take(3);
  assert.deepEqual([d.granted, d.source, d.remaining], [true, 'lease', 7]);
  // A renewal in the air when close() is called: close returns what is held now, and the
  // renewal's lease is returned when it lands.
  const renew = await p.take(5); // leaves 2: at the threshold, a renewal is sent
  assert.equal(renew.source, 'lease');
  await tick();
  assert.equal(h.calls.length, 2, 'the renewal');
  const closing = p.close();
  await tick();
  h.calls[1].resolve([10, 8, 60_000, 0]);
  // Each RL.RETURN answered (the tokens credited) as it comes.
  for (let i = 0, answered = 2; i < 20; i++) {
    await tick();
    for (; answered < h.calls.length; answered++) h.calls[answered].resolve(Number(h.calls[answered].args[3]));
  }
  const returns = h.calls.slice(2).map((c) => c.args);
  assert.deepEqual(returns.sort(), [['RL.RETURN', 'k', '7', '2'], ['RL.RETURN', 'k', '8', '10']]);
  assert.equal(await closing, 2, 'close credits what it returned itself');
  await assert.rejects(p.take(), /closed/);
  assert.equal(p.counters.leasesLost, 0);
});

test('a bad n rejects (never a synchronous throw), and changes nothing', async () => {
  const p = new rl.PrefetchLimiter({ call: async () => [10, 1, 1000, 0] }, 'k', { rate: 1, cap: 10, batch: 5, backend: 'module' });
  for (const n of [0, -1, 1.5, NaN, 11, 2 ** 64]) {
    let promise;
    assert.doesNotThrow(() => { promise = p.take(n); });
    await assert.rejects(promise, RangeError, String(n));
  }
  assert.equal(p.held, 0);
});

test('malformed RL.RETURN replies are errors from close(), the lease counted lost', async () => {
  const p = new rl.PrefetchLimiter({ call: async (cmd) => (cmd === 'RL.RETURN' ? 'OK' : [10, 1, 60_000, 0]) }, 'k', { rate: 1, cap: 10, batch: 10, backend: 'module' });
  await p.take();
  await assert.rejects(p.close(), rl.ProtocolError);
  assert.equal(p.counters.leasesLost, 1);
});

test('an outage after leases: the failure policy lets out its share once (what was leased is debited from it)', async () => {
  let up = true;
  const fake = {
    call: async () => {
      if (!up) throw new Error('connect ECONNREFUSED');
      return [10, 1, 60_000, 0];
    },
  };
  // instances 4: the local share is 25 of the cap of 100.
  const p = new rl.PrefetchLimiter(fake, 'k', { rate: 0.001, cap: 100, batch: 10, ttlMs: 60_000, jitter: 0, renewAt: 0.2, instances: 4, backend: 'module' });
  assert.equal((await p.take()).source, 'server');
  up = false;
  const ds = [];
  for (let i = 0; i < 40; i++) ds.push(await p.take());
  const lease = ds.filter((d) => d.source === 'lease').length;
  const fallback = ds.filter((d) => d.source === 'fallback' && d.granted).length;
  assert.equal(lease, 9, 'the batch spent');
  assert.equal(fallback, 15, 'the share (25) less the lease (10)');
  assert.ok(ds.every((d) => d.granted || d.source === 'fallback'));
});
