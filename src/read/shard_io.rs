//! Shard I/O of the read path: one read command on one shard through its queue and adaptive
//! limit, the shard cursors a router cursor merges ([`ShardStream`]), opening them, pulling
//! their next batches and killing them.
//!
//! Replies stay encoded: a shard's batch is kept as the slices of its reply frame that hold
//! each document (`Bytes`, shared, not copied), so documents a client reads through the
//! router are never decoded or re-encoded on the way.

use std::collections::VecDeque;

use bson::raw::cstr;
use bson::{doc, Document, RawBsonRef, RawDocument};
use bytes::Bytes;

use crate::backend::limiter::{OpKind, Outcome};
use crate::backend::shard::{need_of, Resend};
use crate::backend::topology::Need;
use crate::backend::{BackendError, PooledConnection};
use crate::cluster::{Cluster, SlotRequest};
use crate::command::CommandError;
use crate::routing::RoutingSnapshot;
use crate::value::error_codes::ErrorCode;
use crate::wire::{BsonDoc, OpMsgBuilder};

/// Why a read on one shard failed.
pub(super) enum ReadFailure {
    /// The shard could not be reached: what `allowPartialResults` may skip.
    Unreachable(CommandError),
    /// No slot was granted in time: the command never reached the shard.
    NotRun(CommandError),
    /// The shard answered with an error.
    Refused(CommandError),
}

impl ReadFailure {
    pub(super) fn into_error(self) -> CommandError {
        match self {
            ReadFailure::Unreachable(e) | ReadFailure::NotRun(e) | ReadFailure::Refused(e) => e,
        }
    }
}

/// Sends `cmd` to `shard` and returns the reply body as it came, with the member that sent
/// it: to the member `at` when given (a cursor's `getMore` goes where the cursor is), else to
/// a member chosen by the command's `$readPreference` (the primary without one), sent again to
/// another after a retriable failure.
async fn exchange(
    cluster: &Cluster,
    shard: &str,
    cmd: &Document,
    at: Option<&str>,
) -> Result<(BsonDoc, String), BackendError> {
    let bytes = cmd
        .to_vec()
        .map_err(|e| BackendError::Protocol(format!("cannot encode command: {e}")))?;
    let max_time = crate::value::field::number_field(cmd, "maxTimeMS");
    exchange_raw(cluster, shard, &bytes, max_time, Member::of(at)).await
}

