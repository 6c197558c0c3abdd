//! The query language: a filter document parsed once into a [`Matcher`], then evaluated
//! against documents.
//!
//! Supported: `$eq $ne $gt $gte $lt $lte $in $nin $exists $type $and $or $nor $not $regex
//! $options $elemMatch $size $all $mod $comment`, `$expr` with the aggregation expressions of
//! [`super::aggregate`] (an expression that fails to evaluate matches nothing), implicit equality
//! (including against whole arrays and documents), dotted paths through sub-documents and arrays. Comparisons are
//! bracketed by type as in MongoDB (`{a: {$gt: 5}}` never matches a string). Anything else is a
//! `BadValue` error naming the operator.

use std::borrow::Cow;
use std::sync::Arc;

use bson::{Bson, Document};
use regex::Regex;

use super::collation::Collation;
use super::path::{lookup, Lookup};
use super::EngineError;
use crate::limits::MAX_MATCH_PATH_PARTS;
use crate::value::compare::{canonical_type, compare, values_equal, OrdBson};
use crate::value::error_codes::ErrorCode;

/// A parsed filter.
#[derive(Debug, Clone)]
pub struct Matcher {
    root: Expr,
    /// The variables `$expr` sees (`$$NOW`, the request's `let`).
    vars: super::aggregate::Variables,
    /// The collation strings compare under (from `vars`); the operands in `root` are already
    /// its keys.
    collation: Option<Arc<Collation>>,
}

#[derive(Debug, Clone)]
enum Expr {
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Nor(Vec<Expr>),
    Field(String, Vec<Op>),
    /// `$expr`: an aggregation expression, true when it evaluates truthy.
    Aggregate(Bson),
}

#[derive(Debug, Clone)]
enum Op {
    Eq(Bson),
    Ne(Bson),
    Cmp(CmpOp, Bson),
    In(InList),
    Nin(InList),
    Exists(bool),
    Type(Vec<TypeSel>),
    Regex(Regex),
    Not(Vec<Op>),
    ElemMatch(ElemMatch),
    Size(usize),
    SizeNever,
    All(Vec<AllItem>),
    Mod(i64, i64),
}

/// One item of `$all`, prepared when the filter is parsed: a regular expression is compiled
/// and an `$elemMatch` parsed once, not again for every value tested (a pattern that takes the
/// regex compiler milliseconds, in a `$pull` over thousands of elements, took minutes).
#[derive(Debug, Clone)]
enum AllItem {
    /// `{$elemMatch: …}`: its operators, `None` when they do not parse (it never matches).
    ElemMatch(Option<Vec<Op>>),
    /// A regular expression, `None` when it does not compile (it never matches).
    Regex(Option<Regex>),
    /// Any other value, matched by equality.
    Value(Bson),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CmpOp {
    Gt,
    Gte,
    Lt,
    Lte,
}

/// The list of an `$in` / `$nin`: its values as a set in MongoDB's order (so a list of a
/// million values costs a lookup, not a scan, per candidate) and its regular expressions.
#[derive(Debug, Clone)]
struct InList {
    values: std::collections::BTreeSet<crate::value::compare::OrdBson>,
    regexes: Vec<Regex>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum TypeSel {
    Number,
    Code(i32),
}

#[derive(Debug, Clone)]
enum ElemMatch {
    /// `{$elemMatch: {$gt: 1, $lt: 5}}`: each element as a value.
    Value(Vec<Op>),
    /// `{$elemMatch: {a: 1}}`: each element as a document.
    Doc(Box<Matcher>),
}

fn bad(msg: impl Into<String>) -> EngineError {
    EngineError::new(ErrorCode::BadValue, msg)
}

impl Matcher {
    /// Parses a filter document.
    pub fn parse(filter: &Document) -> Result<Matcher, EngineError> {
        Self::parse_with(filter, &super::aggregate::Variables::new())
    }

