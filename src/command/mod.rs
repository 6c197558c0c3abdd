//! What every server shares, the router and the embedded shard alike: a decoded request as a
//! typed [`CommandRequest`], the [`CommandError`] every handler fails with (an unknown command
//! is a value with code 59, never a panic), the shared [`ServerState`] (counters, the cluster
//! clock), the request checks both servers make (`maxTimeMS`, `lsid`), and the commands both
//! answer alike: [`hello`] (the handshake and its awaitable form) and [`server_info`]
//! (`buildInfo`, `serverStatus`, `getParameter`, …). Handlers do not touch sockets; the frontend
//! owns the connection and hands them the per-connection [`ClientState`]. The router's own
//! dispatch is in `crate::router`, the embedded shard's in `crate::embedded`.

pub mod bulk_write;
pub mod cursors;
pub mod failpoint;
pub mod hello;
pub mod server_info;
pub mod service;
pub mod sessions;
pub mod write_kind;

pub use service::{BoxFuture, Response, Service};
pub use write_kind::WriteKind;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bson::{oid::ObjectId, Bson, Document, Timestamp};
use tokio::sync::watch;

use crate::config::Config;
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::wire::{BsonDoc, Compressor, DocumentSequence};

/// What one command failed with: the `{ok: 0, errmsg, code, codeName}` reply.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CommandError {
    /// The MongoDB code.
    pub code: ErrorCode,
    /// The `errmsg`.
    pub message: String,
    /// `errorLabels`, when the error carries any.
    pub labels: Vec<String>,
}

impl CommandError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        CommandError {
            code,
            message: message.into(),
            labels: Vec::new(),
        }
    }

    /// The error a shard's `{ok: 0}` reply stands for, naming the shard.
    pub fn from_shard_reply(shard: &str, reply: &Document) -> Self {
        CommandError::new(
            ErrorCode(
                reply
                    .get_i32("code")
                    .unwrap_or(ErrorCode::OperationFailed.0),
            ),
            format!(
                "{} (shard {shard})",
                reply
                    .get_str("errmsg")
                    .unwrap_or("the shard refused the command")
            ),
        )
    }

    /// The reply document for this error.
    pub fn to_reply(&self) -> Document {
        let mut d = self.code.error_reply(&self.message);
        if !self.labels.is_empty() {
            d.insert("errorLabels", self.labels.clone());
        }
        d
    }
}

impl From<EngineError> for CommandError {
    fn from(e: EngineError) -> Self {
        CommandError::new(e.code, e.message)
    }
}

impl From<crate::routing::RoutingError> for CommandError {
    fn from(e: crate::routing::RoutingError) -> Self {
        CommandError::new(e.code, e.message)
    }
}

impl From<crate::auth::AuthError> for CommandError {
    fn from(e: crate::auth::AuthError) -> Self {
        CommandError::new(e.code, e.message)
    }
}

/// A shard that could not answer: its code (HostUnreachable, NetworkTimeout) and the failure
/// with the shard's name.
impl From<crate::backend::ShardError> for CommandError {
    fn from(e: crate::backend::ShardError) -> Self {
        CommandError::new(e.source.code(), e.to_string())
    }
}

impl From<CommandError> for EngineError {
    fn from(e: CommandError) -> Self {
        EngineError::new(e.code, e.message)
    }
}

/// A command as the dispatcher sees it, whatever opcode carried it: parsed once, when the
/// message arrives ([`CommandRequest::from_op_msg`], [`CommandRequest::new`]), and carried
/// through the frontend, the dispatch and the read and write paths, which read its body and
/// statements in place.
#[derive(Debug, Clone)]
pub struct CommandRequest {
    /// The database (`$db` of OP_MSG, or the namespace's database of OP_QUERY).
    pub db: String,
    /// The command name: the body's first field.
    pub name: String,
    /// `db.collection` when the command names a collection (its first field's string value;
    /// `collection` for `getMore`), as the client sent it, unchecked.
    pub namespace: Option<String>,
    /// The body.
    pub body: BsonDoc,
    /// Kind-1 sections.
    pub sequences: Vec<DocumentSequence>,
    /// Arrived over the legacy OP_QUERY.
    pub legacy: bool,
    /// The body's `bypassDocumentValidation` by MongoDB's truthiness, when it was read on the
    /// way to `$db` ([`CommandRequest::from_op_msg`]); `None`: not read, the authorization
    /// check reads the body for it.
    pub bypass_document_validation: Option<bool>,
}

