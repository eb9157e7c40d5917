//! A key's page (`/keys/<id>`): its fields (identity, name, metadata, plan,
//! status, times), a form to change its identity, name, metadata, expiry and
//! credits (new credits behind a confirmation: they restart the live count), a running
//! rotation's overlap: until when the replaced secret still works; a rotation
//! (an island: the new secret is shown once, with a copy button, and the
//! overlap is confirmed first).

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use super::keys::new_secret;
use super::{SessionResource, error_view, field_error, island_ready, outcome, saved_message, val};
use crate::api::{RotateKeySecret, SaveKeyDetail, key_detail};
use crate::time;
use crate::wire::KeyDetailView;

#[component]
pub fn KeyDetailPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let key = Resource::new(id, key_detail);
    let save = ServerAction::<SaveKeyDetail>::new();
    view! {
        <Title text="Floodgate — API key"/>
        <p><a href="/keys">"← API keys"</a></p>
        {outcome(val(save), saved_message, &["identity", "name", "metadata", "expires_at", "credits", "confirm_credits"])}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match (session.await, key.await) {
                    (Ok(s), Ok(k)) => detail(k, &s.csrf, save).into_any(),
                    (Err(e), _) | (_, Err(e)) => error_view(e),
                }
            })}
        </Suspense>
    }
}

fn or_none(v: Option<String>) -> String {
    v.unwrap_or_else(|| "(none)".into())
}

fn detail(
    k: KeyDetailView,
    csrf: &str,
    save: ServerAction<SaveKeyDetail>,
) -> impl IntoView + use<> {
    let row = k.row;
    let status = if row.revoked { "revoked" } else { "active" };
    let expiry = k.expires_at.map_or("never".to_string(), time::utc);
    let rotation = match k.previous_secret_until {
        Some(until) => format!(
            "rotated: the replaced secret works until {} ({} s from now), then only the new one",
            time::utc(until),
            until - time::now_secs()
        ),
        None => "no replaced secret works".to_string(),
    };
    let identity = k
        .identity
        .clone()
        .map(|i| view! { <a href="/identities">{i}</a> });
    let identity_value = k.identity.clone().unwrap_or_default();
    let name_value = k.name.clone().unwrap_or_default();
    let metadata_value = k.metadata.clone().unwrap_or_default();
    let expires_value = k.expires_at.map(time::rfc3339).unwrap_or_default();
    let credits_value = k.credits.clone().unwrap_or_default();
    let form = (!row.revoked).then(|| {
        let (csrf, id, version) = (csrf.to_string(), row.id.clone(), k.version.clone());
        view! {
            <ActionForm action=save attr:class="card" attr:id="key-detail-form">
                <input type="hidden" name="csrf" value=csrf/>
                <input type="hidden" name="id" value=id/>
                <input type="hidden" name="version" value=version/>
                <label>"Identity (the customer's id: its keys share the limits of policies by identity; empty: none)" <input name="identity" value=identity_value/>{field_error(val(save), "identity")}</label>
                <label>"Name (empty: none)" <input name="name" value=name_value/>{field_error(val(save), "name")}</label>
                <label>"Metadata (a JSON object of at most 1 KB, sent to the upstream; empty: none)" <input name="metadata" value=metadata_value/>{field_error(val(save), "metadata")}</label>
                <label>"Expires at (RFC 3339 UTC or Unix seconds; empty: never)" <input name="expires_at" value=expires_value/>{field_error(val(save), "expires_at")}</label>
                <label>"Credits (JSON, e.g. {\"remaining\": 1000, \"refill\": {\"amount\": 1000, \"interval\": \"monthly\"}}; empty: none)" <input name="credits" value=credits_value/>{field_error(val(save), "credits")}</label>
                <details class="confirm-credits">
                    <summary>"Changing credits…"</summary>
                    <p>"New credits start the key's live count again from their remaining (in Redis' clock): what the key spent so far is forgotten."</p>
                    <label><input type="checkbox" name="confirm_credits" value="yes"/>" I changed the credits and want the count restarted"</label>
                    {field_error(val(save), "confirm_credits")}
                </details>
                <button type="submit">"Save"</button>
            </ActionForm>
        }
    });
    view! {
        <h1>"API key " <code>{row.id.clone()}</code></h1>
        <dl class="key-detail">
            <dt>"Status"</dt><dd class="status">{status}</dd>
            <dt>"Label"</dt><dd>{row.label}</dd>
            <dt>"Name"</dt><dd>{or_none(k.name)}</dd>
            <dt>"Plan"</dt><dd>{row.plan}</dd>
            <dt>"Identity"</dt><dd>{identity.map(IntoAny::into_any).unwrap_or_else(|| "(none)".into_any())}</dd>
            <dt>"Metadata"</dt><dd><code>{or_none(k.metadata)}</code></dd>
            <dt>"Created"</dt><dd>{time::utc(row.created)}</dd>
            <dt>"Expires"</dt><dd class="expires">{expiry}</dd>
            <dt>"Credits"</dt><dd class="credits"><code>{or_none(k.credits)}</code></dd>
            <dt>"Rotation"</dt><dd class="rotation">{rotation}</dd>
            <dt>"Usage (1 h)"</dt><dd>{format!("{} allowed · {} throttled · {} degraded", row.allowed, row.throttled, row.degraded)}</dd>
        </dl>
        {form}
        {(!row.revoked).then(|| view! { <RotateKey id=row.id.clone() csrf=csrf.to_string()/> })}
        <p class="muted">"Revoke on the keys page, with floodgate-cli key revoke or the admin API. Changes reach the edges within two cache TTLs."</p>
    }
}

/// A rotation: the overlap asked (a day by default), confirmed, and the new
/// secret shown once.
#[island]
fn RotateKey(id: String, csrf: String) -> impl IntoView {
    island_ready();
    let rotate = ServerAction::<RotateKeySecret>::new();
    let fields = &["overlap_seconds", "confirm_rotate"];
    view! {
        <ActionForm action=rotate attr:class="card" attr:id="rotate-key">
            <h2>"Rotate the secret"</h2>
            <input type="hidden" name="csrf" value=csrf/>
            <input type="hidden" name="id" value=id/>
            <label>"The replaced secret keeps working for (seconds, 0 to 2592000 = 30 days)" <input name="overlap_seconds" value="86400" inputmode="numeric"/>{field_error(val(rotate), "overlap_seconds")}</label>
            <details class="confirm-rotate">
                <summary>"Rotating…"</summary>
                <p>"A new secret is made and shown once. The current one keeps working until the overlap ends, then only the new one does: the key's clients must switch before then. Its limits and usage carry on (the same key id and buckets)."</p>
                <label><input type="checkbox" name="confirm_rotate" value="yes"/>" The clients will switch to the new secret within the overlap"</label>
                {field_error(val(rotate), "confirm_rotate")}
            </details>
            <button type="submit">"Rotate"</button>
        </ActionForm>
        {outcome(val(rotate), |_| None, fields)}
        {move || rotate.value().get().and_then(Result::ok).map(|k| new_secret(k, None, "/"))}
    }
}
