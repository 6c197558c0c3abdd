//! The write path: `insert`, `update`, `delete` (and `findAndModify`) on sharded collections.
//!
//! [`target`] decides where each statement goes, [`plan`] turns the statements into rounds of child
//! batches (mongos rounds, an unordered round, or the proven one-round rewrite), the executor here
//! sends each round's child batches concurrently over the shard pools, and [`merge`] builds the
//! client's reply. [`lookup`] decides the steps of a single-document write that must find its
//! document first (mongos 8.0's write without shard key). Targeting, planning, lookups' decisions
//! and merging are pure; only this file does I/O. The contract, and what Sluice chose where mongos
//! leaves room, is docs/design/write-path.md.

pub mod bulk;
pub mod coalesce;
pub mod lookup;
pub mod merge;
pub mod plan;
pub mod target;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bson::raw::CStr;
use bson::{doc, oid::ObjectId, Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf};
use bytes::Bytes;

use crate::backend::limiter::{OpKind, Outcome};
use crate::backend::shard::Resend;
use crate::backend::topology::Need;
use crate::backend::{BackendError, PooledConnection};
use crate::cluster::Cluster;
use crate::command::{CommandError, CommandRequest};
use crate::routing::RoutingSnapshot;
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};
use crate::wire::{changes_when_owned, OpMsgBuilder};
use merge::{ChildOutcome, ChildResult, Merger};
use plan::{Plan, PlanKind, Policy, Round};
use target::{Targeted, WriteKind};

/// Most statements in one child batch (`maxWriteBatchSize`).
pub const MAX_BATCH_STATEMENTS: usize = 100_000;
/// Most statement bytes in one child batch.
pub const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Rounds without progress before stale statements fail with NoProgressMade.
const MAX_ROUNDS_WITHOUT_PROGRESS: usize = 5;

/// Write-path counters, reported under `serverStatus().sluice.writes` and as metrics.
#[derive(Debug, Default)]
pub struct WriteStats {
    /// Bulks planned as mongos rounds.
    pub plans_mongos_rounds: AtomicU64,
    /// Bulks planned as one unordered round.
    pub plans_unordered: AtomicU64,
    /// Ordered bulks rewritten into one round.
    pub plans_rewrite: AtomicU64,
    /// Child batches sent.
    pub child_batches: AtomicU64,
    /// Rounds sent.
    pub rounds: AtomicU64,
    /// Statements of rewritten bulks applied after the bulk's first error and left applied
    /// (updates and deletes, and inserts that could not be undone).
    pub applied_after_error: AtomicU64,
    /// Inserts of rewritten bulks applied after the bulk's first error and undone.
    pub undone_after_error: AtomicU64,
    /// Single-document writes looked up first (writes without shard key).
    pub lookups: AtomicU64,
}

impl WriteStats {
    fn count_plan(&self, kind: PlanKind) {
        let c = match kind {
            PlanKind::MongosRounds => &self.plans_mongos_rounds,
            PlanKind::Unordered => &self.plans_unordered,
            PlanKind::Rewrite => &self.plans_rewrite,
        };
        c.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("sluice_write_plans_total", "kind" => kind.label()).increment(1);
    }

    /// The counters as a document.
    pub fn to_document(&self) -> Document {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed) as i64;
        doc! {
            "plans": {"mongosRounds": g(&self.plans_mongos_rounds), "unordered": g(&self.plans_unordered), "rewrite": g(&self.plans_rewrite)},
            "rounds": g(&self.rounds),
            "childBatches": g(&self.child_batches),
            "appliedAfterError": g(&self.applied_after_error),
            "undoneAfterError": g(&self.undone_after_error),
            "writesWithoutShardKey": g(&self.lookups),
        }
    }
}

/// The statements of a write request as raw documents (original bytes, or a re-encoded
/// document when the router added an `_id`), with whether the client supplied the `_id`.
struct Statements {
    raw: Vec<Bytes>,
    client_id: Vec<bool>,
}

impl Statements {
    /// Statement `i` as an owned document, for the paths that need one (a lookup).
    fn parsed(&self, i: usize) -> Option<Document> {
        let raw = RawDocument::from_bytes(&self.raw.get(i)?[..]).ok()?;
        Document::try_from(raw).ok()
    }
}

fn statements(req: &CommandRequest, kind: WriteKind) -> Result<Statements, CommandError> {
    let mut raw = req.statement_bytes(kind.statements_field())?;
    if raw.len() > MAX_BATCH_STATEMENTS {
        return Err(CommandError::new(
            ErrorCode::InvalidLength,
            format!("Write batch sizes must be between 1 and {MAX_BATCH_STATEMENTS}. Got {} operations.", raw.len()),
        ));
    }
    let mut client_id = Vec::with_capacity(raw.len());
    for r in raw.iter_mut() {
        let doc = RawDocument::from_bytes(&r[..])
            .map_err(|e| CommandError::new(ErrorCode::InvalidBSON, e.to_string()))?;
        match kind {
            WriteKind::Insert => {
                let has = matches!(doc.get("_id"), Ok(Some(_)));
                client_id.push(has);
                if !has {
                    // As mongos: the router gives the document an ObjectId _id, first.
                    let mut d = Document::new();
                    d.insert("_id", ObjectId::new());
                    for (k, v) in Document::try_from(doc)
                        .map_err(|e| CommandError::new(ErrorCode::InvalidBSON, e.to_string()))?
                    {
                        d.insert(k, v);
                    }
                    *r =
                        Bytes::from(d.to_vec().map_err(|e| {
                            CommandError::new(ErrorCode::InvalidBSON, e.to_string())
                        })?);
                }
            }
            _ => {
                client_id.push(false);
                // A malformed statement fails the whole command before anything runs. The
                // statement is read in place (the request was validated on arrival): an owned
                // copy is made only where targeting or a lookup needs one.
                crate::command::check_raw_write_statement(kind.command(), doc)?;
            }
        }
    }
    Ok(Statements { raw, client_id })
}

