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

/// The clock argument (`ARGV[1]`) of one call standing for calls with these
/// clocks: Redis' `TIME` for all (`""`), or `TIME` until the earliest of their
/// stale guards (`"<T"`: the first caller to give up bounds them all). `None`:
/// not mergeable (explicit instants, mixed forms, none).
pub fn merged_clock<'a>(clocks: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut earliest: Option<Option<u64>> = None;
    for clock in clocks {
        let this = match clock {
            "" => None,
            c => Some(c.strip_prefix('<')?.parse::<u64>().ok()?),
        };
        earliest = Some(match (earliest, this) {
            (None, this) => this,
            (Some(None), None) => None,
            (Some(Some(a)), Some(b)) => Some(a.min(b)),
            _ => return None,
        });
    }
    Some(match earliest? {
        None => String::new(),
        Some(t) => format!("<{t}"),
    })
}

/// `clock` for `count` identical requests (`count` ≥ 2).
pub fn counted(clock: &str, count: usize) -> String {
    format!("{clock}x{count}")
}

/// How many requests a clock argument stands for (1 unless it ends in `xN`).
pub fn count_of(clock: &str) -> usize {
    clock
        .rsplit_once('x')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1)
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
        assert_eq!(merged_clock(["", ""]), Some(String::new()));
        assert_eq!(merged_clock(["<30", "<12", "<40"]), Some("<12".into()));
        assert_eq!(merged_clock(["", "<12"]), None, "mixed forms");
        assert_eq!(merged_clock(["123", "123"]), None, "explicit instants");
        assert_eq!(merged_clock(["<x"]), None);
        assert_eq!(merged_clock([]), None);
        assert_eq!(counted("<12", 3), "<12x3");
        assert_eq!(count_of(&counted("<12", 3)), 3);
        assert_eq!(count_of(&counted("", 40)), 40);
        assert_eq!(count_of("<12"), 1);
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
