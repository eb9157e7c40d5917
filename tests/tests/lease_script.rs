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

/// Stored state nobody should have written mints nothing: a lease book that does
/// not parse counts as the whole bound (no lease is granted beside it).
#[test]
fn a_corrupt_lease_book_mints_nothing() {
    use floodgate_shared::lease::leases_key;
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
}
