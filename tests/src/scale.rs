//! Measurements of bounded consistency at a distance (`docs/scale.md`), shared by
//! the tests (small sizes, invariants asserted) and the benchmark (`scripts/bench
//! region`, `lease`, `hotkey`). They drive the product's own request pipeline
//! ([`Pipeline::gate`], as both hosts do) against real redis-servers: one global
//! Redis reached through an added-latency proxy per region, and one regional Redis
//! per region on loopback. Every loop is bounded in count and time; all traffic
//! stays on loopback.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_edge::native_host::NativeStore;
use floodgate_edge::pipeline::{
    DEGRADED_HEADER, Pipeline, PipelineConfig, RequestHead, store_deadline,
};
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::stats::{Leasing, StatsField};
use floodgate_shared::time::{Micros, SystemClock};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::RedisServer;

/// A TCP proxy on a free loopback port adding a one-way latency in each direction
/// (each chunk is delivered that long after it was read, order kept), plus a
/// random jitter per chunk when set; both can be changed while it runs. Stops accepting and drops its connections when
/// dropped.
pub struct LatencyProxy {
    pub port: u16,
    one_way_us: Arc<AtomicU64>,
    jitter_us: Arc<AtomicU64>,
    writes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    pub async fn start(target: u16, one_way: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let one_way_us = Arc::new(AtomicU64::new(one_way.as_micros() as u64));
        let jitter_us = Arc::new(AtomicU64::new(0));
        let writes = Arc::new(AtomicU64::new(0));
        let (stopped, counted) = (stop.clone(), writes.clone());
        let delay = Delay {
            one_way_us: one_way_us.clone(),
            jitter_us: jitter_us.clone(),
        };
        let task = tokio::spawn(async move {
            let mut conns = vec![];
            while !stopped.load(Ordering::Relaxed) {
                let Ok(Ok((client, _))) =
                    tokio::time::timeout(Duration::from_millis(100), listener.accept()).await
                else {
                    continue;
                };
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                conns.push(tokio::spawn(pump(
                    cr,
                    sw,
                    delay.clone(),
                    Some(counted.clone()),
                )));
                conns.push(tokio::spawn(pump(sr, cw, delay.clone(), None)));
            }
            for c in conns {
                c.abort();
            }
        });
        Self {
            port,
            one_way_us,
            jitter_us,
            writes,
            stop,
            task,
        }
    }

    /// What clients sent through so far, counted in reads of their side (one per
    /// request, or per batch of pipelined requests): round trips.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Changes the one-way latency of what is read from now on.
    pub fn set_one_way(&self, one_way: Duration) {
        self.one_way_us
            .store(one_way.as_micros() as u64, Ordering::Relaxed);
    }

