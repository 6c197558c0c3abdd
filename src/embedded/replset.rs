//! The embedded replica set: a **test backend** that behaves like a replica set on the wire.
//! It does not replicate: its members share one data set (catalog, retryable-write records and
//! shard versions behind `Arc`s), which is enough to exercise discovery, failover, read
//! preferences and cursor pinning end to end. Memory only, not for production.
//!
//! Each member listens on its own loopback port with its own `topologyVersion` (a `processId`
//! new at each start, a `counter` bumped on every change of what its `hello` says), its own
//! command counters (`serverStatus` per member) and its own cursors. One member is primary at a
//! time; the set's term counter makes the primary's `electionId` (`0x7fffffff` + the term, as
//! mongod's). `replSetStepDown`, `replSetFreeze` and stopping a member move the primary: the
//! next running member that is not frozen is elected after the election delay, so a client sees
//! a window without a primary, as with a real election.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bson::{doc, oid::ObjectId, Bson, Document};
use tokio::sync::watch;

use super::service::{lock, DataSet};
use super::{EmbeddedShard, ShardOptions};
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::number_field;

/// How long an election takes by default: the window in which the set has no primary.
pub const DEFAULT_ELECTION_DELAY: Duration = Duration::from_millis(200);

/// How often an election without an electable member looks again.
const ELECTION_RETRY: Duration = Duration::from_millis(50);

/// How long a primary shut down by `shutdown` stays unelectable (mongod's `stepDown` on
/// shutdown: 120 s).
const SHUTDOWN_STEP_DOWN: Duration = Duration::from_secs(120);

/// What a member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberRole {
    /// Accepts writes.
    Primary,
    /// Serves reads that allow secondaries; refuses writes (10107).
    Secondary,
    /// Not running: no listener, no connections.
    Stopped,
}

/// What a test asks a member to do right after it applied a write, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterWrite {
    /// Close the connection instead of replying: the write is applied, its reply lost.
    CloseConnection,
    /// Step down and answer InterruptedDueToReplStateChange (11602): applied, then refused.
    StepDown,
    /// Step down, then answer as usual half a second later (another member is primary by
    /// then): the write is acknowledged, and a cursor its reply opened (a `bulkWrite`'s) is
    /// left on a member that is no longer primary.
    StepDownAfterReply,
}

#[derive(Debug)]
struct MemberSlot {
    addr: String,
    role: MemberRole,
    process_id: ObjectId,
    counter: i64,
    frozen_until: Option<Instant>,
    lag: Duration,
    /// The member does not acknowledge writes (its replication is held back by a test): a
    /// write concern counts it only once this is lifted.
    replication_paused: bool,
    changed: watch::Sender<i64>,
    after_write: Option<AfterWrite>,
    /// The member is stalled (a test's in-process SIGSTOP): while `true` it starts no command
    /// and sends no reply.
    stalled: watch::Sender<bool>,
}

#[derive(Debug)]
struct SetInner {
    members: Vec<MemberSlot>,
    primary: Option<usize>,
    last_primary: usize,
    term: i64,
    election_running: bool,
    election_delay: Duration,
    /// The DDL coordinator phase after which the primary steps down (or stops, `true`), once
    /// (a test's fail point; no command reaches it).
    step_down_after_phase: Option<(String, bool)>,
}

/// The state the members of one set share: who is primary, each member's `hello` state.
#[derive(Debug)]
pub struct ReplicaSetState {
    name: String,
    inner: Mutex<SetInner>,
    this: Weak<ReplicaSetState>,
}

/// A member's view of its set, held by its command handler.
#[derive(Debug, Clone)]
pub struct MemberLink {
    set: Arc<ReplicaSetState>,
    index: usize,
}

/// The `electionId` of a term: `0x7fffffff` followed by the term, as mongod makes it.
pub fn election_id(term: i64) -> ObjectId {
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    bytes[4..].copy_from_slice(&term.to_be_bytes());
    ObjectId::from_bytes(bytes)
}

/// Commands a secondary refuses with NotWritablePrimary.
const WRITE_COMMANDS: &[&str] = &[
    "insert",
    "update",
    "delete",
    "bulkWrite",
    "findAndModify",
    "findandmodify",
    "create",
    "drop",
    "dropDatabase",
    "createIndexes",
    "dropIndexes",
    "collMod",
    "renameCollection",
];

