//! Client authentication end to end: the stock Rust driver with credentials in the URI
//! (SCRAM-SHA-256, SCRAM-SHA-1, negotiated), users from a users file, the user-management
//! commands through the router, authorization by built-in roles, and mongod's errors.

mod common;

use std::path::PathBuf;

use bson::{doc, Bson, Document};
use common::TestCluster;
use sluice::auth::credentials::{UserDocument, UsersFile};
use sluice::auth::roles::RoleName;
use sluice::auth::scram::{ClientConversation, ScramMechanism};
use sluice::auth::UserName;
use sluice::config::{Authorization, Config};

/// A users file in a fresh directory: alice (root, both mechanisms), bob (read on test,
/// SCRAM-SHA-256 only), carol (readWrite on test, SCRAM-SHA-1 only).
fn users_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-auth-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut users = UsersFile::new();
    for (user, pw, mechs, role, db) in [
        ("alice", "secret", &ScramMechanism::ALL[..], "root", "admin"),
        (
            "bob",
            "bobpw",
            &[ScramMechanism::Sha256][..],
            "read",
            "test",
        ),
        (
            "carol",
            "carolpw",
            &[ScramMechanism::Sha1][..],
            "readWrite",
            "test",
        ),
    ] {
        users
            .insert(
                UserDocument::new_scram(
                    UserName::new(user, "admin"),
                    pw,
                    mechs,
                    vec![RoleName::new(role, db)],
                )
                .unwrap(),
            )
            .unwrap();
    }
    let path = dir.join("users.json");
    std::fs::write(&path, users.to_text()).unwrap();
    path
}

async fn cluster(users: &std::path::Path, authorization: Authorization) -> TestCluster {
    let mut config = Config::default();
    config.security.users_file = Some(users.display().to_string());
    config.security.authorization = authorization;
    TestCluster::start_with(1, &[("test.c", doc! {"_id": "hashed"})], config).await
}

/// Where the suites below run: the layouts a secured deployment of Sluice can take.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// A static-mode router over an embedded shard; the users in the router's users file.
    Static,
    /// `sluice demo --cluster` secured: an embedded config server and a shard server, both
    /// requiring the keyfile, and a `--configdb` router that authenticates to them as
    /// `__system`. The users file is the config server's, which keeps the users in its
    /// `admin.system.users`, where mongos keeps them; the router reads them from there.
    Cluster,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Static => "static",
            Layout::Cluster => "cluster",
        }
    }
}

/// A running deployment of either layout.
enum Deployment {
    Static(TestCluster),
    Cluster(Box<sluice::demo::DemoCluster>),
}

impl Deployment {
    fn addr(&self) -> std::net::SocketAddr {
        match self {
            Deployment::Static(c) => c.addr(),
            Deployment::Cluster(c) => c.routers[0].0.local_addr(),
        }
    }

    /// The user documents the config server's `admin.system.users` holds (`None` in the
    /// static layout, which has no config server).
    fn config_server_users(&self) -> Option<Vec<Document>> {
        match self {
            Deployment::Static(_) => None,
            Deployment::Cluster(c) => {
                Some(c.config_server.service().documents("admin", "system.users"))
            }
        }
    }

    async fn stop(self) {
        match self {
            Deployment::Static(c) => c.stop().await,
            Deployment::Cluster(c) => c.shutdown().await,
        }
    }
}

/// `test.c` sharded on a hashed `_id`, with the users of `users` (a users file) and
/// `authorization`, in `layout`.
async fn deploy(
    layout: Layout,
    users: &std::path::Path,
    authorization: Authorization,
) -> Deployment {
    match layout {
        Layout::Static => Deployment::Static(cluster(users, authorization).await),
        Layout::Cluster => {
            Deployment::Cluster(Box::new(secured_cluster(users, authorization).await))
        }
    }
}

/// The secured cluster layout (see [`Layout::Cluster`]), its keyfile beside `users`.
async fn secured_cluster(
    users: &std::path::Path,
    authorization: Authorization,
) -> sluice::demo::DemoCluster {
    let key = users.with_file_name("keyfile");
    std::fs::write(&key, "c2VjdXJlZC1jbHVzdGVyLWxheW91dC1rZXk\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let mut router = Config {
        listen: "127.0.0.1:0".into(),
        ..Config::default()
    };
    router.security.users_file = Some(users.display().to_string());
    router.security.authorization = authorization;
    router.security.key_file = Some(key.display().to_string());
    let shard = sluice::embedded::ShardOptions {
        key_file: Some(key.display().to_string()),
        internal_security: router.pool_options().unwrap().security,
        ..sluice::embedded::ShardOptions::for_tests()
    };
    let collections = [sluice::config::CollectionConfig {
        ns: "test.c".into(),
        key: r#"{"_id": "hashed"}"#.into(),
        unique: false,
        num_initial_chunks: None,
    }];
    sluice::demo::DemoCluster::start(1, shard, vec![router], vec!["sluice".into()], &collections)
        .await
        .expect("the secured cluster layout starts")
}

async fn client(addr: std::net::SocketAddr, cred: &str, extra: &str) -> mongodb::Client {
    let uri =
        format!("mongodb://{cred}@{addr}/?authSource=admin&serverSelectionTimeoutMS=5000{extra}");
    mongodb::Client::with_uri_str(uri).await.expect("client")
}

fn command_error(e: &mongodb::error::Error) -> (i32, String) {
    match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => (c.code, c.message.clone()),
        ref other => panic!("expected a command error, got {other:?}"),
    }
}

#[tokio::test]
async fn drivers_authenticate_with_each_mechanism_and_negotiated() {
    drivers_authenticate_with_each_mechanism(Layout::Static).await;
}

