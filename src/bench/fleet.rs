//! What the load scenarios run against: embedded shards as separate `sluice shard` processes
//! and a router process in front of them, all on loopback, started from this very binary and
//! stopped when dropped. The load itself goes through the stock Rust driver.
//!
//! Two layouts ([`Layout`]): `static`, a router holding the metadata itself (`sluice --config`
//! with the shards and collections in its generated TOML), and `cluster`, the layout `sluice
//! demo` runs: an embedded config server (`sluice configsvr`), the shards in shard-server mode
//! (`sluice shard --configdb …`) and a router in `--configdb` mode, the shards added and the
//! collections sharded through that router with the commands a user sends (`addShard`,
//! `enableSharding`, `shardCollection`).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bson::{doc, Bson, Document};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::value::compare::compare;
use crate::write::plan::Policy;

/// How long a process may take to say it is listening (valgrind makes start-up slow).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The collection every fleet warms up on (sharded on `_id`, not measured).
const WARM_UP: &str = "warm_up";

/// A child process that is listening on `addr`; killed when dropped.
pub struct Proc {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Proc {
    /// Starts `program args…`, waits for the line "… listening on ADDR." on its stdout.
    pub async fn start(program: &Path, args: &[String]) -> anyhow::Result<Proc> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout from {}", program.display()))?;
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.split(" listening on ").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("");
                    return addr
                        .trim_end_matches('.')
                        .parse::<SocketAddr>()
                        .with_context(|| format!("unexpected start-up line {line:?}"));
                }
            }
            bail!("{} exited before listening", program.display())
        })
        .await
        .map_err(|_| anyhow!("{} did not start listening in time", program.display()))??;
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Proc { child, addr })
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Asks the process to stop (SIGTERM, so that it shuts down cleanly and tools such as
    /// valgrind write their output) and waits for it.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        match tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await {
            Ok(status) => {
                status?;
                Ok(())
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("process {} did not stop within 60 s", self.addr)
            }
        }
    }
}

/// The `sluice` executable that runs this benchmark.
pub fn sluice_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("cannot find the sluice executable")
}

/// Injected latency of one embedded shard.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    /// Added to every data command.
    pub per_command: Duration,
    /// Added per statement written.
    pub per_document: Duration,
}

impl Latency {
    /// What this shard spends on one command carrying `docs` statements.
    pub fn cost(&self, docs: u64) -> Duration {
        self.per_command + self.per_document * docs as u32
    }
}

/// How the fleet is laid out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Layout {
    /// One router holding the metadata itself (`sluice --config` with a generated TOML).
    #[default]
    Static,
    /// An embedded config server, shards in shard-server mode and a `--configdb` router, each
    /// its own process (what `sluice demo` runs).
    Cluster,
}

impl Layout {
    /// `static` or `cluster`, as `--layout` names it.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Static => "static",
            Layout::Cluster => "cluster",
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Layout> {
        match s {
            "static" => Ok(Layout::Static),
            "cluster" => Ok(Layout::Cluster),
            other => bail!("unknown layout {other:?} (static or cluster)"),
        }
    }
}

/// The replica set name of the fleet's config server (what `--configdb` names).
const CONFIG_SET_NAME: &str = "configRS";

/// Starts one `sluice configsvr` process on an ephemeral port.
async fn start_config_server() -> anyhow::Result<Proc> {
    let args: Vec<String> = [
        "configsvr",
        "--port",
        "0",
        "--set-name",
        CONFIG_SET_NAME,
        "--log-level",
        "warn",
    ]
    .map(String::from)
    .to_vec();
    Proc::start(&sluice_exe()?, &args).await
}

