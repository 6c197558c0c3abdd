//! Aggregation pipelines against an oracle. Random documents (ints, strings, small arrays,
//! nested documents, nulls and missing fields) go into `pd.c`, sharded on `{_id: "hashed"}` over
//! 3 embedded shards through the router, and into ONE embedded shard alone, the oracle; small
//! foreign collections `pd.fu` (unsharded) and `pd.fs` (sharded on `{_id: "hashed"}`) hold the
//! same documents on both, for `$lookup` and `$unionWith`. Random pipelines (proptest: seeded,
//! shrinking) from a grammar of the stages applications use run on both, and the router must
//! answer what the one shard answers:
//!
//! - exactly, in order, when the pipeline fixes the order of its output (it ends in a total
//!   sort: one whose last key is `_id` while `_id` is still unique, and only order-keeping
//!   stages after it);
//! - as sorted multisets otherwise (arrays whose order the pipeline leaves open, `$push` and
//!   `$addToSet` without a total sort before them, the joined documents of a `$lookup`, are
//!   sorted by a `$sortArray` stage the generator adds, so no order is compared that mongod
//!   does not define);
//! - by code when either fails (a pipeline holds at most one stage that can fail, so the code
//!   does not depend on which document a shard reaches first).
//!
//! `$skip`, `$limit`, `$first`, `$last` and `$push` (unsorted) appear only after a total sort:
//! before one, mongod itself leaves open which documents they see.
//!
//! `PROPTEST_CASES` (default 512) and `SLUICE_PIPELINE_SEED` (default fixed) size a run; a
//! failing case is shrunk to a minimal one and reported with the seed.

mod common;

use bson::{doc, Bson, Document};
use common::TestCluster;
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngSeed, TestCaseError, TestRunner};
use sluice::embedded::EmbeddedShard;

const DB: &str = "pd";

// ---------------------------------------------------------------------------------------------
// Documents
// ---------------------------------------------------------------------------------------------

fn small_int() -> BoxedStrategy<Bson> {
    (0..4i32).prop_map(Bson::Int32).boxed()
}

/// A main-collection document: `a` of mixed types, `b` numeric, `s` a string, `arr` an array,
/// `n` a nested document; each may be missing or null.
fn main_doc(id: i32) -> BoxedStrategy<Document> {
    let a = prop::option::of(prop_oneof![
        3 => small_int(),
        1 => prop::sample::select(vec!["x", "y"]).prop_map(|s| Bson::String(s.into())),
        1 => Just(Bson::Null),
        1 => Just(Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)])),
    ]);
    let b = prop::option::of(prop_oneof![4 => small_int(), 1 => Just(Bson::Null)]);
    let s = prop::option::of(prop::sample::select(vec!["x", "y", "zz"]));
    let arr = prop::option::of(prop::collection::vec(small_int(), 0..4));
    let n = prop::option::of(prop_oneof![
        3 => (small_int(), prop::option::of(prop::sample::select(vec!["p", "q"])))
            .prop_map(|(x, y)| {
                let mut d = doc! {"x": x};
                if let Some(y) = y {
                    d.insert("y", y);
                }
                Bson::Document(d)
            }),
        1 => Just(Bson::Null),
    ]);
    (a, b, s, arr, n)
        .prop_map(move |(a, b, s, arr, n)| {
            let mut d = doc! {"_id": id};
            if let Some(v) = a {
                d.insert("a", v);
            }
            if let Some(v) = b {
                d.insert("b", v);
            }
            if let Some(v) = s {
                d.insert("s", v);
            }
            if let Some(v) = arr {
                d.insert("arr", v);
            }
            if let Some(v) = n {
                d.insert("n", v);
            }
            d
        })
        .boxed()
}

fn main_docs() -> BoxedStrategy<Vec<Document>> {
    (0usize..16)
        .prop_flat_map(|len| (0..len as i32).map(main_doc).collect::<Vec<_>>())
        .boxed()
}

