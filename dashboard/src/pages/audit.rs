//! The audit log: who changed what and when, each change's fields before → after.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{LocalTime, error_view};
use crate::api::audit_entries;
use crate::wire::AuditRow;

#[component]
pub fn AuditPage() -> impl IntoView {
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