/// Starts one `sluice shard` process on an ephemeral port (in shard-server mode with a
/// `configdb`).
async fn start_shard(
    name: &str,
    latency: Latency,
    max_concurrency: Option<usize>,
    configdb: Option<&str>,
) -> anyhow::Result<Proc> {
    let mut args = vec![
        "shard".to_string(),
        "--port".into(),
        "0".into(),
        "--set-name".into(),
        name.into(),
        "--log-level".into(),
        "warn".into(),
        "--latency-per-command".into(),
        format!("{}us", latency.per_command.as_micros()),
        "--latency-per-document".into(),
        format!("{}us", latency.per_document.as_micros()),
    ];
    if let Some(c) = configdb {
        args.extend(["--configdb".to_string(), c.to_string()]);
    }
    if let Some(n) = max_concurrency {
        args.extend(["--max-concurrency".to_string(), n.to_string()]);
    }
    Proc::start(&sluice_exe()?, &args).await
}

/// A collection the router shards on `{_id: "hashed"}` at start-up.
#[derive(Debug, Clone)]
pub struct Sharded {
    /// `db.coll`.
    pub ns: String,
    /// `numInitialChunks`, or the default (2 per shard).
    pub chunks: Option<u32>,
}

/// How to start a router.
#[derive(Debug, Clone)]
pub struct RouterSpec {
    /// The rewrite policy for ordered bulks (`Off` is mongos's rounds).
    pub policy: Policy,
    /// Collections sharded at start-up.
    pub collections: Vec<Sharded>,
    /// A command to run the router under, e.g. `valgrind --tool=callgrind …`.
    pub wrapper: Vec<String>,
    /// More configuration appended to the router's TOML (e.g. a `[batching]` table).
    pub extra: String,
    /// What the fleet's clients of the router put in their connection string: the user
    /// information before the host (`user:password@`) and options after it (`&tls=true…`).
    pub client_auth: ClientAuth,
    /// Static router or config server + shard servers + `--configdb` router.
    pub layout: Layout,
    /// The router's Prometheus endpoint (`metrics_listen`), or empty for none.
    pub metrics_listen: String,
}

/// How the fleet's clients reach a router that requires authentication or TLS.
#[derive(Debug, Clone, Default)]
pub struct ClientAuth {
    /// `user:password@`, or empty.
    pub userinfo: String,
    /// More connection-string options, each starting with `&`, or empty.
    pub options: String,
}

impl RouterSpec {
    /// A router with `policy` sharding `collections`, nothing else changed.
    pub fn new(policy: Policy, collections: Vec<Sharded>) -> RouterSpec {
        RouterSpec {
            policy,
            collections,
            wrapper: Vec::new(),
            extra: String::new(),
            client_auth: ClientAuth::default(),
            layout: Layout::Static,
            metrics_listen: String::new(),
        }
    }

    /// The same router in `layout`.
    pub fn in_layout(mut self, layout: Layout) -> RouterSpec {
        self.layout = layout;
        self
    }
}

/// `bench.o{r}` (for ordered bulks) and `bench.u{r}` (unordered) for each repetition `r`.
pub fn per_repetition(reps: usize, chunks: Option<u32>) -> Vec<Sharded> {
    (0..reps)
        .flat_map(|r| {
            ["o", "u"].map(|p| Sharded {
                ns: format!("bench.{p}{r}"),
                chunks,
            })
        })
        .collect()
}

fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::RetrySafe => "retry-safe",
        Policy::Always => "always",
        Policy::Off => "off",
    }
}

/// The router's TOML configuration: with a `configdb`, the config server is the authority
/// (no shards or collections listed); otherwise the shards and collections themselves.
fn router_config(
    shards: &[(String, SocketAddr)],
    configdb: Option<&str>,
    spec: &RouterSpec,
) -> String {
    let mut s = format!(
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"{}\"\nordered_rewrite = \"{}\"\n",
        spec.metrics_listen,
        policy_name(spec.policy)
    );
    if let Some(c) = configdb {
        s.push_str(&format!("configdb = \"{c}\"\n"));
    }
    s.push_str("\n[log]\nlevel = \"warn\"\n");
    s.push_str(&spec.extra);
    if configdb.is_some() {
        return s;
    }
    for (id, addr) in shards {
        s.push_str(&format!(
            "\n[[shards]]\nid = \"{id}\"\naddress = \"{addr}\"\n"
        ));
    }
    for c in &spec.collections {
        s.push_str(&format!(
            "\n[[collections]]\nns = \"{}\"\nkey = '{{\"_id\": \"hashed\"}}'\n",
            c.ns
        ));
        if let Some(n) = c.chunks {
            s.push_str(&format!("num_initial_chunks = {n}\n"));
        }
    }
    s
}

