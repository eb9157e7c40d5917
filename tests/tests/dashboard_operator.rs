//! The dashboard as an operator and an attacker meet it, over HTTP against a real
//! Redis (and the real edge where traffic matters): nobody else's guesses lock the
//! operator out; the backtest at today's limits agrees with the traffic page;
//! every page is whole HTML without JavaScript; errors are typed, with their
//! status; paths with dot segments redirect; keys and the audit log read as people
//! expect; routes named like counter fields count as themselves.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use floodgate_dashboard::error::AppError;
use floodgate_edge::demo_upstream::{self, Seen};
use floodgate_shared::stats::{Counted, Endpoint, Outcome, StatsField, minute_key, ten_second_key};
use floodgate_tests::dash::{
    ADMIN, ADMIN_PASSWORD, Operator, client, post_login_from, search_statuses, set_cookie,
    start_dashboard, start_dashboard_with,
};
use floodgate_tests::{EdgeKind, RedisServer, serve, start_edge};
use serde_json::Value;

fn ip(n: u8) -> Option<IpAddr> {
    Some(IpAddr::from([127, 0, 0, n]))
}

fn signed_in(res: &reqwest::Response) -> bool {
    (res.status().is_success() || res.status().is_redirection())
        && set_cookie(res, "fg_session").is_some()
}

/// Issue 16, item 1: one wrong guess every few seconds for "admin" from anywhere
/// kept the real operator at 429 from any address.
#[tokio::test]
async fn an_attacker_elsewhere_cannot_lock_the_operator_out() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    // the operator signed in before, from 127.0.0.2, and the browser kept its cookie
    let res = post_login_from(&d.url, ip(2), ADMIN, ADMIN_PASSWORD, None).await;
    assert!(signed_in(&res), "{}", res.status());
    let device = set_cookie(&res, "fg_device").expect("a device cookie");
    // an attacker at 127.0.0.3 guesses: 10 attempts a minute per user name from
    // clients that never signed in as it (the operator's first sign-in was one)
    let mut statuses = vec![];
    for _ in 0..14 {
        let res = post_login_from(&d.url, ip(3), ADMIN, "guess-guess-guess", None).await;
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses[..9], [401; 9], "{statuses:?}");
    assert_eq!(statuses[9..], [429; 5], "{statuses:?}");
    // and from 20 more addresses: the user name's bucket for new addresses is empty
    let mut refused = 0;
    for n in 10..30 {
        let res = post_login_from(&d.url, ip(n), ADMIN, "guess-guess-guess", None).await;
        refused += usize::from(res.status() == 429);
    }
    assert_eq!(
        refused, 20,
        "guessing from new addresses is capped per user name"
    );
    // the operator still signs in from the address they used before ...
    let res = post_login_from(&d.url, ip(2), ADMIN, ADMIN_PASSWORD, None).await;
    assert!(
        signed_in(&res),
        "the operator is locked out: {}",
        res.status()
    );
    // ... and from a new address with the browser that signed in before
    let res = post_login_from(&d.url, ip(40), ADMIN, ADMIN_PASSWORD, Some(&device)).await;
    assert!(signed_in(&res), "with the device cookie: {}", res.status());
    // a new address without that browser waits for the bucket (the documented
    // cost); the limiter answers before the password is checked
    let res = post_login_from(&d.url, ip(41), ADMIN, ADMIN_PASSWORD, None).await;
    assert_eq!(res.status(), 429);
    let e: AppError = res.json().await.unwrap();
    assert!(matches!(e, AppError::TooManyAttempts { .. }), "{e:?}");
    // an attacker sharing the operator's address (one NAT) spends that address's
    // attempts; the operator's browser has its own
    for _ in 0..12 {
        post_login_from(&d.url, ip(2), ADMIN, "guess-guess-guess", None).await;
    }
    let res = post_login_from(&d.url, ip(2), ADMIN, ADMIN_PASSWORD, None).await;
    assert_eq!(res.status(), 429, "the shared address is spent");
    let res = post_login_from(&d.url, ip(2), ADMIN, ADMIN_PASSWORD, Some(&device)).await;
    assert!(signed_in(&res), "the operator's browser: {}", res.status());
    // a device cookie is the user's: another name gains nothing from it
    let res = post_login_from(
        &d.url,
        ip(42),
        "mallory",
        "guess-guess-guess",
        Some(&device),
    )
    .await;
    assert_eq!(res.status(), 401);
}