    /// Adds to each chunk's one-way latency a random extra of up to `jitter`
    /// (uniform), from now on.
    pub fn set_jitter(&self, jitter: Duration) {
        self.jitter_us
            .store(jitter.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// A proxy's added latency, shared with its pumps.
#[derive(Clone)]
struct Delay {
    one_way_us: Arc<AtomicU64>,
    jitter_us: Arc<AtomicU64>,
}

impl Delay {
    fn draw(&self) -> Duration {
        let jitter = self.jitter_us.load(Ordering::Relaxed);
        let extra = if jitter == 0 {
            0
        } else {
            rand::rng().random_range(0..=jitter)
        };
        Duration::from_micros(self.one_way_us.load(Ordering::Relaxed) + extra)
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Delay,
    counted: Option<Arc<AtomicU64>>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, bytes)) = rx.recv().await {
            // tokio's timer ticks in whole milliseconds: no timer when due already
            if at > Instant::now() {
                tokio::time::sleep_until(at.into()).await;
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(c) = &counted {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                if tx
                    .send((Instant::now() + delay.draw(), buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// The largest excess of admissions within any window [a, b] over
/// `capacity + floor((b − a) / T)` (≤ 0 for an exact token bucket). `times` in µs.
pub fn worst_excess(times: &[Micros], capacity: u64, emission: Micros) -> i64 {
    if times.is_empty() {
        return -(capacity as i64);
    }
    let mut t = times.to_vec();
    t.sort_unstable();
    // window [t_i, t_j]: (j − i + 1) − capacity − floor((t_j − t_i) / T). With
    // a_k = k·T − t_k that is ceil((a_j − a_i) / T) + 1 − capacity, so the worst
    // window is the largest a_j − min_{i ≤ j} a_i: one pass.
    let (mut min_a, mut best) = (i64::MAX, i64::MIN);
    for (k, &tk) in t.iter().enumerate() {
        let a = k as i64 * emission - tk;
        min_a = min_a.min(a);
        best = best.max(a - min_a);
    }
    (best + emission - 1).div_euclid(emission) + 1 - capacity as i64
}

/// Script calls counted by `INFO commandstats` (evalsha + eval).
pub fn script_calls(conn: &mut redis::Connection) -> u64 {
    command_calls(conn)
        .iter()
        .filter(|(name, _)| name == "evalsha" || name == "eval")
        .map(|(_, n)| n)
        .sum()
}

/// Every command `conn`'s server ran since its counters were reset, by name,
/// those scripts ran included (`INFO commandstats`).
pub fn command_calls(conn: &mut redis::Connection) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(['=', ',']).nth(1)?.parse::<u64>().ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// How many times `command` ran, of [`command_calls`] (0 before its first call).
pub fn calls_of(conn: &mut redis::Connection, command: &str) -> u64 {
    command_calls(conn)
        .into_iter()
        .find(|(name, _)| name == command)
        .map_or(0, |(_, n)| n)
}

/// What a bill counts of [`command_calls`]: all but INFO and CONFIG (the tests'
/// own reads and resets), by name.
pub fn billed_by_name(conn: &mut redis::Connection) -> Vec<(String, u64)> {
    let mut calls = command_calls(conn);
    calls.retain(|(name, _)| !name.starts_with("info") && !name.starts_with("config"));
    calls
}

/// Calls the regional `servers` served together: script calls, and the
/// tallies' `HINCRBY`s (a request decided by its region's tally is one).
pub fn regional_calls(servers: &[RedisServer]) -> u64 {
    servers
        .iter()
        .map(|s| {
            let mut conn = s.connection();
            script_calls(&mut conn) + calls_of(&mut conn, "hincrby")
        })
        .sum()
}

/// How a deployment decides one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Exact: every decision is a round trip to the one global Redis.
    ExactGlobal,
    /// Exact against a Redis per region, no global Redis at all: the regions'
    /// limits are independent (the peers' local mode; the leakage anchor, 3.0×).
    Independent,
    /// Bounded, no regional store: each instance spends tokens leased from the
    /// global Redis.
    InstanceLeases,
    /// Bounded with a regional store: a request whose instance drew no token is
    /// one regional round trip to the region's tally, topped up from the global
    /// Redis.
    RegionalTally,
    /// `auto` with a regional store: exact until a key is hot on an instance.
    Auto,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::ExactGlobal,
        Mode::Independent,
        Mode::InstanceLeases,
        Mode::RegionalTally,
        Mode::Auto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::ExactGlobal => "exact, global Redis",
            Mode::Independent => "independent limits, Redis per region",
            Mode::InstanceLeases => "bounded, instance leases",
            Mode::RegionalTally => "bounded, regional tally",
            Mode::Auto => "auto, regional tally",
        }
    }

    /// The policy's `consistency`.
    pub fn consistency(self) -> &'static str {
        match self {
            Mode::ExactGlobal | Mode::Independent => "exact",
            Mode::InstanceLeases | Mode::RegionalTally => "bounded",
            Mode::Auto => "auto",
        }
    }

    fn regional(self) -> bool {
        matches!(self, Mode::RegionalTally | Mode::Auto)
    }
}

/// Per API key and client address, sized for the Zipf mix: 20,000/min (above the
/// busiest address's ~13,500/min at the benchmark's 1,500 req/s), bounded by 1,000
/// (5 %).
pub const PER_IP: Limit = Limit {
    name: "per_ip",
    capacity: 20_000,
    refill: 20_000,
    period: "1m",
    per_ip: true,
    max_overshoot: 1_000,
};

/// One limit of the runs: a policy per consistency (`{name}_{consistency}`, its
/// plan named the same), keyed by API key or client address.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub name: &'static str,
    pub capacity: u64,
    pub refill: u64,
    pub period: &'static str,
    /// `true`: per API key and client address (one key, a bucket per address);
    /// `false`: per key.
    pub per_ip: bool,
    pub max_overshoot: u64,
}

impl Limit {
    /// The plan (and policy) of this limit in `mode`.
    pub fn plan(&self, mode: Mode) -> String {
        format!("{}_{}", self.name, mode.consistency())
    }

    /// The token bucket's (capacity, emission interval in µs).
    pub fn bucket(&self) -> (u64, Micros) {
        let period: Micros = match self.period {
            "1s" => 1_000_000,
            "1m" => 60_000_000,
            "1h" => 3_600_000_000,
            other => panic!("period {other}"),
        };
        (self.capacity, period / self.refill as Micros)
    }
}

/// A configuration holding every limit in each consistency, for `regions`
/// regions, and a plan `none` without policies (the baseline).
pub fn config(limits: &[Limit], regions: u32) -> String {
    let mut policies = vec![];
    let mut plans = serde_json::Map::new();
    for l in limits {
        for c in ["exact", "bounded", "auto"] {
            let name = format!("{}_{c}", l.name);
            let mut p = serde_json::json!({
                "name": name,
                "dimensions": if l.per_ip { vec!["api_key", "client_ip"] } else { vec!["api_key"] },
                "quota": {"capacity": l.capacity, "refill": l.refill, "period": l.period},
                "failure_mode": "fail_closed",
                "consistency": c,
            });
            if c != "exact" {
                p["max_overshoot"] = l.max_overshoot.into();
            }
            policies.push(p);
            plans.insert(name.clone(), serde_json::json!([name]));
        }
    }
    plans.insert("none".into(), serde_json::json!([]));
    serde_json::json!({"policies": policies, "plans": plans, "regions": regions}).to_string()
}

/// The product's pipeline as a native host runs it.
pub type Edge = Pipeline<NativeStore, SystemClock>;

/// Regions on loopback: one global redis-server reached by each region through its
/// own latency proxy, and a redis-server per region.
pub struct World {
    pub global: RedisServer,
    pub regionals: Vec<RedisServer>,
    pub proxies: Vec<LatencyProxy>,
    admin: Vec<RespStore>,
    /// What every edge of the world counted of its bounded decisions.
    paths: Arc<DecisionPaths>,
}

/// Bounded policies' decisions as the edges count them (`Leasing::Local`: from
/// tokens at hand; `Leasing::Exact`: on the exact path, a round trip to the global
/// store): what paid the round trip, whatever the machine's speed.
#[derive(Default)]
pub struct DecisionPaths {
    local: AtomicU64,
    exact: AtomicU64,
}

impl floodgate_edge::stats::StatsSink for DecisionPaths {
    fn add(&self, field: &StatsField, n: u64) {
        match field {
            StatsField::Leasing(_, Leasing::Local) => self.local.fetch_add(n, Ordering::Relaxed),
            StatsField::Leasing(_, Leasing::Exact) => self.exact.fetch_add(n, Ordering::Relaxed),
            _ => 0,
        };
    }
}

impl DecisionPaths {
    /// The decisions `edges` counted so far (each hands its counts to the sink
    /// when settled, as before a metrics scrape).
    fn read(&self, edges: &[Vec<Arc<Edge>>]) -> (u64, u64) {
        edges.iter().flatten().for_each(|e| e.settle_stats());
        (
            self.local.load(Ordering::Relaxed),
            self.exact.load(Ordering::Relaxed),
        )
    }
}

impl World {
    /// Starts the servers and stores `config` in every one of them.
    pub async fn start(regions: usize, config: &str) -> Self {
        Self::start_on(regions, config, None).await
    }

    /// [`World::start`] with every redis-server pinned to `cpu`.
    pub async fn start_on(regions: usize, config: &str, cpu: Option<usize>) -> Self {
        let global = RedisServer::start_pinned(cpu, &[]);
        let regionals: Vec<RedisServer> = (0..regions)
            .map(|_| RedisServer::start_pinned(cpu, &[]))
            .collect();
        let mut proxies = vec![];
        for _ in 0..regions {
            proxies.push(LatencyProxy::start(global.port(), Duration::ZERO).await);
        }
        let mut admin = vec![];
        for server in std::iter::once(&global).chain(&regionals) {
            let store = RespStore::connect(&server.url(), Duration::from_secs(5))
                .await
                .expect("connect");
            floodgate_edge::admin::set_config(&store, config)
                .await
                .expect("a valid configuration");
            admin.push(store);
        }
        Self {
            global,
            regionals,
            proxies,
            admin,
            paths: Arc::default(),
        }
    }

    pub fn regions(&self) -> usize {
        self.regionals.len()
    }

    /// The global Redis' one-way distance from every region.
    pub fn set_one_way(&self, one_way: Duration) {
        for p in &self.proxies {
            p.set_one_way(one_way);
        }
    }

    /// A new API key of `plan`, its secret for each region: the same key for all
    /// (created in the global Redis), or in [`Mode::Independent`] one in each
    /// region's own Redis.
    pub async fn key(&self, mode: Mode, plan: &str) -> Vec<String> {
        let create = |store| async move {
            floodgate_edge::admin::create_key(store, "bench", plan, 1_764_000_000)
                .await
                .expect("create a key")
                .1
        };
        if mode == Mode::Independent {
            let mut secrets = vec![];
            for store in &self.admin[1..] {
                secrets.push(create(store).await);
            }
            secrets
        } else {
            vec![create(&self.admin[0]).await; self.regions()]
        }
    }

    /// `per_region` pipelines in each region deciding in `mode`; `deadline` is
    /// the answer deadline of one store call.
    pub async fn edges(
        &self,
        mode: Mode,
        per_region: usize,
        deadline: Duration,
    ) -> Vec<Vec<Arc<Edge>>> {
        self.edges_with(mode, per_region, deadline, PipelineConfig::default())
            .await
    }

    /// [`World::edges`] with other pipeline settings (the deadline is `deadline`,
    /// fixed).
    pub async fn edges_with(
        &self,
        mode: Mode,
        per_region: usize,
        deadline: Duration,
        settings: PipelineConfig,
    ) -> Vec<Vec<Arc<Edge>>> {
        let settings = PipelineConfig {
            deadline: floodgate_edge::deadline::DeadlineSettings::fixed(
                deadline.as_micros() as Micros
            ),
            ..settings
        };
        let connect = |url: String| async move {
            NativeStore::Resp(
                RespStore::connect(&url, store_deadline(deadline))
                    .await
                    .expect("connect"),
            )
        };
        let mut regions = vec![];
        for (r, regional) in self.regionals.iter().enumerate() {
            let mut edges = vec![];
            for _ in 0..per_region {
                let global = match mode {
                    Mode::Independent => regional.url(),
                    _ => self.proxies[r].url(),
                };
                let mut edge = Pipeline::new(connect(global).await, SystemClock, settings.clone())
                    .with_stats_sink(self.paths.clone());
                if mode.regional() {
                    edge = edge.with_regional(connect(regional.url()).await);
                }
                edges.push(Arc::new(edge));
            }
            regions.push(edges);
        }
        regions
    }

    /// Commands the global Redis has served (see [`all_calls`]).
    /// Round trips to the global Redis so far (writes through the proxies),
    /// and calls the regional Redis servers served together (scripts and tally
    /// `HINCRBY`s).
    pub fn calls(&self) -> (u64, u64) {
        (
            self.proxies.iter().map(LatencyProxy::writes).sum(),
            regional_calls(&self.regionals),
        )
    }

    /// What a bill counts so far, every store together: every command served,
    /// those scripts ran included (`INFO commandstats`; INFO and CONFIG, the
    /// tests' own, left out).
    pub fn billed(&self) -> u64 {
        std::iter::once(&self.global)
            .chain(&self.regionals)
            .map(|s| billed_commands(&mut s.connection()))
            .sum()
    }
}

/// Commands `conn`'s server ran, scripts' included, but INFO and CONFIG.
pub fn billed_commands(conn: &mut redis::Connection) -> u64 {
    billed_by_name(conn).iter().map(|(_, n)| n).sum()
}

/// Zipf(s) over `n` subjects: subject k (0-based) with probability ∝ 1/(k+1)^s.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += 1.0 / (k as f64).powf(s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Self { cdf }
    }

    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.random();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// Whose buckets a load uses.
#[derive(Clone)]
pub enum Subjects {
    /// One bucket (one client address).
    One,
    /// Client addresses drawn from a Zipf distribution (a per-address limit).
    Zipf(Arc<Zipf>),
}

/// The client address of subject `k`.
pub fn subject_ip(k: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, (k >> 16) as u8, (k >> 8) as u8, k as u8))
}

