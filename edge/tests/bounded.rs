//! Bounded consistency in the pipeline, against in-memory stores running the
//! scripts' pure twins and a fake clock: warm keys decided without the global
//! store, the overshoot bound across instances, exact policies untouched, regional
//! pools, and what happens when either store is down.

mod common;

use std::sync::atomic::Ordering;

use common::{Gate, T0, advance, head, header, mem, minute_sum, retry_after, seed, settle, status};
use floodgate_edge::deadline::DeadlineSettings;
use floodgate_edge::pipeline::{Pipeline, PipelineConfig};
use floodgate_shared::lease::{LEASE_RETURN, LEASE_TAKE, POOL_TAKE};
use floodgate_shared::time::{FakeClock, Micros};

/// 20 per second (a token every 50 ms); `b` bounded by 8 tokens, `e` exact, `a`
/// automatic.
const CONFIG: &str = r#"{"policies":[
  {"name":"b","dimensions":["api_key"],"quota":{"capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":8},
  {"name":"open","dimensions":["api_key"],"quota":{"capacity":20,"period":"1s"},"failure_mode":"fail_open","consistency":"bounded","max_overshoot":8},
  {"name":"e","dimensions":["api_key","endpoint"],"quota":{"capacity":1000,"period":"1s"},"failure_mode":"fail_closed"},
  {"name":"a","dimensions":["api_key"],"quota":{"capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"auto","max_overshoot":8}],
  "plans":{"bounded":["b"],"soft":["open"],"auto":["a"]},
  "routes":[{"name":"e","pattern":"/v1/exact","policies":["e"]}]}"#;

const T: Micros = 50_000;

fn pipeline(
    store: &'static common::MemStore,
    clock: &'static FakeClock,
) -> Pipeline<&'static common::MemStore, &'static FakeClock> {
    Pipeline::new(store, clock, PipelineConfig::default())
}

fn clock() -> &'static FakeClock {
    Box::leak(Box::new(FakeClock::at(T0)))
}

/// A global store with `auth`'s key and a regional one beside it, on one clock;
/// [`Region::fresh`] is a new instance of the region (a 2 s record cache).
struct Region {
    global: &'static common::MemStore,
    regional: &'static common::MemStore,
    clock: &'static FakeClock,
    auth: String,
}

impl Region {
    fn new() -> Self {
        let (global, regional) = (mem(), mem());
        let auth = seed(global, CONFIG, "bounded");
        *regional.now.lock().unwrap() = T0;
        Self {
            global,
            regional,
            clock: clock(),
            auth,
        }
    }

    fn settings() -> PipelineConfig {
        PipelineConfig {
            cache_ttl: 2_000_000,
            ..PipelineConfig::default()
        }
    }

    fn fresh(&self) -> Pipeline<&'static common::MemStore, &'static FakeClock> {
        Pipeline::new(self.global, self.clock, Self::settings()).with_regional(self.regional)
    }

    /// The global store's record reads so far (GETs and MGETs).
    fn global_reads(&self) -> usize {
        self.global.gets.load(Ordering::SeqCst) + self.global.reads.load(Ordering::SeqCst)
    }
}

fn leases_taken(store: &common::MemStore) -> usize {
    store.runs_of(&LEASE_TAKE)
}

#[tokio::test]
async fn a_warm_bounded_key_is_decided_without_a_global_round_trip() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = clock();
    let p = pipeline(store, clock);
    let mut local = 0;
    for i in 0..200 {
        advance(clock, store, 60_000); // below the refill rate: never throttled
        let checks = store.checks.load(Ordering::SeqCst);
        let g = settle(p.gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}");
        local += usize::from(store.checks.load(Ordering::SeqCst) == checks);
        assert!(header(&g, "X-RateLimit-Remaining").is_some());
    }
    let takes = leases_taken(store);
    assert!(local >= 180, "{local} of 200 decided from leases");
    // leases of half the bound (4 tokens) each
    assert!(takes <= 60, "{takes} lease takes for 200 requests");
    assert_eq!(p.health().leased as usize, local);
}