/// A scratch directory for configurations and profiler output, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Creates a fresh directory under the system's temporary directory.
    pub fn new(label: &str) -> anyhow::Result<Scratch> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "sluice-bench-{label}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    /// Removes the directory, unless `SLUICE_BENCH_KEEP` is set (to read a profile afterwards).
    fn drop(&mut self) {
        if std::env::var_os("SLUICE_BENCH_KEEP").is_some() {
            eprintln!("kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Embedded shards in their own processes and one router in front of them.
pub struct Fleet {
    /// Shard ids, in order (`shard0`, `shard1`, …).
    pub shard_ids: Vec<String>,
    /// The shard processes.
    pub shards: Vec<Proc>,
    /// Stock-driver clients connected straight to each shard.
    pub shard_clients: Vec<mongodb::Client>,
    /// The router process.
    pub router: Proc,
    /// The config server process (the cluster layout).
    pub config_server: Option<Proc>,
    /// A stock-driver client of the router, for the driver's own operations (its retryable
    /// writes number their transactions per session themselves).
    pub client: mongodb::Client,
    /// A second client of the router, for [`timed_update`] alone: its commands carry explicit
    /// transaction numbers, and a session they used must never be handed to a driver-managed
    /// retryable write (the driver would number it from 1 again, and a shard would answer from
    /// its record or refuse the older number).
    pub writer: mongodb::Client,
    _scratch: Scratch,
}

/// A stock-driver client; `direct` for a single shard.
async fn client(addr: SocketAddr, direct: bool) -> anyhow::Result<mongodb::Client> {
    router_client(addr, direct, &ClientAuth::default()).await
}

/// A stock-driver client with `auth` in its connection string.
pub async fn router_client(
    addr: SocketAddr,
    direct: bool,
    auth: &ClientAuth,
) -> anyhow::Result<mongodb::Client> {
    let uri = format!(
        "mongodb://{}{addr}/?serverSelectionTimeoutMS=20000{}{}",
        auth.userinfo,
        if direct { "&directConnection=true" } else { "" },
        auth.options
    );
    Ok(mongodb::Client::with_uri_str(uri).await?)
}

impl Fleet {
    /// Starts one shard per entry of `latencies` and a router configured by `spec`.
    pub async fn start(latencies: &[Latency], spec: &RouterSpec) -> anyhow::Result<Fleet> {
        Self::start_with_capacity(latencies, None, spec).await
    }

    /// [`Fleet::start`], each shard running at most `max_concurrency` data commands at once
    /// (`sluice shard --max-concurrency`; the rest queue in the shard).
    pub async fn start_with_capacity(
        latencies: &[Latency],
        max_concurrency: Option<usize>,
        spec: &RouterSpec,
    ) -> anyhow::Result<Fleet> {
        let scratch = Scratch::new("fleet")?;
        let config_server = match spec.layout {
            Layout::Static => None,
            Layout::Cluster => Some(start_config_server().await?),
        };
        let configdb = config_server
            .as_ref()
            .map(|c| format!("{CONFIG_SET_NAME}/{}", c.addr));
        let mut shards = Vec::new();
        let mut shard_ids = Vec::new();
        for (i, l) in latencies.iter().enumerate() {
            let id = format!("shard{i}");
            shards.push(start_shard(&id, *l, max_concurrency, configdb.as_deref()).await?);
            shard_ids.push(id);
        }
        let list: Vec<(String, SocketAddr)> = shard_ids
            .iter()
            .cloned()
            .zip(shards.iter().map(|p| p.addr))
            .collect();
        let mut spec = spec.clone();
        spec.collections.push(Sharded {
            ns: format!("bench.{WARM_UP}"),
            chunks: None,
        });
        let router = start_router(&scratch.0, &list, configdb.as_deref(), &spec).await?;
        let mut shard_clients = Vec::new();
        for s in &shards {
            shard_clients.push(client(s.addr, true).await?);
        }
        let writer = router_client(router.addr, false, &spec.client_auth).await?;
        let client = router_client(router.addr, false, &spec.client_auth).await?;
        let fleet = Fleet {
            shard_ids,
            shards,
            shard_clients,
            router,
            config_server,
            client,
            writer,
            _scratch: scratch,
        };
        if fleet.config_server.is_some() {
            fleet.set_up_cluster(&list, &spec.collections).await?;
        }
        fleet.warm_up().await?;
        Ok(fleet)
    }

    /// The cluster layout, through the router as a user sets a cluster up: `addShard` for each
    /// shard, `enableSharding` of every database, `shardCollection` of each collection on
    /// `{_id: "hashed"}` (with its `numInitialChunks`). Then one read of each collection, so
    /// the router has loaded its routing before anything is measured (the static router holds
    /// it from start-up; a `--configdb` router reads it from the config server on first use).
    async fn set_up_cluster(
        &self,
        shards: &[(String, SocketAddr)],
        collections: &[Sharded],
    ) -> anyhow::Result<()> {
        let admin = self.client.database("admin");
        for (id, addr) in shards {
            admin
                .run_command(doc! {"addShard": format!("{id}/{addr}")})
                .await
                .with_context(|| format!("addShard {id} through the router"))?;
        }
        let mut dbs: Vec<&str> = collections
            .iter()
            .map(|c| c.ns.split_once('.').map_or(c.ns.as_str(), |(db, _)| db))
            .collect();
        dbs.sort_unstable();
        dbs.dedup();
        for db in dbs {
            admin
                .run_command(doc! {"enableSharding": db})
                .await
                .with_context(|| format!("enableSharding {db} through the router"))?;
        }
        for c in collections {
            let mut cmd = doc! {"shardCollection": &c.ns, "key": {"_id": "hashed"}};
            if let Some(n) = c.chunks {
                cmd.insert("numInitialChunks", n as i64);
            }
            admin
                .run_command(cmd)
                .await
                .with_context(|| format!("shardCollection {} through the router", c.ns))?;
        }
        for c in collections {
            let (db, coll) =
                c.ns.split_once('.')
                    .ok_or_else(|| anyhow!("{} names no collection", c.ns))?;
            self.client
                .database(db)
                .collection::<Document>(coll)
                .find_one(doc! {})
                .await?;
        }
        Ok(())
    }

    /// Opens the connections the measurements will use (driver pools, the router's shard
    /// pools) with an unordered bulk through the router to every shard and a `ping` straight
    /// to each, so that no measured bulk pays for connection set-up.
    async fn warm_up(&self) -> anyhow::Result<()> {
        let n = 50 * self.shards.len();
        timed_update(&self.writer, "bench", WARM_UP, upserts("warm-up", n), false).await?;
        self.client
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await?;
        for c in &self.shard_clients {
            c.database("admin").run_command(doc! {"ping": 1}).await?;
        }
        Ok(())
    }

    /// `metrics.commands.<name>.total` summed over the shards: the child batches they ran.
    pub async fn shard_command_total(&self, name: &str) -> anyhow::Result<i64> {
        let mut total = 0;
        for c in &self.shard_clients {
            total += command_total(c, name).await?;
        }
        Ok(total)
    }

    /// Documents of `db.coll` on each shard, in shard order.
    pub async fn counts_on_shards(&self, db: &str, coll: &str) -> anyhow::Result<Vec<u64>> {
        let mut out = Vec::new();
        for c in &self.shard_clients {
            out.push(
                c.database(db)
                    .collection::<Document>(coll)
                    .count_documents(doc! {})
                    .await?,
            );
        }
        Ok(out)
    }

    /// Each shard's share of the hash space of `ns`, from the router's `config.chunks`.
    pub async fn hash_shares(&self, ns: &str) -> anyhow::Result<Vec<f64>> {
        let mut shares = vec![0.0; self.shard_ids.len()];
        for chunk in config_chunks(&self.client, ns).await? {
            let bound = |field: &str| -> anyhow::Result<f64> {
                match chunk.get_document(field)?.get("_id") {
                    Some(Bson::MinKey) => Ok(i64::MIN as f64),
                    Some(Bson::MaxKey) => Ok(i64::MAX as f64),
                    Some(Bson::Int64(v)) => Ok(*v as f64),
                    other => bail!("unexpected chunk bound {other:?}"),
                }
            };
            let width = (bound("max")? - bound("min")?) / 2f64.powi(64);
            let shard = chunk.get_str("shard")?;
            let i = self
                .shard_ids
                .iter()
                .position(|s| s == shard)
                .ok_or_else(|| anyhow!("chunk on unknown shard {shard}"))?;
            shares[i] += width;
        }
        Ok(shares)
    }

    /// Stops the router and the shards.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.client.shutdown().await;
        self.writer.shutdown().await;
        for c in self.shard_clients {
            c.shutdown().await;
        }
        self.router.stop().await?;
        // The config server before the shards: its connections to them close cleanly, where
        // the shards' going first would reset them under its feet (a warning each).
        if let Some(c) = self.config_server {
            c.stop().await?;
        }
        for s in self.shards {
            s.stop().await?;
        }
        Ok(())
    }
}

/// The `config.chunks` documents of the sharded collection `ns`, read through `client`.
pub async fn config_chunks(client: &mongodb::Client, ns: &str) -> anyhow::Result<Vec<Document>> {
    let config = client.database("config");
    let coll = config
        .collection::<Document>("collections")
        .find_one(doc! {"_id": ns})
        .await?
        .ok_or_else(|| anyhow!("{ns} is not sharded"))?;
    let uuid = coll.get("uuid").cloned().unwrap_or(Bson::Null);
    let mut cursor = config
        .collection::<Document>("chunks")
        .find(doc! {"uuid": uuid})
        .await?;
    let mut out = Vec::new();
    while cursor.advance().await? {
        out.push(cursor.deserialize_current()?);
    }
    Ok(out)
}

/// A collection's chunks as the router serves them: (min, max, shard), the bounds being the
/// first field of the shard key (for `{_id: "hashed"}`, hashed `_id`s).
pub async fn chunk_ranges(
    client: &mongodb::Client,
    ns: &str,
) -> anyhow::Result<Vec<(Bson, Bson, String)>> {
    let mut out = Vec::new();
    for d in config_chunks(client, ns).await? {
        let bound = |f: &str| -> anyhow::Result<Bson> {
            d.get_document(f)?
                .iter()
                .next()
                .map(|(_, v)| v.clone())
                .ok_or_else(|| anyhow!("chunk of {ns} with an empty {f}"))
        };
        out.push((
            bound("min")?,
            bound("max")?,
            d.get_str("shard")?.to_string(),
        ));
    }
    Ok(out)
}

/// String `_id`s `<prefix>-<k>` (k = 0, 1, …) of a collection sharded on `{_id: "hashed"}`
/// that `chunks` ([`chunk_ranges`]) place on `shard`, skipping those of other shards.
#[derive(Clone)]
pub struct IdsOn {
    chunks: std::sync::Arc<Vec<(Bson, Bson, String)>>,
    shard: String,
    prefix: String,
    k: u64,
}

impl IdsOn {
    /// Ids `<prefix>-<k>` on `shard`.
    pub fn new(
        chunks: &std::sync::Arc<Vec<(Bson, Bson, String)>>,
        shard: &str,
        prefix: &str,
    ) -> IdsOn {
        IdsOn {
            chunks: chunks.clone(),
            shard: shard.to_string(),
            prefix: prefix.to_string(),
            k: 0,
        }
    }

    /// The shard whose chunk holds the hashed string `id`, if any chunk does.
    pub fn owner<'c>(chunks: &'c [(Bson, Bson, String)], id: &str) -> Option<&'c str> {
        let h = Bson::Int64(crate::routing::hash64(&Bson::String(id.to_string())));
        chunks
            .iter()
            .find(|(lo, hi, _)| compare(lo, &h).is_le() && compare(&h, hi).is_lt())
            .map(|c| c.2.as_str())
    }

    /// The next id on this shard.
    pub fn next_id(&mut self) -> String {
        loop {
            let id = format!("{}-{}", self.prefix, self.k);
            self.k += 1;
            if Self::owner(&self.chunks, &id) == Some(self.shard.as_str()) {
                return id;
            }
        }
    }
}

