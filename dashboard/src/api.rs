//! The server functions: the dashboard's only API. Every one of them requires a
//! session (the guard refuses earlier, and each checks again); every mutation also
//! requires the session's CSRF token, and configuration changes name the version
//! they were based on. They fail with [`AppError`], whose HTTP status the guard
//! sets, so the pages' code can tell a session that ended from an outage.

use leptos::prelude::*;

use crate::model::{
    AppError, AuditRow, ConfigView, CreatedKey, EffectiveRow, KeyRow, LeasingFigures, Saved,
    SessionInfo, Traffic,
};

#[cfg(feature = "ssr")]
mod ctx {
    use std::sync::Arc;

    use floodgate_shared::config::{ConfigSpec, EdgeConfig};
    use floodgate_shared::policy::PolicyError;
    use leptos::prelude::*;

    use crate::model::{AppError, AuditEntry, Saved};
    use crate::server::{self, Core, Session};

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
        if !server::same_secret(&s.csrf, csrf) {
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
            target: server::audit_item(target),
            before: before.map(|b| server::audit_item(&b)),
            after: after.map(|a| server::audit_item(&a)),
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
        Ok(server::audit(&core.store, &record).await?)
    }

    pub fn json<T: serde::Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap_or_default()
    }

    /// What an edit of the configuration produced: the item before and after
    /// (for the audit log), and the field prefix its errors carry (stripped so
    /// they land next to the form's fields).
    pub struct Edit {
        pub before: Option<String>,
        pub after: Option<String>,
        pub prefix: String,
    }

    /// Applies `edit` to the stored configuration if it is still `version`,
    /// validates the whole result with the edge's code, and saves it with its audit
    /// record atomically.
    pub async fn change_config(
        csrf: &str,
        version: &str,
        action: &str,
        target: &str,
        edit: impl FnOnce(&mut ConfigSpec) -> Result<Edit, PolicyError>,
    ) -> Result<Saved, AppError> {
        let (core, session) = mutation(csrf).await?;
        let (current, text) = server::load_config(&core.store).await?;
        if current != version {
            return Err(conflict());
        }
        let mut spec = match text.as_deref().map(EdgeConfig::from_json) {
            Some(Ok(c)) => c.spec().clone(),
            Some(Err(e)) => {
                return Err(AppError::invalid(
                    "(stored configuration)",
                    format!("is invalid ({e}); fix it with floodgate-cli"),
                ));
            }
            None => ConfigSpec::default(),
        };
        let before_edit = spec.clone();
        let done = match edit(&mut spec) {
            Ok(d) => d,
            Err(e) => return Err(AppError::from_policy(e, Some(&before_edit))),
        };
        let config = match EdgeConfig::new(spec.clone()) {
            Ok(c) => c,
            Err(e) => return Err(on_form(e, &done.prefix, &spec)),
        };
        if text.as_deref() == Some(config.to_json().as_str()) {
            return Ok(Saved::Ok("No change".into()));
        }
        let record = entry(&session.user, action, target, done.before, done.after);
        match server::save_config(&core.store, version, &config, &record).await? {
            server::SaveOutcome::Saved { .. } => Ok(Saved::Ok(format!("Saved: {action} {target}"))),
            server::SaveOutcome::Conflict { .. } => Err(conflict()),
        }
    }

    /// An error of the whole configuration `spec`, on the field of the form that
    /// made the edit at `prefix`: `policies[3].quota.capacity` → `quota.capacity`,
    /// `plans.gold` → `name`, `plans.gold[0]` → `policies`; its label names the
    /// item for operators (`Route "search", limits`).
    pub fn on_form(mut e: PolicyError, prefix: &str, spec: &ConfigSpec) -> AppError {
        let label = crate::describe::describe_field(&e.field, Some(spec));
        if let Some(rest) = e.field.strip_prefix(prefix) {
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

    /// The edit of a deletion: the item removed, or an error naming what is missing.
    pub fn deleted<T: serde::Serialize>(
        removed: Option<T>,
        missing: String,
    ) -> Result<Edit, PolicyError> {
        let removed = removed.ok_or_else(|| PolicyError::new("(form)", missing))?;
        Ok(Edit {
            before: Some(json(&removed)),
            after: None,
            prefix: "(none)".into(),
        })
    }

    pub fn conflict() -> AppError {
        AppError::Conflict(
            "Someone saved the configuration after you loaded it (see the audit log); nothing was \
             changed. Reload and apply your change again."
                .into(),
        )
    }
}

#[server(endpoint = "login")]
pub async fn login(username: String, password: String) -> Result<(), AppError> {
    use axum::http::{HeaderValue, header};
    let core = ctx::core()?;
    let parts = use_context::<axum::http::request::Parts>()
        .ok_or_else(|| AppError::Internal("no request".into()))?;
    let client = crate::server::request_client(&core, &parts);
    let device = crate::server::device_token(&parts.headers);
    let signed = crate::server::sign_in(&core, &username, &password, client, device).await?;
    let r = expect_context::<leptos_axum::ResponseOptions>();
    for cookie in [
        crate::server::session_cookie(Some(&signed.session), core.secure_cookies),
        crate::server::device_cookie(&signed.device, core.secure_cookies),
    ] {
        r.append_header(
            header::SET_COOKIE,
            HeaderValue::from_str(&cookie).expect("a cookie is a header value"),
        );
    }
    leptos_axum::redirect("/");
    Ok(())
}

#[server(endpoint = "logout")]
pub async fn logout(#[server(default)] csrf: String) -> Result<(), AppError> {
    use axum::http::{HeaderValue, header};
    let (core, session) = ctx::mutation(&csrf).await?;
    crate::server::sign_out(&core, &session).await?;
    let r = expect_context::<leptos_axum::ResponseOptions>();
    r.insert_header(
        header::SET_COOKIE,
        HeaderValue::from_str(&crate::server::session_cookie(None, core.secure_cookies))
            .expect("a cookie is a header value"),
    );
    leptos_axum::redirect("/login");
    Ok(())
}

#[server(endpoint = "session")]
pub async fn current_session() -> Result<SessionInfo, AppError> {
    let s = ctx::session().await?;
    Ok(SessionInfo {
        user: s.user,
        csrf: s.csrf,
    })
}

#[server(endpoint = "config")]
pub async fn get_config() -> Result<ConfigView, AppError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let (version, text) = crate::server::load_config(&core.store).await?;
    let spec = text
        .as_deref()
        .and_then(|t| floodgate_shared::config::EdgeConfig::from_json(t).ok())
        .map(|c| c.spec().clone());
    Ok(ConfigView { version, spec })
}