/// What one load observed.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub requests: u64,
    pub admitted: u64,
    /// Answers marked degraded (the store did not decide in time).
    pub degraded: u64,
    /// How long each decision took (`Pipeline::gate`), µs, sorted.
    pub latencies_us: Vec<u64>,
    /// When each admitted request was decided (µs since the load began).
    pub admitted_at: Vec<Micros>,
    /// Round trips to the global Redis, and script calls on the regional ones,
    /// during the load (background refills included).
    pub global_calls: u64,
    pub regional_calls: u64,
    /// The run's length (s).
    pub secs: f64,
    /// Bounded policies' decisions from tokens at hand and on the exact path (a
    /// global round trip), as the edges counted them ([`offer`] only).
    pub local_decisions: u64,
    pub exact_decisions: u64,
}

impl Run {
    /// The `q` quantile of the decision latency, in ms.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies_us.len() as f64 * q) as usize).min(self.latencies_us.len() - 1);
        self.latencies_us[i] as f64 / 1e3
    }

    /// The share of decisions that took at least `at`: with `at` one global round
    /// trip, the requests that paid it.
    pub fn share_at_least(&self, at: Duration) -> f64 {
        let at = at.as_micros() as u64;
        let slow = self.latencies_us.len() - self.latencies_us.partition_point(|&l| l < at);
        slow as f64 / self.latencies_us.len().max(1) as f64
    }

    /// The share of bounded decisions the edges took on the exact path: the
    /// requests that paid the global round trip, counted, not timed.
    pub fn share_exact(&self) -> f64 {
        self.exact_decisions as f64 / (self.local_decisions + self.exact_decisions).max(1) as f64
    }

    pub fn global_per_request(&self) -> f64 {
        self.global_calls as f64 / self.requests.max(1) as f64
    }
}

