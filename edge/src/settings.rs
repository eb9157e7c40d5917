//! Every setting both hosts of the edge share, once: its flag, its variable, its
//! default and its bounds ([`EdgeSettings`]). The native host's command line
//! flattens it into its own flags (clap; each flag also from its `FLOODGATE_*`
//! variable); the Worker fills it from its environment with [`EdgeSettings::from_lookup`],
//! which runs the same clap parser over the variables it finds — the variable's
//! name without `FLOODGATE_` (`DEADLINE_MS` for `FLOODGATE_DEADLINE_MS`). So a
//! default, a bound or a rule ("0 means no limit") cannot differ between them.

use clap::{ArgMatches, Args, Command, FromArgMatches};

use crate::deadline::DeadlineSettings;
use crate::pipeline::PipelineConfig;
use crate::pipeline::leases::LeaseSettings;
use crate::proxy::ProxyRules;
use floodgate_shared::time::{MICROS_PER_SEC, Micros};

/// The most detailed events logged (natively `--log-level`, in the Worker
/// `LOG_LEVEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, clap::ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    /// Also one event per request (method, status, latency, request id).
    Debug,
    Trace,
}

impl LogLevel {
    /// A level by name, any case (`LOG_LEVEL=debug`), as `--log-level` takes it.
    pub fn parse(name: &str) -> Result<Self, String> {
        <Self as clap::ValueEnum>::from_str(name.trim(), true)
            .map_err(|_| format!("expected error, warn, info, debug or trace, got {name:?}"))
    }
}

/// The protocol of a store, which sets its default deadline bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Next to Redis.
    Resp,
    /// An Upstash-protocol REST endpoint: an HTTP hop, usually remote.
    Rest,
}

