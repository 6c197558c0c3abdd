//! The security core: who a client is (SCRAM-SHA-1, SCRAM-SHA-256, MONGODB-X509), what it may do
//! (MongoDB's built-in roles, checked per command), and the transport it arrives on (TLS).
//!
//! Everything here is sans-IO: functions and state machines that take bytes, documents and
//! already-read files and return replies, errors and configurations. The connection task, the
//! dispatcher, the backend pools and the embedded shard call into it; nothing here calls out.
//! It imports nothing from the rest of the crate but [`crate::value::error_codes`], so it sits beside
//! `wire/` in the layering (see `docs/design/security.md`).
//!
//! | module | owns |
//! |---|---|
//! | [`scram`] | SCRAM key derivation, stored-credential generation, the server conversation (mongod's step rules and errors) and the client conversation (Sluice authenticating itself to shards) |
//! | [`session`] | the per-connection authentication slot: `saslStart`/`saslContinue`/`authenticate`/`logout`, `speculativeAuthenticate` and `saslSupportedMechs` in `hello`, `connectionStatus` |
//! | [`credentials`] | the `admin.system.users` document and the users file holding such documents |
//! | [`keyfile`] | the cluster keyfile as mongod reads it, and the `__system@local` credentials derived from it |
//! | [`roles`] | actions, resource patterns, privileges and MongoDB's built-in roles |
//! | [`custom_roles`] | the `admin.system.roles` document and the role graph users' roles are resolved through |
//! | [`role_admin`] | `createRole`, `updateRole`, `dropRole`, `grantRolesToRole`, `grantPrivilegesToRole`, their revocations, `rolesInfo` |
//! | [`authorize`] | the per-command authorization checks and mongod's `Unauthorized` messages |
//! | [`cursors`] | who opened each cursor: only that user continues or kills it |
//! | [`render`] | BSON rendered the way mongod prints it in error messages |
//! | [`user_admin`] | `createUser`, `updateUser`, `dropUser`, `dropAllUsersFromDatabase`, `usersInfo` on the users of static and demo mode |
//! | [`user_cache`] | users resolved into privileges and restrictions, kept per user for one generation of the user set |
//! | [`tls`] | rustls server and client configurations, the `tls_mode` values, telling TLS from plain on one port |
//! | [`x509`] | the subject name of a certificate in mongod's RFC 2253 form, cluster membership |

pub mod authorize;
pub mod credentials;
pub mod cursors;
pub mod custom_roles;
pub mod keyfile;
pub mod render;
pub mod restrictions;
pub mod role_admin;
pub mod roles;
pub mod scram;
pub mod session;
pub mod tls;
pub mod user_admin;
pub mod user_cache;
pub mod x509;

use crate::value::error_codes::ErrorCode;
use std::fmt;

/// The database of users that authenticate outside MongoDB (X.509 subjects).
pub const EXTERNAL_DB: &str = "$external";

/// The in-memory cluster user of servers started with a keyfile.
pub const INTERNAL_USER: &str = "__system";

/// The database of [`INTERNAL_USER`].
pub const INTERNAL_DB: &str = "local";

/// An authentication mechanism by its MongoDB name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// `SCRAM-SHA-1` (RFC 5802 over mongod's MD5 password digest).
    ScramSha1,
    /// `SCRAM-SHA-256` (RFC 7677 over the SASLprepped password).
    ScramSha256,
    /// `MONGODB-X509`: the client certificate's subject is the user name.
    MongodbX509,
}

impl Mechanism {
    /// Every mechanism Sluice offers, in mongod's registry order (that order is what
    /// `saslSupportedMechs` lists).
    pub const ALL: [Mechanism; 3] = [
        Mechanism::MongodbX509,
        Mechanism::ScramSha1,
        Mechanism::ScramSha256,
    ];

    /// The name drivers send and `saslSupportedMechs` lists.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::ScramSha1 => "SCRAM-SHA-1",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::MongodbX509 => "MONGODB-X509",
        }
    }

    /// The mechanism of a name, exactly as spelled (mongod compares names case-sensitively).
    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A user: a name in an authentication database (`alice@test`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserName {
    /// The user name as stored (`user` of the user document).
    pub user: String,
    /// The database the user is defined in (`db` of the user document).
    pub db: String,
}

impl UserName {
    /// A user name from its parts.
    pub fn new(user: impl Into<String>, db: impl Into<String>) -> UserName {
        UserName {
            user: user.into(),
            db: db.into(),
        }
    }

    /// `__system@local`, the cluster's internal user.
    pub fn internal() -> UserName {
        UserName::new(INTERNAL_USER, INTERNAL_DB)
    }

    /// Whether this is `__system@local`.
    pub fn is_internal(&self) -> bool {
        self.user == INTERNAL_USER && self.db == INTERNAL_DB
    }

    /// The `_id` of the user's `admin.system.users` document: `"<db>.<user>"`.
    pub fn id(&self) -> String {
        format!("{}.{}", self.db, self.user)
    }

    /// Parses the `"<db>.<user>"` form of `hello.saslSupportedMechs`, split at the first dot as
    /// mongod splits it (`"admin.a.b"` is user `a.b` in `admin`).
    pub fn parse_db_dot_user(s: &str) -> Result<UserName, AuthError> {
        match s.split_once('.') {
            Some((db, user)) => Ok(UserName::new(user, db)),
            None => Err(AuthError::new(
                ErrorCode::BadValue,
                "UserName must contain a '.' separated database.user pair",
            )),
        }
    }
}

impl fmt::Display for UserName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.user, self.db)
    }
}

