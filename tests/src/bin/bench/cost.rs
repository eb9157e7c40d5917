//! `scripts/bench cost`: what a deployment pays per request, every store's bill
//! together (issue 22's deployment): two regions × two instances, a regional Redis
//! per region on loopback, ONE global Redis 50 ms one way through the latency
//! proxy, 120 requests/s over 16 subjects drawn from Zipf(1.1), a bounded policy
//! (60,000/min, bound 3,000) and the same as an exact one; @upstash/ratelimit
//! through floodgate-rest on the same load beside it. Commands are counted as
//! Upstash bills them: every command a client sent plus every command a script
//! ran (`INFO commandstats`), statistics and record reads included.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floodgate_edge::pipeline::PipelineConfig;
use floodgate_edge::pipeline::leases::LeaseSettings;
use floodgate_shared::time::Micros;
use floodgate_tests::RedisServer;
use floodgate_tests::scale::{
    Edge, Limit, Mode, Run, Subjects, WorkerRegions, WorkerSetup, World, Zipf, billed_by_name,
    billed_commands, burst, burst_http, config, offer, offer_http, regional_calls, settle,
};

/// Upstash's published price: dollars per 100,000 commands.
const DOLLARS_PER_100K: f64 = 0.20;

/// The bounded (and exact) policy of the load: 60,000/min per subject, bound 3,000.
const LOAD: Limit = Limit {
    name: "cost",
    capacity: 60_000,
    refill: 60_000,
    period: "1m",
    per_ip: true,
    max_overshoot: 3_000,
};

/// The quota hammered from every instance: 400, not refilling during the run,
/// bound 40.
const QUOTA: Limit = Limit {
    name: "quota",
    capacity: 400,
    refill: 1,
    period: "1h",
    per_ip: false,
    max_overshoot: 40,
};

const RATE: u64 = 120;
const PER_REGION: usize = 2;
const ONE_WAY: Duration = Duration::from_millis(50);

/// What one row measured.
struct Row {
    host: &'static str,
    mode: String,
    run: Run,
    /// The same host's requests without policies (added latency is the difference).
    base: Option<Run>,
    /// The policies' requests and the same host's requests without policies,
    /// offered at the same time (each at the load's rate): the added latency with
    /// the machine's noise the same on both sides.
    paired: Option<(Run, Run)>,
    global: u64,
    regional: u64,
    /// The commands billed, by store and name, most first.
    commands: Vec<(String, u64)>,
    /// Admitted of the hammered quota (400 + bound 40), when measured.
    quota: Option<u64>,
}

impl Row {
    fn billed_per_request(&self) -> f64 {
        (self.global + self.regional) as f64 / self.run.requests.max(1) as f64
    }
}

/// The load's length: (warm-up, measured) seconds.
fn lengths(scale: usize) -> (f64, f64) {
    if scale > 1 { (4.0, 12.0) } else { (10.0, 60.0) }
}

pub fn cost(cpu: Option<usize>, scale: usize, lifetimes_ms: &[u32], rt: &tokio::runtime::Runtime) {
    let (warm, secs) = lengths(scale);
    println!(
        "\n## Cost: billed commands per request, every store together (2 regions × {PER_REGION} instances, global Redis {} ms one way, {RATE} req/s over 16 subjects Zipf(1.1), 60,000/min, bound 3,000; {warm} s warm-up, {secs} s measured, twice for bounded rows)",
        ONE_WAY.as_millis()
    );
    let world = rt.block_on(World::start_on(2, &config(&[LOAD, QUOTA], 2), cpu));
    world.set_one_way(ONE_WAY);
    let zipf = Subjects::Zipf(Arc::new(Zipf::new(16, 1.1)));
    let default_life = LeaseSettings::default().tally.epoch;
    let mut rows = vec![];
    let mut lifetimes: Vec<Micros> = lifetimes_ms
        .iter()
        .map(|&ms| Micros::from(ms) * 1_000)
        .collect();
    if lifetimes.is_empty() {
        lifetimes = vec![default_life];
    }
    let mut cases = vec![(Mode::ExactGlobal, default_life)];
    cases.extend(lifetimes.iter().map(|&l| (Mode::RegionalTally, l)));
    for &(mode, lifetime) in &cases {
        rows.extend(rt.block_on(native(&world, &zipf, mode, lifetime, warm, secs)));
    }
    if worker_built() {
        for &(mode, lifetime) in &cases {
            rows.extend(rt.block_on(worker(&world, &zipf, mode, lifetime, warm, secs)));
        }
    } else {
        println!("\n(The Worker is not built: `scripts/worker build`, then rerun for its rows.)");
    }
    print_rows(&rows);
    upstash(cpu, secs, rt);
}

