"""Failover under a continuous pymongo workload: `sluice demo`'s shards are three-member replica
sets. One client writes through the router, one write at a time: single inserts, `$inc` on a
counter, and ordered bulks of ten documents, both through the proven rewrite (one child batch
per shard) and through mongos's rounds (the "off" policy of the `rounds` collections).

Meanwhile either the sets' primaries are stepped down one after the other, or members are
killed: `{shutdown: 1, force: true}` sent by the driver straight to a member's port stops it
for good, first the primary of each set, then a secondary of each. A test that kills runs its
own `sluice demo`.

With retryable writes on, the client sees no error, every acknowledged document is present
exactly once and every acknowledged `$inc` is applied exactly once (the counter equals the
number of increments acknowledged). With them off, the write in flight at a step-down or a kill
may fail, as through mongos, with a not-primary, step-down, shutdown or network error; what was
acknowledged is still there exactly once.

The kill tests print, per primary killed, the client-visible errors and the time from the kill
to the first insert acknowledged by that set's new primary."""

import itertools
import socket
import statistics
import threading
import time

import pymongo
import pytest
from pymongo.errors import ConnectionFailure, PyMongoError

from conftest import start_demo

STEP_DOWNS = 8
BULK = 10
# Codes a write in flight at a step-down fails with when it is not retried (mongos passes the
# shard's error on): NotWritablePrimary, InterruptedDueToReplStateChange, PrimarySteppedDown,
# NotPrimaryNoSecondaryOk, HostUnreachable, NetworkTimeout.
STEP_DOWN_CODES = {10107, 11602, 189, 13435, 6, 89}
# A killed member adds its own: ShutdownInProgress and InterruptedAtShutdown from a member that
# is stopping, and the network errors of its closed connections (already above).
KILL_CODES = STEP_DOWN_CODES | {91, 11600}
# Ordered bulks into `rounds` go in mongos's rounds, into `rewrite` through the proven rewrite.
POLICIES = {"failover_on.rounds": "off", "failover_off.rounds": "off"}
# How long a member takes to be gone, or a set to elect, before the test gives up.
WAIT = 10
# Before it is killed, a primary takes this long over each data command (`sluiceSetLatency`),
# so that the kill nearly always finds a write of the workload in flight on it: the write the
# router must resend, or (retryable writes off) the one the client sees fail.
KILL_LATENCY_MICROS = 200_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    p = start_demo(tmp_path_factory.mktemp("failover"), POLICIES)
    yield p
    p.stop()


@pytest.fixture
def cluster_to_kill(tmp_path):
    """A demo of the test's own (a killed member does not come back), accepting
    `sluiceSetLatency`."""
    p = start_demo(tmp_path, POLICIES, "--enable-test-commands")
    yield p
    p.stop()


def members(client):
    """Direct clients of every member of every shard, by shard."""
    return {
        s["_id"]: [
            pymongo.MongoClient(f"mongodb://{h}/?directConnection=true", serverSelectionTimeoutMS=5000)
            for h in s["host"].split("/", 1)[-1].split(",")
        ]
        for s in client.admin.command("listShards")["shards"]
    }


def step_down(member_clients):
    """Steps down the set's current primary (frozen for a second); False when none is primary."""
    for m in member_clients:
        if m.admin.command("hello").get("isWritablePrimary"):
            try:
                m.admin.command("replSetStepDown", 1)
            except PyMongoError:
                pass
            return True
    return False


def primary_of(member_clients):
    """The member that says it is the set's writable primary, or None."""
    for m in member_clients:
        try:
            if m.admin.command("hello").get("isWritablePrimary"):
                return m
        except PyMongoError:
            pass
    return None


def wait_for_primary(member_clients):
    deadline = time.monotonic() + WAIT
    while (p := primary_of(member_clients)) is None:
        assert time.monotonic() < deadline, "the set elected no primary"
        time.sleep(0.02)
    return p


