//! Collations: the `collation` option of reads and writes, for Latin-script text.
//!
//! A collation changes how strings compare — in matching, sorting, `distinct` and the
//! aggregation stages that compare. The engine reads it as mongod does (`locale`, `strength`,
//! `caseLevel`, `caseFirst`, `numericOrdering`, …) and compares through a *sort key*: each
//! string becomes a string whose plain byte order is the collation's order, in the manner of
//! ICU's levels — the base letters first (case and accents folded), then the accents
//! (`strength` 2), then the case (`strength` 3). The values a collation leaves equal have equal
//! keys, so every comparison the engine already makes (equality, ranges, `$in` sets, sort
//! order, `distinct` sets) becomes the collated one by comparing keys.
//!
//! What it knows of language: letters with the accents of the Latin-1 and Latin Extended-A
//! blocks fold to their base letter, `ß` and `æ`/`œ` expand, and digits, punctuation and
//! letters keep the root order (punctuation before digits before letters). It does not apply
//! locale-specific tailorings (Swedish `ä` after `z`, Spanish `ñ` as its own letter);
//! `alternate: "shifted"` and `backwards` are accepted and not applied.

use std::sync::Arc;

use bson::{Bson, Document};

use super::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::type_name;

/// A non-simple collation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collation {
    strength: u8,
    case_level: bool,
    upper_first: bool,
    numeric: bool,
}

fn bad(msg: impl Into<String>) -> EngineError {
    EngineError::new(ErrorCode::BadValue, msg)
}

fn wrong_type(field: &str, v: &Bson, expected: &str) -> EngineError {
    EngineError::new(
        ErrorCode::TypeMismatch,
        format!(
            "BSON field 'collation.{field}' is the wrong type '{}', expected type '{expected}'",
            type_name(v)
        ),
    )
}

