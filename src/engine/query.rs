//! Sort specifications and projections for `find`, `findAndModify` and the aggregation stages
//! that share them.

use std::cmp::Ordering;

use bson::{Bson, Document};

use super::path::lookup;
use super::EngineError;
use crate::value::compare::compare;
use crate::value::error_codes::ErrorCode;

/// A parsed sort specification: `(path, ascending)` in priority order.
#[derive(Debug, Clone, Default)]
pub struct SortSpec(Vec<(String, bool)>);

impl SortSpec {
    /// Parses `{a: 1, b: -1}`.
    pub fn parse(spec: &Document) -> Result<SortSpec, EngineError> {
        let mut keys = Vec::new();
        for (k, v) in spec {
            let dir = match v {
                Bson::Int32(1) | Bson::Int64(1) => true,
                Bson::Int32(-1) | Bson::Int64(-1) => false,
                Bson::Double(d) if *d == 1.0 => true,
                Bson::Double(d) if *d == -1.0 => false,
                Bson::Document(_) => {
                    return Err(EngineError::new(
                        ErrorCode::BadValue,
                        "$meta sort keys are not supported by the embedded shard",
                    ))
                }
                _ => {
                    return Err(EngineError::new(
                        ErrorCode(15975),
                        "$sort key ordering must be 1 (for ascending) or -1 (for descending)",
                    ))
                }
            };
            super::path::check_field_path(k)?;
            keys.push((k.clone(), dir));
        }
        Ok(SortSpec(keys))
    }

    /// Whether there is nothing to sort by.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key a document sorts by on one path: the smallest element for ascending order, the
    /// largest for descending (how MongoDB sorts arrays); null when missing.
    fn key(doc: &Document, path: &str, ascending: bool) -> Bson {
        let l = lookup(doc, path);
        let vals = l.expanded();
        let mut best: Option<&Bson> = None;
        for v in vals {
            best = match best {
                None => Some(v),
                Some(b) => {
                    let o = compare(v, b);
                    if (ascending && o.is_lt()) || (!ascending && o.is_gt()) {
                        Some(v)
                    } else {
                        Some(b)
                    }
                }
            };
        }
        let empty_array = l
            .values
            .iter()
            .any(|v| matches!(v, Bson::Array(a) if a.is_empty()));
        match best {
            Some(b) => b.clone(),
            None if empty_array => Bson::Undefined,
            None => Bson::Null,
        }
    }

    /// Compares two documents under this sort.
    pub fn compare(&self, a: &Document, b: &Document) -> Ordering {
        for (path, asc) in &self.0 {
            let o = compare(&Self::key(a, path, *asc), &Self::key(b, path, *asc));
            let o = if *asc { o } else { o.reverse() };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }

    /// Sorts documents stably (ties keep their order).
    pub fn sort(&self, docs: &mut [Document]) {
        if !self.0.is_empty() {
            docs.sort_by(|a, b| self.compare(a, b));
        }
    }
}

/// A parsed inclusion or exclusion projection.
#[derive(Debug, Clone)]
pub struct Projection {
    include: bool,
    paths: Vec<String>,
    id: bool,
}

impl Projection {
    /// Parses `{a: 1, b: 1}` or `{a: 0}`; `_id` is included unless excluded.
    pub fn parse(spec: &Document) -> Result<Option<Projection>, EngineError> {
        if spec.is_empty() {
            return Ok(None);
        }
        let mut include: Option<bool> = None;
        let mut paths = Vec::new();
        let mut id = true;
        for (k, v) in spec {
            let on = match v {
                Bson::Boolean(b) => *b,
                Bson::Int32(i) => *i != 0,
                Bson::Int64(i) => *i != 0,
                Bson::Double(d) => *d != 0.0,
                _ => {
                    return Err(EngineError::new(
                        ErrorCode::BadValue,
                        format!("projection of '{k}': only inclusion (1) and exclusion (0) projections are supported by the embedded shard"),
                    ))
                }
            };
            if k.starts_with('$') || k.contains(".$") {
                return Err(EngineError::new(
                    ErrorCode::BadValue,
                    format!("projection operator in '{k}' is not supported by the embedded shard"),
                ));
            }
            super::path::check_field_path(k)?;
            if k == "_id" {
                id = on;
                continue;
            }
            match include {
                None => include = Some(on),
                Some(mode) if mode != on => {
                    return Err(EngineError::new(
                        ErrorCode(31254),
                        if mode {
                            format!("Cannot do exclusion on field {k} in inclusion projection")
                        } else {
                            format!("Cannot do inclusion on field {k} in exclusion projection")
                        },
                    ))
                }
                _ => {}
            }
            paths.push(k.clone());
        }
        Ok(Some(Projection {
            include: include.unwrap_or(false),
            paths,
            id,
        }))
    }

