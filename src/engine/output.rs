//! `$out` and `$merge`: parsed here, with mongod's codes for a malformed or misplaced stage,
//! and the per-document decision of `$merge` (`whenMatched` / `whenNotMatched`). The server
//! that owns the target collection performs the writes: the embedded shard in its catalog, the
//! router by sending the results to the target's shard.

use bson::{Bson, Document};

use super::aggregate::{err, run_in, AggregateOptions, Env, Variables};
use super::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::type_name;

/// Where a pipeline's results go.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputStage {
    /// `$out`: the target's contents are replaced by the results.
    Out {
        /// Target database.
        db: String,
        /// Target collection.
        coll: String,
    },
    /// `$merge`: each result is merged into the target.
    Merge(MergeSpec),
}

impl OutputStage {
    /// The target `(db, coll)`.
    pub fn target(&self) -> (&str, &str) {
        match self {
            OutputStage::Out { db, coll } => (db, coll),
            OutputStage::Merge(m) => (&m.db, &m.coll),
        }
    }

    /// The stage as a pipeline element again (for sending it on).
    pub fn to_stage(&self, original: &Bson) -> Bson {
        original.clone()
    }

    /// Refuses the output stage under a `linearizable` read concern (`body` is the aggregate
    /// command), as mongod and mongos do when they parse the pipeline: a linearizable read
    /// cannot also write.
    pub fn check_read_concern(&self, body: &Document) -> Result<(), EngineError> {
        let level = body
            .get_document("readConcern")
            .ok()
            .and_then(|rc| rc.get_str("level").ok());
        if level == Some("linearizable") {
            let name = match self {
                OutputStage::Out { .. } => "$out",
                OutputStage::Merge(_) => "$merge",
            };
            return Err(EngineError::new(
                ErrorCode::InvalidOptions,
                format!("{name} cannot be used with a 'linearizable' read concern level"),
            ));
        }
        Ok(())
    }
}

/// `whenMatched` of `$merge`.
#[derive(Debug, Clone, PartialEq)]
pub enum WhenMatched {
    /// The result replaces the existing document.
    Replace,
    /// The existing document stays.
    KeepExisting,
    /// The result's fields are set on the existing document (the default).
    Merge,
    /// The merge fails with a duplicate key error.
    Fail,
    /// An update pipeline over the existing document, with `$$new` the result.
    Pipeline(Vec<Bson>),
}

/// `whenNotMatched` of `$merge`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WhenNotMatched {
    /// The result is inserted (the default).
    Insert,
    /// The result is dropped.
    Discard,
    /// The merge fails (13113).
    Fail,
}

/// A parsed `$merge`.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeSpec {
    /// Target database.
    pub db: String,
    /// Target collection.
    pub coll: String,
    /// The fields that identify a result's match in the target (`_id` by default).
    pub on: Vec<String>,
    /// What to do with a match.
    pub when_matched: WhenMatched,
    /// What to do without one.
    pub when_not_matched: WhenNotMatched,
    /// `let` for a `whenMatched` pipeline (`new` is bound to the result by default).
    pub let_vars: Option<Document>,
}

/// What `$merge` does with one result.
#[derive(Debug, Clone, PartialEq)]
pub enum MergeAction {
    /// Insert this document.
    Insert(Document),
    /// Replace the match with this document.
    Replace(Document),
    /// Nothing.
    Nothing,
}

fn namespace(spec: &Bson, stage: &str, db: &str) -> Result<(String, String), EngineError> {
    match spec {
        Bson::String(c) => Ok((db.to_string(), c.clone())),
        Bson::Document(d) => {
            let coll = match d.get("coll") {
                Some(Bson::String(c)) => c.clone(),
                _ => {
                    return Err(err(
                        ErrorCode(40414).0,
                        format!("BSON field '{stage}.coll' is missing but a required field"),
                    ))
                }
            };
            let db = match d.get("db") {
                Some(Bson::String(x)) => x.clone(),
                None => db.to_string(),
                Some(other) => {
                    return Err(err(
                        ErrorCode::TypeMismatch.0,
                        format!(
                        "BSON field '{stage}.db' is the wrong type '{}', expected type 'string'",
                        type_name(other)
                    ),
                    ))
                }
            };
            Ok((db, coll))
        }
        other => Err(err(
            if stage == "$out" { 16990 } else { 51178 },
            if stage == "$out" {
                format!(
                    "$out only supports a string or object argument, not {}",
                    type_name(other)
                )
            } else {
                format!(
                    "$merge 'into' field  must be either a string or an object, but found {}",
                    type_name(other)
                )
            },
        )),
    }
    .and_then(|(db, coll)| {
        crate::limits::check_namespace(&db, &coll)
            .map_err(|m| err(ErrorCode::InvalidNamespace.0, m))?;
        Ok((db, coll))
    })
}

