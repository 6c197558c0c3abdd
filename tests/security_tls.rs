//! TLS on the listener with the stock Rust driver (`tls=true`), certificates made by the test
//! with `rcgen`: each `tls.mode`, MONGODB-X509 authentication from the client certificate's
//! subject, a TLS client on a plain port and a plain client on a TLS-only port; and Sluice
//! towards its shards: a keyfile-protected embedded cluster joined as `__system` (refused with
//! a wrong key), and TLS to shards that require it.

use std::path::{Path, PathBuf};

use bson::{doc, Bson};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair,
    KeyUsagePurpose,
};
use sluice::auth::credentials::{UserDocument, UsersFile};
use sluice::auth::roles::RoleName;
use sluice::auth::tls::TlsMode;
use sluice::config::{Authorization, Config};

struct Pki {
    dir: PathBuf,
    /// The client certificate's subject as mongod names it.
    client_subject: String,
}

fn leaf(
    ca: &Certificate,
    ca_key: &KeyPair,
    sans: &[&str],
    dn: &[(DnType, &str)],
) -> (String, Vec<u8>) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let mut name = DistinguishedName::new();
    for (ty, value) in dn {
        name.push(ty.clone(), *value);
    }
    params.distinguished_name = name;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca, ca_key).unwrap();
    (
        format!("{}{}", cert.pem(), key.serialize_pem()),
        cert.der().to_vec(),
    )
}

