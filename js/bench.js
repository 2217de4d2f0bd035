'use strict';
// How long each call into the compiled core takes (no Redis: the replies are made up), so
// that "the event loop is never blocked" is a measured claim. Not a test (no thresholds):
//   npm run build && node bench.js
const { native } = require('./dist/cjs/native');
const rl = require('.');

// The best of 5 rounds: the machine is shared, and a round that another process slowed says
// nothing about the call.
const ROUNDS = 5;

function time(name, n, body) {
  for (let i = 0; i < Math.min(n, 10_000); i++) body(i); // warm up
  let best = Infinity;
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) body(i);
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / n);
  }
  console.log(`${name.padEnd(58)} ${best.toFixed(0).padStart(6)} ns/call`);
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
time('TakeCore.taken (an ioredis reply: Buffer remaining)', N, () => take.taken(1, ioredis, null, out, 0));
time('TakeCore.taken (a RESP3 reply: number remaining)', N, () => take.taken(1, resp3, null, out, 0));
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
const settles = new LastCommands();
const settle = (t) => {
  const s = budget.settle('module', t, actual, 0, settleOut, settles.has('module'), settles.positions);
  return s === null ? s : settles.apply('module', s);
};
settle(ticket);
time('BudgetCore.settle (a settled grant: nothing to send)', N, () => settle(ticket));
let id = 76;
time('BudgetCore.reserved + settle (RL.SETTLE args)', N, () => {
  reply[1] = id++; // each reservation its own id, as Redis gives them
  return settle(budget.reserved(costs, reply, grantOut));
});
time('BudgetCore.settled (an RL.SETTLE reply)', N, () => budget.settled([100, 0], settleOut));
time('parseLimits("10/second;500/minute, burst 20")', N, () => native.parseLimits('10/second;500/minute, burst 20'));
const shareCore = new native.ShareCore('fleet', 1e9, 1e9, 1000, null, 0, 'deny', 1, 4, 30000, 1000, 0);
shareCore.send('module', 'h1', 0);
shareCore.answered([Buffer.from('1000000000'), Buffer.from('1000000000'), 3_600_000, 1000, 1], 0, 0, 0);
time('ShareCore.take (the local bucket, a share held)', N, (i) => shareCore.take(1, out, i / 1e6));

// Limiter.take end to end over a client that answers at once (a resolved promise).
const fake = { call: async (name) => (name === 'RL.BUDGET' ? reply : ioredis) };
const limiter = new rl.Limiter(fake, 'user:42', { rate: 5, cap: 10 }, { backend: 'module' });
(async () => {
  await timeAsync('Limiter.take() over an instant client (all of the shell)', () => limiter.take());
  await timeAsync('Limiter.take(1, { key }) (a middleware\'s per-caller key)', (i) => limiter.take(1, { key: `rl:http:10.1.${i & 255}.3` }));
  // ShareLimiter.take: from memory (synchronous), a share held from a client that grants it.
  const grant = [Buffer.from('1000000000'), Buffer.from('1000000000'), 3_600_000, 1000, 1];
  const sl = new rl.ShareLimiter({ call: async () => grant }, 'fleet', { rate: 1e9, cap: 1e9, backend: 'module' });
  while (sl.share().rate === 0) await new Promise((r) => setTimeout(r, 5));
  time('ShareLimiter.take() (from memory, a share held)', N, () => sl.take());
  await sl.close();
  const tb = new rl.TokenBudget(fake, 'org', { rate: 100, cap: 10000 }, { requests: { rate: 1, cap: 10 }, backend: 'module' });
  await timeAsync('TokenBudget.reserve() over an instant client (all of it)', (i) => tb.reserve(500 + (i & 63)));
})();

async function timeAsync(name, body, n = 100_000) {
  for (let i = 0; i < 10_000; i++) await body(i);
  let best = Infinity;
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) await body(i);
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / n);
  }
  console.log(`${name.padEnd(58)} ${best.toFixed(0).padStart(6)} ns/call`);
}
