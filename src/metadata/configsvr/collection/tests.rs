use super::*;
use crate::metadata::configsvr::test_support::*;
use crate::metadata::configsvr::version::CollectionGeneration;
use bson::{doc, oid::ObjectId, Bson, Document, Uuid};
use proptest::prelude::*;

const UUID: Uuid = Uuid::from_bytes([5; 16]);

fn pattern_doc() -> Document {
    doc! {"x": 1}
}

fn entry(epoch: ObjectId) -> CollectionEntry {
    CollectionEntry::from_document(
        &collection_doc("db.c", epoch, ts(100, 1), UUID, pattern_doc()),
        &PRINTER,
    )
    .unwrap()
}

fn bound(v: &Bson) -> Document {
    doc! {"x": v.clone()}
}

fn chunk(min: Bson, max: Bson, shard: &str, major: u32, minor: u32) -> ChunkEntry {
    let pattern = ShardKeyPattern::parse(&pattern_doc()).unwrap();
    ChunkEntry::from_document(
        &chunk_doc(UUID, bound(&min), bound(&max), shard, major, minor),
        &pattern,
        "db.c",
        &PRINTER,
    )
    .unwrap()
}

fn l(v: i64) -> Bson {
    Bson::Int64(v)
}

/// Four chunks: (-inf, 0) s0 1|0, [0, 100) s0 1|1, [100, 200) s1 1|2, [200, +inf) s1 1|3.
fn four() -> Vec<ChunkEntry> {
    vec![
        chunk(Bson::MinKey, l(0), "s0", 1, 0),
        chunk(l(0), l(100), "s0", 1, 1),
        chunk(l(100), l(200), "s1", 1, 2),
        chunk(l(200), Bson::MaxKey, "s1", 1, 3),
    ]
}

fn key(v: i64) -> ShardKey {
    ShardKey(vec![l(v)])
}

#[test]
fn full_build_versions_and_lookup() {
    let e = ObjectId::new();
    let chunks = four();
    let r = CollectionRouting::full(entry(e), chunks.clone(), &PRINTER).unwrap();
    assert_eq!(r.collection_version, ChunkVersion { major: 1, minor: 3 });
    assert_eq!(r.version().generation.epoch, e);
    assert_eq!(
        r.shard_version("s0").placement,
        ChunkVersion { major: 1, minor: 1 }
    );
    assert_eq!(
        r.shard_version("s1").placement,
        ChunkVersion { major: 1, minor: 3 }
    );
    assert_eq!(
        r.shard_version("s2").placement,
        ChunkVersion::default(),
        "no chunk: 0|0"
    );
    assert_eq!(r.shard_version("s2").generation, r.entry.generation);
    assert_eq!(r.shards().collect::<Vec<_>>(), vec!["s0", "s1"]);
    assert_eq!(r.snapshot.shard_for(&key(-5)), Some("s0"));
    assert_eq!(r.snapshot.shard_for(&key(150)), Some("s1"));
    assert_eq!(r.snapshot.ns, "db.c");
    assert_eq!(r.snapshot.uuid, UUID);
    // Order of the read does not matter.
    let mut shuffled = chunks;
    shuffled.reverse();
    let again = CollectionRouting::full(entry(e), shuffled, &PRINTER).unwrap();
    assert_eq!(again.snapshot.chunks, r.snapshot.chunks);
}

#[test]
fn coverage_errors_are_mongos_conflicts() {
    let e = ObjectId::new();
    let err =
        |chunks: Vec<ChunkEntry>| CollectionRouting::full(entry(e), chunks, &PRINTER).unwrap_err();
    let mut gap = four();
    gap.remove(1);
    let g = err(gap);
    assert_eq!(g.code, ErrorCode::ConflictingOperationInProgress);
    assert_eq!(
        g.message,
        "Gap exists in the routing table between chunks { x: MinKey } -> { x: 0 } and { x: 100 } -> { x: 200 }"
    );
    let mut overlap = four();
    overlap[2] = chunk(l(50), l(200), "s1", 1, 2);
    // flatten keeps the newer of two overlapping chunks, leaving a gap or an overlap behind.
    let o = err(overlap);
    assert_eq!(o.code, ErrorCode::ConflictingOperationInProgress);
    assert!(
        o.message.contains("exists in the routing table"),
        "{}",
        o.message
    );
    let mut no_min = four();
    no_min.remove(0);
    assert_eq!(
        err(no_min).message,
        "Not all elements of { x: 0 } are of type minKey"
    );
    let mut no_max = four();
    no_max.pop();
    assert_eq!(
        err(no_max).message,
        "Not all elements of { x: 200 } are of type maxKey"
    );
    assert_eq!(
        err(vec![]).message,
        "No chunks were found for the collection db.c"
    );
    let mut foreign = four();
    foreign[0].uuid = Uuid::from_bytes([1; 16]);
    let f = err(foreign);
    assert_eq!(f.code, ErrorCode::ConflictingOperationInProgress);
    assert!(
        f.message.contains("does not belong to collection UUID"),
        "{}",
        f.message
    );
}

