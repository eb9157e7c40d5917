//! The edge tried from outside, as clients and attackers see it, on BOTH hosts (the
//! native host and the Worker in workerd): answers without a body, an upstream that
//! dies mid-body or never answers, headers a client must not smuggle upstream,
//! floods of unknown API keys, the IETF fields on a 429, and requests refused while
//! Redis stalled, which must cost no quota. Each case pins a defect found on the
//! edge as it was (issue 13).

use std::time::{Duration, Instant};

use floodgate_edge::admin;
use floodgate_edge::pipeline::{PipelineConfig, store_deadline};
use floodgate_edge::store::resp::RespStore;
use floodgate_tests::upstream::{Echo, RawUpstream};
use floodgate_tests::{
    EdgeInstance, EdgeKind, EdgeOptions, RedisServer, Seeded, on_both_hosts, seed, start_edge_with,
};
use reqwest::StatusCode;

on_both_hosts!(
    bodyless_answers_pass_through_with_the_quota_headers,
    a_body_cut_short_by_the_upstream_reaches_the_client_as_an_error,
    a_hung_upstream_is_a_504_json_within_the_upstream_timeout,
    headers_named_by_connection_and_identity_spellings_never_reach_the_upstream,
    content_length_bodies_keep_their_framing,
    unknown_keys_cost_redis_at_most_their_budget,
    ietf_fields_on_a_429_never_promise_room_before_retry_after,
    requests_refused_while_redis_stalled_cost_no_quota,
);

/// 100 per hour per key (no refill while a test runs), fail-closed.
const CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 100, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed"},
    {"name": "tight", "dimensions": ["api_key", "endpoint"], "quota": {"capacity": 2, "period": "10s"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"free": ["default"]},
  "routes": [{"name": "tight", "pattern": "/tight", "policies": ["tight"]}],
  "headers": {"ietf": true}
}"#;

struct Stack {
    redis: RedisServer,
    upstream: RawUpstream,
    edge: String,
    secret: String,
    key_id: String,
    _edge: EdgeInstance,
}

async fn stack_with(kind: EdgeKind, options: EdgeOptions) -> Stack {
    let redis = RedisServer::start();
    let Seeded { secret, key_id } = seed(&redis, CONFIG).await;
    let upstream = RawUpstream::start().await;
    let instance = start_edge_with(kind, &redis, &upstream.url, &options).await;
    Stack {
        redis,
        upstream,
        edge: instance.url.clone(),
        secret,
        key_id,
        _edge: instance,
    }
}

async fn stack(kind: EdgeKind) -> Stack {
    stack_with(kind, EdgeOptions::default()).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
}

fn remaining(r: &reqwest::Response) -> u64 {
    header(r, "x-ratelimit-remaining")
        .expect("quota headers")
        .parse()
        .unwrap()
}

async fn bodyless_answers_pass_through_with_the_quota_headers(kind: EdgeKind) {
    let s = stack(kind).await;
    let c = client();
    let head = c
        .head(format!("{}/things/1", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), StatusCode::OK, "HEAD is answered, not a 500");
    assert_eq!(remaining(&head), 99);
    assert!(head.bytes().await.unwrap().is_empty());
    for (code, left) in [(204u16, 98), (304, 97)] {
        let r = c
            .get(format!("{}/status/{code}", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), code);
        assert_eq!(
            remaining(&r),
            left,
            "one token per request, quota headers on {code}"
        );
        assert!(r.bytes().await.unwrap().is_empty());
    }
    assert_eq!(s.upstream.total(), 3);
}

