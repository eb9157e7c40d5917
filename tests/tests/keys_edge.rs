//! API keys at the edge, on BOTH hosts (the native host and the Worker in
//! workerd, with real Redis and a real upstream that echoes what it was sent):
//! forged keys (a v2 shape with a wrong checksum) cost no store call and none of
//! the unknown-key budget; an expired key is refused from its cached record; the
//! key's identity and metadata reach the upstream, client-sent copies never do;
//! the keys of one identity share an `identity` policy's bucket exactly. And the
//! CLI's `key create --expires-at/--expires-in`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use floodgate_edge::admin;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::apikeys::{CHECK_LEN, SECRET_LEN, check_secret, new_secret};
use floodgate_shared::keychanges::KeyChanges;
use floodgate_shared::keyrecord::{Metadata, metadata_header};
use floodgate_shared::stats::SAMPLE_KEY;
use floodgate_tests::scale::billed_by_name;
use floodgate_tests::upstream::{Echo, RawUpstream};
use floodgate_tests::{
    EdgeInstance, EdgeKind, EdgeOptions, RedisServer, Seeded, cli, on_both_hosts, seed,
    start_edge_with,
};
use redis::Commands;
use reqwest::StatusCode;

on_both_hosts!(
    forged_keys_cost_no_store_call_and_none_of_the_unknown_key_budget,
    an_expired_key_is_refused_from_its_cached_record_without_a_store_call,
    identity_and_metadata_reach_the_upstream_and_client_copies_never_do,
    two_keys_of_one_identity_share_one_bucket_exactly,
);

/// 100 per hour per key (no refill while a test runs).
const CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 100, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"free": ["default"]}
}"#;

struct Stack {
    redis: RedisServer,
    store: RespStore,
    upstream: RawUpstream,
    edge: String,
    secret: String,
    _edge: EdgeInstance,
}

