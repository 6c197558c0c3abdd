//! The chunk map: a collection's chunks ordered by their max bound, looked up by upper bound
//! (min inclusive, max exclusive), with chunk versions, and MongoDB's initial pre-split of an
//! empty collection with a hashed shard key.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bson::{oid::ObjectId, Bson, Timestamp};

use super::shard_key::{ShardKey, ShardKeyPattern};
use super::RoutingError;
use crate::value::error_codes::ErrorCode;

/// A chunk version `major|minor`, stored as `Timestamp(major, minor)` in `config.chunks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ChunkVersion {
    /// Bumped by migrations.
    pub major: u32,
    /// Bumped by splits and merges.
    pub minor: u32,
}

impl ChunkVersion {
    /// As stored: `Timestamp(major, minor)`.
    pub fn timestamp(self) -> Timestamp {
        Timestamp {
            time: self.major,
            increment: self.minor,
        }
    }

    /// From `config.chunks.lastmod`.
    pub fn from_timestamp(t: Timestamp) -> Self {
        ChunkVersion {
            major: t.time,
            minor: t.increment,
        }
    }
}

/// One chunk: `[min, max)` on `shard`.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// `config.chunks._id`.
    pub id: ObjectId,
    /// Inclusive lower bound.
    pub min: ShardKey,
    /// Exclusive upper bound.
    pub max: ShardKey,
    /// The owning shard's id.
    pub shard: String,
    /// The chunk's version.
    pub version: ChunkVersion,
}

impl Chunk {
    /// The chunk as a `config.chunks` document of collection `uuid` (MongoDB 6.0+ schema),
    /// placed on its shard at `since`.
    pub fn config_document(
        &self,
        uuid: bson::Uuid,
        pattern: &ShardKeyPattern,
        since: Timestamp,
    ) -> bson::Document {
        bson::doc! {
            "_id": self.id,
            "uuid": uuid,
            "min": pattern.key_document(&self.min),
            "max": pattern.key_document(&self.max),
            "shard": &self.shard,
            "lastmod": self.version.timestamp(),
            "onCurrentShardSince": since,
            "history": [{"validAfter": since, "shard": &self.shard}],
        }
    }
}

/// A collection's chunks, ordered by max bound.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkMap {
    by_max: BTreeMap<ShardKey, Chunk>,
    /// The shards that own at least one chunk, sorted (the map never changes once built).
    owners: Vec<String>,
}

impl ChunkMap {
    /// Builds the map, checking that the chunks cover the whole key space without gaps or
    /// overlaps.
    pub fn new(
        pattern: &ShardKeyPattern,
        mut chunks: Vec<Chunk>,
    ) -> Result<ChunkMap, RoutingError> {
        if chunks.is_empty() {
            return Err(RoutingError::new(
                ErrorCode::InternalError,
                "a sharded collection needs at least one chunk",
            ));
        }
        chunks.sort_by(|a, b| a.min.cmp(&b.min));
        let mut expected = pattern.min_key();
        for c in &chunks {
            if c.min != expected || c.max <= c.min {
                return Err(RoutingError::new(
                    ErrorCode::InternalError,
                    format!(
                        "chunks do not cover the key space contiguously near {:?}",
                        c.min.0
                    ),
                ));
            }
            expected = c.max.clone();
        }
        if expected != pattern.max_key() {
            return Err(RoutingError::new(
                ErrorCode::InternalError,
                "the last chunk does not end at MaxKey",
            ));
        }
        let mut owners: Vec<String> = chunks.iter().map(|c| c.shard.clone()).collect();
        owners.sort_unstable();
        owners.dedup();
        Ok(ChunkMap {
            by_max: chunks.into_iter().map(|c| (c.max.clone(), c)).collect(),
            owners,
        })
    }

    /// The chunk that owns `key`: the first whose max is greater than the key; a key equal to
    /// the global MaxKey belongs to the last chunk.
    pub fn find(&self, key: &ShardKey) -> Option<&Chunk> {
        self.by_max
            .range((Bound::Excluded(key), Bound::Unbounded))
            .next()
            .map(|(_, c)| c)
            .or_else(|| self.by_max.values().next_back())
    }

    /// Chunks in key order.
    pub fn chunks(&self) -> impl Iterator<Item = &Chunk> {
        self.by_max.values()
    }

    /// Number of chunks.
    pub fn len(&self) -> usize {
        self.by_max.len()
    }

    /// Whether there are no chunks (never true for a valid map).
    pub fn is_empty(&self) -> bool {
        self.by_max.is_empty()
    }

    /// The shards that own at least one chunk, sorted.
    pub fn shards(&self) -> BTreeSet<String> {
        self.owners.iter().cloned().collect()
    }

