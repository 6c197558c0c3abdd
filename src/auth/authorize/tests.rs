//! The authorization table: every built-in role the issue names, allowed and refused what
//! mongod allows and refuses, command by command; plus the messages and the special cases.
//!
//! The expectations are written from MongoDB's role definitions and command checks, not from
//! this implementation: each row says, per role, what mongod answers.

use super::*;
use crate::auth::roles::{Principal, RoleName};
use crate::auth::UserName;
use bson::{rawdoc, Binary, RawDocumentBuf};

const ROLES: &[(&str, &str)] = &[
    ("read", "test"),
    ("readWrite", "test"),
    ("dbAdmin", "test"),
    ("userAdmin", "test"),
    ("dbOwner", "test"),
    ("clusterMonitor", "admin"),
    ("clusterManager", "admin"),
    ("clusterAdmin", "admin"),
    ("readAnyDatabase", "admin"),
    ("readWriteAnyDatabase", "admin"),
    ("root", "admin"),
    ("__system", "admin"),
    ("(no roles)", ""),
];

fn principal(role: &str, db: &str) -> Principal {
    match role {
        "__system" => Principal::internal(),
        "(no roles)" => Principal::from_builtin_roles(UserName::new("u", "test"), vec![]).unwrap(),
        _ => {
            Principal::from_builtin_roles(UserName::new("u", "test"), vec![RoleName::new(role, db)])
                .unwrap()
        }
    }
}

struct Row {
    what: &'static str,
    cmd: OwnedCommand,
    /// One letter per entry of `ROLES`: Y allowed, N refused.
    expect: &'static str,
}

fn row(what: &'static str, db: &str, body: RawDocumentBuf, expect: &'static str) -> Row {
    Row {
        what,
        cmd: OwnedCommand::new(db, body),
        expect,
    }
}

