"""Beanie (an async ODM on pymongo's asyncio API) through `sluice demo`, from a fresh start, as
an application runs it: models with indexes (a unique one among them) registered by
`init_beanie`, on a sharded collection (`odm_beanie.orders`, sharded on a hashed
`customer_id` the way an application's set-up script shards it) and an unsharded one
(`odm_beanie.customers`); inserts, queries with sorts and projections, links fetched with
`$lookup`, updates through the ODM's operators, upserts, `save()`, aggregation, deletes, and
concurrent requests on one client. Every result is checked against what the data implies."""

import asyncio
from datetime import datetime, timezone
from typing import Optional

import pytest
from beanie import Document, Indexed, Link, PydanticObjectId, init_beanie
from beanie.odm.operators.update.general import Inc, Set
from pydantic import BaseModel, Field
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel
from pymongo.errors import DuplicateKeyError

DB = "odm_beanie"


class Address(BaseModel):
    city: str
    zip: str


class Customer(Document):
    name: Indexed(str, unique=True)
    address: Address
    tier: int = 1

    class Settings:
        name = "customers"


class Line(BaseModel):
    sku: str
    qty: int
    price: float


class Order(Document):
    customer_id: PydanticObjectId
    customer: Link[Customer]
    total: int
    status: str = "new"
    lines: list[Line] = []
    tags: list[str] = []
    note: Optional[str] = None
    created: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))

    class Settings:
        name = "orders"
        indexes = [
            IndexModel([("customer_id", ASCENDING), ("total", DESCENDING)], name="by_customer_total"),
            IndexModel([("status", ASCENDING)], name="by_status"),
        ]


CITIES = ["Lyon", "Oslo", "Lima"]


def run(coro):
    return asyncio.run(coro)


async def connect(demo):
    client = AsyncMongoClient(demo.uri, serverSelectionTimeoutMS=5000, tz_aware=True)
    await init_beanie(database=client[DB], document_models=[Customer, Order])
    return client


@pytest.fixture(scope="module")
def app(demo):
    """The application's first start: shard the orders collection (what a deployment script
    does before the application runs), then let the ODM create its indexes and write the data."""

    async def start():
        client = AsyncMongoClient(demo.uri, serverSelectionTimeoutMS=5000)
        await client.admin.command("shardCollection", f"{DB}.orders", key={"customer_id": "hashed"})
        await client.close()
        client = await connect(demo)
        customers = [
            Customer(name=f"c{i}", address=Address(city=CITIES[i % 3], zip=f"{1000 + i}"), tier=i % 2 + 1)
            for i in range(6)
        ]
        await Customer.insert_many(customers)
        customers = await Customer.find_all().sort(+Customer.name).to_list()
        orders = []
        for i in range(60):
            c = customers[i % 6]
            orders.append(
                Order(
                    customer_id=c.id,
                    customer=c,
                    total=i,
                    lines=[Line(sku=f"s{i % 4}", qty=i % 3 + 1, price=1.5 * (i % 5))],
                    tags=["even" if i % 2 == 0 else "odd"] + (["round"] if i % 10 == 0 else []),
                )
            )
        await Order.insert_many(orders)
        await client.close()
        return [c.id for c in customers]

    return run(start())


def test_init_creates_the_models_indexes(demo, app):
    async def go():
        client = await connect(demo)
        db = client[DB]
        orders = {i["name"]: i for i in await (await db.orders.list_indexes()).to_list()}
        assert dict(orders["by_customer_total"]["key"]) == {"customer_id": 1, "total": -1}
        assert dict(orders["by_status"]["key"]) == {"status": 1}
        customers = {i["name"]: i for i in await (await db.customers.list_indexes()).to_list()}
        assert customers["name_1"].get("unique") is True
        stats = await db.command("collStats", "orders")
        assert stats["sharded"] is True and stats["count"] == 60
        assert (await db.command("collStats", "customers"))["sharded"] is False
        # A second start (init_beanie again) finds its indexes in place and changes nothing.
        await init_beanie(database=db, document_models=[Customer, Order])
        assert len(await (await db.orders.list_indexes()).to_list()) == len(orders)
        await client.close()

    run(go())


def test_unique_index_is_enforced(demo, app):
    async def go():
        client = await connect(demo)
        with pytest.raises(DuplicateKeyError):
            await Customer(name="c1", address=Address(city="Rome", zip="1")).insert()
        assert await Customer.find(Customer.name == "c1").count() == 1
        await client.close()

    run(go())


def test_queries_sorts_and_projections(demo, app):
    class TotalOnly(BaseModel):
        total: int

    async def go():
        client = await connect(demo)
        top = await Order.find(Order.total >= 10, Order.status == "new").sort(-Order.total).limit(5).to_list()
        assert [o.total for o in top] == [59, 58, 57, 56, 55]
        page = await Order.find(Order.customer_id == app[2]).sort(+Order.total).skip(2).limit(3).to_list()
        assert [o.total for o in page] == [14, 20, 26]
        assert await Order.find({"tags": "round"}).count() == 6
        assert await Order.find(Order.lines.sku == "s1").count() == 15
        proj = await Order.find(Order.total < 4).sort(+Order.total).project(TotalOnly).to_list()
        assert [p.total for p in proj] == [0, 1, 2, 3]
        lyon = await Customer.find(Customer.address.city == "Lyon").sort(+Customer.name).to_list()
        assert [c.name for c in lyon] == ["c0", "c3"]
        one = await Order.find_one(Order.customer_id == app[5], Order.total == 11)
        assert one is not None and one.lines[0].qty == 3
        assert await Order.find(Order.total > 1000).first_or_none() is None
        await client.close()

    run(go())


