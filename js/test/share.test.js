'use strict';
// ShareLimiter: the share holder's golden cases (protocol/client-cases/share.json) through the
// compiled core as the JS shell calls it, then against real servers: two limiters on one key
// split the rate, an outage mid-run (the server stopped, started again on its port) goes to
// the failure policy and back, close() releases (the other holder gets the whole rate after),
// malformed RL.SHARE replies are errors, never a crash.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');

const rl = require('..');
const { native } = require('../dist/cjs/native');
const { core: guard } = require('../dist/cjs/errors');
const { start, SERVER, MODULE } = require('../test-support/servers');
const { CLIENTS } = require('../test-support/clients');

const DOC = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'protocol', 'client-cases', 'share.json'), 'utf8'));
const PINS = [null, 'rate', 'block', 'exempt'];

/** A case's reply as ioredis hands it over (Buffers for bulk strings). */
function reply(j) {
  if (typeof j === 'string') return Buffer.from(j);
  if (Array.isArray(j)) return j.map(reply);
  if (j !== null && typeof j === 'object') return j.double;
  return j;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits until `check()` is truthy (a server's state, not a duration: no timing threshold). */
async function until(what, check, ms = 30_000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > end) throw new Error(`never: ${what}`);
    await sleep(20);
  }
}

for (const c of DOC.cases) {
  test(`share case: ${c.name.slice(0, 70)}`, () => {
    const h = { ...DOC.holder, ...c.holder };
    const s = new native.ShareCore(
      h.key, h.rate, h.cap, h.period_ms, h.version, h.headroom, h.policy, h.allow_share,
      h.instances, h.allow_for_ms, h.deny_retry_after_ms, 0,
    );
    const out = new Float64Array(8);
    let sent = 0;
    const counted = { granted: 0, denied: 0, fallback: 0 };
    for (const step of c.steps) {
      const at = step.at_ms ?? 0;
      const where = `${c.name}: ${JSON.stringify(step)}`;
      if ('send' in step) {
        const args = s.send(step.send, h.id, at);
        if ('command' in step) assert.deepEqual(args, step.command, where);
        sent = at;
      } else if ('release' in step) {
        assert.deepEqual(s.releaseCommand(step.release, h.id), step.command, where);
      } else if ('reply' in step) {
        let next;
        try {
          next = guard(() => s.answered(reply(step.reply), sent, at, 0));
          assert.ok(!step.protocol_error, where);
        } catch (e) {
          assert.ok(e instanceof rl.ProtocolError, `${where}: ${e}`);
          assert.equal(step.protocol_error, true, where);
          next = s.failed();
        }
        assert.equal(Math.floor(next + 1e-9), step.next_ms, where);
      } else if ('error' in step) {
        assert.equal(Math.floor(s.failed() + 1e-9), step.next_ms, where);
      } else if ('timeout' in step || 'refused' in step) {
        assert.equal(Math.floor(s.outage('refused' in step, at, h.probe_ms) + 1e-9), step.next_ms, where);
      } else if ('take' in step) {
        const ok = s.take(step.take, out, at);
        if (step.failed) {
          assert.equal(ok, false, where);
          continue;
        }
        assert.equal(ok, true, where);
        const w = step.decision;
        assert.equal(out[0] === 1, w.allowed, where);
        assert.equal(out[6] === 1, w.fallback, where);
        assert.ok(Math.abs(out[2] - w.remaining) < 1e-6, `${where}: remaining ${out[2]}`);
        assert.deepEqual([out[3], out[4]], [w.retry_after_ms, w.reset_after_ms], where);
        assert.equal(PINS[out[7]], w.pinned, where);
        assert.deepEqual([out[1], out[5]], [w.allowed ? step.take : 0, h.cap], where);
        if (w.fallback) counted.fallback++;
        else if (w.allowed) counted.granted++;
        else counted.denied++;
      } else if ('share' in step) {
        const i = s.info(at);
        const w = step.share;
        for (const k of ['rate', 'burst', 'tokens']) assert.ok(Math.abs(i[k] - w[k]) < 1e-6, `${where}: ${k} ${i[k]}`);
        assert.deepEqual([i.holders, i.fallback, i.pinned ?? null], [w.holders, w.fallback, w.pinned], where);
      } else if ('tick' in step) {
        assert.equal(s.drifted(at), step.drifted, where);
      } else {
        throw new Error(`${c.name}: unknown step ${JSON.stringify(step)}`);
      }
    }
    const k = s.counters();
    assert.deepEqual(
      [k.granted, k.denied, k.fallbackGranted + k.fallbackDenied],
      [counted.granted, counted.denied, counted.fallback],
      c.name,
    );
  });
}