def kill(member_clients, primary):
    """Shuts down the set's primary (or, with `primary` False, a secondary) with `shutdown` and
    `force` on the member's own port, and returns the time it was sent. A primary is slowed
    down first (KILL_LATENCY_MICROS) for a moment, so that writes are in flight on it. The
    member closes the connection without a reply; it is taken out of `member_clients`, and this
    returns once its port refuses connections and another member is primary, with no latency."""
    victim = wait_for_primary(member_clients)
    if primary:
        victim.admin.command("sluiceSetLatency", 1, perCommandMicros=KILL_LATENCY_MICROS)
        time.sleep(0.3)
    else:
        victim = next(m for m in member_clients if m is not victim)
    host, port = victim.address
    sent = time.monotonic()
    with pytest.raises(ConnectionFailure):
        victim.admin.command("shutdown", 1, force=True)
    member_clients.remove(victim)
    victim.close()
    deadline = time.monotonic() + WAIT
    while True:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
        except OSError:
            break
        assert time.monotonic() < deadline, f"{host}:{port} still accepts connections"
        time.sleep(0.02)
    wait_for_primary(member_clients)
    for m in member_clients:
        m.admin.command("sluiceSetLatency", 1, perCommandMicros=0)
    return sent


def code_of(e):
    """The code a failed write reports: its first write error's (a bulk's BulkWriteError has
    code 65 of its own), its write-concern error's, or the command's."""
    details = getattr(e, "details", None) or {}
    if details.get("writeErrors"):
        return details["writeErrors"][0].get("code")
    if details.get("writeConcernError"):
        return details["writeConcernError"].get("code")
    code = getattr(e, "code", None)
    return details.get("code") if code is None else code


