//! Commands the router forwards to shards.
//!
//! Writes on sharded collections go through the write path ([`crate::write`]);
//! `findAndModify` on a sharded collection goes to the one shard its query's shard key
//! targets. Every command on an unsharded collection (and any database-level command) goes to
//! the database's primary shard unchanged: the client's body and document sequences are
//! forwarded as they are (a `w: 0` write concern raised to `w: 1`), and the shard's reply comes
//! back with the shard-only fields removed. A database gets its `config.databases` entry (and
//! primary shard) on its first write, as with mongos.

use std::sync::Arc;

use bson::{Bson, Document, RawBsonRef};

use crate::backend::shard::Resend;
use crate::backend::topology::retry;
use crate::backend::topology::Need;

use crate::cluster::Cluster;
use crate::command::{CommandError, CommandRequest};
use crate::metadata::StaticStore;
use crate::routing::FilterKeys;
use crate::value::error_codes::ErrorCode;
use crate::wire::{OpMsgBuilder, Reply};
use crate::write::plan::Policy;
use crate::write::target::WriteKind;

use super::ShardedCluster;

/// Commands that create data: they give a new database its primary shard.
const CREATING: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "create",
    "createIndexes",
];

/// Fields a shard adds to replies that mongos does not pass on.
const SHARD_ONLY_FIELDS: &[&str] = &[
    "$clusterTime",
    "operationTime",
    "opTime",
    "electionId",
    "$configServerState",
    "$gleStats",
    "lastCommittedOpTime",
    "$topologyTime",
];

/// How a forwarded command is routed: the router's dispatch table ([`super::Handler`]) names
/// it once per request, and [`route`] goes by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    /// `insert`, `update`, `delete`: the write path on a sharded collection.
    Write(WriteKind),
    /// `findAndModify`: the one shard its query's shard key targets.
    FindAndModify,
    /// `find`, `count`, `distinct`: the read path.
    Read,
    /// `aggregate`: the read path, or the primary shard once its output target is checked.
    Aggregate,
    /// `getMore` of a router cursor.
    GetMore,
    /// `killCursors` of router cursors.
    KillCursors,
    /// `createIndexes`, `dropIndexes`, `deleteIndexes`, `drop`, `collMod`: every shard.
    CollectionDdl,
    /// `create` (refused on a sharded collection, which exists).
    Create,
    /// `validate`.
    Validate,
    /// `listIndexes`.
    ListIndexes,
    /// `collStats`.
    CollStats,
    /// `dataSize`.
    DataSize,
    /// `renameCollection`.
    RenameCollection,
    /// `explain`.
    Explain,
    /// `listDatabases`: every shard's, merged.
    ListDatabases,
    /// `dropDatabase`.
    DropDatabase,
    /// `dbStats`: every shard's, summed.
    DbStats,
    /// `commitTransaction`, `abortTransaction`.
    EndTransaction,
    /// Anything else mongos forwards: to the database's primary shard as it is.
    Other,
}

/// Routes a command that is not answered by the router itself, classified by the dispatch
/// table as `how`; returns the full reply (with `ok`). With a config server, a command a shard
/// refused as stale (StaleConfig, StaleEpoch, StaleDbVersion: refused before it ran) is
/// routed again on the refreshed routing, up to 10 times as mongos does; the client sees the
/// stale error only when the retries are used up. (Writes on sharded collections retarget
/// their stale statements in the write path and never end stale here.)
pub async fn route(
    sharded: &ShardedCluster,
    how: Forwarded,
    policy: Policy,
    req: &CommandRequest,
    client_id: i64,
) -> Result<Reply, CommandError> {
    let mut attempt = 1;
    loop {
        let result = route_once(sharded, how, policy, req, client_id).await;
        // A transaction's statement is never resent by the router: the shard's stale error
        // reaches the client as a TransientTransactionError and the client retries the whole
        // transaction.
        if !sharded.has_config_server()
            || attempt >= super::configdb::MAX_ATTEMPTS
            || in_transaction_raw(req)
        {
            return result;
        }
        let Some(stale) = super::configdb::stale_error(&result) else {
            return result;
        };
        let ns = req.namespace.as_deref().unwrap_or(&req.db);
        metrics::counter!("sluice_stale_retries_total").increment(1);
        sharded.on_stale(ns, &stale);
        attempt += 1;
    }
}

