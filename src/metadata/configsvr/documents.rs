//! The documents of `config.shards`, `config.databases`, `config.collections` and
//! `config.chunks` in the MongoDB 6.0+ schema, parsed into typed entries.
//!
//! Every parser returns mongod's error for a malformed document (never a panic), with the
//! context mongos adds and the document's `_id`, so an operator can find the bad entry:
//!
//! - `config.databases` and `config.collections` are IDL structs in MongoDB (`DatabaseType`,
//!   `CollectionType`): `40414 BSON field 'DatabaseType.primary' is missing but a required
//!   field`, `TypeMismatch BSON field '…' is the wrong type 'int', expected type 'string'`.
//! - `config.shards` and `config.chunks` are parsed by hand (`ShardType::fromBSON`,
//!   `ChunkType::parseFromConfigBSON`): `NoSuchKey Missing expected field "host"`,
//!   `NoSuchKey The field 'shard' is missing`, `BadValue min: { … } should be less than max: { … }`.

use bson::{oid::ObjectId, Bson, DateTime, Document, Timestamp, Uuid};

use crate::backend::topology::{Printer, SeedList};
use crate::routing::{ChunkVersion, ShardKey, ShardKeyPattern};
use crate::value::error_codes::ErrorCode;

use super::error::MetadataError;
use super::fields::{
    extract_missing, extract_optional_bool, extract_string, extract_wrong_type, name_of, uuid_of,
    Idl,
};
use super::version::{compare_timestamps, CollectionGeneration, DatabaseVersion};

/// A `config.shards` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardEntry {
    /// The shard id (`_id`), as chunks and databases name it.
    pub id: String,
    /// `host` as stored: `"rs/h1:p,h2:p"` or `"h:p"`.
    pub host: String,
    /// `host` parsed.
    pub seeds: SeedList,
    /// Whether the shard is being removed (`draining`).
    pub draining: bool,
    /// Zone names (`tags`).
    pub tags: Vec<String>,
    /// `topologyTime`, when the shard was added or removed last.
    pub topology_time: Option<Timestamp>,
}

impl ShardEntry {
    /// Parses one `config.shards` document.
    pub fn from_document(doc: &Document, printer: &Printer) -> Result<Self, MetadataError> {
        Self::parse(doc, printer).map_err(|e| {
            e.context(format!(
                "Failed to parse shard document {} in config.shards",
                (printer.document)(doc)
            ))
        })
    }

    fn parse(doc: &Document, printer: &Printer) -> Result<Self, MetadataError> {
        let id = extract_string(printer, doc, "_id")?;
        if id.is_empty() {
            return Err(MetadataError::new(
                ErrorCode::NoSuchKey,
                "shard's id is empty".to_string(),
            ));
        }
        let host = extract_string(printer, doc, "host")?;
        let draining = extract_optional_bool(printer, doc, "draining")?.unwrap_or(false);
        let tags = match doc.get("tags") {
            None => Vec::new(),
            Some(Bson::Array(a)) => a
                .iter()
                .map(|t| match t {
                    Bson::String(s) => Ok(s.clone()),
                    v => Err(extract_wrong_type(printer, "tags", v, "string")),
                })
                .collect::<Result<_, _>>()?,
            Some(v) => return Err(extract_wrong_type(printer, "tags", v, "array")),
        };
        let topology_time = match doc.get("topologyTime") {
            None => None,
            Some(Bson::Timestamp(t)) => Some(*t),
            Some(v) => return Err(extract_wrong_type(printer, "topologyTime", v, "timestamp")),
        };
        let seeds = SeedList::parse(&host).map_err(|e| {
            MetadataError::new(e.code, format!("Invalid shard host {host}: {}", e.message))
        })?;
        Ok(ShardEntry {
            id,
            host,
            seeds,
            draining,
            tags,
            topology_time,
        })
    }
}

/// A `config.databases` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseEntry {
    /// The database name (`_id`).
    pub name: String,
    /// The primary shard's id: where its untracked collections live.
    pub primary: String,
    /// The database version requests to the primary carry.
    pub version: DatabaseVersion,
}

impl DatabaseEntry {
    /// Parses one `config.databases` document (IDL `DatabaseType`).
    pub fn from_document(doc: &Document, printer: &Printer) -> Result<Self, MetadataError> {
        let idl = Idl {
            doc,
            ctx: "DatabaseType",
            printer,
        };
        let parse = || -> Result<Self, MetadataError> {
            let name = idl.string("_id")?;
            let primary = idl.string("primary")?;
            if primary.is_empty() {
                return Err(MetadataError::new(
                    ErrorCode::BadValue,
                    "ShardId must not be empty",
                ));
            }
            let version = DatabaseVersion::from_document(
                idl.document("version")?,
                "DatabaseType.version",
                printer,
            )?;
            Ok(DatabaseEntry {
                name,
                primary,
                version,
            })
        };
        parse().map_err(|e| {
            e.context(format!(
                "Failed to parse DatabaseType from config.databases document {}",
                name_of(printer, doc)
            ))
        })
    }
}

