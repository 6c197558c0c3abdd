"""pymongo through `sluice demo`: the everyday read and DDL commands on a sharded and an
unsharded collection, checked against what the data implies."""

import pymongo
import pytest
from bson import Int64
from pymongo.errors import OperationFailure

DOCS = [{"_id": i, "g": i % 4, "v": (i * 7) % 31, "tag": ["a", "b", "c"][i % 3]} for i in range(150)]


@pytest.fixture(scope="module")
def colls(demo):
    client = demo.client()
    client.admin.command("shardCollection", "reads.sharded", key={"_id": "hashed"})
    for name in ("sharded", "plain"):
        client.reads[name].insert_many(DOCS)
    yield client, [client.reads.sharded, client.reads.plain]
    client.close()


def both(colls):
    return colls[1]


def test_find_sort_skip_limit_projection(colls):
    for c in both(colls):
        expected = sorted(DOCS, key=lambda d: (-d["v"], d["_id"]))[10:40]
        got = list(c.find({}, {"v": 1}).sort([("v", -1), ("_id", 1)]).skip(10).limit(30).batch_size(6))
        assert got == [{"_id": d["_id"], "v": d["v"]} for d in expected], c.name
        assert len(list(c.find().batch_size(11))) == 150
        assert sorted(d["_id"] for d in c.find({"tag": "b", "g": {"$gte": 2}})) == [d["_id"] for d in DOCS if d["tag"] == "b" and d["g"] >= 2]
        assert c.find_one({"_id": 77}) == DOCS[77]


def test_aggregate_count_distinct(colls):
    for c in both(colls):
        assert c.count_documents({"g": 2}) == len([d for d in DOCS if d["g"] == 2])
        assert c.estimated_document_count() == 150
        assert sorted(c.distinct("tag")) == ["a", "b", "c"]
        out = {g["_id"]: g for g in c.aggregate([{"$group": {"_id": "$tag", "n": {"$sum": 1}, "total": {"$sum": "$v"}, "hi": {"$max": "$v"}, "avg": {"$avg": "$v"}}}])}
        for tag in "abc":
            vals = [d["v"] for d in DOCS if d["tag"] == tag]
            assert out[tag]["n"] == len(vals)
            assert out[tag]["total"] == sum(vals)
            assert out[tag]["hi"] == max(vals)
            assert out[tag]["avg"] == pytest.approx(sum(vals) / len(vals))
        top = list(c.aggregate([{"$sort": {"v": -1, "_id": 1}}, {"$limit": 2}]))
        assert [d["_id"] for d in top] == [d["_id"] for d in sorted(DOCS, key=lambda d: (-d["v"], d["_id"]))[:2]]
        assert list(c.aggregate([{"$match": {"g": 0}}, {"$count": "n"}])) == [{"n": len([d for d in DOCS if d["g"] == 0])}]


def test_indexes_and_collections(colls):
    client, cs = colls
    for c in cs:
        assert c.create_index("v") == "v_1"
        names = [i["name"] for i in c.list_indexes()]
        assert "v_1" in names and "_id_" in names
        c.drop_index("v_1")
        assert "v_1" not in [i["name"] for i in c.list_indexes()]
    assert {"sharded", "plain"} <= set(client.reads.list_collection_names())
    assert "reads" in client.list_database_names()
    assert [d["name"] for d in client.list_databases(nameOnly=True, filter={"name": "reads"})] == ["reads"]
    stats = client.reads.command("dbStats")
    assert stats["objects"] >= 300
    cstats = client.reads.command("collStats", "sharded")
    assert cstats["sharded"] is True and cstats["count"] == 150


def test_explain_names_the_owning_shard(colls):
    client, cs = colls
    plan = cs[0].find({"_id": 5}).explain()["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "SINGLE_SHARD"
    (shard,) = [s["shardName"] for s in plan["shards"]]
    h = client.admin.command("aggregate", 1, pipeline=[{"$documents": [{}]}, {"$project": {"_id": {"$toHashedIndexKey": {"$literal": 5}}}}], cursor={})["cursor"]["firstBatch"][0]["_id"]
    coll = client.config.collections.find_one({"_id": "reads.sharded"})
    owner = client.config.chunks.find_one({"uuid": coll["uuid"], "min": {"$lte": {"_id": h}}, "max": {"$gt": {"_id": h}}})
    assert owner["shard"] == shard


def test_bad_input(colls):
    client, cs = colls
    for c in cs:
        with pytest.raises(OperationFailure) as err:
            client.reads.command("getMore", Int64(987654321), collection=c.name)
        assert err.value.code == 43
        with pytest.raises(OperationFailure) as err:
            list(c.aggregate([{"$frobnicate": {"groupBy": "$v"}}]))
        assert err.value.code == 40324 and "$frobnicate" in str(err.value)
        with pytest.raises(OperationFailure) as err:
            list(c.find({"v": {"$frob": 1}}))
        assert err.value.code == 2 and "$frob" in str(err.value)


def test_drop_and_drop_database(colls):
    client, cs = colls
    client.admin.command("shardCollection", "gone.s", key={"_id": "hashed"})
    client.gone.s.insert_many([{"_id": i} for i in range(20)])
    client.gone.p.insert_one({"_id": 1})
    assert client.gone.s.drop() is None
    assert client.config.collections.count_documents({"_id": "gone.s"}) == 0
    client.drop_database("gone")
    assert "gone" not in client.list_database_names()
    assert client.config.databases.count_documents({"_id": "gone"}) == 0