fn worker_built() -> bool {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../edge/worker/build/index.js")
        .exists()
}

fn mode_name(mode: Mode, lifetime: Micros) -> String {
    match mode {
        Mode::ExactGlobal => "exact".into(),
        _ => format!("{}, tally epoch {} s", mode.name(), lifetime as f64 / 1e6),
    }
}

/// Bills so far: the global store's, the regional ones' together, and every
/// store's by command name ("g:" global, "r:" regional).
struct Bills {
    global: u64,
    regional: u64,
    by_name: BTreeMap<String, u64>,
}

fn bills(world: &World) -> Bills {
    let mut by_name = BTreeMap::new();
    let mut add = |prefix: &str, server: &RedisServer| {
        let mut total = 0;
        for (name, n) in billed_by_name(&mut server.connection()) {
            *by_name.entry(format!("{prefix}{name}")).or_insert(0) += n;
            total += n;
        }
        total
    };
    let global = add("g:", &world.global);
    let regional = world.regionals.iter().map(|s| add("r:", s)).sum();
    Bills {
        global,
        regional,
        by_name,
    }
}

impl Bills {
    /// What was billed between `self` and `later`: (global, regional, the
    /// commands by name, most first).
    fn until(&self, later: &Bills) -> Bill {
        let mut names: Vec<(String, u64)> = later
            .by_name
            .iter()
            .map(|(k, n)| (k.clone(), n - self.by_name.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        names.sort_by_key(|n| std::cmp::Reverse(n.1));
        (
            later.global - self.global,
            later.regional - self.regional,
            names,
        )
    }
}

/// The native host's pipelines (as `floodgate-edge` runs them, its statistics
/// flushed on its own schedule).
async fn native(
    world: &World,
    zipf: &Subjects,
    mode: Mode,
    lifetime: Micros,
    warm: f64,
    secs: f64,
) -> Vec<Row> {
    let settings = PipelineConfig {
        leases: LeaseSettings {
            tally: floodgate_shared::tally::TallySettings { epoch: lifetime },
            ..LeaseSettings::default()
        },
        ..PipelineConfig::default()
    };
    let edges = world
        .edges_with(mode, PER_REGION, Duration::from_secs(2), settings)
        .await;
    let flushers: Vec<_> = edges.iter().flatten().map(flush_periodically).collect();
    let none = world.key(mode, "none").await;
    offer(world, &edges, &none, &Subjects::One, RATE, 1.0, 1).await;
    let base = offer(
        world,
        &edges,
        &none,
        &Subjects::One,
        RATE,
        secs.min(10.0),
        2,
    )
    .await;
    let key = world.key(mode, &LOAD.plan(mode)).await;
    offer(world, &edges, &key, zipf, RATE, warm, 3).await;
    settle(ONE_WAY).await;
    let mut measured = vec![];
    for w in 0..windows(mode) {
        let before = bills(world);
        let run = offer(world, &edges, &key, zipf, RATE, secs, 4 + w).await;
        settle(ONE_WAY).await;
        measured.push((run, before.until(&bills(world))));
    }
    let paired = tokio::join!(
        offer(world, &edges, &key, zipf, RATE, PAIRED_SECS, 7),
        offer(world, &edges, &none, &Subjects::One, RATE, PAIRED_SECS, 8),
    );
    let quota = if mode == Mode::ExactGlobal {
        None
    } else {
        let q = world.key(mode, &QUOTA.plan(mode)).await;
        Some(burst(&edges, &q, 200).await)
    };
    for f in flushers {
        f.abort();
    }
    rows("native", mode, lifetime, (base, paired), measured, quota)
}

/// Bounded rows measure two windows one after the other: the first after the
/// warm-up, where the chunks taken at the start all die and are replaced (their
/// generation is in step), and the next, where chunks come and go one by one.
fn windows(mode: Mode) -> u64 {
    if mode == Mode::ExactGlobal { 1 } else { 2 }
}

type Bill = (u64, u64, Vec<(String, u64)>);

/// How long the paired latency window runs (s).
const PAIRED_SECS: f64 = 30.0;

/// One row per measured window (the quota's admissions and the paired latency
/// on the first).
fn rows(
    host: &'static str,
    mode: Mode,
    lifetime: Micros,
    (base, paired): (Run, (Run, Run)),
    measured: Vec<(Run, Bill)>,
    quota: Option<u64>,
) -> Vec<Row> {
    let n = measured.len();
    measured
        .into_iter()
        .enumerate()
        .map(|(i, (run, (global, regional, commands)))| Row {
            host,
            mode: match n {
                1 => mode_name(mode, lifetime),
                _ => format!("{}, window {} of {n}", mode_name(mode, lifetime), i + 1),
            },
            run,
            base: Some(base.clone()),
            paired: (i == 0).then(|| paired.clone()),
            global,
            regional,
            commands,
            quota: if i == 0 { quota } else { None },
        })
        .collect()
}

/// Flushes `edge`'s statistics as the native host does, until aborted.
fn flush_periodically(edge: &Arc<Edge>) -> tokio::task::JoinHandle<()> {
    let edge = edge.clone();
    let every = Duration::from_micros(edge.settings().stats_flush_every.max(1) as u64);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let _ = edge.flush_stats().await;
        }
    })
}

