//! Shard key patterns (`{_id: "hashed"}`, `{"a.b": "hashed"}`, `{region: 1, _id: "hashed"}`,
//! `{a: 1}`) and the extraction of shard key values from documents and from query filters.

use std::cmp::Ordering;

use bson::{Bson, Document, RawBsonRef, RawDocument};

use super::hash::{hash64, hash64_raw};
use super::RoutingError;
use crate::value::compare::compare;
use crate::value::error_codes::ErrorCode;

/// One field of a shard key pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyField {
    /// The (possibly dotted) path.
    pub path: String,
    /// Whether the field is hashed.
    pub hashed: bool,
}

/// A shard key value: one BSON value per pattern field, hashed fields already hashed
/// (`NumberLong`). Ordered field by field in MongoDB's order.
#[derive(Debug, Clone)]
pub struct ShardKey(pub Vec<Bson>);

impl PartialEq for ShardKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for ShardKey {}

impl PartialOrd for ShardKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ShardKey {
    fn cmp(&self, other: &Self) -> Ordering {
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            let o = compare(a, b);
            if o != Ordering::Equal {
                return o;
            }
        }
        self.0.len().cmp(&other.0.len())
    }
}

/// A parsed shard key pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardKeyPattern {
    fields: Vec<KeyField>,
}

/// Where a filter sends a statement.
#[derive(Debug, Clone, PartialEq)]
pub enum FilterKeys {
    /// The filter pins these full shard key values (one for equality, several for `$in`).
    Keys(Vec<ShardKey>),
    /// The filter does not pin the full shard key.
    Untargetable,
}

/// Most `$in` combinations a filter may expand to before it is treated as untargetable.
const MAX_KEY_COMBINATIONS: usize = 10_000;

impl ShardKeyPattern {
    /// Parses a key pattern: ascending fields (`1`) and at most one `"hashed"` field.
    pub fn parse(key: &Document) -> Result<ShardKeyPattern, RoutingError> {
        if key.is_empty() {
            return Err(RoutingError::new(
                ErrorCode::BadValue,
                "Shard key cannot be empty",
            ));
        }
        let mut fields = Vec::new();
        for (path, v) in key {
            if path.is_empty() || path.split('.').any(|p| p.is_empty() || p.starts_with('$')) {
                return Err(RoutingError::new(
                    ErrorCode::BadValue,
                    format!("Unsupported shard key pattern. Field '{path}' is invalid."),
                ));
            }
            let hashed = match v {
                Bson::String(s) if s == "hashed" => true,
                Bson::Int32(1) | Bson::Int64(1) => false,
                Bson::Double(d) if *d == 1.0 => false,
                _ => {
                    return Err(RoutingError::new(
                        ErrorCode::BadValue,
                        format!(
                            "Unsupported shard key pattern {}. Pattern must either be a single hashed field, or a list of ascending fields",
                            crate::value::render::render_doc(key)
                        ),
                    ))
                }
            };
            fields.push(KeyField {
                path: path.clone(),
                hashed,
            });
        }
        if fields.iter().filter(|f| f.hashed).count() > 1 {
            return Err(RoutingError::new(
                ErrorCode::BadValue,
                format!(
                    "Shard key pattern {} has more than one hashed field; at most one field can be hashed",
                    crate::value::render::render_doc(key)
                ),
            ));
        }
        Ok(ShardKeyPattern { fields })
    }

    /// The fields.
    pub fn fields(&self) -> &[KeyField] {
        &self.fields
    }

