//! Merging the `writeConcernError`s of a request's child batches into the one the client
//! sees, as mongos 8.0 merges them (`mergeWriteConcernErrors`):
//!
//! - one error keeps its code: `errmsg` is `"<CodeName>: <errmsg>; Error details: <errInfo or
//!   <none>> at <shard>"`;
//! - several become code 64 with `"Multiple errors reported :: <e1> at <s1> :: and :: <e2> at
//!   <s2>"`;
//! - the merged error carries `code`, `codeName` and `errmsg`, never `errInfo`.
//!
//! mongos after 8.0 keeps the first error's code for several errors; 8.0 (and 6.0–7.x) still
//! replace it with 64, and 8.0 is the version Sluice answers as. The name of 64 is the one
//! [`ErrorCode::name`] gives (8.0 says `WriteConcernFailed`, later servers
//! `WriteConcernTimeout`; the project's table holds one name per code).
//!
//! Printing `errInfo` as mongod prints a document is the caller's: it passes the project's
//! [`Printer`], so this module keeps no copy of it.

use bson::{doc, Bson, Document};

use crate::value::error_codes::ErrorCode;

use super::error::Printer;

/// One child batch's `writeConcernError`, and the shard it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardWriteConcernError {
    /// The shard id (`config.shards._id`).
    pub shard: String,
    /// `code`.
    pub code: i32,
    /// `codeName` as the shard sent it (preferred over the router's table, which does not
    /// know every code).
    pub code_name: Option<String>,
    /// `errmsg`.
    pub errmsg: String,
    /// `errInfo`, when present.
    pub err_info: Option<Document>,
}

impl ShardWriteConcernError {
    /// Reads the `writeConcernError` sub-document of a shard's reply; `None` if it has no
    /// numeric code.
    pub fn from_document(shard: &str, wce: &Document) -> Option<Self> {
        let code = match wce.get("code")? {
            Bson::Int32(c) => *c,
            Bson::Int64(c) => i32::try_from(*c).ok()?,
            Bson::Double(c) if c.fract() == 0.0 && c.abs() <= f64::from(i32::MAX) => *c as i32,
            _ => return None,
        };
        Some(ShardWriteConcernError {
            shard: shard.to_string(),
            code,
            code_name: wce.get_str("codeName").ok().map(str::to_string),
            errmsg: wce.get_str("errmsg").unwrap_or_default().to_string(),
            err_info: wce.get_document("errInfo").ok().cloned(),
        })
    }

    fn code_name(&self) -> String {
        match &self.code_name {
            Some(n) if !n.is_empty() => n.clone(),
            _ => ErrorCode(self.code).name(),
        }
    }

    /// mongos's `WriteConcernErrorDetail::toString()` followed by `" at <shard>"`.
    fn describe(&self, printer: &Printer) -> String {
        let details = match &self.err_info {
            Some(info) => (printer.document)(info),
            None => "<none>".to_string(),
        };
        format!(
            "{}: {}; Error details: {} at {}",
            self.code_name(),
            self.errmsg,
            details,
            self.shard
        )
    }
}

/// The client's `writeConcernError`, merged from the child batches' errors in the order they
/// were received; `None` when there is none. `printer` prints an `errInfo` document as mongod
/// does (`{ wtimeout: true, … }`).
pub fn merge_write_concern_errors(
    errors: &[ShardWriteConcernError],
    printer: &Printer,
) -> Option<Document> {
    let first = errors.first()?;
    if errors.len() == 1 {
        return Some(doc! {
            "code": first.code,
            "codeName": first.code_name(),
            "errmsg": first.describe(printer),
        });
    }
    let parts: Vec<String> = errors.iter().map(|e| e.describe(printer)).collect();
    let code = ErrorCode::WriteConcernTimeout;
    Some(doc! {
        "code": code.0,
        "codeName": code.name(),
        "errmsg": format!("Multiple errors reported :: {}", parts.join(" :: and :: ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Message wording is tested with the project's own printer in `tests/`; here a stub
    /// marks where a document was printed.
    const STUB: Printer = Printer {
        document: |_| "{…}".to_string(),
        value: |_| "…".to_string(),
        type_name: |_| "type",
    };

    fn wce(shard: &str, code: i32) -> ShardWriteConcernError {
        ShardWriteConcernError::from_document(
            shard,
            &doc! {"code": code, "errmsg": "m", "errInfo": {"wtimeout": true}},
        )
        .unwrap()
    }

    #[test]
    fn none_gives_none() {
        assert_eq!(merge_write_concern_errors(&[], &STUB), None);
    }

    #[test]
    fn one_error_keeps_its_code_and_names_its_shard() {
        let e = ShardWriteConcernError::from_document(
            "shard01",
            &doc! {"code": 91, "codeName": "ShutdownInProgress", "errmsg": "shutting down"},
        )
        .unwrap();
        assert_eq!(
            merge_write_concern_errors(&[e], &STUB).unwrap(),
            doc! {
                "code": 91,
                "codeName": "ShutdownInProgress",
                "errmsg": "ShutdownInProgress: shutting down; Error details: <none> at shard01",
            }
        );
        let merged = merge_write_concern_errors(&[wce("s1", 189)], &STUB).unwrap();
        assert_eq!(merged.get_i32("code").unwrap(), 189);
        assert_eq!(merged.get_str("codeName").unwrap(), "PrimarySteppedDown");
        assert_eq!(
            merged.get_str("errmsg").unwrap(),
            "PrimarySteppedDown: m; Error details: {…} at s1"
        );
        assert!(!merged.contains_key("errInfo"));
    }

    #[test]
    fn several_errors_become_one_with_code_64() {
        let merged =
            merge_write_concern_errors(&[wce("a", 189), wce("b", 91), wce("c", 64)], &STUB)
                .unwrap();
        assert_eq!(merged.get_i32("code").unwrap(), 64);
        assert_eq!(merged.get_str("codeName").unwrap(), ErrorCode(64).name());
        assert_eq!(
            merged.get_str("errmsg").unwrap(),
            format!(
                "Multiple errors reported :: PrimarySteppedDown: m; Error details: {{…}} at a \
                 :: and :: ShutdownInProgress: m; Error details: {{…}} at b :: and :: {}: m; \
                 Error details: {{…}} at c",
                ErrorCode(64).name()
            )
        );
        assert_eq!(merged.len(), 3);
    }

    #[test]
    fn malformed_errors_are_not_read() {
        assert!(ShardWriteConcernError::from_document("s", &doc! {"errmsg": "x"}).is_none());
        assert!(ShardWriteConcernError::from_document("s", &doc! {"code": "64"}).is_none());
        assert!(ShardWriteConcernError::from_document("s", &doc! {"code": 1e20}).is_none());
        let e = ShardWriteConcernError::from_document("s", &doc! {"code": 64.0}).unwrap();
        assert_eq!(e.code, 64);
    }
}