async fn route_once(
    sharded: &ShardedCluster,
    how: Forwarded,
    policy: Policy,
    req: &CommandRequest,
    client_id: i64,
) -> Result<Reply, CommandError> {
    let (cluster, store) = (&sharded.cluster, &*sharded.metadata);
    let db_versions = sharded
        .sync_database(&req.db, CREATING.contains(&req.name.as_str()))
        .await?;
    if let Forwarded::Write(_) = how {
        if let Some(n) = req.statement_count() {
            let max = crate::limits::MAX_WRITE_BATCH_SIZE;
            if n == 0 || n > max {
                return Err(CommandError::new(
                    ErrorCode::InvalidLength,
                    format!("Write batch sizes must be between 1 and {max}. Got {n} operations."),
                ));
            }
        }
    }
    if how == Forwarded::Aggregate {
        if let Some(r) =
            super::merge_output::merge_into_sharded(sharded, policy, req, client_id).await
        {
            return r;
        }
    }
    match how {
        Forwarded::DataSize => {
            return super::maintenance::data_size(cluster, store, req)
                .await
                .map(Reply::from)
        }
        Forwarded::RenameCollection => {
            return super::maintenance::rename_collection(sharded, req)
                .await
                .map(Reply::from)
        }
        _ => {}
    }
    if req.name == "compact" {
        // mongos registers compact only to refuse it (cluster_compact_cmd.cpp).
        return Err(CommandError::new(
            ErrorCode::CommandNotSupported,
            "compact not allowed through mongos",
        ));
    }
    // A write is read in place ([`crate::write::WriteOptions::from_raw`]), and so is a read
    // (`find`, `count`, `distinct`, `aggregate`: [`crate::read::ReadBody`]): no owned options
    // document is built for either, and `body` stays empty on those paths until a branch below
    // that reads options needs it (and builds it itself).
    let write_options = match how {
        Forwarded::Write(kind) => {
            crate::write::WriteOptions::from_raw(req.body.raw(), kind.statements_field())
        }
        _ => None,
    };
    if let Some(c) = req.collection() {
        // Checked before anything is looked up, cached or recorded.
        crate::limits::check_namespace(&req.db, c)
            .map_err(|m| CommandError::new(ErrorCode::InvalidNamespace, m))?;
    }
    let snapshot = match &req.namespace {
        Some(ns) => cluster.routing.lookup(ns).await?,
        None => None,
    };
    if let Some(snap) = &snapshot {
        sharded.know_shards_of(snap).await?;
    }
    // Reads on a sharded collection; every other read goes to the primary shard, as it came.
    let reads_in_place =
        snapshot.is_some() && matches!(how, Forwarded::Read | Forwarded::Aggregate);
    let body = match write_options {
        Some(_) => Document::new(),
        None if reads_in_place => Document::new(),
        None => req.options_document(),
    };
    let mut normalized = None;
    let read_body = match reads_in_place {
        true => Some(crate::read::ReadBody::of(req, &mut normalized)?),
        false => None,
    };
    let transactional = match (&write_options, &read_body) {
        (Some(o), _) => o.in_transaction,
        (None, Some(b)) => b.in_transaction(),
        (None, None) => in_transaction(&body),
    };
    if transactional || how == Forwarded::EndTransaction {
        let body = match write_options.is_some() || reads_in_place {
            true => req.options_document(),
            false => body,
        };
        return transaction(sharded, how, req, &body, snapshot.as_deref(), client_id)
            .await
            .map(Reply::from);
    }
    if let Some(snap) = snapshot {
        let ok = |mut r: Reply| {
            r.append(bson::raw::cstr!("ok"), Bson::Double(1.0));
            r
        };
        match how {
            Forwarded::Write(kind) => {
                let options = match write_options {
                    Some(o) => o,
                    None => crate::write::WriteOptions::from_document(&body)?,
                };
                let primary = || -> crate::frontend::BoxFuture<'_, _> {
                    Box::pin(primary_for_write(sharded, &req.db))
                };
                let mut reply = crate::write::execute(
                    cluster,
                    sharded.coalescer(),
                    &sharded.writes,
                    policy,
                    req,
                    options,
                    kind,
                    snap,
                    &primary,
                )
                .await?;
                reply.append(bson::raw::cstr!("ok"), Bson::Double(1.0));
                return Ok(reply);
            }
            Forwarded::FindAndModify => {
                return find_and_modify(cluster, req, &body, &snap)
                    .await
                    .map(Reply::from);
            }
            Forwarded::GetMore => {
                return sharded
                    .cursors
                    .get_more(cluster, req, &body, client_id)
                    .await
                    .map(ok)
            }
            Forwarded::KillCursors => {
                return Ok(ok(sharded
                    .cursors
                    .kill(cluster, req, client_id)
                    .await
                    .into()))
            }
            Forwarded::CollectionDdl if req.name == "drop" && store.is_mirror() => {
                return super::cluster_ddl::drop_collection(sharded, &snap.ns)
                    .await
                    .map(Reply::from);
            }
            Forwarded::CollectionDdl => {
                return broadcast_ddl(cluster, store, req, &snap)
                    .await
                    .map(Reply::from);
            }
            Forwarded::Create => return Err(super::maintenance::create_existing(&snap)),
            Forwarded::Validate => {
                return super::maintenance::validate(cluster, req, &snap)
                    .await
                    .map(Reply::from)
            }
            Forwarded::ListIndexes => {
                let first = snap.chunks.shards().into_iter().next().unwrap_or_default();
                return forward(cluster, &first, req, None).await.map(Reply::from);
            }
            Forwarded::CollStats => return coll_stats(cluster, req, &snap).await.map(Reply::from),
            _ if req.name == "convertToCapped" => {
                return Err(CommandError::new(
                    ErrorCode::IllegalOperation,
                    "You can't convertToCapped a sharded collection",
                ))
            }
            _ => {}
        }
        let mut other_normalized = None;
        let other_body;
        let read_body = match &read_body {
            Some(b) => b,
            None => {
                other_body = crate::read::ReadBody::of(req, &mut other_normalized)?;
                &other_body
            }
        };
        if let Some(result) = crate::read::read(
            cluster,
            &sharded.cursors,
            &super::maintenance::StorePrimaries { cluster, store },
            &snap,
            req,
            read_body,
            client_id,
        )
        .await
        {
            return result.map(ok);
        }
        return Err(CommandError::new(
            ErrorCode::CommandNotSupported,
            format!(
                "'{}' on the sharded collection {} is not supported by this version of Sluice yet",
                req.name, snap.ns
            ),
        ));
    }
    // A cursor the router opened for a read of a view on a sharded collection.
    if matches!(how, Forwarded::GetMore | Forwarded::KillCursors)
        && sharded.cursors.names_own_cursor(&req.name, &body)
    {
        let mut r: Reply = if how == Forwarded::GetMore {
            sharded
                .cursors
                .get_more(cluster, req, &body, client_id)
                .await?
        } else {
            sharded.cursors.kill(cluster, req, client_id).await.into()
        };
        r.append(bson::raw::cstr!("ok"), Bson::Double(1.0));
        return Ok(r);
    }
    match how {
        Forwarded::Explain => {
            if let Some(r) = explain(cluster, req, &body).await {
                return r.map(Reply::from);
            }
        }
        Forwarded::ListDatabases => return list_databases(cluster, req).await.map(Reply::from),
        Forwarded::DropDatabase if store.is_mirror() => {
            return super::cluster_ddl::drop_database(sharded, &req.db)
                .await
                .map(Reply::from)
        }
        Forwarded::DropDatabase => {
            return drop_database(cluster, store, req).await.map(Reply::from)
        }
        Forwarded::DbStats => return db_stats(cluster, req).await.map(Reply::from),
        Forwarded::Aggregate => {
            super::maintenance::check_output_target(cluster, req, &body).await?;
            // A pipeline that reads a sharded collection runs partly at the router.
            if let Some(r) = crate::read::aggregate_unsharded(
                cluster,
                &sharded.cursors,
                &super::maintenance::StorePrimaries { cluster, store },
                req,
                &body,
                client_id,
            )
            .await
            {
                return r.map(|mut r| {
                    r.append(bson::raw::cstr!("ok"), Bson::Double(1.0));
                    r
                });
            }
        }
        _ => {}
    }
    if req.db == "admin" || req.db == "local" {
        return Err(CommandError::new(
            ErrorCode::CommandNotFound,
            format!("no such command: '{}'", req.name),
        ));
    }
    let primary = primary_shard(
        cluster,
        store,
        &req.db,
        CREATING.contains(&req.name.as_str()),
    )?;
    let reply = forward_with(cluster, &primary, req, db_versions).await?;
    if let Some(view) = super::views::resolved_view(req, &reply) {
        return super::views::read_resolved_view(sharded, req, &body, view, client_id).await;
    }
    if how == Forwarded::CollStats
        && reply
            .get("ok")
            .is_some_and(|v| crate::value::field::to_f64(v) == 1.0)
    {
        // mongos puts `sharded: false` and the primary shard before an unsharded
        // collection's statistics.
        let mut d = bson::doc! {"sharded": false, "primary": &primary};
        for (k, v) in reply {
            d.entry(k).or_insert(v);
        }
        return Ok(d.into());
    }
    Ok(reply.into())
}

/// The primary shard of `db` as the router's metadata names it. A database it does not know
/// is given one when `create` (a command that creates data, as mongos creates the database);
/// otherwise the command goes to the first shard, which answers as for a missing database.
fn primary_shard(
    cluster: &Cluster,
    store: &StaticStore,
    db: &str,
    create: bool,
) -> Result<String, CommandError> {
    let named = |d: Document| d.get_str("primary").unwrap_or_default().to_string();
    match store.database(db) {
        Some(d) => Ok(named(d)),
        None if create => Ok(named(store.ensure_database(db, None)?)),
        None => match cluster.shards().first() {
            Some(s) => Ok(s.id.clone()),
            None => Err(CommandError::new(
                ErrorCode::ShardNotFound,
                "the cluster has no shards",
            )),
        },
    }
}

/// Where a write's statements go once a refresh after stale statements finds its collection
/// unsharded (dropped or renamed away since this router cached it sharded): the database's
/// primary shard, with the UNSHARDED `shardVersion` and the `databaseVersion` a config server
/// gives (the database is created first if it went too, as for any first write).
async fn primary_for_write(
    sharded: &ShardedCluster,
    db: &str,
) -> Option<crate::write::PrimaryShard> {
    let versions = match sharded.sync_database(db, true).await {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => {
            tracing::debug!(db, error = %e, "the primary shard of a write could not be found");
            return None;
        }
    };
    match primary_shard(&sharded.cluster, &sharded.metadata, db, true) {
        Ok(shard) => Some(crate::write::PrimaryShard { shard, versions }),
        Err(e) => {
            tracing::debug!(db, error = %e, "the primary shard of a write could not be found");
            None
        }
    }
}