    /// The shards that own at least one chunk, sorted, without copying them.
    pub fn owners(&self) -> &[String] {
        &self.owners
    }

    /// The collection version: the highest chunk version.
    pub fn collection_version(&self) -> ChunkVersion {
        self.by_max
            .values()
            .map(|c| c.version)
            .max()
            .unwrap_or_default()
    }

    /// A shard's version: the highest version among its chunks (0|0 if it owns none).
    pub fn shard_version(&self, shard: &str) -> ChunkVersion {
        self.by_max
            .values()
            .filter(|c| c.shard == shard)
            .map(|c| c.version)
            .max()
            .unwrap_or_default()
    }
}

/// MongoDB's split points for `n` initial chunks of a hashed prefix
/// (`InitialSplitPolicy::calculateHashedSplitPoints`), ascending.
pub fn hashed_split_points(n: u32) -> Vec<i64> {
    if n <= 1 {
        return Vec::new();
    }
    let n = n as i64;
    let interval = (i64::MAX / n) * 2;
    let mut points = Vec::with_capacity(n as usize - 1);
    let mut current = if n % 2 == 0 {
        points.push(0);
        interval
    } else {
        interval / 2
    };
    for _ in 0..(n - 1) / 2 {
        points.push(current);
        points.push(-current);
        current += interval;
    }
    points.sort_unstable();
    points
}

