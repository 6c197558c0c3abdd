//! The idle monitor: cursors and sessions' retry records unused past their timeout are dropped
//! on a timer, as mongod's cursor monitor does.

use std::sync::Arc;
use std::time::Duration;

use super::{ShardService, SESSION_IDLE_TIMEOUT};
use crate::sync::lock;

/// How often the shard's idle monitor looks for cursors and sessions past their timeout
/// (mongod's `clientCursorMonitorFrequencySecs`, 4 seconds), never less often than a quarter of
/// the cursor timeout.
const IDLE_MONITOR_PERIOD: Duration = Duration::from_secs(4);

/// Starts the task that drops idle cursors and idle sessions' retry records on a timer, as
/// mongod's cursor monitor does, so an abandoned cursor's buffered documents are released
/// without waiting for the cursor table to fill. The task holds the shard weakly and ends with
/// it.
pub fn spawn_idle_monitor(service: &Arc<ShardService>) {
    let weak = Arc::downgrade(service);
    let period = IDLE_MONITOR_PERIOD
        .min(service.options.cursor_timeout / 4)
        .max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(service) = weak.upgrade() else {
                return;
            };
            service.reap_idle();
        }
    });
}

/// Most cursors one shard keeps open; opening one more first reaps idle cursors, then drops
/// the least recently used one.
pub const MAX_OPEN_CURSORS: usize = 10_000;

impl ShardService {
    /// Drops cursors unread for longer than the cursor timeout and sessions' retry records
    /// unused for longer than [`SESSION_IDLE_TIMEOUT`].
    pub fn reap_idle(&self) {
        self.cursors.reap_idle();
        lock(&self.sessions).retain(|_, r| r.last_used.elapsed() < SESSION_IDLE_TIMEOUT);
    }
}
