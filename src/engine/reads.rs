//! The read commands' options — `find`, `count`, `distinct`, `aggregate` — read from a command
//! body with mongod's errors and applied to documents a store found. Every server that answers
//! these commands from documents it holds (the embedded shard, the router's static metadata
//! store for the `config` database) parses them here, so both answer alike; where the
//! documents come from (an index, a scan, a lock) stays with the store.

use bson::{Bson, Document};

use super::aggregate::Variables;
use super::matcher::Matcher;
use super::query::{Projection, SortSpec};
use super::{path, EngineError};
use crate::value::compare::OrdBson;
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy, type_name};

/// Documents in a first batch when the client names no `batchSize`, as mongod.
pub const DEFAULT_BATCH: usize = 101;

/// The variables a request's expressions see: `$$NOW` fixed for the request, its `let`, and
/// its `collation`.
pub fn request_variables(body: &Document) -> Result<Variables, EngineError> {
    let vars = Variables::new().with_collation_option(body.get("collation"))?;
    match body.get("let") {
        None => Ok(vars),
        Some(Bson::Document(l)) => vars.with_let(l, &Document::new()),
        Some(other) => Err(EngineError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field 'let' is the wrong type '{}', expected type 'object'",
                type_name(other)
            ),
        )),
    }
}

/// Whether an aggregation's pipeline starts with `$documents` (the collection-less aggregation
/// a server runs by itself).
pub fn starts_with_documents(body: &Document) -> bool {
    body.get_array("pipeline")
        .ok()
        .and_then(|p| p.first())
        .and_then(|s| s.as_document())
        .is_some_and(|d| d.contains_key("$documents"))
}

/// An optional document argument (`filter`, `sort`, `query`, …): absent or null is empty.
pub fn document_argument(body: &Document, field: &str, cmd: &str) -> Result<Document, EngineError> {
    match body.get(field) {
        None | Some(Bson::Null) => Ok(Document::new()),
        Some(Bson::Document(d)) => Ok(d.clone()),
        Some(other) => Err(EngineError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field '{cmd}.{field}' is the wrong type '{}', expected type 'object'",
                type_name(other)
            ),
        )),
    }
}

/// An optional non-negative count (`skip`, `batchSize`): `None` when absent.
pub fn count_argument(body: &Document, field: &str) -> Result<Option<usize>, EngineError> {
    match body.get(field) {
        None => Ok(None),
        Some(v) => match number_field(body, field) {
            Some(n) if n >= 0 => Ok(Some(n as usize)),
            Some(_) => Err(EngineError::new(
                ErrorCode(51024),
                format!(
                    "BSON field '{field}' value must be >= 0, actual value '{}'",
                    crate::value::render::render_value(v)
                ),
            )),
            None => Err(EngineError::new(
                ErrorCode::TypeMismatch,
                format!("BSON field '{field}' is the wrong type"),
            )),
        },
    }
}

/// A `find`'s options.
#[derive(Debug)]
pub struct FindSpec {
    /// The filter as sent (a store may serve `_id` equality from its index).
    pub filter: Document,
    /// The filter, parsed.
    pub matcher: Matcher,
    /// Order of the results.
    pub sort: SortSpec,
    /// Fields kept or dropped.
    pub projection: Option<Projection>,
    /// Results skipped.
    pub skip: usize,
    /// Most results (`None`: all).
    pub limit: Option<usize>,
    /// The whole result in the first batch, no cursor (`singleBatch`, or a negative `limit`).
    pub single_batch: bool,
    /// Documents in the first batch (`usize::MAX` with `single_batch`).
    pub batch_size: usize,
}

