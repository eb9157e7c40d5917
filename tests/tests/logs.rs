//! Structured logs as a log pipeline reads them: `floodgate-edge --log-format json`
//! writes one JSON object per line (timestamp, level, target, fields with the
//! message; request-scoped events carry the request's id in `span`), the id is
//! the client's `X-Request-Id` when well-formed or a new one, and it reaches the
//! upstream; configuration loads and breaker transitions are events too.

use std::time::Duration;

use floodgate_tests::process::listening;
use floodgate_tests::upstream::{Echo, RawUpstream};
use floodgate_tests::{DEMO_CONFIG, EdgeOptions, Endpoint, RedisServer, seed, start_worker};

async fn get(url: &str, secret: &str, request_id: Option<&str>) -> (u16, Option<Echo>) {
    let mut r = reqwest::Client::new()
        .get(url)
        .bearer_auth(secret)
        .timeout(Duration::from_secs(10));
    if let Some(id) = request_id {
        r = r.header("x-request-id", id);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let echo = (status == 200).then_some(Echo(r.json().await.unwrap()));
    (status, echo)
}

fn one_id(echo: &Echo) -> String {
    let ids = echo.header("x-request-id");
    assert_eq!(ids.len(), 1, "{:?}", echo.0);
    ids[0].clone()
}

/// Checks the ids of three requests (the client's, none, a malformed one) as the
/// upstream saw them: the made ones.
async fn ids_reach_the_upstream(url: &str, secret: &str) -> (String, String) {
    let (_, echo) = get(url, secret, Some("req-7f3a.42")).await;
    assert_eq!(one_id(&echo.unwrap()), "req-7f3a.42");
    let (_, echo) = get(url, secret, None).await;
    let made = one_id(&echo.unwrap());
    assert!(
        made.len() == 32 && made.bytes().all(|b| b.is_ascii_hexdigit()),
        "{made}"
    );
    let (_, echo) = get(url, secret, Some("two words")).await;
    let replaced = one_id(&echo.unwrap());
    assert!(replaced != "two words" && replaced != made, "{replaced}");
    (made, replaced)
}

/// A host's log: every line one JSON object with an RFC 3339 UTC timestamp, a
/// level, a target and `fields.message`.
struct Lines {
    log: String,
    events: Vec<serde_json::Value>,
}

impl Lines {
    fn parse(log: String) -> Self {
        let events = log
            .lines()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{log}"));
                let ts = v["timestamp"].as_str().unwrap_or_default();
                assert!(
                    ts.len() >= 20 && ts.as_bytes()[10] == b'T' && ts.ends_with('Z'),
                    "an RFC 3339 UTC timestamp: {line}"
                );
                assert!(
                    ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
                        .contains(&v["level"].as_str().unwrap_or("")),
                    "{line}"
                );
                assert!(v["target"].is_string(), "{line}");
                assert!(v["fields"]["message"].is_string(), "{line}");
                v
            })
            .collect();
        Self { log, events }
    }

    fn find(&self, what: &str, pred: &dyn Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.events
            .iter()
            .find(|e| pred(e))
            .unwrap_or_else(|| panic!("no {what} in\n{}", self.log))
            .clone()
    }

    fn answered(&self, id: &str) -> Option<&serde_json::Value> {
        self.events.iter().find(|e| {
            e["target"] == "floodgate::request"
                && e["fields"]["message"] == "answered"
                && e["span"]["request_id"].as_str() == Some(id)
        })
    }

    /// What both hosts log for [`ids_reach_the_upstream`]'s requests and then four
    /// answered 503 during an outage (`during-outage`): one `answered` event per
    /// request at debug, the configuration load, and the breaker opening in the
    /// request that opened it. The configuration load, for more checks.
    fn check(&self, made: &str, replaced: &str) -> serde_json::Value {
        let first = self
            .answered("req-7f3a.42")
            .unwrap_or_else(|| panic!("no answer to req-7f3a.42 in\n{}", self.log));
        assert_eq!(first["level"], "DEBUG");
        assert_eq!(first["fields"]["status"], 200);
        assert_eq!(first["fields"]["method"], "GET");
        assert!(first["fields"]["latency_us"].as_u64().is_some());
        for id in [made, replaced] {
            assert!(self.answered(id).is_some(), "no answer to {id}");
        }
        let down = self
            .answered("during-outage")
            .expect("answers in the outage");
        assert_eq!(down["fields"]["status"], 503);
        let loaded = self.find("the configuration load", &|e| {
            e["target"] == "floodgate::config"
        });
        assert_eq!(loaded["level"], "INFO");
        assert_eq!(loaded["fields"]["policies"], 3);
        assert_eq!(loaded["fields"]["routes"], 2);
        let opened = self.find("the breaker opening", &|e| {
            e["target"] == "floodgate::breaker" && e["fields"]["to"] == "open"
        });
        assert_eq!(opened["level"], "WARN");
        assert_eq!(opened["fields"]["from"], "closed");
        assert_eq!(opened["fields"]["store"], "global");
        assert!(opened["fields"]["reason"].is_string());
        assert_eq!(
            opened["span"]["request_id"], "during-outage",
            "the request that opened it"
        );
        loaded
    }
}

