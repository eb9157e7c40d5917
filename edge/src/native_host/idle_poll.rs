//! Polling instead of sleeping while a store call is out (natively).
//!
//! An edge whose requests all wait for one store call has nothing to run until
//! the reply: its event loop parks, and the CPU halts. On a virtual machine that
//! halt is an exit to the hypervisor, the wake-up an interrupt from the CPU the
//! reply came through, and the host may run other work on the core meanwhile —
//! the edge then pays for the nap in every instruction after it (cold caches).
//! Measured on this project's 2-CPU VM with Redis on the other CPU: the edge's
//! CPU per request rose from 18 to 23 µs, and it sat idle 7 % of the time
//! (`docs/development.md`).
//!
//! So while calls are out the host keeps its event loop turning — each turn polls
//! the I/O without blocking and offers the CPU to other runnable processes
//! (`sched_yield`), such as a Redis on the same CPU — for at most `budget` without
//! a reply, as servers built for short waits do (Seastar polls 200 µs before it
//! sleeps; the kernel's `haltpoll` does the same for a guest's idle CPU). A store
//! farther away than the budget (a reply later than `budget`) costs one budget of
//! polling, then polling backs off: the next 1, 2, 4 … 256 waves of calls are
//! waited for asleep, until one comes back within the budget again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::pipeline::calls_out::CallsOut;

/// The default budget: polled at most this long without a reply.
pub const DEFAULT_BUDGET: Duration = Duration::from_micros(200);

/// Waves of calls waited for asleep after polling found no reply within the
/// budget, at most (doubling from 1).
const MOST_SKIPPED: u32 = 256;

/// Whether to poll through the next wave of calls: skips a doubling number of
/// waves after each poll that ran out of budget, none after a poll that saw the
/// calls back.
#[derive(Debug, Default)]
pub struct Backoff {
    /// Waves to skip after a failed poll (0: poll).
    skip_next: u32,
    left: u32,
}

impl Backoff {
    /// Poll through this wave?
    pub fn poll(&mut self) -> bool {
        if self.left == 0 {
            return true;
        }
        self.left -= 1;
        false
    }

    /// The poll ended: every call was back (`true`), or `budget` passed without a
    /// reply (`false`).
    pub fn polled(&mut self, back: bool) {
        self.skip_next = match back {
            true => 0,
            false => (self.skip_next * 2).clamp(1, MOST_SKIPPED),
        };
        self.left = self.skip_next;
    }
}

/// How a poll through one wave ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Polled {
    /// Every call came back.
    Back,
    /// `budget` passed without a reply.
    Silent,
}

/// Waves of store calls by how the host waited for them (the instance's
/// `floodgate_idle_poll_waves` metric).
#[derive(Debug, Default)]
pub struct PollStats {
    /// Polled until every call was back.
    pub back: AtomicU64,
    /// Polled for the budget without a reply, then slept.
    pub silent: AtomicU64,
    /// Slept through (backing off after a silent one).
    pub asleep: AtomicU64,
}

impl PollStats {
    /// `[back, silent, asleep]`.
    pub fn counts(&self) -> [u64; 3] {
        [&self.back, &self.silent, &self.asleep].map(|c| c.load(Ordering::Relaxed))
    }
}

/// Polls while `calls` are out and each reply came within `budget` of the one
/// before (or of the start).
pub async fn poll_wave(calls: &CallsOut, budget: Duration) -> Polled {
    let mut since = Instant::now();
    let mut back = calls.back();
    loop {
        if calls.out() == 0 {
            return Polled::Back;
        }
        let now = calls.back();
        if now != back {
            (back, since) = (now, Instant::now());
        } else if since.elapsed() >= budget {
            return Polled::Silent;
        }
        // another process runnable on this CPU (a Redis beside the edge) goes
        // first; then one turn of the event loop: its I/O polled without blocking
        std::thread::yield_now();
        tokio::task::yield_now().await;
    }
}