/// A CA, a server certificate for localhost and a client certificate, written as PEM files.
fn pki(name: &str) -> Pki {
    let dir = std::env::temp_dir().join(format!("sluice-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Sluice Test CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    let ca = params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let (server, _) = leaf(
        &ca,
        &ca_key,
        &["localhost", "127.0.0.1"],
        &[(DnType::CommonName, "localhost")],
    );
    std::fs::write(dir.join("server.pem"), server).unwrap();
    let (client, der) = leaf(
        &ca,
        &ca_key,
        &[],
        &[
            (DnType::CommonName, "app"),
            (DnType::OrganizationalUnitName, "Clients"),
            (DnType::OrganizationName, "Sluice"),
        ],
    );
    std::fs::write(dir.join("client.pem"), client).unwrap();
    // A cluster member's certificate (server and client alike): the O and OU name the cluster.
    let (member, _) = leaf(
        &ca,
        &ca_key,
        &["localhost", "127.0.0.1"],
        &[
            (DnType::CommonName, "localhost"),
            (DnType::OrganizationalUnitName, "Cluster"),
            (DnType::OrganizationName, "Sluice"),
        ],
    );
    std::fs::write(dir.join("member.pem"), member).unwrap();
    let client_subject = sluice::auth::x509::X509Name::from_certificate(&der)
        .unwrap()
        .to_string();
    Pki {
        dir,
        client_subject,
    }
}

fn tls_config(p: &Pki, mode: TlsMode) -> Config {
    let mut config = Config::default();
    config.tls.mode = mode;
    config.tls.certificate_key_file = Some(p.dir.join("server.pem").display().to_string());
    config.tls.ca_file = Some(p.dir.join("ca.pem").display().to_string());
    config.tls.allow_connections_without_certificates = true;
    config
}

/// A router with `config` over two embedded shards that speak TLS when the router does
/// towards them (`prefer`, `require`), as a mongod cluster with one TLS mode would.
struct Running {
    handle: sluice::frontend::RouterHandle,
    shards: Vec<sluice::embedded::EmbeddedShard>,
}

impl Running {
    async fn start(p: &Pki, config: Config) -> Running {
        let shard_tls = if config.tls.mode.outgoing_tls() {
            tls_config(p, TlsMode::Require).tls
        } else {
            Default::default()
        };
        let (handle, shards) = protected_cluster(None, shard_tls, config).await.unwrap();
        Running { handle, shards }
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.handle.local_addr()
    }

    async fn stop(self) {
        self.handle.shutdown().await;
        for s in self.shards {
            s.shutdown().await;
        }
    }
}

fn tls_uri(port: u16, dir: &Path, extra: &str) -> String {
    format!(
        "mongodb://localhost:{port}/?tls=true&tlsCAFile={}&serverSelectionTimeoutMS=3000{extra}",
        dir.join("ca.pem").display()
    )
}

async fn ping(uri: &str) -> Result<bson::Document, mongodb::error::Error> {
    let client = mongodb::Client::with_uri_str(uri).await?;
    client.database("admin").run_command(doc! {"ping": 1}).await
}

#[tokio::test]
async fn require_mode_serves_tls_clients_and_closes_plain_ones() {
    let p = pki("require");
    let c = Running::start(&p, tls_config(&p, TlsMode::Require)).await;
    let port = c.addr().port();
    ping(&tls_uri(port, &p.dir, "")).await.unwrap();
    // With a client certificate too.
    let with_cert = format!(
        "&tlsCertificateKeyFile={}",
        p.dir.join("client.pem").display()
    );
    let client = mongodb::Client::with_uri_str(tls_uri(port, &p.dir, &with_cert))
        .await
        .unwrap();
    let coll = client.database("test").collection::<bson::Document>("t");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    // A plain client on a TLS-only port is closed without a reply.
    let plain = format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=1000");
    assert!(ping(&plain).await.is_err());
    // A client that stops in the middle of its TLS handshake, or sends garbage, is closed
    // and everyone else goes on.
    {
        use tokio::io::AsyncWriteExt;
        let mut half = tokio::net::TcpStream::connect(c.addr()).await.unwrap();
        half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
            .await
            .unwrap();
        drop(half);
        let mut garbage = tokio::net::TcpStream::connect(c.addr()).await.unwrap();
        garbage
            .write_all(&[
                0x16, 0x03, 0x01, 0x00, 0x10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
            ])
            .await
            .unwrap();
        drop(garbage);
    }
    ping(&tls_uri(port, &p.dir, "")).await.unwrap();
    // A client that does not trust the server's CA is refused.
    let untrusted = pki("untrusted");
    assert!(ping(&tls_uri(port, &untrusted.dir, "")).await.is_err());
    ping(&tls_uri(port, &p.dir, "")).await.unwrap();
    c.stop().await;
}

#[tokio::test]
async fn allow_and_prefer_serve_both_and_disabled_closes_tls_clients() {
    let p = pki("modes");
    for mode in [TlsMode::Allow, TlsMode::Prefer] {
        let c = Running::start(&p, tls_config(&p, mode)).await;
        let port = c.addr().port();
        ping(&tls_uri(port, &p.dir, "")).await.unwrap();
        ping(&format!(
            "mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=3000"
        ))
        .await
        .unwrap();
        c.stop().await;
    }
    let c = Running::start(&p, Config::default()).await;
    let port = c.addr().port();
    let quick = "&serverSelectionTimeoutMS=1000";
    assert!(ping(&tls_uri(port, &p.dir, quick)).await.is_err());
    ping(&format!("mongodb://127.0.0.1:{port}/")).await.unwrap();
    c.stop().await;
}

#[tokio::test]
async fn x509_authenticates_the_client_certificate_subject() {
    let p = pki("x509");
    let c = Running::start(&p, x509_router(&p)).await;
    x509_authenticates_on(&p, c.addr().port()).await;
    c.stop().await;
}

/// A router requiring TLS and authorization, its users file holding the client
/// certificate's subject as a `$external` user with `readWrite` on `test`.
fn x509_router(p: &Pki) -> Config {
    let mut users = UsersFile::new();
    users
        .insert(UserDocument::new_external(
            &p.client_subject,
            vec![RoleName::new("readWrite", "test")],
        ))
        .unwrap();
    let users_path = p.dir.join("users.json");
    std::fs::write(&users_path, users.to_text()).unwrap();
    let mut config = tls_config(p, TlsMode::Require);
    config.security.users_file = Some(users_path.display().to_string());
    config.security.authorization = Authorization::Enabled;
    config
}

/// The client certificate authenticates its subject on the router at `port` and writes with
/// its role; a client without a certificate has no subject to authenticate.
async fn x509_authenticates_on(p: &Pki, port: u16) {
    let cert = format!(
        "&tlsCertificateKeyFile={}&authMechanism=MONGODB-X509",
        p.dir.join("client.pem").display()
    );
    let client = mongodb::Client::with_uri_str(tls_uri(port, &p.dir, &cert))
        .await
        .unwrap();
    let status = client
        .database("admin")
        .run_command(doc! {"connectionStatus": 1})
        .await
        .unwrap();
    assert_eq!(
        status
            .get_document("authInfo")
            .unwrap()
            .get_array("authenticatedUsers")
            .unwrap(),
        &vec![Bson::Document(
            doc! {"user": &p.client_subject, "db": "$external"}
        )]
    );
    let coll = client.database("test").collection::<bson::Document>("t");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    // Without a certificate there is no subject to authenticate.
    let no_cert = mongodb::Client::with_uri_str(tls_uri(
        port,
        &p.dir,
        "&authMechanism=MONGODB-X509&authSource=$external",
    ))
    .await
    .unwrap();
    assert!(no_cert
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .is_err());
}

fn keyfile(dir: &Path, name: &str, key: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{key}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path.display().to_string()
}

type Protected = (
    sluice::frontend::RouterHandle,
    Vec<sluice::embedded::EmbeddedShard>,
);

/// Embedded shards started with `shard_tls` and the keyfile, and a router with `router`.
async fn protected_cluster(
    key_file: Option<&str>,
    shard_tls: sluice::config::TlsConfig,
    router: Config,
) -> Result<Protected, String> {
    let options = sluice::embedded::ShardOptions {
        key_file: key_file.map(str::to_string),
        tls: shard_tls,
        ..sluice::embedded::ShardOptions::for_tests()
    };
    protected_cluster_with(options, router).await
}

/// Two embedded shards started with `options`, and a router with `router`.
async fn protected_cluster_with(
    options: sluice::embedded::ShardOptions,
    router: Config,
) -> Result<Protected, String> {
    let shards = sluice::embedded::EmbeddedShard::start_many(2, options)
        .await
        .map_err(|e| e.to_string())?;
    let infos: Vec<sluice::routing::ShardInfo> = shards
        .iter()
        .map(|s| sluice::routing::ShardInfo {
            id: s.service().name().to_string(),
            addr: format!("localhost:{}", s.local_addr().port()),
            shard_server: true,
        })
        .collect();
    let pool = router.pool_options().map_err(|e| e.to_string())?;
    let cluster = sluice::router::bootstrap(None, &infos, &[], pool, &router.batching).await?;
    let config = Config {
        listen: "127.0.0.1:0".into(),
        ..router
    };
    let handle = sluice::router::start_router(config, vec!["sluice".into()], Some(cluster))
        .await
        .map_err(|e| e.to_string())?;
    Ok((handle, shards))
}

#[tokio::test]
async fn the_router_joins_a_keyfile_cluster_and_is_refused_with_a_wrong_key() {
    let p = pki("keyfile");
    let key = keyfile(&p.dir, "key", "c2x1aWNlLWNsdXN0ZXIta2V5");
    let wrong = keyfile(&p.dir, "wrong", "bm90LXRoZS1jbHVzdGVyLWtleQ");
    let mut router = Config::default();
    router.security.key_file = Some(key.clone());
    let (handle, shards) = protected_cluster(Some(&key), Default::default(), router)
        .await
        .unwrap();
    // The shard itself refuses an unauthenticated client, as mongod with a keyfile does.
    let direct = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=3000",
        shards[0].local_addr()
    ))
    .await
    .unwrap();
    let e = direct
        .database("test")
        .collection::<bson::Document>("t")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("Command insert requires authentication"),
        "{e}"
    );
    // Through the router, which authenticates as __system.
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=3000",
        handle.local_addr()
    ))
    .await
    .unwrap();
    let coll = client.database("test").collection::<bson::Document>("t");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    handle.shutdown().await;
    for s in shards {
        s.shutdown().await;
    }

    let mut router = Config::default();
    router.security.key_file = Some(wrong);
    let (handle, shards) = protected_cluster(Some(&key), Default::default(), router)
        .await
        .unwrap();
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=3000",
        handle.local_addr()
    ))
    .await
    .unwrap();
    let e = client
        .database("test")
        .collection::<bson::Document>("t")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("authentication as __system failed")
            && text.contains("Authentication failed."),
        "{text}"
    );
    handle.shutdown().await;
    for s in shards {
        s.shutdown().await;
    }
}

