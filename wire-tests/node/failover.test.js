// Failover under a continuous Node.js driver workload: `sluice demo`'s shards are three-member
// replica sets. One client writes through the router: single inserts, `$inc` on a counter, and
// ordered bulks of ten documents, both through the proven rewrite (one child batch per shard)
// and through mongos's rounds (the "off" policy).
//
// Meanwhile either the sets' primaries are stepped down one after the other, or members are
// killed: `{shutdown: 1, force: true}` sent by the driver straight to a member's port stops it
// for good, first the primary of each set, then a secondary of each. A test that kills runs its
// own `sluice demo`.
//
// With retryable writes on, the client sees no error, every acknowledged document is present
// exactly once and every acknowledged `$inc` is applied exactly once. With them off, a write in
// flight at a step-down or a kill may fail, as through mongos, with a not-primary, step-down,
// shutdown or network error; what was acknowledged is still there exactly once. The kill tests
// print, per primary killed, the client-visible errors and the time from the kill to the first
// insert acknowledged by that set's new primary.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { MongoClient, MongoError, MongoNetworkError } = require('mongodb');
const { startSluice, canConnect } = require('./sluice');

const STEP_DOWNS = 8;
const BULK = 10;
// NotWritablePrimary, InterruptedDueToReplStateChange, PrimarySteppedDown,
// NotPrimaryNoSecondaryOk, HostUnreachable, NetworkTimeout: what mongos passes on.
const STEP_DOWN_CODES = new Set([10107, 11602, 189, 13435, 6, 89]);
// A killed member adds its own: ShutdownInProgress and InterruptedAtShutdown from a member that
// is stopping, and the network errors of its closed connections (already above).
const KILL_CODES = new Set([...STEP_DOWN_CODES, 91, 11600]);
// How long a member takes to be gone, or a set to elect, before the test gives up.
const WAIT_MS = 10000;
// Before it is killed, a primary takes this long over each data command (`sluiceSetLatency`),
// so that the kill nearly always finds a write of the workload in flight on it: the write the
// router must resend, or (retryable writes off) the one the client sees fail.
const KILL_LATENCY_MICROS = 200000;

// `sluice demo` whose `rounds` collections take mongos's rounds for ordered bulks; `args` are
// more command-line arguments.
async function startDemo(...args) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-node-failover-'));
  const config = path.join(dir, 'policies.toml');
  fs.writeFileSync(config, '[ordered_rewrite_overrides]\n'
    + '"failover_on.rounds" = "off"\n"failover_off.rounds" = "off"\n');
  return startSluice(['demo', '--config', config, ...args]);
}

let sluice;
before(async () => {
  sluice = await startDemo();
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

// The member that says it is the set's writable primary, waiting up to WAIT_MS for one.
async function waitForPrimary(memberClients) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    for (const m of memberClients) {
      try {
        if ((await m.db('admin').command({ hello: 1 })).isWritablePrimary) return m;
      } catch (e) {
        // A member being stopped.
      }
    }
    assert.ok(Date.now() < deadline, 'the set elected no primary');
    await sleep(20);
  }
}

// Shuts down the set's primary (or, with `primary` false, a secondary) with `shutdown` and
// `force` on the member's own port, and returns the time it was sent. A primary is slowed down
// first (KILL_LATENCY_MICROS) for a moment, so that writes are in flight on it. The member
// closes the connection without a reply; it is taken out of `memberClients`, and this returns
// once its port refuses connections and another member is primary, with no latency.
async function kill(memberClients, primary) {
  const p = await waitForPrimary(memberClients);
  const victim = primary ? p : memberClients.find((m) => m !== p);
  if (primary) {
    await victim.db('admin').command({ sluiceSetLatency: 1, perCommandMicros: KILL_LATENCY_MICROS });
    await sleep(300);
  }
  const { host, port } = victim.options.hosts[0];
  const sent = Date.now();
  await assert.rejects(
    victim.db('admin').command({ shutdown: 1, force: true }),
    MongoNetworkError,
    'the member closes the connection without a reply',
  );
  memberClients.splice(memberClients.indexOf(victim), 1);
  await victim.close();
  const deadline = Date.now() + WAIT_MS;
  while (await canConnect(port, host)) {
    assert.ok(Date.now() < deadline, `${host}:${port} still accepts connections`);
    await sleep(20);
  }
  await waitForPrimary(memberClients);
  for (const m of memberClients) {
    await m.db('admin').command({ sluiceSetLatency: 1, perCommandMicros: 0 });
  }
  return sent;
}

