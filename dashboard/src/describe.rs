//! Words for operators (pure, tested natively): a validation error's field path as
//! the pages name it (`routes[0].policies[1]` → `Route "search", limits`), and an
//! audit record's before → after as a list of changed fields.

use floodgate_shared::config::ConfigSpec;
use serde_json::Value;

/// What the pages call a field of a policy, a route or the header options.
fn leaf_label(leaf: &str) -> String {
    let leaf = strip_index(leaf);
    match leaf {
        "" => "",
        "name" => "name",
        "dimensions" => "keyed by",
        "quota" => "quota",
        "quota.capacity" => "capacity",
        "quota.period" => "period",
        "quota.refill" => "refill",
        "cost" => "cost per request",
        "failure_mode" => "if Redis fails",
        "local_share_percent" => "local share %",
        "max_in_flight" => "max in flight",
        "algorithm" => "algorithm",
        "shadow" => "shadow",
        "consistency" => "consistency across edges",
        "max_overshoot" => "overshoot bound",
        "pattern" => "pattern",
        "policies" => "limits",
        "label" => "label",
        "plan" => "plan",
        "key_id" => "key id",
        "id" => "key id",
        "headers.retry_jitter_secs" | "retry_jitter_secs" => "Retry-After jitter",
        "headers.ietf" | "ietf" => "IETF fields",
        "confirm" => "confirmation",
        other => return other.replace('_', " "),
    }
    .to_string()
}

/// `policies[2]` → `policies`; anything without a trailing index is unchanged.
fn strip_index(s: &str) -> &str {
    match s
        .strip_suffix(']')
        .and_then(|t| t.rfind('[').map(|i| (t, i)))
    {
        Some((t, i)) if t[i + 1..].bytes().all(|b| b.is_ascii_digit()) => &t[..i],
        _ => s,
    }
}

/// `[3]` at the start of `rest` → (3, what follows it).
fn index(rest: &str) -> Option<(usize, &str)> {
    let inner = rest.strip_prefix('[')?;
    let end = inner.find(']')?;
    let i = inner[..end].parse().ok()?;
    Some((i, inner[end + 1..].trim_start_matches('.')))
}

fn with_leaf(what: String, leaf: &str) -> String {
    let leaf = leaf_label(leaf);
    if leaf.is_empty() {
        what
    } else {
        format!("{what}, {leaf}")
    }
}

/// The names of one list of a configuration (its policies, its routes).
type Names = fn(&ConfigSpec) -> Vec<&str>;

/// A validation error's field as an operator reads it; `spec` (the configuration
/// the error is about) turns list indexes into names.
pub fn describe_field(field: &str, spec: Option<&ConfigSpec>) -> String {
    let names = |list: Names, i: usize| spec.and_then(|s| list(s).get(i).map(|n| n.to_string()));
    let lists: [(&str, &str, Names); 2] = [
        ("policies", "Limit", |s| {
            s.policies.iter().map(|p| p.name.as_str()).collect()
        }),
        ("routes", "Route", |s| {
            s.routes.iter().map(|r| r.name.as_str()).collect()
        }),
    ];
    for (prefix, item, list) in lists {
        if let Some(rest) = field.strip_prefix(prefix) {
            let Some((i, leaf)) = index(rest) else {
                return format!("{item}s");
            };
            let what = match names(list, i) {
                Some(n) => format!("{item} {n:?}"),
                None => format!("{item} #{}", i + 1),
            };
            return with_leaf(what, leaf);
        }
    }
    if let Some(rest) = field.strip_prefix("plans.") {
        let plan = strip_index(rest);
        return if plan == rest {
            format!("Plan {plan:?}")
        } else {
            format!("Plan {plan:?}, limits")
        };
    }
    if let Some(rest) = field.strip_prefix("key_overrides.") {
        return format!("Override for key {:?}, limits", strip_index(rest));
    }
    if let Some(rest) = field.strip_prefix("identity_overrides.") {
        let rest = strip_index(rest);
        return match rest.rsplit_once('.') {
            Some((who, "plan")) => format!("Override for identity {who:?}, plan"),
            Some((who, "policies")) => format!("Override for identity {who:?}, limits"),
            _ => format!("Override for identity {rest:?}"),
        };
    }
    if field.starts_with("ip_policies") {
        return "Per client IP, limits".to_string();
    }
    match field {
        "plans" => "Plans".to_string(),
        "key_overrides" => "Per API key overrides".to_string(),
        "identity_overrides" => "Per identity overrides".to_string(),
        "(form)" | "(none)" | "" => "This form".to_string(),
        "(stored configuration)" => "The stored configuration".to_string(),
        other => {
            let mut l = leaf_label(other);
            if let Some(first) = l.get(..1) {
                l = first.to_uppercase() + &l[1..];
            }
            l
        }
    }
}