/// Which member of a shard a read goes to.
#[derive(Debug, Clone, Copy)]
enum Member<'a> {
    /// This one: it holds the cursor the read continues.
    At(&'a str),
    /// One chosen by the command's `$readPreference`: what it needs, when the caller already
    /// read it from the same element; else it is read from the command's bytes.
    Chosen(Option<&'a Need>),
}

impl<'a> Member<'a> {
    /// `at` when given, else one chosen by the command.
    fn of(at: Option<&'a str>) -> Self {
        at.map_or(Member::Chosen(None), Member::At)
    }
}

/// [`exchange`] of a command already encoded (`max_time`: its `maxTimeMS`, read by the caller).
async fn exchange_raw(
    cluster: &Cluster,
    shard: &str,
    bytes: &[u8],
    max_time: Option<i64>,
    member: Member<'_>,
) -> Result<(BsonDoc, String), BackendError> {
    let Some(pool) = cluster.pool(shard) else {
        return Err(BackendError::Unreachable(format!("unknown shard {shard}")));
    };
    let id = PooledConnection::next_request_id();
    let frame = OpMsgBuilder::new(0, bytes).finish(id, 0);
    let known = match member {
        Member::At(member) => {
            let mut conn = pool.checkout_at(member).await?;
            let addr = conn.addr().to_string();
            return conn.request(&frame, id).await.map(|r| (r, addr));
        }
        Member::Chosen(known) => known,
    };
    let read;
    let need = match known {
        Some(need) => need,
        None => {
            read = RawDocument::from_bytes(bytes)
                .map_err(|e| BackendError::Protocol(format!("cannot encode command: {e}")))
                .and_then(|raw| {
                    need_of(raw).map_err(|e| BackendError::NoMember(e.code, e.message))
                })?;
            &read
        }
    };
    let deadline = max_time
        .filter(|m| *m > 0)
        .map(|m| std::time::Instant::now() + std::time::Duration::from_millis(m as u64));
    // A transaction's statement is never sent again to another member.
    let resend = if super::in_txn::active() {
        Resend::Never
    } else {
        Resend::Read
    };
    pool.send(&frame, id, need, deadline, resend).await
}

/// Runs one read command on a shard (`ns` names the collection it reads) once the shard's
/// queue and adaptive limit grant a slot, and returns the shard's `{ok: 1}` reply, encoded.
pub(super) async fn read_on(
    cluster: &Cluster,
    shard: &str,
    ns: &str,
    cmd: &Document,
) -> Result<BsonDoc, ReadFailure> {
    read_at(cluster, shard, None, ns, cmd).await.map(|(r, _)| r)
}

/// [`read_on`] on the member `at` when given, returning the member that answered.
pub(super) async fn read_at(
    cluster: &Cluster,
    shard: &str,
    at: Option<&str>,
    ns: &str,
    cmd: &Document,
) -> Result<(BsonDoc, String), ReadFailure> {
    let name = cmd.keys().next().map(String::as_str).unwrap_or_default();
    let bytes = cmd.to_vec().map_err(|e| {
        ReadFailure::Unreachable(
            BackendError::Protocol(format!("cannot encode command: {e}"))
                .at(shard)
                .into(),
        )
    })?;
    let max_time = crate::value::field::number_field(cmd, "maxTimeMS");
    read_at_raw(
        cluster,
        shard,
        Member::of(at),
        ns,
        name,
        &bytes,
        max_time,
        None,
    )
    .await
    .map(|(r, m, _)| (r, m))
}

/// A shard cursor's batch as its reply carries it: the documents (each the slice of the reply
/// that holds it) and the cursor id.
pub(super) type Batch = (VecDeque<Bytes>, i64);

/// [`read_at`] of a command already encoded (`bytes`), named `name`, with `max_time` its
/// `maxTimeMS`; with `batch`, also the reply's `cursor.<batch>` ([`batch_of`]), read in the same
/// walk of the reply as its `ok` (empty without it).
#[allow(clippy::too_many_arguments)]
async fn read_at_raw(
    cluster: &Cluster,
    shard: &str,
    member: Member<'_>,
    ns: &str,
    name: &str,
    bytes: &[u8],
    max_time: Option<i64>,
    batch: Option<&str>,
) -> Result<(BsonDoc, String, Batch), ReadFailure> {
    let work = SlotRequest {
        op: OpKind::Read,
        command: name,
        ns,
        operations: 1,
        bytes: 0,
    };
    let permit = cluster.slot(shard, work).await.map_err(|e| {
        ReadFailure::NotRun(CommandError::new(
            ErrorCode::ExceededTimeLimit,
            e.to_string(),
        ))
    })?;
    // Inside a transaction the command is a statement of it (see [`super::in_txn`]).
    let (statement, joined) = match super::in_txn::statement(cluster, shard, bytes) {
        Some(Ok((b, j))) => (Some(b), Some(j)),
        Some(Err(e)) => return Err(ReadFailure::NotRun(e)),
        None => (None, None),
    };
    let bytes = statement.as_deref().unwrap_or(bytes);
    let result = exchange_raw(cluster, shard, bytes, max_time, member).await;
    // The reply's `ok` and cursor in one walk (the cursor comes first in a shard's reply).
    let (ok, cursor) = match &result {
        Ok((r, _)) => {
            let [cursor, ok] = crate::wire::get_fields(r.raw(), ["cursor", "ok"]);
            let ok = matches!(ok, Ok(Some(RawBsonRef::Double(ok))) if ok == 1.0);
            let cursor = match cursor {
                Ok(Some(RawBsonRef::Document(c))) if batch.is_some() => Some(c),
                _ => None,
            };
            (ok, cursor)
        }
        Err(_) => (false, None),
    };
    let found = match (batch, cursor, &result) {
        (Some(batch), Some(cursor), Ok((r, _))) if ok => batch_in(r, cursor, batch),
        _ => (VecDeque::new(), 0),
    };
    if let Some(j) = &joined {
        super::in_txn::settle(cluster, shard, j, ok);
    }
    if let Some(p) = permit {
        p.finish(match &result {
            Ok(_) => Outcome::Completed,
            Err(BackendError::Timeout(_)) => Outcome::TimedOut,
            Err(_) => Outcome::NotCounted,
        });
    }
    let (reply, member) = result.map_err(|e| match e {
        BackendError::NoMember(code, message) => {
            ReadFailure::Refused(CommandError::new(code, message))
        }
        e => ReadFailure::Unreachable(e.at(shard).into()),
    })?;
    if !ok {
        let reply = reply.to_document();
        let mut e = CommandError::from_shard_reply(shard, &reply);
        if joined.is_some() {
            e.labels = crate::command::reply_labels(&reply);
        }
        return Err(ReadFailure::Refused(e));
    }
    Ok((reply, member, found))
}

/// Runs one read command on a shard through its queue, as every shard read does, for readers
/// outside this module (the write path's lookups): the shard's `{ok: 1}` reply or the error.
pub async fn read_one(
    cluster: &Cluster,
    shard: &str,
    ns: &str,
    cmd: &Document,
) -> Result<Document, CommandError> {
    read_one_at(cluster, shard, None, ns, cmd).await
}

/// [`read_one`] on the member `at` when given (a `getMore` for a cursor a write opened goes to
/// the member that holds it, whatever it is now).
pub async fn read_one_at(
    cluster: &Cluster,
    shard: &str,
    at: Option<&str>,
    ns: &str,
    cmd: &Document,
) -> Result<Document, CommandError> {
    read_at(cluster, shard, at, ns, cmd)
        .await
        .map(|(r, _)| r.to_document())
        .map_err(ReadFailure::into_error)
}

/// One shard's cursor as the router sees it: what it has buffered (each document the slice
/// of the shard's reply that holds it) and whether more remains.
#[derive(Debug)]
pub(super) struct ShardStream {
    pub(super) shard: String,
    /// The member that holds the shard cursor (its `getMore`s and `killCursors` go there).
    pub(super) member: String,
    pub(super) cursor_id: i64,
    pub(super) buffer: VecDeque<Bytes>,
}

/// The documents of a cursor reply's `cursor.<batch>` and its cursor id, without decoding
/// them: each is the slice of `reply` that holds it.
pub(super) fn batch_of(reply: &BsonDoc, batch: &str) -> Batch {
    match crate::wire::get_field(reply.raw(), "cursor") {
        Ok(Some(RawBsonRef::Document(cursor))) => batch_in(reply, cursor, batch),
        _ => (VecDeque::new(), 0),
    }
}

/// [`batch_of`] of the reply's `cursor` document, already found.
fn batch_in(reply: &BsonDoc, cursor: &RawDocument, batch: &str) -> Batch {
    let id = match crate::wire::get_field(cursor, "id") {
        Ok(Some(RawBsonRef::Int64(id))) => id,
        _ => 0,
    };
    let mut docs = VecDeque::new();
    if let Ok(Some(RawBsonRef::Array(items))) = cursor.get(batch) {
        // The items by the byte walk ([`crate::wire::elements`]); by the `bson` crate's
        // iterator when that walk does not read them.
        let walked = RawDocument::from_bytes(items.as_bytes())
            .ok()
            .and_then(|as_doc| {
                for item in crate::wire::elements(as_doc) {
                    if let (_, RawBsonRef::Document(d)) = item? {
                        docs.push_back(reply.bytes().slice_ref(d.as_bytes()));
                    }
                }
                Some(())
            });
        if walked.is_none() {
            docs.clear();
            for item in items.into_iter().flatten() {
                if let RawBsonRef::Document(d) = item {
                    docs.push_back(reply.bytes().slice_ref(d.as_bytes()));
                }
            }
        }
    }
    (docs, id)
}

/// A buffered document, read in place (it was validated with the reply that carried it).
pub(super) fn raw(doc: &Bytes) -> &RawDocument {
    RawDocument::from_bytes(doc).unwrap_or_else(|_| crate::wire::empty_document())
}

/// A buffered document decoded (for the router's own projection and aggregation stages).
pub(super) fn decode(doc: &Bytes) -> Document {
    Document::try_from(raw(doc)).unwrap_or_default()
}

/// Sends a cursor-returning command (`command`, encoded) to each of `shards` at once and keeps
/// each shard's first batch and cursor. With `partial`, a shard that cannot be reached is
/// skipped (and reported). `need` is the member the command's `$readPreference` asks for, when
/// the caller read it from the element the command carries; else it is read from `command`.
/// `ns` is `db.coll`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn open_streams(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    shards: Vec<String>,
    db: &str,
    coll: &str,
    ns: &str,
    command: &RawDocument,
    need: Option<&Need>,
    partial: bool,
) -> Result<(Vec<ShardStream>, bool), CommandError> {
    let name = first_key(command);
    let max_time = max_time_of(command);
    let mut futures = Vec::with_capacity(shards.len());
    for shard in shards {
        let cmd = shard_command(cluster, snap, &shard, command, db)?;
        futures.push(async move {
            let (_, member, (buffer, cursor_id)) = read_at_raw(
                cluster,
                &shard,
                Member::Chosen(need),
                ns,
                name,
                &cmd,
                max_time,
                Some("firstBatch"),
            )
            .await?;
            Ok(ShardStream {
                buffer,
                cursor_id,
                shard,
                member,
            })
        });
    }
    let mut streams = Vec::new();
    let mut skipped = false;
    let mut failure = None;
    for r in crate::backend::join_all(futures).await {
        match r {
            Ok(s) => streams.push(s),
            Err(ReadFailure::Unreachable(_)) if partial => skipped = true,
            Err(f) => failure = failure.or(Some(f.into_error())),
        }
    }
    if let Some(e) = failure {
        kill_streams(cluster, db, coll, &streams).await;
        return Err(e);
    }
    Ok((streams, skipped))
}

