//! `serverStatus`: per-command counters (`metrics.commands.<name>`) and `opcounters`.

use bson::{doc, Document};

use super::ShardService;
use crate::command::server_info;
use crate::sync::lock;

/// The counter of commands the server does not have (`metrics.commands.<UNKNOWN>`).
pub(super) const UNKNOWN: &str = "<UNKNOWN>";

/// Per-command counters (`metrics.commands.<name>`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct CommandCount {
    total: i64,
    failed: i64,
}

impl ShardService {
    /// `metrics.commands.<name>.total` for one command.
    pub fn command_total(&self, name: &str) -> i64 {
        lock(&self.counts).get(name).map(|c| c.total).unwrap_or(0)
    }

    /// `metrics.commands.<name>.failed` for one command (its error replies).
    pub fn command_failed(&self, name: &str) -> i64 {
        lock(&self.counts).get(name).map(|c| c.failed).unwrap_or(0)
    }

    pub(in crate::embedded) fn bump_opcounter(&self, name: &'static str, by: i64) {
        *lock(&self.opcounters).entry(name).or_insert(0) += by;
    }

    pub(super) fn count_command(&self, name: &str, failed: bool) {
        let mut counts = lock(&self.counts);
        let c = counts.entry(name.to_string()).or_default();
        c.total += 1;
        if failed {
            c.failed += 1;
        }
    }

    pub(super) fn server_status(&self) -> Document {
        let mut d = server_info::server_status(&self.state);
        d.insert("process", "mongod");
        let repl = match &self.member {
            Some(m) => m.repl_status(),
            None => doc! {"setName": &self.options.set_name, "isWritablePrimary": true},
        };
        d.insert("repl", repl);
        // mongod reports the commands it does not have as one number, `<UNKNOWN>`, first.
        let counts = lock(&self.counts);
        let unknown = counts.get(UNKNOWN).map_or(0, |c| c.total);
        let mut commands = doc! {UNKNOWN: unknown};
        for (name, c) in counts.iter().filter(|(name, _)| name.as_str() != UNKNOWN) {
            commands.insert(name.clone(), doc! {"failed": c.failed, "total": c.total});
        }
        drop(counts);
        let mut ops = doc! {"insert": 0i64, "query": 0i64, "update": 0i64, "delete": 0i64, "getmore": 0i64, "command": 0i64};
        for (k, v) in lock(&self.opcounters).iter() {
            ops.insert(*k, *v);
        }
        d.insert("opcounters", ops);
        d.insert("metrics", doc! {"commands": commands});
        d
    }
}
