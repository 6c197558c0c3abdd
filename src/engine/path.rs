//! Dotted paths (`a.b.0.c`) through documents and arrays, as the query language, sort,
//! projection and update operators walk them.

use bson::{Bson, Document};

use crate::limits::{MAX_ARRAY_BACKFILL, MAX_FIELD_PATH_PARTS};
use crate::value::error_codes::ErrorCode;

use super::EngineError;

/// The array index a path part names: ASCII digits only (`"+1"` and `"1.0"` are field names,
/// not indexes); an index too large for `usize` saturates, so it is past any array's end.
pub fn array_index(part: &str) -> Option<usize> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(part.parse::<usize>().unwrap_or(usize::MAX))
}

/// Checks an aggregation field path's length: at most [`MAX_FIELD_PATH_PARTS`] parts, as
/// mongod's `FieldPath` allows (Overflow, 15, beyond it).
pub fn check_field_path(path: &str) -> Result<(), EngineError> {
    if path.split('.').nth(MAX_FIELD_PATH_PARTS).is_some() {
        return Err(EngineError::new(
            ErrorCode::Overflow,
            "FieldPath is too long",
        ));
    }
    Ok(())
}

/// The values a path reaches in one document. Intermediate arrays are traversed (each
/// element that is a document continues the path; a numeric part indexes the array); a leaf
/// array is returned whole, so callers can match it or its elements.
#[derive(Debug, Default)]
pub struct Lookup<'a> {
    /// Every value the path reaches.
    pub values: Vec<&'a Bson>,
    /// Whether some branch of the walk ended without reaching the path's end.
    pub missing: bool,
}

impl<'a> Lookup<'a> {
    /// The leaf values with leaf arrays expanded one level (what comparisons look at).
    pub fn expanded(&self) -> Vec<&'a Bson> {
        let mut out = Vec::new();
        for v in &self.values {
            if let Bson::Array(items) = v {
                out.extend(items.iter());
            } else {
                out.push(*v);
            }
        }
        out
    }

    /// The leaf values plus, for leaf arrays, their elements (what equality looks at).
    pub fn candidates(&self) -> Vec<&'a Bson> {
        let mut out = Vec::new();
        for v in &self.values {
            out.push(*v);
            if let Bson::Array(items) = v {
                out.extend(items.iter());
            }
        }
        out
    }
}

/// Walks `path` in `doc`.
pub fn lookup<'a>(doc: &'a Document, path: &str) -> Lookup<'a> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Lookup::default();
    walk_doc(doc, &parts, &mut out);
    out
}

fn walk_doc<'a>(doc: &'a Document, parts: &[&str], out: &mut Lookup<'a>) {
    match doc.get(parts[0]) {
        Some(v) => walk(v, &parts[1..], out),
        None => out.missing = true,
    }
}

fn walk<'a>(v: &'a Bson, parts: &[&str], out: &mut Lookup<'a>) {
    if parts.is_empty() {
        out.values.push(v);
        return;
    }
    match v {
        Bson::Document(d) => walk_doc(d, parts, out),
        Bson::Array(items) => {
            if let Some(i) = array_index(parts[0]) {
                match items.get(i) {
                    Some(item) => walk(item, &parts[1..], out),
                    None => out.missing = true,
                }
            } else {
                if items.is_empty() {
                    out.missing = true;
                }
                for item in items {
                    if let Bson::Document(d) = item {
                        walk_doc(d, parts, out);
                    }
                }
            }
        }
        _ => out.missing = true,
    }
}

