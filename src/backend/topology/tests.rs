//! Scenario tests of the topology state machine, server selection and waiting, driven by
//! `hello` documents as members send them, and a property test over random event sequences.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use proptest::prelude::*;

use super::retry::{resend_decision, BatchFailure, BatchSession, Resend};
use super::select::{eligible_for_read, select_for_read, select_for_write, staleness_ms};
use super::*;

const T0_WALL: i64 = 1_700_000_000_000;

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// The clock `ms` milliseconds into a test.
fn at(ms: u64) -> Now {
    Now {
        instant: base() + Duration::from_millis(ms),
        wall_ms: T0_WALL + ms as i64,
    }
}

fn h(s: &str) -> HostAddr {
    HostAddr::parse(s).unwrap()
}

fn oid(n: u8) -> ObjectId {
    let mut b = [0u8; 12];
    b[0] = 0x7f;
    b[1] = 0xff;
    b[2] = 0xff;
    b[3] = 0xff;
    b[11] = n;
    ObjectId::from_bytes(b)
}

fn tv(process: u8, counter: i64) -> Document {
    doc! {"processId": oid(100 + process), "counter": counter}
}

fn topology_version(process: u8, counter: i64) -> TopologyVersion {
    TopologyVersion::from_document(&tv(process, counter)).unwrap()
}

/// A primary's `hello`.
fn primary(me: &str, hosts: &[&str], election: u8, set_version: i32) -> Document {
    doc! {
        "isWritablePrimary": true, "secondary": false, "setName": "rs0",
        "setVersion": set_version, "electionId": oid(election),
        "hosts": hosts.to_vec(), "me": me, "primary": me, "ok": 1.0,
    }
}

/// A secondary's `hello`.
fn secondary(me: &str, hosts: &[&str]) -> Document {
    doc! {
        "isWritablePrimary": false, "secondary": true, "setName": "rs0",
        "setVersion": 1, "hosts": hosts.to_vec(), "me": me, "ok": 1.0,
    }
}

/// `d` with `topologyVersion` of process `process` at `counter`.
fn versioned(d: Document, process: u8, counter: i64) -> Document {
    with(d, "topologyVersion", tv(process, counter))
}

fn with(mut d: Document, key: &str, value: impl Into<Bson>) -> Document {
    d.insert(key, value);
    d
}

fn rs(seeds: &str) -> ShardTopology {
    ShardTopology::new(
        &SeedList::parse(seeds).unwrap(),
        TopologySettings::default(),
    )
}

fn hello(t: &mut ShardTopology, from: &str, d: Document, now: Now) -> Update {
    timed_hello(t, from, d, Some(1), now)
}

/// A reply that took `rtt_ms` (`None`: an awaited reply, not timed).
fn timed_hello(
    t: &mut ShardTopology,
    from: &str,
    d: Document,
    rtt_ms: Option<u64>,
    now: Now,
) -> Update {
    let rtt = rtt_ms.map(Duration::from_millis);
    t.on_hello(&h(from), Hello::from_document(&d), rtt, now)
}

fn addrs(t: &ShardTopology) -> Vec<String> {
    t.members().map(|m| m.addr().to_string()).collect()
}

fn kind_of(t: &ShardTopology, a: &str) -> ServerType {
    t.member(&h(a)).map(|m| m.server_type()).unwrap()
}

fn primary_addr(t: &ShardTopology) -> Option<String> {
    t.primary().map(|m| m.addr().to_string())
}

const ABC: [&str; 3] = ["a:1", "b:1", "c:1"];

/// a primary, b and c secondaries, all with round trip 1 ms.
fn healthy() -> ShardTopology {
    let mut t = rs("rs0/a:1,b:1,c:1");
    hello(&mut t, "a:1", primary("a:1", &ABC, 1, 1), at(0));
    hello(&mut t, "b:1", secondary("b:1", &ABC), at(0));
    hello(&mut t, "c:1", secondary("c:1", &ABC), at(0));
    t
}

/// Stands in for the project's printer where only the shape of a message matters.
const STUB: Printer = Printer {
    document: |_| "{…}".to_string(),
    value: |_| "…".to_string(),
    type_name: |_| "T",
};

// ---------------------------------------------------------------------------------------
// Discovery

#[test]
fn seeds_start_unknown_without_a_primary() {
    let t = rs("rs0/a:1,b:1");
    assert_eq!(t.kind(), TopologyKind::ReplicaSetNoPrimary);
    assert_eq!(t.set_name(), Some("rs0"));
    assert_eq!(addrs(&t), ["a:1", "b:1"]);
    assert!(t.members().all(|m| m.server_type() == ServerType::Unknown));
    assert!(t.primary().is_none());
    assert!(t.is_expedited());
}

#[test]
fn a_primary_adds_the_members_it_lists_and_removes_the_others() {
    let mut t = rs("rs0/a:1,b:1");
    let u = hello(
        &mut t,
        "a:1",
        primary("a:1", &["a:1", "c:1", "d:1"], 1, 1),
        at(0),
    );
    assert!(u.applied);
    assert_eq!(u.added, vec![h("c:1"), h("d:1")]);
    assert_eq!(u.removed, vec![h("b:1")]);
    assert!(u.primary_changed);
    assert_eq!(addrs(&t), ["a:1", "c:1", "d:1"]);
    assert_eq!(t.kind(), TopologyKind::ReplicaSetWithPrimary);
    assert_eq!(primary_addr(&t).as_deref(), Some("a:1"));
    assert!(!t.is_expedited());
}

#[test]
fn passives_and_arbiters_are_members_too() {
    let mut t = rs("rs0/a:1");
    let d = with(
        with(primary("a:1", &["a:1"], 1, 1), "passives", vec!["p:1"]),
        "arbiters",
        vec!["x:1"],
    );
    hello(&mut t, "a:1", d, at(0));
    assert_eq!(addrs(&t), ["a:1", "p:1", "x:1"]);
    let arb = doc! {"setName": "rs0", "arbiterOnly": true, "ok": 1, "me": "x:1"};
    hello(&mut t, "x:1", arb, at(1));
    assert_eq!(kind_of(&t, "x:1"), ServerType::RsArbiter);
}

#[test]
fn a_primary_that_does_not_list_itself_is_removed() {
    let mut t = rs("rs0/a:1,b:1");
    let u = hello(&mut t, "a:1", primary("a:1", &["b:1"], 1, 1), at(0));
    assert_eq!(u.removed, vec![h("a:1")]);
    assert_eq!(addrs(&t), ["b:1"]);
    assert_eq!(t.kind(), TopologyKind::ReplicaSetNoPrimary);
}

