//! Redis over HTTPS with Upstash's REST protocol: the store the Worker uses.
//!
//! Built on `reqwest`, so the same code runs inside the Worker (wasm32, `fetch`) and
//! natively (hosts, dashboard, tests). Every call has a deadline; every error says
//! whether retrying can help ([`StoreError::is_retryable`]).
//!
//! Protocol (see `../shared/notes/upstash-rest.md`): `POST <base>` with a JSON array
//! command; `POST <base>/pipeline` and `POST <base>/multi-exec` with an array of
//! commands; `Authorization: Bearer <token>`; success `{"result": ...}`, failure
//! HTTP 400 `{"error": "..."}`. With `Upstash-Encoding: base64` every string in a
//! result is base64 except `"OK"`; this client asks for it on generic commands (so
//! binary values survive JSON) and not on the token-bucket script, whose reply holds
//! only integers.
//!
//! Bucket checks are auto-pipelined: checks that callers start while another is
//! being prepared travel together in ONE `/pipeline` request (each still its own
//! atomic `EVALSHA`), the way `@upstash/redis` batches concurrent commands. The
//! first caller of a batch yields once to the executor, then sends what has queued.

use std::time::Duration;

use base64::Engine as _;
use floodgate_shared::Micros;
use floodgate_shared::script::{
    Check, IN_FLIGHT, LuaScript, REFUND, Verdict, When, refund_call, script_call,
};
use serde_json::Value;

use super::{BucketStore, MaybeSend, StoreError, StoreErrorKind};
use crate::timer::Stopwatch;

/// A value in a REST reply, strings already decoded from base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestValue {
    Null,
    Int(i64),
    Bytes(Vec<u8>),
    Array(Vec<RestValue>),
}

impl RestValue {
    /// The value as text, when it is a UTF-8 string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            RestValue::Bytes(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
}

/// One command's outcome inside `/pipeline` or `/multi-exec`: a value, or the
/// error Redis answered for that command alone.
pub type Outcome = Result<RestValue, String>;

/// A Redis database behind an Upstash-protocol REST endpoint. Cheap to clone;
/// clones share connections and the auto-pipelining queue.
#[derive(Clone)]
pub struct RestStore {
    client: reqwest::Client,
    base: String,
    auth: String,
    deadline: Duration,
    queue: std::sync::Arc<std::sync::Mutex<Vec<Queued>>>,
}

type ScriptResult = Result<Vec<i64>, StoreError>;

/// A bucket check waiting for the next `/pipeline` request.
struct Queued {
    script: &'static LuaScript,
    /// `EVAL` with the source (after NOSCRIPT) rather than `EVALSHA`.
    by_source: bool,
    keys: Vec<String>,
    args: Vec<String>,
    reply: futures_channel::oneshot::Sender<ScriptResult>,
}

/// The most checks one `/pipeline` request carries.
const MAX_BATCH: usize = 256;

/// Returns `Pending` once (waking itself), so other tasks run before the batch goes.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// Held by a batch's first caller until it has taken the queue: if that caller is
/// dropped first (cancelled), the queued checks fail instead of waiting forever.
struct LeaderGuard<'a> {
    queue: &'a std::sync::Mutex<Vec<Queued>>,
    armed: bool,
}

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            for q in std::mem::take(&mut *self.queue.lock().expect("queue lock")) {
                let _ = q.reply.send(Err(err(
                    StoreErrorKind::Connect,
                    "batch abandoned by its sender",
                )));
            }
        }
    }
}

fn err(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
    StoreError::new(kind, message)
}

fn decode_value(v: Value, base64: bool) -> Result<RestValue, StoreError> {
    Ok(match v {
        Value::Null => RestValue::Null,
        Value::Number(n) => RestValue::Int(
            n.as_i64()
                .ok_or_else(|| err(StoreErrorKind::Protocol, format!("non-integer number {n}")))?,
        ),
        Value::String(s) if base64 && s != "OK" => RestValue::Bytes(
            base64::engine::general_purpose::STANDARD
                .decode(s.as_bytes())
                .map_err(|e| {
                    err(
                        StoreErrorKind::Protocol,
                        format!("bad base64 in result: {e}"),
                    )
                })?,
        ),
        Value::String(s) => RestValue::Bytes(s.into_bytes()),
        Value::Array(items) => RestValue::Array(
            items
                .into_iter()
                .map(|i| decode_value(i, base64))
                .collect::<Result<_, _>>()?,
        ),
        other => {
            return Err(err(
                StoreErrorKind::Protocol,
                format!("unexpected value {other}"),
            ));
        }
    })
}