#[allow(clippy::too_many_arguments)]
#[server(endpoint = "save_policy")]
pub async fn save_policy(
    #[server(default)] csrf: String,
    version: String,
    original: String,
    name: String,
    dimensions: String,
    capacity: String,
    period: String,
    refill: String,
    cost: String,
    failure_mode: String,
    #[server(default)] local_share_percent: String,
    #[server(default)] max_in_flight: String,
    #[server(default)] algorithm: String,
    #[server(default)] shadow: String,
    #[server(default)] consistency: String,
    #[server(default)] max_overshoot: String,
    #[server(default)] preview: String,
) -> Result<Saved, AppError> {
    let form = crate::model::PolicyForm {
        name,
        dimensions,
        capacity,
        period,
        refill,
        cost,
        failure_mode,
        local_share_percent,
        max_in_flight,
        algorithm,
        shadow: matches!(shadow.as_str(), "on" | "true" | "1"),
        consistency,
        max_overshoot,
    };
    let spec = match form.to_spec() {
        Ok(s) => s,
        Err(e) => return Err(AppError::from_policy(e, None)),
    };
    if preview == "1" {
        return backtest(&csrf, spec, original).await;
    }
    let target = spec.name.clone();
    let action = if original.is_empty() {
        "create policy"
    } else {
        "edit policy"
    };
    ctx::change_config(&csrf, &version, action, &target, move |c| {
        apply_policy(c, spec, &original)
    })
    .await
}

