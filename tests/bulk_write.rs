//! The 8.0 `bulkWrite` command through the router against an oracle: random bulks (proptest:
//! seeded, shrinking) over three namespaces — two sharded on `{_id: "hashed"}`, one unsharded —
//! run through the router in front of 2, 3 and 5 embedded shards, and the same commands run on
//! ONE embedded shard. Every reply must be equal (items, counters, errors), then the final
//! contents of each namespace, with each document on the shard owning its key.
//!
//! The one difference allowed is the write-path contract's `REWRITE_CONTINUES`: an ordered
//! bulk the router proved and rewrote into one round, cut at an error at k, may leave
//! idempotent operations after k applied (inserts after k are undone). So when an ordered reply
//! has an error, both sides resend the operations after it (as an application recovering from
//! an ordered error does) until none fails, and the contents are compared after that.
//!
//! Single-document operations pin `_id` (the shard key), so no write without shard key makes
//! the router pick one of several documents, and multi-document upserts are not generated
//! (mongos refuses them without the shard key). `SLUICE_BULKWRITE_CASES` (default 60) sizes a
//! run.

mod common;

use bson::{doc, Bson, Document};
use common::TestCluster;
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngSeed, TestCaseError, TestRunner};
use sluice::embedded::EmbeddedShard;

const DB: &str = "bw";
const NAMESPACES: [&str; 3] = ["bw.a", "bw.b", "bw.u"];

#[derive(Debug, Clone)]
enum Op {
    Insert(usize, i32, i32),
    UpdateOne(usize, i32, Document, bool),
    UpdateMany(usize, i32, Document),
    Replace(usize, i32, i32, bool),
    DeleteOne(usize, i32),
    DeleteMany(usize, i32),
}

impl Op {
    fn to_doc(&self) -> Document {
        match self {
            Op::Insert(ns, id, v) => doc! {"insert": *ns as i32, "document": {"_id": id, "v": v}},
            Op::UpdateOne(ns, id, u, upsert) => {
                doc! {"update": *ns as i32, "filter": {"_id": id}, "updateMods": u.clone(), "upsert": upsert}
            }
            Op::UpdateMany(ns, v, u) => {
                doc! {"update": *ns as i32, "filter": {"v": {"$gte": v}}, "updateMods": u.clone(), "multi": true}
            }
            Op::Replace(ns, id, v, upsert) => {
                doc! {"update": *ns as i32, "filter": {"_id": id}, "updateMods": {"v": v, "r": true}, "upsert": upsert}
            }
            Op::DeleteOne(ns, id) => doc! {"delete": *ns as i32, "filter": {"_id": id}},
            Op::DeleteMany(ns, v) => {
                doc! {"delete": *ns as i32, "filter": {"v": v}, "multi": true}
            }
        }
    }
}

fn update_mods() -> BoxedStrategy<Document> {
    prop_oneof![
        (0..5i32).prop_map(|x| doc! {"$set": {"v": x}}),
        (0..5i32).prop_map(|x| doc! {"$max": {"v": x}}),
        Just(doc! {"$inc": {"v": 1}}),
        Just(doc! {"$set": {"w": 1}, "$unset": {"z": ""}}),
    ]
    .boxed()
}

