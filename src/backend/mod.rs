//! Shard connections and pools.
//!
//! A [`ShardPool`] holds connections to one shard: at most `max_size` open at once (an RAII
//! [`PooledConnection`] guard per checkout, returned on drop), a connect timeout, the shard
//! handshake (`hello`), a per-request timeout, request/response matching by `requestID`, and
//! two rules from production proxies: an idle connection that the shard closed (EOF or
//! unexpected bytes) is evicted at checkout, and a connection that saw an error mid-exchange
//! is never reused.

pub mod limiter;
pub mod queue;
pub mod shard;
pub mod sim;
pub mod stream;
pub mod topology;

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Document};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::keyfile::KeyFile;
use crate::auth::scram::ScramMechanism;
use crate::value::error_codes::ErrorCode;
use crate::wire::{self, BsonDoc, Message, OpMsgBuilder};
use stream::Stream;

/// Runs futures concurrently on the current task and returns their outputs in order (the
/// fan-out to shards: one future per shard, none of them spawned). A single future (a
/// targeted read or write, the hot path) is awaited in place: no box, no output slots.
pub async fn join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    // Collected before anything is awaited: the caller's iterator (and its closure) is not
    // held across an await, which would make the future's `Send` depend on its lifetimes.
    let futures: Vec<F> = futures.into_iter().collect();
    let futures = match <[F; 1]>::try_from(futures) {
        Ok([one]) => return vec![one.await],
        Err(futures) => futures,
    };
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if outputs[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => outputs[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Why a request to a shard failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// No connection could be made (connect, TLS or authentication failed): the request was
    /// never sent, so it cannot have been applied.
    #[error("{0}")]
    Connect(String),
    /// The connection broke: a request on it may have reached the shard.
    #[error("{0}")]
    Unreachable(String),
    /// The shard did not answer in time.
    #[error("{0}")]
    Timeout(String),
    /// The shard answered something that is not a valid reply.
    #[error("{0}")]
    Protocol(String),
    /// No member of a replica-set shard serves the request (no primary, no eligible
    /// secondary) within the selection timeout or the request's `maxTimeMS`: the request was
    /// never sent. Its code is the selection's (133 FailedToSatisfyReadPreference, 50
    /// MaxTimeMSExpired, or a read preference's validation error).
    #[error("{1}")]
    NoMember(ErrorCode, String),
}

impl BackendError {
    /// The MongoDB code a client sees for this error (6 HostUnreachable, 89 NetworkTimeout).
    pub fn code(&self) -> ErrorCode {
        match self {
            BackendError::Connect(_) | BackendError::Unreachable(_) | BackendError::Protocol(_) => {
                ErrorCode::HostUnreachable
            }
            BackendError::Timeout(_) => ErrorCode::NetworkTimeout,
            BackendError::NoMember(code, _) => *code,
        }
    }

    /// Whether the request may have reached the shard (and been applied): decided by the
    /// kind of failure, never by its message.
    pub fn maybe_applied(&self) -> bool {
        !matches!(self, BackendError::Connect(_) | BackendError::NoMember(..))
    }
}

/// A [`BackendError`] with the shard it came from, as a client is told it: the error keeps its
/// kind (and so its code and whether the request may have been applied) as its source.
#[derive(Debug, thiserror::Error)]
#[error("{source} (shard {shard})")]
pub struct ShardError {
    /// The shard's id.
    pub shard: String,
    /// What went wrong.
    #[source]
    pub source: BackendError,
}

impl BackendError {
    /// This error, as it happened on `shard`.
    pub fn at(self, shard: &str) -> ShardError {
        ShardError {
            shard: shard.to_string(),
            source: self,
        }
    }
}

/// How Sluice proves itself to shards and config servers: TLS (with its client certificate,
/// when it has one) and the cluster keyfile's `__system` user, as a mongos does.
#[derive(Clone, Default)]
pub struct ShardSecurity {
    /// TLS towards shards (`None`: plain TCP).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The keyfile: every new connection authenticates as `__system@local` with SCRAM-SHA-256.
    pub keyfile: Option<Arc<KeyFile>>,
    /// Cluster membership by certificate (`clusterAuthMode` `sendX509`/`x509`): every new
    /// connection authenticates with MONGODB-X509, the TLS client certificate's subject
    /// naming a member of the cluster.
    pub x509: bool,
    /// The same TLS settings as files, for the config server's connections (made by the
    /// `mongodb` driver, which reads its certificates from files).
    pub tls_files: Option<TlsFiles>,
}

/// The files of the TLS settings towards shards and config servers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA the peers' certificates must chain to.
    pub ca_file: Option<std::path::PathBuf>,
    /// The certificate chain and key presented (the cluster certificate).
    pub certificate_key_file: Option<std::path::PathBuf>,
    /// Accept any peer certificate (tests only).
    pub allow_invalid_certificates: bool,
}