/// The largest excess over `capacity + (b − a)/T` of the admissions within any
/// window [a, b].
fn worst_excess(admitted: &[Micros], capacity: i64) -> i64 {
    let mut times = admitted.to_vec();
    times.sort_unstable();
    let mut worst = i64::MIN;
    for i in 0..times.len() {
        for j in i..times.len() {
            worst = worst.max((j - i + 1) as i64 - capacity - (times[j] - times[i]) / T);
        }
    }
    worst
}

#[tokio::test]
async fn instances_together_never_admit_more_than_the_bound_above_the_quota() {
    use rand::{Rng, SeedableRng};
    for seed_n in 0..6u64 {
        let store = mem();
        let auth = seed(store, CONFIG, "bounded");
        let clock = clock();
        let instances: Vec<_> = (0..4).map(|_| pipeline(store, clock)).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed_n);
        let mut admitted = vec![];
        let mut now = T0;
        for _ in 0..400 {
            let step = rng.random_range(0..40_000);
            advance(clock, store, step);
            now += step;
            let who = rng.random_range(0..instances.len());
            let d = instances[who].gate(head(&auth)).await;
            // refills land now or a little later (they are in the background)
            let g = if rng.random_bool(0.7) {
                settle(d).await
            } else {
                let g = d.gate.clone();
                for t in d.background {
                    tokio::spawn(t);
                }
                g
            };
            if status(&g) == 200 {
                admitted.push(now);
            }
            tokio::task::yield_now().await;
        }
        let excess = worst_excess(&admitted, 20);
        assert!(
            excess <= 8,
            "seed {seed_n}: {excess} above the quota, bound 8"
        );
        assert!(
            admitted.len() > 100,
            "seed {seed_n}: {} admitted",
            admitted.len()
        );
    }
}

#[tokio::test]
async fn a_request_with_an_exact_policy_is_decided_exactly_every_time() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = clock();
    let p = pipeline(store, clock);
    fn exact(auth: &str) -> floodgate_edge::pipeline::RequestHead<'_> {
        floodgate_edge::pipeline::RequestHead {
            path: "/v1/exact",
            ..head(auth)
        }
    }
    for i in 0..50 {
        advance(clock, store, 60_000);
        let before = store.checks.load(Ordering::SeqCst);
        let g = settle(p.gate(exact(&auth)).await).await;
        assert_eq!(status(&g), 200);
        assert_eq!(
            store.checks.load(Ordering::SeqCst),
            before + 1,
            "request {i}: one exact call"
        );
    }
    assert_eq!(leases_taken(store), 0, "nothing is leased for it");
}

#[tokio::test]
async fn a_denial_comes_from_the_global_bucket_with_an_exact_retry_after() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = clock();
    let p = pipeline(store, clock);
    let mut first_denial = None;
    for i in 0..60 {
        let g = settle(p.gate(head(&auth)).await).await;
        if status(&g) == 429 {
            first_denial = Some((i, retry_after(&g)));
            break;
        }
    }
    let (i, retry) = first_denial.expect("a burst exhausts the bucket");
    // 20 in the bucket, at most 8 more leased ahead
    assert!((20..=28).contains(&i), "denied after {i}");
    assert_eq!(
        retry,
        Some(1),
        "the next token in 50 ms: Retry-After rounds up to 1 s"
    );
    advance(clock, store, 1_000_000);
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
}

