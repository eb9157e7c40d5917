//! `floodgate-rest`: a local and test stand-in for Upstash's Redis REST API in front
//! of a real `redis-server` — what the run command and the tests put where Upstash
//! would be. Not part of the edge: the edge's REST store talks to it as to Upstash.
//!
//! Faithful to the protocol the official clients speak (`../shared/notes/upstash-rest.md`):
//! command-in-body (`POST /` with a JSON array) and path style (`GET /set/k/v`,
//! `POST /set/k` with the value as body, trailing arguments in the query string
//! as in `POST /set/k?EX=100`); `POST /pipeline` (not atomic, one reply per
//! command, HTTP 200 even when some fail); `POST /multi-exec` (atomic; a discarded
//! transaction is one `{"error"}`); `Upstash-Encoding: base64` (every string
//! base64 except `"OK"`); bearer token (any case of `Bearer`, or `?_token=`) on
//! EVERY route, 401 otherwise; Redis errors as HTTP 400 `{"error": <Redis's own
//! message>}`. JSON numbers reach Redis as the exact text the client sent (no
//! float round trip: `1e-07` stays `1e-07`, `18446744073709551616` stays whole).
//! The routes are in `routes.rs` (its table), the token check in `auth.rs`.
//!
//! Upstash runs scripts whose shebang carries its own flag `allow-key-locking`
//! (`@upstash/ratelimit`'s scripts do), which stock Redis rejects; the endpoint
//! strips that flag before Redis sees the script and maps the script's SHA-1 as the
//! client computed it to the SHA-1 Redis knows, so `EVALSHA` keeps hitting
//! (`scripts.rs`).
//!
//! Safety:
//! - a command policy ([`CommandPolicy`]): administrative and dangerous commands
//!   are refused unless the operator allows them (`--allow-command`); commands that
//!   would block or change the state of the shared connections always;
//! - replies larger than the configured bound ([`EndpointConfig::max_reply`])
//!   fail their own request only (400); the Redis client parses any valid reply,
//!   so no reply ever breaks a connection other requests share;
//! - a body is answered 413 the moment it passes the limit (a declared length
//!   over it at once), and what the client still sends is read out behind the
//!   answer (up to 64 MiB), so it sees the answer instead of a reset; a malformed
//!   body (bad chunking) is a 400 (`body.rs`);
//! - the native host's hardened HTTP/1.1 server ([`serve`]): a header-read
//!   timeout, idle keep-alive connections closed after it too, a cap on open
//!   connections (past it, `503` with `Retry-After: 1` at once);
//! - a script call past the deadline is stopped by the endpoint (`SCRIPT KILL`
//!   on a connection of its own), and its caller told so, or told that Redis
//!   cannot stop it (`UNKILLABLE`: it has written) (`kill.rs`);
//! - `HEAD` answers like `GET` without running the command;
//! - a bounded pool of Redis connections (TLS and ACL users as every store),
//!   graceful shutdown, loopback by default.

mod auth;
mod body;
mod hardened;
mod kill;
mod metrics;
mod parse;
mod policy;
mod reply;
mod routes;
mod scripts;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub use axum::Router;
use floodgate_edge::store::resp::RespStore;
use floodgate_edge::store::{Store, StoreError, StoreErrorKind, StoreOptions, Value};

pub use self::hardened::{limits, serve};
pub use self::policy::{CommandPolicy, Refusal};
pub use self::routes::{App, HEALTH_PATH, METRICS_PATH, app, metrics_app};

/// How the endpoint runs.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// The Redis server behind it (URL, deadline, CA file).
    pub redis: StoreOptions,
    /// The bearer token clients must present.
    pub token: String,
    /// Largest accepted request body (bytes).
    pub max_body: usize,
    /// Largest reply served (bytes of its strings, plus 16 per element); a larger
    /// one fails its own request with a 400.
    pub max_reply: usize,
    /// Redis connections (each pipelines many requests).
    pub pool: usize,
    /// Commands (`"FLUSHDB"`) or subcommands (`"SCRIPT FLUSH"`) the command
    /// policy refuses by default and this deployment allows.
    pub allow: Vec<String>,
    /// A client must send a request's headers within this long after connecting
    /// or after its previous response (so idle connections close after it too).
    pub header_timeout: Duration,
    /// A client must send a request's body within this long.
    pub body_timeout: Duration,
    /// Open client connections at most; past it a new one is answered `503`
    /// with `Retry-After: 1` at once.
    pub max_connections: usize,
}