impl std::fmt::Debug for ShardSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardSecurity")
            .field("tls", &self.tls.is_some())
            .field("keyfile", &self.keyfile.is_some())
            .field("x509", &self.x509)
            .finish()
    }
}

/// Settings of one pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Most connections open at once.
    pub max_size: usize,
    /// Connections kept open when idle.
    pub min_idle: usize,
    /// Time allowed to connect and shake hands.
    pub connect_timeout: Duration,
    /// Time allowed for one request.
    pub request_timeout: Duration,
    /// TLS and internal authentication of every new connection.
    pub security: ShardSecurity,
    /// Discovery and member selection of replica-set shards.
    pub replica_set: topology::TopologySettings,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            max_size: 64,
            min_idle: 0,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            security: ShardSecurity::default(),
            replica_set: topology::TopologySettings::default(),
        }
    }
}

/// One connection to a shard.
#[derive(Debug)]
pub struct ShardConnection {
    stream: Stream,
    buf: BytesMut,
}

static NEXT_REQUEST_ID: AtomicI32 = AtomicI32::new(1);

fn next_request_id() -> i32 {
    NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed) & i32::MAX
}

/// A command document as an OP_MSG frame with a fresh request id.
fn encode_command(body: &Document) -> Result<(Bytes, i32), BackendError> {
    let bytes = body
        .to_vec()
        .map_err(|e| BackendError::Protocol(format!("cannot encode command: {e}")))?;
    let id = next_request_id();
    Ok((OpMsgBuilder::new(0, &bytes).finish(id, 0), id))
}

impl ShardConnection {
    /// Connects and shakes hands (plain, unauthenticated: what a monitor's `hello` needs).
    pub async fn connect(addr: &str, timeout: Duration) -> Result<ShardConnection, BackendError> {
        Self::connect_with(addr, timeout, &ShardSecurity::default()).await
    }