/// Offers `rate` requests/s for `secs` (open loop, 1 ms ticks), request n to
/// region n mod R and, there, to its edges in turn, each carrying the region's
/// `secrets` entry. Background work (refills) runs as the native host runs it:
/// spawned after the answer.
pub async fn offer(
    world: &World,
    edges: &[Vec<Arc<Edge>>],
    secrets: &[String],
    subjects: &Subjects,
    rate: u64,
    secs: f64,
    seed: u64,
) -> Run {
    let regions = edges.len() as u64;
    let decide = |n: u64, ip: IpAddr| {
        let r = (n % regions) as usize;
        let edge = edges[r][((n / regions) % edges[r].len() as u64) as usize].clone();
        let credentials = format!("Bearer {}", secrets[r]);
        async move {
            let decided = edge
                .gate(RequestHead {
                    path: "/bench",
                    credentials: Some(credentials.as_bytes()),
                    client_ip: Some(ip),
                    country: None,
                    user_agent: None,
                })
                .await;
            for task in decided.background {
                tokio::spawn(task);
            }
            match &decided.gate {
                Ok(admit) => Verdict {
                    admitted: true,
                    degraded: admit.header(DEGRADED_HEADER).is_some(),
                },
                Err(reply) => Verdict {
                    admitted: false,
                    degraded: reply.status != 429 || reply.header(DEGRADED_HEADER).is_some(),
                },
            }
        }
    };
    let (local, exact) = world.paths.read(edges);
    let mut run = offer_with(&|| world.calls(), decide, subjects, rate, secs, seed).await;
    let (local_after, exact_after) = world.paths.read(edges);
    (run.local_decisions, run.exact_decisions) = (local_after - local, exact_after - exact);
    run
}

