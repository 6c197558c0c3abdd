//! The error every part of the config-server source returns: a MongoDB code and the message a
//! client sees, worded as mongos and mongod word the same failure.

use crate::value::error_codes::ErrorCode;

/// A failure to read, parse or apply routing metadata. The caller turns it into a command error;
/// the code says whether trying again may help ([`MetadataError::is_transient`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct MetadataError {
    /// The MongoDB error code.
    pub code: ErrorCode,
    /// The message, without the code name.
    pub message: String,
}

impl MetadataError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        MetadataError {
            code,
            message: message.into(),
        }
    }

    /// `codeName` for the reply.
    pub fn code_name(&self) -> String {
        self.code.name()
    }

    /// The same error with mongod's context prefix: `"<context> :: caused by :: <message>"`.
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        MetadataError {
            code: self.code,
            message: format!("{context} :: caused by :: {}", self.message),
        }
    }

    /// Whether reading again may succeed: an inconsistent read of a catalog that was changing
    /// (`ConflictingOperationInProgress`), or a failure of the config server's connection or
    /// primary. Malformed metadata is not transient: it stays malformed until someone fixes it.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.code,
            ErrorCode::ConflictingOperationInProgress
                | ErrorCode::HostUnreachable
                | ErrorCode::HostNotFound
                | ErrorCode::NetworkTimeout
                | ErrorCode::SocketException
                | ErrorCode::NotWritablePrimary
                | ErrorCode::NotPrimaryNoSecondaryOk
                | ErrorCode::NotPrimaryOrSecondary
                | ErrorCode::PrimarySteppedDown
                | ErrorCode::InterruptedDueToReplStateChange
                | ErrorCode::InterruptedAtShutdown
                | ErrorCode::ShutdownInProgress
                | ErrorCode::ReadConcernMajorityNotAvailableYet
                | ErrorCode::FailedToSatisfyReadPreference
                | ErrorCode::NetworkInterfaceExceededTimeLimit
                | ErrorCode::ExceededTimeLimit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_is_mongods_caused_by_chain() {
        let e = MetadataError::new(ErrorCode::NoSuchKey, "Missing expected field \"host\"")
            .context("Failed to parse shard document { _id: \"s0\" }");
        assert_eq!(
            e.message,
            "Failed to parse shard document { _id: \"s0\" } :: caused by :: Missing expected field \"host\""
        );
        assert_eq!(e.code, ErrorCode::NoSuchKey);
        assert_eq!(e.code_name(), "NoSuchKey");
    }

    #[test]
    fn transient_codes_are_the_retryable_ones() {
        assert!(MetadataError::new(ErrorCode::ConflictingOperationInProgress, "").is_transient());
        assert!(MetadataError::new(ErrorCode::HostUnreachable, "").is_transient());
        assert!(!MetadataError::new(ErrorCode::NoSuchKey, "").is_transient());
        assert!(!MetadataError::new(ErrorCode::TypeMismatch, "").is_transient());
        assert!(!MetadataError::new(ErrorCode::BadValue, "").is_transient());
    }
}
