//! `scripts/bench fanout`: issue 38's shape. Two regions, each with its own
//! Redis on loopback; ONE global Redis 50 ms one way through the latency proxy;
//! 200 requests/s spread evenly over N instances; 400 API keys drawn from
//! Zipf(1.1), each its own key record (read per instance, as real tenants'
//! are); one bounded policy of 10,000/min per key, bound 500 (nobody is
//! throttled: the limiter's own cost is all there is), and the same policy
//! exact. N = 4, 16, 48 native instances (the product's pipeline as
//! `floodgate-edge` builds it, each its own `Pipeline` with its own memory and
//! connections, its statistics flushed on the host's schedule), 48 with every
//! instance replaced once during the measurement, the long tail (1,000 keys,
//! Zipf(0.9)) at 48, and a fleet of Workers in workerd. Then the model of
//! `floodgate_shared::simulate::fanout` at the same shape and at internet scale.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use floodgate_edge::pipeline::PipelineConfig;
use floodgate_shared::simulate::fanout as model;
use floodgate_shared::time::{MICROS_PER_SEC, Micros};
use floodgate_tests::scale::{
    Bills, Edge, Limit, Mode, Run, Subjects, WorkerRegions, WorkerSetup, World, Zipf, burst,
    burst_http, config, gate_verdict, http_verdict, offer_with, regional_calls, settle,
    subject_index,
};

/// The load's policy: 10,000/min per API key, bound 500.
const LOAD: Limit = Limit {
    name: "fanout",
    capacity: 10_000,
    refill: 10_000,
    period: "1m",
    per_ip: false,
    max_overshoot: 500,
};

/// The hammered key's: 400, not refilling during the run, bound 40.
const QUOTA: Limit = Limit {
    name: "hammer",
    capacity: 400,
    refill: 1,
    period: "1h",
    per_ip: false,
    max_overshoot: 40,
};

const RATE: u64 = 200;
const REGIONS: usize = 2;
const ONE_WAY: Duration = Duration::from_millis(50);
/// Requests offered to the hammered key, all instances together (at least).
const HAMMER: usize = 1_000;

/// Which keys a load draws from.
#[derive(Debug, Clone, Copy)]
struct Shape {
    keys: usize,
    zipf: f64,
}

const TAIL: Shape = Shape {
    keys: 400,
    zipf: 1.1,
};
const LONG_TAIL: Shape = Shape {
    keys: 1_000,
    zipf: 0.9,
};

/// How long each part of a row runs (s).
#[derive(Debug, Clone, Copy)]
struct Lengths {
    base: f64,
    warm: f64,
    measured: f64,
}

impl Lengths {
    fn of(scale: usize) -> Self {
        if scale > 1 {
            Self {
                base: 1.0,
                warm: 2.0,
                measured: 6.0,
            }
        } else {
            Self {
                base: 5.0,
                warm: 10.0,
                measured: 60.0,
            }
        }
    }
}

/// What one row measured.
struct Row {
    host: &'static str,
    instances: usize,
    shape: Shape,
    mode: Mode,
    churn: bool,
    run: Run,
    /// The same instances' requests of a key without policies.
    base: Run,
    bill: Bills,
    /// The hammered key: (admitted, offered).
    hammered: (u64, u64),
}

pub fn fanout(cpu: Option<usize>, scale: usize, rt: &tokio::runtime::Runtime) {
    let lengths = Lengths::of(scale);
    print_model(scale);
    println!(
        "\n## Fan-out, measured: {REGIONS} regions (a Redis each on loopback), the global Redis {} ms one way (latency proxy), {RATE} req/s spread evenly over N instances, API keys from Zipf, 10,000/min per key, bound 500; {} s warm-up, {} s measured per row",
        ONE_WAY.as_millis(),
        lengths.warm,
        lengths.measured
    );
    let world = rt.block_on(World::start_on(
        REGIONS,
        &config(&[LOAD, QUOTA], REGIONS as u32),
        cpu,
    ));
    world.set_one_way(ONE_WAY);
    let mut rows = vec![];
    for (n, shapes, churn) in [
        (4, vec![TAIL], false),
        (16, vec![TAIL], false),
        (48, vec![TAIL, LONG_TAIL], false),
        (48, vec![TAIL], true),
    ] {
        rows.extend(rt.block_on(native(&world, n, &shapes, churn, lengths)));
        print_rows(&rows[rows.len() - 2 * shapes.len()..]);
    }
    if worker_built() {
        let fleet = worker_fleet(scale);
        let got = rt.block_on(workers(&world, fleet, &[TAIL, LONG_TAIL], lengths));
        print_rows(&got);
        rows.extend(got);
    } else {
        println!("\n(The Worker is not built: `scripts/worker build`, then rerun for its rows.)");
    }
    println!("\n### All rows");
    print_rows(&rows);
    print_commands(&rows);
}