/// `bulkWrite` (MongoDB 8.0): each `nsInfo` namespace resolved to its routing snapshot or its
/// database's primary shard, then run by the write path under the strictest rewrite policy of
/// its namespaces (`off` over `retry-safe` over `always`).
pub async fn bulk_write(
    sharded: &ShardedCluster,
    config: &crate::config::Config,
    req: &CommandRequest,
) -> Result<Reply, CommandError> {
    let (cluster, store) = (&sharded.cluster, &*sharded.metadata);
    let bulk = crate::command::bulk_write::parse(req)?;
    let mut routes = Vec::with_capacity(bulk.namespaces.len());
    let mut policy = Policy::Always;
    for ns in &bulk.namespaces {
        let rank = |p: Policy| match p {
            Policy::Off => 0,
            Policy::RetrySafe => 1,
            Policy::Always => 2,
        };
        let p = config.rewrite_policy(ns);
        if rank(p) < rank(policy) {
            policy = p;
        }
        let db = ns.split_once('.').map_or(ns.as_str(), |(db, _)| db);
        let versions = sharded.sync_database(db, true).await?.unwrap_or_default();
        routes.push(match cluster.routing.lookup(ns).await? {
            Some(snap) => crate::write::bulk::NsRoute::Sharded(snap),
            None => crate::write::bulk::NsRoute::Unsharded(crate::write::PrimaryShard {
                shard: primary_shard(cluster, store, db, true)?,
                versions,
            }),
        });
    }
    if in_transaction_raw(req) {
        return bulk_write_in_transaction(cluster, req, &routes)
            .await
            .map(Reply::from);
    }
    let refresh = |ns: String, errors: Vec<Document>| -> crate::frontend::BoxFuture<'_, _> {
        Box::pin(async move {
            // The shards' answers say what to refresh: the collection (StaleConfig,
            // StaleEpoch) or its database (StaleDbVersion, after movePrimary).
            match cluster.routing.reload(&ns, &errors).await {
                Ok(Some(snap)) => Some(crate::write::bulk::NsRoute::Sharded(snap)),
                // Unsharded, or dropped or renamed away since it was cached sharded: the
                // primary's, with the database's current version.
                Ok(None) => {
                    let db = ns.split_once('.').map_or(ns.as_str(), |(db, _)| db);
                    primary_for_write(sharded, db)
                        .await
                        .map(crate::write::bulk::NsRoute::Unsharded)
                }
                Err(_) => None,
            }
        })
    };
    let mut reply =
        crate::write::bulk::execute(cluster, &sharded.writes, policy, &bulk, routes, &refresh)
            .await?;
    reply.insert("ok", 1.0);
    Ok(reply.into())
}

/// `explain` of a `find`, `aggregate`, `count` or `distinct` on a sharded collection, in
/// mongos's shape: `queryPlanner.winningPlan.shards[]` names each shard the query goes to
/// (which is how one checks where a shard key value lives). `None` for anything else.
async fn explain(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
    body: &Document,
) -> Option<Result<Document, CommandError>> {
    let inner = body.get_document("explain").ok()?;
    let (name, coll) = inner
        .iter()
        .next()
        .map(|(k, v)| (k.clone(), v.as_str().map(|s| s.to_string())))?;
    let coll = coll?;
    let ns = format!("{}.{coll}", req.db);
    let snap = match cluster.routing.lookup(&ns).await {
        Ok(Some(s)) => s,
        Ok(None) => return None,
        Err(e) => return Some(Err(e.into())),
    };
    let filter = match name.as_str() {
        "find" => inner.get_document("filter").cloned().unwrap_or_default(),
        "count" | "distinct" => inner.get_document("query").cloned().unwrap_or_default(),
        "aggregate" => crate::read::leading_match(
            inner
                .get_array("pipeline")
                .map(Vec::as_slice)
                .unwrap_or_default(),
        ),
        _ => return None,
    };
    let shards = crate::read::target_shards(&snap, &filter);
    let id_lookup = filter.len() == 1 && filter.contains_key("_id");
    let shard_plans: Vec<Bson> = shards
        .iter()
        .map(|s| {
            let addr = cluster.shards().iter().find(|x| &x.id == s).map(|x| x.addr.clone()).unwrap_or_default();
            Bson::Document(bson::doc! {
                "shardName": s,
                "connectionString": format!("{s}/{addr}"),
                "serverInfo": {"host": addr.clone(), "version": crate::command::server_info::MONGODB_VERSION},
                "namespace": &ns,
                "parsedQuery": filter.clone(),
                "winningPlan": {"stage": if id_lookup { "IDHACK" } else { "COLLSCAN" }, "filter": filter.clone()},
                "rejectedPlans": [],
            })
        })
        .collect();
    let stage = if shards.len() == 1 {
        "SINGLE_SHARD"
    } else {
        "SHARD_MERGE"
    };
    Some(Ok(bson::doc! {
        "queryPlanner": {
            "mongosPlannerVersion": 1,
            "winningPlan": {"stage": stage, "shards": shard_plans},
        },
        "serverInfo": {"version": crate::command::server_info::MONGODB_VERSION},
        "command": inner.clone(),
        "ok": 1.0,
    }))
}

/// Sends `req` to every shard in turn: `Ok` with each shard's reply when all succeeded, `Err(reply)` with the
/// first failed reply, which is passed to the client as mongos does.
async fn on_every_shard(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
) -> Result<Result<Vec<(String, Document)>, Document>, CommandError> {
    let mut replies = Vec::new();
    for shard in cluster
        .shards()
        .iter()
        .map(|s| s.id.clone())
        .collect::<Vec<_>>()
    {
        let reply = forward(cluster, &shard, req, None).await?;
        if reply.get_f64("ok").ok() != Some(1.0) {
            return Ok(Err(reply));
        }
        replies.push((shard, reply));
    }
    Ok(Ok(replies))
}

/// `listDatabases`: every shard's list, merged by name (sizes summed).
async fn list_databases(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let mut by_name: std::collections::BTreeMap<String, (i64, bool)> =
        std::collections::BTreeMap::new();
    let name_only = req.body.raw().get_bool("nameOnly").unwrap_or(false);
    let replies = match on_every_shard(cluster, req).await? {
        Ok(replies) => replies,
        Err(failed) => return Ok(failed),
    };
    for (_, reply) in &replies {
        for d in reply
            .get_array("databases")
            .into_iter()
            .flatten()
            .filter_map(|d| d.as_document())
        {
            let Ok(name) = d.get_str("name") else {
                continue;
            };
            let e = by_name.entry(name.to_string()).or_insert((0, true));
            e.0 += crate::value::field::number_field(d, "sizeOnDisk").unwrap_or(0);
            e.1 &= d.get_bool("empty").unwrap_or(false);
        }
    }
    let total: i64 = by_name.values().map(|(s, _)| *s).sum();
    let databases: Vec<Bson> = by_name
        .into_iter()
        .map(|(name, (size, empty))| {
            Bson::Document(if name_only {
                bson::doc! {"name": name}
            } else {
                bson::doc! {"name": name, "sizeOnDisk": size, "empty": empty}
            })
        })
        .collect();
    let mut out = bson::doc! {"databases": databases};
    if !name_only {
        out.insert("totalSize", total);
        out.insert("totalSizeMb", total / (1024 * 1024));
    }
    out.insert("ok", 1.0);
    Ok(out)
}