    /// Parses a filter whose `$expr` sees these variables (a request's `let`, `$lookup`'s).
    pub fn parse_with(
        filter: &Document,
        vars: &super::aggregate::Variables,
    ) -> Result<Matcher, EngineError> {
        let mut root = parse_doc(filter)?;
        check_expr_references(&root, vars)?;
        let collation = vars.collation().cloned();
        if let Some(c) = &collation {
            collate_expr(&mut root, c);
        }
        Ok(Matcher {
            root,
            vars: vars.clone(),
            collation,
        })
    }

    /// A matcher that accepts everything.
    pub fn all() -> Matcher {
        Matcher {
            root: Expr::And(Vec::new()),
            vars: super::aggregate::Variables::new(),
            collation: None,
        }
    }

    /// Whether `doc` matches.
    pub fn matches(&self, doc: &Document) -> bool {
        eval(&self.root, doc, &self.vars, self.collation.as_deref())
    }

    /// Whether equality with `v` is decided by this matcher's collation rather than by the
    /// value itself (a store cannot serve it from an index of plain values).
    pub fn collates(&self, v: &Bson) -> bool {
        self.collation.is_some() && super::collation::has_string(v)
    }
}

/// Replaces the operands a collation compares (equality, ranges, `$in`/`$nin`, `$all`) by
/// their keys, in `$not` and `$elemMatch` too; regular expressions stay as they are (mongod
/// does not collate them).
fn collate_expr(e: &mut Expr, c: &Arc<Collation>) {
    match e {
        Expr::And(items) | Expr::Or(items) | Expr::Nor(items) => {
            items.iter_mut().for_each(|i| collate_expr(i, c))
        }
        Expr::Field(_, ops) => collate_ops(ops, c),
        Expr::Aggregate(_) => {}
    }
}

fn collate_ops(ops: &mut [Op], c: &Arc<Collation>) {
    for op in ops {
        match op {
            Op::Eq(v) | Op::Ne(v) | Op::Cmp(_, v) => *v = c.key_value(v),
            Op::In(list) | Op::Nin(list) => {
                list.values = std::mem::take(&mut list.values)
                    .into_iter()
                    .map(|v| OrdBson(c.key_value(&v.0)))
                    .collect();
            }
            Op::Not(inner) => collate_ops(inner, c),
            Op::ElemMatch(ElemMatch::Value(inner)) => collate_ops(inner, c),
            Op::ElemMatch(ElemMatch::Doc(m)) => {
                collate_expr(&mut m.root, c);
                m.collation = Some(c.clone());
            }
            Op::All(items) => {
                for item in items.iter_mut() {
                    if let AllItem::Value(v) = item {
                        *v = c.key_value(v);
                    }
                }
            }
            _ => {}
        }
    }
}

/// A document's value as a collation compares it: its key when it holds a string.
fn collated<'a>(v: &'a Bson, c: Option<&Collation>) -> Cow<'a, Bson> {
    match c {
        Some(c) if super::collation::has_string(v) => Cow::Owned(c.key_value(v)),
        _ => Cow::Borrowed(v),
    }
}

/// Every `$expr` of a parsed filter refers only to variables it can see (mongod's 17276 at
/// parse time).
fn check_expr_references(e: &Expr, vars: &super::aggregate::Variables) -> Result<(), EngineError> {
    match e {
        Expr::Aggregate(x) => vars.check_references(x),
        Expr::And(subs) | Expr::Or(subs) | Expr::Nor(subs) => {
            subs.iter().try_for_each(|s| check_expr_references(s, vars))
        }
        _ => Ok(()),
    }
}