    /// Connects (under TLS when `security` says so), shakes hands and, with a keyfile,
    /// authenticates as `__system`.
    pub async fn connect_with(
        addr: &str,
        timeout: Duration,
        security: &ShardSecurity,
    ) -> Result<ShardConnection, BackendError> {
        let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                BackendError::Connect(format!(
                    "cannot connect to {addr}: timed out after {timeout:?}"
                ))
            })?
            .map_err(|e| BackendError::Connect(format!("cannot connect to {addr}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let stream = match &security.tls {
            None => Stream::Plain(tcp),
            Some(tls) => {
                let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| BackendError::Connect(format!("cannot connect to {addr}: {e}")))?;
                let connector = tokio_rustls::TlsConnector::from(tls.clone());
                let tls = tokio::time::timeout(timeout, connector.connect(name, tcp))
                    .await
                    .map_err(|_| {
                        BackendError::Connect(format!(
                            "cannot connect to {addr}: TLS handshake timed out after {timeout:?}"
                        ))
                    })?
                    .map_err(|e| {
                        BackendError::Connect(format!(
                            "cannot connect to {addr}: TLS handshake failed: {e}"
                        ))
                    })?;
                Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(tls)))
            }
        };
        let mut conn = ShardConnection {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
        };
        // Whatever breaks before the connection is handed out (the member closed or reset it
        // during the handshake: it is stopping, or starting; it refused the handshake or the
        // authentication; it did not answer in time) is a failure to connect: no request went
        // out on this connection, so none can have been applied, and the caller may send it
        // elsewhere whatever its session.
        conn.handshake(addr, timeout, security)
            .await
            .map_err(|e| match e {
                BackendError::Connect(_) => e,
                e => BackendError::Connect(format!("cannot connect to {addr}: {e}")),
            })?;
        Ok(conn)
    }

    /// The handshake `hello` and, when `security` asks for it, the authentication.
    async fn handshake(
        &mut self,
        addr: &str,
        timeout: Duration,
        security: &ShardSecurity,
    ) -> Result<(), BackendError> {
        let hello = doc! {
            "hello": 1,
            "$db": "admin",
            "client": {"driver": {"name": "sluice", "version": env!("CARGO_PKG_VERSION")}, "os": {"type": std::env::consts::OS}},
        };
        let reply = self.run(&hello, timeout).await?;
        if reply.get_f64("ok").ok() != Some(1.0) {
            return Err(BackendError::Protocol(format!(
                "{addr} refused the handshake: {reply}"
            )));
        }
        if security.x509 {
            self.authenticate_x509(addr, timeout).await?;
        } else if let Some(keyfile) = &security.keyfile {
            self.authenticate_internal(addr, keyfile, timeout).await?;
        }
        Ok(())
    }

    /// MONGODB-X509 with the TLS client certificate: the shard takes its subject for a
    /// member of the cluster (`__system`).
    async fn authenticate_x509(
        &mut self,
        addr: &str,
        timeout: Duration,
    ) -> Result<(), BackendError> {
        let request = doc! {"authenticate": 1, "mechanism": "MONGODB-X509", "$db": "$external"};
        let reply = self.run(&request, timeout).await?;
        if reply.get_f64("ok").ok() == Some(1.0) {
            return Ok(());
        }
        Err(BackendError::Connect(format!(
            "cannot connect to {addr}: authentication with MONGODB-X509 failed: {}",
            reply.get_str("errmsg").unwrap_or("the shard refused")
        )))
    }

    /// SCRAM-SHA-256 as `__system@local` with the keyfile's first key, verifying the shard's
    /// signature too. A refusal is reported as the shard's error, never with the key.
    async fn authenticate_internal(
        &mut self,
        addr: &str,
        keyfile: &KeyFile,
        timeout: Duration,
    ) -> Result<(), BackendError> {
        let refused = |why: String| {
            BackendError::Connect(format!(
                "cannot connect to {addr}: authentication as __system failed: {why}"
            ))
        };
        let bin = |bytes: Vec<u8>| {
            bson::Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes,
            })
        };
        let payload = |reply: &Document| -> Result<Vec<u8>, BackendError> {
            if reply.get_f64("ok").ok() != Some(1.0) {
                return Err(refused(
                    reply
                        .get_str("errmsg")
                        .unwrap_or("the shard refused")
                        .to_string(),
                ));
            }
            reply
                .get_binary_generic("payload")
                .cloned()
                .map_err(|_| refused("the reply has no payload".into()))
        };
        let mut conversation = keyfile
            .client_conversation(ScramMechanism::Sha256)
            .map_err(|e| refused(e.0))?;
        let start = doc! {
            "saslStart": 1,
            "mechanism": ScramMechanism::Sha256.name(),
            "payload": bin(conversation.client_first()),
            "options": {"skipEmptyExchange": true},
            "$db": "local",
        };
        let reply = self.run(&start, timeout).await?;
        let conversation_id = reply
            .get("conversationId")
            .cloned()
            .unwrap_or(bson::Bson::Int32(1));
        let server_first = payload(&reply)?;
        let client_final = conversation
            .client_final(&server_first)
            .map_err(|e| refused(e.0))?;
        let step = |p: Vec<u8>| {
            doc! {"saslContinue": 1, "conversationId": conversation_id.clone(), "payload": bin(p), "$db": "local"}
        };
        let reply = self.run(&step(client_final), timeout).await?;
        let server_final = payload(&reply)?;
        conversation
            .verify_server_final(&server_final)
            .map_err(|e| refused(e.0))?;
        if reply.get_bool("done").unwrap_or(false) {
            return Ok(());
        }
        let reply = self.run(&step(Vec::new()), timeout).await?;
        payload(&reply)?;
        if reply.get_bool("done").unwrap_or(false) {
            Ok(())
        } else {
            Err(refused("the conversation did not finish".into()))
        }
    }

    /// Sends an encoded request (whose request id is `request_id`) and reads its reply body.
    pub async fn request(
        &mut self,
        frame: &[u8],
        request_id: i32,
        timeout: Duration,
    ) -> Result<BsonDoc, BackendError> {
        let exchange = async {
            self.stream
                .write_all(frame)
                .await
                .map_err(|e| BackendError::Unreachable(format!("connection to shard lost: {e}")))?;
            let reply = self.read_frame().await?;
            let incoming = wire::decode(reply)
                .map_err(|e| BackendError::Protocol(format!("invalid reply from shard: {e}")))?;
            if incoming.header.response_to != request_id {
                return Err(BackendError::Protocol(format!(
                    "reply answers request {} instead of {request_id}",
                    incoming.header.response_to
                )));
            }
            match incoming.message {
                Message::Msg(m) => Ok(m.body),
                other => Err(BackendError::Protocol(format!(
                    "unexpected reply {other:?}"
                ))),
            }
        };
        tokio::time::timeout(timeout, exchange).await.map_err(|_| {
            BackendError::Timeout(format!("shard did not answer within {timeout:?}"))
        })?
    }

    /// Runs a command given as a document.
    pub async fn run(
        &mut self,
        body: &Document,
        timeout: Duration,
    ) -> Result<Document, BackendError> {
        let (frame, id) = encode_command(body)?;
        let reply = self.request(&frame, id, timeout).await?;
        Ok(reply.to_document())
    }

    async fn read_frame(&mut self) -> Result<Bytes, BackendError> {
        loop {
            match wire::frame_length(&self.buf) {
                Ok(Some(len)) if self.buf.len() >= len => {
                    return Ok(self.buf.split_to(len).freeze())
                }
                Ok(Some(len)) => self.buf.reserve(len - self.buf.len()),
                Ok(None) => self.buf.reserve(4096),
                Err(e) => return Err(BackendError::Protocol(e.to_string())),
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) => {
                    return Err(BackendError::Unreachable(
                        "connection to shard closed".into(),
                    ))
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(BackendError::Unreachable(format!(
                        "connection to shard lost: {e}"
                    )))
                }
            }
        }
    }

    /// Whether an idle connection is still usable: no EOF and no unexpected bytes pending.
    fn is_healthy(&self) -> bool {
        self.buf.is_empty() && self.stream.is_idle_healthy()
    }
}

