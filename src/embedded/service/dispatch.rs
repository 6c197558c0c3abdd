//! Dispatch: the order every command goes through (test-only gate, failpoint, replica-set
//! member checks, config-server and shard-server internal commands, shard filtering, the
//! concurrency cap and latency, then the command itself), and the [`Service`] contract.

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};

use super::{lock, ShardService, TEST_ONLY_COMMANDS};
use crate::command::{
    self, hello, server_info, BoxFuture, ClientState, CommandRequest, Response, ServerState,
    Service,
};
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;

impl ShardService {
    async fn run(
        &self,
        client: &mut ClientState,
        req: &CommandRequest,
    ) -> Result<Option<Document>, EngineError> {
        let name = req.name.as_str();
        if TEST_ONLY_COMMANDS.contains(&name) && !self.options.enable_test_commands {
            return Err(EngineError::new(
                ErrorCode::CommandNotFound,
                format!("no such command: '{name}'"),
            ));
        }
        let body = req.body_document();
        let failpoint = if name == "configureFailPoint" {
            None
        } else {
            self.failpoints.fire(client, name)
        };
        if let Some(fp) = &failpoint {
            if let Some(block) = fp.block {
                tokio::time::sleep(block).await;
            }
            if fp.close_connection {
                return Ok(None);
            }
            if let Some(e) = fp.error(name, &body) {
                let mut err = EngineError::new(e.code, e.message);
                if !e.labels.is_empty() {
                    err = err.with_extra(doc! {"errorLabels": e.labels});
                } else if fp.error_labels.is_some() {
                    // The fail point's own empty list: no label is added later either.
                    err = err.with_extra(doc! {"errorLabels": Bson::Array(Vec::new())});
                }
                return Err(err);
            }
        }

        if let Some(member) = &self.member {
            member.check(name, &body)?;
        }
        if self.options.config_server {
            match name {
                "_configsvrMoveRange" => {
                    check_admin(req)?;
                    return self
                        .migrations
                        .configsvr_move_range(&self.catalog, &body)
                        .await
                        .map(Some);
                }
                "_configsvrAddShard" => {
                    check_admin(req)?;
                    return crate::embedded::configsvr_ddl::add_shard(
                        self,
                        &self.migrations,
                        &body,
                    )
                    .await
                    .map(Some);
                }
                "_configsvrRemoveShard" => {
                    check_admin(req)?;
                    return crate::embedded::remove_shard::remove_shard(
                        &self.catalog,
                        &self.migrations,
                        &self.drains,
                        &body,
                    )
                    .map(Some);
                }
                "_configsvrCommitChunkMigration" => {
                    check_admin(req)?;
                    return crate::embedded::migration::commit_chunk_migration(
                        &self.catalog,
                        &body,
                        self.cluster_time(),
                    )
                    .map(Some);
                }
                _ => {}
            }
        }
        if name == "_shardsvrAddShard" && !self.options.config_server {
            check_admin(req)?;
            return crate::embedded::cluster_ddl::add_shard_identity(&self.catalog, &body)
                .map(Some);
        }
        // Held while a versioned request runs, so no critical section begins under it.
        let mut _versioned = None;
        // A shard server's check of a `bulkWrite`'s namespaces, by `nsInfo` index.
        let mut bulk_checked = Vec::new();
        if let Some(filtering) = &self.filtering {
            match name {
                "_flushRoutingTableCacheUpdates" | "_flushDatabaseCacheUpdates" => {
                    return filtering.flush(name, &body).await.map(Some);
                }
                "_shardsvrMoveRange" => {
                    check_admin(req)?;
                    let donor = self.donor(filtering);
                    return crate::embedded::migration::move_range(donor, body)
                        .await
                        .map(Some);
                }
                _ if crate::embedded::cluster_ddl::COMMANDS.contains(&name) => {
                    let shard = self.donor(filtering);
                    return crate::embedded::cluster_ddl::run(shard, req, body)
                        .await
                        .map(Some);
                }
                "_recvChunkStart" => {
                    check_admin(req)?;
                    return self.migrations.recv_start(&body).map(Some);
                }
                "_sluiceRecvChunkMods" => {
                    check_admin(req)?;
                    return self.migrations.recv_mods(&body).map(Some);
                }
                "_recvChunkCommit" => {
                    check_admin(req)?;
                    return self
                        .migrations
                        .recv_commit(&self.catalog, &body)
                        .await
                        .map(Some);
                }
                "_recvChunkAbort" => {
                    check_admin(req)?;
                    return self.migrations.recv_abort(&self.catalog, &body).map(Some);
                }
                "_recvChunkReleaseCritSec" => {
                    check_admin(req)?;
                    return self
                        .migrations
                        .recv_release(filtering, &body)
                        .await
                        .map(Some);
                }
                _ => {}
            }
            if name == "bulkWrite" {
                (_versioned, bulk_checked) = crate::embedded::bulk_write::check_namespaces(
                    filtering,
                    &self.migrations,
                    self.name(),
                    req,
                )
                .await;
            }
            if let Some(ns) = req.namespace.as_deref() {
                if body.contains_key("shardVersion") || body.contains_key("databaseVersion") {
                    _versioned = Some(self.migrations.enter(ns).await);
                }
                if let Err(e) = filtering.check(self.name(), ns, &body).await {
                    // Writes report it as the first statement's error, as mongod does.
                    if matches!(name, "insert" | "update" | "delete") {
                        return Ok(Some(crate::embedded::commands::stale_write_reply(
                            e,
                            name == "update",
                        )));
                    }
                    return Err(e);
                }
            }
        }

        let _slot = self.admit(req).await;

        let txn = super::txn::transaction_request(name, &body)?;
        // Held until the command is done: see `prepare_gate`.
        let _prepare = self.prepare_gate(req, txn.as_ref()).await?;
        if let Some(txn) = txn {
            let mut reply = self.run_transaction(req, &body, txn)?;
            if let Some(member) = &self.member {
                if matches!(
                    name,
                    "commitTransaction"
                        | "abortTransaction"
                        | "prepareTransaction"
                        | "coordinateCommitTransaction"
                ) {
                    if let Some(wce) = member.wait_for_write_concern(&body).await {
                        reply.insert("writeConcernError", wce);
                    }
                }
            }
            if let Some(fp) = &failpoint {
                fp.decorate(name, &body, &mut reply);
            }
            return Ok(Some(reply));
        }
        self.check_sharded_view(req).await?;
        if let Some(at) = super::snapshot::snapshot_request(name, &body, req.body.raw())? {
            if let Some(t) = at {
                self.state.clock.advance_to(t);
            }
            let (view, at) = super::snapshot::view_for(
                &self.snapshots,
                at,
                self.state.clock.tick(),
                &self.catalog,
            )?;
            let mut reply = {
                let _scope = super::txn::ViewScope::enter(view);
                crate::embedded::commands::run(self, req, &body, None)?
            };
            command::stamp_at_cluster_time(&mut reply, at);
            if let Some(fp) = &failpoint {
                fp.decorate(name, &body, &mut reply);
            }
            return Ok(Some(reply));
        }
        let mut reply = match name {
            "hello" | "isMaster" | "ismaster" => {
                if let Some(link) = &self.member {
                    link.await_change(&body, self.state.shutdown_signal()).await;
                }
                let member = self.member();
                let mut d =
                    hello::hello(&self.state, client, req, hello::Role::Primary(&member)).await?;
                if let Some(link) = &self.member {
                    link.hello_fields(name, &mut d);
                }
                if self.options.config_server {
                    // mongod started with `--configsvr` (`ClusterRole::ConfigServer`).
                    d.insert("configsvr", 2);
                }
                d
            }
            "ping" => Document::new(),
            "buildInfo" | "buildinfo" => {
                let mut b = server_info::build_info();
                b.insert("storageEngines", vec!["memory"]);
                b
            }
            "serverStatus" => self.server_status(),
            "getParameter" => server_info::get_parameter(
                req,
                &server_info::Parameters {
                    enable_test_commands: self.options.enable_test_commands,
                    stage_memory_bytes: self.options.stage_memory_bytes,
                },
            )?,
            "getLog" => server_info::get_log(req)?,
            "whatsmyuri" => doc! {"you": client.peer.to_string()},
            "connectionStatus" => server_info::connection_status(req),
            "endSessions" => {
                let reply = server_info::end_sessions(req)?;
                self.kill_sessions(name, &body);
                reply
            }
            // Open transactions are aborted; retryable-write history outlives a kill.
            "killAllSessions" | "killAllSessionsByPattern" | "killSessions" => {
                self.kill_sessions(name, &body);
                Document::new()
            }
            "getCmdLineOpts" => server_info::get_cmd_line_opts(&self.state),
            "configureFailPoint"
                if body.get_str("configureFailPoint").ok()
                    == Some("onPrimaryTransactionalWrite") =>
            {
                self.txn_write_failpoint.configure(&body)?
            }
            "configureFailPoint" => self.failpoints.configure(&body)?,
            "sluiceSetShardVersion" => self.set_shard_version(&body)?,
            _ if self.options.config_server && crate::embedded::configsvr::serves(name) => {
                crate::embedded::configsvr::run(self, req, &body)?
            }
            "sluiceSetLatency" => self.set_latency(&body)?,
            "shutdown" if self.member.is_some() => {
                let request = server_info::shutdown_request(&self.state, client.peer, req)?;
                if let Some(member) = &self.member {
                    member.shutdown(request).await?;
                }
                tracing::warn!(member = %lock(&self.address), "the shutdown command stops this member");
                // The listener closes and so does every connection, this one without a reply,
                // as mongod's exiting process leaves it.
                self.state.begin_shutdown();
                return Ok(None);
            }
            "replSetStepDown" | "replSetFreeze" | "replSetGetStatus" if self.member.is_some() => {
                let member = self.member.as_ref().ok_or_else(|| {
                    EngineError::new(ErrorCode::InternalError, "not a replica set member")
                })?;
                req.require_admin()?;
                match name {
                    "replSetStepDown" => member.step_down(&body)?,
                    "replSetFreeze" => member.freeze(&body)?,
                    _ => member.status(),
                }
            }
            _ => {
                let retry = if matches!(
                    name,
                    "insert"
                        | "update"
                        | "delete"
                        | "bulkWrite"
                        | "findAndModify"
                        | "findandmodify"
                ) {
                    let n = crate::embedded::commands::statement_count(req);
                    self.retry_ctx(&body, n)?
                } else {
                    None
                };
                let result = if name == "bulkWrite" {
                    crate::embedded::bulk_write::bulk_write(
                        self,
                        req,
                        retry.as_ref(),
                        &bulk_checked,
                    )
                } else {
                    crate::embedded::commands::run(self, req, &body, retry.as_ref())
                };
                if retry.as_ref().is_some_and(|r| r.close_after()) {
                    return Ok(None);
                }
                let mut reply = result?;
                if let Some(member) = &self.member {
                    if crate::embedded::replset::is_write(name) {
                        match member.take_after_write() {
                            Some(crate::embedded::replset::AfterWrite::CloseConnection) => {
                                return Ok(None)
                            }
                            Some(crate::embedded::replset::AfterWrite::StepDown) => {
                                member.step_down_now(Duration::from_secs(10));
                                return Err(EngineError::new(
                                    ErrorCode::InterruptedDueToReplStateChange,
                                    "operation was interrupted because a replica set state change occurred",
                                ));
                            }
                            Some(crate::embedded::replset::AfterWrite::StepDownAfterReply) => {
                                member.step_down_now(Duration::from_secs(10));
                                // Answer once the set has had time to elect another primary
                                // (and its monitors to hear of it).
                                tokio::time::sleep(Duration::from_millis(500)).await;
                            }
                            None => {}
                        }
                        if let Some(wce) = member.wait_for_write_concern(&body).await {
                            reply.insert("writeConcernError", wce);
                        }
                    }
                }
                reply
            }
        };
        if let Some(fp) = &failpoint {
            fp.decorate(name, &body, &mut reply);
        }
        Ok(Some(reply))
    }
}