#[tokio::test]
async fn auto_turns_bounded_only_for_a_hot_key() {
    let store = mem();
    let auth = seed(store, CONFIG, "auto");
    let clock = clock();
    let settings = PipelineConfig {
        leases: floodgate_edge::pipeline::leases::LeaseSettings {
            hot_per_sec: 10,
            cool_per_sec: 3,
            ..Default::default()
        },
        ..PipelineConfig::default()
    };
    let p = Pipeline::new(store, clock, settings);
    // 2/s: cold, every request exact
    for _ in 0..20 {
        advance(clock, store, 500_000);
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    }
    assert_eq!(p.health().leased, 0);
    // 15/s (within the quota's 20/s): hot, then decided from leases
    for _ in 0..60 {
        advance(clock, store, 66_000);
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    }
    assert!(p.health().leased >= 30, "{:?}", p.health());
    // 1/s: cool again, exact; the lease it held goes back to the global bucket
    let returns = || store.runs_of(&LEASE_RETURN);
    assert_eq!(returns(), 0);
    let leased = p.health().leased;
    for _ in 0..5 {
        advance(clock, store, 1_000_000);
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    }
    assert!(p.health().leased <= leased + 1, "{:?}", p.health());
    let given = returns();
    assert!(
        (1..=2).contains(&given),
        "its live leases given back: {given}"
    );
    // off the books at once: the bound is free for other holders (its tokens are
    // refunded only as far as the bucket still owes them: here, after a second of
    // refill at 20/s, nothing)
    let on_books: usize = store
        .leases
        .lock()
        .unwrap()
        .values()
        .map(|c| c.leases.len())
        .sum();
    assert_eq!(on_books, 0, "no lease left on the books");
    for _ in 0..5 {
        advance(clock, store, 1_000_000);
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    }
    assert_eq!(returns(), given, "nothing more to give back");
}

