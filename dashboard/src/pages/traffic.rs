//! The traffic page: per endpoint, allowed, throttled and degraded requests over a
//! range (charts and their numbers, refreshed in the browser), the store's latency,
//! decisions taken without Redis, the most throttled keys, and the bounded limits'
//! figures.

use std::time::Duration;

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::traffic_charts::{endpoint_chart, fill_patterns, latency_chart, legend, sum};
use super::{SessionResource, error_view, every, island_ready};
use crate::api::{leasing_stats, traffic_stats};
use crate::describe::{endpoint_label, try_request};
use crate::error::AppError;
use crate::stats::leasing::LeasingFigures;
use crate::stats::range::{Range, Resolution};
use crate::stats::series::Traffic;
use crate::time;

#[component]
pub fn TrafficPage() -> impl IntoView {
    let query = use_query_map();
    let range = query
        .read_untracked()
        .get("range")
        .and_then(|r| Range::parse(&r))
        .unwrap_or(Range::Minutes15);
    let resolution = range.resolution(
        query
            .read_untracked()
            .get("res")
            .and_then(|r| Resolution::parse(&r)),
    );
    let data = Resource::new(
        || (),
        move |_| traffic_stats(range.code().to_string(), resolution.code().to_string()),
    );
    let figures = Resource::new(|| (), move |_| leasing_stats(range.code().to_string()));
    let session = expect_context::<SessionResource>();
    view! {
        <Title text="Floodgate — traffic"/>
        <h1>"Traffic"</h1>
        <nav class="ranges" aria-label="Time range and resolution">
            <span class="muted">"Range:"</span>
            {Range::ALL.into_iter().map(|r| view! {
                <a href=format!("/?range={}", r.code()) aria-current=(range == r).then_some("true")>{r.label()}</a>
            }).collect_view()}
            <span class="muted">" Resolution:"</span>
            {range.resolutions().iter().map(|res| view! {
                <a href=format!("/?range={}&res={}", range.code(), res.code()) aria-current=(resolution == *res).then_some("true")>{res.label()}</a>
            }).collect_view()}
        </nav>
        {fill_patterns()}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let initial = data.await;
                let edge_url = session.await.ok().and_then(|s| s.edge_url);
                let figures = match figures.await {
                    Ok(f) => leasing_view(f).into_any(),
                    Err(_) => ().into_any(), // the live part shows the error
                };
                view! { <TrafficLive range=range resolution=resolution initial=initial edge_url=edge_url/> {figures} }
            })}
        </Suspense>
    }
}

/// The traffic data, refreshed in the browser (every 3 s; 30 s over 24 hours, which
/// reads 1,440 per-minute hashes).
#[island]
fn TrafficLive(
    range: Range,
    resolution: Resolution,
    initial: Result<Traffic, AppError>,
    edge_url: Option<String>,
) -> impl IntoView {
    island_ready();
    let data = RwSignal::new(initial);
    every(Duration::from_secs(range.refresh_secs()), move || {
        leptos::task::spawn_local(async move {
            data.set(traffic_stats(range.code().to_string(), resolution.code().to_string()).await);
        });
    });
    move || match data.get() {
        Ok(t) => traffic_view(t, edge_url.as_deref()).into_any(),
        Err(e) => error_view(e),
    }
}

/// The range's totals per endpoint, its charts, latency, degraded decisions and
/// most throttled keys.
fn traffic_view(t: Traffic, edge_url: Option<&str>) -> impl IntoView + use<> {
    let no_traffic = t.endpoints.is_empty().then(|| no_traffic(edge_url));
    let step = t.step();
    let per = format!("requests per {}", t.resolution.label());
    let totals: Vec<_> = t
        .endpoints
        .iter()
        .map(|(e, s)| {
            (
                endpoint_label(e, &t.patterns),
                e.route().unwrap_or_default().to_string(),
                sum(&s.allowed),
                sum(&s.throttled),
                sum(&s.degraded),
                sum(&s.shadow),
            )
        })
        .collect();
    let charts = t
        .endpoints
        .iter()
        .map(|(e, s)| endpoint_chart(&t, e, s, &per))
        .collect_view();
    view! {
        <p class="muted">
            {format!("The last {}, one bar per {}, ending {} (times in UTC). Updates every {} s.",
                t.range.label(), t.resolution.label(), time::utc(t.start + step * t.bars as i64), t.range.refresh_secs())}
        </p>
        {legend()}
        {no_traffic}
        <table id="totals">
            <caption class="sr-only">"Totals per endpoint over the range"</caption>
            <thead><tr><th scope="col">"Endpoint"</th><th scope="col" class="num">"Allowed"</th><th scope="col" class="num">"Throttled (429)"</th><th scope="col" class="num">"Degraded"</th><th scope="col" class="num">"Would have throttled (shadow)"</th></tr></thead>
            <tbody>
                {totals.into_iter().map(|(label, route, a, th, d, sh)| view! {
                    <tr data-route=route><th scope="row">{label}</th><td class="num">{a}</td><td class="num throttled-count">{th}</td><td class="num">{d}</td><td class="num shadow-count">{sh}</td></tr>
                }).collect_view()}
            </tbody>
        </table>
        {charts}
        {latency_chart(&t)}
        {degraded_view(&t)}
        <h2>{format!("Most throttled keys (last {} min)", t.top_minutes)}</h2>
        <table id="top-throttled">
            <thead><tr><th scope="col">"Key id"</th><th scope="col" class="num">"429s"</th></tr></thead>
            <tbody>
                {t.top_throttled.iter().map(|(k, n)| view! { <tr><td><code>{k.clone()}</code></td><td class="num">{*n}</td></tr> }).collect_view()}
            </tbody>
        </table>
    }
}

