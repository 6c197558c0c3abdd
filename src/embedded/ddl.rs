//! The embedded shard's collection-maintenance commands that applications and ODMs send at
//! start-up or in migrations: `collMod`, `validate`, `dataSize` and `renameCollection`, with
//! mongod 8.0's reply shapes and codes.

use bson::{doc, Bson, Document};

use super::service::{lock, ShardService};
use super::store::check_namespace;
use crate::command::CommandRequest;
use crate::engine::EngineError;
use crate::value::compare::compare;
use crate::value::error_codes::ErrorCode;
use crate::value::field::truthy;

fn err(code: ErrorCode, msg: impl Into<String>) -> EngineError {
    EngineError::new(code, msg)
}

/// Splits `db.coll` as mongod does (at the first dot), checking both names.
fn split_namespace(ns: &str, what: &str) -> Result<(String, String), EngineError> {
    match ns.split_once('.') {
        Some((db, coll)) if !db.is_empty() && !coll.is_empty() => {
            check_namespace(db, coll)?;
            Ok((db.to_string(), coll.to_string()))
        }
        _ => Err(err(
            ErrorCode::InvalidNamespace,
            format!("Invalid {what} namespace: {ns}"),
        )),
    }
}

fn collection_arg(req: &CommandRequest, body: &Document) -> Result<String, EngineError> {
    match body.get(&req.name) {
        Some(Bson::String(s)) => {
            check_namespace(&req.db, s)?;
            Ok(s.clone())
        }
        Some(other) => Err(err(
            ErrorCode::InvalidNamespace,
            format!(
                "collection name has invalid type {}",
                crate::value::field::type_name(other)
            ),
        )),
        None => Err(err(ErrorCode::InvalidNamespace, "missing collection name")),
    }
}

/// The options `collMod` may change, as mongod accepts them (anything else is 40415, the IDL
/// parser's unknown-field error).
const COLLMOD_OPTIONS: &[&str] = &[
    "validator",
    "validationLevel",
    "validationAction",
    "index",
    "expireAfterSeconds",
    "changeStreamPreAndPostImages",
    "timeseries",
    "recordIdsReplicated",
    "viewOn",
    "pipeline",
    "dryRun",
    "cappedSize",
    "cappedMax",
];

/// `collMod`: records the new validator/validation options on the collection. Index changes
/// (`index: {name|keyPattern, hidden|expireAfterSeconds}`) name an index that must exist.
pub fn coll_mod(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_arg(req, body)?;
    for k in body.keys() {
        if k != "collMod"
            && !crate::command::GENERIC_ARGUMENTS.contains(&k.as_str())
            && !COLLMOD_OPTIONS.contains(&k.as_str())
        {
            return Err(err(
                ErrorCode(40415),
                format!("BSON field 'collMod.{k}' is an unknown field."),
            ));
        }
    }
    let data = svc.data();
    let mut cat = lock(&data);
    let redefines = body.contains_key("viewOn") || body.contains_key("pipeline");
    match cat.collection(&req.db, &coll) {
        Some(c) if crate::embedded::views::is_view(c) => {
            // A view takes only a new definition; what is not given is kept.
            let mut merged = doc! {"collMod": &coll};
            for k in ["viewOn", "pipeline", "collation"] {
                if let Some(v) = body.get(k).or_else(|| c.options.get(k)) {
                    merged.insert(k, v.clone());
                }
            }
            for (k, v) in body {
                if k != "collMod" && !merged.contains_key(k) {
                    merged.insert(k.clone(), v.clone());
                }
            }
            let options = crate::embedded::views::parse_definition("collMod", &merged)?;
            crate::embedded::views::check_graph(&cat, &req.db, &coll, &options)?;
            if let Some(c) = cat.existing_mut(&req.db, &coll) {
                c.options = options;
            }
            return Ok(Document::new());
        }
        Some(_) if redefines => {
            return Err(err(
                ErrorCode::InvalidOptions,
                format!("{}.{coll} is a collection, not a view: 'viewOn' and 'pipeline' are only valid for views", req.db),
            ));
        }
        _ => {}
    }
    let Some(c) = cat.existing_mut(&req.db, &coll) else {
        return Err(err(ErrorCode::NamespaceNotFound, "ns does not exist"));
    };
    if let Some(index) = body.get("index") {
        let Bson::Document(index) = index else {
            return Err(err(
                ErrorCode::TypeMismatch,
                "BSON field 'collMod.index' is the wrong type, expected type 'object'",
            ));
        };
        let found = c.indexes().iter().any(|i| {
            index.get_str("name").ok() == Some(i.name.as_str())
                || index.get_document("keyPattern").ok() == Some(&i.key)
        });
        if !found {
            return Err(err(
                ErrorCode::IndexNotFound,
                format!(
                    "cannot find index {} for ns {}.{coll}",
                    crate::value::render::render_doc(index),
                    req.db
                ),
            ));
        }
    }
    for (k, v) in body {
        if matches!(
            k.as_str(),
            "validator" | "validationLevel" | "validationAction" | "expireAfterSeconds"
        ) {
            c.options.insert(k.clone(), v.clone());
        }
    }
    Ok(Document::new())
}

