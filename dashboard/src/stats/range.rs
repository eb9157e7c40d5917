//! The traffic page's time axis (pure): the ranges it offers, the resolutions
//! (the width of one bar) of each, how often it refreshes, and which bars a range
//! covers.

use serde::{Deserialize, Serialize};

/// The traffic page's time range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Range {
    Minutes15,
    Hour1,
    Hours24,
}

/// The width of one bar of the traffic charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resolution {
    Seconds10,
    Minute1,
    Minutes10,
    Hour1,
}

impl Range {
    pub const ALL: [Range; 3] = [Range::Minutes15, Range::Hour1, Range::Hours24];

    pub fn secs(self) -> i64 {
        match self {
            Range::Minutes15 => 900,
            Range::Hour1 => 3_600,
            Range::Hours24 => 86_400,
        }
    }

    /// The query value (`?range=`).
    pub fn code(self) -> &'static str {
        match self {
            Range::Minutes15 => "15m",
            Range::Hour1 => "1h",
            Range::Hours24 => "24h",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Range::Minutes15 => "15 minutes",
            Range::Hour1 => "1 hour",
            Range::Hours24 => "24 hours",
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        Range::ALL.into_iter().find(|r| r.code() == code)
    }

    /// How often the traffic page refreshes this range (seconds).
    pub fn refresh_secs(self) -> u64 {
        match self {
            Range::Minutes15 | Range::Hour1 => 3,
            Range::Hours24 => 30,
        }
    }

    /// The resolutions offered for this range, the default first.
    pub fn resolutions(self) -> &'static [Resolution] {
        match self {
            Range::Minutes15 => &[Resolution::Seconds10, Resolution::Minute1],
            Range::Hour1 => &[Resolution::Minute1, Resolution::Seconds10],
            Range::Hours24 => &[Resolution::Minutes10, Resolution::Hour1],
        }
    }

    /// `res` if this range offers it, else the default.
    pub fn resolution(self, res: Option<Resolution>) -> Resolution {
        res.filter(|r| self.resolutions().contains(r))
            .unwrap_or(self.resolutions()[0])
    }
}

impl Resolution {
    pub fn secs(self) -> i64 {
        match self {
            Resolution::Seconds10 => 10,
            Resolution::Minute1 => 60,
            Resolution::Minutes10 => 600,
            Resolution::Hour1 => 3_600,
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            Resolution::Seconds10 => "10s",
            Resolution::Minute1 => "1m",
            Resolution::Minutes10 => "10m",
            Resolution::Hour1 => "1h",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Resolution::Seconds10 => "10 s",
            Resolution::Minute1 => "1 min",
            Resolution::Minutes10 => "10 min",
            Resolution::Hour1 => "1 h",
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        [
            Resolution::Seconds10,
            Resolution::Minute1,
            Resolution::Minutes10,
            Resolution::Hour1,
        ]
        .into_iter()
        .find(|r| r.code() == code)
    }
}

/// The bars of `range` at `resolution` ending with the one holding `now` (Unix
/// seconds): the first bar's start and how many.
pub fn bars(now: i64, range: Range, resolution: Resolution) -> (i64, usize) {
    let step = resolution.secs();
    let n = (range.secs() / step) as usize;
    (now.div_euclid(step) * step - (n as i64 - 1) * step, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bars_end_with_the_current_one() {
        assert_eq!(
            bars(1_000, Range::Minutes15, Resolution::Seconds10),
            (1_000 - 890, 90)
        );
        assert_eq!(
            bars(1_019, Range::Hour1, Resolution::Minute1),
            (960 - 59 * 60, 60)
        );
        assert_eq!(
            bars(86_400 * 3 + 5, Range::Hours24, Resolution::Minutes10).1,
            144
        );
    }
}