async fn drivers_authenticate_with_each_mechanism(layout: Layout) {
    let users = users_file(&format!("mechs-{}", layout.name()));
    let c = deploy(layout, &users, Authorization::Enabled).await;
    for (cred, extra) in [
        ("alice:secret", "&authMechanism=SCRAM-SHA-256"),
        ("alice:secret", "&authMechanism=SCRAM-SHA-1"),
        ("alice:secret", ""),
        ("carol:carolpw", ""),
        ("bob:bobpw", ""),
    ] {
        let client = client(c.addr(), cred, extra).await;
        let status = client
            .database("admin")
            .run_command(doc! {"connectionStatus": 1})
            .await
            .unwrap_or_else(|e| panic!("{cred} {extra}: {e}"));
        let info = status.get_document("authInfo").unwrap();
        let user = cred.split(':').next().unwrap();
        assert_eq!(
            info.get_array("authenticatedUsers").unwrap(),
            &vec![Bson::Document(doc! {"user": user, "db": "admin"})],
            "{cred} {extra}"
        );
        assert_eq!(info.get_array("authenticatedUserRoles").unwrap().len(), 1);
    }
    let alice = client(c.addr(), "alice:secret", "").await;
    let coll = alice.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "x": 1}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    c.stop().await;
}

#[tokio::test]
async fn wrong_password_unknown_user_and_mechanism_fail_like_mongod() {
    wrong_credentials_fail_like_mongod(Layout::Static).await;
}

async fn wrong_credentials_fail_like_mongod(layout: Layout) {
    let users = users_file(&format!("wrong-{}", layout.name()));
    let c = deploy(layout, &users, Authorization::Enabled).await;
    for cred in ["alice:nope", "nobody:secret"] {
        let client = client(c.addr(), cred, "&authMechanism=SCRAM-SHA-256").await;
        let e = client
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("Authentication failed."),
            "{cred}: {e}"
        );
    }
    // A user without SCRAM-SHA-1 credentials cannot use it.
    let bob = client(c.addr(), "bob:bobpw", "&authMechanism=SCRAM-SHA-1").await;
    assert!(bob
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .is_err());

    // The same conversation by hand: code 18 and mongod's message, the reason not revealed.
    let anon = common::driver(c.addr(), "").await;
    let admin = anon.database("admin");
    for (user, pw) in [("alice", "nope"), ("nobody", "secret")] {
        let mut conv =
            ClientConversation::new(ScramMechanism::Sha256, user, pw, "fixednonce0123456789")
                .unwrap();
        let start = admin
            .run_command(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
                "payload": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: conv.client_first() }})
            .await;
        let err = match start {
            Err(e) => e,
            Ok(first) => {
                let payload = first.get_binary_generic("payload").unwrap().clone();
                let fin = conv.client_final(&payload).unwrap();
                admin
                    .run_command(doc! {"saslContinue": 1, "conversationId": 1,
                        "payload": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: fin }})
                    .await
                    .unwrap_err()
            }
        };
        assert_eq!(command_error(&err), (18, "Authentication failed.".into()));
    }
    let e = admin
        .run_command(doc! {"saslStart": 1, "mechanism": "PLAIN",
            "payload": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: b"x".to_vec() }})
        .await
        .unwrap_err();
    assert_eq!(
        command_error(&e),
        (
            334,
            "Received authentication for mechanism PLAIN which is unknown or not enabled".into()
        )
    );
    let e = admin
        .run_command(doc! {"saslContinue": 1, "conversationId": 1,
        "payload": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![] }})
        .await
        .unwrap_err();
    assert_eq!(
        command_error(&e),
        (17, "No SASL session state found".into())
    );
    c.stop().await;
}

#[tokio::test]
async fn user_management_through_the_router_keeps_credentials_in_the_file() {
    user_management_through_the_router(Layout::Static).await;
}

async fn user_management_through_the_router(layout: Layout) {
    let users = users_file(&format!("admin-{}", layout.name()));
    let c = deploy(layout, &users, Authorization::Enabled).await;
    let alice = client(c.addr(), "alice:secret", "").await;
    let admin = alice.database("admin");
    admin
        .run_command(doc! {"createUser": "dave", "pwd": "davepw-Secret", "roles": [{"role": "readWrite", "db": "test"}]})
        .await
        .unwrap();
    let text = std::fs::read_to_string(&users).unwrap();
    assert!(text.contains("\"admin.dave\""));
    assert!(
        !text.contains("davepw-Secret"),
        "the password is never stored"
    );
    if let Some(stored) = c.config_server_users() {
        let dave = stored
            .iter()
            .find(|u| u.get_str("_id").ok() == Some("admin.dave"))
            .expect("dave is in the config server's admin.system.users");
        assert!(dave
            .get_document("credentials")
            .unwrap()
            .contains_key("SCRAM-SHA-256"));
        assert!(!format!("{dave}").contains("davepw-Secret"));
    }
    let e = admin
        .run_command(doc! {"createUser": "dave", "pwd": "x", "roles": []})
        .await
        .unwrap_err();
    assert_eq!(
        command_error(&e),
        (51003, "User \"dave@admin\" already exists".into())
    );
    let info = admin.run_command(doc! {"usersInfo": "dave"}).await.unwrap();
    let u = info.get_array("users").unwrap()[0].as_document().unwrap();
    assert_eq!(u.get_str("user").unwrap(), "dave");
    assert!(!u.contains_key("credentials"));

    let dave = client(c.addr(), "dave:davepw-Secret", "").await;
    let coll = dave.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 7}).await.unwrap();

    admin
        .run_command(doc! {"updateUser": "dave", "roles": [{"role": "read", "db": "test"}]})
        .await
        .unwrap();
    // The connection authenticated as dave sees its new roles at once.
    let e = coll.insert_one(doc! {"_id": 8}).await.unwrap_err();
    assert_eq!(command_error(&e).0, 13);
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);

    admin.run_command(doc! {"dropUser": "dave"}).await.unwrap();
    let e = coll.count_documents(doc! {}).await.unwrap_err();
    assert_eq!(
        command_error(&e),
        (13, "Command aggregate requires authentication".into())
    );
    let again = client(c.addr(), "dave:davepw-Secret", "").await;
    assert!(again
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .is_err());
    assert!(!std::fs::read_to_string(&users)
        .unwrap()
        .contains("admin.dave"));
    if let Some(stored) = c.config_server_users() {
        assert!(stored
            .iter()
            .all(|u| u.get_str("_id").ok() != Some("admin.dave")));
    }
    c.stop().await;
}

#[tokio::test]
async fn authorization_refuses_what_the_roles_do_not_grant() {
    authorization_refuses_what_roles_do_not_grant(Layout::Static).await;
}