#[tokio::test]
async fn the_router_speaks_tls_to_shards_that_require_it() {
    let p = pki("toshards");
    let key = keyfile(&p.dir, "key", "c2x1aWNlLWNsdXN0ZXIta2V5");
    let shard_tls = tls_config(&p, TlsMode::Require).tls;
    let mut router = tls_config(&p, TlsMode::Require);
    router.security.key_file = Some(key.clone());
    let (handle, shards) = protected_cluster(Some(&key), shard_tls.clone(), router)
        .await
        .unwrap();
    let client = mongodb::Client::with_uri_str(tls_uri(handle.local_addr().port(), &p.dir, ""))
        .await
        .unwrap();
    let coll = client.database("test").collection::<bson::Document>("t");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    handle.shutdown().await;
    for s in shards {
        s.shutdown().await;
    }
    // A router without TLS towards the shards cannot reach them.
    let mut plain = Config::default();
    plain.security.key_file = Some(key.clone());
    let (handle, shards) = protected_cluster(Some(&key), shard_tls, plain)
        .await
        .unwrap();
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=3000",
        handle.local_addr()
    ))
    .await
    .unwrap();
    assert!(client
        .database("test")
        .collection::<bson::Document>("t")
        .insert_one(doc! {"_id": 1})
        .await
        .is_err());
    handle.shutdown().await;
    for s in shards {
        s.shutdown().await;
    }
}

/// A free loopback port (bound, then released for the process under test).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `sluice_authentications_total` counters of a Prometheus scrape, by (mechanism, outcome).
async fn auth_counters(metrics: u16) -> std::collections::HashMap<(String, String), u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", metrics))
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let label = |line: &str, name: &str| -> String {
        let from = line.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        line[from..].split('"').next().unwrap().to_string()
    };
    text.lines()
        .filter(|l| l.starts_with("sluice_authentications_total{"))
        .map(|l| {
            let value = l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64;
            ((label(l, "mechanism"), label(l, "outcome")), value)
        })
        .collect()
}

