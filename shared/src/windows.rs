//! The window algorithms, as pure transitions: the twins of their branches in
//! `lua/limiter.lua`. Each limits a bucket to `limit` (the quota's capacity) per
//! `period`; they differ in how the period is measured.
//!
//! - **Fixed window**: a counter per aligned window (`now / period`). Cheap, but a
//!   client can send `limit` at the end of one window and `limit` again at the start
//!   of the next: up to 2× the limit within a short span (the boundary burst).
//! - **Sliding-window log**: one timestamp per admitted token; a request fits when
//!   fewer than `limit` remain within the last `period`. Exact, and the costliest in
//!   memory: one sorted-set entry per token (bounded by `limit`, itself bounded by
//!   [`MAX_LOG_LIMIT`]).
//! - **Sliding-window counter**: the current and previous aligned windows' counts,
//!   the previous weighted by how much of it still overlaps the sliding window
//!   (`prev × (period − elapsed) / period + curr`). Two integers; approximate
//!   (its error against the log is measured in `docs/algorithms.md`).
//!
//! The weighted estimate is computed in IEEE doubles with the same operations in the
//! same order as the script, so both sides agree bit for bit.

use std::collections::VecDeque;

use crate::bucket::{Admission, Decision};
use crate::calendar::CalendarPeriod;
use crate::time::Micros;

/// The largest limit a sliding-window log accepts (entries per bucket).
pub const MAX_LOG_LIMIT: u64 = 10_000;

fn window_of(now: Micros, period: Micros) -> i64 {
    now.div_euclid(period)
}

/// A fixed window's stored state: the window index and its count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedWindow {
    pub window: i64,
    pub count: u64,
}

impl FixedWindow {
    /// The count in force at `now` (a stored count of an older window is 0).
    pub fn count_at(prev: Option<FixedWindow>, period: Micros, now: Micros) -> u64 {
        prev.filter(|p| p.window == window_of(now, period))
            .map_or(0, |p| p.count)
    }
}

/// One fixed-window decision from the count in force at `now`; returns the decision
/// and, when admitted, the state to store.
pub fn fixed_window(
    count: u64,
    limit: u64,
    period: Micros,
    now: Micros,
    cost: u32,
) -> (Decision, Option<FixedWindow>) {
    let window = window_of(now, period);
    let d = window_decision(count, limit, (window + 1) * period, now, cost);
    let state = d.allowed().then(|| FixedWindow {
        window,
        count: count + u64::from(cost),
    });
    (d, state)
}

/// A counter of a window ending at `end` holding `count`, deciding `cost` more.
fn window_decision(count: u64, limit: u64, end: Micros, now: Micros, cost: u32) -> Decision {
    let cost = u64::from(cost);
    if count + cost <= limit {
        let after = count + cost;
        Decision {
            outcome: Admission::Allowed,
            limit,
            remaining: limit - after,
            now,
            full_at: if after > 0 { end } else { now },
        }
    } else {
        Decision {
            outcome: Admission::Denied {
                retry_after: (cost <= limit).then_some(end - now),
            },
            limit,
            remaining: limit.saturating_sub(count),
            now,
            full_at: end,
        }
    }
}

/// One calendar-quota decision (`period: "day"` or `"month"`): a fixed window
/// whose window is the UTC calendar's ([`crate::calendar`]), `count` being the
/// count of the window `now` falls in. The reset and any wait point at the
/// window's end (00:00 UTC of the next day, or of the next month's 1st).
pub fn calendar_window(
    count: u64,
    limit: u64,
    period: CalendarPeriod,
    now: Micros,
    cost: u32,
) -> Decision {
    window_decision(count, limit, period.window(now).reset, now, cost)
}

/// A sliding-window log's state: admitted tokens' instants, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLog {
    pub entries: VecDeque<Micros>,
}

/// What the script reports of a log: the count within the window, the instant of
/// the entry whose expiry makes room for this request (when denied and it ever
/// can), and the newest entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogSummary {
    pub count: u64,
    pub needed: Micros,
    pub newest: Micros,
}

impl SlidingLog {
    /// Drops the entries that have left the window ending at `now`.
    pub fn trim(&mut self, period: Micros, now: Micros) {
        while self.entries.front().is_some_and(|t| *t <= now - period) {
            self.entries.pop_front();
        }
    }

    /// The summary the script would report at `now` (after trimming).
    pub fn summary(&self, limit: u64, cost: u32) -> LogSummary {
        let count = self.entries.len() as u64;
        let need = count + u64::from(cost);
        let needed = if need > limit && u64::from(cost) <= limit {
            self.entries[(need - limit - 1) as usize]
        } else {
            0
        };
        LogSummary {
            count,
            needed,
            newest: self.entries.back().copied().unwrap_or(0),
        }
    }

    /// One full transition: trim, decide, record the admitted tokens.
    pub fn decide(&mut self, limit: u64, period: Micros, now: Micros, cost: u32) -> Decision {
        self.trim(period, now);
        let d = sliding_log(self.summary(limit, cost), limit, period, now, cost);
        if d.allowed() {
            self.entries.extend(std::iter::repeat_n(now, cost as usize));
        }
        d
    }
}

