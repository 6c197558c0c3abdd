//! Aggregation pipelines, shared by the embedded shard and the router's merge: the runner
//! ([`run_in`], with its [`Env`]: database, [`Variables`], the other collections `$lookup`
//! and `$unionWith` read), the stages `$match $project $addFields/$set $unset $sort $skip
//! $limit $group $count $unwind $documents` (the others are in [`super::stages`]; `$out` and
//! `$merge` in [`super::output`]), and the expression evaluator with the system variables
//! (`$$ROOT`, `$$CURRENT`, `$$NOW`, `$$CLUSTER_TIME`, `$$REMOVE`) and the core operators (the
//! other families are in [`super::expressions`]). Unknown stages and expressions are errors
//! naming them.
//!
//! The engine holds each stage's output in memory, so every stage is bounded: each document it
//! produces must encode within 16 MiB plus mongod's internal margin (BSONObjectTooLarge, 10334)
//! and nest at most [`MAX_RESULT_DEPTH`] levels (Overflow, 15); a blocking stage (`$sort`,
//! `$group`) may hold at most [`AggregateOptions::stage_memory`] bytes unless the request opted
//! in with `allowDiskUse: true`, and no stage may produce more than that limit or its input,
//! whichever is larger, at all (QueryExceededMemoryLimitNoDiskUseAllowed, 292): the engine
//! cannot spill to disk. Expressions are evaluated against a byte budget, so one expression
//! cannot copy a document a million times before the size check sees it. Arithmetic is checked
//! and gives MongoDB's results at the edges (`$mod` of the smallest long by -1 is 0, an int
//! overflow widens to a long and a long overflow to a double, `$mod` by zero is 16610).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bson::{Bson, Document};

use super::matcher::Matcher;
use super::path;
use super::query::{Projection, SortSpec};
use super::EngineError;
use crate::limits::{
    measure, measure_value, DEFAULT_STAGE_MEMORY_BYTES, MAX_INTERNAL_DOCUMENT_SIZE,
    MAX_RESULT_DEPTH,
};
use crate::value::compare::{compare, values_equal, OrdBson};
use crate::value::decimal::{any_decimal, decimal_arithmetic, decimal_mean, Dec, DecError, Op};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{arithmetic, as_int, int_result, is_number, to_f64, truthy};

pub(super) fn err(code: i32, msg: impl Into<String>) -> EngineError {
    EngineError::new(ErrorCode(code), msg)
}

/// How much memory a pipeline may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AggregateOptions {
    /// Bytes a blocking stage may hold without `allowDiskUse` (100 MiB by default, as mongod).
    pub stage_memory: usize,
    /// The request's `allowDiskUse: true`: blocking stages may go past `stage_memory` (up to
    /// the size of the pipeline's input, since nothing is spilled).
    pub allow_disk_use: bool,
}

impl Default for AggregateOptions {
    fn default() -> Self {
        AggregateOptions {
            stage_memory: DEFAULT_STAGE_MEMORY_BYTES,
            allow_disk_use: false,
        }
    }
}

impl AggregateOptions {
    /// The limits a request asks for: `allowDiskUse` read from its body.
    pub fn for_request(stage_memory: usize, body: &Document) -> AggregateOptions {
        AggregateOptions {
            stage_memory,
            allow_disk_use: matches!(body.get("allowDiskUse"), Some(Bson::Boolean(true))),
        }
    }
}

/// The error for a document that would not encode within mongod's internal size limit.
fn too_large(size: usize) -> EngineError {
    err(
        ErrorCode::BSONObjectTooLarge.0,
        format!(
            "BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and {MAX_INTERNAL_DOCUMENT_SIZE}(16MB)"
        ),
    )
}

/// Collects one stage's output, checking each document and the stage's total.
pub(super) struct Sink {
    /// The documents collected.
    pub(super) docs: Vec<Document>,
    bytes: usize,
    /// Bytes the stage may produce at most.
    cap: usize,
    stage: &'static str,
}

impl Sink {
    pub(super) fn new(stage: &'static str, cap: usize) -> Sink {
        Sink {
            docs: Vec::new(),
            bytes: 0,
            cap,
            stage,
        }
    }

    pub(super) fn push(&mut self, d: Document) -> Result<(), EngineError> {
        let m = measure(&d);
        if m.depth > MAX_RESULT_DEPTH {
            return Err(err(
                ErrorCode::Overflow.0,
                format!("cannot convert document to BSON because it exceeds the limit of {MAX_RESULT_DEPTH} levels of nesting"),
            ));
        }
        if m.bytes > MAX_INTERNAL_DOCUMENT_SIZE {
            return Err(too_large(m.bytes));
        }
        self.bytes += m.bytes;
        if self.bytes > self.cap {
            return Err(over_memory(self.stage, self.cap));
        }
        self.docs.push(d);
        Ok(())
    }
}

fn over_memory(stage: &str, cap: usize) -> EngineError {
    err(
        ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed.0,
        format!("Exceeded memory limit of {cap} bytes in {stage}; the embedded engine holds each stage's output in memory and cannot spill it to disk"),
    )
}

fn total_bytes(docs: &[Document]) -> usize {
    docs.iter().map(|d| measure(d).bytes).sum()
}

/// Runs `pipeline` over `docs` with the default limits.
pub fn run(pipeline: &[Bson], docs: Vec<Document>) -> Result<Vec<Document>, EngineError> {
    run_with(pipeline, docs, &AggregateOptions::default())
}

/// Runs `pipeline` over `docs` within `options`' memory limits.
pub fn run_with(
    pipeline: &[Bson],
    docs: Vec<Document>,
    options: &AggregateOptions,
) -> Result<Vec<Document>, EngineError> {
    run_in(pipeline, docs, options, &Env::default())
}

/// Where a pipeline reads other collections (`$lookup`, `$unionWith`): the embedded shard
/// from its catalog, the router from what it fetched through itself beforehand.
pub trait Namespaces: Sync {
    /// Every document of `db.coll` (none when it does not exist).
    fn documents(&self, db: &str, coll: &str) -> Result<Vec<Document>, EngineError>;
}

/// The collections (of the pipeline's database) its `$lookup`/`$graphLookup`/`$unionWith`
/// stages read, at any depth (inside `$facet` and sub-pipelines): what a server must be able
/// to read, whole, for the pipeline to run. A `from: {db, coll}` names `coll` of the
/// pipeline's database, which is where the stages read it ([`Namespaces::documents`]).
pub fn foreign_collections(pipeline: &[Bson]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    collect_foreign(pipeline, &mut out);
    out
}

