//! The API keys page: key creation (the secret shown once, with a copy button),
//! and the keys with their usage, refreshed in the browser; edit and revoke.

use std::collections::BTreeMap;
use std::time::Duration;

use leptos::prelude::*;
use leptos_meta::Title;

use super::{
    SessionResource, error_view, every, field_error, go_to_sign_in, hydrated, island_ready,
    outcome, saved_message, val, when,
};
use crate::api::{CreateKey, RevokeKey, UpdateKey, get_config, list_keys};
use crate::describe::{example_path, try_request};
use crate::error::AppError;
use crate::time;
use crate::wire::{CreatedKey, KeyRow};

/// Live usage of the keys: id → (allowed, throttled, degraded, last used), as the
/// browser last fetched it.
type LiveUsage = RwSignal<BTreeMap<String, (u64, u64, u64, Option<i64>)>>;

#[component]
pub fn KeysPage() -> impl IntoView {
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
                let try_path = example_path(c.spec.as_ref());
                let plans: Vec<String> = c.spec.map(|s| s.plans.into_keys().collect()).unwrap_or_default();
                view! { <KeysPanel rows=k plans=plans csrf=s.csrf rendered_at=time::now_secs() edge_url=s.edge_url try_path=try_path/> }.into_any()
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
    edge_url: Option<String>,
    try_path: String,
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
    every(Duration::from_secs(5), move || {
        refresh(keys, live, now, false)
    });
    Effect::new(move |_| {
        let done = |v: Option<bool>| v == Some(true);
        if done(create.value().get().map(|r| r.is_ok()))
            | done(update.value().get().map(|r| r.is_ok()))
            | done(revoke.value().get().map(|r| r.is_ok()))
        {
            refresh(keys, live, now, true);
        }
    });
    let rows = Rows {
        plans: plans.clone(),
        csrf: csrf.clone(),
        update,
        revoke,
        live,
        now,
        rendered_at,
        ready,
    };
    view! {
        {first_steps(keys, plans.is_empty())}
        {move || create.value().get().and_then(Result::ok).map(|k| new_secret(k, edge_url.as_deref(), &try_path))}
        {create_form(create, &csrf, &plans)}
        {outcome(val(update), saved_message, &[])}
        {outcome(val(revoke), saved_message, &[])}
        <p class="muted">"Usage: decisions over the last hour, refreshed every 5 s. A revoked key is refused by the edge within two cache TTLs (10 s by default), and is read-only here."</p>
        <table id="keys">
            <thead><tr>
                <th scope="col">"Key id"</th><th scope="col">"Label"</th><th scope="col">"Plan"</th><th scope="col">"Status"</th>
                <th scope="col">"Created"</th><th scope="col">"Last used"</th><th scope="col">"Usage (1 h)"</th><th scope="col">"Actions"</th>
            </tr></thead>
            <tbody>
                {move || keys.get().into_iter().map(|k| key_row(k, &rows)).collect_view()}
            </tbody>
        </table>
    }
}

/// The first run: no plan to put a key on yet, or no key yet.
fn first_steps(keys: RwSignal<Vec<KeyRow>>, no_plans: bool) -> impl IntoView {
    view! {
        {no_plans.then(|| view! {
            <p class="banner" id="no-plans">"No plan is configured yet, so no key can be created: start a configuration on the "
                <a href="/policies">"Policies"</a> " page first."</p>
        })}
        {move || (keys.get().is_empty() && !no_plans).then(|| view! {
            <p class="banner" id="no-keys">"No API keys yet: create one below. Its secret is shown once, here, with a request to try it on the edge (or run "
                <code>"floodgate-cli key create --plan PLAN"</code> ")."</p>
        })}
    }
}

/// Reads the keys' usage again (and, when `whole`, the keys themselves).
fn refresh(keys: RwSignal<Vec<KeyRow>>, live: LiveUsage, now: RwSignal<Option<i64>>, whole: bool) {
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
}

