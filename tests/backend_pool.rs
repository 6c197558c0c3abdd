//! The shard connection pool against an embedded shard: connections are reused, evicted when
//! the shard closes them or goes away, warmed to `min_idle`, and bounded by `max_size`.

use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use sluice::backend::{PoolOptions, ShardPool};
use sluice::embedded::{EmbeddedShard, ShardOptions};
use sluice::value::error_codes::ErrorCode;

#[tokio::test]
async fn pool_reuses_and_evicts() {
    let shard = EmbeddedShard::start("127.0.0.1:0", ShardOptions::for_tests())
        .await
        .unwrap();
    let pool = Arc::new(ShardPool::new(
        "shard0",
        &shard.local_addr().to_string(),
        PoolOptions {
            max_size: 2,
            ..PoolOptions::default()
        },
    ));
    let r = pool
        .run_command(&doc! {"ping": 1, "$db": "admin"})
        .await
        .unwrap();
    assert_eq!(r.get_f64("ok").unwrap(), 1.0);
    assert_eq!(pool.idle_count(), 1, "returned to the pool");
    pool.run_command(&doc! {"ping": 1, "$db": "admin"})
        .await
        .unwrap();
    assert_eq!(pool.idle_count(), 1, "reused, not a second connection");

    // A connection the shard closes mid-exchange is not returned.
    pool.run_command(&doc! {"configureFailPoint": "failCommand", "mode": {"times": 1}, "data": {"failCommands": ["ping"], "closeConnection": true}, "$db": "admin"})
        .await
        .unwrap();
    let e = pool
        .run_command(&doc! {"ping": 1, "$db": "admin"})
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::HostUnreachable);
    // That request reached the shard: it may have been applied.
    assert!(e.maybe_applied(), "{e:?}");
    assert_eq!(pool.idle_count(), 0);
    assert!(pool
        .run_command(&doc! {"ping": 1, "$db": "admin"})
        .await
        .is_ok());

    // An idle connection whose shard went away is evicted at checkout.
    let addr = shard.local_addr().to_string();
    shard.shutdown().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let e = pool
        .run_command(&doc! {"ping": 1, "$db": "admin"})
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot connect"), "{e} ({addr})");
    // A request that never got a connection was never sent: the failure says so as data.
    assert!(
        matches!(e, sluice::backend::BackendError::Connect(_)) && !e.maybe_applied(),
        "{e:?}"
    );
    assert!(pool.evicted_count() >= 2);
}

#[tokio::test]
async fn pool_warms_to_min_idle() {
    let shard = EmbeddedShard::start("127.0.0.1:0", ShardOptions::default())
        .await
        .unwrap();
    let pool = Arc::new(ShardPool::new(
        "s",
        &shard.local_addr().to_string(),
        PoolOptions {
            min_idle: 3,
            ..PoolOptions::default()
        },
    ));
    pool.warm().await;
    assert_eq!(pool.idle_count(), 3);
    shard.shutdown().await;
}

#[tokio::test]
async fn pool_bounds_open_connections() {
    let shard = EmbeddedShard::start("127.0.0.1:0", ShardOptions::default())
        .await
        .unwrap();
    let pool = Arc::new(ShardPool::new(
        "s",
        &shard.local_addr().to_string(),
        PoolOptions {
            max_size: 1,
            connect_timeout: Duration::from_millis(200),
            ..PoolOptions::default()
        },
    ));
    let held = pool.checkout().await.unwrap();
    let e = pool.checkout().await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NetworkTimeout);
    drop(held);
    assert!(pool.checkout().await.is_ok());
    shard.shutdown().await;
}

/// A member that breaks the connection during the handshake (it is stopping or starting: the
/// kernel accepted the connection, nobody answers it) leaves a connection that never carried
/// a request: the failure is a failure to connect, never "may have been applied", so a write
/// without a session number may still go to the next member selected.
#[tokio::test]
async fn a_handshake_cut_short_is_a_failure_to_connect() {
    use sluice::backend::{BackendError, ShardConnection};
    use tokio::io::AsyncReadExt;

    // Closed after reading the handshake (EOF), reset (RST), or never answered.
    for how in ["close", "reset", "silent"] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 16];
            let _ = socket.read(&mut buf).await;
            match how {
                "close" => drop(socket),
                "reset" => {
                    // A zero linger makes the close a reset.
                    socket2::SockRef::from(&socket)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    drop(socket);
                }
                _ => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    drop(socket);
                }
            }
        });
        let e = ShardConnection::connect(&addr, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            matches!(e, BackendError::Connect(_)) && !e.maybe_applied(),
            "{how}: {e:?}"
        );
        assert!(e.to_string().starts_with("cannot connect to"), "{how}: {e}");
        server.abort();
    }
}