/// What a client learnt of one request.
#[derive(Debug, Clone, Copy)]
pub struct Verdict {
    pub admitted: bool,
    /// Marked degraded, or refused otherwise than by a 429.
    pub degraded: bool,
}

/// Offers `rate` requests/s for `secs` (open loop, 1 ms ticks) through `decide`
/// (the request's number and client address), timing each.
pub async fn offer_with<F, Fut>(
    calls: &dyn Fn() -> (u64, u64),
    decide: F,
    subjects: &Subjects,
    rate: u64,
    secs: f64,
    seed: u64,
) -> Run
where
    F: Fn(u64, IpAddr) -> Fut,
    Fut: Future<Output = Verdict> + Send + 'static,
{
    let total = (rate as f64 * secs).round() as u64;
    let (global_before, regional_before) = calls();
    let start = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut run = Run {
        requests: total,
        ..Run::default()
    };
    while sent < total && start.elapsed() < Duration::from_secs_f64(secs * 3.0 + 1.0) {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64 + 1).min(total);
        while sent < due {
            let ip = match subjects {
                Subjects::One => subject_ip(0),
                Subjects::Zipf(z) => subject_ip(z.sample(&mut rng) + 1),
            };
            let decision = decide(sent, ip);
            tasks.spawn(async move {
                let t = Instant::now();
                let verdict = decision.await;
                (t.elapsed(), verdict, start.elapsed())
            });
            sent += 1;
        }
        while let Some(done) = tasks.try_join_next() {
            record(&mut run, done.expect("a decision"));
        }
    }
    while let Some(done) = tasks.join_next().await {
        record(&mut run, done.expect("a decision"));
    }
    run.requests = sent;
    run.secs = start.elapsed().as_secs_f64();
    run.latencies_us.sort_unstable();
    run.admitted_at.sort_unstable();
    let (global_after, regional_after) = calls();
    run.global_calls = global_after - global_before;
    run.regional_calls = regional_after - regional_before;
    run
}

