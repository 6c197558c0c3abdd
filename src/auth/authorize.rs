//! The per-command authorization checks, in mongod's order and with mongod's messages.
//!
//! [`authorize`] is called once per command, before it runs, with the connection's
//! [`Principal`] (none before authentication). In order:
//!
//! 1. an admin-only command on another database: 13 `<name> may only be run against the admin
//!    database.` (mongod checks this even with authorization disabled: [`check_admin_only`]);
//! 2. the commands that need no authentication pass (the `hello` family, `ping`, `buildInfo`,
//!    `connectionStatus`, `saslStart`, `saslContinue`, `authenticate`);
//! 3. no authenticated user: 13 `Command <name> requires authentication`;
//! 4. the command's own privilege check; on failure 13 `not authorized on <db> to execute
//!    command <body>`, the body rendered as mongod renders it with passwords and SASL payloads
//!    replaced by `"xxx"` ([`super::render::render_command`]).
//!
//! The privilege each command needs is mongod's (`authorization_checks.cpp`, the commands'
//! `checkAuthForOperation`), including the pieces inside aggregation pipelines (`$lookup`,
//! `$unionWith`, `$out`, `$merge`, …), upserts inside `update` and `findAndModify`, and
//! `bulkWrite`'s per-namespace operations. Some checks end at run time and are not decided
//! here: `getMore` and `killCursors` (the cursor's owner), `listDatabases` (filtered with
//! [`list_databases_filter`]) and `listCollections {authorizedCollections: true, nameOnly:
//! true}` (filtered with [`Privileges::has_any_action_on_namespace`]).
//!
//! A command this table does not know needs every action on every resource: only `__system`
//! passes. That fails closed for anything the router would forward without a check; the router's
//! dispatch table must add an entry here for each command it serves ([`is_known_command`]).

use super::render::render_command;
use super::roles::{Action, ActionSet, Principal, Privileges, Resource};
use super::AuthError;
use crate::value::error_codes::ErrorCode;
use bson::raw::{RawArray, RawBsonRef, RawDocument};
use bson::RawDocumentBuf;

/// A command as the checks see it: its database, its body (the OP_MSG kind-0 section, or the
/// OP_QUERY command document) and its kind-1 document sequences.
pub trait CommandView {
    /// `$db`.
    fn db(&self) -> &str;
    /// The body; its first field names the command.
    fn body(&self) -> &RawDocument;
    /// The documents of the kind-1 section `identifier` (`documents`, `updates`, `deletes`,
    /// `ops`, `nsInfo`), when the request carries one.
    fn sequence(&self, _identifier: &str) -> Option<Vec<&RawDocument>> {
        None
    }
    /// The body's `bypassDocumentValidation` flag (MongoDB's truthiness, the first field of
    /// that name). A view that read it already answers without walking the body again.
    fn bypass_document_validation(&self) -> bool {
        bypasses_document_validation(self.body())
    }
}

/// The commands (any alias) whose check reads `bypassDocumentValidation`; no other command's
/// check does, so a request parser may read the flag for these alone.
pub const READS_BYPASS_DOCUMENT_VALIDATION: [&str; 6] = [
    "insert",
    "update",
    "findAndModify",
    "findandmodify",
    "bulkWrite",
    "aggregate",
];

/// Whether a command body sets `bypassDocumentValidation` (its first field of that name, by
/// MongoDB's truthiness): what [`CommandView::bypass_document_validation`] reads when the view
/// did not read it already.
pub fn bypasses_document_validation(body: &RawDocument) -> bool {
    flag(body, "bypassDocumentValidation")
}

/// An owned command: for tests, and for callers that hold no request type of their own.
#[derive(Debug, Clone)]
pub struct OwnedCommand {
    /// `$db`.
    pub db: String,
    /// The body.
    pub body: RawDocumentBuf,
    /// Kind-1 sections: identifier and documents.
    pub sequences: Vec<(String, Vec<RawDocumentBuf>)>,
}

impl OwnedCommand {
    /// A command without document sequences.
    pub fn new(db: &str, body: RawDocumentBuf) -> OwnedCommand {
        OwnedCommand {
            db: db.to_string(),
            body,
            sequences: Vec::new(),
        }
    }
}

impl CommandView for OwnedCommand {
    fn db(&self) -> &str {
        &self.db
    }
    fn body(&self) -> &RawDocument {
        &self.body
    }
    fn sequence(&self, identifier: &str) -> Option<Vec<&RawDocument>> {
        self.sequences
            .iter()
            .find(|(id, _)| id == identifier)
            .map(|(_, docs)| docs.iter().map(|d| d.as_ref()).collect())
    }
}

