//! The `sluice` binary: the router (`sluice run`, the default) and the demo (`sluice demo`).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use sluice::config::{Config, LogFormat};
use sluice::frontend::memory::{set_allocator, AllocatorSetting};
use sluice::routing::ShardInfo;

/// A MongoDB wire-protocol router, compatible with mongos.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Args)]
struct GlobalArgs {
    /// TOML configuration file (see configs/).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// The config server replica set to route by, as mongos's `--configdb`:
    /// `"<replica set>/host:port,host:port"` (overrides `configdb`; excludes `shards`).
    #[arg(long, global = true)]
    configdb: Option<String>,
    /// Address to listen on for clients (overrides `listen`).
    #[arg(long, global = true)]
    listen: Option<String>,
    /// Most client connections open at once (overrides `max_connections`).
    #[arg(long, global = true)]
    max_connections: Option<usize>,
    /// Log format (overrides `log.format`).
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    /// Log filter such as `info` or `sluice=debug` (overrides `log.level`).
    #[arg(long, global = true)]
    log_level: Option<String>,
    /// Address of the Prometheus endpoint, or "" to disable it (overrides `metrics_listen`).
    #[arg(long, global = true)]
    metrics_listen: Option<String>,
    /// Accept commands only tests send (overrides `enable_test_commands`): on `sluice shard`
    /// and the demo's shards, MongoDB's `configureFailPoint` and `sluiceSetLatency`; never in
    /// production.
    #[arg(long, global = true)]
    enable_test_commands: bool,
    /// Bytes a blocking aggregation stage may hold without allowDiskUse (overrides
    /// `stage_memory_bytes`; 100 MiB by default).
    #[arg(long, global = true)]
    stage_memory_bytes: Option<usize>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the router (the default).
    Run,
    /// Run a demo on loopback that mongosh can connect to: an embedded cluster laid out as
    /// MongoDB's (config server, shards, routers in --configdb mode; in memory), with the
    /// collections of configs/demo.toml sharded on hashed keys. With a keyfile or TLS (unless
    /// --cluster), or --static, one router holding the metadata itself instead.
    Demo {
        /// Port for the router (the first router; the others listen on the next ports).
        #[arg(long, default_value_t = 27017)]
        port: u16,
        /// Number of embedded shards.
        #[arg(long, default_value_t = 3)]
        shards: usize,
        /// Members of each shard's replica set (embedded, sharing one data set: a test
        /// backend, not replication); 1 runs each shard as a single server.
        #[arg(long, default_value_t = 3)]
        members: usize,
        /// The cluster layout (the default without a keyfile or TLS; with them, asked for by
        /// this flag): an embedded config server, the shards in shard-server mode, and routers
        /// in --configdb mode, which all require and present the keyfile and TLS when given.
        #[arg(long, conflicts_with = "static_layout")]
        cluster: bool,
        /// One router holding the metadata itself (static mode), as `sluice --config` runs.
        #[arg(long = "static", id = "static_layout")]
        static_layout: bool,
        /// Number of routers (the cluster layout).
        #[arg(long, default_value_t = 1)]
        routers: usize,
    },
    /// Run a benchmark and write its JSON, Markdown and SVG results.
    Bench {
        /// The scenario: rounds, bulkwrite, seed-table, overhead, security, overload, undo, failover or migration (`cargo bench --bench micro`
        /// runs the micro-benchmarks).
        scenario: String,
        /// A short run (what CI does).
        #[arg(long)]
        quick: bool,
        /// Directory for the results.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        /// What rounds and seed-table run against: `static`, one router holding the metadata
        /// itself (`sluice --config`), or `cluster`, the layout `sluice demo` runs (a config
        /// server, shards in shard-server mode and a --configdb router, each a process; results
        /// written as `<scenario>-cluster.*`). migration always runs on the cluster layout.
        #[arg(long, default_value = "static", value_parser = ["static", "cluster"])]
        layout: String,
    },
    /// Forward every connection to one address with no parsing at all (`bench overhead` measures
    /// the router against it: the cost of the hop itself).
    Forward {
        /// The address to forward to, e.g. 127.0.0.1:27018.
        #[arg(long)]
        to: std::net::SocketAddr,
    },
    /// Print the hashed shard key value (NumberLong) of an extended JSON value, as
    /// convertShardKeyToHashed() does.
    Hash {
        /// The value, in extended JSON: 42, "abc", {"$oid": "…"}, {"productId": 1, "storeId": 2}.
        value: String,
    },
    /// Run an embedded config server (for tests and demos; not for production): the cluster's
    /// `config.*` documents, read by routers started with `--configdb`, in memory or kept in
    /// a file (--metadata-path).
    Configsvr {
        /// Port to listen on (127.0.0.1 unless --listen says otherwise).
        #[arg(long, default_value_t = 27019)]
        port: u16,
        /// Replica set name reported by hello (what `--configdb` names).
        #[arg(long, default_value = "configRS")]
        set_name: String,
        /// Keep the `config.*` documents in this file: read at start-up, rewritten atomically
        /// after every change (overrides `metadata_path` of the configuration file). Without
        /// either, memory only.
        #[arg(long)]
        metadata_path: Option<std::path::PathBuf>,
    },
    /// Run one embedded shard (in memory, for tests and benchmarks; not for production).
    Shard {
        /// Port to listen on (127.0.0.1 unless --listen says otherwise).
        #[arg(long, default_value_t = 27018)]
        port: u16,
        /// Replica set name reported by hello (the shard's id).
        #[arg(long, default_value = "shard0")]
        set_name: String,
        /// Time added to every data command, e.g. 1ms.
        #[arg(long, value_parser = sluice::embedded::parse_duration, default_value = "0ms")]
        latency_per_command: std::time::Duration,
        /// Time added per statement written, e.g. 0.2ms.
        #[arg(long, value_parser = sluice::embedded::parse_duration, default_value = "0ms")]
        latency_per_document: std::time::Duration,
        /// Most data commands executing at once; the rest queue.
        #[arg(long)]
        max_concurrency: Option<usize>,
        /// Run an embedded replica set of this name instead of one shard: its members share one
        /// data set (a test backend, not replication) and listen on consecutive ports from
        /// --port.
        #[arg(long)]
        replset: Option<String>,
        /// Members of the --replset set (member 0 starts as primary).
        #[arg(long, default_value_t = 3)]
        members: usize,
    },
}

