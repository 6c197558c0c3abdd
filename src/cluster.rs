//! The router's view of its cluster: the shards, the routing table cache, a connection pool and
//! a queue per shard, and the open transactions. What only the router keeps besides (its
//! cursors, the write coalescer, write statistics, the metadata store) is in `crate::router`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bson::Document;

use crate::backend::limiter::{BatchInfo, OpKind};
use crate::backend::queue::{LimitPermit, QueueTimeout, ShardQueue};
use crate::backend::shard::Shard;
use crate::backend::{BackendError, PoolOptions};
use crate::routing::{RoutingTable, ShardInfo};

/// A batch asking for an execution slot.
#[derive(Debug, Clone, Copy)]
pub struct SlotRequest<'a> {
    /// Mutation or read.
    pub op: OpKind,
    /// The command name (with `ns`, the limiter's group).
    pub command: &'a str,
    /// `db.coll`.
    pub ns: &'a str,
    /// Statements in the batch.
    pub operations: usize,
    /// Bytes in the batch.
    pub bytes: usize,
}

/// Shards, routing and pools of one router.
#[derive(Debug)]
pub struct Cluster {
    /// Cached routing snapshots.
    pub routing: RoutingTable,
    /// Open transactions and the shards each runs on.
    pub transactions: TransactionTable,
    /// The shards with their pools and queues: set once, at start-up, or (`--configdb`) when
    /// the config server first answers with its shard list.
    set: std::sync::OnceLock<ShardSet>,
    /// The shard list after shards were added (`--configdb`: `addShard`, a shard list read
    /// again), replacing `set`. Each list lives as long as the process, so the references
    /// handed out stay valid; a list is a few hundred bytes and shards are added rarely.
    grown: std::sync::RwLock<Option<&'static ShardSet>>,
    pool_options: PoolOptions,
    batching: crate::config::BatchingConfig,
    queue_timeout: std::time::Duration,
    stage_memory: std::sync::atomic::AtomicUsize,
}

/// The shards of a cluster with a pool and a queue each.
#[derive(Debug)]
struct ShardSet {
    pools: BTreeMap<String, Arc<Shard>>,
    queues: BTreeMap<String, Arc<ShardQueue>>,
    shards: Vec<ShardInfo>,
}

static NO_POOLS: BTreeMap<String, Arc<Shard>> = BTreeMap::new();

impl Cluster {
    /// A cluster over `shards`, routed by `routing`, whose shards are guarded by queues with
    /// these batching settings.
    pub fn new(
        shards: Vec<ShardInfo>,
        routing: RoutingTable,
        pool_options: PoolOptions,
        batching: &crate::config::BatchingConfig,
    ) -> Cluster {
        let cluster = Cluster::pending(routing, pool_options, batching);
        cluster.install_shards(shards);
        cluster
    }

    /// A cluster whose shards are not known yet (a `--configdb` router whose config server
    /// has not answered): it has none until [`Cluster::install_shards`].
    pub fn pending(
        routing: RoutingTable,
        pool_options: PoolOptions,
        batching: &crate::config::BatchingConfig,
    ) -> Cluster {
        Cluster {
            routing,
            transactions: Default::default(),
            set: std::sync::OnceLock::new(),
            grown: std::sync::RwLock::new(None),
            pool_options,
            batching: batching.clone(),
            queue_timeout: std::time::Duration::from_millis(batching.queue_timeout_ms),
            stage_memory: crate::limits::DEFAULT_STAGE_MEMORY_BYTES.into(),
        }
    }

    /// Sets the shards, with a pool and a queue each; `false` (and nothing changes) when the
    /// cluster has its shards already.
    pub fn install_shards(&self, shards: Vec<ShardInfo>) -> bool {
        let (pool_options, batching) = (&self.pool_options, &self.batching);
        let queues = shards
            .iter()
            .map(|s| {
                (
                    s.id.clone(),
                    Arc::new(ShardQueue::new(&s.id, batching.limiter())),
                )
            })
            .collect();
        let pools = shards
            .iter()
            .map(|s| {
                (
                    s.id.clone(),
                    Arc::new(Shard::new(&s.id, &s.addr, pool_options.clone())),
                )
            })
            .collect();
        self.set
            .set(ShardSet {
                pools,
                queues,
                shards,
            })
            .is_ok()
    }

