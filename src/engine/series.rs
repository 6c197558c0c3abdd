//! The `$setWindowFields` functions that read a partition as a series rather than as a bag of
//! values: `$expMovingAvg` (an exponential moving average down the sorted partition),
//! `$derivative` (rise over run between the ends of a window), `$integral` (the trapezoidal
//! rule across a window) and `$covariancePop` / `$covarianceSamp` (of two expressions over a
//! window). Each is parsed once, with mongod's codes and messages for a malformed argument, then
//! computed for a whole partition given each document's window.
//!
//! Numbers are computed as doubles, as the rest of the engine computes them; a decimal input
//! makes a decimal result (mongod also computes `$expMovingAvg` in decimal for double inputs and
//! sums with extra precision, so a result may differ from mongod's in its last digits).

use bson::{Bson, Document};

use super::aggregate::{check_expression, err, eval_with, Variables};
use super::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::{is_number, to_decimal, to_f64, type_name};
use crate::value::render::render_value;

/// Whether `op` is one of this module's window functions.
pub(super) fn is_series_function(op: &str) -> bool {
    matches!(
        op,
        "$expMovingAvg" | "$derivative" | "$integral" | "$covariancePop" | "$covarianceSamp"
    )
}

/// A parsed series window function.
#[derive(Debug, Clone)]
pub(super) enum SeriesFn {
    /// `{$expMovingAvg: {input, N | alpha}}`: the weight of each new value.
    ExpMovingAvg { input: Bson, alpha: f64 },
    /// `{$derivative: {input, unit}, window}`: `unit` in milliseconds.
    Derivative { input: Bson, unit: Option<f64> },
    /// `{$integral: {input, unit}, window}`: `unit` in milliseconds.
    Integral { input: Bson, unit: Option<f64> },
    /// `{$covariancePop | $covarianceSamp: [x, y], window}`.
    Covariance { input: Bson, sample: bool },
}

fn parse_error(message: impl Into<String>) -> EngineError {
    err(ErrorCode::FailedToParse.0, message)
}

impl SeriesFn {
    /// Parses `op`'s argument. `has_window` tells whether the output field gave a `window`;
    /// `sort` is the stage's `sortBy`.
    pub(super) fn parse(
        op: &str,
        arg: &Bson,
        has_window: bool,
        sort: Option<&Document>,
    ) -> Result<SeriesFn, EngineError> {
        match op {
            "$expMovingAvg" => parse_exp_moving_avg(arg, has_window, sort),
            "$derivative" | "$integral" => {
                match sort {
                    None => return Err(parse_error(format!("{op} requires a sortBy"))),
                    Some(s) if s.len() != 1 => {
                        return Err(parse_error(format!("{op} requires a non-compound sortBy")))
                    }
                    Some(_) => {}
                }
                let Bson::Document(a) = arg else {
                    return Err(parse_error(format!(
                        "{op} expects an object, but got a {}: {}",
                        type_name(arg),
                        render_value(arg)
                    )));
                };
                let mut input = None;
                let mut unit = None;
                for (k, v) in a {
                    match k.as_str() {
                        "input" => {
                            check_expression(v)?;
                            input = Some(v.clone());
                        }
                        "unit" => unit = Some(parse_unit(v)?),
                        other => {
                            return Err(parse_error(format!(
                                "{op} got unexpected argument: {other}"
                            )))
                        }
                    }
                }
                let Some(input) = input else {
                    return Err(parse_error(format!("{op} requires an 'input' expression")));
                };
                if op == "$derivative" {
                    if !has_window {
                        return Err(parse_error("$derivative requires explicit window bounds"));
                    }
                    Ok(SeriesFn::Derivative { input, unit })
                } else {
                    Ok(SeriesFn::Integral { input, unit })
                }
            }
            _ => {
                check_expression(arg)?;
                Ok(SeriesFn::Covariance {
                    input: arg.clone(),
                    sample: op == "$covarianceSamp",
                })
            }
        }
    }

