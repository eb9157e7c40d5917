//! A healthy store under a burst is waited for, not failed (issue 22: the Worker
//! answered `503 … no reply within 246ms` to 3 of 1,000 requests from 3 × 40
//! connections against one healthy floodgate-rest, and one token went to a
//! refused request). With the hosts' default, adaptive deadlines, three edges ×
//! 40 connections on one store: exactly the quota admitted, every other answer a
//! 429, none a 503, on both hosts.

use std::sync::Arc;
use std::time::Duration;

use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{EdgeKind, EdgeOptions, RedisServer, on_both_hosts, seed, start_edge_with};

on_both_hosts!(a_burst_on_a_healthy_store_gets_the_quota_and_no_503);

const CONFIG: &str = r#"{"policies":[{"name":"default","dimensions":["api_key"],
    "quota":{"capacity":300,"refill":1,"period":"1h"},"failure_mode":"fail_closed"}],
    "plans":{"free":["default"]}}"#;

async fn a_burst_on_a_healthy_store_gets_the_quota_and_no_503(kind: EdgeKind) {
    let redis = RedisServer::start();
    let secret = seed(&redis, CONFIG).await.secret;
    let upstream = RawUpstream::start().await;
    let options = EdgeOptions {
        deadline_ms: None,
        ..EdgeOptions::default()
    };
    let mut edges = vec![];
    for _ in 0..3 {
        edges.push(start_edge_with(kind, &redis, &upstream.url, &options).await);
    }
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(40)
        .build()
        .unwrap();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..3 * 40 {
        let (c, next, secret) = (c.clone(), next.clone(), secret.clone());
        let url = format!("{}/v1/burst", edges[n % 3].url);
        tasks.spawn(async move {
            let mut statuses = vec![];
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 1_000 {
                let r = c.get(&url).bearer_auth(&secret).send().await.unwrap();
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                statuses.push((status, text));
            }
            statuses
        });
    }
    let mut all = vec![];
    while let Some(done) = tasks.join_next().await {
        all.extend(done.unwrap());
    }
    let count = |s: u16| all.iter().filter(|(st, _)| *st == s).count();
    let refused: Vec<&String> = all
        .iter()
        .filter(|(s, _)| *s == 503)
        .map(|(_, t)| t)
        .collect();
    assert!(
        refused.is_empty(),
        "{} answered 503: {:?}",
        refused.len(),
        &refused[..refused.len().min(3)]
    );
    assert_eq!(all.len(), 1_000);
    assert_eq!(count(200), 300, "exactly the quota");
    assert_eq!(count(429), 700);
    assert_eq!(upstream.total(), 300);
}