/// One field an audited change touched.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Change {
    /// `quota.capacity`, `policies`, `label`, ... (`` for a whole scalar item).
    pub path: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            if items.is_empty() {
                "(none)".to_string()
            } else {
                items.iter().map(scalar).collect::<Vec<_>>().join(", ")
            }
        }
        Value::Null => "(none)".to_string(),
        other => other.to_string(),
    }
}

/// `value` as (path, text) leaves; lists of plain values are one leaf.
fn leaves(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&p, v, out);
            }
        }
        Value::Array(items) if items.iter().any(|i| i.is_object() || i.is_array()) => {
            for (i, v) in items.iter().enumerate() {
                leaves(&format!("{prefix}[{i}]"), v, out);
            }
        }
        // times of records (a key's `created`) as people read them
        Value::Number(n) if prefix == "created" || prefix.ends_with(".created") => {
            let text = n.as_i64().map_or_else(|| n.to_string(), crate::time::utc);
            out.push((prefix.to_string(), text))
        }
        other => out.push((prefix.to_string(), scalar(other))),
    }
}

/// Policy fields the stored JSON omits at their default (`PolicySpec`'s
/// `skip_serializing_if`), so a change from the default reads `exact → bounded`.
const OMITTED_DEFAULTS: [(&str, &str); 3] = [
    ("consistency", "exact"),
    ("algorithm", "token_bucket"),
    ("shadow", "false"),
];

