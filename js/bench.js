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
const { LastCommands } = require('./dist/cjs/patch');
const perKey = new LastCommands();
time('TakeCore.command (RL.TAKE args, a per-call key)', N, (i) =>
  perKey.apply('module', take.command('module', 1, `rl:http:10.1.${i & 255}.3`, perKey.has('module'), perKey.positions)));
time('TakeCore.taken (an ioredis reply: Buffer remaining)', N, () => take.taken(1, ioredis, null, out));
time('TakeCore.taken (a RESP3 reply: number remaining)', N, () => take.taken(1, resp3, null, out));
time('TakeCore.outage (the local bucket)', N, (i) => take.outage(1, i / 1000, null, out));
time('taken() -> Decision (the shell\'s whole reply path)', N, () => taken(take, 1, ioredis, null));
const d = taken(take, 1, ioredis, null);
time('Decision.headers()', N, () => d.headers());
const budget = new native.BudgetCore('org', [{ name: 'tokens', rate: 100, cap: 10000 }, { name: 'requests', rate: 1, cap: 10 }], 60000, 'allow', null);
const costs = new Float64Array(2);
const none = new Float64Array(0);
time('BudgetCore.costs (one token limit and requests)', N, (i) => budget.costs(500 + (i & 63), [], none, costs));
const cmds = new LastCommands();
time('BudgetCore.reserveCommand (the costs change each call)', N, (i) => {
  costs[0] = 500 + (i & 63);
  return cmds.apply('module', budget.reserveCommand('module', costs, cmds.has('module'), cmds.positions));
});
costs[0] = 500;
const reply = [1, 77, null, 0, [Buffer.from('9500'), Buffer.from('9')]];
const grantOut = new Float64Array(5 + 2);
const settleOut = new Float64Array(1 + 2);
time('BudgetCore.reserved (a grant) + forget', N, () => budget.forget(budget.reserved(costs, reply, grantOut)));
const ticket = budget.reserved(costs, reply, grantOut);
const actual = Float64Array.of(400, NaN);
budget.settle('module', ticket, actual, 0, settleOut);
time('BudgetCore.settle (a settled grant: nothing to send)', N, () => budget.settle('module', ticket, actual, 0, settleOut));
time('BudgetCore.reserved + settle (RL.SETTLE args)', N, () =>
  budget.settle('module', budget.reserved(costs, reply, grantOut), actual, 0, settleOut));
time('BudgetCore.settled (an RL.SETTLE reply)', N, () => budget.settled([100, 0], settleOut));
time('parseLimits("10/second;500/minute, burst 20")', N, () => native.parseLimits('10/second;500/minute, burst 20'));

// Limiter.take end to end over a client that answers at once (a resolved promise).
const fake = { call: async (name) => (name === 'RL.BUDGET' ? reply : ioredis) };
const limiter = new rl.Limiter(fake, 'user:42', { rate: 5, cap: 10 }, { backend: 'module' });
(async () => {
  const n = 100_000;
  for (let i = 0; i < 10_000; i++) await limiter.take();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await limiter.take();
  const ns = Number(process.hrtime.bigint() - t0) / n;
  console.log(`${'Limiter.take() over an instant client (all of the shell)'.padEnd(58)} ${ns.toFixed(0).padStart(6)} ns/call`);
  const tb = new rl.TokenBudget(fake, 'org', { rate: 100, cap: 10000 }, { requests: { rate: 1, cap: 10 }, backend: 'module' });
  for (let i = 0; i < 10_000; i++) await tb.reserve(500 + (i & 63));
  const t1 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await tb.reserve(500 + (i & 63));
  const ns2 = Number(process.hrtime.bigint() - t1) / n;
  console.log(`${'TokenBudget.reserve() over an instant client (all of it)'.padEnd(58)} ${ns2.toFixed(0).padStart(6)} ns/call`);
})();
