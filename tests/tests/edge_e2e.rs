//! End to end through BOTH hosts of the pipeline — the native host and the
//! Cloudflare Worker in workerd — with real Redis, a real upstream, over HTTP.
//! Every case runs once per host.

use std::time::Duration;

use floodgate_edge::admin;
use floodgate_edge::demo_upstream::{self, Seen};
use floodgate_edge::store::resp::RespStore;
use floodgate_tests::{
    DEMO_CONFIG, EdgeInstance, EdgeKind, RedisServer, on_both_hosts, serve, start_edge,
};
use reqwest::StatusCode;

struct Stack {
    redis: RedisServer,
    seen: Seen,
    upstream: String,
    edge: String,
    secret: String,
    key_id: String,
    _edge: EdgeInstance,
    _stop: tokio::sync::oneshot::Sender<()>,
}

on_both_hosts!(
    admitted_requests_carry_the_quota_headers_and_reach_the_upstream_as_the_key_id,
    the_1001st_request_in_a_minute_is_a_429_and_never_reaches_the_upstream,
    endpoint_buckets_are_independent_and_spellings_cannot_dodge_them,
    missing_unknown_and_revoked_keys_get_401_json,
    random_paths_and_hostile_requests_create_no_redis_keys,
    fifty_clients_over_three_edges_admit_exactly_the_quota,
    an_unreachable_upstream_is_a_502_json,
);