    /// Applies the projection.
    pub fn apply(&self, doc: &Document) -> Document {
        if self.include {
            let mut out = Document::new();
            if self.id {
                if let Some(id) = doc.get("_id") {
                    out.insert("_id", id.clone());
                }
            }
            let parts: Vec<Vec<&str>> = self.paths.iter().map(|p| p.split('.').collect()).collect();
            include_into(doc, &parts, &mut out);
            out
        } else {
            let mut out = doc.clone();
            if !self.id {
                out.remove("_id");
            }
            for p in &self.paths {
                let parts: Vec<&str> = p.split('.').collect();
                exclude(&mut out, &parts);
            }
            out
        }
    }
}

/// Copies the fields named by `paths` from `src` into `out`, keeping `src`'s field order.
fn include_into(src: &Document, paths: &[Vec<&str>], out: &mut Document) {
    for (k, v) in src {
        let here: Vec<&Vec<&str>> = paths.iter().filter(|p| p[0] == k).collect();
        if here.is_empty() {
            continue;
        }
        if here.iter().any(|p| p.len() == 1) {
            out.insert(k.clone(), v.clone());
            continue;
        }
        let rest: Vec<Vec<&str>> = here.iter().map(|p| p[1..].to_vec()).collect();
        match v {
            Bson::Document(d) => {
                let mut sub = Document::new();
                include_into(d, &rest, &mut sub);
                out.insert(k.clone(), sub);
            }
            Bson::Array(items) => {
                let projected: Vec<Bson> = items
                    .iter()
                    .filter_map(|item| match item {
                        Bson::Document(d) => {
                            let mut sub = Document::new();
                            include_into(d, &rest, &mut sub);
                            Some(Bson::Document(sub))
                        }
                        _ => None,
                    })
                    .collect();
                out.insert(k.clone(), projected);
            }
            _ => {}
        }
    }
}

fn exclude(doc: &mut Document, parts: &[&str]) {
    if parts.len() == 1 {
        doc.remove(parts[0]);
        return;
    }
    match doc.get_mut(parts[0]) {
        Some(Bson::Document(d)) => exclude(d, &parts[1..]),
        Some(Bson::Array(items)) => {
            for item in items {
                if let Bson::Document(d) = item {
                    exclude(d, &parts[1..]);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn sorts_across_types_and_arrays() {
        let mut docs = vec![
            doc! {"_id": 1, "v": "b"},
            doc! {"_id": 2, "v": 3},
            doc! {"_id": 3},
            doc! {"_id": 4, "v": [10, 0]},
            doc! {"_id": 5, "v": 2.5},
            doc! {"_id": 6, "v": {"x": 1}},
        ];
        SortSpec::parse(&doc! {"v": 1}).unwrap().sort(&mut docs);
        let ids: Vec<i32> = docs.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids, [3, 4, 5, 2, 1, 6]);
        SortSpec::parse(&doc! {"v": -1}).unwrap().sort(&mut docs);
        let ids: Vec<i32> = docs.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids, [6, 1, 4, 2, 5, 3]);
        assert!(SortSpec::parse(&doc! {"v": 2}).is_err());
    }

    #[test]
    fn projections() {
        let d = doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "l": [{"x": 1, "y": 2}]};
        let p = Projection::parse(&doc! {"b.c": 1, "l.y": 1})
            .unwrap()
            .unwrap();
        assert_eq!(p.apply(&d), doc! {"_id": 1, "b": {"c": 2}, "l": [{"y": 2}]});
        let p = Projection::parse(&doc! {"a": 0, "b.d": 0, "_id": 0})
            .unwrap()
            .unwrap();
        assert_eq!(p.apply(&d), doc! {"b": {"c": 2}, "l": [{"x": 1, "y": 2}]});
        let p = Projection::parse(&doc! {"_id": 0}).unwrap().unwrap();
        assert!(!p.apply(&d).contains_key("_id"));
        assert!(Projection::parse(&doc! {"a": 1, "b": 0}).is_err());
        assert!(Projection::parse(&doc! {"a": 1, "_id": 0}).is_ok());
    }
}
