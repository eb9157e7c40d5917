//! Auto-pipelining of script calls, shared by the RESP and REST stores: calls that
//! callers start while one is being prepared travel together in ONE round trip
//! (each still its own atomic script), the way `@upstash/redis` batches
//! concurrent commands. The first caller of a batch yields once to the executor
//! and sends what has queued meanwhile — when a batch is on its way or the last
//! one carried several calls; a lone caller sends at once, waiting for nothing. Entries the server answers `NOSCRIPT` go again as
//! `EVAL` (with the source) in a second round trip, within the same deadline —
//! `EVAL`, not `SCRIPT LOAD`: a replica may lack a script another client loaded.
//!
//! Identical token-bucket calls of one batch (same buckets, same costs: a busy
//! key's requests) go as ONE call deciding them one after another at one
//! instant ([`floodgate_shared::script::merge`]); each caller gets the reply its
//! own call would have had. The server's work and the bill are one request's.
//!
//! `scripts/bench clients` measured why: at 50 callers, one redis-rs pipeline per
//! batch beats one redis-rs request per call by ~8%, and matches our former
//! hand-written pipelined connection.

use std::sync::Mutex;
use std::time::Duration;

use floodgate_shared::script::merge::{self, SharedClock};
use floodgate_shared::script::{LuaScript, TOKEN_BUCKET};

use super::{StoreError, StoreErrorKind, Value, lock};
use crate::timer::Stopwatch;

/// One script call as it goes on the wire.
pub(crate) struct ScriptCall {
    pub script: LuaScript,
    /// `EVAL` with the source (after NOSCRIPT) rather than `EVALSHA`.
    pub by_source: bool,
    numkeys: String,
    keys: Vec<String>,
    args: Vec<String>,
}

impl ScriptCall {
    pub fn new(script: &LuaScript, keys: &[&str], args: &[String]) -> Self {
        Self {
            script: *script,
            by_source: false,
            numkeys: keys.len().to_string(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            args: args.to_vec(),
        }
    }

    /// `EVALSHA <sha1> <numkeys> <keys...> <args...>` (or `EVAL <source> ...`).
    pub fn words(&self) -> Vec<&str> {
        self.script.call_words(
            self.by_source,
            &self.numkeys,
            self.keys.iter().map(String::as_str),
            &self.args,
        )
    }
}

/// How a store sends several script calls in one round trip.
pub(crate) trait SendScripts: super::MaybeSync {
    /// One outcome per call, in order (an error reply is that call's `Err`);
    /// `Err` as a whole when the round trip failed.
    fn send_scripts(
        &self,
        calls: &[ScriptCall],
        limit: Duration,
    ) -> impl Future<Output = Result<Vec<Result<Value, StoreError>>, StoreError>> + super::MaybeSend;
}

type Reply = futures_channel::oneshot::Sender<Result<Value, StoreError>>;

/// The queue of calls waiting for the next round trip.
#[derive(Default)]
pub(crate) struct Batcher {
    /// A batch's first caller never waits for others to queue: every round trip
    /// carries its own caller's calls only. In a Worker, each request is its own
    /// event, and workerd forbids one request's I/O on behalf of another: a
    /// request's call riding another's fetch would be lost with that request.
    alone: bool,
    queue: Mutex<Vec<(ScriptCall, Reply)>>,
    /// Batches sent and not answered yet.
    in_flight: std::sync::atomic::AtomicUsize,
    /// Calls in the last batch taken.
    last_size: std::sync::atomic::AtomicUsize,
    /// The scripts (SHA-1) the server answered by SHA-1: the first call of any
    /// other goes with its source (`EVAL`), so a fresh instance never pays a
    /// `NOSCRIPT` round trip on its first requests.
    loaded: Mutex<Vec<&'static str>>,
}

/// Counts a batch as on its way while it lives.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The most calls one round trip carries.
const MAX_BATCH: usize = 256;

/// Held by a batch's first caller until it has taken the queue: if that caller is
/// dropped first (cancelled), the queued calls fail instead of waiting forever.
struct LeaderGuard<'a> {
    queue: &'a Mutex<Vec<(ScriptCall, Reply)>>,
    armed: bool,
}

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            for (_, reply) in std::mem::take(&mut *lock(self.queue)) {
                let _ = reply.send(Err(abandoned()));
            }
        }
    }
}

