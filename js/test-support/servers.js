'use strict';
// Real redis-server processes for the integration tests, on free loopback ports in temp
// dirs, each killed when its test ends (and at exit, whatever happens).
//   RL_SERVER  the server binary (default: redis-server)
//   RL_MODULE  the module (default: ../target/debug/libredis_rl.so)

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const ROOT = path.join(__dirname, '..', '..');
const SERVER = process.env.RL_SERVER || 'redis-server';
const MODULE = process.env.RL_MODULE || path.join(ROOT, 'target', 'debug', 'libredis_rl.so');
const LIBRARY = fs.readFileSync(path.join(ROOT, 'functions', 'rl.lua'), 'utf8');

const live = new Set();
process.on('exit', () => {
  for (const s of live) s.kill();
});

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** One RESP command over a fresh socket (no client library): its raw reply text. */
function raw(port, args) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let out = '';
    sock.on('error', reject);
    sock.on('data', (d) => {
      out += d.toString();
      if (out.endsWith('\r\n')) {
        sock.end();
        resolve(out);
      }
    });
    sock.write(`*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join(''));
  });
}

class Server {
  constructor(port, dir, proc) {
    this.port = port;
    this.dir = dir;
    this.proc = proc;
    this.url = `redis://127.0.0.1:${port}`;
  }

  kill() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
    live.delete(this);
  }
  async stop() {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) {
      live.delete(this);
      fs.rmSync(this.dir, { recursive: true, force: true });
      return;
    }
    const gone = new Promise((r) => this.proc.once('exit', r));
    this.kill();
    await gone;
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A server with the module (`module: true`, default) and/or the Functions library
 * (`functions: true`) loaded; `extra`: more arguments for the server (`--cluster-enabled yes`).
 */
async function start({ module = true, functions = false, extra = [] } = {}) {
  if (module && !fs.existsSync(MODULE)) {
    throw new Error(`the module ${MODULE} is missing: cargo build -p redis-rl (or set RL_MODULE)`);
  }
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rl-js-'));
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir];
  if (module) args.push('--loadmodule', MODULE);
  args.push(...extra);
  const server = new Server(port, dir, spawnServer(dir, args));
  live.add(server);
  await ready(server);
  if (functions) {
    const reply = await raw(port, ['FUNCTION', 'LOAD', 'REPLACE', LIBRARY]);
    if (!reply.includes('rl')) throw new Error(`FUNCTION LOAD: ${reply}`);
  }
  return server;
}

function spawnServer(dir, args) {
  const log = fs.openSync(path.join(dir, 'server.log'), 'a');
  const proc = spawn(SERVER, args, { stdio: ['ignore', log, log] });
  fs.closeSync(log);
  return proc;
}

/** Waits until the server answers PING. */
async function ready(server) {
  const { proc, port, dir } = server;
  for (let i = 0; ; i++) {
    if (proc.exitCode !== null) {
      throw new Error(`redis-server exited: ${fs.readFileSync(path.join(dir, 'server.log'), 'utf8').slice(-2000)}`);
    }
    try {
      if ((await raw(port, ['PING'])).startsWith('+PONG')) break;
    } catch {
      // not listening yet
    }
    if (i > 500) throw new Error('redis-server did not start');
    await new Promise((r) => setTimeout(r, 10));
  }
}

module.exports = { start, raw, SERVER, MODULE };
