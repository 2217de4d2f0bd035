'use strict';
// redis-rl's Limiter side by side with rate-limiter-flexible's RateLimiterRedis (the version
// pinned in package.json) on one server, over one ioredis client each:
//   - server time per decision (INFO commandstats: the usec of the commands the client sent)
//     and round trips per decision (the commands the client sent, one at a time);
//   - Limiter.take against a raw `call('RL.TAKE', ...)` over the same client (the shell's cost);
//   - whether each holds one shared quota under the seed's skew (scripts/incident.py: a
//     1000/s quota with a burst of 1000, 3 hot instances at 700/s and 5 at 80/s): one Node
//     process per instance, open-loop Poisson arrivals from the seed, what each lets out.
// It writes its section of BENCHMARKS.md between `<!-- js:begin -->` and `<!-- js:end -->`.
//
//   npm run build && node bench-compare.js            measure, write BENCHMARKS.md
//   node bench-compare.js --smoke [--out FILE]        seconds: tiny counts, 3 processes, 1 s;
//                                                     the section to FILE (default: stdout)
// RL_SERVER, RL_MODULE: the server and module (test-support/servers.js). No thresholds: the
// numbers are reported; only the bounds of a shared quota are checked (by the test).

const { fork } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');
const rl = require('.');

const RATE = 1000;
const CAP = 1000;
const SEED = 20240611;
const HOT = 700;
const COLD = 80;
const BEGIN = '<!-- js:begin -->';
const END = '<!-- js:end -->';

const FULL = { decisions: 20_000, rounds: 7, roundSize: 2_000, instances: 8, hot: 3, seconds: 5 };
const SMOKE = { decisions: 300, rounds: 2, roundSize: 200, instances: 3, hot: 1, seconds: 1 };

function connect(port) {
  const c = new Redis(port, '127.0.0.1', { lazyConnect: true, maxRetriesPerRequest: 1 });
  c.on('error', () => {});
  return c.connect().then(() => c);
}

/** Counts the commands a client sends (ioredis hands every one to sendCommand). */
function counting(client) {
  const sent = { count: 0, names: new Set() };
  const send = client.sendCommand.bind(client);
  client.sendCommand = (command, ...rest) => {
    sent.count += 1;
    sent.names.add(String(command.name).toLowerCase());
    return send(command, ...rest);
  };
  return sent;
}

function commandstats(text) {
  const out = {};
  for (const line of String(text).split(/\r?\n/)) {
    const m = /^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/.exec(line);
    if (m) out[m[1].toLowerCase()] = { calls: Number(m[2]), usec: Number(m[3]) };
  }
  return out;
}

/** `n` decisions one at a time: server usec and commands sent per decision. */
async function perDecision(admin, client, sent, n, decide) {
  for (let i = 0; i < 200; i++) await decide(i); // the script loaded, the backend probed
  await admin.call('CONFIG', 'RESETSTAT');
  sent.count = 0;
  sent.names.clear();
  for (let i = 0; i < n; i++) await decide(i);
  const stats = commandstats(await admin.call('INFO', 'commandstats'));
  let usec = 0;
  for (const name of sent.names) usec += stats[name]?.usec ?? 0;
  return { usec: usec / n, roundTrips: sent.count / n, commands: [...sent.names].join(', ') };
}

/** Interleaved rounds of each body; the best round of each (a shared machine: see bench.js). */
async function ratio(rounds, size, bodies) {
  const best = bodies.map(() => Infinity);
  for (let r = 0; r < rounds; r++) {
    for (let b = 0; b < bodies.length; b++) {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < size; i++) await bodies[b](i);
      best[b] = Math.min(best[b], Number(process.hrtime.bigint() - t0) / size / 1000);
    }
  }
  return best;
}

// ---- the skew run: one process per instance -------------------------------------------

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Instance `inst`'s arrivals (ms from the start): Poisson at `rate`/s for `seconds`, from the seed. */
function arrivals(inst, rate, seconds) {
  const rand = mulberry32(SEED + inst);
  const out = [];
  for (let t = 0; ; ) {
    t += (-Math.log(1 - rand()) / rate) * 1000;
    if (t >= seconds * 1000) return out;
    out.push(t);
  }
}

