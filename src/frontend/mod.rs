//! The client side of the router: the listener, one task per connection, and shutdown.
//!
//! [`start`] binds the configured address and returns a [`RouterHandle`]; the binary waits for
//! SIGINT/SIGTERM and calls [`RouterHandle::shutdown`], tests call it directly. Shutdown stops
//! accepting, lets every connection finish the request it is serving, then closes them.

mod connection;
mod listener;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::command::ServerState;
use crate::config::Config;

pub use listener::bind;

/// A running router.
#[derive(Debug)]
pub struct RouterHandle {
    addr: SocketAddr,
    state: Arc<ServerState>,
    shutdown: watch::Sender<bool>,
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

/// Binds the configured address and starts serving clients.
pub async fn start(config: Config, argv: Vec<String>) -> std::io::Result<RouterHandle> {
    let addr: SocketAddr = config.listen.parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("invalid listen address {:?}", config.listen),
        )
    })?;
    let listener = bind(addr, config.backlog)?;
    let addr = listener.local_addr()?;
    let (tx, rx) = watch::channel(false);
    let state = Arc::new(ServerState::new(config, argv, rx.clone()));
    let task = tokio::spawn(listener::accept_loop(listener, state.clone(), rx));
    Ok(RouterHandle {
        addr,
        state,
        shutdown: tx,
        task,
    })
}
