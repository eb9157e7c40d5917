//! The shell of every page (head, style sheet, hydration scripts), the routes of
//! the pages ([`crate::pages`]) and the layout around them (the navigation, who
//! is signed in, sign-out).

use leptos::prelude::*;
use leptos_meta::{MetaTags, Title, provide_meta_context};
use leptos_router::SsrMode;
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::path;

use crate::api::{Logout, current_session};
use crate::pages::{
    AuditPage, IdentitiesPage, KeyDetailPage, KeysPage, LoginPage, PoliciesPage, SessionResource,
    TrafficPage,
};

/// The pages' style sheet (also the outage page's).
pub const STYLE: &str = include_str!("../assets/style.css");

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
                <Route path=path!("/keys/:id") view=|| view! { <Layout><KeyDetailPage/></Layout> } ssr=SsrMode::Async/>
                <Route path=path!("/identities") view=|| view! { <Layout><IdentitiesPage/></Layout> } ssr=SsrMode::Async/>
                <Route path=path!("/audit") view=|| view! { <Layout><AuditPage/></Layout> } ssr=SsrMode::Async/>
            </Routes>
        </Router>
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
            <A href="/identities">"Identities"</A>
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
