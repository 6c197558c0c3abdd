//! `$percentile` and `$median`: as `$group` accumulators, as window functions and as
//! expressions, with the `approximate` method mongod 7.0+ accepts (8.0 accepts no other).
//!
//! mongod computes small inputs exactly: the percentile `p` of `n` numeric values is the value
//! at 0-based rank `ceil(n·p) − 1` (at least 0; `n − 1` for `p = 1`) of the sorted values, so
//! the result is always one of the inputs, as a double. Values that are not numbers are
//! ignored, a NaN as well; no numeric value at all gives null (an array of nulls for
//! `$percentile`). The arguments are checked as mongod checks them: an object (7429703 /
//! 7436100 for the accumulators, 7436200 / 7436201 for the expressions), the fields mongod's
//! parser knows (40414 missing, 40415 unknown, 14 of the wrong type), `method` only
//! `approximate` (2), `p` a non-empty constant array of numbers in [0, 1]
//! (7750300–7750303).

use bson::{Bson, Document};

use super::aggregate::{err, eval_in, Budget, Variables};
use super::EngineError;
use crate::value::field::{is_number, to_f64};
use crate::value::render::render_value;

/// A parsed `$percentile`/`$median` argument.
#[derive(Debug, Clone)]
pub(super) struct Quantile {
    /// The expression each document (or the expression's argument) gives.
    pub input: Bson,
    /// The percentiles asked for; `[0.5]` for `$median`.
    pub ps: Vec<f64>,
    /// `$median`: the result is one value rather than an array.
    pub median: bool,
}

/// Where the operator is used, for mongod's code when the argument is not an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Usage {
    /// `$group`, `$bucket`, `$bucketAuto` and window functions.
    Accumulator,
    /// An aggregation expression.
    Expression,
}

/// Whether `e` is a constant: no field path, no `$$ROOT`/`$$CURRENT`.
fn constant(e: &Bson) -> bool {
    match e {
        Bson::String(s) if s.starts_with("$$") => {
            let name = s[2..].split('.').next().unwrap_or("");
            !matches!(name, "ROOT" | "CURRENT")
        }
        Bson::String(s) => !s.starts_with('$'),
        Bson::Document(d) => {
            if d.len() == 1 && d.contains_key("$literal") {
                return true;
            }
            d.values().all(constant)
        }
        Bson::Array(items) => items.iter().all(constant),
        _ => true,
    }
}

impl Quantile {
    /// Parses `{input, p, method}` (`{input, method}` for `$median`).
    pub(super) fn parse(
        op: &str,
        arg: &Bson,
        usage: Usage,
        vars: &Variables,
    ) -> Result<Quantile, EngineError> {
        let median = op == "$median";
        let Bson::Document(a) = arg else {
            let code = match (median, usage) {
                (false, Usage::Accumulator) => 7429703,
                (true, Usage::Accumulator) => 7436100,
                (false, Usage::Expression) => 7436200,
                (true, Usage::Expression) => 7436201,
            };
            return Err(err(
                code,
                format!(
                    "specification must be an object; found {op}: {}",
                    render_value(arg)
                ),
            ));
        };
        for k in a.keys() {
            let known = matches!(k.as_str(), "input" | "method") || (k == "p" && !median);
            if !known {
                return Err(EngineError::unknown_field(&format!("{op}.{k}")));
            }
        }
        let required: &[&str] = if median {
            &["input", "method"]
        } else {
            &["input", "p", "method"]
        };
        for k in required {
            if !a.contains_key(*k) {
                return Err(EngineError::missing_field(&format!("{op}.{k}")));
            }
        }
        match a.get("method") {
            Some(Bson::String(m)) if m == "approximate" => {}
            Some(Bson::String(_)) => {
                return Err(err(
                    2,
                    "Currently only 'approximate' can be used as percentile 'method'.",
                ))
            }
            Some(other) => {
                return Err(EngineError::wrong_type(
                    &format!("{op}.method"),
                    other,
                    "string",
                ))
            }
            None => {}
        }
        let input = a.get("input").cloned().unwrap_or(Bson::Null);
        super::aggregate::check_expression(&input)?;
        let ps = if median {
            vec![0.5]
        } else {
            parse_p(a.get("p").unwrap_or(&Bson::Null), vars)?
        };
        Ok(Quantile { input, ps, median })
    }

