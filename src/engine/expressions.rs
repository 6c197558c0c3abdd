//! Aggregation expression operators beyond the arithmetic and comparison core of
//! [`super::aggregate`]: variables (`$let`), array iteration (`$map`, `$filter`, `$reduce`),
//! `$switch`, and the documented array, set, string, math, date, type-conversion and object
//! families, with mongod's codes for bad arguments.

use bson::{Bson, Document};

use super::aggregate::{err, eval_in, Budget, Variables};
use super::time_zone::{time_zone, TimeZone};
use super::EngineError;
use crate::value::compare::{compare, values_equal, OrdBson};
use crate::value::decimal::{Dec, Rounding};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{is_number, to_f64, truthy, type_name};

pub(super) fn nullish(v: &Bson) -> bool {
    matches!(v, Bson::Null | Bson::Undefined)
}

fn arg_doc<'a>(op: &str, args: &'a Bson) -> Result<&'a Document, EngineError> {
    match args {
        Bson::Document(d) => Ok(d),
        other => Err(err(
            ErrorCode::FailedToParse.0,
            format!(
                "{op} only supports an object as its argument, not {}",
                type_name(other)
            ),
        )),
    }
}

/// Operators whose arguments are evaluated lazily or under new variables. `None` when `op`
/// is not one of them.
pub(super) fn lazy(
    op: &str,
    args: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Option<Option<Bson>>, EngineError> {
    let ev = |e: &Bson, vars: &Variables, budget: &mut Budget| eval_in(e, root, vars, budget);
    Ok(Some(match op {
        "$let" => {
            let d = arg_doc(op, args)?;
            let (Some(Bson::Document(defs)), Some(inner)) = (d.get("vars"), d.get("in")) else {
                return Err(err(16712, "Missing 'vars' or 'in' parameter to $let"));
            };
            let mut scoped = vars.clone();
            for (name, e) in defs {
                let v = ev(e, vars, budget)?.unwrap_or(Bson::Null);
                scoped.bind(name.clone(), v);
            }
            ev(inner, &scoped, budget)?
        }
        "$map" | "$filter" => {
            let d = arg_doc(op, args)?;
            let Some(input) = d.get("input") else {
                return Err(err(
                    if op == "$map" { 16880 } else { 28648 },
                    format!("Missing 'input' parameter to {op}"),
                ));
            };
            let body_key = if op == "$map" { "in" } else { "cond" };
            let Some(body) = d.get(body_key) else {
                return Err(err(
                    if op == "$map" { 16882 } else { 28650 },
                    format!("Missing '{body_key}' parameter to {op}"),
                ));
            };
            let name = d.get_str("as").unwrap_or("this").to_string();
            let limit = match d.get("limit") {
                Some(l) => match ev(l, vars, budget)? {
                    Some(v) if is_number(&v) && to_f64(&v) >= 1.0 => Some(to_f64(&v) as usize),
                    Some(v) if nullish(&v) => None,
                    None => None,
                    Some(v) => {
                        return Err(err(
                            327391,
                            format!(
                                "$filter: limit must be represented as a 32-bit integral value: {}",
                                crate::value::render::render_value(&v)
                            ),
                        ))
                    }
                },
                None => None,
            };
            let items = match ev(input, vars, budget)? {
                Some(Bson::Array(items)) => items,
                None => return Ok(Some(Some(Bson::Null))),
                Some(v) if nullish(&v) => return Ok(Some(Some(Bson::Null))),
                Some(other) => {
                    return Err(err(
                        if op == "$map" { 16883 } else { 28651 },
                        format!("input to {op} must be an array not {}", type_name(&other)),
                    ))
                }
            };
            let mut out = Vec::new();
            for item in items {
                let mut scoped = vars.clone();
                scoped.bind(name.clone(), item.clone());
                let v = ev(body, &scoped, budget)?;
                if op == "$map" {
                    out.push(v.unwrap_or(Bson::Null));
                } else if v.as_ref().is_some_and(truthy) {
                    out.push(item);
                    if limit.is_some_and(|l| out.len() >= l) {
                        break;
                    }
                }
            }
            Some(Bson::Array(out))
        }
        "$reduce" => {
            let d = arg_doc(op, args)?;
            let (Some(input), Some(initial), Some(body)) =
                (d.get("input"), d.get("initialValue"), d.get("in"))
            else {
                return Err(err(
                    40076,
                    "$reduce requires 'input', 'initialValue' and 'in' to be specified",
                ));
            };
            let items = match ev(input, vars, budget)? {
                Some(Bson::Array(items)) => items,
                None => return Ok(Some(Some(Bson::Null))),
                Some(v) if nullish(&v) => return Ok(Some(Some(Bson::Null))),
                Some(other) => {
                    return Err(err(
                        40080,
                        format!(
                            "$reduce requires an array as the 'input' argument, found: {}",
                            type_name(&other)
                        ),
                    ))
                }
            };
            let mut acc = ev(initial, vars, budget)?.unwrap_or(Bson::Null);
            for item in items {
                let mut scoped = vars.clone();
                scoped.bind("value".into(), acc);
                scoped.bind("this".into(), item);
                acc = ev(body, &scoped, budget)?.unwrap_or(Bson::Null);
            }
            Some(acc)
        }
        // Only the branch taken is evaluated, and `$and`/`$or` stop at the first operand that
        // decides them, as in mongod: `{$cond: [{$eq: ["$n", 0]}, null, {$divide: [1, "$n"]}]}`
        // does not fail where `n` is 0.
        "$cond" => {
            let (c, t, f) = match args {
                Bson::Document(d) => (d.get("if"), d.get("then"), d.get("else")),
                Bson::Array(items) if items.len() == 3 => {
                    (items.first(), items.get(1), items.get(2))
                }
                _ => return Err(err(16020, "Expression $cond takes exactly 3 arguments.")),
            };
            let c = match c {
                Some(c) => ev(c, vars, budget)?.unwrap_or(Bson::Null),
                None => Bson::Null,
            };
            match if truthy(&c) { t } else { f } {
                Some(branch) => ev(branch, vars, budget)?,
                None => Some(Bson::Null),
            }
        }
        "$and" | "$or" => {
            let items: Vec<&Bson> = match args {
                Bson::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            let decides = op == "$or";
            for item in items {
                if ev(item, vars, budget)?.as_ref().is_some_and(truthy) == decides {
                    return Ok(Some(Some(Bson::Boolean(decides))));
                }
            }
            Some(Bson::Boolean(!decides))
        }
        "$switch" => {
            let d = arg_doc(op, args)?;
            let Some(Bson::Array(branches)) = d.get("branches") else {
                return Err(err(40061, "$switch requires at least one branch."));
            };
            for b in branches {
                let Bson::Document(b) = b else {
                    return Err(err(40061, "$switch expected each branch to be an object"));
                };
                let (Some(case), Some(then)) = (b.get("case"), b.get("then")) else {
                    return Err(err(
                        40064,
                        "$switch requires each branch have a 'case' expression and a 'then' expression",
                    ));
                };
                if ev(case, vars, budget)?.as_ref().is_some_and(truthy) {
                    return Ok(Some(ev(then, vars, budget)?));
                }
            }
            match d.get("default") {
                Some(e) => ev(e, vars, budget)?,
                None => {
                    return Err(err(
                        40066,
                        "$switch could not find a matching branch for an input, and no default was specified.",
                    ))
                }
            }
        }
        "$sortArray" => {
            let Bson::Document(d) = args else {
                return Err(err(
                    2942500,
                    format!(
                        "$sortArray requires an object as an argument, found: {}",
                        type_name(args)
                    ),
                ));
            };
            if let Some(k) = d.keys().find(|k| *k != "input" && *k != "sortBy") {
                return Err(err(
                    2942501,
                    format!("$sortArray found an unknown argument: {k}"),
                ));
            }
            let Some(input) = d.get("input") else {
                return Err(err(2942502, "$sortArray requires 'input' to be specified"));
            };
            let Some(sort_by) = d.get("sortBy") else {
                return Err(err(2942503, "$sortArray requires 'sortBy' to be specified"));
            };
            let order = ArrayOrder::parse(sort_by, vars)?;
            match ev(input, vars, budget)? {
                Some(Bson::Array(mut items)) => {
                    order.sort(&mut items);
                    Some(Bson::Array(items))
                }
                None => Some(Bson::Null),
                Some(v) if nullish(&v) => Some(Bson::Null),
                Some(other) => {
                    return Err(err(
                        2942504,
                        format!(
                        "The input argument to $sortArray must be an array, but was of type: {}",
                        type_name(&other)
                    ),
                    ))
                }
            }
        }
        "$getField" => {
            let current = Bson::String("$$CURRENT".into());
            // `{$getField: {field, input}}`, or the short form `{$getField: <field>}` (which an
            // object whose first key is an operator, such as `{$literal: "a.b"}`, also is).
            let (field, input) = match args {
                Bson::Document(d) if !d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                    if let Some(k) = d.keys().find(|k| *k != "field" && *k != "input") {
                        return Err(err(
                            3041701,
                            format!("$getField found an unknown argument: {k}"),
                        ));
                    }
                    let Some(field) = d.get("field") else {
                        return Err(err(3041702, "$getField requires 'field' to be specified"));
                    };
                    (field, d.get("input").unwrap_or(&current))
                }
                other => (other, &current),
            };
            let field = constant_field_arg(field, "$getField", [5654600, 5654601, 5654602])?;
            match ev(input, vars, budget)? {
                Some(Bson::Document(d)) => d.get(&field).cloned(),
                Some(v) if nullish(&v) => Some(Bson::Null),
                None => Some(Bson::Null),
                Some(other) => {
                    return Err(err(
                        3041705,
                        format!(
                            "$getField requires 'input' to evaluate to type Object, but got {}",
                            type_name(&other)
                        ),
                    ))
                }
            }
        }
        "$setField" | "$unsetField" => {
            let (input, field, value) = field_mutation_arguments(op, args)?;
            let input = match ev(input, vars, budget)? {
                Some(Bson::Document(d)) => d,
                None => return Ok(Some(Some(Bson::Null))),
                Some(v) if nullish(&v) => return Ok(Some(Some(Bson::Null))),
                Some(_) => {
                    return Err(err(
                        4161105,
                        format!("{op} requires 'input' to evaluate to type Object"),
                    ))
                }
            };
            // A missing value (`$$REMOVE`, an absent path, or `$unsetField`) removes the field.
            let value = match value {
                Some(v) => ev(v, vars, budget)?,
                None => None,
            };
            let mut out = input;
            match value {
                Some(v) => {
                    // Replaces in place when present (the field keeps its position), appends
                    // otherwise; the name is taken literally, dots and dollars included.
                    out.insert(field, v);
                }
                None => {
                    out.remove(&field);
                }
            }
            Some(Bson::Document(out))
        }
        _ => return Ok(None),
    }))
}

/// How `$sortArray` orders elements: whole values in MongoDB's comparison order (`sortBy: 1`
/// or `-1`), or by fields of the elements (`sortBy: {a: 1, "b.c": -1}`), where an element that
/// is not a document has every field missing (null). The sort is stable, and strings compare
/// under the request's collation.
enum ArrayOrder {
    Whole(bool, Option<std::sync::Arc<super::collation::Collation>>),
    Fields(super::query::SortSpec),
}

impl ArrayOrder {
    fn parse(sort_by: &Bson, vars: &Variables) -> Result<ArrayOrder, EngineError> {
        let collation = vars.collation().cloned();
        match sort_by {
            Bson::Document(spec) if !spec.is_empty() => Ok(ArrayOrder::Fields(
                super::query::SortSpec::parse(spec)?.with_collation(collation),
            )),
            v if is_number(v) && (to_f64(v) == 1.0 || to_f64(v) == -1.0) => {
                Ok(ArrayOrder::Whole(to_f64(v) > 0.0, collation))
            }
            _ => Err(err(
                2942506,
                "The $sort element value must be either 1 or -1",
            )),
        }
    }

    fn sort(&self, items: &mut [Bson]) {
        match self {
            ArrayOrder::Whole(ascending, collation) => {
                let key = |v: &Bson| match collation {
                    Some(c) => c.key_value(v),
                    None => v.clone(),
                };
                items.sort_by(|a, b| {
                    let o = compare(&key(a), &key(b));
                    if *ascending {
                        o
                    } else {
                        o.reverse()
                    }
                });
            }
            ArrayOrder::Fields(spec) => {
                let empty = Document::new();
                let as_doc = |v: &Bson| match v {
                    Bson::Document(d) => d.clone(),
                    _ => empty.clone(),
                };
                items.sort_by(|a, b| spec.compare(&as_doc(a), &as_doc(b)));
            }
        }
    }
}

/// What a `field` argument of `$getField`/`$setField`/`$unsetField` is: these operators take
/// a field name only as a constant (a string that is not a path, or `$literal`/`$const`).
enum ConstantField {
    Name(String),
    /// A field path (`"$a.b"`), which mongod refuses with a hint to wrap it in `$literal`.
    Path(String),
    NotConstant,
    NotString(&'static str),
}

/// The constant field name of `$getField` or `$setField` (`op`), or mongod's error: `codes` are
/// its codes for a field path, a value that is not constant, and one that is not a string.
fn constant_field_arg(field: &Bson, op: &str, codes: [i32; 3]) -> Result<String, EngineError> {
    match constant_field_name(field) {
        ConstantField::Name(f) => Ok(f),
        ConstantField::Path(p) => Err(err(
            codes[0],
            format!("'{p}' is a field path reference which is not allowed in this context. Did you mean {{$literal: '{p}'}}?"),
        )),
        ConstantField::NotConstant => Err(err(
            codes[1],
            format!("{op} requires 'field' to evaluate to a constant, but got a non-constant argument"),
        )),
        ConstantField::NotString(t) => Err(err(
            codes[2],
            format!("{op} requires 'field' to evaluate to type String, but got {t}"),
        )),
    }
}

fn constant_field_name(field: &Bson) -> ConstantField {
    let constant = match field {
        Bson::String(s) if s.starts_with('$') => return ConstantField::Path(s.clone()),
        Bson::Document(d) if d.len() == 1 => match d.iter().next() {
            Some((k, v)) if k == "$literal" || k == "$const" => v,
            _ => return ConstantField::NotConstant,
        },
        Bson::Document(_) | Bson::Array(_) => return ConstantField::NotConstant,
        other => other,
    };
    match constant {
        Bson::String(s) => ConstantField::Name(s.clone()),
        other => ConstantField::NotString(type_name(other)),
    }
}

/// The `input`, the field name and the `value` expression (`None` for `$unsetField`) of
/// `$setField`/`$unsetField`, checked as mongod parses them.
fn field_mutation_arguments<'a>(
    op: &str,
    args: &'a Bson,
) -> Result<(&'a Bson, String, Option<&'a Bson>), EngineError> {
    let Bson::Document(d) = args else {
        return Err(err(
            4161100,
            format!("{op} only supports an object as its argument"),
        ));
    };
    let setting = op == "$setField";
    for k in d.keys() {
        let known = k == "field" || k == "input" || (setting && k == "value");
        if !known {
            return Err(err(4161101, format!("{op} found an unknown argument: {k}")));
        }
    }
    let Some(field) = d.get("field") else {
        return Err(err(
            4161102,
            format!("{op} requires 'field' to be specified"),
        ));
    };
    let value = d.get("value");
    if setting && value.is_none() {
        return Err(err(
            4161103,
            format!("{op} requires 'value' to be specified"),
        ));
    }
    let Some(input) = d.get("input") else {
        return Err(err(
            4161109,
            format!("{op} requires 'input' to be specified"),
        ));
    };
    let field = constant_field_arg(field, "$setField", [4161108, 4161106, 4161107])?;
    Ok((input, field, value))
}

fn int_or_long(n: i64) -> Bson {
    i32::try_from(n).map(Bson::Int32).unwrap_or(Bson::Int64(n))
}

fn expect_array<'a>(
    op: &str,
    v: &'a Bson,
    code: i32,
) -> Result<Option<&'a Vec<Bson>>, EngineError> {
    match v {
        Bson::Array(a) => Ok(Some(a)),
        v if nullish(v) => Ok(None),
        other => Err(err(
            code,
            format!(
                "{op}'s argument must be an array, but is {}",
                type_name(other)
            ),
        )),
    }
}

