//! The router's service: one dispatch for every command a client sends to the router, the
//! commands it answers itself (through [`crate::command`]'s shared handlers), forwarding through
//! the read and write paths ([`route`]), sharding administration and the `config` database
//! ([`sharding`]), and start-up ([`start_router`], [`bootstrap`]).
//!
//! It sits above everything it composes: the frontend serves it, the cluster gives it shards,
//! the read and write paths run its data commands.

pub mod cluster_admin;
pub mod cluster_ddl;
pub mod configdb;
pub mod maintenance;
pub mod merge_output;
pub mod route;
pub mod sharding;
pub mod state;
pub mod transactions;
pub mod uptime;
pub mod views;

pub use state::ShardedCluster;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bson::{doc, Document};

use crate::backend::PoolOptions;
use crate::cluster::Cluster;
use crate::command::{
    hello, max_time_value, raw_session_id, server_info, ClientState, CommandError, CommandRequest,
    ServerState,
};
use crate::config::Config;
use crate::frontend::RouterHandle;
use crate::metadata::StaticStore;
use crate::routing::{RoutingTable, ShardInfo};
use crate::value::error_codes::ErrorCode;
use crate::wire::Reply;

/// The router's command handler, served by the frontend.
#[derive(Debug)]
pub struct Router {
    state: Arc<ServerState>,
    cluster: Option<Arc<ShardedCluster>>,
    /// The router's own `failCommand` fail point (test commands only), as mongos has one.
    failpoints: crate::command::failpoint::FailPoints,
}

impl Router {
    /// A router over this shared state and, when it has shards, its cluster.
    pub fn new(state: Arc<ServerState>, cluster: Option<Arc<ShardedCluster>>) -> Self {
        Router {
            state,
            cluster,
            failpoints: Default::default(),
        }
    }

    /// `configureFailPoint` and the fail point's action, when the router runs with test
    /// commands enabled: the fail point is the router's own, as mongos implements
    /// `failCommand` on itself (nothing is forwarded to shards). Without test commands the
    /// command is unknown (59), as everywhere else.
    async fn handle_with_failpoint(
        &self,
        client: &mut ClientState,
        req: &CommandRequest,
    ) -> crate::frontend::Response {
        use crate::frontend::Response;
        let name = req.name.as_str();
        let respond = |reply: Reply| match reply {
            Reply::Document(d) => Response::Reply(d),
            Reply::Raw(r) => Response::Raw(r),
        };
        if !self.state.config.enable_test_commands {
            return respond(dispatch(&self.state, self.cluster.as_ref(), client, req).await);
        }
        let body = req.body_document();
        if name == "configureFailPoint" {
            let mut reply = if let Err(e) = req.require_admin() {
                e.to_reply()
            } else {
                match self.failpoints.configure(&body) {
                    Ok(mut d) => {
                        d.insert("ok", 1.0);
                        d
                    }
                    Err(e) => e.to_reply(),
                }
            };
            crate::command::append_cluster_time(&self.state, &mut reply);
            return Response::Reply(reply);
        }
        let fired = self.failpoints.fire(client, name);
        if let Some(fp) = &fired {
            if let Some(block) = fp.block {
                tokio::time::sleep(block).await;
            }
            if fp.close_connection {
                return Response::CloseConnection;
            }
            if let Some(e) = fp.error(name, &body) {
                let mut reply = e.to_reply();
                crate::command::append_cluster_time(&self.state, &mut reply);
                return Response::Reply(reply);
            }
        }
        let reply = dispatch(&self.state, self.cluster.as_ref(), client, req).await;
        match &fired {
            Some(fp) if fp.write_concern_error.is_some() => {
                let mut reply = reply.into_document();
                fp.decorate(name, &body, &mut reply);
                Response::Reply(reply)
            }
            _ => respond(reply),
        }
    }
}

