//! The aggregation stages beyond the basic ones of [`super::aggregate`]: `$replaceRoot` /
//! `$replaceWith`, `$sortByCount`, `$bucket`, `$facet`, `$sample`, `$lookup` (equality and
//! pipeline forms, with `let`), `$unionWith`, `$setWindowFields` (accumulators over document
//! and range windows, `$rank`, `$denseRank`, `$documentNumber`, `$shift`, the gap fillers
//! `$locf` and `$linearFill`, and the series functions of [`super::series`]) and `$redact`, with
//! mongod's codes for malformed specifications. Each stage's output goes through the same
//! size and memory checks as the others.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use super::aggregate::{
    check_expression, err, eval_with, group, run_in, AggregateOptions, Env, Sink, Variables,
};
use super::matcher::Matcher;
use super::query::SortSpec;
use super::EngineError;
use crate::value::compare::{canonical_type, compare, OrdBson};
use crate::value::field::{is_number, to_f64, type_name};
use crate::value::render::{render_doc, render_value};

/// `$replaceRoot: {newRoot: <expr>}` and `$replaceWith: <expr>`.
pub(super) fn replace_root(
    name: &str,
    spec: &Bson,
    docs: Vec<Document>,
    cap: usize,
    vars: &Variables,
) -> Result<Vec<Document>, EngineError> {
    let (expr, what) = if name == "$replaceRoot" {
        let Bson::Document(d) = spec else {
            return Err(err(
                40229,
                format!(
                    "expected an object as specification for $replaceRoot stage, got {}",
                    type_name(spec)
                ),
            ));
        };
        if let Some(k) = d.keys().find(|k| *k != "newRoot") {
            return Err(err(40230, format!("unrecognized option to $replaceRoot stage: {k}, only valid option is 'newRoot'.")));
        }
        let Some(e) = d.get("newRoot") else {
            return Err(err(
                40231,
                "no newRoot specified for the $replaceRoot stage",
            ));
        };
        (e, "'newRoot' expression ")
    } else {
        (spec, "'replacement document' ")
    };
    check_expression(expr)?;
    let mut out = Sink::new("$replaceRoot", cap);
    for d in docs {
        match eval_with(expr, &d, vars)? {
            Some(Bson::Document(nd)) => out.push(nd)?,
            v => {
                let v = v.unwrap_or(Bson::Undefined);
                let shown = if matches!(v, Bson::Undefined) {
                    "MISSING".to_string()
                } else {
                    render_value(&v)
                };
                return Err(err(
                    40228,
                    format!(
                        "{what}must evaluate to an object, but resulting value was: {shown}. Type of resulting value: '{}'. Input document: {}",
                        if matches!(v, Bson::Undefined) { "missing" } else { type_name(&v) },
                        render_doc(&d)
                    ),
                ));
            }
        }
    }
    Ok(out.docs)
}

/// `$sortByCount: <expr>`: `$group` by the expression with a `count`, then by count, largest
/// first.
pub(super) fn sort_by_count(
    spec: &Bson,
    docs: Vec<Document>,
    options: &AggregateOptions,
    cap: usize,
    vars: &Variables,
) -> Result<Vec<Document>, EngineError> {
    let ok = match spec {
        Bson::String(s) => s.starts_with('$') && !s.starts_with("$$"),
        Bson::Document(d) => d.len() == 1 && d.keys().all(|k| k.starts_with('$')),
        _ => false,
    };
    if !ok {
        return Err(err(
            40148,
            "the sortByCount field must be defined as a $-prefixed path or an expression inside an object",
        ));
    }
    let spec = Bson::Document(doc! {"_id": spec.clone(), "count": {"$sum": 1}});
    let mut out = group(&spec, docs, options, cap, vars)?;
    out.sort_by(|a, b| {
        compare(
            b.get("count").unwrap_or(&Bson::Null),
            a.get("count").unwrap_or(&Bson::Null),
        )
    });
    Ok(out)
}

/// `$bucket: {groupBy, boundaries, default, output}`.
pub(super) fn bucket(
    spec: &Bson,
    docs: Vec<Document>,
    options: &AggregateOptions,
    cap: usize,
    vars: &Variables,
) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            40201,
            format!(
                "Argument to $bucket stage must be an object, but found type: {}.",
                type_name(spec)
            ),
        ));
    };
    for k in spec.keys() {
        if !matches!(k.as_str(), "groupBy" | "boundaries" | "default" | "output") {
            return Err(err(40197, format!("Unrecognized option to $bucket: {k}.")));
        }
    }
    let (Some(group_by), Some(bounds)) = (spec.get("groupBy"), spec.get("boundaries")) else {
        return Err(err(
            40198,
            "$bucket requires 'groupBy' and 'boundaries' to be specified.",
        ));
    };
    let group_ok = match group_by {
        Bson::String(s) => s.starts_with('$'),
        Bson::Document(_) => true,
        _ => false,
    };
    if !group_ok {
        return Err(err(40202, format!("The $bucket 'groupBy' field must be defined as a $-prefixed path or an expression, but found: {}.", render_value(group_by))));
    }
    let Bson::Array(bounds) = bounds else {
        return Err(err(
            40200,
            format!(
                "The $bucket 'boundaries' field must be an array, but found type: {}.",
                type_name(bounds)
            ),
        ));
    };
    if bounds.len() < 2 {
        return Err(err(40192, format!("The $bucket 'boundaries' field must have at least 2 values, but found {} value(s).", bounds.len())));
    }
    for (i, w) in bounds.windows(2).enumerate() {
        if canonical_type(&w[0]) != canonical_type(&w[1]) {
            return Err(err(40193, format!("All values in the the 'boundaries' option to $bucket must have the same type. Found conflicting types {} and {}.", type_name(&w[0]), type_name(&w[1]))));
        }
        if !compare(&w[0], &w[1]).is_lt() {
            return Err(err(40194, format!("The 'boundaries' option to $bucket must be sorted in ascending order, but elements {} and {} are not in ascending order ({} is not less than {}).", i, i + 1, render_value(&w[0]), render_value(&w[1]))));
        }
    }
    let (lo, hi) = (&bounds[0], &bounds[bounds.len() - 1]);
    let default = spec.get("default");
    if let Some(d) = default {
        if canonical_type(d) == canonical_type(lo)
            && !(compare(d, lo).is_lt() || compare(d, hi).is_ge())
        {
            return Err(err(40199, "The $bucket 'default' field must be less than the lowest boundary or greater than or equal to the highest boundary."));
        }
    }
    let output = match spec.get("output") {
        None => doc! {"count": {"$sum": 1}},
        Some(Bson::Document(o)) => o.clone(),
        Some(other) => {
            return Err(err(
                40196,
                format!(
                    "The $bucket 'output' field must be an object, but found type: {}.",
                    type_name(other)
                ),
            ))
        }
    };
    let mut buckets: BTreeMap<OrdBson, Vec<Document>> = BTreeMap::new();
    for d in docs {
        let v = eval_with(group_by, &d, vars)?.unwrap_or(Bson::Null);
        let key = if canonical_type(&v) == canonical_type(lo)
            && compare(&v, lo).is_ge()
            && compare(&v, hi).is_lt()
        {
            let i = bounds
                .windows(2)
                .position(|w| compare(&v, &w[1]).is_lt())
                .unwrap_or(0);
            bounds[i].clone()
        } else {
            match default {
                Some(d) => d.clone(),
                None => {
                    return Err(err(
                        40066,
                        "$switch could not find a matching branch for an input, and no default was specified.",
                    ))
                }
            }
        };
        buckets.entry(OrdBson(key)).or_default().push(d);
    }
    let mut group_spec = doc! {"_id": Bson::Null};
    for (k, v) in &output {
        group_spec.insert(k.clone(), v.clone());
    }
    let group_spec = Bson::Document(group_spec);
    let mut out = Sink::new("$bucket", cap);
    for (key, members) in buckets {
        for mut g in group(&group_spec, members, options, cap, vars)? {
            g.insert("_id", key.0.clone());
            out.push(g)?;
        }
    }
    Ok(out.docs)
}

/// Stages no sub-pipeline of `$facet` (or `$lookup`) may hold.
fn check_sub_pipeline(pipeline: &[Bson], facet: bool) -> Result<(), EngineError> {
    for s in pipeline {
        let Some(name) = s.as_document().and_then(|d| d.keys().next()) else {
            continue;
        };
        let refused = if facet {
            matches!(
                name.as_str(),
                "$out" | "$merge" | "$facet" | "$collStats" | "$indexStats" | "$changeStream"
            )
        } else {
            matches!(name.as_str(), "$out" | "$merge" | "$changeStream")
        };
        if refused {
            return Err(if facet {
                err(
                    40600,
                    format!("{name} is not allowed to be used within a $facet stage"),
                )
            } else {
                err(
                    51047,
                    format!("{name} is not allowed to be used within a $lookup stage"),
                )
            });
        }
    }
    Ok(())
}

