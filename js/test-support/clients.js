'use strict';
// The clients every integration test runs on: ioredis (RESP2), node-redis v4 (RESP2) and
// node-redis v5 (RESP2 and RESP3).

const Redis = require('ioredis');
const redis5 = require('redis');
const redis4 = require('redis4');

const CLIENTS = [
  {
    name: 'ioredis',
    async connect(url, opts = {}) {
      const c = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: opts.retries ?? 20, retryStrategy: () => 50 });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: () => c.disconnect() };
    },
  },
  {
    name: 'node-redis v4',
    async connect(url) {
      const c = redis4.createClient({ url, socket: { reconnectStrategy: () => 50 } });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: () => c.disconnect().catch(() => {}) };
    },
  },
  {
    name: 'node-redis v5 RESP2',
    async connect(url) {
      const c = redis5.createClient({ url, RESP: 2, socket: { reconnectStrategy: () => 50 } });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: () => c.destroy() };
    },
  },
  {
    name: 'node-redis v5 RESP3',
    async connect(url) {
      const c = redis5.createClient({ url, RESP: 3, socket: { reconnectStrategy: () => 50 } });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: () => c.destroy() };
    },
  },
];

module.exports = { CLIENTS };
