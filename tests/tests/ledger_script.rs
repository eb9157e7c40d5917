//! The regional ledger's scripts (`lua/ledger_*.lua`, issue 38) on a real
//! redis-server against their pure twins (`floodgate_shared::ledger`): a charge
//! moves each bucket as `charged` says, into debt if need be, in one call; a
//! ledger is taken for its settlement (renamed: edges count in a new one), a
//! settlement left half done is taken again, and a done settlement blocks the
//! buckets in debt; malformed arguments get a clear error and change nothing.

use floodgate_shared::ledger::{
    BLOCKED, Field, LEDGER_CHARGE, LEDGER_DONE, LEDGER_KEY, LEDGER_TAKE, SETTLING_KEY, charged,
    count_of, in_debt,
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
        let reply: Vec<i64> = eval(&mut c, LEDGER_CHARGE.source, &refs, &args).unwrap();
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

#[test]
fn a_ledger_is_taken_settled_and_its_debtors_blocked() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let field = |b: &str| {
        Field {
            bucket: b.into(),
            emission: 1_000,
            burst: 10_000,
        }
        .encode()
    };
    let keys = [LEDGER_KEY, SETTLING_KEY];
    // nothing counted: nothing to settle
    let empty: Vec<String> = eval(&mut c, LEDGER_TAKE.source, &keys, &[]).unwrap();
    assert!(empty.is_empty());
    for (b, n) in [("a", 3), ("b", 1)] {
        let _: i64 = redis::cmd("HINCRBY")
            .arg(LEDGER_KEY)
            .arg(field(b))
            .arg(n)
            .query(&mut c)
            .unwrap();
    }
    let taken: Vec<String> = eval(&mut c, LEDGER_TAKE.source, &keys, &[]).unwrap();
    assert_eq!(taken.len(), 4);
    // edges count in a new ledger meanwhile
    let _: i64 = redis::cmd("HINCRBY")
        .arg(LEDGER_KEY)
        .arg(field("a"))
        .arg(1)
        .query(&mut c)
        .unwrap();
    // a settler that died: the next one takes the same settlement again
    let again: Vec<String> = eval(&mut c, LEDGER_TAKE.source, &keys, &[]).unwrap();
    assert_eq!(again, taken);
    let args = vec![BLOCKED.to_string(), field("a")];
    let blocked: i64 = eval(&mut c, LEDGER_DONE.source, &keys, &args).unwrap();
    assert_eq!(blocked, 1);
    let exists: i64 = redis::cmd("EXISTS")
        .arg(SETTLING_KEY)
        .query(&mut c)
        .unwrap();
    assert_eq!(exists, 0, "the settled ledger is dropped");
    let a: i64 = redis::cmd("HGET")
        .arg(LEDGER_KEY)
        .arg(field("a"))
        .query(&mut c)
        .unwrap();
    assert_eq!(count_of(a), (1, true), "blocked, the new count kept");
    assert!(in_debt(charged(None, 0, 1_000, 11), 0, 10_000));
}

#[test]
fn malformed_ledger_calls_get_a_clear_error_and_change_nothing() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let k = unique_key("m");
    let bad: [&[String]; 4] = [
        &[],
        &["x".into(), "1".into(), "1".into(), "1".into()],
        &["".into(), "0".into(), "1".into(), "1".into()],
        &["".into(), "1".into(), "1".into(), "-1".into()],
    ];
    for args in bad {
        let e = eval::<Vec<i64>>(&mut c, LEDGER_CHARGE.source, &[&k], args).unwrap_err();
        assert!(e.to_string().contains("floodgate:"), "{args:?}: {e}");
    }
    let exists: i64 = redis::cmd("EXISTS").arg(&k).query(&mut c).unwrap();
    assert_eq!(exists, 0);
    let e = eval::<i64>(&mut c, LEDGER_DONE.source, &[LEDGER_KEY, SETTLING_KEY], &[]).unwrap_err();
    assert!(e.to_string().contains("floodgate:"), "{e}");
}
