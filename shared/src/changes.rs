//! What changed in the records the edge caches: a revision counter bumped by every
//! save of the configuration and every change of an API key, and a log naming
//! what each revision changed. An edge instance learns the revision from every
//! decision it asks the store for (the decision script returns it) and otherwise
//! checks it once per cache TTL: unchanged, every record it holds stays good
//! without reading any; changed, the log says which records to read again.
//!
//! Both keys share the configuration's cluster slot (`{fg:config}`), so the
//! configuration's save bumps them atomically (`lua/config_cas.lua`); a key change
//! bumps them with [`CHANGED`] right after its record is written. A revision that
//! is missing, not a number, or a log that does not account for every revision in
//! between means "read everything again", never "nothing changed".

use std::fmt;
use std::str::FromStr;

use crate::script::LuaScript;

mod sha {
    include!(concat!(env!("OUT_DIR"), "/changes_sha1.rs"));
}

/// The revision counter (an integer).
pub const REV_KEY: &str = "{fg:config}:rev";
/// The change log (a list, newest first): one [`Entry`] per revision.
pub const LOG_KEY: &str = "{fg:config}:changes";
/// How many entries the log keeps: an instance further behind reads everything.
pub const LOG_KEEP: usize = 1_000;

/// `lua/changed.lua`: bumps the revision and logs what changed.
pub const CHANGED: LuaScript = LuaScript {
    source: sha::CHANGED_SOURCE,
    sha1: sha::CHANGED_SHA1,
};

/// What one revision changed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Change {
    /// The configuration (`fg:config`).
    Config,
    /// The record of the key whose secret hashes to this (hex SHA-256).
    Key(String),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Config => f.write_str("config"),
            Change::Key(hash) => write!(f, "key:{hash}"),
        }
    }
}

/// Not a change the log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadEntry(pub String);

impl fmt::Display for BadEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a change log entry: {:?}", self.0)
    }
}

impl FromStr for Change {
    type Err = BadEntry;
    fn from_str(s: &str) -> Result<Self, BadEntry> {
        match s.strip_prefix("key:") {
            Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(Change::Key(h.to_ascii_lowercase()))
            }
            Some(_) => Err(BadEntry(s.into())),
            None if s == "config" => Ok(Change::Config),
            None => Err(BadEntry(s.into())),
        }
    }
}

/// One entry of the log: a revision and what it changed (`"<rev> <change>"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub rev: u64,
    pub change: Change,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.rev, self.change)
    }
}

impl FromStr for Entry {
    type Err = BadEntry;
    fn from_str(s: &str) -> Result<Self, BadEntry> {
        let (rev, change) = s.split_once(' ').ok_or_else(|| BadEntry(s.into()))?;
        Ok(Entry {
            rev: rev.parse().map_err(|_| BadEntry(s.into()))?,
            change: change.parse()?,
        })
    }
}

/// A revision as read: a number, or `None` (missing or not a number).
pub fn parse_rev(raw: Option<&[u8]>) -> Option<u64> {
    let text = std::str::from_utf8(raw?).ok()?;
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// What a decision said of the records' revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Revision {
    /// The call did not read it (Redis Cluster: another slot; the multi-algorithm
    /// script).
    #[default]
    NotAsked,
    /// The counter's value, `None` when it is missing or not a number.
    Seen(Option<u64>),
}

/// What an instance that read its records at revision `known` must read again
/// now that the revision is `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// Nothing: the revision did not move.
    Nothing,
    /// These records.
    Only(Vec<Change>),
    /// Everything it holds: the revision is unknown on either side, went
    /// backwards, or the log does not account for every revision in between.
    Everything,
}

impl Stale {
    /// How many of the log's newest entries to read to tell what changed from
    /// `known` to `now`: those, and a few more in case the log moved on meanwhile
    /// (newer entries are skipped). `None` when no log can tell (the answer is then
    /// [`Stale::Everything`] or [`Stale::Nothing`] without reading it).
    pub fn log_needed(known: Option<u64>, now: Option<u64>) -> Option<usize> {
        match (known, now) {
            (Some(k), Some(n)) if n > k && n - k <= LOG_KEEP as u64 => {
                Some((n - k) as usize + LOG_SLACK)
            }
            _ => None,
        }
    }

