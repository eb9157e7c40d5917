//! The pages. Server-rendered, then hydrated; every form is an `ActionForm` over a
//! server function, so it also works before the wasm has loaded.

use std::time::Duration;

use floodgate_shared::config::{ConfigSpec, Source};
use leptos::prelude::*;
use leptos_meta::{MetaTags, Title, provide_meta_context};
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::path;

use crate::api::*;
use crate::model::*;

pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <meta name="color-scheme" content="light dark"/>
                <style>{STYLE}</style>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

const STYLE: &str = r#"
:root { --bg:#ffffff; --fg:#1d2433; --muted:#5b6478; --line:#d9dee8; --card:#f6f8fb;
  --allowed:#1a7f37; --throttled:#cf222e; --degraded:#9a6700; --p50:#0969da; --p99:#8250df; --budget:#cf222e; --accent:#0969da; --shadow:#6e7781; }
@media (prefers-color-scheme: dark) {
  :root { --bg:#0d1117; --fg:#e6edf3; --muted:#9aa4b2; --line:#30363d; --card:#161b22;
    --allowed:#3fb950; --throttled:#ff7b72; --degraded:#d29922; --p50:#58a6ff; --p99:#bc8cff; --budget:#ff7b72; --accent:#58a6ff; --shadow:#8b949e; } }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.45 system-ui, sans-serif; background:var(--bg); color:var(--fg); }
nav { display:flex; gap:1rem; align-items:center; padding:.6rem 1.2rem; border-bottom:1px solid var(--line); }
nav a { color:var(--fg); text-decoration:none; } nav a[aria-current] { font-weight:700; color:var(--accent); }
nav .who { margin-left:auto; color:var(--muted); display:flex; gap:.6rem; align-items:center; }
main { padding:1rem 1.2rem; max-width:1100px; }
h1 { font-size:1.3rem; } h2 { font-size:1.05rem; margin-top:1.6rem; }
table { border-collapse:collapse; width:100%; margin:.4rem 0 1rem; }
th, td { text-align:left; padding:.3rem .5rem; border-bottom:1px solid var(--line); vertical-align:top; }
form.card, .card { background:var(--card); border:1px solid var(--line); border-radius:6px; padding:.8rem; margin:.6rem 0; }
form.card label { display:inline-flex; flex-direction:column; margin:0 .8rem .5rem 0; font-size:.85rem; color:var(--muted); }
input, select, button { font:inherit; padding:.25rem .4rem; color:var(--fg); background:var(--bg); border:1px solid var(--line); border-radius:4px; }
button { cursor:pointer; } button.danger { color:var(--throttled); }
.error, .field-error { color:var(--throttled); } .field-error { font-size:.8rem; }
.ok { color:var(--allowed); }
.secret { font-family:monospace; font-size:1rem; padding:.5rem; border:2px dashed var(--accent); display:inline-block; user-select:all; }
svg.chart { width:100%; max-width:640px; height:auto; color:var(--muted); }
svg.chart .allowed { stroke:var(--allowed); } svg.chart .throttled { stroke:var(--throttled); }
svg.chart .degraded { stroke:var(--degraded); } svg.chart .p50 { stroke:var(--p50); } svg.chart .p99 { stroke:var(--p99); }
svg.chart .budget { stroke:var(--budget); stroke-dasharray:6 4; }
svg.chart .shadow { stroke:var(--shadow); stroke-dasharray:3 3; }
svg.chart polyline { fill:none; stroke-width:2; } svg.chart text { fill:currentColor; font-size:11px; }
svg.chart .frame { fill:none; stroke:var(--line); }
.legend span { margin-right:1rem; } .legend i { display:inline-block; width:.8rem; height:.2rem; vertical-align:middle; margin-right:.3rem; }
pre { white-space:pre-wrap; word-break:break-all; margin:0; font-size:.8rem; }
"#;

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    // Marks the page once hydrated (the browser tests wait for it).
    #[cfg(feature = "hydrate")]
    Effect::new(|_| {
        if let Some(body) = document().body() {
            let _ = body.set_attribute("data-hydrated", "1");
        }
    });
    view! {
        <Title text="Floodgate"/>
        <Router>
            <Routes fallback=|| view! { <main><p>"Page not found."</p></main> }>
                <Route path=path!("/login") view=LoginPage/>
                <Route path=path!("/") view=|| view! { <Layout><TrafficPage/></Layout> }/>
                <Route path=path!("/policies") view=|| view! { <Layout><PoliciesPage/></Layout> }/>
                <Route path=path!("/keys") view=|| view! { <Layout><KeysPage/></Layout> }/>
                <Route path=path!("/audit") view=|| view! { <Layout><AuditPage/></Layout> }/>
            </Routes>
        </Router>
    }
}

/// The signed-in session, shared by a page's forms.
type SessionResource = Resource<Result<SessionInfo, ServerFnError>>;

fn error_view(e: ServerFnError) -> AnyView {
    let text = e.to_string();
    let text = text
        .strip_prefix("error running server function: ")
        .unwrap_or(&text)
        .to_string();
    view! { <p class="error" role="alert">{text}</p> }.into_any()
}

#[component]
fn LoginPage() -> impl IntoView {
    let login = ServerAction::<Login>::new();
    view! {
        <main>
            <h1>"Floodgate — sign in"</h1>
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
        <nav>
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
fn val<S>(action: ServerAction<S>) -> Signal<Option<Result<S::Output, ServerFnError>>>
where
    S: leptos::server_fn::ServerFn<Error = ServerFnError> + Clone + Send + Sync + 'static,
    S::Output: Clone + Send + Sync + 'static,
{
    Signal::derive(move || action.value().get())
}

/// Renders a form's outcome (success or a form-level error); field errors are
/// shown next to their fields by [`field_error`].
fn outcome<T: Clone + Send + Sync + 'static>(
    value: Signal<Option<Result<T, ServerFnError>>>,
    saved: impl Fn(&T) -> Saved + Send + Sync + 'static,
    fields: &'static [&'static str],
) -> impl IntoView {
    move || match value.get() {
        None => None,
        Some(Err(e)) => Some(error_view(e)),
        Some(Ok(v)) => saved(&v).form_message(fields).map(|(ok, m)| {
            if ok {
                view! { <p class="ok" role="status">{m}</p> }.into_any()
            } else {
                view! { <p class="error" role="alert">{m}</p> }.into_any()
            }
        }),
    }
}

fn field_error<T: Clone + Send + Sync + 'static>(
    value: Signal<Option<Result<T, ServerFnError>>>,
    saved: impl Fn(&T) -> Saved + Send + Sync + 'static,
    field: &'static str,
) -> impl IntoView {
    move || {
        value
            .get()
            .and_then(Result::ok)
            .and_then(|v| saved(&v).message_for(field))
            .map(|m| view! { <span class="field-error" data-field=field>{m}</span> })
    }
}

fn same(s: &Saved) -> Saved {
    s.clone()
}

// ----- traffic --------------------------------------------------------------------

const WINDOW_MINUTES: u32 = 30;

#[component]
fn TrafficPage() -> impl IntoView {
    let tick = RwSignal::new(0u64);
    // Refresh on its own every few seconds (in the browser only).
    Effect::new(move |_| {
        let handle =
            set_interval_with_handle(move || tick.update(|t| *t += 1), Duration::from_secs(3)).ok();
        on_cleanup(move || {
            if let Some(h) = handle {
                h.clear();
            }
        });
    });
    let data = Resource::new(move || tick.get(), |_| traffic_stats(WINDOW_MINUTES));
    view! {
        <Title text="Floodgate — traffic"/>
        <h1>"Traffic (last " {WINDOW_MINUTES} " minutes, per minute)"</h1>
        <Transition fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(t) => traffic_view(t).into_any(),
                    Err(e) => error_view(e),
                }
            })}
        </Transition>
    }
}

