//! What the unit tests of the config-server source share: the project's value printer, and
//! builders of `config.*` documents shaped as a 6.0+ config server writes them.

use bson::{doc, oid::ObjectId, Document, Timestamp, Uuid};

use crate::backend::topology::Printer;

/// The printer the router lends the cache.
pub const PRINTER: Printer = Printer {
    document: crate::value::render::render_doc,
    value: crate::value::render::render_value,
    type_name: crate::value::field::type_name,
};

/// `Timestamp(t, i)`.
pub fn ts(time: u32, increment: u32) -> Timestamp {
    Timestamp { time, increment }
}

/// A `config.shards` document.
pub fn shard_doc(id: &str, host: &str) -> Document {
    doc! {"_id": id, "host": host, "state": 1, "topologyTime": ts(1, 1)}
}

/// A `config.databases` document.
pub fn database_doc(name: &str, primary: &str, uuid: Uuid, last_mod: i32) -> Document {
    doc! {
        "_id": name,
        "primary": primary,
        "version": {"uuid": uuid, "timestamp": ts(10, 1), "lastMod": last_mod},
    }
}

/// A `config.collections` document.
pub fn collection_doc(
    ns: &str,
    epoch: ObjectId,
    timestamp: Timestamp,
    uuid: Uuid,
    key: Document,
) -> Document {
    doc! {
        "_id": ns,
        "lastmodEpoch": epoch,
        "lastmod": bson::DateTime::from_millis(1_700_000_000_000),
        "timestamp": timestamp,
        "uuid": uuid,
        "key": key,
        "unique": false,
        "noBalance": false,
    }
}

/// A `config.chunks` document.
pub fn chunk_doc(
    uuid: Uuid,
    min: Document,
    max: Document,
    shard: &str,
    major: u32,
    minor: u32,
) -> Document {
    doc! {
        "_id": ObjectId::new(),
        "uuid": uuid,
        "min": min,
        "max": max,
        "shard": shard,
        "lastmod": ts(major, minor),
        "onCurrentShardSince": ts(5, 1),
        "history": [{"validAfter": ts(5, 1), "shard": shard}],
    }
}