/// The name of a command: its first field's.
fn first_key(command: &RawDocument) -> &str {
    // The byte walk reads the first element as the `bson` crate's iterator does; an element
    // it does not read is read by that iterator.
    match crate::wire::elements(command).next() {
        Some(Some((k, _))) => k.as_str(),
        _ => command
            .iter()
            .next()
            .and_then(Result::ok)
            .map(|(k, _)| k.as_str())
            .unwrap_or_default(),
    }
}

/// A command's `maxTimeMS`, as [`crate::value::field::number_field`] reads it.
fn max_time_of(command: &RawDocument) -> Option<i64> {
    crate::wire::get_field(command, "maxTimeMS")
        .ok()
        .flatten()
        .and_then(crate::value::field::number_raw)
}

/// The bytes of `command` for `shard`: with `$db`, and the shard's `shardVersion` when it is a
/// shard server ([`child_command`]).
fn shard_command(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    shard: &str,
    command: &RawDocument,
    db: &str,
) -> Result<Vec<u8>, CommandError> {
    let version = cluster
        .is_shard_server(shard)
        .then(|| snap.shard_version_bytes(shard));
    child_command(command, db, version.as_deref())
}

/// The bytes of the command one shard is sent: `command` with `$db` and, for a shard server,
/// its `shardVersion` (encoded, [`RoutingSnapshot::shard_version_bytes`]) set. Both are
/// appended to the command's bytes when it holds neither, which is where inserting them into
/// an owned copy put them; otherwise an owned copy is changed and encoded.
fn child_command(
    command: &RawDocument,
    db: &str,
    version: Option<&RawDocument>,
) -> Result<Vec<u8>, CommandError> {
    let encode_error = |e: bson::error::Error| {
        CommandError::new(
            ErrorCode::InternalError,
            format!("cannot encode command: {e}"),
        )
    };
    let held = crate::wire::get_fields(command, ["$db", "shardVersion"]);
    if held.iter().any(|v| matches!(v, Ok(Some(_)))) {
        let mut cmd = Document::try_from(command).map_err(encode_error)?;
        cmd.insert("$db", db);
        if let Some(v) = version {
            cmd.insert("shardVersion", Document::try_from(v).map_err(encode_error)?);
        }
        return cmd.to_vec().map_err(encode_error);
    }
    // Room for `$db` and `shardVersion` (each its type, name, length and value).
    let room = db.len() + version.map_or(0, |v| v.as_bytes().len()) + 32;
    let mut out = crate::wire::document_with_room(command, room);
    out.append(cstr!("$db"), db);
    if let Some(v) = version {
        out.append(cstr!("shardVersion"), v);
    }
    Ok(out.into_bytes())
}

