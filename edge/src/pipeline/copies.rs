//! Key records and the configuration read from the region (issue 38): with a
//! regional store, an instance that misses a record reads the region's copy —
//! a round trip next door — instead of waiting for the global store. Each copy
//! carries the records' revision it was read with, and the region holds the
//! revision an instance last confirmed at the global store, with when
//! ([`REV_FIELD`]). A copy serves only when that confirmation is recent (half a
//! cache TTL) and the copy was read with that very revision: a change an
//! operator made since is never served from a copy (and the instance reads the
//! global revision, and what changed, in the background as it always does).
//! Otherwise the global store is read, as before, and what it answered is
//! copied to the region (in the background): one hash, [`COPIES_KEY`].
//!
//! An instance's first miss, and at most one miss per half a cache TTL after it,
//! reads the copies with one `HSCAN` (up to `copies_prefetch` of them) instead of
//! the `HMGET` of what it missed: the same one command, and every other key
//! record the region holds with the confirmed revision is cached with it
//! (while the cache has room), so a fresh or cold instance's next keys are not
//! each a read. Each scan goes on where the instance's last one stopped (its
//! cursor), so an instance sweeps every copy the region holds, a page per
//! scan, rather than the first page again and again. A page is served with the
//! region's confirmation of the revision when it holds that field, or with the
//! instance's own confirmation at the global store. The long tail at fan-out is
//! that: many instances, each seeing a key seldom, all in one region that has
//! seen it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use floodgate_shared::apikeys::{KeyRecord, record_hash};
use floodgate_shared::time::{Clock, Micros};

use super::guarded::Guarded;
use super::{Pipeline, Task, boxed};
use crate::store::{MaybeSend, MaybeSync, Store, StoreError, Value};
use crate::sync::lock;

/// A region's copies: a hash of record name → `<revision>\n<the record's text>`
/// (`<revision>\n-` for a record that does not exist), and [`REV_FIELD`].
pub const COPIES_KEY: &str = "fg:copies";
/// The records' revision last confirmed at the global store, and when (the
/// confirming instance's clock, µs): `<revision> <instant>`.
pub const REV_FIELD: &str = "rev";

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The region's copies of `names` (record names, in order) as the global
    /// store's read would answer them — the revision first — when the region
    /// holds every one, read with the revision it confirmed lately; `None`:
    /// read the global store.
    pub(super) async fn copied(
        &self,
        names: &[String],
        later: &mut Vec<Task>,
    ) -> Option<Vec<Option<Vec<u8>>>> {
        let region = self.regional.as_ref()?;
        let mut fields: Vec<String> = vec![REV_FIELD.to_string()];
        fields.extend(names.iter().skip(1).cloned());
        let fresh = self.settings.cache_ttl / 2;
        let count = self.settings.copies_prefetch;
        if count > 0
            && let Some(cursor) = self.copies_scanned.claim(self.clock.now(), fresh)
            && let Some(found) = self
                .scan_copies(region, count, cursor, &fields, later)
                .await
        {
            return from_copies(found, self.clock.now(), fresh);
        }
        let store = region.store.clone();
        let asked = fields.clone();
        let fut = boxed(async move {
            let mut args: Vec<&[u8]> = vec![b"HMGET", COPIES_KEY.as_bytes()];
            args.extend(asked.iter().map(|f| f.as_bytes()));
            let reply = store.command(&args).await?;
            reply.into_list()
        });
        let values = region.call_now(&self.clock, fut).await.or_drain(later)?;
        let now = self.clock.now();
        from_copies(values, now, fresh)
    }

    /// Scans the region's copies from `cursor` (one `HSCAN`, up to `count`),
    /// caches every key record among them confirmed lately and not held yet,
    /// and keeps the cursor the scan ended at for the next: the values of
    /// `fields`, or `None` when the scan failed or saw only part of the copies
    /// and not all of `fields` (read them as usual).
    async fn scan_copies(
        &self,
        region: &Guarded<S>,
        count: u32,
        cursor: String,
        fields: &[String],
        later: &mut Vec<Task>,
    ) -> Option<Vec<Option<Vec<u8>>>> {
        let store = region.store.clone();
        let from = cursor.clone();
        let fut = boxed(async move {
            let count = count.to_string();
            let args: [&[u8]; 5] = [
                b"HSCAN",
                COPIES_KEY.as_bytes(),
                from.as_bytes(),
                b"COUNT",
                count.as_bytes(),
            ];
            Scanned::from_reply(store.command(&args).await?)
        });
        let scanned = region.call_now(&self.clock, fut).await.or_drain(later)?;
        self.copies_scanned.went_on(&cursor, &scanned.next);
        let now = self.clock.now();
        let fresh = self.settings.cache_ttl / 2;
        let own = self.records.confirmed(now, fresh);
        for (hash, record, rev) in scanned.records(now, fresh, own) {
            self.records.adopt_key(hash, record, now, Some(rev));
        }
        scanned.values(fields, cursor == "0")
    }

    /// Copies what the global store answered for `names` (the revision first)
    /// to the region, in the background, with this confirmation of the revision.
    pub(super) fn copy_to_region(
        &self,
        names: &[String],
        values: &[Option<Vec<u8>>],
        later: &mut Vec<Task>,
    ) {
        let Some(region) = &self.regional else {
            return;
        };
        let Some(rev) = values.first().cloned().flatten() else {
            return;
        };
        let now = self.clock.now();
        let mut pairs: Vec<(String, Vec<u8>)> = vec![(REV_FIELD.to_string(), rev_field(&rev, now))];
        for (name, value) in names.iter().zip(values).skip(1) {
            let mut copy = rev.clone();
            copy.push(b'\n');
            copy.extend(value.as_deref().unwrap_or(b"-"));
            pairs.push((name.clone(), copy));
        }
        later.push(self.write_copies(region, pairs));
    }

    fn write_copies(&self, region: &Guarded<S>, pairs: Vec<(String, Vec<u8>)>) -> Task {
        let store = region.store.clone();
        boxed(async move {
            let mut args: Vec<&[u8]> = vec![b"HSET", COPIES_KEY.as_bytes()];
            for (f, v) in &pairs {
                args.extend([f.as_bytes(), v.as_slice()]);
            }
            let _ = store.command(&args).await;
        })
    }
}

