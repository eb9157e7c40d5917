//! Bounded consistency in the pipeline, against in-memory stores running the
//! scripts' pure twins and a fake clock: warm keys decided without the global
//! store, the overshoot bound across instances, exact policies untouched, regional
//! tallies, and what happens when either store is down.

mod common;

use std::sync::atomic::Ordering;

use common::{Gate, T0, advance, head, header, mem, minute_sum, retry_after, seed, settle, status};
use floodgate_edge::deadline::DeadlineSettings;
use floodgate_edge::pipeline::{Pipeline, PipelineConfig};
use floodgate_shared::lease::{LEASE_RETURN, LEASE_TAKE};
use floodgate_shared::tally::{TALLY_ADD, TALLY_CHARGE, TALLY_TAKE};
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

/// `b` at 100/s (a burst of 400) with a bound of 400 over one region: a credit of 20 per epoch,
/// chunks of 50, draws of up to 5.
fn roomy() -> String {
    let roomy = CONFIG
        .replace(r#""capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":8"#,
            r#""capacity":400,"refill":100,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":400"#)
        .replace(r#""plans":"#, r#""regions":1,"plans":"#);
    assert_ne!(roomy, CONFIG);
    roomy
}

/// Moves the clock and both stores' clocks.
fn step(clock: &FakeClock, global: &common::MemStore, regional: &common::MemStore, by: Micros) {
    advance(clock, global, by);
    *regional.now.lock().unwrap() += by;
}

/// Three instances of a region: a warm key is decided in memory from what each
/// instance drew with its last count at the region, about one regional command
/// per few requests; past the region's credit in an epoch the slot is topped
/// up with chunks from the global bucket, so the global store is called a few
/// times a epoch, never per request.
#[tokio::test]
async fn a_region_decides_warm_requests_in_memory_from_what_its_instances_drew() {
    let (global, regional) = (mem(), mem());
    let auth = seed(global, &roomy(), "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    let instances: Vec<_> = (0..3)
        .map(|_| pipeline(global, clock).with_regional(regional))
        .collect();
    let incrs = || regional.tally_incrs.load(Ordering::SeqCst);
    for i in 0..300 {
        step(clock, global, regional, 60_000);
        let g = settle(instances[i % 3].gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}: {g:?}");
    }
    // ~5.5 requests/s per instance, draws of up to 5 living until their epoch
    // ends: about one count per three requests
    assert!(
        incrs() <= 150,
        "{} regional counts for 300 requests",
        incrs()
    );
    let global_calls = global.checks.load(Ordering::SeqCst) + leases_taken(global);
    // 18 s: ~4 epochs, a few top-ups and exact checks each
    assert!(
        global_calls <= 40,
        "{global_calls} global calls for 300 requests"
    );
    assert!(leases_taken(global) >= 1, "past the credit: topped up");
    assert!(
        regional.runs_of(&TALLY_ADD) >= 1,
        "the chunks reached the region"
    );
    assert!(regional.runs_of(&TALLY_TAKE) >= 1, "settled behind");
}

/// A cold request is decided at the time its records arrived, not when it came
/// in: a key read from a far store (1.5 s here) still sizes its next draws from
/// its own requests. (Decided at its arrival, the request was metered more than
/// a second before its count, which read a rate of 0: draws of nothing, a
/// regional call per request.)
#[tokio::test]
async fn a_cold_request_is_decided_when_its_records_arrived() {
    let (global, regional) = (mem(), mem());
    let auth = seed(global, &roomy(), "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    *global.read_takes.lock().unwrap() = Some((clock, 1_500_000));
    let settings = PipelineConfig {
        deadline: DeadlineSettings::fixed(3_000_000),
        ..PipelineConfig::default()
    };
    let p = Pipeline::new(global, clock, settings).with_regional(regional);
    let incrs = || regional.tally_incrs.load(Ordering::SeqCst);
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    *global.read_takes.lock().unwrap() = None;
    let first = incrs();
    // 15 requests in the next second: draws of a few tokens each (half what
    // the key's rate says it will spend before the epoch ends)
    for i in 0..15 {
        step(clock, global, regional, 60_000);
        let g = settle(p.gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}");
    }
    let counts = incrs() - first;
    assert!(counts <= 8, "{counts} regional counts for 15 warm requests");
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

/// Three regions sharing `b`'s bound of 120 (20/s, a burst of 120): a credit of
/// 2 each per epoch (120 / (20 × 3)), chunks from a book of 60; epochs of 2 s.
const REGIONS: &str = r#"{"policies":[
  {"name":"b","dimensions":["api_key"],"quota":{"capacity":120,"refill":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":120}],
  "plans":{"bounded":["b"]}, "regions": 3}"#;

fn two_second_epochs() -> PipelineConfig {
    PipelineConfig {
        leases: floodgate_edge::pipeline::leases::LeaseSettings {
            tally: floodgate_shared::tally::TallySettings { epoch: 2_000_000 },
            ..Default::default()
        },
        ..PipelineConfig::default()
    }
}

/// A cold key is admitted by its region's tally, one command, no global round
/// trip; what was counted reaches the global bucket once its epoch is settled
/// (into debt if need be).
#[tokio::test]
async fn a_region_admits_a_cold_key_on_credit_without_a_global_round_trip() {
    let (global, regional) = (mem(), mem());
    let auth = seed(global, REGIONS, "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    let p = Pipeline::new(global, clock, two_second_epochs()).with_regional(regional);
    // the configuration and the key are cached by a first request
    let _ = settle(p.gate(head(&auth)).await).await;
    step(clock, global, regional, 10_000);
    let (checks, incrs) = (
        global.checks.load(Ordering::SeqCst),
        regional.tally_incrs.load(Ordering::SeqCst),
    );
    let d = p.gate(head(&auth)).await;
    assert_eq!(status(&d.gate), 200, "admitted on the region's credit");
    assert_eq!(
        global.checks.load(Ordering::SeqCst),
        checks,
        "no global round trip"
    );
    assert_eq!(
        regional.tally_incrs.load(Ordering::SeqCst),
        incrs + 1,
        "one command"
    );
    let _ = settle(d).await;
    // later epochs: the instance settles (every other epoch); counts over the
    // carry of 1 are charged
    for _ in 0..20 {
        step(clock, global, regional, 1_000_000);
        let _ = settle(p.gate(head(&auth)).await).await;
    }
    assert!(
        global.runs_of(&TALLY_CHARGE) >= 1,
        "settled: {} takes, {} counts, {:?}",
        regional.runs_of(&TALLY_TAKE),
        regional.tally_incrs.load(Ordering::SeqCst),
        regional.tally.lock().unwrap()
    );
    assert!(
        global.charged.load(Ordering::SeqCst) >= 2,
        "the counts reached the bucket"
    );
}

/// Two instances in each of three regions, random timing, background work run
/// or left to run later, settlements and top-ups: admissions in every window
/// stay within the quota plus the bound.
#[tokio::test]
async fn regions_on_credit_and_chunks_together_stay_within_the_bound() {
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
        let instances: Vec<_> = (0..6)
            .map(|i| {
                Pipeline::new(global, clock, two_second_epochs()).with_regional(regionals[i / 2])
            })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed_n);
        let mut admitted = vec![];
        let mut now = T0;
        for _ in 0..600 {
            let by = rng.random_range(0..40_000);
            advance(clock, global, by);
            for r in &regionals {
                *r.now.lock().unwrap() += by;
            }
            now += by;
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
        let excess = worst_excess(&admitted, 120);
        assert!(
            excess <= 120,
            "seed {seed_n}: {excess} above the quota, bound 120"
        );
        assert!(
            admitted.len() > 300,
            "seed {seed_n}: {} admitted",
            admitted.len()
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

/// Issue 38: at fan-out, a key an instance holds nothing of is decided by ONE
/// `HINCRBY` at its region's tally — no script, no lease take — within the
/// region's credit per epoch; counts carried (small ones) or charged to the
/// global bucket behind, by one instance of the region per epoch; a burst past
/// the credit tops the slot up from the global bucket, and nothing is lost.
#[tokio::test]
async fn cold_keys_are_decided_by_their_regions_tally_and_charged_behind() {
    let (global, regional) = (mem(), mem());
    // a bound of 320 over one region: a credit of 16 per epoch, a carry of 8
    let config = CONFIG
        .replace(
            r#""capacity":20,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":8"#,
            r#""capacity":10000,"period":"1m"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":320"#,
        )
        .replace(r#""plans":"#, r#""regions":1,"plans":"#);
    assert_eq!(floodgate_shared::tally::Shares::of(320, 1).credit, 16);
    let auth = seed(global, &config, "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    let instances: Vec<_> = (0..6)
        .map(|_| Pipeline::new(global, clock, PipelineConfig::default()).with_regional(regional))
        .collect();
    // one request every 2 s over six instances: every one cold where it lands
    for i in 0..20 {
        step(clock, global, regional, 2_000_000);
        let g = settle(instances[i % 6].gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}");
    }
    assert_eq!(global.runs_of(&LEASE_TAKE), 0, "no lease take");
    assert_eq!(
        regional.tally_incrs.load(Ordering::SeqCst),
        20,
        "one command each"
    );
    assert!(regional.runs_of(&TALLY_TAKE) >= 4, "settled behind");
    let tally = regional.tally.lock().unwrap().clone();
    let counted: i64 = tally.slots.values().flat_map(|h| h.values()).sum();
    let carried: u64 = tally.carry.values().sum();
    let charged = global.charged.load(Ordering::SeqCst) as i64;
    assert_eq!(
        charged + counted + carried as i64,
        20,
        "charged {charged} + carried {carried} + counted {counted}"
    );
    // a burst past the credit within one epoch: topped up from the global bucket
    for i in 0..60 {
        step(clock, global, regional, 1_000);
        let g = settle(instances[i % 6].gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "burst request {i}");
    }
    assert!(global.runs_of(&LEASE_TAKE) >= 1, "a chunk taken");
    assert!(regional.runs_of(&TALLY_ADD) >= 1, "and added to the slot");
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

/// With a regional store, a key hot on its instances (40/s on each of ten,
/// past what a tally's epoch of chunks carries: a book of 500 per 5 s epoch
/// against 2,000 requests) leases from the global bucket beside the tally:
/// every request is admitted, and the global store is called for a fraction
/// of them (lease takes and the exact decisions of requests the leases, which
/// share the tally's book, did not cover: about one in five here — a weak
/// spot of a tight bound split between the tally and the leases).
#[tokio::test]
async fn a_key_hot_on_its_instances_leases_beside_the_regions_tally() {
    let (global, regional) = (mem(), mem());
    // 1,000/s, a bound of 1,000: under quota at 400/s
    let config = roomy().replace(
        r#""capacity":400,"refill":100,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":400"#,
        r#""capacity":1000,"refill":1000,"period":"1s"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":1000"#,
    );
    assert_ne!(config, roomy());
    let auth = seed(global, &config, "bounded");
    *regional.now.lock().unwrap() = T0;
    let clock = clock();
    let instances: Vec<_> = (0..10)
        .map(|_| pipeline(global, clock).with_regional(regional))
        .collect();
    let mut exact_after_warm = 0;
    // 15 s: a first epoch whose chunks, taken before the key turned hot, hold
    // part of the book until it ends; then two epochs of leases
    for i in 0..6_000 {
        step(clock, global, regional, 2_500); // 400/s over ten: 40/s each
        let before = global.checks.load(Ordering::SeqCst);
        let g = settle(instances[i % 10].gate(head(&auth)).await).await;
        assert_eq!(status(&g), 200, "request {i}");
        if i >= 2_000 {
            exact_after_warm += global.checks.load(Ordering::SeqCst) - before;
        }
    }
    let takes = leases_taken(global);
    eprintln!(
        "hot: {exact_after_warm} exact, {takes} takes, {} counts, {} adds, health {:?}",
        regional.tally_incrs.load(Ordering::SeqCst),
        regional.runs_of(&TALLY_ADD),
        instances[0].health()
    );
    assert!(
        exact_after_warm <= 1_200,
        "{exact_after_warm} of 4,000 warm requests exact"
    );
    assert!(
        takes <= 600,
        "{takes} lease takes and top-ups for 6,000 requests"
    );
}