/// A foreign document: `k` joins on the main documents' `b`.
fn foreign_docs() -> BoxedStrategy<Vec<Document>> {
    prop::collection::vec((prop::option::of(0..4i32), 0..10i32), 0..6)
        .prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (k, val))| {
                    let mut d = doc! {"_id": 100 + i as i32};
                    if let Some(k) = k {
                        d.insert("k", k);
                    }
                    d.insert("v", val);
                    d
                })
                .collect()
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Pipelines: built from a list of choices, so proptest shrinks the choices
// ---------------------------------------------------------------------------------------------

/// What the stages so far leave: whether the output order is fixed, whether `_id` is unique,
/// whether a stage that can fail was used.
#[derive(Clone, Copy)]
struct State {
    ordered: bool,
    unique_id: bool,
    risky: bool,
}

fn pick<T: Clone>(items: &[T], r: u8) -> T {
    items[r as usize % items.len()].clone()
}

/// An expression over the main documents' fields.
fn expr(r: u8, r2: u8, st: &mut State) -> Bson {
    let leaf = |r: u8| -> Bson {
        pick(
            &[
                Bson::String("$b".into()),
                Bson::String("$n.x".into()),
                Bson::Int32(2),
                Bson::String("$b".into()),
            ],
            r,
        )
    };
    match r % 14 {
        0 => Bson::Document(doc! {"$add": [leaf(r2), 1]}),
        1 => Bson::Document(doc! {"$multiply": [leaf(r2), leaf(r2 / 4)]}),
        2 => Bson::Document(doc! {"$subtract": [leaf(r2), "$b"]}),
        3 => Bson::Document(doc! {"$concat": ["$s", "-", {"$ifNull": ["$n.y", "none"]}]}),
        4 => Bson::Document(doc! {"$toUpper": "$s"}),
        5 => Bson::Document(doc! {"$size": {"$ifNull": ["$arr", []]}}),
        6 => Bson::Document(
            doc! {"$filter": {"input": {"$ifNull": ["$arr", []]}, "cond": {"$gte": ["$$this", leaf(r2)]}}},
        ),
        7 => Bson::Document(
            doc! {"$map": {"input": {"$ifNull": ["$arr", []]}, "in": {"$add": ["$$this", 1]}}},
        ),
        8 => Bson::Document(
            doc! {"$cond": {"if": {"$gt": ["$b", 1]}, "then": "big", "else": {"$ifNull": ["$a", "none"]}}},
        ),
        9 => Bson::Document(doc! {"$type": "$a"}),
        10 => Bson::Document(doc! {"$arrayElemAt": [{"$ifNull": ["$arr", []]}, (r2 % 3) as i32]}),
        11 => Bson::Document(
            doc! {"$switch": {"branches": [{"case": {"$eq": ["$s", "x"]}, "then": 1}], "default": "$b"}},
        ),
        12 if !st.risky => {
            // Fails (code 2) where `b` is 0: the one failing expression.
            st.risky = true;
            Bson::Document(doc! {"$divide": [10, "$b"]})
        }
        12 => Bson::Document(doc! {"$in": [leaf(r2), {"$ifNull": ["$arr", []]}]}),
        _ => Bson::Document(doc! {"$concatArrays": [{"$ifNull": ["$arr", []]}, [leaf(r2)]]}),
    }
}

fn match_stage(r: u8, r2: u8, st: &mut State) -> Document {
    let v = (r2 % 4) as i32;
    let m = match r % 11 {
        0 => doc! {"a": {"$gt": v}},
        1 => doc! {"b": {"$in": [v, Bson::Null]}},
        2 => doc! {"n": {"$exists": r2 % 2 == 0}},
        3 => doc! {"n.x": {"$lte": v}},
        4 => doc! {"arr": v},
        5 => doc! {"$expr": {"$gt": ["$b", "$n.x"]}},
        6 => doc! {"s": {"$in": ["x", "zz"]}},
        7 => doc! {"$expr": {"$lt": [expr(r2, r2 / 3, st), 3]}},
        8 => doc! {"a": {"$ne": "x"}, "b": {"$gte": 1}},
        9 => doc! {"$or": [{"a": v}, {"s": "y"}]},
        _ => doc! {"b": {"$exists": false}},
    };
    doc! {"$match": m}
}