/// The name mongod reports a command under (its registered name), for an alias it accepts.
pub fn canonical_name(name: &str) -> &str {
    match name {
        "ismaster" => "isMaster",
        "buildinfo" => "buildInfo",
        "findandmodify" => "findAndModify",
        "deleteIndexes" => "dropIndexes",
        "dbstats" => "dbStats",
        "collstats" => "collStats",
        "datasize" => "dataSize",
        "dbhash" => "dbHash",
        "enablesharding" => "enableSharding",
        "shardcollection" => "shardCollection",
        "listshards" => "listShards",
        "flushrouterconfig" => "flushRouterConfig",
        "movechunk" => "moveChunk",
        "moveprimary" => "movePrimary",
        "removeshard" => "removeShard",
        "addshard" => "addShard",
        "killop" => "killOp",
        "getparameter" => "getParameter",
        "setparameter" => "setParameter",
        "getlog" => "getLog",
        "hostinfo" => "hostInfo",
        "logrotate" => "logRotate",
        other => other,
    }
}

/// Commands any client may run before authenticating.
const NO_AUTH: &[&str] = &[
    "hello",
    "isMaster",
    "ping",
    "buildInfo",
    "connectionStatus",
    "saslStart",
    "saslContinue",
    "authenticate",
];

/// Commands that run on the `admin` database only (mongos 8.0's `adminOnly()`).
const ADMIN_ONLY: &[&str] = &[
    "addShard",
    "balancerStart",
    "balancerStatus",
    "balancerStop",
    "bulkWrite",
    "clearJumboFlag",
    "currentOp",
    "enableSharding",
    "flushRouterConfig",
    "fsync",
    "getCmdLineOpts",
    "getDefaultRWConcern",
    "getLog",
    "getParameter",
    "getShardMap",
    "getShardVersion",
    "killOp",
    "listDatabases",
    "listShards",
    "logRotate",
    "mergeChunks",
    "moveChunk",
    "movePrimary",
    "moveRange",
    "refineCollectionShardKey",
    "removeShard",
    "renameCollection",
    "replSetGetStatus",
    "reshardCollection",
    "setDefaultRWConcern",
    "setFeatureCompatibilityVersion",
    "setParameter",
    "shardCollection",
    "shutdown",
    "split",
    "top",
];

/// Whether `name` (any alias) is an admin-only command.
pub fn is_admin_only(name: &str) -> bool {
    ADMIN_ONLY.contains(&canonical_name(name))
}

/// Whether `name` needs an authenticated user (everything but the handshake and the
/// authentication commands).
pub fn requires_authentication(name: &str) -> bool {
    !NO_AUTH.contains(&canonical_name(name))
}

/// 13 `<name> may only be run against the admin database.` for an admin-only command on
/// another database. mongod checks it whether or not authorization is enabled.
pub fn check_admin_only(name: &str, db: &str) -> Result<(), AuthError> {
    if db != "admin" && is_admin_only(name) {
        return Err(AuthError::new(
            ErrorCode::Unauthorized,
            format!(
                "{} may only be run against the admin database.",
                canonical_name(name)
            ),
        ));
    }
    Ok(())
}

/// Checks whether `principal` (`None`: not authenticated) may run `cmd`, with authorization
/// enabled. See the module header for the order and the messages.
pub fn authorize(principal: Option<&Principal>, cmd: &dyn CommandView) -> Result<(), AuthError> {
    let body = cmd.body();
    let Some(name) = first_key(body) else {
        return Ok(()); // An empty body is refused by the command parser, not here.
    };
    let canonical = canonical_name(name);
    check_admin_only(name, cmd.db())?;
    if !requires_authentication(canonical) {
        return Ok(());
    }
    let Some(principal) = principal else {
        return Err(AuthError::new(
            ErrorCode::Unauthorized,
            format!("Command {canonical} requires authentication"),
        ));
    };
    match check_command(principal, canonical, cmd.db(), body, cmd) {
        Check::Allowed => Ok(()),
        Check::Denied => Err(AuthError::new(
            ErrorCode::Unauthorized,
            format!(
                "not authorized on {} to execute command {}",
                cmd.db(),
                render_command(body)
            ),
        )),
        Check::Error(e) => Err(e),
        Check::Unknown
            if principal
                .privileges
                .is_authorized(&Resource::AnyResource, Action::ALL) =>
        {
            Ok(())
        }
        Check::Unknown => Err(AuthError::new(
            ErrorCode::Unauthorized,
            format!(
                "not authorized on {} to execute command {}",
                cmd.db(),
                render_command(body)
            ),
        )),
    }
}

/// Whether the checks know the command (any alias): the router's dispatch table must only
/// serve known commands, or their users (but `__system`) are refused.
pub fn is_known_command(name: &str) -> bool {
    let mut body = RawDocumentBuf::new();
    let Ok(key) = <&bson::raw::CStr>::try_from(name) else {
        return false;
    };
    body.append(key, 1);
    let cmd = OwnedCommand::new("admin", body);
    !matches!(
        check_command(
            &Principal::internal(),
            canonical_name(name),
            "admin",
            &cmd.body,
            &cmd
        ),
        Check::Unknown
    ) || !requires_authentication(name)
}

