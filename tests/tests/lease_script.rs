//! `lua/lease_take.lua` and `lua/lease_return.lua` in real Redis agree step by
//! step with their pure twin (`floodgate_shared::lease::Central`) over random
//! sequences of takes, spends and returns by several instances.

use floodgate_shared::lease::{Central, LEASE_RETURN, LEASE_TAKE, LeaseConfig, Taken};
use floodgate_tests::RedisServer;
use rand::{Rng, SeedableRng};

fn eval(c: &mut redis::Connection, source: &str, keys: &[&str], args: &[String]) -> Vec<i64> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(source).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(a);
    }
    cmd.query(c).expect("script runs")
}

#[test]
fn lease_scripts_match_their_pure_twin() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let cfg = LeaseConfig {
        max_overshoot: 10,
        max_lease: 8,
        lifetime: 3_000_000,
        hot_per_sec: 1,
        cool_per_sec: 0,
    };
    // 1 token per second, capacity 20: simulated time runs far ahead of real time,
    // so no key expires (in real time) before the twin expects it to
    let (t, burst) = (1_000_000i64, 20_000_000i64);
    for seed in 0..4u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let bucket = format!("fg:{{k:parity-{seed}}}:p");
        let leases = floodgate_shared::lease::leases_key(&bucket);
        let mut twin = Central::default();
        let mut held: Vec<Option<(String, u64)>> = vec![None; 3];
        let mut now = 1_700_000_000_000_000i64;
        let (mut takes, mut leased, mut refunds) = (0, 0, 0);
        for step in 0..250 {
            now += rng.random_range(0..1_500_000);
            let who = rng.random_range(0..3);
            if rng.random_bool(0.2) {
                if let Some((member, tokens)) = held[who].take() {
                    let unused = rng.random_range(0..=tokens);
                    let args = vec![
                        now.to_string(),
                        t.to_string(),
                        member.clone(),
                        unused.to_string(),
                    ];
                    let got = eval(&mut c, LEASE_RETURN.source, &[&bucket, &leases], &args);
                    let want = twin.give_back(now, t, &member, unused);
                    assert_eq!(got[0] as u64, want, "seed {seed} step {step}: refund");
                    refunds += u64::from(want > 0);
                }
                continue;
            }
            let cost = rng.random_range(0..3u64);
            let want_tokens = rng.random_range(0..9u64);
            let id = format!("i{who}-{step}");
            let spent = held[who]
                .as_ref()
                .filter(|_| rng.random_bool(0.5))
                .map(|(m, _)| m.clone());
            // sometimes a region charging what it admitted on credit (into debt)
            let forced = rng.random_bool(0.15);
            let mut args = cfg.take_args(
                Some(now),
                burst,
                t,
                cost,
                want_tokens,
                &id,
                spent.as_deref(),
            );
            if forced {
                args.push("1".into());
            }
            let got =
                Taken::from_reply(&eval(&mut c, LEASE_TAKE.source, &[&bucket, &leases], &args))
                    .unwrap();
            let want = twin.take_charging(
                &cfg,
                now,
                burst,
                t,
                cost,
                want_tokens,
                &id,
                spent.as_deref(),
                forced,
            );
            assert_eq!(got, want, "seed {seed} step {step}");
            takes += 1;
            if got.leased > 0 {
                leased += 1;
                held[who] = Some((got.member(&id, t), got.leased));
            } else if spent.is_some() {
                held[who] = None;
            }
            let stored: Option<i64> = redis::cmd("GET").arg(&bucket).query(&mut c).unwrap();
            assert_eq!(
                stored.unwrap_or(0).max(now),
                twin.full_at.max(now),
                "seed {seed} step {step}: full_at"
            );
        }
        // the sequences exercised every path
        assert!(
            takes > 150 && leased > 20 && refunds > 1,
            "{takes} {leased} {refunds}"
        );
    }
}