fn legend() -> impl IntoView {
    view! {
        <div class="legend">
            <span><i style="background:var(--allowed)"></i>"allowed"</span>
            <span><i style="background:var(--throttled)"></i>"throttled (429)"</span>
            <span><i style="background:var(--degraded)"></i>"degraded (store unavailable)"</span>
            <span><i style="background:var(--shadow)"></i>"would have throttled (shadow)"</span>
        </div>
    }
}

fn minute_label(m: i64) -> String {
    let m = m.rem_euclid(24 * 60);
    format!("{:02}:{:02} UTC", m / 60, m % 60)
}

fn traffic_view(t: Traffic) -> impl IntoView {
    let first = t
        .minutes
        .first()
        .copied()
        .map(minute_label)
        .unwrap_or_default();
    let last = t
        .minutes
        .last()
        .copied()
        .map(minute_label)
        .unwrap_or_default();
    let routes: Vec<_> = t.routes.clone().into_iter().collect();
    let empty = routes.is_empty();
    let sum = |v: &[u64]| v.iter().sum::<u64>();
    let totals: Vec<_> = routes
        .iter()
        .map(|(r, s)| {
            (
                r.clone(),
                sum(&s.allowed),
                sum(&s.throttled),
                sum(&s.degraded),
                sum(&s.shadow),
            )
        })
        .collect();
    let charts = routes
        .into_iter()
        .map(|(route, s)| {
            let max = nice_max(
                s.allowed
                    .iter()
                    .chain(&s.throttled)
                    .chain(&s.degraded)
                    .chain(&s.shadow)
                    .copied()
                    .max()
                    .unwrap_or(0),
            );
            let some = |v: &[u64]| v.iter().map(|x| Some(*x)).collect::<Vec<_>>();
            let name = if route == "_" {
                "(no route)".to_string()
            } else {
                route.clone()
            };
            let throttled_total = sum(&s.throttled);
            view! {
                <h2>{name.clone()}</h2>
                <svg class="chart" viewBox="-40 -10 680 200" role="img"
                    aria-label=format!("requests per minute for {name}")
                    data-route=route.clone() data-throttled=throttled_total.to_string()
                    data-allowed=sum(&s.allowed).to_string()>
                    <rect class="frame" x="0" y="0" width=CHART_W height=CHART_H/>
                    <text x="-36" y="8">{max.to_string()}</text>
                    <text x="-36" y=CHART_H>"0"</text>
                    <text x="0" y=CHART_H + 16.0>{first.clone()}</text>
                    <text x=CHART_W - 60.0 y=CHART_H + 16.0>{last.clone()}</text>
                    <polyline class="allowed" points=polyline(&some(&s.allowed), max)/>
                    <polyline class="degraded" points=polyline(&some(&s.degraded), max)/>
                    <polyline class="throttled" points=polyline(&some(&s.throttled), max)/>
                    <polyline class="shadow" points=polyline(&some(&s.shadow), max)/>
                </svg>
            }
        })
        .collect_view();
    let lat_max = nice_max(
        t.p99_us
            .iter()
            .flatten()
            .copied()
            .filter(|v| *v != u64::MAX)
            .max()
            .unwrap_or(0)
            .max(5_000)
            + 1,
    );
    let clip = |v: &[Option<u64>]| -> Vec<Option<u64>> {
        v.iter().map(|x| x.map(|u| u.min(lat_max))).collect()
    };
    let latest = |v: &[Option<u64>]| v.iter().rev().flatten().next().copied();
    let fmt_us = |v: Option<u64>| match v {
        None => "—".to_string(),
        Some(u64::MAX) => "> 1 s".to_string(),
        Some(us) => format!("≤ {:.2} ms", us as f64 / 1000.0),
    };
    let p50_now = fmt_us(latest(&t.p50_us));
    let p99_now = fmt_us(latest(&t.p99_us));
    let top = t.top_throttled.clone();
    let modes: Vec<(String, String, u64)> = t
        .degraded_by_route_mode
        .iter()
        .map(|((r, m), n)| (r.clone(), m.clone(), *n))
        .collect();
    let mode_totals = t
        .degraded_by_mode
        .iter()
        .map(|(m, n)| format!("{m}: {n}"))
        .collect::<Vec<_>>()
        .join(" · ");
    let breaker = format!(
        "Circuit breakers opened {} times; open for {:.1} s in total (all edges, this window).",
        t.breaker_opened,
        t.breaker_open_ms as f64 / 1000.0
    );
    view! {
        {legend()}
        {empty.then(|| view! { <p id="no-traffic">"No traffic recorded in this window yet."</p> })}
        <table id="totals">
            <thead><tr><th>"Endpoint"</th><th>"Allowed"</th><th>"Throttled (429)"</th><th>"Degraded"</th><th>"Would have throttled (shadow)"</th></tr></thead>
            <tbody>
                {totals.into_iter().map(|(r, a, th, d, sh)| { let r2 = r.clone(); view! {
                    <tr data-route=r2><td>{r}</td><td>{a}</td><td class="throttled-count">{th}</td><td>{d}</td><td class="shadow-count">{sh}</td></tr>
                }}).collect_view()}
            </tbody>
        </table>
        {charts}
        <h2>"Redis call latency as the edge saw it"</h2>
        <p>"p50 " <strong>{p50_now}</strong> " · p99 " <strong>{p99_now}</strong> " (latest minute; histogram bucket bounds) — the dashed line is the 5 ms budget."</p>
        <svg class="chart" viewBox="-40 -10 680 200" role="img" aria-label="store latency p50 and p99" id="latency">
            <rect class="frame" x="0" y="0" width=CHART_W height=CHART_H/>
            <text x="-36" y="8">{format!("{} ms", lat_max as f64 / 1000.0)}</text>
            <text x="-36" y=CHART_H>"0"</text>
            <line class="budget" x1="0" x2=CHART_W y1=level(5_000, lat_max) y2=level(5_000, lat_max)/>
            <text x=CHART_W - 70.0 y=level(5_000, lat_max) - 4.0>"5 ms budget"</text>
            <polyline class="p50" points=polyline(&clip(&t.p50_us), lat_max)/>
            <polyline class="p99" points=polyline(&clip(&t.p99_us), lat_max)/>
        </svg>
        <div class="legend">
            <span><i style="background:var(--p50)"></i>"p50"</span>
            <span><i style="background:var(--p99)"></i>"p99"</span>
        </div>
        <h2>"Decisions taken without Redis"</h2>
        <p id="breaker">{breaker}</p>
        <p id="modes">{if mode_totals.is_empty() { "No degraded decisions.".to_string() } else { format!("By failure mode: {mode_totals}") }}</p>
        <table id="degraded-modes">
            <thead><tr><th>"Endpoint"</th><th>"Failure mode"</th><th>"Decisions"</th></tr></thead>
            <tbody>
                {modes.into_iter().map(|(r, m, n)| view! { <tr><td>{r}</td><td>{m}</td><td>{n}</td></tr> }).collect_view()}
            </tbody>
        </table>
        <h2>"Most throttled keys"</h2>
        <table id="top-throttled">
            <thead><tr><th>"Key id"</th><th>"429s"</th></tr></thead>
            <tbody>
                {top.into_iter().map(|(k, n)| view! { <tr><td>{k}</td><td>{n}</td></tr> }).collect_view()}
            </tbody>
        </table>
    }
}

