//! `$densify` and `$fill`: the gap-filling stages.
//!
//! `$densify` adds a document at every step of a numeric or date range where a partition has
//! none. The steps are counted from the range's start — the lowest value of all documents
//! (`bounds: "full"`), of the partition (`"partition"`), or the given lower bound (`[lo, hi]`,
//! `hi` excluded) — by adding `step` (for dates, `step` `unit`s, as `$dateAdd` adds them) again
//! and again, as mongod does; a document already at a step stops it from being generated, a
//! document between steps does not. A generated document holds only the partition fields and
//! the densified field. Documents whose field is null or missing pass through untouched;
//! documents outside explicit bounds pass through without generating. The output is sorted by
//! the partition fields and the field, as mongod sorts it (`"full"` bounds with partitions: by
//! the field). Codes: 5733401 for a step that is not a positive number, 6586400 for a date step
//! that is not whole, 5733402–5733410, 5876900, 5946800, 5946802 for bad bounds, 5733408 for
//! `"partition"` without `partitionByFields`, 5733201 for a field that is neither a number nor a
//! date, 6053600 for a number with a `unit` or a date without one, 5897900 past 500,000
//! generated documents, 40414/40415 for missing or unknown fields.
//!
//! `$fill` is what mongod makes of it: a `$setWindowFields` with `$locf` (last observation
//! carried forward) or `$linearFill` for each `method`, then an `$addFields` of
//! `{$ifNull: ["$field", value]}` for each `value` (codes 6050200–6050204).

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use super::aggregate::{err, Sink};
use super::expressions::{date_add, time_unit};
use super::query::SortSpec;
use super::EngineError;
use crate::value::compare::{compare, values_equal, OrdBson};
use crate::value::field::{arithmetic, is_number, type_name};

/// mongod's `internalQueryMaxAllowedDensifyDocs` default.
const MAX_GENERATED: usize = 500_000;

/// Where the steps of a `$densify` run.
#[derive(Debug, Clone)]
enum Bounds {
    Full,
    Partition,
    /// `[lo, hi)`.
    Explicit(Box<(Bson, Bson)>),
}

/// A parsed `$densify`.
#[derive(Debug, Clone)]
struct Densify {
    field: String,
    partitions: Vec<String>,
    step: Bson,
    /// The date unit; numbers are densified without one.
    unit: Option<&'static str>,
    bounds: Bounds,
}

fn unknown(stage: &str, k: &str) -> EngineError {
    EngineError::unknown_field(&format!("{stage}.{k}"))
}

fn missing(stage: &str, k: &str) -> EngineError {
    EngineError::missing_field(&format!("{stage}.{k}"))
}

fn wrong_type(stage: &str, k: &str, v: &Bson, want: &str) -> EngineError {
    EngineError::wrong_type(&format!("{stage}.{k}"), v, want)
}