/// glibc's allocator settings the process starts with, each unless its environment variable
/// is set (docs/hardening.md, "Cursors kept encoded, and the allocator"): a fixed mmap threshold
/// at glibc's own starting value, so that a block of 128 KiB or more (a cursor's buffered
/// results, a large message) is mapped on its own and unmapped when freed. glibc otherwise
/// raises the threshold, and the trim threshold with it, to the size of each such block freed
/// (up to 32 MiB), after which those blocks stay in the arenas, and a thread arena's free top
/// is never given back (`malloc_trim` leaves it).
const ALLOCATOR_SETTINGS: [(AllocatorSetting, i32); 1] =
    [(AllocatorSetting::MmapThreshold, 128 * 1024)];

fn configure_allocator() {
    for (setting, value) in ALLOCATOR_SETTINGS {
        if std::env::var_os(setting.env_var()).is_none() && !set_allocator(setting, value) {
            eprintln!("the allocator refused {} = {value}", setting.env_var());
        }
    }
}

fn main() -> anyhow::Result<()> {
    // Before the runtime's threads allocate.
    configure_allocator();
    let cli = Cli::parse();
    let mut config = match &cli.global.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(listen) = &cli.global.listen {
        config.listen = listen.clone();
    }
    if let Some(c) = &cli.global.configdb {
        config.configdb = Some(c.clone());
    }
    if let Some(n) = cli.global.max_connections {
        config.max_connections = n;
    }
    if let Some(f) = cli.global.log_format {
        config.log.format = f;
    }
    if let Some(l) = &cli.global.log_level {
        config.log.level = l.clone();
    }
    if let Some(m) = &cli.global.metrics_listen {
        config.metrics_listen = m.clone();
    }
    if cli.global.enable_test_commands {
        config.enable_test_commands = true;
    }
    if let Some(n) = cli.global.stage_memory_bytes {
        config.stage_memory_bytes = n;
    }
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_stack_size(sluice::limits::WORKER_STACK_BYTES)
            // An idle worker gives back the stack pages a deep request touched.
            .on_thread_park(sluice::frontend::memory::release_idle_stack)
            .build()
            .context("cannot start the async runtime")
    };
    let demo = match cli.command {
        Some(Command::Bench {
            scenario,
            quick,
            out,
            layout,
        }) => {
            let layout = layout.parse()?;
            let md = runtime()?.block_on(sluice::bench::run(&scenario, quick, layout, &out))?;
            println!("{md}");
            println!("Results written to {}", out.display());
            return Ok(());
        }
        Some(Command::Forward { to }) => {
            let listen = cli.global.listen.as_deref().unwrap_or("127.0.0.1:0");
            return runtime()?.block_on(sluice::bench::forward::serve(listen, to));
        }
        Some(Command::Hash { value }) => {
            let json: serde_json::Value = serde_json::from_str(&value)
                .with_context(|| format!("{value:?} is not valid extended JSON"))?;
            let bson = bson::Bson::try_from(json)
                .map_err(|e| anyhow::anyhow!("{value:?} is not valid extended JSON: {e}"))?;
            println!("{}", sluice::routing::hash64(&bson));
            return Ok(());
        }
        Some(Command::Demo {
            port,
            shards,
            members,
            cluster,
            static_layout,
            routers,
        }) => {
            if cli.global.listen.is_none() {
                config.listen = format!("127.0.0.1:{port}");
            }
            if shards == 0 {
                anyhow::bail!("--shards must be at least 1");
            }
            if members == 0 {
                anyhow::bail!("--members must be at least 1");
            }
            if routers == 0 {
                anyhow::bail!("--routers must be at least 1");
            }
            if config.configdb.is_some() {
                anyhow::bail!("sluice demo runs its own cluster; --configdb is for `sluice run`");
            }
            let secured = config.security.key_file.is_some() || config.tls.mode.accepts_tls();
            if static_layout && routers > 1 {
                anyhow::bail!("--routers needs the cluster layout; leave out --static");
            }
            // With a keyfile or TLS the single-router static layout stays the default; --cluster
            // runs the cluster layout secured (its servers require and present the same).
            let cluster = if secured { cluster } else { !static_layout };
            if !cluster && routers > 1 {
                anyhow::bail!(
                    "--routers needs the cluster layout (with a keyfile or TLS, give --cluster)"
                );
            }
            if cluster {
                config.validate()?;
                init_logging(&config);
                return runtime()?.block_on(run_cluster_demo(config, shards, members, routers));
            }
            Some((shards, members))
        }
        Some(Command::Shard {
            port,
            set_name,
            latency_per_command,
            latency_per_document,
            max_concurrency,
            replset,
            members,
        }) => {
            if cli.global.listen.is_none() {
                config.listen = format!("127.0.0.1:{port}");
            }
            config.validate()?;
            init_logging(&config);
            let options = sluice::embedded::ShardOptions {
                set_name,
                latency_per_command,
                latency_per_document,
                max_concurrency,
                configdb: config.configdb.clone(),
                ..embedded_options(&config)
            };
            if let Some(name) = replset {
                if members == 0 {
                    anyhow::bail!("--members must be at least 1");
                }
                return runtime()?.block_on(run_replica_set(config, options, name, members));
            }
            return runtime()?.block_on(run_shard(config, options));
        }
        Some(Command::Configsvr {
            port,
            set_name,
            metadata_path,
        }) => {
            if cli.global.listen.is_none() {
                config.listen = format!("127.0.0.1:{port}");
            }
            config.validate()?;
            init_logging(&config);
            let options = sluice::embedded::ShardOptions {
                set_name,
                config_server: true,
                metadata_path: metadata_path
                    .or_else(|| config.metadata_path.clone().map(Into::into)),
                ..embedded_options(&config)
            };
            return runtime()?.block_on(run_shard(config, options));
        }
        Some(Command::Run) | None => None,
    };
    config.validate()?;
    init_logging(&config);
    runtime()?.block_on(run(config, demo))
}

