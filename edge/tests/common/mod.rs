//! What the pipeline tests share: a store in memory that runs the pure twins of
//! every script (bucket checks, refunds, in-flight slots, leases and the
//! regional tally), a fake clock moved together with it, and small readers of
//! answers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use floodgate_edge::pipeline::{Admit, Decided, Reply, RequestHead};

/// What the pipeline decided about a request.
pub type Gate = Result<Admit, Reply>;
use floodgate_edge::store::{Store, StoreError, StoreErrorKind, Value};
use floodgate_shared::apikeys::{KeyRecord, KeyStatus, hash_secret, new_secret, record_key};
use floodgate_shared::bucket::{BucketState, decide};
use floodgate_shared::changes::{Change, Entry, LOG_KEY, REV_KEY, Revision, parse_rev};
use floodgate_shared::config::CONFIG_KEY;
use floodgate_shared::lease::{Central, LEASE_RETURN, LEASE_TAKE, LeaseConfig};
use floodgate_shared::script::{
    Call, CallReply, Check, CreditCheck, Credited, LuaScript, Verdict, can_watch,
    interpret_token_bucket,
};
use floodgate_shared::stats::{Minute, StatsWrite};
use floodgate_shared::tally::{self, RegionTally, TALLY_ADD, TALLY_CHARGE, TALLY_DONE, TALLY_TAKE};
use floodgate_shared::time::{FakeClock, Micros};

pub const T0: Micros = 1_764_000_000_000_000;

/// Buckets and records in memory, running the same transition as the script.
#[derive(Default)]
pub struct MemStore {
    pub records: Mutex<HashMap<String, Vec<u8>>>,
    pub buckets: Mutex<HashMap<String, BucketState>>,
    pub gets: AtomicUsize,
    /// Reads of the records' revision.
    pub rev_reads: AtomicUsize,
    /// Reads of several records in one call.
    pub reads: AtomicUsize,
    /// The change log, newest first (`shared::changes`).
    pub log: Mutex<Vec<String>>,
    /// Bucket decisions.
    pub checks: AtomicUsize,
    /// Calls deciding several identical requests at once (`Call::count` > 1).
    pub merged_calls: AtomicUsize,
    pub refunds: AtomicUsize,
    pub down: AtomicBool,
    /// How long a bucket check takes before it decides (a slow Redis).
    pub slow: Mutex<Option<std::time::Duration>>,
    /// How long the next bucket check alone takes (one slow call among others).
    pub slow_first: Mutex<Option<std::time::Duration>>,
    /// In-flight slots held per set.
    pub slots: Mutex<HashMap<String, u32>>,
    pub now: Mutex<Micros>,
    /// The statistics flushes written.
    pub writes: Mutex<Vec<StatsWrite>>,
    /// Lease bookkeeping per bucket (its full_at lives in `buckets`).
    pub leases: Mutex<HashMap<String, Central>>,
    /// Script calls, per script's SHA-1.
    pub runs: Mutex<HashMap<&'static str, usize>>,
    /// Tokens given back by lease returns.
    pub returned: Mutex<u64>,
    /// How long a read of several records takes, on the pipeline's clock (moved
    /// forward by that much when it answers: a far store).
    pub read_takes: Mutex<Option<(&'static FakeClock, Micros)>>,
    /// How long an in-flight slot's take takes, on the pipeline's clock and the
    /// store's (a busy store); a take run after its stale guard changes nothing
    /// and fails as stale, as `lua/in_flight.lua` does.
    pub slot_takes: Mutex<Option<(&'static FakeClock, Micros)>>,
    /// A region's tally (`floodgate_shared::tally`), and until when its settle
    /// lock is held.
    pub tally: Mutex<RegionTally>,
    pub tally_lock_until: Mutex<Micros>,
    /// `HINCRBY`s of the tally (counts, take-backs), alone or in a pipeline.
    pub tally_incrs: AtomicUsize,
    /// Tokens the tally's settlements charged to the global buckets.
    pub charged: AtomicUsize,
    /// A region's copies of the records (`pipeline::copies`), and its reads.
    pub copies: Mutex<HashMap<String, Vec<u8>>>,
    pub copy_reads: AtomicUsize,
    /// `HSCAN`s of the copies.
    pub copy_scans: AtomicUsize,
}

/// A store that lives as long as the test process (the pipeline's background
/// tasks may outlive a test's scope).
pub fn mem() -> &'static MemStore {
    Box::leak(Box::default())
}

impl MemStore {
    /// The calls of `script` so far.
    pub fn runs_of(&self, script: &LuaScript) -> usize {
        self.runs
            .lock()
            .unwrap()
            .get(script.sha1)
            .copied()
            .unwrap_or(0)
    }