impl Densify {
    fn parse(spec: &Bson) -> Result<Densify, EngineError> {
        let Bson::Document(d) = spec else {
            return Err(err(
                crate::value::error_codes::ErrorCode::FailedToParse.0,
                format!(
                    "The $densify stage specification must be an object, found {}",
                    type_name(spec)
                ),
            ));
        };
        if let Some(k) = d
            .keys()
            .find(|k| !matches!(k.as_str(), "field" | "partitionByFields" | "range"))
        {
            return Err(unknown("$densify", k));
        }
        let field = match d.get("field") {
            Some(Bson::String(f)) => f.clone(),
            Some(other) => return Err(wrong_type("$densify", "field", other, "string")),
            None => return Err(missing("$densify", "field")),
        };
        super::path::check_field_path(&field)?;
        let partitions = match d.get("partitionByFields") {
            None => Vec::new(),
            Some(Bson::Array(items)) => {
                let mut out = Vec::new();
                for p in items {
                    let Bson::String(p) = p else {
                        return Err(wrong_type("$densify", "partitionByFields", p, "string"));
                    };
                    super::path::check_field_path(p)?;
                    out.push(p.clone());
                }
                out
            }
            Some(other) => return Err(wrong_type("$densify", "partitionByFields", other, "array")),
        };
        let range = match d.get("range") {
            Some(Bson::Document(r)) => r,
            Some(other) => return Err(wrong_type("$densify", "range", other, "object")),
            None => return Err(missing("$densify", "range")),
        };
        if let Some(k) = range
            .keys()
            .find(|k| !matches!(k.as_str(), "step" | "unit" | "bounds"))
        {
            return Err(unknown("$densify.range", k));
        }
        let Some(step) = range.get("step").cloned() else {
            return Err(missing("$densify.range", "step"));
        };
        if !is_number(&step) || compare(&step, &Bson::Int32(0)).is_le() {
            return Err(err(
                5733401,
                "The step parameter in a range statement must be a strictly positive numeric value",
            ));
        }
        let unit = match range.get("unit") {
            None => None,
            Some(u @ Bson::String(_)) => {
                if super::expressions::integral64(&step).is_none() {
                    return Err(err(
                        6586400,
                        "The step parameter in a range statement must be a whole number when densifying a date range",
                    ));
                }
                Some(time_unit("$densify", u)?)
            }
            Some(other) => return Err(wrong_type("$densify.range", "unit", other, "string")),
        };
        let bounds = match range.get("bounds") {
            None => return Err(missing("$densify.range", "bounds")),
            Some(Bson::String(s)) if s == "full" => Bounds::Full,
            Some(Bson::String(s)) if s == "partition" => Bounds::Partition,
            Some(Bson::String(_)) => {
                return Err(err(
                    5946802,
                    "Bounds string must either be 'full' or 'partition'",
                ))
            }
            Some(Bson::Array(b)) => {
                if b.len() != 2 {
                    return Err(err(
                        5733403,
                        "A bounding array in a range statement must have exactly two elements",
                    ));
                }
                let (lo, hi) = (b[0].clone(), b[1].clone());
                if compare(&lo, &hi).is_gt() {
                    return Err(err(
                        5733402,
                        "A bounding array must be an ascending array of either two dates or two numbers",
                    ));
                }
                if is_number(&lo) {
                    if unit.is_some() {
                        return Err(err(5733409, "Numeric bounds may not have unit parameter"));
                    }
                    if !is_number(&hi) {
                        return Err(err(
                            5733406,
                            "A bounding array must contain either both dates or both numeric types",
                        ));
                    }
                    let same = std::mem::discriminant(&lo) == std::mem::discriminant(&hi)
                        && std::mem::discriminant(&lo) == std::mem::discriminant(&step);
                    if !same {
                        return Err(err(
                            5876900,
                            "Upper bound, lower bound, and step must all have the same type",
                        ));
                    }
                } else if matches!(lo, Bson::DateTime(_)) {
                    if !matches!(hi, Bson::DateTime(_)) {
                        return Err(err(
                            5733405,
                            "A bounding array must contain either both dates or both numeric types",
                        ));
                    }
                    if unit.is_none() {
                        return Err(err(5733410, "A bounding array of dates must specify a unit"));
                    }
                } else {
                    return Err(err(5946800, "Explicit bounds must be numeric or dates"));
                }
                Bounds::Explicit(Box::new((lo, hi)))
            }
            Some(_) => {
                return Err(err(
                    5733404,
                    "The bounds in a range statement must be the string 'full', 'partition', or an ascending array of two numbers or two dates",
                ))
            }
        };
        if matches!(bounds, Bounds::Partition) && partitions.is_empty() {
            return Err(err(
                5733408,
                "One cannot specify the bounds as 'partition' without specifying a non-empty array of partitionByFields. You may have meant to specify 'full' bounds.",
            ));
        }
        Ok(Densify {
            field,
            partitions,
            step,
            unit,
            bounds,
        })
    }

    /// The value one step after `v`.
    fn next(&self, v: &Bson) -> Result<Bson, EngineError> {
        Ok(match (v, self.unit) {
            (Bson::DateTime(d), Some(unit)) => {
                let amount = super::expressions::integral64(&self.step).unwrap_or(1);
                Bson::DateTime(bson::DateTime::from_millis(date_add(
                    "$densify",
                    d.timestamp_millis(),
                    unit,
                    amount,
                    &super::time_zone::TimeZone::UTC,
                )?))
            }
            _ => arithmetic(v, &self.step, false),
        })
    }