/// How `listDatabases` answers a user (mongod's `authorizedDatabases` rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFilter {
    /// Every database.
    All,
    /// Only the databases [`Privileges::has_any_privilege_in_db`] admits.
    Authorized,
}

/// What `listDatabases` may show: all databases when the user holds `listDatabases` on the
/// cluster and did not ask for `authorizedDatabases: true`; otherwise only the databases the
/// user has privileges in; `authorizedDatabases: false` without the privilege is 13
/// `Insufficient permissions to list all databases`.
pub fn list_databases_filter(
    privileges: &Privileges,
    authorized_databases: Option<bool>,
) -> Result<DatabaseFilter, AuthError> {
    let may_list_all = privileges.is_authorized(&Resource::Cluster, &[Action::ListDatabases]);
    match authorized_databases {
        None if may_list_all => Ok(DatabaseFilter::All),
        None | Some(true) => Ok(DatabaseFilter::Authorized),
        Some(false) if may_list_all => Ok(DatabaseFilter::All),
        Some(false) => Err(AuthError::new(
            ErrorCode::Unauthorized,
            "Insufficient permissions to list all databases",
        )),
    }
}

/// Whether the user may kill cursors it does not own on the namespace (mongod's
/// `killAnyCursor` on the cluster or the namespace); otherwise only its own.
pub fn may_kill_any_cursor(privileges: &Privileges, db: &str, coll: &str) -> bool {
    privileges.is_authorized(&Resource::Cluster, &[Action::KillAnyCursor])
        || privileges.is_authorized(&Resource::Namespace(db, coll), &[Action::KillAnyCursor])
}

enum Check {
    Allowed,
    Denied,
    Error(AuthError),
    /// Not in the table: only a holder of every action everywhere may run it.
    Unknown,
}

/// The privileges a command needs, checked as they are named: `met` stays true while every one
/// so far is granted (the checks are pure, so checking each as it is added decides the same as
/// gathering them first, without allocating a list or owned names per command).
struct Needs<'p> {
    privileges: &'p Privileges,
    met: bool,
}

impl<'p> Needs<'p> {
    fn new(privileges: &'p Privileges) -> Needs<'p> {
        Needs {
            privileges,
            met: true,
        }
    }
    fn need(&mut self, target: Resource<'_>, actions: &ActionSet) {
        if self.met {
            self.met = self.privileges.is_authorized_for(&target, actions);
        }
    }
    fn ns(&mut self, db: &str, coll: &str, actions: &[Action]) {
        self.need(Resource::Namespace(db, coll), &ActionSet::of(actions));
    }
    fn ns_set(&mut self, db: &str, coll: &str, actions: ActionSet) {
        self.need(Resource::Namespace(db, coll), &actions);
    }
    /// `base` on the namespace, plus the actions `extra` names (a subset of `conditional`).
    /// `extra` is only worked out when the user lacks some of `conditional`: holding them all,
    /// whichever `extra` names are granted, so the body need not be read for them.
    fn ns_then(
        &mut self,
        db: &str,
        coll: &str,
        base: ActionSet,
        conditional: ActionSet,
        extra: impl FnOnce() -> ActionSet,
    ) {
        if !self.met {
            return;
        }
        let granted = self.privileges.actions_on(&Resource::Namespace(db, coll));
        self.met = granted.contains_all(&base)
            && (granted.contains_all(&conditional) || granted.contains_all(&extra()));
    }
    fn full_ns(&mut self, ns: &str, actions: &[Action]) {
        self.full_ns_set(ns, ActionSet::of(actions));
    }
    fn full_ns_set(&mut self, ns: &str, actions: ActionSet) {
        let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
        self.ns_set(db, coll, actions);
    }
    fn db(&mut self, db: &str, actions: &[Action]) {
        self.need(Resource::Database(db), &ActionSet::of(actions));
    }
    fn cluster(&mut self, actions: &[Action]) {
        self.need(Resource::Cluster, &ActionSet::of(actions));
    }
    fn any_normal(&mut self, actions: &[Action]) {
        self.need(Resource::AnyNormal, &ActionSet::of(actions));
    }
    fn all_met(&self) -> bool {
        self.met
    }
}

fn first_key(body: &RawDocument) -> Option<&str> {
    body.iter()
        .next()
        .and_then(|r| r.ok())
        .map(|(k, _)| k.as_str())
}

fn get<'a>(doc: &'a RawDocument, key: &str) -> Option<RawBsonRef<'a>> {
    doc.get(key).ok().flatten()
}

