//! The regional tally: how a bounded policy is decided near the caller, in one
//! plain command, when the edge has a regional store (issue 38).
//!
//! At fan-out — hundreds of instances, a long tail of keys — an instance has
//! seldom seen the key of a request, so what it remembers is usually cold. The
//! tally decides such a request with ONE `HINCRBY` at its region's store, and
//! a key an instance sees often with a draw that request makes for it:
//!
//! - **The ring.** A region counts what it admits per bucket in three hashes,
//!   [`slot_key`], one per epoch ([`TallySettings::epoch`], 5 s by default) in
//!   turn: epoch `e` counts in slot `e mod 3`. A request its instance holds no
//!   token for is `HINCRBY <slot> <field> <cost + draw>` ([`Field`]: the bucket
//!   and what charging it takes): admitted while the count stays within the
//!   region's [`Shares::credit`]; the draw is a few tokens more, sized from the
//!   key's rate on the instance, spent in its memory until the next epoch ends
//!   ([`DRAW_MARGIN`] before; a draw of chunk tokens, below zero, only until
//!   its own epoch ends). Past the credit, the request goes to the exact path
//!   (and what it added is taken back): see [`counted`].
//! - **Settled behind.** Once the epoch after it is over ([`SETTLE_AFTER`]
//!   later), one instance of the region (the one that takes [`LOCK_KEY`])
//!   renames an epoch's slot
//!   to [`SETTLING_KEY`] and reads it with the key's carried counts
//!   (`lua/tally_take.lua`), charges the global buckets in ONE call
//!   (`lua/tally_charge.lua`: into debt if need be, [`charged`]), and drops it
//!   (`lua/tally_done.lua`). A bucket the charge left in debt is blocked in the
//!   other two slots ([`BLOCKED`] added: its requests go exact until a later
//!   charge finds the debt repaid). A count of at most [`Shares::carry`]
//!   (with what was carried before) is carried in [`CARRY_KEY`] instead of
//!   charged: the long tail's keys cost a charge every few epochs, not every
//!   one; the whole carry is charged every [`CARRY_SWEEP_EPOCHS`].
//! - **Chunks for hot keys.** The request whose increment takes a key past half
//!   its credit in an epoch, past half its last chunk or past its chunks (or
//!   finds the credit spent) tops the slot up in the background ([`tops_up`]):
//!   a lease of [`Shares::chunk`] tokens taken from the global bucket
//!   (`lua/lease_take.lua`, cost 0: granted only while the bucket has room and
//!   the lease book has [`Shares::book`] free), living until the epoch ends,
//!   then taken off the count (`lua/tally_add.lua`, which adds nothing past the
//!   lease's end). A hot key's count then goes below zero and its requests keep
//!   being admitted by the region. In an epoch's last quarter a chunk asked for
//!   because the last one is half spent goes to the next epoch's slot instead,
//!   so that epoch starts with tokens; one asked for because the epoch's tokens
//!   are nearly out still goes to this one ([`TallySettings::top_up_epoch`]).
//!
//! **The bound.** Per region and bucket, what was admitted and not yet charged
//! is at most three slots and the one settling (each within the credit, the
//! ring reuses a slot not yet settled rather than opening a new one: a region
//! cut off from the global store stops at four credits), and the carry; what
//! was charged before it was spent is at most one slot's draws (a slot settled
//! late, while the epoch reusing it draws); the debt charged before a block
//! lands is at most the four credits again. So `regions × (10 × credit)`
//! (carry is half a credit) plus the chunks' book stay within `max_overshoot`:
//! [`Shares::of`] gives the credit a twentieth of the bound per region and the
//! book half of it. Property test: `regions_and_instances_never_overshoot_the_bound`
//! below, with settlers that crash half way, a global store that drops out,
//! instances that forget everything, and top-ups that land late.

use crate::script::LuaScript;
use crate::time::{MICROS_PER_MS, MICROS_PER_SEC, Micros};

pub(crate) mod sha {
    include!(concat!(env!("OUT_DIR"), "/tally_sha1.rs"));
}