    /// The pure twin of each script the pipeline runs, replying with integers.
    fn run_ints_in_memory(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        *self.runs.lock().unwrap().entry(script.sha1).or_default() += 1;
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(StoreErrorKind::Connect, "down"));
        }
        let now = *self.now.lock().unwrap();
        let num = |i: usize| args[i].parse::<i64>().unwrap();
        if script.sha1 == LEASE_TAKE.sha1 {
            let forced = args.get(9).is_some_and(|a| a == "1");
            let cfg = LeaseConfig {
                max_overshoot: num(5) as u64,
                max_lease: u64::MAX,
                lifetime: num(6),
                hot_per_sec: 0,
                cool_per_sec: 0,
            };
            let mut buckets = self.buckets.lock().unwrap();
            let mut leases = self.leases.lock().unwrap();
            let central = leases.entry(keys[0].to_string()).or_default();
            central.full_at = buckets.get(keys[0]).map_or(0, |b| b.full_at);
            let got = central.take_charging(
                &cfg,
                now,
                num(1),
                num(2),
                num(3) as u64,
                num(4) as u64,
                &args[7],
                Some(&args[8]),
                forced,
            );
            if central.full_at > 0 {
                buckets.insert(
                    keys[0].to_string(),
                    BucketState {
                        full_at: central.full_at,
                    },
                );
            }
            return Ok(vec![
                i64::from(got.admitted),
                got.leased as i64,
                got.now,
                got.full_at,
                got.expires_at,
                got.outstanding as i64,
            ]);
        }
        if script.sha1 == LEASE_RETURN.sha1 {
            let mut buckets = self.buckets.lock().unwrap();
            let mut leases = self.leases.lock().unwrap();
            let central = leases.entry(keys[0].to_string()).or_default();
            central.full_at = buckets.get(keys[0]).map_or(0, |b| b.full_at);
            let refunded = central.give_back(now, num(1), &args[2], num(3) as u64);
            buckets.insert(
                keys[0].to_string(),
                BucketState {
                    full_at: central.full_at,
                },
            );
            *self.returned.lock().unwrap() += refunded;
            return Ok(vec![refunded as i64, now, central.full_at]);
        }
        if script.sha1 == TALLY_CHARGE.sha1 {
            let mut buckets = self.buckets.lock().unwrap();
            let mut reply = vec![now];
            for (i, k) in keys.iter().enumerate() {
                let (t, count) = (num(3 * i + 1), num(3 * i + 3) as u64);
                let before = buckets.get(*k).map(|b| b.full_at);
                let mut full_at = before.unwrap_or(0);
                if count > 0 {
                    self.charged.fetch_add(count as usize, Ordering::SeqCst);
                    full_at = tally::charged(before, now, t, count);
                    buckets.insert(k.to_string(), BucketState { full_at });
                }
                reply.push(full_at);
            }
            return Ok(reply);
        }
        Err(StoreError::new(
            StoreErrorKind::Protocol,
            "no such script in memory",
        ))
    }
}

