//! A local Upstash-compatible REST endpoint in front of a real `redis-server`: what
//! the run command and the tests put where Upstash would be.
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
//!
//! Upstash runs scripts whose shebang carries its own flag `allow-key-locking`
//! (`@upstash/ratelimit`'s scripts do), which stock Redis rejects; the endpoint
//! strips that flag before Redis sees the script and maps the script's SHA-1 as the
//! client computed it to the SHA-1 Redis knows, so `EVALSHA` keeps hitting.
//!
//! Safety:
//! - a command policy ([`CommandPolicy`]): administrative and dangerous commands
//!   (`CONFIG`, `ACL` but its read-only self-inspection, `MIGRATE`, `SAVE`,
//!   `BGSAVE`, `BGREWRITEAOF`, `SWAPDB`, `FLUSHALL`, `FLUSHDB`, `SCRIPT FLUSH|KILL`,
//!   `FUNCTION FLUSH|RESTORE|DELETE|KILL`, `DEBUG`, `SHUTDOWN`, `REPLICAOF`,
//!   `SLAVEOF`, `FAILOVER`, `MODULE`, `CLUSTER` but its reads, `SENTINEL`) are
//!   refused unless the operator allows them (`--allow-command`); commands that
//!   would block or change the state of the shared connections (`MULTI` outside
//!   `/multi-exec`, `SELECT`, `SUBSCRIBE`, blocking pops, `CLIENT`...) always;
//! - replies larger than the configured bound ([`EndpointConfig::max_reply`])
//!   fail their own request only (400); the Redis client parses any valid reply,
//!   so no reply ever breaks a connection other requests share;
//! - bodies over the limit are read to their end (up to 64 MiB, within the body
//!   timeout) and answered 413, so the client sees the answer instead of a reset;
//!   a malformed body (bad chunking) is a 400;
//! - a header-read timeout (which also closes idle keep-alive connections), a
//!   body-read timeout and a cap on open connections ([`serve`]);
//! - `HEAD` answers like `GET` without running the command;
//! - a bounded pool of Redis connections (TLS and ACL users as every store),
//!   graceful shutdown, loopback by default.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http_body_util::BodyExt;
use serde_json::value::RawValue;
use serde_json::{Value as Json, json};

use crate::store::resp::RespStore;
use crate::store::{Store, StoreError, StoreErrorKind, StoreOptions, Value, lock};

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
    /// Open client connections at most; more wait in the listen backlog.
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

/// Bodies over the limit are read and dropped up to this size (so the client
/// gets its 413); beyond it the connection is closed.
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// The path the endpoint answers itself, without a token: whether its Redis
/// answers (`{"redis":"ok"}`, or 503).
pub const HEALTH_PATH: &str = "/__floodgate/health";

pub struct Endpoint {
    pool: Vec<RespStore>,
    metrics: RestMetrics,
    next: AtomicUsize,
    token: String,
    max_body: usize,
    max_reply: usize,
    body_timeout: Duration,
    policy: CommandPolicy,
    /// SHA-1 of a script as its client sent it → SHA-1 of what Redis runs.
    script_shas: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// Why a request's command(s) will not run; `Display` is the `{"error"}` text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It would block or change the state of the shared Redis connections.
    #[error(
        "ERR command not allowed over REST: {command} (it would block or change the endpoint's shared Redis connections)"
    )]
    ConnectionState { command: String },
    /// Administrative or dangerous, and not on the allow list.
    #[error(
        "ERR command not allowed over REST: {command} (administrative; floodgate-rest --allow-command \"{command}\" enables it)"
    )]
    Administrative { command: String },
    /// Not a command this endpoint can read.
    #[error("ERR {0}")]
    Malformed(String),
    /// One command of a batch, by its index.
    #[error("{refusal} (command {index})")]
    InBatch { index: usize, refusal: Box<Refusal> },
}

/// What the endpoint refuses to run.
#[derive(Debug, Clone, Default)]
pub struct CommandPolicy {
    /// Upper-case `"CMD"` or `"CMD SUB"` entries allowed despite the default.
    allowed: HashSet<String>,
}

/// Commands that would block a shared connection or change its state: refused
/// always (no allow list can make them safe on a shared connection).
const CONNECTION_STATE: &[&str] = &[
    "AUTH",
    "HELLO",
    "SELECT",
    "QUIT",
    "RESET",
    "MULTI",
    "EXEC",
    "DISCARD",
    "WATCH",
    "UNWATCH",
    "SUBSCRIBE",
    "PSUBSCRIBE",
    "SSUBSCRIBE",
    "UNSUBSCRIBE",
    "PUNSUBSCRIBE",
    "SUNSUBSCRIBE",
    "MONITOR",
    "SYNC",
    "PSYNC",
    "REPLCONF",
    "BLPOP",
    "BRPOP",
    "BRPOPLPUSH",
    "BLMOVE",
    "BLMPOP",
    "BZPOPMIN",
    "BZPOPMAX",
    "BZMPOP",
    "WAIT",
    "WAITAOF",
    "CLIENT",
];

