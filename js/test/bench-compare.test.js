'use strict';
// The comparison benchmark's smoke run (seconds: tiny counts, 3 processes for 1 s): it runs
// end to end against a real server and renders its BENCHMARKS.md section. No timings are
// asserted; the let-out of the shared bucket is held to its bound (burst + rate x run).

const test = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const { arrivals, maxInWindow } = require('../bench-compare');

test('the seed\'s arrivals are the same on every run; the window count is exact', () => {
  assert.deepEqual(arrivals(0, 700, 1), arrivals(0, 700, 1));
  assert.notDeepEqual(arrivals(0, 700, 1), arrivals(1, 700, 1));
  const a = arrivals(0, 700, 10);
  assert.ok(a.length > 6000 && a.length < 8000, String(a.length)); // Poisson at 700/s for 10 s
  assert.equal(maxInWindow([0, 10, 20, 1000, 1005], 1000), 4); // 10 .. 1005
  assert.equal(maxInWindow([0, 999, 1000, 1001], 1000), 3);
  assert.equal(maxInWindow([], 100), 0);
});

test('bench-compare --smoke renders its section from a real run', () => {
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'rl-bench-')), 'section.md');
  execFileSync(process.execPath, [path.join(__dirname, '..', 'bench-compare.js'), '--smoke', '--out', out], {
    stdio: ['ignore', 'ignore', 'inherit'],
    timeout: 120_000,
  });
  const text = fs.readFileSync(out, 'utf8');
  fs.rmSync(path.dirname(out), { recursive: true, force: true });
  assert.ok(text.startsWith('<!-- js:begin -->') && text.trimEnd().endsWith('<!-- js:end -->'));
  for (const row of ['| redis-rl `Limiter.take()`', "| raw `call('RL.TAKE'", '| rate-limiter-flexible ']) {
    assert.ok(text.includes(row), row);
  }
  const skew = text.split('\n').filter((l) => /^\| (redis-rl|rate-limiter-flexible) \|/.test(l));
  assert.equal(skew.length, 2, text);
  const [, , asked, letOut, bound, within, , , errors] = skew[0].split('|').map((s) => s.trim());
  assert.ok(Number(letOut) <= Number(bound) && within === 'yes', skew[0]);
  assert.ok(Number(letOut) > 0 && Number(letOut) <= Number(asked), skew[0]);
  assert.equal(errors, '0', skew[0]);
});
