//! The limits (policies) section of the policies page: the table, and the island
//! that edits one limit and backtests it on recent traffic.

use floodgate_shared::config::ConfigSpec;
use leptos::prelude::*;

use super::{field_error, hidden, island_ready, outcome, reload, row_actions, saved_message, val};
use crate::api::{DeletePolicy, SavePolicy};
use crate::describe::{describe_consistency, describe_quota, endpoint_label};
use crate::forms::{POLICY_FIELDS, PolicyForm};
use crate::time;
use crate::wire::{Backtest, Saved};

const DIMENSION_CHOICES: [&str; 6] = [
    "api_key",
    "api_key,endpoint",
    "client_ip",
    "api_key,client_ip",
    "endpoint",
    "api_key,endpoint,client_ip",
];

pub(super) fn policy_section(
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
            let edit = format!("/policies?edit={name}#policy-form");
            let actions = row_actions(Some(edit), delete, (csrf, version), "name", name.clone());
            view! {
                <tr data-policy=name.clone()>
                    <td>{name.clone()}</td>
                    <td>{form.dimensions.clone()}</td>
                    <td class="limit">{describe_quota(p)}</td>
                    <td>{p.cost}</td>
                    <td>{form.failure_mode.clone()}{form.shadow.then_some(" · shadow (not enforced)")}</td>
                    <td class="consistency">{describe_consistency(p)}</td>
                    {actions}
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
    let title = if original.is_empty() {
        "New limit".to_string()
    } else {
        format!("Edit limit {original}")
    };
    let fields: &'static [&'static str] = &POLICY_FIELDS;
    view! {
        <ActionForm action=save attr:class="card" attr:id="policy-form">
            <strong>{title}</strong><br/>
            {hidden(&csrf, &version)}
            <input type="hidden" name="original" value=original.clone()/>
            {quota_fields(&form, save)}
            {failure_fields(&form, save)}
            {consistency_fields(&form, save)}
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

/// The limit's name, what it is keyed by, its quota and cost.
fn quota_fields(f: &PolicyForm, save: ServerAction<SavePolicy>) -> impl IntoView + use<> {
    let f = f.clone();
    let dims = f.dimensions.clone();
    view! {
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
    }
}

/// What the limit does when Redis fails, in flight, its algorithm and shadow mode.
fn failure_fields(f: &PolicyForm, save: ServerAction<SavePolicy>) -> impl IntoView + use<> {
    let f = f.clone();
    let mode = f.failure_mode.clone();
    let algo = if f.algorithm.is_empty() {
        "token_bucket".to_string()
    } else {
        f.algorithm.clone()
    };
    view! {
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
    }
}

/// Consistency across edges, and the overshoot bound of bounded and auto.
fn consistency_fields(f: &PolicyForm, save: ServerAction<SavePolicy>) -> impl IntoView + use<> {
    let f = f.clone();
    let chosen = if f.consistency.is_empty() {
        "exact".to_string()
    } else {
        f.consistency.clone()
    };
    view! {
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