/// One SCRAM conversation by hand on a plain connection; returns the client-final message
/// (which holds the proof) and whether the server accepted it.
async fn scram_by_hand(
    addr: std::net::SocketAddr,
    mechanism: sluice::auth::scram::ScramMechanism,
    user: &str,
    pw: &str,
) -> (Vec<u8>, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request_id: i32 = 0;
    let mut command = |body: bson::Document| {
        request_id += 1;
        let bytes = body.to_vec().unwrap();
        let mut frame = Vec::new();
        frame.extend_from_slice(&((16 + 4 + 1 + bytes.len()) as i32).to_le_bytes());
        frame.extend_from_slice(&request_id.to_le_bytes());
        frame.extend_from_slice(&0i32.to_le_bytes());
        frame.extend_from_slice(&2013i32.to_le_bytes());
        frame.extend_from_slice(&0u32.to_le_bytes());
        frame.push(0);
        frame.extend_from_slice(&bytes);
        frame
    };
    async fn exchange(s: &mut tokio::net::TcpStream, frame: Vec<u8>) -> bson::Document {
        s.write_all(&frame).await.unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.unwrap();
        let mut rest = vec![0u8; i32::from_le_bytes(len) as usize - 4];
        s.read_exact(&mut rest).await.unwrap();
        bson::Document::from_reader(&rest[17..]).unwrap()
    }
    let bin = |bytes: Vec<u8>| bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes,
    };
    let mut conv =
        sluice::auth::scram::ClientConversation::new(mechanism, user, pw, "logcheckclientnonce1")
            .unwrap();
    let first = exchange(
        &mut s,
        command(doc! {"saslStart": 1, "mechanism": mechanism.name(),
        "payload": bin(conv.client_first()), "options": {"skipEmptyExchange": true},
        "$db": "admin"}),
    )
    .await;
    let fin = conv
        .client_final(first.get_binary_generic("payload").unwrap())
        .unwrap();
    let done = exchange(
        &mut s,
        command(
            doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(fin.clone()),
            "$db": "admin"},
        ),
    )
    .await;
    (fin, done.get_f64("ok").unwrap() == 1.0)
}