/// An edge whose statistics are not flushed while a test runs (a minute), so
/// every store command counted is one a request caused.
async fn stack(kind: EdgeKind, cache_ttl_ms: i64) -> Stack {
    let redis = RedisServer::start();
    let Seeded { secret, .. } = seed(&redis, CONFIG).await;
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    let upstream = RawUpstream::start().await;
    let options = EdgeOptions {
        cache_ttl_ms,
        stats_flush_ms: 60_000,
        ..EdgeOptions::default()
    };
    let instance = start_edge_with(kind, &redis, &upstream.url, &options).await;
    Stack {
        redis,
        store,
        upstream,
        edge: instance.url.clone(),
        secret,
        _edge: instance,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Every command the test's Redis ran but the tests' own INFO and CONFIG.
fn store_commands(redis: &RedisServer) -> u64 {
    billed_by_name(&mut redis.connection())
        .iter()
        .map(|(_, n)| n)
        .sum()
}

/// Waits for a Worker's first statistics flush, which follows its first request
/// (the native host's comes from its timer, a minute here, like the Worker's
/// next). It is bookkeeping, not a decision's call: a test counting the store
/// commands of decisions starts its count after it. (One script call, on a fresh
/// Redis an `EVALSHA` answered `NOSCRIPT` and an `EVAL`: it landed inside such a
/// count in full runs, 5 commands.)
async fn first_flush(kind: EdgeKind, redis: &RedisServer) {
    let started = std::time::Instant::now();
    while kind == EdgeKind::Worker && redis.connection().llen::<_, u64>(SAMPLE_KEY).unwrap() == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "no flush");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn health(c: &reqwest::Client, edge: &str) -> serde_json::Value {
    c.get(format!("{edge}{}", floodgate_edge::proxy::HEALTH_PATH))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A v2-shaped secret whose checksum is wrong: a freshly minted one with one
/// checksum digit changed.
fn forged() -> String {
    let (_, mut secret) = new_secret(&rand::random());
    let at = SECRET_LEN + rand::random_range(0..CHECK_LEN);
    let old = secret.as_bytes()[at];
    let new = if old == b'0' { b'1' } else { b'0' };
    secret.replace_range(at..=at, std::str::from_utf8(&[new]).unwrap());
    assert!(check_secret(&secret).is_err(), "{secret}");
    secret
}

/// 1,000 forged keys from one address (50 times its unknown-key budget of 20 a
/// minute, more than the instance's 600): each a 401 `Invalid API key`, not one
/// store command among them, no unknown-key lookup counted; a key created after
/// the flood still works from that address at once. (Before the checksum was
/// checked, each was looked up until the address's budget was spent, and the
/// new key was then refused with 429 for a minute.)
async fn forged_keys_cost_no_store_call_and_none_of_the_unknown_key_budget(kind: EdgeKind) {
    let s = stack(kind, 5_000).await;
    let c = client();
    let warm = c
        .get(format!("{}/warm", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::OK);
    first_flush(kind, &s.redis).await;
    let before = health(&c, &s.edge).await;
    let commands = store_commands(&s.redis);
    let mut refused = 0;
    for _ in 0..1_000 {
        let r = c
            .get(format!("{}/probe", s.edge))
            .bearer_auth(forged())
            .header("CF-Connecting-IP", "203.0.113.9")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body, serde_json::json!({"error": "Invalid API key"}));
        refused += 1;
    }
    let spent = store_commands(&s.redis) - commands;
    let after = health(&c, &s.edge).await;
    println!("{kind:?}: {refused} forged keys cost {spent} store commands");
    assert_eq!(
        spent, 0,
        "{refused} forged keys cost {spent} store commands"
    );
    assert_eq!(
        after["unknown_keys"], before["unknown_keys"],
        "no lookup counted, nothing refused for the budget"
    );
    assert_eq!(s.upstream.path("/probe"), 0);
    let (_, fresh) = admin::create_key(&s.store, "new", "free", now_secs())
        .await
        .unwrap();
    let r = c
        .get(format!("{}/new", s.edge))
        .bearer_auth(&fresh)
        .header("CF-Connecting-IP", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "a real new key from the flooding address is looked up and admitted"
    );
}

/// A key created (by the admin code) to expire in a few seconds works until its
/// second, then gets 401 `API key expired` from the record the edge cached: no
/// store command, nothing reaches the upstream. An expiry in the past is refused
/// naming the field, nothing stored.
async fn an_expired_key_is_refused_from_its_cached_record_without_a_store_call(kind: EdgeKind) {
    let s = stack(kind, 30_000).await;
    let c = client();
    let past = KeyChanges {
        plan: Some("free".into()),
        expires_at: Some(Some(now_secs() - 1)),
        ..KeyChanges::default()
    };
    let keys_before = admin::list_keys(&s.store).await.unwrap().len();
    let e = admin::create_key_with(&s.store, &past, now_secs())
        .await
        .unwrap_err();
    assert!(e.to_string().starts_with("expires_at: "), "{e}");
    assert_eq!(admin::list_keys(&s.store).await.unwrap().len(), keys_before);
    let expires_at = now_secs() + 3;
    let soon = KeyChanges {
        expires_at: Some(Some(expires_at)),
        ..past
    };
    let (record, secret) = admin::create_key_with(&s.store, &soon, now_secs())
        .await
        .unwrap();
    assert_eq!(record.expires_at, Some(expires_at));
    let get = |path: &'static str| {
        c.get(format!("{}{path}", s.edge))
            .bearer_auth(&secret)
            .send()
    };
    let r = get("/before").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "admitted until it expires");
    first_flush(kind, &s.redis).await;
    let commands = store_commands(&s.redis);
    let wait = (expires_at * 1000) as u128 + 100
        - SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    for _ in 0..5 {
        let r = get("/after").await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body, serde_json::json!({"error": "API key expired"}));
    }
    let spent = store_commands(&s.redis) - commands;
    assert_eq!(
        spent, 0,
        "the cached record decided: {spent} store commands"
    );
    assert_eq!(s.upstream.path("/after"), 0);
}