fn expect_string<'a>(op: &str, v: &'a Bson) -> Result<Option<&'a str>, EngineError> {
    match v {
        Bson::String(s) => Ok(Some(s)),
        v if nullish(v) => Ok(None),
        other => Err(err(
            34471,
            format!(
                "{op} requires its input to be a string, not {}",
                type_name(other)
            ),
        )),
    }
}

pub(super) fn date_of(_op: &str, v: &Bson) -> Result<Option<i64>, EngineError> {
    match v {
        Bson::DateTime(d) => Ok(Some(d.timestamp_millis())),
        Bson::Timestamp(t) => Ok(Some(t.time as i64 * 1000)),
        Bson::ObjectId(o) => Ok(Some(o.timestamp().timestamp_millis())),
        v if nullish(v) => Ok(None),
        other => Err(err(
            16006,
            format!("can't convert from BSON type {} to Date", type_name(other)),
        )),
    }
}

/// A value `$dateAdd`, `$dateDiff` and `$dateTrunc` read as a date (mongod's
/// `coercibleToDate`), in ms since the epoch.
fn coerce_date(v: &Bson) -> Option<i64> {
    match v {
        Bson::DateTime(d) => Some(d.timestamp_millis()),
        Bson::Timestamp(t) => Some(t.time as i64 * 1000),
        Bson::ObjectId(o) => Some(o.timestamp().timestamp_millis()),
        _ => None,
    }
}

pub(super) const DAY_MS: i64 = 86_400_000;

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// A date operator's time unit, or mongod's errors for another value.
pub(super) fn time_unit(op: &str, v: &Bson) -> Result<&'static str, EngineError> {
    let Bson::String(u) = v else {
        return Err(err(
            5439013,
            format!(
                "{op} requires 'unit' to be a string, but got {}",
                type_name(v)
            ),
        ));
    };
    [
        "year",
        "quarter",
        "month",
        "week",
        "day",
        "hour",
        "minute",
        "second",
        "millisecond",
    ]
    .into_iter()
    .find(|k| k == u)
    .ok_or_else(|| {
        err(
            ErrorCode::FailedToParse.0,
            format!("{op} parameter 'unit' value parsing failed :: caused by :: unknown time unit value: {u}"),
        )
    })
}

/// An optional argument that is given: its value, null when it evaluates to missing; `None` when
/// it is not given at all (the date operators' `timezone`).
pub(super) fn given_or_null(
    d: &Document,
    key: &str,
    get: &mut impl FnMut(&str) -> Result<Option<Bson>, EngineError>,
) -> Result<Option<Bson>, EngineError> {
    if !d.contains_key(key) {
        return Ok(None);
    }
    Ok(Some(get(key)?.unwrap_or(Bson::Null)))
}

/// The first day of the week for a `week` unit of `$dateDiff`/`$dateTrunc` (0, Sunday, when
/// `startOfWeek` is absent or the unit is not `week`); `None` when `startOfWeek` is null.
fn week_start(
    op: &str,
    unit: &str,
    d: &Document,
    get: &mut impl FnMut(&str) -> Result<Option<Bson>, EngineError>,
) -> Result<Option<i64>, EngineError> {
    if unit != "week" || !d.contains_key("startOfWeek") {
        return Ok(Some(0));
    }
    match get("startOfWeek")?.filter(|v| !nullish(v)) {
        Some(s) => day_of_week(op, &s).map(Some),
        None => Ok(None),
    }
}

/// `startOfWeek` as the days after Sunday (0 to 6).
fn day_of_week(op: &str, v: &Bson) -> Result<i64, EngineError> {
    let Bson::String(s) = v else {
        return Err(err(
            5439015,
            format!(
                "{op} requires 'startOfWeek' to be a string, but got {}",
                type_name(v)
            ),
        ));
    };
    let l = s.to_lowercase();
    ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
        .iter()
        .position(|d| {
            l == *d
                || l == match *d {
                    "sun" => "sunday",
                    "mon" => "monday",
                    "tue" => "tuesday",
                    "wed" => "wednesday",
                    "thu" => "thursday",
                    "fri" => "friday",
                    _ => "saturday",
                }
        })
        .map(|i| i as i64)
        .ok_or_else(|| {
            err(
                5439016,
                format!("{op} parameter 'startOfWeek' value cannot be recognized as a day of a week: {s}"),
            )
        })
}

/// A 64-bit integral value (an integral double or decimal too), as mongod's `integral64Bit`.
pub(super) fn integral64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(*i as i64),
        Bson::Int64(i) => Some(*i),
        Bson::Double(_) | Bson::Decimal128(_) => {
            let f = to_f64(v);
            (f.fract() == 0.0 && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f))
                .then_some(f as i64)
        }
        _ => None,
    }
}

/// `date` (UTC ms) plus `amount` units in the zone `tz`, as mongod's `dateAdd`: days, weeks,
/// months, quarters and years move the local calendar date and keep the local time of day (the
/// day clamped to the month's last; across a daylight saving change the wall time is read back
/// as mongod's timelib reads it); hours and smaller add their length.
pub(super) fn date_add(
    op: &str,
    ms: i64,
    unit: &str,
    amount: i64,
    tz: &TimeZone,
) -> Result<i64, EngineError> {
    let overflow = || err(5166406, format!("{op} overflowed"));
    let fixed = |unit_ms: i64| {
        amount
            .checked_mul(unit_ms)
            .and_then(|d| ms.checked_add(d))
            .ok_or_else(overflow)
    };
    match unit {
        "millisecond" => fixed(1),
        "second" => fixed(1000),
        "minute" => fixed(60_000),
        "hour" => fixed(3_600_000),
        _ => {
            let local = tz.local(ms);
            let (days, in_day) = (local.div_euclid(DAY_MS), local.rem_euclid(DAY_MS));
            let new_days = match unit {
                "day" | "week" => {
                    let per = if unit == "week" { 7 } else { 1 };
                    amount
                        .checked_mul(per)
                        .and_then(|d| days.checked_add(d))
                        .ok_or_else(overflow)?
                }
                _ => {
                    let per = match unit {
                        "year" => 12,
                        "quarter" => 3,
                        _ => 1,
                    };
                    let months = amount.checked_mul(per).ok_or_else(overflow)?;
                    let (y, m, d) = civil(days);
                    let total = (y * 12 + m as i64 - 1)
                        .checked_add(months)
                        .filter(|t| t.abs() < 12 * 300_000_000)
                        .ok_or_else(overflow)?;
                    let (ny, nm) = (total.div_euclid(12), total.rem_euclid(12) as u32 + 1);
                    days_from_civil(ny, nm, d.min(days_in_month(ny, nm)))
                }
            };
            new_days
                .checked_mul(DAY_MS)
                .and_then(|v| v.checked_add(in_day))
                .and_then(|v| tz.to_utc(v, tz.is_dst_at(ms)))
                .ok_or_else(overflow)
        }
    }
}

