//! The shard monitors on real sockets: an embedded shard answering as a one-member replica
//! set, and scripted fake members (a tokio listener answering `hello` with the replies a test
//! chooses: primary, secondary, stepped down, a new or an older `electionId`, with or without
//! a `topologyVersion`) for discovery and failover.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use sluice::backend::topology::state::ApplicationError;
use sluice::backend::topology::{
    HostAddr, MonitorOptions, Need, Printer, SeedList, ServerType, ShardMonitor, TopologyKind,
    TopologySettings,
};
use sluice::value::error_codes::ErrorCode;
use sluice::wire::{self, Message, OpMsgBuilder};

const PRINTER: Printer = Printer {
    document: |d| d.to_string(),
    value: |v| v.to_string(),
    type_name: |_| "object",
};

/// What a fake member says it is.
#[derive(Debug, Clone, PartialEq)]
enum Role {
    Primary { election: ObjectId },
    Secondary,
}

#[derive(Debug, Clone)]
struct Script {
    role: Role,
    hosts: Vec<String>,
    primary: Option<String>,
    /// Whether replies carry a `topologyVersion` (and awaitable `hello` is honoured).
    streaming: bool,
    counter: i64,
}

/// A scripted replica-set member on a loopback port.
struct FakeMember {
    addr: String,
    process_id: ObjectId,
    script: watch::Sender<Script>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    awaitable_seen: Arc<AtomicU64>,
    hellos_seen: Arc<AtomicU64>,
    /// New connections still to cut: each reads its handshake and is closed unanswered (a
    /// member that is stopping or starting).
    cut: Arc<AtomicU64>,
    /// While set, a `hello` that is not a connection's handshake (a monitor's check) closes
    /// the connection: the monitor's checks fail, the data path's connections keep working.
    fail_checks: Arc<AtomicBool>,
    /// While set, an awaitable `hello` is answered at once (a member that does not
    /// implement the wait), with the `topologyVersion` it was sent.
    no_wait: Arc<AtomicBool>,
}