/// `$facet: {name: [stages], …}`: one document with each sub-pipeline's results.
pub(super) fn facet(
    spec: &Bson,
    docs: Vec<Document>,
    options: &AggregateOptions,
    env: &Env,
) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            15947,
            "the $facet specification must be a non-empty object",
        ));
    };
    if spec.is_empty() {
        return Err(err(
            40169,
            "the $facet specification must be a non-empty object",
        ));
    }
    let mut out = Document::new();
    for (name, p) in spec {
        let Bson::Array(p) = p else {
            return Err(err(
                40170,
                format!(
                    "arguments to $facet must be arrays, {name} is type {}",
                    type_name(p)
                ),
            ));
        };
        check_sub_pipeline(p, true)?;
        let results = run_in(p, docs.clone(), options, env)?;
        out.insert(
            name.clone(),
            Bson::Array(results.into_iter().map(Bson::Document).collect()),
        );
    }
    let mut sink = Sink::new("$facet", usize::MAX);
    sink.push(out)?;
    Ok(sink.docs)
}

/// A small xorshift generator for `$sample` and `$rand`, seeded from the clock and a counter
/// (the engine has no randomness crate; nothing here is for security).
pub(super) fn random_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9E37_79B9_7F4A_7C15)
            | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    x
}

/// `$sample: {size: n}`: `n` documents chosen at random without repetition.
pub(super) fn sample(spec: &Bson, mut docs: Vec<Document>) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            28745,
            "the $sample stage specification must be an object",
        ));
    };
    let mut size = None;
    for (k, v) in spec {
        if k != "size" {
            return Err(err(28748, format!("unrecognized option to $sample: {k}")));
        }
        if !is_number(v) {
            return Err(err(28746, "size argument to $sample must be a number"));
        }
        let n = to_f64(v);
        if n < 0.0 {
            return Err(err(28747, "size argument to $sample must not be negative"));
        }
        size = Some(n as usize);
    }
    let Some(size) = size else {
        return Err(err(28749, "$sample stage must specify a size"));
    };
    let n = docs.len();
    let take = size.min(n);
    for i in 0..take {
        let j = i + (random_u64() % (n - i) as u64) as usize;
        docs.swap(i, j);
    }
    docs.truncate(take);
    Ok(docs)
}

fn foreign_documents(env: &Env, coll: &str) -> Result<Vec<Document>, EngineError> {
    match env.namespaces {
        Some(ns) => ns.documents(&env.db, coll),
        None => Err(err(
            crate::value::error_codes::ErrorCode::NamespaceNotFound.0,
            format!("cannot read {}.{coll} here", env.db),
        )),
    }
}

/// `$lookup`: `{from, localField, foreignField, as}`, `{from, let, pipeline, as}`, or both
/// (equality first, then the pipeline). A missing or null local value matches foreign
/// documents whose field is null or missing; an array matches any of its elements.
pub(super) fn lookup(
    spec: &Bson,
    docs: Vec<Document>,
    options: &AggregateOptions,
    env: &Env,
    cap: usize,
) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            9,
            format!(
                "the $lookup stage specification must be an object, but found {}",
                type_name(spec)
            ),
        ));
    };
    let mut from = None;
    let (mut local, mut foreign, mut as_field, mut pipeline, mut let_doc) =
        (None, None, None, None, None);
    for (k, v) in spec {
        match (k.as_str(), v) {
            ("from", Bson::String(s)) => from = Some(s.clone()),
            ("from", Bson::Document(d)) => {
                from = d.get_str("coll").ok().map(|s| s.to_string());
            }
            ("localField", Bson::String(s)) => local = Some(s.clone()),
            ("foreignField", Bson::String(s)) => foreign = Some(s.clone()),
            ("as", Bson::String(s)) => as_field = Some(s.clone()),
            ("pipeline", Bson::Array(p)) => pipeline = Some(p.clone()),
            ("let", Bson::Document(d)) => let_doc = Some(d.clone()),
            ("from" | "localField" | "foreignField" | "as" | "pipeline" | "let", other) => {
                return Err(err(
                    9,
                    format!(
                        "$lookup argument '{k}: {}' must be {}, but found type: {}",
                        render_value(other),
                        if k == "pipeline" {
                            "an array"
                        } else if k == "let" {
                            "an object"
                        } else {
                            "a string"
                        },
                        type_name(other)
                    ),
                ))
            }
            _ => return Err(err(9, format!("unknown argument to $lookup: {k}"))),
        }
    }
    let Some(as_field) = as_field else {
        return Err(err(9, "must specify 'as' field for a $lookup"));
    };
    crate::engine::path::check_field_path(&as_field)?;
    if local.is_some() != foreign.is_some() {
        return Err(err(
            9,
            "$lookup requires both or neither of 'localField' and 'foreignField' to be specified",
        ));
    }
    if pipeline.is_none() && local.is_none() {
        return Err(err(
            9,
            "$lookup requires either 'pipeline' or both 'localField' and 'foreignField' to be specified",
        ));
    }
    if let Some(p) = &pipeline {
        check_sub_pipeline(p, false)?;
    }
    let foreign_docs = match &from {
        Some(f) => foreign_documents(env, f)?,
        None if pipeline
            .as_ref()
            .and_then(|p| p.first())
            .and_then(|s| s.as_document())
            .is_some_and(|d| d.contains_key("$documents")) =>
        {
            Vec::new()
        }
        None => return Err(err(9, "must specify 'from' field for a $lookup")),
    };
    let mut out = Sink::new("$lookup", cap);
    for mut d in docs {
        let mut matched: Vec<Document> = match (&local, &foreign) {
            (Some(l), Some(f)) => {
                let values: Vec<Bson> = {
                    let lk = crate::engine::path::lookup(&d, l);
                    let vals = lk.expanded();
                    if vals.is_empty() {
                        vec![Bson::Null]
                    } else {
                        vals.into_iter().cloned().collect()
                    }
                };
                let m = Matcher::parse(&doc! {f.clone(): {"$in": values}})?;
                foreign_docs
                    .iter()
                    .filter(|x| m.matches(x))
                    .cloned()
                    .collect()
            }
            _ => foreign_docs.clone(),
        };
        if let Some(p) = &pipeline {
            let vars = match &let_doc {
                Some(l) => env.vars.with_let(l, &d)?,
                None => env.vars.clone(),
            };
            matched = run_in(p, matched, options, &env.with_vars(vars))?;
        }
        crate::engine::path::set(
            &mut d,
            &as_field,
            Bson::Array(matched.into_iter().map(Bson::Document).collect()),
        )?;
        out.push(d)?;
    }
    Ok(out.docs)
}

/// `$unionWith: "coll"` or `{coll, pipeline}`: the input, then the other collection's
/// documents through its pipeline.
pub(super) fn union_with(
    spec: &Bson,
    mut docs: Vec<Document>,
    options: &AggregateOptions,
    env: &Env,
    cap: usize,
) -> Result<Vec<Document>, EngineError> {
    let (coll, pipeline) = match spec {
        Bson::String(s) => (Some(s.clone()), Vec::new()),
        Bson::Document(d) => {
            for k in d.keys() {
                if k != "coll" && k != "pipeline" {
                    return Err(err(
                        40415,
                        format!("BSON field '$unionWith.{k}' is an unknown field."),
                    ));
                }
            }
            let coll = match d.get("coll") {
                Some(Bson::String(s)) => Some(s.clone()),
                None => None,
                Some(other) => {
                    return Err(err(
                        crate::value::error_codes::ErrorCode::TypeMismatch.0,
                        format!("BSON field '$unionWith.coll' is the wrong type '{}', expected type 'string'", type_name(other)),
                    ))
                }
            };
            let pipeline = match d.get("pipeline") {
                Some(Bson::Array(p)) => p.clone(),
                None => Vec::new(),
                Some(other) => {
                    return Err(err(
                        crate::value::error_codes::ErrorCode::TypeMismatch.0,
                        format!("BSON field '$unionWith.pipeline' is the wrong type '{}', expected type 'array'", type_name(other)),
                    ))
                }
            };
            (coll, pipeline)
        }
        other => {
            return Err(err(
                crate::value::error_codes::ErrorCode::FailedToParse.0,
                format!(
                    "the $unionWith stage specification must be an object or string, but found {}",
                    type_name(other)
                ),
            ))
        }
    };
    check_sub_pipeline(&pipeline, false)?;
    let input = match &coll {
        Some(c) => foreign_documents(env, c)?,
        None => Vec::new(),
    };
    let more = run_in(&pipeline, input, options, env)?;
    let mut out = Sink::new("$unionWith", cap.saturating_mul(2));
    for d in docs.drain(..).chain(more) {
        out.push(d)?;
    }
    Ok(out.docs)
}

