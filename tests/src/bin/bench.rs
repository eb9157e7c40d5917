//! Floodgate's benchmark (not part of the test run): `scripts/bench`.
//!
//! Prints, in one run and side by side on the same redis-server:
//! - `decide` ns/op (the pure transition);
//! - decisions/s and latency of our RESP client at 1 and 50 concurrent callers vs
//!   `redis-benchmark` running EVALSHA of the same script at the same concurrency;
//! - Redis server µs per call (`INFO commandstats`) for our script and for the
//!   design document's reference script (alone, + PEXPIRE, + TIME + PEXPIRE);
//! - bytes per bucket after creating 1,000,000 buckets (`INFO memory` delta), ours
//!   and the reference hash layout.
//!
//! Load goes to a redis-server this program starts on a loopback port, bounded in
//! count. With `taskset` available, the server runs on CPU 0 and the clients on CPU 1.

use std::hint::black_box;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{Store, StoreError};
use floodgate_shared::Micros;
use floodgate_shared::bucket::{BucketState, decide};
use floodgate_shared::keys::{Subject, bucket_key};
use floodgate_shared::policy::{Policy, Quota};
use floodgate_shared::script::Verdict;
use floodgate_shared::script::{Check, TOKEN_BUCKET};
use floodgate_tests::RedisServer;
use rand::{Rng, SeedableRng};

#[path = "bench/clients.rs"]
mod clients;
#[path = "bench/cost.rs"]
mod cost;
#[path = "bench/fanout.rs"]
mod fanout;
#[path = "bench/instructions.rs"]
mod instructions;
#[path = "bench/scale.rs"]
mod scale;

const REFERENCE: &str = r#"
local capacity = tonumber(ARGV[1])
local refill_rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens')) or capacity
local last_refill = tonumber(redis.call('HGET', KEYS[1], 'last_refill')) or now
local elapsed = now - last_refill
local available = math.min(capacity, tokens + elapsed * refill_rate)
if available < 1 then
  redis.call('HMSET', KEYS[1], 'tokens', available, 'last_refill', now)
  return 0
end
redis.call('HMSET', KEYS[1], 'tokens', available - 1, 'last_refill', now)
return 1
"#;

fn reference_with(pexpire: bool, time: bool) -> String {
    let mut s = REFERENCE.to_string();
    if time {
        s = s.replace(
            "local now = tonumber(ARGV[3])",
            "local t = redis.call('TIME')\nlocal now = t[1] + t[2] / 1000000",
        );
    }
    if pexpire {
        s = s.replace(
            "  return 0\nend",
            "  redis.call('PEXPIRE', KEYS[1], 60000)\n  return 0\nend",
        );
        s = s.replace(
            "return 1\n",
            "redis.call('PEXPIRE', KEYS[1], 60000)\nreturn 1\n",
        );
    }
    s
}