/// `dropDatabase`: on every shard, then the database leaves the metadata. `admin` (and
/// `config`, served read-only) cannot be dropped, as mongos refuses them.
async fn drop_database(
    cluster: &Arc<Cluster>,
    store: &StaticStore,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    if matches!(req.db.as_str(), "admin" | "config") {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            format!("Cannot drop the {} database", req.db),
        ));
    }
    if let Err(failed) = on_every_shard(cluster, req).await? {
        return Ok(failed);
    }
    for ns in store.drop_database(&req.db)? {
        cluster.routing.reload(&ns, &[]).await?;
    }
    cluster.routing.forget_database(&req.db);
    Ok(bson::doc! {"dropped": &req.db, "ok": 1.0})
}

/// `collStats` of a sharded collection: every shard's statistics under `shards`, summed.
async fn coll_stats(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
    snap: &crate::routing::RoutingSnapshot,
) -> Result<Document, CommandError> {
    let mut shards = Document::new();
    let (mut count, mut size, mut storage, mut nindexes) = (0i64, 0i64, 0i64, 0i64);
    for shard in snap.chunks.shards() {
        let reply = forward(cluster, &shard, req, None).await?;
        if reply.get_f64("ok").ok() != Some(1.0) {
            return Ok(reply);
        }
        count += crate::value::field::number_field(&reply, "count").unwrap_or(0);
        size += crate::value::field::number_field(&reply, "size").unwrap_or(0);
        storage += crate::value::field::number_field(&reply, "storageSize").unwrap_or(0);
        nindexes = nindexes.max(crate::value::field::number_field(&reply, "nindexes").unwrap_or(0));
        shards.insert(shard, reply);
    }
    Ok(bson::doc! {
        "sharded": true,
        "shards": shards,
        "ns": &snap.ns,
        "count": count,
        "size": size,
        "storageSize": storage,
        "avgObjSize": if count > 0 { size / count } else { 0 },
        "nindexes": nindexes,
        "nchunks": snap.chunks.len() as i32,
        "ok": 1.0,
    })
}

/// `dbStats`: every shard's statistics summed, with each shard's reply under `raw`.
async fn db_stats(cluster: &Arc<Cluster>, req: &CommandRequest) -> Result<Document, CommandError> {
    let mut raw = Document::new();
    let fields = [
        "collections",
        "views",
        "objects",
        "dataSize",
        "storageSize",
        "indexes",
        "indexSize",
        "totalSize",
    ];
    let mut sums = vec![0f64; fields.len()];
    let replies = match on_every_shard(cluster, req).await? {
        Ok(replies) => replies,
        Err(failed) => return Ok(failed),
    };
    for (shard, reply) in replies {
        for (i, f) in fields.iter().enumerate() {
            sums[i] += match reply.get(*f) {
                Some(Bson::Int32(v)) => *v as f64,
                Some(Bson::Int64(v)) => *v as f64,
                Some(Bson::Double(v)) => *v,
                _ => 0.0,
            };
        }
        raw.insert(shard, reply);
    }
    let mut out = bson::doc! {"raw": raw, "db": &req.db};
    for (i, f) in fields.iter().enumerate() {
        out.insert(*f, sums[i] as i64);
    }
    let objects = sums[2];
    out.insert(
        "avgObjSize",
        if objects > 0.0 {
            sums[3] / objects
        } else {
            0.0
        },
    );
    out.insert("scaleFactor", 1i64);
    out.insert("ok", 1.0);
    Ok(out)
}

/// [`in_transaction`] on the raw body, or a commit or abort.
fn in_transaction_raw(req: &CommandRequest) -> bool {
    let raw = req.body.raw();
    matches!(raw.get("autocommit"), Ok(Some(RawBsonRef::Boolean(false))))
        || matches!(
            raw.get("startTransaction"),
            Ok(Some(RawBsonRef::Boolean(true)))
        )
        || matches!(req.name.as_str(), "commitTransaction" | "abortTransaction")
}

fn in_transaction(body: &Document) -> bool {
    body.get("startTransaction")
        .is_some_and(crate::value::field::truthy)
        || matches!(body.get("autocommit"), Some(Bson::Boolean(false)))
}

/// A statement of a transaction, or its commit/abort. Each statement goes to the one shard it
/// targets, which joins the transaction if it is new to it (`startTransaction` and the first
/// statement's `readConcern` are added, as mongos adds them). A `find`, `aggregate` or
/// `distinct` that needs several shards runs through the read path with each shard command a
/// statement of the transaction ([`crate::read::in_txn`]), an `insert` is split per shard, an
/// `update` or `delete` of many documents goes to each shard ([`write_on_each`]), and any other
/// statement that targets several shards at once is refused with
/// OperationNotSupportedInTransaction (263). The commit and abort are [`super::transactions::end_transaction`]'s.
async fn transaction(
    sharded: &ShardedCluster,
    how: Forwarded,
    req: &CommandRequest,
    body: &Document,
    snapshot: Option<&crate::routing::RoutingSnapshot>,
    client_id: i64,
) -> Result<Document, CommandError> {
    let (cluster, store) = (&sharded.cluster, &*sharded.metadata);
    let Ok(lsid) = body.get_document("lsid") else {
        return Err(CommandError::new(
            ErrorCode::InvalidOptions,
            "Transaction statements require a session (lsid)",
        ));
    };
    let session = crate::command::session_id(lsid)?;
    let txn = crate::value::field::number_field(body, "txnNumber").unwrap_or(0);
    if how == Forwarded::EndTransaction {
        return super::transactions::end_transaction(cluster, req, body, session, txn).await;
    }
    let statement = || crate::read::in_txn::TxnStatement {
        session,
        lsid: lsid.clone(),
        txn,
        starts: body
            .get("startTransaction")
            .is_some_and(crate::value::field::truthy),
        read_concern: body.get_document("readConcern").ok().cloned(),
    };
    // A router cursor of a read across shards: its shard cursors' getMores are statements of
    // the transaction on the shards that opened them.
    if matches!(how, Forwarded::GetMore | Forwarded::KillCursors)
        && sharded.cursors.names_own_cursor(&req.name, body)
    {
        let read = async {
            match how {
                Forwarded::GetMore => {
                    sharded
                        .cursors
                        .get_more(cluster, req, body, client_id)
                        .await
                }
                _ => Ok(sharded.cursors.kill(cluster, req, client_id).await.into()),
            }
        };
        let reply = crate::read::in_txn::scope(statement(), read).await;
        return read_reply(cluster, session, txn, reply);
    }
    // A cursor of the transaction lives on the shard that opened it.
    let cursor = match how {
        Forwarded::GetMore => body.get_i64("getMore").ok(),
        Forwarded::KillCursors => body
            .get_array("cursors")
            .ok()
            .and_then(|a| a.iter().find_map(Bson::as_i64)),
        _ => None,
    };
    let recorded = cursor.and_then(|id| {
        cluster
            .transactions
            .cursor_shard(&session, txn, id)
            .or_else(|| cluster.transactions.shard_of(&session, txn))
    });
    let shard = match snapshot {
        _ if recorded.is_some() => recorded.unwrap_or_default(),
        None => primary_shard(cluster, store, &req.db, true)?,
        Some(snap) => {
            let shards = transaction_targets(snap, how, req, body);
            match shards.as_slice() {
                [one] => one.clone(),
                [_, _, ..] if how == Forwarded::Write(WriteKind::Insert) => {
                    return insert_across_shards(cluster, snap, req, body, session, txn).await;
                }
                [_, _, ..] if every_statement_multi(req, how) => {
                    return write_on_each(cluster, snap, req, session, txn, shards).await;
                }
                [_, _, ..]
                    if matches!(how, Forwarded::Read | Forwarded::Aggregate)
                        && !writes_output(body) =>
                {
                    let primaries = super::maintenance::StorePrimaries { cluster, store };
                    let mut normalized = None;
                    let read_body = crate::read::ReadBody::of(req, &mut normalized)?;
                    let read = crate::read::read(
                        cluster,
                        &sharded.cursors,
                        &primaries,
                        snap,
                        req,
                        &read_body,
                        client_id,
                    );
                    if let Some(reply) = crate::read::in_txn::scope(statement(), read).await {
                        return read_reply(cluster, session, txn, reply);
                    }
                    return Err(CommandError::new(
                        ErrorCode::OperationNotSupportedInTransaction,
                        format!("'{}' on {} targets {} shards at once inside a transaction", req.name, snap.ns, shards.len()),
                    ));
                }
                _ => {
                    return Err(CommandError::new(
                        ErrorCode::OperationNotSupportedInTransaction,
                        format!("'{}' on {} targets {} shards at once inside a transaction; Sluice runs a write of a transaction on one shard at a time", req.name, snap.ns, shards.len()),
                    ))
                }
            }
        }
    };
    let wrote = !matches!(
        how,
        Forwarded::Read | Forwarded::Aggregate | Forwarded::GetMore | Forwarded::KillCursors
    );
    statement_on(
        cluster,
        session,
        txn,
        &shard,
        req,
        version_of(cluster, snapshot, &shard),
        wrote,
    )
    .await
}

