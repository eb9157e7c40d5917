//! `scripts/bench clients`: the decision path through Floodgate's RESP store
//! (redis-rs 1.x with our auto-pipelining of script calls, deadlines and
//! connection health) next to redis-rs' multiplexed connection used plainly (one
//! request per call), the same auto-pipelining bare (what RespStore's own work
//! costs) and `redis-benchmark`, each at the same concurrency, in alternating
//! rounds of one run. The comparison that chose the client (with Floodgate's former
//! hand-written connection and fred 10) is in the README, "The Redis client".

use std::time::Duration;

use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{StoreError, StoreErrorKind};
use floodgate_shared::Micros;
use floodgate_shared::script::{Check, Verdict, interpret, script_call};
use floodgate_tests::RedisServer;

use crate::{Decide, Rate, drive, redis_benchmark, reset_stats, usec_per_call};

fn failed(e: impl std::fmt::Display) -> StoreError {
    StoreError::new(StoreErrorKind::Connect, e.to_string())
}

/// The `EVALSHA` of a check, as a redis-rs command.
fn evalsha(checks: &[Check<'_>], now: Option<Micros>) -> Result<redis::Cmd, StoreError> {
    let (script, args) = script_call(checks, now)?;
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.sha1).arg(checks.len());
    for c in checks {
        cmd.arg(c.key);
    }
    cmd.arg(&args);
    Ok(cmd)
}

/// redis-rs 1.x: one multiplexed connection shared by every caller, one request
/// per call.
#[derive(Clone)]
struct RedisRs(redis::aio::MultiplexedConnection);

impl Decide for RedisRs {
    async fn decide(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        let reply: Vec<i64> = evalsha(checks, now)?
            .query_async(&mut self.0.clone())
            .await
            .map_err(failed)?;
        Ok(interpret(checks, &reply)?)
    }
}

type Waiter = tokio::sync::oneshot::Sender<redis::Value>;

/// redis-rs 1.x auto-pipelined with nothing else around it (no deadline, no
/// connection health, no value conversion): the floor for RespStore's own work.
#[derive(Clone)]
struct RedisRsBatched {
    conn: redis::aio::MultiplexedConnection,
    queue: std::sync::Arc<std::sync::Mutex<Vec<(redis::Cmd, Waiter)>>>,
}

impl Decide for RedisRsBatched {
    async fn decide(
        &self,
        checks: &[Check<'_>],
        now: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        let cmd = evalsha(checks, now)?;
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
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            let mut waiters = Vec::with_capacity(batch.len());
            for (cmd, tx) in batch {
                pipe.add_command(cmd);
                waiters.push(tx);
            }
            let values: Vec<redis::Value> = pipe.query_async(&mut conn).await.map_err(failed)?;
            for (tx, v) in waiters.into_iter().zip(values) {
                let _ = tx.send(v);
            }
        }
        let v = rx.await.map_err(failed)?;
        let reply: Vec<i64> = redis::FromRedisValue::from_redis_value(v).map_err(failed)?;
        Ok(interpret(checks, &reply)?)
    }
}

async fn redis_rs(url: &str) -> RedisRs {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_pipeline_buffer_size(1024);
    let client = redis::Client::open(url).unwrap();
    RedisRs(
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap(),
    )
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
            "floodgate RespStore (redis-rs, auto-pipelined)",
            "redis-rs 1.x, one request per call",
            "redis-rs 1.x, bare auto-pipelining",
            "redis-benchmark",
        ]
        .into_iter()
        .map(|name| (name, vec![]))
        .collect();
        for _ in 0..ROUNDS {
            for (i, (_, results)) in rows.iter_mut().enumerate() {
                reset_stats(conn);
                let r = match i {
                    0 => rt.block_on(async {
                        let s = RespStore::connect(&url, Duration::from_secs(5))
                            .await
                            .unwrap();
                        drive(s, callers, n).await
                    }),
                    1 => rt.block_on(async { drive(redis_rs(&url).await, callers, n).await }),
                    2 => rt.block_on(async {
                        let s = RedisRsBatched {
                            conn: redis_rs(&url).await.0,
                            queue: Default::default(),
                        };
                        drive(s, callers, n).await
                    }),
                    _ => redis_benchmark(server.port(), callers, 1, n, sha),
                };
                results.push((r, usec_per_call(conn, "evalsha")));
            }
        }
        let medians: Vec<(&str, Rate, f64)> = rows
            .into_iter()
            .map(|(name, mut v)| {
                v.sort_by(|a, b| a.0.rate.total_cmp(&b.0.rate));
                let (r, us) = v.swap_remove(ROUNDS / 2);
                (name, r, us)
            })
            .collect();
        let base = medians.last().map(|m| m.1.rate).unwrap();
        for (name, r, us) in medians {
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