#[test]
fn a_migration_applies_incrementally() {
    let e = ObjectId::new();
    let r = CollectionRouting::full(entry(e), four(), &PRINTER).unwrap();
    // [100, 200) moves s1 -> s0 at 2|0; the donor's remaining chunk is bumped to 2|1.
    let changed = vec![
        chunk(l(100), l(200), "s0", 2, 0),
        chunk(l(200), Bson::MaxKey, "s1", 2, 1),
    ];
    let RefreshOutcome::Updated(n) = r.apply_changes(entry(e), changed, &PRINTER).unwrap() else {
        panic!("expected an update");
    };
    assert_eq!(n.collection_version, ChunkVersion { major: 2, minor: 1 });
    assert_eq!(
        n.shard_version("s0").placement,
        ChunkVersion { major: 2, minor: 0 }
    );
    assert_eq!(
        n.shard_version("s1").placement,
        ChunkVersion { major: 2, minor: 1 }
    );
    assert_eq!(n.snapshot.shard_for(&key(150)), Some("s0"));
    assert_eq!(n.snapshot.chunks.len(), 4);
    // The old routing is untouched.
    assert_eq!(r.snapshot.shard_for(&key(150)), Some("s1"));

    // Only the chunk at the cached version comes back: nothing changed.
    let same = vec![chunk(l(200), Bson::MaxKey, "s1", 2, 1)];
    assert!(matches!(
        n.apply_changes(entry(e), same, &PRINTER).unwrap(),
        RefreshOutcome::Unchanged
    ));
}

#[test]
fn splits_and_merges_apply_incrementally() {
    let e = ObjectId::new();
    let r = CollectionRouting::full(entry(e), four(), &PRINTER).unwrap();
    // Split [0, 100) at 50: 1|4 and 1|5.
    let split = vec![
        chunk(l(200), Bson::MaxKey, "s1", 1, 3),
        chunk(l(0), l(50), "s0", 1, 4),
        chunk(l(50), l(100), "s0", 1, 5),
    ];
    let RefreshOutcome::Updated(n) = r.apply_changes(entry(e), split, &PRINTER).unwrap() else {
        panic!("expected an update");
    };
    assert_eq!(n.snapshot.chunks.len(), 5);
    assert_eq!(n.collection_version, ChunkVersion { major: 1, minor: 5 });
    // Merge (-inf, 0) + [0, 50) into one at 1|6.
    let merged = vec![
        chunk(l(50), l(100), "s0", 1, 5),
        chunk(Bson::MinKey, l(50), "s0", 1, 6),
    ];
    let RefreshOutcome::Updated(m) = n.apply_changes(entry(e), merged, &PRINTER).unwrap() else {
        panic!("expected an update");
    };
    assert_eq!(m.snapshot.chunks.len(), 4);
    assert_eq!(m.snapshot.chunks.chunks().next().unwrap().max, key(50));
}

#[test]
fn inconsistent_changes_are_refused() {
    let e = ObjectId::new();
    let r = CollectionRouting::full(entry(e), four(), &PRINTER).unwrap();
    let conflict = |changed: Vec<ChunkEntry>, with: CollectionEntry| {
        let err = r.apply_changes(with, changed, &PRINTER).unwrap_err();
        assert_eq!(err.code, ErrorCode::ConflictingOperationInProgress);
        err.message
    };
    // Older than the cached collection version.
    let m = conflict(vec![chunk(l(0), l(100), "s1", 1, 2)], entry(e));
    assert!(
        m.contains("doesn't have version that's greater or equal"),
        "{m}"
    );
    // A split whose right half was not read: a gap.
    let m = conflict(vec![chunk(l(0), l(50), "s0", 1, 4)], entry(e));
    assert!(m.starts_with("Gap exists"), "{m}");
    // Another generation must be reloaded fully.
    let m = conflict(
        vec![chunk(l(0), l(100), "s0", 1, 4)],
        entry(ObjectId::new()),
    );
    assert!(m.contains("changed generation"), "{m}");
    assert!(conflict(vec![], entry(e)).contains("No chunks were found"));
}