fn parse_doc(filter: &Document) -> Result<Expr, EngineError> {
    let mut parts = Vec::new();
    for (key, value) in filter {
        match key.as_str() {
            "$and" | "$or" | "$nor" => {
                let Bson::Array(items) = value else {
                    return Err(bad(format!("{key} must be an array")));
                };
                if items.is_empty() {
                    return Err(bad("$and/$or/$nor must be a nonempty array"));
                }
                let mut subs = Vec::new();
                for item in items {
                    let Bson::Document(d) = item else {
                        return Err(bad("$or/$and/$nor entries need to be full objects"));
                    };
                    subs.push(parse_doc(d)?);
                }
                parts.push(match key.as_str() {
                    "$and" => Expr::And(subs),
                    "$or" => Expr::Or(subs),
                    _ => Expr::Nor(subs),
                });
            }
            "$comment" => {}
            "$expr" => parts.push(Expr::Aggregate(value.clone())),
            k if k.starts_with('$') => {
                return Err(bad(format!("unknown top level operator: {k}")));
            }
            path => {
                if path.split('.').nth(MAX_MATCH_PATH_PARTS).is_some() {
                    return Err(EngineError::new(
                        ErrorCode::MatchPathTooLong,
                        "FieldPath is too long",
                    ));
                }
                parts.push(Expr::Field(path.to_string(), parse_field(value)?))
            }
        }
    }
    Ok(if parts.len() == 1 {
        parts.pop().unwrap_or(Expr::And(Vec::new()))
    } else {
        Expr::And(parts)
    })
}

/// Whether a document is an operator document (`{$gt: 1}`) rather than a literal.
fn is_operator_doc(d: &Document) -> bool {
    d.keys().next().is_some_and(|k| k.starts_with('$'))
}

fn parse_field(value: &Bson) -> Result<Vec<Op>, EngineError> {
    match value {
        Bson::Document(d) if is_operator_doc(d) => parse_ops(d),
        Bson::RegularExpression(r) => Ok(vec![Op::Regex(build_regex(
            r.pattern.as_str(),
            r.options.as_str(),
        )?)]),
        other => Ok(vec![Op::Eq(other.clone())]),
    }
}

fn build_regex(pattern: &str, options: &str) -> Result<Regex, EngineError> {
    let mut b = regex::RegexBuilder::new(pattern);
    for c in options.chars() {
        match c {
            'i' => {
                b.case_insensitive(true);
            }
            'm' => {
                b.multi_line(true);
            }
            's' => {
                b.dot_matches_new_line(true);
            }
            'x' => {
                b.ignore_whitespace(true);
            }
            'u' => {}
            other => {
                return Err(EngineError::new(
                    ErrorCode(51108),
                    format!("invalid flag in regex options: {other}"),
                ))
            }
        }
    }
    b.build().map_err(|e| {
        EngineError::new(
            ErrorCode(51091),
            format!("Regular expression is invalid: {e}"),
        )
    })
}

fn parse_in_list(op: &str, v: &Bson) -> Result<InList, EngineError> {
    let Bson::Array(items) = v else {
        return Err(bad(format!("{op} needs an array")));
    };
    let mut list = InList {
        values: Default::default(),
        regexes: Vec::new(),
    };
    for item in items {
        match item {
            Bson::RegularExpression(r) => list
                .regexes
                .push(build_regex(r.pattern.as_str(), r.options.as_str())?),
            Bson::Document(d) if is_operator_doc(d) => {
                return Err(bad(format!("cannot nest $ under {op}")))
            }
            other => {
                list.values
                    .insert(crate::value::compare::OrdBson(other.clone()));
            }
        }
    }
    Ok(list)
}

fn type_selector(v: &Bson) -> Result<TypeSel, EngineError> {
    let code = match v {
        Bson::String(s) => match s.as_str() {
            "number" => return Ok(TypeSel::Number),
            "double" => 1,
            "string" => 2,
            "object" => 3,
            "array" => 4,
            "binData" => 5,
            "undefined" => 6,
            "objectId" => 7,
            "bool" => 8,
            "date" => 9,
            "null" => 10,
            "regex" => 11,
            "dbPointer" => 12,
            "javascript" => 13,
            "symbol" => 14,
            "javascriptWithScope" => 15,
            "int" => 16,
            "timestamp" => 17,
            "long" => 18,
            "decimal" => 19,
            "minKey" => -1,
            "maxKey" => 127,
            other => return Err(bad(format!("Unknown type name alias: {other}"))),
        },
        Bson::Int32(i) => *i,
        Bson::Int64(i) => *i as i32,
        Bson::Double(d) if d.fract() == 0.0 => *d as i32,
        _ => return Err(bad("type must be represented as a number or a string")),
    };
    Ok(TypeSel::Code(code))
}