impl MemStore {
    /// The twins of the tally's regional scripts (their replies are not all
    /// integers): `None` for any other script.
    fn tally_script(&self, script: &LuaScript, keys: &[&str], args: &[String]) -> Option<Value> {
        let bulk = |b: Vec<u8>| Value::Bulk(b);
        let mut t = self.tally.lock().unwrap();
        let reply = if script.sha1 == TALLY_TAKE.sha1 {
            Value::Array(t.take(keys[0]).into_iter().map(bulk).collect())
        } else if script.sha1 == TALLY_DONE.sha1 {
            t.done([keys[2], keys[3]], args).unwrap();
            Value::Int(0)
        } else if script.sha1 == TALLY_ADD.sha1 {
            let now = *self.now.lock().unwrap();
            let until = args[0].trim_start_matches('<').parse().unwrap();
            let tokens = args[2].parse().unwrap();
            match t.add(keys[0], &args[1], tokens, now, until) {
                true => Value::Int(t.slots[keys[0]][&args[1]]),
                false => Value::Nil,
            }
        } else {
            return None;
        };
        *self.runs.lock().unwrap().entry(script.sha1).or_default() += 1;
        Some(reply)
    }

    /// `HINCRBY <slot> <field> <by>` of the tally.
    fn tally_incr(&self, args: &[&[u8]]) -> Option<Value> {
        let text: Vec<String> = args
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        match text.as_slice() {
            [cmd, key, field, by] if cmd == "HINCRBY" && key.starts_with("fg:{tally}:") => {
                self.tally_incrs.fetch_add(1, Ordering::SeqCst);
                let n = self
                    .tally
                    .lock()
                    .unwrap()
                    .incr(key, field, by.parse().unwrap());
                Some(Value::Int(n))
            }
            _ => None,
        }
    }