/// `sluice demo` as a process, with a keyfile, TLS (`allow`) and users: SCRAM (both
/// mechanisms) and X.509 logins that fail and succeed are counted by mechanism and outcome at
/// the metrics endpoint, and the process's log, at debug level, never holds a password, a
/// SCRAM proof or payload, or the keyfile's content.
#[tokio::test]
async fn authentications_are_counted_and_no_secret_reaches_the_log() {
    use base64::Engine as _;
    use sluice::auth::scram::ScramMechanism;
    let p = pki("logs");
    const PASSWORD: &str = "Alice-Pa55word-7f3c";
    const WRONG: &str = "Wrong-Pa55word-91d2";
    const NEW_USER_PASSWORD: &str = "NewUser-Pa55word-c0de";
    const KEY: &str = "a2V5ZmlsZS1jb250ZW50LW5ldmVyLWxvZ2dlZA";
    let mut users = UsersFile::new();
    users
        .insert(
            UserDocument::new_scram(
                sluice::auth::UserName::new("alice", "admin"),
                PASSWORD,
                &ScramMechanism::ALL,
                vec![RoleName::new("root", "admin")],
            )
            .unwrap(),
        )
        .unwrap();
    users
        .insert(UserDocument::new_external(
            &p.client_subject,
            vec![RoleName::new("readWrite", "test")],
        ))
        .unwrap();
    let users_path = p.dir.join("users.json");
    std::fs::write(&users_path, users.to_text()).unwrap();
    let key = keyfile(&p.dir, "key", KEY);
    let config_path = p.dir.join("sluice.toml");
    std::fs::write(
        &config_path,
        format!(
            "[security]\nauthorization = \"enabled\"\nusers_file = {:?}\nkey_file = {:?}\n\
             [tls]\nmode = \"allow\"\ncertificate_key_file = {:?}\nca_file = {:?}\n\
             allow_connections_without_certificates = true\n",
            users_path.display().to_string(),
            key,
            p.dir.join("server.pem").display().to_string(),
            p.dir.join("ca.pem").display().to_string(),
        ),
    )
    .unwrap();
    let (port, metrics) = (free_port(), free_port());
    let log_path = p.dir.join("sluice.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(&config_path)
        .args(["--log-level", "debug"])
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{metrics}"))
        .args(["demo", "--shards", "1", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut ready = false;
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", metrics))
            .await
            .is_ok()
            && tokio::net::TcpStream::connect(addr).await.is_ok()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(ready, "sluice demo did not start");
    let before = auth_counters(metrics).await;

    // SCRAM by hand: a wrong password (SHA-256) and a right one (SHA-1).
    let (wrong_final, accepted) = scram_by_hand(addr, ScramMechanism::Sha256, "alice", WRONG).await;
    assert!(!accepted);
    let (right_final, accepted) =
        scram_by_hand(addr, ScramMechanism::Sha1, "alice", PASSWORD).await;
    assert!(accepted);
    // The stock driver: SCRAM-SHA-256 with the right password, SCRAM-SHA-1 with a wrong one.
    let uri = |cred: &str, mech: &str| {
        format!("mongodb://{cred}@{addr}/?authSource=admin&authMechanism={mech}&serverSelectionTimeoutMS=5000")
    };
    let alice = mongodb::Client::with_uri_str(uri(&format!("alice:{PASSWORD}"), "SCRAM-SHA-256"))
        .await
        .unwrap();
    alice
        .database("test")
        .collection::<bson::Document>("t")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap();
    let wrong = mongodb::Client::with_uri_str(uri(&format!("alice:{WRONG}"), "SCRAM-SHA-1"))
        .await
        .unwrap();
    assert!(wrong
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .is_err());
    // X.509: the client certificate's subject, and a TLS client without a certificate.
    let cert = format!(
        "&tlsCertificateKeyFile={}&authMechanism=MONGODB-X509",
        p.dir.join("client.pem").display()
    );
    let x509 = mongodb::Client::with_uri_str(tls_uri(port, &p.dir, &cert))
        .await
        .unwrap();
    let x509_db = x509.database("test");
    x509_db
        .collection::<bson::Document>("t")
        .insert_one(doc! {"_id": 2})
        .await
        .unwrap();
    // An unauthorized createUser is logged with its password replaced.
    let e = x509_db
        .run_command(doc! {"createUser": "eve", "pwd": NEW_USER_PASSWORD, "roles": []})
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not authorized"), "{e}");
    let no_cert = mongodb::Client::with_uri_str(tls_uri(
        port,
        &p.dir,
        "&authMechanism=MONGODB-X509&authSource=$external",
    ))
    .await
    .unwrap();
    assert!(no_cert
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .is_err());

    let after = auth_counters(metrics).await;
    let delta = |mech: &str, outcome: &str| {
        let k = (mech.to_string(), outcome.to_string());
        after.get(&k).copied().unwrap_or(0) - before.get(&k).copied().unwrap_or(0)
    };
    assert_eq!(delta("SCRAM-SHA-256", "failure"), 1, "{after:?}");
    assert_eq!(delta("SCRAM-SHA-1", "success"), 1, "{after:?}");
    assert_eq!(delta("SCRAM-SHA-1", "failure"), 1, "{after:?}");
    assert_eq!(delta("MONGODB-X509", "success"), 1, "{after:?}");
    assert_eq!(delta("MONGODB-X509", "failure"), 1, "{after:?}");
    // The driver's SCRAM-SHA-256 login, and the router's own __system logins to its shard.
    assert!(delta("SCRAM-SHA-256", "success") >= 1, "{after:?}");

    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(&log_path).unwrap();
    // The events are there, so the log really is the one the logins went to.
    assert!(log.contains("authentication failed"), "{log}");
    assert!(log.contains("authentication succeeded"), "{log}");
    assert!(log.contains("unauthorized"), "{log}");
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let proof = |fin: &[u8]| {
        let text = String::from_utf8(fin.to_vec()).unwrap();
        text.rsplit(",p=").next().unwrap().to_string()
    };
    let secrets = [
        ("the password", PASSWORD.to_string()),
        ("the wrong password", WRONG.to_string()),
        ("createUser's password", NEW_USER_PASSWORD.to_string()),
        ("the keyfile", KEY.to_string()),
        ("a failed login's proof", proof(&wrong_final)),
        ("a successful login's proof", proof(&right_final)),
        ("a failed login's payload", b64(&wrong_final)),
        ("a successful login's payload", b64(&right_final)),
    ];
    for (what, secret) in secrets {
        assert!(secret.len() >= 16, "{what}");
        assert!(!log.contains(&secret), "{what} is in the log");
    }
}

/// `clusterAuthMode: x509`: shards that take only certificates naming a cluster member (the
/// O and OU of their own) for `__system`. The router presenting a member's certificate joins
/// them; one presenting another certificate, or proving the keyfile instead, is refused; the
/// shards refuse clients that are not members.
#[tokio::test]
async fn the_router_joins_an_x509_cluster_with_a_members_certificate() {
    use sluice::config::ClusterAuthMode;
    let p = pki("x509cluster");
    let member = p.dir.join("member.pem").display().to_string();
    let mut shard_tls = tls_config(&p, TlsMode::Require).tls;
    shard_tls.certificate_key_file = Some(member.clone());
    let shards = sluice::embedded::ShardOptions {
        cluster_auth_mode: ClusterAuthMode::X509,
        tls: shard_tls,
        ..sluice::embedded::ShardOptions::for_tests()
    };
    let router_with = |cert: &str, mode: ClusterAuthMode| {
        let mut router = tls_config(&p, TlsMode::Require);
        router.tls.certificate_key_file = Some(cert.to_string());
        router.security.cluster_auth_mode = mode;
        router
    };
    let (handle, members) =
        protected_cluster_with(shards.clone(), router_with(&member, ClusterAuthMode::X509))
            .await
            .unwrap();
    let client = mongodb::Client::with_uri_str(tls_uri(handle.local_addr().port(), &p.dir, ""))
        .await
        .unwrap();
    let coll = client.database("test").collection::<bson::Document>("t");
    coll.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    // The shard refuses a client without a certificate, and a certificate that names no member.
    let port = members[0].local_addr().port();
    let direct = mongodb::Client::with_uri_str(tls_uri(port, &p.dir, "&directConnection=true"))
        .await
        .unwrap();
    let e = direct
        .database("test")
        .collection::<bson::Document>("t")
        .insert_one(doc! {"_id": 2})
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("Command insert requires authentication"),
        "{e}"
    );
    let outsider = format!(
        "&directConnection=true&tlsCertificateKeyFile={}&authMechanism=MONGODB-X509",
        p.dir.join("client.pem").display()
    );
    assert!(ping(&tls_uri(port, &p.dir, &outsider)).await.is_err());
    handle.shutdown().await;
    for s in members {
        s.shutdown().await;
    }

    // A router whose certificate (valid, for localhost) names no member.
    let outsider_cert = p.dir.join("server.pem").display().to_string();
    let (handle, members) = protected_cluster_with(
        shards.clone(),
        router_with(&outsider_cert, ClusterAuthMode::X509),
    )
    .await
    .unwrap();
    let client = mongodb::Client::with_uri_str(tls_uri(handle.local_addr().port(), &p.dir, ""))
        .await
        .unwrap();
    let e = client
        .database("test")
        .collection::<bson::Document>("t")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("authentication with MONGODB-X509 failed"),
        "{text}"
    );
    handle.shutdown().await;
    for s in members {
        s.shutdown().await;
    }

    // A router proving the keyfile to shards that take certificates only.
    let key = keyfile(&p.dir, "key", "c2x1aWNlLWNsdXN0ZXIta2V5");
    let mut keyed = router_with(&member, ClusterAuthMode::KeyFile);
    keyed.security.key_file = Some(key);
    let (handle, members) = protected_cluster_with(shards, keyed).await.unwrap();
    let client = mongodb::Client::with_uri_str(tls_uri(handle.local_addr().port(), &p.dir, ""))
        .await
        .unwrap();
    let e = client
        .database("test")
        .collection::<bson::Document>("t")
        .insert_one(doc! {"_id": 1})
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("authentication as __system failed"),
        "{e}"
    );
    handle.shutdown().await;
    for s in members {
        s.shutdown().await;
    }

    // x509 towards shards needs TLS towards them and a certificate.
    let mut plain = Config::default();
    plain.security.cluster_auth_mode = ClusterAuthMode::X509;
    assert!(plain.pool_options().is_err());
}