fn op() -> BoxedStrategy<Op> {
    let ns = 0..3usize;
    let id = 0..8i32;
    prop_oneof![
        4 => (ns.clone(), id.clone(), 0..5i32).prop_map(|(n, i, v)| Op::Insert(n, i, v)),
        3 => (ns.clone(), id.clone(), update_mods(), any::<bool>())
            .prop_map(|(n, i, u, up)| Op::UpdateOne(n, i, u, up)),
        1 => (ns.clone(), 0..5i32, update_mods()).prop_map(|(n, v, u)| Op::UpdateMany(n, v, u)),
        1 => (ns.clone(), id.clone(), 0..5i32, any::<bool>())
            .prop_map(|(n, i, v, up)| Op::Replace(n, i, v, up)),
        2 => (ns.clone(), id).prop_map(|(n, i)| Op::DeleteOne(n, i)),
        1 => (ns, 0..5i32).prop_map(|(n, v)| Op::DeleteMany(n, v)),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
struct Bulk {
    seed: Vec<(usize, i32, i32)>,
    ops: Vec<Op>,
    ordered: bool,
    errors_only: bool,
}

fn bulk() -> BoxedStrategy<Bulk> {
    (
        prop::collection::vec((0..3usize, 0..8i32, 0..5i32), 0..8),
        prop_oneof![
            // Distinct single-document operations: what the proof rewrites.
            prop::collection::vec(op(), 1..14),
            prop::collection::btree_set((0..3usize, 0..8i32), 1..14).prop_flat_map(|keys| {
                let n = keys.len();
                (Just(keys), prop::collection::vec((0..3u8, 0..5i32), n)).prop_map(
                    |(keys, picks)| {
                        keys.into_iter()
                            .zip(picks)
                            .map(|((ns, id), (pick, v))| match pick {
                                0 => Op::Insert(ns, id, v),
                                1 => Op::UpdateOne(ns, id, doc! {"$set": {"v": v}}, v % 2 == 0),
                                _ => Op::DeleteOne(ns, id),
                            })
                            .collect::<Vec<Op>>()
                    },
                )
            }),
        ],
        any::<bool>(),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(seed, ops, ordered, errors_only)| Bulk {
            seed,
            ops,
            ordered,
            errors_only,
        })
        .boxed()
}

fn command(ops: &[Op], ordered: bool, errors_only: bool) -> Document {
    let ns_info: Vec<Bson> = NAMESPACES
        .iter()
        .map(|ns| Bson::Document(doc! {"ns": *ns}))
        .collect();
    doc! {
        "bulkWrite": 1,
        "ops": ops.iter().map(|o| Bson::Document(o.to_doc())).collect::<Vec<_>>(),
        "nsInfo": ns_info,
        "ordered": ordered,
        "errorsOnly": errors_only,
    }
}

fn clean(mut reply: Document) -> Document {
    for f in ["$clusterTime", "operationTime"] {
        reply.remove(f);
    }
    reply
}

/// The index of the failed item of an ordered reply.
fn failed_at(reply: &Document) -> Option<usize> {
    reply
        .get_document("cursor")
        .ok()?
        .get_array("firstBatch")
        .ok()?
        .iter()
        .filter_map(|i| i.as_document())
        .find(|i| i.get_f64("ok").ok() == Some(0.0))
        .and_then(|i| i.get_i32("idx").ok())
        .map(|i| i as usize)
}

async fn run(client: &mongodb::Client, cmd: Document) -> Document {
    match client.database("admin").run_command(cmd).await {
        Ok(r) => clean(r),
        Err(e) => doc! {"error": format!("{}", sluice_code(&e))},
    }
}

fn sluice_code(e: &mongodb::error::Error) -> i32 {
    match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => c.code,
        _ => -1,
    }
}

/// Resends the operations after each ordered error until the remainder runs clean; returns
/// where each resend failed (a resend must not meet an error the oracle's does not: inserts
/// applied early were undone).
async fn recover(client: &mongodb::Client, bulk: &Bulk, first: &Document) -> Vec<usize> {
    let mut ops: Vec<Op> = bulk.ops.clone();
    let mut reply = first.clone();
    let mut failures = Vec::new();
    for _ in 0..ops.len() + 1 {
        let Some(k) = failed_at(&reply) else { break };
        failures.push(k);
        ops = ops.split_off((k + 1).min(ops.len()));
        if ops.is_empty() {
            break;
        }
        reply = run(client, command(&ops, true, false)).await;
    }
    failures
}

struct Target {
    cluster: TestCluster,
    client: mongodb::Client,
    oracle: EmbeddedShard,
    oracle_client: mongodb::Client,
}

impl Target {
    async fn start(shards: usize) -> Target {
        let cluster = TestCluster::start(
            shards,
            &[
                ("bw.a", doc! {"_id": "hashed"}),
                ("bw.b", doc! {"_id": "hashed"}),
            ],
        )
        .await;
        let client = common::driver(cluster.addr(), "").await;
        let oracle = EmbeddedShard::start("127.0.0.1:0", Default::default())
            .await
            .expect("oracle");
        let oracle_client = mongodb::Client::with_uri_str(format!(
            "mongodb://{}/?directConnection=true",
            oracle.local_addr()
        ))
        .await
        .expect("oracle client");
        Target {
            cluster,
            client,
            oracle,
            oracle_client,
        }
    }

    fn reset(&self, seed: &[(usize, i32, i32)]) {
        for (k, ns) in NAMESPACES.iter().enumerate() {
            let coll = &ns[3..];
            let mut docs: Vec<Document> = Vec::new();
            for (n, id, v) in seed {
                if *n == k && !docs.iter().any(|d| d.get_i32("_id").ok() == Some(*id)) {
                    docs.push(doc! {"_id": id, "v": v});
                }
            }
            self.oracle
                .service()
                .set_documents(DB, coll, docs.clone())
                .unwrap();
            for s in &self.cluster.shards {
                let mine: Vec<Document> = if k == 2 {
                    // The unsharded namespace lives on the database's primary shard.
                    Vec::new()
                } else {
                    docs.iter()
                        .filter(|d| self.cluster.owner(ns, d) == s.service().name())
                        .cloned()
                        .collect()
                };
                s.service().set_documents(DB, coll, mine).unwrap();
            }
            if k == 2 {
                let primary = self
                    .cluster
                    .sharded
                    .metadata
                    .database(DB)
                    .and_then(|d| d.get_str("primary").ok().map(str::to_string))
                    .expect("bw has a primary shard");
                let s = self
                    .cluster
                    .shards
                    .iter()
                    .find(|s| s.service().name() == primary)
                    .expect("primary shard");
                s.service().set_documents(DB, coll, docs).unwrap();
            }
        }
    }

    fn contents(&self, k: usize) -> (Vec<String>, Vec<String>) {
        let coll = &NAMESPACES[k][3..];
        let mut mine: Vec<String> = if k == 2 {
            self.cluster
                .shards
                .iter()
                .flat_map(|s| s.service().documents(DB, coll))
                .map(|d| d.to_string())
                .collect()
        } else {
            self.cluster
                .placed_documents(DB, coll)
                .iter()
                .map(|d| d.to_string())
                .collect()
        };
        let mut theirs: Vec<String> = self
            .oracle
            .service()
            .documents(DB, coll)
            .iter()
            .map(|d| d.to_string())
            .collect();
        mine.sort();
        theirs.sort();
        (mine, theirs)
    }

    async fn check(&self, bulk: &Bulk) -> Result<(), String> {
        self.reset(&bulk.seed);
        let cmd = command(&bulk.ops, bulk.ordered, bulk.errors_only);
        let mine = run(&self.client, cmd.clone()).await;
        let theirs = run(&self.oracle_client, cmd).await;
        if mine.contains_key("error") || theirs.contains_key("error") {
            return Err(format!(
                "a valid bulkWrite failed as a command:\nrouter {mine}\noracle {theirs}"
            ));
        }
        if mine != theirs {
            return Err(format!("replies differ:\nrouter {mine}\noracle {theirs}"));
        }
        if bulk.ordered {
            // (An errorsOnly reply holds the failed item too.)
            let a = recover(&self.client, bulk, &mine).await;
            let b = recover(&self.oracle_client, bulk, &theirs).await;
            if a != b {
                return Err(format!(
                    "resends after the ordered error failed at {a:?} through the router, at {b:?} on the oracle"
                ));
            }
        }
        for (k, ns) in NAMESPACES.iter().enumerate() {
            let (a, b) = self.contents(k);
            if a != b {
                return Err(format!(
                    "contents of {ns} differ:\nrouter {a:?}\noracle {b:?}"
                ));
            }
        }
        Ok(())
    }
}

#[test]
fn router_bulk_write_matches_the_oracle_on_random_bulks() {
    let cases: u32 = std::env::var("SLUICE_BULKWRITE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for shards in [2usize, 3, 5] {
        let target = rt.block_on(Target::start(shards));
        let mut runner = TestRunner::new(PtConfig {
            cases,
            failure_persistence: None,
            rng_seed: RngSeed::Fixed(0xb0_1c + shards as u64),
            ..PtConfig::default()
        });
        let result = runner.run(&bulk(), |b| {
            rt.block_on(target.check(&b))
                .map_err(|e| TestCaseError::fail(format!("{shards} shards: {e}")))
        });
        let (_, _, rewrites) = target.cluster.plans();
        assert!(
            rewrites > 0,
            "{shards} shards: no bulk was rewritten into one round; the proof is not exercised"
        );
        rt.block_on(async {
            target.cluster.stop().await;
            target.oracle.shutdown().await;
        });
        if let Err(e) = result {
            panic!("{e}");
        }
    }
}

/// The proof across namespaces: an ordered bulk of inserts with distinct `_id`s over two
/// sharded namespaces goes out as one round, one child `bulkWrite` per shard; a duplicate
/// identity within a namespace sends it in mongos's rounds, the same `_id` in two namespaces
/// does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_cross_namespace_bulk_is_one_round_when_proven() {
    let cluster = TestCluster::start(
        3,
        &[
            ("bw.a", doc! {"_id": "hashed"}),
            ("bw.b", doc! {"_id": "hashed"}),
        ],
    )
    .await;
    let client = common::driver(cluster.addr(), "").await;
    let before = cluster.shard_command_total("bulkWrite");
    let ops: Vec<Op> = (0..40)
        .map(|i| Op::Insert((i % 2) as usize, i / 2, i))
        .collect();
    let r = run(&client, command(&ops, true, false)).await;
    assert_eq!(r.get_i32("nInserted").unwrap(), 40, "{r}");
    assert_eq!(r.get_i32("nErrors").unwrap(), 0, "{r}");
    assert_eq!(cluster.plans(), (0, 0, 1), "the ordered bulk was rewritten");
    assert_eq!(
        cluster.shard_command_total("bulkWrite") - before,
        3,
        "one child bulkWrite per shard"
    );
    // The same _id twice in one namespace: no proof, mongos's rounds.
    let dup = vec![
        Op::DeleteOne(0, 1),
        Op::DeleteOne(1, 2),
        Op::DeleteOne(0, 1),
    ];
    let r = run(&client, command(&dup, true, false)).await;
    assert_eq!(r.get_i32("nDeleted").unwrap(), 2, "{r}");
    assert_eq!(cluster.plans().0, 1, "planned as mongos rounds");
    cluster.stop().await;
}