    /// A store call: refused while down, slow when told to be.
    async fn call_made(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(StoreErrorKind::Connect, "down"));
        }
        let first = self.slow_first.lock().unwrap().take();
        let slow = first.or(*self.slow.lock().unwrap());
        if let Some(d) = slow {
            tokio::time::sleep(d).await;
        }
        Ok(())
    }

    /// What the records' revision key holds, as a watching check reads it.
    fn revision(&self, checks: &[Check<'_>], rev_key: &str) -> Revision {
        let raw = self.records.lock().unwrap().get(rev_key).cloned();
        match can_watch(checks) {
            true => Revision::Seen(parse_rev(raw.as_deref())),
            false => Revision::NotAsked,
        }
    }

    /// The bucket scripts' twin: one request's decision, now.
    fn decide_now(&self, checks: &[Check<'_>]) -> Verdict {
        let now = *self.now.lock().unwrap();
        let mut buckets = self.buckets.lock().unwrap();
        let prev: Vec<_> = checks.iter().map(|c| buckets.get(c.key).copied()).collect();
        if checks.iter().any(|c| c.shadow) {
            // lua/limiter.lua: shadow buckets never deny, and are consumed with
            // the request when they have room
            let all = checks
                .iter()
                .zip(&prev)
                .filter(|(c, _)| !c.shadow)
                .all(|(c, p)| decide(*p, c.quota, now, c.cost).decision.allowed());
            let mut decisions = vec![];
            for (c, p) in checks.iter().zip(&prev) {
                let d = decide(*p, c.quota, now, c.cost);
                if all && let Some(w) = d.write {
                    buckets.insert(c.key.to_string(), w);
                }
                let consumed = all && d.decision.allowed();
                decisions.push(if consumed || !d.decision.allowed() {
                    d.decision
                } else {
                    decide(*p, c.quota, now, 0).decision
                });
            }
            return Verdict {
                admitted: all,
                now,
                decisions,
                shadow: checks.iter().map(|c| c.shadow).collect(),
                revision: Default::default(),
            };
        }
        let all = checks
            .iter()
            .zip(&prev)
            .all(|(c, p)| decide(*p, c.quota, now, c.cost).decision.allowed());
        if all {
            for (c, p) in checks.iter().zip(&prev) {
                if let Some(w) = decide(*p, c.quota, now, c.cost).write {
                    buckets.insert(c.key.to_string(), w);
                }
            }
        }
        let mut reply = vec![i64::from(all), now];
        reply.extend(prev.iter().map(|p| p.map_or(0, |s| s.full_at)));
        interpret_token_bucket(checks, &reply).unwrap()
    }
}

/// The pipeline runs scripts, checks buckets, takes slots, refunds, reads records
/// and writes counters: the in-memory store provides those; plain commands are
/// not needed.
impl Store for &MemStore {
    async fn run(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(StoreErrorKind::Connect, "down"));
        }
        if let Some(v) = self.tally_script(script, keys, args) {
            return Ok(v);
        }
        let ints = self.run_ints_in_memory(script, keys, args)?;
        Ok(Value::Array(ints.into_iter().map(Value::Int).collect()))
    }

    /// The change log's `LRANGE` and the revision's `SET ... NX`, in memory.
    async fn command(&self, args: &[&[u8]]) -> Result<Value, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(StoreErrorKind::Connect, "down"));
        }
        let text: Vec<String> = args
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        match text
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["HMGET", key, ..] if *key == floodgate_edge::pipeline::copies::COPIES_KEY => {
                self.copy_reads.fetch_add(1, Ordering::SeqCst);
                let copies = self.copies.lock().unwrap();
                let values = args[2..].iter().map(|f| {
                    let f = String::from_utf8_lossy(f).into_owned();
                    copies
                        .get(&f)
                        .map_or(Value::Nil, |v| Value::Bulk(v.clone()))
                });
                Ok(Value::Array(values.collect()))
            }
            ["HSCAN", key, "0", "COUNT", _]
                if *key == floodgate_edge::pipeline::copies::COPIES_KEY =>
            {
                self.copy_scans.fetch_add(1, Ordering::SeqCst);
                let copies = self.copies.lock().unwrap();
                let items = copies.iter().flat_map(|(f, v)| {
                    [Value::Bulk(f.clone().into_bytes()), Value::Bulk(v.clone())]
                });
                Ok(Value::Array(vec![
                    Value::Bulk(b"0".to_vec()),
                    Value::Array(items.collect()),
                ]))
            }
            ["HSET", key, ..] if *key == floodgate_edge::pipeline::copies::COPIES_KEY => {
                let mut copies = self.copies.lock().unwrap();
                for pair in args[2..].chunks(2) {
                    copies.insert(
                        String::from_utf8_lossy(pair[0]).into_owned(),
                        pair[1].to_vec(),
                    );
                }
                Ok(Value::Int(1))
            }
            ["HINCRBY", ..] => self
                .tally_incr(args)
                .ok_or_else(|| StoreError::new(StoreErrorKind::Protocol, "not in memory")),
            ["SET", key, _, "PX", ms, "NX"] if *key == tally::LOCK_KEY => {
                let now = *self.now.lock().unwrap();
                let mut until = self.tally_lock_until.lock().unwrap();
                if *until > now {
                    return Ok(Value::Nil);
                }
                *until = now + ms.parse::<i64>().unwrap() * 1_000;
                Ok(Value::Status("OK".into()))
            }
            ["LRANGE", key, "0", stop] if *key == LOG_KEY => {
                let n = stop.parse::<usize>().unwrap() + 1;
                let log = self.log.lock().unwrap();
                let items = log
                    .iter()
                    .take(n)
                    .map(|e| Value::Bulk(e.clone().into_bytes()));
                Ok(Value::Array(items.collect()))
            }
            ["SET", key, value, "NX"] if *key == REV_KEY => {
                let mut records = self.records.lock().unwrap();
                let fresh = !records.contains_key(REV_KEY);
                if fresh {
                    records.insert(REV_KEY.into(), value.as_bytes().to_vec());
                }
                Ok(if fresh {
                    Value::Status("OK".into())
                } else {
                    Value::Nil
                })
            }
            _ => Err(StoreError::new(StoreErrorKind::Protocol, "not in memory")),
        }
    }

    /// The tally's increments, in memory.
    async fn pipeline(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(StoreErrorKind::Connect, "down"));
        }
        commands
            .iter()
            .map(|c| {
                let args: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
                self.tally_incr(&args)
                    .ok_or_else(|| StoreError::new(StoreErrorKind::Protocol, "not in memory"))
            })
            .collect()
    }

    /// The token bucket script's twin: `count` identical requests one after
    /// another at one instant in ONE call (the slowness of one), reading the
    /// records' revision when asked; credits and records are not in memory.
    async fn decide(&self, call: Call<'_>) -> Result<CallReply, StoreError> {
        if call.credits.is_some() || call.record.is_some() {
            return Err(StoreError::new(StoreErrorKind::Protocol, "not in memory"));
        }
        if call.count > 1 {
            self.merged_calls.fetch_add(1, Ordering::SeqCst);
        }
        self.checks.fetch_add(call.count, Ordering::SeqCst);
        self.call_made().await?;
        let revision = match call.watch {
            Some(rev_key) => self.revision(call.checks, rev_key),
            None => Revision::NotAsked,
        };
        let each = (0..call.count)
            .map(|_| {
                Credited::from(Verdict {
                    revision,
                    ..self.decide_now(call.checks)
                })
            })
            .collect();
        Ok(CallReply::Done { each, record: None })
    }

    async fn acquire_slot(
        &self,
        key: &str,
        _id: &str,
        limit: u32,
        _ttl_ms: u64,
        until: Option<Micros>,
    ) -> Result<bool, StoreError> {
        if let Some((clock, takes)) = *self.slot_takes.lock().unwrap() {
            clock.advance(takes);
            *self.now.lock().unwrap() += takes;
        }
        if until.is_some_and(|t| *self.now.lock().unwrap() > t) {
            return Err(StoreError::new(
                StoreErrorKind::Stale,
                "ran after its guard",
            ));
        }
        let mut slots = self.slots.lock().unwrap();
        let held = slots.entry(key.to_string()).or_default();
        if *held >= limit {
            return Ok(false);
        }
        *held += 1;
        Ok(true)
    }

    async fn release_slot(&self, key: &str, _id: &str) -> Result<(), StoreError> {
        if let Some(held) = self.slots.lock().unwrap().get_mut(key) {
            *held = held.saturating_sub(1);
        }
        Ok(())
    }

    async fn refund(
        &self,
        checks: &[Check<'_>],
        _credits: Option<&CreditCheck<'_>>,
        credited: &Credited,
    ) -> Result<(), StoreError> {
        let verdict = &credited.verdict;
        self.refunds.fetch_add(1, Ordering::SeqCst);
        let mut buckets = self.buckets.lock().unwrap();
        for (c, d) in checks.iter().zip(&verdict.decisions) {
            if d.allowed()
                && let Some(b) = buckets.get_mut(c.key)
            {
                b.full_at -= c.quota.cost_window(c.cost);
            }
        }
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.get("fg:ping").await.map(|_| ())
    }

    async fn get_many(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if let Some((clock, takes)) = *self.read_takes.lock().unwrap() {
            clock.advance(takes);
        }
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(self.get(k).await?);
        }
        Ok(out)
    }

    async fn write_stats(&self, write: &StatsWrite) -> Result<(), StoreError> {
        self.writes.lock().unwrap().push(write.clone());
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        // records read (the revision, read with them or alone, is counted apart)
        let counter = if key == REV_KEY {
            &self.rev_reads
        } else {
            &self.gets
        };
        counter.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(StoreErrorKind::Connect, "down"));
        }
        Ok(self.records.lock().unwrap().get(key).cloned())
    }
}

