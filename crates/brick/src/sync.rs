//! Locks that outlive a panic: a connection thread that panicked while holding one leaves data
//! that is still consistent (every critical section is a few plain updates), so the brick goes
//! on serving its other connections.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