/// Splits a pipeline into the stages before its output stage and that stage, checking that
/// `$out`/`$merge` is the last stage (40601) and well formed.
pub fn split_output<'a>(
    pipeline: &'a [Bson],
    db: &str,
) -> Result<(&'a [Bson], Option<OutputStage>), EngineError> {
    let name_of = |s: &Bson| {
        s.as_document()
            .and_then(|d| d.keys().next().cloned())
            .unwrap_or_default()
    };
    for (i, s) in pipeline.iter().enumerate() {
        let name = name_of(s);
        if (name == "$out" || name == "$merge") && i + 1 != pipeline.len() {
            return Err(err(
                40601,
                format!("{name} can only be the final stage in the pipeline"),
            ));
        }
    }
    let Some(last) = pipeline.last() else {
        return Ok((pipeline, None));
    };
    let name = name_of(last);
    let Some(spec) = last.as_document().and_then(|d| d.get(&name)) else {
        return Ok((pipeline, None));
    };
    let prefix = &pipeline[..pipeline.len() - 1];
    match name.as_str() {
        "$out" => {
            let (db, coll) = namespace(spec, "$out", db)?;
            Ok((prefix, Some(OutputStage::Out { db, coll })))
        }
        "$merge" => Ok((prefix, Some(OutputStage::Merge(parse_merge(spec, db)?)))),
        _ => Ok((pipeline, None)),
    }
}

