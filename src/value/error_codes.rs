//! MongoDB error codes and their names, shared by every layer.
//!
//! Replies carry both the number and the `codeName`; drivers branch on the number, humans read
//! the name. The table holds the codes Sluice produces or forwards; an unknown number gets the
//! name `"Location<code>"`, which is what mongod prints for its location-only codes (the wire
//! parser's 40430…40587, for instance, have constants here but no name of their own).

/// A MongoDB error code. Numbers are the server's (`error_codes.yml`, plus the location codes
/// of the wire parser).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub i32);

macro_rules! codes {
    (named { $($name:ident = $num:expr),* $(,)? } location { $($lname:ident = $lnum:expr),* $(,)? }) => {
        #[allow(non_upper_case_globals)]
        impl ErrorCode {
            $(
                #[allow(missing_docs)]
                pub const $name: ErrorCode = ErrorCode($num);
            )*
            $(
                #[allow(missing_docs)]
                pub const $lname: ErrorCode = ErrorCode($lnum);
            )*

            /// The `codeName` MongoDB reports for this code.
            pub fn name(self) -> String {
                match self.0 {
                    $($num => stringify!($name).to_string(),)*
                    other => format!("Location{other}"),
                }
            }
        }
    };
}

impl ErrorCode {
    /// The `{ok: 0, errmsg, code, codeName}` reply of an error with this code: the one place
    /// that shape is written, for the router's and the embedded shard's errors alike.
    pub fn error_reply(self, message: &str) -> bson::Document {
        bson::doc! {
            "ok": 0.0,
            "errmsg": message,
            "code": self.0,
            "codeName": self.name(),
        }
    }
}

codes! {
named {
    InternalError = 1,
    BadValue = 2,
    NoSuchKey = 4,
    GraphContainsCycle = 5,
    HostUnreachable = 6,
    HostNotFound = 7,
    FailedToParse = 9,
    Unauthorized = 13,
    TypeMismatch = 14,
    Overflow = 15,
    InvalidLength = 16,
    ProtocolError = 17,
    IllegalOperation = 20,
    InvalidBSON = 22,
    NamespaceNotFound = 26,
    IndexNotFound = 27,
    PathNotViable = 28,
    ConflictingUpdateOperators = 40,
    CursorNotFound = 43,
    NamespaceExists = 48,
    MaxTimeMSExpired = 50,
    DollarPrefixedFieldName = 52,
    InvalidIdField = 53,
    EmptyFieldName = 56,
    CommandNotFound = 59,
    ShardKeyNotFound = 61,
    WriteConcernTimeout = 64,
    MultipleErrorsOccurred = 65,
    ImmutableField = 66,
    CannotCreateIndex = 67,
    IndexAlreadyExists = 68,
    ShardNotFound = 70,
    InvalidOptions = 72,
    InvalidNamespace = 73,
    UnknownReplWriteConcern = 79,
    NoProgressMade = 82,
    CannotSplit = 106,
    IndexOptionsConflict = 85,
    IndexKeySpecsConflict = 86,
    NetworkTimeout = 89,
    CallbackCanceled = 90,
    ShutdownInProgress = 91,
    NotSecondary = 95,
    OperationFailed = 96,
    UnsatisfiableWriteConcern = 100,
    CommandNotSupported = 115,
    ConflictingOperationInProgress = 117,
    NamespaceNotSharded = 118,
    DocumentValidationFailure = 121,
    CommandFailed = 125,
    FailedToSatisfyReadPreference = 133,
    ReadConcernMajorityNotAvailableYet = 134,
    MaxStalenessOutOfRange = 160,
    ViewDepthLimitExceeded = 165,
    CommandNotSupportedOnView = 166,
    OptionNotSupportedOnView = 167,
    InvalidPipelineOperator = 168,
    CommandOnShardedViewNotSupportedOnMongod = 169,
    ClientMetadataCannotBeMutated = 186,
    PrimarySteppedDown = 189,
    FailPointEnabled = 192,
    BalancerInterrupted = 194,
    NetworkInterfaceExceededTimeLimit = 202,
    NoSuchSession = 206,
    InvalidUUID = 207,
    IllegalOpMsgFlag = 223,
    TooManyDocumentSequences = 233,
    CursorKilled = 237,
    NotImplemented = 238,
    NoSuchTransaction = 251,
    ExceededTimeLimit = 262,
    OperationNotSupportedInTransaction = 263,
    ChecksumMismatch = 288,
    ConnectionPoolExpired = 317,
    UnsupportedOpQueryCommand = 352,
    SocketException = 9001,
    DuplicateKey = 11000,
    NotWritablePrimary = 10107,
    BSONObjectTooLarge = 10334,
    StaleConfig = 13388,
    InterruptedAtShutdown = 11600,
    InterruptedDueToReplStateChange = 11602,
    NotPrimaryNoSecondaryOk = 13435,
    NotPrimaryOrSecondary = 13436,
    TransactionTooOld = 225,
    StaleEpoch = 150,
    StaleDbVersion = 249,
    CannotImplicitlyCreateCollection = 227,
    UserNotFound = 11,
    UnsupportedFormat = 12,
    AuthenticationFailed = 18,
    InvalidPath = 30,
    RoleNotFound = 31,
    InvalidRoleModification = 172,
    UserDataInconsistent = 45,
    InvalidSSLConfiguration = 140,
    SSLHandshakeFailed = 141,
    MechanismUnavailable = 334,
    CannotBackfillArray = 34,
    ExceededMemoryLimit = 146,
    TooManyLogicalSessions = 261,
    QueryExceededMemoryLimitNoDiskUseAllowed = 292,
    ConversionFailure = 241,
    DatabaseDifferCase = 13297,
    WriteConflict = 112,
    LockTimeout = 24,
    TransactionCommitted = 256,
    SnapshotUnavailable = 246,
    SnapshotTooOld = 239,
    PreparedTransactionInProgress = 267,
    StaleShardVersion = 63,
    Interrupted = 11601,
}
location {
    TransactionBannedDatabase = 50844,
    OpMsgMultipleBodies = 40430,
    OpMsgDuplicateSequence = 40431,
    OpMsgUnknownSectionKind = 40432,
    OpMsgDuplicateField = 40433,
    OpMsgNoBody = 40587,
    ShardKeyUpdateWithoutFullKey = 31025,
    AwaitableHelloBothFields = 51760,
    LegacyOpcodeRemoved = 5739101,
    IdlUnknownField = 40415,
    IdlMissingField = 40414,
    UserAlreadyExists = 51003,
    RoleAlreadyExists = 51002,
    SaslPrepEmpty = 50687,
    SaslPrepProhibited = 50692,
    KeyFileWithoutKeys = 50981,
    SpeculativeUnknownCommand = 51769,
    AlreadyAuthenticatedAs = 5626701,
    AuthenticatedOnAnotherDb = 5626702,
    AlreadyAuthenticatedStrict = 5626703,
    MatchPathTooLong = 5729100,
    ModByZero = 16610,
    ModByZeroDecimal = 5733415,
    UpdatedDocumentTooLarge = 17419,
    AbsOfLongMin = 28680,
}
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_server_table() {
        assert_eq!(ErrorCode::CommandNotFound.name(), "CommandNotFound");
        assert_eq!(ErrorCode(59), ErrorCode::CommandNotFound);
        assert_eq!(ErrorCode::ChecksumMismatch.0, 288);
        assert_eq!(ErrorCode::OpMsgMultipleBodies.name(), "Location40430");
        assert_eq!(ErrorCode(123456).name(), "Location123456");
    }
}
