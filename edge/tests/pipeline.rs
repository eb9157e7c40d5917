//! The pipeline against an in-memory store and a fake clock: caching, failure
//! modes, and one store round trip per admitted request.

mod common;

use std::sync::atomic::Ordering;

use common::{
    MemStore, T0, advance, changed, edit_key, head, header, mem, minute_sum, retry_after, seed,
    set_key_status, settle, status,
};
use floodgate_edge::pipeline::{Admit, Pipeline, PipelineConfig, RequestHead};
use floodgate_shared::apikeys::{KeyStatus, new_secret};
use floodgate_shared::changes::Change;
use floodgate_shared::config::CONFIG_KEY;
use floodgate_shared::time::{Clock, FakeClock, MICROS_PER_SEC};

const CONFIG: &str = r#"{"policies":[
  {"name":"default","dimensions":["api_key"],"quota":{"capacity":3,"period":"1m"},"failure_mode":"fail_closed"},
  {"name":"soft","dimensions":["api_key"],"quota":{"capacity":3,"period":"1m"},"failure_mode":"fail_open"},
  {"name":"local","dimensions":["api_key"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"local_fallback","local_share_percent":20},
  {"name":"one_at_a_time","dimensions":["api_key"],"quota":{"capacity":3,"period":"1m"},"failure_mode":"fail_closed","max_in_flight":1}],
  "plans":{"free":["default"],"lenient":["soft"],"fallback":["local"],"mixed":["soft","local"],"single":["one_at_a_time"]}}"#;

#[tokio::test]
async fn a_warm_request_costs_one_store_round_trip() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    let statuses: Vec<u16> = futures_statuses(&p, &auth, 4).await;
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        2,
        "config and key fetched once, then cached"
    );
    assert_eq!(
        store.checks.load(Ordering::SeqCst),
        4,
        "one check call per request"
    );
}

#[tokio::test]
async fn a_denied_request_is_a_403_without_a_store_call_and_costs_no_quota() {
    let store = mem();
    let config = CONFIG.replacen(
        r#""plans":"#,
        r#""deny":{"ips":["198.51.100.0/24"],"user_agents":["BadBot"],"countries":["KP"]},"plans":"#,
        1,
    );
    let auth = seed(store, &config, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    // warm the caches (config and key: two reads, one check)
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    let (gets, checks) = (
        store.gets.load(Ordering::SeqCst),
        store.checks.load(Ordering::SeqCst),
    );
    let denied = [
        RequestHead {
            client_ip: Some("198.51.100.77".parse().unwrap()),
            ..head(&auth)
        },
        RequestHead {
            user_agent: Some(b"x BADBOT y"),
            ..head(&auth)
        },
        RequestHead {
            country: Some("KP"),
            ..head(&auth)
        },
    ];
    for _ in 0..5 {
        for h in denied {
            let g = settle(p.gate(h).await).await;
            assert_eq!(status(&g), 403);
            assert_eq!(header(&g, "x-ratelimit-remaining"), None);
        }
    }
    assert_eq!(store.gets.load(Ordering::SeqCst), gets, "no read");
    assert_eq!(
        store.checks.load(Ordering::SeqCst),
        checks,
        "no bucket check"
    );
    // the 15 denied requests left the bucket as it was: the next admitted one
    // leaves 1 of 3
    let g = settle(p.gate(head(&auth)).await).await;
    assert_eq!(header(&g, "x-ratelimit-remaining"), Some("1"));
    // other addresses, agents and countries pass
    let other = RequestHead {
        client_ip: Some("198.51.101.1".parse().unwrap()),
        user_agent: Some(b"curl/8"),
        country: Some("DE"),
        ..head(&auth)
    };
    assert_eq!(status(&settle(p.gate(other).await).await), 200);
}

async fn futures_statuses<C: Clock>(
    p: &Pipeline<&'static MemStore, C>,
    auth: &str,
    n: usize,
) -> Vec<u16> {
    let mut out = vec![];
    for _ in 0..n {
        out.push(status(&p.gate(head(auth)).await.gate));
    }
    out
}

/// `settings` with the caches fresh for a second.
fn one_second_cache(settings: PipelineConfig) -> PipelineConfig {
    PipelineConfig {
        cache_ttl: MICROS_PER_SEC,
        ..settings
    }
}

/// Defaults, but the breaker stays closed: the store is asked whatever it answers.
fn asked_store() -> PipelineConfig {
    PipelineConfig {
        breaker_threshold: 100,
        ..PipelineConfig::default()
    }
}

/// The caches expire after their TTL, but an instance that holds a copy never
/// makes a request wait for the global store: the expired configuration and key
/// record are served while ONE background read refreshes both; a revocation is
/// seen once that read is back, a broken configuration never replaces the last
/// good one. (Before: every request after the TTL read both on its own path, all
/// of them until the first read came back: a global round trip every TTL.)
#[tokio::test]
async fn an_expired_cache_is_served_while_one_background_read_refreshes_it() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, one_second_cache(PipelineConfig::default()));
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    let cold = store.gets.load(Ordering::SeqCst);
    assert_eq!(
        cold, 2,
        "a cold instance reads the configuration and the key"
    );
    // the key is revoked once the copies have expired (less than a TTL ago)
    advance(&clock, store, 1_500_000);
    set_key_status(store, KeyStatus::Revoked);
    let first = p.gate(head(&auth)).await;
    assert_eq!(status(&first.gate), 200, "served from the expired copies");
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        cold,
        "nothing read on the request's path"
    );
    let second = p.gate(head(&auth)).await;
    assert_eq!(status(&settle(second).await), 200);
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        cold,
        "one refresh at a time: the second request started none"
    );
    let _ = settle(first).await;
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        cold + 1,
        "the first request's background work read what changed: the key, not the configuration"
    );
    assert_eq!(
        status(&p.gate(head(&auth)).await.gate),
        401,
        "the revocation is seen"
    );
    // a broken configuration written meanwhile: the last good one keeps serving
    set_key_status(store, KeyStatus::Active);
    store
        .records
        .lock()
        .unwrap()
        .insert(CONFIG_KEY.into(), b"{broken".to_vec());
    changed(store, Change::Config);
    advance(&clock, store, 60 * MICROS_PER_SEC);
    let gets = store.gets.load(Ordering::SeqCst);
    let _ = settle(p.gate(head(&auth)).await).await;
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        gets + 2,
        "the broken one is read once, then the good one serves another TTL"
    );
    assert_eq!(p.breaker_phase(), floodgate_edge::breaker::Phase::Closed);
}

