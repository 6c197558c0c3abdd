//! What a user may do: actions, resource patterns, privileges, and MongoDB's built-in roles.
//!
//! A privilege is a set of actions on a resource pattern; a role is a set of privileges (some
//! roles include others). Sluice resolves a user's roles once, at authentication, into a merged
//! [`Privileges`] and answers every later check from it. The role definitions are MongoDB's
//! (`builtin_roles.yml`, 8.x), action by action; the matching of a checked resource against
//! the privileges' patterns is mongod's `ResourcePatternSearchList`, whose two surprises matter:
//! `local` and `config` are not covered by "any normal database", and a database privilege never
//! covers that database's `system.*` collections.
//!
//! Custom roles are not defined here: `custom_roles` holds their documents and resolves a
//! user's roles through them, reading stored privileges with [`Privilege::from_document`].

use crate::auth::UserName;
use bson::{doc, Bson, Document};
use std::fmt;

macro_rules! actions {
    ($($variant:ident = $name:literal),* $(,)?) => {
        /// One action a privilege grants, by mongod's name (`action_type.idl`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(missing_docs)]
        pub enum Action { $($variant),* }

        impl Action {
            /// Every action Sluice knows.
            pub const ALL: &'static [Action] = &[$(Action::$variant),*];

            /// The action's name as mongod spells it (`connectionStatus`, `usersInfo`).
            pub fn name(self) -> &'static str {
                match self { $(Action::$variant => $name),* }
            }

            /// The action of a name.
            pub fn from_name(name: &str) -> Option<Action> {
                match name { $($name => Some(Action::$variant),)* _ => None }
            }
        }
    };
}

actions! {
    AddShard = "addShard",
    AdvanceClusterTime = "advanceClusterTime",
    AllCollectionStats = "allCollectionStats",
    Analyze = "analyze",
    AnalyzeShardKey = "analyzeShardKey",
    AppendOplogNote = "appendOplogNote",
    ApplicationMessage = "applicationMessage",
    ApplyOps = "applyOps",
    AuditConfigure = "auditConfigure",
    AuthSchemaUpgrade = "authSchemaUpgrade",
    BypassDocumentValidation = "bypassDocumentValidation",
    BypassWriteBlockingMode = "bypassWriteBlockingMode",
    ChangeCustomData = "changeCustomData",
    ChangeOwnCustomData = "changeOwnCustomData",
    ChangeOwnPassword = "changeOwnPassword",
    ChangePassword = "changePassword",
    ChangeStream = "changeStream",
    CheckMetadataConsistency = "checkMetadataConsistency",
    CleanupOrphaned = "cleanupOrphaned",
    CleanupStructuredEncryptionData = "cleanupStructuredEncryptionData",
    ClearJumboFlag = "clearJumboFlag",
    CollMod = "collMod",
    CollStats = "collStats",
    Compact = "compact",
    CompactStructuredEncryptionData = "compactStructuredEncryptionData",
    ConfigureQueryAnalyzer = "configureQueryAnalyzer",
    ConnPoolStats = "connPoolStats",
    ConnPoolSync = "connPoolSync",
    ConvertToCapped = "convertToCapped",
    CreateCollection = "createCollection",
    CreateIndex = "createIndex",
    CreateRole = "createRole",
    CreateSearchIndexes = "createSearchIndexes",
    CreateUser = "createUser",
    DbCheck = "dbCheck",
    DbHash = "dbHash",
    DbStats = "dbStats",
    DropCollection = "dropCollection",
    DropConnections = "dropConnections",
    DropDatabase = "dropDatabase",
    DropIndex = "dropIndex",
    DropRole = "dropRole",
    DropSearchIndex = "dropSearchIndex",
    DropUser = "dropUser",
    EnableProfiler = "enableProfiler",
    EnableSharding = "enableSharding",
    ExportCollection = "exportCollection",
    Find = "find",
    FlushRouterConfig = "flushRouterConfig",
    ForceUuid = "forceUUID",
    Fsync = "fsync",
    GetChangeStreamState = "getChangeStreamState",
    GetClusterParameter = "getClusterParameter",
    GetCmdLineOpts = "getCmdLineOpts",
    GetDatabaseVersion = "getDatabaseVersion",
    GetDefaultRwConcern = "getDefaultRWConcern",
    GetLog = "getLog",
    GetParameter = "getParameter",
    GetShardMap = "getShardMap",
    GetShardVersion = "getShardVersion",
    GrantRole = "grantRole",
    HostInfo = "hostInfo",
    ImportCollection = "importCollection",
    IndexStats = "indexStats",
    Inprog = "inprog",
    Insert = "insert",
    Internal = "internal",
    InvalidateUserCache = "invalidateUserCache",
    IssueDirectShardOperations = "issueDirectShardOperations",
    KillAnyCursor = "killAnyCursor",
    KillAnySession = "killAnySession",
    KillCursors = "killCursors",
    Killop = "killop",
    ListCachedAndActiveUsers = "listCachedAndActiveUsers",
    ListCollections = "listCollections",
    ListDatabases = "listDatabases",
    ListIndexes = "listIndexes",
    ListSampledQueries = "listSampledQueries",
    ListSearchIndexes = "listSearchIndexes",
    ListSessions = "listSessions",
    ListShards = "listShards",
    LogRotate = "logRotate",
    MoveChunk = "moveChunk",
    MoveCollection = "moveCollection",
    Netstat = "netstat",
    OidReset = "oidReset",
    OidcListKeys = "oidcListKeys",
    OidcRefreshKeys = "oidcRefreshKeys",
    OperationMetrics = "operationMetrics",
    PlanCacheIndexFilter = "planCacheIndexFilter",
    PlanCacheRead = "planCacheRead",
    PlanCacheWrite = "planCacheWrite",
    QuerySettings = "querySettings",
    QueryStatsRead = "queryStatsRead",
    QueryStatsReadTransformed = "queryStatsReadTransformed",
    ReIndex = "reIndex",
    RefineCollectionShardKey = "refineCollectionShardKey",
    Remove = "remove",
    RemoveShard = "removeShard",
    RenameCollectionSameDb = "renameCollectionSameDB",
    ReplSetConfigure = "replSetConfigure",
    ReplSetGetConfig = "replSetGetConfig",
    ReplSetGetStatus = "replSetGetStatus",
    ReplSetResizeOplog = "replSetResizeOplog",
    ReplSetStateChange = "replSetStateChange",
    ReshardCollection = "reshardCollection",
    Resync = "resync",
    RevokeRole = "revokeRole",
    RotateCertificates = "rotateCertificates",
    RunTenantMigration = "runTenantMigration",
    ServerStatus = "serverStatus",
    SetAuthenticationRestriction = "setAuthenticationRestriction",
    SetChangeStreamState = "setChangeStreamState",
    SetClusterParameter = "setClusterParameter",
    SetDefaultRwConcern = "setDefaultRWConcern",
    SetFeatureCompatibilityVersion = "setFeatureCompatibilityVersion",
    SetParameter = "setParameter",
    SetUserWriteBlockMode = "setUserWriteBlockMode",
    ShardedDataDistribution = "shardedDataDistribution",
    ShardingState = "shardingState",
    Shutdown = "shutdown",
    SplitChunk = "splitChunk",
    SplitVector = "splitVector",
    StorageDetails = "storageDetails",
    Top = "top",
    Touch = "touch",
    TrafficRecord = "trafficRecord",
    TransitionFromDedicatedConfigServer = "transitionFromDedicatedConfigServer",
    TransitionToDedicatedConfigServer = "transitionToDedicatedConfigServer",
    Unlock = "unlock",
    Update = "update",
    UpdateSearchIndex = "updateSearchIndex",
    UseTenant = "useTenant",
    UseUuid = "useUUID",
    Validate = "validate",
    ViewRole = "viewRole",
    ViewUser = "viewUser",
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

const WORDS: usize = 3;

/// A set of actions, as a bit set (checked on every command, so it must be cheap).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ActionSet([u64; WORDS]);

impl ActionSet {
    /// No action.
    pub const fn empty() -> ActionSet {
        ActionSet([0; WORDS])
    }

    /// Every action (the `__system` role's grant).
    pub fn all() -> ActionSet {
        ActionSet::of(Action::ALL)
    }

    /// The set of the given actions.
    pub fn of(actions: &[Action]) -> ActionSet {
        let mut s = ActionSet::empty();
        for a in actions {
            s.insert(*a);
        }
        s
    }

    /// Adds one action.
    pub fn insert(&mut self, a: Action) {
        let i = a as usize;
        self.0[i / 64] |= 1 << (i % 64);
    }

    /// Whether the action is in the set.
    pub fn contains(&self, a: Action) -> bool {
        let i = a as usize;
        self.0[i / 64] & (1 << (i % 64)) != 0
    }

    /// Whether every action of `other` is in the set.
    pub fn contains_all(&self, other: &ActionSet) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & b == *b)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The union of two sets.
    pub fn union(&self, other: &ActionSet) -> ActionSet {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
        out
    }

    /// The actions of this set that are not in `other`.
    pub fn minus(&self, other: &ActionSet) -> ActionSet {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(&other.0) {
            *a &= !b;
        }
        out
    }

    /// The actions in the set, in name order.
    pub fn actions(&self) -> Vec<Action> {
        let mut v: Vec<Action> = Action::ALL
            .iter()
            .copied()
            .filter(|a| self.contains(*a))
            .collect();
        v.sort_by_key(|a| a.name());
        v
    }
}