fn bson_type_code(v: &Bson) -> i32 {
    match v {
        Bson::Double(_) => 1,
        Bson::String(_) => 2,
        Bson::Document(_) => 3,
        Bson::Array(_) => 4,
        Bson::Binary(_) => 5,
        Bson::Undefined => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Null => 10,
        Bson::RegularExpression(_) => 11,
        Bson::DbPointer(_) => 12,
        Bson::JavaScriptCode(_) => 13,
        Bson::Symbol(_) => 14,
        Bson::JavaScriptCodeWithScope(_) => 15,
        Bson::Int32(_) => 16,
        Bson::Timestamp(_) => 17,
        Bson::Int64(_) => 18,
        Bson::Decimal128(_) => 19,
        Bson::MinKey => -1,
        Bson::MaxKey => 127,
    }
}

fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(*i as i64),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) if d.is_finite() => Some(*d as i64),
        _ => None,
    }
}

fn parse_ops(d: &Document) -> Result<Vec<Op>, EngineError> {
    let mut ops = Vec::new();
    let options = match d.get("$options") {
        Some(Bson::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("$options has to be a string")),
        None => None,
    };
    for (op, v) in d {
        ops.push(match op.as_str() {
            "$eq" => Op::Eq(v.clone()),
            "$ne" => Op::Ne(v.clone()),
            "$gt" => Op::Cmp(CmpOp::Gt, v.clone()),
            "$gte" => Op::Cmp(CmpOp::Gte, v.clone()),
            "$lt" => Op::Cmp(CmpOp::Lt, v.clone()),
            "$lte" => Op::Cmp(CmpOp::Lte, v.clone()),
            "$in" => Op::In(parse_in_list("$in", v)?),
            "$nin" => Op::Nin(parse_in_list("$nin", v)?),
            "$exists" => Op::Exists(crate::value::field::truthy(v)),
            "$type" => match v {
                Bson::Array(items) => {
                    Op::Type(items.iter().map(type_selector).collect::<Result<_, _>>()?)
                }
                other => Op::Type(vec![type_selector(other)?]),
            },
            "$regex" => match v {
                Bson::String(p) => Op::Regex(build_regex(p, options.as_deref().unwrap_or(""))?),
                Bson::RegularExpression(r) => {
                    let opts = options.clone().unwrap_or_else(|| r.options.to_string());
                    Op::Regex(build_regex(r.pattern.as_str(), &opts)?)
                }
                _ => return Err(bad("$regex has to be a string")),
            },
            "$options" => {
                if !d.contains_key("$regex") {
                    return Err(bad("$options needs a $regex"));
                }
                continue;
            }
            "$not" => match v {
                Bson::Document(inner) if is_operator_doc(inner) => Op::Not(parse_ops(inner)?),
                Bson::RegularExpression(r) => Op::Not(vec![Op::Regex(build_regex(
                    r.pattern.as_str(),
                    r.options.as_str(),
                )?)]),
                _ => return Err(bad("$not needs a regex or a document")),
            },
            "$elemMatch" => match v {
                Bson::Document(inner) => {
                    let value_form = inner.keys().next().is_some_and(|k| {
                        k.starts_with('$') && !matches!(k.as_str(), "$and" | "$or" | "$nor")
                    });
                    if value_form {
                        Op::ElemMatch(ElemMatch::Value(parse_ops(inner)?))
                    } else {
                        Op::ElemMatch(ElemMatch::Doc(Box::new(Matcher::parse(inner)?)))
                    }
                }
                _ => return Err(bad("$elemMatch needs an Object")),
            },
            "$size" => match v {
                Bson::Double(d) if d.fract() != 0.0 => Op::SizeNever,
                other => match as_i64(other) {
                    Some(n) if n >= 0 => Op::Size(n as usize),
                    Some(_) => Op::SizeNever,
                    None => return Err(bad("$size needs a number")),
                },
            },
            "$all" => match v {
                Bson::Array(items) => Op::All(
                    items
                        .iter()
                        .map(|item| match item {
                            Bson::Document(d) if d.contains_key("$elemMatch") => {
                                AllItem::ElemMatch(parse_ops(d).ok())
                            }
                            Bson::RegularExpression(r) => AllItem::Regex(
                                build_regex(r.pattern.as_str(), r.options.as_str()).ok(),
                            ),
                            other => AllItem::Value(other.clone()),
                        })
                        .collect(),
                ),
                _ => return Err(bad("$all needs an array")),
            },
            "$mod" => match v {
                Bson::Array(items) if items.len() == 2 => {
                    let (Some(div), Some(rem)) = (as_i64(&items[0]), as_i64(&items[1])) else {
                        return Err(bad("malformed mod, divisor and remainder must be numbers"));
                    };
                    if div == 0 {
                        return Err(bad("divisor cannot be 0"));
                    }
                    Op::Mod(div, rem)
                }
                _ => {
                    return Err(bad(
                        "malformed mod, needs to be an array of exactly two numbers",
                    ))
                }
            },
            "$comment" => continue,
            other => return Err(bad(format!("unknown operator: {other}"))),
        });
    }
    Ok(ops)
}