#[test]
fn secondaries_add_members_only_while_there_is_no_primary() {
    let mut t = rs("rs0/a:1");
    let u = hello(&mut t, "a:1", secondary("a:1", &["a:1", "b:1"]), at(0));
    assert_eq!(u.added, vec![h("b:1")]);
    assert!(u.removed.is_empty());
    // A secondary never removes anyone, even when its list is shorter.
    hello(&mut t, "b:1", secondary("b:1", &["b:1"]), at(1));
    assert_eq!(addrs(&t), ["a:1", "b:1"]);
    // With a primary known, only the primary's list counts.
    hello(&mut t, "b:1", primary("b:1", &["a:1", "b:1"], 1, 1), at(2));
    let u = hello(
        &mut t,
        "a:1",
        secondary("a:1", &["a:1", "b:1", "z:1"]),
        at(3),
    );
    assert!(u.added.is_empty());
    assert_eq!(addrs(&t), ["a:1", "b:1"]);
}

#[test]
fn a_member_of_another_set_is_removed() {
    let mut t = rs("rs0/a:1,b:1");
    let other = with(secondary("a:1", &["a:1"]), "setName", "rs1");
    let u = hello(&mut t, "a:1", other, at(0));
    assert_eq!(u.removed, vec![h("a:1")]);
    let other_primary = with(primary("b:1", &["b:1"], 1, 1), "setName", "rs1");
    let u = hello(&mut t, "b:1", other_primary, at(0));
    assert_eq!(u.removed, vec![h("b:1")]);
    assert!(t.members().next().is_none());
    assert!(t.primary().is_none());
}

#[test]
fn a_member_whose_me_differs_is_replaced_by_its_me() {
    let mut t = rs("rs0/alias:1");
    let u = hello(&mut t, "alias:1", secondary("real:1", &["real:1"]), at(0));
    assert_eq!(u.added, vec![h("real:1")]);
    assert_eq!(u.removed, vec![h("alias:1")]);
    assert_eq!(addrs(&t), ["real:1"]);
    // With a primary known, the member is removed and nothing is added.
    let mut t = healthy();
    let u = hello(&mut t, "b:1", secondary("elsewhere:1", &ABC), at(1));
    assert_eq!(u.removed, vec![h("b:1")]);
    assert_eq!(addrs(&t), ["a:1", "c:1"]);
}

#[test]
fn standalones_and_routers_are_not_members() {
    let mut t = rs("rs0/a:1,b:1");
    let u = hello(
        &mut t,
        "a:1",
        doc! {"ok": 1, "isWritablePrimary": true},
        at(0),
    );
    assert_eq!(u.removed, vec![h("a:1")]);
    let u = hello(&mut t, "b:1", doc! {"ok": 1, "msg": "isdbgrid"}, at(0));
    assert_eq!(u.removed, vec![h("b:1")]);
}

#[test]
fn replies_from_strangers_are_ignored() {
    let mut t = healthy();
    let v = t.version();
    let u = hello(&mut t, "z:1", primary("z:1", &["z:1"], 9, 9), at(1));
    assert_eq!(u, Update::default());
    assert_eq!(t.version(), v);
    assert_eq!(primary_addr(&t).as_deref(), Some("a:1"));
}

#[test]
fn ghosts_and_members_in_other_states_stay_but_serve_nothing() {
    let mut t = healthy();
    hello(&mut t, "b:1", doc! {"ok": 1, "isreplicaset": true}, at(1));
    assert_eq!(kind_of(&t, "b:1"), ServerType::RsGhost);
    hello(
        &mut t,
        "c:1",
        doc! {"ok": 1, "setName": "rs0", "me": "c:1"},
        at(1),
    );
    assert_eq!(kind_of(&t, "c:1"), ServerType::RsOther);
    assert_eq!(addrs(&t).len(), 3);
    let sec = ReadPreference::of_mode(ReadPreferenceMode::Secondary);
    assert_eq!(select_for_read(&t, &sec, 0).unwrap(), None);
}

// ---------------------------------------------------------------------------------------
// Stale primaries and stale replies

#[test]
fn a_newer_election_moves_the_primary() {
    let mut t = healthy();
    let u = hello(&mut t, "b:1", primary("b:1", &ABC, 2, 1), at(1));
    assert!(u.primary_changed);
    assert_eq!(primary_addr(&t).as_deref(), Some("b:1"));
    assert_eq!(
        kind_of(&t, "a:1"),
        ServerType::Unknown,
        "the old primary is demoted"
    );
    assert_eq!(
        t.max_election_id_set_version(),
        ElectionIdSetVersion {
            election_id: Some(oid(2)),
            set_version: Some(1)
        }
    );
}

#[test]
fn a_stale_primary_is_marked_unknown() {
    let mut t = healthy();
    hello(&mut t, "b:1", primary("b:1", &ABC, 2, 1), at(1));
    // a still answers as primary of term 1 (it has not heard of the election yet).
    let u = hello(&mut t, "a:1", primary("a:1", &ABC, 1, 1), at(2));
    assert!(!u.primary_changed);
    assert_eq!(kind_of(&t, "a:1"), ServerType::Unknown);
    assert_eq!(primary_addr(&t).as_deref(), Some("b:1"));
}

#[test]
fn election_id_is_compared_before_set_version() {
    // mongos 6.0+: a newer term wins even with a smaller setVersion (the driver crate's older
    // rule would call this primary stale).
    let mut t = rs("rs0/a:1,b:1");
    hello(&mut t, "a:1", primary("a:1", &["a:1", "b:1"], 1, 5), at(0));
    hello(&mut t, "b:1", primary("b:1", &["a:1", "b:1"], 2, 4), at(1));
    assert_eq!(primary_addr(&t).as_deref(), Some("b:1"));
    // The same term with a smaller setVersion is stale.
    hello(&mut t, "a:1", primary("a:1", &["a:1", "b:1"], 2, 3), at(2));
    assert_eq!(primary_addr(&t).as_deref(), Some("b:1"));
    assert_eq!(kind_of(&t, "a:1"), ServerType::Unknown);
    // The same term with a larger setVersion (a reconfig) is accepted.
    hello(&mut t, "b:1", primary("b:1", &["a:1", "b:1"], 2, 6), at(3));
    assert_eq!(t.max_election_id_set_version().set_version, Some(6));
}

#[test]
fn a_primary_without_an_election_id_is_stale_once_one_was_seen() {
    let mut t = rs("rs0/a:1,b:1");
    let mut legacy = primary("a:1", &["a:1", "b:1"], 1, 1);
    legacy.remove("electionId");
    // Nothing seen yet: accepted.
    hello(&mut t, "a:1", legacy.clone(), at(0));
    assert_eq!(primary_addr(&t).as_deref(), Some("a:1"));
    hello(&mut t, "b:1", primary("b:1", &["a:1", "b:1"], 1, 1), at(1));
    hello(&mut t, "a:1", legacy, at(2));
    assert_eq!(primary_addr(&t).as_deref(), Some("b:1"));
}

