'use strict';
// How long each call into the compiled core takes (no Redis: the replies are made up), so
// that "the event loop is never blocked" is a measured claim. Not a test (no thresholds):
//   npm run build && node bench.js
const { native } = require('./dist/cjs/native');
const rl = require('.');

function time(name, n, body) {
  for (let i = 0; i < Math.min(n, 10_000); i++) body(i); // warm up
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) body(i);
  const ns = Number(process.hrtime.bigint() - t0) / n;
  console.log(`${name.padEnd(58)} ${ns.toFixed(0).padStart(6)} ns/call`);
}

const N = 200_000;
const take = new native.TakeCore('user:42', 5, 10, 'allow', null);
const ioredis = [1, Buffer.from('9.25'), 0, 150];
const resp3 = [1, 9.25, 0, 150];
const out = new Float64Array(8);
const { taken } = require('./dist/cjs/limiter');
time('TakeCore.command (RL.TAKE args, a per-call key)', N, () => take.command('module', 1, 'rl:http:10.1.2.3'));
time('TakeCore.taken (an ioredis reply: Buffer remaining)', N, () => take.taken(1, ioredis, null, out, 0));
time('TakeCore.taken (a RESP3 reply: number remaining)', N, () => take.taken(1, resp3, null, out, 0));
time('TakeCore.outage (the local bucket)', N, (i) => take.outage(1, i / 1000, null, out));
time('taken() -> Decision (the shell\'s whole reply path)', N, () => taken(take, 1, ioredis, null));
const d = taken(take, 1, ioredis, null);
time('Decision.headers()', N, () => d.headers());
const budget = new native.BudgetCore('org', [{ name: 'tokens', rate: 100, cap: 10000 }, { name: 'requests', rate: 1, cap: 10 }], 60000, 'allow', null);
const costs = budget.costs(500, []);
const reply = [1, 77, null, 0, [Buffer.from('9500'), Buffer.from('9')]];
time('BudgetCore.reserveCommand', N, () => budget.reserveCommand('module', costs));
time('BudgetCore.reserved (a grant)', N, () => budget.reserved(costs, reply));
const g = budget.reserved(costs, reply);
time('BudgetCore.settle (a settled grant: nothing to send)', N, () => budget.settle('module', g, [400, null], 0));
time('parseLimits("10/second;500/minute, burst 20")', N, () => native.parseLimits('10/second;500/minute, burst 20'));

// Limiter.take end to end over a client that answers at once (a resolved promise).
const fake = { call: async () => ioredis };
const limiter = new rl.Limiter(fake, 'user:42', { rate: 5, cap: 10 }, { backend: 'module' });
(async () => {
  const n = 100_000;
  for (let i = 0; i < 10_000; i++) await limiter.take();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await limiter.take();
  const ns = Number(process.hrtime.bigint() - t0) / n;
  console.log(`${'Limiter.take() over an instant client (all of the shell)'.padEnd(58)} ${ns.toFixed(0).padStart(6)} ns/call`);
})();