/// One sliding-log decision from the script's summary.
pub fn sliding_log(s: LogSummary, limit: u64, period: Micros, now: Micros, cost: u32) -> Decision {
    let cost = u64::from(cost);
    if s.count + cost <= limit {
        Decision {
            outcome: Admission::Allowed,
            limit,
            remaining: limit - s.count - cost,
            now,
            full_at: if s.count + cost > 0 {
                now + period
            } else {
                now
            },
        }
    } else {
        Decision {
            outcome: Admission::Denied {
                retry_after: (cost <= limit).then(|| (s.needed + period - now).max(1)),
            },
            limit,
            remaining: limit.saturating_sub(s.count),
            now,
            full_at: if s.count > 0 { s.newest + period } else { now },
        }
    }
}

/// A sliding-window counter's stored state: the window index, its count and the
/// previous window's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlidingCounter {
    pub window: i64,
    pub curr: u64,
    pub prev: u64,
}

impl SlidingCounter {
    /// `(curr, prev)` as seen from the window of `now`.
    pub fn aligned(prev: Option<SlidingCounter>, period: Micros, now: Micros) -> (u64, u64) {
        let w = window_of(now, period);
        match prev {
            Some(p) if p.window == w => (p.curr, p.prev),
            Some(p) if p.window == w - 1 => (0, p.curr),
            _ => (0, 0),
        }
    }
}

/// The weighted count at `now`, exactly as the script computes it.
pub fn estimate(curr: u64, prev: u64, period: Micros, now: Micros) -> f64 {
    let elapsed = now - window_of(now, period) * period;
    prev as f64 * ((period - elapsed) as f64 / period as f64) + curr as f64
}

fn counter_fits(curr: u64, prev: u64, limit: u64, period: Micros, now: Micros, cost: u64) -> bool {
    estimate(curr, prev, period, now) + cost as f64 <= limit as f64
}

/// The first instant in `[from, to)` at which `fits` holds, when it is monotone
/// (false then true) over that range.
fn first_true(from: Micros, to: Micros, fits: impl Fn(Micros) -> bool) -> Option<Micros> {
    if from >= to || !fits(to - 1) {
        return None;
    }
    let (mut lo, mut hi) = (from, to - 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) { hi = mid } else { lo = mid + 1 }
    }
    Some(lo)
}