/// A `writeConcernError` document as mongod writes it.
fn write_concern_error(code: ErrorCode, errmsg: String, info: Option<Document>) -> Document {
    let mut d = doc! {"code": code.0, "codeName": code.name(), "errmsg": errmsg};
    if let Some(info) = info {
        d.insert("errInfo", info);
    }
    d
}

/// Whether `name` is a command a secondary refuses (a write).
pub fn is_write(name: &str) -> bool {
    WRITE_COMMANDS.contains(&name)
}

/// Commands a secondary serves only with a non-primary read preference.
const READ_COMMANDS: &[&str] = &[
    "find",
    "aggregate",
    "count",
    "distinct",
    "listCollections",
    "listIndexes",
    "listDatabases",
    "collStats",
    "dbStats",
    "dataSize",
];

/// Whether the request allows a secondary to serve it: a `$readPreference` whose mode is not
/// `primary`.
fn secondary_ok(body: &Document) -> bool {
    match body.get("$readPreference") {
        Some(Bson::Document(rp)) => {
            !matches!(rp.get("mode"), Some(Bson::String(m)) if m == "primary")
        }
        _ => false,
    }
}

impl ReplicaSetState {
    fn new(name: &str, addrs: Vec<String>, election_delay: Duration) -> Arc<ReplicaSetState> {
        let members = addrs
            .into_iter()
            .enumerate()
            .map(|(i, addr)| MemberSlot {
                addr,
                role: if i == 0 {
                    MemberRole::Primary
                } else {
                    MemberRole::Secondary
                },
                process_id: ObjectId::new(),
                counter: 0,
                frozen_until: None,
                lag: Duration::ZERO,
                replication_paused: false,
                changed: watch::channel(0).0,
                after_write: None,
                stalled: watch::channel(false).0,
            })
            .collect();
        Arc::new_cyclic(|this| ReplicaSetState {
            name: name.to_string(),
            inner: Mutex::new(SetInner {
                members,
                primary: Some(0),
                last_primary: 0,
                term: 1,
                election_running: false,
                election_delay,
                step_down_after_phase: None,
            }),
            this: this.clone(),
        })
    }

    /// Bumps the `topologyVersion` of every running member (their `hello` names the primary,
    /// so every change of primary changes every member's reply) and wakes their awaitable
    /// `hello`s.
    fn bump_all(inner: &mut SetInner) {
        for m in inner.members.iter_mut() {
            if m.role != MemberRole::Stopped {
                m.counter += 1;
                let _ = m.changed.send(m.counter);
            }
        }
    }

    /// Makes the primary a secondary frozen for `freeze`, and starts an election.
    fn step_down_locked(&self, inner: &mut SetInner, freeze: Duration) {
        let Some(p) = inner.primary.take() else {
            return;
        };
        inner.members[p].role = MemberRole::Secondary;
        inner.members[p].frozen_until = Some(Instant::now() + freeze);
        Self::bump_all(inner);
        self.start_election(inner);
    }

    /// Marks member `i` stopped: it leaves the running members (a primary's departure starts
    /// an election) and refuses what it is still asked until its listener closes.
    fn mark_stopped(&self, inner: &mut SetInner, i: usize) {
        let Some(m) = inner.members.get_mut(i) else {
            return;
        };
        m.role = MemberRole::Stopped;
        m.after_write = None;
        m.stalled.send_replace(false);
        if inner.primary == Some(i) {
            inner.primary = None;
        }
        Self::bump_all(inner);
        self.start_election(inner);
    }

    /// Whether primary `p` can hand over: a majority of the members have its writes (running,
    /// replication not held back) and one of them is an electable secondary (not frozen), as
    /// mongod's `stepDown` without `force` waits for.
    fn can_hand_over(inner: &SetInner, p: usize) -> bool {
        let have = |m: &MemberSlot| m.role != MemberRole::Stopped && !m.replication_paused;
        let caught_up = inner.members.iter().filter(|m| have(m)).count();
        let now = Instant::now();
        let electable = inner.members.iter().enumerate().any(|(i, m)| {
            i != p
                && m.role == MemberRole::Secondary
                && have(m)
                && m.frozen_until.is_none_or(|t| t <= now)
        });
        caught_up > inner.members.len() / 2 && electable
    }

