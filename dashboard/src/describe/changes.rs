//! An audit record's before → after as the list of fields it changed (pure), for
//! the audit page.

use serde_json::Value;

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