/// Puts `spec` into the configuration: a new policy when `original` is empty,
/// else in place of the policy named `original` (renamed everywhere).
#[cfg(feature = "ssr")]
fn apply_policy(
    c: &mut floodgate_shared::config::ConfigSpec,
    spec: floodgate_shared::policy::PolicySpec,
    original: &str,
) -> Result<ctx::Edit, floodgate_shared::policy::PolicyError> {
    let after = Some(ctx::json(&spec));
    if original.is_empty() {
        if c.policies.iter().any(|p| p.name == spec.name) {
            return Err(floodgate_shared::policy::PolicyError::new(
                "name",
                format!("a policy named {:?} exists already", spec.name),
            ));
        }
        c.policies.push(spec);
        Ok(ctx::Edit {
            before: None,
            after,
            prefix: format!("policies[{}]", c.policies.len() - 1),
        })
    } else {
        let i = c
            .policies
            .iter()
            .position(|p| p.name == original)
            .ok_or_else(|| {
                floodgate_shared::policy::PolicyError::new(
                    "(form)",
                    format!("no policy is named {original:?} any more"),
                )
            })?;
        let before = Some(ctx::json(&c.policies[i]));
        let renamed = spec.name != original;
        let new_name = spec.name.clone();
        c.policies[i] = spec;
        if renamed {
            rename_policy(c, original, &new_name);
        }
        Ok(ctx::Edit {
            before,
            after,
            prefix: format!("policies[{i}]"),
        })
    }
}

/// Replays the edge's sample of recent decisions against the current configuration
/// and against it with `spec` applied; nothing is saved. Beside the replays it
/// reports what the edge answered those requests, and what the replay cannot see:
/// decisions missing from the sample, degraded ones, policies keyed by address.
#[cfg(feature = "ssr")]
async fn backtest(
    csrf: &str,
    spec: floodgate_shared::policy::PolicySpec,
    original: String,
) -> Result<Saved, AppError> {
    use std::collections::{BTreeMap, BTreeSet};

    use floodgate_shared::config::EdgeConfig;
    use floodgate_shared::policy::Dimension;
    use floodgate_shared::simulate::replay;
    use floodgate_shared::stats::{Endpoint, Outcome};

    use crate::model::{Backtest, BacktestRow};
    let (core, _) = ctx::mutation(csrf).await?;
    let (_, text) = crate::server::load_config(&core.store).await?;
    let Some(current) = text.as_deref().and_then(|t| EdgeConfig::from_json(t).ok()) else {
        return Err(AppError::Conflict(
            "no valid configuration is stored to compare with".into(),
        ));
    };
    let mut proposal = current.spec().clone();
    let prefix = apply_policy(&mut proposal, spec, &original)
        .map_err(|e| AppError::from_policy(e, Some(current.spec())))?
        .prefix;
    let proposal_spec = proposal.clone();
    let proposal =
        EdgeConfig::new(proposal).map_err(|e| ctx::on_form(e, &prefix, &proposal_spec))?;
    let sample = crate::server::sample(&core.store).await?;
    let (from_ms, to_ms) = match (sample.first(), sample.last()) {
        (Some(f), Some(l)) => (f.at_ms, l.at_ms),
        _ => (0, 0),
    };
    let dropped = if sample.is_empty() {
        0
    } else {
        crate::server::sample_dropped(&core.store, from_ms, to_ms).await?
    };
    let now = replay(&current, &sample);
    let then = replay(&proposal, &sample);
    // what the edge answered, grouped as the replay groups (a route that is gone
    // counts as unmatched)
    let grouped = |e: &Endpoint| match e.route() {
        Some(r) if current.routes().routes().iter().any(|x| x.name == r) => e.clone(),
        _ => Endpoint::Unmatched,
    };
    let mut observed: BTreeMap<Endpoint, u64> = BTreeMap::new();
    let mut seen: BTreeMap<Endpoint, BTreeSet<&str>> = BTreeMap::new();
    for r in &sample {
        let e = grouped(&r.endpoint);
        *observed.entry(e.clone()).or_default() += u64::from(r.outcome == Outcome::Throttled);
        seen.entry(e).or_default().insert(&r.key_id);
    }
    let rows = then
        .iter()
        .map(|(endpoint, p)| {
            let c = now.get(endpoint).cloned().unwrap_or_default();
            BacktestRow {
                endpoint: endpoint.clone(),
                requests: p.requests,
                observed: observed.get(endpoint).copied().unwrap_or(0),
                throttled_now: c.throttled,
                throttled: p.throttled,
                keys: p.keys_throttled.len() as u64,
                keys_seen: seen.get(endpoint).map_or(0, |s| s.len() as u64),
                shadow: p.shadow_throttled,
            }
        })
        .collect();
    let ip_policies = current
        .spec()
        .policies
        .iter()
        .chain(&proposal_spec.policies)
        .filter(|p| p.dimensions.contains(&Dimension::ClientIp))
        .map(|p| p.name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok(Saved::Preview(Backtest {
        sampled: sample.len() as u64,
        from_ms,
        to_ms,
        dropped,
        degraded: sample
            .iter()
            .filter(|r| r.outcome == Outcome::Degraded)
            .count() as u64,
        ip_policies,
        rows,
        patterns: crate::server::patterns(current.spec()),
    }))
}

/// Renames a policy everywhere the configuration refers to it.
#[cfg(feature = "ssr")]
fn rename_policy(c: &mut floodgate_shared::config::ConfigSpec, from: &str, to: &str) {
    let fix = |names: &mut Vec<String>| {
        for n in names.iter_mut().filter(|n| *n == from) {
            *n = to.to_string();
        }
    };
    c.plans.values_mut().for_each(fix);
    c.key_overrides.values_mut().for_each(fix);
    c.routes.iter_mut().for_each(|r| fix(&mut r.policies));
    fix(&mut c.ip_policies);
}

#[server(endpoint = "delete_policy")]
pub async fn delete_policy(
    #[server(default)] csrf: String,
    version: String,
    name: String,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, "delete policy", &name.clone(), move |c| {
        if let Some(field) = policy_user(c, &name) {
            return Err(floodgate_shared::policy::PolicyError::new(
                field,
                format!("still uses the limit {name:?}: take it out there first"),
            ));
        }
        let i = c.policies.iter().position(|p| p.name == name);
        ctx::deleted(
            i.map(|i| c.policies.remove(i)),
            format!("no policy is named {name:?}"),
        )
    })
    .await
}