/// Fetches the next batch of a shard cursor into its buffer.
pub(super) async fn pull(
    cluster: &Cluster,
    db: &str,
    coll: &str,
    stream: &mut ShardStream,
    batch: usize,
) -> Result<(), CommandError> {
    let cmd = doc! {"getMore": stream.cursor_id, "collection": coll, "batchSize": batch.clamp(1, 100_000) as i64, "$db": db};
    let ns = format!("{db}.{coll}");
    let more = match read_at(cluster, &stream.shard, Some(&stream.member), &ns, &cmd).await {
        Ok((more, _)) => more,
        Err(ReadFailure::Refused(e)) => {
            // The shard answered with an error: its cursor is gone.
            stream.cursor_id = 0;
            return Err(e);
        }
        Err(f) => return Err(f.into_error()),
    };
    let (docs, id) = batch_of(&more, "nextBatch");
    stream.buffer.extend(docs);
    stream.cursor_id = id;
    Ok(())
}

/// Kills the shard cursors of streams that still have one.
pub(super) async fn kill_streams(cluster: &Cluster, db: &str, coll: &str, streams: &[ShardStream]) {
    let futures = streams
        .iter()
        .filter(|s| s.cursor_id != 0)
        .map(|s| async move {
            let cmd = doc! {"killCursors": coll, "cursors": [s.cursor_id], "$db": db};
            let _ = exchange(cluster, &s.shard, &cmd, Some(&s.member)).await;
        });
    crate::backend::join_all(futures).await;
}

