//! One Redis server over RESP (directly, or the primary that Sentinel names),
//! through redis-rs' multiplexed connection: one connection shared by every task
//! of the host, with TLS (`rediss://`, rustls; the system roots or a CA file) and
//! ACL users (`user:password@`, also to the Sentinels and their own password).
//!
//! What is ours on top of the client:
//! - script calls are auto-pipelined ([`super::batch`]), `EVALSHA` with `EVAL` in
//!   the same call on `NOSCRIPT`;
//! - every call has a deadline, reconnection included; a connection is opened in
//!   a background task that callers wait on only within their own deadline (a
//!   TLS handshake longer than a 3 ms deadline still completes for the next call);
//! - a connection is replaced when it is lost, when it answers `READONLY` (after
//!   a failover it leads to a demoted primary; Sentinel is asked again), and when
//!   it goes silent: a call that times out while nothing at all arrived on its
//!   connection since it was sent starts one probe (`PING`); a probe that gets no
//!   answer within [`silence`](StoreOptions::silence) drops the connection, so a
//!   peer that stops answering without closing (a dead NAT entry, a frozen proxy)
//!   is left behind instead of timing out every call forever;
//! - the request queue is bounded (redis-rs' pipeline channel): callers wait for
//!   room within their deadline, never without bound.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_shared::script::LuaScript;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo, TlsCertificates, TlsMode};
use tokio::sync::watch;

use super::batch::{Batcher, ScriptCall, SendScripts};
use super::convert::{connection_lost, error, value};
use super::native::StoreOptions;
use super::{RedisErrorKind, Store, StoreError, StoreErrorKind, Value, lock};

/// The default per-call deadline, reconnection included: inside the 5 ms budget
/// with room for the rest of the request. A healthy store on loopback answers the
/// bucket check in ~0.06-0.1 ms (p50), p99 0.2 ms without persistence and 1.4-3.7
/// ms with an fsync-every-second append-only file on a saturated 2-core machine
/// (`docs/failure.md`), so 3 ms cuts off a store that is hung or overloaded.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(3);

/// Requests queued for one connection at most (redis-rs' pipeline channel); more
/// callers wait for room, within their deadline.
pub const QUEUE_BOUND: usize = 1024;

/// Where connections go.
enum Source {
    Direct(redis::Client),
    /// Ask the Sentinels for the current primary at each connect.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

/// A connection in use, and what the store knows about its health.
struct Live {
    conn: MultiplexedConnection,
    /// When the last reply (any reply) arrived, µs since the store's epoch.
    heard: AtomicU64,
    /// Replaced: the next call opens another connection.
    dead: AtomicBool,
    /// A silence probe is running on it.
    probing: AtomicBool,
}

type Connecting = watch::Receiver<Option<Result<Arc<Live>, StoreError>>>;

/// A Redis server reached over RESP. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RespStore {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    config: redis::AsyncConnectionConfig,
    deadline: Duration,
    connect_limit: Duration,
    silence: Duration,
    epoch: Instant,
    live: Mutex<Option<Arc<Live>>>,
    connecting: Mutex<Option<Connecting>>,
    batch: Batcher,
}

impl RespStore {
    /// Connects to `url` with `deadline` per call: `redis://[user:password@]host:port[/db]`,
    /// `rediss://...` (TLS, verified against the system roots), `redis+unix:///path`,
    /// or `redis+sentinel://[user:password@]host:port[,host:port...]/<master>`
    /// (`rediss+sentinel://` for TLS; the Sentinels' own credentials as
    /// `?sentinel_username=..&sentinel_password=..`).
    pub async fn connect(url: &str, deadline: Duration) -> Result<Self, StoreError> {
        Self::connect_with(&StoreOptions::new(url, deadline)).await
    }