/// The client address comes from the connection; `X-Forwarded-For` counts only
/// from a configured trusted proxy, and then only its nearest untrusted hop.
#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_address_is_the_client() {
    let redis = RedisServer::start();
    let d = start_dashboard_with(&redis, vec!["127.0.0.1/32".parse().unwrap()]).await;
    let login = |from: u8, forwarded: &'static str, password: &'static str| {
        let url = d.url.clone();
        async move {
            floodgate_tests::dash::client_from(ip(from).unwrap())
                .post(format!("{url}/api/login"))
                .header("origin", &url)
                .header("x-forwarded-for", forwarded)
                .form(&[("username", ADMIN), ("password", password)])
                .send()
                .await
                .unwrap()
        }
    };
    // the operator's office (198.51.100.7, through the proxy) signed in before
    assert!(signed_in(&login(1, "198.51.100.7", ADMIN_PASSWORD).await));
    // an attacker behind the same proxy, at 203.0.113.5, who also forges a hop
    let mut statuses = vec![];
    for _ in 0..12 {
        let res = login(1, "198.51.100.7, 203.0.113.5", "guess-guess-guess").await;
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses[10..], [429, 429], "{statuses:?}");
    assert!(
        signed_in(&login(1, "198.51.100.7", ADMIN_PASSWORD).await),
        "the forged left-hand hop is not the client"
    );
    // a client that is not the proxy cannot choose its address with the header
    let mut statuses = vec![];
    for i in 0..11u8 {
        let forged: &'static str = Box::leak(format!("192.0.2.{i}").into_boxed_str());
        statuses.push(
            login(5, forged, "guess-guess-guess")
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses[10], 429, "{statuses:?}");
}

/// Polls the traffic page's data until `done` holds. The edge at `edge` flushes its
/// counters at most once a second, and the Worker only when a request comes (it has
/// no timer of its own): each poll sends it one without an API key, answered 401
/// and counted nowhere.
async fn traffic_until(
    op: &Operator,
    edge: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        nudge(edge).await;
        let t = op
            .json("traffic", &[("range", "15m"), ("resolution", "10s")])
            .await;
        if done(&t) {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: {t}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A request without an API key: the edge answers 401, counts nothing, and flushes
/// what it holds if a flush is due.
async fn nudge(edge: &str) {
    let res = reqwest::get(format!("{edge}/v1/search")).await.unwrap();
    assert_eq!(res.status(), 401);
}

/// The series of `endpoint` (`route:search`, `unmatched`) in the traffic data.
fn series<'a>(t: &'a Value, endpoint: &str) -> Option<&'a Value> {
    t["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e[0] == endpoint)
        .map(|e| &e[1])
}

fn total(t: &Value, endpoint: &str, outcome: &str) -> u64 {
    series(t, endpoint).map_or(0, |s| {
        s[outcome]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .sum()
    })
}

/// The policy form of the demo's `search` limit with `capacity` per `period`.
fn search_policy<'a>(
    version: &'a str,
    capacity: &'a str,
    period: &'a str,
) -> [(&'a str, &'a str); 9] {
    [
        ("version", version),
        ("original", "search"),
        ("name", "search"),
        ("dimensions", "api_key,endpoint"),
        ("capacity", capacity),
        ("period", period),
        ("refill", ""),
        ("cost", ""),
        ("failure_mode", "fail_closed"),
    ]
}