#[test]
fn pair_order_matches_mongos() {
    let p = |e: Option<u8>, v: Option<i32>| ElectionIdSetVersion {
        election_id: e.map(oid),
        set_version: v,
    };
    assert!(p(Some(1), Some(9)).is_older_than(&p(Some(2), Some(1))));
    assert!(!p(Some(2), Some(1)).is_older_than(&p(Some(1), Some(9))));
    assert!(p(Some(2), Some(1)).is_older_than(&p(Some(2), Some(2))));
    assert!(!p(Some(2), Some(2)).is_older_than(&p(Some(2), Some(2))));
    assert!(p(None, Some(5)).is_older_than(&p(Some(1), Some(1))));
    assert!(p(Some(3), None).is_older_than(&p(Some(1), Some(1))));
    assert!(!p(None, None).is_older_than(&p(None, None)));
    assert!(!p(Some(1), Some(1)).is_older_than(&p(None, None)));
}

#[test]
fn an_older_topology_version_is_ignored_a_restart_is_not() {
    let mut t = healthy();
    hello(
        &mut t,
        "b:1",
        versioned(secondary("b:1", &ABC), 1, 5),
        at(1),
    );
    let v = t.version();
    let late = versioned(primary("b:1", &ABC, 9, 9), 1, 4);
    let u = hello(&mut t, "b:1", late, at(2));
    assert!(!u.applied);
    assert_eq!(t.version(), v);
    assert_eq!(kind_of(&t, "b:1"), ServerType::RsSecondary);
    // The same counter is accepted (a heartbeat that found nothing new).
    let same = versioned(secondary("b:1", &ABC), 1, 5);
    assert!(hello(&mut t, "b:1", same, at(3)).applied);
    // Another process (b restarted) is accepted whatever its counter.
    let restarted = versioned(secondary("b:1", &ABC), 2, 0);
    assert!(hello(&mut t, "b:1", restarted, at(4)).applied);
    assert_eq!(
        t.member(&h("b:1")).unwrap().topology_version(),
        Some(topology_version(2, 0))
    );
}

// ---------------------------------------------------------------------------------------
// Errors from the data path and the monitors

fn command_error(code: i32, tv: Option<TopologyVersion>) -> ApplicationError {
    ApplicationError::Command {
        generation: 0,
        code,
        topology_version: tv,
    }
}

#[test]
fn not_primary_errors_mark_the_member_unknown_and_ask_for_a_check() {
    for code in [10107, 13435, 13436, 189, 11602] {
        let mut t = healthy();
        let u = t.on_application_error(&h("a:1"), &command_error(code, None), at(1));
        assert!(u.applied, "{code}");
        assert!(u.request_check, "{code}");
        assert!(!u.clear_pool, "{code}: a step-down keeps connections open");
        assert!(u.primary_changed, "{code}");
        assert_eq!(kind_of(&t, "a:1"), ServerType::Unknown);
        assert_eq!(t.kind(), TopologyKind::ReplicaSetNoPrimary);
        assert!(t.is_expedited());
        assert_eq!(t.member(&h("a:1")).unwrap().pool_generation(), 0);
    }
}

#[test]
fn shutdown_errors_also_clear_the_pool() {
    for code in [91, 11600] {
        let mut t = healthy();
        let u = t.on_application_error(&h("a:1"), &command_error(code, None), at(1));
        assert!(u.clear_pool && u.request_check, "{code}");
        assert_eq!(kind_of(&t, "a:1"), ServerType::Unknown);
        assert_eq!(t.member(&h("a:1")).unwrap().pool_generation(), 1);
    }
}

#[test]
fn other_errors_leave_the_member_alone() {
    let mut t = healthy();
    let v = t.version();
    for code in [11000, 2, 50, 13388, 64] {
        let u = t.on_application_error(&h("a:1"), &command_error(code, None), at(1));
        assert_eq!(u, Update::default(), "{code}");
    }
    assert_eq!(t.version(), v);
    assert_eq!(primary_addr(&t).as_deref(), Some("a:1"));
}

#[test]
fn network_errors_mark_unknown_but_a_timeout_only_clears_the_pool() {
    let mut t = healthy();
    let timeout = ApplicationError::Network {
        generation: 0,
        during_handshake: false,
        timeout: true,
    };
    let u = t.on_application_error(&h("a:1"), &timeout, at(1));
    assert!(u.clear_pool && !u.request_check);
    assert_eq!(
        kind_of(&t, "a:1"),
        ServerType::RsPrimary,
        "a slow primary is still primary"
    );
    assert_eq!(t.member(&h("a:1")).unwrap().pool_generation(), 1);

    let broken = ApplicationError::Network {
        generation: 1,
        during_handshake: false,
        timeout: false,
    };
    let u = t.on_application_error(&h("a:1"), &broken, at(2));
    assert!(u.clear_pool && u.primary_changed);
    assert_eq!(kind_of(&t, "a:1"), ServerType::Unknown);
    assert_eq!(t.member(&h("a:1")).unwrap().rtt(), None);

    let mut t = healthy();
    let handshake_timeout = ApplicationError::Network {
        generation: 0,
        during_handshake: true,
        timeout: true,
    };
    t.on_application_error(&h("a:1"), &handshake_timeout, at(1));
    assert_eq!(kind_of(&t, "a:1"), ServerType::Unknown);
    // A network error code reported by the member itself counts like one on the wire.
    let mut t = healthy();
    let u = t.on_application_error(&h("b:1"), &command_error(6, None), at(1));
    assert!(u.clear_pool);
    assert_eq!(kind_of(&t, "b:1"), ServerType::Unknown);
}

#[test]
fn errors_from_connections_of_an_older_pool_are_ignored() {
    let mut t = healthy();
    t.on_application_error(&h("a:1"), &command_error(91, None), at(1));
    hello(&mut t, "a:1", primary("a:1", &ABC, 1, 1), at(2));
    // A connection opened before the pool was cleared reports its own failure late.
    let late = ApplicationError::Command {
        generation: 0,
        code: 10107,
        topology_version: None,
    };
    assert_eq!(
        t.on_application_error(&h("a:1"), &late, at(3)),
        Update::default()
    );
    assert_eq!(primary_addr(&t).as_deref(), Some("a:1"));
}

