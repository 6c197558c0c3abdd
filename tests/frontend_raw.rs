//! The router over a raw socket: every malformed input gets mongod's answer (an error reply, or
//! a logged close where the stream cannot be trusted), and afterwards a second connection is
//! still served. Also the protocol duties of a connection: moreToCome, checksums, the legacy
//! handshake, awaitable and exhaust `hello`, the connection limit and graceful shutdown.

mod common;

use std::time::{Duration, Instant};

use bson::doc;
use common::{
    assert_still_serving, fix_length, parse_msg_reply, start_router, start_router_with, Raw,
};
use sluice::config::Config;
use sluice::wire::{Header, MsgFlags, OpCode, OpMsgBuilder};

fn ping() -> bson::Document {
    doc! {"ping": 1, "$db": "admin"}
}

fn ping_frame(flags: u32) -> Vec<u8> {
    OpMsgBuilder::new(flags, &ping().to_vec().unwrap())
        .finish(7, 0)
        .to_vec()
}

fn legacy_frame(op: i32, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    Header {
        length: (16 + body.len()) as i32,
        request_id: 9,
        response_to: 0,
        op_code: OpCode::from_i32(op),
    }
    .write(&mut v);
    v.extend_from_slice(body);
    v
}

fn op_query_frame(ns: &str, query: &bson::Document) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&0i32.to_le_bytes());
    body.extend_from_slice(ns.as_bytes());
    body.push(0);
    body.extend_from_slice(&0i32.to_le_bytes());
    body.extend_from_slice(&(-1i32).to_le_bytes());
    body.extend_from_slice(&query.to_vec().unwrap());
    legacy_frame(2004, &body)
}

/// Parses an OP_REPLY: (responseFlags, document).
fn parse_op_reply(frame: &[u8]) -> (i32, bson::Document) {
    let h = Header::parse(frame).unwrap();
    assert_eq!(h.op_code, OpCode::Reply);
    let flags = i32::from_le_bytes(frame[16..20].try_into().unwrap());
    let returned = i32::from_le_bytes(frame[32..36].try_into().unwrap());
    assert_eq!(returned, 1);
    (flags, bson::Document::from_reader(&frame[36..]).unwrap())
}

async fn expect_error(raw: &mut Raw, frame: &[u8], code: i32) -> bson::Document {
    raw.send(frame).await;
    let (_, _, reply) = raw.read_msg().await;
    assert_eq!(reply.get_f64("ok").unwrap(), 0.0, "{reply}");
    assert_eq!(reply.get_i32("code").unwrap(), code, "{reply}");
    assert!(reply.get_str("codeName").is_ok());
    assert!(reply.get_str("errmsg").is_ok());
    reply
}

#[tokio::test]
async fn impossible_lengths_close_only_that_connection() {
    let router = start_router().await;
    let addr = router.local_addr();
    for len in [0i32, 15, -5, 48_000_001, i32::MAX] {
        let mut raw = Raw::connect(addr).await;
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0u8; 12]);
        raw.send(&bytes).await;
        assert!(
            raw.is_closed().await,
            "length {len} must close the connection"
        );
        assert_still_serving(addr).await;
    }
    router.shutdown().await;
}

#[tokio::test]
async fn truncated_message_then_eof_is_dropped() {
    let router = start_router().await;
    let addr = router.local_addr();
    let mut raw = Raw::connect(addr).await;
    let frame = ping_frame(0);
    raw.send(&frame[..frame.len() - 5]).await;
    tokio::io::AsyncWriteExt::shutdown(&mut raw.stream)
        .await
        .unwrap();
    assert!(raw.is_closed().await);
    assert_still_serving(addr).await;
    router.shutdown().await;
}