async fn run_replica_set(
    config: Config,
    options: sluice::embedded::ShardOptions,
    name: String,
    members: usize,
) -> anyhow::Result<()> {
    let first: std::net::SocketAddr = config
        .listen
        .parse()
        .with_context(|| format!("invalid listen address {:?}", config.listen))?;
    let listens: Vec<String> = (0..members)
        .map(|i| {
            let port = u16::try_from(first.port() as usize + i).map_err(|_| {
                anyhow::anyhow!(
                    "--members {members} from port {} passes 65535",
                    first.port()
                )
            })?;
            Ok(std::net::SocketAddr::new(first.ip(), port).to_string())
        })
        .collect::<anyhow::Result<_>>()?;
    let set = sluice::embedded::EmbeddedReplicaSet::start_on(
        &listens,
        sluice::embedded::ReplicaSetOptions {
            members,
            shard: sluice::embedded::ShardOptions {
                set_name: name.clone(),
                ..options
            },
            ..Default::default()
        },
    )
    .await
    .with_context(|| {
        format!(
            "cannot start the embedded replica set on {}",
            listens.join(", ")
        )
    })?;
    let seeds = set.seed_list();
    tracing::info!(%seeds, "embedded replica set listening (memory only, not for production)");
    println!(
        "Embedded replica set {seeds} is listening (memory only; the members share one data set: a test backend, not replication)."
    );
    wait_for_signal().await;
    set.shutdown().await;
    Ok(())
}

