//! Versions, as the config server stores them and as requests and stale errors carry them.
//!
//! - A collection's **generation** is `(lastmodEpoch, timestamp)`: it changes when the collection
//!   is dropped and recreated or its shard key refined, and never otherwise.
//! - A **placement version** is `major|minor` ([`ChunkVersion`], `config.chunks.lastmod`).
//! - A [`ShardVersion`] is both: what a request to a shard carries (`shardVersion: {e, t, v}` in
//!   MongoDB 6.0+) and what a StaleConfig error reports as received and wanted.
//! - A [`DatabaseVersion`] is `{uuid, timestamp, lastMod}` from `config.databases`: it changes
//!   when the database is dropped and recreated or its primary shard moves.

use std::cmp::Ordering;

use bson::{doc, oid::ObjectId, Bson, Document, Timestamp, Uuid};

use crate::backend::topology::Printer;
use crate::routing::ChunkVersion;
use crate::value::error_codes::ErrorCode;

use super::error::MetadataError;
use super::fields::Idl;

/// Orders two timestamps as MongoDB does: by seconds, then increment.
pub fn compare_timestamps(a: Timestamp, b: Timestamp) -> Ordering {
    (a.time, a.increment).cmp(&(b.time, b.increment))
}

/// One incarnation of a collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectionGeneration {
    /// `config.collections.lastmodEpoch`.
    pub epoch: ObjectId,
    /// `config.collections.timestamp`: the cluster time of the creation (or refine).
    pub timestamp: Timestamp,
}

impl CollectionGeneration {
    /// The generation of an untracked collection: an all-zero epoch and `Timestamp(0, 0)`.
    pub fn unsharded() -> Self {
        CollectionGeneration {
            epoch: ObjectId::from_bytes([0; 12]),
            timestamp: Timestamp {
                time: 0,
                increment: 0,
            },
        }
    }

    /// The generation that tells a shard to skip the check: epoch `00000000ffffffffffffffff`
    /// (zero time, maximal machine and counter) and the largest timestamp.
    pub fn ignored() -> Self {
        let mut bytes = [0xffu8; 12];
        bytes[..4].copy_from_slice(&[0; 4]);
        CollectionGeneration {
            epoch: ObjectId::from_bytes(bytes),
            timestamp: Timestamp {
                time: u32::MAX,
                increment: u32::MAX,
            },
        }
    }

    /// Whether this is the generation of an untracked collection.
    pub fn is_unsharded(&self) -> bool {
        *self == Self::unsharded()
    }
}

/// The version a request to one shard carries, and a StaleConfig error reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardVersion {
    /// The collection's generation.
    pub generation: CollectionGeneration,
    /// The shard's placement version (`0|0` for a shard that owns no chunk).
    pub placement: ChunkVersion,
}

impl ShardVersion {
    /// UNSHARDED: what a request for an untracked collection carries to the primary shard.
    pub fn unsharded() -> Self {
        ShardVersion {
            generation: CollectionGeneration::unsharded(),
            placement: ChunkVersion::default(),
        }
    }

    /// IGNORED: tells the shard not to check.
    pub fn ignored() -> Self {
        ShardVersion {
            generation: CollectionGeneration::ignored(),
            placement: ChunkVersion::default(),
        }
    }

    /// Whether this is UNSHARDED.
    pub fn is_unsharded(&self) -> bool {
        *self == Self::unsharded()
    }

    /// The MongoDB 6.0+ wire form: `{e: ObjectId, t: Timestamp, v: Timestamp(major, minor)}`.
    pub fn to_document(&self) -> Document {
        doc! {
            "e": self.generation.epoch,
            "t": self.generation.timestamp,
            "v": self.placement.timestamp(),
        }
    }