/// The body every child batch starts from: the client's options (the command without its
/// statements, see [`CommandRequest::options_document`]) minus the routing fields, with a
/// `w: 0` write concern raised to `w: 1` so the router sees errors.
fn child_template(options: &Document) -> Document {
    let mut t = Document::new();
    for (k, v) in options {
        match k.as_str() {
            "stmtIds" | "stmtId" | "$clusterTime" | "shardVersion" | "databaseVersion"
            | "ordered" | "$readPreference" => {}
            "writeConcern" => {
                let mut wc = v.as_document().cloned().unwrap_or_default();
                if matches!(wc.get("w"), Some(Bson::Int32(0) | Bson::Int64(0))) {
                    wc.insert("w", 1);
                }
                t.insert(k.clone(), wc);
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    t
}

/// What the write path reads from a write command besides its statements: read once, and the
/// child batches' template already encoded.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// The client's `ordered` (default true).
    pub ordered: bool,
    /// The request carries `lsid` and `txnNumber`.
    pub retryable: bool,
    /// `startTransaction` (truthy) or `autocommit: false`: a statement of a transaction.
    pub in_transaction: bool,
    /// The client's `stmtIds`.
    pub client_stmt_ids: Option<Vec<i32>>,
    /// The client's `maxTimeMS`, when positive.
    pub max_time: Option<std::time::Duration>,
    /// [`child_template`], encoded.
    pub template: RawDocumentBuf,
}

impl WriteOptions {
    /// From the command's options as a document ([`CommandRequest::options_document`]).
    pub fn from_document(body: &Document) -> Result<Self, CommandError> {
        let template = RawDocumentBuf::try_from(&child_template(body)).map_err(|e| {
            CommandError::new(
                ErrorCode::InternalError,
                format!("cannot encode child batch: {e}"),
            )
        })?;
        Ok(WriteOptions {
            ordered: body.get("ordered").map(truthy).unwrap_or(true),
            retryable: body.contains_key("lsid") && body.contains_key("txnNumber"),
            in_transaction: body.get("startTransaction").is_some_and(truthy)
                || matches!(body.get("autocommit"), Some(Bson::Boolean(false))),
            client_stmt_ids: body.get_array("stmtIds").ok().map(|ids| {
                ids.iter()
                    .map(|v| match v {
                        Bson::Int32(i) => *i,
                        Bson::Int64(i) => *i as i32,
                        _ => 0,
                    })
                    .collect()
            }),
            max_time: number_field(body, "maxTimeMS")
                .filter(|m| *m > 0)
                .map(|m| std::time::Duration::from_millis(m as u64)),
            template,
        })
    }

    /// The same, read from the request body in place (`statements`: the field that holds the
    /// statements), with no owned document built: the template is the body's own elements
    /// copied. `None` when a field name repeats in the body, or a value the template carries
    /// would change by being owned ([`crate::wire::changes_when_owned`]): such a body goes through
    /// [`WriteOptions::from_document`], to be read exactly as before.
    ///
    /// The body is walked by [`crate::wire::elements`] (keys compared as bytes, values stepped
    /// over by their sizes); a body that walk does not read (an array such as `stmtIds`, a
    /// type requests seldom carry) is walked again with the `bson` crate's iterator.
    pub fn from_raw(body: &RawDocument, statements: &str) -> Option<Self> {
        let walked = crate::wire::elements(body)
            .with_bytes()
            .map(|item| item.map(|(k, v, bytes)| (k, v, Some(bytes))));
        match Self::from_elements(statements, walked) {
            Ok(read) => read,
            Err(Unread) => Self::from_elements(
                statements,
                body.iter().map(|item| item.ok().map(|(k, v)| (k, v, None))),
            )
            .ok()
            .flatten(),
        }
    }

    /// [`Self::from_raw`] of the body's `items`; `Err` at an item `None` (the walk could not
    /// read on, or the element does not read). An item's bytes, when given, are the element
    /// as it stands in the body: the template copies them instead of encoding the value again
    /// (the same bytes: a value that would change is refused by [`changes_when_owned`]).
    fn from_elements<'a>(
        statements: &str,
        items: impl Iterator<Item = Option<(&'a CStr, RawBsonRef<'a>, Option<&'a [u8]>)>>,
    ) -> Result<Option<Self>, Unread> {
        let mut names: Vec<&str> = Vec::with_capacity(16);
        let mut template = Template::new();
        let mut ordered = true;
        let (mut lsid, mut txn_number) = (false, false);
        let (mut start_transaction, mut autocommit_false) = (false, false);
        let mut client_stmt_ids = None;
        let mut max_time = None;
        for item in items {
            let (key, value, bytes) = item.ok_or(Unread)?;
            let k = key.as_str();
            if names.contains(&k) {
                return Ok(None);
            }
            names.push(k);
            if k == statements || k == "$clusterTime" {
                continue;
            }
            match k {
                "ordered" => match Bson::try_from(value) {
                    Ok(v) => ordered = truthy(&v),
                    Err(_) => return Ok(None),
                },
                "lsid" => lsid = true,
                "txnNumber" => txn_number = true,
                "startTransaction" => match Bson::try_from(value) {
                    Ok(v) => start_transaction = truthy(&v),
                    Err(_) => return Ok(None),
                },
                "autocommit" => autocommit_false = matches!(value, RawBsonRef::Boolean(false)),
                "stmtIds" => {
                    client_stmt_ids = match value {
                        RawBsonRef::Array(ids) => Some(
                            ids.into_iter()
                                .map(|v| match v {
                                    Ok(RawBsonRef::Int32(i)) => i,
                                    Ok(RawBsonRef::Int64(i)) => i as i32,
                                    _ => 0,
                                })
                                .collect(),
                        ),
                        _ => None,
                    }
                }
                "maxTimeMS" => {
                    max_time = match value {
                        RawBsonRef::Int32(v) => Some(v as i64),
                        RawBsonRef::Int64(v) => Some(v),
                        RawBsonRef::Double(v) if v.is_finite() => Some(v as i64),
                        _ => None,
                    }
                    .filter(|m| *m > 0)
                    .map(|m| std::time::Duration::from_millis(m as u64))
                }
                _ => {}
            }
            match k {
                "stmtIds" | "stmtId" | "shardVersion" | "databaseVersion" | "ordered"
                | "$readPreference" => {}
                "writeConcern" => {
                    let wc = match value {
                        RawBsonRef::Document(wc) => wc,
                        _ => crate::wire::empty_document(),
                    };
                    if changes_when_owned(RawBsonRef::Document(wc)) {
                        return Ok(None);
                    }
                    if matches!(
                        wc.get("w"),
                        Ok(Some(RawBsonRef::Int32(0) | RawBsonRef::Int64(0)))
                    ) {
                        // `w: 0` raised to `w: 1` in its place, as the router must see errors.
                        let mut raised = RawDocumentBuf::new();
                        for item in wc.iter() {
                            let Ok((k, v)) = item else {
                                return Ok(None);
                            };
                            if k.as_str() == "w" {
                                raised.append(k, 1i32);
                            } else {
                                raised.append(k, v);
                            }
                        }
                        template.append(key, RawBsonRef::Document(&raised), None);
                    } else {
                        // A `writeConcern` that is not a document is sent as `{}`.
                        let bytes = bytes.filter(|_| matches!(value, RawBsonRef::Document(_)));
                        template.append(key, RawBsonRef::Document(wc), bytes);
                    }
                }
                _ => {
                    if changes_when_owned(value) {
                        return Ok(None);
                    }
                    template.append(key, value, bytes);
                }
            }
        }
        let Some(template) = template.finish() else {
            return Ok(None);
        };
        Ok(Some(WriteOptions {
            ordered,
            retryable: lsid && txn_number,
            in_transaction: start_transaction || autocommit_false,
            client_stmt_ids,
            max_time,
            template,
        }))
    }
}

/// A child template being written: elements copied as they stand in the body where their
/// bytes are known, else encoded by the `bson` crate (as `RawDocumentBuf::append` does).
struct Template(Vec<u8>);

impl Template {
    fn new() -> Self {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&[0; 4]);
        Template(out)
    }

    /// Appends `key: value`; `bytes`, when given, is that element encoded.
    fn append(&mut self, key: &CStr, value: RawBsonRef<'_>, bytes: Option<&[u8]>) {
        match bytes {
            Some(bytes) => self.0.extend_from_slice(bytes),
            None => {
                let mut one = RawDocumentBuf::new();
                one.append(key, value);
                let one = one.as_bytes();
                self.0.extend_from_slice(&one[4..one.len() - 1]);
            }
        }
    }

    /// The document; `None` past BSON's size limit (which no request body reaches).
    fn finish(mut self) -> Option<RawDocumentBuf> {
        self.0.push(0);
        let len = i32::try_from(self.0.len()).ok()?;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        RawDocumentBuf::from_bytes(self.0).ok()
    }
}

/// A request body the element walk could not read on.
struct Unread;

/// Builds one child batch's frame: the template plus `ordered`, `stmtIds` (for retryable
/// writes), `shardVersion` (for shard servers), and the statements as a kind-1 sequence. The
/// template is encoded as it is and the per-child fields are appended to the encoded body (none
/// of them is in a template), so the template document is never copied.
fn encode_child(
    template: &RawDocument,
    kind: WriteKind,
    ordered: bool,
    stmt_ids: Option<&[i32]>,
    shard_version: Option<&RawDocument>,
    stmts: &[Bytes],
) -> (Bytes, i32) {
    let mut body = template.to_owned();
    body.append(bson::raw::cstr!("ordered"), ordered);
    if let Some(ids) = stmt_ids {
        let mut array = bson::RawArrayBuf::new();
        for id in ids {
            array.push(*id);
        }
        body.append(bson::raw::cstr!("stmtIds"), array);
    }
    if let Some(v) = shard_version {
        body.append(bson::raw::cstr!("shardVersion"), v);
    }
    let mut b = OpMsgBuilder::new(0, body.as_bytes());
    b.begin_sequence(kind.statements_field());
    for s in stmts {
        b.push_document(s);
    }
    let id = PooledConnection::next_request_id();
    (b.finish(id, 0), id)
}

/// Sends one shard's statements of a round; the cluster's pools in production, a model store
/// in the property tests.
pub trait ChildSender: Send + Sync {
    /// Sends `statements` (global indexes, in order) to `shard` as one or more child batches,
    /// one after another; an ordered child stops at its first failure.
    fn run_shard<'a>(
        &'a self,
        snap: &'a RoutingSnapshot,
        shard: &'a str,
        statements: Vec<usize>,
        ordered: bool,
    ) -> crate::frontend::BoxFuture<'a, Vec<ChildResult>>;

    /// Runs statement `statement`, a single-document write looked up on `shards` first
    /// ([`lookup`]), and returns its outcome as the result of a child batch holding it alone.
    fn run_lookup<'a>(
        &'a self,
        snap: &'a RoutingSnapshot,
        statement: usize,
        shards: Vec<String>,
    ) -> crate::frontend::BoxFuture<'a, ChildResult> {
        let _ = snap;
        Box::pin(async move {
            ChildResult {
                shard: shards.first().cloned().unwrap_or_default(),
                statements: vec![statement],
                ordered: true,
                outcome: ChildOutcome::Failed {
                    code: ErrorCode::CommandNotSupported,
                    message: "this sender does not look documents up".into(),
                },
            }
        })
    }

    /// Sends `statements` (global indexes, in order) to `primary`, the database's primary shard
    /// of a collection that is not sharded, as one or more child batches carrying the
    /// primary's versions, one after another; an ordered child stops at its first failure.
    fn run_primary<'a>(
        &'a self,
        primary: &'a PrimaryShard,
        statements: Vec<usize>,
        ordered: bool,
    ) -> crate::frontend::BoxFuture<'a, Vec<ChildResult>> {
        Box::pin(async move {
            vec![ChildResult {
                shard: primary.shard.clone(),
                statements,
                ordered,
                outcome: ChildOutcome::Failed {
                    code: ErrorCode::CommandNotSupported,
                    message: "this sender does not send to a primary shard".into(),
                },
            }]
        })
    }

    /// Deletes what the insert statements `statements` inserted, each document only while it
    /// is still the one inserted; returns the statements whose document is still there.
    fn undo_inserts<'a>(
        &'a self,
        snap: &'a RoutingSnapshot,
        statements: Vec<usize>,
    ) -> crate::frontend::BoxFuture<'a, Vec<usize>> {
        let _ = snap;
        Box::pin(async move { statements })
    }
}