/// Which subcommands of an administrative command are refused by default.
enum Refused {
    Every,
    These(&'static [&'static str]),
    AllBut(&'static [&'static str]),
}

/// Administrative and dangerous commands, refused unless allowed: they change
/// the server for every user (`CONFIG SET requirepass` locks everyone out),
/// reach other hosts (`MIGRATE`), destroy data wholesale, or stop the server.
const ADMINISTRATIVE: &[(&str, Refused)] = &[
    ("CONFIG", Refused::Every),
    (
        "ACL",
        Refused::AllBut(&["WHOAMI", "CAT", "GENPASS", "HELP"]),
    ),
    ("MIGRATE", Refused::Every),
    ("SAVE", Refused::Every),
    ("BGSAVE", Refused::Every),
    ("BGREWRITEAOF", Refused::Every),
    ("SWAPDB", Refused::Every),
    ("FLUSHALL", Refused::Every),
    ("FLUSHDB", Refused::Every),
    ("SCRIPT", Refused::These(&["FLUSH", "KILL"])),
    (
        "FUNCTION",
        Refused::These(&["FLUSH", "RESTORE", "DELETE", "KILL"]),
    ),
    ("DEBUG", Refused::Every),
    ("SHUTDOWN", Refused::Every),
    ("REPLICAOF", Refused::Every),
    ("SLAVEOF", Refused::Every),
    ("FAILOVER", Refused::Every),
    ("MODULE", Refused::Every),
    (
        "CLUSTER",
        Refused::AllBut(&[
            "INFO",
            "KEYSLOT",
            "SLOTS",
            "SHARDS",
            "NODES",
            "MYID",
            "COUNTKEYSINSLOT",
            "GETKEYSINSLOT",
            "HELP",
        ]),
    ),
    ("SENTINEL", Refused::Every),
    ("PFDEBUG", Refused::Every),
    ("PFSELFTEST", Refused::Every),
];

impl CommandPolicy {
    /// The default policy, with `allow` entries (`"FLUSHDB"`, `"SCRIPT FLUSH"`)
    /// let through.
    pub fn new(allow: &[String]) -> Self {
        Self {
            allowed: allow
                .iter()
                .map(|a| {
                    a.split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                        .to_ascii_uppercase()
                })
                .collect(),
        }
    }

    /// Why the command may not run over this endpoint, if it may not.
    pub fn check(&self, args: &[Vec<u8>]) -> Result<(), Refusal> {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let sub = args
            .get(1)
            .map(|s| String::from_utf8_lossy(s).to_ascii_uppercase())
            .unwrap_or_default();
        let blocking_read = (name == "XREAD" || name == "XREADGROUP")
            && args.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK"));
        if CONNECTION_STATE.contains(&name.as_str()) || blocking_read {
            return Err(Refusal::ConnectionState { command: name });
        }
        let Some((_, refused)) = ADMINISTRATIVE.iter().find(|(n, _)| *n == name) else {
            return Ok(());
        };
        let hit = match refused {
            Refused::Every => true,
            Refused::These(subs) => subs.contains(&sub.as_str()),
            Refused::AllBut(subs) => !subs.contains(&sub.as_str()),
        };
        let full = if sub.is_empty() || matches!(refused, Refused::Every) {
            name.clone()
        } else {
            format!("{name} {sub}")
        };
        if !hit || self.allowed.contains(&name) || self.allowed.contains(&full) {
            return Ok(());
        }
        Err(Refusal::Administrative { command: full })
    }
}

/// Script flags only Upstash understands; stock Redis refuses the whole script.
const UPSTASH_ONLY_FLAGS: &[&str] = &["allow-key-locking"];
/// Bound on the SHA-1 map (cleared when full; clients then fall back to EVAL).
const MAX_MAPPED_SCRIPTS: usize = 4096;

