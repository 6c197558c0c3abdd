//! Write coalescing (docs/design/adaptive-limit.md section 7): inserts from different client
//! requests that need no session of their own (no `lsid`, no `txnNumber`) and agree on namespace,
//! shard, write concern and options are merged into one unordered child batch, up to
//! `max_operations` / `max_bytes`, waiting at most `max_wait` for companions. Each client still
//! gets exactly its own reply: its statements' write errors (indexes remapped to its own batch) and
//! its own `n`. Only inserts are merged: a shard reports per-statement results for inserts, but
//! only totals for updates and deletes, which could not be split between clients. Retryable writes
//! are never merged (one child carries one `lsid`/`txnNumber`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson};
use bytes::Bytes;
use tokio::sync::{oneshot, Notify};

use super::merge::ChildOutcome;
use super::{send_child, ChildSpec};
use crate::cluster::Cluster;

/// Coalescing settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceSettings {
    /// Statements per merged batch.
    pub max_operations: usize,
    /// Bytes per merged batch.
    pub max_bytes: usize,
    /// How long the first write waits for companions.
    pub max_wait: Duration,
}

struct Member {
    len: usize,
    tx: oneshot::Sender<ChildOutcome>,
}

#[derive(Default)]
struct GroupInner {
    sealed: bool,
    operations: usize,
    bytes: usize,
    docs: Vec<Bytes>,
    members: Vec<Member>,
}

#[derive(Default)]
struct Group {
    inner: Mutex<GroupInner>,
    full: Notify,
}

/// The router's open groups of mergeable writes.
pub struct Coalescer {
    settings: CoalesceSettings,
    groups: Mutex<HashMap<Vec<u8>, Arc<Group>>>,
    merged: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("settings", &self.settings)
            .finish()
    }
}

/// What must agree for two child batches to be merged.
fn key(shard: &str, child: &ChildSpec<'_>) -> Vec<u8> {
    let mut t = bson::RawDocumentBuf::new();
    for (k, v) in child.template.iter().flatten() {
        if !["ordered", "maxTimeMS", "comment", "$db"].contains(&k.as_str()) {
            t.append(k, v);
        }
    }
    // Shard and namespace hold no NUL; the options and the version are length-prefixed.
    let mut key = Vec::with_capacity(shard.len() + child.ns.len() + t.as_bytes().len() + 32);
    key.extend_from_slice(shard.as_bytes());
    key.push(0);
    key.extend_from_slice(child.ns.as_bytes());
    key.push(0);
    key.extend_from_slice(t.as_bytes());
    match &child.version {
        Some(v) => key.extend_from_slice(v.as_bytes()),
        None => key.push(0),
    }
    key
}

/// The part of a merged reply that belongs to statements `offset..offset + len`.
pub fn split_reply(outcome: &ChildOutcome, offset: usize, len: usize) -> ChildOutcome {
    let reply = match outcome {
        ChildOutcome::Failed { .. } => return outcome.clone(),
        ChildOutcome::Raw(_) => return split_reply(&outcome.clone().into_owned(), offset, len),
        ChildOutcome::Reply(r) => r,
    };
    if reply.get_f64("ok").ok() != Some(1.0) {
        return outcome.clone();
    }
    let mut errors = Vec::new();
    for e in reply
        .get_array("writeErrors")
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_document())
    {
        let Ok(i) = e.get_i32("index") else { continue };
        let i = i as usize;
        if i >= offset && i < offset + len {
            let mut e = e.clone();
            e.insert("index", (i - offset) as i32);
            errors.push(Bson::Document(e));
        }
    }
    let mut out = doc! {"n": (len - errors.len()) as i32};
    if !errors.is_empty() {
        out.insert("writeErrors", errors);
    }
    if let Ok(w) = reply.get_document("writeConcernError") {
        out.insert("writeConcernError", w.clone());
    }
    out.insert("ok", 1.0);
    ChildOutcome::Reply(out)
}

/// Seals a leader's group when the leader goes away before sending it.
struct SealOnDrop<'a> {
    coalescer: &'a Coalescer,
    key: &'a [u8],
    group: &'a Arc<Group>,
    armed: bool,
}

impl Drop for SealOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            drop(self.coalescer.seal(self.key, self.group));
        }
    }
}

impl Coalescer {
    /// Closes `group` to newcomers (and removes it from the open groups) and takes its
    /// statements and members.
    fn seal(&self, key: &[u8], group: &Arc<Group>) -> (Vec<Bytes>, Vec<Member>) {
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        if groups.get(key).is_some_and(|g| Arc::ptr_eq(g, group)) {
            groups.remove(key);
        }
        let mut inner = group.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.sealed = true;
        (
            std::mem::take(&mut inner.docs),
            std::mem::take(&mut inner.members),
        )
    }