/// Every setting the native host and the Worker share.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct EdgeSettings {
    /// The header carrying the API key (`authorization` means `Bearer <key>`).
    #[arg(long, env = "FLOODGATE_KEY_HEADER", default_value = "authorization", value_parser = header_name)]
    pub key_header: String,
    /// Forward the client's API key upstream.
    #[arg(long, env = "FLOODGATE_FORWARD_KEY", num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub forward_key: bool,
    /// The header the edge sets to the caller's key id.
    #[arg(long, env = "FLOODGATE_IDENTITY_HEADER", default_value = "x-floodgate-key-id", value_parser = header_name)]
    pub identity_header: String,
    /// The header the edge sets to the caller's identity (the key's `identity`,
    /// when it has one); client copies are dropped in every spelling.
    #[arg(long, env = "FLOODGATE_KEY_IDENTITY_HEADER", default_value = "x-floodgate-identity", value_parser = header_name)]
    pub key_identity_header: String,
    /// The header the edge sets to the caller's key metadata (compact JSON, at
    /// most 1 KB, when the key has metadata); client copies are dropped in every
    /// spelling.
    #[arg(long, env = "FLOODGATE_KEY_META_HEADER", default_value = "x-floodgate-key-meta", value_parser = header_name)]
    pub key_meta_header: String,
    /// How long configuration and key records are cached.
    #[arg(long, env = "FLOODGATE_CACHE_TTL_MS", default_value_t = 5_000)]
    pub cache_ttl_ms: u32,
    /// How long a key found not to exist is remembered.
    #[arg(
        long,
        env = "FLOODGATE_NEGATIVE_CACHE_TTL_MS",
        default_value_t = 60_000
    )]
    pub negative_cache_ttl_ms: u32,
    /// With a regional store: how many of the region's copies of key records one
    /// read takes (HSCAN, one command) at an instance's first record miss and at
    /// most once per half a cache TTL after, caching those it does not hold (0:
    /// only the records missed)
    #[arg(long, env = "FLOODGATE_COPIES_PREFETCH", default_value_t = 500)]
    pub copies_prefetch: u32,
    /// Pins the answer deadline of every store call (default: adaptive, following
    /// each store's observed latency between the floor and the ceiling).
    #[arg(long, env = "FLOODGATE_DEADLINE_MS", value_parser = clap::value_parser!(u32).range(1..), conflicts_with_all = ["deadline_floor_ms", "deadline_ceiling_ms"])]
    pub deadline_ms: Option<u32>,
    /// The shortest adaptive deadline (default 3 over RESP, 50 over REST).
    #[arg(long, env = "FLOODGATE_DEADLINE_FLOOR_MS", value_parser = clap::value_parser!(u32).range(1..))]
    pub deadline_floor_ms: Option<u32>,
    /// The longest adaptive deadline: a reply later than this is a failure, not
    /// slowness (default 100 over RESP, 1000 over REST).
    #[arg(long, env = "FLOODGATE_DEADLINE_CEILING_MS", value_parser = clap::value_parser!(u32).range(1..))]
    pub deadline_ceiling_ms: Option<u32>,
    /// How long the first requests may wait for the first read of the configuration, and any call to the global store until it first answers.
    #[arg(long, env = "FLOODGATE_STARTUP_WAIT_MS", default_value_t = 2_000)]
    pub startup_wait_ms: u32,
    /// Consecutive store failures that open the circuit breaker.
    #[arg(long, env = "FLOODGATE_BREAKER_THRESHOLD", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub breaker_threshold: u32,
    /// How long the open breaker keeps requests off the store before a health check.
    #[arg(long, env = "FLOODGATE_BREAKER_COOL_DOWN_MS", default_value_t = 1_000)]
    pub breaker_cool_down_ms: u32,
    /// Lookups of keys that do not exist allowed per client address per minute
    /// before uncached keys from it are refused without a lookup (0: no limit).
    #[arg(
        long,
        env = "FLOODGATE_UNKNOWN_KEYS_PER_IP_PER_MIN",
        default_value_t = 20
    )]
    pub unknown_keys_per_ip_per_min: u32,
    /// The same budget for the whole instance (0: no limit).
    #[arg(long, env = "FLOODGATE_UNKNOWN_KEYS_PER_MIN", default_value_t = 600)]
    pub unknown_keys_per_min: u32,
    /// How long the upstream may take to send its response head (then 504).
    #[arg(long, env = "FLOODGATE_UPSTREAM_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub upstream_timeout_ms: u32,
    /// Largest request body in bytes, declared or streamed (then 413; 0: no limit).
    #[arg(long, env = "FLOODGATE_MAX_BODY_BYTES", default_value_t = 10 * 1024 * 1024)]
    pub max_body_bytes: u64,
    /// Most header bytes in one request (then 431).
    #[arg(long, env = "FLOODGATE_MAX_HEADER_BYTES", default_value_t = 32 * 1024)]
    pub max_header_bytes: usize,
    /// Most header lines in one request (then 431).
    #[arg(long, env = "FLOODGATE_MAX_HEADERS", default_value_t = 100)]
    pub max_headers: usize,
    /// How often the traffic counters are written at most (one command per flush;
    /// nothing when there is nothing new).
    #[arg(long, env = "FLOODGATE_STATS_FLUSH_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(100..=600_000))]
    pub stats_flush_ms: u32,
    /// How long an instance's lease of bounded consistency lives (without a
    /// regional store).
    #[arg(long, env = "FLOODGATE_LEASE_LIFETIME_MS", default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(100..=60_000))]
    pub lease_lifetime_ms: u32,
    /// How long an epoch of a regional tally of bounded consistency lasts, and
    /// so at most what an instance draws from it (with a regional store).
    #[arg(long, env = "FLOODGATE_TALLY_EPOCH_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(2_000..=60_000))]
    pub tally_epoch_ms: u32,
}

/// A header-name setting: an HTTP token, kept in lower case.
fn header_name(v: &str) -> Result<String, String> {
    let v = v.trim();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !v.is_empty() && v.bytes().all(token) {
        Ok(v.to_ascii_lowercase())
    } else {
        Err(format!("{v:?} is not a header name"))
    }
}

impl Default for EdgeSettings {
    /// Every default, as clap fills them in when nothing is set.
    fn default() -> Self {
        Self::from_lookup(|_| None).expect("the defaults are valid settings")
    }
}

/// The name the Worker's environment gives a setting: its native variable without
/// the `FLOODGATE_` prefix.
pub fn worker_name(env: &str) -> &str {
    env.strip_prefix("FLOODGATE_").unwrap_or(env)
}

