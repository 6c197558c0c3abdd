//! The client side of the router: the listener, one task per connection, and shutdown.
//!
//! [`start`] binds the configured address and returns a [`RouterHandle`]; the binary waits for
//! SIGINT/SIGTERM and calls [`RouterHandle::shutdown`], tests call it directly. Shutdown stops
//! accepting, lets every connection finish the request it is serving, then closes them.
//! [`security`] holds what the connections share about users, authorization and TLS, and the
//! one hook each request passes through.

mod connection;
mod listener;
pub mod memory;
pub mod security;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::command::ServerState;
use crate::config::Config;

pub use listener::bind;

// The service contract lives in `command`, below both the frontend and the services.
pub use crate::command::service::{BoxFuture, Response, Service};

/// A running listener (the router's, or an embedded shard's).
pub struct RouterHandle {
    addr: SocketAddr,
    state: Arc<ServerState>,
    shutdown: Arc<watch::Sender<bool>>,
    task: JoinHandle<()>,
}

impl RouterHandle {
    /// The address clients connect to (with the real port when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shared state (counters, clock).
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Stops accepting, waits for in-flight requests (up to the configured grace period), and
    /// closes every connection.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }

    /// Waits until the router stops (after [`RouterHandle::shutdown`] from elsewhere).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

impl std::fmt::Debug for RouterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterHandle")
            .field("addr", &self.addr)
            .finish()
    }
}

/// Binds the configured address and serves `make(state)`'s commands on it.
pub async fn start_service(
    config: Config,
    argv: Vec<String>,
    make: impl FnOnce(Arc<ServerState>) -> Arc<dyn Service>,
) -> std::io::Result<RouterHandle> {
    let addr: SocketAddr = config.listen.parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("invalid listen address {:?}", config.listen),
        )
    })?;
    let security = Arc::new(
        security::Security::from_config(&config)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
    );
    let listener = bind(addr, config.backlog)?;
    start_service_on(listener, security, config, argv, make)
}

/// Serves `make(state)`'s commands on a listener already bound (an embedded replica set binds
/// every member before any starts, so each member's `hello` lists them all).
pub fn start_service_on_listener(
    listener: tokio::net::TcpListener,
    config: Config,
    argv: Vec<String>,
    make: impl FnOnce(Arc<ServerState>) -> Arc<dyn Service>,
) -> std::io::Result<RouterHandle> {
    let security = Arc::new(
        security::Security::from_config(&config)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
    );
    start_service_on(listener, security, config, argv, make)
}

fn start_service_on(
    listener: tokio::net::TcpListener,
    security: Arc<security::Security>,
    config: Config,
    argv: Vec<String>,
    make: impl FnOnce(Arc<ServerState>) -> Arc<dyn Service>,
) -> std::io::Result<RouterHandle> {
    let addr = listener.local_addr()?;
    let (tx, rx) = watch::channel(false);
    let tx = Arc::new(tx);
    let state = Arc::new(ServerState::new(config, argv, tx.clone()));
    let service = make(state.clone());
    memory::start_idle_trimmer();
    security.attach(service.user_store());
    let task = tokio::spawn(listener::accept_loop(listener, service, security, rx));
    Ok(RouterHandle {
        addr,
        state,
        shutdown: tx,
        task,
    })
}
