//! The answer deadline of one store, derived from the latency it was observed to
//! answer with, as TCP derives its retransmission timeout from measured round
//! trips (RFC 6298: an initial value before any sample, a floor, a ceiling).
//!
//! Pure: no I/O, no clock — every call takes the instant (µs). The deadline is
//!
//! ```text
//! clamp(p99 of the recent replies × factor, floor, ceiling), raised by late replies
//! ```
//!
//! - **Recent replies**: the last [`RING`] latencies of calls that were answered
//!   (on time, or late but within the ceiling), those younger than `window`; when
//!   fewer than [`MIN_SAMPLES`] are that young, the newest [`MIN_SAMPLES`]
//!   whatever their age (an idle store keeps what was learned of it).
//! - **p99**: the `⌊0.99 n⌋`-th smallest (at least the first): the single slowest
//!   reply of fewer than 200 never counts, so one stall does not move it.
//! - **Learning**: with 1 to [`MIN_SAMPLES`] − 1 replies ever seen the spread is
//!   unknown and the deadline is the ceiling (patience while learning); with none
//!   at all (the store never answered) it is the floor, so a store that is down
//!   from the start is found out as fast as one that goes down later.
//! - **Late replies**: a reply that came after its deadline but within the ceiling
//!   (the store is slow, not down) raises the deadline at once to that latency ×
//!   factor; the raise halves every [`BOOST_HALF_LIFE`] µs, so one stall is
//!   forgotten within seconds while a store that keeps answering late keeps it up
//!   (and its late replies, being samples, soon move the p99 itself).
//! - **A far store**: [`FAR_AFTER`] replies in a row after the ceiling, none on
//!   time between them, are a store that answers but is further away than the
//!   ceiling allows (a global Redis across an ocean behind a RESP default of
//!   100 ms), not a stalled one (a stall is one late reply among timely ones):
//!   the ceiling rises to the smallest of them × factor, at most [`FAR_CEILING`].
//!   A store that never answers never raises it, so a dead one is still found
//!   out at the floor.
//! - **The first reply**: a store's very first reply (the start-up read of a
//!   fresh instance, waited for longer than a deadline) that took longer than
//!   the ceiling is a far store already: the ceiling rises to it × factor at
//!   once (at most [`FAR_CEILING`]), so a fresh instance's first decisions are
//!   not cut short by a ceiling set for a store next door.
//! - A fixed deadline is floor = ceiling ([`DeadlineSettings::fixed`]); it never
//!   moves.

use floodgate_shared::time::Micros;

/// Latencies remembered.
pub const RING: usize = 1024;
/// Replies needed before the percentile is trusted.
pub const MIN_SAMPLES: usize = 16;
/// A late reply's raise halves this often (µs).
pub const BOOST_HALF_LIFE: Micros = 1_000_000;

/// Replies in a row after the ceiling that show a far store (see the module).
pub const FAR_AFTER: u32 = 3;
/// The most a far store's replies raise the ceiling to (µs).
pub const FAR_CEILING: Micros = 2_000_000;

/// The bounds and the shape of an adaptive deadline (all µs but `factor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeadlineSettings {
    /// Never shorter: a healthy store answers within it anyway, and a dead one
    /// is detected this fast.
    pub floor: Micros,
    /// Never longer: a reply later than this is no use to a request (the store is
    /// treated as failing, not slow).
    pub ceiling: Micros,
    /// The deadline is this many times the recent p99.
    pub factor: f64,
    /// How long a latency counts as recent.
    pub window: Micros,
}

impl DeadlineSettings {
    /// Next to Redis (RESP), natively: see `docs/failure.md` for the measurements.
    pub const RESP: Self = Self {
        floor: 3_000,
        ceiling: 100_000,
        factor: 3.0,
        window: 10_000_000,
    };
    /// Over an Upstash-protocol REST endpoint (an HTTP hop, usually remote): the
    /// Worker and `floodgate-edge --rest-url`.
    pub const REST: Self = Self {
        floor: 50_000,
        ceiling: 1_000_000,
        factor: 3.0,
        window: 10_000_000,
    };

