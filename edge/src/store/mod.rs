//! Redis behind one trait, [`Store`]: every Redis user of Floodgate (the pipeline,
//! lease mode, the CLI and admin functions, the dashboard, the REST endpoint's
//! health) goes through it, so each works over RESP, Redis Cluster and Upstash's
//! REST protocol alike.
//!
//! A store implements three primitives — run a registered Lua script
//! ([`Store::run`]: `EVALSHA`, falling back to `EVAL` within the same call when the
//! server answers `NOSCRIPT`), one command, and a batch of commands in one round
//! trip — and gets everything else written once here: bucket checks, in-flight
//! slots, leases, and the typed plain commands the admin paths need.
//!
//! Nothing outside this module sees a wire type: replies are [`Value`]s and
//! failures [`StoreError`]s whose Redis error code is parsed once
//! ([`RedisErrorKind`]).

use std::fmt;
use std::time::Duration;

use floodgate_shared::Micros;
use floodgate_shared::changes::Revision;
use floodgate_shared::lease::{LEASE_RETURN, LEASE_TAKE, Taken, leases_key};
use floodgate_shared::script::merge::{self, SharedClock};
use floodgate_shared::script::{
    Call, CallError, CallReply, Check, CreditCheck, Credited, IN_FLIGHT, LuaScript, Moved,
    ProtocolError, REFUND, Stale, TOKEN_BUCKET, Verdict, When, can_watch, credited_call,
    credited_refund_call, interpret_credited, moved_reply, stale_reply, watched_reply,
};
use floodgate_shared::stats::{STATS_FLUSH, StatsWrite};

#[cfg(any(feature = "native", feature = "rest"))]
mod batch;
#[cfg(feature = "native")]
pub mod cluster;
#[cfg(feature = "native")]
mod convert;
#[cfg(feature = "native")]
pub mod native;
#[cfg(feature = "native")]
pub mod resp;
#[cfg(feature = "rest")]
pub mod rest;

#[cfg(feature = "native")]
pub use native::{NativeStore, StoreOptions};

/// What went wrong, and so whether trying again can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// No answer within the deadline. Retrying may help.
    Timeout,
    /// The server answered that it ran the call after its caller had stopped
    /// waiting (the stale-call guard, `When::RedisUntil`): nothing was written. The
    /// server is alive but was slow. Retrying may help.
    Stale,
    /// Could not reach or lost the server. Retrying may help.
    Connect,
    /// The server refused our credentials or the command (`NOAUTH`, `WRONGPASS`,
    /// `NOPERM`, HTTP 401/403). Retrying will not help.
    Auth,
    /// The server answered with an error reply; its code, parsed once.
    Redis(RedisErrorKind),
    /// The reply did not have the agreed shape, or the call was malformed.
    Protocol,
    /// The key's credits moved to another identity's key since the record the
    /// call was built from ([`Moved`]): nothing was decided. The store is fine;
    /// the caller reads the record again.
    Moved,
}

impl StoreErrorKind {
    /// A short name for logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Connect => "connect",
            StoreErrorKind::Auth => "auth",
            StoreErrorKind::Redis(_) => "redis",
            StoreErrorKind::Protocol => "protocol",
            StoreErrorKind::Stale => "stale",
            StoreErrorKind::Moved => "moved",
        }
    }
}

/// The code of a Redis error reply (its first word), parsed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisErrorKind {
    /// `NOSCRIPT`: the server does not know the script's SHA-1.
    NoScript,
    /// `READONLY`: a replica (a demoted primary after a failover).
    ReadOnly,
    /// `MOVED`: the slot has another owner.
    Moved,
    /// `ASK`: the key is being migrated to another node.
    Ask,
    /// `TRYAGAIN`: a multi-key call while its keys are split by a migration.
    TryAgain,
    /// `CLUSTERDOWN`: the cluster cannot serve the slot now.
    ClusterDown,
    /// `CROSSSLOT`: the keys of one call span slots.
    CrossSlot,
    /// `WRONGTYPE`: the key holds another kind of value.
    WrongType,
    /// `BUSY`: a script or function is running.
    Busy,
    /// `UNKILLABLE`: `SCRIPT KILL` or `FUNCTION KILL` refused, the running
    /// script has written (or came from the primary).
    Unkillable,
    /// `NOTBUSY`: `SCRIPT KILL` or `FUNCTION KILL` found nothing running.
    NotBusy,
    /// `LOADING`: the server is loading its dataset.
    Loading,
    /// `MASTERDOWN`: a replica lost its primary.
    MasterDown,
    /// `OOM`: the server is out of memory (`maxmemory`).
    Oom,
    /// `EXECABORT`: a transaction was discarded.
    ExecAbort,
    /// Anything else (`ERR ...`, a script's own error).
    Other,
}

