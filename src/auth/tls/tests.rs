//! TLS tests over in-memory streams, with a CA and certificates made by `rcgen`: the listener
//! with and without client certificates, the subject of a client certificate, Sluice's client
//! configuration, and the first-bytes rule on a real ClientHello.

use super::*;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};

struct Ca {
    cert: Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn pem(&self) -> Vec<u8> {
        self.cert.pem().into_bytes()
    }

    /// A leaf certificate and key, as one PEM (mongod's certificateKeyFile form).
    fn leaf(&self, sans: &[&str], dn: &[(DnType, &str)]) -> Vec<u8> {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        let mut name = DistinguishedName::new();
        for (ty, value) in dn {
            name.push(ty.clone(), *value);
        }
        params.distinguished_name = name;
        params.is_ca = IsCa::NoCa;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        format!("{}{}", cert.pem(), key.serialize_pem()).into_bytes()
    }
}

fn server_pem(ca: &Ca) -> Vec<u8> {
    ca.leaf(
        &["localhost", "127.0.0.1"],
        &[(DnType::CommonName, "server")],
    )
}

fn client_pem(ca: &Ca) -> Vec<u8> {
    ca.leaf(
        &[],
        &[
            (DnType::CommonName, "client"),
            (DnType::OrganizationalUnitName, "Drivers"),
            (DnType::OrganizationName, "MongoDB"),
            (DnType::LocalityName, "Reykjavik"),
            (DnType::StateOrProvinceName, "Reykjavik"),
            (DnType::CountryName, "IS"),
        ],
    )
}