    /// Connects with every option (a CA file, the silence limit).
    pub async fn connect_with(options: &StoreOptions) -> Result<Self, StoreError> {
        let ca = options.ca_pem()?;
        let source = if let Some(sentinel) = options.url.strip_prefix("redis+sentinel://") {
            Source::Sentinel(tokio::sync::Mutex::new(sentinel_client(
                sentinel,
                false,
                ca,
                &options.url,
            )?))
        } else if let Some(sentinel) = options.url.strip_prefix("rediss+sentinel://") {
            Source::Sentinel(tokio::sync::Mutex::new(sentinel_client(
                sentinel,
                true,
                ca,
                &options.url,
            )?))
        } else {
            Source::Direct(direct_client(&options.url, ca)?)
        };
        let connect_limit = options.deadline.max(Duration::from_secs(1));
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_limit))
            // our own deadline bounds every call (and tells a silent peer apart)
            .set_response_timeout(None)
            .set_pipeline_buffer_size(QUEUE_BOUND);
        let store = Self {
            inner: Arc::new(Inner {
                source,
                config,
                deadline: options.deadline,
                connect_limit,
                silence: options.silence(),
                epoch: Instant::now(),
                live: Mutex::new(None),
                connecting: Mutex::new(None),
                batch: Batcher::default(),
            }),
        };
        // the first connection in full: a wrong password or CA fails here, clearly
        let first = tokio::time::timeout(connect_limit, store.live())
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    format!("connect: no answer within {connect_limit:?}"),
                ))
            });
        match first {
            Ok(_) => Ok(store),
            Err(e)
                if options.start_unreachable
                    && matches!(e.kind, StoreErrorKind::Connect | StoreErrorKind::Timeout) =>
            {
                let e = super::native::at_connect(e, &options.url);
                tracing::warn!(
                    target: "floodgate::store",
                    error = %e,
                    "not reachable yet ({e}): starting anyway; calls fail (failure modes answer) until it answers"
                );
                Ok(store)
            }
            Err(e) => Err(super::native::at_connect(e, &options.url)),
        }
    }

    /// The per-call deadline.
    pub fn deadline(&self) -> Duration {
        self.inner.deadline
    }

    fn now_us(&self) -> u64 {
        self.inner.epoch.elapsed().as_micros() as u64
    }

    /// The live connection, or one being opened (in a background task, shared by
    /// every caller; each waits only as long as its own deadline allows).
    async fn live(&self) -> Result<Arc<Live>, StoreError> {
        if let Some(l) = lock(&self.inner.live).clone()
            && !l.dead.load(Ordering::Acquire)
        {
            return Ok(l);
        }
        let mut rx = {
            let mut connecting = lock(&self.inner.connecting);
            let reuse = match connecting.as_ref().map(|rx| rx.borrow().clone()) {
                // an attempt in progress
                Some(None) => true,
                // a fresh success nobody has marked dead yet
                Some(Some(Ok(l))) => !l.dead.load(Ordering::Acquire),
                Some(Some(Err(_))) | None => false,
            };
            if !reuse {
                *connecting = Some(self.spawn_connect());
            }
            connecting.clone().expect("set above")
        };
        let outcome = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| StoreError::new(StoreErrorKind::Connect, "connect task ended"))?
            .clone();
        outcome.expect("waited for Some")
    }

    fn spawn_connect(&self) -> Connecting {
        let (tx, rx) = watch::channel(None);
        let store = self.clone();
        tokio::spawn(async move {
            let limit = store.inner.connect_limit;
            let outcome = match tokio::time::timeout(limit, store.open()).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    format!("connect: no answer within {limit:?}"),
                )),
            };
            if let Ok(l) = &outcome {
                *lock(&store.inner.live) = Some(l.clone());
            }
            let _ = tx.send(Some(outcome));
        });
        rx
    }

    /// Opens a connection (asking the Sentinels first) and checks it answers.
    async fn open(&self) -> Result<Arc<Live>, StoreError> {
        let client = match &self.inner.source {
            Source::Direct(c) => c.clone(),
            Source::Sentinel(s) => s.lock().await.async_get_client().await.map_err(error)?,
        };
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.inner.config)
            .await
            .map_err(error)?;
        // a round trip, so a connection that cannot answer is not taken for one
        let pong = conn
            .req_packed_command(&redis::cmd("PING"))
            .await
            .map_err(error)?;
        value(pong).ok()?;
        Ok(Arc::new(Live {
            conn,
            heard: AtomicU64::new(self.now_us()),
            dead: AtomicBool::new(false),
            probing: AtomicBool::new(false),
        }))
    }

    /// Runs `op` on the live connection within `limit`, keeping track of the
    /// connection's health. A connection found closed (the server restarted or
    /// failed over while it was idle: the client learns it only when it sends)
    /// is replaced and `op` sent once more on the new one, within the same
    /// limit — at least once, as Redis clients that reconnect do: a server that
    /// died after running the call and before its reply could run it twice.
    async fn exchange<T, F, Fut>(&self, limit: Duration, op: F) -> Result<T, StoreError>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let sent = self.now_us();
        let mut used: Option<Arc<Live>> = None;
        let work = async {
            let mut again = true;
            loop {
                let live = self.live().await?;
                used = Some(live.clone());
                match op(live.conn.clone()).await {
                    Ok(v) => {
                        live.heard.store(self.now_us(), Ordering::Release);
                        return Ok(v);
                    }
                    Err(e) if connection_lost(&e) => {
                        live.dead.store(true, Ordering::Release);
                        // closed or reset, not a timeout or a refused connect
                        if std::mem::take(&mut again) && e.is_connection_dropped() {
                            continue;
                        }
                        return Err(error(e));
                    }
                    Err(e) => return Err(error(e)),
                }
            }
        };
        match tokio::time::timeout(limit, work).await {
            Ok(r) => r,
            Err(_) => {
                if let Some(live) = used {
                    self.suspect(live, sent);
                }
                Err(StoreError::timeout(limit))
            }
        }
    }

    /// A call on `live` sent at `sent` timed out. If nothing at all arrived on the
    /// connection since, probe it once; no answer within the silence limit and
    /// the connection is replaced.
    fn suspect(&self, live: Arc<Live>, sent: u64) {
        if live.heard.load(Ordering::Acquire) >= sent || live.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let mut conn = live.conn.clone();
            let ping = redis::cmd("PING");
            let answered =
                tokio::time::timeout(store.inner.silence, conn.req_packed_command(&ping)).await;
            match answered {
                Ok(Ok(_)) => live.heard.store(store.now_us(), Ordering::Release),
                _ => live.dead.store(true, Ordering::Release),
            }
            live.probing.store(false, Ordering::Release);
        });
    }

    /// A reply that says the connection leads to a replica: replace it.
    fn check_role(&self, v: &Value) {
        if let Value::Error(e) = v
            && e.redis() == Some(RedisErrorKind::ReadOnly)
            && let Some(l) = lock(&self.inner.live).as_ref()
        {
            l.dead.store(true, Ordering::Release);
        }
    }

    /// Sends `commands` back to back on one connection within `limit` (a
    /// MULTI ... EXEC batch stays atomic); one reply per command.
    async fn send(
        &self,
        commands: &[Vec<Vec<u8>>],
        limit: Duration,
    ) -> Result<Vec<Value>, StoreError> {
        if commands.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for c in commands {
            let mut cmd = redis::Cmd::new();
            for word in c {
                cmd.arg(word.as_slice());
            }
            pipe.add_command(cmd);
        }
        let (n, pipe) = (commands.len(), &pipe);
        let replies = self
            .exchange(limit, |mut conn| async move {
                conn.req_packed_commands(pipe, 0, n).await
            })
            .await?;
        let replies: Vec<Value> = replies.into_iter().map(value).collect();
        for r in &replies {
            self.check_role(r);
        }
        Ok(replies)
    }
}