/// What the executor needs to know about a write besides its statements.
#[derive(Debug, Clone)]
pub struct WriteSpec {
    /// insert, update or delete.
    pub kind: WriteKind,
    /// The client's `ordered`.
    pub ordered: bool,
    /// The rewrite policy for the namespace.
    pub policy: Policy,
    /// Whether the request carries `lsid` + `txnNumber`.
    pub retryable: bool,
    /// Number of statements.
    pub statements: usize,
    /// `db.coll`.
    pub ns: String,
}

/// The result of executing a write: the merged outcome and the plan chosen.
#[derive(Debug)]
pub struct WriteOutcome {
    /// Statement results; [`Merger::reply`] is the client's reply.
    pub merger: Merger,
    /// The plan of the first planning pass.
    pub plan: Option<PlanKind>,
    /// Rounds that sent child batches.
    pub rounds: u64,
}

/// A database's primary shard, where the statements of a write go once its collection is found
/// unsharded (dropped or renamed away since the router cached it sharded), as mongos's
/// targeter sends a write on an unsharded collection.
#[derive(Debug, Clone, PartialEq)]
pub struct PrimaryShard {
    /// The shard id.
    pub shard: String,
    /// What a child batch for it carries for the shard's version check: `shardVersion`
    /// UNSHARDED and the database's `databaseVersion` with a config server, nothing without.
    pub versions: Document,
}

/// Where a write's stale statements go after the routing was reloaded.
#[derive(Debug, Clone)]
pub enum Retarget {
    /// The collection is sharded: by its chunks.
    Sharded(Arc<RoutingSnapshot>),
    /// The collection is not sharded (any more): to its database's primary shard.
    Primary(PrimaryShard),
}

/// How the executor reloads the routing after statements hit stale routing: given the stale
/// errors the shards sent (with the version they wanted), where the statements go now, or
/// `None` when it cannot be had (the stale statements then fail).
pub type Refresh<'a> =
    dyn Fn(Vec<Document>) -> crate::frontend::BoxFuture<'a, Option<Retarget>> + Sync + 'a;

/// How the write path finds a database's primary shard (and the versions a child batch for it
/// carries) when a refresh finds the collection unsharded; `None` when it cannot be had.
pub type PrimaryLookup<'a> =
    dyn Fn() -> crate::frontend::BoxFuture<'a, Option<PrimaryShard>> + Sync + 'a;

/// Plans, sends and merges a write: the executor loop of docs/design/write-path.md (rounds, stale
/// routing retries up to NoProgressMade, exact counts for rewritten bulks that hit an error).
pub async fn run_write(
    spec: &WriteSpec,
    sender: &dyn ChildSender,
    target: &(dyn Fn(&RoutingSnapshot, usize) -> Targeted + Sync),
    snapshot: Arc<RoutingSnapshot>,
    refresh: &Refresh<'_>,
    stats: &WriteStats,
) -> WriteOutcome {
    let ordered = spec.ordered;
    let mut merger = Merger::new(spec.kind, ordered, spec.statements);
    let mut snap = snapshot;
    // Set once a refresh found the collection unsharded: every statement left goes to the
    // database's primary shard.
    let mut primary: Option<PrimaryShard> = None;
    let mut pending: Vec<usize> = (0..spec.statements).collect();
    let mut rounds_without_progress = 0;
    let mut chosen: Option<PlanKind> = None;
    let mut rounds_sent = 0u64;
    loop {
        let finished_before = merger.finished();
        if let Some(p) = &primary {
            // One shard holds the whole collection: the statements left go as the client sent
            // them, in order, as a write on an unsharded collection does.
            rounds_sent += 1;
            stats.rounds.fetch_add(1, Ordering::Relaxed);
            for child in sender.run_primary(p, pending.clone(), ordered).await {
                stats.child_batches.fetch_add(1, Ordering::Relaxed);
                merger.add(&child);
            }
        } else {
            let targeted: Vec<Targeted> = pending.iter().map(|&i| target(&snap, i)).collect();
            let indexed: Vec<(usize, &Targeted)> =
                pending.iter().copied().zip(targeted.iter()).collect();
            let Plan {
                kind: plan_kind,
                rounds,
            } = plan::plan(
                &indexed,
                ordered,
                spec.policy,
                spec.kind == WriteKind::Insert || spec.retryable,
            );
            if chosen.is_none() {
                chosen = Some(plan_kind);
                stats.count_plan(plan_kind);
                let span = tracing::Span::current();
                span.record("plan", plan_kind.label());
                // The shards list is built only where a subscriber records the request span.
                if !span.is_disabled() {
                    let mut shards: Vec<&str> = targeted
                        .iter()
                        .flat_map(|t| match &t.target {
                            target::Target::One(s) => vec![s.as_str()],
                            target::Target::Many(v) | target::Target::Lookup(v) => {
                                v.iter().map(|s| s.as_str()).collect()
                            }
                            target::Target::Error { .. } => Vec::new(),
                        })
                        .collect();
                    shards.sort_unstable();
                    shards.dedup();
                    span.record("shards", shards.join(",").as_str());
                }
            }
            for round in rounds {
                match round {
                    Round::Fail(i) => {
                        if let Some((_, t)) = indexed.iter().find(|(j, _)| *j == i) {
                            if let target::Target::Error { code, message } = &t.target {
                                merger.fail(i, *code, message);
                            }
                        }
                        if ordered {
                            break;
                        }
                    }
                    Round::Lookup(i, shards) => {
                        rounds_sent += 1;
                        stats.rounds.fetch_add(1, Ordering::Relaxed);
                        stats.lookups.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("sluice_write_without_shard_key_total").increment(1);
                        let child = sender.run_lookup(&snap, i, shards).await;
                        stats.child_batches.fetch_add(1, Ordering::Relaxed);
                        merger.add(&child);
                        if ordered && (merger.first_error().is_some() || merger.has_stale()) {
                            break;
                        }
                    }
                    Round::Send(work) => {
                        rounds_sent += 1;
                        stats.rounds.fetch_add(1, Ordering::Relaxed);
                        // A rewritten bulk's child batches stay ordered, as the client asked.
                        let child_ordered = ordered;
                        let snap_ref = &snap;
                        let futures = work.into_iter().map(|w| async move {
                            sender
                                .run_shard(snap_ref, &w.shard, w.statements, child_ordered)
                                .await
                        });
                        for child in crate::backend::join_all(futures)
                            .await
                            .into_iter()
                            .flatten()
                        {
                            stats.child_batches.fetch_add(1, Ordering::Relaxed);
                            merger.add(&child);
                        }
                        if ordered && (merger.first_error().is_some() || merger.has_stale()) {
                            break;
                        }
                    }
                }
            }
        }
        if !merger.has_stale() || (ordered && merger.first_error().is_some()) {
            break;
        }
        match refresh(merger.stale_errors()).await {
            Some(Retarget::Sharded(s)) => {
                snap = s;
                primary = None;
            }
            Some(Retarget::Primary(p)) => primary = Some(p),
            None => {
                merger.give_up_stale(&spec.ns);
                break;
            }
        }
        if merger.finished() == finished_before {
            rounds_without_progress += 1;
            if rounds_without_progress >= MAX_ROUNDS_WITHOUT_PROGRESS {
                merger.give_up_stale(&spec.ns);
                break;
            }
        } else {
            rounds_without_progress = 0;
        }
        pending = merger.take_unfinished();
    }
    metrics::histogram!("sluice_write_rounds_per_bulk").record(rounds_sent as f64);
    if chosen == Some(PlanKind::Rewrite) && merger.first_error().is_some() {
        if spec.retryable {
            // Resending a statement alone with its session, transaction number and statement id
            // returns its recorded result: exact counts for a reply cut at the first error.
            for i in merger.straddlers() {
                let shard = match target(&snap, i).target {
                    target::Target::One(s) => s,
                    _ => continue,
                };
                let results = sender.run_shard(&snap, &shard, vec![i], true).await;
                let first = results.into_iter().next().map(|c| c.outcome.into_owned());
                if let Some(ChildOutcome::Reply(r)) = &first {
                    if r.get_f64("ok").ok() == Some(1.0) && !r.contains_key("writeErrors") {
                        merger.resolve(
                            i,
                            number_field(r, "n").unwrap_or(0),
                            number_field(r, "nModified").unwrap_or(0),
                        );
                    }
                }
            }
        }
        // Inserts after the error are undone, so the collection ends as mongos leaves it and
        // an application resending the rest meets no document it was told was not inserted.
        // Updates and deletes stay applied: they passed the proof, a resend converges.
        if spec.kind == WriteKind::Insert {
            let late = merger.applied_after_error();
            if !late.is_empty() {
                let left = sender.undo_inserts(&snap, late.clone()).await;
                let undone: Vec<usize> = late.into_iter().filter(|i| !left.contains(i)).collect();
                stats
                    .undone_after_error
                    .fetch_add(undone.len() as u64, Ordering::Relaxed);
                metrics::counter!("sluice_rewrite_undone_after_error_total")
                    .increment(undone.len() as u64);
                if !left.is_empty() {
                    tracing::warn!(ns = %spec.ns, indexes = ?left, "inserts of a rewritten bulk applied after its first error could not be undone");
                }
                merger.note_undo(&undone, &left);
            }
        }
        let late = merger.applied_after_error();
        if !late.is_empty() {
            stats
                .applied_after_error
                .fetch_add(late.len() as u64, Ordering::Relaxed);
            metrics::counter!("sluice_rewrite_applied_after_error_total")
                .increment(late.len() as u64);
            tracing::debug!(ns = %spec.ns, indexes = ?late, "statements of a rewritten bulk applied after its first error");
        }
    }
    WriteOutcome {
        merger,
        plan: chosen,
        rounds: rounds_sent,
    }
}