fn eval(
    e: &Expr,
    doc: &Document,
    vars: &super::aggregate::Variables,
    c: Option<&Collation>,
) -> bool {
    match e {
        Expr::And(items) => items.iter().all(|i| eval(i, doc, vars, c)),
        Expr::Or(items) => items.iter().any(|i| eval(i, doc, vars, c)),
        Expr::Nor(items) => !items.iter().any(|i| eval(i, doc, vars, c)),
        Expr::Field(path, ops) => {
            let l = lookup(doc, path);
            ops.iter().all(|op| eval_op(op, &l, c))
        }
        Expr::Aggregate(e) => super::aggregate::eval_with(e, doc, vars)
            .ok()
            .flatten()
            .is_some_and(|v| crate::value::field::truthy(&v)),
    }
}

fn eq_matches(target: &Bson, l: &Lookup, c: Option<&Collation>) -> bool {
    if matches!(target, Bson::Null) && (l.missing || l.values.is_empty()) {
        return true;
    }
    l.candidates()
        .into_iter()
        .any(|v| values_equal(&collated(v, c), target))
}

fn cmp_matches(op: CmpOp, target: &Bson, l: &Lookup, c: Option<&Collation>) -> bool {
    if matches!(target, Bson::Null)
        && matches!(op, CmpOp::Gte | CmpOp::Lte)
        && (l.missing || l.values.is_empty())
    {
        return true;
    }
    let check = |v: &Bson| {
        let bracket = canonical_type(v) == canonical_type(target)
            || matches!(target, Bson::MinKey | Bson::MaxKey);
        if !bracket {
            return false;
        }
        let o = compare(&collated(v, c), target);
        match op {
            CmpOp::Gt => o.is_gt(),
            CmpOp::Gte => o.is_ge(),
            CmpOp::Lt => o.is_lt(),
            CmpOp::Lte => o.is_le(),
        }
    };
    // Whole arrays compare too (`{a: {$gt: [1]}}`), as do their elements.
    l.candidates().into_iter().any(check)
}

fn regex_matches(re: &Regex, v: &Bson) -> bool {
    match v {
        Bson::String(s) | Bson::Symbol(s) => re.is_match(s),
        Bson::RegularExpression(r) => re.as_str() == r.pattern.as_str(),
        _ => false,
    }
}

fn in_matches(list: &InList, l: &Lookup, c: Option<&Collation>) -> bool {
    if (l.missing || l.values.is_empty())
        && list
            .values
            .contains(&crate::value::compare::OrdBson(Bson::Null))
    {
        return true;
    }
    let hit = l
        .candidates()
        .into_iter()
        .any(|v| list.values.contains(&OrdBson(collated(v, c).into_owned())));
    hit || list
        .regexes
        .iter()
        .any(|re| l.expanded().into_iter().any(|v| regex_matches(re, v)))
}

fn eval_value_ops(ops: &[Op], v: &Bson, c: Option<&Collation>) -> bool {
    let l = Lookup {
        values: vec![v],
        missing: false,
    };
    ops.iter().all(|op| eval_op(op, &l, c))
}