/// Floodgate's benchmark (`scripts/bench`): with no section named, the full run
/// (decisions, Redis server CPU per call, REST, the edge, memory per bucket).
#[derive(Parser)]
#[command(name = "floodgate-bench", args_override_self = true)]
struct Args {
    /// 1/10 of the counts.
    #[arg(long)]
    quick: bool,
    /// A competing process for the deadline section: spins for this many seconds
    /// (at most 600) and exits.
    #[arg(long, value_name = "SECS")]
    busy_secs: Option<f64>,
    /// Run just that section: the first named of `rest`, `edge`, `deadline`,
    /// `decisions`, `clients`; or the scale-out sections (`bench/scale.rs`), run
    /// only when named, any of them together (they take precedence).
    #[arg(value_enum, value_name = "SECTION")]
    sections: Vec<Section>,
    /// `cost`: the lease lifetimes of its bounded rows, comma-separated (default:
    /// 2,000 and the edge's default).
    #[arg(long, value_delimiter = ',', value_name = "MS")]
    lifetimes_ms: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Section {
    /// Floodgate's REST client vs @upstash/ratelimit, through floodgate-rest.
    Rest,
    /// The native edge and the Worker: limiter on vs off, nginx, added latency.
    Edge,
    /// Only our client vs redis-benchmark (1 and 50 callers).
    Decisions,
    /// Stray 503s with the CPUs loaded, adaptive vs fixed deadline.
    Deadline,
    /// The native edge's own instructions per request (callgrind), limiter on vs
    /// off: a meter that does not move with the machine's speed.
    Instructions,
    /// Candidate Redis clients side by side (`bench/clients.rs`).
    Clients,
    /// Redis Cluster: decisions/s vs number of masters.
    Cluster,
    /// Instance leases vs exact: N instances of one region on one bucket.
    Lease,
    /// Multi-region: 3 regions, one global Redis behind an added-latency proxy.
    Region,
    /// A hot `auto` key on one instance.
    Hotkey,
    /// Billed commands per request, every store together: issue 22's deployment
    /// (2 regions × 2 instances, a far global Redis), both hosts, exact and
    /// bounded, @upstash/ratelimit beside them.
    Cost,
    /// Issue 38's fan-out: 4-48 native instances and a Worker fleet, 400 keys
    /// Zipf(1.1) and the long tail, a far global Redis; the internet-scale
    /// model on the pure twins beside it.
    Fanout,
}

impl Section {
    /// The scale-out sections (`bench/scale.rs`).
    fn is_scale(self) -> bool {
        matches!(
            self,
            Section::Cluster | Section::Lease | Section::Region | Section::Hotkey | Section::Cost
        )
    }
}

/// The sections that run alone, in the order they are looked for.
const SINGLE: [Section; 6] = [
    Section::Rest,
    Section::Edge,
    Section::Deadline,
    Section::Instructions,
    Section::Decisions,
    Section::Clients,
];

fn main() {
    let args = Args::parse();
    if let Some(secs) = args.busy_secs {
        busy_loop(secs);
        return;
    }
    let scale: usize = if args.quick { 10 } else { 1 };
    let pinned = Command::new("taskset").arg("-V").output().is_ok();
    print_header(args.quick, pinned);

    let scale_sections: Vec<Section> = args
        .sections
        .iter()
        .copied()
        .filter(|s| s.is_scale())
        .collect();
    if args.sections.contains(&Section::Fanout) {
        fanout::fanout(pinned.then_some(0), scale, &runtime());
        return;
    }
    if !scale_sections.is_empty() {
        let rt = runtime();
        scale::run(&scale_sections, pinned, scale, &args.lifetimes_ms, &rt);
        return;
    }

    bench_decide(10_000_000 / scale as u64);

    let server = RedisServer::start_pinned(pinned.then_some(0), &[]);
    let mut conn = server.connection();
    let sha = load_token_bucket(&mut conn);
    let rt = runtime();
    match SINGLE.into_iter().find(|s| args.sections.contains(s)) {
        Some(only) => run_single(only, &server, &mut conn, &rt, scale, &sha),
        None => run_all(&server, &mut conn, &rt, scale, &sha),
    }
}

/// Spins until `secs` (at most 600) have passed.
fn busy_loop(secs: f64) {
    let stop = Instant::now() + Duration::from_secs_f64(secs.min(600.0));
    let mut x = 0u64;
    while Instant::now() < stop {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

fn print_header(quick: bool, pinned: bool) {
    println!(
        "# Floodgate benchmark{}",
        if quick {
            " (--quick: 1/10 of the counts)"
        } else {
            ""
        }
    );
    println!(
        "machine: {} CPUs; redis-server {}; server on CPU 0 and clients on CPU 1: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        redis_version(),
        if pinned {
            "yes"
        } else {
            "no (taskset missing)"
        }
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Loads the token-bucket script; its SHA1 is the one the edge calls.
fn load_token_bucket(conn: &mut redis::Connection) -> String {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(TOKEN_BUCKET.source)
        .query(conn)
        .unwrap();
    assert_eq!(sha, TOKEN_BUCKET.sha1);
    sha
}

fn run_single(
    only: Section,
    server: &RedisServer,
    conn: &mut redis::Connection,
    rt: &tokio::runtime::Runtime,
    scale: usize,
    sha: &str,
) {
    match only {
        Section::Rest => bench_rest(server, rt, scale),
        Section::Edge => bench_edge(server, rt, scale),
        Section::Deadline => bench_deadline(server, rt, scale),
        Section::Instructions => instructions::run(server, rt, scale),
        Section::Decisions => bench_decisions(server, conn, rt, scale, sha),
        Section::Clients => clients::run(server, conn, rt, scale, sha),
        Section::Cluster
        | Section::Lease
        | Section::Region
        | Section::Hotkey
        | Section::Cost
        | Section::Fanout => {
            unreachable!("the scale-out sections run on their own")
        }
    }
}

/// The full run: every section but `deadline`, `clients`, `instructions` and the
/// scale-out ones.
fn run_all(
    server: &RedisServer,
    conn: &mut redis::Connection,
    rt: &tokio::runtime::Runtime,
    scale: usize,
    sha: &str,
) {
    bench_decisions(server, conn, rt, scale, sha);
    bench_server_cpu(server, conn, scale);
    bench_rest(server, rt, scale);
    bench_edge(server, rt, scale);
    bench_memory(server, conn, rt, scale);
}

/// A script `redis-benchmark` calls with EVALSHA, and its arguments.
struct BenchScript {
    name: &'static str,
    source: String,
    argv: Vec<&'static str>,
}

/// Ours and the design document's reference script (alone, + PEXPIRE, + TIME +
/// PEXPIRE).
fn server_cpu_scripts() -> [BenchScript; 4] {
    [
        BenchScript {
            name: "floodgate (TIME + GET + SET PX)",
            source: TOKEN_BUCKET.source.to_string(),
            argv: vec!["", "60000000", "60000"],
        },
        BenchScript {
            name: "reference (no TTL, client clock)",
            source: reference_with(false, false),
            argv: vec!["1000", "16.67", "1764472066"],
        },
        BenchScript {
            name: "reference + PEXPIRE",
            source: reference_with(true, false),
            argv: vec!["1000", "16.67", "1764472066"],
        },
        BenchScript {
            name: "reference + TIME + PEXPIRE",
            source: reference_with(true, true),
            argv: vec!["1000", "16.67"],
        },
    ]
}

/// Redis server µs per call (`INFO commandstats`) of each script, driven by
/// `redis-benchmark` on three key spaces.
fn bench_server_cpu(server: &RedisServer, conn: &mut redis::Connection, scale: usize) {
    println!(
        "\n## Redis server CPU per call, side by side (redis-benchmark, 50 clients, pipeline 16)"
    );
    println!("| script | keys | calls/s | server µs/call |");
    println!("|---|---|---|---|");
    let n = 400_000 / scale;
    let scripts = server_cpu_scripts();
    for (keys, range) in [
        ("random of 1M (mostly new)", 1_000_000),
        ("random of 10k (existing)", 10_000),
        ("one hot key (mostly denied)", 1),
    ] {
        for script in &scripts {
            let _: () = redis::cmd("FLUSHALL").query(conn).unwrap();
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&script.source)
                .query(conn)
                .unwrap();
            reset_stats(conn);
            let r = redis_benchmark_with(server.port(), 50, 16, n, range, &sha, &script.argv);
            println!(
                "| {} | {keys} | {:.0} | {:.2} |",
                script.name,
                r.rate,
                usec_per_call(conn, "evalsha")
            );
        }
    }
}

/// Bytes per bucket after creating 1,000,000 buckets, ours and the reference layout.
fn bench_memory(
    server: &RedisServer,
    conn: &mut redis::Connection,
    rt: &tokio::runtime::Runtime,
    scale: usize,
) {
    println!("\n## Memory per bucket at 1,000,000 buckets (cleanup TTL included)");
    let buckets = 1_000_000 / scale;
    let (ours, key_len) = rt.block_on(memory_ours(server, buckets));
    let reference = memory_reference(conn, buckets);
    println!("| layout | key | bytes/bucket |");
    println!("|---|---|---|");
    println!(
        "| floodgate: one integer (full_at), SET PX | {key_len} B, `fg:{{k:<id>}}:default` | **{ours:.1}** |"
    );
    println!("| reference: hash tokens/last_refill + PEXPIRE | same keys | {reference:.1} |");
    println!(
        "\nbucket state shown in the reference layout, e.g.: {:?}",
        example_view()
    );
}

/// Decisions/s of our client vs `redis-benchmark` (same script, same server), at 1
/// and 50 callers: the decision path's figure of merit (`scripts/bench decisions`).
fn bench_decisions(
    server: &RedisServer,
    conn: &mut redis::Connection,
    rt: &tokio::runtime::Runtime,
    scale: usize,
    sha: &str,
) {
    println!("\n## Decisions/s: our RESP client vs redis-benchmark, same script, same server");
    println!(
        "(random bucket keys from a 1,000,000-key space; redis-benchmark at pipeline 1; median of 3 alternating rounds)"
    );
    println!(
        "| callers | client | decisions/s | p50 µs | p99 µs | server µs/call | ours ÷ redis-benchmark |"
    );
    println!("|---|---|---|---|---|---|---|");
    for callers in [1usize, 50] {
        // Three alternating rounds each; the median round of each client is reported,
        // so drift of the machine or the server's growing key space favours neither.
        let n = if callers == 1 { 20_000 } else { 100_000 } / scale;
        let (mut ours, mut rb) = (vec![], vec![]);
        for _ in 0..3 {
            reset_stats(conn);
            let r = rt.block_on(our_client(&server.url(), callers, n));
            ours.push((r, usec_per_call(conn, "evalsha")));
            reset_stats(conn);
            let r = redis_benchmark(server.port(), callers, 1, n, sha);
            rb.push((r, usec_per_call(conn, "evalsha")));
        }
        let median = |v: &mut Vec<(Rate, f64)>| {
            v.sort_by(|a, b| a.0.rate.total_cmp(&b.0.rate));
            v.swap_remove(1)
        };
        let ((ours, ours_us), (rb, rb_us)) = (median(&mut ours), median(&mut rb));
        println!(
            "| {callers} | floodgate | {:.0} | {:.1} | {:.1} | {ours_us:.2} | **{:.2}** |",
            ours.rate,
            ours.p50_us,
            ours.p99_us,
            ours.rate / rb.rate
        );
        println!(
            "| {callers} | redis-benchmark | {:.0} | {:.1} | {:.1} | {rb_us:.2} | |",
            rb.rate, rb.p50_us, rb.p99_us
        );
    }
}

fn redis_version() -> String {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_string))
        })
        .unwrap_or_else(|| "?".into())
}