/// One child batch's settings, apart from its statements.
#[derive(Debug, Clone)]
pub struct ChildSpec<'a> {
    /// The client's command minus its statements and routing fields, encoded.
    pub template: &'a RawDocument,
    /// insert, update or delete.
    pub kind: WriteKind,
    /// `db.coll`.
    pub ns: &'a str,
    /// `ordered` of the child batch.
    pub ordered: bool,
    /// `stmtIds`, for retryable writes.
    pub stmt_ids: Option<Vec<i32>>,
    /// `shardVersion`, for shard servers ([`RoutingSnapshot::shard_version_bytes`]).
    pub version: Option<RawDocumentBuf>,
    /// Whether the batch carries `lsid` + `txnNumber` (and may be resent once).
    pub retryable: bool,
    /// The client's `maxTimeMS`.
    pub max_time: Option<std::time::Duration>,
}

/// Sends one child batch: waits for an execution slot on the shard's queue, sends, reads the
/// reply. A retryable batch is resent once after a network error (the shard's record makes
/// the resend a no-op for what it applied).
pub async fn send_child(
    cluster: &Cluster,
    shard: &str,
    child: &ChildSpec<'_>,
    raws: &[Bytes],
) -> ChildOutcome {
    send_child_as(cluster, shard, child, raws, false).await
}

/// [`send_child`], with the reply kept as it arrived ([`ChildOutcome::Raw`]) when `in_place`.
async fn send_child_as(
    cluster: &Cluster,
    shard: &str,
    child: &ChildSpec<'_>,
    raws: &[Bytes],
    in_place: bool,
) -> ChildOutcome {
    let bytes: usize = raws.iter().map(|r| r.len()).sum();
    let work = crate::cluster::SlotRequest {
        op: OpKind::Mutate,
        command: child.kind.command(),
        ns: child.ns,
        operations: raws.len(),
        bytes,
    };
    // Encoded before waiting for a slot, so a held slot is spent on the shard alone; a resend
    // reuses the frame.
    let (frame, id) = encode_child(
        child.template,
        child.kind,
        child.ordered,
        child.stmt_ids.as_deref(),
        child.version.as_deref(),
        raws,
    );
    send_frame_as(
        cluster,
        shard,
        work,
        child.max_time,
        child.retryable,
        &frame,
        id,
        in_place,
    )
    .await
    .0
}

/// Sends one encoded child command (`frame`, request id `id`) to `shard`: waits for an
/// execution slot on the shard's queue, sends, reads the reply (as an owned document); a
/// `retryable` command is resent once after a network error. Returns the member that answered
/// too (a cursor the reply opened lives there).
pub(crate) async fn send_frame_from(
    cluster: &Cluster,
    shard: &str,
    work: crate::cluster::SlotRequest<'_>,
    max_time: Option<std::time::Duration>,
    retryable: bool,
    frame: &Bytes,
    id: i32,
) -> (ChildOutcome, Option<String>) {
    send_frame_as(cluster, shard, work, max_time, retryable, frame, id, false).await
}

/// [`send_frame_from`], with the reply kept as it arrived ([`ChildOutcome::Raw`]) when
/// `in_place`.
#[allow(clippy::too_many_arguments)]
async fn send_frame_as(
    cluster: &Cluster,
    shard: &str,
    work: crate::cluster::SlotRequest<'_>,
    max_time: Option<std::time::Duration>,
    retryable: bool,
    frame: &Bytes,
    id: i32,
    in_place: bool,
) -> (ChildOutcome, Option<String>) {
    let Some(pool) = cluster.pool(shard) else {
        let failed = ChildOutcome::Failed {
            code: ErrorCode::ShardNotFound,
            message: format!("unknown shard {shard}"),
        };
        return (failed, None);
    };
    let permit = match cluster.slot(shard, work).await {
        Ok(p) => p,
        Err(e) => {
            let failed = ChildOutcome::Failed {
                code: ErrorCode::ExceededTimeLimit,
                message: e.to_string(),
            };
            return (failed, None);
        }
    };
    let finish = |permit: Option<crate::backend::queue::LimitPermit>, outcome: Outcome| {
        if let Some(p) = permit {
            p.finish(outcome);
        }
    };
    pool.count_child_batch();
    let resend = if retryable {
        Resend::RetryableWrite
    } else {
        Resend::Never
    };
    let deadline = max_time.map(|d| std::time::Instant::now() + d);
    match pool.send(frame, id, &Need::Write, deadline, resend).await {
        Ok((reply, member)) => {
            finish(permit, Outcome::Completed);
            let outcome = if in_place {
                ChildOutcome::Raw(reply)
            } else {
                ChildOutcome::Reply(merge::owned_reply(reply.raw()))
            };
            (outcome, Some(member))
        }
        Err(e) => {
            tracing::debug!(shard, error = %e, "child batch failed");
            finish(
                permit,
                match e {
                    BackendError::Timeout(_) => Outcome::TimedOut,
                    _ => Outcome::NotCounted,
                },
            );
            let failed = ChildOutcome::Failed {
                code: e.code(),
                message: match e {
                    BackendError::NoMember(_, m) => m,
                    e => format!("{e} (shard {shard})"),
                },
            };
            (failed, None)
        }
    }
}

/// Sends child batches over the cluster's shard pools.
struct ClusterSender<'a> {
    cluster: &'a Arc<Cluster>,
    coalescer: Option<&'a coalesce::Coalescer>,
    ns: String,
    max_time: Option<std::time::Duration>,
    kind: WriteKind,
    template: RawDocumentBuf,
    stmts: &'a Statements,
    retryable: bool,
    client_stmt_ids: Option<Vec<i32>>,
}