/// A key past its `expires_at` is refused (401 `API key expired`) from the record
/// the instance holds, at its second: no store call on the way, no quota spent.
#[tokio::test]
async fn an_expired_key_is_refused_from_the_cached_record_without_a_store_call() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    // within the cache's TTL (5 s): the record stays fresh throughout
    let expires = T0 / MICROS_PER_SEC + 2;
    edit_key(store, |r| r.expires_at = Some(expires));
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    let calls = |s: &MemStore| {
        (
            s.gets.load(Ordering::SeqCst),
            s.checks.load(Ordering::SeqCst),
        )
    };
    let before = calls(store);
    // one microsecond before the second it expires at: still admitted
    advance(&clock, store, 2 * MICROS_PER_SEC - 1);
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    let before = (before.0, before.1 + 1);
    advance(&clock, store, 1);
    for _ in 0..3 {
        let d = p.gate(head(&auth)).await;
        let Err(reply) = &d.gate else {
            panic!("an expired key was admitted")
        };
        assert_eq!(reply.status, 401);
        assert_eq!(reply.body, r#"{"error":"API key expired"}"#);
        let _ = settle(d).await;
    }
    assert_eq!(
        calls(store),
        before,
        "no read, no check: the cached record decided"
    );
}

/// Stale copies are served for one TTL past their expiry, no longer: an instance
/// that was idle for longer reads the records again before answering, so a key
/// revoked meanwhile is refused at once (never admitted on a record older than
/// two TTLs while the store answers).
#[tokio::test]
async fn an_idle_instance_reads_old_records_before_answering() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, one_second_cache(PipelineConfig::default()));
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    set_key_status(store, KeyStatus::Revoked);
    advance(&clock, store, 2 * MICROS_PER_SEC);
    let gets = store.gets.load(Ordering::SeqCst);
    let d = p.gate(head(&auth)).await;
    assert_eq!(status(&d.gate), 401, "refused at once");
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        gets + 2,
        "read on the request's path"
    );
}

/// A refresh that fails (the store went down after the TTL) leaves the copies
/// serving and is tried again by a later request, not only after another TTL.
#[tokio::test]
async fn a_failed_background_refresh_is_tried_again() {
    let store = mem();
    let auth = seed(store, CONFIG, "lenient");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, one_second_cache(asked_store()));
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    advance(&clock, store, 1_500_000);
    store.down.store(true, Ordering::SeqCst);
    let _ = settle(p.gate(head(&auth)).await).await;
    let (gets, checks) = (
        store.gets.load(Ordering::SeqCst),
        store.rev_reads.load(Ordering::SeqCst),
    );
    store.down.store(false, Ordering::SeqCst);
    let _ = settle(p.gate(head(&auth)).await).await;
    assert_eq!(
        store.rev_reads.load(Ordering::SeqCst),
        checks + 1,
        "the next request checked the revision again"
    );
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        gets,
        "the revision had not moved: nothing read again"
    );
    let _ = settle(p.gate(head(&auth)).await).await;
    assert_eq!(
        store.rev_reads.load(Ordering::SeqCst),
        checks + 1,
        "and the records are fresh"
    );
}

#[tokio::test]
async fn a_store_outage_is_an_explicit_per_policy_decision() {
    for (plan, expected) in [("free", 503), ("lenient", 200)] {
        let store = mem();
        let auth = seed(store, CONFIG, plan);
        let clock = FakeClock::at(T0);
        let p = Pipeline::new(store, &clock, PipelineConfig::default());
        assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
        store.down.store(true, Ordering::SeqCst);
        let g = p.gate(head(&auth)).await.gate;
        assert_eq!(status(&g), expected, "plan {plan}");
        match g {
            Err(reply) => {
                assert_eq!(reply.header("Retry-After"), Some("1"));
                assert!(reply.body.contains("Rate limiter unavailable"));
            }
            Ok(admit) => {
                assert_eq!(admit.header("X-RateLimit-Degraded"), Some("fail-open"));
            }
        }
    }
}

#[tokio::test]
async fn unknown_plans_and_missing_config_are_refused_not_crashed() {
    let store = mem();
    let auth = seed(store, CONFIG, "gold");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 403);
    store.records.lock().unwrap().remove(CONFIG_KEY);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 503);
    store
        .records
        .lock()
        .unwrap()
        .insert(CONFIG_KEY.into(), b"{not json".to_vec());
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 503);
}