// The error code a failed write reports: the command's, or its first write error's.
function codeOf(err) {
  if (err.writeErrors && err.writeErrors.length) {
    return err.writeErrors[0].code ?? err.writeErrors[0].err?.code;
  }
  if (err.writeConcernError) return err.writeConcernError.code;
  return err.code;
}

// Runs the workload while `disrupt(sets)` steps down or kills members (sets: shard name ->
// direct member clients), and checks that every acknowledged document is there exactly once.
// Returns the tally: acknowledged `$inc`s, the counter, the errors (with the time the client
// saw them), the acknowledged inserts ({ id, sent, acked }), the shard holding each, and what
// `disrupt` returned.
async function runWorkload(uri, retryWrites, disrupt) {
  const client = new MongoClient(uri, { retryWrites, serverSelectionTimeoutMS: 10000 });
  await client.connect();
  // Every client is closed whatever fails: one left open keeps the test process alive.
  let sets = {};
  try {
    const db = client.db(retryWrites ? 'failover_on' : 'failover_off');
    for (const c of ['c', 'rewrite', 'rounds']) {
      await client.db('admin').command({ shardCollection: `${db.databaseName}.${c}`, key: { _id: 'hashed' } });
    }
    await db.collection('counter').insertOne({ _id: 'n', n: 0 });
    const acked = { c: [], rewrite: [], rounds: [] };
    const failed = { c: [], rewrite: [], rounds: [] };
    const inserts = [];
    const errors = [];
    let incs = 0;
    let stop = false;

    const writer = (async () => {
      for (let i = 0; !stop; i += 1) {
        const sent = Date.now();
        try {
          await db.collection('c').insertOne({ _id: i });
          acked.c.push(i);
          inserts.push({ id: i, sent, acked: Date.now() });
        } catch (e) {
          failed.c.push(i);
          errors.push({ at: Date.now(), e });
        }
        try {
          await db.collection('counter').updateOne({ _id: 'n' }, { $inc: { n: 1 } });
          incs += 1;
        } catch (e) {
          errors.push({ at: Date.now(), e });
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
            errors.push({ at: Date.now(), e });
          }
        }
      }
    })();

    sets = await members(client);
    let disrupted;
    try {
      disrupted = await disrupt(sets);
      await sleep(600);
    } finally {
      stop = true;
      await writer;
    }
    // Which set holds each insert, read from each set's primary.
    const shardOf = new Map();
    for (const [name, ms] of Object.entries(sets)) {
      const p = await waitForPrimary(ms);
      for (const d of await p.db(db.databaseName).collection('c').find({}, { projection: { _id: 1 } }).toArray()) {
        shardOf.set(d._id, name);
      }
    }
    assert.ok(acked.c.length > 20, `the workload ran: ${acked.c.length} inserts acknowledged`);
    assert.ok(acked.rewrite.length + acked.rounds.length > 20, 'the bulks ran');
    for (const coll of Object.keys(acked)) {
      const ids = (await db.collection(coll).find({}, { projection: { _id: 1 } }).toArray()).map((d) => d._id);
      assert.strictEqual(ids.length, new Set(ids).size, `${coll}: no document twice`);
      const present = new Set(ids);
      for (const id of acked[coll]) assert.ok(present.has(id), `${coll}: acknowledged ${id} is present`);
      // A failed write may or may not have been applied (the shard may have applied it and then
      // stepped down or stopped before its reply); nothing else is there.
      const possible = new Set([...acked[coll], ...failed[coll]]);
      for (const id of ids) assert.ok(possible.has(id), `${coll}: ${id} was written by the workload`);
    }
    const counter = (await db.collection('counter').findOne({ _id: 'n' })).n;
    await db.dropDatabase();
    return { incs, counter, errors, inserts, shardOf, disrupted };
  } finally {
    for (const ms of Object.values(sets)) {
      for (const m of ms) await m.close();
    }
    await client.close();
  }
}

async function stepDowns(sets) {
  const names = Object.keys(sets).sort();
  let stepped = 0;
  for (let k = 0; k < STEP_DOWNS; k += 1) {
    await sleep(600);
    if (await stepDown(sets[names[k % names.length]])) stepped += 1;
  }
  assert.ok(stepped >= STEP_DOWNS - 1, `only ${stepped} step-downs found a primary`);
}