impl fmt::Debug for ActionSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.actions().iter().map(|a| a.name()))
            .finish()
    }
}

/// What a privilege applies to (mongod's `ResourcePattern`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourcePattern {
    /// Every resource, `{anyResource: true}`.
    AnyResource,
    /// The cluster, `{cluster: true}`.
    Cluster,
    /// Every database and normal collection except in `local` and `config`,
    /// `{db: "", collection: ""}`.
    AnyNormal,
    /// One database and its normal collections, `{db: "d", collection: ""}`.
    Database(String),
    /// A collection name in any database, `{db: "", collection: "c"}`.
    Collection(String),
    /// One namespace, `{db: "d", collection: "c"}`.
    Namespace(String, String),
    /// Every `system.buckets.*` collection, `{db: "", system_buckets: ""}`.
    AnySystemBuckets,
    /// Every `system.buckets.*` collection of one database.
    SystemBucketsInDatabase(String),
    /// `system.buckets.<c>` in any database.
    SystemBucketsInAnyDatabase(String),
    /// `<d>.system.buckets.<c>`.
    SystemBuckets(String, String),
}

impl ResourcePattern {
    /// The pattern as `connectionStatus` and `usersInfo` print it.
    pub fn to_document(&self) -> Document {
        match self {
            ResourcePattern::AnyResource => doc! {"anyResource": true},
            ResourcePattern::Cluster => doc! {"cluster": true},
            ResourcePattern::AnyNormal => doc! {"db": "", "collection": ""},
            ResourcePattern::Database(d) => doc! {"db": d, "collection": ""},
            ResourcePattern::Collection(c) => doc! {"db": "", "collection": c},
            ResourcePattern::Namespace(d, c) => doc! {"db": d, "collection": c},
            ResourcePattern::AnySystemBuckets => doc! {"db": "", "system_buckets": ""},
            ResourcePattern::SystemBucketsInDatabase(d) => doc! {"db": d, "system_buckets": ""},
            ResourcePattern::SystemBucketsInAnyDatabase(c) => {
                doc! {"db": "", "system_buckets": c}
            }
            ResourcePattern::SystemBuckets(d, c) => doc! {"db": d, "system_buckets": c},
        }
    }