impl CommandRequest {
    /// 13 Unauthorized, `<name> may only be run against the admin database.`, unless the
    /// request is on `admin`: how mongod and mongos refuse an admin-only command elsewhere.
    pub fn require_admin(&self) -> Result<(), CommandError> {
        if self.db == "admin" {
            return Ok(());
        }
        Err(CommandError::new(
            ErrorCode::Unauthorized,
            format!("{} may only be run against the admin database.", self.name),
        ))
    }

    /// The request a body (already validated, or encoded by Sluice) and its sequences make
    /// on `db`: the name and the namespace are read from the body here, once.
    pub fn new(db: String, body: BsonDoc, sequences: Vec<DocumentSequence>, legacy: bool) -> Self {
        let raw = body.raw();
        let mut fields = raw.iter().flatten();
        let first = fields.next();
        let name = first
            .map(|(k, _)| k.as_str())
            .unwrap_or_default()
            .to_string();
        let collection = if name == "getMore" {
            raw.get_str("collection").ok()
        } else {
            match first {
                Some((_, bson::RawBsonRef::String(s))) => Some(s),
                _ => None,
            }
        };
        let namespace = collection.map(|c| format!("{db}.{c}"));
        CommandRequest {
            db,
            name,
            namespace,
            body,
            sequences,
            legacy,
            bypass_document_validation: None,
        }
    }

    /// The dispatcher's view of an OP_MSG: `$db` (mongod's errors when it is missing or not
    /// a string), the name, the namespace. For the commands whose authorization check reads
    /// `bypassDocumentValidation` (a write by a user who may not bypass validation), the walk
    /// that finds `$db` reads the flag too, so the check does not walk the body again; it goes
    /// on past `$db` only over the envelope fields a driver puts after it.
    pub fn from_op_msg(msg: &crate::wire::OpMsg) -> Result<Self, CommandError> {
        use crate::auth::authorize::{truthy, READS_BYPASS_DOCUMENT_VALIDATION};
        let raw = msg.body.raw();
        // The first key (the command's name) of a body already validated as a document.
        let first = raw
            .as_bytes()
            .get(5..)
            .and_then(|b| b.iter().position(|&c| c == 0).map(|n| &b[..n]));
        let reads_flag = first.is_some_and(|k| {
            READS_BYPASS_DOCUMENT_VALIDATION
                .iter()
                .any(|n| n.as_bytes() == k)
        });
        let (db, bypass) = if reads_flag {
            let [db, bypass] = crate::wire::get_fields(raw, ["$db", "bypassDocumentValidation"]);
            (db, Some(truthy(bypass.ok().flatten())))
        } else {
            (crate::wire::get_field(raw, "$db"), None)
        };
        let db = match db {
            Ok(Some(bson::RawBsonRef::String(db))) => db.to_string(),
            Ok(Some(_)) => {
                return Err(CommandError::new(
                    ErrorCode::TypeMismatch,
                    "BSON field '$db' is the wrong type, expected type 'string'",
                ))
            }
            _ => {
                return Err(CommandError::new(
                    ErrorCode(40571),
                    "OP_MSG requests require a $db argument",
                ))
            }
        };
        let mut req = CommandRequest::new(db, msg.body.clone(), msg.sequences.clone(), false);
        req.bypass_document_validation = bypass;
        Ok(req)
    }

    /// A request Sluice makes itself (start-up, tests): `body` on `db`, no sequences.
    pub fn from_document(db: &str, body: &Document) -> Result<Self, CommandError> {
        let bytes = body
            .to_vec()
            .map_err(|e| CommandError::new(ErrorCode::BadValue, e.to_string()))?;
        Ok(CommandRequest::new(
            db.to_string(),
            BsonDoc::from_encoded(bytes),
            Vec::new(),
            false,
        ))
    }

    /// The collection part of [`CommandRequest::namespace`].
    pub fn collection(&self) -> Option<&str> {
        self.namespace.as_deref().map(|ns| &ns[self.db.len() + 1..])
    }