/// The first place that uses policy `name`, as a validation error names it
/// (`plans.free[0]`, `routes[1].policies[0]`, ...).
#[cfg(feature = "ssr")]
fn policy_user(c: &floodgate_shared::config::ConfigSpec, name: &str) -> Option<String> {
    let at = |list: &[String]| list.iter().position(|n| n == name);
    let lists = c
        .plans
        .iter()
        .map(|(p, l)| (format!("plans.{p}"), l))
        .chain(
            c.routes
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("routes[{i}].policies"), &r.policies)),
        )
        .chain(
            c.key_overrides
                .iter()
                .map(|(k, l)| (format!("key_overrides.{k}"), l)),
        )
        .chain(std::iter::once(("ip_policies".to_string(), &c.ip_policies)));
    for (field, list) in lists {
        if let Some(j) = at(list) {
            return Some(format!("{field}[{j}]"));
        }
    }
    None
}

#[server(endpoint = "save_plan")]
pub async fn save_plan(
    #[server(default)] csrf: String,
    version: String,
    original: String,
    name: String,
    policies: String,
) -> Result<Saved, AppError> {
    use crate::model::{bounded, name_list};
    let name = match bounded("name", &name) {
        Ok(n) => n.to_string(),
        Err(e) => return Err(AppError::from_policy(e, None)),
    };
    let list = match name_list("policies", &policies) {
        Ok(l) => l,
        Err(e) => return Err(AppError::from_policy(e, None)),
    };
    let action = if original.is_empty() {
        "create plan"
    } else {
        "edit plan"
    };
    ctx::change_config(&csrf, &version, action, &name.clone(), move |c| {
        let before = if original.is_empty() {
            if c.plans.contains_key(&name) {
                return Err(floodgate_shared::policy::PolicyError::new(
                    "name",
                    format!("a plan named {name:?} exists already"),
                ));
            }
            None
        } else {
            c.plans.remove(&original).map(|p| ctx::json(&p))
        };
        c.plans.insert(name.clone(), list.clone());
        Ok(ctx::Edit {
            before,
            after: Some(ctx::json(&list)),
            prefix: format!("plans.{name}"),
        })
    })
    .await
}