fn abandoned() -> StoreError {
    StoreError::new(StoreErrorKind::Connect, "batch abandoned by its sender")
}

impl Batcher {
    /// A batcher whose round trips carry only their first caller's calls (see
    /// [`Batcher::alone`]): what a Worker's requests need.
    pub fn alone() -> Self {
        Self {
            alone: true,
            ..Self::default()
        }
    }

    /// The first call of each script not known to be loaded goes with its source
    /// (`EVAL`: one round trip, where `EVALSHA` would be answered `NOSCRIPT` and
    /// sent again); the calls behind it in the same pipeline go by SHA-1.
    fn by_source_first(&self, batch: &mut [Unit]) {
        let loaded = lock(&self.loaded);
        let mut first: Vec<&str> = vec![];
        for u in batch.iter_mut() {
            let sha = u.call.script.sha1;
            if !loaded.contains(&sha) && !first.contains(&sha) {
                first.push(sha);
                u.call.by_source = true;
            }
        }
    }

    /// Runs `call` with the others queued meanwhile, within `deadline`.
    pub async fn run(
        &self,
        sender: &impl SendScripts,
        deadline: Duration,
        call: ScriptCall,
    ) -> Result<Value, StoreError> {
        let (reply, rx) = futures_channel::oneshot::channel();
        let leader = {
            let mut q = lock(&self.queue);
            q.push((call, reply));
            q.len() == 1
        };
        if leader {
            let mut guard = LeaderGuard {
                queue: &self.queue,
                armed: true,
            };
            use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
            let busy = self.in_flight.load(Acquire) > 0 || self.last_size.load(Acquire) > 1;
            if busy && !self.alone {
                // others are calling: let them queue behind this one
                yield_once().await;
            }
            let taken = std::mem::take(&mut *lock(&self.queue));
            self.last_size.store(taken.len(), Release);
            guard.armed = false;
            drop(guard);
            let started = Stopwatch::start();
            self.in_flight.fetch_add(1, AcqRel);
            let _sent = InFlight(&self.in_flight);
            let mut batch = merged(taken);
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(MAX_BATCH));
                self.by_source_first(&mut batch);
                flush(sender, deadline, batch, &started, &self.loaded).await;
                batch = rest;
            }
        }
        rx.await.unwrap_or_else(|_| Err(abandoned()))
    }
}

/// One call on the wire and the callers it answers: one, or several identical
/// token-bucket calls merged.
struct Unit {
    call: ScriptCall,
    replies: Vec<Reply>,
}

impl Unit {
    fn answer(self, outcome: Result<Value, StoreError>) {
        match <[Reply; 1]>::try_from(self.replies) {
            Ok([reply]) => {
                let _ = reply.send(outcome);
            }
            Err(replies) => {
                let count = replies.len();
                for (reply, one) in replies.into_iter().zip(split(&self.call, outcome, count)) {
                    let _ = reply.send(one);
                }
            }
        }
    }

    fn fail(self, e: &StoreError) {
        for reply in self.replies {
            let _ = reply.send(Err(e.clone()));
        }
    }
}

