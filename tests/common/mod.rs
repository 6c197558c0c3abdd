//! Helpers shared by the integration tests: a router on an ephemeral loopback port, and a
//! raw-socket client that speaks the wire protocol byte by byte.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bson::Document;
use sluice::config::Config;
use sluice::frontend::RouterHandle;
use sluice::wire::{Header, OpCode, OpMsgBuilder, HEADER_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The server's error code in a driver error (a command error or a single write error); panics
/// on any other kind of error, which a test expecting a code did not expect.
pub fn error_code(e: &mongodb::error::Error) -> i32 {
    match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => c.code,
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(ref w)) => w.code,
        ref other => panic!("not a command or write error: {other:?}"),
    }
}

/// The code of a command that failed as a whole; panics on any other kind of error (a write
/// error included), which a test expecting a command error did not expect.
pub fn command_code(e: &mongodb::error::Error) -> i32 {
    match *e.kind {
        mongodb::error::ErrorKind::Command(ref c) => c.code,
        ref other => panic!("not a command error: {other:?}"),
    }
}

/// A fresh `txnNumber` for a retryable write (one counter for the whole test binary, so no
/// two writes of one session reuse a number).
pub fn next_txn_number() -> i64 {
    static TXN: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);
    TXN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A BSON timestamp.
pub fn ts(time: u32, increment: u32) -> bson::Timestamp {
    bson::Timestamp { time, increment }
}

/// The router's `explain` of `command` on `db`: the winning plan's stage (`SINGLE_SHARD`,
/// `SHARD_MERGE`) and the shards it names, in order.
pub async fn explain_shards(db: &mongodb::Database, command: Document) -> (String, Vec<String>) {
    let e = db
        .run_command(bson::doc! {"explain": command})
        .await
        .expect("explain");
    let plan = e
        .get_document("queryPlanner")
        .and_then(|p| p.get_document("winningPlan"))
        .unwrap_or_else(|_| panic!("no winning plan in {e}"));
    let stage = plan.get_str("stage").expect("stage").to_string();
    let shards = plan
        .get_array("shards")
        .expect("shards")
        .iter()
        .map(|s| {
            s.as_document()
                .and_then(|s| s.get_str("shardName").ok())
                .expect("shardName")
                .to_string()
        })
        .collect();
    (stage, shards)
}

/// Starts a router on 127.0.0.1 with an ephemeral port.
pub async fn start_router() -> RouterHandle {
    start_router_with(Config::default()).await
}

/// Starts a router with `config`, listening on an ephemeral loopback port.
pub async fn start_router_with(mut config: Config) -> RouterHandle {
    config.listen = "127.0.0.1:0".to_string();
    sluice::router::start(config, vec!["sluice".into()])
        .await
        .expect("router starts")
}

/// Every document of a driver cursor, in order.
pub async fn all(mut cursor: mongodb::Cursor<Document>) -> Vec<Document> {
    let mut out = Vec::new();
    while cursor.advance().await.unwrap() {
        out.push(cursor.deserialize_current().unwrap());
    }
    out
}

/// The embedded config server (replica set `set_name`, holding `config.*` as a 6.0+ config
/// server writes it), and a plain driver client to write its documents with.
pub async fn config_server(set_name: &str) -> (sluice::embedded::EmbeddedShard, mongodb::Client) {
    let shard = sluice::embedded::EmbeddedShard::start(
        "127.0.0.1:0",
        sluice::embedded::ShardOptions {
            set_name: set_name.into(),
            config_server: true,
            ..sluice::embedded::ShardOptions::for_tests()
        },
    )
    .await
    .expect("config server starts");
    let writer = direct(shard.local_addr()).await;
    (shard, writer)
}

/// A `config.chunks` document of the collection `uuid` as a 6.0+ config server writes it,
/// over `{x: 1}`: [`min`, `max`) on `shard` at version `major|minor`.
pub fn chunk(
    uuid: bson::Uuid,
    min: bson::Bson,
    max: bson::Bson,
    shard: &str,
    major: u32,
    minor: u32,
) -> Document {
    let ts = |time, increment| bson::Timestamp { time, increment };
    bson::doc! {
        "_id": bson::oid::ObjectId::new(),
        "uuid": uuid,
        "min": {"x": min},
        "max": {"x": max},
        "shard": shard,
        "lastmod": ts(major, minor),
        "onCurrentShardSince": ts(50, 1),
        "history": [{"validAfter": ts(50, 1), "shard": shard}],
    }
}

/// A driver client connected to one server directly (no replica-set discovery).
pub async fn direct(addr: SocketAddr) -> mongodb::Client {
    mongodb::Client::with_uri_str(format!(
        "mongodb://{addr}/?directConnection=true&serverSelectionTimeoutMS=5000"
    ))
    .await
    .expect("driver client")
}