/// Four requests while the store is down (the breaker, at 2 failures, opens).
async fn outage(redis: &mut RedisServer, url: &str, secret: &str) {
    redis.signal("KILL");
    assert!(redis.wait_exit(Duration::from_secs(10)));
    for _ in 0..4 {
        let (status, _) = get(url, secret, Some("during-outage")).await;
        assert_eq!(status, 503);
    }
}

/// The Worker's console (what `wrangler tail` and Workers Logs show) has the
/// native host's JSON lines: the id of the request each event happened in, the
/// configuration load, the breaker opening during a request, and at
/// `LOG_LEVEL=debug` one line per answered request; the id reaches the upstream
/// by the same rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_logs_the_same_json_lines_with_request_ids() {
    let mut redis = RedisServer::start();
    let secret = seed(&redis, DEMO_CONFIG).await.secret;
    let rest = Endpoint::start(&redis, "token").await;
    let upstream = RawUpstream::start().await;
    let worker = start_worker(
        &rest.url,
        "token",
        &upstream.url,
        &EdgeOptions {
            deadline_ms: Some(500),
            worker_env: [("LOG_LEVEL", "debug"), ("BREAKER_THRESHOLD", "2")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .to_vec(),
            ..EdgeOptions::default()
        },
    )
    .await;
    let url = format!("{}/v1/echo", worker.url);
    let (made, replaced) = ids_reach_the_upstream(&url, &secret).await;
    outage(&mut redis, &url, &secret).await;
    // the console is copied as it comes: wait for the last answers
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let lines = Lines::parse(std::fs::read_to_string(&worker.console).unwrap_or_default());
        if lines.answered("during-outage").is_some() || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let loaded = lines.check(&made, &replaced);
    assert_eq!(
        loaded["span"]["request_id"], "req-7f3a.42",
        "read for the isolate's first request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_request_ids_config_loads_and_breaker_transitions() {
    let mut redis = RedisServer::start();
    let secret = seed(&redis, DEMO_CONFIG).await.secret;
    let upstream = RawUpstream::start().await;
    let (edge, listen) = listening(
        "floodgate-edge",
        &[
            "--upstream",
            &upstream.url,
            "--redis",
            &redis.url(),
            "--deadline-ms",
            "500",
            "--breaker-threshold",
            "2",
        ],
        &[
            ("FLOODGATE_LOG_FORMAT", "json"),
            ("FLOODGATE_LOG_LEVEL", "debug"),
        ],
    );
    let url = format!("http://{listen}/v1/echo");
    // the client's id is kept and passed upstream; a malformed one is replaced
    let (made, replaced) = ids_reach_the_upstream(&url, &secret).await;
    // Redis goes away: the breaker opens during a request
    outage(&mut redis, &url, &secret).await;
    let lines = Lines::parse(edge.stop());
    let started = lines.find("the start", &|e| {
        e["fields"]["listen"].as_str() == Some(listen.as_str())
    });
    assert_eq!(started["level"], "INFO");
    lines.check(&made, &replaced);
}

#[test]
fn text_logs_are_the_default() {
    let out = floodgate_tests::process::run(
        "floodgate-edge",
        &[
            "--upstream",
            "http://127.0.0.1:9",
            "--country-header",
            "two words",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("ERROR"), "{err}");
    assert!(err.contains("--country-header"), "{err}");
    assert!(serde_json::from_str::<serde_json::Value>(err.lines().next().unwrap_or("")).is_err());
}
