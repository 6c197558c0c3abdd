//! `$merge` into a sharded collection, as mongos runs it: the pipeline before `$merge` runs as
//! any aggregation does (on the shards and the router for a sharded source, on the primary
//! shard for an unsharded one), and the router writes each result into the target through its
//! own write path — an update (or insert) per result, matched by the `on` fields (by default
//! the target's shard key and `_id`), so each write is targeted by the target's shard key.

use bson::{doc, Bson, Document};

use super::route::{route, Forwarded};
use super::ShardedCluster;
use crate::command::{CommandError, CommandRequest, WriteKind};
use crate::engine::output::{MergeSpec, OutputStage, WhenMatched, WhenNotMatched};
use crate::value::error_codes::ErrorCode;
use crate::wire::Reply;
use crate::write::plan::Policy;

/// How many results go in one write command.
const WRITE_BATCH: usize = 1000;

fn document_of(reply: Reply) -> Result<Document, CommandError> {
    match reply {
        Reply::Document(d) => Ok(d),
        Reply::Raw(r) => Document::try_from(r.as_ref())
            .map_err(|e| CommandError::new(ErrorCode::InternalError, e.to_string())),
    }
}

/// The first write error of a write reply, as the error the aggregation fails with.
fn write_failure(reply: &Document) -> Option<CommandError> {
    let e = reply
        .get_array("writeErrors")
        .ok()?
        .first()?
        .as_document()?;
    Some(CommandError::new(
        ErrorCode(e.get_i32("code").unwrap_or(ErrorCode::InternalError.0)),
        e.get_str("errmsg").unwrap_or_default().to_string(),
    ))
}

/// Runs `aggregate` with a `$merge` into a sharded collection; `None` for any other
/// aggregation (which the router routes as usual).
pub async fn merge_into_sharded(
    sharded: &ShardedCluster,
    policy: Policy,
    req: &CommandRequest,
    client_id: i64,
) -> Option<Result<Reply, CommandError>> {
    let body = req.options_document();
    let pipeline = body.get_array("pipeline").ok()?.clone();
    let (prefix, Some(OutputStage::Merge(spec))) =
        crate::engine::output::split_output(&pipeline, &req.db).ok()?
    else {
        return None;
    };
    if let Err(e) = OutputStage::Merge(spec.clone()).check_read_concern(&body) {
        return Some(Err(e.into()));
    }
    let target = format!("{}.{}", spec.db, spec.coll);
    let snap = match sharded.cluster.routing.lookup(&target).await {
        Ok(Some(snap)) => snap,
        Ok(None) => return None,
        Err(e) => return Some(Err(e.into())),
    };
    let explicit_on = pipeline
        .last()
        .and_then(|s| s.as_document())
        .and_then(|s| s.get_document("$merge").ok())
        .is_some_and(|m| m.contains_key("on"));
    let mut on = spec.on.clone();
    if !explicit_on {
        // mongos's default `on` for a sharded target: its shard key fields and `_id`.
        on = snap
            .pattern
            .fields()
            .iter()
            .map(|f| f.path.clone())
            .collect();
        if !on.iter().any(|f| f == "_id") {
            on.push("_id".to_string());
        }
    }
    let prefix = prefix.to_vec();
    Some(
        run(sharded, policy, req, &body, prefix, &spec, &on, client_id)
            .await
            .map(Reply::from),
    )
}