impl Router {
    /// `shutdown`, as mongos answers it: the router shuts itself down (it is never sent to a
    /// shard; a shard's members are shut down on their own addresses). After mongod's and
    /// mongos's checks (`server_info::shutdown_request`), the router begins its graceful
    /// shutdown as on SIGTERM — no new connections, requests in flight answered within
    /// `shutdown_timeout_secs` — and closes this connection without a reply, as mongos's
    /// exiting process does. `force` and `timeoutSecs` are validated; the grace period is the
    /// configured one (a router has no secondary to wait for).
    fn shutdown(&self, client: &ClientState, req: &CommandRequest) -> crate::frontend::Response {
        match crate::command::server_info::shutdown_request(&self.state, client.peer, req) {
            Ok(_) => {
                tracing::warn!(conn = client.id, peer = %client.peer, "the shutdown command stops the router");
                self.state.begin_shutdown();
                crate::frontend::Response::CloseConnection
            }
            Err(e) => {
                let mut reply = e.to_reply();
                crate::command::append_cluster_time(&self.state, &mut reply);
                crate::frontend::Response::Reply(reply)
            }
        }
    }
}

impl crate::frontend::Service for Router {
    fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    fn handle<'a>(
        &'a self,
        client: &'a mut ClientState,
        req: &'a CommandRequest,
    ) -> crate::frontend::BoxFuture<'a, crate::frontend::Response> {
        Box::pin(async move {
            if req.name == "shutdown" {
                return self.shutdown(client, req);
            }
            self.handle_with_failpoint(client, req).await
        })
    }

    fn user_store(&self) -> Option<crate::command::service::UserStore> {
        self.cluster.as_ref()?.user_store()
    }

    fn connection_closed<'a>(
        &'a self,
        client: &'a ClientState,
    ) -> crate::frontend::BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(sharded) = &self.cluster {
                // Only the connection that opened a cursor may use it: its cursors go with it.
                sharded
                    .cursors
                    .close_owner(&sharded.cluster, client.id)
                    .await;
            }
        })
    }
}

/// What the router does with a command: answer it itself, or forward it ([`route::Forwarded`]
/// says how). The router's one dispatch table, read once per request; the read and write paths
/// get the request already classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// `hello`, `isMaster`, `ismaster`.
    Hello,
    /// `ping`.
    Ping,
    /// `buildInfo`.
    BuildInfo,
    /// `getParameter`.
    GetParameter,
    /// `getLog`.
    GetLog,
    /// `whatsmyuri`.
    WhatsMyUri,
    /// `connectionStatus`.
    ConnectionStatus,
    /// `endSessions`.
    EndSessions,
    /// `killSessions`, `killAllSessions`, `killAllSessionsByPattern`: passed to every shard.
    KillSessions,
    /// `getCmdLineOpts`.
    GetCmdLineOpts,
    /// `serverStatus`.
    ServerStatus,
    /// `enableSharding`.
    EnableSharding,
    /// `shardCollection`.
    ShardCollection,
    /// `listShards`.
    ListShards,
    /// `addShard`.
    AddShard,
    /// `removeShard`.
    RemoveShard,
    /// `flushRouterConfig`.
    FlushRouterConfig,
    /// `balancerStatus`, `balancerStart`, `balancerStop`.
    Balancer,
    /// `split`.
    Split,
    /// `mergeChunks`.
    MergeChunks,
    /// `moveChunk`, `moveRange`: through the config server.
    MoveChunk,
    /// `movePrimary`: through the database's primary shard.
    MovePrimary,
    /// `bulkWrite` (8.0): the write path, across namespaces.
    BulkWrite,
    /// Forwarded to shards through [`route::route`].
    Forward(route::Forwarded),
}

