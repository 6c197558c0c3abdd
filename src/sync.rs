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
