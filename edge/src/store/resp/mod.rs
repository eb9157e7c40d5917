//! The native store: Redis over RESP. One pipelined connection (see [`pipe`]) is
//! shared by every task of the host, so concurrent decisions travel together.
//!
//! The connection is our own small RESP client rather than the `redis` crate's
//! multiplexed connection: on the single-caller path it costs one fewer wake-up per
//! call (measured by `scripts/bench`). The `redis` crate still parses URLs.

pub mod pipe;
pub mod wire;

use std::sync::Mutex;
use std::time::Duration;

use floodgate_shared::Micros;
use floodgate_shared::script::{
    Check, IN_FLIGHT, LuaScript, REFUND, TOKEN_BUCKET, Verdict, When, refund_call, script_call,
};
use redis::{ConnectionAddr, IntoConnectionInfo};

use self::pipe::Pipe;
use self::wire::{Reply, encode};
use super::{BucketStore, MaybeSend, StoreError, StoreErrorKind};

/// The default per-call deadline, reconnection included: inside the 5 ms budget
/// with room for the rest of the request. A healthy store on loopback answers the
/// bucket check in ~0.06-0.1 ms (p50), p99 0.2 ms without persistence and 1.4-3.7
/// ms with an fsync-every-second append-only file on a saturated 2-core machine
/// (`docs/failure.md`), so 3 ms cuts off a store that is hung or overloaded.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(3);

enum Target {
    Tcp(String, u16),
    Unix(std::path::PathBuf),
    /// Ask these Sentinels for the current primary of `master` at each connect.
    Sentinel {
        sentinels: Vec<(String, u16)>,
        master: String,
    },
}

/// Parses `redis+sentinel://host:port[,host:port...]/<master name>`.
fn parse_sentinel_url(url: &str) -> Result<Target, StoreError> {
    let bad = |why: &str| {
        err(
            StoreErrorKind::Protocol,
            format!(
                "bad Sentinel URL {url:?}: {why} (expected redis+sentinel://host:port[,host:port]/master)"
            ),
        )
    };
    let rest = url
        .strip_prefix("redis+sentinel://")
        .ok_or_else(|| bad("scheme"))?;
    let (hosts, master) = rest.split_once('/').ok_or_else(|| bad("no master name"))?;
    let master = master.trim_end_matches('/');
    if master.is_empty() || master.contains(['/', ' ']) {
        return Err(bad("no master name"));
    }
    let sentinels = hosts
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
            Ok((host.to_string(), port))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Target::Sentinel {
        sentinels,
        master: master.to_string(),
    })
}

struct Settings {
    target: Target,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

/// A Redis server reached over RESP. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RespStore {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    settings: Settings,
    deadline: Duration,
    pipe: Mutex<Pipe>,
    reconnect: tokio::sync::Mutex<()>,
    /// Set when the server answered READONLY: reconnect before the next call.
    demoted: std::sync::atomic::AtomicBool,
}

fn err(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
    StoreError::new(kind, message)
}

fn reply_error(message: String) -> StoreError {
    let auth = ["NOAUTH", "WRONGPASS", "NOPERM"]
        .iter()
        .any(|p| message.starts_with(p));
    err(
        if auth {
            StoreErrorKind::Auth
        } else {
            StoreErrorKind::Redis
        },
        message,
    )
}

