// A mongosh session through `sluice demo`, the way users type it, on a sharded collection
// (demo.store_inventory, {_id: "hashed"}) and an unsharded one. Expected values come from
// the data the script writes.
const assert = require('assert');
let passed = 0;
function check(name, fn) {
  fn();
  passed += 1;
  print(`ok - ${name}`);
}
const demo = db.getSiblingDB('demo');
const inv = demo.getCollection('session_inventory');
const plain = demo.getCollection('session_plain');

check('shard a collection and write to it', () => {
  sh.shardCollection('demo.session_inventory', { _id: 'hashed' });
  const docs = [];
  for (let p = 0; p < 30; p++) {
    for (let s = 0; s < 4; s++) docs.push({ _id: { productId: p, storeId: s }, stock: p * 10 + s, store: s });
  }
  const res = inv.insertMany(docs);
  assert.strictEqual(Object.keys(res.insertedIds).length, 120);
  plain.insertMany([{ _id: 1, v: 'a' }, { _id: 2, v: 'b' }]);
});

check('find with sort and limit, countDocuments', () => {
  const top = inv.find({}, { stock: 1, _id: 0 }).sort({ stock: -1 }).limit(3).toArray();
  assert.strictEqual(JSON.stringify(top.map((d) => d.stock)), '[293,292,291]');
  assert.strictEqual(inv.countDocuments(), 120);
  assert.strictEqual(inv.countDocuments({ store: 2 }), 30);
  assert.strictEqual(plain.countDocuments(), 2);
  assert.strictEqual(plain.findOne({ _id: 2 }).v, 'b');
});

check('aggregate with $group', () => {
  const out = inv.aggregate([{ $group: { _id: '$store', total: { $sum: '$stock' }, n: { $sum: 1 } } }, { $sort: { _id: 1 } }]).toArray();
  assert.strictEqual(out.length, 4);
  // sum over p of (10p + s) = 10 * 435 + 30 s
  out.forEach((g) => {
    assert.strictEqual(g.n, 30);
    assert.strictEqual(g.total, 4350 + 30 * g._id);
  });
});

check('paging through a large result with getMore', () => {
  const all = inv.find().batchSize(7).toArray();
  assert.strictEqual(all.length, 120);
  const ids = new Set(all.map((d) => `${d._id.productId}/${d._id.storeId}`));
  assert.strictEqual(ids.size, 120);
});

check('updates and deletes', () => {
  const r = inv.updateMany({ store: 3 }, { $set: { flagged: true } });
  assert.strictEqual(r.matchedCount, 30);
  assert.strictEqual(r.modifiedCount, 30);
  const one = inv.updateOne({ _id: { productId: 5, storeId: 1 } }, { $set: { stock: -1 } });
  assert.strictEqual(one.modifiedCount, 1);
  assert.strictEqual(inv.findOne({ _id: { productId: 5, storeId: 1 } }).stock, -1);
  assert.strictEqual(inv.deleteOne({ _id: { productId: 6, storeId: 0 } }).deletedCount, 1);
  assert.strictEqual(inv.countDocuments(), 119);
});

check('indexes', () => {
  assert.strictEqual(inv.createIndex({ store: 1 }), 'store_1');
  const names = inv.getIndexes().map((i) => i.name);
  assert.ok(names.includes('store_1'), names.join(','));
  assert.ok(names.includes('_id_'));
});

check('explain names the shard that owns a key', () => {
  const key = { productId: 7, storeId: 2 };
  const plan = inv.find({ _id: key }).explain().queryPlanner.winningPlan;
  assert.strictEqual(plan.stage, 'SINGLE_SHARD');
  assert.strictEqual(plan.shards.length, 1);
  const hash = convertShardKeyToHashed(key);
  const config = db.getSiblingDB('config');
  const coll = config.collections.findOne({ _id: 'demo.session_inventory' });
  const owner = config.chunks.findOne({ uuid: coll.uuid, min: { $lte: { _id: hash } }, max: { $gt: { _id: hash } } });
  assert.ok(owner, 'a chunk owns the hash');
  assert.strictEqual(plan.shards[0].shardName, owner.shard);
});

check('db.stats and listDatabases', () => {
  const stats = demo.stats();
  assert.ok(Number(stats.objects) >= 121);
  assert.ok(stats.raw, 'per-shard statistics under raw');
  const dbs = db.adminCommand({ listDatabases: 1 }).databases.map((d) => d.name);
  assert.ok(dbs.includes('demo'), dbs.join(','));
  assert.ok(demo.getCollectionNames().includes('session_plain'));
});

check('drop a sharded collection', () => {
  assert.strictEqual(inv.drop(), true);
  assert.strictEqual(db.getSiblingDB('config').collections.countDocuments({ _id: 'demo.session_inventory' }), 0);
  assert.strictEqual(inv.countDocuments(), 0);
});

print(`mongosh session: ${passed} passed, 0 failed`);