/// Three instances of a region: a warm key is decided from the sub-leases each
/// drew from the region's pool, in memory; the pool is called ahead, in the
/// background, about once per sub-lease, and only a cold instance waits for it.
#[tokio::test]
async fn a_region_decides_warm_requests_in_memory_from_sub_leases_of_its_pool() {
    let (global, regional) = (mem(), mem());
    // a bound of 40: pool chunks of 10 tokens, sub-leases of up to 5
    let roomy = CONFIG
        .replace(r#""capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":8"#,
            r#""capacity":100,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":40"#);
    assert_ne!(roomy, CONFIG);
    let auth = seed(global, &roomy, "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    // the chunk lifetime this test was sized for (2 s, the default before issue
    // 22's cost work): at 30 s, sub-leases of 10 tokens from chunks of 20 under a
    // bound of 40 kept the third instance waiting more often (41 of 300)
    let settings = PipelineConfig {
        leases: floodgate_edge::pipeline::leases::LeaseSettings {
            pool_lifetime: 2_000_000,
            ..Default::default()
        },
        ..PipelineConfig::default()
    };
    let instances: Vec<_> = (0..3)
        .map(|_| Pipeline::new(global, clock, settings.clone()).with_regional(regional))
        .collect();
    let pool_takes = || regional.runs_of(&POOL_TAKE);
    let mut waited = 0;
    for i in 0..300 {
        advance(clock, global, 60_000);
        *regional.now.lock().unwrap() += 60_000;
        let before = pool_takes();
        let d = instances[i % 3].gate(head(&auth)).await;
        // a pool take made before the answer was one the request waited for
        waited += pool_takes() - before;
        let g = settle(d).await;
        assert_eq!(status(&g), 200, "request {i}");
    }
    let global_calls = global.checks.load(Ordering::SeqCst) + leases_taken(global);
    assert!(
        waited <= 12,
        "{waited} requests waited for the regional store"
    );
    // ~5.5 requests/s per instance: sub-leases of a few tokens, drawn from
    // chunks up to a lifetime old (a sub-lease ends with its chunk), so about one
    // background pool call per two or three requests at this low rate
    assert!(
        pool_takes() <= 150,
        "{} pool takes for 300 requests",
        pool_takes()
    );
    // pool refills of 10 tokens, a chunk living 2 s: ~99 here
    assert!(
        global_calls <= 150,
        "{global_calls} global calls for 300 requests"
    );
}

/// A cold request is decided at the time its records arrived, not when it came
/// in: a key read from a far store (1.5 s here) still sizes its first sub-lease
/// from its own request. (Decided at its arrival, the request was metered more
/// than a second before its pool take, which read a rate of 0: sub-leases of one
/// token, a pool call per request for its first second — what made the Worker's
/// warm-request test in tests/ see 36 regional calls for 60 requests.)
#[tokio::test]
async fn a_cold_request_is_decided_when_its_records_arrived() {
    let (global, regional) = (mem(), mem());
    let roomy = CONFIG.replace(
        r#""capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":8"#,
        r#""capacity":100,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":40"#,
    );
    assert_ne!(roomy, CONFIG);
    let auth = seed(global, &roomy, "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    *global.read_takes.lock().unwrap() = Some((clock, 1_500_000));
    let settings = PipelineConfig {
        deadline: DeadlineSettings::fixed(3_000_000),
        ..PipelineConfig::default()
    };
    let p = Pipeline::new(global, clock, settings).with_regional(regional);
    let pool_takes = || regional.runs_of(&POOL_TAKE);
    // the first request reads its records (1.5 s), then takes from the pool on
    // credit; its refill brings the region a chunk
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    *global.read_takes.lock().unwrap() = None;
    let first = pool_takes();
    // 15 requests in the next second: sub-leases of a few tokens each (one
    // request/s over a first sub-lease's 5 s), not one token per pool call
    for i in 0..15 {
        advance(clock, global, 60_000);
        *regional.now.lock().unwrap() += 60_000;
        assert_eq!(
            status(&settle(p.gate(head(&auth)).await).await),
            200,
            "request {i}"
        );
    }
    let takes = pool_takes() - first;
    // (3 here; 8 when decided at its arrival)
    assert!(takes <= 5, "{takes} pool takes for 15 warm requests");
}

#[tokio::test]
async fn with_the_global_store_down_leased_tokens_serve_then_the_failure_mode_applies() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = clock();
    let p = pipeline(store, clock);
    // warm: a lease at hand (requests at 20/s keep the lease refilled)
    for _ in 0..20 {
        advance(clock, store, 50_000);
        let _ = settle(p.gate(head(&auth)).await).await;
    }
    store.down.store(true, Ordering::SeqCst);
    let mut statuses = vec![];
    for _ in 0..12 {
        advance(clock, store, 10_000);
        statuses.push(status(&settle(p.gate(head(&auth)).await).await));
    }
    let served = statuses.iter().take_while(|s| **s == 200).count();
    assert!(served >= 1, "the lease at hand is spent: {statuses:?}");
    assert!(
        statuses[served..].iter().all(|s| *s == 503),
        "then fail_closed: {statuses:?}"
    );
    assert!(p.health().leased_while_down >= 1);
    // fail_open policies keep admitting, marked
    let store = mem();
    let auth = seed(store, CONFIG, "soft");
    let p = pipeline(store, clock);
    let _ = settle(p.gate(head(&auth)).await).await;
    store.down.store(true, Ordering::SeqCst);
    for _ in 0..10 {
        let g = settle(p.gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200);
    }
}

#[tokio::test]
async fn with_the_regional_store_down_the_exact_global_bucket_decides() {
    let (global, regional) = (mem(), mem());
    let auth = seed(global, CONFIG, "bounded");
    let clock = clock();
    let p = pipeline(global, clock).with_regional(regional);
    regional.down.store(true, Ordering::SeqCst);
    for i in 0..20 {
        advance(clock, global, 60_000);
        let before = global.checks.load(Ordering::SeqCst);
        let g = settle(p.gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}");
        assert_eq!(
            global.checks.load(Ordering::SeqCst),
            before + 1,
            "decided exactly"
        );
    }
}

/// The overshoot bound relies on every lease dying with its global lease: an
/// instance quiet past a lease's lifetime must not spend it, or it would add to the
/// leases others took since (the global store stopped counting it).
#[tokio::test]
async fn a_lease_is_never_spent_after_its_global_lease_expired() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = clock();
    let (a, b) = (pipeline(store, clock), pipeline(store, clock));
    let mut admitted = vec![];
    let mut now = T0;
    let mut at = |g: &Gate, now: Micros| {
        if status(g) == 200 {
            admitted.push(now);
        }
    };
    // A, used at 10/s, holds leases of 4 tokens, then goes quiet
    for _ in 0..10 {
        advance(clock, store, 100_000);
        now += 100_000;
        at(&settle(a.gate(head(&auth)).await).await, now);
    }
    // past A's leases: B, used at 10/s too, leases what the bound allows while the
    // bucket refills
    advance(clock, store, 1_100_000);
    now += 1_100_000;
    for _ in 0..10 {
        advance(clock, store, 100_000);
        now += 100_000;
        at(&settle(b.gate(head(&auth)).await).await, now);
    }
    advance(clock, store, 600_000);
    now += 600_000;
    // in one instant: A's old lease (must be dead), B's leases, the whole bucket
    for _ in 0..40 {
        at(&settle(a.gate(head(&auth)).await).await, now);
        at(&settle(b.gate(head(&auth)).await).await, now);
    }
    let excess = worst_excess(&admitted, 20);
    assert!(excess <= 8, "{excess} above the quota, bound 8");
}

/// Three regions sharing `b`'s bound of 8: 1 token of credit each (8 / (2 × 3)),
/// the global store leasing the other 5.
const REGIONS: &str = r#"{"policies":[
  {"name":"b","dimensions":["api_key"],"quota":{"capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":8}],
  "plans":{"bounded":["b"]}, "regions": 3}"#;

