// mongosh against `sluice demo` (3 embedded shards): sh.status(), convertShardKeyToHashed and
// reads of the config database. Expected values come from MongoDB's own hash vectors and
// split-point formula, not from Sluice.
const assert = require('assert');
let passed = 0;
// Values built by the shell come from another realm: compare their JSON.
function same(actual, expected, msg) {
  assert.strictEqual(JSON.stringify(actual), JSON.stringify(expected), msg);
}
// mongosh throws on {ok: 0}: return the error a command fails with.
function failure(cmd) {
  try {
    db.adminCommand(cmd);
  } catch (e) {
    return e;
  }
  throw new Error(`expected ${EJSON.stringify(cmd)} to fail`);
}
function check(name, fn) {
  fn();
  passed += 1;
  print(`ok - ${name}`);
}

check('sh.status() shows the demo collections as MongoDB lays them out', () => {
  const st = sh.status().value;
  assert.strictEqual(st.shards.length, 3);
  same(st.shards.map((s) => s._id), ['shard0', 'shard1', 'shard2']);
  const demo = st.databases.find((d) => d.database._id === 'demo');
  assert.ok(demo, 'the demo database is listed');
  const inv = demo.collections['demo.store_inventory'];
  assert.strictEqual(JSON.stringify(inv.shardKey), JSON.stringify({ _id: 'hashed' }));
  assert.strictEqual(inv.unique, false);
  same(inv.chunkMetadata.map((c) => [c.shard, c.nChunks]), [['shard0', 2], ['shard1', 2], ['shard2', 2]]);
  assert.strictEqual(inv.chunks.length, 6);
  const bounds = inv.chunks.slice(1).map((c) => c.min._id.toString());
  same(bounds, ['-6148914691236517204', '-3074457345618258602', '0', '3074457345618258602', '6148914691236517204']);
  same(inv.chunks.map((c) => c['on shard']), ['shard0', 'shard0', 'shard1', 'shard1', 'shard2', 'shard2']);
});

check('convertShardKeyToHashed matches MongoDB vectors', () => {
  const cases = [
    [42, '-944302157085130861'],
    [NumberLong('42'), '-944302157085130861'],
    [42.123, '-944302157085130861'],
    [0, '4854801880128277513'],
    [-1, '1140205862565771219'],
    ['abc', '8478485326885698097'],
    ['', '2049396243249673340'],
    [null, '2338878944348059895'],
    [{ a: 'abc', b: NumberLong('123') }, '4771603801758380216'],
    [{}, '7980500913326740417'],
    [['bar', 'baz', 'qux'], '-2938911267422831539'],
    [MinKey(), '7961148599568647290'],
    [MaxKey(), '5504842513779440750'],
    [Timestamp({ t: 0, i: 0 }), '-7867208682377458672'],
  ];
  for (const [value, expected] of cases) {
    assert.strictEqual(convertShardKeyToHashed(value).toString(), expected, `hash of ${EJSON.stringify(value)}`);
  }
});

check('config.chunks and config.collections can be read', () => {
  const config = db.getSiblingDB('config');
  const coll = config.collections.findOne({ _id: 'demo.store_inventory' });
  assert.ok(coll && coll.uuid, 'collection entry with a uuid');
  assert.strictEqual(JSON.stringify(coll.key), JSON.stringify({ _id: 'hashed' }));
  const chunks = config.chunks.find({ uuid: coll.uuid }).sort({ min: 1 }).toArray();
  assert.strictEqual(chunks.length, 6);
  for (let i = 1; i < chunks.length; i++) {
    assert.strictEqual(EJSON.stringify(chunks[i].min), EJSON.stringify(chunks[i - 1].max), 'chunks are contiguous');
  }
  assert.strictEqual(config.chunks.countDocuments({ uuid: coll.uuid, shard: 'shard1' }), 2);
  assert.strictEqual(config.databases.findOne({ _id: 'demo' }).primary, 'shard0');
});

check('sh.shardCollection pre-splits a new collection', () => {
  const res = sh.shardCollection('demo.mongosh_routing', { k: 'hashed' });
  assert.strictEqual(res.collectionsharded, 'demo.mongosh_routing');
  const config = db.getSiblingDB('config');
  const coll = config.collections.findOne({ _id: 'demo.mongosh_routing' });
  assert.strictEqual(config.chunks.countDocuments({ uuid: coll.uuid }), 6);
  const again = db.adminCommand({ shardCollection: 'demo.mongosh_routing', key: { k: 'hashed' } });
  assert.strictEqual(again.ok, 1, 'same key again is accepted');
  const conflicting = failure({ shardCollection: 'demo.mongosh_routing', key: { other: 1 } });
  assert.strictEqual(conflicting.code, 23);
});

check('bad shard keys are refused with clear errors', () => {
  const two = failure({ shardCollection: 'demo.bad1', key: { a: 'hashed', b: 'hashed' } });
  assert.match(two.message, /more than one hashed field/);
  const unique = failure({ shardCollection: 'demo.bad2', key: { a: 'hashed' }, unique: true });
  assert.strictEqual(unique.code, 72);
  const pattern = failure({ shardCollection: 'demo.bad3', key: { a: 'text' } });
  assert.strictEqual(pattern.code, 2);
  const ns = failure({ shardCollection: 'nodot', key: { a: 1 } });
  assert.strictEqual(ns.code, 73);
  const config = failure({ shardCollection: 'config.x', key: { a: 1 } });
  assert.strictEqual(config.code, 20);
});

check('listShards and flushRouterConfig', () => {
  assert.strictEqual(db.adminCommand({ listShards: 1 }).shards.length, 3);
  assert.strictEqual(db.adminCommand({ flushRouterConfig: 1 }).ok, 1);
  assert.strictEqual(db.adminCommand({ enableSharding: 'other_db' }).ok, 1);
  assert.ok(db.getSiblingDB('config').databases.findOne({ _id: 'other_db' }));
});

print(`mongosh routing: ${passed} passed, 0 failed`);