/// An error a client sees (code and message, exactly as mongod sends them), plus what only the
/// log may see.
///
/// Authentication failures answer every client with the same "Authentication failed." so that
/// nobody can tell an unknown user from a wrong password; the reason goes to `log_detail`. The
/// detail never holds a password, a proof or a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthError {
    /// The code the reply carries.
    pub code: ErrorCode,
    /// The `errmsg` the reply carries.
    pub message: String,
    /// Why it failed, for the log only (mongod's internal message), when it differs from
    /// `message`.
    pub log_detail: Option<String>,
}

impl AuthError {
    /// An error whose message is also its log line.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> AuthError {
        AuthError {
            code,
            message: message.into(),
            log_detail: None,
        }
    }

    /// 2 BadValue: a malformed argument to a user or role command.
    pub fn bad_value(message: impl Into<String>) -> AuthError {
        AuthError::new(ErrorCode::BadValue, message)
    }

    /// 18 AuthenticationFailed "Authentication failed.", with the real reason for the log.
    pub fn authentication_failed(log_detail: impl Into<String>) -> AuthError {
        AuthError {
            code: ErrorCode::AuthenticationFailed,
            message: AUTHENTICATION_FAILED.to_string(),
            log_detail: Some(log_detail.into()),
        }
    }

    /// What to write to the log: the detail when there is one, else the message.
    pub fn for_log(&self) -> &str {
        self.log_detail.as_deref().unwrap_or(&self.message)
    }
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for AuthError {}

/// The one message every failed authentication step answers with.
pub const AUTHENTICATION_FAILED: &str = "Authentication failed.";

/// Fills `buf` from the operating system's CSPRNG (through the TLS stack's crypto provider, so
/// no second source of randomness is linked in).
pub fn secure_random(buf: &mut [u8]) -> Result<(), AuthError> {
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(buf)
        .map_err(|_| AuthError::new(ErrorCode::InternalError, "no secure random source"))
}

/// Compares two byte strings in time that depends only on their lengths, so that a proof
/// check leaks nothing about how many leading bytes matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mechanism_names_round_trip_case_sensitively() {
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::from_name(m.name()), Some(m));
        }
        assert_eq!(Mechanism::from_name("scram-sha-256"), None);
        assert_eq!(Mechanism::from_name("PLAIN"), None);
    }

    #[test]
    fn db_dot_user_splits_at_the_first_dot() {
        assert_eq!(
            UserName::parse_db_dot_user("admin.a.b").unwrap(),
            UserName::new("a.b", "admin")
        );
        assert_eq!(
            UserName::parse_db_dot_user("test.").unwrap(),
            UserName::new("", "test")
        );
        let e = UserName::parse_db_dot_user("nodot").unwrap_err();
        assert_eq!(e.code, ErrorCode::BadValue);
        assert_eq!(
            e.message,
            "UserName must contain a '.' separated database.user pair"
        );
    }

    #[test]
    fn user_name_forms() {
        let u = UserName::new("alice", "test");
        assert_eq!(u.to_string(), "alice@test");
        assert_eq!(u.id(), "test.alice");
        assert!(UserName::internal().is_internal());
        assert!(!u.is_internal());
    }

    #[test]
    fn constant_time_eq_compares_contents_and_lengths() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn secure_random_fills_differently_each_time() {
        let mut a = [0u8; 24];
        let mut b = [0u8; 24];
        secure_random(&mut a).unwrap();
        secure_random(&mut b).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn authentication_failed_hides_the_reason_from_the_client() {
        let e = AuthError::authentication_failed("SCRAM authentication failed, storedKey mismatch");
        assert_eq!(e.code, ErrorCode::AuthenticationFailed);
        assert_eq!(e.message, "Authentication failed.");
        assert_eq!(
            e.for_log(),
            "SCRAM authentication failed, storedKey mismatch"
        );
    }
}