fn record(run: &mut Run, (took, verdict, at): (Duration, Verdict, Duration)) {
    run.latencies_us.push(took.as_micros() as u64);
    if verdict.admitted {
        run.admitted += 1;
        run.admitted_at.push(at.as_micros() as Micros);
    }
    if verdict.degraded {
        run.degraded += 1;
    }
}

/// Every edge sends `each` requests one after another, all edges at once, on one
/// key (the region's secret): the number admitted.
pub async fn burst(edges: &[Vec<Arc<Edge>>], secrets: &[String], each: usize) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    for (r, region) in edges.iter().enumerate() {
        for edge in region {
            let (edge, credentials) = (edge.clone(), format!("Bearer {}", secrets[r]));
            tasks.spawn(async move {
                let mut admitted = 0;
                for _ in 0..each {
                    let decided = edge
                        .gate(RequestHead {
                            path: "/burst",
                            credentials: Some(credentials.as_bytes()),
                            client_ip: Some(subject_ip(0)),
                            country: None,
                            user_agent: None,
                        })
                        .await;
                    for task in decided.background {
                        tokio::spawn(task);
                    }
                    if decided.gate.is_ok() {
                        admitted += 1;
                    }
                }
                admitted
            });
        }
    }
    let mut admitted = 0;
    while let Some(n) = tasks.join_next().await {
        admitted += n.expect("a burst");
    }
    admitted
}

/// Lets the background work of `edges` settle (refills in flight land).
pub async fn settle(one_way: Duration) {
    tokio::time::sleep(one_way * 4 + Duration::from_millis(50)).await;
}

/// The built Worker in workerd, one per region (`REGION` r0, r1, …), in front of
/// one upstream: the global Redis through a REST endpoint reached through a latency
/// proxy per region, and, with `pools`, a REST endpoint on each regional Redis.
pub struct WorkerRegions {
    pub workers: Vec<crate::WorkerInstance>,
    proxies: Vec<LatencyProxy>,
    _endpoints: Vec<crate::Endpoint>,
    _upstream: crate::upstream::RawUpstream,
}

/// How [`WorkerRegions::start_with`] runs its Workers.
#[derive(Debug, Clone)]
pub struct WorkerSetup {
    /// Workers per region (each behind its own proxy to the global store).
    pub per_region: usize,
    /// `CACHE_TTL_MS`.
    pub cache_ttl_ms: i64,
    /// `STATS_FLUSH_MS`.
    pub stats_flush_ms: u64,
    /// More of the Worker's variables.
    pub env: Vec<(String, String)>,
}

impl Default for WorkerSetup {
    fn default() -> Self {
        Self {
            per_region: 1,
            cache_ttl_ms: 60_000,
            stats_flush_ms: crate::EdgeOptions::default().stats_flush_ms,
            env: vec![],
        }
    }
}

impl WorkerRegions {
    pub async fn start(world: &World, pools: bool) -> Self {
        Self::start_with(world, pools, &WorkerSetup::default()).await
    }