fn collect_foreign(pipeline: &[Bson], out: &mut BTreeSet<String>) {
    for stage in pipeline {
        let Some((name, spec)) = stage.as_document().and_then(|d| d.iter().next()) else {
            continue;
        };
        match (name.as_str(), spec) {
            ("$lookup", Bson::Document(d)) => {
                match d.get("from") {
                    Some(Bson::String(s)) => {
                        out.insert(s.clone());
                    }
                    Some(Bson::Document(f)) => {
                        if let Ok(c) = f.get_str("coll") {
                            out.insert(c.to_string());
                        }
                    }
                    _ => {}
                }
                if let Ok(p) = d.get_array("pipeline") {
                    collect_foreign(p, out);
                }
            }
            ("$graphLookup", Bson::Document(d)) => {
                if let Ok(s) = d.get_str("from") {
                    out.insert(s.to_string());
                }
            }
            ("$unionWith", Bson::String(s)) => {
                out.insert(s.clone());
            }
            ("$unionWith", Bson::Document(d)) => {
                if let Ok(c) = d.get_str("coll") {
                    out.insert(c.to_string());
                }
                if let Ok(p) = d.get_array("pipeline") {
                    collect_foreign(p, out);
                }
            }
            ("$facet", Bson::Document(d)) => {
                for p in d.values() {
                    if let Bson::Array(p) = p {
                        collect_foreign(p, out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// What a pipeline runs in: its database, its variables (`$$NOW`, the request's `let`) and
/// the collections `$lookup` and `$unionWith` may read.
#[derive(Default)]
pub struct Env<'a> {
    /// The database of the aggregated collection.
    pub db: String,
    /// Variables.
    pub vars: Variables,
    /// Other collections; `None` refuses `$lookup`/`$unionWith` of a collection.
    pub namespaces: Option<&'a dyn Namespaces>,
}

impl Env<'_> {
    /// The same environment with other variables (a `$lookup` sub-pipeline's `let`).
    pub(super) fn with_vars(&self, vars: Variables) -> Env<'_> {
        Env {
            db: self.db.clone(),
            vars,
            namespaces: self.namespaces,
        }
    }
}

/// Runs `pipeline` over `docs` in `env`, within `options`' memory limits. `$out` and `$merge`
/// are refused here: the server that owns the target runs them ([`super::output`]).
pub fn run_in(
    pipeline: &[Bson],
    mut docs: Vec<Document>,
    options: &AggregateOptions,
    env: &Env,
) -> Result<Vec<Document>, EngineError> {
    let vars = &env.vars;
    // No stage may produce more than the pipeline's input or the stage limit, whichever is
    // larger: that bounds what one request can make the engine hold.
    let mut input_bytes = total_bytes(&docs);
    let cap = input_bytes.max(options.stage_memory);
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
                let m = Matcher::parse_with(f, vars)?;
                docs.into_iter().filter(|d| m.matches(d)).collect()
            }
            "$project" => project(spec, docs, cap, vars)?,
            "$addFields" | "$set" => {
                let Bson::Document(fields) = spec else {
                    return Err(err(
                        40272,
                        format!("{name} specification stage must be an object"),
                    ));
                };
                for (k, e) in fields {
                    path::check_field_path(k)?;
                    check_expression(e)?;
                }
                let mut out = Sink::new("$addFields", cap);
                for mut d in docs {
                    for (k, e) in fields {
                        match eval_with(e, &d, vars)? {
                            Some(v) => path::set(&mut d, k, v)?,
                            None => {
                                path::unset(&mut d, k);
                            }
                        }
                    }
                    out.push(d)?;
                }
                out.docs
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
                for f in &fields {
                    path::check_field_path(f)?;
                }
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
                let s = SortSpec::parse(s)?.with_collation(vars.collation().cloned());
                if !options.allow_disk_use && input_bytes > options.stage_memory {
                    return Err(err(
                        ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed.0,
                        format!("Sort exceeded memory limit of {} bytes, but did not opt in to external sorting.", options.stage_memory),
                    ));
                }
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
            "$group" => group(spec, docs, options, cap, vars)?,
            "$documents" => documents(spec, cap, vars)?,
            "$unwind" => unwind(spec, docs, cap)?,
            "$replaceRoot" | "$replaceWith" => {
                super::stages::replace_root(name, spec, docs, cap, vars)?
            }
            "$sortByCount" => super::stages::sort_by_count(spec, docs, options, cap, vars)?,
            "$bucket" => super::stages::bucket(spec, docs, options, cap, vars)?,
            "$bucketAuto" => super::stages::bucket_auto(spec, docs, options, cap, vars)?,
            "$graphLookup" => super::stages::graph_lookup(spec, docs, env, cap)?,
            "$facet" => super::stages::facet(spec, docs, options, env)?,
            "$sample" => super::stages::sample(spec, docs)?,
            "$lookup" => super::stages::lookup(spec, docs, options, env, cap)?,
            "$unionWith" => super::stages::union_with(spec, docs, options, env, cap)?,
            "$setWindowFields" => super::stages::set_window_fields(spec, docs, cap, vars)?,
            "$redact" => super::stages::redact(spec, docs, vars)?,
            "$densify" => super::fill::densify(spec, docs, cap)?,
            "$fill" => run_in(&super::fill::fill_stages(spec)?, docs, options, env)?,
            "$out" | "$merge" => {
                return Err(err(
                    40601,
                    format!("{name} can only be the final stage in the pipeline"),
                ))
            }
            other => {
                return Err(err(
                    40324,
                    format!("Unrecognized pipeline stage name: '{other}'"),
                ))
            }
        };
        input_bytes = total_bytes(&docs);
    }
    Ok(docs)
}

pub(super) fn non_negative(v: &Bson, stage: &str) -> Result<usize, EngineError> {
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

/// Checks the field paths an expression names (`"$a.b"`) before it is evaluated, as mongod
/// parses expressions before running them. Recursion follows the expression, whose nesting
/// the wire codec has bounded.
pub(super) fn check_expression(e: &Bson) -> Result<(), EngineError> {
    match e {
        Bson::String(s) if s.starts_with('$') && !s.starts_with("$$") => {
            path::check_field_path(&s[1..])
        }
        Bson::Document(d) => {
            if d.len() == 1 && d.contains_key("$literal") {
                return Ok(());
            }
            d.values().try_for_each(check_expression)
        }
        Bson::Array(items) => items.iter().try_for_each(check_expression),
        _ => Ok(()),
    }
}

/// `$documents: <expr>`: mongod reads it as `$project: {<gen>: <expr>}` on one empty document,
/// then a strict `$unwind` and a `$replaceRoot`. So the value is an expression evaluated with
/// no document (`[{a: {$add: [1, 2]}}]` gives `{a: 3}`, `{$map: ...}` is accepted); anything
/// that is not an array, including a sub-projection (`{a: 1}`), a field path or an inclusion
/// flag, fails the strict unwind (5858203); an element that is not an object fails the
/// replacement (40228).
fn documents(spec: &Bson, cap: usize, vars: &Variables) -> Result<Vec<Document>, EngineError> {
    let not_an_array = || err(5858203, "an array is expected");
    let value = match spec {
        Bson::Document(d) if !d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            return Err(not_an_array())
        }
        Bson::Boolean(_)
        | Bson::Int32(_)
        | Bson::Int64(_)
        | Bson::Double(_)
        | Bson::Decimal128(_) => return Err(not_an_array()),
        e => {
            check_expression(e)?;
            eval_with(e, &Document::new(), vars)?
        }
    };
    let Some(Bson::Array(items)) = value else {
        return Err(not_an_array());
    };
    let mut out = Sink::new("$documents", cap);
    for item in items {
        match item {
            Bson::Document(d) => out.push(d)?,
            v => {
                return Err(err(
                    40228,
                    format!(
                        "'newRoot' expression must evaluate to an object, but resulting value was: {}. Type of resulting value: '{}'.",
                        crate::value::render::render_value(&v),
                        crate::value::field::type_name(&v)
                    ),
                ))
            }
        }
    }
    Ok(out.docs)
}

fn project(
    spec: &Bson,
    docs: Vec<Document>,
    cap: usize,
    vars: &Variables,
) -> Result<Vec<Document>, EngineError> {
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
    for (k, v) in spec {
        path::check_field_path(k)?;
        check_expression(v)?;
    }
    // Inclusion with computed fields.
    let include_id = !matches!(
        spec.get("_id"),
        Some(Bson::Int32(0) | Bson::Boolean(false) | Bson::Int64(0))
    );
    let mut sink = Sink::new("$project", cap);
    for d in &docs {
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
                    if let Some(val) = eval_with(e, d, vars)? {
                        path::set(&mut out, k, val)?;
                    }
                }
            }
        }
        sink.push(out)?;
    }
    Ok(sink.docs)
}

fn unwind(spec: &Bson, docs: Vec<Document>, cap: usize) -> Result<Vec<Document>, EngineError> {
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
    path::check_field_path(&field)?;
    check_unwind_path(&field)?;
    let mut out = Sink::new("$unwind", cap);
    for d in docs {
        match path::get(&d, &field).cloned() {
            Some(Bson::Array(items)) if !items.is_empty() => {
                for (i, item) in items.into_iter().enumerate() {
                    let mut nd = d.clone();
                    path::set(&mut nd, &field, item)?;
                    if let Some(ix) = &index_field {
                        nd.insert(ix.clone(), i as i64);
                    }
                    out.push(nd)?;
                }
            }
            Some(Bson::Array(_)) | None | Some(Bson::Null) => {
                if preserve {
                    let mut nd = d.clone();
                    if let Some(ix) = &index_field {
                        nd.insert(ix.clone(), Bson::Null);
                    }
                    out.push(nd)?;
                }
            }
            Some(_) => {
                let mut nd = d.clone();
                if let Some(ix) = &index_field {
                    nd.insert(ix.clone(), Bson::Null);
                }
                out.push(nd)?;
            }
        }
    }
    Ok(out.docs)
}

