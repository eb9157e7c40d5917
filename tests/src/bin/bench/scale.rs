//! `scripts/bench cluster | lease | region | hotkey`: the scale-out sections
//! (`docs/scale.md`). Each starts its own servers on loopback; every run is
//! bounded in count and time.

use std::time::Duration;

use std::sync::Arc;

use floodgate_edge::store::cluster::ClusterStore;
use floodgate_edge::store::resp::RespStore;
use floodgate_tests::RedisServer;
use floodgate_tests::cluster::RedisCluster;
use floodgate_tests::scale::{
    Limit, Mode, Run, Subjects, WorkerRegions, World, Zipf, burst, burst_http, config, offer,
    offer_http, regional_calls, settle, worst_excess,
};

use crate::{Section, drive};

/// Runs the named sections, always in this order: cluster, lease, region, hotkey,
/// cost.
pub fn run(
    sections: &[Section],
    pinned: bool,
    scale: usize,
    lifetimes_ms: &[u32],
    rt: &tokio::runtime::Runtime,
) {
    let cpu = pinned.then_some(0);
    let has = |s: Section| sections.contains(&s);
    if has(Section::Cluster) {
        cluster(cpu, scale, rt);
    }
    if has(Section::Lease) {
        lease(cpu, scale, rt);
    }
    if has(Section::Region) {
        region(cpu, scale, rt);
    }
    if has(Section::Hotkey) {
        hotkey(cpu, scale, rt);
    }
    if has(Section::Cost) {
        crate::cost::cost(cpu, scale, lifetimes_ms, rt);
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

/// The answer deadline of one store call in these runs: longer than any distance's
/// round trip, so exact decisions are never cut short.
const DEADLINE: Duration = Duration::from_secs(2);

/// A hot key: 100,000/min, bounded by 2,000 (2 %); the runs stay under it.
const HOT: Limit = Limit {
    name: "hot",
    capacity: 100_000,
    refill: 100_000,
    period: "1m",
    per_ip: false,
    max_overshoot: 2_000,
};

use floodgate_tests::scale::PER_IP;

/// The same, tight: 600/min, bounded by 60 (10 %): the busiest addresses are over
/// their quota and their bound is small for the distance.
const PER_IP_TIGHT: Limit = Limit {
    name: "per_ip_tight",
    capacity: 600,
    refill: 600,
    period: "1m",
    per_ip: true,
    max_overshoot: 60,
};

/// Over the limit: 200/s with a burst of 100, bounded by 40.
const OVER: Limit = Limit {
    name: "over",
    capacity: 100,
    refill: 200,
    period: "1s",
    per_ip: false,
    max_overshoot: 40,
};

/// A quota that does not refill during a run: 100/h, bounded by 30.
const LEAK: Limit = Limit {
    name: "leak",
    capacity: 100,
    refill: 1,
    period: "1h",
    per_ip: false,
    max_overshoot: 30,
};

fn ms(x: f64) -> String {
    format!("{x:.2}")
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// One latency row: p50/p99 added, the share that paid the global round trip,
/// calls per request on each store. With `base` (the same host's exchanges for a
/// key without policies), "added" is the difference of the percentiles, and the
/// host's own percentiles are shown beside it.
fn latency_row(distance: u64, mode: &str, r: &Run, base: Option<&Run>) {
    let (p50, p99) = match base {
        Some(b) => (
            r.quantile_ms(0.5) - b.quantile_ms(0.5),
            r.quantile_ms(0.99) - b.quantile_ms(0.99),
        ),
        None => (r.quantile_ms(0.5), r.quantile_ms(0.99)),
    };
    let rtt = Duration::from_millis(2 * distance);
    let (paid, alone) = match base {
        Some(b) => (
            r.share_at_least(rtt + Duration::from_secs_f64(b.quantile_ms(0.5) / 1e3)),
            format!(
                " {} / {} |",
                ms(b.quantile_ms(0.5)),
                ms(b.quantile_ms(0.99))
            ),
        ),
        None => (r.share_at_least(rtt), String::new()),
    };
    println!(
        "| {distance} ms | {mode} | {} | {} |{alone} {} | {:.3} | {:.3} | {}/{} |",
        ms(p50),
        ms(p99),
        pct(paid),
        r.global_per_request(),
        r.regional_calls as f64 / r.requests.max(1) as f64,
        r.admitted,
        r.requests - r.degraded,
    );
}

fn latency_header(what: &str, worker: bool) {
    println!("\n{what}");
    let alone = if worker {
        " Worker alone p50 / p99 ms |"
    } else {
        ""
    };
    println!(
        "| one-way to the global Redis | mode | added p50 ms | added p99 ms |{alone} paid a global round trip | global round trips/request | regional script calls/request | admitted/decided |"
    );
    println!(
        "|---|---|---|---|{}---|---|---|---|",
        if worker { "---|" } else { "" }
    );
}

/// The loads of the native multi-region runs.
struct RegionLoad {
    /// Seconds of each measured run, and of the warm-up before it.
    secs: f64,
    warm: f64,
    /// Requests/s offered: the hot key, the Zipf mixes, the key over its limit.
    hot_rate: u64,
    zipf_rate: u64,
    over_rate: u64,
    /// Instances per region.
    per_region: usize,
}

/// One row of the bound table: a key offered `over_rate` and a leakage burst.
struct BoundRow {
    distance: u64,
    mode: Mode,
    /// The worst window above capacity + refill.
    excess: i64,
    over: Run,
    leaked: u64,
}

/// The native multi-region runs, per table: (one-way ms, mode, run).
#[derive(Default)]
struct RegionRows {
    hot: Vec<(u64, Mode, Run)>,
    zipf: Vec<(u64, Mode, Run)>,
    tight: Vec<(u64, Mode, Run)>,
    bound: Vec<BoundRow>,
}

fn region(cpu: Option<usize>, scale: usize, rt: &tokio::runtime::Runtime) {
    let quick = scale > 1;
    let load = RegionLoad {
        secs: if quick { 1.0 } else { 2.0 },
        // a key's leases grow with its measured rate: warm after about a second
        warm: if quick { 1.5 } else { 2.0 },
        hot_rate: 600,
        zipf_rate: 1_500,
        over_rate: 800,
        per_region: 2,
    };
    let distances: &[u64] = &[5, 25, 50, 100];
    let (per_region, warm, secs) = (load.per_region, load.warm, load.secs);
    println!(
        "\n## Multi-region: 3 regions × {per_region} instances, one global Redis behind an added-latency proxy, a regional Redis per region on loopback"
    );
    println!(
        "(native: the product's pipeline (`Pipeline::gate`, as the hosts run it), timed per decision; warm keys: after {warm} s of the same load (the same Zipf distribution, another draw); {secs} s per run; answer deadline 2 s so exact decisions are never cut short; \"paid a global round trip\" = decisions that took at least one round trip to the global Redis; global round trips counted at the proxies (refills and record reads included), regional script calls from INFO commandstats)"
    );
    let cfg = config(&[HOT, PER_IP, PER_IP_TIGHT, OVER, LEAK], 3);
    let world = rt.block_on(World::start_on(3, &cfg, cpu));
    let zipf = Subjects::Zipf(Arc::new(Zipf::new(10_000, 1.1)));
    let mut rows = RegionRows::default();
    for &d in distances {
        world.set_one_way(Duration::from_millis(d));
        for mode in Mode::ALL {
            rt.block_on(region_runs(&world, &load, &zipf, d, mode, &mut rows));
        }
    }
    print_region_rows(&load, &rows);
    worker_region(&world, distances, secs, warm, rt);
}

/// The runs of one mode at one distance (`d` ms one way): the hot key, the two
/// Zipf mixes, the key over its limit and the leakage burst.
async fn region_runs(
    world: &World,
    load: &RegionLoad,
    zipf: &Subjects,
    d: u64,
    mode: Mode,
    rows: &mut RegionRows,
) {
    let one_way = Duration::from_millis(d);
    let (secs, warm) = (load.secs, load.warm);
    let edges = world.edges(mode, load.per_region, DEADLINE).await;
    let hot = world.key(mode, &HOT.plan(mode)).await;
    let hot_rate = load.hot_rate;
    offer(world, &edges, &hot, &Subjects::One, hot_rate, warm, 1).await;
    settle(one_way).await;
    let h = offer(world, &edges, &hot, &Subjects::One, hot_rate, secs, 2).await;
    rows.hot.push((d, mode, h));
    for (limit, table) in [(PER_IP, &mut rows.zipf), (PER_IP_TIGHT, &mut rows.tight)] {
        let ip = world.key(mode, &limit.plan(mode)).await;
        offer(world, &edges, &ip, zipf, load.zipf_rate, warm, 3).await;
        settle(one_way).await;
        table.push((
            d,
            mode,
            offer(world, &edges, &ip, zipf, load.zipf_rate, secs, 4).await,
        ));
    }
    let over = world.key(mode, &OVER.plan(mode)).await;
    let o = offer(
        world,
        &edges,
        &over,
        &Subjects::One,
        load.over_rate,
        secs,
        5,
    )
    .await;
    let (capacity, emission) = OVER.bucket();
    let excess = worst_excess(&o.admitted_at, capacity, emission);
    let leak = world.key(mode, &LEAK.plan(mode)).await;
    let leaked = burst(&edges, &leak, 60).await;
    rows.bound.push(BoundRow {
        distance: d,
        mode,
        excess,
        over: o,
        leaked,
    });
    settle(one_way).await;
}

fn print_region_rows(load: &RegionLoad, rows: &RegionRows) {
    let (hot_rate, zipf_rate, over_rate) = (load.hot_rate, load.zipf_rate, load.over_rate);
    latency_header(
        &format!(
            "### Native, one hot key: {hot_rate} req/s over the 6 instances (100,000/min, bound 2,000)"
        ),
        false,
    );
    for (d, mode, r) in &rows.hot {
        latency_row(*d, mode.name(), r, None);
    }
    latency_header(
        &format!(
            "### Native, Zipf(1.1) over 10,000 client addresses: {zipf_rate} req/s (20,000/min per key and address, bound 1,000: a cold address is admitted on its region's credit, 166 per region)"
        ),
        false,
    );
    for (d, mode, r) in &rows.zipf {
        latency_row(*d, mode.name(), r, None);
    }
    latency_header(
        "### Native, the same Zipf mix with a tight limit: 600/min per key and address, bound 60 (credit 10 per region; pools of at most 15 tokens; the busiest addresses, ~200 req/s, are over their quota)",
        false,
    );
    for (d, mode, r) in &rows.tight {
        latency_row(*d, mode.name(), r, None);
    }
    println!(
        "\n### The bound: one key offered {over_rate} req/s ({}× its 200/s, burst 100, bound 40); leakage: each of the 6 instances sends 60 requests one after another, all at once, against 100/h (bound 30: at most 1.3×; independent limits: 3.0×)",
        over_rate / 200
    );
    println!(
        "| one-way | mode | admitted/offered | worst window above capacity + refill (bound 40) | leakage: admitted / 100 |"
    );
    println!("|---|---|---|---|---|");
    for row in &rows.bound {
        let BoundRow {
            distance: d,
            excess,
            leaked,
            ..
        } = row;
        println!(
            "| {d} ms | {} | {}/{} | {excess:+} | {leaked} ({:.2}×) |",
            row.mode.name(),
            row.over.admitted,
            row.over.requests,
            *leaked as f64 / 100.0
        );
    }
}

/// The loads of the Worker's multi-region runs, and what they go through.
struct WorkerLoad<'a> {
    world: &'a World,
    client: reqwest::Client,
    zipf: Subjects,
    /// Requests/s offered.
    rate: u64,
    /// Seconds of each measured run, and of the warm-up before it.
    secs: f64,
    warm: f64,
}

/// One mode of the Worker at one distance.
struct WorkerRow {
    distance: u64,
    name: &'static str,
    /// A key without policies: the Workers alone.
    base: Run,
    hot: Run,
    zipf: Run,
    leaked: u64,
}

impl WorkerLoad<'_> {
    /// The runs of one mode (`name`) through `workers` at `d` ms one way: a key
    /// without policies, the hot key, the Zipf mix and the leakage burst.
    async fn runs(
        &self,
        name: &'static str,
        workers: &WorkerRegions,
        mode: Mode,
        d: u64,
    ) -> WorkerRow {
        let (world, client, zipf, rate) = (self.world, &self.client, &self.zipf, self.rate);
        let (secs, warm, one_way) = (self.secs, self.warm, Duration::from_millis(d));
        let calls = || (workers.global_calls(), regional_calls(&world.regionals));
        let urls = workers.urls();
        let none = world.key(mode, "none").await;
        offer_http(&calls, client, &urls, &none, &Subjects::One, rate, 0.3, 1).await;
        let base = offer_http(&calls, client, &urls, &none, &Subjects::One, rate, secs, 2).await;
        let hot = world.key(mode, &HOT.plan(mode)).await;
        offer_http(&calls, client, &urls, &hot, &Subjects::One, rate, warm, 3).await;
        settle(one_way).await;
        let h = offer_http(&calls, client, &urls, &hot, &Subjects::One, rate, secs, 4).await;
        let ip = world.key(mode, &PER_IP.plan(mode)).await;
        offer_http(&calls, client, &urls, &ip, zipf, rate, warm, 5).await;
        settle(one_way).await;
        let z = offer_http(&calls, client, &urls, &ip, zipf, rate, secs, 6).await;
        let leak = world.key(mode, &LEAK.plan(mode)).await;
        let leaked = burst_http(client, &urls, &leak, 120).await;
        WorkerRow {
            distance: d,
            name,
            base,
            hot: h,
            zipf: z,
            leaked,
        }
    }
}

/// The same over HTTP through the built Worker in workerd, one per region: with a
/// regional REST store (pools) and without (isolate leases; exact).
fn worker_region(
    world: &World,
    distances: &[u64],
    secs: f64,
    warm: f64,
    rt: &tokio::runtime::Runtime,
) {
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../edge/worker/build/index.js")
        .exists();
    if !built {
        println!("\n(The Worker is not built: `scripts/worker build`, then rerun for its rows.)");
        return;
    }
    let rate = 200;
    let (pools, plain) = rt.block_on(async {
        (
            WorkerRegions::start(world, true).await,
            WorkerRegions::start(world, false).await,
        )
    });
    let load = WorkerLoad {
        world,
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        zipf: Subjects::Zipf(Arc::new(Zipf::new(10_000, 1.1))),
        rate,
        secs,
        warm,
    };
    let mut rows = vec![];
    for &d in distances {
        let one_way = Duration::from_millis(d);
        world.set_one_way(one_way);
        pools.set_one_way(one_way);
        plain.set_one_way(one_way);
        let cases = [
            ("exact, global Redis", &plain, Mode::ExactGlobal),
            ("bounded, isolate leases", &plain, Mode::InstanceLeases),
            ("bounded, regional tally", &pools, Mode::RegionalTally),
        ];
        for (name, workers, mode) in cases {
            rows.push(rt.block_on(load.runs(name, workers, mode, d)));
        }
    }
    print_worker_region_rows(rate, &rows);
}

fn print_worker_region_rows(rate: u64, rows: &[WorkerRow]) {
    latency_header(
        &format!(
            "### The Worker in workerd (one per region), one hot key: {rate} req/s; added = the exchange's percentile minus the same Workers' for a key without policies (Worker alone)"
        ),
        true,
    );
    for r in rows {
        latency_row(r.distance, r.name, &r.hot, Some(&r.base));
    }
    latency_header(
        &format!(
            "### The Worker, Zipf(1.1) over 10,000 client addresses (CF-Connecting-IP): {rate} req/s"
        ),
        true,
    );
    for r in rows {
        latency_row(r.distance, r.name, &r.zipf, Some(&r.base));
    }
    println!(
        "\n### The Worker, leakage: each region's Worker is sent 120 requests one after another, the regions at once, against 100/h (bound 30)"
    );
    println!("| one-way | mode | admitted / 100 |");
    println!("|---|---|---|");
    for r in rows {
        println!(
            "| {} ms | {} | {} ({:.2}×) |",
            r.distance,
            r.name,
            r.leaked,
            r.leaked as f64 / 100.0
        );
    }
}

/// N instances of one region on one bucket, exact vs bounded (instance leases).
fn lease(cpu: Option<usize>, scale: usize, rt: &tokio::runtime::Runtime) {
    let secs = if scale > 1 { 0.5 } else { 2.0 };
    println!(
        "\n## Instance leases vs exact: N instances of one region on one bucket (global Redis 1 ms away, no regional store)"
    );
    println!(
        "(under: {} req/s on 100,000/min (bound 2,000); over: 800 req/s on 200/s, burst 100 (bound 40); global round trips counted at the proxy; overshoot on the decisions' instants)",
        600
    );
    println!(
        "| instances | mode | under: global round trips/request | ÷ exact | over: admitted/offered | worst window above capacity + refill |"
    );
    println!("|---|---|---|---|---|---|");
    let world = rt.block_on(World::start_on(1, &config(&[HOT, OVER], 1), cpu));
    world.set_one_way(Duration::from_millis(1));
    for instances in [1usize, 10, 50] {
        let mut exact_calls = 0.0;
        for mode in [Mode::ExactGlobal, Mode::InstanceLeases] {
            rt.block_on(async {
                let edges = world.edges(mode, instances, DEADLINE).await;
                let hot = world.key(mode, &HOT.plan(mode)).await;
                offer(&world, &edges, &hot, &Subjects::One, 600, 0.3, 1).await;
                let under = offer(&world, &edges, &hot, &Subjects::One, 600, secs, 2).await;
                let over = world.key(mode, &OVER.plan(mode)).await;
                let o = offer(&world, &edges, &over, &Subjects::One, 800, secs, 3).await;
                let (capacity, emission) = OVER.bucket();
                let excess = worst_excess(&o.admitted_at, capacity, emission);
                let calls = under.global_per_request();
                if mode == Mode::ExactGlobal {
                    exact_calls = calls;
                }
                println!(
                    "| {instances} | {} | {calls:.3} | {:.2} | {}/{} | {excess:+} |",
                    mode.name(),
                    calls / exact_calls,
                    o.admitted,
                    o.requests
                );
            });
        }
    }
}

/// A hot `auto` key on one instance: exact while cool, bounded while hot.
fn hotkey(cpu: Option<usize>, scale: usize, rt: &tokio::runtime::Runtime) {
    let secs = if scale > 1 { 0.5 } else { 2.0 };
    let rate = 5_000;
    println!(
        "\n## A hot `auto` key on one instance (global Redis 5 ms away, a regional store; 100,000/min, bound 2,000; bounded above 50 req/s on the instance, exact again at 10)"
    );
    println!(
        "| consistency | phase | requests | admitted | global round trips/request | ÷ exact | paid a global round trip |"
    );
    println!("|---|---|---|---|---|---|---|");
    let world = rt.block_on(World::start_on(1, &config(&[HOT], 1), cpu));
    let one_way = Duration::from_millis(5);
    world.set_one_way(one_way);
    let rows = rt.block_on(async {
        let exact = world.edges(Mode::ExactGlobal, 1, DEADLINE).await;
        let key = world
            .key(Mode::ExactGlobal, &HOT.plan(Mode::ExactGlobal))
            .await;
        let e = offer(&world, &exact, &key, &Subjects::One, rate, secs, 1).await;
        let auto = world.edges(Mode::Auto, 1, DEADLINE).await;
        let key = world.key(Mode::Auto, &HOT.plan(Mode::Auto)).await;
        let mut rows = vec![("exact", format!("{rate}/s"), e)];
        for (phase, r, s) in [
            ("20/s (cool)", 20, 1.0),
            ("first 0.3 s at 5,000/s (turning)", rate, 0.3),
            ("5,000/s (hot)", rate, secs),
            ("20/s, first 2.5 s (cooling)", 20, 2.5),
            ("20/s (cool again)", 20, 1.0),
        ] {
            let run = offer(&world, &auto, &key, &Subjects::One, r, s, 2).await;
            rows.push(("auto", phase.to_string(), run));
        }
        rows
    });
    let exact = rows[0].2.global_per_request();
    for (c, phase, r) in &rows {
        println!(
            "| {c} | {phase} | {} | {} | {:.3} | {:.3} | {} |",
            r.requests,
            r.admitted,
            r.global_per_request(),
            r.global_per_request() / exact,
            pct(r.share_at_least(one_way * 2))
        );
    }
}