    /// Reads a pattern in the form [`ResourcePattern::to_document`] writes (what the config
    /// server's `usersInfo` returns for custom roles).
    pub fn from_document(d: &Document) -> Result<ResourcePattern, String> {
        if matches!(d.get_bool("anyResource"), Ok(true)) {
            return Ok(ResourcePattern::AnyResource);
        }
        if matches!(d.get_bool("cluster"), Ok(true)) {
            return Ok(ResourcePattern::Cluster);
        }
        let db = d
            .get_str("db")
            .map_err(|_| format!("resource {d} has no string field 'db'"))?;
        if let Ok(b) = d.get_str("system_buckets") {
            return Ok(match (db.is_empty(), b.is_empty()) {
                (true, true) => ResourcePattern::AnySystemBuckets,
                (false, true) => ResourcePattern::SystemBucketsInDatabase(db.into()),
                (true, false) => ResourcePattern::SystemBucketsInAnyDatabase(b.into()),
                (false, false) => ResourcePattern::SystemBuckets(db.into(), b.into()),
            });
        }
        let coll = d
            .get_str("collection")
            .map_err(|_| format!("resource {d} has no string field 'collection'"))?;
        Ok(match (db.is_empty(), coll.is_empty()) {
            (true, true) => ResourcePattern::AnyNormal,
            (false, true) => ResourcePattern::Database(db.into()),
            (true, false) => ResourcePattern::Collection(coll.into()),
            (false, false) => ResourcePattern::Namespace(db.into(), coll.into()),
        })
    }

    /// Whether a privilege on this pattern applies to `target` (mongod's search list).
    pub fn matches(&self, target: &Resource<'_>) -> bool {
        match (self, target) {
            (ResourcePattern::AnyResource, _) => true,
            (_, Resource::AnyResource) => false,
            (ResourcePattern::AnyNormal, Resource::AnyNormal) => true,
            (_, Resource::AnyNormal) => false,
            (ResourcePattern::Cluster, Resource::Cluster) => true,
            (_, Resource::Cluster) | (ResourcePattern::Cluster, _) => false,
            (ResourcePattern::AnyNormal, Resource::Database(d)) => !is_special_db(d),
            (ResourcePattern::AnyNormal, Resource::Namespace(d, c)) => {
                is_normal_collection(d, c) && !is_special_db(d)
            }
            (ResourcePattern::Database(p), Resource::Database(d)) => p == d,
            (ResourcePattern::Database(p), Resource::Namespace(d, c)) => {
                p == d && is_normal_collection(d, c)
            }
            (ResourcePattern::Collection(p), Resource::Namespace(_, c)) => p == c,
            (ResourcePattern::Namespace(pd, pc), Resource::Namespace(d, c)) => pd == d && pc == c,
            (ResourcePattern::AnySystemBuckets, Resource::Namespace(_, c)) => bucket(c).is_some(),
            (ResourcePattern::SystemBucketsInDatabase(pd), Resource::Namespace(d, c)) => {
                pd == d && bucket(c).is_some()
            }
            (ResourcePattern::SystemBucketsInAnyDatabase(pc), Resource::Namespace(_, c)) => {
                bucket(c) == Some(pc.as_str())
            }
            (ResourcePattern::SystemBuckets(pd, pc), Resource::Namespace(d, c)) => {
                pd == d && bucket(c) == Some(pc.as_str())
            }
            _ => false,
        }
    }
}

/// `local` and `config` hold the server's own collections: "any normal database" skips them.
fn is_special_db(db: &str) -> bool {
    db == "local" || db == "config"
}

/// mongod's `isNormalCollection`: not `system.*`, and not `local.replset.*`.
pub fn is_normal_collection(db: &str, coll: &str) -> bool {
    !(coll.starts_with("system.") || (db == "local" && coll.starts_with("replset.")))
}

/// The bucket name of `system.buckets.<name>` (non-empty), if the collection is one.
fn bucket(coll: &str) -> Option<&str> {
    coll.strip_prefix("system.buckets.")
        .filter(|rest| !rest.is_empty())
}

/// A resource a command acts on (the target of a check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource<'a> {
    /// Anything at all (only an `anyResource` privilege covers it).
    AnyResource,
    /// Every normal resource (what `updateUser` needs `revokeRole` on to replace roles).
    AnyNormal,
    /// The cluster.
    Cluster,
    /// A database.
    Database(&'a str),
    /// A collection: database and collection name.
    Namespace(&'a str, &'a str),
}

/// Actions on a resource pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Privilege {
    /// Where.
    pub resource: ResourcePattern,
    /// What.
    pub actions: ActionSet,
}

impl Privilege {
    /// A privilege.
    pub fn new(resource: ResourcePattern, actions: &[Action]) -> Privilege {
        Privilege {
            resource,
            actions: ActionSet::of(actions),
        }
    }

    /// `{resource: {...}, actions: [...]}`, as `connectionStatus` and `usersInfo` print it.
    pub fn to_document(&self) -> Document {
        let actions: Vec<Bson> = self
            .actions
            .actions()
            .into_iter()
            .map(|a| Bson::String(a.name().to_string()))
            .collect();
        doc! {"resource": self.resource.to_document(), "actions": actions}
    }

    /// Reads `{resource, actions}` (the config server's `inheritedPrivileges`). Actions this
    /// version does not know are skipped: they cannot be needed by a command it runs.
    pub fn from_document(d: &Document) -> Result<Privilege, String> {
        let resource = ResourcePattern::from_document(
            d.get_document("resource")
                .map_err(|_| format!("privilege {d} has no document field 'resource'"))?,
        )?;
        let list = d
            .get_array("actions")
            .map_err(|_| format!("privilege {d} has no array field 'actions'"))?;
        let mut actions = ActionSet::empty();
        for a in list {
            if let Some(action) = a.as_str().and_then(Action::from_name) {
                actions.insert(action);
            }
        }
        Ok(Privilege { resource, actions })
    }
}

/// A role: a name in a database (`readWrite@test`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoleName {
    /// The role's name.
    pub role: String,
    /// The database it is defined on (for a built-in role, the database it applies to).
    pub db: String,
}

impl RoleName {
    /// A role name.
    pub fn new(role: impl Into<String>, db: impl Into<String>) -> RoleName {
        RoleName {
            role: role.into(),
            db: db.into(),
        }
    }

    /// `{role, db}`, as user documents and `connectionStatus` hold it.
    pub fn to_document(&self) -> Document {
        doc! {"role": &self.role, "db": &self.db}
    }