/// The reply to a read of a transaction served by the read path across shards, with the
/// transaction's `recoveryToken`; an error the router could not get an answer for is labelled
/// as a one-shard statement's is.
fn read_reply(
    cluster: &Arc<Cluster>,
    session: [u8; 16],
    txn: i64,
    reply: Result<crate::wire::Reply, CommandError>,
) -> Result<Document, CommandError> {
    let mut d = reply.map_err(transient_statement_error)?.into_document();
    d.insert("ok", 1.0);
    if let Some(participants) = cluster.transactions.participants(&session, txn) {
        d.insert(
            "recoveryToken",
            super::transactions::recovery_token(&participants),
        );
    }
    Ok(d)
}

/// An `update` or `delete` every statement of which may touch any number of documents
/// (`multi: true` without `upsert`, `limit: 0`): sent whole to each shard, where each statement
/// changes what it matches there.
fn every_statement_multi(req: &CommandRequest, how: Forwarded) -> bool {
    let Forwarded::Write(kind) = how else {
        return false;
    };
    let statements = req
        .statement_bytes(kind.statements_field())
        .unwrap_or_default();
    !statements.is_empty()
        && statements.iter().all(|raw| {
            let Ok(stmt) = Document::from_reader(&raw[..]) else {
                return false;
            };
            match kind {
                WriteKind::Update => {
                    stmt.get("multi").is_some_and(crate::value::field::truthy)
                        && !stmt.get("upsert").is_some_and(crate::value::field::truthy)
                }
                WriteKind::Delete => crate::value::field::number_field(&stmt, "limit") == Some(0),
                WriteKind::Insert => false,
            }
        })
}

/// An `update` or `delete` of a transaction whose statements all may touch many documents
/// ([`every_statement_multi`]) on several shards: the whole command goes to each shard (each
/// joining the transaction if new to it), one after the other; the reply counts every shard's
/// `n` (and `nModified`). The first shard that fails ends the command with its error or its
/// write errors (their `index` the client's, the statements being the same): the transaction
/// is aborted on that shard, so what the others changed is never committed.
async fn write_on_each(
    cluster: &Arc<Cluster>,
    snap: &crate::routing::RoutingSnapshot,
    req: &CommandRequest,
    session: [u8; 16],
    txn: i64,
    shards: Vec<String>,
) -> Result<Document, CommandError> {
    let (mut n, mut modified) = (0i64, 0i64);
    let mut last = Document::new();
    for shard in shards {
        let version = version_of(cluster, Some(snap), &shard);
        let reply = statement_on(cluster, session, txn, &shard, req, version, true).await?;
        if reply.get_f64("ok").ok() != Some(1.0) || reply.get_array("writeErrors").is_ok() {
            return Ok(reply);
        }
        n += crate::value::field::number_field(&reply, "n").unwrap_or(0);
        modified += crate::value::field::number_field(&reply, "nModified").unwrap_or(0);
        last = reply;
    }
    last.insert("n", n as i32);
    if last.contains_key("nModified") {
        last.insert("nModified", modified as i32);
    }
    Ok(last)
}

/// An `aggregate` whose last stage writes its output (`$out`, `$merge`), which a transaction
/// does not run.
fn writes_output(body: &Document) -> bool {
    body.get_array("pipeline")
        .ok()
        .and_then(|p| p.last())
        .and_then(Bson::as_document)
        .is_some_and(|s| s.contains_key("$out") || s.contains_key("$merge"))
}

/// An `insert` of a transaction whose documents live on several shards: one child `insert`
/// per shard (each shard joining the transaction if new to it), in the order the shards first
/// appear among the documents. The reply counts every shard's documents; the first child that
/// fails ends the insert with its error (or its write errors, their `index` the document's
/// index in the client's command): the transaction is aborted on that shard, so what the other
/// children wrote is never committed.
async fn insert_across_shards(
    cluster: &Arc<Cluster>,
    snap: &crate::routing::RoutingSnapshot,
    req: &CommandRequest,
    body: &Document,
    session: [u8; 16],
    txn: i64,
) -> Result<Document, CommandError> {
    let mut groups: Vec<(String, Vec<usize>, Vec<Bson>)> = Vec::new();
    for (i, raw) in req.statement_bytes("documents")?.iter().enumerate() {
        let doc = bson::RawDocument::from_bytes(raw)
            .map_err(|e| CommandError::new(ErrorCode::BadValue, e.to_string()))?;
        let shard = snap
            .pattern
            .extract_from_document(doc)
            .ok()
            .and_then(|k| snap.shard_for(&k).map(str::to_string));
        let Some(shard) = shard else {
            return Err(CommandError::new(
                ErrorCode::OperationNotSupportedInTransaction,
                format!("a document of this insert into {} has no shard key value inside a transaction; Sluice sends each statement of a transaction to one shard", snap.ns),
            ));
        };
        let doc = Document::try_from(doc)
            .map_err(|e| CommandError::new(ErrorCode::BadValue, e.to_string()))?;
        match groups.iter_mut().find(|(s, _, _)| *s == shard) {
            Some((_, indexes, docs)) => {
                indexes.push(i);
                docs.push(Bson::Document(doc));
            }
            None => groups.push((shard, vec![i], vec![Bson::Document(doc)])),
        }
    }
    let mut n = 0i64;
    let mut last = Document::new();
    for (shard, indexes, docs) in groups {
        let mut child = body.clone();
        child.insert("documents", docs);
        let child_req = CommandRequest::from_document(&req.db, &child)?;
        let version = version_of(cluster, Some(snap), &shard);
        let mut reply =
            statement_on(cluster, session, txn, &shard, &child_req, version, true).await?;
        if reply.get_f64("ok").ok() != Some(1.0) {
            return Ok(reply);
        }
        n += crate::value::field::number_field(&reply, "n").unwrap_or(0);
        if let Ok(errors) = reply.get_array("writeErrors") {
            let remapped: Vec<Bson> = errors
                .iter()
                .filter_map(Bson::as_document)
                .map(|e| {
                    let mut e = e.clone();
                    let local = crate::value::field::number_field(&e, "index").unwrap_or(0);
                    let index = usize::try_from(local)
                        .ok()
                        .and_then(|l| indexes.get(l))
                        .copied()
                        .unwrap_or(0);
                    e.insert("index", index as i32);
                    Bson::Document(e)
                })
                .collect();
            reply.insert("writeErrors", remapped);
            reply.insert("n", n as i32);
            return Ok(reply);
        }
        last = reply;
    }
    last.insert("n", n as i32);
    Ok(last)
}