/// What changed between an audit record's `before` and `after` (JSON texts of the
/// item), field by field, in field order. `None` when either side is not JSON (an
/// item cut for the audit log): the page then shows the texts as they are.
pub fn diff(before: Option<&str>, after: Option<&str>) -> Option<Vec<Change>> {
    let parse = |t: Option<&str>| -> Option<Vec<(String, String)>> {
        match t {
            None => Some(vec![]),
            Some(t) => {
                let v: Value = serde_json::from_str(t).ok()?;
                let mut out = vec![];
                leaves("", &v, &mut out);
                Some(out)
            }
        }
    };
    let (mut b, mut a) = (parse(before)?, parse(after)?);
    if before.is_some() && after.is_some() {
        // a field the JSON leaves out at its default reads as that default
        for (path, default) in OMITTED_DEFAULTS {
            let has = |side: &[(String, String)]| side.iter().any(|(p, _)| p == path);
            let side = match (has(&b), has(&a)) {
                (false, true) => &mut b,
                (true, false) => &mut a,
                _ => continue,
            };
            side.push((path.to_string(), default.to_string()));
        }
    }
    let mut paths: Vec<&String> = b.iter().chain(&a).map(|(p, _)| p).collect();
    let mut seen = std::collections::BTreeSet::new();
    paths.retain(|p| seen.insert(*p));
    let find = |side: &[(String, String)], p: &str| {
        side.iter().find(|(q, _)| q == p).map(|(_, v)| v.clone())
    };
    Some(
        paths
            .into_iter()
            .filter_map(|p| {
                let (old, new) = (find(&b, p), find(&a, p));
                (old != new).then(|| Change {
                    path: p.clone(),
                    before: old,
                    after: new,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ConfigSpec {
        serde_json::from_str(
            r#"{"policies":[{"name":"default","dimensions":["api_key"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_closed"}],
                "plans":{"free":["default"]},
                "routes":[{"name":"search","pattern":"/v1/search","policies":["search"]}]}"#,
        )
        .unwrap()
    }

    #[test]
    fn fields_are_named_as_the_pages_name_them() {
        let s = spec();
        let cases = [
            ("routes[0].policies[0]", "Route \"search\", limits"),
            ("routes[0].pattern", "Route \"search\", pattern"),
            ("routes[7].policies", "Route #8, limits"),
            ("policies[0].quota.capacity", "Limit \"default\", capacity"),
            (
                "policies[0].max_overshoot",
                "Limit \"default\", overshoot bound",
            ),
            ("consistency", "Consistency across edges"),
            ("policies[0]", "Limit \"default\""),
            ("plans.free[0]", "Plan \"free\", limits"),
            ("plans.free", "Plan \"free\""),
            (
                "key_overrides.Ab3dE5gH1j[1]",
                "Override for key \"Ab3dE5gH1j\", limits",
            ),
            (
                "identity_overrides.cus.42.policies[0]",
                "Override for identity \"cus.42\", limits",
            ),
            (
                "identity_overrides.cus_42.plan",
                "Override for identity \"cus_42\", plan",
            ),
            (
                "identity_overrides.cus_42",
                "Override for identity \"cus_42\"",
            ),
            ("ip_policies[0]", "Per client IP, limits"),
            ("quota.capacity", "Capacity"),
            ("failure_mode", "If Redis fails"),
            ("headers.retry_jitter_secs", "Retry-After jitter"),
            ("(form)", "This form"),
        ];
        for (field, label) in cases {
            assert_eq!(describe_field(field, Some(&s)), label, "{field}");
        }
    }

    #[test]
    fn a_change_lists_the_fields_it_touched() {
        let before = r#"{"name":"search","dimensions":["api_key","endpoint"],"quota":{"capacity":100,"period":"1m"},"cost":1}"#;
        let after = r#"{"name":"search","dimensions":["api_key","endpoint"],"quota":{"capacity":5,"period":"1h"},"cost":1,"shadow":true}"#;
        let d = diff(Some(before), Some(after)).unwrap();
        let shown: Vec<(&str, Option<&str>, Option<&str>)> = d
            .iter()
            .map(|c| (c.path.as_str(), c.before.as_deref(), c.after.as_deref()))
            .collect();
        assert_eq!(
            shown,
            [
                ("quota.capacity", Some("100"), Some("5")),
                ("quota.period", Some("1m"), Some("1h")),
                ("shadow", Some("false"), Some("true")),
            ]
        );
        // fields the JSON omits at their default read as that default
        let bounded = r#"{"name":"search","quota":{"capacity":100,"period":"1m"},"consistency":"bounded","max_overshoot":20}"#;
        let exact = r#"{"name":"search","quota":{"capacity":100,"period":"1m"}}"#;
        let d = diff(Some(exact), Some(bounded)).unwrap();
        let shown: Vec<(&str, Option<&str>, Option<&str>)> = d
            .iter()
            .map(|c| (c.path.as_str(), c.before.as_deref(), c.after.as_deref()))
            .collect();
        assert_eq!(
            shown,
            [
                ("consistency", Some("exact"), Some("bounded")),
                ("max_overshoot", None, Some("20")),
            ]
        );
        let back = diff(Some(bounded), Some(exact)).unwrap();
        assert_eq!(back[0].after.as_deref(), Some("exact"));
        let created = diff(None, Some(bounded)).unwrap();
        assert!(created.iter().all(|c| c.before.is_none()), "{created:?}");
        let created = diff(None, Some(r#"["default","search"]"#)).unwrap();
        assert_eq!(created[0].after.as_deref(), Some("default, search"));
        let key = diff(None, Some(r#"{"id":"K1","created":1796000000}"#)).unwrap();
        assert_eq!(key[0].after.as_deref(), Some("2026-11-30 00:53:20 UTC"));
        assert_eq!(diff(Some("{\"a\":1}"), Some("{\"a\":1}")), Some(vec![]));
        assert_eq!(diff(Some("{\"cut…"), None), None, "not JSON: shown as is");
    }
}