#[tokio::test]
async fn a_region_admits_a_cold_key_on_credit_without_a_global_round_trip() {
    let (global, regional) = (mem(), mem());
    let auth = seed(global, REGIONS, "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    let p = pipeline(global, clock).with_regional(regional);
    // the configuration and the key are cached by a first request, then the key goes
    // cold for longer than any lease lives
    let _ = settle(p.gate(head(&auth)).await).await;
    advance(clock, global, 10_000_000);
    *regional.now.lock().unwrap() += 10_000_000;
    let checks = global.checks.load(Ordering::SeqCst);
    let d = p.gate(head(&auth)).await;
    assert_eq!(status(&d.gate), 200, "admitted on the region's credit");
    assert_eq!(
        global.checks.load(Ordering::SeqCst),
        checks,
        "no global round trip"
    );
    // the refill charges the credit, in the background (beside it, the copy of
    // the records just read to the region)
    assert_eq!(d.background.len(), 2);
    let takes = leases_taken(global);
    let _ = settle(d).await;
    assert_eq!(leases_taken(global), takes + 1);
    assert_eq!(
        regional
            .pools
            .lock()
            .unwrap()
            .values()
            .map(|p| p.credit)
            .sum::<u64>(),
        0,
        "charged"
    );
}

#[tokio::test]
async fn regions_on_credit_and_leases_together_stay_within_the_bound() {
    use rand::{Rng, SeedableRng};
    for seed_n in 0..6u64 {
        let global = mem();
        let auth = seed(global, REGIONS, "bounded");
        let clock = clock();
        let regionals: Vec<_> = (0..3)
            .map(|_| {
                let r = mem();
                *r.now.lock().unwrap() = T0;
                r
            })
            .collect();
        // two instances per region
        let instances: Vec<_> = (0..6)
            .map(|i| pipeline(global, clock).with_regional(regionals[i / 2]))
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed_n);
        let mut admitted = vec![];
        let mut now = T0;
        for _ in 0..400 {
            let step = rng.random_range(0..40_000);
            advance(clock, global, step);
            for r in &regionals {
                *r.now.lock().unwrap() += step;
            }
            now += step;
            let d = instances[rng.random_range(0..instances.len())]
                .gate(head(&auth))
                .await;
            let g = if rng.random_bool(0.6) {
                settle(d).await
            } else {
                let g = d.gate.clone();
                for t in d.background {
                    tokio::spawn(t);
                }
                g
            };
            if status(&g) == 200 {
                admitted.push(now);
            }
            tokio::task::yield_now().await;
        }
        let excess = worst_excess(&admitted, 20);
        assert!(
            excess <= 8,
            "seed {seed_n}: {excess} above the quota, bound 8"
        );
    }
}