/// A script call as the client's command (no intermediate copies of its words).
fn script_cmd(call: &ScriptCall) -> redis::Cmd {
    let mut cmd = redis::Cmd::new();
    for word in call.words() {
        cmd.arg(word);
    }
    cmd
}

impl SendScripts for RespStore {
    async fn send_scripts(
        &self,
        calls: &[ScriptCall],
        limit: Duration,
    ) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        let replies: Vec<Value> = if let [one] = calls {
            // one call alone: a plain request, no pipeline bookkeeping
            let cmd = &script_cmd(one);
            let reply = self
                .exchange(limit, |mut conn| async move {
                    conn.req_packed_command(cmd).await
                })
                .await
                .map(value)?;
            vec![reply]
        } else {
            let mut pipe = redis::pipe();
            for c in calls {
                pipe.add_command(script_cmd(c));
            }
            let (n, pipe) = (calls.len(), &pipe);
            self.exchange(limit, |mut conn| async move {
                conn.req_packed_commands(pipe, 0, n).await
            })
            .await?
            .into_iter()
            .map(value)
            .collect()
        };
        Ok(replies
            .into_iter()
            .map(|r| {
                self.check_role(&r);
                r.ok()
            })
            .collect())
    }
}

impl Store for RespStore {
    async fn run(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let call = ScriptCall::new(script, keys, args);
        self.inner.batch.run(self, self.inner.deadline, call).await
    }

