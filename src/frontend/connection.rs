//! One task per client connection: read whole messages (length checked first, then parsed),
//! dispatch each command, write its reply, and keep the connection's handshake state.
//!
//! Protocol duties that belong to the connection rather than to any command live here:
//! `moreToCome` (no reply), exhaust streaming of awaitable `hello` (`exhaustAllowed`),
//! compressing replies with the compressor the request used, the legacy OP_QUERY handshake
//! answered with OP_REPLY, and the fate of malformed input: an error reply where mongod sends
//! one, a logged close where the stream cannot be trusted.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bson::{doc, Document};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::security::{ConnectionAuth, Security};
use super::{Response, Service};
use crate::command::{self, hello, ClientState, CommandError, CommandRequest, ServerState};
use crate::value::error_codes::ErrorCode;
use crate::wire::{
    self, encode_compressed, encode_op_reply, Compressor, Header, Incoming, Message, MsgFlags,
    OpCode, OpMsg, OpMsgBuilder, OpQuery, Reply, ReplyFlags, WireError,
};

/// Commands whose requests and replies are never compressed (OP_COMPRESSED spec).
const NEVER_COMPRESSED: &[&str] = &[
    "hello",
    "isMaster",
    "ismaster",
    "saslStart",
    "saslContinue",
    "getnonce",
    "authenticate",
    "createUser",
    "updateUser",
    "copydbSaslStart",
    "copydbgetnonce",
    "copydb",
];

/// Commands accepted over OP_QUERY (the handshake only, as on MongoDB 5.1+).
const OP_QUERY_COMMANDS: &[&str] = &["hello", "isMaster", "ismaster"];

const LEGACY_OPCODE_MESSAGE: &str = "OP_QUERY is no longer supported. The client driver may require an upgrade. For more details see https://dochub.mongodb.org/core/legacy-opcode-removal";

/// Most a connection's read buffer may keep while it waits for the next message. The buffer
/// starts at 4 KiB and doubles whenever a message does not fit, so one 40 KB message would
/// otherwise leave an idle connection (a client's, or a pooled one between the router and a
/// shard) holding 64–128 KiB for as long as it stays open.
const IDLE_BUFFER_KEEP: usize = 8 * 1024;

/// A request's future with panics caught: a panic while one request is handled fails that
/// request, not the connection or the process.
struct CatchUnwind<F>(F);

impl<F: std::future::Future + Unpin> std::future::Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::pin::Pin::new(&mut *inner).poll(cx)
        })) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    }
}

/// What a caught panic said.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Whether the connection goes on after a message.
enum Flow {
    Continue,
    Close,
}

/// Keeps the open-connection gauge right however the task ends.
struct OpenConnection<'a>(&'a ServerState);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        metrics::gauge!("sluice_connections_open").decrement(1.0);
        self.0
            .counters
            .connections_current
            .fetch_sub(1, Ordering::Relaxed);
        super::memory::note_activity();
    }
}

use crate::backend::stream::Stream as ClientStream;