impl FakeMember {
    async fn bind() -> (TcpListener, String) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let a = l.local_addr().expect("addr").to_string();
        (l, a)
    }

    fn start(listener: TcpListener, addr: String, streaming: bool) -> FakeMember {
        let (script, _) = watch::channel(Script {
            role: Role::Secondary,
            hosts: vec![addr.clone()],
            primary: None,
            streaming,
            counter: 0,
        });
        let m = FakeMember {
            addr,
            process_id: ObjectId::new(),
            script,
            tasks: Arc::new(Mutex::new(Vec::new())),
            awaitable_seen: Arc::new(AtomicU64::new(0)),
            hellos_seen: Arc::new(AtomicU64::new(0)),
            cut: Arc::new(AtomicU64::new(0)),
            fail_checks: Arc::new(AtomicBool::new(false)),
            no_wait: Arc::new(AtomicBool::new(false)),
        };
        let tasks = m.tasks.clone();
        let cut = m.cut.clone();
        let ctx = (
            m.addr.clone(),
            m.process_id,
            m.script.clone(),
            m.awaitable_seen.clone(),
            m.hellos_seen.clone(),
            m.fail_checks.clone(),
            m.no_wait.clone(),
        );
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                if cut
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    tokio::spawn(async move {
                        let mut buf = [0u8; 64];
                        let _ = socket.read(&mut buf).await;
                    });
                    continue;
                }
                let ctx = ctx.clone();
                let conn = tokio::spawn(serve(
                    socket,
                    ctx.0,
                    ctx.1,
                    ctx.2.subscribe(),
                    (ctx.3, ctx.4, ctx.6),
                    ctx.5,
                ));
                tasks.lock().unwrap().push(conn);
            }
        });
        m.tasks.lock().unwrap().push(accept);
        m
    }

    fn host(&self) -> HostAddr {
        HostAddr::parse(&self.addr).expect("address")
    }

    /// Changes the script; the `topologyVersion` counter moves, as on a role change.
    fn set(&self, role: Role, hosts: &[&FakeMember], primary: Option<&FakeMember>) {
        self.script.send_modify(|s| {
            s.role = role;
            s.hosts = hosts.iter().map(|m| m.addr.clone()).collect();
            s.primary = primary.map(|m| m.addr.clone());
            s.counter += 1;
        });
    }

    /// Stops listening and closes every connection.
    fn kill(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

fn reply_for(addr: &str, process_id: ObjectId, s: &Script) -> Document {
    let mut d = doc! {
        "setName": "rs0",
        "setVersion": 1,
        "hosts": s.hosts.iter().map(|h| Bson::String(h.clone())).collect::<Vec<_>>(),
        "me": addr,
        "maxWireVersion": 21,
        "minWireVersion": 0,
    };
    match &s.role {
        Role::Primary { election } => {
            d.insert("isWritablePrimary", true);
            d.insert("secondary", false);
            d.insert("electionId", *election);
            d.insert("primary", addr);
        }
        Role::Secondary => {
            d.insert("isWritablePrimary", false);
            d.insert("secondary", true);
            if let Some(p) = &s.primary {
                d.insert("primary", p.clone());
            }
        }
    }
    if s.streaming {
        d.insert(
            "topologyVersion",
            doc! {"processId": process_id, "counter": s.counter},
        );
    }
    d.insert("ok", 1.0);
    d
}

async fn serve(
    mut socket: TcpStream,
    addr: String,
    process_id: ObjectId,
    mut script: watch::Receiver<Script>,
    (awaitable_seen, hellos_seen, no_wait): (Arc<AtomicU64>, Arc<AtomicU64>, Arc<AtomicBool>),
    fail_checks: Arc<AtomicBool>,
) {
    let mut next_id = 1;
    let mut first = true;
    loop {
        let mut len = [0u8; 4];
        if socket.read_exact(&mut len).await.is_err() {
            return;
        }
        let n = i32::from_le_bytes(len) as usize;
        let mut frame = len.to_vec();
        frame.resize(n, 0);
        if socket.read_exact(&mut frame[4..]).await.is_err() {
            return;
        }
        let Ok(incoming) = wire::decode(frame.into()) else {
            return;
        };
        let Message::Msg(msg) = incoming.message else {
            return;
        };
        let body = msg.body.to_document();
        if body.contains_key("hello") && !first && fail_checks.load(Ordering::SeqCst) {
            return;
        }
        first = false;
        let reply = if body.contains_key("hello") {
            hellos_seen.fetch_add(1, Ordering::SeqCst);
            let awaited = body.get_document("topologyVersion").ok().cloned();
            let wait = body.get_i64("maxAwaitTimeMS").ok();
            if let (Some(tv), Some(wait)) = (awaited, wait) {
                awaitable_seen.fetch_add(1, Ordering::SeqCst);
                let current = |s: &Script| {
                    s.streaming
                        && tv.get_object_id("processId").ok() == Some(process_id)
                        && tv.get_i64("counter").ok() == Some(s.counter)
                };
                // Answer when the state changes, or when the wait is over.
                if !no_wait.load(Ordering::SeqCst) {
                    let _ = tokio::time::timeout(
                        Duration::from_millis(wait as u64),
                        script.wait_for(|s| !current(s)),
                    )
                    .await;
                }
            }
            let s = script.borrow().clone();
            reply_for(&addr, process_id, &s)
        } else {
            doc! {"ok": 1.0}
        };
        let bytes = reply.to_vec().expect("encode");
        let out = OpMsgBuilder::new(0, &bytes).finish(next_id, incoming.header.request_id);
        next_id += 1;
        if socket.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// Three fake members (listening before any of them knows the others' addresses).
async fn three(streaming: bool) -> (FakeMember, FakeMember, FakeMember) {
    let (la, a) = FakeMember::bind().await;
    let (lb, b) = FakeMember::bind().await;
    let (lc, c) = FakeMember::bind().await;
    (
        FakeMember::start(la, a, streaming),
        FakeMember::start(lb, b, streaming),
        FakeMember::start(lc, c, streaming),
    )
}

fn settings(heartbeat_ms: u64) -> TopologySettings {
    TopologySettings {
        heartbeat_frequency: Duration::from_millis(heartbeat_ms),
        find_host_timeout: Duration::from_secs(10),
        ..TopologySettings::default()
    }
}

fn monitor(seeds: &str, settings: TopologySettings) -> ShardMonitor {
    ShardMonitor::start(
        &SeedList::parse(seeds).expect("seed list"),
        settings,
        MonitorOptions {
            connect_timeout: Duration::from_secs(2),
            ..MonitorOptions::default()
        },
    )
}

/// Waits (on the published version) until `f` holds of the topology, at most `limit`.
async fn until(m: &ShardMonitor, limit: Duration, f: impl Fn(&ShardMonitor) -> bool) -> bool {
    let mut rx = m.subscribe();
    let deadline = Instant::now() + limit;
    loop {
        if f(m) {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), rx.changed()).await;
    }
}

fn primary(m: &ShardMonitor) -> Option<HostAddr> {
    m.with_topology(|t| t.primary().map(|p| p.addr().clone()))
}

fn kind_of(m: &ShardMonitor, h: &HostAddr) -> Option<ServerType> {
    m.with_topology(|t| t.member(h).map(|x| x.server_type()))
}

fn election(n: u8) -> ObjectId {
    let mut b = [0u8; 12];
    b[0..4].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    b[11] = n;
    ObjectId::from_bytes(b)
}

#[tokio::test]
async fn embedded_shard_is_a_one_member_set_discovered_from_its_seed() {
    let shard = sluice::embedded::EmbeddedShard::start(
        "127.0.0.1:0",
        sluice::embedded::ShardOptions {
            set_name: "rs0".into(),
            ..sluice::embedded::ShardOptions::for_tests()
        },
    )
    .await
    .expect("shard");
    let addr = shard.local_addr().to_string();
    let m = monitor(&format!("rs0/{addr}"), settings(500));
    let me = HostAddr::parse(&addr).unwrap();
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(me.clone()))
        .await
    );
    assert_eq!(
        m.with_topology(|t| t.kind()),
        TopologyKind::ReplicaSetWithPrimary
    );
    assert_eq!(m.monitored(), vec![me.clone()]);
    // The shard reports a topologyVersion: the monitor streams, and a member answering an
    // awaitable hello at once is never checked in a tight loop.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let c = m.counts(&me);
    assert!(c.awaitable >= 1, "{c:?}");
    assert!(c.polls + c.awaitable <= 8, "checks in 1.5 s: {c:?}");
    // A shard of another set is not this set's member.
    let other = monitor(&format!("other/{addr}"), settings(500));
    assert!(
        until(&other, Duration::from_secs(10), |m| m
            .monitored()
            .is_empty())
        .await
    );
    assert!(other.with_topology(|t| t.members().count()) == 0);
}