#[tokio::test]
async fn unknown_and_removed_opcodes() {
    let router = start_router().await;
    let addr = router.local_addr();

    // Unknown opcode: closed.
    let mut raw = Raw::connect(addr).await;
    raw.send(&legacy_frame(4242, &[0u8; 8])).await;
    assert!(raw.is_closed().await);
    assert_still_serving(addr).await;

    // Fire-and-forget legacy writes: closed, so the client cannot believe they landed.
    for op in [2001, 2002, 2006, 2007] {
        let mut raw = Raw::connect(addr).await;
        raw.send(&legacy_frame(op, &[0u8; 20])).await;
        assert!(raw.is_closed().await, "opcode {op}");
        assert_still_serving(addr).await;
    }

    // OP_GET_MORE: an OP_REPLY with QueryFailure and mongod's code.
    let mut raw = Raw::connect(addr).await;
    raw.send(&legacy_frame(2005, &[0u8; 20])).await;
    let frame = raw.read_frame(Duration::from_secs(5)).await.unwrap();
    let (flags, reply) = parse_op_reply(&frame);
    assert_eq!(flags & 2, 2, "QueryFailure");
    assert_eq!(reply.get_i32("code").unwrap(), 5739101);
    assert_still_serving(addr).await;
    router.shutdown().await;
}

#[tokio::test]
async fn legacy_handshake_over_op_query() {
    let router = start_router().await;
    let addr = router.local_addr();
    let mut raw = Raw::connect(addr).await;

    for cmd in [
        doc! {"ismaster": 1, "helloOk": true, "client": {"driver": {"name": "raw", "version": "0"}}, "compression": ["zstd", "snappy"]},
        doc! {"$query": {"isMaster": 1}, "$readPreference": {"mode": "primaryPreferred"}},
    ] {
        raw.send(&op_query_frame("admin.$cmd", &cmd)).await;
        let frame = raw.read_frame(Duration::from_secs(5)).await.unwrap();
        let h = Header::parse(&frame).unwrap();
        assert_eq!(h.response_to, 9);
        let (flags, reply) = parse_op_reply(&frame);
        assert_eq!(flags, 8, "AwaitCapable");
        assert!(reply.get_bool("ismaster").unwrap(), "{reply}");
        assert_eq!(reply.get_str("msg").unwrap(), "isdbgrid");
        if cmd.contains_key("helloOk") {
            assert!(reply.get_bool("helloOk").unwrap());
            let comp: Vec<&str> = reply
                .get_array("compression")
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            assert_eq!(comp, ["zstd", "snappy"], "client order kept");
        }
    }

    // Any other command over OP_QUERY is refused with 352.
    raw.send(&op_query_frame(
        "admin.$cmd",
        &doc! {"insert": "c", "documents": []},
    ))
    .await;
    let (_, reply) = parse_op_reply(&raw.read_frame(Duration::from_secs(5)).await.unwrap());
    assert_eq!(reply.get_i32("code").unwrap(), 352);
    assert_eq!(
        reply.get_str("codeName").unwrap(),
        "UnsupportedOpQueryCommand"
    );

    // A legacy query on a collection is refused as well.
    raw.send(&op_query_frame("test.c", &doc! {"a": 1})).await;
    let (flags, reply) = parse_op_reply(&raw.read_frame(Duration::from_secs(5)).await.unwrap());
    assert_eq!(flags & 2, 2);
    assert_eq!(reply.get_i32("code").unwrap(), 5739101);

    // The same connection then speaks OP_MSG.
    let reply = raw.command(&ping()).await;
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    router.shutdown().await;
}