#[test]
fn overlapping_reads_keep_the_newest_chunk() {
    let e = ObjectId::new();
    // A yielding full read saw [0, 100) both before (1|1) and after (1|4 + 1|5) its split, in
    // either order: the older document loses.
    for old_first in [true, false] {
        let mut chunks = four();
        let stale = chunks.remove(1);
        let halves = [
            chunk(l(0), l(50), "s0", 1, 4),
            chunk(l(50), l(100), "s0", 1, 5),
        ];
        if old_first {
            chunks.insert(0, stale);
            chunks.extend(halves);
        } else {
            chunks.extend(halves);
            chunks.push(stale);
        }
        let r = CollectionRouting::full(entry(e), chunks, &PRINTER).unwrap();
        assert_eq!(r.snapshot.chunks.len(), 5);
        assert_eq!(r.collection_version, ChunkVersion { major: 1, minor: 5 });
    }
    // The newer half alone leaves a gap: the read is refused, to be read again.
    let mut chunks = four();
    chunks[1] = chunk(l(50), l(100), "s0", 1, 5);
    chunks.push(chunk(l(0), l(100), "s0", 1, 1));
    let err = CollectionRouting::full(entry(e), chunks, &PRINTER).unwrap_err();
    assert!(err.message.starts_with("Gap exists"), "{}", err.message);
}

// ---- A model of the config server, and the property that incremental refreshes converge. ----

#[derive(Debug, Clone)]
struct ModelChunk {
    min: Bson,
    max: Bson,
    shard: String,
    version: ChunkVersion,
    id: ObjectId,
}

/// The chunks of one collection as a config server changes them: splits and merges raise the
/// minor of the collection version, a migration gives the moved chunk a new major and bumps one
/// chunk left on the donor.
#[derive(Debug, Clone)]
struct Model {
    chunks: Vec<ModelChunk>,
    shards: usize,
}

fn as_i128(v: &Bson) -> i128 {
    match v {
        Bson::MinKey => i128::MIN,
        Bson::MaxKey => i128::MAX,
        Bson::Int64(i) => *i as i128,
        _ => unreachable!("model bounds are MinKey, longs and MaxKey"),
    }
}

impl Model {
    fn new(shards: usize) -> Model {
        Model {
            chunks: vec![ModelChunk {
                min: Bson::MinKey,
                max: Bson::MaxKey,
                shard: "s0".into(),
                version: ChunkVersion { major: 1, minor: 0 },
                id: ObjectId::new(),
            }],
            shards,
        }
    }

    fn version(&self) -> ChunkVersion {
        self.chunks
            .iter()
            .map(|c| c.version)
            .max()
            .unwrap_or_default()
    }

    fn apply(&mut self, op: &Op) {
        let cv = self.version();
        let n = self.chunks.len();
        match *op {
            Op::Split(i, at) => {
                let i = i % n;
                let c = self.chunks[i].clone();
                if !(as_i128(&c.min) < at as i128 && (at as i128) < as_i128(&c.max)) {
                    return;
                }
                let left = ModelChunk {
                    max: l(at),
                    version: ChunkVersion {
                        major: cv.major,
                        minor: cv.minor + 1,
                    },
                    ..c.clone()
                };
                let right = ModelChunk {
                    min: l(at),
                    version: ChunkVersion {
                        major: cv.major,
                        minor: cv.minor + 2,
                    },
                    id: ObjectId::new(),
                    ..c
                };
                self.chunks.splice(i..=i, [left, right]);
            }
            Op::Merge(i) => {
                if n < 2 {
                    return;
                }
                let i = i % (n - 1);
                if self.chunks[i].shard != self.chunks[i + 1].shard {
                    return;
                }
                let merged = ModelChunk {
                    max: self.chunks[i + 1].max.clone(),
                    version: ChunkVersion {
                        major: cv.major,
                        minor: cv.minor + 1,
                    },
                    ..self.chunks[i].clone()
                };
                self.chunks.splice(i..=i + 1, [merged]);
            }
            Op::Move(i, to) => {
                let i = i % n;
                let to = format!("s{}", to % self.shards);
                let donor = self.chunks[i].shard.clone();
                if donor == to {
                    return;
                }
                let major = cv.major + 1;
                self.chunks[i].shard = to;
                self.chunks[i].version = ChunkVersion { major, minor: 0 };
                if let Some(c) = self.chunks.iter_mut().find(|c| c.shard == donor) {
                    c.version = ChunkVersion { major, minor: 1 };
                }
            }
        }
    }

