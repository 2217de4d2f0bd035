'use strict';
// A Redis Cluster of real servers for the tests: 3 masters (the slots split evenly) and one
// replica of the master that owns a given key, each server with the module or the Functions
// library, on free loopback ports; made by hand (ADDSLOTSRANGE, MEET, REPLICATE) so that
// every server the suites run on (Redis 7.0, 8.2, Valkey 9) can, with or without a cli.

const Redis = require('ioredis');
const { start } = require('./servers');

const CLUSTER = ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000'];

/** One admin command on a node (a fresh standalone connection: no cluster client involved). */
async function admin(node, ...args) {
  const c = new Redis(node.port, '127.0.0.1', { lazyConnect: true, maxRetriesPerRequest: 0 });
  c.on('error', () => {});
  try {
    await c.connect();
    return await c.call(...args);
  } finally {
    c.disconnect();
  }
}

async function until(what, check, ms = 60_000) {
  const deadline = Date.now() + ms;
  let last = null;
  for (;;) {
    try {
      if (await check()) return;
    } catch (e) {
      last = e; // not yet
    }
    if (Date.now() > deadline) {
      throw new Error(`cluster: ${what} did not happen within ${ms} ms${last ? ` (last: ${last.message})` : ''}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

const info = async (node, section) => {
  const text = String(await admin(node, section[0], section[1]));
  return Object.fromEntries(text.split(/\r?\n/).filter((l) => l.includes(':')).map((l) => l.split(':').map((x) => x.trim())));
};

/**
 * Starts the cluster; `replicaOf`: the key whose master gets the replica. Returns
 * `{ masters, replica, master, stop }` (`master`: the key's master).
 */
async function startCluster({ server = { module: true }, replicaOf }) {
  const nodes = [];
  const stop = async () => {
    for (const n of nodes) await n.stop();
  };
  try {
    for (let i = 0; i < 4; i++) nodes.push(await start({ ...server, extra: CLUSTER }));
    const masters = nodes.slice(0, 3);
    const replica = nodes[3];
    const per = Math.floor(16384 / masters.length);
    for (let i = 0; i < masters.length; i++) {
      const last = i === masters.length - 1 ? 16383 : (i + 1) * per - 1;
      await admin(masters[i], 'CLUSTER', 'ADDSLOTSRANGE', String(i * per), String(last));
    }
    for (const n of nodes.slice(1)) await admin(n, 'CLUSTER', 'MEET', '127.0.0.1', String(nodes[0].port));
    const slot = Number(await admin(masters[0], 'CLUSTER', 'KEYSLOT', replicaOf));
    const master = masters[Math.min(Math.floor(slot / per), masters.length - 1)];
    const id = String(await admin(master, 'CLUSTER', 'MYID'));
    await until('every node meeting the others', async () => {
      for (const n of nodes) {
        const i = await info(n, ['CLUSTER', 'INFO']);
        if (Number(i.cluster_known_nodes) !== nodes.length) return false;
      }
      return true;
    });
    await until('the replica attaching', async () => {
      await admin(replica, 'CLUSTER', 'REPLICATE', id);
      return true;
    });
    await until('the cluster being ok and the replica in sync', async () => {
      for (const n of nodes) if ((await info(n, ['CLUSTER', 'INFO'])).cluster_state !== 'ok') return false;
      return (await info(replica, ['INFO', 'replication'])).master_link_status === 'up';
    });
    return { masters, replica, master, nodes, per, stop, admin, until, info };
  } catch (e) {
    await stop();
    throw e;
  }
}

module.exports = { startCluster, admin, until, info };
