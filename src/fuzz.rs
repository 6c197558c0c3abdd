//! Entry points of the fuzz targets (`fuzz/`, cargo-fuzz and libFuzzer) and of the corpus
//! replay that `cargo test` runs (`tests/fuzz_corpus.rs`).
//!
//! Each entry takes arbitrary bytes and must return without panicking, whatever they are. The
//! first byte chooses how the rest is read: raw (the bytes are a frame or a BSON document, so
//! libFuzzer's byte mutations reach the decoders) or structured (a [`Gen`] turns them into a
//! valid command, filter, update or pipeline whose values are hostile: deep nesting, huge
//! counts, extreme numbers, long paths, operator names in the wrong places).
//!
//! | entry | what it drives |
//! |---|---|
//! | [`wire_decode`] | framing and decoding of every opcode, OP_COMPRESSED, BSON validation |
//! | [`command_envelope`] | a decoded OP_MSG through the router's dispatch and the embedded shard's command handler |
//! | [`matcher`] | query filters: parse and evaluate |
//! | [`update`] | update documents: parse and apply, then the storage checks |
//! | [`aggregate`] | pipelines and expressions, within small memory limits |
//! | [`write_plan`] | targeting statements on a sharded collection and planning the bulk |
//!
//! It drives the router and the embedded shard both, so it sits at the top layer, beside
//! `bench`. [`seeds`] makes the committed seed corpus.

use std::cell::RefCell;
use std::sync::Arc;

use bson::{doc, Bson, Document};
use bytes::Bytes;

use crate::command::Service;
use crate::command::{ClientState, ServerState};
use crate::config::Config;
use crate::embedded::{ShardOptions, ShardService};
use crate::engine::aggregate::{self, AggregateOptions};
use crate::engine::matcher::Matcher;
use crate::engine::update::{self, Update};
use crate::wire::{self, Compressor, OpMsgBuilder};

/// A target's entry point: any bytes, no panic.
pub type Entry = fn(&[u8]);

/// The fuzz targets, by name (the names of `fuzz/fuzz_targets/*.rs` and of the corpus
/// directories).
pub const TARGETS: &[(&str, Entry)] = &[
    ("wire_decode", wire_decode),
    ("command_envelope", command_envelope),
    ("matcher", matcher),
    ("update", update),
    ("aggregate", aggregate),
    ("write_plan", write_plan),
];

/// Runs one input through `entry` on a thread with the server's stack
/// ([`crate::limits::WORKER_STACK_BYTES`]), as the fuzz targets do: libFuzzer's own thread has
/// a larger one, which would hide a recursion that overflows a server's worker. The thread is
/// started once per calling thread and takes one input at a time; a panic on it is resumed
/// here.
pub fn run_on_worker_stack(entry: Entry, data: &[u8]) {
    type Job = (Entry, Vec<u8>);
    type Done = std::thread::Result<()>;
    thread_local! {
        static WORKER: RefCell<Option<(std::sync::mpsc::Sender<Job>, std::sync::mpsc::Receiver<Done>)>> =
            const { RefCell::new(None) };
    }
    let outcome = WORKER.with(|w| {
        let mut w = w.borrow_mut();
        if w.is_none() {
            let (job_tx, job_rx) = std::sync::mpsc::channel::<Job>();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<Done>();
            let started = std::thread::Builder::new()
                .name("fuzz-worker".into())
                .stack_size(crate::limits::WORKER_STACK_BYTES)
                .spawn(move || {
                    while let Ok((entry, data)) = job_rx.recv() {
                        let done = std::panic::catch_unwind(|| entry(&data));
                        if done_tx.send(done).is_err() {
                            break;
                        }
                    }
                });
            if started.is_ok() {
                *w = Some((job_tx, done_rx));
            }
        }
        let (tx, rx) = w.as_ref()?;
        tx.send((entry, data.to_vec())).ok()?;
        let done = rx.recv().ok();
        if done.as_ref().is_some_and(|d| d.is_err()) {
            // A thread that panicked may hold broken state: the next input gets a new one.
            *w = None;
        }
        done
    });
    match outcome {
        Some(Ok(())) => {}
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        // No worker could be started: run here rather than skip the input.
        None => entry(data),
    }
}

/// Reads structured values out of fuzz bytes: every choice consumes bytes, and an exhausted
/// input reads as zeros, so any input gives a finite value.
pub struct Gen<'a> {
    data: &'a [u8],
    pos: usize,
    /// Nodes left to build, so one input cannot make a huge value by recursion.
    budget: usize,
}

/// Field names and operator names the generator draws from: these, then the engine's update
/// operators, then [`KEYS_AFTER_UPDATE_OPERATORS`], as one list.
const KEYS: &[&str] = &[
    "_id",
    "a",
    "b",
    "c",
    "arr",
    "a.b",
    "a.0",
    "arr.2",
    "arr.1500001",
    "arr.2000000000",
    "x.y.z",
    "$eq",
    "$ne",
    "$gt",
    "$gte",
    "$lt",
    "$lte",
    "$in",
    "$nin",
    "$exists",
    "$type",
    "$regex",
    "$options",
    "$not",
    "$elemMatch",
    "$size",
    "$all",
    "$mod",
    "$and",
    "$or",
    "$nor",
    "$comment",
    "$where",
    "$expr",
];

