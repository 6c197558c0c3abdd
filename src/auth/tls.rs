//! TLS on both sides: the listener's `tls_mode` and rustls server configuration, telling a TLS
//! client from a plain one on the same port, the client certificate's subject for
//! MONGODB-X509, and the rustls client configuration for Sluice's own connections to shards
//! and config servers.
//!
//! Modes are mongod's `net.tls.mode`:
//!
//! | `tls_mode` | mongod | accepts | Sluice's own connections |
//! |---|---|---|---|
//! | `disabled` | `disabled` | plain only | plain |
//! | `allow` | `allowTLS` | TLS and plain | plain |
//! | `prefer` | `preferTLS` | TLS and plain | TLS |
//! | `require` | `requireTLS` | TLS only | TLS |
//!
//! On one port mongod tells the two apart from the first 16 bytes, read as a MongoDB message
//! header: a `responseTo` other than 0 and -1 cannot start a client's request, so those bytes
//! are a TLS ClientHello ([`classify`]). A TLS client on a port without TLS, and a plain client
//! on a `require` port, are logged with mongod's message and closed without a reply
//! ([`admit`]).
//!
//! With a CA configured the server asks for a client certificate; without
//! `allow_connections_without_certificates` a client that presents none is refused during the
//! handshake (mongod closes such connections just after it), with it the connection goes on
//! unauthenticated. The crypto provider is `ring`, the one the stock driver already builds.

use super::x509::{X509Error, X509Name};
use super::AuthError;
use crate::value::error_codes::ErrorCode;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// `tls_mode`, mongod's `net.tls.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum TlsMode {
    /// No TLS.
    #[default]
    Disabled,
    /// TLS and plain clients; plain to shards.
    Allow,
    /// TLS and plain clients; TLS to shards.
    Prefer,
    /// TLS clients only; TLS to shards.
    Require,
}

impl TlsMode {
    /// mongod's name of the mode.
    pub fn mongod_name(self) -> &'static str {
        match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Allow => "allowTLS",
            TlsMode::Prefer => "preferTLS",
            TlsMode::Require => "requireTLS",
        }
    }

    /// Whether clients may connect with TLS.
    pub fn accepts_tls(self) -> bool {
        self != TlsMode::Disabled
    }

    /// Whether clients may connect without TLS.
    pub fn accepts_plain(self) -> bool {
        self != TlsMode::Require
    }

    /// Whether Sluice's own connections to shards and config servers use TLS.
    pub fn outgoing_tls(self) -> bool {
        matches!(self, TlsMode::Prefer | TlsMode::Require)
    }
}

impl FromStr for TlsMode {
    type Err = String;

    /// Sluice's names (`disabled`, `allow`, `prefer`, `require`) and mongod's (`allowTLS`,
    /// `preferTLS`, `requireTLS`, and the older `…SSL`).
    fn from_str(s: &str) -> Result<TlsMode, String> {
        match s {
            "disabled" => Ok(TlsMode::Disabled),
            "allow" | "allowTLS" | "allowSSL" => Ok(TlsMode::Allow),
            "prefer" | "preferTLS" | "preferSSL" => Ok(TlsMode::Prefer),
            "require" | "requireTLS" | "requireSSL" => Ok(TlsMode::Require),
            other => Err(format!(
                "unknown tls_mode \"{other}\": expected disabled, allow, prefer or require"
            )),
        }
    }
}

impl TryFrom<String> for TlsMode {
    type Error = String;
    fn try_from(s: String) -> Result<TlsMode, String> {
        s.parse()
    }
}

impl fmt::Display for TlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Allow => "allow",
            TlsMode::Prefer => "prefer",
            TlsMode::Require => "require",
        })
    }
}

/// How many bytes of a new connection [`classify`] reads (peeked, not consumed).
pub const PEEK_LEN: usize = 16;

/// What the first bytes of a connection are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstBytes {
    /// A TLS ClientHello.
    Tls,
    /// A MongoDB message header.
    MongoDb,
}

/// mongod's rule: the 16 bytes as a message header; `responseTo` (bytes 8..12) neither 0 nor
/// -1 means TLS. (A first byte of 0x16 alone proves nothing: a message length may end in it.)
pub fn classify(header: &[u8; PEEK_LEN]) -> FirstBytes {
    let response_to = i32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if response_to == 0 || response_to == -1 {
        FirstBytes::MongoDb
    } else {
        FirstBytes::Tls
    }
}

/// How a new connection proceeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Run the TLS handshake over the connection (the peeked bytes included).
    Tls,
    /// Serve it in plain text. `note` is the line mongod logs for it, when it logs one.
    Plain {
        /// mongod's log line for a plain client on a `prefer` port.
        note: Option<&'static str>,
    },
}

/// Decides a connection from the mode (any mode but `disabled` has a TLS configuration) and
/// its first bytes. The error (141 SSLHandshakeFailed with mongod's message) is logged, and the connection closed
/// without a reply.
pub fn admit(mode: TlsMode, first: FirstBytes) -> Result<Admission, AuthError> {
    match (first, mode) {
        (FirstBytes::Tls, TlsMode::Disabled) => Err(AuthError::new(
            ErrorCode::SSLHandshakeFailed,
            "SSL handshake received but server is started without SSL support",
        )),
        (FirstBytes::Tls, _) => Ok(Admission::Tls),
        (FirstBytes::MongoDb, TlsMode::Require) => Err(AuthError::new(
            ErrorCode::SSLHandshakeFailed,
            "The server is configured to only allow SSL connections",
        )),
        (FirstBytes::MongoDb, TlsMode::Prefer) => Ok(Admission::Plain {
            note: Some("SSL mode is set to 'preferred' and connection to remote is not using SSL"),
        }),
        (FirstBytes::MongoDb, _) => Ok(Admission::Plain { note: None }),
    }
}

