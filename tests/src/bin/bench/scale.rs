//! `scripts/bench cluster | lease | region | hotkey`: the scale-out sections
//! (`docs/scale.md`). Each starts its own servers on loopback; every run is
//! bounded in count and time.

use std::time::Duration;

use floodgate_edge::lease::LeaseMode;
use floodgate_edge::store::cluster::ClusterStore;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::lease::LeaseConfig;
use floodgate_shared::policy::Quota;
use floodgate_tests::RedisServer;
use floodgate_tests::cluster::RedisCluster;
use floodgate_tests::scale::{Placement, hot_key_run, lease_run, region_run};

use crate::drive;

pub fn run(sections: &[String], pinned: bool, scale: usize, rt: &tokio::runtime::Runtime) {
    let cpu = pinned.then_some(0);
    let has = |s: &str| sections.iter().any(|a| a == s);
    if has("cluster") {
        cluster(cpu, scale, rt);
    }
    if has("lease") {
        lease(cpu, scale, rt);
    }
    if has("region") {
        region(cpu, scale, rt);
    }
    if has("hotkey") {
        hotkey(cpu, scale, rt);
    }
}

fn cluster(cpu: Option<usize>, scale: usize, rt: &tokio::runtime::Runtime) {
    println!(
        "\n## Redis Cluster: decisions/s vs number of masters (50 callers, random principals)"
    );
    println!(
        "(every server on CPU 0, the client on CPU 1: on this 2-core machine the masters share one core, so the rows measure routing and per-node connections, not scale-out; median of 3 rounds)"
    );
    println!("| store | masters | decisions/s | p50 µs | p99 µs | ÷ one redis-server |");
    println!("|---|---|---|---|---|---|");
    let n = 60_000 / scale;
    let single = RedisServer::start_pinned(cpu, &[]);
    let mut base = vec![];
    for _ in 0..3 {
        base.push(rt.block_on(async {
            let s = RespStore::connect(&single.url(), Duration::from_secs(5))
                .await
                .unwrap();
            drive(s, 50, n).await
        }));
    }
    let base = median(base);
    println!(
        "| one redis-server (RespStore) | – | {:.0} | {:.0} | {:.0} | 1.00 |",
        base.rate, base.p50_us, base.p99_us
    );
    drop(single);
    for masters in [1usize, 2, 3] {
        let cluster = RedisCluster::start_pinned(masters, 0, cpu);
        let mut rounds = vec![];
        for _ in 0..3 {
            rounds.push(rt.block_on(async {
                let s = ClusterStore::connect(&cluster.url(), Duration::from_secs(5))
                    .await
                    .unwrap();
                drive(s, 50, n).await
            }));
        }
        let r = median(rounds);
        println!(
            "| ClusterStore | {masters} | {:.0} | {:.0} | {:.0} | {:.2} |",
            r.rate,
            r.p50_us,
            r.p99_us,
            r.rate / base.rate
        );
    }
}

fn median(mut v: Vec<crate::Rate>) -> crate::Rate {
    v.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    v.swap_remove(v.len() / 2)
}

fn lease_config(bound: u64) -> LeaseConfig {
    LeaseConfig {
        max_overshoot: bound,
        max_lease: 10,
        lifetime: 200_000,
        hot_per_sec: 1_000,
        cool_per_sec: 100,
    }
}