    /// The densified value of a document, checked; `None` when null or missing.
    fn value_of(&self, d: &Document) -> Result<Option<Bson>, EngineError> {
        let v = match super::path::get(d, &self.field) {
            None | Some(Bson::Null) | Some(Bson::Undefined) => return Ok(None),
            Some(v) => v,
        };
        let date = matches!(v, Bson::DateTime(_));
        if !date && !is_number(v) {
            return Err(err(5733201, "Densify field type must be numeric or a date"));
        }
        if date != self.unit.is_some() {
            return Err(err(
                6053600,
                if date {
                    "Encountered date densify value in collection when step does not have a date unit."
                } else {
                    "Encountered non-date densify value in collection when step has a date unit."
                },
            ));
        }
        Ok(Some(v.clone()))
    }
}

/// `$densify`.
pub(super) fn densify(
    spec: &Bson,
    mut docs: Vec<Document>,
    cap: usize,
) -> Result<Vec<Document>, EngineError> {
    let spec = Densify::parse(spec)?;
    let full = matches!(spec.bounds, Bounds::Full);
    let mut order = Document::new();
    if !full {
        for p in &spec.partitions {
            order.insert(p.clone(), 1);
        }
    }
    order.insert(spec.field.clone(), 1);
    SortSpec::parse(&order)?.sort(&mut docs);

    // The partitions in order of appearance, each with its values.
    let mut keys: Vec<Document> = Vec::new();
    let mut index: BTreeMap<OrdBson, usize> = BTreeMap::new();
    let mut values: Vec<Vec<Bson>> = Vec::new();
    let (mut min, mut max): (Option<Bson>, Option<Bson>) = (None, None);
    for d in &docs {
        let Some(v) = spec.value_of(d)? else {
            continue;
        };
        let mut key = Document::new();
        for p in &spec.partitions {
            if let Some(pv) = super::path::get(d, p) {
                super::path::set(&mut key, p, pv.clone())?;
            }
        }
        let i = *index
            .entry(OrdBson(Bson::Document(key.clone())))
            .or_insert_with(|| {
                keys.push(key);
                values.push(Vec::new());
                keys.len() - 1
            });
        if min.as_ref().is_none_or(|m| compare(&v, m).is_lt()) {
            min = Some(v.clone());
        }
        if max.as_ref().is_none_or(|m| compare(&v, m).is_gt()) {
            max = Some(v.clone());
        }
        values[i].push(v);
    }
    if let Bounds::Explicit(..) = spec.bounds {
        // Without partitions the range is densified even when no document has the field.
        if spec.partitions.is_empty() && keys.is_empty() {
            keys.push(Document::new());
            values.push(Vec::new());
        }
    }

    let mut generated: Vec<Document> = Vec::new();
    for (key, vals) in keys.iter().zip(&values) {
        // The first step and where the steps stop (inclusive or not).
        let (start, end, inclusive) = match &spec.bounds {
            Bounds::Full => match (&min, &max) {
                (Some(a), Some(b)) => (a.clone(), b.clone(), true),
                _ => continue,
            },
            Bounds::Partition => {
                let lo = vals.iter().min_by(|a, b| compare(a, b));
                let hi = vals.iter().max_by(|a, b| compare(a, b));
                match (lo, hi) {
                    (Some(a), Some(b)) => (a.clone(), b.clone(), true),
                    _ => continue,
                }
            }
            Bounds::Explicit(b) => (b.0.clone(), b.1.clone(), false),
        };
        let mut v = start;
        loop {
            let o = compare(&v, &end);
            if o.is_gt() || (o.is_eq() && !inclusive) {
                break;
            }
            if !vals.iter().any(|x| values_equal(x, &v)) {
                if generated.len() >= MAX_GENERATED {
                    return Err(err(
                        5897900,
                        format!("Generated {} documents in $densify, which is over the limit of {MAX_GENERATED}. Increase the 'internalQueryMaxAllowedDensifyDocs' parameter to allow more generated documents", generated.len() + 1),
                    ));
                }
                let mut d = key.clone();
                super::path::set(&mut d, &spec.field, v.clone())?;
                generated.push(d);
            }
            let next = spec.next(&v)?;
            if compare(&next, &v).is_le() {
                break;
            }
            v = next;
        }
    }
    docs.extend(generated);
    SortSpec::parse(&order)?.sort(&mut docs);
    let mut out = Sink::new("$densify", cap);
    for d in docs {
        out.push(d)?;
    }
    Ok(out.docs)
}

