//! The exact deny cache. When the store denies a bucket with an exact wait `w`,
//! the bucket cannot admit the same request before `now + w` (a denial changes no
//! state, and only time refills), so until then the instance answers that bucket
//! with a 429 itself. It only ever denies, and only while the store would too: it
//! never admits a request the store would have denied, and it stops no later than
//! the instant the store would admit again (anchored at the call's start on this
//! instance's clock, so at most one round trip early, never late).

use std::collections::HashMap;
use std::sync::Mutex;

use floodgate_shared::time::Micros;

use crate::sync::lock;

/// One bucket the store denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    /// Local instant at which the bucket admits the request again.
    pub until: Micros,
    /// Local instant at which the bucket is full again (`X-RateLimit-Reset`).
    pub full_at: Micros,
    pub limit: u64,
}

#[derive(Default)]
pub struct DenyCache {
    until: Mutex<HashMap<String, Denied>>,
}

/// Bound on cached denials; expired ones are dropped first.
const MAX_DENIED: usize = 100_000;

impl DenyCache {
    /// The denials still in force at `now` among `keys`, with each one's index.
    pub fn lookup<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a str>,
        now: Micros,
    ) -> Vec<(usize, Denied)> {
        let map = lock(&self.until);
        if map.is_empty() {
            return vec![];
        }
        keys.into_iter()
            .enumerate()
            .filter_map(|(i, k)| map.get(k).filter(|d| d.until > now).map(|d| (i, *d)))
            .collect()
    }

    pub fn remember(&self, key: &str, denied: Denied, now: Micros) {
        let mut map = lock(&self.until);
        if map.len() >= MAX_DENIED {
            map.retain(|_, d| d.until > now);
            if map.len() >= MAX_DENIED {
                return;
            }
        }
        map.insert(key.to_string(), denied);
    }
}