fn get_str<'a>(doc: &'a RawDocument, key: &str) -> Option<&'a str> {
    match get(doc, key) {
        Some(RawBsonRef::String(s)) => Some(s),
        _ => None,
    }
}

fn get_doc<'a>(doc: &'a RawDocument, key: &str) -> Option<&'a RawDocument> {
    match get(doc, key) {
        Some(RawBsonRef::Document(d)) => Some(d),
        _ => None,
    }
}

fn get_array<'a>(doc: &'a RawDocument, key: &str) -> Option<&'a RawArray> {
    match get(doc, key) {
        Some(RawBsonRef::Array(a)) => Some(a),
        _ => None,
    }
}

/// MongoDB's truthiness for option flags (`upsert`, `remove`, `bypassDocumentValidation`).
pub fn truthy(v: Option<RawBsonRef<'_>>) -> bool {
    match v {
        None | Some(RawBsonRef::Null) | Some(RawBsonRef::Undefined) => false,
        Some(RawBsonRef::Boolean(b)) => b,
        Some(RawBsonRef::Int32(i)) => i != 0,
        Some(RawBsonRef::Int64(i)) => i != 0,
        Some(RawBsonRef::Double(d)) => d != 0.0,
        Some(_) => true,
    }
}

fn flag(doc: &RawDocument, key: &str) -> bool {
    truthy(get(doc, key))
}

fn docs_of(array: &RawArray) -> Vec<&RawDocument> {
    array
        .into_iter()
        .filter_map(|v| match v {
            Ok(RawBsonRef::Document(d)) => Some(d),
            _ => None,
        })
        .collect()
}

/// A write command's statements: the kind-1 section, else the body's array.
fn statements<'a>(
    cmd: &'a dyn CommandView,
    body: &'a RawDocument,
    field: &str,
) -> Vec<&'a RawDocument> {
    if let Some(seq) = cmd.sequence(field) {
        return seq;
    }
    get_array(body, field).map(docs_of).unwrap_or_default()
}

/// The collection a command names in its first field (a string); an empty name otherwise
/// (a UUID, or `1` for collection-less forms), which the database's privileges cover.
fn coll_arg<'a>(body: &'a RawDocument, name: &str) -> &'a str {
    get_str(body, name).unwrap_or("")
}

fn verdict(met: bool) -> Check {
    if met {
        Check::Allowed
    } else {
        Check::Denied
    }
}

