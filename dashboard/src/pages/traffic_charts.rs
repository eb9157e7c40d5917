//! The traffic page's charts (`pages::traffic` lays out the page), as SVG drawn
//! on the server (the geometry in [`crate::chart_geometry`]): an endpoint's stacked
//! bars and the store's latency, each with a title per bar for hover and its
//! numbers as a table.

use floodgate_shared::stats::Endpoint;
use leptos::prelude::*;

use crate::chart_geometry;
use crate::describe::endpoint_label;
use crate::stats::series::{Series, Traffic};
use crate::time;

/// The fill patterns of the bars (one definition per page), so throttled and
/// degraded differ by more than colour.
pub(super) fn fill_patterns() -> impl IntoView {
    view! {
        <svg width="0" height="0" aria-hidden="true" focusable="false" style="position:absolute">
            <defs>
                <pattern id="pat-throttled" class="pt-throttled" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)">
                    <rect width="6" height="6"/><line x1="0" y1="0" x2="0" y2="6"/>
                </pattern>
                <pattern id="pat-degraded" class="pt-degraded" patternUnits="userSpaceOnUse" width="6" height="6">
                    <rect width="6" height="6"/><circle cx="3" cy="3" r="1.3"/>
                </pattern>
            </defs>
        </svg>
    }
}

pub(super) fn legend() -> impl IntoView {
    let swatch = |class: &'static str| {
        view! { <svg viewBox="0 0 28 14" aria-hidden="true" class="chart"><rect class=class x="1" y="1" width="26" height="12"/></svg> }
    };
    view! {
        <div class="legend" aria-label="Legend">
            <span>{swatch("allowed")}"allowed (solid)"</span>
            <span>{swatch("throttled")}"throttled, 429 (hatched)"</span>
            <span>{swatch("degraded")}"degraded: decided without Redis (dotted)"</span>
            <span><svg viewBox="0 0 28 14" aria-hidden="true" class="chart"><path class="line shadow" d="M1 7 H27"/></svg>"would have throttled: shadow policies (dashed line)"</span>
        </div>
    }
}

/// `16:05:10–16:05:20 UTC` for a bar.
pub(super) fn bar_time(start: i64, step: i64) -> String {
    let seconds = step < 60;
    format!(
        "{}–{}",
        time::utc_time(start, seconds).trim_end_matches(" UTC"),
        time::utc_time(start + step, seconds)
    )
}

pub(super) fn sum(v: &[u64]) -> u64 {
    v.iter().sum()
}

