//! Choosing a store by its URL, for every native binary (the edge, the CLI, the
//! REST endpoint, the dashboard) and the tests: one set of options, one place
//! that reads the TLS CA file.

use std::path::PathBuf;
use std::time::Duration;

use floodgate_shared::script::LuaScript;

use super::cluster::ClusterStore;
use super::resp::RespStore;
use super::rest::RestStore;
use super::{Store, StoreError, StoreErrorKind, Value};

/// The environment variable naming a PEM file of CA certificates for `rediss://`
/// (what `--redis-ca-file` sets on the command line).
pub const CA_FILE_ENV: &str = "FLOODGATE_REDIS_CA_FILE";

/// The environment variables holding the token of an `http(s)://` (REST) URL.
pub const REST_TOKEN_ENV: [&str; 2] = ["FLOODGATE_REST_TOKEN", "UPSTASH_REDIS_REST_TOKEN"];

/// How to reach a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// `redis://`, `rediss://`, `redis+unix://`, `redis(s)+sentinel://`,
    /// `redis(s)+cluster://`, or the `http(s)://` URL of an Upstash-protocol
    /// REST endpoint.
    pub url: String,
    /// Bounds each call, reconnection included.
    pub deadline: Duration,
    /// CA certificates (PEM) that sign the servers' TLS certificates; trusted
    /// instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// The bearer token of a REST URL.
    pub rest_token: Option<String>,
    /// How long a connection may stay silent, calls waiting, before it is
    /// replaced (default: the deadline, at least 250 ms).
    pub silence: Option<Duration>,
    /// Start even when a Redis server (RESP, Sentinel) cannot be reached yet —
    /// refused or unanswered: calls reconnect on demand and fail, answered by
    /// the policies' failure modes, until it answers. Refused credentials and
    /// bad TLS still fail at once. The edge's choice; the CLI wants the error.
    pub start_unreachable: bool,
}

impl StoreOptions {
    /// Options with nothing but the URL and the deadline.
    pub fn new(url: impl Into<String>, deadline: Duration) -> Self {
        Self {
            url: url.into(),
            deadline,
            ca_file: None,
            rest_token: None,
            silence: None,
            start_unreachable: false,
        }
    }

    /// Options completed from the environment: the CA file
    /// (`FLOODGATE_REDIS_CA_FILE`) and the REST token (`FLOODGATE_REST_TOKEN` or
    /// `UPSTASH_REDIS_REST_TOKEN`). Command-line flags override them after.
    pub fn from_env(url: impl Into<String>, deadline: Duration) -> Self {
        let mut o = Self::new(url, deadline);
        o.ca_file = std::env::var_os(CA_FILE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        o.rest_token = REST_TOKEN_ENV
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|t| !t.is_empty()));
        o
    }

    pub fn silence(&self) -> Duration {
        self.silence
            .unwrap_or_else(|| self.deadline.max(Duration::from_millis(250)))
    }

    /// The CA file's contents, checked to hold at least one certificate.
    pub fn ca_pem(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(path) = &self.ca_file else {
            return Ok(None);
        };
        let bad =
            |why: String| StoreError::protocol(format!("Redis CA file {}: {why}", path.display()));
        let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
            return Err(bad("no PEM certificate in it".into()));
        }
        Ok(Some(pem))
    }

    /// The kind of store the URL names.
    pub fn is_rest(&self) -> bool {
        self.url.starts_with("http://") || self.url.starts_with("https://")
    }

    pub fn is_cluster(&self) -> bool {
        self.url.starts_with("redis+cluster://") || self.url.starts_with("rediss+cluster://")
    }
}

/// A failed first connection, said with where it went (password redacted) and,
/// for refused credentials, what to check.
pub(crate) fn at_connect(e: StoreError, url: &str) -> StoreError {
    let url = super::resp::redact(url);
    let message = match e.kind {
        StoreErrorKind::Auth => format!(
            "{url}: authentication failed — a wrong user name or password, a disabled user,              or a user without the permissions Floodgate needs ({})",
            e.message
        ),
        _ => format!("{url}: {}", e.message),
    };
    StoreError::new(e.kind, message)
}

/// The store a native host, the CLI or the dashboard talks to: Redis directly
/// (or through Sentinel), Redis Cluster, or a REST endpoint.
#[derive(Clone)]
pub enum NativeStore {
    Resp(RespStore),
    Rest(RestStore),
    /// Redis Cluster (`redis+cluster://host:port[,host:port]`).
    Cluster(ClusterStore),
}

impl NativeStore {
    /// Connects to the store `options.url` names.
    pub async fn connect(options: &StoreOptions) -> Result<Self, StoreError> {
        if options.is_rest() {
            let token = options.rest_token.as_deref().ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::Auth,
                    format!(
                        "a REST URL needs a token: set {} (or {})",
                        REST_TOKEN_ENV[0], REST_TOKEN_ENV[1]
                    ),
                )
            })?;
            let ca = options.ca_pem()?;
            return Ok(Self::Rest(RestStore::with_ca(
                &options.url,
                token,
                options.deadline,
                ca.as_deref(),
            )?));
        }
        if options.is_cluster() {
            return Ok(Self::Cluster(ClusterStore::connect_with(options).await?));
        }
        Ok(Self::Resp(RespStore::connect_with(options).await?))
    }
}

impl Store for NativeStore {
    async fn run(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        match self {
            Self::Resp(s) => s.run(script, keys, args).await,
            Self::Rest(s) => s.run(script, keys, args).await,
            Self::Cluster(s) => s.run(script, keys, args).await,
        }
    }

    async fn command(&self, args: &[&[u8]]) -> Result<Value, StoreError> {
        match self {
            Self::Resp(s) => s.command(args).await,
            Self::Rest(s) => s.command(args).await,
            Self::Cluster(s) => s.command(args).await,
        }
    }

    async fn pipeline(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, StoreError> {
        match self {
            Self::Resp(s) => s.pipeline(commands).await,
            Self::Rest(s) => s.pipeline(commands).await,
            Self::Cluster(s) => s.pipeline(commands).await,
        }
    }

    fn one_slot(&self) -> bool {
        !matches!(self, Self::Cluster(_))
    }
}