test('bad arguments throw and change nothing; malformed replies are ProtocolErrors', () => {
  const s = new native.ShareCore('k', 10, 5, 1000, null, 0, 'deny', 1, 1, 0, 1000, 0);
  const out = new Float64Array(8);
  for (const n of [0, -1, 1.5, 6, NaN, Infinity, 2 ** 60]) {
    assert.throws(() => guard(() => s.take(n, out, 0)), RangeError, String(n));
  }
  assert.throws(() => guard(() => s.take(1, new Float64Array(2), 0)), RangeError);
  assert.equal(s.attempted(), 0);
  assert.throws(() => guard(() => new native.ShareCore('k', 10, 5, 1000, null, 0, 'maybe', 1, 1, 0, 1000, 0)), RangeError);
  assert.throws(() => guard(() => new native.ShareCore('k', NaN, 5, 1000, null, 0, 'deny', 1, 1, 0, 1000, 0)), RangeError);
  assert.throws(() => guard(() => new native.ShareCore('k', 10, 5, 1000, null, NaN, 'deny', 1, 1, 0, 1000, 0)), RangeError);
  assert.throws(() => guard(() => s.send('cluster', 'h', 0)), RangeError);
  s.send('module', 'h', 0);
  const bad = [{}, [{}], new Date(), 'OK', [1, 2], true, 2n ** 80n, Symbol('x'), () => 1, new Error('ERR x'), [[[[[[[[[[[1]]]]]]]]]]]];
  for (const r of bad) {
    assert.throws(() => guard(() => s.answered(r, 0, 1, 0)), rl.ProtocolError, String(typeof r));
    assert.throws(() => guard(() => native.checkShareReply(r)), rl.ProtocolError);
  }
  assert.throws(() => new rl.ShareLimiter({ call: async () => null }, 'k', { rate: 10, cap: 5, period: 0 }), RangeError);
  assert.throws(() => new rl.ShareLimiter({ call: async () => null }, 'k', { rate: 10, cap: 5, policy: 'maybe' }), RangeError);
});

/** A fake client whose every reply is `r` (an RL.SHARE reply that is not one). */
function answering(r) {
  return { call: async () => (typeof r === 'function' ? r() : r) };
}

test('malformed RL.SHARE replies through a client: takes throw a ProtocolError, no crash', async () => {
  for (const r of ['OK', [Buffer.from('x')], { a: 1 }, null, 7]) {
    const l = new rl.ShareLimiter(answering(r), 'k', { rate: 10, cap: 5, backend: 'module' });
    await until('the refresh answered', () => l.counters.errors > 0);
    assert.throws(() => l.take(), rl.ProtocolError);
    await l.close();
    assert.throws(() => l.take(), /closed/);
  }
  // An error reply is thrown as a ServerError once no share may be used.
  const e = Object.assign(new (class ReplyError extends Error {})('WRONGTYPE bad'), {});
  const l = new rl.ShareLimiter({ call: async () => { throw e; } }, 'k', { rate: 10, cap: 5, backend: 'module' });
  await until('the refresh failed', () => l.counters.errors > 0);
  assert.throws(() => l.take(), rl.ServerError);
  await l.close();
});

const ioredis = CLIENTS[0];

/** Takes until one is granted (the local bucket fills at the share's rate). */
async function granted(l, what) {
  return until(what, () => {
    const d = l.take();
    return d.granted ? d : null;
  });
}

for (const c of CLIENTS) {
  test(`ShareLimiter on ${c.name}: two holders split the rate; close() gives it back`, async (t) => {
    const server = await start();
    t.after(() => server.stop());
    const a = await c.connect(server.url);
    const b = await c.connect(server.url);
    t.after(() => a.close());
    t.after(() => b.close());
    const opts = { rate: 100, cap: 20, period: 0.3, timeout: 5 };
    const la = new rl.ShareLimiter(a.client, 'fleet', opts);
    const lb = new rl.ShareLimiter(b.client, 'fleet', opts);
    await until('both holders seen', () => la.share().holders === 2 && lb.share().holders === 2);
    await until('the rate split', () => la.share().rate + lb.share().rate <= 100 + 1e-9 && la.share().rate > 0 && lb.share().rate > 0);
    assert.ok(la.share().rate < 100 && lb.share().rate < 100);
    const d = await granted(la, 'a grant from the share');
    assert.equal(d.source, 'share');
    assert.equal(d.limit, 20);
    assert.ok(la.counters.redisCalls >= 1);
    await lb.close();
    assert.throws(() => lb.take(), /closed/);
    await until('the whole rate after the release', () => la.share().rate === 100 && la.share().holders === 1);
    await la.close();
  });
}