/// The field path of `$unwind` (its `$` removed) as mongod's `FieldPath` reads it: not empty,
/// no empty part, no part starting with `$` (`"$$var"` names a variable, not a field), no NUL.
fn check_unwind_path(field: &str) -> Result<(), EngineError> {
    if field.is_empty() {
        return Err(err(
            40352,
            "FieldPath cannot be constructed with empty string",
        ));
    }
    for part in field.split('.') {
        if part.is_empty() {
            return Err(err(
                15998,
                "FieldPath field names may not be empty strings.",
            ));
        }
        if part.starts_with('$') {
            return Err(err(
                16410,
                "FieldPath field names may not start with '$'. Consider using $getField or $setField.",
            ));
        }
        if part.contains('\0') {
            return Err(err(16411, "FieldPath field names may not contain '\\0'."));
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Acc {
    Sum(Bson),
    /// The double sum, the count, and the exact sum that decides (and, once a decimal was
    /// seen, gives) a decimal result.
    Avg(f64, u64, Bson),
    Min(Option<Bson>),
    Max(Option<Bson>),
    First(Option<Bson>),
    Last(Bson),
    Push(Vec<Bson>),
    AddToSet(BTreeSet<OrdBson>),
    /// `$stdDevPop`/`$stdDevSamp`: count, mean and sum of squared deviations (Welford).
    StdDev(f64, f64, f64),
    MergeObjects(Document),
    /// The N accumulators and `$top`/`$bottom`: the candidates so far (source document for a
    /// `sortBy`, value), pruned to the best `n` as they grow.
    Many(Vec<(Document, Bson)>),
}

/// How an N accumulator (`$firstN $lastN $maxN $minN $topN $bottomN`, and `$top`/`$bottom`
/// with n = 1) picks: its `n`, its `sortBy` and the expression it outputs.
struct NSpec {
    n: usize,
    sort: Option<crate::engine::query::SortSpec>,
    output: Bson,
}

/// Parses an N accumulator's argument (mongod's codes: 5787900–5787908, 5788000–5788005).
fn n_spec(op: &str, arg: &Bson, vars: &Variables) -> Result<NSpec, EngineError> {
    let Bson::Document(a) = arg else {
        return Err(err(
            5787900,
            format!(
                "specification must be an object; found {}",
                crate::value::field::type_name(arg)
            ),
        ));
    };
    let ranked = matches!(op, "$top" | "$bottom" | "$topN" | "$bottomN");
    let input_name = if ranked { "output" } else { "input" };
    let takes_n = !matches!(op, "$top" | "$bottom");
    for k in a.keys() {
        let known = k == input_name || (k == "n" && takes_n) || (k == "sortBy" && ranked);
        if !known {
            return Err(err(
                5787901,
                format!("Unknown argument for '{op}' operator: {k}"),
            ));
        }
    }
    let n = if takes_n {
        let Some(n) = a.get("n") else {
            return Err(err(5787906, format!("Missing value for 'n' to '{op}'")));
        };
        check_expression(n)?;
        let n = eval_with(n, &Document::new(), vars)?.unwrap_or(Bson::Null);
        let v = match n {
            Bson::Int32(i) => i as i64,
            Bson::Int64(i) => i,
            Bson::Double(f) if f.fract() == 0.0 => f as i64,
            ref other => {
                return Err(err(
                    5787902,
                    format!(
                        "Value for 'n' must be of integral type, but found {}",
                        crate::value::render::render_value(other)
                    ),
                ))
            }
        };
        if v <= 0 {
            return Err(err(
                5787908,
                format!("'n' must be greater than 0, found {v}"),
            ));
        }
        v.min(1 << 20) as usize
    } else {
        1
    };
    let Some(output) = a.get(input_name) else {
        return Err(err(
            5787907,
            format!("Missing value for '{input_name}' to '{op}'"),
        ));
    };
    check_expression(output)?;
    let sort = if ranked {
        match a.get("sortBy") {
            Some(Bson::Document(s)) => Some(crate::engine::query::SortSpec::parse(s)?),
            Some(_) => {
                return Err(err(
                    5788004,
                    format!("'sortBy' must be an object for '{op}'"),
                ));
            }
            None => {
                return Err(err(
                    5788003,
                    format!("Missing value for 'sortBy' to '{op}'"),
                ))
            }
        }
    } else {
        None
    };
    Ok(NSpec {
        n,
        sort,
        output: output.clone(),
    })
}

/// Keeps the best `spec.n` candidates of an N accumulator (all of them for `$firstN`, which
/// stops taking, and `$lastN`, which keeps the latest).
fn prune(op: &str, spec: &NSpec, items: &mut Vec<(Document, Bson)>, last: bool) {
    let n = spec.n;
    if !last && items.len() <= 2 * n + 16 {
        return;
    }
    match op {
        "$firstN" => items.truncate(n),
        "$lastN" => {
            let drop = items.len().saturating_sub(n);
            items.drain(..drop);
        }
        "$maxN" | "$minN" => {
            items.sort_by(|a, b| {
                let o = compare(&a.1, &b.1);
                if op == "$maxN" {
                    o.reverse()
                } else {
                    o
                }
            });
            items.truncate(n);
        }
        _ => {
            if let Some(sort) = &spec.sort {
                items.sort_by(|a, b| sort.compare(&a.0, &b.0));
            }
            if matches!(op, "$top" | "$topN") {
                items.truncate(n);
            } else {
                let drop = items.len().saturating_sub(n);
                items.drain(..drop);
            }
        }
    }
}

/// An N accumulator (`$firstN $lastN $maxN $minN $topN $bottomN`, `$top`, `$bottom`) over
/// `docs` in their order: what `$setWindowFields` computes for one window, the same picks as
/// `$group`'s.
pub(super) fn n_accumulate(
    op: &str,
    arg: &Bson,
    docs: &[Document],
    vars: &Variables,
) -> Result<Bson, EngineError> {
    let spec = n_spec(op, arg, vars)?;
    let mut items: Vec<(Document, Bson)> = Vec::new();
    for d in docs {
        if op == "$firstN" && items.len() >= spec.n {
            break;
        }
        let v = eval_with(&spec.output, d, vars)?;
        if matches!(op, "$maxN" | "$minN")
            && v.as_ref()
                .is_none_or(|v| matches!(v, Bson::Null | Bson::Undefined))
        {
            continue;
        }
        let source = if spec.sort.is_some() {
            d.clone()
        } else {
            Document::new()
        };
        items.push((source, v.unwrap_or(Bson::Null)));
        prune(op, &spec, &mut items, false);
    }
    prune(op, &spec, &mut items, true);
    let mut values = items.into_iter().map(|(_, v)| v);
    Ok(if matches!(op, "$top" | "$bottom") {
        values.next().unwrap_or(Bson::Null)
    } else {
        Bson::Array(values.collect())
    })
}

/// Whether `op` is one of the N accumulators or `$top`/`$bottom`.
pub(super) fn is_n_accumulator(op: &str) -> bool {
    matches!(
        op,
        "$firstN" | "$lastN" | "$maxN" | "$minN" | "$top" | "$bottom" | "$topN" | "$bottomN"
    )
}

pub(super) fn group(
    spec: &Bson,
    docs: Vec<Document>,
    options: &AggregateOptions,
    cap: usize,
    vars: &Variables,
) -> Result<Vec<Document>, EngineError> {
    let Bson::Document(spec) = spec else {
        return Err(err(
            15947,
            "a group's fields must be specified in an object",
        ));
    };
    let Some(id_expr) = spec.get("_id") else {
        return Err(err(15955, "a group specification must include an _id"));
    };
    check_expression(id_expr)?;
    let mut accs: Vec<(String, String, Bson)> = Vec::new();
    let mut n_specs: Vec<Option<NSpec>> = Vec::new();
    let mut quantiles: Vec<Option<super::quantile::Quantile>> = Vec::new();
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
                | "$stdDevPop"
                | "$stdDevSamp"
                | "$mergeObjects"
                | "$median"
                | "$percentile"
        ) && !is_n_accumulator(op)
        {
            return Err(err(15952, format!("unknown group operator '{op}'")));
        }
        quantiles.push(if matches!(op.as_str(), "$median" | "$percentile") {
            Some(super::quantile::Quantile::parse(
                op,
                arg,
                super::quantile::Usage::Accumulator,
                vars,
            )?)
        } else {
            None
        });
        if is_n_accumulator(op) {
            n_specs.push(Some(n_spec(op, arg, vars)?));
        } else {
            check_expression(arg)?;
            n_specs.push(None);
        }
        accs.push((k.clone(), op.clone(), arg.clone()));
    }
    // What the groups hold: keys and accumulated values, in encoded bytes.
    let mut held = 0usize;
    let mut charge = |bytes: usize| -> Result<(), EngineError> {
        held += bytes;
        if !options.allow_disk_use && held > options.stage_memory {
            return Err(err(
                ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed.0,
                "Exceeded memory limit for $group, but didn't allow external sort. Pass allowDiskUse:true to opt in.",
            ));
        }
        if held > cap {
            return Err(over_memory("$group", cap));
        }
        Ok(())
    };
    let mut order: Vec<OrdBson> = Vec::new();
    let mut groups: HashMap<usize, Vec<Acc>> = HashMap::new();
    let mut index: BTreeMap<OrdBson, usize> = BTreeMap::new();
    for d in &docs {
        let key = eval_with(id_expr, d, vars)?.unwrap_or(Bson::Null);
        // Under a collation, keys it holds equal are one group, the first seen its `_id`.
        let lookup = match vars.collation() {
            Some(c) if super::collation::has_string(&key) => OrdBson(c.key_value(&key)),
            _ => OrdBson(key.clone()),
        };
        let gi = match index.get(&lookup) {
            Some(i) => *i,
            None => {
                charge(measure_value(&key).bytes)?;
                let i = order.len();
                order.push(OrdBson(key));
                index.insert(lookup, i);
                groups.insert(
                    i,
                    accs.iter()
                        .map(|(_, op, _)| match op.as_str() {
                            "$sum" | "$count" => Acc::Sum(Bson::Int32(0)),
                            "$avg" => Acc::Avg(0.0, 0, Bson::Int32(0)),
                            "$min" => Acc::Min(None),
                            "$max" => Acc::Max(None),
                            "$first" => Acc::First(None),
                            "$last" => Acc::Last(Bson::Null),
                            "$push" | "$median" | "$percentile" => Acc::Push(Vec::new()),
                            "$stdDevPop" | "$stdDevSamp" => Acc::StdDev(0.0, 0.0, 0.0),
                            "$mergeObjects" => Acc::MergeObjects(Document::new()),
                            "$addToSet" => Acc::AddToSet(BTreeSet::new()),
                            _ => Acc::Many(Vec::new()),
                        })
                        .collect(),
                );
                i
            }
        };
        let Some(state) = groups.get_mut(&gi) else {
            continue;
        };
        for (((slot, (_, op, arg)), nspec), quantile) in
            state.iter_mut().zip(&accs).zip(&n_specs).zip(&quantiles)
        {
            if let (Acc::Many(items), Some(nspec)) = (&mut *slot, nspec) {
                if op == "$firstN" && items.len() >= nspec.n {
                    continue;
                }
                let v = eval_with(&nspec.output, d, vars)?;
                if matches!(op.as_str(), "$maxN" | "$minN")
                    && v.as_ref()
                        .is_none_or(|v| matches!(v, Bson::Null | Bson::Undefined))
                {
                    continue;
                }
                let v = v.unwrap_or(Bson::Null);
                let source = if nspec.sort.is_some() {
                    d.clone()
                } else {
                    Document::new()
                };
                charge(
                    measure_value(&v).bytes
                        + if nspec.sort.is_some() {
                            measure_value(&Bson::Document(d.clone())).bytes
                        } else {
                            0
                        },
                )?;
                items.push((source, v));
                prune(op, nspec, items, false);
                continue;
            }
            let v = if op == "$count" {
                Some(Bson::Int32(1))
            } else if let Some(q) = quantile {
                // Only the numbers count; the rest are not kept.
                eval_with(&q.input, d, vars)?.filter(is_number)
            } else {
                eval_with(arg, d, vars)?
            };
            match slot {
                Acc::Many(_) => {}
                Acc::StdDev(n, mean, m2) => {
                    if let Some(v) = v.filter(is_number) {
                        let x = to_f64(&v);
                        *n += 1.0;
                        let delta = x - *mean;
                        *mean += delta / *n;
                        *m2 += delta * (x - *mean);
                    }
                }
                Acc::MergeObjects(out) => match v {
                    Some(Bson::Document(o)) => {
                        for (k, v) in o {
                            out.insert(k, v);
                        }
                    }
                    None | Some(Bson::Null) | Some(Bson::Undefined) => {}
                    Some(other) => {
                        return Err(err(
                            40400,
                            format!(
                                "$mergeObjects requires object inputs, but input {} is of type {}",
                                crate::value::render::render_value(&other),
                                crate::value::field::type_name(&other)
                            ),
                        ))
                    }
                },
                Acc::Sum(total) => {
                    if let Some(v) = v.filter(is_number) {
                        *total = add_numbers(total, &v);
                    }
                }
                Acc::Avg(sum, n, exact) => {
                    if let Some(v) = v.filter(is_number) {
                        *sum += to_f64(&v);
                        *n += 1;
                        *exact = add_numbers(exact, &v);
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
                        charge(measure_value(&v).bytes)?;
                        items.push(v);
                    }
                }
                Acc::AddToSet(items) => {
                    if let Some(v) = v {
                        let bytes = measure_value(&v).bytes;
                        if items.insert(OrdBson(v)) {
                            charge(bytes)?;
                        }
                    }
                }
            }
        }
    }
    let mut out = Sink::new("$group", cap);
    for (i, key) in order.into_iter().enumerate() {
        let mut d = Document::new();
        d.insert("_id", key.0);
        if let Some(state) = groups.remove(&i) {
            for ((((name, op, _), acc), nspec), quantile) in
                accs.iter().zip(state).zip(&n_specs).zip(&quantiles)
            {
                d.insert(
                    name.clone(),
                    match acc {
                        Acc::Push(items) if quantile.is_some() => match quantile {
                            Some(q) => q.finish(&items),
                            None => Bson::Null,
                        },
                        Acc::Many(mut items) => {
                            if let Some(nspec) = nspec {
                                prune(op, nspec, &mut items, true);
                            }
                            let mut values = items.into_iter().map(|(_, v)| v);
                            if matches!(op.as_str(), "$top" | "$bottom") {
                                values.next().unwrap_or(Bson::Null)
                            } else {
                                Bson::Array(values.collect())
                            }
                        }
                        Acc::StdDev(n, _, m2) => {
                            let pop = op == "$stdDevPop";
                            if n < if pop { 1.0 } else { 2.0 } {
                                Bson::Null
                            } else {
                                Bson::Double((m2 / if pop { n } else { n - 1.0 }).sqrt())
                            }
                        }
                        Acc::MergeObjects(o) => Bson::Document(o),
                        Acc::Sum(v) => v,
                        Acc::Avg(_, 0, _) => Bson::Null,
                        Acc::Avg(_, n, Bson::Decimal128(total)) => decimal_mean(&total, n),
                        Acc::Avg(s, n, _) => Bson::Double(s / n as f64),
                        Acc::Min(v) | Acc::Max(v) | Acc::First(v) => v.unwrap_or(Bson::Null),
                        Acc::Last(v) => v,
                        Acc::Push(items) => Bson::Array(items),
                        Acc::AddToSet(items) => {
                            Bson::Array(items.into_iter().map(|v| v.0).collect())
                        }
                    },
                );
            }
        }
        out.push(d)?;
    }
    Ok(out.docs)
}

fn add_numbers(a: &Bson, b: &Bson) -> Bson {
    arithmetic(a, b, false)
}

/// Evaluates an aggregation expression against `root`; `None` is "missing".
pub fn eval(e: &Bson, root: &Document) -> Result<Option<Bson>, EngineError> {
    eval_with(e, root, &Variables::new())
}

/// Evaluates an aggregation expression against `root` with these variables (`$$NOW` and
/// the request's `let`).
pub fn eval_with(e: &Bson, root: &Document, vars: &Variables) -> Result<Option<Bson>, EngineError> {
    let mut budget = Budget {
        left: MAX_INTERNAL_DOCUMENT_SIZE,
    };
    eval_in(e, root, vars, &mut budget)
}

/// Bytes an evaluation may still copy: every value taken from the document or the expression
/// is charged, so the result of one evaluation stays within a document's size.
pub(super) struct Budget {
    left: usize,
}

impl Budget {
    fn take(&mut self, v: Bson) -> Result<Bson, EngineError> {
        let bytes = measure_value(&v).bytes;
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(v)
            }
            None => Err(too_large(MAX_INTERNAL_DOCUMENT_SIZE - self.left + bytes)),
        }
    }
}