/// `$fill`, as the stages mongod makes of it.
pub(super) fn fill_stages(spec: &Bson) -> Result<Vec<Bson>, EngineError> {
    let Bson::Document(d) = spec else {
        return Err(err(
            crate::value::error_codes::ErrorCode::FailedToParse.0,
            format!(
                "The $fill stage specification must be an object, found {}",
                type_name(spec)
            ),
        ));
    };
    if let Some(k) = d.keys().find(|k| {
        !matches!(
            k.as_str(),
            "sortBy" | "partitionBy" | "partitionByFields" | "output"
        )
    }) {
        return Err(unknown("$fill", k));
    }
    let output = match d.get("output") {
        Some(Bson::Document(o)) => o,
        Some(other) => return Err(wrong_type("$fill", "output", other, "object")),
        None => return Err(missing("$fill", "output")),
    };
    if output.is_empty() {
        return Err(err(
            6050203,
            "The output field in '$fill' must contain an object with at least one element",
        ));
    }
    let mut windows = Document::new();
    let mut if_null = Document::new();
    for (field, f) in output {
        let Bson::Document(f) = f else {
            return Err(err(
                6050200,
                "Each fill output specification must be an object with exactly one field",
            ));
        };
        if let Some(k) = f.keys().find(|k| *k != "method" && *k != "value") {
            return Err(unknown("$fill", k));
        }
        if let Some(m) = f.get("method") {
            if f.contains_key("value") {
                return Err(err(
                    6050201,
                    "Each fill output specification must have exactly one of 'method' or 'value' fields, not both",
                ));
            }
            let fn_name = match m {
                Bson::String(m) if m == "locf" => "$locf",
                Bson::String(m) if m == "linear" => "$linearFill",
                Bson::String(_) => {
                    return Err(err(6050202, "Method must be either locf or linear"))
                }
                other => return Err(wrong_type("$fill", "method", other, "string")),
            };
            windows.insert(field.clone(), doc! {fn_name: format!("${field}")});
        }
        if let Some(v) = f.get("value") {
            if_null.insert(
                field.clone(),
                doc! {"$ifNull": [format!("${field}"), v.clone()]},
            );
        }
    }
    let mut window = Document::new();
    match d.get("sortBy") {
        None => {}
        Some(s @ Bson::Document(_)) => {
            window.insert("sortBy", s.clone());
        }
        Some(other) => return Err(wrong_type("$fill", "sortBy", other, "object")),
    }
    if let Some(p) = d.get("partitionBy") {
        if d.contains_key("partitionByFields") {
            return Err(err(
                6050204,
                "Maximum one of 'partitionBy' and 'partitionByFields can be specified in '$fill'",
            ));
        }
        if !matches!(p, Bson::String(_) | Bson::Document(_)) {
            return Err(wrong_type("$fill", "partitionBy", p, "string or object"));
        }
        window.insert("partitionBy", p.clone());
    }
    match d.get("partitionByFields") {
        None => {}
        Some(Bson::Array(fields)) => {
            let mut by = Document::new();
            for f in fields {
                let Bson::String(f) = f else {
                    return Err(wrong_type("$fill", "partitionByFields", f, "string"));
                };
                by.insert(f.clone(), format!("${f}"));
            }
            window.insert("partitionBy", by);
        }
        Some(other) => return Err(wrong_type("$fill", "partitionByFields", other, "array")),
    }
    let mut stages = Vec::new();
    if !windows.is_empty() {
        window.insert("output", windows);
        stages.push(Bson::Document(doc! {"$setWindowFields": window}));
    }
    if !if_null.is_empty() {
        stages.push(Bson::Document(doc! {"$addFields": if_null}));
    }
    Ok(stages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stage: Document, docs: Vec<Document>) -> Result<Vec<Document>, EngineError> {
        super::super::aggregate::run(&[Bson::Document(stage)], docs)
    }

    fn field(out: &[Document], f: &str) -> Vec<Bson> {
        out.iter()
            .map(|d| d.get(f).cloned().unwrap_or(Bson::Undefined))
            .collect()
    }

    #[test]
    fn densify_numbers_full_and_explicit() {
        let docs = vec![
            doc! {"v": 0, "a": "x"},
            doc! {"v": 4},
            doc! {"v": 2.5},
            doc! {"w": 1},
        ];
        let out = run(
            doc! {"$densify": {"field": "v", "range": {"step": 1, "bounds": "full"}}},
            docs.clone(),
        )
        .unwrap();
        // The document without v first (null sorts first), 2.5 kept, steps 1, 2, 3 added.
        assert_eq!(
            field(&out, "v"),
            vec![
                Bson::Undefined,
                0.into(),
                1.into(),
                2.into(),
                2.5.into(),
                3.into(),
                4.into()
            ]
        );
        assert_eq!(out[2], doc! {"v": 1});
        let out = run(
            doc! {"$densify": {"field": "v", "range": {"step": 2, "bounds": [-4, 4]}}},
            docs,
        )
        .unwrap();
        assert_eq!(
            field(&out, "v"),
            vec![
                Bson::Undefined,
                (-4).into(),
                (-2).into(),
                0.into(),
                2.into(),
                2.5.into(),
                4.into()
            ]
        );
        // Explicit bounds with no documents at all.
        let out = run(
            doc! {"$densify": {"field": "v", "range": {"step": 1, "bounds": [0, 3]}}},
            vec![],
        )
        .unwrap();
        assert_eq!(out, vec![doc! {"v": 0}, doc! {"v": 1}, doc! {"v": 2}]);
    }

    #[test]
    fn densify_partitions_and_dates() {
        let docs = vec![
            doc! {"p": "a", "v": 1},
            doc! {"p": "a", "v": 4},
            doc! {"p": "b", "v": 2},
        ];
        let out = run(
            doc! {"$densify": {"field": "v", "partitionByFields": ["p"], "range": {"step": 1, "bounds": "partition"}}},
            docs.clone(),
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                doc! {"p": "a", "v": 1},
                doc! {"p": "a", "v": 2},
                doc! {"p": "a", "v": 3},
                doc! {"p": "a", "v": 4},
                doc! {"p": "b", "v": 2},
            ]
        );
        let out = run(
            doc! {"$densify": {"field": "v", "partitionByFields": ["p"], "range": {"step": 1, "bounds": "full"}}},
            docs,
        )
        .unwrap();
        let mut b: Vec<i32> = out
            .iter()
            .filter(|d| d.get_str("p").ok() == Some("b"))
            .map(|d| d.get_i32("v").unwrap())
            .collect();
        b.sort();
        assert_eq!(b, vec![1, 2, 3, 4]);
        assert_eq!(out.len(), 8);
        let day = |s: &str| Bson::DateTime(bson::DateTime::parse_rfc3339_str(s).unwrap());
        let out = run(
            doc! {"$densify": {"field": "t", "range": {"step": 1, "unit": "month", "bounds": "full"}}},
            vec![
                doc! {"t": day("2021-01-31T00:00:00Z")},
                doc! {"t": day("2021-05-01T00:00:00Z")},
            ],
        )
        .unwrap();
        // Months are added one after another, as $dateAdd adds them: Jan 31, Feb 28, Mar 28.
        assert_eq!(
            field(&out, "t"),
            vec![
                day("2021-01-31T00:00:00Z"),
                day("2021-02-28T00:00:00Z"),
                day("2021-03-28T00:00:00Z"),
                day("2021-04-28T00:00:00Z"),
                day("2021-05-01T00:00:00Z"),
            ]
        );
    }

    #[test]
    fn densify_refuses_bad_specifications() {
        let code = |s: Document, docs: Vec<Document>| run(s, docs).unwrap_err().code.0;
        let d = |range: Document| doc! {"$densify": {"field": "v", "range": range}};
        assert_eq!(code(doc! {"$densify": 1}, vec![]), 9);
        assert_eq!(
            code(
                doc! {"$densify": {"range": {"step": 1, "bounds": "full"}}},
                vec![]
            ),
            40414
        );
        assert_eq!(
            code(
                doc! {"$densify": {"field": "v", "x": 1, "range": {}}},
                vec![]
            ),
            40415
        );
        assert_eq!(code(d(doc! {"bounds": "full"}), vec![]), 40414);
        assert_eq!(code(d(doc! {"step": 0, "bounds": "full"}), vec![]), 5733401);
        assert_eq!(
            code(d(doc! {"step": "1", "bounds": "full"}), vec![]),
            5733401
        );
        assert_eq!(
            code(
                d(doc! {"step": 1.5, "unit": "day", "bounds": "full"}),
                vec![]
            ),
            6586400
        );
        assert_eq!(
            code(
                d(doc! {"step": 1, "unit": "fortnight", "bounds": "full"}),
                vec![]
            ),
            9
        );
        assert_eq!(code(d(doc! {"step": 1, "bounds": "all"}), vec![]), 5946802);
        assert_eq!(code(d(doc! {"step": 1, "bounds": 5}), vec![]), 5733404);
        assert_eq!(code(d(doc! {"step": 1, "bounds": [1]}), vec![]), 5733403);
        assert_eq!(code(d(doc! {"step": 1, "bounds": [2, 1]}), vec![]), 5733402);
        assert_eq!(
            code(d(doc! {"step": 1, "bounds": [1, 2.5]}), vec![]),
            5876900
        );
        assert_eq!(
            code(d(doc! {"step": 1, "unit": "day", "bounds": [1, 2]}), vec![]),
            5733409
        );
        assert_eq!(
            code(d(doc! {"step": 1, "bounds": ["a", "b"]}), vec![]),
            5946800
        );
        assert_eq!(
            code(d(doc! {"step": 1, "bounds": "partition"}), vec![]),
            5733408
        );
        let now = Bson::DateTime(bson::DateTime::from_millis(0));
        assert_eq!(
            code(
                d(doc! {"step": 1, "bounds": [now.clone(), now.clone()]}),
                vec![]
            ),
            5733410
        );
        assert_eq!(
            code(d(doc! {"step": 1, "bounds": "full"}), vec![doc! {"v": "x"}]),
            5733201
        );
        assert_eq!(
            code(d(doc! {"step": 1, "bounds": "full"}), vec![doc! {"v": now}]),
            6053600
        );
        assert_eq!(
            code(
                d(doc! {"step": 1, "unit": "day", "bounds": "full"}),
                vec![doc! {"v": 1}]
            ),
            6053600
        );
        assert_eq!(
            code(
                d(doc! {"step": 1, "bounds": "full"}),
                vec![doc! {"v": 0}, doc! {"v": 1_000_000}]
            ),
            5897900
        );
    }

    #[test]
    fn fill_carries_interpolates_and_sets_values() {
        let docs = vec![
            doc! {"p": 1, "t": 1, "a": 10, "b": 1.0, "c": Bson::Null},
            doc! {"p": 1, "t": 2, "b": Bson::Null},
            doc! {"p": 1, "t": 4, "a": Bson::Null},
            doc! {"p": 1, "t": 5, "a": 20, "b": 5.0, "c": 3},
            doc! {"p": 2, "t": 1},
            doc! {"p": 2, "t": 2, "a": 7},
        ];
        let out = run(
            doc! {"$fill": {"sortBy": {"t": 1}, "partitionByFields": ["p"], "output": {
                "a": {"method": "linear"}, "b": {"method": "locf"}, "c": {"value": {"$multiply": ["$t", 100]}},
            }}},
            docs,
        )
        .unwrap();
        let row = |p: i32, t: i32| {
            out.iter()
                .find(|d| d.get_i32("p").ok() == Some(p) && d.get_i32("t").ok() == Some(t))
                .cloned()
                .unwrap()
        };
        assert_eq!(row(1, 1).get("a"), Some(&Bson::Int32(10)));
        assert_eq!(row(1, 2).get("a"), Some(&Bson::Double(12.5)));
        assert_eq!(row(1, 4).get("a"), Some(&Bson::Double(17.5)));
        assert_eq!(row(1, 2).get("b"), Some(&Bson::Double(1.0)));
        assert_eq!(row(1, 4).get("b"), Some(&Bson::Double(1.0)));
        assert_eq!(row(1, 1).get("c"), Some(&Bson::Int32(100)));
        assert_eq!(row(1, 5).get("c"), Some(&Bson::Int32(3)));
        // Partition 2: nothing before the first value to interpolate from or carry.
        assert_eq!(row(2, 1).get("a"), Some(&Bson::Null));
        assert_eq!(row(2, 1).get("b"), Some(&Bson::Null));
        assert_eq!(row(2, 2).get("a"), Some(&Bson::Int32(7)));
    }

    #[test]
    fn fill_refuses_bad_specifications() {
        let code = |s: Document, docs: Vec<Document>| run(s, docs).unwrap_err().code.0;
        assert_eq!(code(doc! {"$fill": []}, vec![]), 9);
        assert_eq!(code(doc! {"$fill": {"sortBy": {"t": 1}}}, vec![]), 40414);
        assert_eq!(code(doc! {"$fill": {"output": {}, "x": 1}}, vec![]), 40415);
        assert_eq!(code(doc! {"$fill": {"output": {}}}, vec![]), 6050203);
        assert_eq!(code(doc! {"$fill": {"output": {"a": 1}}}, vec![]), 6050200);
        assert_eq!(
            code(
                doc! {"$fill": {"output": {"a": {"method": "locf", "value": 1}}}},
                vec![]
            ),
            6050201
        );
        assert_eq!(
            code(
                doc! {"$fill": {"output": {"a": {"method": "mean"}}}},
                vec![]
            ),
            6050202
        );
        assert_eq!(
            code(
                doc! {"$fill": {"partitionBy": "$p", "partitionByFields": ["p"], "output": {"a": {"value": 1}}}},
                vec![]
            ),
            6050204
        );
        assert_eq!(
            code(
                doc! {"$fill": {"output": {"a": {"method": "linear"}}}},
                vec![]
            ),
            605001
        );
        assert_eq!(
            code(
                doc! {"$fill": {"sortBy": {"t": 1}, "output": {"a": {"method": "linear"}}}},
                vec![doc! {"t": 1, "a": 1}, doc! {"t": 1, "a": 2}]
            ),
            6050106
        );
        assert_eq!(
            code(
                doc! {"$fill": {"sortBy": {"t": 1}, "output": {"a": {"method": "linear"}}}},
                vec![doc! {"t": 1, "a": "x"}]
            ),
            14
        );
        assert_eq!(
            code(
                doc! {"$fill": {"sortBy": {"t": 1}, "output": {"a": {"method": "linear"}}}},
                vec![doc! {"t": "x", "a": 1}]
            ),
            14
        );
    }

    #[test]
    fn explicit_bounds_densify_every_partition_and_dates_interpolate() {
        let out = run(
            doc! {"$densify": {"field": "v", "partitionByFields": ["p"], "range": {"step": 5, "bounds": [0, 15]}}},
            vec![doc! {"p": 1, "v": 5}, doc! {"p": 2, "v": 20}, doc! {"p": 2, "v": 7}],
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                doc! {"p": 1, "v": 0},
                doc! {"p": 1, "v": 5},
                doc! {"p": 1, "v": 10},
                doc! {"p": 2, "v": 0},
                doc! {"p": 2, "v": 5},
                doc! {"p": 2, "v": 7},
                doc! {"p": 2, "v": 10},
                doc! {"p": 2, "v": 20},
            ]
        );
        let at = |ms: i64| Bson::DateTime(bson::DateTime::from_millis(ms));
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"y": {"$linearFill": "$y"}, "c": {"$locf": "$y"}}}},
            vec![
                doc! {"t": at(0), "y": 0},
                doc! {"t": at(1_000)},
                doc! {"t": at(4_000), "y": 8},
                doc! {"t": at(5_000), "y": Bson::Null},
            ],
        )
        .unwrap();
        assert_eq!(
            field(&out, "y"),
            vec![0.into(), Bson::Double(2.0), 8.into(), Bson::Null]
        );
        assert_eq!(
            field(&out, "c"),
            vec![0.into(), 0.into(), 8.into(), 8.into()]
        );
        let bad = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"y": {"$locf": "$y", "window": {"documents": [-1, 0]}}}}},
            vec![],
        );
        assert_eq!(bad.unwrap_err().code.0, 9);
    }
}