    /// A deadline that never moves (`--deadline-ms`, `DEADLINE_MS`).
    pub fn fixed(deadline: Micros) -> Self {
        let d = deadline.max(1);
        Self {
            floor: d,
            ceiling: d,
            ..Self::RESP
        }
    }

    /// These bounds with a floor and a ceiling overridden (each at least 1 µs; the
    /// ceiling never below the floor).
    pub fn bounded(self, floor: Option<Micros>, ceiling: Option<Micros>) -> Self {
        let floor = floor.unwrap_or(self.floor).max(1);
        Self {
            floor,
            ceiling: ceiling.unwrap_or(self.ceiling).max(floor),
            ..self
        }
    }

    pub fn is_fixed(&self) -> bool {
        self.floor >= self.ceiling
    }

    fn clamp(&self, d: Micros) -> Micros {
        d.clamp(self.floor, self.ceiling.max(self.floor))
    }

    fn scaled(&self, latency: Micros) -> Micros {
        let d = (latency as f64 * self.factor).ceil();
        if d >= self.ceiling as f64 {
            self.ceiling
        } else {
            d as Micros
        }
    }
}

/// What a late reply says about its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lateness {
    /// Within the ceiling: the store is slow, not down; the deadline was raised.
    Slow,
    /// After the ceiling: no use to any request.
    TooLate,
}

/// One store's deadline.
#[derive(Debug, Clone)]
pub struct Estimator {
    settings: DeadlineSettings,
    /// (instant answered, latency), oldest overwritten first.
    ring: Vec<(Micros, Micros)>,
    next: usize,
    seen: u64,
    /// A late reply's raise: (instant, deadline then).
    boost: Option<(Micros, Micros)>,
    /// Replies after the ceiling since the last one within it, and the smallest
    /// of their latencies.
    too_late: (u32, Micros),
    /// The last percentile computed: (instant, replies seen then, deadline).
    cached: Option<(Micros, u64, Micros)>,
}

/// The percentile is recomputed after this many new replies, or this long (µs).
const RECOMPUTE_EVERY: (u64, Micros) = (32, 10_000);

impl Estimator {
    pub fn new(settings: DeadlineSettings) -> Self {
        Self {
            settings,
            ring: Vec::with_capacity(if settings.is_fixed() { 0 } else { RING }),
            next: 0,
            seen: 0,
            boost: None,
            too_late: (0, 0),
            cached: None,
        }
    }

    pub fn settings(&self) -> &DeadlineSettings {
        &self.settings
    }

    /// A call answered after `latency`, at `now` (in time or late: see
    /// [`Estimator::late`]).
    pub fn observe(&mut self, latency: Micros, now: Micros) {
        if self.settings.is_fixed() {
            return;
        }
        let s = &mut self.settings;
        if self.seen == 0 && latency > s.ceiling && s.ceiling < FAR_CEILING {
            let raised = (latency as f64 * s.factor).ceil() as Micros;
            s.ceiling = raised.clamp(s.ceiling, FAR_CEILING);
            self.cached = None;
        }
        let sample = (now, latency.max(0));
        if self.ring.len() < RING {
            self.ring.push(sample);
        } else {
            self.ring[self.next] = sample;
        }
        self.next = (self.next + 1) % RING;
        self.seen += 1;
        self.too_late = (0, 0);
    }

    /// A reply that came after its call's deadline, `latency` after it was sent.
    pub fn late(&mut self, latency: Micros, now: Micros) -> Lateness {
        if latency > self.settings.ceiling && !self.far(latency) {
            return Lateness::TooLate;
        }
        self.observe(latency, now);
        if !self.settings.is_fixed() {
            let raised = self.settings.clamp(self.settings.scaled(latency));
            if self.boosted(now) < raised {
                self.boost = Some((now, raised));
            }
        }
        Lateness::Slow
    }