/// Connections to one shard.
#[derive(Debug)]
pub struct ShardPool {
    shard: String,
    addr: String,
    options: PoolOptions,
    idle: Mutex<Vec<ShardConnection>>,
    slots: Arc<Semaphore>,
    checkouts: AtomicU64,
    evicted: AtomicU64,
    /// Bumped by [`ShardPool::clear`]: connections checked out before are not reused.
    generation: AtomicU64,
    metrics: PoolMetrics,
}

/// The shard-labelled series a pool updates on every request, registered once: building a
/// labelled key per update costs more than the update.
struct PoolMetrics {
    checkout_wait: metrics::Histogram,
    idle: metrics::Gauge,
    child_batches: metrics::Counter,
}

impl std::fmt::Debug for PoolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolMetrics")
    }
}

impl PoolMetrics {
    fn new(shard: &str) -> PoolMetrics {
        PoolMetrics {
            checkout_wait: metrics::histogram!("sluice_pool_checkout_wait_seconds", "shard" => shard.to_string()),
            idle: metrics::gauge!("sluice_pool_idle_connections", "shard" => shard.to_string()),
            child_batches: metrics::counter!("sluice_child_batches_total", "shard" => shard.to_string()),
        }
    }
}

impl ShardPool {
    /// A pool for shard `shard` at `addr` (connections are opened on demand).
    pub fn new(shard: &str, addr: &str, options: PoolOptions) -> ShardPool {
        ShardPool {
            shard: shard.to_string(),
            addr: addr.to_string(),
            slots: Arc::new(Semaphore::new(options.max_size.max(1))),
            options,
            idle: Mutex::new(Vec::new()),
            checkouts: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            metrics: PoolMetrics::new(shard),
        }
    }