impl Handler {
    /// The handler of the command `name`, `None` for a command the router does not know: what
    /// mongos registers, and nothing else. A client cannot reach a shard's internal commands
    /// (`_shardsvr*`, `_configsvr*`, Sluice's own `sluice*`) or its test-only ones
    /// (`configureFailPoint`, which the router serves itself) through the router.
    pub fn of(name: &str) -> Option<Handler> {
        use route::Forwarded as F;
        use Handler::*;
        Some(match name {
            "hello" | "isMaster" | "ismaster" => Hello,
            "ping" => Ping,
            "buildInfo" | "buildinfo" => BuildInfo,
            "getParameter" => GetParameter,
            "getLog" => GetLog,
            "whatsmyuri" => WhatsMyUri,
            "connectionStatus" => ConnectionStatus,
            "endSessions" => EndSessions,
            "killAllSessions" | "killAllSessionsByPattern" | "killSessions" => KillSessions,
            "getCmdLineOpts" => GetCmdLineOpts,
            "serverStatus" => ServerStatus,
            "enableSharding" | "enablesharding" => EnableSharding,
            "shardCollection" | "shardcollection" => ShardCollection,
            "listShards" | "listshards" => ListShards,
            "addShard" | "addshard" => AddShard,
            "removeShard" | "removeshard" => RemoveShard,
            "flushRouterConfig" | "flushrouterconfig" => FlushRouterConfig,
            "balancerStatus" | "balancerStart" | "balancerStop" => Balancer,
            "split" => Split,
            "mergeChunks" | "mergechunks" => MergeChunks,
            "moveChunk" | "movechunk" | "moveRange" => MoveChunk,
            "movePrimary" | "moveprimary" => MovePrimary,
            "bulkWrite" => BulkWrite,
            "insert" => Forward(F::Write(crate::command::WriteKind::Insert)),
            "update" => Forward(F::Write(crate::command::WriteKind::Update)),
            "delete" => Forward(F::Write(crate::command::WriteKind::Delete)),
            "findAndModify" | "findandmodify" => Forward(F::FindAndModify),
            "find" | "count" | "distinct" => Forward(F::Read),
            "aggregate" => Forward(F::Aggregate),
            "getMore" => Forward(F::GetMore),
            "killCursors" => Forward(F::KillCursors),
            "createIndexes" | "dropIndexes" | "deleteIndexes" | "drop" | "collMod" => {
                Forward(F::CollectionDdl)
            }
            "create" => Forward(F::Create),
            "validate" => Forward(F::Validate),
            "listIndexes" => Forward(F::ListIndexes),
            "collStats" => Forward(F::CollStats),
            "dataSize" | "datasize" => Forward(F::DataSize),
            "renameCollection" => Forward(F::RenameCollection),
            "explain" => Forward(F::Explain),
            "listDatabases" => Forward(F::ListDatabases),
            "dropDatabase" => Forward(F::DropDatabase),
            "dbStats" => Forward(F::DbStats),
            "abortTransaction" | "commitTransaction" => Forward(F::EndTransaction),
            "analyze"
            | "collstats"
            | "compact"
            | "convertToCapped"
            | "dbstats"
            | "filemd5"
            | "listCollections"
            | "mapReduce"
            | "planCacheClear"
            | "planCacheClearFilters"
            | "planCacheListFilters"
            | "planCacheSetFilter"
            | "validateDBMetadata" => Forward(F::Other),
            _ => return None,
        })
    }
}

fn no_such_command(name: &str) -> CommandError {
    CommandError::new(
        ErrorCode::CommandNotFound,
        format!("no such command: '{name}'"),
    )
}

/// Checks what mongos checks of every request before running it: the database name, the
/// `local` database (not usable through mongos), `lsid`; the session's id when there is one.
///
/// `lsid` is the result of looking it up in the body (found in the walk that finds
/// `maxTimeMS`).
fn check_envelope(
    req: &CommandRequest,
    lsid: bson::error::Result<Option<bson::RawBsonRef<'_>>>,
) -> Result<Option<[u8; 16]>, CommandError> {
    if let Err(message) = crate::limits::check_database_name(&req.db) {
        return Err(CommandError::new(ErrorCode::InvalidNamespace, message));
    }
    if req.db == "local" {
        return Err(CommandError::new(
            ErrorCode::IllegalOperation,
            "Can't use 'local' database through mongos",
        ));
    }
    match lsid {
        Ok(None) => Ok(None),
        Ok(Some(bson::RawBsonRef::Document(lsid))) => raw_session_id(lsid).map(Some),
        Ok(Some(_)) | Err(_) => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            "BSON field 'OperationSessionInfo.lsid' is the wrong type, expected type 'object'",
        )),
    }
}