/// Keys drawn after the engine's update operators (`engine::update::OPERATORS`).
const KEYS_AFTER_UPDATE_OPERATORS: &[&str] = &[
    "$each",
    "$slice",
    "$position",
    "$sort",
    "$add",
    "$subtract",
    "$multiply",
    "$divide",
    "$concat",
    "$toLower",
    "$toUpper",
    "$cmp",
    "$cond",
    "$ifNull",
    "$abs",
    "$arrayElemAt",
    "$toString",
    "$literal",
    "$sum",
    "$avg",
    "$first",
    "$last",
    "$count",
    "$toHashedIndexKey",
    "$mod",
    "$round",
    "$trunc",
    "$ceil",
    "$floor",
    "$toDecimal",
    "$dateToString",
    "$dateToParts",
    "$dateTrunc",
    "$dateAdd",
    "$dateDiff",
    "$hour",
    "date",
    "unit",
    "amount",
    "startDate",
    "endDate",
    "timezone",
    "if",
    "then",
    "else",
    "path",
    "includeArrayIndex",
    "preserveNullAndEmptyArrays",
    "q",
    "u",
    "multi",
    "upsert",
    "limit",
    "",
    "$",
    "a..b",
];

/// Aggregation stage names.
const STAGES: &[&str] = &[
    "$match",
    "$project",
    "$addFields",
    "$set",
    "$unset",
    "$sort",
    "$skip",
    "$limit",
    "$group",
    "$count",
    "$unwind",
    "$documents",
    "$lookup",
    "$out",
];

/// Strings values are drawn from: field paths, variables, type names.
const STRINGS: &[&str] = &[
    "$a",
    "$b",
    "$arr",
    "$a.b",
    "$$ROOT",
    "$$CURRENT",
    "$$NOW",
    "$",
    "number",
    "string",
    "array",
    "object",
    "date",
    "timestamp",
    "x",
    "",
    "^a.*$",
    "(",
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",
    "../etc/passwd",
    "+05:30",
    "day",
    "hour",
    COSTLY_PATTERN,
];

/// A pattern whose compilation runs into the regex engine's size limit: milliseconds per
/// compilation, so the generator keeps it to one draw in eight (see [`Gen::costly_or`]).
const COSTLY_PATTERN: &str = "a{1000}{1000}";

/// `parts` components `a` joined by dots (`a.a.a`), built in one allocation: the long paths
/// are drawn often enough that joining a vector of parts was a large share of every input.
fn dotted_path(parts: usize) -> String {
    let mut path = "a.".repeat(parts.max(1));
    path.pop();
    path
}