    /// The body as an owned document (local commands only; the write path reads raw).
    pub fn body_document(&self) -> Document {
        self.body.to_document()
    }

    /// Only the body's fields named in `keys`, as an owned document: what
    /// [`CommandRequest::body_document`] would hold for them (a field named twice keeps its
    /// first position and its last value), without converting the rest of the body. For
    /// handlers that read a few fields of a body carrying much else (a `hello`'s client
    /// metadata, a speculative authentication).
    pub fn body_fields(&self, keys: &[&str]) -> Document {
        let mut d = Document::new();
        for (k, v) in self.body.raw().iter().flatten() {
            if keys.contains(&k.as_str()) {
                if let Ok(v) = Bson::try_from(v) {
                    d.insert(k.as_str(), v);
                }
            }
        }
        d
    }

    /// The collection the command names in its first field (`body` is its body), checked as
    /// mongod checks a namespace.
    pub fn collection_name(&self, body: &Document) -> Result<String, CommandError> {
        match body.get(&self.name) {
            Some(Bson::String(s)) => {
                crate::limits::check_namespace(&self.db, s)
                    .map_err(|m| CommandError::new(ErrorCode::InvalidNamespace, m))?;
                Ok(s.clone())
            }
            Some(other) => Err(CommandError::new(
                ErrorCode::InvalidNamespace,
                format!(
                    "collection name has invalid type {}",
                    crate::value::field::type_name(other)
                ),
            )),
            None => Err(CommandError::new(
                ErrorCode::InvalidNamespace,
                "missing collection name",
            )),
        }
    }

    /// The body as an owned document without a write command's statements array
    /// (`documents`, `updates`, `deletes`): the command's options. Converting a 1,000-statement
    /// body costs more than routing its statements, and the options are all the write path
    /// reads from it; the statements are read raw by [`CommandRequest::statement_bytes`].
    /// The client's `$clusterTime` is left out too: it is gossip that no handler reads (every
    /// reply carries the router's own), and the largest of the generic fields to convert.
    pub fn options_document(&self) -> Document {
        let skip: &[&str] = match WriteKind::from_command(&self.name) {
            Some(WriteKind::Insert) => &["documents", "$clusterTime"],
            Some(WriteKind::Update) => &["updates", "$clusterTime"],
            Some(WriteKind::Delete) => &["deletes", "$clusterTime"],
            None if self.name == "bulkWrite" => &["ops", "nsInfo", "$clusterTime"],
            None => &["$clusterTime"],
        };
        let mut d = Document::new();
        for (k, v) in self.body.raw().iter().flatten() {
            if skip.contains(&k.as_str()) {
                continue;
            }
            if let Ok(v) = Bson::try_from(v) {
                d.insert(k.as_str(), v);
            }
        }
        d
    }

    /// How many statements a write command (`insert`, `update`, `delete`, or the operations of
    /// a `bulkWrite`) carries, counted
    /// without reading them (`None` for any other command, or when the statements are
    /// missing).
    pub fn statement_count(&self) -> Option<usize> {
        let field = match WriteKind::from_command(&self.name) {
            Some(k) => k.statements_field(),
            None if self.name == "bulkWrite" => "ops",
            None => return None,
        };
        if let Some(seq) = self.sequences.iter().find(|s| s.identifier == field) {
            return Some(seq.documents.len());
        }
        match self.body.raw().get(field) {
            Ok(Some(bson::RawBsonRef::Array(a))) => Some(a.into_iter().count()),
            _ => None,
        }
    }

    /// The statements of a write command, raw: the kind-1 sequence named `field`, or else the
    /// body's `field` array, with mongod's errors when that array is missing or holds a
    /// non-document.
    pub fn statement_bytes(&self, field: &str) -> Result<Vec<bytes::Bytes>, CommandError> {
        if let Some(seq) = self.sequences.iter().find(|s| s.identifier == field) {
            return Ok(seq.documents.iter().map(|d| d.bytes().clone()).collect());
        }
        let wrong_type = |expected: &str| {
            CommandError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{}.{field}' is the wrong type, expected type '{expected}'",
                    self.name
                ),
            )
        };
        match self.body.raw().get(field) {
            Ok(Some(bson::RawBsonRef::Array(items))) => items
                .into_iter()
                .map(|item| match item {
                    Ok(bson::RawBsonRef::Document(d)) => {
                        Ok(bytes::Bytes::copy_from_slice(d.as_bytes()))
                    }
                    _ => Err(wrong_type("object")),
                })
                .collect(),
            Ok(Some(_)) => Err(wrong_type("array")),
            _ => Err(CommandError::new(
                ErrorCode(40414),
                format!(
                    "BSON field '{}.{field}' is missing but a required field",
                    self.name
                ),
            )),
        }
    }
}