    /// Reads a role the way `createUser`'s `roles` array gives it: a string (that role on
    /// `default_db`) or `{role, db}`.
    pub fn from_bson(v: &Bson, default_db: &str) -> Result<RoleName, String> {
        match v {
            Bson::String(s) => Ok(RoleName::new(s.as_str(), default_db)),
            Bson::Document(d) => {
                let role = d
                    .get_str("role")
                    .map_err(|_| "Role names must have a string field 'role'".to_string())?;
                let db = d
                    .get_str("db")
                    .map_err(|_| "Role names must have a string field 'db'".to_string())?;
                Ok(RoleName::new(role, db))
            }
            _ => Err(
                "Role names must be either strings or objects with 'role' and 'db' fields"
                    .to_string(),
            ),
        }
    }
}

impl fmt::Display for RoleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.role, self.db)
    }
}

use Action as A;

const READ: &[Action] = &[
    A::ChangeStream,
    A::CollStats,
    A::DbHash,
    A::DbStats,
    A::Find,
    A::KillCursors,
    A::ListCollections,
    A::ListIndexes,
    A::ListSearchIndexes,
    A::PlanCacheRead,
];

const READ_WRITE_EXTRA: &[Action] = &[
    A::CleanupStructuredEncryptionData,
    A::CompactStructuredEncryptionData,
    A::ConvertToCapped,
    A::CreateCollection,
    A::CreateIndex,
    A::CreateSearchIndexes,
    A::DropCollection,
    A::DropIndex,
    A::DropSearchIndex,
    A::Insert,
    A::Remove,
    A::RenameCollectionSameDb,
    A::Update,
    A::UpdateSearchIndex,
];

const USER_ADMIN: &[Action] = &[
    A::ChangeCustomData,
    A::ChangePassword,
    A::CreateUser,
    A::CreateRole,
    A::DropUser,
    A::DropRole,
    A::GrantRole,
    A::RevokeRole,
    A::SetAuthenticationRestriction,
    A::ViewUser,
    A::ViewRole,
];

const DB_ADMIN: &[Action] = &[
    A::Analyze,
    A::BypassDocumentValidation,
    A::CollMod,
    A::CollStats,
    A::Compact,
    A::ConvertToCapped,
    A::CreateCollection,
    A::DbStats,
    A::DropCollection,
    A::DropDatabase,
    A::DropIndex,
    A::DropSearchIndex,
    A::CreateIndex,
    A::CreateSearchIndexes,
    A::EnableProfiler,
    A::ListCollections,
    A::ListIndexes,
    A::ListSearchIndexes,
    A::UpdateSearchIndex,
    A::PlanCacheIndexFilter,
    A::PlanCacheRead,
    A::PlanCacheWrite,
    A::ReIndex,
    A::RenameCollectionSameDb,
    A::StorageDetails,
    A::Validate,
    // Granted outside multitenancy only; Sluice is never multitenant.
    A::ConfigureQueryAnalyzer,
];

const PROFILE_EXTRA: &[Action] = &[A::ConvertToCapped, A::CreateCollection, A::DropCollection];

const CLUSTER_MONITOR_CLUSTER: &[Action] = &[
    A::ConnPoolStats,
    A::GetCmdLineOpts,
    A::GetDefaultRwConcern,
    A::GetLog,
    A::GetParameter,
    A::GetShardMap,
    A::HostInfo,
    A::ListDatabases,
    A::ListSampledQueries,
    A::ListSessions,
    A::ListShards,
    A::Netstat,
    A::OperationMetrics,
    A::ReplSetGetConfig,
    A::ReplSetGetStatus,
    A::ServerStatus,
    A::Top,
    A::UseUuid,
    A::Inprog,
    A::ShardingState,
    A::AllCollectionStats,
    A::ShardedDataDistribution,
];

const CLUSTER_MONITOR_DB: &[Action] = &[
    A::CollStats,
    A::DbStats,
    A::GetDatabaseVersion,
    A::GetShardVersion,
    A::IndexStats,
];

const HOST_MANAGER_CLUSTER: &[Action] = &[
    A::ApplicationMessage,
    A::AuditConfigure,
    A::ConnPoolSync,
    A::DropConnections,
    A::LogRotate,
    A::OidReset,
    A::SetParameter,
    A::Shutdown,
    A::Touch,
    A::Unlock,
    A::FlushRouterConfig,
    A::Fsync,
    A::InvalidateUserCache,
    A::KillAnyCursor,
    A::KillAnySession,
    A::Killop,
    A::ReplSetResizeOplog,
    A::Resync,
    A::TrafficRecord,
    A::RotateCertificates,
    A::OidcListKeys,
    A::OidcRefreshKeys,
];

const CLUSTER_MANAGER_CLUSTER: &[Action] = &[
    A::AppendOplogNote,
    A::ApplicationMessage,
    A::ReplSetConfigure,
    A::ReplSetGetConfig,
    A::ReplSetGetStatus,
    A::ReplSetStateChange,
    A::Resync,
    A::AddShard,
    A::RemoveShard,
    A::ListSessions,
    A::ListShards,
    A::FlushRouterConfig,
    A::CleanupOrphaned,
    A::GetDefaultRwConcern,
    A::RunTenantMigration,
    A::SetDefaultRwConcern,
    A::SetFeatureCompatibilityVersion,
    A::SetClusterParameter,
    A::GetClusterParameter,
    A::SetChangeStreamState,
    A::GetChangeStreamState,
    A::QuerySettings,
    A::QueryStatsRead,
    A::QueryStatsReadTransformed,
    A::CheckMetadataConsistency,
    A::TransitionFromDedicatedConfigServer,
    A::TransitionToDedicatedConfigServer,
];

const CLUSTER_MANAGER_DB: &[Action] = &[
    A::AnalyzeShardKey,
    A::ConfigureQueryAnalyzer,
    A::ClearJumboFlag,
    A::SplitChunk,
    A::MoveChunk,
    A::MoveCollection,
    A::EnableSharding,
    A::SplitVector,
    A::RefineCollectionShardKey,
    A::ReshardCollection,
];

const WRITES: &[Action] = &[A::Insert, A::Update, A::Remove];

const RESTORE_WRITE: &[Action] = &[
    A::BypassDocumentValidation,
    A::CollMod,
    A::ConvertToCapped,
    A::CreateCollection,
    A::CreateIndex,
    A::CreateSearchIndexes,
    A::DropCollection,
    A::Insert,
    A::UpdateSearchIndex,
];