impl<'a> Gen<'a> {
    /// A generator over `data`.
    pub fn new(data: &'a [u8]) -> Gen<'a> {
        Gen {
            data,
            pos: 0,
            budget: 500,
        }
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// A size below `large` one draw in eight, else below 16.
    fn sized(&mut self, large: usize) -> usize {
        let bound = if self.byte() < 32 {
            large
        } else {
            16.min(large)
        };
        self.below(bound)
    }

    /// `drawn`, unless it is [`COSTLY_PATTERN`] and this is not its one draw in eight:
    /// then `instead`.
    fn costly_or<'s>(&mut self, drawn: &'s str, instead: &'s str) -> &'s str {
        if drawn == COSTLY_PATTERN && self.byte() >= 32 {
            instead
        } else {
            drawn
        }
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let v = u16::from_le_bytes([self.byte(), self.byte()]) as usize;
        v % n
    }

    fn pick<'s>(&mut self, list: &[&'s str]) -> &'s str {
        list[self.below(list.len())]
    }

    /// One name from several lists drawn as if they were one, concatenated in order.
    fn pick_joined<'s>(&mut self, lists: &[&[&'s str]]) -> &'s str {
        let mut i = self.below(lists.iter().map(|l| l.len()).sum());
        for list in lists {
            if i < list.len() {
                return list[i];
            }
            i -= list.len();
        }
        ""
    }

    /// A field name or path: from the dictionary, or a long path, or a number.
    pub fn key(&mut self) -> String {
        match self.below(16) {
            0 => dotted_path(1 + self.below(300)),
            1 if self.byte() < 16 => dotted_path(20_000),
            2 => self.below(3_000_000).to_string(),
            _ => self
                .pick_joined(&[
                    KEYS,
                    crate::engine::update::OPERATORS,
                    KEYS_AFTER_UPDATE_OPERATORS,
                ])
                .to_string(),
        }
    }

    /// A value: scalars with extreme numbers, strings, nested documents and arrays (up to
    /// `depth` levels), deep chains, long arrays.
    pub fn value(&mut self, depth: usize) -> Bson {
        if self.budget == 0 {
            return Bson::Null;
        }
        self.budget -= 1;
        match self.below(24) {
            0 => Bson::Int32(
                *[0, 1, -1, i32::MIN, i32::MAX, 2, 7]
                    .get(self.below(7))
                    .unwrap_or(&0),
            ),
            1 => Bson::Int64(
                *[0, 1, -1, i64::MIN, i64::MAX, 1 << 62]
                    .get(self.below(6))
                    .unwrap_or(&0),
            ),
            2 => Bson::Double(
                *[
                    0.0,
                    -0.0,
                    0.5,
                    f64::NAN,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                    1e308,
                    -1.5,
                ]
                .get(self.below(8))
                .unwrap_or(&0.0),
            ),
            // Decimals: edge values, or any 16 bytes (non-canonical encodings, every exponent).
            3 if self.byte() & 1 == 1 => {
                let mut bytes = [0u8; 16];
                for b in &mut bytes {
                    *b = self.byte();
                }
                Bson::Decimal128(bson::Decimal128::from_bytes(bytes))
            }
            3 => {
                let text = self.pick(&[
                    "0",
                    "0.5",
                    "-0",
                    "NaN",
                    "Infinity",
                    "-Infinity",
                    "1E+6144",
                    "123456789012345678901234567890",
                    "9.999999999999999999999999999999999E+6144",
                    "1E-6176",
                    "-0.1",
                    "1.000000000000000000000000000000001",
                ]);
                text.parse::<bson::Decimal128>()
                    .map(Bson::Decimal128)
                    .unwrap_or(Bson::Null)
            }
            4 => {
                let s = self.pick(STRINGS);
                Bson::String(self.costly_or(s, "^a.*$").to_string())
            }
            5 => Bson::String(format!("${}", self.key())),
            6 => Bson::Boolean(self.byte() & 1 == 1),
            7 => Bson::Null,
            8 => Bson::DateTime(if self.byte() & 1 == 1 {
                bson::DateTime::MAX
            } else {
                bson::DateTime::MIN
            }),
            // The large values cost time on every input that holds them, so only one draw in
            // eight makes them large (libFuzzer finds the byte that does when it adds coverage).
            9 => Bson::String("x".repeat(self.sized(70_000))),
            10 => {
                // A chain nested up to past the wire's limit.
                let levels = self.sized(260);
                let mut v = Bson::Int32(1);
                for _ in 0..levels {
                    v = if self.byte() & 1 == 0 {
                        Bson::Document(doc! {"a": v})
                    } else {
                        Bson::Array(vec![v])
                    };
                }
                v
            }
            11 => {
                // A long array of one repeated value.
                let n = self.sized(3_000);
                let item = match self.below(4) {
                    0 => Bson::Int64(i64::MIN),
                    1 => Bson::String("$a".into()),
                    2 => Bson::Document(doc! {"a": 1}),
                    _ => Bson::Int32(self.byte() as i32),
                };
                Bson::Array(vec![item; n])
            }
            12 => {
                let pattern = self.pick(&["^a", "(", "x*", COSTLY_PATTERN]);
                let pattern = self.costly_or(pattern, "x*").to_string();
                let options = self.pick(&["", "i", "z", "imsx"]).to_string();
                match (pattern.try_into(), options.try_into()) {
                    (Ok(pattern), Ok(options)) => {
                        Bson::RegularExpression(bson::Regex { pattern, options })
                    }
                    _ => Bson::Null,
                }
            }
            13 => Bson::MinKey,
            14 => Bson::MaxKey,
            15 => Bson::ObjectId(bson::oid::ObjectId::from_bytes([self.byte(); 12])),
            16..=19 if depth > 0 => Bson::Document(self.doc(depth - 1)),
            _ if depth > 0 => {
                let n = self.below(5);
                Bson::Array((0..n).map(|_| self.value(depth - 1)).collect())
            }
            _ => Bson::Int32(self.byte() as i32),
        }
    }

    /// A document of a few fields with keys from [`Gen::key`].
    pub fn doc(&mut self, depth: usize) -> Document {
        let n = self.below(5);
        let mut d = Document::new();
        for _ in 0..n {
            let k = self.key();
            let v = self.value(depth);
            d.insert(k, v);
        }
        d
    }

    /// A command: a name from the commands the router and the shard know (and some they
    /// must refuse), generated fields, then one of a pipeline, documents, an update statement,
    /// session fields or `maxTimeMS`, and a `$db` (invalid ones among them).
    pub fn command(&mut self) -> Document {
        let name = self.pick(COMMANDS);
        let mut body = doc! {name: match self.below(3) {
            0 => Bson::String("c".into()),
            1 => Bson::Int32(1),
            _ => self.value(2),
        }};
        for (k, v) in self.doc(3) {
            body.insert(k, v);
        }
        match self.below(6) {
            0 => {
                body.insert("pipeline", self.pipeline());
                body.insert("cursor", doc! {});
            }
            1 => {
                let docs: Vec<Bson> = (0..self.below(4))
                    .map(|_| Bson::Document(self.doc(3)))
                    .collect();
                body.insert("documents", docs);
            }
            2 => {
                let stmt = doc! {"q": self.doc(2), "u": self.doc(2), "multi": self.value(0), "upsert": self.value(0)};
                body.insert("updates", vec![Bson::Document(stmt)]);
            }
            3 => {
                body.insert("lsid", doc! {"id": self.value(1)});
                body.insert("txnNumber", self.value(0));
            }
            4 => {
                body.insert("maxTimeMS", self.value(0));
            }
            _ => {}
        }
        body.insert(
            "$db",
            self.pick(&[
                "test", "admin", "config", "local", "bad.name", "Config", "$x", "d",
            ]),
        );
        body
    }

    /// A pipeline of a few stages with generated specifications.
    pub fn pipeline(&mut self) -> Vec<Bson> {
        let n = 1 + self.below(4);
        (0..n)
            .map(|_| {
                let stage = self.pick(STAGES);
                let spec = match (stage, self.below(3)) {
                    ("$unwind", 0) => Bson::String(format!("${}", self.key())),
                    ("$documents", _) => {
                        let n = self.below(4);
                        Bson::Array((0..n).map(|_| Bson::Document(self.doc(3))).collect())
                    }
                    ("$group", _) => {
                        let mut g = doc! {"_id": self.value(2)};
                        let acc = self.pick(&[
                            "$sum",
                            "$avg",
                            "$min",
                            "$max",
                            "$first",
                            "$last",
                            "$push",
                            "$addToSet",
                            "$count",
                        ]);
                        let arg = self.value(2);
                        g.insert("v", doc! {acc: arg});
                        Bson::Document(g)
                    }
                    ("$skip" | "$limit", _) => self.value(0),
                    ("$count", _) => Bson::String(self.pick(&["n", "", "$x", "a.b"]).to_string()),
                    _ => Bson::Document(self.doc(4)),
                };
                Bson::Document(doc! {stage: spec})
            })
            .collect()
    }
}

