//! Chart geometry (pure, tested natively): the plot box, a y axis of round ticks,
//! stacked bars, step lines and time ticks. The traffic page's charts
//! (`pages::traffic_charts`) draw with it.

/// The SVG's drawing box (the page scales it to its full width).
pub const W: f64 = 1000.0;
pub const H: f64 = 230.0;
/// The plot area inside it (room for the axes' labels).
pub const LEFT: f64 = 70.0;
pub const RIGHT: f64 = 10.0;
pub const TOP: f64 = 12.0;
pub const BOTTOM: f64 = 34.0;

pub const PLOT_W: f64 = W - LEFT - RIGHT;
pub const PLOT_H: f64 = H - TOP - BOTTOM;

/// A y axis from 0 to `max` with a gridline at each tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Axis {
    pub max: u64,
    pub ticks: Vec<u64>,
}

/// Round ticks (1, 2, 2.5 or 5 × 10^k apart, 4 to 5 of them) covering `value`.
pub fn y_axis(value: u64) -> Axis {
    let value = value.max(1);
    let mut unit = 1u64;
    loop {
        for f in [1u64, 2, 5] {
            let Some(step) = unit.checked_mul(f) else {
                return Axis {
                    max: u64::MAX,
                    ticks: vec![0, u64::MAX],
                };
            };
            if step.saturating_mul(5) >= value {
                let n = value.div_ceil(step);
                return match step.checked_mul(n) {
                    Some(max) => Axis {
                        max,
                        ticks: (0..=n).map(|i| i * step).collect(),
                    },
                    None => Axis {
                        max: u64::MAX,
                        ticks: vec![0, u64::MAX],
                    },
                };
            }
        }
        unit = match unit.checked_mul(10) {
            Some(u) => u,
            None => {
                return Axis {
                    max: u64::MAX,
                    ticks: vec![0, u64::MAX],
                };
            }
        };
    }
}

/// The y coordinate of `value` on an axis up to `max` (clipped to the plot).
pub fn y(value: u64, max: u64) -> f64 {
    let max = max.max(1) as f64;
    TOP + PLOT_H - PLOT_H * (value as f64).min(max) / max
}

/// Bar `i` of `n`: its left edge and width (a small gap between bars when wide).
pub fn bar(i: usize, n: usize) -> (f64, f64) {
    let slot = PLOT_W / n.max(1) as f64;
    let gap = if slot >= 6.0 { slot * 0.15 } else { 0.0 };
    (LEFT + slot * i as f64 + gap / 2.0, slot - gap)
}

/// The segments of one stacked bar, bottom up: (y, height) of each value.
pub fn stack(values: &[u64], max: u64) -> Vec<(f64, f64)> {
    let mut base = 0u64;
    values
        .iter()
        .map(|v| {
            let top = base.saturating_add(*v);
            let (y0, y1) = (y(base, max), y(top, max));
            base = top;
            (y1, y0 - y1)
        })
        .collect()
}

/// An SVG path drawing `values` as steps (flat across each bar, vertical between
/// bars), with gaps where a value is `None`.
pub fn step_path(values: &[Option<u64>], max: u64) -> String {
    let n = values.len();
    let mut d = String::new();
    let mut drawing = false;
    for (i, v) in values.iter().enumerate() {
        let (x0, _) = bar(i, n);
        let slot = PLOT_W / n.max(1) as f64;
        let x0 = x0.min(LEFT + slot * i as f64);
        let x1 = LEFT + slot * (i + 1) as f64;
        match v {
            Some(v) => {
                let yy = y(*v, max);
                if drawing {
                    d.push_str(&format!(" V{yy:.1} H{x1:.1}"));
                } else {
                    d.push_str(&format!(
                        "{}M{x0:.1} {yy:.1} H{x1:.1}",
                        if d.is_empty() { "" } else { " " }
                    ));
                    drawing = true;
                }
            }
            None => drawing = false,
        }
    }
    d
}

/// Time ticks for `bars` bars of `step` seconds from `start` (Unix seconds): the
/// x coordinate and instant of each round time inside the range, 4 to 8 of them.
pub fn time_ticks(start: i64, step: i64, bars: usize) -> Vec<(f64, i64)> {
    let span = step * bars as i64;
    let every = [
        60, 120, 300, 600, 900, 1_800, 3_600, 7_200, 10_800, 21_600, 43_200,
    ]
    .into_iter()
    .find(|e| span / e <= 8)
    .unwrap_or(86_400);
    let end = start + span;
    let mut t = start.div_euclid(every) * every;
    if t < start {
        t += every;
    }
    let mut out = vec![];
    while t <= end {
        out.push((LEFT + PLOT_W * (t - start) as f64 / span.max(1) as f64, t));
        t += every;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_y_axis_has_round_ticks_covering_the_value() {
        assert_eq!(y_axis(0).ticks, [0, 1]);
        assert_eq!(y_axis(7).ticks, [0, 2, 4, 6, 8]);
        assert_eq!(y_axis(10).ticks, [0, 2, 4, 6, 8, 10]);
        assert_eq!(y_axis(101).ticks, [0, 50, 100, 150]);
        assert_eq!(y_axis(4_900).max, 5_000);
        for v in [1, 3, 9, 11, 99, 1_234, 987_654_321] {
            let a = y_axis(v);
            assert!(
                a.max >= v && a.ticks.len() <= 6 && a.ticks.len() >= 2,
                "{v}: {a:?}"
            );
        }
        assert_eq!(y_axis(u64::MAX).max, u64::MAX);
    }

    #[test]
    fn bars_stack_inside_the_plot() {
        let segs = stack(&[50, 30, 20], 100);
        assert_eq!(segs[0], (TOP + PLOT_H / 2.0, PLOT_H / 2.0));
        let top = segs[2].0;
        assert!(
            (top - TOP).abs() < 1e-9,
            "the stack reaches the top: {segs:?}"
        );
        let total: f64 = segs.iter().map(|s| s.1).sum();
        assert!((total - PLOT_H).abs() < 1e-9);
        assert_eq!(stack(&[500], 100)[0], (TOP, PLOT_H), "clipped");
        let (x, w) = bar(89, 90);
        assert!((x + w - (LEFT + PLOT_W)).abs() < PLOT_W / 90.0);
        assert!(w > 0.0);
    }

    #[test]
    fn step_lines_are_flat_per_bar_and_break_at_gaps() {
        let d = step_path(&[Some(0), Some(100), None, Some(50)], 100);
        assert_eq!(d.matches('M').count(), 2, "{d}");
        assert!(d.contains(&format!("V{:.1}", TOP)), "{d}");
        assert!(!d.contains('L'), "no ramps: {d}");
    }

    #[test]
    fn time_ticks_fall_on_round_times_inside_the_range() {
        let start = 1_764_000_005; // not round
        let ticks = time_ticks(start, 10, 90); // 15 minutes
        assert!((4..=8).contains(&ticks.len()), "{ticks:?}");
        for (x, t) in &ticks {
            assert_eq!(t % 120, 0);
            assert!(*x >= LEFT && *x <= LEFT + PLOT_W);
        }
        let day = time_ticks(1_764_000_000, 600, 144);
        assert!(day.iter().all(|(_, t)| t % 10_800 == 0), "{day:?}");
    }
}