    fn start_election(&self, inner: &mut SetInner) {
        if inner.election_running || inner.primary.is_some() {
            return;
        }
        inner.election_running = true;
        let delay = inner.election_delay;
        let weak = self.this.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            loop {
                let Some(set) = weak.upgrade() else {
                    return;
                };
                if set.try_elect() {
                    return;
                }
                drop(set);
                tokio::time::sleep(ELECTION_RETRY).await;
            }
        });
    }

    /// Elects the next running, unfrozen member after the last primary; `true` when the
    /// election is over (a primary exists, or no member runs).
    fn try_elect(&self) -> bool {
        let mut inner = lock(&self.inner);
        if inner.primary.is_some() {
            inner.election_running = false;
            return true;
        }
        let n = inner.members.len();
        if inner.members.iter().all(|m| m.role == MemberRole::Stopped) {
            inner.election_running = false;
            return true;
        }
        let now = Instant::now();
        let start = inner.last_primary;
        let candidate = (1..=n).map(|k| (start + k) % n).find(|&i| {
            let m = &inner.members[i];
            m.role == MemberRole::Secondary && m.frozen_until.is_none_or(|t| t <= now)
        });
        let Some(c) = candidate else {
            return false;
        };
        inner.term += 1;
        inner.members[c].role = MemberRole::Primary;
        inner.members[c].frozen_until = None;
        inner.primary = Some(c);
        inner.last_primary = c;
        inner.election_running = false;
        Self::bump_all(&mut inner);
        true
    }
}

impl MemberLink {
    /// The set's term while this member is its primary; `None` otherwise.
    pub fn primary_term(&self) -> Option<i64> {
        let inner = lock(&self.set.inner);
        (inner.primary == Some(self.index)).then_some(inner.term)
    }

