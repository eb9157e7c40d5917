//! The store calls this instance has out (global and regional, every
//! [`super::guarded::Guarded`] call): how many, how many came back, and a wake-up
//! when the first goes out. The native host polls its I/O while calls are out
//! instead of letting its CPU sleep (`native_host::idle_poll`); the Worker does
//! not look.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;

use futures_util::task::AtomicWaker;

/// Store calls out, shared by the pipeline's stores.
#[derive(Default)]
pub struct CallsOut {
    out: AtomicUsize,
    /// Calls back (answered, failed or given up on), ever.
    back: AtomicU64,
    /// Times the count went from none to one, ever.
    waves: AtomicU64,
    first: AtomicWaker,
}

/// One call out; dropped when it is back (or given up on).
pub struct Out<'a>(&'a CallsOut);

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.0.out.fetch_sub(1, Ordering::AcqRel);
        self.0.back.fetch_add(1, Ordering::Release);
    }
}

impl CallsOut {
    /// A call goes out.
    pub fn send(&self) -> Out<'_> {
        if self.out.fetch_add(1, Ordering::AcqRel) == 0 {
            self.waves.fetch_add(1, Ordering::Release);
            self.first.wake();
        }
        Out(self)
    }

    /// Calls out now.
    pub fn out(&self) -> usize {
        self.out.load(Ordering::Acquire)
    }

    /// Calls back so far (a change: a reply, or a call given up on).
    pub fn back(&self) -> u64 {
        self.back.load(Ordering::Acquire)
    }

    /// Waits for a wave after `seen` (a first call out after none): returns the
    /// wave's number.
    pub async fn next_wave(&self, seen: u64) -> u64 {
        std::future::poll_fn(|cx| {
            self.first.register(cx.waker());
            match self.waves.load(Ordering::Acquire) {
                w if w > seen => Poll::Ready(w),
                _ => Poll::Pending,
            }
        })
        .await
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_call_out_starts_a_wave_and_replies_are_counted() {
        let calls = std::sync::Arc::new(CallsOut::default());
        let waiting = tokio::spawn({
            let calls = calls.clone();
            async move { calls.next_wave(0).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "nothing out yet");
        let a = calls.send();
        let b = calls.send();
        assert_eq!(waiting.await.unwrap(), 1, "one wave for two calls");
        assert_eq!((calls.out(), calls.back()), (2, 0));
        drop(a);
        assert_eq!((calls.out(), calls.back()), (1, 1));
        drop(b);
        let _c = calls.send();
        assert_eq!(
            calls.next_wave(1).await,
            2,
            "none out, then one: a new wave"
        );
        assert_eq!((calls.out(), calls.back()), (1, 2));
    }
}