/// Every document of each stream (aggregations whose router part needs all of them), at most
/// `limit` bytes of them together: past it the aggregation fails with 292 and the shard
/// cursors still open are killed, so one aggregation cannot make the router hold more.
pub(super) async fn drain(
    cluster: &Cluster,
    db: &str,
    coll: &str,
    streams: Vec<ShardStream>,
    limit: usize,
) -> Result<Vec<Vec<Document>>, CommandError> {
    let held = std::sync::atomic::AtomicUsize::new(0);
    let count = |docs: &[Bytes]| -> Result<(), CommandError> {
        let bytes: usize = docs.iter().map(Bytes::len).sum();
        let total = held.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed) + bytes;
        if total > limit {
            return Err(CommandError::new(
                ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed,
                format!("Exceeded memory limit of {limit} bytes gathering the shards' results at the router"),
            ));
        }
        Ok(())
    };
    let futures = streams.into_iter().map(|mut s| {
        let count = &count;
        async move {
            let result = async {
                count(s.buffer.make_contiguous())?;
                while s.cursor_id != 0 {
                    let before = s.buffer.len();
                    pull(cluster, db, coll, &mut s, 10_000).await?;
                    count(&s.buffer.make_contiguous()[before..])?;
                }
                Ok::<_, CommandError>(())
            }
            .await;
            match result {
                Ok(()) => Ok(s.buffer.iter().map(decode).collect::<Vec<_>>()),
                Err(e) => {
                    kill_streams(cluster, db, coll, std::slice::from_ref(&s)).await;
                    Err(e)
                }
            }
        }
    });
    crate::backend::join_all(futures)
        .await
        .into_iter()
        .collect()
}

