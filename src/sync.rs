//! Locking that a panic cannot poison for good.
//!
//! A panic while one request holds a lock is caught at the request boundary (the frontend
//! fails that request with InternalError and goes on); the lock it held is then poisoned. Every
//! lock in Sluice is taken through [`lock`], which takes the data back from a poisoned mutex,
//! so one failed request never turns into every later request failing.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering the data if an earlier panic poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f`, a computation that can take long (a pipeline run in process: its cost grows
/// with what the request asks, up to seconds), without holding up the other tasks of the
/// runtime worker it is called on. On a multi-threaded runtime the worker hands its other
/// tasks to another thread while `f` runs (`tokio::task::block_in_place`), so one request's
/// computation never delays another connection's; elsewhere (a current-thread runtime, no
/// runtime) `f` simply runs.
pub fn off_the_worker<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