fn parse_merge(spec: &Bson, db: &str) -> Result<MergeSpec, EngineError> {
    let d = match spec {
        Bson::String(_) => {
            let (db, coll) = namespace(spec, "$merge", db)?;
            return Ok(MergeSpec {
                db,
                coll,
                on: vec!["_id".into()],
                when_matched: WhenMatched::Merge,
                when_not_matched: WhenNotMatched::Insert,
                let_vars: None,
            });
        }
        Bson::Document(d) => d,
        other => {
            return Err(err(
                51182,
                format!(
                    "$merge only supports a string or object argument, not {}",
                    type_name(other)
                ),
            ))
        }
    };
    for k in d.keys() {
        if !matches!(
            k.as_str(),
            "into" | "on" | "let" | "whenMatched" | "whenNotMatched" | "targetCollectionVersion"
        ) {
            return Err(err(
                40415,
                format!("BSON field '$merge.{k}' is an unknown field."),
            ));
        }
    }
    let Some(into) = d.get("into") else {
        return Err(err(
            40414,
            "BSON field '$merge.into' is missing but a required field",
        ));
    };
    let (db, coll) = namespace(into, "$merge", db)?;
    let on = match d.get("on") {
        None => vec!["_id".to_string()],
        Some(Bson::String(s)) => vec![s.clone()],
        Some(Bson::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|i| match i {
                Bson::String(s) => Ok(s.clone()),
                _ => Err(err(
                    51134,
                    "$merge 'on' array elements must be strings, but found one",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(Bson::Array(_)) => {
            return Err(err(
                51187,
                "If explicitly specifying $merge 'on', must include at least one field",
            ))
        }
        Some(other) => {
            return Err(err(
                51186,
                format!(
                "$merge 'on' field  must be either a string or an array of strings, but found {}",
                type_name(other)
            ),
            ))
        }
    };
    let when_matched = match d.get("whenMatched") {
        None => WhenMatched::Merge,
        Some(Bson::String(s)) => match s.as_str() {
            "replace" => WhenMatched::Replace,
            "keepExisting" => WhenMatched::KeepExisting,
            "merge" => WhenMatched::Merge,
            "fail" => WhenMatched::Fail,
            other => {
                return Err(err(
                    ErrorCode::BadValue.0,
                    format!(
                        "Enumeration value '{other}' for field 'whenMatched' is not a valid value."
                    ),
                ))
            }
        },
        Some(Bson::Array(p)) => WhenMatched::Pipeline(p.clone()),
        Some(other) => {
            return Err(err(
                51191,
                format!(
                    "$merge 'whenMatched' field must be either a string or an array, but found {}",
                    type_name(other)
                ),
            ))
        }
    };
    let when_not_matched = match d.get("whenNotMatched") {
        None => WhenNotMatched::Insert,
        Some(Bson::String(s)) => match s.as_str() {
            "insert" => WhenNotMatched::Insert,
            "discard" => WhenNotMatched::Discard,
            "fail" => WhenNotMatched::Fail,
            other => {
                return Err(err(
                    ErrorCode::BadValue.0,
                    format!(
                    "Enumeration value '{other}' for field 'whenNotMatched' is not a valid value."
                ),
                ))
            }
        },
        Some(other) => {
            return Err(err(
                ErrorCode::TypeMismatch.0,
                format!(
                "BSON field '$merge.whenNotMatched' is the wrong type '{}', expected type 'string'",
                type_name(other)
            ),
            ))
        }
    };
    let let_vars = match d.get("let") {
        None => None,
        Some(Bson::Document(l)) => {
            if !matches!(when_matched, WhenMatched::Pipeline(_)) {
                return Err(err(
                    51199,
                    "Cannot use 'let' variables with 'whenMatched: merge' mode",
                ));
            }
            Some(l.clone())
        }
        Some(other) => {
            return Err(err(
                ErrorCode::TypeMismatch.0,
                format!(
                    "BSON field '$merge.let' is the wrong type '{}', expected type 'object'",
                    type_name(other)
                ),
            ))
        }
    };
    Ok(MergeSpec {
        db,
        coll,
        on,
        when_matched,
        when_not_matched,
        let_vars,
    })
}

impl MergeSpec {
    /// The values of the `on` fields of a result; a result missing one (or holding an array)
    /// cannot be merged (51132 / 51185).
    pub fn key_of(&self, doc: &Document) -> Result<Vec<Bson>, EngineError> {
        self.on
            .iter()
            .map(|f| match super::path::get(doc, f) {
                Some(Bson::Array(_)) => Err(err(
                    51185,
                    format!("$merge write error: 'on' field '{f}' is an array"),
                )),
                Some(v) => Ok(v.clone()),
                None if f == "_id" => Ok(Bson::Null),
                None => Err(err(
                    51132,
                    format!("$merge write error: 'on' field '{f}' cannot be missing, null, undefined or an array"),
                )),
            })
            .collect()
    }

    /// What to do with `result` given the target's matching document, if any.
    pub fn action(
        &self,
        existing: Option<&Document>,
        mut result: Document,
        vars: &Variables,
    ) -> Result<MergeAction, EngineError> {
        let Some(existing) = existing else {
            return match self.when_not_matched {
                WhenNotMatched::Insert => {
                    if matches!(self.when_matched, WhenMatched::Pipeline(_)) {
                        // With a pipeline, the inserted document is the result itself.
                    }
                    Ok(MergeAction::Insert(result))
                }
                WhenNotMatched::Discard => Ok(MergeAction::Nothing),
                WhenNotMatched::Fail => Err(err(
                    13113,
                    "$merge could not find a matching document in the target collection for at least one document in the source collection",
                )),
            };
        };
        let id = existing.get("_id").cloned().unwrap_or(Bson::Null);
        Ok(match &self.when_matched {
            WhenMatched::KeepExisting => MergeAction::Nothing,
            WhenMatched::Fail => {
                return Err(err(
                    ErrorCode::DuplicateKey.0,
                    format!(
                        "$merge failed due to a DuplicateKey error :: caused by :: E11000 duplicate key error collection: {}.{} index: _id_ dup key: {{ _id: {} }}",
                        self.db,
                        self.coll,
                        crate::value::render::render_value(&id)
                    ),
                ))
            }
            WhenMatched::Replace => {
                result.insert("_id", id);
                MergeAction::Replace(result)
            }
            WhenMatched::Merge => {
                let mut merged = existing.clone();
                for (k, v) in result {
                    if k != "_id" {
                        merged.insert(k, v);
                    }
                }
                MergeAction::Replace(merged)
            }
            WhenMatched::Pipeline(p) => {
                let mut scoped = vars.clone();
                match &self.let_vars {
                    Some(l) => {
                        for (k, e) in l {
                            let v = super::aggregate::eval_with(e, &result, vars)?
                                .unwrap_or(Bson::Null);
                            scoped.bind(k.clone(), v);
                        }
                    }
                    None => scoped.bind("new".into(), Bson::Document(result)),
                }
                let env = Env {
                    db: self.db.clone(),
                    vars: scoped,
                    namespaces: None,
                };
                let out = run_in(p, vec![existing.clone()], &AggregateOptions::default(), &env)?;
                let mut d = out.into_iter().next().unwrap_or_default();
                d.insert("_id", id);
                MergeAction::Replace(d)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn output_stages_refuse_a_linearizable_read_concern() {
        let pipeline = [Bson::Document(doc! {"$out": "other"})];
        let (_, out) = split_output(&pipeline, "db").unwrap();
        let out = out.unwrap();
        let linearizable = doc! {"aggregate": "c", "readConcern": {"level": "linearizable"}};
        let e = out.check_read_concern(&linearizable).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        assert_eq!(
            e.message,
            "$out cannot be used with a 'linearizable' read concern level"
        );
        assert!(out
            .check_read_concern(&doc! {"readConcern": {"level": "majority"}})
            .is_ok());
        let pipeline = [Bson::Document(doc! {"$merge": {"into": "other"}})];
        let (_, merge) = split_output(&pipeline, "db").unwrap();
        let e = merge
            .unwrap()
            .check_read_concern(&linearizable)
            .unwrap_err();
        assert!(e.message.starts_with("$merge"), "{}", e.message);
    }
}
