//! `sluice bench security`: what client authentication and TLS cost the router, in
//! instructions (`valgrind --tool=callgrind` on the router process), side by side in one run.
//!
//! Four routers, one after the other, each over two embedded shards (separate processes), the
//! collection sharded on `{_id: "hashed"}`: plain; SCRAM-SHA-256 with authorization enabled
//! (every command's privileges checked); TLS on the client listener (`tls.mode = "allow"`, so
//! the shards stay plain and only the client's hop is encrypted); TLS and SCRAM together. Two
//! workloads each, counted with the marginal method of `bench overhead` (two runs that differ
//! only in the number of operations; the difference of the totals over the difference of the
//! operations), so start-up, the fleet's own connections and background timers cancel out:
//!
//! - `insert_one` on an open, authenticated connection: what authorization and encryption add
//!   to every single-document write;
//! - `find_one` by `_id` on an open, authenticated connection: the same for a single-document
//!   read;
//! - a new client: the stock driver's `Client` created, one `ping`, shut down. That is every
//!   connection the driver opens for it (its monitors and one pooled connection: the
//!   handshakes, the TLS handshakes and the SCRAM conversation) and the router's side of
//!   closing them. The router's own count of connections it accepted gives connections per
//!   client, so the figure can also be read per connection.
//!
//! A fifth router authenticates a user holding only `readWrite` on the benchmark's database,
//! as an application's user would, rather than `root`: its inserts and finds against the plain
//! router's are what the per-command authorization check costs.
//!
//! Certificates come from the `openssl` command line (a throw-away CA and a server certificate
//! for `127.0.0.1`), the user from the router's users file, written before it starts.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use bson::{doc, Document};

use super::fleet::{router_client, ClientAuth, Fleet, Latency, Progress, Scratch};
use super::overhead::{callgrind_router, callgrind_total, check_valgrind, require_tool};
use super::report::Report;
use crate::auth::credentials::{UserDocument, UsersFile};
use crate::auth::roles::RoleName;
use crate::auth::scram::ScramMechanism;
use crate::auth::UserName;

const USER: &str = "bench";
const PASSWORD: &str = "bench-password";

/// How clients reach the router.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Scram,
    ReadWrite,
    Tls,
    TlsScram,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::Plain,
        Mode::Scram,
        Mode::ReadWrite,
        Mode::Tls,
        Mode::TlsScram,
    ];

    fn label(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Scram => "SCRAM-SHA-256, authorization on",
            Mode::ReadWrite => "SCRAM-SHA-256, readWrite user, authorization on",
            Mode::Tls => "TLS",
            Mode::TlsScram => "TLS + SCRAM-SHA-256",
        }
    }

    fn scram(self) -> bool {
        matches!(self, Mode::Scram | Mode::ReadWrite | Mode::TlsScram)
    }

    /// The role of the benchmark's user.
    fn role(self) -> RoleName {
        match self {
            Mode::ReadWrite => RoleName::new("readWrite", "bench"),
            _ => RoleName::new("root", "admin"),
        }
    }

    /// What is counted under the mode: the writes and the new clients everywhere, the reads
    /// where the authorization check is compared (plain, and the `readWrite` user).
    fn workloads(self) -> &'static [Workload] {
        match self {
            Mode::Plain => &[Workload::InsertOne, Workload::FindOne, Workload::NewClient],
            Mode::ReadWrite => &[Workload::InsertOne, Workload::FindOne],
            _ => &[Workload::InsertOne, Workload::NewClient],
        }
    }

    fn tls(self) -> bool {
        matches!(self, Mode::Tls | Mode::TlsScram)
    }
}

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Workload {
    InsertOne,
    FindOne,
    NewClient,
}

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Workload::InsertOne => "insert_one",
            Workload::FindOne => "find_one by _id",
            Workload::NewClient => "new client + ping",
        }
    }
}

/// One marginal count.
struct Count {
    mode: Mode,
    workload: Workload,
    ops: (u64, u64),
    totals: (u64, u64),
    /// Connections the router accepted per operation (new clients only).
    connections_per_op: Option<f64>,
}

impl Count {
    fn per_op(&self) -> f64 {
        (self.totals.1 as f64 - self.totals.0 as f64) / (self.ops.1 - self.ops.0) as f64
    }
}