#[test]
fn an_error_the_monitor_already_knows_about_is_ignored() {
    let mut t = rs("rs0/a:1,b:1");
    hello(
        &mut t,
        "a:1",
        versioned(primary("a:1", &["a:1", "b:1"], 1, 1), 1, 6),
        at(0),
    );
    // The step-down error carries the counter the primary had before: stale.
    let stale = command_error(10107, Some(topology_version(1, 6)));
    assert_eq!(
        t.on_application_error(&h("a:1"), &stale, at(1)),
        Update::default()
    );
    assert_eq!(primary_addr(&t).as_deref(), Some("a:1"));
    // A newer counter is news: a stepped down.
    let fresh = command_error(10107, Some(topology_version(1, 7)));
    assert!(t.on_application_error(&h("a:1"), &fresh, at(2)).applied);
    assert_eq!(kind_of(&t, "a:1"), ServerType::Unknown);
    assert_eq!(
        t.member(&h("a:1")).unwrap().topology_version(),
        Some(topology_version(1, 7))
    );
    // A heartbeat sent before the step-down and answered late cannot bring it back.
    let late = versioned(primary("a:1", &["a:1", "b:1"], 1, 1), 1, 6);
    assert!(!hello(&mut t, "a:1", late, at(3)).applied);
    assert!(t.primary().is_none());
}

#[test]
fn a_monitor_retries_once_before_declaring_a_known_member_down() {
    let mut t = healthy();
    let u = t.on_monitor_error(&h("b:1"), MonitorError::Network, at(1));
    assert!(u.request_check && u.clear_pool);
    assert_eq!(kind_of(&t, "b:1"), ServerType::RsSecondary);
    let plan = t.next_check(&h("b:1"), at(1).instant).unwrap();
    assert_eq!(plan.at, at(1).instant + Duration::from_millis(500));
    let u = t.on_monitor_error(&h("b:1"), MonitorError::Network, at(2));
    assert!(u.clear_pool);
    assert_eq!(kind_of(&t, "b:1"), ServerType::Unknown);
    // A successful check resets the count.
    hello(&mut t, "b:1", secondary("b:1", &ABC), at(3));
    t.on_monitor_error(&h("b:1"), MonitorError::Network, at(4));
    assert_eq!(kind_of(&t, "b:1"), ServerType::RsSecondary);
    // Failing to connect at all makes it Unknown at once.
    let mut t = healthy();
    let u = t.on_monitor_error(&h("a:1"), MonitorError::Connect, at(1));
    assert!(u.primary_changed);
    assert_eq!(kind_of(&t, "a:1"), ServerType::Unknown);
}

#[test]
fn a_failed_hello_reply_marks_the_member_unknown_with_its_topology_version() {
    let mut t = healthy();
    let quiesce = doc! {
        "ok": 0, "code": 91, "errmsg": "The server is in quiesce mode and will shut down",
        "topologyVersion": tv(1, 3),
    };
    let u = hello(&mut t, "a:1", quiesce, at(1));
    assert!(u.primary_changed);
    let a = t.member(&h("a:1")).unwrap();
    assert_eq!(a.server_type(), ServerType::Unknown);
    assert_eq!(a.topology_version(), Some(topology_version(1, 3)));
    assert_eq!(a.rtt(), None);
}

// ---------------------------------------------------------------------------------------
// Round trips, monitoring schedule, versions

#[test]
fn round_trip_is_a_moving_average() {
    let mut t = rs("rs0/a:1");
    let a = h("a:1");
    let sec = || secondary("a:1", &["a:1"]);
    timed_hello(&mut t, "a:1", sec(), Some(10), at(0));
    assert_eq!(t.member(&a).unwrap().rtt(), Some(Duration::from_millis(10)));
    timed_hello(&mut t, "a:1", sec(), Some(20), at(1));
    assert_eq!(t.member(&a).unwrap().rtt(), Some(Duration::from_millis(12)));
    // An awaited reply is not timed: the average stays.
    timed_hello(&mut t, "a:1", sec(), None, at(2));
    assert_eq!(t.member(&a).unwrap().rtt(), Some(Duration::from_millis(12)));
    t.on_rtt_sample(&a, Duration::from_millis(2));
    assert_eq!(
        t.member(&a).unwrap().rtt(),
        Some(Duration::from_micros(10_000))
    );
}

#[test]
fn monitors_poll_stream_and_hurry_as_mongos_does() {
    let mut t = rs("rs0/a:1,b:1");
    let start = at(0).instant;
    // Nothing known: poll every 500 ms.
    assert_eq!(
        t.next_check(&h("a:1"), start),
        Some(CheckPlan {
            kind: CheckKind::Poll,
            at: start + MIN_HEARTBEAT
        })
    );
    hello(
        &mut t,
        "a:1",
        versioned(primary("a:1", &["a:1", "b:1"], 1, 1), 1, 1),
        at(0),
    );
    hello(&mut t, "b:1", secondary("b:1", &["a:1", "b:1"]), at(0));
    // A primary is known; b reports no topologyVersion: poll at the heartbeat.
    assert_eq!(
        t.next_check(&h("b:1"), start).unwrap().at,
        start + Duration::from_secs(10)
    );
    // a reports one: an awaitable hello right away.
    assert_eq!(
        t.next_check(&h("a:1"), start),
        Some(CheckPlan {
            kind: CheckKind::Awaitable {
                topology_version: topology_version(1, 1),
                max_await: Duration::from_secs(10)
            },
            at: start
        })
    );
    // A selection that found nothing hurries the polls until a primary is found.
    t.request_immediate_check();
    assert_eq!(
        t.next_check(&h("b:1"), start).unwrap().at,
        start + MIN_HEARTBEAT
    );
    hello(
        &mut t,
        "a:1",
        versioned(primary("a:1", &["a:1", "b:1"], 1, 1), 1, 1),
        at(1),
    );
    assert_eq!(
        t.next_check(&h("b:1"), start).unwrap().at,
        start + Duration::from_secs(10)
    );
    // Without streaming, always poll.
    let mut polling = ShardTopology::new(
        &SeedList::parse("rs0/a:1").unwrap(),
        TopologySettings {
            streaming: false,
            heartbeat_frequency: Duration::from_millis(100),
            ..TopologySettings::default()
        },
    );
    hello(
        &mut polling,
        "a:1",
        versioned(primary("a:1", &["a:1"], 1, 1), 1, 1),
        at(0),
    );
    assert_eq!(
        polling.next_check(&h("a:1"), start),
        Some(CheckPlan {
            kind: CheckKind::Poll,
            at: start + MIN_HEARTBEAT
        }),
        "the heartbeat is never below 500 ms"
    );
    // A removed member's monitor stops.
    assert_eq!(t.next_check(&h("z:1"), start), None);
}

const MIN_HEARTBEAT: Duration = Duration::from_millis(500);

