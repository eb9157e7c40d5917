//! The server functions: the dashboard's only API. Every one of them requires a
//! session (the guard refuses earlier, and each checks again); every mutation also
//! requires the session's CSRF token, and configuration changes name the version
//! they were based on.

use leptos::prelude::*;
use leptos::server_fn::ServerFnError;

use crate::model::{
    AuditEntry, ConfigView, CreatedKey, EffectiveRow, KeyRow, Saved, SessionInfo, Traffic,
};

#[cfg(feature = "ssr")]
mod ctx {
    use std::sync::Arc;

    use axum::http::StatusCode;
    use floodgate_shared::config::{ConfigSpec, EdgeConfig};
    use floodgate_shared::policy::PolicyError;
    use leptos::prelude::*;
    use leptos::server_fn::ServerFnError;

    use crate::model::{AuditEntry, Saved};
    use crate::server::{self, Core, DashError, Session};

    pub fn status(code: StatusCode) {
        if let Some(r) = use_context::<leptos_axum::ResponseOptions>() {
            r.set_status(code);
        }
    }

    pub fn fail(e: DashError) -> ServerFnError {
        if let DashError::Store(_) = e {
            status(StatusCode::SERVICE_UNAVAILABLE);
        }
        ServerFnError::new(e.to_string())
    }

    pub fn core() -> Result<Arc<Core>, ServerFnError> {
        use_context::<Arc<Core>>().ok_or_else(|| ServerFnError::new("the dashboard has no store"))
    }

    pub async fn session() -> Result<Session, ServerFnError> {
        match leptos_axum::extract::<axum::Extension<Session>>().await {
            Ok(axum::Extension(s)) => Ok(s),
            Err(_) => {
                status(StatusCode::UNAUTHORIZED);
                Err(ServerFnError::new("sign in first"))
            }
        }
    }

    /// A session whose CSRF token the form carried.
    pub async fn mutation(csrf: &str) -> Result<(Arc<Core>, Session), ServerFnError> {
        let s = session().await?;
        if !server::same_secret(&s.csrf, csrf) {
            status(StatusCode::FORBIDDEN);
            return Err(ServerFnError::new(
                "this form is stale (its CSRF token does not match your session); reload the page",
            ));
        }
        Ok((core()?, s))
    }

    pub fn now_secs() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
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
    ) -> Result<Saved, ServerFnError> {
        let (core, session) = mutation(csrf).await?;
        let (current, text) = server::load_config(&core.store).await.map_err(fail)?;
        if current != version {
            return Ok(conflict());
        }
        let mut spec = match text.as_deref().map(EdgeConfig::from_json) {
            Some(Ok(c)) => c.spec().clone(),
            Some(Err(e)) => {
                return Ok(Saved::Invalid {
                    field: "(stored configuration)".into(),
                    message: format!(
                        "the stored configuration is invalid ({e}); fix it with floodgate-cli"
                    ),
                });
            }
            None => ConfigSpec::default(),
        };
        let done = match edit(&mut spec) {
            Ok(d) => d,
            Err(e) => return Ok(Saved::invalid(e)),
        };
        let config = match EdgeConfig::new(spec) {
            Ok(c) => c,
            Err(e) => return Ok(on_form(e, &done.prefix)),
        };
        if text.as_deref() == Some(config.to_json().as_str()) {
            return Ok(Saved::Ok("No change".into()));
        }
        let record = entry(&session.user, action, target, done.before, done.after);
        match server::save_config(&core.store, version, &config, &record)
            .await
            .map_err(fail)?
        {
            Ok(_) => Ok(Saved::Ok(format!("Saved: {action} {target}"))),
            Err(_) => Ok(conflict()),
        }
    }

    /// An error of the whole configuration, on the field of the form that made
    /// the edit at `prefix`: `policies[3].quota.capacity` → `quota.capacity`,
    /// `plans.gold` → `name`, `plans.gold[0]` → `policies`.
    pub fn on_form(mut e: PolicyError, prefix: &str) -> Saved {
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
        Saved::invalid(e)
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

    pub fn conflict() -> Saved {
        Saved::Conflict(
            "Someone saved the configuration after you loaded it (see the audit log); nothing was \
             changed. Reload and apply your change again."
                .into(),
        )
    }
}