fn eval_op(op: &Op, l: &Lookup, c: Option<&Collation>) -> bool {
    match op {
        Op::Eq(t) => eq_matches(t, l, c),
        Op::Ne(t) => !eq_matches(t, l, c),
        Op::Cmp(cmp, t) => cmp_matches(*cmp, t, l, c),
        Op::In(items) => in_matches(items, l, c),
        Op::Nin(items) => !in_matches(items, l, c),
        Op::Exists(want) => l.values.is_empty() != *want,
        Op::Type(sels) => l.candidates().into_iter().any(|v| {
            sels.iter().any(|s| match s {
                TypeSel::Number => canonical_type(v) == 10,
                TypeSel::Code(c) => bson_type_code(v) == *c,
            })
        }),
        Op::Regex(re) => l.expanded().into_iter().any(|v| regex_matches(re, v)),
        Op::Not(ops) => !ops.iter().all(|o| eval_op(o, l, c)),
        Op::ElemMatch(em) => l.values.iter().any(|v| match v {
            Bson::Array(items) => items.iter().any(|item| match em {
                ElemMatch::Value(ops) => eval_value_ops(ops, item, c),
                ElemMatch::Doc(m) => match item {
                    Bson::Document(d) => m.matches(d),
                    _ => false,
                },
            }),
            _ => false,
        }),
        Op::Size(n) => l
            .values
            .iter()
            .any(|v| matches!(v, Bson::Array(items) if items.len() == *n)),
        Op::SizeNever => false,
        Op::All(items) => {
            !items.is_empty()
                && items.iter().all(|item| match item {
                    AllItem::ElemMatch(Some(ops)) => ops.iter().all(|o| eval_op(o, l, None)),
                    AllItem::Regex(Some(re)) => {
                        l.expanded().into_iter().any(|v| regex_matches(re, v))
                    }
                    AllItem::ElemMatch(None) | AllItem::Regex(None) => false,
                    AllItem::Value(v) => eq_matches(v, l, c),
                })
        }
        Op::Mod(div, rem) => l.expanded().into_iter().any(|v| {
            as_i64(v).is_some_and(|n| n.wrapping_rem(*div) == *rem) && canonical_type(v) == 10
        }),
    }
}

