//! Collection-maintenance commands on the router, routed as mongos routes them: `create` of an
//! existing sharded collection (NamespaceExists, 48, which ODMs expect and ignore), `collMod`
//! (every shard), `validate` (every shard owning chunks, replies under `raw`), `dataSize`
//! (the shards owning chunks, summed) and `renameCollection` (the primary shard for an
//! unsharded collection; every shard and the sharding metadata for a sharded one).

use std::sync::Arc;

use bson::{doc, Bson, Document};

use super::route::{broadcast_ddl, forward};
use crate::cluster::Cluster;
use crate::command::{CommandError, CommandRequest};
use crate::metadata::StaticStore;
use crate::routing::RoutingSnapshot;
use crate::value::error_codes::ErrorCode;
use crate::value::field::number_field;

fn ok(reply: &Document) -> bool {
    reply.get_f64("ok").ok() == Some(1.0)
}

/// `create` of a collection the router knows as sharded: it exists.
pub fn create_existing(snap: &RoutingSnapshot) -> CommandError {
    CommandError::new(
        ErrorCode::NamespaceExists,
        format!("Collection {} already exists.", snap.ns),
    )
}

/// `validate` of a sharded collection: each owning shard's reply under `raw`, `valid` when
/// every shard's is.
pub async fn validate(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
    snap: &RoutingSnapshot,
) -> Result<Document, CommandError> {
    let mut raw = Document::new();
    let mut valid = true;
    let mut errors: Vec<Bson> = Vec::new();
    for shard in snap.chunks.shards() {
        let reply = forward(cluster, &shard, req, None).await?;
        if !ok(&reply) {
            return Ok(reply);
        }
        valid &= reply.get_bool("valid").unwrap_or(false);
        if let Ok(e) = reply.get_array("errors") {
            errors.extend(e.iter().cloned());
        }
        raw.insert(shard, reply);
    }
    let mut out = doc! {"raw": raw, "valid": valid};
    if !errors.is_empty() {
        out.insert("errors", errors);
    }
    out.insert("ok", 1.0);
    Ok(out)
}

/// `dataSize: "db.coll"`: the sum over the shards that own chunks of a sharded collection, or
/// the primary shard's answer for an unsharded one.
pub async fn data_size(
    cluster: &Arc<Cluster>,
    store: &StaticStore,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let ns = req
        .body
        .raw()
        .get_str(&req.name)
        .map_err(|_| {
            CommandError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{0}.{0}' is the wrong type, expected type 'string'",
                    req.name
                ),
            )
        })?
        .to_string();
    let Some(snap) = cluster.routing.lookup(&ns).await? else {
        let db = ns.split('.').next().unwrap_or_default();
        return forward(cluster, &primary_of(cluster, store, db)?, req, None).await;
    };
    let (mut size, mut n, mut millis) = (0i64, 0i64, 0i64);
    for shard in snap.chunks.shards() {
        let reply = forward(cluster, &shard, req, None).await?;
        if !ok(&reply) {
            return Ok(reply);
        }
        size += number_field(&reply, "size").unwrap_or(0);
        n += number_field(&reply, "numObjects").unwrap_or(0);
        millis += number_field(&reply, "millis").unwrap_or(0);
    }
    Ok(doc! {"size": size, "numObjects": n, "millis": millis, "ok": 1.0})
}

/// The primary shard of `db` (the first shard when the database is not known yet).
fn primary_of(
    cluster: &Arc<Cluster>,
    store: &StaticStore,
    db: &str,
) -> Result<String, CommandError> {
    if let Some(d) = store.database(db) {
        return Ok(d.get_str("primary").unwrap_or_default().to_string());
    }
    cluster
        .shards()
        .first()
        .map(|s| s.id.clone())
        .ok_or_else(|| CommandError::new(ErrorCode::ShardNotFound, "the cluster has no shards"))
}