impl RespStore {
    /// Connects to `url`: `redis://[user:password@]host:port[/db]` or
    /// `redis+unix:///path/to/socket`. TLS (`rediss://`) is not built in: put a TLS
    /// terminator next to the host, or use the REST store.
    pub async fn connect(url: &str, deadline: Duration) -> Result<Self, StoreError> {
        if url.starts_with("redis+sentinel://") {
            let settings = Settings {
                target: parse_sentinel_url(url)?,
                username: None,
                password: None,
                db: 0,
            };
            return Self::with_settings(settings, deadline).await;
        }
        let info = url
            .into_connection_info()
            .map_err(|e| err(StoreErrorKind::Protocol, format!("bad Redis URL: {e}")))?;
        let target = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Target::Tcp(host.clone(), *port),
            ConnectionAddr::Unix(path) => Target::Unix(path.clone()),
            other => {
                return Err(err(
                    StoreErrorKind::Protocol,
                    format!("unsupported Redis address {other:?}"),
                ));
            }
        };
        let r = info.redis_settings();
        let settings = Settings {
            target,
            username: r.username().map(str::to_string),
            password: r.password().map(str::to_string),
            db: r.db(),
        };
        Self::with_settings(settings, deadline).await
    }

    async fn with_settings(settings: Settings, deadline: Duration) -> Result<Self, StoreError> {
        let pipe = open(&settings, deadline).await?;
        Ok(Self {
            inner: std::sync::Arc::new(Inner {
                settings,
                deadline,
                pipe: Mutex::new(pipe),
                reconnect: tokio::sync::Mutex::new(()),
                demoted: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// The server refused a write as a replica (`READONLY`): after a failover, the
    /// connection leads to a demoted primary. Drop it; the next call reconnects
    /// (asking the Sentinels again). Retryable, like a lost connection.
    fn demoted(&self, message: String) -> StoreError {
        self.inner
            .demoted
            .store(true, std::sync::atomic::Ordering::SeqCst);
        err(StoreErrorKind::Connect, message)
    }

    /// The live connection, reconnecting once if the last one was lost. Callers run
    /// it within their deadline: a reconnection that takes longer is abandoned (the
    /// next call tries again), so no request waits on a slow connect.
    async fn pipe(&self) -> Result<Pipe, StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let usable = |p: &Pipe| !p.is_closed() && !self.inner.demoted.load(SeqCst);
        let current = self.inner.pipe.lock().expect("pipe lock").clone();
        if usable(&current) {
            return Ok(current);
        }
        let _one_at_a_time = self.inner.reconnect.lock().await;
        let current = self.inner.pipe.lock().expect("pipe lock").clone();
        if usable(&current) {
            return Ok(current);
        }
        let fresh = open(&self.inner.settings, self.inner.deadline).await?;
        self.inner.demoted.store(false, SeqCst);
        *self.inner.pipe.lock().expect("pipe lock") = fresh.clone();
        Ok(fresh)
    }

    /// Runs commands back to back on one connection (a MULTI ... EXEC batch stays
    /// atomic) within the deadline; one reply per command, Redis errors included.
    pub async fn batch(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Reply>, StoreError> {
        let mut frames = Vec::with_capacity(64 * commands.len());
        for c in commands {
            let parts: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
            encode(&mut frames, &parts);
        }
        self.within_deadline(async {
            let pipe = self.pipe().await?;
            pipe.call_batch(frames, commands.len())
                .await
                .map_err(|e| err(StoreErrorKind::Connect, e))
        })
        .await
    }

    /// Runs one command (binary-safe arguments) within the deadline.
    pub async fn command(&self, args: &[&[u8]]) -> Result<Reply, StoreError> {
        let mut frame = Vec::with_capacity(64);
        encode(&mut frame, args);
        self.within_deadline(async {
            let pipe = self.pipe().await?;
            pipe.call(frame)
                .await
                .map_err(|e| err(StoreErrorKind::Connect, e))
        })
        .await
    }

    async fn within_deadline<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let d = self.inner.deadline;
        tokio::time::timeout(d, work).await.unwrap_or_else(|_| {
            Err(err(
                StoreErrorKind::Timeout,
                format!("no reply within {d:?}"),
            ))
        })
    }

    /// Runs the token-bucket script: `EVALSHA`, and `EVAL` with the source in the
    /// same call when the server does not know the script.
    pub async fn eval_token_bucket(
        &self,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        self.eval_script(&TOKEN_BUCKET, keys, args).await
    }

    /// Runs a script replying with an array of integers: `EVALSHA`, and `EVAL`
    /// with the source in the same call when the server does not know it.
    pub async fn eval_script(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        let numkeys = keys.len().to_string();
        let frame = |by_source: bool| {
            let words = script.call_words(by_source, &numkeys, keys.iter().copied(), args);
            let parts: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
            let mut out = Vec::with_capacity(128);
            encode(&mut out, &parts);
            out
        };
        let lost = |e: String| err(StoreErrorKind::Connect, e);
        let reply = self
            .within_deadline(async {
                let pipe = self.pipe().await?;
                match pipe.call(frame(false)).await.map_err(lost)? {
                    Reply::Error(e) if e.starts_with("NOSCRIPT") => {
                        pipe.call(frame(true)).await.map_err(lost)
                    }
                    other => Ok(other),
                }
            })
            .await?;
        match reply {
            Reply::Array(Some(items)) => items
                .into_iter()
                .map(|i| match i {
                    Reply::Int(v) => Ok(v),
                    other => Err(err(
                        StoreErrorKind::Protocol,
                        format!("non-integer in script reply: {other:?}"),
                    )),
                })
                .collect(),
            Reply::Error(e) if e.starts_with("READONLY") => Err(self.demoted(e)),
            Reply::Error(e) => Err(reply_error(e)),
            other => Err(err(
                StoreErrorKind::Protocol,
                format!("unexpected script reply: {other:?}"),
            )),
        }
    }
}

/// The current primary of `master`, from the first Sentinel that knows it.
async fn ask_sentinels(
    sentinels: &[(String, u16)],
    master: &str,
    limit: Duration,
) -> Result<Target, StoreError> {
    let mut last = String::from("no Sentinel configured");
    for (host, port) in sentinels {
        let ask = async {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| e.to_string())?;
            let (r, w) = stream.into_split();
            let pipe = Pipe::start(r, w);
            let mut frame = vec![];
            encode(
                &mut frame,
                &[b"SENTINEL", b"get-master-addr-by-name", master.as_bytes()],
            );
            match pipe.call(frame).await? {
                Reply::Array(Some(items)) => match items.as_slice() {
                    [Reply::Bulk(Some(h)), Reply::Bulk(Some(p))] => {
                        let h = String::from_utf8_lossy(h).into_owned();
                        let p = String::from_utf8_lossy(p)
                            .parse::<u16>()
                            .map_err(|_| "bad port".to_string())?;
                        Ok(Target::Tcp(h, p))
                    }
                    other => Err(format!("unexpected reply {other:?}")),
                },
                Reply::Array(None) | Reply::Bulk(None) => {
                    Err(format!("does not know a master named {master:?}"))
                }
                other => Err(format!("unexpected reply {other:?}")),
            }
        };
        match tokio::time::timeout(limit, ask).await {
            Ok(Ok(target)) => return Ok(target),
            Ok(Err(e)) => last = format!("Sentinel {host}:{port}: {e}"),
            Err(_) => last = format!("Sentinel {host}:{port}: no answer within {limit:?}"),
        }
    }
    Err(err(StoreErrorKind::Connect, last))
}

/// Opens a connection and authenticates / selects the database.
async fn open(s: &Settings, deadline: Duration) -> Result<Pipe, StoreError> {
    let connect_limit = deadline.max(Duration::from_secs(1));
    let primary;
    let target = match &s.target {
        Target::Sentinel { sentinels, master } => {
            primary = ask_sentinels(sentinels, master, connect_limit).await?;
            &primary
        }
        other => other,
    };
    let connect = async {
        match target {
            Target::Sentinel { .. } => unreachable!("resolved above"),
            Target::Tcp(host, port) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                let (r, w) = stream.into_split();
                Ok::<_, std::io::Error>(Pipe::start(r, w))
            }
            Target::Unix(path) => {
                let (r, w) = tokio::net::UnixStream::connect(path).await?.into_split();
                Ok(Pipe::start(r, w))
            }
        }
    };
    let pipe = match tokio::time::timeout(connect_limit, connect).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return Err(err(StoreErrorKind::Connect, format!("connect: {e}"))),
        Err(_) => {
            return Err(err(
                StoreErrorKind::Timeout,
                format!("connect: no answer within {connect_limit:?}"),
            ));
        }
    };
    let mut hello: Vec<Vec<u8>> = vec![];
    if let Some(password) = &s.password {
        let mut f = vec![];
        match &s.username {
            Some(user) => encode(&mut f, &[b"AUTH", user.as_bytes(), password.as_bytes()]),
            None => encode(&mut f, &[b"AUTH", password.as_bytes()]),
        }
        hello.push(f);
    }
    if s.db != 0 {
        let mut f = vec![];
        encode(&mut f, &[b"SELECT", s.db.to_string().as_bytes()]);
        hello.push(f);
    }
    for frame in hello {
        let reply = tokio::time::timeout(connect_limit, pipe.call(frame))
            .await
            .map_err(|_| err(StoreErrorKind::Timeout, "handshake: no answer"))?
            .map_err(|e| err(StoreErrorKind::Connect, e))?;
        if let Reply::Error(e) = reply {
            return Err(reply_error(e));
        }
    }
    Ok(pipe)
}