/// The equality fields of a filter, as an upsert seeds its new document from them: top-level
/// `{k: v}` and `{k: {$eq: v}}` and the same inside a top-level `$and`.
pub fn equality_fields(filter: &Document) -> Vec<(String, Bson)> {
    let mut out = Vec::new();
    for (k, v) in filter {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for item in items {
                    if let Bson::Document(d) = item {
                        out.extend(equality_fields(d));
                    }
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Bson::Document(d) if is_operator_doc(d) => {
                if let Some(eq) = d.get("$eq") {
                    out.push((k.clone(), eq.clone()));
                }
            }
            Bson::RegularExpression(_) => {}
            other => out.push((k.clone(), other.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// Under a collation, equality, ranges, `$in`/`$nin`, `$all`, `$not` and `$elemMatch`
    /// compare strings by it; regular expressions and non-strings do not change.
    #[test]
    fn collation_decides_string_comparisons() {
        let vars = super::super::aggregate::Variables::new()
            .with_collation_option(Some(&Bson::Document(doc! {"locale": "en", "strength": 2})))
            .unwrap();
        let m = |f: Document| Matcher::parse_with(&f, &vars).unwrap();
        let d = doc! {"x": "ping", "tags": ["Red", "blue"], "sub": [{"k": "ABC"}], "n": 5};
        assert!(m(doc! {"x": "PING"}).matches(&d));
        assert!(!Matcher::parse(&doc! {"x": "PING"}).unwrap().matches(&d));
        assert!(m(doc! {"x": {"$in": ["PONG", "PiNg"]}}).matches(&d));
        assert!(!m(doc! {"x": {"$nin": ["PING"]}}).matches(&d));
        assert!(m(doc! {"x": {"$gt": "PINE", "$lt": "PINH"}}).matches(&d));
        assert!(m(doc! {"tags": {"$all": ["RED", "BLUE"]}}).matches(&d));
        assert!(!m(doc! {"x": {"$not": {"$eq": "Ping"}}}).matches(&d));
        assert!(m(doc! {"sub": {"$elemMatch": {"k": "abc"}}}).matches(&d));
        assert!(m(doc! {"tags": {"$elemMatch": {"$eq": "RED"}}}).matches(&d));
        assert!(!m(doc! {"x": {"$regex": "^P"}}).matches(&d));
        assert!(m(doc! {"n": 5}).matches(&d));
        assert!(m(doc! {"x": "PING"}).collates(&Bson::String("a".into())));
        assert!(!m(doc! {"x": "PING"}).collates(&Bson::Int32(1)));
        assert!(!Matcher::parse(&doc! {})
            .unwrap()
            .collates(&Bson::String("a".into())));
    }

    #[test]
    fn undefined_variables_in_expr_fail_at_parse() {
        let code = |f: Document| Matcher::parse(&f).err().map(|e| e.code.0);
        assert_eq!(
            code(doc! {"$expr": {"$eq": ["$_id", "$$id2"]}}),
            Some(17276),
            "fails before any document is seen"
        );
        assert_eq!(
            code(doc! {"$or": [{"a": 1}, {"$expr": {"$eq": ["$a", "$$x.y"]}}]}),
            Some(17276)
        );
        assert_eq!(code(doc! {"$expr": {"$eq": ["$a", "$$ROOT.a"]}}), None);
        assert_eq!(
            code(doc! {"$expr": {"$let": {"vars": {"x": 1}, "in": {"$eq": ["$a", "$$x"]}}}}),
            None
        );
        assert_eq!(
            code(
                doc! {"$expr": {"$anyElementTrue": {"$map": {"input": "$a", "as": "e", "in": {"$gt": ["$$e", 1]}}}}}
            ),
            None
        );
        assert_eq!(
            code(doc! {"$expr": {"$eq": [{"$literal": "$$notAVariable"}, "$a"]}}),
            None
        );
        let vars = crate::engine::aggregate::Variables::new()
            .with_let(&doc! {"id2": 1}, &Document::new())
            .unwrap();
        assert!(Matcher::parse_with(&doc! {"$expr": {"$eq": ["$_id", "$$id2"]}}, &vars).is_ok());
    }

    fn m(filter: Document) -> Matcher {
        Matcher::parse(&filter).unwrap()
    }

    #[test]
    fn equality_and_arrays() {
        let d = doc! {"a": [1, 2, 3], "b": {"c": "x"}, "n": 5, "arr": [{"k": 1}, {"k": 2}]};
        assert!(m(doc! {"a": 2}).matches(&d));
        assert!(m(doc! {"a": [1, 2, 3]}).matches(&d));
        assert!(!m(doc! {"a": [1, 2]}).matches(&d));
        assert!(m(doc! {"b.c": "x"}).matches(&d));
        assert!(m(doc! {"b": {"c": "x"}}).matches(&d));
        assert!(m(doc! {"n": 5.0}).matches(&d));
        assert!(m(doc! {"arr.k": 2}).matches(&d));
        assert!(m(doc! {"missing": Bson::Null}).matches(&d));
        assert!(!m(doc! {"n": Bson::Null}).matches(&d));
    }

    #[test]
    fn comparisons_are_type_bracketed() {
        let d = doc! {"n": 5, "s": "abc", "a": [1, 10]};
        assert!(m(doc! {"n": {"$gt": 4}}).matches(&d));
        assert!(!m(doc! {"n": {"$gt": "4"}}).matches(&d));
        assert!(m(doc! {"s": {"$gte": "abc", "$lt": "abd"}}).matches(&d));
        assert!(
            m(doc! {"a": {"$gt": 5, "$lt": 2}}).matches(&d),
            "different elements may satisfy each bound"
        );
        assert!(!m(doc! {"a": {"$elemMatch": {"$gt": 5, "$lt": 9}}}).matches(&d));
        assert!(m(doc! {"a": {"$elemMatch": {"$gt": 5, "$lt": 11}}}).matches(&d));
    }

    #[test]
    fn logical_and_set_operators() {
        let d = doc! {"a": 1, "t": ["x", "y"], "docs": [{"p": 1, "q": 2}]};
        assert!(m(doc! {"$or": [{"a": 2}, {"a": 1}]}).matches(&d));
        assert!(!m(doc! {"$nor": [{"a": 1}]}).matches(&d));
        assert!(m(doc! {"$and": [{"a": 1}, {"t": "x"}]}).matches(&d));
        assert!(m(doc! {"a": {"$in": [5, 1]}}).matches(&d));
        assert!(m(doc! {"a": {"$nin": [5, 6]}}).matches(&d));
        assert!(m(doc! {"t": {"$all": ["y", "x"]}}).matches(&d));
        assert!(!m(doc! {"t": {"$all": ["y", "z"]}}).matches(&d));
        assert!(m(doc! {"t": {"$size": 2}}).matches(&d));
        assert!(m(doc! {"docs": {"$elemMatch": {"p": 1, "q": 2}}}).matches(&d));
        assert!(!m(doc! {"docs": {"$elemMatch": {"p": 1, "q": 3}}}).matches(&d));
        assert!(m(doc! {"a": {"$exists": true}, "zz": {"$exists": false}}).matches(&d));
        assert!(m(doc! {"a": {"$type": "number"}}).matches(&d));
        assert!(m(doc! {"t": {"$type": "array"}}).matches(&d));
        assert!(m(doc! {"a": {"$not": {"$gt": 3}}}).matches(&d));
        assert!(m(doc! {"a": {"$ne": 2}}).matches(&d));
    }

    #[test]
    fn regexes() {
        let d = doc! {"s": "Hello World"};
        assert!(m(doc! {"s": {"$regex": "^hello", "$options": "i"}}).matches(&d));
        assert!(!m(doc! {"s": {"$regex": "^hello"}}).matches(&d));
        assert!(m(doc! {"s": bson::Regex { pattern: "World$".try_into().unwrap(), options: "".try_into().unwrap() }}).matches(&d));
        assert!(Matcher::parse(&doc! {"s": {"$regex": "("}}).is_err());
    }

    #[test]
    fn errors_name_the_operator() {
        let e = Matcher::parse(&doc! {"a": {"$frob": 1}}).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadValue);
        assert!(e.message.contains("$frob"));
        assert!(Matcher::parse(&doc! {"$or": []}).is_err());
        assert!(Matcher::parse(&doc! {"$where": "x"}).is_err());
        assert!(Matcher::parse(&doc! {"a": {"$in": 5}}).is_err());
        let long = vec!["a"; 181].join(".");
        let e = Matcher::parse(&doc! {long: 1}).unwrap_err();
        assert_eq!(
            (e.code.0, e.message.as_str()),
            (5729100, "FieldPath is too long")
        );
        assert!(Matcher::parse(&doc! {vec!["a"; 180].join("."): 1}).is_ok());
    }

    #[test]
    fn in_lists_match_through_a_set() {
        let list: Vec<i64> = (0..100_000).collect();
        let m = m(doc! {"a": {"$in": list}});
        assert!(m.matches(&doc! {"a": 99_999.0}));
        assert!(m.matches(&doc! {"a": [-1, 5]}));
        assert!(!m.matches(&doc! {"a": 100_000}));
        let with_null = Matcher::parse(&doc! {"a": {"$in": [Bson::Null]}}).unwrap();
        assert!(with_null.matches(&doc! {"b": 1}));
        let with_regex = Matcher::parse(&doc! {"a": {"$nin": [bson::Regex { pattern: "^x".try_into().unwrap(), options: "".try_into().unwrap() }]}}).unwrap();
        assert!(!with_regex.matches(&doc! {"a": "xy"}));
    }

    #[test]
    fn upsert_seed_fields() {
        let f = doc! {"_id": 1, "a": {"$eq": 2}, "b": {"$gt": 3}, "$and": [{"c": 4}]};
        let fields = equality_fields(&f);
        let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["_id", "a", "c"]);
    }
}
