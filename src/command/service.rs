//! The contract between the frontend and whatever answers commands behind it (the router, an
//! embedded shard): [`Service`], and the [`Response`] it gives for one request. Defined here,
//! below both, so the frontend serves any service without knowing which, and the services
//! implement it without reaching up into the frontend.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bson::Document;

use super::{ClientState, CommandRequest, ServerState};

/// A boxed future, as returned by [`Service::handle`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a service wants done with one request.
#[derive(Debug)]
pub enum Response {
    /// Send this reply (nothing is sent when the request carried `moreToCome`).
    Reply(Document),
    /// Send this reply, already encoded (results passed through from a shard).
    Raw(bson::RawDocumentBuf),
    /// Close the connection without replying (a `closeConnection` failpoint, for instance).
    CloseConnection,
}

/// Whatever answers commands behind a listener: the router, or an embedded shard. The
/// frontend owns sockets, framing, compression and exhaust; the service owns meaning.
pub trait Service: Send + Sync + 'static {
    /// The counters, clock and shutdown signal of this process.
    fn state(&self) -> &Arc<ServerState>;

    /// Answers one command.
    fn handle<'a>(
        &'a self,
        client: &'a mut ClientState,
        req: &'a CommandRequest,
    ) -> BoxFuture<'a, Response>;

    /// Called once when a client connection ends, to release what only that connection could
    /// use (its cursors, for the router).
    fn connection_closed<'a>(&'a self, _client: &'a ClientState) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}