#[server(endpoint = "delete_plan")]
pub async fn delete_plan(
    #[server(default)] csrf: String,
    version: String,
    name: String,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, "delete plan", &name.clone(), move |c| {
        ctx::deleted(c.plans.remove(&name), format!("no plan is named {name:?}"))
    })
    .await
}

#[server(endpoint = "save_route")]
pub async fn save_route(
    #[server(default)] csrf: String,
    version: String,
    original: String,
    name: String,
    pattern: String,
    policies: String,
) -> Result<Saved, AppError> {
    use crate::model::{bounded, name_list};
    use floodgate_shared::config::RouteSpec;
    let route = match (
        bounded("name", &name),
        bounded("pattern", &pattern),
        name_list("policies", &policies),
    ) {
        (Ok(n), Ok(p), Ok(l)) => RouteSpec {
            name: n.to_string(),
            pattern: p.to_string(),
            policies: l,
        },
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return Err(AppError::from_policy(e, None));
        }
    };
    let action = if original.is_empty() {
        "create route"
    } else {
        "edit route"
    };
    ctx::change_config(&csrf, &version, action, &route.name.clone(), move |c| {
        let after = Some(ctx::json(&route));
        let (i, before) = if original.is_empty() {
            if c.routes.iter().any(|r| r.name == route.name) {
                return Err(floodgate_shared::policy::PolicyError::new(
                    "name",
                    format!("a route named {:?} exists already", route.name),
                ));
            }
            c.routes.push(route);
            (c.routes.len() - 1, None)
        } else {
            let i = c
                .routes
                .iter()
                .position(|r| r.name == original)
                .ok_or_else(|| {
                    floodgate_shared::policy::PolicyError::new(
                        "(form)",
                        format!("no route is named {original:?} any more"),
                    )
                })?;
            let before = Some(ctx::json(&c.routes[i]));
            c.routes[i] = route;
            (i, before)
        };
        Ok(ctx::Edit {
            before,
            after,
            prefix: format!("routes[{i}]"),
        })
    })
    .await
}

#[server(endpoint = "delete_route")]
pub async fn delete_route(
    #[server(default)] csrf: String,
    version: String,
    name: String,
) -> Result<Saved, AppError> {
    ctx::change_config(&csrf, &version, "delete route", &name.clone(), move |c| {
        let i = c.routes.iter().position(|r| r.name == name);
        ctx::deleted(
            i.map(|i| c.routes.remove(i)),
            format!("no route is named {name:?}"),
        )
    })
    .await
}

#[server(endpoint = "save_override")]
pub async fn save_override(
    #[server(default)] csrf: String,
    version: String,
    key_id: String,
    policies: String,
) -> Result<Saved, AppError> {
    use crate::model::{bounded, name_list};
    let (key_id, list) = match (bounded("key_id", &key_id), name_list("policies", &policies)) {
        (Ok(k), Ok(l)) => (k.to_string(), l),
        (Err(e), _) | (_, Err(e)) => return Err(AppError::from_policy(e, None)),
    };
    if let Err(e) = floodgate_shared::keys::validate_key_id(&key_id) {
        return Err(AppError::invalid("key_id", e.message));
    }
    ctx::change_config(
        &csrf,
        &version,
        "set key override",
        &key_id.clone(),
        move |c| {
            let before = c
                .key_overrides
                .insert(key_id.clone(), list.clone())
                .map(|b| ctx::json(&b));
            Ok(ctx::Edit {
                before,
                after: Some(ctx::json(&list)),
                prefix: format!("key_overrides.{key_id}"),
            })
        },
    )
    .await
}

#[server(endpoint = "delete_override")]
pub async fn delete_override(
    #[server(default)] csrf: String,
    version: String,
    key_id: String,
) -> Result<Saved, AppError> {
    ctx::change_config(
        &csrf,
        &version,
        "delete key override",
        &key_id.clone(),
        move |c| {
            let removed = c.key_overrides.remove(&key_id);
            ctx::deleted(removed, format!("no override for key {key_id:?}"))
        },
    )
    .await
}

