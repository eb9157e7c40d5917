//! Reading an admin API request: its body as text, its query parameters (only
//! those a call knows, whole numbers in range) and its `If-Match` version; each
//! refusal names the field, as the 400 answer does.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use floodgate_shared::adminapi::{DEFAULT_USAGE_MINUTES, MAX_USAGE_MINUTES};
use floodgate_shared::policy::PolicyError;

/// A request body as UTF-8 text.
pub(super) fn text(body: &Bytes) -> Result<&str, PolicyError> {
    std::str::from_utf8(body).map_err(|_| PolicyError::new("(document)", "is not UTF-8 JSON"))
}

/// Refuses a query parameter not in `known`, naming it.
pub(super) fn only_params(
    query: &HashMap<String, String>,
    known: &[&str],
) -> Result<(), PolicyError> {
    match query.keys().find(|k| !known.contains(&k.as_str())) {
        Some(other) => Err(PolicyError::new(
            other.as_str(),
            format!("is not a parameter of this call ({})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// The whole-number parameter `name`, 1 to `max` (`default` when absent).
pub(super) fn whole_param(
    query: &HashMap<String, String>,
    name: &str,
    default: i64,
    max: i64,
) -> Result<i64, PolicyError> {
    match query.get(name) {
        None => Ok(default),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                PolicyError::new(name, format!("must be a whole number from 1 to {max}"))
            }),
    }
}

/// The only parameter of a usage call: `minutes`, 1 to [`MAX_USAGE_MINUTES`]
/// ([`DEFAULT_USAGE_MINUTES`] when absent).
pub(super) fn minutes_param(query: &HashMap<String, String>) -> Result<i64, PolicyError> {
    only_params(query, &["minutes"])?;
    whole_param(query, "minutes", DEFAULT_USAGE_MINUTES, MAX_USAGE_MINUTES)
}

/// The version an `If-Match` names (`"v"`, `W/"v"` or `v`), if any.
pub(super) fn if_match(headers: &HeaderMap) -> Result<Option<String>, PolicyError> {
    let Some(v) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let v = v
        .to_str()
        .map_err(|_| PolicyError::new("If-Match", "must be a key's version"))?;
    let v = v.trim().trim_start_matches("W/").trim_matches('"');
    Ok(Some(v.to_string()))
}