/// A client for the stock Rust driver.
pub async fn driver(addr: SocketAddr, extra: &str) -> mongodb::Client {
    let uri = format!("mongodb://{addr}/?serverSelectionTimeoutMS=5000{extra}");
    mongodb::Client::with_uri_str(uri).await.expect("client")
}

/// A raw connection.
pub struct Raw {
    pub stream: TcpStream,
    next_id: i32,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw {
            stream: TcpStream::connect(addr).await.expect("connect"),
            next_id: 100,
        }
    }

    /// Sends raw bytes.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    /// Encodes and sends an OP_MSG with this body and flags; returns its request id.
    pub async fn send_msg(&mut self, body: &Document, flags: u32) -> i32 {
        self.next_id += 1;
        let frame = OpMsgBuilder::new(flags, &body.to_vec().unwrap()).finish(self.next_id, 0);
        self.send(&frame).await;
        self.next_id
    }

    /// Reads one whole reply frame (header included), or `None` if the server closed.
    pub async fn read_frame(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let mut head = [0u8; 4];
        match tokio::time::timeout(timeout, self.stream.read_exact(&mut head)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return None,
            Err(_) => panic!("no reply within {timeout:?}"),
        }
        let len = i32::from_le_bytes(head) as usize;
        let mut frame = head.to_vec();
        frame.resize(len, 0);
        tokio::time::timeout(timeout, self.stream.read_exact(&mut frame[4..]))
            .await
            .expect("reply body in time")
            .ok()?;
        Some(frame)
    }

    /// Reads one OP_MSG reply: its header, flag bits and body.
    pub async fn read_msg(&mut self) -> (Header, u32, Document) {
        let frame = self
            .read_frame(Duration::from_secs(10))
            .await
            .expect("a reply, not a closed connection");
        parse_msg_reply(&frame)
    }

    /// Sends a command and reads its reply body.
    pub async fn command(&mut self, body: &Document) -> Document {
        let id = self.send_msg(body, 0).await;
        let (h, _, doc) = self.read_msg().await;
        assert_eq!(h.response_to, id);
        doc
    }

    /// Whether the server closed the connection (reads EOF within the timeout).
    pub async fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

/// Splits an OP_MSG reply frame into header, flags and body.
pub fn parse_msg_reply(frame: &[u8]) -> (Header, u32, Document) {
    let h = Header::parse(frame).expect("header");
    assert_eq!(h.op_code, OpCode::Msg, "reply opcode");
    let flags = u32::from_le_bytes(frame[16..20].try_into().unwrap());
    assert_eq!(frame[20], 0, "body section first");
    let body = bson::Document::from_reader(&frame[21..]).expect("reply body");
    let _ = HEADER_LEN;
    (h, flags, body)
}

/// Sets the header's length field to the frame's real length.
/// An OP_MSG frame: `body` with `docs` as one kind-1 sequence named `identifier`.
pub fn msg_with_sequence(
    flags: u32,
    body: &Document,
    identifier: &str,
    docs: &[Document],
    request_id: i32,
) -> Vec<u8> {
    let mut b = OpMsgBuilder::new(flags, &body.to_vec().unwrap());
    b.begin_sequence(identifier);
    for d in docs {
        b.push_document(&d.to_vec().unwrap());
    }
    b.finish(request_id, 0).to_vec()
}

pub fn fix_length(mut v: Vec<u8>) -> Vec<u8> {
    let len = v.len() as i32;
    v[..4].copy_from_slice(&len.to_le_bytes());
    v
}

/// Asserts that a fresh connection still gets `ping` answered.
pub async fn assert_still_serving(addr: SocketAddr) {
    let mut raw = Raw::connect(addr).await;
    let reply = raw.command(&bson::doc! {"ping": 1, "$db": "admin"}).await;
    assert_eq!(reply.get_f64("ok").unwrap(), 1.0, "{reply}");
}

/// `OpCode` re-exported for tests that build legacy frames.
pub fn op_code(n: i32) -> OpCode {
    OpCode::from_i32(n)
}

/// A router in front of `n` embedded shards, all in process, with `collections` sharded.
pub struct TestCluster {
    pub router: RouterHandle,
    pub shards: Vec<sluice::embedded::EmbeddedShard>,
    /// The shards' side of the cluster: pools, queues, the routing table.
    pub cluster: std::sync::Arc<sluice::cluster::Cluster>,
    /// What only the router keeps: metadata, cursors, the coalescer, write statistics.
    pub sharded: std::sync::Arc<sluice::router::ShardedCluster>,
}

impl TestCluster {
    pub async fn start(n: usize, collections: &[(&str, bson::Document)]) -> TestCluster {
        Self::start_with(n, collections, Config::default()).await
    }