fn sha1_hex(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

/// The script without Upstash-only shebang flags, or None when it has none.
fn strip_upstash_flags(script: &[u8]) -> Option<Vec<u8>> {
    let end = script
        .iter()
        .position(|b| *b == b'\n')
        .unwrap_or(script.len());
    let line = std::str::from_utf8(&script[..end]).ok()?;
    let rest = line.strip_prefix("#!lua")?;
    let mut removed = false;
    let mut kept_tokens = vec!["#!lua".to_string()];
    for token in rest.split_whitespace() {
        match token.strip_prefix("flags=") {
            Some(flags) => {
                let kept: Vec<&str> = flags
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .filter(|f| {
                        let upstash = UPSTASH_ONLY_FLAGS.contains(f);
                        removed |= upstash;
                        !upstash
                    })
                    .collect();
                if !kept.is_empty() {
                    kept_tokens.push(format!("flags={}", kept.join(",")));
                }
            }
            None => kept_tokens.push(token.to_string()),
        }
    }
    removed.then(|| [kept_tokens.join(" ").as_bytes(), &script[end..]].concat())
}

impl Endpoint {
    fn remember_script(&self, original: &[u8], local: &[u8]) -> String {
        let (orig, local) = (sha1_hex(original), sha1_hex(local));
        let mut map = lock(&self.script_shas);
        if map.len() >= MAX_MAPPED_SCRIPTS {
            map.clear();
        }
        map.insert(orig.clone(), local);
        orig
    }

    fn local_sha(&self, sha: &[u8]) -> Option<Vec<u8>> {
        let sha = std::str::from_utf8(sha).ok()?.to_ascii_lowercase();
        lock(&self.script_shas)
            .get(&sha)
            .map(|s| s.clone().into_bytes())
    }

    /// Rewrites a command so stock Redis runs what Upstash would. Returns the
    /// command and, for `SCRIPT LOAD`, the SHA-1 the client expects back.
    fn prepare(&self, mut args: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, Option<String>) {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let mut reply_sha = None;
        match name.as_str() {
            "EVAL" | "EVAL_RO" if args.len() > 1 => {
                if let Some(stripped) = strip_upstash_flags(&args[1]) {
                    self.remember_script(&args[1], &stripped);
                    args[1] = stripped;
                }
            }
            "EVALSHA" | "EVALSHA_RO" if args.len() > 1 => {
                if let Some(local) = self.local_sha(&args[1]) {
                    args[1] = local;
                }
            }
            "SCRIPT" if args.len() == 3 && args[1].eq_ignore_ascii_case(b"LOAD") => {
                if let Some(stripped) = strip_upstash_flags(&args[2]) {
                    reply_sha = Some(self.remember_script(&args[2], &stripped));
                    args[2] = stripped;
                }
            }
            "SCRIPT" if args.len() > 2 && args[1].eq_ignore_ascii_case(b"EXISTS") => {
                for a in &mut args[2..] {
                    if let Some(local) = self.local_sha(a) {
                        *a = local;
                    }
                }
            }
            _ => {}
        }
        (args, reply_sha)
    }

    fn store(&self) -> &RespStore {
        &self.pool[self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len()]
    }

    /// Sends `cmds` as one pipeline, timed and counted.
    async fn run(&self, cmds: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, StoreError> {
        let started = std::time::Instant::now();
        let replies = self.store().pipeline(cmds).await;
        self.metrics
            .redis_latency
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &replies {
            self.metrics
                .redis_errors
                .get_or_create(&ErrorLabels {
                    kind: e.kind.name(),
                })
                .inc();
        }
        replies
    }
}

/// A reply, with the SHA-1 the client expects when the script was rewritten.
fn fix_reply(reply: Value, sha: Option<String>) -> Value {
    match (reply, sha) {
        (Value::Bulk(_), Some(sha)) => Value::Bulk(sha.into_bytes()),
        (reply, _) => reply,
    }
}

/// Builds the endpoint's router, connecting its Redis pool first.
pub async fn router(config: &EndpointConfig) -> Result<Router, StoreError> {
    Ok(app(endpoint(config).await?))
}

/// The endpoint's REST routes over `ep`.
pub fn app(ep: Arc<Endpoint>) -> Router {
    Router::new()
        .route(HEALTH_PATH, axum::routing::get(health))
        .fallback(handle)
        .with_state(ep)
}

/// The path of the endpoint's Prometheus metrics on its metrics listener.
pub const METRICS_PATH: &str = "/metrics";

/// `GET /metrics` over `ep`: served on a listener of its own (`floodgate-rest
/// --metrics-listen`) without the token, which grants every Redis command.
pub fn metrics_app(ep: Arc<Endpoint>) -> Router {
    Router::new()
        .route(METRICS_PATH, axum::routing::get(metrics))
        .with_state(ep)
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
        return Err(StoreError::protocol(
            "floodgate-rest fronts one Redis server (redis://, rediss://, redis+unix://) or \
             the primary Sentinel names (redis+sentinel://), not a Cluster or another REST endpoint",
        ));
    }
    let mut pool = Vec::with_capacity(config.pool.max(1));
    for _ in 0..config.pool.max(1) {
        pool.push(RespStore::connect_with(&config.redis).await?);
    }
    Ok(Arc::new(Endpoint {
        pool,
        metrics: RestMetrics::default(),
        next: AtomicUsize::new(0),
        token: config.token.clone(),
        max_body: config.max_body,
        max_reply: config.max_reply,
        body_timeout: config.body_timeout,
        policy: CommandPolicy::new(&config.allow),
        script_shas: Default::default(),
    }))
}

/// Serves until `shutdown` completes, then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: &EndpointConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    serve_router(listener, router(config).await?, config, shutdown).await
}