/// After a denial the instance answers that bucket itself until the exact wait is
/// over, then asks the store again.
#[tokio::test]
async fn recent_429s_are_answered_locally_until_retry_after() {
    let store = mem();
    let auth = seed(store, CONFIG, "free"); // 3 per minute: one token every 20 s
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(futures_statuses(&p, &auth, 4).await, [200, 200, 200, 429]);
    assert_eq!(store.checks.load(Ordering::SeqCst), 4);
    advance(&clock, store, MICROS_PER_SEC);
    let g = p.gate(head(&auth)).await.gate;
    assert_eq!(status(&g), 429);
    assert_eq!(retry_after(&g), Some(19));
    assert_eq!(
        store.checks.load(Ordering::SeqCst),
        4,
        "answered without the store"
    );
    advance(&clock, store, 19 * MICROS_PER_SEC - 1);
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 429);
    assert_eq!(store.checks.load(Ordering::SeqCst), 4);
    advance(&clock, store, 1);
    assert_eq!(
        status(&p.gate(head(&auth)).await.gate),
        200,
        "admitted exactly at the retry-after"
    );
    assert_eq!(store.checks.load(Ordering::SeqCst), 5);
}

/// With and without answering recent 429s locally, the same requests at the same instants get the
/// same answers: the cache never admits what the store would deny, nor denies what
/// it would admit.
#[test]
fn answering_recent_429s_locally_changes_no_decision() {
    use proptest::prelude::*;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let steps = prop::collection::vec(
        prop_oneof![
            0i64..25 * MICROS_PER_SEC,
            Just(20 * MICROS_PER_SEC),
            Just(1),
            Just(0)
        ],
        1..60,
    );
    let saved = std::cell::Cell::new(0usize);
    proptest::test_runner::TestRunner::default()
        .run(&steps, |steps| {
            let (a, b) = (mem(), mem());
            let auth = seed(a, CONFIG, "free");
            seed(b, CONFIG, "free");
            // same key in both stores
            let records = a.records.lock().unwrap().clone();
            *b.records.lock().unwrap() = records;
            let (ca, cb) = (FakeClock::at(T0), FakeClock::at(T0));
            let with = Pipeline::new(a, &ca, PipelineConfig::default());
            let without = Pipeline::new(
                b,
                &cb,
                PipelineConfig {
                    throttle_memory: false,
                    ..PipelineConfig::default()
                },
            );
            for dt in steps {
                advance(&ca, a, dt);
                advance(&cb, b, dt);
                let (x, y) = rt.block_on(async {
                    (
                        with.gate(head(&auth)).await.gate,
                        without.gate(head(&auth)).await.gate,
                    )
                });
                prop_assert_eq!(status(&x), status(&y));
                prop_assert_eq!(retry_after(&x), retry_after(&y));
            }
            let (ka, kb) = (
                a.checks.load(Ordering::SeqCst),
                b.checks.load(Ordering::SeqCst),
            );
            prop_assert!(ka <= kb);
            saved.set(saved.get() + kb - ka);
            Ok(())
        })
        .unwrap();
    assert!(
        saved.get() > 100,
        "the cache answered only {} requests itself",
        saved.get()
    );
}

/// Consecutive store failures open the breaker: requests stop calling the store
/// and get their failure mode at once; after the cool-down one probe goes through
/// and, the store being back, closes it.
#[tokio::test]
async fn the_circuit_breaker_opens_probes_and_closes() {
    use floodgate_edge::breaker::Phase;
    let store = mem();
    let auth = seed(store, CONFIG, "lenient"); // fail_open
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    store.down.store(true, Ordering::SeqCst);
    let before = store.checks.load(Ordering::SeqCst);
    for _ in 0..20 {
        assert_eq!(
            status(&p.gate(head(&auth)).await.gate),
            200,
            "fail-open while degraded"
        );
    }
    assert_eq!(
        store.checks.load(Ordering::SeqCst) - before,
        5,
        "the store is called until the breaker opens"
    );
    let stats = p.breaker_stats();
    assert_eq!((stats.opened, stats.skipped), (1, 15));
    assert_eq!(p.breaker_phase(), Phase::Open);
    // the cool-down (1 s, on the pipeline's clock) is not over a µs before its end
    advance(&clock, store, 999_999);
    let gets = store.gets.load(Ordering::SeqCst);
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        gets,
        "no health check yet"
    );
    assert_eq!(p.breaker_stats().probes, 0);
    // still down at the health check, exactly at the cool-down's end: open
    // again, without a bucket check
    advance(&clock, store, 1);
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    assert_eq!(
        store.gets.load(Ordering::SeqCst) - gets,
        1,
        "one health check (the stale key record and config are reused)"
    );
    assert_eq!(store.checks.load(Ordering::SeqCst) - before, 5);
    assert_eq!(p.breaker_phase(), Phase::Open);
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    assert_eq!(
        store.gets.load(Ordering::SeqCst) - gets,
        1,
        "one probe per cool-down"
    );
    // back up: the next health check closes the breaker, then the bucket is checked
    store.down.store(false, Ordering::SeqCst);
    advance(&clock, store, 1_000_001);
    let g = p.gate(head(&auth)).await.gate;
    assert_eq!(store.checks.load(Ordering::SeqCst) - before, 6);
    assert_eq!(status(&g), 200);
    assert!(matches!(&g, Ok(admit) if admit.header("X-RateLimit-Limit").is_some()));
    let stats = p.breaker_stats();
    assert_eq!((stats.opened, stats.closed, stats.probes), (1, 1, 2));
    // opened at T0, closed by the probe two cool-downs (and a µs) later
    assert_eq!(stats.degraded_us, 2_000_001);
    assert_eq!(p.breaker_phase(), Phase::Closed);
}

