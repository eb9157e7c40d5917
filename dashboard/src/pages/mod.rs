//! The pages, one module each, and what their views share: how an error shows, a
//! form's outcome and field errors, times, and the hydration markers the browser
//! tests wait for. Pages are rendered whole on the server (`SsrMode::Async`: the
//! content is in the HTML, readable without JavaScript) as Leptos islands: only the
//! parts that move are hydrated (`#[island]`: the traffic charts' refresh, the
//! policy form with its backtest, the effective-limits tool, key creation with its
//! copy button, the keys table with live usage, local times), so the browser
//! bundle carries only them. Every form is an `ActionForm` over a server function:
//! a plain POST without the wasm (or outside an island), whose errors come back on
//! the page (Leptos carries them in the redirect); inside an island, a call that
//! reloads the page once saved.

mod audit;
mod identities;
mod keydetail;
mod keys;
mod limits;
mod login;
mod policies;
mod traffic;
mod traffic_charts;

pub use audit::AuditPage;
pub use identities::IdentitiesPage;
pub use keydetail::KeyDetailPage;
pub use keys::KeysPage;
pub use login::LoginPage;
pub use policies::PoliciesPage;
pub use traffic::TrafficPage;

use std::time::Duration;

use leptos::prelude::*;
use leptos::server_fn::client::Client;
use leptos::server_fn::codec::PostUrl;
use leptos::server_fn::request::ClientReq;
use leptos::server_fn::{Http, ServerFn};

use crate::error::AppError;
use crate::time;
use crate::wire::{Saved, SessionInfo};

/// The signed-in session, shared by a page's forms.
pub(crate) type SessionResource = Resource<Result<SessionInfo, AppError>>;

/// Sends the browser to sign-in (a session that ended); nothing on the server,
/// where the guard redirects before any page renders.
pub(crate) fn go_to_sign_in() {
    #[cfg(feature = "hydrate")]
    {
        let _ = window().location().set_href("/login?session=ended");
    }
}

/// An error where a page's content would be: a session that ended goes to sign-in,
/// an outage is a banner, anything else a message.
pub(crate) fn error_view(e: AppError) -> AnyView {
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

/// An action's latest answer, as a copyable signal.
pub(crate) fn val<S>(action: ServerAction<S>) -> Signal<Option<Result<S::Output, AppError>>>
where
    S: leptos::server_fn::ServerFn<Error = AppError> + Clone + Send + Sync + 'static,
    S::Output: Clone + Send + Sync + 'static,
{
    Signal::derive(move || action.value().get())
}

/// A form's outcome: the success message, or an error the form's own fields do
/// not show (those are next to their field, by [`field_error`]).
pub(crate) fn outcome<T: Clone + Send + Sync + 'static>(
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

pub(crate) fn field_error<T: Clone + Send + Sync + 'static>(
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

pub(crate) fn saved_message(s: &Saved) -> Option<String> {
    match s {
        Saved::Ok(m) => Some(m.clone()),
        Saved::Preview(_) => None,
    }
}

/// A signal that turns true once the page is hydrated (for what only the browser
/// knows, like its time zone), so server and browser render the same first.
pub(crate) fn hydrated() -> RwSignal<bool> {
    let done = RwSignal::new(false);
    Effect::new(move |_| done.set(true));
    done
}

/// Counts a hydrated island on `<body data-islands>` (the browser tests wait for
/// every `<leptos-island>` of a page to be counted).
pub(crate) fn island_ready() {
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
pub(crate) fn reload(path: &str) {
    #[cfg(feature = "hydrate")]
    {
        let _ = window().location().assign(path);
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = path;
}

/// Runs `f` every `every` in the browser (never on the server).
pub(crate) fn every(every: Duration, f: impl Fn() + Clone + 'static) {
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
pub(crate) fn when(secs: i64, ready: RwSignal<bool>) -> impl IntoView {
    view! {
        <time datetime=time::rfc3339(secs)>{time::utc(secs)}</time>
        {move || ready.get().then(|| time::local(secs)).flatten().map(|l| view! {
            <br/><span class="muted local">{format!("local {l}")}</span>
        })}
    }
}

/// [`when`] as an island of its own, for pages that are otherwise static.
#[island]
pub(crate) fn LocalTime(secs: i64) -> impl IntoView {
    island_ready();
    when(secs, hydrated())
}

pub(crate) fn hidden(csrf: &str, version: &str) -> impl IntoView + use<> {
    view! {
        <input type="hidden" name="csrf" value=csrf.to_string()/>
        <input type="hidden" name="version" value=version.to_string()/>
    }
}

/// A table row's actions on the policies page: `Edit`, a link to the row's form
/// filled in (`None`: a row that is only deleted), then `Delete`, a plain post of
/// `delete` with the row's `field` = `value` over the configuration `version`.
pub(crate) fn row_actions<S, P>(
    edit: Option<String>,
    delete: ServerAction<S>,
    (csrf, version): (&str, &str),
    field: &'static str,
    value: String,
) -> AnyView
where
    S: serde::de::DeserializeOwned
        + ServerFn<Protocol = Http<PostUrl, P>, Error = AppError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Output: Send + Sync + 'static,
    S::Client: Client<AppError>,
    <<S::Client as Client<AppError>>::Request as ClientReq<AppError>>::FormData:
        From<leptos::web_sys::FormData>,
    P: 'static,
{
    let (csrf, version) = (csrf.to_string(), version.to_string());
    let form = view! {
        <ActionForm action=delete attr:style="display:inline">
            {hidden(&csrf, &version)}
            <input type="hidden" name=field value=value/>
            <button type="submit" class="danger">"Delete"</button>
        </ActionForm>
    };
    match edit {
        Some(href) => view! { <td><a class="edit" href=href>"Edit"</a> " " {form}</td> }.into_any(),
        None => view! { <td>{form}</td> }.into_any(),
    }
}
