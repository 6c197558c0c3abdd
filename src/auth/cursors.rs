//! Who opened each cursor, so that only that user may continue or kill it (mongod's
//! `isCoauthorizedWith` on `getMore` and `killCursors`).
//!
//! The table is the server's, not a connection's: a cursor opened on one connection may be
//! continued on another by the same user, as drivers with a connection pool do, and never by
//! another user. Every reply that carries a cursor (`cursor.id` other than 0) is recorded with
//! its namespace and the user that asked for it (none before authentication); the entry goes
//! when the cursor is exhausted or killed. With authorization enabled:
//!
//! - `getMore` on another user's cursor is 13 `cursor id <id> was not created by the
//!   authenticated user`; on a cursor the table does not know, 43 `cursor id <id> not found`
//!   (every cursor the server hands out passes through here, so an unknown id was never
//!   opened, is finished, or was dropped by [`MAX_ENTRIES`]; failing closed keeps an evicted
//!   entry from opening a cursor to everyone);
//! - `killCursors` of another user's cursor is 13 `not authorized to kill cursor on <ns>`,
//!   unless the user holds `killAnyCursor` on the cluster or the namespace.
//!
//! The same rules hold for the router's cursors on sharded collections and for the cursors
//! the shards hand out through it (which the shard, seeing only Sluice, cannot tell apart).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::authorize::may_kill_any_cursor;
use super::roles::Principal;
use super::{AuthError, UserName};
use crate::value::error_codes::ErrorCode;

/// Most cursors recorded at once; past it, entries idle longer than [`IDLE`] go first, then the
/// least recently used.
pub const MAX_ENTRIES: usize = 100_000;

/// How long an unused cursor lives on mongod and on the router by default.
pub const IDLE: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Entry {
    ns: String,
    user: Option<UserName>,
    last_used: Instant,
}

/// The owners of the open cursors.
#[derive(Debug, Default)]
pub struct CursorOwners {
    entries: Mutex<HashMap<i64, Entry>>,
}

/// The user a principal stands for (`None`: not authenticated).
fn user_of(principal: Option<&Principal>) -> Option<&UserName> {
    principal.map(|p| &p.user)
}

impl CursorOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cursors recorded.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no cursor is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records what a reply says of cursor `id` on `ns`: 0 is a finished cursor (forgotten),
    /// anything else is open and belongs to `principal`'s user (kept, or refreshed after a
    /// `getMore`).
    pub fn record(&self, principal: Option<&Principal>, id: i64, ns: &str) {
        let mut entries = self.lock();
        if id == 0 {
            return;
        }
        if let Some(e) = entries.get_mut(&id) {
            e.last_used = Instant::now();
            return;
        }
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.last_used.elapsed() < IDLE);
        }
        if entries.len() >= MAX_ENTRIES {
            let oldest = entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                entries.remove(&oldest);
            }
        }
        entries.insert(
            id,
            Entry {
                ns: ns.to_string(),
                user: user_of(principal).cloned(),
                last_used: Instant::now(),
            },
        );
    }

    /// Forgets cursors that are finished or killed.
    pub fn forget(&self, ids: impl IntoIterator<Item = i64>) {
        let mut entries = self.lock();
        for id in ids {
            entries.remove(&id);
        }
    }

    /// Whether `principal` may run `getMore` on cursor `id`.
    pub fn check_get_more(&self, principal: Option<&Principal>, id: i64) -> Result<(), AuthError> {
        let entries = self.lock();
        match entries.get(&id) {
            None => Err(AuthError::new(
                ErrorCode::CursorNotFound,
                format!("cursor id {id} not found"),
            )),
            Some(e) if e.user.as_ref() == user_of(principal) => Ok(()),
            Some(_) => Err(AuthError::new(
                ErrorCode::Unauthorized,
                format!("cursor id {id} was not created by the authenticated user"),
            )),
        }
    }

    /// Whether `principal` may kill the cursors `ids` (unknown ids are left to the server,
    /// which reports them in `cursorsNotFound`).
    pub fn check_kill(&self, principal: Option<&Principal>, ids: &[i64]) -> Result<(), AuthError> {
        let entries = self.lock();
        for id in ids {
            let Some(e) = entries.get(id) else { continue };
            if e.user.as_ref() == user_of(principal) {
                continue;
            }
            let (db, coll) = e.ns.split_once('.').unwrap_or((e.ns.as_str(), ""));
            if principal.is_some_and(|p| may_kill_any_cursor(&p.privileges, db, coll)) {
                continue;
            }
            return Err(AuthError::new(
                ErrorCode::Unauthorized,
                format!("not authorized to kill cursor on {}", e.ns),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::roles::RoleName;

    fn user(name: &str, role: &str, db: &str) -> Principal {
        Principal::from_builtin_roles(UserName::new(name, "admin"), vec![RoleName::new(role, db)])
            .expect("built-in role")
    }

    #[test]
    fn only_the_opening_user_continues_or_kills_a_cursor() {
        let owners = CursorOwners::default();
        let alice = user("alice", "readWrite", "test");
        let bob = user("bob", "readWrite", "test");
        let root = user("root", "root", "admin");
        owners.record(Some(&alice), 42, "test.c");
        assert!(owners.check_get_more(Some(&alice), 42).is_ok());
        let e = owners.check_get_more(Some(&bob), 42).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthorized);
        assert_eq!(
            e.message,
            "cursor id 42 was not created by the authenticated user"
        );
        // root holds killAnyCursor but still may not read another user's cursor.
        assert!(owners.check_get_more(Some(&root), 42).is_err());
        assert!(owners.check_get_more(None, 42).is_err());

        let e = owners.check_kill(Some(&bob), &[42]).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                ErrorCode::Unauthorized,
                "not authorized to kill cursor on test.c"
            )
        );
        assert!(owners.check_kill(Some(&alice), &[42, 7]).is_ok());
        assert!(owners.check_kill(Some(&root), &[42]).is_ok());
        // Unknown ids are the server's to report.
        assert!(owners.check_kill(Some(&bob), &[7]).is_ok());
        let e = owners.check_get_more(Some(&alice), 7).unwrap_err();
        assert_eq!(e.code, ErrorCode::CursorNotFound);

        // A cursor opened before authentication belongs to nobody, and stays so.
        owners.record(None, 43, "test.c");
        assert!(owners.check_get_more(None, 43).is_ok());
        assert!(owners.check_get_more(Some(&alice), 43).is_err());

        // Exhausted (id 0 in a reply) and killed cursors are forgotten.
        owners.record(Some(&alice), 0, "test.c");
        owners.forget([42, 43]);
        assert!(owners.is_empty());
    }

    #[test]
    fn the_table_is_bounded() {
        let owners = CursorOwners::default();
        for id in 1..=(MAX_ENTRIES as i64 + 10) {
            owners.record(None, id, "t.c");
        }
        assert_eq!(owners.len(), MAX_ENTRIES);
        // The oldest went first.
        assert!(owners.check_get_more(None, 1).is_err());
        assert!(owners.check_get_more(None, MAX_ENTRIES as i64 + 10).is_ok());
    }
}
