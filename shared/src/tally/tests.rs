use proptest::prelude::*;

use super::*;
use crate::lease::{Central, LeaseConfig};

const T: Micros = 100_000; // 10 tokens/s: the load offered is several times the refill
const EPOCH: Micros = MICROS_PER_SEC;

fn settings() -> TallySettings {
    TallySettings { epoch: EPOCH }
}

fn field() -> Field {
    Field {
        bucket: "fg:{k:a}:p".into(),
        emission: T,
        burst: 100 * T,
        carry: 0,
    }
}

/// The largest excess over `capacity + (b − a)/T` of the admissions within any
/// window [a, b] (the exact token bucket's own guarantee has excess ≤ 0).
fn worst_excess(admitted: &[Micros], capacity: u64) -> i64 {
    let mut times = admitted.to_vec();
    times.sort_unstable();
    let mut worst = i64::MIN;
    for i in 0..times.len() {
        for j in i..times.len() {
            let count = (j - i + 1) as i64;
            let allowed = capacity as i64 + (times[j] - times[i]) / T;
            worst = worst.max(count - allowed);
        }
    }
    worst
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// A request at an instance (instance index, all regions together).
    Request(usize),
    /// An instance of a region tries to settle; `crash`: it dies after the
    /// take (0), after the charge (1), or finishes (2+).
    Settle(usize, u8),
    /// An instance forgets everything (a new isolate).
    Forget(usize),
    /// The global store stops / starts answering.
    Global(bool),
}

fn event() -> impl Strategy<Value = (Event, Micros)> {
    let e = prop_oneof![
        12 => (0usize..9).prop_map(Event::Request),
        2 => ((0usize..3), 0u8..6).prop_map(|(r, c)| Event::Settle(r, c)),
        1 => (0usize..9).prop_map(Event::Forget),
        1 => proptest::bool::ANY.prop_map(Event::Global),
    ];
    (e, 0i64..40_000)
}

/// A top-up on its way: the lease take reaches the global store at `take_at`,
/// the chunk the region at `add_at`.
struct InFlight {
    take_at: Micros,
    add_at: Micros,
    region: usize,
    instance: usize,
    epoch: i64,
    granted: Option<u64>,
}

/// Everything around one bucket: `regions` regions of `per_region` instances,
/// each deciding as the edge does ([`Held`]), the regions' tallies
/// ([`RegionTally`]), the global bucket with its lease book ([`Central`]),
/// settlements that may crash half way, and top-ups that travel `delay` each
/// way. Returns every admission's instant.
struct System {
    shares: Shares,
    capacity: u64,
    delay: Micros,
    regions: usize,
    per_region: usize,
    global: Central,
    global_up: bool,
    tallies: Vec<RegionTally>,
    held: Vec<Held>,
    top_ups: Vec<InFlight>,
    admitted: Vec<Micros>,
    /// Requests the exact path decided.
    exact_calls: usize,
    ids: u64,
}

impl System {
    fn new(bound: u64, capacity: u64, regions: usize, per_region: usize, delay: Micros) -> Self {
        Self {
            shares: Shares::of(bound, regions as u32),
            capacity,
            delay,
            regions,
            per_region,
            global: Central::default(),
            global_up: true,
            tallies: vec![RegionTally::default(); regions],
            held: vec![Held::default(); regions * per_region],
            top_ups: vec![],
            admitted: vec![],
            exact_calls: 0,
            ids: 0,
        }
    }

    /// The bucket's field, carrying what its shares carry.
    fn field(&self) -> String {
        Field {
            carry: self.shares.carry,
            ..field()
        }
        .encode()
    }

    fn burst(&self) -> Micros {
        self.capacity as Micros * T
    }

    fn exact(&mut self, now: Micros) {
        self.exact_calls += 1;
        if !self.global_up {
            return;
        }
        let burst = self.burst();
        let cfg = LeaseConfig::default();
        if self
            .global
            .take(&cfg, now, burst, T, 1, 0, "x", None)
            .admitted
        {
            self.admitted.push(now);
        }
    }