    /// The pattern as a document (`{_id: "hashed"}`).
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        for f in &self.fields {
            if f.hashed {
                d.insert(f.path.clone(), "hashed");
            } else {
                d.insert(f.path.clone(), 1);
            }
        }
        d
    }

    /// The name mongod gives the shard key's index (`x_1_y_hashed`).
    pub fn index_name(&self) -> String {
        self.fields
            .iter()
            .map(|f| {
                if f.hashed {
                    format!("{}_hashed", f.path)
                } else {
                    format!("{}_1", f.path)
                }
            })
            .collect::<Vec<_>>()
            .join("_")
    }

    /// Whether the first field is hashed (the pre-split applies).
    pub fn is_hashed_prefix(&self) -> bool {
        self.fields.first().is_some_and(|f| f.hashed)
    }

    /// Whether any field is hashed.
    pub fn has_hashed(&self) -> bool {
        self.fields.iter().any(|f| f.hashed)
    }

    /// The smallest key: MinKey in every field.
    pub fn min_key(&self) -> ShardKey {
        ShardKey(vec![Bson::MinKey; self.fields.len()])
    }

    /// The largest key: MaxKey in every field.
    pub fn max_key(&self) -> ShardKey {
        ShardKey(vec![Bson::MaxKey; self.fields.len()])
    }

    /// A key as the document `config.chunks` stores (`{_id: NumberLong(…)}`).
    pub fn key_document(&self, key: &ShardKey) -> Document {
        let mut d = Document::new();
        for (f, v) in self.fields.iter().zip(&key.0) {
            d.insert(f.path.clone(), v.clone());
        }
        d
    }

    /// A key read back from a `config.chunks` bound document.
    pub fn key_from_document(&self, d: &Document) -> Result<ShardKey, RoutingError> {
        self.fields
            .iter()
            .map(|f| {
                d.get(&f.path).cloned().ok_or_else(|| {
                    RoutingError::new(
                        ErrorCode::FailedToParse,
                        format!(
                            "chunk bound {} lacks shard key field {}",
                            crate::value::render::render_doc(d),
                            f.path
                        ),
                    )
                })
            })
            .collect::<Result<_, _>>()
            .map(ShardKey)
    }

    /// The shard key of a document to insert: missing fields count as null (MongoDB 4.4+);
    /// an array anywhere on a key path is ShardKeyNotFound (61).
    pub fn extract_from_document(&self, doc: &RawDocument) -> Result<ShardKey, RoutingError> {
        let mut out = Vec::with_capacity(self.fields.len());
        for f in &self.fields {
            let v = raw_path(doc, &f.path).map_err(|_| self.array_error())?;
            out.push(match (v, f.hashed) {
                (Some(v), true) => Bson::Int64(hash64_raw(v)),
                (None, true) => Bson::Int64(hash64(&Bson::Null)),
                (Some(v), false) => raw_to_bson(v),
                (None, false) => Bson::Null,
            });
        }
        Ok(ShardKey(out))
    }

    /// The shard key of values read in place, one per pattern field in order (hashed fields
    /// hashed): what [`Self::extract_from_document`] and [`Self::extract_from_filter`] make of
    /// the same values. The caller passes scalars only (no document, array or regular
    /// expression), which need no check for arrays and hash alike read in place or owned.
    pub fn key_of_raw_scalars<'a>(
        &self,
        values: impl IntoIterator<Item = RawBsonRef<'a>>,
    ) -> ShardKey {
        ShardKey(
            self.fields
                .iter()
                .zip(values)
                .map(|(f, v)| {
                    if f.hashed {
                        Bson::Int64(hash64_raw(v))
                    } else {
                        raw_to_bson(v)
                    }
                })
                .collect(),
        )
    }

    fn array_error(&self) -> RoutingError {
        RoutingError::new(
            ErrorCode::ShardKeyNotFound,
            "Shard key cannot contain array values or array descendants.",
        )
    }

    /// Turns a value the client supplied for one field into its key value (hashing it when the
    /// field is hashed); `None` for values that cannot be shard key values (arrays).
    fn key_value(&self, field: &KeyField, v: &Bson) -> Option<Bson> {
        if matches!(v, Bson::Array(_)) || contains_array(v) {
            return None;
        }
        Some(if field.hashed {
            Bson::Int64(hash64(v))
        } else {
            v.clone()
        })
    }

    /// The shard keys a filter pins: equality (`{k: v}`, `{k: {$eq: v}}`, inside a top-level
    /// `$and`) or `$in` on every key field. Anything else cannot be targeted.
    pub fn extract_from_filter(&self, filter: &Document) -> FilterKeys {
        let mut per_field: Vec<Vec<Bson>> = Vec::with_capacity(self.fields.len());
        for f in &self.fields {
            let Some(values) = field_values(filter, &f.path) else {
                return FilterKeys::Untargetable;
            };
            let mut keyed = Vec::with_capacity(values.len());
            for v in &values {
                match self.key_value(f, v) {
                    Some(k) => keyed.push(k),
                    None => return FilterKeys::Untargetable,
                }
            }
            per_field.push(keyed);
        }
        let combos: usize = per_field.iter().map(|v| v.len().max(1)).product();
        if combos == 0 || combos > MAX_KEY_COMBINATIONS {
            return FilterKeys::Untargetable;
        }
        let mut keys: Vec<Vec<Bson>> = vec![Vec::new()];
        for values in per_field {
            let mut next = Vec::with_capacity(keys.len() * values.len());
            for prefix in &keys {
                for v in &values {
                    let mut k = prefix.clone();
                    k.push(v.clone());
                    next.push(k);
                }
            }
            keys = next;
        }
        let mut keys: Vec<ShardKey> = keys.into_iter().map(ShardKey).collect();
        keys.sort();
        keys.dedup();
        FilterKeys::Keys(keys)
    }
}