    /// Reads a shard version as shards send it in `vReceived` / `vWanted`: the 6.0+ object
    /// `{e, t, v}` (further fields such as `i` or `placementConflictTime` are ignored), or the
    /// 5.0 positional form `[v, e, t]` (also as an object `{0: v, 1: e, 2: t}`).
    pub fn from_bson(value: &Bson, printer: &Printer) -> Result<Self, MetadataError> {
        let positional = |items: Vec<&Bson>| -> Result<Self, MetadataError> {
            match items.as_slice() {
                [Bson::Timestamp(v), Bson::ObjectId(e), Bson::Timestamp(t), ..] => {
                    Ok(ShardVersion {
                        generation: CollectionGeneration {
                            epoch: *e,
                            timestamp: *t,
                        },
                        placement: ChunkVersion::from_timestamp(*v),
                    })
                }
                _ => Err(MetadataError::new(
                    ErrorCode::TypeMismatch,
                    format!(
                        "Invalid shard version {}: expected [Timestamp, ObjectId, Timestamp]",
                        (printer.value)(value)
                    ),
                )),
            }
        };
        match value {
            Bson::Array(a) => positional(a.iter().collect()),
            Bson::Document(d) if d.contains_key("0") => positional(d.values().collect()),
            Bson::Document(d) => {
                let idl = Idl {
                    doc: d,
                    ctx: "ShardVersion",
                    printer,
                };
                let epoch = match idl.get("e") {
                    Some(Bson::ObjectId(o)) => *o,
                    Some(v) => return Err(idl.wrong_type("e", v, "objectId")),
                    None => return Err(idl.missing("e")),
                };
                Ok(ShardVersion {
                    generation: CollectionGeneration {
                        epoch,
                        timestamp: idl.timestamp("t")?,
                    },
                    placement: ChunkVersion::from_timestamp(idl.timestamp("v")?),
                })
            }
            v => Err(MetadataError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "shard version must be an object, found {}",
                    (printer.type_name)(v)
                ),
            )),
        }
    }

    /// Whether a cache that holds `cached` must refresh to reach `self` (mongos's comparable
    /// versions): within one generation, a higher placement; across generations, the newer
    /// generation timestamp; and any change between tracked and untracked.
    pub fn is_newer_than(&self, cached: &ShardVersion) -> bool {
        if self.generation == cached.generation {
            return self.placement > cached.placement;
        }
        if self.generation.is_unsharded() || cached.generation.is_unsharded() {
            return true;
        }
        compare_timestamps(self.generation.timestamp, cached.generation.timestamp)
            == Ordering::Greater
    }
}

/// A database's version, `config.databases.version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatabaseVersion {
    /// One incarnation of the database.
    pub uuid: Uuid,
    /// The cluster time of its creation.
    pub timestamp: Timestamp,
    /// Bumped when the primary shard moves.
    pub last_mod: i32,
}

impl DatabaseVersion {
    /// The wire form: `{uuid, timestamp, lastMod}`.
    pub fn to_document(&self) -> Document {
        doc! {
            "uuid": self.uuid,
            "timestamp": self.timestamp,
            "lastMod": self.last_mod,
        }
    }

    /// Parses `{uuid, timestamp, lastMod}`; `ctx` names the struct in messages
    /// (`DatabaseType.version` inside a `config.databases` entry).
    pub fn from_document(
        d: &Document,
        ctx: &str,
        printer: &Printer,
    ) -> Result<Self, MetadataError> {
        let idl = Idl {
            doc: d,
            ctx,
            printer,
        };
        Ok(DatabaseVersion {
            uuid: idl.uuid("uuid")?,
            timestamp: idl.timestamp("timestamp")?,
            last_mod: idl.int("lastMod")?,
        })
    }