/// The initial chunks of an empty collection, as MongoDB 5.0–7.1 lays them out: with a hashed
/// prefix, `num_initial_chunks` (default 2 per shard) chunks at the formula's split points,
/// assigned in contiguous runs to the shard ids in sorted order (fewer chunks than shards: the
/// first goes to the primary); otherwise one chunk on the primary shard. Versions are 1|0,
/// 1|1, … in key order.
pub fn initial_chunks(
    pattern: &ShardKeyPattern,
    shard_ids: &[String],
    primary: &str,
    num_initial_chunks: Option<u32>,
) -> Vec<Chunk> {
    let mut sorted: Vec<String> = shard_ids.to_vec();
    sorted.sort();
    let nfields = pattern.fields().len();
    let bound = |hash: i64| {
        let mut v = vec![Bson::Int64(hash)];
        v.extend(std::iter::repeat_n(Bson::MinKey, nfields - 1));
        ShardKey(v)
    };
    let (bounds, owners): (Vec<ShardKey>, Vec<String>) =
        if pattern.is_hashed_prefix() && !sorted.is_empty() {
            let n = num_initial_chunks
                .filter(|n| *n > 0)
                .unwrap_or(2 * sorted.len() as u32);
            let points = hashed_split_points(n);
            let mut bounds = vec![pattern.min_key()];
            bounds.extend(points.iter().map(|p| bound(*p)));
            bounds.push(pattern.max_key());
            let chunks = bounds.len() - 1;
            let per_shard = (chunks / sorted.len()).max(1);
            let owners = (0..chunks)
                .map(|i| {
                    if chunks < sorted.len() && i == 0 {
                        primary.to_string()
                    } else {
                        sorted[(i / per_shard) % sorted.len()].clone()
                    }
                })
                .collect();
            (bounds, owners)
        } else {
            (
                vec![pattern.min_key(), pattern.max_key()],
                vec![primary.to_string()],
            )
        };
    bounds
        .windows(2)
        .zip(owners)
        .enumerate()
        .map(|(i, (w, shard))| Chunk {
            id: ObjectId::new(),
            min: w[0].clone(),
            max: w[1].clone(),
            shard,
            version: ChunkVersion {
                major: 1,
                minor: i as u32,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn split_points_match_mongodb() {
        let table: Vec<(u32, Vec<i64>)> = vec![
            (1, vec![]),
            (2, vec![0]),
            (3, vec![-3074457345618258602, 3074457345618258602]),
            (4, vec![-4611686018427387902, 0, 4611686018427387902]),
            (
                5,
                vec![
                    -5534023222112865483,
                    -1844674407370955161,
                    1844674407370955161,
                    5534023222112865483,
                ],
            ),
            (
                6,
                vec![
                    -6148914691236517204,
                    -3074457345618258602,
                    0,
                    3074457345618258602,
                    6148914691236517204,
                ],
            ),
            (
                8,
                vec![
                    -6917529027641081850,
                    -4611686018427387900,
                    -2305843009213693950,
                    0,
                    2305843009213693950,
                    4611686018427387900,
                    6917529027641081850,
                ],
            ),
            (
                12,
                vec![
                    -7686143364045646500,
                    -6148914691236517200,
                    -4611686018427387900,
                    -3074457345618258600,
                    -1537228672809129300,
                    0,
                    1537228672809129300,
                    3074457345618258600,
                    4611686018427387900,
                    6148914691236517200,
                    7686143364045646500,
                ],
            ),
        ];
        for (n, expected) in table {
            assert_eq!(hashed_split_points(n), expected, "n = {n}");
        }
        for n in 1..=12u32 {
            let pts = hashed_split_points(n);
            assert_eq!(pts.len(), n as usize - 1);
            assert!(pts.windows(2).all(|w| w[0] < w[1]));
            assert!(pts.iter().all(|p| pts.contains(&-p)), "symmetric around 0");
        }
    }

    fn shards(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("shard{i}")).collect()
    }

    #[test]
    fn placement_is_contiguous_runs_over_sorted_shards() {
        let p = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).unwrap();
        let chunks = initial_chunks(&p, &["shard1".into(), "shard0".into()], "shard1", None);
        let owners: Vec<&str> = chunks.iter().map(|c| c.shard.as_str()).collect();
        assert_eq!(owners, ["shard0", "shard0", "shard1", "shard1"]);
        assert_eq!(chunks[0].min, p.min_key());
        assert_eq!(chunks[3].max, p.max_key());
        assert_eq!(chunks[2].min.0, vec![Bson::Int64(0)]);
        let versions: Vec<u32> = chunks.iter().map(|c| c.version.minor).collect();
        assert_eq!(versions, [0, 1, 2, 3]);
        let three = initial_chunks(&p, &shards(3), "shard0", Some(3));
        assert_eq!(
            three.iter().map(|c| c.shard.as_str()).collect::<Vec<_>>(),
            ["shard0", "shard1", "shard2"]
        );
        let one = initial_chunks(&p, &shards(3), "shard2", Some(1));
        assert_eq!(one.len(), 1);
        assert_eq!(
            one[0].shard, "shard2",
            "fewer chunks than shards: the primary"
        );
        let range = ShardKeyPattern::parse(&doc! {"a": 1}).unwrap();
        let c = initial_chunks(&range, &shards(3), "shard1", None);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].shard, "shard1");
        let compound = ShardKeyPattern::parse(&doc! {"h": "hashed", "b": 1}).unwrap();
        let c = initial_chunks(&compound, &shards(2), "shard0", None);
        assert_eq!(
            c[1].min.0,
            vec![Bson::Int64(-4611686018427387902), Bson::MinKey]
        );
    }

    #[test]
    fn lookup_at_every_boundary() {
        let p = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).unwrap();
        let chunks = initial_chunks(&p, &shards(3), "shard0", None);
        let map = ChunkMap::new(&p, chunks.clone()).unwrap();
        assert_eq!(map.len(), 6);
        let key = |v: Bson| ShardKey(vec![v]);
        assert_eq!(map.find(&key(Bson::MinKey)).unwrap().id, chunks[0].id);
        assert_eq!(map.find(&key(Bson::MaxKey)).unwrap().id, chunks[5].id);
        for (i, c) in chunks.iter().enumerate() {
            // The min bound is inside the chunk; one below it belongs to the previous chunk.
            assert_eq!(map.find(&c.min).unwrap().id, c.id, "min of chunk {i}");
            if let Bson::Int64(m) = c.min.0[0] {
                assert_eq!(
                    map.find(&key(Bson::Int64(m - 1))).unwrap().id,
                    chunks[i - 1].id
                );
            }
            if let Bson::Int64(m) = c.max.0[0] {
                assert_eq!(
                    map.find(&key(Bson::Int64(m - 1))).unwrap().id,
                    c.id,
                    "just below max"
                );
                assert_ne!(map.find(&c.max).unwrap().id, c.id, "max is exclusive");
            }
        }
        assert_eq!(
            map.find(&key(Bson::Int64(i64::MIN))).unwrap().id,
            chunks[0].id
        );
        assert_eq!(
            map.find(&key(Bson::Int64(i64::MAX))).unwrap().id,
            chunks[5].id
        );
        assert_eq!(map.shards().len(), 3);
        assert_eq!(
            map.collection_version(),
            ChunkVersion { major: 1, minor: 5 }
        );
        assert_eq!(
            map.shard_version("shard0"),
            ChunkVersion { major: 1, minor: 1 }
        );
        assert_eq!(map.shard_version("nope"), ChunkVersion::default());
    }

    #[test]
    fn rejects_gaps() {
        let p = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).unwrap();
        let mut chunks = initial_chunks(&p, &shards(2), "shard0", None);
        chunks.remove(1);
        assert!(ChunkMap::new(&p, chunks).is_err());
    }
}
