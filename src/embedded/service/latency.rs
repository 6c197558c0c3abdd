//! Modelling a slow or saturated shard: the concurrency cap and the injected latency that data
//! commands pay (`sluiceSetLatency`).

use std::time::Duration;

use bson::Document;
use tokio::sync::SemaphorePermit;

use super::ShardService;
use crate::command::CommandRequest;
use crate::engine::EngineError;
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;

/// Commands that touch data: they pay the injected latency and take a concurrency slot.
const DATA_COMMANDS: &[&str] = &[
    "insert",
    "update",
    "delete",
    "bulkWrite",
    "find",
    "getMore",
    "aggregate",
    "count",
    "distinct",
    "findAndModify",
    "findandmodify",
];

/// Largest latency `sluiceSetLatency` accepts, per command or per document.
const MAX_INJECTED_LATENCY_MICROS: i64 = 60_000_000;

impl ShardService {
    /// A data command waits for a concurrency slot, then pays the injected latency; the slot is
    /// held while the returned permit lives. Other commands pass straight through.
    pub(super) async fn admit(&self, req: &CommandRequest) -> Option<SemaphorePermit<'_>> {
        if DATA_COMMANDS.contains(&req.name.as_str()) {
            let permit = match &self.slots {
                Some(s) => s.acquire().await.ok(),
                None => None,
            };
            let (per_cmd, per_doc) = *lock(&self.latency);
            let docs = crate::embedded::commands::statement_count(req) as u32;
            let delay = per_cmd + per_doc * docs;
            if !delay.is_zero() {
                precise_sleep(delay).await;
            }
            permit
        } else {
            None
        }
    }

    pub(super) fn set_latency(&self, body: &Document) -> Result<Document, EngineError> {
        let micros = |field: &str| {
            let v = crate::value::field::number_field(body, field).unwrap_or(0);
            if !(0..=MAX_INJECTED_LATENCY_MICROS).contains(&v) {
                return Err(EngineError::new(
                    ErrorCode::BadValue,
                    format!("{field} must be between 0 and {MAX_INJECTED_LATENCY_MICROS}"),
                ));
            }
            Ok(v as u64)
        };
        let per_cmd = micros("perCommandMicros")?;
        let per_doc = micros("perDocumentMicros")?;
        *lock(&self.latency) = (
            Duration::from_micros(per_cmd),
            Duration::from_micros(per_doc),
        );
        Ok(Document::new())
    }
}

/// Waits `delay` with the precision of the OS's sleep (tens of microseconds) rather than the
/// async timer's millisecond ticks, which would add up to a millisecond to every injected
/// latency and distort the modelled round trips; the wait runs on the blocking pool.
async fn precise_sleep(delay: Duration) {
    if tokio::task::spawn_blocking(move || std::thread::sleep(delay))
        .await
        .is_err()
    {
        tokio::time::sleep(delay).await;
    }
}
