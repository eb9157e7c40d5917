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
///
/// When the deadline passes, what has already arrived is let through first: the
/// timer may fire in the same turn of the event loop as the reply that answers
/// `fut`, and that reply then still has tasks to cross (the connection's reader,
/// the batch's leader) before `fut` sees it. On a saturated edge a turn takes
/// milliseconds, so without this a reply that came in time was taken for a
/// silent store, and five of them in a row opened the breaker of a healthy
/// store (fail-closed 503s under load). `fut` is Late only if it is still
/// pending after [`SETTLE_TURNS`] more turns.
pub async fn race<F: Future + Unpin>(mut fut: F, limit: Duration) -> Raced<F::Output, F> {
    let timer = pin!(sleep(limit));
    match select(&mut fut, timer).await {
        Either::Left((out, _)) => Raced::Done(out),
        Either::Right(((), _)) => {
            for _ in 0..SETTLE_TURNS {
                next_turn().await;
                if let Some(out) = futures_util::future::poll_immediate(&mut fut).await {
                    return Raced::Done(out);
                }
            }
            Raced::Late(fut)
        }
    }
}

/// Turns of the event loop a deadline's expiry waits for what already arrived:
/// a reply crosses at most three tasks (the connection's reader, the batch's
/// leader, the caller).
pub const SETTLE_TURNS: usize = 3;

/// Returns after the event loop has polled its I/O once more: natively tokio's
/// `yield_now` (deferred until the driver was polled), in the Worker a
/// `setTimeout(0)` (queued behind the I/O callbacks already due).
pub async fn next_turn() {
    #[cfg(not(target_arch = "wasm32"))]
    tokio::task::yield_now().await;
    #[cfg(target_arch = "wasm32")]
    sleep(Duration::ZERO).await;
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

    /// A reply that reached the edge at the deadline but still has tasks to cross
    /// (the connection's reader hands it to the batch's leader, which hands it to
    /// the caller) is an answer, not a late call: the timer fires in the same turn
    /// of the event loop as the reply's arrival.
    #[tokio::test(start_paused = true)]
    async fn a_reply_arriving_at_the_deadline_wins_through_its_hops() {
        let limit = Duration::from_millis(7);
        let (to_leader, at_leader) = tokio::sync::oneshot::channel::<u8>();
        let (to_caller, at_caller) = tokio::sync::oneshot::channel::<u8>();
        // the leader: passes the reply on to the caller
        tokio::spawn(async move {
            if let Ok(v) = at_leader.await {
                let _ = to_caller.send(v);
            }
        });
        // the reader: the reply arrives exactly when the caller's deadline passes
        tokio::spawn(async move {
            sleep(limit).await;
            let _ = to_leader.send(5);
        });
        match race(at_caller, limit).await {
            Raced::Done(v) => assert_eq!(v.unwrap(), 5),
            Raced::Late(_) => panic!("a reply that arrived at the deadline was taken as late"),
        }
    }

    /// A store that really is silent is still late, after a few more turns only.
    #[tokio::test(start_paused = true)]
    async fn a_silent_call_is_late_right_after_its_deadline() {
        let (_tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let watch = Stopwatch::start();
        assert!(matches!(
            race(rx, Duration::from_millis(7)).await,
            Raced::Late(_)
        ));
        assert_eq!(watch.elapsed(), Duration::from_millis(7), "no time added");
    }
}