async fn authorization_refuses_what_roles_do_not_grant(layout: Layout) {
    let users = users_file(&format!("authz-{}", layout.name()));
    let c = deploy(layout, &users, Authorization::Enabled).await;
    let anon = common::driver(c.addr(), "").await;
    // The handshake and ping need no user.
    anon.database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    anon.database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .unwrap();
    let e = anon
        .database("test")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap_err();
    assert_eq!(
        command_error(&e),
        (13, "Command insert requires authentication".into())
    );
    let bob = client(c.addr(), "bob:bobpw", "").await;
    let coll = bob.database("test").collection::<Document>("c");
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 0);
    let e = coll.insert_one(doc! {"_id": 1}).await.unwrap_err();
    let (code, message) = command_error(&e);
    assert_eq!(code, 13);
    assert!(
        message.starts_with("not authorized on test to execute command { insert: \"c\""),
        "{message}"
    );
    let e = bob
        .database("admin")
        .run_command(doc! {"createUser": "x", "pwd": "y", "roles": []})
        .await
        .unwrap_err();
    assert_eq!(command_error(&e).0, 13);
    c.stop().await;
}

#[tokio::test]
async fn without_authorization_users_authenticate_and_nothing_is_checked() {
    let users = users_file("noauthz");
    let c = cluster(&users, Authorization::Disabled).await;
    let anon = common::driver(c.addr(), "").await;
    anon.database("test")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    let bob = client(c.addr(), "bob:bobpw", "").await;
    let status = bob
        .database("admin")
        .run_command(doc! {"connectionStatus": 1, "showPrivileges": true})
        .await
        .unwrap();
    let info = status.get_document("authInfo").unwrap();
    assert_eq!(
        info.get_array("authenticatedUserRoles").unwrap(),
        &vec![Bson::Document(doc! {"role": "read", "db": "test"})]
    );
    assert!(!info
        .get_array("authenticatedUserPrivileges")
        .unwrap()
        .is_empty());
    c.stop().await;
}

/// Each built-in role against a fixed set of commands: allowed (anything but 13) or refused
/// with 13, as mongod decides it.
#[tokio::test]
async fn each_built_in_role_is_allowed_and_refused_what_mongod_allows_and_refuses() {
    each_built_in_role_against_mongods_table(Layout::Static).await;
}

async fn each_built_in_role_against_mongods_table(layout: Layout) {
    // Columns: find test.c, insert test.c, createIndexes test.c, createUser on test,
    // serverStatus, listShards, find other.c, insert other.c.
    const TABLE: &[(&str, &str, [bool; 8])] = &[
        (
            "read",
            "test",
            [true, false, false, false, false, false, false, false],
        ),
        (
            "readWrite",
            "test",
            [true, true, true, false, false, false, false, false],
        ),
        (
            "dbAdmin",
            "test",
            [false, false, true, false, false, false, false, false],
        ),
        (
            "userAdmin",
            "test",
            [false, false, false, true, false, false, false, false],
        ),
        (
            "dbOwner",
            "test",
            [true, true, true, true, false, false, false, false],
        ),
        (
            "clusterMonitor",
            "admin",
            [false, false, false, false, true, true, false, false],
        ),
        (
            "clusterManager",
            "admin",
            [false, false, false, false, false, true, false, false],
        ),
        (
            "clusterAdmin",
            "admin",
            [false, false, false, false, true, true, false, false],
        ),
        (
            "readAnyDatabase",
            "admin",
            [true, false, false, false, false, false, true, false],
        ),
        (
            "readWriteAnyDatabase",
            "admin",
            [true, true, true, false, false, false, true, true],
        ),
        (
            "root",
            "admin",
            [true, true, true, true, true, true, true, true],
        ),
    ];
    let dir = std::env::temp_dir().join(format!(
        "sluice-auth-roles-{}-{}",
        layout.name(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut users = UsersFile::new();
    for (role, db, _) in TABLE {
        users
            .insert(
                UserDocument::new_scram(
                    UserName::new(format!("u_{role}"), "admin"),
                    "pw",
                    &[ScramMechanism::Sha256],
                    vec![RoleName::new(*role, *db)],
                )
                .unwrap(),
            )
            .unwrap();
    }
    let path = dir.join("users.json");
    std::fs::write(&path, users.to_text()).unwrap();
    let c = deploy(layout, &path, Authorization::Enabled).await;
    for (role, _, expected) in TABLE {
        let client = client(c.addr(), &format!("u_{role}:pw"), "").await;
        let commands: [(&str, Document); 8] = [
            ("test", doc! {"find": "c"}),
            ("test", doc! {"insert": "c", "documents": [{"r": *role}]}),
            (
                "test",
                doc! {"createIndexes": "c", "indexes": [{"key": {"x": 1}, "name": "x_1"}]},
            ),
            (
                "test",
                doc! {"createUser": format!("made_by_{role}"), "pwd": "p", "roles": []},
            ),
            ("admin", doc! {"serverStatus": 1}),
            ("admin", doc! {"listShards": 1}),
            ("other", doc! {"find": "c"}),
            ("other", doc! {"insert": "c", "documents": [{"r": *role}]}),
        ];
        for (i, (db, cmd)) in commands.into_iter().enumerate() {
            let name = cmd.keys().next().unwrap().clone();
            let result = client.database(db).run_command(cmd).await;
            let refused = matches!(&result, Err(e) if command_error(e).0 == 13);
            assert_eq!(!refused, expected[i], "{role}: {name} on {db}: {result:?}");
        }
    }
    c.stop().await;
}

/// A client that stops in the middle of a SCRAM conversation, one that replays a finished
/// step, and one that sends a truncated `saslContinue`: each gets mongod's answer or is simply
/// gone, and the router goes on serving everyone else.
#[tokio::test]
async fn broken_conversations_leave_the_router_serving() {
    let users = users_file("broken");
    let c = cluster(&users, Authorization::Enabled).await;
    let bin = |bytes: Vec<u8>| bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes,
    };
    // Stops after saslStart.
    {
        let mut raw = common::Raw::connect(c.addr()).await;
        let conv =
            ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "abcdefghijkl")
                .unwrap();
        let reply = raw
            .command(&doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
            "payload": bin(conv.client_first()), "$db": "admin"})
            .await;
        assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
        drop(raw);
    }
    common::assert_still_serving(c.addr()).await;
    // Truncated client-final, then the conversation is gone.
    let mut raw = common::Raw::connect(c.addr()).await;
    let conv =
        ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "abcdefghijkl").unwrap();
    raw.command(&doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
    "payload": bin(conv.client_first()), "$db": "admin"})
        .await;
    let reply = raw
        .command(&doc! {"saslContinue": 1, "conversationId": 1,
        "payload": bin(b"c=biws,r=abc".to_vec()), "$db": "admin"})
        .await;
    assert_eq!(reply.get_i32("code").unwrap(), 18);
    assert_eq!(reply.get_str("errmsg").unwrap(), "Authentication failed.");
    let reply = raw
        .command(&doc! {"saslContinue": 1, "conversationId": 1,
        "payload": bin(vec![]), "$db": "admin"})
        .await;
    assert_eq!(reply.get_i32("code").unwrap(), 17);
    // Replaying a finished conversation's last step.
    let mut conv =
        ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "abcdefghijkl").unwrap();
    let first = raw
        .command(&doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
        "payload": bin(conv.client_first()), "options": {"skipEmptyExchange": true},
        "$db": "admin"})
        .await;
    let fin = conv
        .client_final(&first.get_binary_generic("payload").unwrap().clone())
        .unwrap();
    let step = doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(fin), "$db": "admin"};
    let done = raw.command(&step).await;
    assert!(done.get_bool("done").unwrap());
    let replay = raw.command(&step).await;
    assert_eq!(replay.get_i32("code").unwrap(), 17);
    // Still authenticated as alice after the refused replay.
    let status = raw
        .command(&doc! {"connectionStatus": 1, "$db": "admin"})
        .await;
    assert_eq!(
        status
            .get_document("authInfo")
            .unwrap()
            .get_array("authenticatedUsers")
            .unwrap()
            .len(),
        1
    );
    // logout ends it.
    raw.command(&doc! {"logout": 1, "$db": "admin"}).await;
    let reply = raw.command(&doc! {"find": "c", "$db": "test"}).await;
    assert_eq!(reply.get_i32("code").unwrap(), 13);
    common::assert_still_serving(c.addr()).await;
    c.stop().await;
}