    async fn command(&self, args: &[&[u8]]) -> Result<Value, StoreError> {
        let mut cmd = redis::Cmd::new();
        for a in args {
            cmd.arg(*a);
        }
        let cmd = &cmd;
        let reply = self
            .exchange(self.inner.deadline, |mut conn| async move {
                conn.req_packed_command(cmd).await
            })
            .await
            .map(value)?;
        self.check_role(&reply);
        reply.ok()
    }

    async fn pipeline(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, StoreError> {
        self.send(commands, self.inner.deadline).await
    }
}

fn bad_url(url: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::protocol(format!("bad Redis URL {:?}: {why}", redact(url)))
}

/// The URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{}{user}:***{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

fn certificates(ca: Option<Vec<u8>>) -> TlsCertificates {
    TlsCertificates {
        client_tls: None,
        root_cert: ca,
    }
}

fn direct_client(url: &str, ca: Option<Vec<u8>>) -> Result<redis::Client, StoreError> {
    let url = url.replacen("redis+unix://", "unix://", 1);
    let info = url
        .as_str()
        .into_connection_info()
        .map_err(|e| bad_url(&url, e))?;
    match (info.addr(), ca) {
        (ConnectionAddr::TcpTls { .. }, Some(ca)) => {
            redis::Client::build_with_tls(info, certificates(Some(ca)))
                .map_err(|e| bad_url(&url, e))
        }
        (_, None) => redis::Client::open(info).map_err(|e| bad_url(&url, e)),
        (_, Some(_)) => Err(bad_url(
            &url,
            "a CA file is given but the URL is not rediss:// (TLS)",
        )),
    }
}

/// Why a Sentinel URL is not one.
fn bad_sentinel(url: &str, why: &str) -> StoreError {
    bad_url(
        url,
        format!("{why} (expected redis+sentinel://[user:password@]host:port[,host:port]/master)"),
    )
}

/// The Sentinels' addresses of `hosts` (`host:port,host:port`).
fn sentinel_addrs(hosts: &str, tls: bool, url: &str) -> Result<Vec<ConnectionAddr>, StoreError> {
    let bad = |why: &str| bad_sentinel(url, why);
    hosts
        .split(',')
        .map(|h| {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| bad("a Sentinel needs host:port"))?;
            let port = port
                .parse::<u16>()
                .map_err(|_| bad("a port is not a number"))?;
            if host.is_empty() {
                return Err(bad("empty host"));
            }
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            Ok(if tls {
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host, port)
            })
        })
        .collect()
}