/// When this instance last scanned the region's copies, and the cursor its
/// next scan starts from (`0`: the start).
#[derive(Default)]
pub struct ScanClock(Mutex<(Option<Micros>, String)>);

impl ScanClock {
    /// The cursor to scan from at `now` (the first time, then at most once per
    /// `every`), or `None`; claimed at once, so concurrent misses scan once.
    fn claim(&self, now: Micros, every: Micros) -> Option<String> {
        let mut scan = lock(&self.0);
        if scan.0.is_some_and(|at| (0..every).contains(&(now - at))) {
            return None;
        }
        scan.0 = Some(now);
        Some(if scan.1.is_empty() {
            "0".into()
        } else {
            scan.1.clone()
        })
    }

    /// A scan from `from` ended at `next`: the next scan goes on from there
    /// (unless another scan moved the cursor meanwhile).
    fn went_on(&self, from: &str, next: &str) {
        let mut scan = lock(&self.0);
        if scan.1 == from || (scan.1.is_empty() && from == "0") {
            scan.1 = next.to_string();
        }
    }
}

/// One `HSCAN` of the region's copies: what it read, and the cursor it ended
/// at (`0`: the end of the hash).
#[derive(Debug, Default, PartialEq)]
pub struct Scanned {
    fields: HashMap<String, Vec<u8>>,
    next: String,
}

impl Scanned {
    /// Reads `HSCAN`'s reply: `[cursor, [field, value, …]]` (cursor `0`: all).
    pub fn from_reply(reply: Value) -> Result<Scanned, StoreError> {
        let bad = |why: &str| StoreError::protocol(format!("HSCAN replied {why}"));
        let Value::Array(parts) = reply.ok()? else {
            return Err(bad("no array"));
        };
        let [cursor, items]: [Value; 2] = parts.try_into().map_err(|_| bad("no pair"))?;
        let next = match cursor {
            Value::Int(c) => c.to_string(),
            c => c.as_str().ok_or_else(|| bad("no cursor"))?.to_string(),
        };
        let items = items.into_list()?;
        if items.len() % 2 != 0 {
            return Err(bad("an odd list"));
        }
        let mut fields = HashMap::with_capacity(items.len() / 2);
        let mut items = items.into_iter();
        while let (Some(f), Some(v)) = (items.next(), items.next()) {
            let (Some(f), Some(v)) = (f, v) else {
                return Err(bad("a nil"));
            };
            fields.insert(String::from_utf8_lossy(&f).into_owned(), v);
        }
        Ok(Scanned { fields, next })
    }

    /// The values of `fields` as `HMGET` would answer them, when the scan saw
    /// them all or saw every copy (it started at the hash's start, `from_start`,
    /// and ended at its end); `None`: read them.
    fn values(&self, fields: &[String], from_start: bool) -> Option<Vec<Option<Vec<u8>>>> {
        let values: Vec<Option<Vec<u8>>> =
            fields.iter().map(|f| self.fields.get(f).cloned()).collect();
        let whole = from_start && self.next == "0";
        (whole || values.iter().all(Option::is_some)).then_some(values)
    }