impl ClusterSender<'_> {
    fn stmt_id(&self, i: usize) -> i32 {
        self.client_stmt_ids
            .as_ref()
            .and_then(|ids| ids.get(i).copied())
            .unwrap_or(i as i32)
    }

    /// Sends one child batch of `piece` to `shard`, with the client's options (`template`,
    /// the sender's own unless a primary shard's versions were added to it).
    async fn send(
        &self,
        shard: &str,
        piece: &[usize],
        ordered: bool,
        version: Option<RawDocumentBuf>,
        template: Option<&RawDocument>,
    ) -> ChildOutcome {
        let stmt_ids = self
            .retryable
            .then(|| piece.iter().map(|i| self.stmt_id(*i)).collect::<Vec<i32>>());
        let raws: Vec<Bytes> = piece.iter().map(|i| self.stmts.raw[*i].clone()).collect();
        let child = ChildSpec {
            template: template.unwrap_or(&self.template),
            kind: self.kind,
            ns: &self.ns,
            ordered,
            stmt_ids,
            version,
            retryable: self.retryable,
            max_time: self.max_time,
        };
        // Inserts with no write semantics of a session may share a child batch with other
        // clients' inserts: an `lsid` alone is fine (a merged batch carries none); never a
        // retryable write or a transaction's statement (`coalesce::mergeable`).
        if self.kind == WriteKind::Insert
            && coalesce::mergeable(&self.template)
            && template.is_none()
            && (!ordered || piece.len() == 1)
        {
            if let Some(c) = self.coalescer {
                return c.submit(self.cluster, shard, child, raws).await;
            }
        }
        // The merger reads the reply in place.
        send_child_as(self.cluster, shard, &child, &raws, true).await
    }
}

impl ClusterSender<'_> {
    /// Sends `statements` (global indexes, in order) to `shard` as child batches of at most
    /// [`MAX_BATCH_STATEMENTS`] statements and [`MAX_BATCH_BYTES`], one after another; an
    /// ordered child stops at its first failure.
    async fn run_pieces(
        &self,
        shard: &str,
        statements: Vec<usize>,
        ordered: bool,
        version: Option<RawDocumentBuf>,
        template: Option<&RawDocument>,
    ) -> Vec<ChildResult> {
        let mut out = Vec::new();
        let mut pieces: Vec<Vec<usize>> = Vec::new();
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 0usize;
        for i in statements {
            let size = self.stmts.raw[i].len();
            if !current.is_empty()
                && (current.len() >= MAX_BATCH_STATEMENTS || bytes + size > MAX_BATCH_BYTES)
            {
                pieces.push(std::mem::take(&mut current));
                bytes = 0;
            }
            bytes += size;
            current.push(i);
        }
        if !current.is_empty() {
            pieces.push(current);
        }
        for piece in pieces {
            let outcome = self
                .send(shard, &piece, ordered, version.clone(), template)
                .await;
            let stop = ordered && outcome.stops_ordered();
            out.push(ChildResult {
                shard: shard.to_string(),
                statements: piece,
                ordered,
                outcome,
            });
            if stop {
                break;
            }
        }
        out
    }

    /// The database and collection names.
    fn names(&self) -> (&str, &str) {
        self.ns.split_once('.').unwrap_or(("", self.ns.as_str()))
    }

    /// A body for another write command on the same collection, with the client's write
    /// concern (and, when `session`, its session fields).
    fn other_template(&self, command: &str, session: bool) -> Result<RawDocumentBuf, String> {
        let mut t = doc! {command: self.names().1};
        let keep: &[&str] = if session {
            &[
                "$db",
                "writeConcern",
                "bypassDocumentValidation",
                "comment",
                "lsid",
                "txnNumber",
            ]
        } else {
            &["$db", "writeConcern", "comment"]
        };
        for k in keep {
            if let Some(v) = self.template.get(k).ok().flatten() {
                if let Ok(v) = Bson::try_from(v) {
                    t.insert(*k, v);
                }
            }
        }
        RawDocumentBuf::try_from(&t).map_err(|e| e.to_string())
    }

    /// [`ClusterSender::version`] encoded, as a child batch carries it.
    fn raw_version(&self, snap: &RoutingSnapshot, shard: &str) -> Option<RawDocumentBuf> {
        self.cluster
            .is_shard_server(shard)
            .then(|| snap.shard_version_bytes(shard))
    }

    fn version(&self, snap: &RoutingSnapshot, shard: &str) -> Option<Document> {
        self.cluster
            .is_shard_server(shard)
            .then(|| snap.shard_version(shard))
    }

    /// Step one of a lookup: the first shard (in shard order) holding a matching document, and
    /// that document; or the error of a shard that could not answer.
    async fn find_one(
        &self,
        snap: &RoutingSnapshot,
        shards: &[String],
        find: &Document,
    ) -> Result<Option<(String, Document)>, CommandError> {
        let db = self.names().0;
        let futures = shards.iter().map(|s| async move {
            let mut cmd = find.clone();
            cmd.insert("$db", db);
            if let Some(v) = self.version(snap, s) {
                cmd.insert("shardVersion", v);
            }
            (
                s,
                crate::read::read_one(self.cluster, s, &self.ns, &cmd).await,
            )
        });
        let mut hit = None;
        for (shard, result) in crate::backend::join_all(futures).await {
            if let Some(d) = lookup::found(&result?) {
                hit = hit.or(Some((shard.clone(), d)));
            }
        }
        Ok(hit)
    }

    /// The ids of `ids` still on `shard`, or all of them when the shard cannot say.
    async fn still_there(&self, snap: &RoutingSnapshot, shard: &str, ids: &[Bson]) -> Vec<Bson> {
        let mut cmd = doc! {
            "find": self.names().1,
            "filter": {"_id": {"$in": ids.to_vec()}},
            "projection": {"_id": 1},
            "singleBatch": true,
            "batchSize": ids.len() as i64 + 1,
            "$db": self.names().0,
        };
        if let Some(v) = self.version(snap, shard) {
            cmd.insert("shardVersion", v);
        }
        match crate::read::read_one(self.cluster, shard, &self.ns, &cmd).await {
            Ok(r) => r
                .get_document("cursor")
                .and_then(|c| c.get_array("firstBatch"))
                .map(|b| {
                    b.iter()
                        .filter_map(|d| d.as_document()?.get("_id").cloned())
                        .collect()
                })
                .unwrap_or_else(|_| ids.to_vec()),
            Err(_) => ids.to_vec(),
        }
    }
}

