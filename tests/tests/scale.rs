//! Lease mode, multi-region placements and a hot key against real redis-servers on
//! loopback (`docs/scale.md`). Small, bounded runs; only invariants are asserted:
//! the figures come from `scripts/bench lease region hotkey`.

use std::time::Duration;

use floodgate_edge::lease::LeaseMode;
use floodgate_shared::lease::{LeaseConfig, Mode};
use floodgate_shared::policy::Quota;
use floodgate_tests::RedisServer;
use floodgate_tests::scale::{Placement, hot_key_run, lease_run, region_run};

fn lease_config(bound: u64) -> LeaseConfig {
    LeaseConfig {
        max_overshoot: bound,
        max_lease: 10,
        lifetime: 200_000,
        hot_per_sec: 1_000,
        cool_per_sec: 100,
    }
}

/// 1, 10 and 50 instances on one bucket: under the quota, leases cut the calls per
/// request; over it, no window admits more than capacity + refill × window + the
/// configured bound (exact mode: not even one more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_cuts_calls_and_never_overshoots_the_bound() {
    let server = RedisServer::start();
    let bound = 40;
    // 1,000/s with a burst of 100
    let quota = Quota::new(100, 1_000, 1_000_000).unwrap();
    for instances in [1usize, 10, 50] {
        for (regime, rate) in [("under", 600u64), ("over", 3_000)] {
            let mut runs = vec![];
            for mode in [LeaseMode::Exact, LeaseMode::Leased] {
                let key = format!("fg:{{k:lease-{instances}-{regime}-{mode:?}}}:p");
                let r = lease_run(
                    &server,
                    &server.url(),
                    &key,
                    &quota,
                    lease_config(bound),
                    mode,
                    instances,
                    rate,
                    0.4,
                )
                .await;
                eprintln!("{instances} instances, {regime} quota, {mode:?}: {r:?}");
                assert_eq!(r.errors, 0);
                assert!(r.admitted > 0);
                match mode {
                    LeaseMode::Exact => assert!(r.overshoot <= 0, "{r:?}"),
                    _ => assert!(r.overshoot <= bound as i64, "{r:?}"),
                }
                runs.push(r);
            }
            if regime == "under" && instances == 1 {
                assert!(
                    runs[1].calls_per_request() * 3.0 < runs[0].calls_per_request(),
                    "{runs:?}"
                );
            }
        }
    }
}

/// Three regions, each reaching one primary through an added-latency proxy (or its
/// own Redis): exact/global pays the round trip on every decision and leaks
/// nothing; Redis per region answers locally and leaks 3×; leases pay the round
/// trip once per lease and, over a quota that does not refill, leak nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_trade_latency_for_leakage() {
    let primary = RedisServer::start();
    let locals: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let quota = 10;
    for one_way_ms in [0u64, 20] {
        let d = Duration::from_millis(one_way_ms);
        let mut rows = vec![];
        for p in [Placement::Global, Placement::Regional, Placement::Lease] {
            let tag = format!("{p:?}-{one_way_ms}");
            let r = region_run(
                &primary,
                &locals,
                p,
                d,
                10,
                15,
                quota,
                // regions are far apart: leases live 1 s (half of it sizes them)
                LeaseConfig {
                    lifetime: 1_000_000,
                    ..lease_config(40)
                },
                &tag,
            )
            .await;
            eprintln!("{one_way_ms} ms, {}: {r:?}", p.name());
            rows.push(r);
        }
        let (global, regional, lease) = (rows[0], rows[1], rows[2]);
        assert_eq!(global.admitted, quota, "one quota for all regions");
        assert_eq!(regional.admitted, 3 * quota, "each region its own quota");
        assert!(
            lease.admitted <= quota,
            "leases are taken from the one bucket"
        );
        if one_way_ms > 0 {
            let rtt_us = 2_000.0 * one_way_ms as f64;
            assert!(global.mean_us >= rtt_us, "{global:?}");
            assert!(regional.mean_us < rtt_us / 2.0, "{regional:?}");
            assert!(lease.mean_us < global.mean_us / 2.0, "{lease:?}");
        }
    }
}

/// One key at 5,000 requests/s: exact mode calls Redis for each; automatic mode
/// turns the key leased when it passes 1,000/s (Redis calls drop ≥ 5×), and exact again
/// once it cools below 100/s, giving its lease back; no window overshoots the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_turns_leased_and_back_within_the_bound() {
    let server = RedisServer::start();
    let bound = 200;
    let cfg = LeaseConfig {
        max_lease: 100,
        ..lease_config(bound)
    };
    // a big customer: 20,000/s, burst 2,000 (the hot key is not throttled)
    let quota = Quota::new(2_000, 20_000, 1_000_000).unwrap();
    let exact = hot_key_run(
        &server,
        "fg:{k:hot-exact}:p",
        &quota,
        cfg,
        LeaseMode::Exact,
        &[(5_000, 1.0)],
    )
    .await;
    let auto = hot_key_run(
        &server,
        "fg:{k:hot-auto}:p",
        &quota,
        cfg,
        LeaseMode::Auto,
        &[(100, 0.5), (5_000, 0.3), (5_000, 1.0), (20, 2.2)],
    )
    .await;
    eprintln!("exact: {exact:?}\nauto: {auto:?}");
    assert!(exact[0].redis_calls_per_sec > 2_000.0, "{exact:?}");
    // the meter reaches 1,000/s after 1,000 requests (0.2 s at 5,000/s)
    let (cool, turning, hot, cooled) = (auto[0], auto[1], auto[2], auto[3]);
    assert_eq!((cool.to_leased, cool.final_mode), (0, Mode::Exact));
    assert_eq!((turning.to_leased, turning.final_mode), (1, Mode::Leased));
    assert_eq!(
        (hot.to_leased, hot.to_exact, hot.final_mode),
        (0, 0, Mode::Leased)
    );
    assert!(
        hot.redis_calls_per_sec * 5.0 < exact[0].redis_calls_per_sec,
        "{hot:?} vs {exact:?}"
    );
    assert_eq!((cooled.to_exact, cooled.final_mode), (1, Mode::Exact));
    assert!(hot.admitted * 10 >= hot.requests * 9, "{hot:?}");
    for r in &auto {
        assert!(r.overshoot <= bound as i64, "{r:?}");
    }
}
