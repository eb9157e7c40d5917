//! Endpoints as the pages name them (pure), and the request that tries an API key
//! on one.

use std::collections::BTreeMap;

use floodgate_shared::config::ConfigSpec;
use floodgate_shared::stats::Endpoint;

/// How the pages name an endpoint: its path pattern and route name, or the one
/// name of unmatched traffic.
pub fn endpoint_label(e: &Endpoint, patterns: &BTreeMap<String, String>) -> String {
    match e {
        Endpoint::Unmatched => UNMATCHED.to_string(),
        Endpoint::Route(r) => match patterns.get(r) {
            Some(p) => format!("{p} (route {r})"),
            None => format!("route {r} (no longer configured)"),
        },
    }
}

/// The one name of traffic that matched no route, on every page.
pub const UNMATCHED: &str = "Unmatched paths (no route)";

/// What the pages write for the edge's address when the dashboard was not told it.
pub const EDGE_URL_PLACEHOLDER: &str = "EDGE_URL";

/// A request through the edge with API key `secret`, ready to paste: `curl -i`
/// shows the status (200, or 429 when throttled) and the rate-limit headers.
pub fn try_request(edge_url: Option<&str>, secret: &str, path: &str) -> String {
    let base = edge_url
        .unwrap_or(EDGE_URL_PLACEHOLDER)
        .trim_end_matches('/');
    format!("curl -i -H \"Authorization: Bearer {secret}\" {base}{path}")
}

/// A path of the configuration to try a key on: the first route's pattern when it
/// has no parameters, else `/`.
pub fn example_path(spec: Option<&ConfigSpec>) -> String {
    spec.and_then(|s| s.routes.iter().find(|r| !r.pattern.contains([':', '*'])))
        .map_or_else(|| "/".to_string(), |r| r.pattern.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_tried_on_the_edge_with_a_pasteable_curl() {
        assert_eq!(
            try_request(Some("https://edge.example/"), "fg_k", "/v1/search"),
            "curl -i -H \"Authorization: Bearer fg_k\" https://edge.example/v1/search"
        );
        assert!(try_request(None, "fg_k", "/").ends_with(" EDGE_URL/"));
        let spec: ConfigSpec = serde_json::from_str(
            r#"{"policies":[],"plans":{},"routes":[{"name":"u","pattern":"/v1/users/:id","policies":[]},{"name":"s","pattern":"/v1/search","policies":[]}]}"#,
        )
        .unwrap();
        assert_eq!(example_path(Some(&spec)), "/v1/search");
        assert_eq!(example_path(None), "/");
    }
}
