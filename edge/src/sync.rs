//! Locks on the request path that survive a panic elsewhere: a thread that
//! panicked while holding one leaves data that is still consistent for our uses
//! (counters, caches), so the next request takes the lock instead of panicking too.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, recovering the guard if another thread panicked while holding it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_anyway() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("while holding the lock");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