async function worker(job) {
  const client = await connect(job.port);
  let decide;
  if (job.approach === 'redis-rl') {
    const l = new rl.Limiter(client, job.key, { rate: RATE, cap: CAP }, { backend: 'module', timeoutMs: 1000 });
    decide = async () => (await l.take()).granted;
  } else {
    const l = new RateLimiterRedis({ storeClient: client, points: CAP, duration: CAP / RATE, keyPrefix: job.key });
    decide = () => l.consume('q').then(() => true, (e) => (e instanceof Error ? Promise.reject(e) : false));
  }
  await client.call('PING');
  const times = arrivals(job.inst, job.rate, job.seconds);
  const grants = [];
  let denied = 0;
  let errors = 0;
  const pending = [];
  const wait = job.startAt - Date.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  const t0 = job.startAt;
  for (const at of times) {
    const delay = t0 + at - Date.now();
    if (delay > 1) await new Promise((r) => setTimeout(r, delay));
    const asked = Date.now() - t0;
    pending.push(
      decide().then(
        (ok) => (ok ? grants.push(asked) : (denied += 1)),
        () => (errors += 1),
      ),
    );
  }
  await Promise.all(pending);
  client.disconnect();
  process.send({ inst: job.inst, arrivals: times.length, grants, denied, errors, end: Date.now() - t0 });
}

function maxInWindow(sorted, ms) {
  let best = 0;
  for (let i = 0, j = 0; i < sorted.length; i++) {
    while (sorted[i] - sorted[j] >= ms) j++;
    best = Math.max(best, i - j + 1);
  }
  return best;
}

