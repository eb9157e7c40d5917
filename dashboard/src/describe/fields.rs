//! A validation error's field path as the pages name it (pure):
//! `routes[0].policies[1]` → `Route "search", limits`.

use floodgate_shared::config::ConfigSpec;

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

/// Every trailing index dropped: `routes[0].policies[2]` → `routes[0].policies`,
/// `a[1][2]` → `a` (a form edits a list as one field).
pub fn strip_indexes(mut s: &str) -> &str {
    loop {
        let t = strip_index(s);
        if t.len() == s.len() {
            return s;
        }
        s = t;
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
    fn trailing_indexes_are_dropped_for_the_form_field() {
        assert_eq!(strip_indexes("routes[0].policies[2]"), "routes[0].policies");
        assert_eq!(strip_indexes("a[1][22]"), "a");
        assert_eq!(strip_indexes("plans.free"), "plans.free");
        assert_eq!(strip_indexes("key_overrides.k[x]"), "key_overrides.k[x]");
    }
}