/// Runs a plain command (`count`, `distinct`; `command`, encoded) on each targeted shard
/// (`need`: as for [`open_streams`]).
pub(super) async fn on_each(
    cluster: &Cluster,
    snap: &RoutingSnapshot,
    shards: Vec<String>,
    db: &str,
    command: &RawDocument,
    need: Option<&Need>,
) -> Result<Vec<Document>, CommandError> {
    let name = first_key(command);
    let max_time = max_time_of(command);
    let coll = match command.iter().next() {
        Some(Ok((_, RawBsonRef::String(c)))) => c,
        _ => "",
    };
    let ns = format!("{db}.{coll}");
    let mut futures = Vec::new();
    for shard in shards {
        let cmd = shard_command(cluster, snap, &shard, command, db)?;
        let ns = &ns;
        futures.push(async move {
            read_at_raw(
                cluster,
                &shard,
                Member::Chosen(need),
                ns,
                name,
                &cmd,
                max_time,
                None,
            )
            .await
            .map(|(r, _, _)| r.to_document())
            .map_err(ReadFailure::into_error)
        });
    }
    let mut out = Vec::new();
    for r in crate::backend::join_all(futures).await {
        out.push(r?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each shard was sent before the command was encoded once: a copy of the document
    /// with `$db` and `shardVersion` inserted, encoded.
    fn owned_child(command: &Document, db: &str, version: Option<Document>) -> Vec<u8> {
        let mut cmd = command.clone();
        cmd.insert("$db", db);
        if let Some(v) = version {
            cmd.insert("shardVersion", v);
        }
        cmd.to_vec().expect("encodes")
    }

    #[test]
    fn child_command_is_the_owned_paths_bytes() {
        let version = doc! {"e": bson::oid::ObjectId::new(), "t": bson::Timestamp { time: 7, increment: 1 }, "v": bson::Timestamp { time: 3, increment: 2 }};
        let commands = [
            doc! {"find": "c", "filter": {"_id": 5}, "batchSize": 1_i64, "limit": 1_i64},
            doc! {"find": "c", "filter": {"a": {"$gt": 1}, "s": "x"}, "batchSize": 101_i64, "sort": {"a": 1}, "projection": {"a": 1}, "collation": {"locale": "fr"}, "maxTimeMS": 50, "$readPreference": {"mode": "secondary"}},
            doc! {"aggregate": "c", "pipeline": [{"$match": {"a": 1}}], "cursor": {"batchSize": 10_000}},
            doc! {"find": "c", "filter": {}},
            // Fields the router sets already present: replaced in place, as insert did.
            doc! {"find": "c", "$db": "other", "filter": {}},
            doc! {"find": "c", "shardVersion": {"v": 1}, "filter": {}},
        ];
        for command in &commands {
            let base = bson::RawDocumentBuf::try_from(command).expect("encodes");
            for version in [None, Some(version.clone())] {
                let raw_version = version
                    .as_ref()
                    .map(|v| bson::RawDocumentBuf::try_from(v).expect("encodes"));
                let new = child_command(&base, "db1", raw_version.as_deref()).expect("encodes");
                assert_eq!(new, owned_child(command, "db1", version), "{command}");
                let fields = Document::try_from(RawDocument::from_bytes(&new).expect("valid"))
                    .expect("decodes");
                assert_eq!(fields.get_str("$db").ok(), Some("db1"));
            }
        }
    }
}
