//! What the embedded shard does for a pipeline that ends in `$out` or `$merge`: the results
//! are written into the target collection of its catalog, as mongod writes them (`$out`
//! replaces the target, keeping its indexes and options, and leaves it untouched when a result
//! cannot be inserted; `$merge` decides per result with [`MergeSpec::action`]). Besides its own
//! cursor, the embedded shard serves other collections to `$lookup` and `$unionWith`.

use bson::{doc, Document};

use super::service::{lock, ShardService};
use super::store::Collection;
use crate::engine::aggregate::{Namespaces, Variables};
use crate::engine::matcher::Matcher;
use crate::engine::output::{MergeAction, MergeSpec, OutputStage};
use crate::engine::update::prepare_insert;
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;

/// The shard's catalog, read by `$lookup` and `$unionWith`.
pub struct CatalogReader<'a>(pub &'a ShardService);

impl Namespaces for CatalogReader<'_> {
    fn documents(&self, db: &str, coll: &str) -> Result<Vec<Document>, EngineError> {
        match super::views::view_documents(self.0, db, coll)? {
            Some(docs) => Ok(docs),
            None => Ok(self.0.documents(db, coll)),
        }
    }
}

/// Writes `results` to the output stage's target.
pub fn write(
    svc: &ShardService,
    stage: &OutputStage,
    results: Vec<Document>,
    vars: &Variables,
) -> Result<(), EngineError> {
    match stage {
        OutputStage::Out { db, coll } => out(svc, db, coll, results),
        OutputStage::Merge(spec) => merge(svc, spec, results, vars),
    }
}

fn out(
    svc: &ShardService,
    db: &str,
    coll: &str,
    results: Vec<Document>,
) -> Result<(), EngineError> {
    let ns = format!("{db}.{coll}");
    let data = svc.data();
    let mut cat = lock(&data);
    let (options, specs) = match cat.collection(db, coll) {
        Some(c) => (
            c.options.clone(),
            c.indexes()
                .iter()
                .filter(|i| i.name != "_id_")
                .map(|i| i.spec.clone())
                .collect::<Vec<_>>(),
        ),
        None => (Document::new(), Vec::new()),
    };
    let mut fresh = Collection::new(options);
    for s in &specs {
        fresh.create_index(&ns, s)?;
    }
    for d in results {
        fresh.insert(&ns, prepare_insert(d)?)?;
    }
    cat.dbs
        .entry(db.to_string())
        .or_default()
        .insert(coll.to_string(), fresh);
    Ok(())
}

fn merge(
    svc: &ShardService,
    spec: &MergeSpec,
    results: Vec<Document>,
    vars: &Variables,
) -> Result<(), EngineError> {
    let ns = format!("{}.{}", spec.db, spec.coll);
    let data = svc.data();
    let mut cat = lock(&data);
    let (c, _) = cat.collection_mut(&spec.db, &spec.coll);
    if spec.on != ["_id"] {
        let wanted: std::collections::BTreeSet<&str> = spec.on.iter().map(|s| s.as_str()).collect();
        let unique = c.indexes().iter().any(|i| {
            i.unique
                && i.key
                    .keys()
                    .map(|k| k.as_str())
                    .collect::<std::collections::BTreeSet<_>>()
                    == wanted
        });
        if !unique {
            return Err(EngineError::new(
                ErrorCode(51183),
                "Cannot find index to verify that join fields will be unique",
            ));
        }
    }
    for result in results {
        let key = spec.key_of(&result)?;
        let mut filter = Document::new();
        for (f, v) in spec.on.iter().zip(key) {
            filter.insert(f.clone(), doc! {"$eq": v});
        }
        let matcher = Matcher::parse(&filter)?;
        let found = c.find(&filter, &matcher).into_iter().next();
        let existing = found.and_then(|rid| c.get(rid).cloned());
        match spec.action(existing.as_ref(), result, vars)? {
            MergeAction::Insert(d) => {
                c.insert(&ns, prepare_insert(d)?)?;
            }
            MergeAction::Replace(d) => {
                if let Some(rid) = found {
                    c.replace(&ns, rid, d)?;
                }
            }
            MergeAction::Nothing => {}
        }
    }
    Ok(())
}