/// The form that creates a key on one of `plans`.
fn create_form(
    create: ServerAction<CreateKey>,
    csrf: &str,
    plans: &[String],
) -> impl IntoView + use<> {
    let (csrf, plans) = (csrf.to_string(), plans.to_vec());
    view! {
        <ActionForm action=create attr:class="card" attr:id="create-key">
            <strong>"New key"</strong><br/>
            <input type="hidden" name="csrf" value=csrf/>
            <label>"Label" <input name="label"/>{field_error(val(create), "label")}</label>
            <label>"Plan"
                <select name="plan">
                    {plans.iter().map(|p| view! { <option value=p.clone()>{p.clone()}</option> }).collect_view()}
                </select>
                {field_error(val(create), "plan")}
            </label>
            <button type="submit">"Create key"</button>
            {outcome(val(create), |k: &CreatedKey| Some(format!("Created key {}", k.id)), &["label", "plan"])}
        </ActionForm>
    }
}

/// The one-time secret of a key just created, with a copy button.
pub(crate) fn new_secret(
    k: CreatedKey,
    edge_url: Option<&str>,
    path: &str,
) -> impl IntoView + use<> {
    let try_it = try_request(edge_url, &k.secret, path);
    let placeholder = edge_url.is_none().then(|| view! {
        <p class="muted">"Replace EDGE_URL with the edge's address (start the dashboard with --edge-url to have it here)."</p>
    });
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
            <p>"Try it on the edge:"</p>
            <pre><code id="try-key">{try_it}</code></pre>
            {placeholder}
            <p>"Then watch the " <a href="/">"Traffic"</a> " page: the request appears there within seconds, as allowed, or as a 429 (throttled) once the key is over its limit."</p>
        </div>
    }
}

/// What every row of the keys table shares: the plans a key can be moved to, the
/// forms' token and actions, the live usage and the clock it was read at.
struct Rows {
    plans: Vec<String>,
    csrf: String,
    update: ServerAction<UpdateKey>,
    revoke: ServerAction<RevokeKey>,
    live: LiveUsage,
    now: RwSignal<Option<i64>>,
    rendered_at: i64,
    ready: RwSignal<bool>,
}

/// A key's row: its usage and last use follow the live figures.
fn key_row(k: KeyRow, rows: &Rows) -> impl IntoView + use<> {
    let (live, now, rendered_at) = (rows.live, rows.now, rows.rendered_at);
    let initial = (k.allowed, k.throttled, k.degraded, k.last_used);
    let usage_id = k.id.clone();
    let usage = move || {
        let (a, t, d, _) = live.get().get(&usage_id).copied().unwrap_or(initial);
        format!("{a} allowed · {t} throttled · {d} degraded")
    };
    let last_id = k.id.clone();
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
    let actions = (!k.revoked).then(|| key_actions(&k, rows));
    view! {
        <tr data-key=k.id.clone() data-revoked=k.revoked.to_string()>
            <td><a href=format!("/keys/{}", k.id)><code>{k.id.clone()}</code></a></td>
            <td class="label">{k.label}</td>
            <td>{k.plan}</td>
            <td class="status">{status}</td>
            <td class="created">{when(k.created, rows.ready)}</td>
            <td class="last-used">{last_used}</td>
            <td class="usage">{usage}</td>
            <td>{actions}</td>
        </tr>
    }
}

/// An active key's edit form, and its revocation behind a confirmation.
fn key_actions(k: &KeyRow, rows: &Rows) -> impl IntoView + use<> {
    let (update, revoke) = (rows.update, rows.revoke);
    let current_plan = k.plan.clone();
    let (csrf_update, csrf_revoke) = (rows.csrf.clone(), rows.csrf.clone());
    let (update_id, revoke_id) = (k.id.clone(), k.id.clone());
    let (plans, label) = (rows.plans.clone(), k.label.clone());
    let revoke_label = format!("Revoke key {}", k.id);
    view! {
        <details class="edit-key">
            <summary>"Edit"</summary>
            <ActionForm action=update attr:class="card">
                <input type="hidden" name="csrf" value=csrf_update/>
                <input type="hidden" name="id" value=update_id/>
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
                <input type="hidden" name="csrf" value=csrf_revoke/>
                <input type="hidden" name="id" value=revoke_id/>
                <input type="hidden" name="confirm" value="yes"/>
                <button type="submit" class="danger">{revoke_label}</button>
            </ActionForm>
        </details>
    }
}
