//! The records' revision at work (`floodgate_shared::changes`): how the instance
//! learns it — from every exact decision (the token bucket script reads it in
//! the same `MGET`), from every read of records, and otherwise from one `GET`
//! per TTL — and what it does when it moved: read again, in the background and
//! in one call, only the records the change log names (everything it holds when
//! the log cannot tell). Until then the records held keep serving, so a
//! revocation or a lowered limit takes effect one round trip after the instance
//! learned of it.

use std::sync::Arc;

use floodgate_shared::apikeys::record_key;
use floodgate_shared::changes::{Change, LOG_KEY, REV_KEY, Stale, parse_rev};
use floodgate_shared::config::CONFIG_KEY;
use floodgate_shared::time::{Clock, Micros};

use super::caller::{load_config, load_key};
use super::copies::{COPIES_KEY, REV_FIELD};
use super::events::LogEvent;
use super::health::Totals;
use super::records::{Observed, Records};
use super::{Pipeline, Task, boxed};
use crate::breaker::Phase;
use crate::store::{MaybeSend, MaybeSync, SetOptions, Store, StoreError};

/// Records read again in one call at most (`MGET` of this many keys).
const CHUNK: usize = 500;

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The store said the revision is `seen`: every record held is confirmed, or
    /// what changed is read again in the background.
    pub(super) fn revision_seen(&self, seen: Option<u64>, later: &mut Vec<Task>) {
        let now = self.clock.now();
        if let Observed::Sync { known } = self.records.observe(seen, now) {
            later.push(self.sync_task(known, seen, now));
        }
    }

    /// Checks the revision in the background when the records were last
    /// confirmed more than a TTL ago (one check at a time; none while the breaker
    /// is open: the records serve on).
    pub(super) fn check_revision(&self, later: &mut Vec<Task>) {
        let now = self.clock.now();
        if self.global.phase() != Phase::Closed || !self.records.claim_check(now) {
            return;
        }
        let sync = self.syncer();
        later.push(boxed(async move {
            let got = sync.store.get(REV_KEY).await;
            sync.records.release_check();
            let Ok(raw) = got else { return };
            sync.confirm_in_region(raw.as_deref(), now).await;
            let seen = parse_rev(raw.as_deref());
            if let Observed::Sync { known } = sync.records.observe(seen, now) {
                sync.run(known, seen, now).await;
            }
        }));
    }

    fn sync_task(&self, known: Option<u64>, seen: Option<u64>, now: Micros) -> Task {
        let sync = self.syncer();
        boxed(async move { sync.run(known, seen, now).await })
    }

    fn syncer(&self) -> Syncer<S> {
        Syncer {
            region: self.regional.as_ref().map(|r| r.store.clone()),
            store: self.global.store.clone(),
            records: self.records.clone(),
            totals: self.totals.clone(),
            log: self.settings.log,
        }
    }
}

/// What a read of the changed records needs, owned by its background task.
struct Syncer<S> {
    store: S,
    /// The regional store, told each revision confirmed ([`super::copies`]).
    region: Option<S>,
    records: Arc<Records>,
    totals: Arc<Totals>,
    log: fn(&LogEvent<'_>),
}

impl<S: Store> Syncer<S> {
    /// Tells the region the revision `raw` was confirmed at the global store at
    /// `now` ([`super::copies`]).
    async fn confirm_in_region(&self, raw: Option<&[u8]>, now: Micros) {
        let (Some(region), Some(rev)) = (&self.region, raw) else {
            return;
        };
        let value = format!("{} {now}", String::from_utf8_lossy(rev));
        let args: [&[u8]; 4] = [
            b"HSET",
            COPIES_KEY.as_bytes(),
            REV_FIELD.as_bytes(),
            value.as_bytes(),
        ];
        let _ = region.command(&args).await;
    }

    /// Reads again what changed from revision `known` to `seen`, then marks the
    /// records consistent with `seen` (observed at `now`); a failure leaves them
    /// as they were, for the next observation to try again.
    async fn run(&self, known: Option<u64>, seen: Option<u64>, now: Micros) {
        match self.read_changed(known, seen, now).await {
            Ok(()) => self.records.synced(seen, now),
            Err(_) => self.records.release_sync(),
        }
    }

    async fn read_changed(
        &self,
        known: Option<u64>,
        seen: Option<u64>,
        now: Micros,
    ) -> Result<(), StoreError> {
        let stale = match Stale::log_needed(known, seen) {
            Some(n) => {
                let log = self.store.lrange(LOG_KEY, 0, n as i64 - 1).await?;
                Stale::from_log(known, seen, &log)
            }
            None => Stale::from_log(known, seen, &[]),
        };
        let (config, keys) = self.what_to_read(stale, seen);
        if seen.is_none() {
            // no counter yet (a store older than it): start one, so the next
            // check can confirm instead of reading everything again
            self.store.set(REV_KEY, b"0", SetOptions::NX).await?;
        }
        self.read(config, keys, now, seen).await
    }

    /// Whether the configuration is to be read again, and which key records: what
    /// changed (everything, when the log cannot tell), but for what was read with
    /// revision `seen` already.
    fn what_to_read(&self, stale: Stale, seen: Option<u64>) -> (bool, Vec<String>) {
        let behind = self.records.keys_behind(seen);
        let config_behind = self.records.config_behind(seen);
        match stale {
            Stale::Nothing => (false, vec![]),
            Stale::Everything => (config_behind, behind),
            Stale::Only(changes) => {
                let config = changes.contains(&Change::Config) && config_behind;
                let keys = behind
                    .into_iter()
                    .filter(|h| changes.contains(&Change::Key(h.clone())))
                    .collect();
                (config, keys)
            }
        }
    }

    /// Reads the configuration (when `config`) and the key records of `keys`, in
    /// calls of [`CHUNK`] keys, and caches them as read at `now` with revision `rev`
    /// (they are at least as new).
    async fn read(
        &self,
        config: bool,
        keys: Vec<String>,
        now: Micros,
        rev: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut names: Vec<String> = keys.iter().map(|h| record_key(h)).collect();
        if config {
            names.insert(0, CONFIG_KEY.to_string());
        }
        let mut values = Vec::with_capacity(names.len());
        for chunk in names.chunks(CHUNK) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            values.extend(self.store.get_many(&refs).await?);
        }
        let mut values = values.into_iter();
        if config {
            let raw = values.next().flatten();
            let _ = load_config(&self.records, &self.totals, self.log, raw, (now, rev));
        }
        for (hash, raw) in keys.into_iter().zip(values) {
            load_key(&self.records, &self.totals, hash, raw, (now, rev));
        }
        Ok(())
    }
}