/// One bound of a window.
#[derive(Debug, Clone, Copy)]
enum Bound {
    Unbounded,
    Current,
    Offset(f64),
}

fn parse_bound(v: &Bson, what: &str) -> Result<Bound, EngineError> {
    match v {
        Bson::String(s) if s == "unbounded" => Ok(Bound::Unbounded),
        Bson::String(s) if s == "current" => Ok(Bound::Current),
        v if is_number(v) => Ok(Bound::Offset(to_f64(v))),
        other => Err(err(
            crate::value::error_codes::ErrorCode::FailedToParse.0,
            format!(
                "Window bounds must be 'unbounded', 'current', or a number for {what}, got {}",
                render_value(other)
            ),
        )),
    }
}

/// A window: positions relative to the current document, or a range of the sort value.
#[derive(Debug, Clone)]
enum Window {
    Documents(Bound, Bound),
    Range(Bound, Bound, f64),
}

/// A time unit of a range window, `$derivative` or `$integral` (a week or shorter), in
/// milliseconds.
pub(super) fn unit_millis(unit: &str) -> Option<f64> {
    Some(match unit {
        "week" => 7.0 * 86_400_000.0,
        "day" => 86_400_000.0,
        "hour" => 3_600_000.0,
        "minute" => 60_000.0,
        "second" => 1000.0,
        "millisecond" => 1.0,
        _ => return None,
    })
}

fn sort_number(v: Option<&Bson>) -> Option<f64> {
    match v? {
        Bson::DateTime(d) => Some(d.timestamp_millis() as f64),
        v if is_number(v) => Some(to_f64(v)),
        _ => None,
    }
}

/// `$setWindowFields: {partitionBy, sortBy, output: {field: {$fn: arg, window}}}`.
pub(super) fn set_window_fields(
    spec: &Bson,
    docs: Vec<Document>,
    cap: usize,
    vars: &Variables,
) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            crate::value::error_codes::ErrorCode::FailedToParse.0,
            "$setWindowFields must have an object argument",
        ));
    };
    for k in spec.keys() {
        if !matches!(k.as_str(), "partitionBy" | "sortBy" | "output") {
            return Err(err(
                40415,
                format!("BSON field '$setWindowFields.{k}' is an unknown field."),
            ));
        }
    }
    let Some(Bson::Document(output)) = spec.get("output") else {
        return Err(err(
            40414,
            "BSON field '$setWindowFields.output' is missing but a required field",
        ));
    };
    let sort =
        match spec.get("sortBy") {
            Some(Bson::Document(s)) => Some((SortSpec::parse(s)?, s.clone())),
            None => None,
            Some(_) => return Err(err(
                crate::value::error_codes::ErrorCode::TypeMismatch.0,
                "BSON field '$setWindowFields.sortBy' is the wrong type, expected type 'object'",
            )),
        };
    let partition_by = spec.get("partitionBy");
    if let Some(p) = partition_by {
        check_expression(p)?;
    }
    // The functions, parsed once.
    struct Field {
        path: String,
        op: String,
        arg: Bson,
        window: Option<Window>,
        series: Option<super::series::SeriesFn>,
    }
    let mut fields = Vec::new();
    for (path, f) in output {
        crate::engine::path::check_field_path(path)?;
        let Bson::Document(f) = f else {
            return Err(err(
                crate::value::error_codes::ErrorCode::FailedToParse.0,
                format!("The field '{path}' must be an object"),
            ));
        };
        let mut op = None;
        let mut window = None;
        for (k, v) in f {
            if k == "window" {
                let Bson::Document(w) = v else {
                    return Err(err(
                        crate::value::error_codes::ErrorCode::FailedToParse.0,
                        "'window' field must be an object",
                    ));
                };
                let pair = |v: Option<&Bson>, what: &str| -> Result<(Bound, Bound), EngineError> {
                    match v {
                        Some(Bson::Array(b)) if b.len() == 2 => {
                            Ok((parse_bound(&b[0], what)?, parse_bound(&b[1], what)?))
                        }
                        _ => Err(err(
                            crate::value::error_codes::ErrorCode::FailedToParse.0,
                            format!("Window bounds must be a 2-element array: {what}"),
                        )),
                    }
                };
                window = Some(if w.contains_key("documents") {
                    let (lo, hi) = pair(w.get("documents"), "documents")?;
                    Window::Documents(lo, hi)
                } else if w.contains_key("range") {
                    let (lo, hi) = pair(w.get("range"), "range")?;
                    let scale = match w.get_str("unit") {
                        Ok(u) => unit_millis(u).ok_or_else(|| {
                            err(
                                crate::value::error_codes::ErrorCode::FailedToParse.0,
                                format!("unknown time unit value: {u}"),
                            )
                        })?,
                        Err(_) => 1.0,
                    };
                    Window::Range(lo, hi, scale)
                } else {
                    return Err(err(
                        crate::value::error_codes::ErrorCode::FailedToParse.0,
                        "'window' field must contain 'documents' or 'range'",
                    ));
                });
            } else if op.is_none() {
                op = Some((k.clone(), v.clone()));
            } else {
                return Err(err(
                    crate::value::error_codes::ErrorCode::FailedToParse.0,
                    format!("Window function found an unknown argument: {k}"),
                ));
            }
        }
        let Some((op, arg)) = op else {
            return Err(err(
                crate::value::error_codes::ErrorCode::FailedToParse.0,
                "Expected a window function",
            ));
        };
        let known = matches!(
            op.as_str(),
            "$sum"
                | "$avg"
                | "$min"
                | "$max"
                | "$count"
                | "$push"
                | "$addToSet"
                | "$first"
                | "$last"
                | "$stdDevPop"
                | "$stdDevSamp"
                | "$rank"
                | "$denseRank"
                | "$documentNumber"
                | "$shift"
                | "$median"
                | "$percentile"
                | "$locf"
                | "$linearFill"
        ) || super::aggregate::is_n_accumulator(&op)
            || super::series::is_series_function(&op);
        if !known {
            return Err(err(
                crate::value::error_codes::ErrorCode::FailedToParse.0,
                format!("Unrecognized window function, {op}"),
            ));
        }
        // Parsed before the window's own checks, as mongod parses these functions.
        let series = if super::series::is_series_function(&op) {
            Some(super::series::SeriesFn::parse(
                &op,
                &arg,
                window.is_some(),
                sort.as_ref().map(|(_, s)| s),
            )?)
        } else {
            None
        };
        if matches!(op.as_str(), "$locf" | "$linearFill") {
            check_expression(&arg)?;
            if window.is_some() {
                return Err(err(
                    crate::value::error_codes::ErrorCode::FailedToParse.0,
                    format!("'window' field is not allowed in {op}"),
                ));
            }
            if op == "$linearFill" && sort.as_ref().is_none_or(|(_, s)| s.len() != 1) {
                return Err(err(
                    605001,
                    format!("{op} must be specified with a top level sortBy expression with exactly one element"),
                ));
            }
        }
        if matches!(op.as_str(), "$median" | "$percentile") {
            super::quantile::Quantile::parse(&op, &arg, super::quantile::Usage::Accumulator, vars)?;
        }
        if super::aggregate::is_n_accumulator(&op) {
            // Parsed here for its errors, before any document is read.
            super::aggregate::n_accumulate(&op, &arg, &[], vars)?;
        }
        if matches!(
            op.as_str(),
            "$rank" | "$denseRank" | "$documentNumber" | "$shift"
        ) {
            if sort.is_none() {
                return Err(err(
                    5371601,
                    format!("{op} must be specified with a top level sortBy expression with exactly one element"),
                ));
            }
            if window.is_some() {
                return Err(err(
                    5371601,
                    format!("{op} does not accept a 'window' field"),
                ));
            }
        }
        if let Some(Window::Range(..)) = window {
            let one_numeric = sort.as_ref().is_some_and(|(_, s)| s.len() == 1);
            if !one_numeric {
                return Err(err(
                    5339902,
                    "Range-based bounds require sortBy a single field",
                ));
            }
        }
        if window.is_some() && sort.is_none() {
            if let Some(Window::Documents(lo, hi)) = &window {
                let bounded = !matches!((lo, hi), (Bound::Unbounded, Bound::Unbounded));
                if bounded {
                    return Err(err(5339901, "Document-based bounds require a sortBy"));
                }
            }
        }
        fields.push(Field {
            path: path.clone(),
            op,
            arg,
            window,
            series,
        });
    }

    // Partition, then sort each partition (mongod sorts by partition key, then sortBy).
    let mut partitions: BTreeMap<OrdBson, Vec<Document>> = BTreeMap::new();
    for d in docs {
        let key = match partition_by {
            Some(p) => eval_with(p, &d, vars)?.unwrap_or(Bson::Null),
            None => Bson::Null,
        };
        partitions.entry(OrdBson(key)).or_default().push(d);
    }
    let mut out = Sink::new("$setWindowFields", cap.saturating_mul(2));
    for (_, mut part) in partitions {
        if let Some((s, _)) = &sort {
            s.sort(&mut part);
        }
        let sort_field = sort
            .as_ref()
            .and_then(|(_, s)| s.keys().next().cloned())
            .unwrap_or_default();
        let sort_desc = sort
            .as_ref()
            .and_then(|(_, s)| s.values().next())
            .is_some_and(|v| to_f64(v) < 0.0);
        let sort_values: Vec<Option<f64>> = part
            .iter()
            .map(|d| sort_number(crate::engine::path::get(d, &sort_field)))
            .collect();
        let sort_keys: Vec<Bson> = part
            .iter()
            .map(|d| {
                crate::engine::path::get(d, &sort_field)
                    .cloned()
                    .unwrap_or(Bson::Null)
            })
            .collect();
        let n = part.len();
        let mut computed: Vec<Vec<(String, Option<Bson>)>> = vec![Vec::new(); n];
        for f in &fields {
            let mut rank = 0i64;
            let mut dense = 0i64;
            // The functions that compute a whole partition at once.
            let filled = match (f.op.as_str(), &f.series) {
                ("$locf", _) => locf(&f.arg, &part, vars)?,
                ("$linearFill", _) => linear_fill(&f.arg, &part, &sort_field, vars)?,
                (_, Some(series)) => series.compute(
                    &part,
                    &sort_field,
                    &|i| window_range(f.window.as_ref(), i, n, &sort_values, sort_desc),
                    vars,
                )?,
                _ => Vec::new(),
            };
            for i in 0..n {
                let value = match f.op.as_str() {
                    "$locf" | "$linearFill" => filled.get(i).cloned(),
                    _ if f.series.is_some() => filled.get(i).cloned(),
                    "$documentNumber" => Some(Bson::Int64(i as i64 + 1)),
                    "$rank" | "$denseRank" => {
                        let new_value = i == 0 || compare(&sort_keys[i], &sort_keys[i - 1]).is_ne();
                        if new_value {
                            rank = i as i64 + 1;
                            dense += 1;
                        }
                        Some(Bson::Int64(if f.op == "$rank" { rank } else { dense }))
                    }
                    "$shift" => {
                        let Bson::Document(a) = &f.arg else {
                            return Err(err(
                                crate::value::error_codes::ErrorCode::FailedToParse.0,
                                "Argument to $shift must be an object",
                            ));
                        };
                        let by = a
                            .get("by")
                            .filter(|v| is_number(v))
                            .map(to_f64)
                            .ok_or_else(|| {
                                err(
                                    crate::value::error_codes::ErrorCode::FailedToParse.0,
                                    "'$shift:by' field must be an integer, but found: missing",
                                )
                            })? as i64;
                        let output = a.get("output").cloned().unwrap_or(Bson::Null);
                        let j = i as i64 + by;
                        if j >= 0 && (j as usize) < n {
                            Some(eval_with(&output, &part[j as usize], vars)?.unwrap_or(Bson::Null))
                        } else {
                            Some(match a.get("default") {
                                Some(d) => eval_with(d, &part[i], vars)?.unwrap_or(Bson::Null),
                                None => Bson::Null,
                            })
                        }
                    }
                    op => {
                        let (lo, hi) =
                            window_range(f.window.as_ref(), i, n, &sort_values, sort_desc);
                        let arg = if op == "$count" {
                            Bson::Int32(1)
                        } else {
                            f.arg.clone()
                        };
                        Some(accumulate(op, &arg, &part[lo..hi], vars)?)
                    }
                };
                computed[i].push((f.path.clone(), value));
            }
        }
        for (mut d, fields) in part.into_iter().zip(computed) {
            for (p, v) in fields {
                match v {
                    Some(v) => crate::engine::path::set(&mut d, &p, v)?,
                    None => {
                        crate::engine::path::unset(&mut d, &p);
                    }
                }
            }
            out.push(d)?;
        }
    }
    Ok(out.docs)
}