/// One endpoint's stacked bars: allowed, throttled, degraded, with the shadow
/// policies' would-be 429s as a dashed step line; a title per bar for hover, and
/// the numbers as a table.
pub(super) fn endpoint_chart(
    t: &Traffic,
    e: &Endpoint,
    s: &Series,
    per: &str,
) -> impl IntoView + use<> {
    let step = t.step();
    let label = endpoint_label(e, &t.patterns);
    let n = t.bars;
    let totals: Vec<u64> = (0..n)
        .map(|i| s.allowed[i] + s.throttled[i] + s.degraded[i])
        .collect();
    let axis = chart_geometry::y_axis(totals.iter().chain(&s.shadow).copied().max().unwrap_or(0));
    let id = format!("chart-{}", e.route().unwrap_or("unmatched-traffic"));
    let summary = format!(
        "{} allowed, {} throttled (429), {} degraded, {} would have been throttled by shadow policies over the last {}.",
        sum(&s.allowed),
        sum(&s.throttled),
        sum(&s.degraded),
        sum(&s.shadow),
        t.range.label()
    );
    let bars = (0..n)
        .filter(|i| totals[*i] > 0 || s.shadow[*i] > 0)
        .map(|i| {
            let (x, w) = chart_geometry::bar(i, n);
            let segs = chart_geometry::stack(&[s.allowed[i], s.throttled[i], s.degraded[i]], axis.max);
            let at = t.start + step * i as i64;
            let tip = format!(
                "{}: {} allowed, {} throttled (429), {} degraded, {} would have throttled",
                bar_time(at, step),
                s.allowed[i],
                s.throttled[i],
                s.degraded[i],
                s.shadow[i]
            );
            view! {
                <g class="bar" data-at=at.to_string()>
                    <title>{tip}</title>
                    <rect class="hover" x=x y=chart_geometry::TOP width=w height=chart_geometry::PLOT_H/>
                    <rect class="allowed" x=x y=segs[0].0 width=w height=segs[0].1/>
                    <rect class="throttled" x=x y=segs[1].0 width=w height=segs[1].1/>
                    <rect class="degraded" x=x y=segs[2].0 width=w height=segs[2].1/>
                </g>
            }
        })
        .collect_view();
    let shadow: Vec<Option<u64>> = s.shadow.iter().map(|v| Some(*v)).collect();
    let has_shadow = s.shadow.iter().any(|v| *v > 0);
    let rows = numbers_rows(t, s, &totals);
    view! {
        <section class="endpoint" aria-labelledby=format!("{id}-h")>
            <h2 id=format!("{id}-h")>{label.clone()}</h2>
            <svg class="chart" viewBox=format!("0 0 {} {}", chart_geometry::W, chart_geometry::H) role="img"
                aria-label=format!("{per} to {label}: {summary}")
                data-route=e.route().unwrap_or_default().to_string() data-endpoint=e.to_string()
                data-throttled=sum(&s.throttled).to_string() data-allowed=sum(&s.allowed).to_string()>
                {y_axis_view(&axis, per, |v| v.to_string())}
                {x_axis_view(t)}
                {bars}
                {has_shadow.then(|| view! { <path class="line shadow" d=chart_geometry::step_path(&shadow, axis.max)/> })}
            </svg>
            <details>
                <summary>{format!("The numbers, per {} (bars without requests left out)", t.resolution.label())}</summary>
                <table class="numbers">
                    <caption class="sr-only">{format!("{per} to {label}")}</caption>
                    <thead><tr><th scope="col">"Time (UTC)"</th><th scope="col" class="num">"Allowed"</th><th scope="col" class="num">"Throttled (429)"</th><th scope="col" class="num">"Degraded"</th><th scope="col" class="num">"Would have throttled"</th></tr></thead>
                    <tbody>{rows}</tbody>
                </table>
            </details>
        </section>
    }
}

/// The numbers of an endpoint's bars that had requests, one row per bar.
fn numbers_rows(t: &Traffic, s: &Series, totals: &[u64]) -> impl IntoView + use<> {
    let step = t.step();
    (0..t.bars)
        .filter(|i| totals[*i] > 0 || s.shadow[*i] > 0)
        .map(|i| {
            view! {
                <tr>
                    <th scope="row">{bar_time(t.start + step * i as i64, step)}</th>
                    <td class="num">{s.allowed[i]}</td><td class="num">{s.throttled[i]}</td>
                    <td class="num">{s.degraded[i]}</td><td class="num">{s.shadow[i]}</td>
                </tr>
            }
        })
        .collect_view()
}

/// Gridlines and labels of a y axis, with its title (the unit).
fn y_axis_view(
    axis: &chart_geometry::Axis,
    title: &str,
    label: fn(u64) -> String,
) -> impl IntoView + use<> {
    let ticks = axis
        .ticks
        .iter()
        .map(|v| {
            let y = chart_geometry::y(*v, axis.max);
            view! {
                <line class="grid" x1=chart_geometry::LEFT x2=chart_geometry::W - chart_geometry::RIGHT y1=y y2=y/>
                <text x=chart_geometry::LEFT - 6.0 y=y + 4.0 text-anchor="end">{label(*v)}</text>
            }
        })
        .collect_view();
    let mid = chart_geometry::TOP + chart_geometry::PLOT_H / 2.0;
    view! {
        {ticks}
        <text x="14" y=mid text-anchor="middle" transform=format!("rotate(-90 14 {mid})")>{title.to_string()}</text>
    }
}

/// The time axis: a tick and label at each round time, and its title.
fn x_axis_view(t: &Traffic) -> impl IntoView + use<> {
    let bottom = chart_geometry::TOP + chart_geometry::PLOT_H;
    let ticks = chart_geometry::time_ticks(t.start, t.step(), t.bars)
        .into_iter()
        .map(|(x, at)| {
            view! {
                <line class="axis" x1=x x2=x y1=bottom y2=bottom + 5.0/>
                <text x=x y=bottom + 17.0 text-anchor="middle">{time::hh_mm(at)}</text>
            }
        })
        .collect_view();
    view! {
        <line class="axis" x1=chart_geometry::LEFT x2=chart_geometry::W - chart_geometry::RIGHT y1=bottom y2=bottom/>
        {ticks}
        <text x=chart_geometry::W - chart_geometry::RIGHT y=chart_geometry::H - 2.0 text-anchor="end">"time (UTC)"</text>
    }
}