/// `tls.cluster_file` (mongod's `net.tls.clusterFile`): the router shows clients its server
/// certificate and presents the cluster certificate on its connections to shards, which take
/// only certificates naming a cluster member (`clusterAuthMode: x509`).
#[tokio::test]
async fn the_router_presents_its_cluster_certificate_to_shards_and_its_own_to_clients() {
    use sluice::config::ClusterAuthMode;
    let p = pki("clusterfile");
    let member = p.dir.join("member.pem").display().to_string();
    let mut shard_tls = tls_config(&p, TlsMode::Require).tls;
    shard_tls.certificate_key_file = Some(member.clone());
    let shards = sluice::embedded::ShardOptions {
        cluster_auth_mode: ClusterAuthMode::X509,
        tls: shard_tls,
        ..sluice::embedded::ShardOptions::for_tests()
    };
    // Clients see server.pem (CN=localhost, no O or OU: not a member's certificate).
    let mut router = tls_config(&p, TlsMode::Require);
    router.security.cluster_auth_mode = ClusterAuthMode::X509;
    router.tls.cluster_file = Some(member);
    let (handle, members) = protected_cluster_with(shards, router).await.unwrap();
    let client = mongodb::Client::with_uri_str(tls_uri(handle.local_addr().port(), &p.dir, ""))
        .await
        .unwrap();
    let coll = client.database("test").collection::<bson::Document>("t");
    coll.insert_one(doc! {"_id": 1})
        .await
        .expect("the shards accept the cluster certificate");
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);

    // The certificate a client is shown is the server's, not the cluster's.
    let ca = std::fs::read(p.dir.join("ca.pem")).unwrap();
    let tls = sluice::auth::tls::client_config(&sluice::auth::tls::ClientTlsSettings {
        ca_pem: Some(&ca),
        certificate_key_pem: None,
        allow_invalid_certificates: false,
        allow_invalid_hostnames: false,
    })
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(handle.local_addr())
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .expect("TLS handshake with the router");
    let shown = stream.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let subject = sluice::auth::x509::X509Name::from_certificate(&shown)
        .unwrap()
        .to_string();
    assert_eq!(subject, "CN=localhost");
    drop(stream);
    handle.shutdown().await;
    for s in members {
        s.shutdown().await;
    }
}

