//! The client listener: a socket2-configured TCP socket (address reuse, backlog; `TCP_NODELAY`
//! on every accepted connection), a connection limit, and graceful shutdown.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::security::Security;
use super::{connection, Service};

/// Binds a listening socket with address reuse and the given backlog.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog.min(i32::MAX as u32) as i32)?;
    TcpListener::from_std(socket.into())
}

/// Accepts clients until `shutdown` flips, then waits up to the configured grace period for
/// open connections to finish their in-flight requests.
pub async fn accept_loop(
    listener: TcpListener,
    service: Arc<dyn Service>,
    security: Arc<Security>,
    mut shutdown: watch::Receiver<bool>,
) {
    let state = service.state().clone();
    let limit = Arc::new(Semaphore::new(state.config.max_connections));
    let mut connections = JoinSet::new();
    let mut backoff = Duration::from_millis(5);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(pair) => {
                        backoff = Duration::from_millis(5);
                        pair
                    }
                    Err(e) => {
                        // EMFILE and friends: wait a little instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    state.counters.connections_rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        %peer,
                        max_connections = state.config.max_connections,
                        "connection refused because too many open connections"
                    );
                    drop(socket);
                    continue;
                };
                if let Err(e) = socket.set_nodelay(true) {
                    tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                }
                let service = service.clone();
                let security = security.clone();
                let shutdown = shutdown.clone();
                connections.spawn(async move {
                    connection::serve(socket, peer, service, security, shutdown).await;
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    let grace = Duration::from_secs(state.config.shutdown_timeout_secs);
    let open = connections.len();
    if open > 0 {
        tracing::info!(open, "waiting for open connections to finish");
    }
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "shutdown grace period over; closing the remaining connections"
        );
        connections.shutdown().await;
    }
}