impl super::RecordStore for RespStore {
    async fn ping(&self) -> Result<(), StoreError> {
        match self.command(&[b"PING"]).await? {
            Reply::Simple(_) => Ok(()),
            Reply::Error(e) => Err(reply_error(e)),
            other => Err(err(
                StoreErrorKind::Protocol,
                format!("unexpected PING reply {other:?}"),
            )),
        }
    }

    async fn write_batch(&self, commands: Vec<Vec<String>>) -> Result<(), StoreError> {
        let bytes: Vec<Vec<Vec<u8>>> = commands
            .into_iter()
            .map(|c| c.into_iter().map(String::into_bytes).collect())
            .collect();
        for reply in self.batch(&bytes).await? {
            if let Reply::Error(e) = reply {
                return Err(reply_error(e));
            }
        }
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.command(&[b"GET", key.as_bytes()]).await? {
            Reply::Bulk(v) => Ok(v),
            Reply::Error(e) if e.starts_with("WRONGTYPE") => Ok(None),
            Reply::Error(e) => Err(reply_error(e)),
            other => Err(err(
                StoreErrorKind::Protocol,
                format!("unexpected GET reply {other:?}"),
            )),
        }
    }
}

impl BucketStore for RespStore {
    async fn run(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        self.eval_script(script, keys, args).await
    }

    async fn check(
        &self,
        checks: &[Check<'_>],
        when: impl Into<When> + MaybeSend,
    ) -> Result<Verdict, StoreError> {
        let (script, args) = script_call(checks, when)?;
        let keys: Vec<&str> = checks.iter().map(|c| c.key).collect();
        let reply = self.eval_script(script, &keys, &args).await?;
        super::verdict(checks, &reply)
    }

    async fn refund(&self, checks: &[Check<'_>], verdict: &Verdict) -> Result<(), StoreError> {
        match refund_call(checks, verdict) {
            Some((keys, args)) => self.eval_script(&REFUND, &keys, &args).await.map(|_| ()),
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
        super::slot_taken(&self.eval_script(&IN_FLIGHT, &[key], &args).await?)
    }

    async fn release_slot(&self, key: &str, id: &str) -> Result<(), StoreError> {
        match self
            .command(&[b"ZREM", key.as_bytes(), id.as_bytes()])
            .await?
        {
            Reply::Error(e) => Err(reply_error(e)),
            _ => Ok(()),
        }
    }
}
