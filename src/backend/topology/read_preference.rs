//! `$readPreference` as clients send it to mongos — `{mode, tags?, maxStalenessSeconds?,
//! hedge?}` — parsed and validated as mongos 8.0 does (`ReadPreferenceSetting::fromInnerBSON`),
//! with its codes and messages, checked in its order: `mode`, `hedge`, `tags`,
//! `maxStalenessSeconds`.
//!
//! Normalised the same way: `tags: []` and `tags: [{}]` mean "no tag constraint" and are not
//! echoed back; `maxStalenessSeconds: 0` means no limit. The normalised form is what Sluice
//! forwards to the shard ([`ReadPreference::to_document`]) and what error messages print.
//! `hedge` is accepted and forwarded (deprecated in 8.0, which no longer hedges `nearest` by
//! default); Sluice does not send hedged reads itself.

use bson::{doc, Bson, Document};

use crate::value::error_codes::ErrorCode;

use super::error::{Printer, TopologyError};

/// The smallest `maxStalenessSeconds` (mongos's `kMinimalMaxStalenessValue`).
pub const MIN_MAX_STALENESS_SECONDS: i64 = 90;

/// Read-preference modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadPreferenceMode {
    /// The primary only.
    Primary,
    /// The primary; a secondary (tags and staleness apply) if there is none.
    PrimaryPreferred,
    /// Secondaries only.
    Secondary,
    /// A secondary; the primary if no secondary is eligible.
    SecondaryPreferred,
    /// The primary or a secondary, whichever is nearest.
    Nearest,
}

impl ReadPreferenceMode {
    /// The name clients send.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadPreferenceMode::Primary => "primary",
            ReadPreferenceMode::PrimaryPreferred => "primaryPreferred",
            ReadPreferenceMode::Secondary => "secondary",
            ReadPreferenceMode::SecondaryPreferred => "secondaryPreferred",
            ReadPreferenceMode::Nearest => "nearest",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "primary" => ReadPreferenceMode::Primary,
            "primaryPreferred" => ReadPreferenceMode::PrimaryPreferred,
            "secondary" => ReadPreferenceMode::Secondary,
            "secondaryPreferred" => ReadPreferenceMode::SecondaryPreferred,
            "nearest" => ReadPreferenceMode::Nearest,
            _ => return None,
        })
    }
}

/// A validated, normalised read preference.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadPreference {
    /// The mode.
    pub mode: ReadPreferenceMode,
    /// The tag sets in order, as given; empty means no constraint. Elements that are not
    /// documents are kept (and forwarded) but match nothing, as in mongos.
    pub tags: Vec<Bson>,
    /// The staleness limit in seconds; `None` for no limit.
    pub max_staleness_seconds: Option<i64>,
    /// `hedge.enabled`, when the client sent `hedge`.
    pub hedge: Option<bool>,
}

impl ReadPreference {
    /// `{mode: "primary"}`: writes, and reads without `$readPreference`.
    pub fn primary() -> Self {
        ReadPreference::of_mode(ReadPreferenceMode::Primary)
    }

    /// `{mode: "secondaryPreferred"}`: a legacy request with the `secondaryOk` flag bit.
    pub fn secondary_preferred() -> Self {
        ReadPreference::of_mode(ReadPreferenceMode::SecondaryPreferred)
    }

    /// A mode without tags, staleness limit or hedge.
    pub fn of_mode(mode: ReadPreferenceMode) -> Self {
        ReadPreference {
            mode,
            tags: Vec::new(),
            max_staleness_seconds: None,
            hedge: None,
        }
    }

    /// The tag sets that can match (the documents among `tags`), in order.
    pub fn tag_sets(&self) -> impl Iterator<Item = &Document> {
        self.tags.iter().filter_map(Bson::as_document)
    }

