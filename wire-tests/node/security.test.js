// The Node.js driver and mongosh with credentials against Sluice with authorization enabled:
// the first user through the localhost exception, SCRAM-SHA-256 and SCRAM-SHA-1 logins, a
// wrong password refused with 18, an unauthorized write with 13.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { MongoClient, MongoServerError } = require('mongodb');
const { startSluice } = require('./sluice');

let sluice;
let hostPort;
before(async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-node-sec-'));
  const config = path.join(dir, 'sluice.toml');
  fs.writeFileSync(config, `metrics_listen = ""\n[security]\nauthorization = "enabled"\nusers_file = "${path.join(dir, 'users.json')}"\n`);
  sluice = await startSluice(['demo', '--shards', '2', '--config', config]);
  hostPort = sluice.uri.replace('mongodb://', '').replace(/\/$/, '');
  const anon = new MongoClient(sluice.uri, { serverSelectionTimeoutMS: 5000 });
  await anon.db('admin').command({ createUser: 'root', pwd: 'rootpw', roles: ['root'] });
  await anon.close();
  const root = new MongoClient(`mongodb://root:rootpw@${hostPort}/?authSource=admin`, { serverSelectionTimeoutMS: 5000 });
  await root.db('admin').command({ createUser: 'app', pwd: 'apppw', roles: [{ role: 'readWrite', db: 'shop' }] });
  await root.db('admin').command({ createUser: 'viewer', pwd: 'viewpw', roles: [{ role: 'read', db: 'shop' }] });
  await root.close();
});
after(async () => { await sluice.stop(); });

test('SCRAM-SHA-256 and SCRAM-SHA-1 logins', async () => {
  for (const mech of ['SCRAM-SHA-256', 'SCRAM-SHA-1']) {
    const client = new MongoClient(`mongodb://app:apppw@${hostPort}/?authSource=admin&authMechanism=${mech}`, { serverSelectionTimeoutMS: 5000 });
    await client.db('shop').collection('orders').insertOne({ mech });
    const status = await client.db('admin').command({ connectionStatus: 1 });
    assert.deepStrictEqual(status.authInfo.authenticatedUsers, [{ user: 'app', db: 'admin' }]);
    await client.close();
  }
});

test('a wrong password is 18 and an unauthorized write 13', async () => {
  const bad = new MongoClient(`mongodb://app:nope@${hostPort}/?authSource=admin`, { serverSelectionTimeoutMS: 5000 });
  await assert.rejects(bad.connect(), (err) => {
    assert.strictEqual(err.code, 18);
    assert.match(err.message, /Authentication failed\./);
    return true;
  });
  await bad.close();
  const viewer = new MongoClient(`mongodb://viewer:viewpw@${hostPort}/?authSource=admin`, { serverSelectionTimeoutMS: 5000 });
  assert.strictEqual(await viewer.db('shop').collection('orders').countDocuments(), 2);
  await assert.rejects(viewer.db('shop').collection('orders').insertOne({ x: 1 }), (err) => {
    assert.ok(err instanceof MongoServerError);
    assert.strictEqual(err.code, 13);
    assert.match(err.message, /^not authorized on shop to execute command \{ insert: "orders"/);
    return true;
  });
  await viewer.close();
});

test('mongosh logs in with a user', () => {
  const mongosh = path.resolve(__dirname, '..', 'node_modules', '.bin', 'mongosh');
  const out = execFileSync(mongosh, [
    `mongodb://app:apppw@${hostPort}/shop?authSource=admin`, '--quiet', '--eval',
    'const s = db.runCommand({connectionStatus: 1}); print(s.authInfo.authenticatedUsers[0].user + " " + db.orders.countDocuments())',
  ], { encoding: 'utf8', timeout: 120000 });
  assert.strictEqual(out.trim(), 'app 2');
});
