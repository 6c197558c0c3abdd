use super::*;
use crate::metadata::configsvr::test_support::*;
use bson::doc;
use proptest::prelude::*;

fn pattern() -> ShardKeyPattern {
    ShardKeyPattern::parse(&doc! {"_id": "hashed"}).unwrap()
}

#[test]
fn shard_entries() {
    let s = ShardEntry::from_document(
        &doc! {"_id": "shard0", "host": "rs0/h1:27018,h2:27018", "state": 1, "draining": true, "tags": ["eu"], "topologyTime": ts(3, 1)},
        &PRINTER,
    )
    .unwrap();
    assert_eq!(s.id, "shard0");
    assert_eq!(s.seeds.set_name.as_deref(), Some("rs0"));
    assert_eq!(s.seeds.hosts.len(), 2);
    assert!(s.draining);
    assert_eq!(s.tags, vec!["eu".to_string()]);
    assert_eq!(s.topology_time, Some(ts(3, 1)));
    let single = ShardEntry::from_document(&shard_doc("s1", "127.0.0.1:40001"), &PRINTER).unwrap();
    assert!(!single.seeds.is_replica_set());
    assert!(!single.draining);

    let e = ShardEntry::from_document(&doc! {"_id": "s0"}, &PRINTER).unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSuchKey);
    assert_eq!(
        e.message,
        "Failed to parse shard document { _id: \"s0\" } in config.shards :: caused by :: Missing expected field \"host\""
    );
    let e = ShardEntry::from_document(&doc! {"_id": 5, "host": "h:1"}, &PRINTER).unwrap_err();
    assert_eq!(e.code, ErrorCode::TypeMismatch);
    assert!(
        e.message
            .ends_with("\"_id\" had the wrong type. Expected string, found int"),
        "{}",
        e.message
    );
    let e = ShardEntry::from_document(&doc! {"_id": "s", "host": "h:1", "draining": 1}, &PRINTER)
        .unwrap_err();
    assert!(e
        .message
        .ends_with("\"draining\" had the wrong type. Expected bool, found int"));
    let e = ShardEntry::from_document(&doc! {"_id": "s", "host": "h:99999"}, &PRINTER).unwrap_err();
    assert_eq!(e.code, ErrorCode::FailedToParse);
    assert!(
        e.message.contains("Invalid shard host h:99999"),
        "{}",
        e.message
    );
}

#[test]
fn database_entries() {
    let u = Uuid::from_bytes([3; 16]);
    let d = DatabaseEntry::from_document(&database_doc("app", "shard1", u, 2), &PRINTER).unwrap();
    assert_eq!(d.name, "app");
    assert_eq!(d.primary, "shard1");
    assert_eq!(d.version.uuid, u);
    assert_eq!(d.version.last_mod, 2);
    // partitioned is deprecated and ignored.
    let mut with_partitioned = database_doc("app", "shard1", u, 2);
    with_partitioned.insert("partitioned", true);
    assert!(DatabaseEntry::from_document(&with_partitioned, &PRINTER).is_ok());

    let e =
        DatabaseEntry::from_document(&doc! {"_id": "app", "version": {}}, &PRINTER).unwrap_err();
    assert_eq!(e.code, ErrorCode::IdlMissingField);
    assert_eq!(
        e.message,
        "Failed to parse DatabaseType from config.databases document _id: \"app\" :: caused by :: BSON field 'DatabaseType.primary' is missing but a required field"
    );
    let e = DatabaseEntry::from_document(
        &doc! {"_id": "app", "primary": "s0", "version": {"uuid": u, "timestamp": ts(1, 1), "lastMod": "1"}},
        &PRINTER,
    )
    .unwrap_err();
    assert!(e.message.ends_with(
        "BSON field 'DatabaseType.version.lastMod' is the wrong type 'string', expected type 'int'"
    ));
    let e =
        DatabaseEntry::from_document(&doc! {"_id": "app", "primary": ""}, &PRINTER).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadValue);
}