impl RedisErrorKind {
    /// The kind of an error reply's code (its first word). `None` for the codes
    /// that mean the credentials or the command were refused.
    pub fn from_code(code: &str) -> Option<Self> {
        Some(match code {
            "NOSCRIPT" => Self::NoScript,
            "READONLY" => Self::ReadOnly,
            "MOVED" => Self::Moved,
            "ASK" => Self::Ask,
            "TRYAGAIN" => Self::TryAgain,
            "CLUSTERDOWN" => Self::ClusterDown,
            "CROSSSLOT" => Self::CrossSlot,
            "WRONGTYPE" => Self::WrongType,
            "BUSY" => Self::Busy,
            "UNKILLABLE" => Self::Unkillable,
            "NOTBUSY" => Self::NotBusy,
            "LOADING" => Self::Loading,
            "MASTERDOWN" => Self::MasterDown,
            "OOM" => Self::Oom,
            "EXECABORT" => Self::ExecAbort,
            "NOAUTH" | "WRONGPASS" | "NOPERM" => return None,
            _ => Self::Other,
        })
    }

    /// A state of the server that passes (a failover, a migration, a load, a
    /// running script): the same call may succeed later.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::ReadOnly
                | Self::TryAgain
                | Self::ClusterDown
                | Self::Busy
                | Self::Loading
                | Self::MasterDown
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            // Redis' own text already starts with its code
            StoreErrorKind::Redis(_) => f.write_str(&self.message),
            kind => write!(f, "{kind:?}: {}", self.message),
        }
    }
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// An error reply as the server sent it (`WRONGTYPE Operation against ...`),
    /// its code parsed once.
    pub fn reply(message: impl Into<String>) -> Self {
        let message = message.into();
        let code = message.split_whitespace().next().unwrap_or_default();
        let kind = match RedisErrorKind::from_code(code) {
            Some(k) => StoreErrorKind::Redis(k),
            None => StoreErrorKind::Auth,
        };
        Self { kind, message }
    }

    /// The Redis error code, when the server answered with an error reply.
    pub fn redis(&self) -> Option<RedisErrorKind> {
        match self.kind {
            StoreErrorKind::Redis(k) => Some(k),
            _ => None,
        }
    }

    /// Whether the same call may succeed if tried again: the network, the
    /// deadline, or a passing state of the server (failover, migration, load).
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            StoreErrorKind::Timeout | StoreErrorKind::Stale | StoreErrorKind::Connect => true,
            StoreErrorKind::Redis(k) => k.is_transient(),
            StoreErrorKind::Auth | StoreErrorKind::Protocol | StoreErrorKind::Moved => false,
        }
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Protocol, message)
    }

    pub(crate) fn timeout(limit: Duration) -> Self {
        Self::new(
            StoreErrorKind::Timeout,
            format!("no reply within {limit:?}"),
        )
    }
}

impl From<CallError> for StoreError {
    fn from(e: CallError) -> Self {
        Self::protocol(e.to_string())
    }
}

impl From<ProtocolError> for StoreError {
    fn from(e: ProtocolError) -> Self {
        Self::protocol(e.to_string())
    }
}

impl From<Moved> for StoreError {
    fn from(e: Moved) -> Self {
        Self::new(StoreErrorKind::Moved, e.to_string())
    }
}

