//! Stale errors from shards, read into what the cache must do.
//!
//! A shard checks the versions a request carries and answers, when they differ from its own:
//!
//! | code | name | extra fields |
//! |---|---|---|
//! | 13388 | StaleConfig | `ns`, `vReceived`, `vWanted` (absent: the shard does not know yet), `shardId` |
//! | 150 | StaleEpoch | `ns`, `vReceived`, `vWanted` (both optional) |
//! | 249 | StaleDbVersion | `db`, `vReceived`, `vWanted` (optional) |
//!
//! The extra fields sit at the top level of a command error and of a write error
//! (`writeErrors[i]`) in MongoDB 5.0+, and inside `errInfo` in 4.2-era write errors; both are
//! read. A field that does not parse counts as absent: the worst outcome is one forced refresh,
//! never a failed request.

use bson::{Bson, Document};

use crate::backend::topology::Printer;
use crate::value::error_codes::ErrorCode;

use super::version::{DatabaseVersion, ShardVersion};

/// Stale retries of a command that is not a write (`kMaxNumStaleVersionRetries`).
pub const MAX_STALE_RETRIES: u32 = 10;

/// Rounds of the write executor without progress before `NoProgressMade`.
pub const MAX_WRITE_ROUNDS_WITHOUT_PROGRESS: u32 = 5;

/// One stale error, with what it names.
#[derive(Debug, Clone, PartialEq)]
pub enum StaleError {
    /// StaleConfig (13388) or StaleEpoch (150): a collection's routing differs.
    Collection {
        /// 13388 or 150.
        code: ErrorCode,
        /// The namespace the shard checked (`None` if the error did not say).
        ns: Option<String>,
        /// The version the request carried.
        received: Option<ShardVersion>,
        /// The shard's own version (`None`: the shard does not know it yet).
        wanted: Option<ShardVersion>,
        /// The shard that answered.
        shard: Option<String>,
    },
    /// StaleDbVersion (249): a database's primary or incarnation differs.
    Database {
        /// The database (`None` if the error did not say).
        db: Option<String>,
        /// The version the request carried.
        received: Option<DatabaseVersion>,
        /// The shard's version.
        wanted: Option<DatabaseVersion>,
    },
}

/// What the cache must do about a stale error.
#[derive(Debug, Clone, PartialEq)]
pub enum RefreshAction {
    /// Refresh the collection until it holds at least `at_least` (`None`: refresh whatever
    /// it holds).
    Collection {
        /// The namespace.
        ns: String,
        /// The version the shard wanted.
        at_least: Option<ShardVersion>,
    },
    /// Refresh the database until it holds at least `at_least` (`None`: whatever it holds).
    Database {
        /// The database.
        db: String,
        /// The version the shard wanted.
        at_least: Option<DatabaseVersion>,
    },
}

/// Whether `code` is one of the stale codes the cache reacts to.
pub fn is_stale_code(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::StaleConfig | ErrorCode::StaleEpoch | ErrorCode::StaleDbVersion
    )
}

fn code_of(doc: &Document) -> Option<ErrorCode> {
    match doc.get("code")? {
        Bson::Int32(c) => Some(ErrorCode(*c)),
        Bson::Int64(c) => i32::try_from(*c).ok().map(ErrorCode),
        Bson::Double(c) if c.fract() == 0.0 && c.abs() <= i32::MAX as f64 => {
            Some(ErrorCode(*c as i32))
        }
        _ => None,
    }
}

impl StaleError {
    /// Reads one error document (a failed command reply or one write error); `None` when it is
    /// not a stale error.
    pub fn from_error(err: &Document, printer: &Printer) -> Option<StaleError> {
        let code = code_of(err).filter(|c| is_stale_code(*c))?;
        // 4.2-era write errors keep the fields in errInfo; newer ones at the top level.
        let info = match err.get("errInfo") {
            Some(Bson::Document(i)) if !err.contains_key("vReceived") => i,
            _ => err,
        };
        let string = |k: &str| info.get_str(k).ok().map(str::to_string);
        if code == ErrorCode::StaleDbVersion {
            let version = |k: &str| {
                info.get(k)
                    .and_then(|v| DatabaseVersion::from_bson(v, printer).ok())
            };
            return Some(StaleError::Database {
                db: string("db"),
                received: version("vReceived"),
                wanted: version("vWanted"),
            });
        }
        let version = |k: &str| {
            info.get(k)
                .and_then(|v| ShardVersion::from_bson(v, printer).ok())
        };
        Some(StaleError::Collection {
            code,
            ns: string("ns"),
            received: version("vReceived"),
            wanted: version("vWanted"),
            shard: string("shardId"),
        })
    }