/// What an embedded server (`sluice shard`, `sluice configsvr`) takes from the configuration.
fn embedded_options(config: &Config) -> sluice::embedded::ShardOptions {
    sluice::embedded::ShardOptions {
        enable_test_commands: config.enable_test_commands,
        stage_memory_bytes: config.stage_memory_bytes,
        key_file: config.security.key_file.clone(),
        cluster_auth_mode: config.security.cluster_auth_mode,
        tls: config.tls.clone(),
        // The users and roles this server holds (a config server's are the cluster's).
        users_file: config.security.users_file.clone(),
        roles_file: config.security.roles_file.clone(),
        ..Default::default()
    }
}

async fn run_shard(config: Config, options: sluice::embedded::ShardOptions) -> anyhow::Result<()> {
    let name = options.set_name.clone();
    let what = if options.config_server {
        "config server"
    } else {
        "shard"
    };
    let kept = match (&options.metadata_path, options.config_server) {
        (Some(path), true) => format!("config.* kept in {}", path.display()),
        _ => "memory only".to_string(),
    };
    let shard = sluice::embedded::EmbeddedShard::start(&config.listen, options)
        .await
        .with_context(|| format!("cannot start the embedded {what} on {}", config.listen))?;
    let addr = shard.local_addr();
    tracing::info!(%addr, %name, "embedded {what} listening ({kept}, not for production)");
    println!("Embedded {what} {name} is listening on {addr} ({kept}).");
    wait_for_signal().await;
    shard.shutdown().await;
    Ok(())
}

/// Serves Prometheus metrics on `addr` (a failure to bind is logged, not fatal: the router
/// runs without the endpoint).
fn install_metrics(addr: &str) {
    if addr.is_empty() {
        return;
    }
    let Ok(sock) = addr.parse::<std::net::SocketAddr>() else {
        tracing::warn!(
            addr,
            "metrics_listen is not an address; metrics endpoint disabled"
        );
        return;
    };
    if std::net::TcpListener::bind(sock).is_err() {
        tracing::warn!(
            addr,
            "cannot listen for metrics (address in use?); metrics endpoint disabled"
        );
        return;
    }
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let result = metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(sock)
        .set_buckets(&buckets)
        .and_then(|b| b.install());
    match result {
        Ok(()) => tracing::info!(addr, "Prometheus metrics at http://{addr}/metrics"),
        Err(e) => tracing::warn!(addr, error = %e, "cannot start the metrics endpoint"),
    }
}