/// `lua/tally_take.lua`: renames a finished slot for its settlement and reads it.
pub const TALLY_TAKE: LuaScript = LuaScript {
    source: sha::TALLY_TAKE_SOURCE,
    sha1: sha::TALLY_TAKE_SHA1,
};
/// `lua/tally_done.lua`: drops the settled slot, writes the carry, blocks.
pub const TALLY_DONE: LuaScript = LuaScript {
    source: sha::TALLY_DONE_SOURCE,
    sha1: sha::TALLY_DONE_SHA1,
};
/// `lua/tally_add.lua`: a chunk taken off a slot's count, until a deadline.
pub const TALLY_ADD: LuaScript = LuaScript {
    source: sha::TALLY_ADD_SOURCE,
    sha1: sha::TALLY_ADD_SHA1,
};
/// `lua/tally_charge.lua`: what a region admitted charged to the global buckets.
pub const TALLY_CHARGE: LuaScript = LuaScript {
    source: sha::TALLY_CHARGE_SOURCE,
    sha1: sha::TALLY_CHARGE_SHA1,
};

/// The pure twin of `lua/tally_charge.lua` for one bucket: its full_at after
/// `count` tokens are charged at `now` (into debt if need be).
pub fn charged(full_at: Option<Micros>, now: Micros, emission: Micros, count: u64) -> Micros {
    full_at.unwrap_or(0).max(now) + count as Micros * emission
}

/// Whether a bucket of `burst` with `full_at` is in debt at `now`.
pub fn in_debt(full_at: Micros, now: Micros, burst: Micros) -> bool {
    full_at - now > burst
}

/// A tally's field: the bucket, with what settling it takes (its µs per token
/// and burst window, and the count it carries at most), so the settler needs
/// no configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub bucket: String,
    pub emission: Micros,
    pub burst: Micros,
    pub carry: u64,
}

impl Field {
    /// `<bucket>\t<emission>\t<burst>\t<carry>` (a bucket key holds no tab).
    pub fn encode(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}",
            self.bucket, self.emission, self.burst, self.carry
        )
    }

    /// The field [`Field::encode`] wrote (`None`: not one).
    pub fn decode(text: &str) -> Option<Field> {
        let mut parts = text.rsplitn(4, '\t');
        let carry = parts.next()?.parse().ok()?;
        let burst = parts.next()?.parse().ok().filter(|b: &Micros| *b > 0)?;
        let emission = parts.next()?.parse().ok().filter(|e: &Micros| *e > 0)?;
        let bucket = parts.next().filter(|b| !b.is_empty())?.to_string();
        Some(Field {
            bucket,
            emission,
            burst,
            carry,
        })
    }
}

/// The slots of the ring.
pub const SLOTS: i64 = 3;
/// A slot being charged (renamed from its slot by its settler).
pub const SETTLING_KEY: &str = "fg:{tally}:settling";
/// Counts carried to a later settlement (field → count).
pub const CARRY_KEY: &str = "fg:{tally}:carry";
/// Who settles a region's finished epoch (`SET NX PX`, the epoch as value).
pub const LOCK_KEY: &str = "fg:{tally}:lock";
/// Added to a blocked bucket's count: far above any credit, far below 2^53.
pub const BLOCKED: i64 = 1 << 40;
/// A draw is spent until this long before its epoch ends (on the instance's
/// clock): clocks that read in whole milliseconds (the Worker's) and a skew
/// between instances cannot stretch it into the settlement.
pub const DRAW_MARGIN: Micros = 250 * MICROS_PER_MS;
/// An epoch's slot is settled this long after the epoch after it ends, at the
/// earliest.
pub const SETTLE_AFTER: Micros = MICROS_PER_SEC;
/// A chunk's lease outlives its epoch by this much (at the global store).
pub const CHUNK_MARGIN: Micros = 500 * MICROS_PER_MS;
/// The whole carry is charged every this many epochs (and dropped).
pub const CARRY_SWEEP_EPOCHS: i64 = 60;

/// The slot of epoch `epoch`. (Every key of the tally has the hash tag
/// `{tally}`: one Redis Cluster slot, so its scripts run on a regional cluster
/// too.)
pub fn slot_key(epoch: i64) -> String {
    format!("fg:{{tally}}:{}", epoch.rem_euclid(SLOTS))
}

/// How a deployment runs its tallies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TallySettings {
    /// The length of an epoch (a draw lives at most this long).
    pub epoch: Micros,
}

impl Default for TallySettings {
    /// 5 s: a draw lives 2.5 s on average, and a hot key's chunks turn over
    /// fast enough for a bound of 500 to carry 40 requests/s
    /// (`simulate::fanout`'s model; docs/scale.md).
    fn default() -> Self {
        Self {
            epoch: 5 * MICROS_PER_SEC,
        }
    }
}