/// `$locf`: each document's value, or the last one before it that is not null or missing
/// (null when there is none).
fn locf(arg: &Bson, part: &[Document], vars: &Variables) -> Result<Vec<Bson>, EngineError> {
    let mut last = Bson::Null;
    let mut out = Vec::with_capacity(part.len());
    for d in part {
        match eval_with(arg, d, vars)? {
            Some(v) if !matches!(v, Bson::Null | Bson::Undefined) => last = v,
            _ => {}
        }
        out.push(last.clone());
    }
    Ok(out)
}

/// `$linearFill`: a null or missing value is interpolated, on the sort field, between the
/// nearest values before and after it (null without both). As mongod: values must be numbers
/// (14), sort values numbers or dates of one kind (14) and distinct (6050106).
fn linear_fill(
    arg: &Bson,
    part: &[Document],
    sort_field: &str,
    vars: &Variables,
) -> Result<Vec<Bson>, EngineError> {
    let mismatch = |m: String| err(crate::value::error_codes::ErrorCode::TypeMismatch.0, m);
    let mut points: Vec<(f64, Option<Bson>)> = Vec::with_capacity(part.len());
    let mut previous: Option<Bson> = None;
    for d in part {
        let y = eval_with(arg, d, vars)?.filter(|v| !matches!(v, Bson::Null | Bson::Undefined));
        if let Some(y) = &y {
            if !is_number(y) {
                return Err(mismatch(format!(
                    "Value to be filled must be numeric or nullish, but found {}",
                    type_name(y)
                )));
            }
        }
        let x = crate::engine::path::get(d, sort_field)
            .cloned()
            .unwrap_or(Bson::Null);
        let date = match &x {
            Bson::DateTime(_) | Bson::Timestamp(_) | Bson::ObjectId(_) => true,
            v if is_number(v) => false,
            other => {
                return Err(mismatch(format!(
                    "Value of the sortBy field must be numeric or a date, but found {}",
                    type_name(other)
                )))
            }
        };
        if let Some(p) = &previous {
            if crate::value::compare::values_equal(p, &x) {
                return Err(err(
                    6050106,
                    "There can be no repeated values in the sort field in the same partition",
                ));
            }
            let was_date = !is_number(p);
            if was_date != date {
                return Err(mismatch(format!(
                    "Conflicting sort value types, previously received type {}, but found {}",
                    type_name(p),
                    type_name(&x)
                )));
            }
        }
        let xf = match &x {
            Bson::DateTime(t) => t.timestamp_millis() as f64,
            Bson::Timestamp(t) => t.time as f64 * 1000.0,
            Bson::ObjectId(o) => o.timestamp().timestamp_millis() as f64,
            v => to_f64(v),
        };
        previous = Some(x);
        points.push((xf, y));
    }
    let mut out = Vec::with_capacity(points.len());
    for (i, (x, y)) in points.iter().enumerate() {
        if let Some(y) = y {
            out.push(y.clone());
            continue;
        }
        let before = points[..i]
            .iter()
            .rev()
            .find_map(|(x, y)| y.as_ref().map(|y| (*x, to_f64(y))));
        let after = points[i + 1..]
            .iter()
            .find_map(|(x, y)| y.as_ref().map(|y| (*x, to_f64(y))));
        out.push(match (before, after) {
            (Some((x1, y1)), Some((x2, y2))) => {
                Bson::Double(y1 + (x - x1) * ((y2 - y1) / (x2 - x1)))
            }
            _ => Bson::Null,
        });
    }
    Ok(out)
}

/// The documents `[lo, hi)` of a partition in the window of document `i`.
fn window_range(
    window: Option<&Window>,
    i: usize,
    n: usize,
    sort_values: &[Option<f64>],
    desc: bool,
) -> (usize, usize) {
    match window {
        None => (0, n),
        Some(Window::Documents(lo, hi)) => {
            let at = |b: &Bound, lower: bool| -> i64 {
                match b {
                    Bound::Unbounded => {
                        if lower {
                            0
                        } else {
                            n as i64
                        }
                    }
                    Bound::Current => i as i64 + if lower { 0 } else { 1 },
                    Bound::Offset(o) => i as i64 + *o as i64 + if lower { 0 } else { 1 },
                }
            };
            let lo = at(lo, true).clamp(0, n as i64) as usize;
            let hi = at(hi, false).clamp(0, n as i64) as usize;
            (lo, hi.max(lo))
        }
        Some(Window::Range(lo, hi, scale)) => {
            let Some(cur) = sort_values[i] else {
                return (i, i);
            };
            let sign = if desc { -1.0 } else { 1.0 };
            let in_range = |v: f64| {
                let rel = (v - cur) * sign;
                let above = match lo {
                    Bound::Unbounded => true,
                    Bound::Current => rel >= 0.0,
                    Bound::Offset(o) => rel >= o * scale,
                };
                let below = match hi {
                    Bound::Unbounded => true,
                    Bound::Current => rel <= 0.0,
                    Bound::Offset(o) => rel <= o * scale,
                };
                above && below
            };
            let idx: Vec<usize> = (0..n)
                .filter(|&j| sort_values[j].is_some_and(in_range))
                .collect();
            match (idx.first(), idx.last()) {
                (Some(a), Some(b)) => (*a, *b + 1),
                _ => (i, i),
            }
        }
    }
}