#[test]
fn the_version_moves_with_every_applied_change() {
    let mut t = rs("rs0/a:1");
    let v0 = t.version();
    assert!(hello(&mut t, "a:1", secondary("a:1", &["a:1", "b:1"]), at(0)).applied);
    let v1 = t.version();
    assert!(v1 > v0);
    assert!(hello(&mut t, "a:1", primary("a:1", &["a:1", "b:1"], 1, 1), at(1)).applied);
    let v2 = t.version();
    assert!(v2 > v1);
    assert!(
        t.on_application_error(&h("a:1"), &command_error(10107, None), at(2))
            .applied
    );
    assert!(t.version() > v2);
    // A round-trip sample changes no selection outcome a waiter could be waiting for.
    let v3 = t.version();
    t.on_rtt_sample(&h("b:1"), Duration::from_millis(3));
    assert_eq!(t.version(), v3);
}

#[test]
fn a_single_server_is_never_discovered_away() {
    let mut t = rs("solo:27018");
    assert_eq!(t.kind(), TopologyKind::Single);
    assert_eq!(
        select_for_write(&t),
        Some(h("solo:27018")),
        "sent even before it is known"
    );
    hello(
        &mut t,
        "solo:27018",
        doc! {"ok": 1, "isWritablePrimary": true},
        at(0),
    );
    assert_eq!(addrs(&t), ["solo:27018"]);
    assert!(!t.is_expedited());
    hello(
        &mut t,
        "solo:27018",
        secondary("other:1", &["other:1"]),
        at(1),
    );
    assert_eq!(addrs(&t), ["solo:27018"]);
    let sec = ReadPreference::of_mode(ReadPreferenceMode::Secondary);
    assert_eq!(select_for_read(&t, &sec, 7).unwrap(), Some(h("solo:27018")));
    assert_eq!(t.display_name(), "solo:27018");
}

// ---------------------------------------------------------------------------------------
// Server selection

fn mode(m: ReadPreferenceMode) -> ReadPreference {
    ReadPreference::of_mode(m)
}

fn tagged(m: ReadPreferenceMode, tags: Bson) -> ReadPreference {
    ReadPreference {
        tags: tags.as_array().unwrap().clone(),
        ..mode(m)
    }
}

fn eligible(t: &ShardTopology, p: &ReadPreference) -> Vec<String> {
    eligible_for_read(t, p)
        .unwrap()
        .into_iter()
        .map(|m| m.addr().to_string())
        .collect()
}

/// a primary (dc east), b secondary (east, rack 1), c secondary (west).
fn tagged_set() -> ShardTopology {
    let mut t = rs("rs0/a:1,b:1,c:1");
    hello(
        &mut t,
        "a:1",
        with(primary("a:1", &ABC, 1, 1), "tags", doc! {"dc": "east"}),
        at(0),
    );
    hello(
        &mut t,
        "b:1",
        with(
            secondary("b:1", &ABC),
            "tags",
            doc! {"dc": "east", "rack": "1"},
        ),
        at(0),
    );
    hello(
        &mut t,
        "c:1",
        with(secondary("c:1", &ABC), "tags", doc! {"dc": "west"}),
        at(0),
    );
    t
}

#[test]
fn each_mode_picks_its_member_kind() {
    use ReadPreferenceMode::*;
    let t = healthy();
    assert_eq!(select_for_write(&t), Some(h("a:1")));
    assert_eq!(eligible(&t, &mode(Primary)), ["a:1"]);
    assert_eq!(eligible(&t, &mode(PrimaryPreferred)), ["a:1"]);
    assert_eq!(eligible(&t, &mode(Secondary)), ["b:1", "c:1"]);
    assert_eq!(eligible(&t, &mode(SecondaryPreferred)), ["b:1", "c:1"]);
    assert_eq!(eligible(&t, &mode(Nearest)), ["a:1", "b:1", "c:1"]);

    let mut no_primary = healthy();
    no_primary.on_application_error(&h("a:1"), &command_error(10107, None), at(1));
    assert_eq!(select_for_write(&no_primary), None);
    assert!(eligible(&no_primary, &mode(Primary)).is_empty());
    assert_eq!(
        eligible(&no_primary, &mode(PrimaryPreferred)),
        ["b:1", "c:1"]
    );
    assert_eq!(eligible(&no_primary, &mode(Nearest)), ["b:1", "c:1"]);

    let mut only_primary = healthy();
    for s in ["b:1", "c:1"] {
        only_primary.on_monitor_error(&h(s), MonitorError::Connect, at(1));
    }
    assert!(eligible(&only_primary, &mode(Secondary)).is_empty());
    assert_eq!(eligible(&only_primary, &mode(SecondaryPreferred)), ["a:1"]);
}

#[test]
fn the_first_tag_set_that_matches_wins() {
    use ReadPreferenceMode::*;
    let t = tagged_set();
    let p = tagged(
        Secondary,
        bson::bson!([{"dc": "north"}, {"dc": "west"}, {"dc": "east"}]),
    );
    assert_eq!(eligible(&t, &p), ["c:1"]);
    let p = tagged(Secondary, bson::bson!([{"dc": "east", "rack": "1"}]));
    assert_eq!(eligible(&t, &p), ["b:1"]);
    let p = tagged(Secondary, bson::bson!([{"dc": "north"}]));
    assert!(eligible(&t, &p).is_empty());
    let p = tagged(Secondary, bson::bson!([{"dc": "north"}, {}]));
    assert_eq!(
        eligible(&t, &p),
        ["b:1", "c:1"],
        "{{}} matches every member"
    );
    // Non-string values and non-document sets match nothing (mongos skips them).
    let p = tagged(Secondary, bson::bson!([{"rack": 1}, 5, {"dc": "west"}]));
    assert_eq!(eligible(&t, &p), ["c:1"]);
    // Nearest applies tags to the primary too.
    let p = tagged(Nearest, bson::bson!([{"dc": "east"}]));
    assert_eq!(eligible(&t, &p), ["a:1", "b:1"]);
}

#[test]
fn tags_never_filter_a_primary_chosen_as_fallback() {
    use ReadPreferenceMode::*;
    let t = tagged_set();
    let p = tagged(SecondaryPreferred, bson::bson!([{"dc": "north"}]));
    assert_eq!(eligible(&t, &p), ["a:1"]);
    let p = tagged(PrimaryPreferred, bson::bson!([{"dc": "north"}]));
    assert_eq!(eligible(&t, &p), ["a:1"]);
    let mut down = tagged_set();
    down.on_application_error(&h("a:1"), &command_error(91, None), at(1));
    let p = tagged(PrimaryPreferred, bson::bson!([{"dc": "west"}]));
    assert_eq!(eligible(&down, &p), ["c:1"]);
}

