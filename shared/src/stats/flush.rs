//! One statistics flush as ONE call of `lua/stats_flush.lua` (on one Redis, or
//! Upstash): what an instance writes, and the script's keys and arguments. On a
//! Redis Cluster the keys live in different slots, so the flush is one call per
//! part (each minute's hash, the sample, the last-use hash), each the same script.

use super::{LAST_USED_KEY, MINUTE_TTL_SECS, SAMPLE_KEEP, SAMPLE_KEY};
use crate::script::LuaScript;

mod sha {
    include!(concat!(env!("OUT_DIR"), "/stats_sha1.rs"));
}

/// `lua/stats_flush.lua`: an instance's counts, sample and last-use times, checked
/// whole and then written; replies with the sample's length.
pub const STATS_FLUSH: LuaScript = LuaScript {
    source: sha::STATS_FLUSH_SOURCE,
    sha1: sha::STATS_FLUSH_SHA1,
};

/// The sample's length at which the script trims it back to [`SAMPLE_KEEP`]: a
/// quarter more, so the trim costs one `LTRIM` per `SAMPLE_KEEP / 4` decisions
/// sampled, not one per flush. Readers take the newest `SAMPLE_KEEP`.
pub const SAMPLE_TRIM_AT: usize = SAMPLE_KEEP + SAMPLE_KEEP / 4;

/// A minute's counts as one instance writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinuteWrite {
    /// The minute's hash ([`super::minute_key`]).
    pub key: String,
    /// The instance's counts of the minute, whole ([`super::MinuteCounts::to_json`]).
    pub counts: String,
    /// The first write of this minute by the instance: give the hash its TTL.
    pub expire: bool,
}

/// What one flush writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsWrite {
    /// The instance's field in the minute hashes ([`super::instance_field`]).
    pub field: String,
    pub minutes: Vec<MinuteWrite>,
    /// Sampled decisions, oldest first ([`super::SampleEntry`] as text).
    pub sample: Vec<String>,
    /// API key id → Unix seconds of its latest decision.
    pub last_used: Vec<(String, i64)>,
}

/// One script call: its keys and arguments.
pub type ScriptCall = (Vec<String>, Vec<String>);

/// The most sample entries one call pushes: a call with a thousand runs in about
/// half a millisecond in Redis; one with five thousand (an instance's whole
/// sample of a flush interval under load) ran 2-3 ms, and every other client's
/// calls — decisions with a deadline of 3 ms among them — waited that long.
pub const SAMPLE_CHUNK: usize = 1000;