#[server(endpoint = "login")]
pub async fn login(username: String, password: String) -> Result<(), ServerFnError> {
    use axum::http::{HeaderValue, StatusCode, header};
    let core = ctx::core()?;
    let client = leptos_axum::extract::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .await
        .ok()
        .map(|c| c.0);
    match crate::server::sign_in(&core, &username, &password, client).await {
        Ok(token) => {
            let cookie = crate::server::session_cookie(Some(&token), core.secure_cookies);
            let r = expect_context::<leptos_axum::ResponseOptions>();
            r.insert_header(
                header::SET_COOKIE,
                HeaderValue::from_str(&cookie).expect("a cookie is a header value"),
            );
            leptos_axum::redirect("/");
            Ok(())
        }
        Err(e) => {
            ctx::status(match e {
                crate::server::DashError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
                _ if e.to_string().starts_with("Too many") => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::UNAUTHORIZED,
            });
            Err(ServerFnError::new(e.to_string()))
        }
    }
}

#[server(endpoint = "logout")]
pub async fn logout(csrf: String) -> Result<(), ServerFnError> {
    use axum::http::{HeaderValue, header};
    let (core, session) = ctx::mutation(&csrf).await?;
    crate::server::sign_out(&core, &session)
        .await
        .map_err(ctx::fail)?;
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
pub async fn current_session() -> Result<SessionInfo, ServerFnError> {
    let s = ctx::session().await?;
    Ok(SessionInfo {
        user: s.user,
        csrf: s.csrf,
    })
}

#[server(endpoint = "config")]
pub async fn get_config() -> Result<ConfigView, ServerFnError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let (version, text) = crate::server::load_config(&core.store)
        .await
        .map_err(ctx::fail)?;
    let spec = text
        .as_deref()
        .and_then(|t| floodgate_shared::config::EdgeConfig::from_json(t).ok())
        .map(|c| c.spec().clone());
    Ok(ConfigView { version, spec })
}

