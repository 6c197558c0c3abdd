// The Node.js driver through `sluice demo`: ordered bulks with a duplicate key at statement
// 500 report exactly what mongos reports, under every rewrite policy.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { MongoClient, MongoBulkWriteError } = require('mongodb');
const { startSluice } = require('./sluice');

let sluice;
let client;
before(async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-node-'));
  const config = path.join(dir, 'policies.toml');
  fs.writeFileSync(config, '[ordered_rewrite_overrides]\n"demo.n_off" = "off"\n"demo.n_always" = "always"\n');
  sluice = await startSluice(['demo', '--config', config]);
  client = new MongoClient(sluice.uri, { serverSelectionTimeoutMS: 5000 });
  await client.connect();
});
after(async () => {
  await client.close();
  await sluice.stop();
});

for (const coll of ['n_off', 'n_safe', 'n_always']) {
  test(`duplicate key at 500 under ${coll}`, async () => {
    await client.db('admin').command({ shardCollection: `demo.${coll}`, key: { _id: 'hashed' } });
    const c = client.db('demo').collection(coll);
    await c.insertOne({ _id: 500 });
    const docs = Array.from({ length: 1000 }, (_, i) => ({ _id: i }));
    await assert.rejects(c.insertMany(docs, { ordered: true }), (err) => {
      assert.ok(err instanceof MongoBulkWriteError, String(err));
      assert.strictEqual(err.insertedCount, 500);
      assert.strictEqual(err.writeErrors.length, 1);
      assert.strictEqual(err.writeErrors[0].index, 500);
      assert.strictEqual(err.writeErrors[0].code, 11000);
      return true;
    });
  });
}

test('a thousand ordered upserts', async () => {
  const c = client.db('demo').collection('store_inventory');
  const ops = Array.from({ length: 1000 }, (_, i) => ({
    replaceOne: { filter: { _id: { productId: i, storeId: 42 } }, replacement: { stock: i }, upsert: true },
  }));
  const before = (await client.db('admin').command({ serverStatus: 1 })).sluice.writes.plans.rewrite;
  const res = await c.bulkWrite(ops, { ordered: true });
  assert.strictEqual(res.upsertedCount, 1000);
  const afterStatus = (await client.db('admin').command({ serverStatus: 1 })).sluice.writes.plans.rewrite;
  assert.strictEqual(afterStatus, before + 1);
  assert.strictEqual(await c.countDocuments({ '_id.storeId': 42 }), 1000);
});
