//! One tracked collection's routing, built from `config.collections` + `config.chunks` and
//! brought up to date by applying the chunks that changed since the cached collection version
//! (mongos's `RoutingTableHistory::makeUpdated` / `ChunkMap::_makeUpdated`).
//!
//! A [`CollectionRouting`] is immutable; a refresh builds a new one (or keeps the old one when
//! nothing changed). Every result is validated: the chunks cover the key space from `MinKey` to
//! `MaxKey` without gaps or overlaps, or the refresh fails with
//! `ConflictingOperationInProgress`, which the cache answers by reading again.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::topology::Printer;
use crate::routing::{ChunkMap, ChunkVersion, RoutingSnapshot, ShardKey, ShardKeyPattern};
use crate::value::error_codes::ErrorCode;

use super::documents::{ChunkEntry, CollectionEntry};
use super::error::MetadataError;
use super::version::ShardVersion;

/// A tracked collection's routing: its entry, the routing snapshot the read and write paths
/// target with, and the versions requests carry.
#[derive(Debug, Clone)]
pub struct CollectionRouting {
    /// The `config.collections` entry.
    pub entry: CollectionEntry,
    /// Key pattern, generation and chunk map, shared with the routing layer.
    pub snapshot: Arc<RoutingSnapshot>,
    /// The highest chunk version.
    pub collection_version: ChunkVersion,
    shard_versions: BTreeMap<String, ChunkVersion>,
}

/// What applying a refresh's chunks did.
#[derive(Debug, Clone)]
pub enum RefreshOutcome {
    /// Nothing changed since the cached version: keep the cached routing.
    Unchanged,
    /// The routing changed.
    Updated(Box<CollectionRouting>),
}

impl CollectionRouting {
    /// Builds the routing from the collection's entry and all its chunks (a full load).
    pub fn full(
        entry: CollectionEntry,
        chunks: Vec<ChunkEntry>,
        printer: &Printer,
    ) -> Result<Self, MetadataError> {
        check_changed(&entry, &chunks, None, printer)?;
        let chunks = flatten(chunks);
        validate_coverage(&entry.pattern, &chunks, printer)?;
        Self::build(entry, chunks)
    }

    /// Applies the chunks read with `lastmod ≥` this routing's collection version, under an
    /// entry of the same generation (the caller reloads fully when the generation changed).
    pub fn apply_changes(
        &self,
        entry: CollectionEntry,
        changed: Vec<ChunkEntry>,
        printer: &Printer,
    ) -> Result<RefreshOutcome, MetadataError> {
        if entry.generation != self.entry.generation || entry.uuid != self.entry.uuid {
            return Err(MetadataError::new(
                ErrorCode::ConflictingOperationInProgress,
                format!(
                    "collection {} changed generation; its routing must be reloaded fully",
                    entry.ns
                ),
            ));
        }
        check_changed(&entry, &changed, Some(self.collection_version), printer)?;
        if changed.len() == 1
            && changed[0].version == self.collection_version
            && entry == self.entry
        {
            return Ok(RefreshOutcome::Unchanged);
        }
        let changed = flatten(changed);
        let mut merged: Vec<ChunkEntry> = Vec::with_capacity(self.snapshot.chunks.len() + 1);
        let mut next = 0;
        for old in self.snapshot.chunks.chunks() {
            while next < changed.len() && changed[next].max <= old.min {
                next += 1;
            }
            let overlapped = next < changed.len() && changed[next].min < old.max;
            if !overlapped {
                merged.push(ChunkEntry {
                    id: old.id,
                    uuid: entry.uuid,
                    min: old.min.clone(),
                    max: old.max.clone(),
                    shard: old.shard.clone(),
                    version: old.version,
                    jumbo: false,
                    on_current_shard_since: None,
                });
            }
        }
        merged.extend(changed);
        merged.sort_by(|a, b| a.min.cmp(&b.min));
        validate_coverage(&entry.pattern, &merged, printer)?;
        Ok(RefreshOutcome::Updated(Box::new(Self::build(
            entry, merged,
        )?)))
    }

    fn build(entry: CollectionEntry, chunks: Vec<ChunkEntry>) -> Result<Self, MetadataError> {
        let mut shard_versions: BTreeMap<String, ChunkVersion> = BTreeMap::new();
        let mut collection_version = ChunkVersion::default();
        for c in &chunks {
            let v = shard_versions.entry(c.shard.clone()).or_default();
            *v = (*v).max(c.version);
            collection_version = collection_version.max(c.version);
        }
        let map = ChunkMap::new(
            &entry.pattern,
            chunks.iter().map(|c| c.to_chunk()).collect(),
        )
        .map_err(|e| MetadataError::new(ErrorCode::ConflictingOperationInProgress, e.message))?;
        let snapshot = RoutingSnapshot {
            ns: entry.ns.clone(),
            pattern: entry.pattern.clone(),
            unique: entry.unique,
            epoch: entry.generation.epoch,
            timestamp: entry.generation.timestamp,
            uuid: entry.uuid,
            chunks: map,
        };
        Ok(CollectionRouting {
            entry,
            snapshot: Arc::new(snapshot),
            collection_version,
            shard_versions,
        })
    }