    /// Every stale error in a shard's reply: the command's own error and each write error.
    pub fn from_reply(reply: &Document, printer: &Printer) -> Vec<StaleError> {
        let mut out = Vec::new();
        if let Some(e) = Self::from_error(reply, printer) {
            out.push(e);
        }
        if let Ok(errors) = reply.get_array("writeErrors") {
            for e in errors.iter().filter_map(Bson::as_document) {
                if let Some(s) = Self::from_error(e, printer) {
                    out.push(s);
                }
            }
        }
        out
    }

    /// What the cache must do; `request_ns` is the namespace the request targeted (mongos
    /// refreshes it too when the error names another one, e.g. a time-series buckets
    /// collection, and uses it when the error names none).
    pub fn actions(&self, request_ns: &str) -> Vec<RefreshAction> {
        match self {
            StaleError::Collection { ns, wanted, .. } => {
                let named = ns.clone().unwrap_or_else(|| request_ns.to_string());
                let mut out = vec![RefreshAction::Collection {
                    ns: named.clone(),
                    at_least: *wanted,
                }];
                if named != request_ns {
                    out.push(RefreshAction::Collection {
                        ns: request_ns.to_string(),
                        at_least: None,
                    });
                }
                out
            }
            StaleError::Database { db, wanted, .. } => {
                let db = db.clone().unwrap_or_else(|| {
                    request_ns
                        .split_once('.')
                        .map(|(d, _)| d)
                        .unwrap_or(request_ns)
                        .to_string()
                });
                vec![RefreshAction::Database {
                    db,
                    at_least: *wanted,
                }]
            }
        }
    }
}

/// Whether a cache holding `cached` must refresh for a stale error that wanted `wanted`:
/// always without a wanted version (mongos's forced refresh), otherwise only when the wanted
/// version is newer than what the cache holds (else the shard is the one behind, and a retry
/// with the cached version succeeds once it has caught up).
pub fn collection_needs_refresh(
    cached: Option<&ShardVersion>,
    wanted: Option<&ShardVersion>,
) -> bool {
    match (cached, wanted) {
        (_, None) | (None, _) => true,
        (Some(c), Some(w)) => w.is_newer_than(c),
    }
}