    /// Adds the shards of `shards` the cluster does not have yet (with a pool and a queue
    /// each; a known id keeps its pool); returns how many were added. A cluster without shards
    /// installs the list instead.
    pub fn add_shards(&self, shards: Vec<ShardInfo>) -> usize {
        let mut grown = self
            .grown
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(current) = (*grown).or_else(|| self.set.get()) else {
            let n = shards.len();
            return if self.install_shards(shards) { n } else { 0 };
        };
        let new: Vec<ShardInfo> = shards
            .into_iter()
            .filter(|s| !current.pools.contains_key(&s.id))
            .collect();
        if new.is_empty() {
            return 0;
        }
        let mut set = ShardSet {
            pools: current.pools.clone(),
            queues: current.queues.clone(),
            shards: current.shards.clone(),
        };
        for s in &new {
            set.pools.insert(
                s.id.clone(),
                Arc::new(Shard::new(&s.id, &s.addr, self.pool_options.clone())),
            );
            set.queues.insert(
                s.id.clone(),
                Arc::new(ShardQueue::new(&s.id, self.batching.limiter())),
            );
        }
        set.shards.extend(new.iter().cloned());
        set.shards.sort_by(|a, b| a.id.cmp(&b.id));
        *grown = Some(Box::leak(Box::new(set)));
        new.len()
    }

    fn current(&self) -> Option<&ShardSet> {
        let grown = *self
            .grown
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        grown.or_else(|| self.set.get())
    }

    /// Whether the cluster has its shards (always, but for a `--configdb` router whose config
    /// server has not answered yet).
    pub fn has_shards(&self) -> bool {
        self.set.get().is_some()
    }

    fn pools(&self) -> &BTreeMap<String, Arc<Shard>> {
        self.current().map_or(&NO_POOLS, |s| &s.pools)
    }