/// Each bounded policy's counters reach the stats hashes the dashboard reads:
/// requests decided locally and exactly, refills, and the tokens outstanding at
/// each refill (never more than the leases may hold).
#[tokio::test]
async fn a_bounded_policy_counts_its_local_share_refills_and_outstanding_tokens() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = clock();
    let p = pipeline(store, clock);
    for _ in 0..100 {
        advance(clock, store, 60_000);
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    }
    p.flush_pending().await.unwrap();
    let sum = |field: &str| minute_sum(store, field);
    let (local, exact) = (sum("policy:b|local"), sum("policy:b|exact"));
    let (refills, outstanding) = (sum("policy:b|refills"), sum("policy:b|outstanding"));
    assert_eq!(local + exact, 100, "every request counted once");
    assert_eq!(local, p.health().leased);
    assert_eq!(refills as usize, leases_taken(store), "one per lease take");
    assert!(
        local >= 90 && refills >= 10,
        "{local} local, {refills} refills"
    );
    // the leases hold at most the bound (8) at any refill
    assert!(
        outstanding > 0 && outstanding <= 8 * refills,
        "{outstanding} over {refills} refills"
    );
    assert_eq!(
        sum("policy:e|local") + sum("policy:e|exact"),
        0,
        "exact policies are not counted"
    );
}

/// Issue 39, smell 2: a lease refill claimed by a request whose background
/// tasks never ran (the request dropped before the host spawned them, an
/// evicted isolate) is taken as lost after a while, as record claims are: the
/// key's refills resume. (Before: the claim stayed for good, and every later
/// request of the key on that instance took the exact path.)
#[tokio::test]
async fn a_lost_lease_refill_does_not_stop_the_keys_refills_for_good() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = clock();
    let p = pipeline(store, clock);
    advance(clock, store, 60_000);
    // the first request claims the key's first lease; its tasks never run
    let dropped = p.gate(head(&auth)).await;
    assert!(!dropped.background.is_empty(), "a refill was due");
    drop(dropped);
    assert_eq!(leases_taken(store), 0);
    // 12 s of requests below the quota's rate
    for i in 0..100 {
        advance(clock, store, 120_000);
        let g = settle(p.gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}");
    }
    assert!(
        leases_taken(store) >= 1,
        "the key's refills resumed once the lost claim expired"
    );
    assert!(p.health().leased >= 10, "{:?}", p.health());
}

/// Issue 39: tokens leased under a policy's old terms are not spent once the
/// operator changed them (a raised quota with a lowered bound here): the
/// instance's leases of the bucket go (retired: a shortfall, never an
/// overshoot), and the first request under the new terms is decided by the
/// global store. (Before: the instance spent its old leases, taken under a bound
/// of 8, against a bound of 2.)
#[tokio::test]
async fn leases_taken_under_a_policys_old_terms_are_not_spent_after_it_changed() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = clock();
    let p = pipeline(store, clock);
    for i in 0..40 {
        advance(clock, store, 60_000);
        assert_eq!(
            status(&settle(p.gate(head(&auth)).await).await),
            200,
            "request {i}"
        );
    }
    assert!(p.health().leased >= 20, "{:?}", p.health());
    let changed_config = CONFIG.replace(
        r#""capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":8"#,
        r#""capacity":40,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":2"#,
    );
    assert_ne!(changed_config, CONFIG);
    store.records.lock().unwrap().insert(
        floodgate_shared::config::CONFIG_KEY.into(),
        changed_config.into_bytes(),
    );
    common::changed(store, floodgate_shared::changes::Change::Config);
    // the instance learns of the change (a revision check, then the read)
    let mut seen = false;
    for _ in 0..200 {
        advance(clock, store, 60_000);
        let checks = store.checks.load(Ordering::SeqCst);
        let g = settle(p.gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200);
        if header(&g, "X-RateLimit-Limit") == Some("40") {
            assert_eq!(
                store.checks.load(Ordering::SeqCst),
                checks + 1,
                "the first request under the new terms is decided by the global bucket"
            );
            seen = true;
            break;
        }
    }
    assert!(seen, "the change reached the instance");
}

