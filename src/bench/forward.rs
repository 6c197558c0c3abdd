//! `sluice forward`: a plain TCP forwarder, the hop with no logic. Every accepted connection is
//! joined to a new connection to the target with `tokio::io::copy_bidirectional`; nothing is
//! parsed. `bench overhead` puts it between the same driver and the same shard as the router,
//! so that the router's figures can be read against the physical limit of any router: the cost
//! of the extra hop itself.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};

/// Listens on `listen`, prints `forwarder listening on ADDR.` (what the benchmark waits for)
/// and forwards every connection to `to` until the process is stopped.
pub async fn serve(listen: &str, to: SocketAddr) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("forwarder listening on {}.", listener.local_addr()?);
    loop {
        let (mut client, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                eprintln!("forwarder: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            let Ok(mut upstream) = TcpStream::connect(to).await else {
                return;
            };
            let _ = upstream.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        });
    }
}