/// `metrics.commands.<name>.total` of one server.
async fn command_total(c: &mongodb::Client, name: &str) -> anyhow::Result<i64> {
    let status = c
        .database("admin")
        .run_command(doc! {"serverStatus": 1})
        .await?;
    let n = status
        .get_document("metrics")
        .and_then(|m| m.get_document("commands"))
        .ok()
        .and_then(|c| c.get_document(name).ok())
        .and_then(|d| d.get("total").cloned());
    Ok(match n {
        Some(Bson::Int64(v)) => v,
        Some(Bson::Int32(v)) => v as i64,
        Some(Bson::Double(v)) => v as i64,
        _ => 0,
    })
}

/// Starts a router in front of `shards`, its configuration written into `dir`. The environment
/// variable `SLUICE_BENCH_ROUTER_TOML` appends configuration to every benchmark router (for
/// experiments such as `$'[batching]\nmin_in_flight = 16'`).
async fn start_router(
    dir: &Path,
    shards: &[(String, SocketAddr)],
    configdb: Option<&str>,
    spec: &RouterSpec,
) -> anyhow::Result<Proc> {
    let path = dir.join("router.toml");
    let mut spec = spec.clone();
    if let Ok(extra) = std::env::var("SLUICE_BENCH_ROUTER_TOML") {
        spec.extra.push_str(&extra);
    }
    std::fs::write(&path, router_config(shards, configdb, &spec))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let exe = sluice_exe()?;
    let mut args: Vec<String> = spec.wrapper.iter().skip(1).cloned().collect();
    let program = match spec.wrapper.first() {
        Some(w) => {
            args.push(exe.display().to_string());
            PathBuf::from(w)
        }
        None => exe,
    };
    args.extend(["--config".to_string(), path.display().to_string()]);
    Proc::start(&program, &args).await
}

