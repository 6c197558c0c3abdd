//! The server's local logical session cache, as `$listLocalSessions` reads it: every session
//! (`lsid`) a request named, with when it was last used.
//!
//! mongod and mongos keep such a cache per process and list it with `$listLocalSessions`
//! (`{aggregate: 1}` on any database). Each entry is the session's id, the digest of the user
//! that owns it (`uid`, SHA-256 of `user@db`, or of nothing when no user is authenticated),
//! and `lastUse`. Sessions unused for `logicalSessionTimeoutMinutes` leave the cache, and it
//! holds at most [`MAX_SESSIONS`] (mongod's `maxSessions`): a new session beyond that is
//! refused with TooManyLogicalSessions (261).
//!
//! The router records sessions before it knows who is authenticated on the connection, so
//! every session is recorded under the digest of no user: with authorization enabled only
//! `{allUsers: true}` (which needs the `listSessions` privilege) lists them.

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use dashmap::DashMap;
use sha2::{Digest, Sha256};

use super::CommandError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::type_name;

/// Most sessions the cache holds (mongod's `maxSessions` default).
pub const MAX_SESSIONS: usize = 1_000_000;

/// How long an unused session stays (`logicalSessionTimeoutMinutes`, 30, as `hello` says).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The local session cache. Every request with an `lsid` records its use, so the map is
/// sharded (one lock per shard of keys, not one for the process).
#[derive(Debug, Default)]
pub struct LocalSessions {
    sessions: DashMap<[u8; 16], Used>,
}

#[derive(Debug, Clone, Copy)]
struct Used {
    at: Instant,
    wall: bson::DateTime,
}

/// The `uid` of a session no authenticated user owns: the SHA-256 of nothing.
pub fn no_user_digest() -> [u8; 32] {
    Sha256::digest(b"").into()
}

/// The `uid` of `user@db` (the digest of no user for an empty user name, as mongod).
pub fn user_digest(user: &str, db: &str) -> [u8; 32] {
    if user.is_empty() {
        return no_user_digest();
    }
    Sha256::digest(format!("{user}@{db}").as_bytes()).into()
}

impl LocalSessions {
    /// Records a use of session `id` now. A new session beyond [`MAX_SESSIONS`] (after the
    /// expired ones leave) is refused.
    pub fn touch(&self, id: [u8; 16]) -> Result<(), CommandError> {
        let now = Used {
            at: Instant::now(),
            wall: bson::DateTime::now(),
        };
        let sessions = &self.sessions;
        if let Some(mut used) = sessions.get_mut(&id) {
            *used = now;
            return Ok(());
        }
        if sessions.len() >= MAX_SESSIONS {
            sessions.retain(|_, u| now.at.duration_since(u.at) < SESSION_TIMEOUT);
            if sessions.len() >= MAX_SESSIONS {
                return Err(CommandError::new(
                    ErrorCode::TooManyLogicalSessions,
                    format!("Unable to add session into the cache because the number of active sessions is too high (limit {MAX_SESSIONS})"),
                ));
            }
        }
        sessions.insert(id, now);
        Ok(())
    }

    /// The records of the sessions in use, most recently used first, as `$listLocalSessions`
    /// returns them: all of them, or those of the users whose digests are given.
    pub fn list(&self, users: Option<&[[u8; 32]]>) -> Vec<Document> {
        let now = Instant::now();
        self.sessions
            .retain(|_, u| now.duration_since(u.at) < SESSION_TIMEOUT);
        let uid = no_user_digest();
        if users.is_some_and(|u| !u.contains(&uid)) {
            return Vec::new();
        }
        let mut records: Vec<([u8; 16], Used)> = self
            .sessions
            .iter()
            .map(|e| (*e.key(), *e.value()))
            .collect();
        records.sort_by_key(|r| std::cmp::Reverse(r.1.at));
        records
            .into_iter()
            .map(|(id, used)| {
                doc! {
                    "_id": {
                        "id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: id.to_vec() }),
                        "uid": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: uid.to_vec() }),
                    },
                    "lastUse": used.wall,
                }
            })
            .collect()
    }
}

