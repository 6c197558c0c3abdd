//! The embedded shard's storage: databases of collections of documents, in memory, in
//! insertion order, with the unique `_id` index and any unique secondary index enforced.
//!
//! Non-unique secondary indexes are kept as metadata only (`listIndexes` shows them); queries
//! scan, except an `_id` equality, which uses the `_id` index. An array value in a unique
//! secondary index is indexed as a whole (MongoDB indexes each element); documented as a
//! limitation of the embedded shard.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use crate::engine::matcher::Matcher;
use crate::engine::EngineError;
use crate::value::compare::OrdBson;
use crate::value::error_codes::ErrorCode;
use crate::value::render::render_doc;

/// A record id: the position of a document in insertion order.
pub type RecordId = u64;

/// One index's definition.
#[derive(Debug, Clone)]
pub struct IndexSpec {
    /// Its name (`_id_`, `a_1`, …).
    pub name: String,
    /// Its key pattern.
    pub key: Document,
    /// Whether it enforces uniqueness.
    pub unique: bool,
    /// The specification as `listIndexes` shows it.
    pub spec: Document,
}

/// One collection.
#[derive(Debug, Clone)]
pub struct Collection {
    /// The collection's UUID.
    pub uuid: bson::Uuid,
    /// Options given to `create`.
    pub options: Document,
    docs: BTreeMap<RecordId, Document>,
    next_rid: RecordId,
    id_index: BTreeMap<OrdBson, RecordId>,
    indexes: Vec<IndexSpec>,
    unique_entries: BTreeMap<String, BTreeMap<Vec<OrdBson>, RecordId>>,
    /// How many times each record was replaced in place (absent: never), so a document's
    /// identity (record id, replacements) changes with every write to it.
    stamps: BTreeMap<RecordId, u64>,
    /// In a transaction's private copy: each `_id` the transaction wrote, with the identity the
    /// document had in the transaction's snapshot (`None`: it did not exist there).
    journal: Option<BTreeMap<OrdBson, Option<DocIdentity>>>,
}

/// What a document is in one collection at one time: its record id and how many times that
/// record was replaced. A write to the document, a delete or a delete and re-insert all change
/// it; transactions compare it to detect write conflicts.
pub type DocIdentity = (RecordId, u64);

impl Default for Collection {
    fn default() -> Self {
        Collection::new(Document::new())
    }
}

impl Collection {
    /// An empty collection with only the `_id` index.
    pub fn new(options: Document) -> Self {
        Collection {
            uuid: bson::Uuid::new(),
            options,
            docs: BTreeMap::new(),
            next_rid: 1,
            id_index: BTreeMap::new(),
            indexes: vec![IndexSpec {
                name: "_id_".into(),
                key: doc! {"_id": 1},
                unique: true,
                spec: crate::engine::reads::id_index_spec(),
            }],
            unique_entries: BTreeMap::new(),
            stamps: BTreeMap::new(),
            journal: None,
        }
    }

    /// The identity of the document with this `_id`, if there is one.
    pub fn identity(&self, id: &Bson) -> Option<DocIdentity> {
        let rid = *self.id_index.get(&OrdBson(id.clone()))?;
        Some((rid, self.stamps.get(&rid).copied().unwrap_or(0)))
    }

    /// The record id and document with this `_id`, if there is one.
    pub fn by_id(&self, id: &Bson) -> Option<(RecordId, &Document)> {
        let rid = *self.id_index.get(&OrdBson(id.clone()))?;
        Some((rid, self.docs.get(&rid)?))
    }

    /// Starts recording which documents are written (a transaction's private copy).
    pub fn start_journal(&mut self) {
        self.journal = Some(BTreeMap::new());
    }

    /// The documents written since [`Collection::start_journal`], with their identities in the
    /// snapshot (empty when no journal is kept).
    pub fn journal(&self) -> impl Iterator<Item = (&OrdBson, &Option<DocIdentity>)> {
        self.journal.iter().flatten()
    }

    /// This collection without its journal (what a transaction's commit publishes).
    pub fn without_journal(mut self) -> Collection {
        self.journal = None;
        self
    }