fn check_command(
    principal: &Principal,
    name: &str,
    db: &str,
    body: &RawDocument,
    cmd: &dyn CommandView,
) -> Check {
    use Action as A;
    let p = &principal.privileges;
    let mut needs = Needs::new(p);
    let raw_name = first_key(body).unwrap_or(name);
    let coll = coll_arg(body, raw_name);
    // Read only by the commands it matters to (unless the view has it, it walks the body).
    let bypass = || cmd.bypass_document_validation();
    match name {
        // Authentication alone.
        "logout" | "whatsmyuri" | "startSession" | "endSessions" | "refreshSessions"
        | "commitTransaction" | "abortTransaction" | "getMore" | "killCursors" | "killSessions"
        | "listDatabases" | "isdbgrid" | "lockInfo" => {}

        "find" | "count" | "distinct" => needs.ns(db, coll, &[A::Find]),
        "aggregate" => {
            let pipeline = get_array(body, "pipeline");
            let stages = pipeline.map(docs_of).unwrap_or_default();
            let collectionless = get(body, "aggregate").is_some_and(|v| v.as_str().is_none());
            let starts_with_source = stages
                .first()
                .and_then(|s| first_key(s))
                .is_some_and(is_source_stage);
            if !collectionless && !starts_with_source {
                needs.ns(db, coll, &[A::Find]);
            }
            pipeline_needs(&stages, db, coll, bypass(), &mut needs);
        }
        "explain" => {
            return match get_doc(body, "explain") {
                Some(inner) => {
                    let inner_name = first_key(inner).unwrap_or("");
                    let inner_cmd = InnerCommand { db, body: inner };
                    check_command(principal, canonical_name(inner_name), db, inner, &inner_cmd)
                }
                None => Check::Allowed, // Malformed: the command's own parse answers it.
            };
        }
        "insert" => {
            needs.ns_then(
                db,
                coll,
                ActionSet::of(&[A::Insert]),
                ActionSet::of(&[A::BypassDocumentValidation]),
                || {
                    let mut a = ActionSet::empty();
                    if bypass() {
                        a.insert(A::BypassDocumentValidation);
                    }
                    a
                },
            );
        }
        "update" => {
            needs.ns_then(
                db,
                coll,
                ActionSet::of(&[A::Update]),
                ActionSet::of(&[A::Insert, A::BypassDocumentValidation]),
                || {
                    let mut a = ActionSet::empty();
                    if statements(cmd, body, "updates")
                        .iter()
                        .any(|s| flag(s, "upsert"))
                    {
                        a.insert(A::Insert);
                    }
                    if bypass() {
                        a.insert(A::BypassDocumentValidation);
                    }
                    a
                },
            );
        }
        "delete" => needs.ns(db, coll, &[A::Remove]),
        "findAndModify" => {
            let mut a = ActionSet::of(&[A::Find]);
            if flag(body, "remove") {
                a.insert(A::Remove);
            } else {
                a.insert(A::Update);
                if flag(body, "upsert") {
                    a.insert(A::Insert);
                }
            }
            if bypass() {
                a.insert(A::BypassDocumentValidation);
            }
            needs.ns_set(db, coll, a);
        }
        "bulkWrite" => {
            let ns_info = statements(cmd, body, "nsInfo");
            for op in statements(cmd, body, "ops") {
                let (index, mut actions) = if let Some(v) = get(op, "insert") {
                    (v, ActionSet::of(&[A::Insert]))
                } else if let Some(v) = get(op, "update") {
                    let mut a = ActionSet::of(&[A::Update]);
                    if flag(op, "upsert") {
                        a.insert(A::Insert);
                    }
                    (v, a)
                } else if let Some(v) = get(op, "delete") {
                    (v, ActionSet::of(&[A::Remove]))
                } else {
                    continue;
                };
                if bypass() {
                    actions.insert(A::BypassDocumentValidation);
                }
                let idx = match index {
                    RawBsonRef::Int32(i) => i as i64,
                    RawBsonRef::Int64(i) => i,
                    RawBsonRef::Double(d) => d as i64,
                    _ => -1,
                };
                let target = usize::try_from(idx)
                    .ok()
                    .and_then(|i| ns_info.get(i))
                    .and_then(|info| get_str(info, "ns"));
                match target {
                    Some(ns) => needs.full_ns_set(ns, actions),
                    // An index outside nsInfo is the command's own error to report.
                    None => continue,
                }
            }
        }
        "create" => {
            if flag(body, "capped") && !p.is_authorized(&ns(db, coll), &[A::ConvertToCapped]) {
                return Check::Denied;
            }
            let may_create = p.is_authorized(&ns(db, coll), &[A::CreateCollection]);
            if let Some(view_on) = get_str(body, "viewOn") {
                if !may_create {
                    return Check::Denied;
                }
                needs.ns(db, view_on, &[A::Find]);
                let stages = get_array(body, "pipeline").map(docs_of).unwrap_or_default();
                pipeline_needs(&stages, db, view_on, false, &mut needs);
            } else if !may_create {
                needs.ns(db, coll, &[A::Insert]);
            }
        }
        "collMod" => {
            needs.ns(db, coll, &[A::CollMod]);
            let view_on = get_str(body, "viewOn");
            let pipeline = get_array(body, "pipeline");
            match (view_on, pipeline) {
                (Some(v), Some(pl)) => {
                    needs.ns(db, v, &[A::Find]);
                    pipeline_needs(&docs_of(pl), db, v, false, &mut needs);
                }
                (None, None) => {}
                _ => {
                    return Check::Error(AuthError::new(
                        ErrorCode::InvalidOptions,
                        "Must specify both 'viewOn' and 'pipeline' when modifying a view and \
                         auth is enabled",
                    ))
                }
            }
        }
        "drop" => needs.ns(db, coll, &[A::DropCollection]),
        "createIndexes" => needs.ns(db, coll, &[A::CreateIndex]),
        "dropIndexes" => needs.ns(db, coll, &[A::DropIndex]),
        "listIndexes" => needs.ns(db, coll, &[A::ListIndexes]),
        "listCollections" => {
            if !(flag(body, "authorizedCollections") && flag(body, "nameOnly")) {
                needs.db(db, &[A::ListCollections]);
            }
        }
        "dropDatabase" => needs.db(db, &[A::DropDatabase]),
        "collStats" => needs.ns(db, coll, &[A::CollStats]),
        "dbStats" => needs.db(db, &[A::DbStats]),
        "dbHash" => needs.db(db, &[A::DbHash]),
        "profile" => needs.db(db, &[A::EnableProfiler]),
        "dataSize" => needs.full_ns(coll, &[A::Find]),
        "validate" => needs.ns(db, coll, &[A::Validate]),
        "compact" => needs.ns(db, coll, &[A::Compact]),
        "reIndex" => needs.ns(db, coll, &[A::ReIndex]),
        "convertToCapped" => needs.ns(db, coll, &[A::ConvertToCapped]),
        "cloneCollectionAsCapped" => {
            needs.ns(db, coll, &[A::Find]);
            let to = get_str(body, "toCollection").unwrap_or("");
            needs.ns(db, to, &[A::Insert, A::CreateIndex, A::ConvertToCapped]);
        }
        "renameCollection" => {
            let from = coll;
            let to = get_str(body, "to").unwrap_or("");
            let (from_db, from_coll) = from.split_once('.').unwrap_or((from, ""));
            let (to_db, to_coll) = to.split_once('.').unwrap_or((to, ""));
            let drop_target = flag(body, "dropTarget");
            let normal = super::roles::is_normal_collection(from_db, from_coll)
                && super::roles::is_normal_collection(to_db, to_coll);
            if from_db == to_db && normal {
                needs.db(from_db, &[A::RenameCollectionSameDb]);
                if drop_target {
                    needs.ns(to_db, to_coll, &[A::DropCollection]);
                }
                // No privilege escalation: reading the source or being unable to read the
                // target.
                let can_read_source = p.is_authorized(&ns(from_db, from_coll), &[A::Find]);
                let can_read_target = p.is_authorized(&ns(to_db, to_coll), &[A::Find]);
                if !can_read_source && can_read_target {
                    return Check::Denied;
                }
            } else {
                needs.ns(from_db, from_coll, &[A::Find, A::DropCollection]);
                let mut a = vec![A::Insert, A::CreateIndex];
                if drop_target {
                    a.push(A::DropCollection);
                }
                needs.ns(to_db, to_coll, &a);
            }
        }

        // Server state and administration.
        "serverStatus" => needs.cluster(&[A::ServerStatus]),
        "hostInfo" => needs.cluster(&[A::HostInfo]),
        "getCmdLineOpts" => needs.cluster(&[A::GetCmdLineOpts]),
        "getLog" => needs.cluster(&[A::GetLog]),
        "getParameter" => needs.cluster(&[A::GetParameter]),
        "setParameter" => needs.cluster(&[A::SetParameter]),
        "top" => needs.cluster(&[A::Top]),
        "connPoolStats" | "shardConnPoolStats" => needs.cluster(&[A::ConnPoolStats]),
        "getShardMap" => needs.cluster(&[A::GetShardMap]),
        "listShards" => needs.cluster(&[A::ListShards]),
        "flushRouterConfig" => needs.cluster(&[A::FlushRouterConfig]),
        "addShard" => needs.cluster(&[A::AddShard]),
        "removeShard" => needs.cluster(&[A::RemoveShard]),
        "getDefaultRWConcern" => needs.cluster(&[A::GetDefaultRwConcern]),
        "setDefaultRWConcern" => needs.cluster(&[A::SetDefaultRwConcern]),
        "setFeatureCompatibilityVersion" => needs.cluster(&[A::SetFeatureCompatibilityVersion]),
        "replSetGetStatus" => needs.cluster(&[A::ReplSetGetStatus]),
        "fsync" => needs.cluster(&[A::Fsync]),
        "logRotate" => needs.cluster(&[A::LogRotate]),
        "shutdown" => needs.cluster(&[A::Shutdown]),
        "invalidateUserCache" => needs.cluster(&[A::InvalidateUserCache]),
        "killAllSessions" | "killAllSessionsByPattern" => needs.cluster(&[A::KillAnySession]),
        "killOp" => needs.cluster(&[A::Killop]),
        "currentOp" => {
            if !flag(body, "$ownOps") {
                needs.cluster(&[A::Inprog]);
            }
        }
        "balancerStatus" => needs.ns("config", "settings", &[A::Find]),
        "balancerStart" | "balancerStop" => needs.ns("config", "settings", &[A::Update]),
        "enableSharding" => needs.db(coll, &[A::EnableSharding]),
        "shardCollection" => needs.full_ns(coll, &[A::EnableSharding]),
        "refineCollectionShardKey" => needs.full_ns(coll, &[A::RefineCollectionShardKey]),
        "reshardCollection" => needs.full_ns(coll, &[A::ReshardCollection]),
        "moveChunk" | "moveRange" => needs.full_ns(coll, &[A::MoveChunk]),
        "split" | "mergeChunks" => needs.full_ns(coll, &[A::SplitChunk]),
        "movePrimary" => needs.db(coll, &[A::MoveChunk]),
        "clearJumboFlag" => needs.full_ns(coll, &[A::ClearJumboFlag]),
        "getShardVersion" => needs.full_ns(coll, &[A::GetShardVersion]),
        "analyzeShardKey" => needs.full_ns(coll, &[A::AnalyzeShardKey]),

        // Users and roles.
        "createUser" => {
            needs.db(db, &[A::CreateUser]);
            role_grants(body, db, A::GrantRole, &mut needs);
        }
        "updateUser" => {
            if get(body, "pwd").is_some() || get(body, "mechanisms").is_some() {
                needs.db(db, &[A::ChangePassword]);
            }
            if get(body, "customData").is_some() {
                needs.db(db, &[A::ChangeCustomData]);
            }
            if get(body, "roles").is_some() {
                needs.any_normal(&[A::RevokeRole]);
                role_grants(body, db, A::GrantRole, &mut needs);
            }
            if get(body, "authenticationRestrictions").is_some() {
                needs.db(db, &[A::SetAuthenticationRestriction]);
            }
        }
        "dropUser" | "dropAllUsersFromDatabase" => needs.db(db, &[A::DropUser]),
        "grantRolesToUser" => role_grants(body, db, A::GrantRole, &mut needs),
        "revokeRolesFromUser" => role_grants(body, db, A::RevokeRole, &mut needs),
        "usersInfo" => users_info_needs(principal, body, db, &mut needs),
        "createRole" => {
            needs.db(db, &[A::CreateRole]);
            role_grants(body, db, A::GrantRole, &mut needs);
        }
        "updateRole" | "grantPrivilegesToRole" | "revokePrivilegesFromRole" => {
            needs.db(db, &[A::GrantRole, A::RevokeRole]);
        }
        "grantRolesToRole" => role_grants(body, db, A::GrantRole, &mut needs),
        "revokeRolesFromRole" => role_grants(body, db, A::RevokeRole, &mut needs),
        "dropRole" | "dropAllRolesFromDatabase" => needs.db(db, &[A::DropRole]),
        "rolesInfo" => needs.db(db, &[A::ViewRole]),

        // Internal commands (`_configsvr…`, `_shardsvr…`, …): the cluster's own members only.
        internal if internal.starts_with('_') => needs.cluster(&[A::Internal]),
        // Unknown here: only a user holding every action everywhere.
        _ => return Check::Unknown,
    }
    verdict(needs.all_met())
}