/// The `shardVersion` a statement bound for `shard` carries, when the shard checks one.
fn version_of(
    cluster: &Arc<Cluster>,
    snapshot: Option<&crate::routing::RoutingSnapshot>,
    shard: &str,
) -> Option<Document> {
    snapshot
        .filter(|_| cluster.is_shard_server(shard))
        .map(|s| s.shard_version(shard))
}

/// A client `bulkWrite` inside a transaction: passed through when every namespace it names
/// lives on one shard (unsharded on that primary, or sharded with every chunk there; that shard
/// joins the transaction if it is new to it), refused with OperationNotSupportedInTransaction
/// otherwise (no statement-by-statement targeting, no ordered rewrite inside a transaction).
async fn bulk_write_in_transaction(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
    routes: &[crate::write::bulk::NsRoute],
) -> Result<Document, CommandError> {
    let body = req.options_document();
    let Ok(lsid) = body.get_document("lsid") else {
        return Err(CommandError::new(
            ErrorCode::InvalidOptions,
            "Transaction statements require a session (lsid)",
        ));
    };
    let session = crate::command::session_id(lsid)?;
    let txn = crate::value::field::number_field(&body, "txnNumber").unwrap_or(0);
    let mut shards = std::collections::BTreeSet::new();
    for route in routes {
        match route {
            crate::write::bulk::NsRoute::Unsharded(primary) => {
                shards.insert(primary.shard.clone());
            }
            crate::write::bulk::NsRoute::Sharded(snap) => shards.extend(snap.chunks.shards()),
        }
    }
    let shard = match shards.len() {
        1 => shards.into_iter().next().unwrap_or_default(),
        n => {
            return Err(CommandError::new(
                ErrorCode::OperationNotSupportedInTransaction,
                format!("bulkWrite inside a transaction spans {n} shards at once; Sluice sends each statement of a transaction to one shard"),
            ))
        }
    };
    statement_on(cluster, session, txn, &shard, req, None, true).await
}

/// Sends one statement of transaction `txn` of `session` to `shard` (`wrote`: it may write),
/// which joins the transaction's participants if it is new to it.
async fn statement_on(
    cluster: &Arc<Cluster>,
    session: [u8; 16],
    txn: i64,
    shard: &str,
    req: &CommandRequest,
    version: Option<Document>,
    wrote: bool,
) -> Result<Document, CommandError> {
    let shard = shard.to_string();
    let read_concern = req
        .body
        .raw()
        .get_document("readConcern")
        .ok()
        .and_then(|d| Document::try_from(d).ok());
    let joined = cluster
        .transactions
        .begin(session, txn, &shard, wrote, read_concern.as_ref())?;
    let mut extra = Document::new();
    if let Some(v) = version {
        extra.insert("shardVersion", v);
    }
    if joined.new_participant {
        // The transaction starts on this shard now, with the snapshot the client asked for.
        extra.insert("startTransaction", true);
        if let Some(rc) = &joined.read_concern {
            extra.insert("readConcern", rc.clone());
        }
    }
    let reply = forward_with(cluster, &shard, req, (!extra.is_empty()).then_some(extra))
        .await
        .map_err(transient_statement_error);
    // A transaction whose first statement on a shard failed does not exist there: the shard
    // leaves the participants (and an entry with none goes), so failed attempts leave
    // nothing behind.
    let failed = reply
        .as_ref()
        .map_or(true, |r| r.get_f64("ok").ok() != Some(1.0));
    if failed {
        cluster
            .transactions
            .join_failed(&session, txn, &shard, &joined);
    }
    let mut d = reply?;
    if d.get_f64("ok").ok() != Some(1.0) {
        return Ok(d);
    }
    if let Some(id) = d
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_i64("id").ok())
        .filter(|id| *id != 0)
    {
        cluster.transactions.add_cursor(&session, txn, id, &shard);
    }
    // What a client sends with a commit or abort to any router, as mongos hands it out.
    if let Some(participants) = cluster.transactions.participants(&session, txn) {
        d.insert(
            "recoveryToken",
            super::transactions::recovery_token(&participants),
        );
    }
    Ok(d)
}

/// A transaction statement the router could not get an answer to from its shard (the
/// connection was lost, no primary): retrying the whole transaction is safe, so the error
/// carries `TransientTransactionError`, as mongos labels it.
fn transient_statement_error(mut e: CommandError) -> CommandError {
    let transient = retry::is_retriable_code(e.code.0)
        || retry::is_network_code(e.code.0)
        || e.code == ErrorCode::NoSuchTransaction;
    if transient && !e.labels.iter().any(|l| l == "TransientTransactionError") {
        e.labels.retain(|l| l != retry::RETRYABLE_WRITE_ERROR);
        e.labels.push("TransientTransactionError".to_string());
    }
    e
}

/// The shards a transaction statement on a sharded collection touches, by the command's kind
/// in the dispatch table.
fn transaction_targets(
    snap: &crate::routing::RoutingSnapshot,
    how: Forwarded,
    req: &CommandRequest,
    body: &Document,
) -> Vec<String> {
    let mut shards: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let filter_shards = |f: &Document| crate::read::target_shards(snap, f);
    let statements = |field: &str| req.statement_bytes(field).unwrap_or_default();
    match how {
        Forwarded::Write(WriteKind::Insert) => {
            for raw in statements("documents") {
                if let Ok(doc) = bson::RawDocument::from_bytes(&raw) {
                    match snap.pattern.extract_from_document(doc) {
                        Ok(k) => shards.extend(snap.shard_for(&k).map(|s| s.to_string())),
                        Err(_) => shards.extend(snap.chunks.shards()),
                    }
                }
            }
        }
        Forwarded::Write(kind) => {
            for raw in statements(kind.statements_field()) {
                let stmt = Document::from_reader(&raw[..]).unwrap_or_default();
                shards.extend(filter_shards(
                    stmt.get_document("q").unwrap_or(&Document::new()),
                ));
            }
        }
        Forwarded::Read => {
            let f = body
                .get_document("filter")
                .or_else(|_| body.get_document("query"))
                .cloned()
                .unwrap_or_default();
            shards.extend(filter_shards(&f));
        }
        Forwarded::FindAndModify => shards.extend(filter_shards(
            &body.get_document("query").cloned().unwrap_or_default(),
        )),
        _ => shards.extend(snap.chunks.shards()),
    }
    shards.into_iter().collect()
}

