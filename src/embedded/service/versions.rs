//! Shard versions: what `sluiceSetShardVersion` recorded, and the check of a versioned
//! request's `shardVersion` / `databaseVersion` against it.

use bson::{doc, Bson, Document};

use super::ShardService;
use crate::engine::EngineError;
use crate::sync::lock;
use crate::value::compare::values_equal;
use crate::value::error_codes::ErrorCode;

impl ShardService {
    /// Checks a versioned request against the version this shard was given for `ns`.
    pub(in crate::embedded) fn check_version(
        &self,
        ns: &str,
        body: &Document,
    ) -> Result<(), EngineError> {
        let versions = lock(&self.versions);
        let db = ns.split('.').next().unwrap_or(ns);
        if let (Some(received), Some(wanted)) = (body.get("databaseVersion"), versions.get(db)) {
            if !values_equal(received, &Bson::Document(wanted.clone())) {
                return Err(EngineError::new(
                    ErrorCode::StaleDbVersion,
                    format!("version mismatch detected for {db}"),
                )
                .with_extra(doc! {
                    "db": db,
                    "vReceived": received.clone(),
                    "vWanted": wanted.clone(),
                }));
            }
        }
        let Some(received) = body.get("shardVersion") else {
            return Ok(());
        };
        let Some(wanted) = versions.get(ns) else {
            return Ok(());
        };
        if values_equal(received, &Bson::Document(wanted.clone())) {
            return Ok(());
        }
        Err(crate::embedded::filtering::stale_config(
            ns,
            received,
            wanted.clone(),
            &self.options.set_name,
        ))
    }

    pub(super) fn set_shard_version(&self, body: &Document) -> Result<Document, EngineError> {
        let ns = body.get_str("sluiceSetShardVersion").map_err(|_| {
            EngineError::new(
                ErrorCode::TypeMismatch,
                "sluiceSetShardVersion takes a namespace string",
            )
        })?;
        // `{sluiceSetShardVersion: "db", databaseVersion: {uuid, timestamp, lastMod}}`: the
        // database version this shard checks `databaseVersion` against.
        let field = if ns.contains('.') {
            "shardVersion"
        } else {
            "databaseVersion"
        };
        match body.get(field) {
            Some(Bson::Document(v)) => {
                lock(&self.versions).insert(ns.to_string(), v.clone());
            }
            Some(Bson::Null) | None => {
                lock(&self.versions).remove(ns);
            }
            Some(_) => {
                return Err(EngineError::new(
                    ErrorCode::TypeMismatch,
                    "shardVersion must be a document {e, t, v}",
                ))
            }
        }
        Ok(Document::new())
    }
}