    /// The value of each document of the sorted partition `part`. `window(i)` is the range
    /// `[lo, hi)` of the documents in document `i`'s window; `sort_field` is the single sortBy
    /// field of `$derivative` and `$integral`.
    pub(super) fn compute(
        &self,
        part: &[Document],
        sort_field: &str,
        window: &dyn Fn(usize) -> (usize, usize),
        vars: &Variables,
    ) -> Result<Vec<Bson>, EngineError> {
        match self {
            SeriesFn::ExpMovingAvg { input, alpha } => exp_moving_avg(input, *alpha, part, vars),
            SeriesFn::Derivative { input, unit } => {
                let mut out = Vec::with_capacity(part.len());
                for i in 0..part.len() {
                    let (lo, hi) = window(i);
                    out.push(if lo >= hi {
                        Bson::Null
                    } else {
                        derivative(input, *unit, &part[lo], &part[hi - 1], sort_field, vars)?
                    });
                }
                Ok(out)
            }
            SeriesFn::Integral { input, unit } => {
                let points = integral_points(input, *unit, part, sort_field, vars)?;
                // A document's bad value is an error once a window holds it, as in mongod.
                over_windows(
                    &points,
                    window,
                    |state: &mut Integral, p| {
                        state.add(p.clone()?);
                        Ok(())
                    },
                    |state| state.value(*unit),
                )
            }
            SeriesFn::Covariance { input, sample } => {
                let mut pairs = Vec::with_capacity(part.len());
                for d in part {
                    pairs.push(match eval_with(input, d, vars)? {
                        Some(Bson::Array(a))
                            if a.len() == 2 && is_number(&a[0]) && is_number(&a[1]) =>
                        {
                            Some((a[0].clone(), a[1].clone()))
                        }
                        _ => None,
                    });
                }
                over_windows(
                    &pairs,
                    window,
                    |state: &mut Covariance, pair| {
                        if let Some((x, y)) = pair {
                            state.add(x, y);
                        }
                        Ok(())
                    },
                    |state| state.value(*sample),
                )
            }
        }
    }
}

/// Each document's value over its window `[lo, hi)` of `items`, from a state the items are
/// added to in partition order. A window that starts where the last one started and ends no
/// earlier extends that state (the default and left-unbounded windows cost one pass); any other
/// window is computed afresh, so every value is the one its window alone gives.
fn over_windows<T, S: Default>(
    items: &[T],
    window: &dyn Fn(usize) -> (usize, usize),
    add: impl Fn(&mut S, &T) -> Result<(), EngineError>,
    value: impl Fn(&S) -> Bson,
) -> Result<Vec<Bson>, EngineError> {
    let mut out = Vec::with_capacity(items.len());
    let mut state = S::default();
    let (mut start, mut end) = (0, 0);
    for i in 0..items.len() {
        let (lo, hi) = window(i);
        let hi = hi.max(lo);
        if lo != start || hi < end {
            state = S::default();
            (start, end) = (lo, lo);
        }
        for item in &items[end..hi] {
            add(&mut state, item)?;
        }
        end = hi;
        out.push(value(&state));
    }
    Ok(out)
}

/// `$expMovingAvg`'s argument: exactly `input` and one of `N` (a positive integer, weight
/// `2 / (N + 1)`) or `alpha` (strictly between 0 and 1), with a sortBy and no window.
fn parse_exp_moving_avg(
    arg: &Bson,
    has_window: bool,
    sort: Option<&Document>,
) -> Result<SeriesFn, EngineError> {
    let Bson::Document(a) = arg else {
        return Err(parse_error(
            "$expMovingAvg must have exactly one argument that is an object",
        ));
    };
    if has_window {
        return Err(parse_error(
            "$expMovingAvg must have exactly one argument that is an object",
        ));
    }
    let shape = "$expMovingAvg sub object must have exactly two fields: An 'input' field, and either an 'N' field or an 'alpha' field";
    let Some(input) = a.get("input").filter(|_| a.len() == 2) else {
        return Err(parse_error(shape));
    };
    if sort.is_none() {
        return Err(parse_error("$expMovingAvg requires an explicit 'sortBy'"));
    }
    check_expression(input)?;
    let alpha = if let Some(n) = a.get("N") {
        if !is_number(n) {
            return Err(parse_error(format!(
                "'N' field must be an integer, but found type {}",
                type_name(n)
            )));
        }
        let f = to_f64(n);
        if f != f.floor() {
            return Err(parse_error(format!(
                "'N' field must be an integer, but found  {}. To use a non-integer, use the 'alpha' argument instead",
                render_value(n)
            )));
        }
        if f <= 0.0 {
            return Err(parse_error(format!(
                "'N' must be greater than zero. Got {}",
                f as i64
            )));
        }
        2.0 / (f + 1.0)
    } else if let Some(v) = a.get("alpha") {
        if !is_number(v) {
            return Err(parse_error("'alpha' must be a number"));
        }
        let f = to_f64(v);
        if !(f > 0.0 && f < 1.0) {
            return Err(parse_error(format!(
                "'alpha' must be between 0 and 1 (exclusive), found {}",
                render_value(v)
            )));
        }
        f
    } else {
        return Err(parse_error(format!(
            "Got unrecognized field in $expMovingAvg{shape}"
        )));
    };
    Ok(SeriesFn::ExpMovingAvg {
        input: input.clone(),
        alpha,
    })
}