fn contains_array(v: &Bson) -> bool {
    match v {
        Bson::Array(_) => true,
        Bson::Document(d) => d.values().any(contains_array),
        _ => false,
    }
}

/// The values a filter allows for `path` by equality or `$in`; `None` if it does not pin it.
fn field_values(filter: &Document, path: &str) -> Option<Vec<Bson>> {
    if let Some(v) = filter.get(path) {
        if let Some(values) = equality_values(v) {
            return Some(values);
        }
    }
    if let Some(Bson::Array(clauses)) = filter.get("$and") {
        for c in clauses {
            if let Bson::Document(d) = c {
                if let Some(values) = field_values(d, path) {
                    return Some(values);
                }
            }
        }
    }
    None
}

fn equality_values(v: &Bson) -> Option<Vec<Bson>> {
    match v {
        Bson::RegularExpression(_) => None,
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            if let Some(eq) = d.get("$eq") {
                return equality_values(eq);
            }
            if let Some(Bson::Array(items)) = d.get("$in") {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    match item {
                        Bson::RegularExpression(_) => return None,
                        Bson::Document(x)
                            if x.keys().next().is_some_and(|k| k.starts_with('$')) =>
                        {
                            return None
                        }
                        other => out.push(other.clone()),
                    }
                }
                return Some(out);
            }
            None
        }
        other => Some(vec![other.clone()]),
    }
}

/// The value at a dotted path of a raw document; `Err` if an array is on the path.
fn raw_path<'a>(doc: &'a RawDocument, path: &str) -> Result<Option<RawBsonRef<'a>>, ()> {
    let mut cur = doc;
    let mut parts = path.split('.').peekable();
    while let Some(part) = parts.next() {
        let v = match cur.get(part) {
            Ok(Some(v)) => v,
            _ => return Ok(None),
        };
        match v {
            RawBsonRef::Array(_) => return Err(()),
            RawBsonRef::Document(d) if parts.peek().is_some() => cur = d,
            RawBsonRef::Document(d) => {
                if raw_contains_array(d) {
                    return Err(());
                }
                return Ok(Some(v));
            }
            _ if parts.peek().is_some() => return Ok(None),
            _ => return Ok(Some(v)),
        }
    }
    Ok(None)
}

fn raw_contains_array(d: &RawDocument) -> bool {
    d.iter().flatten().any(|(_, v)| match v {
        RawBsonRef::Array(_) => true,
        RawBsonRef::Document(inner) => raw_contains_array(inner),
        _ => false,
    })
}

