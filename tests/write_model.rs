//! The property of docs/design/write-path.md section 7: random bulks over random chunk maps,
//! executed once with the proven rewrite and once as mongos rounds against the same model store.
//! With no failure both leave the same state and reply alike; with injected (transient) failures
//! the replies are still identical, and after the application's usual recovery (resend from the
//! failed index onward; skip a statement that fails permanently) the final states are equal.
//!
//! The executor under test is the real one (`sluice::write::run_write`) with the real targeting,
//! planner and merger; only the shards are a model: a map `_id -> value` per shard that
//! answers child batches the way mongod does (per-child `n`, `nModified`, `upserted`,
//! `writeErrors`, ordered children stopping at their first error, retryable-write records).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use bson::{doc, oid::ObjectId, Bson, Document};
use proptest::prelude::*;
use sluice::routing::{Chunk, ChunkVersion, RoutingSnapshot, ShardKey, ShardKeyPattern};
use sluice::write::merge::{ChildOutcome, ChildResult};
use sluice::write::plan::{PlanKind, Policy};
use sluice::write::target::{self, Targeted, WriteKind};
use sluice::write::{run_write, ChildSender, WriteSpec, WriteStats};

#[derive(Debug, Clone)]
enum Stmt {
    Insert {
        id: i32,
        v: i32,
    },
    /// A replacement upsert by `_id` (the analysis's workload).
    Upsert {
        id: i32,
        v: i32,
    },
    /// `$set` by `_id`, no upsert.
    Set {
        id: i32,
        v: i32,
    },
    Delete {
        id: i32,
    },
}

impl Stmt {
    fn target(&self, snap: &RoutingSnapshot) -> Targeted {
        match self {
            Stmt::Insert { id, v } => {
                let raw = bson::rawdoc! {"_id": *id, "v": *v};
                target::target_insert(snap, &raw, true)
            }
            Stmt::Upsert { id, v } => target::target_update(
                snap,
                &doc! {"q": {"_id": *id}, "u": {"v": *v}, "upsert": true},
            ),
            Stmt::Set { id, v } => {
                target::target_update(snap, &doc! {"q": {"_id": *id}, "u": {"$set": {"v": *v}}})
            }
            Stmt::Delete { id } => {
                target::target_delete(snap, &doc! {"q": {"_id": *id}, "limit": 1})
            }
        }
    }
}

type State = BTreeMap<String, BTreeMap<i32, i32>>;

/// The shards that hold documents (a shard emptied again compares equal to one never written).
fn occupied(s: &State) -> State {
    s.iter()
        .filter(|(_, docs)| !docs.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A statement's recorded result: n, nModified, upserted _id.
type StmtRecord = (i64, i64, Option<Bson>);

/// The model shards, with retryable-write records and transient failures.
struct Model {
    kind: WriteKind,
    stmts: Vec<Stmt>,
    state: Mutex<State>,
    transient: Mutex<BTreeSet<usize>>,
    records: Mutex<BTreeMap<usize, StmtRecord>>,
}

impl Model {
    /// Applies one statement; `Ok((n, nModified, upserted))` or a permanent error code.
    fn apply(&self, shard: &str, i: usize) -> Result<StmtRecord, i32> {
        let mut state = self.state.lock().unwrap();
        let docs = state.entry(shard.to_string()).or_default();
        match &self.stmts[i] {
            Stmt::Insert { id, v } => {
                if docs.contains_key(id) {
                    return Err(11000);
                }
                docs.insert(*id, *v);
                Ok((1, 0, None))
            }
            Stmt::Upsert { id, v } => match docs.insert(*id, *v) {
                Some(old) => Ok((1, (old != *v) as i64, None)),
                None => Ok((1, 0, Some(Bson::Int32(*id)))),
            },
            Stmt::Set { id, v } => match docs.get_mut(id) {
                Some(old) => {
                    let changed = *old != *v;
                    *old = *v;
                    Ok((1, changed as i64, None))
                }
                None => Ok((0, 0, None)),
            },
            Stmt::Delete { id } => Ok((docs.remove(id).is_some() as i64, 0, None)),
        }
    }
}

impl ChildSender for Model {
    fn run_shard<'a>(
        &'a self,
        _snap: &'a RoutingSnapshot,
        shard: &'a str,
        statements: Vec<usize>,
        ordered: bool,
    ) -> sluice::frontend::BoxFuture<'a, Vec<ChildResult>> {
        Box::pin(async move {
            let (mut n, mut n_mod) = (0i64, 0i64);
            let mut upserted = Vec::new();
            let mut errors = Vec::new();
            for (ci, &i) in statements.iter().enumerate() {
                let recorded = self.records.lock().unwrap().get(&i).cloned();
                let result = match recorded {
                    Some(r) => Ok(r),
                    None if self.transient.lock().unwrap().remove(&i) => Err(2),
                    None => self.apply(shard, i),
                };
                match result {
                    Ok((sn, sm, su)) => {
                        self.records.lock().unwrap().insert(i, (sn, sm, su.clone()));
                        n += sn;
                        n_mod += sm;
                        if let Some(id) = su {
                            upserted.push(Bson::Document(doc! {"index": ci as i32, "_id": id}));
                        }
                    }
                    Err(code) => {
                        errors.push(Bson::Document(doc! {"index": ci as i32, "code": code, "errmsg": format!("error {code}")}));
                        if ordered {
                            break;
                        }
                    }
                }
            }
            let mut reply = doc! {"n": n as i32};
            if self.kind == WriteKind::Update {
                reply.insert("nModified", n_mod as i32);
            }
            if !upserted.is_empty() {
                reply.insert("upserted", upserted);
            }
            if !errors.is_empty() {
                reply.insert("writeErrors", errors);
            }
            reply.insert("ok", 1.0);
            vec![ChildResult {
                shard: shard.to_string(),
                statements,
                ordered,
                outcome: ChildOutcome::Reply(reply),
            }]
        })
    }

    /// Removes each inserted document while it still holds the value inserted, as the router
    /// does on its shards.
    fn undo_inserts<'a>(
        &'a self,
        snap: &'a RoutingSnapshot,
        statements: Vec<usize>,
    ) -> sluice::frontend::BoxFuture<'a, Vec<usize>> {
        Box::pin(async move {
            let mut state = self.state.lock().unwrap();
            let mut left = Vec::new();
            for i in statements {
                let Stmt::Insert { id, v } = &self.stmts[i] else {
                    left.push(i);
                    continue;
                };
                let key = ShardKey(vec![Bson::Int64(sluice::routing::hash64(&Bson::Int32(
                    *id,
                )))]);
                let shard = snap.shard_for(&key).unwrap().to_string();
                let docs = state.entry(shard).or_default();
                if docs.get(id) == Some(v) {
                    docs.remove(id);
                } else {
                    left.push(i);
                }
            }
            left
        })
    }
}