/// Authenticates a raw connection as `user` (carol with SCRAM-SHA-1, the others with
/// SCRAM-SHA-256), after a `logout`, so one connection can be several users in turn.
async fn raw_login(raw: &mut common::Raw, user: &str, pw: &str) {
    let bin = |bytes: Vec<u8>| bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes,
    };
    raw.command(&doc! {"logout": 1, "$db": "admin"}).await;
    let mechanism = if user == "carol" {
        ScramMechanism::Sha1
    } else {
        ScramMechanism::Sha256
    };
    let mut conv = ClientConversation::new(mechanism, user, pw, "cursorownernonce").unwrap();
    let first = raw
        .command(&doc! {"saslStart": 1, "mechanism": mechanism.name(),
        "payload": bin(conv.client_first()), "options": {"skipEmptyExchange": true},
        "$db": "admin"})
        .await;
    let fin = conv
        .client_final(
            first
                .get_binary_generic("payload")
                .unwrap_or_else(|_| panic!("{user}: {first}")),
        )
        .unwrap();
    let done = raw
        .command(
            &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(fin), "$db": "admin"},
        )
        .await;
    assert!(done.get_bool("done").unwrap(), "{user}: {done}");
}

fn code_and_message(reply: &Document) -> (i32, &str) {
    (
        reply.get_i32("code").unwrap_or(0),
        reply.get_str("errmsg").unwrap_or(""),
    )
}

/// A cursor belongs to the user who opened it, on a sharded collection (the router's own
/// cursor) and on an unsharded one (the shard's cursor passed through): another user's
/// `getMore` and `killCursors` get mongod's 13, the owner goes on, and a holder of
/// `killAnyCursor` may kill it.
#[tokio::test]
async fn cursors_belong_to_the_user_who_opened_them() {
    let users = users_file("cursors");
    let c = cluster(&users, Authorization::Enabled).await;
    let alice = client(c.addr(), "alice:secret", "").await;
    for coll in ["c", "u"] {
        let docs: Vec<Document> = (0..10).map(|i| doc! {"_id": i}).collect();
        alice
            .database("test")
            .collection::<Document>(coll)
            .insert_many(docs)
            .await
            .unwrap();
    }
    let mut raw = common::Raw::connect(c.addr()).await;
    let mut other = common::Raw::connect(c.addr()).await;
    raw_login(&mut other, "bob", "bobpw").await;
    for coll in ["c", "u"] {
        raw_login(&mut raw, "bob", "bobpw").await;
        let found = raw
            .command(&doc! {"find": coll, "batchSize": 2, "$db": "test"})
            .await;
        let id = found.get_document("cursor").unwrap().get_i64("id").unwrap();
        assert_ne!(id, 0, "{found}");
        let get_more = doc! {"getMore": id, "collection": coll, "batchSize": 2, "$db": "test"};

        raw_login(&mut raw, "carol", "carolpw").await;
        let reply = raw.command(&get_more).await;
        let expected = format!("cursor id {id} was not created by the authenticated user");
        assert_eq!(code_and_message(&reply), (13, expected.as_str()), "{coll}");
        let reply = raw
            .command(&doc! {"killCursors": coll, "cursors": [id], "$db": "test"})
            .await;
        let expected = format!("not authorized to kill cursor on test.{coll}");
        assert_eq!(code_and_message(&reply), (13, expected.as_str()), "{coll}");
        raw.command(&doc! {"logout": 1, "$db": "admin"}).await;
        let reply = raw.command(&get_more).await;
        assert_eq!(reply.get_i32("code").unwrap(), 13, "{coll}: {reply}");

        // The owner goes on where it left off, after the refusals.
        raw_login(&mut raw, "bob", "bobpw").await;
        let reply = raw.command(&get_more).await;
        let batch = reply
            .get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap();
        assert_eq!(batch.len(), 2, "{coll}: {reply}");
        if coll == "u" {
            // The same user on another connection (a driver's pool) may go on too.
            let reply = other.command(&get_more).await;
            assert_eq!(reply.get_f64("ok").unwrap(), 1.0, "{reply}");
        }

        // root holds killAnyCursor: it may kill bob's cursor, not read it.
        raw_login(&mut raw, "alice", "secret").await;
        let reply = raw.command(&get_more).await;
        assert_eq!(reply.get_i32("code").unwrap(), 13, "{coll}: {reply}");
        let reply = raw
            .command(&doc! {"killCursors": coll, "cursors": [id], "$db": "test"})
            .await;
        assert_eq!(
            reply.get_array("cursorsKilled").unwrap(),
            &vec![Bson::Int64(id)],
            "{coll}: {reply}"
        );
        raw_login(&mut raw, "bob", "bobpw").await;
        let reply = raw.command(&get_more).await;
        assert_eq!(reply.get_i32("code").unwrap(), 43, "{coll}: {reply}");
    }
    // Drivers page through their own cursors as before.
    let bob = client(c.addr(), "bob:bobpw", "").await;
    for coll in ["c", "u"] {
        let cursor = bob
            .database("test")
            .collection::<Document>(coll)
            .find(doc! {})
            .batch_size(3)
            .await
            .unwrap();
        assert_eq!(common::all(cursor).await.len(), 10, "{coll}");
    }
    c.stop().await;
}

