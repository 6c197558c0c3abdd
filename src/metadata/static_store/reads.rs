//! Clients' reads of the `config` database, answered from the store's documents with the
//! document engine ([`crate::engine::reads`]) and the shared cursors
//! ([`crate::command::cursors`]), in the shapes mongod gives the same commands.

use bson::{doc, Bson, Document};

use super::StaticStore;
use crate::command::{CommandError, CommandRequest};
use crate::engine::aggregate::{self, AggregateOptions, Env, Namespaces};
use crate::engine::matcher::Matcher;
use crate::engine::reads::{
    coll_stats_reply, collection_entry, db_stats_reply, document_argument, id_index_spec,
    request_variables, starts_with_documents, AggregateSpec, CountSpec, DistinctSpec, FindSpec,
};
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::truthy;

/// The config database's commands that are served (it is read-only).
pub const CONFIG_READS: &[&str] = &[
    "find",
    "aggregate",
    "count",
    "distinct",
    "getMore",
    "killCursors",
    "listCollections",
    "listIndexes",
    "collStats",
    "dbStats",
];

/// Bytes of a document as stored.
fn stored_size(d: &Document) -> i64 {
    d.to_vec().map(|v| v.len() as i64).unwrap_or(0)
}

/// `$lookup` and `$unionWith` in a config read see the other config collections.
impl Namespaces for StaticStore {
    fn documents(&self, db: &str, coll: &str) -> Result<Vec<Document>, EngineError> {
        Ok(if db == "config" {
            StaticStore::documents(self, coll)
        } else {
            Vec::new()
        })
    }
}

impl StaticStore {
    /// Serves one of [`CONFIG_READS`] on the `config` database (the caller refuses the rest).
    /// The reply has no `ok`.
    pub fn config_read(&self, req: &CommandRequest) -> Result<Document, CommandError> {
        let body = req.body_document();
        if body.get("startTransaction").is_some_and(truthy)
            || matches!(body.get("autocommit"), Some(Bson::Boolean(false)))
        {
            return Err(CommandError::new(
                ErrorCode::IllegalOperation,
                "Transactions are not supported on the config database",
            ));
        }
        match req.name.as_str() {
            "find" => {
                let coll = req.collection_name(&body)?;
                let spec = FindSpec::parse(&body)?;
                let docs = self.matching(&coll, &spec.matcher);
                Ok(self.cursors.first_batch(
                    format!("{}.{coll}", req.db),
                    spec.finish(docs),
                    spec.batch_size,
                    spec.single_batch,
                ))
            }
            "getMore" => self.cursors.get_more(&req.db, &body),
            "killCursors" => {
                req.collection_name(&body)?;
                self.cursors.kill(&body)
            }
            "count" => {
                let coll = req.collection_name(&body)?;
                let spec = CountSpec::parse(&body)?;
                Ok(doc! {"n": spec.reply_count(self.matching(&coll, &spec.matcher).len())})
            }
            "distinct" => {
                let coll = req.collection_name(&body)?;
                let spec = DistinctSpec::parse(&body)?;
                Ok(doc! {"values": spec.values(&self.matching(&coll, &spec.matcher))})
            }
            "aggregate" => self.aggregate(req, &body),
            "listCollections" => self.list_collections(req, &body),
            "listIndexes" => {
                let coll = req.collection_name(&body)?;
                let ns = format!("{}.{coll}", req.db);
                if !self.read().contains_key(&coll) {
                    return Err(CommandError::new(
                        ErrorCode::NamespaceNotFound,
                        format!("ns does not exist: {ns}"),
                    ));
                }
                Ok(self
                    .cursors
                    .first_batch(ns, vec![id_index_spec()], usize::MAX, true))
            }
            "collStats" => {
                let coll = req.collection_name(&body)?;
                let (count, size, nindexes) = match self.read().get(&coll) {
                    Some(c) => (
                        c.docs.len() as i64,
                        c.docs.iter().map(stored_size).sum::<i64>(),
                        1i32,
                    ),
                    None => (0, 0, 0),
                };
                Ok(coll_stats_reply(
                    &format!("{}.{coll}", req.db),
                    count,
                    size,
                    nindexes,
                ))
            }
            "dbStats" => {
                let config = self.read();
                let colls = config.len() as i64;
                let objects: i64 = config.values().map(|c| c.docs.len() as i64).sum();
                let size: i64 = config
                    .values()
                    .flat_map(|c| c.docs.iter())
                    .map(stored_size)
                    .sum();
                Ok(db_stats_reply(&req.db, colls, objects, size, colls))
            }
            other => Err(CommandError::new(
                ErrorCode::IllegalOperation,
                format!(
                    "Sluice serves the config database read-only; '{other}' is not allowed on it"
                ),
            )),
        }
    }