/// A `--configdb` router towards a config server started with a keyfile and TLS required (the
/// embedded one): it connects over TLS and authenticates as `__system` with the keyfile, so
/// its user commands run there and it reads the users back; with another key it is refused.
#[tokio::test]
async fn a_configdb_router_reaches_a_config_server_that_requires_tls_and_the_keyfile() {
    let p = pki("configsvr");
    let key = keyfile(&p.dir, "key", "c2x1aWNlLWNsdXN0ZXIta2V5");
    let config_server = sluice::embedded::EmbeddedShard::start(
        "127.0.0.1:0",
        sluice::embedded::ShardOptions {
            set_name: "configRS".into(),
            config_server: true,
            key_file: Some(key.clone()),
            tls: tls_config(&p, TlsMode::Require).tls,
            ..sluice::embedded::ShardOptions::for_tests()
        },
    )
    .await
    .unwrap();
    let configdb = format!("configRS/localhost:{}", config_server.local_addr().port());
    let router_with = |key: String| {
        let mut router = tls_config(&p, TlsMode::Require);
        router.listen = "127.0.0.1:0".into();
        router.security.key_file = Some(key);
        router.security.authorization = Authorization::Enabled;
        router
    };
    let start = |config: Config| {
        let configdb = configdb.clone();
        async move {
            let pool = config.pool_options().unwrap();
            let sharded = sluice::router::configdb::bootstrap_configdb_with(
                &configdb,
                pool,
                &config.batching,
                std::time::Duration::from_millis(500),
            )
            .await
            .unwrap();
            sluice::router::start_router(config, vec!["sluice".into()], Some(sharded))
                .await
                .unwrap()
        }
    };
    let handle = start(router_with(key.clone())).await;
    let port = handle.local_addr().port();
    let anonymous = mongodb::Client::with_uri_str(tls_uri(port, &p.dir, ""))
        .await
        .unwrap();
    anonymous
        .database("admin")
        .run_command(doc! {"createUser": "root", "pwd": "rootpw", "roles": ["root"]})
        .await
        .expect("createUser runs on the config server as __system over TLS");
    let root = mongodb::Client::with_uri_str(format!(
        "mongodb://root:rootpw@localhost:{port}/?tls=true&tlsCAFile={}&authSource=admin&serverSelectionTimeoutMS=3000",
        p.dir.join("ca.pem").display()
    ))
    .await
    .unwrap();
    let info = root
        .database("admin")
        .run_command(doc! {"usersInfo": "root"})
        .await
        .expect("the router authenticates the user it read back");
    assert_eq!(info.get_array("users").unwrap().len(), 1);
    handle.shutdown().await;

    // Another key: the config server refuses the router.
    let wrong = keyfile(&p.dir, "wrong", "YW5vdGhlci1rZXktYWx0b2dldGhlcg");
    let handle = start(router_with(wrong)).await;
    let anonymous = mongodb::Client::with_uri_str(tls_uri(handle.local_addr().port(), &p.dir, ""))
        .await
        .unwrap();
    let e = anonymous
        .database("admin")
        .run_command(doc! {"createUser": "other", "pwd": "otherpw", "roles": ["root"]})
        .await
        .unwrap_err();
    // The router's own read of the users may meet the refusal first: then the driver clears its
    // pool and this command fails on the cleared pool, naming the same authentication failure.
    let text = e.to_string();
    assert!(
        text.contains("authentication to the config server")
            || (text.contains("config server") && text.contains("Authentication failed")),
        "{e}"
    );
    handle.shutdown().await;
    config_server.shutdown().await;
}

/// The cluster layout secured end to end: a config server and two shard servers that require
/// TLS and the keyfile, and a `--configdb` router with both. Every internal connection
/// authenticates as `__system` over TLS — the router to the config server and the shards, the
/// shard servers to the config server (their routing metadata) and to each other (a chunk
/// migration), the config server to the shards (adding them, dropping a database) — and the
/// application's user, created through the router, reads and writes a sharded collection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_layout_runs_with_the_keyfile_and_tls_between_all_its_servers() {
    let p = pki("cluster-layout");
    let key = keyfile(&p.dir, "key", "c2x1aWNlLWNsdXN0ZXItbGF5b3V0LWtleQ");
    let mut router = tls_config(&p, TlsMode::Require);
    router.listen = "127.0.0.1:0".into();
    router.security.key_file = Some(key.clone());
    router.security.authorization = Authorization::Enabled;
    let shard = sluice::embedded::ShardOptions {
        key_file: Some(key.clone()),
        tls: tls_config(&p, TlsMode::Require).tls,
        internal_security: router.pool_options().unwrap().security,
        ..sluice::embedded::ShardOptions::for_tests()
    };
    let cluster =
        sluice::demo::DemoCluster::start(2, shard, vec![router], vec!["sluice".into()], &[])
            .await
            .expect("the secured cluster starts: the shards are added as __system over TLS");
    let port = cluster.routers[0].0.local_addr().port();
    let anonymous = mongodb::Client::with_uri_str(tls_uri(port, &p.dir, ""))
        .await
        .unwrap();
    anonymous
        .database("admin")
        .run_command(doc! {"createUser": "root", "pwd": "rootpw", "roles": ["root"]})
        .await
        .expect("the first user, through the localhost exception");
    let root = mongodb::Client::with_uri_str(format!(
        "mongodb://root:rootpw@localhost:{port}/?tls=true&tlsCAFile={}&authSource=admin&serverSelectionTimeoutMS=5000",
        p.dir.join("ca.pem").display()
    ))
    .await
    .unwrap();
    root.database("admin")
        .run_command(doc! {"shardCollection": "app.c", "key": {"_id": 1}})
        .await
        .expect("shardCollection: the config server and the shard servers agree over TLS");
    let c = root.database("app").collection::<bson::Document>("c");
    c.insert_many((0..100).map(|i| doc! {"_id": i}))
        .await
        .unwrap();
    root.database("admin")
        .run_command(doc! {"split": "app.c", "middle": {"_id": 50}})
        .await
        .unwrap();
    assert_eq!(cluster.shard_hosts().len(), 2);
    let list = root
        .database("admin")
        .run_command(doc! {"listShards": 1})
        .await
        .unwrap();
    let ids: Vec<String> = list
        .get_array("shards")
        .unwrap()
        .iter()
        .map(|s| s.as_document().unwrap().get_str("_id").unwrap().to_string())
        .collect();
    // Move the upper half to whichever shard does not hold it: the donor shard server reaches
    // the recipient and the config server as __system over TLS.
    let mut moved = false;
    for to in &ids {
        let r = root
            .database("admin")
            .run_command(doc! {"moveChunk": "app.c", "find": {"_id": 75}, "to": to})
            .await;
        if r.is_ok() {
            moved = true;
        }
    }
    assert!(moved, "a chunk moved between the secured shard servers");
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 100);
    let on: Vec<usize> = (0..2)
        .map(|i| cluster.shards[i].service().count_documents("app", "c"))
        .collect();
    assert_eq!(on.iter().sum::<usize>(), 100, "{on:?}");
    assert!(
        on.iter().all(|n| *n > 0),
        "both shards hold documents: {on:?}"
    );
    root.database("app")
        .drop()
        .await
        .expect("dropDatabase across the secured servers");
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 0);
    cluster.shutdown().await;
}