fn snapshot(splits: &[i64], owners: &[usize], shards: usize) -> RoutingSnapshot {
    let pattern = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).unwrap();
    let mut bounds = vec![pattern.min_key()];
    bounds.extend(splits.iter().map(|s| ShardKey(vec![Bson::Int64(*s)])));
    bounds.push(pattern.max_key());
    let chunks: Vec<Chunk> = bounds
        .windows(2)
        .enumerate()
        .map(|(i, w)| Chunk {
            id: ObjectId::new(),
            min: w[0].clone(),
            max: w[1].clone(),
            shard: format!("s{}", owners[i % owners.len()] % shards),
            version: ChunkVersion {
                major: 1,
                minor: i as u32,
            },
        })
        .collect();
    RoutingSnapshot::with_chunks("d.c", pattern, chunks).unwrap()
}

/// Runs `stmts` once under `policy`; returns the reply, the plan and the state.
fn execute(
    kind: WriteKind,
    stmts: &[Stmt],
    snap: &Arc<RoutingSnapshot>,
    initial: &State,
    transient: &BTreeSet<usize>,
    policy: Policy,
) -> (Document, Option<PlanKind>, State) {
    let model = Model {
        kind,
        stmts: stmts.to_vec(),
        state: Mutex::new(initial.clone()),
        transient: Mutex::new(transient.clone()),
        records: Mutex::new(BTreeMap::new()),
    };
    let spec = WriteSpec {
        kind,
        ordered: true,
        policy,
        retryable: true,
        statements: stmts.len(),
        ns: "d.c".into(),
    };
    let stats = WriteStats::default();
    let target = |s: &RoutingSnapshot, i: usize| stmts[i].target(s);
    let refresh = |_: Vec<Document>| -> sluice::frontend::BoxFuture<'_, _> {
        let s = snap.clone();
        Box::pin(async move { Some(sluice::write::Retarget::Sharded(s)) })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let outcome = rt.block_on(run_write(
        &spec,
        &model,
        &target,
        snap.clone(),
        &refresh,
        &stats,
    ));
    let state = model.state.lock().unwrap().clone();
    (outcome.merger.reply(), outcome.plan, state)
}

/// The application's recovery from an ordered error: resend from the failed index (after a
/// transient error) or from the next one (after a permanent error), until the bulk completes.
fn recover(
    kind: WriteKind,
    stmts: &[Stmt],
    snap: &Arc<RoutingSnapshot>,
    mut state: State,
    mut reply: Document,
    policy: Policy,
) -> State {
    let mut offset = 0usize;
    let mut guard = 0;
    while let Ok(errors) = reply.get_array("writeErrors") {
        let e = errors[0].as_document().unwrap();
        let index = offset + e.get_i32("index").unwrap() as usize;
        let permanent = e.get_i32("code").unwrap() == 11000;
        offset = if permanent { index + 1 } else { index };
        if offset >= stmts.len() {
            break;
        }
        let (r, _, s) = execute(
            kind,
            &stmts[offset..],
            snap,
            &state,
            &BTreeSet::new(),
            policy,
        );
        reply = r;
        state = s;
        guard += 1;
        assert!(guard <= stmts.len() + 1, "recovery terminates");
    }
    state
}

