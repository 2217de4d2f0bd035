'use strict';
// Redis Cluster through the user's own cluster client (ioredis' Cluster, node-redis'
// createCluster), on both backends: keys spread over 3 masters (MOVED handled by the client:
// no second connection layer here), then the master of a hot key killed and its replica
// promoted (CLUSTER FAILOVER TAKEOVER): the failure policy covers the gap (counted), and the
// first decision from the promoted replica continues the replicated bucket (nothing minted).
// ioredis finds a replica promoted after its master died by itself. node-redis (v4 and v5)
// keeps sending the slot's commands to the dead master's address (and v5 can hang them
// there after the address answers again, seen here), so for it the replica is promoted with
// the master's agreement (CLUSTER FAILOVER: the old master answers MOVED), and then the new
// master is killed: the gap after it is the failure policy's, counted.

const test = require('node:test');
const assert = require('node:assert/strict');

const Redis = require('ioredis');
const redis5 = require('redis');
const redis4 = require('redis4');

const rl = require('..');
const { startCluster, admin, until } = require('../test-support/cluster');

const BACKENDS = [
  { name: 'module', server: { module: true }, backend: 'module' },
  { name: 'functions', server: { module: false, functions: true }, backend: 'functions' },
];

const noderedis = (lib) => async (node) => {
  const c = lib.createCluster({
    rootNodes: [{ url: node.url }],
    defaults: { socket: { reconnectStrategy: () => 50, connectTimeout: 1000 } },
  });
  c.on('error', () => {});
  await c.connect();
  return { client: c, close: () => c.disconnect().catch(() => {}) };
};

const CLIENTS = [
  {
    name: 'ioredis Cluster',
    kill: true,
    async connect(node) {
      const c = new Redis.Cluster([{ host: '127.0.0.1', port: node.port }], {
        clusterRetryStrategy: () => 50,
        redisOptions: { maxRetriesPerRequest: 20, retryStrategy: () => 50 },
      });
      c.on('error', () => {});
      await new Promise((resolve, reject) => {
        c.once('ready', resolve);
        c.once('end', () => reject(new Error('ioredis Cluster ended before ready')));
      });
      return { client: c, close: () => c.disconnect() };
    },
  },
  { name: 'node-redis v4 createCluster', connect: noderedis(redis4) },
  { name: 'node-redis v5 createCluster', connect: noderedis(redis5) },
];

const HOT = 'rl:cluster:hot';

// node-redis' cluster prints every failed reconnect of a node's client (console.error in
// its cluster-slots, whatever listeners there are): the dead master's, here on purpose.
const print = console.error;
console.error = (...args) => {
  if (args[0] instanceof Error && /ECONNREFUSED|ECONNRESET/.test(args[0].message)) return;
  print(...args);
};

for (const b of BACKENDS) {
  for (const c of CLIENTS) {
    test(`Cluster on the ${b.name}, ${c.name}: takes across masters, then a failover`, async (t) => {
      const cluster = await startCluster({ server: b.server, replicaOf: HOT });
      t.after(() => cluster.stop());
      const { client, close } = await c.connect(cluster.masters[0]);
      t.after(close);

      // Keys on every master: each take goes to its key's master through the client.
      const keys = Array.from({ length: 12 }, (_, i) => `rl:cluster:user:${i}`);
      const owners = new Set();
      for (const k of keys) owners.add(Math.min(Math.floor(Number(await admin(cluster.masters[0], 'CLUSTER', 'KEYSLOT', k)) / cluster.per), 2));
      assert.equal(owners.size, 3, 'the keys are spread over the 3 masters');
      for (const k of keys) {
        const l = new rl.Limiter(client, k, { rate: 0.001, cap: 2 }, { timeoutMs: 5000, backend: b.backend });
        const got = [];
        for (let i = 0; i < 3; i++) got.push((await l.take()).granted);
        assert.deepEqual(got, [true, true, false], k);
        assert.equal(l.counters.outages, 0, k);
      }
      const exists = [];
      for (const k of keys) {
        const owner = cluster.masters[Math.min(Math.floor(Number(await admin(cluster.masters[0], 'CLUSTER', 'KEYSLOT', k)) / cluster.per), 2)];
        exists.push(Number(await admin(owner, 'EXISTS', k)));
      }
      assert.deepEqual(exists, keys.map(() => 1), 'each bucket lives on its key\'s master');

      // The failover: 10 tokens taken and replicated, the master killed, the replica promoted.
      // A timeout no busy machine reaches for a live server: only the gap is an outage.
      const hot = new rl.Limiter(client, HOT, { rate: 0.001, cap: 100 }, { timeoutMs: 2000, backend: b.backend, instances: 4 });
      for (let i = 0; i < 10; i++) {
        const d = await hot.take();
        assert.deepEqual([d.granted, d.source], [true, 'server']);
      }
      assert.ok(Number(await admin(cluster.master, 'WAIT', '1', '10000')) >= 1, 'the replica has the bucket');
      let gapTakes = 0;
      if (c.kill) {
        // The master killed: nobody serves the slot until the replica takes over.
        cluster.master.kill();
        const gap = await hot.take();
        gapTakes += 1;
        assert.equal(gap.source, 'fallback', 'nobody serves the slot: the failure policy decides');
        assert.equal(gap.granted, true, 'allow: the local bucket (a quarter of the burst) grants');
        await admin(cluster.replica, 'CLUSTER', 'FAILOVER', 'TAKEOVER');
      } else {
        // The replica promoted with the master's agreement: the old master answers MOVED.
        await admin(cluster.replica, 'CLUSTER', 'FAILOVER');
      }
      let asked = Date.now();
      await until('the replica promoted', async () => {
        if (/role:master/.test(String(await admin(cluster.replica, 'INFO', 'replication')))) return true;
        // A manual failover the replica could not finish in time (a busy machine) is given up
        // by the server: asked again.
        if (!c.kill && Date.now() - asked > 6000) {
          asked = Date.now();
          await admin(cluster.replica, 'CLUSTER', 'FAILOVER');
        }
        return false;
      });
      let first = null;
      // The client finds the new master when it refreshes its slots: on a busy machine (the
      // other test files run beside this one) that took ioredis more than a minute once.
      await until('a decision from the promoted replica', async () => {
        const d = await hot.take();
        if (d.source === 'server') {
          first = d;
          return true;
        }
        gapTakes += 1;
        throw new Error(`take ${gapTakes} of the gap decided by the failure policy (counters ${JSON.stringify(hot.counters)})`);
      }, 180_000);
      if (!c.kill) {
        // Then the promoted master killed (its replica, the old master, left alone): node-redis
        // keeps sending to the dead address, and every take is the failure policy's.
        cluster.replica.kill();
        const gap = await hot.take();
        assert.deepEqual([gap.source, gap.granted], ['fallback', true], 'the failure policy decides the gap');
      }
      // The replicated bucket goes on: 100 - 10 - this one, less any take of the gap that
      // reached the new master late (a client's queued command); never more (nothing minted).
      assert.ok(first.granted);
      assert.ok(first.remaining <= 89 + 0.1, `remaining ${first.remaining}: tokens minted by the failover`);
      assert.ok(first.remaining >= 89 - gapTakes - 0.1, `remaining ${first.remaining}`);
      const n = hot.counters;
      assert.ok(n.outages >= 1 && n.fallbackGranted >= 1, JSON.stringify(n));
      assert.equal(n.outages, n.fallbackGranted + n.fallbackDenied, 'every gap take counted as an outage');
      assert.equal(n.granted, 11, 'the server grants: 10 before, 1 after');
    });
  }
}