/// DDL on a sharded collection: sent to every shard; the first failure is reported. A dropped
/// collection also leaves the sharding metadata.
pub(super) async fn broadcast_ddl(
    cluster: &Arc<Cluster>,
    store: &StaticStore,
    req: &CommandRequest,
    snap: &crate::routing::RoutingSnapshot,
) -> Result<Document, CommandError> {
    let mut first_ok: Option<Document> = None;
    for shard in cluster
        .shards()
        .iter()
        .map(|s| s.id.clone())
        .collect::<Vec<_>>()
    {
        let reply = forward(cluster, &shard, req, None).await?;
        let ok = reply.get_f64("ok").ok() == Some(1.0);
        let missing = reply.get_i32("code").ok() == Some(ErrorCode::NamespaceNotFound.0);
        if !ok && !missing {
            return Ok(reply);
        }
        if ok && first_ok.is_none() {
            first_ok = Some(reply);
        }
    }
    if req.name == "drop" {
        store.drop_collection(&snap.ns)?;
        cluster.routing.reload(&snap.ns, &[]).await?;
    }
    Ok(first_ok.unwrap_or_else(|| bson::doc! {"ok": 1.0}))
}

/// Forwards the client's command to `shard` as it is (plus `shardVersion` when given) and
/// returns the shard's reply without its shard-only fields.
pub(super) async fn forward(
    cluster: &Arc<Cluster>,
    shard: &str,
    req: &CommandRequest,
    shard_version: Option<Document>,
) -> Result<Document, CommandError> {
    forward_with(
        cluster,
        shard,
        req,
        shard_version.map(|v| bson::doc! {"shardVersion": v}),
    )
    .await
}

/// [`forward`] with version fields (`shardVersion`, `databaseVersion`) set on the body,
/// replacing any the client sent.
pub(super) async fn forward_with(
    cluster: &Arc<Cluster>,
    shard: &str,
    req: &CommandRequest,
    versions: Option<Document>,
) -> Result<Document, CommandError> {
    let Some(pool) = cluster.pool(shard) else {
        return Err(CommandError::new(
            ErrorCode::ShardNotFound,
            format!("Shard {shard} not found"),
        ));
    };
    let raise_w0 = matches!(
        req.body
            .raw()
            .get_document("writeConcern")
            .ok()
            .and_then(|wc| wc.get("w").ok().flatten()),
        Some(bson::RawBsonRef::Int32(0) | bson::RawBsonRef::Int64(0))
    );
    let body_bytes: Vec<u8> = if raise_w0 || versions.is_some() {
        let mut body = req.body_document();
        if raise_w0 {
            if let Ok(wc) = body.get_document_mut("writeConcern") {
                wc.insert("w", 1);
            }
        }
        for (k, v) in versions.into_iter().flatten() {
            body.insert(k, v);
        }
        body.to_vec()
            .map_err(|e| CommandError::new(ErrorCode::InternalError, e.to_string()))?
    } else {
        req.body.bytes().to_vec()
    };
    let mut b = OpMsgBuilder::new(0, &body_bytes);
    for seq in &req.sequences {
        b.begin_sequence(&seq.identifier);
        for d in &seq.documents {
            b.push_document(d.bytes());
        }
    }
    let id = crate::backend::PooledConnection::next_request_id();
    let frame = b.finish(id, 0);
    let raw = req.body.raw();
    let need =
        crate::backend::shard::need_of(raw).map_err(|e| CommandError::new(e.code, e.message))?;
    let resend = if crate::backend::shard::batch_session(raw).is_retryable_write() {
        Resend::RetryableWrite
    } else if in_transaction_raw(req) {
        Resend::Never
    } else if matches!(need, Need::Read(_)) || is_idempotent_read(&req.name) {
        Resend::Read
    } else if crate::backend::shard::writes_documents(&req.name) {
        Resend::Never
    } else {
        Resend::IfRefusedAsNotPrimary
    };
    let deadline = match raw.get("maxTimeMS") {
        Ok(Some(RawBsonRef::Int32(m))) if m > 0 => Some(i64::from(m)),
        Ok(Some(RawBsonRef::Int64(m))) if m > 0 => Some(m),
        Ok(Some(RawBsonRef::Double(m))) if m >= 1.0 => Some(m as i64),
        _ => None,
    }
    .map(|m| std::time::Instant::now() + std::time::Duration::from_millis(m as u64));
    // Labels of a shard's error are for its client, the router, which has done the retrying
    // (docs/design/replica-sets.md §5): none reaches the client.
    // Inside a transaction the shard's own error (and its labels) is the client's: no
    // statement is resent and no failure becomes a write error.
    let in_txn = in_transaction_raw(req);
    let is_write = matches!(req.name.as_str(), "insert" | "update" | "delete") && !in_txn;
    // A cursor's `getMore` / `killCursors` go to the member that holds it.
    let cursor = match req.name.as_str() {
        "getMore" => match raw.get("getMore") {
            Ok(Some(RawBsonRef::Int64(c))) => Some(c),
            _ => None,
        },
        "killCursors" => match raw.get("cursors") {
            Ok(Some(RawBsonRef::Array(a))) => a.into_iter().flatten().find_map(|c| match c {
                RawBsonRef::Int64(c) => Some(c),
                _ => None,
            }),
            _ => None,
        },
        _ => None,
    };
    let pinned = cursor.and_then(|c| pool.cursor_member(c));
    let sent = match &pinned {
        Some(member) => pool.send_to(member, &frame, id).await,
        None => pool.send(&frame, id, &need, deadline, resend).await,
    };
    let reply = match sent {
        Ok((reply, member)) => {
            if pool.is_replica_set() {
                let open = match reply.raw().get_document("cursor").map(|c| c.get("id")) {
                    Ok(Ok(Some(RawBsonRef::Int64(c)))) => c,
                    _ => 0,
                };
                match (req.name.as_str(), cursor) {
                    ("killCursors", _) => {
                        if let Ok(Some(RawBsonRef::Array(a))) = raw.get("cursors") {
                            for c in a.into_iter().flatten() {
                                if let RawBsonRef::Int64(c) = c {
                                    pool.unpin_cursor(c);
                                }
                            }
                        }
                    }
                    ("getMore", Some(c)) if open == 0 => pool.unpin_cursor(c),
                    _ if open != 0 => pool.pin_cursor(open, &member),
                    _ => {}
                }
            }
            reply
        }
        Err(e) => {
            let e = match e {
                crate::backend::BackendError::NoMember(code, message) => {
                    CommandError::new(code, message)
                }
                e => CommandError::from(e.at(shard)),
            };
            if is_write {
                return Ok(as_write_errors(req, e.code.0, &e.message));
            }
            return Err(e);
        }
    };
    let mut d = reply.to_document();
    for f in SHARD_ONLY_FIELDS {
        d.remove(*f);
    }
    // A shard's writeConcernError names the shard, as mongos reports it: a batch write's
    // through the merge of its batch write path (`<CodeName>: <errmsg>; Error details: … at
    // <shard>`, no errInfo), any other command's with its reason suffixed (`… at <shard>`).
    if let Ok(wce) = d.get_document("writeConcernError") {
        let named = if is_write {
            crate::write::merge::merge_write_concern_errors(&[(shard.to_string(), wce.clone())])
        } else {
            let mut w = wce.clone();
            let reason = format!("{} at {shard}", wce.get_str("errmsg").unwrap_or_default());
            w.insert("errmsg", reason);
            Some(w)
        };
        if let Some(w) = named {
            d.insert("writeConcernError", w);
        }
    }
    // A write command a shard refused because its member stopped being primary or is going
    // away (and that the router could not, or may not, resend): mongos's batch write path
    // reports it as the statements' write error, without labels.
    if is_write && d.get_f64("ok").ok() != Some(1.0) {
        let code = d.get_i32("code").unwrap_or(0);
        if retry::is_not_primary_code(code)
            || retry::is_shutdown_code(code)
            || retry::is_network_code(code)
        {
            let message = d.get_str("errmsg").unwrap_or_default().to_string();
            return Ok(as_write_errors(req, code, &message));
        }
    }
    Ok(d)
}