/// Sorts an array field whose order the pipeline leaves open.
fn sort_array(field: &str, by: Bson) -> Document {
    let mut set = Document::new();
    set.insert(
        field,
        doc! {"$sortArray": {"input": format!("${field}"), "sortBy": by}},
    );
    doc! {"$set": set}
}

fn group_stage(r: u8, r2: u8, st: &mut State, out: &mut Vec<Document>) {
    // `a` may hold an array: wrapped in a document, so a sort on the group `_id` compares the
    // whole value and is total (an array `_id` sorts by its smallest or largest element and
    // can tie with a scalar).
    let key = pick(
        &[
            Bson::Document(doc! {"a": "$a"}),
            Bson::String("$s".into()),
            Bson::Null,
            Bson::Document(doc! {"s": "$s", "big": {"$gt": ["$b", 1]}}),
            Bson::String("$n.x".into()),
        ],
        r,
    );
    let mut g = doc! {"_id": key};
    let accs: Vec<(&str, Document)> = vec![
        ("b", doc! {"$sum": "$b"}),
        ("avg", doc! {"$avg": "$b"}),
        ("mn", doc! {"$min": "$a"}),
        ("mx", doc! {"$max": "$n.x"}),
        ("c", doc! {"$count": {}}),
        ("set", doc! {"$addToSet": "$s"}),
        ("arr", doc! {"$push": "$b"}),
        ("fst", doc! {"$first": "$a"}),
        ("lst", doc! {"$last": "$s"}),
        ("ones", doc! {"$sum": 1}),
    ];
    let mut sorted = Vec::new();
    for (i, (name, acc)) in accs.into_iter().enumerate() {
        if (r2 >> (i % 8)) & 1 == 0 && i != 9 {
            continue;
        }
        let order_bound = matches!(name, "fst" | "lst" | "arr");
        if order_bound && !st.ordered {
            if name != "arr" {
                continue;
            }
            sorted.push(name);
        }
        if name == "set" {
            sorted.push(name);
        }
        g.insert(name, acc);
    }
    out.push(doc! {"$group": g});
    for f in sorted {
        out.push(sort_array(f, Bson::Int32(1)));
    }
    st.ordered = false;
    st.unique_id = true;
}

fn sort_stage(r: u8, st: &mut State) -> Document {
    let lead = pick(&["a", "b", "n.x", "s", "arr"], r);
    let dir = if r % 2 == 0 { 1 } else { -1 };
    let mut spec = Document::new();
    if r % 5 != 4 {
        spec.insert(lead, dir);
    }
    spec.insert("_id", if r % 3 == 0 { -1 } else { 1 });
    st.ordered = st.unique_id;
    doc! {"$sort": spec}
}

fn lookup_stage(r: u8, r2: u8, out: &mut Vec<Document>) {
    let from = if r2 % 2 == 0 { "fu" } else { "fs" };
    if r % 2 == 0 {
        out.push(
            doc! {"$lookup": {"from": from, "localField": "b", "foreignField": "k", "as": "j"}},
        );
        out.push(sort_array("j", Bson::Document(doc! {"_id": 1})));
    } else {
        out.push(doc! {"$lookup": {
            "from": from,
            "let": {"bb": "$b"},
            "pipeline": [
                {"$match": {"$expr": {"$eq": ["$k", "$$bb"]}}},
                {"$project": {"_id": 1, "v": 1}},
                {"$sort": {"_id": 1}},
            ],
            "as": "j",
        }});
    }
}