/// Runs the scenario.
pub async fn run(quick: bool) -> anyhow::Result<Report> {
    check_valgrind().await?;
    check_openssl().await?;
    let (inserts, clients) = if quick {
        ((5, 15), (1, 3))
    } else {
        ((200, 1200), (20, 120))
    };
    let certs = Scratch::new("security-certs")?;
    certificates(&certs.0).await?;
    let runs = Mode::ALL.iter().map(|m| m.workloads().len() * 2).sum();
    let mut progress = Progress::new("security", runs);
    let mut counts = Vec::new();
    for mode in Mode::ALL {
        for &workload in mode.workloads() {
            let (short, long) = match workload {
                Workload::NewClient => clients,
                _ => inserts,
            };
            let mut totals = Vec::new();
            let mut accepted = Vec::new();
            for n in [short, long] {
                progress.step(&format!(
                    "callgrind: {} × {} ({})",
                    n,
                    workload.label(),
                    mode.label()
                ));
                let (total, conns) = callgrind_run(mode, workload, n, &certs.0).await?;
                totals.push(total);
                accepted.push(conns);
            }
            counts.push(Count {
                mode,
                workload,
                ops: (short as u64, long as u64),
                totals: (totals[0], totals[1]),
                connections_per_op: (workload == Workload::NewClient)
                    .then(|| (accepted[1] - accepted[0]) as f64 / (long - short) as f64),
            });
        }
    }
    progress.finish();
    Ok(report(&counts))
}

async fn check_openssl() -> anyhow::Result<()> {
    require_tool(
        "openssl",
        "version",
        "the TLS lanes need the openssl command line (Debian: apt-get install openssl)",
    )
    .await
}

/// A CA (`ca.pem`) and a server certificate and key for 127.0.0.1 (`server.pem`) in `dir`.
async fn certificates(dir: &Path) -> anyhow::Result<()> {
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )?;
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=bench CA",
        ],
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    ];
    for args in steps {
        let out = tokio::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "openssl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let pem = std::fs::read_to_string(dir.join("server.crt"))?
        + &std::fs::read_to_string(dir.join("server.key"))?;
    std::fs::write(dir.join("server.pem"), pem)?;
    Ok(())
}

/// The router's configuration and the clients' connection string for `mode`; writes the
/// users file into `scratch` when SCRAM is on.
fn secure(mode: Mode, certs: &Path, scratch: &Path) -> anyhow::Result<(String, ClientAuth)> {
    let mut toml = String::new();
    let mut auth = ClientAuth::default();
    if mode.scram() {
        let mut users = UsersFile::new();
        let user = UserDocument::new_scram(
            UserName::new(USER, "admin"),
            PASSWORD,
            &[ScramMechanism::Sha256],
            vec![mode.role()],
        )
        .map_err(|e| anyhow!("cannot make the benchmark user: {e}"))?;
        users
            .insert(user)
            .map_err(|e| anyhow!("cannot add the benchmark user: {e}"))?;
        let path = scratch.join("users.json");
        std::fs::write(&path, users.to_text())?;
        let _ = writeln!(
            toml,
            "\n[security]\nauthorization = \"enabled\"\nusers_file = \"{}\"",
            path.display()
        );
        auth.userinfo = format!("{USER}:{PASSWORD}@");
        auth.options.push_str("&authMechanism=SCRAM-SHA-256");
    }
    if mode.tls() {
        let _ = writeln!(
            toml,
            "\n[tls]\nmode = \"allow\"\ncertificate_key_file = \"{}\"",
            certs.join("server.pem").display()
        );
        let _ = write!(
            auth.options,
            "&tls=true&tlsCAFile={}",
            certs.join("ca.pem").display()
        );
    }
    Ok((toml, auth))
}