fn table() -> Vec<Row> {
    //      roles:  R  RW DA UA DO CMo CMa CAd RAD RWAD root sys none
    let mut rows = vec![
        row(
            "find",
            "test",
            rawdoc! {"find": "c", "filter": {}, "$db": "test"},
            "YYNNYNNNYYYYN",
        ),
        row(
            "count",
            "test",
            rawdoc! {"count": "c", "$db": "test"},
            "YYNNYNNNYYYYN",
        ),
        row(
            "distinct",
            "test",
            rawdoc! {"distinct": "c", "key": "a", "$db": "test"},
            "YYNNYNNNYYYYN",
        ),
        row(
            "aggregate $match",
            "test",
            rawdoc! {"aggregate": "c", "pipeline": [{"$match": {}}], "cursor": {}, "$db": "test"},
            "YYNNYNNNYYYYN",
        ),
        row(
            "aggregate $lookup",
            "test",
            rawdoc! {"aggregate": "c", "pipeline": [{"$lookup": {"from": "c2", "localField": "a", "foreignField": "b", "as": "x"}}], "cursor": {}, "$db": "test"},
            "YYNNYNNNYYYYN",
        ),
        row(
            "aggregate $out",
            "test",
            rawdoc! {"aggregate": "c", "pipeline": [{"$match": {}}, {"$out": "out"}], "cursor": {}, "$db": "test"},
            "NYNNYNNNNYYYN",
        ),
        row(
            "listIndexes",
            "test",
            rawdoc! {"listIndexes": "c", "$db": "test"},
            "YYYNYNNNYYYYN",
        ),
        row(
            "listCollections",
            "test",
            rawdoc! {"listCollections": 1, "$db": "test"},
            "YYYNYNNNYYYYN",
        ),
        row(
            "collStats",
            "test",
            rawdoc! {"collStats": "c", "$db": "test"},
            "YYYNYYNYYYYYN",
        ),
        row(
            "dbStats",
            "test",
            rawdoc! {"dbStats": 1, "$db": "test"},
            "YYYNYYNYYYYYN",
        ),
        row(
            "insert",
            "test",
            rawdoc! {"insert": "c", "documents": [{"a": 1}], "$db": "test"},
            "NYNNYNNNNYYYN",
        ),
        row(
            "update",
            "test",
            rawdoc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}}], "$db": "test"},
            "NYNNYNNNNYYYN",
        ),
        row(
            "delete",
            "test",
            rawdoc! {"delete": "c", "deletes": [{"q": {}, "limit": 0}], "$db": "test"},
            "NYNNYNNNNYYYN",
        ),
        row(
            "findAndModify update",
            "test",
            rawdoc! {"findAndModify": "c", "query": {}, "update": {"$set": {"a": 1}}, "$db": "test"},
            "NYNNYNNNNYYYN",
        ),
        row(
            "findAndModify remove",
            "test",
            rawdoc! {"findAndModify": "c", "query": {}, "remove": true, "$db": "test"},
            "NYNNYNNNNYYYN",
        ),
        row(
            "create",
            "test",
            rawdoc! {"create": "d", "$db": "test"},
            "NYYNYNNNNYYYN",
        ),
        row(
            "drop",
            "test",
            rawdoc! {"drop": "c", "$db": "test"},
            "NYYNYNNNNYYYN",
        ),
        row(
            "createIndexes",
            "test",
            rawdoc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}], "$db": "test"},
            "NYYNYNNNNYYYN",
        ),
        row(
            "dropIndexes",
            "test",
            rawdoc! {"dropIndexes": "c", "index": "a_1", "$db": "test"},
            "NYYNYNNNNYYYN",
        ),
        row(
            "collMod",
            "test",
            rawdoc! {"collMod": "c", "validator": {}, "$db": "test"},
            "NNYNYNNNNNYYN",
        ),
        row(
            "dropDatabase",
            "test",
            rawdoc! {"dropDatabase": 1, "$db": "test"},
            "NNYNYNNYNNYYN",
        ),
        row(
            "renameCollection same db",
            "admin",
            rawdoc! {"renameCollection": "test.c", "to": "test.d", "$db": "admin"},
            "NYYNYNNNNYYYN",
        ),
        row(
            "createUser",
            "test",
            rawdoc! {"createUser": "bob", "pwd": "p", "roles": ["read"], "$db": "test"},
            "NNNYYNNNNNYYN",
        ),
        row(
            "dropUser",
            "test",
            rawdoc! {"dropUser": "bob", "$db": "test"},
            "NNNYYNNNNNYYN",
        ),
        row(
            "usersInfo all of the db",
            "test",
            rawdoc! {"usersInfo": 1, "$db": "test"},
            "NNNYYNNNNNYYN",
        ),
        row(
            "serverStatus",
            "admin",
            rawdoc! {"serverStatus": 1, "$db": "admin"},
            "NNNNNYNYNNYYN",
        ),
        row(
            "getLog",
            "admin",
            rawdoc! {"getLog": "global", "$db": "admin"},
            "NNNNNYNYNNYYN",
        ),
        row(
            "getCmdLineOpts",
            "admin",
            rawdoc! {"getCmdLineOpts": 1, "$db": "admin"},
            "NNNNNYNYNNYYN",
        ),
        row(
            "getParameter",
            "admin",
            rawdoc! {"getParameter": 1, "featureCompatibilityVersion": 1, "$db": "admin"},
            "NNNNNYNYNNYYN",
        ),
        row(
            "setParameter",
            "admin",
            rawdoc! {"setParameter": 1, "logLevel": 1, "$db": "admin"},
            "NNNNNNNYNNYYN",
        ),
        row(
            "currentOp",
            "admin",
            rawdoc! {"currentOp": 1, "$db": "admin"},
            "NNNNNYNYNNYYN",
        ),
        row(
            "killOp",
            "admin",
            rawdoc! {"killOp": 1, "op": "shard0:12", "$db": "admin"},
            "NNNNNNNYNNYYN",
        ),
        row(
            "listShards",
            "admin",
            rawdoc! {"listShards": 1, "$db": "admin"},
            "NNNNNYYYNNYYN",
        ),
        row(
            "flushRouterConfig",
            "admin",
            rawdoc! {"flushRouterConfig": 1, "$db": "admin"},
            "NNNNNNYYNNYYN",
        ),
        row(
            "enableSharding",
            "admin",
            rawdoc! {"enableSharding": "test", "$db": "admin"},
            "NNNNNNYYNNYYN",
        ),
        row(
            "shardCollection",
            "admin",
            rawdoc! {"shardCollection": "test.c", "key": {"a": "hashed"}, "$db": "admin"},
            "NNNNNNYYNNYYN",
        ),
        row(
            "moveChunk",
            "admin",
            rawdoc! {"moveChunk": "test.c", "find": {"a": 1}, "to": "s1", "$db": "admin"},
            "NNNNNNYYNNYYN",
        ),
        row(
            "balancerStatus",
            "admin",
            rawdoc! {"balancerStatus": 1, "$db": "admin"},
            "NNNNNYYYNNYYN",
        ),
        row(
            "listDatabases",
            "admin",
            rawdoc! {"listDatabases": 1.0, "$db": "admin"},
            "YYYYYYYYYYYYY",
        ),
        row(
            "find config.chunks",
            "config",
            rawdoc! {"find": "chunks", "$db": "config"},
            "NNNNNYYYNNYYN",
        ),
        row(
            "find local.oplog.rs",
            "local",
            rawdoc! {"find": "oplog.rs", "$db": "local"},
            "NNNNNYNYNNYYN",
        ),
        row(
            "find admin.system.users",
            "admin",
            rawdoc! {"find": "system.users", "$db": "admin"},
            "NNNNNNNNNNYYN",
        ),
        row(
            "find in another database",
            "other",
            rawdoc! {"find": "c", "$db": "other"},
            "NNNNNNNNYYYYN",
        ),
        row(
            "insert in another database",
            "other",
            rawdoc! {"insert": "c", "documents": [{}], "$db": "other"},
            "NNNNNNNNNYYYN",
        ),
        row(
            "internal command",
            "admin",
            rawdoc! {"_configsvrCommitChunkMigration": "test.c", "$db": "admin"},
            "NNNNNNNNNNNYN",
        ),
        row(
            "logout",
            "test",
            rawdoc! {"logout": 1, "$db": "test"},
            "YYYYYYYYYYYYY",
        ),
        row(
            "getMore",
            "test",
            rawdoc! {"getMore": 5_i64, "collection": "c", "$db": "test"},
            "YYYYYYYYYYYYY",
        ),
        row(
            "explain find",
            "test",
            rawdoc! {"explain": {"find": "c", "filter": {}}, "verbosity": "queryPlanner", "$db": "test"},
            "YYNNYNNNYYYYN",
        ),
        row(
            "explain insert-like update",
            "test",
            rawdoc! {"explain": {"update": "c", "updates": [{"q": {}, "u": {}}]}, "$db": "test"},
            "NYNNYNNNNYYYN",
        ),
    ];
    // Upsert statements arriving as a document sequence need `insert` too.
    let mut upsert = OwnedCommand::new("test", rawdoc! {"update": "c", "$db": "test"});
    upsert.sequences.push((
        "updates".into(),
        vec![rawdoc! {"q": {}, "u": {"$set": {"a": 1}}, "upsert": true}],
    ));
    rows.push(Row {
        what: "update with upsert in a sequence",
        cmd: upsert,
        expect: "NYNNYNNNNYYYN",
    });
    rows
}

