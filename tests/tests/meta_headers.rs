//! The upstream headers of a key's identity and metadata under names of the
//! operator's (`--key-identity-header` / `KEY_IDENTITY_HEADER`,
//! `--key-meta-header` / `KEY_META_HEADER`), on BOTH hosts from the same
//! variables: the upstream gets each once under its configured name; client
//! copies under those names and under the default names, in every CGI
//! spelling, never reach it.

use std::time::Duration;

use floodgate_edge::admin;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::keychanges::KeyChanges;
use floodgate_tests::upstream::{Echo, RawUpstream};
use floodgate_tests::{EdgeKind, EdgeOptions, RedisServer, on_both_hosts, seed, start_edge_with};
use reqwest::StatusCode;

on_both_hosts!(renamed_metadata_headers_reach_the_upstream_and_client_copies_never_do);

const CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 100, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"free": ["default"]}
}"#;

/// Every CGI spelling of `name` among the upstream's headers.
fn spelled(echo: &Echo, name: &str) -> Vec<String> {
    echo.names()
        .into_iter()
        .filter(|n| n.to_ascii_lowercase().replace('_', "-") == name)
        .collect()
}

async fn renamed_metadata_headers_reach_the_upstream_and_client_copies_never_do(kind: EdgeKind) {
    let redis = RedisServer::start();
    seed(&redis, CONFIG).await;
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    let new = KeyChanges {
        plan: Some("free".into()),
        identity: Some(Some("cus_42".into())),
        metadata: Some(Some(serde_json::json!({"tier": "gold"}))),
        ..KeyChanges::default()
    };
    let (_, secret) = admin::create_key_with(&store, &new, 1_764_000_000)
        .await
        .unwrap();
    let upstream = RawUpstream::start().await;
    let options = EdgeOptions {
        worker_env: vec![
            ("KEY_IDENTITY_HEADER".into(), "X-Customer".into()),
            ("KEY_META_HEADER".into(), "X-Customer-Meta".into()),
        ],
        ..EdgeOptions::default()
    };
    let edge = start_edge_with(kind, &redis, &upstream.url, &options).await;
    let r = reqwest::Client::new()
        .get(format!("{}/echo", edge.url))
        .bearer_auth(&secret)
        .header("X-Customer", "spoofed")
        .header("x_customer", "spoofed-underscore")
        .header("X-CUSTOMER-META", r#"{"tier":"platinum"}"#)
        .header("X_Customer_Meta", "{}")
        .header("X-Floodgate-Identity", "spoofed-default")
        .header("x_floodgate_key_meta", "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let seen = Echo(r.json().await.unwrap());
    assert_eq!(spelled(&seen, "x-customer").len(), 1, "{:?}", seen.names());
    assert_eq!(seen.header("x-customer"), ["cus_42"]);
    assert_eq!(
        spelled(&seen, "x-customer-meta").len(),
        1,
        "{:?}",
        seen.names()
    );
    assert_eq!(seen.header("x-customer-meta"), [r#"{"tier":"gold"}"#]);
    for default in ["x-floodgate-identity", "x-floodgate-key-meta"] {
        assert!(
            spelled(&seen, default).is_empty(),
            "neither the edge's nor a client's {default}: {:?}",
            seen.names()
        );
    }
}
