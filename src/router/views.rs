//! Reads of a view whose source is a sharded collection, or whose pipeline reads one
//! (`$lookup`, `$graphLookup`, `$unionWith`). The view lives on its database's
//! primary shard, which cannot answer from its own documents: it answers 169
//! (CommandOnShardedViewNotSupportedOnMongod) with the resolved view, the source namespace and
//! the whole pipeline. As mongos does then, the router runs the read as an aggregation on the
//! source through its sharded read path (for an unsharded source, the stages before the first
//! that reads a sharded collection on the primary shard and the rest at the router,
//! [`crate::read::aggregate_unsharded`]) — `find` (filter, sort, skip, limit, projection),
//! `count` and `distinct` converted to their pipelines — and answers in the shape of the
//! command the client sent, the cursor filed under the view's namespace.

use bson::{doc, Bson, Document};

use super::state::ShardedCluster;
use crate::command::{CommandError, CommandRequest};
use crate::value::error_codes::ErrorCode;
use crate::value::field::number_field;
use crate::wire::Reply;

/// The resolved view of a primary shard's 169 reply to a read.
pub(super) fn resolved_view<'a>(req: &CommandRequest, reply: &'a Document) -> Option<&'a Document> {
    if !matches!(
        req.name.as_str(),
        "find" | "count" | "distinct" | "aggregate"
    ) {
        return None;
    }
    if number_field(reply, "code")
        != Some(i64::from(
            ErrorCode::CommandOnShardedViewNotSupportedOnMongod.0,
        ))
    {
        return None;
    }
    reply.get_document("resolvedView").ok()
}

/// The aggregation pipeline stages after the view's that do what `req` asks.
fn read_stages(name: &str, body: &Document) -> Result<Vec<Bson>, CommandError> {
    let doc_arg = |field: &str| -> Result<Option<Document>, CommandError> {
        match body.get(field) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Document(d)) if d.is_empty() => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d.clone())),
            Some(_) => Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!("BSON field '{name}.{field}' is the wrong type, expected type 'object'"),
            )),
        }
    };
    let mut stages = Vec::new();
    let filter_field = if name == "find" { "filter" } else { "query" };
    if name != "aggregate" {
        if let Some(q) = doc_arg(filter_field)? {
            stages.push(Bson::Document(doc! {"$match": q}));
        }
    }
    match name {
        "aggregate" => {
            let user = body.get_array("pipeline").map_err(|_| {
                CommandError::new(
                    ErrorCode::TypeMismatch,
                    "'pipeline' option must be specified as an array",
                )
            })?;
            stages.extend(user.iter().cloned());
        }
        "find" => {
            if let Some(s) = doc_arg("sort")? {
                stages.push(Bson::Document(doc! {"$sort": s}));
            }
            if let Some(n) = number_field(body, "skip").filter(|n| *n > 0) {
                stages.push(Bson::Document(doc! {"$skip": n}));
            }
            if let Some(n) = number_field(body, "limit").filter(|n| *n != 0) {
                stages.push(Bson::Document(doc! {"$limit": n.abs()}));
            }
            if let Some(p) = doc_arg("projection")? {
                stages.push(Bson::Document(doc! {"$project": p}));
            }
        }
        "count" => {
            if let Some(n) = number_field(body, "skip").filter(|n| *n > 0) {
                stages.push(Bson::Document(doc! {"$skip": n}));
            }
            if let Some(n) = number_field(body, "limit").filter(|n| *n != 0) {
                stages.push(Bson::Document(doc! {"$limit": n.abs()}));
            }
            stages.push(Bson::Document(doc! {"$count": "count"}));
        }
        _ => {
            let key = body.get_str("key").map_err(|_| {
                CommandError::new(
                    ErrorCode::TypeMismatch,
                    "BSON field 'distinct.key' is missing or is not a string",
                )
            })?;
            let path = format!("${key}");
            stages.push(Bson::Document(
                doc! {"$unwind": {"path": &path, "preserveNullAndEmptyArrays": true}},
            ));
            stages.push(Bson::Document(
                doc! {"$group": {"_id": null, "values": {"$addToSet": &path}}},
            ));
        }
    }
    Ok(stages)
}