def test_links_are_fetched_with_lookup(demo, app):
    async def go():
        client = await connect(demo)
        orders = await Order.find(Order.total < 6, fetch_links=True).sort(+Order.total).to_list()
        assert [o.customer.name for o in orders] == ["c0", "c1", "c2", "c3", "c4", "c5"]
        assert orders[4].customer.address.city == "Oslo"
        lazy = await Order.find_one(Order.total == 7)
        assert isinstance(lazy.customer, Link)
        await lazy.fetch_all_links()
        assert lazy.customer.name == "c1"
        # A filter on a field of the linked document (Beanie turns it into $lookup + $match).
        n = await Order.find({"customer.address.city": "Lima"}, fetch_links=True).count()
        assert n == 20
        await client.close()

    run(go())


def test_updates_upserts_and_save(demo, app):
    async def go():
        client = await connect(demo)
        res = await Order.find(Order.total >= 50).update(Set({Order.status: "big"}))
        assert res.modified_count == 10
        await Order.find(Order.customer_id == app[0], Order.total < 20).update(Inc({Order.total: 1000}))
        assert sorted(o.total for o in await Order.find(Order.customer_id == app[0]).to_list()) == [
            24, 30, 36, 42, 48, 54, 1000, 1006, 1012, 1018
        ]
        # A document changed in the application and saved back.
        order = await Order.find_one(Order.customer_id == app[3], Order.total == 9)
        order.note = "gift"
        order.tags.append("wrapped")
        await order.save()
        again = await Order.get(order.id)
        assert again.note == "gift" and again.tags == ["odd", "wrapped"]
        # An upsert that inserts (the shard key is in the filter).
        await Order.find_one(Order.customer_id == app[4], Order.total == 777).upsert(
            Set({Order.status: "upserted"}),
            on_insert=Order(customer_id=app[4], customer=await Customer.get(app[4]), total=777, status="upserted"),
        )
        assert await Order.find(Order.status == "upserted").count() == 1
        # set() on one fetched document, and the customer (unsharded) changed in place.
        await order.set({Order.status: "shipped"})
        assert (await Order.get(order.id)).status == "shipped"
        cust = await Customer.find_one(Customer.name == "c2")
        await cust.inc({Customer.tier: 5})
        assert (await Customer.get(cust.id)).tier == 6
        await client.close()

    run(go())


def test_aggregations(demo, app):
    async def go():
        client = await connect(demo)
        per_customer = await Order.aggregate(
            [
                {"$match": {"total": {"$lt": 60}}},
                {"$group": {"_id": "$customer_id", "n": {"$sum": 1}, "sum": {"$sum": "$total"}}},
                {"$sort": {"sum": -1}},
            ]
        ).to_list()
        assert len(per_customer) == 6 and all(g["n"] >= 6 for g in per_customer)
        assert sum(g["sum"] for g in per_customer) == sum(
            o.total for o in await Order.find(Order.total < 60).to_list()
        )
        # Orders 0 and 6 (customer c0) were moved past 1000 by the update test.
        assert await Order.find(Order.total < 10).sum(Order.total) == sum(range(10)) - 6
        assert await Order.find(Order.status == "big").avg(Order.total) == pytest.approx(54.5)
        assert await Order.find(Order.total < 30).max(Order.total) == 29
        by_city = await Order.aggregate(
            [
                {"$match": {"total": {"$lt": 60}}},
                {"$lookup": {"from": "customers", "localField": "customer_id", "foreignField": "_id", "as": "c"}},
                {"$unwind": "$c"},
                {"$group": {"_id": "$c.address.city", "n": {"$sum": 1}}},
                {"$sort": {"_id": 1}},
            ]
        ).to_list()
        assert [(g["_id"], g["n"]) for g in by_city] == [("Lima", 20), ("Lyon", 16), ("Oslo", 20)]
        skus = await Order.aggregate(
            [{"$unwind": "$lines"}, {"$sortByCount": "$lines.sku"}, {"$sort": {"_id": 1}}]
        ).to_list()
        assert [s["_id"] for s in skus] == ["s0", "s1", "s2", "s3"]
        await client.close()

    run(go())


def test_concurrent_requests_and_deletes(demo, app):
    async def go():
        client = await connect(demo)
        counts = await asyncio.gather(*[Order.find(Order.customer_id == cid).count() for cid in app])
        assert sum(counts) == await Order.count()
        deleted = await Order.find(Order.tags == "round").delete()
        assert deleted.deleted_count == 6
        assert await Order.find(Order.tags == "round").count() == 0
        await (await Customer.find_one(Customer.name == "c5")).delete()
        assert await Customer.count() == 5
        await client.close()

    run(go())