/// How long a new connection has to send its first bytes and finish the TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Peeks the first bytes of a connection (without consuming them) to tell TLS from plain.
async fn peek_first(
    socket: &TcpStream,
) -> std::io::Result<Option<[u8; crate::auth::tls::PEEK_LEN]>> {
    let mut first = [0u8; crate::auth::tls::PEEK_LEN];
    loop {
        let n = socket.peek(&mut first).await?;
        if n == 0 {
            return Ok(None);
        }
        if n == first.len() {
            return Ok(Some(first));
        }
        // Fewer bytes than a header so far: wait for the rest of the segment.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Admits a new connection on a TLS-enabled listener: TLS (handshake done, the client
/// certificate's subject recorded) or plain, as the mode allows; `None` closes it (logged).
async fn admit(
    socket: TcpStream,
    peer: SocketAddr,
    security: &Security,
    auth: &mut ConnectionAuth,
) -> Option<ClientStream> {
    let Some((mode, acceptor)) = security.tls() else {
        return Some(ClientStream::Plain(socket));
    };
    let first = match tokio::time::timeout(HANDSHAKE_TIMEOUT, peek_first(&socket)).await {
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None)) => return None,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection failed before its first message");
            return None;
        }
        Err(_) => {
            tracing::warn!(%peer, "closing connection: nothing received within the handshake timeout");
            return None;
        }
    };
    let admission = crate::auth::tls::admit(*mode, crate::auth::tls::classify(&first));
    match admission {
        Err(e) => {
            metrics::counter!("sluice_tls_handshakes_total", "outcome" => "refused").increment(1);
            tracing::warn!(%peer, error = %e.message, "closing connection");
            None
        }
        Ok(crate::auth::tls::Admission::Plain { note }) => {
            if let Some(note) = note {
                tracing::debug!(%peer, "{note}");
            }
            Some(ClientStream::Plain(socket))
        }
        Ok(crate::auth::tls::Admission::Tls) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                Ok(Ok(stream)) => {
                    metrics::counter!("sluice_tls_handshakes_total", "outcome" => "success")
                        .increment(1);
                    let certs = stream.get_ref().1.peer_certificates();
                    match crate::auth::tls::peer_subject(certs) {
                        Some(Ok(name)) => auth.set_peer(security, &name),
                        Some(Err(e)) => {
                            tracing::warn!(%peer, error = %e, "cannot read the client certificate's subject")
                        }
                        None => {}
                    }
                    Some(ClientStream::Tls(Box::new(
                        tokio_rustls::TlsStream::Server(stream),
                    )))
                }
                Ok(Err(e)) => {
                    metrics::counter!("sluice_tls_handshakes_total", "outcome" => "failure")
                        .increment(1);
                    tracing::warn!(%peer, error = %e, "TLS handshake failed");
                    None
                }
                Err(_) => {
                    metrics::counter!("sluice_tls_handshakes_total", "outcome" => "failure")
                        .increment(1);
                    tracing::warn!(%peer, "TLS handshake timed out");
                    None
                }
            }
        }
    }
}

/// Serves one client until it disconnects, sends something unrecoverable, or the router shuts
/// down (after the request in flight is answered).
pub async fn serve(
    socket: TcpStream,
    peer: SocketAddr,
    service: Arc<dyn Service>,
    security: Arc<Security>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut auth = ConnectionAuth::default();
    if let Ok(local) = socket.local_addr() {
        auth.set_addresses(peer, local);
    }
    let mut socket = tokio::select! {
        s = admit(socket, peer, &security, &mut auth) => match s {
            Some(s) => s,
            None => return,
        },
        _ = shutdown.changed() => return,
    };
    let state = service.state().clone();
    state
        .counters
        .connections_current
        .fetch_add(1, Ordering::Relaxed);
    metrics::gauge!("sluice_connections_open").increment(1.0);
    state
        .counters
        .connections_total
        .fetch_add(1, Ordering::Relaxed);
    let _open = OpenConnection(&state);
    let mut client = ClientState::new(state.next_connection_id(), peer);
    let conn = client.id;
    tracing::debug!(conn, %peer, "connection accepted");
    // Allocated on the first read; an idle connection holds no more than a small buffer.
    let mut buf = BytesMut::new();
    let mut first = true;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let frame = tokio::select! {
            r = read_frame(&mut socket, &mut buf, &mut first) => r,
            _ = shutdown.changed() => break,
        };
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(reason) => {
                tracing::warn!(conn, %peer, %reason, "closing connection");
                break;
            }
        };
        let frame_len = frame.len();
        let mut session = Session {
            socket: &mut socket,
            buf: &mut buf,
            state: &state,
            service: &service,
            client: &mut client,
            security: &security,
            auth: &mut auth,
        };
        let flow = session.handle_frame(frame).await;
        release_idle_buffer(&mut buf, frame_len);
        match flow {
            Ok(Flow::Continue) => {}
            Ok(Flow::Close) => break,
            Err(e) => {
                tracing::debug!(conn, %peer, error = %e, "connection write failed");
                break;
            }
        }
    }
    service.connection_closed(&client).await;
    let _ = socket.shutdown().await;
    tracing::debug!(conn, %peer, "connection closed");
}