#[test]
fn the_latency_window_keeps_members_near_the_fastest() {
    let mut t = rs("rs0/a:1,b:1,c:1,d:1");
    let hosts = ["a:1", "b:1", "c:1", "d:1"];
    let rtts = [("a:1", 40u64), ("b:1", 5), ("c:1", 20), ("d:1", 21)];
    timed_hello(&mut t, "a:1", primary("a:1", &hosts, 1, 1), Some(40), at(0));
    for (m, ms) in &rtts[1..] {
        timed_hello(&mut t, m, secondary(m, &hosts), Some(*ms), at(0));
    }
    // 5 ms + 15 ms: c (20) is in, d (21) and a (40) are out.
    assert_eq!(
        eligible(&t, &mode(ReadPreferenceMode::Nearest)),
        ["b:1", "c:1"]
    );
    assert_eq!(
        eligible(&t, &mode(ReadPreferenceMode::Primary)),
        ["a:1"],
        "one member is its own window"
    );
    let picks: std::collections::BTreeSet<HostAddr> = (0..8)
        .map(|r| {
            select_for_read(&t, &mode(ReadPreferenceMode::Nearest), r)
                .unwrap()
                .unwrap()
        })
        .collect();
    assert_eq!(
        picks.len(),
        2,
        "the random number spreads reads over the window"
    );
}

#[test]
fn max_staleness_keeps_secondaries_that_are_close_enough() {
    let mut t = rs("rs0/a:1,b:1,c:1");
    let lw = |ms: i64| doc! {"lastWriteDate": bson::DateTime::from_millis(T0_WALL + ms)};
    hello(
        &mut t,
        "a:1",
        with(primary("a:1", &ABC, 1, 1), "lastWrite", lw(100_000)),
        at(100_000),
    );
    hello(
        &mut t,
        "b:1",
        with(secondary("b:1", &ABC), "lastWrite", lw(95_000)),
        at(100_000),
    );
    hello(
        &mut t,
        "c:1",
        with(secondary("c:1", &ABC), "lastWrite", lw(-100_000)),
        at(100_000),
    );
    // b: 5 s behind + 10 s heartbeat = 15 s; c: 200 s + 10 s.
    assert_eq!(staleness_ms(&t, t.member(&h("b:1")).unwrap()), 15_000);
    assert_eq!(staleness_ms(&t, t.member(&h("c:1")).unwrap()), 210_000);
    assert_eq!(staleness_ms(&t, t.primary().unwrap()), 0);
    let p = ReadPreference {
        max_staleness_seconds: Some(90),
        ..mode(ReadPreferenceMode::Secondary)
    };
    assert_eq!(eligible(&t, &p), ["b:1"]);
    let p = ReadPreference {
        max_staleness_seconds: Some(210),
        ..mode(ReadPreferenceMode::Nearest)
    };
    assert_eq!(eligible(&t, &p), ["a:1", "b:1", "c:1"]);
    // Without a primary, lag is measured from the freshest secondary.
    t.on_application_error(&h("a:1"), &command_error(10107, None), at(100_001));
    assert_eq!(staleness_ms(&t, t.member(&h("b:1")).unwrap()), 10_000);
    assert_eq!(staleness_ms(&t, t.member(&h("c:1")).unwrap()), 205_000);
    let p = ReadPreference {
        max_staleness_seconds: Some(90),
        ..mode(ReadPreferenceMode::PrimaryPreferred)
    };
    assert_eq!(eligible(&t, &p), ["b:1"]);
}

#[test]
fn max_staleness_below_heartbeat_plus_idle_write_period_is_refused() {
    let settings = TopologySettings {
        heartbeat_frequency: Duration::from_secs(100),
        ..TopologySettings::default()
    };
    let t = ShardTopology::new(&SeedList::parse("rs0/a:1").unwrap(), settings);
    let p = ReadPreference {
        max_staleness_seconds: Some(90),
        ..mode(ReadPreferenceMode::Secondary)
    };
    let e = select_for_read(&t, &p, 0).unwrap_err();
    assert_eq!(
        e.code,
        crate::value::error_codes::ErrorCode::MaxStalenessOutOfRange
    );
    assert_eq!(
        e.message,
        "Parameter maxStalenessSeconds cannot be less than 110"
    );
    let p = ReadPreference {
        max_staleness_seconds: Some(110),
        ..p
    };
    assert_eq!(select_for_read(&t, &p, 0), Ok(None));
}

// ---------------------------------------------------------------------------------------
// Waiting for a member

#[test]
fn waiting_for_a_primary_ends_when_one_is_elected() {
    let mut t = healthy();
    let settings = t.settings().clone();
    t.on_application_error(&h("a:1"), &command_error(189, None), at(1));
    let wait = MemberWait::new(Need::Write, at(1).instant, &settings, None);
    assert_eq!(wait.deadline(), at(1).instant + Duration::from_secs(15));
    let WaitStep::Wait {
        seen_version,
        until,
    } = wait.step(&t, at(1).instant, 0, &STUB)
    else {
        panic!("no primary yet");
    };
    assert_eq!(until, wait.deadline());
    assert_eq!(seen_version, t.version());
    hello(&mut t, "b:1", primary("b:1", &ABC, 2, 1), at(300));
    assert_ne!(t.version(), seen_version);
    assert_eq!(
        wait.step(&t, at(300).instant, 0, &STUB),
        WaitStep::Ready(h("b:1"))
    );
}

/// `ShardMonitor::select` (the I/O side of the wait) on a monitor without tasks, where the
/// test plays the monitors: a waiter that steps while a change is applied but not yet
/// published must wait for the publication, not step again at once. It used to take the
/// published version being merely different from the one it saw for a change, so it looped
/// without ever yielding: on this single-threaded runtime nothing else ran until its selection
/// timeout, and it gave up (133) with the election already over; on the router's runtime a
/// few such waiters held every worker, so the monitors could not publish the primary either.
#[tokio::test]
async fn a_waiter_waits_for_the_publication_of_a_change_it_saw_applied() {
    let settings = TopologySettings {
        find_host_timeout: Duration::from_secs(2),
        ..TopologySettings::default()
    };
    let m = std::sync::Arc::new(monitor::ShardMonitor::without_tasks(
        &SeedList::parse("rs0/a:1,b:1,c:1").unwrap(),
        settings,
    ));
    // a's monitor has applied a secondary's reply and not published it yet.
    m.change(
        |t| {
            t.on_hello(
                &h("a:1"),
                Hello::from_document(&secondary("a:1", &ABC)),
                None,
                at(0),
            )
        },
        false,
    );
    assert!(m.published() < m.with_topology(|t| t.version()));
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.select(Need::Write, None, 0, &STUB).await })
    };
    // Let the waiter run until it waits.
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "{:?}", waiter.await);
    // b is elected; its monitor applies and publishes.
    m.change(
        |t| {
            t.on_hello(
                &h("b:1"),
                Hello::from_document(&primary("b:1", &ABC, 2, 1)),
                None,
                at(1),
            )
        },
        true,
    );
    let selected = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter wakes")
        .expect("the waiter runs");
    assert_eq!(selected, Ok(h("b:1")));
}

