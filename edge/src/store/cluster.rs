//! Redis Cluster through redis-rs' cluster client (cluster-async): the slot map,
//! routing by slot, `MOVED` (map refreshed), `ASK` (`ASKING` + the command on the
//! importing node), `TRYAGAIN`/`CLUSTERDOWN` (bounded waits and retries), and the
//! same TLS, CA file and ACL credentials on every node it discovers.
//!
//! What is ours on top:
//! - all keys of one script call must share a slot (Floodgate's bucket keys carry
//!   the request's principal as their hash tag, `shared/src/keys.rs`); a call
//!   whose keys span slots is refused before anything is sent
//!   ([`StoreErrorKind::Protocol`]);
//! - `EVALSHA`, and `EVAL` with the source in the same call on `NOSCRIPT` (a node
//!   that just took over a slot may not know the script);
//! - a batch of commands is split by slot, each part sent as one pipeline to its
//!   node, the parts concurrently, the replies put back in order;
//! - the deadline: each attempt has the store's deadline, a whole call at most
//!   [`MAX_ATTEMPTS`] of them; redirections and waits are retried up to
//!   [`MAX_RETRIES`] times within that (a migration ping-pongs a multi-key call
//!   between `ASK` and `TRYAGAIN` until its last key has moved).

use std::collections::BTreeMap;
use std::time::Duration;

use floodgate_shared::script::LuaScript;
use floodgate_shared::slot::{common_slot, key_slot};
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;

use super::convert::{error, value};
use super::native::StoreOptions;
use super::{RedisErrorKind, Store, StoreError, StoreErrorKind, Value};

/// A call's whole time, in deadlines.
pub const MAX_ATTEMPTS: u32 = 6;

/// Redirections (`MOVED`, `ASK`) and waits (`TRYAGAIN`, `CLUSTERDOWN`, 2 to 32 ms
/// apart) per call. The client counts an `ASK` as one, so a two-key call that a
/// migration splits spends two per wait (`ASK`, then `TRYAGAIN` from the importing
/// node); the whole call stays bounded by 6 deadlines anyway.
pub const MAX_RETRIES: u32 = 32;

/// What a cluster URL says: TLS or not, the credentials, the seed nodes.
struct ClusterUrl<'u> {
    tls: bool,
    userinfo: Option<&'u str>,
    seeds: Vec<String>,
}

/// Why `url` is not a cluster URL.
fn bad_url(url: &str, why: &str) -> StoreError {
    StoreError::protocol(format!(
        "bad Redis Cluster URL {:?}: {why} (expected redis+cluster://[user:password@]host:port[,host:port])",
        super::resp::redact(url)
    ))
}

fn parse_url(url: &str) -> Result<ClusterUrl<'_>, StoreError> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("rediss+cluster://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("redis+cluster://") {
        (false, r)
    } else {
        (false, url)
    };
    let rest = rest.trim_end_matches('/');
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let seeds: Vec<String> = hosts
        .split(',')
        .map(|s| {
            s.trim()
                .trim_start_matches("redis://")
                .trim_end_matches('/')
        })
        .filter(|s| !s.is_empty())
        .map(|s| format!("{scheme}://{s}/"))
        .collect();
    if seeds.is_empty() {
        return Err(bad_url(url, "no cluster node given"));
    }
    Ok(ClusterUrl {
        tls,
        userinfo,
        seeds,
    })
}

/// The cluster client of `options`: its seeds, credentials, TLS, timeouts and
/// retries.
fn client(options: &StoreOptions) -> Result<redis::cluster::ClusterClient, StoreError> {
    let url = &options.url;
    let parsed = parse_url(url)?;
    let mut b = redis::cluster::ClusterClientBuilder::new(parsed.seeds)
        .connection_timeout(options.deadline.max(Duration::from_secs(1)))
        .response_timeout(options.deadline)
        .overall_response_timeout(Some(options.deadline * MAX_ATTEMPTS))
        .retries(MAX_RETRIES)
        .min_retry_wait(2)
        .max_retry_wait(32);
    if let Some(userinfo) = parsed.userinfo {
        let decode = |s: &str| {
            String::from_utf8(floodgate_shared::routes::percent_decode(s.as_bytes()))
                .map_err(|_| bad_url(url, "credentials are not UTF-8"))
        };
        let (user, pass) = userinfo.split_once(':').unwrap_or(("", userinfo));
        if !user.is_empty() {
            b = b.username(decode(user)?);
        }
        if !pass.is_empty() {
            b = b.password(decode(pass)?);
        }
    }
    match (parsed.tls, options.ca_pem()?) {
        (true, ca) => {
            b = b.tls(redis::TlsMode::Secure).certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: ca,
            })
        }
        (false, Some(_)) => {
            return Err(bad_url(
                url,
                "a CA file is given but the URL is not rediss+cluster://",
            ));
        }
        (false, None) => {}
    }
    b.build().map_err(|e| bad_url(url, &e.to_string()))
}