#[test]
fn collection_entries() {
    let (e, u) = (ObjectId::new(), Uuid::new());
    let mut d = collection_doc(
        "db.c",
        e,
        ts(100, 2),
        u,
        doc! {"region": 1, "_id": "hashed"},
    );
    d.insert("unique", true);
    d.insert("defaultCollation", doc! {"locale": "simple"});
    let c = CollectionEntry::from_document(&d, &PRINTER).unwrap();
    assert_eq!(c.ns, "db.c");
    assert_eq!(c.generation.epoch, e);
    assert_eq!(c.generation.timestamp, ts(100, 2));
    assert_eq!(c.uuid, u);
    assert_eq!(c.pattern.fields().len(), 2);
    assert!(c.unique && !c.unsplittable && c.allow_migrations);
    assert_eq!(
        c.default_collation, None,
        "simple collation is no collation"
    );
    d.insert("defaultCollation", doc! {"locale": "fr"});
    d.insert("unsplittable", true);
    d.insert("allowMigrations", false);
    let c = CollectionEntry::from_document(&d, &PRINTER).unwrap();
    assert_eq!(c.default_collation, Some(doc! {"locale": "fr"}));
    assert!(c.unsplittable && !c.allow_migrations);
    // A pre-2.2 entry without lastmodEpoch has the zero epoch.
    d.remove("lastmodEpoch");
    let c = CollectionEntry::from_document(&d, &PRINTER).unwrap();
    assert_eq!(c.generation.epoch, ObjectId::from_bytes([0; 12]));

    let prefix = "Failed to parse CollectionType from config.collections document _id: \"db.c\" :: caused by :: ";
    for (field, msg, code) in [
        (
            "uuid",
            "BSON field 'CollectionType.uuid' is missing but a required field",
            ErrorCode::IdlMissingField,
        ),
        (
            "timestamp",
            "BSON field 'CollectionType.timestamp' is missing but a required field",
            ErrorCode::IdlMissingField,
        ),
        (
            "key",
            "BSON field 'CollectionType.key' is missing but a required field",
            ErrorCode::IdlMissingField,
        ),
        (
            "lastmod",
            "BSON field 'CollectionType.lastmod' is missing but a required field",
            ErrorCode::IdlMissingField,
        ),
    ] {
        let mut bad = collection_doc("db.c", e, ts(1, 1), u, doc! {"_id": 1});
        bad.remove(field);
        let err = CollectionEntry::from_document(&bad, &PRINTER).unwrap_err();
        assert_eq!(err.code, code, "{field}");
        assert_eq!(err.message, format!("{prefix}{msg}"));
    }
    let mut bad = collection_doc("db.c", e, ts(1, 1), u, doc! {"_id": 1});
    bad.insert("timestamp", 5);
    let err = CollectionEntry::from_document(&bad, &PRINTER).unwrap_err();
    assert_eq!(
        err.message,
        format!("{prefix}BSON field 'CollectionType.timestamp' is the wrong type 'int', expected type 'timestamp'")
    );
    let mut bad = collection_doc("db.c", e, ts(1, 1), u, doc! {"_id": 1});
    bad.insert(
        "uuid",
        bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes: vec![0; 16],
        },
    );
    let err = CollectionEntry::from_document(&bad, &PRINTER).unwrap_err();
    assert_eq!(err.code, ErrorCode::TypeMismatch);
    assert!(
        err.message
            .contains("wrong binData type '0', expected type '4'"),
        "{}",
        err.message
    );
    let bad = collection_doc("db.c", e, ts(1, 1), u, doc! {"a": -1});
    let err = CollectionEntry::from_document(&bad, &PRINTER).unwrap_err();
    assert_eq!(err.code, ErrorCode::BadValue);
    let bad = collection_doc("nodot", e, ts(1, 1), u, doc! {"a": 1});
    let err = CollectionEntry::from_document(&bad, &PRINTER).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidNamespace);
}