/// Issue 16, item 2: the deny cache's 429s were counted on the traffic page but
/// missing from the sample, so after 100 admitted and 50 throttled requests the
/// backtest at today's limit said "429s now: 1" and replayed 101 requests.
async fn the_backtest_at_todays_limits_agrees_with_the_traffic_page(kind: EdgeKind) {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let (upstream, _stop) = serve(demo_upstream::router(Seen::default())).await;
    let edge = start_edge(kind, &redis, &upstream, 200).await;
    let op = Operator::sign_in(&d.url).await;
    let key = op
        .json("create_key", &[("label", "load"), ("plan", "free")])
        .await;
    let secret = key["secret"].as_str().unwrap();
    // /v1/search allows 100 a minute per key, refilling one token each 0.6 s: a
    // slow machine may see one more admitted while the 150 requests run
    let started = Instant::now();
    let got = search_statuses(&edge.url, secret, 150).await;
    let refilled = (started.elapsed().as_secs_f64() / 0.6).ceil() as usize;
    let admitted = got.iter().filter(|s| **s == 200).count();
    assert!(
        (100..=100 + refilled).contains(&admitted),
        "{admitted} admitted"
    );
    assert_eq!(got.iter().filter(|s| **s == 429).count(), 150 - admitted);
    let t = traffic_until(&op, &edge.url, "150 decisions on the traffic page", |t| {
        total(t, "route:search", "allowed") + total(t, "route:search", "throttled") == 150
    })
    .await;
    let (allowed, throttled) = (
        total(&t, "route:search", "allowed"),
        total(&t, "route:search", "throttled"),
    );
    assert_eq!(
        (allowed, throttled),
        (admitted as u64, 150 - admitted as u64)
    );
    // the backtest of today's limit itself (unchanged: 100 per minute)
    let version = op.version().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        nudge(&edge.url).await;
        let mut form = search_policy(&version, "100", "1m").to_vec();
        form.push(("preview", "1"));
        let v = op.json("save_policy", &form).await;
        let row = v["Preview"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["endpoint"] == "route:search")
            .cloned();
        if let Some(r) = row.filter(|r| r["requests"] == 150) {
            assert_eq!(v["Preview"]["dropped"], 0, "{v}");
            break r;
        }
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(row["requests"], allowed + throttled, "{row}");
    assert_eq!(row["observed"], throttled, "what the edge answered: {row}");
    assert_eq!(
        row["throttled_now"], throttled,
        "replayed at today's limit: {row}"
    );
    assert_eq!(row["throttled"], throttled, "the unchanged proposal: {row}");
}

#[tokio::test]
async fn the_backtest_at_todays_limits_agrees_with_the_traffic_page_native() {
    the_backtest_at_todays_limits_agrees_with_the_traffic_page(EdgeKind::Native).await;
}

#[tokio::test]
async fn the_backtest_at_todays_limits_agrees_with_the_traffic_page_worker() {
    the_backtest_at_todays_limits_agrees_with_the_traffic_page(EdgeKind::Worker).await;
}

/// Routes are operators' names: `mode`, `lat`, `key` and `_` are legal and must
/// count as themselves, apart from unmatched traffic.
#[tokio::test]
async fn routes_named_like_counter_fields_count_as_themselves() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let store =
        floodgate_edge::store::resp::RespStore::connect(&redis.url(), Duration::from_secs(2))
            .await
            .unwrap();
    floodgate_edge::admin::set_config(
        &store,
        r#"{"policies":[{"name":"default","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed"}],
            "plans":{"free":["default"]},
            "routes":[{"name":"mode","pattern":"/m","policies":[]},{"name":"lat","pattern":"/l","policies":[]},
                      {"name":"key","pattern":"/k","policies":[]},{"name":"_","pattern":"/u","policies":[]}]}"#,
    )
    .await
    .unwrap();
    let (upstream, _stop) = serve(demo_upstream::router(Seen::default())).await;
    let edge = start_edge(EdgeKind::Native, &redis, &upstream, 200).await;
    let op = Operator::sign_in(&d.url).await;
    let key = op
        .json("create_key", &[("label", "names"), ("plan", "free")])
        .await;
    let secret = key["secret"].as_str().unwrap().to_string();
    let http = reqwest::Client::new();
    for (path, n) in [("/m", 1), ("/l", 2), ("/k", 3), ("/u", 4), ("/nowhere", 5)] {
        for _ in 0..n {
            let res = http
                .get(format!("{}{path}", edge.url))
                .bearer_auth(&secret)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200, "{path}");
        }
    }
    let t = traffic_until(&op, &edge.url, "15 decisions", |t| {
        [
            "route:mode",
            "route:lat",
            "route:key",
            "route:_",
            "unmatched",
        ]
        .iter()
        .map(|e| total(t, e, "allowed"))
        .sum::<u64>()
            == 15
    })
    .await;
    for (e, n) in [
        ("route:mode", 1),
        ("route:lat", 2),
        ("route:key", 3),
        ("route:_", 4),
        ("unmatched", 5),
    ] {
        assert_eq!(total(&t, e, "allowed"), n, "{e}: {t}");
    }
    assert_eq!(t["degraded_by_mode"], serde_json::json!([]), "{t}");
    // the page names them by pattern and route, and unmatched traffic one way
    let (_, html) = op.page("/").await;
    assert!(html.contains("/u (route _)"), "{html}");
    assert!(html.contains("Unmatched paths (no route)"));
    assert!(!html.contains("(no route)</h2><h2>_"));
}