/// The names of MongoDB's built-in roles, with whether each exists only on `admin`.
pub const BUILTIN_ROLES: &[(&str, bool)] = &[
    ("read", false),
    ("readWrite", false),
    ("userAdmin", false),
    ("dbAdmin", false),
    ("dbOwner", false),
    ("enableSharding", false),
    ("readAnyDatabase", true),
    ("readWriteAnyDatabase", true),
    ("userAdminAnyDatabase", true),
    ("dbAdminAnyDatabase", true),
    ("clusterMonitor", true),
    ("hostManager", true),
    ("clusterManager", true),
    ("clusterAdmin", true),
    ("__queryableBackup", true),
    ("backup", true),
    ("restore", true),
    ("root", true),
    ("directShardOperations", true),
    ("__system", true),
];

/// Whether `role` is a built-in role: a known name on a valid database (`$external` has
/// none), and admin-only roles only on `admin` (`root@test` does not exist).
pub fn is_builtin_role(role: &RoleName) -> bool {
    if role.db.is_empty() || role.db == super::EXTERNAL_DB {
        return false;
    }
    BUILTIN_ROLES
        .iter()
        .any(|(name, admin_only)| *name == role.role && (!admin_only || role.db == "admin"))
}

fn cat(parts: &[&[Action]]) -> Vec<Action> {
    parts.iter().flat_map(|p| p.iter().copied()).collect()
}

/// Adds the privileges of the built-in role `name` on `db` (already checked to exist).
fn add_builtin(name: &str, db: &str, out: &mut Vec<Privilege>) {
    use ResourcePattern as P;
    let read_write = cat(&[READ, READ_WRITE_EXTRA]);
    let mut p = |resource: ResourcePattern, actions: &[Action]| {
        out.push(Privilege::new(resource, actions));
    };
    let d = || P::Database(db.to_string());
    let ns = |dbn: &str, c: &str| P::Namespace(dbn.to_string(), c.to_string());
    let coll = |c: &str| P::Collection(c.to_string());
    match name {
        "read" => {
            p(d(), READ);
            p(ns(db, "system.js"), READ);
        }
        "readWrite" => {
            p(d(), &read_write);
            p(ns(db, "system.js"), &read_write);
        }
        "userAdmin" => p(d(), USER_ADMIN),
        "dbAdmin" => {
            p(d(), DB_ADMIN);
            p(ns(db, "system.profile"), &cat(&[READ, PROFILE_EXTRA]));
        }
        "dbOwner" => {
            for r in ["readWrite", "dbAdmin", "userAdmin"] {
                add_builtin(r, db, out);
            }
        }
        "enableSharding" => p(
            P::AnyNormal,
            &[
                A::AnalyzeShardKey,
                A::EnableSharding,
                A::MoveCollection,
                A::RefineCollectionShardKey,
                A::ReshardCollection,
            ],
        ),
        "readAnyDatabase" => {
            p(P::AnyNormal, READ);
            p(P::Cluster, &[A::ListDatabases]);
            p(coll("system.js"), READ);
            p(P::AnySystemBuckets, READ);
        }
        "readWriteAnyDatabase" => {
            add_builtin("readAnyDatabase", db, out);
            out.push(Privilege::new(P::AnyNormal, &read_write));
            out.push(Privilege::new(coll("system.js"), &read_write));
            out.push(Privilege::new(P::AnySystemBuckets, &read_write));
        }
        "userAdminAnyDatabase" => {
            let read_and_index = cat(&[
                READ,
                &[
                    A::CreateIndex,
                    A::CreateSearchIndexes,
                    A::DropIndex,
                    A::DropSearchIndex,
                ],
            ]);
            p(
                P::AnyNormal,
                &cat(&[USER_ADMIN, &[A::ListCachedAndActiveUsers]]),
            );
            p(P::Database("local".into()), USER_ADMIN);
            p(P::Database("config".into()), USER_ADMIN);
            p(
                P::Cluster,
                &[
                    A::ListDatabases,
                    A::AuthSchemaUpgrade,
                    A::InvalidateUserCache,
                    A::ViewUser,
                ],
            );
            p(ns("admin", "system.users"), &read_and_index);
            p(ns("admin", "system.roles"), &read_and_index);
            p(coll("system.users"), READ);
            p(ns("admin", "system.version"), READ);
            p(ns("admin", "system.backup_users"), READ);
        }
        "dbAdminAnyDatabase" => {
            p(P::Cluster, &[A::ListDatabases, A::ApplyOps]);
            p(P::AnyNormal, DB_ADMIN);
            p(coll("system.profile"), &cat(&[READ, PROFILE_EXTRA]));
            p(P::AnySystemBuckets, DB_ADMIN);
        }
        "clusterMonitor" => {
            add_builtin("read", "config", out);
            add_builtin("read", "local", out);
            out.push(Privilege::new(P::Cluster, CLUSTER_MONITOR_CLUSTER));
            out.push(Privilege::new(P::AnyNormal, CLUSTER_MONITOR_DB));
            out.push(Privilege::new(
                P::Database("config".into()),
                CLUSTER_MONITOR_DB,
            ));
            out.push(Privilege::new(
                ns("config", "system.sessions"),
                CLUSTER_MONITOR_DB,
            ));
            out.push(Privilege::new(
                P::Database("local".into()),
                CLUSTER_MONITOR_DB,
            ));
            for c in ["system.replset", "replset.election", "replset.minvalid"] {
                out.push(Privilege::new(ns("local", c), &[A::Find]));
            }
            out.push(Privilege::new(coll("system.profile"), &[A::Find]));
        }
        "hostManager" => {
            p(P::Cluster, HOST_MANAGER_CLUSTER);
            p(P::AnyNormal, &[A::KillCursors]);
        }
        "clusterManager" => {
            add_builtin("read", "config", out);
            let mut p = |resource: ResourcePattern, actions: &[Action]| {
                out.push(Privilege::new(resource, actions));
            };
            p(P::Cluster, CLUSTER_MANAGER_CLUSTER);
            p(P::AnyNormal, CLUSTER_MANAGER_DB);
            p(P::AnySystemBuckets, CLUSTER_MANAGER_DB);
            p(P::Database("config".into()), CLUSTER_MANAGER_DB);
            p(P::Database("local".into()), CLUSTER_MANAGER_DB);
            p(ns("local", "system.replset"), READ);
            p(P::AnyResource, &[A::DbCheck]);
            p(ns("local", "system.healthlog"), READ);
            p(P::Database("config".into()), WRITES);
            p(P::Database("local".into()), WRITES);
            p(ns("local", "replset.election"), WRITES);
            p(ns("local", "replset.minvalid"), WRITES);
        }
        "clusterAdmin" => {
            for r in ["clusterMonitor", "hostManager", "clusterManager"] {
                add_builtin(r, db, out);
            }
            out.push(Privilege::new(P::AnyNormal, &[A::DropDatabase]));
            out.push(Privilege::new(
                P::AnyResource,
                &[A::ImportCollection, A::ExportCollection],
            ));
        }
        "__queryableBackup" => {
            p(
                P::AnyResource,
                &[
                    A::CollStats,
                    A::ListCollections,
                    A::ListIndexes,
                    A::ListSearchIndexes,
                ],
            );
            p(P::AnyNormal, &[A::Find]);
            p(P::AnySystemBuckets, &[A::Find]);
            p(P::Cluster, &[A::GetParameter, A::ListDatabases, A::UseUuid]);
            p(P::Database("config".into()), &[A::Find]);
            p(P::Database("local".into()), &[A::Find]);
            p(ns("local", "replset.election"), &[A::Find]);
            p(ns("local", "replset.minvalid"), &[A::Find]);
            p(coll("system.js"), &[A::Find]);
            p(coll("system.users"), &[A::Find]);
            p(coll("system.profile"), &[A::Find]);
            p(ns("admin", "system.backup_users"), &[A::Find]);
            p(ns("admin", "system.roles"), &[A::Find]);
            p(ns("admin", "system.version"), &[A::Find]);
            p(ns("config", "settings"), &[A::Find]);
        }
        "backup" => {
            add_builtin("__queryableBackup", db, out);
            out.push(Privilege::new(
                P::Cluster,
                &[
                    A::AppendOplogNote,
                    A::ServerStatus,
                    A::SetUserWriteBlockMode,
                ],
            ));
            out.push(Privilege::new(
                ns("config", "settings"),
                &[A::Insert, A::Update],
            ));
        }
        "restore" => {
            p(
                P::Cluster,
                &[
                    A::GetParameter,
                    A::ForceUuid,
                    A::UseUuid,
                    A::BypassWriteBlockingMode,
                    A::SetUserWriteBlockMode,
                    A::ApplyOps,
                ],
            );
            p(P::Database("local".into()), RESTORE_WRITE);
            p(P::Database("config".into()), RESTORE_WRITE);
            p(P::AnySystemBuckets, RESTORE_WRITE);
            for c in ["system.replset", "replset.election", "replset.minvalid"] {
                p(ns("local", c), RESTORE_WRITE);
            }
            p(P::AnyResource, &[A::ListCollections]);
            p(P::AnyNormal, &cat(&[RESTORE_WRITE, USER_ADMIN]));
            p(coll("system.js"), RESTORE_WRITE);
            p(ns("admin", "tempusers"), &[A::Find]);
            p(ns("admin", "temproles"), &[A::Find]);
            p(ns("admin", "system.backup_users"), RESTORE_WRITE);
            p(
                ns("admin", "system.version"),
                &cat(&[RESTORE_WRITE, &[A::Find]]),
            );
            p(
                coll("system.users"),
                &cat(&[RESTORE_WRITE, &[A::Find, A::Update, A::Remove]]),
            );
            p(ns("admin", "system.roles"), &[A::CreateIndex]);
        }
        "root" => {
            for r in [
                "clusterAdmin",
                "userAdminAnyDatabase",
                "dbAdminAnyDatabase",
                "readWriteAnyDatabase",
                "backup",
                "restore",
                "directShardOperations",
            ] {
                add_builtin(r, db, out);
            }
            out.push(Privilege::new(P::AnyResource, &[A::Validate]));
            out.push(Privilege::new(P::Cluster, &[A::UseTenant]));
            out.push(Privilege::new(
                ns("config", "system.preimages"),
                &[A::Find, A::Remove],
            ));
            out.push(Privilege::new(
                ns("config", "system.change_collection"),
                &[A::Find, A::Insert, A::Remove, A::Update],
            ));
        }
        "directShardOperations" => p(P::Cluster, &[A::IssueDirectShardOperations]),
        "__system" => p(P::AnyResource, &ActionSet::all().actions()),
        _ => {}
    }
}

