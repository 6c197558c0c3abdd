"""pymongo against one embedded shard directly: the documented mongod behaviour of every
command the shard implements. Expected values come from the data each test writes."""

import datetime

import pymongo
import pytest
from bson import Int64, ObjectId, Timestamp
from pymongo import DeleteOne, InsertOne, ReplaceOne, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure, WriteError


def test_hello_is_a_replica_set_primary(shard):
    client = shard.client(directConnection=True)
    hello = client.admin.command("hello")
    assert hello["setName"] == "shardA"
    assert hello["isWritablePrimary"] is True
    assert hello["me"] == f"127.0.0.1:{shard.port}"
    assert hello["hosts"] == [f"127.0.0.1:{shard.port}"]
    assert "msg" not in hello
    assert client.admin.command("ping")["ok"] == 1.0
    assert client.admin.command("buildInfo")["version"].startswith("8.0")
    client.close()


def test_insert_generates_id_first(shard_db):
    c = shard_db.c
    res = c.insert_one({"a": 1})
    assert isinstance(res.inserted_id, ObjectId)
    raw = shard_db.command("find", "c", filter={})["cursor"]["firstBatch"][0]
    assert list(raw.keys())[0] == "_id"
    c.insert_one({"x": 1, "_id": 5})
    assert list(c.find_one({"_id": 5}).keys()) == ["_id", "x"]


def test_duplicate_keys_ordered_and_unordered(shard_db):
    c = shard_db.c
    c.insert_one({"_id": 2})
    with pytest.raises(BulkWriteError) as err:
        c.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3}], ordered=True)
    d = err.value.details
    assert d["nInserted"] == 1
    assert len(d["writeErrors"]) == 1
    e = d["writeErrors"][0]
    assert e["index"] == 1 and e["code"] == 11000
    assert e["keyPattern"] == {"_id": 1} and e["keyValue"] == {"_id": 2}
    assert "E11000 duplicate key error collection: " in e["errmsg"]
    assert c.count_documents({}) == 2  # _id 3 was not attempted

    with pytest.raises(BulkWriteError) as err:
        c.insert_many([{"_id": 2}, {"_id": 4}, {"_id": 1}, {"_id": 5}], ordered=False)
    d = err.value.details
    assert d["nInserted"] == 2
    assert [e["index"] for e in d["writeErrors"]] == [0, 2]
    assert sorted(x["_id"] for x in c.find()) == [1, 2, 4, 5]

    with pytest.raises(DuplicateKeyError):
        c.insert_one({"_id": 1.0})  # numerically equal _id


def test_unique_secondary_index(shard_db):
    c = shard_db.c
    c.create_index("email", unique=True)
    c.insert_one({"_id": 1, "email": "a@x"})
    with pytest.raises(DuplicateKeyError) as err:
        c.insert_one({"_id": 2, "email": "a@x"})
    assert err.value.details["keyPattern"] == {"email": 1}
    assert err.value.details["keyValue"] == {"email": "a@x"}
    names = [i["name"] for i in c.list_indexes()]
    assert names == ["_id_", "email_1"]


def test_upserts_report_ids_and_seed_from_filter(shard_db):
    c = shard_db.c
    res = c.bulk_write([
        ReplaceOne({"_id": "r1"}, {"v": 1}, upsert=True),
        UpdateOne({"_id": "u1", "k": 7}, {"$set": {"v": 2}}, upsert=True),
        UpdateOne({"k": 9}, {"$inc": {"n": 1}}, upsert=True),
        UpdateOne({"_id": "r1"}, {"$set": {"v": 1}}),
    ])
    assert res.upserted_count == 3
    assert res.matched_count == 1
    assert res.modified_count == 0  # setting v to its current value changes nothing
    assert set(res.upserted_ids) == {0, 1, 2}
    assert c.find_one({"_id": "r1"}) == {"_id": "r1", "v": 1}
    assert c.find_one({"_id": "u1"}) == {"_id": "u1", "k": 7, "v": 2}
    third = c.find_one({"k": 9})
    assert third["n"] == 1 and isinstance(third["_id"], ObjectId)