#[tokio::test]
async fn malformed_op_msg_gets_error_replies_and_the_connection_survives() {
    let router = start_router().await;
    let addr = router.local_addr();
    let mut raw = Raw::connect(addr).await;
    let body = ping().to_vec().unwrap();
    let good = ping_frame(0);

    // Second body section.
    let mut m = good.clone();
    m.push(0);
    m.extend_from_slice(&body);
    expect_error(&mut raw, &fix_length(m), 40430).await;

    // Unknown section kind.
    let mut m = good.clone();
    m.push(9);
    m.extend_from_slice(&body);
    expect_error(&mut raw, &fix_length(m), 40432).await;

    // Duplicate document sequence.
    let ib = doc! {"insert": "c", "$db": "test"}.to_vec().unwrap();
    let mut b = OpMsgBuilder::new(0, &ib);
    b.begin_sequence("documents");
    b.push_document(&doc! {"_id": 1}.to_vec().unwrap());
    b.begin_sequence("documents");
    expect_error(&mut raw, &b.finish(3, 0), 40431).await;

    // A field both in the body and a sequence.
    let ib = doc! {"insert": "c", "documents": [], "$db": "test"}
        .to_vec()
        .unwrap();
    let mut b = OpMsgBuilder::new(0, &ib);
    b.begin_sequence("documents");
    expect_error(&mut raw, &b.finish(3, 0), 40433).await;

    // No body at all.
    let mut m = good[..20].to_vec();
    let mut b = OpMsgBuilder::new(0, &ib);
    b.begin_sequence("documents");
    let seq_only = b.finish(3, 0);
    m.extend_from_slice(&seq_only[21 + ib.len()..]);
    expect_error(&mut raw, &fix_length(m), 40587).await;

    // Invalid BSON: an unknown element type inside the body.
    let mut m = good.clone();
    m[25] = 0x66;
    expect_error(&mut raw, &m, 22).await;

    // Invalid BSON: a body length running past the message.
    let mut m = good.clone();
    m[21] = 0x7f;
    expect_error(&mut raw, &m, 22).await;

    // Invalid UTF-8 in a string.
    let weird = doc! {"ping": 1, "$db": "admin", "comment": "ok"}
        .to_vec()
        .unwrap();
    let mut m = OpMsgBuilder::new(0, &weird).finish(4, 0).to_vec();
    let pos = m.windows(2).rposition(|w| w == b"ok").unwrap();
    m[pos] = 0xff;
    expect_error(&mut raw, &m, 22).await;

    // No $db.
    let m = OpMsgBuilder::new(0, &doc! {"ping": 1}.to_vec().unwrap()).finish(5, 0);
    expect_error(&mut raw, &m, 40571).await;

    // Unknown command.
    let reply = raw.command(&doc! {"frobnicate": 1, "$db": "admin"}).await;
    assert_eq!(reply.get_i32("code").unwrap(), 59);
    assert_eq!(
        reply.get_str("errmsg").unwrap(),
        "no such command: 'frobnicate'"
    );

    // After all that, the same connection still answers.
    let reply = raw.command(&ping()).await;
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    assert_still_serving(addr).await;
    router.shutdown().await;
}

#[tokio::test]
async fn connection_fatal_parse_errors_reply_then_close() {
    let router = start_router().await;
    let addr = router.local_addr();

    // Unknown required flag bit: 223, then closed.
    let mut raw = Raw::connect(addr).await;
    let mut m = ping_frame(0);
    m[16] |= 0x08;
    expect_error(&mut raw, &m, 223).await;
    assert!(raw.is_closed().await);
    assert_still_serving(addr).await;

    // Wrong checksum: 288, then closed.
    let mut raw = Raw::connect(addr).await;
    let mut m = ping_frame(MsgFlags::CHECKSUM_PRESENT);
    let last = m.len() - 1;
    m[last] ^= 0x55;
    expect_error(&mut raw, &m, 288).await;
    assert!(raw.is_closed().await);
    assert_still_serving(addr).await;
    router.shutdown().await;
}

#[tokio::test]
async fn checksums_are_verified_and_returned() {
    let router = start_router().await;
    let mut raw = Raw::connect(router.local_addr()).await;
    raw.send(&ping_frame(MsgFlags::CHECKSUM_PRESENT)).await;
    let frame = raw.read_frame(Duration::from_secs(5)).await.unwrap();
    let (_, flags, reply) = parse_msg_reply(&frame);
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    assert_eq!(flags & 1, 1, "the reply carries a checksum too");
    let n = frame.len();
    let crc = u32::from_le_bytes(frame[n - 4..].try_into().unwrap());
    assert_eq!(crc, crc32c::crc32c(&frame[..n - 4]));
    router.shutdown().await;
}

#[tokio::test]
async fn more_to_come_requests_get_no_reply() {
    let router = start_router().await;
    let mut raw = Raw::connect(router.local_addr()).await;
    raw.send_msg(&ping(), MsgFlags::MORE_TO_COME).await;
    raw.send_msg(
        &doc! {"frobnicate": 1, "$db": "admin"},
        MsgFlags::MORE_TO_COME,
    )
    .await;
    let id = raw.send_msg(&ping(), 0).await;
    let (h, _, reply) = raw.read_msg().await;
    assert_eq!(
        h.response_to, id,
        "the first reply answers the third request"
    );
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    router.shutdown().await;
}

