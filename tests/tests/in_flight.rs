//! The concurrency limiter (`max_in_flight`) with real Redis, through the native
//! host, under cancellation: slots are taken on request and come back on response,
//! on client disconnect and on upstream timeout; slots nobody releases expire.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use floodgate_edge::admin;
use floodgate_edge::native_host::{HostConfig, NativeStore};
use floodgate_edge::pipeline::{Pipeline, PipelineConfig};
use floodgate_edge::store::Store;
use floodgate_edge::store::resp::RespStore;
use floodgate_tests::{RedisServer, serve, serve_native};
use redis::Commands;
use reqwest::StatusCode;

const LIMIT: usize = 3;
const CONFIG: &str = r#"{"policies":[{"name":"default","dimensions":["api_key"],
  "quota":{"capacity":100000,"period":"1m"},"failure_mode":"fail_closed","max_in_flight":3}],
  "plans":{"free":["default"]}}"#;

/// An upstream that counts requests in flight (and the most seen at once).
#[derive(Clone, Default)]
struct Gauge {
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

fn upstream(g: Gauge) -> axum::Router {
    let slow = move |axum::extract::Path(ms): axum::extract::Path<u64>| {
        let g = g.clone();
        async move {
            let n = g.now.fetch_add(1, Ordering::SeqCst) + 1;
            g.most.fetch_max(n, Ordering::SeqCst);
            // decrements even when the edge drops this request
            struct Leave(Arc<AtomicUsize>);
            impl Drop for Leave {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let _leave = Leave(g.now.clone());
            tokio::time::sleep(Duration::from_millis(ms)).await;
            "done"
        }
    };
    axum::Router::new().route("/sleep/{ms}", axum::routing::get(slow))
}

struct Stack {
    redis: RedisServer,
    edge: String,
    auth: String,
    slots_key: String,
    gauge: Gauge,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

async fn stack() -> Stack {
    stack_with(Duration::from_millis(400)).await
}

async fn stack_with(upstream_timeout: Duration) -> Stack {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&store, CONFIG).await.unwrap();
    let (record, secret) = admin::create_key(&store, "tests", "free", 1_764_000_000)
        .await
        .unwrap();
    let gauge = Gauge::default();
    let (up_url, up_stop) = serve(upstream(gauge.clone())).await;
    let pipeline = Pipeline::new(
        NativeStore::Resp(store),
        floodgate_shared::time::SystemClock,
        PipelineConfig {
            deadline: floodgate_edge::deadline::DeadlineSettings::fixed(2_000_000),
            ..PipelineConfig::default()
        },
    );
    let mut host = HostConfig::new(&up_url);
    host.rules.timeouts.upstream = upstream_timeout;
    let (edge, edge_stop) = serve_native(pipeline, host).await;
    Stack {
        slots_key: format!("fg:{{k:{}}}:default:inflight", record.id),
        redis,
        edge,
        auth: format!("Bearer {secret}"),
        gauge,
        _stops: vec![up_stop, edge_stop],
    }
}

impl Stack {
    fn held(&self) -> usize {
        self.redis.connection().zcard(&self.slots_key).unwrap()
    }

    /// Waits (bounded) until `want` slots are held; returns how long it took.
    async fn until_held(&self, want: usize, limit: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let held = self.held();
            if held == want {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < limit,
                "{held} slots held after {limit:?}, expected {want}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn get(&self, path: &str) -> impl Future<Output = reqwest::Result<reqwest::Response>> + use<> {
        reqwest::Client::new()
            .get(format!("{}{path}", self.edge))
            .header("authorization", &self.auth)
            .send()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_come_back_on_response_disconnect_and_upstream_timeout() {
    let s = stack().await;
    // completion: sequential requests never hold a slot after their response
    for _ in 0..5 {
        let r = s.get("/sleep/1").await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.text().await.unwrap(), "done");
    }
    s.until_held(0, Duration::from_secs(2)).await;

    // three requests in flight fill the limit; the fourth is refused
    let hung: Vec<_> = (0..LIMIT)
        .map(|_| tokio::spawn(s.get("/sleep/20000")))
        .collect();
    s.until_held(LIMIT, Duration::from_secs(5)).await;
    let r = s.get("/sleep/1").await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    assert!(r.text().await.unwrap().contains("in flight"));

    // client disconnect: dropping the requests gives the slots back long before
    // the upstream would have answered (20 s)
    for h in &hung {
        h.abort();
    }
    let took = s.until_held(0, Duration::from_secs(5)).await;
    assert!(took < Duration::from_secs(5));
    assert_eq!(s.get("/sleep/1").await.unwrap().status(), StatusCode::OK);

    // the host answers its health endpoint itself
    let h: serde_json::Value = reqwest::get(format!("{}/__floodgate/health", s.edge))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["breaker"], "closed");
    assert_eq!(h["degraded_requests"]["fail_closed"], 0);
    assert_eq!(s.gauge.most.load(Ordering::SeqCst), LIMIT);

    // upstream timeout (400 ms): 504, and the slot is released
    let r = s.get("/sleep/5000").await.unwrap();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    s.until_held(0, Duration::from_secs(2)).await;
}

/// Clients that leave a slow request (issue 22: two clients that left a 10 s
/// request after 0.5 s still held both slots a second later, and their upstream
/// requests ran on): the upstream requests are cancelled and the slots come back
/// at once, long before the upstream's timeout (30 s here) or answer (20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_cancels_its_upstream_request_and_frees_its_slot() {
    let s = stack_with(Duration::from_secs(30)).await;
    let hung: Vec<_> = (0..LIMIT)
        .map(|_| tokio::spawn(s.get("/sleep/20000")))
        .collect();
    s.until_held(LIMIT, Duration::from_secs(5)).await;
    let waits_upstream = Instant::now() + Duration::from_secs(5);
    while s.gauge.now.load(Ordering::SeqCst) < LIMIT {
        assert!(
            Instant::now() < waits_upstream,
            "the upstream sees the requests"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = s.get("/sleep/1").await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // the clients leave: their connections close
    for h in &hung {
        h.abort();
    }
    s.until_held(0, Duration::from_secs(2)).await;
    let cancelled = Instant::now() + Duration::from_secs(2);
    while s.gauge.now.load(Ordering::SeqCst) > 0 {
        assert!(
            Instant::now() < cancelled,
            "{} upstream requests still running for clients that left",
            s.gauge.now.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.get("/sleep/1").await.unwrap().status(), StatusCode::OK);
}

/// Many concurrent requests, a random half of them cancelled at random moments:
/// the upstream never sees more than the limit at once, and every slot comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_random_cancellation_the_limit_holds_and_no_slot_leaks() {
    use rand::Rng;
    let s = stack().await;
    let mut rng = rand::rng();
    let mut tasks = vec![];
    let started = Instant::now();
    for _ in 0..40 {
        let fut = s.get("/sleep/150");
        let cancel_after = rng.random_bool(0.5).then(|| rng.random_range(0..200u64));
        tasks.push(tokio::spawn(async move {
            match cancel_after {
                Some(ms) => tokio::time::timeout(Duration::from_millis(ms), fut)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|r| r.status()),
                None => fut.await.ok().map(|r| r.status()),
            }
        }));
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
    let mut ok = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            Some(StatusCode::OK) => ok += 1,
            Some(StatusCode::TOO_MANY_REQUESTS) => refused += 1,
            _ => {}
        }
    }
    assert!(started.elapsed() < Duration::from_secs(20));
    s.until_held(0, Duration::from_secs(5)).await;
    let most = s.gauge.most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "the upstream saw {most} requests at once");
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
    println!("in-flight under cancellation: {ok} ok, {refused} refused, at most {most} at once");
}

/// A crashed instance never releases its slots: they expire after their TTL.
#[tokio::test]
async fn slots_nobody_releases_expire() {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    let key = "fg:{k:leak}:p:inflight";
    assert!(store.acquire_slot(key, "a", 2, 300, None).await.unwrap());
    assert!(store.acquire_slot(key, "b", 2, 300, None).await.unwrap());
    assert!(
        !store.acquire_slot(key, "c", 2, 300, None).await.unwrap(),
        "full"
    );
    store.release_slot(key, "a").await.unwrap();
    assert!(
        store.acquire_slot(key, "c", 2, 300, None).await.unwrap(),
        "released"
    );
    assert!(!store.acquire_slot(key, "d", 2, 300, None).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store.acquire_slot(key, "d", 2, 300, None).await.unwrap(),
        "expired"
    );
    let ttl: i64 = redis.connection().pttl(key).unwrap();
    assert!(
        (1..=300).contains(&ttl),
        "the set expires with its last slot: {ttl}"
    );
    let mut c = redis.connection();
    let bad: redis::RedisResult<()> = redis::cmd("EVAL")
        .arg(floodgate_shared::script::IN_FLIGHT.source)
        .arg(1)
        .arg(key)
        .arg("x")
        .arg(0)
        .arg(100)
        .query(&mut c);
    assert!(bad.unwrap_err().to_string().contains("bad in-flight limit"));
}