/// `listDatabases` shows a user only the databases it has privileges in, unless it may list
/// them all; `authorizedDatabases: false` without that privilege is mongod's 13.
#[tokio::test]
async fn list_databases_shows_a_user_its_databases() {
    let users = users_file("listdbs");
    let c = cluster(&users, Authorization::Enabled).await;
    let alice = client(c.addr(), "alice:secret", "").await;
    for db in ["test", "other", "third"] {
        alice
            .database(db)
            .collection::<Document>("x")
            .insert_one(doc! {"_id": 1})
            .await
            .unwrap();
    }
    let names = |reply: &Document| -> Vec<String> {
        reply
            .get_array("databases")
            .unwrap()
            .iter()
            .map(|d| {
                d.as_document()
                    .unwrap()
                    .get_str("name")
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let all = alice
        .database("admin")
        .run_command(doc! {"listDatabases": 1})
        .await
        .unwrap();
    for db in ["test", "other", "third"] {
        assert!(names(&all).contains(&db.to_string()), "{all}");
    }
    // root asking for its authorized databases sees them all too (any database).
    let mine = alice
        .database("admin")
        .run_command(doc! {"listDatabases": 1, "authorizedDatabases": true, "nameOnly": true})
        .await
        .unwrap();
    assert!(names(&mine).contains(&"third".to_string()), "{mine}");

    let bob = client(c.addr(), "bob:bobpw", "").await;
    let admin = bob.database("admin");
    let reply = admin.run_command(doc! {"listDatabases": 1}).await.unwrap();
    assert_eq!(names(&reply), vec!["test".to_string()], "{reply}");
    let size = reply.get_array("databases").unwrap()[0]
        .as_document()
        .unwrap()
        .get_i64("sizeOnDisk")
        .unwrap();
    assert_eq!(reply.get_i64("totalSize").unwrap(), size, "{reply}");
    let reply = admin
        .run_command(doc! {"listDatabases": 1, "nameOnly": true})
        .await
        .unwrap();
    assert_eq!(
        reply.get_array("databases").unwrap(),
        &vec![Bson::Document(doc! {"name": "test"})]
    );
    let e = admin
        .run_command(doc! {"listDatabases": 1, "authorizedDatabases": false})
        .await
        .unwrap_err();
    assert_eq!(
        command_error(&e),
        (13, "Insufficient permissions to list all databases".into())
    );
    // The driver's own call reads the same filtered list.
    assert_eq!(
        bob.list_database_names().await.unwrap(),
        vec!["test".to_string()]
    );
    c.stop().await;
}

/// An admin-only command on another database is mongod's 13 whether or not authorization is
/// enabled.
#[tokio::test]
async fn admin_only_commands_need_the_admin_database_without_authorization_too() {
    let users = users_file("adminonly");
    for authorization in [Authorization::Disabled, Authorization::Enabled] {
        let c = cluster(&users, authorization).await;
        let alice = client(c.addr(), "alice:secret", "").await;
        let anon = common::driver(c.addr(), "").await;
        for (who, client) in [("alice", &alice), ("anonymous", &anon)] {
            for cmd in [
                doc! {"listDatabases": 1},
                doc! {"getParameter": 1, "featureCompatibilityVersion": 1},
                doc! {"shardCollection": "test.x", "key": {"_id": 1}},
                doc! {"renameCollection": "test.a", "to": "test.b"},
            ] {
                let name = cmd.keys().next().unwrap().clone();
                let e = client
                    .database("test")
                    .run_command(cmd.clone())
                    .await
                    .unwrap_err();
                assert_eq!(
                    command_error(&e),
                    (
                        13,
                        format!("{name} may only be run against the admin database.")
                    ),
                    "{who} {authorization:?}"
                );
            }
            if authorization == Authorization::Disabled || who == "alice" {
                client
                    .database("admin")
                    .run_command(doc! {"listDatabases": 1})
                    .await
                    .unwrap();
            }
        }
        c.stop().await;
    }
}

/// Static mode: custom roles are kept in the roles file beside the users file, resolve
/// through inheritance, restrict their holders to their privileges, and are read back after a
/// restart; without a roles file beside a users file, `createRole` is refused.
#[tokio::test]
async fn custom_roles_in_static_mode_are_kept_in_the_roles_file() {
    let users = users_file("custom-roles");
    let roles = users.with_file_name("roles.json");
    let mut config = Config::default();
    config.security.users_file = Some(users.display().to_string());
    config.security.authorization = Authorization::Enabled;
    let c = TestCluster::start_with(1, &[], config.clone()).await;
    let alice = client(c.addr(), "alice:secret", "").await;
    let e = alice
        .database("test")
        .run_command(doc! {"createRole": "findC", "privileges": [], "roles": []})
        .await
        .unwrap_err();
    assert_eq!(command_error(&e).0, 20, "no roles file: {e}");
    c.stop().await;

    config.security.roles_file = Some(roles.display().to_string());
    let c = TestCluster::start_with(1, &[], config.clone()).await;
    let alice = client(c.addr(), "alice:secret", "").await;
    let test = alice.database("test");
    test.collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    test.run_command(doc! {
        "createRole": "findC",
        "privileges": [{"resource": {"db": "test", "collection": "c"}, "actions": ["find"]}],
        "roles": [],
    })
    .await
    .expect("createRole");
    test.run_command(doc! {"createRole": "reader", "privileges": [], "roles": ["findC"]})
        .await
        .expect("createRole inheriting");
    alice
        .database("admin")
        .run_command(doc! {"createUser": "dave", "pwd": "davepw", "roles": [{"role": "reader", "db": "test"}]})
        .await
        .expect("createUser with a custom role");
    let text = std::fs::read_to_string(&roles).expect("the roles file is written");
    assert!(text.contains("\"test.findC\""), "{text}");
    c.stop().await;

    // After a restart (of the router and its shards, which keep their data in memory) the
    // roles are read back and enforced.
    let c = TestCluster::start_with(1, &[], config).await;
    let dave = client(c.addr(), "dave:davepw", "").await;
    let coll = |db: &str, name: &str| dave.database(db).collection::<Document>(name);
    coll("test", "c")
        .find_one(doc! {})
        .await
        .expect("find on test.c");
    for e in [
        coll("test", "d").find_one(doc! {}).await.unwrap_err(),
        coll("test", "c")
            .insert_one(doc! {"_id": 2})
            .await
            .unwrap_err(),
        coll("other", "c").find_one(doc! {}).await.unwrap_err(),
    ] {
        assert_eq!(command_error(&e).0, 13, "{e}");
    }
    c.stop().await;
}

/// `authenticationRestrictions` are enforced at authentication, as on mongod: a user whose own
/// restrictions, or whose roles' restrictions, this connection's client or server address
/// does not meet cannot authenticate (18, the reason kept from the client); one whose
/// restrictions are met can; a user given restrictions it no longer meets is logged out.
#[tokio::test]
async fn authentication_restrictions_decide_who_may_authenticate_from_where() {
    let users = users_file("restrictions");
    let roles = users.with_file_name("roles.json");
    let mut config = Config::default();
    config.security.users_file = Some(users.display().to_string());
    config.security.roles_file = Some(roles.display().to_string());
    config.security.authorization = Authorization::Enabled;
    let c = TestCluster::start_with(1, &[], config).await;
    let alice = client(c.addr(), "alice:secret", "").await;
    let admin = alice.database("admin");
    let read = doc! {"role": "read", "db": "test"};
    for (user, restrictions) in [
        (
            "here",
            vec![doc! {"clientSource": ["127.0.0.0/8"], "serverAddress": ["127.0.0.1"]}],
        ),
        (
            "either",
            vec![
                doc! {"clientSource": ["10.0.0.0/8"]},
                doc! {"clientSource": ["127.0.0.1"]},
            ],
        ),
        ("away", vec![doc! {"clientSource": ["10.0.0.0/8"]}]),
        ("otherserver", vec![doc! {"serverAddress": ["127.0.0.2"]}]),
        ("unrestricted", vec![]),
    ] {
        admin
            .run_command(doc! {"createUser": user, "pwd": "pw", "roles": [read.clone()], "authenticationRestrictions": restrictions})
            .await
            .unwrap();
    }
    admin
        .run_command(doc! {"createRole": "remoteOnly", "privileges": [], "roles": [read.clone()], "authenticationRestrictions": [{"clientSource": ["10.0.0.0/8"]}]})
        .await
        .unwrap();
    admin
        .run_command(
            doc! {"createRole": "inheritsRemoteOnly", "privileges": [], "roles": ["remoteOnly"]},
        )
        .await
        .unwrap();
    admin
        .run_command(doc! {"createUser": "viarole", "pwd": "pw", "roles": ["inheritsRemoteOnly"]})
        .await
        .unwrap();

    let ping = |user: &'static str| {
        let addr = c.addr();
        async move {
            client(addr, &format!("{user}:pw"), "")
                .await
                .database("admin")
                .run_command(doc! {"ping": 1})
                .await
        }
    };
    for user in ["here", "either", "unrestricted"] {
        ping(user).await.unwrap_or_else(|e| panic!("{user}: {e}"));
    }
    for user in ["away", "otherserver", "viarole"] {
        let e = ping(user).await.unwrap_err();
        let text = format!("{e}");
        assert!(
            text.contains("Authentication failed") && text.contains("18"),
            "{user}: {text}"
        );
        assert!(
            !text.contains("restriction"),
            "the reason stays in the log: {text}"
        );
    }

    // Restrictions added to a user this connection does not meet log it out.
    let here = client(c.addr(), "here:pw", "").await;
    let coll = here.database("test").collection::<Document>("c");
    coll.count_documents(doc! {}).await.unwrap();
    admin
        .run_command(doc! {"updateUser": "here", "authenticationRestrictions": [{"clientSource": ["10.0.0.0/8"]}]})
        .await
        .unwrap();
    let e = coll.count_documents(doc! {}).await.unwrap_err();
    assert_eq!(command_error(&e).0, 13, "{e}");
    c.stop().await;
}

/// `shutdown` through the router with authorization on: refused (13) to a client without the
/// `shutdown` privilege, who leaves the router serving; a root user's stops the router (the
/// connection closes without a reply, the listener closes) and no shard.
#[tokio::test]
async fn shutdown_needs_the_shutdown_privilege_and_stops_only_the_router() {
    let users = users_file("shutdown");
    let c = cluster(&users, Authorization::Enabled).await;
    let anon = common::driver(c.addr(), "").await;
    let e = anon
        .database("admin")
        .run_command(doc! {"shutdown": 1})
        .await
        .unwrap_err();
    assert_eq!(command_error(&e).0, 13);
    let bob = client(c.addr(), "bob:bobpw", "").await;
    let e = bob
        .database("admin")
        .run_command(doc! {"shutdown": 1})
        .await
        .unwrap_err();
    assert_eq!(command_error(&e).0, 13);
    bob.database("test")
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .expect("the router still serves");
    let alice = client(c.addr(), "alice:secret", "").await;
    let e = alice
        .database("admin")
        .run_command(doc! {"shutdown": 1})
        .await
        .expect_err("the router closes the connection without a reply");
    assert!(
        !matches!(*e.kind, mongodb::error::ErrorKind::Command(_)),
        "{e:?}"
    );
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while tokio::net::TcpStream::connect(c.addr()).await.is_ok() {
        assert!(
            std::time::Instant::now() < limit,
            "the router still listens"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    common::assert_still_serving(c.shards[0].local_addr()).await;
    c.stop().await;
}

/// A `hello` through the router answers the same fields, in the same order and with the same
/// values (the clock, the cluster time and the connection's id aside), before and after the
/// connection authenticates; one carrying a speculative SCRAM `saslStart` gets those fields and
/// `speculativeAuthenticate` last, and the conversation it starts finishes with
/// `saslContinue`, authenticating the connection.
#[tokio::test]
async fn hello_replies_are_unchanged_by_authentication_and_speculative_authentication_works() {
    let users = users_file("hello");
    let c = cluster(&users, Authorization::Enabled).await;
    let bin = |bytes: Vec<u8>| bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes,
    };
    // The fields that read the clock or name the connection.
    let stable = |d: &Document| -> Vec<(String, Bson)> {
        d.iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "localTime" | "$clusterTime" | "operationTime" | "connectionId"
                )
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let keys = |d: &Document| -> Vec<String> { d.keys().cloned().collect() };
    let hello = doc! {"hello": 1, "helloOk": true, "$db": "admin"};
    let mut raw = common::Raw::connect(c.addr()).await;
    let before = raw.command(&hello).await;
    assert_eq!(before.get_f64("ok").unwrap(), 1.0, "{before}");
    assert_eq!(before.get_str("msg").unwrap(), "isdbgrid");

    let mut speculative = common::Raw::connect(c.addr()).await;
    let mut conv =
        ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "hellononce").unwrap();
    let mut with_spec = hello.clone();
    with_spec.insert(
        "speculativeAuthenticate",
        doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(conv.client_first()),
        "options": {"skipEmptyExchange": true}, "db": "admin"},
    );
    let first = speculative.command(&with_spec).await;
    let mut expected = keys(&before);
    expected.push("speculativeAuthenticate".into());
    assert_eq!(keys(&first), expected);
    assert_eq!(stable(&first)[..stable(&before).len()], stable(&before)[..]);
    let spec = first.get_document("speculativeAuthenticate").unwrap();
    assert_eq!(spec.get_i32("conversationId").unwrap(), 1);
    let fin = conv
        .client_final(spec.get_binary_generic("payload").unwrap())
        .unwrap();
    let done = speculative
        .command(
            &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(fin), "$db": "admin"},
        )
        .await;
    assert!(done.get_bool("done").unwrap(), "{done}");
    let status = speculative
        .command(&doc! {"connectionStatus": 1, "$db": "admin"})
        .await;
    let users_now = status
        .get_document("authInfo")
        .unwrap()
        .get_array("authenticatedUsers")
        .unwrap();
    assert_eq!(users_now.len(), 1, "{status}");

    // After authenticating, on both connections, the same hello as before.
    raw_login(&mut raw, "alice", "secret").await;
    for conn in [&mut raw, &mut speculative] {
        let after = conn.command(&hello).await;
        assert_eq!(keys(&after), keys(&before));
        assert_eq!(stable(&after), stable(&before));
    }
    c.stop().await;
}

