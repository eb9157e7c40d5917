//! The Lua scripts (embedded with their SHA-1) and the pure halves of calling them:
//! building the arguments and turning the reply into decisions. Both Redis clients
//! (RESP and REST) are thin I/O around these two functions.

use crate::bucket::{Admission, BucketState, Decision, decide};
use crate::calendar::CalendarPeriod;
use crate::changes::Revision;
use crate::credits::{CreditDecision, CreditState, Credits, Interval, MAX_CREDITS};
use crate::keys::MAX_KEY_LEN;
use crate::policy::{Algorithm, Quota};
use crate::time::{MAX_INSTANT, Micros};
use crate::windows;

pub mod merge;

mod sha {
    include!(concat!(env!("OUT_DIR"), "/script_sha1.rs"));
}

/// A Lua script and its SHA-1 (what `SCRIPT LOAD` returns and `EVALSHA` takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LuaScript {
    pub source: &'static str,
    pub sha1: &'static str,
}

impl LuaScript {
    /// The words of one call: `EVALSHA <sha1>` (or, `by_source`, `EVAL <source>`,
    /// the fallback on NOSCRIPT), the number of keys, the keys, the arguments.
    /// `numkeys` is `keys.len()` as text, owned by the caller.
    pub fn call_words<'a>(
        &'a self,
        by_source: bool,
        numkeys: &'a str,
        keys: impl IntoIterator<Item = &'a str>,
        args: &'a [String],
    ) -> Vec<&'a str> {
        let (cmd, script) = if by_source {
            ("EVAL", self.source)
        } else {
            ("EVALSHA", self.sha1)
        };
        let mut words = vec![cmd, script, numkeys];
        words.extend(keys);
        words.extend(args.iter().map(String::as_str));
        words
    }
}

/// `lua/token_bucket.lua`.
pub const TOKEN_BUCKET: LuaScript = LuaScript {
    source: sha::TOKEN_BUCKET_SOURCE,
    sha1: sha::TOKEN_BUCKET_SHA1,
};

/// `lua/limiter.lua`: every algorithm and shadow buckets, in one atomic call.
pub const LIMITER: LuaScript = LuaScript {
    source: sha::LIMITER_SOURCE,
    sha1: sha::LIMITER_SHA1,
};

/// `lua/refund.lua`: gives back what an admitted call consumed (see [`refund_call`]).
pub const REFUND: LuaScript = LuaScript {
    source: sha::REFUND_SOURCE,
    sha1: sha::REFUND_SHA1,
};

/// `lua/in_flight.lua`: takes one in-flight slot (the concurrency limiter).
pub const IN_FLIGHT: LuaScript = LuaScript {
    source: sha::IN_FLIGHT_SOURCE,
    sha1: sha::IN_FLIGHT_SHA1,
};

/// The sorted set of in-flight slots next to a bucket (same hash tag).
pub fn in_flight_key(bucket_key: &str) -> String {
    format!("{bucket_key}:inflight")
}

/// Which clock a script call decides by (`ARGV[1]` of the bucket scripts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Redis' `TIME`: one clock for every edge (production).
    Redis,
    /// Redis' `TIME`, but only while it is at most this instant (Redis' clock, µs):
    /// a call Redis runs later changes nothing and replies [`Stale`]. The caller
    /// passes the last instant at which it still waits for the answer, so a
    /// request it has already refused can never be charged.
    RedisUntil(Micros),
    /// This instant (tests, replays).
    At(Micros),
}

impl From<Option<Micros>> for When {
    /// `None` is [`When::Redis`], `Some(t)` is [`When::At`].
    fn from(now: Option<Micros>) -> Self {
        now.map_or(When::Redis, When::At)
    }
}

/// Redis ran the call after the instant its caller gave it ([`When::RedisUntil`]):
/// nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Redis ran the call at {now} µs, after its caller had given up on it")]
pub struct Stale {
    /// Redis' clock when it refused the call.
    pub now: Micros,
}

/// The reply `{2, now}` of a bucket script refusing a stale call.
pub fn stale_reply(reply: &[i64]) -> Option<Stale> {
    match reply {
        [2, now] => Some(Stale { now: *now }),
        _ => None,
    }
}