fn worker_built() -> bool {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../edge/worker/build/index.js")
        .exists()
}

/// Workers in workerd: as many as this machine holds without swapping into the
/// measurement (a Worker here is node + workerd, ~0.3 GB; a third of the free
/// memory), at least 6, at most 16 (each starts in seconds, one after
/// another); 6 with `--quick`.
fn worker_fleet(scale: usize) -> usize {
    if scale > 1 {
        return 6;
    }
    let available_gb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb / 1_000_000);
    ((available_gb as usize * 10 / 9) & !1).clamp(6, 16)
}

/// N native instances, in turn of the regions (r0, r1, r0 …), each replaceable
/// by a fresh one while the load runs.
struct Slots {
    edges: Vec<Mutex<Arc<Edge>>>,
}

impl Slots {
    async fn start(world: &World, n: usize) -> Self {
        let mut edges = vec![];
        for j in 0..n {
            let edge = world
                .edge(Mode::RegionalTally, j % REGIONS, PipelineConfig::default())
                .await;
            edges.push(Mutex::new(edge));
        }
        Self { edges }
    }

    /// The instance request `n` goes to.
    fn get(&self, n: u64) -> Arc<Edge> {
        self.edges[(n % self.edges.len() as u64) as usize]
            .lock()
            .unwrap()
            .clone()
    }

    /// The instances by region, as [`burst`] takes them.
    fn by_region(&self) -> Vec<Vec<Arc<Edge>>> {
        let mut regions = vec![vec![]; REGIONS];
        for (j, e) in self.edges.iter().enumerate() {
            regions[j % REGIONS].push(e.lock().unwrap().clone());
        }
        regions
    }

    /// Replaces every instance once over `secs`, evenly spaced: a fresh
    /// pipeline (cold memory, new connections) takes the old one's place; the
    /// old one finishes what it holds and is dropped without a last flush (a
    /// killed process).
    async fn replace_all(&self, world: &World, secs: f64) {
        let every = Duration::from_secs_f64(secs / self.edges.len() as f64);
        for (j, slot) in self.edges.iter().enumerate() {
            tokio::time::sleep(every / 2).await;
            let fresh = world
                .edge(Mode::RegionalTally, j % REGIONS, PipelineConfig::default())
                .await;
            *slot.lock().unwrap() = fresh;
            tokio::time::sleep(every / 2).await;
        }
    }

    /// Flushes every current instance's statistics as the native host does
    /// (each on its own schedule), until aborted.
    fn flush_periodically(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let slots = self.clone();
        let every = PipelineConfig::default().stats_flush_every.max(1) as u64;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_micros(every)).await;
                for j in 0..slots.edges.len() {
                    let edge = slots.get(j as u64);
                    tokio::spawn(async move {
                        let _ = edge.flush_stats().await;
                    });
                }
            }
        })
    }
}

/// Offers `rate` requests/s for `secs` over `slots`, request n to instance
/// n mod N, its API key drawn from `subjects` (key k of `keys`; one key for
/// [`Subjects::One`]).
async fn offer_keys(
    world: &World,
    slots: &Slots,
    keys: &[String],
    subjects: &Subjects,
    secs: f64,
    seed: u64,
) -> Run {
    let decide = |n: u64, ip| {
        let secret = &keys[subject_index(ip).saturating_sub(1) % keys.len()];
        gate_verdict(slots.get(n), format!("Bearer {secret}"), ip)
    };
    offer_with(&|| world.calls(), decide, subjects, RATE, secs, seed).await
}

