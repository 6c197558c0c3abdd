//! Update documents: operator updates (`$set $unset $inc $mul $min $max $rename $setOnInsert
//! $push $addToSet $pull $pullAll $pop $currentDate`) and replacements, parsed once and applied
//! to a document. Pipeline updates, `arrayFilters` and positional paths are refused with a
//! clear error.

use bson::{oid::ObjectId, Bson, Document};

use super::matcher::Matcher;
use super::path;
use super::EngineError;
use crate::limits::{measure, MAX_STORED_DEPTH};
use crate::value::compare::{compare, values_equal, OrdBson};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{arithmetic, is_number, type_name};
use crate::value::render::{render_doc, render_value};
use crate::wire::MAX_BSON_OBJECT_SIZE;

/// A parsed update.
#[derive(Debug, Clone)]
pub enum Update {
    /// A replacement document (`_id` kept from the matched document).
    Replacement(Document),
    /// Operators, in document order.
    Operators(Vec<(String, Document)>),
}

/// The update operators the engine applies, in the order the fuzz generator draws them.
pub const OPERATORS: &[&str] = &[
    "$set",
    "$unset",
    "$inc",
    "$mul",
    "$min",
    "$max",
    "$rename",
    "$setOnInsert",
    "$push",
    "$addToSet",
    "$pull",
    "$pullAll",
    "$pop",
    "$currentDate",
];

fn fail(code: ErrorCode, msg: impl Into<String>) -> EngineError {
    EngineError::new(code, msg)
}

impl Update {
    /// Parses the `u` of an update statement.
    pub fn parse(u: &Bson) -> Result<Update, EngineError> {
        let d = match u {
            Bson::Document(d) => d,
            Bson::Array(_) => {
                return Err(fail(
                    ErrorCode::BadValue,
                    "pipeline-style updates are not supported by the embedded shard",
                ))
            }
            _ => {
                return Err(fail(
                    ErrorCode::FailedToParse,
                    "Update argument must be either an object or an array",
                ))
            }
        };
        let first_is_op = d.keys().next().is_some_and(|k| k.starts_with('$'));
        if !first_is_op {
            for k in d.keys() {
                if k.starts_with('$') {
                    return Err(fail(
                        ErrorCode::DollarPrefixedFieldName,
                        format!("The dollar ({k}) prefixed field '{k}' in '{k}' is not allowed in the context of an update's replacement document. Consider using an aggregation pipeline with $replaceWith."),
                    ));
                }
            }
            return Ok(Update::Replacement(d.clone()));
        }
        let mut ops = Vec::new();
        let mut seen = PathSet::default();
        for (op, args) in d {
            if !OPERATORS.contains(&op.as_str()) {
                return Err(fail(
                    ErrorCode::FailedToParse,
                    format!("Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update specified as an array"),
                ));
            }
            let Bson::Document(args) = args else {
                return Err(fail(
                    ErrorCode::FailedToParse,
                    format!("Modifiers operate on fields but we found type {} instead. For example: {{$mod: {{<field>: ...}}}} not {{{op}: {}}}", type_name(args), render_value(args)),
                ));
            };
            let mut paths: Vec<&str> = args.keys().map(String::as_str).collect();
            if op == "$rename" {
                for v in args.values() {
                    match v {
                        Bson::String(to) => paths.push(to),
                        _ => {
                            return Err(fail(
                                ErrorCode::BadValue,
                                "The 'to' field for $rename must be a string",
                            ))
                        }
                    }
                }
            }
            for p in paths {
                if p.is_empty() || p.split('.').any(|s| s.is_empty()) {
                    return Err(fail(
                        ErrorCode::EmptyFieldName,
                        "An update path cannot contain an empty field name",
                    ));
                }
                if p.split('.').nth(MAX_STORED_DEPTH).is_some() {
                    return Err(too_deep());
                }
                if p.split('.').any(|s| s.starts_with('$')) {
                    return Err(fail(
                        ErrorCode::BadValue,
                        format!("positional and array-filter paths are not supported by the embedded shard: '{p}'"),
                    ));
                }
                if let Some(at) = seen.conflict(p) {
                    return Err(fail(
                        ErrorCode::ConflictingUpdateOperators,
                        format!("Updating the path '{p}' would create a conflict at '{at}'"),
                    ));
                }
            }
            ops.push((op.clone(), args.clone()));
        }
        Ok(Update::Operators(ops))
    }

