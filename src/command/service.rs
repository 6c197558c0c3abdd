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

    /// Where the users and roles live besides the listener's memory and files (`None`: only
    /// there).
    fn user_store(&self) -> Option<UserStore> {
        None
    }
}

/// Where a server's users and custom roles are kept, when not only in its own memory.
#[derive(Clone)]
pub enum UserStore {
    /// This server holds them and keeps a copy in its own `admin.system.users` and
    /// `admin.system.roles` collections, as mongod does (an embedded shard or config server):
    /// called with every user and role document after each change.
    Local(Arc<dyn Fn(Vec<Document>, Vec<Document>) + Send + Sync>),
    /// Another server holds them (the config server of a `--configdb` router): the user and
    /// role commands are run there, and its documents are read again on a period.
    Remote(Arc<dyn RemoteUsers>),
}

impl std::fmt::Debug for UserStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UserStore::Local(_) => f.write_str("UserStore::Local"),
            UserStore::Remote(r) => write!(f, "UserStore::Remote({})", r.name()),
        }
    }
}

/// Every `admin.system.users` and `admin.system.roles` document of a deployment.
pub type AuthorizationDocuments = (Vec<Document>, Vec<Document>);

/// The server that holds the users and roles of a router (the config server).
pub trait RemoteUsers: Send + Sync {
    /// Its name, for the log.
    fn name(&self) -> String;
    /// Runs a user- or role-management command there, in `db`; an error reply is returned as
    /// its error.
    fn run<'a>(
        &'a self,
        db: &'a str,
        command: Document,
    ) -> BoxFuture<'a, Result<Document, super::CommandError>>;
    /// Reads every user and role document (`admin.system.users`, `admin.system.roles`).
    fn load(&self) -> BoxFuture<'_, Result<AuthorizationDocuments, String>>;
}
