//! The policies page: the stored configuration's limits, plans, routes, key
//! overrides, per-address limits, response headers and deny lists, each with its
//! form, and a tool that shows the limits a key meets on an endpoint.

use floodgate_shared::config::{ConfigSpec, Source};
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::limits::policy_section;
use super::{
    SessionResource, error_view, field_error, hidden, island_ready, outcome, row_actions,
    saved_message, val,
};
use crate::api::{
    DeleteOverride, DeletePlan, DeletePolicy, DeleteRoute, EffectiveLimits, SaveDeny, SaveHeaders,
    SaveIpPolicies, SaveOverride, SavePlan, SaveRoute, StartConfig, get_config, traffic_stats,
};
use crate::describe::UNMATCHED;

#[component]
pub fn PoliciesPage() -> impl IntoView {
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
    let start = ServerAction::<StartConfig>::new();
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
                let first_run = c.spec.is_none().then(|| start_section(&csrf, &version, start));
                view! {
                    {first_run}
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

/// With no configuration stored: what to do first, and a form that stores one
/// limit per key on one plan.
fn start_section(
    csrf: &str,
    version: &str,
    start: ServerAction<StartConfig>,
) -> impl IntoView + use<> {
    let (csrf, version) = (csrf.to_string(), version.to_string());
    view! {
        <section class="banner" id="no-config" aria-labelledby="no-config-h">
            <h2 id="no-config-h">"Start here: no configuration is stored yet"</h2>
            <p>"The edge limits requests by the configuration stored in Redis, and none is stored. Store a whole file with "
               <code>"floodgate-cli config set config/demo.json"</code>
               ", or start with one limit per API key on one plan here (edit it and add routes below once it is saved):"</p>
            <ActionForm action=start attr:class="card" attr:id="start-form">
                {hidden(&csrf, &version)}
                <label>"Plan" <input name="plan" value="free"/>{field_error(val(start), "plan")}</label>
                <label>"Requests per API key" <input name="capacity" inputmode="numeric" value="100"/>{field_error(val(start), "quota.capacity")}</label>
                <label>"Per period" <input name="period" value="1m"/>{field_error(val(start), "quota.period")}</label>
                <button type="submit">"Create the configuration"</button>
                {outcome(val(start), saved_message, &["plan", "quota.capacity", "quota.period"])}
            </ActionForm>
            <p>"Next: create an API key on the " <a href="/keys">"API keys"</a> " page and send a request with it."</p>
        </section>
    }
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
            let edit = format!("/policies?edit_plan={name}#plan-form");
            let actions = row_actions(Some(edit), delete, (csrf, version), "name", name.clone());
            view! {
                <tr data-plan=name.clone()>
                    <td>{name.clone()}</td><td>{list}</td>
                    {actions}
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
            let (name, pattern) = (r.name.clone(), r.pattern.clone());
            let edit = format!("/policies?edit_route={name}#route-form");
            let actions = row_actions(Some(edit), delete, (csrf, version), "name", name.clone());
            view! {
                <tr data-route=name.clone()>
                    <td><code>{pattern}</code></td><td>{name.clone()}</td><td>{list}</td>
                    {actions}
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
            let list = policies.join(", ");
            let actions = row_actions(None, delete, (csrf, version), "key_id", id.clone());
            view! {
                <tr data-override=id.clone()>
                    <td><code>{id.clone()}</code></td><td>{list}</td>
                    {actions}
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
                                Source::IdentityOverride(i) => format!("identity {i}'s override"),
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