#[tokio::test]
async fn discovers_the_set_from_one_seed_and_stops_monitors_of_removed_members() {
    let (a, b, c) = three(true).await;
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    let m = monitor(&format!("rs0/{}", b.addr), settings(500));
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(a.host()))
        .await
    );
    let mut all = vec![a.host(), b.host(), c.host()];
    all.sort();
    assert!(until(&m, Duration::from_secs(10), |m| m.monitored() == all).await);
    assert!(
        until(&m, Duration::from_secs(10), |m| kind_of(m, &c.host())
            == Some(ServerType::RsSecondary))
        .await
    );
    // The primary drops c from the set: c is removed and its monitor stopped.
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b],
        None,
    );
    let mut two = vec![a.host(), b.host()];
    two.sort();
    assert!(until(&m, Duration::from_secs(10), |m| m.monitored() == two).await);
    assert_eq!(kind_of(&m, &c.host()), None);
}

#[tokio::test]
async fn a_primary_change_is_followed_within_a_heartbeat_when_polling() {
    // No topologyVersion: the members are polled every heartbeat (500 ms).
    let (a, b, c) = three(false).await;
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    let m = monitor(
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        settings(500),
    );
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(a.host()))
        .await
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let ca = m.counts(&a.host());
    assert_eq!(ca.awaitable, 0, "{ca:?}");
    assert!(ca.polls >= 2, "{ca:?}");
    assert_eq!(a.awaitable_seen.load(Ordering::SeqCst), 0);
    // a steps down, b wins the next election.
    a.set(Role::Secondary, &[&a, &b, &c], Some(&b));
    b.set(
        Role::Primary {
            election: election(2),
        },
        &[&a, &b, &c],
        None,
    );
    let changed = Instant::now();
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(b.host()))
        .await
    );
    let took = changed.elapsed();
    // One heartbeat plus a round trip, with room for a loaded machine.
    assert!(
        took < Duration::from_millis(2500),
        "followed after {took:?}"
    );
    assert!(
        until(&m, Duration::from_secs(5), |m| kind_of(m, &a.host())
            == Some(ServerType::RsSecondary))
        .await
    );
}