/// The limiter found the key's live credits moved to another key (the key's
/// identity changed since the record the call was built from, see
/// [`crate::credits::MOVED`]): nothing was decided or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key's credits moved to another identity: its record is stale")]
pub struct Moved;

/// The reply `{3, now}` of the limiter finding the key's credits moved.
pub fn moved_reply(reply: &[i64]) -> Option<Moved> {
    matches!(reply, [3, _]).then_some(Moved)
}

/// At most this many buckets are checked in one call.
pub const MAX_CHECKS: usize = 16;

/// One bucket to check for one request.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    pub key: &'a str,
    pub quota: &'a Quota,
    pub cost: u32,
    /// Decided and counted, never enforced (see [`LIMITER`]).
    pub shadow: bool,
}

impl<'a> Check<'a> {
    /// An enforced check.
    pub fn new(key: &'a str, quota: &'a Quota, cost: u32) -> Self {
        Check {
            key,
            quota,
            cost,
            shadow: false,
        }
    }
}

/// Whether a call needs [`LIMITER`]: some bucket is not an enforced token bucket.
pub fn needs_limiter(checks: &[Check<'_>]) -> bool {
    checks.iter().any(|c| needs_limiter_for(c.quota, c.shadow))
}

/// Whether one bucket of `quota` (`shadow` or not) takes [`LIMITER`] rather than
/// [`TOKEN_BUCKET`], whose calls alone decide identical requests together
/// ([`merge`]).
pub fn needs_limiter_for(quota: &Quota, shadow: bool) -> bool {
    shadow || quota.algorithm() != Algorithm::TokenBucket
}

/// A key's credits, decided in the same [`LIMITER`] call as its buckets (the
/// call's last key): see [`crate::credits`].
#[derive(Debug, Clone, Copy)]
pub struct CreditCheck<'a> {
    /// [`crate::keys::credits_key`].
    pub key: &'a str,
    /// What the key's record states.
    pub credits: &'a Credits,
    /// The instant (µs) the record's count stands as of: an absent live count
    /// is `credits.remaining` as of then, with every refill since applied.
    pub origin: Micros,
    /// Credits this request spends.
    pub cost: u64,
}

impl CreditCheck<'_> {
    /// The credits entry's four `ARGV` values: the code (`k`, `kd:<amount>` or
    /// `km<day>:<amount>`), the record's count, its origin and the cost.
    fn args(&self) -> Result<[String; 4], CallError> {
        let c = self.credits;
        let amount = c.refill.map_or(0, |r| r.amount);
        if c.remaining > MAX_CREDITS
            || amount > MAX_CREDITS
            || self.cost > MAX_CREDITS
            || !(0..=MAX_INSTANT).contains(&self.origin)
        {
            return Err(CallError::Credits);
        }
        let code = match c.refill {
            None => "k".to_string(),
            Some(r) if r.interval == Interval::Daily => format!("kd:{}", r.amount),
            Some(r) => format!("km{}:{}", r.day_of_month(), r.amount),
        };
        Ok([
            code,
            c.remaining.to_string(),
            self.origin.to_string(),
            self.cost.to_string(),
        ])
    }

    /// The credits' decision from the state the script read: the pure twin.
    pub fn decide(&self, read: CreditState, now: Micros) -> CreditDecision {
        read.spend(self.credits.refill.as_ref(), now, self.cost)
    }
}

/// The outcome of a call over buckets and a key's credits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credited {
    /// The buckets' verdict; `admitted` is the call's (credits included): a
    /// request refused for its credits alone is not admitted while every
    /// decision allowed it (none was consumed).
    pub verdict: Verdict,
    /// The credits' decision, when the call decided credits.
    pub credits: Option<CreditDecision>,
}

impl Credited {
    /// Refused for the credits alone: every bucket had room.
    pub fn credits_refused(&self) -> bool {
        self.credits.is_some_and(|c| !c.admitted)
            && self
                .verdict
                .decisions
                .iter()
                .zip(&self.verdict.shadow)
                .all(|(d, s)| *s || d.allowed())
    }
}