    /// Like `start`, with a router configuration (its `listen` is replaced).
    pub async fn start_with(
        n: usize,
        collections: &[(&str, bson::Document)],
        config: Config,
    ) -> TestCluster {
        // Test commands on: the tests inject faults with MongoDB's failpoint.
        let shards = sluice::embedded::EmbeddedShard::start_many(
            n,
            sluice::embedded::ShardOptions::for_tests(),
        )
        .await
        .expect("shards start");
        let (router, sharded) = router_over(&shards, collections, config).await;
        TestCluster {
            router,
            shards,
            cluster: sharded.cluster.clone(),
            sharded,
        }
    }

    /// A second router over the same shards, with its own cluster view and transaction table
    /// (the other routers of a deployment).
    pub async fn another_router(&self, collections: &[(&str, bson::Document)]) -> RouterHandle {
        router_over(&self.shards, collections, Config::default())
            .await
            .0
    }
}

/// A router in front of `shards`, with `collections` sharded.
async fn router_over(
    shards: &[sluice::embedded::EmbeddedShard],
    collections: &[(&str, bson::Document)],
    config: Config,
) -> (RouterHandle, std::sync::Arc<sluice::router::ShardedCluster>) {
    let infos: Vec<sluice::routing::ShardInfo> = shards
        .iter()
        .map(|s| sluice::routing::ShardInfo {
            id: s.service().name().to_string(),
            addr: s.local_addr().to_string(),
            shard_server: true,
        })
        .collect();
    let colls: Vec<sluice::config::CollectionConfig> = collections
        .iter()
        .map(|(ns, key)| sluice::config::CollectionConfig {
            ns: ns.to_string(),
            key: serde_json::to_string(&bson::Bson::Document(key.clone()).into_relaxed_extjson())
                .unwrap(),
            unique: false,
            num_initial_chunks: None,
        })
        .collect();
    let sharded = sluice::router::bootstrap(
        None,
        &infos,
        &colls,
        config.pool_options().expect("pool options"),
        &config.batching,
    )
    .await
    .expect("cluster");
    let config = Config {
        listen: "127.0.0.1:0".into(),
        ..config
    };
    let router = sluice::router::start_router(config, vec!["sluice".into()], Some(sharded.clone()))
        .await
        .expect("router");
    (router, sharded)
}

impl TestCluster {
    pub fn addr(&self) -> SocketAddr {
        self.router.local_addr()
    }

    /// A stock-driver client straight to shard `i`, bypassing the router.
    pub async fn direct(&self, i: usize) -> mongodb::Client {
        direct(self.shards[i].local_addr()).await
    }

    pub async fn stop(self) {
        self.router.shutdown().await;
        for s in self.shards {
            s.shutdown().await;
        }
    }
}

impl TestCluster {
    /// `metrics.commands.<name>.total` summed over the shards.
    pub fn shard_command_total(&self, name: &str) -> i64 {
        self.shards
            .iter()
            .map(|s| s.service().command_total(name))
            .sum()
    }

    /// Documents of `db.coll` summed over the shards.
    pub fn count_on_shards(&self, db: &str, coll: &str) -> usize {
        self.shards
            .iter()
            .map(|s| s.service().count_documents(db, coll))
            .sum()
    }

    /// The router's `serverStatus().sluice.writes.plans`.
    pub fn plans(&self) -> (i64, i64, i64) {
        let w = &self.sharded.writes;
        use std::sync::atomic::Ordering::Relaxed;
        (
            w.plans_mongos_rounds.load(Relaxed) as i64,
            w.plans_unordered.load(Relaxed) as i64,
            w.plans_rewrite.load(Relaxed) as i64,
        )
    }
}

impl TestCluster {
    /// The routing snapshot of a sharded namespace.
    pub fn snapshot(&self, ns: &str) -> std::sync::Arc<sluice::routing::RoutingSnapshot> {
        self.cluster
            .routing
            .get(ns)
            .expect("routing")
            .expect("sharded")
    }

    /// The shard that owns `doc`'s shard key in `ns`.
    pub fn owner(&self, ns: &str, doc: &Document) -> String {
        let snap = self.snapshot(ns);
        let bytes = doc.to_vec().expect("document encodes");
        let raw = bson::RawDocument::from_bytes(&bytes).expect("raw document");
        let key = snap
            .pattern
            .extract_from_document(raw)
            .expect("document has a shard key");
        snap.shard_for(&key).expect("a chunk owns it").to_string()
    }

    /// Every document of `db.coll` on the shards, each checked to sit on the shard that owns
    /// its key; panics naming the first misplaced one.
    pub fn placed_documents(&self, db: &str, coll: &str) -> Vec<Document> {
        let ns = format!("{db}.{coll}");
        let mut out = Vec::new();
        for s in &self.shards {
            for d in s.service().documents(db, coll) {
                let owner = self.owner(&ns, &d);
                assert_eq!(
                    owner,
                    s.service().name(),
                    "{d} sits on {} but its key belongs to {owner}",
                    s.service().name()
                );
                out.push(d);
            }
        }
        out
    }
}