impl TallySettings {
    /// The epoch of `now` (µs on the instance's clock).
    pub fn epoch_of(&self, now: Micros) -> i64 {
        now.div_euclid(self.epoch.max(1))
    }

    /// When epoch `epoch` ends.
    pub fn end_of(&self, epoch: i64) -> Micros {
        (epoch + 1) * self.epoch.max(1)
    }

    /// The epoch a chunk asked for at `now` goes to: the current one, or in
    /// its last quarter the next one when it was asked for because the last
    /// chunk is half spent (so a hot key's next epoch starts with tokens, not
    /// with its instances' first draws racing its credit). A chunk asked for
    /// because this epoch's tokens are nearly out or spent goes to this epoch
    /// whenever it is asked for: sent ahead, the epoch's last requests would
    /// wait for the global store.
    pub fn top_up_epoch(&self, now: Micros, why: TopUp) -> i64 {
        let epoch = self.epoch_of(now);
        if why == TopUp::ChunkHalfSpent && now >= self.end_of(epoch) - self.epoch / 4 {
            epoch + 1
        } else {
            epoch
        }
    }

    /// Until when a token drawn in `epoch` may be spent.
    pub fn draw_until(&self, epoch: i64) -> Micros {
        self.end_of(epoch) - DRAW_MARGIN
    }
}

/// What a policy's bound gives its regions' tallies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// What a region may admit per bucket and epoch before it is charged.
    pub credit: u64,
    /// Counts this small (with what was carried before) are carried, not charged.
    pub carry: u64,
    /// Tokens out on chunks at once, all regions together (the lease book).
    pub book: u64,
    /// What one top-up asks for: a quarter of the book per region.
    pub chunk: u64,
}

impl Shares {
    /// `max_overshoot / (20 × regions)` of credit per region, half of it as
    /// carry, half the bound for the chunks (see the module's bound).
    pub fn of(max_overshoot: u64, regions: u32) -> Shares {
        let regions = u64::from(regions.max(1));
        let credit = max_overshoot / (20 * regions);
        let book = max_overshoot - 10 * regions * credit;
        Shares {
            credit,
            carry: credit / 2,
            book,
            chunk: (book / (4 * regions)).max(1),
        }
    }
}

/// What one increment's reply means (the count after it, `by` = cost + draw).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Admitted with its draw.
    Admitted,
    /// Admitted without its draw (past the credit with it): `HINCRBY -draw`.
    WithoutDraw,
    /// Past the credit: taken back (`HINCRBY -by`), the exact path decides.
    Over,
    /// The bucket is blocked (in debt at the global store): taken back, exact.
    Blocked,
}

/// What the count `after` an increment of `cost + draw` means against `credit`.
pub fn counted(after: i64, cost: u64, draw: u64, credit: u64) -> Counted {
    if after >= BLOCKED / 2 {
        return Counted::Blocked;
    }
    let credit = credit as i64;
    if after <= credit {
        Counted::Admitted
    } else if after - draw as i64 <= credit && cost > 0 {
        Counted::WithoutDraw
    } else {
        Counted::Over
    }
}

/// A count crossing half the credit asks for a chunk only from this many on: a
/// key with a few requests per epoch in its region is cheaper on credit (a
/// chunk costs a lease take and an add, five commands and more).
pub const TOP_UP_FROM: i64 = 4;

/// Why a count asks for a chunk ([`tops_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopUp {
    /// Half a chunk below zero: the chunks it holds run low (a count is below
    /// zero only with chunks).
    ChunkHalfSpent,
    /// The chunks spent (zero crossed from below, with a credit left to spend
    /// while the chunk travels: without one, the next count is `Out`), or
    /// half the credit.
    NearlyOut,
    /// The credit found spent.
    Out,
}

/// Whether (and why) the increment that took a count from `before` to
/// `after` asks for a chunk (of `chunk` tokens). Exactly one request of a
/// region crosses each level; half the credit counts from [`TOP_UP_FROM`] on.
pub fn tops_up(before: i64, after: i64, shares: &Shares) -> Option<TopUp> {
    let crossed = |level: i64| before < level && after >= level;
    let half = ((shares.credit / 2) as i64).max(TOP_UP_FROM);
    if counted(after, 1, 0, shares.credit) == Counted::Over {
        Some(TopUp::Out)
    } else if crossed(half) || (shares.credit > 0 && crossed(0)) {
        Some(TopUp::NearlyOut)
    } else if crossed(-((shares.chunk / 2) as i64)) {
        Some(TopUp::ChunkHalfSpent)
    } else {
        None
    }
}