/// The `unit` of `$derivative` and `$integral`: a week or shorter, in milliseconds.
fn parse_unit(v: &Bson) -> Result<f64, EngineError> {
    let Bson::String(u) = v else {
        return Err(parse_error(format!(
            "unit' must be a string, but got {}",
            type_name(v)
        )));
    };
    if matches!(u.as_str(), "year" | "quarter" | "month") {
        return Err(err(5490710, "unit must be 'week' or smaller"));
    }
    super::stages::unit_millis(u)
        .ok_or_else(|| parse_error(format!("unknown time unit value: {u}")))
}

/// A number or a decimal made from `f`, as the inputs were.
fn number(f: f64, decimal: bool) -> Bson {
    if decimal {
        to_decimal(f)
    } else {
        Bson::Double(f)
    }
}

fn is_decimal(v: &Bson) -> bool {
    matches!(v, Bson::Decimal128(_))
}

/// `$expMovingAvg` down the partition: null until the first number, then that number, then
/// `alpha · value + (1 − alpha) · previous` at each later number; other values leave it as it
/// was. A double result, a decimal once a decimal has been seen.
fn exp_moving_avg(
    input: &Bson,
    alpha: f64,
    part: &[Document],
    vars: &Variables,
) -> Result<Vec<Bson>, EngineError> {
    let mut current: Option<f64> = None;
    let mut decimal = false;
    let mut out = Vec::with_capacity(part.len());
    for d in part {
        if let Some(v) = eval_with(input, d, vars)?.filter(is_number) {
            decimal |= is_decimal(&v);
            let x = to_f64(&v);
            current = Some(match current {
                None => x,
                Some(prev) => x * alpha + prev * (1.0 - alpha),
            });
        }
        out.push(current.map_or(Bson::Null, |c| number(c, decimal)));
    }
    Ok(out)
}

/// `$derivative` between the first (`left`) and last (`right`) documents of a window: the
/// change of `input` over the change of the sort value, per `unit` when the sort values are
/// dates. Null when the sort values are equal (a window of one document).
fn derivative(
    input: &Bson,
    unit: Option<f64>,
    left: &Document,
    right: &Document,
    sort_field: &str,
    vars: &Variables,
) -> Result<Bson, EngineError> {
    let time = |d: &Document| {
        crate::engine::path::get(d, sort_field)
            .cloned()
            .unwrap_or(Bson::Null)
    };
    let (t0, t1) = (time(left), time(right));
    let run: Bson = match (&t0, &t1) {
        (Bson::DateTime(a), Bson::DateTime(b)) if unit.is_some() => {
            Bson::Int64(b.timestamp_millis().saturating_sub(a.timestamp_millis()))
        }
        _ if unit.is_some() => {
            return Err(err(
                5624900,
                "$derivative with 'unit' expects the sortBy field to be a Date",
            ))
        }
        (Bson::DateTime(_), _) | (_, Bson::DateTime(_)) => {
            return Err(err(
                5624901,
                "$derivative where the sortBy is a Date requires an 'unit'",
            ))
        }
        (a, b) if is_number(a) && is_number(b) => super::aggregate::subtract(b, a),
        _ => {
            return Err(err(
                5624902,
                "$derivative (with no 'unit') expects the sortBy field to be numeric",
            ))
        }
    };
    let value = |d: &Document| -> Result<Bson, EngineError> {
        Ok(eval_with(input, d, vars)?.unwrap_or(Bson::Null))
    };
    let (y0, y1) = (value(left)?, value(right)?);
    let rise = match (&y0, &y1) {
        (a, b) if super::expressions::nullish(a) || super::expressions::nullish(b) => {
            return Err(err(
                5624903,
                "$derivative input must not be null or missing",
            ))
        }
        (a, b) if is_number(a) && is_number(b) => super::aggregate::subtract(b, a),
        (Bson::DateTime(a), Bson::DateTime(b)) => {
            Bson::Int64(b.timestamp_millis().saturating_sub(a.timestamp_millis()))
        }
        // A date less a number is a date, which cannot be divided.
        (Bson::DateTime(_), n) if is_number(n) => {
            return Err(err(
                16609,
                format!(
                    "$divide only supports numeric types, not date and {}",
                    type_name(&run)
                ),
            ))
        }
        (a, b) => {
            return Err(err(
                16556,
                format!("cant $subtract a {} from a {}", type_name(a), type_name(b)),
            ))
        }
    };
    let run_f = to_f64(&run);
    if run_f == 0.0 {
        return Ok(Bson::Null);
    }
    let slope = to_f64(&rise) / run_f * unit.unwrap_or(1.0);
    Ok(number(slope, is_decimal(&rise) || is_decimal(&run)))
}

