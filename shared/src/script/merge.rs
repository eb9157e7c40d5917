//! Identical concurrent token-bucket calls as ONE script call.
//!
//! A busy key's requests, deciding the same buckets at the same cost, reach the
//! edge's store together; `lua/token_bucket.lua` decides N of them one after
//! another at one instant when its clock argument ends in `xN`. At one instant
//! nothing refills and a denial consumes nothing, so the first k fit and the rest
//! do not — what N single calls at that instant would have answered. [`split`]
//! gives back those N replies, so nothing above the store sees a merge: the
//! bill (one `EVALSHA`, one `TIME`, one `MGET`, one `SET` per bucket) and the
//! server's work are those of one request.

use super::ProtocolError;

/// The most calls one merged call stands for (the script's bound).
pub const MAX_MERGED: usize = 1000;

/// A clock argument (`ARGV[1]`) that can stand for several calls: Redis' `TIME`
/// (`""`), or `TIME` until a stale guard (`"<T"`). Explicit instants (tests,
/// replays) do not merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedClock {
    Time,
    Until(u64),
}

impl SharedClock {
    /// The clock `arg` says, if it is one that merges.
    pub fn parse(arg: &str) -> Option<Self> {
        match arg {
            "" => Some(Self::Time),
            a => a.strip_prefix('<')?.parse().ok().map(Self::Until),
        }
    }

    /// The clock of one call standing for both: the earliest guard (the first
    /// caller to give up bounds them all). `None`: not the same form.
    pub fn with(self, other: Self) -> Option<Self> {
        match (self, other) {
            (Self::Time, Self::Time) => Some(Self::Time),
            (Self::Until(a), Self::Until(b)) => Some(Self::Until(a.min(b))),
            _ => None,
        }
    }

    /// The argument of a call standing for `count` requests (`count` ≥ 2).
    pub fn counted(self, count: usize) -> String {
        match self {
            Self::Time => format!("x{count}"),
            Self::Until(t) => format!("<{t}x{count}"),
        }
    }
}

/// How many requests a clock argument stands for (1 unless it ends in `xN`).
fn count_of(clock: &str) -> usize {
    clock
        .rsplit_once('x')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1)
}

/// The replies of the single calls a merged call stood for, from its number of
/// keys, its `ARGV` (as `token_bucket_args` wrote them, the clock
/// [`SharedClock::counted`]) and its reply.
pub fn split_call(
    keys: usize,
    args: &[String],
    reply: &[i64],
) -> Result<Vec<Vec<i64>>, ProtocolError> {
    let count = count_of(args.first().map_or("", String::as_str));
    let costs = args
        .iter()
        .skip(2)
        .step_by(2)
        .map(|c| c.parse())
        .collect::<Result<Vec<i64>, _>>()
        .map_err(|_| ProtocolError(format!("merged call's costs: {args:?}")))?;
    split(reply, &costs, keys == costs.len() + 1, count)
}

