"""pymongo through `sluice demo`: the ordered-bulk rewrite, its fallbacks, and ordered error
semantics that look exactly like mongos's under every policy."""

import pytest
from pymongo import InsertOne, ReplaceOne, UpdateOne
from pymongo.errors import BulkWriteError


def plans(client):
    return client.admin.command("serverStatus")["sluice"]["writes"]["plans"]


@pytest.mark.parametrize("coll,expected_plan", [("p_off", "mongosRounds"), ("p_safe", "rewrite"), ("p_always", "rewrite")])
def test_duplicate_key_at_500_reports_like_mongos(demo, coll, expected_plan):
    client = demo.client()
    client.admin.command("shardCollection", f"demo.{coll}", key={"_id": "hashed"})
    c = client.demo[coll]
    c.insert_one({"_id": 500})
    before = plans(client)
    with pytest.raises(BulkWriteError) as err:
        c.insert_many([{"_id": i, "v": i} for i in range(1000)], ordered=True)
    d = err.value.details
    assert d["nInserted"] == 500
    assert len(d["writeErrors"]) == 1
    e = d["writeErrors"][0]
    assert e["index"] == 500
    assert e["code"] == 11000
    assert e["keyValue"] == {"_id": 500}
    after = plans(client)
    assert after[expected_plan] == before[expected_plan] + 1
    # The usual recovery (resend from the failed index, skipping the duplicate) completes the
    # collection under every policy. Under the rewrite some statements after 500 were applied
    # already: the resend finds them (duplicate keys) and the final state is the same.
    try:
        c.insert_many([{"_id": i, "v": i} for i in range(501, 1000)], ordered=False)
    except BulkWriteError as again:
        assert all(e["code"] == 11000 for e in again.details["writeErrors"])
        assert coll != "p_off", "mongos rounds applied nothing after the error"
    assert c.count_documents({}) == 1000
    assert c.count_documents({"v": {"$exists": True}}) == 999
    client.close()


def test_thousand_upserts_take_one_round(demo):
    client = demo.client()
    ops = [ReplaceOne({"_id": {"productId": i, "storeId": 7}}, {"stock": i}, upsert=True) for i in range(1000)]
    before = demo.shard_command_total("update")
    res = client.demo.store_inventory.bulk_write(ops, ordered=True)
    assert res.upserted_count == 1000
    assert demo.shard_command_total("update") - before == 3, "one child batch per shard"
    before = demo.shard_command_total("update")
    res = client.demo.store_inventory.bulk_write(ops, ordered=False)
    assert res.matched_count == 1000 and res.modified_count == 0
    assert demo.shard_command_total("update") - before == 3

    client.admin.command("shardCollection", "demo.p_off_upserts", key={"_id": "hashed"})
    before = demo.shard_command_total("update")
    client.demo.p_off.bulk_write(ops, ordered=True)
    rounds = demo.shard_command_total("update") - before
    assert 600 < rounds < 730, f"mongos rounds on 3 shards: ~667 expected, got {rounds}"
    assert client.demo.store_inventory.count_documents({"_id.storeId": 7}) == 1000
    client.close()


def test_unprovable_bulks_fall_back(demo):
    client = demo.client()
    c = client.demo.store_inventory
    for ops in (
        [UpdateOne({"_id": {"productId": i, "storeId": 8}}, {"$inc": {"n": 1}}, upsert=True) for i in range(30)],
        [UpdateOne({"_id": {"productId": i % 5, "storeId": 8}}, {"$set": {"n": i}}, upsert=True) for i in range(30)],
        [UpdateOne({"_id": {"productId": i, "storeId": 8}}, {"$set": {"n": 1}}) for i in range(5)] + [UpdateOne({"stock": 3}, {"$set": {"x": 1}})],
    ):
        before = plans(client)
        try:
            c.bulk_write(ops, ordered=True)
        except BulkWriteError:
            pass
        after = plans(client)
        assert after["mongosRounds"] == before["mongosRounds"] + 1, ops[:2]
        assert after["rewrite"] == before["rewrite"]
    client.close()


def test_mixed_bulk_results_match_the_data(demo):
    client = demo.client()
    client.admin.command("shardCollection", "demo.mixed", key={"_id": "hashed"})
    c = client.demo.mixed
    c.insert_many([{"_id": i, "v": 0} for i in range(10)])
    res = c.bulk_write([UpdateOne({"_id": i}, {"$set": {"v": i % 2}}) for i in range(20)], ordered=True)
    assert res.matched_count == 10
    assert res.modified_count == 5
    assert sorted(d["_id"] for d in c.find({"v": 1})) == [1, 3, 5, 7, 9]
    res = c.bulk_write([InsertOne({"_id": 100 + i}) for i in range(5)], ordered=False)
    assert res.inserted_count == 5
    assert c.count_documents({}) == 15
    assert c.delete_many({"v": 0}).deleted_count == 5
    assert c.count_documents({}) == 10
    client.close()
