// Starts a sluice process on a free loopback port for the Node.js suites.
'use strict';

const { spawn } = require('node:child_process');
const net = require('node:net');
const path = require('node:path');

const root = path.resolve(__dirname, '..', '..');
const bin = process.env.SLUICE_BIN || path.join(root, 'target', 'debug', 'sluice');

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on('error', reject);
  });
}

// Whether a TCP connection to `port` on `host` (loopback by default) is accepted.
function canConnect(port, host = '127.0.0.1') {
  return new Promise((resolve) => {
    const s = net.connect(port, host);
    s.on('connect', () => { s.destroy(); resolve(true); });
    s.on('error', () => resolve(false));
  });
}

async function startSluice(args) {
  const port = await freePort();
  const child = spawn(bin, [...args, '--listen', `127.0.0.1:${port}`], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (d) => { output += d; });
  child.stderr.on('data', (d) => { output += d; });
  const deadline = Date.now() + 20000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`sluice exited early:\n${output}`);
    if (await canConnect(port)) {
      return {
        uri: `mongodb://127.0.0.1:${port}/`,
        stop: () => new Promise((resolve) => {
          if (child.exitCode !== null) return resolve();
          child.on('exit', () => resolve());
          child.kill('SIGTERM');
        }),
      };
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  child.kill('SIGKILL');
  throw new Error(`sluice did not listen within 20 s:\n${output}`);
}

module.exports = { startSluice, canConnect };
