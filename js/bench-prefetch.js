'use strict';
// PrefetchLimiter's take from memory (no Redis: a client whose lease replies are made up and
// instant), the measured claim behind "a prefetched take is one sub-microsecond native call".
// Not a test (no thresholds):   npm run build && node bench-prefetch.js
const { native } = require('./dist/cjs/native');
const rl = require('.');

const line = (name, ns) => console.log(`${name.padEnd(58)} ${ns.toFixed(0).padStart(6)} ns/call`);

function time(name, n, body) {
  for (let i = 0; i < Math.min(n, 10_000); i++) body(i); // warm up
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) body(i);
  line(name, Number(process.hrtime.bigint() - t0) / n);
}

const N = 1_000_000;
// A batch so large the ledger seldom renews: what is measured is the take from memory.
const core = new native.PrefetchCore('k', 1e9, 1e9, 1e8, 3_600_000, 0.2, 0, 200, 'allow', null, null, null);
const b = core.begin('module', 1, 0);
core.landed(b.flight, [1e8, 1, 3_600_000, 0], 0, 0.5);
time('PrefetchCore.grant (the native call alone)', N, (i) => core.grant(1, 1 + i / 1e6));

let lease = 0;
const fake = { call: async (cmd) => (cmd === 'RL.RETURN' ? 0 : [1e8, ++lease, 3_600_000, 0]) };
const p = new rl.PrefetchLimiter(fake, 'k', { rate: 1e9, cap: 1e9, batch: 1e8, ttlMs: 3_600_000, jitter: 0, backend: 'module' });
(async () => {
  await p.take();
  time('PrefetchLimiter.takeSync() from memory (a Decision)', N, () => p.takeSync());
  const n = 1_000_000;
  for (let i = 0; i < 10_000; i++) await p.take();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await p.take();
  line('await PrefetchLimiter.take() from memory', Number(process.hrtime.bigint() - t0) / n);
  await p.close();
})();