/// How many `unit` boundaries lie between two dates in the zone `tz` (`$dateDiff`); weeks begin
/// on `start_of_week` (days after Sunday). As mongod: calendar units count local dates; hours,
/// minutes and seconds count local boundaries corrected by the change of offset between the
/// two dates, so they count elapsed time across a daylight saving change.
fn date_diff(
    start: i64,
    end: i64,
    unit: &str,
    tz: &TimeZone,
    start_of_week: i64,
) -> Result<i64, EngineError> {
    if unit == "millisecond" {
        return end
            .checked_sub(start)
            .ok_or_else(|| err(5166308, "dateDiff overflowed"));
    }
    let (os, oe) = (tz.offset_at(start), tz.offset_at(end));
    let (ls, le) = (start.saturating_add(os), end.saturating_add(oe));
    // C++'s division, truncating towards zero, as mongod corrects for the offsets.
    let floor_diff =
        |unit_ms: i64| le.div_euclid(unit_ms) - ls.div_euclid(unit_ms) + (os - oe) / unit_ms;
    Ok(match unit {
        "second" => floor_diff(1000),
        "minute" => floor_diff(60_000),
        "hour" => floor_diff(3_600_000),
        "day" => le.div_euclid(DAY_MS) - ls.div_euclid(DAY_MS),
        "week" => {
            // Day 0 (1970-01-01) was a Thursday: a week starts on days ≡ sow - 4 (mod 7).
            let k = start_of_week - 4;
            (le.div_euclid(DAY_MS) - k).div_euclid(7) - (ls.div_euclid(DAY_MS) - k).div_euclid(7)
        }
        _ => {
            let (ys, ms_, _) = civil(ls.div_euclid(DAY_MS));
            let (ye, me, _) = civil(le.div_euclid(DAY_MS));
            match unit {
                "year" => ye - ys,
                "quarter" => (ye * 4 + (me as i64 - 1) / 3) - (ys * 4 + (ms_ as i64 - 1) / 3),
                _ => (ye * 12 + me as i64) - (ys * 12 + ms_ as i64),
            }
        }
    })
}

/// The start of the `bin`-unit bin a date falls in (`$dateTrunc`): bins are counted from
/// 2000-01-01T00:00 in the zone (its offset then; for weeks, from the first `start_of_week` on
/// or after it); hours and smaller are lengths from there, larger units local calendar steps.
fn date_trunc(
    ms: i64,
    unit: &str,
    bin: i64,
    tz: &TimeZone,
    start_of_week: i64,
) -> Result<i64, EngineError> {
    const REFERENCE: i64 = 946_684_800_000;
    let reference = REFERENCE - tz.offset_at(REFERENCE);
    let overflow = |code: i32| err(code, "dateTrunc overflowed");
    let millis = |unit_ms: i64| -> Result<i64, EngineError> {
        let size = bin.checked_mul(unit_ms).ok_or_else(|| overflow(5439002))?;
        let shifted = ms.checked_sub(reference).ok_or_else(|| overflow(5439000))?;
        ms.checked_sub(shifted.rem_euclid(size))
            .ok_or_else(|| overflow(5439001))
    };
    match unit {
        "millisecond" => millis(1),
        "second" => millis(1000),
        "minute" => millis(60_000),
        "hour" => millis(3_600_000),
        _ => {
            if bin > 100_000_000_000 {
                return Err(err(5439006, "dateTrunc unsupported binSize value"));
            }
            let reference = if unit == "week" {
                // 2000-01-01 was a Saturday (6 days after Sunday).
                let to_saturday = (6 - start_of_week).rem_euclid(7);
                reference + (7 - to_saturday) % 7 * DAY_MS
            } else {
                reference
            };
            let distance = date_diff(reference, ms, unit, tz, start_of_week)?;
            let lower = distance
                .checked_sub(distance.rem_euclid(bin))
                .ok_or_else(|| overflow(5439004))?;
            date_add("$dateTrunc", reference, unit, lower, tz)
        }
    }
}

/// ISO 8601 week-numbering year, week and day (Monday 1) of a day since the epoch.
pub(super) fn iso_week(days: i64) -> (i64, i64, i64) {
    let iso_dow = (days + 3).rem_euclid(7) + 1;
    // The Thursday of this week decides the year.
    let thursday = days - iso_dow + 4;
    let (y, _, _) = civil(thursday);
    let week = (thursday - days_from_civil(y, 1, 1)) / 7 + 1;
    (y, week, iso_dow)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
pub(super) fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

pub(super) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The parts of a UTC date.
struct DateParts {
    year: i64,
    month: u32,
    day: u32,
    hour: i64,
    minute: i64,
    second: i64,
    millis: i64,
    day_of_year: i64,
    /// 1 (Sunday) to 7.
    day_of_week: i64,
}

fn parts(ms: i64) -> DateParts {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil(days);
    DateParts {
        year,
        month,
        day,
        hour: in_day / 3_600_000,
        minute: in_day / 60_000 % 60,
        second: in_day / 1000 % 60,
        millis: in_day % 1000,
        day_of_year: days - days_from_civil(year, 1, 1) + 1,
        day_of_week: (days + 4).rem_euclid(7) + 1,
    }
}

fn date_to_string(ms: i64, format: &str, tz: &TimeZone) -> Result<String, EngineError> {
    let offset = tz.offset_at(ms);
    let p = parts(ms.saturating_add(offset));
    let minutes = offset / 60_000;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&format!("{:04}", p.year)),
            Some('m') => out.push_str(&format!("{:02}", p.month)),
            Some('d') => out.push_str(&format!("{:02}", p.day)),
            Some('H') => out.push_str(&format!("{:02}", p.hour)),
            Some('M') => out.push_str(&format!("{:02}", p.minute)),
            Some('S') => out.push_str(&format!("{:02}", p.second)),
            Some('L') => out.push_str(&format!("{:03}", p.millis)),
            Some('j') => out.push_str(&format!("{:03}", p.day_of_year)),
            Some('w') => out.push_str(&p.day_of_week.to_string()),
            Some('z') => out.push_str(&format!(
                "{}{:02}{:02}",
                if minutes < 0 { '-' } else { '+' },
                minutes.abs() / 60,
                minutes.abs() % 60
            )),
            Some('Z') => out.push_str(&minutes.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                return Err(err(
                    18536,
                    format!("Invalid format character '%{other}' in format string"),
                ))
            }
            None => return Err(err(18535, "Unmatched '%' at end of format string")),
        }
    }
    Ok(out)
}

/// Parses `YYYY-MM-DD[THH:MM[:SS[.mmm]]][Z]`, the forms `$dateFromString` and `$toDate` see
/// most.
fn parse_date(s: &str) -> Option<i64> {
    let s = s.trim().trim_end_matches('Z');
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut dp = date.split('-');
    let y: i64 = dp.next()?.parse().ok()?;
    let m: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || dp.next().is_some() {
        return None;
    }
    let mut ms = days_from_civil(y, m, d) * 86_400_000;
    if let Some(t) = time {
        let (hms, frac) = match t.split_once('.') {
            Some((a, b)) => (a, Some(b)),
            None => (t, None),
        };
        let mut tp = hms.split(':');
        let h: i64 = tp.next()?.parse().ok()?;
        let mi: i64 = tp.next().unwrap_or("0").parse().ok()?;
        let sec: i64 = tp.next().unwrap_or("0").parse().ok()?;
        ms += h * 3_600_000 + mi * 60_000 + sec * 1000;
        if let Some(f) = frac {
            let f: String = f.chars().take(3).collect();
            let pad = format!("{f:0<3}");
            ms += pad.parse::<i64>().ok()?;
        }
    }
    Some(ms)
}

/// `$dateFromString`'s date: a string with `Z` is UTC (refused beside a `timezone` other than
/// UTC, as mongod refuses it); one without is local wall time in `tz`.
fn date_in_zone(s: &str, tz: &TimeZone) -> Result<i64, EngineError> {
    let failure = |m: String| err(ErrorCode::ConversionFailure.0, m);
    let Some(ms) = parse_date(s) else {
        return Err(failure(format!(
            "an incomplete date/time string has been found, with elements missing: \"{s}\""
        )));
    };
    if s.trim().ends_with('Z') {
        if !tz.is_utc() {
            return Err(failure("you cannot pass in a date/time string with time zone information ('Z') together with a timezone argument".to_string()));
        }
        return Ok(ms);
    }
    tz.wall_to_utc(ms).ok_or_else(|| {
        failure(format!(
            "$dateFromString: the date is out of range: \"{s}\""
        ))
    })
}

fn conversion_failed(from: &Bson, to: &str) -> EngineError {
    err(
        ErrorCode::ConversionFailure.0,
        format!(
            "Unsupported conversion from {} to {to} in $convert with no onError value",
            type_name(from)
        ),
    )
}

/// `$convert` to `to` (a type name or number); `Ok(None)` for a null input.
fn convert(v: &Bson, to: &str) -> Result<Bson, EngineError> {
    let fail = || conversion_failed(v, to);
    Ok(match to {
        "double" => match v {
            Bson::String(s) => Bson::Double(s.trim().parse().map_err(|_| {
                err(
                    ErrorCode::ConversionFailure.0,
                    format!("Failed to parse number '{s}' in $convert with no onError value: Did not consume whole string."),
                )
            })?),
            Bson::Boolean(b) => Bson::Double(if *b { 1.0 } else { 0.0 }),
            Bson::DateTime(d) => Bson::Double(d.timestamp_millis() as f64),
            v if is_number(v) => Bson::Double(to_f64(v)),
            _ => return Err(fail()),
        },
        "int" | "long" => {
            let n: i64 = match v {
                Bson::Int32(i) => *i as i64,
                Bson::Int64(i) => *i,
                Bson::Double(d) if d.is_finite() => d.trunc() as i64,
                Bson::Decimal128(_) => to_f64(v).trunc() as i64,
                Bson::Boolean(b) => *b as i64,
                Bson::DateTime(d) if to == "long" => d.timestamp_millis(),
                Bson::String(s) => s.trim().parse().map_err(|_| {
                    err(
                        ErrorCode::ConversionFailure.0,
                        format!("Failed to parse number '{s}' in $convert with no onError value: Did not consume whole string."),
                    )
                })?,
                _ => return Err(fail()),
            };
            if to == "int" {
                Bson::Int32(i32::try_from(n).map_err(|_| {
                    err(
                        ErrorCode::ConversionFailure.0,
                        format!("Conversion would overflow target type in $convert with no onError value: {n}"),
                    )
                })?)
            } else {
                Bson::Int64(n)
            }
        }
        "decimal" => match v {
            Bson::String(s) => s
                .trim()
                .parse::<bson::Decimal128>()
                .map(Bson::Decimal128)
                .map_err(|_| fail())?,
            // Integers exactly, a double to 15 significant digits, as mongod converts.
            Bson::Boolean(b) => Dec::from_i64(i64::from(*b)).to_bson(),
            v if is_number(v) => Dec::coerce(v).map_or(Bson::Null, Dec::to_bson),
            _ => return Err(fail()),
        },
        "bool" => match v {
            Bson::Boolean(b) => Bson::Boolean(*b),
            v if is_number(v) => Bson::Boolean(to_f64(v) != 0.0),
            _ => Bson::Boolean(true),
        },
        "string" => match v {
            Bson::String(s) => Bson::String(s.clone()),
            Bson::ObjectId(o) => Bson::String(o.to_hex()),
            Bson::Int32(i) => Bson::String(i.to_string()),
            Bson::Int64(i) => Bson::String(i.to_string()),
            Bson::Double(d) => Bson::String(if d.fract() == 0.0 && d.abs() < 1e15 {
                format!("{d:.0}")
            } else {
                d.to_string()
            }),
            Bson::Decimal128(d) => Bson::String(d.to_string()),
            Bson::Boolean(b) => Bson::String(b.to_string()),
            Bson::DateTime(d) => Bson::String(date_to_string(d.timestamp_millis(), "%Y-%m-%dT%H:%M:%S.%LZ", &TimeZone::UTC)?),
            _ => return Err(fail()),
        },
        "objectId" => match v {
            Bson::ObjectId(o) => Bson::ObjectId(*o),
            Bson::String(s) => Bson::ObjectId(bson::oid::ObjectId::parse_str(s).map_err(|_| {
                err(
                    ErrorCode::ConversionFailure.0,
                    format!("Failed to parse objectId '{s}' in $convert with no onError value: Invalid string length for parsing to OID, expected 24 but found {}", s.len()),
                )
            })?),
            _ => return Err(fail()),
        },
        "date" => match v {
            Bson::DateTime(d) => Bson::DateTime(*d),
            Bson::String(s) => Bson::DateTime(bson::DateTime::from_millis(parse_date(s).ok_or_else(|| {
                err(
                    ErrorCode::ConversionFailure.0,
                    format!("Error parsing date string '{s}'"),
                )
            })?)),
            Bson::Int64(i) => Bson::DateTime(bson::DateTime::from_millis(*i)),
            Bson::Double(d) => Bson::DateTime(bson::DateTime::from_millis(*d as i64)),
            Bson::ObjectId(o) => Bson::DateTime(o.timestamp()),
            Bson::Timestamp(t) => Bson::DateTime(bson::DateTime::from_millis(t.time as i64 * 1000)),
            _ => return Err(fail()),
        },
        _ => {
            return Err(err(
                ErrorCode::BadValue.0,
                format!("Unknown type name: {to}"),
            ))
        }
    })
}

