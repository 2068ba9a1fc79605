//! Locks that outlive a panic: a thread that panicked while holding one leaves data that is
//! still consistent here (every critical section is a few plain updates), so the next holder
//! goes on rather than failing.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