    /// The key records among the copies (hash, record, revision) that may be
    /// served at `now`: the region (in the page read), or else this instance
    /// (`own`), confirmed their revision at the global store within `fresh`,
    /// and each was copied with that revision (records of keys that do not
    /// exist and records that do not parse are left out).
    pub fn records(
        &self,
        now: Micros,
        fresh: Micros,
        own: Option<u64>,
    ) -> impl Iterator<Item = (String, Arc<KeyRecord>, u64)> + '_ {
        let own = own.map(|r| r.to_string());
        let rev = self
            .fields
            .get(REV_FIELD)
            .and_then(|c| confirmed(c, now, fresh))
            .map(str::to_string)
            .or(own);
        self.fields.iter().filter_map(move |(name, v)| {
            let rev = rev.as_deref()?;
            let hash = record_hash(name)?;
            let record = copy_of(v, rev)??;
            let record = KeyRecord::from_json(record)?;
            Some((hash.to_string(), Arc::new(record), rev.parse().ok()?))
        })
    }
}

/// The revision a confirmation (`<revision> <instant>`) names, when it was made
/// within `fresh` of `now`.
fn confirmed(confirmation: &[u8], now: Micros, fresh: Micros) -> Option<&str> {
    let text = std::str::from_utf8(confirmation).ok()?;
    let (rev, at) = text.split_once(' ')?;
    let at: Micros = at.parse().ok()?;
    ((0..=fresh).contains(&(now - at)) && rev.parse::<u64>().is_ok()).then_some(rev)
}

/// A copy (`<revision>\n<record>`) made with `rev`: the record (`None`: the
/// record does not exist); `None` for a copy of another revision.
fn copy_of<'a>(copy: &'a [u8], rev: &str) -> Option<Option<&'a [u8]>> {
    let split = copy.iter().position(|b| *b == b'\n')?;
    if &copy[..split] != rev.as_bytes() {
        return None;
    }
    let record = &copy[split + 1..];
    Some((record != b"-").then_some(record))
}

/// `<revision> <now>`.
fn rev_field(rev: &[u8], now: Micros) -> Vec<u8> {
    let mut field = rev.to_vec();
    field.extend(format!(" {now}").into_bytes());
    field
}