/// Writes traffic counters as the edge would, for pages to show.
fn seed_traffic(redis: &RedisServer) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut conn = redis.connection();
    for (outcome, n) in [(Outcome::Allowed, 7), (Outcome::Throttled, 3)] {
        let field =
            StatsField::Endpoint(Endpoint::Route("search".into()), Counted::Outcome(outcome));
        for key in [minute_key(now / 60), ten_second_key(now / 10)] {
            let _: () = redis::cmd("HINCRBY")
                .arg(&key)
                .arg(field.to_string())
                .arg(n)
                .query(&mut conn)
                .unwrap();
        }
    }
}

/// Issue 16, item 3: the server streamed "Loading…" and put the content in
/// `<template>` chunks only a script swaps in (intermittently on /policies too).
#[tokio::test]
async fn every_page_is_whole_in_the_html_and_forms_work_as_plain_posts() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let key = op
        .json("create_key", &[("label", "plain html"), ("plan", "free")])
        .await;
    let id = key["id"].as_str().unwrap().to_string();
    seed_traffic(&redis);
    let key_row = format!("data-key=\"{id}\"");
    let pages = [
        (
            "/",
            vec![
                "id=\"totals\"",
                "data-route=\"search\"",
                "requests per 10 s",
            ],
        ),
        (
            "/policies",
            vec![
                "data-policy=\"search\"",
                "data-plan=\"free\"",
                "/v1/checkout",
            ],
        ),
        ("/keys", vec![key_row.as_str(), "plain html", "UTC"]),
        ("/audit", vec!["create key", "UTC", "<time datetime="]),
    ];
    for (path, wanted) in &pages {
        // several times: streaming made this intermittent
        for _ in 0..5 {
            let (status, html) = op.page(path).await;
            assert_eq!(status, 200, "{path}");
            assert!(
                !html.contains("<template"),
                "{path} streams template chunks"
            );
            assert!(!html.contains("Loading…"), "{path} sends a placeholder");
            for w in wanted {
                assert!(html.contains(w), "{path} lacks {w}");
            }
        }
    }
    // a plain form post (no JavaScript: Accept text/html, no JSON): a bad field
    // comes back to the page, next to its field
    let plain_post = |version: String, name: &'static str| {
        let op = &op;
        async move {
            op.http
                .post(format!("{}/api/save_plan", op.url))
                .header("origin", &op.url)
                .header("cookie", &op.cookie)
                .header("accept", "text/html")
                .header("referer", format!("{}/policies", op.url))
                .form(&[
                    ("csrf", op.csrf.as_str()),
                    ("version", &version),
                    ("original", ""),
                    ("name", name),
                    ("policies", "default"),
                ])
                .send()
                .await
                .unwrap()
        }
    };
    let res = plain_post(op.version().await, "Bad Name").await;
    assert!(res.status().is_redirection(), "{}", res.status());
    let back = res.headers()["location"].to_str().unwrap().to_string();
    assert!(
        back.contains("/policies?") && back.contains("__err="),
        "{back}"
    );
    let path = back.trim_start_matches(&d.url);
    let (status, html) = op.page(path).await;
    assert_eq!(status, 200);
    assert!(
        html.contains("data-field=\"name\""),
        "the error is next to the field: {html}"
    );
    // and a good one is saved
    let version = op.version().await;
    let res = plain_post(version.clone(), "gold").await;
    assert!(res.status().is_redirection());
    assert_ne!(op.version().await, version, "saved without JavaScript");
}