fn config_error(message: impl Into<String>) -> AuthError {
    AuthError::new(ErrorCode::InvalidSSLConfiguration, message)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate chain and private key of a PEM holding both (mongod's
/// `certificateKeyFile`; a chain's intermediates follow the leaf).
pub fn certificate_and_key(
    pem: &[u8],
    what: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), AuthError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| config_error(format!("cannot read the certificates of {what}: {e}")))?;
    if certs.is_empty() {
        return Err(config_error(format!("{what} holds no certificate")));
    }
    let key = PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| config_error(format!("{what} holds no usable private key: {e}")))?;
    Ok((certs, key))
}

/// The trust anchors of a CA PEM file.
pub fn root_store(pem: &[u8], what: &str) -> Result<RootCertStore, AuthError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert =
            cert.map_err(|e| config_error(format!("cannot read the certificates of {what}: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| config_error(format!("{what}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(config_error(format!("{what} holds no certificate")));
    }
    Ok(roots)
}

/// The listener's TLS settings (PEM contents, already read).
#[derive(Debug, Clone, Copy)]
pub struct ServerTlsSettings<'a> {
    /// `certificateKeyFile`: the server's certificate chain and key.
    pub certificate_key_pem: &'a [u8],
    /// `CAFile`: when present, clients are asked for a certificate issued by it.
    pub ca_pem: Option<&'a [u8]>,
    /// `allowConnectionsWithoutCertificates`: with a CA, accept clients that present none.
    pub allow_connections_without_certificates: bool,
}

/// Builds the listener's rustls configuration.
pub fn server_config(settings: &ServerTlsSettings<'_>) -> Result<Arc<ServerConfig>, AuthError> {
    let provider = provider();
    let (certs, key) =
        certificate_and_key(settings.certificate_key_pem, "the certificate key file")?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(e.to_string()))?;
    let builder = match settings.ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = Arc::new(root_store(ca, "the CA file")?);
            let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            if settings.allow_connections_without_certificates {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier.build().map_err(|e| config_error(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| config_error(format!("the certificate key file: {e}")))?;
    Ok(Arc::new(config))
}

/// The subject of the verified client certificate of a finished handshake
/// (`ServerConnection::peer_certificates()`), or `None` when the client sent none.
pub fn peer_subject(
    peer_certificates: Option<&[CertificateDer<'_>]>,
) -> Option<Result<X509Name, X509Error>> {
    let leaf = peer_certificates?.first()?;
    Some(X509Name::from_certificate(leaf))
}

/// The subject of the first certificate of a PEM file (this server's own certificate, whose
/// `O`, `OU` and `DC` name the cluster's members).
pub fn own_subject(pem: &[u8]) -> Result<X509Name, AuthError> {
    let cert = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or_else(|| config_error("the certificate key file holds no certificate"))?
        .map_err(|e| config_error(format!("the certificate key file: {e}")))?;
    X509Name::from_certificate(&cert)
        .map_err(|e| config_error(format!("the certificate key file's subject: {e}")))
}

/// Sluice's TLS settings towards shards and config servers.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientTlsSettings<'a> {
    /// `CAFile` (or `clusterCAFile`): what the shards' certificates must chain to. Required
    /// unless `allow_invalid_certificates` (the system store is not read).
    pub ca_pem: Option<&'a [u8]>,
    /// `clusterFile` (else `certificateKeyFile`): the certificate Sluice presents, needed for
    /// x509 cluster authentication and by shards that require client certificates.
    pub certificate_key_pem: Option<&'a [u8]>,
    /// `allowInvalidCertificates`: accept any server certificate (tests only).
    pub allow_invalid_certificates: bool,
    /// `allowInvalidHostnames`: accept a valid certificate issued for another name.
    pub allow_invalid_hostnames: bool,
}

/// Builds the rustls configuration of Sluice's connections to shards and config servers.
pub fn client_config(settings: &ClientTlsSettings<'_>) -> Result<Arc<ClientConfig>, AuthError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> =
        match (settings.ca_pem, settings.allow_invalid_certificates) {
            (_, true) => Arc::new(LenientVerifier {
                inner: None,
                provider: provider.clone(),
            }),
            (Some(ca), false) => {
                let roots = Arc::new(root_store(ca, "the CA file")?);
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    roots,
                    provider.clone(),
                )
                .build()
                .map_err(|e| config_error(e.to_string()))?;
                if settings.allow_invalid_hostnames {
                    Arc::new(LenientVerifier {
                        inner: Some(inner),
                        provider: provider.clone(),
                    })
                } else {
                    inner
                }
            }
            (None, false) => {
                return Err(config_error(
                    "TLS to shards needs a CA file to verify their certificates",
                ))
            }
        };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match settings.certificate_key_pem {
        Some(pem) => {
            let (certs, key) = certificate_and_key(pem, "the cluster certificate file")?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| config_error(format!("the cluster certificate file: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A server-certificate verifier that keeps the handshake's signature checks but waives the
/// host name (`inner` set: `allowInvalidHostnames`) or the whole chain (`inner` unset:
/// `allowInvalidCertificates`).
#[derive(Debug)]
struct LenientVerifier {
    inner: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for LenientVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(inner) = &self.inner else {
            return Ok(ServerCertVerified::assertion());
        };
        match inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests;