/// The privileges of a built-in role, or `None` when `role` is not one.
pub fn builtin_role_privileges(role: &RoleName) -> Option<Vec<Privilege>> {
    if !is_builtin_role(role) {
        return None;
    }
    let mut out = Vec::new();
    add_builtin(&role.role, &role.db, &mut out);
    Some(out)
}

/// A user's privileges, merged per resource pattern: what every check reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Privileges {
    list: Vec<Privilege>,
}

impl Privileges {
    /// No privilege at all (an authenticated user with `roles: []`).
    pub fn none() -> Privileges {
        Privileges::default()
    }

    /// Every action on every resource: `__system`.
    pub fn internal() -> Privileges {
        let mut p = Privileges::none();
        p.add(Privilege {
            resource: ResourcePattern::AnyResource,
            actions: ActionSet::all(),
        });
        p
    }

    /// The privileges of built-in roles. An unknown role is returned as the error (mongod's
    /// `RoleNotFound` when granting; a user document naming one is refused at load).
    pub fn from_roles(roles: &[RoleName]) -> Result<Privileges, RoleName> {
        let mut p = Privileges::none();
        for role in roles {
            match builtin_role_privileges(role) {
                Some(list) => list.into_iter().for_each(|x| p.add(x)),
                None => return Err(role.clone()),
            }
        }
        Ok(p)
    }

    /// Adds a privilege, merging its actions into an existing one on the same pattern.
    pub fn add(&mut self, privilege: Privilege) {
        if privilege.actions.is_empty() {
            return;
        }
        match self
            .list
            .iter_mut()
            .find(|p| p.resource == privilege.resource)
        {
            Some(existing) => existing.actions = existing.actions.union(&privilege.actions),
            None => self.list.push(privilege),
        }
    }