/// The built Worker in workerd, `PER_REGION` per region, with the product's
/// defaults for statistics and record caching.
async fn worker(
    world: &World,
    zipf: &Subjects,
    mode: Mode,
    lifetime: Micros,
    warm: f64,
    secs: f64,
) -> Vec<Row> {
    let setup = WorkerSetup {
        per_region: PER_REGION,
        cache_ttl_ms: 5_000,
        stats_flush_ms: 10_000,
        env: vec![("TALLY_EPOCH_MS".to_string(), (lifetime / 1_000).to_string())],
    };
    let workers = WorkerRegions::start_with(world, mode == Mode::RegionalTally, &setup).await;
    workers.set_one_way(ONE_WAY);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let calls = || (workers.global_calls(), regional_calls(&world.regionals));
    let urls = workers.urls();
    let each = |secret: Vec<String>| vec![secret[0].clone(); urls.len()];
    let none = each(world.key(mode, "none").await);
    offer_http(&calls, &client, &urls, &none, &Subjects::One, RATE, 1.0, 1).await;
    let base = offer_http(
        &calls,
        &client,
        &urls,
        &none,
        &Subjects::One,
        RATE,
        secs.min(10.0),
        2,
    )
    .await;
    let key = each(world.key(mode, &LOAD.plan(mode)).await);
    offer_http(&calls, &client, &urls, &key, zipf, RATE, warm, 3).await;
    settle(ONE_WAY).await;
    let mut measured = vec![];
    for w in 0..windows(mode) {
        let before = bills(world);
        let run = offer_http(&calls, &client, &urls, &key, zipf, RATE, secs, 4 + w).await;
        settle(ONE_WAY).await;
        measured.push((run, before.until(&bills(world))));
    }
    let paired = tokio::join!(
        offer_http(&calls, &client, &urls, &key, zipf, RATE, PAIRED_SECS, 7),
        offer_http(
            &calls,
            &client,
            &urls,
            &none,
            &Subjects::One,
            RATE,
            PAIRED_SECS,
            8
        ),
    );
    let quota = if mode == Mode::ExactGlobal {
        None
    } else {
        let q = each(world.key(mode, &QUOTA.plan(mode)).await);
        Some(burst_http(&client, &urls, &q, 200).await)
    };
    rows("Worker", mode, lifetime, (base, paired), measured, quota)
}