impl From<Stale> for StoreError {
    /// Redis ran the call too late for its caller: as good as no answer in time,
    /// but an answer (the store is alive).
    fn from(e: Stale) -> Self {
        Self::new(StoreErrorKind::Stale, e.to_string())
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

/// A reply, in Floodgate's own terms (whatever client or protocol carried it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Nil,
    Int(i64),
    /// A bulk string (binary-safe). Over REST every string is one.
    Bulk(Vec<u8>),
    /// A simple status such as `OK` or `PONG` (RESP only).
    Status(String),
    Array(Vec<Value>),
    /// An error reply inside a batch, a transaction or an array.
    Error(StoreError),
}

impl Value {
    /// The value as text, when it is a UTF-8 string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Bulk(b) => std::str::from_utf8(b).ok(),
            Value::Status(s) => Some(s),
            _ => None,
        }
    }

    /// An error reply becomes `Err`; anything else stays.
    pub fn ok(self) -> Result<Value, StoreError> {
        match self {
            Value::Error(e) => Err(e),
            v => Ok(v),
        }
    }

    /// A script's array of integers.
    pub fn into_ints(self) -> Result<Vec<i64>, StoreError> {
        match self.ok()? {
            Value::Array(items) => items
                .into_iter()
                .map(|i| match i {
                    Value::Int(v) => Ok(v),
                    other => Err(StoreError::protocol(format!(
                        "non-integer in script reply: {other:?}"
                    ))),
                })
                .collect(),
            other => Err(StoreError::protocol(format!(
                "unexpected script reply: {other:?}"
            ))),
        }
    }

    /// A string, or `None` for nil.
    pub fn into_bytes(self) -> Result<Option<Vec<u8>>, StoreError> {
        match self.ok()? {
            Value::Nil => Ok(None),
            Value::Bulk(b) => Ok(Some(b)),
            Value::Status(s) => Ok(Some(s.into_bytes())),
            other => Err(StoreError::protocol(format!(
                "expected a string, got {other:?}"
            ))),
        }
    }

    pub fn into_int(self) -> Result<i64, StoreError> {
        match self.ok()? {
            Value::Int(i) => Ok(i),
            other => Err(StoreError::protocol(format!(
                "expected an integer, got {other:?}"
            ))),
        }
    }

    /// An array of strings (nil as an empty array; nil items skipped).
    /// An array of strings and nils (`MGET`, `HMGET`), each as bytes or `None`.
    pub fn into_list(self) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        match self.ok()? {
            Value::Array(items) => items.into_iter().map(|v| string_or_none(v.ok())).collect(),
            other => Err(StoreError::protocol(format!(
                "expected an array, got {other:?}"
            ))),
        }
    }

    pub fn into_byte_list(self) -> Result<Vec<Vec<u8>>, StoreError> {
        match self.ok()? {
            Value::Nil => Ok(vec![]),
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    if let Some(b) = item.into_bytes()? {
                        out.push(b);
                    }
                }
                Ok(out)
            }
            other => Err(StoreError::protocol(format!(
                "expected an array, got {other:?}"
            ))),
        }
    }
}

/// A hash's fields and values, as [`Store::hgetall_many`] reads them.
pub type HashFields = Vec<(Vec<u8>, Vec<u8>)>;

/// How [`Store::set`] writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetOptions {
    pub condition: Option<SetCondition>,
    /// Expire the key after this long (`PX`).
    pub expire: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetCondition {
    /// Only if the key does not exist (`NX`).
    Missing,
    /// Only if the key exists (`XX`).
    Present,
}

impl SetOptions {
    pub const NX: SetOptions = SetOptions {
        condition: Some(SetCondition::Missing),
        expire: None,
    };
    pub const XX: SetOptions = SetOptions {
        condition: Some(SetCondition::Present),
        expire: None,
    };

    pub fn expire(self, after: Duration) -> Self {
        Self {
            expire: Some(after),
            ..self
        }
    }
}

/// One command's words as bytes.
pub fn words<S: AsRef<[u8]> + ?Sized>(parts: &[&S]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.as_ref().to_vec()).collect()
}

