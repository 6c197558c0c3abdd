//! Views on the embedded shard, as mongod keeps them: a read-only namespace defined by a
//! source namespace of the same database (`viewOn`, a collection or another view) and a
//! pipeline. `create` with `viewOn` defines one (`collMod` with `viewOn`/`pipeline` redefines
//! it, `drop` removes it); `find`, `count`, `distinct` and `aggregate` on a view read the
//! source's documents through the view's pipeline (a chain of views through each pipeline in
//! turn, innermost first); writes, index commands and other commands that need a collection
//! get 166, CommandNotSupportedOnView. A definition that would make a cycle is refused with
//! GraphContainsCycle (5), a chain deeper than mongod's 20 with ViewDepthLimitExceeded (165).
//!
//! A view lives in the catalog as an entry without documents whose options hold its
//! definition; `listCollections` lists it with `type: "view"`.

use bson::{Bson, Document};

use super::service::{lock, ShardService};
use super::store::{Catalog, Collection};
use crate::engine::aggregate;
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;

/// The longest chain of views mongod resolves (`ViewGraph::kMaxViewDepth`).
pub const MAX_VIEW_DEPTH: usize = 20;

/// Commands that need a collection: on a view they get 166.
const NOT_ON_VIEWS: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "createIndexes",
    "dropIndexes",
    "deleteIndexes",
    "listIndexes",
    "validate",
    "splitVector",
];

/// Options of a collection that a view cannot have.
const COLLECTION_ONLY_OPTIONS: &[&str] = &[
    "capped",
    "size",
    "max",
    "autoIndexId",
    "idIndex",
    "validator",
    "validationLevel",
    "validationAction",
    "storageEngine",
    "indexOptionDefaults",
    "timeseries",
    "expireAfterSeconds",
    "clusteredIndex",
    "changeStreamPreAndPostImages",
    "encryptedFields",
    "index",
];

/// Whether a catalog entry is a view.
pub fn is_view(c: &Collection) -> bool {
    c.options.contains_key("viewOn")
}

/// A view's source and pipeline.
fn definition(c: &Collection) -> Option<(String, Vec<Document>)> {
    let on = c.options.get_str("viewOn").ok()?.to_string();
    let pipeline = c
        .options
        .get_array("pipeline")
        .map(|a| a.iter().filter_map(|s| s.as_document().cloned()).collect())
        .unwrap_or_default();
    Some((on, pipeline))
}

fn depth_exceeded() -> EngineError {
    EngineError::new(
        ErrorCode::ViewDepthLimitExceeded,
        format!("View depth too deep or view cycle detected; maximum depth is {MAX_VIEW_DEPTH}"),
    )
}

/// `db.coll` resolved through its views: `None` if it is not a view (a collection, or
/// nothing); otherwise the collection the chain ends at and the whole pipeline to run on it.
pub fn resolve(
    cat: &Catalog,
    db: &str,
    coll: &str,
) -> Result<Option<(String, Vec<Document>)>, EngineError> {
    let mut name = coll.to_string();
    let mut pipeline: Vec<Document> = Vec::new();
    for depth in 0..=MAX_VIEW_DEPTH {
        match cat.collection(db, &name).and_then(definition) {
            None if depth == 0 => return Ok(None),
            None => return Ok(Some((name, pipeline))),
            Some((on, mut p)) => {
                p.extend(pipeline);
                pipeline = p;
                name = on;
            }
        }
    }
    Err(depth_exceeded())
}

/// Whether `name` is a command that needs a collection (and gets 166 on a view).
pub fn needs_collection(name: &str) -> bool {
    NOT_ON_VIEWS.contains(&name)
}

/// The error of a command that needs a collection, when `db.coll` is a view.
pub fn check_not_view(cat: &Catalog, name: &str, db: &str, coll: &str) -> Result<(), EngineError> {
    if !NOT_ON_VIEWS.contains(&name) {
        return Ok(());
    }
    match cat.collection(db, coll) {
        Some(c) if is_view(c) => Err(EngineError::new(
            ErrorCode::CommandNotSupportedOnView,
            format!("Namespace {db}.{coll} is a view, not a collection"),
        )),
        _ => Ok(()),
    }
}

/// A view definition from `create` (or `collMod`) arguments: the options to keep.
pub fn parse_definition(cmd: &str, body: &Document) -> Result<Document, EngineError> {
    let on = match body.get("viewOn") {
        Some(Bson::String(s)) if !s.is_empty() => s.clone(),
        Some(Bson::String(_)) => {
            return Err(EngineError::new(
                ErrorCode::BadValue,
                "'viewOn' cannot be empty",
            ))
        }
        Some(other) => {
            return Err(EngineError::wrong_type(
                &format!("{cmd}.viewOn"),
                other,
                "string",
            ))
        }
        None => {
            return Err(EngineError::new(
                ErrorCode::BadValue,
                "'pipeline' requires 'viewOn' to also be specified",
            ))
        }
    };
    let pipeline = match body.get("pipeline") {
        None => Vec::new(),
        Some(Bson::Array(a)) => a.clone(),
        Some(other) => {
            return Err(EngineError::wrong_type(
                &format!("{cmd}.pipeline"),
                other,
                "array",
            ))
        }
    };
    for stage in &pipeline {
        let Bson::Document(s) = stage else {
            return Err(EngineError::new(
                ErrorCode::TypeMismatch,
                "Each element of the 'pipeline' array must be an object",
            ));
        };
        for name in ["$out", "$merge", "$changeStream"] {
            if s.contains_key(name) {
                return Err(EngineError::new(
                    ErrorCode::OptionNotSupportedOnView,
                    format!("{name} cannot be used in a view definition"),
                ));
            }
        }
    }
    if let Some(k) = body
        .keys()
        .find(|k| COLLECTION_ONLY_OPTIONS.contains(&k.as_str()))
    {
        return Err(EngineError::new(
            ErrorCode::InvalidOptions,
            format!("option '{k}' is not supported for views"),
        ));
    }
    let mut options = bson::doc! {"viewOn": on, "pipeline": pipeline};
    if let Some(c) = body.get("collation") {
        options.insert("collation", c.clone());
    }
    Ok(options)
}

