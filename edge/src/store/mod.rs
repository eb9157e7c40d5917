//! Redis stores behind one trait. Each runs the whole check in ONE round trip: the
//! token-bucket script via `EVALSHA`, falling back to `EVAL` within the same call
//! when the server answers `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`).

use std::fmt;

use floodgate_shared::Micros;
use floodgate_shared::script::{CallError, Check, ProtocolError, Verdict};

#[cfg(feature = "native")]
pub mod cluster;
#[cfg(feature = "native")]
pub mod resp;
#[cfg(feature = "rest")]
pub mod rest;

/// What went wrong, and so whether trying again can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// No answer within the deadline. Retrying may help.
    Timeout,
    /// Could not reach or lost the server. Retrying may help.
    Connect,
    /// The server refused our credentials. Retrying will not help.
    Auth,
    /// The server answered with an error (bad script, wrong arguments, OOM...).
    Redis,
    /// The reply did not have the agreed shape, or the call was malformed.
    Protocol,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
    /// Whether the same call may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Timeout | StoreErrorKind::Connect)
    }
}

impl From<CallError> for StoreError {
    fn from(e: CallError) -> Self {
        Self::new(StoreErrorKind::Protocol, e.to_string())
    }
}

impl From<ProtocolError> for StoreError {
    fn from(e: ProtocolError) -> Self {
        Self::new(StoreErrorKind::Protocol, e.to_string())
    }
}

/// A place where buckets live.
#[allow(async_fn_in_trait)]
pub trait BucketStore {
    /// Checks (and, when every bucket has room, consumes) all `checks` atomically in
    /// one round trip. `now = None` uses the store's clock (Redis `TIME`); tests pass
    /// an explicit instant.
    async fn check(&self, checks: &[Check<'_>], now: Option<Micros>)
    -> Result<Verdict, StoreError>;

    /// Takes an in-flight slot `id` in the set `key` when fewer than `limit`
    /// unexpired slots are held (`lua/in_flight.lua`); the slot expires after
    /// `ttl_ms` unless released. `Ok(false)`: the limit is reached.
    async fn acquire_slot(
        &self,
        _key: &str,
        _id: &str,
        _limit: u32,
        _ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        Err(StoreError::new(
            StoreErrorKind::Protocol,
            "this store has no in-flight slots",
        ))
    }

    /// Releases a slot (a no-op when it already expired).
    async fn release_slot(&self, _key: &str, _id: &str) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Reads the in-flight script's reply `{taken, held}`.
pub fn slot_taken(reply: &[i64]) -> Result<bool, StoreError> {
    match reply {
        [taken, _held] => Ok(*taken == 1),
        other => Err(StoreError::new(
            StoreErrorKind::Protocol,
            format!("unexpected in-flight reply {other:?}"),
        )),
    }
}

/// Plain reads of the records the edge caches (configuration, API keys).
#[allow(async_fn_in_trait)]
pub trait RecordStore {
    /// The value of a string key, `None` when absent.
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Runs several write commands in ONE round trip (not atomic); fails if any
    /// command failed.
    async fn write_batch(&self, commands: Vec<Vec<String>>) -> Result<(), StoreError>;

    /// A health check within the deadline: `PING` where the store speaks it (the
    /// breaker's half-open probe). The default reads a key that need not exist.
    async fn ping(&self) -> Result<(), StoreError> {
        self.get("fg:ping").await.map(|_| ())
    }
}