/// An outage longer than the cache TTL still applies the policies' failure mode:
/// the last key record and configuration seen keep serving while the store is
/// unreachable (a key never seen is still refused with 503).
#[tokio::test]
async fn an_outage_longer_than_the_cache_ttl_keeps_the_failure_mode() {
    let store = mem();
    let auth = seed(store, CONFIG, "lenient"); // fail_open
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, one_second_cache(asked_store()));
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    store.down.store(true, Ordering::SeqCst);
    advance(&clock, store, 10 * MICROS_PER_SEC);
    let reads = store.reads.load(Ordering::SeqCst);
    let g = settle(p.gate(head(&auth)).await).await;
    assert!(
        store.reads.load(Ordering::SeqCst) > reads,
        "the expired record was looked up again"
    );
    assert!(
        matches!(&g, Ok(admit) if admit.header("X-RateLimit-Degraded") == Some("fail-open")),
        "{g:?}"
    );
    let stranger = format!("Bearer {}", new_secret(&[9u8; 42]).1);
    assert_eq!(status(&p.gate(head(&stranger)).await.gate), 503);
}

/// local_fallback: while the store is down, each instance enforces its share of
/// the quota (20% of 10/min = 2 tokens, one more every 30 s) with the pure bucket.
#[tokio::test]
async fn local_fallback_enforces_the_local_share_while_the_store_is_down() {
    for plan in ["fallback", "mixed"] {
        let store = mem();
        let auth = seed(store, CONFIG, plan);
        let clock = FakeClock::at(T0);
        let p = Pipeline::new(store, &clock, PipelineConfig::default());
        assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
        store.down.store(true, Ordering::SeqCst);
        let mut statuses = vec![];
        for _ in 0..4 {
            let g = p.gate(head(&auth)).await.gate;
            assert_eq!(
                header(&g, "X-RateLimit-Degraded"),
                Some("local-fallback"),
                "{plan}"
            );
            statuses.push(status(&g));
            if status(&g) == 429 {
                assert_eq!(retry_after(&g), Some(30), "{plan}");
                assert_eq!(header(&g, "X-RateLimit-Limit"), Some("2"));
            }
        }
        assert_eq!(statuses, [200, 200, 429, 429], "{plan}");
        advance(&clock, store, 30 * MICROS_PER_SEC - 1);
        assert_eq!(status(&p.gate(head(&auth)).await.gate), 429);
        advance(&clock, store, 1);
        assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
        assert_eq!(status(&p.gate(head(&auth)).await.gate), 429);
        // back up: Redis decides again (its bucket saw only the first request)
        store.down.store(false, Ordering::SeqCst);
        advance(&clock, store, 2 * MICROS_PER_SEC);
        let g = p.gate(head(&auth)).await.gate;
        assert_eq!(status(&g), 200);
        assert_eq!(header(&g, "X-RateLimit-Degraded"), None);
    }
}

#[tokio::test]
async fn fail_closed_is_marked_and_wins_over_the_other_modes() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    store.down.store(true, Ordering::SeqCst);
    // cold: the key cannot be verified at all
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 503);
    store.down.store(false, Ordering::SeqCst);
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    store.down.store(true, Ordering::SeqCst);
    let g = p.gate(head(&auth)).await.gate;
    assert_eq!(status(&g), 503);
    assert_eq!(header(&g, "X-RateLimit-Degraded"), Some("fail-closed"));
    use floodgate_shared::policy::FailureMode::{self, *};
    let strictest = |modes: &[FailureMode]| FailureMode::strictest(modes.iter().copied());
    assert_eq!(strictest(&[FailOpen, LocalFallback]), LocalFallback);
    assert_eq!(
        strictest(&[LocalFallback, FailClosed, FailOpen]),
        FailClosed
    );
    assert_eq!(strictest(&[FailOpen]), FailOpen);
}

/// Degraded decisions are counted per mode and per route, the breaker's outages
/// and open time land in the per-minute hash, and the health view adds them up.
#[tokio::test]
async fn degraded_decisions_and_breaker_time_are_counted_for_the_dashboard() {
    let store = mem();
    let auth = seed(store, CONFIG, "lenient"); // fail_open
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    p.flush_pending().await.unwrap();
    store.writes.lock().unwrap().clear();
    store.down.store(true, Ordering::SeqCst);
    for _ in 0..8 {
        assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    }
    let h = p.health();
    assert_eq!(h.breaker, floodgate_edge::breaker::Phase::Open);
    assert_eq!((h.fail_open, h.fail_closed, h.local_fallback), (8, 0, 0));
    assert_eq!(h.stats.opened, 1);
    let json: serde_json::Value = serde_json::from_str(&h.to_json()).unwrap();
    assert_eq!(json["breaker"], "open");
    assert_eq!(json["degraded_requests"]["fail_open"], 8);
    // counters wait while the breaker is open, then go out once it closes
    advance(&clock, store, 2_500_000);
    p.flush_pending().await.unwrap();
    assert!(
        store.writes.lock().unwrap().is_empty(),
        "nothing written while open"
    );
    store.down.store(false, Ordering::SeqCst);
    assert_eq!(status(&p.gate(head(&auth)).await.gate), 200);
    p.flush_pending().await.unwrap();
    // per minute (the endpoint's outcome is also counted per 10 seconds)
    let sum = |field: &str| minute_sum(store, field);
    assert_eq!(sum("mode:fail_open"), 8);
    assert_eq!(sum("unmatched|degraded:fail_open"), 8);
    assert_eq!(sum("unmatched|degraded"), 8, "the modes sum to the outcome");
    assert_eq!(sum("breaker:opened"), 1);
    let open_ms = sum("breaker:open_ms");
    assert_eq!(open_ms, 2_500, "open 2.5 s on the pipeline's clock");
    assert_eq!(sum("mode:fail_closed"), 0);
}