/// Request checks and reply shape, on the router and on one shard alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_write_checks_and_reply_shape() {
    let cluster = TestCluster::start(2, &[("bw.a", doc! {"_id": "hashed"})]).await;
    let client = common::driver(cluster.addr(), "").await;
    let shard = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?directConnection=true",
        cluster.shards[0].local_addr()
    ))
    .await
    .unwrap();
    for c in [&client, &shard] {
        let not_admin = c
            .database("bw")
            .run_command(doc! {"bulkWrite": 1, "ops": [{"insert": 0, "document": {}}], "nsInfo": [{"ns": "bw.a"}]})
            .await
            .unwrap_err();
        assert_eq!(common::error_code(&not_admin), 13);
        let bad_index = c
            .database("admin")
            .run_command(doc! {"bulkWrite": 1, "ops": [{"insert": 1, "document": {}}], "nsInfo": [{"ns": "bw.a"}]})
            .await
            .unwrap_err();
        assert_eq!(common::error_code(&bad_index), 2);
        let empty = c
            .database("admin")
            .run_command(doc! {"bulkWrite": 1, "ops": [], "nsInfo": [{"ns": "bw.a"}]})
            .await
            .unwrap_err();
        assert_eq!(common::error_code(&empty), 16);
        let r = c
            .database("admin")
            .run_command(doc! {
                "bulkWrite": 1,
                "ops": [
                    {"insert": 0, "document": {"_id": 100, "x": 1}},
                    {"insert": 0, "document": {"_id": 100, "x": 2}},
                    {"update": 0, "filter": {"_id": 101}, "updateMods": {"$set": {"x": 3}}, "upsert": true},
                ],
                "nsInfo": [{"ns": "bw.a"}],
                "ordered": false,
            })
            .await
            .unwrap();
        let cursor = r.get_document("cursor").unwrap();
        assert_eq!(cursor.get_str("ns").unwrap(), "admin.$cmd.bulkWrite");
        assert_eq!(cursor.get_i64("id").unwrap(), 0);
        let batch = cursor.get_array("firstBatch").unwrap();
        assert_eq!(
            batch[0].as_document().unwrap(),
            &doc! {"ok": 1.0, "idx": 0, "n": 1}
        );
        let dup = batch[1].as_document().unwrap();
        assert_eq!(dup.get_i32("code").unwrap(), 11000);
        assert_eq!(dup.get_i32("n").unwrap(), 0);
        assert_eq!(
            batch[2].as_document().unwrap(),
            &doc! {"ok": 1.0, "idx": 2, "n": 1, "nModified": 0, "upserted": {"_id": 101}}
        );
        assert_eq!(r.get_i32("nErrors").unwrap(), 1);
        assert_eq!(r.get_i32("nInserted").unwrap(), 1);
        assert_eq!(r.get_i32("nUpserted").unwrap(), 1);
        assert_eq!(r.get_i32("nMatched").unwrap(), 0);
        // Reset for the next server.
        c.database("bw")
            .collection::<Document>("a")
            .delete_many(doc! {})
            .await
            .unwrap();
    }
    cluster.stop().await;
}

