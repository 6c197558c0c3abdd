// mongoose with its default options through `sluice demo`, from a fresh start, as an
// application runs it: models on a sharded collection (demo.orders, hashed on customerId) and
// an unsharded one, `Model.init()` (autoCreate sends `create` for a collection that exists,
// answered 48 NamespaceExists as mongos answers it, which mongoose ignores; autoIndex),
// timestamps, insertMany, populate, updateMany, findOneAndUpdate, aggregate and bulkWrite.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert');
const mongoose = require('mongoose');
const { startSluice } = require('./sluice');

let sluice;
before(async () => { sluice = await startSluice(['demo']); });
after(async () => {
  await mongoose.disconnect();
  await sluice.stop();
});

test('a mongoose app starts and runs on a sharded collection', async () => {
  await mongoose.connect(`${sluice.uri}demo`, { serverSelectionTimeoutMS: 5000 });
  const Customer = mongoose.model('Customer', new mongoose.Schema({
    name: { type: String, required: true, index: true },
  }, { timestamps: true }));
  const Order = mongoose.model('Order', new mongoose.Schema({
    customerId: { type: mongoose.Schema.Types.ObjectId, ref: 'Customer', index: true },
    total: Number,
    status: { type: String, default: 'new' },
  }, { timestamps: true, collection: 'orders' }));
  // What mongoose runs at start-up: create (the sharded collection already exists) and the
  // schema's indexes.
  await Customer.init();
  await Order.init();
  const indexes = await Order.collection.indexes();
  assert.ok(indexes.some((i) => i.key.customerId === 1), JSON.stringify(indexes));

  const customers = await Customer.insertMany([{ name: 'ada' }, { name: 'bob' }, { name: 'cy' }]);
  assert.ok(customers[0].createdAt instanceof Date);
  const orders = [];
  for (let i = 0; i < 30; i += 1) {
    orders.push({ customerId: customers[i % 3]._id, total: i });
  }
  await Order.insertMany(orders);

  const populated = await Order.find({ total: { $lt: 3 } }).sort({ total: 1 }).populate('customerId');
  assert.deepStrictEqual(populated.map((o) => o.customerId.name), ['ada', 'bob', 'cy']);

  const upd = await Order.updateMany({ total: { $gte: 20 } }, { $set: { status: 'big' } });
  assert.strictEqual(upd.modifiedCount, 10);

  const one = await Order.findOneAndUpdate(
    { customerId: customers[1]._id, total: 1 },
    { $inc: { total: 100 } },
    { new: true },
  );
  assert.strictEqual(one.total, 101);

  const sums = await Order.aggregate([
    { $group: { _id: '$customerId', n: { $sum: 1 } } },
    { $sort: { n: -1 } },
  ]);
  assert.strictEqual(sums.length, 3);
  assert.ok(sums.every((s) => s.n === 10));

  const bulk = await Order.bulkWrite([
    { insertOne: { document: { customerId: customers[0]._id, total: 500 } } },
    { updateOne: { filter: { customerId: customers[0]._id, total: 500 }, update: { $set: { status: 'bulk' } } } },
    { deleteMany: { filter: { total: { $lt: 5 } } } },
  ]);
  assert.strictEqual(bulk.insertedCount, 1);
  assert.strictEqual(bulk.modifiedCount, 1);
  assert.strictEqual(bulk.deletedCount, 4);
  assert.strictEqual(await Order.countDocuments(), 27);
});