/// Runs one command and returns its reply, `$clusterTime` and `operationTime` included, as
/// mongos appends them to every reply. A request with `maxTimeMS` gets MaxTimeMSExpired (50)
/// when that time passes before its reply is ready, however long its shards take.
pub async fn dispatch(
    state: &Arc<ServerState>,
    cluster: Option<&Arc<ShardedCluster>>,
    client: &mut ClientState,
    req: &CommandRequest,
) -> Reply {
    state.counters.op_command.fetch_add(1, Ordering::Relaxed);
    // `lsid` and `maxTimeMS` in one walk of the body.
    let [lsid, max_time_field] = crate::wire::get_fields(req.body.raw(), ["lsid", "maxTimeMS"]);
    let result = match check_envelope(req, lsid).and_then(|session| {
        if let Some(id) = session {
            state.sessions.touch(id)?;
        }
        if Handler::of(&req.name) == Some(Handler::Hello) {
            Ok(None)
        } else {
            max_time_value(max_time_field)
        }
    }) {
        Err(e) => Err(e),
        Ok(None) => run_command(state, cluster, client, req).await,
        Ok(Some(limit)) => {
            match tokio::time::timeout(limit, run_command(state, cluster, client, req)).await {
                Ok(r) => r,
                Err(_) => Err(CommandError::new(
                    ErrorCode::MaxTimeMSExpired,
                    "operation exceeded time limit",
                )),
            }
        }
    };
    let mut reply = match result {
        Ok(r) => r,
        Err(e) => Reply::Document(e.to_reply()),
    };
    // Encoded once, here: `ok` and the cluster time are appended to the encoded body.
    reply.encode();
    // Forwarded replies carry the shard's `ok` (0 or 1); the router's own lack one.
    if !reply.contains_key("ok") {
        reply.append(bson::raw::cstr!("ok"), bson::Bson::Double(1.0));
    }
    reply.append_cluster_time(state.clock.tick());
    reply
}