async function skew(port, sc, approach) {
  const key = `bench:skew:${approach}:${process.pid}`;
  const startAt = Date.now() + 1500; // every process connected and waiting by then
  const jobs = Array.from({ length: sc.instances }, (_, inst) => ({
    port, key, approach, inst, startAt, seconds: sc.seconds, rate: inst < sc.hot ? HOT : COLD,
  }));
  const results = await Promise.all(
    jobs.map(
      (job) =>
        new Promise((resolve, reject) => {
          const child = fork(__filename, ['--worker', JSON.stringify(job)], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
          child.once('message', resolve);
          child.once('exit', (code) => (code === 0 ? undefined : reject(new Error(`worker ${job.inst} exited ${code}`))));
        }),
    ),
  );
  results.sort((a, b) => a.inst - b.inst);
  const all = results.flatMap((r) => r.grants).sort((a, b) => a - b);
  const seconds = Math.max(...results.map((r) => r.end)) / 1000;
  return {
    approach,
    perInstance: results.map((r) => ({ inst: r.inst, asked: r.arrivals, granted: r.grants.length, errors: r.errors })),
    granted: all.length,
    asked: results.reduce((s, r) => s + r.arrivals, 0),
    errors: results.reduce((s, r) => s + r.errors, 0),
    seconds,
    // One shared token bucket lets out at most its burst plus the rate over the run.
    quota: CAP + RATE * seconds,
    max1s: maxInWindow(all, 1000),
    max100ms: maxInWindow(all, 100),
  };
}

// ---- the run ---------------------------------------------------------------------------

async function main() {
  const args = process.argv.slice(2);
  const smoke = args.includes('--smoke');
  const outAt = args.indexOf('--out');
  const sc = smoke ? SMOKE : FULL;
  const { start, SERVER } = require('./test-support/servers');
  const server = await start({ module: true });
  try {
    const admin = await connect(server.port);
    const version = String(await admin.call('INFO', 'server')).match(/(redis|valkey)_version:(\S+)/);
    const client = await connect(server.port);
    const sent = counting(client);

    const limiter = new rl.Limiter(client, 'bench:rl', { rate: 1e6, cap: 1e6 }, { backend: 'module' });
    const rlf = new RateLimiterRedis({ storeClient: client, points: 1e9, duration: 3600, keyPrefix: 'bench:rlf' });
    const raw = () => client.call('RL.TAKE', 'bench:raw', '1000000', '1000000', '1', 'WITHSTATE');
    const rows = [
      ['redis-rl `Limiter.take()`', await perDecision(admin, client, sent, sc.decisions, () => limiter.take())],
      ['raw `call(\'RL.TAKE\', key, rate, cap, 1, \'WITHSTATE\')`', await perDecision(admin, client, sent, sc.decisions, raw)],
      [`rate-limiter-flexible ${require('rate-limiter-flexible/package.json').version} \`RateLimiterRedis.consume()\``, await perDecision(admin, client, sent, sc.decisions, () => rlf.consume('q'))],
    ];
    const [takeUs, rawUs, rlfUs] = await ratio(sc.rounds, sc.roundSize, [() => limiter.take(), raw, () => rlf.consume('q')]);
    client.disconnect();
    admin.disconnect();

    const runs = [await skew(server.port, sc, 'redis-rl'), await skew(server.port, sc, 'rate-limiter-flexible')];
    const section = render({ smoke, sc, version: version ? `${version[1]} ${version[2]}` : SERVER, rows, takeUs, rawUs, rlfUs, runs });
    const result = { rows, takeUs, rawUs, rlfUs, runs, section };
    if (outAt >= 0) fs.writeFileSync(args[outAt + 1], section);
    else if (smoke) process.stdout.write(section);
    else writeBenchmarks(section);
    if (args.includes('--json')) process.stdout.write(`\n${JSON.stringify(result)}\n`);
  } finally {
    await server.stop();
  }
}

function render({ smoke, sc, version, rows, takeUs, rawUs, rlfUs, runs }) {
  const f = (x, d = 1) => x.toFixed(d);
  const load = os.loadavg().map((x) => x.toFixed(2)).join(' ');
  const lines = [
    BEGIN,
    '## The JavaScript client against rate-limiter-flexible',
    '',
    `Generated by \`js/bench-compare.js\`${smoke ? ' (smoke run: tiny counts, not for reading)' : ''}; ` +
      `${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC, ${version}, Node ${process.version}, ` +
      `ioredis ${require('ioredis/package.json').version}, load average ${load}. One ioredis client each, one ` +
      'decision at a time on loopback; server time from `INFO commandstats` (the commands the client sent).',
    '',
    '| Decision | server µs per decision | round trips per decision | commands sent |',
    '|---|---:|---:|---|',
    ...rows.map(([name, r]) => `| ${name} | ${f(r.usec, 2)} | ${f(r.roundTrips, 2)} | ${r.commands} |`),
    '',
    `Wall time per decision over the same client (best of ${sc.rounds} interleaved rounds of ${sc.roundSize}): ` +
      `\`Limiter.take()\` ${f(takeUs)} µs, raw \`RL.TAKE\` ${f(rawUs)} µs (**${f(takeUs / rawUs, 2)}x**; target ≤ 1.1x), ` +
      `\`RateLimiterRedis.consume()\` ${f(rlfUs)} µs.`,
    '',
    `One shared quota under the seed's skew: ${RATE}/s with a burst of ${CAP} (rate-limiter-flexible: ${CAP} points ` +
      `per ${CAP / RATE} s window, its nearest equivalent), ${sc.instances} Node processes on one key, ${sc.hot} hot at ${HOT}/s and ` +
      `${sc.instances - sc.hot} at ${COLD}/s, Poisson arrivals from seed ${SEED}, ${sc.seconds} s. The bound is the token ` +
      'bucket\'s: its burst plus the rate over the run.',
    '',
    '| Approach | asked | let out | bound | within | most in any 1 s | most in any 100 ms | errors | let out per process |',
    '|---|---:|---:|---:|---|---:|---:|---:|---|',
    ...runs.map(
      (r) =>
        `| ${r.approach} | ${r.asked} | ${r.granted} | ${f(r.quota, 0)} | ${r.granted <= r.quota ? 'yes' : '**no**'} | ` +
        `${r.max1s} | ${r.max100ms} | ${r.errors} | ${r.perInstance.map((p) => p.granted).join(' / ')} |`,
    ),
    '',
    'Both keep their count in Redis, so neither multiplies the quota by the processes (express-rate-limit\'s ' +
      'in-process store would: each process its own quota). They differ in shape: the bucket lets out its burst ' +
      'and then its rate, the fixed window its points once per window: under more demand than the quota, a ' +
      'window\'s points go early in it and every caller is refused until it resets (the hot processes take most ' +
      'of either: neither is a fair share; `ShareLimiter` is, once it is in this package). The Rust and ' +
      'Python clients\' numbers: the sections above.',
    END,
    '',
  ];
  return lines.join('\n');
}

function writeBenchmarks(section) {
  const file = path.join(__dirname, '..', 'BENCHMARKS.md');
  const text = fs.readFileSync(file, 'utf8');
  const a = text.indexOf(BEGIN);
  const b = text.indexOf(END);
  const next =
    a >= 0 && b > a ? text.slice(0, a) + section.trimEnd() + text.slice(b + END.length) : `${text.trimEnd()}\n\n${section}`;
  fs.writeFileSync(file, next);
  process.stdout.write(section);
}

if (process.argv[2] === '--worker') {
  worker(JSON.parse(process.argv[3])).then(
    () => process.exit(0),
    (e) => {
      console.error(e);
      process.exit(1);
    },
  );
} else if (require.main === module) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { arrivals, maxInWindow };