/// Every decision is counted under each of its policies, so an operator sees
/// which policy throttled on which route: all policies of an admitted request
/// count `allowed` (a shadow one that would have denied, `shadow_throttled`); a
/// throttled request counts only under the policies that denied it (also when
/// recent 429s are answered locally); a request decided without the store counts under
/// each enforced policy with the failure mode applied.
#[tokio::test]
async fn each_policy_counts_what_it_decided() {
    let config = r#"{"policies":[
      {"name":"small","dimensions":["api_key"],"quota":{"capacity":2,"period":"1m"},"failure_mode":"fail_open"},
      {"name":"big","dimensions":["api_key"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_open"},
      {"name":"watch","dimensions":["api_key"],"quota":{"capacity":1,"period":"1m"},"failure_mode":"fail_open","shadow":true}],
      "plans":{"two":["small","big","watch"]}}"#;
    let store = mem();
    let auth = seed(store, config, "two");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(futures_statuses(&p, &auth, 4).await, [200, 200, 429, 429]);
    assert_eq!(
        store.checks.load(Ordering::SeqCst),
        3,
        "the recent 429 was answered locally the 4th time"
    );
    advance(&clock, store, 60 * MICROS_PER_SEC);
    store.down.store(true, Ordering::SeqCst);
    let g = p.gate(head(&auth)).await.gate;
    assert_eq!(header(&g, "X-RateLimit-Degraded"), Some("fail-open"));
    store.down.store(false, Ordering::SeqCst);
    p.flush_pending().await.unwrap();
    let sum = |field: &str| minute_sum(store, field);
    let counted = |policy: &str| -> Vec<(&str, u64)> {
        [
            "allowed",
            "throttled",
            "shadow_throttled",
            "degraded_fail_open",
        ]
        .into_iter()
        .map(|o| (o, sum(&format!("policy:{policy}|unmatched|{o}"))))
        .filter(|(_, n)| *n > 0)
        .collect()
    };
    assert_eq!(
        counted("small"),
        [("allowed", 2), ("throttled", 2), ("degraded_fail_open", 1)]
    );
    assert_eq!(counted("big"), [("allowed", 2), ("degraded_fail_open", 1)]);
    assert_eq!(counted("watch"), [("allowed", 1), ("shadow_throttled", 1)]);
}

/// The backtest replays the sample: every decision must be in it with what the
/// edge answered, the recent 429s answered locally and the degraded answers included.
#[tokio::test]
async fn every_decision_is_sampled_with_its_outcome_recent_429s_and_degraded_included() {
    use floodgate_shared::stats::{Endpoint, Outcome, SampleEntry};
    let store = mem();
    let auth = seed(store, CONFIG, "free"); // 3 per minute, fail_closed
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    let statuses = futures_statuses(&p, &auth, 10).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);
    assert_eq!(
        store.checks.load(Ordering::SeqCst),
        4,
        "the recent 429s answered the last 6 locally"
    );
    advance(&clock, store, 60 * MICROS_PER_SEC);
    store.down.store(true, Ordering::SeqCst);
    assert_eq!(futures_statuses(&p, &auth, 2).await, [503, 503]);
    p.flush_pending().await.unwrap();
    let writes = store.writes.lock().unwrap().clone();
    let sample: Vec<SampleEntry> = writes
        .iter()
        .flat_map(|w| w.sample.iter().map(|e| e.parse().unwrap()))
        .collect();
    let count = |o: Outcome| sample.iter().filter(|e| e.outcome == o).count();
    assert_eq!(sample.len(), 12, "{sample:?}");
    assert_eq!(
        (
            count(Outcome::Allowed),
            count(Outcome::Throttled),
            count(Outcome::Degraded)
        ),
        (3, 7, 2)
    );
    assert!(
        sample
            .iter()
            .all(|e| e.endpoint == Endpoint::Unmatched && e.plan == "free")
    );
}

/// A bucket check that misses its deadline is answered with the failure mode at
/// once; when it admits in the store later anyway, the request it admitted was
/// refused (503), so the tokens go back. A fail-open answer refunds nothing (the
/// request was served; its late call is awaited in the background only for its
/// latency, which teaches the store's deadline). On tokio's paused clock: the
/// answer comes at exactly the deadline, the late call ends when the store does.
#[tokio::test(start_paused = true)]
async fn a_late_admission_of_a_refused_request_is_refunded() {
    use std::time::Duration;
    use tokio::time::Instant;
    for (plan, refused) in [("free", true), ("lenient", false)] {
        let store = mem();
        let auth = seed(store, CONFIG, plan);
        let clock = FakeClock::at(T0);
        let p = Pipeline::new(
            store,
            &clock,
            PipelineConfig {
                deadline: floodgate_edge::deadline::DeadlineSettings::fixed(5_000), // 5 ms
                ..PipelineConfig::default()
            },
        );
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
        *store.slow.lock().unwrap() = Some(Duration::from_millis(60));
        let sent = Instant::now();
        let d = p.gate(head(&auth)).await;
        assert_eq!(
            sent.elapsed(),
            Duration::from_millis(5),
            "{plan}: answered at exactly the deadline, not when the store answers"
        );
        assert_eq!(d.background.len(), 1, "{plan}: the late call goes on");
        let g = settle(d).await;
        assert_eq!(
            sent.elapsed(),
            Duration::from_millis(60),
            "{plan}: the late call ran on to the store's reply"
        );
        assert_eq!(status(&g), if refused { 503 } else { 200 }, "{plan}");
        assert_eq!(
            store.refunds.load(Ordering::SeqCst),
            usize::from(refused),
            "{plan}"
        );
        *store.slow.lock().unwrap() = None;
        // Redis decides again: the refunded request left no trace (3 per minute,
        // one taken before, one now)
        let g = settle(p.gate(head(&auth)).await).await;
        if refused {
            assert_eq!(header(&g, "X-RateLimit-Remaining"), Some("1"), "{plan}");
        }
        assert_eq!(p.health().late_calls, 1);
        assert_eq!(p.health().refunds, u64::from(refused));
    }
}