    /// The result over the values the input gave: the non-numeric ones are ignored.
    pub(super) fn finish<'a>(&self, values: impl IntoIterator<Item = &'a Bson>) -> Bson {
        let mut numbers: Vec<f64> = values
            .into_iter()
            .filter(|v| is_number(v))
            .map(to_f64)
            .filter(|f| !f.is_nan())
            .collect();
        numbers.sort_by(f64::total_cmp);
        let results: Vec<Bson> = self
            .ps
            .iter()
            .map(|p| match discrete(&numbers, *p) {
                Some(v) => Bson::Double(v),
                None => Bson::Null,
            })
            .collect();
        if self.median {
            results.into_iter().next().unwrap_or(Bson::Null)
        } else {
            Bson::Array(results)
        }
    }
}

/// The value at mongod's rank for `p` among `sorted` values; `None` when there are none.
fn discrete(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = if p >= 1.0 {
        n - 1
    } else {
        ((n as f64 * p).ceil() as i64 - 1).max(0) as usize
    };
    sorted.get(rank.min(n - 1)).copied()
}

/// `p`: a constant expression that is a non-empty array of numbers in [0, 1].
fn parse_p(p: &Bson, vars: &Variables) -> Result<Vec<f64>, EngineError> {
    const MSG: &str =
        "The $percentile 'p' field must be an array of numbers from [0.0, 1.0], but found: ";
    if !constant(p) {
        return Err(err(
            7750300,
            format!(
                "The $percentile 'p' field must be an array of constant values, but found value: {}.",
                render_value(p)
            ),
        ));
    }
    let value = super::aggregate::eval_with(p, &Document::new(), vars)?.unwrap_or(Bson::Null);
    let items = match &value {
        Bson::Array(items) if !items.is_empty() => items,
        other => return Err(err(7750301, format!("{MSG}{}", render_value(other)))),
    };
    let mut ps = Vec::with_capacity(items.len());
    for v in items {
        if !is_number(v) {
            return Err(err(7750302, format!("{MSG}{}", render_value(v))));
        }
        let f = to_f64(v);
        if !(0.0..=1.0).contains(&f) {
            return Err(err(7750303, format!("{MSG}{f}")));
        }
        ps.push(f);
    }
    Ok(ps)
}