fn example_view() -> floodgate_shared::bucket::BucketView {
    let q = Quota::per_minute(1000).unwrap();
    BucketState {
        full_at: 1_764_000_030_000_000,
    }
    .view(&q, 1_764_000_000_000_000)
}

fn bench_decide(iterations: u64) {
    let q = Quota::per_minute(1000).unwrap();
    let mut state = None;
    let mut now = 1_764_000_000_000_000i64;
    let start = Instant::now();
    let mut allowed = 0u64;
    for _ in 0..iterations {
        now += 37;
        let t = decide(black_box(state), black_box(&q), black_box(now), 1);
        allowed += u64::from(t.decision.allowed());
        if let Some(s) = t.write {
            state = Some(s);
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / iterations as f64;
    println!("\n## decide: {ns:.1} ns/op ({iterations} decisions, {allowed} allowed)");
}

struct Rate {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
}

async fn our_client(url: &str, callers: usize, total: usize) -> Rate {
    let store = RespStore::connect(url, Duration::from_secs(5))
        .await
        .unwrap();
    drive(store, callers, total).await
}

/// What the benchmark drives: a store, or a bare client (`bench/clients.rs`).
#[allow(async_fn_in_trait)]
pub trait Decide {
    async fn decide(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Verdict, StoreError>;
}

impl<S: Store> Decide for S {
    async fn decide(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        self.check(checks, now).await
    }
}

/// `callers` concurrent tasks make `total` decisions through `store` on random
/// bucket keys (1,000/min quota, as every side of the benchmark uses).
async fn drive<S: Decide + Clone + 'static>(store: S, callers: usize, total: usize) -> Rate {
    let local = tokio::task::LocalSet::new();
    local.run_until(drive_local(store, callers, total)).await
}

async fn drive_local<S: Decide + Clone + 'static>(store: S, callers: usize, total: usize) -> Rate {
    let quota = Quota::per_minute(1000).unwrap();
    // warm-up, untimed (connections, script cache), as the Node side does
    let warm: Vec<_> = (0..callers.min(50))
        .map(|c| {
            let store = store.clone();
            tokio::task::spawn_local(async move {
                for i in 0..10 {
                    let key = format!("fg:{{k:warm-{c}-{i}}}:default");
                    store
                        .decide(
                            &[Check {
                                key: &key,
                                quota: &quota,
                                cost: 1,
                                shadow: false,
                            }],
                            None,
                        )
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in warm {
        w.await.unwrap();
    }
    let per = total / callers;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(callers);
    for _ in 0..callers {
        let store = store.clone();
        tasks.push(tokio::task::spawn_local(async move {
            let mut rng = rand::rngs::StdRng::from_os_rng();
            let mut lat = Vec::with_capacity(per);
            for _ in 0..per {
                let key = format!("fg:{{k:{}}}:default", rng.random_range(0..1_000_000u32));
                let t = Instant::now();
                let v = store
                    .decide(
                        &[Check {
                            key: &key,
                            quota: &quota,
                            cost: 1,
                            shadow: false,
                        }],
                        None,
                    )
                    .await
                    .unwrap();
                lat.push(t.elapsed().as_nanos() as u32);
                black_box(v);
            }
            lat
        }));
    }
    let mut lat = Vec::with_capacity(total);
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1000.0;
    Rate {
        rate: lat.len() as f64 / elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

fn redis_benchmark(port: u16, clients: usize, pipeline: usize, n: usize, sha: &str) -> Rate {
    redis_benchmark_with(
        port,
        clients,
        pipeline,
        n,
        1_000_000,
        sha,
        &["", "60000000", "60000"],
    )
}

fn redis_benchmark_with(
    port: u16,
    clients: usize,
    pipeline: usize,
    n: usize,
    range: usize,
    sha: &str,
    argv: &[&str],
) -> Rate {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--csv"])
        .args([
            "-c",
            &clients.to_string(),
            "-P",
            &pipeline.to_string(),
            "-n",
            &n.to_string(),
        ])
        .args([
            "-r",
            &range.to_string(),
            "EVALSHA",
            sha,
            "1",
            "fg:{k:__rand_int__}:default",
        ])
        .args(argv)
        .output()
        .expect("redis-benchmark (package redis-tools) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = text.lines().last().unwrap_or_default();
    let cols: Vec<f64> = row
        .split(',')
        .skip(1)
        .map(|c| c.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    assert!(
        cols.len() >= 6 && cols[0] > 0.0,
        "unexpected redis-benchmark output: {text}"
    );
    Rate {
        rate: cols[0],
        p50_us: cols[3] * 1000.0,
        p99_us: cols[5] * 1000.0,
    }
}

fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(conn).unwrap();
}

fn usec_per_call(conn: &mut redis::Connection, command: &str) -> f64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

fn used_memory(conn: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn random_id(rng: &mut impl Rng) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..10)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Creates `count` buckets through the real client path, keyed as the edge keys
/// them (`fg:{k:<10-character key id>}:default`), with a quota whose buckets stay
/// in debt (so none expires during the measurement).
async fn memory_ours(server: &RedisServer, count: usize) -> (f64, usize) {
    let mut conn = server.connection();
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let before = used_memory(&mut conn);
    let policy = Policy::from_json(
        r#"{"name":"default","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1d"},"failure_mode":"fail_closed"}"#,
    )
    .unwrap();
    let mut rng = rand::rng();
    let ids: Vec<String> = (0..count).map(|_| random_id(&mut rng)).collect();
    let key_len = bucket_key(
        &policy,
        &Subject {
            api_key_id: Some(&ids[0]),
            ..Subject::default()
        },
    )
    .unwrap()
    .len();
    let store = Arc::new(
        RespStore::connect(&server.url(), Duration::from_secs(10))
            .await
            .unwrap(),
    );
    let ids = Arc::new(ids);
    let policy = Arc::new(policy);
    let workers = 64;
    let mut tasks = vec![];
    for w in 0..workers {
        let (store, ids, policy) = (store.clone(), ids.clone(), policy.clone());
        tasks.push(tokio::spawn(async move {
            for i in (w..ids.len()).step_by(workers) {
                let key = bucket_key(
                    &policy,
                    &Subject {
                        api_key_id: Some(&ids[i]),
                        ..Subject::default()
                    },
                )
                .unwrap();
                let v = store
                    .check(
                        &[Check {
                            key: &key,
                            quota: policy.quota(),
                            cost: 1,
                            shadow: false,
                        }],
                        None,
                    )
                    .await
                    .unwrap();
                assert!(v.admitted);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let keys: usize = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(keys, count, "every bucket is one key");
    (
        (used_memory(&mut conn) - before) as f64 / count as f64,
        key_len,
    )
}

/// The reference layout (hash with `tokens`, `last_refill`, plus PEXPIRE), same key
/// shape and count, written server-side in batches.
fn memory_reference(conn: &mut redis::Connection, count: usize) -> f64 {
    let _: () = redis::cmd("FLUSHALL").query(conn).unwrap();
    let before = used_memory(conn);
    let script = r#"
        for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
          local k = 'fg:{k:' .. string.format('%010d', i) .. '}:default'
          redis.call('HSET', k, 'tokens', '999', 'last_refill', '1764472066.123')
          redis.call('PEXPIRE', k, 3600000)
        end
        return 1"#;
    let batch = 50_000;
    for start in (0..count).step_by(batch) {
        let end = (start + batch).min(count) - 1;
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(start)
            .arg(end)
            .query(conn)
            .unwrap();
    }
    (used_memory(conn) - before) as f64 / count as f64
}

/// Floodgate's REST client vs @upstash/ratelimit's tokenBucket (Node), both through
/// one floodgate-rest endpoint in front of the same Redis, at the same concurrency;
/// and our client over REST vs over RESP.
fn bench_rest(server: &RedisServer, rt: &tokio::runtime::Runtime, scale: usize) {
    let token = "bench-token";
    let exe = std::env::current_exe().unwrap();
    let endpoint_bin = exe.with_file_name("floodgate-rest");
    let node_dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("node");
    if !endpoint_bin.exists() || !node_dir.join("node_modules/@upstash/ratelimit").exists() {
        println!(
            "\n## REST: skipped (build floodgate-rest and run npm ci in tests/node; scripts/bench does both)"
        );
        return;
    }
    let (_endpoint, url) = start_rest_endpoint(&endpoint_bin, server, token);

    println!("\n## REST: Floodgate's REST client vs @upstash/ratelimit tokenBucket");
    println!(
        "(one floodgate-rest endpoint and Redis on CPU 0, clients on CPU 1; median of 3 alternating rounds)"
    );
    println!("| callers | client | decisions/s | p50 µs | p99 µs | Floodgate ÷ ratelimit |");
    println!("|---|---|---|---|---|---|");
    let resp_url = server.url();
    let clients = RestClients {
        url: &url,
        token,
        node_dir: &node_dir,
        resp_url: &resp_url,
    };
    for callers in [1usize, 50] {
        let n = if callers == 1 { 4_000 } else { 30_000 } / scale;
        print_rest_rows(callers, &clients.medians(rt, callers, n));
    }
}

/// Starts floodgate-rest (on CPU 0 with taskset) in front of `server` and waits
/// for its port: the child, killed when dropped, and its URL.
fn start_rest_endpoint(bin: &std::path::Path, server: &RedisServer, token: &str) -> (Proc, String) {
    let port = floodgate_tests::free_port();
    let mut cmd = on_cpu0(bin);
    let endpoint = Proc(
        cmd.args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--redis",
            &server.url(),
            "--pool",
            "4",
        ])
        .env("FLOODGATE_REST_TOKEN", token)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("floodgate-rest starts"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "floodgate-rest did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (endpoint, url)
}

/// The three clients of the REST section and where they go.
struct RestClients<'a> {
    /// floodgate-rest's URL and token.
    url: &'a str,
    token: &'a str,
    /// tests/node, where @upstash/ratelimit is installed.
    node_dir: &'a std::path::Path,
    /// The Redis behind floodgate-rest, for our client over RESP.
    resp_url: &'a str,
}

/// The median round of each client of the REST section.
struct RestRates {
    /// Floodgate's REST client.
    ours: Rate,
    /// @upstash/ratelimit.
    theirs: Rate,
    /// Floodgate's RESP client straight to Redis.
    resp: Rate,
}

impl RestClients<'_> {
    /// Three alternating rounds of `n` decisions by `callers` callers each.
    fn medians(&self, rt: &tokio::runtime::Runtime, callers: usize, n: usize) -> RestRates {
        let (mut ours, mut theirs, mut resp) = (vec![], vec![], vec![]);
        for _ in 0..3 {
            let store = floodgate_edge::store::rest::RestStore::new(
                self.url,
                self.token,
                Duration::from_secs(5),
            )
            .unwrap();
            ours.push(rt.block_on(drive(store, callers, n)));
            theirs.push(ratelimit_node(
                self.node_dir,
                self.url,
                self.token,
                callers,
                n,
            ));
            resp.push(rt.block_on(our_client(self.resp_url, callers, n)));
        }
        let median = |v: &mut Vec<Rate>| {
            v.sort_by(|a, b| a.rate.total_cmp(&b.rate));
            v.swap_remove(1)
        };
        RestRates {
            ours: median(&mut ours),
            theirs: median(&mut theirs),
            resp: median(&mut resp),
        }
    }
}

fn print_rest_rows(callers: usize, r: &RestRates) {
    let RestRates { ours, theirs, resp } = r;
    println!(
        "| {callers} | floodgate REST | {:.0} | {:.0} | {:.0} | **{:.2}× decisions/s, {:.2}× p99** |",
        ours.rate,
        ours.p50_us,
        ours.p99_us,
        ours.rate / theirs.rate,
        ours.p99_us / theirs.p99_us
    );
    println!(
        "| {callers} | @upstash/ratelimit | {:.0} | {:.0} | {:.0} | |",
        theirs.rate, theirs.p50_us, theirs.p99_us
    );
    println!(
        "| {callers} | floodgate RESP (direct) | {:.0} | {:.0} | {:.0} | REST ÷ RESP: {:.2}× |",
        resp.rate,
        resp.p50_us,
        resp.p99_us,
        ours.rate / resp.rate
    );
}

fn ratelimit_node(dir: &std::path::Path, url: &str, token: &str, callers: usize, n: usize) -> Rate {
    let out = Command::new("node")
        .arg("ratelimit-bench.mjs")
        .current_dir(dir)
        .env("FLOODGATE_REST_URL", url)
        .env("FLOODGATE_REST_TOKEN", token)
        .env("BENCH_CALLERS", callers.to_string())
        .env("BENCH_REQUESTS", n.to_string())
        .output()
        .expect("node runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> f64 {
        let at = text
            .find(&format!("\"{name}\":"))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        text[at + name.len() + 3..]
            .split([',', '}'])
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    Rate {
        rate: field("rate"),
        p50_us: field("p50_us"),
        p99_us: field("p99_us"),
    }
}

/// Answers of a closed loop, counted.
#[derive(Clone, Copy, Default)]
struct Statuses {
    /// 2xx.
    ok: usize,
    /// 503.
    refused: usize,
    /// Anything else, transport errors included.
    other: usize,
}

impl std::ops::AddAssign for Statuses {
    fn add_assign(&mut self, o: Self) {
        self.ok += o.ok;
        self.refused += o.refused;
        self.other += o.other;
    }
}

/// Closed loop: `workers` clients send `n` requests in all (within `limit`); the
/// answers counted.
async fn statuses(url: &str, secret: &str, workers: usize, n: usize, limit: Duration) -> Statuses {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(workers)
        .build()
        .unwrap();
    let stop = Instant::now() + limit;
    let sent = Arc::new(AtomicUsize::new(0));
    let counts = Arc::new([
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ]);
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let mut tasks = vec![];
            for w in 0..workers {
                let (client, sent, counts) = (client.clone(), sent.clone(), counts.clone());
                let (url, secret) = (url.to_string(), secret.to_string());
                tasks.push(tokio::task::spawn_local(async move {
                    while Instant::now() < stop && sent.fetch_add(1, Relaxed) < n {
                        let r = client
                            .get(format!("{url}/v1/items/{w}"))
                            .bearer_auth(&secret)
                            .send()
                            .await;
                        counts[status_index(r).await].fetch_add(1, Relaxed);
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await;
    let c = |i: usize| counts[i].load(Relaxed);
    Statuses {
        ok: c(0),
        refused: c(1),
        other: c(2),
    }
}

/// 0 for a 2xx (its body read), 1 for a 503 (its body shown with `BENCH_SHOW_503`),
/// 2 for anything else.
async fn status_index(r: reqwest::Result<reqwest::Response>) -> usize {
    match r {
        Ok(r) if r.status().is_success() => {
            let _ = r.bytes().await;
            0
        }
        Ok(r) if r.status() == 503 => {
            if std::env::var_os("BENCH_SHOW_503").is_some() {
                eprintln!("503: {}", r.text().await.unwrap_or_default());
            }
            1
        }
        _ => 2,
    }
}

/// A sibling process and the URL it serves.
struct Host {
    _proc: Proc,
    url: String,
}

/// floodgate-edge's arguments: where it listens, its upstream, its store.
fn edge_args<'a>(listen: &'a str, upstream: &'a str, redis: &'a str) -> [&'a str; 6] {
    ["--listen", listen, "--upstream", upstream, "--redis", redis]
}

/// Starts floodgate-edge on a free port (on CPU 0) in front of `upstream`, deciding
/// with `redis`, with `extra` arguments.
fn edge_host(upstream: &str, redis: &str, extra: &[&str]) -> Host {
    edge_host_of("floodgate-edge", upstream, redis, extra)
}

/// [`edge_host`] of the edge binary `name` beside this one.
fn edge_host_of(name: &str, upstream: &str, redis: &str, extra: &[&str]) -> Host {
    let port = floodgate_tests::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = edge_args(&listen, upstream, redis).to_vec();
    args.extend_from_slice(extra);
    Host {
        _proc: sibling(name, &args, &[], port),
        url: format!("http://127.0.0.1:{port}"),
    }
}

/// Starts floodgate-demo-upstream on a free port (on CPU 0).
fn demo_upstream() -> (Host, u16) {
    let up = floodgate_tests::free_port();
    let proc = sibling(
        "floodgate-demo-upstream",
        &["--listen", &format!("127.0.0.1:{up}")],
        &[],
        up,
    );
    let url = format!("http://127.0.0.1:{up}");
    (Host { _proc: proc, url }, up)
}

/// One busy process per CPU of the machine (this process may be pinned to one),
/// each spinning for `secs`, bounded in time by itself.
fn busy_loops(secs: f64) -> Vec<Proc> {
    let me = std::env::current_exe().unwrap();
    let cpus = Command::new("nproc")
        .arg("--all")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(2usize);
    (0..cpus)
        .map(|cpu| {
            let mut c = Command::new("taskset");
            c.args(["-c", &cpu.to_string()]).arg(&me);
            if Command::new("taskset").arg("-V").output().is_err() {
                c = Command::new(&me);
            }
            let child = c
                .args(["--busy-secs", &secs.to_string()])
                .spawn()
                .expect("start a busy loop");
            Proc(child)
        })
        .collect()
}

/// Stray 503s at saturation while both CPUs are also loaded by a competing busy
/// process (a build, a noisy neighbour) and Redis is healthy: the native edge with
/// its adaptive deadline vs a fixed 3 ms one, alternating runs of 2,000 requests
/// (issue 41: 2 of 2,000 got 503 under the default deadline; the target is 0 in
/// 10 runs). `FLOODGATE_BENCH_EDGE_BEFORE=NAME`: a third edge, the binary NAME
/// beside this one (an earlier build of floodgate-edge), side by side.
fn bench_deadline(server: &RedisServer, rt: &tokio::runtime::Runtime, scale: usize) {
    let secret = rt
        .block_on(floodgate_tests::seed(server, BENCH_CONFIG))
        .secret;
    let (upstream, _) = demo_upstream();
    let redis = server.url();
    let mut edges = vec![
        (
            "adaptive (default: 3-100 ms)".to_string(),
            edge_host(&upstream.url, &redis, &[]),
        ),
        (
            "fixed 3 ms (`--deadline-ms 3`)".to_string(),
            edge_host(&upstream.url, &redis, &["--deadline-ms", "3"]),
        ),
    ];
    if let Ok(before) = std::env::var("FLOODGATE_BENCH_EDGE_BEFORE") {
        let host = edge_host_of(&before, &upstream.url, &redis, &[]);
        edges.push((format!("adaptive, before (`{before}`)"), host));
    }
    let n = 2_000 / scale;
    let runs = 10;
    let limit = Duration::from_secs(60);
    // at saturation the deadline follows the queue up; with 2 clients it stays at
    // the floor, where a scheduler's stall of Redis or of the edge is longest
    // beside it
    let shapes = [32, 2];
    let busy = busy_loops((runs * edges.len() * shapes.len()) as f64 * limit.as_secs_f64());
    for connections in shapes {
        println!(
            "\n## Stray 503s with the CPUs loaded (native edge, Redis healthy, {} busy loops, {connections} connections, {runs} runs of {n} requests, alternating)",
            busy.len()
        );
        let mut per_run = vec![vec![]; edges.len()];
        for _ in 0..runs {
            for (i, (_, edge)) in edges.iter().enumerate() {
                per_run[i].push(rt.block_on(statuses(&edge.url, &secret, connections, n, limit)));
            }
        }
        println!(
            "| deadline | requests | 503 | 503 per run | **runs with a 503** | other failures |"
        );
        println!("|---|---|---|---|---|---|");
        for ((name, _), runs) in edges.iter().zip(&per_run) {
            let mut t = Statuses::default();
            for r in runs {
                t += *r;
            }
            let each: Vec<String> = runs.iter().map(|r| r.refused.to_string()).collect();
            println!(
                "| {name} | {} | {} | {} | **{} of {}** | {} |",
                t.ok + t.refused + t.other,
                t.refused,
                each.join(" "),
                runs.iter().filter(|r| r.refused > 0).count(),
                runs.len(),
                t.other
            );
        }
    }
    drop(busy);
    for (name, edge) in &edges {
        let h = health(rt, &edge.url);
        println!(
            "({name} afterwards: breaker opened {} times; {})",
            h["breaker_opened"], h["deadlines"]["global"]
        );
    }
}

/// An edge's health document.
fn health(rt: &tokio::runtime::Runtime, url: &str) -> serde_json::Value {
    rt.block_on(async {
        reqwest::get(format!("{url}{}", floodgate_edge::proxy::HEALTH_PATH))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    })
}

/// A child process killed when dropped.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // serve.mjs stops its workerd when its stdin closes; others are killed
        if self.0.stdin.take().is_some() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A command running `program` on CPU 0 when taskset is there (beside Redis; the
/// clients are on CPU 1), else anywhere.
fn on_cpu0(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if Command::new("taskset").arg("-V").output().is_ok() {
        let mut c = Command::new("taskset");
        c.args(["-c", "0"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Starts a sibling binary of this benchmark on CPU 0 (beside Redis) and waits for
/// its port.
fn sibling(name: &str, args: &[&str], env: &[(&str, &str)], port: u16) -> Proc {
    let bin = std::env::current_exe().unwrap().with_file_name(name);
    let mut cmd = on_cpu0(&bin);
    // each process's log, to read why a round failed: <tmp>/floodgate-bench/<name>-<port>.log
    let logs = std::env::temp_dir().join("floodgate-bench");
    let _ = std::fs::create_dir_all(&logs);
    let log = std::fs::File::create(logs.join(format!("{name}-{port}.log")))
        .map_or_else(|_| std::process::Stdio::null(), std::process::Stdio::from);
    let child = cmd
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/bench builds it)", bin.display()));
    wait_port(port);
    Proc(child)
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Closed loop: `workers` clients send requests back to back for `secs`.
async fn saturate(url: &str, secret: &str, workers: usize, secs: f64, max: usize) -> f64 {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(workers)
        .build()
        .unwrap();
    let stop = Instant::now() + Duration::from_secs_f64(secs);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let local = tokio::task::LocalSet::new();
    let start = Instant::now();
    local
        .run_until(async {
            let mut tasks = vec![];
            for w in 0..workers {
                let (client, done, url, secret) = (
                    client.clone(),
                    done.clone(),
                    url.to_string(),
                    secret.to_string(),
                );
                tasks.push(tokio::task::spawn_local(async move {
                    let mut i = 0;
                    while Instant::now() < stop
                        && done.load(std::sync::atomic::Ordering::Relaxed) < max
                    {
                        let r = client
                            .get(format!("{url}/v1/items/{w}/{i}"))
                            .bearer_auth(&secret)
                            .send()
                            .await;
                        if let Ok(r) = r {
                            let ok = r.status().is_success();
                            let _ = r.bytes().await;
                            if ok {
                                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                        i += 1;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await;
    done.load(std::sync::atomic::Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Open loop at a fixed rate for `secs`: latency from each request's scheduled
/// send time (no coordinated omission).
async fn fixed_rate(url: &str, secret: &str, rate: f64, secs: f64) -> Latency {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(4096)
        .build()
        .unwrap();
    let n = (rate * secs) as usize;
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let start = tokio::time::Instant::now();
            let mut tasks = Vec::with_capacity(n);
            for i in 0..n {
                let at = start + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(at).await;
                let (client, url, secret) = (client.clone(), url.to_string(), secret.to_string());
                tasks.push(tokio::task::spawn_local(async move {
                    let r = client
                        .get(format!("{url}/v1/items/{i}"))
                        .bearer_auth(&secret)
                        .send()
                        .await;
                    let ok = match r {
                        Ok(r) => {
                            let ok = r.status().is_success();
                            let _ = r.bytes().await;
                            ok
                        }
                        Err(_) => false,
                    };
                    (at.elapsed().as_nanos() as u64, ok)
                }));
            }
            let mut lat = Vec::with_capacity(n);
            let mut failed = 0;
            for t in tasks {
                let (ns, ok) = t.await.unwrap();
                lat.push(ns);
                failed += usize::from(!ok);
            }
            lat.sort_unstable();
            let pct =
                |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1000.0;
            Latency {
                p50_us: pct(0.5),
                p99_us: pct(0.99),
                failed,
            }
        })
        .await
}

/// Latency of an open loop (from each request's scheduled send time).
struct Latency {
    p50_us: f64,
    p99_us: f64,
    /// Requests that failed or were not 2xx.
    failed: usize,
}

const BENCH_CONFIG: &str = r#"{"policies":[{"name":"default","dimensions":["api_key"],
  "quota":{"capacity":10000000,"period":"1m"},"failure_mode":"fail_closed"}],"plans":{"free":["default"]}}"#;

/// The edge: native host with the limiter vs without (throughput at saturation,
/// added latency at a fixed 5k req/s); the Worker in workerd vs a pass-through
/// Worker (added latency); the Worker's bundle size.
fn bench_edge(server: &RedisServer, rt: &tokio::runtime::Runtime, scale: usize) {
    let hosts = EdgeHosts::start(server, rt);
    println!(
        "\n## The edge: native host, limiter on vs off (same upstream; median of 3 alternating rounds)"
    );
    println!("(edge and upstream on CPU 0, the load generator on CPU 1)");
    print_saturation(&edge_saturation(rt, &hosts, scale));
    edge_added_latency(rt, &hosts, scale);
    bench_worker(server, rt, &hosts.upstream.url, &hosts.secret, scale);
}

/// The hosts of the edge section, in front of one demo upstream; the fields drop
/// in this order (the last started first).
struct EdgeHosts {
    /// nginx (one process, on CPU 0 like the edge) limiting per Authorization
    /// header with limit_req in its own memory; `None` when not installed.
    nginx: Option<Nginx>,
    /// The limiter with its Redis on the other CPU, as a remote Redis would be.
    on_remote: Host,
    remote_secret: String,
    _remote: RedisServer,
    /// Limiter on and off, Redis on CPU 0 beside the edge.
    off: Host,
    on: Host,
    upstream: Host,
    secret: String,
}

impl EdgeHosts {
    fn start(server: &RedisServer, rt: &tokio::runtime::Runtime) -> Self {
        let secret = rt
            .block_on(floodgate_tests::seed(server, BENCH_CONFIG))
            .secret;
        let (upstream, up) = demo_upstream();
        let redis = server.url();
        // the default, adaptive deadline: at saturation the queue, not Redis, sets
        // the wait, and the deadline follows it (a fixed 3 ms one turned load into
        // fail-closed 503s: see the deadline section)
        let on = edge_host(&upstream.url, &redis, &[]);
        let off = edge_host(&upstream.url, &redis, &["--no-limit"]);
        // The same limiter with its Redis on the other CPU, as a remote Redis would
        // be: Redis's work then does not compete with the edge's.
        let remote = RedisServer::start_pinned(Some(1), &[]);
        // ... but CPU 1 is also the load generator's, which saturates it: a
        // remote Redis has a machine of its own, so it goes first there (nice
        // -10). Without it, wrk starved it for more than the 3 ms deadline floor
        // now and then, and the edge answered those requests by their failure
        // mode (fail-closed 503s) — the load generator's doing, not the store's.
        let _ = Command::new("renice")
            .args(["-n", "-10", "-p", &remote.pid().to_string()])
            .stdout(std::process::Stdio::null())
            .status();
        let remote_secret = rt
            .block_on(floodgate_tests::seed(&remote, BENCH_CONFIG))
            .secret;
        let on_remote = edge_host(&upstream.url, &remote.url(), &[]);
        // nginx (one process, on CPU 0 like the edge) limiting per Authorization
        // header with limit_req in its own memory, in front of the same upstream
        let nginx = Nginx::start(up);
        EdgeHosts {
            nginx,
            on_remote,
            remote_secret,
            _remote: remote,
            off,
            on,
            upstream,
            secret,
        }
    }
}

/// Requests/s at saturation, the median of 3 alternating rounds.
struct Saturation {
    on: f64,
    remote: f64,
    off: f64,
    nginx: Option<f64>,
    /// Answers other than 2xx over the 3 rounds: on, remote, off, nginx (wrk only).
    failed: [f64; 4],
    /// The load generator: wrk, or reqwest without it.
    have_wrk: bool,
}

fn edge_saturation(rt: &tokio::runtime::Runtime, hosts: &EdgeHosts, scale: usize) -> Saturation {
    let secs = 3.0 / scale as f64;
    let have_wrk = Command::new("wrk").arg("--version").output().is_ok();
    let load = |url: &str, secret: &str| match have_wrk {
        true => wrk(url, secret, 64, secs),
        false => (rt.block_on(saturate(url, secret, 64, secs, 200_000)), 0.0),
    };
    let nginx_url = hosts
        .nginx
        .as_ref()
        .map(|n| format!("http://127.0.0.1:{}", n.port));
    // each edge reads its configuration and loads its script at its first
    // requests, on a fresh Redis (NOSCRIPT, then EVAL): warmed up outside the
    // measured rounds, whose non-2xx count then is only the load's own
    for (url, secret) in [
        (&hosts.on.url, &hosts.secret),
        (&hosts.on_remote.url, &hosts.remote_secret),
        (&hosts.off.url, &hosts.secret),
    ] {
        rt.block_on(warm_up(url, secret));
    }
    let (mut r_on, mut r_remote, mut r_off, mut r_nginx) = (vec![], vec![], vec![], vec![]);
    let mut failed = [0.0; 4];
    for _ in 0..3 {
        let mut round = |rates: &mut Vec<f64>, row: usize, url: &str, secret: &str| {
            let (rate, non_2xx) = load(url, secret);
            rates.push(rate);
            failed[row] += non_2xx;
        };
        round(&mut r_on, 0, &hosts.on.url, &hosts.secret);
        round(&mut r_remote, 1, &hosts.on_remote.url, &hosts.remote_secret);
        round(&mut r_off, 2, &hosts.off.url, &hosts.secret);
        if let Some(url) = &nginx_url {
            round(&mut r_nginx, 3, url, &hosts.secret);
        }
    }
    for v in [&mut r_on, &mut r_remote, &mut r_off, &mut r_nginx] {
        v.sort_by(f64::total_cmp);
    }
    Saturation {
        on: r_on[1],
        remote: r_remote[1],
        off: r_off[1],
        nginx: r_nginx.get(1).copied(),
        failed,
        have_wrk,
    }
}

/// Sends `secret`'s requests to a fresh edge until 50 in a row are answered 200
/// (at most 2,000 requests or 30 s). (Its health's `connected` would not do: an
/// edge with `--no-limit` never connects to a store.)
async fn warm_up(url: &str, secret: &str) {
    let client = reqwest::Client::new();
    let stop = Instant::now() + Duration::from_secs(30);
    let (mut in_a_row, mut sent) = (0, 0);
    while in_a_row < 50 && sent < 2_000 && Instant::now() < stop {
        sent += 1;
        let ok = client
            .get(format!("{url}/v1/items"))
            .bearer_auth(secret)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        in_a_row = if ok { in_a_row + 1 } else { 0 };
    }
    assert!(
        in_a_row >= 50,
        "{url} did not warm up: {in_a_row} answered 200 in a row after {sent} requests"
    );
}

/// `a ÷ b` to three places, rounded down: issue 21's targets (0.85, 0.7) are read
/// off this table, and a rounded ratio met them by rounding (0.84999 printed as
/// 0.85 at two places, 0.8497 as 0.850 at three).
fn ratio(a: f64, b: f64) -> String {
    format!("{:.3}", (a / b * 1000.0).floor() / 1000.0)
}

fn print_saturation(s: &Saturation) {
    let vs_nginx = |r: f64| s.nginx.map_or("n/a".to_string(), |n| ratio(r, n));
    println!(
        "| host | requests/s at saturation (64 connections, {}) | ÷ limiter off | ÷ nginx limit_req | non-2xx (3 rounds) |",
        if s.have_wrk { "wrk" } else { "reqwest" }
    );
    println!("|---|---|---|---|---|");
    let [on, remote, off, nginx] = s.failed;
    println!(
        "| limiter on, Redis on CPU 0 beside the edge | {:.0} | {} | {} | {on:.0} |",
        s.on,
        ratio(s.on, s.off),
        vs_nginx(s.on)
    );
    println!(
        "| limiter on, Redis on CPU 1 (as if remote) | {:.0} | **{}** | **{}** | {remote:.0} |",
        s.remote,
        ratio(s.remote, s.off),
        vs_nginx(s.remote)
    );
    println!(
        "| limiter off | {:.0} | 1.000 | {} | {off:.0} |",
        s.off,
        vs_nginx(s.off)
    );
    match s.nginx {
        Some(n) => println!(
            "| nginx 1.22 `limit_req` (in-process, not global) | {n:.0} | {} | 1.000 | {nginx:.0} |",
            ratio(n, s.off)
        ),
        None => println!("| nginx | not installed (Debian nginx-light) | | | |"),
    }
}

/// Latency added by the limiter at a fixed 5,000 req/s.
fn edge_added_latency(rt: &tokio::runtime::Runtime, hosts: &EdgeHosts, scale: usize) {
    let rate = 5000.0;
    let fixed_secs = 4.0 / scale as f64;
    let on = rt.block_on(fixed_rate(&hosts.on.url, &hosts.secret, rate, fixed_secs));
    let off = rt.block_on(fixed_rate(&hosts.off.url, &hosts.secret, rate, fixed_secs));
    println!("\n| at a fixed {rate:.0} req/s for {fixed_secs:.1} s | p50 µs | p99 µs | failed |");
    println!("|---|---|---|---|");
    println!(
        "| limiter on | {:.0} | {:.0} | {} |",
        on.p50_us, on.p99_us, on.failed
    );
    println!(
        "| limiter off | {:.0} | {:.0} | {} |",
        off.p50_us, off.p99_us, off.failed
    );
    println!(
        "| **added by the limiter** | **{:.0}** | **{:.0}** | |",
        on.p50_us - off.p50_us,
        on.p99_us - off.p99_us
    );
}

fn bench_worker(
    server: &RedisServer,
    rt: &tokio::runtime::Runtime,
    upstream: &str,
    secret: &str,
    scale: usize,
) {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../edge/worker");
    if !dir.join("build/index_bg.wasm").exists() || !dir.join("node_modules/miniflare").exists() {
        println!("\n## The Worker: skipped (scripts/worker build first; scripts/bench does)");
        return;
    }
    let rest = floodgate_tests::free_port();
    let token = "bench-token";
    let _rest = sibling(
        "floodgate-rest",
        &[
            "--listen",
            &format!("127.0.0.1:{rest}"),
            "--redis",
            &server.url(),
        ],
        &[("FLOODGATE_REST_TOKEN", token)],
        rest,
    );
    let rest_url = format!("http://127.0.0.1:{rest}");
    let serve = |script: &str| serve_worker(&dir, script, upstream, &rest_url, token);
    let worker = serve("floodgate");
    let passthrough = serve("passthrough");
    // warm both (isolate start, caches)
    rt.block_on(fixed_rate(&worker.url, secret, 100.0, 1.0));
    rt.block_on(fixed_rate(&passthrough.url, secret, 100.0, 1.0));
    let rate = 300.0;
    let secs = 5.0 / scale as f64;
    let w = rt.block_on(fixed_rate(&worker.url, secret, rate, secs));
    let p = rt.block_on(fixed_rate(&passthrough.url, secret, rate, secs));
    print_worker_table(rate, secs, &w, &p);
    print_bundle_size(&dir);
}

/// Starts `script` (serve.mjs: workerd through Miniflare) on a free port on CPU 0,
/// its store floodgate-rest at `rest_url`; it stops when its stdin closes.
fn serve_worker(
    dir: &std::path::Path,
    script: &str,
    upstream: &str,
    rest_url: &str,
    token: &str,
) -> Host {
    let port = floodgate_tests::free_port();
    let child = Command::new("taskset")
        .args(["-c", "0"])
        .arg(dir.join("node_modules/.bin/node"))
        .arg("serve.mjs")
        .current_dir(dir)
        .env("PORT", port.to_string())
        .env("SCRIPT", script)
        .env("UPSTREAM_URL", upstream)
        .env("UPSTASH_REDIS_REST_URL", rest_url)
        .env("UPSTASH_REDIS_REST_TOKEN", token)
        .env("STOP_ON_STDIN_EOF", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("node runs serve.mjs");
    wait_port(port);
    Host {
        _proc: Proc(child),
        url: format!("http://127.0.0.1:{port}"),
    }
}

/// The Worker vs the pass-through Worker at `rate` for `secs`.
fn print_worker_table(rate: f64, secs: f64, w: &Latency, p: &Latency) {
    println!(
        "\n## The Worker in workerd (Miniflare) vs a pass-through Worker, {rate:.0} req/s for {secs:.1} s"
    );
    println!(
        "(the limiter's store is floodgate-rest + Redis on loopback; in production it is Upstash)"
    );
    println!("| Worker | p50 µs | p99 µs | failed |");
    println!("|---|---|---|---|");
    println!(
        "| Floodgate | {:.0} | {:.0} | {} |",
        w.p50_us, w.p99_us, w.failed
    );
    println!(
        "| pass-through | {:.0} | {:.0} | {} |",
        p.p50_us, p.p99_us, p.failed
    );
    println!(
        "| **added by Floodgate** | **{:.0}** | **{:.0}** | |",
        w.p50_us - p.p50_us,
        w.p99_us - p.p99_us
    );
}

/// The Worker's bundle, raw and gzip -9.
fn print_bundle_size(dir: &std::path::Path) {
    let wasm = std::fs::read(dir.join("build/index_bg.wasm")).unwrap();
    let js = std::fs::read(dir.join("build/index.js")).unwrap();
    println!(
        "\nWorker bundle: {} KiB ({} KiB wasm + {} KiB JS), **{} KiB gzip**",
        (wasm.len() + js.len()) / 1024,
        wasm.len() / 1024,
        js.len() / 1024,
        (gzip_len(&wasm) + gzip_len(&js)) / 1024
    );
}

/// The size of `bytes` after `gzip -9`.
fn gzip_len(bytes: &[u8]) -> usize {
    let mut child = Command::new("gzip")
        .arg("-9c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // written from a thread: gzip's output fills its pipe while it is still
    // reading (the wasm compresses to more than a pipe holds), and a writer
    // that waits for its input to drain before reading deadlocks
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    std::thread::scope(|s| {
        let writer = s.spawn(move || stdin.write_all(bytes));
        let out = child.wait_with_output().unwrap().stdout.len();
        writer.join().unwrap().unwrap();
        out
    })
}

/// nginx in the foreground (one process, no master: killing it leaves no worker
/// behind; on CPU 0), limiting per
/// `Authorization` header with `limit_req` at a rate no load here reaches (so it
/// counts every request, refuses none) and proxying with kept-alive upstream
/// connections. Killed when dropped. `None` when nginx is not installed.
struct Nginx {
    port: u16,
    _proc: Proc,
    dir: std::path::PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Nginx {
    fn start(upstream_port: u16) -> Option<Self> {
        let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())?;
        let port = floodgate_tests::free_port();
        let dir = std::env::temp_dir().join(format!("floodgate-nginx-{port}"));
        std::fs::create_dir_all(&dir).ok()?;
        let d = dir.display();
        let conf = format!(
            "master_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             limit_req_zone $http_authorization zone=keys:10m rate=10000000r/s;\n\
             upstream up {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}\n\
             server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
             limit_req zone=keys burst=10000000 nodelay;\n      proxy_pass http://up;\n\
             proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).ok()?;
        let child = on_cpu0(bin)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .args(["-g", "daemon off;"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let proc = Proc(child);
        wait_port(port);
        Some(Nginx {
            port,
            _proc: proc,
            dir,
        })
    }
}

/// Saturation with wrk (one thread, `connections` connections, `secs` seconds):
/// requests/s, and the answers other than 2xx (a limiter that cannot decide in
/// time answers 503 by its failure mode: counted and printed, not hidden).
fn wrk(url: &str, secret: &str, connections: usize, secs: f64) -> (f64, f64) {
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{}s", secs.ceil() as u64),
        ])
        .args(["-H", &format!("Authorization: Bearer {secret}")])
        .arg(format!("{url}/v1/items"))
        .output()
        .expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let non_2xx: f64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .map_or(0.0, |n| n.trim().parse().unwrap_or(0.0));
    let rate = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in wrk output:\n{text}"));
    (rate, non_2xx)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ratios_are_rounded_down_to_three_places() {
        // the 22:33 run's Redis-on-CPU-1 row: 0.8497, which rounding showed as 0.850
        assert_eq!(super::ratio(40_441.0, 47_595.0), "0.849");
        assert_eq!(super::ratio(42_472.0, 49_325.0), "0.861");
        assert_eq!(super::ratio(48_464.0, 48_464.0), "1.000");
    }
}