/// Per-connection state that commands read and change (the handshake's results).
#[derive(Debug)]
pub struct ClientState {
    /// The connection's id (`connectionId` in `hello`).
    pub id: i64,
    /// The client's address.
    pub peer: SocketAddr,
    /// Compressors negotiated in the handshake, in the client's order of preference.
    pub compressors: Vec<Compressor>,
    /// The `client` metadata document of the first `hello`, once received.
    pub client_metadata: Option<Document>,
}

impl ClientState {
    /// A connection that has not shaken hands yet.
    pub fn new(id: i64, peer: SocketAddr) -> Self {
        ClientState {
            id,
            peer,
            compressors: Vec::new(),
            client_metadata: None,
        }
    }
}

/// Byte counters of one compressor, in `serverStatus().network.compression`'s shape.
#[derive(Debug, Default)]
pub struct CompressionCounters {
    /// Uncompressed bytes handed to the compressor.
    pub compressor_in: AtomicU64,
    /// Compressed bytes it produced.
    pub compressor_out: AtomicU64,
    /// Compressed bytes received.
    pub decompressor_in: AtomicU64,
    /// Uncompressed bytes they expanded to.
    pub decompressor_out: AtomicU64,
}

/// Router-wide counters reported by `serverStatus`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Open client connections.
    pub connections_current: AtomicI64,
    /// Client connections accepted since start.
    pub connections_total: AtomicI64,
    /// Connections refused because `max_connections` was reached.
    pub connections_rejected: AtomicI64,
    /// Bytes received from clients.
    pub bytes_in: AtomicU64,
    /// Bytes sent to clients.
    pub bytes_out: AtomicU64,
    /// Requests received.
    pub requests: AtomicU64,
    /// `opcounters.insert`.
    pub op_insert: AtomicI64,
    /// `opcounters.query`.
    pub op_query: AtomicI64,
    /// `opcounters.update`.
    pub op_update: AtomicI64,
    /// `opcounters.delete`.
    pub op_delete: AtomicI64,
    /// `opcounters.getmore`.
    pub op_getmore: AtomicI64,
    /// `opcounters.command`.
    pub op_command: AtomicI64,
    /// Per-compressor byte counts: snappy, zstd, zlib (the order of [`Compressor::SUPPORTED`]).
    pub compression: [CompressionCounters; 3],
}

impl Counters {
    /// The byte counters of `c` (`None` for noop).
    pub fn compression_for(&self, c: Compressor) -> Option<&CompressionCounters> {
        Compressor::SUPPORTED
            .iter()
            .position(|s| *s == c)
            .map(|i| &self.compression[i])
    }
}

/// MongoDB's hybrid logical clock, as far as a router needs it: a `Timestamp` that never goes
/// backwards, gossiped as `$clusterTime` and `operationTime`.
#[derive(Debug, Default)]
pub struct ClusterClock {
    last: AtomicU64,
}

impl ClusterClock {
    /// A new cluster time, later than every earlier one.
    pub fn tick(&self) -> Timestamp {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let wall = now << 32;
        let mut prev = self.last.load(Ordering::Relaxed);
        loop {
            let next = if wall > prev { wall | 1 } else { prev + 1 };
            match self
                .last
                .compare_exchange_weak(prev, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Timestamp {
                        time: (next >> 32) as u32,
                        increment: next as u32,
                    }
                }
                Err(p) => prev = p,
            }
        }
    }

    /// Moves the clock up to `t` if it is behind (a time a request named): later times
    /// handed out come after it.
    pub fn advance_to(&self, t: Timestamp) {
        let v = (u64::from(t.time) << 32) | u64::from(t.increment);
        self.last.fetch_max(v, Ordering::AcqRel);
    }

    /// The latest time handed out, without advancing.
    pub fn now(&self) -> Timestamp {
        let v = self.last.load(Ordering::Relaxed);
        Timestamp {
            time: (v >> 32) as u32,
            increment: v as u32,
        }
    }
}