    /// The merged privileges, one per pattern.
    pub fn iter(&self) -> impl Iterator<Item = &Privilege> {
        self.list.iter()
    }

    /// The actions granted on `target`: the union over every pattern that matches it.
    pub fn actions_on(&self, target: &Resource<'_>) -> ActionSet {
        self.list
            .iter()
            .filter(|p| p.resource.matches(target))
            .fold(ActionSet::empty(), |acc, p| acc.union(&p.actions))
    }

    /// Whether every one of `actions` is granted on `target`.
    pub fn is_authorized(&self, target: &Resource<'_>, actions: &[Action]) -> bool {
        self.is_authorized_for(target, &ActionSet::of(actions))
    }

    /// [`Privileges::is_authorized`] for a set of actions.
    pub fn is_authorized_for(&self, target: &Resource<'_>, actions: &ActionSet) -> bool {
        self.actions_on(target).contains_all(actions)
    }

    /// Whether any action is granted on the namespace (the filter of
    /// `listCollections {authorizedCollections: true, nameOnly: true}`).
    pub fn has_any_action_on_namespace(&self, db: &str, coll: &str) -> bool {
        !self.actions_on(&Resource::Namespace(db, coll)).is_empty()
    }

    /// mongod's `isAuthorizedForAnyActionOnAnyResourceInDB`: the filter of `listDatabases`
    /// for a user who may not list them all. Any privilege on the whole database, on any
    /// resource, on any normal resource, on a namespace of it, or on a collection name in any
    /// database counts.
    pub fn has_any_privilege_in_db(&self, db: &str) -> bool {
        self.list.iter().any(|p| match &p.resource {
            ResourcePattern::AnyResource
            | ResourcePattern::AnyNormal
            | ResourcePattern::Collection(_)
            | ResourcePattern::AnySystemBuckets
            | ResourcePattern::SystemBucketsInAnyDatabase(_) => true,
            ResourcePattern::Database(d)
            | ResourcePattern::Namespace(d, _)
            | ResourcePattern::SystemBucketsInDatabase(d)
            | ResourcePattern::SystemBuckets(d, _) => d == db,
            ResourcePattern::Cluster => false,
        })
    }

    /// The privileges as `connectionStatus {showPrivileges: true}` lists them.
    pub fn to_documents(&self) -> Vec<Bson> {
        let mut list: Vec<&Privilege> = self.list.iter().collect();
        list.sort_by(|a, b| a.resource.cmp(&b.resource));
        list.into_iter()
            .map(|p| Bson::Document(p.to_document()))
            .collect()
    }
}

/// An authenticated user with what it may do: what the connection keeps after a successful
/// authentication and every authorization check reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Who.
    pub user: UserName,
    /// The roles granted to the user directly (what `connectionStatus` lists).
    pub roles: Vec<RoleName>,
    /// Everything the roles grant, merged.
    pub privileges: Privileges,
}

impl Principal {
    /// A user of built-in roles; an unknown role is the error.
    pub fn from_builtin_roles(user: UserName, roles: Vec<RoleName>) -> Result<Principal, RoleName> {
        let privileges = Privileges::from_roles(&roles)?;
        Ok(Principal {
            user,
            roles,
            privileges,
        })
    }

