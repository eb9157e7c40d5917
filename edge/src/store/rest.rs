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
//! binary values survive JSON) and not on script calls, whose replies Floodgate
//! keeps to integers.
//!
//! Script calls are auto-pipelined ([`super::batch`]): calls that callers start
//! while another is being prepared travel together in ONE `/pipeline` request.

use std::time::Duration;

use base64::Engine as _;
use floodgate_shared::script::LuaScript;
use serde_json::Value as Json;

use super::batch::{Batcher, ScriptCall, SendScripts};
use super::{Store, StoreError, StoreErrorKind, Value};

/// A Redis database behind an Upstash-protocol REST endpoint. Cheap to clone;
/// clones share connections and the auto-pipelining queue.
#[derive(Clone)]
pub struct RestStore {
    client: reqwest::Client,
    base: String,
    auth: String,
    deadline: Duration,
    batch: std::sync::Arc<Batcher>,
}

fn err(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
    StoreError::new(kind, message)
}

fn decode_value(v: Json, base64: bool) -> Result<Value, StoreError> {
    Ok(match v {
        Json::Null => Value::Nil,
        Json::Number(n) => Value::Int(
            n.as_i64()
                .ok_or_else(|| StoreError::protocol(format!("non-integer number {n}")))?,
        ),
        Json::String(s) if base64 && s != "OK" => Value::Bulk(
            base64::engine::general_purpose::STANDARD
                .decode(s.as_bytes())
                .map_err(|e| StoreError::protocol(format!("bad base64 in result: {e}")))?,
        ),
        Json::String(s) => Value::Bulk(s.into_bytes()),
        Json::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|i| decode_value(i, base64))
                .collect::<Result<_, _>>()?,
        ),
        other => return Err(StoreError::protocol(format!("unexpected value {other}"))),
    })
}

/// `{"result": v}` → v; `{"error": e}` → [`Value::Error`] (Redis' own text).
fn decode_outcome(v: Json, base64: bool) -> Result<Value, StoreError> {
    let Json::Object(mut map) = v else {
        return Err(StoreError::protocol(
            "expected an object with result or error",
        ));
    };
    if let Some(e) = map.remove("error") {
        return Ok(Value::Error(StoreError::reply(
            e.as_str().map_or_else(|| e.to_string(), str::to_string),
        )));
    }
    match map.remove("result") {
        Some(r) => decode_value(r, base64),
        None => Err(StoreError::protocol("object has neither result nor error")),
    }
}

/// A command's words as JSON strings (the protocol carries text).
fn json_command(args: &[&[u8]]) -> Result<String, StoreError> {
    let words = args
        .iter()
        .map(|a| {
            std::str::from_utf8(a)
                .map_err(|_| StoreError::protocol("a REST command's arguments must be UTF-8"))
        })
        .collect::<Result<Vec<&str>, _>>()?;
    Ok(json_array(&words))
}

impl RestStore {
    /// `url` is the database's REST URL (`UPSTASH_REDIS_REST_URL`), `token` its
    /// bearer token; `deadline` bounds each call, fallbacks included.
    pub fn new(url: &str, token: &str, deadline: Duration) -> Result<Self, StoreError> {
        Self::with_ca(url, token, deadline, None)
    }

