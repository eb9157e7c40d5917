//! Redis stores behind one trait. Each runs the whole check in ONE round trip: the
//! token-bucket script via `EVALSHA`, falling back to `EVAL` within the same call
//! when the server answers `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`).

use std::fmt;

use floodgate_shared::Micros;
use floodgate_shared::script::{CallError, Check, ProtocolError, Stale, Verdict, When};

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

impl From<Stale> for StoreError {
    /// Redis ran the call too late for its caller: as good as no answer in time.
    fn from(e: Stale) -> Self {
        Self::new(StoreErrorKind::Timeout, e.to_string())
    }
}

impl From<ProtocolError> for StoreError {
    fn from(e: ProtocolError) -> Self {
        Self::new(StoreErrorKind::Protocol, e.to_string())
    }
}

/// `Send` natively, nothing in wasm32 (the Worker is single-threaded and its
/// futures are not `Send`): the bound store futures carry, so a host can move a
/// store call that missed its deadline to a background task on either.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + ?Sized> MaybeSend for T {}
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSend for T {}

/// `Sync` natively, nothing in wasm32 (see [`MaybeSend`]).
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSync: Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Sync + ?Sized> MaybeSync for T {}
#[cfg(target_arch = "wasm32")]
pub trait MaybeSync {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSync for T {}

/// A place where buckets live.
pub trait BucketStore {
    /// Runs a script replying with integers (`EVALSHA`, and `EVAL` with the source
    /// in the same call when the server does not know it).
    fn run(
        &self,
        script: &'static floodgate_shared::script::LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + MaybeSend;

    /// Checks (and, when every bucket has room, consumes) all `checks` atomically in
    /// one round trip, by the clock `when` says: Redis' `TIME` (`None`), Redis'
    /// `TIME` only until an instant ([`When::RedisUntil`]: a later call changes
    /// nothing and fails as a timeout), or an explicit instant (tests).
    fn check(
        &self,
        checks: &[Check<'_>],
        when: impl Into<When> + MaybeSend,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + MaybeSend;

    /// Gives back what an admitted `verdict` over `checks` consumed
    /// (`lua/refund.lua`), for a request refused after all.
    fn refund(
        &self,
        _checks: &[Check<'_>],
        _verdict: &Verdict,
    ) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        async {
            Err(StoreError::new(
                StoreErrorKind::Protocol,
                "this store cannot refund",
            ))
        }
    }

    /// Takes an in-flight slot `id` in the set `key` when fewer than `limit`
    /// unexpired slots are held (`lua/in_flight.lua`); the slot expires after
    /// `ttl_ms` unless released. `until`: the last instant (Redis' clock) at which
    /// the caller still waits for the answer (later: nothing is taken, a timeout).
    /// `Ok(false)`: the limit is reached.
    fn acquire_slot(
        &self,
        _key: &str,
        _id: &str,
        _limit: u32,
        _ttl_ms: u64,
        _until: Option<Micros>,
    ) -> impl Future<Output = Result<bool, StoreError>> + MaybeSend {
        async {
            Err(StoreError::new(
                StoreErrorKind::Protocol,
                "this store has no in-flight slots",
            ))
        }
    }

    /// Releases a slot (a no-op when it already expired).
    fn release_slot(
        &self,
        _key: &str,
        _id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        async { Ok(()) }
    }
}

/// The arguments of `lua/in_flight.lua`.
pub fn slot_args(id: &str, limit: u32, ttl_ms: u64, until: Option<Micros>) -> Vec<String> {
    let mut args = vec![id.to_string(), limit.to_string(), ttl_ms.to_string()];
    args.extend(until.map(|t| t.to_string()));
    args
}

/// Reads the in-flight script's reply `{taken, held}` (`{2, 0}`: too late).
pub fn slot_taken(reply: &[i64]) -> Result<bool, StoreError> {
    match reply {
        [2, _] => Err(StoreError::new(
            StoreErrorKind::Timeout,
            "Redis took the slot call after its caller had given up on it",
        )),
        [taken, _held] => Ok(*taken == 1),
        other => Err(StoreError::new(
            StoreErrorKind::Protocol,
            format!("unexpected in-flight reply {other:?}"),
        )),
    }
}

/// Interprets a bucket script's reply to `checks`: a verdict, or a stale call.
pub fn verdict(checks: &[Check<'_>], reply: &[i64]) -> Result<Verdict, StoreError> {
    if let Some(stale) = floodgate_shared::script::stale_reply(reply) {
        return Err(stale.into());
    }
    Ok(floodgate_shared::script::interpret(checks, reply)?)
}

/// Plain reads of the records the edge caches (configuration, API keys).
pub trait RecordStore {
    /// The value of a string key, `None` when absent.
    fn get(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + MaybeSend;

    /// The values of several string keys (`None` when absent), in ONE round trip
    /// where the store allows it. The default sends the reads at once.
    fn get_many(
        &self,
        keys: &[&str],
    ) -> impl Future<Output = Result<Vec<Option<Vec<u8>>>, StoreError>> + MaybeSend {
        let reads: Vec<_> = keys.iter().map(|k| self.get(k)).collect();
        async move {
            futures_util::future::join_all(reads)
                .await
                .into_iter()
                .collect()
        }
    }

    /// Runs several write commands in ONE round trip (not atomic); fails if any
    /// command failed.
    fn write_batch(
        &self,
        commands: Vec<Vec<String>>,
    ) -> impl Future<Output = Result<(), StoreError>> + MaybeSend;

    /// A health check within the deadline: `PING` where the store speaks it (the
    /// breaker's half-open probe). The default reads a key that need not exist.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        let read = self.get("fg:ping");
        async move { read.await.map(|_| ()) }
    }
}
