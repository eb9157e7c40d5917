//! Bounded consistency end to end, with real servers: a global redis-server behind
//! a latency proxy (a far primary), a regional redis-server per region, native edges
//! over HTTP in two regions, and the Worker in workerd with a regional REST
//! endpoint and a far global one. Admissions stay within the quota plus the bound;
//! warm requests are answered without a global round trip (counted on each Redis
//! with `INFO commandstats`); exact policies stay exact.

use std::time::{Duration, Instant};

use floodgate_edge::native_host::{HostConfig, NativeStore};
use floodgate_edge::pipeline::{Pipeline, PipelineConfig, store_deadline};
use floodgate_edge::store::resp::RespStore;
use floodgate_tests::scale::{LatencyProxy, calls_of, regional_calls, script_calls};
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{EdgeOptions, Endpoint, RedisServer, seed, serve_native, start_worker};
use reqwest::StatusCode;

/// 200 per hour per key (nothing refills while a test runs), bounded by 200,
/// shared by two regions (a credit of 5 per region and epoch, chunks of 12 from
/// a book of 100).
fn config(consistency: &str) -> String {
    let bound = if consistency == "exact" {
        String::new()
    } else {
        r#","max_overshoot":200"#.to_string()
    };
    format!(
        r#"{{"policies":[{{"name":"default","dimensions":["api_key"],
        "quota":{{"capacity":200,"refill":1,"period":"1h"}},"failure_mode":"fail_closed",
        "consistency":"{consistency}"{bound}}}],"plans":{{"free":["default"]}},"regions":2}}"#
    )
}

/// A native edge over RESP: the global store through `global_url`, a regional one.
async fn edge(
    global_url: &str,
    regional: Option<&RedisServer>,
    upstream: &str,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let deadline = Duration::from_secs(2);
    let global = RespStore::connect(global_url, store_deadline(deadline))
        .await
        .expect("connect");
    let settings = PipelineConfig {
        deadline: floodgate_edge::deadline::DeadlineSettings::fixed(deadline.as_micros() as i64),
        ..PipelineConfig::default()
    };
    let mut pipeline = Pipeline::new(
        NativeStore::Resp(global),
        floodgate_shared::time::SystemClock,
        settings,
    );
    if let Some(r) = regional {
        let store = RespStore::connect(&r.url(), store_deadline(deadline))
            .await
            .expect("connect");
        pipeline = pipeline.with_regional(NativeStore::Resp(store));
    }
    serve_native(pipeline, HostConfig::new(upstream)).await
}