/// A configuration and one key of `plan` in `store`; the store's clock at T0.
pub fn seed(store: &MemStore, config: &str, plan: &str) -> String {
    let (id, secret) = new_secret(&[7u8; 42]);
    let record = KeyRecord::new(&id, "", plan, 0);
    let mut r = store.records.lock().unwrap();
    r.insert(CONFIG_KEY.into(), config.as_bytes().to_vec());
    r.insert(REV_KEY.into(), b"1".to_vec());
    r.insert(
        record_key(&hash_secret(&secret)),
        record.to_json().into_bytes(),
    );
    *store.now.lock().unwrap() = T0;
    format!("Bearer {secret}")
}

/// Stores one more API key (after [`seed`]), on `plan`: its credentials header.
pub fn seed_another(store: &MemStore, plan: &str) -> String {
    let (id, secret) = new_secret(&[9u8; 42]);
    let record = KeyRecord::new(&id, "", plan, 0);
    store.records.lock().unwrap().insert(
        record_key(&hash_secret(&secret)),
        record.to_json().into_bytes(),
    );
    format!("Bearer {secret}")
}

/// Sets the status of the one API key `seed` stored, and says so in the change
/// log as the admin functions do.
pub fn set_key_status(store: &MemStore, status: KeyStatus) {
    edit_key(store, |rec| rec.status = status);
}