/// New API keys of `plan`, one each.
async fn keys(world: &World, mode: Mode, plan: &str, n: usize) -> Vec<String> {
    let mut keys = Vec::with_capacity(n);
    for _ in 0..n {
        keys.push(world.key(mode, plan).await.swap_remove(0));
    }
    keys
}

fn zipf(shape: Shape) -> Subjects {
    Subjects::Zipf(Arc::new(Zipf::new(shape.keys, shape.zipf)))
}

/// The rows of `n` native instances: for each shape, bounded then exact, on
/// fresh keys (with `churn`, every instance replaced once in each measurement).
async fn native(world: &World, n: usize, shapes: &[Shape], churn: bool, len: Lengths) -> Vec<Row> {
    let slots = Arc::new(Slots::start(world, n).await);
    let flusher = slots.flush_periodically();
    let none = keys(world, Mode::RegionalTally, "none", 1).await;
    let mut rows = vec![];
    for &shape in shapes {
        for mode in [Mode::RegionalTally, Mode::ExactGlobal] {
            let load = keys(world, mode, &LOAD.plan(mode), shape.keys).await;
            let hammer = keys(world, mode, &QUOTA.plan(mode), 1).await;
            // the pass-through's own record warm first, as every instance's
            offer_keys(world, &slots, &none, &Subjects::One, 1.0, 0).await;
            let base = offer_keys(world, &slots, &none, &Subjects::One, len.base, 1).await;
            offer_keys(world, &slots, &load, &zipf(shape), len.warm, 2).await;
            settle(ONE_WAY).await;
            let before = world.bills();
            let subjects = zipf(shape);
            let measured = offer_keys(world, &slots, &load, &subjects, len.measured, 3);
            let run = if churn {
                tokio::join!(measured, slots.replace_all(world, len.measured)).0
            } else {
                measured.await
            };
            settle(ONE_WAY).await;
            let bill = world.bills().since(&before);
            let each = HAMMER.div_ceil(n);
            let secrets = vec![hammer[0].clone(); REGIONS];
            let admitted = burst(&slots.by_region(), &secrets, each).await;
            rows.push(Row {
                host: "native",
                instances: n,
                shape,
                mode,
                churn,
                run,
                base,
                bill,
                hammered: (admitted, (each * n) as u64),
            });
        }
    }
    flusher.abort();
    rows
}

/// The Worker rows: `fleet` Workers in workerd (half per region), the product's
/// defaults for records and statistics, each shape bounded then exact.
async fn workers(world: &World, fleet: usize, shapes: &[Shape], len: Lengths) -> Vec<Row> {
    let setup = WorkerSetup {
        per_region: fleet / REGIONS,
        cache_ttl_ms: 5_000,
        stats_flush_ms: 10_000,
        env: vec![],
    };
    let workers = WorkerRegions::start_with(world, true, &setup).await;
    workers.set_one_way(ONE_WAY);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let urls = workers.urls();
    let calls = || (workers.global_calls(), regional_calls(&world.regionals));
    let offer = |keys: Vec<String>, subjects: Subjects, secs: f64, seed: u64| {
        let (client, urls, calls) = (&client, &urls, &calls);
        async move {
            let decide = |n: u64, ip: std::net::IpAddr| {
                let secret = &keys[subject_index(ip).saturating_sub(1) % keys.len()];
                let request = client
                    .get(format!("{}/bench", urls[(n % urls.len() as u64) as usize]))
                    .bearer_auth(secret)
                    .header("cf-connecting-ip", ip.to_string());
                http_verdict(request)
            };
            offer_with(calls, decide, &subjects, RATE, secs, seed).await
        }
    };
    let none = keys(world, Mode::RegionalTally, "none", 1).await;
    let mut rows = vec![];
    for &shape in shapes {
        for mode in [Mode::RegionalTally, Mode::ExactGlobal] {
            let load = keys(world, mode, &LOAD.plan(mode), shape.keys).await;
            let hammer = keys(world, mode, &QUOTA.plan(mode), 1).await;
            offer(none.clone(), Subjects::One, 1.0, 0).await;
            let base = offer(none.clone(), Subjects::One, len.base, 1).await;
            offer(load.clone(), zipf(shape), len.warm, 2).await;
            settle(ONE_WAY).await;
            let before = world.bills();
            let run = offer(load, zipf(shape), len.measured, 3).await;
            settle(ONE_WAY).await;
            let bill = world.bills().since(&before);
            let each = HAMMER.div_ceil(fleet);
            let secrets = vec![hammer[0].clone(); urls.len()];
            let admitted = burst_http(&client, &urls, &secrets, each).await;
            rows.push(Row {
                host: "Worker",
                instances: fleet,
                shape,
                mode,
                churn: false,
                run,
                base,
                bill,
                hammered: (admitted, (each * fleet) as u64),
            });
        }
    }
    rows
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::ExactGlobal => "exact",
        _ => "bounded",
    }
}