/// A stock driver's `client.bulkWrite()` (document sequences, a retryable write with `lsid`
/// and `txnNumber`) through the router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_client_bulk_write_through_the_router() {
    use mongodb::options::{DeleteOneModel, InsertOneModel, UpdateOneModel, WriteModel};
    let cluster = TestCluster::start(
        3,
        &[
            ("bw.a", doc! {"_id": "hashed"}),
            ("bw.b", doc! {"_id": "hashed"}),
        ],
    )
    .await;
    let client = common::driver(cluster.addr(), "").await;
    let a = mongodb::Namespace::new(DB, "a");
    let b = mongodb::Namespace::new(DB, "b");
    let mut models: Vec<WriteModel> = Vec::new();
    for i in 0..10 {
        models.push(
            InsertOneModel::builder()
                .namespace(if i % 2 == 0 { a.clone() } else { b.clone() })
                .document(doc! {"_id": i, "v": i})
                .build()
                .into(),
        );
    }
    models.push(
        UpdateOneModel::builder()
            .namespace(a.clone())
            .filter(doc! {"_id": 0})
            .update(doc! {"$set": {"v": 100}})
            .build()
            .into(),
    );
    models.push(
        DeleteOneModel::builder()
            .namespace(b.clone())
            .filter(doc! {"_id": 1})
            .build()
            .into(),
    );
    let r = client.bulk_write(models).await.expect("bulkWrite");
    assert_eq!(r.inserted_count, 10);
    assert_eq!(r.matched_count, 1);
    assert_eq!(r.modified_count, 1);
    assert_eq!(r.deleted_count, 1);
    assert_eq!(cluster.count_on_shards(DB, "a"), 5);
    assert_eq!(cluster.count_on_shards(DB, "b"), 4);
    cluster.stop().await;
}
