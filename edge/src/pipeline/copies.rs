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

use floodgate_shared::time::{Clock, Micros};

use super::guarded::{Called, Guarded, drain};
use super::{Pipeline, Task, boxed};
use crate::store::{MaybeSend, MaybeSync, Store};

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
        let store = region.store.clone();
        let asked = fields.clone();
        let fut = boxed(async move {
            let mut args: Vec<&[u8]> = vec![b"HMGET", COPIES_KEY.as_bytes()];
            args.extend(asked.iter().map(|f| f.as_bytes()));
            let reply = store.command(&args).await?;
            reply.into_list()
        });
        let values = match region.call_now(&self.clock, fut).await {
            Called::Done(v) => v,
            Called::Failed(_, late) => {
                later.extend(late.map(drain));
                return None;
            }
        };
        let now = self.clock.now();
        from_copies(values, now, self.settings.cache_ttl / 2)
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
    let confirmed = values.next()??;
    let text = std::str::from_utf8(&confirmed).ok()?;
    let (rev, at) = text.split_once(' ')?;
    let at: Micros = at.parse().ok()?;
    if !(0..=fresh).contains(&(now - at)) || rev.parse::<u64>().is_err() {
        return None;
    }
    let mut out = vec![Some(rev.as_bytes().to_vec())];
    for v in values {
        let v = v?;
        let split = v.iter().position(|b| *b == b'\n')?;
        if &v[..split] != rev.as_bytes() {
            return None;
        }
        let record = &v[split + 1..];
        out.push((record != b"-").then(|| record.to_vec()));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