fn type_alias(v: &Bson) -> Option<&'static str> {
    Some(match v {
        Bson::String(s) => match s.as_str() {
            "double" => "double",
            "string" => "string",
            "objectId" => "objectId",
            "bool" => "bool",
            "date" => "date",
            "int" => "int",
            "long" => "long",
            "decimal" => "decimal",
            _ => return None,
        },
        v if is_number(v) => match to_f64(v) as i64 {
            1 => "double",
            2 => "string",
            7 => "objectId",
            8 => "bool",
            9 => "date",
            16 => "int",
            18 => "long",
            19 => "decimal",
            _ => return None,
        },
        _ => return None,
    })
}

fn round_to(v: &Bson, places: i64, trunc: bool) -> Bson {
    if let Bson::Decimal128(d) = v {
        // A decimal is quantized to 10^-places in decimal128, as mongod rounds it.
        let mode = if trunc {
            Rounding::TowardZero
        } else {
            Rounding::HalfEven
        };
        return Dec::from_decimal128(d)
            .quantize(-(places as i32), mode)
            .to_bson();
    }
    let f = to_f64(v);
    let scale = 10f64.powi(places as i32);
    let r = if trunc {
        (f * scale).trunc() / scale
    } else {
        // Half to even, as mongod rounds.
        let x = f * scale;
        let r = x.round();
        let r = if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
            r - x.signum()
        } else {
            r
        };
        r / scale
    };
    match v {
        Bson::Int32(i) if places >= 0 => Bson::Int32(*i),
        Bson::Int64(i) if places >= 0 => Bson::Int64(*i),
        Bson::Int32(_) => Bson::Int32(r as i32),
        Bson::Int64(_) => Bson::Int64(r as i64),
        _ => Bson::Double(r),
    }
}

/// `$avg` of numbers as mongod computes it: null for none; in decimal128 (the exact sum over
/// the count) when one is a decimal, else the mean of the doubles.
pub(super) fn average(numbers: &[&Bson]) -> Bson {
    if numbers.is_empty() {
        return Bson::Null;
    }
    if numbers.iter().any(|v| matches!(v, Bson::Decimal128(_))) {
        let total = numbers.iter().fold(Bson::Int32(0), |acc, v| {
            crate::value::field::arithmetic(&acc, v, false)
        });
        if let Bson::Decimal128(total) = total {
            return crate::value::decimal::decimal_mean(&total, numbers.len() as u64);
        }
    }
    let n: Vec<f64> = numbers.iter().map(|v| to_f64(v)).collect();
    Bson::Double(n.iter().sum::<f64>() / n.len() as f64)
}

