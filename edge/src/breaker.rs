//! A circuit breaker per edge instance, around the bucket check.
//!
//! Closed: every request calls the store; `threshold` consecutive failures open it.
//! Open: no request calls the store for `cool_down`; each gets its policies' failure
//! mode at once (no deadline to wait out). Then half-open: ONE request runs a health
//! check (`PING`) first; only its success closes the breaker (that request then goes
//! on to the store as usual), its failure opens it again for another cool-down. The
//! others keep the failure mode meanwhile.
//!
//! Every change of phase is returned as a [`PhaseChange`] (from, to, instant, reason)
//! for the host to log; transitions, requests kept off the store and time spent
//! degraded are counted for alerting ([`BreakerStats`]). The breaker never reads a
//! clock: every call takes the instant.

use std::fmt;
use std::sync::Mutex;

use floodgate_shared::time::Micros;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Closed,
    Open,
    HalfOpen,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the breaker says about one store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Call the store.
    Call,
    /// Health-check the store first (`PING`): this request is the half-open probe.
    /// Report the check's outcome with [`Breaker::probe_succeeded`] /
    /// [`Breaker::probe_failed`].
    Probe,
    /// Do not call the store: apply the failure mode.
    Skip,
}

/// One change of phase, to be logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseChange {
    pub from: Phase,
    pub to: Phase,
    /// The instant (µs since the epoch, the pipeline's clock).
    pub at: Micros,
    pub reason: String,
}

impl fmt::Display for PhaseChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "floodgate breaker: {} -> {} at {}.{:03}s ({})",
            self.from,
            self.to,
            self.at.div_euclid(1_000_000),
            self.at.rem_euclid(1_000_000) / 1_000,
            self.reason
        )
    }
}

/// Counters exposed for alerting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BreakerStats {
    /// Transitions to open from closed (a new outage).
    pub opened: u64,
    /// Transitions to closed (an outage over).
    pub closed: u64,
    /// Health checks run in half-open.
    pub probes: u64,
    /// Requests answered without the store while open or half-open.
    pub skipped: u64,
    /// µs spent not closed, the current spell included.
    pub degraded_us: Micros,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    failures: u32,
    until: Micros,
    probing: bool,
    since: Micros,
    stats: BreakerStats,
}

#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cool_down: Micros,
    state: Mutex<State>,
}

impl Breaker {
    /// `threshold` consecutive failures open it (at least 1); `cool_down` µs later
    /// it probes.
    pub fn new(threshold: u32, cool_down: Micros) -> Self {
        let state = State {
            phase: Phase::Closed,
            failures: 0,
            until: 0,
            probing: false,
            since: 0,
            stats: BreakerStats::default(),
        };
        Self {
            threshold: threshold.max(1),
            cool_down: cool_down.max(0),
            state: Mutex::new(state),
        }
    }