def test_update_operators(shard_db):
    c = shard_db.c
    c.insert_one({"_id": 1, "n": 5, "f": 1.5, "s": "x", "arr": [1, 2, 3], "tags": ["a"], "old": 1, "m": 2})
    c.update_one({"_id": 1}, {
        "$set": {"s": "y", "sub.d": 1},
        "$unset": {"m": ""},
        "$inc": {"n": 2, "new": 1},
        "$mul": {"f": 2},
        "$min": {"lo": 3},
        "$max": {"n2": 9},
        "$rename": {"old": "renamed"},
        "$currentDate": {"when": True, "ts": {"$type": "timestamp"}},
    })
    d = c.find_one({"_id": 1})
    assert d["s"] == "y" and d["sub"] == {"d": 1} and "m" not in d
    assert d["n"] == 7 and d["new"] == 1 and d["f"] == 3.0
    assert d["lo"] == 3 and d["n2"] == 9 and d["renamed"] == 1 and "old" not in d
    assert isinstance(d["when"], datetime.datetime) and isinstance(d["ts"], Timestamp)

    c.update_one({"_id": 1}, {"$push": {"arr": {"$each": [0], "$position": 0, "$slice": 3}}, "$addToSet": {"tags": {"$each": ["a", "b"]}}})
    d = c.find_one({"_id": 1})
    assert d["arr"] == [0, 1, 2] and d["tags"] == ["a", "b"]
    c.update_one({"_id": 1}, {"$pull": {"arr": {"$gte": 2}}, "$pullAll": {"tags": ["a"]}})
    d = c.find_one({"_id": 1})
    assert d["arr"] == [0, 1] and d["tags"] == ["b"]
    c.update_one({"_id": 1}, {"$pop": {"arr": -1}, "$setOnInsert": {"never": 1}})
    d = c.find_one({"_id": 1})
    assert d["arr"] == [1] and "never" not in d

    c.update_one({"_id": 2}, {"$setOnInsert": {"created": True}, "$set": {"x": 1}}, upsert=True)
    assert c.find_one({"_id": 2}) == {"_id": 2, "created": True, "x": 1}

    with pytest.raises(WriteError) as err:
        c.update_one({"_id": 1}, {"$inc": {"s": 1}})
    assert err.value.code == 14
    with pytest.raises(WriteError) as err:
        c.update_one({"_id": 1}, {"$set": {"_id": 99}})
    assert err.value.code == 66
    with pytest.raises(WriteError) as err:
        c.replace_one({"_id": 1}, {"_id": 98, "x": 1})
    assert err.value.code == 66
    with pytest.raises(WriteError) as err:
        c.update_one({"_id": 1}, {"$frob": {"a": 1}})
    assert err.value.code == 9
    with pytest.raises(WriteError) as err:
        c.update_one({"_id": 1}, {"$set": {"a": 1}, "$inc": {"a": 1}})
    assert err.value.code == 40
    with pytest.raises(WriteError) as err:
        c.update_one({"_id": 1}, {"$set": {"nope.$[x]": 1}}, array_filters=[{"x": 1}])
    assert err.value.code == 2
    assert "The path 'nope' must exist in the document" in str(err.value)
    c.update_one({"_id": 1}, {"$set": {"arr": [1, 2, 1]}})
    c.update_one({"_id": 1}, {"$set": {"arr.$[x]": 7}}, array_filters=[{"x": 1}])
    assert c.find_one({"_id": 1})["arr"] == [7, 2, 7]


def test_multi_update_and_delete(shard_db):
    c = shard_db.c
    c.insert_many([{"_id": i, "g": i % 3} for i in range(9)])
    r = c.update_many({"g": 1}, {"$set": {"hit": True}})
    assert r.matched_count == 3 and r.modified_count == 3
    r = c.update_many({"g": 1}, {"$set": {"hit": True}})
    assert r.matched_count == 3 and r.modified_count == 0
    assert c.delete_one({"g": 2}).deleted_count == 1
    assert c.delete_many({"g": 2}).deleted_count == 2
    assert c.count_documents({}) == 6
    res = c.bulk_write([DeleteOne({"_id": 0}), InsertOne({"_id": 100}), UpdateOne({"_id": 1}, {"$set": {"z": 1}})])
    assert res.deleted_count == 1 and res.inserted_count == 1 and res.modified_count == 1


