//! The regional tally's scripts (`lua/tally_*.lua`, issue 38) on a real
//! redis-server against their pure twin (`floodgate_shared::tally::RegionTally`),
//! step by step: random increments, takes of finished slots (a pending
//! settlement taken again), settlements done with carries, uncarries and
//! blocks, and chunks added before and after their deadline leave the same
//! slots, settling slot and carry, with the same replies; a charge moves each
//! bucket as `charged` says, into debt if need be, in one call; malformed
//! arguments get a clear error and change nothing.

use std::collections::{BTreeMap, BTreeSet};

use floodgate_shared::tally::{
    BLOCKED, CARRY_KEY, Field, RegionTally, SETTLING_KEY, TALLY_ADD, TALLY_CHARGE, TALLY_DONE,
    TALLY_TAKE, Taken, charged, done_args, settle, slot_key,
};
use floodgate_tests::{RedisServer, unique_key};
use rand::{Rng, SeedableRng};

fn eval<T: redis::FromRedisValue>(
    c: &mut redis::Connection,
    source: &str,
    keys: &[&str],
    args: &[String],
) -> redis::RedisResult<T> {
    redis::cmd("EVAL")
        .arg(source)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query(c)
}

fn field(i: usize) -> String {
    Field {
        bucket: format!("fg:{{k:{i}}}:p"),
        emission: 1_000 * (i as i64 + 1),
        burst: 60_000_000,
        carry: (i % 3) as u64 * 4,
    }
    .encode()
}

/// Every hash the tally uses, as Redis holds it.
fn redis_state(c: &mut redis::Connection) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for key in [
        slot_key(0),
        slot_key(1),
        slot_key(2),
        SETTLING_KEY.into(),
        CARRY_KEY.into(),
    ] {
        let h: BTreeMap<String, String> = redis::cmd("HGETALL").arg(&key).query(c).unwrap();
        if !h.is_empty() {
            out.insert(key, h);
        }
    }
    out
}

/// The same, as the twin holds it (a zero count is still a field, as in Redis).
fn twin_state(t: &RegionTally) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = t
        .slots
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(k, h)| {
            let h = h.iter().map(|(f, n)| (f.clone(), n.to_string())).collect();
            (k.clone(), h)
        })
        .collect();
    if !t.carry.is_empty() {
        let carry = t.carry.iter().map(|(f, n)| (f.clone(), n.to_string()));
        out.insert(CARRY_KEY.into(), carry.collect());
    }
    out
}

/// A take's entries as a set (HGETALL's order is Redis' own).
fn entries(reply: &[Vec<u8>]) -> (Vec<u8>, BTreeSet<Vec<Vec<u8>>>) {
    let set = reply[1..].chunks(3).map(|c| c.to_vec()).collect();
    (reply[0].clone(), set)
}