fn print_rows(rows: &[Row]) {
    println!(
        "\n| host | instances | keys | mode | billed/request: global + regional = **sum** | global round trips/request (proxy) | waited for the global store (≥ {} ms) | added p50 / p99 ms | requests / degraded or 503 | hammered: admitted / offered (quota 400 + bound 40) |",
        ONE_WAY.as_millis()
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let n = r.run.requests.max(1) as f64;
        let (g, rg) = (r.bill.global as f64 / n, r.bill.regional as f64 / n);
        let q = |p: f64| r.run.quantile_ms(p) - r.base.quantile_ms(p);
        println!(
            "| {} | {}{} | {} Zipf({}) | {} | {g:.2} + {rg:.2} = **{:.2}** | {:.2} | {:.1} % | {:.2} / {:.2} | {} / {} | {} / {} |",
            r.host,
            r.instances,
            if r.churn { ", each replaced once" } else { "" },
            r.shape.keys,
            r.shape.zipf,
            mode_name(r.mode),
            g + rg,
            r.run.global_per_request(),
            100.0 * r.run.share_at_least(ONE_WAY),
            q(0.5),
            q(0.99),
            r.run.requests,
            r.run.degraded,
            r.hammered.0,
            r.hammered.1,
        );
    }
}

fn print_commands(rows: &[Row]) {
    println!("\nWhere the commands go, per request (g: the global store, r: the regional ones):");
    for r in rows {
        let n = r.run.requests.max(1) as f64;
        let top: Vec<String> = r
            .bill
            .top()
            .iter()
            .take(8)
            .map(|(name, c)| format!("{name} {:.3}", *c as f64 / n))
            .collect();
        println!(
            "- {} {}{} {} keys {}: {}",
            r.host,
            r.instances,
            if r.churn { " (churn)" } else { "" },
            r.shape.keys,
            mode_name(r.mode),
            top.join(", ")
        );
    }
}

// ---- The model (floodgate_shared::simulate::fanout): no servers.

const MODEL_LOAD: model::Limit = model::Limit {
    capacity: 10_000,
    refill: 10_000,
    period: 60 * MICROS_PER_SEC,
    max_overshoot: 500,
};

/// The internet rows' policy (see [`internet`]).
const INTERNET_LOAD: model::Limit = model::Limit {
    capacity: 60_000,
    refill: 60_000,
    period: 60 * MICROS_PER_SEC,
    max_overshoot: 3_000,
};

const MODEL_QUOTA: model::Limit = model::Limit {
    capacity: 400,
    refill: 1,
    period: 3_600 * MICROS_PER_SEC,
    max_overshoot: 40,
};

/// The measured shape, modelled: N instances over 2 regions, 400 keys
/// Zipf(1.1), 200 req/s, the bench's warm-up and window.
fn bench_shape(n: usize, shape: Shape, scale: usize) -> model::Deployment {
    let len = Lengths::of(scale);
    model::Deployment {
        locations: n,
        instances_per_location: 1,
        regions: REGIONS as u32,
        keys: shape.keys,
        zipf: shape.zipf,
        rate: RATE as f64,
        lifetime: 24 * 3_600 * MICROS_PER_SEC,
        global_one_way: ONE_WAY.as_micros() as Micros,
        regional_round_trip: 200,
        limit: MODEL_LOAD,
        edge: model::EdgeDefaults::default(),
        warm: (len.warm * 1e6) as Micros,
        measured: (len.measured * 1e6) as Micros,
        seed: 38,
    }
}