// ----- policies -------------------------------------------------------------------

#[component]
fn PoliciesPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let save_policy = ServerAction::<SavePolicy>::new();
    let delete_policy = ServerAction::<DeletePolicy>::new();
    let save_plan = ServerAction::<SavePlan>::new();
    let delete_plan = ServerAction::<DeletePlan>::new();
    let save_route = ServerAction::<SaveRoute>::new();
    let delete_route = ServerAction::<DeleteRoute>::new();
    let save_override = ServerAction::<SaveOverride>::new();
    let delete_override = ServerAction::<DeleteOverride>::new();
    let save_ip = ServerAction::<SaveIpPolicies>::new();
    let save_headers = ServerAction::<SaveHeaders>::new();
    // a saved limit reloads the configuration; a backtest or a refused form does
    // not (the form keeps what was typed)
    let limits_saved = RwSignal::new(0u32);
    let config = Resource::new(
        move || {
            (
                limits_saved.get(),
                delete_policy.version().get(),
                save_plan.version().get(),
                delete_plan.version().get(),
                save_route.version().get(),
                delete_route.version().get(),
                save_override.version().get(),
                delete_override.version().get(),
                save_ip.version().get(),
                save_headers.version().get(),
            )
        },
        |_| get_config(),
    );
    let editing = RwSignal::new(None::<PolicyForm>);
    let editing_plan = RwSignal::new(None::<(String, String)>);
    let editing_route = RwSignal::new(None::<(String, String, String)>);
    // a saved edit closes its form (it shows the stored values once reloaded)
    let saved = |v: Option<Result<Saved, ServerFnError>>| matches!(v, Some(Ok(Saved::Ok(_))));
    Effect::new(move |_| {
        if saved(save_policy.value().get()) {
            editing.set(None);
            limits_saved.update(|n| *n += 1);
        }
    });
    Effect::new(move |_| {
        if saved(save_plan.value().get()) {
            editing_plan.set(None);
        }
    });
    Effect::new(move |_| {
        if saved(save_route.value().get()) {
            editing_route.set(None);
        }
    });
    view! {
        <Title text="Floodgate — policies"/>
        <h1>"Policies"</h1>
        <Transition fallback=|| view! { <p>"Loading…"</p> }>
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
                       ". The edge picks up a saved change within its cache TTL (5 s by default)."</p>
                    {policy_section(&spec, &csrf, &version, save_policy, delete_policy, editing)}
                    {plan_section(&spec, &csrf, &version, save_plan, delete_plan, editing_plan)}
                    {route_section(&spec, &csrf, &version, save_route, delete_route, editing_route)}
                    {override_section(&spec, &csrf, &version, save_override, delete_override, save_ip)}
                    {headers_section(&spec, &csrf, &version, save_headers)}
                    <EffectiveLimitsTool/>
                }
                .into_any()
            })}
        </Transition>
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
    save: ServerAction<SavePolicy>,
    delete: ServerAction<DeletePolicy>,
    editing: RwSignal<Option<PolicyForm>>,
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
                    <td>{name}</td>
                    <td>{form.dimensions.clone()}</td>
                    <td class="limit">{describe_quota(p)}</td>
                    <td>{p.cost}</td>
                    <td>{form.failure_mode.clone()}{form.shadow.then_some(" · shadow (not enforced)")}</td>
                    <td>
                        <button type="button" on:click=move |_| editing.set(Some(form.clone()))>"Edit"</button>
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
    let (csrf, version) = (csrf.to_string(), version.to_string());
    let fields: &'static [&'static str] = &POLICY_FIELDS;
    view! {
        <h2>"Limits"</h2>
        <table id="policies">
            <thead><tr><th>"Name"</th><th>"Keyed by"</th><th>"Limit"</th><th>"Cost"</th><th>"If Redis fails"</th><th></th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
        {outcome(val(delete), same, &[])}
        {move || {
            let (csrf, version) = (csrf.clone(), version.clone());
            let f = editing.get().unwrap_or_default();
            let original = if editing.get().is_some() { f.name.clone() } else { String::new() };
            let title = if original.is_empty() { "New limit".to_string() } else { format!("Edit limit {original}") };
            let dims = f.dimensions.clone();
            let mode = f.failure_mode.clone();
            let algo = if f.algorithm.is_empty() { "token_bucket".to_string() } else { f.algorithm.clone() };
            view! {
                <ActionForm action=save attr:class="card" attr:id="policy-form">
                    <strong>{title}</strong><br/>
                    {hidden(&csrf, &version)}
                    <input type="hidden" name="original" value=original/>
                    <label>"Name" <input name="name" value=f.name.clone()/>{field_error(val(save), same, "name")}</label>
                    <label>"Keyed by"
                        <select name="dimensions">
                            {DIMENSION_CHOICES.iter().map(|d| view! { <option value=*d selected=dims == *d>{d.replace(',', " + ")}</option> }).collect_view()}
                        </select>
                        {field_error(val(save), same, "dimensions")}
                    </label>
                    <label>"Capacity (burst)" <input name="capacity" inputmode="numeric" value=f.capacity.clone()/>{field_error(val(save), same, "quota.capacity")}</label>
                    <label>"Per period" <input name="period" placeholder="1m" value=f.period.clone()/>{field_error(val(save), same, "quota.period")}</label>
                    <label>"Refill per period (default = capacity)" <input name="refill" inputmode="numeric" value=f.refill.clone()/>{field_error(val(save), same, "quota.refill")}</label>
                    <label>"Cost per request" <input name="cost" inputmode="numeric" placeholder="1" value=f.cost.clone()/>{field_error(val(save), same, "cost")}</label>
                    <label>"If Redis fails"
                        <select name="failure_mode">
                            <option value="fail_closed" selected=mode != "fail_open">"fail closed (503)"</option>
                            <option value="fail_open" selected=mode == "fail_open">"fail open (allow, marked)"</option>
                            <option value="local_fallback" selected=mode == "local_fallback">"local fallback (a share per instance)"</option>
                        </select>
                        {field_error(val(save), same, "failure_mode")}
                    </label>
                    <label>"Local share % (local fallback)" <input name="local_share_percent" inputmode="numeric" value=f.local_share_percent.clone()/>{field_error(val(save), same, "local_share_percent")}</label>
                    <label>"Max in flight (optional)" <input name="max_in_flight" inputmode="numeric" value=f.max_in_flight.clone()/>{field_error(val(save), same, "max_in_flight")}</label>
                    <label>"Algorithm"
                        <select name="algorithm">
                            {ALGORITHMS.iter().map(|(v, label)| view! { <option value=*v selected=algo == *v>{*label}</option> }).collect_view()}
                        </select>
                        {field_error(val(save), same, "algorithm")}
                    </label>
                    <label>"Shadow (count, never enforce)" <input type="checkbox" name="shadow" checked=f.shadow/></label>
                    <br/>
                    <button type="submit" name="preview" value="1" id="backtest">"Backtest on recent traffic"</button>
                    " "
                    <button type="submit" id="save-limit">"Save limit"</button>
                    " "
                    <button type="button" on:click=move |_| editing.set(None)>"New"</button>
                    {outcome(val(save), same, fields)}
                    {move || match save.value().get() {
                        Some(Ok(Saved::Preview { sampled, rows })) => Some(backtest_view(sampled, rows)),
                        _ => None,
                    }}
                </ActionForm>
            }
        }}
    }
}

