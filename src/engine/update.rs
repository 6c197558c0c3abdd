//! Update documents: operator updates (`$set $unset $inc $mul $min $max $rename $setOnInsert
//! $push $addToSet $pull $pullAll $pop $currentDate`, `$push` with `$each`, `$position`,
//! `$sort` and `$slice`), replacements and pipeline-style updates (`$set/$addFields`,
//! `$project`, `$unset`, `$replaceRoot/$replaceWith`), parsed once and applied to a document.
//! Operator paths may name array elements: the positional `$` (the element the query matched),
//! `$[]` (every element) and `$[<id>]` (the elements its `arrayFilters` entry matches).

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
    /// A pipeline-style update: its stages, run over the matched document.
    Pipeline(Vec<Bson>),
}

/// Stages a pipeline-style update may use (others are refused with InvalidOptions, 72).
const UPDATE_PIPELINE_STAGES: &[&str] = &[
    "$addFields",
    "$set",
    "$project",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
];

/// The parsed `arrayFilters` of an update statement: one filter per identifier.
#[derive(Debug, Clone, Default)]
pub struct ArrayFilters(Vec<(String, Matcher)>);

impl ArrayFilters {
    /// Parses `arrayFilters`, as mongod checks them: each filter names one identifier (a
    /// lowercase letter, then letters and digits) in all its top-level fields, and no
    /// identifier twice.
    pub fn parse(filters: &[Bson]) -> Result<ArrayFilters, EngineError> {
        let mut out: Vec<(String, Matcher)> = Vec::new();
        for f in filters {
            let Bson::Document(f) = f else {
                return Err(fail(
                    ErrorCode::TypeMismatch,
                    format!(
                        "Each array filter must be an object, found {}",
                        type_name(f)
                    ),
                ));
            };
            let mut id: Option<&str> = None;
            for k in f.keys() {
                let top = k.split('.').next().unwrap_or("");
                match id {
                    None => id = Some(top),
                    Some(prev) if prev != top => {
                        return Err(fail(
                            ErrorCode::FailedToParse,
                            format!("Error parsing array filter :: caused by :: Expected a single top-level field name, found '{prev}' and '{top}'"),
                        ))
                    }
                    _ => {}
                }
            }
            let Some(id) = id else {
                return Err(fail(
                    ErrorCode::FailedToParse,
                    "Cannot use an expression without a top-level field name in arrayFilters",
                ));
            };
            let valid = id.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && id.chars().all(|c| c.is_ascii_alphanumeric());
            if !valid {
                return Err(fail(
                    ErrorCode::BadValue,
                    format!("Error parsing array filter :: caused by :: The top-level field name must be an alphanumeric string beginning with a lowercase letter, found '{id}'"),
                ));
            }
            if out.iter().any(|(n, _)| n == id) {
                return Err(fail(
                    ErrorCode::FailedToParse,
                    format!("Found multiple array filters with the same top-level field name {id}"),
                ));
            }
            out.push((id.to_string(), Matcher::parse(f)?));
        }
        Ok(ArrayFilters(out))
    }

    fn matches(&self, id: &str, path: &str, element: &Bson) -> Result<bool, EngineError> {
        let Some((_, m)) = self.0.iter().find(|(n, _)| n == id) else {
            return Err(fail(
                ErrorCode::BadValue,
                format!("No array filter found for identifier '{id}' in path '{path}'"),
            ));
        };
        let mut d = Document::new();
        d.insert(id, element.clone());
        Ok(m.matches(&d))
    }

    /// A statement's `arrayFilters` field (absent or null: none), parsed and checked against
    /// its update, as mongod checks them before it looks for a document.
    pub fn of_statement(
        v: Option<&Bson>,
        upd: &Update,
        u: &Bson,
    ) -> Result<ArrayFilters, EngineError> {
        let filters = match v {
            None | Some(Bson::Null) => ArrayFilters::default(),
            Some(Bson::Array(a)) => ArrayFilters::parse(a)?,
            Some(other) => {
                return Err(fail(
                    ErrorCode::TypeMismatch,
                    format!(
                        "BSON field 'arrayFilters' is the wrong type '{}', expected type 'array'",
                        type_name(other)
                    ),
                ))
            }
        };
        filters.check_used(upd, u)?;
        Ok(filters)
    }

