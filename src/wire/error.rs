//! Errors of the wire layer.

use crate::value::error_codes::ErrorCode;

/// What went wrong with one message, and what the connection must do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WireError {
    /// The stream cannot be trusted any more (an impossible length, an opcode we cannot answer
    /// in kind): the connection is closed without a reply, as mongod does.
    #[error("{0}")]
    Fatal(String),
    /// The message was framed correctly but its content is invalid: the peer gets an error
    /// reply with `code`, and the connection stays open unless `close_after` says otherwise
    /// (mongod's `ConnectionFatalMessageParseError` category: illegal flags, checksum).
    #[error("{message}")]
    Invalid {
        /// The MongoDB error code sent back.
        code: ErrorCode,
        /// The `errmsg` sent back.
        message: String,
        /// Close the connection once the error reply is sent.
        close_after: bool,
    },
}

impl WireError {
    /// An error reply that keeps the connection open.
    pub fn invalid(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError::Invalid {
            code,
            message: message.into(),
            close_after: false,
        }
    }

    /// An error reply after which the connection is closed.
    pub fn connection_fatal(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError::Invalid {
            code,
            message: message.into(),
            close_after: true,
        }
    }
}