/// State shared by every connection of one router process.
#[derive(Debug)]
pub struct ServerState {
    /// The configuration the router started with.
    pub config: Config,
    /// `topologyVersion.processId`: new for every process.
    pub process_id: ObjectId,
    /// When the router started.
    pub started: Instant,
    /// The command line, for `getCmdLineOpts`.
    pub argv: Vec<String>,
    /// Counters for `serverStatus`.
    pub counters: Counters,
    /// The cluster clock.
    pub clock: ClusterClock,
    /// Request ids of the replies the router sends.
    next_request_id: AtomicI32,
    /// Connection ids.
    next_connection_id: AtomicI64,
    /// Flips to `true` when the router begins shutting down.
    shutdown: watch::Receiver<bool>,
    /// What flips it (the listener's, shared with its handle): the `shutdown` command's way
    /// to stop the server it runs on.
    stop: Arc<watch::Sender<bool>>,
    /// The sessions requests named (`$listLocalSessions`).
    pub sessions: sessions::LocalSessions,
}

impl ServerState {
    /// State for a router with this configuration; `stop` is the listener's shutdown signal,
    /// which also tells long waits (awaitable `hello`) to end early.
    pub fn new(config: Config, argv: Vec<String>, stop: Arc<watch::Sender<bool>>) -> Self {
        let shutdown = stop.subscribe();
        ServerState {
            config,
            process_id: ObjectId::new(),
            started: Instant::now(),
            argv,
            counters: Counters::default(),
            clock: ClusterClock::default(),
            next_request_id: AtomicI32::new(1),
            next_connection_id: AtomicI64::new(1),
            shutdown,
            stop,
            sessions: sessions::LocalSessions::default(),
        }
    }

    /// Begins shutting the server down, as a signal does: the listener stops accepting,
    /// requests in flight are answered within the configured grace period, and every
    /// connection closes.
    pub fn begin_shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// A fresh request id for an outgoing message.
    pub fn next_request_id(&self) -> i32 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed) & i32::MAX
    }

    /// A fresh connection id.
    pub fn next_connection_id(&self) -> i64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A receiver that sees the shutdown signal.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// Whether shutdown has begun.
    pub fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Fields any command may carry that no handler needs to interpret.
pub const GENERIC_ARGUMENTS: &[&str] = &[
    "$db",
    "lsid",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "$clusterTime",
    "$readPreference",
    "readConcern",
    "writeConcern",
    "maxTimeMS",
    "comment",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
    "$audit",
    "$client",
    "$configServerState",
    "$queryOptions",
    "mayBypassWriteBlocking",
    "backpressure",
];