/// A write command's failure as mongos's batch write path reports it: `ok: 1`, nothing
/// applied, and the error on the first statement (ordered) or on every statement.
fn as_write_errors(req: &CommandRequest, code: i32, message: &str) -> Document {
    let raw = req.body.raw();
    let field = match req.name.as_str() {
        "insert" => "documents",
        "update" => "updates",
        _ => "deletes",
    };
    let in_body = match raw.get(field) {
        Ok(Some(RawBsonRef::Array(a))) => a.into_iter().count(),
        _ => 0,
    };
    let in_sequence: usize = req
        .sequences
        .iter()
        .filter(|s| s.identifier == field)
        .map(|s| s.documents.len())
        .sum();
    let statements = (in_body + in_sequence).max(1);
    let ordered = !matches!(raw.get("ordered"), Ok(Some(RawBsonRef::Boolean(false))));
    let failed = if ordered { 1 } else { statements };
    let errors: Vec<Bson> = (0..failed)
        .map(|i| {
            Bson::Document(bson::doc! {
                "index": i as i32,
                "code": code,
                "codeName": ErrorCode(code).name(),
                "errmsg": message,
            })
        })
        .collect();
    let mut d = bson::doc! {"n": 0, "writeErrors": errors};
    if req.name == "update" {
        d.insert("nModified", 0);
    }
    d.insert("ok", 1.0);
    d
}

/// `findAndModify` whose query does not pin the shard key, as mongos 8.0 runs a write without
/// shard key: each shard owning chunks is asked for its first matching document in the
/// command's `sort` order (`find`, `limit: 1`); the best of them (by `sort`, else the first in
/// shard order) is modified on its shard by the command narrowed to its `_id`, with the write
/// path's checks of a shard key change ([`crate::write::lookup::decide`]). A document that
/// stopped matching in between is looked up again (a few times; once for a retryable write,
/// whose shard keeps the statement's first answer). When nothing matches, an upsert runs on
/// the shard owning the document it inserts; otherwise the first shard runs the command
/// narrowed to match nothing, so its reply (and its validation of the update) is mongod's.
async fn find_and_modify_without_key(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
    body: &Document,
    snap: &crate::routing::RoutingSnapshot,
    query: Document,
) -> Result<Document, CommandError> {
    use crate::write::lookup::{self, Step};
    let coll = req.collection().unwrap_or_default().to_string();
    let shards: Vec<String> = snap.chunks.shards().into_iter().collect();
    let sort = match body.get("sort") {
        Some(Bson::Document(s)) if !s.is_empty() => Some(
            crate::engine::query::SortSpec::parse(s)
                .map_err(|e| CommandError::new(e.code, e.message))?,
        ),
        _ => None,
    };
    let mut find = bson::doc! {
        "find": &coll,
        "filter": query.clone(),
        "limit": 1i64,
        "singleBatch": true,
        "$db": &req.db,
    };
    for k in ["sort", "collation", "hint"] {
        if let Some(v) = body.get(k) {
            find.insert(k, v.clone());
        }
    }
    let remove = body.get("remove").is_some_and(crate::value::field::truthy);
    let (kind, mut statement) = if remove {
        (
            crate::command::WriteKind::Delete,
            bson::doc! {"q": query.clone(), "limit": 1},
        )
    } else {
        (
            crate::command::WriteKind::Update,
            bson::doc! {
                "q": query.clone(),
                "u": body.get("update").cloned().unwrap_or(Bson::Null),
                "upsert": body.get("upsert").is_some_and(crate::value::field::truthy),
            },
        )
    };
    if let Some(c) = body.get("collation") {
        statement.insert("collation", c.clone());
    }
    let attempts = if body.contains_key("txnNumber") {
        1
    } else {
        lookup::MAX_ATTEMPTS
    };
    let mut last = None;
    for _ in 0..attempts {
        let futures = shards.iter().map(|s| {
            let mut cmd = find.clone();
            if cluster.is_shard_server(s) {
                cmd.insert("shardVersion", snap.shard_version(s));
            }
            async move { (s, crate::read::read_one(cluster, s, &snap.ns, &cmd).await) }
        });
        let mut best: Option<(String, Document)> = None;
        for (shard, result) in crate::backend::join_all(futures).await {
            let Some(d) = lookup::found(&result?) else {
                continue;
            };
            let better = match (&best, &sort) {
                (None, _) => true,
                (Some((_, b)), Some(sort)) => sort.compare(&d, b) == std::cmp::Ordering::Less,
                (Some(_), None) => false,
            };
            if better {
                best = Some((shard.clone(), d));
            }
        }
        let found = best.is_some();
        let (shard, narrowed) = match lookup::decide(
            snap,
            kind,
            &statement,
            shards.first().map(String::as_str),
            best,
        ) {
            Step::Write { shard, statement } | Step::Validate { shard, statement } => {
                (shard, statement.get("q").cloned())
            }
            Step::Insert { shard, .. } => (shard, None),
            Step::Nothing => (
                shards.first().cloned().unwrap_or_default(),
                Some(bson::doc! {"$and": [query.clone(), {"_id": {"$in": []}}]}.into()),
            ),
            Step::Fail { code, message } => return Err(CommandError::new(code, message)),
        };
        let mut cmd = req.body_document();
        if let Some(q) = narrowed {
            cmd.insert("query", q);
            if found {
                cmd.insert("upsert", false);
            }
        }
        let sub = CommandRequest::from_document(&req.db, &cmd)?;
        let version = cluster
            .is_shard_server(&shard)
            .then(|| snap.shard_version(&shard));
        let reply = forward(cluster, &shard, &sub, version).await?;
        let hit = reply
            .get_document("lastErrorObject")
            .ok()
            .and_then(|l| l.get("n"))
            .is_some_and(|n| crate::value::field::to_f64(n) > 0.0);
        let ok = reply
            .get("ok")
            .is_some_and(|v| crate::value::field::to_f64(v) == 1.0);
        if hit || !found || !ok {
            return Ok(reply);
        }
        last = Some(reply);
    }
    Ok(last.unwrap_or_else(|| bson::doc! {"ok": 1.0}))
}

/// Reads a shard may be asked again after a retriable failure (mongos's idempotent
/// commands).
fn is_idempotent_read(name: &str) -> bool {
    matches!(
        name,
        "find" | "count" | "distinct" | "listCollections" | "listIndexes" | "collStats" | "dbStats"
    )
}

/// `findAndModify` on a sharded collection: a query that pins the full shard key sends the
/// command to the owning shard unchanged; any other is a write without shard key.
async fn find_and_modify(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
    body: &Document,
    snap: &crate::routing::RoutingSnapshot,
) -> Result<Document, CommandError> {
    let query = body.get_document("query").cloned().unwrap_or_default();
    let shard = match snap.pattern.extract_from_filter(&query) {
        FilterKeys::Keys(keys) if keys.len() == 1 => {
            snap.shard_for(&keys[0]).map(|s| s.to_string())
        }
        _ => None,
    };
    let Some(shard) = shard else {
        return find_and_modify_without_key(cluster, req, body, snap, query).await;
    };
    let version = cluster
        .is_shard_server(&shard)
        .then(|| snap.shard_version(&shard));
    forward(cluster, &shard, req, version).await
}
