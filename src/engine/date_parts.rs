//! `$dateFromParts` and `$dateToParts`: a date built from calendar or ISO week-date parts, and
//! a date taken apart, in a time zone read as the other date operators read it.
//!
//! As mongod: parts out of their usual range carry into the next larger one (`month: 14` is
//! February of the next year, `day: 0` the last day of the previous month, `hour: -1` the
//! previous day's 23:00); a null or missing-valued part, or a null `timezone` (or `iso8601`),
//! makes the result null. Codes: 40519/40524 for a non-object argument, 40518/40520 for an
//! unknown field, 40516 without `year` or `isoWeekYear`, 40489/40525 for calendar and ISO parts
//! mixed, 40522 without `date`, 40515 for a part that is not an integer, 40523 (`year`) and
//! 31095 (`isoWeekYear`) outside 1–9999, 31034 for the other parts outside [-32768, 32767]
//! (`second` and `millisecond` take any 64-bit integer), 40521 for an `iso8601` that is not a
//! boolean, 16006 for a `date` that is not a date, 40517/40485 for a bad time zone.

use bson::{doc, Bson, Document};

use super::aggregate::{err, eval_in, Budget, Variables};
use super::expressions::{
    civil, date_of, days_from_civil, given_or_null, integral64, iso_week, nullish, DAY_MS,
};
use super::time_zone::time_zone;
use super::EngineError;
use crate::value::field::type_name;
use crate::value::render::render_value;

/// The fields of `$dateFromParts`, in the order mongod evaluates them.
const FROM_FIELDS: &[&str] = &[
    "year",
    "month",
    "day",
    "hour",
    "minute",
    "second",
    "millisecond",
    "isoWeekYear",
    "isoWeek",
    "isoDayOfWeek",
];