struct Regions {
    global: RedisServer,
    regionals: Vec<RedisServer>,
    upstream: RawUpstream,
    secret: String,
    edges: Vec<String>,
    _proxy: LatencyProxy,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// Two regions of two native edges each; the global Redis `one_way` away.
async fn regions(consistency: &str, one_way: Duration) -> Regions {
    let global = RedisServer::start();
    let secret = seed(&global, &config(consistency)).await.secret;
    let proxy = LatencyProxy::start(global.port(), one_way).await;
    let regionals = vec![RedisServer::start(), RedisServer::start()];
    let upstream = RawUpstream::start().await;
    let (mut edges, mut stops) = (vec![], vec![]);
    for r in &regionals {
        for _ in 0..2 {
            let (url, stop) = edge(&proxy.url(), Some(r), &upstream.url).await;
            edges.push(url);
            stops.push(stop);
        }
    }
    Regions {
        global,
        regionals,
        upstream,
        secret,
        edges,
        _proxy: proxy,
        _stops: stops,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(32)
        .build()
        .unwrap()
}

/// Requests an edge decided from leased tokens since it started (its health
/// answer's `leased.decisions`): from what it drew in memory or at its region's
/// tally, never with a global round trip (a request that crossed to the global
/// store was decided exactly).
async fn leased(c: &reqwest::Client, edge: &str) -> u64 {
    let health: serde_json::Value = c
        .get(format!("{edge}{}", floodgate_edge::proxy::HEALTH_PATH))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    health["leased"]["decisions"]
        .as_u64()
        .unwrap_or_else(|| panic!("no leased decisions in {health}"))
}

/// The sum of [`leased`] over `edges`.
async fn leased_on(c: &reqwest::Client, edges: &[String]) -> u64 {
    let mut sum = 0;
    for e in edges {
        sum += leased(c, e).await;
    }
    sum
}

/// Sends `n` requests to each edge at once; the number admitted.
async fn burst(edges: &[String], secret: &str, n: usize) -> usize {
    let c = client();
    let mut tasks = tokio::task::JoinSet::new();
    for e in edges {
        for _ in 0..n {
            let (c, url, secret) = (c.clone(), format!("{e}/burst"), secret.to_string());
            tasks.spawn(async move {
                c.get(url)
                    .bearer_auth(secret)
                    .send()
                    .await
                    .map(|r| r.status())
            });
        }
    }
    let mut admitted = 0;
    while let Some(r) = tasks.join_next().await {
        if r.unwrap().unwrap() == StatusCode::OK {
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_answer_warm_requests_at_their_tallies_and_stay_within_the_bound() {
    let one_way = Duration::from_millis(20);
    let r = regions("bounded", one_way).await;
    let c = client();
    // a key used steadily (~25/s per edge, well under what the quota allows for the
    // test's few seconds): after its region's first top-up its requests never
    // cross to the global Redis
    let global_before = script_calls(&mut r.global.connection());
    let mut slowest = Duration::ZERO;
    let (mut requests, mut warm, mut leased_before) = (0, 0, 0);
    for round in 0..10 {
        if round == 3 {
            leased_before = leased_on(&c, &r.edges).await;
        }
        for e in &r.edges {
            let started = Instant::now();
            let resp = c
                .get(format!("{e}/warm"))
                .bearer_auth(&r.secret)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "round {round}");
            if round >= 3 {
                slowest = slowest.max(started.elapsed());
                warm += 1;
            }
            requests += 1;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    // a warm request that paid a global round trip was decided exactly, not at
    // the tally: counted by the edges, whatever the machine's speed (how long
    // the slowest took is a figure of the machine's load; one that waited for
    // the global store took at least its round trip)
    let from_leases = leased_on(&c, &r.edges).await - leased_before;
    let crossed = warm - from_leases.min(warm);
    eprintln!(
        "two regions: {from_leases} of {warm} warm requests decided at the tallies; slowest warm request {slowest:?} (a global round trip: {:?})",
        2 * one_way
    );
    let global_calls = script_calls(&mut r.global.connection()) - global_before;
    let (mut increments, mut scripts) = (0, 0);
    for s in &r.regionals {
        let mut conn = s.connection();
        increments += calls_of(&mut conn, "hincrby");
        scripts += script_calls(&mut conn);
    }
    // wherever the test falls in the epoch: in its last quarter too, where
    // chunks for the next epoch are asked for while this one's run low (this
    // epoch is still topped up: it crossed four times when it was not)
    assert!(
        crossed <= 1,
        "{crossed} warm requests paid a global round trip"
    );
    // the warm-up's exact requests and top-ups only (chunks of 12 here, the
    // region's credit 5 per epoch; in an epoch's last quarter for the next
    // epoch too): a few
    assert!(
        global_calls * 3 <= requests,
        "{global_calls} global script calls for {requests} requests"
    );
    // a count per request at most (draws of a token or two at 25/s; an add
    // runs one HINCRBY of its own), a top-up's add now and then, a settlement
    assert!(
        increments <= requests + scripts,
        "{increments} regional increments for {requests} requests and {scripts} scripts"
    );
    assert!(scripts <= 12, "{scripts} regional scripts");
    // everything left of the hour's 200, spent from all four edges at once: at
    // most the bound above the quota
    let admitted = requests as usize + burst(&r.edges, &r.secret, 150).await;
    assert!(
        admitted <= 200 + 200,
        "{admitted} admitted of a quota of 200 bounded by 200"
    );
    assert!(
        admitted >= 160,
        "{admitted}: the tallies gave out most of the quota"
    );
    assert_eq!(r.upstream.total() as usize, admitted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_policies_stay_exact_beside_the_regions() {
    let r = regions("exact", Duration::from_millis(2)).await;
    let admitted = burst(&r.edges, &r.secret, 60).await;
    assert_eq!(admitted, 200, "exactly the quota");
    let regional = regional_calls(&r.regionals);
    assert_eq!(
        regional, 0,
        "an exact policy never touches a regional store"
    );
}

/// The Worker in workerd, its region's REST endpoint near, the global one 100 ms
/// away, the tally roomy enough to be topped up ahead: warm requests are decided
/// at the regional tally or from what the Worker drew there, also when the
/// cached configuration and key record expire (every 0.6 s here: confirmed after
/// the response, in `wait_until`; before, each expiry made one request wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_decides_warm_requests_at_its_regional_tally() {
    let global = RedisServer::start();
    // a bound of 800 over two regions: a credit of 20 per epoch, chunks of 50
    let roomy = config("bounded")
        .replace(r#""capacity":200"#, r#""capacity":1000"#)
        .replace(r#""max_overshoot":200"#, r#""max_overshoot":800"#);
    let secret = seed(&global, &roomy).await.secret;
    let regional = RedisServer::start();
    let (global_rest, regional_rest) = (
        Endpoint::start(&global, "global-token").await,
        Endpoint::start(&regional, "regional-token").await,
    );
    let port: u16 = global_rest.url.rsplit(':').next().unwrap().parse().unwrap();
    // far enough that a request which waited for it stands out from any busy
    // machine's noise (a warm request takes a few ms, one that waited ≥ 200 ms),
    // near enough that a record's background check (one round trip, sent once it
    // is a TTL old) is back well before it is two TTLs old
    let one_way = Duration::from_millis(100);
    let far = LatencyProxy::start(port, one_way).await;
    let upstream = RawUpstream::start().await;
    // the Worker's region comes from REGION (workerd here has no cf.continent)
    let env = [
        ("REGION", "EU".to_string()),
        ("CACHE_TTL_MS", "600".to_string()),
        (
            "REGIONAL_REST_URLS",
            format!(r#"{{"EU":"{}"}}"#, regional_rest.url),
        ),
        (
            "REGIONAL_REST_TOKENS",
            r#"{"EU":"regional-token"}"#.to_string(),
        ),
    ];
    let worker = start_worker(
        &format!("http://127.0.0.1:{}", far.port),
        "global-token",
        &upstream.url,
        &EdgeOptions {
            worker_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..EdgeOptions::default()
        },
    )
    .await;
    let c = client();
    let mut slow = vec![];
    let global_before = script_calls(&mut global.connection());
    let (mut warm, mut leased_before) = (0, 0);
    for i in 0..60 {
        if i == 5 {
            leased_before = leased(&c, &worker.url).await;
        }
        let started = Instant::now();
        let r = c
            .get(format!("{}/w", worker.url))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap();
        let status = r.status();
        assert_eq!(
            status,
            StatusCode::OK,
            "request {i}: {}",
            r.text().await.unwrap()
        );
        // a request that waited for the far store (a record read, a bucket check)
        // took at least its round trip, two one-way delays: only a stall of the
        // machine as long as that makes a warm request look as slow
        if i >= 5 {
            warm += 1;
            if started.elapsed() >= 2 * one_way {
                slow.push((i, started.elapsed()));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let global_calls = script_calls(&mut global.connection()) - global_before;
    // the rate decisions of warm requests, counted by the Worker: from its
    // draws or at the regional tally, none decided exactly at the far store
    let from_leases = leased(&c, &worker.url).await - leased_before;
    eprintln!(
        "worker: {from_leases} of {warm} warm requests decided from leases; {} took a global round trip or longer: {slow:?}",
        slow.len()
    );
    assert!(
        warm - from_leases.min(warm) <= 2,
        "{from_leases} of {warm} warm requests decided from leases: the others waited for the far global store"
    );
    assert!(
        slow.len() <= 2,
        "warm requests that waited for the far global store: {slow:?}"
    );
    assert!(
        global_calls <= 20,
        "{global_calls} global script calls for 60 requests"
    );
    // the tally is counted for the first requests and then once per draw: at
    // 50/s a Worker draws a few tokens per count
    let regional_calls = regional_calls(std::slice::from_ref(&regional));
    assert!(
        (1..=45).contains(&regional_calls),
        "{regional_calls} regional calls for 60 requests"
    );
}

/// `floodgate-cli config set` takes a bounded policy through the edge's own parser:
/// each bad bound is refused with an error naming the field and nothing is stored;
/// a good one is stored with its consistency and bound, and reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_stores_a_bound_only_when_it_is_valid() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("floodgate-cli-bound-{}", redis.port()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = redis.url();
    let set = |name: &str, json: String| {
        let path = dir.join(name);
        std::fs::write(&path, json).unwrap();
        let args = vec![
            "--redis".to_string(),
            url.clone(),
            "config".into(),
            "set".into(),
            path.to_str().unwrap().into(),
            "--force".into(),
        ];
        floodgate_tests::cli(args)
    };
    let bounded = config("bounded");
    let bad = [
        (
            "zero",
            bounded.replace(r#""max_overshoot":200"#, r#""max_overshoot":0"#),
        ),
        (
            "negative",
            bounded.replace(r#""max_overshoot":200"#, r#""max_overshoot":-1"#),
        ),
        (
            "fraction",
            bounded.replace(r#""max_overshoot":200"#, r#""max_overshoot":1.5"#),
        ),
        (
            "over capacity",
            bounded.replace(r#""max_overshoot":200"#, r#""max_overshoot":201"#),
        ),
        (
            "exact with a bound",
            bounded.replace(r#""bounded""#, r#""exact""#),
        ),
        (
            "no bound",
            config("bounded").replace(r#","max_overshoot":200"#, ""),
        ),
        (
            "a window cannot lease",
            bounded
                .replace(
                    r#""failure_mode""#,
                    r#""algorithm":"sliding_counter","failure_mode""#,
                )
                .replace(r#""refill":1,"#, ""),
        ),
    ];
    for (what, json) in bad {
        let e = set("bad.json", json).await.unwrap_err();
        assert!(
            e.contains("max_overshoot") || e.contains("consistency"),
            "{what}: the error names the field: {e}"
        );
        let stored: bool = redis::cmd("EXISTS")
            .arg("fg:config")
            .query(&mut redis.connection())
            .unwrap();
        assert!(!stored, "{what}: nothing stored");
    }
    set("good.json", bounded).await.unwrap();
    let store = NativeStore::connect(&floodgate_edge::store::StoreOptions::new(
        redis.url(),
        Duration::from_secs(2),
    ))
    .await
    .unwrap();
    let (_, stored) = floodgate_edge::admin::load_config(&store).await.unwrap();
    let stored = floodgate_shared::config::EdgeConfig::from_json(&stored.unwrap()).unwrap();
    let policy = stored.policy("default").unwrap();
    assert_eq!(
        (policy.consistency(), policy.max_overshoot()),
        (floodgate_shared::policy::Consistency::Bounded, Some(200))
    );
    let _ = std::fs::remove_dir_all(dir);
}
