//! Users and custom roles of a `--configdb` cluster: kept on the config server's
//! `admin.system.users` / `admin.system.roles`, changed through any router, seen by every
//! router after at most its user cache period, and enforced by each (two routers, one config
//! server, one shard, all embedded).

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use sluice::config::{Authorization, Config, SecurityConfig};
use sluice::embedded::ShardOptions;

/// Two routers with authorization on, reading the users every second.
async fn cluster() -> sluice::demo::DemoCluster {
    cluster_reading_users_every(1).await
}

/// Two routers with authorization on, reading the users every `secs` seconds.
async fn cluster_reading_users_every(secs: u64) -> sluice::demo::DemoCluster {
    let configs = (0..2)
        .map(|_| Config {
            listen: "127.0.0.1:0".into(),
            security: SecurityConfig {
                authorization: Authorization::Enabled,
                user_cache_invalidation_interval_secs: Some(secs),
                ..SecurityConfig::default()
            },
            ..Config::default()
        })
        .collect();
    sluice::demo::DemoCluster::start(
        1,
        ShardOptions::for_tests(),
        configs,
        vec!["sluice".into()],
        &[],
    )
    .await
    .expect("the embedded cluster starts")
}

fn router(c: &sluice::demo::DemoCluster, i: usize) -> std::net::SocketAddr {
    c.routers[i].0.local_addr()
}

async fn client(addr: std::net::SocketAddr, cred: &str, source: &str) -> mongodb::Client {
    let uri = format!(
        "mongodb://{cred}{addr}/?authSource={source}&serverSelectionTimeoutMS=3000&directConnection=true"
    );
    mongodb::Client::with_uri_str(uri).await.expect("client")
}

fn code(e: &mongodb::error::Error) -> i32 {
    common::error_code(e)
}

/// Runs `f` until it returns `Some`, for at most `limit`.
async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `user:pw` authenticates on `addr` (a fresh client: a fresh connection).
async fn authenticates(addr: std::net::SocketAddr, user: &str, pw: &str, source: &str) -> bool {
    let c = client(addr, &format!("{user}:{pw}@"), source).await;
    c.database(source)
        .run_command(doc! {"ping": 1})
        .await
        .is_ok()
}

async fn users_info(c: &mongodb::Client) -> Vec<Document> {
    let reply = c
        .database("admin")
        .run_command(doc! {"usersInfo": {"forAllDBs": true}})
        .await
        .expect("usersInfo");
    reply
        .get_array("users")
        .unwrap()
        .iter()
        .map(|u| u.as_document().unwrap().clone())
        .collect()
}