/// Runs a command that must succeed.
async fn run(db: &mongodb::Database, cmd: Document) {
    db.run_command(cmd.clone())
        .await
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
}

/// A user's privileges are resolved once and shared by its logins until the users or roles
/// change; every change of the user, or of a role it holds or inherits, is seen by the next
/// login (and by an open connection at its next command) exactly as without a cache. Each
/// step logs `dave` in afresh after the change, so a login answered from a resolution made
/// before the change fails the step.
#[tokio::test]
async fn every_user_and_role_change_is_seen_by_the_next_login_of_a_user_already_resolved() {
    let users = users_file("user-cache");
    let roles = users.with_file_name("roles.json");
    let mut config = Config::default();
    config.security.users_file = Some(users.display().to_string());
    config.security.roles_file = Some(roles.display().to_string());
    config.security.authorization = Authorization::Enabled;
    let c = TestCluster::start_with(1, &[], config).await;
    let alice = client(c.addr(), "alice:secret", "").await;
    let admin = alice.database("admin");
    let test = alice.database("test");
    for coll in ["c", "d"] {
        test.collection::<Document>(coll)
            .insert_one(doc! {"_id": 0})
            .await
            .unwrap();
    }
    run(
        &test,
        doc! {
            "createRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "c"}, "actions": ["find"]}],
            "roles": [],
        },
    )
    .await;
    run(
        &test,
        doc! {"createRole": "reader", "privileges": [], "roles": ["findC"]},
    )
    .await;
    run(
        &admin,
        doc! {"createUser": "dave", "pwd": "davepw", "roles": [{"role": "reader", "db": "test"}]},
    )
    .await;

    // What a fresh login of dave may do: find on test.c, test.d, insert into test.c.
    let addr = c.addr();
    let dave_can = move || async move {
        let dave = client(addr, "dave:davepw", "").await;
        let test = dave.database("test");
        let find = |coll: &str| {
            let coll = test.collection::<Document>(coll);
            async move { coll.find_one(doc! {}).await.is_ok() }
        };
        (
            find("c").await,
            find("d").await,
            test.collection::<Document>("c")
                .insert_one(doc! {})
                .await
                .is_ok(),
        )
    };
    assert_eq!(dave_can().await, (true, false, false), "as created");
    assert_eq!(dave_can().await, (true, false, false), "a second login");
    // An open connection of dave's, which must follow the changes at its next command.
    let open = client(addr, "dave:davepw", "").await;
    let open_d = open.database("test").collection::<Document>("d");
    assert!(open_d.find_one(doc! {}).await.is_err());

    // A privilege granted to a role dave inherits.
    run(
        &test,
        doc! {
            "grantPrivilegesToRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "d"}, "actions": ["find"]}],
        },
    )
    .await;
    assert_eq!(
        dave_can().await,
        (true, true, false),
        "grantPrivilegesToRole"
    );
    open_d
        .find_one(doc! {})
        .await
        .expect("the open connection too");

    // The inherited role rewritten: test.d only.
    run(
        &test,
        doc! {
            "updateRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "d"}, "actions": ["find"]}],
        },
    )
    .await;
    assert_eq!(dave_can().await, (false, true, false), "updateRole");

    // A privilege revoked from it.
    run(
        &test,
        doc! {
            "revokePrivilegesFromRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "d"}, "actions": ["find"]}],
        },
    )
    .await;
    assert_eq!(
        dave_can().await,
        (false, false, false),
        "revokePrivilegesFromRole"
    );
    assert!(
        open_d.find_one(doc! {}).await.is_err(),
        "the open connection too"
    );

    // A role granted to the role dave holds.
    run(
        &test,
        doc! {"grantRolesToRole": "reader", "roles": ["readWrite"]},
    )
    .await;
    assert_eq!(dave_can().await, (true, true, true), "grantRolesToRole");
    run(
        &test,
        doc! {"revokeRolesFromRole": "reader", "roles": ["readWrite"]},
    )
    .await;
    assert_eq!(
        dave_can().await,
        (false, false, false),
        "revokeRolesFromRole"
    );

    // Roles granted to and revoked from the user itself.
    run(
        &admin,
        doc! {"grantRolesToUser": "dave", "roles": [{"role": "read", "db": "test"}]},
    )
    .await;
    assert_eq!(dave_can().await, (true, true, false), "grantRolesToUser");
    run(
        &admin,
        doc! {"revokeRolesFromUser": "dave", "roles": [{"role": "read", "db": "test"}]},
    )
    .await;
    assert_eq!(
        dave_can().await,
        (false, false, false),
        "revokeRolesFromUser"
    );
    run(
        &admin,
        doc! {"updateUser": "dave", "roles": [{"role": "readWrite", "db": "test"}]},
    )
    .await;
    assert_eq!(dave_can().await, (true, true, true), "updateUser");

    // Dropped and created again with other roles.
    run(&admin, doc! {"dropUser": "dave"}).await;
    assert!(
        open_d.find_one(doc! {}).await.is_err(),
        "a dropped user is logged out"
    );
    run(
        &admin,
        doc! {"createUser": "dave", "pwd": "davepw", "roles": [{"role": "reader", "db": "test"}]},
    )
    .await;
    run(
        &test,
        doc! {
            "grantPrivilegesToRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "c"}, "actions": ["find"]}],
        },
    )
    .await;
    assert_eq!(
        dave_can().await,
        (true, false, false),
        "dropUser, createUser"
    );

    // A role dave inherits dropped.
    run(&test, doc! {"dropRole": "findC"}).await;
    assert_eq!(dave_can().await, (false, false, false), "dropRole");

    // Restrictions put on a role dave inherits: he may no longer log in from here.
    run(&test, doc! {"updateRole": "reader", "authenticationRestrictions": [{"clientSource": ["10.0.0.0/8"]}]}).await;
    let e = client(addr, "dave:davepw", "")
        .await
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert!(format!("{e}").contains("Authentication failed"), "{e}");
    c.stop().await;
}