/// A key's draw on one instance: what its rate there says it will spend in
/// the time left — half of it unless its last draw was spent out (what is
/// drawn and not spent is lost to the region's credit: at a few requests per
/// epoch an instance's rate is a rough guess) — at most a quarter of the
/// credit (or, without credit, of a chunk).
pub fn draw_size(seen: u64, over: Micros, left: Micros, shares: &Shares, whole: bool) -> u64 {
    if seen == 0 || left <= 0 {
        return 0;
    }
    let cap = if shares.credit > 0 {
        shares.credit / 4
    } else {
        shares.chunk / 4
    };
    let tokens = u128::from(seen) * left as u128 / over.max(MICROS_PER_SEC) as u128;
    let tokens = if whole { tokens } else { tokens / 2 };
    (tokens as u64).min(cap)
}

/// One bucket of a slot being settled: its field, the count, and what was
/// carried for it before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub raw: String,
    pub field: Field,
    pub count: i64,
    pub carried: u64,
}

/// What `lua/tally_take.lua` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// A slot left settling by a settler that did not finish (it is charged
    /// first, and the finished slot waits for the next settlement).
    pub pending: bool,
    pub entries: Vec<Entry>,
}

impl Taken {
    /// `{flag, field, count, carried, ...}` (flag 0: nothing to settle, 1: a
    /// pending settlement, 2: the slot just renamed). Fields that do not parse
    /// are dropped (nothing is charged for them).
    pub fn from_reply(items: &[Vec<u8>]) -> Result<Option<Taken>, String> {
        let bad = || format!("unexpected tally take reply of {} items", items.len());
        let (flag, rest) = items.split_first().ok_or_else(bad)?;
        let flag: i64 = std::str::from_utf8(flag)
            .ok()
            .and_then(|f| f.parse().ok())
            .ok_or_else(bad)?;
        if flag == 0 {
            return Ok(None);
        }
        if rest.len() % 3 != 0 || !(1..=2).contains(&flag) {
            return Err(bad());
        }
        let number = |b: &[u8]| std::str::from_utf8(b).ok().and_then(|t| t.parse().ok());
        let entries = rest
            .chunks(3)
            .filter_map(|e| {
                let raw = String::from_utf8(e[0].clone()).ok()?;
                let field = Field::decode(&raw)?;
                let count: i64 = number(&e[1])?;
                let carried = number(&e[2]).unwrap_or(0i64).max(0) as u64;
                Some(Entry {
                    raw,
                    field,
                    count,
                    carried,
                })
            })
            .collect();
        Ok(Some(Taken {
            pending: flag == 1,
            entries,
        }))
    }
}

/// What a settlement does with what it took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Charged to the global buckets: (field, tokens).
    pub charges: Vec<(Entry, u64)>,
    /// Carried to a later settlement: (raw field, the carried count).
    pub carried: Vec<(String, u64)>,
    /// Carried before and charged now: dropped from the carry.
    pub uncarried: Vec<String>,
    /// Blocked when they were counted (charged whatever the carry).
    pub were_blocked: Vec<String>,
}

/// The settlement of `taken`: each bucket's count (less [`BLOCKED`] if it was
/// blocked; a negative count is chunk tokens unspent, charged nothing) plus its
/// carry is carried when at most its field's carry (and not blocked), else charged; a
/// blocked bucket is always in the charge (for 0 tokens if need be: the charge
/// reads whether it is still in debt). With `sweep`, everything is charged.
pub fn settle(taken: &Taken, sweep: bool) -> Settlement {
    let mut s = Settlement::default();
    for e in &taken.entries {
        // blocked once or more (each settlement that found the bucket in debt
        // adds a block): the count is what is left of the blocks
        let blocked = e.count >= BLOCKED / 2;
        let own = (e.count + BLOCKED / 2).rem_euclid(BLOCKED) - BLOCKED / 2;
        let total = own.max(0) as u64 + e.carried;
        if blocked {
            // charged whatever its count (0: the charge only reads the bucket),
            // so the settler learns whether it is still in debt
            s.were_blocked.push(e.raw.clone());
        } else if total == 0 {
            continue;
        }
        if total <= e.field.carry && !blocked && !sweep {
            if total != e.carried {
                s.carried.push((e.raw.clone(), total));
            }
            continue;
        }
        if e.carried > 0 {
            s.uncarried.push(e.raw.clone());
        }
        s.charges.push((e.clone(), total));
    }
    s
}