/// Operators over evaluated arguments `a`. `None` when `op` is not one of them.
pub(super) fn eager(
    op: &str,
    a: &[Bson],
    args: &Bson,
) -> Result<Option<Option<Bson>>, EngineError> {
    let first = a.first().unwrap_or(&Bson::Null);
    let null_in = a.iter().any(nullish);
    Ok(Some(Some(match op {
        // Arrays.
        "$isArray" => Bson::Boolean(matches!(first, Bson::Array(_))),
        "$concatArrays" => {
            let mut out = Vec::new();
            for v in a {
                match expect_array(op, v, 28664)? {
                    Some(items) => out.extend(items.iter().cloned()),
                    None => return Ok(Some(Some(Bson::Null))),
                }
            }
            Bson::Array(out)
        }
        "$reverseArray" => match expect_array(op, first, 34435)? {
            Some(items) => Bson::Array(items.iter().rev().cloned().collect()),
            None => Bson::Null,
        },
        "$first" | "$last" => match expect_array(op, first, 28689)? {
            Some(items) => {
                let v = if op == "$first" {
                    items.first()
                } else {
                    items.last()
                };
                return Ok(Some(v.cloned()));
            }
            None => Bson::Null,
        },
        "$slice" => {
            // mongod: null when the array or the position is null or missing, and both the
            // position and the count must be integers that fit in 32 bits.
            if !(2..=3).contains(&a.len()) {
                return Err(err(28667, format!("Expression $slice takes at least 2 arguments, and at most 3, but {} were passed in.", a.len())));
            }
            if nullish(first) || nullish(&a[1]) {
                return Ok(Some(Some(Bson::Null)));
            }
            let Some(items) = expect_array(op, first, 28724)? else {
                return Ok(Some(Some(Bson::Null)));
            };
            let n = items.len() as i64;
            let int32 = |v: &Bson, which: &str, numeric: i32, integral: i32| {
                if !is_number(v) {
                    let must = if which == "Second" {
                        "must be a numeric value, but is"
                    } else {
                        "must be numeric, but is"
                    };
                    return Err(err(
                        numeric,
                        format!(
                            "{which} argument to $slice {must} of type: {}",
                            type_name(v)
                        ),
                    ));
                }
                integral64(v)
                    .and_then(|i| i32::try_from(i).ok())
                    .map(i64::from)
                    .ok_or_else(|| err(integral, format!("{which} argument to $slice can't be represented as a 32-bit integer: {}", to_f64(v))))
            };
            let (start, len) = if a.len() == 2 {
                let k = int32(&a[1], "Second", 28725, 28726)?;
                if k >= 0 {
                    (0, k)
                } else {
                    ((n + k).max(0), -k)
                }
            } else {
                let s = int32(&a[1], "Second", 28725, 28726)?;
                if nullish(&a[2]) {
                    return Ok(Some(Some(Bson::Null)));
                }
                let k = int32(&a[2], "Third", 28727, 28728)?;
                if k <= 0 {
                    return Err(err(
                        28729,
                        format!("Third argument to $slice must be positive: {k}"),
                    ));
                }
                (if s < 0 { (n + s).max(0) } else { s.min(n) }, k)
            };
            // Both at most 2^31 in size: no overflow.
            let end = (start + len).min(n);
            Bson::Array(items[start as usize..end.max(start) as usize].to_vec())
        }
        "$indexOfArray" => {
            let Some(items) = expect_array(op, first, 40090)? else {
                return Ok(Some(Some(Bson::Null)));
            };
            let target = a.get(1).unwrap_or(&Bson::Null);
            let start = a.get(2).map(to_f64).unwrap_or(0.0) as usize;
            let end = a
                .get(3)
                .map(to_f64)
                .map(|e| e as usize)
                .unwrap_or(items.len())
                .min(items.len());
            let pos = (start..end).find(|&i| values_equal(&items[i], target));
            int_or_long(pos.map(|p| p as i64).unwrap_or(-1))
        }
        "$range" => {
            let (s, e) = (
                a.first().unwrap_or(&Bson::Null),
                a.get(1).unwrap_or(&Bson::Null),
            );
            let step = a.get(2).map(to_f64).unwrap_or(1.0) as i64;
            if !is_number(s) || !is_number(e) {
                return Err(err(34443, "$range requires a numeric starting value"));
            }
            if step == 0 {
                return Err(err(34449, "$range requires a non-zero step value"));
            }
            let (mut i, end) = (to_f64(s) as i64, to_f64(e) as i64);
            let mut out = Vec::new();
            while (step > 0 && i < end) || (step < 0 && i > end) {
                out.push(Bson::Int32(i as i32));
                i += step;
                if out.len() > 10_000_000 {
                    return Err(err(
                        ErrorCode::ExceededMemoryLimit.0,
                        "$range would use too much memory",
                    ));
                }
            }
            Bson::Array(out)
        }
        "$arrayToObject" => {
            let Some(items) = expect_array(op, first, 40386)? else {
                return Ok(Some(Some(Bson::Null)));
            };
            let mut out = Document::new();
            for i in items {
                match i {
                    Bson::Array(kv) if kv.len() == 2 => {
                        let Bson::String(k) = &kv[0] else {
                            return Err(err(40395, format!("$arrayToObject requires an array of key-value pairs, where the key must be of type string. Found key type: {}", type_name(&kv[0]))));
                        };
                        out.insert(k.clone(), kv[1].clone());
                    }
                    Bson::Document(d)
                        if d.len() == 2 && d.contains_key("k") && d.contains_key("v") =>
                    {
                        let Ok(k) = d.get_str("k") else {
                            return Err(err(40394, "$arrayToObject requires an object with keys 'k' and 'v', where the value of 'k' must be of type string."));
                        };
                        out.insert(k.to_string(), d.get("v").cloned().unwrap_or(Bson::Null));
                    }
                    _ => {
                        return Err(err(
                            40398,
                            "Unrecognised input type format for $arrayToObject",
                        ))
                    }
                }
            }
            Bson::Document(out)
        }
        "$objectToArray" => match first {
            Bson::Document(d) => Bson::Array(
                d.iter()
                    .map(|(k, v)| Bson::Document(bson::doc! {"k": k, "v": v.clone()}))
                    .collect(),
            ),
            v if nullish(v) => Bson::Null,
            other => {
                return Err(err(
                    40390,
                    format!(
                        "$objectToArray requires a document input, found: {}",
                        type_name(other)
                    ),
                ))
            }
        },
        "$mergeObjects" => {
            let mut out = Document::new();
            for v in a {
                match v {
                    Bson::Document(d) => {
                        for (k, v) in d {
                            out.insert(k.clone(), v.clone());
                        }
                    }
                    v if nullish(v) => {}
                    other => {
                        return Err(err(
                            40400,
                            format!(
                                "$mergeObjects requires object inputs, but input {} is of type {}",
                                crate::value::render::render_value(other),
                                type_name(other)
                            ),
                        ))
                    }
                }
            }
            Bson::Document(out)
        }
        "$zip" => {
            let Bson::Document(d) = args else {
                return Err(err(34460, "$zip only supports an object as an argument"));
            };
            let _ = d;
            return Ok(None);
        }
        // Sets.
        "$setUnion" | "$setIntersection" | "$setDifference" | "$setEquals" | "$setIsSubset" => {
            let mut sets = Vec::new();
            for v in a {
                match v {
                    Bson::Array(items) => sets.push(
                        items
                            .iter()
                            .cloned()
                            .map(OrdBson)
                            .collect::<std::collections::BTreeSet<_>>(),
                    ),
                    v if nullish(v)
                        && matches!(op, "$setUnion" | "$setIntersection" | "$setDifference") =>
                    {
                        return Ok(Some(Some(Bson::Null)))
                    }
                    other => {
                        return Err(err(
                            17044,
                            format!(
                                "All operands of {op} must be arrays. One argument is of type: {}",
                                type_name(other)
                            ),
                        ))
                    }
                }
            }
            let to_arr = |s: std::collections::BTreeSet<OrdBson>| {
                Bson::Array(s.into_iter().map(|v| v.0).collect())
            };
            match op {
                "$setUnion" => to_arr(sets.into_iter().flatten().collect()),
                "$setIntersection" => {
                    let mut it = sets.into_iter();
                    let first = it.next().unwrap_or_default();
                    to_arr(it.fold(first, |acc, s| acc.intersection(&s).cloned().collect()))
                }
                "$setDifference" => {
                    if sets.len() != 2 {
                        return Err(err(16020, format!("Expression $setDifference takes exactly 2 arguments. {} were passed in.", sets.len())));
                    }
                    to_arr(sets[0].difference(&sets[1]).cloned().collect())
                }
                "$setEquals" => Bson::Boolean(sets.windows(2).all(|w| w[0] == w[1])),
                _ => {
                    if sets.len() != 2 {
                        return Err(err(16020, format!("Expression $setIsSubset takes exactly 2 arguments. {} were passed in.", sets.len())));
                    }
                    Bson::Boolean(sets[0].is_subset(&sets[1]))
                }
            }
        }
        "$anyElementTrue" | "$allElementsTrue" => match first {
            Bson::Array(items) => Bson::Boolean(if op == "$anyElementTrue" {
                items.iter().any(truthy)
            } else {
                items.iter().all(truthy)
            }),
            other => {
                return Err(err(
                    17041,
                    format!(
                        "{op}'s argument must be an array, but is {}",
                        type_name(other)
                    ),
                ))
            }
        },
        // Strings.
        "$strLenCP" | "$strLenBytes" => match first {
            Bson::String(s) => int_or_long(if op == "$strLenCP" {
                s.chars().count()
            } else {
                s.len()
            } as i64),
            other => {
                return Err(err(
                    if op == "$strLenCP" { 34471 } else { 34473 },
                    format!(
                        "{op} requires a string argument, found: {}",
                        if nullish(other) {
                            "null"
                        } else {
                            type_name(other)
                        }
                    ),
                ))
            }
        },
        "$substr" | "$substrBytes" | "$substrCP" => {
            let s = match first {
                Bson::String(s) => s.clone(),
                v if nullish(v) => String::new(),
                v => crate::value::render::render_value(v),
            };
            let start = a.get(1).map(to_f64).unwrap_or(0.0).max(0.0) as usize;
            let len = a.get(2).map(to_f64).unwrap_or(-1.0);
            if op == "$substrCP" {
                let chars: Vec<char> = s.chars().collect();
                let end = if len < 0.0 {
                    chars.len()
                } else {
                    (start + len as usize).min(chars.len())
                };
                Bson::String(
                    chars[start.min(chars.len())..end.max(start.min(chars.len()))]
                        .iter()
                        .collect(),
                )
            } else {
                let b = s.as_bytes();
                let st = start.min(b.len());
                let end = if len < 0.0 {
                    b.len()
                } else {
                    (st + len as usize).min(b.len())
                };
                match std::str::from_utf8(&b[st..end]) {
                    Ok(x) => Bson::String(x.to_string()),
                    Err(_) => {
                        return Err(err(
                            28656,
                            format!(
                            "{op}:  Invalid range, starting index is a UTF-8 continuation byte."
                        ),
                        ))
                    }
                }
            }
        }
        "$split" => {
            let (Some(s), Some(sep)) = (expect_string(op, first)?, a.get(1)) else {
                return Ok(Some(Some(Bson::Null)));
            };
            let Bson::String(sep) = sep else {
                return Err(err(40086, format!("$split requires an expression that evaluates to a string as a second argument, found: {}", type_name(sep))));
            };
            if sep.is_empty() {
                return Err(err(40087, "$split requires a non-empty separator"));
            }
            Bson::Array(
                s.split(sep.as_str())
                    .map(|p| Bson::String(p.to_string()))
                    .collect(),
            )
        }
        "$trim" | "$ltrim" | "$rtrim" => {
            let Bson::Document(d) = args else {
                return Err(err(
                    50696,
                    format!(
                        "{op} only supports an object as an argument, found: {}",
                        type_name(args)
                    ),
                ));
            };
            let _ = d;
            return Ok(None);
        }
        "$indexOfCP" | "$indexOfBytes" => {
            let Some(s) = expect_string(op, first)? else {
                return Ok(Some(Some(Bson::Null)));
            };
            let Some(Bson::String(sub)) = a.get(1) else {
                return Err(err(
                    40092,
                    format!("{op} requires a string as the second argument"),
                ));
            };
            let found = s.find(sub.as_str());
            int_or_long(match found {
                Some(byte) if op == "$indexOfCP" => s[..byte].chars().count() as i64,
                Some(byte) => byte as i64,
                None => -1,
            })
        }
        "$strcasecmp" => {
            let x = first.as_str().unwrap_or("").to_lowercase();
            let y = a
                .get(1)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_lowercase();
            Bson::Int32(x.cmp(&y) as i32)
        }
        "$replaceOne" | "$replaceAll" => return Ok(None),
        "$regexMatch" => return Ok(None),
        // Math.
        "$ceil" | "$floor" | "$sqrt" | "$exp" | "$ln" | "$log10" => {
            if null_in {
                return Ok(Some(Some(Bson::Null)));
            }
            if !is_number(first) {
                return Err(err(
                    28765,
                    format!("{op} only supports numeric types, not {}", type_name(first)),
                ));
            }
            let f = to_f64(first);
            match op {
                "$ceil" | "$floor" => match first {
                    Bson::Int32(_) | Bson::Int64(_) => first.clone(),
                    // The nearest integral decimal (exponent 0) in the operator's direction.
                    Bson::Decimal128(d) => Dec::from_decimal128(d)
                        .quantize(
                            0,
                            if op == "$ceil" {
                                Rounding::Ceiling
                            } else {
                                Rounding::Floor
                            },
                        )
                        .to_bson(),
                    _ => Bson::Double(if op == "$ceil" { f.ceil() } else { f.floor() }),
                },
                "$sqrt" => {
                    if let Bson::Decimal128(d) = first {
                        // A decimal NaN is not below zero: its root is NaN.
                        let d = Dec::from_decimal128(d);
                        if !d.is_nan() && d.total_cmp(Dec::ZERO) == std::cmp::Ordering::Less {
                            return Err(err(
                                28714,
                                "$sqrt's argument must be greater than or equal to 0",
                            ));
                        }
                        return Ok(Some(Some(d.sqrt().to_bson())));
                    }
                    if f < 0.0 {
                        return Err(err(
                            28714,
                            "$sqrt's argument must be greater than or equal to 0",
                        ));
                    }
                    Bson::Double(f.sqrt())
                }
                "$exp" => match first {
                    Bson::Decimal128(d) => Dec::from_decimal128(d).exp().to_bson(),
                    _ => Bson::Double(f.exp()),
                },
                _ => {
                    // A positive decimal has a decimal logarithm; any other value (a decimal
                    // NaN too) is checked and computed as a double, as mongod does.
                    if let Bson::Decimal128(d) = first {
                        let d = Dec::from_decimal128(d);
                        if d.total_cmp(Dec::ZERO) == std::cmp::Ordering::Greater {
                            let v = if op == "$ln" { d.ln() } else { d.log10() };
                            return Ok(Some(Some(v.to_bson())));
                        }
                    }
                    let (code, name) = if op == "$ln" {
                        (28766, "$ln")
                    } else {
                        (28761, "$log10")
                    };
                    if f <= 0.0 {
                        return Err(err(
                            code,
                            format!("{name}'s argument must be a positive number, but is {f}"),
                        ));
                    }
                    Bson::Double(if op == "$ln" { f.ln() } else { f.log10() })
                }
            }
        }
        "$pow" | "$log" => {
            if null_in {
                return Ok(Some(Some(Bson::Null)));
            }
            let (x, y) = (first, a.get(1).unwrap_or(&Bson::Null));
            let names = if op == "$pow" {
                [(28762, "base"), (28763, "exponent")]
            } else {
                [(28756, "argument"), (28757, "base")]
            };
            for ((code, name), v) in names.into_iter().zip([x, y]) {
                if !is_number(v) {
                    return Err(err(
                        code,
                        format!("{op}'s {name} must be numeric, not {}", type_name(v)),
                    ));
                }
            }
            let decimal = matches!(x, Bson::Decimal128(_)) || matches!(y, Bson::Decimal128(_));
            let (dx, dy) = (
                Dec::coerce(x).unwrap_or(Dec::NaN),
                Dec::coerce(y).unwrap_or(Dec::NaN),
            );
            if op == "$log" {
                use std::cmp::Ordering::Greater;
                if decimal
                    && dx.total_cmp(Dec::ZERO) == Greater
                    && dy.total_cmp(Dec::ZERO) == Greater
                    && dy.total_cmp(Dec::from_i64(1)) != std::cmp::Ordering::Equal
                {
                    return Ok(Some(Some(dx.log_base(dy).to_bson())));
                }
                // Anything else, decimals included, is checked and computed as doubles.
                let (fx, fy) = (to_f64(x), to_f64(y));
                if !(fx > 0.0 || fx.is_nan()) {
                    return Err(err(
                        28758,
                        format!("$log's argument must be a positive number, but is {fx}"),
                    ));
                }
                if !((fy > 0.0 && fy != 1.0) || fy.is_nan()) {
                    return Err(err(
                        28759,
                        format!(
                            "$log's base must be a positive number not equal to 1, but is {fy}"
                        ),
                    ));
                }
                Bson::Double(fx.ln() / fy.ln())
            } else if decimal {
                if dx.is_zero() && dy.is_sign_negative() {
                    return Err(err(
                        28764,
                        "$pow cannot take a base of 0 and a negative exponent",
                    ));
                }
                dx.power(dy).to_bson()
            } else {
                if to_f64(x) == 0.0 && to_f64(y) < 0.0 {
                    return Err(err(
                        28764,
                        "$pow cannot take a base of 0 and a negative exponent",
                    ));
                }
                match (
                    crate::value::field::as_int(x),
                    crate::value::field::as_int(y),
                ) {
                    (Some(b), Some(e))
                        if !matches!(x, Bson::Double(_)) && !matches!(y, Bson::Double(_)) =>
                    {
                        let both_int32 = matches!((x, y), (Bson::Int32(_), Bson::Int32(_)));
                        // mongod multiplies `e` times when the result fits a long: a base of
                        // -1, 0 or 1 always does (so a negative exponent leaves 1), others
                        // only for exponents 0..=63.
                        let exact = match b {
                            -1..=1 if e < 0 => Some(1),
                            -1 => Some(if e % 2 == 0 { 1 } else { -1 }),
                            0 | 1 => Some(if e == 0 { 1 } else { b }),
                            _ if (0..=63).contains(&e) => b.checked_pow(e as u32),
                            _ => None,
                        };
                        match exact {
                            Some(r) => crate::value::field::int_result(r, both_int32),
                            None => Bson::Double(to_f64(x).powf(to_f64(y))),
                        }
                    }
                    _ => Bson::Double(to_f64(x).powf(to_f64(y))),
                }
            }
        }
        "$round" | "$trunc" => {
            if null_in {
                return Ok(Some(Some(Bson::Null)));
            }
            if !is_number(first) {
                return Err(err(
                    51081,
                    format!("{op} only supports numeric types, not {}", type_name(first)),
                ));
            }
            let places = a.get(1).map(to_f64).unwrap_or(0.0) as i64;
            if !(-20..=100).contains(&places) {
                return Err(err(51083, format!("cannot apply {op} with precision value {places} value must be in [-20, 100]")));
            }
            round_to(first, places, op == "$trunc")
        }
        "$max" | "$min" | "$sum" | "$avg" => {
            let items: Vec<Bson> = match (a.len(), first) {
                (1, Bson::Array(items)) => items.clone(),
                _ => a.to_vec(),
            };
            match op {
                "$sum" => items
                    .iter()
                    .filter(|v| is_number(v))
                    .fold(Bson::Int32(0), |acc, v| {
                        crate::value::field::arithmetic(&acc, v, false)
                    }),
                "$avg" => {
                    let numbers: Vec<&Bson> = items.iter().filter(|v| is_number(v)).collect();
                    average(&numbers)
                }
                _ => {
                    let mut best: Option<&Bson> = None;
                    for v in items.iter().filter(|v| !nullish(v)) {
                        if best.is_none_or(|b| {
                            if op == "$max" {
                                compare(v, b).is_gt()
                            } else {
                                compare(v, b).is_lt()
                            }
                        }) {
                            best = Some(v);
                        }
                    }
                    best.cloned().unwrap_or(Bson::Null)
                }
            }
        }
        "$rand" => Bson::Double((super::stages::random_u64() >> 11) as f64 / (1u64 << 53) as f64),
        // Dates.
        "$year" | "$month" | "$dayOfMonth" | "$hour" | "$minute" | "$second" | "$millisecond"
        | "$dayOfYear" | "$dayOfWeek" | "$week" | "$isoDayOfWeek" | "$isoWeek" | "$isoWeekYear" => {
            let (v, tz) = match first {
                Bson::Document(d) => {
                    if let Some(k) = d
                        .keys()
                        .find(|k| !matches!(k.as_str(), "date" | "timezone"))
                    {
                        return Err(err(40535, format!("unrecognized option to {op}: \"{k}\"")));
                    }
                    let Some(date) = d.get("date") else {
                        return Err(err(
                            40539,
                            format!(
                                "missing 'date' argument to {op}, provided: {}",
                                crate::value::render::render_doc(d)
                            ),
                        ));
                    };
                    let Some(tz) = time_zone(d.get("timezone").cloned())? else {
                        return Ok(Some(Some(Bson::Null)));
                    };
                    (date.clone(), tz)
                }
                v => (v.clone(), TimeZone::UTC),
            };
            let Some(ms) = date_of(op, &v)? else {
                return Ok(Some(Some(Bson::Null)));
            };
            let ms = tz.local(ms);
            let p = parts(ms);
            let (iso_year, iso_week, iso_dow) = iso_week(ms.div_euclid(DAY_MS));
            Bson::Int32(match op {
                "$year" => p.year as i32,
                "$month" => p.month as i32,
                "$dayOfMonth" => p.day as i32,
                "$hour" => p.hour as i32,
                "$minute" => p.minute as i32,
                "$second" => p.second as i32,
                "$millisecond" => p.millis as i32,
                "$dayOfYear" => p.day_of_year as i32,
                "$dayOfWeek" => p.day_of_week as i32,
                "$isoDayOfWeek" => iso_dow as i32,
                "$isoWeek" => iso_week as i32,
                "$isoWeekYear" => iso_year as i32,
                _ => ((p.day_of_year - p.day_of_week + 7) / 7) as i32,
            })
        }
        "$dateToString" => return Ok(None),
        "$toDate" => {
            if nullish(first) {
                Bson::Null
            } else {
                convert(first, "date")?
            }
        }
        // Type conversion.
        "$toInt" | "$toLong" | "$toDouble" | "$toDecimal" | "$toBool" | "$toObjectId" => {
            if nullish(first) {
                return Ok(Some(Some(Bson::Null)));
            }
            let to = match op {
                "$toInt" => "int",
                "$toLong" => "long",
                "$toDouble" => "double",
                "$toDecimal" => "decimal",
                "$toBool" => "bool",
                _ => "objectId",
            };
            convert(first, to)?
        }
        _ => return Ok(None),
    })))
}

