//! The pages. Rendered whole on the server (`SsrMode::Async`: the content is in the
//! HTML, readable without JavaScript) as Leptos islands: only the parts that move
//! are hydrated (`#[island]`: the traffic charts' refresh, the policy form with its
//! backtest, the effective-limits tool, key creation with its copy button, the keys
//! table with live usage, local times), so the browser bundle carries only them.
//! Every form is an `ActionForm` over a server function: a plain POST without the
//! wasm (or outside an island), whose errors come back on the page (Leptos carries
//! them in the redirect); inside an island, a call that reloads the page once saved.

use std::time::Duration;

use floodgate_shared::config::{ConfigSpec, Source};
use floodgate_shared::stats::Endpoint;
use leptos::prelude::*;
use leptos_meta::{MetaTags, Title, provide_meta_context};
use leptos_router::SsrMode;
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::hooks::use_query_map;
use leptos_router::path;

use crate::api::*;
use crate::chart;
use crate::model::*;
use crate::time;

pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <meta name="color-scheme" content="light dark"/>
                <link rel="icon" href="/favicon.ico" type="image/x-icon"/>
                <style>{STYLE}</style>
                <HydrationScripts options islands=true/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// The pages' style sheet (also the outage page's).
pub const STYLE: &str = r#"
:root { --bg:#ffffff; --fg:#1d2433; --muted:#545d70; --line:#c9d1dc; --grid:#e3e7ee; --card:#f6f8fb;
  --allowed:#1a7f37; --throttled:#cf222e; --degraded:#9a6700; --p50:#0969da; --p99:#8250df; --budget:#cf222e;
  --accent:#0969da; --shadow:#57606a; --banner-bg:#fff1e5; --banner-line:#bc4c00; }
@media (prefers-color-scheme: dark) {
  :root { --bg:#0d1117; --fg:#e6edf3; --muted:#9aa4b2; --line:#3d444d; --grid:#262c34; --card:#161b22;
    --allowed:#3fb950; --throttled:#ff7b72; --degraded:#d29922; --p50:#58a6ff; --p99:#bc8cff; --budget:#ff7b72;
    --accent:#58a6ff; --shadow:#9aa4b2; --banner-bg:#3d1d00; --banner-line:#f0883e; } }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.45 system-ui, sans-serif; background:var(--bg); color:var(--fg); }
a { color:var(--accent); }
nav.top { display:flex; gap:1rem; align-items:center; padding:.6rem 1.2rem; border-bottom:1px solid var(--line); flex-wrap:wrap; }
nav.top a { color:var(--fg); text-decoration:none; } nav.top a[aria-current] { font-weight:700; color:var(--accent); text-decoration:underline; }
nav.top .who { margin-left:auto; color:var(--muted); display:flex; gap:.6rem; align-items:center; }
main { padding:1rem 1.2rem; }
h1 { font-size:1.3rem; } h2 { font-size:1.05rem; margin-top:1.6rem; }
table { border-collapse:collapse; width:100%; margin:.4rem 0 1rem; }
th, td { text-align:left; padding:.3rem .5rem; border-bottom:1px solid var(--line); vertical-align:top; }
td.num, th.num { text-align:right; font-variant-numeric: tabular-nums; }
form.card, .card { background:var(--card); border:1px solid var(--line); border-radius:6px; padding:.8rem; margin:.6rem 0; }
form.card label { display:inline-flex; flex-direction:column; margin:0 .8rem .5rem 0; font-size:.85rem; color:var(--muted); }
input, select, button { font:inherit; padding:.25rem .4rem; color:var(--fg); background:var(--bg); border:1px solid var(--line); border-radius:4px; }
button { cursor:pointer; } button.danger { color:var(--throttled); border-color:var(--throttled); }
.error, .field-error { color:var(--throttled); } .field-error { font-size:.8rem; }
.ok { color:var(--allowed); }
.muted { color:var(--muted); }
.banner { background:var(--banner-bg); border:1px solid var(--banner-line); border-left-width:6px; border-radius:4px; padding:.6rem .8rem; margin:.6rem 0; color:var(--fg); }
.secret { font-family:monospace; font-size:1rem; padding:.5rem; border:2px dashed var(--accent); display:inline-block; user-select:all; word-break:break-all; }
#policy-form:has(select[name=consistency] option[value=exact]:checked) label.bound:not(:has(.field-error)) { display:none; }
ul.help { margin:.2rem 0 .6rem; padding-left:1.2rem; font-size:.85rem; }
.sr-only { position:absolute; width:1px; height:1px; padding:0; margin:-1px; overflow:hidden; clip:rect(0,0,0,0); white-space:nowrap; border:0; }
.ranges { display:flex; gap:.4rem; flex-wrap:wrap; align-items:center; margin:.4rem 0; }
.ranges a { padding:.15rem .5rem; border:1px solid var(--line); border-radius:4px; text-decoration:none; color:var(--fg); }
.ranges a[aria-current] { background:var(--accent); color:var(--bg); border-color:var(--accent); }
svg.chart { display:block; width:100%; height:auto; color:var(--muted); }
svg.chart text { fill:var(--muted); font-size:12px; }
svg.chart .grid { stroke:var(--grid); } svg.chart .axis { stroke:var(--line); }
svg.chart .allowed { fill:var(--allowed); } svg.chart .throttled { fill:url(#pat-throttled); stroke:var(--throttled); stroke-width:.5; }
svg.chart .degraded { fill:url(#pat-degraded); stroke:var(--degraded); stroke-width:.5; }
svg.chart .hover { fill:transparent; } svg.chart g.bar:hover .hover { fill:var(--fg); fill-opacity:.08; }
svg.chart path.line { fill:none; stroke-width:2; }
svg.chart .shadow { stroke:var(--shadow); stroke-dasharray:6 3; }
svg.chart .p50 { stroke:var(--p50); } svg.chart .p99 { stroke:var(--p99); stroke-dasharray:8 3; }
svg.chart .budget { stroke:var(--budget); stroke-dasharray:2 3; stroke-width:1.5; }
.pt-throttled rect { fill:var(--throttled); } .pt-throttled line { stroke:var(--bg); stroke-width:1.6; }
.pt-degraded rect { fill:var(--degraded); } .pt-degraded circle { fill:var(--bg); }
.legend { display:flex; flex-wrap:wrap; gap:1rem; margin:.3rem 0; }
.legend span { display:inline-flex; align-items:center; gap:.35rem; }
.legend svg { width:28px; height:14px; }
details { margin:.3rem 0 1rem; } summary { cursor:pointer; color:var(--accent); }
pre { white-space:pre-wrap; word-break:break-all; margin:0; font-size:.8rem; }
ul.changes { margin:0; padding-left:1rem; } ul.changes code { font-size:.85rem; }
"#;

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Title text="Floodgate"/>
        <Router>
            <Routes fallback=|| view! { <main><h1>"Not found"</h1><p>"No page here. " <a href="/">"Traffic"</a></p></main> }>
                <Route path=path!("/login") view=LoginPage ssr=SsrMode::Async/>
                <Route path=path!("/") view=|| view! { <Layout><TrafficPage/></Layout> } ssr=SsrMode::Async/>
                <Route path=path!("/policies") view=|| view! { <Layout><PoliciesPage/></Layout> } ssr=SsrMode::Async/>
                <Route path=path!("/keys") view=|| view! { <Layout><KeysPage/></Layout> } ssr=SsrMode::Async/>
                <Route path=path!("/audit") view=|| view! { <Layout><AuditPage/></Layout> } ssr=SsrMode::Async/>
            </Routes>
        </Router>
    }
}

/// The signed-in session, shared by a page's forms.
type SessionResource = Resource<Result<SessionInfo, AppError>>;

/// Sends the browser to sign-in (a session that ended); nothing on the server,
/// where the guard redirects before any page renders.
fn go_to_sign_in() {
    #[cfg(feature = "hydrate")]
    {
        let _ = window().location().set_href("/login?session=ended");
    }
}

/// An error where a page's content would be: a session that ended goes to sign-in,
/// an outage is a banner, anything else a message.
fn error_view(e: AppError) -> AnyView {
    match e {
        AppError::SignedOut => {
            go_to_sign_in();
            view! {
                <p class="banner" role="alert" id="signed-out">
                    "Your session has ended. " <a href="/login?session=ended">"Sign in again"</a>
                </p>
            }
            .into_any()
        }
        e if e.is_outage() => view! {
            <div class="banner" role="alert" id="outage"><strong>"Unavailable. "</strong>{e.to_string()}</div>
        }
        .into_any(),
        e => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
    }
}

#[component]
fn LoginPage() -> impl IntoView {
    let login = ServerAction::<Login>::new();
    let query = use_query_map();
    let ended = move || query.read().get("session").as_deref() == Some("ended");
    view! {
        <Title text="Floodgate — sign in"/>
        <main>
            <h1>"Floodgate — sign in"</h1>
            {move || (ended() && login.value().get().is_none()).then(|| view! {
                <p class="banner" role="status" id="session-ended">"Your session has ended; sign in again."</p>
            })}
            <ActionForm action=login attr:class="card" attr:id="login">
                <label>"User" <input name="username" autocomplete="username" required/></label>
                <label>"Password" <input type="password" name="password" autocomplete="current-password" required/></label>
                <button type="submit">"Sign in"</button>
            </ActionForm>
            {move || login.value().get().and_then(Result::err).map(error_view)}
        </main>
    }
}

#[component]
fn Layout(children: Children) -> impl IntoView {
    let session: SessionResource = Resource::new(|| (), |_| current_session());
    provide_context(session);
    let logout = ServerAction::<Logout>::new();
    view! {
        <nav class="top" aria-label="Pages">
            <strong>"Floodgate"</strong>
            <A href="/">"Traffic"</A>
            <A href="/policies">"Policies"</A>
            <A href="/keys">"API keys"</A>
            <A href="/audit">"Audit log"</A>
            <span class="who">
                <Suspense fallback=|| ()>
                    {move || Suspend::new(async move {
                        session.await.ok().map(|s| view! {
                            <span id="user">{s.user}</span>
                            <ActionForm action=logout>
                                <input type="hidden" name="csrf" value=s.csrf/>
                                <button type="submit">"Sign out"</button>
                            </ActionForm>
                        })
                    })}
                </Suspense>
            </span>
        </nav>
        <main>{children()}</main>
    }
}

/// An action's latest answer, as a copyable signal.
fn val<S>(action: ServerAction<S>) -> Signal<Option<Result<S::Output, AppError>>>
where
    S: leptos::server_fn::ServerFn<Error = AppError> + Clone + Send + Sync + 'static,
    S::Output: Clone + Send + Sync + 'static,
{
    Signal::derive(move || action.value().get())
}

/// A form's outcome: the success message, or an error the form's own fields do
/// not show (those are next to their field, by [`field_error`]).
fn outcome<T: Clone + Send + Sync + 'static>(
    value: Signal<Option<Result<T, AppError>>>,
    ok: impl Fn(&T) -> Option<String> + Send + Sync + 'static,
    fields: &'static [&'static str],
) -> impl IntoView {
    move || match value.get() {
        None => None,
        Some(Ok(v)) => ok(&v).map(|m| view! { <p class="ok" role="status">{m}</p> }.into_any()),
        Some(Err(AppError::Invalid { field, .. })) if fields.contains(&field.as_str()) => None,
        Some(Err(e)) => Some(error_view(e)),
    }
}

fn field_error<T: Clone + Send + Sync + 'static>(
    value: Signal<Option<Result<T, AppError>>>,
    field: &'static str,
) -> impl IntoView {
    move || {
        value
            .get()
            .and_then(Result::err)
            .and_then(|e| e.message_for(field))
            .map(|m| view! { <span class="field-error" data-field=field role="alert">{m}</span> })
    }
}

fn saved_message(s: &Saved) -> Option<String> {
    match s {
        Saved::Ok(m) => Some(m.clone()),
        Saved::Preview(_) => None,
    }
}

/// A signal that turns true once the page is hydrated (for what only the browser
/// knows, like its time zone), so server and browser render the same first.
fn hydrated() -> RwSignal<bool> {
    let done = RwSignal::new(false);
    Effect::new(move |_| done.set(true));
    done
}

/// Counts a hydrated island on `<body data-islands>` (the browser tests wait for
/// every `<leptos-island>` of a page to be counted).
fn island_ready() {
    Effect::new(|_| {
        #[cfg(feature = "hydrate")]
        if let Some(body) = document().body() {
            let n: u32 = body
                .get_attribute("data-islands")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let _ = body.set_attribute("data-islands", &(n + 1).to_string());
        }
    });
}

/// Loads `path` afresh (after a save, so every part of the page shows it).
fn reload(path: &str) {
    #[cfg(feature = "hydrate")]
    {
        let _ = window().location().assign(path);
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = path;
}

/// Runs `f` every `every` in the browser (never on the server).
fn every(every: Duration, f: impl Fn() + Clone + 'static) {
    Effect::new(move |_| {
        let handle = set_interval_with_handle(f.clone(), every).ok();
        on_cleanup(move || {
            if let Some(h) = handle {
                h.clear();
            }
        });
    });
}

/// A time as `<time>`: UTC, and the reader's local time once hydrated.
fn when(secs: i64, ready: RwSignal<bool>) -> impl IntoView {
    view! {
        <time datetime=time::rfc3339(secs)>{time::utc(secs)}</time>
        {move || ready.get().then(|| time::local(secs)).flatten().map(|l| view! {
            <br/><span class="muted local">{format!("local {l}")}</span>
        })}
    }
}

/// [`when`] as an island of its own, for pages that are otherwise static.
#[island]
fn LocalTime(secs: i64) -> impl IntoView {
    island_ready();
    when(secs, hydrated())
}

// ----- traffic --------------------------------------------------------------------

#[component]
fn TrafficPage() -> impl IntoView {
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
        {patterns()}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let initial = data.await;
                let figures = match figures.await {
                    Ok(f) => leasing_view(f).into_any(),
                    Err(_) => ().into_any(), // the live part shows the error
                };
                view! { <TrafficLive range=range resolution=resolution initial=initial/> {figures} }
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
) -> impl IntoView {
    island_ready();
    let data = RwSignal::new(initial);
    every(Duration::from_secs(range.refresh_secs()), move || {
        leptos::task::spawn_local(async move {
            data.set(traffic_stats(range.code().to_string(), resolution.code().to_string()).await);
        });
    });
    move || match data.get() {
        Ok(t) => traffic_view(t).into_any(),
        Err(e) => error_view(e),
    }
}

/// The fill patterns of the bars (one definition per page), so throttled and
/// degraded differ by more than colour.
fn patterns() -> impl IntoView {
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

fn legend() -> impl IntoView {
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
fn bar_time(start: i64, step: i64) -> String {
    let seconds = step < 60;
    format!(
        "{}–{}",
        time::utc_time(start, seconds).trim_end_matches(" UTC"),
        time::utc_time(start + step, seconds)
    )
}

fn sum(v: &[u64]) -> u64 {
    v.iter().sum()
}

fn traffic_view(t: Traffic) -> impl IntoView {
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
    let empty = t.endpoints.is_empty();
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
        {empty.then(|| view! { <p id="no-traffic">"No traffic recorded in this range yet."</p> })}
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

/// One endpoint's stacked bars: allowed, throttled, degraded, with the shadow
/// policies' would-be 429s as a dashed step line; a title per bar for hover, and
/// the numbers as a table.
fn endpoint_chart(t: &Traffic, e: &Endpoint, s: &Series, per: &str) -> impl IntoView + use<> {
    let step = t.step();
    let label = endpoint_label(e, &t.patterns);
    let n = t.bars;
    let totals: Vec<u64> = (0..n)
        .map(|i| s.allowed[i] + s.throttled[i] + s.degraded[i])
        .collect();
    let axis = chart::y_axis(totals.iter().chain(&s.shadow).copied().max().unwrap_or(0));
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
            let (x, w) = chart::bar(i, n);
            let segs = chart::stack(&[s.allowed[i], s.throttled[i], s.degraded[i]], axis.max);
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
                    <rect class="hover" x=x y=chart::TOP width=w height=chart::PLOT_H/>
                    <rect class="allowed" x=x y=segs[0].0 width=w height=segs[0].1/>
                    <rect class="throttled" x=x y=segs[1].0 width=w height=segs[1].1/>
                    <rect class="degraded" x=x y=segs[2].0 width=w height=segs[2].1/>
                </g>
            }
        })
        .collect_view();
    let shadow: Vec<Option<u64>> = s.shadow.iter().map(|v| Some(*v)).collect();
    let has_shadow = s.shadow.iter().any(|v| *v > 0);
    let rows = (0..n)
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
        .collect_view();
    view! {
        <section class="endpoint" aria-labelledby=format!("{id}-h")>
            <h2 id=format!("{id}-h")>{label.clone()}</h2>
            <svg class="chart" viewBox=format!("0 0 {} {}", chart::W, chart::H) role="img"
                aria-label=format!("{per} to {label}: {summary}")
                data-route=e.route().unwrap_or_default().to_string() data-endpoint=e.to_string()
                data-throttled=sum(&s.throttled).to_string() data-allowed=sum(&s.allowed).to_string()>
                {y_axis_view(&axis, per, |v| v.to_string())}
                {x_axis_view(t)}
                {bars}
                {has_shadow.then(|| view! { <path class="line shadow" d=chart::step_path(&shadow, axis.max)/> })}
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

/// Gridlines and labels of a y axis, with its title (the unit).
fn y_axis_view(axis: &chart::Axis, title: &str, label: fn(u64) -> String) -> impl IntoView + use<> {
    let ticks = axis
        .ticks
        .iter()
        .map(|v| {
            let y = chart::y(*v, axis.max);
            view! {
                <line class="grid" x1=chart::LEFT x2=chart::W - chart::RIGHT y1=y y2=y/>
                <text x=chart::LEFT - 6.0 y=y + 4.0 text-anchor="end">{label(*v)}</text>
            }
        })
        .collect_view();
    let mid = chart::TOP + chart::PLOT_H / 2.0;
    view! {
        {ticks}
        <text x="14" y=mid text-anchor="middle" transform=format!("rotate(-90 14 {mid})")>{title.to_string()}</text>
    }
}

/// The time axis: a tick and label at each round time, and its title.
fn x_axis_view(t: &Traffic) -> impl IntoView + use<> {
    let bottom = chart::TOP + chart::PLOT_H;
    let ticks = chart::time_ticks(t.start, t.step(), t.bars)
        .into_iter()
        .map(|(x, at)| {
            view! {
                <line class="axis" x1=x x2=x y1=bottom y2=bottom + 5.0/>
                <text x=x y=bottom + 17.0 text-anchor="middle">{time::hh_mm(at)}</text>
            }
        })
        .collect_view();
    view! {
        <line class="axis" x1=chart::LEFT x2=chart::W - chart::RIGHT y1=bottom y2=bottom/>
        {ticks}
        <text x=chart::W - chart::RIGHT y=chart::H - 2.0 text-anchor="end">"time (UTC)"</text>
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
fn latency_chart(t: &Traffic) -> impl IntoView + use<> {
    let step = t.step();
    let shown = |v: &[Option<u64>]| -> Vec<Option<u64>> {
        v.iter().map(|x| x.map(|u| u.min(1_000_000))).collect()
    };
    let (p50, p99) = (shown(&t.p50_us), shown(&t.p99_us));
    let top = p99.iter().flatten().copied().max().unwrap_or(0).max(5_000);
    // ticks in whole ms
    let axis_ms = chart::y_axis(top.div_ceil(1000));
    let axis = chart::Axis {
        max: axis_ms.max * 1000,
        ticks: axis_ms.ticks.iter().map(|t| t * 1000).collect(),
    };
    let latest = |v: &[Option<u64>]| v.iter().rev().flatten().next().copied();
    let budget = chart::y(5_000, axis.max);
    let n = t.bars;
    let hovers = (0..n)
        .filter(|i| t.p50_us[*i].is_some())
        .map(|i| {
            let (x, w) = chart::bar(i, n);
            let tip = format!(
                "{}: p50 {}, p99 {}",
                bar_time(t.start + step * i as i64, step),
                fmt_us(t.p50_us[i]),
                fmt_us(t.p99_us[i])
            );
            view! { <g class="bar"><title>{tip}</title><rect class="hover" x=x y=chart::TOP width=w height=chart::PLOT_H/></g> }
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
            <svg class="chart" viewBox=format!("0 0 {} {}", chart::W, chart::H) role="img" id="latency"
                aria-label=format!("Store call latency per {}: {summary}", t.resolution.label())>
                {y_axis_view(&axis, "latency (ms)", |v| format!("{}", v / 1000))}
                {x_axis_view(t)}
                <line class="budget" x1=chart::LEFT x2=chart::W - chart::RIGHT y1=budget y2=budget/>
                <text x=chart::W - chart::RIGHT - 4.0 y=budget - 4.0 text-anchor="end">"5 ms budget"</text>
                {hovers}
                <path class="line p50" d=chart::step_path(&p50, axis.max)/>
                <path class="line p99" d=chart::step_path(&p99, axis.max)/>
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
        " With {r} regions, each region may admit max_overshoot / (2 × {r}) tokens of a key on credit; N is what that leaves of the bound.",
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

// ----- policies -------------------------------------------------------------------

#[component]
fn PoliciesPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    // plain forms (outside islands): a post, then the page again, with any error
    // next to its field
    let delete_policy = ServerAction::<DeletePolicy>::new();
    let save_plan = ServerAction::<SavePlan>::new();
    let delete_plan = ServerAction::<DeletePlan>::new();
    let save_route = ServerAction::<SaveRoute>::new();
    let delete_route = ServerAction::<DeleteRoute>::new();
    let save_override = ServerAction::<SaveOverride>::new();
    let delete_override = ServerAction::<DeleteOverride>::new();
    let save_ip = ServerAction::<SaveIpPolicies>::new();
    let save_headers = ServerAction::<SaveHeaders>::new();
    let save_deny = ServerAction::<SaveDeny>::new();
    let config = Resource::new(|| (), |_| get_config());
    // the deny lists' counts over the last 24 h
    let denied = Resource::new(|| (), |_| traffic_stats("24h".into(), String::new()));
    // which item's form is filled in (`Edit` is a link)
    let query = use_query_map();
    let editing = move |k: &str| query.read_untracked().get(k);
    view! {
        <Title text="Floodgate — policies"/>
        <h1>"Policies"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let (s, c) = match (session.await, config.await) {
                    (Ok(s), Ok(c)) => (s, c),
                    (Err(e), _) | (_, Err(e)) => return error_view(e),
                };
                let csrf = s.csrf.clone();
                let version = c.version.clone();
                let spec = c.spec.clone().unwrap_or_default();
                view! {
                    <p>"Configuration version " <code id="config-version">{if version.is_empty() { "(none stored)".to_string() } else { version[..12.min(version.len())].to_string() }}</code>
                       ". The edge picks up a saved change within two cache TTLs (10 s by default)."</p>
                    {policy_section(&spec, &csrf, &version, delete_policy, editing("edit"))}
                    {plan_section(&spec, &csrf, &version, save_plan, delete_plan, editing("edit_plan"))}
                    {route_section(&spec, &csrf, &version, save_route, delete_route, editing("edit_route"))}
                    {override_section(&spec, &csrf, &version, save_override, delete_override, save_ip)}
                    {headers_section(&spec, &csrf, &version, save_headers)}
                    {deny_section(&spec, &csrf, &version, save_deny, denied.await.ok().map(|t| t.denied))}
                    <EffectiveLimitsTool/>
                }
                .into_any()
            })}
        </Suspense>
    }
}

fn hidden(csrf: &str, version: &str) -> impl IntoView + use<> {
    view! {
        <input type="hidden" name="csrf" value=csrf.to_string()/>
        <input type="hidden" name="version" value=version.to_string()/>
    }
}

const DIMENSION_CHOICES: [&str; 6] = [
    "api_key",
    "api_key,endpoint",
    "client_ip",
    "api_key,client_ip",
    "endpoint",
    "api_key,endpoint,client_ip",
];

fn policy_section(
    spec: &ConfigSpec,
    csrf: &str,
    version: &str,
    delete: ServerAction<DeletePolicy>,
    editing: Option<String>,
) -> impl IntoView + use<> {
    let rows = spec
        .policies
        .iter()
        .map(|p| {
            let form = PolicyForm::from_spec(p);
            let name = p.name.clone();
            let (field_name, row) = (name.clone(), name.clone());
            let (csrf, version) = (csrf.to_string(), version.to_string());
            view! {
                <tr data-policy=row>
                    <td>{name.clone()}</td>
                    <td>{form.dimensions.clone()}</td>
                    <td class="limit">{describe_quota(p)}</td>
                    <td>{p.cost}</td>
                    <td>{form.failure_mode.clone()}{form.shadow.then_some(" · shadow (not enforced)")}</td>
                    <td class="consistency">{describe_consistency(p)}</td>
                    <td>
                        <a class="edit" href=format!("/policies?edit={name}#policy-form")>"Edit"</a>
                        " "
                        <ActionForm action=delete attr:style="display:inline">
                            {hidden(&csrf, &version)}
                            <input type="hidden" name="name" value=field_name/>
                            <button type="submit" class="danger">"Delete"</button>
                        </ActionForm>
                    </td>
                </tr>
            }
        })
        .collect_view();
    let edited = editing.and_then(|name| spec.policies.iter().find(|p| p.name == name));
    let (form, original) = match edited {
        Some(p) => (PolicyForm::from_spec(p), p.name.clone()),
        None => (PolicyForm::default(), String::new()),
    };
    view! {
        <h2>"Limits"</h2>
        <table id="policies">
            <thead><tr><th scope="col">"Name"</th><th scope="col">"Keyed by"</th><th scope="col">"Limit"</th><th scope="col">"Cost"</th><th scope="col">"If Redis fails"</th><th scope="col">"Across edges"</th><th scope="col">"Actions"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
        {outcome(val(delete), saved_message, &[])}
        // outside the island: static text, not in the browser bundle
        <div class="muted" id="consistency-help">
            "Consistency across edges, in the form below:"
            <ul class="help">
                <li>"Exact (default): every request asks the global Redis: one round trip each, never over the limit."</li>
                <li>"Bounded: edges decide warm keys locally, from tokens taken from the global Redis in advance, without waiting for it. In any window, all edges together admit at most N tokens above the limit (N requests at a cost of 1)."</li>
                <li>"Auto: exact until a key is busy on an edge, then bounded while it stays busy."</li>
                <li>"N is 1 to the capacity. Bounded and auto need the token bucket algorithm, and work neither with shadow nor with max in flight."</li>
            </ul>
        </div>
        <PolicyEditor form=form original=original csrf=csrf.to_string() version=version.to_string()/>
    }
}

/// The form of a new or edited limit, with its backtest; a save reloads the page.
#[island]
fn PolicyEditor(
    form: PolicyForm,
    original: String,
    csrf: String,
    version: String,
) -> impl IntoView {
    island_ready();
    let save = ServerAction::<SavePolicy>::new();
    Effect::new(move |_| {
        if matches!(save.value().get(), Some(Ok(Saved::Ok(_)))) {
            reload("/policies");
        }
    });
    let f = form;
    let title = if original.is_empty() {
        "New limit".to_string()
    } else {
        format!("Edit limit {original}")
    };
    let dims = f.dimensions.clone();
    let mode = f.failure_mode.clone();
    let algo = if f.algorithm.is_empty() {
        "token_bucket".to_string()
    } else {
        f.algorithm.clone()
    };
    let fields: &'static [&'static str] = &POLICY_FIELDS;
    let chosen = if f.consistency.is_empty() {
        "exact".to_string()
    } else {
        f.consistency.clone()
    };
    view! {
        <ActionForm action=save attr:class="card" attr:id="policy-form">
            <strong>{title}</strong><br/>
            {hidden(&csrf, &version)}
            <input type="hidden" name="original" value=original.clone()/>
            <label>"Name" <input name="name" value=f.name.clone()/>{field_error(val(save), "name")}</label>
            <label>"Keyed by"
                <select name="dimensions">
                    {DIMENSION_CHOICES.iter().map(|d| view! { <option value=*d selected=dims == *d>{d.replace(',', " + ")}</option> }).collect_view()}
                </select>
                {field_error(val(save), "dimensions")}
            </label>
            <label>"Capacity (burst)" <input name="capacity" inputmode="numeric" value=f.capacity.clone()/>{field_error(val(save), "quota.capacity")}</label>
            <label>"Per period" <input name="period" placeholder="1m" value=f.period.clone()/>{field_error(val(save), "quota.period")}</label>
            <label>"Refill per period (default = capacity)" <input name="refill" inputmode="numeric" value=f.refill.clone()/>{field_error(val(save), "quota.refill")}</label>
            <label>"Cost per request" <input name="cost" inputmode="numeric" placeholder="1" value=f.cost.clone()/>{field_error(val(save), "cost")}</label>
            <label>"If Redis fails"
                <select name="failure_mode">
                    <option value="fail_closed" selected=mode != "fail_open">"fail closed (503)"</option>
                    <option value="fail_open" selected=mode == "fail_open">"fail open (allow, marked)"</option>
                    <option value="local_fallback" selected=mode == "local_fallback">"local fallback (a share per instance)"</option>
                </select>
                {field_error(val(save), "failure_mode")}
            </label>
            <label>"Local share % (local fallback)" <input name="local_share_percent" inputmode="numeric" value=f.local_share_percent.clone()/>{field_error(val(save), "local_share_percent")}</label>
            <label>"Max in flight (optional)" <input name="max_in_flight" inputmode="numeric" value=f.max_in_flight.clone()/>{field_error(val(save), "max_in_flight")}</label>
            <label>"Algorithm"
                <select name="algorithm">
                    {ALGORITHMS.iter().map(|(v, label)| view! { <option value=*v selected=algo == *v>{*label}</option> }).collect_view()}
                </select>
                {field_error(val(save), "algorithm")}
            </label>
            <label>"Shadow (count, never enforce)" <input type="checkbox" name="shadow" checked=f.shadow/></label>
            <label>"Consistency across edges"
                <select name="consistency" aria-describedby="consistency-help" on:change=|ev| send_bound(event_target_value(&ev) != "exact")>
                    <option value="exact" selected=chosen == "exact">"exact (every request asks the global Redis)"</option>
                    <option value="bounded" selected=chosen == "bounded">"bounded (decided at the edge, at most N over)"</option>
                    <option value="auto" selected=chosen == "auto">"auto (exact until a key is busy, then bounded)"</option>
                </select>
                {field_error(val(save), "consistency")}
            </label>
            <label class="bound">"Overshoot bound N (tokens; bounded or auto)"
                <input name="max_overshoot" inputmode="numeric" aria-describedby="consistency-help" value=f.max_overshoot.clone()/>
                {field_error(val(save), "max_overshoot")}
            </label>
            <br/>

            <button type="submit" name="preview" value="1" id="backtest">"Backtest on recent traffic"</button>
            " "
            <button type="submit" id="save-limit">"Save limit"</button>
            " "
            <a href="/policies#policy-form">"New limit"</a>
            {outcome(val(save), saved_message, fields)}
            {move || match save.value().get() {
                Some(Ok(Saved::Preview(b))) => Some(backtest_view(b)),
                _ => None,
            }}
        </ActionForm>
    }
}

/// The policy form's bound is hidden by the style sheet while exact is chosen (with
/// or without JavaScript; a bound sent with exact is refused, and its error shows
/// the field again). Once hydrated, switching to exact also stops it being sent
/// (disabled), so a bounded limit is switched back in one save. Plain DOM calls:
/// the bundle stays small.
fn send_bound(on: bool) {
    #[cfg(feature = "hydrate")]
    if let Ok(Some(input)) = document().query_selector("#policy-form input[name=max_overshoot]") {
        let _ = if on {
            input.remove_attribute("disabled")
        } else {
            input.set_attribute("disabled", "")
        };
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = on;
}

const ALGORITHMS: [(&str, &str); 4] = [
    ("token_bucket", "token bucket (burst, continuous refill)"),
    ("fixed_window", "fixed window (2× at window edges)"),
    ("sliding_log", "sliding-window log (exact)"),
    ("sliding_counter", "sliding-window counter (approximate)"),
];

fn backtest_view(b: Backtest) -> AnyView {
    let span = if b.sampled == 0 {
        "The edges have sampled no decisions yet: nothing to replay.".to_string()
    } else {
        format!(
            "Replayed the edges' last {} decisions, {} to {} (nothing saved).",
            b.sampled,
            time::utc(b.from_ms.div_euclid(1000)),
            time::utc(b.to_ms.div_euclid(1000))
        )
    };
    let mut caveats = vec![];
    if b.dropped > 0 {
        caveats.push(format!(
            "{} decisions of that period are missing from the sample (an edge's queue was full): the replay cannot see them.",
            b.dropped
        ));
    }
    if b.degraded > 0 {
        caveats.push(format!(
            "{} sampled decisions were taken without Redis (degraded); the replay decides them as if Redis had answered.",
            b.degraded
        ));
    }
    if !b.ip_policies.is_empty() {
        caveats.push(format!(
            "Policies keyed by client address ({}) are not replayed: the sample does not keep addresses.",
            b.ip_policies.join(", ")
        ));
    }
    let patterns = b.patterns;
    caveats.push(
        "Buckets start full at the first sampled decision, so the replay at today's limits can differ from what the edge answered when traffic before the sample still weighed on them."
            .to_string(),
    );
    view! {
        <div id="backtest-result" data-sampled=b.sampled.to_string() data-dropped=b.dropped.to_string() role="status">
            <p>{span}</p>
            <table>
                <thead><tr><th scope="col">"Endpoint"</th><th scope="col" class="num">"Requests"</th><th scope="col" class="num">"429s the edge answered"</th><th scope="col" class="num">"429s replayed at today's limits"</th><th scope="col">"With this change"</th><th scope="col" class="num">"Would have throttled (shadow)"</th></tr></thead>
                <tbody>
                    {b.rows.into_iter().map(|r| {
                        let route = r.endpoint.route().unwrap_or_default().to_string();
                        view! {
                            <tr data-route=route data-endpoint=r.endpoint.to_string()>
                                <th scope="row">{endpoint_label(&r.endpoint, &patterns)}</th>
                                <td class="num requests">{r.requests}</td>
                                <td class="num observed">{r.observed}</td>
                                <td class="num now">{r.throttled_now}</td>
                                <td class="would">{format!("would have returned 429 to {} requests of {} keys (of {} seen)", r.throttled, r.keys, r.keys_seen)}</td>
                                <td class="num">{r.shadow}</td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
            <ul class="caveats">{caveats.into_iter().map(|c| view! { <li>{c}</li> }).collect_view()}</ul>
        </div>
    }
    .into_any()
}

fn plan_section(
    spec: &ConfigSpec,
    csrf: &str,
    version: &str,
    save: ServerAction<SavePlan>,
    delete: ServerAction<DeletePlan>,
    editing: Option<String>,
) -> impl IntoView + use<> {
    let rows = spec
        .plans
        .iter()
        .map(|(name, policies)| {
            let list = policies.join(", ");
            let (name, field_name, row) = (name.clone(), name.clone(), name.clone());
            let (csrf, version) = (csrf.to_string(), version.to_string());
            view! {
                <tr data-plan=row>
                    <td>{name.clone()}</td><td>{list}</td>
                    <td>
                        <a class="edit" href=format!("/policies?edit_plan={name}#plan-form")>"Edit"</a>
                        " "
                        <ActionForm action=delete attr:style="display:inline">
                            {hidden(&csrf, &version)}
                            <input type="hidden" name="name" value=field_name/>
                            <button type="submit" class="danger">"Delete"</button>
                        </ActionForm>
                    </td>
                </tr>
            }
        })
        .collect_view();
    let (name, list) = editing
        .and_then(|n| spec.plans.get(&n).map(|l| (n, l.join(", "))))
        .unwrap_or_default();
    let original = name.clone();
    let (csrf, version) = (csrf.to_string(), version.to_string());
    view! {
        <h2>"Plans (per-key limits every key on the plan gets)"</h2>
        <table id="plans"><thead><tr><th scope="col">"Plan"</th><th scope="col">"Limits"</th><th scope="col">"Actions"</th></tr></thead><tbody>{rows}</tbody></table>
        {outcome(val(delete), saved_message, &[])}
        <ActionForm action=save attr:class="card" attr:id="plan-form">
            {hidden(&csrf, &version)}
            <input type="hidden" name="original" value=original/>
            <label>"Plan" <input name="name" value=name/>{field_error(val(save), "name")}</label>
            <label>"Limits (comma-separated)" <input name="policies" value=list/>{field_error(val(save), "policies")}</label>
            <button type="submit">"Save plan"</button>
            {outcome(val(save), saved_message, &["name", "policies"])}
        </ActionForm>
    }
}

fn route_section(
    spec: &ConfigSpec,
    csrf: &str,
    version: &str,
    save: ServerAction<SaveRoute>,
    delete: ServerAction<DeleteRoute>,
    editing: Option<String>,
) -> impl IntoView + use<> {
    let rows = spec
        .routes
        .iter()
        .map(|r| {
            let list = r.policies.join(", ");
            let (name, field_name, pattern) = (r.name.clone(), r.name.clone(), r.pattern.clone());
            let row = name.clone();
            let (csrf, version) = (csrf.to_string(), version.to_string());
            view! {
                <tr data-route=row>
                    <td><code>{pattern}</code></td><td>{name.clone()}</td><td>{list}</td>
                    <td>
                        <a class="edit" href=format!("/policies?edit_route={name}#route-form")>"Edit"</a>
                        " "
                        <ActionForm action=delete attr:style="display:inline">
                            {hidden(&csrf, &version)}
                            <input type="hidden" name="name" value=field_name/>
                            <button type="submit" class="danger">"Delete"</button>
                        </ActionForm>
                    </td>
                </tr>
            }
        })
        .collect_view();
    let (name, pattern, list) = editing
        .and_then(|n| spec.routes.iter().find(|r| r.name == n))
        .map(|r| (r.name.clone(), r.pattern.clone(), r.policies.join(", ")))
        .unwrap_or_default();
    let original = name.clone();
    let (csrf, version) = (csrf.to_string(), version.to_string());
    view! {
        <h2>"Endpoints (routes and their per-key, per-endpoint limits)"</h2>
        <p class="muted">{format!("Requests matching no pattern are counted as “{UNMATCHED}”.")}</p>
        <table id="routes"><thead><tr><th scope="col">"Path pattern"</th><th scope="col">"Route"</th><th scope="col">"Limits"</th><th scope="col">"Actions"</th></tr></thead><tbody>{rows}</tbody></table>
        {outcome(val(delete), saved_message, &[])}
        <ActionForm action=save attr:class="card" attr:id="route-form">
            {hidden(&csrf, &version)}
            <input type="hidden" name="original" value=original/>
            <label>"Route" <input name="name" value=name/>{field_error(val(save), "name")}</label>
            <label>"Pattern" <input name="pattern" placeholder="/v1/users/:id" value=pattern/>{field_error(val(save), "pattern")}</label>
            <label>"Limits (comma-separated)" <input name="policies" value=list/>{field_error(val(save), "policies")}</label>
            <button type="submit">"Save route"</button>
            {outcome(val(save), saved_message, &["name", "pattern", "policies"])}
        </ActionForm>
    }
}

fn override_section(
    spec: &ConfigSpec,
    csrf: &str,
    version: &str,
    save: ServerAction<SaveOverride>,
    delete: ServerAction<DeleteOverride>,
    save_ip: ServerAction<SaveIpPolicies>,
) -> impl IntoView + use<> {
    let rows = spec
        .key_overrides
        .iter()
        .map(|(id, policies)| {
            let (csrf, version) = (csrf.to_string(), version.to_string());
            let (id, field_id, list) = (id.clone(), id.clone(), policies.join(", "));
            let row = id.clone();
            view! {
                <tr data-override=row>
                    <td><code>{id}</code></td><td>{list}</td>
                    <td>
                        <ActionForm action=delete attr:style="display:inline">
                            {hidden(&csrf, &version)}
                            <input type="hidden" name="key_id" value=field_id/>
                            <button type="submit" class="danger">"Delete"</button>
                        </ActionForm>
                    </td>
                </tr>
            }
        })
        .collect_view();
    let ip = spec.ip_policies.join(", ");
    let (csrf, version) = (csrf.to_string(), version.to_string());
    let (csrf2, version2) = (csrf.clone(), version.clone());
    view! {
        <h2>"Per API key overrides (replace the plan's limits for one key)"</h2>
        <table id="overrides"><thead><tr><th scope="col">"Key id"</th><th scope="col">"Limits"</th><th scope="col">"Actions"</th></tr></thead><tbody>{rows}</tbody></table>
        {outcome(val(delete), saved_message, &[])}
        <ActionForm action=save attr:class="card" attr:id="override-form">
            {hidden(&csrf, &version)}
            <label>"Key id" <input name="key_id"/>{field_error(val(save), "key_id")}</label>
            <label>"Limits (comma-separated)" <input name="policies"/>{field_error(val(save), "policies")}</label>
            <button type="submit">"Save override"</button>
            {outcome(val(save), saved_message, &["key_id", "policies"])}
        </ActionForm>
        <h2>"Per client IP"</h2>
        <ActionForm action=save_ip attr:class="card" attr:id="ip-form">
            {hidden(&csrf2, &version2)}
            <label>"Limits (comma-separated, keyed by client_ip)" <input name="policies" value=ip/>{field_error(val(save_ip), "policies")}</label>
            <button type="submit">"Save"</button>
            {outcome(val(save_ip), saved_message, &["policies"])}
        </ActionForm>
    }
}

fn headers_section(
    spec: &ConfigSpec,
    csrf: &str,
    version: &str,
    save: ServerAction<SaveHeaders>,
) -> impl IntoView + use<> {
    let h = spec.headers.clone();
    let (csrf, version) = (csrf.to_string(), version.to_string());
    view! {
        <h2>"Response headers"</h2>
        <ActionForm action=save attr:class="card" attr:id="headers-form">
            {hidden(&csrf, &version)}
            <label>"IETF RateLimit-Policy and RateLimit fields" <input type="checkbox" name="ietf" checked=h.ietf/></label>
            <label>"Retry-After jitter (0-60 s)" <input name="retry_jitter_secs" inputmode="numeric" value=h.retry_jitter_secs.to_string()/>{field_error(val(save), "headers.retry_jitter_secs")}</label>
            <button type="submit">"Save"</button>
            {outcome(val(save), saved_message, &["headers.retry_jitter_secs"])}
        </ActionForm>
    }
}

fn deny_section(
    spec: &ConfigSpec,
    csrf: &str,
    version: &str,
    save: ServerAction<SaveDeny>,
    counts: Option<Vec<(floodgate_shared::deny::DenyList, u64)>>,
) -> impl IntoView + use<> {
    use floodgate_shared::deny::DenyList;
    let d = spec.deny.clone();
    let (csrf, version) = (csrf.to_string(), version.to_string());
    let counts = match counts {
        None => "Denied requests: unavailable.".to_string(),
        Some(c) => {
            let n = |l: DenyList| c.iter().find(|(k, _)| *k == l).map_or(0, |(_, n)| *n);
            format!(
                "Denied in the last 24 h: {}.",
                DenyList::ALL
                    .iter()
                    .map(|l| format!("{} {}", l.name(), n(*l)))
                    .collect::<Vec<_>>()
                    .join(" · ")
            )
        }
    };
    let area = move |name: &'static str,
                     label: &'static str,
                     list: &[String],
                     field: &'static str| {
        view! {
            <label>{label} <textarea name=name rows="4">{list.join("\n")}</textarea>{field_error(val(save), field)}</label>
        }
    };
    view! {
        <h2>"Deny lists (403 before any limit; one entry per line)"</h2>
        <p id="deny-counts">{counts}</p>
        <ActionForm action=save attr:class="card" attr:id="deny-form">
            {hidden(&csrf, &version)}
            {area("key_ids", "API key ids", &d.key_ids, "deny.key_ids")}
            {area("ips", "IP addresses and CIDR ranges (203.0.113.7, 198.51.100.0/24, 2001:db8::/32)", &d.ips, "deny.ips")}
            {area("countries", "Countries (ISO 3166-1 alpha-2: DE, KP; T1 is Tor)", &d.countries, "deny.countries")}
            {area("user_agents", "User-agent substrings (case-insensitive)", &d.user_agents, "deny.user_agents")}
            <button type="submit">"Save deny lists"</button>
            {outcome(val(save), saved_message, &["deny.key_ids", "deny.ips", "deny.countries", "deny.user_agents"])}
        </ActionForm>
    }
}

#[island]
fn EffectiveLimitsTool() -> impl IntoView {
    island_ready();
    let query = ServerAction::<EffectiveLimits>::new();
    view! {
        <h2>"Effective limits of a key on an endpoint"</h2>
        <ActionForm action=query attr:class="card" attr:id="effective-form">
            <label>"Key id" <input name="key_id"/>{field_error(val(query), "key_id")}</label>
            <label>"Path" <input name="path" placeholder="/v1/search"/></label>
            <button type="submit">"Show"</button>
        </ActionForm>
        {outcome(val(query), |_| None, &["key_id"])}
        {move || query.value().get().and_then(Result::ok).map(|rows| view! {
            <table id="effective">
                <thead><tr><th scope="col">"Limit"</th><th scope="col">"From"</th><th scope="col">"Quota"</th><th scope="col">"Cost"</th><th scope="col">"If Redis fails"</th></tr></thead>
                <tbody>
                    {rows.into_iter().map(|r| view! {
                        <tr>
                            <td>{r.policy}</td>
                            <td>{match r.source {
                                Source::Plan(p) => format!("plan {p}"),
                                Source::KeyOverride => "key override".to_string(),
                                Source::Route(r) => format!("route {r}"),
                                Source::ClientIp => "client IP".to_string(),
                            }}</td>
                            <td>{r.limit}</td><td>{r.cost}</td><td>{r.failure_mode}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        })}
    }
}

// ----- keys -----------------------------------------------------------------------

/// Live usage of the keys: id → (allowed, throttled, degraded, last used), as the
/// browser last fetched it.
type LiveUsage = RwSignal<std::collections::BTreeMap<String, (u64, u64, u64, Option<i64>)>>;

#[component]
fn KeysPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let keys = Resource::new(|| (), |_| list_keys());
    let config = Resource::new(|| (), |_| get_config());
    view! {
        <Title text="Floodgate — API keys"/>
        <h1>"API keys"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let (s, k, c) = match (session.await, keys.await, config.await) {
                    (Ok(s), Ok(k), Ok(c)) => (s, k, c),
                    (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return error_view(e),
                };
                let plans: Vec<String> = c.spec.map(|s| s.plans.into_keys().collect()).unwrap_or_default();
                view! { <KeysPanel rows=k plans=plans csrf=s.csrf rendered_at=time::now_secs()/> }.into_any()
            })}
        </Suspense>
    }
}

/// Key creation (the secret shown once, with a copy button), and the keys with
/// their usage refreshed every 5 s; edits and revocations reload the list.
#[island]
fn KeysPanel(
    rows: Vec<KeyRow>,
    plans: Vec<String>,
    csrf: String,
    rendered_at: i64,
) -> impl IntoView {
    island_ready();
    let create = ServerAction::<CreateKey>::new();
    let update = ServerAction::<UpdateKey>::new();
    let revoke = ServerAction::<RevokeKey>::new();
    let keys = RwSignal::new(rows);
    let ready = hydrated();
    // usage refreshes on its own without re-rendering the rows (and their forms)
    let live: LiveUsage = RwSignal::new(Default::default());
    let now = RwSignal::new(None::<i64>);
    let refresh = move |whole: bool| {
        leptos::task::spawn_local(async move {
            match list_keys().await {
                Ok(rows) => {
                    live.set(
                        rows.iter()
                            .map(|k| {
                                (
                                    k.id.clone(),
                                    (k.allowed, k.throttled, k.degraded, k.last_used),
                                )
                            })
                            .collect(),
                    );
                    now.set(Some(time::now_secs()));
                    if whole {
                        keys.set(rows);
                    }
                }
                Err(AppError::SignedOut) => go_to_sign_in(),
                Err(_) => {}
            }
        });
    };
    every(Duration::from_secs(5), move || refresh(false));
    Effect::new(move |_| {
        let done = |v: Option<bool>| v == Some(true);
        if done(create.value().get().map(|r| r.is_ok()))
            | done(update.value().get().map(|r| r.is_ok()))
            | done(revoke.value().get().map(|r| r.is_ok()))
        {
            refresh(true);
        }
    });
    let csrf_rows = csrf.clone();
    let plan_options = plans.clone();
    view! {
        {move || create.value().get().and_then(Result::ok).map(new_secret)}
        <ActionForm action=create attr:class="card" attr:id="create-key">
            <strong>"New key"</strong><br/>
            <input type="hidden" name="csrf" value=csrf.clone()/>
            <label>"Label" <input name="label"/>{field_error(val(create), "label")}</label>
            <label>"Plan"
                <select name="plan">
                    {plan_options.iter().map(|p| view! { <option value=p.clone()>{p.clone()}</option> }).collect_view()}
                </select>
                {field_error(val(create), "plan")}
            </label>
            <button type="submit">"Create key"</button>
            {outcome(val(create), |k: &CreatedKey| Some(format!("Created key {}", k.id)), &["label", "plan"])}
        </ActionForm>
        {outcome(val(update), saved_message, &[])}
        {outcome(val(revoke), saved_message, &[])}
        <p class="muted">"Usage: decisions over the last hour, refreshed every 5 s. A revoked key is refused by the edge within two cache TTLs (10 s by default), and is read-only here."</p>
        <table id="keys">
            <thead><tr>
                <th scope="col">"Key id"</th><th scope="col">"Label"</th><th scope="col">"Plan"</th><th scope="col">"Status"</th>
                <th scope="col">"Created"</th><th scope="col">"Last used"</th><th scope="col">"Usage (1 h)"</th><th scope="col">"Actions"</th>
            </tr></thead>
            <tbody>
                {move || keys.get().into_iter()
                    .map(|k| key_row(k, &plans, &csrf_rows, update, revoke, live, now, rendered_at, ready))
                    .collect_view()}
            </tbody>
        </table>
    }
}

/// The one-time secret of a key just created, with a copy button.
fn new_secret(k: CreatedKey) -> impl IntoView {
    let copied = RwSignal::new(None::<bool>);
    let (id, secret, shown) = (k.id, k.secret.clone(), k.secret.clone());
    #[cfg(feature = "hydrate")]
    let attr = k.secret;
    let copy = move |_| {
        #[cfg(feature = "hydrate")]
        {
            let text = attr.clone();
            leptos::task::spawn_local(async move {
                let promise = window().navigator().clipboard().write_text(&text);
                copied.set(Some(
                    wasm_bindgen_futures::JsFuture::from(promise).await.is_ok(),
                ));
            });
        }
    };
    view! {
        <div class="card" id="new-secret">
            <p>"The secret of key " <code>{id}</code> " — shown this once; it is stored only as a hash:"</p>
            <span class="secret" data-secret=secret>{shown}</span>
            " "
            <button type="button" id="copy-secret" on:click=copy>"Copy"</button>
            <span role="status" id="copy-status">{move || match copied.get() {
                None => "",
                Some(true) => " Copied to the clipboard.",
                Some(false) => " The browser refused the clipboard: select the secret and copy it.",
            }}</span>
        </div>
    }
}

#[allow(clippy::too_many_arguments)]
fn key_row(
    k: KeyRow,
    plans: &[String],
    csrf: &str,
    update: ServerAction<UpdateKey>,
    revoke: ServerAction<RevokeKey>,
    live: LiveUsage,
    now: RwSignal<Option<i64>>,
    rendered_at: i64,
    ready: RwSignal<bool>,
) -> impl IntoView + use<> {
    let id = k.id.clone();
    let row_id = k.id.clone();
    let initial = (k.allowed, k.throttled, k.degraded, k.last_used);
    let usage_id = id.clone();
    let usage = move || {
        let (a, t, d, _) = live.get().get(&usage_id).copied().unwrap_or(initial);
        format!("{a} allowed · {t} throttled · {d} degraded")
    };
    let last_id = id.clone();
    let last_used = move || {
        let last = live.get().get(&last_id).map_or(initial.3, |u| u.3);
        match last {
            None => "never".to_string(),
            Some(at) => format!(
                "{} ({})",
                time::ago(at, now.get().unwrap_or(rendered_at)),
                time::utc(at)
            ),
        }
    };
    let status = if k.revoked { "revoked" } else { "active" };
    let actions = (!k.revoked).then(|| {
        let plans = plans.to_vec();
        let current_plan = k.plan.clone();
        let (csrf_u, csrf_r, upd_id, rev_id, rev_label) =
            (csrf.to_string(), csrf.to_string(), id.clone(), id.clone(), id.clone());
        let label = k.label.clone();
        view! {
            <details class="edit-key">
                <summary>"Edit"</summary>
                <ActionForm action=update attr:class="card">
                    <input type="hidden" name="csrf" value=csrf_u/>
                    <input type="hidden" name="id" value=upd_id/>
                    <label>"Label" <input name="label" value=label/></label>
                    <label>"Plan"
                        <select name="plan">
                            {plans.iter().map(|p| view! { <option value=p.clone() selected=*p == current_plan>{p.clone()}</option> }).collect_view()}
                        </select>
                    </label>
                    <button type="submit">"Save"</button>
                </ActionForm>
            </details>
            <details class="revoke-key">
                <summary class="error">"Revoke…"</summary>
                <ActionForm action=revoke attr:class="card">
                    <p>"Revoking is permanent: the edge refuses this key within two cache TTLs (10 s by default), and it cannot be edited again."</p>
                    <input type="hidden" name="csrf" value=csrf_r/>
                    <input type="hidden" name="id" value=rev_id/>
                    <input type="hidden" name="confirm" value="yes"/>
                    <button type="submit" class="danger">{format!("Revoke key {rev_label}")}</button>
                </ActionForm>
            </details>
        }
    });
    view! {
        <tr data-key=row_id data-revoked=k.revoked.to_string()>
            <td><code>{id}</code></td>
            <td class="label">{k.label}</td>
            <td>{k.plan}</td>
            <td class="status">{status}</td>
            <td class="created">{when(k.created, ready)}</td>
            <td class="last-used">{last_used}</td>
            <td class="usage">{usage}</td>
            <td>{actions}</td>
        </tr>
    }
}

// ----- audit ----------------------------------------------------------------------

#[component]
fn AuditPage() -> impl IntoView {
    let entries = Resource::new(|| (), |_| audit_entries());
    view! {
        <Title text="Floodgate — audit log"/>
        <h1>"Audit log"</h1>
        <p class="muted">"The newest first: who changed what and when, with each change's fields before → after."</p>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match entries.await {
                    Err(e) => error_view(e),
                    Ok(list) => view! {
                        <table id="audit">
                            <thead><tr><th scope="col">"When"</th><th scope="col">"Who"</th><th scope="col">"What"</th><th scope="col">"Change (before → after)"</th></tr></thead>
                            <tbody>
                                {list.into_iter().map(|e| view! {
                                    <tr>
                                        <td class="when"><LocalTime secs=e.at/></td>
                                        <td>{e.user.clone()}</td>
                                        <td>{e.action.clone()} " " <code>{e.target.clone()}</code></td>
                                        <td class="change">{change_view(&e)}</td>
                                    </tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                    }.into_any(),
                }
            })}
        </Suspense>
    }
}

fn change_view(e: &AuditRow) -> AnyView {
    match &e.changes {
        Some(changes) if changes.is_empty() => {
            view! { <span class="muted">"(no field changed)"</span> }.into_any()
        }
        Some(changes) => {
            let (created, removed) = (e.created, e.removed);
            view! {
                {created.then_some(view! { <span class="muted">"created with:"</span> })}
                {removed.then_some(view! { <span class="muted">"removed; it had:"</span> })}
                <ul class="changes">
                    {changes.iter().cloned().map(|c| {
                        let field = if c.path.is_empty() { "(value)".to_string() } else { c.path };
                        let text = match (c.before, c.after) {
                            (Some(b), Some(a)) => format!(": {b} → {a}"),
                            (None, Some(a)) if created => format!(": {a}"),
                            (None, Some(a)) => format!(": (none) → {a}"),
                            (Some(b), None) if removed => format!(": {b}"),
                            (Some(b), None) => format!(": {b} → (none)"),
                            (None, None) => String::new(),
                        };
                        view! { <li><code>{field}</code>{text}</li> }
                    }).collect_view()}
                </ul>
            }
            .into_any()
        }
        None => view! {
            <pre>{e.before.clone().unwrap_or_default()}</pre>
            <pre>{format!("→ {}", e.after.clone().unwrap_or_default())}</pre>
        }
        .into_any(),
    }
}