impl From<Verdict> for Credited {
    /// A verdict of a call without credits.
    fn from(verdict: Verdict) -> Self {
        Credited {
            verdict,
            credits: None,
        }
    }
}

/// ONE call deciding a request's buckets, all or nothing (a denial consumes
/// nothing): what the store's one check (`Store::decide`) is asked. What rides
/// in the same round trip, each optional: the key's credits (`limiter.lua`),
/// the records' revision (read where the script and store can), the API key
/// record (an edge that never read it: `token_bucket.lua`'s KEYS[n+2]), and
/// identical requests decided one after another at one instant (`count`,
/// [`merge`]).
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub checks: &'a [Check<'a>],
    pub when: When,
    pub credits: Option<&'a CreditCheck<'a>>,
    /// The records' revision counter ([`crate::changes::REV_KEY`]).
    pub watch: Option<&'a str>,
    /// The API key record to read: without it nothing is decided
    /// ([`CallReply::NoRecord`]). Token buckets on a store of one slot only.
    pub record: Option<&'a str>,
    /// Identical requests decided in this call (token buckets only; 1: one).
    pub count: usize,
}

impl<'a> Call<'a> {
    /// A plain call: `checks` for one request, by the clock `when` says.
    pub fn new(checks: &'a [Check<'a>], when: impl Into<When>) -> Self {
        Call {
            checks,
            when: when.into(),
            credits: None,
            watch: None,
            record: None,
            count: 1,
        }
    }
}

/// What a [`Call`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallReply {
    /// The call's record is not there: nothing was decided or written.
    NoRecord,
    /// Each request's verdict (and credits), in order; the record as read,
    /// when the call asked for it.
    Done {
        each: Vec<Credited>,
        record: Option<Vec<u8>>,
    },
}

impl CallReply {
    /// The decision of a call of one request (`None`: no record).
    pub fn one(self) -> Option<Credited> {
        match self {
            CallReply::Done { each, .. } => each.into_iter().next(),
            CallReply::NoRecord => None,
        }
    }
}