/// Two updates applied on two threads read the topology's version in one order and may
/// publish it in the other: the older version must not replace the newer one (a waiter would
/// see the published version behind the topology's until the next change).
#[test]
fn the_published_version_never_goes_back() {
    let (version, rx) = tokio::sync::watch::channel(0u64);
    monitor::publish(&version, 6);
    monitor::publish(&version, 5);
    assert_eq!(*rx.borrow(), 6);
    monitor::publish(&version, 7);
    assert_eq!(*rx.borrow(), 7);
}

#[test]
fn waiting_gives_up_as_mongos_does() {
    let mut t = healthy();
    let settings = t.settings().clone();
    t.on_application_error(&h("a:1"), &command_error(10107, None), at(0));
    let wait = MemberWait::new(Need::Write, at(0).instant, &settings, None);
    let WaitStep::GiveUp(e) = wait.step(&t, at(15_000).instant, 0, &STUB) else {
        panic!("deadline passed");
    };
    assert_eq!(
        e.code,
        crate::value::error_codes::ErrorCode::FailedToSatisfyReadPreference
    );
    assert_eq!(
        e.message,
        "Could not find host matching read preference {…} for set rs0"
    );

    // maxTimeMS shorter than the selection timeout: the operation's limit is what expires.
    let op_deadline = at(0).instant + Duration::from_millis(2_000);
    let wait = MemberWait::new(Need::Write, at(0).instant, &settings, Some(op_deadline));
    assert_eq!(wait.deadline(), op_deadline);
    assert!(matches!(
        wait.step(&t, at(1_999).instant, 0, &STUB),
        WaitStep::Wait { .. }
    ));
    let WaitStep::GiveUp(e) = wait.step(&t, at(2_000).instant, 0, &STUB) else {
        panic!("maxTimeMS passed");
    };
    assert_eq!(
        e.code,
        crate::value::error_codes::ErrorCode::MaxTimeMSExpired
    );
    assert_eq!(e.message, "operation exceeded time limit");

    // A longer maxTimeMS does not extend the selection timeout.
    let long = at(0).instant + Duration::from_secs(60);
    let wait = MemberWait::new(Need::Write, at(0).instant, &settings, Some(long));
    assert_eq!(wait.deadline(), at(0).instant + Duration::from_secs(15));

    // A read preference the topology refuses fails at once.
    let bad = ReadPreference {
        max_staleness_seconds: Some(15),
        ..mode(ReadPreferenceMode::Secondary)
    };
    let wait = MemberWait::new(Need::Read(bad), at(0).instant, &settings, None);
    assert!(
        matches!(wait.step(&t, at(0).instant, 0, &STUB), WaitStep::GiveUp(e) if e.code.0 == 160)
    );
}

#[test]
fn a_member_that_appears_at_the_deadline_is_still_used() {
    let t = healthy();
    let wait = MemberWait::new(Need::Write, at(0).instant, t.settings(), None);
    assert_eq!(
        wait.step(&t, at(60_000).instant, 0, &STUB),
        WaitStep::Ready(h("a:1"))
    );
}

// ---------------------------------------------------------------------------------------
// A failover, end to end through the core

#[test]
fn a_retryable_batch_follows_the_primary_through_a_step_down() {
    let mut t = rs("rs0/a:1,b:1,c:1");
    hello(
        &mut t,
        "a:1",
        versioned(primary("a:1", &ABC, 1, 1), 1, 4),
        at(0),
    );
    hello(
        &mut t,
        "b:1",
        versioned(secondary("b:1", &ABC), 2, 2),
        at(0),
    );
    hello(
        &mut t,
        "c:1",
        versioned(secondary("c:1", &ABC), 3, 2),
        at(0),
    );
    let session = BatchSession {
        lsid: true,
        txn_number: true,
        in_transaction: false,
    };
    // The batch goes to a.
    let first = select_for_write(&t).unwrap();
    assert_eq!(first, h("a:1"));
    // a steps down while the batch runs: 11602 with its new topologyVersion.
    let gen = t.member(&first).unwrap().pool_generation();
    let err = ApplicationError::Command {
        generation: gen,
        code: 11602,
        topology_version: Some(topology_version(1, 5)),
    };
    let u = t.on_application_error(&first, &err, at(10));
    assert!(u.request_check && u.primary_changed);
    assert_eq!(
        resend_decision(session, BatchFailure::Command(11602), 0),
        Resend::ToPrimary
    );
    // Wait for the next primary.
    let wait = MemberWait::new(Need::Write, at(10).instant, t.settings(), None);
    let WaitStep::Wait { seen_version, .. } = wait.step(&t, at(10).instant, 0, &STUB) else {
        panic!("no primary during the election");
    };
    // a's monitor, answering an awaitable hello sent before the step-down, is ignored.
    let before = versioned(primary("a:1", &ABC, 1, 1), 1, 4);
    assert!(!hello(&mut t, "a:1", before, at(20)).applied);
    assert_eq!(t.version(), seen_version, "nothing changed: keep waiting");
    // b wins the election.
    let elected = versioned(primary("b:1", &ABC, 2, 1), 2, 3);
    hello(&mut t, "b:1", elected, at(900));
    assert_eq!(
        wait.step(&t, at(900).instant, 0, &STUB),
        WaitStep::Ready(h("b:1"))
    );
    // a's monitor now sees it as a secondary.
    hello(
        &mut t,
        "a:1",
        versioned(secondary("a:1", &ABC), 1, 5),
        at(950),
    );
    assert_eq!(kind_of(&t, "a:1"), ServerType::RsSecondary);
    assert_eq!(primary_addr(&t).as_deref(), Some("b:1"));
    // The same batch without txnNumber would not have been resent.
    let plain = BatchSession {
        txn_number: false,
        ..session
    };
    assert_eq!(
        resend_decision(plain, BatchFailure::Command(11602), 0),
        Resend::No
    );
}

// ---------------------------------------------------------------------------------------
// Property: invariants over random event sequences

const POOL: [&str; 4] = ["a:1", "b:1", "c:1", "d:1"];

