//! What an aggregation the router runs a part of (on a sharded collection, or on an unsharded
//! one whose pipeline reads a sharded collection) needs beyond its own collection: the
//! collections its `$lookup`, `$graphLookup` and `$unionWith` stages read (at any depth: inside `$facet` and
//! sub-pipelines), fetched through the router before the router's part of the pipeline runs
//! (a sharded one from every shard owning chunks, an unsharded one from its database's primary
//! shard), and the results of a pipeline that ends in `$out`/`$merge`, written by the target's
//! primary shard.

use std::collections::HashMap;

use bson::{doc, Bson, Document};

use super::shard_io::{batch_of, drain, open_streams, read_at, read_on, ReadFailure, ShardStream};
use crate::cluster::Cluster;
use crate::command::CommandError;
use crate::engine::aggregate::Namespaces;
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;

pub use crate::engine::aggregate::foreign_collections;

/// Collections fetched beforehand, served to the engine.
#[derive(Debug, Default)]
pub struct Prefetched(pub HashMap<(String, String), Vec<Document>>);

impl Namespaces for Prefetched {
    fn documents(&self, db: &str, coll: &str) -> Result<Vec<Document>, EngineError> {
        Ok(self
            .0
            .get(&(db.to_string(), coll.to_string()))
            .cloned()
            .unwrap_or_default())
    }
}

/// Where a database's unsharded collections live: the router answers from its metadata.
pub trait Primaries: Sync {
    /// The primary shard of `db`; with `create`, a database not known yet is created (and
    /// given its primary) as a write to it would.
    fn primary(&self, db: &str, create: bool) -> Result<String, CommandError>;
}

/// Every document of `db.coll`, read through the router: at most `limit` bytes.
pub async fn fetch(
    cluster: &Cluster,
    primaries: &dyn Primaries,
    db: &str,
    coll: &str,
    limit: usize,
) -> Result<Vec<Document>, CommandError> {
    let ns = format!("{db}.{coll}");
    let cmd = doc! {"aggregate": coll, "pipeline": [], "cursor": {"batchSize": 10_000}};
    let streams = match cluster.routing.lookup(&ns).await? {
        Some(snap) => {
            let encoded = bson::RawDocumentBuf::try_from(&cmd).map_err(|e| {
                CommandError::new(
                    ErrorCode::InternalError,
                    format!("cannot encode command: {e}"),
                )
            })?;
            open_streams(
                cluster,
                &snap,
                snap.chunks.shards().into_iter().collect(),
                db,
                coll,
                &ns,
                &encoded,
                None,
                false,
            )
            .await?
            .0
        }
        None => {
            let shard = primaries.primary(db, false)?;
            let mut c = cmd.clone();
            c.insert("$db", db);
            let (reply, member) = read_at(cluster, &shard, None, &ns, &c)
                .await
                .map_err(ReadFailure::into_error)?;
            let (buffer, cursor_id) = batch_of(&reply, "firstBatch");
            vec![ShardStream {
                buffer,
                cursor_id,
                shard,
                member,
            }]
        }
    };
    Ok(drain(cluster, db, coll, streams, limit)
        .await?
        .into_iter()
        .flatten()
        .collect())
}

/// Writes `results` through the output stage `stage` (the original `$out`/`$merge` stage) on
/// the target database's primary shard, as `{aggregate: 1, pipeline: [{$documents}, stage]}`.
/// A sharded target is refused as mongos refuses `$out` to one (28769); `$merge` into a
/// sharded collection is not supported yet.
pub async fn write_output(
    cluster: &Cluster,
    primaries: &dyn Primaries,
    target_db: &str,
    target_coll: &str,
    is_merge: bool,
    stage: &Bson,
    results: Vec<Document>,
) -> Result<(), CommandError> {
    let ns = format!("{target_db}.{target_coll}");
    if cluster.routing.lookup(&ns).await?.is_some() {
        return Err(if is_merge {
            CommandError::new(
                ErrorCode::CommandNotSupported,
                format!("$merge into the sharded collection {ns} is not supported by this version of Sluice yet"),
            )
        } else {
            CommandError::new(ErrorCode(28769), format!("{ns} cannot be sharded"))
        });
    }
    let shard = primaries.primary(target_db, true)?;
    let docs: Vec<Bson> = results.into_iter().map(Bson::Document).collect();
    let cmd = doc! {
        "aggregate": 1,
        "pipeline": [{"$documents": docs}, stage.clone()],
        "cursor": {},
        "$db": target_db,
    };
    read_on(cluster, &shard, &ns, &cmd)
        .await
        .map_err(ReadFailure::into_error)?;
    Ok(())
}