/// Serves an already built [`router`] until `shutdown` completes: HTTP/1.1 with
/// `config`'s header-read timeout and connection cap; in-flight requests finish
/// (at most 30 s) after `shutdown`.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    config: &EndpointConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let permits = Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // out of file descriptors or a connection reset while queued:
                    // pause instead of spinning, then go on serving
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(config.header_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(30)) => {}
    }
    Ok(())
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        json!({ "error": message.into() }).to_string(),
    )
        .into_response()
}

/// An error after which the connection closes (its request was not read whole).
fn error_closing(status: StatusCode, message: impl Into<String>) -> Response {
    let mut r = error(status, message);
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn ok(value: Json) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
        .into_response()
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of `Authorization: Bearer <token>`; the scheme in any case (RFC 9110).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii())
}

fn authorized(ep: &Endpoint, headers: &HeaderMap, uri: &Uri) -> bool {
    let by_header = bearer(headers).is_some_and(|t| same(t, ep.token.as_bytes()));
    let by_query = uri.query().is_some_and(|q| {
        q.split('&')
            .filter_map(|kv| kv.strip_prefix("_token="))
            .any(|t| same(percent_decode(t).as_slice(), ep.token.as_bytes()))
    });
    by_header || by_query
}

/// One JSON array element as a command argument: a string, or a number as the
/// exact text the client sent.
fn argument(i: usize, raw: &RawValue) -> Result<Vec<u8>, Refusal> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(text)
            .map(String::into_bytes)
            .map_err(|e| Refusal::Malformed(format!("argument {i}: {e}"))),
        Some(b'-' | b'0'..=b'9') => Ok(text.as_bytes().to_vec()),
        _ => Err(Refusal::Malformed(format!(
            "argument {i} must be a string or a number, got {}",
            match text.as_bytes().first() {
                Some(b'n') => "null",
                Some(b't' | b'f') => "a boolean",
                Some(b'[') => "an array",
                Some(b'{') => "an object",
                _ => "something else",
            }
        ))),
    }
}

/// One command from a JSON array of strings and numbers.
fn command_from_raw(raw: &RawValue) -> Result<Vec<Vec<u8>>, Refusal> {
    let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|_| {
        Refusal::Malformed("a command must be a JSON array like [\"SET\",\"key\",\"value\"]".into())
    })?;
    if items.is_empty() {
        return Err(Refusal::Malformed("a command must not be empty".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, a)| argument(i, a))
        .collect()
}

fn parse_raw(body: &[u8]) -> Result<&RawValue, Refusal> {
    if body.is_empty() {
        return Err(Refusal::Malformed(
            "empty request body; send a JSON array command".into(),
        ));
    }
    serde_json::from_slice(body).map_err(|e| Refusal::Malformed(format!("malformed JSON: {e}")))
}

fn command_from_json(ep: &Endpoint, body: &[u8]) -> Result<Vec<Vec<u8>>, Refusal> {
    let args = command_from_raw(parse_raw(body)?)?;
    ep.policy.check(&args)?;
    Ok(args)
}

