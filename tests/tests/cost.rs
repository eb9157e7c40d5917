//! What a deployment's Redis bill counts (issue 22): every command, those a script
//! runs included — here `INFO commandstats` of the one redis-server behind the
//! edge, which counts the same way. An exact decision is ONE script call running
//! TIME, one MGET and one SET (4 billed commands); what an instance writes about
//! its traffic (statistics, key last use) and its record checks are paid per
//! flush interval and per TTL, not per request: a flush is ONE script call.
//! Printed per host, side by side.
//! A key with credits pays for them in the same call: limiter.lua's GET and SET
//! of the live count (6 billed commands); a key without credits pays exactly
//! what it did before credits existed.

use std::time::Duration;

use floodgate_edge::admin;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::keychanges::{CreditsInput, KeyChanges};
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{EdgeKind, EdgeOptions, RedisServer, on_both_hosts, seed, start_edge_with};

on_both_hosts!(
    an_exact_decision_bills_four_commands_and_bookkeeping_almost_none,
    a_decision_with_credits_bills_six_commands_in_the_same_call,
);

const CONFIG: &str = r#"{"policies":[{"name":"default","dimensions":["api_key"],
    "quota":{"capacity":100000,"refill":100000,"period":"1m"},"failure_mode":"fail_closed"}],
    "plans":{"free":["default"]}}"#;

/// Every command the server ran since the last reset, by name (INFO and CONFIG,
/// this test's own, left out).
fn billed(redis: &RedisServer) -> Vec<(String, u64)> {
    floodgate_tests::scale::billed_by_name(&mut redis.connection())
}

async fn an_exact_decision_bills_four_commands_and_bookkeeping_almost_none(kind: EdgeKind) {
    let redis = RedisServer::start();
    let secret = seed(&redis, CONFIG).await.secret;
    let (n, per_request, by_name) = measure(kind, &redis, &secret).await;
    one_script_call_per_decision_and_per_flush(n, &by_name);
    assert!(
        per_request <= 4.1,
        "{per_request:.3} billed commands per request: {by_name:?}"
    );
}

/// The same with a key holding credits: still one script call per decision, two
/// more commands in it (the live count's GET and SET).
async fn a_decision_with_credits_bills_six_commands_in_the_same_call(kind: EdgeKind) {
    let redis = RedisServer::start();
    seed(&redis, CONFIG).await;
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    let new = KeyChanges {
        plan: Some("free".into()),
        credits: Some(Some(
            serde_json::from_str::<CreditsInput>(r#"{"remaining": 100000}"#).unwrap(),
        )),
        ..KeyChanges::default()
    };
    let (_, secret) = admin::create_key_with(&store, &new, 1_764_000_000)
        .await
        .unwrap();
    let (n, per_request, by_name) = measure(kind, &redis, &secret).await;
    let calls = |name: &str| calls(&by_name, name);
    one_script_call_per_decision_and_per_flush(n, &by_name);
    assert!(
        (2 * n..=2 * n + 20).contains(&calls("get")),
        "the bucket and the live count, read in the call: {by_name:?}"
    );
    assert!(
        (5.9..=6.1).contains(&per_request),
        "{per_request:.3} billed commands per request: {by_name:?}"
    );
}

fn calls(by_name: &[(String, u64)], name: &str) -> u64 {
    by_name
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, c)| *c)
}

/// Every decision is ONE script call, and so is every statistics flush
/// (`lua/stats_flush.lua`: its `LPUSH` of the sample, one per flush here as every
/// decision is sampled, runs inside it), with no `LTRIM` at this volume.
fn one_script_call_per_decision_and_per_flush(n: u64, by_name: &[(String, u64)]) {
    let flushes = calls(by_name, "lpush");
    assert!(
        (1..=4).contains(&flushes),
        "a flush per 2 s interval: {by_name:?}"
    );
    assert_eq!(
        calls(by_name, "evalsha") + calls(by_name, "eval"),
        n + flushes,
        "one script call per decision and one per flush: {by_name:?}"
    );
    assert_eq!(calls(by_name, "ltrim"), 0, "{by_name:?}");
}

/// 400 requests of `secret` through one edge, after a warm-up: the requests, the
/// billed commands per request, and the commands by name.
async fn measure(
    kind: EdgeKind,
    redis: &RedisServer,
    secret: &str,
) -> (u64, f64, Vec<(String, u64)>) {
    let upstream = RawUpstream::start().await;
    let options = EdgeOptions {
        stats_flush_ms: 2_000,
        ..EdgeOptions::default()
    };
    let edge = start_edge_with(kind, redis, &upstream.url, &options).await;
    let c = reqwest::Client::new();
    let get = async |path: &str| {
        let r = c
            .get(format!("{}{path}", edge.url))
            .bearer_auth(secret)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    };
    // warm: the records cached, the scripts loaded
    for _ in 0..20 {
        get("/warm").await;
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut redis.connection())
        .unwrap();
    let n = 400u64;
    for _ in 0..n {
        get("/v1/items").await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // one more flush interval: the statistics of these requests are written
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let by_name = billed(redis);
    let total: u64 = by_name.iter().map(|(_, c)| c).sum();
    let per_request = total as f64 / n as f64;
    println!(
        "{kind:?}: {total} billed commands for {n} requests = {per_request:.3} per request: {by_name:?}"
    );
    (n, per_request, by_name)
}