#[tokio::test]
async fn client_metadata_only_once() {
    let router = start_router().await;
    let mut raw = Raw::connect(router.local_addr()).await;
    let meta = doc! {"driver": {"name": "raw", "version": "1"}};
    let r = raw
        .command(&doc! {"hello": 1, "client": meta.clone(), "$db": "admin"})
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
    let r = raw
        .command(&doc! {"hello": 1, "client": meta, "$db": "admin"})
        .await;
    assert_eq!(r.get_i32("code").unwrap(), 186);
    router.shutdown().await;
}

#[tokio::test]
async fn awaitable_hello_waits_and_exhaust_streams() {
    let router = start_router().await;
    let mut raw = Raw::connect(router.local_addr()).await;
    let first = raw.command(&doc! {"hello": 1, "$db": "admin"}).await;
    let tv = first.get_document("topologyVersion").unwrap().clone();

    // Current topologyVersion: the reply waits for maxAwaitTimeMS.
    let start = Instant::now();
    let r = raw
        .command(&doc! {"hello": 1, "topologyVersion": tv.clone(), "maxAwaitTimeMS": 200, "$db": "admin"})
        .await;
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);

    // A stale topologyVersion is answered at once (no wait needed to see the new one).
    let stale = doc! {"processId": bson::oid::ObjectId::new(), "counter": 0i64};
    let r = raw
        .command(
            &doc! {"hello": 1, "topologyVersion": stale, "maxAwaitTimeMS": 60_000, "$db": "admin"},
        )
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);

    // Only one of the two fields: an error.
    let r = raw
        .command(&doc! {"hello": 1, "topologyVersion": tv.clone(), "$db": "admin"})
        .await;
    assert_eq!(r.get_f64("ok").unwrap(), 0.0);

    // Exhaust: replies keep coming with moreToCome, each answering the previous one.
    let id = raw
        .send_msg(
            &doc! {"hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 50, "$db": "admin"},
            MsgFlags::EXHAUST_ALLOWED,
        )
        .await;
    let mut respond_to = id;
    for _ in 0..3 {
        let (h, flags, reply) = raw.read_msg().await;
        assert_eq!(h.response_to, respond_to);
        assert_eq!(flags & MsgFlags::MORE_TO_COME, MsgFlags::MORE_TO_COME);
        assert_eq!(reply.get_str("msg").unwrap(), "isdbgrid");
        respond_to = h.request_id;
    }
    drop(raw);
    assert_still_serving(router.local_addr()).await;
    router.shutdown().await;
}

