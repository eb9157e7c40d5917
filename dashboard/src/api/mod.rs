//! The server functions: the dashboard's only API. Every one of them requires a
//! session (the guard refuses earlier, and each checks again); every mutation also
//! requires the session's CSRF token, and configuration changes name the version
//! they were based on. They fail with [`AppError`], whose HTTP status the guard
//! sets, so the pages' code can tell a session that ended from an outage. Each
//! takes its form as the page names the fields ([`crate::forms`]), and calls
//! `floodgate_edge::admin` (configuration, keys, audit) or [`crate::stats::store`]
//! directly.

mod audit;
#[cfg(feature = "ssr")]
mod backtest;
mod config;
mod identities;
mod keydetail;
mod keys;
mod session;
mod stats;

pub use audit::*;
pub use config::*;
pub use identities::*;
pub use keydetail::*;
pub use keys::*;
pub use session::*;
pub use stats::*;

#[cfg(feature = "ssr")]
mod ctx {
    use std::sync::Arc;

    use floodgate_edge::admin::{self, AdminError};
    use floodgate_edge::store::StoreError;
    use floodgate_shared::audit::SaveOutcome;
    use floodgate_shared::config::{ConfigEdit, ConfigSpec, EdgeConfig};
    use floodgate_shared::policy::PolicyError;
    use leptos::prelude::*;

    use crate::auth::{Session, same_secret};
    use crate::error::AppError;
    use crate::state::Core;
    use crate::wire::{AuditEntry, Saved};

    impl From<AdminError> for AppError {
        fn from(e: AdminError) -> Self {
            match e {
                AdminError::Invalid(e) => AppError::from_policy(e, None),
                AdminError::Store(e) => AppError::from(e),
                AdminError::NotFound(m) => AppError::invalid("id", m),
                e @ (AdminError::Conflict { .. }
                | AdminError::Unversioned { .. }
                | AdminError::KeyConflict { .. }) => AppError::Conflict(e.to_string()),
            }
        }
    }

    impl From<StoreError> for AppError {
        fn from(e: StoreError) -> Self {
            AppError::Unavailable(e.to_string())
        }
    }

    pub fn core() -> Result<Arc<Core>, AppError> {
        use_context::<Arc<Core>>()
            .ok_or_else(|| AppError::Internal("the dashboard has no store".into()))
    }

    pub async fn session() -> Result<Session, AppError> {
        match leptos_axum::extract::<axum::Extension<Session>>().await {
            Ok(axum::Extension(s)) => Ok(s),
            Err(_) => Err(AppError::SignedOut),
        }
    }

    /// A session whose CSRF token the form carried.
    pub async fn mutation(csrf: &str) -> Result<(Arc<Core>, Session), AppError> {
        let s = session().await?;
        if csrf.is_empty() {
            return Err(AppError::Forbidden(
                "this form carries no CSRF token (the csrf field); reload the page and submit it \
                 again"
                    .into(),
            ));
        }
        if !same_secret(&s.csrf, csrf) {
            return Err(AppError::Forbidden(
                "this form is stale (its CSRF token does not match your session); reload the page"
                    .into(),
            ));
        }
        Ok((core()?, s))
    }

    /// Whether the request is a plain HTML form post (no JavaScript): its answer
    /// is a redirect back to the page, which carries errors but not values.
    pub fn plain_form_post() -> bool {
        use_context::<axum::http::request::Parts>().is_some_and(|p| {
            p.headers
                .get(axum::http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("text/html"))
        })
    }

    pub fn now_secs() -> i64 {
        crate::time::now_secs()
    }

    pub fn entry(
        user: &str,
        action: &str,
        target: &str,
        before: Option<String>,
        after: Option<String>,
    ) -> AuditEntry {
        AuditEntry {
            at: now_secs(),
            user: user.to_string(),
            action: action.to_string(),
            target: admin::audit_item(target),
            before: before.map(|b| admin::audit_item(&b)),
            after: after.map(|a| admin::audit_item(&a)),
        }
    }