fn print_rows(rows: &[Row]) {
    println!(
        "| host | mode | billed/request | global / regional per request | $ per million requests | added p50 / p99 ms | paired: added p50 / p99 ms (with / without policies) | requests admitted / degraded | quota 400 + bound 40: admitted |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let n = r.run.requests.max(1) as f64;
        let (p50, p99) = match &r.base {
            Some(b) => (
                r.run.quantile_ms(0.5) - b.quantile_ms(0.5),
                r.run.quantile_ms(0.99) - b.quantile_ms(0.99),
            ),
            None => (r.run.quantile_ms(0.5), r.run.quantile_ms(0.99)),
        };
        let paired = r.paired.as_ref().map_or("—".into(), |(with, without)| {
            let q = |run: &Run| (run.quantile_ms(0.5), run.quantile_ms(0.99));
            let ((w50, w99), (o50, o99)) = (q(with), q(without));
            format!(
                "{:.2} / {:.2} ({w50:.2} / {w99:.2} vs {o50:.2} / {o99:.2})",
                w50 - o50,
                w99 - o99
            )
        });
        println!(
            "| {} | {} | **{:.3}** | {:.3} / {:.3} | {:.2} | {p50:.2} / {p99:.2} | {paired} | {}/{} / {} | {} |",
            r.host,
            r.mode,
            r.billed_per_request(),
            r.global as f64 / n,
            r.regional as f64 / n,
            r.billed_per_request() * 1e6 / 1e5 * DOLLARS_PER_100K,
            r.run.admitted,
            r.run.requests,
            r.run.degraded,
            r.quota.map_or("—".into(), |q| q.to_string()),
        );
    }
    println!("\nWhere the commands go, per request (g: the global store, r: the regional ones):");
    for r in rows {
        let n = r.run.requests.max(1) as f64;
        let top: Vec<String> = r
            .commands
            .iter()
            .take(8)
            .map(|(name, c)| format!("{name} {:.3}", *c as f64 / n))
            .collect();
        println!("- {} {}: {}", r.host, r.mode, top.join(", "));
    }
}

/// @upstash/ratelimit 2.2 on the same load (4 clients, 120 req/s, 16 identifiers
/// Zipf(1.1), 60,000/min) through floodgate-rest on its own redis-server.
fn upstash(cpu: Option<usize>, secs: f64, rt: &tokio::runtime::Runtime) {
    let node_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("node");
    if !node_dir.join("node_modules/@upstash/ratelimit").exists() {
        println!("\n(@upstash/ratelimit is not installed: `npm ci` in tests/node.)");
        return;
    }
    let server = RedisServer::start_pinned(cpu, &[]);
    let endpoint = rt.block_on(floodgate_tests::Endpoint::start(&server, "cost-token"));
    println!("\n### @upstash/ratelimit 2.2 on the same load, through floodgate-rest");
    println!("| limiter | billed/request | $ per million requests | requests | allowed |");
    println!("|---|---|---|---|---|");
    // node runs beside the runtime, which serves floodgate-rest meanwhile
    let run = |limiter: &'static str, secs: f64| {
        let (dir, url, token) = (
            node_dir.clone(),
            endpoint.url.clone(),
            endpoint.token.clone(),
        );
        rt.block_on(async move {
            tokio::task::spawn_blocking(move || node_cost(&dir, &url, &token, limiter, secs)).await
        })
        .ok()
        .flatten()
    };
    for limiter in ["fixedWindow", "slidingWindow", "tokenBucket"] {
        // loads the script and opens the connections, uncounted
        run(limiter, 2.0);
        let before = billed_commands(&mut server.connection());
        let Some((requests, allowed)) = run(limiter, secs) else {
            println!("| {limiter} | (node failed) | | | |");
            continue;
        };
        let billed = billed_commands(&mut server.connection()) - before;
        let per = billed as f64 / requests.max(1) as f64;
        println!(
            "| {limiter} | **{per:.3}** | {:.2} | {requests} | {allowed} |",
            per * 10.0 * DOLLARS_PER_100K
        );
    }
}

/// Runs `ratelimit-cost.mjs`: (requests, allowed).
fn node_cost(
    dir: &std::path::Path,
    url: &str,
    token: &str,
    limiter: &str,
    secs: f64,
) -> Option<(u64, u64)> {
    let out = std::process::Command::new("node")
        .arg("ratelimit-cost.mjs")
        .current_dir(dir)
        .env("FLOODGATE_REST_URL", url)
        .env("FLOODGATE_REST_TOKEN", token)
        .env("BENCH_LIMITER", limiter)
        .env("BENCH_RATE", RATE.to_string())
        .env("BENCH_SECS", secs.to_string())
        .env("BENCH_INSTANCES", (2 * PER_REGION).to_string())
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((v["requests"].as_u64()?, v["allowed"].as_u64()?))
}