#[allow(clippy::too_many_arguments)]
#[server(endpoint = "save_policy")]
pub async fn save_policy(
    csrf: String,
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
    #[server(default)] preview: String,
) -> Result<Saved, ServerFnError> {
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
    };
    let spec = match form.to_spec() {
        Ok(s) => s,
        Err(e) => return Ok(Saved::invalid(e)),
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

/// Replays the edge's sample of recent requests against the current configuration
/// and against it with `spec` applied; nothing is saved.
#[cfg(feature = "ssr")]
async fn backtest(
    csrf: &str,
    spec: floodgate_shared::policy::PolicySpec,
    original: String,
) -> Result<Saved, ServerFnError> {
    use floodgate_shared::config::EdgeConfig;
    use floodgate_shared::simulate::{SampledRequest, replay};
    let (core, _) = ctx::mutation(csrf).await?;
    let (_, text) = crate::server::load_config(&core.store)
        .await
        .map_err(ctx::fail)?;
    let Some(current) = text.as_deref().and_then(|t| EdgeConfig::from_json(t).ok()) else {
        return Ok(Saved::Conflict(
            "no valid configuration is stored to compare with".into(),
        ));
    };
    let mut proposal = current.spec().clone();
    let prefix = match apply_policy(&mut proposal, spec, &original) {
        Ok(e) => e.prefix,
        Err(e) => return Ok(Saved::invalid(e)),
    };
    let proposal = match EdgeConfig::new(proposal) {
        Ok(c) => c,
        Err(e) => return Ok(ctx::on_form(e, &prefix)),
    };
    let mut sample: Vec<SampledRequest> = crate::server::sample(&core.store)
        .await
        .map_err(ctx::fail)?
        .iter()
        .filter_map(|e| SampledRequest::parse(e))
        .collect();
    sample.reverse(); // the list is newest first
    sample.sort_by_key(|r| r.at_ms); // edges flush independently
    let now = replay(&current, &sample);
    let then = replay(&proposal, &sample);
    let rows = then
        .iter()
        .map(|(route, p)| {
            let c = now.get(route).cloned().unwrap_or_default();
            crate::model::BacktestRow {
                route: route.clone(),
                requests: p.requests,
                throttled_now: c.throttled,
                throttled: p.throttled,
                keys: p.keys_throttled.len() as u64,
                keys_seen: sample
                    .iter()
                    .filter(|r| r.route.as_deref().unwrap_or("_") == route)
                    .map(|r| r.key_id.as_str())
                    .collect::<std::collections::BTreeSet<_>>()
                    .len() as u64,
                shadow: p.shadow_throttled,
            }
        })
        .collect();
    Ok(Saved::Preview {
        sampled: sample.len() as u64,
        rows,
    })
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
    csrf: String,
    version: String,
    name: String,
) -> Result<Saved, ServerFnError> {
    ctx::change_config(&csrf, &version, "delete policy", &name.clone(), move |c| {
        let i = c.policies.iter().position(|p| p.name == name);
        ctx::deleted(
            i.map(|i| c.policies.remove(i)),
            format!("no policy is named {name:?}"),
        )
    })
    .await
}

#[server(endpoint = "save_plan")]
pub async fn save_plan(
    csrf: String,
    version: String,
    original: String,
    name: String,
    policies: String,
) -> Result<Saved, ServerFnError> {
    use crate::model::{bounded, name_list};
    let name = match bounded("name", &name) {
        Ok(n) => n.to_string(),
        Err(e) => return Ok(Saved::invalid(e)),
    };
    let list = match name_list("policies", &policies) {
        Ok(l) => l,
        Err(e) => return Ok(Saved::invalid(e)),
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
    csrf: String,
    version: String,
    name: String,
) -> Result<Saved, ServerFnError> {
    ctx::change_config(&csrf, &version, "delete plan", &name.clone(), move |c| {
        ctx::deleted(c.plans.remove(&name), format!("no plan is named {name:?}"))
    })
    .await
}

#[server(endpoint = "save_route")]
pub async fn save_route(
    csrf: String,
    version: String,
    original: String,
    name: String,
    pattern: String,
    policies: String,
) -> Result<Saved, ServerFnError> {
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
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Ok(Saved::invalid(e)),
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
    csrf: String,
    version: String,
    name: String,
) -> Result<Saved, ServerFnError> {
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
    csrf: String,
    version: String,
    key_id: String,
    policies: String,
) -> Result<Saved, ServerFnError> {
    use crate::model::{bounded, name_list};
    let (key_id, list) = match (bounded("key_id", &key_id), name_list("policies", &policies)) {
        (Ok(k), Ok(l)) => (k.to_string(), l),
        (Err(e), _) | (_, Err(e)) => return Ok(Saved::invalid(e)),
    };
    if let Err(e) = floodgate_shared::keys::validate_key_id(&key_id) {
        return Ok(Saved::Invalid {
            field: "key_id".into(),
            message: e.message,
        });
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
    csrf: String,
    version: String,
    key_id: String,
) -> Result<Saved, ServerFnError> {
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
    csrf: String,
    version: String,
    policies: String,
) -> Result<Saved, ServerFnError> {
    let list = match crate::model::name_list("policies", &policies) {
        Ok(l) => l,
        Err(e) => return Ok(Saved::invalid(e)),
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
    csrf: String,
    version: String,
    #[server(default)] ietf: String,
    retry_jitter_secs: String,
) -> Result<Saved, ServerFnError> {
    let jitter = match crate::model::bounded("headers.retry_jitter_secs", &retry_jitter_secs) {
        Ok("") => 0,
        Ok(t) => match t.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                return Ok(Saved::Invalid {
                    field: "headers.retry_jitter_secs".into(),
                    message: "must be a whole number of seconds (0-60)".into(),
                });
            }
        },
        Err(e) => return Ok(Saved::invalid(e)),
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

/// The policies a request by `key_id` to `path` is checked against.
#[server(endpoint = "effective")]
pub async fn effective_limits(
    key_id: String,
    path: String,
) -> Result<Vec<EffectiveRow>, ServerFnError> {
    use floodgate_shared::config::EdgeConfig;
    ctx::session().await?;
    let core = ctx::core()?;
    let key_id =
        crate::model::bounded("key_id", &key_id).map_err(|e| ServerFnError::new(e.to_string()))?;
    let path =
        crate::model::bounded("path", &path).map_err(|e| ServerFnError::new(e.to_string()))?;
    let keys = floodgate_edge::admin::list_keys(&core.store)
        .await
        .map_err(|e| ServerFnError::new(e.to_string()))?;
    let record = keys
        .iter()
        .find(|k| k.id == key_id)
        .ok_or_else(|| ServerFnError::new(format!("no key has the id {key_id:?}")))?;
    let (_, text) = crate::server::load_config(&core.store)
        .await
        .map_err(ctx::fail)?;
    let config = text
        .as_deref()
        .map(EdgeConfig::from_json)
        .ok_or_else(|| ServerFnError::new("no configuration is stored"))?
        .map_err(|e| ServerFnError::new(e.to_string()))?;
    let route = config
        .routes()
        .resolve(if path.is_empty() { "/" } else { path })
        .cloned();
    let rows = config
        .applicable(&record.id, &record.plan, route.as_ref(), true)
        .ok_or_else(|| {
            ServerFnError::new(format!(
                "the key's plan {:?} is not configured",
                record.plan
            ))
        })?
        .into_iter()
        .map(|(p, source)| {
            let spec: floodgate_shared::policy::PolicySpec =
                serde_json::from_str(&p.to_json()).expect("a policy's JSON is a spec");
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

#[server(endpoint = "keys")]
pub async fn list_keys() -> Result<Vec<KeyRow>, ServerFnError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let keys = floodgate_edge::admin::list_keys(&core.store)
        .await
        .map_err(|e| ServerFnError::new(e.to_string()))?;
    let minute = ctx::now_secs() / 60;
    let last_hour: Vec<i64> = (0..60).map(|i| minute - i).collect();
    let usage = crate::server::key_usage(
        &crate::server::stats_hashes(&core.store, &last_hour)
            .await
            .map_err(ctx::fail)?,
    );
    Ok(keys
        .into_iter()
        .map(|k| {
            let (allowed, throttled, degraded) = usage.get(&k.id).copied().unwrap_or_default();
            KeyRow {
                revoked: k.status == floodgate_shared::apikeys::KeyStatus::Revoked,
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
    csrf: String,
    label: String,
    plan: String,
) -> Result<(Saved, Option<CreatedKey>), ServerFnError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    if let Err(e) = check_key_fields(&core, &label, &plan).await? {
        return Ok((e, None));
    }
    let (record, secret) = match floodgate_edge::admin::create_key(
        &core.store,
        label.trim(),
        plan.trim(),
        ctx::now_secs(),
    )
    .await
    {
        Ok(r) => r,
        Err(floodgate_edge::admin::AdminError::Invalid(e)) => return Ok((Saved::invalid(e), None)),
        Err(e) => return Err(ServerFnError::new(e.to_string())),
    };
    crate::server::audit(
        &core.store,
        &ctx::entry(
            &session.user,
            "create key",
            &record.id,
            None,
            Some(record.to_json()),
        ),
    )
    .await
    .map_err(ctx::fail)?;
    Ok((
        Saved::Ok(format!("Created key {}", record.id)),
        Some(CreatedKey {
            id: record.id,
            secret,
        }),
    ))
}

/// Label ≤ 128 characters without control characters; the plan must be configured.
#[cfg(feature = "ssr")]
async fn check_key_fields(
    core: &crate::server::Core,
    label: &str,
    plan: &str,
) -> Result<Result<(), Saved>, ServerFnError> {
    let bad = |field: &str, message: String| {
        Ok(Err(Saved::Invalid {
            field: field.into(),
            message,
        }))
    };
    let label = label.trim();
    if label.chars().count() > 128 || label.chars().any(char::is_control) {
        return bad(
            "label",
            "must be at most 128 characters, without control characters".into(),
        );
    }
    let plan = plan.trim();
    let (_, text) = crate::server::load_config(&core.store)
        .await
        .map_err(ctx::fail)?;
    let config = text
        .as_deref()
        .and_then(|t| floodgate_shared::config::EdgeConfig::from_json(t).ok());
    match config {
        Some(c) if c.has_plan(plan) => Ok(Ok(())),
        Some(c) => {
            let plans: Vec<&str> = c.spec().plans.keys().map(String::as_str).collect();
            let shown: String = plan.chars().take(40).collect();
            bad(
                "plan",
                format!(
                    "no plan is named {shown:?}; configured: {}",
                    plans.join(", ")
                ),
            )
        }
        None => bad("plan", "no configuration is stored yet".into()),
    }
}

#[server(endpoint = "update_key")]
pub async fn update_key(
    csrf: String,
    id: String,
    label: String,
    plan: String,
) -> Result<Saved, ServerFnError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    if let Err(e) = check_key_fields(&core, &label, &plan).await? {
        return Ok(e);
    }
    let (label, plan) = (label.trim().to_string(), plan.trim().to_string());
    match floodgate_edge::admin::update_key(&core.store, id.trim(), |r| {
        r.owner = label;
        r.plan = plan;
    })
    .await
    {
        Ok((before, after)) => {
            crate::server::audit(
                &core.store,
                &ctx::entry(
                    &session.user,
                    "edit key",
                    &after.id,
                    Some(before.to_json()),
                    Some(after.to_json()),
                ),
            )
            .await
            .map_err(ctx::fail)?;
            Ok(Saved::Ok(format!("Saved key {}", after.id)))
        }
        Err(floodgate_edge::admin::AdminError::Invalid(e)) => Ok(Saved::invalid(e)),
        Err(e) => Ok(Saved::Invalid {
            field: "(form)".into(),
            message: e.to_string(),
        }),
    }
}

#[server(endpoint = "revoke_key")]
pub async fn revoke_key(csrf: String, id: String) -> Result<Saved, ServerFnError> {
    let (core, session) = ctx::mutation(&csrf).await?;
    match floodgate_edge::admin::revoke_key(&core.store, id.trim()).await {
        Ok(after) => {
            crate::server::audit(
                &core.store,
                &ctx::entry(
                    &session.user,
                    "revoke key",
                    &after.id,
                    None,
                    Some(after.to_json()),
                ),
            )
            .await
            .map_err(ctx::fail)?;
            Ok(Saved::Ok(format!("Revoked key {}", after.id)))
        }
        Err(e) => Ok(Saved::Invalid {
            field: "(form)".into(),
            message: e.to_string(),
        }),
    }
}

/// Per-minute counters of the last `minutes` minutes (at most a day).
#[server(endpoint = "traffic")]
pub async fn traffic_stats(minutes: u32) -> Result<Traffic, ServerFnError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let window = minutes.clamp(1, 24 * 60) as usize;
    crate::server::traffic(&core.store, ctx::now_secs() / 60, window)
        .await
        .map_err(ctx::fail)
}

#[server(endpoint = "audit")]
pub async fn audit_entries() -> Result<Vec<AuditEntry>, ServerFnError> {
    ctx::session().await?;
    let core = ctx::core()?;
    crate::server::audit_log(&core.store, 200)
        .await
        .map_err(ctx::fail)
}