/// An accumulator over a window's documents.
fn accumulate(
    op: &str,
    arg: &Bson,
    docs: &[Document],
    vars: &Variables,
) -> Result<Bson, EngineError> {
    if matches!(op, "$median" | "$percentile") {
        let q =
            super::quantile::Quantile::parse(op, arg, super::quantile::Usage::Accumulator, vars)?;
        let mut values = Vec::with_capacity(docs.len());
        for d in docs {
            if let Some(v) = eval_with(&q.input, d, vars)? {
                values.push(v);
            }
        }
        return Ok(q.finish(&values));
    }
    if super::aggregate::is_n_accumulator(op) {
        return super::aggregate::n_accumulate(op, arg, docs, vars);
    }
    let mut values = Vec::with_capacity(docs.len());
    for d in docs {
        values.push(eval_with(arg, d, vars)?);
    }
    let numbers = || values.iter().flatten().filter(|v| is_number(v));
    Ok(match op {
        "$sum" | "$count" => numbers().fold(Bson::Int32(0), |acc, v| {
            crate::value::field::arithmetic(&acc, v, false)
        }),
        "$avg" => super::expressions::average(&numbers().collect::<Vec<_>>()),
        "$stdDevPop" | "$stdDevSamp" => {
            let n: Vec<f64> = numbers().map(to_f64).collect();
            let k = n.len() as f64;
            let min = if op == "$stdDevPop" { 1.0 } else { 2.0 };
            if k < min {
                Bson::Null
            } else {
                let mean = n.iter().sum::<f64>() / k;
                let ss: f64 = n.iter().map(|x| (x - mean).powi(2)).sum();
                Bson::Double((ss / if op == "$stdDevPop" { k } else { k - 1.0 }).sqrt())
            }
        }
        "$min" | "$max" => {
            let mut best: Option<&Bson> = None;
            for v in values
                .iter()
                .flatten()
                .filter(|v| !matches!(v, Bson::Null | Bson::Undefined))
            {
                let better = best.is_none_or(|b| {
                    let o = compare(v, b);
                    if op == "$min" {
                        o.is_lt()
                    } else {
                        o.is_gt()
                    }
                });
                if better {
                    best = Some(v);
                }
            }
            best.cloned().unwrap_or(Bson::Null)
        }
        "$push" => Bson::Array(values.into_iter().flatten().collect()),
        "$addToSet" => {
            let set: std::collections::BTreeSet<OrdBson> =
                values.into_iter().flatten().map(OrdBson).collect();
            Bson::Array(set.into_iter().map(|v| v.0).collect())
        }
        "$first" => values
            .first()
            .map(|v| v.clone().unwrap_or(Bson::Null))
            .unwrap_or(Bson::Null),
        "$last" => values
            .last()
            .map(|v| v.clone().unwrap_or(Bson::Null))
            .unwrap_or(Bson::Null),
        other => {
            return Err(err(
                crate::value::error_codes::ErrorCode::FailedToParse.0,
                format!("Unrecognized window function, {other}"),
            ))
        }
    })
}

/// `$redact`: the expression decides per (sub)document `$$DESCEND`, `$$PRUNE` or `$$KEEP`.
pub(super) fn redact(
    spec: &Bson,
    docs: Vec<Document>,
    vars: &Variables,
) -> Result<Vec<Document>, EngineError> {
    check_expression(spec)?;
    let mut vars = vars.clone();
    vars.bind("DESCEND".into(), Bson::String("descend".into()));
    vars.bind("PRUNE".into(), Bson::String("prune".into()));
    vars.bind("KEEP".into(), Bson::String("keep".into()));
    let mut out = Vec::new();
    for d in docs {
        if let Some(d) = redact_doc(spec, d, &vars, 0)? {
            out.push(d);
        }
    }
    Ok(out)
}

fn redact_doc(
    spec: &Bson,
    d: Document,
    vars: &Variables,
    depth: usize,
) -> Result<Option<Document>, EngineError> {
    if depth > crate::limits::MAX_RESULT_DEPTH {
        return Ok(Some(d));
    }
    let mut scoped = vars.clone();
    scoped.bind("CURRENT".into(), Bson::Document(d.clone()));
    match eval_with(spec, &d, &scoped)? {
        Some(Bson::String(s)) if s == "keep" => Ok(Some(d)),
        Some(Bson::String(s)) if s == "prune" => Ok(None),
        Some(Bson::String(s)) if s == "descend" => {
            let mut out = Document::new();
            for (k, v) in d {
                match v {
                    Bson::Document(sub) => {
                        if let Some(sub) = redact_doc(spec, sub, vars, depth + 1)? {
                            out.insert(k, sub);
                        }
                    }
                    Bson::Array(items) => {
                        let mut kept = Vec::new();
                        for i in items {
                            match i {
                                Bson::Document(sub) => {
                                    if let Some(sub) = redact_doc(spec, sub, vars, depth + 1)? {
                                        kept.push(Bson::Document(sub));
                                    }
                                }
                                other => kept.push(other),
                            }
                        }
                        out.insert(k, kept);
                    }
                    other => {
                        out.insert(k, other);
                    }
                }
            }
            Ok(Some(out))
        }
        other => Err(err(
            17053,
            format!(
                "$redact's expression should not return anything aside from the variables $$KEEP, $$DESCEND, and $$PRUNE, but returned {}",
                other.map(|v| render_value(&v)).unwrap_or_else(|| "MISSING".into())
            ),
        )),
    }
}

