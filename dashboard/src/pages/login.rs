//! The sign-in page.

use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use super::error_view;
use crate::api::Login;

#[component]
pub fn LoginPage() -> impl IntoView {
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