/// The arguments of `lua/tally_done.lua` for `s`, blocking `blocked`.
pub fn done_args(s: &Settlement, blocked: &[String], sweep: bool) -> Vec<String> {
    let mut args = vec![
        BLOCKED.to_string(),
        if sweep { "1" } else { "0" }.to_string(),
        s.carried.len().to_string(),
    ];
    for (raw, n) in &s.carried {
        args.extend([raw.clone(), n.to_string()]);
    }
    args.push(s.uncarried.len().to_string());
    args.extend(s.uncarried.iter().cloned());
    args.push(blocked.len().to_string());
    args.extend(blocked.iter().cloned());
    args
}

/// One bucket's tally on one instance: the tokens it drew, and what sizes the
/// next draw. Pure: the edge keeps one per bucket it decided lately
/// (`edge/src/pipeline/tally.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub tokens: u64,
    /// Spendable until then (local clock).
    pub until: Micros,
    /// Requests of the key on this instance since `since`.
    pub seen: u64,
    pub since: Micros,
    /// The epoch this instance last asked for a chunk in, after finding the
    /// credit spent (once per epoch).
    pub asked: i64,
    /// The region's credit and chunks were found spent: the exact path decides
    /// until then without asking the region.
    pub out_until: Micros,
    /// The count the region last replied for the key: below zero, its
    /// requests spend chunks (a draw of them dies with its epoch).
    pub last_count: i64,
    /// The last draw was spent to its last token before it died.
    pub spent_out: bool,
}

/// What an instance asks its region for a request of a bucket: `HINCRBY <slot
/// of epoch> <field> <cost + draw>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub epoch: i64,
    pub cost: u64,
    pub draw: u64,
}

impl Ask {
    /// What the increment adds.
    pub fn by(&self) -> i64 {
        (self.cost + self.draw) as i64
    }
}

/// How long an instance that found a key's credit spent sends it to the exact
/// path before asking its region again (a chunk may have come meanwhile: a
/// top-up takes a global round trip; asking a region found spent costs two
/// commands, the exact path four).
pub const OUT_FOR: Micros = 100 * MICROS_PER_MS;

impl Held {
    /// Counts a request of the key at `now` (its rate is measured over the last
    /// two epochs or so).
    pub fn record(&mut self, settings: &TallySettings, now: Micros) {
        if now - self.since > 2 * settings.epoch {
            self.since = now - settings.epoch;
            self.seen /= 2;
        }
        self.seen += 1;
    }

    /// Whether `cost` can be spent from what this instance drew.
    pub fn can_spend(&self, cost: u64, now: Micros) -> bool {
        now < self.until && self.tokens >= cost
    }

    /// Spends `cost` it [`Held::can_spend`].
    pub fn spend(&mut self, cost: u64) {
        self.tokens -= cost;
        self.spent_out = self.tokens == 0;
    }

    /// What to ask the region for a request of `cost` at `now` (its tokens at
    /// hand do not cover it): `None` while the region was found spent lately
    /// (the exact path decides).
    pub fn ask(
        &self,
        settings: &TallySettings,
        shares: &Shares,
        cost: u64,
        now: Micros,
    ) -> Option<Ask> {
        if now < self.out_until {
            return None;
        }
        let epoch = settings.epoch_of(now);
        // a draw of credit lives until the next epoch ends, one of chunks
        // until this one does
        let lives = epoch + i64::from(self.last_count >= 0);
        let left = settings.draw_until(lives) - now;
        // the request itself is not part of its draw
        let seen = self.seen.saturating_sub(1);
        let draw = draw_size(seen, now - self.since, left, shares, self.spent_out);
        Some(Ask { epoch, cost, draw })
    }