    /// What a refresh reads: chunks with `lastmod ≥ since` (all without), by `lastmod`.
    fn read(&self, since: Option<ChunkVersion>) -> Vec<ChunkEntry> {
        let mut out: Vec<&ModelChunk> = self
            .chunks
            .iter()
            .filter(|c| since.is_none_or(|s| c.version >= s))
            .collect();
        out.sort_by_key(|c| c.version);
        out.into_iter()
            .map(|c| {
                let mut e = chunk(
                    c.min.clone(),
                    c.max.clone(),
                    &c.shard,
                    c.version.major,
                    c.version.minor,
                );
                e.id = c.id;
                e
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
enum Op {
    Split(usize, i64),
    Merge(usize),
    Move(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<usize>(), -1000i64..1000).prop_map(|(i, at)| Op::Split(i, at)),
        any::<usize>().prop_map(Op::Merge),
        (any::<usize>(), any::<usize>()).prop_map(|(i, to)| Op::Move(i, to)),
    ]
}

fn assert_matches_model(r: &CollectionRouting, model: &Model) -> Result<(), TestCaseError> {
    let ours: Vec<(ShardKey, ShardKey, String, ChunkVersion)> = r
        .snapshot
        .chunks
        .chunks()
        .map(|c| (c.min.clone(), c.max.clone(), c.shard.clone(), c.version))
        .collect();
    let theirs: Vec<(ShardKey, ShardKey, String, ChunkVersion)> = model
        .chunks
        .iter()
        .map(|c| {
            (
                ShardKey(vec![c.min.clone()]),
                ShardKey(vec![c.max.clone()]),
                c.shard.clone(),
                c.version,
            )
        })
        .collect();
    prop_assert_eq!(ours, theirs);
    prop_assert_eq!(r.collection_version, model.version());
    for s in 0..model.shards {
        let id = format!("s{s}");
        let want = model
            .chunks
            .iter()
            .filter(|c| c.shard == id)
            .map(|c| c.version)
            .max()
            .unwrap_or_default();
        prop_assert_eq!(r.shard_version(&id).placement, want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Splits, merges and migrations, with incremental refreshes at random moments: the cached
    /// routing always equals the config server's chunks, as a full load would build them, and a
    /// refresh with nothing new keeps the cached routing.
    #[test]
    fn incremental_refreshes_converge(
        shards in 1usize..5,
        steps in proptest::collection::vec((op(), any::<bool>()), 1..60),
        probes in proptest::collection::vec(any::<i64>(), 8),
    ) {
        let e = ObjectId::new();
        let mut model = Model::new(shards);
        let mut cached = CollectionRouting::full(entry(e), model.read(None), &PRINTER).unwrap();
        let mut changed_since_refresh = false;
        for (op, refresh) in &steps {
            let before = model.version();
            model.apply(op);
            changed_since_refresh |= model.version() != before;
            if *refresh {
                let read = model.read(Some(cached.collection_version));
                match cached.apply_changes(entry(e), read, &PRINTER).unwrap() {
                    RefreshOutcome::Unchanged => prop_assert!(!changed_since_refresh),
                    RefreshOutcome::Updated(n) => {
                        prop_assert!(changed_since_refresh);
                        cached = *n;
                    }
                }
                changed_since_refresh = false;
                assert_matches_model(&cached, &model)?;
                let full = CollectionRouting::full(entry(e), model.read(None), &PRINTER).unwrap();
                prop_assert_eq!(&full.snapshot.chunks, &cached.snapshot.chunks);
                for p in &probes {
                    let owner = model
                        .chunks
                        .iter()
                        .find(|c| as_i128(&c.min) <= *p as i128 && (*p as i128) < as_i128(&c.max))
                        .map(|c| c.shard.clone());
                    prop_assert_eq!(cached.snapshot.shard_for(&key(*p)).map(str::to_string), owner);
                }
            }
        }
    }
}

#[test]
fn generation_is_carried_into_versions() {
    let e = ObjectId::new();
    let r = CollectionRouting::full(entry(e), four(), &PRINTER).unwrap();
    assert_eq!(
        r.version().generation,
        CollectionGeneration {
            epoch: e,
            timestamp: ts(100, 1)
        }
    );
    assert_eq!(
        r.shard_version("s0").to_document(),
        doc! {"e": e, "t": ts(100, 1), "v": ts(1, 1)}
    );
}
