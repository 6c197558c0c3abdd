//! Write coalescing (docs/design/adaptive-limit.md section 7): inserts from different client
//! requests that carry no write semantics of a session (no `txnNumber`, not in a transaction;
//! an `lsid` alone is allowed) and agree on namespace, shard, write concern and options are
//! merged into one unordered child batch, up to `max_operations` / `max_bytes`. Each client
//! still gets exactly its own reply: its statements' write errors (indexes remapped to its own
//! batch) and its own `n`. Only inserts are merged: a shard reports per-statement results for
//! inserts, but only totals for updates and deletes, which could not be split between clients.
//! Retryable writes are never merged (one child carries one `lsid`/`txnNumber`, and the shard
//! keeps its retry record per session).
//!
//! A write waits for companions (at most `max_wait`) only while the shard is busy with this
//! group: a batch of the same key sent and not yet answered, or statements waiting in the
//! shard's queue. On an idle shard it is sent at once, exactly as it would be without
//! coalescing, so coalescing adds no latency at low load.
//!
//! A batch that holds more than one request carries no `lsid`: on a plain write mongod only
//! checks the session out for the command and refreshes its last use, which means nothing for
//! the other requests' statements, and one client's session must not cover (or be killed with)
//! another's. The router records every request's own session before the write path runs
//! (`LocalSessions::touch` in the dispatcher), merged or not. A batch that holds one request
//! alone is sent with that request's own options, `lsid` included.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, RawDocumentBuf};
use bytes::Bytes;
use tokio::sync::{oneshot, Notify};

use super::merge::ChildOutcome;
use super::{send_child, send_child_as, ChildSpec};
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

/// The groups open to newcomers, and the batches sent and not yet answered, per key.
#[derive(Default)]
struct Open {
    groups: HashMap<Vec<u8>, Arc<Group>>,
    sending: HashMap<Vec<u8>, usize>,
}