fn commands_from_json(ep: &Endpoint, body: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, Refusal> {
    let cmds: Vec<&RawValue> = serde_json::from_str(parse_raw(body)?.get()).map_err(|_| {
        Refusal::Malformed(
            "expected a JSON array of commands like [[\"SET\",\"k\",\"v\"],[\"GET\",\"k\"]]".into(),
        )
    })?;
    if cmds.is_empty() {
        return Err(Refusal::Malformed("no commands".into()));
    }
    cmds.iter()
        .enumerate()
        .map(|(index, c)| {
            command_from_raw(c)
                .and_then(|args| ep.policy.check(&args).map(|()| args))
                .map_err(|refusal| Refusal::InBatch {
                    index,
                    refusal: Box::new(refusal),
                })
        })
        .collect()
}

/// A path-style command: the path's segments, the body (POST/PUT), then the query
/// string's arguments (`?EX=100` → `EX 100`, `?NX` → `NX`; `_token` is not one).
fn command_from_path(
    path: &str,
    query: Option<&str>,
    body: &[u8],
    with_body: bool,
) -> Vec<Vec<u8>> {
    let mut args: Vec<Vec<u8>> = path
        .trim_start_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    if with_body && !body.is_empty() {
        args.push(body.to_vec());
    }
    for kv in query
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
    {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if k == "_token" {
            continue;
        }
        args.push(percent_decode(k));
        if !v.is_empty() {
            args.push(percent_decode(v));
        }
    }
    args
}

fn encode_str(bytes: &[u8], base64: bool) -> Json {
    if base64 {
        Json::String(base64::engine::general_purpose::STANDARD.encode(bytes))
    } else {
        Json::String(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// A Redis reply as Upstash renders it.
fn to_json(reply: Value, base64: bool) -> Json {
    match reply {
        Value::Status(s) if s == "OK" => Json::String(s),
        Value::Status(s) => encode_str(s.as_bytes(), base64),
        Value::Int(i) => Json::from(i),
        Value::Bulk(b) => encode_str(&b, base64),
        Value::Nil => Json::Null,
        Value::Array(items) => Json::Array(items.into_iter().map(|r| to_json(r, base64)).collect()),
        Value::Error(e) => json!({ "error": e.message }),
    }
}

fn outcome(reply: Value, base64: bool) -> Json {
    match reply {
        Value::Error(e) => json!({ "error": e.message }),
        other => json!({ "result": to_json(other, base64) }),
    }
}

/// The size a reply takes (its strings' bytes, 16 per element), stopping early
/// once past `limit`.
fn reply_size(v: &Value, limit: usize) -> usize {
    fn walk(v: &Value, total: &mut usize, limit: usize) {
        *total += 16;
        if *total > limit {
            return;
        }
        match v {
            Value::Bulk(b) => *total += b.len(),
            Value::Status(s) => *total += s.len(),
            Value::Error(e) => *total += e.message.len(),
            Value::Array(items) => {
                for i in items {
                    walk(i, total, limit);
                    if *total > limit {
                        return;
                    }
                }
            }
            Value::Nil | Value::Int(_) => {}
        }
    }
    let mut total = 0;
    walk(v, &mut total, limit);
    total
}

fn store_failure(e: StoreError) -> Response {
    let status = match e.kind {
        StoreErrorKind::Timeout | StoreErrorKind::Stale => StatusCode::GATEWAY_TIMEOUT,
        StoreErrorKind::Connect => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, format!("ERR redis unavailable: {}", e.message))
}

fn percent_decode(s: &str) -> Vec<u8> {
    floodgate_shared::routes::percent_decode(s.as_bytes())
}

/// Why a body could not be taken.
enum BodyRefusal {
    TooLarge,
    /// Read to its end, but over the limit.
    TooLargeDrained,
    Malformed(String),
    Slow,
}

/// Reads the body whole, up to `max`; over it, reads on (discarding) to the end
/// so the client sees the 413 rather than a reset while it sends.
async fn read_body(body: Body, headers: &HeaderMap, max: usize) -> Result<Bytes, BodyRefusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_LIMIT) {
        return Err(BodyRefusal::TooLarge);
    }
    let mut body = body;
    let mut kept: Vec<u8> = Vec::new();
    let mut seen: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyRefusal::Malformed(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        seen += data.len() as u64;
        if seen > DRAIN_LIMIT {
            return Err(BodyRefusal::TooLarge);
        }
        if seen <= max as u64 {
            kept.extend_from_slice(&data);
        }
    }
    if seen > max as u64 {
        return Err(BodyRefusal::TooLargeDrained);
    }
    Ok(Bytes::from(kept))
}

async fn health(State(ep): State<Arc<Endpoint>>) -> Response {
    match ep.store().ping().await {
        Ok(()) => ok(json!({ "redis": "ok" })),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("ERR redis unavailable: {}", e.message),
        ),
    }
}

async fn handle(
    State(ep): State<Arc<Endpoint>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let kind = match uri.path().trim_end_matches('/') {
        "" => "command",
        "/pipeline" => "pipeline",
        "/multi-exec" => "multi_exec",
        _ => "path_command",
    };
    let response = answer(ep.clone(), method, uri, headers, body).await;
    let status = match response.status().as_u16() / 100 {
        2 => "2xx",
        4 => "4xx",
        _ => "5xx",
    };
    ep.metrics
        .requests
        .get_or_create(&RequestLabels { kind, status })
        .inc();
    response
}

/// Prometheus text: the counted series, and whether Redis answers a `PING` now
/// (within a second: a scrape during an outage answers, showing it).
async fn metrics(State(ep): State<Arc<Endpoint>>) -> Response {
    let up = matches!(
        tokio::time::timeout(Duration::from_secs(1), ep.store().ping()).await,
        Ok(Ok(()))
    );
    let mut now = prometheus_client::registry::Registry::with_prefix("floodgate_rest");
    now.register(
        "redis_up",
        "1 when Redis answered a PING at this scrape (within 1 s)",
        prometheus_client::metrics::gauge::ConstGauge::new(i64::from(up)),
    );
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        crate::metrics::render(&[&ep.metrics.registry, &now]),
    )
        .into_response()
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct RequestLabels {
    kind: &'static str,
    status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ErrorLabels {
    kind: &'static str,
}

/// floodgate-rest's series (`docs/metrics.md`).
struct RestMetrics {
    registry: prometheus_client::registry::Registry,
    requests: prometheus_client::metrics::family::Family<
        RequestLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    redis_latency: prometheus_client::metrics::histogram::Histogram,
    redis_errors: prometheus_client::metrics::family::Family<
        ErrorLabels,
        prometheus_client::metrics::counter::Counter,
    >,
}

impl Default for RestMetrics {
    fn default() -> Self {
        use prometheus_client::registry::{Registry, Unit};
        let mut registry = Registry::with_prefix("floodgate_rest");
        let requests = prometheus_client::metrics::family::Family::default();
        let redis_latency = prometheus_client::metrics::histogram::Histogram::new([
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
        ]);
        let redis_errors = prometheus_client::metrics::family::Family::default();
        registry.register(
            "requests",
            "Requests answered, by kind (command, pipeline, multi_exec, path_command) and status class",
            std::clone::Clone::clone(&requests),
        );
        registry.register_with_unit(
            "redis_latency",
            "Latency of one Redis round trip (a command, pipeline or transaction)",
            Unit::Seconds,
            redis_latency.clone(),
        );
        registry.register(
            "redis_errors",
            "Redis round trips that failed, by error kind",
            std::clone::Clone::clone(&redis_errors),
        );
        Self {
            registry,
            requests,
            redis_latency,
            redis_errors,
        }
    }
}

async fn answer(
    ep: Arc<Endpoint>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if !authorized(&ep, &headers, &uri) {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    if ![Method::GET, Method::HEAD, Method::POST, Method::PUT].contains(&method) {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("ERR method {method} not allowed"),
        );
    }
    if method == Method::HEAD {
        // what GET would answer, without its body, and without running anything
        return (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
        )
            .into_response();
    }
    if headers
        .get("upstash-response-format")
        .is_some_and(|v| v.as_bytes() != b"json")
    {
        return error(
            StatusCode::BAD_REQUEST,
            "ERR only the json response format is supported",
        );
    }
    let base64 = headers
        .get("upstash-encoding")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"base64"));
    let too_large = || format!("ERR request body larger than {} bytes", ep.max_body);
    let body = match tokio::time::timeout(ep.body_timeout, read_body(body, &headers, ep.max_body))
        .await
        .unwrap_or(Err(BodyRefusal::Slow))
    {
        Ok(b) => b,
        Err(BodyRefusal::TooLargeDrained) => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, too_large());
        }
        Err(BodyRefusal::TooLarge) => {
            return error_closing(StatusCode::PAYLOAD_TOO_LARGE, too_large());
        }
        Err(BodyRefusal::Malformed(why)) => {
            return error_closing(
                StatusCode::BAD_REQUEST,
                format!("ERR malformed request body: {why}"),
            );
        }
        Err(BodyRefusal::Slow) => {
            return error_closing(
                StatusCode::REQUEST_TIMEOUT,
                format!("ERR request body not received within {:?}", ep.body_timeout),
            );
        }
    };
    let path = uri.path().trim_end_matches('/');
    match path {
        "" => match command_from_json(&ep, &body) {
            Ok(args) => single(&ep, args, base64).await,
            Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
        },
        "/pipeline" | "/multi-exec" => match commands_from_json(&ep, &body) {
            Ok(cmds) if path == "/pipeline" => pipeline(&ep, cmds, base64).await,
            Ok(cmds) => multi_exec(&ep, cmds, base64).await,
            Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
        },
        _ => {
            let with_body = matches!(method, Method::POST | Method::PUT);
            let args = command_from_path(path, uri.query(), &body, with_body);
            match ep.policy.check(&args) {
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                Ok(()) => single(&ep, args, base64).await,
            }
        }
    }
}

