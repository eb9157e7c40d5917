//! Prometheus metrics as a scraper sees them (real processes, real Redis): the
//! native edge's `/__floodgate/metrics`, floodgate-rest's `--metrics-listen`, and
//! the dashboard's fleet totals at `/metrics`. Every scrape is checked by promtool
//! (`check metrics`) and parsed by the `prometheus-parse` crate; values must move
//! with traffic, and a scrape during a Redis outage answers with the outage in it.
//! The example alert rules pass `promtool check rules`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use floodgate_tests::process::{Daemon, listening};
use floodgate_tests::scale::LatencyProxy;
use floodgate_tests::{RedisServer, free_port, seed};

/// `tight`: 3 requests a minute per key on /v1/tight; everything else 1000.
const CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 1000, "period": "1m"}, "failure_mode": "fail_closed"},
    {"name": "tight", "dimensions": ["api_key", "endpoint"], "quota": {"capacity": 3, "period": "1m"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"free": ["default"]},
  "routes": [{"name": "tight", "pattern": "/v1/tight", "policies": ["tight"]}]
}"#;

fn promtool() -> &'static str {
    let ok = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "promtool is missing: install Debian's `prometheus` package (scripts/test does)"
    );
    "promtool"
}

/// promtool's own parser accepts the scrape, and its linter finds nothing but
/// what the OpenMetrics naming implies: a counter's samples end in `_total` while
/// its HELP names the family (`# HELP floodgate_decisions` for
/// `floodgate_decisions_total`), which the Prometheus text linter reads as "no
/// help text".
fn promtool_accepts(text: &str) {
    use std::io::Write;
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // 0: clean, 3: lint problems only (1: the text does not parse)
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "promtool check metrics: {said}\n{text}"
    );
    for problem in said.lines().filter(|l| !l.trim().is_empty()) {
        let family = problem
            .strip_suffix(" no help text")
            .and_then(|name| name.strip_suffix("_total"));
        assert!(
            family.is_some_and(|f| text.contains(&format!("# HELP {f} "))),
            "promtool check metrics: {problem}\n{text}"
        );
    }
}

/// One scrape, parsed.
struct Scrape {
    text: String,
    parsed: prometheus_parse::Scrape,
}

impl Scrape {
    /// The value of the sample `name` whose labels include `labels` (`None`: no
    /// such sample).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.parsed
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .find_map(|s| match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => Some(*v),
                _ => None,
            })
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no {name}{labels:?} in\n{}", self.text))
    }

    /// The cumulative bucket counts of histogram `name` (`le` → count).
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        self.parsed
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .find_map(|s| match &s.value {
                prometheus_parse::Value::Histogram(h) => {
                    Some(h.iter().map(|b| (b.less_than, b.count)).collect())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no histogram {name} in\n{}", self.text))
    }
}

async fn scrape(url: &str) -> Scrape {
    scrape_timed(url).await.0
}

/// One scrape, parsed, and how long its HTTP exchange took: the answer, not
/// promtool's check and the parse after it (a subprocess, whose start on a
/// loaded machine took the old timing of the whole past its bounds).
async fn scrape_timed(url: &str) -> (Scrape, Duration) {
    let started = Instant::now();
    let r = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap_or_else(|e| panic!("scrape {url}: {e}"));
    assert_eq!(r.status(), 200, "{url}");
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let text = r.text().await.unwrap();
    let took = started.elapsed();
    promtool_accepts(&text);
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    (Scrape { text, parsed }, took)
}

/// Scrapes until `done` holds (at most 15 s; edges count admitted requests once
/// their answer is out, and flush to Redis each second).
async fn scrape_until(url: &str, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = scrape(url).await;
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: never so in\n{}", s.text);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn the_example_alert_rules_pass_promtool() {
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/prometheus/alerts.yml"
    );
    let out = Command::new(promtool())
        .args(["check", "rules", rules])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("SUCCESS: 6 rules found"), "{said}");
}

struct Stack {
    redis: RedisServer,
    secret: String,
    edge: Daemon,
    edge_url: String,
    _upstream: Daemon,
}