/// The value of a field path (`a.b.c`) in an expression: arrays on the way are mapped
/// element by element (nested arrays stay nested), numeric parts are field names, and a
/// missing field is `None`.
fn path_value(v: &Bson, parts: &[&str]) -> Option<Bson> {
    let Some((first, rest)) = parts.split_first() else {
        return Some(v.clone());
    };
    match v {
        Bson::Document(d) => path_value(d.get(*first)?, rest),
        Bson::Array(items) => Some(Bson::Array(array_path(items, parts))),
        _ => None,
    }
}

fn array_path(items: &[Bson], parts: &[&str]) -> Vec<Bson> {
    let mut out = Vec::new();
    for i in items {
        match i {
            Bson::Document(_) => {
                if let Some(v) = path_value(i, parts) {
                    out.push(v);
                }
            }
            Bson::Array(inner) => out.push(Bson::Array(array_path(inner, parts))),
            _ => {}
        }
    }
    out
}

/// [`path_value`] from a document, without copying it first.
fn path_value_in(root: &Document, parts: &[&str]) -> Option<Bson> {
    let (first, rest) = parts.split_first()?;
    path_value(root.get(*first)?, rest)
}

/// The value of `$$name` or `$$name.path`.
fn variable(s: &str, root: &Document, vars: &Variables) -> Result<Option<Bson>, EngineError> {
    let (name, rest) = match s.split_once('.') {
        Some((n, r)) => (n, Some(r)),
        None => (s, None),
    };
    let base: Bson = match name {
        "ROOT" | "CURRENT" => match vars.get("CURRENT") {
            Some(v) if name == "CURRENT" => v.clone(),
            _ => Bson::Document(root.clone()),
        },
        "REMOVE" => return Ok(None),
        "NOW" => Bson::DateTime(vars.now),
        "CLUSTER_TIME" => Bson::Timestamp(bson::Timestamp {
            time: (vars.now.timestamp_millis() / 1000) as u32,
            increment: 1,
        }),
        "SEARCH_META" | "USER_ROLES" => Bson::Null,
        _ => match vars.get(name) {
            Some(v) => v.clone(),
            None => return Err(err(17276, format!("Use of undefined variable: {name}"))),
        },
    };
    match rest {
        None => Ok(Some(base)),
        Some(r) => {
            path::check_field_path(r)?;
            let parts: Vec<&str> = r.split('.').collect();
            Ok(path_value(&base, &parts))
        }
    }
}