test('an outage mid-run goes to the failure policy and back (allow, deny)', async (t) => {
  const server = await start();
  let proc = null;
  const stopCurrent = async () => {
    if (proc === null) return server.kill();
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGKILL');
    await gone;
  };
  t.after(async () => {
    if (proc !== null) await stopCurrent();
    await server.stop();
  });
  const { client, close } = await ioredis.connect(server.url, { retries: 0 });
  t.after(() => close());
  for (const policy of ['allow', 'deny']) {
    const l = new rl.ShareLimiter(client, `out:${policy}`, { rate: 1000, cap: 50, period: 0.3, policy, instances: 2, timeout: 0.1, probeInterval: 0.05 });
    await until('a share', () => l.share().rate > 0 && !l.share().fallback);
    assert.equal((await granted(l, 'a share grant')).source, 'share');
    await stopCurrent();
    const f = await until('a fallback decision', () => {
      const d = l.take();
      return d.source === 'fallback' && (d.granted || policy === 'deny') ? d : null;
    });
    assert.ok(l.counters.outages > 0);
    if (policy === 'allow') {
      // ALLOW: the limit over the holders seen (1).
      assert.deepEqual([l.share().fallback, l.share().rate], [true, 1000]);
    } else {
      assert.deepEqual([f.granted, f.retryAfterMs, l.share().rate], [false, 1000, 0]);
    }
    // The server again, on its port and directory.
    proc = spawn(SERVER, ['--port', String(server.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', server.dir, '--loadmodule', MODULE], { stdio: 'ignore' });
    await until('back on the share', () => {
      l.take();
      return !l.share().fallback && l.share().rate > 0;
    });
    assert.equal((await granted(l, 'a share grant again')).source, 'share');
    await l.close();
  }
});

test('a bad n throws a RangeError and counts nothing; a limiter left open never keeps the process alive', async () => {
  const grant = [Buffer.from('100'), Buffer.from('10'), 3000, 1000, 1];
  const l = new rl.ShareLimiter(answering(grant), 'k', { rate: 100, cap: 10, backend: 'module' });
  await until('a share', () => l.share().rate === 100);
  for (const n of [0, -1, 1.5, 11, NaN, Infinity]) assert.throws(() => l.take(n), RangeError, String(n));
  for (const n of ['1', null, {}]) assert.throws(() => l.take(n), TypeError, String(n));
  const k = l.counters;
  assert.deepEqual([k.granted, k.denied, k.errors], [0, 0, 0]);
  await l.close();
  await l.close(); // twice: nothing more
  // A process whose only work is a share limiter (its client never answers) ends by itself.
  const script = `const rl = require(${JSON.stringify(path.join(__dirname, '..'))});
    new rl.ShareLimiter({ call: () => new Promise(() => {}) }, 'k', { rate: 10, cap: 5, backend: 'module' });
    setTimeout(() => {}, 50);`;
  const child = spawn(process.execPath, ['-e', script], { stdio: 'ignore' });
  const code = await new Promise((r) => child.once('exit', r));
  assert.equal(code, 0);
});

test('ShareLimiter on the Functions library: a share, and close() releases it', async (t) => {
  const server = await start({ module: false, functions: true });
  t.after(() => server.stop());
  const a = await ioredis.connect(server.url);
  const b = await ioredis.connect(server.url);
  t.after(() => a.close());
  t.after(() => b.close());
  const opts = { rate: 100, cap: 20, period: 0.3, timeout: 5 };
  const la = new rl.ShareLimiter(a.client, 'fn:fleet', opts);
  const lb = new rl.ShareLimiter(b.client, 'fn:fleet', { ...opts, backend: 'functions' });
  await until('both holders seen', () => la.share().holders === 2 && lb.share().holders === 2);
  assert.equal((await granted(la, 'a grant')).source, 'share');
  await lb.close();
  await until('the whole rate after the release', () => la.share().rate === 100 && la.share().holders === 1);
  await la.close();
});

test('a malformed or error reply to RELEASE rejects close(), no crash', async () => {
  const grant = [Buffer.from('100'), Buffer.from('10'), 3000, 1000, 1];
  const ReplyError = class ReplyError extends Error {};
  for (const [what, release] of [
    ['OK', async () => 'OK'],
    ['a nested object', async () => [{ x: new Date() }]],
    ['an error reply', async () => { throw new ReplyError('ERR nope'); }],
  ]) {
    const client = { call: (name, ...args) => (args.includes('RELEASE') ? release() : Promise.resolve(grant)) };
    const l = new rl.ShareLimiter(client, 'k', { rate: 100, cap: 10, backend: 'module' });
    await until('a share', () => l.share().rate === 100);
    await assert.rejects(l.close(), rl.ServerError, what);
    assert.throws(() => l.take(), /closed/);
  }
});