    fn request(&mut self, i: usize, now: Micros) {
        let i = i % self.held.len();
        let region = i / self.per_region;
        let (s, shares) = (settings(), self.shares);
        let h = &mut self.held[i];
        h.record(&s, now);
        if h.can_spend(1, now) {
            h.spend(1);
            return self.admitted.push(now);
        }
        let Some(ask) = h.ask(&s, &shares, 1, now) else {
            return self.exact(now);
        };
        let (epoch, draw, by) = (ask.epoch, ask.draw, ask.by());
        let (slot, f) = (slot_key(epoch), self.field());
        let after = self.tallies[region].incr(&slot, &f, by);
        let (c, top_up) = self.held[i].counted(&s, &shares, ask, after, now);
        match c {
            Counted::Admitted => self.admitted.push(now),
            Counted::WithoutDraw => {
                self.tallies[region].incr(&slot, &f, -(draw as i64));
                self.admitted.push(now);
            }
            Counted::Over | Counted::Blocked => {
                self.tallies[region].incr(&slot, &f, -by);
                self.exact(now);
            }
        }
        if let Some(why) = top_up {
            self.top_ups.push(InFlight {
                take_at: now + self.delay,
                add_at: now + 2 * self.delay,
                region,
                instance: i,
                epoch: s.top_up_epoch(now, why),
                granted: None,
            });
        }
    }

    /// Top-ups whose messages have arrived by `now`.
    fn travel(&mut self, now: Micros) {
        let (burst, s) = (self.burst(), settings());
        for t in self.top_ups.iter_mut() {
            if t.granted.is_none() && t.take_at <= now {
                let life = s.end_of(t.epoch) + CHUNK_MARGIN - t.take_at;
                let cfg = LeaseConfig {
                    max_overshoot: self.shares.book,
                    max_lease: self.shares.chunk,
                    lifetime: life.max(1),
                    ..LeaseConfig::default()
                };
                self.ids += 1;
                let got = if self.global_up && life > 0 {
                    let id = self.ids.to_string();
                    let taken =
                        self.global
                            .take(&cfg, t.take_at, burst, T, 0, cfg.max_lease, &id, None);
                    taken.leased
                } else {
                    0
                };
                t.granted = Some(got);
            }
        }
        let (landed, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.top_ups)
            .into_iter()
            .partition(|t| t.add_at <= now && t.granted.is_some());
        self.top_ups = waiting;
        let f = self.field();
        for t in landed {
            let g = t.granted.unwrap_or(0);
            let until = s.draw_until(t.epoch);
            if g > 0 && self.tallies[t.region].add(&slot_key(t.epoch), &f, g, t.add_at, until) {
                self.held[t.instance].topped_up();
            }
        }
    }

    /// One settlement attempt of `region` at `now`: the slot of the epoch
    /// before the last taken, charged and done — unless the settler dies
    /// (`crash` 0: after a take, 1: after a charge) or the global store is
    /// down (stops after the take).
    fn settle(&mut self, region: usize, crash: u8, now: Micros) {
        let s = settings();
        let current = s.epoch_of(now);
        if now < s.end_of(current - 1) + SETTLE_AFTER {
            return;
        }
        for e in [current - 2] {
            let tally = &mut self.tallies[region];
            let Some(taken) = Taken::from_reply(&tally.take(&slot_key(e))).unwrap() else {
                continue;
            };
            if crash == 0 || !self.global_up {
                return;
            }
            let plan = settle(&taken, e % CARRY_SWEEP_EPOCHS == 0);
            let mut blocked: Vec<String> = vec![];
            for (entry, n) in &plan.charges {
                self.global.full_at =
                    charged(Some(self.global.full_at), now, entry.field.emission, *n);
            }
            if self.global.full_at - now > self.capacity as Micros * T {
                blocked = plan.charges.iter().map(|(e, _)| e.raw.clone()).collect();
            }
            if crash == 1 {
                return;
            }
            let others = [slot_key(current), slot_key(current + 1)];
            let args = done_args(&plan, &blocked, e % CARRY_SWEEP_EPOCHS == 0);
            self.tallies[region]
                .done([others[0].as_str(), others[1].as_str()], &args)
                .unwrap();
            if taken.pending {
                // the finished slot waits for the next settlement
                return;
            }
        }
    }