impl FindSpec {
    /// Reads a `find` body, checking its fields in mongod's order.
    pub fn parse(body: &Document) -> Result<FindSpec, EngineError> {
        let filter = document_argument(body, "filter", "find")?;
        let sort = SortSpec::parse(&document_argument(body, "sort", "find")?)?;
        let projection = Projection::parse(&document_argument(body, "projection", "find")?)?;
        let skip = count_argument(body, "skip")?.unwrap_or(0);
        let mut single_batch = body.get("singleBatch").is_some_and(truthy);
        let limit = match number_field(body, "limit") {
            Some(l) if l < 0 => {
                single_batch = true;
                Some(l.unsigned_abs() as usize)
            }
            Some(0) | None => None,
            Some(l) => Some(l as usize),
        };
        let vars = request_variables(body)?;
        let sort = sort.with_collation(vars.collation().cloned());
        let matcher = Matcher::parse_with(&filter, &vars)?;
        let batch_size = count_argument(body, "batchSize")?.unwrap_or(DEFAULT_BATCH);
        Ok(FindSpec {
            filter,
            matcher,
            sort,
            projection,
            skip,
            limit,
            single_batch,
            batch_size: if single_batch { usize::MAX } else { batch_size },
        })
    }

    /// The result from the documents that match: sorted, skipped, limited, projected.
    pub fn finish(&self, mut docs: Vec<Document>) -> Vec<Document> {
        self.sort.sort(&mut docs);
        docs.into_iter()
            .skip(self.skip)
            .take(self.limit.unwrap_or(usize::MAX))
            .map(|d| match &self.projection {
                Some(p) => p.apply_matched(&d, Some(&self.matcher)),
                None => d,
            })
            .collect()
    }
}

/// A `count`'s options.
#[derive(Debug)]
pub struct CountSpec {
    /// The query as sent.
    pub query: Document,
    /// The query, parsed.
    pub matcher: Matcher,
    skip: usize,
    limit: Option<i64>,
}

impl CountSpec {
    /// Reads a `count` body.
    pub fn parse(body: &Document) -> Result<CountSpec, EngineError> {
        let query = document_argument(body, "query", "count")?;
        let matcher = Matcher::parse_with(&query, &request_variables(body)?)?;
        let skip = count_argument(body, "skip")?.unwrap_or(0);
        Ok(CountSpec {
            query,
            matcher,
            skip,
            limit: number_field(body, "limit").filter(|l| *l != 0),
        })
    }

    /// The `n` of the reply when `matched` documents match, as mongod types it.
    pub fn reply_count(&self, matched: usize) -> Bson {
        let mut n = matched.saturating_sub(self.skip);
        if let Some(l) = self.limit {
            n = n.min(l.unsigned_abs() as usize);
        }
        count_value(n as i64)
    }
}

/// A count in a reply: an int32 when it fits, as mongod sends `n`.
pub fn count_value(n: i64) -> Bson {
    i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n))
}

/// A `distinct`'s options.
#[derive(Debug)]
pub struct DistinctSpec {
    key: String,
    /// The query as sent.
    pub query: Document,
    /// The query, parsed.
    pub matcher: Matcher,
    collation: Option<std::sync::Arc<super::collation::Collation>>,
}

impl DistinctSpec {
    /// Reads a `distinct` body.
    pub fn parse(body: &Document) -> Result<DistinctSpec, EngineError> {
        let key = body.get_str("key").map_err(|_| {
            EngineError::new(
                ErrorCode(40414),
                "BSON field 'distinct.key' is missing but a required field",
            )
        })?;
        path::check_field_path(key)?;
        let query = document_argument(body, "query", "distinct")?;
        let vars = request_variables(body)?;
        let matcher = Matcher::parse_with(&query, &vars)?;
        Ok(DistinctSpec {
            key: key.to_string(),
            query,
            matcher,
            collation: vars.collation().cloned(),
        })
    }

    /// The distinct values of the key over the matching documents, in MongoDB's order (array
    /// values count element by element). Under a collation, values it holds equal are one,
    /// the first seen standing for them.
    pub fn values<'a>(&self, docs: impl IntoIterator<Item = &'a Document>) -> Vec<Bson> {
        distinct_values(
            docs.into_iter()
                .flat_map(|d| path::lookup(d, &self.key).expanded().into_iter().cloned()),
            self.collation.as_deref(),
        )
    }
}