#[server(endpoint = "save_ip_policies")]
pub async fn save_ip_policies(
    #[server(default)] csrf: String,
    version: String,
    policies: String,
) -> Result<Saved, AppError> {
    let list = match crate::model::name_list("policies", &policies) {
        Ok(l) => l,
        Err(e) => return Err(AppError::from_policy(e, None)),
    };
    ctx::change_config(
        &csrf,
        &version,
        "set IP policies",
        "ip_policies",
        move |c| {
            let before = Some(ctx::json(&c.ip_policies));
            c.ip_policies = list.clone();
            Ok(ctx::Edit {
                before,
                after: Some(ctx::json(&list)),
                prefix: "ip_policies".into(),
            })
        },
    )
    .await
}

/// The response header options: the IETF fields on or off, and the Retry-After
/// jitter (whole seconds, 0-60).
#[server(endpoint = "save_headers")]
pub async fn save_headers(
    #[server(default)] csrf: String,
    version: String,
    #[server(default)] ietf: String,
    retry_jitter_secs: String,
) -> Result<Saved, AppError> {
    let jitter = match crate::model::bounded("headers.retry_jitter_secs", &retry_jitter_secs) {
        Ok("") => 0,
        Ok(t) => match t.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                return Err(AppError::invalid(
                    "headers.retry_jitter_secs",
                    "must be a whole number of seconds (0-60)",
                ));
            }
        },
        Err(e) => return Err(AppError::from_policy(e, None)),
    };
    let headers = floodgate_shared::config::HeaderSpec {
        ietf: matches!(ietf.as_str(), "on" | "true" | "1"),
        retry_jitter_secs: jitter,
    };
    ctx::change_config(
        &csrf,
        &version,
        "set response headers",
        "headers",
        move |c| {
            let before = Some(ctx::json(&c.headers));
            c.headers = headers.clone();
            Ok(ctx::Edit {
                before,
                after: Some(ctx::json(&headers)),
                prefix: "(none)".into(),
            })
        },
    )
    .await
}

/// The deny lists, one entry per line each, saved together. An invalid entry is
/// refused on its list's field (`deny.ips`), naming the entry; nothing is saved.
#[server(endpoint = "save_deny")]
pub async fn save_deny(
    #[server(default)] csrf: String,
    version: String,
    #[server(default)] key_ids: String,
    #[server(default)] ips: String,
    #[server(default)] countries: String,
    #[server(default)] user_agents: String,
) -> Result<Saved, AppError> {
    use floodgate_shared::deny::{Deny, DenyList, DenySpec};
    let lines = |t: &str| -> Vec<String> {
        t.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    };
    let deny = DenySpec {
        key_ids: lines(&key_ids),
        ips: lines(&ips),
        countries: lines(&countries),
        user_agents: lines(&user_agents),
    };
    // each list is one field of the form: the error names the entry in its text
    if let Err(e) = Deny::new(&deny) {
        let list = DenyList::ALL
            .into_iter()
            .find(|l| e.field.starts_with(l.field()))
            .map_or("deny", DenyList::field);
        let entry = e.field[list.len()..]
            .trim_matches(['[', ']'])
            .parse::<usize>()
            .map(|i| format!("line {}: ", i + 1))
            .unwrap_or_default();
        return Err(AppError::invalid(list, format!("{entry}{}", e.message)));
    }
    ctx::change_config(&csrf, &version, "set deny lists", "deny", move |c| {
        let before = Some(ctx::json(&c.deny));
        c.deny = deny.clone();
        Ok(ctx::Edit {
            before,
            after: Some(ctx::json(&deny)),
            prefix: "(none)".into(),
        })
    })
    .await
}