    /// Counts a write child batch sent to this shard (`sluice_child_batches_total`).
    pub fn count_child_batch(&self) {
        self.metrics.child_batches.increment(1);
    }

    /// The shard's id.
    pub fn shard(&self) -> &str {
        &self.shard
    }

    /// The shard's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The pool's settings.
    pub fn options(&self) -> &PoolOptions {
        &self.options
    }

    /// The pool's generation: it moves when the pool is cleared.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Closes the idle connections and makes the busy ones close when they come back (the
    /// member stepped down, shut down or became unreachable: what they were connected to is
    /// gone or no longer what it was).
    pub fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let dropped = std::mem::take(&mut *crate::sync::lock(&self.idle));
        self.evicted
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        self.metrics.idle.set(0.0);
    }

    /// Idle connections right now.
    pub fn idle_count(&self) -> usize {
        crate::sync::lock(&self.idle).len()
    }

    /// Connections evicted because the shard closed them or they broke.
    pub fn evicted_count(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Takes a connection (an idle healthy one, or a new one), waiting for a slot if all
    /// `max_size` are in use.
    pub async fn checkout(self: &Arc<Self>) -> Result<PooledConnection, BackendError> {
        let waited = std::time::Instant::now();
        let permit = tokio::time::timeout(
            self.options.connect_timeout,
            self.slots.clone().acquire_owned(),
        )
        .await
        .map_err(|_| {
            BackendError::Timeout(format!(
                "no connection to {} became free within {:?}",
                self.shard, self.options.connect_timeout
            ))
        })?
        .map_err(|_| BackendError::Unreachable("pool closed".into()))?;
        self.checkouts.fetch_add(1, Ordering::Relaxed);
        let generation = self.generation();
        self.metrics
            .checkout_wait
            .record(waited.elapsed().as_secs_f64());
        loop {
            let candidate = crate::sync::lock(&self.idle).pop();
            match candidate {
                Some(conn) if conn.is_healthy() => {
                    return Ok(PooledConnection {
                        conn: Some(conn),
                        pool: self.clone(),
                        broken: false,
                        generation,
                        _permit: permit,
                    })
                }
                Some(_) => {
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                }
                None => break,
            }
        }
        let conn = ShardConnection::connect_with(
            &self.addr,
            self.options.connect_timeout,
            &self.options.security,
        )
        .await?;
        Ok(PooledConnection {
            conn: Some(conn),
            pool: self.clone(),
            broken: false,
            generation,
            _permit: permit,
        })
    }

    /// Opens connections until `min_idle` are idle (errors are logged: the pool also connects
    /// on demand).
    pub async fn warm(self: &Arc<Self>) {
        let mut opened = Vec::new();
        while self.idle_count() + opened.len() < self.options.min_idle {
            match self.checkout().await {
                Ok(c) => opened.push(c),
                Err(e) => {
                    tracing::warn!(shard = %self.shard, error = %e, "cannot open an idle connection");
                    break;
                }
            }
        }
    }

    /// Runs one command on the shard (a checkout for the duration).
    pub async fn run_command(self: &Arc<Self>, body: &Document) -> Result<Document, BackendError> {
        let mut conn = self.checkout().await?;
        conn.run(body).await
    }
}