/// One match as `$regexFind` and `$regexFindAll` return it: the matched text, its index in
/// code points, and each capture group's text (null for a group that took no part).
fn regex_match_document(s: &str, c: &regex::Captures) -> Bson {
    let Some(m) = c.get(0) else {
        return Bson::Null;
    };
    let idx = s[..m.start()].chars().count() as i32;
    let captures: Vec<Bson> = c
        .iter()
        .skip(1)
        .map(|g| g.map_or(Bson::Null, |g| Bson::String(g.as_str().to_string())))
        .collect();
    Bson::Document(bson::doc! {"match": m.as_str(), "idx": idx, "captures": captures})
}

/// Operators that take a document of named arguments which are expressions themselves
/// (`$dateToString`, `$trim`, `$replaceAll`, `$regexMatch`, `$convert`, `$zip`), evaluated
/// here by name. `None` when `op` is not one of them.
pub(super) fn named(
    op: &str,
    args: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Option<Option<Bson>>, EngineError> {
    if !matches!(
        op,
        "$dateToString"
            | "$trim"
            | "$ltrim"
            | "$rtrim"
            | "$replaceOne"
            | "$replaceAll"
            | "$regexMatch"
            | "$regexFind"
            | "$regexFindAll"
            | "$convert"
            | "$zip"
            | "$dateFromString"
            | "$dateAdd"
            | "$dateSubtract"
            | "$dateDiff"
            | "$dateTrunc"
    ) {
        return Ok(None);
    }
    let d = match args {
        Bson::Document(d) => d,
        other => {
            return Err(err(
                ErrorCode::FailedToParse.0,
                format!(
                    "{op} only supports an object as its argument, found: {}",
                    type_name(other)
                ),
            ))
        }
    };
    let mut get = |k: &str| -> Result<Option<Bson>, EngineError> {
        match d.get(k) {
            Some(e) => eval_in(e, root, vars, budget),
            None => Ok(None),
        }
    };
    Ok(Some(Some(match op {
        "$dateToString" => {
            let date = get("date")?;
            let format = get("format")?;
            let on_null = get("onNull")?;
            let tz = given_or_null(d, "timezone", &mut get)?;
            let tz = time_zone(tz)?;
            let Some(ms) = date_of(op, date.as_ref().unwrap_or(&Bson::Null))? else {
                return Ok(Some(Some(on_null.unwrap_or(Bson::Null))));
            };
            let Some(tz) = tz else {
                return Ok(Some(Some(Bson::Null)));
            };
            let f = match format {
                Some(Bson::String(f)) => f,
                None if !tz.is_utc() => "%Y-%m-%dT%H:%M:%S.%L".to_string(),
                None => "%Y-%m-%dT%H:%M:%S.%LZ".to_string(),
                Some(other) => {
                    return Err(err(
                        18533,
                        format!(
                            "$dateToString requires that 'format' be a string, found: {}",
                            type_name(&other)
                        ),
                    ))
                }
            };
            Bson::String(date_to_string(ms, &f, &tz)?)
        }
        "$dateFromString" => {
            let s = get("dateString")?;
            let on_error = d
                .contains_key("onError")
                .then(|| get("onError"))
                .transpose()?
                .flatten();
            let on_null = get("onNull")?;
            let tz = given_or_null(d, "timezone", &mut get)?;
            let Some(tz) = time_zone(tz)? else {
                return Ok(Some(Some(Bson::Null)));
            };
            match s {
                Some(Bson::String(s)) => match date_in_zone(&s, &tz) {
                    Ok(ms) => Bson::DateTime(bson::DateTime::from_millis(ms)),
                    Err(e) => match on_error {
                        Some(v) => v,
                        None => return Err(e),
                    },
                },
                None => on_null.unwrap_or(Bson::Null),
                Some(v) if nullish(&v) => on_null.unwrap_or(Bson::Null),
                Some(other) => match on_error {
                    Some(v) => v,
                    None => {
                        return Err(err(
                            ErrorCode::ConversionFailure.0,
                            format!(
                                "$dateFromString requires that 'dateString' be a string, found: {}",
                                type_name(&other)
                            ),
                        ))
                    }
                },
            }
        }
        "$dateAdd" | "$dateSubtract" => {
            for k in d.keys() {
                if !matches!(k.as_str(), "startDate" | "unit" | "amount" | "timezone") {
                    return Err(err(5166401, format!("Unrecognized argument to {op}: {k}")));
                }
            }
            if !["startDate", "unit", "amount"]
                .iter()
                .all(|k| d.contains_key(*k))
            {
                return Err(err(
                    5166402,
                    format!("{op} requires startDate, unit, and amount to be present"),
                ));
            }
            let null = Ok(Some(Some(Bson::Null)));
            let Some(start) = get("startDate")?.filter(|v| !nullish(v)) else {
                return null;
            };
            let Some(unit) = get("unit")?.filter(|v| !nullish(v)) else {
                return null;
            };
            let unit = time_unit(op, &unit)?;
            let Some(amount) = get("amount")?.filter(|v| !nullish(v)) else {
                return null;
            };
            let tz = given_or_null(d, "timezone", &mut get)?;
            let Some(tz) = time_zone(tz)? else {
                return null;
            };
            let Some(ms) = coerce_date(&start) else {
                return Err(err(
                    5166403,
                    format!("{op} requires startDate to be convertible to a date"),
                ));
            };
            let Some(mut amount) = integral64(&amount) else {
                return Err(err(
                    5166405,
                    format!("{op} expects integer amount of time units"),
                ));
            };
            if op == "$dateSubtract" {
                if amount == i64::MIN {
                    return Err(err(
                        6045000,
                        format!("invalid $dateSubtract 'amount' parameter value: {amount}"),
                    ));
                }
                amount = -amount;
            }
            Bson::DateTime(bson::DateTime::from_millis(date_add(
                op, ms, unit, amount, &tz,
            )?))
        }
        "$dateDiff" => {
            for k in d.keys() {
                if !matches!(
                    k.as_str(),
                    "startDate" | "endDate" | "unit" | "timezone" | "startOfWeek"
                ) {
                    return Err(err(
                        5166302,
                        format!("Unrecognized argument to $dateDiff: {k}"),
                    ));
                }
            }
            for (k, code) in [
                ("startDate", 5166303),
                ("endDate", 5166304),
                ("unit", 5166305),
            ] {
                if !d.contains_key(k) {
                    return Err(err(code, format!("Missing '{k}' parameter to $dateDiff")));
                }
            }
            let null = Ok(Some(Some(Bson::Null)));
            let Some(start) = get("startDate")?.filter(|v| !nullish(v)) else {
                return null;
            };
            let Some(end) = get("endDate")?.filter(|v| !nullish(v)) else {
                return null;
            };
            let Some(unit) = get("unit")?.filter(|v| !nullish(v)) else {
                return null;
            };
            let unit = time_unit(op, &unit)?;
            let Some(start_of_week) = week_start(op, unit, d, &mut get)? else {
                return null;
            };
            let tz = given_or_null(d, "timezone", &mut get)?;
            let Some(tz) = time_zone(tz).map_err(|e| {
                EngineError::new(
                    e.code,
                    format!(
                        "$dateDiff parameter 'timezone' value parsing failed :: caused by :: {}",
                        e.message
                    ),
                )
            })?
            else {
                return null;
            };
            let date = |name: &str, v: &Bson| {
                coerce_date(v).ok_or_else(|| {
                    err(
                        5166307,
                        format!(
                            "$dateDiff requires '{name}' to be a date, but got {}",
                            type_name(v)
                        ),
                    )
                })
            };
            let (s, e) = (date("startDate", &start)?, date("endDate", &end)?);
            Bson::Int64(date_diff(s, e, unit, &tz, start_of_week)?)
        }
        "$dateTrunc" => {
            for k in d.keys() {
                if !matches!(
                    k.as_str(),
                    "date" | "unit" | "binSize" | "timezone" | "startOfWeek"
                ) {
                    return Err(err(
                        5439008,
                        format!("Unrecognized argument to $dateTrunc: {k}"),
                    ));
                }
            }
            for (k, code) in [("date", 5439009), ("unit", 5439010)] {
                if !d.contains_key(k) {
                    return Err(err(code, format!("Missing '{k}' parameter to $dateTrunc")));
                }
            }
            let null = Ok(Some(Some(Bson::Null)));
            let Some(date) = get("date")?.filter(|v| !nullish(v)) else {
                return null;
            };
            let mut bin = 1;
            if d.contains_key("binSize") {
                let Some(b) = get("binSize")?.filter(|v| !nullish(v)) else {
                    return null;
                };
                bin = integral64(&b).ok_or_else(|| {
                    err(
                        5439017,
                        format!(
                            "$dateTrunc requires 'binSize' to be a 64-bit integer, but got value '{}' of type {}",
                            crate::value::render::render_value(&b),
                            type_name(&b)
                        ),
                    )
                })?;
                if bin <= 0 {
                    return Err(err(
                        5439018,
                        format!("$dateTrunc requires 'binSize' to be greater than 0, but got value {bin}"),
                    ));
                }
            }
            let Some(unit) = get("unit")?.filter(|v| !nullish(v)) else {
                return null;
            };
            let unit = time_unit(op, &unit)?;
            let Some(start_of_week) = week_start(op, unit, d, &mut get)? else {
                return null;
            };
            let tz = given_or_null(d, "timezone", &mut get)?;
            let Some(tz) = time_zone(tz)? else {
                return null;
            };
            let Some(ms) = coerce_date(&date) else {
                return Err(err(
                    5439012,
                    format!(
                        "$dateTrunc requires 'date' to be a date, but got {}",
                        type_name(&date)
                    ),
                ));
            };
            Bson::DateTime(bson::DateTime::from_millis(date_trunc(
                ms,
                unit,
                bin,
                &tz,
                start_of_week,
            )?))
        }
        "$trim" | "$ltrim" | "$rtrim" => {
            let input = get("input")?;
            let chars = get("chars")?;
            let Some(Bson::String(s)) = input else {
                return match input {
                    None => Ok(Some(Some(Bson::Null))),
                    Some(v) if nullish(&v) => Ok(Some(Some(Bson::Null))),
                    Some(other) => Err(err(
                        50699,
                        format!(
                            "{op} requires its input to be a string, got {} (of type {}) instead.",
                            crate::value::render::render_value(&other),
                            type_name(&other)
                        ),
                    )),
                };
            };
            let set: Vec<char> = match chars {
                Some(Bson::String(c)) => c.chars().collect(),
                _ => vec![' ', '\t', '\n', '\r', '\u{0B}', '\u{0C}', '\0', '\u{A0}'],
            };
            let t = match op {
                "$trim" => s.trim_matches(|c| set.contains(&c)),
                "$ltrim" => s.trim_start_matches(|c| set.contains(&c)),
                _ => s.trim_end_matches(|c| set.contains(&c)),
            };
            Bson::String(t.to_string())
        }
        "$replaceOne" | "$replaceAll" => {
            let (input, find, repl) = (get("input")?, get("find")?, get("replacement")?);
            match (input, find, repl) {
                (Some(Bson::String(s)), Some(Bson::String(f)), Some(Bson::String(r))) => {
                    Bson::String(if op == "$replaceOne" {
                        s.replacen(&f, &r, 1)
                    } else {
                        s.replace(&f, &r)
                    })
                }
                (i, f, r) if [&i, &f, &r].iter().any(|v| v.as_ref().is_none_or(nullish)) => {
                    Bson::Null
                }
                _ => {
                    return Err(err(
                        51746,
                        format!("{op} requires that 'input', 'find' and 'replacement' be strings"),
                    ))
                }
            }
        }
        "$regexMatch" | "$regexFind" | "$regexFindAll" => {
            for k in d.keys() {
                if !matches!(k.as_str(), "input" | "regex" | "options") {
                    return Err(err(31024, format!("{op} found an unknown argument: {k}")));
                }
            }
            if !d.contains_key("input") {
                return Err(err(31022, format!("{op} requires 'input' parameter")));
            }
            if !d.contains_key("regex") {
                return Err(err(31023, format!("{op} requires 'regex' parameter")));
            }
            let (input, regex, options) = (get("input")?, get("regex")?, get("options")?);
            let nothing = match op {
                "$regexMatch" => Bson::Boolean(false),
                "$regexFind" => Bson::Null,
                _ => Bson::Array(Vec::new()),
            };
            let (pattern, mut opts) = match regex {
                Some(Bson::String(p)) => (p, String::new()),
                Some(Bson::RegularExpression(r)) => (r.pattern.to_string(), r.options.to_string()),
                None => return Ok(Some(Some(nothing))),
                Some(v) if nullish(&v) => return Ok(Some(Some(nothing))),
                Some(other) => {
                    return Err(err(
                        51105,
                        format!(
                            "{op} needs 'regex' to be of type string or regex, found: {}",
                            type_name(&other)
                        ),
                    ))
                }
            };
            match options {
                Some(Bson::String(o)) if !o.is_empty() && !opts.is_empty() => {
                    return Err(err(
                        51107,
                        format!(
                        "{op} found regex option(s) specified in both 'regex' and 'option' fields"
                    ),
                    ))
                }
                Some(Bson::String(o)) => opts.push_str(&o),
                None => {}
                Some(v) if nullish(&v) => {}
                Some(other) => {
                    return Err(err(
                        51106,
                        format!(
                            "{op} needs 'options' to be of type string, found: {}",
                            type_name(&other)
                        ),
                    ))
                }
            }
            if let Some(bad) = opts.chars().find(|c| !"imsx".contains(*c)) {
                return Err(err(
                    51108,
                    format!("{op} invalid flag in regex options: {bad}"),
                ));
            }
            let s = match input {
                Some(Bson::String(s)) => s,
                None => return Ok(Some(Some(nothing))),
                Some(v) if nullish(&v) => return Ok(Some(Some(nothing))),
                Some(other) => {
                    return Err(err(
                        51104,
                        format!(
                            "{op} needs 'input' to be of type string, found: {}",
                            type_name(&other)
                        ),
                    ))
                }
            };
            let mut b = regex::RegexBuilder::new(&pattern);
            b.case_insensitive(opts.contains('i'))
                .multi_line(opts.contains('m'))
                .dot_matches_new_line(opts.contains('s'))
                .ignore_whitespace(opts.contains('x'));
            let re = b
                .build()
                .map_err(|e| err(51111, format!("Invalid Regex in {op}: {e}")))?;
            match op {
                "$regexMatch" => Bson::Boolean(re.is_match(&s)),
                "$regexFind" => re
                    .captures(&s)
                    .map(|c| regex_match_document(&s, &c))
                    .unwrap_or(Bson::Null),
                _ => Bson::Array(
                    re.captures_iter(&s)
                        .map(|c| regex_match_document(&s, &c))
                        .collect(),
                ),
            }
        }
        "$convert" => {
            let input = get("input")?;
            let to = get("to")?;
            let on_error = d
                .contains_key("onError")
                .then(|| get("onError"))
                .transpose()?;
            let on_null = d
                .contains_key("onNull")
                .then(|| get("onNull"))
                .transpose()?;
            let input = input.unwrap_or(Bson::Null);
            if nullish(&input) {
                return Ok(Some(on_null.flatten().or(Some(Bson::Null))));
            }
            let to_name = match to.as_ref().map(|t| match t {
                Bson::Document(td) => td.get("type").cloned().unwrap_or(Bson::Null),
                t => t.clone(),
            }) {
                Some(t) => type_alias(&t).ok_or_else(|| {
                    err(
                        ErrorCode::BadValue.0,
                        format!(
                            "Unknown type name: {}",
                            crate::value::render::render_value(&t)
                        ),
                    )
                })?,
                None => {
                    return Err(err(
                        ErrorCode::FailedToParse.0,
                        "Missing 'to' parameter to $convert",
                    ))
                }
            };
            match convert(&input, to_name) {
                Ok(v) => v,
                Err(e) => match on_error {
                    Some(v) => return Ok(Some(v)),
                    None => return Err(e),
                },
            }
        }
        _ => {
            // $zip
            let inputs = get("inputs")?;
            let longest = d.get("useLongestLength").is_some_and(truthy);
            let defaults = get("defaults")?;
            let Some(Bson::Array(inputs)) = inputs else {
                return Err(err(34461, "inputs must be an array of expressions"));
            };
            let mut arrays = Vec::new();
            for i in inputs {
                match i {
                    Bson::Array(x) => arrays.push(x),
                    v if nullish(&v) => return Ok(Some(Some(Bson::Null))),
                    other => {
                        return Err(err(
                            34468,
                            format!(
                                "$zip found a non-array expression in input: {}",
                                crate::value::render::render_value(&other)
                            ),
                        ))
                    }
                }
            }
            let n = if longest {
                arrays.iter().map(|a| a.len()).max().unwrap_or(0)
            } else {
                arrays.iter().map(|a| a.len()).min().unwrap_or(0)
            };
            let defaults = match defaults {
                Some(Bson::Array(d)) => d,
                _ => Vec::new(),
            };
            Bson::Array(
                (0..n)
                    .map(|i| {
                        Bson::Array(
                            arrays
                                .iter()
                                .enumerate()
                                .map(|(j, a)| {
                                    a.get(i)
                                        .cloned()
                                        .or_else(|| defaults.get(j).cloned())
                                        .unwrap_or(Bson::Null)
                                })
                                .collect(),
                        )
                    })
                    .collect(),
            )
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::super::aggregate::{eval, eval_with, Variables};
    use bson::{doc, Bson};

    fn v(e: bson::Document) -> Bson {
        eval(&Bson::Document(e), &doc! {"a": [1, 2, 3], "s": " hi ", "d": bson::DateTime::from_millis(1_709_251_200_000i64)})
            .unwrap()
            .unwrap_or(Bson::Undefined)
    }

    /// `$slice` takes a position and a count that fit in 32 bits, as mongod checks them;
    /// values past that once overflowed the bounds arithmetic (found by the `matcher` fuzz
    /// target: `fuzz/regressions/matcher/`).
    #[test]
    fn slice_positions_and_counts_fit_in_32_bits() {
        let code = |e: bson::Document| {
            eval(&Bson::Document(e), &doc! {"a": [1, 2, 3]})
                .unwrap_err()
                .code
                .0
        };
        assert_eq!(code(doc! {"$slice": ["$a", i64::MIN]}), 28726);
        assert_eq!(code(doc! {"$slice": ["$a", -1e300]}), 28726);
        assert_eq!(code(doc! {"$slice": ["$a", 1.5]}), 28726);
        assert_eq!(code(doc! {"$slice": ["$a", i64::MAX, 1]}), 28726);
        assert_eq!(code(doc! {"$slice": ["$a", 1, i64::MAX]}), 28728);
        assert_eq!(code(doc! {"$slice": ["$a", 1, "x"]}), 28727);
        assert_eq!(code(doc! {"$slice": ["$a", "x"]}), 28725);
        assert_eq!(code(doc! {"$slice": ["$a", 1, 0]}), 28729);
        assert_eq!(code(doc! {"$slice": ["$a"]}), 28667);
        // The extremes that fit: everything from the back, nothing from past the end.
        let all: Bson = vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(3)].into();
        assert_eq!(v(doc! {"$slice": ["$a", i32::MIN]}), all);
        assert_eq!(
            v(doc! {"$slice": ["$a", 2.0, i32::MAX]}),
            vec![Bson::Int32(3)].into()
        );
        assert_eq!(
            v(doc! {"$slice": ["$a", i32::MAX, i32::MAX]}),
            Bson::Array(vec![])
        );
        // A null position answers null before the array is checked, as in mongod.
        assert_eq!(v(doc! {"$slice": [5, null]}), Bson::Null);
        assert_eq!(v(doc! {"$slice": ["$a", 1, null]}), Bson::Null);
    }

    #[test]
    fn families() {
        assert_eq!(
            v(doc! {"$map": {"input": "$a", "in": {"$multiply": ["$$this", 2]}}}),
            Bson::Array(vec![2.into(), 4.into(), 6.into()])
        );
        assert_eq!(
            v(
                doc! {"$filter": {"input": "$a", "as": "x", "cond": {"$gte": ["$$x", 2]}, "limit": 1}}
            ),
            Bson::Array(vec![2.into()])
        );
        assert_eq!(
            v(
                doc! {"$reduce": {"input": "$a", "initialValue": 10, "in": {"$add": ["$$value", "$$this"]}}}
            ),
            Bson::Int32(16)
        );
        assert_eq!(
            v(doc! {"$let": {"vars": {"x": 2}, "in": {"$add": ["$$x", 1]}}}),
            Bson::Int32(3)
        );
        assert_eq!(
            v(doc! {"$slice": ["$a", -2]}),
            Bson::Array(vec![2.into(), 3.into()])
        );
        assert_eq!(
            v(doc! {"$concatArrays": ["$a", [4]]})
                .as_array()
                .unwrap()
                .len(),
            4
        );
        assert_eq!(
            v(doc! {"$setUnion": [[1, 2], [2, 3]]}),
            Bson::Array(vec![1.into(), 2.into(), 3.into()])
        );
        assert_eq!(
            v(doc! {"$trim": {"input": "$s"}}),
            Bson::String("hi".into())
        );
        assert_eq!(
            v(doc! {"$split": ["a,b", ","]}),
            Bson::Array(vec!["a".into(), "b".into()])
        );
        assert_eq!(v(doc! {"$toInt": "42"}), Bson::Int32(42));
        assert_eq!(
            v(doc! {"$convert": {"input": "x", "to": "int", "onError": -1}}),
            Bson::Int32(-1)
        );
        assert_eq!(
            v(doc! {"$dateToString": {"date": "$d", "format": "%Y-%m-%d %H:%M"}}),
            Bson::String("2024-03-01 00:00".into())
        );
        assert_eq!(
            v(doc! {"$dayOfWeek": "$d"}),
            Bson::Int32(6),
            "2024-03-01 was a Friday"
        );
        assert_eq!(
            v(doc! {"$round": [2.5, 0]}),
            Bson::Double(2.0),
            "half to even"
        );
        assert_eq!(
            v(doc! {"$switch": {"branches": [{"case": false, "then": 1}], "default": 2}}),
            Bson::Int32(2)
        );
        // The branch not taken, and the operands after the deciding one, are not evaluated.
        let zero = doc! {"$divide": [1, 0]};
        assert_eq!(v(doc! {"$cond": [false, zero.clone(), 3]}), Bson::Int32(3));
        assert_eq!(
            v(doc! {"$cond": {"if": true, "then": 4, "else": zero.clone()}}),
            Bson::Int32(4)
        );
        assert_eq!(
            v(doc! {"$and": [false, zero.clone()]}),
            Bson::Boolean(false)
        );
        assert_eq!(v(doc! {"$or": [1, zero.clone()]}), Bson::Boolean(true));
        assert_eq!(v(doc! {"$and": [1, "$nothing"]}), Bson::Boolean(false));
        assert_eq!(v(doc! {"$or": []}), Bson::Boolean(false));
        assert_eq!(v(doc! {"$and": []}), Bson::Boolean(true));
        assert_eq!(
            v(doc! {"$objectToArray": {"k": 1}}),
            Bson::Array(vec![Bson::Document(doc! {"k": "k", "v": 1})])
        );
        assert!(matches!(v(doc! {"$add": ["$$NOW", 0]}), Bson::DateTime(_)));
        assert_eq!(
            v(doc! {"$literal": "$$REMOVE"}),
            Bson::String("$$REMOVE".into())
        );
        assert_eq!(
            eval(&Bson::String("$$REMOVE".into()), &doc! {}).unwrap(),
            None
        );
        let e = eval(&Bson::Document(doc! {"$toInt": "x"}), &doc! {}).unwrap_err();
        assert_eq!(e.code.0, 241);
        let e = eval(&Bson::String("$$undefinedVar".into()), &doc! {}).unwrap_err();
        assert_eq!(
            (e.code.0, e.message.as_str()),
            (17276, "Use of undefined variable: undefinedVar")
        );
    }

    #[test]
    fn let_variables_follow_mongod_rules() {
        let vars = Variables::new();
        assert_eq!(
            vars.with_let(&doc! {"Bad": 1}, &doc! {})
                .unwrap_err()
                .code
                .0,
            16867
        );
        assert_eq!(
            vars.with_let(&doc! {"a-b": 1}, &doc! {})
                .unwrap_err()
                .code
                .0,
            16868
        );
        let vars = vars
            .with_let(&doc! {"x": {"$add": [1, 2]}}, &doc! {})
            .unwrap();
        assert_eq!(
            eval_with(&Bson::String("$$x".into()), &doc! {}, &vars).unwrap(),
            Some(Bson::Int32(3))
        );
    }

    /// `$setField`/`$unsetField`/`$getField` take their field name literally: a name with dots
    /// or a leading `$` (given through `$literal`) is one field, not a path, which is how the
    /// drivers' dots-and-dollars tests write such keys.
    #[test]
    fn field_operators_take_names_literally() {
        let root = doc! {"_id": 1, "foo": {"x": 1}, "a": {"b": 2}, "a.b": 3, "$p": 4};
        let ev = |e: bson::Document| eval(&Bson::Document(e), &root);
        assert_eq!(
            ev(doc! {"$setField": {"field": {"$literal": "$a"}, "value": 1, "input": "$$ROOT"}})
                .unwrap(),
            Some(Bson::Document(
                doc! {"_id": 1, "foo": {"x": 1}, "a": {"b": 2}, "a.b": 3, "$p": 4, "$a": 1}
            ))
        );
        // An existing field keeps its place; a dotted name is one field of `input`.
        assert_eq!(
            ev(doc! {"$setField": {"field": "a.b", "value": 9, "input": "$$ROOT"}}).unwrap(),
            Some(Bson::Document(
                doc! {"_id": 1, "foo": {"x": 1}, "a": {"b": 2}, "a.b": 9, "$p": 4}
            ))
        );
        assert_eq!(
            ev(doc! {"$setField": {"field": {"$literal": "$a"}, "value": 1, "input": "$foo"}})
                .unwrap(),
            Some(Bson::Document(doc! {"x": 1, "$a": 1}))
        );
        // `$$REMOVE` and `$unsetField` remove; a null or missing input gives null.
        assert_eq!(
            ev(doc! {"$setField": {"field": "foo", "value": "$$REMOVE", "input": "$$ROOT"}})
                .unwrap(),
            Some(Bson::Document(
                doc! {"_id": 1, "a": {"b": 2}, "a.b": 3, "$p": 4}
            ))
        );
        assert_eq!(
            ev(doc! {"$unsetField": {"field": {"$literal": "$p"}, "input": "$$ROOT"}}).unwrap(),
            Some(Bson::Document(
                doc! {"_id": 1, "foo": {"x": 1}, "a": {"b": 2}, "a.b": 3}
            ))
        );
        assert_eq!(
            ev(doc! {"$setField": {"field": "x", "value": 1, "input": "$nothing"}}).unwrap(),
            Some(Bson::Null)
        );
        assert_eq!(
            ev(doc! {"$getField": {"field": "a.b", "input": "$$ROOT"}}).unwrap(),
            Some(Bson::Int32(3))
        );
        assert_eq!(
            ev(doc! {"$getField": {"$literal": "$p"}}).unwrap(),
            Some(Bson::Int32(4))
        );
        // mongod's parse errors.
        let code = |e: bson::Document| ev(e).unwrap_err().code.0;
        assert_eq!(code(doc! {"$setField": 1}), 4161100);
        assert_eq!(
            code(doc! {"$setField": {"field": "a", "value": 1, "input": {}, "x": 1}}),
            4161101
        );
        assert_eq!(code(doc! {"$setField": {"value": 1, "input": {}}}), 4161102);
        assert_eq!(
            code(doc! {"$setField": {"field": "a", "input": {}}}),
            4161103
        );
        assert_eq!(
            code(doc! {"$setField": {"field": "a", "value": 1}}),
            4161109
        );
        assert_eq!(code(doc! {"$unsetField": {"field": "a"}}), 4161109);
        assert_eq!(
            code(doc! {"$unsetField": {"field": "a", "input": {}, "value": 1}}),
            4161101
        );
        assert_eq!(
            code(doc! {"$setField": {"field": {"$concat": ["a", "b"]}, "value": 1, "input": {}}}),
            4161106
        );
        assert_eq!(
            code(doc! {"$setField": {"field": true, "value": 1, "input": {}}}),
            4161107
        );
        assert_eq!(
            code(doc! {"$setField": {"field": "$a", "value": 1, "input": {}}}),
            4161108
        );
        assert_eq!(
            code(doc! {"$setField": {"field": "a", "value": 1, "input": 5}}),
            4161105
        );
        assert_eq!(code(doc! {"$getField": {"field": "$a"}}), 5654600);
        assert_eq!(code(doc! {"$getField": {"field": [1]}}), 5654601);
        assert_eq!(code(doc! {"$getField": {"field": 1}}), 5654602);
        assert_eq!(code(doc! {"$getField": {"input": {}}}), 3041702);
        assert_eq!(
            code(doc! {"$getField": {"field": "a", "other": 1}}),
            3041701
        );
    }

    #[test]
    fn sort_array_orders_as_mongod() {
        let r = |e: bson::Document| {
            eval(&Bson::Document(e), &doc! {}).map(|v| v.unwrap_or(Bson::Undefined))
        };
        // Whole values in BSON order: numbers (by value, across types) before strings, objects,
        // arrays, booleans; null first.
        assert_eq!(
            r(doc! {"$sortArray": {"input": [true, "b", 2.5, {"x": 1}, 1, null, "a", [0], 3i64], "sortBy": 1}}).unwrap(),
            Bson::Array(vec![Bson::Null, 1.into(), 2.5.into(), 3i64.into(), "a".into(), "b".into(), Bson::Document(doc! {"x": 1}), Bson::Array(vec![0.into()]), true.into()])
        );
        assert_eq!(
            r(doc! {"$sortArray": {"input": [2, 3, 1], "sortBy": -1}}).unwrap(),
            Bson::Array(vec![3.into(), 2.into(), 1.into()])
        );
        // By fields, stable for ties; elements that are not documents have the fields missing.
        assert_eq!(
            r(doc! {"$sortArray": {"input": [{"a": 2, "n": 1}, {"a": 1, "n": 2}, 7, {"a": 2, "n": 3}, {"a": 1, "n": 4}], "sortBy": {"a": -1}}}).unwrap(),
            Bson::Array(vec![
                Bson::Document(doc! {"a": 2, "n": 1}),
                Bson::Document(doc! {"a": 2, "n": 3}),
                Bson::Document(doc! {"a": 1, "n": 2}),
                Bson::Document(doc! {"a": 1, "n": 4}),
                7.into(),
            ])
        );
        assert_eq!(
            r(doc! {"$sortArray": {"input": [{"a": {"b": 2}}, {"a": {"b": 1}}], "sortBy": {"a.b": 1}}}).unwrap(),
            Bson::Array(vec![Bson::Document(doc! {"a": {"b": 1}}), Bson::Document(doc! {"a": {"b": 2}})])
        );
        assert_eq!(
            r(doc! {"$sortArray": {"input": "$nope", "sortBy": 1}}).unwrap(),
            Bson::Null
        );
        assert_eq!(
            r(doc! {"$sortArray": {"input": null, "sortBy": 1}}).unwrap(),
            Bson::Null
        );
        let code = |e: bson::Document| r(e).unwrap_err().code.0;
        assert_eq!(code(doc! {"$sortArray": [1]}), 2942500);
        assert_eq!(
            code(doc! {"$sortArray": {"input": [1], "sortBy": 1, "x": 1}}),
            2942501
        );
        assert_eq!(code(doc! {"$sortArray": {"sortBy": 1}}), 2942502);
        assert_eq!(code(doc! {"$sortArray": {"input": [1]}}), 2942503);
        assert_eq!(
            code(doc! {"$sortArray": {"input": 5, "sortBy": 1}}),
            2942504
        );
        assert_eq!(
            code(doc! {"$sortArray": {"input": "s", "sortBy": 1}}),
            2942504
        );
        assert_eq!(
            code(doc! {"$sortArray": {"input": [1], "sortBy": 2}}),
            2942506
        );
        assert_eq!(
            code(doc! {"$sortArray": {"input": [1], "sortBy": "a"}}),
            2942506
        );
        assert_eq!(
            code(doc! {"$sortArray": {"input": [1], "sortBy": {"a": 2}}}),
            15975
        );
        assert_eq!(
            code(doc! {"$sortArray": {"input": [1], "sortBy": {"a": "x"}}}),
            15974
        );
    }
}