impl Collation {
    /// Reads a request's `collation`: `None` for the simple collation (absent, or
    /// `{locale: "simple"}`), mongod's errors for a malformed one.
    pub fn from_option(v: Option<&Bson>) -> Result<Option<Arc<Collation>>, EngineError> {
        match v {
            None => Ok(None),
            Some(Bson::Document(d)) => Collation::parse(d).map(|c| c.map(Arc::new)),
            Some(other) => Err(EngineError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field 'collation' is the wrong type '{}', expected type 'object'",
                    type_name(other)
                ),
            )),
        }
    }

    /// Parses a collation document.
    pub fn parse(d: &Document) -> Result<Option<Collation>, EngineError> {
        let mut c = Collation {
            strength: 3,
            case_level: false,
            upper_first: false,
            numeric: false,
        };
        let mut locale = None;
        for (k, v) in d {
            match k.as_str() {
                "locale" => match v {
                    Bson::String(s) => locale = Some(s.as_str()),
                    other => return Err(wrong_type(k, other, "string")),
                },
                "strength" => {
                    let n = match v {
                        Bson::Int32(n) => *n as f64,
                        Bson::Int64(n) => *n as f64,
                        Bson::Double(n) => *n,
                        other => return Err(wrong_type(k, other, "int")),
                    };
                    if !(1.0..=5.0).contains(&n) || n.fract() != 0.0 {
                        return Err(bad(format!(
                            "Field 'strength' must be an integer 1 through 5. Got: {n}"
                        )));
                    }
                    c.strength = n as u8;
                }
                "caseLevel" | "numericOrdering" | "normalization" | "backwards" => {
                    let Bson::Boolean(b) = v else {
                        return Err(wrong_type(k, v, "bool"));
                    };
                    match k.as_str() {
                        "caseLevel" => c.case_level = *b,
                        "numericOrdering" => c.numeric = *b,
                        _ => {}
                    }
                }
                "caseFirst" | "alternate" | "maxVariable" | "version" => {
                    let Bson::String(s) = v else {
                        return Err(wrong_type(k, v, "string"));
                    };
                    let allowed: &[&str] = match k.as_str() {
                        "caseFirst" => &["upper", "lower", "off"],
                        "alternate" => &["non-ignorable", "shifted"],
                        "maxVariable" => &["punct", "space"],
                        _ => &[],
                    };
                    if !allowed.is_empty() && !allowed.contains(&s.as_str()) {
                        return Err(bad(format!(
                            "Field '{k}' must be one of {allowed:?}. Got: {s}"
                        )));
                    }
                    if k == "caseFirst" {
                        c.upper_first = s == "upper";
                    }
                }
                other => {
                    return Err(EngineError::new(
                        ErrorCode(40415),
                        format!("BSON field 'collation.{other}' is an unknown field."),
                    ))
                }
            }
        }
        let Some(locale) = locale else {
            return Err(EngineError::new(
                ErrorCode(40414),
                "BSON field 'collation.locale' is missing but a required field",
            ));
        };
        if locale == "simple" {
            if d.len() > 1 {
                return Err(bad(
                    "If 'locale' is set to 'simple', then no other fields may be specified",
                ));
            }
            return Ok(None);
        }
        let valid = !locale.is_empty()
            && locale
                .split(['_', '@', '='])
                .all(|p| !p.is_empty() && p.chars().all(|ch| ch.is_ascii_alphanumeric()));
        if !valid {
            return Err(bad(format!("Field 'locale' is invalid in: {d}")));
        }
        Ok(Some(c))
    }

    /// The sort key of a string: plain (byte) order of keys is this collation's order, and
    /// strings it holds equal have equal keys.
    pub fn key(&self, s: &str) -> String {
        let mut primary = String::with_capacity(s.len());
        let mut accents = String::new();
        let mut cases = String::new();
        let mut chars = s.chars().peekable();
        while let Some(ch) = chars.next() {
            if self.numeric && ch.is_ascii_digit() {
                let mut digits = String::from(ch);
                while let Some(d) = chars.next_if(|d| d.is_ascii_digit()) {
                    digits.push(d);
                }
                let significant = digits.trim_start_matches('0');
                let significant = if significant.is_empty() {
                    "0"
                } else {
                    significant
                };
                // The number of digits first (in nines, then the rest), so 9 < 10.
                let n = significant.len();
                for _ in 0..n / 9 {
                    primary.push('9');
                }
                primary.push(char::from(b'0' + (n % 9) as u8));
                primary.push_str(significant);
                continue;
            }
            let lower = ch.to_lowercase().next().unwrap_or(ch);
            let (letters, accent) = match fold(lower) {
                Some((base, accent)) => {
                    primary.push_str(base);
                    (base.len(), accent)
                }
                None => {
                    primary.push(lower);
                    (1, 0)
                }
            };
            for _ in 0..letters {
                accents.push(char::from(b'a' + accent));
                let upper = ch.is_uppercase();
                cases.push(if upper != self.upper_first { 'b' } else { 'a' });
            }
        }
        let mut key = primary;
        if self.strength >= 2 {
            key.push('\u{1}');
            key.push_str(&accents);
        }
        if self.strength >= 3 || self.case_level {
            key.push('\u{1}');
            key.push_str(&cases);
        }
        if self.strength >= 4 {
            // Beyond the third level, strings that still tie differ by their code points.
            key.push('\u{1}');
            key.push_str(s);
        }
        key
    }

    /// `v` with every string in it (at any depth; field names stay) replaced by its key.
    pub fn key_value(&self, v: &Bson) -> Bson {
        match v {
            Bson::String(s) => Bson::String(self.key(s)),
            Bson::Symbol(s) => Bson::Symbol(self.key(s)),
            Bson::Array(items) => Bson::Array(items.iter().map(|i| self.key_value(i)).collect()),
            Bson::Document(d) => Bson::Document(
                d.iter()
                    .map(|(k, v)| (k.clone(), self.key_value(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// Whether a value holds a string anywhere (a collation can change how it compares).
pub fn has_string(v: &Bson) -> bool {
    match v {
        Bson::String(_) | Bson::Symbol(_) => true,
        Bson::Array(items) => items.iter().any(has_string),
        Bson::Document(d) => d.values().any(has_string),
        _ => false,
    }
}

/// Letters with accents, by base letter; an accent's weight is its position here (plus one).
const ACCENTED: &[(&str, &str)] = &[
    ("a", "àáâãäåāăą"),
    ("c", "çćĉċč"),
    ("d", "ď"),
    ("e", "èéêëēĕėęě"),
    ("g", "ĝğġģ"),
    ("h", "ĥ"),
    ("i", "ìíîïĩīĭį"),
    ("j", "ĵ"),
    ("k", "ķ"),
    ("l", "ĺļľ"),
    ("n", "ñńņň"),
    ("o", "òóôõöøōŏő"),
    ("r", "ŕŗř"),
    ("s", "śŝşš"),
    ("t", "ţť"),
    ("u", "ùúûüũūŭůűų"),
    ("w", "ŵ"),
    ("y", "ýÿŷ"),
    ("z", "źżž"),
];

/// The base letters (lowercase, accents removed) and accent weight of a lowercase character
/// that has an accent or expands; `None` when it stands for itself.
fn fold(lower: char) -> Option<(&'static str, u8)> {
    if lower.is_ascii() {
        return None;
    }
    for (base, variants) in ACCENTED {
        if let Some(i) = variants.chars().position(|v| v == lower) {
            return Some((base, (i + 1) as u8));
        }
    }
    match lower {
        'ß' => Some(("ss", 0)),
        'æ' => Some(("ae", 0)),
        'œ' => Some(("oe", 0)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn parse(d: Document) -> Collation {
        Collation::parse(&d).unwrap().unwrap()
    }

    #[test]
    fn strengths_fold_case_then_accents() {
        let primary = parse(doc! {"locale": "fr", "strength": 1});
        let secondary = parse(doc! {"locale": "en_US", "strength": 2});
        let tertiary = parse(doc! {"locale": "en"});
        assert_eq!(primary.key("Café"), primary.key("cafe"));
        assert_eq!(secondary.key("PING"), secondary.key("ping"));
        assert_ne!(secondary.key("café"), secondary.key("cafe"));
        assert_ne!(tertiary.key("Ping"), tertiary.key("ping"));
        assert_eq!(primary.key("Straße"), primary.key("strasse"));
        // ICU's order: base letters first, then accents, then case (lowercase first).
        let mut words = vec!["café", "Cafe", "pong", "cafe", "PING", "ping", "b"];
        words.sort_by_key(|w| tertiary.key(w));
        assert_eq!(words, ["b", "cafe", "Cafe", "café", "ping", "PING", "pong"]);
        let upper = parse(doc! {"locale": "en", "caseFirst": "upper"});
        assert!(upper.key("PING") < upper.key("ping"));
        // Case only, accents ignored: strength 1 with caseLevel.
        let case_level = parse(doc! {"locale": "en", "strength": 1, "caseLevel": true});
        assert_eq!(case_level.key("café"), case_level.key("cafe"));
        assert_ne!(case_level.key("Cafe"), case_level.key("cafe"));
    }

    #[test]
    fn numeric_ordering_compares_digit_runs_as_numbers() {
        let c = parse(doc! {"locale": "en", "numericOrdering": true});
        assert!(c.key("a9") < c.key("a10"));
        assert!(c.key("10") < c.key("0100"));
        assert_eq!(c.key("007"), c.key("7"));
        assert!(c.key("1234567890") < c.key("12345678901"));
        let plain = parse(doc! {"locale": "en"});
        assert!(plain.key("a9") > plain.key("a10"));
    }

    #[test]
    fn keys_replace_strings_at_any_depth() {
        let c = parse(doc! {"locale": "en", "strength": 2});
        let v = Bson::Document(doc! {"A": ["X", {"y": "Z"}], "n": 1});
        assert_eq!(
            c.key_value(&v),
            Bson::Document(doc! {"A": [c.key("x"), {"y": c.key("z")}], "n": 1})
        );
        assert!(has_string(&v));
        assert!(!has_string(&Bson::Document(doc! {"n": [1, 2]})));
    }

    #[test]
    fn options_are_read_as_mongod_reads_them() {
        assert_eq!(Collation::parse(&doc! {"locale": "simple"}).unwrap(), None);
        assert_eq!(Collation::from_option(None).unwrap(), None);
        let code = |d: Document| Collation::parse(&d).unwrap_err().code.0;
        assert_eq!(code(doc! {"strength": 2}), 40414);
        assert_eq!(code(doc! {"locale": "en", "color": 1}), 40415);
        assert_eq!(code(doc! {"locale": "en", "strength": 6}), 2);
        assert_eq!(code(doc! {"locale": "en", "strength": "2"}), 14);
        assert_eq!(code(doc! {"locale": "en", "caseFirst": "middle"}), 2);
        assert_eq!(code(doc! {"locale": "simple", "strength": 2}), 2);
        assert_eq!(code(doc! {"locale": ""}), 2);
        assert_eq!(
            Collation::from_option(Some(&Bson::Int32(1)))
                .unwrap_err()
                .code
                .0,
            14
        );
    }
}