    /// Notes, before a write to the document with this `_id`, what it was in the snapshot.
    fn note_write(&mut self, id: &Bson) {
        if self.journal.is_none() {
            return;
        }
        let before = self.identity(id);
        if let Some(journal) = self.journal.as_mut() {
            journal.entry(OrdBson(id.clone())).or_insert(before);
        }
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether the collection holds no document.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Total BSON size of the documents (for `collStats`).
    pub fn data_size(&self) -> usize {
        self.docs
            .values()
            .map(|d| d.to_vec().map(|v| v.len()).unwrap_or(0))
            .sum()
    }

    /// The indexes, `_id_` first.
    pub fn indexes(&self) -> &[IndexSpec] {
        &self.indexes
    }

    /// Documents in natural (insertion) order.
    pub fn iter(&self) -> impl Iterator<Item = (&RecordId, &Document)> {
        self.docs.iter()
    }

    /// The document with this record id.
    pub fn get(&self, rid: RecordId) -> Option<&Document> {
        self.docs.get(&rid)
    }

    /// The record ids of the documents `matcher` accepts, in natural order. `filter` is the
    /// original filter, inspected for an `_id` equality that the `_id` index can answer.
    pub fn find(&self, filter: &Document, matcher: &Matcher) -> Vec<RecordId> {
        if let Some(id) = id_equality(filter).filter(|id| !matcher.collates(id)) {
            return match self.id_index.get(&OrdBson(id.clone())) {
                Some(rid) if self.docs.get(rid).is_some_and(|d| matcher.matches(d)) => vec![*rid],
                _ => Vec::new(),
            };
        }
        self.docs
            .iter()
            .filter(|(_, d)| matcher.matches(d))
            .map(|(rid, _)| *rid)
            .collect()
    }

    fn unique_key(spec: &IndexSpec, d: &Document) -> Vec<OrdBson> {
        spec.key
            .keys()
            .map(|k| {
                OrdBson(
                    crate::engine::path::get(d, k)
                        .cloned()
                        .unwrap_or(Bson::Null),
                )
            })
            .collect()
    }

    fn duplicate(&self, ns: &str, spec: &IndexSpec, key: &[OrdBson]) -> EngineError {
        let mut key_value = Document::new();
        for (field, v) in spec.key.keys().zip(key) {
            key_value.insert(field.clone(), v.0.clone());
        }
        let mut key_pattern = Document::new();
        for (k, v) in &spec.key {
            key_pattern.insert(k.clone(), v.clone());
        }
        let shown: Vec<String> = key_value
            .iter()
            .map(|(k, v)| format!("{k}: {}", crate::value::render::render_value(v)))
            .collect();
        EngineError::new(
            ErrorCode::DuplicateKey,
            format!(
                "E11000 duplicate key error collection: {ns} index: {} dup key: {{ {} }}",
                spec.name,
                shown.join(", ")
            ),
        )
        .with_extra(doc! {"keyPattern": key_pattern, "keyValue": key_value})
    }

    /// Checks the unique indexes for `d`, ignoring the document `except` (itself, on update).
    fn check_unique(
        &self,
        ns: &str,
        d: &Document,
        except: Option<RecordId>,
    ) -> Result<(), EngineError> {
        let id = d.get("_id").cloned().unwrap_or(Bson::Null);
        if let Some(rid) = self.id_index.get(&OrdBson(id.clone())) {
            if Some(*rid) != except {
                return Err(self.duplicate(ns, &self.indexes[0], &[OrdBson(id)]));
            }
        }
        for spec in self.indexes.iter().skip(1).filter(|s| s.unique) {
            let key = Self::unique_key(spec, d);
            if let Some(entries) = self.unique_entries.get(&spec.name) {
                if let Some(rid) = entries.get(&key) {
                    if Some(*rid) != except {
                        return Err(self.duplicate(ns, spec, &key));
                    }
                }
            }
        }
        Ok(())
    }

    fn index_entries(&mut self, rid: RecordId, d: &Document, add: bool) {
        let id = OrdBson(d.get("_id").cloned().unwrap_or(Bson::Null));
        if add {
            self.id_index.insert(id, rid);
        } else {
            self.id_index.remove(&id);
        }
        for spec in self.indexes.iter().skip(1).filter(|s| s.unique) {
            let key = Self::unique_key(spec, d);
            let entries = self.unique_entries.entry(spec.name.clone()).or_default();
            if add {
                entries.insert(key, rid);
            } else {
                entries.remove(&key);
            }
        }
    }

    /// Inserts a document (which already has its `_id` first).
    pub fn insert(&mut self, ns: &str, d: Document) -> Result<RecordId, EngineError> {
        self.check_unique(ns, &d, None)?;
        self.note_write(d.get("_id").unwrap_or(&Bson::Null));
        let rid = self.next_rid;
        self.next_rid += 1;
        self.index_entries(rid, &d, true);
        self.docs.insert(rid, d);
        Ok(rid)
    }

    /// Replaces the document at `rid`.
    pub fn replace(&mut self, ns: &str, rid: RecordId, d: Document) -> Result<(), EngineError> {
        self.check_unique(ns, &d, Some(rid))?;
        if let Some(old) = self.docs.get(&rid) {
            let id = old.get("_id").cloned().unwrap_or(Bson::Null);
            self.note_write(&id);
        }
        self.note_write(d.get("_id").unwrap_or(&Bson::Null));
        if let Some(old) = self.docs.remove(&rid) {
            self.index_entries(rid, &old, false);
        }
        self.index_entries(rid, &d, true);
        self.docs.insert(rid, d);
        *self.stamps.entry(rid).or_insert(0) += 1;
        Ok(())
    }

    /// Removes the document at `rid`.
    pub fn remove(&mut self, rid: RecordId) -> Option<Document> {
        let id = self
            .docs
            .get(&rid)?
            .get("_id")
            .cloned()
            .unwrap_or(Bson::Null);
        self.note_write(&id);
        let old = self.docs.remove(&rid)?;
        self.index_entries(rid, &old, false);
        self.stamps.remove(&rid);
        Some(old)
    }

    /// Creates an index; `Ok(false)` if an identical one exists.
    pub fn create_index(&mut self, ns: &str, spec: &Document) -> Result<bool, EngineError> {
        let key = spec
            .get_document("key")
            .map_err(|_| {
                EngineError::new(
                    ErrorCode::FailedToParse,
                    "The 'key' field is a required property of an index specification",
                )
            })?
            .clone();
        if key.is_empty() {
            return Err(EngineError::new(
                ErrorCode::CannotCreateIndex,
                "Index keys cannot be empty.",
            ));
        }
        let name = match spec.get("name") {
            Some(Bson::String(n)) => n.clone(),
            Some(_) => {
                return Err(EngineError::new(
                    ErrorCode::TypeMismatch,
                    "The field 'name' must be a string",
                ))
            }
            None => key
                .iter()
                .map(|(k, v)| format!("{k}_{}", index_value_name(v)))
                .collect::<Vec<_>>()
                .join("_"),
        };
        let unique = spec.get("unique").is_some_and(crate::value::field::truthy);
        if let Some(existing) = self.indexes.iter().find(|i| i.name == name) {
            if existing.key == key && existing.unique == unique {
                return Ok(false);
            }
            return Err(EngineError::new(
                ErrorCode::IndexKeySpecsConflict,
                format!("An existing index has the same name as the requested index. When index names are not specified, they are auto generated and can cause conflicts. Please refer to our documentation. Requested index: {}, existing index: {}", render_doc(spec), render_doc(&existing.spec)),
            ));
        }
        if let Some(existing) = self.indexes.iter().find(|i| i.key == key) {
            if existing.unique == unique {
                return Ok(false);
            }
            return Err(EngineError::new(
                ErrorCode::IndexOptionsConflict,
                format!("An equivalent index already exists with a different name and options. Requested index: {}, existing index: {}", render_doc(spec), render_doc(&existing.spec)),
            ));
        }
        let mut full = doc! {"v": 2, "key": key.clone(), "name": name.clone()};
        if unique {
            full.insert("unique", true);
        }
        for (k, v) in spec {
            if !matches!(k.as_str(), "v" | "key" | "name" | "unique" | "ns") {
                full.insert(k.clone(), v.clone());
            }
        }
        let new = IndexSpec {
            name: name.clone(),
            key,
            unique,
            spec: full,
        };
        if unique {
            let mut entries = BTreeMap::new();
            for (rid, d) in &self.docs {
                let k = Self::unique_key(&new, d);
                if entries.insert(k.clone(), *rid).is_some() {
                    return Err(self.duplicate(ns, &new, &k));
                }
            }
            self.unique_entries.insert(name, entries);
        }
        self.indexes.push(new);
        Ok(true)
    }

    /// Drops an index by name or key pattern.
    pub fn drop_index(&mut self, which: &Bson) -> Result<(), EngineError> {
        let pos = match which {
            Bson::String(name) => self.indexes.iter().position(|i| &i.name == name),
            Bson::Document(key) => self.indexes.iter().position(|i| &i.key == key),
            _ => None,
        };
        match pos {
            Some(0) => Err(EngineError::new(
                ErrorCode::InvalidOptions,
                "cannot drop _id index",
            )),
            Some(p) => {
                let spec = self.indexes.remove(p);
                self.unique_entries.remove(&spec.name);
                Ok(())
            }
            None => Err(EngineError::new(
                ErrorCode::IndexNotFound,
                format!(
                    "index not found with name [{}]",
                    match which {
                        Bson::String(s) => s.clone(),
                        other => crate::value::render::render_value(other),
                    }
                ),
            )),
        }
    }

    /// Drops every index but `_id_`.
    pub fn drop_all_indexes(&mut self) {
        self.indexes.truncate(1);
        self.unique_entries.clear();
    }
}

fn index_value_name(v: &Bson) -> String {
    match v {
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        Bson::Double(d) => format!("{}", *d as i64),
        Bson::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The `_id` a filter pins by plain equality, if that is all it says about `_id`.
fn id_equality(filter: &Document) -> Option<&Bson> {
    match filter.get("_id")? {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            if d.len() == 1 {
                match d.get("$eq")? {
                    Bson::Document(_) | Bson::Array(_) | Bson::RegularExpression(_) => None,
                    v => Some(v),
                }
            } else {
                None
            }
        }
        Bson::Array(_) | Bson::RegularExpression(_) | Bson::Null => None,
        v => Some(v),
    }
}

/// Databases of collections.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    /// Database name → collection name → collection.
    pub dbs: BTreeMap<String, BTreeMap<String, Collection>>,
    /// A transaction's private copy: collections it creates keep a journal too.
    journaling: bool,
}

impl Catalog {
    /// The collection, if it exists.
    pub fn collection(&self, db: &str, coll: &str) -> Option<&Collection> {
        self.dbs.get(db)?.get(coll)
    }