/// 400 random steps on one region's tally, the script and the twin side by
/// side, compared after each.
#[test]
fn the_scripts_and_the_twin_agree_step_by_step() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let mut twin = RegionTally::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(38);
    let now: i64 = 1_764_000_000_000_000;
    for step in 0..400 {
        let slot = slot_key(rng.random_range(0..3));
        match rng.random_range(0..10) {
            0..=5 => {
                let f = field(rng.random_range(0..6));
                let by: i64 = rng.random_range(-5..12);
                let got: i64 = redis::cmd("HINCRBY")
                    .arg(&slot)
                    .arg(&f)
                    .arg(by)
                    .query(&mut c)
                    .unwrap();
                assert_eq!(got, twin.incr(&slot, &f, by), "step {step}");
            }
            6 | 7 => {
                let keys = [slot.as_str(), SETTLING_KEY, CARRY_KEY];
                let reply: Vec<Vec<u8>> = eval(&mut c, TALLY_TAKE.source, &keys, &[]).unwrap();
                let expected = twin.take(&slot);
                assert_eq!(entries(&reply), entries(&expected), "step {step}");
                let Some(taken) = Taken::from_reply(&reply).unwrap() else {
                    continue;
                };
                if rng.random_bool(0.2) {
                    continue; // the settler dies: the slot stays settling
                }
                let sweep = rng.random_bool(0.1);
                let plan = settle(&taken, sweep);
                let blocked: Vec<String> = plan
                    .charges
                    .iter()
                    .filter(|_| rng.random_bool(0.3))
                    .map(|(e, _)| e.raw.clone())
                    .collect();
                let args = done_args(&plan, &blocked, sweep);
                let others = [slot_key(1), slot_key(2)];
                let keys = [SETTLING_KEY, CARRY_KEY, &others[0], &others[1]];
                let n: i64 = eval(&mut c, TALLY_DONE.source, &keys, &args).unwrap();
                assert_eq!(n as usize, blocked.len());
                twin.done([&others[0], &others[1]], &args).unwrap();
            }
            _ => {
                let f = field(rng.random_range(0..6));
                let tokens: u64 = rng.random_range(1..40);
                let (t, until) = (now + step, now + rng.random_range(0..800));
                let args = [format!("<{until}"), f.clone(), tokens.to_string()];
                let got: Option<i64> = eval(&mut c, TALLY_ADD.source, &[&slot], &args).unwrap();
                // the script reads Redis' clock, far past `until` here, or an
                // instant given: decided by the twin at the same instant
                let twin_added = twin.add(&slot, &f, tokens, t, until);
                assert_eq!(got, None, "Redis' clock is past {until}: nothing added");
                if twin_added {
                    // redo it at an instant before the deadline, on both sides
                    let args = [t.to_string(), f.clone(), tokens.to_string()];
                    let got: Option<i64> = eval(&mut c, TALLY_ADD.source, &[&slot], &args).unwrap();
                    assert_eq!(got, twin.slots[&slot].get(&f).copied(), "step {step}");
                }
            }
        }
        assert_eq!(redis_state(&mut c), twin_state(&twin), "step {step}");
    }
}

#[test]
fn a_block_is_added_to_both_other_slots_and_a_blocked_count_is_charged_without_it() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let f = field(0);
    let _: i64 = redis::cmd("HINCRBY")
        .arg(slot_key(0))
        .arg(&f)
        .arg(7)
        .query(&mut c)
        .unwrap();
    let keys = [slot_key(0), SETTLING_KEY.into(), CARRY_KEY.into()];
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let reply: Vec<Vec<u8>> = eval(&mut c, TALLY_TAKE.source, &keys, &[]).unwrap();
    let taken = Taken::from_reply(&reply).unwrap().unwrap();
    let plan = settle(&taken, false);
    assert_eq!(plan.charges[0].1, 7);
    let args = done_args(&plan, std::slice::from_ref(&f), false);
    let others = [slot_key(1), slot_key(2)];
    let keys = [SETTLING_KEY, CARRY_KEY, &others[0], &others[1]];
    let _: i64 = eval(&mut c, TALLY_DONE.source, &keys, &args).unwrap();
    for slot in &others {
        let n: i64 = redis::cmd("HGET").arg(slot).arg(&f).query(&mut c).unwrap();
        assert_eq!(n, BLOCKED);
    }
    let gone: bool = redis::cmd("EXISTS")
        .arg(SETTLING_KEY)
        .query(&mut c)
        .unwrap();
    assert!(!gone);
    // the next epoch counts on top of the block: taken back, charged without it
    let n: i64 = redis::cmd("HINCRBY")
        .arg(&others[0])
        .arg(&f)
        .arg(2)
        .query(&mut c)
        .unwrap();
    assert_eq!(n, BLOCKED + 2);
    let keys = [others[0].as_str(), SETTLING_KEY, CARRY_KEY];
    let reply: Vec<Vec<u8>> = eval(&mut c, TALLY_TAKE.source, &keys, &[]).unwrap();
    let plan = settle(&Taken::from_reply(&reply).unwrap().unwrap(), false);
    assert_eq!(plan.charges[0].1, 2);
    assert_eq!(plan.were_blocked, [f]);
}

