//! Aggregation pipelines on the embedded shard: `$match $project $addFields/$set $unset $sort
//! $skip $limit $group $count $unwind`, with the expression operators they commonly use.
//! Unknown stages and expressions are errors naming them.

use std::collections::HashMap;

use bson::{Bson, Document};

use super::matcher::Matcher;
use super::path;
use super::query::{Projection, SortSpec};
use super::EngineError;
use crate::error_codes::ErrorCode;
use crate::order::{compare, values_equal, OrdBson};

fn err(code: i32, msg: impl Into<String>) -> EngineError {
    EngineError::new(ErrorCode(code), msg)
}

/// Runs `pipeline` over `docs`.
pub fn run(pipeline: &[Bson], mut docs: Vec<Document>) -> Result<Vec<Document>, EngineError> {
    for stage in pipeline {
        let Bson::Document(stage) = stage else {
            return Err(err(
                14,
                "Each element of the 'pipeline' array must be an object",
            ));
        };
        if stage.len() != 1 {
            return Err(err(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            ));
        }
        let Some((name, spec)) = stage.iter().next() else {
            return Err(err(40323, "empty stage"));
        };
        docs = match name.as_str() {
            "$match" => {
                let Bson::Document(f) = spec else {
                    return Err(err(
                        15959,
                        "the match filter must be an expression in an object",
                    ));
                };
                let m = Matcher::parse(f)?;
                docs.into_iter().filter(|d| m.matches(d)).collect()
            }
            "$project" => project(spec, docs)?,
            "$addFields" | "$set" => {
                let Bson::Document(fields) = spec else {
                    return Err(err(
                        40272,
                        format!("{name} specification stage must be an object"),
                    ));
                };
                docs.into_iter()
                    .map(|mut d| {
                        for (k, e) in fields {
                            let v = eval(e, &d)?;
                            match v {
                                Some(v) => path::set(&mut d, k, v)?,
                                None => {
                                    path::unset(&mut d, k);
                                }
                            }
                        }
                        Ok(d)
                    })
                    .collect::<Result<_, EngineError>>()?
            }
            "$unset" => {
                let fields: Vec<String> = match spec {
                    Bson::String(s) => vec![s.clone()],
                    Bson::Array(items) => items
                        .iter()
                        .map(|i| match i {
                            Bson::String(s) => Ok(s.clone()),
                            _ => Err(err(31120, "$unset specification must be a string or an array containing only string values")),
                        })
                        .collect::<Result<_, _>>()?,
                    _ => return Err(err(31002, "$unset specification must be a string or an array")),
                };
                docs.into_iter()
                    .map(|mut d| {
                        for f in &fields {
                            path::unset(&mut d, f);
                        }
                        d
                    })
                    .collect()
            }
            "$sort" => {
                let Bson::Document(s) = spec else {
                    return Err(err(15973, "the $sort key specification must be an object"));
                };
                let s = SortSpec::parse(s)?;
                s.sort(&mut docs);
                docs
            }
            "$skip" => {
                let n = non_negative(spec, "$skip")?;
                docs.into_iter().skip(n).collect()
            }
            "$limit" => {
                let n = non_negative(spec, "$limit")?;
                if n == 0 {
                    return Err(err(15958, "the limit must be positive"));
                }
                docs.into_iter().take(n).collect()
            }
            "$count" => {
                let Bson::String(field) = spec else {
                    return Err(err(40156, "the count field must be a non-empty string"));
                };
                if field.is_empty() || field.starts_with('$') || field.contains('.') {
                    return Err(err(
                        40158,
                        "the count field must be a non-empty string without $ or .",
                    ));
                }
                if docs.is_empty() {
                    Vec::new()
                } else {
                    let mut d = Document::new();
                    let n = docs.len();
                    d.insert(
                        field.clone(),
                        i32::try_from(n)
                            .map(Bson::Int32)
                            .unwrap_or(Bson::Int64(n as i64)),
                    );
                    vec![d]
                }
            }
            "$group" => group(spec, docs)?,
            "$documents" => {
                let Bson::Array(items) = spec else {
                    return Err(err(5858203, "an array is expected for $documents"));
                };
                items
                    .iter()
                    .map(|i| match i {
                        Bson::Document(d) => Ok(d.clone()),
                        _ => Err(err(
                            5858203,
                            "$documents must evaluate to an array of objects",
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            "$unwind" => unwind(spec, docs)?,
            other => {
                return Err(err(
                    40324,
                    format!("Unrecognized pipeline stage name: '{other}'"),
                ))
            }
        };
    }
    Ok(docs)
}

fn non_negative(v: &Bson, stage: &str) -> Result<usize, EngineError> {
    match v {
        Bson::Int32(i) if *i >= 0 => Ok(*i as usize),
        Bson::Int64(i) if *i >= 0 => Ok(*i as usize),
        Bson::Double(d) if *d >= 0.0 && d.fract() == 0.0 => Ok(*d as usize),
        _ => Err(err(
            15956,
            format!("invalid argument to {stage} stage: must be a non-negative integer"),
        )),
    }
}

fn project(spec: &Bson, docs: Vec<Document>) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(15969, "$project specification must be an object"));
    };
    let simple = spec.values().all(|v| {
        matches!(
            v,
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Boolean(_)
        )
    });
    if simple {
        let Some(p) = Projection::parse(spec)? else {
            return Err(err(
                51272,
                "projection specification must have at least one field",
            ));
        };
        return Ok(docs.iter().map(|d| p.apply(d)).collect());
    }
    // Inclusion with computed fields.
    let include_id = !matches!(
        spec.get("_id"),
        Some(Bson::Int32(0) | Bson::Boolean(false) | Bson::Int64(0))
    );
    docs.iter()
        .map(|d| {
            let mut out = Document::new();
            if include_id {
                if let Some(id) = d.get("_id") {
                    out.insert("_id", id.clone());
                }
            }
            for (k, v) in spec {
                if k == "_id" && !matches!(v, Bson::Document(_) | Bson::String(_)) {
                    continue;
                }
                match v {
                    Bson::Int32(0) | Bson::Int64(0) | Bson::Boolean(false) => {
                        return Err(err(31254, format!("Invalid $project :: caused by :: Cannot do exclusion on field {k} in inclusion projection")));
                    }
                    Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Boolean(true) => {
                        if let Some(val) = path::get(d, k) {
                            path::set(&mut out, k, val.clone())?;
                        }
                    }
                    e => {
                        if let Some(val) = eval(e, d)? {
                            path::set(&mut out, k, val)?;
                        }
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

fn unwind(spec: &Bson, docs: Vec<Document>) -> Result<Vec<Document>, EngineError> {
    let (field, preserve, index_field) = match spec {
        Bson::String(s) => (s.clone(), false, None),
        Bson::Document(d) => (
            d.get_str("path")
                .map(|s| s.to_string())
                .map_err(|_| err(28812, "no path specified to $unwind stage"))?,
            d.get_bool("preserveNullAndEmptyArrays").unwrap_or(false),
            d.get_str("includeArrayIndex").ok().map(|s| s.to_string()),
        ),
        _ => {
            return Err(err(
                15981,
                "expected either a string or an object as specification for $unwind stage",
            ))
        }
    };
    let Some(field) = field.strip_prefix('$').map(|s| s.to_string()) else {
        return Err(err(
            28818,
            "path option to $unwind stage should be prefixed with a '$'",
        ));
    };
    let mut out = Vec::new();
    for d in docs {
        match path::get(&d, &field).cloned() {
            Some(Bson::Array(items)) if !items.is_empty() => {
                for (i, item) in items.into_iter().enumerate() {
                    let mut nd = d.clone();
                    path::set(&mut nd, &field, item)?;
                    if let Some(ix) = &index_field {
                        nd.insert(ix.clone(), i as i64);
                    }
                    out.push(nd);
                }
            }
            Some(Bson::Array(_)) | None | Some(Bson::Null) => {
                if preserve {
                    let mut nd = d.clone();
                    if let Some(ix) = &index_field {
                        nd.insert(ix.clone(), Bson::Null);
                    }
                    out.push(nd);
                }
            }
            Some(_) => {
                let mut nd = d.clone();
                if let Some(ix) = &index_field {
                    nd.insert(ix.clone(), Bson::Null);
                }
                out.push(nd);
            }
        }
    }
    Ok(out)
}

#[derive(Debug, Clone)]
enum Acc {
    Sum(Bson),
    Avg(f64, u64),
    Min(Option<Bson>),
    Max(Option<Bson>),
    First(Option<Bson>),
    Last(Bson),
    Push(Vec<Bson>),
    AddToSet(Vec<Bson>),
}

fn group(spec: &Bson, docs: Vec<Document>) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            15947,
            "a group's fields must be specified in an object",
        ));
    };
    let Some(id_expr) = spec.get("_id") else {
        return Err(err(15955, "a group specification must include an _id"));
    };
    let mut accs: Vec<(String, String, Bson)> = Vec::new();
    for (k, v) in spec {
        if k == "_id" {
            continue;
        }
        let Bson::Document(a) = v else {
            return Err(err(
                40234,
                format!("The field '{k}' must be an accumulator object"),
            ));
        };
        if a.len() != 1 {
            return Err(err(
                40238,
                format!("The field '{k}' must specify one accumulator"),
            ));
        }
        let Some((op, arg)) = a.iter().next() else {
            continue;
        };
        if !matches!(
            op.as_str(),
            "$sum"
                | "$avg"
                | "$min"
                | "$max"
                | "$first"
                | "$last"
                | "$push"
                | "$addToSet"
                | "$count"
        ) {
            return Err(err(15952, format!("unknown group operator '{op}'")));
        }
        accs.push((k.clone(), op.clone(), arg.clone()));
    }
    let mut order: Vec<OrdBson> = Vec::new();
    let mut groups: HashMap<usize, Vec<Acc>> = HashMap::new();
    let mut index: std::collections::BTreeMap<OrdBson, usize> = std::collections::BTreeMap::new();
    for d in &docs {
        let key = OrdBson(eval(id_expr, d)?.unwrap_or(Bson::Null));
        let gi = match index.get(&key) {
            Some(i) => *i,
            None => {
                let i = order.len();
                order.push(key.clone());
                index.insert(key, i);
                groups.insert(
                    i,
                    accs.iter()
                        .map(|(_, op, _)| match op.as_str() {
                            "$sum" | "$count" => Acc::Sum(Bson::Int32(0)),
                            "$avg" => Acc::Avg(0.0, 0),
                            "$min" => Acc::Min(None),
                            "$max" => Acc::Max(None),
                            "$first" => Acc::First(None),
                            "$last" => Acc::Last(Bson::Null),
                            "$push" => Acc::Push(Vec::new()),
                            _ => Acc::AddToSet(Vec::new()),
                        })
                        .collect(),
                );
                i
            }
        };
        let Some(state) = groups.get_mut(&gi) else {
            continue;
        };
        for (slot, (_, op, arg)) in state.iter_mut().zip(&accs) {
            let v = if op == "$count" {
                Some(Bson::Int32(1))
            } else {
                eval(arg, d)?
            };
            match slot {
                Acc::Sum(total) => {
                    if let Some(v) = v.filter(is_number) {
                        *total = add_numbers(total, &v);
                    }
                }
                Acc::Avg(sum, n) => {
                    if let Some(v) = v.filter(is_number) {
                        *sum += to_f64(&v);
                        *n += 1;
                    }
                }
                Acc::Min(cur) => {
                    if let Some(v) = v.filter(|v| !matches!(v, Bson::Null | Bson::Undefined)) {
                        if cur.as_ref().is_none_or(|c| compare(&v, c).is_lt()) {
                            *cur = Some(v);
                        }
                    }
                }
                Acc::Max(cur) => {
                    if let Some(v) = v.filter(|v| !matches!(v, Bson::Null | Bson::Undefined)) {
                        if cur.as_ref().is_none_or(|c| compare(&v, c).is_gt()) {
                            *cur = Some(v);
                        }
                    }
                }
                Acc::First(cur) => {
                    if cur.is_none() {
                        *cur = Some(v.unwrap_or(Bson::Null));
                    }
                }
                Acc::Last(cur) => *cur = v.unwrap_or(Bson::Null),
                Acc::Push(items) => {
                    if let Some(v) = v {
                        items.push(v);
                    }
                }
                Acc::AddToSet(items) => {
                    if let Some(v) = v {
                        if !items.iter().any(|x| values_equal(x, &v)) {
                            items.push(v);
                        }
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for (i, key) in order.into_iter().enumerate() {
        let mut d = Document::new();
        d.insert("_id", key.0);
        if let Some(state) = groups.remove(&i) {
            for ((name, _, _), acc) in accs.iter().zip(state) {
                d.insert(
                    name.clone(),
                    match acc {
                        Acc::Sum(v) => v,
                        Acc::Avg(_, 0) => Bson::Null,
                        Acc::Avg(s, n) => Bson::Double(s / n as f64),
                        Acc::Min(v) | Acc::Max(v) | Acc::First(v) => v.unwrap_or(Bson::Null),
                        Acc::Last(v) => v,
                        Acc::Push(items) | Acc::AddToSet(items) => Bson::Array(items),
                    },
                );
            }
        }
        out.push(d);
    }
    Ok(out)
}

fn is_number(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
    )
}

fn to_f64(v: &Bson) -> f64 {
    match v {
        Bson::Int32(i) => *i as f64,
        Bson::Int64(i) => *i as f64,
        Bson::Double(d) => *d,
        Bson::Decimal128(d) => crate::order::decimal_to_f64(d),
        _ => 0.0,
    }
}

fn add_numbers(a: &Bson, b: &Bson) -> Bson {
    match (a, b) {
        (Bson::Int32(x), Bson::Int32(y)) => x
            .checked_add(*y)
            .map(Bson::Int32)
            .unwrap_or(Bson::Int64(*x as i64 + *y as i64)),
        (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
            let (x, y) = (to_f64(a) as i64, to_f64(b) as i64);
            x.checked_add(y)
                .map(Bson::Int64)
                .unwrap_or(Bson::Double(x as f64 + y as f64))
        }
        _ => Bson::Double(to_f64(a) + to_f64(b)),
    }
}

/// Evaluates an aggregation expression against `root`; `None` is "missing".
pub fn eval(e: &Bson, root: &Document) -> Result<Option<Bson>, EngineError> {
    match e {
        Bson::String(s) if s == "$$ROOT" || s == "$$CURRENT" => {
            Ok(Some(Bson::Document(root.clone())))
        }
        Bson::String(s) if s.starts_with("$$") => Err(err(
            17276,
            format!("Use of undefined variable: {}", &s[2..]),
        )),
        Bson::String(s) if s.starts_with('$') => {
            let p = &s[1..];
            let l = path::lookup(root, p);
            let through_array = p.contains('.') && {
                let first = p.split('.').next().unwrap_or("");
                matches!(root.get(first), Some(Bson::Array(_)))
            };
            if through_array {
                Ok(Some(Bson::Array(l.values.into_iter().cloned().collect())))
            } else {
                Ok(l.values.first().map(|v| (*v).clone()))
            }
        }
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            if d.len() != 1 {
                return Err(err(
                    15983,
                    "An object representing an expression must have exactly one field",
                ));
            }
            let Some((op, args)) = d.iter().next() else {
                return Ok(None);
            };
            operator(op, args, root)
        }
        Bson::Document(d) => {
            let mut out = Document::new();
            for (k, v) in d {
                if let Some(v) = eval(v, root)? {
                    out.insert(k.clone(), v);
                }
            }
            Ok(Some(Bson::Document(out)))
        }
        Bson::Array(items) => Ok(Some(Bson::Array(
            items
                .iter()
                .map(|i| eval(i, root).map(|v| v.unwrap_or(Bson::Null)))
                .collect::<Result<_, _>>()?,
        ))),
        other => Ok(Some(other.clone())),
    }
}

fn args_list(args: &Bson, root: &Document) -> Result<Vec<Bson>, EngineError> {
    match args {
        Bson::Array(items) => items
            .iter()
            .map(|i| eval(i, root).map(|v| v.unwrap_or(Bson::Null)))
            .collect(),
        other => Ok(vec![eval(other, root)?.unwrap_or(Bson::Null)]),
    }
}

/// An expression result's truthiness: null, missing, false and zero are false.
pub(super) fn truthy(v: &Bson) -> bool {
    let falsy = matches!(v, Bson::Null | Bson::Undefined | Bson::Boolean(false))
        || (is_number(v) && to_f64(v) == 0.0);
    !falsy
}

fn operator(op: &str, args: &Bson, root: &Document) -> Result<Option<Bson>, EngineError> {
    if op == "$literal" {
        return Ok(Some(args.clone()));
    }
    let a = args_list(args, root)?;
    let nullish = |v: &Bson| matches!(v, Bson::Null | Bson::Undefined);
    Ok(Some(match op {
        "$add" | "$multiply" => {
            if a.iter().any(nullish) {
                return Ok(Some(Bson::Null));
            }
            let mut acc = if op == "$add" {
                Bson::Int32(0)
            } else {
                Bson::Int32(1)
            };
            for v in &a {
                if let Bson::DateTime(dt) = v {
                    if op == "$add" {
                        acc = Bson::DateTime(bson::DateTime::from_millis(
                            dt.timestamp_millis() + to_f64(&acc) as i64,
                        ));
                        continue;
                    }
                }
                if !is_number(v) {
                    return Err(err(
                        16554,
                        format!(
                            "{op} only supports numeric types, not {}",
                            super::update::type_name(v)
                        ),
                    ));
                }
                acc = match (&acc, op) {
                    (Bson::DateTime(dt), _) => Bson::DateTime(bson::DateTime::from_millis(
                        dt.timestamp_millis() + to_f64(v) as i64,
                    )),
                    (_, "$add") => add_numbers(&acc, v),
                    _ => match (&acc, v) {
                        (Bson::Int32(x), Bson::Int32(y)) => x
                            .checked_mul(*y)
                            .map(Bson::Int32)
                            .unwrap_or(Bson::Int64(*x as i64 * *y as i64)),
                        (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
                            let (x, y) = (to_f64(&acc) as i64, to_f64(v) as i64);
                            x.checked_mul(y)
                                .map(Bson::Int64)
                                .unwrap_or(Bson::Double(x as f64 * y as f64))
                        }
                        _ => Bson::Double(to_f64(&acc) * to_f64(v)),
                    },
                };
            }
            acc
        }
        "$subtract" | "$divide" | "$mod" => {
            if a.len() != 2 {
                return Err(err(
                    16020,
                    format!(
                        "Expression {op} takes exactly 2 arguments. {} were passed in.",
                        a.len()
                    ),
                ));
            }
            if a.iter().any(nullish) {
                return Ok(Some(Bson::Null));
            }
            if !is_number(&a[0]) || !is_number(&a[1]) {
                return Err(err(
                    16556,
                    format!(
                        "cant {op} a {} from a {}",
                        super::update::type_name(&a[1]),
                        super::update::type_name(&a[0])
                    ),
                ));
            }
            match op {
                "$subtract" => match (&a[0], &a[1]) {
                    (Bson::Double(_), _) | (_, Bson::Double(_)) => {
                        Bson::Double(to_f64(&a[0]) - to_f64(&a[1]))
                    }
                    (Bson::Int32(x), Bson::Int32(y)) => x
                        .checked_sub(*y)
                        .map(Bson::Int32)
                        .unwrap_or(Bson::Int64(*x as i64 - *y as i64)),
                    _ => Bson::Int64(to_f64(&a[0]) as i64 - to_f64(&a[1]) as i64),
                },
                "$divide" => {
                    if to_f64(&a[1]) == 0.0 {
                        return Err(err(16608, "can't $divide by zero"));
                    }
                    Bson::Double(to_f64(&a[0]) / to_f64(&a[1]))
                }
                _ => {
                    if to_f64(&a[1]) == 0.0 {
                        return Err(err(16610, "can't $mod by zero"));
                    }
                    match (&a[0], &a[1]) {
                        (Bson::Double(_), _) | (_, Bson::Double(_)) => {
                            Bson::Double(to_f64(&a[0]) % to_f64(&a[1]))
                        }
                        _ => Bson::Int64((to_f64(&a[0]) as i64) % (to_f64(&a[1]) as i64)),
                    }
                }
            }
        }
        "$concat" => {
            let mut s = String::new();
            for v in &a {
                match v {
                    Bson::String(x) => s.push_str(x),
                    v if nullish(v) => return Ok(Some(Bson::Null)),
                    other => {
                        return Err(err(
                            16702,
                            format!(
                                "$concat only supports strings, not {}",
                                super::update::type_name(other)
                            ),
                        ))
                    }
                }
            }
            Bson::String(s)
        }
        "$toLower" | "$toUpper" => match a.first() {
            Some(Bson::String(s)) => Bson::String(if op == "$toLower" {
                s.to_lowercase()
            } else {
                s.to_uppercase()
            }),
            Some(v) if nullish(v) => Bson::String(String::new()),
            Some(other) => Bson::String(other.to_string()),
            None => Bson::String(String::new()),
        },
        "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$cmp" => {
            if a.len() != 2 {
                return Err(err(
                    16020,
                    format!(
                        "Expression {op} takes exactly 2 arguments. {} were passed in.",
                        a.len()
                    ),
                ));
            }
            let o = compare(&a[0], &a[1]);
            match op {
                "$eq" => Bson::Boolean(o.is_eq()),
                "$ne" => Bson::Boolean(o.is_ne()),
                "$gt" => Bson::Boolean(o.is_gt()),
                "$gte" => Bson::Boolean(o.is_ge()),
                "$lt" => Bson::Boolean(o.is_lt()),
                "$lte" => Bson::Boolean(o.is_le()),
                _ => Bson::Int32(o as i32),
            }
        }
        "$and" => Bson::Boolean(a.iter().all(truthy)),
        "$or" => Bson::Boolean(a.iter().any(truthy)),
        "$not" => Bson::Boolean(!a.first().is_some_and(truthy)),
        "$cond" => {
            let (c, t, f) = match args {
                Bson::Document(d) => (
                    eval(d.get("if").unwrap_or(&Bson::Null), root)?.unwrap_or(Bson::Null),
                    d.get("then").cloned().unwrap_or(Bson::Null),
                    d.get("else").cloned().unwrap_or(Bson::Null),
                ),
                Bson::Array(items) if items.len() == 3 => {
                    (a[0].clone(), items[1].clone(), items[2].clone())
                }
                _ => return Err(err(16020, "Expression $cond takes exactly 3 arguments.")),
            };
            return eval(if truthy(&c) { &t } else { &f }, root);
        }
        "$ifNull" => {
            for v in &a {
                if !nullish(v) {
                    return Ok(Some(v.clone()));
                }
            }
            a.last().cloned().unwrap_or(Bson::Null)
        }
        "$size" => match a.first() {
            Some(Bson::Array(items)) => Bson::Int32(items.len() as i32),
            Some(other) => {
                return Err(err(
                    17124,
                    format!(
                        "The argument to $size must be an array. Type of the argument: {}",
                        super::update::type_name(other)
                    ),
                ))
            }
            None => Bson::Null,
        },
        "$abs" => match a.first() {
            Some(Bson::Int32(i)) => Bson::Int32(i.abs()),
            Some(Bson::Int64(i)) => Bson::Int64(i.abs()),
            Some(Bson::Double(d)) => Bson::Double(d.abs()),
            _ => Bson::Null,
        },
        "$in" => {
            if a.len() != 2 {
                return Err(err(16020, "Expression $in takes exactly 2 arguments."));
            }
            match &a[1] {
                Bson::Array(items) => Bson::Boolean(items.iter().any(|x| values_equal(x, &a[0]))),
                _ => return Err(err(40081, "$in requires an array as a second argument")),
            }
        }
        "$arrayElemAt" => match (a.first(), a.get(1)) {
            (Some(Bson::Array(items)), Some(i)) if is_number(i) => {
                let i = to_f64(i) as i64;
                let idx = if i < 0 { items.len() as i64 + i } else { i };
                match usize::try_from(idx).ok().and_then(|i| items.get(i)) {
                    Some(v) => v.clone(),
                    None => return Ok(None),
                }
            }
            _ => Bson::Null,
        },
        "$type" => Bson::String(match a.first() {
            Some(v) => super::update::type_name(v).to_string(),
            None => "missing".to_string(),
        }),
        "$isNumber" => Bson::Boolean(a.first().is_some_and(is_number)),
        "$toHashedIndexKey" => Bson::Int64(crate::routing::hash64(
            &eval(args, root)?.unwrap_or(Bson::Null),
        )),
        "$toString" => match a.first() {
            Some(Bson::String(s)) => Bson::String(s.clone()),
            Some(Bson::ObjectId(o)) => Bson::String(o.to_hex()),
            Some(v) if nullish(v) => Bson::Null,
            Some(v) => Bson::String(v.to_string()),
            None => Bson::Null,
        },
        other => {
            return Err(err(
                ErrorCode::InvalidPipelineOperator.0,
                format!("Unrecognized expression '{other}'"),
            ))
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn docs() -> Vec<Document> {
        vec![
            doc! {"_id": 1, "k": "a", "n": 1, "t": [1, 2]},
            doc! {"_id": 2, "k": "b", "n": 2.5, "t": [3]},
            doc! {"_id": 3, "k": "a", "n": 3, "t": []},
        ]
    }

    #[test]
    fn group_accumulators() {
        let out = run(
            &[Bson::Document(doc! {"$group": {
                "_id": "$k", "s": {"$sum": "$n"}, "c": {"$sum": 1}, "avg": {"$avg": "$n"},
                "mn": {"$min": "$n"}, "mx": {"$max": "$n"}, "f": {"$first": "$_id"}, "l": {"$last": "$_id"},
                "p": {"$push": "$_id"}, "u": {"$addToSet": "$k"}, "cnt": {"$count": {}}
            }})],
            docs(),
        )
        .unwrap();
        assert_eq!(out.len(), 2);
        let a = &out[0];
        assert_eq!(a.get_str("_id").unwrap(), "a");
        assert_eq!(a.get_i32("s").unwrap(), 4);
        assert_eq!(a.get_i32("c").unwrap(), 2);
        assert_eq!(a.get_f64("avg").unwrap(), 2.0);
        assert_eq!(a.get_i32("mn").unwrap(), 1);
        assert_eq!(a.get_i32("mx").unwrap(), 3);
        assert_eq!(a.get_i32("f").unwrap(), 1);
        assert_eq!(a.get_i32("l").unwrap(), 3);
        assert_eq!(a.get_array("p").unwrap().len(), 2);
        assert_eq!(a.get_array("u").unwrap().len(), 1);
        assert_eq!(out[1].get_f64("s").unwrap(), 2.5);
    }

    #[test]
    fn count_documents_pipeline() {
        let out = run(
            &[
                Bson::Document(doc! {"$match": {"k": "a"}}),
                Bson::Document(doc! {"$group": {"_id": 1, "n": {"$sum": 1}}}),
            ],
            docs(),
        )
        .unwrap();
        assert_eq!(out, vec![doc! {"_id": 1, "n": 2}]);
    }

    #[test]
    fn stages() {
        let out = run(
            &[
                Bson::Document(doc! {"$sort": {"n": -1}}),
                Bson::Document(doc! {"$skip": 1}),
                Bson::Document(doc! {"$limit": 1}),
                Bson::Document(doc! {"$project": {"k": 1, "twice": {"$multiply": ["$n", 2]}}}),
            ],
            docs(),
        )
        .unwrap();
        assert_eq!(out, vec![doc! {"_id": 2, "k": "b", "twice": 5.0}]);
        let out = run(
            &[
                Bson::Document(doc! {"$unwind": "$t"}),
                Bson::Document(doc! {"$count": "n"}),
            ],
            docs(),
        )
        .unwrap();
        assert_eq!(out, vec![doc! {"n": 3}]);
        let out = run(
            &[
                Bson::Document(doc! {"$set": {"z": {"$concat": ["$k", "!"]}}}),
                Bson::Document(doc! {"$unset": ["t", "n"]}),
            ],
            docs(),
        )
        .unwrap();
        assert_eq!(out[0], doc! {"_id": 1, "k": "a", "z": "a!"});
        let e = run(&[Bson::Document(doc! {"$lookup": {}})], docs()).unwrap_err();
        assert!(e.message.contains("$lookup"));
        let e = run(
            &[Bson::Document(doc! {"$project": {"x": {"$frob": 1}}})],
            docs(),
        )
        .unwrap_err();
        assert!(e.message.contains("$frob"));
    }
}