/// Internet scale: 300 locations × 4 instances in 8 regions, 1,000,000 keys,
/// 2,000 req/s (1.7 per instance), 60,000/min per key with a bound of 3,000
/// (5 %, as `scripts/bench cost`; the busiest key of Zipf(1.2), ~360 req/s,
/// stays under it), the global store 50 ms one way, a region's store 10 ms
/// round trip away. 5.5 min of warm-up (records live 5 min, chunks 1 min: no
/// state an instance holds is older, so a longer-lived instance is modelled by
/// its staggered incarnations), then 2 min measured (`--quick`: 2 and 1).
fn internet(zipf: f64, lifetime_s: i64, scale: usize) -> model::Deployment {
    let (warm, measured) = if scale > 1 { (120, 60) } else { (330, 120) };
    model::Deployment {
        locations: 300,
        instances_per_location: 4,
        regions: 8,
        keys: 1_000_000,
        zipf,
        rate: 2_000.0,
        lifetime: lifetime_s * MICROS_PER_SEC,
        global_one_way: 50_000,
        regional_round_trip: 10_000,
        limit: INTERNET_LOAD,
        edge: model::EdgeDefaults::default(),
        warm: warm * MICROS_PER_SEC,
        measured: measured * MICROS_PER_SEC,
        seed: 38,
    }
}

fn print_model(scale: usize) {
    let started = std::time::Instant::now();
    let modes: [&dyn model::Mechanism; 3] =
        [&model::Bounded, &model::Exact, &model::PrefetchedRecords];
    println!(
        "\n## Fan-out, modelled (floodgate_shared::simulate::fanout: the edge's per-instance logic (tally draws, instance leases of hot keys, record cache) on the pure twins of the tally and lease scripts, no servers; every request of the window simulated, key by key)"
    );
    println!("\n### The measured shape, modelled ({RATE} req/s, 2 regions, 50 ms one way)");
    model_header("instances, keys");
    for (n, shape) in [(4, TAIL), (16, TAIL), (48, TAIL), (48, LONG_TAIL)] {
        let d = bench_shape(n, shape, scale);
        for m in modes {
            let label = format!("{n}, {} Zipf({})", shape.keys, shape.zipf);
            model_row(&label, &d, m, n);
        }
    }
    println!(
        "\n### Internet scale, modelled: 300 locations × 4 instances, 8 regions, 1,000,000 keys, 2,000 req/s, 60,000/min per key, bound 3,000, the global store 50 ms one way, a region's 10 ms round trip"
    );
    model_header("Zipf, instance lifetime");
    for (zipf, life) in [
        (1.1, 10),
        (1.1, 60),
        (1.1, 600),
        (1.1, 3_600),
        (1.0, 600),
        (1.2, 600),
    ] {
        let d = internet(zipf, life, scale);
        for m in modes {
            model_row(&format!("{zipf}, {life} s"), &d, m, 1_200);
        }
    }
    println!(
        "\n(model: {:.1} s; its approximations are in the module's doc: regional calls decided at the request's instant, settlements at each epoch's end and their fixed cost counted per region, per-instance bookkeeping counted from the request rate, traffic spread evenly over every instance)",
        started.elapsed().as_secs_f64()
    );
}

fn model_header(what: &str) {
    println!(
        "| {what} | mode | billed/request: global + regional = **sum** (of which bookkeeping) | waited for the global store | added p50 / p99 ms (from the round trips) | hammered: admitted / offered (quota 400 + bound 40) |"
    );
    println!("|---|---|---|---|---|---|");
}

fn model_row(label: &str, d: &model::Deployment, m: &dyn model::Mechanism, instances: usize) {
    let f = model::run(d, m);
    let each = HAMMER.div_ceil(instances);
    let hammered = model::hammered(d, m, MODEL_QUOTA, each);
    let n = f.requests.max(1) as f64;
    println!(
        "| {label} | {} | {:.2} + {:.2} = **{:.2}** ({:.3}) | {:.1} % | {:.1} / {:.1} | {hammered} / {} |",
        m.name(),
        f.global_per_request(),
        f.regional_per_request(),
        f.billed_per_request(),
        f.bookkeeping / n,
        100.0 * f.share_waited(),
        f.quantile_ms(0.5),
        f.quantile_ms(0.99),
        each * instances,
    );
}
