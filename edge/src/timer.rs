//! Waiting, natively (tokio) and in the Worker (wasm32: `setTimeout`), and racing a
//! future against a deadline without dropping it: a store call that misses its
//! answer deadline keeps running, so the pipeline can settle it later (a refund
//! when its request was refused after all).

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use futures_util::future::{Either, select};

/// Completes after `d`.
pub async fn sleep(d: Duration) {
    #[cfg(not(target_arch = "wasm32"))]
    tokio::time::sleep(d).await;
    #[cfg(target_arch = "wasm32")]
    {
        use wasm_bindgen::JsCast;
        let ms = i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
        let promise = js_sys::Promise::new(&mut |resolve, _reject| {
            let global = js_sys::global();
            let set_timeout = js_sys::Reflect::get(&global, &"setTimeout".into())
                .ok()
                .and_then(|f| f.dyn_into::<js_sys::Function>().ok());
            match set_timeout {
                Some(f) => {
                    let _ = f.call2(&global, &resolve, &ms.into());
                }
                None => {
                    let _ = resolve.call0(&global);
                }
            }
        });
        let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
    }
}

/// Elapsed time, also in wasm32 (where `std::time::Instant` panics). Natively
/// tokio's clock (the system's monotonic clock, or the paused clock of a test
/// runtime, so deadline tests measure virtual time).
pub struct Stopwatch(
    #[cfg(not(target_arch = "wasm32"))] tokio::time::Instant,
    #[cfg(target_arch = "wasm32")] f64,
);

impl Stopwatch {
    pub fn start() -> Self {
        #[cfg(not(target_arch = "wasm32"))]
        return Stopwatch(tokio::time::Instant::now());
        #[cfg(target_arch = "wasm32")]
        return Stopwatch(js_sys::Date::now());
    }

    pub fn elapsed(&self) -> Duration {
        #[cfg(not(target_arch = "wasm32"))]
        return self.0.elapsed();
        #[cfg(target_arch = "wasm32")]
        return Duration::from_secs_f64(((js_sys::Date::now() - self.0) / 1000.0).max(0.0));
    }
}

/// The outcome of [`race`].
pub enum Raced<T, F> {
    /// The future finished in time.
    Done(T),
    /// The deadline came first; the future, still running, is handed back.
    Late(F),
}

/// Polls `fut` until it finishes or `limit` passes, whichever comes first. A
/// future that finishes at once is never timed out (it is polled first).
pub async fn race<F: Future + Unpin>(mut fut: F, limit: Duration) -> Raced<F::Output, F> {
    let timer = pin!(sleep(limit));
    match select(&mut fut, timer).await {
        Either::Left((out, _)) => Raced::Done(out),
        Either::Right(((), _)) => Raced::Late(fut),
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ready_future_wins_even_against_a_zero_deadline() {
        assert!(matches!(
            race(Box::pin(async { 7 }), Duration::ZERO).await,
            Raced::Done(7)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_future_is_handed_back_still_running() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let watch = Stopwatch::start();
        let Raced::Late(rx) = race(rx, Duration::from_millis(10)).await else {
            panic!("nothing was sent yet");
        };
        assert_eq!(
            watch.elapsed(),
            Duration::from_millis(10),
            "given up at exactly the deadline (paused clock)"
        );
        tx.send(3).unwrap();
        assert_eq!(rx.await.unwrap(), 3, "the late future still delivers");
    }
}