fn fmt_us(v: Option<u64>) -> String {
    match v {
        None => "—".to_string(),
        Some(u64::MAX) => "> 1 s".to_string(),
        Some(us) => format!("≤ {:.2} ms", us as f64 / 1000.0),
    }
}

/// The store-call latency the edges measured: p50 and p99 per bar as steps, with
/// the 5 ms budget.
pub(super) fn latency_chart(t: &Traffic) -> impl IntoView + use<> {
    let step = t.step();
    let shown = |v: &[Option<u64>]| -> Vec<Option<u64>> {
        v.iter().map(|x| x.map(|u| u.min(1_000_000))).collect()
    };
    let (p50, p99) = (shown(&t.p50_us), shown(&t.p99_us));
    let top = p99.iter().flatten().copied().max().unwrap_or(0).max(5_000);
    // ticks in whole ms
    let axis_ms = chart_geometry::y_axis(top.div_ceil(1000));
    let axis = chart_geometry::Axis {
        max: axis_ms.max * 1000,
        ticks: axis_ms.ticks.iter().map(|t| t * 1000).collect(),
    };
    let latest = |v: &[Option<u64>]| v.iter().rev().flatten().next().copied();
    let budget = chart_geometry::y(5_000, axis.max);
    let n = t.bars;
    let hovers = (0..n)
        .filter(|i| t.p50_us[*i].is_some())
        .map(|i| {
            let (x, w) = chart_geometry::bar(i, n);
            let tip = format!(
                "{}: p50 {}, p99 {}",
                bar_time(t.start + step * i as i64, step),
                fmt_us(t.p50_us[i]),
                fmt_us(t.p99_us[i])
            );
            view! { <g class="bar"><title>{tip}</title><rect class="hover" x=x y=chart_geometry::TOP width=w height=chart_geometry::PLOT_H/></g> }
        })
        .collect_view();
    let rows = (0..n)
        .filter(|i| t.p50_us[*i].is_some())
        .map(|i| {
            view! {
                <tr><th scope="row">{bar_time(t.start + step * i as i64, step)}</th>
                    <td class="num">{fmt_us(t.p50_us[i])}</td><td class="num">{fmt_us(t.p99_us[i])}</td></tr>
            }
        })
        .collect_view();
    let summary = format!(
        "Latest p50 {}, p99 {}; budget 5 ms.",
        fmt_us(latest(&t.p50_us)),
        fmt_us(latest(&t.p99_us))
    );
    view! {
        <section aria-labelledby="latency-h">
            <h2 id="latency-h">"Redis call latency as the edges saw it"</h2>
            <p>{summary.clone()} " Values are histogram bucket bounds; the dotted line is the 5 ms budget."</p>
            <svg class="chart" viewBox=format!("0 0 {} {}", chart_geometry::W, chart_geometry::H) role="img" id="latency"
                aria-label=format!("Store call latency per {}: {summary}", t.resolution.label())>
                {y_axis_view(&axis, "latency (ms)", |v| format!("{}", v / 1000))}
                {x_axis_view(t)}
                <line class="budget" x1=chart_geometry::LEFT x2=chart_geometry::W - chart_geometry::RIGHT y1=budget y2=budget/>
                <text x=chart_geometry::W - chart_geometry::RIGHT - 4.0 y=budget - 4.0 text-anchor="end">"5 ms budget"</text>
                {hovers}
                <path class="line p50" d=chart_geometry::step_path(&p50, axis.max)/>
                <path class="line p99" d=chart_geometry::step_path(&p99, axis.max)/>
            </svg>
            <div class="legend">
                <span><svg viewBox="0 0 28 14" aria-hidden="true" class="chart"><path class="line p50" d="M1 7 H27"/></svg>"p50 (solid)"</span>
                <span><svg viewBox="0 0 28 14" aria-hidden="true" class="chart"><path class="line p99" d="M1 7 H27"/></svg>"p99 (dashed)"</span>
            </div>
            <details>
                <summary>"The numbers"</summary>
                <table class="numbers">
                    <thead><tr><th scope="col">"Time (UTC)"</th><th scope="col" class="num">"p50"</th><th scope="col" class="num">"p99"</th></tr></thead>
                    <tbody>{rows}</tbody>
                </table>
            </details>
        </section>
    }
}