/// The policies a request by `key_id` to `path` is checked against.
#[server(endpoint = "effective")]
pub async fn effective_limits(key_id: String, path: String) -> Result<Vec<EffectiveRow>, AppError> {
    use floodgate_shared::config::EdgeConfig;
    ctx::session().await?;
    let core = ctx::core()?;
    let invalid = |e| AppError::from_policy(e, None);
    let key_id = crate::model::bounded("key_id", &key_id).map_err(invalid)?;
    let path = crate::model::bounded("path", &path).map_err(invalid)?;
    let keys = floodgate_edge::admin::list_keys(&core.store).await?;
    let record = keys
        .iter()
        .find(|k| k.id == key_id)
        .ok_or_else(|| AppError::invalid("key_id", format!("no key has the id {key_id:?}")))?;
    let (_, text) = crate::server::load_config(&core.store).await?;
    let config = text
        .as_deref()
        .map(EdgeConfig::from_json)
        .ok_or_else(|| AppError::invalid("(form)", "no configuration is stored"))?
        .map_err(|e| AppError::invalid("(stored configuration)", e.to_string()))?;
    let route = config
        .routes()
        .resolve(if path.is_empty() { "/" } else { path })
        .cloned();
    let rows = config
        .applicable(&record.id, &record.plan, route.as_ref(), true)
        .ok_or_else(|| {
            AppError::invalid(
                "key_id",
                format!("the key's plan {:?} is not configured", record.plan),
            )
        })?
        .into_iter()
        .map(|(p, source)| {
            let spec = floodgate_shared::policy::PolicySpec::from(p);
            EffectiveRow {
                policy: p.name().to_string(),
                source,
                limit: crate::model::describe_quota(&spec),
                cost: p.cost(),
                failure_mode: crate::model::failure_mode_name(&spec),
            }
        })
        .collect();
    Ok(rows)
}

/// The keys with their usage over the last hour and their last use.
#[server(endpoint = "keys")]
pub async fn list_keys() -> Result<Vec<KeyRow>, AppError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let keys = floodgate_edge::admin::list_keys(&core.store).await?;
    let now = ctx::now_secs();
    let usage = crate::server::usage(&core.store, now, 60).await?;
    let last_used = crate::server::last_used(&core.store).await?;
    Ok(keys
        .into_iter()
        .map(|k| {
            let (allowed, throttled, degraded) = usage.get(&k.id).copied().unwrap_or_default();
            KeyRow {
                revoked: k.status == floodgate_shared::apikeys::KeyStatus::Revoked,
                last_used: last_used.get(&k.id).copied(),
                id: k.id,
                label: k.owner,
                plan: k.plan,
                created: k.created,
                allowed,
                throttled,
                degraded,
            }
        })
        .collect())
}

/// Creates a key on a configured plan; its secret is in the answer and nowhere else.
#[server(endpoint = "create_key")]
pub async fn create_key(
    #[server(default)] csrf: String,
    label: String,
    plan: String,
) -> Result<CreatedKey, AppError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    if ctx::plain_form_post() {
        // the answer would be lost in the redirect back to the page: refuse before
        // a key whose secret nobody saw exists
        return Err(AppError::BadRequest(
            "creating a key shows its secret once, on this page, which needs JavaScript: turn \
             it on, or use floodgate-cli"
                .into(),
        ));
    }
    check_key_fields(&core, &label, &plan).await?;
    let (record, secret) =
        floodgate_edge::admin::create_key(&core.store, label.trim(), plan.trim(), ctx::now_secs())
            .await?;
    ctx::audit_key(&core, &session, "create key", None, &record).await?;
    Ok(CreatedKey {
        id: record.id,
        secret,
    })
}

/// Label ≤ 128 characters without control characters; the plan must be configured.
#[cfg(feature = "ssr")]
async fn check_key_fields(
    core: &crate::server::Core,
    label: &str,
    plan: &str,
) -> Result<(), AppError> {
    let label = label.trim();
    if label.chars().count() > 128 || label.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "label",
            "must be at most 128 characters, without control characters",
        ));
    }
    let plan = plan.trim();
    let (_, text) = crate::server::load_config(&core.store).await?;
    let config = text
        .as_deref()
        .and_then(|t| floodgate_shared::config::EdgeConfig::from_json(t).ok());
    match config {
        Some(c) if c.has_plan(plan) => Ok(()),
        Some(c) => {
            let plans: Vec<&str> = c.spec().plans.keys().map(String::as_str).collect();
            let shown: String = plan.chars().take(40).collect();
            Err(AppError::invalid(
                "plan",
                format!(
                    "no plan is named {shown:?}; configured: {}",
                    plans.join(", ")
                ),
            ))
        }
        None => Err(AppError::invalid("plan", "no configuration is stored yet")),
    }
}