    /// A reply after the ceiling: whether it, with the ones before it, shows a
    /// far store — then the ceiling was raised to take it.
    fn far(&mut self, latency: Micros) -> bool {
        let s = &mut self.settings;
        if s.is_fixed() || s.ceiling >= FAR_CEILING {
            return false;
        }
        let (run, least) = self.too_late;
        let least = if run == 0 {
            latency
        } else {
            least.min(latency)
        };
        self.too_late = (run + 1, least);
        if run + 1 < FAR_AFTER {
            return false;
        }
        let raised = (least as f64 * s.factor).ceil() as Micros;
        s.ceiling = raised.clamp(s.ceiling, FAR_CEILING);
        self.cached = None;
        latency <= s.ceiling
    }

    /// The deadline of a call sent at `now`.
    pub fn deadline(&mut self, now: Micros) -> Micros {
        let s = self.settings;
        if s.is_fixed() {
            return s.floor;
        }
        let learned = match self.seen {
            0 => s.floor,
            n if n < MIN_SAMPLES as u64 => s.ceiling,
            n => match self.cached {
                Some((at, seen, d))
                    if n - seen < RECOMPUTE_EVERY.0
                        && (0..RECOMPUTE_EVERY.1).contains(&(now - at)) =>
                {
                    d
                }
                _ => {
                    let d = s.clamp(s.scaled(self.p99(now)));
                    self.cached = Some((now, n, d));
                    d
                }
            },
        };
        learned.max(self.boosted(now))
    }

    /// What is left of the last late reply's raise at `now` (0: none).
    fn boosted(&self, now: Micros) -> Micros {
        let Some((at, d)) = self.boost else {
            return 0;
        };
        let halvings = (now - at).max(0) as f64 / BOOST_HALF_LIFE as f64;
        (d as f64 * 0.5f64.powf(halvings)) as Micros
    }