    /// The consecutive failures that open it.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    pub fn permit(&self, now: Micros) -> (Permit, Option<PhaseChange>) {
        let mut s = crate::sync::lock(&self.state);
        let mut moved = None;
        let permit = match s.phase {
            Phase::Closed => Permit::Call,
            Phase::Open if now >= s.until => {
                s.phase = Phase::HalfOpen;
                moved = Some(PhaseChange {
                    from: Phase::Open,
                    to: Phase::HalfOpen,
                    at: now,
                    reason: "cool-down over: health check".into(),
                });
                s.probing = true;
                s.stats.probes += 1;
                Permit::Probe
            }
            Phase::HalfOpen if !s.probing => {
                s.probing = true;
                s.stats.probes += 1;
                Permit::Probe
            }
            Phase::Open | Phase::HalfOpen => Permit::Skip,
        };
        if permit == Permit::Skip {
            s.stats.skipped += 1;
        }
        (permit, moved)
    }

    /// A store call succeeded. Only resets the failure count: a call still in
    /// flight when the breaker opened does not close it (only a health check does).
    pub fn success(&self, _now: Micros) -> Option<PhaseChange> {
        let mut s = crate::sync::lock(&self.state);
        if s.phase == Phase::Closed {
            s.failures = 0;
        }
        None
    }

    /// A late reply arrived within the deadline's ceiling: the store is slow, not
    /// down. Closed: the failure count starts again (the timeouts it answers were
    /// not outages). Open: the cool-down ends now, so the next request
    /// health-checks the store at once (a stall shorter than the ceiling costs
    /// the stall, not a whole cool-down).
    pub fn answered_late(&self, now: Micros) {
        let mut s = crate::sync::lock(&self.state);
        match s.phase {
            Phase::Closed => s.failures = 0,
            Phase::Open => s.until = s.until.min(now),
            Phase::HalfOpen => {}
        }
    }

    /// The half-open health check succeeded: close.
    pub fn probe_succeeded(&self, now: Micros) -> Option<PhaseChange> {
        let mut s = crate::sync::lock(&self.state);
        if s.phase != Phase::HalfOpen {
            return None;
        }
        s.failures = 0;
        let from = s.phase;
        s.stats.degraded_us += now - s.since;
        s.stats.closed += 1;
        s.phase = Phase::Closed;
        s.probing = false;
        Some(PhaseChange {
            from,
            to: Phase::Closed,
            at: now,
            reason: "health check answered".into(),
        })
    }

    /// A store call failed in a way retrying may fix (counts only while closed).
    pub fn failure(&self, now: Micros, why: &dyn fmt::Display) -> Option<PhaseChange> {
        let mut s = crate::sync::lock(&self.state);
        if s.phase != Phase::Closed {
            return None;
        }
        s.failures = s.failures.saturating_add(1);
        if s.failures < self.threshold {
            return None;
        }
        s.phase = Phase::Open;
        s.until = now + self.cool_down;
        s.since = now;
        s.stats.opened += 1;
        Some(PhaseChange {
            from: Phase::Closed,
            to: Phase::Open,
            at: now,
            reason: format!("{} consecutive failures, last: {why}", s.failures),
        })
    }

    /// The half-open health check failed: open again for another cool-down.
    pub fn probe_failed(&self, now: Micros, why: &dyn fmt::Display) -> Option<PhaseChange> {
        let mut s = crate::sync::lock(&self.state);
        match s.phase {
            Phase::HalfOpen => {
                s.phase = Phase::Open;
                s.until = now + self.cool_down;
                s.probing = false;
                Some(PhaseChange {
                    from: Phase::HalfOpen,
                    to: Phase::Open,
                    at: now,
                    reason: format!("health check failed: {why}"),
                })
            }
            Phase::Open | Phase::Closed => None,
        }
    }

    pub fn phase(&self) -> Phase {
        crate::sync::lock(&self.state).phase
    }

    pub fn stats(&self, now: Micros) -> BreakerStats {
        let s = crate::sync::lock(&self.state);
        let mut stats = s.stats;
        if s.phase != Phase::Closed {
            stats.degraded_us += now - s.since;
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permit(b: &Breaker, t: Micros) -> Permit {
        b.permit(t).0
    }

    #[test]
    fn opens_after_the_threshold_probes_once_and_closes_on_success() {
        let b = Breaker::new(3, 1_000);
        for t in 0..2 {
            assert_eq!(permit(&b, t), Permit::Call);
            assert_eq!(b.failure(t, &"boom"), None);
        }
        assert_eq!(b.phase(), Phase::Closed);
        assert_eq!(b.success(2), None, "a success resets the count");
        for t in 3..5 {
            assert_eq!(permit(&b, t), Permit::Call);
            assert_eq!(b.failure(t, &"boom"), None);
        }
        let opened = b.failure(5, &"timeout").expect("third failure opens");
        assert_eq!(
            (opened.from, opened.to, opened.at),
            (Phase::Closed, Phase::Open, 5)
        );
        assert!(
            opened
                .reason
                .contains("3 consecutive failures, last: timeout")
        );
        assert_eq!(b.phase(), Phase::Open);
        assert_eq!(permit(&b, 500), Permit::Skip);
        let (p, t) = b.permit(1_005);
        assert_eq!(p, Permit::Probe);
        assert_eq!(
            t.map(|t| (t.from, t.to)),
            Some((Phase::Open, Phase::HalfOpen))
        );
        assert_eq!(permit(&b, 1_006), Permit::Skip, "one probe at a time");
        assert_eq!(
            b.success(1_007),
            None,
            "a straggler's success does not close it"
        );
        assert_eq!(
            b.failure(1_008, &"late"),
            None,
            "nor does its failure reopen it"
        );
        assert_eq!(b.phase(), Phase::HalfOpen);
        let reopened = b.probe_failed(1_010, &"refused").unwrap();
        assert_eq!((reopened.from, reopened.to), (Phase::HalfOpen, Phase::Open));
        assert_eq!(permit(&b, 1_500), Permit::Skip);
        assert_eq!(
            b.success(1_600),
            None,
            "open: only a health check closes it"
        );
        assert_eq!(b.phase(), Phase::Open);
        assert_eq!(permit(&b, 2_010), Permit::Probe);
        let closed = b.probe_succeeded(2_020).unwrap();
        assert_eq!(
            (closed.from, closed.to, closed.at),
            (Phase::HalfOpen, Phase::Closed, 2_020)
        );
        assert_eq!(b.phase(), Phase::Closed);
        assert_eq!(permit(&b, 2_021), Permit::Call);
        let st = b.stats(3_000);
        assert_eq!((st.opened, st.closed, st.skipped, st.probes), (1, 1, 3, 2));
        assert_eq!(st.degraded_us, 2_020 - 5);
        assert!(
            closed
                .to_string()
                .starts_with("floodgate breaker: half_open -> closed at 0.002s")
        );
    }

    #[test]
    fn a_late_reply_resets_the_count_or_ends_the_cool_down() {
        let b = Breaker::new(2, 1_000_000);
        b.failure(0, &"timeout");
        b.answered_late(1);
        assert_eq!(b.failure(2, &"timeout"), None, "the count started again");
        assert!(b.failure(3, &"timeout").is_some(), "opened");
        assert_eq!(permit(&b, 10), Permit::Skip);
        b.answered_late(20);
        assert_eq!(permit(&b, 21), Permit::Probe, "cool-down over at once");
    }

    #[test]
    fn degraded_time_includes_the_current_spell() {
        let b = Breaker::new(1, 10_000);
        b.failure(100, &"x").unwrap();
        assert_eq!(b.stats(400).degraded_us, 300);
        assert_eq!(b.stats(900).degraded_us, 800);
    }
}