/// Every CGI spelling of `name` among the upstream's headers.
fn spelled(echo: &Echo, name: &str) -> Vec<String> {
    echo.names()
        .into_iter()
        .filter(|n| n.to_ascii_lowercase().replace('_', "-") == name)
        .collect()
}

/// A key with an identity and metadata: the upstream gets both (the metadata as
/// compact JSON, non-ASCII escaped) next to the key id; copies the client sent in
/// any spelling are dropped. A key with neither: no such header at all.
async fn identity_and_metadata_reach_the_upstream_and_client_copies_never_do(kind: EdgeKind) {
    let s = stack(kind, 5_000).await;
    let c = client();
    let metadata = serde_json::json!({"tier": "gold", "café": [1, 2], "org": {"id": 7}});
    let new = KeyChanges {
        plan: Some("free".into()),
        identity: Some(Some("cus_42@acme.test".into())),
        metadata: Some(Some(metadata.clone())),
        ..KeyChanges::default()
    };
    let (record, secret) = admin::create_key_with(&s.store, &new, now_secs())
        .await
        .unwrap();
    let echo = |secret: String| {
        let c = c.clone();
        let url = format!("{}/echo", s.edge);
        async move {
            let r = c
                .get(url)
                .bearer_auth(secret)
                .header("X-Floodgate-Identity", "spoofed")
                .header("x_floodgate_identity", "spoofed-underscore")
                .header("X-FLOODGATE-KEY-META", r#"{"tier":"platinum"}"#)
                .header("X_Floodgate_Key_Meta", "{}")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            Echo(r.json().await.unwrap())
        }
    };
    let seen = echo(secret).await;
    assert_eq!(seen.header("x-floodgate-key-id"), vec![record.id]);
    assert_eq!(
        spelled(&seen, "x-floodgate-identity").len(),
        1,
        "{:?}",
        seen.names()
    );
    assert_eq!(seen.header("x-floodgate-identity"), ["cus_42@acme.test"]);
    assert_eq!(
        spelled(&seen, "x-floodgate-key-meta").len(),
        1,
        "{:?}",
        seen.names()
    );
    let meta = seen.header("x-floodgate-key-meta");
    let expected: Metadata = metadata.as_object().cloned().unwrap();
    assert_eq!(meta, [metadata_header(&expected)]);
    assert!(meta[0].is_ascii() && !meta[0].contains(' '), "{meta:?}");
    let back: serde_json::Value = serde_json::from_str(&meta[0]).unwrap();
    assert_eq!(back, metadata);
    let plain = echo(s.secret.clone()).await;
    assert!(
        spelled(&plain, "x-floodgate-identity").is_empty()
            && spelled(&plain, "x-floodgate-key-meta").is_empty(),
        "a key without identity or metadata: no such header, and no client copy: {:?}",
        plain.names()
    );
}

/// `key create --expires-in/--expires-at` store the expiry; one in the past (or
/// now) is refused naming `expires_at`, nothing stored; both at once is a usage
/// error. `--identity`, `--name` and `--metadata` are stored, each bad value
/// refused naming its field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_expiring_keys_and_refuses_an_expiry_in_the_past() {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    let run = |more: &[&str]| {
        let mut args: Vec<String> = ["--redis", &redis.url(), "key", "create", "--plan", "free"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(more.iter().map(|s| s.to_string()));
        cli(args)
    };
    for past in [
        vec!["--expires-in", "0s"],
        vec!["--expires-at", "2020-01-01T00:00:00Z"],
        vec!["--expires-at", "1577836800"],
    ] {
        let e = run(&past).await.unwrap_err();
        assert!(
            e.starts_with("expires_at: must be in the future"),
            "{past:?}: {e}"
        );
    }
    for (bad, field) in [
        (vec!["--metadata", "[1]"], "metadata: must be a JSON object"),
        (vec!["--metadata", "{\"a\":1"], "not JSON"),
        (vec!["--identity", "two words"], "identity: "),
        (vec!["--name", "a\nb"], "name: "),
    ] {
        let e = run(&bad).await.unwrap_err();
        assert!(e.contains(field), "{bad:?}: {e}");
    }
    assert!(
        admin::list_keys(&store).await.unwrap().is_empty(),
        "nothing stored"
    );
    let both = run(&["--expires-in", "1h", "--expires-at", "2099-01-01T00:00:00Z"]).await;
    assert!(both.unwrap_err().contains("cannot be used with"));
    let bad = run(&["--expires-in", "soon"]).await.unwrap_err();
    assert!(bad.contains("expected a duration"), "{bad}");
    run(&[
        "--identity",
        "cus_42",
        "--name",
        "CI",
        "--metadata",
        r#"{"tier":"gold"}"#,
    ])
    .await
    .unwrap();
    let keys = admin::list_keys(&store).await.unwrap();
    assert_eq!(keys[0].identity.as_deref(), Some("cus_42"));
    assert_eq!(keys[0].name.as_deref(), Some("CI"));
    assert_eq!(
        keys[0].metadata,
        serde_json::json!({"tier": "gold"}).as_object().cloned()
    );
    assert_eq!(keys[0].expires_at, None);
    let before = now_secs();
    run(&["--expires-in", "1h"]).await.unwrap();
    run(&["--expires-at", "2099-01-01T00:00:00+01:00"])
        .await
        .unwrap();
    let mut expiries: Vec<i64> = admin::list_keys(&store)
        .await
        .unwrap()
        .iter()
        .filter(|k| k.identity.is_none())
        .map(|k| k.expires_at.expect("an expiry"))
        .collect();
    expiries.sort();
    assert!(
        (before + 3600..=now_secs() + 3600).contains(&expiries[0]),
        "{expiries:?}"
    );
    assert_eq!(expiries[1], 4_070_905_200, "2099-01-01T00:00:00+01:00");
}