async fn a_body_cut_short_by_the_upstream_reaches_the_client_as_an_error(kind: EdgeKind) {
    let s = stack(kind).await;
    let r = client()
        .get(format!("{}/truncate", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the head was already on its way"
    );
    let body = r.bytes().await;
    assert!(
        body.is_err(),
        "a body the upstream cut at 1,000 of 100,000 bytes must not look complete: got {:?} bytes",
        body.map(|b| b.len())
    );
}

async fn a_hung_upstream_is_a_504_json_within_the_upstream_timeout(kind: EdgeKind) {
    let options = EdgeOptions {
        upstream_timeout_ms: 1_000,
        ..EdgeOptions::default()
    };
    let s = stack_with(kind, options).await;
    let started = Instant::now();
    let r = client()
        .get(format!("{}/hang", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .expect("the edge answers a hung upstream itself");
    let took = started.elapsed();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(took < Duration::from_secs(4), "answered after {took:?}");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"], "Upstream timed out");
}

async fn headers_named_by_connection_and_identity_spellings_never_reach_the_upstream(
    kind: EdgeKind,
) {
    let s = stack(kind).await;
    let r = client()
        .get(format!("{}/echo", s.edge))
        .bearer_auth(&s.secret)
        .header("Connection", "keep-alive, X-Hop-Secret")
        .header("X-Hop-Secret", "must not pass")
        .header("X_Floodgate_Key_Id", "spoofed-underscore")
        .header("X-Floodgate-Key-Id", "spoofed")
        .header("X-Kept", "passes")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo = Echo(r.json().await.unwrap());
    assert!(
        echo.header("x-hop-secret").is_empty(),
        "a header the client's Connection names is hop-by-hop: {:?}",
        echo.names()
    );
    let identities: Vec<String> = echo
        .names()
        .into_iter()
        .filter(|n| n.to_ascii_lowercase().replace('_', "-") == "x-floodgate-key-id")
        .collect();
    assert_eq!(
        identities.len(),
        1,
        "exactly one identity header, in any spelling: {identities:?}"
    );
    assert_eq!(echo.header("x-floodgate-key-id"), vec![s.key_id.clone()]);
    assert_eq!(echo.header("x-kept"), vec!["passes".to_string()]);
    assert!(echo.header("authorization").is_empty());
}

async fn content_length_bodies_keep_their_framing(kind: EdgeKind) {
    let s = stack(kind).await;
    let r = client()
        .post(format!("{}/upload", s.edge))
        .bearer_auth(&s.secret)
        .body(vec![b'a'; 5000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo = Echo(r.json().await.unwrap());
    assert_eq!(echo.framing(), "content-length", "{:?}", echo.0);
    assert_eq!(echo.header("content-length"), vec!["5000".to_string()]);
    assert_eq!(echo.0["body_bytes"], 5000);
}

/// `INFO commandstats` calls of one command.
fn calls(redis: &RedisServer, command: &str) -> u64 {
    floodgate_tests::scale::calls_of(&mut redis.connection(), command)
}

async fn unknown_keys_cost_redis_at_most_their_budget(kind: EdgeKind) {
    let s = stack(kind).await;
    let c = client();
    let ok = c
        .get(format!("{}/before", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let gets_before = calls(&s.redis, "get");
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..300 {
        // well-formed, random, unknown: the shape check cannot tell
        let (_, fake) = floodgate_shared::apikeys::new_secret(&rand::random());
        let r = c
            .get(format!("{}/probe", s.edge))
            .bearer_auth(&fake)
            .header("CF-Connecting-IP", "203.0.113.9")
            .send()
            .await
            .unwrap();
        *statuses.entry(r.status().as_u16()).or_insert(0) += 1;
    }
    let gets = calls(&s.redis, "get") - gets_before;
    assert!(
        gets <= 40,
        "300 unknown keys from one address cost {gets} Redis GETs (statuses {statuses:?})"
    );
    assert_eq!(statuses.get(&200), None);
    let ok = c
        .get(format!("{}/after", s.edge))
        .bearer_auth(&s.secret)
        .header("CF-Connecting-IP", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(
        ok.status(),
        StatusCode::OK,
        "a known key keeps working through the flood"
    );
    assert_eq!(s.upstream.path("/probe"), 0);
}

/// The integer parameter `param` of the member named `policy` of a structured-field
/// list (RFC 9651, parsed by the `sfv` crate).
fn sf_param(value: &str, policy: &str, param: &str) -> i64 {
    let list: sfv::List = sfv::Parser::new(value)
        .parse_list()
        .expect("a structured list");
    list.iter()
        .find_map(|e| match e {
            sfv::ListEntry::Item(i)
                if i.bare_item.as_string().map(|s| s.as_str()) == Some(policy) =>
            {
                i.params
                    .iter()
                    .find(|(k, _)| k.as_str() == param)
                    .and_then(|(_, v)| v.as_integer())
                    .map(i64::from)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{policy};{param} in {value}"))
}

async fn ietf_fields_on_a_429_never_promise_room_before_retry_after(kind: EdgeKind) {
    let s = stack(kind).await;
    let c = client();
    for _ in 0..2 {
        let r = c
            .get(format!("{}/tight", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    // the first denial comes from Redis, the second from the instance's memory of recent 429s
    for which in ["redis", "recent 429s"] {
        let r = c
            .get(format!("{}/tight", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{which}");
        let retry: i64 = header(&r, "retry-after").unwrap().parse().unwrap();
        let state = header(&r, "ratelimit")
            .unwrap_or_else(|| panic!("a 429 from the {which} carries RateLimit"));
        assert!(
            header(&r, "ratelimit-policy").is_some(),
            "a 429 from the {which} carries RateLimit-Policy"
        );
        assert_eq!(sf_param(&state, "tight", "r"), 0, "{which}: {state}");
        let t = sf_param(&state, "tight", "t");
        assert!(
            (1..=retry).contains(&t),
            "{which}: t={t} must be when the denied request fits again, not after Retry-After={retry}"
        );
        // 2 per 10 s: a token returns every 5 s
        assert!(retry <= 5, "{which}: Retry-After {retry}");
    }
}

async fn requests_refused_while_redis_stalled_cost_no_quota(kind: EdgeKind) {
    let options = EdgeOptions {
        deadline_ms: Some(100),
        ..EdgeOptions::default()
    };
    let s = stack_with(kind, options).await;
    let c = client();
    let get = || {
        c.get(format!("{}/thing", s.edge))
            .bearer_auth(&s.secret)
            .send()
    };
    let first = get().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(remaining(&first), 99);
    s.redis.signal("STOP");
    let mut refused = 0;
    for _ in 0..6 {
        let r = get().await.unwrap();
        assert_ne!(
            r.status(),
            StatusCode::OK,
            "fail-closed while Redis is stopped"
        );
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        refused += 1;
    }
    s.redis.signal("CONT");
    // Redis now runs whatever was queued while it was stopped; then the breaker closes
    let deadline = Instant::now() + Duration::from_secs(10);
    let next = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = get().await.unwrap();
        if r.status() == StatusCode::OK {
            break r;
        }
        assert!(Instant::now() < deadline, "the edge recovers");
    };
    assert_eq!(
        remaining(&next),
        98,
        "{refused} requests refused with 503 must not have been charged"
    );
}

on_both_hosts!(
    a_stalled_redis_costs_a_request_at_most_the_store_deadline,
    an_unverifiable_key_gets_the_failure_mode_of_every_policy_it_could_match,
);

/// GET /__floodgate/health as JSON.
async fn health(c: &reqwest::Client, edge: &str) -> serde_json::Value {
    c.get(format!("{edge}{}", floodgate_edge::proxy::HEALTH_PATH))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Between two health answers: the store calls that waited out their deadline
/// (`late_calls`), and those not waited for at all — kept off the store by the
/// open breaker, or its health check (`breaker_skipped` + `breaker_probes`).
/// `None` before: since the instance started.
fn waits_since(before: Option<&serde_json::Value>, after: &serde_json::Value) -> (u64, u64) {
    let n = |h: &serde_json::Value, name: &str| h[name].as_u64().unwrap();
    let delta = |name: &str| n(after, name) - before.map_or(0, |b| n(b, name));
    (
        delta("late_calls"),
        delta("breaker_skipped") + delta("breaker_probes"),
    )
}

/// The global store's transport deadline (how long a store call may run at all),
/// from the ceiling the health answer shows.
fn transport_of(h: &serde_json::Value) -> Duration {
    let ceiling = h["deadlines"]["global"]["ceiling_ms"].as_f64().unwrap();
    store_deadline(Duration::from_secs_f64(ceiling / 1e3))
}

async fn a_stalled_redis_costs_a_request_at_most_the_store_deadline(kind: EdgeKind) {
    // the hosts' own default deadlines (adaptive: from 3 ms natively, from 50 ms in
    // the Worker)
    let options = EdgeOptions {
        deadline_ms: None,
        ..EdgeOptions::default()
    };
    let s = stack_with(kind, options).await;
    let c = client();
    let get = || {
        c.get(format!("{}/thing", s.edge))
            .bearer_auth(&s.secret)
            .send()
    };
    // warm: key and configuration cached, the store's latency learned (while
    // learning, the deadline is the ceiling)
    let mut answered = 0;
    for _ in 0..60 {
        if get().await.unwrap().status() == StatusCode::OK {
            answered += 1;
            if answered == 20 {
                break;
            }
        }
    }
    assert_eq!(answered, 20, "the edge answers while Redis is up");
    // (warming up on a busy machine may itself have been refused a few times)
    let warm = health(&c, &s.edge).await;
    let before = warm["degraded_requests"]["fail_closed"].as_u64().unwrap();
    s.redis.signal("STOP");
    let mut slowest = Duration::ZERO;
    let mut statuses = vec![];
    for _ in 0..20 {
        let started = Instant::now();
        let r = get().await.unwrap();
        slowest = slowest.max(started.elapsed());
        statuses.push(r.status().as_u16());
        assert_eq!(
            header(&r, "x-ratelimit-degraded").as_deref(),
            Some("fail-closed")
        );
    }
    let h = health(&c, &s.edge).await;
    s.redis.signal("CONT");
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    let transport = transport_of(&h);
    eprintln!(
        "stopped Redis: slowest request {slowest:?} (transport deadline {transport:?}), store calls waited and not: {:?}",
        waits_since(Some(&warm), &h)
    );
    // counted, not timed: no more store calls waited out their deadline than the
    // breaker lets fail before it opens, and every request's store call either
    // did so (once: a stopped store sends nothing that would extend the wait) or
    // was not waited for at all (kept off the store, or the breaker's health
    // check) — was: slowest < 400 ms, which measured the machine's load
    let (late, off) = waits_since(Some(&warm), &h);
    let threshold = u64::from(PipelineConfig::default().breaker_threshold);
    assert!((1..=threshold).contains(&late), "{late} waited: {h}");
    assert!(late + off >= 20, "{late} waited, {off} not: {h}");
    // and none was held until the store's own transport deadline (2 s natively,
    // 10 s in the Worker), the failure this guards; how long the slowest took is
    // the machine's scheduling, a figure
    assert!(
        slowest < transport,
        "a request waited {slowest:?} for a stopped Redis"
    );
    assert_eq!(h["breaker"], "open", "{h}");
    assert_eq!(
        h["degraded_requests"]["fail_closed"].as_u64().unwrap() - before,
        20,
        "{h}"
    );
    // both hosts' deadline is the adaptive one, learned (below its ceiling)
    let global = &h["deadlines"]["global"];
    assert_eq!(global["adaptive"], true, "{h}");
    assert!(
        global["deadline_ms"].as_f64().unwrap() < global["ceiling_ms"].as_f64().unwrap(),
        "{h}"
    );
}

/// All-fail-open policies (per key and per route).
const OPEN_CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 100, "refill": 1, "period": "1h"}, "failure_mode": "fail_open"}
  ],
  "plans": {"free": ["default"]}
}"#;

async fn an_unverifiable_key_gets_the_failure_mode_of_every_policy_it_could_match(kind: EdgeKind) {
    let options = EdgeOptions {
        deadline_ms: Some(100),
        ..EdgeOptions::default()
    };
    let s = stack_with(kind, options).await;
    let admin_store = RespStore::connect(&s.redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&admin_store, OPEN_CONFIG).await.unwrap();
    let (_, second) = admin::create_key(&admin_store, "tests", "free", 1_764_000_000)
        .await
        .unwrap();
    let c = client();
    // the configuration and the first key are cached; the second key never was
    let r = c
        .get(format!("{}/warm", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    s.redis.signal("STOP");
    let r = c
        .get(format!("{}/echo", s.edge))
        .bearer_auth(&second)
        .header("X-Floodgate-Key-Id", "spoofed")
        .send()
        .await
        .unwrap();
    let status = r.status();
    let degraded = header(&r, "x-ratelimit-degraded");
    let echo = Echo(r.json().await.unwrap());
    let h = health(&c, &s.edge).await;
    s.redis.signal("CONT");
    assert_eq!(
        status,
        StatusCode::OK,
        "every policy it could match fails open"
    );
    assert_eq!(degraded.as_deref(), Some("fail-open"));
    assert!(
        echo.header("x-floodgate-key-id").is_empty(),
        "an unverified caller reaches the upstream with no identity: {:?}",
        echo.names()
    );
    assert_eq!(h["degraded_requests"]["fail_open"], 1, "{h}");
}

/// A Worker isolate that starts while Redis is stopped: its first request waits
/// for the first configuration read up to the start-up wait, then every request
/// gets its failure mode at once, marked, and its health says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_worker_during_an_outage_marks_and_counts_what_it_answers() {
    let redis = RedisServer::start();
    let secret = seed(&redis, CONFIG).await.secret;
    let upstream = RawUpstream::start().await;
    let endpoint = floodgate_tests::Endpoint::start(&redis, "t0ken").await;
    redis.signal("STOP");
    let worker = floodgate_tests::start_worker(
        &endpoint.url,
        "t0ken",
        &upstream.url,
        &EdgeOptions {
            deadline_ms: None,
            worker_env: vec![("STARTUP_WAIT_MS".into(), "500".into())],
            ..EdgeOptions::default()
        },
    )
    .await;
    let c = client();
    let mut slowest = Duration::ZERO;
    for i in 0..10 {
        let started = Instant::now();
        let r = c
            .get(format!("{}/thing", worker.url))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap();
        if i == 0 {
            let waited = started.elapsed();
            assert!(
                (Duration::from_millis(450)..Duration::from_millis(1_500)).contains(&waited),
                "the first request waits out the start-up wait: {waited:?}"
            );
        } else {
            slowest = slowest.max(started.elapsed());
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            header(&r, "x-ratelimit-degraded").as_deref(),
            Some("fail-closed")
        );
    }
    let h = health(&c, &worker.url).await;
    redis.signal("CONT");
    // counted, not timed (was: slowest < 400 ms, a figure of the machine's
    // load): after the first request only the breaker's threshold of store calls
    // waited a deadline (the first one's, the start-up wait, among them), every
    // other one was kept off the store or health-checked; none was held until
    // the store's transport deadline (10 s over REST, the failure this guards)
    let transport = transport_of(&h);
    eprintln!(
        "fresh Worker, Redis stopped: slowest request after the first {slowest:?}, store calls waited and not: {:?}",
        waits_since(None, &h)
    );
    let (late, off) = waits_since(None, &h);
    let threshold = u64::from(PipelineConfig::default().breaker_threshold);
    assert!((1..=threshold).contains(&late), "{late} waited: {h}");
    assert!(late + off >= 10, "{late} waited, {off} not: {h}");
    assert!(slowest < transport, "waited {slowest:?}");
    assert_eq!(h["breaker"], "open", "{h}");
    assert_eq!(h["degraded_requests"]["fail_closed"], 10, "{h}");
    assert_eq!(upstream.total(), 0);
}

on_both_hosts!(every_limit_is_a_clear_json_refusal_that_reaches_no_upstream);

async fn every_limit_is_a_clear_json_refusal_that_reaches_no_upstream(kind: EdgeKind) {
    // 50 header lines at most: a count hyper (whose own bound is 100 lines
    // natively, see ServerLimits::max_headers) lets through to the edge's check
    let options = EdgeOptions {
        worker_env: vec![("MAX_HEADERS".into(), "50".into())],
        ..EdgeOptions::default()
    };
    let s = stack_with(kind, options).await;
    let c = client();
    let expect = |status: u16, error: &'static str| {
        move |r: reqwest::Response| async move {
            assert_eq!(r.status().as_u16(), status, "{error}");
            assert_eq!(
                header(&r, "content-type").as_deref(),
                Some("application/json")
            );
            let v: serde_json::Value = r.json().await.unwrap();
            assert_eq!(v["error"], error);
        }
    };
    let long = "a".repeat(floodgate_shared::routes::MAX_PATH_LEN + 1);
    let r = c
        .get(format!("{}/{long}", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    expect(414, "Request URI too long")(r).await;
    let r = c
        .get(format!("{}/q?{long}", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    expect(414, "Request URI too long")(r).await;
    // a GET with `n` more header lines
    let lines = |n: usize| {
        let mut many = reqwest::header::HeaderMap::new();
        for i in 0..n {
            many.insert(
                reqwest::header::HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(),
                "v".parse().unwrap(),
            );
        }
        c.get(format!("{}/many", s.edge))
            .bearer_auth(&s.secret)
            .headers(many)
            .send()
    };
    expect(431, "Request headers too large")(lines(60).await.unwrap()).await;
    // past hyper's own bound natively: hyper answers the 431 (without a body)
    let r = lines(120).await.unwrap();
    assert_eq!(r.status().as_u16(), 431);
    if kind == EdgeKind::Worker {
        expect(431, "Request headers too large")(r).await;
    }
    // a declared body over the limit is refused from the head alone (the client
    // here sends only its first bytes, then waits for the answer)
    let (status, body) = raw_exchange(
        &s.edge,
        &format!(
            "POST /big HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\nxxxx",
            s.secret,
            10 * 1024 * 1024 + 1
        ),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains(r#"{"error":"Request body too large"}"#),
        "{body}"
    );
    assert_eq!(
        s.upstream.total(),
        0,
        "no refused request reached the upstream"
    );
    // none of them cost quota
    let r = c
        .get(format!("{}/ok", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(remaining(&r), 99);
}

/// Sends `raw` on a fresh connection to `base` and reads the answer until the
/// connection closes (or 5 s): its status and its text.
async fn raw_exchange(base: &str, raw: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut out = vec![];
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            // the whole answer is in: stop waiting for the close
            Err(_) if !out.is_empty() => break,
            Err(_) => {}
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

on_both_hosts!(
    a_streamed_body_past_the_limit_is_a_413,
    max_body_bytes_0_means_no_limit,
);

/// An 11 MiB body streamed in chunks, no Content-Length.
fn streamed_body() -> reqwest::Body {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..11).map(|_| Ok(vec![b'x'; 1024 * 1024])).collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

/// A streamed (chunked) body that grows past the limit (10 MiB by default) is
/// refused with 413 once it does, on both hosts (issue 21: the Worker checked
/// only a declared Content-Length), and costs no quota.
async fn a_streamed_body_past_the_limit_is_a_413(kind: EdgeKind) {
    let s = stack(kind).await;
    let r = client()
        .post(format!("{}/stream", s.edge))
        .bearer_auth(&s.secret)
        .body(streamed_body())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"], "Request body too large");
    // and the upstream never took a truncated body for a whole one
    assert_eq!(
        s.upstream.complete("/stream"),
        0,
        "a cut upload reached the upstream as complete"
    );
}

/// `MAX_BODY_BYTES=0` is no limit on both hosts (issue 21: it was a 0-byte limit
/// in the Worker): a declared and a streamed 11 MiB body reach the upstream.
async fn max_body_bytes_0_means_no_limit(kind: EdgeKind) {
    let options = EdgeOptions {
        worker_env: vec![("MAX_BODY_BYTES".into(), "0".into())],
        ..EdgeOptions::default()
    };
    let s = stack_with(kind, options).await;
    let c = client();
    let declared = c
        .post(format!("{}/declared", s.edge))
        .bearer_auth(&s.secret)
        .body(vec![b'x'; 11 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(declared.status(), StatusCode::OK);
    let streamed = c
        .post(format!("{}/streamed", s.edge))
        .bearer_auth(&s.secret)
        .body(streamed_body())
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), StatusCode::OK);
    assert_eq!(s.upstream.total(), 2);
}

/// Settings outside their bounds are refused the same way on both hosts
/// (issue 21: the Worker took DEADLINE_MS=0 as a 1 µs deadline and any lease
/// lifetime ≥ 1 s): the Worker answers every request 500 naming the variable and
/// its bounds; floodgate-edge exits naming the flag (`tests/cli_flags.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_refuses_settings_out_of_bounds_naming_them() {
    for (var, value) in [
        ("DEADLINE_MS", "0"),
        ("LEASE_LIFETIME_MS", "50"),
        ("LEASE_LIFETIME_MS", "60001"),
    ] {
        let options = EdgeOptions {
            worker_env: vec![(var.into(), value.into())],
            ..EdgeOptions::default()
        };
        let s = stack_with(EdgeKind::Worker, options).await;
        let r = client()
            .get(format!("{}/any", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 500, "{var}={value}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"], "Floodgate is misconfigured", "{v}");
        let hint = v["hint"].as_str().unwrap_or_default();
        assert!(hint.contains(var), "{var}={value}: {hint}");
        assert_eq!(s.upstream.total(), 0);
    }
}

on_both_hosts!(an_in_flight_slot_is_held_until_the_response_body_is_out);

/// One request in flight per key.
const ONE_IN_FLIGHT: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 100, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed", "max_in_flight": 1}
  ],
  "plans": {"free": ["default"]}
}"#;

async fn an_in_flight_slot_is_held_until_the_response_body_is_out(kind: EdgeKind) {
    let s = stack(kind).await;
    let admin_store = RespStore::connect(&s.redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&admin_store, ONE_IN_FLIGHT)
        .await
        .unwrap();
    let c = client();
    // the head arrives at once, the body a second later
    let first = c
        .get(format!("{}/slow", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let second = c
        .get(format!("{}/other", s.edge))
        .bearer_auth(&s.secret)
        .send()
        .await
        .unwrap();
    assert_eq!(
        second.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the first response's body is still streaming: its slot is held"
    );
    assert_eq!(first.bytes().await.unwrap().as_ref(), b"firstlater");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = c
            .get(format!("{}/third", s.edge))
            .bearer_auth(&s.secret)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            // two admitted (of 100), the refused one refunded
            assert_eq!(remaining(&r), 98);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot comes back once the body is out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