fn ns<'a>(db: &'a str, coll: &'a str) -> Resource<'a> {
    Resource::Namespace(db, coll)
}

/// An `explain`'s inner command: same database, no document sequences.
struct InnerCommand<'a> {
    db: &'a str,
    body: &'a RawDocument,
}

impl CommandView for InnerCommand<'_> {
    fn db(&self) -> &str {
        self.db
    }
    fn body(&self) -> &RawDocument {
        self.body
    }
}

/// `grantRole`/`revokeRole` on the database of every role named in `roles`.
fn role_grants(body: &RawDocument, db: &str, action: Action, needs: &mut Needs) {
    let Some(roles) = get_array(body, "roles") else {
        return;
    };
    for role in roles.into_iter().flatten() {
        let role_db = match role {
            RawBsonRef::String(_) => db,
            RawBsonRef::Document(d) => get_str(d, "db").unwrap_or(db),
            _ => db,
        };
        needs.db(role_db, &[action]);
    }
}

/// `usersInfo`: a user may always view itself; others need `viewUser` on their database,
/// `forAllDBs` needs it on the cluster.
fn users_info_needs(principal: &Principal, body: &RawDocument, db: &str, needs: &mut Needs) {
    let me = &principal.user;
    let one = |user: &str, user_db: &str, needs: &mut Needs| {
        if !(me.user == user && me.db == user_db) {
            needs.db(user_db, &[Action::ViewUser]);
        }
    };
    match get(body, "usersInfo") {
        Some(RawBsonRef::String(u)) => one(u, db, needs),
        Some(RawBsonRef::Document(d)) if flag(d, "forAllDBs") => needs.cluster(&[Action::ViewUser]),
        Some(RawBsonRef::Document(d)) => one(
            get_str(d, "user").unwrap_or(""),
            get_str(d, "db").unwrap_or(db),
            needs,
        ),
        Some(RawBsonRef::Array(a)) => {
            for item in a.into_iter().flatten() {
                match item {
                    RawBsonRef::String(u) => one(u, db, needs),
                    RawBsonRef::Document(d) => one(
                        get_str(d, "user").unwrap_or(""),
                        get_str(d, "db").unwrap_or(db),
                        needs,
                    ),
                    _ => {}
                }
            }
        }
        _ => needs.db(db, &[Action::ViewUser]),
    }
}