def test_query_operators(shard_db):
    c = shard_db.c
    c.insert_many([
        {"_id": 1, "n": 1, "s": "apple", "t": ["red", "green"], "d": {"x": 1}, "l": [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]},
        {"_id": 2, "n": 2.5, "s": "Banana", "t": ["yellow"], "d": {"x": 2}},
        {"_id": 3, "n": "3", "s": "cherry", "t": []},
        {"_id": 4, "s": None},
    ])
    ids = lambda f: sorted(d["_id"] for d in c.find(f))
    assert ids({"n": {"$gt": 1}}) == [2]
    assert ids({"n": {"$gte": 1, "$lt": 3}}) == [1, 2]
    assert ids({"n": {"$type": "string"}}) == [3]
    assert ids({"n": {"$exists": False}}) == [4]
    assert ids({"n": {"$in": [1, "3"]}}) == [1, 3]
    assert ids({"n": {"$nin": [1, "3"]}}) == [2, 4]
    assert ids({"n": {"$ne": 1}}) == [2, 3, 4]
    assert ids({"s": {"$regex": "^b", "$options": "i"}}) == [2]
    assert ids({"s": None}) == [4]
    assert ids({"t": "red"}) == [1]
    assert ids({"t": {"$size": 0}}) == [3]
    assert ids({"t": {"$all": ["green", "red"]}}) == [1]
    assert ids({"d.x": 2}) == [2]
    assert ids({"l": {"$elemMatch": {"k": 2, "v": "b"}}}) == [1]
    assert ids({"l": {"$elemMatch": {"k": 2, "v": "a"}}}) == []
    assert ids({"l.k": 2}) == [1]
    assert ids({"$or": [{"_id": 1}, {"s": "cherry"}]}) == [1, 3]
    assert ids({"$nor": [{"_id": 1}, {"_id": 2}]}) == [3, 4]
    assert ids({"$and": [{"_id": {"$gt": 1}}, {"_id": {"$lt": 4}}]}) == [2, 3]
    assert ids({"n": {"$not": {"$gt": 1}}}) == [1, 3, 4]
    with pytest.raises(OperationFailure) as err:
        list(c.find({"n": {"$frob": 1}}))
    assert err.value.code == 2 and "$frob" in str(err.value)


def test_sort_across_mixed_types(shard_db):
    c = shard_db.c
    values = [("str", "a"), ("null", None), ("int", 5), ("double", 2.5), ("long", Int64(-3)),
              ("obj", {"a": 1}), ("arr", [7, 8]), ("oid", ObjectId("000000000000000000000001")),
              ("bool", True), ("date", datetime.datetime(2020, 1, 1))]
    c.insert_many([{"_id": k, "v": v} for k, v in values] + [{"_id": "missing"}])
    asc = [d["_id"] for d in c.find().sort("v", 1)]
    # Missing and null sort together (stable: insertion order), then numbers, strings,
    # objects, arrays (by their smallest element here, 7, a number), ObjectId, bool, date.
    assert asc == ["null", "missing", "long", "double", "int", "arr", "str", "obj", "oid", "bool", "date"]
    desc = [d["_id"] for d in c.find().sort("v", -1)]
    assert desc[:4] == ["date", "bool", "oid", "obj"]


def test_find_options_and_get_more_paging(shard_db):
    c = shard_db.c
    c.insert_many([{"_id": i, "sq": i * i, "junk": "x" * 10} for i in range(250)])
    docs = list(c.find({}, {"sq": 1}).sort("_id", -1).skip(5).limit(200).batch_size(30))
    assert len(docs) == 200
    assert docs[0] == {"_id": 244, "sq": 244 * 244}
    assert docs[-1]["_id"] == 45
    # The first batch is 101 documents by default; the rest comes through getMore.
    reply = shard_db.command("find", "c", filter={}, sort={"_id": 1})
    assert len(reply["cursor"]["firstBatch"]) == 101
    cid = reply["cursor"]["id"]
    assert cid != 0 and isinstance(cid, Int64)
    more = shard_db.command("getMore", cid, collection="c", batchSize=100)
    assert [d["_id"] for d in more["cursor"]["nextBatch"]] == list(range(101, 201))
    more = shard_db.command("getMore", cid, collection="c")
    assert len(more["cursor"]["nextBatch"]) == 49 and more["cursor"]["id"] == 0
    with pytest.raises(OperationFailure) as err:
        shard_db.command("getMore", cid, collection="c")
    assert err.value.code == 43
    one = shard_db.command("find", "c", filter={}, limit=-3)
    assert len(one["cursor"]["firstBatch"]) == 3 and one["cursor"]["id"] == 0
    reply = shard_db.command("find", "c", filter={}, batchSize=2)
    killed = shard_db.command("killCursors", "c", cursors=[reply["cursor"]["id"], Int64(12345)])
    assert killed["cursorsKilled"] == [reply["cursor"]["id"]]
    assert killed["cursorsNotFound"] == [12345]
    assert [d["_id"] for d in c.find({}, {"_id": 1}).sort("_id", 1).limit(3)] == [0, 1, 2]
    assert list(c.find({"_id": 1}, {"_id": 0, "sq": 1})) == [{"sq": 1}]