/// A reply over the bound fails its own request: the answer to send instead.
fn too_large(ep: &Endpoint, reply: &Value) -> Option<Response> {
    (reply_size(reply, ep.max_reply) > ep.max_reply).then(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!(
                "ERR reply larger than this endpoint's limit of {} bytes (floodgate-rest --max-reply)",
                ep.max_reply
            ),
        )
    })
}

async fn single(ep: &Endpoint, args: Vec<Vec<u8>>, base64: bool) -> Response {
    let (args, sha) = ep.prepare(args);
    match ep.run(&[args]).await {
        Ok(mut replies) => match replies.pop().map(|r| fix_reply(r, sha)) {
            Some(Value::Error(e)) => error(StatusCode::BAD_REQUEST, e.message),
            Some(r) => match too_large(ep, &r) {
                None => ok(json!({ "result": to_json(r, base64) })),
                Some(refusal) => refusal,
            },
            None => error(StatusCode::INTERNAL_SERVER_ERROR, "ERR no reply"),
        },
        Err(e) => store_failure(e),
    }
}

/// One `{"result"}` or `{"error"}` per command, within the reply bound.
fn outcomes(
    ep: &Endpoint,
    replies: Vec<Value>,
    shas: Vec<Option<String>>,
    base64: bool,
) -> Response {
    let replies: Vec<Value> = replies
        .into_iter()
        .zip(shas)
        .map(|(r, sha)| fix_reply(r, sha))
        .collect();
    let all = Value::Array(replies);
    if let Some(refusal) = too_large(ep, &all) {
        return refusal;
    }
    let Value::Array(replies) = all else {
        unreachable!("built as an array")
    };
    ok(Json::Array(
        replies.into_iter().map(|r| outcome(r, base64)).collect(),
    ))
}