impl ShardService {
    /// A read of a view whose source is a sharded collection cannot be answered from this
    /// shard's documents alone: as mongod, it answers 169 with the resolved view, and the
    /// router runs the read as an aggregation on the sharded source. A view whose pipeline
    /// reads a sharded collection (`$lookup`, `$graphLookup`, `$unionWith`) is answered so
    /// too: this shard holds only its own part of it, and the router reads it through the
    /// cluster.
    async fn check_sharded_view(&self, req: &CommandRequest) -> Result<(), EngineError> {
        if !matches!(
            req.name.as_str(),
            "find" | "count" | "distinct" | "aggregate"
        ) {
            return Ok(());
        }
        let Some((db, coll)) = req.namespace.as_deref().and_then(|ns| ns.split_once('.')) else {
            return Ok(());
        };
        let resolved = {
            let data = self.data();
            let cat = lock(&data);
            crate::embedded::views::resolve(&cat, db, coll)?
        };
        let Some((base, pipeline)) = resolved else {
            return Ok(());
        };
        let base_ns = format!("{db}.{base}");
        // The source, or a collection the view's `$lookup`/`$graphLookup`/`$unionWith` stages
        // read: this shard holds only its own part of a sharded one.
        let stages: Vec<Bson> = pipeline.iter().cloned().map(Bson::Document).collect();
        let mut read = vec![base_ns.clone()];
        read.extend(
            crate::engine::aggregate::foreign_collections(&stages)
                .into_iter()
                .map(|c| format!("{db}.{c}")),
        );
        let mut sharded = false;
        for ns in &read {
            sharded = match &self.filtering {
                Some(f) => f.is_sharded(ns).await?,
                None => lock(&self.versions).contains_key(ns),
            };
            if sharded {
                break;
            }
        }
        if !sharded {
            return Ok(());
        }
        Err(EngineError::new(
            ErrorCode::CommandOnShardedViewNotSupportedOnMongod,
            "Resolved views on sharded collections must be executed by mongos",
        )
        .with_extra(doc! {"resolvedView": {"ns": base_ns, "pipeline": pipeline}}))
    }
}

