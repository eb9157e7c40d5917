//! A native edge started while its Redis is unreachable (issue 22: it exited
//! with `connect: no answer within 2s`, so a restart or a scale-out during an
//! outage served nobody): it starts, answers by failure mode meanwhile, and
//! decides exactly once Redis answers — as the Worker does.

use std::time::{Duration, Instant};

use floodgate_tests::process::listening;
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{RedisServer, free_port, seed};

const CONFIG: &str = r#"{"policies":[{"name":"default","dimensions":["api_key"],
    "quota":{"capacity":1000,"refill":1000,"period":"1m"},"failure_mode":"fail_closed"}],
    "plans":{"free":["default"]}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_started_during_an_outage_serves_once_redis_is_back() {
    let port = free_port();
    let upstream = RawUpstream::start().await;
    let redis_url = format!("redis://127.0.0.1:{port}/");
    let (edge, listen) = listening(
        "floodgate-edge",
        &["--upstream", &upstream.url, "--redis", &redis_url],
        &[],
    );
    let url = format!("http://{listen}");
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // no Redis: the edge is up and refuses by failure mode, clearly (a
    // well-formed key it cannot look up)
    let (_, unknown) = floodgate_shared::apikeys::new_secret(&[9u8; 42]);
    let r = c
        .get(format!("{url}/v1/x"))
        .bearer_auth(&unknown)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503, "{}", edge.stderr());
    assert!(
        edge.stderr().contains("not reachable yet"),
        "{}",
        edge.stderr()
    );
    // ... and says so at its health endpoint
    assert_eq!(connected(&c, &url).await, Some(false));
    // Redis comes up: the edge reconnects on its own and decides
    let redis = RedisServer::start_on(port, &[]);
    let secret = seed(&redis, CONFIG).await.secret;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = c
            .get(format!("{url}/v1/x"))
            .bearer_auth(&secret)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            assert_eq!(r.headers()["x-ratelimit-limit"], "1000");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {} after Redis came back: {}",
            r.status(),
            edge.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(upstream.total() >= 1);
    assert_eq!(connected(&c, &url).await, Some(true));
    drop(edge);
}

/// The health endpoint's `connected` field.
async fn connected(c: &reqwest::Client, url: &str) -> Option<bool> {
    let r = c
        .get(format!("{url}/__floodgate/health"))
        .send()
        .await
        .ok()?;
    let v: serde_json::Value = r.json().await.ok()?;
    v["connected"].as_bool()
}
