//! Forward-auth mode end to end behind a REAL Caddy (`forward_auth`): the client
//! talks to Caddy, Caddy asks the edge (`floodgate-edge --forward-auth`, in
//! process) about each request and proxies the admitted ones to a raw upstream
//! that echoes what it received. Also the edge's own answers to malformed auth
//! requests and Envoy's path-prefix convention, and nginx `auth_request` with the
//! README's `error_page` workaround.

use std::time::Duration;

use floodgate_edge::forward_auth::ForwardAuth;
use floodgate_edge::native_host::{HostConfig, NativeStore};
use floodgate_edge::pipeline::{Pipeline, PipelineConfig, store_deadline};
use floodgate_shared::contract::DENIED_BODY;
use floodgate_tests::gateway::Gateway;
use floodgate_tests::upstream::{Echo, RawUpstream};
use floodgate_tests::{DEMO_CONFIG, RedisServer, Seeded, seed, serve_native};
use reqwest::StatusCode;

struct Stack {
    _redis: RedisServer,
    upstream: RawUpstream,
    /// The edge's auth port (what the gateway calls).
    edge: String,
    key: Seeded,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Redis with the demo configuration (`/v1/checkout` 10/min per key, 1,000/min
/// per key elsewhere) and one key, the edge in forward-auth mode, the upstream.
async fn stack() -> Stack {
    let redis = RedisServer::start();
    let key = seed(&redis, DEMO_CONFIG).await;
    let deadline = Duration::from_secs(2);
    let store =
        floodgate_edge::store::resp::RespStore::connect(&redis.url(), store_deadline(deadline))
            .await
            .expect("connect to redis");
    let settings = PipelineConfig {
        deadline: floodgate_edge::deadline::DeadlineSettings::fixed(deadline.as_micros() as i64),
        ..PipelineConfig::default()
    };
    let pipeline = Pipeline::new(
        NativeStore::Resp(store),
        floodgate_shared::time::SystemClock,
        settings,
    );
    let (edge, stop) =
        serve_native(pipeline, HostConfig::forward_auth(ForwardAuth::default())).await;
    Stack {
        _redis: redis,
        upstream: RawUpstream::start().await,
        edge,
        key,
        _stop: stop,
    }
}

fn authority(url: &str) -> &str {
    url.trim_start_matches("http://")
}

const QUOTA_HEADERS: [&str; 3] = [
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
];

/// Caddy as the README configures it: `forward_auth` copies the identity and the
/// quota headers into the request, `header` shows the quota to the client.
fn caddy(s: &Stack) -> Gateway {
    let copied = QUOTA_HEADERS
        .iter()
        .map(|h| format!("\t\theader {h} {{http.request.header.{h}}}\n"))
        .collect::<String>();
    Gateway::caddy(&format!(
        "\troute {{\n\t\tforward_auth {edge} {{\n\t\t\turi /\n\t\t\tcopy_headers X-Floodgate-Key-Id {quota}\n\t\t}}\n{copied}\t\treverse_proxy {up}\n\t}}",
        edge = authority(&s.edge),
        quota = QUOTA_HEADERS.join(" "),
        up = authority(&s.upstream.url),
    ))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(32)
        .build()
        .unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_admits_exactly_the_quota_of_the_original_path_and_returns_the_429_unchanged() {
    let s = stack().await;
    let gw = caddy(&s);
    let c = client();
    // 14 at once on /v1/checkout (10/min per key); the auth request's own path is /
    let sent = (0..14).map(|_| {
        c.get(format!("{}/v1/checkout?cart=7", gw.url))
            .bearer_auth(&s.key.secret)
            .header("X-Floodgate-Key-Id", "spoofed")
            .send()
    });
    let answers = futures_util::future::join_all(sent).await;
    let (mut ok, mut limited) = (0, 0);
    for r in answers {
        let r = r.expect("caddy answers");
        match r.status() {
            StatusCode::OK => {
                ok += 1;
                assert_eq!(header(&r, "X-RateLimit-Limit").as_deref(), Some("10"));
                let remaining: u64 = header(&r, "X-RateLimit-Remaining")
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(remaining < 10);
                let echo = Echo(r.json().await.unwrap());
                assert_eq!(echo.0["target"], "/v1/checkout?cart=7");
                // the identity the edge answered, never the client's spoofed one
                assert_eq!(
                    echo.header("X-Floodgate-Key-Id"),
                    std::slice::from_ref(&s.key.key_id)
                );
            }
            StatusCode::TOO_MANY_REQUESTS => {
                limited += 1;
                assert_eq!(header(&r, "X-RateLimit-Limit").as_deref(), Some("10"));
                assert_eq!(header(&r, "X-RateLimit-Remaining").as_deref(), Some("0"));
                let reset: u64 = header(&r, "X-RateLimit-Reset").unwrap().parse().unwrap();
                let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
                assert!(
                    (1..=60).contains(&retry) && retry <= reset,
                    "{retry} {reset}"
                );
                assert!(
                    header(&r, "Content-Type")
                        .unwrap()
                        .starts_with("application/json")
                );
                assert_eq!(r.text().await.unwrap(), DENIED_BODY);
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((ok, limited), (10, 4));
    // the upstream saw the admitted requests only
    assert_eq!(s.upstream.total(), 10);
    assert_eq!(s.upstream.path("/v1/checkout"), 10);
    // another path of the same key: its own quota (1,000/min), still open
    let r = c
        .post(format!("{}/v1/items", gw.url))
        .bearer_auth(&s.key.secret)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "X-RateLimit-Limit").as_deref(), Some("1000"));
    // the key's plan-wide bucket holds every admitted request (10 + this one), and
    // none of the four refused
    assert_eq!(header(&r, "X-RateLimit-Remaining").as_deref(), Some("989"));
    let echo = Echo(r.json().await.unwrap());
    assert_eq!(echo.0["method"], "POST");
    assert_eq!(s.upstream.total(), 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_returns_the_edges_401_and_the_upstream_never_sees_the_request() {
    let s = stack().await;
    let gw = caddy(&s);
    let c = client();
    let missing = c
        .get(format!("{}/v1/checkout", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["error"], "Missing API key");
    let wrong = c
        .get(format!("{}/v1/checkout", gw.url))
        .bearer_auth("fg_this_key_does_not_exist_at_all")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(s.upstream.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_requests_without_the_original_request_get_400_and_cost_no_quota() {
    let s = stack().await;
    let c = client();
    let ask = |headers: &[(&str, &str)]| {
        let mut r = c.get(format!("{}/", s.edge)).bearer_auth(&s.key.secret);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send()
    };
    for (headers, named) in [
        (vec![], "x-forwarded-method"),
        (vec![("X-Forwarded-Method", "GET")], "x-forwarded-uri"),
        (
            vec![
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "v1/checkout"),
            ],
            "x-forwarded-uri",
        ),
        (
            vec![
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/v1/checkout"),
                ("X-Forwarded-For", "nobody"),
            ],
            "x-forwarded-for",
        ),
    ] {
        for _ in 0..6 {
            let r = ask(&headers).await.unwrap();
            assert_eq!(r.status(), StatusCode::BAD_REQUEST);
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["error"], "Bad forward-auth request");
            assert!(body["hint"].as_str().unwrap().contains(named), "{body}");
        }
    }
    // none of the 24 was counted: the whole quota of /v1/checkout is left
    let r = ask(&[
        ("X-Forwarded-Method", "GET"),
        ("X-Forwarded-Uri", "/v1/checkout"),
    ])
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "X-RateLimit-Remaining").as_deref(), Some("9"));
    assert_eq!(
        header(&r, "X-Floodgate-Key-Id").as_deref(),
        Some(s.key.key_id.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_path_prefix_decides_the_original_path() {
    let s = stack().await;
    let c = client();
    let mut statuses = vec![];
    for _ in 0..11 {
        // Envoy ext_authz HTTP: path_prefix /ext-authz + the original path
        let r = c
            .post(format!("{}/ext-authz/v1/checkout?cart=1", s.edge))
            .bearer_auth(&s.key.secret)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            assert_eq!(header(&r, "X-RateLimit-Limit").as_deref(), Some("10"));
            assert_eq!(
                header(&r, "X-Floodgate-Key-Id").as_deref(),
                Some(s.key.key_id.as_str())
            );
        }
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [[200; 10].as_slice(), &[429]].concat());
}

/// nginx `auth_request` passes only 2xx, 401 and 403 (anything else becomes a
/// 500): the README's workaround answers the edge's 429 from a named location.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_with_the_error_page_workaround_returns_the_429() {
    let s = stack().await;
    let gw = Gateway::nginx(&format!(
        r#"
  location = /_floodgate {{
    internal;
    proxy_pass http://{edge}/;
    proxy_pass_request_body off;
    proxy_set_header Content-Length "";
    proxy_set_header X-Forwarded-Method $request_method;
    proxy_set_header X-Forwarded-Uri $request_uri;
    proxy_set_header X-Forwarded-Host $host;
    proxy_set_header X-Forwarded-For $remote_addr;
  }}
  location @floodgate_denied {{
    default_type application/json;
    if ($fg_status != 429) {{
      return 503 '{{"error":"Rate limiter unavailable"}}';
    }}
    add_header Retry-After $fg_retry_after always;
    add_header X-RateLimit-Limit $fg_limit always;
    add_header X-RateLimit-Remaining $fg_remaining always;
    add_header X-RateLimit-Reset $fg_reset always;
    return 429 '{{"error":"Rate limit exceeded"}}';
  }}
  location / {{
    auth_request /_floodgate;
    auth_request_set $fg_status $upstream_status;
    auth_request_set $fg_key_id $upstream_http_x_floodgate_key_id;
    auth_request_set $fg_retry_after $upstream_http_retry_after;
    auth_request_set $fg_limit $upstream_http_x_ratelimit_limit;
    auth_request_set $fg_remaining $upstream_http_x_ratelimit_remaining;
    auth_request_set $fg_reset $upstream_http_x_ratelimit_reset;
    error_page 500 = @floodgate_denied;
    add_header X-RateLimit-Limit $fg_limit always;
    add_header X-RateLimit-Remaining $fg_remaining always;
    add_header X-RateLimit-Reset $fg_reset always;
    proxy_set_header X-Floodgate-Key-Id $fg_key_id;
    proxy_pass http://{up};
  }}"#,
        edge = authority(&s.edge),
        up = authority(&s.upstream.url),
    ));
    let c = client();
    let mut statuses = vec![];
    for _ in 0..12 {
        let r = c
            .get(format!("{}/v1/checkout", gw.url))
            .bearer_auth(&s.key.secret)
            .send()
            .await
            .unwrap();
        let status = r.status();
        statuses.push(status.as_u16());
        assert_eq!(header(&r, "X-RateLimit-Limit").as_deref(), Some("10"));
        if status == StatusCode::OK {
            let echo = Echo(r.json().await.unwrap());
            assert_eq!(
                echo.header("X-Floodgate-Key-Id"),
                std::slice::from_ref(&s.key.key_id)
            );
        } else {
            let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
            assert!((1..=60).contains(&retry));
            assert_eq!(header(&r, "X-RateLimit-Remaining").as_deref(), Some("0"));
            assert_eq!(r.text().await.unwrap(), DENIED_BODY);
        }
    }
    assert_eq!(statuses, [[200; 10].as_slice(), &[429, 429]].concat());
    assert_eq!(s.upstream.total(), 10);
    // a 401 passes auth_request as it is
    let r = c
        .get(format!("{}/v1/checkout", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(s.upstream.total(), 10);
}

/// A request admitted without an identity (here the limiter is off; in production
/// a fail-open policy while keys cannot be verified) must not reach the upstream
/// with a client-sent identity. Caddy 2.6's `copy_headers` keeps the client's
/// header when the auth answer lacks it, so the edge always sends one, empty here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_replaces_a_spoofed_identity_when_the_edge_has_none() {
    let s = stack().await;
    let store =
        floodgate_edge::store::resp::RespStore::connect(&s._redis.url(), Duration::from_secs(2))
            .await
            .unwrap();
    let pipeline = Pipeline::new(
        NativeStore::Resp(store),
        floodgate_shared::time::SystemClock,
        PipelineConfig::default(),
    );
    let mut host = HostConfig::forward_auth(ForwardAuth::default());
    host.limiter = false;
    let (edge, _stop) = serve_native(pipeline, host).await;
    let unlimited = Stack {
        edge,
        _redis: RedisServer::start(),
        upstream: RawUpstream::start().await,
        key: Seeded {
            secret: String::new(),
            key_id: String::new(),
        },
        _stop: tokio::sync::oneshot::channel().0,
    };
    let gw = caddy(&unlimited);
    let r = client()
        .get(format!("{}/v1/items", gw.url))
        .header("X-Floodgate-Key-Id", "spoofed")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let echo = Echo(r.json().await.unwrap());
    assert_eq!(echo.header("X-Floodgate-Key-Id"), [""]);
    drop(s);
}

/// Caddy copying the key's identity and metadata too (as docs/forward-auth.md
/// shows): the upstream gets the edge's values and never the client's, and
/// empty ones for a key that has neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_forwards_the_keys_identity_and_metadata_and_never_the_clients() {
    let s = stack().await;
    let store =
        floodgate_edge::store::resp::RespStore::connect(&s._redis.url(), Duration::from_secs(2))
            .await
            .unwrap();
    let new = floodgate_shared::keychanges::KeyChanges {
        plan: Some("free".into()),
        identity: Some(Some("cus_42".into())),
        metadata: Some(Some(serde_json::json!({"tier": "gold"}))),
        ..Default::default()
    };
    let (record, secret) = floodgate_edge::admin::create_key_with(&store, &new, 1_764_000_000)
        .await
        .unwrap();
    let gw = Gateway::caddy(&format!(
        "\troute {{\n\t\tforward_auth {edge} {{\n\t\t\turi /\n\t\t\tcopy_headers X-Floodgate-Key-Id X-Floodgate-Identity X-Floodgate-Key-Meta\n\t\t}}\n\t\treverse_proxy {up}\n\t}}",
        edge = authority(&s.edge),
        up = authority(&s.upstream.url),
    ));
    let seen = |secret: String| {
        let url = format!("{}/v1/items", gw.url);
        async move {
            let r = client()
                .get(url)
                .bearer_auth(secret)
                .header("X-Floodgate-Identity", "spoofed")
                .header("X-Floodgate-Key-Meta", r#"{"tier":"platinum"}"#)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            Echo(r.json().await.unwrap())
        }
    };
    let echo = seen(secret).await;
    assert_eq!(echo.header("X-Floodgate-Key-Id"), [record.id]);
    assert_eq!(echo.header("X-Floodgate-Identity"), ["cus_42"]);
    assert_eq!(echo.header("X-Floodgate-Key-Meta"), [r#"{"tier":"gold"}"#]);
    let plain = seen(s.key.secret.clone()).await;
    assert_eq!(plain.header("X-Floodgate-Identity"), [""]);
    assert_eq!(plain.header("X-Floodgate-Key-Meta"), [""]);
}