fn chunk(min: i64, max: i64) -> Document {
    chunk_doc(
        Uuid::from_bytes([9; 16]),
        doc! {"_id": min},
        doc! {"_id": max},
        "shard0",
        2,
        3,
    )
}

#[test]
fn chunk_entries() {
    let d = chunk_doc(
        Uuid::from_bytes([9; 16]),
        doc! {"_id": bson::Bson::MinKey},
        doc! {"_id": 0i64},
        "shard0",
        2,
        3,
    );
    let c = ChunkEntry::from_document(&d, &pattern(), "db.c", &PRINTER).unwrap();
    assert_eq!(c.version, ChunkVersion { major: 2, minor: 3 });
    assert_eq!(c.shard, "shard0");
    assert_eq!(c.min, pattern().min_key());
    assert_eq!(c.max.0, vec![Bson::Int64(0)]);
    assert_eq!(c.on_current_shard_since, Some(ts(5, 1)));
    assert_eq!(c.to_chunk().version, c.version);
    // An old document whose lastmod is a Date holds the same 64 bits.
    let mut dated = chunk(1, 2);
    dated.insert(
        "lastmod",
        bson::DateTime::from_millis(((7u64 << 32) | 4) as i64),
    );
    let c = ChunkEntry::from_document(&dated, &pattern(), "db.c", &PRINTER).unwrap();
    assert_eq!(c.version, ChunkVersion { major: 7, minor: 4 });

    let check = |d: Document, code: ErrorCode, tail: &str| {
        let e = ChunkEntry::from_document(&d, &pattern(), "db.c", &PRINTER).unwrap_err();
        assert_eq!(e.code, code, "{}", e.message);
        assert!(
            e.message.starts_with("Failed to parse chunk with id "),
            "{}",
            e.message
        );
        assert!(
            e.message
                .contains("in config.chunks of collection db.c :: caused by :: "),
            "{}",
            e.message
        );
        assert!(
            e.message.ends_with(tail),
            "{} does not end with {tail}",
            e.message
        );
    };
    let without = |f: &str| {
        let mut d = chunk(1, 2);
        d.remove(f);
        d
    };
    let with = |f: &str, v: Bson| {
        let mut d = chunk(1, 2);
        d.insert(f, v);
        d
    };
    check(
        without("shard"),
        ErrorCode::NoSuchKey,
        "The field 'shard' is missing",
    );
    check(
        with("shard", Bson::Int32(1)),
        ErrorCode::TypeMismatch,
        "The field 'shard' cannot be parsed",
    );
    check(
        without("uuid"),
        ErrorCode::NoSuchKey,
        "Missing expected field \"uuid\"",
    );
    check(
        with("uuid", Bson::String("x".into())),
        ErrorCode::InvalidUUID,
        "UUID must be a 16-byte binary field with UUID (4) subtype",
    );
    check(
        with("_id", Bson::String("x".into())),
        ErrorCode::TypeMismatch,
        "\"_id\" had the wrong type. Expected objectId, found string",
    );
    check(without("lastmod"), ErrorCode::NoSuchKey, "No version found");
    check(
        with("lastmod", Bson::Int64(5)),
        ErrorCode::BadValue,
        "The field lastmod cannot be parsed.",
    );
    check(
        with("lastmod", Bson::Timestamp(ts(0, 0))),
        ErrorCode::NoSuchKey,
        "missing version field",
    );
    check(
        without("min"),
        ErrorCode::IdlMissingField,
        "BSON field 'ChunkRange.min' is missing but a required field",
    );
    check(
        with("max", Bson::Int32(1)),
        ErrorCode::TypeMismatch,
        "BSON field 'ChunkRange.max' is the wrong type 'int', expected type 'object'",
    );
    check(
        with("min", Bson::Document(doc! {})),
        ErrorCode::BadValue,
        "min field is empty",
    );
    check(
        chunk(5, 5),
        ErrorCode::BadValue,
        "min: { _id: 5 } should be less than max: { _id: 5 }",
    );
    check(
        chunk(6, 5),
        ErrorCode::BadValue,
        "min: { _id: 6 } should be less than max: { _id: 5 }",
    );
    check(
        with("min", Bson::Document(doc! {"x": 1})),
        ErrorCode::BadValue,
        "chunk bound { x: 1 } does not match the shard key pattern { _id: \"hashed\" }",
    );
    check(
        with("history", Bson::Array(vec![Bson::Int32(1)])),
        ErrorCode::BadValue,
        "array element does not have the object type: int",
    );
    check(
        with("onCurrentShardSince", Bson::Timestamp(ts(6, 1))),
        ErrorCode::BadValue,
        "while onCurrentShardSince is Timestamp(6, 1)",
    );
    check(
        with("jumbo", Bson::String("yes".into())),
        ErrorCode::TypeMismatch,
        "\"jumbo\" had the wrong type. Expected bool, found string",
    );
}

