"""Failover under a continuous pymongo workload: `sluice demo`'s shards are three-member replica
sets; their primaries are stepped down one after the other while one client inserts documents
and increments a counter through the router, one write at a time.

With retryable writes on, the client sees no error, every acknowledged insert is present exactly
once and every acknowledged `$inc` is applied exactly once (the counter equals the number of
increments acknowledged). With them off, the write in flight at a step-down may fail, as through
mongos, with a not-primary or step-down error; what was acknowledged is still there exactly
once."""

import itertools
import os
import threading
import time

import pymongo
import pytest
from pymongo.errors import PyMongoError

from conftest import Process, free_port

STEP_DOWNS = 8
# Codes a write in flight at a step-down fails with when it is not retried (mongos passes the
# shard's error on): NotWritablePrimary, InterruptedDueToReplStateChange, PrimarySteppedDown,
# NotPrimaryNoSecondaryOk, HostUnreachable, NetworkTimeout.
STEP_DOWN_CODES = {10107, 11602, 189, 13435, 6, 89}


@pytest.fixture(scope="module")
def cluster():
    port = free_port()
    p = Process(["demo", "--port", str(port)], port)
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


def run_workload(cluster, retry_writes):
    client = cluster.client(retryWrites=retry_writes, serverSelectionTimeoutMS=10000)
    db = client[f"failover_{'on' if retry_writes else 'off'}_{os.getpid()}"]
    client.admin.command("shardCollection", f"{db.name}.c", key={"_id": "hashed"})
    db.counter.insert_one({"_id": "n", "n": 0})
    acked, failed, incs, errors = [], [], 0, []
    stop = threading.Event()

    def writer():
        nonlocal incs
        for i in itertools.count():
            if stop.is_set():
                return
            try:
                db.c.insert_one({"_id": i})
                acked.append(i)
            except PyMongoError as e:
                failed.append(i)
                errors.append(e)
            try:
                db.counter.update_one({"_id": "n"}, {"$inc": {"n": 1}})
                incs += 1
            except PyMongoError as e:
                errors.append(e)

    sets = members(client)
    t = threading.Thread(target=writer)
    t.start()
    stepped = 0
    try:
        for k in range(STEP_DOWNS):
            time.sleep(0.6)
            shard = sorted(sets)[k % len(sets)]
            stepped += step_down(sets[shard])
        time.sleep(0.6)
    finally:
        stop.set()
        t.join(timeout=60)
        for ms in sets.values():
            for m in ms:
                m.close()
    assert not t.is_alive(), "the writer finished"
    assert stepped >= STEP_DOWNS - 1, f"only {stepped} step-downs found a primary"
    assert len(acked) > 20, f"the workload ran: {len(acked)} inserts acknowledged"
    ids = [d["_id"] for d in db.c.find({}, {"_id": 1})]
    assert len(ids) == len(set(ids))
    present = set(ids)
    assert all(i in present for i in acked), "every acknowledged insert is present"
    # A failed insert may or may not have been applied (the shard may have applied it and then
    # stepped down); nothing else is there.
    assert present <= set(acked) | set(failed)
    counter = db.counter.find_one({"_id": "n"})["n"]
    result = (len(acked), incs, counter, errors)
    client.drop_database(db.name)
    client.close()
    return result


def test_retryable_writes_see_no_error_and_apply_once_through_step_downs(cluster):
    acked, incs, counter, errors = run_workload(cluster, retry_writes=True)
    assert errors == [], f"no client-visible error with retryable writes: {errors[:3]}"
    assert counter == incs, f"every acknowledged $inc applied exactly once: {counter} != {incs}"


def test_without_retryable_writes_a_write_in_flight_fails_as_through_mongos(cluster):
    acked, incs, counter, errors = run_workload(cluster, retry_writes=False)
    for e in errors:
        code = getattr(e, "code", None)
        details = getattr(e, "details", None) or {}
        if code is None and details.get("writeErrors"):
            code = details["writeErrors"][0].get("code")
        if code is None:
            code = details.get("code")
        assert code in STEP_DOWN_CODES, f"a step-down error, not {e!r}"
    # Acknowledged increments are all applied; a failed one may have been applied before the
    # step-down refused its reply.
    assert incs <= counter <= incs + len(errors)
