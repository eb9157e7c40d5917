//! Measurements of the scale-out trades (`docs/scale.md`), shared by the tests
//! (small sizes, invariants asserted) and the benchmark (`scripts/bench lease`,
//! `region`, `hotkey`): lease vs exact mode at N instances, multi-region latency and
//! leakage behind an added-latency proxy, a hot key at a fixed rate. Every loop is
//! bounded in count and time; all traffic stays on loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_edge::lease::{LeaseMode, Leaser};
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::lease::{LeaseConfig, Mode};
use floodgate_shared::policy::Quota;
use floodgate_shared::time::{Micros, SystemClock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::RedisServer;

/// A TCP proxy on a free loopback port adding `one_way` latency in each direction
/// (each chunk is delivered `one_way` after it was read, order kept). Stops
/// accepting and drops its connections when dropped.
pub struct LatencyProxy {
    pub port: u16,
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
        let stopped = stop.clone();
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
                conns.push(tokio::spawn(pump(cr, sw, one_way)));
                conns.push(tokio::spawn(pump(sr, cw, one_way)));
            }
            for c in conns {
                c.abort();
            }
        });
        Self { port, stop, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
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
    delay: Duration,
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
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
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

/// One lease-vs-exact run: `instances` limiters (one connection each) share one
/// bucket; a load generator offers `rate` requests/s spread evenly over them for
/// `secs`.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRun {
    pub requests: u64,
    pub admitted: u64,
    pub calls: u64,
    /// Redis commands per request, from `INFO commandstats`.
    pub redis_per_request: f64,
    /// The worst window's admissions over `capacity + refill × window`.
    pub overshoot: i64,
    pub errors: u64,
}

impl LeaseRun {
    pub fn calls_per_request(&self) -> f64 {
        self.calls as f64 / self.requests.max(1) as f64
    }
}

/// Script calls counted by `INFO commandstats` (evalsha + eval).
pub fn script_calls(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Runs `instances` limiters in `mode` against one bucket of `quota` on `url`.
#[allow(clippy::too_many_arguments)]
pub async fn lease_run(
    server: &RedisServer,
    url: &str,
    key: &str,
    quota: &Quota,
    config: LeaseConfig,
    mode: LeaseMode,
    instances: usize,
    rate: u64,
    secs: f64,
) -> LeaseRun {
    let mut conn = server.connection();
    let before = script_calls(&mut conn);
    let mut limiters = vec![];
    for i in 0..instances {
        let store = RespStore::connect(url, Duration::from_secs(2))
            .await
            .expect("connect");
        limiters.push(Arc::new(Leaser::new(
            store,
            SystemClock,
            config,
            mode,
            &format!("i{i}"),
        )));
    }
    let (admitted_at, errors) = drive(&limiters, key, quota, rate, secs).await;
    let requests = (rate as f64 * secs).round() as u64;
    let calls: u64 = limiters.iter().map(|l| l.counters().calls).sum();
    let redis = script_calls(&mut conn) - before;
    LeaseRun {
        requests,
        admitted: admitted_at.len() as u64,
        calls,
        redis_per_request: redis as f64 / requests.max(1) as f64,
        overshoot: worst_excess(&admitted_at, quota.capacity(), quota.emission_interval()),
        errors,
    }
}

/// Offers `rate` requests/s for `secs` (open loop, 1 ms ticks), request n to
/// limiter n mod len. Returns the admission instants (the decision's instant:
/// Redis' clock when it was called, the instance's clock for a lease spend; one
/// wall clock on loopback) and the number of failed calls.
pub async fn drive(
    limiters: &[Arc<Leaser<RespStore, SystemClock>>],
    key: &str,
    quota: &Quota,
    rate: u64,
    secs: f64,
) -> (Vec<Micros>, u64) {
    let total = (rate as f64 * secs).round() as u64;
    let start = Instant::now();
    let admitted = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total as usize)));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while sent < total && start.elapsed() < Duration::from_secs_f64(secs * 3.0 + 1.0) {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64 + 1).min(total);
        while sent < due {
            let l = limiters[(sent % limiters.len() as u64) as usize].clone();
            let (key, quota, admitted, errors) =
                (key.to_string(), *quota, admitted.clone(), errors.clone());
            tasks.spawn(async move {
                match l.check_quota(&key, &quota, 1).await {
                    Ok(o) if o.admitted => admitted.lock().unwrap().push(o.at),
                    Ok(_) => {}
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            sent += 1;
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let times = std::mem::take(&mut *admitted.lock().unwrap());
    (times, errors.load(Ordering::Relaxed))
}

/// Where one region's decisions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every region calls one primary (exact, one global quota).
    Global,
    /// Every region has its own Redis (exact per region, no cross-region hop).
    Regional,
    /// Every region leases from the one primary.
    Lease,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Global => "exact, global Redis",
            Placement::Regional => "exact, Redis per region",
            Placement::Lease => "lease, global Redis",
        }
    }
}

/// One placement at one distance.
#[derive(Debug, Clone, Copy)]
pub struct RegionRun {
    /// Mean and p99 decision latency (µs) under quota.
    pub mean_us: f64,
    pub p99_us: f64,
    /// Admitted by the adversary ÷ the quota.
    pub leakage: f64,
    pub admitted: u64,
}