/// Internal commands run on `admin` only.
fn check_admin(req: &CommandRequest) -> Result<(), EngineError> {
    Ok(req.require_admin()?)
}

/// Labels a replica-set member's error `RetryableWriteError` when the command is a retryable
/// write (or a commit or abort) and the code is in the RetriableError category, as mongod does
/// for its clients, so a driver connected to the set retries a write refused by a member that
/// stepped down.
fn label_retryable_write_error(e: &mut EngineError, name: &str, body: &Document) {
    if !crate::command::failpoint::is_retryable_command(name, body)
        || !crate::backend::topology::retry::is_retriable_code(e.code.0)
    {
        return;
    }
    let mut extra = e.extra.take().unwrap_or_default();
    if !extra.contains_key("errorLabels") {
        extra.insert(
            "errorLabels",
            vec![crate::backend::topology::retry::RETRYABLE_WRITE_ERROR],
        );
    }
    e.extra = Some(extra);
}

impl Service for ShardService {
    fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// The users and roles are copied into `admin.system.users` and `admin.system.roles`
    /// after every change, as mongod keeps them: what a `--configdb` router reads from the
    /// embedded config server.
    fn user_store(&self) -> Option<crate::command::service::UserStore> {
        let catalog = self.catalog.clone();
        Some(crate::command::service::UserStore::Local(Arc::new(
            move |users, roles| {
                let mut catalog = crate::sync::lock(&catalog);
                for (coll, docs) in [("system.users", users), ("system.roles", roles)] {
                    super::super::store::replace_contents(&mut catalog, "admin", coll, docs);
                }
            },
        )))
    }