async fn run(config: Config, demo_shards: Option<(usize, usize)>) -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    install_metrics(&config.metrics_listen);
    let listen = config.listen.clone();
    let mut embedded = Vec::new();
    let mut sets = Vec::new();
    let cluster = if let Some((n, members)) = demo_shards {
        let options = sluice::embedded::ShardOptions {
            enable_test_commands: config.enable_test_commands,
            stage_memory_bytes: config.stage_memory_bytes,
            // The demo's shards require what the router proves: the keyfile and TLS.
            key_file: config.security.key_file.clone(),
            cluster_auth_mode: config.security.cluster_auth_mode,
            tls: config.tls.clone(),
            ..Default::default()
        };
        let infos: Vec<ShardInfo> = if members == 1 {
            embedded = sluice::embedded::EmbeddedShard::start_many(n, options)
                .await
                .context("cannot start the embedded shards")?;
            embedded
                .iter()
                .map(|s| ShardInfo {
                    id: s.service().name().to_string(),
                    addr: s.local_addr().to_string(),
                    shard_server: true,
                })
                .collect()
        } else {
            // Each shard a replica set, given to the router as its seed list.
            for i in 0..n {
                let set = sluice::embedded::EmbeddedReplicaSet::start(
                    sluice::embedded::ReplicaSetOptions {
                        members,
                        shard: sluice::embedded::ShardOptions {
                            set_name: format!("shard{i}"),
                            ..options.clone()
                        },
                        ..Default::default()
                    },
                )
                .await
                .context("cannot start the embedded replica sets")?;
                sets.push(set);
            }
            sets.iter()
                .map(|s| ShardInfo {
                    id: s.name().to_string(),
                    addr: s.seed_list(),
                    shard_server: true,
                })
                .collect()
        };
        let demo: Config = toml::from_str(include_str!("../configs/demo.toml"))
            .context("configs/demo.toml is invalid")?;
        Some(
            sluice::router::bootstrap(
                None,
                &infos,
                &demo.collections,
                config.pool_options()?,
                &config.batching,
            )
            .await
            .map_err(|e| anyhow::anyhow!(e))?,
        )
    } else if let Some(configdb) = &config.configdb {
        Some(
            sluice::router::configdb::bootstrap_configdb(
                configdb,
                config.pool_options()?,
                &config.batching,
            )
            .await
            .map_err(|e| anyhow::anyhow!(e))?,
        )
    } else if !config.shards.is_empty() {
        let infos: Vec<ShardInfo> = config
            .shards
            .iter()
            .map(|s| ShardInfo {
                id: s.id.clone(),
                addr: s.address.clone(),
                shard_server: s.shard_server,
            })
            .collect();
        Some(
            sluice::router::bootstrap(
                config.metadata_path.as_ref().map(Into::into),
                &infos,
                &config.collections,
                config.pool_options()?,
                &config.batching,
            )
            .await
            .map_err(|e| anyhow::anyhow!(e))?,
        )
    } else {
        None
    };
    let router = sluice::router::start_router(config, argv, cluster.clone())
        .await
        .with_context(|| format!("cannot start the router on {listen}"))?;
    let addr = router.local_addr();
    tracing::info!(%addr, "sluice router listening");
    // One line on stdout that tools (`sluice bench`, scripts) can wait for.
    println!(
        "Sluice {} is listening on {addr}.",
        env!("CARGO_PKG_VERSION")
    );
    if let (Some(cluster), Some(_)) = (&cluster, demo_shards) {
        let shards: Vec<String> = cluster
            .cluster
            .shards()
            .iter()
            .map(|s| format!("{} at {}", s.id, s.addr))
            .collect();
        println!(
            "Embedded shards (in memory, replica sets sharing one data set; not for production): {}",
            shards.join(", ")
        );
        println!(
            "Sharded on hashed keys: demo.store_inventory {{_id: \"hashed\"}}, demo.orders {{customerId: \"hashed\"}}"
        );
        println!("Connection string: mongodb://{addr}/");
        println!("Try:               mongosh \"mongodb://{addr}/demo\" --eval 'sh.status()'");
        println!("Stop with Ctrl-C.");
    }
    // A signal, or the `shutdown` command (which has begun the router's shutdown already).
    let mut stopping = router.state().shutdown_signal();
    tokio::select! {
        _ = wait_for_signal() => {}
        _ = stopping.wait_for(|s| *s) => {}
    }
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    router.shutdown().await;
    if let Some(cluster) = &cluster {
        cluster.close().await;
    }
    for shard in embedded {
        shard.shutdown().await;
    }
    for set in sets {
        set.shutdown().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// `sluice demo --cluster` (`--routers N`): the embedded cluster of [`sluice::demo`], each
/// router announced as `sluice run` announces itself.
async fn run_cluster_demo(
    config: Config,
    shards: usize,
    members: usize,
    routers: usize,
) -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    install_metrics(&config.metrics_listen);
    let first: std::net::SocketAddr = config
        .listen
        .parse()
        .with_context(|| format!("invalid listen address {:?}", config.listen))?;
    let mut configs = Vec::with_capacity(routers);
    for i in 0..routers {
        // Port 0: every router on an ephemeral port of its own.
        let offset = if first.port() == 0 { 0 } else { i };
        let port = u16::try_from(first.port() as usize + offset).map_err(|_| {
            anyhow::anyhow!(
                "--routers {routers} from port {} passes 65535",
                first.port()
            )
        })?;
        configs.push(Config {
            listen: std::net::SocketAddr::new(first.ip(), port).to_string(),
            ..config.clone()
        });
    }
    // The config server and shard servers require what the routers present (a keyfile, TLS)
    // and present it to each other.
    let options = sluice::embedded::ShardOptions {
        enable_test_commands: config.enable_test_commands,
        stage_memory_bytes: config.stage_memory_bytes,
        key_file: config.security.key_file.clone(),
        cluster_auth_mode: config.security.cluster_auth_mode,
        tls: config.tls.clone(),
        internal_security: config.pool_options()?.security,
        ..Default::default()
    };
    let demo: Config = toml::from_str(include_str!("../configs/demo.toml"))
        .context("configs/demo.toml is invalid")?;
    let cluster = sluice::demo::DemoCluster::start_with_members(
        shards,
        members,
        options,
        configs,
        argv,
        &demo.collections,
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))?;
    let addrs: Vec<String> = cluster
        .routers
        .iter()
        .map(|(r, _)| r.local_addr().to_string())
        .collect();
    for addr in &addrs {
        tracing::info!(%addr, "sluice router listening");
        println!(
            "Sluice {} is listening on {addr}.",
            env!("CARGO_PKG_VERSION")
        );
    }
    let shard_list = cluster.shard_hosts();
    println!(
        "Embedded config server (in memory, not for production): {}",
        cluster.configdb()
    );
    let kind = if members > 1 {
        "replica sets sharing one data set per set; "
    } else {
        ""
    };
    println!(
        "Embedded shards (in memory, {kind}not for production): {}",
        shard_list.join(", ")
    );
    println!(
        "Sharded on hashed keys: demo.store_inventory {{_id: \"hashed\"}}, demo.orders {{customerId: \"hashed\"}}"
    );
    let first = addrs.first().cloned().unwrap_or_default();
    println!("Connection string: mongodb://{first}/");
    if addrs.len() > 1 {
        println!(
            "Every router:      mongodb://{}/ (a driver spreads its requests over them)",
            addrs.join(",")
        );
    }
    println!("Try:               mongosh \"mongodb://{first}/demo\" --eval 'sh.status()'");
    println!("Stop with Ctrl-C.");
    wait_for_signal().await;
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    cluster.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the router");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn init_logging(config: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
