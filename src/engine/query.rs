//! Sort specifications and projections for `find`, `findAndModify` and the aggregation stages
//! that share them.

use std::cmp::Ordering;
use std::sync::Arc;

use bson::{Bson, Document};

use super::collation::Collation;
use super::path::lookup;
use super::EngineError;
use crate::value::compare::compare;
use crate::value::error_codes::ErrorCode;

/// A parsed sort specification: `(path, ascending)` in priority order, and the collation
/// strings sort under (`None`: simple).
#[derive(Debug, Clone, Default)]
pub struct SortSpec(Vec<(String, bool)>, Option<Arc<Collation>>);

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
                v if !crate::value::field::is_number(v) => {
                    return Err(EngineError::new(
                        ErrorCode(15974),
                        "Illegal key in $sort specification",
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
        Ok(SortSpec(keys, None))
    }

    /// This sort under a collation (`None`: simple).
    pub fn with_collation(mut self, collation: Option<Arc<Collation>>) -> SortSpec {
        self.1 = collation;
        self
    }

    /// Whether there is nothing to sort by.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key a document sorts by on one path: the smallest element for ascending order, the
    /// largest for descending (how MongoDB sorts arrays); null when missing.
    fn key(&self, doc: &Document, path: &str, ascending: bool) -> Bson {
        let l = lookup(doc, path);
        let keyed: Vec<Bson>;
        let vals: Vec<&Bson> = match &self.1 {
            Some(c) => {
                keyed = l.expanded().into_iter().map(|v| c.key_value(v)).collect();
                keyed.iter().collect()
            }
            None => l.expanded(),
        };
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
            let o = compare(&self.key(a, path, *asc), &self.key(b, path, *asc));
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

/// A parsed find projection: inclusion or exclusion of paths, with the projection operators
/// `$slice` (any mode), `$elemMatch` and the positional `a.$` (inclusion), and computed fields
/// (aggregation expressions and literals, inclusion).
#[derive(Debug, Clone)]
pub struct Projection {
    include: bool,
    paths: Vec<String>,
    id: bool,
    slices: Vec<(String, i64, Option<i64>)>,
    elem_matches: Vec<(String, super::matcher::Matcher)>,
    positional: Option<String>,
    computed: Vec<(String, Bson)>,
}

fn projection_error(code: i32, msg: impl Into<String>) -> EngineError {
    EngineError::new(ErrorCode(code), msg)
}

impl Projection {
    /// Parses a projection; `_id` is included unless excluded.
    pub fn parse(spec: &Document) -> Result<Option<Projection>, EngineError> {
        if spec.is_empty() {
            return Ok(None);
        }
        let mut include: Option<bool> = None;
        let mut p = Projection {
            include: false,
            paths: Vec::new(),
            id: true,
            slices: Vec::new(),
            elem_matches: Vec::new(),
            positional: None,
            computed: Vec::new(),
        };
        let mut set_mode = |k: &str, on: bool| -> Result<(), EngineError> {
            match include {
                None => include = Some(on),
                Some(mode) if mode != on => {
                    return Err(projection_error(
                        31254,
                        if mode {
                            format!("Cannot do exclusion on field {k} in inclusion projection")
                        } else {
                            format!("Cannot do inclusion on field {k} in exclusion projection")
                        },
                    ))
                }
                _ => {}
            }
            Ok(())
        };
        for (k, v) in spec {
            if k.starts_with('$') {
                return Err(projection_error(
                    ErrorCode::BadValue.0,
                    format!("FieldPath field names may not start with '$'. Consider using $getField or $setField. (projection field '{k}')"),
                ));
            }
            if let Some(prefix) = k.strip_suffix(".$") {
                if p.positional.is_some() {
                    return Err(projection_error(
                        31276,
                        "Cannot specify more than one positional projection per query.",
                    ));
                }
                super::path::check_field_path(prefix)?;
                set_mode(k, true)?;
                p.positional = Some(prefix.to_string());
                continue;
            }
            if k.contains(".$") {
                return Err(projection_error(
                    31270,
                    format!("Positional projection '{k}' contains the positional operator more than once or not at the end."),
                ));
            }
            super::path::check_field_path(k)?;
            let on = match v {
                Bson::Boolean(b) => Some(*b),
                Bson::Int32(i) => Some(*i != 0),
                Bson::Int64(i) => Some(*i != 0),
                Bson::Double(d) => Some(*d != 0.0),
                Bson::Decimal128(_) => Some(crate::value::field::to_f64(v) != 0.0),
                _ => None,
            };
            if let Some(on) = on {
                if k == "_id" {
                    p.id = on;
                    continue;
                }
                set_mode(k, on)?;
                p.paths.push(k.clone());
                continue;
            }
            match v {
                Bson::Document(d) if d.len() == 1 && d.contains_key("$slice") => {
                    let (skip, limit) = match d.get("$slice") {
                        Some(n) if crate::value::field::is_number(n) => {
                            (crate::value::field::to_f64(n) as i64, None)
                        }
                        Some(Bson::Array(a))
                            if a.len() == 2 && a.iter().all(crate::value::field::is_number) =>
                        {
                            let limit = crate::value::field::to_f64(&a[1]) as i64;
                            if limit <= 0 {
                                return Err(projection_error(
                                    ErrorCode::BadValue.0,
                                    format!("$slice limit must be positive, got {limit}"),
                                ));
                            }
                            (crate::value::field::to_f64(&a[0]) as i64, Some(limit))
                        }
                        _ => {
                            return Err(projection_error(
                                28724,
                                "First argument to $slice must be an array, or the argument must be a number or [skip, limit] array",
                            ))
                        }
                    };
                    p.slices.push((k.clone(), skip, limit));
                }
                Bson::Document(d) if d.len() == 1 && d.contains_key("$elemMatch") => {
                    if k.contains('.') {
                        return Err(projection_error(
                            31275,
                            "Cannot use $elemMatch projection on a nested field.",
                        ));
                    }
                    let Some(Bson::Document(f)) = d.get("$elemMatch") else {
                        return Err(projection_error(
                            ErrorCode::BadValue.0,
                            "elemMatch: Invalid argument, object required",
                        ));
                    };
                    set_mode(k, true)?;
                    let wrapped = bson::doc! {k.clone(): {"$elemMatch": f.clone()}};
                    p.elem_matches
                        .push((k.clone(), super::matcher::Matcher::parse(&wrapped)?));
                }
                Bson::Document(d) if d.keys().next().is_some_and(|x| x == "$meta") => {
                    return Err(projection_error(
                        ErrorCode::BadValue.0,
                        format!("$meta projection of '{k}' is not supported: the engine keeps no text or search scores"),
                    ));
                }
                expr => {
                    super::aggregate::check_expression(expr)?;
                    set_mode(k, true)?;
                    p.computed.push((k.clone(), expr.clone()));
                }
            }
        }
        // `{_id: 1}` alone is an inclusion projection (only `_id` is returned), `{_id: 0}` alone
        // an exclusion one, as mongod decides; `$slice` alone keeps the exclusion mode.
        p.include = include.unwrap_or(p.id && p.slices.is_empty());
        Ok(Some(p))
    }

    /// Applies the projection (a positional `$` keeps no element without the query).
    pub fn apply(&self, doc: &Document) -> Document {
        self.apply_matched(doc, None)
    }

    /// Applies the projection; the positional `a.$` keeps the first element of `a` that
    /// `query` matched.
    pub fn apply_matched(
        &self,
        doc: &Document,
        query: Option<&super::matcher::Matcher>,
    ) -> Document {
        let mut out = if self.include {
            let mut out = Document::new();
            if self.id {
                if let Some(id) = doc.get("_id") {
                    out.insert("_id", id.clone());
                }
            }
            let mut paths: Vec<&str> = self.paths.iter().map(String::as_str).collect();
            paths.extend(self.slices.iter().map(|(p, _, _)| p.as_str()));
            let parts: Vec<Vec<&str>> = paths.iter().map(|p| p.split('.').collect()).collect();
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
        };
        if let Some(prefix) = &self.positional {
            if let (Some(Bson::Array(items)), Some(q)) = (super::path::get(doc, prefix), query) {
                let hit = items.iter().find(|item| {
                    let mut probe = doc.clone();
                    super::path::set(&mut probe, prefix, Bson::Array(vec![(*item).clone()])).is_ok()
                        && q.matches(&probe)
                });
                if let Some(item) = hit {
                    let _ = super::path::set(&mut out, prefix, Bson::Array(vec![item.clone()]));
                }
            }
        }
        for (field, m) in &self.elem_matches {
            if let Some(Bson::Array(items)) = doc.get(field) {
                let hit = items.iter().find(|item| {
                    let mut probe = Document::new();
                    probe.insert(field.clone(), Bson::Array(vec![(*item).clone()]));
                    m.matches(&probe)
                });
                if let Some(item) = hit {
                    out.insert(field.clone(), Bson::Array(vec![item.clone()]));
                }
            }
        }
        for (field, e) in &self.computed {
            if let Ok(Some(v)) = super::aggregate::eval(e, doc) {
                let _ = super::path::set(&mut out, field, v);
            }
        }
        for (field, skip, limit) in &self.slices {
            if let Some(Bson::Array(items)) = super::path::get_mut(&mut out, field) {
                let n = items.len() as i64;
                let (start, end) = match limit {
                    None if *skip >= 0 => (0, (*skip).min(n)),
                    None => ((n + skip).max(0), n),
                    Some(l) => {
                        let start = if *skip >= 0 {
                            (*skip).min(n)
                        } else {
                            (n + skip).max(0)
                        };
                        (start, (start + l).min(n))
                    }
                };
                *items = items[start as usize..end as usize].to_vec();
            }
        }
        out
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
    fn sorts_under_a_collation() {
        let c = Collation::from_option(Some(&Bson::Document(doc! {"locale": "en"}))).unwrap();
        let mut docs: Vec<Document> = ["b", "B", "a", "A"]
            .iter()
            .map(|v| doc! {"v": *v})
            .collect();
        SortSpec::parse(&doc! {"v": 1})
            .unwrap()
            .with_collation(c)
            .sort(&mut docs);
        let order: Vec<&str> = docs.iter().map(|d| d.get_str("v").unwrap()).collect();
        assert_eq!(order, ["a", "A", "b", "B"]);
        SortSpec::parse(&doc! {"v": 1}).unwrap().sort(&mut docs);
        let order: Vec<&str> = docs.iter().map(|d| d.get_str("v").unwrap()).collect();
        assert_eq!(order, ["A", "B", "a", "b"]);
    }

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
    fn projection_of_id_alone() {
        let d = doc! {"_id": 1, "a": 1, "b": {"c": 2}};
        let only_id = Projection::parse(&doc! {"_id": 1}).unwrap().unwrap();
        assert_eq!(only_id.apply(&d), doc! {"_id": 1});
        let only_id = Projection::parse(&doc! {"_id": true}).unwrap().unwrap();
        assert_eq!(only_id.apply(&d), doc! {"_id": 1});
        let without_id = Projection::parse(&doc! {"_id": 0}).unwrap().unwrap();
        assert_eq!(without_id.apply(&d), doc! {"a": 1, "b": {"c": 2}});
        let sliced = Projection::parse(&doc! {"a": {"$slice": 1}})
            .unwrap()
            .unwrap();
        assert_eq!(sliced.apply(&d), d);
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
