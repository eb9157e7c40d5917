//! A circuit breaker per edge instance, around the bucket check.
//!
//! Closed: every request calls the store; `threshold` consecutive failures open it.
//! Open: no request calls the store for `cool_down`; each gets its policies' failure
//! mode at once (no deadline to wait out). Then half-open: ONE request probes the
//! store (the others keep the failure mode); its success closes the breaker, its
//! failure opens it again. Transitions and degraded time are counted for alerting.

use std::sync::Mutex;

use floodgate_shared::time::Micros;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Closed,
    Open,
    HalfOpen,
}

/// What the breaker says about one store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Call the store.
    Call,
    /// Call the store: this request is the half-open probe.
    Probe,
    /// Do not call the store: apply the failure mode.
    Skip,
}

/// Counters exposed for alerting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BreakerStats {
    pub opened: u64,
    pub closed: u64,
    /// Requests answered without the store while open or half-open.
    pub skipped: u64,
    /// µs spent not closed, up to the last transition (plus the current spell).
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
            cool_down,
            state: Mutex::new(state),
        }
    }

    pub fn permit(&self, now: Micros) -> Permit {
        let mut s = self.state.lock().expect("breaker lock");
        let permit = match s.phase {
            Phase::Closed => Permit::Call,
            Phase::Open if now >= s.until => {
                s.phase = Phase::HalfOpen;
                s.probing = true;
                Permit::Probe
            }
            Phase::HalfOpen if !s.probing => {
                s.probing = true;
                Permit::Probe
            }
            Phase::Open | Phase::HalfOpen => Permit::Skip,
        };
        if permit == Permit::Skip {
            s.stats.skipped += 1;
        }
        permit
    }

    pub fn success(&self, now: Micros) {
        let mut s = self.state.lock().expect("breaker lock");
        s.failures = 0;
        if s.phase != Phase::Closed {
            s.stats.degraded_us += now - s.since;
            s.stats.closed += 1;
            s.phase = Phase::Closed;
            s.probing = false;
        }
    }

    pub fn failure(&self, now: Micros) {
        let mut s = self.state.lock().expect("breaker lock");
        s.failures += 1;
        match s.phase {
            Phase::Closed if s.failures >= self.threshold => {
                s.phase = Phase::Open;
                s.until = now + self.cool_down;
                s.since = now;
                s.stats.opened += 1;
            }
            Phase::HalfOpen | Phase::Open => {
                s.phase = Phase::Open;
                s.until = now + self.cool_down;
                s.probing = false;
            }
            Phase::Closed => {}
        }
    }

    pub fn phase(&self) -> Phase {
        self.state.lock().expect("breaker lock").phase
    }

    pub fn stats(&self, now: Micros) -> BreakerStats {
        let s = self.state.lock().expect("breaker lock");
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

    #[test]
    fn opens_after_the_threshold_probes_once_and_closes_on_success() {
        let b = Breaker::new(3, 1_000);
        for t in 0..2 {
            assert_eq!(b.permit(t), Permit::Call);
            b.failure(t);
        }
        assert_eq!(b.phase(), Phase::Closed);
        b.success(2); // a success resets the count
        for t in 3..6 {
            assert_eq!(b.permit(t), Permit::Call);
            b.failure(t);
        }
        assert_eq!(b.phase(), Phase::Open);
        assert_eq!(b.permit(500), Permit::Skip);
        assert_eq!(b.permit(1_005), Permit::Probe);
        assert_eq!(b.permit(1_006), Permit::Skip, "one probe at a time");
        b.failure(1_010);
        assert_eq!(b.phase(), Phase::Open);
        assert_eq!(b.permit(1_500), Permit::Skip);
        assert_eq!(b.permit(2_010), Permit::Probe);
        b.success(2_020);
        assert_eq!(b.phase(), Phase::Closed);
        assert_eq!(b.permit(2_021), Permit::Call);
        let st = b.stats(3_000);
        assert_eq!((st.opened, st.closed, st.skipped), (1, 1, 3));
        assert_eq!(st.degraded_us, 2_020 - 5);
    }
}