    /// Whether this is a replacement.
    pub fn is_replacement(&self) -> bool {
        matches!(self, Update::Replacement(_))
    }

    /// Applies the update to `doc` (`inserting` when building an upserted document, which
    /// enables `$setOnInsert`). Checks that `_id` is unchanged.
    pub fn apply(&self, doc: &mut Document, inserting: bool) -> Result<(), EngineError> {
        let old_id = doc.get("_id").cloned();
        match self {
            Update::Replacement(r) => {
                let mut new_doc = Document::new();
                if let Some(id) = &old_id {
                    new_doc.insert("_id", id.clone());
                }
                for (k, v) in r {
                    if k == "_id" {
                        if let Some(id) = &old_id {
                            if !values_equal(id, v) || !same_type(id, v) {
                                return Err(fail(
                                    ErrorCode::ImmutableField,
                                    format!("After applying the update, the (immutable) field '_id' was found to have been altered to _id: {}", render_value(v)),
                                ));
                            }
                            continue;
                        }
                    }
                    new_doc.insert(k.clone(), v.clone());
                }
                *doc = new_doc;
            }
            Update::Operators(ops) => {
                for (op, args) in ops {
                    for (p, arg) in args {
                        apply_op(op, p, arg, doc, inserting)?;
                    }
                }
                if let Some(old) = &old_id {
                    let kept = doc
                        .get("_id")
                        .is_some_and(|new| values_equal(old, new) && same_type(old, new));
                    if !kept {
                        return Err(fail(
                            ErrorCode::ImmutableField,
                            "Performing an update on the path '_id' would modify the immutable field '_id'",
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

fn same_type(a: &Bson, b: &Bson) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// The paths an update has named so far, for mongod's conflict rule (no path may equal or
/// be a prefix of another), checked in time linear in the paths' length rather than comparing
/// every pair.
#[derive(Default)]
struct PathSet {
    /// Every path named.
    paths: std::collections::HashSet<String>,
    /// Every proper prefix (`a`, `a.b` of `a.b.c`) of a path named.
    prefixes: std::collections::HashSet<String>,
}

impl PathSet {
    /// Records `p`; returns where it conflicts with an earlier path, if it does.
    fn conflict(&mut self, p: &str) -> Option<String> {
        if self.paths.contains(p) || self.prefixes.contains(p) {
            return Some(p.to_string());
        }
        let mut prefix_ends = p.match_indices('.').map(|(i, _)| i);
        if let Some(at) = prefix_ends.find(|&i| self.paths.contains(&p[..i])) {
            return Some(p[..at].to_string());
        }
        for (i, _) in p.match_indices('.') {
            self.prefixes.insert(p[..i].to_string());
        }
        self.paths.insert(p.to_string());
        None
    }
}

/// The error for a document nested deeper than a stored document may be.
pub fn too_deep() -> EngineError {
    fail(
        ErrorCode::Overflow,
        format!("Document exceeds maximum nesting depth of {MAX_STORED_DEPTH}"),
    )
}

fn id_render(doc: &Document) -> String {
    match doc.get("_id") {
        Some(id) => format!("{{_id: {}}}", render_value(id)),
        None => "{}".to_string(),
    }
}

fn apply_op(
    op: &str,
    p: &str,
    arg: &Bson,
    doc: &mut Document,
    inserting: bool,
) -> Result<(), EngineError> {
    match op {
        "$set" => path::set(doc, p, arg.clone()),
        "$setOnInsert" => {
            if inserting {
                path::set(doc, p, arg.clone())
            } else {
                Ok(())
            }
        }
        "$unset" => {
            path::unset(doc, p);
            Ok(())
        }
        "$inc" | "$mul" => {
            let mul = op == "$mul";
            if !is_number(arg) {
                return Err(fail(
                    ErrorCode::TypeMismatch,
                    format!(
                        "Cannot {} with non-numeric argument: {{{p}: {}}}",
                        if mul { "multiply" } else { "increment" },
                        render_value(arg)
                    ),
                ));
            }
            match path::get(doc, p).cloned() {
                None => {
                    let v = if mul { arithmetic(&Bson::Int32(0), arg, true) } else { arg.clone() };
                    path::set(doc, p, v)
                }
                Some(cur) if is_number(&cur) => path::set(doc, p, arithmetic(&cur, arg, mul)),
                Some(cur) => Err(fail(
                    ErrorCode::TypeMismatch,
                    format!(
                        "Cannot apply {op} to a value of non-numeric type. {} has the field '{}' of non-numeric type {}",
                        id_render(doc),
                        p.rsplit('.').next().unwrap_or(p),
                        type_name(&cur)
                    ),
                )),
            }
        }
        "$min" | "$max" => match path::get(doc, p) {
            None => path::set(doc, p, arg.clone()),
            Some(cur) => {
                let o = compare(arg, cur);
                if (op == "$min" && o.is_lt()) || (op == "$max" && o.is_gt()) {
                    path::set(doc, p, arg.clone())
                } else {
                    Ok(())
                }
            }
        },
        "$rename" => {
            let Bson::String(to) = arg else {
                return Ok(());
            };
            match path::unset(doc, p) {
                Some(v) => path::set(doc, to, v),
                None => Ok(()),
            }
        }
        "$currentDate" => {
            let want_ts = match arg {
                Bson::Document(d) => match d.get("$type") {
                    Some(Bson::String(t)) if t == "timestamp" => true,
                    Some(Bson::String(t)) if t == "date" => false,
                    _ => {
                        return Err(fail(
                            ErrorCode::BadValue,
                            "The '$type' string field is required to be 'date' or 'timestamp': {$currentDate: {field : {$type: 'date'}}}",
                        ))
                    }
                },
                Bson::Boolean(_) => false,
                _ => {
                    return Err(fail(
                        ErrorCode::BadValue,
                        format!("{} is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({{$type: 'timestamp/date'}}).", type_name(arg)),
                    ))
                }
            };
            let now = bson::DateTime::now();
            let v = if want_ts {
                Bson::Timestamp(bson::Timestamp {
                    time: (now.timestamp_millis() / 1000) as u32,
                    increment: 1,
                })
            } else {
                Bson::DateTime(now)
            };
            path::set(doc, p, v)
        }
        "$push" | "$addToSet" => {
            let (items, slice, position) = match arg {
                Bson::Document(d) if d.contains_key("$each") => {
                    let Some(Bson::Array(each)) = d.get("$each") else {
                        return Err(fail(
                            ErrorCode::BadValue,
                            format!("The argument to $each in {op} must be an array but it was of type: {}", d.get("$each").map(type_name).unwrap_or("missing")),
                        ));
                    };
                    for k in d.keys() {
                        let allowed: &[&str] = if op == "$push" {
                            &["$each", "$slice", "$position", "$sort"]
                        } else {
                            &["$each"]
                        };
                        if !allowed.contains(&k.as_str()) {
                            return Err(fail(
                                ErrorCode::BadValue,
                                format!("Unrecognized clause in {op}: {k}"),
                            ));
                        }
                    }
                    if d.contains_key("$sort") {
                        return Err(fail(
                            ErrorCode::BadValue,
                            "$push with $sort is not supported by the embedded shard",
                        ));
                    }
                    let slice = match d.get("$slice") {
                        None => None,
                        Some(v) if is_number(v) => Some(as_i64_any(v)),
                        Some(_) => {
                            return Err(fail(
                                ErrorCode::BadValue,
                                "The value for $slice must be an integer value",
                            ))
                        }
                    };
                    let position = match d.get("$position") {
                        None => None,
                        Some(v) if is_number(v) => Some(as_i64_any(v)),
                        Some(_) => {
                            return Err(fail(
                                ErrorCode::BadValue,
                                "The value for $position must be an integer value",
                            ))
                        }
                    };
                    (each.clone(), slice, position)
                }
                other => (vec![other.clone()], None, None),
            };
            let mut arr = match path::get(doc, p) {
                None => Vec::new(),
                Some(Bson::Array(a)) => a.clone(),
                Some(other) => {
                    return Err(fail(
                        ErrorCode::BadValue,
                        format!(
                            "The field '{p}' must be an array but is of type {} in document {}",
                            type_name(other),
                            id_render(doc)
                        ),
                    ))
                }
            };
            if op == "$addToSet" {
                // MongoDB's order makes equal values of one canonical type (1, 1.0 and
                // NumberLong(1) are one member), so a set of the order's keys is the test.
                let mut present: std::collections::BTreeSet<OrdBson> =
                    arr.iter().cloned().map(OrdBson).collect();
                for item in items {
                    if present.insert(OrdBson(item.clone())) {
                        arr.push(item);
                    }
                }
            } else {
                let at = match position {
                    None => arr.len(),
                    Some(pos) if pos >= 0 => (pos as usize).min(arr.len()),
                    Some(pos) => arr.len().saturating_sub(pos.unsigned_abs() as usize),
                };
                for (i, item) in items.into_iter().enumerate() {
                    arr.insert(at + i, item);
                }
                if let Some(s) = slice {
                    if s >= 0 {
                        arr.truncate(s as usize);
                    } else {
                        let keep = s.unsigned_abs() as usize;
                        if arr.len() > keep {
                            arr.drain(..arr.len() - keep);
                        }
                    }
                }
            }
            path::set(doc, p, Bson::Array(arr))
        }
        "$pull" | "$pullAll" => {
            let Some(cur) = path::get(doc, p) else {
                return Ok(());
            };
            let Bson::Array(arr) = cur else {
                return Err(fail(
                    ErrorCode::BadValue,
                    format!("Cannot apply {op} to a non-array value"),
                ));
            };
            let keep: Vec<Bson> = if op == "$pullAll" {
                let Bson::Array(remove) = arg else {
                    return Err(fail(
                        ErrorCode::BadValue,
                        format!(
                            "$pullAll requires an array argument but was given a {}",
                            type_name(arg)
                        ),
                    ));
                };
                let remove: std::collections::BTreeSet<OrdBson> =
                    remove.iter().cloned().map(OrdBson).collect();
                arr.iter()
                    .filter(|x| !remove.contains(&OrdBson((*x).clone())))
                    .cloned()
                    .collect()
            } else {
                let pred = PullPredicate::parse(arg)?;
                arr.iter().filter(|x| !pred.matches(x)).cloned().collect()
            };
            path::set(doc, p, Bson::Array(keep))
        }
        "$pop" => {
            let dir = match arg {
                v if is_number(v) && as_i64_any(v) == 1 => 1,
                v if is_number(v) && as_i64_any(v) == -1 => -1,
                _ => {
                    return Err(fail(
                        ErrorCode::FailedToParse,
                        format!("$pop expects 1 or -1, found: {}", render_value(arg)),
                    ))
                }
            };
            match path::get(doc, p).cloned() {
                None => Ok(()),
                Some(Bson::Array(mut a)) => {
                    if !a.is_empty() {
                        if dir == 1 {
                            a.pop();
                        } else {
                            a.remove(0);
                        }
                    }
                    path::set(doc, p, Bson::Array(a))
                }
                Some(other) => Err(fail(
                    ErrorCode::TypeMismatch,
                    format!(
                        "Path '{p}' contains an element of non-array type '{}'",
                        type_name(&other)
                    ),
                )),
            }
        }
        other => Err(fail(
            ErrorCode::FailedToParse,
            format!("Unknown modifier: {other}"),
        )),
    }
}

fn as_i64_any(v: &Bson) -> i64 {
    match v {
        Bson::Int32(i) => *i as i64,
        Bson::Int64(i) => *i,
        Bson::Double(d) => *d as i64,
        _ => 0,
    }
}

/// What `$pull` removes: elements equal to a value, elements satisfying operators, or
/// documents matching a filter.
enum PullPredicate {
    Value(Bson),
    Ops(Matcher),
    Doc(Matcher),
}

impl PullPredicate {
    fn parse(arg: &Bson) -> Result<PullPredicate, EngineError> {
        Ok(match arg {
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                let mut wrapped = Document::new();
                wrapped.insert("v", Bson::Document(d.clone()));
                PullPredicate::Ops(Matcher::parse(&wrapped)?)
            }
            Bson::Document(d) => PullPredicate::Doc(Matcher::parse(d)?),
            other => PullPredicate::Value(other.clone()),
        })
    }

    fn matches(&self, x: &Bson) -> bool {
        match self {
            PullPredicate::Value(v) => values_equal(x, v),
            PullPredicate::Ops(m) => {
                let mut d = Document::new();
                d.insert("v", x.clone());
                m.matches(&d)
            }
            PullPredicate::Doc(m) => matches!(x, Bson::Document(d) if m.matches(d)),
        }
    }
}

/// Renders a document for messages.
pub fn describe(doc: &Document) -> String {
    render_doc(doc)
}

/// Puts `_id` first, generating an ObjectId when missing, as mongod stores documents.
pub fn prepare_insert(mut d: Document) -> Result<Document, EngineError> {
    let id = match d.remove("_id") {
        Some(Bson::Array(_)) => {
            return Err(EngineError::new(
                ErrorCode::InvalidIdField,
                "The '_id' value cannot be of type array",
            ))
        }
        Some(Bson::RegularExpression(_)) => {
            return Err(EngineError::new(
                ErrorCode::InvalidIdField,
                "The '_id' value cannot be of type regex",
            ))
        }
        Some(Bson::Undefined) => {
            return Err(EngineError::new(
                ErrorCode::InvalidIdField,
                "The '_id' value cannot be of type undefined",
            ))
        }
        Some(v) => v,
        None => Bson::ObjectId(ObjectId::new()),
    };
    let mut out = Document::new();
    out.insert("_id", id);
    for (k, v) in d {
        out.insert(k, v);
    }
    let m = measure(&out);
    if m.bytes > MAX_BSON_OBJECT_SIZE {
        return Err(EngineError::new(
            ErrorCode::BSONObjectTooLarge,
            format!(
                "object to insert too large. size in bytes: {}, max size: {MAX_BSON_OBJECT_SIZE}",
                m.bytes
            ),
        ));
    }
    if m.depth > MAX_STORED_DEPTH {
        return Err(EngineError::new(
            ErrorCode::Overflow,
            format!(
                "cannot insert document because it exceeds {MAX_STORED_DEPTH} levels of nesting"
            ),
        ));
    }
    Ok(out)
}

/// The document an upsert inserts: the filter's equality fields, then the update applied, `_id`
/// first (generated when neither gives one). The embedded shard stores it; the router builds an upsert's document
/// with it too, when it inserts the document of a write without shard key itself.
pub fn upsert_document(filter: &Document, upd: &Update) -> Result<Document, EngineError> {
    let mut seed = Document::new();
    match upd {
        Update::Replacement(_) => {
            if let Some((_, id)) = crate::engine::matcher::equality_fields(filter)
                .into_iter()
                .find(|(k, _)| k == "_id")
            {
                seed.insert("_id", id);
            }
        }
        Update::Operators(_) => {
            for (k, v) in crate::engine::matcher::equality_fields(filter) {
                if k.starts_with('$') {
                    continue;
                }
                crate::engine::path::set(&mut seed, &k, v)?;
            }
        }
    }
    upd.apply(&mut seed, true)?;
    prepare_insert(seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn apply(d: Document, u: Document) -> Result<Document, EngineError> {
        let mut d = d;
        Update::parse(&Bson::Document(u))?.apply(&mut d, false)?;
        Ok(d)
    }

    #[test]
    fn set_unset_inc_mul() {
        let d = doc! {"_id": 1, "a": 1, "b": 2};
        assert_eq!(
            apply(
                d.clone(),
                doc! {"$set": {"c.d": 1}, "$unset": {"b": ""}, "$inc": {"a": 2}}
            )
            .unwrap(),
            doc! {"_id": 1, "a": 3, "c": {"d": 1}}
        );
        assert_eq!(
            apply(d.clone(), doc! {"$inc": {"a": 1.5}})
                .unwrap()
                .get_f64("a")
                .unwrap(),
            2.5
        );
        assert_eq!(
            apply(doc! {"a": i32::MAX}, doc! {"$inc": {"a": 1}})
                .unwrap()
                .get_i64("a")
                .unwrap(),
            i32::MAX as i64 + 1
        );
        assert_eq!(
            apply(d.clone(), doc! {"$mul": {"z": 5}})
                .unwrap()
                .get_i32("z")
                .unwrap(),
            0
        );
        let e = apply(doc! {"_id": 1, "s": "x"}, doc! {"$inc": {"s": 1}}).unwrap_err();
        assert_eq!(e.code, ErrorCode::TypeMismatch);
        let e = apply(d, doc! {"$inc": {"a": "x"}}).unwrap_err();
        assert_eq!(e.code, ErrorCode::TypeMismatch);
    }

    #[test]
    fn min_max_rename_current_date() {
        let d = doc! {"a": 5, "b": 1};
        let r = apply(
            d,
            doc! {"$min": {"a": 3}, "$max": {"b": 0, "n": 7}, "$rename": {"x": "y"}},
        )
        .unwrap();
        assert_eq!(r, doc! {"a": 3, "b": 1, "n": 7});
        let r = apply(doc! {"a": 1}, doc! {"$rename": {"a": "z.q"}}).unwrap();
        assert_eq!(r, doc! {"z": {"q": 1}});
        let r = apply(
            doc! {},
            doc! {"$currentDate": {"d": true, "t": {"$type": "timestamp"}}},
        )
        .unwrap();
        assert!(r.get_datetime("d").is_ok());
        assert!(r.get_timestamp("t").is_ok());
    }

    #[test]
    fn arrays() {
        let d = doc! {"a": [1, 2, 3]};
        assert_eq!(
            apply(d.clone(), doc! {"$push": {"a": 4}}).unwrap(),
            doc! {"a": [1, 2, 3, 4]}
        );
        assert_eq!(
            apply(
                d.clone(),
                doc! {"$push": {"a": {"$each": [9, 8], "$position": 0, "$slice": 3}}}
            )
            .unwrap(),
            doc! {"a": [9, 8, 1]}
        );
        assert_eq!(
            apply(
                d.clone(),
                doc! {"$push": {"a": {"$each": [4, 5], "$slice": -2}}}
            )
            .unwrap(),
            doc! {"a": [4, 5]}
        );
        assert_eq!(
            apply(d.clone(), doc! {"$addToSet": {"a": {"$each": [3, 4, 4]}}}).unwrap(),
            doc! {"a": [1, 2, 3, 4]}
        );
        assert_eq!(
            apply(d.clone(), doc! {"$pull": {"a": {"$gte": 2}}}).unwrap(),
            doc! {"a": [1]}
        );
        assert_eq!(
            apply(d.clone(), doc! {"$pullAll": {"a": [1, 3]}}).unwrap(),
            doc! {"a": [2]}
        );
        assert_eq!(
            apply(d.clone(), doc! {"$pop": {"a": -1}}).unwrap(),
            doc! {"a": [2, 3]}
        );
        assert_eq!(
            apply(d, doc! {"$pop": {"a": 1}}).unwrap(),
            doc! {"a": [1, 2]}
        );
        let r = apply(
            doc! {"l": [{"k": 1}, {"k": 2}]},
            doc! {"$pull": {"l": {"k": 2}}},
        )
        .unwrap();
        assert_eq!(r, doc! {"l": [{"k": 1}]});
        assert!(apply(doc! {"a": 1}, doc! {"$push": {"a": 1}}).is_err());
    }

    #[test]
    fn replacement_and_id_immutability() {
        let d = doc! {"_id": 1, "a": 1};
        assert_eq!(
            apply(d.clone(), doc! {"b": 2}).unwrap(),
            doc! {"_id": 1, "b": 2}
        );
        assert_eq!(
            apply(d.clone(), doc! {"_id": 1, "b": 2}).unwrap(),
            doc! {"_id": 1, "b": 2}
        );
        assert_eq!(
            apply(d.clone(), doc! {"_id": 2}).unwrap_err().code,
            ErrorCode::ImmutableField
        );
        assert_eq!(
            apply(d.clone(), doc! {"$set": {"_id": 5}})
                .unwrap_err()
                .code,
            ErrorCode::ImmutableField
        );
        assert!(
            apply(d, doc! {"$set": {"_id": 1}}).is_ok(),
            "setting _id to itself is allowed"
        );
    }

    #[test]
    fn parse_errors() {
        assert_eq!(
            Update::parse(&Bson::Document(doc! {"$frob": {"a": 1}}))
                .unwrap_err()
                .code,
            ErrorCode::FailedToParse
        );
        assert_eq!(
            Update::parse(&Bson::Document(doc! {"$set": {"a": 1}, "$inc": {"a": 1}}))
                .unwrap_err()
                .code,
            ErrorCode::ConflictingUpdateOperators
        );
        assert!(Update::parse(&Bson::Document(doc! {"$set": {"a.$": 1}})).is_err());
        assert!(Update::parse(&Bson::Array(vec![])).is_err());
    }
}