/// Runs one command: the router's own, or forwarded. A forwarded reply keeps its `ok`.
async fn run_command(
    state: &Arc<ServerState>,
    cluster: Option<&Arc<ShardedCluster>>,
    client: &mut ClientState,
    req: &CommandRequest,
) -> Result<Reply, CommandError> {
    let handler = Handler::of(&req.name);
    if req.db == "config"
        && !matches!(
            handler,
            Some(Handler::Hello | Handler::Ping | Handler::BuildInfo)
        )
    {
        let name = format!(
            "{}:{}",
            server_info::hostname(),
            state.config.listen.rsplit(':').next().unwrap_or("")
        );
        return sharding::config_read(
            cluster,
            req,
            &name,
            state.started.elapsed().as_secs() as i64,
        )
        .await
        .map(Reply::from);
    }
    let Some(handler) = handler else {
        return Err(no_such_command(&req.name));
    };
    let own = match handler {
        Handler::Hello => {
            return hello::hello_raw(state, client, req, hello::Role::Router)
                .await
                .map(Reply::from)
        }
        Handler::Ping => Ok(doc! {}),
        Handler::BuildInfo => Ok(server_info::build_info()),
        Handler::GetParameter => {
            server_info::get_parameter(req, &server_info::Parameters::of(&state.config))
        }
        Handler::GetLog => server_info::get_log(req),
        Handler::WhatsMyUri => Ok(doc! {"you": client.peer.to_string()}),
        Handler::ConnectionStatus => Ok(server_info::connection_status(req)),
        Handler::EndSessions => server_info::end_sessions(req),
        Handler::KillSessions => kill_sessions(cluster, req).await,
        Handler::GetCmdLineOpts => Ok(server_info::get_cmd_line_opts(state)),
        Handler::ServerStatus => Ok(server_status(state, cluster)),
        Handler::EnableSharding => sharding::enable_sharding(cluster, req).await,
        Handler::ShardCollection => sharding::shard_collection(cluster, req).await,
        Handler::ListShards => sharding::list_shards(cluster).await,
        Handler::FlushRouterConfig => {
            cluster_admin::flush_router_config(cluster.map(|c| &**c), req).await
        }
        Handler::AddShard => cluster_admin::add_shard(cluster.map(|c| &**c), req).await,
        Handler::RemoveShard => cluster_admin::remove_shard(cluster.map(|c| &**c), req).await,
        Handler::Balancer => cluster_ddl::balancer(cluster.map(|c| &**c), req).await,
        Handler::Split => cluster_ddl::split(cluster.map(|c| &**c), req).await,
        Handler::MergeChunks => cluster_ddl::merge_chunks(cluster.map(|c| &**c), req).await,
        Handler::MoveChunk => sharding::move_chunk(cluster, req).await,
        Handler::MovePrimary => cluster_ddl::move_primary(cluster.map(|c| &**c), req).await,
        Handler::BulkWrite => match cluster {
            Some(cluster) => return route::bulk_write(cluster, &state.config, req).await,
            None => Err(no_such_command(&req.name)),
        },
        Handler::Forward(route::Forwarded::Aggregate)
            if sharding::first_stage(req).as_deref() == Some("$listLocalSessions") =>
        {
            sharding::list_local_sessions(state, req)
        }
        Handler::Forward(route::Forwarded::Aggregate) if req.namespace.is_none() => {
            match sharding::local_documents_aggregate(req, state.config.stage_memory_bytes) {
                Some(r) => r,
                None => Err(CommandError::new(
                    ErrorCode::InvalidNamespace,
                    "collection-less aggregations are only supported with $documents",
                )),
            }
        }
        Handler::Forward(how) => match cluster {
            Some(cluster) => {
                let policy = state
                    .config
                    .rewrite_policy(req.namespace.as_deref().unwrap_or_default());
                return route::route(cluster, how, policy, req, client.id).await;
            }
            None => Err(no_such_command(&req.name)),
        },
    };
    own.map(Reply::from)
}

/// `serverStatus`: the shared report, with the router's write statistics under
/// `sluice.writes` (all zero for a router without shards).
fn server_status(state: &Arc<ServerState>, cluster: Option<&Arc<ShardedCluster>>) -> Document {
    let mut d = server_info::server_status(state);
    let writes = match cluster {
        Some(c) => c.writes.to_document(),
        None => crate::write::WriteStats::default().to_document(),
    };
    if let Ok(sluice) = d.get_document_mut("sluice") {
        sluice.insert("writes", writes);
    }
    d
}

/// `killAllSessions`, `killAllSessionsByPattern`, `killSessions`: passed to every shard, as
/// mongos passes them (a shard that does not know the command is not an error: it holds no
/// session state to kill), then `{ok: 1}`.
async fn kill_sessions(
    cluster: Option<&Arc<ShardedCluster>>,
    req: &CommandRequest,
) -> Result<Document, CommandError> {
    let body = req.body_document();
    let arg = match body.get(&req.name) {
        Some(bson::Bson::Array(a)) => bson::Bson::Array(a.clone()),
        _ => {
            return Err(CommandError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{0}.{0}' is the wrong type, expected type 'array'",
                    req.name
                ),
            ))
        }
    };
    if let Some(sharded) = cluster {
        let cmd = doc! {req.name.clone(): arg, "$db": "admin"};
        for shard in sharded
            .cluster
            .shards()
            .iter()
            .map(|s| s.id.clone())
            .collect::<Vec<_>>()
        {
            let _ = sharded.cluster.run_on(&shard, &cmd).await;
        }
    }
    Ok(doc! {})
}

/// Binds the configured address and starts serving clients as a router without shards.
pub async fn start(config: Config, argv: Vec<String>) -> std::io::Result<RouterHandle> {
    start_router(config, argv, None).await
}

