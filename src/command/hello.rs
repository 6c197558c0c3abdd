//! `hello` / `isMaster` / `ismaster`: the handshake, built once for every server Sluice runs.
//!
//! The router answers as mongos (`msg: "isdbgrid"` is what makes every driver classify the
//! server as a mongos); the embedded shard answers as the primary of its replica set (`setName`,
//! `hosts`, `me`, …), as mongod does. Both go through [`hello`] with their [`Role`], so the
//! limits, `connectionId` (Int32, Int64 only when it does not fit, as mongod's `appendNumber`)
//! and wire versions they report cannot drift apart. The first
//! `hello` of a connection may carry `client` metadata (once only: a second one is error 186)
//! and a `compression` list, which is intersected with the compressors Sluice supports in the
//! client's order. An awaitable `hello` (`topologyVersion` + `maxAwaitTimeMS`) whose
//! `topologyVersion` is still current waits `maxAwaitTimeMS` before answering; a router's
//! topology only changes when it shuts down, so shutdown ends the wait early.

use std::sync::Arc;
use std::time::Duration;

use bson::raw::{cstr, RawArrayBuf, RawDocumentBuf};
use bson::{oid::ObjectId, rawdoc, Bson, Document, Timestamp};

use super::{ClientState, CommandError, CommandRequest, ServerState};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};
use crate::wire::{Compressor, MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE};

/// Highest wire version Sluice speaks: MongoDB 8.0's.
pub const MAX_WIRE_VERSION: i32 = 25;
/// Lowest wire version offered to external clients (mongos advertises 0).
pub const MIN_WIRE_VERSION: i32 = 0;
/// `maxWriteBatchSize`, as `hello` reports it: the limit the router and the shard enforce.
pub const MAX_WRITE_BATCH_SIZE: i32 = crate::limits::MAX_WRITE_BATCH_SIZE as i32;
/// `logicalSessionTimeoutMinutes` (the server default).
pub const LOGICAL_SESSION_TIMEOUT_MINUTES: i32 = 30;

/// Whether a request is an awaitable hello (it carries both `topologyVersion` and
/// `maxAwaitTimeMS`).
pub fn is_awaitable(body: &bson::RawDocument) -> bool {
    let has = |key| matches!(body.get(key), Ok(Some(_)));
    has("topologyVersion") && has("maxAwaitTimeMS")
}

/// Which server answers the handshake, and what only that kind of server reports.
#[derive(Debug, Clone, Copy)]
pub enum Role<'a> {
    /// The router, answering as mongos.
    Router,
    /// A replica-set primary (the embedded shard), answering as mongod.
    Primary(&'a ReplicaSetMember),
}

/// What a replica-set member reports about its set in `hello`.
#[derive(Debug, Clone)]
pub struct ReplicaSetMember {
    /// `setName`.
    pub set_name: String,
    /// `me`, `primary` and the only entry of `hosts`.
    pub me: String,
    /// `electionId`.
    pub election_id: ObjectId,
    /// `lastWrite.opTime.ts`.
    pub last_write: Timestamp,
}

/// The fields of a `hello` request that [`hello`] reads.
const HELLO_FIELDS: [&str; 5] = [
    "client",
    "compression",
    "topologyVersion",
    "maxAwaitTimeMS",
    "helloOk",
];

/// [`hello_raw`]'s reply as a document, for a server that adds fields of its own to it (an
/// embedded shard's replica-set fields).
pub async fn hello(
    state: &Arc<ServerState>,
    client: &mut ClientState,
    req: &CommandRequest,
    role: Role<'_>,
) -> Result<Document, CommandError> {
    let raw = hello_raw(state, client, req, role).await?;
    Document::try_from(raw.as_ref())
        .map_err(|e| CommandError::new(ErrorCode::InternalError, e.to_string()))
}