impl ChildSender for ClusterSender<'_> {
    fn run_shard<'a>(
        &'a self,
        snap: &'a RoutingSnapshot,
        shard: &'a str,
        statements: Vec<usize>,
        ordered: bool,
    ) -> crate::frontend::BoxFuture<'a, Vec<ChildResult>> {
        let version = self.raw_version(snap, shard);
        Box::pin(self.run_pieces(shard, statements, ordered, version, None))
    }

    fn run_primary<'a>(
        &'a self,
        primary: &'a PrimaryShard,
        statements: Vec<usize>,
        ordered: bool,
    ) -> crate::frontend::BoxFuture<'a, Vec<ChildResult>> {
        Box::pin(async move {
            // `shardVersion` (UNSHARDED) and `databaseVersion` travel in the options.
            let mut template = self.template.clone();
            let versions = match RawDocumentBuf::try_from(&primary.versions) {
                Ok(v) => v,
                Err(e) => {
                    return vec![ChildResult {
                        shard: primary.shard.clone(),
                        statements,
                        ordered,
                        outcome: ChildOutcome::Failed {
                            code: ErrorCode::InternalError,
                            message: format!("the versions of {}: {e}", primary.shard),
                        },
                    }];
                }
            };
            for (k, v) in versions.iter().flatten() {
                template.append(k, v);
            }
            self.run_pieces(&primary.shard, statements, ordered, None, Some(&template))
                .await
        })
    }
    fn run_lookup<'a>(
        &'a self,
        snap: &'a RoutingSnapshot,
        statement: usize,
        shards: Vec<String>,
    ) -> crate::frontend::BoxFuture<'a, ChildResult> {
        Box::pin(async move {
            let i = statement;
            let result = |shard: &str, outcome: ChildOutcome| ChildResult {
                shard: shard.to_string(),
                statements: vec![i],
                ordered: true,
                outcome,
            };
            let first = shards.first().cloned().unwrap_or_default();
            let Some(stmt) = self.stmts.parsed(i) else {
                return result(
                    &first,
                    ChildOutcome::Reply(lookup::nothing_reply(self.kind)),
                );
            };
            let find = lookup::find_command(self.names().1, &stmt);
            let mut last = lookup::nothing_reply(self.kind);
            for _ in 0..lookup::MAX_ATTEMPTS {
                let hit = match self.find_one(snap, &shards, &find).await {
                    Ok(hit) => hit,
                    Err(e) => {
                        let reply = lookup::failed_reply(self.kind, e.code, &e.message);
                        return result(&first, ChildOutcome::Reply(reply));
                    }
                };
                let stmt_ids = self.retryable.then(|| vec![self.stmt_id(i)]);
                match lookup::decide(
                    snap,
                    self.kind,
                    &stmt,
                    shards.first().map(String::as_str),
                    hit,
                ) {
                    lookup::Step::Nothing => {
                        return result(
                            &first,
                            ChildOutcome::Reply(lookup::nothing_reply(self.kind)),
                        )
                    }
                    lookup::Step::Validate { shard, statement } => {
                        let outcome = match statement.to_vec() {
                            Ok(b) => {
                                let child = ChildSpec {
                                    template: &self.template,
                                    kind: self.kind,
                                    ns: &self.ns,
                                    ordered: true,
                                    stmt_ids,
                                    version: self.raw_version(snap, &shard),
                                    retryable: self.retryable,
                                    max_time: self.max_time,
                                };
                                send_child(self.cluster, &shard, &child, &[Bytes::from(b)]).await
                            }
                            Err(e) => ChildOutcome::Reply(lookup::failed_reply(
                                self.kind,
                                ErrorCode::BadValue,
                                &e.to_string(),
                            )),
                        };
                        return result(&shard, outcome);
                    }
                    lookup::Step::Fail { code, message } => {
                        let reply = lookup::failed_reply(self.kind, code, &message);
                        return result(&first, ChildOutcome::Reply(reply));
                    }
                    lookup::Step::Insert { shard, document } => {
                        let id = document.get("_id").cloned().unwrap_or(Bson::Null);
                        let bytes = match document.to_vec() {
                            Ok(b) => Bytes::from(b),
                            Err(e) => {
                                let reply = lookup::failed_reply(
                                    self.kind,
                                    ErrorCode::BadValue,
                                    &e.to_string(),
                                );
                                return result(&shard, ChildOutcome::Reply(reply));
                            }
                        };
                        let template = match self.other_template("insert", true) {
                            Ok(t) => t,
                            Err(e) => {
                                let reply =
                                    lookup::failed_reply(self.kind, ErrorCode::InternalError, &e);
                                return result(&shard, ChildOutcome::Reply(reply));
                            }
                        };
                        let child = ChildSpec {
                            template: &template,
                            kind: WriteKind::Insert,
                            ns: &self.ns,
                            ordered: true,
                            stmt_ids,
                            version: self.raw_version(snap, &shard),
                            retryable: self.retryable,
                            max_time: self.max_time,
                        };
                        let outcome = match send_child(self.cluster, &shard, &child, &[bytes]).await
                        {
                            ChildOutcome::Reply(r) => {
                                ChildOutcome::Reply(lookup::upsert_reply(&r, &id))
                            }
                            failed => failed,
                        };
                        return result(&shard, outcome);
                    }
                    lookup::Step::Write { shard, statement } => {
                        let bytes = match statement.to_vec() {
                            Ok(b) => Bytes::from(b),
                            Err(e) => {
                                let reply = lookup::failed_reply(
                                    self.kind,
                                    ErrorCode::BadValue,
                                    &e.to_string(),
                                );
                                return result(&shard, ChildOutcome::Reply(reply));
                            }
                        };
                        let child = ChildSpec {
                            template: &self.template,
                            kind: self.kind,
                            ns: &self.ns,
                            ordered: true,
                            stmt_ids,
                            version: self.raw_version(snap, &shard),
                            retryable: self.retryable,
                            max_time: self.max_time,
                        };
                        match send_child(self.cluster, &shard, &child, &[bytes]).await {
                            // The document changed between the two steps: look again.
                            ChildOutcome::Reply(r) if lookup::went_away(&r) => last = r,
                            outcome => return result(&shard, outcome),
                        }
                    }
                }
            }
            result(&first, ChildOutcome::Reply(last))
        })
    }

    fn undo_inserts<'a>(
        &'a self,
        snap: &'a RoutingSnapshot,
        statements: Vec<usize>,
    ) -> crate::frontend::BoxFuture<'a, Vec<usize>> {
        Box::pin(async move {
            // Each document is deleted only while it equals, field for field and in order,
            // the document inserted (`_id` first, as shards store it).
            let mut by_shard: std::collections::BTreeMap<String, Vec<(usize, Bson, Bytes)>> =
                Default::default();
            let mut left = Vec::new();
            for i in statements {
                let Some(raw) = self.stmts.raw.get(i) else {
                    continue;
                };
                let parsed = RawDocument::from_bytes(&raw[..])
                    .ok()
                    .and_then(|r| Some((r, Document::try_from(r).ok()?)));
                let Some((raw_doc, doc)) = parsed else {
                    left.push(i);
                    continue;
                };
                let shard = match target::target_insert(snap, raw_doc, false).target {
                    target::Target::One(s) => s,
                    _ => {
                        left.push(i);
                        continue;
                    }
                };
                let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
                let delete = doc! {"q": undo_filter(doc), "limit": 1};
                match delete.to_vec() {
                    Ok(b) => by_shard
                        .entry(shard)
                        .or_default()
                        .push((i, id, Bytes::from(b))),
                    Err(_) => left.push(i),
                }
            }
            let Ok(template) = self.other_template("delete", false) else {
                // Nothing can be deleted: every document stays as inserted.
                left.extend(by_shard.into_values().flatten().map(|(i, _, _)| i));
                left.sort_unstable();
                return left;
            };
            let futures = by_shard.into_iter().map(|(shard, items)| {
                let template = &template;
                async move {
                    let raws: Vec<Bytes> = items.iter().map(|(_, _, b)| b.clone()).collect();
                    let child = ChildSpec {
                        template,
                        kind: WriteKind::Delete,
                        ns: &self.ns,
                        ordered: false,
                        stmt_ids: None,
                        version: self.raw_version(snap, &shard),
                        retryable: false,
                        max_time: self.max_time,
                    };
                    let sent = send_child(self.cluster, &shard, &child, &raws).await;
                    let all_gone = match sent.into_owned() {
                        ChildOutcome::Reply(r) => {
                            r.get_f64("ok").ok() == Some(1.0)
                                && number_field(&r, "n") == Some(items.len() as i64)
                        }
                        ChildOutcome::Failed { .. } | ChildOutcome::Raw(_) => false,
                    };
                    if all_gone {
                        return Vec::new();
                    }
                    let ids: Vec<Bson> = items.iter().map(|(_, id, _)| id.clone()).collect();
                    let there = self.still_there(snap, &shard, &ids).await;
                    items
                        .iter()
                        .filter(|(_, id, _)| {
                            there
                                .iter()
                                .any(|t| crate::value::compare::values_equal(t, id))
                        })
                        .map(|(i, _, _)| *i)
                        .collect::<Vec<usize>>()
                }
            });
            left.extend(
                crate::backend::join_all(futures)
                    .await
                    .into_iter()
                    .flatten(),
            );
            left.sort_unstable();
            left
        })
    }
}

/// The filter that matches an inserted document only while it is still, field for field and in
/// order, the document inserted (`_id` first, as shards store it): what undoing an insert
/// deletes.
fn undo_filter(doc: Document) -> Document {
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    let mut stored = doc! {"_id": id.clone()};
    stored.extend(doc.into_iter().filter(|(k, _)| k != "_id"));
    doc! {"_id": id, "$expr": {"$eq": ["$$ROOT", {"$literal": stored}]}}
}

/// Targets statement `i` of a parsed request.
fn target_statement(
    kind: WriteKind,
    stmts: &Statements,
    snap: &RoutingSnapshot,
    i: usize,
) -> Targeted {
    let d = match RawDocument::from_bytes(&stmts.raw[i][..]) {
        Ok(d) => d,
        Err(e) => {
            return Targeted {
                target: target::Target::Error {
                    code: ErrorCode::InvalidBSON,
                    message: e.to_string(),
                },
                identity: None,
                retry_safe: false,
            }
        }
    };
    match kind {
        WriteKind::Insert => target::target_insert(snap, d, stmts.client_id[i]),
        WriteKind::Update => target::target_update_bytes(snap, d),
        WriteKind::Delete => target::target_delete_bytes(snap, d),
    }
}

