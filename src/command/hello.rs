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

use bson::{doc, oid::ObjectId, Bson, Document, Timestamp};

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

/// Handles `hello`, `isMaster` and `ismaster` for `role`: the handshake's bookkeeping (client
/// metadata, compression), the awaitable form's wait, then the reply.
pub async fn hello(
    state: &Arc<ServerState>,
    client: &mut ClientState,
    req: &CommandRequest,
    role: Role<'_>,
) -> Result<Document, CommandError> {
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

    let primary_field = if req.name == "hello" {
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
                doc! {"opTime": {"ts": member.last_write, "t": 1i64}, "lastWriteDate": bson::DateTime::now()},
            );
        }
    }
    if body.get("helloOk").is_some_and(truthy) {
        reply.insert("helloOk", true);
    }
    reply.insert("maxBsonObjectSize", MAX_BSON_OBJECT_SIZE as i32);
    reply.insert("maxMessageSizeBytes", MAX_MESSAGE_SIZE as i32);
    reply.insert("maxWriteBatchSize", MAX_WRITE_BATCH_SIZE);
    reply.insert("localTime", bson::DateTime::now());
    reply.insert(
        "logicalSessionTimeoutMinutes",
        LOGICAL_SESSION_TIMEOUT_MINUTES,
    );
    match i32::try_from(client.id) {
        Ok(id) => reply.insert("connectionId", id),
        Err(_) => reply.insert("connectionId", client.id),
    };
    // mongos and mongod list the two wire versions in opposite orders.
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
    if body.contains_key("compression") && !client.compressors.is_empty() {
        let names: Vec<Bson> = client
            .compressors
            .iter()
            .map(|c| Bson::String(c.name().to_string()))
            .collect();
        reply.insert("compression", names);
    }
    Ok(reply)
}