/// The `errorLabels` of a shard's reply (`TransientTransactionError` and the like), which
/// reach the client with the shard's error.
pub fn reply_labels(reply: &Document) -> Vec<String> {
    reply
        .get_array("errorLabels")
        .map(|a| {
            a.iter()
                .filter_map(bson::Bson::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `maxTimeMS` of a request: `None` when absent or 0 (no limit); mongod's errors for a value
/// that is not a non-negative 32-bit integer.
pub fn max_time(body: &bson::RawDocument) -> Result<Option<std::time::Duration>, CommandError> {
    max_time_value(crate::wire::get_field(body, "maxTimeMS"))
}

/// [`max_time`] of the body's `maxTimeMS` lookup, for a caller that found it in a walk that
/// read other fields too.
pub fn max_time_value(
    field: bson::error::Result<Option<bson::RawBsonRef<'_>>>,
) -> Result<Option<std::time::Duration>, CommandError> {
    let ms = match field {
        Ok(None) | Err(_) => return Ok(None),
        Ok(Some(bson::RawBsonRef::Int32(v))) => v as f64,
        Ok(Some(bson::RawBsonRef::Int64(v))) => v as f64,
        Ok(Some(bson::RawBsonRef::Double(v))) => {
            if v.fract() != 0.0 {
                return Err(CommandError::new(
                    ErrorCode::BadValue,
                    "maxTimeMS has a non-integral value",
                ));
            }
            v
        }
        Ok(Some(_)) => {
            return Err(CommandError::new(
                ErrorCode::BadValue,
                "maxTimeMS must be a number",
            ))
        }
    };
    if !(0.0..=i32::MAX as f64).contains(&ms) {
        return Err(CommandError::new(
            ErrorCode::BadValue,
            format!("{ms} value for maxTimeMS is out of range [0, {}]", i32::MAX),
        ));
    }
    Ok((ms > 0.0).then(|| std::time::Duration::from_millis(ms as u64)))
}

/// The key of a logical session: its `lsid.id`, which must be a UUID (binary subtype 4, 16
/// bytes) as mongod's session parser requires, so no client can make a server keep a large
/// key per session.
pub fn session_id(lsid: &Document) -> Result<[u8; 16], CommandError> {
    session_key(lsid.get("id"))
}

/// [`session_id`] of an `lsid` read in place (the request's own bytes): the same checks and
/// errors, on the last `id` field as an owned document would keep it, without building one.
pub fn raw_session_id(lsid: &bson::RawDocument) -> Result<[u8; 16], CommandError> {
    let mut id = None;
    for item in lsid.iter() {
        let (k, v) = item.map_err(|e| CommandError::new(ErrorCode::InvalidBSON, e.to_string()))?;
        if k.as_str() == "id" {
            id = Some(v);
        }
    }
    match id {
        Some(bson::RawBsonRef::Binary(b))
            if b.subtype == bson::spec::BinarySubtype::Uuid && b.bytes.len() == 16 =>
        {
            let mut key = [0u8; 16];
            key.copy_from_slice(b.bytes);
            Ok(key)
        }
        Some(v) => {
            let v = Bson::try_from(v)
                .map_err(|e| CommandError::new(ErrorCode::InvalidBSON, e.to_string()))?;
            session_key(Some(&v))
        }
        None => session_key(None),
    }
}

/// The checks of [`session_id`] on the `lsid.id` value.
fn session_key(id: Option<&Bson>) -> Result<[u8; 16], CommandError> {
    match id {
        Some(Bson::Binary(b)) if b.subtype == bson::spec::BinarySubtype::Uuid => {
            b.bytes.as_slice().try_into().map_err(|_| {
                CommandError::new(
                    ErrorCode::BadValue,
                    format!("uuid must be a 16-byte binary field with UUID (4) subtype, got {} bytes", b.bytes.len()),
                )
            })
        }
        Some(Bson::Binary(_)) => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            "BSON field 'OperationSessionInfo.lsid.id' is the wrong binData type, expected type 'uuid'",
        )),
        Some(other) => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field 'OperationSessionInfo.lsid.id' is the wrong type '{}', expected type 'binData'",
                crate::value::field::type_name(other)
            ),
        )),
        None => Err(CommandError::new(
            ErrorCode(40414),
            "BSON field 'OperationSessionInfo.lsid.id' is missing but a required field",
        )),
    }
}

/// Appends `$clusterTime` (unsigned, as a router without keys sends it) and `operationTime`.
/// Says in a snapshot read's reply the time it read at: in `cursor` for `find` and
/// `aggregate`, at the top for `distinct`, where drivers look for it.
pub fn stamp_at_cluster_time(reply: &mut Document, at: Timestamp) {
    match reply.get_mut("cursor") {
        Some(Bson::Document(c)) => {
            c.insert("atClusterTime", at);
        }
        _ => {
            reply.insert("atClusterTime", at);
        }
    }
}

pub fn append_cluster_time(state: &ServerState, reply: &mut Document) {
    let t = state.clock.tick();
    reply.insert("$clusterTime", crate::wire::cluster_time_document(t));
    reply.insert("operationTime", t);
}

/// Checks one statement of an `update` or `delete` command (`command`) as mongod's parser does
/// before the command runs any statement, so a malformed statement fails the whole command: `q`
/// must be a document, an update needs `u`, a delete's `limit` must be 0 or 1. The router and
/// the embedded shard both check with it, so both answer alike.
pub fn check_write_statement(command: &str, stmt: &Document) -> Result<(), CommandError> {
    check_statement_fields(
        command,
        stmt.get("q").map(crate::value::field::type_name),
        stmt.contains_key("u"),
        stmt.get("limit"),
    )
}