async fn stack() -> Stack {
    let redis = RedisServer::start();
    let secret = seed(&redis, CONFIG).await.secret;
    let (upstream, up_listen) = listening("floodgate-demo-upstream", &[], &[]);
    let (edge, listen) = listening(
        "floodgate-edge",
        &[
            "--upstream",
            &format!("http://{up_listen}"),
            "--redis",
            &redis.url(),
            "--deadline-ms",
            "500",
            "--breaker-threshold",
            "3",
        ],
        &[],
    );
    Stack {
        redis,
        secret,
        edge,
        edge_url: format!("http://{listen}"),
        _upstream: upstream,
    }
}

/// Sends `n` requests to `path`; their statuses.
async fn traffic(s: &Stack, path: &str, n: usize) -> Vec<u16> {
    let client = reqwest::Client::new();
    let mut statuses = vec![];
    for _ in 0..n {
        let r = client
            .get(format!("{}{path}", s.edge_url))
            .bearer_auth(&s.secret)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    statuses
}

const DECISIONS: &str = "floodgate_decisions_total";
const BY_POLICY: &str = "floodgate_policy_decisions_total";

/// Which policy decided what on /v1/tight (the plan's `default` and the route's
/// `tight` both apply there) and elsewhere, as `metric` counts it.
fn assert_policy_decisions(m: &Scrape, metric: &str) {
    let by = |policy, route, outcome| {
        m.value(
            metric,
            &[("policy", policy), ("route", route), ("outcome", outcome)],
        )
    };
    assert_eq!(by("tight", "tight", "allowed"), Some(3.0));
    assert_eq!(by("tight", "tight", "throttled"), Some(2.0), "tight denied");
    assert_eq!(by("default", "tight", "allowed"), Some(3.0));
    assert_eq!(
        by("default", "tight", "throttled"),
        None,
        "default denied nothing"
    );
    assert_eq!(by("default", "(unmatched)", "allowed"), Some(2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_counts_decisions_by_route_and_shows_an_outage() {
    let mut s = stack().await;
    let metrics = format!("{}/__floodgate/metrics", s.edge_url);
    let before = scrape(&metrics).await;
    assert_eq!(before.value(DECISIONS, &[]), None, "nothing decided yet");
    assert_eq!(
        before.get(
            "floodgate_breaker_state",
            &[("store", "global"), ("state", "closed")]
        ),
        1.0
    );

    assert_eq!(traffic(&s, "/v1/tight", 5).await, [200, 200, 200, 429, 429]);
    assert_eq!(traffic(&s, "/v1/other", 2).await, [200, 200]);
    let tight = [("route", "tight"), ("outcome", "allowed")];
    let after = scrape_until(&metrics, "7 decisions counted", |m| {
        m.value(DECISIONS, &tight) == Some(3.0)
            && m.value(
                DECISIONS,
                &[("route", "(unmatched)"), ("outcome", "allowed")],
            ) == Some(2.0)
    })
    .await;
    assert_eq!(
        after.get(DECISIONS, &[("route", "tight"), ("outcome", "throttled")]),
        2.0
    );
    assert_policy_decisions(&after, BY_POLICY);
    // every check that reached Redis is in the latency histogram (429s after the
    // first may be a recent 429 answered locally, without a call)
    let count = after.get("floodgate_store_latency_seconds_count", &[]);
    assert!((6.0..=7.0).contains(&count), "{count}");
    let buckets = after.buckets("floodgate_store_latency_seconds");
    assert_eq!(buckets.last().map(|b| b.1), Some(count), "{buckets:?}");
    assert!(after.get("floodgate_store_latency_seconds_sum", &[]) > 0.0);
    // the global store's answer deadline (this edge pins 500 ms)
    let deadline = after.get("floodgate_store_deadline_seconds", &[("store", "global")]);
    assert_eq!(deadline, 0.5);
    assert_eq!(
        after.get("floodgate_key_cache_lookups_total", &[("result", "miss")]),
        1.0,
        "one lookup, then the cache"
    );
    assert_eq!(
        after.get("floodgate_key_cache_lookups_total", &[("result", "hit")]),
        6.0
    );
    // each store call waited for by polling or asleep (native_host::idle_poll)
    let waves: f64 = ["back", "silent", "asleep"]
        .iter()
        .map(|o| after.get("floodgate_idle_poll_waves_total", &[("outcome", o)]))
        .sum();
    assert!(waves >= 1.0, "the calls' waves are counted: {waves}");
    let upstream_2xx = after.buckets("floodgate_upstream_latency_seconds");
    assert_eq!(upstream_2xx.last().map(|b| b.1), Some(5.0), "5 forwarded");

    // Redis goes away: requests fail closed, the breaker opens, scrapes still answer
    s.redis.signal("KILL");
    assert!(s.redis.wait_exit(Duration::from_secs(10)));
    let statuses = traffic(&s, "/v1/other", 5).await;
    assert!(statuses.iter().all(|c| *c == 503), "{statuses:?}");
    // answered from memory (a few ms) while the store is gone: held by the
    // outage it would wait on the store, up to its 10 s transport deadline here
    let (outage, took) = scrape_timed(&metrics).await;
    assert!(
        took < Duration::from_secs(2),
        "answered from memory: {took:?}"
    );
    assert_eq!(
        outage.get(
            "floodgate_breaker_state",
            &[("store", "global"), ("state", "closed")]
        ),
        0.0,
        "the breaker is not closed"
    );
    assert!(
        outage.get(
            "floodgate_breaker_transitions_total",
            &[("store", "global"), ("to", "open")]
        ) >= 1.0
    );
    assert_eq!(
        outage.get(
            "floodgate_degraded_decisions_total",
            &[("route", "(unmatched)"), ("mode", "fail_closed")]
        ),
        5.0
    );
    assert_eq!(
        outage.get(
            DECISIONS,
            &[("route", "(unmatched)"), ("outcome", "degraded")]
        ),
        5.0
    );
    assert!(outage.get("floodgate_degraded_fail_closed_total", &[]) >= 5.0);
    assert_eq!(
        outage.get(
            BY_POLICY,
            &[
                ("policy", "default"),
                ("route", "(unmatched)"),
                ("outcome", "degraded_fail_closed")
            ]
        ),
        5.0
    );
    drop(s.edge);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_exports_the_fleet_totals_the_edges_write() {
    let mut s = stack().await;
    let (_dashboard, listen) = listening("floodgate-dashboard", &["--redis", &s.redis.url()], &[]);
    let metrics = format!("http://{listen}/metrics");
    let first = scrape(&metrics).await;
    assert_eq!(first.get("floodgate_fleet_store_up", &[]), 1.0);
    let tight_allowed = [("route", "tight"), ("outcome", "allowed")];
    let throttled = [("route", "tight"), ("outcome", "throttled")];
    let fleet = "floodgate_fleet_decisions_total";

    traffic(&s, "/v1/tight", 5).await;
    traffic(&s, "/v1/other", 2).await;
    let m = scrape_until(&metrics, "the edge's first flush", |m| {
        m.value(fleet, &tight_allowed) == Some(3.0)
            && m.value(fleet, &throttled) == Some(2.0)
            && m.value(fleet, &[("route", "(unmatched)"), ("outcome", "allowed")]) == Some(2.0)
    })
    .await;
    assert_policy_decisions(&m, "floodgate_fleet_policy_decisions_total");
    let calls = m.get("floodgate_fleet_store_latency_seconds_count", &[]);
    assert!(calls >= 4.0, "{calls}");

    // more traffic: the counters grow by it, nothing is counted twice
    traffic(&s, "/v1/tight", 2).await;
    traffic(&s, "/v1/other", 2).await;
    let m = scrape_until(&metrics, "the second flush", |m| {
        m.value(fleet, &[("route", "(unmatched)"), ("outcome", "allowed")]) == Some(4.0)
            && m.value(fleet, &throttled) == Some(4.0)
    })
    .await;
    assert_eq!(m.get(fleet, &tight_allowed), 3.0);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let again = scrape(&metrics).await;
    assert_eq!(again.get(fleet, &throttled), 4.0, "re-reading adds nothing");

    // Redis down: the scrape answers at once, with the counters and the outage
    s.redis.signal("KILL");
    assert!(s.redis.wait_exit(Duration::from_secs(10)));
    // the scrape waits for Redis at most its read deadline (2 s): a refused
    // connection answers at once; a scrape held by the outage would hang
    let (down, took) = scrape_timed(&metrics).await;
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(down.get("floodgate_fleet_store_up", &[]), 0.0);
    assert!(down.get("floodgate_fleet_scrape_errors_total", &[]) >= 1.0);
    assert_eq!(down.get(fleet, &throttled), 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floodgate_rest_counts_requests_on_its_metrics_listener() {
    let mut redis = RedisServer::start();
    let metrics_listen = format!("127.0.0.1:{}", free_port());
    let (rest, listen) = listening(
        "floodgate-rest",
        &["--redis", &redis.url(), "--metrics-listen", &metrics_listen],
        &[("FLOODGATE_REST_TOKEN", "metrics-test")],
    );
    let metrics = format!("http://{metrics_listen}/metrics");
    let client = reqwest::Client::new();
    let post = |path: &str, body: &str, token: &str| {
        client
            .post(format!("http://{listen}{path}"))
            .bearer_auth(token)
            .body(body.to_string())
            .timeout(Duration::from_secs(5))
            .send()
    };
    for i in 0..3 {
        let r = post("/", &format!(r#"["SET","k{i}","v"]"#), "metrics-test")
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = post(
        "/pipeline",
        r#"[["GET","k0"],["GET","k1"]]"#,
        "metrics-test",
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let r = post("/", r#"["GET","k0"]"#, "wrong").await.unwrap();
    assert_eq!(r.status(), 401);

    let m = scrape(&metrics).await;
    let requests = "floodgate_rest_requests_total";
    assert_eq!(
        m.get(requests, &[("kind", "command"), ("status", "2xx")]),
        3.0
    );
    assert_eq!(
        m.get(requests, &[("kind", "pipeline"), ("status", "2xx")]),
        1.0
    );
    assert_eq!(
        m.get(requests, &[("kind", "command"), ("status", "4xx")]),
        1.0
    );
    assert_eq!(
        m.get("floodgate_rest_redis_latency_seconds_count", &[]),
        4.0
    );
    assert_eq!(m.get("floodgate_rest_redis_up", &[]), 1.0);

    redis.signal("KILL");
    assert!(redis.wait_exit(Duration::from_secs(10)));
    let r = post("/", r#"["GET","k0"]"#, "metrics-test").await.unwrap();
    assert!(r.status().is_server_error(), "{}", r.status());
    // the scrape's PING waits 1 s at most: a scrape held by the outage would hang
    let (down, took) = scrape_timed(&metrics).await;
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(down.get("floodgate_rest_redis_up", &[]), 0.0);
    assert!(
        down.value("floodgate_rest_redis_errors_total", &[("kind", "connect")])
            .or(down.value("floodgate_rest_redis_errors_total", &[("kind", "timeout")]))
            .is_some_and(|n| n >= 1.0),
        "{}",
        down.text
    );
    drop(rest);
}

/// The native edge polls while a store call is out rather than letting its CPU
/// sleep (`native_host::idle_poll`), for at most its budget (200 µs by default)
/// without a reply. A store farther away than that is never waited for by
/// polling alone: each wave polled in vain is followed by a doubling number
/// slept through, so polling costs a far store's edge a few budgets, not one per
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_farther_than_the_poll_budget_is_waited_for_asleep() {
    let redis = RedisServer::start();
    let secret = seed(&redis, CONFIG).await.secret;
    // 20 ms each way: only a stall of the edge longer than the round trip, at a
    // wave's start, could let a reply come within the budget
    let far = LatencyProxy::start(redis.port(), Duration::from_millis(20)).await;
    let (_upstream, up_listen) = listening("floodgate-demo-upstream", &[], &[]);
    let upstream = format!("http://{up_listen}");
    let args = [
        "--upstream",
        &upstream,
        "--redis",
        &far.url(),
        "--deadline-ms",
        "500",
    ];
    let (_edge, listen) = listening("floodgate-edge", &args, &[]);
    let metrics = format!("http://{listen}/__floodgate/metrics");
    let waves = |m: &Scrape| {
        ["back", "silent", "asleep"]
            .map(|o| m.get("floodgate_idle_poll_waves_total", &[("outcome", o)]))
    };
    let before = waves(&scrape(&metrics).await);
    let c = reqwest::Client::new();
    for _ in 0..40 {
        let r = c.get(format!("http://{listen}/far")).bearer_auth(&secret);
        assert_eq!(r.send().await.unwrap().status(), 200);
    }
    let [back, silent, asleep] = waves(&scrape(&metrics).await);
    assert_eq!(
        back, before[0],
        "no reply comes within 200 µs of a 40 ms round trip"
    );
    let (silent, asleep) = (silent - before[1], asleep - before[2]);
    assert!(
        silent >= 1.0 && asleep > 3.0 * silent,
        "40 requests' waves: {silent} polled in vain, {asleep} slept through"
    );
}