/// `{"result": v}` → Ok(v); `{"error": e}` → Err(e).
fn decode_outcome(v: Value, base64: bool) -> Result<Outcome, StoreError> {
    let Value::Object(mut map) = v else {
        return Err(err(
            StoreErrorKind::Protocol,
            "expected an object with result or error",
        ));
    };
    if let Some(e) = map.remove("error") {
        return Ok(Err(e
            .as_str()
            .map_or_else(|| e.to_string(), str::to_string)));
    }
    match map.remove("result") {
        Some(r) => Ok(Ok(decode_value(r, base64)?)),
        None => Err(err(
            StoreErrorKind::Protocol,
            "object has neither result nor error",
        )),
    }
}

impl RestStore {
    /// `url` is the database's REST URL (`UPSTASH_REDIS_REST_URL`), `token` its
    /// bearer token; `deadline` bounds each call, fallbacks included.
    pub fn new(url: &str, token: &str, deadline: Duration) -> Result<Self, StoreError> {
        let base = url.trim_end_matches('/').to_string();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(err(
                StoreErrorKind::Protocol,
                format!("REST URL must be http(s)://, got {base:?}"),
            ));
        }
        if token.is_empty() || token.chars().any(|c| c.is_control() || c == ' ') {
            return Err(err(
                StoreErrorKind::Auth,
                "REST token is empty or has spaces/control characters",
            ));
        }
        let builder = reqwest::Client::builder();
        #[cfg(not(target_arch = "wasm32"))]
        let builder = builder.tcp_nodelay(true).pool_max_idle_per_host(256);
        let client = builder
            .build()
            .map_err(|e| err(StoreErrorKind::Protocol, e.to_string()))?;
        Ok(Self {
            client,
            base,
            auth: format!("Bearer {token}"),
            deadline,
            queue: Default::default(),
        })
    }

    /// POSTs a JSON body to `path` and returns the decoded JSON reply. HTTP 400 with
    /// `{"error"}` is `Ok` (the caller decides what a Redis error means).
    async fn post(&self, path: &str, body: String, base64: bool) -> Result<Value, StoreError> {
        self.post_within(path, body, base64, self.deadline).await
    }

    async fn post_within(
        &self,
        path: &str,
        body: String,
        base64: bool,
        limit: Duration,
    ) -> Result<Value, StoreError> {
        let mut req = self
            .client
            .post(format!("{}{path}", self.base))
            .header("Authorization", &self.auth)
            .header("Content-Type", "application/json")
            .timeout(limit)
            .body(body);
        if base64 {
            req = req.header("Upstash-Encoding", "base64");
        }
        let resp = req.send().await.map_err(classify)?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(classify)?;
        let parsed: Result<Value, _> = serde_json::from_slice(&bytes);
        match (status, parsed) {
            (200 | 400, Ok(v)) => Ok(v),
            (401 | 403, _) => Err(err(
                StoreErrorKind::Auth,
                format!("HTTP {status}: {}", snippet(&bytes)),
            )),
            (500..=599, _) => Err(err(
                StoreErrorKind::Connect,
                format!("HTTP {status}: {}", snippet(&bytes)),
            )),
            (_, _) => Err(err(
                StoreErrorKind::Protocol,
                format!("HTTP {status}: {}", snippet(&bytes)),
            )),
        }
    }

    /// Runs one command. A Redis error is `Err` with kind `Redis`.
    pub async fn command(&self, args: &[&str]) -> Result<RestValue, StoreError> {
        let v = self.post("", json_array(args), true).await?;
        decode_outcome(v, true)?.map_err(|e| err(StoreErrorKind::Redis, e))
    }

    /// Runs several commands in ONE HTTP round trip (not atomic).
    pub async fn pipeline(&self, commands: &[&[&str]]) -> Result<Vec<Outcome>, StoreError> {
        self.batch("/pipeline", commands).await
    }

    /// Runs several commands atomically (MULTI/EXEC) in one HTTP round trip.
    pub async fn multi_exec(&self, commands: &[&[&str]]) -> Result<Vec<Outcome>, StoreError> {
        self.batch("/multi-exec", commands).await
    }

    async fn batch(&self, path: &str, commands: &[&[&str]]) -> Result<Vec<Outcome>, StoreError> {
        let body = format!(
            "[{}]",
            commands
                .iter()
                .map(|c| json_array(c))
                .collect::<Vec<_>>()
                .join(",")
        );
        match self.post(path, body, true).await? {
            Value::Array(items) => {
                if items.len() != commands.len() {
                    return Err(err(
                        StoreErrorKind::Protocol,
                        format!("{} results for {} commands", items.len(), commands.len()),
                    ));
                }
                items.into_iter().map(|i| decode_outcome(i, true)).collect()
            }
            // a discarded transaction, or a request the server refused as a whole
            other => match decode_outcome(other, true)? {
                Err(e) => Err(err(StoreErrorKind::Redis, e)),
                Ok(v) => Err(err(
                    StoreErrorKind::Protocol,
                    format!("expected an array, got {v:?}"),
                )),
            },
        }
    }
}