/// Runs one handshake over an in-memory pipe and one round of data; returns the server's view
/// of the client certificate subject, or the side that failed.
async fn handshake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    name: &str,
) -> Result<Option<String>, String> {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let name = ServerName::try_from(name.to_string()).unwrap();
    let server_side = async move {
        let mut tls = TlsAcceptor::from(server)
            .accept(server_io)
            .await
            .map_err(|e| format!("server: {e}"))?;
        let subject = peer_subject(tls.get_ref().1.peer_certificates())
            .map(|r| r.map(|n| n.to_string()).map_err(|e| e.to_string()))
            .transpose()?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf)
            .await
            .map_err(|e| format!("server read: {e}"))?;
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(subject)
    };
    let client_side = async move {
        let mut tls = TlsConnector::from(client)
            .connect(name, client_io)
            .await
            .map_err(|e| format!("client: {e}"))?;
        tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf)
            .await
            .map_err(|e| format!("client read: {e}"))?;
        Ok::<_, String>(())
    };
    let (server_result, client_result) = tokio::join!(server_side, client_side);
    // The side that refused the handshake names the cause; the other only receives its alert.
    match (server_result, client_result) {
        (Ok(subject), Ok(())) => Ok(subject),
        (Err(s), Err(c)) if s.contains("received fatal alert") => Err(c),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

fn client_settings(ca: &[u8], cert: Option<&[u8]>) -> Arc<ClientConfig> {
    client_config(&ClientTlsSettings {
        ca_pem: Some(ca),
        certificate_key_pem: cert,
        ..ClientTlsSettings::default()
    })
    .unwrap()
}

#[tokio::test]
async fn client_certificate_subject_is_the_x509_user_name() {
    let ca = Ca::new("Test CA");
    let server = server_config(&ServerTlsSettings {
        certificate_key_pem: &server_pem(&ca),
        ca_pem: Some(&ca.pem()),
        allow_connections_without_certificates: false,
    })
    .unwrap();
    let client = client_settings(&ca.pem(), Some(&client_pem(&ca)));
    let subject = handshake(server, client, "localhost").await.unwrap();
    assert_eq!(
        subject.as_deref(),
        Some("C=IS,ST=Reykjavik,L=Reykjavik,O=MongoDB,OU=Drivers,CN=client")
    );
}

#[tokio::test]
async fn a_ca_requires_client_certificates_unless_allowed_without() {
    let ca = Ca::new("Test CA");
    let required = server_config(&ServerTlsSettings {
        certificate_key_pem: &server_pem(&ca),
        ca_pem: Some(&ca.pem()),
        allow_connections_without_certificates: false,
    })
    .unwrap();
    let bare_client = client_settings(&ca.pem(), None);
    let e = handshake(required.clone(), bare_client.clone(), "localhost")
        .await
        .unwrap_err();
    assert!(e.starts_with("server:"), "{e}");

    // A certificate from another CA is refused too.
    let other = Ca::new("Other CA");
    let foreign = client_settings(&ca.pem(), Some(&client_pem(&other)));
    assert!(handshake(required, foreign, "localhost").await.is_err());

    let optional = server_config(&ServerTlsSettings {
        certificate_key_pem: &server_pem(&ca),
        ca_pem: Some(&ca.pem()),
        allow_connections_without_certificates: true,
    })
    .unwrap();
    assert_eq!(
        handshake(optional, bare_client, "localhost").await.unwrap(),
        None
    );
}

#[tokio::test]
async fn without_a_ca_no_client_certificate_is_asked() {
    let ca = Ca::new("Test CA");
    let server = server_config(&ServerTlsSettings {
        certificate_key_pem: &server_pem(&ca),
        ca_pem: None,
        allow_connections_without_certificates: false,
    })
    .unwrap();
    let client = client_settings(&ca.pem(), Some(&client_pem(&ca)));
    assert_eq!(handshake(server, client, "127.0.0.1").await.unwrap(), None);
}

#[tokio::test]
async fn shard_certificates_are_verified_unless_waived() {
    let ca = Ca::new("Test CA");
    let server = || {
        server_config(&ServerTlsSettings {
            certificate_key_pem: &server_pem(&ca),
            ca_pem: None,
            allow_connections_without_certificates: false,
        })
        .unwrap()
    };
    // Wrong CA.
    let other = Ca::new("Other CA");
    let e = handshake(server(), client_settings(&other.pem(), None), "localhost")
        .await
        .unwrap_err();
    assert!(e.starts_with("client:"), "{e}");
    // Wrong host name.
    assert!(
        handshake(server(), client_settings(&ca.pem(), None), "other.example")
            .await
            .is_err()
    );
    let lenient_names = client_config(&ClientTlsSettings {
        ca_pem: Some(&ca.pem()),
        allow_invalid_hostnames: true,
        ..ClientTlsSettings::default()
    })
    .unwrap();
    handshake(server(), lenient_names.clone(), "other.example")
        .await
        .unwrap();
    // allowInvalidHostnames does not waive the chain.
    let lenient_names_other_ca = client_config(&ClientTlsSettings {
        ca_pem: Some(&other.pem()),
        allow_invalid_hostnames: true,
        ..ClientTlsSettings::default()
    })
    .unwrap();
    assert!(handshake(server(), lenient_names_other_ca, "localhost")
        .await
        .is_err());
    let anything = client_config(&ClientTlsSettings {
        allow_invalid_certificates: true,
        ..ClientTlsSettings::default()
    })
    .unwrap();
    handshake(server(), anything, "other.example")
        .await
        .unwrap();
    let e = client_config(&ClientTlsSettings::default()).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidSSLConfiguration);
}

#[test]
fn bad_pem_files_are_configuration_errors() {
    let ca = Ca::new("Test CA");
    let e = server_config(&ServerTlsSettings {
        certificate_key_pem: &ca.pem(),
        ca_pem: None,
        allow_connections_without_certificates: false,
    })
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidSSLConfiguration);
    assert!(e.message.contains("private key"), "{}", e.message);
    let e = server_config(&ServerTlsSettings {
        certificate_key_pem: b"not a pem",
        ca_pem: None,
        allow_connections_without_certificates: false,
    })
    .unwrap_err();
    assert_eq!(e.message, "the certificate key file holds no certificate");
    let e = server_config(&ServerTlsSettings {
        certificate_key_pem: &server_pem(&ca),
        ca_pem: Some(b""),
        allow_connections_without_certificates: false,
    })
    .unwrap_err();
    assert_eq!(e.message, "the CA file holds no certificate");
}