/// An `identity` policy: 300 per hour (no refill while the test runs) shared by
/// the keys of one identity.
const SHARED_CONFIG: &str = r#"{
  "policies": [
    {"name": "shared", "dimensions": ["identity"], "quota": {"capacity": 300, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"free": ["shared"]}
}"#;

/// Two keys of one identity, 30 clients over three edges, 600 attempts: exactly
/// 300 admitted between the two keys, in ONE bucket in Redis; a key of another
/// identity keeps its own 300.
async fn two_keys_of_one_identity_share_one_bucket_exactly(kind: EdgeKind) {
    let s = stack(kind, 5_000).await;
    admin::set_config(&s.store, SHARED_CONFIG).await.unwrap();
    let key_of = |identity: &str| KeyChanges {
        plan: Some("free".into()),
        identity: Some(Some(identity.into())),
        ..KeyChanges::default()
    };
    let mut secrets = vec![];
    for identity in ["cus_42", "cus_42", "cus_43"] {
        let (_, secret) = admin::create_key_with(&s.store, &key_of(identity), now_secs())
            .await
            .unwrap();
        secrets.push(secret);
    }
    let options = EdgeOptions {
        stats_flush_ms: 60_000,
        ..EdgeOptions::default()
    };
    let e2 = start_edge_with(kind, &s.redis, &s.upstream.url, &options).await;
    let e3 = start_edge_with(kind, &s.redis, &s.upstream.url, &options).await;
    let edges = [s.edge.clone(), e2.url.clone(), e3.url.clone()];
    let admitted = floodgate_tests::admitted_across(client, &edges, &secrets[..2], 30, 20).await;
    assert_eq!(admitted, 300, "600 attempts by two keys of one identity");
    let buckets: Vec<String> = redis::cmd("KEYS")
        .arg("fg:{i:cus_42}*")
        .query(&mut s.redis.connection())
        .unwrap();
    assert_eq!(
        buckets,
        ["fg:{i:cus_42}:shared"],
        "one bucket for the identity"
    );
    let other = client()
        .get(format!("{}/other", s.edge))
        .bearer_auth(&secrets[2])
        .send()
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another identity counts apart"
    );
    assert_eq!(other.headers()["x-ratelimit-remaining"], "299");
}