impl StatsWrite {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.minutes.is_empty() && self.sample.is_empty() && self.last_used.is_empty()
    }

    /// The script calls that write it, to be sent one after another: ONE when
    /// every key may be in one call (`one_slot`: a single Redis, Upstash), else
    /// one per key (a Redis Cluster); a sample of more than [`SAMPLE_CHUNK`]
    /// entries goes in a call per chunk, oldest first.
    pub fn calls(&self, one_slot: bool) -> Vec<ScriptCall> {
        let field = || self.field.clone();
        let mut chunks = self.sample.chunks(SAMPLE_CHUNK).map(|c| StatsWrite {
            field: field(),
            sample: c.to_vec(),
            ..StatsWrite::default()
        });
        if one_slot {
            let first = StatsWrite {
                field: field(),
                minutes: self.minutes.clone(),
                sample: chunks.next().map(|c| c.sample).unwrap_or_default(),
                last_used: self.last_used.clone(),
            };
            return std::iter::once(first)
                .chain(chunks)
                .map(|w| w.call())
                .collect();
        }
        let minutes = self.minutes.iter().map(|m| StatsWrite {
            field: field(),
            minutes: vec![m.clone()],
            ..StatsWrite::default()
        });
        let last_used = (!self.last_used.is_empty()).then(|| StatsWrite {
            field: field(),
            last_used: self.last_used.clone(),
            ..StatsWrite::default()
        });
        minutes
            .chain(chunks)
            .chain(last_used)
            .map(|w| w.call())
            .collect()
    }

    /// The keys and arguments of one call writing all of it.
    fn call(&self) -> ScriptCall {
        let mut keys: Vec<String> = self.minutes.iter().map(|m| m.key.clone()).collect();
        if !self.sample.is_empty() {
            keys.push(SAMPLE_KEY.into());
        }
        if !self.last_used.is_empty() {
            keys.push(LAST_USED_KEY.into());
        }
        let mut args = vec![
            self.field.clone(),
            MINUTE_TTL_SECS.to_string(),
            SAMPLE_KEEP.to_string(),
            self.minutes.len().to_string(),
            self.sample.len().to_string(),
            self.last_used.len().to_string(),
        ];
        for m in &self.minutes {
            args.push(m.counts.clone());
            args.push(if m.expire { "1" } else { "0" }.into());
        }
        args.extend(self.sample.iter().cloned());
        for (id, secs) in &self.last_used {
            args.push(id.clone());
            args.push(secs.to_string());
        }
        (keys, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::common_slot;

    fn write() -> StatsWrite {
        StatsWrite {
            field: "@ab12".into(),
            minutes: vec![
                MinuteWrite {
                    key: "fg:stats:1".into(),
                    counts: "{}".into(),
                    expire: false,
                },
                MinuteWrite {
                    key: "fg:stats:2".into(),
                    counts: r#"{"minute":{"a":1}}"#.into(),
                    expire: true,
                },
            ],
            sample: vec!["1|k|free|unmatched|allowed".into()],
            last_used: vec![("k".into(), 60)],
        }
    }

    #[test]
    fn one_slot_is_one_call_with_every_key_and_argument_in_the_scripts_order() {
        let calls = write().calls(true);
        assert_eq!(calls.len(), 1);
        let (keys, args) = &calls[0];
        assert_eq!(
            keys,
            &["fg:stats:1", "fg:stats:2", SAMPLE_KEY, LAST_USED_KEY]
        );
        let head = [
            "@ab12",
            &MINUTE_TTL_SECS.to_string(),
            &SAMPLE_KEEP.to_string(),
        ];
        assert_eq!(&args[..3], &head);
        assert_eq!(&args[3..6], &["2", "1", "1"]);
        assert_eq!(
            &args[6..],
            &[
                "{}",
                "0",
                r#"{"minute":{"a":1}}"#,
                "1",
                "1|k|free|unmatched|allowed",
                "k",
                "60"
            ]
        );
    }

    #[test]
    fn a_big_sample_goes_a_chunk_a_call_oldest_first() {
        let mut w = write();
        w.sample = (0..2 * SAMPLE_CHUNK + 5)
            .map(|i| format!("{i}|k|free|unmatched|allowed"))
            .collect();
        for one_slot in [true, false] {
            let calls = w.calls(one_slot);
            let samples: Vec<usize> = calls.iter().map(|(_, a)| a[4].parse().unwrap()).collect();
            assert!(samples.iter().all(|n| *n <= SAMPLE_CHUNK), "{samples:?}");
            let sent: Vec<&String> = calls
                .iter()
                .filter(|(keys, _)| keys.iter().any(|k| k == SAMPLE_KEY))
                .flat_map(|(_, args)| {
                    let (m, s) = (
                        args[3].parse::<usize>().unwrap(),
                        args[4].parse::<usize>().unwrap(),
                    );
                    args[6 + 2 * m..6 + 2 * m + s].iter()
                })
                .collect();
            assert_eq!(
                sent,
                w.sample.iter().collect::<Vec<_>>(),
                "one_slot {one_slot}"
            );
        }
        assert_eq!(w.calls(true).len(), 3, "the first call writes the rest too");
    }

    #[test]
    fn a_cluster_gets_one_call_per_key_each_in_one_slot() {
        let calls = write().calls(false);
        assert_eq!(calls.len(), 4);
        for (keys, args) in &calls {
            assert_eq!(keys.len(), 1);
            assert!(common_slot(keys.iter().map(String::as_str)).is_ok());
            let counts: Vec<usize> = args[3..6].iter().map(|a| a.parse().unwrap()).collect();
            assert_eq!(counts.iter().filter(|c| **c > 0).count(), 1, "{args:?}");
        }
        let empty = StatsWrite::default();
        assert!(empty.is_empty());
        assert_eq!(empty.calls(false), vec![]);
    }
}
