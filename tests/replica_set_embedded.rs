//! The embedded replica set (a test backend whose members share one data set): what each
//! member's `hello` says, elections by `replSetStepDown`, `replSetFreeze` and stopping a member,
//! refusals on secondaries, per-member counters, awaitable `hello`, and the stock Rust driver
//! and Sluice's own monitors following its primary.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use common::Raw;
use sluice::backend::topology::{
    HostAddr, MonitorOptions, SeedList, ShardMonitor, TopologySettings,
};
use sluice::embedded::{
    AfterWrite, EmbeddedReplicaSet, MemberRole, ReplicaSetOptions, ShardOptions,
};

async fn start_set(members: usize, election_delay: Duration) -> EmbeddedReplicaSet {
    EmbeddedReplicaSet::start(ReplicaSetOptions {
        members,
        election_delay,
        shard: ShardOptions {
            set_name: "rs0".into(),
            ..ShardOptions::for_tests()
        },
    })
    .await
    .expect("replica set starts")
}

fn addr(set: &EmbeddedReplicaSet, i: usize) -> SocketAddr {
    set.hosts()[i].parse().expect("member address")
}

async fn command(set: &EmbeddedReplicaSet, i: usize, body: Document) -> Document {
    let mut raw = Raw::connect(addr(set, i)).await;
    raw.command(&body).await
}

async fn hello(set: &EmbeddedReplicaSet, i: usize) -> Document {
    command(set, i, doc! {"hello": 1, "$db": "admin"}).await
}

fn code(reply: &Document) -> i32 {
    reply.get_i32("code").unwrap_or(0)
}

#[tokio::test]
async fn members_answer_hello_as_one_primary_and_secondaries_of_the_set() {
    let set = start_set(3, Duration::from_millis(50)).await;
    let hosts: Vec<Bson> = set
        .hosts()
        .iter()
        .map(|h| Bson::String(h.clone()))
        .collect();
    let mut primaries = 0;
    for i in 0..3 {
        let h = hello(&set, i).await;
        assert_eq!(h.get_str("setName").unwrap(), "rs0");
        assert_eq!(h.get_array("hosts").unwrap(), &hosts);
        assert_eq!(h.get_str("me").unwrap(), set.hosts()[i]);
        assert_eq!(h.get_str("primary").unwrap(), set.hosts()[0]);
        assert_eq!(h.get_i32("setVersion").unwrap(), 1);
        let tv = h.get_document("topologyVersion").unwrap();
        assert!(tv.get_object_id("processId").is_ok());
        assert!(tv.get_i64("counter").is_ok());
        let writable = h.get_bool("isWritablePrimary").unwrap();
        assert_eq!(h.get_bool("secondary").unwrap(), !writable);
        if writable {
            primaries += 1;
            assert_eq!(i, 0, "member 0 starts as primary");
            let id = h.get_object_id("electionId").unwrap();
            assert_eq!(&id.bytes()[..4], &[0x7f, 0xff, 0xff, 0xff]);
        } else {
            assert!(h.get("electionId").is_none(), "only the primary has one");
        }
        assert!(h.get_document("lastWrite").is_ok());
    }
    assert_eq!(primaries, 1);
    set.shutdown().await;
}

#[tokio::test]
async fn secondaries_refuse_writes_and_reads_without_a_secondary_read_preference() {
    let set = start_set(3, Duration::from_millis(50)).await;
    let ok = command(
        &set,
        0,
        doc! {"insert": "c", "documents": [{"_id": 1, "x": 1}], "$db": "db"},
    )
    .await;
    assert_eq!(ok.get_i32("n").unwrap(), 1, "{ok}");

    let refused = command(
        &set,
        1,
        doc! {"insert": "c", "documents": [{"_id": 2}], "$db": "db"},
    )
    .await;
    assert_eq!(code(&refused), 10107, "{refused}");
    assert_eq!(refused.get_str("codeName").unwrap(), "NotWritablePrimary");
    assert_eq!(refused.get_str("errmsg").unwrap(), "not primary");
    assert!(refused.get_document("topologyVersion").is_ok());

    let unflagged = command(&set, 2, doc! {"find": "c", "$db": "db"}).await;
    assert_eq!(code(&unflagged), 13435, "{unflagged}");
    assert_eq!(
        unflagged.get_str("errmsg").unwrap(),
        "not primary and secondaryOk=false"
    );
    let primary_mode = command(
        &set,
        2,
        doc! {"find": "c", "$readPreference": {"mode": "primary"}, "$db": "db"},
    )
    .await;
    assert_eq!(code(&primary_mode), 13435);

    // The members share one data set: the secondary reads what the primary wrote.
    let read = command(
        &set,
        2,
        doc! {"find": "c", "$readPreference": {"mode": "secondaryPreferred"}, "$db": "db"},
    )
    .await;
    let batch = read
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap();
    assert_eq!(batch.len(), 1, "{read}");
    assert_eq!(
        set.documents("db", "c").len(),
        1,
        "the refused insert wrote nothing"
    );

    // Each member counts its own commands.
    let s2 = set.service(2).await.unwrap();
    assert_eq!(s2.command_total("find"), 3);
    assert_eq!(set.command_total(0, "find").await, 0);
    assert_eq!(set.command_total(1, "insert").await, 1);
    let status = command(&set, 2, doc! {"serverStatus": 1, "$db": "admin"}).await;
    let repl = status.get_document("repl").unwrap();
    assert!(repl.get_bool("secondary").unwrap());
    assert_eq!(
        status
            .get_document("metrics")
            .unwrap()
            .get_document("commands")
            .unwrap()
            .get_document("find")
            .unwrap()
            .get_i64("total")
            .unwrap(),
        3
    );
    set.shutdown().await;
}

