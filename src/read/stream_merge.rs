//! The merge state machine behind a router cursor over shard cursors: it pulls a shard's next
//! batch only when a client's batch needs it (memory stays at one batch per shard), picks the
//! next document in MongoDB's order when the query sorts, and applies `skip`, `limit` and a
//! projection the shards could not apply.
//!
//! Documents stay encoded. A sorted merge compares the heads of the streams by their sort
//! keys alone: the fields a sort path starts with are read in place and only those are
//! decoded, once per head, never the whole document.

use std::cmp::Ordering;

use bson::Document;
use bytes::Bytes;

use super::shard_io::{decode, pull, raw, ShardStream};
use crate::cluster::Cluster;
use crate::command::CommandError;
use crate::engine::query::{Projection, SortSpec};

/// How documents are ordered, with the top-level fields each sort path starts with.
#[derive(Debug)]
pub(super) struct SortKeys {
    spec: SortSpec,
    fields: Vec<String>,
}

impl SortKeys {
    /// The sort of `spec` (parsed as `sort`); empty when the query does not sort.
    pub(super) fn new(spec: SortSpec, sort: &Document) -> SortKeys {
        let mut fields: Vec<String> = sort
            .keys()
            .map(|k| k.split('.').next().unwrap_or(k).to_string())
            .collect();
        fields.dedup();
        SortKeys { spec, fields }
    }

    fn is_empty(&self) -> bool {
        self.spec.is_empty()
    }

    /// The part of `doc` the sort reads: its sort paths' top-level fields, decoded.
    fn key_of(&self, doc: &Bytes) -> Document {
        let doc = raw(doc);
        let mut key = Document::new();
        for f in &self.fields {
            if let Ok(Some(v)) = doc.get(f) {
                if let Ok(v) = bson::Bson::try_from(v) {
                    key.insert(f.as_str(), v);
                }
            }
        }
        key
    }
}

/// A router cursor's merge over shard cursors, pulled as needed.
#[derive(Debug)]
pub(super) struct Merge {
    pub(super) db: String,
    pub(super) coll: String,
    pub(super) streams: Vec<ShardStream>,
    /// The sort key of each stream's head, when sorted (index-aligned with `streams`).
    heads: Vec<Option<Document>>,
    sort: SortKeys,
    skip: usize,
    limit: Option<usize>,
    served: usize,
    projection: Option<Projection>,
}

impl Merge {
    /// A merge of `streams` in the order of `sort`, skipping `skip` documents, serving at most
    /// `limit` and applying `projection` (one the shards were not sent).
    pub(super) fn new(
        db: String,
        coll: String,
        streams: Vec<ShardStream>,
        sort: SortKeys,
        skip: usize,
        limit: Option<usize>,
        projection: Option<Projection>,
    ) -> Merge {
        Merge {
            db,
            coll,
            heads: Vec::new(),
            streams,
            sort,
            skip,
            limit,
            served: 0,
            projection,
        }
    }

    /// The stream whose head comes first (0 when unsorted).
    fn pick(&mut self) -> usize {
        if self.sort.is_empty() || self.streams.len() < 2 {
            return 0;
        }
        self.heads.resize(self.streams.len(), None);
        for (s, head) in self.streams.iter().zip(self.heads.iter_mut()) {
            if head.is_none() {
                *head = s.buffer.front().map(|d| self.sort.key_of(d));
            }
        }
        let mut best = 0;
        for i in 1..self.streams.len() {
            if let (Some(a), Some(b)) = (&self.heads[i], &self.heads[best]) {
                if self.sort.spec.compare(a, b) == Ordering::Less {
                    best = i;
                }
            }
        }
        best
    }

    /// Up to `n` more documents, in MongoDB's order when sorted; `true` once exhausted.
    pub(super) async fn next_batch(
        &mut self,
        cluster: &Cluster,
        n: usize,
    ) -> Result<(Vec<Bytes>, bool), CommandError> {
        let mut out = Vec::new();
        loop {
            if self.limit.is_some_and(|l| self.served >= l) {
                return Ok((out, true));
            }
            if out.len() >= n {
                return Ok((out, false));
            }
            // Every stream that still has documents must show its head before one is chosen.
            let needs_refill = |s: &ShardStream| s.buffer.is_empty() && s.cursor_id != 0;
            if self.streams.iter().any(needs_refill) {
                let want = n.saturating_sub(out.len()).max(1) + self.skip;
                let (db, coll) = (&self.db, &self.coll);
                let refills = self
                    .streams
                    .iter_mut()
                    .filter(|s| needs_refill(s))
                    .map(|s| pull(cluster, db, coll, s, want));
                for r in crate::backend::join_all(refills).await {
                    r?;
                }
            }
            if self
                .streams
                .iter()
                .any(|s| s.buffer.is_empty() && s.cursor_id == 0)
            {
                let mut heads = std::mem::take(&mut self.heads).into_iter();
                let mut kept_heads = Vec::new();
                self.streams.retain(|s| {
                    let head = heads.next().flatten();
                    let keep = !s.buffer.is_empty() || s.cursor_id != 0;
                    if keep {
                        kept_heads.push(head);
                    }
                    keep
                });
                self.heads = kept_heads;
            }
            if self.streams.is_empty() {
                return Ok((out, true));
            }
            let pick = self.pick();
            let Some(doc) = self.streams[pick].buffer.pop_front() else {
                continue;
            };
            if let Some(h) = self.heads.get_mut(pick) {
                *h = None;
            }
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            self.served += 1;
            out.push(match &self.projection {
                Some(p) => match p.apply(&decode(&doc)).to_vec() {
                    Ok(bytes) => Bytes::from(bytes),
                    Err(_) => doc,
                },
                None => doc,
            });
        }
    }
}