/// A raw value as an owned `Bson`.
pub fn raw_to_bson(v: RawBsonRef<'_>) -> Bson {
    Bson::try_from(v).unwrap_or(Bson::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc};

    fn p(d: Document) -> ShardKeyPattern {
        ShardKeyPattern::parse(&d).unwrap()
    }

    #[test]
    fn parses_patterns() {
        assert!(p(doc! {"_id": "hashed"}).is_hashed_prefix());
        assert!(p(doc! {"a.b": "hashed"}).has_hashed());
        let c = p(doc! {"region": 1, "_id": "hashed"});
        assert!(!c.is_hashed_prefix() && c.has_hashed());
        assert!(!p(doc! {"a": 1}).has_hashed());
        assert!(ShardKeyPattern::parse(&doc! {"a": "hashed", "b": "hashed"}).is_err());
        assert!(ShardKeyPattern::parse(&doc! {"a": -1}).is_err());
        assert!(ShardKeyPattern::parse(&doc! {"a": "text"}).is_err());
        assert!(ShardKeyPattern::parse(&doc! {}).is_err());
        assert_eq!(
            p(doc! {"a": 1.0, "b": "hashed"}).to_document(),
            doc! {"a": 1, "b": "hashed"}
        );
    }

    #[test]
    fn extracts_from_documents() {
        let k = p(doc! {"_id": "hashed"});
        let key = k
            .extract_from_document(&rawdoc! {"_id": 1, "x": 2})
            .unwrap();
        assert_eq!(key.0, vec![Bson::Int64(5902408780260971510)]);
        let missing = k.extract_from_document(&rawdoc! {"x": 2}).unwrap();
        assert_eq!(
            missing.0,
            vec![Bson::Int64(2338878944348059895)],
            "missing is null"
        );
        let e = k
            .extract_from_document(&rawdoc! {"_id": [1, 2]})
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::ShardKeyNotFound);
        let dotted = p(doc! {"a.b": "hashed"});
        let key = dotted
            .extract_from_document(&rawdoc! {"a": {"b": 42}})
            .unwrap();
        assert_eq!(key.0, vec![Bson::Int64(-944302157085130861)]);
        assert!(dotted
            .extract_from_document(&rawdoc! {"a": [{"b": 1}]})
            .is_err());
        let compound = p(doc! {"region": 1, "_id": "hashed"});
        let key = compound
            .extract_from_document(&rawdoc! {"_id": 0, "region": "eu"})
            .unwrap();
        assert_eq!(
            key.0,
            vec![Bson::String("eu".into()), Bson::Int64(4854801880128277513)]
        );
        let id_doc = p(doc! {"_id": "hashed"});
        let a = id_doc
            .extract_from_document(&rawdoc! {"_id": {"productId": 1, "storeId": 2}})
            .unwrap();
        assert_eq!(
            a.0,
            vec![Bson::Int64(hash64(&Bson::Document(
                doc! {"productId": 1, "storeId": 2}
            )))]
        );
    }

    #[test]
    fn extracts_from_filters() {
        let k = p(doc! {"_id": "hashed"});
        let h = |v: Bson| ShardKey(vec![Bson::Int64(hash64(&v))]);
        assert_eq!(
            k.extract_from_filter(&doc! {"_id": 1}),
            FilterKeys::Keys(vec![h(Bson::Int32(1))])
        );
        assert_eq!(
            k.extract_from_filter(&doc! {"_id": {"$eq": 1}}),
            FilterKeys::Keys(vec![h(Bson::Int32(1))])
        );
        assert_eq!(
            k.extract_from_filter(&doc! {"$and": [{"x": 1}, {"_id": 1}]}),
            FilterKeys::Keys(vec![h(Bson::Int32(1))])
        );
        match k.extract_from_filter(&doc! {"_id": {"$in": [1, 2, 2.0]}}) {
            FilterKeys::Keys(keys) => assert_eq!(keys.len(), 2),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            k.extract_from_filter(&doc! {"_id": {"$gt": 1}}),
            FilterKeys::Untargetable
        );
        assert_eq!(
            k.extract_from_filter(&doc! {"x": 1}),
            FilterKeys::Untargetable
        );
        assert_eq!(
            k.extract_from_filter(&doc! {"_id": [1]}),
            FilterKeys::Untargetable
        );
        let doc_id = doc! {"productId": 1, "storeId": 2};
        assert_eq!(
            k.extract_from_filter(&doc! {"_id": doc_id.clone()}),
            FilterKeys::Keys(vec![h(Bson::Document(doc_id))])
        );
        let c = p(doc! {"region": 1, "_id": "hashed"});
        assert_eq!(
            c.extract_from_filter(&doc! {"_id": 1}),
            FilterKeys::Untargetable
        );
        match c.extract_from_filter(&doc! {"_id": 1, "region": {"$in": ["a", "b"]}}) {
            FilterKeys::Keys(keys) => assert_eq!(keys.len(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn keys_order_field_by_field() {
        let a = ShardKey(vec![Bson::MinKey]);
        let b = ShardKey(vec![Bson::Int64(-5)]);
        let c = ShardKey(vec![Bson::MaxKey]);
        assert!(a < b && b < c);
        assert_eq!(
            ShardKey(vec![Bson::Int32(1)]),
            ShardKey(vec![Bson::Int64(1)])
        );
    }
}