/// Binds the configured address and starts serving clients as the router of `cluster`.
pub async fn start_router(
    config: Config,
    argv: Vec<String>,
    cluster: Option<Arc<ShardedCluster>>,
) -> std::io::Result<RouterHandle> {
    if let Some(c) = &cluster {
        c.cluster.set_stage_memory(config.stage_memory_bytes);
    }
    let interval = std::time::Duration::from_millis(config.uptime_report_interval_ms);
    let reported = cluster.clone();
    let handle =
        crate::frontend::start_service(config, argv, |state| Arc::new(Router::new(state, cluster)))
            .await?;
    if let Some(c) = &reported {
        uptime::spawn(c, &handle, interval);
    }
    Ok(handle)
}

/// Opens the metadata, registers the shards (refusing a list that contradicts persisted
/// metadata), connects pools and shards the configured collections.
pub async fn bootstrap(
    metadata_path: Option<std::path::PathBuf>,
    shards: &[ShardInfo],
    collections: &[crate::config::CollectionConfig],
    pool: PoolOptions,
    batching: &crate::config::BatchingConfig,
) -> Result<Arc<ShardedCluster>, String> {
    let store = Arc::new(StaticStore::open(metadata_path).map_err(|e| e.message)?);
    store.set_shards(shards).map_err(|e| e.message)?;
    let source = store.clone();
    let routing = RoutingTable::new(Arc::new(move |ns: &str| source.load_collection(ns)));
    let cluster = Arc::new(Cluster::new(store.shards(), routing, pool, batching));
    cluster.warm_pools().await;
    let cluster = Arc::new(ShardedCluster::new(cluster, store, batching));
    shard_collections(&cluster, collections).await?;
    Ok(cluster)
}

/// Shards the collections of a configuration (`[[collections]]`) through `cluster`, as
/// `shardCollection` does (through the config server in `--configdb` mode).
pub async fn shard_collections(
    cluster: &Arc<ShardedCluster>,
    collections: &[crate::config::CollectionConfig],
) -> Result<(), String> {
    for c in collections {
        let key = c.key_document().map_err(|e| e.to_string())?;
        let mut body =
            bson::doc! {"shardCollection": &c.ns, "key": key, "unique": c.unique, "$db": "admin"};
        if let Some(n) = c.num_initial_chunks {
            body.insert("numInitialChunks", n as i64);
        }
        let req = CommandRequest::from_document("admin", &body).map_err(|e| e.message)?;
        sharding::shard_collection(Some(cluster), &req)
            .await
            .map_err(|e| format!("cannot shard {}: {}", c.ns, e.message))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dispatch_table_knows_mongos_commands_and_nothing_internal() {
        use route::Forwarded as F;
        assert_eq!(Handler::of("isMaster"), Some(Handler::Hello));
        assert_eq!(
            Handler::of("insert"),
            Some(Handler::Forward(F::Write(
                crate::command::WriteKind::Insert
            )))
        );
        assert_eq!(
            Handler::of("findandmodify"),
            Some(Handler::Forward(F::FindAndModify))
        );
        assert_eq!(
            Handler::of("listCollections"),
            Some(Handler::Forward(F::Other))
        );
        // The lower-case spellings mongos accepts reach the primary shard as they are.
        assert_eq!(Handler::of("dbstats"), Some(Handler::Forward(F::Other)));
        for internal in [
            "_shardsvrMoveRange",
            "_configsvrCommitChunkMigration",
            "_configsvrCommitChunkSplit",
            "_configsvrCommitChunksMerge",
            "_configsvrBalancerStart",
            "_configsvrCreateDatabase",
            "_shardsvrCreateCollection",
            "_shardsvrDropCollection",
            "_shardsvrDropDatabase",
            "_sluiceCommitShardCollection",
            "_sluiceCommitDropDatabase",
            "splitChunk",
            "_configsvrAddShard",
            "sluiceSetLatency",
            "sluiceSetShardVersion",
            "configureFailPoint",
            "noSuchCommand",
        ] {
            assert_eq!(Handler::of(internal), None, "{internal}");
        }
    }
}
