//! `scripts/bench clients`: Redis clients side by side on the decision path (the
//! token-bucket script by EVALSHA, one check per call), each against
//! `redis-benchmark` at the same concurrency, in alternating rounds of one run:
//! Floodgate's own pipelined RESP connection, redis-rs's multiplexed connection
//! and fred's client. The figures chose the client (README, "The Redis client").

use std::time::Duration;

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{BucketStore, StoreError, StoreErrorKind};
use floodgate_shared::Micros;
use floodgate_shared::script::{Check, Verdict, interpret, script_call};
use floodgate_tests::RedisServer;

use crate::{Rate, drive, redis_benchmark, reset_stats, usec_per_call};

fn failed(e: impl std::fmt::Display) -> StoreError {
    StoreError::new(StoreErrorKind::Connect, e.to_string())
}

/// redis-rs 1.x: one multiplexed connection shared by every caller.
#[derive(Clone)]
struct RedisRs(redis::aio::MultiplexedConnection);

impl BucketStore for RedisRs {
    async fn check(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        let (script, args) = script_call(checks, now)?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.sha1).arg(checks.len());
        for c in checks {
            cmd.arg(c.key);
        }
        cmd.arg(&args);
        let reply: Vec<i64> = cmd.query_async(&mut self.0.clone()).await.map_err(failed)?;
        Ok(interpret(checks, &reply)?)
    }
}

type Waiter = tokio::sync::oneshot::Sender<redis::Value>;

/// redis-rs 1.x with auto-pipelining: the calls that callers start while one is
/// being prepared go together as ONE redis-rs pipeline (each its own EVALSHA).
#[derive(Clone)]
struct RedisRsBatched {
    conn: redis::aio::MultiplexedConnection,
    queue: std::sync::Arc<std::sync::Mutex<Vec<(redis::Cmd, Waiter)>>>,
}

impl BucketStore for RedisRsBatched {
    async fn check(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        let (script, args) = script_call(checks, now)?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.sha1).arg(checks.len());
        for c in checks {
            cmd.arg(c.key);
        }
        cmd.arg(&args);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let leader = {
            let mut q = self.queue.lock().unwrap();
            q.push((cmd, tx));
            q.len() == 1
        };
        if leader {
            tokio::task::yield_now().await;
            let batch = std::mem::take(&mut *self.queue.lock().unwrap());
            let mut conn = self.conn.clone();
            if batch.len() == 1 {
                let (cmd, tx) = batch.into_iter().next().unwrap();
                let v: redis::Value = cmd.query_async(&mut conn).await.map_err(failed)?;
                let _ = tx.send(v);
            } else {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                let mut waiters = Vec::with_capacity(batch.len());
                for (cmd, tx) in batch {
                    pipe.add_command(cmd);
                    waiters.push(tx);
                }
                let values: Vec<redis::Value> =
                    pipe.query_async(&mut conn).await.map_err(failed)?;
                for (tx, v) in waiters.into_iter().zip(values) {
                    let _ = tx.send(v);
                }
            }
        }
        let v = rx.await.map_err(failed)?;
        let reply: Vec<i64> = redis::FromRedisValue::from_redis_value(v).map_err(failed)?;
        Ok(interpret(checks, &reply)?)
    }
}

/// fred 10: one client (one connection) shared by every caller.
#[derive(Clone)]
struct Fred(fred::clients::Client);

impl BucketStore for Fred {
    async fn check(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        use fred::interfaces::LuaInterface;
        let (script, args) = script_call(checks, now)?;
        let keys: Vec<String> = checks.iter().map(|c| c.key.to_string()).collect();
        let reply: Vec<i64> = self
            .0
            .evalsha(script.sha1, keys, args)
            .await
            .map_err(failed)?;
        Ok(interpret(checks, &reply)?)
    }
}

async fn redis_rs(url: &str, timeout: Option<Duration>) -> RedisRs {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(timeout)
        .set_pipeline_buffer_size(1024);
    let client = redis::Client::open(url).unwrap();
    RedisRs(
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap(),
    )
}

async fn fred(url: &str) -> Fred {
    use fred::interfaces::ClientLike;
    let config = fred::types::config::Config::from_url(url).unwrap();
    let client = fred::types::Builder::from_config(config).build().unwrap();
    client.init().await.unwrap();
    Fred(client)
}

/// Alternating rounds per client; the median is reported.
const ROUNDS: usize = 5;

pub fn run(
    server: &RedisServer,
    conn: &mut redis::Connection,
    rt: &tokio::runtime::Runtime,
    scale: usize,
    sha: &str,
) {
    println!(
        "\n## Redis clients on the decision path (EVALSHA of the token bucket, one connection)"
    );
    println!(
        "(random keys of a 1,000,000-key space; every client and redis-benchmark in each of 5 alternating rounds; medians)"
    );
    println!(
        "| callers | client | decisions/s | p50 µs | p99 µs | server µs/call | ÷ redis-benchmark |"
    );
    println!("|---|---|---|---|---|---|---|");
    let url = server.url();
    for callers in [1usize, 50] {
        let n = if callers == 1 { 20_000 } else { 100_000 } / scale;
        let mut rows: Vec<(&str, Vec<(Rate, f64)>)> = [
            "floodgate pipe",
            "redis-rs 1.x",
            "redis-rs 1.x, no timer",
            "redis-rs 1.x, auto-pipelined",
            "fred 10",
            "redis-benchmark",
        ]
        .into_iter()
        .map(|name| (name, vec![]))
        .collect();
        for _ in 0..ROUNDS {
            for (name, results) in rows.iter_mut() {
                reset_stats(conn);
                let r = match *name {
                    "floodgate pipe" => rt.block_on(async {
                        let s = RespStore::connect(&url, Duration::from_secs(5))
                            .await
                            .unwrap();
                        drive(s, callers, n).await
                    }),
                    "redis-rs 1.x" => rt.block_on(async {
                        drive(
                            redis_rs(&url, Some(Duration::from_secs(5))).await,
                            callers,
                            n,
                        )
                        .await
                    }),
                    "redis-rs 1.x, no timer" => {
                        rt.block_on(async { drive(redis_rs(&url, None).await, callers, n).await })
                    }
                    "redis-rs 1.x, auto-pipelined" => rt.block_on(async {
                        let s = RedisRsBatched {
                            conn: redis_rs(&url, Some(Duration::from_secs(5))).await.0,
                            queue: Default::default(),
                        };
                        drive(s, callers, n).await
                    }),
                    "fred 10" => rt.block_on(async { drive(fred(&url).await, callers, n).await }),
                    _ => redis_benchmark(server.port(), callers, 1, n, sha),
                };
                results.push((r, usec_per_call(conn, "evalsha")));
            }
        }
        let mut medians: Vec<(&str, Rate, f64)> = rows
            .into_iter()
            .map(|(name, mut v)| {
                v.sort_by(|a, b| a.0.rate.total_cmp(&b.0.rate));
                let (r, us) = v.swap_remove(ROUNDS / 2);
                (name, r, us)
            })
            .collect();
        let base = medians.last().map(|m| m.1.rate).unwrap();
        for (name, r, us) in medians.drain(..) {
            println!(
                "| {callers} | {name} | {:.0} | {:.1} | {:.1} | {us:.2} | **{:.2}** |",
                r.rate,
                r.p50_us,
                r.p99_us,
                r.rate / base
            );
        }
    }
}