/// Executes a write command on a sharded collection and returns the client's reply (without
/// `ok`), or a command-level error. `options` are the request's, read by
/// [`WriteOptions::from_raw`] (or [`WriteOptions::from_document`]). Inserts without a session of their own may share child
/// batches through `coalescer`, when the router has one. `primary` finds the database's
/// primary shard when a refresh after stale statements finds the collection no longer sharded.
#[allow(clippy::too_many_arguments)]
pub async fn execute(
    cluster: &Arc<Cluster>,
    coalescer: Option<&coalesce::Coalescer>,
    stats: &WriteStats,
    policy: Policy,
    req: &CommandRequest,
    options: WriteOptions,
    kind: WriteKind,
    snapshot: Arc<RoutingSnapshot>,
    primary: &PrimaryLookup<'_>,
) -> Result<crate::wire::Reply, CommandError> {
    let WriteOptions {
        ordered,
        retryable,
        client_stmt_ids,
        max_time,
        template,
        ..
    } = options;
    let stmts = statements(req, kind)?;
    let spec = WriteSpec {
        kind,
        ordered,
        policy,
        retryable,
        statements: stmts.raw.len(),
        ns: snapshot.ns.clone(),
    };
    let sender = ClusterSender {
        cluster,
        coalescer,
        ns: snapshot.ns.clone(),
        max_time,
        kind,
        template,
        stmts: &stmts,
        retryable,
        client_stmt_ids,
    };
    let ns = spec.ns.clone();
    let target = |snap: &RoutingSnapshot, i: usize| target_statement(kind, &stmts, snap, i);
    let refresh = |errors: Vec<Document>| -> crate::frontend::BoxFuture<'_, _> {
        let ns = &ns;
        Box::pin(async move {
            match cluster.routing.reload(ns, &errors).await {
                Ok(Some(snap)) => Some(Retarget::Sharded(snap)),
                // Dropped or renamed away since the router cached it: unsharded now, as mongos's
                // targeter finds it after its refresh, so the statements go to the primary.
                Ok(None) => primary().await.map(Retarget::Primary),
                Err(e) => {
                    tracing::debug!(ns = %ns, error = %e, "routing refresh after stale statements failed");
                    None
                }
            }
        })
    };
    let outcome = run_write(&spec, &sender, &target, snapshot, &refresh, stats).await;
    // A bulk whose child batches all timed out in the shards' queues applied nothing: it
    // fails as a command with ExceededTimeLimit, labelled RetryableWriteError for a retryable
    // write, so the driver retries it as it would for mongos.
    let errors = outcome.merger.write_errors();
    let all_queue_timeouts = !errors.is_empty()
        && errors
            .iter()
            .filter_map(|e| e.as_document())
            .all(|e| e.get_i32("code").ok() == Some(ErrorCode::ExceededTimeLimit.0));
    if all_queue_timeouts && outcome.merger.nothing_applied() {
        let first = errors
            .first()
            .and_then(|e| e.as_document())
            .and_then(|e| e.get_str("errmsg").ok())
            .unwrap_or("timed out waiting for an execution slot")
            .to_string();
        let mut e = CommandError::new(ErrorCode::ExceededTimeLimit, first);
        if retryable {
            e.labels.push("RetryableWriteError".into());
        }
        return Err(e);
    }
    // Written as bytes (the same bytes the reply document encodes to); the document only when
    // an error cannot be encoded, for the frontend to answer as it answers such a reply.
    Ok(match outcome.merger.reply_raw() {
        Some(raw) => crate::wire::Reply::Raw(raw),
        None => crate::wire::Reply::Document(outcome.merger.reply()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::raw::cstr;
    use bson::spec::BinarySubtype;
    use bson::Timestamp;

    /// The options of `body` read in place and read from its options document.
    fn both(body: &RawDocument) -> (Option<WriteOptions>, WriteOptions) {
        let req = CommandRequest::new(
            "d".into(),
            crate::wire::BsonDoc::from_encoded(body.as_bytes().to_vec()),
            Vec::new(),
            false,
        );
        let kind = WriteKind::from_command(&req.name).expect("a write command");
        let owned = WriteOptions::from_document(&req.options_document()).expect("encodes");
        (
            WriteOptions::from_raw(req.body.raw(), kind.statements_field()),
            owned,
        )
    }

    fn raw(d: &Document) -> RawDocumentBuf {
        RawDocumentBuf::try_from(d).expect("encodes")
    }

    #[test]
    fn options_read_in_place_are_the_options_read_from_a_document() {
        let lsid = doc! {"id": bson::Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] }};
        let cluster_time =
            doc! {"clusterTime": Timestamp { time: 1, increment: 2 }, "signature": {"keyId": 0i64}};
        for body in [
            doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "d"},
            doc! {
                "insert": "c", "ordered": false, "lsid": lsid.clone(), "txnNumber": 5i64,
                "$clusterTime": cluster_time.clone(), "writeConcern": {"w": 0, "j": true},
                "stmtIds": [3, 4i64, "x"], "maxTimeMS": 2500.0, "$db": "d",
                "comment": {"a": [1, {"b": 2}]}, "documents": [{"_id": 1}],
            },
            doc! {
                "update": "c", "updates": [{"q": {}, "u": {}}], "writeConcern": "majority",
                "ordered": 0, "$readPreference": {"mode": "primary"},
                "shardVersion": {"e": 1}, "databaseVersion": {"v": 1}, "stmtId": 1, "$db": "d",
            },
            doc! {
                "delete": "c", "deletes": [], "writeConcern": {"j": false, "w": 0i64},
                "startTransaction": true, "autocommit": false, "maxTimeMS": -1, "$db": "d",
            },
            doc! {
                "insert": "c", "documents": [], "writeConcern": {"w": 1, "wtimeout": 10},
                "maxTimeMS": 0i32, "bypassDocumentValidation": true, "let": {"x": 1}, "$db": "d",
            },
            doc! {"update": "c", "ordered": true, "autocommit": true, "startTransaction": 0, "$db": "d"},
            doc! {
                "insert": "c", "comment": "text", "f": 2.5, "l": 7i64, "nul": Bson::Null,
                "t": Timestamp { time: 3, increment: 4 }, "o": ObjectId::from_bytes([1; 12]),
                "dt": bson::DateTime::from_millis(1_700_000_000_000), "yes": false,
                "bin": bson::Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2, 3] },
                "a": [1, "two", {"three": 3}], "documents": [{"_id": 1}], "$db": "d",
            },
        ] {
            let (read, owned) = both(&raw(&body));
            let read = read.expect("read in place");
            assert_eq!(
                read.template.as_bytes(),
                owned.template.as_bytes(),
                "{body}"
            );
            assert_eq!(
                (
                    read.ordered,
                    read.retryable,
                    read.in_transaction,
                    &read.client_stmt_ids,
                    read.max_time
                ),
                (
                    owned.ordered,
                    owned.retryable,
                    owned.in_transaction,
                    &owned.client_stmt_ids,
                    owned.max_time
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn bodies_an_owned_document_would_change_are_read_as_a_document() {
        // A repeated top-level field: an owned document keeps the last value in the first place.
        let mut repeated = RawDocumentBuf::new();
        repeated.append(cstr!("insert"), "c");
        repeated.append(cstr!("ordered"), false);
        repeated.append(cstr!("ordered"), true);
        assert!(WriteOptions::from_raw(&repeated, "documents").is_none());
        // A repeated field inside a value the child batches carry.
        let mut wc = RawDocumentBuf::new();
        wc.append(cstr!("w"), 0);
        wc.append(cstr!("w"), 1);
        let mut inner = RawDocumentBuf::new();
        inner.append(cstr!("insert"), "c");
        inner.append(cstr!("writeConcern"), wc);
        assert!(WriteOptions::from_raw(&inner, "documents").is_none());
        // A regular expression whose options an owned value would sort.
        let mut regex = RawDocumentBuf::new();
        regex.append(cstr!("insert"), "c");
        regex.append(
            cstr!("comment"),
            bson::RawRegexRef {
                pattern: cstr!("a"),
                options: cstr!("xi"),
            },
        );
        assert!(WriteOptions::from_raw(&regex, "documents").is_none());
        // The same in order is read in place, and alike.
        let mut sorted = RawDocumentBuf::new();
        sorted.append(cstr!("insert"), "c");
        sorted.append(
            cstr!("comment"),
            bson::RawRegexRef {
                pattern: cstr!("a"),
                options: cstr!("ix"),
            },
        );
        let (read, owned) = both(&sorted);
        assert_eq!(
            read.expect("read in place").template.as_bytes(),
            owned.template.as_bytes()
        );
    }
}

#[cfg(test)]
mod retarget_tests {
    //! The executor's route to the primary shard once a refresh finds the collection unsharded.

    use std::sync::Mutex;

    use super::*;
    use crate::routing::ShardKeyPattern;

    /// shard0 applies every statement; shard1 answers StaleConfig (its collection was
    /// dropped); the primary applies what it is sent, failing the statements in `dup` as
    /// duplicate keys (and, ordered, stopping there). Records what the primary was sent.
    struct Dropped {
        dup: Vec<usize>,
        to_primary: Mutex<Vec<(PrimaryShard, Vec<usize>, bool)>>,
    }

    fn ok(n: usize) -> Document {
        doc! {"ok": 1.0, "n": n as i32}
    }

    impl ChildSender for Dropped {
        fn run_shard<'a>(
            &'a self,
            _snap: &'a RoutingSnapshot,
            shard: &'a str,
            statements: Vec<usize>,
            ordered: bool,
        ) -> crate::frontend::BoxFuture<'a, Vec<ChildResult>> {
            Box::pin(async move {
                let reply = if shard == "shard0" {
                    ok(statements.len())
                } else {
                    doc! {"ok": 1.0, "n": 0, "writeErrors": [{
                        "index": 0, "code": 13388, "errmsg": "collection dropped",
                        "ns": "d.c", "shardId": shard,
                    }]}
                };
                vec![ChildResult {
                    shard: shard.into(),
                    statements,
                    ordered,
                    outcome: ChildOutcome::Reply(reply),
                }]
            })
        }

        fn run_primary<'a>(
            &'a self,
            primary: &'a PrimaryShard,
            statements: Vec<usize>,
            ordered: bool,
        ) -> crate::frontend::BoxFuture<'a, Vec<ChildResult>> {
            Box::pin(async move {
                self.to_primary.lock().expect("not poisoned").push((
                    primary.clone(),
                    statements.clone(),
                    ordered,
                ));
                let mut n = 0;
                let mut errors = Vec::new();
                for (k, i) in statements.iter().enumerate() {
                    if self.dup.contains(i) {
                        errors.push(doc! {"index": k as i32, "code": 11000, "errmsg": "E11000"});
                        if ordered {
                            break;
                        }
                    } else {
                        n += 1;
                    }
                }
                let mut reply = ok(n);
                if !errors.is_empty() {
                    reply.insert("writeErrors", errors);
                }
                vec![ChildResult {
                    shard: primary.shard.clone(),
                    statements,
                    ordered,
                    outcome: ChildOutcome::Reply(reply),
                }]
            })
        }
    }

    /// Runs four inserts bound for shard0, shard1, shard1, shard0 against [`Dropped`].
    fn run(ordered: bool, dup: Vec<usize>) -> (Document, Vec<(PrimaryShard, Vec<usize>, bool)>) {
        let pattern = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).expect("a key pattern");
        let snap = Arc::new(RoutingSnapshot::initial("d.c", pattern, 2).expect("a snapshot"));
        let shards = ["shard0", "shard1", "shard1", "shard0"];
        let target = |_: &RoutingSnapshot, i: usize| Targeted {
            target: target::Target::One(shards[i].to_string()),
            identity: None,
            retry_safe: true,
        };
        let primary = PrimaryShard {
            shard: "shard1".into(),
            versions: doc! {"databaseVersion": {"lastMod": 1}},
        };
        let refresh = |_: Vec<Document>| -> crate::frontend::BoxFuture<'_, _> {
            let p = primary.clone();
            Box::pin(async move { Some(Retarget::Primary(p)) })
        };
        let sender = Dropped {
            dup,
            to_primary: Mutex::new(Vec::new()),
        };
        let spec = WriteSpec {
            kind: WriteKind::Insert,
            ordered,
            policy: Policy::Off,
            retryable: true,
            statements: 4,
            ns: "d.c".into(),
        };
        let stats = WriteStats::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let outcome = rt.block_on(run_write(&spec, &sender, &target, snap, &refresh, &stats));
        let sent = sender.to_primary.into_inner().expect("not poisoned");
        (outcome.merger.reply(), sent)
    }

    fn errors(reply: &Document) -> Vec<(i32, i32)> {
        reply
            .get_array("writeErrors")
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_document())
                    .map(|e| {
                        (
                            e.get_i32("index").unwrap_or(-1),
                            e.get_i32("code").unwrap_or(-1),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn an_ordered_bulk_sends_the_primary_only_what_was_not_applied_and_keeps_its_indexes() {
        let (reply, sent) = run(true, vec![2]);
        // Statement 0 was applied on shard0 before shard1 answered stale; 1, 2 and 3 go to the
        // primary, in order, once; the primary's error at its own index 1 is statement 2.
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].1, vec![1, 2, 3]);
        assert!(sent[0].2, "ordered");
        assert_eq!(sent[0].0.versions, doc! {"databaseVersion": {"lastMod": 1}});
        assert_eq!(reply.get_i32("n").ok(), Some(2), "{reply}");
        assert_eq!(errors(&reply), vec![(2, 11000)], "{reply}");
    }

    #[test]
    fn an_unordered_bulk_sends_the_primary_only_the_stale_statements() {
        let (reply, sent) = run(false, vec![1]);
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].1, vec![1, 2]);
        assert!(!sent[0].2, "unordered");
        assert_eq!(reply.get_i32("n").ok(), Some(3), "{reply}");
        assert_eq!(errors(&reply), vec![(1, 11000)], "{reply}");
    }

    #[test]
    fn statements_the_primary_finds_stale_again_are_given_up_after_five_rounds() {
        /// Every shard, the primary too, answers StaleDbVersion.
        struct AlwaysStale;
        fn stale(shard: &str, statements: Vec<usize>, ordered: bool) -> Vec<ChildResult> {
            let reply = doc! {"ok": 1.0, "n": 0, "writeErrors": [{
                "index": 0, "code": 249, "errmsg": "version mismatch detected for d",
            }]};
            vec![ChildResult {
                shard: shard.into(),
                statements,
                ordered,
                outcome: ChildOutcome::Reply(reply),
            }]
        }
        impl ChildSender for AlwaysStale {
            fn run_shard<'a>(
                &'a self,
                _snap: &'a RoutingSnapshot,
                shard: &'a str,
                statements: Vec<usize>,
                ordered: bool,
            ) -> crate::frontend::BoxFuture<'a, Vec<ChildResult>> {
                Box::pin(async move { stale(shard, statements, ordered) })
            }
            fn run_primary<'a>(
                &'a self,
                primary: &'a PrimaryShard,
                statements: Vec<usize>,
                ordered: bool,
            ) -> crate::frontend::BoxFuture<'a, Vec<ChildResult>> {
                Box::pin(async move { stale(&primary.shard, statements, ordered) })
            }
        }
        let pattern = ShardKeyPattern::parse(&doc! {"_id": "hashed"}).expect("a key pattern");
        let snap = Arc::new(RoutingSnapshot::initial("d.c", pattern, 2).expect("a snapshot"));
        let target = |_: &RoutingSnapshot, _: usize| Targeted {
            target: target::Target::One("shard0".into()),
            identity: None,
            retry_safe: true,
        };
        let refresh = |_: Vec<Document>| -> crate::frontend::BoxFuture<'_, _> {
            Box::pin(async move {
                Some(Retarget::Primary(PrimaryShard {
                    shard: "shard1".into(),
                    versions: Document::new(),
                }))
            })
        };
        let spec = WriteSpec {
            kind: WriteKind::Insert,
            ordered: true,
            policy: Policy::Off,
            retryable: false,
            statements: 1,
            ns: "d.c".into(),
        };
        let stats = WriteStats::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let outcome = rt.block_on(run_write(
            &spec,
            &AlwaysStale,
            &target,
            snap,
            &refresh,
            &stats,
        ));
        let reply = outcome.merger.reply();
        assert_eq!(errors(&reply), vec![(0, 82)], "{reply}");
        // The first round by the chunks, then the primary until five rounds made no progress.
        assert_eq!(outcome.rounds, MAX_ROUNDS_WITHOUT_PROGRESS as u64);
    }
}