/// The router's open groups of mergeable writes.
pub struct Coalescer {
    settings: CoalesceSettings,
    open: Mutex<Open>,
    merged: AtomicU64,
    waits: AtomicU64,
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
        // The session is not part of the key: a merged batch carries none (the module header).
        if !["ordered", "maxTimeMS", "comment", "$db", "lsid"].contains(&k.as_str()) {
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

/// Whether a write with these options (a child batch's template) may be merged with other
/// requests' writes: it carries no write semantics of a session. An `lsid` alone carries none;
/// `txnNumber` makes it a retryable write (one child carries one `lsid`/`txnNumber`, and the
/// shard keeps its retry record per session), `startTransaction`/`autocommit` a statement of a
/// transaction.
pub fn mergeable(template: &bson::RawDocument) -> bool {
    ["txnNumber", "startTransaction", "autocommit"]
        .iter()
        .all(|k| matches!(template.get(k), Ok(None)))
}

/// `template` without its `lsid`: the options of a batch that holds several requests'
/// statements (the module header).
fn without_session(template: &bson::RawDocument) -> RawDocumentBuf {
    let mut out = RawDocumentBuf::new();
    for (k, v) in template.iter().flatten() {
        if k != "lsid" {
            out.append(k, v);
        }
    }
    out
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
        let mut open = self.lock();
        if open.groups.get(key).is_some_and(|g| Arc::ptr_eq(g, group)) {
            open.groups.remove(key);
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
            open: Mutex::new(Open::default()),
            merged: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Statements that joined another request's child batch so far.
    pub fn merged_statements(&self) -> u64 {
        self.merged.load(Ordering::Relaxed)
    }

    /// Writes that waited for companions so far (those sent at once to an idle shard do not
    /// count).
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Counts one batch of `key` as sent until the returned guard drops.
    fn sending<'a>(&'a self, open: &mut Open, key: &'a [u8]) -> Sending<'a> {
        *open.sending.entry(key.to_vec()).or_default() += 1;
        Sending {
            coalescer: self,
            key,
        }
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
        enum Joined<'a> {
            Member(oneshot::Receiver<ChildOutcome>),
            Alone(Sending<'a>),
            Leader(Arc<Group>),
        }
        let joined = {
            let mut open = self.lock();
            let mut as_member = None;
            if let Some(g) = open.groups.get(&k).cloned() {
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
            // Busy: a batch of this key is on its way to the shard, or the shard's queue holds
            // waiting statements. Only then is waiting for companions worth its time.
            let busy = || {
                open.sending.get(&k).is_some_and(|n| *n > 0)
                    || cluster.queue(shard).is_some_and(|q| q.depth() > 0)
            };
            match as_member {
                Some(rx) => Joined::Member(rx),
                None if !busy() => Joined::Alone(self.sending(&mut open, &k)),
                None => {
                    // Lead a new group.
                    let g = Arc::new(Group::default());
                    {
                        let mut inner = g.inner.lock().unwrap_or_else(|p| p.into_inner());
                        inner.operations = len;
                        inner.bytes = bytes;
                        inner.docs = docs.clone();
                    }
                    open.groups.insert(k.clone(), g.clone());
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
            // An idle shard: sent at once, as it would be without coalescing.
            Joined::Alone(sending) => {
                let outcome = send_child_as(cluster, shard, &child, &docs, true).await;
                drop(sending);
                return outcome;
            }
            Joined::Leader(g) => g,
        };
        self.waits.fetch_add(1, Ordering::Relaxed);
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
        // Counted as sent before it is sealed, so that a newcomer never finds the key idle in
        // between.
        let sending = self.sending(&mut self.lock(), &k);
        let (merged_docs, members) = self.seal(&k, &group);
        if members.is_empty() {
            // Nobody came: the request's own batch, with its own options.
            return send_child_as(cluster, shard, &child, &docs, true).await;
        }
        let joined: usize = members.iter().map(|m| m.len).sum();
        self.merged.fetch_add(joined as u64, Ordering::Relaxed);
        metrics::counter!("sluice_coalesced_statements_total", "shard" => shard.to_string())
            .increment(joined as u64);
        // Several requests' statements: no one request's session (the module header).
        let template = without_session(child.template);
        let merged = ChildSpec {
            template: &template,
            ordered: false,
            ..child
        };
        let outcome = send_child(cluster, shard, &merged, &merged_docs).await;
        drop(sending);
        let mut offset = len;
        for m in members {
            let part = split_reply(&outcome, offset, m.len);
            offset += m.len;
            let _ = m.tx.send(part);
        }
        split_reply(&outcome, 0, len)
    }
}

/// A batch of one key on its way to the shard: the key counts as busy until it drops.
struct Sending<'a> {
    coalescer: &'a Coalescer,
    key: &'a [u8],
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        let mut open = self.coalescer.lock();
        if let Some(n) = open.sending.get_mut(self.key) {
            *n -= 1;
            if *n == 0 {
                open.sending.remove(self.key);
            }
        }
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
        c.lock().groups.insert(b"k".to_vec(), group.clone());
        drop(SealOnDrop {
            coalescer: &c,
            key: b"k",
            group: &group,
            armed: true,
        });
        assert!(c.lock().groups.is_empty(), "the group is no longer open");
        assert!(group.inner.lock().unwrap().sealed);
        assert!(
            matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "the member is told, not left waiting"
        );
    }

    #[test]
    fn an_lsid_alone_is_mergeable_a_retryable_write_or_a_transaction_is_not() {
        let lsid = doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![1; 16] }};
        let of = |d: bson::Document| mergeable(&RawDocumentBuf::try_from(&d).unwrap());
        assert!(of(doc! {"insert": "c"}));
        assert!(of(
            doc! {"insert": "c", "lsid": lsid.clone(), "writeConcern": {"w": 1}}
        ));
        assert!(!of(
            doc! {"insert": "c", "lsid": lsid.clone(), "txnNumber": 1i64}
        ));
        assert!(!of(
            doc! {"insert": "c", "lsid": lsid.clone(), "txnNumber": 1i64, "autocommit": false}
        ));
        assert!(!of(
            doc! {"insert": "c", "lsid": lsid.clone(), "autocommit": false}
        ));
        assert!(!of(
            doc! {"insert": "c", "lsid": lsid, "startTransaction": true}
        ));
    }

    #[test]
    fn a_merged_batch_carries_no_session_and_sessions_do_not_part_groups() {
        let lsid = |b: u8| doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![b; 16] }};
        let a = RawDocumentBuf::try_from(
            &doc! {"insert": "c", "lsid": lsid(1), "writeConcern": {"w": "majority"}},
        )
        .unwrap();
        let b = RawDocumentBuf::try_from(
            &doc! {"insert": "c", "lsid": lsid(2), "writeConcern": {"w": "majority"}},
        )
        .unwrap();
        let none =
            RawDocumentBuf::try_from(&doc! {"insert": "c", "writeConcern": {"w": "majority"}})
                .unwrap();
        let w1 = RawDocumentBuf::try_from(&doc! {"insert": "c", "writeConcern": {"w": 1}}).unwrap();
        let spec = |t| ChildSpec {
            template: t,
            kind: super::super::WriteKind::Insert,
            ns: "d.c",
            ordered: false,
            stmt_ids: None,
            version: None,
            retryable: false,
            max_time: None,
        };
        assert_eq!(key("s", &spec(&a)), key("s", &spec(&b)));
        assert_eq!(key("s", &spec(&a)), key("s", &spec(&none)));
        assert_ne!(key("s", &spec(&a)), key("s", &spec(&w1)));
        assert_ne!(key("s", &spec(&a)), key("t", &spec(&a)));
        assert_eq!(without_session(&a), none);
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