    /// Reads a database version from a StaleDbVersion error's `vReceived` / `vWanted`.
    pub fn from_bson(value: &Bson, printer: &Printer) -> Result<Self, MetadataError> {
        match value {
            Bson::Document(d) => Self::from_document(d, "DatabaseVersion", printer),
            v => Err(MetadataError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "database version must be an object, found {}",
                    (printer.type_name)(v)
                ),
            )),
        }
    }

    /// Whether a cache that holds `cached` must refresh to reach `self`: a newer incarnation
    /// (timestamp), or the same one with a higher `lastMod`.
    pub fn is_newer_than(&self, cached: &DatabaseVersion) -> bool {
        match compare_timestamps(self.timestamp, cached.timestamp) {
            Ordering::Greater => true,
            Ordering::Less => false,
            Ordering::Equal => self.uuid != cached.uuid || self.last_mod > cached.last_mod,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::configsvr::test_support::PRINTER;

    fn ts(time: u32, increment: u32) -> Timestamp {
        Timestamp { time, increment }
    }

    fn version(epoch: ObjectId, t: u32, major: u32, minor: u32) -> ShardVersion {
        ShardVersion {
            generation: CollectionGeneration {
                epoch,
                timestamp: ts(t, 1),
            },
            placement: ChunkVersion { major, minor },
        }
    }

    #[test]
    fn wire_forms_match_mongos() {
        let e = ObjectId::parse_str("65f0a1b2c3d4e5f601234567").unwrap();
        let v = version(e, 1700000000, 3, 2);
        assert_eq!(
            v.to_document(),
            doc! {"e": e, "t": ts(1700000000, 1), "v": ts(3, 2)}
        );
        assert_eq!(
            ShardVersion::unsharded().to_document(),
            doc! {"e": ObjectId::from_bytes([0; 12]), "t": ts(0, 0), "v": ts(0, 0)}
        );
        let ignored = ShardVersion::ignored().to_document();
        assert_eq!(
            ignored.get_object_id("e").unwrap().to_hex(),
            "00000000ffffffffffffffff"
        );
        assert_eq!(ignored.get_timestamp("t").unwrap(), ts(u32::MAX, u32::MAX));
        let dbv = DatabaseVersion {
            uuid: Uuid::from_bytes([7; 16]),
            timestamp: ts(5, 1),
            last_mod: 2,
        };
        assert_eq!(
            dbv.to_document(),
            doc! {"uuid": Uuid::from_bytes([7; 16]), "timestamp": ts(5, 1), "lastMod": 2}
        );
    }

    #[test]
    fn parses_every_wire_form_back() {
        let e = ObjectId::new();
        let v = version(e, 9, 4, 1);
        let object = Bson::Document(v.to_document());
        assert_eq!(ShardVersion::from_bson(&object, &PRINTER).unwrap(), v);
        let mut extra = v.to_document();
        extra.insert("i", ts(1, 1));
        extra.insert("placementConflictTime", ts(1, 2));
        assert_eq!(
            ShardVersion::from_bson(&Bson::Document(extra), &PRINTER).unwrap(),
            v
        );
        let array = Bson::Array(vec![
            Bson::Timestamp(ts(4, 1)),
            Bson::ObjectId(e),
            Bson::Timestamp(ts(9, 1)),
        ]);
        assert_eq!(ShardVersion::from_bson(&array, &PRINTER).unwrap(), v);
        let positional = Bson::Document(doc! {"0": ts(4, 1), "1": e, "2": ts(9, 1)});
        assert_eq!(ShardVersion::from_bson(&positional, &PRINTER).unwrap(), v);

        let e = ShardVersion::from_bson(&Bson::Document(doc! {"e": e, "t": ts(1, 1)}), &PRINTER)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::IdlMissingField);
        assert_eq!(
            e.message,
            "BSON field 'ShardVersion.v' is missing but a required field"
        );
        let e = ShardVersion::from_bson(&Bson::Int32(3), &PRINTER).unwrap_err();
        assert_eq!(e.code, ErrorCode::TypeMismatch);
        let e = ShardVersion::from_bson(
            &Bson::Document(doc! {"e": 1, "t": ts(1, 1), "v": ts(1, 1)}),
            &PRINTER,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "BSON field 'ShardVersion.e' is the wrong type 'int', expected type 'objectId'"
        );
    }

    #[test]
    fn newer_follows_generation_then_placement() {
        let a = ObjectId::new();
        let b = ObjectId::new();
        assert!(version(a, 5, 2, 0).is_newer_than(&version(a, 5, 1, 9)));
        assert!(version(a, 5, 1, 3).is_newer_than(&version(a, 5, 1, 2)));
        assert!(!version(a, 5, 1, 2).is_newer_than(&version(a, 5, 1, 2)));
        assert!(!version(a, 5, 1, 2).is_newer_than(&version(a, 5, 3, 0)));
        // A newer generation wins whatever its placement.
        assert!(version(b, 6, 1, 0).is_newer_than(&version(a, 5, 9, 9)));
        assert!(!version(a, 5, 9, 9).is_newer_than(&version(b, 6, 1, 0)));
        // Tracked <-> untracked always needs a refresh.
        assert!(ShardVersion::unsharded().is_newer_than(&version(a, 5, 1, 0)));
        assert!(version(a, 5, 1, 0).is_newer_than(&ShardVersion::unsharded()));
        assert!(!ShardVersion::unsharded().is_newer_than(&ShardVersion::unsharded()));

        let u = Uuid::from_bytes([1; 16]);
        let d = |t: u32, m: i32| DatabaseVersion {
            uuid: u,
            timestamp: ts(t, 1),
            last_mod: m,
        };
        assert!(d(5, 2).is_newer_than(&d(5, 1)));
        assert!(!d(5, 1).is_newer_than(&d(5, 1)));
        assert!(d(6, 1).is_newer_than(&d(5, 9)));
        assert!(!d(4, 9).is_newer_than(&d(5, 1)));
    }

    #[test]
    fn database_version_errors_name_the_path() {
        let e = DatabaseVersion::from_document(
            &doc! {"uuid": Uuid::new(), "timestamp": ts(1, 1)},
            "DatabaseType.version",
            &PRINTER,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "BSON field 'DatabaseType.version.lastMod' is missing but a required field"
        );
        let e = DatabaseVersion::from_document(
            &doc! {"uuid": "x", "timestamp": ts(1, 1), "lastMod": 1},
            "DatabaseType.version",
            &PRINTER,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "BSON field 'DatabaseType.version.uuid' is the wrong type 'string', expected type 'binData'"
        );
        let e = DatabaseVersion::from_document(
            &doc! {"uuid": Uuid::new(), "timestamp": ts(1, 1), "lastMod": 1i64},
            "DatabaseType.version",
            &PRINTER,
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::TypeMismatch);
    }
}
