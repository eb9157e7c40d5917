//! What every native binary's command line shares (clap derive, each flag also
//! from a `FLOODGATE_*` environment variable): where the store is, and how logs
//! are written.
//!
//! Logs go to stderr through `tracing`: text by default, or `--log-format json`
//! (`FLOODGATE_LOG_FORMAT=json`), one JSON object per line with `timestamp`,
//! `level`, `target`, `fields` (`message` and the event's own fields) and, for
//! request-scoped events, `span` (`request_id`). Our events' targets start with
//! `floodgate` (`floodgate::breaker`, `floodgate::config`, `floodgate::request`);
//! other crates' events are logged from `warn` up.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::store::StoreOptions;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields, span).
    Json,
}

pub use crate::settings::LogLevel;

impl From<LogLevel> for LevelFilter {
    fn from(l: LogLevel) -> Self {
        match l {
            LogLevel::Error => LevelFilter::ERROR,
            LogLevel::Warn => LevelFilter::WARN,
            LogLevel::Info => LevelFilter::INFO,
            LogLevel::Debug => LevelFilter::DEBUG,
            LogLevel::Trace => LevelFilter::TRACE,
        }
    }
}

/// `--log-format` and `--log-level`.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// How log lines on stderr look: text, or json (one object per line).
    #[arg(long, env = "FLOODGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// The most detailed events logged (debug adds one event per request).
    #[arg(long, env = "FLOODGATE_LOG_LEVEL", value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
}

impl LogArgs {
    /// Installs the process' logger (once, at start).
    pub fn init(&self) {
        let ours = LevelFilter::from(self.log_level);
        let filter = Targets::new()
            .with_target("floodgate", ours)
            .with_default(ours.min(LevelFilter::WARN));
        let registry = tracing_subscriber::registry().with(filter);
        let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let _ = match self.log_format {
            LogFormat::Text => registry.with(fmt.with_ansi(false)).try_init(),
            LogFormat::Json => registry
                .with(fmt.json().with_current_span(true).with_span_list(false))
                .try_init(),
        };
    }
}

/// Where the store is: `--redis` (any store URL) or `--rest-url`, and the CA file.
/// A REST URL's token comes from `FLOODGATE_REST_TOKEN` or
/// `UPSTASH_REDIS_REST_TOKEN`, never from the command line.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Redis: redis://[user:password@]host:port[/db], rediss://user:password@host:port
    /// (TLS, ACL user), redis+unix:///path, redis+sentinel://host:port[,..]/master,
    /// redis+cluster://host:port[,..], or the deployment's https:// REST URL.
    #[arg(
        long,
        env = "FLOODGATE_REDIS",
        default_value = "redis://127.0.0.1:6379/",
        global = true
    )]
    pub redis: String,
    /// An Upstash-compatible REST endpoint instead of --redis (its token from
    /// FLOODGATE_REST_TOKEN or UPSTASH_REDIS_REST_TOKEN).
    #[arg(long, env = "FLOODGATE_REST_URL", value_parser = http_url, global = true)]
    pub rest_url: Option<String>,
    /// PEM CA certificates that sign the Redis servers' TLS certificates (rediss://),
    /// trusted instead of the system roots.
    #[arg(long, env = "FLOODGATE_REDIS_CA_FILE", global = true)]
    pub redis_ca_file: Option<PathBuf>,
}

impl StoreArgs {
    /// The store's URL: the REST URL when given, else `--redis`.
    pub fn url(&self) -> &str {
        self.rest_url.as_deref().unwrap_or(&self.redis)
    }

    /// The store's options, each call bounded by `deadline`.
    pub fn options(&self, deadline: Duration) -> StoreOptions {
        let mut options = StoreOptions::from_env(self.url(), deadline);
        if self.redis_ca_file.is_some() {
            options.ca_file = self.redis_ca_file.clone();
        }
        options
    }
}

/// Parses an http(s) URL flag (without its trailing slashes).
pub fn http_url(v: &str) -> Result<String, String> {
    if v.starts_with("http://") || v.starts_with("https://") {
        Ok(v.trim_end_matches('/').to_string())
    } else {
        Err(format!("expected an http:// or https:// URL, got {v:?}"))
    }
}

/// Parses a listen address flag (`host:port`).
pub fn socket_addr(v: &str) -> Result<std::net::SocketAddr, String> {
    v.parse()
        .map_err(|_| format!("expected an address and port like 127.0.0.1:8080, got {v:?}"))
}
