//! A local Upstash-compatible REST endpoint in front of a real `redis-server`: what
//! the run command and the tests put where Upstash would be.
//!
//! Faithful to the protocol the official clients speak (`../shared/notes/upstash-rest.md`):
//! command-in-body (`POST /` with a JSON array) and path style (`GET /set/k/v`,
//! `POST /set/k` with the value as body); `POST /pipeline` (not atomic, one reply
//! per command, HTTP 200 even when some fail); `POST /multi-exec` (atomic; a
//! discarded transaction is one `{"error"}`); `Upstash-Encoding: base64` (every
//! string base64 except `"OK"`); bearer token (or `?_token=`) on EVERY route, 401
//! otherwise; Redis errors as HTTP 400 `{"error": <Redis's own message>}`.
//!
//! Upstash runs scripts whose shebang carries its own flag `allow-key-locking`
//! (`@upstash/ratelimit`'s scripts do), which stock Redis rejects; the endpoint
//! strips that flag before Redis sees the script and maps the script's SHA-1 as the
//! client computed it to the SHA-1 Redis knows, so `EVALSHA` keeps hitting.
//!
//! Hardening: a body size limit (413), strict argument types (400), commands that
//! would block or change the state of a shared connection refused (400), a
//! bounded pool of Redis connections, graceful shutdown, loopback by default.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub use axum::Router;
use axum::body::{Body, Bytes, to_bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::store::resp::RespStore;
use crate::store::resp::wire::Reply;
use crate::store::{StoreError, StoreErrorKind};

/// How the endpoint runs.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    pub redis_url: String,
    /// The bearer token clients must present.
    pub token: String,
    /// Largest accepted request body (bytes).
    pub max_body: usize,
    /// Redis connections (each pipelines many requests).
    pub pool: usize,
    /// Deadline of each Redis call.
    pub deadline: Duration,
}

impl EndpointConfig {
    pub fn new(redis_url: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            redis_url: redis_url.into(),
            token: token.into(),
            max_body: 1024 * 1024,
            pool: 4,
            deadline: Duration::from_secs(5),
        }
    }
}

struct Endpoint {
    pool: Vec<RespStore>,
    next: AtomicUsize,
    token: String,
    max_body: usize,
    /// SHA-1 of a script as its client sent it → SHA-1 of what Redis runs.
    script_shas: std::sync::Mutex<std::collections::HashMap<String, String>>,
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
        let mut map = self.script_shas.lock().expect("script map lock");
        if map.len() >= MAX_MAPPED_SCRIPTS {
            map.clear();
        }
        map.insert(orig.clone(), local);
        orig
    }

    fn local_sha(&self, sha: &[u8]) -> Option<Vec<u8>> {
        let sha = std::str::from_utf8(sha).ok()?.to_ascii_lowercase();
        self.script_shas
            .lock()
            .expect("script map lock")
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
}

/// A reply, with the SHA-1 the client expects when the script was rewritten.
fn fix_reply(reply: Reply, sha: Option<String>) -> Reply {
    match (reply, sha) {
        (Reply::Bulk(Some(_)), Some(sha)) => Reply::Bulk(Some(sha.into_bytes())),
        (reply, _) => reply,
    }
}

/// Builds the endpoint's router, connecting its Redis pool first.
pub async fn router(config: &EndpointConfig) -> Result<Router, StoreError> {
    if config.token.is_empty() {
        return Err(StoreError::new(
            StoreErrorKind::Auth,
            "the endpoint needs a non-empty token",
        ));
    }
    let mut pool = Vec::with_capacity(config.pool.max(1));
    for _ in 0..config.pool.max(1) {
        pool.push(RespStore::connect(&config.redis_url, config.deadline).await?);
    }
    let state = Arc::new(Endpoint {
        pool,
        next: AtomicUsize::new(0),
        token: config.token.clone(),
        max_body: config.max_body,
        script_shas: Default::default(),
    });
    Ok(Router::new().fallback(handle).with_state(state))
}

/// Serves until `shutdown` completes, then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: &EndpointConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    serve_router(listener, router(config).await?, shutdown).await
}

/// Serves an already built [`router`] until `shutdown` completes.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| StoreError::new(StoreErrorKind::Connect, format!("serve: {e}")))
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

fn ok(value: Value) -> Response {
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

fn authorized(ep: &Endpoint, headers: &HeaderMap, uri: &Uri) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|t| same(t, ep.token.as_bytes()));
    let query = uri.query().is_some_and(|q| {
        q.split('&')
            .filter_map(|kv| kv.strip_prefix("_token="))
            .any(|t| same(percent_decode(t).as_slice(), ep.token.as_bytes()))
    });
    bearer || query
}