/// A GET of `path` exactly as written (no client-side normalization of `..`).
async fn raw_get(url: &str, path: &str, cookie: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{cookie}Connection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = vec![];
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the dashboard answers")
        .unwrap();
    let out = String::from_utf8_lossy(&out).into_owned();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, out)
}

fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    response
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
}

/// Issue 16, items 4 and 5: a signed-out page showed the deserializer's text, an
/// outage raw JSON; `/pkg/../keys` rendered the signed-in layout; a write without
/// `csrf` was a 500; `/favicon.ico` was a 404.
#[tokio::test]
async fn errors_are_typed_pages_never_show_raw_json_and_paths_are_plain() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    // server functions without a session: 401 with a typed error the page can read
    let dead = format!("fg_session={}", "ab".repeat(32));
    for cookie in [None, Some(dead.as_str())] {
        let mut req = client()
            .post(format!("{}/api/traffic", d.url))
            .header("origin", &d.url);
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401);
        assert!(res.headers().contains_key("serverfnerror"));
        let e: AppError = res.json().await.unwrap();
        assert_eq!(e, AppError::SignedOut);
    }
    // a page with a session that ended: to sign-in, saying so, the cookie cleared
    let res = client()
        .get(format!("{}/keys", d.url))
        .header("cookie", &dead)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()["location"], "/login?session=ended");
    assert!(set_cookie(&res, "fg_session").is_some_and(|c| c == "fg_session="));
    let login = client()
        .get(format!("{}/login?session=ended", d.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(login.contains("Your session has ended"), "{login}");
    // a form post without the csrf field: refused as such, not a 500
    let (status, v) = op
        .answer(
            "save_plan",
            &[
                ("csrf", ""),
                ("version", ""),
                ("original", ""),
                ("name", "x"),
                ("policies", "default"),
            ],
        )
        .await;
    assert_eq!(status, 403, "{v}");
    assert!(v["Forbidden"].as_str().unwrap().contains("CSRF"), "{v}");
    let res = op
        .http
        .post(format!("{}/api/save_plan", d.url))
        .header("origin", &d.url)
        .header("cookie", &op.cookie)
        .form(&[
            ("version", ""),
            ("original", ""),
            ("name", "x"),
            ("policies", ""),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403, "no csrf field at all");
    // dot segments: redirected to the plain path, which then needs a session
    for path in ["/pkg/../keys", "/pkg/%2e%2e/keys", "//keys"] {
        for cookie in [None, Some(op.cookie.as_str())] {
            let (status, response) = raw_get(&d.url, path, cookie).await;
            assert_eq!(status, 308, "{path}: {response}");
            assert_eq!(header(&response, "location"), Some("/keys"), "{path}");
        }
    }
    let (status, response) = raw_get(&d.url, "/keys", None).await;
    assert_eq!(
        (status, header(&response, "location")),
        (303, Some("/login"))
    );
    // the favicon, named by every page
    let res = client()
        .get(format!("{}/favicon.ico", d.url))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "image/x-icon");
    assert_eq!(
        &res.bytes().await.unwrap()[..4],
        &[0, 0, 1, 0],
        "an ICO file"
    );
    let (_, html) = op.page("/").await;
    assert!(html.contains("rel=\"icon\""));
    // the store goes away: pages say so in HTML, server functions with a typed 503
    let mut redis = redis;
    redis.signal("KILL");
    assert!(redis.wait_exit(Duration::from_secs(10)));
    let (status, html) = op.page("/").await;
    assert_eq!(status, 503);
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(
        html.contains("id=\"outage\"") && html.contains("Redis"),
        "{html}"
    );
    assert!(!html.contains("{\""), "no raw JSON: {html}");
    let (status, v) = op.answer("config", &[]).await;
    assert_eq!(status, 503);
    let e: AppError = serde_json::from_value(v).unwrap();
    assert!(matches!(e, AppError::Unavailable(_)), "{e:?}");
    redis.restart();
}

/// Issue 16, item 7: labels only in an edit box, no dates, revoke in one click, a
/// revoked key still editable.
#[tokio::test]
async fn keys_show_when_made_and_last_used_and_revoking_is_confirmed_and_final() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let (upstream, _stop) = serve(demo_upstream::router(Seen::default())).await;
    let edge = start_edge(EdgeKind::Native, &redis, &upstream, 200).await;
    let op = Operator::sign_in(&d.url).await;
    let before = floodgate_dashboard::time::now_secs();
    let key = op
        .json("create_key", &[("label", "acme"), ("plan", "free")])
        .await;
    let (id, secret) = (key["id"].as_str().unwrap(), key["secret"].as_str().unwrap());
    assert_eq!(search_statuses(&edge.url, secret, 3).await, [200; 3]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let keys = op.json("keys", &[]).await;
        let row = keys[0].clone();
        if row["last_used"].is_i64() && row["allowed"] == 3 {
            break row;
        }
        assert!(Instant::now() < deadline, "{keys}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let after = floodgate_dashboard::time::now_secs();
    assert_eq!(row["label"], "acme");
    let created = row["created"].as_i64().unwrap();
    let used = row["last_used"].as_i64().unwrap();
    assert!((before..=after).contains(&created), "{row}");
    assert!(used >= created && used <= after, "{row}");
    let (_, html) = op.page("/keys").await;
    assert!(
        html.contains("<td class=\"label\">acme</td>"),
        "a label column"
    );
    assert!(html.contains(&crate_utc(created)), "the creation time");
    // revoking needs the confirmation
    let v = op.refused("revoke_key", &[("id", id)]).await;
    assert_eq!(v["Invalid"]["field"], "confirm", "{v}");
    assert_eq!(op.json("keys", &[]).await[0]["revoked"], false);
    let v = op
        .json("revoke_key", &[("id", id), ("confirm", "yes")])
        .await;
    assert!(v["Ok"].is_string(), "{v}");
    // a revoked key is read-only
    let v = op
        .refused(
            "update_key",
            &[("id", id), ("label", "renamed"), ("plan", "free")],
        )
        .await;
    assert_eq!(v["Invalid"]["field"], "id", "{v}");
    let keys = op.json("keys", &[]).await;
    assert_eq!(
        (keys[0]["label"].as_str(), keys[0]["revoked"].as_bool()),
        (Some("acme"), Some(true))
    );
    let (_, html) = op.page("/keys").await;
    assert!(
        !html.contains("class=\"edit-key\""),
        "no edit form for a revoked key"
    );
    assert!(!html.contains("class=\"revoke-key\""));
}

fn crate_utc(secs: i64) -> String {
    floodgate_dashboard::time::utc(secs)
}

/// Issue 16, item 8: raw JSON blobs and Unix timestamps; errors in the internal
/// form (`routes[0].policies: no policy is named "search"`).
#[tokio::test]
async fn the_audit_log_reads_who_what_when_and_the_fields_changed() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let version = op.version().await;
    let v = op
        .json("save_policy", &search_policy(&version, "5", "1h"))
        .await;
    assert!(v["Ok"].is_string(), "{v}");
    let (_, html) = op.page("/audit").await;
    let html = html.replace("<!>", ""); // hydration markers between text nodes
    assert!(html.contains("quota.capacity</code>: 100 → 5"), "{html}");
    assert!(html.contains("quota.period</code>: 1m → 1h"));
    assert!(html.contains(" UTC</time>"));
    assert!(
        !html.contains("{&quot;name&quot;") && !html.contains("{\"name\""),
        "no raw JSON"
    );
    // deleting a policy a route uses: the error names the route, as the page does
    let v = op
        .refused(
            "delete_policy",
            &[("version", &op.version().await), ("name", "search")],
        )
        .await;
    assert_eq!(v["Invalid"]["label"], "Route \"search\", limits", "{v}");
    assert_eq!(
        v["Invalid"]["message"], "still uses the limit \"search\": take it out there first",
        "{v}"
    );
}