/// Stages that produce their own documents instead of reading the aggregated collection.
fn is_source_stage(stage: &str) -> bool {
    matches!(
        stage,
        "$collStats"
            | "$indexStats"
            | "$currentOp"
            | "$listSessions"
            | "$listLocalSessions"
            | "$documents"
            | "$changeStream"
            | "$listSearchIndexes"
            | "$planCacheStats"
            | "$listCatalog"
            | "$queryStats"
            | "$shardedDataDistribution"
            | "$listSampledQueries"
            | "$listClusterCatalog"
    )
}

/// The privileges the stages of a pipeline need beyond reading the aggregated namespace
/// `db.coll` (`coll` empty for a collection-less aggregation).
fn pipeline_needs(stages: &[&RawDocument], db: &str, coll: &str, bypass: bool, needs: &mut Needs) {
    use Action as A;
    for stage in stages {
        let Some(name) = first_key(stage) else {
            continue;
        };
        let arg = get(stage, name);
        let arg_doc = match arg {
            Some(RawBsonRef::Document(d)) => Some(d),
            _ => None,
        };
        match name {
            "$collStats" => needs.ns(db, coll, &[A::CollStats]),
            "$indexStats" => needs.ns(db, coll, &[A::IndexStats]),
            "$planCacheStats" => needs.ns(db, coll, &[A::PlanCacheRead]),
            "$listSearchIndexes" => needs.ns(db, coll, &[A::ListSearchIndexes]),
            "$changeStream" => {
                let all = arg_doc.is_some_and(|d| flag(d, "allChangesForCluster"));
                if all {
                    needs.any_normal(&[A::Find, A::ChangeStream]);
                } else if coll.is_empty() {
                    needs.db(db, &[A::Find, A::ChangeStream]);
                } else {
                    needs.ns(db, coll, &[A::Find, A::ChangeStream]);
                }
            }
            "$currentOp" if arg_doc.is_some_and(|d| flag(d, "allUsers")) => {
                needs.cluster(&[A::Inprog]);
            }
            "$listSessions" | "$listLocalSessions" => {
                let others =
                    arg_doc.is_some_and(|d| flag(d, "allUsers") || get(d, "users").is_some());
                if others {
                    needs.cluster(&[A::ListSessions]);
                }
            }
            "$lookup" | "$graphLookup" => {
                let Some(d) = arg_doc else { continue };
                let (from_db, from_coll) = match get(d, "from") {
                    Some(RawBsonRef::String(s)) => (db, s),
                    Some(RawBsonRef::Document(f)) => (
                        get_str(f, "db").unwrap_or(db),
                        get_str(f, "coll").unwrap_or(""),
                    ),
                    _ => (db, ""),
                };
                if get(d, "from").is_some() {
                    needs.ns(from_db, from_coll, &[A::Find]);
                }
                if let Some(sub) = get_array(d, "pipeline") {
                    pipeline_needs(&docs_of(sub), from_db, from_coll, false, needs);
                }
            }
            "$unionWith" => match arg {
                Some(RawBsonRef::String(s)) => needs.ns(db, s, &[A::Find]),
                Some(RawBsonRef::Document(d)) => {
                    let c = get_str(d, "coll");
                    if let Some(c) = c {
                        needs.ns(db, c, &[A::Find]);
                    }
                    if let Some(sub) = get_array(d, "pipeline") {
                        pipeline_needs(&docs_of(sub), db, c.unwrap_or(""), false, needs);
                    }
                }
                _ => {}
            },
            "$facet" => {
                if let Some(d) = arg_doc {
                    for sub in d.iter().flatten() {
                        if let (_, RawBsonRef::Array(a)) = sub {
                            pipeline_needs(&docs_of(a), db, coll, bypass, needs);
                        }
                    }
                }
            }
            "$out" => {
                let (out_db, out_coll) = match arg {
                    Some(RawBsonRef::String(s)) => (db, s),
                    Some(RawBsonRef::Document(d)) => (
                        get_str(d, "db").unwrap_or(db),
                        get_str(d, "coll").unwrap_or(""),
                    ),
                    _ => (db, ""),
                };
                let mut a = vec![A::Insert, A::Remove];
                if bypass {
                    a.push(A::BypassDocumentValidation);
                }
                needs.ns(out_db, out_coll, &a);
            }
            "$merge" => {
                let (into, when_matched, when_not_matched) = match arg {
                    Some(RawBsonRef::String(s)) => (Some((db, s)), None, None),
                    Some(RawBsonRef::Document(d)) => {
                        let into = match get(d, "into") {
                            Some(RawBsonRef::String(s)) => Some((db, s)),
                            Some(RawBsonRef::Document(i)) => Some((
                                get_str(i, "db").unwrap_or(db),
                                get_str(i, "coll").unwrap_or(""),
                            )),
                            _ => None,
                        };
                        let matched = match get(d, "whenMatched") {
                            Some(RawBsonRef::String(s)) => Some(s),
                            Some(RawBsonRef::Array(_)) => Some("pipeline"),
                            _ => None,
                        };
                        (into, matched, get_str(d, "whenNotMatched"))
                    }
                    _ => (None, None, None),
                };
                let Some((m_db, m_coll)) = into else { continue };
                let when_matched = when_matched.unwrap_or("merge");
                let when_not_matched = when_not_matched.unwrap_or("insert");
                let mut a = Vec::new();
                if when_not_matched == "insert" {
                    a.push(A::Insert);
                }
                if when_matched != "fail" || when_not_matched != "insert" {
                    a.push(A::Update);
                }
                if bypass {
                    a.push(A::BypassDocumentValidation);
                }
                needs.ns(m_db, m_coll, &a);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