async fn pipeline(ep: &Endpoint, cmds: Vec<Vec<Vec<u8>>>, base64: bool) -> Response {
    let (cmds, shas): (Vec<_>, Vec<_>) = cmds.into_iter().map(|c| ep.prepare(c)).unzip();
    match ep.run(&cmds).await {
        Ok(replies) => outcomes(ep, replies, shas, base64),
        Err(e) => store_failure(e),
    }
}

async fn multi_exec(ep: &Endpoint, cmds: Vec<Vec<Vec<u8>>>, base64: bool) -> Response {
    let (cmds, shas): (Vec<_>, Vec<_>) = cmds.into_iter().map(|c| ep.prepare(c)).unzip();
    let n = cmds.len();
    let mut batch = Vec::with_capacity(n + 2);
    batch.push(vec![b"MULTI".to_vec()]);
    batch.extend(cmds);
    batch.push(vec![b"EXEC".to_vec()]);
    match ep.run(&batch).await {
        Ok(mut replies) => match replies.pop() {
            Some(Value::Array(results)) if results.len() == n => {
                outcomes(ep, results, shas, base64)
            }
            Some(Value::Error(e)) => error(StatusCode::BAD_REQUEST, e.message),
            other => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("ERR unexpected EXEC reply {other:?}"),
            ),
        },
        Err(e) => store_failure(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(allow: &[&str]) -> Endpoint {
        Endpoint {
            metrics: RestMetrics::default(),
            pool: vec![],
            next: AtomicUsize::new(0),
            token: "t".into(),
            max_body: 1024,
            max_reply: 1024,
            body_timeout: Duration::from_secs(1),
            policy: CommandPolicy::new(&allow.iter().map(|a| a.to_string()).collect::<Vec<_>>()),
            script_shas: Default::default(),
        }
    }

    fn words(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn json_commands_take_strings_and_numbers_as_sent() {
        let ep = endpoint(&[]);
        assert_eq!(
            command_from_json(
                &ep,
                br#"["SET", "k", 10, 1.5, 1e-07, 18446744073709551616]"#
            )
            .unwrap(),
            words(&["SET", "k", "10", "1.5", "1e-07", "18446744073709551616"])
        );
        for bad in [
            &br#"[]"#[..],
            br#""GET""#,
            br#"["GET", ["k"]]"#,
            br#"["GET", null]"#,
            br#"["GET", true]"#,
            br#"["GET", {"a": 1}]"#,
            br#"{"cmd": "GET"}"#,
            b"",
        ] {
            assert!(
                command_from_json(&ep, bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        for blocked in [
            &br#"["multi"]"#[..],
            br#"["BLPOP", "k", 0]"#,
            br#"["xread", "block", 0, "streams", "s", "$"]"#,
            br#"["select", 1]"#,
            br#"["client", "kill"]"#,
            br#"["config", "get", "maxmemory"]"#,
            br#"["Script", "Flush"]"#,
            br#"["acl", "setuser", "x"]"#,
            br#"["cluster", "reset"]"#,
        ] {
            assert!(
                command_from_json(&ep, blocked)
                    .unwrap_err()
                    .to_string()
                    .contains("not allowed"),
                "{}",
                String::from_utf8_lossy(blocked)
            );
        }
        for fine in [
            &br#"["SCRIPT", "LOAD", "return 1"]"#[..],
            br#"["acl", "whoami"]"#,
            br#"["CLUSTER", "KEYSLOT", "k"]"#,
            br#"["FUNCTION", "LIST"]"#,
        ] {
            assert!(
                command_from_json(&ep, fine).is_ok(),
                "{}",
                String::from_utf8_lossy(fine)
            );
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_what_it_names() {
        let ep = endpoint(&["flushdb", "script  flush"]);
        assert!(command_from_json(&ep, br#"["FLUSHDB"]"#).is_ok());
        assert!(command_from_json(&ep, br#"["SCRIPT", "flush"]"#).is_ok());
        assert!(command_from_json(&ep, br#"["SCRIPT", "KILL"]"#).is_err());
        assert!(command_from_json(&ep, br#"["FLUSHALL"]"#).is_err());
        // connection state can never be allowed
        let ep = endpoint(&["MULTI", "SELECT"]);
        assert!(command_from_json(&ep, br#"["MULTI"]"#).is_err());
        assert!(command_from_json(&ep, br#"["SELECT", 1]"#).is_err());
    }

    #[test]
    fn path_commands_take_the_body_then_the_query_arguments() {
        assert_eq!(
            command_from_path("/set/foo", Some("EX=100&_token=t"), b"bar", true),
            words(&["set", "foo", "bar", "EX", "100"])
        );
        assert_eq!(
            command_from_path("/set/a%20b/v", Some("NX&PX=5"), b"", false),
            words(&["set", "a b", "v", "NX", "PX", "5"])
        );
        assert_eq!(
            command_from_path("/get/k", None, b"ignored", false),
            words(&["get", "k"])
        );
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let mut h = HeaderMap::new();
        for (v, want) in [
            ("Bearer abc", Some(&b"abc"[..])),
            ("bearer abc", Some(b"abc")),
            ("BEARER  abc ", Some(b"abc")),
            ("Basic abc", None),
            ("Bearerabc", None),
        ] {
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            assert_eq!(bearer(&h), want, "{v}");
        }
    }

    #[test]
    fn replies_render_like_upstash() {
        assert_eq!(to_json(Value::Status("OK".into()), true), json!("OK"));
        assert_eq!(
            to_json(Value::Status("PONG".into()), true),
            json!("UE9ORw==")
        );
        assert_eq!(to_json(Value::Bulk(b"bar".to_vec()), true), json!("YmFy"));
        assert_eq!(to_json(Value::Bulk(b"bar".to_vec()), false), json!("bar"));
        assert_eq!(to_json(Value::Nil, true), Json::Null);
        assert_eq!(
            to_json(Value::Array(vec![Value::Int(3), Value::Nil]), false),
            json!([3, null])
        );
    }

    #[test]
    fn reply_sizes_stop_counting_past_the_limit() {
        let big = Value::Array(vec![Value::Bulk(vec![0; 600]); 100]);
        assert!(reply_size(&big, 1024) > 1024);
        assert!(reply_size(&big, usize::MAX) >= 60_000);
        assert_eq!(reply_size(&Value::Int(1), 1024), 16);
    }

    #[test]
    fn upstash_only_script_flags_are_stripped() {
        let s = b"#!lua flags=allow-key-locking\nreturn 1";
        assert_eq!(strip_upstash_flags(s).unwrap(), b"#!lua\nreturn 1");
        let s = b"#!lua flags=no-writes,allow-key-locking name=x\nreturn 1";
        assert_eq!(
            strip_upstash_flags(s).unwrap(),
            b"#!lua flags=no-writes name=x\nreturn 1"
        );
        assert_eq!(
            strip_upstash_flags(b"#!lua flags=no-writes\nreturn 1"),
            None
        );
        assert_eq!(strip_upstash_flags(b"return 1"), None);
        assert_eq!(
            strip_upstash_flags(b"#!lua flags=allow-key-locking"),
            Some(b"#!lua".to_vec())
        );
    }

    #[test]
    fn path_segments_are_percent_decoded() {
        assert_eq!(percent_decode("a%20b%2Fc"), b"a b/c");
        assert_eq!(percent_decode("100%"), b"100%");
        assert_eq!(percent_decode("%zz"), b"%zz");
    }
}