def test_count_distinct_find_and_modify(shard_db):
    c = shard_db.c
    c.insert_many([{"_id": i, "g": i % 3, "tags": ["t%d" % (i % 2)]} for i in range(10)])
    assert shard_db.command("count", "c", query={"g": 0})["n"] == 4
    assert c.count_documents({"g": 1}) == 3
    assert c.estimated_document_count() == 10
    assert sorted(c.distinct("g")) == [0, 1, 2]
    assert sorted(c.distinct("tags")) == ["t0", "t1"]
    doc = c.find_one_and_update({"g": 2}, {"$set": {"hit": 1}}, sort=[("_id", -1)], return_document=pymongo.ReturnDocument.AFTER)
    assert doc == {"_id": 8, "g": 2, "tags": ["t0"], "hit": 1}
    doc = c.find_one_and_update({"_id": 42}, {"$set": {"x": 1}}, upsert=True, return_document=pymongo.ReturnDocument.AFTER)
    assert doc == {"_id": 42, "x": 1}
    doc = c.find_one_and_delete({"_id": 42})
    assert doc == {"_id": 42, "x": 1}
    assert c.find_one_and_delete({"_id": 42}) is None
    old = c.find_one_and_replace({"_id": 0}, {"r": 1})
    assert old["g"] == 0 and c.find_one({"_id": 0}) == {"_id": 0, "r": 1}


def test_aggregate(shard_db):
    c = shard_db.c
    c.insert_many([{"_id": i, "k": "ab"[i % 2], "q": i} for i in range(6)])
    out = list(c.aggregate([
        {"$match": {"q": {"$gte": 1}}},
        {"$group": {"_id": "$k", "total": {"$sum": "$q"}, "avg": {"$avg": "$q"}, "mn": {"$min": "$q"},
                    "mx": {"$max": "$q"}, "first": {"$first": "$q"}, "last": {"$last": "$q"},
                    "all": {"$push": "$q"}, "set": {"$addToSet": "$k"}}},
        {"$sort": {"_id": 1}},
    ]))
    assert out == [
        {"_id": "a", "total": 6, "avg": 3.0, "mn": 2, "mx": 4, "first": 2, "last": 4, "all": [2, 4], "set": ["a"]},
        {"_id": "b", "total": 9, "avg": 3.0, "mn": 1, "mx": 5, "first": 1, "last": 5, "all": [1, 3, 5], "set": ["b"]},
    ]
    out = list(c.aggregate([{"$project": {"q": 1, "double": {"$multiply": ["$q", 2]}}}, {"$sort": {"q": -1}}, {"$skip": 1}, {"$limit": 2}]))
    assert out == [{"_id": 4, "q": 4, "double": 8}, {"_id": 3, "q": 3, "double": 6}]
    assert list(c.aggregate([{"$match": {"k": "a"}}, {"$count": "n"}])) == [{"n": 3}]
    assert list(c.aggregate([{"$addFields": {"z": 1}}, {"$unset": ["q", "k"]}, {"$limit": 1}])) == [{"_id": 0, "z": 1}]
    assert c.count_documents({"k": "b"}) == 3
    with pytest.raises(OperationFailure) as err:
        list(c.aggregate([{"$bucketAuto": {}}]))
    assert "$bucketAuto" in str(err.value)