#[derive(Debug, Clone)]
enum Event {
    Primary {
        from: usize,
        hosts: Vec<usize>,
        election: u8,
        set_version: i32,
        tv: Option<(u8, i64)>,
        other_set: bool,
    },
    Secondary {
        from: usize,
        hosts: Vec<usize>,
        me: usize,
        tv: Option<(u8, i64)>,
    },
    Failed {
        from: usize,
    },
    AppError {
        from: usize,
        code: i32,
        tv: Option<(u8, i64)>,
        generation_lag: u64,
    },
    Network {
        from: usize,
        timeout: bool,
    },
    Monitor {
        from: usize,
        connect: bool,
    },
}

fn arb_tv() -> impl Strategy<Value = Option<(u8, i64)>> {
    proptest::option::of((0u8..2, 0i64..6))
}

fn arb_hosts() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0usize..4, 1..4)
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (
            0usize..4,
            arb_hosts(),
            0u8..4,
            1i32..3,
            arb_tv(),
            proptest::bool::weighted(0.1)
        )
            .prop_map(|(from, hosts, election, set_version, tv, other_set)| {
                Event::Primary {
                    from,
                    hosts,
                    election,
                    set_version,
                    tv,
                    other_set,
                }
            }),
        (0usize..4, arb_hosts(), 0usize..4, arb_tv()).prop_map(|(from, hosts, me, tv)| {
            Event::Secondary {
                from,
                hosts,
                me,
                tv,
            }
        }),
        (0usize..4).prop_map(|from| Event::Failed { from }),
        (
            0usize..4,
            proptest::sample::select(vec![10107, 13435, 189, 11602, 91, 11600, 6, 89, 11000]),
            arb_tv(),
            0u64..2
        )
            .prop_map(|(from, code, tv, generation_lag)| Event::AppError {
                from,
                code,
                tv,
                generation_lag
            }),
        (0usize..4, proptest::bool::ANY)
            .prop_map(|(from, timeout)| Event::Network { from, timeout }),
        (0usize..4, proptest::bool::ANY)
            .prop_map(|(from, connect)| Event::Monitor { from, connect }),
    ]
}

fn apply(t: &mut ShardTopology, e: &Event, now: Now) -> Update {
    let hosts = |v: &[usize]| v.iter().map(|i| POOL[*i]).collect::<Vec<_>>();
    let tv_of = |x: &Option<(u8, i64)>| x.map(|(p, c)| topology_version(p, c));
    let gen = |t: &ShardTopology, from: usize, lag: u64| {
        t.member(&h(POOL[from]))
            .map(|m| m.pool_generation().saturating_sub(lag))
            .unwrap_or(0)
    };
    match e {
        Event::Primary {
            from,
            hosts: hs,
            election,
            set_version,
            tv: v,
            other_set,
        } => {
            let mut d = primary(POOL[*from], &hosts(hs), *election, *set_version);
            if let Some((p, c)) = v {
                d.insert("topologyVersion", tv(*p, *c));
            }
            if *other_set {
                d.insert("setName", "rs9");
            }
            hello(t, POOL[*from], d, now)
        }
        Event::Secondary {
            from,
            hosts: hs,
            me,
            tv: v,
        } => {
            let mut d = secondary(POOL[*me], &hosts(hs));
            if let Some((p, c)) = v {
                d.insert("topologyVersion", tv(*p, *c));
            }
            hello(t, POOL[*from], d, now)
        }
        Event::Failed { from } => hello(t, POOL[*from], doc! {"ok": 0, "errmsg": "x"}, now),
        Event::AppError {
            from,
            code,
            tv: v,
            generation_lag,
        } => {
            let err = ApplicationError::Command {
                generation: gen(t, *from, *generation_lag),
                code: *code,
                topology_version: tv_of(v),
            };
            t.on_application_error(&h(POOL[*from]), &err, now)
        }
        Event::Network { from, timeout } => {
            let err = ApplicationError::Network {
                generation: gen(t, *from, 0),
                during_handshake: false,
                timeout: *timeout,
            };
            t.on_application_error(&h(POOL[*from]), &err, now)
        }
        Event::Monitor { from, connect } => {
            let kind = if *connect {
                MonitorError::Connect
            } else {
                MonitorError::Network
            };
            t.on_monitor_error(&h(POOL[*from]), kind, now)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Whatever the members say and whatever fails: at most one primary; the topology kind
    /// says whether there is one; a primary's (electionId, setVersion) is the highest seen and
    /// that maximum never goes back; the version never goes back and moves when something
    /// was applied; updates report exactly the members that came and went; every remaining
    /// member reports the set's name (or has not answered).
    #[test]
    fn topology_invariants(events in proptest::collection::vec(arb_event(), 1..40)) {
        let mut t = rs("rs0/a:1,b:1");
        for (i, e) in events.iter().enumerate() {
            let before_members: Vec<HostAddr> = t.members().map(|m| m.addr().clone()).collect();
            let before_max = t.max_election_id_set_version();
            let before_version = t.version();
            let u = apply(&mut t, e, at(i as u64 * 10));
            let after_members: Vec<HostAddr> = t.members().map(|m| m.addr().clone()).collect();

            let primaries = t.members().filter(|m| m.server_type() == ServerType::RsPrimary).count();
            prop_assert!(primaries <= 1, "{} primaries after {:?}", primaries, e);
            prop_assert_eq!(
                t.kind() == TopologyKind::ReplicaSetWithPrimary,
                primaries == 1
            );
            if let Some(p) = t.primary() {
                let pair = ElectionIdSetVersion {
                    election_id: p.hello().election_id,
                    set_version: p.hello().set_version,
                };
                prop_assert_eq!(pair, t.max_election_id_set_version());
            }
            prop_assert!(!t.max_election_id_set_version().is_older_than(&before_max));
            prop_assert!(t.version() >= before_version);
            if u.applied {
                prop_assert!(t.version() > before_version);
            } else {
                prop_assert_eq!(t.version(), before_version);
                prop_assert_eq!(&after_members, &before_members);
            }
            for a in &u.added {
                prop_assert!(!before_members.contains(a) && after_members.contains(a));
            }
            for r in &u.removed {
                prop_assert!(before_members.contains(r) && !after_members.contains(r));
            }
            for m in &after_members {
                prop_assert!(before_members.contains(m) || u.added.contains(m));
            }
            for m in &before_members {
                prop_assert!(after_members.contains(m) || u.removed.contains(m));
            }
            for m in t.members() {
                if m.server_type() != ServerType::Unknown && m.server_type() != ServerType::RsGhost {
                    prop_assert_eq!(m.hello().set_name.as_deref(), Some("rs0"));
                }
            }
            prop_assert_eq!(
                select_for_write(&t),
                t.primary().map(|m| m.addr().clone())
            );
        }
    }
}