    /// The collection version with its generation (what a refresh compares against).
    pub fn version(&self) -> ShardVersion {
        ShardVersion {
            generation: self.entry.generation,
            placement: self.collection_version,
        }
    }

    /// The `shardVersion` a request to `shard` carries: the shard's placement version, `0|0`
    /// for a shard that owns no chunk, with the collection's generation.
    pub fn shard_version(&self, shard: &str) -> ShardVersion {
        ShardVersion {
            generation: self.entry.generation,
            placement: self.shard_versions.get(shard).copied().unwrap_or_default(),
        }
    }

    /// The shards that own at least one chunk, sorted.
    pub fn shards(&self) -> impl Iterator<Item = &str> {
        self.shard_versions.keys().map(String::as_str)
    }
}

/// Checks the chunks a read returned against the entry they were read under: same collection
/// UUID (mongos's 12698702), at least one chunk, and (incrementally) none older than the cached
/// collection version. A violation means the read saw the catalog mid-change.
fn check_changed(
    entry: &CollectionEntry,
    chunks: &[ChunkEntry],
    since: Option<ChunkVersion>,
    printer: &Printer,
) -> Result<(), MetadataError> {
    if chunks.is_empty() {
        return Err(MetadataError::new(
            ErrorCode::ConflictingOperationInProgress,
            format!("No chunks were found for the collection {}", entry.ns),
        ));
    }
    for c in chunks {
        if c.uuid != entry.uuid {
            return Err(MetadataError::new(
                ErrorCode::ConflictingOperationInProgress,
                format!(
                    "Chunk {} does not belong to collection UUID {}",
                    describe(&entry.pattern, c, printer),
                    entry.uuid
                ),
            ));
        }
        if let Some(since) = since {
            if c.version < since {
                return Err(MetadataError::new(
                    ErrorCode::ConflictingOperationInProgress,
                    format!(
                        "Changed chunk {} doesn't have version that's greater or equal than that \
                         of the collection {}|{}",
                        describe(&entry.pattern, c, printer),
                        since.major,
                        since.minor
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Of chunks that overlap, keeps the newest (mongos's `flatten`); the result is sorted by min.
fn flatten(mut chunks: Vec<ChunkEntry>) -> Vec<ChunkEntry> {
    chunks.sort_by(|a, b| b.max.cmp(&a.max));
    let mut kept: Vec<ChunkEntry> = Vec::with_capacity(chunks.len());
    for c in chunks {
        match kept.last_mut() {
            Some(last) if c.min < last.max && c.max > last.min => {
                if last.version < c.version {
                    *last = c;
                }
            }
            _ => kept.push(c),
        }
    }
    kept.reverse();
    kept
}

/// Checks that `chunks`, sorted by min, cover the key space of `pattern` exactly: the first
/// starts at `MinKey` in every field, each starts where the previous ended, the last ends at
/// `MaxKey` in every field. The errors are mongos's (`ConflictingOperationInProgress`).
pub fn validate_coverage(
    pattern: &ShardKeyPattern,
    chunks: &[ChunkEntry],
    printer: &Printer,
) -> Result<(), MetadataError> {
    let conflict = |m: String| MetadataError::new(ErrorCode::ConflictingOperationInProgress, m);
    let (Some(first), Some(last)) = (chunks.first(), chunks.last()) else {
        return Err(conflict("the routing table has no chunks".into()));
    };
    let render = |k: &ShardKey| (printer.document)(&pattern.key_document(k));
    if !first.min.0.iter().all(|v| matches!(v, bson::Bson::MinKey)) {
        return Err(conflict(format!(
            "Not all elements of {} are of type minKey",
            render(&first.min)
        )));
    }
    for pair in chunks.windows(2) {
        let (left, right) = (&pair[0], &pair[1]);
        if left.max != right.min {
            let what = if left.max < right.min {
                "Gap"
            } else {
                "Overlap"
            };
            return Err(conflict(format!(
                "{what} exists in the routing table between chunks {} and {}",
                describe(pattern, left, printer),
                describe(pattern, right, printer)
            )));
        }
    }
    if !last.max.0.iter().all(|v| matches!(v, bson::Bson::MaxKey)) {
        return Err(conflict(format!(
            "Not all elements of {} are of type maxKey",
            render(&last.max)
        )));
    }
    Ok(())
}

/// A chunk's range as mongos prints it: `{ x: MinKey } -> { x: 0 }`.
fn describe(pattern: &ShardKeyPattern, c: &ChunkEntry, printer: &Printer) -> String {
    format!(
        "{} -> {}",
        (printer.document)(&pattern.key_document(&c.min)),
        (printer.document)(&pattern.key_document(&c.max))
    )
}

#[cfg(test)]
mod tests;