    /// [`RestStore::new`], trusting the CA certificates of `ca_pem` for `https://`
    /// as well (a private endpoint).
    pub fn with_ca(
        url: &str,
        token: &str,
        deadline: Duration,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, StoreError> {
        let base = url.trim_end_matches('/').to_string();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(StoreError::protocol(format!(
                "REST URL must be http(s)://, got {base:?}"
            )));
        }
        if token.is_empty() || token.chars().any(|c| c.is_control() || c == ' ') {
            return Err(err(
                StoreErrorKind::Auth,
                "REST token is empty or has spaces/control characters",
            ));
        }
        let builder = reqwest::Client::builder();
        // idle connections are dropped before a server's keep-alive timeout
        // (floodgate-rest closes them after 10 s) can race a request
        #[cfg(not(target_arch = "wasm32"))]
        let builder = builder
            .tcp_nodelay(true)
            .pool_max_idle_per_host(256)
            .pool_idle_timeout(Duration::from_secs(4));
        #[cfg(all(not(target_arch = "wasm32"), feature = "native"))]
        let builder = match ca_pem {
            Some(pem) => reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| StoreError::protocol(format!("CA file: {e}")))?
                .into_iter()
                .fold(builder, |b, cert| b.add_root_certificate(cert)),
            None => builder,
        };
        #[cfg(any(target_arch = "wasm32", not(feature = "native")))]
        let _ = ca_pem;
        let client = builder
            .build()
            .map_err(|e| StoreError::protocol(e.to_string()))?;
        Ok(Self {
            client,
            base,
            auth: format!("Bearer {token}"),
            deadline,
            // a Worker's requests are separate events: one's call never rides
            // another's fetch (`Batcher::alone`)
            batch: std::sync::Arc::new(if cfg!(target_arch = "wasm32") {
                Batcher::alone()
            } else {
                Batcher::default()
            }),
        })
    }

    /// POSTs a JSON body to `path` within `limit` and returns the decoded JSON
    /// reply. HTTP 400 with `{"error"}` is `Ok` (the caller decides what a Redis
    /// error means).
    async fn post(
        &self,
        path: &str,
        body: String,
        base64: bool,
        limit: Duration,
    ) -> Result<Json, StoreError> {
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
        let parsed: Result<Json, _> = serde_json::from_slice(&bytes);
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
            (_, _) => Err(StoreError::protocol(format!(
                "HTTP {status}: {}",
                snippet(&bytes)
            ))),
        }
    }

    /// Several commands atomically (MULTI/EXEC) in one HTTP round trip; a
    /// discarded transaction is `Err` with kind `Redis(ExecAbort)`.
    pub async fn multi_exec(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, StoreError> {
        self.batch_of("/multi-exec", commands).await
    }

    async fn batch_of(
        &self,
        path: &str,
        commands: &[Vec<Vec<u8>>],
    ) -> Result<Vec<Value>, StoreError> {
        let mut body = String::from("[");
        for (i, c) in commands.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            let words: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
            body.push_str(&json_command(&words)?);
        }
        body.push(']');
        match self.post(path, body, true, self.deadline).await? {
            Json::Array(items) => {
                if items.len() != commands.len() {
                    return Err(StoreError::protocol(format!(
                        "{} results for {} commands",
                        items.len(),
                        commands.len()
                    )));
                }
                items.into_iter().map(|i| decode_outcome(i, true)).collect()
            }
            // a discarded transaction, or a request the server refused as a whole
            other => match decode_outcome(other, true)? {
                Value::Error(e) => Err(e),
                v => Err(StoreError::protocol(format!(
                    "expected an array, got {v:?}"
                ))),
            },
        }
    }
}

impl SendScripts for RestStore {
    async fn send_scripts(
        &self,
        calls: &[ScriptCall],
        limit: Duration,
    ) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        let body = format!(
            "[{}]",
            calls
                .iter()
                .map(|c| json_array(&c.words()))
                .collect::<Vec<_>>()
                .join(",")
        );
        match self.post("/pipeline", body, false, limit).await? {
            Json::Array(items) => items
                .into_iter()
                .map(|i| decode_outcome(i, false).map(Value::ok))
                .collect(),
            other => Err(StoreError::protocol(format!(
                "unexpected /pipeline reply {}",
                snippet(other.to_string().as_bytes())
            ))),
        }
    }
}

impl Store for RestStore {
    async fn run(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let call = ScriptCall::new(script, keys, args);
        self.batch.run(self, self.deadline, call).await
    }

    async fn command(&self, args: &[&[u8]]) -> Result<Value, StoreError> {
        let v = self
            .post("", json_command(args)?, true, self.deadline)
            .await?;
        decode_outcome(v, true)?.ok()
    }

    async fn pipeline(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, StoreError> {
        if commands.is_empty() {
            return Ok(vec![]);
        }
        self.batch_of("/pipeline", commands).await
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