/// `n` upserts with distinct `_id`s (`tag` makes each run's ids, hence hashes, its own).
pub fn upserts(tag: &str, n: usize) -> Vec<Bson> {
    (0..n)
        .map(|i| {
            Bson::Document(doc! {
                "q": {"_id": format!("{tag}-{i}")},
                "u": {"$set": {"stock": i as i64, "price": 100}},
                "upsert": true,
            })
        })
        .collect()
}

/// A transaction number no earlier command of this process used: the driver hands a pooled
/// session out again, and a shard answers a repeated `lsid` + `txnNumber` from its
/// retryable-write record instead of writing.
pub fn next_txn_number() -> i64 {
    static TXN: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);
    TXN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Runs one `update` command of `updates` on `db.coll` as a retryable write (`lsid` +
/// `txnNumber`, what drivers send for a bulk of single-document updates by default) and checks
/// that every statement upserted; returns its wall time. `c` must not run driver-managed
/// retryable writes (see [`Fleet::writer`]).
pub async fn timed_update(
    c: &mongodb::Client,
    db: &str,
    coll: &str,
    updates: Vec<Bson>,
    ordered: bool,
) -> anyhow::Result<Duration> {
    let n = updates.len();
    let mut session = c.start_session().await?;
    let start = Instant::now();
    let reply = c
        .database(db)
        .run_command(
            doc! {"update": coll, "updates": updates, "ordered": ordered, "txnNumber": next_txn_number()},
        )
        .session(&mut session)
        .await?;
    let took = start.elapsed();
    let upserted = reply.get_array("upserted").map(|a| a.len()).unwrap_or(0);
    if upserted != n || reply.get("writeErrors").is_some() {
        bail!("the bulk on {db}.{coll} upserted {upserted} of {n}: {reply}");
    }
    Ok(took)
}

/// A progress line on stderr, rewritten in place.
pub struct Progress {
    scenario: &'static str,
    total: usize,
    done: usize,
}

impl Progress {
    /// A progress line for `total` steps.
    pub fn new(scenario: &'static str, total: usize) -> Progress {
        Progress {
            scenario,
            total,
            done: 0,
        }
    }

    /// Announces the next step (one line each when stderr is not a terminal).
    pub fn step(&mut self, what: &str) {
        self.done += 1;
        let line = format!("{}: [{}/{}] {what}", self.scenario, self.done, self.total);
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }

    /// Ends the line.
    pub fn finish(self) {
        let line = format!("{}: {} steps done", self.scenario, self.total);
        if std::io::stderr().is_terminal() {
            eprintln!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }
}

/// Mean, sample standard deviation, minimum and maximum.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (0 for one sample).
    pub sd: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Median.
    pub median: f64,
}

impl Stats {
    /// The statistics of `xs` (all zero when empty).
    pub fn of(xs: &[f64]) -> Stats {
        if xs.is_empty() {
            return Stats::default();
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = if xs.len() > 1 {
            xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        let mut sorted = xs.to_vec();
        sorted.sort_by(f64::total_cmp);
        Stats {
            mean,
            sd: var.sqrt(),
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            median: quantile(&sorted, 0.5),
        }
    }

    /// As JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"mean": self.mean, "sd": self.sd, "min": self.min, "max": self.max, "median": self.median})
    }
}

/// The `q` quantile of sorted values (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_quantiles() {
        let s = Stats::of(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(s.mean, 2.5);
        assert!((s.sd - 1.29099).abs() < 1e-4);
        assert_eq!((s.min, s.max), (1.0, 4.0));
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.99), 4.0);
        assert_eq!(Stats::of(&[]).mean, 0.0);
    }

    #[test]
    fn router_config_parses_as_a_config() {
        let spec = RouterSpec {
            policy: Policy::Off,
            collections: vec![Sharded {
                ns: "bench.c0".into(),
                chunks: Some(3),
            }],
            wrapper: vec![],
            extra: String::new(),
            client_auth: ClientAuth::default(),
            layout: Layout::Static,
            metrics_listen: "127.0.0.1:9999".into(),
        };
        let shards = [("shard0".into(), "127.0.0.1:1".parse().expect("addr"))];
        let text = router_config(&shards, None, &spec);
        let c: crate::config::Config = toml::from_str(&text).expect("valid configuration");
        assert_eq!(c.ordered_rewrite, Policy::Off);
        assert_eq!(c.collections[0].num_initial_chunks, Some(3));
        assert_eq!(c.shards[0].address, "127.0.0.1:1");
        assert_eq!(c.metrics_listen, "127.0.0.1:9999");
        c.validate().expect("a valid static configuration");

        // With a config server: nothing listed, the config server is the authority.
        let text = router_config(&shards, Some("configRS/127.0.0.1:2"), &spec);
        let c: crate::config::Config = toml::from_str(&text).expect("valid configuration");
        assert_eq!(c.configdb.as_deref(), Some("configRS/127.0.0.1:2"));
        assert!(c.shards.is_empty() && c.collections.is_empty());
        assert_eq!(c.ordered_rewrite, Policy::Off);
        c.validate().expect("a valid --configdb configuration");
    }

    #[test]
    fn layouts_by_name() {
        for l in [Layout::Static, Layout::Cluster] {
            assert_eq!(l.name().parse::<Layout>().expect("known"), l);
        }
        assert!("sharded".parse::<Layout>().is_err());
        assert_eq!(Layout::default(), Layout::Static);
    }
}
