//! The router's entry in `config.mongos`, as mongos keeps its own: `{_id: "<host>:<port>",
//! ping, up, waiting: true, mongoVersion, advisoryHostFQDNs, created}`, upserted on the config
//! server when the router starts and every `uptime_report_interval_ms` after (10 s, mongos's
//! interval), so `sh.status()` and anything reading `config.mongos` see the routers that are
//! alive. Best effort: a failed report is logged and the next one tried. This is the only
//! document a router writes to `config.*`. docs/design/config-server.md.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};

use super::ShardedCluster;
use crate::frontend::RouterHandle;

/// The router's `_id` in `config.mongos`: the machine's host name and the port clients reach
/// it on, as mongos names itself (the listen address's IP where the host name is unknown).
pub fn instance_id(addr: SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| addr.ip().to_string());
    format!("{host}:{}", addr.port())
}

/// The update that records one report.
fn report_command(id: &str, created: bson::DateTime, up: Duration) -> Document {
    doc! {
        "update": "mongos",
        "updates": [{
            "q": {"_id": id},
            "u": {"$set": {
                "created": created,
                "ping": bson::DateTime::now(),
                "up": up.as_secs() as i64,
                "waiting": true,
                "mongoVersion": crate::command::server_info::MONGODB_VERSION,
                "advisoryHostFQDNs": Vec::<String>::new(),
            }},
            "upsert": true,
        }],
        "writeConcern": {"w": "majority"},
    }
}

/// Starts reporting `handle`'s router to its config server every `interval` until the router
/// shuts down. Nothing happens without a config server.
pub fn spawn(sharded: &Arc<ShardedCluster>, handle: &RouterHandle, interval: Duration) {
    if !sharded.has_config_server() {
        return;
    }
    let sharded = sharded.clone();
    let id = instance_id(handle.local_addr());
    let mut shutdown = handle.state().shutdown_signal();
    let started = Instant::now();
    let created = bson::DateTime::now();
    let interval = interval.max(Duration::from_millis(10));
    tokio::spawn(async move {
        loop {
            if *shutdown.borrow() {
                break;
            }
            if let Some(cs) = sharded.config_server() {
                let command = report_command(&id, created, started.elapsed());
                match cs.source.run_command_in("config", command).await {
                    Ok(reply) if reply.contains_key("writeErrors") => {
                        tracing::warn!(id = %id, reply = %reply, "cannot record the router in config.mongos");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(id = %id, error = %e, "cannot record the router in config.mongos");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                r = shutdown.changed() => if r.is_err() { break },
            }
        }
    });
}