    /// The region counted `cost + draw` in `epoch`: what that means, and
    /// whether (why) this instance tops the slot up now.
    pub fn counted(
        &mut self,
        settings: &TallySettings,
        shares: &Shares,
        ask: Ask,
        after: i64,
        now: Micros,
    ) -> (Counted, Option<TopUp>) {
        let Ask { epoch, cost, draw } = ask;
        let by = ask.by();
        let c = counted(after, cost, draw, shares.credit);
        self.last_count = after;
        match c {
            Counted::Admitted => {
                self.tokens = draw;
                self.spent_out = false;
                // tokens of credit (the count stayed at or above zero) are
                // charged only after the next epoch: they may be spent until
                // it ends; tokens of chunks die with the chunks' epoch
                let credit = after - by >= 0;
                self.until = settings.draw_until(epoch + i64::from(credit));
            }
            Counted::WithoutDraw => self.tokens = 0,
            Counted::Over | Counted::Blocked => {
                self.out_until = now + OUT_FOR;
            }
        }
        let mut top_up = tops_up(after - by, after, shares).filter(|_| c != Counted::Blocked);
        if top_up.is_some() && c == Counted::Over {
            // once per epoch from the one that found the credit spent
            top_up = top_up.filter(|_| self.asked != epoch);
            self.asked = epoch;
        }
        (c, top_up)
    }

    /// A chunk this instance asked for landed: the region may admit again.
    pub fn topped_up(&mut self) {
        self.out_until = 0;
    }
}

/// The pure twin of one region's tally (the three slots, the settling slot and
/// the carry), as the scripts and plain commands change them.
#[cfg(any(test, feature = "twins"))]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionTally {
    pub slots: std::collections::BTreeMap<String, std::collections::BTreeMap<String, i64>>,
    pub carry: std::collections::BTreeMap<String, u64>,
}

#[cfg(any(test, feature = "twins"))]
impl RegionTally {
    /// `HINCRBY <slot> <field> <by>`.
    pub fn incr(&mut self, slot: &str, field: &str, by: i64) -> i64 {
        let n = self
            .slots
            .entry(slot.to_string())
            .or_default()
            .entry(field.to_string())
            .or_default();
        *n += by;
        *n
    }

    /// `lua/tally_take.lua` of `slot`.
    pub fn take(&mut self, slot: &str) -> Vec<Vec<u8>> {
        let pending = self.slots.contains_key(SETTLING_KEY);
        if !pending {
            match self.slots.remove(slot) {
                Some(h) => {
                    self.slots.insert(SETTLING_KEY.to_string(), h);
                }
                None => return vec![b"0".to_vec()],
            }
        }
        let flag = if pending { "1" } else { "2" };
        let mut reply = vec![flag.as_bytes().to_vec()];
        for (f, n) in &self.slots[SETTLING_KEY] {
            let carried = self.carry.get(f).copied().unwrap_or(0);
            reply.extend([
                f.as_bytes().to_vec(),
                n.to_string().into_bytes(),
                carried.to_string().into_bytes(),
            ]);
        }
        reply
    }

    /// `lua/tally_done.lua` with `args` ([`done_args`]), blocking in `others`.
    pub fn done(&mut self, others: [&str; 2], args: &[String]) -> Result<(), String> {
        let bad = || "ERR floodgate: bad tally done arguments".to_string();
        let blocked: i64 = args.first().and_then(|b| b.parse().ok()).ok_or_else(bad)?;
        let sweep = args.get(1).ok_or_else(bad)? == "1";
        let mut rest = &args[2..];
        let mut list = |per: usize| -> Result<Vec<Vec<String>>, String> {
            let n: usize = rest.first().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
            let items = rest.get(1..1 + n * per).ok_or_else(bad)?;
            let out = items.chunks(per).map(|c| c.to_vec()).collect();
            rest = &rest[1 + n * per..];
            Ok(out)
        };
        let (carried, uncarried, blocks) = (list(2)?, list(1)?, list(1)?);
        self.slots.remove(SETTLING_KEY);
        if sweep {
            self.carry.clear();
        }
        for c in carried {
            self.carry
                .insert(c[0].clone(), c[1].parse().map_err(|_| bad())?);
        }
        for u in uncarried {
            self.carry.remove(&u[0]);
        }
        for b in blocks {
            for slot in others {
                self.incr(slot, &b[0], blocked);
            }
        }
        Ok(())
    }

    /// `lua/tally_add.lua`: `HINCRBY <slot> <field> -<tokens>` while `now`
    /// (the regional store's clock) is before `until`.
    pub fn add(
        &mut self,
        slot: &str,
        field: &str,
        tokens: u64,
        now: Micros,
        until: Micros,
    ) -> bool {
        if now >= until {
            return false;
        }
        self.incr(slot, field, -(tokens as i64));
        true
    }
}

#[cfg(test)]
mod tests;