/// Reads the argument of `$listLocalSessions` (or `$listSessions`): `None` for
/// `{allUsers: true}`, otherwise the digests of the users listed (the user with no name when
/// none are: the caller's own sessions without authentication).
pub fn parse_list_sessions(
    stage: &str,
    spec: &Bson,
) -> Result<Option<Vec<[u8; 32]>>, CommandError> {
    let Bson::Document(spec) = spec else {
        return Err(CommandError::new(
            ErrorCode::TypeMismatch,
            format!(
                "{stage} options must be specified in an object, but found: {}",
                type_name(spec)
            ),
        ));
    };
    let mut all_users = false;
    let mut users = Vec::new();
    for (k, v) in spec {
        match (k.as_str(), v) {
            ("allUsers", Bson::Boolean(b)) => all_users = *b,
            ("users", Bson::Array(items)) => {
                for item in items {
                    let Bson::Document(u) = item else {
                        return Err(CommandError::new(
                            ErrorCode::TypeMismatch,
                            format!("BSON field '{stage}.users' is the wrong type '{}', expected type 'object'", type_name(item)),
                        ));
                    };
                    let (Ok(user), Ok(db)) = (u.get_str("user"), u.get_str("db")) else {
                        return Err(CommandError::new(
                            ErrorCode(40414),
                            format!(
                                "BSON field '{stage}.users.user' is missing but a required field"
                            ),
                        ));
                    };
                    users.push(user_digest(user, db));
                }
            }
            ("allUsers", other) => {
                return Err(CommandError::new(
                    ErrorCode::TypeMismatch,
                    format!(
                    "BSON field '{stage}.allUsers' is the wrong type '{}', expected type 'bool'",
                    type_name(other)
                ),
                ))
            }
            ("users", other) => {
                return Err(CommandError::new(
                    ErrorCode::TypeMismatch,
                    format!(
                        "BSON field '{stage}.users' is the wrong type '{}', expected type 'array'",
                        type_name(other)
                    ),
                ))
            }
            (other, _) => {
                return Err(CommandError::new(
                    ErrorCode(40415),
                    format!("BSON field '{stage}.{other}' is an unknown field."),
                ))
            }
        }
    }
    if all_users && !users.is_empty() {
        return Err(CommandError::new(
            ErrorCode::UnsupportedFormat,
            format!(
                "{stage} may not specify {{allUsers:true}} and {{users:[...]}} at the same time"
            ),
        ));
    }
    if all_users {
        return Ok(None);
    }
    if users.is_empty() {
        users.push(no_user_digest());
    }
    Ok(Some(users))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_listed_by_last_use_for_their_user() {
        let cache = LocalSessions::default();
        assert!(cache.list(None).is_empty());
        cache.touch([1; 16]).unwrap();
        cache.touch([2; 16]).unwrap();
        cache.touch([1; 16]).unwrap();
        let all = cache.list(None);
        assert_eq!(all.len(), 2);
        let first = all[0].get_document("_id").unwrap();
        match first.get("id") {
            Some(Bson::Binary(b)) => assert_eq!(b.bytes, vec![1; 16], "most recent first"),
            other => panic!("{other:?}"),
        }
        match first.get("uid") {
            Some(Bson::Binary(b)) => assert_eq!(b.bytes, no_user_digest().to_vec()),
            other => panic!("{other:?}"),
        }
        assert!(all[0].get_datetime("lastUse").is_ok());
        // Without authentication every session is the nameless user's.
        let own = parse_list_sessions("$listLocalSessions", &Bson::Document(doc! {})).unwrap();
        assert_eq!(cache.list(own.as_deref()).len(), 2);
        let other = parse_list_sessions(
            "$listLocalSessions",
            &Bson::Document(doc! {"users": [{"user": "u", "db": "admin"}]}),
        )
        .unwrap();
        assert!(cache.list(other.as_deref()).is_empty());
    }

    #[test]
    fn arguments_get_mongods_errors() {
        let code = |spec: Bson| {
            parse_list_sessions("$listLocalSessions", &spec)
                .unwrap_err()
                .code
                .0
        };
        assert_eq!(code(Bson::Int32(1)), 14);
        assert_eq!(code(Bson::Document(doc! {"bogus": 1})), 40415);
        assert_eq!(code(Bson::Document(doc! {"allUsers": 1})), 14);
        assert_eq!(
            code(Bson::Document(
                doc! {"allUsers": true, "users": [{"user": "u", "db": "d"}]}
            )),
            12
        );
        assert_eq!(
            parse_list_sessions(
                "$listLocalSessions",
                &Bson::Document(doc! {"allUsers": true})
            )
            .unwrap(),
            None
        );
    }
}