/// The expression form: a number is every percentile of itself; an array's numeric elements
/// are the values; anything else has no numeric value.
pub(super) fn expression(
    op: &str,
    args: &Bson,
    root: &Document,
    vars: &Variables,
    budget: &mut Budget,
) -> Result<Bson, EngineError> {
    let q = Quantile::parse(op, args, Usage::Expression, vars)?;
    let input = eval_in(&q.input, root, vars, budget)?.unwrap_or(Bson::Null);
    Ok(match &input {
        Bson::Array(items) => q.finish(items),
        v if is_number(v) => q.finish(std::iter::once(v)),
        _ => q.finish(std::iter::empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn expr(e: Document) -> Result<Bson, EngineError> {
        super::super::aggregate::eval(
            &Bson::Document(e),
            &doc! {"xs": [5, 1, "a", 4.5, null, 3, 2], "one": 7, "s": "x"},
        )
        .map(|v| v.unwrap_or(Bson::Null))
    }

    #[test]
    fn ranks_follow_mongod() {
        let sorted = [1.0, 2.0, 3.0, 4.5, 5.0];
        assert_eq!(discrete(&sorted, 0.0), Some(1.0));
        assert_eq!(discrete(&sorted, 0.5), Some(3.0));
        assert_eq!(discrete(&sorted, 0.2), Some(1.0));
        assert_eq!(discrete(&sorted, 0.21), Some(2.0));
        assert_eq!(discrete(&sorted, 0.95), Some(5.0));
        assert_eq!(discrete(&sorted, 1.0), Some(5.0));
        assert_eq!(discrete(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(2.0));
        assert_eq!(discrete(&[], 0.5), None);
    }

    #[test]
    fn expressions_give_input_values() {
        let m = doc! {"$median": {"input": "$xs", "method": "approximate"}};
        assert_eq!(expr(m).unwrap(), Bson::Double(3.0));
        let p = doc! {"$percentile": {"input": "$xs", "p": [0, 0.9, 1], "method": "approximate"}};
        assert_eq!(
            expr(p).unwrap(),
            Bson::Array(vec![
                Bson::Double(1.0),
                Bson::Double(5.0),
                Bson::Double(5.0)
            ])
        );
        let scalar =
            doc! {"$percentile": {"input": "$one", "p": [0.1, 0.5], "method": "approximate"}};
        assert_eq!(
            expr(scalar).unwrap(),
            Bson::Array(vec![Bson::Double(7.0), Bson::Double(7.0)])
        );
        let none = doc! {"$percentile": {"input": "$s", "p": [0.1, 0.5], "method": "approximate"}};
        assert_eq!(
            expr(none).unwrap(),
            Bson::Array(vec![Bson::Null, Bson::Null])
        );
        let missing = doc! {"$median": {"input": "$nope", "method": "approximate"}};
        assert_eq!(expr(missing).unwrap(), Bson::Null);
    }

    #[test]
    fn bad_arguments_get_mongods_codes() {
        let code = |e: Document| expr(e).unwrap_err().code.0;
        assert_eq!(code(doc! {"$median": 1}), 7436201);
        assert_eq!(code(doc! {"$percentile": [1]}), 7436200);
        assert_eq!(code(doc! {"$median": {"input": "$xs"}}), 40414);
        assert_eq!(
            code(doc! {"$percentile": {"input": "$xs", "method": "approximate"}}),
            40414
        );
        assert_eq!(
            code(doc! {"$median": {"input": "$xs", "method": "approximate", "p": [0.5]}}),
            40415
        );
        assert_eq!(
            code(doc! {"$median": {"input": "$xs", "method": "continuous"}}),
            2
        );
        assert_eq!(code(doc! {"$median": {"input": "$xs", "method": 1}}), 14);
        let p =
            |p: Bson| code(doc! {"$percentile": {"input": "$xs", "p": p, "method": "approximate"}});
        assert_eq!(p(Bson::String("$xs".into())), 7750300);
        assert_eq!(p(Bson::Array(vec![])), 7750301);
        assert_eq!(p(Bson::Double(0.5)), 7750301);
        assert_eq!(p(Bson::Array(vec!["a".into()])), 7750302);
        assert_eq!(p(Bson::Array(vec![Bson::Double(1.5)])), 7750303);
        assert_eq!(p(Bson::Array(vec![Bson::Int32(-1)])), 7750303);
    }

    #[test]
    fn accumulators_and_window_functions() {
        let docs: Vec<Document> = vec![
            doc! {"g": 1, "t": 1, "v": 10},
            doc! {"g": 1, "t": 2, "v": "x"},
            doc! {"g": 1, "t": 3, "v": 30.5},
            doc! {"g": 1, "t": 4, "v": 20i64},
            doc! {"g": 2, "t": 1},
        ];
        let out = super::super::aggregate::run(
            &[
                Bson::Document(doc! {"$group": {"_id": "$g",
                    "m": {"$median": {"input": "$v", "method": "approximate"}},
                    "p": {"$percentile": {"input": "$v", "p": [0.25, 0.75, 1.0], "method": "approximate"}}}}),
                Bson::Document(doc! {"$sort": {"_id": 1}}),
            ],
            docs.clone(),
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                doc! {"_id": 1, "m": 20.0, "p": [10.0, 30.5, 30.5]},
                doc! {"_id": 2, "m": Bson::Null, "p": [Bson::Null, Bson::Null, Bson::Null]},
            ]
        );
        let out = super::super::aggregate::run(
            &[Bson::Document(doc! {"$setWindowFields": {"partitionBy": "$g", "sortBy": {"t": 1}, "output": {
                "m": {"$median": {"input": "$v", "method": "approximate"}, "window": {"documents": ["unbounded", "current"]}},
            }}})],
            docs,
        )
        .unwrap();
        let ms: Vec<Bson> = out
            .iter()
            .map(|d| d.get("m").cloned().unwrap_or(Bson::Undefined))
            .collect();
        assert_eq!(
            ms,
            vec![
                Bson::Double(10.0),
                Bson::Double(10.0),
                Bson::Double(10.0),
                Bson::Double(20.0),
                Bson::Null
            ]
        );
        let bad = super::super::aggregate::run(
            &[Bson::Document(
                doc! {"$group": {"_id": null, "m": {"$median": 5}}},
            )],
            vec![],
        );
        assert_eq!(bad.unwrap_err().code.0, 7436100);
        let bad = super::super::aggregate::run(
            &[Bson::Document(
                doc! {"$group": {"_id": null, "m": {"$percentile": {"input": "$v", "p": [2], "method": "approximate"}}}},
            )],
            vec![],
        );
        assert_eq!(bad.unwrap_err().code.0, 7750303);
    }
}
