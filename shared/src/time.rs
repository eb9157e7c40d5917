//! Time as Floodgate sees it: integer microseconds since the Unix epoch.
//!
//! The decision logic never reads a clock; hosts inject one. In production the
//! clock is Redis' own `TIME` (read inside the Lua script), so every edge shares one
//! clock whatever their local skew. [`FakeClock`] drives tests.

use std::sync::atomic::{AtomicI64, Ordering};

/// Microseconds since the Unix epoch (or a duration in microseconds).
pub type Micros = i64;

pub const MICROS_PER_MS: Micros = 1_000;
pub const MICROS_PER_SEC: Micros = 1_000_000;

/// The largest instant the algorithm accepts: 2^52 µs after the epoch (year 2112).
/// Every instant and sum of instants stays below 2^53, so Lua's doubles represent
/// them exactly and the script and [`crate::bucket::decide`] agree bit for bit.
pub const MAX_INSTANT: Micros = 1 << 52;

/// Rounds a non-negative duration up to whole seconds.
pub fn ceil_secs(us: Micros) -> i64 {
    us.div_euclid(MICROS_PER_SEC) + i64::from(us.rem_euclid(MICROS_PER_SEC) != 0)
}

/// A source of the current time.
pub trait Clock {
    fn now(&self) -> Micros;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct FakeClock(AtomicI64);

impl FakeClock {
    pub fn at(now: Micros) -> Self {
        Self(AtomicI64::new(now))
    }
    pub fn advance(&self, by: Micros) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }
    pub fn set(&self, now: Micros) {
        self.0.store(now, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}

/// The host's wall clock. Not available in wasm32, where `SystemTime::now` panics:
/// the Worker uses `Date.now()` or, on the hot path, Redis' `TIME`.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[cfg(not(target_arch = "wasm32"))]
impl Clock for SystemClock {
    fn now(&self) -> Micros {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Micros::try_from(since.as_micros()).unwrap_or(MAX_INSTANT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_secs_rounds_up_partial_seconds_only() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(999_999), 1);
        assert_eq!(ceil_secs(1_000_000), 1);
        assert_eq!(ceil_secs(1_000_001), 2);
    }

    #[test]
    fn fake_clock_moves_only_when_told() {
        let c = FakeClock::at(10);
        assert_eq!(c.now(), 10);
        c.advance(5);
        assert_eq!(c.now(), 15);
        c.set(3);
        assert_eq!(c.now(), 3);
    }
}