    /// The documents of `config.<coll>` that match, in insertion order.
    fn matching(&self, coll: &str, matcher: &Matcher) -> Vec<Document> {
        self.read()
            .get(coll)
            .map(|c| {
                c.docs
                    .iter()
                    .filter(|d| matcher.matches(d))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    fn aggregate(&self, req: &CommandRequest, body: &Document) -> Result<Document, CommandError> {
        let coll = match body.get("aggregate") {
            Some(Bson::String(_)) => req.collection_name(body)?,
            Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(_))
                if starts_with_documents(body) =>
            {
                "$cmd.aggregate".to_string()
            }
            Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(_)) => {
                return Err(CommandError::new(
                    ErrorCode::InvalidNamespace,
                    "collection-less aggregations ({aggregate: 1}) are supported on the config database only with $documents",
                ))
            }
            _ => {
                return Err(CommandError::new(
                    ErrorCode::InvalidNamespace,
                    "Invalid collection name specified",
                ))
            }
        };
        let spec = AggregateSpec::parse(body)?;
        let (stages, output) = crate::engine::output::split_output(spec.pipeline, &req.db)?;
        if output.is_some() {
            return Err(CommandError::new(
                ErrorCode::IllegalOperation,
                "Sluice serves the config database read-only; $out and $merge are not allowed on it",
            ));
        }
        let env = Env {
            db: req.db.clone(),
            vars: request_variables(body)?,
            namespaces: Some(self),
        };
        let docs = if coll == "$cmd.aggregate" {
            Vec::new()
        } else {
            self.matching(&coll, &Matcher::all())
        };
        let options =
            AggregateOptions::for_request(crate::limits::DEFAULT_STAGE_MEMORY_BYTES, body);
        let out = crate::sync::off_the_worker(|| aggregate::run_in(stages, docs, &options, &env))?;
        Ok(self
            .cursors
            .first_batch(format!("{}.{coll}", req.db), out, spec.batch_size, false))
    }

    fn list_collections(
        &self,
        req: &CommandRequest,
        body: &Document,
    ) -> Result<Document, CommandError> {
        let filter = document_argument(body, "filter", "listCollections")?;
        let matcher = Matcher::parse(&filter)?;
        let name_only = body.get("nameOnly").is_some_and(truthy);
        let out: Vec<Document> = self
            .read()
            .iter()
            .map(|(name, c)| collection_entry(name, &Document::new(), c.uuid, name_only))
            .filter(|d| matcher.matches(d))
            .collect();
        Ok(self.cursors.first_batch(
            format!("{}.$cmd.listCollections", req.db),
            out,
            usize::MAX,
            true,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::ShardInfo;

    fn req(body: Document) -> CommandRequest {
        CommandRequest::from_document("config", &body).unwrap()
    }

    fn store() -> StaticStore {
        let store = StaticStore::open(None).unwrap();
        let shards: Vec<ShardInfo> = (0..3)
            .map(|i| ShardInfo {
                id: format!("shard{i}"),
                addr: format!("127.0.0.1:{}", 40000 + i),
                shard_server: true,
            })
            .collect();
        store.set_shards(&shards).unwrap();
        store
    }

    #[test]
    fn find_sorts_and_pages_through_a_cursor() {
        let store = store();
        let r = store
            .config_read(&req(
                doc! {"find": "shards", "sort": {"_id": -1}, "batchSize": 2, "projection": {"host": 1}},
            ))
            .unwrap();
        let c = r.get_document("cursor").unwrap();
        let first = c.get_array("firstBatch").unwrap();
        assert_eq!(
            first,
            &vec![
                Bson::Document(doc! {"_id": "shard2", "host": "shard2/127.0.0.1:40002"}),
                Bson::Document(doc! {"_id": "shard1", "host": "shard1/127.0.0.1:40001"})
            ]
        );
        assert_eq!(c.get_str("ns").unwrap(), "config.shards");
        let id = c.get_i64("id").unwrap();
        let more = store
            .config_read(&req(doc! {"getMore": id, "collection": "shards"}))
            .unwrap();
        let c = more.get_document("cursor").unwrap();
        assert_eq!(c.get_array("nextBatch").unwrap().len(), 1);
        assert_eq!(c.get_i64("id").unwrap(), 0);
    }

    #[test]
    fn count_distinct_aggregate_and_the_catalog() {
        let store = store();
        let n = store
            .config_read(&req(
                doc! {"count": "shards", "query": {"_id": {"$ne": "shard0"}}},
            ))
            .unwrap();
        assert_eq!(n.get_i32("n").unwrap(), 2);
        let v = store
            .config_read(&req(doc! {"distinct": "shards", "key": "state"}))
            .unwrap();
        assert_eq!(v.get_array("values").unwrap(), &vec![Bson::Int32(1)]);
        let a = store
            .config_read(&req(
                doc! {"aggregate": "shards", "pipeline": [{"$count": "n"}], "cursor": {}},
            ))
            .unwrap();
        let first = a
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap();
        assert_eq!(first, &vec![Bson::Document(doc! {"n": 3})]);
        let joined = store
            .config_read(&req(doc! {
                "aggregate": "version",
                "pipeline": [
                    {"$lookup": {"from": "shards", "pipeline": [{"$count": "n"}], "as": "s"}},
                    {"$project": {"_id": 0, "s": 1}},
                ],
                "cursor": {},
            }))
            .unwrap();
        let first = joined
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap();
        assert_eq!(first, &vec![Bson::Document(doc! {"s": [{"n": 3}]})]);
        let l = store
            .config_read(&req(doc! {"listCollections": 1, "nameOnly": true}))
            .unwrap();
        let names: Vec<&str> = l
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap()
            .iter()
            .filter_map(|d| d.as_document()?.get_str("name").ok())
            .collect();
        assert_eq!(names, ["shards", "version"]);
        let e = store
            .config_read(&req(doc! {"listIndexes": "chunks"}))
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NamespaceNotFound);
        let e = store
            .config_read(&req(doc! {"find": "shards", "filter": {"$bad": 1}}))
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadValue);
    }
}