#[tokio::test]
async fn step_down_elects_another_member_with_a_newer_election_id() {
    let set = start_set(3, Duration::from_millis(100)).await;
    let before = hello(&set, 0).await;
    let old_id = before.get_object_id("electionId").unwrap();

    let on_secondary = command(&set, 1, doc! {"replSetStepDown": 60, "$db": "admin"}).await;
    assert_eq!(code(&on_secondary), 10107, "{on_secondary}");
    assert_eq!(
        on_secondary.get_str("errmsg").unwrap(),
        "not primary so can't step down"
    );
    let not_admin = command(&set, 0, doc! {"replSetStepDown": 60, "$db": "db"}).await;
    assert_eq!(code(&not_admin), 13, "{not_admin}");

    let started = Instant::now();
    let reply = command(&set, 0, doc! {"replSetStepDown": 60, "$db": "admin"}).await;
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0, "{reply}");
    assert_eq!(set.role(0), Some(MemberRole::Secondary));
    // The election takes its delay: no primary in the meantime.
    assert_eq!(set.primary(), None);
    let h = hello(&set, 0).await;
    assert!(!h.get_bool("isWritablePrimary").unwrap());
    assert!(h.get("primary").is_none(), "{h}");

    let new = set
        .wait_for_primary(Duration::from_secs(5))
        .await
        .expect("a new primary");
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_ne!(new, 0, "the stepped-down member is frozen");
    let h = hello(&set, new).await;
    assert!(h.get_bool("isWritablePrimary").unwrap());
    let new_id = h.get_object_id("electionId").unwrap();
    assert!(new_id.bytes() > old_id.bytes(), "a newer term");
    assert_eq!(h.get_str("primary").unwrap(), set.hosts()[new]);
    // The old primary refuses writes now, the new one takes them.
    let refused = command(
        &set,
        0,
        doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "db"},
    )
    .await;
    assert_eq!(code(&refused), 10107);
    let ok = command(
        &set,
        new,
        doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "db"},
    )
    .await;
    assert_eq!(ok.get_i32("n").unwrap(), 1, "{ok}");
    let status = command(&set, new, doc! {"replSetGetStatus": 1, "$db": "admin"}).await;
    assert_eq!(status.get_i32("myState").unwrap(), 1);
    set.shutdown().await;
}