/// The variables an expression may name: `$$NOW` (one instant per request, as mongod fixes
/// it), `$$CLUSTER_TIME`, the request's `let` and those bound by `$let`, `$map`, `$filter`,
/// `$reduce` and `$lookup`'s `let`.
#[derive(Debug, Clone, PartialEq)]
pub struct Variables {
    now: bson::DateTime,
    bound: Vec<(String, Bson)>,
    /// The request's (or the statement's) collation: how the filters, sorts and sets
    /// evaluated in this context compare strings. `None` is the simple collation.
    collation: Option<std::sync::Arc<super::collation::Collation>>,
}

impl Default for Variables {
    fn default() -> Self {
        Variables::new()
    }
}

impl Variables {
    /// The system variables, with `$$NOW` fixed at this instant.
    pub fn new() -> Variables {
        Variables {
            now: bson::DateTime::now(),
            bound: Vec::new(),
            collation: None,
        }
    }

    /// The collation strings compare under here (`None`: simple).
    pub fn collation(&self) -> Option<&std::sync::Arc<super::collation::Collation>> {
        self.collation.as_ref()
    }

    /// These variables under a request's or a statement's `collation` option (unchanged when
    /// the option is absent; `{locale: "simple"}` is the simple collation).
    pub fn with_collation_option(&self, option: Option<&Bson>) -> Result<Variables, EngineError> {
        let mut out = self.clone();
        if option.is_some() {
            out.collation = super::collation::Collation::from_option(option)?;
        }
        Ok(out)
    }

    /// Whether `name` is bound (a `let` variable or one bound by an enclosing stage).
    pub fn is_bound(&self, name: &str) -> bool {
        self.bound.iter().any(|(n, _)| n == name)
    }

    /// Checks, before anything is evaluated, that every `$$name` the expression `e` refers to
    /// is a system variable, bound here, or bound by an enclosing `$let`, `$map`, `$filter` or
    /// `$reduce` inside `e`: mongod resolves variables when it parses an expression, so an
    /// undefined one fails the command (17276) even when no document is ever evaluated.
    pub fn check_references(&self, e: &Bson) -> Result<(), EngineError> {
        let mut scope: Vec<String> = Vec::new();
        self.check_in(e, &mut scope)
    }

    fn check_in(&self, e: &Bson, scope: &mut Vec<String>) -> Result<(), EngineError> {
        match e {
            Bson::String(s) => {
                if let Some(rest) = s.strip_prefix("$$") {
                    let name = rest.split('.').next().unwrap_or(rest);
                    let system = matches!(
                        name,
                        "ROOT"
                            | "CURRENT"
                            | "REMOVE"
                            | "NOW"
                            | "CLUSTER_TIME"
                            | "SEARCH_META"
                            | "USER_ROLES"
                            | "DESCEND"
                            | "PRUNE"
                            | "KEEP"
                    );
                    if !system && !self.is_bound(name) && !scope.iter().any(|n| n == name) {
                        return Err(err(17276, format!("Use of undefined variable: {name}")));
                    }
                }
                Ok(())
            }
            Bson::Array(items) => items.iter().try_for_each(|i| self.check_in(i, scope)),
            Bson::Document(d) => {
                let binder = d.len() == 1 && d.keys().next().is_some_and(|k| k.starts_with('$'));
                if binder && d.contains_key("$literal") {
                    return Ok(());
                }
                if binder {
                    if let Some((op, Bson::Document(args))) = d.iter().next() {
                        let names: Option<Vec<String>> = match op.as_str() {
                            "$let" => args
                                .get_document("vars")
                                .ok()
                                .map(|v| v.keys().cloned().collect()),
                            "$map" | "$filter" => {
                                Some(vec![args.get_str("as").unwrap_or("this").to_string()])
                            }
                            "$reduce" => Some(vec!["this".into(), "value".into()]),
                            _ => None,
                        };
                        if let Some(names) = names {
                            let inner = ["in", "cond"];
                            for (k, v) in args {
                                if inner.contains(&k.as_str()) {
                                    let depth = scope.len();
                                    scope.extend(names.iter().cloned());
                                    let r = self.check_in(v, scope);
                                    scope.truncate(depth);
                                    r?;
                                } else if k != "as" {
                                    self.check_in(v, scope)?;
                                }
                            }
                            return Ok(());
                        }
                    }
                }
                d.values().try_for_each(|v| self.check_in(v, scope))
            }
            _ => Ok(()),
        }
    }

    /// A request's `let`: each value is an expression evaluated without a document (it may
    /// use `$$NOW` and earlier variables). Names must start with a lowercase letter (or a
    /// non-ASCII character) and be letters, digits and `_` (mongod's 16866/16867/16868/16870).
    pub fn with_let(&self, let_doc: &Document, root: &Document) -> Result<Variables, EngineError> {
        let mut out = self.clone();
        let mut values = Vec::new();
        for (name, e) in let_doc {
            check_variable_name(name)?;
            values.push((
                name.clone(),
                eval_with(e, root, self)?.unwrap_or(Bson::Null),
            ));
        }
        for (n, v) in values {
            out.bind(n, v);
        }
        Ok(out)
    }