    fn handle<'a>(
        &'a self,
        client: &'a mut ClientState,
        req: &'a CommandRequest,
    ) -> BoxFuture<'a, Response> {
        Box::pin(async move {
            if let Some(member) = &self.member {
                member.wait_while_stalled().await;
            }
            let mut result = self.run(client, req).await;
            // Snapshot reads at a time before this command's writes must not see them.
            if super::snapshot::may_write(&req.name, req.body.raw()) {
                lock(&self.snapshots).wrote(self.state.clock.tick());
            }
            // A change to `config.*` is on disk before it is acknowledged.
            if self.metadata_file.is_some() && crate::embedded::configsvr::may_write(&req.name) {
                if let Err(e) = self.persist_metadata() {
                    tracing::error!(error = %e, "the config metadata was not persisted");
                    if result.is_ok() {
                        result = Err(EngineError::new(ErrorCode::InternalError, e.to_string()));
                    }
                }
            }
            if let Err(e) = &mut result {
                let body = req.body_document();
                let labelled = e
                    .extra
                    .as_ref()
                    .is_some_and(|x| x.contains_key("errorLabels"));
                if !labelled && crate::command::failpoint::in_transaction(&req.name, &body) {
                    super::txn::label_transaction_error(e, &req.name, false);
                }
                if self.member.is_some() {
                    label_retryable_write_error(e, &req.name, &body);
                }
                if let Some(x) = e.extra.as_mut() {
                    if matches!(x.get("errorLabels"), Some(Bson::Array(l)) if l.is_empty()) {
                        x.remove("errorLabels");
                    }
                }
            }
            // As mongod: a command it does not have is counted as `<UNKNOWN>`, so a client
            // sending made-up names cannot grow the table.
            let counted = match &result {
                Err(e) if e.code == ErrorCode::CommandNotFound => super::status::UNKNOWN,
                _ => req.name.as_str(),
            };
            let mut reply = match result {
                Ok(None) => {
                    self.count_command(counted, true);
                    if let Some(member) = &self.member {
                        member.wait_while_stalled().await;
                    }
                    return Response::CloseConnection;
                }
                Ok(Some(mut d)) => {
                    self.count_command(counted, false);
                    d.insert("ok", 1.0);
                    d
                }
                Err(e) => {
                    self.count_command(counted, true);
                    e.to_reply()
                }
            };
            command::append_cluster_time(&self.state, &mut reply);
            if let Some(member) = &self.member {
                member.wait_while_stalled().await;
            }
            Response::Reply(reply)
        })
    }
}