/// One point of `$integral`: the sort value (a number, or a date as milliseconds) and the
/// input's value, whether either is NaN and whether either is a decimal.
#[derive(Debug, Clone, Copy)]
struct Point {
    x: f64,
    y: f64,
    nan: bool,
    decimal: bool,
}

/// A document's point, or the error it raises once a window holds it.
type Checked = Result<Point, EngineError>;

/// Every document's point, or mongod's error for it: an input that is not a number (5423900),
/// a sort value that is not a date with `unit` (5423901) or a number without (5423902).
fn integral_points(
    input: &Bson,
    unit: Option<f64>,
    part: &[Document],
    sort_field: &str,
    vars: &Variables,
) -> Result<Vec<Checked>, EngineError> {
    let mut points = Vec::with_capacity(part.len());
    for d in part {
        points.push(integral_point(input, unit, d, sort_field, vars)?);
    }
    Ok(points)
}

fn integral_point(
    input: &Bson,
    unit: Option<f64>,
    d: &Document,
    sort_field: &str,
    vars: &Variables,
) -> Result<Checked, EngineError> {
    let x = crate::engine::path::get(d, sort_field)
        .cloned()
        .unwrap_or(Bson::Null);
    let y = eval_with(input, d, vars)?.unwrap_or(Bson::Null);
    let x_ok = is_number(&x) || matches!(x, Bson::DateTime(_));
    if !is_number(&y) || !x_ok {
        return Ok(Err(err(
            5423900,
            "The input value of $integral window function must be a vector of 2 value, the first value must be numeric or date type and the second must be numeric.",
        )));
    }
    let xf = match &x {
        Bson::DateTime(t) if unit.is_some() => t.timestamp_millis() as f64,
        _ if unit.is_some() => {
            return Ok(Err(err(
                5423901,
                "$integral with 'outputUnit' expects the sortBy field to be a Date",
            )))
        }
        Bson::DateTime(_) => {
            return Ok(Err(err(
                5423902,
                "$integral (with no 'outputUnit') expects the sortBy field to be numeric",
            )))
        }
        v => to_f64(v),
    };
    let yf = to_f64(&y);
    Ok(Ok(Point {
        x: xf,
        y: yf,
        nan: xf.is_nan() || yf.is_nan(),
        decimal: is_decimal(&x) || is_decimal(&y),
    }))
}

/// `$integral` of a window's points by the trapezoidal rule, in the partition's order.
#[derive(Debug, Default)]
struct Integral {
    points: usize,
    last: Option<Point>,
    sum: Sum,
    decimal: bool,
    nan: bool,
}

impl Integral {
    fn add(&mut self, p: Point) {
        self.points += 1;
        self.nan |= p.nan;
        if let Some(a) = self.last {
            self.decimal |= a.decimal || p.decimal;
            self.sum.add((a.y + p.y) * (p.x - a.x) / 2.0);
        }
        self.last = Some(p);
    }