/// `lua/pool_take.lua` and `lua/pool_add.lua` in real Redis agree step by step
/// with their pure twin (`floodgate_shared::lease::Pool`) over random sequences of
/// chunk additions and takes of one or two buckets (all-or-nothing), sub-leases
/// handed out and reported done, expiries, refill locks and spent members handed
/// to the refiller.
#[test]
fn pool_scripts_match_their_pure_twin() {
    use floodgate_shared::lease::{
        POOL_ADD, POOL_TAKE, Pool, PoolAsk, PoolTaken, pool_key, pool_take_args,
        pool_take_args_ahead,
    };
    let server = RedisServer::start();
    let mut c = server.connection();
    // the lock lives (in real time) longer than the test: only an add releases it
    let (lock_ms, margin) = (600_000u64, 50_000i64);
    for seed in 0..4u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(100 + seed);
        let keys = [
            pool_key(&format!("fg:{{k:pool-{seed}}}:a")),
            pool_key(&format!("fg:{{k:pool-{seed}}}:b")),
        ];
        let mut twins = [Pool::default(), Pool::default()];
        // sub-leases granted and not reported yet, per bucket
        let mut out: [Vec<(String, u64)>; 2] = [vec![], vec![]];
        let mut now = 1_700_000_000_000_000i64;
        let (mut admitted, mut refills, mut id, mut on_credit, mut leased, mut retired) =
            (0, 0, 0u64, 0, 0, 0);
        for step in 0..400 {
            now += rng.random_range(0..300_000);
            if rng.random_bool(0.3) {
                let b = rng.random_range(0..2);
                id += 1;
                let tokens = rng.random_range(0..8u64);
                let life = rng.random_range(0..2_000_000i64);
                // ids as instances make them (`Leases::id`: 20 random bits above a
                // 32-bit counter, up to 16 digits), the base a µs instant: spent
                // chunks of 16-digit ids were dropped instead of retired
                let instance: u64 = rng.random_range(0..1 << 20);
                let member = format!("{}:{tokens}:{now}", (instance << 32) | id);
                let charged = rng.random_range(0..3u64);
                let clear = rng.random_bool(0.5);
                let args = [
                    member.clone(),
                    tokens.to_string(),
                    life.to_string(),
                    charged.to_string(),
                    if clear { "1" } else { "0" }.to_string(),
                    now.to_string(),
                ];
                let got = eval(&mut c, POOL_ADD.source, &[keys[b].as_str()], &args);
                let want = twins[b].add(&member, tokens, life, charged, clear, now);
                assert_eq!(got, [want as i64], "seed {seed} step {step}: add");
                continue;
            }
            let both = rng.random_bool(0.5);
            let first = rng.random_range(0..2);
            let which: Vec<usize> = if both { vec![0, 1] } else { vec![first] };
            let asks: Vec<PoolAsk> = which
                .iter()
                .map(|b| {
                    let n = rng.random_range(0..=out[*b].len());
                    PoolAsk {
                        cost: rng.random_range(0..4),
                        low: rng.random_range(0..6),
                        credit: rng.random_range(0..5),
                        want: rng.random_range(0..6),
                        done: out[*b].drain(..n).collect(),
                    }
                })
                .collect();
            let k: Vec<&str> = which.iter().map(|b| keys[*b].as_str()).collect();
            // half the calls with a horizon (chunks dying within it do not count
            // against the low-water mark), half without (the argument left out)
            let ahead = if rng.random_bool(0.5) {
                rng.random_range(1..1_500_000)
            } else {
                0
            };
            let args = pool_take_args_ahead(now.to_string(), &asks, lock_ms, margin, ahead);
            let reply = eval(&mut c, POOL_TAKE.source, &k, &args);
            let got = PoolTaken::from_reply(&reply, which.len())
                .expect("a well-formed reply")
                .expect("not stale");
            let want = {
                let [a, b] = &mut twins;
                let mut pools: Vec<&mut Pool> = match which.as_slice() {
                    [0, 1] => vec![a, b],
                    [0] => vec![a],
                    _ => vec![b],
                };
                Pool::take_ahead(&mut pools, &asks, now, lock_ms as i64 * 1000, margin, ahead)
            };
            assert_eq!(
                got, want,
                "seed {seed} step {step}: take {asks:?} of {which:?}"
            );
            for (b, parts) in which.iter().zip(&got.leases) {
                leased += parts.len();
                out[*b].extend(parts.iter().map(|p| (p.chunk.clone(), p.tokens)));
            }
            admitted += usize::from(got.admitted);
            refills += got.refill.iter().filter(|r| **r).count();
            retired += got.retire.iter().map(Vec::len).sum::<usize>();
            on_credit += got.unconfirmed.iter().filter(|u| **u > 0).count();
        }
        assert!(
            admitted > 20 && refills > 5 && on_credit > 5 && leased > 10 && retired > 3,
            "seed {seed}: {admitted} admitted, {refills} refills, {on_credit} with credit, {leased} sub-leases, {retired} retired"
        );
    }
    // a stale call spends nothing; malformed arguments get a clear error
    let key = pool_key("fg:{k:stale}:p");
    let add = ["7:5:0", "5", "60000000", "0", "1"].map(String::from);
    assert_eq!(eval(&mut c, POOL_ADD.source, &[key.as_str()], &add), [5]);
    let one = [PoolAsk {
        cost: 1,
        ..PoolAsk::default()
    }];
    let args = pool_take_args("<1".into(), &one, 1000, 0);
    assert_eq!(eval(&mut c, POOL_TAKE.source, &[key.as_str()], &args)[0], 2);
    for bad_cost in ["-1", "1.5", "x"] {
        let mut bad = redis::cmd("EVAL");
        bad.arg(POOL_TAKE.source)
            .arg(1)
            .arg(&key)
            .arg("")
            .arg(bad_cost)
            .arg("0")
            .arg("0")
            .arg("0")
            .arg("")
            .arg("1000")
            .arg("0");
        let e = bad
            .query::<Vec<i64>>(&mut c)
            .expect_err("a bad cost is refused");
        assert!(e.to_string().contains("floodgate:"), "{bad_cost}: {e}");
    }
}