/// A call past its deadline while the store keeps answering other calls is a
/// busy store's: it is waited for, a deadline at a time, up to the ceiling — on
/// tokio's paused clock, to the microsecond: answered when the store answers
/// (60 ms, 12 deadlines of 5 ms), refused at exactly the ceiling (100 ms) when
/// the store takes longer, and not a breaker failure either way.
#[tokio::test(start_paused = true)]
async fn a_late_call_is_waited_for_while_the_store_answers_others_up_to_the_ceiling() {
    use std::time::Duration;
    use tokio::time::{Instant, sleep};
    const ROOMY: &str = r#"{"policies":[
      {"name":"roomy","dimensions":["api_key"],"quota":{"capacity":100000,"period":"1m"},"failure_mode":"fail_closed"}],
      "plans":{"roomy":["roomy"]}}"#;
    let store = mem();
    let auth = seed(store, ROOMY, "roomy");
    let clock: &'static FakeClock = Box::leak(Box::new(FakeClock::at(T0)));
    let deadline = floodgate_edge::deadline::DeadlineSettings {
        floor: 5_000,
        ceiling: 100_000,
        ..floodgate_edge::deadline::DeadlineSettings::RESP
    };
    let settings = PipelineConfig {
        deadline,
        ..PipelineConfig::default()
    };
    let p = Pipeline::new(store, clock, settings);
    // learned: replies in no time, so the deadline is the floor
    for _ in 0..20 {
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    }
    assert_eq!(p.deadline_stats().0.deadline_us, 5_000);
    // one call of `slow` among others answered every millisecond until `until`;
    // the slow one's answer and when it came
    let (p, auth) = (&p, &auth);
    let one_slow_call = |slow: Duration, until: Duration| async move {
        *store.slow_first.lock().unwrap() = Some(slow);
        let sent = Instant::now();
        let slow_one = async {
            let d = p.gate(head(auth)).await;
            let at = sent.elapsed();
            (settle(d).await, at)
        };
        let others = async {
            while sent.elapsed() < until {
                sleep(Duration::from_millis(1)).await;
                assert_eq!(status(&settle(p.gate(head(auth)).await).await), 200);
            }
        };
        tokio::join!(slow_one, others).0
    };
    let (g, at) = one_slow_call(Duration::from_millis(60), Duration::from_millis(80)).await;
    assert_eq!(status(&g), 200, "waited for: {g:?}");
    assert_eq!(
        at,
        Duration::from_millis(60),
        "answered when the store answered"
    );
    let (stats, _) = p.deadline_stats();
    assert_eq!((stats.waited_on, stats.silent), (1, 0));
    assert_eq!(p.health().late_calls, 0);
    // the raise of that late reply forgotten (the pipeline's clock): the floor again
    advance(clock, store, 10 * MICROS_PER_SEC);
    assert_eq!(p.deadline_stats().0.deadline_us, 5_000);
    let (g, at) = one_slow_call(Duration::from_millis(200), Duration::from_millis(150)).await;
    assert_eq!(status(&g), 503, "past the ceiling: {g:?}");
    assert_eq!(
        at,
        Duration::from_millis(100),
        "refused at exactly the ceiling"
    );
    let (stats, _) = p.deadline_stats();
    assert_eq!((stats.waited_on, stats.slow, stats.silent), (1, 1, 0));
    assert_eq!(p.health().late_calls, 1);
    assert_eq!(
        p.breaker_stats().opened,
        0,
        "a busy store is not a failing one"
    );
}

/// A request admitted by its rate limit but refused by its in-flight limit gets
/// its tokens back.
#[tokio::test]
async fn a_request_refused_for_its_in_flight_limit_costs_no_tokens() {
    let store = mem();
    let auth = seed(store, CONFIG, "single"); // 3 per minute, one in flight at a time
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    let first = settle(p.gate(head(&auth)).await).await;
    assert_eq!(header(&first, "X-RateLimit-Remaining"), Some("2"));
    let Ok(Admit { slots, .. }) = &first else {
        panic!("{first:?}")
    };
    assert_eq!(slots.len(), 1);
    for _ in 0..5 {
        let g = settle(p.gate(head(&auth)).await).await;
        assert_eq!(status(&g), 429);
        assert!(matches!(&g, Err(r) if r.body.contains("in flight")));
    }
    assert_eq!(store.refunds.load(Ordering::SeqCst), 5);
    p.release_later(slots.clone())
        .expect("a slot to release")
        .await;
    let g = settle(p.gate(head(&auth)).await).await;
    assert_eq!(
        header(&g, "X-RateLimit-Remaining"),
        Some("1"),
        "five refused requests took nothing"
    );
}