/// A sub-pipeline of `$facet`: a few simple stages, then one that fixes its output.
fn facet_branch(choices: &[(u8, u8, u8)], st: &mut State) -> Vec<Bson> {
    let mut out = Vec::new();
    let mut local = State {
        ordered: false,
        ..*st
    };
    for &(kind, r, r2) in choices {
        match kind % 3 {
            0 => out.push(match_stage(r, r2, &mut local)),
            1 => out.push(doc! {"$set": {"e": expr(r, r2, &mut local)}}),
            _ => {
                out.push(doc! {"$unwind": "$arr"});
                local.unique_id = false;
            }
        }
    }
    let last = choices.last().map(|c| c.1).unwrap_or(0);
    if local.unique_id && last % 3 == 0 {
        out.push(doc! {"$sort": {"_id": 1}});
        out.push(doc! {"$limit": 3});
    } else if last % 3 == 1 {
        out.push(doc! {"$count": "n"});
    } else {
        out.push(doc! {"$group": {"_id": "$s", "c": {"$sum": 1}, "t": {"$sum": "$b"}}});
        out.push(doc! {"$sort": {"_id": 1}});
    }
    st.risky = local.risky;
    out.into_iter().map(Bson::Document).collect()
}

/// A pipeline from a list of choices (kind, r, r2): the state decides which stages may follow.
fn build(choices: &[(u8, u8, u8)]) -> (Vec<Document>, bool) {
    let mut st = State {
        ordered: false,
        unique_id: true,
        risky: false,
    };
    let mut out: Vec<Document> = Vec::new();
    let mut i = 0;
    while i < choices.len() {
        let (kind, r, r2) = choices[i];
        i += 1;
        match kind % 20 {
            0 | 1 => out.push(match_stage(r, r2, &mut st)),
            2 => {
                let e = expr(r, r2, &mut st);
                out.push(doc! {"$addFields": {"e": e}});
            }
            3 => {
                let e = expr(r2, r, &mut st);
                out.push(doc! {"$set": {"b": e}});
            }
            4 => {
                let e = expr(r, r2, &mut st);
                if r2 % 3 == 0 {
                    out.push(doc! {"$project": {"_id": 0, "a": 1, "s": 1, "e": e}});
                    st.unique_id = false;
                } else {
                    out.push(doc! {"$project": {"a": 1, "b": 1, "arr": 1, "e": e}});
                }
            }
            5 | 6 => group_stage(r, r2, &mut st, &mut out),
            7 | 8 => out.push(sort_stage(r, &mut st)),
            9 if st.ordered => out.push(doc! {"$skip": (r % 4) as i32}),
            10 if st.ordered => out.push(doc! {"$limit": (r % 6) as i32 + 1}),
            9 | 10 => out.push(sort_stage(r, &mut st)),
            11 => {
                let spec = match r % 3 {
                    0 => Bson::String("$arr".into()),
                    1 => Bson::Document(
                        doc! {"path": "$arr", "includeArrayIndex": "i", "preserveNullAndEmptyArrays": r2 % 2 == 0},
                    ),
                    _ => Bson::Document(doc! {"path": "$arr", "preserveNullAndEmptyArrays": true}),
                };
                out.push(doc! {"$unwind": spec});
                // Each document's elements stay in place: the order stays as fixed as it was.
                st.unique_id = false;
            }
            12 => {
                out.push(doc! {"$count": "total"});
                st.unique_id = true;
                st.ordered = true;
            }
            13 => {
                out.push(doc! {"$sortByCount": pick(&[Bson::Document(doc! {"$type": "$a"}), Bson::String("$s".into()), Bson::String("$n.x".into())], r)});
                st.unique_id = true;
                st.ordered = false;
            }
            14 => {
                out.push(doc! {"$bucket": {
                    "groupBy": "$b",
                    "boundaries": [0, 2, 5],
                    "default": "other",
                    "output": {"c": {"$sum": 1}, "ss": {"$addToSet": "$s"}},
                }});
                out.push(sort_array("ss", Bson::Int32(1)));
                st.unique_id = true;
                st.ordered = false;
            }
            15 => {
                if r % 3 == 0 && !st.risky {
                    // Fails (40228) on a document whose `n` is not a document.
                    st.risky = true;
                    out.push(doc! {"$replaceRoot": {"newRoot": "$n"}});
                    st.unique_id = false;
                } else {
                    out.push(doc! {"$replaceWith": {"$mergeObjects": [
                        {"_id": "$_id", "b": "$b"},
                        {"$ifNull": ["$n", {}]},
                    ]}});
                }
                st.ordered = false;
            }
            16 => {
                let take = 1 + (r as usize % 3);
                let a = &choices[i..(i + take).min(choices.len())];
                i = (i + take).min(choices.len());
                let b = &choices[i..(i + 1).min(choices.len())];
                i = (i + 1).min(choices.len());
                let fa = facet_branch(a, &mut st);
                let fb = facet_branch(b, &mut st);
                out.push(doc! {"$facet": {"one": fa, "two": fb}});
                st.unique_id = true;
                st.ordered = true;
            }
            17 => lookup_stage(r, r2, &mut out),
            18 => {
                let coll = if r % 2 == 0 { "fu" } else { "fs" };
                out.push(doc! {"$unionWith": {
                    "coll": coll,
                    "pipeline": [{"$project": {"b": "$k", "s": "u", "arr": ["$v"]}}],
                }});
                st.unique_id = false;
                st.ordered = false;
            }
            _ if st.unique_id => {
                let mut output = doc! {
                    "rn": {"$documentNumber": {}},
                    "run": {"$sum": "$b", "window": {"documents": ["unbounded", "current"]}},
                };
                if r2 % 2 == 0 {
                    output.insert(
                        "mv",
                        doc! {"$max": "$n.x", "window": {"documents": [-1, 1]}},
                    );
                }
                let mut spec = doc! {"sortBy": {"_id": 1}, "output": output};
                if r % 2 == 0 {
                    spec.insert("partitionBy", "$s");
                }
                out.push(doc! {"$setWindowFields": spec});
                st.ordered = false;
            }
            _ => out.push(match_stage(r, r2, &mut st)),
        }
    }
    (out, st.ordered)
}