/// `[user:password@]host:port[,host:port...]/<master>[?sentinel_username=..&sentinel_password=..]`.
fn sentinel_client(
    rest: &str,
    tls: bool,
    ca: Option<Vec<u8>>,
    url: &str,
) -> Result<SentinelClient, StoreError> {
    let bad = |why: &str| bad_sentinel(url, why);
    let decode = |s: &str| {
        String::from_utf8(floodgate_shared::routes::percent_decode(s.as_bytes()))
            .map_err(|_| bad("credentials are not UTF-8"))
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, master) = rest.split_once('/').ok_or_else(|| bad("no master name"))?;
    let master = master.trim_end_matches('/');
    if master.is_empty() || master.contains(['/', ' ']) {
        return Err(bad("no master name"));
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let addrs = sentinel_addrs(hosts, tls, url)?;
    let mut b = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
        .map_err(|e| bad_url(url, e))?;
    if let Some(userinfo) = userinfo {
        let (user, pass) = userinfo.split_once(':').unwrap_or(("", userinfo));
        if !user.is_empty() {
            b = b.set_client_to_redis_username(decode(user)?);
        }
        if !pass.is_empty() {
            b = b.set_client_to_redis_password(decode(pass)?);
        }
    }
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "sentinel_username" => b = b.set_client_to_sentinel_username(decode(v)?),
            "sentinel_password" => b = b.set_client_to_sentinel_password(decode(v)?),
            "db" => b = b.set_client_to_redis_db(v.parse().map_err(|_| bad("db is not a number"))?),
            other => return Err(bad(&format!("unknown parameter {other:?}"))),
        }
    }
    sentinel_tls(b, tls, ca, url)?
        .build()
        .map_err(|e| bad_url(url, e))
}

/// TLS to the Sentinels and the master, trusting `ca` when given.
fn sentinel_tls(
    b: SentinelClientBuilder,
    tls: bool,
    ca: Option<Vec<u8>>,
    url: &str,
) -> Result<SentinelClientBuilder, StoreError> {
    if !tls {
        return match ca {
            Some(_) => Err(bad_sentinel(
                url,
                "a CA file is given but the URL is not rediss+sentinel:// (TLS)",
            )),
            None => Ok(b),
        };
    }
    let b = b
        .set_client_to_redis_tls_mode(TlsMode::Secure)
        .set_client_to_sentinel_tls_mode(TlsMode::Secure);
    Ok(match ca {
        Some(ca) => b
            .set_client_to_redis_certificates(certificates(Some(ca.clone())))
            .set_client_to_sentinel_certificates(certificates(Some(ca))),
        None => b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("rediss://fg:s3cret@127.0.0.1:6380/"),
            "rediss://fg:***@127.0.0.1:6380/"
        );
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1/"), "redis://h:1/");
        let e = direct_client("redis://u:pw@h:notaport/", None).unwrap_err();
        assert!(!e.message.contains("pw"), "{e}");
    }

    #[test]
    fn sentinel_urls_are_checked() {
        for bad in [
            "h:1",
            "h:1/",
            "h/master",
            ":1/master",
            "h:x/master",
            "h:1/master?nope=1",
        ] {
            assert!(sentinel_client(bad, false, None, bad).is_err(), "{bad}");
        }
        for good in [
            "127.0.0.1:26379/mymaster",
            "fg:pw@127.0.0.1:26379,127.0.0.1:26380/mymaster",
            "127.0.0.1:26379/mymaster?sentinel_password=s%40p&sentinel_username=sen",
        ] {
            assert!(sentinel_client(good, false, None, good).is_ok(), "{good}");
        }
        assert!(sentinel_client("h:1/m", false, Some(vec![]), "x").is_err());
    }
}