    /// Parses the value of a request's `$readPreference` field.
    pub fn from_bson(value: &Bson, printer: &Printer) -> Result<Self, TopologyError> {
        match value {
            Bson::Document(d) => ReadPreference::from_document(d, printer),
            other => Err(TopologyError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "$readPreference has incorrect type: expected object but got {}",
                    (printer.type_name)(other)
                ),
            )),
        }
    }

    /// Parses `{mode, tags, maxStalenessSeconds, hedge}`; unknown fields are ignored, as
    /// mongos 8.0 ignores them.
    pub fn from_document(d: &Document, printer: &Printer) -> Result<Self, TopologyError> {
        let err = |code: ErrorCode, m: String| Err(TopologyError::new(code, m));
        let mode_text = match d.get("mode") {
            None => {
                return err(
                    ErrorCode::NoSuchKey,
                    "Missing expected field \"mode\"".into(),
                )
            }
            Some(Bson::String(s)) => s.as_str(),
            Some(other) => {
                return err(
                    ErrorCode::TypeMismatch,
                    format!(
                        "\"mode\" had the wrong type. Expected string, found {}",
                        (printer.type_name)(other)
                    ),
                )
            }
        };
        let Some(mode) = ReadPreferenceMode::parse(mode_text) else {
            return err(
                ErrorCode::BadValue,
                format!(
                    "Could not parse $readPreference mode '{mode_text}'. Only the modes \
                     'primary', 'primaryPreferred', 'secondary', 'secondaryPreferred', and \
                     'nearest' are supported. :: caused by :: Enumeration value \
                     '{mode_text}' for field 'mode' is not a valid value."
                ),
            );
        };

        let hedge = match d.get("hedge") {
            None => None,
            Some(Bson::Document(h)) => {
                let enabled = match h.get("enabled") {
                    None => true,
                    Some(Bson::Boolean(b)) => *b,
                    Some(other) => {
                        return err(
                            ErrorCode::TypeMismatch,
                            format!(
                                "BSON field 'hedge.enabled' is the wrong type '{}', expected \
                                 type 'bool'",
                                (printer.type_name)(other)
                            ),
                        )
                    }
                };
                if enabled && mode == ReadPreferenceMode::Primary {
                    return err(
                        ErrorCode::InvalidOptions,
                        "cannot enable hedging for $readPreference mode \"primaryOnly\"".into(),
                    );
                }
                Some(enabled)
            }
            Some(other) => {
                return err(
                    ErrorCode::TypeMismatch,
                    format!(
                        "hedge field must be of type object if provided; found hedge: {}",
                        (printer.value)(other)
                    ),
                )
            }
        };

        let tags = match d.get("tags") {
            None => Vec::new(),
            Some(Bson::Array(a)) => {
                let match_all = a.is_empty()
                    || (a.len() == 1 && a[0].as_document().is_some_and(Document::is_empty));
                if match_all {
                    Vec::new()
                } else if mode == ReadPreferenceMode::Primary {
                    return err(
                        ErrorCode::BadValue,
                        "Only empty tags are allowed with primary read preference".into(),
                    );
                } else {
                    a.clone()
                }
            }
            Some(other) => {
                return err(
                    ErrorCode::TypeMismatch,
                    format!(
                        "\"tags\" had the wrong type. Expected array, found {}",
                        (printer.type_name)(other)
                    ),
                )
            }
        };

        let staleness = match d.get("maxStalenessSeconds") {
            None => 0,
            Some(v) => integer_value("maxStalenessSeconds", v, printer)?,
        };
        if staleness < 0 {
            return err(
                ErrorCode::BadValue,
                "maxStalenessSeconds must be a non-negative integer".into(),
            );
        }
        if staleness == i64::MAX {
            return err(
                ErrorCode::BadValue,
                format!("maxStalenessSeconds value can not exceed {}", i64::MAX),
            );
        }
        if staleness > 0 && staleness < MIN_MAX_STALENESS_SECONDS {
            return err(
                ErrorCode::MaxStalenessOutOfRange,
                format!(
                    "maxStalenessSeconds value can not be less than {MIN_MAX_STALENESS_SECONDS}"
                ),
            );
        }
        if mode == ReadPreferenceMode::Primary && staleness != 0 {
            return err(
                ErrorCode::BadValue,
                "maxStalenessSeconds can not be set for the primary mode".into(),
            );
        }
        Ok(ReadPreference {
            mode,
            tags,
            max_staleness_seconds: (staleness > 0).then_some(staleness),
            hedge,
        })
    }

    /// The normalised document: what Sluice forwards as the shard request's
    /// `$readPreference`, and what messages print.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {"mode": self.mode.as_str()};
        if !self.tags.is_empty() {
            d.insert("tags", self.tags.clone());
        }
        if let Some(s) = self.max_staleness_seconds {
            d.insert("maxStalenessSeconds", s);
        }
        if let Some(enabled) = self.hedge {
            d.insert("hedge", doc! {"enabled": enabled});
        }
        d
    }

    /// Whether a secondary may serve the read (then the shard must be sent this read
    /// preference, or it refuses with NotPrimaryNoSecondaryOk).
    pub fn allows_secondary(&self) -> bool {
        self.mode != ReadPreferenceMode::Primary
    }
}