    /// [`WorkerRegions::start`] with `setup.per_region` Workers in each region
    /// (`REGION` r0, r1, …, in turn: r0, r1, r0, r1 …) and the setup's variables.
    pub async fn start_with(world: &World, pools: bool, setup: &WorkerSetup) -> Self {
        let token = "bench-token";
        let global = crate::Endpoint::start(&world.global, token).await;
        let port: u16 = global.url.rsplit(':').next().unwrap().parse().unwrap();
        let upstream = crate::upstream::RawUpstream::start().await;
        let mut endpoints = vec![];
        let mut regional_urls = serde_json::Map::new();
        let mut regional_tokens = serde_json::Map::new();
        if pools {
            for (r, server) in world.regionals.iter().enumerate() {
                let e = crate::Endpoint::start(server, token).await;
                regional_urls.insert(format!("r{r}"), e.url.clone().into());
                regional_tokens.insert(format!("r{r}"), token.into());
                endpoints.push(e);
            }
        }
        let (mut workers, mut proxies) = (vec![], vec![]);
        for n in 0..world.regions() * setup.per_region.max(1) {
            let r = n % world.regions();
            let proxy = LatencyProxy::start(port, Duration::ZERO).await;
            let mut env = vec![
                ("REGION".to_string(), format!("r{r}")),
                (
                    "REGIONAL_REST_URLS".to_string(),
                    serde_json::Value::from(regional_urls.clone()).to_string(),
                ),
                (
                    "REGIONAL_REST_TOKENS".to_string(),
                    serde_json::Value::from(regional_tokens.clone()).to_string(),
                ),
            ];
            env.extend(setup.env.iter().cloned());
            let options = crate::EdgeOptions {
                cache_ttl_ms: setup.cache_ttl_ms,
                deadline_ms: Some(2_000),
                worker_env: env,
                stats_flush_ms: setup.stats_flush_ms,
                ..crate::EdgeOptions::default()
            };
            let url = format!("http://127.0.0.1:{}", proxy.port);
            workers.push(crate::start_worker(&url, token, &upstream.url, &options).await);
            proxies.push(proxy);
        }
        endpoints.push(global);
        Self {
            workers,
            proxies,
            _endpoints: endpoints,
            _upstream: upstream,
        }
    }

    /// The global Redis' one-way distance from every region.
    pub fn set_one_way(&self, one_way: Duration) {
        for p in &self.proxies {
            p.set_one_way(one_way);
        }
    }

    /// Round trips to the global REST endpoint so far (see [`LatencyProxy::writes`]).
    pub fn global_calls(&self) -> u64 {
        self.proxies.iter().map(LatencyProxy::writes).sum()
    }

    pub fn urls(&self) -> Vec<String> {
        self.workers.iter().map(|w| w.url.clone()).collect()
    }
}

/// [`offer`] over HTTP: request n to `urls[n mod R]` with that region's secret and
/// the client address in `CF-Connecting-IP`; the time is the whole exchange.
#[allow(clippy::too_many_arguments)]
pub async fn offer_http(
    calls: &dyn Fn() -> (u64, u64),
    client: &reqwest::Client,
    urls: &[String],
    secrets: &[String],
    subjects: &Subjects,
    rate: u64,
    secs: f64,
    seed: u64,
) -> Run {
    let regions = urls.len() as u64;
    let decide = |n: u64, ip: IpAddr| {
        let r = (n % regions) as usize;
        let request = client
            .get(format!("{}/bench", urls[r]))
            .bearer_auth(&secrets[r])
            .header("cf-connecting-ip", ip.to_string());
        async move {
            match request.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let marked = resp.headers().contains_key(DEGRADED_HEADER);
                    let _ = resp.bytes().await;
                    Verdict {
                        admitted: status == 200,
                        degraded: marked || !(status == 200 || status == 429),
                    }
                }
                Err(_) => Verdict {
                    admitted: false,
                    degraded: true,
                },
            }
        }
    };
    offer_with(calls, decide, subjects, rate, secs, seed).await
}

/// [`burst`] over HTTP: `each` requests one after another to every URL, all at
/// once; the number admitted.
pub async fn burst_http(
    client: &reqwest::Client,
    urls: &[String],
    secrets: &[String],
    each: usize,
) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    for (r, url) in urls.iter().enumerate() {
        let (client, url, secret) = (client.clone(), format!("{url}/burst"), secrets[r].clone());
        tasks.spawn(async move {
            let mut admitted = 0;
            for _ in 0..each {
                if let Ok(resp) = client.get(&url).bearer_auth(&secret).send().await {
                    admitted += u64::from(resp.status() == 200);
                    let _ = resp.bytes().await;
                }
            }
            admitted
        });
    }
    let mut admitted = 0;
    while let Some(n) = tasks.join_next().await {
        admitted += n.expect("a burst");
    }
    admitted
}

// ---- Fan-out (`scripts/bench fanout`): many instances, one key record each per
// API key, bills by store.