/// Distinct values in MongoDB's order; under a collation, values it holds equal are one, the
/// first seen standing for them (the router merges shards' `distinct` replies with it too).
pub fn distinct_values(
    values: impl IntoIterator<Item = Bson>,
    collation: Option<&super::collation::Collation>,
) -> Vec<Bson> {
    let mut set: std::collections::BTreeMap<OrdBson, Bson> = Default::default();
    for v in values {
        let key = match collation {
            Some(c) if super::collation::has_string(&v) => OrdBson(c.key_value(&v)),
            _ => OrdBson(v.clone()),
        };
        set.entry(key).or_insert(v);
    }
    set.into_values().collect()
}

/// An `aggregate`'s pipeline and first batch size, after the collection name was read.
#[derive(Debug)]
pub struct AggregateSpec<'a> {
    /// The stages.
    pub pipeline: &'a [Bson],
    /// Documents in the first batch.
    pub batch_size: usize,
}

impl<'a> AggregateSpec<'a> {
    /// Reads the pipeline and the `cursor` option (required unless `explain`).
    pub fn parse(body: &'a Document) -> Result<AggregateSpec<'a>, EngineError> {
        let Ok(pipeline) = body.get_array("pipeline") else {
            return Err(EngineError::new(
                ErrorCode::TypeMismatch,
                "'pipeline' option must be specified as an array",
            ));
        };
        let cursor = match body.get("cursor") {
            Some(Bson::Document(c)) => c.clone(),
            _ if body.get("explain").is_some_and(truthy) => Document::new(),
            _ => return Err(EngineError::new(
                ErrorCode::FailedToParse,
                "The 'cursor' option is required, except for aggregate with the explain argument",
            )),
        };
        Ok(AggregateSpec {
            pipeline,
            batch_size: count_argument(&cursor, "batchSize")?.unwrap_or(DEFAULT_BATCH),
        })
    }
}

/// The only index a collection without secondary indexes has, as `listIndexes` and
/// `listCollections`' `idIndex` show it.
pub fn id_index_spec() -> Document {
    bson::doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"}
}

/// One collection's entry in a `listCollections` reply, as mongod gives it (`nameOnly`: the
/// name and type alone).
pub fn collection_entry(
    name: &str,
    options: &Document,
    uuid: bson::Uuid,
    name_only: bool,
) -> Document {
    if name_only {
        return bson::doc! {"name": name, "type": "collection"};
    }
    bson::doc! {
        "name": name,
        "type": "collection",
        "options": options.clone(),
        "info": {"readOnly": false, "uuid": uuid},
        "idIndex": id_index_spec(),
    }
}

/// A `collStats` reply for `ns` (without `ok`): `count` documents of `size` stored bytes
/// under `nindexes` indexes (all zero for a collection that does not exist, as mongod).
pub fn coll_stats_reply(ns: &str, count: i64, size: i64, nindexes: i32) -> Document {
    let avg = if count > 0 { size / count } else { 0 };
    bson::doc! {
        "ns": ns, "size": size, "count": count, "avgObjSize": avg, "storageSize": size,
        "nindexes": nindexes, "totalIndexSize": 0i64, "totalSize": size, "indexSizes": {},
    }
}

/// A `dbStats` reply for `db` (without `ok`): `collections` collections holding `objects`
/// documents of `size` stored bytes under `indexes` indexes.
pub fn db_stats_reply(
    db: &str,
    collections: i64,
    objects: i64,
    size: i64,
    indexes: i64,
) -> Document {
    let avg = if objects > 0 {
        size as f64 / objects as f64
    } else {
        0.0
    };
    bson::doc! {
        "db": db, "collections": collections, "views": 0i64, "objects": objects,
        "avgObjSize": avg, "dataSize": size as f64, "storageSize": size as f64,
        "indexes": indexes, "indexSize": 0.0, "totalSize": size as f64, "scaleFactor": 1i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// A request's `collation` reaches its filter, its sort and `distinct`'s set.
    #[test]
    fn requests_read_under_their_collation() {
        let docs = [
            doc! {"_id": 1, "s": "PING"},
            doc! {"_id": 2, "s": "ping"},
            doc! {"_id": 3, "s": "Pong"},
        ];
        let coll = doc! {"locale": "en_US", "strength": 2};
        let d = DistinctSpec::parse(&doc! {"distinct": "c", "key": "s", "collation": coll.clone()})
            .unwrap();
        assert_eq!(
            d.values(&docs),
            vec![Bson::from("PING"), Bson::from("Pong")]
        );
        let plain = DistinctSpec::parse(&doc! {"distinct": "c", "key": "s"}).unwrap();
        assert_eq!(plain.values(&docs).len(), 3);
        let f = FindSpec::parse(&doc! {"find": "c", "filter": {"s": "ping"}, "sort": {"s": -1}, "collation": coll.clone()}).unwrap();
        let hits: Vec<Document> = docs
            .iter()
            .filter(|d| f.matcher.matches(d))
            .cloned()
            .collect();
        assert_eq!(hits.len(), 2);
        let c = CountSpec::parse(
            &doc! {"count": "c", "query": {"s": {"$gte": "PO"}}, "collation": coll},
        )
        .unwrap();
        assert_eq!(docs.iter().filter(|d| c.matcher.matches(d)).count(), 1);
        let e = FindSpec::parse(&doc! {"find": "c", "collation": {"locale": "en", "x": 1}})
            .unwrap_err();
        assert_eq!(e.code.0, 40415);
    }

    #[test]
    fn find_applies_sort_skip_limit_projection_in_order() {
        let spec = FindSpec::parse(&doc! {
            "find": "c", "filter": {"a": {"$gte": 1}}, "sort": {"a": -1}, "skip": 1, "limit": 2,
            "projection": {"_id": 0, "a": 1},
        })
        .unwrap();
        let docs: Vec<Document> = (0..5).map(|i| doc! {"_id": i, "a": i, "b": i}).collect();
        let matched: Vec<Document> = docs
            .into_iter()
            .filter(|d| spec.matcher.matches(d))
            .collect();
        assert_eq!(spec.finish(matched), vec![doc! {"a": 3}, doc! {"a": 2}]);
        assert_eq!(spec.batch_size, DEFAULT_BATCH);
        let single = FindSpec::parse(&doc! {"find": "c", "limit": -3}).unwrap();
        assert!(single.single_batch);
        assert_eq!((single.limit, single.batch_size), (Some(3), usize::MAX));
    }

    #[test]
    fn bad_arguments_get_mongods_errors() {
        let e = FindSpec::parse(&doc! {"find": "c", "filter": 1}).unwrap_err();
        assert_eq!(e.code, ErrorCode::TypeMismatch);
        let e = FindSpec::parse(&doc! {"find": "c", "skip": -1}).unwrap_err();
        assert_eq!(e.code, ErrorCode(51024));
        let e = DistinctSpec::parse(&doc! {"distinct": "c"}).unwrap_err();
        assert_eq!(e.code, ErrorCode(40414));
        let e = AggregateSpec::parse(&doc! {"aggregate": "c", "pipeline": []}).unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedToParse);
    }

    #[test]
    fn count_and_distinct() {
        let spec = CountSpec::parse(&doc! {"count": "c", "skip": 1, "limit": -2}).unwrap();
        assert_eq!(spec.reply_count(5), Bson::Int32(2));
        assert_eq!(spec.reply_count(0), Bson::Int32(0));
        let spec = DistinctSpec::parse(&doc! {"distinct": "c", "key": "a"}).unwrap();
        let docs = [doc! {"a": [2, 1]}, doc! {"a": 1}, doc! {"b": 1}];
        assert_eq!(spec.values(&docs), vec![Bson::Int32(1), Bson::Int32(2)]);
    }
}