impl RestStore {
    /// The token-bucket script through the auto-pipelining queue.
    async fn eval_batched(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: Vec<String>,
    ) -> ScriptResult {
        let (reply, rx) = futures_channel::oneshot::channel();
        let queued = Queued {
            script,
            by_source: false,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            args,
            reply,
        };
        let leader = {
            let mut q = self.queue.lock().expect("queue lock");
            q.push(queued);
            q.len() == 1
        };
        if leader {
            let mut guard = LeaderGuard {
                queue: &self.queue,
                armed: true,
            };
            YieldOnce(false).await;
            let batch = std::mem::take(&mut *self.queue.lock().expect("queue lock"));
            guard.armed = false;
            drop(guard);
            let started = Stopwatch::start();
            for chunk in into_chunks(batch, MAX_BATCH) {
                self.flush(chunk, &started).await;
            }
        }
        rx.await.unwrap_or_else(|_| {
            Err(err(
                StoreErrorKind::Connect,
                "batch abandoned by its sender",
            ))
        })
    }

    /// Sends one `/pipeline` of script calls; entries answered `NOSCRIPT` go again
    /// as `EVAL` in a second `/pipeline`, within the same deadline. (`EVAL`, not
    /// `SCRIPT LOAD`: Upstash's global replicas may lack a script another region
    /// loaded; `EVAL` always works.)
    async fn flush(&self, mut batch: Vec<Queued>, started: &Stopwatch) {
        for attempt in 0..2 {
            let left = self.deadline.saturating_sub(started.elapsed());
            if left.is_zero() {
                for q in batch {
                    let _ = q.reply.send(Err(err(
                        StoreErrorKind::Timeout,
                        format!("no reply within {:?}", self.deadline),
                    )));
                }
                return;
            }
            let body = format!(
                "[{}]",
                batch.iter().map(script_json).collect::<Vec<_>>().join(",")
            );
            let items = match self.post_within("/pipeline", body, false, left).await {
                Ok(Value::Array(items)) if items.len() == batch.len() => items,
                Ok(other) => {
                    let e = err(
                        StoreErrorKind::Protocol,
                        format!(
                            "unexpected /pipeline reply {}",
                            snippet(other.to_string().as_bytes())
                        ),
                    );
                    for q in batch {
                        let _ = q.reply.send(Err(e.clone()));
                    }
                    return;
                }
                Err(e) => {
                    for q in batch {
                        let _ = q.reply.send(Err(e.clone()));
                    }
                    return;
                }
            };
            let mut again = vec![];
            for (mut q, item) in batch.into_iter().zip(items) {
                match script_outcome(item) {
                    Err(e)
                        if attempt == 0
                            && e.kind == StoreErrorKind::Redis
                            && e.message.starts_with("NOSCRIPT") =>
                    {
                        q.by_source = true;
                        again.push(q);
                    }
                    result => {
                        let _ = q.reply.send(result);
                    }
                }
            }
            if again.is_empty() {
                return;
            }
            batch = again;
        }
    }
}

fn into_chunks(mut batch: Vec<Queued>, size: usize) -> Vec<Vec<Queued>> {
    let mut out = vec![];
    while batch.len() > size {
        let rest = batch.split_off(size);
        out.push(batch);
        batch = rest;
    }
    out.push(batch);
    out
}

fn script_json(q: &Queued) -> String {
    let numkeys = q.keys.len().to_string();
    json_array(&q.script.call_words(
        q.by_source,
        &numkeys,
        q.keys.iter().map(String::as_str),
        &q.args,
    ))
}