/// One sliding-counter decision from the aligned counts; returns the decision and,
/// when admitted, the state to store. `retry_after` is the exact first instant at
/// which the same request fits (the estimate only falls while no traffic comes).
pub fn sliding_counter(
    curr: u64,
    prev: u64,
    limit: u64,
    period: Micros,
    now: Micros,
    cost: u32,
) -> (Decision, Option<SlidingCounter>) {
    let window = window_of(now, period);
    let end = (window + 1) * period;
    let cost64 = u64::from(cost);
    let est = estimate(curr, prev, period, now);
    let full_at = if curr > 0 {
        end + period
    } else if prev > 0 {
        end
    } else {
        now
    };
    if est + cost64 as f64 <= limit as f64 {
        let after = curr + cost64;
        let left = limit as f64 - est - cost64 as f64;
        let d = Decision {
            outcome: Admission::Allowed,
            limit,
            remaining: left.max(0.0).floor() as u64,
            now,
            full_at: if after > 0 { end + period } else { full_at },
        };
        (
            d,
            Some(SlidingCounter {
                window,
                curr: after,
                prev,
            }),
        )
    } else {
        let retry = if cost64 > limit {
            None
        } else {
            // this window (curr and prev as they are), else the next one (curr
            // becomes prev), else the one after (both gone: it fits at its start)
            first_true(now + 1, end, |t| {
                counter_fits(curr, prev, limit, period, t, cost64)
            })
            .or_else(|| {
                first_true(end, end + period, |t| {
                    counter_fits(0, curr, limit, period, t, cost64)
                })
            })
            .or(Some(end + period))
            .map(|t| t - now)
        };
        let d = Decision {
            outcome: Admission::Denied { retry_after: retry },
            limit,
            remaining: (limit as f64 - est).max(0.0).floor() as u64,
            now,
            full_at,
        };
        (d, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Micros = 1_000_000;

    #[test]
    fn a_fixed_window_admits_twice_its_limit_across_a_window_edge() {
        // limit 10 per 1 s: 10 at 0.9 s and 10 at 1.1 s — 20 within 0.2 s
        let (limit, period) = (10, S);
        let mut state = None;
        let mut admitted = 0;
        for t in [900_000, 1_100_000] {
            for _ in 0..15 {
                let count = FixedWindow::count_at(state, period, t);
                let (d, w) = fixed_window(count, limit, period, t, 1);
                if let Some(w) = w {
                    state = Some(w);
                }
                admitted += u64::from(d.allowed());
            }
        }
        assert_eq!(admitted, 2 * limit);
        // the sliding log admits only the limit over the same traffic
        let mut log = SlidingLog::default();
        let admitted: u64 = [900_000, 1_100_000]
            .iter()
            .flat_map(|t| std::iter::repeat_n(*t, 15))
            .map(|t| u64::from(log.decide(limit, period, t, 1).allowed()))
            .sum();
        assert_eq!(admitted, limit);
    }

    fn counter_run(limit: u64, period: Micros, arrivals: &[(Micros, u32)]) -> Vec<Decision> {
        let mut state: Option<SlidingCounter> = None;
        arrivals
            .iter()
            .map(|&(t, cost)| {
                let (c, p) = SlidingCounter::aligned(state, period, t);
                let (d, w) = sliding_counter(c, p, limit, period, t, cost);
                if w.is_some() {
                    state = w;
                }
                d
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn the_log_never_admits_more_than_the_limit_in_any_window(
            limit in 1u64..20,
            period in 1i64..5_000,
            gaps in proptest::collection::vec((0i64..400, 1u32..4), 1..150),
        ) {
            let mut log = SlidingLog::default();
            let mut now = 10_000;
            let mut admitted: Vec<Micros> = vec![];
            for (gap, cost) in gaps {
                now += gap;
                let d = log.decide(limit, period, now, cost);
                if d.allowed() {
                    admitted.extend(std::iter::repeat_n(now, cost as usize));
                } else if let Admission::Denied { retry_after: Some(w) } = d.outcome {
                    // the same request fits exactly at retry_after, not 1 µs before
                    let mut later = log.clone();
                    prop_assert!(later.decide(limit, period, now + w, cost).allowed());
                    if w > 1 {
                        let mut earlier = log.clone();
                        prop_assert!(!earlier.decide(limit, period, now + w - 1, cost).allowed());
                    }
                }
            }
            for (i, t) in admitted.iter().enumerate() {
                let within = admitted[i..].iter().filter(|u| **u < t + period).count() as u64;
                prop_assert!(within <= limit);
            }
        }

        #[test]
        fn a_fixed_window_admits_at_most_the_limit_per_aligned_window_and_retry_is_exact(
            limit in 1u64..20,
            period in 1i64..5_000,
            gaps in proptest::collection::vec((0i64..400, 1u32..4), 1..150),
        ) {
            let mut state = None;
            let mut now = 10_000;
            let mut per_window = std::collections::BTreeMap::new();
            for (gap, cost) in gaps {
                now += gap;
                let count = FixedWindow::count_at(state, period, now);
                let (d, w) = fixed_window(count, limit, period, now, cost);
                if let Some(w) = w {
                    state = Some(w);
                    *per_window.entry(now / period).or_insert(0) += u64::from(cost);
                } else if let Admission::Denied { retry_after: Some(r) } = d.outcome {
                    let c = FixedWindow::count_at(state, period, now + r);
                    prop_assert!(fixed_window(c, limit, period, now + r, cost).0.allowed());
                    let c = FixedWindow::count_at(state, period, now + r - 1);
                    prop_assert!(!fixed_window(c, limit, period, now + r - 1, cost).0.allowed());
                }
            }
            prop_assert!(per_window.values().all(|n| *n <= limit));
        }

        #[test]
        fn the_counter_retries_exactly_and_stays_within_twice_the_limit(
            limit in 1u64..20,
            period in 2i64..5_000,
            gaps in proptest::collection::vec((0i64..400, 1u32..4), 1..150),
        ) {
            let mut state: Option<SlidingCounter> = None;
            let mut now = 10_000;
            let mut admitted: Vec<Micros> = vec![];
            for (gap, cost) in gaps {
                now += gap;
                let (c, p) = SlidingCounter::aligned(state, period, now);
                let (d, w) = sliding_counter(c, p, limit, period, now, cost);
                if let Some(w) = w {
                    state = Some(w);
                    admitted.extend(std::iter::repeat_n(now, cost as usize));
                } else if let Admission::Denied { retry_after: Some(r) } = d.outcome {
                    let at = |t: Micros| {
                        let (c, p) = SlidingCounter::aligned(state, period, t);
                        sliding_counter(c, p, limit, period, t, cost).0.allowed()
                    };
                    prop_assert!(at(now + r), "fits at retry_after");
                    prop_assert!(r == 1 || !at(now + r - 1), "not 1 µs before");
                }
            }
            // an estimate, not exact: never above 2× the limit in any period
            for (i, t) in admitted.iter().enumerate() {
                let within = admitted[i..].iter().filter(|u| **u < t + period).count() as u64;
                prop_assert!(within <= 2 * limit);
            }
        }
    }

    #[test]
    fn the_counter_weighs_the_previous_window() {
        // 10 per second; 10 at 0.5 s fill window 0. At 1.5 s half of it still
        // counts (5), so 5 more fit.
        let mut arrivals = vec![(500_000, 1); 10];
        arrivals.extend(vec![(1_500_000, 1); 8]);
        let d = counter_run(10, S, &arrivals);
        let allowed_late = d[10..].iter().filter(|d| d.allowed()).count();
        assert_eq!(allowed_late, 5);
    }
}
