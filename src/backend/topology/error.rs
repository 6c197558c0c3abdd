//! The error every part of the replica-set core returns: a MongoDB code and the message a
//! client sees, exactly as mongos words it where mongos has a wording.

use crate::value::error_codes::ErrorCode;

/// A failure with mongos's code and message (`FailedToSatisfyReadPreference`, a rejected
/// `$readPreference`, a malformed seed list, …). The caller turns it into a command error or a
/// statement error; the core never decides which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TopologyError {
    /// The MongoDB error code.
    pub code: ErrorCode,
    /// The message, without the code name.
    pub message: String,
}

impl TopologyError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        TopologyError {
            code,
            message: message.into(),
        }
    }

    /// `codeName` for the reply.
    pub fn code_name(&self) -> String {
        self.code.name()
    }
}

/// How values are printed in messages, as mongod prints them (`{ mode: "primary" }`,
/// `maxStalenessSeconds: 90.5`, type names such as `string`). The project keeps one copy of
/// these helpers in its value layer; the caller passes them in, so this core holds none.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    /// A document: `{ a: 1, b: "x" }`.
    pub document: fn(&bson::Document) -> String,
    /// One value: `1`, `"x"`, `90.5`.
    pub value: fn(&bson::Bson) -> String,
    /// A value's type name: `double`, `string`, `object`, …
    pub type_name: fn(&bson::Bson) -> &'static str,
}
