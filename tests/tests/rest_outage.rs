//! The edge at an outage's edge (issue 41, item 4): under load, the REST
//! endpoint in front of Redis is killed (-9) and started again, with a
//! fail-closed policy, on both hosts over the same REST protocol — the Worker in
//! workerd and the native `floodgate-edge --rest-url`, both real processes.
//!
//! - Every admission is decided by the store or marked degraded: the 200s without
//!   `X-RateLimit-Degraded` are never more than the tokens the store's bucket
//!   lost (a reply lost in the kill may make the store count more, never fewer).
//! - Recovery looks the same on both hosts: once the endpoint is back, each is
//!   admitting again within the breaker's cool-down plus a margin, and neither
//!   keeps refusing past it.
//!
//! Loopback only; the load is bounded in time and count.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_tests::process::{Daemon, listening};
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{
    EdgeKind, EdgeOptions, RedisServer, free_port, on_both_hosts, seed, start_worker,
};

/// Fail-closed, and a quota that neither runs out nor refills measurably during
/// the test (1,000,000 a month: 0.4 a second), so the bucket's loss is the
/// store's admissions.
const CAPACITY: f64 = 1_000_000.0;
const PERIOD_S: f64 = 30.0 * 86_400.0;
const CONFIG: &str = r#"{"policies":[{"name":"default","dimensions":["api_key"],
    "quota":{"capacity":1000000,"period":"30d"},"failure_mode":"fail_closed"}],
    "plans":{"free":["default"]}}"#;
const TOKEN: &str = "outage-test-token";
const WORKERS: usize = 4;
/// Each worker's requests at most, and the load's phases.
const MAX_REQUESTS: usize = 20_000;
const KILL_AT: Duration = Duration::from_millis(1_500);
const BACK_AT: Duration = Duration::from_millis(3_000);
const END_AT: Duration = Duration::from_millis(6_000);

fn rest_endpoint(redis: &RedisServer, port: u16) -> Daemon {
    let listen = format!("127.0.0.1:{port}");
    Daemon::start(
        "floodgate-rest",
        &["--listen", &listen, "--redis", &redis.url()],
        &[("FLOODGATE_REST_TOKEN", TOKEN)],
        port,
    )
}

/// One answer: when (since the load began), its status, and whether it was
/// marked degraded.
#[derive(Debug, Clone, Copy)]
struct Answer {
    at: Duration,
    status: u16,
    degraded: bool,
}