/// The batch as calls on the wire: identical token-bucket calls (same keys, same
/// buckets and costs, Redis' clock in the same form) become one, in the order of
/// their first.
fn merged(batch: Vec<(ScriptCall, Reply)>) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::with_capacity(batch.len());
    // the units still open to merging, with the clock of the call they become
    let mut open: Vec<(usize, SharedClock)> = vec![];
    for (call, reply) in batch {
        let clock = (call.script.sha1 == TOKEN_BUCKET.sha1)
            .then(|| call.args.first().and_then(|c| SharedClock::parse(c)))
            .flatten();
        let joined = clock.and_then(|c| {
            open.iter_mut().find_map(|(i, merged)| {
                let unit = &units[*i];
                let same = unit.call.keys == call.keys
                    && unit.call.args[1..] == call.args[1..]
                    && unit.replies.len() < merge::MAX_MERGED;
                *merged = merged.with(c).filter(|_| same)?;
                Some(*i)
            })
        });
        match joined {
            Some(i) => units[i].replies.push(reply),
            None => {
                if let Some(c) = clock
                    && open.len() < MAX_OPEN
                {
                    open.push((units.len(), c));
                }
                units.push(Unit {
                    call,
                    replies: vec![reply],
                });
            }
        }
    }
    for (i, clock) in open {
        let count = units[i].replies.len();
        if count > 1 {
            units[i].call.args[0] = clock.counted(count);
        }
    }
    units
}

/// Distinct token-bucket calls looked at for merging in one batch (a batch of
/// many different keys merges nothing and should not pay a quadratic search).
const MAX_OPEN: usize = 8;

/// The replies of a merged call's `count` callers, as their own calls would
/// have had.
fn split(
    call: &ScriptCall,
    outcome: Result<Value, StoreError>,
    count: usize,
) -> Vec<Result<Value, StoreError>> {
    let replies = outcome.and_then(Value::into_ints).and_then(|ints| {
        merge::split_call(call.keys.len(), &call.args, &ints)
            .map_err(|e| StoreError::protocol(e.to_string()))
    });
    match replies {
        Ok(replies) => replies
            .into_iter()
            .map(|r| Ok(Value::Array(r.into_iter().map(Value::Int).collect())))
            .collect(),
        Err(e) => vec![Err(e); count],
    }
}

/// Sends one batch; calls answered `NOSCRIPT` go again, each script once by
/// source and the rest of its calls behind it.
async fn flush(
    sender: &impl SendScripts,
    deadline: Duration,
    mut batch: Vec<Unit>,
    started: &Stopwatch,
    loaded: &Mutex<Vec<&'static str>>,
) {
    for attempt in 0..3 {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            for unit in batch {
                unit.fail(&StoreError::timeout(deadline));
            }
            return;
        }
        let calls: Vec<ScriptCall> = batch
            .iter_mut()
            .map(|u| ScriptCall {
                script: u.call.script,
                by_source: u.call.by_source,
                numkeys: std::mem::take(&mut u.call.numkeys),
                keys: std::mem::take(&mut u.call.keys),
                args: std::mem::take(&mut u.call.args),
            })
            .collect();
        let outcomes = match sender.send_scripts(&calls, left).await {
            Ok(o) if o.len() == calls.len() => o,
            Ok(o) => {
                let e = StoreError::protocol(format!(
                    "{} replies for {} script calls",
                    o.len(),
                    calls.len()
                ));
                for unit in batch {
                    unit.fail(&e);
                }
                return;
            }
            Err(e) => {
                for unit in batch {
                    unit.fail(&e);
                }
                return;
            }
        };
        let mut again = vec![];
        // the scripts already sent by source in the next round trip: one `EVAL`
        // per script loads it, the calls behind it in the same pipeline go by
        // `EVALSHA` (200 calls by source were 1.3 MB, past the REST endpoint's
        // and Upstash's 1 MB request limit); one still answered NOSCRIPT goes by
        // source in a third
        let mut loading: Vec<&str> = vec![];
        for ((call, unit), outcome) in calls.into_iter().zip(batch).zip(outcomes) {
            let unit = Unit { call, ..unit };
            note_loaded(loaded, unit.call.script.sha1, &outcome);
            match outcome {
                Err(e) if attempt < 2 && e.redis() == Some(super::RedisErrorKind::NoScript) => {
                    let sha = unit.call.script.sha1;
                    let by_source = attempt == 1 || !loading.contains(&sha);
                    if by_source {
                        loading.push(sha);
                    }
                    again.push(Unit {
                        call: ScriptCall {
                            by_source,
                            ..unit.call
                        },
                        ..unit
                    });
                }
                result => unit.answer(result),
            }
        }
        if again.is_empty() {
            return;
        }
        batch = again;
    }
}