    /// The collection, created (with its database) if missing; `true` if it was created.
    pub fn collection_mut(&mut self, db: &str, coll: &str) -> (&mut Collection, bool) {
        let colls = self.dbs.entry(db.to_string()).or_default();
        let created = !colls.contains_key(coll);
        let journaling = self.journaling;
        let c = colls.entry(coll.to_string()).or_insert_with(|| {
            let mut c = Collection::default();
            if journaling {
                c.start_journal();
            }
            c
        });
        (c, created)
    }

    /// A transaction's private copy of this catalog: every collection, present and created
    /// later, records what the transaction writes.
    pub fn journaled_copy(&self) -> Catalog {
        let mut copy = self.clone();
        copy.journaling = true;
        for c in copy.dbs.values_mut().flat_map(|colls| colls.values_mut()) {
            c.start_journal();
        }
        copy
    }

    /// The collection for changing, only if it exists.
    pub fn existing_mut(&mut self, db: &str, coll: &str) -> Option<&mut Collection> {
        self.dbs.get_mut(db)?.get_mut(coll)
    }
}

/// Replaces every document of `db.coll` by `docs` (the copy of the users and roles kept in
/// `admin.system.users` / `admin.system.roles`). Nothing is created for no documents.
pub fn replace_contents(catalog: &mut Catalog, db: &str, coll: &str, docs: Vec<Document>) {
    if docs.is_empty() && catalog.collection(db, coll).is_none() {
        return;
    }
    let ns = format!("{db}.{coll}");
    let (c, _) = catalog.collection_mut(db, coll);
    let rids: Vec<RecordId> = c.iter().map(|(rid, _)| *rid).collect();
    for rid in rids {
        c.remove(rid);
    }
    for d in docs {
        if let Err(e) = c.insert(&ns, d) {
            tracing::warn!(ns = %ns, error = ?e, "cannot copy an authorization document");
        }
    }
}

/// Checks a database and collection name the way mongod does
/// ([`crate::limits::check_namespace`]; InvalidNamespace, 73).
pub fn check_namespace(db: &str, coll: &str) -> Result<(), EngineError> {
    crate::limits::check_namespace(db, coll)
        .map_err(|message| EngineError::new(ErrorCode::InvalidNamespace, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_indexes_are_enforced() {
        let mut c = Collection::new(Document::new());
        c.insert("d.c", doc! {"_id": 1, "a": 1}).unwrap();
        let e = c.insert("d.c", doc! {"_id": 1.0, "a": 2}).unwrap_err();
        assert_eq!(e.code, ErrorCode::DuplicateKey);
        assert_eq!(
            e.message,
            "E11000 duplicate key error collection: d.c index: _id_ dup key: { _id: 1.0 }"
        );
        assert_eq!(
            e.extra
                .as_ref()
                .unwrap()
                .get_document("keyPattern")
                .unwrap(),
            &doc! {"_id": 1}
        );
        assert!(c
            .create_index("d.c", &doc! {"key": {"a": 1}, "unique": true})
            .unwrap());
        let e = c.insert("d.c", doc! {"_id": 2, "a": 1}).unwrap_err();
        assert!(
            e.message.contains("index: a_1 dup key: { a: 1 }"),
            "{}",
            e.message
        );
        c.insert("d.c", doc! {"_id": 3, "a": 3}).unwrap();
        assert!(c.replace("d.c", 2, doc! {"_id": 3, "a": 1}).is_err());
        c.remove(1);
        c.insert("d.c", doc! {"_id": 1, "a": 1}).unwrap();
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn id_lookup_uses_the_index() {
        let mut c = Collection::new(Document::new());
        for i in 0..10 {
            c.insert("d.c", doc! {"_id": i, "v": i % 2}).unwrap();
        }
        let f = doc! {"_id": 4i64};
        assert_eq!(c.find(&f, &Matcher::parse(&f).unwrap()).len(), 1);
        let f = doc! {"v": 1};
        assert_eq!(c.find(&f, &Matcher::parse(&f).unwrap()).len(), 5);
    }
}