/// A checked-out connection; returned to its pool on drop unless it broke.
#[derive(Debug)]
pub struct PooledConnection {
    conn: Option<ShardConnection>,
    pool: Arc<ShardPool>,
    broken: bool,
    generation: u64,
    _permit: OwnedSemaphorePermit,
}

impl PooledConnection {
    /// Sends an encoded request and reads its reply; any failure marks the connection broken
    /// so it is never reused.
    pub async fn request(
        &mut self,
        frame: &[u8],
        request_id: i32,
    ) -> Result<BsonDoc, BackendError> {
        let timeout = self.pool.options.request_timeout;
        let Some(conn) = self.conn.as_mut() else {
            return Err(BackendError::Unreachable(
                "connection already closed".into(),
            ));
        };
        // Broken until the reply is read: a request abandoned half way (its caller's deadline
        // passed, say) leaves a reply in flight, and the connection must not be reused.
        self.broken = true;
        let result = conn.request(frame, request_id, timeout).await;
        self.broken = result.is_err();
        result
    }

    /// Runs a command given as a document.
    pub async fn run(&mut self, body: &Document) -> Result<Document, BackendError> {
        let (frame, id) = encode_command(body)?;
        Ok(self.request(&frame, id).await?.to_document())
    }

    /// A fresh request id for a frame built by the caller.
    pub fn next_request_id() -> i32 {
        next_request_id()
    }

    /// The pool the connection came from.
    pub fn pool(&self) -> &Arc<ShardPool> {
        &self.pool
    }

    /// The address this connection goes to (for a replica-set shard, the member's).
    pub fn addr(&self) -> &str {
        &self.pool.addr
    }

    /// Whether the pool was cleared since this connection was checked out (a failure on it
    /// is old news then).
    pub fn is_stale(&self) -> bool {
        self.generation != self.pool.generation()
    }
}

impl Drop for PooledConnection {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.broken || self.is_stale() {
                self.pool.evicted.fetch_add(1, Ordering::Relaxed);
            } else {
                let mut idle = crate::sync::lock(&self.pool.idle);
                idle.push(conn);
                self.pool.metrics.idle.set(idle.len() as f64);
            }
        }
    }
}

#[cfg(test)]
mod join_all_tests {
    use super::join_all;

    #[tokio::test]
    async fn outputs_come_in_order_for_none_one_and_many() {
        let none: Vec<u32> = join_all(Vec::<std::future::Ready<u32>>::new()).await;
        assert!(none.is_empty());
        assert_eq!(join_all([std::future::ready(7)]).await, vec![7]);
        let many = join_all((0..5).map(|i| async move {
            tokio::task::yield_now().await;
            i * 10
        }))
        .await;
        assert_eq!(many, vec![0, 10, 20, 30, 40]);
    }

    #[tokio::test]
    async fn futures_run_together() {
        // The first waits for what the second sends: awaited one after the other they would
        // never finish.
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let tx = std::sync::Mutex::new(Some(tx));
        let rx = std::sync::Mutex::new(Some(rx));
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            join_all((0..2).map(|i| {
                let (tx, rx) = (&tx, &rx);
                async move {
                    if i == 0 {
                        let rx = rx.lock().unwrap().take().unwrap();
                        rx.await.unwrap_or(0)
                    } else {
                        let tx = tx.lock().unwrap().take().unwrap();
                        let _ = tx.send(9);
                        1
                    }
                }
            })),
        )
        .await;
        assert_eq!(out.ok(), Some(vec![9, 1]));
    }
}