/// Runs `req` (a read of a view) as an aggregation on the view's sharded source.
pub(super) async fn read_resolved_view(
    sharded: &ShardedCluster,
    req: &CommandRequest,
    body: &Document,
    view: &Document,
    client_id: i64,
) -> Result<Reply, CommandError> {
    let source = view.get_str("ns").unwrap_or_default();
    let Some((db, coll)) = source.split_once('.') else {
        return Err(CommandError::new(
            ErrorCode::InternalError,
            format!("the primary shard resolved the view to an invalid namespace '{source}'"),
        ));
    };
    let snap = sharded.cluster.routing.lookup(source).await?;
    if let Some(snap) = &snap {
        sharded.know_shards_of(snap).await?;
    }
    let mut pipeline: Vec<Bson> = view.get_array("pipeline").cloned().unwrap_or_default();
    pipeline.extend(read_stages(&req.name, body)?);
    let batch = match req.name.as_str() {
        "find" => number_field(body, "batchSize"),
        "aggregate" => body
            .get_document("cursor")
            .ok()
            .and_then(|c| number_field(c, "batchSize")),
        _ => None,
    };
    let mut cursor = Document::new();
    if let Some(b) = batch {
        cursor.insert("batchSize", b);
    }
    let mut agg = doc! {"aggregate": coll, "pipeline": pipeline, "cursor": cursor, "$db": db};
    // The find's carried options, and `allowDiskUse` for the aggregation.
    for k in crate::read::CARRIED_OPTIONS.iter().chain(&["allowDiskUse"]) {
        if let Some(v) = body.get(*k) {
            agg.insert(*k, v.clone());
        }
    }
    let agg_req = CommandRequest::from_document(db, &agg)?;
    let primaries = super::maintenance::StorePrimaries {
        cluster: &sharded.cluster,
        store: &sharded.metadata,
    };
    let reply = match &snap {
        Some(snap) => {
            let mut normalized = None;
            let options = crate::read::ReadBody::of(&agg_req, &mut normalized)?;
            crate::read::read(
                &sharded.cluster,
                &sharded.cursors,
                &primaries,
                snap,
                &agg_req,
                &options,
                client_id,
            )
            .await
        }
        // An unsharded source: the view's pipeline reads a sharded collection.
        None => {
            crate::read::aggregate_unsharded(
                &sharded.cluster,
                &sharded.cursors,
                &primaries,
                &agg_req,
                &agg,
                client_id,
            )
            .await
        }
    };
    let reply = reply.unwrap_or_else(|| {
        Err(CommandError::new(
            ErrorCode::CommandOnShardedViewNotSupportedOnMongod,
            format!("neither the source {source} of the view nor a collection its pipeline reads is sharded as the router knows it"),
        ))
    })?;
    let mut reply = reply.into_document();
    let view_ns = format!("{}.{}", req.db, body.get_str(&req.name).unwrap_or_default());
    let first = crate::write::lookup::found;
    let out = match req.name.as_str() {
        "count" => {
            let n = first(&reply)
                .and_then(|d| number_field(&d, "count"))
                .unwrap_or(0);
            doc! {"n": n}
        }
        "distinct" => {
            let values = first(&reply)
                .and_then(|d| d.get_array("values").ok().cloned())
                .unwrap_or_default();
            doc! {"values": values}
        }
        _ => {
            if let Ok(c) = reply.get_document_mut("cursor") {
                c.insert("ns", &view_ns);
                if let Some(id) = number_field(c, "id").filter(|id| *id != 0) {
                    sharded.cursors.set_namespace(id, &view_ns);
                }
            }
            reply
        }
    };
    let mut out = out;
    out.insert("ok", 1.0);
    Ok(Reply::Document(out))
}