/// A chunk spent out is handed to the refiller to retire at the global store
/// whatever its instance's id: up to 2^52 - 1 (`Leases::id`, 16 digits). Ids of
/// 16 digits were dropped from the reply, so the chunk held its share of the
/// bound until it died: in `scripts/bench cost` a region's busiest key then asked
/// the global store again and again for chunks it could not grant (41 of its 50
/// refills in one run granted nothing).
#[test]
fn a_spent_chunk_of_any_instance_id_is_retired() {
    use floodgate_shared::lease::{
        POOL_ADD, POOL_TAKE, PoolAsk, PoolTaken, pool_key, pool_take_args,
    };
    let server = RedisServer::start();
    let mut c = server.connection();
    let now = 1_796_174_575_274_957i64;
    for id in [213_395_450_101_761u64, 1_944_808_436_269_057, (1 << 52) - 1] {
        let key = pool_key(&format!("fg:{{k:retire-{id}}}:p"));
        let member = format!("{id}:5:{now}");
        let add = [member.as_str(), "5", "60000000", "0", "1", &now.to_string()].map(String::from);
        assert_eq!(eval(&mut c, POOL_ADD.source, &[key.as_str()], &add), [5]);
        let take = |c: &mut redis::Connection, at: i64, cost: u64, low: u64| {
            let ask = [PoolAsk {
                cost,
                low,
                ..PoolAsk::default()
            }];
            let reply = eval(
                c,
                POOL_TAKE.source,
                &[key.as_str()],
                &pool_take_args(at.to_string(), &ask, 1000, 0),
            );
            PoolTaken::from_reply(&reply, 1).unwrap().unwrap()
        };
        // the request spends the chunk out; no refill asked for (low 0)
        let spent = take(&mut c, now + 1, 5, 0);
        assert!(spent.admitted && !spent.refill[0], "{id}: {spent:?}");
        // the next call below the low-water mark refills, and retires it
        let refill = take(&mut c, now + 2, 0, 1);
        assert!(refill.refill[0], "{id}: {refill:?}");
        assert_eq!(refill.retire[0], [member], "{id}: handed to the refiller");
    }
}