/// `{"result": [ints]}` → the integers; `{"error": e}` → a Redis error.
fn script_outcome(item: Value) -> ScriptResult {
    match decode_outcome(item, false)? {
        Ok(RestValue::Array(values)) => values
            .into_iter()
            .map(|v| match v {
                RestValue::Int(i) => Ok(i),
                other => Err(err(
                    StoreErrorKind::Protocol,
                    format!("non-integer {other:?}"),
                )),
            })
            .collect(),
        Ok(other) => Err(err(
            StoreErrorKind::Protocol,
            format!("unexpected script reply {other:?}"),
        )),
        Err(e) => Err(err(StoreErrorKind::Redis, e)),
    }
}

impl super::RecordStore for RestStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.command(&["PING"]).await.map(|_| ())
    }

    async fn write_batch(&self, commands: Vec<Vec<String>>) -> Result<(), StoreError> {
        let parts: Vec<Vec<&str>> = commands
            .iter()
            .map(|c| c.iter().map(String::as_str).collect())
            .collect();
        let refs: Vec<&[&str]> = parts.iter().map(Vec::as_slice).collect();
        for outcome in self.pipeline(&refs).await? {
            outcome.map_err(|e| err(StoreErrorKind::Redis, e))?;
        }
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        get_value(self.command(&["GET", key]).await)
    }

    /// One `/pipeline` of `GET`s: one HTTP round trip for a cold cache.
    async fn get_many(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let commands: Vec<[&str; 2]> = keys.iter().map(|k| ["GET", k]).collect();
        let refs: Vec<&[&str]> = commands.iter().map(|c| c.as_slice()).collect();
        self.pipeline(&refs)
            .await?
            .into_iter()
            .map(|o| get_value(o.map_err(|e| err(StoreErrorKind::Redis, e))))
            .collect()
    }
}

impl BucketStore for RestStore {
    async fn run(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        self.eval_batched(script, keys, args.to_vec()).await
    }

    async fn check(
        &self,
        checks: &[Check<'_>],
        when: impl Into<When> + MaybeSend,
    ) -> Result<Verdict, StoreError> {
        let (script, args) = script_call(checks, when)?;
        let keys: Vec<&str> = checks.iter().map(|c| c.key).collect();
        let reply = self.eval_batched(script, &keys, args).await?;
        super::verdict(checks, &reply)
    }

    async fn refund(&self, checks: &[Check<'_>], verdict: &Verdict) -> Result<(), StoreError> {
        match refund_call(checks, verdict) {
            Some((keys, args)) => self.eval_batched(&REFUND, &keys, args).await.map(|_| ()),
            None => Ok(()),
        }
    }

    async fn acquire_slot(
        &self,
        key: &str,
        id: &str,
        limit: u32,
        ttl_ms: u64,
        until: Option<Micros>,
    ) -> Result<bool, StoreError> {
        let args = super::slot_args(id, limit, ttl_ms, until);
        super::slot_taken(&self.eval_batched(&IN_FLIGHT, &[key], args).await?)
    }

    async fn release_slot(&self, key: &str, id: &str) -> Result<(), StoreError> {
        self.command(&["ZREM", key, id]).await.map(|_| ())
    }
}

/// A `GET` reply: the value, `None` when absent or not a string (`WRONGTYPE`).
fn get_value(reply: Result<RestValue, StoreError>) -> Result<Option<Vec<u8>>, StoreError> {
    match reply {
        Ok(RestValue::Bytes(b)) => Ok(Some(b)),
        Ok(RestValue::Null) => Ok(None),
        Ok(other) => Err(err(
            StoreErrorKind::Protocol,
            format!("unexpected GET reply {other:?}"),
        )),
        Err(e) if e.kind == StoreErrorKind::Redis && e.message.starts_with("WRONGTYPE") => Ok(None),
        Err(e) => Err(e),
    }
}

fn json_array(args: &[&str]) -> String {
    serde_json::to_string(args).expect("strings always serialize")
}

fn snippet(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned()
}

fn classify(e: reqwest::Error) -> StoreError {
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_decode() || e.is_body() || e.is_builder() {
        StoreErrorKind::Protocol
    } else {
        // connect failures, resets, aborted requests: the network, not the request
        StoreErrorKind::Connect
    };
    err(kind, e.to_string())
}