#[test]
fn malformed_arguments_get_a_clear_error_and_change_nothing() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let f = field(0);
    let _: i64 = redis::cmd("HINCRBY")
        .arg(SETTLING_KEY)
        .arg(&f)
        .arg(3)
        .query(&mut c)
        .unwrap();
    let before = redis_state(&mut c);
    let others = [slot_key(1), slot_key(2)];
    let done_keys = [SETTLING_KEY, CARRY_KEY, &others[0], &others[1]];
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    for bad in [
        s(&[]),
        s(&["x", "0", "0", "0", "0"]),
        s(&["5", "2", "0", "0", "0"]),
        s(&["5", "0", "1", "f"]),
        s(&["5", "0", "1", "f", "-3", "0", "0"]),
        s(&["5", "0", "0", "0", "0", "extra"]),
    ] {
        let e = eval::<i64>(&mut c, TALLY_DONE.source, &done_keys, &bad).unwrap_err();
        assert!(e.to_string().contains("floodgate"), "{bad:?}: {e}");
    }
    for bad in [
        s(&["", &f, "0"]),
        s(&["", &f, "x"]),
        s(&["bad", &f, "1"]),
        s(&["", "", "1"]),
        s(&["", &f]),
    ] {
        let e = eval::<i64>(&mut c, TALLY_ADD.source, &[SETTLING_KEY], &bad).unwrap_err();
        assert!(e.to_string().contains("floodgate"), "{bad:?}: {e}");
    }
    let e = eval::<i64>(&mut c, TALLY_TAKE.source, &[SETTLING_KEY], &[]).unwrap_err();
    assert!(e.to_string().contains("floodgate"), "{e}");
    assert_eq!(redis_state(&mut c), before, "nothing changed");
}

/// 200 random charges of 1-5 buckets in any state (absent, full, in debt,
/// garbage) at a given instant: the script's full_at of each is the twin's,
/// and the stored value is it.
#[test]
fn a_charge_moves_each_bucket_as_its_twin_says() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let mut rng = rand::rngs::StdRng::seed_from_u64(38);
    let now: i64 = 1_764_000_000_000_000;
    for case in 0..200 {
        let n = rng.random_range(1..=5usize);
        let keys: Vec<String> = (0..n)
            .map(|i| unique_key(&format!("b{case}-{i}")))
            .collect();
        let mut args = vec![now.to_string()];
        let mut expected = vec![];
        for k in &keys {
            let t: i64 = rng.random_range(1..100_000);
            let burst = t * rng.random_range(1..50);
            let count: u64 = rng.random_range(0..20);
            let state = match rng.random_range(0..4) {
                0 => None,
                1 => Some("garbage".to_string()),
                _ => Some((now - burst + rng.random_range(0..3 * burst)).to_string()),
            };
            if let Some(s) = &state {
                let _: () = redis::cmd("SET").arg(k).arg(s).query(&mut c).unwrap();
            }
            let before = state.and_then(|s| s.parse::<i64>().ok());
            let after = if count > 0 {
                charged(before, now, t, count)
            } else {
                before.unwrap_or(0)
            };
            expected.push(after);
            args.extend([t.to_string(), burst.to_string(), count.to_string()]);
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply: Vec<i64> = eval(&mut c, TALLY_CHARGE.source, &refs, &args).unwrap();
        assert_eq!(reply[0], now, "case {case}");
        assert_eq!(&reply[1..], &expected[..], "case {case}");
        for (k, (e, i)) in keys.iter().zip(expected.iter().zip(0..)) {
            let count: u64 = args[3 + 3 * i].parse().unwrap();
            if count > 0 {
                let stored: String = redis::cmd("GET").arg(k).query(&mut c).unwrap();
                assert_eq!(stored, e.to_string(), "case {case}");
            }
        }
    }
}