/// Handles `hello`, `isMaster` and `ismaster` for `role`: the handshake's bookkeeping (client
/// metadata, compression), the awaitable form's wait, then the reply, encoded.
pub async fn hello_raw(
    state: &Arc<ServerState>,
    client: &mut ClientState,
    req: &CommandRequest,
    role: Role<'_>,
) -> Result<RawDocumentBuf, CommandError> {
    // Only the fields read here are converted (the client metadata, once per connection,
    // is kept as a document); the rest of the body is never decoded.
    let mut body = req.body_fields(&HELLO_FIELDS);

    if let Some(meta) = body.remove("client") {
        if client.client_metadata.is_some() {
            return Err(CommandError::new(
                ErrorCode::ClientMetadataCannotBeMutated,
                "The client metadata document may only be sent in the first hello",
            ));
        }
        match meta {
            Bson::Document(d) => client.client_metadata = Some(d),
            _ => {
                return Err(CommandError::new(
                    ErrorCode::TypeMismatch,
                    "The client metadata document must be an object",
                ))
            }
        }
    }

    if let Some(list) = body.get("compression") {
        let Bson::Array(names) = list else {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "'compression' is the wrong type (expected array)",
            ));
        };
        let mut negotiated = Vec::new();
        for name in names {
            let Bson::String(name) = name else {
                return Err(CommandError::new(
                    ErrorCode::BadValue,
                    "Invalid argument type in compression list",
                ));
            };
            if let Some(c) = Compressor::from_name(name) {
                // Like mongod's default `net.compression.compressors`, noop is not offered.
                if c != Compressor::Noop && !negotiated.contains(&c) {
                    negotiated.push(c);
                }
            }
        }
        client.compressors = negotiated;
    }

    let has_tv = body.contains_key("topologyVersion");
    let has_wait = body.contains_key("maxAwaitTimeMS");
    if has_tv != has_wait {
        return Err(CommandError::new(
            ErrorCode::AwaitableHelloBothFields,
            "A request with a 'topologyVersion' must include 'maxAwaitTimeMS'",
        ));
    }
    if has_tv {
        let wait = number_field(&body, "maxAwaitTimeMS").ok_or_else(|| {
            CommandError::new(ErrorCode::TypeMismatch, "'maxAwaitTimeMS' must be a number")
        })?;
        if wait < 0 {
            return Err(CommandError::new(
                ErrorCode::BadValue,
                "maxAwaitTimeMS must be a non-negative integer",
            ));
        }
        let Ok(tv) = body.get_document("topologyVersion") else {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                "'topologyVersion' must be an object",
            ));
        };
        let current = tv.get_object_id("processId").ok() == Some(state.process_id)
            && number_field(tv, "counter") == Some(0);
        if current {
            let mut shutdown = state.shutdown_signal();
            if !*shutdown.borrow() {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait as u64)) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
    }

    let hello_ok = body.get("helloOk").is_some_and(truthy);
    Ok(reply(
        state,
        client,
        req,
        role,
        hello_ok,
        body.contains_key("compression"),
    ))
}

