//! The adaptive answer deadline (`edge::deadline`) with real servers: a Redis
//! that is slow but answering (a TCP proxy adding 5-20 ms per round trip) is
//! waited for, never answered 503; a stopped one (SIGSTOP) is still found out
//! within the floor and opens the breaker; a healthy one's stall shorter than a
//! deadline costs no 503 (both hosts); the first request after start-up with a
//! slow store gets its answer. Loopback only, every loop bounded.

use std::time::{Duration, Instant};

use floodgate_edge::deadline::DeadlineSettings;
use floodgate_edge::native_host::{HostConfig, NativeStore};
use floodgate_edge::pipeline::{Pipeline, PipelineConfig, store_deadline, transport_deadline};
use floodgate_edge::proxy::HEALTH_PATH;
use floodgate_edge::store::StoreOptions;
use floodgate_shared::time::SystemClock;
use floodgate_tests::scale::LatencyProxy;
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{RedisServer, Seeded, seed, serve_native};
use reqwest::StatusCode;

/// Fail-closed, roomy: every answer but a 200 is the limiter's own failure.
const CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 100000, "period": "1h"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"free": ["default"]}
}"#;

/// A native edge over the store at `url` (through a proxy or not) with `deadline`.
async fn edge(
    url: &str,
    upstream: &str,
    deadline: DeadlineSettings,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let transport = store_deadline(Duration::from_micros(deadline.ceiling as u64));
    let store = NativeStore::connect(&StoreOptions::new(url, transport))
        .await
        .expect("connect");
    let settings = PipelineConfig {
        deadline,
        ..PipelineConfig::default()
    };
    let pipeline = Pipeline::new(store, SystemClock, settings);
    serve_native(pipeline, HostConfig::new(upstream)).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn health(c: &reqwest::Client, edge: &str) -> serde_json::Value {
    c.get(format!("{edge}{HEALTH_PATH}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Sends `n` requests from `workers` concurrent clients; the statuses.
async fn load(edge: &str, secret: &str, n: usize, workers: usize) -> Vec<StatusCode> {
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (url, secret, c) = (format!("{edge}/thing"), secret.to_string(), client());
            tokio::spawn(async move {
                let mut out = vec![];
                for _ in 0..n / workers {
                    out.push(
                        c.get(&url)
                            .bearer_auth(&secret)
                            .send()
                            .await
                            .unwrap()
                            .status(),
                    );
                }
                out
            })
        })
        .collect();
    let mut all = vec![];
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn refused(statuses: &[StatusCode]) -> usize {
    statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count()
}

/// Redis 5-20 ms away (2.5 ms each way plus up to 7.5 ms of jitter each way).
async fn jittery(redis: &RedisServer) -> LatencyProxy {
    let proxy = LatencyProxy::start(redis.port(), Duration::from_micros(2_500)).await;
    proxy.set_jitter(Duration::from_micros(7_500));
    proxy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_answering_redis_is_waited_for_not_refused() {
    let redis = RedisServer::start();
    let Seeded { secret, .. } = seed(&redis, CONFIG).await;
    let upstream = RawUpstream::start().await;
    let proxy = jittery(&redis).await;
    let c = client();

    // today's fixed 3 ms: the same store answers in time almost never
    let (fixed, _guard) = edge(&proxy.url(), &upstream.url, DeadlineSettings::fixed(3_000)).await;
    let statuses = load(&fixed, &secret, 40, 2).await;
    let on_fixed = refused(&statuses);
    assert!(
        on_fixed >= 20,
        "a fixed 3 ms deadline refuses most requests to a Redis 5-20 ms away ({on_fixed} of 40)"
    );

    // adaptive: 320 requests from 4 clients, none refused while the store answers
    // within the ceiling (100 ms). A reply later than that is refused by design;
    // only the machine makes a 5-20 ms store that late (a loaded 2-core machine
    // stalls a round trip past 100 ms now and then): each refusal must be such a
    // reply, counted by the edge once it came, never one it could have waited for
    let (adaptive, _guard) = edge(&proxy.url(), &upstream.url, DeadlineSettings::RESP).await;
    let statuses = load(&adaptive, &secret, 320, 4).await;
    let refusals = refused(&statuses) as u64;
    let too_late = |h: &serde_json::Value| {
        h["deadlines"]["global"]["too_late"]
            .as_u64()
            .expect("too_late")
    };
    let mut h = health(&c, &adaptive).await;
    // a refused call's reply comes after its refusal, within the store's
    // transport deadline
    let waited = Instant::now();
    let transport = transport_deadline(&DeadlineSettings::RESP);
    while too_late(&h) < refusals && waited.elapsed() < transport + Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        h = health(&c, &adaptive).await;
    }
    eprintln!(
        "slow Redis: {refusals} of {} refused ({} replies after the ceiling)",
        statuses.len(),
        too_late(&h)
    );
    assert!(
        refusals <= too_late(&h),
        "{refusals} refused, only {} of them a reply after the ceiling: {h}",
        too_late(&h)
    );
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::SERVICE_UNAVAILABLE),
        "{h}"
    );
    let global = &h["deadlines"]["global"];
    assert_eq!(global["adaptive"], true, "{h}");
    assert_eq!(
        global["ceiling_ms"], 100.0,
        "after the ceiling: five times the store's slowest: {h}"
    );
    let d = global["deadline_ms"].as_f64().unwrap();
    assert!(
        (20.0..=100.0).contains(&d),
        "the deadline covers 5-20 ms within the ceiling: {h}"
    );
    assert_eq!(h["breaker"], "closed", "{h}");
    assert_eq!(global["expired_silent"], 0, "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_is_found_out_within_the_deadline_and_opens_the_breaker() {
    let threshold = u64::from(PipelineConfig::default().breaker_threshold);
    // one client, one request at a time: each silent deadline is a breaker
    // failure the moment it passes, and a call waits through one of them (a
    // stall shorter than a deadline costs no 503), so the first ⌈threshold / 2⌉
    // requests waited two deadlines at most and the breaker opened as soon as
    // `threshold` deadlines had passed silent — as fast as before
    stopped_redis_opens_the_breaker(DeadlineSettings::RESP, threshold.div_ceil(2)).await;
}

/// A fixed deadline is its own ceiling: nothing is waited on past it, and each
/// silent call is one breaker failure, as before. (The first version of the
/// forgiven silent deadline counted no failure at the ceiling: the breaker of a
/// fixed deadline never opened.) The deadline is 50 ms: at 3 ms, a healthy
/// store's answer to a warm-up request, late on a machine loaded by the rest of
/// the suite, was a 503 of its own (CI, once), which is not what this tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_opens_the_breaker_under_a_fixed_deadline_too() {
    let threshold = u64::from(PipelineConfig::default().breaker_threshold);
    stopped_redis_opens_the_breaker(DeadlineSettings::fixed(50_000), threshold).await;
}

/// Learns a healthy store, stops it (SIGSTOP), sends 20 requests one at a time:
/// all are refused within the deadline, the breaker is open, and `late` store
/// calls missed their deadline before it opened; every later request was
/// answered without waiting on the store (kept off it, or a health check) —
/// counted, not timed.
async fn stopped_redis_opens_the_breaker(deadline: DeadlineSettings, late: u64) {
    let redis = RedisServer::start();
    let Seeded { secret, .. } = seed(&redis, CONFIG).await;
    let upstream = RawUpstream::start().await;
    let (edge, _guard) = edge(&redis.url(), &upstream.url, deadline).await;
    let transport = transport_deadline(&deadline);
    let c = client();
    // learn the store: 40 answers
    let statuses = load(&edge, &secret, 40, 1).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    let learned = health(&c, &edge).await["deadlines"]["global"]["deadline_ms"]
        .as_f64()
        .unwrap();
    assert!(learned < 100.0, "learned, not the ceiling: {learned}");

    redis.signal("STOP");
    let mut slowest = Duration::ZERO;
    let mut statuses = vec![];
    for _ in 0..20 {
        let started = Instant::now();
        let r = c
            .get(format!("{edge}/thing"))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap();
        slowest = slowest.max(started.elapsed());
        statuses.push(r.status());
    }
    let h = health(&c, &edge).await;
    redis.signal("CONT");
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    // found out at the learned deadline, not at the store's own transport
    // deadline (2 s here) nor never: how far past the deadline the slowest came
    // back is the machine's scheduling, a figure
    eprintln!("stopped Redis: slowest request {slowest:?} (learned deadline {learned} ms)");
    assert!(
        slowest < transport,
        "a request waited {slowest:?}, as if there were no answer deadline (learned {learned} ms)"
    );
    assert_eq!(h["breaker"], "open", "{h}");
    let global = &h["deadlines"]["global"];
    assert!(global["expired_silent"].as_u64().unwrap() >= late, "{h}");
    assert_eq!(global["late_replies"], 0, "{h}");
    let (skipped, probes) = (
        h["breaker_skipped"].as_u64().unwrap(),
        h["breaker_probes"].as_u64().unwrap(),
    );
    assert_eq!(h["late_calls"], late, "{h}");
    assert_eq!(skipped + probes, statuses.len() as u64 - late, "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_after_start_up_with_a_slow_store_gets_its_answer() {
    let redis = RedisServer::start();
    let Seeded { secret, .. } = seed(&redis, CONFIG).await;
    let upstream = RawUpstream::start().await;
    // 40 ms per round trip: past a 3 ms floor, within the 100 ms ceiling
    let proxy = LatencyProxy::start(redis.port(), Duration::from_millis(20)).await;
    let (edge, _guard) = edge(&proxy.url(), &upstream.url, DeadlineSettings::RESP).await;
    let c = client();
    let r = c
        .get(format!("{edge}/thing"))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Busies the whole Redis server for `stall` (one script spinning on TIME, as
/// another client's long script or a scheduler's turn on a loaded machine would
/// hold it): every other client waits, none is refused.
fn stall_redis(redis: &RedisServer, stall: Duration) -> std::thread::JoinHandle<()> {
    const SPIN: &str = "local t = redis.call('TIME') \
        local start = t[1] * 1000000 + t[2] \
        repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1]) \
        return 1";
    let mut conn = redis.connection();
    std::thread::spawn(move || {
        let _: i64 = redis::cmd("EVAL")
            .arg(SPIN)
            .arg(0)
            .arg(stall.as_micros() as u64)
            .query(&mut conn)
            .expect("the spinning script");
    })
}

/// Issue 41: with both CPUs loaded, a healthy Redis answered 2 of 2,000 requests
/// with 503 — a whole-server stall (Redis's turn on a CPU, or the edge's own)
/// longer than the deadline, with nothing from the store meanwhile, was taken for
/// a dead store. One silent deadline is now forgiven: a stall of 1.5 deadlines
/// costs no 503, on both hosts; the call is counted as waited on (so the stall
/// did pass the deadline: the test cannot pass by missing it). The deadline
/// here is floored at 200 ms so that the machine's own scheduling, a few ms,
/// cannot decide the outcome. (A stopped Redis is still found out as fast:
/// `a_stopped_redis_is_found_out_within_the_deadline_and_opens_the_breaker`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_a_healthy_redis_shorter_than_two_deadlines_costs_no_503_on_either_host() {
    use floodgate_tests::{EdgeKind, EdgeOptions, start_edge_with};
    for kind in [EdgeKind::Native, EdgeKind::Worker] {
        let redis = RedisServer::start();
        let Seeded { secret, .. } = seed(&redis, CONFIG).await;
        let upstream = RawUpstream::start().await;
        let options = EdgeOptions {
            deadline_ms: None,
            worker_env: vec![
                ("DEADLINE_FLOOR_MS".into(), "200".into()),
                ("DEADLINE_CEILING_MS".into(), "3000".into()),
            ],
            ..EdgeOptions::default()
        };
        let edge = start_edge_with(kind, &redis, &upstream.url, &options).await;
        let c = client();
        // learn the store (and cache the key): at the 200 ms floor
        let statuses = load(&edge.url, &secret, 40, 1).await;
        assert_eq!(refused(&statuses), 0, "{kind:?}: {statuses:?}");
        let global = &health(&c, &edge.url).await["deadlines"]["global"];
        assert_eq!(global["deadline_ms"], 200.0, "{kind:?}: {global}");

        let stall = stall_redis(&redis, Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let r = c
            .get(format!("{}/thing", edge.url))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap();
        let took = started.elapsed();
        let status = r.status();
        let body = r.text().await.unwrap();
        stall.join().unwrap();
        let h = health(&c, &edge.url).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{kind:?}: a 300 ms stall of a healthy Redis answered {status} after {took:?}: {body}; {h}"
        );
        let global = &h["deadlines"]["global"];
        // (a statistics flush caught in the stall is waited on too)
        assert!(
            global["waited_on"].as_u64().unwrap() >= 1,
            "{kind:?}: the request's call passed its deadline and was waited on ({took:?}): {h}"
        );
        assert_eq!(global["expired"], 0, "{kind:?}: {h}");
        assert_eq!(h["breaker"], "closed", "{kind:?}: {h}");
    }
}