/// A `config.collections` entry: a tracked collection.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionEntry {
    /// `db.coll` (`_id`).
    pub ns: String,
    /// `(lastmodEpoch, timestamp)`.
    pub generation: CollectionGeneration,
    /// The collection UUID; its chunks carry it.
    pub uuid: Uuid,
    /// The shard key pattern (`key`).
    pub pattern: ShardKeyPattern,
    /// Whether the shard key is unique.
    pub unique: bool,
    /// An 8.0 tracked unsharded collection (one chunk, moved whole by `moveCollection`).
    pub unsplittable: bool,
    /// Whether chunks may move (`allowMigrations`, default true).
    pub allow_migrations: bool,
    /// Whether the balancer skips it (`noBalance`).
    pub no_balance: bool,
    /// The collection's default collation, when it has one other than simple.
    pub default_collation: Option<Document>,
    /// `lastmod`: when the entry was created or last changed.
    pub updated_at: DateTime,
}

impl CollectionEntry {
    /// Parses one `config.collections` document (IDL `CollectionType`).
    pub fn from_document(doc: &Document, printer: &Printer) -> Result<Self, MetadataError> {
        let idl = Idl {
            doc,
            ctx: "CollectionType",
            printer,
        };
        let parse = || -> Result<Self, MetadataError> {
            let ns = idl.string("_id")?;
            match ns.split_once('.') {
                Some((db, coll)) if !db.is_empty() && !coll.is_empty() => {}
                _ => {
                    return Err(MetadataError::new(
                        ErrorCode::InvalidNamespace,
                        format!("Invalid namespace specified '{ns}'"),
                    ))
                }
            }
            let epoch = idl
                .optional_object_id("lastmodEpoch")?
                .unwrap_or_else(|| ObjectId::from_bytes([0; 12]));
            let updated_at = idl.date("lastmod")?;
            let timestamp = idl.timestamp("timestamp")?;
            let uuid = idl.uuid("uuid")?;
            let key = idl.document("key")?;
            let pattern =
                ShardKeyPattern::parse(key).map_err(|e| MetadataError::new(e.code, e.message))?;
            let default_collation = idl
                .optional_document("defaultCollation")?
                .filter(|c| !c.is_empty() && c.get_str("locale").ok() != Some("simple"))
                .cloned();
            Ok(CollectionEntry {
                ns,
                generation: CollectionGeneration { epoch, timestamp },
                uuid,
                pattern,
                unique: idl.optional_bool("unique")?.unwrap_or(false),
                unsplittable: idl.optional_bool("unsplittable")?.unwrap_or(false),
                allow_migrations: idl.optional_bool("allowMigrations")?.unwrap_or(true),
                no_balance: idl.optional_bool("noBalance")?.unwrap_or(false),
                default_collation,
                updated_at,
            })
        };
        parse().map_err(|e| {
            e.context(format!(
                "Failed to parse CollectionType from config.collections document {}",
                name_of(printer, doc)
            ))
        })
    }
}

/// A `config.chunks` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkEntry {
    /// `_id`.
    pub id: ObjectId,
    /// The UUID of the collection the chunk belongs to.
    pub uuid: Uuid,
    /// Inclusive lower bound.
    pub min: ShardKey,
    /// Exclusive upper bound.
    pub max: ShardKey,
    /// The owning shard.
    pub shard: String,
    /// `lastmod`.
    pub version: ChunkVersion,
    /// Whether the balancer gave up splitting it.
    pub jumbo: bool,
    /// Since when the chunk is on its shard (`onCurrentShardSince`).
    pub on_current_shard_since: Option<Timestamp>,
}

impl ChunkEntry {
    /// Parses one `config.chunks` document of the collection whose key pattern is `pattern`
    /// (`ns` names it in messages).
    pub fn from_document(
        doc: &Document,
        pattern: &ShardKeyPattern,
        ns: &str,
        printer: &Printer,
    ) -> Result<Self, MetadataError> {
        Self::parse(doc, pattern, printer).map_err(|e| {
            e.context(format!(
                "Failed to parse chunk with id {} in config.chunks of collection {ns}",
                name_of(printer, doc)
            ))
        })
    }

