//! Who is calling: the API key from the credentials header (its shape only, no
//! lookup), then its key record and the configuration — from the caches, or in
//! ONE store round trip for whatever is missing ([`Pipeline::caller`]).
//!
//! What expired less than a TTL ago is served stale and refreshed in the
//! background (one refresh at a time each), so a busy instance never waits for
//! the global store here; a configuration never read or older, or a key never
//! seen, older, or known not to exist, is read on the request's path. Unknown keys
//! are charged to their address's budget; a store that cannot answer leaves the
//! stale cache, or the failure mode of every policy the request could match.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use floodgate_shared::apikeys::{KeyProblem, KeyRecord, hash_secret, key_from_header, record_key};
use floodgate_shared::changes::{REV_KEY, parse_rev};
use floodgate_shared::config::{CONFIG_KEY, EdgeConfig};
use floodgate_shared::policy::FailureMode;
use floodgate_shared::time::{Clock, MICROS_PER_SEC, Micros, ceil_secs};

use super::events::LogEvent;
use super::guarded::{Called, drain};
use super::health::Totals;
use super::records::{Lookup, Records};
use super::{Admit, DEGRADED_HEADER, Pipeline, Reply, RequestHead, Task, boxed};
use crate::breaker::Phase;
use crate::stats::Outcome;
use crate::store::{MaybeSend, MaybeSync, Store, StoreError};
use crate::sync::lock;

/// The caller, authenticated: an active key's record and the configuration.
pub struct Caller {
    pub record: Arc<KeyRecord>,
    pub config: Arc<EdgeConfig>,
    /// When the pipeline started deciding the request (the instance's clock).
    pub at: Micros,
}

/// A caller the edge could not verify: forwarded without an identity (fail-open)
/// or refused.
pub type Unverified = Result<Admit, Reply>;

/// The API key from the credentials header: its shape only, no lookup.
pub fn credentials<'r>(req: &RequestHead<'r>, bearer: bool) -> Result<&'r str, Reply> {
    key_from_header(req.credentials, bearer).map_err(|p| match p {
        KeyProblem::Missing => Reply::json(
            401,
            "Missing API key",
            Some("send Authorization: Bearer <your API key>"),
        ),
        KeyProblem::Malformed => Reply::json(401, "Invalid API key", None),
    })
}

/// What a read of the records fetches, in this order: the records' revision
/// (read with them, so it confirms everything else held), the configuration, then
/// the key record of `hash`.
fn record_names(hash: &str, key: bool, config: bool) -> Vec<String> {
    let mut names = vec![REV_KEY.to_string()];
    if config {
        names.push(CONFIG_KEY.to_string());
    }
    if key {
        names.push(record_key(hash));
    }
    names
}