    /// Bytes a blocking aggregation stage run at the router may hold (and the most of the
    /// shards' results one aggregation may gather).
    pub fn stage_memory(&self) -> usize {
        self.stage_memory.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Cluster::stage_memory`] (from the router's configuration).
    pub fn set_stage_memory(&self, bytes: usize) {
        self.stage_memory
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Opens each shard pool's idle connections (start-up).
    pub async fn warm_pools(&self) {
        for p in self.pools().values() {
            p.warm().await;
        }
    }

    /// The shards, sorted by id.
    pub fn shards(&self) -> &[ShardInfo] {
        self.current().map_or(&[], |s| s.shards.as_slice())
    }

    /// One shard: its pool, or for a replica set its monitor and members' pools.
    pub fn pool(&self, shard: &str) -> Option<&Arc<Shard>> {
        self.pools().get(shard)
    }

    /// The queue of one shard.
    pub fn queue(&self, shard: &str) -> Option<&Arc<ShardQueue>> {
        self.current()?.queues.get(shard)
    }

    /// Waits for an execution slot on `shard` for `work`, until the configured queue timeout
    /// (Sluice's admission control: ExceededTimeLimit, 262). A client's `maxTimeMS` is not
    /// a bound here: the dispatcher ends the whole request at it with MaxTimeMSExpired (50),
    /// as mongos does, and dropping the wait leaves the queue. Bounding the wait by it too
    /// made the two race at the same instant, and a request that met a stalled shard got
    /// 262 (as a write error, with `RetryableWriteError`) or 50 by the luck of the timer.
    pub async fn slot(
        &self,
        shard: &str,
        work: SlotRequest<'_>,
    ) -> Result<Option<LimitPermit>, QueueTimeout> {
        let Some(queue) = self.queue(shard) else {
            return Ok(None);
        };
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (work.command, work.ns).hash(&mut h);
        let info = BatchInfo {
            op: work.op,
            group: h.finish(),
            operations: work.operations.max(1),
            bytes: work.bytes,
        };
        let deadline = std::time::Instant::now() + self.queue_timeout;
        queue.acquire(info, deadline).await.map(Some)
    }

    /// Whether `shard` understands `shardVersion`.
    pub fn is_shard_server(&self, shard: &str) -> bool {
        self.shards()
            .iter()
            .any(|s| s.id == shard && s.shard_server)
    }

    /// Runs `body` on one shard.
    pub async fn run_on(&self, shard: &str, body: &Document) -> Result<Document, BackendError> {
        match self.pools().get(shard) {
            Some(p) => p.run_command(body).await,
            None => Err(BackendError::Unreachable(format!("unknown shard {shard}"))),
        }
    }

    /// Runs `body` on every shard at once; results in shard order.
    pub async fn run_on_all(
        &self,
        body: &Document,
    ) -> Vec<(String, Result<Document, BackendError>)> {
        let futures = self
            .pools()
            .iter()
            .map(|(id, p)| async move { (id.clone(), p.run_command(body).await) });
        crate::backend::join_all(futures).await
    }
}

/// Most transactions the router tracks at once; beyond it (after reaping idle ones) a new
/// transaction is refused with TooManyLogicalSessions (261).
pub const MAX_TRANSACTIONS: usize = 10_000;

/// How long a transaction may go unused before the router forgets it (mongod's
/// `transactionLifetimeLimitSeconds`, 60): its shard aborts it by then too.
pub const TRANSACTION_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The router's open transactions: session id → its current `txnNumber`, the shards it has
/// run on (its participants, in the order they joined, and whether each was sent a write),
/// the first statement's `readConcern` (every later participant starts with it) and the
/// cursors its statements opened. One entry per session (a newer `txnNumber` replaces the
/// older), keyed by the 16-byte session UUID, bounded by [`MAX_TRANSACTIONS`] and reaped after
/// [`TRANSACTION_IDLE_TIMEOUT`].
#[derive(Debug, Default)]
pub struct TransactionTable {
    entries: std::sync::Mutex<std::collections::HashMap<[u8; 16], TransactionEntry>>,
}

/// One shard a transaction has run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// The shard's id.
    pub shard: String,
    /// Whether a statement that may write was sent to it.
    pub wrote: bool,
}

/// How a statement joins its transaction on a shard.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    /// The statement is the transaction's first on this router.
    pub first: bool,
    /// The statement is the first on this shard, which is not the transaction's first shard:
    /// it must start the transaction there (`startTransaction`, the first `readConcern`).
    pub new_participant: bool,
    /// The first statement's `readConcern`.
    pub read_concern: Option<bson::Document>,
}

#[derive(Debug)]
struct TransactionEntry {
    txn_number: i64,
    participants: Vec<Participant>,
    read_concern: Option<bson::Document>,
    cursors: Vec<(i64, String)>,
    last_used: std::time::Instant,
}

impl TransactionTable {
    /// Records that a statement of transaction `txn` of `session` goes to `shard` (`wrote`:
    /// it may write). `read_concern` is the statement's own, kept when it starts the
    /// transaction.
    pub fn begin(
        &self,
        session: [u8; 16],
        txn: i64,
        shard: &str,
        wrote: bool,
        read_concern: Option<&bson::Document>,
    ) -> Result<Joined, crate::command::CommandError> {
        let mut entries = crate::sync::lock(&self.entries);
        if let Some(e) = entries.get_mut(&session) {
            if e.txn_number == txn {
                e.last_used = std::time::Instant::now();
                let new_participant = match e.participants.iter_mut().find(|p| p.shard == shard) {
                    Some(p) => {
                        p.wrote |= wrote;
                        false
                    }
                    None => {
                        e.participants.push(Participant {
                            shard: shard.to_string(),
                            wrote,
                        });
                        true
                    }
                };
                return Ok(Joined {
                    first: false,
                    new_participant,
                    read_concern: e.read_concern.clone(),
                });
            }
        } else if entries.len() >= MAX_TRANSACTIONS {
            entries.retain(|_, e| e.last_used.elapsed() < TRANSACTION_IDLE_TIMEOUT);
            if entries.len() >= MAX_TRANSACTIONS {
                return Err(crate::command::CommandError::new(
                    crate::value::error_codes::ErrorCode::TooManyLogicalSessions,
                    format!("Unable to start a transaction because the router already tracks {MAX_TRANSACTIONS} open transactions"),
                ));
            }
        }
        entries.insert(
            session,
            TransactionEntry {
                txn_number: txn,
                participants: vec![Participant {
                    shard: shard.to_string(),
                    wrote,
                }],
                read_concern: read_concern.cloned(),
                cursors: Vec::new(),
                last_used: std::time::Instant::now(),
            },
        );
        Ok(Joined {
            first: true,
            new_participant: false,
            read_concern: read_concern.cloned(),
        })
    }

    /// The participants of transaction `txn` of `session`, if recorded. The entry stays (a
    /// commit may be retried) until a newer transaction of the session replaces it or it is
    /// reaped.
    pub fn participants(&self, session: &[u8; 16], txn: i64) -> Option<Vec<Participant>> {
        let mut entries = crate::sync::lock(&self.entries);
        match entries.get_mut(session) {
            Some(e) if e.txn_number == txn => {
                e.last_used = std::time::Instant::now();
                Some(e.participants.clone())
            }
            _ => None,
        }
    }

    /// The first shard of transaction `txn` of `session`, if recorded.
    pub fn shard_of(&self, session: &[u8; 16], txn: i64) -> Option<String> {
        self.participants(session, txn)
            .and_then(|p| p.into_iter().next().map(|p| p.shard))
    }

    /// After a statement that joined `shard` to transaction `txn` of `session` as `joined`
    /// failed there: a transaction whose first statement on a shard failed does not exist
    /// there, so the shard leaves the participants, and the entry goes with its last
    /// participant (other shards that joined meanwhile, as in one scatter read, stay).
    pub fn join_failed(&self, session: &[u8; 16], txn: i64, shard: &str, joined: &Joined) {
        if !(joined.first || joined.new_participant) {
            return;
        }
        let mut entries = crate::sync::lock(&self.entries);
        if let Some(e) = entries.get_mut(session) {
            if e.txn_number == txn {
                e.participants.retain(|p| p.shard != shard);
                if e.participants.is_empty() {
                    entries.remove(session);
                }
            }
        }
    }

    /// Records that cursor `id` of transaction `txn` of `session` lives on `shard`.
    pub fn add_cursor(&self, session: &[u8; 16], txn: i64, id: i64, shard: &str) {
        let mut entries = crate::sync::lock(&self.entries);
        if let Some(e) = entries.get_mut(session) {
            if e.txn_number == txn {
                e.cursors.retain(|(c, _)| *c != id);
                e.cursors.push((id, shard.to_string()));
            }
        }
    }

    /// The shard cursor `id` of transaction `txn` of `session` lives on.
    pub fn cursor_shard(&self, session: &[u8; 16], txn: i64, id: i64) -> Option<String> {
        let entries = crate::sync::lock(&self.entries);
        match entries.get(session) {
            Some(e) if e.txn_number == txn => e
                .cursors
                .iter()
                .find(|(c, _)| *c == id)
                .map(|(_, s)| s.clone()),
            _ => None,
        }
    }

    /// Forgets transaction `txn` of `session`; returns its participants if it was recorded.
    pub fn end(&self, session: &[u8; 16], txn: i64) -> Option<Vec<Participant>> {
        let mut entries = crate::sync::lock(&self.entries);
        match entries.get(session) {
            Some(e) if e.txn_number == txn => entries.remove(session).map(|e| e.participants),
            _ => None,
        }
    }

    /// Transactions tracked.
    pub fn len(&self) -> usize {
        crate::sync::lock(&self.entries).len()
    }

    /// Whether none is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_gathers_its_participants_and_what_each_wrote() {
        let t = TransactionTable::default();
        let s = [1u8; 16];
        let rc = bson::doc! {"level": "snapshot"};
        let first = t.begin(s, 1, "a", false, Some(&rc)).unwrap();
        assert!(first.first && !first.new_participant);
        // The first shard again: not new; its write is remembered.
        let again = t.begin(s, 1, "a", true, None).unwrap();
        assert!(!again.first && !again.new_participant);
        // A second shard joins with the first statement's readConcern.
        let b = t.begin(s, 1, "b", false, None).unwrap();
        assert!(b.new_participant);
        assert_eq!(b.read_concern, Some(rc));
        assert_eq!(
            t.participants(&s, 1).unwrap(),
            vec![
                Participant {
                    shard: "a".into(),
                    wrote: true
                },
                Participant {
                    shard: "b".into(),
                    wrote: false
                },
            ]
        );
        assert_eq!(t.shard_of(&s, 1).as_deref(), Some("a"));
        t.add_cursor(&s, 1, 77, "b");
        assert_eq!(t.cursor_shard(&s, 1, 77).as_deref(), Some("b"));
        assert_eq!(t.cursor_shard(&s, 1, 78), None);
        // b's first statement failed: it leaves, a stays.
        t.join_failed(&s, 1, "b", &b);
        assert_eq!(t.participants(&s, 1).unwrap().len(), 1);
        // A newer number replaces the entry; the older one is unknown.
        let next = t.begin(s, 2, "b", true, None).unwrap();
        assert!(next.first);
        assert_eq!(t.participants(&s, 1), None);
        assert_eq!(t.end(&s, 2).map(|p| p.len()), Some(1));
        assert!(t.is_empty());
    }
}
