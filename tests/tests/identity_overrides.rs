//! Identity overrides at the edge, on BOTH hosts (the native host and the Worker
//! in workerd, real Redis, real upstream), set and cleared with the built
//! `floodgate-cli identity` (the admin API's code): the keys of an identity with
//! an override get the override's limit — exactly, across processes — while a
//! key of another identity keeps its plan's, and a key's own override still
//! comes first; clearing the override puts the identity's keys back on their
//! plan within the configuration's cache bound. The CLI refuses an identity no
//! key holds and a plan the configuration lacks, naming the field, nothing saved.

use std::time::{Duration, Instant};

use floodgate_edge::admin;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::keychanges::KeyChanges;
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{EdgeKind, EdgeOptions, RedisServer, on_both_hosts, start_edge_with};
use reqwest::StatusCode;

on_both_hosts!(the_keys_of_an_identity_with_an_override_get_its_limit_exactly);

/// Per key 100 an hour on plan `free`; `team`, 25 an hour per identity, and
/// `vip`, 7 an hour per key, attached by no plan (no refill while a test runs).
const CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 100, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed"},
    {"name": "team", "dimensions": ["identity"], "quota": {"capacity": 25, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed"},
    {"name": "vip", "dimensions": ["api_key"], "quota": {"capacity": 7, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"free": ["default"], "gold": ["vip"]}
}"#;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `floodgate-cli identity ...` against `redis`: its stdout, or its stderr.
fn cli(redis: &RedisServer, args: &[&str]) -> Result<String, String> {
    let url = redis.url();
    let mut all = vec!["--redis", &url, "identity"];
    all.extend_from_slice(args);
    let out = floodgate_tests::process::run("floodgate-cli", &all, &[]);
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

/// The limit header of one request by `secret` to `edge`.
async fn limit_of(edge: &str, secret: &str) -> (StatusCode, String) {
    let r = client()
        .get(format!("{edge}/probe"))
        .bearer_auth(secret)
        .send()
        .await
        .unwrap();
    let limit = r
        .headers()
        .get("x-ratelimit-limit")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (r.status(), limit)
}

/// Keys of `identity` on plan `free`.
async fn key_of(store: &RespStore, identity: &str) -> (String, String) {
    let changes = KeyChanges {
        plan: Some("free".into()),
        identity: Some(Some(identity.into())),
        ..KeyChanges::default()
    };
    let (record, secret) = admin::create_key_with(store, &changes, now_secs())
        .await
        .unwrap();
    (record.id, secret)
}

/// Two keys of cus_42 with the override `team` (25 per identity), 20 clients
/// over three edges, 100 attempts: exactly 25 admitted between them; a key of
/// cus_43 keeps its plan's 100; a key override of one cus_42 key beats the
/// identity's; `identity clear` gives the keys their plan back.
async fn the_keys_of_an_identity_with_an_override_get_its_limit_exactly(kind: EdgeKind) {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&store, CONFIG).await.unwrap();
    let (_, a) = key_of(&store, "cus_42").await;
    let (_, b) = key_of(&store, "cus_42").await;
    let (_, other) = key_of(&store, "cus_43").await;
    let (vip_id, vip) = key_of(&store, "cus_42").await;
    let version = admin::load_config(&store).await.unwrap().0;
    for (args, named) in [
        (
            vec!["override", "cus_99", "--policy", "team"],
            "identity_overrides.cus_99: no API key has the identity",
        ),
        (
            vec!["override", "cus_42", "--plan", "platinum"],
            "identity_overrides.cus_42.plan: no plan is named",
        ),
        (
            vec!["override", "cus_42", "--policy", "nope"],
            "identity_overrides.cus_42.policies[0]",
        ),
        (
            vec!["override", "cus_42"],
            "must name a plan, policies or both",
        ),
    ] {
        let e = cli(&redis, &args).unwrap_err();
        assert!(e.contains(named), "{args:?}: {e}");
    }
    assert_eq!(
        admin::load_config(&store).await.unwrap().0,
        version,
        "nothing saved"
    );
    let set = cli(&redis, &["override", "cus_42", "--policy", "team"]).unwrap();
    assert!(
        set.starts_with("cus_42: set plan (the key's), policies team"),
        "{set}"
    );
    let mut spec: serde_json::Value =
        serde_json::from_str(&admin::get_config(&store).await.unwrap().unwrap()).unwrap();
    spec["key_overrides"] = serde_json::json!({ vip_id.as_str(): ["vip"] });
    admin::set_config(&store, &spec.to_string()).await.unwrap();

    let options = EdgeOptions {
        cache_ttl_ms: 300,
        stats_flush_ms: 60_000,
        ..EdgeOptions::default()
    };
    let upstream = RawUpstream::start().await;
    let mut edges = vec![];
    for _ in 0..3 {
        edges.push(start_edge_with(kind, &redis, &upstream.url, &options).await);
    }
    let urls: Vec<String> = edges.iter().map(|e| e.url.clone()).collect();
    let secrets = [a.clone(), b.clone()];
    let admitted = floodgate_tests::admitted_across(client, &urls, &secrets, 20, 5).await;
    assert_eq!(
        admitted, 25,
        "100 attempts by two keys of cus_42 on team's 25"
    );
    assert_eq!(
        limit_of(&urls[0], &a).await,
        (StatusCode::TOO_MANY_REQUESTS, "25".into())
    );
    assert_eq!(
        limit_of(&urls[1], &other).await,
        (StatusCode::OK, "100".into())
    );
    assert_eq!(
        limit_of(&urls[2], &vip).await,
        (StatusCode::OK, "7".into()),
        "the key's own override comes first"
    );

    let cleared = cli(&redis, &["clear", "cus_42"]).unwrap();
    assert!(
        cleared.starts_with("cus_42: removed plan (the key's), policies team"),
        "{cleared}"
    );
    let shown = cli(&redis, &["show", "cus_42"]).unwrap();
    assert!(shown.starts_with("no override\n"), "{shown}");
    assert_eq!(
        shown.lines().count(),
        4,
        "and the identity's three keys: {shown}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = limit_of(&urls[0], &b).await;
        if got == (StatusCode::OK, "100".into()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {got:?} after the override's removal"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A whole document (`config set`, `admin::replace_config`) is checked as the
/// API's edit is: a new override for an identity no key holds is refused naming
/// its field, nothing saved; one saved while its identity had a key does not
/// block a later unrelated save after the key changed identity.
#[tokio::test]
async fn a_whole_document_naming_an_identity_no_key_holds_is_refused() {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&store, CONFIG).await.unwrap();
    let (version, _) = admin::load_config(&store).await.unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(CONFIG).unwrap();
    doc["identity_overrides"] = serde_json::json!({"cus_42": {"plan": "gold"}});
    let save = |doc: &serde_json::Value, basis: &str| {
        let (store, text, basis) = (store.clone(), doc.to_string(), basis.to_string());
        async move {
            let basis = admin::Basis::Version(basis);
            admin::replace_config(&store, &text, basis, "tests", now_secs()).await
        }
    };
    match save(&doc, &version).await {
        Err(admin::AdminError::Invalid(e)) => {
            assert_eq!(e.field, "identity_overrides.cus_42", "{e}");
            assert!(e.message.contains("no API key has the identity"), "{e}");
        }
        other => panic!("saved: {:?}", other.map(|(_, v)| v)),
    }
    assert_eq!(
        admin::load_config(&store).await.unwrap().0,
        version,
        "nothing saved"
    );
    let (id, _) = key_of(&store, "cus_42").await;
    let (_, version) = save(&doc, &version).await.expect("a key holds cus_42 now");
    admin::update_key(&store, &id, |r| r.identity = Some("cus_7".into()))
        .await
        .unwrap();
    doc["plans"]["silver"] = serde_json::json!(["vip"]);
    save(&doc, &version)
        .await
        .expect("the override saved earlier does not block another change");
}