/// Commands that would block a shared connection or change its state.
const REFUSED: &[&str] = &[
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
    "SHUTDOWN",
    "DEBUG",
    "SLAVEOF",
    "REPLICAOF",
    "FAILOVER",
];

fn refused(args: &[Vec<u8>]) -> Option<String> {
    let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    let blocking_read = (name == "XREAD" || name == "XREADGROUP")
        && args.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK"));
    (REFUSED.contains(&name.as_str()) || blocking_read)
        .then(|| format!("ERR command not allowed over REST: {name}"))
}

/// One command from JSON: a non-empty array of strings and numbers.
fn command_from_json(v: &Value) -> Result<Vec<Vec<u8>>, String> {
    let Value::Array(items) = v else {
        return Err("ERR a command must be a JSON array like [\"SET\",\"key\",\"value\"]".into());
    };
    if items.is_empty() {
        return Err("ERR a command must not be empty".into());
    }
    let args: Vec<Vec<u8>> = items
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Value::String(s) => Ok(s.clone().into_bytes()),
            Value::Number(n) => Ok(n.to_string().into_bytes()),
            other => Err(format!(
                "ERR argument {i} must be a string or a number, got {}",
                kind(other)
            )),
        })
        .collect::<Result<_, _>>()?;
    match refused(&args) {
        Some(e) => Err(e),
        None => Ok(args),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn encode_str(bytes: &[u8], base64: bool) -> Value {
    if base64 {
        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
    } else {
        Value::String(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// A Redis reply as Upstash renders it.
fn to_json(reply: Reply, base64: bool) -> Value {
    match reply {
        Reply::Simple(s) if s == "OK" => Value::String(s),
        Reply::Simple(s) => encode_str(s.as_bytes(), base64),
        Reply::Int(i) => Value::from(i),
        Reply::Bulk(Some(b)) => encode_str(&b, base64),
        Reply::Bulk(None) | Reply::Array(None) => Value::Null,
        Reply::Array(Some(items)) => {
            Value::Array(items.into_iter().map(|r| to_json(r, base64)).collect())
        }
        Reply::Error(e) => json!({ "error": e }),
    }
}

fn outcome(reply: Reply, base64: bool) -> Value {
    match reply {
        Reply::Error(e) => json!({ "error": e }),
        other => json!({ "result": to_json(other, base64) }),
    }
}

fn store_failure(e: StoreError) -> Response {
    let status = match e.kind {
        StoreErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        StoreErrorKind::Connect => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, format!("ERR redis unavailable: {}", e.message))
}

fn percent_decode(s: &str) -> Vec<u8> {
    floodgate_shared::routes::percent_decode(s.as_bytes())
}

async fn handle(
    State(ep): State<Arc<Endpoint>>,
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
    let body: Bytes = match to_bytes(body, ep.max_body).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("ERR request body larger than {} bytes", ep.max_body),
            );
        }
    };
    let store = &ep.pool[ep.next.fetch_add(1, Ordering::Relaxed) % ep.pool.len()];
    let path = uri.path().trim_end_matches('/');
    let response = match path {
        "" => match parse_json(&body).and_then(|v| command_from_json(&v)) {
            Ok(args) => single(&ep, store, args, base64).await,
            Err(e) => error(StatusCode::BAD_REQUEST, e),
        },
        "/pipeline" | "/multi-exec" => match parse_json(&body).and_then(|v| commands_from_json(&v))
        {
            Ok(cmds) if path == "/pipeline" => pipeline(&ep, store, cmds, base64).await,
            Ok(cmds) => multi_exec(&ep, store, cmds, base64).await,
            Err(e) => error(StatusCode::BAD_REQUEST, e),
        },
        _ => {
            let mut args: Vec<Vec<u8>> = path
                .trim_start_matches('/')
                .split('/')
                .map(percent_decode)
                .collect();
            if matches!(method, Method::POST | Method::PUT) && !body.is_empty() {
                args.push(body.to_vec());
            }
            match refused(&args) {
                Some(e) => error(StatusCode::BAD_REQUEST, e),
                None => single(&ep, store, args, base64).await,
            }
        }
    };
    if method == Method::HEAD {
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    response
}

fn parse_json(body: &[u8]) -> Result<Value, String> {
    if body.is_empty() {
        return Err("ERR empty request body; send a JSON array command".into());
    }
    serde_json::from_slice(body).map_err(|e| format!("ERR malformed JSON: {e}"))
}

fn commands_from_json(v: &Value) -> Result<Vec<Vec<Vec<u8>>>, String> {
    let Value::Array(cmds) = v else {
        return Err(
            "ERR expected a JSON array of commands like [[\"SET\",\"k\",\"v\"],[\"GET\",\"k\"]]"
                .into(),
        );
    };
    if cmds.is_empty() {
        return Err("ERR no commands".into());
    }
    cmds.iter()
        .enumerate()
        .map(|(i, c)| command_from_json(c).map_err(|e| format!("{e} (command {i})")))
        .collect()
}

async fn single(ep: &Endpoint, store: &RespStore, args: Vec<Vec<u8>>, base64: bool) -> Response {
    let (args, sha) = ep.prepare(args);
    match store.batch(&[args]).await {
        Ok(mut replies) => match replies.pop().map(|r| fix_reply(r, sha)) {
            Some(Reply::Error(e)) => error(StatusCode::BAD_REQUEST, e),
            Some(r) => ok(json!({ "result": to_json(r, base64) })),
            None => error(StatusCode::INTERNAL_SERVER_ERROR, "ERR no reply"),
        },
        Err(e) => store_failure(e),
    }
}

async fn pipeline(
    ep: &Endpoint,
    store: &RespStore,
    cmds: Vec<Vec<Vec<u8>>>,
    base64: bool,
) -> Response {
    let (cmds, shas): (Vec<_>, Vec<_>) = cmds.into_iter().map(|c| ep.prepare(c)).unzip();
    match store.batch(&cmds).await {
        Ok(replies) => ok(Value::Array(
            replies
                .into_iter()
                .zip(shas)
                .map(|(r, sha)| outcome(fix_reply(r, sha), base64))
                .collect(),
        )),
        Err(e) => store_failure(e),
    }
}

async fn multi_exec(
    ep: &Endpoint,
    store: &RespStore,
    cmds: Vec<Vec<Vec<u8>>>,
    base64: bool,
) -> Response {
    let (cmds, shas): (Vec<_>, Vec<_>) = cmds.into_iter().map(|c| ep.prepare(c)).unzip();
    let n = cmds.len();
    let mut batch = Vec::with_capacity(n + 2);
    batch.push(vec![b"MULTI".to_vec()]);
    batch.extend(cmds);
    batch.push(vec![b"EXEC".to_vec()]);
    match store.batch(&batch).await {
        Ok(mut replies) => match replies.pop() {
            Some(Reply::Array(Some(results))) if results.len() == n => ok(Value::Array(
                results
                    .into_iter()
                    .zip(shas)
                    .map(|(r, sha)| outcome(fix_reply(r, sha), base64))
                    .collect(),
            )),
            Some(Reply::Error(e)) => error(StatusCode::BAD_REQUEST, e),
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

    #[test]
    fn json_commands_take_strings_and_numbers_only() {
        assert_eq!(
            command_from_json(&json!(["SET", "k", 10, 1.5])).unwrap(),
            vec![
                b"SET".to_vec(),
                b"k".to_vec(),
                b"10".to_vec(),
                b"1.5".to_vec()
            ]
        );
        for bad in [
            json!([]),
            json!("GET"),
            json!(["GET", ["k"]]),
            json!(["GET", null]),
            json!(["GET", true]),
            json!(["GET", {"a": 1}]),
            json!({"cmd": "GET"}),
        ] {
            assert!(command_from_json(&bad).is_err(), "{bad}");
        }
        for blocked in [
            json!(["multi"]),
            json!(["BLPOP", "k", 0]),
            json!(["xread", "block", 0, "streams", "s", "$"]),
            json!(["select", 1]),
            json!(["client", "kill"]),
        ] {
            assert!(
                command_from_json(&blocked)
                    .unwrap_err()
                    .contains("not allowed"),
                "{blocked}"
            );
        }
    }

    #[test]
    fn replies_render_like_upstash() {
        assert_eq!(to_json(Reply::Simple("OK".into()), true), json!("OK"));
        assert_eq!(
            to_json(Reply::Simple("PONG".into()), true),
            json!("UE9ORw==")
        );
        assert_eq!(
            to_json(Reply::Bulk(Some(b"bar".to_vec())), true),
            json!("YmFy")
        );
        assert_eq!(
            to_json(Reply::Bulk(Some(b"bar".to_vec())), false),
            json!("bar")
        );
        assert_eq!(to_json(Reply::Bulk(None), true), Value::Null);
        assert_eq!(
            to_json(
                Reply::Array(Some(vec![Reply::Int(3), Reply::Bulk(None)])),
                false
            ),
            json!([3, null])
        );
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