/// The database counterpart of [`collection_needs_refresh`].
pub fn database_needs_refresh(
    cached: Option<&DatabaseVersion>,
    wanted: Option<&DatabaseVersion>,
) -> bool {
    match (cached, wanted) {
        (_, None) | (None, _) => true,
        (Some(c), Some(w)) => w.is_newer_than(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::configsvr::test_support::PRINTER;
    use crate::metadata::configsvr::version::CollectionGeneration;
    use crate::routing::ChunkVersion;
    use bson::{doc, oid::ObjectId, Timestamp, Uuid};

    fn sv(epoch: ObjectId, major: u32, minor: u32) -> ShardVersion {
        ShardVersion {
            generation: CollectionGeneration {
                epoch,
                timestamp: Timestamp {
                    time: 100,
                    increment: 1,
                },
            },
            placement: ChunkVersion { major, minor },
        }
    }

    #[test]
    fn command_level_stale_config() {
        let e = ObjectId::new();
        let reply = doc! {
            "ok": 0.0,
            "errmsg": "version mismatch detected for db.c",
            "code": 13388,
            "codeName": "StaleConfig",
            "ns": "db.c",
            "vReceived": sv(e, 1, 5).to_document(),
            "vWanted": sv(e, 2, 1).to_document(),
            "shardId": "shard1",
        };
        let found = StaleError::from_reply(&reply, &PRINTER);
        assert_eq!(
            found,
            vec![StaleError::Collection {
                code: ErrorCode::StaleConfig,
                ns: Some("db.c".into()),
                received: Some(sv(e, 1, 5)),
                wanted: Some(sv(e, 2, 1)),
                shard: Some("shard1".into()),
            }]
        );
        assert_eq!(
            found[0].actions("db.c"),
            vec![RefreshAction::Collection {
                ns: "db.c".into(),
                at_least: Some(sv(e, 2, 1))
            }]
        );
    }

    #[test]
    fn write_errors_in_both_layouts() {
        let e = ObjectId::new();
        let reply = doc! {
            "ok": 1.0,
            "n": 1,
            "writeErrors": [
                {"index": 0, "code": 11000, "errmsg": "dup"},
                // 5.0+: the extra fields beside code and errmsg.
                {"index": 1, "code": 13388, "errmsg": "stale", "ns": "db.c",
                 "vReceived": sv(e, 1, 0).to_document(), "shardId": "s0"},
                // 4.2: inside errInfo.
                {"index": 2, "code": 13388, "errmsg": "stale",
                 "errInfo": {"ns": "db.d", "vReceived": sv(e, 1, 0).to_document(),
                             "vWanted": sv(e, 1, 1).to_document(), "shardId": "s1"}},
                {"index": 3, "code": 249, "errmsg": "stale db", "db": "db",
                 "vReceived": {"uuid": Uuid::from_bytes([1; 16]), "timestamp": Timestamp { time: 1, increment: 1 }, "lastMod": 1}},
            ],
        };
        let found = StaleError::from_reply(&reply, &PRINTER);
        assert_eq!(found.len(), 3);
        assert!(
            matches!(&found[0], StaleError::Collection { wanted: None, ns: Some(n), .. } if n == "db.c")
        );
        assert!(
            matches!(&found[1], StaleError::Collection { wanted: Some(w), ns: Some(n), shard: Some(s), .. }
            if n == "db.d" && *w == sv(e, 1, 1) && s == "s1")
        );
        assert!(
            matches!(&found[2], StaleError::Database { db: Some(d), received: Some(_), wanted: None } if d == "db")
        );
        // No vWanted: a forced refresh.
        assert_eq!(
            found[0].actions("db.c"),
            vec![RefreshAction::Collection {
                ns: "db.c".into(),
                at_least: None
            }]
        );
        assert_eq!(
            found[2].actions("db.c"),
            vec![RefreshAction::Database {
                db: "db".into(),
                at_least: None
            }]
        );
    }

    #[test]
    fn another_namespace_refreshes_both_and_missing_fields_fall_back() {
        let err = doc! {"ok": 0, "code": 150, "errmsg": "epoch", "ns": "db.system.buckets.t"};
        let found = StaleError::from_reply(&err, &PRINTER);
        assert_eq!(
            found[0].actions("db.t"),
            vec![
                RefreshAction::Collection {
                    ns: "db.system.buckets.t".into(),
                    at_least: None
                },
                RefreshAction::Collection {
                    ns: "db.t".into(),
                    at_least: None
                },
            ]
        );
        // Malformed extra info: still a stale error, refreshing the request's namespace.
        let err = doc! {"ok": 0, "code": 13388, "errmsg": "x", "ns": 5, "vWanted": "junk"};
        let found = StaleError::from_reply(&err, &PRINTER);
        assert_eq!(
            found[0].actions("a.b"),
            vec![RefreshAction::Collection {
                ns: "a.b".into(),
                at_least: None
            }]
        );
        let err = doc! {"ok": 0, "code": 249i64, "errmsg": "x"};
        assert_eq!(
            StaleError::from_reply(&err, &PRINTER)[0].actions("a.b"),
            vec![RefreshAction::Database {
                db: "a".into(),
                at_least: None
            }]
        );
        assert!(StaleError::from_reply(&doc! {"ok": 0, "code": 11000}, &PRINTER).is_empty());
        assert!(StaleError::from_reply(&doc! {"ok": 1}, &PRINTER).is_empty());
    }

    #[test]
    fn refresh_only_when_the_shard_is_ahead() {
        let e = ObjectId::new();
        assert!(collection_needs_refresh(Some(&sv(e, 1, 0)), None));
        assert!(collection_needs_refresh(None, Some(&sv(e, 1, 0))));
        assert!(collection_needs_refresh(
            Some(&sv(e, 1, 0)),
            Some(&sv(e, 2, 0))
        ));
        assert!(!collection_needs_refresh(
            Some(&sv(e, 2, 0)),
            Some(&sv(e, 2, 0))
        ));
        assert!(!collection_needs_refresh(
            Some(&sv(e, 3, 0)),
            Some(&sv(e, 2, 0))
        ));
        let d = |m: i32| DatabaseVersion {
            uuid: Uuid::from_bytes([1; 16]),
            timestamp: Timestamp {
                time: 1,
                increment: 1,
            },
            last_mod: m,
        };
        assert!(database_needs_refresh(Some(&d(1)), Some(&d(2))));
        assert!(!database_needs_refresh(Some(&d(2)), Some(&d(2))));
        assert!(database_needs_refresh(Some(&d(2)), None));
    }
}