/// The rest of the input as one BSON document, if it is one (raw mode).
fn raw_document(data: &[u8]) -> Option<Document> {
    wire::BsonDoc::new(Bytes::copy_from_slice(data))
        .ok()
        .map(|d| d.to_document())
}

/// Splits off the mode byte: `true` for structured inputs.
fn mode(data: &[u8]) -> (bool, &[u8]) {
    match data.split_first() {
        Some((m, rest)) => (m & 1 == 0, rest),
        None => (true, data),
    }
}

/// Wire decoding: raw bytes as a frame, or a generated command framed (sometimes
/// compressed, sometimes with a checksum or a document sequence) and then damaged.
pub fn wire_decode(data: &[u8]) {
    let (structured, rest) = mode(data);
    let frame = if structured {
        let mut g = Gen::new(rest);
        let mut body = g.doc(3);
        body.insert("$db", "admin");
        let Ok(bytes) = body.to_vec() else { return };
        let flags = [0, 1, 2, 1 << 16, 1 << 5][g.below(5)];
        let mut b = OpMsgBuilder::new(flags, &bytes);
        if g.byte() & 1 == 1 {
            b.begin_sequence("documents");
            for _ in 0..g.below(4) {
                if let Ok(d) = g.doc(2).to_vec() {
                    b.push_document(&d);
                }
            }
        }
        let mut frame = b.finish(1, 0).to_vec();
        // Compressing a large frame (zlib, instrumented) costs more than all the rest of an
        // input, so a large one is compressed one draw in eight, a small one every other; and
        // zlib compresses at its fastest level here (the server's level 6 took two thirds of
        // this target's time), since the decoder reads every level alike.
        let compress = if frame.len() > 16 * 1024 {
            g.byte() < 32
        } else {
            g.byte() & 1 == 1
        };
        if compress {
            let c = Compressor::SUPPORTED[g.below(3)];
            if let Some(packed) = compress_fast(&frame, c) {
                frame = packed.to_vec();
            }
        }
        // A few byte flips after framing.
        for _ in 0..g.below(4) {
            let at = g.below(frame.len());
            if let Some(b) = frame.get_mut(at) {
                *b ^= g.byte();
            }
        }
        frame
    } else {
        rest.to_vec()
    };
    if let Ok(Some(len)) = wire::frame_length(&frame) {
        if len == frame.len() {
            if let Ok(incoming) = wire::decode(Bytes::from(frame)) {
                if let wire::Message::Msg(msg) = incoming.message {
                    let _ = crate::command::CommandRequest::from_op_msg(&msg);
                }
            }
        }
    }
}

/// `frame` as OP_COMPRESSED by `c`, zlib at its fastest level.
fn compress_fast(frame: &[u8], c: Compressor) -> Option<Bytes> {
    use std::io::Write;
    if c != Compressor::Zlib {
        return wire::encode_compressed(frame, c).ok();
    }
    let body = frame.get(wire::HEADER_LEN..)?;
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(body).ok()?;
    wire::compressed_frame(frame, c, &enc.finish().ok()?).ok()
}