    /// A coalescer; `None` when `max_wait` is zero (coalescing disabled).
    pub fn new(settings: CoalesceSettings) -> Option<Coalescer> {
        (!settings.max_wait.is_zero()).then(|| Coalescer {
            settings,
            groups: Mutex::new(HashMap::new()),
            merged: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Statements that joined another request's child batch so far.
    pub fn merged_statements(&self) -> u64 {
        self.merged.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends `docs` (one client's unordered inserts for `shard`), merged with compatible
    /// companions that arrive within `max_wait`; returns this client's part of the reply.
    pub async fn submit(
        &self,
        cluster: &Cluster,
        shard: &str,
        child: ChildSpec<'_>,
        docs: Vec<Bytes>,
    ) -> ChildOutcome {
        let k = key(shard, &child);
        let len = docs.len();
        let bytes: usize = docs.iter().map(|d| d.len()).sum();
        enum Joined {
            Member(oneshot::Receiver<ChildOutcome>),
            Leader(Arc<Group>),
        }
        let joined = {
            let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
            let mut as_member = None;
            if let Some(g) = groups.get(&k).cloned() {
                let mut inner = g.inner.lock().unwrap_or_else(|p| p.into_inner());
                let fits = !inner.sealed
                    && inner.operations + len <= self.settings.max_operations
                    && inner.bytes + bytes <= self.settings.max_bytes;
                if fits {
                    let (tx, rx) = oneshot::channel();
                    inner.operations += len;
                    inner.bytes += bytes;
                    inner.docs.extend(docs.iter().cloned());
                    inner.members.push(Member { len, tx });
                    if inner.operations >= self.settings.max_operations
                        || inner.bytes >= self.settings.max_bytes
                    {
                        g.full.notify_one();
                    }
                    as_member = Some(rx);
                }
            }
            match as_member {
                Some(rx) => Joined::Member(rx),
                None => {
                    // Lead a new group.
                    let g = Arc::new(Group::default());
                    {
                        let mut inner = g.inner.lock().unwrap_or_else(|p| p.into_inner());
                        inner.operations = len;
                        inner.bytes = bytes;
                        inner.docs = docs;
                    }
                    groups.insert(k.clone(), g.clone());
                    Joined::Leader(g)
                }
            }
        };
        let group = match joined {
            Joined::Member(rx) => {
                return rx.await.unwrap_or(ChildOutcome::Failed {
                    code: crate::value::error_codes::ErrorCode::InternalError,
                    message: "the merged child batch was abandoned".into(),
                })
            }
            Joined::Leader(g) => g,
        };
        // Should the leader be cancelled while it waits, the guard seals the group and drops
        // its members' senders: they get an error instead of waiting forever.
        let mut guard = SealOnDrop {
            coalescer: self,
            key: &k,
            group: &group,
            armed: true,
        };
        tokio::select! {
            _ = tokio::time::sleep(self.settings.max_wait) => {}
            _ = group.full.notified() => {}
        }
        guard.armed = false;
        let (docs, members) = self.seal(&k, &group);
        let joined: usize = members.iter().map(|m| m.len).sum();
        if joined > 0 {
            self.merged
                .fetch_add(joined as u64, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!("sluice_coalesced_statements_total", "shard" => shard.to_string())
                .increment(joined as u64);
        }
        let merged = ChildSpec {
            ordered: false,
            ..child
        };
        let outcome = send_child(cluster, shard, &merged, &docs).await;
        let mut offset = len;
        for m in members {
            let part = split_reply(&outcome, offset, m.len);
            offset += m.len;
            let _ = m.tx.send(part);
        }
        split_reply(&outcome, 0, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_each_members_errors_and_count() {
        let merged = ChildOutcome::Reply(doc! {
            "n": 4,
            "writeErrors": [
                {"index": 1, "code": 11000, "errmsg": "dup a"},
                {"index": 4, "code": 11000, "errmsg": "dup b"},
            ],
            "ok": 1.0,
        });
        // Member A: statements 0..2, member B: 2..6.
        let a = split_reply(&merged, 0, 2);
        let b = split_reply(&merged, 2, 4);
        let ChildOutcome::Reply(a) = a else { panic!() };
        let ChildOutcome::Reply(b) = b else { panic!() };
        assert_eq!(a.get_i32("n").unwrap(), 1);
        assert_eq!(
            a.get_array("writeErrors").unwrap()[0]
                .as_document()
                .unwrap()
                .get_i32("index")
                .unwrap(),
            1
        );
        assert_eq!(b.get_i32("n").unwrap(), 3);
        assert_eq!(
            b.get_array("writeErrors").unwrap()[0]
                .as_document()
                .unwrap()
                .get_i32("index")
                .unwrap(),
            2
        );
        let failed = ChildOutcome::Failed {
            code: crate::value::error_codes::ErrorCode::HostUnreachable,
            message: "x".into(),
        };
        assert_eq!(split_reply(&failed, 3, 1), failed);
    }

    #[test]
    fn a_cancelled_leader_releases_its_members() {
        let c = Coalescer::new(CoalesceSettings {
            max_operations: 128,
            max_bytes: 1 << 22,
            max_wait: Duration::from_secs(60),
        })
        .unwrap();
        let group = Arc::new(Group::default());
        let (tx, mut rx) = oneshot::channel();
        group
            .inner
            .lock()
            .unwrap()
            .members
            .push(Member { len: 1, tx });
        c.groups
            .lock()
            .unwrap()
            .insert(b"k".to_vec(), group.clone());
        drop(SealOnDrop {
            coalescer: &c,
            key: b"k",
            group: &group,
            armed: true,
        });
        assert!(
            c.groups.lock().unwrap().is_empty(),
            "the group is no longer open"
        );
        assert!(group.inner.lock().unwrap().sealed);
        assert!(
            matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "the member is told, not left waiting"
        );
    }

    #[test]
    fn disabled_with_zero_wait() {
        assert!(Coalescer::new(CoalesceSettings {
            max_operations: 128,
            max_bytes: 1 << 22,
            max_wait: Duration::ZERO
        })
        .is_none());
    }
}