fn any_bson() -> impl Strategy<Value = Bson> {
    prop_oneof![
        Just(Bson::Null),
        Just(Bson::MinKey),
        Just(Bson::MaxKey),
        any::<i32>().prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        any::<bool>().prop_map(Bson::Boolean),
        "[a-z.:/,]{0,12}".prop_map(Bson::String),
        (any::<u32>(), any::<u32>()).prop_map(|(t, i)| Bson::Timestamp(ts(t, i))),
        Just(Bson::ObjectId(ObjectId::from_bytes([1; 12]))),
        Just(Bson::Document(doc! {"_id": 1i64})),
        Just(Bson::Document(doc! {})),
        Just(Bson::Array(vec![Bson::Document(
            doc! {"validAfter": ts(1, 1), "shard": "s"}
        )])),
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(|b| Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::Uuid,
            bytes: b
        })),
    ]
}

/// A valid document with some fields removed and some replaced by arbitrary values.
fn mutated(base: Document) -> impl Strategy<Value = Document> {
    let keys: Vec<String> = base.keys().cloned().collect();
    let n = keys.len();
    (
        proptest::collection::vec(any::<bool>(), n),
        proptest::collection::vec(proptest::option::of(any_bson()), n),
    )
        .prop_map(move |(drop, replace)| {
            let mut d = Document::new();
            for (i, k) in keys.iter().enumerate() {
                if drop[i] {
                    continue;
                }
                let v = replace[i]
                    .clone()
                    .unwrap_or_else(|| base.get(k).cloned().unwrap_or(Bson::Null));
                d.insert(k.clone(), v);
            }
            d
        })
}

proptest! {
    /// Whatever a config document holds, parsing answers a value or a MongoDB error; it never
    /// panics, and an error always names the collection.
    #[test]
    fn malformed_documents_never_panic(
        chunk in mutated(chunk(1, 2)),
        coll in mutated(collection_doc("db.c", ObjectId::new(), ts(1, 1), Uuid::new(), doc! {"_id": "hashed"})),
        db in mutated(database_doc("db", "s0", Uuid::new(), 1)),
        shard in mutated(shard_doc("s0", "rs/h:1")),
    ) {
        if let Err(e) = ChunkEntry::from_document(&chunk, &pattern(), "db.c", &PRINTER) {
            prop_assert!(e.message.contains("config.chunks"));
        }
        if let Err(e) = CollectionEntry::from_document(&coll, &PRINTER) {
            prop_assert!(e.message.contains("config.collections"));
        }
        if let Err(e) = DatabaseEntry::from_document(&db, &PRINTER) {
            prop_assert!(e.message.contains("config.databases"));
        }
        if let Err(e) = ShardEntry::from_document(&shard, &PRINTER) {
            prop_assert!(e.message.contains("config.shards"));
        }
    }
}
