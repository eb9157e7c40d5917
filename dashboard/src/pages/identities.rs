//! The identities page: every identity some key holds (the operator's external id
//! of a customer), its keys, their usage together over the last hour (they share
//! the buckets of `identity` policies), and its override of their plans
//! (`identity_overrides`), set or removed here — validated, version-checked and
//! audited by the admin API's code.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{SessionResource, error_view, field_error, outcome, saved_message, val};
use crate::api::{DeleteIdentityOverride, SaveIdentityOverride, list_identities};
use crate::wire::IdentityRow;

#[component]
pub fn IdentitiesPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let identities = Resource::new(|| (), |_| list_identities());
    let save = ServerAction::<SaveIdentityOverride>::new();
    let delete = ServerAction::<DeleteIdentityOverride>::new();
    view! {
        <Title text="Floodgate — identities"/>
        <h1>"Identities"</h1>
        <p class="muted">"A customer's keys (production, staging, CI) share one identity: its override gives all of them a plan, or limits in place of the plan's. A key's own override (Policies) still comes first; edges apply a change within the cache TTL."</p>
        {outcome(val(save), saved_message, &["plan", "policies", "identity"])}
        {outcome(val(delete), saved_message, &[])}
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let (s, v) = match (session.await, identities.await) {
                    (Ok(s), Ok(v)) => (s, v),
                    (Err(e), _) | (_, Err(e)) => return error_view(e),
                };
                if v.identities.is_empty() {
                    return view! { <p class="banner" id="no-identities">"No key has an identity yet: give one with "
                        <code>"floodgate-cli key create --identity ID"</code> " or the admin API."</p> }.into_any();
                }
                v.identities.into_iter().map(|row| identity_card(row, &s.csrf, &v.plans, save, delete)).collect_view().into_any()
            })}
        </Suspense>
    }
}

/// One identity: its keys and usage, its override and the forms that change it.
fn identity_card(
    row: IdentityRow,
    csrf: &str,
    plans: &[String],
    save: ServerAction<SaveIdentityOverride>,
    delete: ServerAction<DeleteIdentityOverride>,
) -> impl IntoView + use<> {
    let current = match (&row.plan, &row.policies) {
        (None, None) => "none: each key's own plan".to_string(),
        (plan, policies) => format!(
            "plan {}, limits {}",
            plan.as_deref().unwrap_or("(each key's own)"),
            policies
                .as_ref()
                .map_or("(the plan's)".to_string(), |l| l.join(", "))
        ),
    };
    let has_override = row.plan.is_some() || row.policies.is_some();
    let (csrf, csrf2) = (csrf.to_string(), csrf.to_string());
    let (id, id2, id3) = (
        row.identity.clone(),
        row.identity.clone(),
        row.identity.clone(),
    );
    let list = row.policies.clone().unwrap_or_default().join(", ");
    let chosen = row.plan.clone().unwrap_or_default();
    let options = plans
        .iter()
        .map(|p| {
            let selected = *p == chosen;
            view! { <option value=p.clone() selected=selected>{p.clone()}</option> }
        })
        .collect_view();
    let keys = row.keys.into_iter().map(|k| view! {
        <tr><td><a href=format!("/keys/{}", k.id)><code>{k.id.clone()}</code></a></td><td>{k.label}</td><td>{k.plan}</td><td>{if k.revoked { "revoked" } else { "active" }}</td></tr>
    }).collect_view();
    view! {
        <section class="card" data-identity=id3>
            <h2><code>{row.identity.clone()}</code></h2>
            <p class="usage">{format!("Last hour, all its keys together: {} allowed, {} throttled, {} degraded", row.allowed, row.throttled, row.degraded)}</p>
            <table class="identity-keys"><thead><tr><th scope="col">"Key id"</th><th scope="col">"Label"</th><th scope="col">"Plan"</th><th scope="col">"Status"</th></tr></thead><tbody>{keys}</tbody></table>
            <p class="override">"Override: " {current}</p>
            <ActionForm action=save attr:class="override-form">
                <input type="hidden" name="csrf" value=csrf/>
                <input type="hidden" name="identity" value=id/>
                <label>"Plan" <select name="plan"><option value="">"(each key's own)"</option>{options}</select>{field_error(val(save), "plan")}</label>
                <label>"Limits (comma-separated; empty: the plan's)" <input name="policies" value=list/>{field_error(val(save), "policies")}</label>
                <button type="submit">"Save override"</button>
                {field_error(val(save), "identity")}
            </ActionForm>
            {has_override.then(|| view! {
                <ActionForm action=delete attr:class="delete-override">
                    <input type="hidden" name="csrf" value=csrf2/>
                    <input type="hidden" name="identity" value=id2/>
                    <button type="submit" class="danger">"Remove override"</button>
                </ActionForm>
            })}
        </section>
    }
}