/// `renameCollection` (on `admin`). An unsharded source is renamed by its database's primary
/// shard. A sharded source is renamed on every shard and then in the sharding metadata; it
/// must stay in its database, and an existing target needs `dropTarget`, as mongos requires.
pub async fn rename_collection(
    sharded: &super::ShardedCluster,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let (cluster, store) = (&sharded.cluster, &*sharded.metadata);
    req.require_admin()?;
    let body = req.options_document();
    let (Some(Bson::String(from)), Some(Bson::String(to))) =
        (body.get("renameCollection"), body.get("to"))
    else {
        return Err(CommandError::new(
            ErrorCode::TypeMismatch,
            "BSON field 'renameCollection.to' is missing or not a string",
        ));
    };
    for (ns, what) in [(from, "source"), (to, "target")] {
        match ns.split_once('.') {
            Some((db, coll)) if !db.is_empty() && !coll.is_empty() => {
                crate::limits::check_namespace(db, coll)
                    .map_err(|m| CommandError::new(ErrorCode::InvalidNamespace, m))?;
            }
            _ => {
                return Err(CommandError::new(
                    ErrorCode::InvalidNamespace,
                    format!("Invalid {what} namespace: {ns}"),
                ))
            }
        }
    }
    let from_db = from.split('.').next().unwrap_or_default();
    let to_db = to.split('.').next().unwrap_or_default();
    let Some(snap) = cluster.routing.lookup(from).await? else {
        if cluster.routing.lookup(to).await?.is_some()
            && !body
                .get("dropTarget")
                .is_some_and(crate::value::field::truthy)
        {
            return Err(CommandError::new(
                ErrorCode::NamespaceExists,
                "target namespace exists",
            ));
        }
        return forward(cluster, &primary_of(cluster, store, from_db)?, req, None).await;
    };
    if from_db != to_db {
        return Err(CommandError::new(
            ErrorCode::CommandFailed,
            "Source and destination collections must be on the same database.",
        ));
    }
    if store.is_mirror() {
        // Through the config server: the primary shard renames it everywhere.
        let drop_target = body
            .get("dropTarget")
            .is_some_and(crate::value::field::truthy);
        return super::cluster_ddl::rename_sharded(sharded, from, to, drop_target).await;
    }
    if let Some(target) = cluster.routing.lookup(to).await? {
        if !body
            .get("dropTarget")
            .is_some_and(crate::value::field::truthy)
        {
            return Err(CommandError::new(
                ErrorCode::NamespaceExists,
                "target namespace exists",
            ));
        }
        store.drop_collection(&target.ns)?;
    }
    let reply = broadcast_ddl(cluster, store, req, &snap).await?;
    if !ok(&reply) {
        return Ok(reply);
    }
    store.rename_collection(from, to)?;
    cluster.routing.reload(from, &[]).await?;
    cluster.routing.reload(to, &[]).await?;
    Ok(doc! {"ok": 1.0})
}

/// An aggregation the primary shard runs whole (on an unsharded collection) may not write a
/// sharded collection with `$out` (28769, as mongos refuses it). (`$merge` into a sharded
/// collection never gets here: the router writes its results, `super::merge_output`.)
pub async fn check_output_target(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
    body: &Document,
) -> Result<(), CommandError> {
    let Ok(pipeline) = body.get_array("pipeline") else {
        return Ok(());
    };
    let Ok((_, Some(stage))) = crate::engine::output::split_output(pipeline, &req.db) else {
        return Ok(());
    };
    let (db, coll) = stage.target();
    let ns = format!("{db}.{coll}");
    if cluster.routing.lookup(&ns).await?.is_none() {
        return Ok(());
    }
    match stage {
        crate::engine::output::OutputStage::Out { .. } => Err(CommandError::new(
            ErrorCode(28769),
            format!("{ns} cannot be sharded"),
        )),
        crate::engine::output::OutputStage::Merge(_) => Ok(()),
    }
}

/// The read path's view of database primaries, from the router's metadata.
pub struct StorePrimaries<'a> {
    /// The shards.
    pub cluster: &'a Arc<Cluster>,
    /// The metadata.
    pub store: &'a StaticStore,
}

impl crate::read::foreign::Primaries for StorePrimaries<'_> {
    fn primary(&self, db: &str, create: bool) -> Result<String, CommandError> {
        if create && self.store.database(db).is_none() {
            return Ok(self
                .store
                .ensure_database(db, None)?
                .get_str("primary")
                .unwrap_or_default()
                .to_string());
        }
        primary_of(self.cluster, self.store, db)
    }
}