    fn p99(&self, now: Micros) -> Micros {
        let mut recent: Vec<Micros> = self
            .ring
            .iter()
            .filter(|(at, _)| now - at <= self.settings.window)
            .map(|(_, l)| *l)
            .collect();
        if recent.len() < MIN_SAMPLES {
            // too few recent ones: the newest, whatever their age
            let mut all: Vec<(Micros, Micros)> = self.ring.clone();
            all.sort_unstable_by_key(|(at, _)| std::cmp::Reverse(*at));
            recent = all.iter().take(MIN_SAMPLES).map(|(_, l)| *l).collect();
        }
        // the rank-th smallest, in linear time (sorting the ring showed in the
        // profile of a saturated edge)
        let rank = (recent.len() * 99 / 100).max(1);
        *recent.select_nth_unstable(rank - 1).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Micros = 1_000;

    /// Issue 38: a fresh instance's first reply from a store 100 ms away (its
    /// start-up read, waited for longer than a deadline) raises the ceiling at
    /// once: the next call, still learning, waits for it. A later slow reply
    /// alone never does.
    #[test]
    fn a_first_reply_past_the_ceiling_raises_it_at_once() {
        let mut e = Estimator::new(DeadlineSettings::RESP);
        e.observe(105 * MS, 1_000_000);
        assert_eq!(
            e.deadline(1_000_001),
            315 * MS,
            "three times the first reply"
        );
        let mut near = Estimator::new(DeadlineSettings::RESP);
        near.observe(MS, 1_000_000);
        near.observe(150 * MS, 1_000_001);
        assert_eq!(near.deadline(1_000_002), 100 * MS, "the ceiling stays");
    }

    fn fed(latencies: &[Micros], every: Micros) -> (Estimator, Micros) {
        let mut e = Estimator::new(DeadlineSettings::RESP);
        let mut now = 1_000_000;
        for l in latencies {
            now += every;
            e.observe(*l, now);
        }
        (e, now)
    }

    #[test]
    fn never_heard_from_is_the_floor_and_learning_is_the_ceiling() {
        let mut e = Estimator::new(DeadlineSettings::RESP);
        assert_eq!(e.deadline(0), 3 * MS, "a store that never answered");
        for i in 0..(MIN_SAMPLES as i64 - 1) {
            e.observe(100, i);
            assert_eq!(e.deadline(i), 100 * MS, "still learning after {}", i + 1);
        }
        e.observe(100, 100);
        assert_eq!(
            e.deadline(100),
            3 * MS,
            "learned: a fast store is at the floor"
        );
    }

    #[test]
    fn converges_to_three_times_the_p99() {
        // 5-20 ms, evenly spread: p99 ≈ 19.9 ms
        let lat: Vec<Micros> = (0..200).map(|i| 5 * MS + (i % 100) * 150).collect();
        let (mut e, now) = fed(&lat, 10 * MS);
        let d = e.deadline(now);
        assert!((59 * MS..=60 * MS).contains(&d), "{d}");
    }

    #[test]
    fn one_stall_does_not_move_it() {
        let mut lat = vec![500; 150];
        lat[75] = 200 * MS;
        let (mut e, now) = fed(&lat, MS);
        assert_eq!(e.deadline(now), 3 * MS, "p99 ignores the single outlier");
        // the same stall seen as a late reply raises it, and briefly
        assert_eq!(e.late(90 * MS, now), Lateness::Slow);
        assert_eq!(e.deadline(now), 100 * MS, "raised at once, to the ceiling");
        assert!(e.deadline(now + BOOST_HALF_LIFE) <= 50 * MS);
        assert_eq!(
            e.deadline(now + 6 * BOOST_HALF_LIFE),
            3 * MS,
            "forgotten within seconds"
        );
    }

    #[test]
    fn a_reply_after_the_ceiling_is_too_late_and_changes_nothing() {
        let (mut e, now) = fed(&[500; 50], MS);
        assert_eq!(e.late(101 * MS, now), Lateness::TooLate);
        assert_eq!(e.deadline(now), 3 * MS);
        // stalls among timely replies never add up to a far store
        for i in 0..10 {
            assert_eq!(e.late(300 * MS, now + i), Lateness::TooLate);
            e.observe(500, now + i);
        }
        assert_eq!(e.settings().ceiling, 100 * MS);
    }

    #[test]
    fn a_far_store_raises_the_ceiling_a_dead_one_never_does() {
        // a global Redis 60 ms away, one way: every reply after the 100 ms ceiling
        let mut e = Estimator::new(DeadlineSettings::RESP);
        let mut now = 1_000_000;
        for _ in 1..FAR_AFTER {
            now += 10 * MS;
            assert_eq!(e.late(125 * MS, now), Lateness::TooLate);
        }
        assert_eq!(e.late(121 * MS, now + MS), Lateness::Slow, "far, not down");
        assert_eq!(e.settings().ceiling, 363 * MS, "3 × the least of them");
        assert!(e.deadline(now + MS) >= 121 * MS);
        // its replies now come in time and teach the deadline as any store's do
        for i in 0..40 {
            e.observe(120 * MS + i * 100, now + 2 * MS + i);
        }
        let d = e.deadline(now + 100 * MS);
        assert!((360 * MS..=363 * MS).contains(&d), "{d}");
        // at most FAR_CEILING, whatever the replies say
        let mut e = Estimator::new(DeadlineSettings::RESP);
        for i in 0..FAR_AFTER as i64 {
            e.late(5_000 * MS, i);
        }
        assert_eq!(e.settings().ceiling, FAR_CEILING);
        // a fixed deadline never moves
        let mut e = Estimator::new(DeadlineSettings::fixed(50 * MS));
        for i in 0..10 {
            assert_eq!(e.late(200 * MS, i), Lateness::TooLate);
        }
        assert_eq!(e.settings().ceiling, 50 * MS);
    }

    #[test]
    fn recovers_after_a_stall() {
        // a slow spell: 30 ms for a while
        let (mut e, mut now) = fed(&[30 * MS; 100], 10 * MS);
        assert_eq!(e.deadline(now), 90 * MS);
        // then fast again: once the window has passed, the slow spell is gone
        for _ in 0..200 {
            now += 100 * MS;
            e.observe(400, now);
        }
        assert_eq!(e.deadline(now), 3 * MS);
    }

    #[test]
    fn an_idle_store_keeps_what_was_learned() {
        let (mut e, now) = fed(&[10 * MS; 40], MS);
        assert_eq!(e.deadline(now), 30 * MS);
        assert_eq!(e.deadline(now + 3_600_000_000), 30 * MS, "an hour later");
    }

    #[test]
    fn never_below_the_floor() {
        let (mut e, now) = fed(&[1; 100], MS);
        assert_eq!(e.deadline(now), 3 * MS);
    }

    #[test]
    fn the_percentile_follows_new_replies_within_a_few_calls() {
        let (mut e, mut now) = fed(&[500; 100], MS);
        assert_eq!(e.deadline(now), 3 * MS);
        for _ in 0..RECOMPUTE_EVERY.0 + 2 {
            now += MS;
            e.observe(20 * MS, now);
        }
        assert_eq!(e.deadline(now), 60 * MS, "10 of 110 above: the p99 moved");
    }

    #[test]
    fn a_fixed_deadline_never_moves() {
        let mut e = Estimator::new(DeadlineSettings::fixed(3 * MS));
        assert_eq!(e.deadline(0), 3 * MS);
        for i in 0..100 {
            e.observe(50 * MS, i);
        }
        assert_eq!(e.late(50 * MS, 100), Lateness::TooLate);
        assert_eq!(e.deadline(100), 3 * MS);
    }

    #[test]
    fn bounds_can_be_overridden() {
        let s = DeadlineSettings::RESP.bounded(Some(5 * MS), Some(2 * MS));
        assert_eq!((s.floor, s.ceiling), (5 * MS, 5 * MS), "ceiling ≥ floor");
        assert!(s.is_fixed());
        let s = DeadlineSettings::REST.bounded(None, Some(200 * MS));
        assert_eq!((s.floor, s.ceiling), (50 * MS, 200 * MS));
    }

    proptest! {
        #[test]
        fn never_outside_floor_and_ceiling(
            floor in 1i64..20_000,
            span in 0i64..200_000,
            events in prop::collection::vec((0i64..2_000_000, 0i64..500_000, any::<bool>()), 0..400),
        ) {
            let s = DeadlineSettings { floor, ceiling: floor + span, ..DeadlineSettings::RESP };
            let mut e = Estimator::new(s);
            let mut now = 0;
            // replies after the ceiling in a row: only FAR_AFTER of them raise it
            let mut run = 0;
            for (gap, latency, late) in events {
                now += gap;
                let before = e.settings().ceiling;
                let first = e.seen == 0;
                if late {
                    run = if latency > before { run + 1 } else { 0 };
                    e.late(latency, now);
                } else {
                    run = 0;
                    e.observe(latency, now);
                }
                let ceiling = e.settings().ceiling;
                if ceiling != before {
                    // a far store's run of late replies, or the first reply of all
                    let why = run >= FAR_AFTER || (first && latency > before);
                    prop_assert!(why && ceiling > before && ceiling <= FAR_CEILING);
                    run = 0;
                }
                let d = e.deadline(now);
                prop_assert!(d >= floor && d <= ceiling, "{d} outside [{floor}, {ceiling}]");
            }
        }

        #[test]
        fn the_p99_is_the_rank_of_the_sorted_recent_replies(
            latencies in prop::collection::vec(0i64..1_000_000, MIN_SAMPLES..2 * RING),
        ) {
            let mut e = Estimator::new(DeadlineSettings::RESP);
            for (i, l) in latencies.iter().enumerate() {
                e.observe(*l, i as Micros);
            }
            let now = latencies.len() as Micros;
            let mut kept: Vec<Micros> = latencies.iter().rev().take(RING).copied().collect();
            kept.sort_unstable();
            prop_assert_eq!(e.p99(now), kept[(kept.len() * 99 / 100).max(1) - 1]);
        }
    }
}