/// [`check_write_statement`] on a statement read in place (the router's hot path, which does
/// not build an owned copy of a statement it can target on its bytes): the same errors, each
/// field read where an owned copy would keep it (its last occurrence).
pub fn check_raw_write_statement(
    command: &str,
    stmt: &bson::RawDocument,
) -> Result<(), CommandError> {
    let (mut q, mut has_u, mut limit) = (None, false, None);
    for item in stmt {
        let (k, v) = item.map_err(|e| CommandError::new(ErrorCode::InvalidBSON, e.to_string()))?;
        match k.as_str() {
            "q" => q = Some(v),
            "u" => has_u = true,
            "limit" => limit = Some(v),
            _ => {}
        }
    }
    let q_type = q.map(|v| match v {
        bson::RawBsonRef::Document(_) => "object",
        other => Bson::try_from(other)
            .map(|b| crate::value::field::type_name(&b))
            .unwrap_or("unknown"),
    });
    // Only a number is read as a limit; anything else is reported as missing, as below.
    let limit = limit.and_then(|v| match v {
        bson::RawBsonRef::Int32(i) => Some(Bson::Int32(i)),
        bson::RawBsonRef::Int64(i) => Some(Bson::Int64(i)),
        bson::RawBsonRef::Double(d) => Some(Bson::Double(d)),
        _ => None,
    });
    check_statement_fields(command, q_type, has_u, limit.as_ref())
}