/// The preferred-number series `$bucketAuto`'s `granularity` rounds to (mongod's tables).
fn granularity_series(name: &str) -> Option<&'static [f64]> {
    Some(match name {
        "R5" => &[10.0, 16.0, 25.0, 40.0, 63.0],
        "R10" => &[
            100.0, 125.0, 160.0, 200.0, 250.0, 315.0, 400.0, 500.0, 630.0, 800.0,
        ],
        "R20" => &[
            100.0, 112.0, 125.0, 140.0, 160.0, 180.0, 200.0, 224.0, 250.0, 280.0, 315.0, 355.0,
            400.0, 450.0, 500.0, 560.0, 630.0, 710.0, 800.0, 900.0,
        ],
        "R40" => &[
            100.0, 106.0, 112.0, 118.0, 125.0, 132.0, 140.0, 150.0, 160.0, 170.0, 180.0, 190.0,
            200.0, 212.0, 224.0, 236.0, 250.0, 265.0, 280.0, 300.0, 315.0, 355.0, 375.0, 400.0,
            425.0, 450.0, 475.0, 500.0, 530.0, 560.0, 600.0, 630.0, 670.0, 710.0, 750.0, 800.0,
            850.0, 900.0, 950.0,
        ],
        "R80" => &[
            103.0, 109.0, 115.0, 122.0, 128.0, 136.0, 145.0, 155.0, 165.0, 175.0, 185.0, 195.0,
            206.0, 218.0, 230.0, 243.0, 258.0, 272.0, 290.0, 307.0, 325.0, 345.0, 365.0, 387.0,
            412.0, 437.0, 462.0, 487.0, 515.0, 545.0, 575.0, 615.0, 650.0, 690.0, 730.0, 775.0,
            825.0, 875.0, 925.0, 975.0,
        ],
        "1-2-5" => &[10.0, 20.0, 50.0],
        "E6" => &[10.0, 15.0, 22.0, 33.0, 47.0, 68.0],
        "E12" => &[
            10.0, 12.0, 15.0, 18.0, 22.0, 27.0, 33.0, 39.0, 47.0, 56.0, 68.0, 82.0,
        ],
        "E24" => &[
            10.0, 11.0, 12.0, 13.0, 15.0, 16.0, 18.0, 20.0, 22.0, 24.0, 27.0, 30.0, 33.0, 36.0,
            39.0, 43.0, 47.0, 51.0, 56.0, 62.0, 68.0, 75.0, 82.0, 91.0,
        ],
        "E48" => &[
            100.0, 105.0, 110.0, 115.0, 121.0, 127.0, 133.0, 140.0, 147.0, 154.0, 162.0, 169.0,
            178.0, 187.0, 196.0, 205.0, 215.0, 226.0, 237.0, 249.0, 261.0, 274.0, 287.0, 301.0,
            316.0, 332.0, 348.0, 365.0, 383.0, 402.0, 422.0, 442.0, 464.0, 487.0, 511.0, 536.0,
            562.0, 590.0, 619.0, 649.0, 681.0, 715.0, 750.0, 787.0, 825.0, 866.0, 909.0, 953.0,
        ],
        "E96" => &[
            100.0, 102.0, 105.0, 107.0, 110.0, 113.0, 115.0, 118.0, 121.0, 124.0, 127.0, 130.0,
            133.0, 137.0, 140.0, 143.0, 147.0, 150.0, 154.0, 158.0, 162.0, 165.0, 169.0, 174.0,
            178.0, 182.0, 187.0, 191.0, 196.0, 200.0, 205.0, 210.0, 215.0, 221.0, 226.0, 232.0,
            237.0, 243.0, 249.0, 255.0, 261.0, 267.0, 274.0, 280.0, 287.0, 294.0, 301.0, 309.0,
            316.0, 324.0, 332.0, 340.0, 348.0, 357.0, 365.0, 374.0, 383.0, 392.0, 402.0, 412.0,
            422.0, 432.0, 442.0, 453.0, 464.0, 475.0, 487.0, 499.0, 511.0, 523.0, 536.0, 549.0,
            562.0, 576.0, 590.0, 604.0, 619.0, 634.0, 649.0, 665.0, 681.0, 698.0, 715.0, 732.0,
            750.0, 768.0, 787.0, 806.0, 825.0, 845.0, 866.0, 887.0, 909.0, 931.0, 953.0, 976.0,
        ],
        "E192" => &[
            100.0, 101.0, 102.0, 104.0, 105.0, 106.0, 107.0, 109.0, 110.0, 111.0, 113.0, 114.0,
            115.0, 117.0, 118.0, 120.0, 121.0, 123.0, 124.0, 126.0, 127.0, 129.0, 130.0, 132.0,
            133.0, 135.0, 137.0, 138.0, 140.0, 142.0, 143.0, 145.0, 147.0, 149.0, 150.0, 152.0,
            154.0, 156.0, 158.0, 160.0, 162.0, 164.0, 165.0, 167.0, 169.0, 172.0, 174.0, 176.0,
            178.0, 180.0, 182.0, 184.0, 187.0, 189.0, 191.0, 193.0, 196.0, 198.0, 200.0, 203.0,
            205.0, 208.0, 210.0, 213.0, 215.0, 218.0, 221.0, 223.0, 226.0, 229.0, 232.0, 234.0,
            237.0, 240.0, 243.0, 246.0, 249.0, 252.0, 255.0, 258.0, 261.0, 264.0, 267.0, 271.0,
            274.0, 277.0, 280.0, 284.0, 287.0, 291.0, 294.0, 298.0, 301.0, 305.0, 309.0, 312.0,
            316.0, 320.0, 324.0, 328.0, 332.0, 336.0, 340.0, 344.0, 348.0, 352.0, 357.0, 361.0,
            365.0, 370.0, 374.0, 379.0, 383.0, 388.0, 392.0, 397.0, 402.0, 407.0, 412.0, 417.0,
            422.0, 427.0, 432.0, 437.0, 442.0, 448.0, 453.0, 459.0, 464.0, 470.0, 475.0, 481.0,
            487.0, 493.0, 499.0, 505.0, 511.0, 517.0, 523.0, 530.0, 536.0, 542.0, 549.0, 556.0,
            562.0, 569.0, 576.0, 583.0, 590.0, 597.0, 604.0, 612.0, 619.0, 626.0, 634.0, 642.0,
            649.0, 657.0, 665.0, 673.0, 681.0, 690.0, 698.0, 706.0, 715.0, 723.0, 732.0, 741.0,
            750.0, 759.0, 768.0, 777.0, 787.0, 796.0, 806.0, 816.0, 825.0, 835.0, 845.0, 856.0,
            866.0, 876.0, 887.0, 898.0, 909.0, 920.0, 931.0, 942.0, 953.0, 965.0, 976.0, 988.0,
        ],
        _ => return None,
    })
}

/// A `$bucketAuto` granularity: a preferred-number series or powers of two.
enum Rounder {
    Series(&'static [f64]),
    PowersOf2,
}

impl Rounder {
    fn parse(name: &str) -> Result<Rounder, EngineError> {
        if name == "POWERSOF2" {
            return Ok(Rounder::PowersOf2);
        }
        granularity_series(name)
            .map(Rounder::Series)
            .ok_or_else(|| err(40257, format!("Unknown rounding granularity '{name}'")))
    }

    fn check(v: &Bson) -> Result<f64, EngineError> {
        if !is_number(v) {
            return Err(err(
                40262,
                format!(
                    "A granularity rounder can only round numeric values, but found type: {}",
                    type_name(v)
                ),
            ));
        }
        let x = to_f64(v);
        if x.is_nan() {
            return Err(err(40263, "A granularity rounder cannot round NaN"));
        }
        if x < 0.0 {
            return Err(err(
                40268,
                "A granularity rounder can only round non-negative numbers",
            ));
        }
        Ok(x)
    }

    /// 2^exp as mongod's `$pow` of two integers gives it: an int while it fits, then a long;
    /// a double for a negative exponent.
    fn two_to(exp: i64) -> Bson {
        if exp < 0 {
            Bson::Double(2f64.powi(exp as i32))
        } else if exp < 31 {
            Bson::Int32(1 << exp)
        } else if exp < 63 {
            Bson::Int64(1 << exp)
        } else {
            Bson::Double(2f64.powi(exp as i32))
        }
    }

    /// The smallest value of the series strictly greater than `v` (`v` itself for 0).
    fn round_up(&self, v: &Bson) -> Result<Bson, EngineError> {
        let x = Self::check(v)?;
        if x == 0.0 {
            return Ok(v.clone());
        }
        match self {
            Rounder::PowersOf2 => Ok(Self::two_to(match v {
                Bson::Int32(_) | Bson::Int64(_) => 64 - (to_f64(v) as i64).leading_zeros() as i64,
                _ => (x.log2().floor() + 1.0) as i64,
            })),
            Rounder::Series(series) => {
                let (first, last) = (series[0], series[series.len() - 1]);
                let mut m = 1.0;
                while x >= last * m {
                    m *= 10.0;
                }
                while x < first * m {
                    let previous_min = first * m;
                    m /= 10.0;
                    if x >= last * m {
                        return Ok(Bson::Double(previous_min));
                    }
                }
                let up = series
                    .iter()
                    .find(|s| x < *s * m)
                    .map_or(last * m, |s| s * m);
                Ok(Bson::Double(up))
            }
        }
    }