/// Keys that do not exist cost one lookup each until their address's budget is
/// spent; then they are refused without a lookup, while known keys keep working.
/// A key found unknown is remembered as such.
#[tokio::test]
async fn unknown_keys_spend_their_address_budget_then_cost_no_lookups() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(
        store,
        &clock,
        PipelineConfig {
            unknown_keys_per_ip_per_min: 5,
            ..PipelineConfig::default()
        },
    );
    fn from<'a>(auth: &'a str, ip: &str) -> RequestHead<'a> {
        RequestHead {
            path: "/v1/x",
            credentials: Some(auth.as_bytes()),
            client_ip: Some(ip.parse().unwrap()),
            country: None,
            user_agent: None,
        }
    }
    let owned: Vec<String> = (0..20u8)
        .map(|i| format!("Bearer {}", new_secret(&[i + 100; 42]).1))
        .collect();
    assert_eq!(
        status(&settle(p.gate(from(&auth, "203.0.113.1")).await).await),
        200
    );
    let gets = store.gets.load(Ordering::SeqCst);
    let mut statuses = vec![];
    for a in &owned {
        statuses.push(status(&settle(p.gate(from(a, "203.0.113.1")).await).await));
    }
    assert_eq!(&statuses[..5], [401; 5]);
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    assert_eq!(
        store.gets.load(Ordering::SeqCst) - gets,
        5,
        "five lookups, then none"
    );
    // a known unknown key is answered from memory; another address has its own budget
    assert_eq!(
        status(&settle(p.gate(from(&owned[0], "203.0.113.1")).await).await),
        401
    );
    assert_eq!(
        status(&settle(p.gate(from(&owned[10], "203.0.113.2")).await).await),
        401
    );
    assert_eq!(store.gets.load(Ordering::SeqCst) - gets, 6);
    assert_eq!(
        status(&settle(p.gate(from(&auth, "203.0.113.1")).await).await),
        200
    );
    let h = p.health();
    assert_eq!((h.unknown_key_lookups, h.unknown_key_refused), (6, 15));
}

/// Credits are only known to the store: when it cannot decide, a key with
/// credits is refused (503, fail-closed) even on a `fail_open` plan, where a key
/// without credits is admitted degraded.
#[tokio::test]
async fn a_key_with_credits_fails_closed_whatever_its_policies_say() {
    for (credits, expected) in [(false, 200), (true, 503)] {
        let store = mem();
        let auth = seed(store, CONFIG, "lenient");
        if credits {
            edit_key(store, |rec| {
                rec.credits = Some(floodgate_shared::credits::Credits {
                    remaining: 5,
                    refill: None,
                })
            });
        }
        let clock = FakeClock::at(T0);
        let p = Pipeline::new(store, &clock, PipelineConfig::default());
        // the record is cached while the store is up; then the store goes down
        let _ = p.gate(head(&auth)).await;
        store.down.store(true, Ordering::SeqCst);
        let g = p.gate(head(&auth)).await.gate;
        assert_eq!(status(&g), expected, "credits: {credits}");
        match g {
            Err(reply) => {
                assert!(
                    reply.body.contains("Rate limiter unavailable"),
                    "{}",
                    reply.body
                );
                assert_eq!(reply.header("X-RateLimit-Degraded"), Some("fail-closed"));
            }
            Ok(admit) => assert_eq!(admit.header("X-RateLimit-Degraded"), Some("fail-open")),
        }
    }
}

/// Identical checks arriving together (a busy key) are decided by ONE store call
/// (`Store::decide` with `Call::count`) — and exactly: each request gets the verdict its own
/// call would have had, one after another at one instant (3 per minute: three
/// admitted with 2, 1, 0 left, the rest throttled).
#[tokio::test]
async fn identical_concurrent_checks_share_one_store_call() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    // warm the caches first: a cold request reads the records on its way
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    let (before, calls_before) = (
        store.checks.load(Ordering::SeqCst),
        store.merged_calls.load(Ordering::SeqCst),
    );
    let gates = (0..8).map(|_| async { settle(p.gate(head(&auth)).await).await });
    let answers = futures_util::future::join_all(gates).await;
    let mut left: Vec<&str> = answers
        .iter()
        .filter(|g| status(g) == 200)
        .map(|g| header(g, "X-RateLimit-Remaining").unwrap())
        .collect();
    left.sort_unstable();
    assert_eq!(
        left,
        ["0", "1"],
        "the two tokens left after the first request"
    );
    assert_eq!(answers.iter().filter(|g| status(g) == 429).count(), 6);
    assert_eq!(
        store.merged_calls.load(Ordering::SeqCst) - calls_before,
        1,
        "one call for the eight"
    );
    assert_eq!(
        store.checks.load(Ordering::SeqCst) - before,
        8,
        "eight decisions"
    );
}

/// One silent round trip carrying many requests is one stall of the store, not
/// many: its requests get their failure mode at their deadline, but the breaker
/// stays closed until a second round trip is silent too (on tokio's paused clock).
#[tokio::test(start_paused = true)]
async fn one_silent_round_trip_alone_never_opens_the_breaker() {
    use floodgate_edge::breaker::Phase;
    use std::time::Duration;
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(
        store,
        &clock,
        PipelineConfig {
            deadline: floodgate_edge::deadline::DeadlineSettings::fixed(5_000),
            ..PipelineConfig::default()
        },
    );
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    *store.slow.lock().unwrap() = Some(Duration::from_millis(60));
    let stalled = || async {
        let gates = (0..12).map(|_| async { status(&settle(p.gate(head(&auth)).await).await) });
        futures_util::future::join_all(gates).await
    };
    let first = stalled().await;
    assert_eq!(
        first, [503; 12],
        "each at its deadline, by its failure mode"
    );
    assert_eq!(
        p.breaker_phase(),
        Phase::Closed,
        "one stall is not an outage"
    );
    let second = stalled().await;
    assert_eq!(second, [503; 12]);
    assert_eq!(p.breaker_phase(), Phase::Open, "two in a row are");
}