    fn run(&mut self, events: &[(Event, Micros)]) {
        let mut now = 10 * EPOCH;
        for &(event, step) in events {
            now += step;
            self.travel(now);
            match event {
                Event::Request(i) => self.request(i, now),
                Event::Settle(r, crash) => self.settle(r % self.regions, crash, now),
                Event::Forget(i) => {
                    let i = i % self.held.len();
                    self.held[i] = Held::default();
                }
                Event::Global(up) => self.global_up = up,
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Regions of instances deciding one bucket at their tallies, with draws,
    /// chunks topped up late, settlements that crash half way or find the
    /// global store down, instances that forget what they drew: admissions in
    /// every window stay within capacity + refill × window + max_overshoot.
    #[test]
    fn regions_and_instances_never_overshoot_the_bound(
        capacity in 1u64..40,
        bound in 1u64..120,
        regions in 1usize..4,
        per_region in 1usize..4,
        delay in 0i64..300_000,
        events in proptest::collection::vec(event(), 1..300),
    ) {
        let mut sys = System::new(bound, capacity, regions, per_region, delay);
        sys.run(&events);
        let excess = worst_excess(&sys.admitted, capacity);
        prop_assert!(excess <= bound as i64, "excess {excess} > bound {bound}");
    }
}

#[test]
fn the_shares_split_the_bound_as_the_module_says() {
    let s = Shares::of(500, 2);
    assert_eq!((s.credit, s.carry, s.book, s.chunk), (12, 6, 260, 32));
    for bound in 1..2_000u64 {
        for regions in 1..8u32 {
            let s = Shares::of(bound, regions);
            let r = u64::from(regions);
            assert!(
                10 * r * s.credit + s.book <= bound,
                "{bound} {regions}: {s:?}"
            );
            assert!(s.chunk >= 1 && s.carry <= s.credit / 2);
        }
    }
    assert_eq!(
        Shares::of(20, 2).credit,
        0,
        "too small for credit: chunks only"
    );
}

#[test]
fn an_increment_is_admitted_with_or_without_its_draw_or_taken_back() {
    assert_eq!(counted(10, 1, 3, 10), Counted::Admitted);
    assert_eq!(counted(12, 1, 3, 10), Counted::WithoutDraw);
    assert_eq!(counted(12, 1, 1, 10), Counted::Over);
    assert_eq!(
        counted(-40, 1, 3, 0),
        Counted::Admitted,
        "chunks: below zero"
    );
    assert_eq!(counted(BLOCKED + 1, 1, 0, 10), Counted::Blocked);
    let shares = |credit, chunk| Shares {
        credit,
        carry: 0,
        book: 4 * chunk,
        chunk,
    };
    let up = |before, after, s: &Shares| tops_up(before, after, s);
    assert_eq!(
        up(4, 6, &shares(12, 10)),
        Some(TopUp::NearlyOut),
        "crossed half the credit"
    );
    assert_eq!(up(6, 8, &shares(12, 10)), None);
    assert_eq!(
        up(12, 13, &shares(12, 10)),
        Some(TopUp::Out),
        "found the credit spent"
    );
    assert_eq!(
        up(0, 1, &shares(2, 10)),
        None,
        "a small credit: not at half of it"
    );
    assert_eq!(up(2, 3, &shares(2, 10)), Some(TopUp::Out), "but once spent");
    assert_eq!(
        up(-6, -4, &shares(2, 10)),
        Some(TopUp::ChunkHalfSpent),
        "the chunks run low"
    );
    assert_eq!(up(-9, -7, &shares(2, 10)), None);
    assert_eq!(
        up(-1, 1, &shares(2, 10)),
        Some(TopUp::NearlyOut),
        "the chunks spent"
    );
    assert_eq!(up(0, 1, &shares(12, 10)), None, "not at an epoch's start");
    assert_eq!(
        up(-1, 0, &shares(0, 10)),
        None,
        "no credit: the next count is out (asked once per instance and epoch)"
    );
}

#[test]
fn a_draw_follows_the_keys_rate_on_the_instance_within_a_quarter_of_the_credit() {
    let s = Shares::of(2_000, 1);
    assert_eq!(s.credit, 100);
    // 4 requests in 2 s, 3 s left: half the 6 expected, 3 tokens; all 6 after
    // a draw spent out
    assert_eq!(draw_size(4, 2 * MICROS_PER_SEC, 3_000_000, &s, false), 3);
    assert_eq!(draw_size(4, 2 * MICROS_PER_SEC, 3_000_000, &s, true), 6);
    assert_eq!(
        draw_size(1_000, MICROS_PER_SEC, 4 * MICROS_PER_SEC, &s, true),
        25
    );
    assert_eq!(draw_size(0, MICROS_PER_SEC, MICROS_PER_SEC, &s, true), 0);
    assert_eq!(draw_size(5, MICROS_PER_SEC, 0, &s, true), 0);
}

#[test]
fn an_instance_spends_its_draw_then_counts_then_goes_exact_once_out() {
    let (s, shares) = (settings(), Shares::of(400, 1));
    assert_eq!(shares.credit, 20);
    let mut h = Held::default();
    let t0 = 10 * EPOCH;
    h.record(&s, t0);
    assert!(!h.can_spend(1, t0));
    let ask = h.ask(&s, &shares, 1, t0).unwrap();
    assert_eq!(
        ask,
        Ask {
            epoch: 10,
            cost: 1,
            draw: 0
        },
        "no rate yet: no draw"
    );
    assert_eq!(
        h.counted(&s, &shares, ask, 1, t0),
        (Counted::Admitted, None)
    );
    // four more requests within 100 ms: a draw
    for k in 1..5 {
        h.record(&s, t0 + k * 20_000);
    }
    let ask = h.ask(&s, &shares, 1, t0 + 80_000).unwrap();
    assert!(ask.draw >= 1, "{ask:?}");
    let (c, _) = h.counted(&s, &shares, ask, 1 + ask.by(), t0 + 80_000);
    assert_eq!(c, Counted::Admitted);
    assert!(h.can_spend(1, t0 + 90_000));
    // a draw of credit lives until the next epoch ends, then it is gone
    assert!(h.can_spend(1, s.draw_until(10)));
    assert!(!h.can_spend(1, s.draw_until(11)));
    // a draw of chunk tokens (the count below zero) dies with its own epoch
    let chunked = Ask {
        epoch: 10,
        cost: 1,
        draw: 2,
    };
    assert_eq!(
        h.counted(&s, &shares, chunked, -7, t0 + 85_000).0,
        Counted::Admitted
    );
    assert!(h.can_spend(1, s.draw_until(10) - 1));
    assert!(!h.can_spend(1, s.draw_until(10)));
    // the credit found spent: exact for a while, one chunk asked for per epoch
    let t1 = 11 * EPOCH;
    let ask = Ask {
        epoch: 11,
        cost: 1,
        draw: 0,
    };
    assert_eq!(
        h.counted(&s, &shares, ask, 21, t1),
        (Counted::Over, Some(TopUp::Out))
    );
    assert_eq!(h.ask(&s, &shares, 1, t1 + 1), None, "exact for a while");
    let (_, top) = h.counted(&s, &shares, ask, 22, t1 + OUT_FOR);
    assert_eq!(top, None, "asked once this epoch");
    h.topped_up();
    assert!(h.ask(&s, &shares, 1, t1 + OUT_FOR + 1).is_some());
}

#[test]
fn a_settlement_carries_small_counts_charges_the_rest_and_sweeps() {
    let f = |name: &str| Field {
        bucket: name.into(),
        emission: T,
        burst: 100 * T,
        carry: 5,
    };
    let entry = |name: &str, count: i64, carried: u64| Entry {
        raw: f(name).encode(),
        field: f(name),
        count,
        carried,
    };
    let taken = Taken {
        pending: false,
        entries: vec![
            entry("small", 2, 1),
            entry("big", 30, 0),
            entry("grew", 3, 4),
            entry("chunked", -20, 0),
            entry("blocked", BLOCKED + 2, 0),
            entry("twice", 2 * BLOCKED - 3, 0),
        ],
    };
    let s = settle(&taken, false);
    let names: Vec<(&str, u64)> = s
        .charges
        .iter()
        .map(|(e, n)| (e.field.bucket.as_str(), *n))
        .collect();
    assert_eq!(
        names,
        [("big", 30), ("grew", 7), ("blocked", 2), ("twice", 0)]
    );
    let only_blocked = Taken {
        pending: false,
        entries: vec![entry("blocked", BLOCKED, 0)],
    };
    assert_eq!(
        settle(&only_blocked, false).charges[0].1,
        0,
        "read for its debt"
    );
    assert_eq!(s.carried, [(f("small").encode(), 3)]);
    assert_eq!(s.uncarried, [f("grew").encode()]);
    assert_eq!(s.were_blocked, [f("blocked").encode(), f("twice").encode()]);
    let swept = settle(&taken, true);
    assert_eq!(swept.charges.len(), 5);
    assert!(swept.carried.is_empty());
}

#[test]
fn the_twin_renames_settles_carries_and_blocks_as_the_scripts_do() {
    let mut r = RegionTally::default();
    let f = Field {
        carry: 5,
        ..field()
    }
    .encode();
    assert_eq!(r.take("fg:{tally}:0"), vec![b"0".to_vec()]);
    r.incr("fg:{tally}:0", &f, 3);
    let taken = Taken::from_reply(&r.take("fg:{tally}:0")).unwrap().unwrap();
    assert!(!taken.pending);
    assert_eq!(taken.entries[0].count, 3);
    // a second take before done: the same slot, pending
    r.incr("fg:{tally}:0", &f, 1);
    let again = Taken::from_reply(&r.take("fg:{tally}:0")).unwrap().unwrap();
    assert!(again.pending);
    let plan = settle(&again, false);
    let args = done_args(&plan, std::slice::from_ref(&f), false);
    r.done(["fg:{tally}:1", "fg:{tally}:2"], &args).unwrap();
    assert_eq!(r.carry.get(&f), Some(&3));
    assert_eq!(r.slots["fg:{tally}:1"][&f], BLOCKED);
    assert!(r.done(["a", "b"], &["x".into()]).is_err());
    assert!(
        !r.add("fg:{tally}:1", &f, 5, 10, 10),
        "past its deadline: nothing"
    );
    assert!(r.add("fg:{tally}:1", &f, 5, 9, 10));
    assert_eq!(r.slots["fg:{tally}:1"][&f], BLOCKED - 5);
}

#[test]
fn a_field_round_trips_and_garbage_is_none() {
    let f = Field {
        bucket: "fg:{k:ab}:search:e:x".into(),
        emission: 6_000,
        burst: 60_000_000,
        carry: 7,
    };
    assert_eq!(Field::decode(&f.encode()), Some(f));
    for bad in [
        "",
        "x",
        "a\t1\t2",
        "a\t0\t5\t1",
        "\t1\t2\t0",
        "a\t1\t-2\t0",
        "a\tz\t2\t0",
        "a\t1\t2\t-1",
    ] {
        assert_eq!(Field::decode(bad), None, "{bad:?}");
    }
}

#[test]
fn a_take_reply_parses_and_garbage_is_refused() {
    let f = field().encode();
    let ok = vec![
        b"2".to_vec(),
        f.clone().into_bytes(),
        b"4".to_vec(),
        b"1".to_vec(),
    ];
    let t = Taken::from_reply(&ok).unwrap().unwrap();
    assert_eq!(
        (t.pending, t.entries[0].count, t.entries[0].carried),
        (false, 4, 1)
    );
    assert_eq!(Taken::from_reply(&[b"0".to_vec()]).unwrap(), None);
    for bad in [
        vec![],
        vec![b"x".to_vec()],
        vec![b"2".to_vec(), b"f".to_vec()],
        vec![b"7".to_vec()],
    ] {
        assert!(Taken::from_reply(&bad).is_err(), "{bad:?}");
    }
    // a field that does not parse is dropped, not charged
    let junk = vec![b"1".to_vec(), b"junk".to_vec(), b"4".to_vec(), b"".to_vec()];
    assert!(
        Taken::from_reply(&junk)
            .unwrap()
            .unwrap()
            .entries
            .is_empty()
    );
}

/// A region cut off from the global store for many epochs: every request of a
/// busy key goes to its tally, every settlement fails; once the store is back,
/// the backlog is charged into debt and the key is blocked. Admissions stay
/// within the bound, and the region did admit on credit meanwhile (each of
/// its three slots and the one settling up to the credit, no more).
#[test]
fn a_region_cut_off_from_the_global_store_stops_at_four_credits() {
    let (bound, capacity) = (200, 10);
    let mut sys = System::new(bound, capacity, 1, 2, 0);
    let credit = sys.shares.credit as usize;
    assert_eq!(credit, 10);
    let mut events = vec![(Event::Global(false), 0)];
    for epoch in 0..12 {
        for k in 0..40 {
            events.push((Event::Request(k % 2), EPOCH / 40));
        }
        if epoch % 2 == 0 {
            events.push((Event::Settle(0, 5), 0));
        }
    }
    events.push((Event::Global(true), 0));
    for _ in 0..8 {
        for k in 0..20 {
            events.push((Event::Request(k % 2), EPOCH / 20));
        }
        events.push((Event::Settle(0, 5), 0));
    }
    sys.run(&events);
    let excess = worst_excess(&sys.admitted, capacity);
    assert!(excess <= bound as i64, "excess {excess} > bound {bound}");
    let cut_off = sys
        .admitted
        .iter()
        .filter(|&&t| t < 10 * EPOCH + 12 * EPOCH)
        .count();
    assert!(
        (credit..=4 * credit).contains(&cut_off),
        "{cut_off} admitted while cut off (credit {credit})"
    );
}

/// A key hotter than its region's credit is admitted by the region anyway,
/// from the chunks its slots are topped up with: 50 requests/s for 3 s (a
/// burst of 400 holds them all) are all admitted, the slots counted below
/// zero, and the bound holds.
#[test]
fn a_hot_key_is_served_from_chunks_past_its_credit() {
    let (bound, capacity) = (400, 400);
    let mut sys = System::new(bound, capacity, 1, 2, 20_000);
    assert_eq!(sys.shares.credit, 20);
    let mut events = vec![];
    for k in 0..150 {
        events.push((Event::Request(k % 2), 20_000));
    }
    sys.run(&events);
    assert_eq!(
        sys.admitted.len(),
        150,
        "a hot key below its quota: all admitted"
    );
    // 3 epochs of 50 against a credit of 20 each: the region decided past it
    assert!(sys.exact_calls < 20, "{} exact", sys.exact_calls);
    assert!(sys.global.full_at > 0, "chunks came from the bucket");
    assert!(worst_excess(&sys.admitted, capacity) <= bound as i64);
}

#[test]
fn in_an_epochs_last_quarter_only_a_half_spent_chunk_is_topped_up_ahead() {
    let s = settings();
    let early = 10 * EPOCH + EPOCH / 2;
    let late = 11 * EPOCH - EPOCH / 8;
    for why in [TopUp::ChunkHalfSpent, TopUp::NearlyOut, TopUp::Out] {
        assert_eq!(s.top_up_epoch(early, why), 10, "{why:?}");
    }
    assert_eq!(s.top_up_epoch(late, TopUp::ChunkHalfSpent), 11);
    // the epoch's last requests would wait for the global store otherwise
    assert_eq!(s.top_up_epoch(late, TopUp::NearlyOut), 10);
    assert_eq!(s.top_up_epoch(late, TopUp::Out), 10);
}