/// FNV-1a over `bytes` (never 0 in practice; tells one stored text from another).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Parses a configuration just read and caches it, logging a change (or why it
/// was rejected, once per reason): the configuration, or why there is none.
pub(super) fn load_config(
    records: &Records,
    totals: &Totals,
    log: fn(&LogEvent<'_>),
    raw: Option<Vec<u8>>,
    (now, rev): (Micros, Option<u64>),
) -> Result<Arc<EdgeConfig>, String> {
    let digest = raw.as_deref().map(fnv1a).unwrap_or_default();
    let parsed = raw
        .ok_or_else(|| "no configuration is stored (floodgate-cli config set)".to_string())
        .and_then(|raw| {
            let text = std::str::from_utf8(&raw)
                .map_err(|_| "the stored configuration is not UTF-8".to_string())?;
            EdgeConfig::from_json(text)
                .map_err(|e| format!("the stored configuration is invalid: {e}"))
        });
    match parsed {
        Ok(c) => {
            lock(&totals.config_problem).clear();
            if totals.config_digest.swap(digest, Ordering::Relaxed) != digest {
                let spec = c.spec();
                log(&LogEvent::ConfigLoaded {
                    policies: spec.policies.len(),
                    plans: spec.plans.len(),
                    routes: spec.routes.len(),
                    at: now,
                });
            }
            let c = Arc::new(c);
            records.set_config(c.clone(), now, rev);
            Ok(c)
        }
        Err(why) => {
            let mut last = lock(&totals.config_problem);
            if *last != why {
                log(&LogEvent::ConfigRejected { why: &why, at: now });
                last.clone_from(&why);
            }
            // the last good one stays, and is checked again in a TTL
            records.keep_config(now, rev);
            Err(why)
        }
    }
}

/// Caches a key record just read (`None`: no such key, counted as an unknown-key
/// lookup): the record.
pub(super) fn load_key(
    records: &Records,
    totals: &Totals,
    hash: String,
    raw: Option<Vec<u8>>,
    (now, rev): (Micros, Option<u64>),
) -> Option<Arc<KeyRecord>> {
    let record = raw.and_then(|raw| KeyRecord::from_json(&raw)).map(Arc::new);
    if record.is_none() {
        totals.unknown_key_lookups.fetch_add(1, Ordering::Relaxed);
    }
    records.set_key(hash, record.clone(), now, rev);
    record
}

/// What the caches hold for one request, and what must be read.
struct Cached {
    key: Lookup<Option<Arc<KeyRecord>>>,
    config: Lookup<Arc<EdgeConfig>>,
}

impl Cached {
    fn need_key(&self) -> bool {
        !matches!(self.key, Lookup::Fresh(_))
    }

    fn need_config(&self) -> bool {
        !matches!(self.config, Lookup::Fresh(_))
    }

    /// Whether the request must wait for a read: a configuration never read or
    /// older than two TTLs, a key never seen, older, or known not to exist (a
    /// stale record of an existing key and a stale configuration are served).
    fn on_path(&self) -> bool {
        matches!(self.config, Lookup::Missing | Lookup::Old(_))
            || matches!(
                self.key,
                Lookup::Missing | Lookup::Old(_) | Lookup::Stale(None)
            )
    }
}

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The caller's key record and the configuration (see the module's doc): a
    /// key that admits the request, or the answer to a missing, unknown, revoked,
    /// expired or rotated-out one, to an address that spent its unknown-key
    /// budget, or to a store that cannot say.
    pub(super) async fn caller(
        &self,
        secret: &str,
        req: &RequestHead<'_>,
        later: &mut Vec<Task>,
    ) -> Result<Caller, Unverified> {
        let now = self.clock.now();
        let hash = hash_secret(secret);
        let cached = Cached {
            key: self.records.key(&hash, now),
            config: self.records.config(now),
        };
        let counter = if cached.need_key() {
            &self.totals.key_cache_misses
        } else {
            &self.totals.key_cache_hits
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if cached.key == Lookup::Missing {
            let config = cached.config.clone().any();
            self.unknown_key_room(req, config.as_deref(), now)
                .map_err(Err)?;
        }
        let (key, config, now) = if cached.on_path() {
            // boxed: a cache miss is rare, and its future (a store read under the
            // guard) would otherwise be part of every request's, copied at each move
            let (key, config) = Box::pin(self.read_records(&hash, cached, req, later)).await?;
            // decided when the records arrived: a far store's read may outlast
            // a rate meter's second, a lease, a bucket's refill
            (key, config, self.clock.now())
        } else {
            if cached.need_key() || cached.need_config() {
                self.revalidate(&hash, cached.need_key(), cached.need_config(), now, later);
            }
            let config = cached.config.any().expect("fresh or stale");
            (cached.key.any().flatten(), config, now)
        };
        let Some(record) = key else {
            return Err(Err(Reply::json(401, "Invalid API key", None)));
        };
        // revoked, expired or rotated out: decided on the record as cached, so an
        // expiry takes effect at its second with no store call
        match record.refusal(&hash, now.div_euclid(MICROS_PER_SEC)) {
            None => Ok(Caller {
                record,
                config,
                at: now,
            }),
            Some(r) => Err(Err(Reply::json(401, r.message(), None))),
        }
    }

    /// Whether an uncached key from this address may be looked up: its address (or
    /// the instance) may have spent its budget of lookups that found no key. Its
    /// 429 is counted per endpoint like any other (on the route `config`, the
    /// configuration cached, resolves).
    pub(super) fn unknown_key_room(
        &self,
        req: &RequestHead<'_>,
        config: Option<&EdgeConfig>,
        now: Micros,
    ) -> Result<(), Reply> {
        let Err(wait) = self.unknown_keys.room(req.client_ip, now) else {
            return Ok(());
        };
        self.totals
            .unknown_key_refused
            .fetch_add(1, Ordering::Relaxed);
        let route = config.and_then(|c| c.routes().resolve(req.path));
        self.count_unkeyed(now, route.map(|r| r.name.as_str()), Outcome::Throttled);
        Err(Reply::json(
            429,
            "Too many invalid API keys",
            Some("this address sent too many API keys that do not exist; retry later"),
        )
        .with_header("Retry-After", ceil_secs(wait).max(1).to_string()))
    }

    /// Reads what the caches miss (key record, configuration or both) in one call.
    /// Until a configuration was ever read, the read waits until the start-up
    /// wait is over (counted from the first request that needed it) rather than
    /// the deadline alone.
    async fn read_records(
        &self,
        hash: &str,
        cached: Cached,
        req: &RequestHead<'_>,
        later: &mut Vec<Task>,
    ) -> Result<(Option<Arc<KeyRecord>>, Arc<EdgeConfig>), Unverified> {
        let (need_key, need_config) = (cached.need_key(), cached.need_config());
        let names = record_names(hash, need_key, need_config);
        let values = match self.copied(&names, later).await {
            Some(v) => v,
            None => match self.read_global(&names, &cached, later).await {
                Ok(v) => {
                    self.copy_to_region(&names, &v, later);
                    v
                }
                // the store cannot answer: serve what the caches hold, however old
                Err(e) => {
                    return match (cached.key.any(), cached.config.any()) {
                        (Some(k), Some(c)) => Ok((k, c)),
                        (_, c) => Err(self.unverified(c.as_deref(), req, &e)),
                    };
                }
            },
        };
        let now = self.clock.now();
        let mut values = values.into_iter();
        let seen = parse_rev(values.next().flatten().as_deref());
        let config = if need_config {
            let raw = values.next().flatten();
            match load_config(
                &self.records,
                &self.totals,
                self.settings.log,
                raw,
                (now, seen),
            ) {
                Ok(c) => c,
                // a broken or missing configuration: keep the last good one
                Err(why) => match cached.config.any() {
                    Some(c) => c,
                    None => return Err(Err(self.degraded_refusal(None, None, &why))),
                },
            }
        } else {
            cached.config.any().expect("fresh")
        };
        let key = if need_key {
            let raw = values.next().flatten();
            let record = load_key(
                &self.records,
                &self.totals,
                hash.to_string(),
                raw,
                (now, seen),
            );
            if record.is_none() {
                self.unknown_keys.charge(req.client_ip, now);
            }
            record
        } else {
            cached.key.any().flatten()
        };
        self.revision_seen(seen, later);
        Ok((key, config))
    }

    /// Reads `names` at the global store, within the deadline (until a
    /// configuration was ever read, the start-up wait).
    async fn read_global(
        &self,
        names: &[String],
        cached: &Cached,
        later: &mut Vec<Task>,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let store = self.global.store.clone();
        let names = names.to_vec();
        let read = boxed(async move {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            store.get_many(&refs).await
        });
        let now = self.clock.now();
        let mut deadline = self.global.deadline(now);
        if matches!(cached.config, Lookup::Missing) {
            let first = *lock(&self.first_read).get_or_insert(now);
            deadline = deadline.max(first + self.settings.startup_wait - now);
        }
        match self.global.call(&self.clock, deadline, read).await {
            Called::Done(v) => Ok(v),
            Called::Failed(e, late) => {
                later.extend(late.map(drain));
                Err(e)
            }
        }
    }

    /// Revalidates stale records in the background while requests are answered
    /// from them: a record past its own lifetime is read again (one read at a
    /// time each), with the revision; otherwise one check of the revision confirms
    /// every record held. Not while the global breaker is open (the copies serve
    /// on; the first request after it closes revalidates). A read that fails
    /// leaves the copies and lets the next request try again.
    fn revalidate(&self, hash: &str, key: bool, config: bool, now: Micros, later: &mut Vec<Task>) {
        if self.global.phase() != Phase::Closed {
            return;
        }
        let config = config && self.records.config_expired(now) && self.records.claim_config(now);
        let key = key && self.records.key_expired(hash, now) && self.records.claim_key(hash, now);
        if !key && !config {
            self.check_revision(later);
            return;
        }
        let names = record_names(hash, key, config);
        let (store, records, totals) = (
            self.global.store.clone(),
            self.records.clone(),
            self.totals.clone(),
        );
        let (log, hash) = (self.settings.log, hash.to_string());
        later.push(boxed(async move {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let Ok(values) = store.get_many(&refs).await else {
                if config {
                    records.release_config();
                }
                if key {
                    records.release_key(&hash);
                }
                return;
            };
            let mut values = values.into_iter();
            let seen = parse_rev(values.next().flatten().as_deref());
            if config {
                // a broken configuration is logged and the last good one serves on
                let raw = values.next().flatten();
                let _ = load_config(&records, &totals, log, raw, (now, seen));
            }
            if key {
                load_key(
                    &records,
                    &totals,
                    hash,
                    values.next().flatten(),
                    (now, seen),
                );
            }
        }));
    }

    /// A caller whose key cannot be verified because the store is unreachable:
    /// forwarded without an identity when every policy the request could match
    /// fails open, else refused (503). Both are marked and counted.
    pub(super) fn unverified(
        &self,
        config: Option<&EdgeConfig>,
        req: &RequestHead<'_>,
        e: &StoreError,
    ) -> Unverified {
        let why = format!("cannot verify the API key: {e}");
        let Some(config) = config else {
            return Err(self.degraded_refusal(None, None, &why));
        };
        let route = config.routes().resolve(req.path);
        let candidates = config.any_caller(route, req.client_ip.is_some());
        let route_name = route.map(|r| r.name.as_str());
        match FailureMode::strictest(candidates.iter().map(|p| p.failure_mode())) {
            FailureMode::FailOpen => {
                self.degraded(None, FailureMode::FailOpen, route_name);
                Ok(Admit::anonymous(
                    route_name.map(str::to_string),
                    vec![(DEGRADED_HEADER, "fail-open".into())],
                ))
            }
            // a local share needs the key's plan: an unverified key has none
            FailureMode::LocalFallback | FailureMode::FailClosed => {
                Err(self.degraded_refusal(None, route_name, &why))
            }
        }
    }
}