    /// The largest value of the series strictly less than `v` (`v` itself for 0).
    fn round_down(&self, v: &Bson) -> Result<Bson, EngineError> {
        let x = Self::check(v)?;
        if x == 0.0 {
            return Ok(v.clone());
        }
        match self {
            Rounder::PowersOf2 => Ok(Self::two_to(match v {
                Bson::Int32(_) | Bson::Int64(_) => {
                    let n = to_f64(v) as i64;
                    let floor = 63 - n.leading_zeros() as i64;
                    if n & (n - 1) == 0 {
                        floor - 1
                    } else {
                        floor
                    }
                }
                _ => (x.log2().ceil() - 1.0) as i64,
            })),
            Rounder::Series(series) => {
                let (first, last) = (series[0], series[series.len() - 1]);
                let mut m = 1.0;
                while x <= first * m {
                    m /= 10.0;
                }
                while x > last * m {
                    let previous_max = last * m;
                    m *= 10.0;
                    if x <= first * m {
                        return Ok(Bson::Double(previous_max));
                    }
                }
                let i = series
                    .iter()
                    .position(|s| s * m >= x)
                    .unwrap_or(series.len());
                Ok(Bson::Double(series[i.saturating_sub(1)] * m))
            }
        }
    }
}

/// `$bucketAuto`: documents sorted by `groupBy` and cut into `buckets` buckets of about the
/// same size (equal values never split), each `{_id: {min, max}}` with its `output`
/// accumulators (`count` by default); with a `granularity`, boundaries are rounded to its
/// series, as mongod computes them.
pub(super) fn bucket_auto(
    spec: &Bson,
    docs: Vec<Document>,
    options: &AggregateOptions,
    cap: usize,
    vars: &Variables,
) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            40240,
            format!(
                "The argument to $bucketAuto must be an object, but found type: {}",
                type_name(spec)
            ),
        ));
    };
    let (mut group_by, mut buckets, mut output, mut rounder) = (None, None, None, None);
    for (k, v) in spec {
        match k.as_str() {
            "groupBy" => {
                let ok = match v {
                    Bson::Document(d) => d.keys().next().is_some_and(|k| k.starts_with('$')),
                    Bson::String(s) => s.len() > 1 && s.starts_with('$'),
                    _ => false,
                };
                if !ok {
                    return Err(err(40239, format!("The $bucketAuto 'groupBy' field must be defined as a $-prefixed path or an expression object, but found: {}", render_value(v))));
                }
                check_expression(v)?;
                group_by = Some(v.clone());
            }
            "buckets" => {
                if !is_number(v) {
                    return Err(err(
                        40241,
                        format!(
                            "The $bucketAuto 'buckets' field must be a numeric value, but found type: {}",
                            type_name(v)
                        ),
                    ));
                }
                let f = to_f64(v);
                if f.fract() != 0.0 || f < i32::MIN as f64 || f > i32::MAX as f64 {
                    return Err(err(40242, format!("The $bucketAuto 'buckets' field must be representable as a 32-bit integer, but found {f}")));
                }
                buckets = Some(f as i64);
            }
            "output" => match v {
                Bson::Document(o) => output = Some(o.clone()),
                other => {
                    return Err(err(
                        40244,
                        format!(
                            "The $bucketAuto 'output' field must be an object, but found type: {}",
                            type_name(other)
                        ),
                    ))
                }
            },
            "granularity" => match v {
                Bson::String(g) => rounder = Some(Rounder::parse(g)?),
                other => {
                    return Err(err(
                        40261,
                        format!(
                        "The $bucketAuto 'granularity' field must be a string, but found type: {}",
                        type_name(other)
                    ),
                    ))
                }
            },
            other => {
                return Err(err(
                    40245,
                    format!("Unrecognized option to $bucketAuto: {other}"),
                ))
            }
        }
    }
    let (Some(group_by), Some(n_buckets)) = (group_by, buckets) else {
        return Err(err(
            40246,
            "$bucketAuto requires 'groupBy' and 'buckets' to be specified",
        ));
    };
    if n_buckets <= 0 {
        return Err(err(
            40243,
            format!(
                "The $bucketAuto 'buckets' field must be greater than 0, but found: {n_buckets}"
            ),
        ));
    }
    let mut group_spec = doc! {"_id": Bson::Null};
    for (k, v) in output.unwrap_or_else(|| doc! {"count": {"$sum": 1}}) {
        group_spec.insert(k, v);
    }
    let group_spec = Bson::Document(group_spec);
    let mut keyed = Vec::with_capacity(docs.len());
    for d in docs {
        let key = eval_with(&group_by, &d, vars)?.unwrap_or(Bson::Null);
        if rounder.is_some() {
            if !is_number(&key) {
                return Err(err(40258, format!("$bucketAuto can specify a 'granularity' with numeric boundaries only, but found a value with type: {}", type_name(&key))));
            }
            let x = to_f64(&key);
            if x.is_nan() {
                return Err(err(40259, "$bucketAuto can specify a 'granularity' with numeric boundaries only, but found a NaN"));
            }
            if x < 0.0 {
                return Err(err(40260, "$bucketAuto can specify a 'granularity' with non-negative numbers only, but found a negative number"));
            }
        }
        keyed.push((key, d));
    }
    // A stable sort: equal keys keep their input order.
    keyed.sort_by(|a, b| compare(&a.0, &b.0));
    let total = keyed.len();
    let approx = ((total as f64 / n_buckets as f64).round() as usize).max(1);
    let mut input = keyed.into_iter().peekable();
    let mut out = Sink::new("$bucketAuto", cap);
    let mut previous_max: Option<Bson> = None;
    let mut bucket_num = 0i64;
    while input.peek().is_some() && bucket_num < n_buckets {
        bucket_num += 1;
        let last_bucket = bucket_num == n_buckets;
        let Some((first_key, first_doc)) = input.next() else {
            break;
        };
        let mut min = first_key.clone();
        if let Some(r) = &rounder {
            min = match previous_max.take() {
                Some(p) => p,
                None => r.round_down(&first_key)?,
            };
        }
        let mut max = first_key;
        let mut members = vec![first_doc];
        while members.len() < approx || last_bucket {
            match input.next() {
                Some((k, d)) => {
                    max = k;
                    members.push(d);
                }
                None => break,
            }
        }
        match &rounder {
            Some(r) => {
                let boundary = r.round_up(&max)?;
                while let Some((k, _)) = input.peek() {
                    if compare(&boundary, k).is_gt() || compare(&max, k).is_eq() {
                        if let Some((k, d)) = input.next() {
                            max = k;
                            members.push(d);
                        }
                    } else {
                        break;
                    }
                }
                max = match input.peek() {
                    Some((next, _)) if to_f64(&boundary) == 0.0 => r.round_down(next)?,
                    _ => boundary,
                };
                previous_max = Some(max.clone());
            }
            None => {
                while let Some((k, _)) = input.peek() {
                    if compare(&max, k).is_eq() {
                        if let Some((_, d)) = input.next() {
                            members.push(d);
                        }
                    } else {
                        break;
                    }
                }
                if let Some((next, _)) = input.peek() {
                    max = next.clone();
                }
            }
        }
        for mut g in group(&group_spec, members, options, cap, vars)? {
            g.insert("_id", doc! {"min": min.clone(), "max": max.clone()});
            out.push(g)?;
        }
    }
    Ok(out.docs)
}

/// `$graphLookup`: for each document, a breadth-first search of another collection from
/// `startWith` along `connectFromField` → `connectToField` (to `maxDepth` hops, among the
/// documents `restrictSearchWithMatch` selects), every document reached once, in `as` (with
/// its hop count as a long in `depthField`). The order of `as` is unspecified, as mongod's.
pub(super) fn graph_lookup(
    spec: &Bson,
    docs: Vec<Document>,
    env: &Env,
    cap: usize,
) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            crate::value::error_codes::ErrorCode::FailedToParse.0,
            format!(
                "the $graphLookup stage specification must be an object, but found {}",
                type_name(spec)
            ),
        ));
    };
    let (mut from, mut as_field, mut connect_from, mut connect_to, mut depth_field) =
        (None, None, None, None, None);
    let (mut start_with, mut max_depth, mut restrict) = (None, None, None);
    for (k, v) in spec {
        match k.as_str() {
            "startWith" => {
                check_expression(v)?;
                start_with = Some(v.clone());
            }
            "maxDepth" => {
                if !is_number(v) {
                    return Err(err(
                        40100,
                        format!("maxDepth must be numeric, found type: {}", type_name(v)),
                    ));
                }
                let f = to_f64(v);
                if f < 0.0 {
                    return Err(err(
                        40101,
                        format!(
                            "maxDepth requires a nonnegative argument, found: {}",
                            render_value(v)
                        ),
                    ));
                }
                if f.fract() != 0.0 || f >= 9.223_372_036_854_776e18 {
                    return Err(err(
                        40102,
                        format!(
                            "maxDepth could not be represented as a long long: {}",
                            render_value(v)
                        ),
                    ));
                }
                max_depth = Some(f as i64);
            }
            "restrictSearchWithMatch" => match v {
                Bson::Document(d) => restrict = Some(Matcher::parse(d)?),
                other => {
                    return Err(err(
                        40185,
                        format!(
                            "restrictSearchWithMatch must be an object, found {}",
                            type_name(other)
                        ),
                    ))
                }
            },
            "from" | "as" | "connectFromField" | "connectToField" | "depthField" => {
                let Bson::String(s) = v else {
                    return Err(err(
                        40103,
                        format!(
                            "expected string as argument for {k}, found: {}",
                            render_value(v)
                        ),
                    ));
                };
                if k != "from" {
                    crate::engine::path::check_field_path(s)?;
                }
                let slot = match k.as_str() {
                    "from" => &mut from,
                    "as" => &mut as_field,
                    "connectFromField" => &mut connect_from,
                    "connectToField" => &mut connect_to,
                    _ => &mut depth_field,
                };
                *slot = Some(s.clone());
            }
            other => {
                return Err(err(
                    40104,
                    format!("Unknown argument to $graphLookup: {other}"),
                ))
            }
        }
    }
    let missing = [
        ("from", from.is_none()),
        ("as", as_field.is_none()),
        ("startWith", start_with.is_none()),
        ("connectFromField", connect_from.is_none()),
        ("connectToField", connect_to.is_none()),
    ]
    .into_iter()
    .find(|(_, m)| *m);
    let (Some(from), Some(as_field), Some(start_with), Some(connect_from), Some(connect_to)) =
        (from, as_field, start_with, connect_from, connect_to)
    else {
        return Err(err(
            40105,
            format!(
                "missing '{}' option to $graphLookup stage specification: {}",
                missing.map_or("from", |(k, _)| k),
                crate::value::render::render_doc(spec)
            ),
        ));
    };
    let foreign: Vec<Document> = foreign_documents(env, &from)?
        .into_iter()
        .filter(|d| restrict.as_ref().is_none_or(|m| m.matches(d)))
        .collect();
    let mut out = Sink::new("$graphLookup", cap);
    for mut d in docs {
        let start = eval_with(&start_with, &d, &env.vars)?.unwrap_or(Bson::Null);
        let mut frontier: Vec<Bson> = match start {
            Bson::Array(items) => items,
            v => vec![v],
        };
        let mut seen: std::collections::BTreeSet<OrdBson> = Default::default();
        let mut found: Vec<Document> = Vec::new();
        let mut depth = 0i64;
        while !frontier.is_empty() && max_depth.is_none_or(|m| depth <= m) {
            let m =
                Matcher::parse(&doc! {connect_to.clone(): {"$in": std::mem::take(&mut frontier)}})?;
            let mut next: std::collections::BTreeSet<OrdBson> = Default::default();
            for f in foreign.iter().filter(|x| m.matches(x)) {
                let id = OrdBson(f.get("_id").cloned().unwrap_or(Bson::Null));
                if !seen.insert(id) {
                    continue;
                }
                for v in crate::engine::path::lookup(f, &connect_from).expanded() {
                    next.insert(OrdBson(v.clone()));
                }
                let mut f = f.clone();
                if let Some(df) = &depth_field {
                    crate::engine::path::set(&mut f, df, Bson::Int64(depth))?;
                }
                found.push(f);
            }
            frontier = next.into_iter().map(|v| v.0).collect();
            depth += 1;
        }
        crate::engine::path::set(
            &mut d,
            &as_field,
            Bson::Array(found.into_iter().map(Bson::Document).collect()),
        )?;
        out.push(d)?;
    }
    Ok(out.docs)
}