    /// `__system@local`: every action on every resource.
    pub fn internal() -> Principal {
        Principal {
            user: UserName::internal(),
            roles: vec![RoleName::new("__system", "admin")],
            privileges: Privileges::internal(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn privs(roles: &[(&str, &str)]) -> Privileges {
        let roles: Vec<RoleName> = roles.iter().map(|(r, d)| RoleName::new(*r, *d)).collect();
        Privileges::from_roles(&roles).unwrap()
    }

    #[test]
    fn action_names_are_unique_and_fit_the_bitset() {
        assert!(Action::ALL.len() <= WORDS * 64);
        let mut names: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Action::ALL.len());
        for a in Action::ALL {
            assert_eq!(Action::from_name(a.name()), Some(*a));
        }
        assert_eq!(ActionSet::all().actions().len(), Action::ALL.len());
    }

    #[test]
    fn builtin_roles_exist_where_mongod_defines_them() {
        assert!(is_builtin_role(&RoleName::new("read", "test")));
        assert!(is_builtin_role(&RoleName::new("read", "admin")));
        assert!(is_builtin_role(&RoleName::new("root", "admin")));
        assert!(!is_builtin_role(&RoleName::new("root", "test")));
        assert!(!is_builtin_role(&RoleName::new("read", "$external")));
        assert!(!is_builtin_role(&RoleName::new("nosuchrole", "admin")));
        assert!(!is_builtin_role(&RoleName::new("Read", "test")));
        assert_eq!(
            Privileges::from_roles(&[RoleName::new("root", "test")]).unwrap_err(),
            RoleName::new("root", "test")
        );
    }

    #[test]
    fn search_list_rules() {
        let any_normal = ResourcePattern::AnyNormal;
        assert!(any_normal.matches(&Resource::Namespace("test", "c")));
        assert!(any_normal.matches(&Resource::Database("test")));
        assert!(!any_normal.matches(&Resource::Namespace("local", "c")));
        assert!(!any_normal.matches(&Resource::Database("config")));
        assert!(!any_normal.matches(&Resource::Namespace("test", "system.users")));
        assert!(!any_normal.matches(&Resource::Cluster));
        let db = ResourcePattern::Database("test".into());
        assert!(db.matches(&Resource::Namespace("test", "c")));
        assert!(!db.matches(&Resource::Namespace("test", "system.js")));
        assert!(!db.matches(&Resource::Namespace("other", "c")));
        let local = ResourcePattern::Database("local".into());
        assert!(local.matches(&Resource::Namespace("local", "oplog.rs")));
        assert!(!local.matches(&Resource::Namespace("local", "replset.minvalid")));
        let coll = ResourcePattern::Collection("system.js".into());
        assert!(coll.matches(&Resource::Namespace("any", "system.js")));
        let buckets = ResourcePattern::AnySystemBuckets;
        assert!(buckets.matches(&Resource::Namespace("t", "system.buckets.w")));
        assert!(!buckets.matches(&Resource::Namespace("t", "system.buckets.")));
        assert!(!buckets.matches(&Resource::Namespace("t", "w")));
        assert!(ResourcePattern::AnyResource.matches(&Resource::Cluster));
        assert!(ResourcePattern::AnyResource.matches(&Resource::AnyResource));
        assert!(!ResourcePattern::Cluster.matches(&Resource::AnyResource));
    }

    #[test]
    fn read_grants_reads_on_its_database_only() {
        let p = privs(&[("read", "test")]);
        let ns = Resource::Namespace("test", "c");
        assert!(p.is_authorized(&ns, &[A::Find, A::ListIndexes, A::CollStats]));
        assert!(!p.is_authorized(&ns, &[A::Insert]));
        assert!(!p.is_authorized(&Resource::Namespace("other", "c"), &[A::Find]));
        assert!(p.is_authorized(&Resource::Namespace("test", "system.js"), &[A::Find]));
        assert!(!p.is_authorized(&Resource::Namespace("test", "system.users"), &[A::Find]));
        assert!(!p.is_authorized(&Resource::Cluster, &[A::ListDatabases]));
    }

    #[test]
    fn any_database_roles_skip_local_and_config() {
        let p = privs(&[("readWriteAnyDatabase", "admin")]);
        assert!(p.is_authorized(&Resource::Namespace("x", "y"), &[A::Find, A::Insert]));
        assert!(!p.is_authorized(&Resource::Namespace("local", "y"), &[A::Find]));
        assert!(!p.is_authorized(&Resource::Namespace("config", "chunks"), &[A::Find]));
        assert!(p.is_authorized(&Resource::Cluster, &[A::ListDatabases]));
        assert!(!p.is_authorized(&Resource::Database("x"), &[A::DropDatabase]));
    }

    #[test]
    fn cluster_monitor_reads_config_and_local_but_no_user_data() {
        let p = privs(&[("clusterMonitor", "admin")]);
        assert!(p.is_authorized(&Resource::Cluster, &[A::ServerStatus, A::GetLog]));
        assert!(p.is_authorized(&Resource::Namespace("config", "chunks"), &[A::Find]));
        assert!(p.is_authorized(&Resource::Namespace("local", "oplog.rs"), &[A::Find]));
        assert!(!p.is_authorized(&Resource::Namespace("test", "c"), &[A::Find]));
        assert!(p.is_authorized(&Resource::Namespace("test", "c"), &[A::CollStats]));
        assert!(!p.is_authorized(&Resource::Cluster, &[A::SetParameter]));
    }

    #[test]
    fn root_has_everything_but_internal_and_system_has_all() {
        let p = privs(&[("root", "admin")]);
        assert!(p.is_authorized(&Resource::Cluster, &[A::SetParameter, A::ServerStatus]));
        assert!(p.is_authorized(&Resource::Namespace("x", "y"), &[A::Find, A::Insert]));
        assert!(p.is_authorized(&Resource::Namespace("admin", "system.users"), &[A::Find]));
        assert!(!p.is_authorized(&Resource::Cluster, &[A::Internal]));
        let s = Privileges::internal();
        assert!(s.is_authorized(&Resource::Cluster, &[A::Internal]));
        assert!(s.is_authorized(&Resource::AnyResource, Action::ALL));
    }

    #[test]
    fn privileges_merge_per_resource_and_render() {
        let p = privs(&[("read", "test"), ("readWrite", "test")]);
        let on_db: Vec<&Privilege> = p
            .iter()
            .filter(|x| x.resource == ResourcePattern::Database("test".into()))
            .collect();
        assert_eq!(on_db.len(), 1);
        assert!(on_db[0].actions.contains(A::Insert));
        let docs = p.to_documents();
        let first = docs[0].as_document().unwrap();
        assert_eq!(
            first.get_document("resource").unwrap(),
            &doc! {"db": "test", "collection": ""}
        );
        let actions = first.get_array("actions").unwrap();
        assert_eq!(actions[0].as_str(), Some("changeStream"));
        // Round trip through the config server's form.
        for d in docs {
            let back = Privilege::from_document(d.as_document().unwrap()).unwrap();
            assert!(p.iter().any(|x| *x == back));
        }
    }

    #[test]
    fn resource_patterns_round_trip() {
        let all = [
            ResourcePattern::AnyResource,
            ResourcePattern::Cluster,
            ResourcePattern::AnyNormal,
            ResourcePattern::Database("d".into()),
            ResourcePattern::Collection("c".into()),
            ResourcePattern::Namespace("d".into(), "c".into()),
            ResourcePattern::AnySystemBuckets,
            ResourcePattern::SystemBucketsInDatabase("d".into()),
            ResourcePattern::SystemBucketsInAnyDatabase("c".into()),
            ResourcePattern::SystemBuckets("d".into(), "c".into()),
        ];
        for p in all {
            assert_eq!(ResourcePattern::from_document(&p.to_document()).unwrap(), p);
        }
        assert!(ResourcePattern::from_document(&doc! {"x": 1}).is_err());
    }

    #[test]
    fn list_databases_filter() {
        let p = privs(&[("read", "test")]);
        assert!(p.has_any_privilege_in_db("test"));
        assert!(!p.has_any_privilege_in_db("other"));
        let p = privs(&[("readAnyDatabase", "admin")]);
        assert!(p.has_any_privilege_in_db("other"));
        assert!(!Privileges::none().has_any_privilege_in_db("test"));
    }

    #[test]
    fn role_names_parse_like_create_user() {
        assert_eq!(
            RoleName::from_bson(&Bson::String("read".into()), "test").unwrap(),
            RoleName::new("read", "test")
        );
        assert_eq!(
            RoleName::from_bson(
                &Bson::Document(doc! {"role": "root", "db": "admin"}),
                "test"
            )
            .unwrap(),
            RoleName::new("root", "admin")
        );
        assert!(RoleName::from_bson(&Bson::Int32(1), "test").is_err());
        assert!(RoleName::from_bson(&Bson::Document(doc! {"role": "x"}), "test").is_err());
    }
}