/// The deadline of each Redis call, by default.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

impl EndpointConfig {
    pub fn new(redis_url: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            redis: StoreOptions::new(redis_url, DEFAULT_DEADLINE),
            token: token.into(),
            max_body: 1024 * 1024,
            max_reply: 64 * 1024 * 1024,
            pool: 4,
            allow: vec![],
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 512,
        }
    }
}

/// A connected endpoint: its Redis pool, its rules, its counters.
pub struct Endpoint {
    pool: Vec<RespStore>,
    next: AtomicUsize,
    metrics: metrics::RestMetrics,
    token: auth::Token,
    max_body: usize,
    max_reply: usize,
    body_timeout: Duration,
    policy: CommandPolicy,
    scripts: scripts::ScriptShas,
    /// Stops a script call that runs past the deadline (`None`: no Redis, tests).
    killer: Option<kill::Killer>,
}

impl Endpoint {
    /// The next connection of the pool, in turn.
    fn store(&self) -> &RespStore {
        &self.pool[self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len()]
    }

    /// Sends `cmds` as one pipeline, timed and counted; a script among them
    /// that runs past the deadline is stopped ([`kill`]).
    async fn run(&self, cmds: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, kill::CallFailure> {
        let started = std::time::Instant::now();
        let store = self.store();
        let replies = store.pipeline(cmds).await;
        self.metrics
            .redis_round_trip(started.elapsed(), replies.as_ref().err());
        match (replies, &self.killer) {
            (Ok(replies), _) => Ok(replies),
            (Err(e), Some(killer)) => Err(killer.after(cmds, e, store.deadline()).await),
            (Err(e), None) => Err(kill::CallFailure::Store(e)),
        }
    }
}

/// Connects the endpoint's Redis pool.
pub async fn endpoint(config: &EndpointConfig) -> Result<Arc<Endpoint>, StoreError> {
    if config.token.is_empty() {
        return Err(StoreError::new(
            StoreErrorKind::Auth,
            "the endpoint needs a non-empty token",
        ));
    }
    if config.redis.is_rest() || config.redis.is_cluster() {
        return Err(StoreError::new(
            StoreErrorKind::Protocol,
            "floodgate-rest fronts one Redis server (redis://, rediss://, redis+unix://) or \
             the primary Sentinel names (redis+sentinel://), not a Cluster or another REST endpoint",
        ));
    }
    let mut pool = Vec::with_capacity(config.pool.max(1));
    for _ in 0..config.pool.max(1) {
        pool.push(RespStore::connect_with(&config.redis).await?);
    }
    let killer = Some(kill::Killer::connect(&config.redis).await?);
    Ok(Arc::new(Endpoint {
        pool,
        next: AtomicUsize::new(0),
        metrics: metrics::RestMetrics::default(),
        token: auth::Token::new(&config.token),
        max_body: config.max_body,
        max_reply: config.max_reply,
        body_timeout: config.body_timeout,
        policy: CommandPolicy::new(&config.allow),
        scripts: scripts::ScriptShas::default(),
        killer,
    }))
}

/// Builds the endpoint's router, connecting its Redis pool first.
pub async fn router(config: &EndpointConfig) -> Result<App, StoreError> {
    Ok(app(endpoint(config).await?))
}

#[cfg(test)]
impl Endpoint {
    /// An endpoint without Redis connections, for tests of what happens before
    /// Redis is asked.
    fn unconnected(allow: &[&str]) -> Self {
        Endpoint {
            pool: vec![],
            next: AtomicUsize::new(0),
            metrics: metrics::RestMetrics::default(),
            token: auth::Token::new("t"),
            max_body: 1024,
            max_reply: 1024,
            body_timeout: Duration::from_secs(1),
            policy: CommandPolicy::new(&allow.iter().map(|a| a.to_string()).collect::<Vec<_>>()),
            scripts: scripts::ScriptShas::default(),
            killer: None,
        }
    }
}