/// The cluster layout (`sluice demo --cluster`) secured: the config server and two shard
/// servers requiring `key` (and TLS when `router` requires it, with the test's certificates),
/// reaching each other as `__system`, and one `--configdb` router with `router`. A users file
/// in `router` is the config server's.
async fn secured_demo(p: &Pki, router: Config, key: &str) -> sluice::demo::DemoCluster {
    let mut router = Config {
        listen: "127.0.0.1:0".into(),
        ..router
    };
    router.security.key_file = Some(key.to_string());
    let tls = if router.tls.mode.outgoing_tls() {
        tls_config(p, TlsMode::Require).tls
    } else {
        Default::default()
    };
    let shard = sluice::embedded::ShardOptions {
        key_file: Some(key.to_string()),
        tls,
        internal_security: router.pool_options().unwrap().security,
        ..sluice::embedded::ShardOptions::for_tests()
    };
    sluice::demo::DemoCluster::start(2, shard, vec![router], vec!["sluice".into()], &[])
        .await
        .expect("the secured cluster layout starts")
}

/// The suites above that cover X.509 and the keyfile's refusal, in the secured cluster layout.
mod cluster_layout {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn x509_authenticates_the_client_certificate_subject() {
        let p = pki("x509-cluster");
        let key = keyfile(&p.dir, "key", "c2x1aWNlLXg1MDktY2x1c3Rlci1rZXk");
        let c = secured_demo(&p, x509_router(&p), &key).await;
        // The `$external` user is the config server's, where mongos keeps its users.
        let stored = c.config_server.service().documents("admin", "system.users");
        assert!(
            stored
                .iter()
                .any(|u| u.get_str("db").ok() == Some("$external")
                    && u.get_str("user").ok() == Some(p.client_subject.as_str())),
            "{stored:?}"
        );
        x509_authenticates_on(&p, c.routers[0].0.local_addr().port()).await;
        c.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_servers_refuse_clients_and_routers_without_the_key() {
        let p = pki("keyfile-cluster");
        let key = keyfile(&p.dir, "key", "c2x1aWNlLWNsdXN0ZXIta2V5");
        let wrong = keyfile(&p.dir, "wrong", "bm90LXRoZS1jbHVzdGVyLWtleQ");
        let mut c = secured_demo(&p, Config::default(), &key).await;
        // The config server and the shard servers refuse an unauthenticated client, as
        // mongod with a keyfile does.
        for (addr, db, coll) in [
            (c.config_server.local_addr(), "config", "shards"),
            (c.shards[0].local_addr(), "test", "t"),
        ] {
            let direct = mongodb::Client::with_uri_str(format!(
                "mongodb://{addr}/?directConnection=true&serverSelectionTimeoutMS=3000"
            ))
            .await
            .unwrap();
            let e = direct
                .database(db)
                .collection::<bson::Document>(coll)
                .find_one(doc! {})
                .await
                .unwrap_err();
            assert!(
                e.to_string().contains("requires authentication"),
                "{addr}: {e}"
            );
        }
        // The router with the key reaches both as __system.
        let client = mongodb::Client::with_uri_str(format!(
            "mongodb://{}/?serverSelectionTimeoutMS=3000",
            c.routers[0].0.local_addr()
        ))
        .await
        .unwrap();
        let coll = client.database("test").collection::<bson::Document>("t");
        coll.insert_one(doc! {"_id": 1}).await.unwrap();
        assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
        // A router with another key is refused by the config server.
        let mut other = Config {
            listen: "127.0.0.1:0".into(),
            ..Config::default()
        };
        other.security.key_file = Some(wrong);
        let refused = match c.start_router(other, vec!["sluice".into()]).await {
            Err(e) => e,
            Ok((handle, _)) => {
                let client = mongodb::Client::with_uri_str(format!(
                    "mongodb://{}/?serverSelectionTimeoutMS=3000",
                    handle.local_addr()
                ))
                .await
                .unwrap();
                client
                    .database("test")
                    .collection::<bson::Document>("t")
                    .insert_one(doc! {"_id": 2})
                    .await
                    .unwrap_err()
                    .to_string()
            }
        };
        assert!(refused.contains("uthentication"), "{refused}");
        assert!(!refused.contains("bm90LXRoZS1jbHVzdGVyLWtleQ"), "{refused}");
        assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
        c.shutdown().await;
    }
}