#[tokio::test]
async fn users_created_through_one_router_authenticate_on_the_other() {
    let c = cluster().await;
    let (a, b) = (router(&c, 0), router(&c, 1));
    // The first user, through router A's localhost exception.
    let anonymous = client(a, "", "admin").await;
    anonymous
        .database("admin")
        .run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]})
        .await
        .expect("createUser through the localhost exception");

    // It is stored on the config server, with SCRAM credentials and no password.
    let config_server = common::direct(c.config_server.local_addr()).await;
    let stored = config_server
        .database("admin")
        .collection::<Document>("system.users")
        .find_one(doc! {"_id": "admin.admin"})
        .await
        .unwrap()
        .expect("admin.admin is in the config server's admin.system.users");
    assert!(stored
        .get_document("credentials")
        .unwrap()
        .contains_key("SCRAM-SHA-256"));
    assert!(!format!("{stored}").contains("adminpw"));

    // Router A sees its own change at once; router B within its cache period.
    assert!(authenticates(a, "admin", "adminpw", "admin").await);
    let seen = eventually(Duration::from_secs(5), || async {
        authenticates(b, "admin", "adminpw", "admin")
            .await
            .then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "router B never authenticated the user made through A"
    );

    // A user created through B, with a role on test, works through A.
    let root_b = client(b, "admin:adminpw@", "admin").await;
    root_b
        .database("test")
        .run_command(doc! {"createUser": "alice", "pwd": "alicepw", "roles": ["read"]})
        .await
        .expect("createUser through B");
    let root_a = client(a, "admin:adminpw@", "admin").await;
    let alice_a = eventually(Duration::from_secs(5), || async {
        let alice = client(a, "alice:alicepw@", "test").await;
        alice
            .database("test")
            .run_command(doc! {"ping": 1})
            .await
            .ok()
            .map(|_| alice)
    })
    .await
    .expect("router A authenticates alice made through B");
    let e = alice_a
        .database("test")
        .collection::<Document>("c")
        .insert_one(doc! {"x": 1})
        .await
        .unwrap_err();
    assert_eq!(code(&e), 13, "read may not insert: {e}");
    alice_a
        .database("test")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect("read may find");

    // usersInfo agrees through either router.
    let through_a = users_info(&root_a).await;
    let through_b = users_info(&root_b).await;
    assert_eq!(through_a, through_b);
    let ids: Vec<&str> = through_a
        .iter()
        .map(|u| u.get_str("_id").unwrap())
        .collect();
    assert_eq!(ids, ["admin.admin", "test.alice"]);

    // A duplicate is the config server's error, through either router.
    let e = root_a
        .database("test")
        .run_command(doc! {"createUser": "alice", "pwd": "x", "roles": []})
        .await
        .unwrap_err();
    assert_eq!(code(&e), 51003, "{e}");

    // Roles granted through A reach alice's connection on A at once...
    root_a
        .database("test")
        .run_command(doc! {"grantRolesToUser": "alice", "roles": ["readWrite"]})
        .await
        .expect("grantRolesToUser");
    alice_a
        .database("test")
        .collection::<Document>("c")
        .insert_one(doc! {"x": 2})
        .await
        .expect("readWrite may insert");

    // ...and dropping alice through B ends her authentication on A within the period.
    root_b
        .database("test")
        .run_command(doc! {"dropUser": "alice"})
        .await
        .expect("dropUser through B");
    let refused = eventually(Duration::from_secs(5), || async {
        match alice_a
            .database("test")
            .collection::<Document>("c")
            .find_one(doc! {})
            .await
        {
            Err(e) if code(&e) == 13 => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "a dropped user kept its access on router A"
    );
    assert!(!authenticates(a, "alice", "alicepw", "test").await);
    c.shutdown().await;
}

#[tokio::test]
async fn custom_roles_are_kept_on_the_config_server_and_enforced_by_every_router() {
    let c = cluster().await;
    let (a, b) = (router(&c, 0), router(&c, 1));
    client(a, "", "admin")
        .await
        .database("admin")
        .run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]})
        .await
        .expect("the first user");
    let root_a = client(a, "admin:adminpw@", "admin").await;
    root_a
        .database("test")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    root_a
        .database("test")
        .collection::<Document>("d")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    // findC: find on test.c only; reader inherits it.
    root_a
        .database("test")
        .run_command(doc! {
            "createRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "c"}, "actions": ["find"]}],
            "roles": [],
        })
        .await
        .expect("createRole");
    root_a
        .database("test")
        .run_command(doc! {"createRole": "reader", "privileges": [], "roles": ["findC"]})
        .await
        .expect("createRole inheriting a custom role");
    let e = root_a
        .database("test")
        .run_command(doc! {"grantRolesToRole": "findC", "roles": ["reader"]})
        .await
        .unwrap_err();
    assert_eq!(code(&e), 172, "a cycle is refused: {e}");
    root_a
        .database("test")
        .run_command(doc! {"createUser": "bob", "pwd": "bobpw", "roles": ["reader"]})
        .await
        .expect("createUser with a custom role");

    // The role is the config server's.
    let config_server = common::direct(c.config_server.local_addr()).await;
    let stored = config_server
        .database("admin")
        .collection::<Document>("system.roles")
        .find_one(doc! {"_id": "test.findC"})
        .await
        .unwrap()
        .expect("test.findC in the config server's admin.system.roles");
    assert_eq!(stored.get_str("role").unwrap(), "findC");

    // Through router B: bob reads test.c and nothing else, and writes nothing.
    let bob = eventually(Duration::from_secs(5), || async {
        let bob = client(b, "bob:bobpw@", "test").await;
        bob.database("test")
            .run_command(doc! {"ping": 1})
            .await
            .ok()
            .map(|_| bob)
    })
    .await
    .expect("router B authenticates bob");
    let coll = |name: &str| bob.database("test").collection::<Document>(name);
    assert_eq!(
        coll("c").find_one(doc! {}).await.expect("find on test.c"),
        Some(doc! {"_id": 1})
    );
    let e = coll("d").find_one(doc! {}).await.unwrap_err();
    assert_eq!(code(&e), 13, "find on test.d: {e}");
    let e = coll("c").insert_one(doc! {"_id": 2}).await.unwrap_err();
    assert_eq!(code(&e), 13, "insert into test.c: {e}");
    let e = bob
        .database("other")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap_err();
    assert_eq!(code(&e), 13, "find on other.c: {e}");

    // rolesInfo agrees through either router.
    let root_b = client(b, "admin:adminpw@", "admin").await;
    let info = |c: mongodb::Client| async move {
        c.database("test")
            .run_command(doc! {"rolesInfo": "reader", "showPrivileges": true})
            .await
            .expect("rolesInfo")
            .get_array("roles")
            .unwrap()
            .clone()
    };
    let (ia, ib) = (info(root_a.clone()).await, info(root_b.clone()).await);
    assert_eq!(ia, ib);
    let r = ia[0].as_document().unwrap();
    assert_eq!(
        r.get_array("inheritedRoles").unwrap(),
        &vec![Bson::Document(doc! {"role": "findC", "db": "test"})]
    );

    // A privilege granted through B reaches bob on B at once; revoked through A, it is gone
    // on B within the period.
    root_b
        .database("test")
        .run_command(doc! {
            "grantPrivilegesToRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "d"}, "actions": ["find"]}],
        })
        .await
        .expect("grantPrivilegesToRole");
    coll("d")
        .find_one(doc! {})
        .await
        .expect("find on test.d after the grant");
    root_a
        .database("test")
        .run_command(doc! {"dropRole": "findC"})
        .await
        .expect("dropRole");
    let refused = eventually(Duration::from_secs(5), || async {
        match coll("c").find_one(doc! {}).await {
            Err(e) if code(&e) == 13 => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "a dropped role kept granting on router B"
    );
    c.shutdown().await;
}

/// The cluster layout given a users file (as `sluice demo` with `security.users_file`): the
/// config server holds it, every router authenticates its users, and a user created through a
/// router is written to it.
#[tokio::test]
async fn a_users_file_given_to_the_cluster_layout_is_the_config_servers() {
    use sluice::auth::credentials::{UserDocument, UsersFile};
    use sluice::auth::roles::RoleName;
    use sluice::auth::scram::ScramMechanism;
    use sluice::auth::UserName;
    let dir = std::env::temp_dir().join(format!("sluice-cluster-users-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("users.json");
    let mut users = UsersFile::new();
    users
        .insert(
            UserDocument::new_scram(
                UserName::new("admin", "admin"),
                "adminpw",
                &ScramMechanism::ALL,
                vec![RoleName::new("root", "admin")],
            )
            .unwrap(),
        )
        .unwrap();
    std::fs::write(&path, users.to_text()).unwrap();
    let configs = (0..2)
        .map(|_| Config {
            listen: "127.0.0.1:0".into(),
            security: SecurityConfig {
                authorization: Authorization::Enabled,
                users_file: Some(path.display().to_string()),
                user_cache_invalidation_interval_secs: Some(1),
                ..SecurityConfig::default()
            },
            ..Config::default()
        })
        .collect();
    let c = sluice::demo::DemoCluster::start(
        1,
        ShardOptions::for_tests(),
        configs,
        vec!["sluice".into()],
        &[],
    )
    .await
    .expect("the embedded cluster starts");
    for i in 0..2 {
        let addr = router(&c, i);
        let ok = eventually(Duration::from_secs(5), || async {
            authenticates(addr, "admin", "adminpw", "admin")
                .await
                .then_some(())
        })
        .await;
        assert!(ok.is_some(), "router {i} authenticates the file's user");
    }
    client(router(&c, 1), "admin:adminpw@", "admin")
        .await
        .database("test")
        .run_command(doc! {"createUser": "erin", "pwd": "erinpw", "roles": ["read"]})
        .await
        .expect("createUser");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"test.erin\""), "{text}");
    assert!(!text.contains("erinpw"));
    assert!(authenticates(router(&c, 1), "erin", "erinpw", "test").await);
    c.shutdown().await;
}

/// A router reads a user it does not hold from the config server when a client authenticates
/// as it (mongos fetches a user missing from its cache), and keeps a user it holds until its
/// period or `invalidateUserCache` (mongos's command) makes it read the users again.
#[tokio::test]
async fn routers_fetch_unknown_users_at_once_and_reread_known_ones_on_invalidate_user_cache() {
    let c = cluster_reading_users_every(3600).await;
    let (a, b) = (router(&c, 0), router(&c, 1));
    let first = doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]};
    client(a, "", "admin")
        .await
        .database("admin")
        .run_command(first.clone())
        .await
        .expect("the first user, through A");
    // B read the config server when it started, before the user existed: it fetches the user
    // when a client authenticates as it.
    assert!(authenticates(b, "admin", "adminpw", "admin").await);
    // Its localhost exception asks the config server, which holds a user now.
    let e = client(b, "", "admin")
        .await
        .database("admin")
        .run_command(doc! {"createUser": "second", "pwd": "secondpw", "roles": ["root"]})
        .await
        .unwrap_err();
    assert_eq!(code(&e), 13, "B's localhost exception is closed: {e}");
    let root_a = client(a, "admin:adminpw@", "admin").await;
    root_a
        .database("test")
        .run_command(doc! {"createUser": "carl", "pwd": "carlpw", "roles": ["read"]})
        .await
        .unwrap();
    assert!(authenticates(b, "carl", "carlpw", "test").await);
    // A user B holds is used as held: a new password set through A is not B's yet.
    root_a
        .database("test")
        .run_command(doc! {"updateUser": "carl", "pwd": "carlpw2"})
        .await
        .unwrap();
    assert!(authenticates(b, "carl", "carlpw", "test").await);
    assert!(!authenticates(b, "carl", "carlpw2", "test").await);
    client(b, "admin:adminpw@", "admin")
        .await
        .database("admin")
        .run_command(doc! {"invalidateUserCache": 1})
        .await
        .expect("invalidateUserCache");
    assert!(authenticates(b, "carl", "carlpw2", "test").await);
    assert!(!authenticates(b, "carl", "carlpw", "test").await);
    c.shutdown().await;
}