#[tokio::test]
async fn awaitable_hello_streams_a_step_down_long_before_the_heartbeat() {
    // Heartbeat a minute: only streaming can see the change in time.
    let (a, b, c) = three(true).await;
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    let m = monitor(
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        settings(60_000),
    );
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(a.host())
            && m.with_topology(|t| t
                .members()
                .all(|x| x.server_type() != ServerType::Unknown)))
        .await
    );
    // Wait until every monitor has an awaitable hello in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    while [&a, &b, &c]
        .iter()
        .any(|x| x.awaitable_seen.load(Ordering::SeqCst) == 0)
    {
        assert!(Instant::now() < deadline, "no awaitable hello was sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.set(Role::Secondary, &[&a, &b, &c], Some(&c));
    c.set(
        Role::Primary {
            election: election(2),
        },
        &[&a, &b, &c],
        None,
    );
    let changed = Instant::now();
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(c.host()))
        .await
    );
    assert!(
        changed.elapsed() < Duration::from_secs(5),
        "seen after {:?}",
        changed.elapsed()
    );
    let cc = m.counts(&c.host());
    assert!(cc.awaitable >= 1, "{cc:?}");
    // Streaming, not polling: a handful of timed hellos (the first on each connection).
    assert!(cc.polls <= 3, "{cc:?}");
}

#[tokio::test]
async fn a_stale_primary_with_an_older_election_id_is_ignored() {
    let (a, b, c) = three(true).await;
    a.set(
        Role::Primary {
            election: election(5),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    let m = monitor(
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        settings(500),
    );
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(a.host())
            && kind_of(m, &b.host()) == Some(ServerType::RsSecondary))
        .await
    );
    // b still answers as the primary of an older term.
    b.set(
        Role::Primary {
            election: election(4),
        },
        &[&a, &b, &c],
        None,
    );
    let v = m.with_topology(|t| t.version());
    assert!(
        until(&m, Duration::from_secs(10), |m| m
            .with_topology(|t| t.version())
            > v
            && kind_of(m, &b.host()) == Some(ServerType::Unknown))
        .await
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(primary(&m), Some(a.host()));
    assert_ne!(kind_of(&m, &b.host()), Some(ServerType::RsPrimary));
    assert_eq!(
        m.with_topology(|t| t.max_election_id_set_version().election_id),
        Some(election(5))
    );
    // A newer term wins.
    a.set(Role::Secondary, &[&a, &b, &c], Some(&b));
    b.set(
        Role::Primary {
            election: election(6),
        },
        &[&a, &b, &c],
        None,
    );
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(b.host()))
        .await
    );
}

#[tokio::test]
async fn a_member_that_goes_away_is_unknown_and_the_primary_is_lost() {
    let (a, b, c) = three(true).await;
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    let m = monitor(
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        settings(500),
    );
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(a.host())
            && kind_of(m, &b.host()) == Some(ServerType::RsSecondary))
        .await
    );
    b.kill();
    assert!(
        until(&m, Duration::from_secs(10), |m| kind_of(m, &b.host())
            == Some(ServerType::Unknown))
        .await
    );
    // Still a member (the primary lists it), still monitored.
    assert!(m.monitored().contains(&b.host()));
    a.kill();
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m).is_none()
            && kind_of(m, &a.host()) == Some(ServerType::Unknown))
        .await
    );
    assert_eq!(
        m.with_topology(|t| t.kind()),
        TopologyKind::ReplicaSetNoPrimary
    );
}