/// `validate`: the in-memory store has nothing to repair, so every collection is valid; the
/// reply has mongod's fields with the collection's real counts.
pub fn validate(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_arg(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let data = svc.data();
    let cat = lock(&data);
    let Some(c) = cat.collection(&req.db, &coll) else {
        return Err(err(
            ErrorCode::NamespaceNotFound,
            format!("Collection '{ns}' does not exist to validate."),
        ));
    };
    let n = c.len() as i64;
    let mut keys = Document::new();
    let mut details = Document::new();
    for i in c.indexes() {
        keys.insert(i.name.clone(), n);
        details.insert(i.name.clone(), doc! {"valid": true});
    }
    Ok(doc! {
        "ns": ns,
        "uuid": c.uuid,
        "nInvalidDocuments": 0i64,
        "nNonCompliantDocuments": 0i64,
        "nrecords": n,
        "nIndexes": c.indexes().len() as i64,
        "keysPerIndex": keys,
        "indexDetails": details,
        "valid": true,
        "repaired": false,
        "warnings": [],
        "errors": [],
        "extraIndexEntries": [],
        "missingIndexEntries": [],
        "corruptRecords": [],
    })
}

/// `dataSize`: bytes and documents of a collection, or of the documents whose `keyPattern`
/// fields fall in `[min, max)`. A missing collection measures zero, as on mongod.
pub fn data_size(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    let ns = match body.get("dataSize") {
        Some(Bson::String(s)) => s.clone(),
        _ => {
            return Err(err(
                ErrorCode::TypeMismatch,
                "BSON field 'dataSize.dataSize' is the wrong type, expected type 'string'",
            ))
        }
    };
    let (db, coll) = split_namespace(&ns, "")?;
    let range = match (
        body.get_document("keyPattern"),
        body.get_document("min"),
        body.get_document("max"),
    ) {
        (Ok(k), Ok(min), Ok(max)) => Some((k.clone(), min.clone(), max.clone())),
        _ => None,
    };
    let start = std::time::Instant::now();
    let data = svc.data();
    let cat = lock(&data);
    let (mut size, mut n) = (0i64, 0i64);
    if let Some(c) = cat.collection(&db, &coll) {
        for (_, d) in c.iter() {
            if let Some((pattern, min, max)) = &range {
                let key: Vec<Bson> = pattern
                    .keys()
                    .map(|f| {
                        crate::engine::path::get(d, f)
                            .cloned()
                            .unwrap_or(Bson::Null)
                    })
                    .collect();
                let lo: Vec<Bson> = min.values().cloned().collect();
                let hi: Vec<Bson> = max.values().cloned().collect();
                let cmp = |a: &[Bson], b: &[Bson]| {
                    a.iter()
                        .zip(b)
                        .map(|(x, y)| compare(x, y))
                        .find(|o| o.is_ne())
                        .unwrap_or(std::cmp::Ordering::Equal)
                };
                if cmp(&key, &lo).is_lt() || cmp(&key, &hi).is_ge() {
                    continue;
                }
            }
            size += crate::limits::measure(d).bytes as i64;
            n += 1;
        }
    }
    Ok(doc! {
        "estimate": body.get("estimate").is_some_and(truthy),
        "size": size,
        "numObjects": n,
        "millis": start.elapsed().as_millis() as i64,
    })
}

/// `splitVector: "<db>.<coll>", keyPattern, min?, max?, force?, maxChunkSizeBytes? |
/// maxChunkSize? (MB), maxSplitPoints?, maxChunkObjects?`: the keys that cut the documents of
/// `[min, max)` into parts of at most half the chunk size (mongod's rule), or with `force` the
/// one key nearest the middle (what mongos's `split` by `find` or `bounds` asks for). Keys are
/// shard key values, hashed where the pattern hashes; a split key is never the range's first
/// key, and never repeated. Replies `{splitKeys: [...]}`.
pub fn split_vector(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    let ns =
        match body.get("splitVector") {
            Some(Bson::String(s)) => s.clone(),
            _ => return Err(err(
                ErrorCode::TypeMismatch,
                "BSON field 'splitVector.splitVector' is the wrong type, expected type 'string'",
            )),
        };
    let (db, coll) = split_namespace(&ns, "")?;
    let pattern = match body.get("keyPattern") {
        Some(Bson::Document(k)) => crate::routing::ShardKeyPattern::parse(k)
            .map_err(|e| err(ErrorCode::BadValue, e.message))?,
        _ => return Err(err(ErrorCode::BadValue, "keyPattern must be an object")),
    };
    let bound = |field: &str, default: crate::routing::ShardKey| match body.get(field) {
        None => Ok(default),
        Some(Bson::Document(d)) if d.is_empty() => Ok(default),
        Some(Bson::Document(d)) => pattern
            .key_from_document(d)
            .map_err(|e| err(ErrorCode::BadValue, e.message)),
        Some(_) => Err(err(
            ErrorCode::TypeMismatch,
            format!("BSON field 'splitVector.{field}' is the wrong type, expected type 'object'"),
        )),
    };
    let lo = bound("min", pattern.min_key())?;
    let hi = bound("max", pattern.max_key())?;
    let force = body.get("force").is_some_and(truthy);
    let number = |field: &str| -> Option<i64> {
        match body.get(field) {
            Some(Bson::Int32(v)) => Some(i64::from(*v)),
            Some(Bson::Int64(v)) => Some(*v),
            Some(Bson::Double(v)) => Some(*v as i64),
            _ => None,
        }
    };
    let max_bytes = number("maxChunkSizeBytes")
        .or_else(|| number("maxChunkSize").map(|mb| mb.saturating_mul(1024 * 1024)));
    if !force && max_bytes.is_none() {
        return Err(err(
            ErrorCode::InvalidOptions,
            "need to specify the desired max chunk size (maxChunkSize or maxChunkSizeBytes)",
        ));
    }
    let (mut keys, bytes) = {
        let data = svc.data();
        let cat = lock(&data);
        let mut keys = Vec::new();
        let mut bytes = 0i64;
        if let Some(c) = cat.collection(&db, &coll) {
            for (_, d) in c.iter() {
                let raw = bson::RawDocumentBuf::try_from(d)
                    .map_err(|e| err(ErrorCode::InternalError, e.to_string()))?;
                let Ok(key) = pattern.extract_from_document(&raw) else {
                    continue;
                };
                if key < lo || key >= hi {
                    continue;
                }
                bytes += crate::limits::measure(d).bytes as i64;
                keys.push(key);
            }
        }
        (keys, bytes)
    };
    keys.sort();
    let n = keys.len() as i64;
    let per_part = if force {
        (n / 2).max(1)
    } else {
        let average = if n == 0 { 1 } else { (bytes / n).max(1) };
        let by_size = (max_bytes.unwrap_or(0) / 2 / average).max(1);
        match number("maxChunkObjects") {
            Some(objects) if objects > 0 => by_size.min(objects),
            _ => by_size,
        }
    };
    let limit = match number("maxSplitPoints") {
        Some(m) if m > 0 => m as usize,
        _ => usize::MAX,
    };
    let mut split: Vec<&crate::routing::ShardKey> = Vec::new();
    let mut since = 0i64;
    for key in &keys {
        if since >= per_part
            && Some(key) > keys.first()
            && split.last().is_none_or(|last| key > *last)
        {
            split.push(key);
            since = 0;
            if force || split.len() >= limit {
                break;
            }
        }
        since += 1;
    }
    let split: Vec<Bson> = split
        .into_iter()
        .map(|k| Bson::Document(pattern.key_document(k)))
        .collect();
    Ok(doc! {"splitKeys": split})
}

/// `renameCollection` (run against `admin`): moves a collection with its documents, indexes
/// and options; `dropTarget: true` replaces an existing target.
pub fn rename_collection(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    req.require_admin()?;
    let (Some(Bson::String(from)), Some(Bson::String(to))) =
        (body.get("renameCollection"), body.get("to"))
    else {
        return Err(err(
            ErrorCode::TypeMismatch,
            "BSON field 'renameCollection.to' is missing or not a string",
        ));
    };
    let (fdb, fcoll) = split_namespace(from, "source")?;
    let (tdb, tcoll) = split_namespace(to, "target")?;
    if from == to {
        return Err(err(
            ErrorCode::IllegalOperation,
            "Can't rename a collection to itself",
        ));
    }
    let data = svc.data();
    let mut cat = lock(&data);
    if cat.collection(&fdb, &fcoll).is_none() {
        return Err(err(
            ErrorCode::NamespaceNotFound,
            format!("Source collection {from} does not exist"),
        ));
    }
    if cat.collection(&tdb, &tcoll).is_some() && !body.get("dropTarget").is_some_and(truthy) {
        return Err(err(ErrorCode::NamespaceExists, "target namespace exists"));
    }
    let moved = cat
        .dbs
        .get_mut(&fdb)
        .and_then(|colls| colls.remove(&fcoll))
        .ok_or_else(|| err(ErrorCode::NamespaceNotFound, "source vanished"))?;
    if cat.dbs.get(&fdb).is_some_and(|c| c.is_empty()) {
        cat.dbs.remove(&fdb);
    }
    cat.dbs.entry(tdb).or_default().insert(tcoll, moved);
    drop(cat);
    svc.cursors.drop_namespace(from);
    Ok(Document::new())
}