/// The handshake's reply, written as encoded BSON (no owned document is built, converted or
/// dropped): the router sends it as it is, an embedded shard reads it as a document.
fn reply(
    state: &ServerState,
    client: &ClientState,
    req: &CommandRequest,
    role: Role<'_>,
    hello_ok: bool,
    asked_compression: bool,
) -> RawDocumentBuf {
    let primary_field = if req.name == "hello" {
        cstr!("isWritablePrimary")
    } else {
        cstr!("ismaster")
    };
    let topology_version = rawdoc! {"processId": state.process_id, "counter": 0i64};
    let mut reply = RawDocumentBuf::new();
    match role {
        Role::Router => {
            reply.append(primary_field, true);
            reply.append(cstr!("msg"), "isdbgrid");
            reply.append(cstr!("topologyVersion"), topology_version);
        }
        Role::Primary(member) => {
            reply.append(cstr!("topologyVersion"), topology_version);
            let mut hosts = RawArrayBuf::new();
            hosts.push(member.me.as_str());
            reply.append(cstr!("hosts"), hosts);
            reply.append(cstr!("setName"), member.set_name.as_str());
            reply.append(cstr!("setVersion"), 1);
            reply.append(primary_field, true);
            reply.append(cstr!("secondary"), false);
            reply.append(cstr!("primary"), member.me.as_str());
            reply.append(cstr!("me"), member.me.as_str());
            reply.append(cstr!("electionId"), member.election_id);
            reply.append(
                cstr!("lastWrite"),
                rawdoc! {"opTime": {"ts": member.last_write, "t": 1i64}, "lastWriteDate": bson::DateTime::now()},
            );
        }
    }
    if hello_ok {
        reply.append(cstr!("helloOk"), true);
    }
    reply.append(cstr!("maxBsonObjectSize"), MAX_BSON_OBJECT_SIZE as i32);
    reply.append(cstr!("maxMessageSizeBytes"), MAX_MESSAGE_SIZE as i32);
    reply.append(cstr!("maxWriteBatchSize"), MAX_WRITE_BATCH_SIZE);
    reply.append(cstr!("localTime"), bson::DateTime::now());
    reply.append(
        cstr!("logicalSessionTimeoutMinutes"),
        LOGICAL_SESSION_TIMEOUT_MINUTES,
    );
    match i32::try_from(client.id) {
        Ok(id) => reply.append(cstr!("connectionId"), id),
        Err(_) => reply.append(cstr!("connectionId"), client.id),
    };
    // mongos and mongod list the two wire versions in opposite orders.
    match role {
        Role::Router => {
            reply.append(cstr!("maxWireVersion"), MAX_WIRE_VERSION);
            reply.append(cstr!("minWireVersion"), MIN_WIRE_VERSION);
        }
        Role::Primary(_) => {
            reply.append(cstr!("minWireVersion"), MIN_WIRE_VERSION);
            reply.append(cstr!("maxWireVersion"), MAX_WIRE_VERSION);
            reply.append(cstr!("readOnly"), false);
        }
    }
    if asked_compression && !client.compressors.is_empty() {
        let names: RawArrayBuf = client.compressors.iter().map(|c| c.name()).collect();
        reply.append(cstr!("compression"), names);
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// The reply as it was built before it was written encoded: an owned document, field by
    /// field (the reference the encoded reply must equal byte for byte).
    fn reference(
        state: &ServerState,
        client: &ClientState,
        name: &str,
        role: Role<'_>,
        hello_ok: bool,
        compression: bool,
        now: bson::DateTime,
    ) -> Document {
        let primary_field = if name == "hello" {
            "isWritablePrimary"
        } else {
            "ismaster"
        };
        let topology_version = doc! {"processId": state.process_id, "counter": 0i64};
        let mut reply = Document::new();
        match role {
            Role::Router => {
                reply.insert(primary_field, true);
                reply.insert("msg", "isdbgrid");
                reply.insert("topologyVersion", topology_version);
            }
            Role::Primary(member) => {
                reply.insert("topologyVersion", topology_version);
                reply.insert("hosts", vec![Bson::String(member.me.clone())]);
                reply.insert("setName", &member.set_name);
                reply.insert("setVersion", 1);
                reply.insert(primary_field, true);
                reply.insert("secondary", false);
                reply.insert("primary", &member.me);
                reply.insert("me", &member.me);
                reply.insert("electionId", member.election_id);
                reply.insert(
                    "lastWrite",
                    doc! {"opTime": {"ts": member.last_write, "t": 1i64}, "lastWriteDate": now},
                );
            }
        }
        if hello_ok {
            reply.insert("helloOk", true);
        }
        reply.insert("maxBsonObjectSize", MAX_BSON_OBJECT_SIZE as i32);
        reply.insert("maxMessageSizeBytes", MAX_MESSAGE_SIZE as i32);
        reply.insert("maxWriteBatchSize", MAX_WRITE_BATCH_SIZE);
        reply.insert("localTime", now);
        reply.insert(
            "logicalSessionTimeoutMinutes",
            LOGICAL_SESSION_TIMEOUT_MINUTES,
        );
        match i32::try_from(client.id) {
            Ok(id) => reply.insert("connectionId", id),
            Err(_) => reply.insert("connectionId", client.id),
        };
        match role {
            Role::Router => {
                reply.insert("maxWireVersion", MAX_WIRE_VERSION);
                reply.insert("minWireVersion", MIN_WIRE_VERSION);
            }
            Role::Primary(_) => {
                reply.insert("minWireVersion", MIN_WIRE_VERSION);
                reply.insert("maxWireVersion", MAX_WIRE_VERSION);
                reply.insert("readOnly", false);
            }
        }
        if compression && !client.compressors.is_empty() {
            let names: Vec<Bson> = client
                .compressors
                .iter()
                .map(|c| Bson::String(c.name().to_string()))
                .collect();
            reply.insert("compression", names);
        }
        reply
    }

    /// Sets every date of a reply to `now` (the reply reads the clock itself).
    fn at(mut d: Document, now: bson::DateTime) -> Document {
        if d.contains_key("localTime") {
            d.insert("localTime", now);
        }
        if let Ok(w) = d.get_document_mut("lastWrite") {
            w.insert("lastWriteDate", now);
        }
        d
    }

    /// The encoded reply is the bytes the owned document encoded to (its dates aside, which
    /// read the clock), field for field in the same order, for the router and for a
    /// replica-set primary, `hello` and `isMaster`, with and without `helloOk`, negotiated
    /// compressors and a connection id past 32 bits.
    #[test]
    fn the_encoded_reply_is_the_document_reply_encoded() {
        let state = ServerState::new(
            crate::config::Config::default(),
            Vec::new(),
            Arc::new(tokio::sync::watch::channel(false).0),
        );
        let member = ReplicaSetMember {
            set_name: "rs0".into(),
            me: "localhost:27018".into(),
            election_id: ObjectId::new(),
            last_write: Timestamp {
                time: 1_764_000_000,
                increment: 9,
            },
        };
        let now = bson::DateTime::from_millis(1_764_000_000_123);
        for id in [3i64, 1 << 40] {
            for compressors in [vec![], vec![Compressor::Zstd, Compressor::Snappy]] {
                let mut client = ClientState::new(id, "127.0.0.1:1".parse().expect("address"));
                client.compressors = compressors;
                for name in ["hello", "isMaster"] {
                    let req =
                        CommandRequest::from_document("admin", &doc! {name: 1}).expect("request");
                    for role in [Role::Router, Role::Primary(&member)] {
                        for (hello_ok, compression) in [(false, false), (true, true)] {
                            let raw = reply(&state, &client, &req, role, hello_ok, compression);
                            let decoded = Document::try_from(raw.as_ref()).expect("decodes");
                            let expected =
                                reference(&state, &client, name, role, hello_ok, compression, now);
                            assert_eq!(
                                at(decoded, now).to_vec().expect("encodes"),
                                expected.to_vec().expect("encodes"),
                                "{name} {role:?} {id}"
                            );
                        }
                    }
                }
            }
        }
    }
}