#[tokio::test]
async fn waiters_for_a_primary_wake_when_one_is_elected() {
    let (a, b, c) = three(true).await;
    for x in [&a, &b, &c] {
        x.set(Role::Secondary, &[&a, &b, &c], None);
    }
    let m = Arc::new(monitor(
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        settings(60_000),
    ));
    assert!(
        until(&m, Duration::from_secs(10), |m| m.with_topology(|t| t
            .members()
            .all(|x| x.server_type() == ServerType::RsSecondary)))
        .await
    );
    // Bounded by the operation's deadline: MaxTimeMSExpired.
    let e = m
        .select(
            Need::Write,
            Some(Instant::now() + Duration::from_millis(300)),
            0,
            &PRINTER,
        )
        .await
        .expect_err("no primary");
    assert_eq!(e.code, ErrorCode::MaxTimeMSExpired);
    let waiters: Vec<_> = (0..3)
        .map(|i| {
            let m = m.clone();
            tokio::spawn(async move { m.select(Need::Write, None, i, &PRINTER).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    b.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    let elected = Instant::now();
    for w in waiters {
        let got = tokio::time::timeout(Duration::from_secs(8), w)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(got.expect("selected"), b.host());
    }
    assert!(elected.elapsed() < Duration::from_secs(8));
}

#[tokio::test]
async fn a_not_primary_error_from_the_data_path_marks_the_member_and_checks_at_once() {
    let (a, b, c) = three(false).await;
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    // Polling every 60 s: only the requested check can find the new primary in time.
    let m = monitor(
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        settings(60_000),
    );
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(a.host())
            && m.with_topology(|t| t
                .members()
                .all(|x| x.server_type() != ServerType::Unknown)))
        .await
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    a.set(Role::Secondary, &[&a, &b, &c], Some(&b));
    b.set(
        Role::Primary {
            election: election(2),
        },
        &[&a, &b, &c],
        None,
    );
    let generation = m.with_topology(|t| t.member(&a.host()).map(|x| x.pool_generation()));
    let update = m.report_application_error(
        &a.host(),
        &ApplicationError::Command {
            generation: generation.unwrap_or(0),
            code: ErrorCode::NotWritablePrimary.0,
            topology_version: None,
        },
    );
    assert!(update.applied && update.request_check && update.primary_changed);
    assert_eq!(kind_of(&m, &a.host()), Some(ServerType::Unknown));
    let e = m
        .select(
            Need::Write,
            Some(Instant::now() + Duration::from_secs(8)),
            0,
            &PRINTER,
        )
        .await;
    assert_eq!(e.expect("new primary"), b.host());
}

/// A member that answered an awaitable `hello` at once with nothing changed is not asked
/// again for 500 ms; if the data path marks it Unknown meanwhile (a connection it closed
/// after a write), the check the monitor had planned before — an awaitable `hello` with the
/// member's `topologyVersion` — is dropped for a poll. Sent, it would wait out
/// `maxAwaitTimeMS` (10 s) on a member whose state has not changed, and the shard would have
/// no primary for that long: the data path's mark cancelled only a `hello` already in flight.
#[tokio::test]
async fn a_member_marked_unknown_while_its_awaitable_hello_is_held_back_is_polled() {
    let (a, b, c) = three(true).await;
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    a.no_wait.store(true, Ordering::SeqCst);
    // Heartbeat a minute; the awaitable hello's wait is the default 10 s.
    let m = monitor(
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        settings(60_000),
    );
    assert!(
        until(&m, Duration::from_secs(10), |m| primary(m)
            == Some(a.host()))
        .await,
        "a is found primary"
    );
    // a answers an awaitable hello at once: its monitor now holds the next one back for
    // 500 ms. From now on a waits as a member should.
    let seen = a.awaitable_seen.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.awaitable_seen.load(Ordering::SeqCst) == seen {
        assert!(Instant::now() < deadline, "no awaitable hello was sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.no_wait.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The data path lost a connection to a (it closed it after applying a write).
    let generation = m.with_topology(|t| t.member(&a.host()).map(|x| x.pool_generation()));
    let update = m.report_application_error(
        &a.host(),
        &ApplicationError::Network {
            generation: generation.unwrap_or(0),
            during_handshake: false,
            timeout: false,
        },
    );
    assert!(update.applied && update.primary_changed);
    assert_eq!(kind_of(&m, &a.host()), Some(ServerType::Unknown));
    let marked = Instant::now();
    let found = m
        .select(
            Need::Write,
            Some(Instant::now() + Duration::from_secs(8)),
            0,
            &PRINTER,
        )
        .await;
    assert_eq!(found.expect("a is primary again"), a.host());
    assert!(
        marked.elapsed() < Duration::from_secs(3),
        "a seen primary again after {:?}",
        marked.elapsed()
    );
}

/// A data-path connection whose handshake the primary cuts short (it is stopping or starting)
/// carried no request: the request goes to the member selected next, even a write without a
/// session number, and the client never sees the broken handshake.
#[tokio::test]
async fn a_request_whose_connection_breaks_in_the_handshake_is_sent_again() {
    use sluice::backend::shard::{Resend, Shard};
    use sluice::backend::PoolOptions;

    let (a, b, c) = three(false).await;
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    let shard = Shard::new(
        "rs0",
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        PoolOptions {
            connect_timeout: Duration::from_secs(2),
            replica_set: settings(500),
            ..PoolOptions::default()
        },
    );
    let Some(m) = shard.monitor() else {
        panic!("a seed list with a set name is a replica set");
    };
    assert!(until(m, Duration::from_secs(10), |m| primary(m) == Some(a.host())).await);
    // Cut the next four connections to the primary — more than the resends a request that
    // may have been applied gets: attempts that never left count apart. The fifth carries it.
    a.cut.store(4, Ordering::SeqCst);
    let body = doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "test"};
    let bytes = body.to_vec().expect("encode");
    let frame = OpMsgBuilder::new(0, &bytes).finish(7, 0);
    let (reply, member) = shard
        .send(
            &frame,
            7,
            &Need::Write,
            Some(Instant::now() + Duration::from_secs(8)),
            Resend::Never,
        )
        .await
        .expect("sent on a connection that worked");
    assert_eq!(reply.to_document().get_f64("ok").ok(), Some(1.0));
    assert_eq!(member, a.addr);
    assert_eq!(a.cut.load(Ordering::SeqCst), 0, "every handshake was cut");
}

/// A member whose monitoring fails (its checks' connection breaks, twice in a row) is marked
/// Unknown and its pool in the data path is cleared, as server discovery asks: idle
/// connections are closed at once, and one in use is not reused when it comes back.
#[tokio::test]
async fn a_monitor_error_clears_the_members_pool_in_the_data_path() {
    use sluice::backend::shard::{Resend, Shard};
    use sluice::backend::PoolOptions;

    let (a, b, c) = three(false).await;
    a.set(
        Role::Primary {
            election: election(1),
        },
        &[&a, &b, &c],
        None,
    );
    b.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    c.set(Role::Secondary, &[&a, &b, &c], Some(&a));
    let shard = Shard::new(
        "rs0",
        &format!("rs0/{},{},{}", a.addr, b.addr, c.addr),
        PoolOptions {
            connect_timeout: Duration::from_secs(2),
            replica_set: settings(500),
            ..PoolOptions::default()
        },
    );
    let Some(m) = shard.monitor() else {
        panic!("a seed list with a set name is a replica set");
    };
    assert!(until(m, Duration::from_secs(10), |m| primary(m) == Some(a.host())).await);
    let deadline = Some(Instant::now() + Duration::from_secs(8));
    // One connection held, one idle.
    let held = shard
        .checkout(&Need::Write, deadline)
        .await
        .expect("a connection");
    let body = doc! {"ping": 1, "$db": "admin"};
    let bytes = body.to_vec().expect("encode");
    let frame = OpMsgBuilder::new(0, &bytes).finish(9, 0);
    shard
        .send(&frame, 9, &Need::Write, deadline, Resend::Never)
        .await
        .expect("a reply");
    assert_eq!(shard.idle_count(), 1);
    assert!(!held.is_stale());

    a.fail_checks.store(true, Ordering::SeqCst);
    assert!(
        until(m, Duration::from_secs(10), |m| kind_of(m, &a.host())
            == Some(ServerType::Unknown))
        .await,
        "the monitor marks the member Unknown"
    );
    assert_eq!(shard.idle_count(), 0, "idle connections closed");
    assert!(
        held.is_stale(),
        "the connection in use belongs to a cleared pool"
    );
    drop(held);
    assert_eq!(
        shard.idle_count(),
        0,
        "and is not reused when it comes back"
    );
}