impl EdgeSettings {
    /// The settings from an environment read through `lookup` (the Worker's vars
    /// and secrets, by [`worker_name`]), parsed by the same rules as the native
    /// flags. An error names the variable and what is wrong with it.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let command = || Self::augment_args(Command::new("floodgate-worker").no_binary_name(true));
        let mut given = vec![];
        for arg in command().get_arguments() {
            let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) else {
                continue;
            };
            let name = worker_name(env.to_str().unwrap_or_default()).to_string();
            if let Some(value) = lookup(&name) {
                given.push((name, format!("--{long}={}", value.trim())));
            }
        }
        let parse = |args: Vec<&String>| -> Result<ArgMatches, clap::Error> {
            command().try_get_matches_from(args)
        };
        let matches = match parse(given.iter().map(|(_, a)| a).collect()) {
            Ok(m) => m,
            Err(e) => {
                let whole = Self::with_names(&command(), &e.to_string());
                return Err(Self::culprit(&given, &parse).unwrap_or(whole));
            }
        };
        Self::from_arg_matches(&matches).map_err(|e| e.to_string())
    }

    /// `message` with each flag written as the Worker's variable.
    fn with_names(command: &Command, message: &str) -> String {
        let mut out = message.lines().next().unwrap_or_default().to_string();
        for arg in command.get_arguments() {
            if let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) {
                let name = worker_name(env.to_str().unwrap_or_default());
                out = out.replace(&format!("--{long}"), name);
            }
        }
        out.trim_start_matches("error: ").to_string()
    }

    /// Which variable alone fails to parse, and why (clap's message names the flag).
    fn culprit(
        given: &[(String, String)],
        parse: &impl Fn(Vec<&String>) -> Result<ArgMatches, clap::Error>,
    ) -> Option<String> {
        given.iter().find_map(|(name, arg)| {
            parse(vec![arg]).err().map(|e| {
                let why = e.to_string();
                let why = why
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                format!("{name}: {why}")
            })
        })
    }

    /// The answer deadline of a store of `protocol`: fixed by `deadline_ms`, else
    /// adaptive with the protocol's bounds, overridden by the floor and ceiling.
    pub fn deadline(&self, protocol: Protocol) -> DeadlineSettings {
        let ms = |v: u32| Micros::from(v) * 1000;
        if let Some(d) = self.deadline_ms {
            return DeadlineSettings::fixed(ms(d));
        }
        let base = match protocol {
            Protocol::Resp => DeadlineSettings::RESP,
            Protocol::Rest => DeadlineSettings::REST,
        };
        base.bounded(
            self.deadline_floor_ms.map(ms),
            self.deadline_ceiling_ms.map(ms),
        )
    }

    /// The pipeline's settings with a global store of `protocol`.
    pub fn pipeline(&self, protocol: Protocol) -> PipelineConfig {
        let ms = |v: u32| Micros::from(v) * 1000;
        PipelineConfig {
            bearer: self.key_header == "authorization",
            cache_ttl: ms(self.cache_ttl_ms),
            negative_cache_ttl: ms(self.negative_cache_ttl_ms),
            copies_prefetch: self.copies_prefetch,
            deadline: self.deadline(protocol),
            startup_wait: ms(self.startup_wait_ms),
            breaker_threshold: self.breaker_threshold,
            breaker_cool_down: ms(self.breaker_cool_down_ms),
            unknown_keys_per_ip_per_min: self.unknown_keys_per_ip_per_min,
            unknown_keys_per_min: self.unknown_keys_per_min,
            leases: LeaseSettings {
                lifetime: ms(self.lease_lifetime_ms),
                tally: floodgate_shared::tally::TallySettings {
                    epoch: ms(self.tally_epoch_ms),
                },
                ..LeaseSettings::default()
            },
            // not settings of the deployment
            max_cached_keys: 100_000,
            records_max_age: 300 * MICROS_PER_SEC,
            throttle_memory: true,
            in_flight_ttl: 60 * MICROS_PER_SEC,
            stats_flush_every: ms(self.stats_flush_ms),
            coalesce: cfg!(not(target_arch = "wasm32")),
            log: crate::pipeline::events::trace,
        }
    }

    /// The proxy's rules for `upstream`.
    pub fn rules(&self, upstream: &str) -> ProxyRules {
        let mut rules = ProxyRules::new(upstream);
        rules.key_header.clone_from(&self.key_header);
        rules.identity_header.clone_from(&self.identity_header);
        rules
            .key_identity_header
            .clone_from(&self.key_identity_header);
        rules.key_meta_header.clone_from(&self.key_meta_header);
        rules.forward_key = self.forward_key;
        rules.timeouts.upstream =
            std::time::Duration::from_millis(u64::from(self.upstream_timeout_ms));
        rules.limits.max_body = (self.max_body_bytes > 0).then_some(self.max_body_bytes);
        rules.limits.max_header_bytes = self.max_header_bytes;
        rules.limits.max_headers = self.max_headers;
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<EdgeSettings, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EdgeSettings::from_lookup(|k| vars.get(k).cloned())
    }

    #[test]
    fn nothing_set_gives_the_defaults() {
        let s = EdgeSettings::default();
        assert_eq!(s.key_header, "authorization");
        assert_eq!(s.cache_ttl_ms, 5_000);
        assert_eq!(s.max_body_bytes, 10 * 1024 * 1024);
        assert_eq!(s.lease_lifetime_ms, 2_000);
        assert_eq!(s.tally_epoch_ms, 5_000);
        let leases = s.pipeline(Protocol::Rest).leases;
        assert_eq!(
            (leases.lifetime, leases.tally.epoch),
            (2_000_000, 5_000_000)
        );
        assert!(!s.forward_key);
        let rules = s.rules("http://u");
        assert_eq!(
            (
                rules.identity_header.as_str(),
                rules.key_identity_header.as_str(),
                rules.key_meta_header.as_str()
            ),
            (
                "x-floodgate-key-id",
                "x-floodgate-identity",
                "x-floodgate-key-meta"
            )
        );
        let p = s.pipeline(Protocol::Rest);
        assert_eq!(p.deadline, DeadlineSettings::REST);
        assert_eq!(s.pipeline(Protocol::Resp).deadline, DeadlineSettings::RESP);
    }

    #[test]
    fn the_worker_names_drop_the_prefix_and_parse_like_the_flags() {
        let s = from(&[
            ("DEADLINE_MS", "40"),
            ("FORWARD_KEY", "true"),
            ("KEY_HEADER", "X-Api-Key"),
            ("MAX_BODY_BYTES", "0"),
            ("KEY_IDENTITY_HEADER", "X-Customer"),
            ("KEY_META_HEADER", "X-Customer-Meta"),
        ])
        .unwrap();
        let rules = s.rules("http://u");
        assert_eq!(
            (
                rules.key_identity_header.as_str(),
                rules.key_meta_header.as_str()
            ),
            ("x-customer", "x-customer-meta")
        );
        assert_eq!(s.deadline_ms, Some(40));
        assert!(s.forward_key);
        assert_eq!(s.key_header, "x-api-key");
        assert_eq!(s.rules("http://u").limits.max_body, None, "0: no limit");
        assert_eq!(
            s.pipeline(Protocol::Rest).deadline,
            DeadlineSettings::fixed(40_000)
        );
        assert!(!from(&[("FORWARD_KEY", "false")]).unwrap().forward_key);
    }

    #[test]
    fn out_of_bounds_values_are_refused_naming_the_variable() {
        for (name, value) in [
            ("DEADLINE_MS", "0"),
            ("LEASE_LIFETIME_MS", "50"),
            ("LEASE_LIFETIME_MS", "60001"),
            ("TALLY_EPOCH_MS", "1999"),
            ("TALLY_EPOCH_MS", "60001"),
            ("BREAKER_THRESHOLD", "0"),
            ("CACHE_TTL_MS", "soon"),
            ("KEY_HEADER", "a b"),
            ("KEY_IDENTITY_HEADER", "x customer"),
            ("KEY_META_HEADER", ""),
        ] {
            let e = from(&[(name, value), ("STARTUP_WAIT_MS", "2000")]).unwrap_err();
            assert!(
                e.starts_with(name) || e.contains(name),
                "{name}={value}: {e}"
            );
        }
        let both = from(&[("DEADLINE_MS", "5"), ("DEADLINE_FLOOR_MS", "5")]).unwrap_err();
        assert!(
            both.contains("DEADLINE_MS") && both.contains("DEADLINE_FLOOR_MS"),
            "{both}"
        );
    }
}