/// Checks that defining `db.name` as `options` makes no cycle and no chain deeper than
/// mongod allows.
pub fn check_graph(
    cat: &Catalog,
    db: &str,
    name: &str,
    options: &Document,
) -> Result<(), EngineError> {
    let mut chain = vec![format!("{db}.{name}")];
    let mut next = options.get_str("viewOn").unwrap_or_default().to_string();
    for _ in 0..MAX_VIEW_DEPTH {
        chain.push(format!("{db}.{next}"));
        if next == name {
            return Err(EngineError::new(
                ErrorCode::GraphContainsCycle,
                format!("View cycle detected: [{}]", chain.join(", ")),
            ));
        }
        match cat.collection(db, &next).and_then(definition) {
            Some((on, _)) => next = on,
            None => return Ok(()),
        }
    }
    Err(depth_exceeded())
}

/// The documents of view `db.coll` (`None` if it is not a view): the source collection's
/// documents through the resolved pipeline.
pub fn view_documents(
    svc: &ShardService,
    db: &str,
    coll: &str,
) -> Result<Option<Vec<Document>>, EngineError> {
    let data = svc.data();
    let (pipeline, docs) = {
        let cat = lock(&data);
        let Some((base, pipeline)) = resolve(&cat, db, coll)? else {
            return Ok(None);
        };
        let docs: Vec<Document> = cat
            .collection(db, &base)
            .map(|c| c.iter().map(|(_, d)| d.clone()).collect())
            .unwrap_or_default();
        (pipeline, docs)
    };
    let stages: Vec<Bson> = pipeline.into_iter().map(Bson::Document).collect();
    let options = aggregate::AggregateOptions::for_request(svc.stage_memory(), &Document::new());
    let reader = super::pipeline_output::CatalogReader(svc);
    let env = aggregate::Env {
        db: db.to_string(),
        vars: aggregate::Variables::new(),
        namespaces: Some(&reader),
    };
    crate::sync::off_the_worker(|| aggregate::run_in(&stages, docs, &options, &env)).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn catalog() -> Catalog {
        let mut cat = Catalog::default();
        cat.collection_mut("db", "c");
        for (v, on) in [("v1", "c"), ("v2", "v1")] {
            let options = doc! {"viewOn": on, "pipeline": [{"$match": {"v": v}}]};
            cat.dbs
                .entry("db".into())
                .or_default()
                .insert(v.into(), Collection::new(options));
        }
        cat
    }

    #[test]
    fn a_chain_resolves_to_its_collection_with_the_pipelines_innermost_first() {
        let cat = catalog();
        assert_eq!(resolve(&cat, "db", "c").unwrap(), None);
        assert_eq!(resolve(&cat, "db", "none").unwrap(), None);
        let (base, p) = resolve(&cat, "db", "v2").unwrap().unwrap();
        assert_eq!(base, "c");
        assert_eq!(
            p,
            vec![doc! {"$match": {"v": "v1"}}, doc! {"$match": {"v": "v2"}}]
        );
    }

    #[test]
    fn cycles_and_deep_chains_are_refused() {
        let mut cat = catalog();
        let cyc = doc! {"viewOn": "v2", "pipeline": []};
        let e = check_graph(&cat, "db", "v1", &cyc).unwrap_err();
        assert_eq!(e.code, ErrorCode::GraphContainsCycle);
        assert!(e.message.contains("db.v1, db.v2, db.v1"), "{}", e.message);
        let mut prev = "c".to_string();
        for i in 0..MAX_VIEW_DEPTH {
            let name = format!("d{i}");
            let options = doc! {"viewOn": prev.clone(), "pipeline": []};
            check_graph(&cat, "db", &name, &options).unwrap();
            cat.dbs
                .entry("db".into())
                .or_default()
                .insert(name.clone(), Collection::new(options));
            prev = name;
        }
        let options = doc! {"viewOn": prev, "pipeline": []};
        let e = check_graph(&cat, "db", "deeper", &options).unwrap_err();
        assert_eq!(e.code, ErrorCode::ViewDepthLimitExceeded);
        assert!(check_not_view(&cat, "insert", "db", "v1").is_err());
        assert!(check_not_view(&cat, "find", "db", "v1").is_ok());
        assert!(check_not_view(&cat, "insert", "db", "c").is_ok());
    }

    #[test]
    fn definitions_are_checked_as_mongod_checks_them() {
        let ok = parse_definition(
            "create",
            &doc! {"create": "v", "viewOn": "c", "pipeline": [{"$match": {}}]},
        )
        .unwrap();
        assert_eq!(ok.get_str("viewOn").unwrap(), "c");
        let cases = [
            (doc! {"create": "v", "viewOn": 1}, ErrorCode::TypeMismatch),
            (
                doc! {"create": "v", "viewOn": "c", "pipeline": {}},
                ErrorCode::TypeMismatch,
            ),
            (
                doc! {"create": "v", "viewOn": "c", "pipeline": [{"$out": "x"}]},
                ErrorCode::OptionNotSupportedOnView,
            ),
            (
                doc! {"create": "v", "viewOn": "c", "capped": true},
                ErrorCode::InvalidOptions,
            ),
        ];
        for (body, code) in cases {
            assert_eq!(
                parse_definition("create", &body).unwrap_err().code,
                code,
                "{body}"
            );
        }
    }
}