/// A Redis Cluster. Cheap to clone; clones share connections and the slot map.
#[derive(Clone)]
pub struct ClusterStore {
    conn: ClusterConnection,
    deadline: Duration,
}

impl ClusterStore {
    /// Connects through any of the seeds of
    /// `redis+cluster://[user:password@]host:port[,host:port...]` (or
    /// `rediss+cluster://` for TLS) and reads the slot map before returning.
    pub async fn connect(seeds: &str, deadline: Duration) -> Result<Self, StoreError> {
        Self::connect_with(&StoreOptions::new(seeds, deadline)).await
    }

    pub async fn connect_with(options: &StoreOptions) -> Result<Self, StoreError> {
        let url = &options.url;
        let client = client(options)?;
        let limit = options.deadline.max(Duration::from_secs(1)) * 2;
        let connected = async {
            let conn = tokio::time::timeout(limit, client.get_async_connection())
                .await
                .map_err(|_| {
                    StoreError::new(
                        StoreErrorKind::Timeout,
                        format!("connect: no cluster node answered within {limit:?}"),
                    )
                })?
                .map_err(error)?;
            let store = Self {
                conn,
                deadline: options.deadline,
            };
            // a round trip, so credentials and the slot map are known to work
            store.ping().await?;
            Ok(store)
        };
        connected
            .await
            .map_err(|e| super::native::at_connect(e, url))
    }

    async fn exchange<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(ClusterConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        // redis-rs bounds each attempt and the whole call; this only backs it up
        let limit = self.deadline * (MAX_ATTEMPTS + 1);
        tokio::time::timeout(limit, op(self.conn.clone()))
            .await
            .map_err(|_| StoreError::timeout(limit))?
            .map_err(error)
    }

    async fn script(
        &self,
        script: &LuaScript,
        by_source: bool,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let numkeys = keys.len().to_string();
        let mut cmd = redis::Cmd::new();
        for w in script.call_words(by_source, &numkeys, keys.iter().copied(), args) {
            cmd.arg(w);
        }
        self.exchange(|mut c| async move { c.req_packed_command(&cmd).await })
            .await
            .map(value)
    }
}

impl Store for ClusterStore {
    fn one_slot(&self) -> bool {
        false
    }

    async fn run(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        common_slot(keys.iter().copied())
            .map_err(|e| StoreError::protocol(e.to_string()))?
            .ok_or_else(|| StoreError::protocol("a script call needs a key"))?;
        match self.script(script, false, keys, args).await?.ok() {
            Err(e) if e.redis() == Some(RedisErrorKind::NoScript) => {
                self.script(script, true, keys, args).await?.ok()
            }
            other => other,
        }
    }

    async fn command(&self, args: &[&[u8]]) -> Result<Value, StoreError> {
        let mut cmd = redis::Cmd::new();
        for a in args {
            cmd.arg(*a);
        }
        self.exchange(|mut c| async move { c.req_packed_command(&cmd).await })
            .await
            .map(value)?
            .ok()
    }

    /// Split by the slot of each command's first key; each part one pipeline.
    async fn pipeline(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, StoreError> {
        let mut parts: BTreeMap<Option<u16>, Vec<usize>> = BTreeMap::new();
        for (i, c) in commands.iter().enumerate() {
            let slot = c.get(1).map(|k| key_slot(&String::from_utf8_lossy(k)));
            parts.entry(slot).or_default().push(i);
        }
        let sends = parts.values().map(|indices| {
            let mut pipe = redis::pipe();
            for &i in indices {
                let mut cmd = redis::Cmd::new();
                for w in &commands[i] {
                    cmd.arg(w.as_slice());
                }
                pipe.add_command(cmd);
            }
            let n = indices.len();
            self.exchange(move |mut c| async move { c.req_packed_commands(&pipe, 0, n).await })
        });
        let results = futures_util::future::join_all(sends).await;
        let mut out = vec![Value::Nil; commands.len()];
        for (indices, result) in parts.values().zip(results) {
            let replies = result?;
            if replies.len() != indices.len() {
                return Err(StoreError::protocol(format!(
                    "{} replies for {} commands",
                    replies.len(),
                    indices.len()
                )));
            }
            for (&i, r) in indices.iter().zip(replies) {
                out[i] = value(r);
            }
        }
        Ok(out)
    }
}