#[derive(Clone)]
struct Case {
    docs: Vec<Document>,
    foreign: Vec<Document>,
    choices: Vec<(u8, u8, u8)>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (pipeline, ordered) = build(&self.choices);
        writeln!(f, "documents: {}", as_array(&self.docs))?;
        writeln!(f, "foreign: {}", as_array(&self.foreign))?;
        write!(f, "pipeline (ordered {ordered}): {}", as_array(&pipeline))
    }
}

fn as_array(docs: &[Document]) -> Bson {
    Bson::Array(docs.iter().cloned().map(Bson::Document).collect())
}

fn case() -> BoxedStrategy<Case> {
    (
        main_docs(),
        foreign_docs(),
        prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..6),
    )
        .prop_map(|(docs, foreign, choices)| Case {
            docs,
            foreign,
            choices,
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------------

/// A pipeline's result: its documents (sorted unless the pipeline fixes their order), or the
/// code it failed with and the message (not compared).
enum Outcome {
    Docs(Vec<String>),
    Failed(i32, String),
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Docs(d) => write!(f, "{d:?}"),
            Outcome::Failed(code, message) => write!(f, "failed with {code}: {message}"),
        }
    }
}

impl PartialEq for Outcome {
    fn eq(&self, other: &Outcome) -> bool {
        match (self, other) {
            (Outcome::Docs(a), Outcome::Docs(b)) => a == b,
            (Outcome::Failed(a, _), Outcome::Failed(b, _)) => a == b,
            _ => false,
        }
    }
}

fn failed(e: &mongodb::error::Error) -> Outcome {
    let message = match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => c.message.clone(),
        _ => e.to_string(),
    };
    Outcome::Failed(common::error_code(e), message)
}

struct Env {
    rt: tokio::runtime::Runtime,
    cluster: TestCluster,
    router: mongodb::Client,
    oracle: EmbeddedShard,
    one: mongodb::Client,
    /// Cases compared exactly, as multisets, and those where both failed.
    exact: u64,
    sets: u64,
    failed: u64,
}