// Kills the primary of each set, then a secondary of each; returns every kill as
// { sent, shard, primary }.
async function kills(sets) {
  const killed = [];
  for (const primary of [true, false]) {
    for (const shard of Object.keys(sets).sort()) {
      await sleep(600);
      killed.push({ sent: await kill(sets[shard], primary), shard, primary });
    }
  }
  return killed;
}

// Per kill, the client-visible errors seen from it to the next kill; per primary
// kill, the milliseconds from it to the first insert sent after it that the killed set's new
// primary acknowledged; printed.
function reportKills(retryWrites, tally) {
  const errors = { primary: [], secondary: [] };
  const recovery = [];
  tally.disrupted.forEach(({ sent: t0, shard, primary }, k) => {
    const end = tally.disrupted[k + 1]?.sent ?? Infinity;
    errors[primary ? 'primary' : 'secondary'].push(tally.errors.filter(({ at }) => at >= t0 && at < end).length);
    if (!primary) return;
    const first = Math.min(...tally.inserts
      .filter(({ id, sent }) => sent >= t0 && tally.shardOf.get(id) === shard)
      .map(({ acked }) => acked));
    assert.ok(Number.isFinite(first), `an insert reached ${shard} after its primary was killed`);
    recovery.push(first - t0);
  });
  const sorted = [...recovery].sort((a, b) => a - b);
  console.log(`node driver, members killed with retryable writes ${retryWrites ? 'on' : 'off'}: `
    + `client-visible errors per primary kill [${errors.primary}], per secondary kill `
    + `[${errors.secondary}]; primary kill -> first insert acknowledged by the new primary: `
    + `median ${sorted[Math.floor(sorted.length / 2)]} ms, worst ${sorted[sorted.length - 1]} ms; `
    + `${tally.inserts.length} inserts and ${tally.incs} $inc acknowledged; error codes `
    + `[${tally.errors.map(({ e }) => codeOf(e))}]`);
}

function assertRetried({ incs, counter, errors }) {
  assert.deepStrictEqual(errors.map(({ e }) => String(e)), [], 'no client-visible error with retryable writes');
  assert.strictEqual(counter, incs, 'every acknowledged $inc applied exactly once');
}

function assertFailedAsThroughMongos({ incs, counter, errors }, codes) {
  for (const { e } of errors) {
    assert.ok(e instanceof MongoError, String(e));
    assert.ok(codes.has(codeOf(e)), `a mongos error for a primary that went away, not ${e} (code ${codeOf(e)})`);
    // mongos labels no error of a write without `txnNumber` for a retry.
    assert.ok(!e.hasErrorLabel('RetryableWriteError'), `no RetryableWriteError label on ${e}`);
  }
  // Acknowledged increments are all applied; a failed one may have been applied before the
  // step-down or the kill lost its reply.
  assert.ok(incs <= counter && counter <= incs + errors.length, `${incs} <= ${counter} <= ${incs} + ${errors.length}`);
}

test('retryable writes see no error and apply once through step-downs', async () => {
  assertRetried(await runWorkload(sluice.uri, true, stepDowns));
});

test('without retryable writes a write in flight fails as through mongos', async () => {
  assertFailedAsThroughMongos(await runWorkload(sluice.uri, false, stepDowns), STEP_DOWN_CODES);
});

// Each kill test starts a demo of its own (a killed member does not come back), accepting
// `sluiceSetLatency`.
async function withOwnDemo(run) {
  const own = await startDemo('--enable-test-commands');
  try {
    await run(own.uri);
  } finally {
    await own.stop();
  }
}

test('retryable writes see no error and apply once through member kills', () => withOwnDemo(async (uri) => {
  const tally = await runWorkload(uri, true, kills);
  reportKills(true, tally);
  assertRetried(tally);
}));

test('without retryable writes a killed primary fails as through mongos', () => withOwnDemo(async (uri) => {
  const tally = await runWorkload(uri, false, kills);
  reportKills(false, tally);
  assertFailedAsThroughMongos(tally, KILL_CODES);
  // Three kills with writes slowed down on the victim: the client saw at least one cut off.
  assert.ok(tally.errors.length > 0, 'a kill cut a write off');
}));
