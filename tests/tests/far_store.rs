//! A global Redis further away than the RESP deadline's ceiling (100 ms) is far,
//! not down (issue 22): with the native host's default deadlines, a store 60 ms
//! away one way (a 120 ms round trip) answered 503 to every request, its breaker
//! never closing. Its replies, all after the ceiling, now raise the ceiling, and
//! a dead store still never does.

use std::time::Duration;

use floodgate_edge::deadline::DeadlineSettings;
use floodgate_edge::native_host::{HostConfig, NativeStore};
use floodgate_edge::pipeline::{Pipeline, PipelineConfig, store_deadline};
use floodgate_edge::store::resp::RespStore;
use floodgate_tests::scale::LatencyProxy;
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{RedisServer, seed, serve_native};

const CONFIG: &str = r#"{"policies":[{"name":"default","dimensions":["api_key"],
    "quota":{"capacity":1000,"refill":1000,"period":"1m"},"failure_mode":"fail_closed"}],
    "plans":{"free":["default"]}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_global_store_is_waited_for_with_default_deadlines() {
    let redis = RedisServer::start();
    let secret = seed(&redis, CONFIG).await.secret;
    let far = LatencyProxy::start(redis.port(), Duration::from_millis(60)).await;
    let deadline = DeadlineSettings::RESP;
    let transport = store_deadline(Duration::from_micros(deadline.ceiling as u64));
    let store = RespStore::connect(&far.url(), transport)
        .await
        .expect("connect");
    let settings = PipelineConfig {
        deadline,
        ..PipelineConfig::default()
    };
    let pipeline = Pipeline::new(
        NativeStore::Resp(store),
        floodgate_shared::time::SystemClock,
        settings,
    );
    let upstream = RawUpstream::start().await;
    let (url, _stop) = serve_native(pipeline, HostConfig::new(&upstream.url)).await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut statuses = vec![];
    for _ in 0..30 {
        let r = c
            .get(format!("{url}/far"))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    // the first requests meet a deadline still learning the store; then it is
    // waited for
    assert!(
        statuses[10..].iter().all(|s| *s == 200),
        "statuses: {statuses:?}"
    );
    let health: serde_json::Value = c
        .get(format!("{url}/__floodgate/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ceiling = health["deadlines"]["global"]["ceiling_ms"]
        .as_f64()
        .unwrap();
    assert!(
        ceiling > 120.0,
        "the ceiling rose above the round trip: {health}"
    );
}

/// Issue 38, item 2: a fresh instance's first concurrent requests, to a healthy
/// store 50 ms away one way that has not loaded the scripts yet, are all
/// answered — on both hosts, with their default deadlines. A script's first call
/// goes with its source (`EVAL`): it never pays a `NOSCRIPT` round trip and then
/// `EVAL` within one round trip's deadline. (Before: 20 concurrent first
/// requests of a native instance got 503s: "no reply within 100ms".)
async fn a_fresh_instances_first_requests_to_a_far_store_are_answered(
    kind: floodgate_tests::EdgeKind,
) {
    let redis = RedisServer::start();
    let secret = seed(&redis, CONFIG).await.secret;
    let far = LatencyProxy::start(redis.port(), Duration::from_millis(50)).await;
    let upstream = RawUpstream::start().await;
    let mut guards: Vec<Box<dyn std::any::Any>> = vec![];
    let url = match kind {
        floodgate_tests::EdgeKind::Native => {
            let deadline = DeadlineSettings::RESP;
            let transport = store_deadline(Duration::from_micros(deadline.ceiling as u64));
            let store = RespStore::connect(&far.url(), transport)
                .await
                .expect("connect");
            let settings = PipelineConfig {
                deadline,
                ..PipelineConfig::default()
            };
            let store = NativeStore::Resp(store);
            let pipeline = Pipeline::new(store, floodgate_shared::time::SystemClock, settings);
            let (url, stop) = serve_native(pipeline, HostConfig::new(&upstream.url)).await;
            guards.push(Box::new(stop));
            url
        }
        floodgate_tests::EdgeKind::Worker => {
            let token = "far-token";
            let config = floodgate_rest::EndpointConfig::new(far.url(), token);
            let endpoint = floodgate_tests::Endpoint::start_with(config).await;
            let options = floodgate_tests::EdgeOptions {
                deadline_ms: None,
                ..Default::default()
            };
            let worker =
                floodgate_tests::start_worker(&endpoint.url, token, &upstream.url, &options).await;
            let url = worker.url.clone();
            guards.push(Box::new(worker));
            guards.push(Box::new(endpoint));
            url
        }
    };
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let asked = (0..20).map(|i| {
        let c = c.clone();
        let (url, secret) = (url.clone(), secret.clone());
        tokio::spawn(async move {
            let r = c
                .get(format!("{url}/first/{i}"))
                .bearer_auth(&secret)
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        })
    });
    let mut statuses = vec![];
    for a in asked.collect::<Vec<_>>() {
        statuses.push(a.await.unwrap());
    }
    assert!(
        statuses.iter().all(|s| *s == 200),
        "{kind:?}: the first 20 concurrent requests answered {statuses:?}"
    );
}

floodgate_tests::on_both_hosts!(a_fresh_instances_first_requests_to_a_far_store_are_answered);

/// A native pipeline over the far global store at `far` and the near regional
/// store at `near`, with the host's default deadlines, served.
async fn regional_instance(
    far: &str,
    near: &str,
    upstream: &str,
) -> (String, Box<dyn std::any::Any>) {
    let deadline = DeadlineSettings::RESP;
    let transport = store_deadline(Duration::from_micros(deadline.ceiling as u64));
    let connect = |url: String| async move {
        NativeStore::Resp(RespStore::connect(&url, transport).await.expect("connect"))
    };
    let settings = PipelineConfig {
        deadline,
        ..PipelineConfig::default()
    };
    let pipeline = Pipeline::new(
        connect(far.to_string()).await,
        floodgate_shared::time::SystemClock,
        settings,
    )
    .with_regional(connect(near.to_string()).await);
    let (url, stop) = serve_native(pipeline, HostConfig::new(upstream)).await;
    (url, Box::new(stop))
}

/// Issue 38, churn: a fresh instance whose records come from its region's
/// copies (no start-up read of the far global store taught its deadline) has its
/// first exact decisions answered by the global store 50 ms away, not failed by
/// a deadline that never heard from it (the floor, 3 ms). (Before: all 20 of
/// its first concurrent requests got 503, fail-closed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_instance_reading_its_records_from_the_region_waits_for_the_far_store() {
    let (global, region) = (RedisServer::start(), RedisServer::start());
    let secret = seed(&global, CONFIG).await.secret;
    let far = LatencyProxy::start(global.port(), Duration::from_millis(50)).await;
    let upstream = RawUpstream::start().await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let get = |url: String, path: String| {
        let (c, secret) = (c.clone(), secret.clone());
        async move {
            c.get(format!("{url}{path}"))
                .bearer_auth(&secret)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // a warm instance of the region reads the records from the global store and
    // copies them to the region
    let (warm, _warm) = regional_instance(&far.url(), &region.url(), &upstream.url).await;
    assert_eq!(get(warm.clone(), "/warm".into()).await, 200);
    let copied = || {
        let mut con = region.connection();
        redis::cmd("HLEN")
            .arg("fg:copies")
            .query::<u64>(&mut con)
            .unwrap()
    };
    for _ in 0..100 {
        if copied() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(copied() >= 3, "the records were copied to the region");
    let (fresh, _fresh) = regional_instance(&far.url(), &region.url(), &upstream.url).await;
    let asked: Vec<_> = (0..20)
        .map(|i| tokio::spawn(get(fresh.clone(), format!("/first/{i}"))))
        .collect();
    let mut statuses = vec![];
    for a in asked {
        statuses.push(a.await.unwrap());
    }
    assert!(
        statuses.iter().all(|s| *s == 200),
        "the fresh instance's first 20 concurrent requests answered {statuses:?}"
    );
}