/// The replies `count` single calls would have had, from the merged call's reply
/// (`{k, now, full_at_1.., [rev]}`, or `{-1, now}` when stale). `costs`: each
/// bucket's cost argument (µs); `with_rev`: the call read the revision key too.
pub fn split(
    reply: &[i64],
    costs: &[i64],
    with_rev: bool,
    count: usize,
) -> Result<Vec<Vec<i64>>, ProtocolError> {
    let bad = || ProtocolError(format!("merged reply of {count} calls: {reply:?}"));
    if let [-1, now] = reply {
        return Ok(vec![vec![2, *now]; count]);
    }
    let n = costs.len();
    if reply.len() != 2 + n + usize::from(with_rev) {
        return Err(bad());
    }
    let (k, now) = (reply[0], reply[1]);
    let k = usize::try_from(k)
        .ok()
        .filter(|k| *k <= count)
        .ok_or_else(bad)?;
    let read = &reply[2..2 + n];
    Ok((0..count)
        .map(|j| {
            // the j-th call read the state the min(j, k) admitted before it wrote
            let before = j.min(k) as i64;
            let mut one = Vec::with_capacity(reply.len());
            one.push(i64::from(j < k));
            one.push(now);
            one.extend(read.iter().zip(costs).map(|(&full_at, &cost)| {
                if before == 0 || cost == 0 {
                    full_at
                } else {
                    full_at.max(now) + before * cost
                }
            }));
            if with_rev {
                one.push(reply[reply.len() - 1]);
            }
            one
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{BucketState, decide};
    use crate::policy::Quota;
    use proptest::prelude::*;

    #[test]
    fn clocks_merge_to_the_earliest_guard_or_redis_time() {
        let parse = |a| SharedClock::parse(a).unwrap();
        assert_eq!(parse("").with(parse("")), Some(SharedClock::Time));
        let guards = parse("<30")
            .with(parse("<12"))
            .and_then(|c| c.with(parse("<40")));
        assert_eq!(guards, Some(SharedClock::Until(12)));
        assert_eq!(parse("").with(parse("<12")), None, "mixed forms");
        assert_eq!(SharedClock::parse("123"), None, "explicit instants");
        assert_eq!(SharedClock::parse("<x"), None);
        assert_eq!(SharedClock::Until(12).counted(3), "<12x3");
        assert_eq!(SharedClock::Time.counted(40), "x40");
        assert_eq!(count_of(&SharedClock::Until(12).counted(3)), 3);
        assert_eq!(count_of(&SharedClock::Time.counted(40)), 40);
        assert_eq!(count_of("<12"), 1);
    }

    #[test]
    fn a_call_splits_by_its_own_arguments() {
        // two buckets and the revision key; two requests, the first fits
        let args: Vec<String> = ["<9x2", "60", "5", "60", "0"].map(String::from).to_vec();
        let replies = split_call(3, &args, &[1, 9, 0, 4, 7]).unwrap();
        assert_eq!(replies, vec![vec![1, 9, 0, 4, 7], vec![0, 9, 14, 4, 7]]);
        let bad: Vec<String> = ["x2", "60", "five"].map(String::from).to_vec();
        assert!(split_call(1, &bad, &[0, 9, 0]).is_err());
    }

    #[test]
    fn a_stale_merged_call_is_stale_for_each() {
        assert_eq!(split(&[-1, 9], &[5], true, 2).unwrap(), vec![vec![2, 9]; 2]);
        assert!(split(&[3, 9, 0], &[5], false, 2).is_err(), "k > count");
        assert!(split(&[1, 9], &[5], false, 2).is_err(), "no state");
    }

    proptest! {
        /// The split replies are those of single calls decided one after another
        /// at one instant, by the script's pure twin: the first k admitted, each
        /// reading the state its predecessors wrote.
        #[test]
        fn split_replies_are_sequential_single_decisions(
            capacity in 1u64..50, period_s in 1i64..120, cost in 0u32..5,
            fullness in 0i64..300, count in 2usize..40, now in 1_000_000i64..2_000_000,
        ) {
            let quota = Quota::new(capacity, capacity, period_s * 1_000_000).unwrap();
            let (burst, cost_w) = (quota.burst_window(), quota.cost_window(cost));
            // from a full bucket to one in debt beyond its capacity (a lowered quota)
            let start = (now - burst + burst * fullness / 100).max(0);
            // the script's merged answer, by its formula
            let base = start.max(now) - now;
            let fit = if cost_w > 0 {
                usize::try_from(((burst - base) as f64 / cost_w as f64).floor().max(0.0) as i64).unwrap()
            } else if base > burst { 0 } else { count };
            let k = fit.min(count);
            let replies = split(&[k as i64, now, start], &[cost_w], false, count).unwrap();
            prop_assert_eq!(replies.len(), count);
            // the twin, call by call
            let mut state = BucketState { full_at: start };
            for (j, r) in replies.iter().enumerate() {
                prop_assert_eq!(r[1], now);
                prop_assert_eq!(r[2], state.full_at, "call {} read", j);
                let t = decide(Some(state), &quota, now, cost);
                prop_assert_eq!(r[0] == 1, t.decision.allowed(), "call {} admitted", j);
                state = t.write.unwrap_or(state);
            }
        }
    }
}