def run_workload(cluster, retry_writes, disrupt):
    """Runs the workload while `disrupt(sets)` steps down or kills members (sets: shard ->
    direct member clients), and checks that every acknowledged document is there exactly once.
    Returns the tally: acknowledged inserts and `$inc`s, the counter, the errors (with the time
    the client saw them), the inserts (id, sent, acknowledged at) and the shard holding each
    acknowledged insert, and what `disrupt` returned."""
    client = cluster.client(retryWrites=retry_writes, serverSelectionTimeoutMS=10000)
    db = client[f"failover_{'on' if retry_writes else 'off'}"]
    for c in ("c", "rewrite", "rounds"):
        client.admin.command("shardCollection", f"{db.name}.{c}", key={"_id": "hashed"})
    db.counter.insert_one({"_id": "n", "n": 0})
    acked = {"c": [], "rewrite": [], "rounds": []}
    failed = {"c": [], "rewrite": [], "rounds": []}
    inserts, errors = [], []
    incs = 0
    stop = threading.Event()

    def writer():
        nonlocal incs
        for i in itertools.count():
            if stop.is_set():
                return
            sent = time.monotonic()
            try:
                db.c.insert_one({"_id": i})
                acked["c"].append(i)
                inserts.append((i, sent, time.monotonic()))
            except PyMongoError as e:
                failed["c"].append(i)
                errors.append((time.monotonic(), e))
            try:
                db.counter.update_one({"_id": "n"}, {"$inc": {"n": 1}})
                incs += 1
            except PyMongoError as e:
                errors.append((time.monotonic(), e))
            if i % 4 == 0:
                coll = "rewrite" if (i // 4) % 2 == 0 else "rounds"
                ids = list(range(i * BULK, (i + 1) * BULK))
                try:
                    db[coll].insert_many([{"_id": k} for k in ids], ordered=True)
                    acked[coll] += ids
                except PyMongoError as e:
                    # An ordered bulk that fails reports how many of its statements were
                    # applied: the ones before the first error.
                    n = (getattr(e, "details", None) or {}).get("nInserted", 0)
                    acked[coll] += ids[:n]
                    failed[coll] += ids[n:]
                    errors.append((time.monotonic(), e))

    sets = members(client)
    t = threading.Thread(target=writer)
    t.start()
    try:
        disrupted = disrupt(sets)
        time.sleep(0.6)
    finally:
        stop.set()
        t.join(timeout=60)
    assert not t.is_alive(), "the writer finished"
    assert len(acked["c"]) > 20, f"the workload ran: {len(acked['c'])} inserts acknowledged"
    assert len(acked["rewrite"]) + len(acked["rounds"]) > 20, "the bulks ran"
    for coll, ids_acked in acked.items():
        ids = [d["_id"] for d in db[coll].find({}, {"_id": 1})]
        assert len(ids) == len(set(ids)), f"{coll}: no document twice"
        present = set(ids)
        missing = [i for i in ids_acked if i not in present]
        assert not missing, f"{coll}: acknowledged {missing[:5]} present"
        # A failed write may or may not have been applied (the shard may have applied it and
        # then stepped down or stopped before its reply); nothing else is there.
        assert present <= set(ids_acked) | set(failed[coll]), f"{coll}: only the workload's writes"
    shard_of = {}
    for name, ms in sets.items():
        for d in wait_for_primary(ms)[db.name].c.find({}, {"_id": 1}):
            shard_of[d["_id"]] = name
        for m in ms:
            m.close()
    counter = db.counter.find_one({"_id": "n"})["n"]
    client.drop_database(db.name)
    client.close()
    return {
        "inserts": inserts,
        "incs": incs,
        "counter": counter,
        "errors": errors,
        "shard_of": shard_of,
        "disrupted": disrupted,
    }


def step_downs(sets):
    stepped = 0
    for k in range(STEP_DOWNS):
        time.sleep(0.6)
        shard = sorted(sets)[k % len(sets)]
        stepped += step_down(sets[shard])
    assert stepped >= STEP_DOWNS - 1, f"only {stepped} step-downs found a primary"
    return stepped


def kills(sets):
    """Kills the primary of each set, then a secondary of each; returns every kill as (time
    sent, shard, whether it was the primary)."""
    killed = []
    for primary in (True, False):
        for shard in sorted(sets):
            time.sleep(0.6)
            killed.append((kill(sets[shard], primary), shard, primary))
    return killed


def kill_figures(tally):
    """Per kill, the client-visible errors seen from it to the next kill; per
    primary kill, the milliseconds from it to the first insert sent after it that the killed
    set's new primary acknowledged."""
    kills_ = tally["disrupted"]
    errors = {True: [], False: []}
    recovery = []
    for k, (t0, shard, primary) in enumerate(kills_):
        end = kills_[k + 1][0] if k + 1 < len(kills_) else float("inf")
        errors[primary].append(sum(1 for at, _ in tally["errors"] if t0 <= at < end))
        if not primary:
            continue
        first = min(
            (acked for i, sent, acked in tally["inserts"] if sent >= t0 and tally["shard_of"].get(i) == shard),
            default=None,
        )
        assert first is not None, f"an insert reached {shard} after its primary was killed"
        recovery.append((first - t0) * 1000)
    return errors, recovery


def report(capsys, retry_writes, tally):
    errors, recovery = kill_figures(tally)
    with capsys.disabled():
        print(
            f"\npymongo, members killed with retryable writes {'on' if retry_writes else 'off'}: "
            f"client-visible errors per primary kill {errors[True]}, per secondary kill "
            f"{errors[False]}; primary kill -> first insert acknowledged by the "
            f"new primary: median {statistics.median(recovery):.0f} ms, worst {max(recovery):.0f} ms; "
            f"{len(tally['inserts'])} inserts and {tally['incs']} $inc acknowledged; error codes "
            f"{[code_of(e) for _, e in tally['errors']]}"
        )


def assert_retried(tally):
    errors = [e for _, e in tally["errors"]]
    assert errors == [], f"no client-visible error with retryable writes: {errors[:3]}"
    assert tally["counter"] == tally["incs"], (
        f"every acknowledged $inc applied exactly once: {tally['counter']} != {tally['incs']}"
    )


def assert_failed_as_through_mongos(tally, codes):
    for _, e in tally["errors"]:
        assert code_of(e) in codes, f"a mongos error for a primary that went away, not {e!r}"
        # mongos labels no error of a write without `txnNumber` for a retry.
        labels = (getattr(e, "details", None) or {}).get("errorLabels", [])
        assert not e.has_error_label("RetryableWriteError") and "RetryableWriteError" not in labels, repr(e)
    # Acknowledged increments are all applied; a failed one may have been applied before the
    # step-down or the kill lost its reply.
    incs, counter = tally["incs"], tally["counter"]
    assert incs <= counter <= incs + len(tally["errors"]), f"{incs} <= {counter} <= {incs} + errors"


def test_retryable_writes_see_no_error_and_apply_once_through_step_downs(cluster):
    assert_retried(run_workload(cluster, True, step_downs))


def test_without_retryable_writes_a_write_in_flight_fails_as_through_mongos(cluster):
    assert_failed_as_through_mongos(run_workload(cluster, False, step_downs), STEP_DOWN_CODES)


def test_retryable_writes_see_no_error_and_apply_once_through_member_kills(cluster_to_kill, capsys):
    tally = run_workload(cluster_to_kill, True, kills)
    report(capsys, True, tally)
    assert_retried(tally)


def test_without_retryable_writes_a_killed_primary_fails_as_through_mongos(cluster_to_kill, capsys):
    tally = run_workload(cluster_to_kill, False, kills)
    report(capsys, False, tally)
    assert_failed_as_through_mongos(tally, KILL_CODES)
    # Three kills with writes slowed down on the victim: the client saw at least one cut off.
    assert tally["errors"], "a kill cut a write off"