/// The script and `ARGV` of one call over `checks` and, when the key has
/// credits, `credits`: [`script_call`] without credits (so a key without credits
/// pays exactly what it did), else [`LIMITER`] with the credits as its last entry.
pub fn credited_call(
    checks: &[Check<'_>],
    credits: Option<&CreditCheck<'_>>,
    when: impl Into<When>,
) -> Result<(&'static LuaScript, Vec<String>), CallError> {
    let Some(credits) = credits else {
        return script_call(checks, when);
    };
    if checks.iter().any(|c| c.key == credits.key) {
        return Err(CallError::Duplicate(credits.key.to_string()));
    }
    let when = when.into();
    let mut args = if checks.is_empty() {
        vec![when_arg(when)?]
    } else {
        limiter_args(checks, when)?
    };
    args.extend(credits.args()?);
    Ok((&LIMITER, args))
}

/// Interprets the reply of the call [`credited_call`] built.
pub fn interpret_credited(
    checks: &[Check<'_>],
    credits: Option<&CreditCheck<'_>>,
    reply: &[i64],
) -> Result<Credited, ProtocolError> {
    let Some(credit) = credits else {
        return Ok(Credited {
            verdict: interpret(checks, reply)?,
            credits: None,
        });
    };
    let (admitted, now) = reply_head(reply, 3, checks.len() + 1)?;
    let (buckets, tail) = reply.split_at(reply.len() - 3);
    let read = match tail {
        [remaining, as_of, 0]
            if (0..=MAX_CREDITS as i64).contains(remaining)
                && (0..=MAX_INSTANT).contains(as_of) =>
        {
            CreditState {
                remaining: *remaining as u64,
                as_of: *as_of,
            }
        }
        other => return Err(ProtocolError(format!("credit state {other:?}"))),
    };
    let mut decision = credit.decide(read, now);
    let (decisions, all_fit) = limiter_decisions(checks, &buckets[2..], now, admitted)?;
    if (all_fit && decision.admitted) != admitted {
        return Err(ProtocolError(format!(
            "script says admitted={admitted}, its twins say buckets {all_fit}, credits {}",
            decision.admitted
        )));
    }
    if !admitted && decision.admitted {
        // a bucket denied: the credits were not spent, report them as they are
        decision = CreditCheck { cost: 0, ..*credit }.decide(read, now);
    }
    Ok(Credited {
        verdict: Verdict {
            admitted,
            now,
            shadow: checks.iter().map(|c| c.shadow).collect(),
            decisions,
            revision: Revision::NotAsked,
        },
        credits: Some(decision),
    })
}

/// The script and `ARGV` of one call over `checks`: [`TOKEN_BUCKET`] when every
/// bucket is an enforced token bucket (the hot path), else [`LIMITER`].
pub fn script_call(
    checks: &[Check<'_>],
    when: impl Into<When>,
) -> Result<(&'static LuaScript, Vec<String>), CallError> {
    if needs_limiter(checks) {
        Ok((&LIMITER, limiter_args(checks, when)?))
    } else {
        Ok((&TOKEN_BUCKET, token_bucket_args(checks, when)?))
    }
}

/// Interprets the reply of the script [`script_call`] chose.
pub fn interpret(checks: &[Check<'_>], reply: &[i64]) -> Result<Verdict, ProtocolError> {
    if needs_limiter(checks) {
        interpret_limiter(checks, reply)
    } else {
        interpret_token_bucket(checks, reply)
    }
}

/// Whether a call over `checks` can read the records' revision too: the token
/// bucket script reads it in the same `MGET` as the buckets ([`watched_reply`]).
pub fn can_watch(checks: &[Check<'_>]) -> bool {
    !needs_limiter(checks)
}

/// Splits a [`TOKEN_BUCKET`] reply that read the revision key (its last value) into
/// the bucket reply and the revision.
pub fn watched_reply(reply: &[i64]) -> Result<(&[i64], Revision), ProtocolError> {
    if stale_reply(reply).is_some() {
        // a stale call's `{2, now}` carries no revision
        return Ok((reply, Revision::NotAsked));
    }
    match reply.split_last() {
        Some((&rev, head)) if rev >= -1 => Ok((head, Revision::Seen(u64::try_from(rev).ok()))),
        _ => Err(ProtocolError(format!(
            "a watched reply ends with a revision: {reply:?}"
        ))),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("a call checks between 1 and {MAX_CHECKS} buckets, got {0}")]
    Count(usize),
    #[error("bucket key {0:?} is empty or longer than {MAX_KEY_LEN} bytes")]
    Key(String),
    #[error("bucket key {0:?} appears twice in one call")]
    Duplicate(String),
    #[error("instant {0} is outside 0..=2^52 µs")]
    Instant(Micros),
    #[error("credits, a refill or a credit cost above the bound, or an origin outside 0..=2^52 µs")]
    Credits,
}

fn validate_call(checks: &[Check<'_>], when: When) -> Result<String, CallError> {
    if checks.is_empty() || checks.len() > MAX_CHECKS {
        return Err(CallError::Count(checks.len()));
    }
    for (i, c) in checks.iter().enumerate() {
        if c.key.is_empty() || c.key.len() > MAX_KEY_LEN {
            return Err(CallError::Key(c.key.chars().take(40).collect()));
        }
        if checks[..i].iter().any(|o| o.key == c.key) {
            return Err(CallError::Duplicate(c.key.to_string()));
        }
    }
    when_arg(when)
}

/// `ARGV[1]` of the bucket scripts: the clock.
fn when_arg(when: When) -> Result<String, CallError> {
    match when {
        When::Redis => Ok(String::new()),
        When::RedisUntil(t) if (0..=MAX_INSTANT).contains(&t) => {
            let mut arg = String::with_capacity(21);
            arg.push('<');
            arg.push_str(itoa::Buffer::new().format(t));
            Ok(arg)
        }
        When::At(t) if (0..=MAX_INSTANT).contains(&t) => Ok(int(t)),
        When::RedisUntil(t) | When::At(t) => Err(CallError::Instant(t)),
    }
}

/// An integer's text without the formatting machinery (a script call's
/// arguments and a response's quota headers have a few per request).
pub(crate) fn int(n: impl itoa::Integer) -> String {
    itoa::Buffer::new().format(n).to_string()
}

/// `ARGV` for [`LIMITER`] at `when` (`None`: Redis' `TIME`).
pub fn limiter_args(checks: &[Check<'_>], when: impl Into<When>) -> Result<Vec<String>, CallError> {
    let mut args = Vec::with_capacity(1 + 4 * checks.len());
    args.push(validate_call(checks, when.into())?);
    for c in checks {
        let q = c.quota;
        let code = match (q.calendar(), q.algorithm()) {
            (Some(CalendarPeriod::Day), _) => "d",
            (Some(CalendarPeriod::Month), _) => "m",
            (None, Algorithm::TokenBucket) => "t",
            (None, Algorithm::FixedWindow) => "f",
            (None, Algorithm::SlidingLog) => "l",
            (None, Algorithm::SlidingCounter) => "c",
        };
        args.push(if c.shadow {
            format!("s{code}")
        } else {
            code.to_string()
        });
        if q.calendar().is_some() {
            args.push("0".to_string());
            args.push(int(q.capacity()));
            args.push(int(c.cost));
        } else if q.algorithm() == Algorithm::TokenBucket {
            args.push(int(q.burst_window()));
            args.push(int(q.cost_window(c.cost)));
            args.push("0".to_string());
        } else {
            args.push(int(q.period()));
            args.push(int(q.capacity()));
            args.push(int(c.cost));
        }
    }
    Ok(args)
}

/// `ARGV` for [`TOKEN_BUCKET`] at `when` (`None`: Redis' `TIME`).
pub fn token_bucket_args(
    checks: &[Check<'_>],
    when: impl Into<When>,
) -> Result<Vec<String>, CallError> {
    let mut args = Vec::with_capacity(1 + 2 * checks.len());
    args.push(validate_call(checks, when.into())?);
    for c in checks {
        args.push(int(c.quota.burst_window()));
        args.push(int(c.quota.cost_window(c.cost)));
    }
    Ok(args)
}

/// The script's reply did not have the agreed shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected token bucket reply: {0}")]
pub struct ProtocolError(pub String);

/// The outcome of one call over several buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Every bucket had room and all were consumed; otherwise none was.
    pub admitted: bool,
    /// Redis' clock at the decision.
    pub now: Micros,
    /// One decision per check, in order. When the request was denied, buckets that
    /// had room report their untouched state.
    pub decisions: Vec<Decision>,
    /// Per check: a shadow bucket (its denial did not count).
    pub shadow: Vec<bool>,
    /// The records' revision, when the call read it.
    pub revision: Revision,
}

impl Verdict {
    /// The decision the response headers describe: when denied, the denying bucket
    /// with the longest wait; when admitted, the bucket with the fewest tokens left.
    pub fn headline(&self) -> &Decision {
        let wait = |d: &Decision| match d.outcome {
            Admission::Allowed => -1,
            Admission::Denied { retry_after: None } => Micros::MAX,
            Admission::Denied {
                retry_after: Some(w),
            } => w,
        };
        let enforced = || {
            self.decisions
                .iter()
                .zip(self.shadow.iter().chain(std::iter::repeat(&false)))
                .filter(|(_, s)| !**s)
                .map(|(d, _)| d)
        };
        let pick = if self.admitted {
            enforced().min_by_key(|d| (d.remaining, d.limit))
        } else {
            enforced().max_by_key(|d| wait(d))
        };
        pick.or(self.decisions.first()).expect("at least one check")
    }

    /// Whether some shadow bucket would have denied this request.
    pub fn shadow_denied(&self) -> bool {
        self.decisions
            .iter()
            .zip(&self.shadow)
            .any(|(d, s)| *s && !d.allowed())
    }
}

/// The common head of the scripts' replies: `{admitted, now, ...}` with `per_bucket`
/// values for each of `buckets`.
fn reply_head(
    reply: &[i64],
    per_bucket: usize,
    buckets: usize,
) -> Result<(bool, Micros), ProtocolError> {
    let err = |m: String| Err(ProtocolError(m));
    if reply.len() != per_bucket * buckets + 2 {
        return err(format!("{} values for {buckets} buckets", reply.len()));
    }
    let admitted = match reply[0] {
        0 => false,
        1 => true,
        other => return err(format!("admitted flag {other}")),
    };
    let now = reply[1];
    if !(0..=MAX_INSTANT).contains(&now) {
        return err(format!("instant {now}"));
    }
    Ok((admitted, now))
}

/// Interprets [`LIMITER`]'s reply `{admitted, now, (v1, v2, v3) per bucket}` with
/// the pure twins of each algorithm. The twins must agree on admission.
pub fn interpret_limiter(checks: &[Check<'_>], reply: &[i64]) -> Result<Verdict, ProtocolError> {
    let (admitted, now) = reply_head(reply, 3, checks.len())?;
    let (decisions, all_fit) = limiter_decisions(checks, &reply[2..], now, admitted)?;
    if all_fit != admitted {
        return Err(ProtocolError(format!(
            "script says admitted={admitted}, its twins say {all_fit}"
        )));
    }
    Ok(Verdict {
        admitted,
        now,
        shadow: checks.iter().map(|c| c.shadow).collect(),
        decisions,
        revision: Revision::NotAsked,
    })
}

/// Each bucket's decision from its three values in a [`LIMITER`] reply (as the
/// call read them at `now`; consumed when the call `admitted`), and whether every
/// enforced bucket had room.
fn limiter_decisions(
    checks: &[Check<'_>],
    values: &[i64],
    now: Micros,
    admitted: bool,
) -> Result<(Vec<Decision>, bool), ProtocolError> {
    let mut decisions = Vec::with_capacity(checks.len());
    let mut all_fit = true;
    for (c, v) in checks.iter().zip(values.chunks_exact(3)) {
        if v.iter().any(|x| !(0..=MAX_INSTANT).contains(x)) {
            return Err(ProtocolError(format!("bucket state {v:?}")));
        }
        let d = limiter_twin(c.quota, v, now, c.cost);
        if !c.shadow {
            all_fit &= d.allowed();
        }
        let consumed = admitted && d.allowed();
        decisions.push(if consumed || !d.allowed() {
            d
        } else {
            limiter_twin(c.quota, v, now, 0)
        });
    }
    Ok((decisions, all_fit))
}

/// The pure twin of one [`LIMITER`] bucket: its decision from the values read.
fn limiter_twin(q: &Quota, v: &[i64], now: Micros, cost: u32) -> Decision {
    let count = |x: i64| x as u64;
    if let Some(period) = q.calendar() {
        return windows::calendar_window(count(v[0]), q.capacity(), period, now, cost);
    }
    match q.algorithm() {
        Algorithm::TokenBucket => {
            let prev = (v[0] > 0).then_some(BucketState { full_at: v[0] });
            decide(prev, q, now, cost).decision
        }
        Algorithm::FixedWindow => {
            windows::fixed_window(count(v[0]), q.capacity(), q.period(), now, cost).0
        }
        Algorithm::SlidingLog => {
            let s = windows::LogSummary {
                count: count(v[0]),
                needed: v[1],
                newest: v[2],
            };
            windows::sliding_log(s, q.capacity(), q.period(), now, cost)
        }
        Algorithm::SlidingCounter => {
            windows::sliding_counter(
                count(v[0]),
                count(v[1]),
                q.capacity(),
                q.period(),
                now,
                cost,
            )
            .0
        }
    }
}

/// Interprets the script's reply `{admitted, now, full_at_1, ...}` by running the pure
/// twin [`decide`] on the state the script read. The two must agree on admission,
/// or the reply is rejected as a protocol error.
pub fn interpret_token_bucket(
    checks: &[Check<'_>],
    reply: &[i64],
) -> Result<Verdict, ProtocolError> {
    let err = |m: String| Err(ProtocolError(m));
    let (admitted, now) = reply_head(reply, 1, checks.len())?;
    let mut decisions = Vec::with_capacity(checks.len());
    let mut all_fit = true;
    for (c, &full_at) in checks.iter().zip(&reply[2..]) {
        if !(0..=MAX_INSTANT).contains(&full_at) {
            return err(format!("bucket state {full_at}"));
        }
        let prev = (full_at > 0).then_some(BucketState { full_at });
        let d = decide(prev, c.quota, now, c.cost).decision;
        all_fit &= d.allowed();
        // When another bucket denied, this one was not consumed: report it as it is.
        decisions.push(if admitted || !d.allowed() {
            d
        } else {
            decide(prev, c.quota, now, 0).decision
        });
    }
    if all_fit != admitted {
        return err(format!(
            "script says admitted={admitted}, its twin says {all_fit}"
        ));
    }
    Ok(Verdict {
        admitted,
        now,
        shadow: vec![false; checks.len()],
        decisions,
        revision: Revision::NotAsked,
    })
}

/// The keys and `ARGV` of [`REFUND`] for an admitted `verdict` over `checks`: every
/// bucket the call consumed (enforced or shadow, cost above zero), with what it
/// consumed. `None` when nothing was consumed.
pub fn refund_call<'a>(
    checks: &[Check<'a>],
    verdict: &Verdict,
) -> Option<(Vec<&'a str>, Vec<String>)> {
    if !verdict.admitted {
        return None;
    }
    let mut keys = vec![];
    let mut args = vec![verdict.now.to_string()];
    for (c, d) in checks.iter().zip(&verdict.decisions) {
        if c.cost == 0 || !d.allowed() {
            continue;
        }
        let q = c.quota;
        keys.push(c.key);
        if let Some(period) = q.calendar() {
            let code = if period == CalendarPeriod::Day {
                "d"
            } else {
                "m"
            };
            args.extend([code.into(), "0".into(), c.cost.to_string(), "0".into()]);
            continue;
        }
        match q.algorithm() {
            Algorithm::TokenBucket => {
                // full_at before the call consumed: the refund never gives back
                // the refill the bucket would have wasted, full, since then
                let window = q.cost_window(c.cost);
                args.extend([
                    "t".into(),
                    window.to_string(),
                    (d.full_at - window).max(0).to_string(),
                    "0".into(),
                ])
            }
            Algorithm::FixedWindow | Algorithm::SlidingCounter => {
                let code = if q.algorithm() == Algorithm::FixedWindow {
                    "f"
                } else {
                    "c"
                };
                args.extend([
                    code.into(),
                    q.period().to_string(),
                    c.cost.to_string(),
                    "0".into(),
                ])
            }
            Algorithm::SlidingLog => {
                // the log's entries were named after the count the call read
                let count = d.limit.saturating_sub(d.remaining + u64::from(c.cost));
                args.extend([
                    "l".into(),
                    q.period().to_string(),
                    c.cost.to_string(),
                    count.to_string(),
                ])
            }
        }
    }
    (!keys.is_empty()).then_some((keys, args))
}

/// [`refund_call`] for a call that decided `credits` too: the credits it spent
/// go back as well (while no refill happened since, see `lua/refund.lua`).
pub fn credited_refund_call<'a>(
    checks: &[Check<'a>],
    credits: Option<&CreditCheck<'a>>,
    credited: &Credited,
) -> Option<(Vec<&'a str>, Vec<String>)> {
    let spent = match (credits, credited.credits) {
        (Some(c), Some(d)) if d.admitted && credited.verdict.admitted && c.cost > 0 => Some((c, d)),
        _ => None,
    };
    let Some((credit, decision)) = spent else {
        return refund_call(checks, &credited.verdict);
    };
    let (mut keys, mut args) = refund_call(checks, &credited.verdict)
        .unwrap_or_else(|| (vec![], vec![credited.verdict.now.to_string()]));
    keys.push(credit.key);
    args.extend([
        "k".into(),
        credit.cost.to_string(),
        decision.state.as_of.to_string(),
        "0".into(),
    ]);
    Some((keys, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> Quota {
        Quota::per_minute(10).unwrap()
    }

    #[test]
    fn the_sha1_is_a_40_digit_hex_string() {
        assert_eq!(TOKEN_BUCKET.sha1.len(), 40);
        assert!(TOKEN_BUCKET.sha1.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(TOKEN_BUCKET.source.contains("redis.call('TIME')"));
    }

    #[test]
    fn calls_are_evalsha_or_eval_then_keys_then_args() {
        let args = ["".to_string(), "60".to_string()];
        assert_eq!(
            TOKEN_BUCKET.call_words(false, "1", ["k"], &args),
            ["EVALSHA", TOKEN_BUCKET.sha1, "1", "k", "", "60"]
        );
        assert_eq!(
            TOKEN_BUCKET.call_words(true, "1", ["k"], &args)[..2],
            ["EVAL", TOKEN_BUCKET.source]
        );
    }

    #[test]
    fn args_carry_now_then_burst_and_cost_per_bucket() {
        let q = q();
        let checks = [
            Check {
                key: "a",
                quota: &q,
                cost: 1,
                shadow: false,
            },
            Check {
                key: "b",
                quota: &q,
                cost: 3,
                shadow: false,
            },
        ];
        assert_eq!(
            token_bucket_args(&checks, None).unwrap(),
            ["", "60000000", "6000000", "60000000", "18000000"]
        );
        assert_eq!(token_bucket_args(&checks[..1], Some(5)).unwrap()[0], "5");
    }

    #[test]
    fn bad_calls_are_refused_before_reaching_redis() {
        let q = q();
        let c = |key| Check {
            key,
            quota: &q,
            cost: 1,
            shadow: false,
        };
        assert_eq!(token_bucket_args(&[], None), Err(CallError::Count(0)));
        assert!(matches!(
            token_bucket_args(&[c(""), c("x")], None),
            Err(CallError::Key(_))
        ));
        assert!(matches!(
            token_bucket_args(&[c("x"), c("x")], None),
            Err(CallError::Duplicate(_))
        ));
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert!(matches!(
            token_bucket_args(&[c(&long)], None),
            Err(CallError::Key(_))
        ));
        let many: Vec<String> = (0..=MAX_CHECKS).map(|i| i.to_string()).collect();
        let many: Vec<_> = many.iter().map(|k| c(k)).collect();
        assert!(matches!(
            token_bucket_args(&many, None),
            Err(CallError::Count(17))
        ));
        assert!(matches!(
            token_bucket_args(&[c("x")], Some(-1)),
            Err(CallError::Instant(-1))
        ));
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let q = q();
        let checks = [Check {
            key: "a",
            quota: &q,
            cost: 1,
            shadow: false,
        }];
        for bad in [
            &[][..],
            &[1, 5],
            &[2, 5, 0],
            &[1, -1, 0],
            &[1, 5, -3],
            &[1, 5, 0, 0],
            &[0, 5, 0],
        ] {
            assert!(interpret_token_bucket(&checks, bad).is_err(), "{bad:?}");
        }
        let v = interpret_token_bucket(&checks, &[1, 5_000_000, 0]).unwrap();
        assert!(v.admitted);
        assert_eq!(v.decisions[0].remaining, 9);
    }

    #[test]
    fn a_denial_by_one_bucket_reports_the_others_unconsumed() {
        let (a, b) = (
            Quota::per_minute(100).unwrap(),
            Quota::per_minute(10).unwrap(),
        );
        let checks = [
            Check {
                key: "a",
                quota: &a,
                cost: 1,
                shadow: false,
            },
            Check {
                key: "b",
                quota: &b,
                cost: 1,
                shadow: false,
            },
        ];
        let now = 1_000_000_000;
        // bucket b is empty: full in a minute
        let v = interpret_token_bucket(&checks, &[0, now, 0, now + 60_000_000]).unwrap();
        assert!(!v.admitted);
        assert_eq!(v.decisions[0].remaining, 100);
        assert!(v.decisions[0].allowed());
        assert!(!v.decisions[1].allowed());
        assert_eq!(v.headline().limit, 10);
    }
}