/// A write that sets `bypassDocumentValidation` needs the `bypassDocumentValidation` action:
/// without it (`readWrite`) the write is 13 Unauthorized with mongod's message, whether the
/// flag is `true` or a truthy number, and the same write without the flag, or with it false,
/// passes; a user holding the action (`root`) may set it.
#[tokio::test]
async fn bypassing_document_validation_without_the_privilege_is_unauthorized() {
    let users = users_file("bypass");
    let c = cluster(&users, Authorization::Enabled).await;
    let carol = client(c.addr(), "carol:carolpw", "").await;
    let test = carol.database("test");
    let coll = test.collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1}).await.expect("no flag");
    coll.insert_one(doc! {"_id": 2})
        .bypass_document_validation(false)
        .await
        .expect("the flag false");
    let e = coll
        .insert_one(doc! {"_id": 3})
        .bypass_document_validation(true)
        .await
        .unwrap_err();
    let (code, message) = command_error(&e);
    assert_eq!(code, 13, "{e}");
    assert!(
        message.starts_with("not authorized on test to execute command { insert: \"c\""),
        "{message}"
    );
    for cmd in [
        doc! {"insert": "c", "documents": [{"_id": 4}], "bypassDocumentValidation": 1},
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"x": 1}}}], "bypassDocumentValidation": true},
        doc! {"findAndModify": "c", "query": {"_id": 1}, "update": {"$set": {"x": 2}}, "bypassDocumentValidation": true},
    ] {
        let e = test.run_command(cmd.clone()).await.unwrap_err();
        assert_eq!(command_error(&e).0, 13, "{cmd}: {e}");
    }
    test.run_command(doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"x": 1}}}], "bypassDocumentValidation": false})
        .await
        .expect("update with the flag false");
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 2);
    let alice = client(c.addr(), "alice:secret", "").await;
    alice
        .database("test")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 5})
        .bypass_document_validation(true)
        .await
        .expect("root may bypass validation");
    c.stop().await;
}

/// The suites above that cover SCRAM-SHA-1 and SCRAM-SHA-256, mongod's authentication errors,
/// the user commands through the router and the role checks, run again in the secured cluster
/// layout: the users on the config server, every server behind the router requiring the
/// keyfile.
mod cluster_layout {
    use super::Layout;

    #[tokio::test]
    async fn drivers_authenticate_with_each_mechanism_and_negotiated() {
        super::drivers_authenticate_with_each_mechanism(Layout::Cluster).await;
    }

    #[tokio::test]
    async fn wrong_password_unknown_user_and_mechanism_fail_like_mongod() {
        super::wrong_credentials_fail_like_mongod(Layout::Cluster).await;
    }

    #[tokio::test]
    async fn user_management_through_the_router_keeps_users_on_the_config_server() {
        super::user_management_through_the_router(Layout::Cluster).await;
    }

    #[tokio::test]
    async fn authorization_refuses_what_the_roles_do_not_grant() {
        super::authorization_refuses_what_roles_do_not_grant(Layout::Cluster).await;
    }

    #[tokio::test]
    async fn each_built_in_role_is_allowed_and_refused_what_mongod_allows_and_refuses() {
        super::each_built_in_role_against_mongods_table(Layout::Cluster).await;
    }
}