    /// Appends the audit record of a key operation (`before` is `None` for a key
    /// just created).
    pub async fn audit_key(
        core: &Core,
        session: &Session,
        action: &str,
        before: Option<&floodgate_shared::apikeys::KeyRecord>,
        after: &floodgate_shared::apikeys::KeyRecord,
    ) -> Result<(), AppError> {
        let record = entry(
            &session.user,
            action,
            &after.id,
            before.map(|b| b.to_json()),
            Some(after.to_json()),
        );
        Ok(admin::audit(&core.store, &record).await?)
    }

    /// The stored configuration, if one is stored and valid (pages and tools that
    /// only read it).
    pub async fn stored_config(core: &Core) -> Result<Option<EdgeConfig>, AppError> {
        let (_, text) = admin::load_config(&core.store).await?;
        Ok(text.as_deref().and_then(|t| EdgeConfig::from_json(t).ok()))
    }

    /// The spec to edit: the stored one, or an empty one when none is stored; a
    /// stored one that does not parse is refused (fix it with the CLI).
    fn editable(text: Option<&str>) -> Result<ConfigSpec, AppError> {
        match text.map(EdgeConfig::from_json) {
            Some(Ok(c)) => Ok(c.spec().clone()),
            Some(Err(e)) => Err(AppError::invalid(
                "(stored configuration)",
                format!("is invalid ({e}); fix it with floodgate-cli"),
            )),
            None => Ok(ConfigSpec::default()),
        }
    }

    /// Applies `edit` to the stored configuration if it is still `version`,
    /// validates the whole result with the edge's code, and saves it with its audit
    /// record atomically.
    pub async fn change_config(
        csrf: &str,
        version: &str,
        edit: ConfigEdit,
    ) -> Result<Saved, AppError> {
        let (core, session) = mutation(csrf).await?;
        let (current, text) = admin::load_config(&core.store).await?;
        if current != version {
            return Err(conflict());
        }
        let mut spec = editable(text.as_deref())?;
        let (action, target) = (edit.action(), edit.target());
        // an edit that cannot apply leaves the spec as it was
        let done = edit
            .apply(&mut spec)
            .map_err(|e| AppError::from_policy(e, Some(&spec)))?;
        let config = match EdgeConfig::new(spec.clone()) {
            Ok(c) => c,
            Err(e) => return Err(on_form(e, done.at.as_deref(), &spec)),
        };
        let stored = text.as_deref().and_then(|t| EdgeConfig::from_json(t).ok());
        let stored = stored.as_ref().map(EdgeConfig::spec);
        floodgate_edge::identities::check_new_identities(&core.store, stored, config.spec())
            .await
            .map_err(|e| match e {
                AdminError::Invalid(e) => on_form(e, done.at.as_deref(), config.spec()),
                e => e.into(),
            })?;
        if text.as_deref() == Some(config.to_json().as_str()) {
            return Ok(Saved::Ok("No change".into()));
        }
        let record = entry(&session.user, action, &target, done.before, done.after);
        match admin::save_config(&core.store, version, &config, &record).await? {
            SaveOutcome::Saved { .. } => Ok(Saved::Ok(format!("Saved: {action} {target}"))),
            SaveOutcome::Conflict { .. } => Err(conflict()),
        }
    }

    /// An error of the whole configuration `spec`, on the field of the form that
    /// made the edit at `at`: `policies[3].quota.capacity` → `quota.capacity`,
    /// `plans.gold` → `name`, `plans.gold[0]` → `policies`; its label names the
    /// item for operators (`Route "search", limits`).
    pub fn on_form(mut e: PolicyError, at: Option<&str>, spec: &ConfigSpec) -> AppError {
        let label = crate::describe::describe_field(&e.field, Some(spec));
        if let Some(rest) = at.and_then(|at| e.field.strip_prefix(at)) {
            let rest = rest.trim_start_matches('.');
            e.field = if rest.is_empty() {
                "name".to_string()
            } else if rest.starts_with('[') {
                "policies".to_string()
            } else {
                rest.to_string()
            };
        }
        match AppError::from_policy(e, Some(spec)) {
            AppError::Invalid { field, message, .. } => AppError::Invalid {
                field,
                label,
                message,
            },
            other => other,
        }
    }

    pub fn conflict() -> AppError {
        AppError::Conflict(
            "Someone saved the configuration after you loaded it (see the audit log); nothing was \
             changed. Reload and apply your change again."
                .into(),
        )
    }
}