#[tokio::test]
async fn a_frozen_member_is_not_elected() {
    let set = start_set(3, Duration::from_millis(20)).await;
    let refused = command(&set, 0, doc! {"replSetFreeze": 60, "$db": "admin"}).await;
    assert_eq!(code(&refused), 95, "a primary cannot freeze: {refused}");
    let frozen = command(&set, 1, doc! {"replSetFreeze": 60, "$db": "admin"}).await;
    assert_eq!(frozen.get_f64("ok").unwrap(), 1.0, "{frozen}");
    assert!(set.step_down(Duration::from_secs(60)));
    assert_eq!(set.wait_for_primary(Duration::from_secs(5)).await, Some(2));
    // Unfreezing makes member 1 electable again: step 2 down and 1 wins (0 is still frozen).
    let unfrozen = command(&set, 1, doc! {"replSetFreeze": 0, "$db": "admin"}).await;
    assert_eq!(unfrozen.get_str("info").unwrap(), "unfreezing");
    let r = command(&set, 2, doc! {"replSetStepDown": 30, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
    assert_eq!(set.wait_for_primary(Duration::from_secs(5)).await, Some(1));
    set.shutdown().await;
}

#[tokio::test]
async fn a_stopped_member_closes_its_connections_and_a_stopped_primary_is_replaced() {
    let set = start_set(3, Duration::from_millis(50)).await;
    let mut idle = Raw::connect(addr(&set, 0)).await;
    let h = idle.command(&doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(h.get_f64("ok").unwrap(), 1.0);
    set.stop(0).await;
    assert!(idle.is_closed().await, "the member's connection is closed");
    assert!(
        tokio::net::TcpStream::connect(addr(&set, 0)).await.is_err(),
        "its listener is closed"
    );
    assert_eq!(set.role(0), Some(MemberRole::Stopped));
    let new = set.wait_for_primary(Duration::from_secs(5)).await.unwrap();
    assert_ne!(new, 0);
    // Still listed in hosts, no longer primary anywhere.
    let h = hello(&set, new).await;
    assert_eq!(h.get_array("hosts").unwrap().len(), 3);
    assert_eq!(h.get_str("primary").unwrap(), set.hosts()[new]);

    // A restarted member comes back as a secondary with a new process id.
    set.restart(0).await.expect("restart");
    let h = hello(&set, 0).await;
    assert!(h.get_bool("secondary").unwrap());
    assert_eq!(h.get_str("primary").unwrap(), set.hosts()[new]);
    set.shutdown().await;
}

#[tokio::test]
async fn awaitable_hello_answers_when_the_member_changes() {
    let set = start_set(3, Duration::from_millis(50)).await;
    let first = hello(&set, 1).await;
    let tv = first.get_document("topologyVersion").unwrap().clone();
    let mut raw = Raw::connect(addr(&set, 1)).await;
    // Unchanged: the wait lasts maxAwaitTimeMS.
    let started = Instant::now();
    let same = raw
        .command(&doc! {"hello": 1, "topologyVersion": tv.clone(), "maxAwaitTimeMS": 300, "$db": "admin"})
        .await;
    assert!(started.elapsed() >= Duration::from_millis(290));
    assert_eq!(same.get_document("topologyVersion").unwrap(), &tv);
    // A step-down elsewhere changes what member 1 says (its primary): it answers at once.
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        raw.command(
            &doc! {"hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 10_000, "$db": "admin"},
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    set.step_down(Duration::from_secs(60));
    let changed = waiting.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(changed.get("primary").is_none(), "{changed}");
    let counter = changed
        .get_document("topologyVersion")
        .unwrap()
        .get_i64("counter")
        .unwrap();
    assert!(counter > 0);
    set.shutdown().await;
}

#[tokio::test]
async fn sluice_monitors_discover_the_set_and_follow_a_step_down() {
    let set = start_set(3, Duration::from_millis(50)).await;
    // Seeded with one member only: the others come from its hosts.
    let seeds = format!("rs0/{}", set.hosts()[1]);
    let monitor = ShardMonitor::start(
        &SeedList::parse(&seeds).unwrap(),
        TopologySettings {
            heartbeat_frequency: Duration::from_secs(60),
            ..TopologySettings::default()
        },
        MonitorOptions {
            connect_timeout: Duration::from_secs(2),
            ..MonitorOptions::default()
        },
    );
    let primary_is = |want: &str| {
        let want = HostAddr::parse(want).unwrap();
        let m = &monitor;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if m.with_topology(|t| t.primary().map(|p| p.addr().clone())) == Some(want.clone())
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        }
    };
    assert!(primary_is(&set.hosts()[0]).await);
    assert_eq!(monitor.monitored().len(), 3);
    // Streaming: the step-down is seen well within the one-minute heartbeat.
    set.step_down(Duration::from_secs(60));
    let new = set.wait_for_primary(Duration::from_secs(5)).await.unwrap();
    assert!(primary_is(&set.hosts()[new]).await);
    monitor.stop();
    set.shutdown().await;
}

#[tokio::test]
async fn the_stock_driver_follows_the_primary_and_retries_a_write_once() {
    let set = start_set(3, Duration::from_millis(100)).await;
    let uri = format!(
        "mongodb://{}/?replicaSet=rs0&serverSelectionTimeoutMS=10000",
        set.hosts().join(",")
    );
    let client = mongodb::Client::with_uri_str(uri).await.expect("client");
    let coll = client.database("db").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 0})
        .await
        .expect("insert on the first primary");

    set.step_down(Duration::from_secs(60));
    coll.insert_one(doc! {"_id": 1})
        .await
        .expect("insert on the new primary");

    // The reply of an applied insert is lost: the driver retries it with the same txnNumber
    // and the shared session table answers without a second insert.
    let p = set.primary().unwrap();
    set.after_next_write(p, AfterWrite::CloseConnection);
    coll.insert_one(doc! {"_id": 2})
        .await
        .expect("retried insert");
    // Applied, then the primary steps down and answers 11602: retried on the next primary.
    let p = set.wait_for_primary(Duration::from_secs(5)).await.unwrap();
    set.after_next_write(p, AfterWrite::StepDown);
    coll.update_one(doc! {"_id": 2}, doc! {"$inc": {"n": 1}})
        .await
        .expect("retried update");
    let docs = set.documents("db", "c");
    let ids: Vec<i32> = docs.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(ids, vec![0, 1, 2]);
    assert_eq!(docs[2].get_i32("n").unwrap(), 1, "the $inc applied once");
    set.shutdown().await;
}