fn canonical(d: &Document) -> String {
    Bson::Document(d.clone())
        .into_canonical_extjson()
        .to_string()
}

async fn fill(client: &mongodb::Client, case: &Case) {
    let db = client.database(DB);
    for (coll, docs) in [
        ("c", &case.docs),
        ("fu", &case.foreign),
        ("fs", &case.foreign),
    ] {
        let c = db.collection::<Document>(coll);
        c.delete_many(doc! {}).await.expect("empties");
        if !docs.is_empty() {
            c.insert_many(docs.to_vec()).await.expect("fills");
        }
    }
}

async fn run(client: &mongodb::Client, pipeline: &[Document], ordered: bool) -> Outcome {
    let coll = client.database(DB).collection::<Document>("c");
    let mut cursor = match coll.aggregate(pipeline.to_vec()).await {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    let mut out = Vec::new();
    loop {
        match cursor.advance().await {
            Ok(true) => out.push(canonical(&cursor.deserialize_current().expect("document"))),
            Ok(false) => break,
            Err(e) => return failed(&e),
        }
    }
    if !ordered {
        out.sort();
    }
    Outcome::Docs(out)
}

impl Env {
    fn start() -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (cluster, router, oracle, one) = rt.block_on(async {
            let cluster = TestCluster::start(
                3,
                &[
                    ("pd.c", doc! {"_id": "hashed"}),
                    ("pd.fs", doc! {"_id": "hashed"}),
                ],
            )
            .await;
            let router = common::driver(cluster.addr(), "").await;
            let oracle = EmbeddedShard::start("127.0.0.1:0", Default::default())
                .await
                .expect("oracle");
            let one = common::direct(oracle.local_addr()).await;
            (cluster, router, oracle, one)
        });
        Env {
            rt,
            cluster,
            router,
            oracle,
            one,
            exact: 0,
            sets: 0,
            failed: 0,
        }
    }

    fn check(&mut self, case: &Case) -> Result<(), String> {
        let (pipeline, ordered) = build(&case.choices);
        let (routed, alone) = self.rt.block_on(async {
            fill(&self.router, case).await;
            fill(&self.one, case).await;
            (
                run(&self.router, &pipeline, ordered).await,
                run(&self.one, &pipeline, ordered).await,
            )
        });
        match &alone {
            Outcome::Failed(..) => self.failed += 1,
            _ if ordered => self.exact += 1,
            _ => self.sets += 1,
        }
        if routed == alone {
            Ok(())
        } else {
            Err(format!(
                "the router answered\n  {routed:?}\none shard answered\n  {alone:?}"
            ))
        }
    }

    fn stop(self) {
        let Env {
            rt,
            cluster,
            oracle,
            ..
        } = self;
        rt.block_on(async {
            cluster.stop().await;
            oracle.shutdown().await;
        });
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn router_matches_one_shard_on_random_pipelines() {
    let cases = env_number("PROPTEST_CASES", 512) as u32;
    let seed = env_number("SLUICE_PIPELINE_SEED", 0x0919_5eed);
    let started = std::time::Instant::now();
    let env = std::cell::RefCell::new(Env::start());
    let mut runner = TestRunner::new(PtConfig {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 500,
        ..PtConfig::default()
    });
    let result = runner.run(&case(), |c| {
        env.borrow_mut().check(&c).map_err(TestCaseError::fail)
    });
    let env = env.into_inner();
    eprintln!(
        "{cases} pipelines, seed {seed:#x}: {} compared in order, {} as multisets, {} failed on both, in {:.1} s",
        env.exact,
        env.sets,
        env.failed,
        started.elapsed().as_secs_f64()
    );
    let (exact, sets) = (env.exact, env.sets);
    env.stop();
    if let Err(e) = result {
        panic!("seed {seed:#x}: {e}");
    }
    if cases >= 64 {
        assert!(
            exact > 0 && sets > 0,
            "the generator never fixed (or never left open) the order"
        );
    }
}