/// The global read's answer from the region's fields (the revision, then the
/// records), when the revision was confirmed within `fresh` of `now` and every
/// record was copied with it.
pub fn from_copies(
    values: Vec<Option<Vec<u8>>>,
    now: Micros,
    fresh: Micros,
) -> Option<Vec<Option<Vec<u8>>>> {
    let mut values = values.into_iter();
    let confirmation = values.next()??;
    let rev = confirmed(&confirmation, now, fresh)?;
    let mut out = vec![Some(rev.as_bytes().to_vec())];
    for v in values {
        out.push(copy_of(&v?, rev)?.map(<[u8]>::to_vec));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_shared::apikeys::record_key;

    fn b(s: &str) -> Option<Vec<u8>> {
        Some(s.as_bytes().to_vec())
    }

    #[test]
    fn copies_serve_only_with_a_recent_confirmation_and_their_own_revision() {
        let got = from_copies(
            vec![b("7 1000"), b("7\n{\"a\":1}"), b("7\n-")],
            1_500,
            1_000,
        );
        assert_eq!(got, Some(vec![b("7"), b("{\"a\":1}"), None]));
        // confirmed too long ago
        assert_eq!(
            from_copies(vec![b("7 1000"), b("7\nx")], 2_500, 1_000),
            None
        );
        // a copy of another revision (a change since)
        assert_eq!(
            from_copies(vec![b("8 1000"), b("7\nx")], 1_500, 1_000),
            None
        );
        // a record never copied, no confirmation, garbage
        assert_eq!(from_copies(vec![b("7 1000"), None], 1_500, 1_000), None);
        assert_eq!(from_copies(vec![None, b("7\nx")], 1_500, 1_000), None);
        assert_eq!(from_copies(vec![b("x y"), b("7\nx")], 1_500, 1_000), None);
        assert_eq!(from_copies(vec![b("7 1000"), b("7x")], 1_500, 1_000), None);
    }

    fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    fn reply(cursor: &str, items: &[&str]) -> Value {
        Value::Array(vec![
            bulk(cursor),
            Value::Array(items.iter().map(|s| bulk(s)).collect()),
        ])
    }

    fn record_copy(rev: &str, owner: &str) -> String {
        format!(
            "{rev}\n{}",
            KeyRecord::new("id1", owner, "free", 0).to_json()
        )
    }

    #[test]
    fn a_scan_serves_what_it_saw_and_says_whether_it_saw_everything() {
        let (a, b2) = (record_key(&"a".repeat(64)), record_key(&"b".repeat(64)));
        let whole = Scanned::from_reply(reply("0", &[REV_FIELD, "7 1000", &a, "7\n-"])).unwrap();
        assert_eq!(whole.next, "0");
        let asked = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            whole.values(&asked(&[REV_FIELD, &a]), true),
            Some(vec![b("7 1000"), b("7\n-")])
        );
        // every copy seen: one it does not hold is missing, as HMGET says
        assert_eq!(
            whole.values(&asked(&[REV_FIELD, &b2]), true),
            Some(vec![b("7 1000"), None])
        );
        // the last page of a sweep that started elsewhere saw only itself
        assert_eq!(whole.values(&asked(&[REV_FIELD, &b2]), false), None);
        // part of the copies: only what it saw
        let part = Scanned::from_reply(reply("17", &[REV_FIELD, "7 1000", &a, "7\n-"])).unwrap();
        assert!(part.values(&asked(&[REV_FIELD, &a]), true).is_some());
        assert_eq!(part.values(&asked(&[REV_FIELD, &b2]), true), None);
        assert_eq!(part.next, "17");
        // an integer cursor, and replies that are not HSCAN's
        assert_eq!(
            Scanned::from_reply(Value::Array(vec![Value::Int(0), Value::Array(vec![])]))
                .unwrap()
                .next,
            "0"
        );
        assert!(Scanned::from_reply(reply("0", &["f"])).is_err());
        assert!(Scanned::from_reply(Value::Array(vec![bulk("0")])).is_err());
        assert!(Scanned::from_reply(bulk("0")).is_err());
    }

    #[test]
    fn a_scan_caches_only_existing_records_copied_with_a_recent_confirmation() {
        let name = |c: char| record_key(&c.to_string().repeat(64));
        let (a, b2, c, d) = (name('a'), name('b'), name('c'), name('d'));
        let fields = [
            REV_FIELD.to_string(),
            "7 1000".to_string(),
            a.clone(),
            record_copy("7", "acme"),
            b2.clone(),
            record_copy("6", "old"),
            c.clone(),
            "7\n-".to_string(),
            d.clone(),
            "7\nnot json".to_string(),
            "fg:config".to_string(),
            "7\n{}".to_string(),
        ];
        let refs: Vec<&str> = fields.iter().map(String::as_str).collect();
        let scanned = Scanned::from_reply(reply("0", &refs)).unwrap();
        let got: Vec<(String, String, u64)> = scanned
            .records(1_500, 1_000, None)
            .map(|(h, r, rev)| (h, r.owner.clone(), rev))
            .collect();
        assert_eq!(got, vec![("a".repeat(64), "acme".to_string(), 7)]);
        // a confirmation too old, or none: nothing
        assert_eq!(scanned.records(2_500, 1_000, None).count(), 0);
        let unconfirmed =
            Scanned::from_reply(reply("0", &[&a, &record_copy("7", "acme")])).unwrap();
        assert_eq!(unconfirmed.records(1_500, 1_000, None).count(), 0);
        // a page without the region's confirmation serves on the instance's
        // own, of the same revision only
        let page = Scanned::from_reply(reply(
            "33",
            &[&a, &record_copy("7", "acme"), &b2, &record_copy("6", "old")],
        ))
        .unwrap();
        let owners = |own| {
            page.records(1_500, 1_000, own)
                .map(|(_, r, _)| r.owner.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(owners(Some(7)), ["acme"]);
        assert_eq!(owners(Some(6)), ["old"]);
        assert!(owners(None).is_empty());
    }

    #[test]
    fn concurrent_misses_scan_once_per_interval() {
        let clock = ScanClock::default();
        assert!(clock.claim(1_000, 500).is_some());
        assert!(clock.claim(1_000, 500).is_none());
        assert!(clock.claim(1_499, 500).is_none());
        assert!(clock.claim(1_500, 500).is_some());
        // a clock that went back does not stop scans for good
        assert!(clock.claim(100, 500).is_some());
    }

    #[test]
    fn scans_sweep_the_copies_page_by_page_and_start_again_at_the_end() {
        let clock = ScanClock::default();
        let from = clock.claim(1_000, 500).unwrap();
        assert_eq!(from, "0");
        clock.went_on(&from, "17");
        let from = clock.claim(2_000, 500).unwrap();
        assert_eq!(from, "17", "the next page, not the first again");
        // a slower scan that started earlier does not move the sweep back
        clock.went_on("0", "9");
        clock.went_on(&from, "0");
        assert_eq!(
            clock.claim(3_000, 500).unwrap(),
            "0",
            "the end: from the start"
        );
    }
}
