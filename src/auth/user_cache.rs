//! The users resolved for authentication, kept per user for one generation of the user set.
//!
//! Authenticating a user resolves its roles through the built-in roles and the role graph into
//! merged privileges, and gathers the `authenticationRestrictions` of the user and of every
//! custom role it reaches. The result depends only on the user set (users and roles), so it is
//! kept here, keyed by user and database, and handed out shared to every connection of that
//! user until the set changes. The holder of the user set numbers its versions (a generation
//! bumped on every change: a user or role command, a read of the config server, periodic or
//! asked for by `invalidateUserCache`, that found a change) and passes the current one to
//! every lookup; an entry made for another generation is never used: the whole cache is
//! dropped as soon as a lookup names a newer one. So a cached user is seen changed exactly
//! when an uncached one would be.
//!
//! What is not kept: a user that does not exist (looked up again at each use, as mongos does)
//! and a user whose roles do not resolve (an authentication failure, rare and logged).

use std::collections::HashMap;
use std::sync::Arc;

use bson::Bson;

use super::roles::{Principal, RoleName};
use super::UserName;

/// A user as authentication resolves it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedUser {
    /// The user, its direct roles and the privileges of their closure, shared by every
    /// connection authenticated as it.
    pub principal: Arc<Principal>,
    /// The `authenticationRestrictions` to meet: the user's own and those of each custom role
    /// it reaches (each array must be met).
    pub restrictions: Vec<Vec<Bson>>,
}

/// How often a lookup was answered from the cache, for tests and the benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Answered from an entry of the current generation.
    pub hits: u64,
    /// Resolved (no entry, or the set changed since).
    pub misses: u64,
}

/// The resolved users of one generation of the user set.
#[derive(Debug, Default)]
pub struct UserCache {
    generation: u64,
    entries: HashMap<UserName, Arc<ResolvedUser>>,
    counts: CacheCounts,
}

impl UserCache {
    /// An empty cache.
    pub fn new() -> UserCache {
        UserCache::default()
    }

    /// The user `name` at `generation`: the entry made at that generation, or what `resolve`
    /// makes of the user set now (kept when it is a user). `None`: no such user; `Err`: a role
    /// that does not exist. The caller holds the user set `resolve` reads, unchanged, for the
    /// whole call, and `generation` is that set's.
    pub fn get_or_resolve(
        &mut self,
        generation: u64,
        name: &UserName,
        resolve: impl FnOnce() -> Option<Result<Arc<ResolvedUser>, RoleName>>,
    ) -> Option<Result<Arc<ResolvedUser>, RoleName>> {
        if generation != self.generation {
            self.entries.clear();
            self.generation = generation;
        }
        if let Some(hit) = self.entries.get(name) {
            self.counts.hits += 1;
            return Some(Ok(Arc::clone(hit)));
        }
        self.counts.misses += 1;
        match resolve()? {
            Ok(user) => {
                self.entries.insert(name.clone(), Arc::clone(&user));
                Some(Ok(user))
            }
            Err(role) => Some(Err(role)),
        }
    }

    /// The hits and misses so far.
    pub fn counts(&self) -> CacheCounts {
        self.counts
    }

    /// How many users are held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no user is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::roles::Privileges;

    fn resolved(user: &str, role: &str) -> Arc<ResolvedUser> {
        let roles = vec![RoleName::new(role, "test")];
        Arc::new(ResolvedUser {
            principal: Arc::new(Principal {
                user: UserName::new(user, "admin"),
                privileges: Privileges::from_roles(&roles).expect("built-in role"),
                roles,
            }),
            restrictions: Vec::new(),
        })
    }

    /// Within a generation the first lookup resolves and the next ones share its result; a
    /// lookup at another generation resolves again and drops every entry of the old one.
    #[test]
    fn entries_live_for_one_generation() {
        let mut cache = UserCache::new();
        let alice = UserName::new("alice", "admin");
        let bob = UserName::new("bob", "admin");
        let first = cache
            .get_or_resolve(1, &alice, || Some(Ok(resolved("alice", "read"))))
            .expect("a user")
            .expect("resolved");
        let again = cache
            .get_or_resolve(1, &alice, || panic!("resolved again within a generation"))
            .expect("a user")
            .expect("resolved");
        assert!(Arc::ptr_eq(&first, &again));
        cache.get_or_resolve(1, &bob, || Some(Ok(resolved("bob", "read"))));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.counts(), CacheCounts { hits: 1, misses: 2 });

        let changed = cache
            .get_or_resolve(2, &alice, || Some(Ok(resolved("alice", "readWrite"))))
            .expect("a user")
            .expect("resolved");
        assert_eq!(
            changed.principal.roles,
            vec![RoleName::new("readWrite", "test")]
        );
        assert_eq!(cache.len(), 1, "bob's entry of generation 1 is gone");
        assert_eq!(cache.counts(), CacheCounts { hits: 1, misses: 3 });
    }

    /// A missing user and a role that does not resolve are not kept: the next lookup asks
    /// again.
    #[test]
    fn missing_users_and_failures_are_not_kept() {
        let mut cache = UserCache::new();
        let carol = UserName::new("carol", "admin");
        assert!(cache.get_or_resolve(0, &carol, || None).is_none());
        let missing = RoleName::new("gone", "test");
        assert_eq!(
            cache.get_or_resolve(0, &carol, || Some(Err(missing.clone()))),
            Some(Err(missing))
        );
        assert!(cache.is_empty());
        assert!(cache
            .get_or_resolve(0, &carol, || Some(Ok(resolved("carol", "read"))))
            .is_some_and(|r| r.is_ok()));
        assert_eq!(cache.counts(), CacheCounts { hits: 0, misses: 3 });
    }
}