def test_ddl_and_stats(shard_db, shard):
    shard_db.create_collection("made")
    with pytest.raises(OperationFailure) as err:
        shard_db.command("create", "made")
    assert err.value.code == 48
    shard_db.other.insert_one({"a": 1})
    assert sorted(shard_db.list_collection_names()) == ["made", "other"]
    names = [c["name"] for c in shard_db.list_collections(filter={"name": "other"})]
    assert names == ["other"]
    client = shard.client(directConnection=True)
    assert shard_db.name in client.list_database_names()
    r = shard_db.other.create_indexes([pymongo.IndexModel([("a", 1)]), pymongo.IndexModel([("b", -1)], name="bee")])
    assert r == ["a_1", "bee"]
    assert [i["name"] for i in shard_db.other.list_indexes()] == ["_id_", "a_1", "bee"]
    shard_db.other.drop_index("bee")
    assert [i["name"] for i in shard_db.other.list_indexes()] == ["_id_", "a_1"]
    with pytest.raises(OperationFailure) as err:
        shard_db.other.drop_index("nope")
    assert err.value.code == 27
    stats = shard_db.command("collStats", "other")
    assert stats["count"] == 1 and stats["nindexes"] == 2
    dbs = shard_db.command("dbStats")
    assert dbs["collections"] == 2 and dbs["objects"] == 1
    shard_db.drop_collection("made")
    assert shard_db.list_collection_names() == ["other"]
    with pytest.raises(OperationFailure) as err:
        shard_db.command("listIndexes", "missing")
    assert err.value.code == 26
    client.close()


def test_server_status_counts_commands(shard_db, shard):
    client = shard.client(directConnection=True)

    def total(name):
        return client.admin.command("serverStatus")["metrics"]["commands"].get(name, {}).get("total", 0)

    before = total("update")
    shard_db.c.bulk_write([UpdateOne({"_id": i}, {"$set": {"v": i}}, upsert=True) for i in range(50)], ordered=True)
    assert total("update") == before + 1, "one update command for one bulk"
    status = client.admin.command("serverStatus")
    assert status["process"] == "mongod"
    assert status["opcounters"]["update"] >= 50
    client.close()


def test_fail_command_failpoint(shard_db, shard):
    client = shard.client(directConnection=True, retryWrites=False)
    db = client[shard_db.name]
    client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                         data={"failCommands": ["insert"], "errorCode": 72})
    with pytest.raises(OperationFailure) as err:
        db.c.insert_one({"_id": 1})
    assert err.value.code == 72
    assert "failCommand" in str(err.value)
    db.c.insert_one({"_id": 1})  # times: 1 is used up
    assert db.c.count_documents({}) == 1

    client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                         data={"failCommands": ["insert"], "closeConnection": True})
    with pytest.raises(pymongo.errors.AutoReconnect):
        db.c.insert_one({"_id": 2})
    assert db.c.count_documents({}) == 1, "a closed connection applies nothing"

    client.admin.command("configureFailPoint", "failCommand", mode="alwaysOn",
                         data={"failCommands": ["find"], "writeConcernError": {"code": 64, "codeName": "WriteConcernTimeout", "errmsg": "waiting"}})
    reply = db.command("find", "c")
    assert reply["writeConcernError"]["code"] == 64
    client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert "writeConcernError" not in db.command("find", "c")

    client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                         data={"failCommands": ["ping"], "blockConnection": True, "blockTimeMS": 150})
    start = datetime.datetime.now()
    client.admin.command("ping")
    assert (datetime.datetime.now() - start).total_seconds() >= 0.15
    with pytest.raises(OperationFailure):
        client.admin.command("configureFailPoint", "noSuchFailPoint", mode="alwaysOn")
    client.close()


def test_retryable_writes_survive_a_closed_connection(shard_db, shard):
    # The driver retries the insert after the connection closes; the shard's records make the
    # retry safe, and the document exists exactly once.
    client = shard.client(directConnection=True, retryWrites=True)
    db = client[shard_db.name]
    client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                         data={"failCommands": ["insert"], "closeConnection": True})
    db.c.insert_one({"_id": "once"})
    assert db.c.count_documents({"_id": "once"}) == 1
    client.close()


def test_bad_input_gets_mongod_codes(shard_db):
    with pytest.raises(OperationFailure) as err:
        shard_db.command({"insert": "c"})
    assert err.value.code == 40414
    with pytest.raises(OperationFailure) as err:
        shard_db.command({"insert": 5, "documents": []})
    assert err.value.code == 73
    with pytest.raises(OperationFailure) as err:
        shard_db.command({"find": "c", "filter": 5})
    assert err.value.code == 14
    with pytest.raises(OperationFailure) as err:
        shard_db.command({"delete": "c", "deletes": [{"q": {}, "limit": 5}]})
    assert err.value.code == 9 or "limit" in str(err.value)
    with pytest.raises(OperationFailure) as err:
        shard_db.command({"frobnicate": 1})
    assert err.value.code == 59
    assert shard_db.command("ping")["ok"] == 1.0