/// What a reply says of its script: answered (by source or SHA-1), the server
/// holds it; `NOSCRIPT`, it does not (flushed, restarted, another replica).
fn note_loaded(
    loaded: &Mutex<Vec<&'static str>>,
    sha: &'static str,
    outcome: &Result<Value, StoreError>,
) {
    let missing = matches!(outcome, Err(e) if e.redis() == Some(super::RedisErrorKind::NoScript));
    let mut loaded = lock(loaded);
    let known = loaded.contains(&sha);
    if missing && known {
        loaded.retain(|s| *s != sha);
    } else if !missing && !known && outcome.is_ok() {
        loaded.push(sha);
    }
}

/// Lets the other ready tasks run (and queue their calls) before the batch goes.
async fn yield_once() {
    #[cfg(feature = "native")]
    tokio::task::yield_now().await;
    #[cfg(not(feature = "native"))]
    YieldOnce(false).await;
}

/// Returns `Pending` once (waking itself), so other tasks run first.
#[cfg(not(feature = "native"))]
struct YieldOnce(bool);

#[cfg(not(feature = "native"))]
impl Future for YieldOnce {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

#[cfg(all(test, feature = "native"))]
mod tests {
    use std::sync::Arc;
    use std::sync::Mutex as StdMutex;

    use super::*;

    /// Records each round trip's size; the first one waits until released.
    #[derive(Default)]
    struct Recorder {
        sizes: StdMutex<Vec<usize>>,
        gate: tokio::sync::Notify,
        held: std::sync::atomic::AtomicBool,
    }

    impl SendScripts for Recorder {
        async fn send_scripts(
            &self,
            calls: &[ScriptCall],
            _limit: Duration,
        ) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
            self.sizes.lock().unwrap().push(calls.len());
            if !self.held.swap(true, std::sync::atomic::Ordering::SeqCst) {
                self.gate.notified().await;
            }
            Ok(calls.iter().map(|_| Ok(Value::Int(1))).collect())
        }
    }

    /// Issue 39, smell 5: callers that come while a round trip is on its way
    /// each send their own with [`Batcher::alone`] (a Worker's requests), and
    /// ride one together otherwise (natively). (Before: the Worker's store
    /// gathered them too, so one request's call could ride another's fetch.)
    async fn round_trips(batcher: Batcher) -> Vec<usize> {
        let (batcher, sender) = (Arc::new(batcher), Arc::new(Recorder::default()));
        let call = || ScriptCall::new(&floodgate_shared::script::IN_FLIGHT, &["k"], &[]);
        let first = {
            let (b, s) = (batcher.clone(), sender.clone());
            tokio::spawn(async move { b.run(&*s, Duration::from_secs(5), call()).await })
        };
        while sender.sizes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let others: Vec<_> = (0..3)
            .map(|_| {
                let (b, s) = (batcher.clone(), sender.clone());
                tokio::spawn(async move { b.run(&*s, Duration::from_secs(5), call()).await })
            })
            .collect();
        for o in others {
            o.await.unwrap().unwrap();
        }
        sender.gate.notify_one();
        first.await.unwrap().unwrap();
        sender.sizes.lock().unwrap().clone()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_batcher_alone_never_carries_another_callers_call() {
        assert_eq!(round_trips(Batcher::alone()).await, [1, 1, 1, 1]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_shared_batcher_gathers_callers_behind_a_round_trip_on_its_way() {
        let sizes = round_trips(Batcher::default()).await;
        assert_eq!(sizes.iter().sum::<usize>(), 4);
        assert!(sizes.len() < 4, "{sizes:?}");
    }
}