    /// Wakes on every change of what this member's `hello` says (its role among them).
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        lock(&self.set.inner).members[self.index]
            .changed
            .subscribe()
    }

    /// A DDL coordinator on this member recorded `phase`: when a test asked for it, the
    /// member steps down now (unelectable for a minute), or stops as a killed member does,
    /// once. `true` if it did.
    pub fn step_down_after_phase(&self, phase: &str) -> bool {
        let mut inner = lock(&self.set.inner);
        let stop = match &inner.step_down_after_phase {
            Some((p, stop)) if p == phase && inner.primary == Some(self.index) => *stop,
            _ => return false,
        };
        inner.step_down_after_phase = None;
        if stop {
            self.set.mark_stopped(&mut inner, self.index);
        } else {
            self.set
                .step_down_locked(&mut inner, Duration::from_secs(60));
        }
        true
    }

    /// This member's role now.
    pub fn role(&self) -> MemberRole {
        lock(&self.set.inner).members[self.index].role
    }

    /// Refuses what this member's role does not allow: writes on a secondary (10107), reads
    /// without a non-primary read preference on a secondary (13435).
    /// The error carries the member's `topologyVersion`, as mongod's do, so a router's monitor
    /// can tell whether it already knows of the change.
    pub fn check(&self, name: &str, body: &Document) -> Result<(), EngineError> {
        let (role, tv) = {
            let inner = lock(&self.set.inner);
            let me = &inner.members[self.index];
            (
                me.role,
                doc! {"processId": me.process_id, "counter": me.counter},
            )
        };
        if role == MemberRole::Primary {
            return Ok(());
        }
        let refusal = if role == MemberRole::Stopped {
            // Shut down by `shutdown`, its listener not closed yet.
            EngineError::new(
                ErrorCode::ShutdownInProgress,
                "The server is in quiesce mode and will shut down",
            )
        } else if WRITE_COMMANDS.contains(&name) {
            EngineError::new(ErrorCode::NotWritablePrimary, "not primary")
        } else if READ_COMMANDS.contains(&name) && !secondary_ok(body) {
            EngineError::new(
                ErrorCode::NotPrimaryNoSecondaryOk,
                "not primary and secondaryOk=false",
            )
        } else {
            return Ok(());
        };
        Err(refusal.with_extra(doc! {"topologyVersion": tv}))
    }

    /// Waits, for an awaitable `hello` whose `topologyVersion` is this member's current one,
    /// until the member's state changes, `maxAwaitTimeMS` passes, or `shutdown` flips.
    pub async fn await_change(&self, body: &Document, mut shutdown: watch::Receiver<bool>) {
        let (Ok(tv), Some(wait)) = (
            body.get_document("topologyVersion"),
            number_field(body, "maxAwaitTimeMS"),
        ) else {
            return;
        };
        let mut rx = {
            let inner = lock(&self.set.inner);
            let m = &inner.members[self.index];
            let current = tv.get_object_id("processId").ok() == Some(m.process_id)
                && number_field(tv, "counter") == Some(m.counter);
            if !current {
                return;
            }
            m.changed.subscribe()
        };
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)) => {}
            _ = rx.changed() => {}
            _ = shutdown.changed() => {}
        }
    }

    /// The replica-set fields of this member's `hello`, written over (or removed from) those of
    /// a primary's reply.
    pub fn hello_fields(&self, name: &str, d: &mut Document) {
        let inner = lock(&self.set.inner);
        let me = &inner.members[self.index];
        d.insert(
            "topologyVersion",
            doc! {"processId": me.process_id, "counter": me.counter},
        );
        let hosts: Vec<Bson> = inner
            .members
            .iter()
            .map(|m| Bson::String(m.addr.clone()))
            .collect();
        d.insert("hosts", hosts);
        d.insert("setName", &self.set.name);
        d.insert("setVersion", 1);
        let primary = me.role == MemberRole::Primary;
        if name == "hello" {
            d.insert("isWritablePrimary", primary);
        } else {
            d.insert("ismaster", primary);
        }
        d.insert("secondary", me.role == MemberRole::Secondary);
        match inner.primary {
            Some(p) => d.insert("primary", inner.members[p].addr.clone()),
            None => d.remove("primary"),
        };
        d.insert("me", me.addr.clone());
        if primary {
            d.insert("electionId", election_id(inner.term));
        } else {
            d.remove("electionId");
        }
        let wall = bson::DateTime::from_system_time(std::time::SystemTime::now() - me.lag);
        let secs = (wall.timestamp_millis() / 1000).max(0) as u32;
        d.insert(
            "lastWrite",
            doc! {
                "opTime": {"ts": bson::Timestamp { time: secs, increment: 1 }, "t": inner.term},
                "lastWriteDate": wall,
            },
        );
    }

    /// The `repl` section of this member's `serverStatus`.
    pub fn repl_status(&self) -> Document {
        let inner = lock(&self.set.inner);
        let me = &inner.members[self.index];
        let mut d = doc! {
            "setName": &self.set.name,
            "isWritablePrimary": me.role == MemberRole::Primary,
            "secondary": me.role == MemberRole::Secondary,
            "me": me.addr.clone(),
        };
        if let Some(p) = inner.primary {
            d.insert("primary", inner.members[p].addr.clone());
        }
        d
    }

    /// `replSetStepDown`: the primary becomes a secondary that cannot be elected for
    /// `stepDownSecs` (60 by default), and the next member is elected.
    pub fn step_down(&self, body: &Document) -> Result<Document, EngineError> {
        let secs = match body.get("replSetStepDown") {
            Some(v) => v
                .as_f64()
                .or_else(|| v.as_i64().map(|i| i as f64))
                .or_else(|| v.as_i32().map(f64::from)),
            None => None,
        }
        .unwrap_or(60.0);
        if !secs.is_finite() || secs < 0.0 {
            return Err(EngineError::new(
                ErrorCode::BadValue,
                "stepdown period must be a positive integer",
            ));
        }
        let catch_up = number_field(body, "secondaryCatchUpPeriodSecs").unwrap_or(10);
        if body.contains_key("secondaryCatchUpPeriodSecs") && (catch_up as f64) > secs {
            return Err(EngineError::new(
                ErrorCode::BadValue,
                "stepdown period must be longer than secondaryCatchUpPeriodSecs",
            ));
        }
        let mut inner = lock(&self.set.inner);
        if inner.primary != Some(self.index) {
            return Err(EngineError::new(
                ErrorCode::NotWritablePrimary,
                "not primary so can't step down",
            ));
        }
        self.set
            .step_down_locked(&mut inner, Duration::from_secs_f64(secs));
        Ok(Document::new())
    }

    /// `replSetFreeze`: this secondary cannot be elected for the given seconds (0 unfreezes).
    pub fn freeze(&self, body: &Document) -> Result<Document, EngineError> {
        let secs = number_field(body, "replSetFreeze").ok_or_else(|| {
            EngineError::new(
                ErrorCode::TypeMismatch,
                "replSetFreeze takes a number of seconds",
            )
        })?;
        let mut inner = lock(&self.set.inner);
        let me = &mut inner.members[self.index];
        if me.role == MemberRole::Primary {
            return Err(EngineError::new(
                ErrorCode::NotSecondary,
                "cannot freeze node when primary or running for election. state: Primary",
            ));
        }
        if secs <= 0 {
            me.frozen_until = None;
            return Ok(doc! {"info": "unfreezing"});
        }
        me.frozen_until = Some(Instant::now() + Duration::from_secs(secs as u64));
        Ok(Document::new())
    }

    /// `replSetGetStatus`: the set's members and their states.
    pub fn status(&self) -> Document {
        let inner = lock(&self.set.inner);
        let members: Vec<Bson> = inner
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let (state, name) = match m.role {
                    MemberRole::Primary => (1, "PRIMARY"),
                    MemberRole::Secondary => (2, "SECONDARY"),
                    MemberRole::Stopped => (8, "(not reachable/healthy)"),
                };
                let mut d = doc! {
                    "_id": i as i32,
                    "name": m.addr.clone(),
                    "health": if m.role == MemberRole::Stopped { 0.0 } else { 1.0 },
                    "state": state,
                    "stateStr": name,
                };
                if i == self.index {
                    d.insert("self", true);
                }
                Bson::Document(d)
            })
            .collect();
        let me = &inner.members[self.index];
        doc! {
            "set": &self.set.name,
            "date": bson::DateTime::now(),
            "myState": match me.role { MemberRole::Primary => 1, _ => 2 },
            "term": inner.term,
            "members": members,
        }
    }

    /// Waits while the member is stalled ([`EmbeddedReplicaSet::stall`]): called before a
    /// command runs and before its reply is sent, so a stalled member neither reads nor
    /// answers, as a process stopped by SIGSTOP, while its connections stay open.
    pub async fn wait_while_stalled(&self) {
        let mut rx = lock(&self.set.inner).members[self.index]
            .stalled
            .subscribe();
        // Ends when the flag is `false`, or when the set is gone (its sender dropped).
        let _ = rx.wait_for(|stalled| !*stalled).await;
    }

    /// `shutdown` on this member, as mongod runs it (after the checks of
    /// `server_info::shutdown_request`): a primary first steps down — without `force` only
    /// once a majority has its writes and an electable secondary is caught up, waiting up to
    /// `timeoutSecs` and otherwise refusing with ExceededTimeLimit (262) and staying primary;
    /// with `force` at once — and stays unelectable for 120 s; a secondary just stops. On
    /// `Ok` the member is stopped (an election follows if it was primary); the caller then
    /// closes its listener and connections.
    pub async fn shutdown(
        &self,
        request: crate::command::server_info::ShutdownRequest,
    ) -> Result<(), EngineError> {
        let deadline = Instant::now() + request.timeout;
        loop {
            {
                let mut inner = lock(&self.set.inner);
                if inner.primary != Some(self.index) {
                    self.set.mark_stopped(&mut inner, self.index);
                    return Ok(());
                }
                if request.force || ReplicaSetState::can_hand_over(&inner, self.index) {
                    self.set.step_down_locked(&mut inner, SHUTDOWN_STEP_DOWN);
                    self.set.mark_stopped(&mut inner, self.index);
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                let now = bson::DateTime::now()
                    .try_to_rfc3339_string()
                    .unwrap_or_default();
                return Err(EngineError::new(
                    ErrorCode::ExceededTimeLimit,
                    format!("No electable secondaries caught up as of {now}. Please use the replSetStepDown command with the argument {{force: true}} to force node to step down."),
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The test hook to run after this member applied a write, taken once.
    pub fn take_after_write(&self) -> Option<AfterWrite> {
        lock(&self.set.inner).members[self.index].after_write.take()
    }

    /// Waits for the write concern of a write this member just applied (`writeConcern` of
    /// `body`), as a primary does: `w` 0 or 1 is satisfied at once; a number or
    /// `"majority"` (of every member, running or not) waits until that many members have the
    /// write — every running member whose replication is not held back has it, since the set
    /// shares its data — or `wtimeout` milliseconds pass (none or 0: no limit). Returns the
    /// `writeConcernError` of the reply, if any: 64 `waiting for replication timed out` with
    /// `errInfo.wtimeout`, 100 for more members than the set has, 79 for a tag set the
    /// configuration does not define, 189 when the member stops being primary meanwhile.
    pub async fn wait_for_write_concern(&self, body: &Document) -> Option<Document> {
        let wc = body.get_document("writeConcern").ok()?;
        let members = lock(&self.set.inner).members.len() as i64;
        let needed = match wc.get("w") {
            Some(Bson::String(m)) if m == "majority" => members / 2 + 1,
            Some(Bson::String(tag)) => {
                return Some(write_concern_error(
                    ErrorCode::UnknownReplWriteConcern,
                    format!(
                        "No write concern mode named '{tag}' found in replica set configuration"
                    ),
                    None,
                ))
            }
            Some(_) => number_field(wc, "w").unwrap_or(1),
            None => 1,
        };
        if needed <= 1 {
            return None;
        }
        if needed > members {
            return Some(write_concern_error(
                ErrorCode::UnsatisfiableWriteConcern,
                "Not enough data-bearing nodes".to_string(),
                None,
            ));
        }
        let timeout = number_field(wc, "wtimeout")
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(ms as u64));
        let started = Instant::now();
        loop {
            let (have, primary) = {
                let inner = lock(&self.set.inner);
                let have = inner
                    .members
                    .iter()
                    .filter(|m| m.role != MemberRole::Stopped && !m.replication_paused)
                    .count() as i64;
                (have, inner.primary == Some(self.index))
            };
            if !primary {
                return Some(write_concern_error(
                    ErrorCode::PrimarySteppedDown,
                    "Primary stepped down while waiting for replication".to_string(),
                    None,
                ));
            }
            if have >= needed {
                return None;
            }
            if timeout.is_some_and(|t| started.elapsed() >= t) {
                let mut echoed = wc.clone();
                echoed.insert("provenance", "clientSupplied");
                return Some(write_concern_error(
                    ErrorCode::WriteConcernTimeout,
                    "waiting for replication timed out".to_string(),
                    Some(doc! {"wtimeout": true, "writeConcern": echoed}),
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Steps the primary down now (the `AfterWrite::StepDown` hook), frozen for `freeze`.
    pub fn step_down_now(&self, freeze: Duration) {
        let mut inner = lock(&self.set.inner);
        if inner.primary == Some(self.index) {
            self.set.step_down_locked(&mut inner, freeze);
        }
    }
}

/// How to start an embedded replica set.
#[derive(Debug, Clone)]
pub struct ReplicaSetOptions {
    /// Members (at least 1).
    pub members: usize,
    /// How long an election takes (the window without a primary).
    pub election_delay: Duration,
    /// Each member's shard options; `set_name` is the set's name.
    pub shard: ShardOptions,
}

impl Default for ReplicaSetOptions {
    fn default() -> Self {
        ReplicaSetOptions {
            members: 3,
            election_delay: DEFAULT_ELECTION_DELAY,
            shard: ShardOptions {
                set_name: "rs0".into(),
                ..ShardOptions::default()
            },
        }
    }
}

/// A running embedded replica set (a test backend: the members share one data set).
#[derive(Debug)]
pub struct EmbeddedReplicaSet {
    state: Arc<ReplicaSetState>,
    data: DataSet,
    options: ReplicaSetOptions,
    members: tokio::sync::Mutex<Vec<Option<EmbeddedShard>>>,
    addrs: Vec<String>,
}

impl EmbeddedReplicaSet {
    /// Starts the members on ephemeral loopback ports; member 0 is the first primary.
    pub async fn start(options: ReplicaSetOptions) -> std::io::Result<EmbeddedReplicaSet> {
        let listens = vec!["127.0.0.1:0".to_string(); options.members.max(1)];
        Self::start_on(&listens, options).await
    }

    /// Starts one member on each of `listens`.
    pub async fn start_on(
        listens: &[String],
        options: ReplicaSetOptions,
    ) -> std::io::Result<EmbeddedReplicaSet> {
        if listens.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a replica set needs at least one member",
            ));
        }
        // Bind every member first so that `hosts` is complete before anyone asks.
        let mut listeners = Vec::with_capacity(listens.len());
        for l in listens {
            let addr: std::net::SocketAddr = l.parse().map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("invalid listen address {l:?}"),
                )
            })?;
            listeners.push(crate::frontend::bind(addr, 128)?);
        }
        let addrs: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.to_string()))
            .collect::<Result<_, _>>()?;
        let state = ReplicaSetState::new(
            &options.shard.set_name,
            addrs.clone(),
            options.election_delay,
        );
        let data = DataSet::default();
        let mut members = Vec::with_capacity(addrs.len());
        for (i, listener) in listeners.into_iter().enumerate() {
            let link = MemberLink {
                set: state.clone(),
                index: i,
            };
            members.push(Some(
                EmbeddedShard::start_member(listener, options.shard.clone(), data.clone(), link)
                    .await?,
            ));
        }
        Ok(EmbeddedReplicaSet {
            state,
            data,
            options,
            members: tokio::sync::Mutex::new(members),
            addrs,
        })
    }

    /// The set's name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The members' addresses, in member order.
    pub fn hosts(&self) -> &[String] {
        &self.addrs
    }

    /// The seed list a router is given: `"rs0/h1:p1,h2:p2,…"`.
    pub fn seed_list(&self) -> String {
        format!("{}/{}", self.state.name, self.addrs.join(","))
    }

    /// The current primary's member index, if there is one.
    pub fn primary(&self) -> Option<usize> {
        lock(&self.state.inner).primary
    }

    /// Member `i`'s role.
    pub fn role(&self, i: usize) -> Option<MemberRole> {
        lock(&self.state.inner).members.get(i).map(|m| m.role)
    }

    /// The current term (grows with each election).
    pub fn term(&self) -> i64 {
        lock(&self.state.inner).term
    }

    /// Waits until some member is primary, up to `timeout`.
    pub async fn wait_for_primary(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(p) = self.primary() {
                return Some(p);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Member `i`'s command handler (its counters), while it runs.
    pub async fn service(&self, i: usize) -> Option<Arc<super::ShardService>> {
        self.members
            .lock()
            .await
            .get(i)
            .and_then(|m| m.as_ref().map(|m| m.service().clone()))
    }

    /// `metrics.commands.<name>.total` of member `i` (0 when it is stopped).
    pub async fn command_total(&self, i: usize, name: &str) -> i64 {
        match self.service(i).await {
            Some(s) => s.command_total(name),
            None => 0,
        }
    }

    /// `metrics.commands.<name>.failed` of member `i` (0 when it is stopped).
    pub async fn command_failed(&self, i: usize, name: &str) -> i64 {
        match self.service(i).await {
            Some(s) => s.command_failed(name),
            None => 0,
        }
    }

    /// Documents in `db.coll` (the shared data set).
    pub fn documents(&self, db: &str, coll: &str) -> Vec<Document> {
        self.data.documents(db, coll)
    }

    /// Steps the primary down (as `replSetStepDown` would) for `freeze`; `false` without a
    /// primary.
    pub fn step_down(&self, freeze: Duration) -> bool {
        let mut inner = lock(&self.state.inner);
        if inner.primary.is_none() {
            return false;
        }
        self.state.step_down_locked(&mut inner, freeze);
        true
    }

    /// Test fail point: the primary steps down right after one of its DDL coordinators
    /// recorded `phase` in `config.system.sharding_ddl_coordinators` (before acting on it),
    /// once; the next primary resumes the coordinator. Reached only in process.
    pub fn step_down_after_ddl_phase(&self, phase: &str) {
        lock(&self.state.inner).step_down_after_phase = Some((phase.to_string(), false));
    }

    /// As [`EmbeddedReplicaSet::step_down_after_ddl_phase`], the primary stopping instead (it
    /// refuses everything from then on; [`EmbeddedReplicaSet::stop`] then closes its listener
    /// and connections, as a kill does).
    pub fn stop_after_ddl_phase(&self, phase: &str) {
        lock(&self.state.inner).step_down_after_phase = Some((phase.to_string(), true));
    }

    /// Makes member `i` unelectable for `freeze` (zero unfreezes).
    pub fn freeze(&self, i: usize, freeze: Duration) {
        let mut inner = lock(&self.state.inner);
        if let Some(m) = inner.members.get_mut(i) {
            m.frozen_until = (!freeze.is_zero()).then(|| Instant::now() + freeze);
        }
    }

    /// How long the next elections take.
    pub fn set_election_delay(&self, delay: Duration) {
        lock(&self.state.inner).election_delay = delay;
    }

    /// Makes member `i` report a `lastWriteDate` `lag` behind the clock (to test
    /// `maxStalenessSeconds`).
    pub fn set_lag(&self, i: usize, lag: Duration) {
        let mut inner = lock(&self.state.inner);
        if let Some(m) = inner.members.get_mut(i) {
            m.lag = lag;
            m.counter += 1;
            let _ = m.changed.send(m.counter);
        }
    }

    /// Holds back (or lets go) member `i`'s replication: while held back it does not count
    /// towards a write concern, so `w: "majority"` or `w: <n>` waits for it, up to `wtimeout`.
    pub fn pause_replication(&self, i: usize, paused: bool) {
        let mut inner = lock(&self.state.inner);
        if let Some(m) = inner.members.get_mut(i) {
            m.replication_paused = paused;
        }
    }

    /// Stalls (or resumes) member `i`, as SIGSTOP and SIGCONT would a mongod: while stalled
    /// it keeps its listener and its connections but starts no command and sends no reply
    /// (commands it already started finish, their replies held back), and its `hello` goes
    /// unanswered, so the set keeps its primary; on resuming it runs what it had read and
    /// sends what it held back. A stall longer than a real set's election timeout would cost
    /// mongod its primary role; here the primary stays until a test steps it down.
    pub fn stall(&self, i: usize, stalled: bool) {
        let inner = lock(&self.state.inner);
        if let Some(m) = inner.members.get(i) {
            m.stalled.send_replace(stalled);
        }
    }

    /// Arms a one-shot hook on member `i`, run right after it next applies a write.
    pub fn after_next_write(&self, i: usize, action: AfterWrite) {
        let mut inner = lock(&self.state.inner);
        if let Some(m) = inner.members.get_mut(i) {
            m.after_write = Some(action);
        }
    }

    /// Whether member `i` still has a hook armed by [`EmbeddedReplicaSet::after_next_write`]
    /// (it has not applied a write since).
    pub fn after_write_pending(&self, i: usize) -> bool {
        lock(&self.state.inner)
            .members
            .get(i)
            .is_some_and(|m| m.after_write.is_some())
    }

    /// Stops member `i`: it leaves the set's running members (a primary's departure starts an
    /// election), its listener closes and so does every connection it has, at once.
    pub async fn stop(&self, i: usize) {
        {
            let mut inner = lock(&self.state.inner);
            if i >= inner.members.len() {
                return;
            }
            self.state.mark_stopped(&mut inner, i);
        }
        let member = self.members.lock().await.get_mut(i).and_then(Option::take);
        if let Some(m) = member {
            m.shutdown().await;
        }
    }

    /// Starts member `i` again on its address, as a secondary with a new `processId` (its
    /// cursors are gone: a `getMore` for one answers CursorNotFound). A member that shut
    /// itself down (`shutdown`) is restarted the same way.
    pub async fn restart(&self, i: usize) -> std::io::Result<()> {
        let mut members = self.members.lock().await;
        if i >= members.len() || self.role(i) != Some(MemberRole::Stopped) {
            return Ok(());
        }
        if let Some(down) = members[i].take() {
            down.shutdown().await;
        }
        let addr: std::net::SocketAddr = self.addrs[i]
            .parse()
            .map_err(|_| std::io::Error::other("bad member address"))?;
        let listener = crate::frontend::bind(addr, 128)?;
        {
            let mut inner = lock(&self.state.inner);
            let m = &mut inner.members[i];
            m.role = MemberRole::Secondary;
            m.process_id = ObjectId::new();
            m.counter = 0;
            m.frozen_until = None;
            ReplicaSetState::bump_all(&mut inner);
            self.state.start_election(&mut inner);
        }
        let link = MemberLink {
            set: self.state.clone(),
            index: i,
        };
        members[i] = Some(
            EmbeddedShard::start_member(
                listener,
                self.options.shard.clone(),
                self.data.clone(),
                link,
            )
            .await?,
        );
        Ok(())
    }

    /// Stops every member.
    pub async fn shutdown(self) {
        let members = std::mem::take(&mut *self.members.lock().await);
        {
            let mut inner = lock(&self.state.inner);
            for m in inner.members.iter_mut() {
                m.role = MemberRole::Stopped;
                m.stalled.send_replace(false);
            }
            inner.primary = None;
        }
        for m in members.into_iter().flatten() {
            m.shutdown().await;
        }
    }
}