    /// Null for an empty window, NaN when a value is NaN, the integer 0 for one point, divided
    /// by `unit`'s milliseconds when given.
    fn value(&self, unit: Option<f64>) -> Bson {
        match self.points {
            0 => Bson::Null,
            _ if self.nan => Bson::Double(f64::NAN),
            1 if unit.is_none() => Bson::Int32(0),
            1 => Bson::Double(0.0),
            _ => number(self.sum.value() / unit.unwrap_or(1.0), self.decimal),
        }
    }
}

/// `$covariancePop` / `$covarianceSamp` over a window's `[x, y]` pairs, accumulated with the
/// online algorithm mongod uses. Pairs with an infinite or NaN member make the result infinite
/// or NaN as mongod makes it.
#[derive(Debug, Default)]
struct Covariance {
    count: u64,
    sum_x: Sum,
    sum_y: Sum,
    c_xy: Sum,
    non_finite: Sum,
    decimal: bool,
}

impl Covariance {
    fn add(&mut self, xv: &Bson, yv: &Bson) {
        self.decimal |= is_decimal(xv) || is_decimal(yv);
        let (x, y) = (to_f64(xv), to_f64(yv));
        if !x.is_finite() || !y.is_finite() {
            // Same signs give that infinity; NaN or opposite signs give NaN.
            let mut inf = None;
            let mut nan = x.is_nan() || y.is_nan();
            for s in [x, y]
                .into_iter()
                .filter(|v| v.is_infinite())
                .map(f64::signum)
            {
                match inf {
                    Some(t) if t != s => nan = true,
                    _ => inf = Some(s),
                }
            }
            self.non_finite.add(if nan {
                f64::NAN
            } else {
                inf.unwrap_or(1.0) * f64::INFINITY
            });
            return;
        }
        let dx = (self.count > 0).then(|| x - self.sum_x.value() / self.count as f64);
        self.count += 1;
        self.sum_x.add(x);
        self.sum_y.add(y);
        let dy = y - self.sum_y.value() / self.count as f64;
        if let Some(dx) = dx {
            self.c_xy.add(dx * dy);
        }
    }

    /// Null without enough pairs (none for the population, fewer than two for the sample), 0
    /// for one pair of the population.
    fn value(&self, sample: bool) -> Bson {
        if self.count == 1 && !sample {
            return Bson::Double(0.0);
        }
        let n = self.count as f64 - if sample { 1.0 } else { 0.0 };
        if n <= 0.0 {
            return Bson::Null;
        }
        number(
            (self.c_xy.value() + self.non_finite.value()) / n,
            self.decimal,
        )
    }
}

/// A compensated (Neumaier) sum: the running error of each addition kept beside the total, so
/// long windows lose no more precision than a single addition.
#[derive(Debug, Default, Clone, Copy)]
struct Sum {
    total: f64,
    error: f64,
}

impl Sum {
    fn add(&mut self, v: f64) {
        if !v.is_finite() || !self.total.is_finite() {
            self.total += v;
            return;
        }
        let t = self.total + v;
        if self.total.abs() >= v.abs() {
            self.error += (self.total - t) + v;
        } else {
            self.error += (v - t) + self.total;
        }
        self.total = t;
    }

    fn value(&self) -> f64 {
        if self.total.is_finite() {
            self.total + self.error
        } else {
            self.total
        }
    }
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    fn run(stage: Document, docs: Vec<Document>) -> Result<Vec<Document>, EngineError> {
        super::super::aggregate::run(&[Bson::Document(stage)], docs)
    }

    fn code(stage: Document) -> i32 {
        run(stage, vec![doc! {"t": 1, "v": 1}]).unwrap_err().code.0
    }

    fn close(got: &Bson, want: f64) -> bool {
        let g = to_f64(got);
        (g - want).abs() <= 1e-12 * want.abs().max(1.0)
    }

    fn field(out: &[Document], f: &str) -> Vec<Bson> {
        out.iter()
            .map(|d| d.get(f).cloned().unwrap_or(Bson::Undefined))
            .collect()
    }