/// On a `--configdb` router the user cache follows the users the router holds: a user (or a
/// role it inherits) changed through another router keeps its old privileges on this one until
/// this one reads the config server again (here `invalidateUserCache`; the period is an hour),
/// as before the cache, and from then on every new login gets the new ones. Each check logs in
/// afresh, so a login answered from a resolution made before the read fails the test.
#[tokio::test]
async fn logins_on_another_router_see_user_and_role_changes_when_it_reads_them() {
    let c = cluster_reading_users_every(3600).await;
    let (a, b) = (router(&c, 0), router(&c, 1));
    client(a, "", "admin")
        .await
        .database("admin")
        .run_command(doc! {"createUser": "admin", "pwd": "adminpw", "roles": ["root"]})
        .await
        .expect("the first user, through A");
    let root_a = client(a, "admin:adminpw@", "admin").await;
    let test_a = root_a.database("test");
    test_a
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 0})
        .await
        .unwrap();
    test_a
        .run_command(doc! {
            "createRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "c"}, "actions": ["find"]}],
            "roles": [],
        })
        .await
        .unwrap();
    test_a
        .run_command(doc! {"createRole": "reader", "privileges": [], "roles": ["findC"]})
        .await
        .unwrap();
    test_a
        .run_command(doc! {"createUser": "erin", "pwd": "erinpw", "roles": ["reader"]})
        .await
        .unwrap();
    // What a fresh login of erin through B may do: find and insert on test.c.
    let erin_on_b = || async move {
        let erin = client(b, "erin:erinpw@", "test").await;
        let coll = erin.database("test").collection::<Document>("c");
        (
            coll.find_one(doc! {}).await.is_ok(),
            coll.insert_one(doc! {}).await.is_ok(),
        )
    };
    let invalidate_b = || async move {
        client(b, "admin:adminpw@", "admin")
            .await
            .database("admin")
            .run_command(doc! {"invalidateUserCache": 1})
            .await
            .expect("invalidateUserCache");
    };
    // Fetched when named, resolved, then resolved no more.
    assert_eq!(erin_on_b().await, (true, false));
    assert_eq!(erin_on_b().await, (true, false));

    // The user changed through A.
    test_a
        .run_command(doc! {"grantRolesToUser": "erin", "roles": ["readWrite"]})
        .await
        .unwrap();
    assert_eq!(erin_on_b().await, (true, false), "B has not read it yet");
    invalidate_b().await;
    assert_eq!(
        erin_on_b().await,
        (true, true),
        "grantRolesToUser, read by B"
    );
    test_a
        .run_command(doc! {"revokeRolesFromUser": "erin", "roles": ["readWrite"]})
        .await
        .unwrap();
    invalidate_b().await;
    assert_eq!(
        erin_on_b().await,
        (true, false),
        "revokeRolesFromUser, read by B"
    );

    // A role erin inherits changed through A.
    test_a
        .run_command(doc! {
            "revokePrivilegesFromRole": "findC",
            "privileges": [{"resource": {"db": "test", "collection": "c"}, "actions": ["find"]}],
        })
        .await
        .unwrap();
    assert_eq!(erin_on_b().await, (true, false), "B has not read it yet");
    invalidate_b().await;
    assert_eq!(
        erin_on_b().await,
        (false, false),
        "revokePrivilegesFromRole, read by B"
    );
    test_a
        .run_command(doc! {"grantRolesToRole": "findC", "roles": ["readWrite"]})
        .await
        .unwrap();
    invalidate_b().await;
    assert_eq!(
        erin_on_b().await,
        (true, true),
        "grantRolesToRole, read by B"
    );
    test_a
        .run_command(doc! {"dropRole": "findC"})
        .await
        .unwrap();
    invalidate_b().await;
    assert_eq!(erin_on_b().await, (false, false), "dropRole, read by B");

    // A change made through B itself is B's at once (it reads the config server after it).
    client(b, "admin:adminpw@", "admin")
        .await
        .database("test")
        .run_command(doc! {"updateUser": "erin", "roles": ["read"]})
        .await
        .unwrap();
    assert_eq!(erin_on_b().await, (true, false), "updateUser through B");
    c.shutdown().await;
}