fn bulk_strategy() -> impl Strategy<Value = (u8, Vec<(i32, i32, u8)>)> {
    (
        0u8..3,
        prop::collection::vec((1i32..4, 0i32..3, 0u8..2), 1..30),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn rewrite_is_indistinguishable_from_mongos_rounds(
        (kind_sel, raw) in bulk_strategy(),
        shards in 1usize..5,
        splits in prop::collection::btree_set(any::<i64>(), 0..8),
        owners in prop::collection::vec(0usize..5, 1..9),
        present in prop::collection::btree_set(0i32..100, 0..30),
        transient_sel in prop::collection::btree_set(0usize..30, 0..3),
    ) {
        // Distinct identities by construction: increasing _ids.
        let mut id = 0;
        let kind = [WriteKind::Insert, WriteKind::Update, WriteKind::Delete][kind_sel as usize];
        let stmts: Vec<Stmt> = raw.iter().map(|(step, v, flavour)| {
            id += step;
            match kind {
                WriteKind::Insert => Stmt::Insert { id, v: *v },
                WriteKind::Update if *flavour == 0 => Stmt::Upsert { id, v: *v },
                WriteKind::Update => Stmt::Set { id, v: *v },
                WriteKind::Delete => Stmt::Delete { id },
            }
        }).collect();
        let splits: Vec<i64> = splits.into_iter().collect();
        let snap = Arc::new(snapshot(&splits, &owners, shards));
        // The initial documents, each on the shard that owns its _id.
        let mut initial: State = BTreeMap::new();
        for p in &present {
            let key = ShardKey(vec![Bson::Int64(sluice::routing::hash64(&Bson::Int32(*p)))]);
            let shard = snap.shard_for(&key).unwrap().to_string();
            initial.entry(shard).or_default().insert(*p, 7);
        }
        let transient: BTreeSet<usize> = transient_sel.into_iter().filter(|t| *t < stmts.len()).collect();

        let (r1, p1, s1) = execute(kind, &stmts, &snap, &initial, &transient, Policy::RetrySafe);
        let (r2, p2, s2) = execute(kind, &stmts, &snap, &initial, &transient, Policy::Off);
        prop_assert_eq!(p1, Some(PlanKind::Rewrite), "distinct, retry-safe, single-shard statements are rewritten");
        prop_assert_eq!(p2, Some(PlanKind::MongosRounds));
        prop_assert_eq!(&r1, &r2, "identical replies");
        if !r1.contains_key("writeErrors") || kind == WriteKind::Insert {
            // Inserts applied after an error are undone: the collection ends as mongos rounds
            // leave it even before any recovery.
            prop_assert_eq!(occupied(&s1), occupied(&s2), "identical final state");
        } else {
            let f1 = recover(kind, &stmts, &snap, s1, r1, Policy::RetrySafe);
            let f2 = recover(kind, &stmts, &snap, s2, r2, Policy::Off);
            prop_assert_eq!(occupied(&f1), occupied(&f2), "identical final state after the application's recovery");
        }
    }
}

#[test]
fn mongos_round_count_follows_the_formula() {
    // n = 1,000 uniformly hashed _ids over S shards with 2 chunks each: the expected number of
    // mongos rounds is 1 + (n - 1)(1 - 1/S); the rewrite uses one round.
    for shards in [2usize, 3, 5, 8] {
        let pattern = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).unwrap();
        let ids: Vec<String> = (0..shards).map(|i| format!("s{i}")).collect();
        let chunks = sluice::routing::chunks::initial_chunks(&pattern, &ids, "s0", None);
        let snap = RoutingSnapshot::with_chunks("d.c", pattern, chunks).unwrap();
        let stmts: Vec<Stmt> = (0..1000).map(|i| Stmt::Upsert { id: i, v: 1 }).collect();
        let targeted: Vec<Targeted> = stmts.iter().map(|s| s.target(&snap)).collect();
        let indexed: Vec<(usize, &Targeted)> = targeted.iter().enumerate().collect();
        let rounds =
            sluice::write::plan::plan(&indexed, true, Policy::Off, true).send_rounds() as f64;
        let p = 1.0 - 1.0 / shards as f64;
        let expected = 1.0 + 999.0 * p;
        let sigma = (999.0 * p * (1.0 - p)).sqrt();
        assert!(
            (rounds - expected).abs() <= 4.0 * sigma,
            "S={shards}: {rounds} rounds, expected {expected:.1} ± {sigma:.1}"
        );
        assert_eq!(
            sluice::write::plan::plan(&indexed, true, Policy::RetrySafe, true).send_rounds(),
            1
        );
    }
}