#[tokio::test]
async fn connection_limit_refuses_extra_connections() {
    let router = start_router_with(Config {
        max_connections: 2,
        ..Config::default()
    })
    .await;
    let addr = router.local_addr();
    let mut a = Raw::connect(addr).await;
    let mut b = Raw::connect(addr).await;
    assert_eq!(a.command(&ping()).await.get_f64("ok").unwrap(), 1.0);
    assert_eq!(b.command(&ping()).await.get_f64("ok").unwrap(), 1.0);
    let mut c = Raw::connect(addr).await;
    assert!(c.is_closed().await, "the third connection is refused");
    drop(a);
    // Once a slot frees up, new connections are served again.
    let mut served = false;
    for _ in 0..50 {
        let mut d = Raw::connect(addr).await;
        d.send(&ping_frame(0)).await;
        if d.read_frame(Duration::from_secs(5)).await.is_some() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served);
    assert_eq!(b.command(&ping()).await.get_f64("ok").unwrap(), 1.0);
    router.shutdown().await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_requests() {
    let router = start_router().await;
    let addr = router.local_addr();
    let mut raw = Raw::connect(addr).await;
    let tv = raw
        .command(&doc! {"hello": 1, "$db": "admin"})
        .await
        .get_document("topologyVersion")
        .unwrap()
        .clone();
    // A request in flight: an awaitable hello that would wait a minute.
    let id = raw
        .send_msg(
            &doc! {"hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 60_000, "$db": "admin"},
            0,
        )
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = tokio::spawn(router.shutdown());
    let (h, _, reply) = raw.read_msg().await;
    assert_eq!(h.response_to, id, "the in-flight request is answered");
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0);
    assert!(raw.is_closed().await, "then the connection is closed");
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("shutdown completes")
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

/// A service that panics on `boom` while holding its lock, and answers `count` from the
/// state behind that lock.
struct Panicky {
    state: std::sync::Arc<sluice::command::ServerState>,
    counter: std::sync::Mutex<i64>,
}

impl sluice::frontend::Service for Panicky {
    fn state(&self) -> &std::sync::Arc<sluice::command::ServerState> {
        &self.state
    }

    fn handle<'a>(
        &'a self,
        _client: &'a mut sluice::command::ClientState,
        req: &'a sluice::command::CommandRequest,
    ) -> sluice::frontend::BoxFuture<'a, sluice::frontend::Response> {
        Box::pin(async move {
            let mut n = sluice::sync::lock(&self.counter);
            *n += 1;
            if req.name == "boom" {
                panic!("boom on purpose");
            }
            sluice::frontend::Response::Reply(doc! {"n": *n, "ok": 1.0})
        })
    }
}

#[tokio::test]
async fn a_panic_fails_only_its_request() {
    let config = Config {
        listen: "127.0.0.1:0".into(),
        ..Config::default()
    };
    let handle = sluice::frontend::start_service(config, vec![], |state| {
        std::sync::Arc::new(Panicky {
            state,
            counter: std::sync::Mutex::new(0),
        })
    })
    .await
    .unwrap();
    let addr = handle.local_addr();
    let mut raw = Raw::connect(addr).await;
    let r = raw.command(&doc! {"boom": 1, "$db": "admin"}).await;
    assert_eq!(r.get_f64("ok").unwrap(), 0.0);
    assert_eq!(r.get_i32("code").unwrap(), 1);
    assert_eq!(r.get_str("codeName").unwrap(), "InternalError");
    assert_eq!(
        r.get_str("errmsg").unwrap(),
        "internal error while running command 'boom': boom on purpose"
    );
    // The same connection goes on, and the lock the panic held is usable again.
    let r = raw.command(&doc! {"count": 1, "$db": "admin"}).await;
    assert_eq!(r.get_i64("n").unwrap(), 2, "{r}");
    let mut other = Raw::connect(addr).await;
    let r = other.command(&doc! {"count": 1, "$db": "admin"}).await;
    assert_eq!(r.get_i64("n").unwrap(), 3);
    handle.shutdown().await;
}

#[tokio::test]
async fn get_parameter_reports_enable_test_commands() {
    for enabled in [false, true] {
        let router = start_router_with(Config {
            enable_test_commands: enabled,
            ..Config::default()
        })
        .await;
        let mut raw = Raw::connect(router.local_addr()).await;
        let r = raw
            .command(&doc! {"getParameter": 1, "enableTestCommands": 1, "$db": "admin"})
            .await;
        assert_eq!(r.get_bool("enableTestCommands").unwrap(), enabled, "{r}");
        let all = raw
            .command(&doc! {"getParameter": "*", "$db": "admin"})
            .await;
        assert_eq!(
            all.get_bool("enableTestCommands").unwrap(),
            enabled,
            "{all}"
        );
        assert_eq!(
            all.get_i64("internalQueryMaxBlockingSortMemoryUsageBytes")
                .unwrap(),
            100 * 1024 * 1024
        );
        // The router's own fail point with test commands; unknown (59) without them, as on
        // mongos.
        let r = raw
            .command(&doc! {"configureFailPoint": "failCommand", "mode": "off", "$db": "admin"})
            .await;
        if enabled {
            assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r}");
            assert_eq!(r.get_i32("count").unwrap(), 0);
        } else {
            assert_eq!(r.get_i32("code").unwrap(), 59);
        }
        router.shutdown().await;
    }
}