/// A place where buckets and records live: the primitives each store
/// implements, and everything Floodgate does with Redis written once on top.
/// Every future is `Send` natively ([`MaybeSend`]), so a host can finish a call
/// that missed its deadline in the background.
pub trait Store: MaybeSync {
    /// Runs a registered script in ONE round trip: `EVALSHA`, and `EVAL` with the
    /// source within the same call when the server does not know it (after a
    /// restart, a failover or `SCRIPT FLUSH`).
    fn run(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> impl Future<Output = Result<Value, StoreError>> + MaybeSend;

    /// One command (binary-safe arguments). An error reply is `Err`.
    fn command(
        &self,
        args: &[&[u8]],
    ) -> impl Future<Output = Result<Value, StoreError>> + MaybeSend;

    /// Several commands in ONE round trip, not atomic; one reply per command,
    /// error replies as [`Value::Error`].
    fn pipeline(
        &self,
        commands: &[Vec<Vec<u8>>],
    ) -> impl Future<Output = Result<Vec<Value>, StoreError>> + MaybeSend;

    /// A script replying with an array of integers.
    fn run_ints(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + MaybeSend {
        async move { self.run(script, keys, args).await?.into_ints() }
    }

    /// Floodgate's one check: decides `call`'s buckets — and what rides along
    /// ([`Call`]: the key's credits, the records' revision, the API key record,
    /// identical requests merged) — in ONE atomic round trip, all or nothing (a
    /// denial consumes nothing), by the clock `call.when` says: Redis' `TIME`
    /// (`None`), Redis' `TIME` only until an instant ([`When::RedisUntil`]: a
    /// later call changes nothing and fails as a timeout), or an explicit
    /// instant (tests). The revision is read where the script and the store
    /// can (the token bucket script, one slot) and left out elsewhere; merged
    /// requests, a record and credits are refused, nothing sent, where they
    /// cannot ride (only token buckets merge; a record is read with token
    /// buckets on one slot; credits neither merge nor read a record). A
    /// stale call is [`StoreErrorKind::Stale`], credits that moved
    /// [`StoreErrorKind::Moved`].
    fn decide(
        &self,
        call: Call<'_>,
    ) -> impl Future<Output = Result<CallReply, StoreError>> + MaybeSend {
        async move {
            let Call {
                checks,
                when,
                credits,
                watch,
                record,
                count,
            } = call;
            let (script, mut args) = credited_call(checks, credits, when)?;
            let merged = count > 1;
            if merged {
                let clock = (script.sha1 == TOKEN_BUCKET.sha1 && credits.is_none())
                    .then(|| SharedClock::parse(&args[0]))
                    .flatten()
                    .filter(|_| record.is_none())
                    .ok_or_else(|| {
                        StoreError::protocol(format!(
                            "{count} requests in one call: only token buckets' checks merge"
                        ))
                    })?;
                args[0] = clock.counted(count);
            }
            let watch = watch.filter(|_| self.one_slot() && credits.is_none() && can_watch(checks));
            if record.is_some() && watch.is_none() {
                return Err(StoreError::protocol(
                    "a record is read with token buckets on one slot only",
                ));
            }
            let mut keys: Vec<&str> = checks.iter().map(|c| c.key).collect();
            keys.extend(
                credits
                    .map(|c| c.key)
                    .into_iter()
                    .chain(watch)
                    .chain(record),
            );
            let (ints, read) = reading_reply(self.run(script, &keys, &args).await?)?;
            if let Some(moved) = moved_reply(&ints) {
                return Err(moved.into());
            }
            if record.is_some() && read.is_none() {
                return match ints.as_slice() {
                    [4, _] => Ok(CallReply::NoRecord),
                    _ => Err(StoreError::protocol(format!(
                        "a record-reading reply without its record: {ints:?}"
                    ))),
                };
            }
            let replies = if merged {
                merge::split_call(keys.len(), &args, &ints)
                    .map_err(|e| StoreError::protocol(e.to_string()))?
            } else {
                vec![ints]
            };
            let each = replies
                .iter()
                .map(|r| decided_one(checks, credits, watch.is_some(), r))
                .collect::<Result<_, _>>()?;
            Ok(CallReply::Done { each, record: read })
        }
    }

    /// [`Store::decide`] of a plain call: `checks` for one request.
    fn check(
        &self,
        checks: &[Check<'_>],
        when: impl Into<When> + MaybeSend,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + MaybeSend {
        let call = Call::new(checks, when);
        async move {
            match self.decide(call).await?.one() {
                Some(c) => Ok(c.verdict),
                None => Err(StoreError::protocol("a plain check decided nothing")),
            }
        }
    }

    /// Whether any keys may go together in one script call (`false`: Redis
    /// Cluster, where a call's keys must share a slot).
    fn one_slot(&self) -> bool {
        true
    }

    /// Gives back what an admitted call over `checks` (and the key's
    /// `credits`, when it decided them) consumed (`lua/refund.lua`), for a
    /// request refused after all: the one refund.
    fn refund<'a>(
        &self,
        checks: &[Check<'a>],
        credits: Option<&CreditCheck<'a>>,
        credited: &Credited,
    ) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        let call = credited_refund_call(checks, credits, credited);
        async move {
            match call {
                Some((keys, args)) => self.run(&REFUND, &keys, &args).await?.ok().map(|_| ()),
                None => Ok(()),
            }
        }
    }

    /// Takes an in-flight slot `id` in the set `key` when fewer than `limit`
    /// unexpired slots are held (`lua/in_flight.lua`); the slot expires after
    /// `ttl_ms` unless released. `until`: the last instant (Redis' clock) at which
    /// the caller still waits for the answer (later: nothing is taken, a timeout).
    /// `Ok(false)`: the limit is reached.
    fn acquire_slot(
        &self,
        key: &str,
        id: &str,
        limit: u32,
        ttl_ms: u64,
        until: Option<Micros>,
    ) -> impl Future<Output = Result<bool, StoreError>> + MaybeSend {
        let args = slot_args(id, limit, ttl_ms, until);
        async move { slot_taken(&self.run_ints(&IN_FLIGHT, &[key], &args).await?) }
    }

    /// Releases a slot (a no-op when it already expired).
    fn release_slot(
        &self,
        key: &str,
        id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        async move {
            self.command(&[b"ZREM", key.as_bytes(), id.as_bytes()])
                .await
                .map(|_| ())
        }
    }

    /// Lease mode: decides one request exactly and leases tokens from the bucket
    /// `key` (`lua/lease_take.lua`; `args` from `LeaseConfig::take_args`).
    fn take_lease(
        &self,
        key: &str,
        args: &[String],
    ) -> impl Future<Output = Result<Taken, StoreError>> + MaybeSend {
        async move {
            let leases = leases_key(key);
            let reply = self.run_ints(&LEASE_TAKE, &[key, &leases], args).await?;
            Taken::from_reply(&reply).map_err(StoreError::protocol)
        }
    }

    /// Lease mode: gives unused leased tokens back (`lua/lease_return.lua`).
    fn return_lease(
        &self,
        key: &str,
        args: &[String],
    ) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        async move {
            let leases = leases_key(key);
            self.run(&LEASE_RETURN, &[key, &leases], args)
                .await?
                .ok()
                .map(|_| ())
        }
    }

    /// A health check within the deadline (the breaker's half-open probe).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        async move { self.command(&[b"PING"]).await.map(|_| ()) }
    }

    /// The value of a string key; `None` when absent (or not a string: the edge
    /// treats a foreign key as no record).
    fn get(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + MaybeSend {
        async move { string_or_none(self.command(&[b"GET", key.as_bytes()]).await) }
    }

    /// The values of several string keys (`None` when absent or not a string), in
    /// ONE round trip: one `MGET` (one billed command, read atomically), or under
    /// Redis Cluster a pipeline of `GET`s (the keys may span slots).
    fn get_many(
        &self,
        keys: &[&str],
    ) -> impl Future<Output = Result<Vec<Option<Vec<u8>>>, StoreError>> + MaybeSend {
        let one_slot = self.one_slot();
        let mget = words(&[&["MGET"][..], keys].concat());
        let gets: Vec<Vec<Vec<u8>>> = keys
            .iter()
            .map(|k| vec![b"GET".to_vec(), k.as_bytes().to_vec()])
            .collect();
        let n = keys.len();
        async move {
            if n == 0 {
                return Ok(vec![]);
            }
            let values = if one_slot {
                let refs: Vec<&[u8]> = mget.iter().map(Vec::as_slice).collect();
                match self.command(&refs).await?.ok()? {
                    Value::Array(items) if items.len() == n => items,
                    other => {
                        return Err(StoreError::protocol(format!(
                            "unexpected MGET reply {other:?}"
                        )));
                    }
                }
            } else {
                self.pipeline(&gets).await?
            };
            values.into_iter().map(|v| string_or_none(v.ok())).collect()
        }
    }

    /// [`Store::get`] as text (invalid UTF-8 replaced).
    fn get_text(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + MaybeSend {
        async move {
            Ok(self
                .get(key)
                .await?
                .map(|b| String::from_utf8_lossy(&b).into_owned()))
        }
    }

    /// Writes one statistics flush ([`StatsWrite`]): ONE call of
    /// `lua/stats_flush.lua` on a store of one slot, one per key on a cluster
    /// (sent together); fails if any call failed (the script writes nothing when
    /// it refuses its input).
    fn write_stats(
        &self,
        write: &StatsWrite,
    ) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        let calls = write.calls(self.one_slot());
        async move {
            // one after another: Redis serves other clients between them
            for (keys, args) in &calls {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                self.run(&STATS_FLUSH, &keys, args).await?.ok()?;
            }
            Ok(())
        }
    }

    /// `SET` with its options. `Ok(false)`: a condition (`NX`/`XX`) refused it.
    fn set(
        &self,
        key: &str,
        value: &[u8],
        options: SetOptions,
    ) -> impl Future<Output = Result<bool, StoreError>> + MaybeSend {
        async move {
            let mut args: Vec<&[u8]> = vec![b"SET", key.as_bytes(), value];
            let ms;
            if let Some(after) = options.expire {
                ms = after.as_millis().max(1).to_string();
                args.extend([b"PX".as_slice(), ms.as_bytes()]);
            }
            match options.condition {
                Some(SetCondition::Missing) => args.push(b"NX"),
                Some(SetCondition::Present) => args.push(b"XX"),
                None => {}
            }
            Ok(!matches!(self.command(&args).await?, Value::Nil))
        }
    }

    /// `DEL`: how many of `keys` existed.
    fn del(&self, keys: &[&str]) -> impl Future<Output = Result<u64, StoreError>> + MaybeSend {
        async move {
            let mut args: Vec<&[u8]> = vec![b"DEL"];
            args.extend(keys.iter().map(|k| k.as_bytes()));
            Ok(self.command(&args).await?.into_int()?.max(0) as u64)
        }
    }

    fn hget(
        &self,
        key: &str,
        field: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + MaybeSend {
        async move {
            self.command(&[b"HGET", key.as_bytes(), field.as_bytes()])
                .await?
                .into_bytes()
        }
    }

    /// `HSETNX`: whether the field was new.
    fn hsetnx(
        &self,
        key: &str,
        field: &str,
        value: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + MaybeSend {
        async move {
            Ok(self
                .command(&[b"HSETNX", key.as_bytes(), field.as_bytes(), value])
                .await?
                .into_int()?
                == 1)
        }
    }

    fn hkeys(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Vec<Vec<u8>>, StoreError>> + MaybeSend {
        async move {
            self.command(&[b"HKEYS", key.as_bytes()])
                .await?
                .into_byte_list()
        }
    }

    /// Every field and value of each hash in `keys`, in ONE round trip.
    fn hgetall_many(
        &self,
        keys: &[String],
    ) -> impl Future<Output = Result<Vec<HashFields>, StoreError>> + MaybeSend {
        let commands: Vec<Vec<Vec<u8>>> = keys
            .iter()
            .map(|k| vec![b"HGETALL".to_vec(), k.as_bytes().to_vec()])
            .collect();
        async move {
            let mut out = Vec::with_capacity(commands.len());
            for reply in self.pipeline(&commands).await? {
                let flat = reply.into_byte_list()?;
                let mut pairs = Vec::with_capacity(flat.len() / 2);
                let mut it = flat.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                out.push(pairs);
            }
            Ok(out)
        }
    }

    /// The elements of a list in `start..=stop` (a missing key is an empty list).
    fn lrange(
        &self,
        key: &str,
        start: i64,
        stop: i64,
    ) -> impl Future<Output = Result<Vec<Vec<u8>>, StoreError>> + MaybeSend {
        async move {
            let (start, stop) = (start.to_string(), stop.to_string());
            self.command(&[b"LRANGE", key.as_bytes(), start.as_bytes(), stop.as_bytes()])
                .await?
                .into_byte_list()
        }
    }

    /// Pushes `item` at the head of the list `key` and keeps its newest `keep`
    /// items, in one round trip.
    fn push_capped(
        &self,
        key: &str,
        item: &[u8],
        keep: usize,
    ) -> impl Future<Output = Result<(), StoreError>> + MaybeSend {
        let last = keep.max(1) - 1;
        let commands = vec![
            vec![b"LPUSH".to_vec(), key.as_bytes().to_vec(), item.to_vec()],
            vec![
                b"LTRIM".to_vec(),
                key.as_bytes().to_vec(),
                b"0".to_vec(),
                last.to_string().into_bytes(),
            ],
        ];
        async move {
            for reply in self.pipeline(&commands).await? {
                reply.ok()?;
            }
            Ok(())
        }
    }
}

/// A string reply, `None` for nil and for a key holding another type.
fn string_or_none(reply: Result<Value, StoreError>) -> Result<Option<Vec<u8>>, StoreError> {
    match reply {
        Err(e) if e.redis() == Some(RedisErrorKind::WrongType) => Ok(None),
        reply => reply?.into_bytes(),
    }
}

/// A check's reply as its integers and, when it ends with one (a record
/// read in the same call), the record's bytes.
fn reading_reply(reply: Value) -> Result<(Vec<i64>, Option<Vec<u8>>), StoreError> {
    let Value::Array(mut items) = reply.ok()? else {
        return Err(StoreError::protocol("a record-reading reply is an array"));
    };
    let record = match items.last() {
        Some(Value::Bulk(_) | Value::Status(_)) => items.pop().and_then(|v| v.into_bytes().ok()?),
        _ => None,
    };
    Ok((Value::Array(items).into_ints()?, record))
}

/// One request's reply of a [`Store::decide`] call: stale, or its verdict
/// (and credits), with the revision when the call read it.
fn decided_one(
    checks: &[Check<'_>],
    credits: Option<&CreditCheck<'_>>,
    watched: bool,
    reply: &[i64],
) -> Result<Credited, StoreError> {
    if let Some(stale) = stale_reply(reply) {
        return Err(stale.into());
    }
    let (reply, revision) = if watched {
        watched_reply(reply)?
    } else {
        (reply, Revision::NotAsked)
    };
    let mut credited = interpret_credited(checks, credits, reply)?;
    credited.verdict.revision = revision;
    Ok(credited)
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
            StoreErrorKind::Stale,
            "Redis took the slot call after its caller had given up on it",
        )),
        [taken, _held] => Ok(*taken == 1),
        other => Err(StoreError::protocol(format!(
            "unexpected in-flight reply {other:?}"
        ))),
    }
}

pub use crate::sync::lock;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_parsed_once_into_kinds() {
        let cases = [
            (
                "NOSCRIPT No matching script. Please use EVAL.",
                StoreErrorKind::Redis(RedisErrorKind::NoScript),
            ),
            (
                "READONLY You can't write against a read only replica.",
                StoreErrorKind::Redis(RedisErrorKind::ReadOnly),
            ),
            (
                "MOVED 3999 127.0.0.1:6381",
                StoreErrorKind::Redis(RedisErrorKind::Moved),
            ),
            (
                "ASK 3999 127.0.0.1:6381",
                StoreErrorKind::Redis(RedisErrorKind::Ask),
            ),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                StoreErrorKind::Redis(RedisErrorKind::TryAgain),
            ),
            (
                "CLUSTERDOWN The cluster is down",
                StoreErrorKind::Redis(RedisErrorKind::ClusterDown),
            ),
            (
                "CROSSSLOT Keys in request don't hash to the same slot",
                StoreErrorKind::Redis(RedisErrorKind::CrossSlot),
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                StoreErrorKind::Redis(RedisErrorKind::WrongType),
            ),
            (
                "BUSY Redis is busy running a script.",
                StoreErrorKind::Redis(RedisErrorKind::Busy),
            ),
            (
                "UNKILLABLE Sorry the script already executed write commands against the dataset.",
                StoreErrorKind::Redis(RedisErrorKind::Unkillable),
            ),
            (
                "NOTBUSY No scripts in execution right now.",
                StoreErrorKind::Redis(RedisErrorKind::NotBusy),
            ),
            (
                "LOADING Redis is loading the dataset in memory",
                StoreErrorKind::Redis(RedisErrorKind::Loading),
            ),
            (
                "MASTERDOWN Link with MASTER is down",
                StoreErrorKind::Redis(RedisErrorKind::MasterDown),
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                StoreErrorKind::Redis(RedisErrorKind::Oom),
            ),
            (
                "EXECABORT Transaction discarded because of previous errors.",
                StoreErrorKind::Redis(RedisErrorKind::ExecAbort),
            ),
            (
                "ERR unknown command 'NOPE'",
                StoreErrorKind::Redis(RedisErrorKind::Other),
            ),
            ("NOAUTH Authentication required.", StoreErrorKind::Auth),
            (
                "WRONGPASS invalid username-password pair or user is disabled.",
                StoreErrorKind::Auth,
            ),
            (
                "NOPERM User eve has no permissions to run the 'get' command",
                StoreErrorKind::Auth,
            ),
            ("", StoreErrorKind::Redis(RedisErrorKind::Other)),
        ];
        for (text, kind) in cases {
            let e = StoreError::reply(text);
            assert_eq!(e.kind, kind, "{text}");
            assert_eq!(e.message, text, "Redis' own text is kept");
            if e.redis().is_some() {
                assert_eq!(e.to_string(), text);
            }
        }
    }

    #[test]
    fn passing_server_states_and_the_network_are_retryable() {
        for (text, retry) in [
            ("READONLY x", true),
            ("TRYAGAIN x", true),
            ("CLUSTERDOWN x", true),
            ("BUSY x", true),
            ("LOADING x", true),
            ("MASTERDOWN x", true),
            ("NOSCRIPT x", false),
            ("WRONGTYPE x", false),
            ("OOM x", false),
            ("ERR x", false),
            ("WRONGPASS x", false),
        ] {
            assert_eq!(StoreError::reply(text).is_retryable(), retry, "{text}");
        }
        assert!(StoreError::timeout(Duration::from_millis(3)).is_retryable());
        assert!(StoreError::new(StoreErrorKind::Connect, "x").is_retryable());
        assert!(!StoreError::protocol("x").is_retryable());
    }

    #[test]
    fn values_convert_to_what_callers_expect() {
        let ints = Value::Array(vec![Value::Int(1), Value::Int(-2)]);
        assert_eq!(ints.into_ints().unwrap(), [1, -2]);
        assert!(Value::Array(vec![Value::Nil]).into_ints().is_err());
        let e = Value::Error(StoreError::reply("WRONGTYPE x"));
        assert_eq!(
            e.clone().into_bytes().unwrap_err().redis(),
            Some(RedisErrorKind::WrongType)
        );
        assert_eq!(Value::Nil.into_bytes().unwrap(), None);
        assert_eq!(Value::Status("OK".into()).as_str(), Some("OK"));
        assert_eq!(
            Value::Array(vec![Value::Bulk(b"a".to_vec()), Value::Nil])
                .into_byte_list()
                .unwrap(),
            [b"a".to_vec()]
        );
        assert_eq!(Value::Nil.into_byte_list().unwrap(), Vec::<Vec<u8>>::new());
    }
}