    /// Refuses filters the update does not use (FailedToParse, 9), as mongod does.
    pub fn check_used(&self, update: &Update, u: &Bson) -> Result<(), EngineError> {
        let Update::Operators(ops) = update else {
            if let Some((id, _)) = self.0.first() {
                return Err(fail(
                    ErrorCode::FailedToParse,
                    format!(
                        "The array filter for identifier '{id}' was not used in the update {}",
                        render_value(u)
                    ),
                ));
            }
            return Ok(());
        };
        for (id, _) in &self.0 {
            let marker = format!("$[{id}]");
            let used = ops
                .iter()
                .any(|(_, args)| args.keys().any(|p| p.split('.').any(|s| s == marker)));
            if !used {
                return Err(fail(
                    ErrorCode::FailedToParse,
                    format!(
                        "The array filter for identifier '{id}' was not used in the update {}",
                        render_value(u)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What an update needs besides the document: the statement's query (for the positional
/// `$`), its `arrayFilters`, and the request's variables (for pipeline updates).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyContext<'a> {
    /// The statement's query, parsed.
    pub query: Option<&'a Matcher>,
    /// The statement's `arrayFilters`.
    pub array_filters: Option<&'a ArrayFilters>,
    /// The request's variables (`let`, `$$NOW`).
    pub vars: Option<&'a super::aggregate::Variables>,
}

impl ApplyContext<'_> {
    /// The index of the element of the array at `prefix` that the query matched.
    ///
    /// `doc` is the document as it was before the update: as in mongod, the match that names
    /// the element is the query's match of the stored document, whatever the update's other
    /// fields change (an `_id` the query names, say).
    fn positional(&self, doc: &Document, prefix: &str) -> Result<usize, EngineError> {
        let not_found = || {
            fail(
                ErrorCode::BadValue,
                "The positional operator did not find the match needed from the query.",
            )
        };
        let Some(q) = self.query else {
            return Err(not_found());
        };
        let Some(Bson::Array(items)) = path::get(doc, prefix) else {
            return Err(not_found());
        };
        // The query must constrain the array: with no element left it must not match.
        let mut probe = doc.clone();
        path::set(&mut probe, prefix, Bson::Array(Vec::new()))?;
        if q.matches(&probe) {
            return Err(not_found());
        }
        for (i, item) in items.iter().enumerate() {
            let mut probe = doc.clone();
            path::set(&mut probe, prefix, Bson::Array(vec![item.clone()]))?;
            if q.matches(&probe) {
                return Ok(i);
            }
        }
        Err(not_found())
    }
}

/// The concrete paths a path with `$`, `$[]` or `$[<id>]` names in `doc`; a positional `$`
/// is resolved on `stored`, the document before the update.
fn expand_path(
    doc: &Document,
    stored: &Document,
    p: &str,
    ctx: &ApplyContext,
) -> Result<Vec<String>, EngineError> {
    if !p.contains('$') {
        return Ok(vec![p.to_string()]);
    }
    let parts: Vec<&str> = p.split('.').collect();
    let mut out = Vec::new();
    expand_from(doc, stored, p, &parts, String::new(), ctx, &mut out)?;
    Ok(out)
}

fn expand_from(
    doc: &Document,
    stored: &Document,
    full: &str,
    parts: &[&str],
    prefix: String,
    ctx: &ApplyContext,
    out: &mut Vec<String>,
) -> Result<(), EngineError> {
    let Some((part, rest)) = parts.split_first() else {
        out.push(prefix);
        return Ok(());
    };
    let join = |x: &str| {
        if prefix.is_empty() {
            x.to_string()
        } else {
            format!("{prefix}.{x}")
        }
    };
    if *part != "$" && !part.starts_with("$[") {
        return expand_from(doc, stored, full, rest, join(part), ctx, out);
    }
    let items = match path::get(doc, &prefix) {
        Some(Bson::Array(items)) => items.clone(),
        _ if *part == "$" => {
            return Err(fail(
                ErrorCode::BadValue,
                "The positional operator did not find the match needed from the query.",
            ))
        }
        _ => {
            return Err(fail(
                ErrorCode::BadValue,
                format!(
                "The path '{prefix}' must exist in the document in order to apply array updates."
            ),
            ))
        }
    };
    let indices: Vec<usize> = if *part == "$" {
        vec![ctx.positional(stored, &prefix)?]
    } else if *part == "$[]" {
        (0..items.len()).collect()
    } else {
        let id = &part[2..part.len().saturating_sub(1)];
        let Some(filters) = ctx.array_filters else {
            return Err(fail(
                ErrorCode::BadValue,
                format!("No array filter found for identifier '{id}' in path '{full}'"),
            ));
        };
        let mut v = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if filters.matches(id, full, item)? {
                v.push(i);
            }
        }
        v
    };
    for i in indices {
        expand_from(doc, stored, full, rest, join(&i.to_string()), ctx, out)?;
    }
    Ok(())
}

/// Whether a path segment is an array-update placeholder mongod accepts.
fn is_placeholder(segment: &str) -> bool {
    segment == "$"
        || segment == "$[]"
        || (segment.starts_with("$[") && segment.ends_with(']') && segment.len() > 3)
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
    "$bit",
];

fn fail(code: ErrorCode, msg: impl Into<String>) -> EngineError {
    EngineError::new(code, msg)
}

impl Update {
    /// Parses the `u` of an update statement.
    pub fn parse(u: &Bson) -> Result<Update, EngineError> {
        let d = match u {
            Bson::Document(d) => d,
            Bson::Array(stages) => {
                for st in stages {
                    let Bson::Document(st) = st else {
                        return Err(fail(
                            ErrorCode::TypeMismatch,
                            "Each element of the 'pipeline' array must be an object",
                        ));
                    };
                    let name = st.keys().next().map(String::as_str).unwrap_or("");
                    if !UPDATE_PIPELINE_STAGES.contains(&name) {
                        return Err(fail(
                            ErrorCode::InvalidOptions,
                            format!("{name} is not allowed to be used within an update"),
                        ));
                    }
                }
                return Ok(Update::Pipeline(stages.clone()));
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
            if op == "$bit" {
                for v in args.values() {
                    check_bit_argument(v)?;
                }
            }
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
                if let Some(bad) = p
                    .split('.')
                    .find(|s| s.starts_with('$') && !is_placeholder(s))
                {
                    return Err(fail(
                        ErrorCode::DollarPrefixedFieldName,
                        format!("The dollar ($) prefixed field '{bad}' in '{p}' is not valid for storage."),
                    ));
                }
                if op == "$rename" && p.split('.').any(is_placeholder) {
                    return Err(fail(
                        ErrorCode::BadValue,
                        format!("The source field for $rename may not be dynamic: {p}"),
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
        self.apply_in(doc, inserting, &ApplyContext::default())
    }

    /// Applies the update with its statement's query, `arrayFilters` and variables.
    pub fn apply_in(
        &self,
        doc: &mut Document,
        inserting: bool,
        ctx: &ApplyContext,
    ) -> Result<(), EngineError> {
        let old_id = doc.get("_id").cloned();
        match self {
            Update::Pipeline(stages) => {
                let env = super::aggregate::Env {
                    db: String::new(),
                    vars: ctx.vars.cloned().unwrap_or_default(),
                    namespaces: None,
                };
                let out = super::aggregate::run_in(
                    stages,
                    vec![doc.clone()],
                    &super::aggregate::AggregateOptions::default(),
                    &env,
                )?;
                let mut new_doc = out.into_iter().next().unwrap_or_default();
                match (&old_id, new_doc.get("_id")) {
                    (Some(old), Some(new)) if !(values_equal(old, new) && same_type(old, new)) => {
                        return Err(fail(
                            ErrorCode::ImmutableField,
                            format!("After applying the update, the (immutable) field '_id' was found to have been altered to _id: {}", render_value(new)),
                        ));
                    }
                    (Some(old), None) => {
                        let mut with_id = Document::new();
                        with_id.insert("_id", old.clone());
                        with_id.extend(new_doc);
                        new_doc = with_id;
                    }
                    _ => {}
                }
                *doc = new_doc;
            }
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
                // The stored document, for a positional `$` (copied only when a path has one).
                let positional = ops
                    .iter()
                    .any(|(_, args)| args.iter().any(|(p, _)| p.split('.').any(|c| c == "$")));
                let stored = positional.then(|| doc.clone());
                for (op, args) in ops {
                    for (p, arg) in args {
                        let before = stored.as_ref().unwrap_or(doc);
                        for concrete in expand_path(doc, before, p, ctx)? {
                            apply_op(op, &concrete, arg, doc, inserting)?;
                        }
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

/// Checks a `$bit` field's argument as mongod's parser does: a document of `and`/`or`/`xor`
/// with 32- or 64-bit integers, at least one.
fn check_bit_argument(v: &Bson) -> Result<(), EngineError> {
    let Bson::Document(ops) = v else {
        return Err(fail(
            ErrorCode::BadValue,
            format!(
                "The $bit modifier is not compatible with a {}. You must pass in an embedded document: {{$bit: {{field: {{and/or/xor: #}}}}",
                type_name(v)
            ),
        ));
    };
    for (k, n) in ops {
        if !matches!(k.as_str(), "and" | "or" | "xor") {
            return Err(fail(
                ErrorCode::BadValue,
                format!(
                    "The $bit modifier only supports 'and', 'or', and 'xor', not '{k}' which is an unknown operator: {{{k}: {}}}",
                    render_value(n)
                ),
            ));
        }
        if !matches!(n, Bson::Int32(_) | Bson::Int64(_)) {
            return Err(fail(
                ErrorCode::BadValue,
                format!(
                    "The $bit modifier field must be an Integer(32/64 bit); a '{}' is not supported here: {{{k}: {}}}",
                    type_name(n),
                    render_value(n)
                ),
            ));
        }
    }
    if ops.is_empty() {
        return Err(fail(
            ErrorCode::BadValue,
            "You must pass in at least one bitwise operation. The format is: {$bit: {field: {and/or/xor: #}}",
        ));
    }
    Ok(())
}

/// `$bit`'s operations applied in order to an integer (a missing field starts from int 0); an
/// int stays an int until a long takes part, as mongod's SafeNum computes.
fn apply_bit(start: &Bson, ops: &Bson) -> Bson {
    let Bson::Document(ops) = ops else {
        return start.clone();
    };
    let mut cur = start.clone();
    for (k, n) in ops {
        let (a, b, long) = match (&cur, n) {
            (Bson::Int32(a), Bson::Int32(b)) => (*a as i64, *b as i64, false),
            (Bson::Int32(a), Bson::Int64(b)) => (*a as i64, *b, true),
            (Bson::Int64(a), Bson::Int32(b)) => (*a, *b as i64, true),
            (Bson::Int64(a), Bson::Int64(b)) => (*a, *b, true),
            _ => continue,
        };
        let r = match k.as_str() {
            "and" => a & b,
            "or" => a | b,
            _ => a ^ b,
        };
        cur = if long {
            Bson::Int64(r)
        } else {
            Bson::Int32(r as i32)
        };
    }
    cur
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
        "$bit" => match path::get(doc, p).cloned() {
            None => path::set(doc, p, apply_bit(&Bson::Int32(0), arg)),
            Some(cur @ (Bson::Int32(_) | Bson::Int64(_))) => {
                let new = apply_bit(&cur, arg);
                if new != cur {
                    path::set(doc, p, new)
                } else {
                    Ok(())
                }
            }
            Some(cur) => Err(fail(
                ErrorCode::BadValue,
                format!(
                    "Cannot apply $bit to a value of non-integral type.{} has the field {} of non-integral type {}",
                    doc.get("_id")
                        .map(|id| format!("_id: {}", render_value(id)))
                        .unwrap_or_default(),
                    p.rsplit('.').next().unwrap_or(p),
                    type_name(&cur)
                ),
            )),
        },
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
            let (items, slice, position, sort) = match arg {
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
                    let sort = match d.get("$sort") {
                        None => None,
                        Some(v) => Some(PushSort::parse(v)?),
                    };
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
                    (each.clone(), slice, position, sort)
                }
                other => (vec![other.clone()], None, None, None),
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
                if let Some(sort) = &sort {
                    sort.sort(&mut arr);
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

/// `$push`'s `$sort`: whole elements (`1`/`-1`) or embedded fields (`{field: 1}`).
enum PushSort {
    Whole(bool),
    Fields(super::query::SortSpec),
}

impl PushSort {
    fn parse(v: &Bson) -> Result<PushSort, EngineError> {
        let invalid = || {
            fail(
                ErrorCode::BadValue,
                "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields",
            )
        };
        match v {
            v if is_number(v) => match as_i64_any(v) {
                1 => Ok(PushSort::Whole(true)),
                -1 => Ok(PushSort::Whole(false)),
                _ => Err(invalid()),
            },
            Bson::Document(d) if !d.is_empty() => {
                if d.keys().any(|k| k.is_empty() || k.starts_with('$')) {
                    return Err(invalid());
                }
                Ok(PushSort::Fields(
                    super::query::SortSpec::parse(d).map_err(|_| invalid())?,
                ))
            }
            _ => Err(invalid()),
        }
    }

    fn sort(&self, arr: &mut [Bson]) {
        match self {
            PushSort::Whole(asc) => arr.sort_by(|a, b| {
                let o = compare(a, b);
                if *asc {
                    o
                } else {
                    o.reverse()
                }
            }),
            PushSort::Fields(spec) => {
                let empty = Document::new();
                arr.sort_by(|a, b| {
                    let da = a.as_document().unwrap_or(&empty);
                    let db = b.as_document().unwrap_or(&empty);
                    spec.compare(da, db)
                })
            }
        }
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

/// Refuses an `_id` holding a `$`-prefixed field name at any depth, as mongod does since 5.0
/// allowed such names elsewhere in a document (52, DollarPrefixedFieldName). The names of a
/// DBRef (`$ref`, `$id`, `$db`) are storable.
fn check_id_storage(id: &Bson) -> Result<(), EngineError> {
    fn walk(v: &Bson) -> Option<String> {
        match v {
            Bson::Document(d) => d.iter().find_map(|(k, v)| {
                let dbref = matches!(k.as_str(), "$ref" | "$id" | "$db");
                if k.starts_with('$') && !dbref {
                    Some(k.clone())
                } else {
                    walk(v)
                }
            }),
            Bson::Array(items) => items.iter().find_map(walk),
            _ => None,
        }
    }
    match walk(id) {
        Some(name) => Err(EngineError::new(
            ErrorCode::DollarPrefixedFieldName,
            format!(
                "_id fields may not contain '$'-prefixed fields: {name} is not valid for storage."
            ),
        )),
        None => Ok(()),
    }
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
        Some(v) => {
            check_id_storage(&v)?;
            v
        }
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
    upsert_document_in(filter, upd, &ApplyContext::default())
}

/// [`upsert_document`] with the statement's `arrayFilters` and the request's variables.
pub fn upsert_document_in(
    filter: &Document,
    upd: &Update,
    ctx: &ApplyContext,
) -> Result<Document, EngineError> {
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
        Update::Operators(_) | Update::Pipeline(_) => {
            for (k, v) in crate::engine::matcher::equality_fields(filter) {
                if k.starts_with('$') {
                    continue;
                }
                crate::engine::path::set(&mut seed, &k, v)?;
            }
        }
    }
    upd.apply_in(&mut seed, true, ctx)?;
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

    /// An `_id` with a `$`-prefixed name at any depth is refused (52), other `$`-prefixed
    /// names are stored, and a DBRef is a storable `_id`.
    #[test]
    fn dollar_prefixed_names_in_id_are_refused() {
        for id in [
            doc! {"$a": 1},
            doc! {"x": {"$b": 1}},
            doc! {"x": [{"$c": 1}]},
        ] {
            let e = prepare_insert(doc! {"_id": id.clone(), "v": 1}).unwrap_err();
            assert_eq!(e.code, ErrorCode::DollarPrefixedFieldName, "{id}");
        }
        assert_eq!(
            prepare_insert(doc! {"$a": 1, "_id": 1, "b": {"$c": 2}}).unwrap(),
            doc! {"_id": 1, "$a": 1, "b": {"$c": 2}}
        );
        assert!(prepare_insert(doc! {"_id": {"$ref": "c", "$id": 1, "$db": "d"}}).is_ok());
    }

    /// `$inc`/`$mul` with a decimal operand or field compute in decimal128 (expected values
    /// from Python's `decimal` in the decimal128 context).
    #[test]
    fn inc_and_mul_with_decimals_are_exact() {
        let dec = |s: &str| Bson::Decimal128(s.parse().unwrap());
        let d = doc! {"_id": 1, "p": dec("0.1"), "i": 7, "l": i64::MAX, "x": 0.5};
        let out = apply(
            d,
            doc! {"$inc": {"p": dec("0.2"), "i": dec("1.10"), "l": dec("1"), "new": dec("2.0")},
            "$mul": {"x": dec("3"), "m": dec("1.5")}},
        )
        .unwrap();
        assert_eq!(out.get("p"), Some(&dec("0.3")));
        assert_eq!(out.get("i"), Some(&dec("8.10")));
        assert_eq!(out.get("l"), Some(&dec("9223372036854775808")));
        assert_eq!(out.get("new"), Some(&dec("2.0")));
        assert_eq!(out.get("x"), Some(&dec("1.500000000000000")));
        assert_eq!(out.get("m"), Some(&dec("0.0")));
        let out = apply(
            doc! {"_id": 1, "p": dec("1.10")},
            doc! {"$mul": {"p": dec("2.20")}},
        )
        .unwrap();
        assert_eq!(out.get("p"), Some(&dec("2.4200")));
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
        assert!(Update::parse(&Bson::Document(doc! {"$set": {"a.$": 1}})).is_ok());
        assert!(Update::parse(&Bson::Document(doc! {"$set": {"a.$x": 1}})).is_err());
        assert!(Update::parse(&Bson::Document(doc! {"$rename": {"a.$[]": "b"}})).is_err());
        assert!(
            Update::parse(&Bson::Array(vec![])).is_ok(),
            "an empty pipeline is a no-op"
        );
    }

    /// The positional `$` names the element the query matched in the stored document, even
    /// when the update's other fields change what the query reads (as mongod, which takes the
    /// match before applying anything); a write-path soak found the shard answering 2 where
    /// mongod answers 66.
    #[test]
    fn the_positional_element_is_matched_on_the_stored_document() {
        let apply = |d: Document, q: Document, u: Document| {
            let q = Matcher::parse(&q).unwrap();
            let ctx = ApplyContext {
                query: Some(&q),
                ..ApplyContext::default()
            };
            let mut out = d;
            Update::parse(&Bson::Document(u))
                .unwrap()
                .apply_in(&mut out, false, &ctx)
                .map(|_| out)
        };
        // A field the query names, changed before the positional path is reached.
        assert_eq!(
            apply(
                doc! {"_id": 1, "a": 1, "arr": [1, 2]},
                doc! {"a": 1, "arr": 2},
                doc! {"$set": {"a": 5, "arr.$": 9}},
            )
            .unwrap(),
            doc! {"_id": 1, "a": 5, "arr": [1, 9]}
        );
        // An `_id` the query names, set to another value: the immutable field is the error.
        let e = apply(
            doc! {"_id": 1, "tag": "x", "arr": [1]},
            doc! {"$and": [{"tag": "x", "arr": {"$gte": 1}}, {"_id": {"$in": [1]}}]},
            doc! {"$set": {"_id": 0, "arr.$": 7}},
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::ImmutableField);
        // Still no element when the stored document's array holds no match.
        let e = apply(
            doc! {"_id": 1, "a": 1, "arr": [1]},
            doc! {"a": 1},
            doc! {"$set": {"arr.$": 7}},
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadValue);
    }

    #[test]
    fn array_updates_and_pipelines() {
        let d = doc! {"_id": 1, "a": [1, 5, 9], "b": [{"x": 1}, {"x": 7}]};
        let q = Matcher::parse(&doc! {"a": 5}).unwrap();
        let filters = ArrayFilters::parse(&[Bson::Document(doc! {"e.x": {"$gt": 3}})]).unwrap();
        let ctx = ApplyContext {
            query: Some(&q),
            array_filters: Some(&filters),
            vars: None,
        };
        let u = Update::parse(&Bson::Document(
            doc! {"$set": {"a.$": 50, "b.$[e].y": true}, "$inc": {"b.$[].x": 1}},
        ))
        .unwrap();
        let mut out = d.clone();
        u.apply_in(&mut out, false, &ctx).unwrap();
        assert_eq!(
            out,
            doc! {"_id": 1, "a": [1, 50, 9], "b": [{"x": 2}, {"x": 8, "y": true}]}
        );
        let e =
            ArrayFilters::parse(&[Bson::Document(doc! {"e": 1}), Bson::Document(doc! {"e": 2})])
                .unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedToParse);
        let e = ArrayFilters::parse(&[Bson::Document(doc! {"E": 1})]).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadValue);
        let p = Update::parse(&Bson::Array(vec![Bson::Document(
            doc! {"$set": {"n": {"$size": "$a"}}},
        )]))
        .unwrap();
        let mut out = d.clone();
        p.apply(&mut out, false).unwrap();
        assert_eq!(out.get_i32("n").unwrap(), 3);
        let p = Update::parse(&Bson::Array(vec![Bson::Document(
            doc! {"$set": {"_id": 2}},
        )]))
        .unwrap();
        assert_eq!(
            p.apply(&mut d.clone(), false).unwrap_err().code,
            ErrorCode::ImmutableField
        );
        let e = Update::parse(&Bson::Array(vec![Bson::Document(doc! {"$match": {}})])).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        let out = apply(
            doc! {"l": [{"s": 3}, {"s": 1}]},
            doc! {"$push": {"l": {"$each": [{"s": 2}], "$sort": {"s": 1}, "$slice": -2}}},
        )
        .unwrap();
        assert_eq!(out, doc! {"l": [{"s": 2}, {"s": 3}]});
        let e = apply(
            doc! {"l": []},
            doc! {"$push": {"l": {"$each": [1], "$sort": 2}}},
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadValue);
    }
}