/// Gives back the read buffer's allocation once the message it held is handled, when that
/// allocation grew past [`IDLE_BUFFER_KEEP`] (the message's bytes and the room left behind
/// them): the next read starts a fresh 4 KiB buffer. Messages that fit the first buffer keep
/// reusing it. Bytes of a message that arrived behind this one are never dropped.
fn release_idle_buffer(buf: &mut BytesMut, frame_len: usize) {
    if buf.is_empty() && frame_len + buf.capacity() > IDLE_BUFFER_KEEP {
        *buf = BytesMut::new();
    }
}

/// Reads one whole frame into `buf` and splits it off. `Ok(None)` on a clean EOF between
/// messages. Cancel-safe: partial data stays in `buf`.
async fn read_frame(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    first: &mut bool,
) -> Result<Option<Bytes>, String> {
    loop {
        // A TLS ClientHello on a plain connection would read as a 30-odd MB message and be
        // waited for: look at the first header once and close instead, with mongod's line.
        if *first && buf.len() >= crate::auth::tls::PEEK_LEN {
            *first = false;
            let mut head = [0u8; crate::auth::tls::PEEK_LEN];
            head.copy_from_slice(&buf[..crate::auth::tls::PEEK_LEN]);
            if matches!(socket, ClientStream::Plain(_))
                && head[0] == 0x16
                && head[1] == 0x03
                && crate::auth::tls::classify(&head) == crate::auth::tls::FirstBytes::Tls
            {
                return Err(
                    "SSL handshake received but server is started without SSL support".into(),
                );
            }
        }
        match wire::frame_length(buf) {
            Ok(Some(len)) if buf.len() >= len => return Ok(Some(buf.split_to(len).freeze())),
            Ok(Some(len)) => buf.reserve(len - buf.len()),
            Ok(None) => buf.reserve(4096),
            Err(e) => return Err(e.to_string()),
        }
        match socket.read_buf(buf).await {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => {
                return Err(format!(
                    "peer closed the connection in the middle of a message ({} bytes buffered)",
                    buf.len()
                ))
            }
            Ok(_) => {}
            // A TLS client that closes between messages without close_notify (most drivers
            // do) has simply gone away, as a plain client closing its socket has.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && buf.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

struct Session<'a> {
    socket: &'a mut ClientStream,
    buf: &'a mut BytesMut,
    state: &'a Arc<ServerState>,
    service: &'a Arc<dyn Service>,
    client: &'a mut ClientState,
    security: &'a Security,
    auth: &'a mut ConnectionAuth,
}

impl Session<'_> {
    async fn handle_frame(&mut self, frame: Bytes) -> std::io::Result<Flow> {
        let counters = &self.state.counters;
        counters.requests.fetch_add(1, Ordering::Relaxed);
        super::memory::note_activity();
        counters
            .bytes_in
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        metrics::counter!("sluice_bytes_in_total").increment(frame.len() as u64);
        let Some(header) = Header::parse(&frame) else {
            return Ok(Flow::Close);
        };
        let more_to_come_flag = header.op_code == OpCode::Msg
            && frame.len() >= 20
            && u32::from_le_bytes([frame[16], frame[17], frame[18], frame[19]])
                & MsgFlags::MORE_TO_COME
                != 0;
        let incoming = match wire::decode(frame) {
            Ok(incoming) => incoming,
            Err(WireError::Fatal(reason)) => {
                tracing::warn!(conn = self.client.id, peer = %self.client.peer, %reason, "closing connection");
                return Ok(Flow::Close);
            }
            Err(WireError::Invalid {
                code,
                message,
                close_after,
            }) => {
                tracing::debug!(conn = self.client.id, %code, %message, "malformed message");
                if more_to_come_flag {
                    // The client reads no reply to this message: closing is the only way to
                    // tell it something went wrong.
                    tracing::warn!(conn = self.client.id, %code, %message, "closing connection after a malformed moreToCome message");
                    return Ok(Flow::Close);
                }
                let mut reply = CommandError::new(code, message).to_reply();
                command::append_cluster_time(self.state, &mut reply);
                if header.op_code == OpCode::Query {
                    self.send_op_reply(header.request_id, ReplyFlags::AWAIT_CAPABLE, &reply)
                        .await?;
                } else {
                    self.send_msg(&reply, header.request_id, 0, None).await?;
                }
                return Ok(if close_after {
                    Flow::Close
                } else {
                    Flow::Continue
                });
            }
        };
        if let Some(c) = incoming.compressor {
            if let Some(k) = counters.compression_for(c) {
                k.decompressor_in
                    .fetch_add(incoming.wire_size as u64, Ordering::Relaxed);
            }
        }
        match &incoming.message {
            Message::Msg(msg) => self.handle_msg(&incoming, msg).await,
            Message::Query(query) => self.handle_query(&incoming, query).await,
            Message::Legacy(op) => self.handle_legacy(&incoming, *op).await,
        }
    }

    async fn handle_msg(&mut self, incoming: &Incoming, msg: &OpMsg) -> std::io::Result<Flow> {
        if let Some(c) = incoming.compressor {
            if let Some(k) = self.state.counters.compression_for(c) {
                k.decompressor_out
                    .fetch_add(msg_size(msg) as u64, Ordering::Relaxed);
            }
        }
        let request_id = incoming.header.request_id;
        let more_to_come = msg.flags.more_to_come();
        // A request that carried a checksum gets one back.
        let reply_flags = msg.flags.0 & MsgFlags::CHECKSUM_PRESENT;
        let req = match CommandRequest::from_op_msg(msg) {
            Ok(req) => req,
            Err(e) => {
                if more_to_come {
                    return Ok(Flow::Continue);
                }
                let mut reply = e.to_reply();
                command::append_cluster_time(self.state, &mut reply);
                self.send_msg(&reply, request_id, reply_flags, incoming.compressor)
                    .await?;
                return Ok(Flow::Continue);
            }
        };
        let compressor = incoming
            .compressor
            .filter(|_| !NEVER_COMPRESSED.contains(&req.name.as_str()));
        let exhaust = msg.flags.exhaust_allowed()
            && !more_to_come
            && OP_QUERY_COMMANDS.contains(&req.name.as_str())
            && hello::is_awaitable(req.body.raw());

        let started = std::time::Instant::now();
        let label = command_label(&req.name);
        let span = tracing::info_span!(
            "request",
            conn = self.client.id,
            command = label,
            ns = %namespace(&req),
            plan = tracing::field::Empty,
            shards = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let response = self.serve_request(&req, Some(span.clone())).await;
        let elapsed = started.elapsed();
        span.record("duration_ms", elapsed.as_secs_f64() * 1000.0);
        tracing::debug!(parent: &span, "request done");
        metrics::counter!("sluice_requests_total", "command" => label).increment(1);
        metrics::histogram!("sluice_request_duration_seconds", "command" => label)
            .record(elapsed.as_secs_f64());
        let reply = match response {
            Response::Reply(reply) => Reply::Document(reply),
            Response::Raw(reply) => Reply::Raw(reply),
            Response::CloseConnection => return Ok(Flow::Close),
        };
        if more_to_come {
            return Ok(Flow::Continue);
        }
        if !exhaust {
            let bytes = encode_reply(reply);
            self.send_bytes(&bytes, request_id, reply_flags, compressor)
                .await?;
            return Ok(Flow::Continue);
        }
        self.stream_hello(req, reply, request_id, reply_flags, compressor)
            .await
    }

    /// Exhaust mode: keep answering the awaitable `hello` with `moreToCome` set, each reply
    /// responding to the previous one, until the client closes or speaks, or shutdown.
    async fn stream_hello(
        &mut self,
        req: CommandRequest,
        first: Reply,
        request_id: i32,
        reply_flags: u32,
        compressor: Option<Compressor>,
    ) -> std::io::Result<Flow> {
        let mut reply = first;
        let mut respond_to = request_id;
        let mut req = req;
        loop {
            let last = self.state.shutting_down() || reply.ok() != Some(1.0);
            let flags = reply_flags | if last { 0 } else { MsgFlags::MORE_TO_COME };
            respond_to = match &reply {
                Reply::Document(d) => self.send_msg(d, respond_to, flags, compressor).await?,
                Reply::Raw(r) => {
                    self.send_bytes(r.as_bytes(), respond_to, flags, compressor)
                        .await?
                }
            };
            if last {
                return Ok(Flow::Continue);
            }
            // Each streamed reply answers the previous one, so the next wait is against the
            // topologyVersion just sent, as mongod does: a client that sent another server's
            // topologyVersion gets one immediate reply, then replies only on a change or
            // after maxAwaitTimeMS, never a tight loop.
            if let Some(next) = with_topology_version(&req, &reply) {
                req = next;
            }
            let next = tokio::select! {
                r = serve_request(self.service, self.state, self.client, (self.security, &mut *self.auth), &req, None) => match r {
                    Response::Reply(reply) => Some(Reply::Document(reply)),
                    Response::Raw(reply) => Some(Reply::Raw(reply)),
                    Response::CloseConnection => return Ok(Flow::Close),
                },
                read = self.socket.read_buf(self.buf) => match read {
                    Ok(0) | Err(_) => return Ok(Flow::Close),
                    // The client sent a new request: streaming ends, the request is served
                    // by the main loop from the buffer.
                    Ok(_) => None,
                },
            };
            match next {
                Some(r) => reply = r,
                None => return Ok(Flow::Continue),
            }
        }
    }

    /// Runs one request through the service (see [`serve_request`]).
    async fn serve_request(
        &mut self,
        req: &CommandRequest,
        span: Option<tracing::Span>,
    ) -> Response {
        serve_request(
            self.service,
            self.state,
            self.client,
            (self.security, &mut *self.auth),
            req,
            span,
        )
        .await
    }

    async fn handle_query(
        &mut self,
        incoming: &Incoming,
        query: &OpQuery,
    ) -> std::io::Result<Flow> {
        let request_id = incoming.header.request_id;
        if !query.is_command() {
            self.state.counters.op_query.fetch_add(1, Ordering::Relaxed);
            let mut reply = doc! {
                "$err": LEGACY_OPCODE_MESSAGE,
                "code": ErrorCode::LegacyOpcodeRemoved.0,
                "ok": 0.0,
            };
            command::append_cluster_time(self.state, &mut reply);
            self.send_op_reply(
                request_id,
                ReplyFlags::QUERY_FAILURE | ReplyFlags::AWAIT_CAPABLE,
                &reply,
            )
            .await?;
            return Ok(Flow::Continue);
        }
        let body = query.command();
        let name = body.first_key().unwrap_or_default().to_string();
        let reply = if OP_QUERY_COMMANDS.contains(&name.as_str()) {
            let req = CommandRequest::new(query.database().to_string(), body, Vec::new(), true);
            match self.serve_request(&req, None).await {
                Response::Reply(reply) => reply,
                Response::Raw(reply) => Reply::Raw(reply).into_document(),
                Response::CloseConnection => return Ok(Flow::Close),
            }
        } else {
            let mut reply = CommandError::new(
                ErrorCode::UnsupportedOpQueryCommand,
                format!(
                    "Unsupported OP_QUERY command: {name}. The client driver may require an upgrade. For more details see https://dochub.mongodb.org/core/legacy-opcode-removal"
                ),
            )
            .to_reply();
            command::append_cluster_time(self.state, &mut reply);
            reply
        };
        self.send_op_reply(request_id, ReplyFlags::AWAIT_CAPABLE, &reply)
            .await?;
        Ok(Flow::Continue)
    }

    async fn handle_legacy(&mut self, incoming: &Incoming, op: OpCode) -> std::io::Result<Flow> {
        if op == OpCode::GetMore {
            self.state
                .counters
                .op_getmore
                .fetch_add(1, Ordering::Relaxed);
            let reply = doc! {
                "$err": LEGACY_OPCODE_MESSAGE,
                "code": ErrorCode::LegacyOpcodeRemoved.0,
                "ok": 0.0,
            };
            self.send_op_reply(
                incoming.header.request_id,
                ReplyFlags::QUERY_FAILURE | ReplyFlags::AWAIT_CAPABLE,
                &reply,
            )
            .await?;
            return Ok(Flow::Continue);
        }
        // OP_INSERT, OP_UPDATE, OP_DELETE and OP_KILL_CURSORS expect no reply; closing the
        // connection is the only way to make sure the client does not believe its write landed.
        tracing::warn!(
            conn = self.client.id,
            peer = %self.client.peer,
            opcode = op.as_i32(),
            "closing connection: legacy opcode removed in MongoDB 5.1"
        );
        Ok(Flow::Close)
    }

    /// Sends an OP_MSG reply; returns its request id.
    async fn send_msg(
        &mut self,
        reply: &Document,
        response_to: i32,
        flags: u32,
        compressor: Option<Compressor>,
    ) -> std::io::Result<i32> {
        let bytes = encode_document(reply);
        self.send_bytes(&bytes, response_to, flags, compressor)
            .await
    }

    /// Sends an encoded reply body as an OP_MSG; returns its request id.
    async fn send_bytes(
        &mut self,
        bytes: &[u8],
        response_to: i32,
        flags: u32,
        compressor: Option<Compressor>,
    ) -> std::io::Result<i32> {
        let request_id = self.state.next_request_id();
        let frame = OpMsgBuilder::new(flags, bytes).finish(request_id, response_to);
        let frame = match compressor {
            Some(c) if c != Compressor::Noop => match encode_compressed(&frame, c) {
                Ok(packed) => {
                    if let Some(k) = self.state.counters.compression_for(c) {
                        k.compressor_in
                            .fetch_add(frame.len() as u64, Ordering::Relaxed);
                        k.compressor_out
                            .fetch_add(packed.len() as u64, Ordering::Relaxed);
                    }
                    packed
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reply compression failed; sending it uncompressed");
                    frame
                }
            },
            _ => frame,
        };
        self.write(&frame).await?;
        Ok(request_id)
    }

    async fn send_op_reply(
        &mut self,
        response_to: i32,
        flags: i32,
        reply: &Document,
    ) -> std::io::Result<()> {
        let bytes = encode_document(reply);
        let frame = encode_op_reply(self.state.next_request_id(), response_to, flags, &bytes);
        self.write(&frame).await
    }

    async fn write(&mut self, frame: &[u8]) -> std::io::Result<()> {
        self.socket.write_all(frame).await?;
        metrics::counter!("sluice_bytes_out_total").increment(frame.len() as u64);
        self.state
            .counters
            .bytes_out
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Runs one request through the service, with a panic turned into InternalError (1) naming
/// the command (and logged), so the connection and the process go on.
async fn serve_request(
    service: &Arc<dyn Service>,
    state: &ServerState,
    client: &mut ClientState,
    (security, auth): (&Security, &mut ConnectionAuth),
    req: &CommandRequest,
    span: Option<tracing::Span>,
) -> Response {
    let conn = client.id;
    let peer = client.peer;
    // A user an authentication request names that a `--configdb` router does not hold yet.
    security.fetch_named_user(req).await;
    // Authorization and the authentication and user commands: answered before the service.
    if let Some(reply) = security.before(auth, state, (conn, &peer), req) {
        return Response::Reply(reply);
    }
    // A `--configdb` router's user and role commands: run on the config server.
    if let Some(reply) = security.forward(auth, state, req).await {
        return Response::Reply(reply);
    }
    let fut = service.handle(client, req);
    let outcome = match span {
        Some(span) => CatchUnwind(tracing::Instrument::instrument(fut, span)).await,
        None => CatchUnwind(fut).await,
    };
    let edited = |mut reply: Reply, auth: &mut ConnectionAuth| {
        security.after(auth, (conn, &peer), req, &mut reply);
        match reply {
            Reply::Document(d) => Response::Reply(d),
            Reply::Raw(r) => Response::Raw(r),
        }
    };
    match outcome {
        Ok(Response::Reply(reply)) => edited(Reply::Document(reply), auth),
        // An encoded reply stays encoded through the hook (a `hello`'s fields are appended
        // to its bytes).
        Ok(Response::Raw(raw)) if security.edits_reply(&req.name) => edited(Reply::Raw(raw), auth),
        Ok(Response::Raw(raw)) => {
            security.observe_raw(auth, req, &raw);
            Response::Raw(raw)
        }
        Ok(response) => response,
        Err(panic) => {
            let what = panic_message(panic.as_ref());
            tracing::error!(
                conn,
                command = %req.name,
                panic = %what,
                "request panicked; it fails with InternalError and the connection goes on"
            );
            let mut reply = CommandError::new(
                ErrorCode::InternalError,
                format!(
                    "internal error while running command '{}': {what}",
                    req.name
                ),
            )
            .to_reply();
            command::append_cluster_time(state, &mut reply);
            Response::Reply(reply)
        }
    }
}

/// The same awaitable `hello` with the `topologyVersion` of `reply` (`None` when the reply has
/// none or the request already carries it). The request is rebuilt only when its
/// `topologyVersion` differs from the reply's bytes (the first streamed reply at most).
fn with_topology_version(req: &CommandRequest, reply: &Reply) -> Option<CommandRequest> {
    let tv = match reply {
        Reply::Document(d) => d.get_document("topologyVersion").ok()?.clone(),
        Reply::Raw(r) => {
            let tv = r.get_document("topologyVersion").ok()?;
            let asked = last_value(req.body.raw(), "topologyVersion");
            if let Some(bson::RawBsonRef::Document(asked)) = asked {
                if asked.as_bytes() == tv.as_bytes() {
                    return None;
                }
            }
            Document::try_from(tv).ok()?
        }
    };
    let mut body = req.body_document();
    if body.get_document("topologyVersion").ok() == Some(&tv) {
        return None;
    }
    body.insert("topologyVersion", tv);
    let bytes = body.to_vec().ok()?;
    Some(CommandRequest {
        body: crate::wire::BsonDoc::from_encoded(bytes),
        ..req.clone()
    })
}

/// The value of the last field named `key` (where an owned document would keep it).
fn last_value<'a>(doc: &'a bson::RawDocument, key: &str) -> Option<bson::RawBsonRef<'a>> {
    doc.iter()
        .flatten()
        .filter(|(k, _)| k.as_str() == key)
        .map(|(_, v)| v)
        .last()
}

/// Encodes a reply body (an encoded one is taken as it is).
fn encode_reply(reply: Reply) -> Vec<u8> {
    match reply {
        Reply::Document(d) => encode_document(&d),
        Reply::Raw(r) => r.into_bytes(),
    }
}

/// Encodes a reply; a reply that cannot be encoded (over 16 MiB, say) becomes an error reply.
fn encode_document(reply: &Document) -> Vec<u8> {
    match reply.to_vec() {
        Ok(bytes) => bytes,
        Err(e) => {
            let fallback = CommandError::new(
                ErrorCode::InternalError,
                format!("cannot encode the reply: {e}"),
            )
            .to_reply();
            fallback.to_vec().unwrap_or_default()
        }
    }
}

fn msg_size(msg: &OpMsg) -> usize {
    crate::wire::HEADER_LEN
        + 4
        + 1
        + msg.body.len()
        + msg
            .sequences
            .iter()
            .map(|s| {
                1 + 4 + s.identifier.len() + 1 + s.documents.iter().map(|d| d.len()).sum::<usize>()
            })
            .sum::<usize>()
}

/// `db.collection` when the command names a collection, else the database.
fn namespace(req: &CommandRequest) -> &str {
    req.namespace.as_deref().unwrap_or(&req.db)
}

/// The command name as a metric label: known commands by name, anything else as "other" (so a
/// client cannot grow the label set without bound).
fn command_label(name: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "insert",
        "update",
        "delete",
        "find",
        "getMore",
        "killCursors",
        "aggregate",
        "count",
        "distinct",
        "findAndModify",
        "hello",
        "isMaster",
        "ismaster",
        "ping",
        "buildInfo",
        "serverStatus",
        "getParameter",
        "getLog",
        "endSessions",
        "listDatabases",
        "listCollections",
        "listIndexes",
        "createIndexes",
        "dropIndexes",
        "drop",
        "dropDatabase",
        "create",
        "dbStats",
        "collStats",
        "explain",
        "shardCollection",
        "enableSharding",
        "listShards",
        "commitTransaction",
        "abortTransaction",
    ];
    KNOWN
        .iter()
        .copied()
        .find(|k| *k == name)
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `len` bytes as a client sends it (only the length field matters here).
    fn frame(len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..4].copy_from_slice(&(len as i32).to_le_bytes());
        f[12..16].copy_from_slice(&2013i32.to_le_bytes());
        f
    }

    /// Reads `sizes` frames one after another as the connection loop does, returning the
    /// capacity the buffer holds while it waits for the next one.
    async fn idle_capacities(sizes: &[usize]) -> Vec<usize> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frames: Vec<Vec<u8>> = sizes.iter().map(|&n| frame(n)).collect();
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            for f in frames {
                s.write_all(&f).await.unwrap();
                // One message at a time, as a client waiting for each reply sends them.
                let mut ack = [0u8; 1];
                s.read_exact(&mut ack).await.unwrap();
            }
        });
        let (socket, _) = listener.accept().await.unwrap();
        let mut socket = ClientStream::Plain(socket);
        let mut buf = BytesMut::new();
        let mut first = true;
        let mut kept = Vec::new();
        for &n in sizes {
            let f = read_frame(&mut socket, &mut buf, &mut first)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(f.len(), n);
            drop(f);
            release_idle_buffer(&mut buf, n);
            // What the buffer holds while it waits: read_frame makes room for a header first
            // (taking back the whole allocation when the buffer is its only user).
            buf.reserve(4096);
            kept.push(buf.capacity());
            socket.write_all(&[1]).await.unwrap();
        }
        client.await.unwrap();
        kept
    }

    #[tokio::test]
    async fn an_idle_connection_keeps_no_large_read_buffer() {
        // Messages between the first buffer and the old 64 KiB release threshold: before, the
        // buffer doubled to fit them and stayed at that size while the connection was idle.
        let sizes = [20_000, 40_000, 60_000, 30_000, 50_000, 65_000];
        for (n, kept) in sizes.iter().zip(idle_capacities(&sizes).await) {
            assert!(
                kept <= IDLE_BUFFER_KEEP,
                "after a {n}-byte message the idle buffer keeps {kept} bytes"
            );
        }
    }

    #[tokio::test]
    async fn small_messages_keep_reusing_their_buffer() {
        let kept = idle_capacities(&[200; 50]).await;
        assert!(
            kept.iter().all(|&k| (4096..=IDLE_BUFFER_KEEP).contains(&k)),
            "a buffer that fits small messages stays: {kept:?}"
        );
    }
}