/// The demo configuration with the refill slowed to one token per hour, so a test
/// that takes seconds sees no refill: "1,000 per minute" then means exactly 1,000
/// admitted while the test runs (with the demo's refill a token returns every 60 ms).
fn test_config() -> String {
    let c = DEMO_CONFIG.replace(r#""period": "1m""#, r#""refill": 1, "period": "1h""#);
    assert_ne!(c, DEMO_CONFIG);
    c
}

async fn stack(kind: EdgeKind, cache_ttl_ms: i64) -> Stack {
    let redis = RedisServer::start();
    let admin_store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&admin_store, &test_config())
        .await
        .unwrap();
    let (record, secret) = admin::create_key(&admin_store, "tests", "free", 1_764_000_000)
        .await
        .unwrap();
    let seen = Seen::default();
    let (upstream, stop) = serve(demo_upstream::router(seen.clone())).await;
    let instance = start_edge(kind, &redis, &upstream, cache_ttl_ms).await;
    Stack {
        redis,
        seen,
        upstream,
        edge: instance.url.clone(),
        secret,
        key_id: record.id,
        _edge: instance,
        _stop: stop,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

async fn admitted_requests_carry_the_quota_headers_and_reach_the_upstream_as_the_key_id(
    kind: EdgeKind,
) {
    let s = stack(kind, 5_000).await;
    let r = client()
        .post(format!("{}/v1/items?x=1", s.edge))
        .bearer_auth(&s.secret)
        .header("X-Floodgate-Key-Id", "spoofed")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["x-ratelimit-limit"], "1000");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "999");
    let reset: i64 = r.headers()["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // one token was taken; it returns in an hour (the test config's refill)
    assert!(
        (now + 3598..=now + 3602).contains(&reset),
        "reset {reset} vs now {now}"
    );
    let echo: serde_json::Value = r.json().await.unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/v1/items");
    assert_eq!(echo["query"], "x=1");
    assert_eq!(echo["body_bytes"], 5);
    assert_eq!(
        echo["key_id"],
        s.key_id.as_str(),
        "the identity header is the edge's, not the client's"
    );
    assert_eq!(echo["authorization_forwarded"], false);
    if kind == EdgeKind::Native {
        // (in production Cloudflare itself sets X-Forwarded-For before the Worker runs)
        assert_eq!(echo["forwarded_for"], "127.0.0.1");
    }
}

async fn the_1001st_request_in_a_minute_is_a_429_and_never_reaches_the_upstream(kind: EdgeKind) {
    let s = stack(kind, 5_000).await;
    let c = client();
    for i in 0..1000 {
        let r = c
            .get(format!("{}/v1/items/{i}", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
    }
    let r = c
        .get(format!("{}/v1/items/last", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["x-ratelimit-limit"], "1000");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "0");
    let retry: i64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(
        r.text().await.unwrap(),
        r#"{"error":"Rate limit exceeded"}"#
    );
    assert_eq!(
        s.seen.total(),
        1000,
        "the upstream saw exactly the admitted requests"
    );
    assert_eq!(s.seen.path("/v1/items/last"), 0);
}

async fn endpoint_buckets_are_independent_and_spellings_cannot_dodge_them(kind: EdgeKind) {
    let s = stack(kind, 5_000).await;
    let c = client();
    let spellings = [
        "/v1/checkout",
        "/V1/Checkout",
        "//v1//checkout/",
        "/v1/%63heckout",
        "/v1/x/../checkout",
    ];
    for i in 0..10 {
        let path = spellings[i % spellings.len()];
        let r = c
            .post(format!("{}{path}", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "checkout {i} via {path}");
        assert_eq!(
            r.headers()["x-ratelimit-limit"],
            "10",
            "the most restrictive bucket is reported"
        );
    }
    for path in spellings {
        let r = c
            .post(format!("{}{path}", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
    }
    // search has its own 100
    let r = c
        .get(format!("{}/v1/search?q=x", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["x-ratelimit-limit"], "100");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "99");
}

async fn missing_unknown_and_revoked_keys_get_401_json(kind: EdgeKind) {
    let s = stack(kind, 100).await;
    let c = client();
    let get = |auth: Option<String>| {
        let mut r = c.get(format!("{}/v1/items", s.edge));
        if let Some(a) = auth {
            r = r.header("Authorization", a);
        }
        r.send()
    };
    let r = get(None).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"], "Missing API key");
    assert!(v["hint"].as_str().unwrap().contains("Bearer"));
    let unknown = format!("Bearer fg_AAAAAAAAAA_{}", "B".repeat(32));
    for bad in [
        unknown,
        "Bearer nope".into(),
        format!("Bearer {}", "x".repeat(4 * 1024)),
        "Basic Zm9vOmJhcg==".into(),
    ] {
        let r = get(Some(bad.clone())).await.unwrap();
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "{}",
            &bad[..bad.len().min(30)]
        );
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"], "Invalid API key");
    }
    // beyond the header limit (32 KiB by default) the head itself is refused
    let r = get(Some(format!("Bearer {}", "x".repeat(64 * 1024))))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"], "Request headers too large");
    assert_eq!(
        get(Some(format!("Bearer {}", s.secret)))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let admin_store = RespStore::connect(&s.redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::revoke_key(&admin_store, &s.key_id).await.unwrap();
    // two cache TTLs: past the window in which an expired record is still served
    // while it refreshes, so the first request reads it again
    tokio::time::sleep(Duration::from_millis(250)).await;
    let r = get(Some(format!("Bearer {}", s.secret))).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"],
        "API key revoked"
    );
    assert_eq!(
        s.seen.total(),
        1,
        "only the one admitted request reached the upstream"
    );
}

/// 10,000 distinct random paths mint no bucket keys beyond the policies'.
async fn random_paths_and_hostile_requests_create_no_redis_keys(kind: EdgeKind) {
    let s = stack(kind, 5_000).await;
    let c = client();
    let mut conn = s.redis.connection();
    // every key but the counters (a few hashes a minute, whatever the paths)
    let buckets = |conn: &mut redis::Connection| -> usize {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
        // the traffic counters, the keys' last use and the one bounded decision
        // sample are not buckets
        keys.iter()
            .filter(|k| {
                !k.starts_with("fg:stats:")
                    && !k.starts_with("fg:stats10:")
                    && !k.starts_with("fg:keystats:")
                    && k.as_str() != floodgate_shared::stats::SAMPLE_KEY
                    && k.as_str() != floodgate_shared::stats::LAST_USED_KEY
            })
            .count()
    };
    let before = buckets(&mut conn);
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..10_000u32 {
        let path = format!(
            "/{:x}/{}/{}",
            i.wrapping_mul(2_654_435_761),
            i % 7,
            "z".repeat((i % 50) as usize)
        );
        let r = c
            .get(format!("{}{path}?q={i}", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        *statuses.entry(r.status().as_u16()).or_insert(0u32) += 1;
    }
    assert_eq!(statuses.get(&200), Some(&1000), "{statuses:?}");
    assert_eq!(statuses.get(&429), Some(&9000), "{statuses:?}");
    // hostile: invalid UTF-8 (percent-encoded) and a 60 KB header
    let r = c
        .get(format!("{}/v1/%ff%fe%00", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the default bucket is empty: no crash, no new key"
    );
    let r = c
        .get(format!("{}/v1/items", s.edge))
        .header("X-Big", "a".repeat(60 * 1024))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert!(
        r.status() == StatusCode::TOO_MANY_REQUESTS
            || r.status() == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "{}",
        r.status()
    );
    let r = c
        .get(format!("{}/{}", s.edge, "p".repeat(9000)))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::URI_TOO_LONG);
    let after = buckets(&mut conn);
    assert_eq!(
        after,
        before + 1,
        "one bucket (the key's default) was created, nothing else"
    );
}

/// 50 concurrent clients spread over 3 edge instances sharing one Redis admit
/// exactly the quota.
async fn fifty_clients_over_three_edges_admit_exactly_the_quota(kind: EdgeKind) {
    let s = stack(kind, 5_000).await;
    let e2 = start_edge(kind, &s.redis, &s.upstream, 5_000).await;
    let e3 = start_edge(kind, &s.redis, &s.upstream, 5_000).await;
    let edges = [s.edge.clone(), e2.url.clone(), e3.url.clone()];
    let admitted =
        floodgate_tests::admitted_across(client, &edges, std::slice::from_ref(&s.secret), 50, 30)
            .await;
    assert_eq!(admitted, 1000, "1,500 attempts against a bucket of 1,000");
    assert_eq!(s.seen.total(), 1000);
}

async fn an_unreachable_upstream_is_a_502_json(kind: EdgeKind) {
    let s = stack(kind, 5_000).await;
    let nowhere = format!("http://127.0.0.1:{}", floodgate_tests::free_port());
    let edge = start_edge(kind, &s.redis, &nowhere, 5_000).await;
    let r = client()
        .get(format!("{}/v1/items", edge.url))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"], "Upstream unavailable");
}