#[cfg(test)]
mod tests {
    use super::super::aggregate::run;
    use super::*;

    fn docs() -> Vec<Document> {
        (0..6)
            .map(|i| doc! {"_id": i, "g": i % 2, "v": i * 10})
            .collect()
    }

    fn one(stage: Document) -> Result<Vec<Document>, EngineError> {
        run(&[Bson::Document(stage)], docs())
    }

    fn code(stage: Document) -> i32 {
        one(stage).unwrap_err().code.0
    }

    #[test]
    fn malformed_stages_have_mongod_codes() {
        assert_eq!(code(doc! {"$replaceRoot": {"newRoot": "$v"}}), 40228);
        assert_eq!(code(doc! {"$replaceRoot": {}}), 40231);
        assert_eq!(code(doc! {"$replaceRoot": {"x": 1}}), 40230);
        assert_eq!(code(doc! {"$bucket": {"groupBy": "$v"}}), 40198);
        assert_eq!(
            code(doc! {"$bucket": {"groupBy": "$v", "boundaries": [0]}}),
            40192
        );
        assert_eq!(
            code(doc! {"$bucket": {"groupBy": "$v", "boundaries": [0, "a"]}}),
            40193
        );
        assert_eq!(
            code(doc! {"$bucket": {"groupBy": "$v", "boundaries": [0, 10]}}),
            40066
        );
        assert_eq!(
            code(doc! {"$bucket": {"groupBy": "$v", "boundaries": [0, 100], "default": 5}}),
            40199
        );
        assert_eq!(code(doc! {"$facet": {}}), 40169);
        assert_eq!(code(doc! {"$facet": {"a": [{"$out": "x"}]}}), 40600);
        assert_eq!(code(doc! {"$sample": {}}), 28749);
        assert_eq!(code(doc! {"$sample": {"size": -1}}), 28747);
        assert_eq!(code(doc! {"$sample": {"size": 1, "x": 1}}), 28748);
        assert_eq!(code(doc! {"$sortByCount": 1}), 40148);
        assert_eq!(code(doc! {"$lookup": {"from": "x", "as": "y"}}), 9);
        assert_eq!(
            code(doc! {"$out": "x"}),
            40601,
            "$out is written by the server, not the engine"
        );
        assert_eq!(
            code(doc! {"$setWindowFields": {"output": {"r": {"$rank": {}}}}}),
            5371601
        );
    }

    #[test]
    fn bucket_facet_sample_and_windows() {
        let out = one(doc! {"$bucket": {"groupBy": "$v", "boundaries": [0, 25, 100]}}).unwrap();
        assert_eq!(
            out,
            vec![doc! {"_id": 0, "count": 3}, doc! {"_id": 25, "count": 3}]
        );
        let out =
            one(doc! {"$facet": {"n": [{"$count": "n"}], "g": [{"$sortByCount": "$g"}]}}).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0].get_array("n").unwrap()[0],
            Bson::Document(doc! {"n": 6})
        );
        assert_eq!(out[0].get_array("g").unwrap().len(), 2);
        assert_eq!(one(doc! {"$sample": {"size": 4}}).unwrap().len(), 4);
        assert_eq!(one(doc! {"$sample": {"size": 40}}).unwrap().len(), 6);
        let out = one(
            doc! {"$setWindowFields": {"partitionBy": "$g", "sortBy": {"v": 1}, "output": {
                "run": {"$sum": "$v", "window": {"documents": ["unbounded", "current"]}},
                "near": {"$sum": 1, "window": {"range": [-20, 0]}},
                "n": {"$documentNumber": {}},
                "dense": {"$denseRank": {}},
            }}},
        )
        .unwrap();
        let even: Vec<&Document> = out
            .iter()
            .filter(|d| d.get_i32("g").unwrap() == 0)
            .collect();
        let runs: Vec<i32> = even.iter().map(|d| d.get_i32("run").unwrap()).collect();
        assert_eq!(runs, vec![0, 20, 60]);
        let near: Vec<i32> = even.iter().map(|d| d.get_i32("near").unwrap()).collect();
        assert_eq!(near, vec![1, 2, 2], "v within 20 below: 0 | 0,20 | 20,40");
        let n: Vec<i64> = even.iter().map(|d| d.get_i64("n").unwrap()).collect();
        assert_eq!(n, vec![1, 2, 3]);
    }

    #[test]
    fn n_accumulators_over_windows() {
        let out = one(
            doc! {"$setWindowFields": {"partitionBy": "$g", "sortBy": {"v": 1}, "output": {
                "last2": {"$lastN": {"input": "$v", "n": 2}, "window": {"documents": ["unbounded", "current"]}},
                "first2": {"$firstN": {"input": "$v", "n": 2}, "window": {"documents": ["current", "unbounded"]}},
                "max2": {"$maxN": {"input": "$v", "n": 2}, "window": {"documents": [-1, 1]}},
                "min1": {"$minN": {"input": "$v", "n": 1}},
                "top": {"$top": {"output": "$_id", "sortBy": {"v": -1}}},
                "bottom2": {"$bottomN": {"output": "$v", "sortBy": {"v": -1}, "n": 2}, "window": {"documents": ["unbounded", "current"]}},
            }}},
        )
        .unwrap();
        let even: Vec<&Document> = out
            .iter()
            .filter(|d| d.get_i32("g").unwrap() == 0)
            .collect();
        let arrays =
            |f: &str| -> Vec<Bson> { even.iter().map(|d| d.get(f).unwrap().clone()).collect() };
        let ints = |xs: &[&[i32]]| -> Vec<Bson> {
            xs.iter()
                .map(|x| Bson::Array(x.iter().map(|v| Bson::Int32(*v)).collect()))
                .collect()
        };
        assert_eq!(arrays("last2"), ints(&[&[0], &[0, 20], &[20, 40]]));
        assert_eq!(arrays("first2"), ints(&[&[0, 20], &[20, 40], &[40]]));
        assert_eq!(arrays("max2"), ints(&[&[20, 0], &[40, 20], &[40, 20]]));
        assert_eq!(arrays("min1"), ints(&[&[0], &[0], &[0]]));
        assert_eq!(arrays("top"), vec![Bson::Int32(4); 3]);
        // Sorted by v descending within the window, the last two.
        assert_eq!(arrays("bottom2"), ints(&[&[0], &[20, 0], &[20, 0]]));
        // The argument's errors are $group's, before any document is read.
        let bad =
            |f: Document| code(doc! {"$setWindowFields": {"sortBy": {"v": 1}, "output": {"x": f}}});
        assert_eq!(bad(doc! {"$maxN": {"input": "$v", "n": 0}}), 5787908);
        assert_eq!(bad(doc! {"$topN": {"output": "$v", "n": 1}}), 5788003);
        assert_eq!(bad(doc! {"$firstN": {"input": "$v"}}), 5787906);
    }

    #[test]
    fn redact_descends_and_prunes() {
        let out = run(
            &[
                Bson::Document(doc! {"$documents": [{"_id": 1, "lvl": 1, "sub": {"lvl": 5, "x": 1}, "keep": {"lvl": 0}}]}),
                Bson::Document(doc! {"$redact": {"$cond": [{"$gt": ["$lvl", 2]}, "$$PRUNE", "$$DESCEND"]}}),
            ],
            Vec::new(),
        )
        .unwrap();
        assert_eq!(out, vec![doc! {"_id": 1, "lvl": 1, "keep": {"lvl": 0}}]);
    }
}