/// No traffic yet: what to send, and where it will show.
fn no_traffic(edge_url: Option<&str>) -> impl IntoView + use<> {
    let example = try_request(edge_url, "KEY", "/");
    view! {
        <div id="no-traffic">
            <p>"No traffic recorded in this range yet."</p>
            <p>"Send requests through the edge with an API key (create one on the " <a href="/keys">"API keys"</a> " page, which shows this line with its secret):"</p>
            <pre><code>{example}</code></pre>
            <p>"Each endpoint then gets a chart here within seconds: allowed requests as solid bars, requests answered 429 (throttled) as hatched bars, also counted in the table's Throttled (429) column and, per key, under Most throttled keys."</p>
        </div>
    }
}

/// The bounded and `auto` limits' figures over the range, as text (rendered on
/// the server: not part of the live island).
fn leasing_view(t: LeasingFigures) -> impl IntoView {
    let rows = t
        .policies
        .iter()
        .map(|l| {
            view! {
                <tr data-policy=l.policy.clone()>
                    <th scope="row">{l.policy.clone()}</th><td>{l.label()}</td>
                    <td class="local">{l.local_text()}</td><td class="saved">{l.saved_text()}</td><td class="budget">{l.budget_text()}</td>
                </tr>
            }
        })
        .collect_view();
    let regions = (t.regions > 0).then(|| format!(
        " With {r} regions, each region may admit max_overshoot / (4 × {r}) tokens of a key on credit; N is what that leaves of the bound.",
        r = t.regions
    ));
    let table = (!t.policies.is_empty()).then(|| view! {
        <p class="muted">"Decided locally: from tokens at hand, without a round trip to the global Redis. Calls saved: local decisions less the global calls that refilled leases and pools. Budget in use: the tokens outstanding at a refill, on average, of the N tokens the global Redis leases of the bound. As of loading the page (the charts above refresh on their own)." {regions}</p>
        <table id="consistency">
            <thead><tr><th scope="col">"Limit"</th><th scope="col">"Across edges"</th><th scope="col">"Decided locally"</th><th scope="col">"Global Redis calls saved"</th><th scope="col">"Overshoot budget in use"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
    });
    view! {
        <h2>"Limits decided at the edge (bounded and auto)"</h2>
        {t.policies.is_empty().then(|| view! { <p id="no-bounded">"No bounded policies: every limit is exact (each request asks the global Redis)."</p> })}
        {table}
    }
}

fn degraded_view(t: &Traffic) -> impl IntoView + use<> {
    let modes = t
        .degraded_by_mode
        .iter()
        .map(|(m, n)| format!("{}: {n}", m.name()))
        .collect::<Vec<_>>()
        .join(" · ");
    let rows = t
        .degraded_by_endpoint_mode
        .iter()
        .map(|(e, m, n)| {
            view! { <tr><td>{endpoint_label(e, &t.patterns)}</td><td>{m.name()}</td><td class="num">{*n}</td></tr> }
        })
        .collect_view();
    let breaker = format!(
        "Circuit breakers opened {} times; open for {:.1} s in total (all edges, this range).",
        t.breaker_opened,
        t.breaker_open_ms as f64 / 1000.0
    );
    let denied = if t.denied.is_empty() {
        "No request was denied by a deny list.".to_string()
    } else {
        format!(
            "Denied by list: {}.",
            t.denied
                .iter()
                .map(|(l, n)| format!("{}: {n}", l.name()))
                .collect::<Vec<_>>()
                .join(" · ")
        )
    };
    view! {
        <h2>"Decisions taken without Redis"</h2>
        <p id="breaker">{breaker}</p>
        <p id="denied">{denied}</p>
        <p id="modes">{if modes.is_empty() { "No degraded decisions.".to_string() } else { format!("By failure mode: {modes}") }}</p>
        <table id="degraded-modes">
            <thead><tr><th scope="col">"Endpoint"</th><th scope="col">"Failure mode"</th><th scope="col" class="num">"Decisions"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
}