    /// What to read again, from the log's newest entries `log` (`LRANGE 0 n-1`):
    /// skipping entries newer than `now`, they must name exactly the revisions
    /// `now`, `now - 1`, …, `known + 1`.
    pub fn from_log(known: Option<u64>, now: Option<u64>, log: &[Vec<u8>]) -> Stale {
        let (Some(k), Some(n)) = (known, now) else {
            return Stale::Everything;
        };
        if n == k {
            return Stale::Nothing;
        }
        if n < k || n - k > LOG_KEEP as u64 {
            return Stale::Everything;
        }
        let entries: Option<Vec<Entry>> = log
            .iter()
            .map(|raw| std::str::from_utf8(raw).ok()?.parse::<Entry>().ok())
            .collect();
        let Some(entries) = entries else {
            return Stale::Everything;
        };
        let in_range: Vec<&Entry> = entries.iter().skip_while(|e| e.rev > n).collect();
        let want = (n - k) as usize;
        if in_range.len() < want || (0..want).any(|i| in_range[i].rev != n - i as u64) {
            return Stale::Everything;
        }
        let mut changes: Vec<Change> = in_range[..want].iter().map(|e| e.change.clone()).collect();
        changes.sort();
        changes.dedup();
        Stale::Only(changes)
    }
}

/// Entries read past the ones needed, for a log that moved on meanwhile.
pub const LOG_SLACK: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hash() -> impl Strategy<Value = String> {
        "[0-9a-f]{64}"
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![Just(Change::Config), hash().prop_map(Change::Key)]
    }

    proptest! {
        #[test]
        fn entries_round_trip(rev in 0u64..u64::MAX, change in change()) {
            let e = Entry { rev, change };
            prop_assert_eq!(e.to_string().parse::<Entry>(), Ok(e));
        }

        /// Whatever the log holds, a gap it does not cover exactly is never
        /// "nothing changed".
        #[test]
        fn a_log_that_does_not_account_for_every_revision_means_everything(
            known in 0u64..50, ahead in 1u64..10, drop in 0usize..10, junk in proptest::bool::ANY,
        ) {
            let now = known + ahead;
            let mut log: Vec<Vec<u8>> = (known + 1..=now).rev()
                .map(|r| Entry { rev: r, change: Change::Config }.to_string().into_bytes())
                .collect();
            let complete = log.clone();
            if drop < log.len() {
                if junk { log[drop] = b"garbage".to_vec() } else { log.remove(drop); }
                prop_assert_eq!(Stale::from_log(Some(known), Some(now), &log), Stale::Everything);
            }
            prop_assert_eq!(
                Stale::from_log(Some(known), Some(now), &complete),
                Stale::Only(vec![Change::Config])
            );
        }
    }

    #[test]
    fn unknown_or_backwards_revisions_mean_everything() {
        assert_eq!(Stale::from_log(None, Some(3), &[]), Stale::Everything);
        assert_eq!(Stale::from_log(Some(3), None, &[]), Stale::Everything);
        assert_eq!(Stale::from_log(Some(4), Some(3), &[]), Stale::Everything);
        assert_eq!(Stale::from_log(Some(3), Some(3), &[]), Stale::Nothing);
        assert_eq!(Stale::log_needed(Some(3), Some(3)), None);
        assert_eq!(Stale::log_needed(Some(1), Some(3)), Some(2 + LOG_SLACK));
        assert_eq!(
            Stale::log_needed(Some(1), Some(1 + LOG_KEEP as u64 + 1)),
            None
        );
    }

    #[test]
    fn the_log_names_each_record_once() {
        let h = "a".repeat(64);
        let log: Vec<Vec<u8>> = ["5 config", &format!("4 key:{h}"), "3 config"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        assert_eq!(
            Stale::from_log(Some(2), Some(5), &log),
            Stale::Only(vec![Change::Config, Change::Key(h)])
        );
    }

    #[test]
    fn entries_newer_than_the_revision_asked_about_are_skipped() {
        let h = "b".repeat(64);
        let log: Vec<Vec<u8>> = [&format!("7 key:{h}")[..], "6 config", "5 config"]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        assert_eq!(
            Stale::from_log(Some(4), Some(6), &log),
            Stale::Only(vec![Change::Config])
        );
        assert_eq!(
            Stale::from_log(Some(3), Some(6), &log),
            Stale::Everything,
            "5 to 4 missing"
        );
    }

    #[test]
    fn revisions_parse_only_as_plain_numbers() {
        assert_eq!(parse_rev(Some(b"42")), Some(42));
        for bad in [&b""[..], b"-1", b"4.2", b" 4", b"99999999999999999999"] {
            assert_eq!(parse_rev(Some(bad)), None, "{bad:?}");
        }
        assert_eq!(parse_rev(None), None);
    }

    #[test]
    fn the_counter_and_the_log_share_the_configurations_slot() {
        use crate::slot::key_slot;
        assert_eq!(key_slot(REV_KEY), key_slot(crate::config::CONFIG_KEY));
        assert_eq!(key_slot(LOG_KEY), key_slot(crate::config::CONFIG_KEY));
    }
}