#[test]
fn every_role_is_allowed_and_refused_what_mongod_allows_and_refuses() {
    let principals: Vec<Principal> = ROLES.iter().map(|(r, d)| principal(r, d)).collect();
    let mut failures = Vec::new();
    for row in table() {
        assert_eq!(row.expect.len(), ROLES.len(), "row {}", row.what);
        for ((role, p), want) in ROLES.iter().zip(&principals).zip(row.expect.chars()) {
            let got = authorize(Some(p), &row.cmd);
            let allowed = got.is_ok();
            if allowed != (want == 'Y') {
                failures.push(format!(
                    "{} as {}: expected {}, got {:?}",
                    row.what,
                    role.0,
                    if want == 'Y' { "allowed" } else { "refused" },
                    got
                ));
            }
            if let Err(e) = got {
                assert_eq!(e.code, ErrorCode::Unauthorized, "{}", row.what);
                assert!(
                    e.message.starts_with(&format!(
                        "not authorized on {} to execute command {{ ",
                        row.cmd.db
                    )),
                    "{}: {}",
                    row.what,
                    e.message
                );
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn unauthenticated_clients_may_only_handshake_and_authenticate() {
    for body in [
        rawdoc! {"hello": 1, "$db": "admin"},
        rawdoc! {"isMaster": 1, "$db": "admin"},
        rawdoc! {"ismaster": 1, "$db": "test"},
        rawdoc! {"ping": 1, "$db": "admin"},
        rawdoc! {"buildInfo": 1, "$db": "admin"},
        rawdoc! {"buildinfo": 1, "$db": "admin"},
        rawdoc! {"connectionStatus": 1, "$db": "admin"},
        rawdoc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "$db": "admin"},
        rawdoc! {"saslContinue": 1, "conversationId": 1, "$db": "admin"},
        rawdoc! {"authenticate": 1, "mechanism": "MONGODB-X509", "$db": "$external"},
    ] {
        let db = body.get_str("$db").unwrap().to_string();
        assert!(authorize(None, &OwnedCommand::new(&db, body)).is_ok());
    }
    for (body, name) in [
        (rawdoc! {"find": "c", "$db": "test"}, "find"),
        (rawdoc! {"insert": "c", "$db": "test"}, "insert"),
        (
            rawdoc! {"findandmodify": "c", "$db": "test"},
            "findAndModify",
        ),
        (
            rawdoc! {"listDatabases": 1, "$db": "admin"},
            "listDatabases",
        ),
        (rawdoc! {"endSessions": [], "$db": "admin"}, "endSessions"),
        (rawdoc! {"logout": 1, "$db": "admin"}, "logout"),
    ] {
        let db = body.get_str("$db").unwrap().to_string();
        let e = authorize(None, &OwnedCommand::new(&db, body)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthorized);
        assert_eq!(e.message, format!("Command {name} requires authentication"));
    }
}

#[test]
fn admin_only_commands_are_refused_elsewhere_before_authentication() {
    let e = authorize(
        None,
        &OwnedCommand::new("test", rawdoc! {"listDatabases": 1, "$db": "test"}),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthorized);
    assert_eq!(
        e.message,
        "listDatabases may only be run against the admin database."
    );
    let e = check_admin_only("shardcollection", "test").unwrap_err();
    assert_eq!(
        e.message,
        "shardCollection may only be run against the admin database."
    );
    assert!(check_admin_only("find", "test").is_ok());
    assert!(check_admin_only("listShards", "admin").is_ok());
}

#[test]
fn unauthorized_message_renders_the_body_like_mongod() {
    let reader = principal("read", "test");
    let uuid = bson::Uuid::parse_str("127f5963-4ff0-4269-b003-c6b580295588").unwrap();
    let body = rawdoc! {
        "listCollections": 1, "cursor": {}, "nameOnly": true, "$db": "other",
        "lsid": {"id": Binary::from(uuid)}
    };
    let e = authorize(Some(&reader), &OwnedCommand::new("other", body)).unwrap_err();
    assert_eq!(
        e.message,
        "not authorized on other to execute command { listCollections: 1, cursor: {}, nameOnly: true, $db: \"other\", lsid: { id: UUID(\"127f5963-4ff0-4269-b003-c6b580295588\") } }"
    );
    let body = rawdoc! {"createUser": "eve", "pwd": "hunter2", "roles": [], "$db": "test"};
    let e = authorize(Some(&reader), &OwnedCommand::new("test", body)).unwrap_err();
    assert!(!e.message.contains("hunter2"));
    assert!(e.message.contains("pwd: \"xxx\""), "{}", e.message);
}

#[test]
fn list_collections_of_authorized_collections_needs_only_authentication() {
    let nobody = principal("(no roles)", "");
    let body = rawdoc! {"listCollections": 1, "authorizedCollections": true, "nameOnly": true, "$db": "test"};
    assert!(authorize(Some(&nobody), &OwnedCommand::new("test", body)).is_ok());
    let body = rawdoc! {"listCollections": 1, "authorizedCollections": true, "$db": "test"};
    assert!(authorize(Some(&nobody), &OwnedCommand::new("test", body)).is_err());
}

#[test]
fn list_databases_filters_as_mongod() {
    let reader = principal("read", "test").privileges;
    let any = principal("readAnyDatabase", "admin").privileges;
    assert_eq!(
        list_databases_filter(&reader, None).unwrap(),
        DatabaseFilter::Authorized
    );
    assert_eq!(
        list_databases_filter(&any, None).unwrap(),
        DatabaseFilter::All
    );
    assert_eq!(
        list_databases_filter(&any, Some(true)).unwrap(),
        DatabaseFilter::Authorized
    );
    assert_eq!(
        list_databases_filter(&any, Some(false)).unwrap(),
        DatabaseFilter::All
    );
    let e = list_databases_filter(&reader, Some(false)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthorized);
    assert_eq!(e.message, "Insufficient permissions to list all databases");
}

#[test]
fn collmod_of_a_view_needs_both_view_on_and_pipeline() {
    let owner = principal("dbOwner", "test");
    let body = rawdoc! {"collMod": "v", "viewOn": "c", "$db": "test"};
    let e = authorize(Some(&owner), &OwnedCommand::new("test", body)).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    assert_eq!(
        e.message,
        "Must specify both 'viewOn' and 'pipeline' when modifying a view and auth is enabled"
    );
    let body = rawdoc! {"collMod": "v", "viewOn": "c", "pipeline": [], "$db": "test"};
    assert!(authorize(Some(&owner), &OwnedCommand::new("test", body)).is_ok());
}

#[test]
fn creating_a_view_needs_create_collection_and_read_of_the_source() {
    let admin = principal("dbAdmin", "test");
    let body = rawdoc! {"create": "v", "viewOn": "c", "pipeline": [], "$db": "test"};
    // dbAdmin may create collections but cannot read `c`.
    assert!(authorize(Some(&admin), &OwnedCommand::new("test", body.clone())).is_err());
    let owner = principal("dbOwner", "test");
    assert!(authorize(Some(&owner), &OwnedCommand::new("test", body)).is_ok());
    // A view over another database's data needs the read there too.
    let body = rawdoc! {"create": "v", "viewOn": "c", "pipeline": [{"$lookup": {"from": {"db": "other", "coll": "x"}, "pipeline": [], "as": "y"}}], "$db": "test"};
    assert!(authorize(Some(&owner), &OwnedCommand::new("test", body)).is_err());
}

#[test]
fn pipelines_check_every_namespace_they_touch() {
    let rw = principal("readWrite", "test");
    let ok = |body: RawDocumentBuf| authorize(Some(&rw), &OwnedCommand::new("test", body));
    assert!(
        ok(rawdoc! {"aggregate": "c", "pipeline": [{"$unionWith": "d"}], "cursor": {}}).is_ok()
    );
    assert!(ok(rawdoc! {"aggregate": "c", "pipeline": [{"$lookup": {"from": {"db": "other", "coll": "x"}, "as": "y"}}], "cursor": {}}).is_err());
    assert!(ok(rawdoc! {"aggregate": "c", "pipeline": [{"$out": {"db": "other", "coll": "x"}}], "cursor": {}}).is_err());
    assert!(
        ok(rawdoc! {"aggregate": "c", "pipeline": [{"$merge": {"into": "m"}}], "cursor": {}})
            .is_ok()
    );
    assert!(ok(rawdoc! {"aggregate": "c", "pipeline": [{"$merge": {"into": {"db": "other", "coll": "m"}}}], "cursor": {}}).is_err());
    assert!(ok(rawdoc! {"aggregate": "c", "pipeline": [{"$facet": {"a": [{"$unionWith": {"coll": "d", "pipeline": [{"$lookup": {"from": {"db": "other", "coll": "x"}, "as": "y"}}]}}]}}], "cursor": {}}).is_err());
    // $collStats is a source stage: collStats alone, no find needed.
    let monitor = principal("clusterMonitor", "admin");
    let body =
        rawdoc! {"aggregate": "c", "pipeline": [{"$collStats": {"count": {}}}], "cursor": {}};
    assert!(authorize(Some(&monitor), &OwnedCommand::new("test", body)).is_ok());
    // $currentOp with allUsers needs inprog.
    let reader = principal("read", "test");
    let body =
        rawdoc! {"aggregate": 1, "pipeline": [{"$currentOp": {"allUsers": true}}], "cursor": {}};
    assert!(authorize(Some(&reader), &OwnedCommand::new("admin", body)).is_err());
    let body = rawdoc! {"aggregate": 1, "pipeline": [{"$currentOp": {}}], "cursor": {}};
    assert!(authorize(Some(&reader), &OwnedCommand::new("admin", body)).is_ok());
}

#[test]
fn bulk_write_checks_each_namespace_and_upserts() {
    let rw = principal("readWriteAnyDatabase", "admin");
    let reader = principal("readAnyDatabase", "admin");
    let mut cmd = OwnedCommand::new("admin", rawdoc! {"bulkWrite": 1, "$db": "admin"});
    cmd.sequences.push((
        "ops".into(),
        vec![
            rawdoc! {"insert": 0, "document": {}},
            rawdoc! {"update": 1, "filter": {}, "updateMods": {}, "upsert": true},
        ],
    ));
    cmd.sequences.push((
        "nsInfo".into(),
        vec![rawdoc! {"ns": "a.x"}, rawdoc! {"ns": "b.y"}],
    ));
    assert!(authorize(Some(&rw), &cmd).is_ok());
    assert!(authorize(Some(&reader), &cmd).is_err());
    let test_rw = principal("readWrite", "a");
    assert!(
        authorize(Some(&test_rw), &cmd).is_err(),
        "b.y is outside the role"
    );
    let e = authorize(
        Some(&rw),
        &OwnedCommand::new("test", rawdoc! {"bulkWrite": 1, "ops": [], "nsInfo": []}),
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "bulkWrite may only be run against the admin database."
    );
}

#[test]
fn users_may_always_view_themselves() {
    let nobody = principal("(no roles)", "");
    let me = rawdoc! {"usersInfo": "u", "$db": "test"};
    assert!(authorize(Some(&nobody), &OwnedCommand::new("test", me)).is_ok());
    let me = rawdoc! {"usersInfo": {"user": "u", "db": "test"}, "$db": "admin"};
    assert!(authorize(Some(&nobody), &OwnedCommand::new("admin", me)).is_ok());
    let other = rawdoc! {"usersInfo": ["u", "v"], "$db": "test"};
    assert!(authorize(Some(&nobody), &OwnedCommand::new("test", other)).is_err());
    let all = rawdoc! {"usersInfo": {"forAllDBs": true}, "$db": "admin"};
    let ua = principal("userAdmin", "test");
    assert!(authorize(Some(&ua), &OwnedCommand::new("admin", all.clone())).is_err());
    let root = principal("root", "admin");
    assert!(authorize(Some(&root), &OwnedCommand::new("admin", all)).is_ok());
}

#[test]
fn granting_roles_needs_grant_role_on_their_databases() {
    let ua = principal("userAdmin", "test");
    let body = rawdoc! {"createUser": "bob", "pwd": "p", "roles": ["read", {"role": "read", "db": "other"}]};
    assert!(authorize(Some(&ua), &OwnedCommand::new("test", body)).is_err());
    let body = rawdoc! {"updateUser": "bob", "roles": ["read"]};
    assert!(
        authorize(Some(&ua), &OwnedCommand::new("test", body.clone())).is_err(),
        "replacing roles needs revokeRole on every normal database"
    );
    let uaad = principal("userAdminAnyDatabase", "admin");
    assert!(authorize(Some(&uaad), &OwnedCommand::new("test", body)).is_ok());
    let body = rawdoc! {"updateUser": "bob", "pwd": "new"};
    assert!(authorize(Some(&ua), &OwnedCommand::new("test", body)).is_ok());
}

#[test]
fn unknown_commands_fail_closed() {
    let root = principal("root", "admin");
    let body = rawdoc! {"someFutureCommand": 1};
    assert!(authorize(Some(&root), &OwnedCommand::new("test", body.clone())).is_err());
    assert!(authorize(
        Some(&Principal::internal()),
        &OwnedCommand::new("test", body)
    )
    .is_ok());
}

#[test]
fn kill_any_cursor_is_cluster_or_namespace_wide() {
    assert!(may_kill_any_cursor(
        &principal("clusterAdmin", "admin").privileges,
        "test",
        "c"
    ));
    assert!(!may_kill_any_cursor(
        &principal("readWrite", "test").privileges,
        "test",
        "c"
    ));
}

#[test]
fn the_routers_commands_are_all_known() {
    // What the router dispatches today (src/command/, src/read/, src/write/): every one has a
    // check, so none falls to the closed default.
    for name in [
        "hello",
        "isMaster",
        "ismaster",
        "ping",
        "buildInfo",
        "buildinfo",
        "getParameter",
        "getLog",
        "whatsmyuri",
        "connectionStatus",
        "endSessions",
        "getCmdLineOpts",
        "serverStatus",
        "enableSharding",
        "enablesharding",
        "shardCollection",
        "shardcollection",
        "listShards",
        "listshards",
        "flushRouterConfig",
        "flushrouterconfig",
        "balancerStatus",
        "aggregate",
        "find",
        "count",
        "distinct",
        "insert",
        "update",
        "delete",
        "findAndModify",
        "findandmodify",
        "getMore",
        "killCursors",
        "createIndexes",
        "dropIndexes",
        "deleteIndexes",
        "drop",
        "listIndexes",
        "collStats",
        "explain",
        "listDatabases",
        "dropDatabase",
        "dbStats",
        "create",
        "listCollections",
        "commitTransaction",
        "abortTransaction",
        "saslStart",
        "saslContinue",
        "authenticate",
        "logout",
        "createUser",
        "updateUser",
        "dropUser",
        "usersInfo",
        "renameCollection",
        "collMod",
        "bulkWrite",
        "startSession",
    ] {
        assert!(is_known_command(name), "{name}");
    }
    assert!(!is_known_command("someFutureCommand"));
}

/// Writes that bypass document validation need `bypassDocumentValidation` as well, wherever the
/// flag sits in the body; a user holding it (or lacking the write itself) is decided without
/// the flag, and the answer must be the same either way.
#[test]
fn bypassing_document_validation_needs_its_action() {
    //           roles:  R  RW DA UA DO CMo CMa CAd RAD RWAD root sys none
    const WITH: &str = "NNNNYNNNNNYYN";
    const WITHOUT: &str = "NYNNYNNNNYYYN";
    let upsert = || vec![rawdoc! {"q": {}, "u": {"$set": {"a": 1}}, "upsert": true}];
    let mut cases = vec![
        (
            "insert, flag last",
            OwnedCommand::new(
                "test",
                rawdoc! {"insert": "c", "ordered": true, "$db": "test", "bypassDocumentValidation": true},
            ),
            WITH,
        ),
        (
            "insert, flag false",
            OwnedCommand::new(
                "test",
                rawdoc! {"insert": "c", "bypassDocumentValidation": false, "$db": "test"},
            ),
            WITHOUT,
        ),
        (
            "insert, flag 1",
            OwnedCommand::new(
                "test",
                rawdoc! {"insert": "c", "bypassDocumentValidation": 1, "$db": "test"},
            ),
            WITH,
        ),
        (
            "update, flag",
            OwnedCommand::new(
                "test",
                rawdoc! {"update": "c", "$db": "test", "bypassDocumentValidation": true},
            ),
            WITH,
        ),
    ];
    let mut seq = OwnedCommand::new(
        "test",
        rawdoc! {"update": "c", "$db": "test", "bypassDocumentValidation": true},
    );
    seq.sequences.push(("updates".to_string(), upsert()));
    cases.push(("update with upsert in a sequence, flag", seq, WITH));
    let mut seq = OwnedCommand::new("test", rawdoc! {"update": "c", "$db": "test"});
    seq.sequences.push(("updates".to_string(), upsert()));
    cases.push(("update with upsert in a sequence", seq, WITHOUT));
    let principals: Vec<Principal> = ROLES.iter().map(|(r, d)| principal(r, d)).collect();
    let mut failures = Vec::new();
    for (what, cmd, expect) in &cases {
        for ((role, p), want) in ROLES.iter().zip(&principals).zip(expect.chars()) {
            if authorize(Some(p), cmd).is_ok() != (want == 'Y') {
                failures.push(format!("{what} as {}: expected {want}", role.0));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Only the commands of [`READS_BYPASS_DOCUMENT_VALIDATION`] ask the view for the
/// `bypassDocumentValidation` flag (the request parser reads it for them alone), and a view
/// that answers it from elsewhere decides as the body does: with the flag set in the body
/// but answered false by the view, a `readWrite` user passes, answered true it is refused.
#[test]
fn only_the_listed_commands_read_bypass_document_validation() {
    struct Counting<'a> {
        cmd: &'a OwnedCommand,
        asked: std::cell::Cell<u32>,
        answer: bool,
    }
    impl CommandView for Counting<'_> {
        fn db(&self) -> &str {
            self.cmd.db()
        }
        fn body(&self) -> &RawDocument {
            self.cmd.body()
        }
        fn bypass_document_validation(&self) -> bool {
            self.asked.set(self.asked.get() + 1);
            self.answer
        }
    }
    let read_write = principal("readWrite", "test");
    let bodies = [
        rawdoc! {"insert": "c", "documents": [{}], "bypassDocumentValidation": true},
        rawdoc! {"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}}], "bypassDocumentValidation": true},
        rawdoc! {"findAndModify": "c", "query": {}, "update": {"$set": {"a": 1}}, "bypassDocumentValidation": true},
        rawdoc! {"findandmodify": "c", "query": {}, "update": {"$set": {"a": 1}}, "bypassDocumentValidation": true},
        rawdoc! {"aggregate": "c", "pipeline": [{"$out": "d"}], "cursor": {}, "bypassDocumentValidation": true},
        rawdoc! {"find": "c", "bypassDocumentValidation": true},
        rawdoc! {"delete": "c", "deletes": [{"q": {}, "limit": 0}], "bypassDocumentValidation": true},
        rawdoc! {"count": "c", "bypassDocumentValidation": true},
        rawdoc! {"distinct": "c", "key": "a", "bypassDocumentValidation": true},
        rawdoc! {"create": "d", "bypassDocumentValidation": true},
        rawdoc! {"createIndexes": "c", "indexes": [], "bypassDocumentValidation": true},
        rawdoc! {"drop": "c", "bypassDocumentValidation": true},
        rawdoc! {"listCollections": 1, "bypassDocumentValidation": true},
    ];
    for body in bodies {
        let name = first_key(&body).expect("a name").to_string();
        let cmd = OwnedCommand::new("test", body);
        let listed = READS_BYPASS_DOCUMENT_VALIDATION.contains(&name.as_str());
        for answer in [false, true] {
            let view = Counting {
                cmd: &cmd,
                asked: std::cell::Cell::new(0),
                answer,
            };
            let allowed = authorize(Some(&read_write), &view).is_ok();
            assert_eq!(view.asked.get() > 0, listed, "{name} asked for the flag");
            if listed {
                assert_eq!(
                    allowed, !answer,
                    "{name} decided by the view's answer {answer}"
                );
            }
        }
    }
    // bulkWrite asks too, for each of its operations.
    let bulk = OwnedCommand::new(
        "admin",
        rawdoc! {"bulkWrite": 1, "ops": [{"insert": 0, "document": {}}], "nsInfo": [{"ns": "test.c"}]},
    );
    let view = Counting {
        cmd: &bulk,
        asked: std::cell::Cell::new(0),
        answer: true,
    };
    assert!(authorize(Some(&read_write), &view).is_err());
    assert!(view.asked.get() > 0);
}
