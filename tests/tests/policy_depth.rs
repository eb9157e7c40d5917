//! Policy depth through the edge, with real Redis: costs, several policies of
//! different algorithms in one round trip (none consumed when one denies), shadow
//! policies (counted, never enforced), the IETF RateLimit fields parsed by a real
//! structured-field parser, Retry-After from the denying policy, and its jitter.

use std::time::{Duration, Instant};

use floodgate_edge::admin;
use floodgate_edge::demo_upstream::{self, Seen};
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::stats;
use floodgate_tests::{EdgeKind, RedisServer, serve, start_edge};

const CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 1000, "period": "1h"}, "failure_mode": "fail_closed"},
    {"name": "export", "dimensions": ["api_key", "endpoint"], "quota": {"capacity": 25, "period": "1h"}, "cost": 10, "failure_mode": "fail_closed", "algorithm": "sliding_log"},
    {"name": "checkout", "dimensions": ["api_key", "endpoint"], "quota": {"capacity": 2, "period": "1h"}, "failure_mode": "fail_closed", "algorithm": "fixed_window"},
    {"name": "search-watch", "dimensions": ["api_key", "endpoint"], "quota": {"capacity": 2, "period": "1h"}, "failure_mode": "fail_open", "shadow": true},
    {"name": "search", "dimensions": ["api_key", "endpoint"], "quota": {"capacity": 100, "period": "1h"}, "failure_mode": "fail_closed", "algorithm": "sliding_counter"}
  ],
  "plans": {"free": ["default"]},
  "routes": [
    {"name": "export", "pattern": "/v1/export/*", "policies": ["export"]},
    {"name": "checkout", "pattern": "/v1/checkout", "policies": ["checkout"]},
    {"name": "search", "pattern": "/v1/search", "policies": ["search", "search-watch"]}
  ],
  "headers": {"ietf": true, "retry_jitter_secs": 5}
}"#;

struct Stack {
    redis: RedisServer,
    edge: String,
    secrets: Vec<String>,
    _edge: floodgate_tests::EdgeInstance,
    _upstream: tokio::sync::oneshot::Sender<()>,
}

async fn stack(keys: usize) -> Stack {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&store, CONFIG).await.unwrap();
    let mut secrets = vec![];
    for i in 0..keys {
        secrets.push(
            admin::create_key(&store, &format!("k{i}"), "free", 0)
                .await
                .unwrap()
                .1,
        );
    }
    let (upstream, stop) = serve(demo_upstream::router(Seen::default())).await;
    let edge = start_edge(EdgeKind::Native, &redis, &upstream, 5_000).await;
    Stack {
        redis,
        edge: edge.url.clone(),
        secrets,
        _edge: edge,
        _upstream: stop,
    }
}

/// The checkout policy is a fixed window of one hour: a test that must see one
/// window whole starts at least 30 s before its end (it waits past the edge
/// otherwise, at most 30 s), so the wall clock cannot split it.
async fn clear_of_the_hour_edge() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let left = 3600 - now.as_secs() % 3600;
    if left <= 30 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

async fn get(s: &Stack, secret: &str, path: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(format!("{}{path}", s.edge))
        .bearer_auth(secret)
        .send()
        .await
        .expect("the edge answers")
}

/// (name, [(param, integer)]) of every member, parsed per RFC 9651.
fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse_list()
        .expect("a structured field list");
    list.into_iter()
        .map(|e| match e {
            sfv::ListEntry::Item(i) => (
                i.bare_item
                    .as_string()
                    .expect("a string")
                    .as_str()
                    .to_string(),
                i.params
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), i64::from(v.as_integer().unwrap())))
                    .collect(),
            ),
            other => panic!("{other:?}"),
        })
        .collect()
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn a_costly_route_and_several_policies_are_checked_in_one_round_trip_all_or_nothing() {
    let s = stack(1).await;
    let key = &s.secrets[0];
    let mut conn = s.redis.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .unwrap();
    // export costs 10 of 25: two fit, the third is denied — and the default bucket
    // (1000/h) is consumed only by the two admitted
    let statuses = [
        get(&s, key, "/v1/export/a").await,
        get(&s, key, "/v1/export/b").await,
        get(&s, key, "/v1/export/c").await,
    ];
    assert_eq!(
        statuses
            .iter()
            .map(|r| r.status().as_u16())
            .collect::<Vec<_>>(),
        [200, 200, 429]
    );
    let denied = &statuses[2];
    assert_eq!(
        header(denied, "X-RateLimit-Limit"),
        "25",
        "headers of the denying policy"
    );
    let state = sf_list(header(denied, "RateLimit"));
    let default = state.iter().find(|(n, _)| n == "default").unwrap();
    assert_eq!(
        default.1[0],
        ("r".to_string(), 998),
        "the denial consumed nothing"
    );
    // one script call per request, whatever the number of policies
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    let field = |line: &str, name: &str| -> u64 {
        line.split(&format!(",{name}="))
            .nth(1)
            .or_else(|| line.split(&format!(":{name}=")).nth(1))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    // executions that ran (a NOSCRIPT EVALSHA is a failed call, retried as EVAL)
    let runs: u64 = stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| field(l, "calls") - field(l, "failed_calls"))
        .sum();
    assert_eq!(runs, 3, "{stats}");
}