#[test]
fn a_client_hello_is_told_from_a_mongodb_header() {
    let ca = Ca::new("Test CA");
    let config = client_settings(&ca.pem(), None);
    let mut conn =
        rustls::ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let first: [u8; PEEK_LEN] = hello[..PEEK_LEN].try_into().unwrap();
    assert_eq!(first[0], 0x16, "a TLS handshake record");
    assert_eq!(classify(&first), FirstBytes::Tls);

    // An OP_MSG header: length 0x16 on purpose (a first byte of 0x16 proves nothing),
    // requestId 7, responseTo 0, opCode 2013; and an OP_QUERY reply marker of -1.
    let mut header = [0u8; PEEK_LEN];
    header[..4].copy_from_slice(&0x16i32.to_le_bytes());
    header[4..8].copy_from_slice(&7i32.to_le_bytes());
    header[12..16].copy_from_slice(&2013i32.to_le_bytes());
    assert_eq!(classify(&header), FirstBytes::MongoDb);
    header[8..12].copy_from_slice(&(-1i32).to_le_bytes());
    assert_eq!(classify(&header), FirstBytes::MongoDb);
}

#[test]
fn modes_admit_as_mongod() {
    use FirstBytes::*;
    let e = admit(TlsMode::Disabled, Tls).unwrap_err();
    assert_eq!(e.code, ErrorCode::SSLHandshakeFailed);
    assert_eq!(
        e.message,
        "SSL handshake received but server is started without SSL support"
    );
    assert_eq!(
        admit(TlsMode::Disabled, MongoDb).unwrap(),
        Admission::Plain { note: None }
    );
    assert_eq!(admit(TlsMode::Allow, Tls).unwrap(), Admission::Tls);
    assert_eq!(
        admit(TlsMode::Allow, MongoDb).unwrap(),
        Admission::Plain { note: None }
    );
    assert!(matches!(
        admit(TlsMode::Prefer, MongoDb).unwrap(),
        Admission::Plain { note: Some(_) }
    ));
    let e = admit(TlsMode::Require, MongoDb).unwrap_err();
    assert_eq!(
        e.message,
        "The server is configured to only allow SSL connections"
    );
    assert_eq!(admit(TlsMode::Require, Tls).unwrap(), Admission::Tls);
}

#[test]
fn mode_names() {
    for (text, mode) in [
        ("disabled", TlsMode::Disabled),
        ("allow", TlsMode::Allow),
        ("allowTLS", TlsMode::Allow),
        ("preferTLS", TlsMode::Prefer),
        ("require", TlsMode::Require),
        ("requireSSL", TlsMode::Require),
    ] {
        assert_eq!(text.parse::<TlsMode>().unwrap(), mode);
    }
    assert!("required".parse::<TlsMode>().is_err());
    assert_eq!(TlsMode::Prefer.mongod_name(), "preferTLS");
    assert!(TlsMode::Prefer.outgoing_tls() && !TlsMode::Allow.outgoing_tls());
    assert!(!TlsMode::Require.accepts_plain() && TlsMode::Allow.accepts_plain());
    assert!(!TlsMode::Disabled.accepts_tls());
    #[derive(serde::Deserialize)]
    struct Net {
        tls_mode: TlsMode,
    }
    let net: Net = toml::from_str("tls_mode = \"prefer\"").unwrap();
    assert_eq!(net.tls_mode, TlsMode::Prefer);
    assert!(toml::from_str::<Net>("tls_mode = \"sometimes\"").is_err());
}
