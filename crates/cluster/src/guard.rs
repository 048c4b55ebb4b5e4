//! Locking a std mutex without caring about poisoning.

use std::sync::{Mutex, MutexGuard};

/// Locks, ignoring poisoning: every critical section leaves its data consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