/// Evaluates `$dateFromParts` or `$dateToParts`.
pub(super) fn expression(
    op: &str,
    args: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Bson, EngineError> {
    if op == "$dateToParts" {
        to_parts(args, root, vars, budget)
    } else {
        from_parts(args, root, vars, budget)
    }
}

fn from_parts(
    args: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Bson, EngineError> {
    let Bson::Document(d) = args else {
        return Err(err(
            40519,
            "$dateFromParts only supports an object as its argument",
        ));
    };
    if let Some(k) = d
        .keys()
        .find(|k| !FROM_FIELDS.contains(&k.as_str()) && *k != "timezone")
    {
        return Err(err(
            40518,
            format!("Unrecognized argument to $dateFromParts: {k}"),
        ));
    }
    let has = |k: &str| d.contains_key(k);
    if !has("year") && !has("isoWeekYear") {
        return Err(err(
            40516,
            "$dateFromParts requires either 'year' or 'isoWeekYear' to be present",
        ));
    }
    if has("year") && (has("isoWeekYear") || has("isoWeek") || has("isoDayOfWeek")) {
        return Err(err(
            40489,
            "$dateFromParts does not allow mixing natural dates with ISO dates",
        ));
    }
    if has("isoWeekYear") && (has("month") || has("day")) {
        return Err(err(
            40525,
            "$dateFromParts does not allow mixing ISO dates with natural dates",
        ));
    }
    let mut get = |k: &str| -> Result<Option<Bson>, EngineError> {
        match d.get(k) {
            Some(e) => eval_in(e, root, vars, budget),
            None => Ok(None),
        }
    };
    let tz = given_or_null(d, "timezone", &mut get)?;
    let Some(tz) = time_zone(tz)? else {
        return Ok(Bson::Null);
    };
    // Each part: its default when absent, null when it evaluates to null or nothing.
    let mut values = [0i64; 10];
    for (i, name) in FROM_FIELDS.iter().enumerate() {
        let default = match *name {
            "year" | "isoWeekYear" => 1970,
            "month" | "day" | "isoWeek" | "isoDayOfWeek" => 1,
            _ => 0,
        };
        if !d.contains_key(*name) {
            values[i] = default;
            continue;
        }
        let v = match get(name)? {
            Some(v) if !nullish(&v) => v,
            _ => return Ok(Bson::Null),
        };
        values[i] = part_value(name, &v)?;
    }
    let [year, month, day, hour, minute, second, millis, iso_year, iso_week_no, iso_dow] = values;
    let days = if d.contains_key("isoWeekYear") {
        // Week 1 is the week (Monday first) holding January 4th.
        let jan4 = days_from_civil(iso_year, 1, 4);
        let monday = jan4 - ((jan4 + 3).rem_euclid(7));
        monday + (iso_week_no - 1) * 7 + (iso_dow - 1)
    } else {
        let months = year * 12 + (month - 1);
        let (y, m) = (months.div_euclid(12), months.rem_euclid(12) as u32 + 1);
        days_from_civil(y, m, 1) + (day - 1)
    };
    let overflow = || {
        err(
            crate::value::error_codes::ErrorCode::Overflow.0,
            "$dateFromParts: the date is out of range",
        )
    };
    let local = days
        .checked_mul(DAY_MS)
        .and_then(|v| v.checked_add(hour * 3_600_000))
        .and_then(|v| v.checked_add(minute * 60_000))
        .and_then(|v| second.checked_mul(1000).and_then(|s| v.checked_add(s)))
        .and_then(|v| v.checked_add(millis))
        .and_then(|v| tz.wall_to_utc(v))
        .ok_or_else(overflow)?;
    Ok(Bson::DateTime(bson::DateTime::from_millis(local)))
}

/// A part's value, checked as mongod checks it.
fn part_value(name: &str, v: &Bson) -> Result<i64, EngineError> {
    let wide = matches!(name, "second" | "millisecond");
    let n = integral64(v).filter(|n| wide || i32::try_from(*n).is_ok());
    let Some(n) = n else {
        return Err(err(
            40515,
            format!(
                "'{name}' must evaluate to an integer, found {} with value {}",
                type_name(v),
                render_value(v)
            ),
        ));
    };
    match name {
        "year" | "isoWeekYear" if !(1..=9999).contains(&n) => Err(err(
            if name == "year" { 40523 } else { 31095 },
            format!("'{name}' must evaluate to an integer in the range 1 to 9999, found {n}"),
        )),
        "second" | "millisecond" | "year" | "isoWeekYear" => Ok(n),
        _ if !(-32768..=32767).contains(&n) => Err(err(
            31034,
            format!(
                "'{name}' must evaluate to a value in the range [-32768, 32767]; value {n} is not in range"
            ),
        )),
        _ => Ok(n),
    }
}

fn to_parts(
    args: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Bson, EngineError> {
    let Bson::Document(d) = args else {
        return Err(err(
            40524,
            "$dateToParts only supports an object as its argument",
        ));
    };
    if let Some(k) = d
        .keys()
        .find(|k| !matches!(k.as_str(), "date" | "timezone" | "iso8601"))
    {
        return Err(err(
            40520,
            format!("Unrecognized argument to $dateToParts: {k}"),
        ));
    }
    if !d.contains_key("date") {
        return Err(err(40522, "Missing 'date' parameter to $dateToParts"));
    }
    let mut get = |k: &str| -> Result<Option<Bson>, EngineError> {
        match d.get(k) {
            Some(e) => eval_in(e, root, vars, budget),
            None => Ok(None),
        }
    };
    let date = get("date")?.unwrap_or(Bson::Null);
    let tz = given_or_null(d, "timezone", &mut get)?;
    let Some(tz) = time_zone(tz)? else {
        return Ok(Bson::Null);
    };
    let iso = match d.contains_key("iso8601") {
        false => false,
        true => match get("iso8601")? {
            Some(Bson::Boolean(b)) => b,
            None => return Ok(Bson::Null),
            Some(v) if nullish(&v) => return Ok(Bson::Null),
            Some(other) => {
                return Err(err(
                    40521,
                    format!(
                        "iso8601 must evaluate to a bool, found {}",
                        type_name(&other)
                    ),
                ))
            }
        },
    };
    let Some(ms) = date_of("$dateToParts", &date)? else {
        return Ok(Bson::Null);
    };
    let local = tz.local(ms);
    let (days, in_day) = (local.div_euclid(DAY_MS), local.rem_euclid(DAY_MS));
    let int = |n: i64| Bson::Int32(n as i32);
    let clock = doc! {
        "hour": int(in_day / 3_600_000),
        "minute": int(in_day / 60_000 % 60),
        "second": int(in_day / 1000 % 60),
        "millisecond": int(in_day % 1000),
    };
    let mut out = if iso {
        let (y, w, dow) = iso_week(days);
        doc! {"isoWeekYear": int(y), "isoWeek": int(w), "isoDayOfWeek": int(dow)}
    } else {
        let (y, m, day) = civil(days);
        doc! {"year": int(y), "month": int(m as i64), "day": int(day as i64)}
    };
    out.extend(clock);
    Ok(Bson::Document(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(e: Document, root: &Document) -> Result<Bson, EngineError> {
        super::super::aggregate::eval(&Bson::Document(e), root).map(|v| v.unwrap_or(Bson::Null))
    }

    fn date(s: &str) -> Bson {
        Bson::DateTime(bson::DateTime::parse_rfc3339_str(s).unwrap())
    }

    #[test]
    fn from_parts_builds_and_carries() {
        let r = doc! {};
        let f = |e: Document| eval(doc! {"$dateFromParts": e}, &r).unwrap();
        assert_eq!(
            f(
                doc! {"year": 2017, "month": 2, "day": 8, "hour": 12, "minute": 30, "second": 5, "millisecond": 7}
            ),
            date("2017-02-08T12:30:05.007Z")
        );
        assert_eq!(f(doc! {"year": 2017}), date("2017-01-01T00:00:00Z"));
        // Carries: month 14, day 0, negative hours, big seconds.
        assert_eq!(
            f(doc! {"year": 2016, "month": 14, "day": 1}),
            date("2017-02-01T00:00:00Z")
        );
        assert_eq!(
            f(doc! {"year": 2017, "month": 3, "day": 0}),
            date("2017-02-28T00:00:00Z")
        );
        assert_eq!(
            f(doc! {"year": 2016, "month": 3, "day": 0}),
            date("2016-02-29T00:00:00Z")
        );
        assert_eq!(
            f(doc! {"year": 2017, "month": 0}),
            date("2016-12-01T00:00:00Z")
        );
        assert_eq!(
            f(doc! {"year": 2017, "month": -13}),
            date("2015-11-01T00:00:00Z")
        );
        assert_eq!(
            f(doc! {"year": 2017, "day": 1, "hour": -1}),
            date("2016-12-31T23:00:00Z")
        );
        assert_eq!(
            f(doc! {"year": 2017, "second": 86_400i64 * 366}),
            date("2018-01-02T00:00:00Z")
        );
        assert_eq!(
            f(doc! {"year": 2017, "millisecond": -1}),
            date("2016-12-31T23:59:59.999Z")
        );
        // ISO week dates: 2017-W01-1 is 2017-01-02; 2016-W53-7 is 2017-01-01.
        assert_eq!(f(doc! {"isoWeekYear": 2017}), date("2017-01-02T00:00:00Z"));
        assert_eq!(
            f(doc! {"isoWeekYear": 2016, "isoWeek": 52, "isoDayOfWeek": 7}),
            date("2017-01-01T00:00:00Z")
        );
        assert_eq!(
            f(doc! {"isoWeekYear": 2020, "isoWeek": 53, "isoDayOfWeek": 5, "hour": 10}),
            date("2021-01-01T10:00:00Z")
        );
        assert_eq!(
            f(doc! {"isoWeekYear": 2017, "isoWeek": 0}),
            date("2016-12-26T00:00:00Z")
        );
        // Time zones: the parts are local time.
        assert_eq!(
            f(doc! {"year": 2017, "month": 6, "day": 1, "hour": 3, "timezone": "+05:30"}),
            date("2017-05-31T21:30:00Z")
        );
        assert_eq!(
            f(doc! {"year": 2017, "hour": 1, "timezone": "Etc/GMT+2"}),
            date("2017-01-01T03:00:00Z")
        );
        // Integral doubles are integers; null parts or zone make null.
        assert_eq!(
            f(doc! {"year": 2017.0, "month": 2i64}),
            date("2017-02-01T00:00:00Z")
        );
        assert_eq!(f(doc! {"year": 2017, "month": Bson::Null}), Bson::Null);
        assert_eq!(f(doc! {"year": "$nope"}), Bson::Null);
        assert_eq!(f(doc! {"year": 2017, "timezone": Bson::Null}), Bson::Null);
    }

    #[test]
    fn to_parts_takes_dates_apart() {
        let r = doc! {"d": date("2017-01-01T23:45:06.789Z"), "n": 5};
        let t = |e: Document| eval(doc! {"$dateToParts": e}, &r);
        assert_eq!(
            t(doc! {"date": "$d"}).unwrap(),
            Bson::Document(
                doc! {"year": 2017, "month": 1, "day": 1, "hour": 23, "minute": 45, "second": 6, "millisecond": 789}
            )
        );
        assert_eq!(
            t(doc! {"date": "$d", "iso8601": true}).unwrap(),
            Bson::Document(
                doc! {"isoWeekYear": 2016, "isoWeek": 52, "isoDayOfWeek": 7, "hour": 23, "minute": 45, "second": 6, "millisecond": 789}
            )
        );
        assert_eq!(
            t(doc! {"date": "$d", "timezone": "+01:00"}).unwrap(),
            Bson::Document(
                doc! {"year": 2017, "month": 1, "day": 2, "hour": 0, "minute": 45, "second": 6, "millisecond": 789}
            )
        );
        assert_eq!(
            t(doc! {"date": "$d", "timezone": "+01:00", "iso8601": true}).unwrap(),
            Bson::Document(
                doc! {"isoWeekYear": 2017, "isoWeek": 1, "isoDayOfWeek": 1, "hour": 0, "minute": 45, "second": 6, "millisecond": 789}
            )
        );
        assert_eq!(t(doc! {"date": "$nope"}).unwrap(), Bson::Null);
        assert_eq!(
            t(doc! {"date": "$d", "timezone": Bson::Null}).unwrap(),
            Bson::Null
        );
        assert_eq!(
            t(doc! {"date": "$d", "iso8601": Bson::Null}).unwrap(),
            Bson::Null
        );
        // The round trip through $dateFromParts.
        let back = eval(
            doc! {"$dateFromParts": {"isoWeekYear": 2016, "isoWeek": 52, "isoDayOfWeek": 7, "hour": 23, "minute": 45, "second": 6, "millisecond": 789}},
            &r,
        )
        .unwrap();
        assert_eq!(back, r.get("d").cloned().unwrap());
    }

    #[test]
    fn bad_arguments_get_mongods_codes() {
        let r = doc! {"d": date("2017-01-01T00:00:00Z")};
        let code = |e: Document| eval(e, &r).unwrap_err().code.0;
        assert_eq!(code(doc! {"$dateFromParts": 1}), 40519);
        assert_eq!(code(doc! {"$dateFromParts": {"year": 1, "x": 1}}), 40518);
        assert_eq!(code(doc! {"$dateFromParts": {"month": 1}}), 40516);
        assert_eq!(
            code(doc! {"$dateFromParts": {"year": 2017, "isoWeek": 1}}),
            40489
        );
        assert_eq!(
            code(doc! {"$dateFromParts": {"isoWeekYear": 2017, "day": 1}}),
            40525
        );
        assert_eq!(code(doc! {"$dateFromParts": {"year": 2017.5}}), 40515);
        assert_eq!(code(doc! {"$dateFromParts": {"year": "2017"}}), 40515);
        assert_eq!(code(doc! {"$dateFromParts": {"year": 0}}), 40523);
        assert_eq!(code(doc! {"$dateFromParts": {"year": 10000}}), 40523);
        assert_eq!(code(doc! {"$dateFromParts": {"isoWeekYear": 0}}), 31095);
        assert_eq!(
            code(doc! {"$dateFromParts": {"year": 2017, "month": 32768}}),
            31034
        );
        assert_eq!(
            code(doc! {"$dateFromParts": {"year": 2017, "hour": -32769}}),
            31034
        );
        assert_eq!(
            code(doc! {"$dateFromParts": {"year": 2017, "second": 1.5}}),
            40515
        );
        assert_eq!(
            code(doc! {"$dateFromParts": {"year": 2017, "timezone": 5}}),
            40517
        );
        assert_eq!(
            code(doc! {"$dateFromParts": {"year": 2017, "timezone": "Mars/Base"}}),
            40485
        );
        assert_eq!(code(doc! {"$dateToParts": "$d"}), 40524);
        assert_eq!(code(doc! {"$dateToParts": {"date": "$d", "x": 1}}), 40520);
        assert_eq!(code(doc! {"$dateToParts": {"timezone": "UTC"}}), 40522);
        assert_eq!(
            code(doc! {"$dateToParts": {"date": "$d", "iso8601": 1}}),
            40521
        );
        assert_eq!(code(doc! {"$dateToParts": {"date": 5}}), 16006);
    }
}