/// The checks of [`check_write_statement`] on what they read: `q`'s type name (`None`: absent),
/// whether `u` is present and `limit`'s value.
fn check_statement_fields(
    command: &str,
    q_type: Option<&str>,
    has_u: bool,
    limit: Option<&Bson>,
) -> Result<(), CommandError> {
    let field = if command == "update" {
        "updates"
    } else {
        "deletes"
    };
    let missing = |name: &str| {
        CommandError::new(
            ErrorCode(40414),
            format!("BSON field '{command}.{field}.{name}' is missing but a required field"),
        )
    };
    match q_type {
        Some("object") => {}
        Some(other) => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!(
                "BSON field '{command}.{field}.q' is the wrong type '{other}', expected type 'object'",
            ),
            ))
        }
        None => return Err(missing("q")),
    }
    if command == "update" {
        if !has_u {
            return Err(missing("u"));
        }
        return Ok(());
    }
    match limit {
        Some(v @ (Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))) => {
            match crate::value::field::number_value(v) {
                Some(0 | 1) => Ok(()),
                other => Err(CommandError::new(
                    ErrorCode::FailedToParse,
                    format!(
                        "The limit field in delete objects must be 0 or 1. Got {}",
                        other.unwrap_or_default()
                    ),
                )),
            }
        }
        _ => Err(missing("limit")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn cluster_clock_is_monotonic() {
        let c = ClusterClock::default();
        let mut prev = c.tick();
        for _ in 0..1000 {
            let t = c.tick();
            assert!((t.time, t.increment) > (prev.time, prev.increment));
            prev = t;
        }
        assert_eq!(c.now(), prev);
    }

    /// For the commands whose check reads it, the walk that finds an OP_MSG's `$db` reads
    /// `bypassDocumentValidation` too, as the authorization check reads it from the body:
    /// MongoDB's truthiness, the first field of that name, before or after `$db`. Other
    /// commands leave it unread.
    #[test]
    fn the_db_walk_reads_bypass_document_validation_as_the_check_does() {
        for body in [
            doc! {"insert": "c", "$db": "test"},
            doc! {"insert": "c", "bypassDocumentValidation": true, "$db": "test"},
            doc! {"insert": "c", "$db": "test", "bypassDocumentValidation": true, "lsid": {"id": 1}},
            doc! {"insert": "c", "bypassDocumentValidation": false, "$db": "test"},
            doc! {"insert": "c", "bypassDocumentValidation": 0, "$db": "test"},
            doc! {"insert": "c", "bypassDocumentValidation": 2.5, "$db": "test"},
            doc! {"insert": "c", "bypassDocumentValidation": "no", "$db": "test"},
            doc! {"insert": "c", "bypassDocumentValidation": null, "$db": "test"},
            doc! {"insert": "c", "bypassDocumentValidation": [], "$db": "test"},
            doc! {"update": "c", "bypassDocumentValidation": 1i64, "$db": "test"},
            doc! {"findAndModify": "c", "bypassDocumentValidation": true, "$db": "test"},
            doc! {"findandmodify": "c", "$db": "test", "bypassDocumentValidation": true},
            doc! {"bulkWrite": 1, "bypassDocumentValidation": true, "$db": "admin"},
            doc! {"aggregate": "c", "pipeline": [], "bypassDocumentValidation": true, "$db": "test"},
            doc! {"find": "c", "bypassDocumentValidation": true, "$db": "test"},
            doc! {"delete": "c", "$db": "test"},
        ] {
            let msg = crate::wire::OpMsg {
                flags: crate::wire::MsgFlags(0),
                body: crate::wire::BsonDoc::from_encoded(body.to_vec().expect("encodes")),
                sequences: Vec::new(),
            };
            let req = CommandRequest::from_op_msg(&msg).expect("a request");
            let read = crate::auth::authorize::READS_BYPASS_DOCUMENT_VALIDATION
                .contains(&req.name.as_str())
                .then(|| crate::auth::authorize::bypasses_document_validation(req.body.raw()));
            assert_eq!(req.bypass_document_validation, read, "{body}");
            assert_eq!(req.db, body.get_str("$db").expect("$db"), "{body}");
        }
    }

    /// The statement check reads a statement's bytes as it reads its owned copy: the same
    /// verdict and the same error, a field named twice read at its last occurrence.
    #[test]
    fn statement_checks_agree_in_place_and_owned() {
        let verdict = |r: Result<(), CommandError>| r.map_err(|e| (e.code, e.message));
        let statements = [
            doc! {"q": {"_id": 1}, "u": {"$set": {"a": 1}}},
            doc! {"q": {"_id": 1}},
            doc! {"u": {"$set": {"a": 1}}},
            doc! {"q": 5, "u": {}},
            doc! {"q": "x", "limit": 1},
            doc! {"q": [1], "limit": 1},
            doc! {"q": {}, "limit": 1},
            doc! {"q": {}, "limit": 0_i64},
            doc! {"q": {}, "limit": 1.0},
            doc! {"q": {}, "limit": 2},
            doc! {"q": {}, "limit": 0.5},
            doc! {"q": {}, "limit": f64::NAN},
            doc! {"q": {}, "limit": "1"},
            doc! {"q": {}},
        ];
        for stmt in statements {
            let raw = bson::RawDocumentBuf::try_from(&stmt).unwrap();
            for command in ["update", "delete"] {
                assert_eq!(
                    verdict(check_raw_write_statement(command, &raw)),
                    verdict(check_write_statement(command, &stmt)),
                    "{command} {stmt}"
                );
            }
        }
        // `q` named twice: an owned copy keeps the last.
        let mut raw = bson::RawDocumentBuf::new();
        raw.append(bson::raw::cstr!("q"), bson::RawDocumentBuf::new());
        raw.append(bson::raw::cstr!("limit"), 1);
        raw.append(bson::raw::cstr!("q"), 3);
        let owned = Document::try_from(raw.as_ref()).unwrap();
        assert_eq!(
            verdict(check_raw_write_statement("delete", &raw)),
            verdict(check_write_statement("delete", &owned)),
        );
        assert!(check_raw_write_statement("delete", &raw).is_err());
    }

    #[test]
    fn error_reply_shape() {
        let e = CommandError::new(ErrorCode::CommandNotFound, "no such command: 'x'");
        let d = e.to_reply();
        let keys: Vec<&str> = d.keys().map(|k| k.as_str()).collect();
        assert_eq!(keys, ["ok", "errmsg", "code", "codeName"]);
        assert_eq!(d.get_f64("ok").unwrap(), 0.0);
        assert_eq!(d.get_i32("code").unwrap(), 59);
        assert_eq!(d.get_str("codeName").unwrap(), "CommandNotFound");
    }
}