/// Issue 39, smell 4: an in-flight slot's take is guarded as long as its caller
/// waits for it — to the ceiling, as the bucket check is — so a busy store that
/// answers after the deadline (but within the ceiling) gives the request its
/// slot. (Before: the take's stale guard was the deadline, the store refused to
/// run it that late, and the fail-closed policy answered 503.)
#[tokio::test]
async fn a_slot_taken_by_a_busy_store_within_the_ceiling_admits() {
    let store = mem();
    let auth = seed(store, CONFIG, "single");
    let clock: &'static FakeClock = Box::leak(Box::new(FakeClock::at(T0)));
    *store.now.lock().unwrap() = T0;
    let p = Pipeline::new(store, clock, PipelineConfig::default());
    // requests teach Redis' clock (the guard needs it) and a fast store's
    // deadline: the floor, 3 ms, once learned
    for i in 0..20 {
        advance(clock, store, 20 * MICROS_PER_SEC);
        let g = settle(p.gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}");
        let Ok(Admit { slots, .. }) = &g else {
            panic!("{g:?}")
        };
        p.release_later(slots.clone()).expect("a slot").await;
    }
    advance(clock, store, 20 * MICROS_PER_SEC);
    // a take that answers 20 ms later: past the deadline (3 ms), within the
    // ceiling (100 ms)
    *store.slot_takes.lock().unwrap() = Some((clock, 20_000));
    let g = settle(p.gate(head(&auth)).await).await;
    assert_eq!(status(&g), 200, "{g:?}");
}

/// What the traffic page shows for `/v1/search` (issue 41 item 2) is what its
/// clients got, path by path: per endpoint, every 200 counted `allowed` and
/// every 429 `throttled`, exactly once — the store's 429s, the recent 429s
/// answered locally, identical concurrent requests decided by one call, the
/// in-flight limit's 429s and the 429s to an address that sent too many
/// invalid API keys.
#[tokio::test]
async fn the_traffic_counts_are_what_the_clients_got_on_every_path() {
    let config = r#"{"policies":[
      {"name":"default","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed"},
      {"name":"search","dimensions":["api_key","endpoint"],"quota":{"capacity":3,"period":"1m"},"failure_mode":"fail_closed"},
      {"name":"one_at_a_time","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed","max_in_flight":1}],
      "plans":{"free":["default"],"single":["one_at_a_time"]},
      "routes":[{"name":"search","pattern":"/v1/search","policies":["search"]}]}"#;
    let store = mem();
    let auth = seed(store, config, "free");
    let single = common::seed_another(store, "single");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(
        store,
        &clock,
        PipelineConfig {
            unknown_keys_per_ip_per_min: 1,
            ..PipelineConfig::default()
        },
    );
    fn search<'a>(auth: &'a str) -> RequestHead<'a> {
        RequestHead {
            path: "/v1/search",
            credentials: Some(auth.as_bytes()),
            client_ip: Some("203.0.113.7".parse().unwrap()),
            country: None,
            user_agent: None,
        }
    }
    // what the clients got, 200s and 429s
    let mut got = (0u64, 0u64);
    let mut saw = |gates: &[common::Gate]| {
        for g in gates {
            match status(g) {
                200 => got.0 += 1,
                429 => got.1 += 1,
                _ => {}
            }
        }
        got
    };
    let counted = async || {
        p.flush_pending().await.unwrap();
        (
            minute_sum(store, "route:search|allowed"),
            minute_sum(store, "route:search|throttled"),
        )
    };
    // the store's 429, then recent 429s answered locally
    let mut gates = vec![];
    for _ in 0..6 {
        gates.push(settle(p.gate(search(&auth)).await).await);
    }
    let statuses: Vec<u16> = gates.iter().map(status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    assert_eq!(counted().await, saw(&gates), "the store's and recent 429s");
    // identical concurrent requests, decided by one call
    advance(&clock, store, 60 * MICROS_PER_SEC);
    let concurrent = (0..8).map(|_| async { settle(p.gate(search(&auth)).await).await });
    let gates = futures_util::future::join_all(concurrent).await;
    assert_eq!(gates.iter().filter(|g| status(g) == 429).count(), 5);
    assert_eq!(
        counted().await,
        saw(&gates),
        "concurrent identical requests"
    );
    // the in-flight limit
    let held = settle(p.gate(search(&single)).await).await;
    let refused = settle(p.gate(search(&single)).await).await;
    assert_eq!((status(&held), status(&refused)), (200, 429));
    assert_eq!(
        counted().await,
        saw(&[held, refused]),
        "the in-flight limit"
    );
    // an address that sent too many invalid API keys
    let mut gates = vec![];
    for i in 0..3u8 {
        let invalid = format!("Bearer {}", new_secret(&[i + 100; 42]).1);
        gates.push(settle(p.gate(search(&invalid)).await).await);
    }
    let statuses: Vec<u16> = gates.iter().map(status).collect();
    assert_eq!(statuses, [401, 429, 429]);
    assert_eq!(counted().await, saw(&gates), "too many invalid API keys");
}

/// A plan of shadow policies only enforces nothing: a request its shadow
/// policy would have throttled is admitted (it was answered 429, and counted
/// nowhere), and the traffic counts say what the client got — every request
/// allowed, the ones the shadow policy would have refused also counted
/// `shadow_throttled`.
#[tokio::test]
async fn a_plan_of_shadow_policies_only_admits_and_counts_every_request() {
    let config = r#"{"policies":[
      {"name":"watch","dimensions":["api_key"],"quota":{"capacity":1,"period":"1m"},"failure_mode":"fail_open","shadow":true}],
      "plans":{"free":["watch"]}}"#;
    let store = mem();
    let auth = seed(store, config, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, PipelineConfig::default());
    assert_eq!(futures_statuses(&p, &auth, 3).await, [200, 200, 200]);
    p.flush_pending().await.unwrap();
    let sum = |field: &str| minute_sum(store, field);
    assert_eq!(
        (
            sum("unmatched|allowed"),
            sum("unmatched|throttled"),
            sum("unmatched|shadow_throttled")
        ),
        (3, 0, 2)
    );
}