    /// Binds `name` to `value`, hiding an outer binding of the same name.
    pub fn bind(&mut self, name: String, value: Bson) {
        self.bound.push((name, value));
    }

    fn get(&self, name: &str) -> Option<&Bson> {
        self.bound
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }
}

/// mongod's rules for a user variable's name.
fn check_variable_name(name: &str) -> Result<(), EngineError> {
    let Some(first) = name.chars().next() else {
        return Err(err(16866, "empty variable names are not allowed"));
    };
    if !first.is_ascii_lowercase() && first.is_ascii() {
        return Err(err(
            16867,
            format!("'{name}' starts with an invalid character for a user variable name"),
        ));
    }
    if name
        .chars()
        .any(|c| c.is_ascii() && !(c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(err(
            16868,
            format!("'{name}' contains an invalid character for a variable name"),
        ));
    }
    Ok(())
}

pub(super) fn eval_in(
    e: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Option<Bson>, EngineError> {
    match e {
        Bson::String(s) if s.starts_with("$$") => variable(&s[2..], root, vars)?
            .map(|v| budget.take(v))
            .transpose(),
        Bson::String(s) if s.starts_with('$') => {
            let p = &s[1..];
            path::check_field_path(p)?;
            let parts: Vec<&str> = p.split('.').collect();
            let v = match vars.get("CURRENT") {
                Some(current) => path_value(current, &parts),
                None => path_value_in(root, &parts),
            };
            v.map(|v| budget.take(v)).transpose()
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
            operator(op, args, root, vars, budget)
        }
        Bson::Document(d) => {
            let mut out = Document::new();
            for (k, v) in d {
                if let Some(v) = eval_in(v, root, vars, budget)? {
                    out.insert(k.clone(), v);
                }
            }
            Ok(Some(Bson::Document(out)))
        }
        Bson::Array(items) => Ok(Some(Bson::Array(
            items
                .iter()
                .map(|i| eval_in(i, root, vars, budget).map(|v| v.unwrap_or(Bson::Null)))
                .collect::<Result<_, _>>()?,
        ))),
        other => Ok(Some(budget.take(other.clone())?)),
    }
}

fn args_list(
    args: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Vec<Bson>, EngineError> {
    match args {
        Bson::Array(items) => items
            .iter()
            .map(|i| eval_in(i, root, vars, budget).map(|v| v.unwrap_or(Bson::Null)))
            .collect(),
        other => Ok(vec![
            eval_in(other, root, vars, budget)?.unwrap_or(Bson::Null)
        ]),
    }
}

fn exactly_two(op: &str, a: &[Bson]) -> Result<(), EngineError> {
    if a.len() != 2 {
        return Err(err(
            16020,
            format!(
                "Expression {op} takes exactly 2 arguments. {} were passed in.",
                a.len()
            ),
        ));
    }
    Ok(())
}

/// `a op b` in decimal128 (both operands numbers, one a decimal), with mongod's errors for a
/// zero divisor.
fn decimal(a: &Bson, b: &Bson, op: Op) -> Result<Bson, EngineError> {
    match decimal_arithmetic(a, b, op) {
        Some(Ok(v)) => Ok(v),
        // mongod's codes: a decimal `$mod` by zero has its own, `$divide` is BadValue.
        Some(Err(DecError::DivideByZero)) if op == Op::Modulo => {
            Err(err(ErrorCode::ModByZeroDecimal.0, "can't $mod by zero"))
        }
        Some(Err(DecError::DivideByZero)) => {
            Err(err(ErrorCode::BadValue.0, "can't $divide by zero"))
        }
        None => Ok(Bson::Null),
    }
}

/// `$mod` with mongod's results: by zero is 16610; integers exactly (the smallest long by -1
/// is 0); a double makes a double, a decimal a decimal (exact, the dividend's sign).
fn modulo(a: &Bson, b: &Bson) -> Result<Bson, EngineError> {
    if any_decimal(a, b) {
        return decimal(a, b, Op::Modulo);
    }
    if to_f64(b) == 0.0 {
        return Err(err(ErrorCode::ModByZero.0, "can't $mod by zero"));
    }
    if let (Some(x), Some(y)) = (as_int(a), as_int(b)) {
        let both_int32 = matches!((a, b), (Bson::Int32(_), Bson::Int32(_)));
        return Ok(int_result(x.checked_rem(y).unwrap_or(0), both_int32));
    }
    Ok(Bson::Double(to_f64(a) % to_f64(b)))
}

/// `a - b` with MongoDB's types (see [`arithmetic`]).
pub(super) fn subtract(a: &Bson, b: &Bson) -> Bson {
    if any_decimal(a, b) {
        if let Some(Ok(v)) = decimal_arithmetic(a, b, Op::Subtract) {
            return v;
        }
    }
    if let (Some(x), Some(y)) = (as_int(a), as_int(b)) {
        let both_int32 = matches!((a, b), (Bson::Int32(_), Bson::Int32(_)));
        return match x.checked_sub(y) {
            Some(r) => int_result(r, both_int32),
            None => Bson::Double(x as f64 - y as f64),
        };
    }
    Bson::Double(to_f64(a) - to_f64(b))
}

/// A date moved by `millis` milliseconds, refusing to leave the range of a date.
fn shift_date(dt: &bson::DateTime, millis: f64, op: &str) -> Result<Bson, EngineError> {
    let delta = millis.round();
    if !delta.is_finite() || delta.abs() >= 9.2e18 {
        return Err(err(ErrorCode::Overflow.0, format!("date overflow in {op}")));
    }
    dt.timestamp_millis()
        .checked_add(delta as i64)
        .map(|m| Bson::DateTime(bson::DateTime::from_millis(m)))
        .ok_or_else(|| err(ErrorCode::Overflow.0, format!("date overflow in {op}")))
}

fn operator(
    op: &str,
    args: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Option<Bson>, EngineError> {
    if op == "$literal" {
        return Ok(Some(budget.take(args.clone())?));
    }
    if matches!(op, "$median" | "$percentile") {
        return super::quantile::expression(op, args, root, vars, budget).map(Some);
    }
    if matches!(op, "$dateFromParts" | "$dateToParts") {
        return super::date_parts::expression(op, args, root, vars, budget).map(Some);
    }
    if let Some(v) = super::expressions::lazy(op, args, root, vars, budget)? {
        return Ok(v);
    }
    if let Some(v) = super::expressions::named(op, args, root, vars, budget)? {
        return Ok(v);
    }
    let a = args_list(args, root, vars, budget)?;
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
                acc = match (&acc, v) {
                    (Bson::DateTime(_), Bson::DateTime(_)) if op == "$add" => {
                        return Err(err(16612, "only one date allowed in an $add expression"))
                    }
                    (Bson::DateTime(dt), n) if op == "$add" && is_number(n) => {
                        shift_date(dt, to_f64(n), op)?
                    }
                    (n, Bson::DateTime(dt)) if op == "$add" => shift_date(dt, to_f64(n), op)?,
                    (_, v) if !is_number(v) => {
                        return Err(err(
                            16554,
                            format!(
                                "{op} only supports numeric types, not {}",
                                crate::value::field::type_name(v)
                            ),
                        ))
                    }
                    (acc, v) => arithmetic(acc, v, op == "$multiply"),
                };
            }
            acc
        }
        "$subtract" | "$divide" | "$mod" => {
            exactly_two(op, &a)?;
            if a.iter().any(nullish) {
                return Ok(Some(Bson::Null));
            }
            if !is_number(&a[0]) || !is_number(&a[1]) {
                return Err(err(
                    16556,
                    format!(
                        "cant {op} a {} from a {}",
                        crate::value::field::type_name(&a[1]),
                        crate::value::field::type_name(&a[0])
                    ),
                ));
            }
            match op {
                "$subtract" => subtract(&a[0], &a[1]),
                "$divide" if any_decimal(&a[0], &a[1]) => decimal(&a[0], &a[1], Op::Divide)?,
                "$divide" => {
                    if to_f64(&a[1]) == 0.0 {
                        return Err(err(ErrorCode::BadValue.0, "can't $divide by zero"));
                    }
                    Bson::Double(to_f64(&a[0]) / to_f64(&a[1]))
                }
                _ => modulo(&a[0], &a[1])?,
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
                                crate::value::field::type_name(other)
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
            exactly_two(op, &a)?;
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
        "$not" => Bson::Boolean(!a.first().is_some_and(truthy)),
        "$ifNull" => {
            for v in &a {
                if !nullish(v) {
                    return Ok(Some(v.clone()));
                }
            }
            a.last().cloned().unwrap_or(Bson::Null)
        }
        "$size" => match a.first() {
            Some(Bson::Array(items)) => int_result(items.len() as i64, true),
            Some(other) => {
                return Err(err(
                    17124,
                    format!(
                        "The argument to $size must be an array. Type of the argument: {}",
                        crate::value::field::type_name(other)
                    ),
                ))
            }
            None => Bson::Null,
        },
        "$abs" => match a.first() {
            Some(Bson::Int32(i)) => int_result((*i as i64).abs(), true),
            Some(Bson::Int64(i)) => match i.checked_abs() {
                Some(v) => Bson::Int64(v),
                None => {
                    return Err(err(
                        ErrorCode::AbsOfLongMin.0,
                        "can't take $abs of long long min",
                    ))
                }
            },
            Some(Bson::Double(d)) => Bson::Double(d.abs()),
            Some(Bson::Decimal128(d)) => Dec::from_decimal128(d).abs().to_bson(),
            Some(v) if nullish(v) => Bson::Null,
            Some(other) => {
                return Err(err(
                    28765,
                    format!(
                        "$abs only supports numeric types, not {}",
                        crate::value::field::type_name(other)
                    ),
                ))
            }
            None => Bson::Null,
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
                let i = to_f64(i);
                let len = items.len() as f64;
                let idx = if i < 0.0 { len + i } else { i };
                if idx < 0.0 || idx >= len {
                    return Ok(None);
                }
                match items.get(idx as usize) {
                    Some(v) => v.clone(),
                    None => return Ok(None),
                }
            }
            _ => Bson::Null,
        },
        "$type" => Bson::String(match a.first() {
            Some(v) => crate::value::field::type_name(v).to_string(),
            None => "missing".to_string(),
        }),
        "$isNumber" => Bson::Boolean(a.first().is_some_and(is_number)),
        "$toHashedIndexKey" => Bson::Int64(crate::routing::hash64(
            &eval_in(args, root, vars, budget)?.unwrap_or(Bson::Null),
        )),
        "$toString" => match a.first() {
            Some(Bson::String(s)) => Bson::String(s.clone()),
            Some(Bson::ObjectId(o)) => Bson::String(o.to_hex()),
            Some(v) if nullish(v) => Bson::Null,
            Some(v) => Bson::String(v.to_string()),
            None => Bson::Null,
        },
        other => match super::expressions::eager(other, &a, args)? {
            Some(v) => return Ok(v),
            None => {
                return Err(err(
                    ErrorCode::InvalidPipelineOperator.0,
                    format!("Unrecognized expression '{other}'"),
                ))
            }
        },
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
    fn unwind_paths_are_read_as_mongods_field_paths() {
        let code = |path: &str| {
            run(&[Bson::Document(doc! {"$unwind": path})], docs())
                .err()
                .map(|e| e.code.0)
        };
        assert_eq!(code("t"), Some(28818));
        assert_eq!(code("$$not"), Some(16410));
        assert_eq!(code("$a.$b"), Some(16410));
        assert_eq!(code("$"), Some(40352));
        assert_eq!(code("$a..b"), Some(15998));
        assert_eq!(code("$t"), None);
        assert_eq!(
            run(&[Bson::Document(doc! {"$unwind": "$t"})], docs())
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn documents_evaluates_its_expression_as_mongod_does() {
        let out = |spec: Bson| run(&[Bson::Document(doc! {"$documents": spec})], Vec::new());
        let code = |spec: Bson| out(spec).err().map(|e| e.code.0);
        // A literal array is an array expression: its documents are evaluated with no input.
        assert_eq!(
            out(
                bson::bson!([{"a": {"$add": [1, 2]}, "b": "$missing", "c": {"$literal": "$x"}}, {}])
            )
            .unwrap(),
            vec![doc! {"a": 3, "c": "$x"}, doc! {}]
        );
        assert_eq!(
            out(bson::bson!({"$map": {"input": {"$range": [0, 3]}, "in": {"i": "$$this"}}}))
                .unwrap(),
            vec![doc! {"i": 0}, doc! {"i": 1}, doc! {"i": 2}]
        );
        assert_eq!(out(bson::bson!([])).unwrap(), Vec::<Document>::new());
        // Not an array: the strict unwind's error, whatever the value was.
        for spec in [
            bson::bson!({"a": 1}),
            bson::bson!(1),
            bson::bson!(true),
            bson::bson!("$x"),
            Bson::Null,
            bson::bson!({"$literal": 5}),
        ] {
            assert_eq!(code(spec), Some(5858203));
        }
        // An element that is not a document: the replacement's error.
        assert_eq!(code(bson::bson!([{"a": 1}, 2])), Some(40228));
        // An unknown operator inside is the expression's error.
        assert_eq!(code(bson::bson!([{"a": {"$nope": 1}}])), Some(168));
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

    fn one(stage: Document) -> Result<Vec<Document>, EngineError> {
        run(
            &[
                Bson::Document(doc! {"$documents": [{"_id": 1}]}),
                Bson::Document(stage),
            ],
            Vec::new(),
        )
    }

    #[test]
    fn arithmetic_edges_have_mongodb_results() {
        let v = |e: Bson| eval(&e, &doc! {}).unwrap().unwrap();
        assert_eq!(
            v(Bson::Document(doc! {"$mod": [i64::MIN, -1i64]})),
            Bson::Int64(0)
        );
        assert_eq!(
            v(Bson::Document(doc! {"$mod": [i32::MIN, -1]})),
            Bson::Int32(0)
        );
        assert_eq!(v(Bson::Document(doc! {"$mod": [7, 3]})), Bson::Int32(1));
        assert_eq!(
            v(Bson::Document(doc! {"$mod": [-7i64, 3]})),
            Bson::Int64(-1)
        );
        assert_eq!(
            v(Bson::Document(doc! {"$mod": [7.5, 2]})),
            Bson::Double(1.5)
        );
        let half: bson::Decimal128 = "0.5".parse().unwrap();
        assert!(matches!(
            v(Bson::Document(doc! {"$mod": [5, half]})),
            Bson::Decimal128(d) if crate::value::compare::decimal_to_f64(&d) == 0.0
        ));
        for zero in [Bson::Int32(0), Bson::Int64(0), Bson::Double(0.0)] {
            let e = eval(&Bson::Document(doc! {"$mod": [5, zero]}), &doc! {}).unwrap_err();
            assert_eq!(
                (e.code.0, e.message.as_str()),
                (16610, "can't $mod by zero")
            );
        }
        assert_eq!(
            v(Bson::Document(doc! {"$add": [i64::MAX, 1]})),
            Bson::Double(i64::MAX as f64 + 1.0)
        );
        assert_eq!(
            v(Bson::Document(doc! {"$add": [i32::MAX, 1]})),
            Bson::Int64(1 << 31)
        );
        assert_eq!(
            v(Bson::Document(doc! {"$add": [(1i64 << 62) + 1, 0]})),
            Bson::Int64((1 << 62) + 1),
            "longs are added exactly, not through a double"
        );
        assert_eq!(
            v(Bson::Document(doc! {"$subtract": [i64::MIN, 1]})),
            Bson::Double(i64::MIN as f64 - 1.0)
        );
        assert_eq!(
            v(Bson::Document(doc! {"$multiply": [i64::MAX, 2]})),
            Bson::Double(i64::MAX as f64 * 2.0)
        );
        assert_eq!(
            v(Bson::Document(doc! {"$abs": i32::MIN})),
            Bson::Int64(1 << 31)
        );
        let e = eval(&Bson::Document(doc! {"$abs": i64::MIN}), &doc! {}).unwrap_err();
        assert_eq!(e.code.0, 28680);
        let e = eval(
            &Bson::Document(doc! {"$add": [bson::DateTime::MAX, 1e19]}),
            &doc! {},
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::Overflow);
    }

    /// Expected decimals computed with Python's `decimal` in the decimal128 context (prec=34,
    /// ROUND_HALF_EVEN, Emin=-6143, Emax=6144, clamp=1), doubles converted to 15 digits as
    /// mongod's `coerceToDecimal` converts them.
    #[test]
    fn decimal_operands_make_decimal128_arithmetic() {
        let v = |e: Document| eval(&Bson::Document(e), &doc! {}).unwrap().unwrap();
        let dec = |s: &str| Bson::Decimal128(s.parse().unwrap());
        let cases = [
            (doc! {"$add": [dec("0.1"), dec("0.2")]}, "0.3"),
            (doc! {"$add": [dec("1.10"), dec("2.20")]}, "3.30"),
            (doc! {"$add": [1, dec("2.5")]}, "3.5"),
            (doc! {"$add": [i64::MAX, dec("1")]}, "9223372036854775808"),
            (doc! {"$add": [dec("1"), 0.1]}, "1.100000000000000"),
            (doc! {"$subtract": [dec("0.3"), dec("0.1")]}, "0.2"),
            (
                doc! {"$subtract": [i64::MIN, dec("0.5")]},
                "-9223372036854775808.5",
            ),
            (doc! {"$multiply": [dec("1.10"), dec("2.20")]}, "2.4200"),
            (doc! {"$multiply": [dec("0.1"), 3]}, "0.3"),
            (
                doc! {"$divide": [dec("1"), 3]},
                "0.3333333333333333333333333333333333",
            ),
            (doc! {"$divide": [10, dec("4")]}, "2.5"),
            (doc! {"$mod": [dec("10.5"), 3]}, "1.5"),
            (doc! {"$mod": [dec("-7"), dec("2")]}, "-1"),
            (doc! {"$abs": dec("-1.50")}, "1.50"),
            (doc! {"$ceil": dec("1.01")}, "2"),
            (doc! {"$floor": dec("-1.01")}, "-2"),
            (doc! {"$round": [dec("2.345"), 2]}, "2.34"),
            (doc! {"$round": [dec("1234.5"), -2]}, "1.2E+3"),
            (doc! {"$trunc": [dec("-2.349"), 2]}, "-2.34"),
            (doc! {"$sum": [dec("0.1"), dec("0.2"), 1]}, "1.3"),
            (doc! {"$avg": [dec("1"), 2, dec("0")]}, "1"),
            (
                doc! {"$avg": [[dec("1"), dec("2"), dec("2")]]},
                "1.666666666666666666666666666666667",
            ),
            (doc! {"$toDecimal": 2.5}, "2.50000000000000"),
            (doc! {"$toDecimal": 7i64}, "7"),
            (doc! {"$add": [dec("NaN"), 1]}, "NaN"),
            (doc! {"$multiply": [dec("-Infinity"), 2]}, "-Infinity"),
            (
                doc! {"$subtract": [dec("Infinity"), dec("Infinity")]},
                "NaN",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(v(e.clone()), dec(want), "{e}");
        }
        // A zero divisor of any type is refused with mongod's codes and messages.
        for (e, code, msg) in [
            (
                doc! {"$divide": [dec("1"), dec("0.00")]},
                ErrorCode::BadValue.0,
                "can't $divide by zero",
            ),
            (
                doc! {"$divide": [dec("NaN"), 0]},
                ErrorCode::BadValue.0,
                "can't $divide by zero",
            ),
            (
                doc! {"$mod": [dec("1"), dec("-0")]},
                5733415,
                "can't $mod by zero",
            ),
        ] {
            let got = eval(&Bson::Document(e.clone()), &doc! {}).unwrap_err();
            assert_eq!((got.code.0, got.message.as_str()), (code, msg), "{e}");
        }
        // A tiny non-zero decimal divisor is not zero.
        assert_eq!(
            v(doc! {"$divide": [dec("1E-400"), dec("1E-400")]}),
            dec("1")
        );
        // Doubles and integers alone keep computing as before.
        assert_eq!(v(doc! {"$add": [0.1, 0.2]}), Bson::Double(0.1 + 0.2));
        assert_eq!(v(doc! {"$divide": [1, 3]}), Bson::Double(1.0 / 3.0));
    }

    #[test]
    fn decimal_group_sums_and_averages_are_exact() {
        let dec = |s: &str| Bson::Decimal128(s.parse().unwrap());
        let input: Vec<Document> = ["0.1", "0.2", "0.3", "0.4"]
            .iter()
            .enumerate()
            .map(|(i, p)| doc! {"_id": i as i32, "p": dec(p), "n": i as i32})
            .collect();
        let out = run(
            &[Bson::Document(doc! {"$group": {
                "_id": null, "s": {"$sum": "$p"}, "a": {"$avg": "$p"},
                "mixed": {"$avg": {"$add": ["$p", "$n"]}}, "ints": {"$avg": "$n"},
            }})],
            input,
        )
        .unwrap();
        assert_eq!(out[0].get("s"), Some(&dec("1.0")), "{}", out[0]);
        assert_eq!(out[0].get("a"), Some(&dec("0.25")), "{}", out[0]);
        assert_eq!(out[0].get("mixed"), Some(&dec("1.75")), "{}", out[0]);
        assert_eq!(out[0].get("ints"), Some(&Bson::Double(1.5)), "{}", out[0]);
    }

    #[test]
    fn long_paths_and_deep_results_are_refused() {
        let long = vec!["a"; 20_000].join(".");
        let e = one(doc! {"$addFields": {long.clone(): 1}}).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::Overflow, "FieldPath is too long")
        );
        let e = one(doc! {"$project": {"x": format!("${long}")}}).unwrap_err();
        assert_eq!(e.code, ErrorCode::Overflow);
        // 150 parts is a legal path, but the document it builds nests past the result limit
        // once wrapped twice.
        let p150 = vec!["a"; 150].join(".");
        let e = run(
            &[
                Bson::Document(doc! {"$documents": [{"_id": 1}]}),
                Bson::Document(doc! {"$set": {p150.clone(): 1}}),
                Bson::Document(doc! {"$set": {p150: "$$ROOT"}}),
            ],
            Vec::new(),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::Overflow);
    }

    #[test]
    fn stages_are_bounded_in_memory() {
        let big = "x".repeat(4 * 1024 * 1024);
        let arr: Vec<i32> = (0..3000).collect();
        let e = run(
            &[
                Bson::Document(doc! {"$documents": [{"big": big.clone(), "arr": arr}]}),
                Bson::Document(doc! {"$unwind": "$arr"}),
            ],
            Vec::new(),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed);
        // One expression copying the document many times is stopped by its budget.
        let copies: Vec<&str> = vec!["$$ROOT"; 10];
        let e = run(
            &[
                Bson::Document(doc! {"$documents": [{"big": big}]}),
                Bson::Document(doc! {"$set": {"copies": copies}}),
            ],
            Vec::new(),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::BSONObjectTooLarge);
        // A blocking stage over the limit without allowDiskUse.
        let docs: Vec<Document> = (0..40)
            .map(|i| doc! {"i": i, "pad": "y".repeat(1024)})
            .collect();
        let small = AggregateOptions {
            stage_memory: 8 * 1024,
            allow_disk_use: false,
        };
        let sort = [Bson::Document(doc! {"$sort": {"i": -1}})];
        let e = run_with(&sort, docs.clone(), &small).unwrap_err();
        assert_eq!(e.code.0, 292);
        assert!(
            e.message
                .starts_with("Sort exceeded memory limit of 8192 bytes"),
            "{}",
            e.message
        );
        let allowed = AggregateOptions {
            allow_disk_use: true,
            ..small
        };
        assert_eq!(run_with(&sort, docs.clone(), &allowed).unwrap().len(), 40);
        let group = [Bson::Document(
            doc! {"$group": {"_id": "$i", "all": {"$push": "$$ROOT"}}},
        )];
        let e = run_with(&group, docs, &small).unwrap_err();
        assert_eq!(e.code.0, 292);
        assert!(e.message.contains("$group"), "{}", e.message);
    }
}