thread_local! {
    /// A current-thread runtime for the async handlers.
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

fn block_on<F: std::future::Future>(f: F) -> Option<F::Output> {
    RUNTIME.with(|rt| {
        let mut rt = rt.borrow_mut();
        if rt.is_none() {
            *rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .ok();
        }
        rt.as_ref().map(|rt| rt.block_on(f))
    })
}

/// Command names the structured envelope draws from.
const COMMANDS: &[&str] = &[
    "hello",
    "isMaster",
    "ping",
    "buildInfo",
    "getParameter",
    "getLog",
    "whatsmyuri",
    "connectionStatus",
    "endSessions",
    "getCmdLineOpts",
    "serverStatus",
    "aggregate",
    "find",
    "getMore",
    "killCursors",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "count",
    "distinct",
    "create",
    "drop",
    "dropDatabase",
    "listCollections",
    "listDatabases",
    "createIndexes",
    "listIndexes",
    "dropIndexes",
    "collStats",
    "dbStats",
    "configureFailPoint",
    "sluiceSetShardVersion",
    "sluiceSetLatency",
    "_shardsvrDropDatabase",
    "explain",
    "enableSharding",
    "shardCollection",
    "commitTransaction",
];

/// The command envelope: an OP_MSG (raw, or a generated command with hostile fields) decoded
/// as the frontend decodes it, then run by the router's dispatch (without shards) and by a
/// fresh embedded shard's handler.
pub fn command_envelope(data: &[u8]) {
    let (structured, rest) = mode(data);
    let frame = if structured {
        let mut g = Gen::new(rest);
        let body = g.command();
        match body.to_vec() {
            Ok(bytes) => OpMsgBuilder::new(0, &bytes).finish(1, 0).to_vec(),
            Err(_) => return,
        }
    } else {
        rest.to_vec()
    };
    let Ok(incoming) = wire::decode(Bytes::from(frame)) else {
        return;
    };
    let wire::Message::Msg(msg) = incoming.message else {
        return;
    };
    let Ok(req) = crate::command::CommandRequest::from_op_msg(&msg) else {
        return;
    };
    if crate::command::hello::is_awaitable(req.body.raw()) {
        // Waits maxAwaitTimeMS by design; the wait itself is covered by the frontend tests.
        return;
    }
    // The read path's in-place reading of a read's options (used for sharded collections,
    // which the router below has none of).
    let mut normalized = None;
    if let Ok(body) = crate::read::ReadBody::of(&req, &mut normalized) {
        for k in [
            "filter",
            "sort",
            "projection",
            "limit",
            "batchSize",
            "let",
            "hint",
        ] {
            let _ = (
                body.number(k),
                body.truthy(k),
                body.str(k),
                body.document(k),
            );
            let _ = body.owned(k);
        }
        let _ = (body.in_transaction(), body.to_document());
    }
    let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
    block_on(async {
        let stop = Arc::new(tokio::sync::watch::channel(false).0);
        let state = Arc::new(ServerState::new(Config::default(), Vec::new(), stop));
        let mut client = ClientState::new(1, peer);
        let router = crate::router::Router::new(state.clone(), None);
        let _ = router.handle(&mut client, &req).await;
        let shard = ShardService::new(state, ShardOptions::default());
        let mut client = ClientState::new(2, peer);
        let _ = shard.handle(&mut client, &req).await;
    });
}

/// Query filters: parsed and evaluated against generated documents.
pub fn matcher(data: &[u8]) {
    let (structured, rest) = mode(data);
    let (filter, docs) = if structured {
        let mut g = Gen::new(rest);
        let filter = g.doc(4);
        let docs: Vec<Document> = (0..3).map(|_| g.doc(4)).collect();
        (filter, docs)
    } else {
        match raw_document(rest) {
            Some(d) => (d.clone(), vec![d, doc! {"a": [1, {"b": 2}], "_id": 1}]),
            None => return,
        }
    };
    if let Ok(m) = Matcher::parse(&filter) {
        for d in &docs {
            let _ = m.matches(d);
        }
    }
    let _ = crate::engine::matcher::equality_fields(&filter);
}

/// Update documents: parsed, applied to generated documents (as an update and as an upsert),
/// and the results measured as the storage checks measure them.
pub fn update(data: &[u8]) {
    let (structured, rest) = mode(data);
    let (u, docs) = if structured {
        let mut g = Gen::new(rest);
        let mut u = Document::new();
        for _ in 0..1 + g.below(3) {
            let ops: Vec<&str> = update::OPERATORS
                .iter()
                .copied()
                .chain(["$bogus"])
                .collect();
            let op = g.pick(&ops);
            u.insert(op, g.doc(3));
        }
        if g.byte() < 32 {
            u = g.doc(3);
        }
        let docs: Vec<Document> = (0..2).map(|_| g.doc(4)).collect();
        (Bson::Document(u), docs)
    } else {
        match raw_document(rest) {
            Some(d) => (
                Bson::Document(d),
                vec![doc! {"_id": 1, "a": [1, 2], "b": {"c": 1}}],
            ),
            None => return,
        }
    };
    let Ok(parsed) = Update::parse(&u) else {
        return;
    };
    for d in docs {
        for inserting in [false, true] {
            let mut d = d.clone();
            if parsed.apply(&mut d, inserting).is_ok() {
                let _ = crate::limits::measure(&d);
            }
        }
    }
}

/// Pipelines and expressions over generated documents, with a 1 MiB stage limit.
pub fn aggregate(data: &[u8]) {
    let (structured, rest) = mode(data);
    let (pipeline, docs) = if structured {
        let mut g = Gen::new(rest);
        let pipeline = g.pipeline();
        let docs: Vec<Document> = (0..g.below(4)).map(|_| g.doc(4)).collect();
        (pipeline, docs)
    } else {
        match raw_document(rest) {
            Some(d) => {
                let pipeline = match d.get("p") {
                    Some(Bson::Array(p)) => p.clone(),
                    _ => vec![Bson::Document(d.clone())],
                };
                (pipeline, vec![d])
            }
            None => return,
        }
    };
    for allow_disk_use in [false, true] {
        let options = AggregateOptions {
            stage_memory: 1 << 20,
            allow_disk_use,
        };
        let _ = aggregate::run_with(&pipeline, docs.clone(), &options);
    }
}

/// The write planner: generated statements targeted on a sharded collection (hashed, ranged
/// or compound key) and planned under every policy, ordered and not.
pub fn write_plan(data: &[u8]) {
    use crate::write::plan::{plan, prove, Policy, Round};
    use crate::write::target::{
        target_delete, target_delete_bytes, target_insert, target_update, target_update_bytes,
    };
    let (_, rest) = mode(data);
    let mut g = Gen::new(rest);
    let key = match g.below(3) {
        0 => doc! {"_id": "hashed"},
        1 => doc! {"a": 1},
        _ => doc! {"a": "hashed", "b": 1},
    };
    let Ok(pattern) = crate::routing::ShardKeyPattern::parse(&key) else {
        return;
    };
    let Ok(snap) = crate::routing::RoutingSnapshot::initial("d.c", pattern, 1 + g.below(5)) else {
        return;
    };
    let kind = g.below(3);
    let n = 1 + g.below(12);
    let mut targeted = Vec::new();
    for _ in 0..n {
        let mut stmt = g.doc(3);
        let t = match kind {
            0 => {
                if g.byte() & 1 == 0 {
                    stmt.insert("_id", g.value(1));
                }
                let Ok(bytes) = stmt.to_vec() else { return };
                let Ok(raw) = bson::RawDocument::from_bytes(&bytes) else {
                    return;
                };
                target_insert(&snap, raw, stmt.contains_key("_id"))
            }
            1 => {
                let stmt =
                    doc! {"q": stmt, "u": g.doc(2), "multi": g.value(0), "upsert": g.value(0)};
                let t = target_update(&snap, &stmt);
                // Targeted in place, the statement goes where its owned copy goes.
                if let Ok(bytes) = stmt.to_vec() {
                    if let Ok(raw) = bson::RawDocument::from_bytes(&bytes) {
                        same_targeting(&target_update_bytes(&snap, raw), &t, &stmt);
                    }
                }
                t
            }
            _ => {
                let stmt = doc! {"q": stmt, "limit": g.value(0)};
                let t = target_delete(&snap, &stmt);
                if let Ok(bytes) = stmt.to_vec() {
                    if let Ok(raw) = bson::RawDocument::from_bytes(&bytes) {
                        same_targeting(&target_delete_bytes(&snap, raw), &t, &stmt);
                    }
                }
                t
            }
        };
        targeted.push(t);
    }
    let refs: Vec<(usize, &crate::write::target::Targeted)> = targeted.iter().enumerate().collect();
    for (policy, exact_counts) in [Policy::RetrySafe, Policy::Always, Policy::Off]
        .into_iter()
        .flat_map(|p| [(p, true), (p, false)])
    {
        let _ = prove(&refs, policy, exact_counts);
        for ordered in [true, false] {
            let p = plan(&refs, ordered, policy, exact_counts);
            // Every statement is sent or failed exactly once.
            let mut seen = vec![0usize; n];
            for r in &p.rounds {
                match r {
                    Round::Send(work) => {
                        for w in work {
                            for i in &w.statements {
                                seen[*i] += 1;
                            }
                        }
                    }
                    Round::Fail(i) | Round::Lookup(i, _) => seen[*i] += 1,
                }
            }
            use crate::write::target::Target;
            let multi = targeted.iter().any(|t| matches!(t.target, Target::Many(_)));
            let failing = targeted
                .iter()
                .any(|t| matches!(t.target, Target::Error { .. }));
            if !multi {
                assert!(
                    seen.iter().all(|c| *c <= 1),
                    "plan {p:?} sends a statement twice"
                );
                if !failing {
                    assert!(
                        seen.iter().all(|c| *c == 1),
                        "plan {p:?} leaves a statement out"
                    );
                }
            }
        }
    }
}

/// One input of the seed corpus: the target it feeds, a file name that says what it is, and
/// its bytes.
pub struct Seed {
    /// The target (a name of [`TARGETS`]).
    pub target: &'static str,
    /// The file name under `fuzz/corpus/<target>/`.
    pub name: String,
    /// The input, mode byte first.
    pub bytes: Vec<u8>,
}

/// A raw-mode input: the mode byte, then `bytes` as they are.
fn raw(bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![1u8];
    v.extend_from_slice(bytes);
    v
}

/// The targeting of a statement read in place agrees with that of its owned copy. Compared as
/// printed: an `_id` of NaN pins one document (a query's NaN equals NaN) but, as a `Bson`, is
/// not equal to itself.
fn same_targeting<T: std::fmt::Debug>(in_place: &T, owned: &T, stmt: &Document) {
    assert_eq!(format!("{in_place:?}"), format!("{owned:?}"), "{stmt}");
}

/// An OP_MSG frame carrying `body`.
fn frame(body: &Document, flags: u32) -> Vec<u8> {
    let bytes = body.to_vec().unwrap_or_default();
    OpMsgBuilder::new(flags, &bytes).finish(1, 0).to_vec()
}

fn encoded(d: &Document) -> Vec<u8> {
    d.to_vec().unwrap_or_default()
}

/// `levels` documents nested in one another under `a`.
fn nested(levels: usize) -> Document {
    let mut d = doc! {"x": 1};
    for _ in 1..levels {
        d = doc! {"a": d};
    }
    d
}

/// The seed corpus: the hostile requests of the bad-request table (row numbers in the names),
/// a few ordinary ones so mutation starts from valid shapes, and structured-mode inputs that
/// steer the generator into each of its branches. `tests/fuzz_corpus.rs` checks that
/// `fuzz/corpus/` holds exactly these bytes.
pub fn seeds() -> Vec<Seed> {
    let long_path = vec!["a"; 2_000].join(".");
    let mut out = Vec::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| {
        out.push(Seed {
            target,
            name: name.to_string(),
            bytes,
        })
    };

    // Commands, framed: the envelope and the decoder share them.
    let commands: Vec<(&str, Document)> = vec![
        ("ping", doc! {"ping": 1, "$db": "admin"}),
        (
            "hello",
            doc! {"hello": 1, "helloOk": true, "client": {"driver": {"name": "x", "version": "1"}}, "$db": "admin"},
        ),
        (
            "insert",
            doc! {"insert": "c", "documents": [{"_id": 1, "arr": []}], "ordered": true, "$db": "d"},
        ),
        (
            "find",
            doc! {"find": "c", "filter": {"a": {"$gt": 1}}, "sort": {"a": -1}, "limit": 3, "$db": "d"},
        ),
        (
            "row01-mod-overflow",
            doc! {"aggregate": 1, "pipeline": [{"$documents": [{"a": 1}]}, {"$project": {"x": {"$mod": [i64::MIN, -1i64]}}}], "cursor": {}, "$db": "d"},
        ),
        (
            "row02-long-add-fields-path",
            doc! {"aggregate": 1, "pipeline": [{"$documents": [{"a": 1}]}, {"$addFields": {long_path.as_str(): 1}}], "cursor": {}, "$db": "d"},
        ),
        (
            "row03-unwind-blowup",
            doc! {"aggregate": 1, "pipeline": [{"$documents": [{"big": "x".repeat(1000), "arr": (0..300).collect::<Vec<i32>>()}]}, {"$unwind": "$arr"}, {"$sort": {"arr": -1}}], "cursor": {}, "$db": "d"},
        ),
        (
            "row04-backfill",
            doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"arr.2000000000": 1}}}], "$db": "d"},
        ),
        (
            "row05-long-set-path",
            doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {long_path.as_str(): 1}}}], "$db": "d"},
        ),
        (
            "row06-deep-insert",
            doc! {"insert": "c", "documents": [nested(178)], "$db": "d"},
        ),
        (
            "row07-fail-point",
            doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["insert", "find"], "errorCode": 11600}, "$db": "d"},
        ),
        (
            "row08-shard-version",
            doc! {"sluiceSetShardVersion": "d.c", "shardVersion": 7, "$db": "admin"},
        ),
        (
            "row08-latency",
            doc! {"sluiceSetLatency": 1, "perCommandMicros": 1i64 << 62, "$db": "admin"},
        ),
        (
            "row09-exhaust-hello",
            doc! {"hello": 1, "topologyVersion": {"processId": bson::oid::ObjectId::from_bytes([7; 12]), "counter": 0i64}, "maxAwaitTimeMS": 10, "$db": "admin"},
        ),
        (
            "row10-transaction",
            doc! {"insert": "c", "documents": [{"_id": 1}], "lsid": {"id": "L".repeat(1000)}, "txnNumber": 1i64, "startTransaction": true, "autocommit": false, "$db": "d"},
        ),
        (
            "row11-bad-names",
            doc! {"insert": "a/b", "documents": [{}], "$db": "bad.name"},
        ),
        (
            "row11-case",
            doc! {"insert": "c", "documents": [{}], "$db": "Config"},
        ),
        ("row12-drop-admin", doc! {"dropDatabase": 1, "$db": "admin"}),
        (
            "row13-max-time",
            doc! {"find": "c", "maxTimeMS": i64::MAX, "$db": "d"},
        ),
        ("unknown-command", doc! {"notACommand": 1, "$db": "d"}),
    ];
    for (name, body) in &commands {
        let f = frame(body, 0);
        add("command_envelope", name, raw(&f));
        add("wire_decode", name, raw(&f));
    }
    add(
        "wire_decode",
        "checksum",
        raw(&frame(&doc! {"ping": 1, "$db": "admin"}, 1)),
    );
    let mut seq = OpMsgBuilder::new(0, &encoded(&doc! {"insert": "c", "$db": "d"}));
    seq.begin_sequence("documents");
    seq.push_document(&encoded(&doc! {"_id": 1}));
    seq.push_document(&encoded(&nested(150)));
    add("wire_decode", "document-sequence", raw(&seq.finish(1, 0)));
    let insert = frame(&commands[2].1, 0);
    for c in Compressor::SUPPORTED {
        if let Ok(packed) = wire::encode_compressed(&insert, c) {
            add(
                "wire_decode",
                &format!("compressed-{}", c.name()),
                raw(&packed),
            );
        }
    }

    // Filters.
    for (name, filter) in [
        ("equality", doc! {"a": 1, "b.c": {"$in": [1, "x", null]}}),
        (
            "mod-overflow",
            doc! {"a": {"$mod": [-1i64, 0]}, "b": {"$mod": [i64::MIN, -1i64]}},
        ),
        (
            "expr-mod",
            doc! {"$expr": {"$eq": [{"$mod": [i64::MIN, -1i64]}, 0]}},
        ),
        ("long-path", doc! {long_path.as_str(): 1}),
        ("deep-and", {
            let mut f = doc! {"a": 1};
            for _ in 0..150 {
                f = doc! {"$and": [f]};
            }
            f
        }),
        (
            "elem-match",
            doc! {"arr": {"$elemMatch": {"$elemMatch": {"$gt": 1, "$size": 2}}}},
        ),
        (
            "regex",
            doc! {"a": {"$regex": "a{1000}{1000}", "$options": "i"}},
        ),
        (
            "types",
            doc! {"a": {"$type": ["number", 2, 19]}, "b": {"$exists": false}, "c": {"$all": [[1], {"$elemMatch": {}}]}},
        ),
    ] {
        add("matcher", name, raw(&encoded(&filter)));
    }

    // Updates.
    for (name, u) in [
        (
            "set",
            doc! {"$set": {"a.b": 1, "arr.3": 2}, "$inc": {"n": 1}},
        ),
        ("row04-backfill", doc! {"$set": {"arr.2000000000": 1}}),
        ("row05-long-path", doc! {"$set": {long_path.as_str(): 1}}),
        (
            "inc-overflow",
            doc! {"$inc": {"a": i64::MAX}, "$mul": {"b.c": i64::MIN}},
        ),
        (
            "push-each",
            doc! {"$push": {"arr": {"$each": [1, 2, 3], "$slice": -2, "$sort": 1, "$position": -1000}}},
        ),
        ("deep-value", doc! {"$set": {"d": nested(120)}}),
        (
            "rename-pop-pull",
            doc! {"$rename": {"a": "z"}, "$pop": {"arr": -1}, "$pull": {"arr": {"$gt": 1}}},
        ),
        ("replacement", doc! {"x": 1, "y": [1, 2]}),
    ] {
        add("update", name, raw(&encoded(&u)));
    }

    // Pipelines, as `{p: [...]}`.
    for (name, p) in [
        (
            "group-sort",
            doc! {"p": [{"$group": {"_id": "$a", "n": {"$sum": 1}, "s": {"$push": "$$ROOT"}}}, {"$sort": {"n": -1}}]},
        ),
        (
            "row01-mod",
            doc! {"p": [{"$project": {"x": {"$mod": [i64::MIN, -1i64]}, "y": {"$mod": [5, "0.5".parse::<bson::Decimal128>().map(Bson::Decimal128).unwrap_or(Bson::Null)]}, "z": {"$mod": [1, 0]}}}]},
        ),
        (
            "row02-long-path",
            doc! {"p": [{"$addFields": {long_path.as_str(): 1}}]},
        ),
        (
            "row03-unwind",
            doc! {"p": [{"$addFields": {"arr": {"$literal": (0..1000).collect::<Vec<i32>>()}}}, {"$unwind": "$arr"}, {"$group": {"_id": null, "all": {"$push": "$$ROOT"}}}]},
        ),
        (
            "arith-edges",
            doc! {"p": [{"$project": {"a": {"$add": [i64::MAX, 1]}, "b": {"$multiply": [i64::MIN, -1]}, "c": {"$divide": [1, 0]}, "d": {"$abs": i64::MIN}, "e": {"$subtract": [i64::MIN, 1]}}}]},
        ),
        (
            "documents-count",
            doc! {"p": [{"$documents": [{"a": 1}, {"a": 2}]}, {"$skip": i64::MAX}, {"$limit": 1}, {"$count": "n"}]},
        ),
    ] {
        add("aggregate", name, raw(&encoded(&p)));
    }

    // Structured inputs: a mode byte of 0, then bytes that steer the generator.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for (target, _) in TARGETS {
        for i in 0..6 {
            let len = 32 << (i % 3);
            let mut bytes = vec![0u8];
            bytes.extend((0..len).map(|_| next() as u8));
            add(target, &format!("structured-{i}"), bytes);
        }
    }
    out
}