/// `regions` regions at `one_way` from the primary (region 0 hosts it in the
/// placements with one Redis, so distances apply to the others... to keep it
/// simple and symmetric, every region reaches the primary through its own proxy).
/// Latency: `decisions` sequential decisions per region on an ample quota, regions
/// concurrently. Leakage: an adversary sends `adversary` requests to each region
/// (evenly, concurrently) against a quota of `quota_tokens` that does not refill
/// during the run.
#[allow(clippy::too_many_arguments)]
pub async fn region_run(
    primary: &RedisServer,
    locals: &[RedisServer],
    placement: Placement,
    one_way: Duration,
    decisions: usize,
    adversary: usize,
    quota_tokens: u64,
    config: LeaseConfig,
    tag: &str,
) -> RegionRun {
    let regions = locals.len();
    let mut proxies = vec![];
    let mut limiters = vec![];
    for (r, local) in locals.iter().enumerate() {
        let url = match placement {
            Placement::Regional => local.url(),
            Placement::Global | Placement::Lease => {
                let p = LatencyProxy::start(primary.port(), one_way).await;
                let url = p.url();
                proxies.push(p);
                url
            }
        };
        let store = RespStore::connect(&url, Duration::from_secs(5))
            .await
            .expect("connect");
        let mode = if placement == Placement::Lease {
            LeaseMode::Leased
        } else {
            LeaseMode::Exact
        };
        limiters.push(Arc::new(Leaser::new(
            store,
            SystemClock,
            config,
            mode,
            &format!("{tag}-r{r}"),
        )));
    }
    // latency under quota: 1,000,000/h
    let ample = Quota::new(1_000_000, 1_000_000, 3_600_000_000).unwrap();
    let mut handles = vec![];
    for (r, l) in limiters.iter().enumerate() {
        let (l, key) = (l.clone(), format!("fg:{{k:{tag}-lat}}:p{r}"));
        let key = if placement == Placement::Regional {
            format!("fg:{{k:{tag}-lat}}:p")
        } else {
            key
        };
        handles.push(tokio::spawn(async move {
            let mut lat = vec![];
            for _ in 0..decisions {
                let t = Instant::now();
                let o = l.check_quota(&key, &ample, 1).await.expect("decide");
                assert!(o.admitted);
                lat.push(t.elapsed().as_micros() as f64);
            }
            lat
        }));
    }
    let mut lat = vec![];
    for h in handles {
        lat.extend(h.await.unwrap());
    }
    lat.sort_by(f64::total_cmp);
    let mean_us = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    let p99_us = lat[((lat.len() as f64 * 0.99) as usize).min(lat.len() - 1)];
    // leakage: one key, quota_tokens per hour, requests spread evenly over regions
    let quota = Quota::new(quota_tokens, quota_tokens, 3_600_000_000).unwrap();
    let key = format!("fg:{{k:{tag}-adv}}:p");
    let mut handles = vec![];
    for l in &limiters {
        let (l, key) = (l.clone(), key.clone());
        handles.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            for _ in 0..adversary {
                if l.check_quota(&key, &quota, 1)
                    .await
                    .expect("decide")
                    .admitted
                {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for h in handles {
        admitted += h.await.unwrap();
    }
    let _ = regions;
    RegionRun {
        mean_us,
        p99_us,
        leakage: admitted as f64 / quota_tokens as f64,
        admitted,
    }
}

/// A hot key: one instance offered `rate` requests/s on one key for `secs`.
#[derive(Debug, Clone, Copy)]
pub struct HotRun {
    pub requests: u64,
    pub admitted: u64,
    pub redis_calls_per_sec: f64,
    pub overshoot: i64,
    pub to_leased: u64,
    pub to_exact: u64,
    pub final_mode: Mode,
}

/// Phases of (rate, secs) on one key through one limiter in `mode`.
pub async fn hot_key_run(
    server: &RedisServer,
    key: &str,
    quota: &Quota,
    config: LeaseConfig,
    mode: LeaseMode,
    phases: &[(u64, f64)],
) -> Vec<HotRun> {
    let mut conn = server.connection();
    let store = RespStore::connect(&server.url(), Duration::from_secs(2))
        .await
        .expect("connect");
    let limiter = Arc::new(Leaser::new(store, SystemClock, config, mode, "hot"));
    let mut out = vec![];
    let mut all_admitted = vec![];
    for &(rate, secs) in phases {
        let before = script_calls(&mut conn);
        let c0 = limiter.counters();
        let started = Instant::now();
        let (times, _errors) = drive(std::slice::from_ref(&limiter), key, quota, rate, secs).await;
        let took = started.elapsed().as_secs_f64();
        let redis = script_calls(&mut conn) - before;
        let c1 = limiter.counters();
        all_admitted.extend(times.iter().copied());
        out.push(HotRun {
            requests: (rate as f64 * secs).round() as u64,
            admitted: times.len() as u64,
            redis_calls_per_sec: redis as f64 / took,
            overshoot: worst_excess(&times, quota.capacity(), quota.emission_interval()),
            to_leased: c1.to_leased - c0.to_leased,
            to_exact: c1.to_exact - c0.to_exact,
            final_mode: limiter.mode_of(key),
        });
    }
    // the overshoot over the whole run, across phases
    let whole = worst_excess(&all_admitted, quota.capacity(), quota.emission_interval());
    for r in &mut out {
        r.overshoot = r.overshoot.max(whole);
    }
    out
}
