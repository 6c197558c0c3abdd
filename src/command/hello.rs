//! `hello` / `isMaster` / `ismaster`: the handshake as mongos answers it.
//!
//! `msg: "isdbgrid"` is what makes every driver classify the server as a mongos. The first
//! `hello` of a connection may carry `client` metadata (once only: a second one is error 186)
//! and a `compression` list, which is intersected with the compressors Sluice supports in the
//! client's order. An awaitable `hello` (`topologyVersion` + `maxAwaitTimeMS`) whose
//! `topologyVersion` is still current waits `maxAwaitTimeMS` before answering; a router's
//! topology only changes when it shuts down, so shutdown ends the wait early.

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};

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
pub fn is_awaitable(body: &Document) -> bool {
    body.contains_key("topologyVersion") && body.contains_key("maxAwaitTimeMS")
}

/// Handles `hello`, `isMaster` and `ismaster`.
pub async fn hello(
    state: &Arc<ServerState>,
    client: &mut ClientState,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let body = req.body_document();

    if let Some(meta) = body.get("client") {
        if client.client_metadata.is_some() {
            return Err(CommandError::new(
                ErrorCode::ClientMetadataCannotBeMutated,
                "The client metadata document may only be sent in the first hello",
            ));
        }
        match meta {
            Bson::Document(d) => client.client_metadata = Some(d.clone()),
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

    let mut reply = Document::new();
    if req.name == "hello" {
        reply.insert("isWritablePrimary", true);
    } else {
        reply.insert("ismaster", true);
    }
    reply.insert("msg", "isdbgrid");
    reply.insert(
        "topologyVersion",
        doc! {"processId": state.process_id, "counter": 0i64},
    );
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
    reply.insert("maxWireVersion", MAX_WIRE_VERSION);
    reply.insert("minWireVersion", MIN_WIRE_VERSION);
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