/// Starts two shards and a router under callgrind, runs `n` operations of `workload` and
/// returns the router's total instructions and the connections it accepted in all.
async fn callgrind_run(
    mode: Mode,
    workload: Workload,
    n: usize,
    certs: &Path,
) -> anyhow::Result<(u64, i64)> {
    let scratch = Scratch::new("security")?;
    let out = scratch.0.join("callgrind.out");
    let mut spec = callgrind_router("bench.sec", &out);
    let (toml, auth) = secure(mode, certs, &scratch.0)?;
    spec.extra = toml;
    spec.client_auth = auth.clone();
    let fleet = Fleet::start(&[Latency::default(); 2], &spec).await?;
    if mode.scram() {
        refused_without_credentials(&fleet, &auth, mode).await?;
    }
    let coll = fleet.client.database("bench").collection::<Document>("sec");
    if workload == Workload::FindOne {
        coll.insert_one(doc! {"_id": 0_i64, "v": 1, "pad": "0123456789abcdef"})
            .await?;
    }
    for i in 0..n {
        match workload {
            Workload::InsertOne => {
                coll.insert_one(doc! {"_id": i as i64, "v": 1, "pad": "0123456789abcdef"})
                    .await?;
            }
            Workload::FindOne => {
                if coll.find_one(doc! {"_id": 0_i64}).await?.is_none() {
                    bail!("find_one found nothing ({})", mode.label());
                }
            }
            Workload::NewClient => {
                let c = router_client(fleet.router.addr, false, &auth).await?;
                c.database("admin").run_command(doc! {"ping": 1}).await?;
                c.shutdown().await;
            }
        }
    }
    if workload == Workload::InsertOne {
        let stored = coll.count_documents(doc! {}).await?;
        if stored != n as u64 {
            bail!("{} of {n} documents stored ({})", stored, mode.label());
        }
    }
    // Only the new clients count connections (`serverStatus` needs `clusterMonitor`, which
    // the `readWrite` user does not hold).
    let accepted = if workload == Workload::NewClient {
        let status = fleet
            .client
            .database("admin")
            .run_command(doc! {"serverStatus": 1})
            .await?;
        status
            .get_document("connections")
            .ok()
            .and_then(|c| c.get_i32("totalCreated").ok())
            .context("serverStatus has no connections.totalCreated")?
    } else {
        0
    };
    fleet.stop().await?;
    Ok((callgrind_total(&out)?, i64::from(accepted)))
}

/// Checks that the router really requires authentication: a client with the same transport
/// but no user is refused a write with Unauthorized (13).
async fn refused_without_credentials(
    fleet: &Fleet,
    auth: &ClientAuth,
    mode: Mode,
) -> anyhow::Result<()> {
    let anonymous = ClientAuth {
        userinfo: String::new(),
        options: auth.options.replace("&authMechanism=SCRAM-SHA-256", ""),
    };
    let c = router_client(fleet.router.addr, false, &anonymous).await?;
    let r = c
        .database("bench")
        .collection::<Document>("sec")
        .insert_one(doc! {"_id": "anonymous"})
        .await;
    c.shutdown().await;
    match r {
        Err(e) if matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 13) => {
            Ok(())
        }
        Err(e) => bail!(
            "an anonymous write under {} failed with {e}, not Unauthorized",
            mode.label()
        ),
        Ok(_) => bail!("an anonymous write under {} was accepted", mode.label()),
    }
}

fn report(counts: &[Count]) -> Report {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut md = format!(
        "Router instructions (`valgrind --tool=callgrind` on the router process, two embedded shards, {profile} build) per operation: the difference between a short and a long run, divided by the difference of their operations. \"new client\": a stock-driver `Client` created, one `ping`, shut down (every connection it opens: monitors and one pooled connection). TLS is on the client's hop only (`tls.mode = \"allow\"`); SCRAM runs with authorization enabled, as `root` except for the `readWrite` lane (a user with `readWrite` on the benchmark database only).\n\n| clients reach the router with | workload | operations (short / long) | instructions (short / long) | instructions per operation | vs plain | connections per operation |\n|---|---|---|---|---|---|---|\n"
    );
    let plain = |w: Workload| {
        counts
            .iter()
            .find(|c| c.mode == Mode::Plain && c.workload == w)
            .map(Count::per_op)
    };
    for c in counts {
        let vs = plain(c.workload)
            .map(|p| format!("{:+.0}", c.per_op() - p))
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {} / {} | {} / {} | {:.0} | {} | {} |",
            c.mode.label(),
            c.workload.label(),
            c.ops.0,
            c.ops.1,
            c.totals.0,
            c.totals.1,
            c.per_op(),
            vs,
            c.connections_per_op
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "–".into()),
        );
    }
    let json = serde_json::json!({
        "scenario": "security",
        "build": profile,
        "counts": counts.iter().map(|c| serde_json::json!({
            "mode": c.mode.label(),
            "workload": c.workload.label(),
            "operations": [c.ops.0, c.ops.1],
            "totals": [c.totals.0, c.totals.1],
            "per_operation": c.per_op(),
            "added_over_plain": plain(c.workload).map(|p| c.per_op() - p),
            "connections_per_operation": c.connections_per_op,
        })).collect::<Vec<_>>(),
    });
    Report {
        name: "security",
        json,
        markdown: md,
        charts: Vec::new(),
    }
}