/// Changes the record of the one API key `seed` stored with `edit`, and says so
/// in the change log as the admin functions do.
pub fn edit_key(store: &MemStore, edit: impl FnOnce(&mut KeyRecord)) {
    let key = {
        let mut records = store.records.lock().unwrap();
        let key = records
            .keys()
            .find(|k| k.starts_with("fg:apikey:"))
            .cloned()
            .expect("a seeded key");
        let mut rec = KeyRecord::from_json(&records[&key]).unwrap();
        edit(&mut rec);
        records.insert(key.clone(), rec.to_json().into_bytes());
        key
    };
    let hash = key.trim_start_matches("fg:apikey:").to_string();
    changed(store, Change::Key(hash));
}

/// Bumps the records' revision and logs `change`, as `lua/changed.lua` does.
pub fn changed(store: &MemStore, change: Change) -> u64 {
    let mut records = store.records.lock().unwrap();
    let rev = parse_rev(records.get(REV_KEY).map(Vec::as_slice)).unwrap_or(0) + 1;
    records.insert(REV_KEY.into(), rev.to_string().into_bytes());
    store
        .log
        .lock()
        .unwrap()
        .insert(0, Entry { rev, change }.to_string());
    rev
}

/// What the flushes wrote to `field` of the per-minute stats hashes, read back as
/// the dashboard reads them (each instance's field of a minute is rewritten whole
/// by each flush: the last write counts), summed over the minutes.
pub fn minute_sum(store: &MemStore, field: &str) -> u64 {
    let mut last: HashMap<(String, String), String> = HashMap::new();
    for w in store.writes.lock().unwrap().iter() {
        for m in &w.minutes {
            last.insert((m.key.clone(), w.field.clone()), m.counts.clone());
        }
    }
    type Fields = Vec<(Vec<u8>, Vec<u8>)>;
    let mut minutes: HashMap<String, Fields> = HashMap::new();
    for ((hash, f), v) in last {
        minutes
            .entry(hash)
            .or_default()
            .push((f.into_bytes(), v.into_bytes()));
    }
    minutes
        .into_values()
        .map(|pairs| {
            Minute::read(pairs)
                .0
                .minute
                .get(field)
                .copied()
                .unwrap_or(0)
        })
        .sum()
}

/// Moves the pipeline's clock and the store's together (refilling buckets too).
pub fn advance(clock: &FakeClock, store: &MemStore, by: Micros) {
    clock.advance(by);
    *store.now.lock().unwrap() += by;
}

pub fn head(auth: &str) -> RequestHead<'_> {
    RequestHead {
        path: "/v1/x",
        credentials: Some(auth.as_bytes()),
        client_ip: None,
        country: None,
        user_agent: None,
    }
}

/// The status the client sees (200 for a forwarded request).
pub fn status(g: &Gate) -> u16 {
    match g {
        Err(reply) => reply.status,
        Ok(_) => 200,
    }
}

pub fn retry_after(g: &Gate) -> Option<i64> {
    match g {
        Err(reply) => reply.header("Retry-After").map(|v| v.parse().unwrap()),
        Ok(_) => None,
    }
}

pub fn header<'a>(g: &'a Gate, name: &str) -> Option<&'a str> {
    match g {
        Err(reply) => reply.header(name),
        Ok(admit) => admit.header(name),
    }
}

/// Runs what the pipeline left for after the answer (the hosts spawn it).
pub async fn settle(d: Decided) -> Gate {
    for task in d.background {
        task.await;
    }
    d.gate
}