/// The subject whose client address is `ip` ([`subject_ip`] backwards): with
/// [`Subjects::Zipf`], subject k + 1 was drawn as the k-th of the distribution.
pub fn subject_index(ip: IpAddr) -> usize {
    match ip {
        IpAddr::V4(v4) => {
            let [_, a, b, c] = v4.octets();
            (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c)
        }
        IpAddr::V6(_) => 0,
    }
}

/// One request through `edge` with `credentials` (the whole header value) from
/// `ip`, its background work spawned after the answer as the native host does:
/// what its client learnt (the same reading as [`offer`]'s).
pub async fn gate_verdict(edge: Arc<Edge>, credentials: String, ip: IpAddr) -> Verdict {
    let decided = edge
        .gate(RequestHead {
            path: "/bench",
            credentials: Some(credentials.as_bytes()),
            client_ip: Some(ip),
            country: None,
            user_agent: None,
        })
        .await;
    for task in decided.background {
        tokio::spawn(task);
    }
    match &decided.gate {
        Ok(admit) => Verdict {
            admitted: true,
            degraded: admit.header(DEGRADED_HEADER).is_some(),
        },
        Err(reply) => Verdict {
            admitted: false,
            degraded: reply.status != 429 || reply.header(DEGRADED_HEADER).is_some(),
        },
    }
}

/// One HTTP request as [`offer_http`] reads it: admitted on a 200; degraded
/// when marked so, answered otherwise than 200 or 429, or not answered.
pub async fn http_verdict(request: reqwest::RequestBuilder) -> Verdict {
    match request.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let marked = resp.headers().contains_key(DEGRADED_HEADER);
            let _ = resp.bytes().await;
            Verdict {
                admitted: status == 200,
                degraded: marked || !(status == 200 || status == 429),
            }
        }
        Err(_) => Verdict {
            admitted: false,
            degraded: true,
        },
    }
}

impl World {
    /// One pipeline of region `region` deciding in `mode`, built as
    /// `floodgate-edge` builds its own: `settings` as given (the deadline too:
    /// adaptive by default), each store connected with its transport deadline,
    /// the regional one answering within the same deadline settings.
    pub async fn edge(&self, mode: Mode, region: usize, settings: PipelineConfig) -> Arc<Edge> {
        let transport = floodgate_edge::pipeline::transport_deadline(&settings.deadline);
        let connect = |url: String| async move {
            NativeStore::Resp(RespStore::connect(&url, transport).await.expect("connect"))
        };
        let global = match mode {
            Mode::Independent => self.regionals[region].url(),
            _ => self.proxies[region].url(),
        };
        let deadline = settings.deadline;
        let mut edge = Pipeline::new(connect(global).await, SystemClock, settings)
            .with_stats_sink(self.paths.clone());
        if mode.regional() {
            let regional = connect(self.regionals[region].url()).await;
            edge = edge.with_regional_within(regional, deadline);
        }
        Arc::new(edge)
    }

    /// What every store has billed so far ([`billed_by_name`]).
    pub fn bills(&self) -> Bills {
        let mut by_name = std::collections::BTreeMap::new();
        let mut add = |prefix: &str, server: &RedisServer| {
            let mut total = 0;
            for (name, n) in billed_by_name(&mut server.connection()) {
                *by_name.entry(format!("{prefix}{name}")).or_insert(0) += n;
                total += n;
            }
            total
        };
        let global = add("g:", &self.global);
        let regional = self.regionals.iter().map(|s| add("r:", s)).sum();
        Bills {
            global,
            regional,
            by_name,
        }
    }
}

/// Commands billed: by the global store, by the regional ones together, and by
/// store and name ("g:" global, "r:" regional).
#[derive(Debug, Clone, Default)]
pub struct Bills {
    pub global: u64,
    pub regional: u64,
    pub by_name: std::collections::BTreeMap<String, u64>,
}

impl Bills {
    /// What was billed since `earlier`.
    pub fn since(&self, earlier: &Bills) -> Bills {
        let by_name = self
            .by_name
            .iter()
            .map(|(k, n)| (k.clone(), n - earlier.by_name.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        Bills {
            global: self.global - earlier.global,
            regional: self.regional - earlier.regional,
            by_name,
        }
    }

    /// The commands by name, most first.
    pub fn top(&self) -> Vec<(String, u64)> {
        let mut names: Vec<(String, u64)> =
            self.by_name.iter().map(|(k, n)| (k.clone(), *n)).collect();
        names.sort_by_key(|n| std::cmp::Reverse(n.1));
        names
    }
}