/// Issue 38: at fan-out, a key an instance holds nothing of and sees seldom is
/// decided by ONE `HINCRBY` of its region's ledger — no pool take, no refill —
/// within the region's share of the bound per settle interval; past it, the
/// increment is taken back and the pool decides. Once per interval one instance
/// of the region charges the ledger to the global bucket in one call.
#[tokio::test]
async fn cold_keys_are_decided_by_their_regions_ledger_and_charged_in_bulk() {
    use floodgate_shared::ledger::{LEDGER_CHARGE, LEDGER_TAKE, SETTLE_EVERY, share};
    let (global, regional) = (mem(), mem());
    // a bound of 320 over one region: a ledger share of 20 per interval
    let config = CONFIG
        .replace(
            r#""capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":8"#,
            r#""capacity":10000,"period":"1m"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":320"#,
        )
        .replace(r#""plans":"#, r#""regions":1,"plans":"#);
    assert_eq!(share(320, 1), 20);
    let auth = seed(global, &config, "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    let instances: Vec<_> = (0..6)
        .map(|_| Pipeline::new(global, clock, PipelineConfig::default()).with_regional(regional))
        .collect();
    let step = |by: Micros| {
        advance(clock, global, by);
        *regional.now.lock().unwrap() += by;
    };
    // one request a second over six instances: every one cold where it lands
    for i in 0..20 {
        step(1_000_000);
        let g = settle(instances[i % 6].gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}");
    }
    assert_eq!(regional.runs_of(&POOL_TAKE), 0, "no pool take");
    assert_eq!(global.runs_of(&LEASE_TAKE), 0, "no refill");
    assert_eq!(
        regional.ledger_incrs.load(Ordering::SeqCst),
        20,
        "one command each"
    );
    // the settlements so far charged what was counted before them, in one call each
    let settled = global.runs_of(&LEDGER_CHARGE);
    assert!((1..=2).contains(&settled), "{settled} settlements in 20 s");
    assert_eq!(regional.runs_of(&LEDGER_TAKE), settled);
    let counted: i64 = regional.ledger.lock().unwrap().values().sum();
    let charged = global.ledger_charged.load(Ordering::SeqCst) as i64;
    assert_eq!(
        charged + counted,
        20,
        "charged {charged} + still counted {counted}"
    );
    assert!(charged >= 9, "{charged} charged");
    // a burst past the share within one interval: the rest go to the pool
    let before = regional.ledger_incrs.load(Ordering::SeqCst);
    for i in 0..30 {
        step(1_000);
        let g = settle(instances[i % 6].gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "burst request {i}");
    }
    assert!(regional.runs_of(&POOL_TAKE) >= 1, "the pool took over");
    let counted: i64 = regional.ledger.lock().unwrap().values().sum();
    assert!(counted <= 20, "{counted} counted: never past the share");
    assert!(regional.ledger_incrs.load(Ordering::SeqCst) > before);
    // nothing admitted at the ledger is lost: charged, or counted to be
    let charged = global.ledger_charged.load(Ordering::SeqCst) as i64;
    assert!(
        charged + counted >= 20,
        "{charged} charged, {counted} counted"
    );
    let _ = SETTLE_EVERY;
}

/// Issue 38: with a regional store, a record an instance misses is read from
/// the region's copy — no global round trip — once another instance of the
/// region read it from the global store; a copy older than a change the
/// region has confirmed since is never served (the global store is read).
#[tokio::test]
async fn a_fresh_instance_reads_the_records_from_its_regions_copy() {
    let r = Region::new();
    let (global, clock, auth) = (r.global, r.clock, &r.auth);
    let first = r.fresh();
    assert_eq!(status(&settle(first.gate(head(auth)).await).await), 200);
    assert!(
        r.global_reads() >= 1,
        "the first instance read the global store"
    );
    // another instance of the region, fresh: the region's copies serve it
    advance(clock, global, 100_000);
    let second = r.fresh();
    let before = r.global_reads();
    let d = second.gate(head(auth)).await;
    assert_eq!(status(&d.gate), 200);
    assert_eq!(
        r.global_reads(),
        before,
        "no global read on the request's path"
    );
    let _ = settle(d).await;
    // an operator's change, confirmed in the region by an instance's revision
    // check: the copies (of the old revision) no longer serve
    edit_key_plan(global, "bounded");
    advance(clock, global, 3_000_000);
    assert_eq!(status(&settle(first.gate(head(auth)).await).await), 200);
    let _ = settle(first.gate(head(auth)).await).await;
    let third = r.fresh();
    let before = r.global_reads();
    let _ = settle(third.gate(head(auth)).await).await;
    assert!(
        r.global_reads() > before,
        "a copy of an older revision is not served"
    );
}

/// Issue 38, the long tail: a fresh instance's first record miss scans the
/// region's copies (one command, as the read of that one copy was) and caches
/// every record the region holds with the confirmed revision, so its next key
/// costs no read at all; a later miss within half a TTL reads its one copy.
#[tokio::test]
async fn a_fresh_instance_caches_every_copy_its_region_holds_at_its_first_miss() {
    let r = Region::new();
    let (global, regional, clock, auth) = (r.global, r.regional, r.clock, &r.auth);
    let other = common::seed_another(global, "bounded");
    let first = r.fresh();
    for a in [auth, &other] {
        assert_eq!(status(&settle(first.gate(head(a)).await).await), 200);
    }
    advance(clock, global, 100_000);
    let reads = || {
        r.global_reads()
            + regional.copy_reads.load(Ordering::SeqCst)
            + regional.copy_scans.load(Ordering::SeqCst)
    };
    let scans = || regional.copy_scans.load(Ordering::SeqCst);
    assert_eq!(
        scans(),
        1,
        "the first instance's first miss scanned (nothing yet)"
    );
    let second = r.fresh();
    let before = reads();
    let d = second.gate(head(auth)).await;
    assert_eq!(status(&d.gate), 200);
    assert_eq!(scans(), 2, "one scan");
    assert_eq!(reads(), before + 1, "the scan was the only read");
    let _ = settle(d).await;
    let before = reads();
    let d = second.gate(head(&other)).await;
    assert_eq!(status(&d.gate), 200);
    assert_eq!(reads(), before, "the other key was cached by the scan");
    let _ = settle(d).await;
    // with prefetch off, the other key is a read of its own
    let off = Pipeline::new(
        global,
        clock,
        PipelineConfig {
            copies_prefetch: 0,
            ..Region::settings()
        },
    )
    .with_regional(regional);
    for a in [auth, &other] {
        let before = reads();
        let d = off.gate(head(a)).await;
        assert_eq!(status(&d.gate), 200);
        assert_eq!(reads(), before + 1, "one copy read per key");
        let _ = settle(d).await;
    }
    assert_eq!(scans(), 2, "no scan with prefetch off");
}

/// Says the seeded key changed (its record rewritten as it is), as the admin
/// code does: the records' revision moves.
fn edit_key_plan(store: &common::MemStore, plan: &str) {
    common::edit_key(store, |r| r.plan = plan.to_string());
}
