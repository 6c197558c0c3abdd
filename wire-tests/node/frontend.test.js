// The Node.js driver against the router alone: connect, topology discovery, ping.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert');
const { MongoClient, MongoServerError } = require('mongodb');
const { startSluice } = require('./sluice');

let sluice;
before(async () => { sluice = await startSluice(['run']); });
after(async () => { await sluice.stop(); });

test('connects and sees a mongos', async () => {
  const client = new MongoClient(sluice.uri, { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  const ping = await client.db('admin').command({ ping: 1 });
  assert.strictEqual(ping.ok, 1);
  const hello = await client.db('admin').command({ hello: 1 });
  assert.strictEqual(hello.msg, 'isdbgrid');
  assert.strictEqual(client.topology.description.type, 'Sharded');
  await client.close();
});

// zstd is left to the pymongo and Rust suites: the driver's zstd add-on (@mongodb-js/zstd)
// fetches its native build from outside the npm registry at install time.
test('compression is negotiated', async () => {
  for (const compressor of ['zlib', 'snappy']) {
    const client = new MongoClient(sluice.uri, { serverSelectionTimeoutMS: 5000, compressors: [compressor] });
    await client.connect();
    const before = (await client.db('admin').command({ serverStatus: 1 })).network.compression[compressor];
    await client.db('admin').command({ ping: 1 });
    const afterStatus = (await client.db('admin').command({ serverStatus: 1 })).network.compression[compressor];
    assert.ok(afterStatus.decompressor.bytesIn > before.decompressor.bytesIn, `${compressor} requests`);
    assert.ok(afterStatus.compressor.bytesOut > before.compressor.bytesOut, `${compressor} replies`);
    await client.close();
  }
});

test('unknown command errors carry the code', async () => {
  const client = new MongoClient(sluice.uri, { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  await assert.rejects(client.db('admin').command({ noSuchCommand: 1 }), (err) => {
    assert.ok(err instanceof MongoServerError);
    assert.strictEqual(err.code, 59);
    assert.strictEqual(err.codeName, 'CommandNotFound');
    return true;
  });
  await client.close();
});
