//! Floodgate's edge: the stores that run the token-bucket script against Redis,
//! and (with the edge issue) the request pipeline and its two hosts.

pub mod breaker;
pub mod fallback;
pub mod pipeline;
pub mod stats;
pub mod store;

#[cfg(feature = "native")]
pub mod admin;
#[cfg(feature = "native")]
pub mod cli;
#[cfg(feature = "native")]
pub mod demo_upstream;
#[cfg(feature = "native")]
pub mod lease;
#[cfg(feature = "native")]
pub mod native_host;
#[cfg(feature = "native")]
pub mod rest_endpoint;

/// Locks a mutex even when a thread panicked while holding it. The state behind
/// the request path's locks (caches, queues, counters, the breaker) is consistent
/// at every point a panic could leave it, so one panicking request must not turn
/// every later one into a panic ("poisoned lock").
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Completes on Ctrl-C or SIGTERM: the native servers stop gracefully on either.
#[cfg(feature = "native")]
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_recovered() {
        let m = std::sync::Arc::new(std::sync::Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