    fn parse(
        doc: &Document,
        pattern: &ShardKeyPattern,
        printer: &Printer,
    ) -> Result<Self, MetadataError> {
        // In the order `ChunkType::parseFromConfigBSON` checks them.
        let shard = match doc.get("shard") {
            None => {
                return Err(MetadataError::new(
                    ErrorCode::NoSuchKey,
                    "The field 'shard' is missing",
                ))
            }
            Some(Bson::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => {
                return Err(MetadataError::new(
                    ErrorCode::TypeMismatch,
                    "The field 'shard' cannot be parsed",
                ))
            }
        };
        let mut history_front: Option<(Timestamp, String)> = None;
        match doc.get("history") {
            None => {}
            Some(Bson::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let Bson::Document(h) = item else {
                        return Err(MetadataError::new(
                            ErrorCode::BadValue,
                            format!(
                                "array element does not have the object type: {}",
                                (printer.type_name)(item)
                            ),
                        ));
                    };
                    let idl = Idl {
                        doc: h,
                        ctx: "chunk history array",
                        printer,
                    };
                    let valid_after = idl.timestamp("validAfter")?;
                    let on = idl.string("shard")?;
                    if i == 0 {
                        history_front = Some((valid_after, on));
                    }
                }
            }
            Some(v) => return Err(extract_wrong_type(printer, "history", v, "array")),
        }
        let on_current_shard_since = match (&history_front, doc.get("onCurrentShardSince")) {
            (Some((valid_after, _)), Some(Bson::Timestamp(t))) => {
                if compare_timestamps(*valid_after, *t) != std::cmp::Ordering::Equal {
                    return Err(MetadataError::new(
                        ErrorCode::BadValue,
                        format!(
                            "The first `validAfter` in the chunk's history is not consistent \
                             with `onCurrentShardSince`: validAfter is {} while \
                             onCurrentShardSince is {}",
                            (printer.value)(&Bson::Timestamp(*valid_after)),
                            (printer.value)(&Bson::Timestamp(*t))
                        ),
                    ));
                }
                Some(*t)
            }
            _ => None,
        };
        let uuid = match doc.get("uuid") {
            None => return Err(extract_missing("uuid")),
            Some(v) => uuid_of(v).ok_or_else(|| {
                MetadataError::new(
                    ErrorCode::InvalidUUID,
                    "UUID must be a 16-byte binary field with UUID (4) subtype",
                )
            })?,
        };
        let id = match doc.get("_id") {
            None => return Err(extract_missing("_id")),
            Some(Bson::ObjectId(o)) => *o,
            Some(v) => return Err(extract_wrong_type(printer, "_id", v, "objectId")),
        };
        let version = match doc.get("lastmod") {
            None => return Err(MetadataError::new(ErrorCode::NoSuchKey, "No version found")),
            Some(Bson::Timestamp(t)) => ChunkVersion::from_timestamp(*t),
            // A date holds the same 64 bits (major in the high half) in very old documents.
            Some(Bson::DateTime(d)) => {
                let bits = d.timestamp_millis() as u64;
                ChunkVersion {
                    major: (bits >> 32) as u32,
                    minor: bits as u32,
                }
            }
            Some(_) => {
                return Err(MetadataError::new(
                    ErrorCode::BadValue,
                    "The field lastmod cannot be parsed.",
                ))
            }
        };
        if version == ChunkVersion::default() {
            return Err(MetadataError::new(
                ErrorCode::NoSuchKey,
                "missing version field",
            ));
        }
        let range = Idl {
            doc,
            ctx: "ChunkRange",
            printer,
        };
        let min_doc = range.document("min")?;
        let max_doc = range.document("max")?;
        if min_doc.is_empty() {
            return Err(MetadataError::new(
                ErrorCode::BadValue,
                "min field is empty",
            ));
        }
        if max_doc.is_empty() {
            return Err(MetadataError::new(
                ErrorCode::BadValue,
                "max field is empty",
            ));
        }
        let min = bound(min_doc, pattern, printer)?;
        let max = bound(max_doc, pattern, printer)?;
        if min >= max {
            return Err(MetadataError::new(
                ErrorCode::BadValue,
                format!(
                    "min: {} should be less than max: {}",
                    (printer.document)(min_doc),
                    (printer.document)(max_doc)
                ),
            ));
        }
        let jumbo = extract_optional_bool(printer, doc, "jumbo")?.unwrap_or(false);
        Ok(ChunkEntry {
            id,
            uuid,
            min,
            max,
            shard,
            version,
            jumbo,
            on_current_shard_since,
        })
    }

    /// The chunk as the routing layer keeps it.
    pub fn to_chunk(&self) -> crate::routing::Chunk {
        crate::routing::Chunk {
            id: self.id,
            min: self.min.clone(),
            max: self.max.clone(),
            shard: self.shard.clone(),
            version: self.version,
        }
    }
}

/// A chunk bound read with the collection's key pattern: exactly the pattern's fields, in its
/// order (a bound of another pattern means the chunk belongs to another generation of the
/// collection, or the document is corrupt).
fn bound(
    d: &Document,
    pattern: &ShardKeyPattern,
    printer: &Printer,
) -> Result<ShardKey, MetadataError> {
    let fields = pattern.fields();
    let matches = d.len() == fields.len() && d.keys().zip(fields).all(|(k, f)| *k == f.path);
    if !matches {
        return Err(MetadataError::new(
            ErrorCode::BadValue,
            format!(
                "chunk bound {} does not match the shard key pattern {}",
                (printer.document)(d),
                (printer.document)(&pattern.to_document())
            ),
        ));
    }
    Ok(ShardKey(d.values().cloned().collect()))
}

#[cfg(test)]
mod tests;