#[tokio::test]
async fn the_ietf_fields_describe_every_matching_policy_and_retry_after_comes_from_the_denier() {
    clear_of_the_hour_edge().await;
    let s = stack(1).await;
    let key = &s.secrets[0];
    let ok = get(&s, key, "/v1/checkout").await;
    assert_eq!(ok.status(), 200);
    let policy = sf_list(header(&ok, "RateLimit-Policy"));
    assert_eq!(
        policy,
        [
            (
                "default".to_string(),
                vec![("q".to_string(), 1000), ("w".to_string(), 3600)]
            ),
            (
                "checkout".to_string(),
                vec![("q".to_string(), 2), ("w".to_string(), 3600)]
            ),
        ]
    );
    let state = sf_list(header(&ok, "RateLimit"));
    assert_eq!(state[0].1[0], ("r".to_string(), 999));
    assert_eq!(state[1].1[0], ("r".to_string(), 1));
    assert_eq!(
        header(&ok, "X-RateLimit-Remaining"),
        "1",
        "the tightest policy"
    );
    assert_eq!(get(&s, key, "/v1/checkout").await.status(), 200);
    let denied = get(&s, key, "/v1/checkout").await;
    assert_eq!(denied.status(), 429);
    // the fixed window ends on the next whole hour: Retry-After is that wait (plus
    // at most 5 s of jitter), never the default bucket's
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let to_window_end = 3600 - now % 3600;
    let retry: i64 = header(&denied, "Retry-After").parse().unwrap();
    assert!(
        (to_window_end - 2..=to_window_end + 6).contains(&retry),
        "retry {retry}, window ends in {to_window_end}"
    );
    assert_eq!(header(&denied, "X-RateLimit-Limit"), "2");
    assert_eq!(sf_list(header(&denied, "RateLimit-Policy")).len(), 2);
}

#[tokio::test]
async fn jitter_spreads_retry_after_without_ever_shortening_it() {
    clear_of_the_hour_edge().await;
    let s = stack(12).await;
    let mut retries = vec![];
    for key in &s.secrets {
        for _ in 0..2 {
            assert_eq!(get(&s, key, "/v1/checkout").await.status(), 200);
        }
        let denied = get(&s, key, "/v1/checkout").await;
        assert_eq!(denied.status(), 429);
        retries.push(header(&denied, "Retry-After").parse::<i64>().unwrap());
    }
    let (lo, hi) = (retries.iter().min().unwrap(), retries.iter().max().unwrap());
    assert!(hi - lo <= 5 + 1, "{retries:?}");
    assert!(hi > lo, "jittered: {retries:?}");
}

#[tokio::test]
async fn a_shadow_policy_is_counted_and_never_enforced() {
    let s = stack(1).await;
    let key = &s.secrets[0];
    for _ in 0..6 {
        let r = get(&s, key, "/v1/search").await;
        assert_eq!(r.status(), 200, "shadow policies never deny");
        // the headers describe enforced policies only
        assert!(
            sf_list(header(&r, "RateLimit-Policy"))
                .iter()
                .all(|(n, _)| n != "search-watch")
        );
    }
    // 6 requests against a shadow of 2/h: 4 would have been throttled; the stats
    // reach Redis within the flush interval
    let mut conn = s.redis.connection();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let field = stats::StatsField::Endpoint(
            stats::Endpoint::Route("search".into()),
            stats::Counted::ShadowThrottled,
        );
        let total = floodgate_tests::stats_counted(&s.redis, &field.to_string());
        if total == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "shadow count {total}, want 4");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // and the decisions were sampled for backtests
    let sample: Vec<String> = redis::cmd("LRANGE")
        .arg(stats::SAMPLE_KEY)
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    assert_eq!(sample.len(), 6);
    let parsed: Vec<stats::SampleEntry> = sample.iter().filter_map(|e| e.parse().ok()).collect();
    assert_eq!(parsed.len(), 6);
    assert!(
        parsed
            .iter()
            .all(|r| r.endpoint.route() == Some("search") && r.plan == "free")
    );
}