/// Runs for as long as the host: polls through each wave of store calls unless
/// backing off (`budget` zero: never).
pub async fn run(calls: Arc<CallsOut>, budget: Duration, stats: Arc<PollStats>) {
    if budget.is_zero() {
        return;
    }
    let (mut seen, mut backoff) = (0, Backoff::default());
    loop {
        seen = calls.next_wave(seen).await;
        let counter = match backoff.poll() {
            true => {
                let polled = poll_wave(&calls, budget).await;
                backoff.polled(polled == Polled::Back);
                match polled {
                    Polled::Back => &stats.back,
                    Polled::Silent => &stats.silent,
                }
            }
            false => &stats.asleep,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_backs_off_doubling_after_silence_and_resumes_after_a_reply() {
        let mut b = Backoff::default();
        assert!(b.poll(), "polls at first");
        let mut skipped = vec![];
        for _ in 0..10 {
            b.polled(false);
            let mut n = 0;
            while !b.poll() {
                n += 1;
            }
            skipped.push(n);
        }
        assert_eq!(skipped, [1, 2, 4, 8, 16, 32, 64, 128, 256, 256]);
        b.polled(true);
        assert!(
            b.poll() && b.poll(),
            "a wave that came back: polls every wave"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wave_is_polled_until_its_calls_are_back() {
        let calls = Arc::new(CallsOut::default());
        let out = calls.send();
        let poll = tokio::spawn({
            let calls = calls.clone();
            async move { poll_wave(&calls, Duration::from_secs(3600)).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!poll.is_finished(), "polls while the call is out");
        drop(out);
        assert_eq!(poll.await.unwrap(), Polled::Back);
    }

    #[tokio::test]
    async fn a_silent_store_ends_the_poll_after_the_budget() {
        let calls = CallsOut::default();
        let _out = calls.send();
        let start = Instant::now();
        let budget = Duration::from_millis(2);
        assert_eq!(poll_wave(&calls, budget).await, Polled::Silent);
        assert!(start.elapsed() >= budget, "not before the budget");
    }

    /// A store farther away than the budget: each polled wave runs out of budget,
    /// and the host sleeps through a doubling number of waves after each. On the
    /// paused clock a call's millisecond passes only once the poller stops
    /// (the runtime idles), so however slow the machine, no reply comes within
    /// the (real) budget.
    #[tokio::test(start_paused = true)]
    async fn a_far_store_is_mostly_waited_for_asleep() {
        let (calls, stats) = (
            Arc::new(CallsOut::default()),
            Arc::new(PollStats::default()),
        );
        let poller = tokio::spawn(run(
            calls.clone(),
            Duration::from_micros(200),
            stats.clone(),
        ));
        for _ in 0..40 {
            let out = calls.send();
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(out);
            tokio::task::yield_now().await;
        }
        poller.abort();
        let [back, silent, asleep] = stats.counts();
        assert_eq!(back, 0, "no reply came within the budget");
        // polled at waves 1, 3, 6, 11, 20, 37 (skipping 1, 2, 4, 8, 16 between)
        assert_eq!((silent, asleep), (6, 34));
    }

    #[tokio::test]
    async fn a_near_store_is_polled_through_every_wave() {
        let (calls, stats) = (
            Arc::new(CallsOut::default()),
            Arc::new(PollStats::default()),
        );
        let poller = tokio::spawn(run(calls.clone(), Duration::from_secs(3600), stats.clone()));
        for _ in 0..10 {
            let out = calls.send();
            tokio::task::yield_now().await;
            drop(out);
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
        }
        poller.abort();
        assert_eq!(stats.counts(), [10, 0, 0]);
    }

    #[tokio::test]
    async fn nothing_runs_without_a_budget() {
        let calls = Arc::new(CallsOut::default());
        let _out = calls.send();
        // returns at once, although a call is out
        run(calls.clone(), Duration::ZERO, Arc::default()).await;
    }
}