/// Stored state nobody should have written mints nothing: a lease book that does
/// not parse counts as the whole bound (no lease is granted beside it), a corrupt
/// pool or one of another type as empty with all credit in use (nothing admitted
/// on credit), and the pool's refill rewrites it.
#[test]
fn corrupt_lease_and_credit_state_mints_nothing() {
    use floodgate_shared::lease::{
        POOL_ADD, POOL_TAKE, PoolAsk, PoolTaken, leases_key, pool_key, pool_take_args,
    };
    let server = RedisServer::start();
    let mut c = server.connection();
    let cfg = LeaseConfig {
        max_overshoot: 10,
        max_lease: 8,
        lifetime: 3_000_000,
        hot_per_sec: 1,
        cool_per_sec: 0,
    };
    let (t, burst) = (1_000_000i64, 20_000_000i64);
    let now = 1_700_000_000_000_000i64;
    let take = |c: &mut redis::Connection, bucket: &str| {
        let args = cfg.take_args(Some(now), burst, t, 1, 8, "1", None);
        let book = leases_key(bucket);
        Taken::from_reply(&eval(c, LEASE_TAKE.source, &[bucket, &book], &args)).unwrap()
    };
    // a sound bucket leases
    assert_eq!(take(&mut c, "fg:{k:sound}:p").leased, 8);
    for entry in [
        "garbage",
        "x:99999999999999999999:0@1",
        "7",
        "1:3:0@notanumber",
    ] {
        let bucket = format!("fg:{{k:corrupt-{entry}}}:p");
        let _: () = redis::cmd("SET")
            .arg(leases_key(&bucket))
            .arg(entry)
            .query(&mut c)
            .unwrap();
        let got = take(&mut c, &bucket);
        assert_eq!((got.admitted, got.leased), (true, 0), "{entry}");
    }
    // a corrupt pool: nothing admitted on credit, nothing leased...
    let ask = [PoolAsk {
        cost: 1,
        credit: 5,
        want: 3,
        ..PoolAsk::default()
    }];
    for stored in ["garbage", "3:9|0||", "5:5|0|1:5:0=5,0,x|"] {
        let key = pool_key(&format!("fg:{{k:credit-{stored}}}:p"));
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(stored)
            .query(&mut c)
            .unwrap();
        let args = pool_take_args(now.to_string(), &ask, 1000, 0);
        let got = PoolTaken::from_reply(&eval(&mut c, POOL_TAKE.source, &[key.as_str()], &args), 1)
            .unwrap()
            .unwrap();
        assert!(!got.admitted, "{stored}: admitted on corrupt state");
        assert!(
            got.leases[0].is_empty(),
            "{stored}: leased from corrupt state"
        );
        assert!(got.refill[0], "{stored}: the refill lock is handed out");
        // ...until its refill rewrites it
        let add = ["1:2:0", "2", "60000000", "0", "1", &now.to_string()].map(String::from);
        assert_eq!(eval(&mut c, POOL_ADD.source, &[key.as_str()], &add), [2]);
    }
    // a pool of another type is no pool (a new one): nothing to lease, the
    // region's credit at most
    let key = pool_key("fg:{k:credit-hash}:p");
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("a")
        .arg("1")
        .query(&mut c)
        .unwrap();
    let args = pool_take_args(now.to_string(), &ask, 1000, 0);
    let e = redis::cmd("EVAL")
        .arg(POOL_TAKE.source)
        .arg(1)
        .arg(&key)
        .arg(&args)
        .query::<Vec<i64>>(&mut c);
    let got = PoolTaken::from_reply(&e.unwrap(), 1).unwrap().unwrap();
    assert!(got.leases[0].is_empty() && got.left == [0]);
    assert_eq!(
        got.unconfirmed,
        [1],
        "one request on credit, within the cap"
    );
}
