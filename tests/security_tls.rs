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
    let mut users = UsersFile::new();
    users
        .insert(UserDocument::new_external(
            &p.client_subject,
            vec![RoleName::new("readWrite", "test")],
        ))
        .unwrap();
    let users_path = p.dir.join("users.json");
    std::fs::write(&users_path, users.to_text()).unwrap();
    let mut config = tls_config(&p, TlsMode::Require);
    config.security.users_file = Some(users_path.display().to_string());
    config.security.authorization = Authorization::Enabled;
    let c = Running::start(&p, config).await;
    let port = c.addr().port();
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
    c.stop().await;
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

/// Embedded shards started with `shard_tls` and the keyfile, and a router with `router`.
async fn protected_cluster(
    key_file: Option<&str>,
    shard_tls: sluice::config::TlsConfig,
    router: Config,
) -> Result<
    (
        sluice::frontend::RouterHandle,
        Vec<sluice::embedded::EmbeddedShard>,
    ),
    String,
> {
    let options = sluice::embedded::ShardOptions {
        key_file: key_file.map(str::to_string),
        tls: shard_tls,
        ..sluice::embedded::ShardOptions::for_tests()
    };
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