#[allow(clippy::too_many_arguments)]
async fn run(
    sharded: &ShardedCluster,
    policy: Policy,
    req: &CommandRequest,
    body: &Document,
    prefix: Vec<Bson>,
    spec: &MergeSpec,
    on: &[String],
    client_id: i64,
) -> Result<Document, CommandError> {
    let coll = req.collection().unwrap_or_default().to_string();
    // The results of the stages before $merge, read to the end.
    let mut agg = doc! {"aggregate": body.get("aggregate").cloned().unwrap_or(Bson::Int32(1)), "pipeline": prefix, "cursor": {}, "$db": &req.db};
    for k in [
        "let",
        "collation",
        "allowDiskUse",
        "hint",
        "maxTimeMS",
        "comment",
    ] {
        if let Some(v) = body.get(k) {
            agg.insert(k, v.clone());
        }
    }
    let sub = CommandRequest::from_document(&req.db, &agg)?;
    let first = document_of(
        Box::pin(route(
            sharded,
            Forwarded::Aggregate,
            policy,
            &sub,
            client_id,
        ))
        .await?,
    )?;
    let mut results: Vec<Document> = Vec::new();
    let mut cursor = first.get_document("cursor").cloned().unwrap_or_default();
    let mut batch_name = "firstBatch";
    loop {
        for d in cursor.get_array(batch_name).into_iter().flatten() {
            if let Some(d) = d.as_document() {
                results.push(d.clone());
            }
        }
        let id = cursor.get_i64("id").unwrap_or(0);
        if id == 0 {
            break;
        }
        let more = doc! {"getMore": id, "collection": &coll, "$db": &req.db};
        let sub = CommandRequest::from_document(&req.db, &more)?;
        let reply = document_of(
            Box::pin(route(sharded, Forwarded::GetMore, policy, &sub, client_id)).await?,
        )?;
        cursor = reply.get_document("cursor").cloned().unwrap_or_default();
        batch_name = "nextBatch";
    }
    // One write per result, targeted by the target's shard key.
    let mut statements: Vec<Document> = Vec::new();
    for d in results {
        let mut q = Document::new();
        for f in on {
            match crate::engine::path::get(&d, f) {
                Some(Bson::Null | Bson::Undefined | Bson::Array(_)) | None => {
                    return Err(CommandError::new(
                        ErrorCode(51132),
                        format!("$merge write error: 'on' field '{f}' cannot be missing, null, undefined or an array"),
                    ))
                }
                Some(v) => {
                    q.insert(f.clone(), v.clone());
                }
            }
        }
        let upsert = spec.when_not_matched == WhenNotMatched::Insert;
        let stmt = match &spec.when_matched {
            WhenMatched::Fail if upsert => d,
            WhenMatched::Fail => {
                return Err(CommandError::new(
                    ErrorCode(51189),
                    "Combination of {whenMatched: 'fail', whenNotMatched: 'discard' or 'fail'} is not supported",
                ))
            }
            WhenMatched::Replace => doc! {"q": q, "u": d, "upsert": upsert},
            WhenMatched::Merge => doc! {"q": q, "u": {"$set": d}, "upsert": upsert},
            WhenMatched::KeepExisting => {
                doc! {"q": q, "u": {"$setOnInsert": d}, "upsert": upsert}
            }
            WhenMatched::Pipeline(p) => {
                let mut vars = spec.let_vars.clone().unwrap_or_else(|| doc! {"new": "$$ROOT"});
                // `let` values are expressions over the result: evaluated here, once.
                let mut bound = Document::new();
                for (k, v) in &vars {
                    let value = crate::engine::aggregate::eval(v, &d)
                        .map_err(CommandError::from)?
                        .unwrap_or(Bson::Null);
                    bound.insert(k.clone(), doc! {"$literal": value});
                }
                vars = bound;
                doc! {"q": q, "u": p.clone(), "upsert": upsert, "let": vars}
            }
        };
        statements.push(stmt);
    }
    let inserting = matches!(spec.when_matched, WhenMatched::Fail);
    let pipeline_mode = matches!(spec.when_matched, WhenMatched::Pipeline(_));
    let chunk = if pipeline_mode { 1 } else { WRITE_BATCH };
    for group in statements.chunks(chunk) {
        let mut cmd = if inserting {
            doc! {"insert": &spec.coll, "documents": group.to_vec(), "ordered": false, "$db": &spec.db}
        } else {
            let mut updates = group.to_vec();
            let mut cmd = doc! {"update": &spec.coll, "ordered": false, "$db": &spec.db};
            if pipeline_mode {
                if let Some(l) = updates[0].remove("let") {
                    cmd.insert("let", l);
                }
            }
            cmd.insert("updates", updates);
            cmd
        };
        if let Some(wc) = body.get("writeConcern") {
            cmd.insert("writeConcern", wc.clone());
        }
        let sub = CommandRequest::from_document(&spec.db, &cmd)?;
        let kind = if inserting {
            WriteKind::Insert
        } else {
            WriteKind::Update
        };
        let reply = document_of(
            Box::pin(route(
                sharded,
                Forwarded::Write(kind),
                policy,
                &sub,
                client_id,
            ))
            .await?,
        )?;
        if let Some(e) = write_failure(&reply) {
            return Err(e);
        }
        if spec.when_not_matched == WhenNotMatched::Fail {
            let n = crate::value::field::number_field(&reply, "n").unwrap_or(0);
            if (n as usize) < group.len() {
                return Err(CommandError::new(
                    ErrorCode(13113),
                    "$merge could not find a matching document in the target collection for at least one document in the source collection",
                ));
            }
        }
    }
    Ok(doc! {
        "cursor": {"firstBatch": [], "id": 0i64, "ns": format!("{}.{coll}", req.db)},
        "ok": 1.0,
    })
}
