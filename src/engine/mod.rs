//! The document engine: what MongoDB does to documents, with no server, socket or shard in it.
//! The embedded shard stores and serves documents with it; the router uses the same code to
//! merge and finish what shards return (sort, projection, the router's part of a split
//! pipeline) and to predict what an upsert will insert.
//!
//! - [`path`]: dotted paths (`a.b.0.c`) through documents and arrays.
//! - [`matcher`]: the query language, a filter parsed once into a `Matcher`.
//! - [`query`]: sort specifications and projections.
//! - [`update`]: update operators and replacements, parsed once and applied; the document an
//!   upsert inserts.
//! - [`aggregate`]: the pipeline runner, the basic stages and expressions.
//! - [`collation`]: a request's `collation`, as sort keys the other modules compare.
//! - [`output`]: `$out` and `$merge`, parsed, and `$merge`'s decision per document.
//! - [`expressions`]: the expression operator families beyond the core.
//! - [`stages`]: the joining, reshaping, bucketing and window stages.
//! - [`date_parts`]: `$dateFromParts` and `$dateToParts`.
//! - [`time_zone`]: the date operators' `timezone`: fixed offsets and the Olson names of the
//!   system's time zone database, checked and cached.
//! - [`tzif`]: time zone rules read from TZif files (RFC 8536) and their POSIX TZ footers.
//! - [`fill`]: `$densify` and `$fill`.
//! - [`quantile`]: `$percentile` and `$median`, as accumulators, window functions and
//!   expressions.
//! - [`series`]: the window functions that read a partition as a series: `$expMovingAvg`,
//!   `$derivative`, `$integral`, `$covariancePop`, `$covarianceSamp`.
//!
//! Every failure is an [`EngineError`]: a MongoDB code and message, with the extra fields
//! mongod puts beside them.

pub mod aggregate;
pub mod collation;
pub mod date_parts;
pub mod expressions;
pub mod fill;
pub mod matcher;
pub mod output;
pub mod path;
pub mod quantile;
pub mod query;
pub mod reads;
pub mod series;
pub mod stages;
pub mod time_zone;
pub mod tzif;
pub mod update;

use bson::{doc, Document};

use crate::value::error_codes::ErrorCode;

/// An error of the document engine, with the extra fields mongod puts beside `code` and
/// `errmsg` (`keyPattern`/`keyValue` for a duplicate key, the versions of a StaleConfig).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct EngineError {
    /// The MongoDB code.
    pub code: ErrorCode,
    /// The `errmsg`.
    pub message: String,
    /// Extra fields.
    pub extra: Option<Document>,
}

impl EngineError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        EngineError {
            code,
            message: message.into(),
            extra: None,
        }
    }

    /// 40415, the command parser's `BSON field '<path>' is an unknown field.`
    pub fn unknown_field(path: &str) -> Self {
        EngineError::new(
            ErrorCode(40415),
            format!("BSON field '{path}' is an unknown field."),
        )
    }

    /// 40414, the command parser's `BSON field '<path>' is missing but a required field`.
    pub fn missing_field(path: &str) -> Self {
        EngineError::new(
            ErrorCode(40414),
            format!("BSON field '{path}' is missing but a required field"),
        )
    }

    /// 14 TypeMismatch, the command parser's `BSON field '<path>' is the wrong type '<type>',
    /// expected type '<expected>'`.
    pub fn wrong_type(path: &str, value: &bson::Bson, expected: &str) -> Self {
        EngineError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field '{path}' is the wrong type '{}', expected type '{expected}'",
                crate::value::field::type_name(value)
            ),
        )
    }

    /// Adds extra fields.
    pub fn with_extra(mut self, extra: Document) -> Self {
        self.extra = Some(extra);
        self
    }

    /// The `writeErrors` entry for statement `index`.
    pub fn write_error(&self, index: usize) -> Document {
        let mut d = doc! {"index": index as i32, "code": self.code.0, "errmsg": &self.message};
        if let Some(extra) = &self.extra {
            for (k, v) in extra {
                d.insert(k.clone(), v.clone());
            }
        }
        d
    }

    /// The `{ok: 0, errmsg, code, codeName, …}` reply.
    pub fn to_reply(&self) -> Document {
        let mut d = self.code.error_reply(&self.message);
        if let Some(extra) = &self.extra {
            for (k, v) in extra {
                d.insert(k.clone(), v.clone());
            }
        }
        d
    }
}