/// The single value at `path` without array expansion (projection, `_id` extraction): a
/// numeric part indexes arrays; anything else that is not a document ends the walk.
pub fn get<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut cur = doc.get(parts.next()?)?;
    for part in parts {
        cur = match cur {
            Bson::Document(d) => d.get(part)?,
            Bson::Array(items) => items.get(array_index(part)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn path_not_viable(part: &str, container: &Bson) -> EngineError {
    EngineError::new(
        ErrorCode::PathNotViable,
        format!(
            "Cannot create field '{part}' in element {{{}}}",
            crate::value::render::render_value(container)
        ),
    )
}

/// Sets `path` to `value`, creating intermediate documents (and padding arrays with nulls
/// when a numeric part is past their end, at most [`MAX_ARRAY_BACKFILL`] of them), as `$set`
/// does. A path longer than [`MAX_FIELD_PATH_PARTS`] parts is refused before anything is
/// built, so no caller can nest a document deeper than that through one path.
pub fn set(doc: &mut Document, path: &str, value: Bson) -> Result<(), EngineError> {
    check_field_path(path)?;
    let parts: Vec<&str> = path.split('.').collect();
    set_in_doc(doc, &parts, value)
}

fn set_in_doc(doc: &mut Document, parts: &[&str], value: Bson) -> Result<(), EngineError> {
    if parts.len() == 1 {
        doc.insert(parts[0], value);
        return Ok(());
    }
    if !doc.contains_key(parts[0]) {
        doc.insert(parts[0], Document::new());
    }
    match doc.get_mut(parts[0]) {
        Some(child) => set_in_value(child, &parts[1..], value),
        None => Ok(()),
    }
}

fn set_in_value(cur: &mut Bson, parts: &[&str], value: Bson) -> Result<(), EngineError> {
    match cur {
        Bson::Document(d) => set_in_doc(d, parts, value),
        Bson::Array(items) => {
            let Some(i) = array_index(parts[0]) else {
                return Err(path_not_viable(parts[0], cur));
            };
            if i > items.len() && i - items.len() > MAX_ARRAY_BACKFILL {
                return Err(EngineError::new(
                    ErrorCode::CannotBackfillArray,
                    format!("can't backfill more than {MAX_ARRAY_BACKFILL} elements"),
                ));
            }
            while items.len() <= i {
                items.push(if parts.len() == 1 {
                    Bson::Null
                } else {
                    Bson::Document(Document::new())
                });
            }
            if parts.len() == 1 {
                items[i] = value;
                Ok(())
            } else {
                set_in_value(&mut items[i], &parts[1..], value)
            }
        }
        other => Err(path_not_viable(parts[0], other)),
    }
}

/// Removes `path`; returns the removed value. In an array, the element becomes null (as
/// `$unset` does).
pub fn unset(doc: &mut Document, path: &str) -> Option<Bson> {
    let parts: Vec<&str> = path.split('.').collect();
    unset_in_doc(doc, &parts)
}

fn unset_in_doc(doc: &mut Document, parts: &[&str]) -> Option<Bson> {
    if parts.len() == 1 {
        return doc.remove(parts[0]);
    }
    match doc.get_mut(parts[0])? {
        Bson::Document(d) => unset_in_doc(d, &parts[1..]),
        Bson::Array(items) => {
            let i = array_index(parts[1])?;
            if parts.len() == 2 {
                let item = items.get_mut(i)?;
                Some(std::mem::replace(item, Bson::Null))
            } else {
                match items.get_mut(i)? {
                    Bson::Document(d) => unset_in_doc(d, &parts[2..]),
                    _ => None,
                }
            }
        }
        _ => None,
    }
}

/// A mutable reference to the value at `path`, if it exists.
pub fn get_mut<'a>(doc: &'a mut Document, path: &str) -> Option<&'a mut Bson> {
    let mut parts = path.split('.');
    let mut cur = doc.get_mut(parts.next()?)?;
    for part in parts {
        cur = match cur {
            Bson::Document(d) => d.get_mut(part)?,
            Bson::Array(items) => items.get_mut(array_index(part)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn lookup_traverses_arrays() {
        let d = doc! {"a": [{"b": 1}, {"b": [2, 3]}, {"c": 1}], "x": {"y": 5}};
        let l = lookup(&d, "a.b");
        assert_eq!(l.values.len(), 2);
        assert!(l.missing);
        assert_eq!(l.expanded().len(), 3);
        assert_eq!(lookup(&d, "x.y").values, vec![&Bson::Int32(5)]);
        assert!(lookup(&d, "x.z").missing);
        assert_eq!(lookup(&d, "a.1.b").values.len(), 1);
        assert_eq!(get(&d, "a.0.b"), Some(&Bson::Int32(1)));
    }

    #[test]
    fn set_and_unset() {
        let mut d = doc! {"a": 1};
        set(&mut d, "b.c.d", Bson::Int32(2)).unwrap();
        assert_eq!(d, doc! {"a": 1, "b": {"c": {"d": 2}}});
        assert!(set(&mut d, "a.x", Bson::Int32(1)).is_err());
        let mut d = doc! {"arr": [1]};
        set(&mut d, "arr.2", Bson::Int32(3)).unwrap();
        assert_eq!(d, doc! {"arr": [1, Bson::Null, 3]});
        assert_eq!(unset(&mut d, "arr.0"), Some(Bson::Int32(1)));
        assert_eq!(d, doc! {"arr": [Bson::Null, Bson::Null, 3]});
        assert_eq!(unset(&mut d, "nope.x"), None);
    }

    #[test]
    fn backfill_and_path_length_are_bounded() {
        let mut d = doc! {"arr": []};
        let e = set(&mut d, "arr.2000000000", Bson::Int32(1)).unwrap_err();
        assert_eq!(e.code, ErrorCode::CannotBackfillArray);
        assert_eq!(e.message, "can't backfill more than 1500000 elements");
        let e = set(&mut d, "arr.99999999999999999999999", Bson::Int32(1)).unwrap_err();
        assert_eq!(e.code, ErrorCode::CannotBackfillArray);
        set(&mut d, "arr.1500000", Bson::Int32(1)).unwrap();
        assert_eq!(d.get_array("arr").unwrap().len(), 1_500_001);

        let long = vec!["a"; 20_000].join(".");
        let e = set(&mut doc! {}, &long, Bson::Int32(1)).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::Overflow, "FieldPath is too long")
        );
        let ok = vec!["a"; MAX_FIELD_PATH_PARTS].join(".");
        set(&mut doc! {}, &ok, Bson::Int32(1)).unwrap();
        assert_eq!(array_index("+1"), None);
        assert_eq!(array_index("01"), Some(1));
    }
}