const ALGORITHMS: [(&str, &str); 4] = [
    ("token_bucket", "token bucket (burst, continuous refill)"),
    ("fixed_window", "fixed window (2× at window edges)"),
    ("sliding_log", "sliding-window log (exact)"),
    ("sliding_counter", "sliding-window counter (approximate)"),
];

fn backtest_view(sampled: u64, rows: Vec<BacktestRow>) -> AnyView {
    view! {
        <div id="backtest-result" data-sampled=sampled.to_string()>
            <p>"Replayed the edge's last " {sampled} " sampled requests (nothing saved):"</p>
            <table>
                <thead><tr><th>"Endpoint"</th><th>"Requests"</th><th>"429s now"</th><th>"With this change"</th><th>"Would have throttled (shadow)"</th></tr></thead>
                <tbody>
                    {rows.into_iter().map(|r| {
                        let route = r.route.clone();
                        view! {
                            <tr data-route=route>
                                <td>{r.route}</td>
                                <td>{r.requests}</td>
                                <td>{r.throttled_now}</td>
                                <td class="would">{format!("would have returned 429 to {} requests of {} keys (of {} seen)", r.throttled, r.keys, r.keys_seen)}</td>
                                <td>{r.shadow}</td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
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
    editing: RwSignal<Option<(String, String)>>,
) -> impl IntoView + use<> {
    let rows = spec
        .plans
        .iter()
        .map(|(name, policies)| {
            let list = policies.join(", ");
            let (n, l) = (name.clone(), list.clone());
            let (name, field_name, row) = (name.clone(), name.clone(), name.clone());
            let (csrf, version) = (csrf.to_string(), version.to_string());
            view! {
                <tr data-plan=row>
                    <td>{name}</td><td>{list}</td>
                    <td>
                        <button type="button" on:click=move |_| editing.set(Some((n.clone(), l.clone())))>"Edit"</button>
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
    let (csrf, version) = (csrf.to_string(), version.to_string());
    view! {
        <h2>"Plans (per-key limits every key on the plan gets)"</h2>
        <table id="plans"><thead><tr><th>"Plan"</th><th>"Limits"</th><th></th></tr></thead><tbody>{rows}</tbody></table>
        {outcome(val(delete), same, &[])}
        {move || {
            let (csrf, version) = (csrf.clone(), version.clone());
            let (name, list) = editing.get().unwrap_or_default();
            let original = name.clone();
            view! {
                <ActionForm action=save attr:class="card" attr:id="plan-form">
                    {hidden(&csrf, &version)}
                    <input type="hidden" name="original" value=original/>
                    <label>"Plan" <input name="name" value=name/>{field_error(val(save), same, "name")}</label>
                    <label>"Limits (comma-separated)" <input name="policies" value=list/>{field_error(val(save), same, "policies")}</label>
                    <button type="submit">"Save plan"</button>
                    {outcome(val(save), same, &["name", "policies"])}
                </ActionForm>
            }
        }}
    }
}

fn route_section(
    spec: &ConfigSpec,
    csrf: &str,
    version: &str,
    save: ServerAction<SaveRoute>,
    delete: ServerAction<DeleteRoute>,
    editing: RwSignal<Option<(String, String, String)>>,
) -> impl IntoView + use<> {
    let rows = spec
        .routes
        .iter()
        .map(|r| {
            let list = r.policies.join(", ");
            let e = (r.name.clone(), r.pattern.clone(), list.clone());
            let (name, field_name, pattern) = (r.name.clone(), r.name.clone(), r.pattern.clone());
            let row = name.clone();
            let (csrf, version) = (csrf.to_string(), version.to_string());
            view! {
                <tr data-route=row>
                    <td>{name}</td><td><code>{pattern}</code></td><td>{list}</td>
                    <td>
                        <button type="button" on:click=move |_| editing.set(Some(e.clone()))>"Edit"</button>
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
    let (csrf, version) = (csrf.to_string(), version.to_string());
    view! {
        <h2>"Endpoints (routes and their per-key, per-endpoint limits)"</h2>
        <table id="routes"><thead><tr><th>"Route"</th><th>"Pattern"</th><th>"Limits"</th><th></th></tr></thead><tbody>{rows}</tbody></table>
        {outcome(val(delete), same, &[])}
        {move || {
            let (csrf, version) = (csrf.clone(), version.clone());
            let (name, pattern, list) = editing.get().unwrap_or_default();
            let original = name.clone();
            view! {
                <ActionForm action=save attr:class="card" attr:id="route-form">
                    {hidden(&csrf, &version)}
                    <input type="hidden" name="original" value=original/>
                    <label>"Route" <input name="name" value=name/>{field_error(val(save), same, "name")}</label>
                    <label>"Pattern" <input name="pattern" placeholder="/v1/users/:id" value=pattern/>{field_error(val(save), same, "pattern")}</label>
                    <label>"Limits (comma-separated)" <input name="policies" value=list/>{field_error(val(save), same, "policies")}</label>
                    <button type="submit">"Save route"</button>
                    {outcome(val(save), same, &["name", "pattern", "policies"])}
                </ActionForm>
            }
        }}
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
        <table id="overrides"><thead><tr><th>"Key id"</th><th>"Limits"</th><th></th></tr></thead><tbody>{rows}</tbody></table>
        {outcome(val(delete), same, &[])}
        <ActionForm action=save attr:class="card" attr:id="override-form">
            {hidden(&csrf, &version)}
            <label>"Key id" <input name="key_id"/>{field_error(val(save), same, "key_id")}</label>
            <label>"Limits (comma-separated)" <input name="policies"/>{field_error(val(save), same, "policies")}</label>
            <button type="submit">"Save override"</button>
            {outcome(val(save), same, &["key_id", "policies"])}
        </ActionForm>
        <h2>"Per client IP"</h2>
        <ActionForm action=save_ip attr:class="card" attr:id="ip-form">
            {hidden(&csrf2, &version2)}
            <label>"Limits (comma-separated, keyed by client_ip)" <input name="policies" value=ip/>{field_error(val(save_ip), same, "policies")}</label>
            <button type="submit">"Save"</button>
            {outcome(val(save_ip), same, &["policies"])}
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
            <label>"Retry-After jitter (0-60 s)" <input name="retry_jitter_secs" inputmode="numeric" value=h.retry_jitter_secs.to_string()/>{field_error(val(save), same, "headers.retry_jitter_secs")}</label>
            <button type="submit">"Save"</button>
            {outcome(val(save), same, &["headers.retry_jitter_secs"])}
        </ActionForm>
    }
}

#[component]
fn EffectiveLimitsTool() -> impl IntoView + use<> {
    let query = ServerAction::<EffectiveLimits>::new();
    view! {
        <h2>"Effective limits of a key on an endpoint"</h2>
        <ActionForm action=query attr:class="card" attr:id="effective-form">
            <label>"Key id" <input name="key_id"/></label>
            <label>"Path" <input name="path" placeholder="/v1/search"/></label>
            <button type="submit">"Show"</button>
        </ActionForm>
        {move || query.value().get().map(|r| match r {
            Err(e) => error_view(e),
            Ok(rows) => view! {
                <table id="effective">
                    <thead><tr><th>"Limit"</th><th>"From"</th><th>"Quota"</th><th>"Cost"</th><th>"If Redis fails"</th></tr></thead>
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
            }.into_any(),
        })}
    }
}

// ----- keys -----------------------------------------------------------------------

#[component]
fn KeysPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let create = ServerAction::<CreateKey>::new();
    let update = ServerAction::<UpdateKey>::new();
    let revoke = ServerAction::<RevokeKey>::new();
    let keys = Resource::new(
        move || {
            (
                create.version().get(),
                update.version().get(),
                revoke.version().get(),
            )
        },
        |_| list_keys(),
    );
    let config = Resource::new(|| (), |_| get_config());
    let created_saved = |v: &(Saved, Option<CreatedKey>)| v.0.clone();
    view! {
        <Title text="Floodgate — API keys"/>
        <h1>"API keys"</h1>
        {move || create.value().get().and_then(Result::ok).and_then(|(_, k)| k).map(|k| {
            let (id, secret, attr) = (k.id.clone(), k.secret.clone(), k.secret);
            view! {
                <div class="card" id="new-secret">
                    <p>"The secret of key " <code>{id}</code> " — shown this once; it is stored only as a hash:"</p>
                    <span class="secret" data-secret=attr>{secret}</span>
                </div>
            }
        })}
        <Transition fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let (s, k, c) = match (session.await, keys.await, config.await) {
                    (Ok(s), Ok(k), Ok(c)) => (s, k, c),
                    (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return error_view(e),
                };
                let plans: Vec<String> = c.spec.map(|s| s.plans.into_keys().collect()).unwrap_or_default();
                let csrf = s.csrf.clone();
                let rows = k.into_iter().map(|k| {
                    let plans = plans.clone();
                    let (row, shown, upd_id, rev_id) = (k.id.clone(), k.id.clone(), k.id.clone(), k.id.clone());
                    let (csrf_u, csrf_r) = (csrf.clone(), csrf.clone());
                    let revoked = k.revoked;
                    let current_plan = k.plan.clone();
                    let label = k.label.clone();
                    let usage = format!("{} allowed · {} throttled · {} degraded", k.allowed, k.throttled, k.degraded);
                    view! {
                        <tr data-key=row data-revoked=revoked.to_string()>
                            <td><code>{shown}</code></td>
                            <td>
                                <ActionForm action=update attr:style="display:inline">
                                    <input type="hidden" name="csrf" value=csrf_u/>
                                    <input type="hidden" name="id" value=upd_id/>
                                    <input name="label" value=label aria-label="label"/>
                                    <select name="plan" aria-label="plan">
                                        {plans.iter().map(|p| view! { <option value=p.clone() selected=*p == current_plan>{p.clone()}</option> }).collect_view()}
                                    </select>
                                    <button type="submit">"Save"</button>
                                </ActionForm>
                            </td>
                            <td>{if revoked { "revoked" } else { "active" }}</td>
                            <td class="usage">{usage}</td>
                            <td>
                                {(!revoked).then(move || view! {
                                    <ActionForm action=revoke attr:style="display:inline">
                                        <input type="hidden" name="csrf" value=csrf_r/>
                                        <input type="hidden" name="id" value=rev_id/>
                                        <button type="submit" class="danger">"Revoke"</button>
                                    </ActionForm>
                                })}
                            </td>
                        </tr>
                    }
                }).collect_view();
                view! {
                    <ActionForm action=create attr:class="card" attr:id="create-key">
                        <strong>"New key"</strong><br/>
                        <input type="hidden" name="csrf" value=csrf.clone()/>
                        <label>"Label" <input name="label"/>{field_error(val(create), created_saved, "label")}</label>
                        <label>"Plan"
                            <select name="plan">
                                {plans.iter().map(|p| view! { <option value=p.clone()>{p.clone()}</option> }).collect_view()}
                            </select>
                            {field_error(val(create), created_saved, "plan")}
                        </label>
                        <button type="submit">"Create key"</button>
                        {outcome(val(create), created_saved, &["label", "plan"])}
                    </ActionForm>
                    {outcome(val(update), same, &[])}
                    {outcome(val(revoke), same, &[])}
                    <p>"Usage: decisions over the last hour. A revoked key is refused by the edge within its cache TTL."</p>
                    <table id="keys">
                        <thead><tr><th>"Id"</th><th>"Label and plan"</th><th>"Status"</th><th>"Usage (1 h)"</th><th></th></tr></thead>
                        <tbody>{rows}</tbody>
                    </table>
                }
                .into_any()
            })}
        </Transition>
    }
}

// ----- audit ----------------------------------------------------------------------

#[component]
fn AuditPage() -> impl IntoView {
    let entries = Resource::new(|| (), |_| audit_entries());
    view! {
        <Title text="Floodgate — audit log"/>
        <h1>"Audit log"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match entries.await {
                    Err(e) => error_view(e),
                    Ok(list) => view! {
                        <table id="audit">
                            <thead><tr><th>"When (UTC)"</th><th>"Who"</th><th>"What"</th><th>"Before"</th><th>"After"</th></tr></thead>
                            <tbody>
                                {list.into_iter().map(|e| view! {
                                    <tr>
                                        <td>{format_time(e.at)}</td>
                                        <td>{e.user}</td>
                                        <td>{e.action} " " <code>{e.target}</code></td>
                                        <td><pre>{e.before.unwrap_or_default()}</pre></td>
                                        <td><pre>{e.after.unwrap_or_default()}</pre></td>
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

/// `YYYY-MM-DD HH:MM:SS` of Unix seconds (UTC), without a date library.
pub fn format_time(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // civil-from-days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_format_as_utc() {
        assert_eq!(super::format_time(0), "1970-01-01 00:00:00");
        assert_eq!(super::format_time(1_796_000_000), "2026-11-30 00:53:20");
        assert_eq!(super::format_time(951_825_600), "2000-02-29 12:00:00");
    }
}