/// mongos's `bsonExtractIntegerField`: any number whose value is a whole 64-bit integer.
fn integer_value(name: &str, v: &Bson, printer: &Printer) -> Result<i64, TopologyError> {
    let as_double = match v {
        Bson::Int32(i) => return Ok(i64::from(*i)),
        Bson::Int64(i) => return Ok(*i),
        Bson::Double(f) => *f,
        Bson::Decimal128(d) => d.to_string().parse::<f64>().unwrap_or(f64::NAN),
        other => {
            return Err(TopologyError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "Expected field \"{name}\" to have numeric type, but found {}",
                    (printer.type_name)(other)
                ),
            ))
        }
    };
    // `safeNumberLong`: NaN is 0 and out-of-range values saturate, which is what Rust's
    // float-to-integer cast does; then the value must be exact.
    let long = as_double as i64;
    if long as f64 != as_double {
        return Err(TopologyError::new(
            ErrorCode::BadValue,
            format!(
                "Expected field \"{name}\" to have a value exactly representable as a 64-bit \
                 integer, but found {name}: {}",
                (printer.value)(v)
            ),
        ));
    }
    Ok(long)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Message wording that prints values is tested with the project's printer in `tests/`.
    const STUB: Printer = Printer {
        document: |_| "{…}".to_string(),
        value: |_| "…".to_string(),
        type_name: |_| "T",
    };

    fn parse(d: Document) -> Result<ReadPreference, TopologyError> {
        ReadPreference::from_document(&d, &STUB)
    }

    fn fails(d: Document) -> (i32, String) {
        let e = parse(d).unwrap_err();
        (e.code.0, e.message)
    }

    #[test]
    fn every_mode_parses() {
        for (name, mode) in [
            ("primary", ReadPreferenceMode::Primary),
            ("primaryPreferred", ReadPreferenceMode::PrimaryPreferred),
            ("secondary", ReadPreferenceMode::Secondary),
            ("secondaryPreferred", ReadPreferenceMode::SecondaryPreferred),
            ("nearest", ReadPreferenceMode::Nearest),
        ] {
            let rp = parse(doc! {"mode": name}).unwrap();
            assert_eq!(rp, ReadPreference::of_mode(mode));
            assert_eq!(rp.to_document(), doc! {"mode": name});
            assert_eq!(rp.allows_secondary(), mode != ReadPreferenceMode::Primary);
        }
    }

    #[test]
    fn tags_staleness_and_hedge_are_kept_and_forwarded() {
        let rp = parse(doc! {
            "mode": "secondary",
            "tags": [{"dc": "east", "rack": "1"}, {"dc": "east"}, {}],
            "maxStalenessSeconds": 120,
            "hedge": {"enabled": false},
            "unknownField": 1,
        })
        .unwrap();
        assert_eq!(rp.tag_sets().count(), 3);
        assert_eq!(rp.max_staleness_seconds, Some(120));
        assert_eq!(rp.hedge, Some(false));
        assert_eq!(
            rp.to_document(),
            doc! {
                "mode": "secondary",
                "tags": [{"dc": "east", "rack": "1"}, {"dc": "east"}, {}],
                "maxStalenessSeconds": 120i64,
                "hedge": {"enabled": false},
            }
        );
        let rp = parse(doc! {"mode": "nearest", "hedge": {}}).unwrap();
        assert_eq!(rp.hedge, Some(true));
    }

    #[test]
    fn empty_tag_lists_and_zero_staleness_mean_no_constraint() {
        for tags in [bson::Bson::Array(vec![]), bson::bson!([{}])] {
            for mode in ["primary", "secondary"] {
                let rp = parse(doc! {"mode": mode, "tags": tags.clone()}).unwrap();
                assert!(rp.tags.is_empty());
                assert_eq!(rp.to_document(), doc! {"mode": mode});
            }
        }
        let rp = parse(doc! {"mode": "secondary", "maxStalenessSeconds": 0}).unwrap();
        assert_eq!(rp.max_staleness_seconds, None);
        let rp = parse(doc! {"mode": "primary", "maxStalenessSeconds": 0.0}).unwrap();
        assert_eq!(rp.max_staleness_seconds, None);
        let rp = parse(doc! {"mode": "secondary", "maxStalenessSeconds": 90.0}).unwrap();
        assert_eq!(rp.max_staleness_seconds, Some(90));
    }

    #[test]
    fn mongos_errors_for_bad_modes() {
        assert_eq!(
            fails(doc! {}),
            (4, "Missing expected field \"mode\"".into())
        );
        assert_eq!(
            fails(doc! {"mode": 1}),
            (
                14,
                "\"mode\" had the wrong type. Expected string, found T".into()
            )
        );
        assert_eq!(
            fails(doc! {"mode": "primaryOnly"}),
            (
                2,
                "Could not parse $readPreference mode 'primaryOnly'. Only the modes 'primary', \
                 'primaryPreferred', 'secondary', 'secondaryPreferred', and 'nearest' are \
                 supported. :: caused by :: Enumeration value 'primaryOnly' for field 'mode' \
                 is not a valid value."
                    .into()
            )
        );
        assert_eq!(
            ReadPreference::from_bson(&Bson::String("primary".into()), &STUB)
                .unwrap_err()
                .message,
            "$readPreference has incorrect type: expected object but got T"
        );
    }

    #[test]
    fn mongos_errors_for_bad_tags_and_hedge() {
        assert_eq!(
            fails(doc! {"mode": "primary", "tags": [{"dc": "east"}]}),
            (
                2,
                "Only empty tags are allowed with primary read preference".into()
            )
        );
        assert_eq!(
            fails(doc! {"mode": "secondary", "tags": {"dc": "east"}}),
            (
                14,
                "\"tags\" had the wrong type. Expected array, found T".into()
            )
        );
        assert_eq!(
            fails(doc! {"mode": "primary", "hedge": {"enabled": true}}),
            (
                72,
                "cannot enable hedging for $readPreference mode \"primaryOnly\"".into()
            )
        );
        assert!(parse(doc! {"mode": "primary", "hedge": {"enabled": false}}).is_ok());
        assert_eq!(
            fails(doc! {"mode": "nearest", "hedge": 1}),
            (
                14,
                "hedge field must be of type object if provided; found hedge: …".into()
            )
        );
        assert_eq!(
            fails(doc! {"mode": "nearest", "hedge": {"enabled": 1}}),
            (
                14,
                "BSON field 'hedge.enabled' is the wrong type 'T', expected type 'bool'".into()
            )
        );
        // Checked in mongos's order: the hedge before the tags.
        assert_eq!(
            fails(doc! {"mode": "primary", "hedge": {"enabled": true}, "tags": [{"a": "b"}]}).0,
            72
        );
    }

    #[test]
    fn mongos_errors_for_bad_staleness() {
        let ms = |v: Bson| fails(doc! {"mode": "secondary", "maxStalenessSeconds": v});
        assert_eq!(
            ms(Bson::Int32(89)),
            (
                160,
                "maxStalenessSeconds value can not be less than 90".into()
            )
        );
        assert_eq!(ms(Bson::Int32(1)).0, 160);
        assert_eq!(
            ms(Bson::Int32(-1)),
            (
                2,
                "maxStalenessSeconds must be a non-negative integer".into()
            )
        );
        assert_eq!(
            ms(Bson::Int64(i64::MAX)),
            (
                2,
                "maxStalenessSeconds value can not exceed 9223372036854775807".into()
            )
        );
        assert_eq!(ms(Bson::Double(1e300)).0, 2);
        assert_eq!(
            ms(Bson::Double(90.5)),
            (
                2,
                "Expected field \"maxStalenessSeconds\" to have a value exactly representable \
                 as a 64-bit integer, but found maxStalenessSeconds: …"
                    .into()
            )
        );
        assert_eq!(ms(Bson::Double(f64::NAN)).0, 2);
        assert_eq!(
            ms(Bson::String("90".into())),
            (
                14,
                "Expected field \"maxStalenessSeconds\" to have numeric type, but found T".into()
            )
        );
        assert_eq!(
            fails(doc! {"mode": "primary", "maxStalenessSeconds": 120}),
            (
                2,
                "maxStalenessSeconds can not be set for the primary mode".into()
            )
        );
        // The range is checked before the mode.
        assert_eq!(
            fails(doc! {"mode": "primary", "maxStalenessSeconds": 10}).0,
            160
        );
    }
}