fn lease(cpu: Option<usize>, scale: usize, rt: &tokio::runtime::Runtime) {
    let bound = 40;
    println!(
        "\n## Lease mode vs exact: N instances on one bucket (1,000/s, burst 100; lease ≤ 10 tokens, lifetime 200 ms, overshoot bound {bound})"
    );
    println!(
        "(requests spread evenly over the instances, open loop; Redis calls from INFO commandstats; overshoot = the worst window's admissions − (capacity + refill × window), on the decisions' own instants)"
    );
    println!(
        "| instances | offered | mode | requests | admitted | Redis calls/request | lease ÷ exact | overshoot (bound {bound}) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let server = RedisServer::start_pinned(cpu, &[]);
    let quota = Quota::new(100, 1_000, 1_000_000).unwrap();
    let secs = if scale > 1 { 0.5 } else { 2.0 };
    for instances in [1usize, 10, 50] {
        for (regime, rate) in [("600/s (under)", 600u64), ("3,000/s (over)", 3_000)] {
            let mut exact_calls = 0.0;
            for mode in [LeaseMode::Exact, LeaseMode::Leased] {
                let key = format!("fg:{{k:bench-{instances}-{rate}-{mode:?}}}:p");
                let r = rt.block_on(lease_run(
                    &server,
                    &server.url(),
                    &key,
                    &quota,
                    lease_config(bound),
                    mode,
                    instances,
                    rate,
                    secs,
                ));
                let ratio = if mode == LeaseMode::Exact {
                    exact_calls = r.redis_per_request;
                    "1.00".to_string()
                } else {
                    format!("{:.2}", r.redis_per_request / exact_calls)
                };
                println!(
                    "| {instances} | {regime} | {mode:?} | {} | {} | {:.3} | {ratio} | {} |",
                    r.requests, r.admitted, r.redis_per_request, r.overshoot
                );
            }
        }
    }
}

fn region(_cpu: Option<usize>, scale: usize, rt: &tokio::runtime::Runtime) {
    println!(
        "\n## Multi-region: 3 regions, each reaching one primary through an added-latency proxy (or its own Redis)"
    );
    println!(
        "(latency: sequential decisions per region under quota, regions concurrently; leakage: an adversary sends 30 requests to each region against a quota of 20 that does not refill during the run; leases live 1 s)"
    );
    println!("| one-way distance | placement | mean µs | p99 µs | admitted / quota (leakage) |");
    println!("|---|---|---|---|---|");
    let primary = RedisServer::start();
    let locals: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let decisions = if scale > 1 { 10 } else { 40 };
    for ms in [0u64, 5, 20, 50] {
        for p in [Placement::Global, Placement::Regional, Placement::Lease] {
            let r = rt.block_on(region_run(
                &primary,
                &locals,
                p,
                Duration::from_millis(ms),
                decisions,
                30,
                20,
                LeaseConfig {
                    lifetime: 1_000_000,
                    ..lease_config(40)
                },
                &format!("bench-{ms}-{p:?}"),
            ));
            println!(
                "| {ms} ms | {} | {:.0} | {:.0} | {} / 20 ({:.1}×) |",
                p.name(),
                r.mean_us,
                r.p99_us,
                r.admitted,
                r.leakage
            );
        }
    }
}

fn hotkey(cpu: Option<usize>, scale: usize, rt: &tokio::runtime::Runtime) {
    let rate = 10_000;
    let secs = if scale > 1 { 0.5 } else { 2.0 };
    let bound = 500;
    println!(
        "\n## A hot key at {rate} req/s for {secs} s (quota 20,000/s, burst 2,000; automatic mode: leased above 1,000/s, exact below 100/s; lease ≤ 100 tokens, lifetime 200 ms, bound {bound})"
    );
    println!(
        "| mode | phase | requests | admitted | Redis script calls/s | ÷ exact | overshoot (bound {bound}) | switches |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let server = RedisServer::start_pinned(cpu, &[]);
    let quota = Quota::new(2_000, 20_000, 1_000_000).unwrap();
    let cfg = LeaseConfig {
        max_lease: 100,
        ..lease_config(bound)
    };
    let exact = rt.block_on(hot_key_run(
        &server,
        "fg:{k:bench-hot-exact}:p",
        &quota,
        cfg,
        LeaseMode::Exact,
        &[(rate, secs)],
    ))[0];
    println!(
        "| exact | {rate}/s | {} | {} | {:.0} | 1.00 | {} | – |",
        exact.requests, exact.admitted, exact.redis_calls_per_sec, exact.overshoot
    );
    let auto = rt.block_on(hot_key_run(
        &server,
        "fg:{k:bench-hot-auto}:p",
        &quota,
        cfg,
        LeaseMode::Auto,
        &[(50, 1.0), (rate, 0.3), (rate, secs), (20, 2.2)],
    ));
    let names = [
        "50/s (cool)",
        "10,000/s, first 0.3 s (turning)",
        "10,000/s (hot)",
        "20/s (cooling)",
    ];
    for (r, name) in auto.iter().zip(names) {
        println!(
            "| automatic | {name} | {} | {} | {:.0} | {:.3} | {} | →leased {} / →exact {} (now {:?}) |",
            r.requests,
            r.admitted,
            r.redis_calls_per_sec,
            r.redis_calls_per_sec / exact.redis_calls_per_sec,
            r.overshoot,
            r.to_leased,
            r.to_exact,
            r.final_mode
        );
    }
}