    #[test]
    fn exp_moving_avg_weights_each_number_and_skips_the_rest() {
        let docs = vec![
            doc! {"t": 1, "v": Bson::Null},
            doc! {"t": 2, "v": 3},
            doc! {"t": 3, "v": 6},
            doc! {"t": 4, "v": "x"},
            doc! {"t": 5, "v": 0},
        ];
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "n": {"$expMovingAvg": {"input": "$v", "N": 2}},
                "a": {"$expMovingAvg": {"input": "$v", "alpha": 0.25}},
            }}},
            docs,
        )
        .unwrap();
        // N = 2: alpha = 2/3. 3; 6·2/3 + 3/3 = 5; unchanged; 0 + 5/3.
        let n = field(&out, "n");
        assert_eq!(n[0], Bson::Null);
        assert_eq!(n[1], Bson::Double(3.0));
        assert!(close(&n[2], 5.0), "{n:?}");
        assert!(close(&n[3], 5.0), "{n:?}");
        assert!(close(&n[4], 5.0 / 3.0), "{n:?}");
        // alpha = 1/4: 3; 6/4 + 3·3/4 = 3.75; unchanged; 3.75·3/4 = 2.8125.
        let a = field(&out, "a");
        assert_eq!(
            a,
            vec![
                Bson::Null,
                Bson::Double(3.0),
                Bson::Double(3.75),
                Bson::Double(3.75),
                Bson::Double(2.8125)
            ]
        );
        // A decimal input makes a decimal result.
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "d": {"$expMovingAvg": {"input": "$v", "alpha": 0.5}},
            }}},
            vec![
                doc! {"t": 1, "v": 2},
                doc! {"t": 2, "v": "4".parse::<bson::Decimal128>().unwrap()},
            ],
        )
        .unwrap();
        assert_eq!(out[0].get("d"), Some(&Bson::Double(2.0)));
        assert_eq!(
            out[1].get("d"),
            Some(&Bson::Decimal128("3.0".parse().unwrap()))
        );
    }

    #[test]
    fn derivative_is_rise_over_run_between_the_window_ends() {
        let docs = vec![
            doc! {"t": 0, "v": 10},
            doc! {"t": 2, "v": 14},
            doc! {"t": 3, "v": 20.5},
            doc! {"t": 7, "v": 12},
        ];
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "d": {"$derivative": {"input": "$v"}, "window": {"documents": [-1, 0]}},
                "r": {"$derivative": {"input": "$v"}, "window": {"range": [-3, 0]}},
            }}},
            docs,
        )
        .unwrap();
        // One document: null; then (14−10)/2, (20.5−14)/1, (12−20.5)/4.
        assert_eq!(
            field(&out, "d"),
            vec![
                Bson::Null,
                Bson::Double(2.0),
                Bson::Double(6.5),
                Bson::Double(-2.125)
            ]
        );
        // Within 3 below: t=0 alone; 0..2; 0..3; 7 alone (4..7 holds only 7).
        assert_eq!(
            field(&out, "r"),
            vec![
                Bson::Null,
                Bson::Double(2.0),
                Bson::Double(10.5 / 3.0),
                Bson::Null
            ]
        );
        // Dates per hour: 90 minutes apart, up by 3: 2 per hour.
        let t0 = bson::DateTime::from_millis(1_700_000_000_000);
        let t1 = bson::DateTime::from_millis(1_700_000_000_000 + 90 * 60_000);
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "d": {"$derivative": {"input": "$v", "unit": "hour"}, "window": {"documents": ["unbounded", "current"]}},
            }}},
            vec![doc! {"t": t0, "v": 1}, doc! {"t": t1, "v": 4}],
        )
        .unwrap();
        let d = field(&out, "d");
        assert_eq!(d[0], Bson::Null);
        assert!(close(&d[1], 2.0), "{d:?}");
        // Runtime errors of the sort values and the input.
        let w = doc! {"documents": [-1, 0]};
        let bad = |input: Bson, unit: Option<&str>, docs: Vec<Document>| {
            let mut a = doc! {"input": input};
            if let Some(u) = unit {
                a.insert("unit", u);
            }
            run(
                doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"d": {"$derivative": a, "window": w.clone()}}}},
                docs,
            )
            .unwrap_err()
            .code
            .0
        };
        let nums = vec![doc! {"t": 1, "v": 1}, doc! {"t": 2}];
        let dates = vec![doc! {"t": t0, "v": 1}, doc! {"t": t1, "v": 2}];
        assert_eq!(bad("$v".into(), Some("hour"), nums.clone()), 5624900);
        assert_eq!(bad("$v".into(), None, dates), 5624901);
        assert_eq!(
            bad(
                "$v".into(),
                None,
                vec![doc! {"t": "a", "v": 1}, doc! {"t": "b", "v": 2}]
            ),
            5624902
        );
        assert_eq!(bad("$v".into(), None, nums), 5624903);
        assert_eq!(
            bad(
                "$v".into(),
                None,
                vec![doc! {"t": 1, "v": "a"}, doc! {"t": 2, "v": "b"}]
            ),
            16556
        );
    }

    #[test]
    fn integral_sums_trapezoids_across_the_window() {
        let docs = vec![
            doc! {"t": 0, "v": 0},
            doc! {"t": 1, "v": 2},
            doc! {"t": 3, "v": 4.5},
            doc! {"t": 4, "v": 1},
        ];
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "run": {"$integral": {"input": "$v"}, "window": {"documents": ["unbounded", "current"]}},
                "all": {"$integral": {"input": "$v"}},
                "near": {"$integral": {"input": "$v"}, "window": {"range": [-1, 0]}},
            }}},
            docs,
        )
        .unwrap();
        // Trapezoids: (0+2)·1/2 = 1, (2+4.5)·2/2 = 6.5, (4.5+1)·1/2 = 2.75.
        assert_eq!(
            field(&out, "run"),
            vec![
                Bson::Int32(0),
                Bson::Double(1.0),
                Bson::Double(7.5),
                Bson::Double(10.25)
            ]
        );
        assert_eq!(field(&out, "all"), vec![Bson::Double(10.25); 4]);
        // Within 1 below: alone; 0..1; 3 alone (2..3 holds only 3); 3..4.
        assert_eq!(
            field(&out, "near"),
            vec![
                Bson::Int32(0),
                Bson::Double(1.0),
                Bson::Int32(0),
                Bson::Double(2.75)
            ]
        );
        // Dates in hours: 30 minutes at 2 then 4 is 1.5 hour-units.
        let t0 = bson::DateTime::from_millis(0);
        let t1 = bson::DateTime::from_millis(30 * 60_000);
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "i": {"$integral": {"input": "$v", "unit": "hour"}, "window": {"documents": ["unbounded", "current"]}},
            }}},
            vec![doc! {"t": t0, "v": 2}, doc! {"t": t1, "v": 4}],
        )
        .unwrap();
        assert_eq!(field(&out, "i"), vec![Bson::Double(0.0), Bson::Double(1.5)]);
        // NaN anywhere in the window is NaN.
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"i": {"$integral": {"input": "$v"}}}}},
            vec![doc! {"t": 0, "v": 1}, doc! {"t": 1, "v": f64::NAN}],
        )
        .unwrap();
        assert!(out[0].get_f64("i").unwrap().is_nan());
        let bad = |docs: Vec<Document>, unit: bool| {
            let a = if unit {
                doc! {"input": "$v", "unit": "second"}
            } else {
                doc! {"input": "$v"}
            };
            run(
                doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"i": {"$integral": a}}}},
                docs,
            )
            .unwrap_err()
            .code
            .0
        };
        assert_eq!(bad(vec![doc! {"t": 1, "v": "x"}], false), 5423900);
        // A bad value no window holds is no error.
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "i": {"$integral": {"input": "$v"}, "window": {"documents": ["unbounded", -1]}},
            }}},
            vec![
                doc! {"t": 0, "v": 1},
                doc! {"t": 1, "v": 2},
                doc! {"t": 2, "v": "x"},
            ],
        )
        .unwrap();
        assert_eq!(
            field(&out, "i"),
            vec![Bson::Null, Bson::Int32(0), Bson::Double(1.5)]
        );
        assert_eq!(bad(vec![doc! {"t": 1}], false), 5423900);
        assert_eq!(bad(vec![doc! {"t": 1, "v": 1}], true), 5423901);
        assert_eq!(bad(vec![doc! {"t": t0, "v": 1}], false), 5423902);
    }

    #[test]
    fn covariance_of_pairs_over_windows() {
        let xs = [1.0, 2.0, 4.0, 7.0];
        let ys = [2.0, 3.0, 9.0, 1.0];
        let docs: Vec<Document> = (0..4)
            .map(|i| doc! {"t": i, "x": xs[i as usize], "y": ys[i as usize]})
            .chain([doc! {"t": 9, "x": "no", "y": 1}])
            .collect();
        let out = run(
            doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "pop": {"$covariancePop": ["$x", "$y"]},
                "samp": {"$covarianceSamp": ["$x", "$y"], "window": {"documents": ["unbounded", "current"]}},
                "pop1": {"$covariancePop": ["$x", "$y"], "window": {"documents": [0, 0]}},
            }}},
            docs,
        )
        .unwrap();
        // Means 3.5 and 3.75; Σ(x−x̄)(y−ȳ) = 4.375 + 1.125 + 2.625 − 9.625 = −1.5.
        for d in &out {
            assert!(close(d.get("pop").unwrap(), -1.5 / 4.0), "{d}");
        }
        let samp = field(&out, "samp");
        assert_eq!(samp[0], Bson::Null, "one pair has no sample covariance");
        // First two: (−0.5)(−0.5)·2 = 0.5, over 1.
        assert!(close(&samp[1], 0.5), "{samp:?}");
        // First three: means 7/3 and 14/3: (−4/3)(−8/3) + (−1/3)(−5/3) + (5/3)(13/3) = 102/9, over 2.
        assert!(close(&samp[2], 102.0 / 18.0), "{samp:?}");
        assert!(close(&samp[3], -1.5 / 3.0), "{samp:?}");
        assert!(close(&samp[4], -1.5 / 3.0), "the string pair is ignored");
        let pop1 = field(&out, "pop1");
        assert_eq!(pop1[0], Bson::Double(0.0));
        assert_eq!(pop1[4], Bson::Null, "no numeric pair");
    }

    #[test]
    fn malformed_specifications_get_mongod_codes() {
        let f =
            |f: Document| code(doc! {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"x": f}}});
        let unsorted = |f: Document| code(doc! {"$setWindowFields": {"output": {"x": f}}});
        // $expMovingAvg.
        assert_eq!(unsorted(doc! {"$expMovingAvg": {"input": "$v", "N": 2}}), 9);
        assert_eq!(
            f(doc! {"$expMovingAvg": {"input": "$v", "N": 2}, "window": {"documents": [-1, 0]}}),
            9
        );
        assert_eq!(
            f(doc! {"$expMovingAvg": {"input": "$v", "N": 2, "alpha": 0.5}}),
            9
        );
        assert_eq!(f(doc! {"$expMovingAvg": {"input": "$v"}}), 9);
        assert_eq!(f(doc! {"$expMovingAvg": {"input": "$v", "N": 1.5}}), 9);
        assert_eq!(f(doc! {"$expMovingAvg": {"input": "$v", "N": 0}}), 9);
        assert_eq!(f(doc! {"$expMovingAvg": {"input": "$v", "alpha": 1}}), 9);
        assert_eq!(f(doc! {"$expMovingAvg": {"input": "$v", "x": 1}}), 9);
        assert_eq!(f(doc! {"$expMovingAvg": "$v"}), 9);
        // $derivative and $integral.
        let w = doc! {"documents": [-1, 0]};
        assert_eq!(
            unsorted(doc! {"$derivative": {"input": "$v"}, "window": w.clone()}),
            9
        );
        assert_eq!(
            code(
                doc! {"$setWindowFields": {"sortBy": {"t": 1, "v": 1}, "output": {"x": {"$integral": {"input": "$v"}}}}}
            ),
            9
        );
        assert_eq!(f(doc! {"$derivative": {"input": "$v"}}), 9);
        assert_eq!(
            f(doc! {"$derivative": {"unit": "hour"}, "window": w.clone()}),
            9
        );
        assert_eq!(f(doc! {"$derivative": "$v", "window": w.clone()}), 9);
        assert_eq!(
            f(doc! {"$integral": {"input": "$v", "unit": "month"}}),
            5490710
        );
        assert_eq!(
            f(doc! {"$integral": {"input": "$v", "unit": "fortnight"}}),
            9
        );
        assert_eq!(f(doc! {"$integral": {"input": "$v", "unit": 1}}), 9);
        assert_eq!(f(doc! {"$integral": {"input": "$v", "x": 1}}), 9);
    }
}