/// Changes a key's label and plan (a revoked key is read-only).
#[server(endpoint = "update_key")]
pub async fn update_key(
    #[server(default)] csrf: String,
    id: String,
    label: String,
    plan: String,
) -> Result<Saved, AppError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    check_key_fields(&core, &label, &plan).await?;
    let (label, plan) = (label.trim().to_string(), plan.trim().to_string());
    let (before, after) = floodgate_edge::admin::update_key(&core.store, id.trim(), |r| {
        r.owner = label;
        r.plan = plan;
    })
    .await?;
    ctx::audit_key(&core, &session, "edit key", Some(&before), &after).await?;
    Ok(Saved::Ok(format!("Saved key {}", after.id)))
}

/// Revokes a key: permanent, so the form must carry `confirm=yes` (the page asks
/// first).
#[server(endpoint = "revoke_key")]
pub async fn revoke_key(
    #[server(default)] csrf: String,
    id: String,
    #[server(default)] confirm: String,
) -> Result<Saved, AppError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    if confirm != "yes" {
        return Err(AppError::invalid(
            "confirm",
            "revoking a key cannot be undone: confirm it first",
        ));
    }
    let before = floodgate_edge::admin::key_by_id(&core.store, id.trim()).await?;
    if before.status == floodgate_shared::apikeys::KeyStatus::Revoked {
        return Err(AppError::invalid(
            "id",
            format!("key {} is revoked already", before.id),
        ));
    }
    let after = floodgate_edge::admin::revoke_key(&core.store, id.trim()).await?;
    ctx::audit_key(&core, &session, "revoke key", Some(&before), &after).await?;
    Ok(Saved::Ok(format!("Revoked key {}", after.id)))
}

/// The traffic page's data: `range` (`15m`, `1h`, `24h`) at `resolution` (`10s`,
/// `1m`, `10m`, `1h`; the range's default when absent or not offered).
#[server(endpoint = "traffic")]
pub async fn traffic_stats(
    #[server(default)] range: String,
    #[server(default)] resolution: String,
) -> Result<Traffic, AppError> {
    use crate::model::{Range, Resolution};
    ctx::session().await?;
    let core = ctx::core()?;
    let range = Range::parse(&range).unwrap_or(Range::Minutes15);
    let resolution = range.resolution(Resolution::parse(&resolution));
    let (_, text) = crate::server::load_config(&core.store).await?;
    let patterns = text
        .as_deref()
        .and_then(|t| floodgate_shared::config::EdgeConfig::from_json(t).ok())
        .map(|c| crate::server::patterns(c.spec()))
        .unwrap_or_default();
    Ok(crate::server::traffic(&core.store, ctx::now_secs(), range, resolution, patterns).await?)
}

/// The bounded and `auto` limits' figures over `range` (`15m`, `1h`, `24h`): the
/// share decided locally, the global calls saved, the overshoot budget in use.
#[server(endpoint = "leasing")]
pub async fn leasing_stats(#[server(default)] range: String) -> Result<LeasingFigures, AppError> {
    use crate::model::Range;
    ctx::session().await?;
    let core = ctx::core()?;
    let range = Range::parse(&range).unwrap_or(Range::Minutes15);
    let (_, text) = crate::server::load_config(&core.store).await?;
    let Some(config) = text
        .as_deref()
        .and_then(|t| floodgate_shared::config::EdgeConfig::from_json(t).ok())
    else {
        return Ok(LeasingFigures {
            policies: vec![],
            regions: 0,
        });
    };
    Ok(LeasingFigures {
        policies: crate::server::leasing(&core.store, ctx::now_secs(), range, &config).await?,
        regions: config.regions(),
    })
}

/// The newest 200 audit records, each with the fields its change touched.
#[server(endpoint = "audit")]
pub async fn audit_entries() -> Result<Vec<AuditRow>, AppError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let entries = crate::server::audit_log(&core.store, 200).await?;
    Ok(entries.into_iter().map(AuditRow::from).collect())
}
