// Failover under a continuous Node.js driver workload: `sluice demo`'s shards are three-member
// replica sets, and their primaries are stepped down one after the other while one client
// writes through the router: single inserts, `$inc` on a counter, and ordered bulks of ten
// documents, both through the proven rewrite (one child batch per shard) and through mongos's
// rounds (the "off" policy).
//
// With retryable writes on, the client sees no error, every acknowledged document is present
// exactly once and every acknowledged `$inc` is applied exactly once. With them off, a write in
// flight at a step-down may fail, as through mongos, with a not-primary or step-down error;
// what was acknowledged is still there exactly once.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { MongoClient, MongoError } = require('mongodb');
const { startSluice } = require('./sluice');

const STEP_DOWNS = 8;
const BULK = 10;
// NotWritablePrimary, InterruptedDueToReplStateChange, PrimarySteppedDown,
// NotPrimaryNoSecondaryOk, HostUnreachable, NetworkTimeout: what mongos passes on.
const STEP_DOWN_CODES = new Set([10107, 11602, 189, 13435, 6, 89]);

let sluice;
before(async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-node-failover-'));
  const config = path.join(dir, 'policies.toml');
  fs.writeFileSync(config, '[ordered_rewrite_overrides]\n'
    + '"failover_on.rounds" = "off"\n"failover_off.rounds" = "off"\n');
  sluice = await startSluice(['demo', '--config', config]);
});
after(async () => {
  await sluice.stop();
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Direct clients of every member of every shard, by shard name.
async function members(client) {
  const { shards } = await client.db('admin').command({ listShards: 1 });
  const sets = {};
  for (const s of shards) {
    const hosts = s.host.includes('/') ? s.host.split('/')[1] : s.host;
    sets[s._id] = hosts.split(',').map((h) => new MongoClient(`mongodb://${h}/?directConnection=true`, {
      serverSelectionTimeoutMS: 5000,
    }));
  }
  return sets;
}

// Steps down the set's current primary (frozen for a second); false when none is primary.
async function stepDown(memberClients) {
  for (const m of memberClients) {
    const hello = await m.db('admin').command({ hello: 1 });
    if (hello.isWritablePrimary) {
      try {
        await m.db('admin').command({ replSetStepDown: 1 });
      } catch (e) {
        // A step-down may close the connection that asked for it.
      }
      return true;
    }
  }
  return false;
}

// The error code a failed write reports: the command's, or its first write error's.
function codeOf(err) {
  if (err.writeErrors && err.writeErrors.length) {
    return err.writeErrors[0].code ?? err.writeErrors[0].err?.code;
  }
  if (err.writeConcernError) return err.writeConcernError.code;
  return err.code;
}

async function runWorkload(retryWrites) {
  const client = new MongoClient(sluice.uri, { retryWrites, serverSelectionTimeoutMS: 10000 });
  await client.connect();
  const db = client.db(retryWrites ? 'failover_on' : 'failover_off');
  for (const c of ['c', 'rewrite', 'rounds']) {
    await client.db('admin').command({ shardCollection: `${db.databaseName}.${c}`, key: { _id: 'hashed' } });
  }
  await db.collection('counter').insertOne({ _id: 'n', n: 0 });
  const acked = { c: [], rewrite: [], rounds: [] };
  const failed = { c: [], rewrite: [], rounds: [] };
  const errors = [];
  let incs = 0;
  let stop = false;

  const writer = (async () => {
    for (let i = 0; !stop; i += 1) {
      try {
        await db.collection('c').insertOne({ _id: i });
        acked.c.push(i);
      } catch (e) {
        failed.c.push(i);
        errors.push(e);
      }
      try {
        await db.collection('counter').updateOne({ _id: 'n' }, { $inc: { n: 1 } });
        incs += 1;
      } catch (e) {
        errors.push(e);
      }
      if (i % 4 === 0) {
        const coll = (i / 4) % 2 === 0 ? 'rewrite' : 'rounds';
        const ids = Array.from({ length: BULK }, (_, k) => i * BULK + k);
        try {
          await db.collection(coll).insertMany(ids.map((_id) => ({ _id })), { ordered: true });
          acked[coll].push(...ids);
        } catch (e) {
          // An ordered bulk that fails reports how many of its statements were applied: the
          // ones before the first error.
          const n = e.result?.insertedCount ?? e.insertedCount ?? 0;
          acked[coll].push(...ids.slice(0, n));
          failed[coll].push(...ids.slice(n));
          errors.push(e);
        }
      }
    }
  })();

  const sets = await members(client);
  const names = Object.keys(sets).sort();
  let stepped = 0;
  try {
    for (let k = 0; k < STEP_DOWNS; k += 1) {
      await sleep(600);
      if (await stepDown(sets[names[k % names.length]])) stepped += 1;
    }
    await sleep(600);
  } finally {
    stop = true;
    await writer;
    for (const ms of Object.values(sets)) {
      for (const m of ms) await m.close();
    }
  }
  assert.ok(stepped >= STEP_DOWNS - 1, `only ${stepped} step-downs found a primary`);
  assert.ok(acked.c.length > 20, `the workload ran: ${acked.c.length} inserts acknowledged`);
  assert.ok(acked.rewrite.length + acked.rounds.length > 20, 'the bulks ran');
  for (const coll of Object.keys(acked)) {
    const ids = (await db.collection(coll).find({}, { projection: { _id: 1 } }).toArray()).map((d) => d._id);
    assert.strictEqual(ids.length, new Set(ids).size, `${coll}: no document twice`);
    const present = new Set(ids);
    for (const id of acked[coll]) assert.ok(present.has(id), `${coll}: acknowledged ${id} is present`);
    // A failed write may or may not have been applied (the shard may have applied it and then
    // stepped down before its reply); nothing else is there.
    const possible = new Set([...acked[coll], ...failed[coll]]);
    for (const id of ids) assert.ok(possible.has(id), `${coll}: ${id} was written by the workload`);
  }
  const counter = (await db.collection('counter').findOne({ _id: 'n' })).n;
  await db.dropDatabase();
  await client.close();
  return { incs, counter, errors };
}

test('retryable writes see no error and apply once through step-downs', async () => {
  const { incs, counter, errors } = await runWorkload(true);
  assert.deepStrictEqual(errors.map(String), [], 'no client-visible error with retryable writes');
  assert.strictEqual(counter, incs, 'every acknowledged $inc applied exactly once');
});

test('without retryable writes a write in flight fails as through mongos', async () => {
  const { incs, counter, errors } = await runWorkload(false);
  for (const e of errors) {
    assert.ok(e instanceof MongoError, String(e));
    assert.ok(STEP_DOWN_CODES.has(codeOf(e)), `a step-down error, not ${e} (code ${codeOf(e)})`);
  }
  // Acknowledged increments are all applied; a failed one may have been applied before the
  // step-down refused its reply.
  assert.ok(incs <= counter && counter <= incs + errors.length, `${incs} <= ${counter} <= ${incs} + ${errors.length}`);
});