async fn load(url: String, secret: String, began: Instant) -> Vec<Answer> {
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut out = vec![];
    while began.elapsed() < END_AT && out.len() < MAX_REQUESTS {
        let r = c
            .get(format!("{url}/thing"))
            .bearer_auth(&secret)
            .send()
            .await;
        let at = began.elapsed();
        // a transport error is the client's view of a failure: not an admission
        let (status, degraded) = match r {
            Ok(r) => (
                r.status().as_u16(),
                r.headers().contains_key("x-ratelimit-degraded"),
            ),
            Err(_) => (0, false),
        };
        out.push(Answer {
            at,
            status,
            degraded,
        });
        if status != 200 {
            // refused: pace the retries as a client would, not a spin
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    out
}

/// The tokens the bucket misses now: a token bucket is stored as the instant
/// (µs) it is full again, one token per `PERIOD_S / CAPACITY` s before it.
fn tokens_missing(redis: &RedisServer, key_id: &str) -> f64 {
    let mut c = redis.connection();
    let full_at: String = redis::cmd("GET")
        .arg(format!("fg:{{k:{key_id}}}:default"))
        .query(&mut c)
        .unwrap();
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut c).unwrap();
    let now = (s * 1_000_000 + us) as f64;
    let per_token = PERIOD_S * 1e6 / CAPACITY;
    ((full_at.parse::<f64>().unwrap() - now) / per_token).max(0.0)
}

async fn the_edge_at_an_outages_edge(kind: EdgeKind) {
    let redis = RedisServer::start();
    let seeded = seed(&redis, CONFIG).await;
    let upstream = RawUpstream::start().await;
    let port = free_port();
    let rest_url = format!("http://127.0.0.1:{port}");
    let mut first = rest_endpoint(&redis, port);
    // the hosts' own deadlines and breakers, as deployed
    let options = EdgeOptions {
        deadline_ms: None,
        ..EdgeOptions::default()
    };
    let (url, _guard): (String, Box<dyn std::any::Any>) = match kind {
        EdgeKind::Worker => {
            let w = start_worker(&rest_url, TOKEN, &upstream.url, &options).await;
            (w.url.clone(), Box::new(w))
        }
        EdgeKind::Native => {
            let (d, listen) = listening(
                "floodgate-edge",
                &["--upstream", &upstream.url, "--rest-url", &rest_url],
                &[("FLOODGATE_REST_TOKEN", TOKEN)],
            );
            (format!("http://{listen}"), Box::new(d))
        }
    };
    let began = Instant::now();
    let answers = Arc::new(Mutex::new(vec![]));
    let tasks: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (url, secret, answers) = (url.clone(), seeded.secret.clone(), answers.clone());
            tokio::spawn(async move {
                let mine = load(url, secret, began).await;
                answers.lock().unwrap().extend(mine);
            })
        })
        .collect();
    tokio::time::sleep(KILL_AT).await;
    first.signal("KILL");
    let _ = first.wait_exit(Duration::from_secs(5));
    let killed = began.elapsed();
    tokio::time::sleep(BACK_AT.saturating_sub(began.elapsed())).await;
    let _back = rest_endpoint(&redis, port);
    let back = began.elapsed();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = began.elapsed().as_secs_f64();
    let mut answers = answers.lock().unwrap().clone();
    answers.sort_by_key(|a| a.at);

    // every admission is the store's or marked degraded
    let undegraded_admits = answers
        .iter()
        .filter(|a| a.status == 200 && !a.degraded)
        .count();
    let refill = CAPACITY / PERIOD_S * elapsed;
    // what the store admitted: what the bucket misses, and what refilled meanwhile
    let store_admits = tokens_missing(&redis, &seeded.key_id);
    let degraded_admits = answers
        .iter()
        .filter(|a| a.status == 200 && a.degraded)
        .count();
    let during: Vec<_> = answers
        .iter()
        // (an answer sent just before the kill may arrive just after it)
        .filter(|a| a.at > killed + Duration::from_millis(250) && a.at < back)
        .map(|a| (a.status, a.degraded))
        .collect();
    let after_back: Vec<_> = answers.iter().filter(|a| a.at >= back).collect();
    let first_admit = after_back
        .iter()
        .find(|a| a.status == 200)
        .map(|a| a.at - back);
    let refused_after = after_back.iter().filter(|a| a.status != 200).count();
    let last_refusal = after_back
        .iter()
        .rev()
        .find(|a| a.status != 200)
        .map(|a| a.at - back);
    eprintln!(
        "{kind:?}: {} answers; admitted without degraded {undegraded_admits}, by the store {store_admits:.1} \
         (+ refill ≤ {refill:.1}), degraded {degraded_admits}; killed at {killed:?}, back at {back:?}; \
         after: first 200 {first_admit:?} after, {refused_after} refused, the last {last_refusal:?} after",
        answers.len()
    );
    assert!(
        undegraded_admits as f64 <= store_admits + refill + 0.5,
        "{kind:?}: {undegraded_admits} admissions without X-RateLimit-Degraded, the store decided {store_admits:.1}"
    );
    assert_eq!(
        degraded_admits, 0,
        "{kind:?}: fail_closed admitted degraded"
    );
    assert!(
        during.iter().all(|(s, _)| *s != 200),
        "{kind:?}: admitted while the endpoint was down: {during:?}"
    );
    // recovery: within the breaker's cool-down (1 s) and a health check's margin
    let bound = Duration::from_millis(2_500);
    assert!(
        first_admit.is_some_and(|t| t < bound),
        "{kind:?}: first admission {first_admit:?} after the endpoint came back"
    );
    assert!(
        last_refusal.is_none_or(|t| t < bound),
        "{kind:?}: still refusing {last_refusal:?} after the endpoint came back ({refused_after} refused)"
    );
}

on_both_hosts!(the_edge_at_an_outages_edge);
