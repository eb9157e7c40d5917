//! Redis Cluster over our RESP connections: one [`RespStore`] per node, the slot map
//! from `CLUSTER SLOTS`, every call routed to the master of its keys' slot.
//!
//! - All keys of one call must share a slot (Floodgate's bucket keys carry the
//!   request's principal as their hash tag, `shared/src/keys.rs`); a call whose keys
//!   span slots is refused before anything is sent ([`StoreErrorKind::Protocol`]).
//! - `MOVED`: the slot has a new owner. The map is refreshed and the call goes to
//!   the new owner.
//! - `ASK`: the slot is being migrated and this key has moved already: `ASKING` and
//!   the script go to the target node back to back in one write; the map stays.
//! - `TRYAGAIN` (a multi-key call while its keys are split by a migration) and
//!   `CLUSTERDOWN`: a short pause and another try.
//!
//! At most [`MAX_ATTEMPTS`] tries per call; each try has the store's deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use floodgate_shared::Micros;
use floodgate_shared::script::{
    Check, IN_FLIGHT, LuaScript, REFUND, Verdict, When, refund_call, script_call,
};
use floodgate_shared::slot::{SLOTS, common_slot, key_slot};

use super::resp::RespStore;
use super::resp::wire::Reply;
use super::{BucketStore, MaybeSend, RecordStore, StoreError, StoreErrorKind};

/// Tries per call: the first, plus redirections / waits (an `ASK` and the call to
/// its target count as one). The waits for `TRYAGAIN` double from 2 ms: at most
/// 2 + 4 + 8 + 16 + 32 = 62 ms in all.
pub const MAX_ATTEMPTS: usize = 6;

/// What the cluster client did besides plain calls (tests and the benchmark).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClusterCounters {
    pub moved: u64,
    pub ask: u64,
    pub try_again: u64,
    pub refreshes: u64,
}

/// A Redis Cluster. Cheap to clone; clones share connections and the slot map.
#[derive(Clone)]
pub struct ClusterStore {
    inner: Arc<Inner>,
}

struct Inner {
    seeds: Vec<String>,
    deadline: Duration,
    nodes: Mutex<HashMap<String, RespStore>>,
    /// The master address ("host:port") of every slot; empty when unknown.
    slots: RwLock<Vec<Arc<str>>>,
    refresh: tokio::sync::Mutex<()>,
    moved: AtomicU64,
    ask: AtomicU64,
    try_again: AtomicU64,
    refreshes: AtomicU64,
}

fn err(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
    StoreError::new(kind, message)
}

/// A redirection or wait the cluster asked for.
enum Redirect {
    Moved(u16, String),
    Ask(String),
    Wait,
}

fn redirect(e: &StoreError) -> Option<Redirect> {
    if e.kind != StoreErrorKind::Redis {
        return None;
    }
    let mut words = e.message.split_whitespace();
    match words.next()? {
        "MOVED" => {
            let slot = words.next()?.parse().ok()?;
            Some(Redirect::Moved(slot, words.next()?.to_string()))
        }
        "ASK" => {
            words.next()?;
            Some(Redirect::Ask(words.next()?.to_string()))
        }
        "TRYAGAIN" | "CLUSTERDOWN" => Some(Redirect::Wait),
        _ => None,
    }
}

fn ints(reply: Reply) -> Result<Vec<i64>, StoreError> {
    match reply {
        Reply::Array(Some(items)) => items
            .into_iter()
            .map(|i| match i {
                Reply::Int(v) => Ok(v),
                other => Err(err(
                    StoreErrorKind::Protocol,
                    format!("non-integer in script reply: {other:?}"),
                )),
            })
            .collect(),
        Reply::Error(e) => Err(err(StoreErrorKind::Redis, e)),
        other => Err(err(
            StoreErrorKind::Protocol,
            format!("unexpected script reply: {other:?}"),
        )),
    }
}

impl ClusterStore {
    /// Connects through any of `seeds`: `redis+cluster://host:port[,host:port...]`
    /// or plain `host:port` items. Reads the slot map before returning.
    pub async fn connect(seeds: &str, deadline: Duration) -> Result<Self, StoreError> {
        let list = seeds
            .strip_prefix("redis+cluster://")
            .unwrap_or(seeds)
            .trim_end_matches('/');
        let seeds: Vec<String> = list
            .split(',')
            .map(|s| {
                s.trim()
                    .trim_start_matches("redis://")
                    .trim_end_matches('/')
            })
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if seeds.is_empty() {
            return Err(err(StoreErrorKind::Protocol, "no cluster node given"));
        }
        let store = Self {
            inner: Arc::new(Inner {
                seeds,
                deadline,
                nodes: Mutex::new(HashMap::new()),
                slots: RwLock::new(vec![Arc::from(""); usize::from(SLOTS)]),
                refresh: tokio::sync::Mutex::new(()),
                moved: AtomicU64::new(0),
                ask: AtomicU64::new(0),
                try_again: AtomicU64::new(0),
                refreshes: AtomicU64::new(0),
            }),
        };
        store.refresh().await?;
        Ok(store)
    }

    pub fn counters(&self) -> ClusterCounters {
        let i = &self.inner;
        ClusterCounters {
            moved: i.moved.load(Ordering::Relaxed),
            ask: i.ask.load(Ordering::Relaxed),
            try_again: i.try_again.load(Ordering::Relaxed),
            refreshes: i.refreshes.load(Ordering::Relaxed),
        }
    }

    /// The masters the slot map names, sorted.
    pub fn masters(&self) -> Vec<String> {
        let slots = self.inner.slots.read().expect("slot map");
        let mut m: Vec<String> = slots
            .iter()
            .filter(|a| !a.is_empty())
            .map(|a| a.to_string())
            .collect();
        m.sort();
        m.dedup();
        m
    }

    /// The master the map names for `slot` ("host:port"; empty when unknown).
    pub fn owner(&self, slot: u16) -> String {
        self.inner.slots.read().expect("slot map")[usize::from(slot)].to_string()
    }

    async fn node(&self, addr: &str) -> Result<RespStore, StoreError> {
        if let Some(n) = self.inner.nodes.lock().expect("nodes").get(addr) {
            return Ok(n.clone());
        }
        let fresh = RespStore::connect(&format!("redis://{addr}/"), self.inner.deadline).await?;
        Ok(self
            .inner
            .nodes
            .lock()
            .expect("nodes")
            .entry(addr.to_string())
            .or_insert(fresh)
            .clone())
    }

    /// Reads the slot map (`CLUSTER SLOTS`) from the first node that answers:
    /// the known masters first, then the seeds.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.inner.refresh.lock().await;
        self.inner.refreshes.fetch_add(1, Ordering::Relaxed);
        let mut candidates = self.masters();
        candidates.extend(self.inner.seeds.iter().cloned());
        let mut last = err(StoreErrorKind::Connect, "no cluster node answered");
        for addr in candidates {
            let reply = match self.node(&addr).await {
                Ok(n) => n.command(&[b"CLUSTER", b"SLOTS"]).await,
                Err(e) => Err(e),
            };
            match reply.and_then(|r| parse_slots(r, &addr)) {
                Ok(ranges) if !ranges.is_empty() => {
                    let mut map = self.inner.slots.write().expect("slot map");
                    for (start, end, master) in ranges {
                        let master: Arc<str> = Arc::from(master.as_str());
                        for s in start..=end {
                            map[usize::from(s)] = master.clone();
                        }
                    }
                    return Ok(());
                }
                Ok(_) => last = err(StoreErrorKind::Redis, format!("{addr}: no slots served")),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Runs `script` on the master of its keys' slot, following redirections.
    pub async fn eval_script(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        let slot = common_slot(keys.iter().copied())
            .map_err(|e| err(StoreErrorKind::Protocol, e.to_string()))?
            .ok_or_else(|| err(StoreErrorKind::Protocol, "a script call needs a key"))?;
        let mut addr = self.owner(slot);
        let mut asking: Option<String> = None;
        let mut last = err(StoreErrorKind::Connect, "no attempt");
        // an ASK is followed at once by the call to its target, in the same attempt
        let mut attempt = 0;
        let mut steps = 0;
        while attempt < MAX_ATTEMPTS && steps < 2 * MAX_ATTEMPTS {
            steps += 1;
            if addr.is_empty() {
                self.refresh().await?;
                addr = self.owner(slot);
                if addr.is_empty() {
                    return Err(err(
                        StoreErrorKind::Redis,
                        format!("CLUSTERDOWN slot {slot} is not served"),
                    ));
                }
            }
            let result = match asking.take() {
                Some(target) => self.ask(&target, script, keys, args).await,
                None => match self.node(&addr).await {
                    Ok(n) => n.eval_script(script, keys, args).await,
                    Err(e) => Err(e),
                },
            };
            let e = match result {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match redirect(&e) {
                Some(Redirect::Moved(s, to)) => {
                    self.inner.moved.fetch_add(1, Ordering::Relaxed);
                    self.inner.slots.write().expect("slot map")[usize::from(s) % 16384] =
                        Arc::from(to.as_str());
                    // the whole map most likely changed: read it again, but keep going
                    // with the address the server named if the refresh fails
                    let _ = self.refresh().await;
                    addr = if s == slot { self.owner(slot) } else { to };
                    if addr.is_empty() {
                        addr = self.owner(slot);
                    }
                }
                Some(Redirect::Ask(to)) => {
                    self.inner.ask.fetch_add(1, Ordering::Relaxed);
                    asking = Some(to);
                    last = e;
                    continue;
                }
                Some(Redirect::Wait) => {
                    self.inner.try_again.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2 << attempt)).await;
                }
                None if e.is_retryable() => {
                    // a lost node (failover): re-read the map once before the next try
                    let _ = self.refresh().await;
                    addr = self.owner(slot);
                }
                None => return Err(e),
            }
            attempt += 1;
            last = e;
        }
        Err(last)
    }

    /// `ASKING` and the script (by source: the target may not know its SHA-1) in
    /// one write to the node importing the slot.
    async fn ask(
        &self,
        target: &str,
        script: &LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        let node = self.node(target).await?;
        let numkeys = keys.len().to_string();
        let words = script.call_words(true, &numkeys, keys.iter().copied(), args);
        let call: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let mut replies = node.batch(&[vec![b"ASKING".to_vec()], call]).await?;
        match (replies.pop(), replies.pop()) {
            (Some(script_reply), Some(Reply::Simple(_))) => ints(script_reply),
            (_, Some(Reply::Error(e))) => Err(err(StoreErrorKind::Redis, e)),
            other => Err(err(
                StoreErrorKind::Protocol,
                format!("unexpected ASKING reply {other:?}"),
            )),
        }
    }

    /// One command on the master of `key`'s slot, following `MOVED` once.
    pub async fn command_for(&self, key: &str, args: &[&[u8]]) -> Result<Reply, StoreError> {
        let slot = key_slot(key);
        let mut addr = self.owner(slot);
        for _ in 0..2 {
            if addr.is_empty() {
                self.refresh().await?;
                addr = self.owner(slot);
            }
            let reply = self.node(&addr).await?.command(args).await?;
            match &reply {
                Reply::Error(e) if e.starts_with("MOVED ") => {
                    self.inner.moved.fetch_add(1, Ordering::Relaxed);
                    let _ = self.refresh().await;
                    addr = e.split_whitespace().nth(2).unwrap_or_default().to_string();
                }
                _ => return Ok(reply),
            }
        }
        Err(err(StoreErrorKind::Redis, format!("{key}: moved twice")))
    }
}

/// `CLUSTER SLOTS` → (first slot, last slot, master "host:port"). An empty host
/// means "the node you asked" (`from`).
fn parse_slots(reply: Reply, from: &str) -> Result<Vec<(u16, u16, String)>, StoreError> {
    let bad = |what: String| err(StoreErrorKind::Protocol, format!("CLUSTER SLOTS: {what}"));
    let ranges = match reply {
        Reply::Array(Some(r)) => r,
        Reply::Error(e) => return Err(err(StoreErrorKind::Redis, e)),
        other => return Err(bad(format!("{other:?}"))),
    };
    let from_host = from.rsplit_once(':').map_or(from, |(h, _)| h);
    let mut out = vec![];
    for range in ranges {
        let Reply::Array(Some(items)) = range else {
            return Err(bad("a range is not an array".into()));
        };
        match items.as_slice() {
            [
                Reply::Int(start),
                Reply::Int(end),
                Reply::Array(Some(master)),
                ..,
            ] => {
                let host = match master.first() {
                    Some(Reply::Bulk(Some(h))) if !h.is_empty() => {
                        String::from_utf8_lossy(h).into_owned()
                    }
                    _ => from_host.to_string(),
                };
                let Some(Reply::Int(port)) = master.get(1) else {
                    return Err(bad("no master port".into()));
                };
                let (Ok(s), Ok(e)) = (u16::try_from(*start), u16::try_from(*end)) else {
                    return Err(bad("slot out of range".into()));
                };
                if s > e || e >= SLOTS {
                    return Err(bad(format!("bad range {s}-{e}")));
                }
                out.push((s, e, format!("{host}:{port}")));
            }
            other => return Err(bad(format!("{other:?}"))),
        }
    }
    Ok(out)
}

impl BucketStore for ClusterStore {
    async fn run(
        &self,
        script: &'static LuaScript,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        self.eval_script(script, keys, args).await
    }

    async fn check(
        &self,
        checks: &[Check<'_>],
        when: impl Into<When> + MaybeSend,
    ) -> Result<Verdict, StoreError> {
        let (script, args) = script_call(checks, when)?;
        let keys: Vec<&str> = checks.iter().map(|c| c.key).collect();
        let reply = self.eval_script(script, &keys, &args).await?;
        super::verdict(checks, &reply)
    }

    async fn refund(&self, checks: &[Check<'_>], verdict: &Verdict) -> Result<(), StoreError> {
        match refund_call(checks, verdict) {
            Some((keys, args)) => self.eval_script(&REFUND, &keys, &args).await.map(|_| ()),
            None => Ok(()),
        }
    }

    async fn acquire_slot(
        &self,
        key: &str,
        id: &str,
        limit: u32,
        ttl_ms: u64,
        until: Option<Micros>,
    ) -> Result<bool, StoreError> {
        let args = super::slot_args(id, limit, ttl_ms, until);
        super::slot_taken(&self.eval_script(&IN_FLIGHT, &[key], &args).await?)
    }

    async fn release_slot(&self, key: &str, id: &str) -> Result<(), StoreError> {
        match self
            .command_for(key, &[b"ZREM", key.as_bytes(), id.as_bytes()])
            .await?
        {
            Reply::Error(e) => Err(err(StoreErrorKind::Redis, e)),
            _ => Ok(()),
        }
    }
}

impl RecordStore for ClusterStore {
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.command_for(key, &[b"GET", key.as_bytes()]).await? {
            Reply::Bulk(v) => Ok(v),
            Reply::Error(e) if e.starts_with("WRONGTYPE") => Ok(None),
            Reply::Error(e) => Err(err(StoreErrorKind::Redis, e)),
            other => Err(err(
                StoreErrorKind::Protocol,
                format!("unexpected GET reply {other:?}"),
            )),
        }
    }

    /// Each command goes to the master of its first key (commands are not atomic
    /// together anyway).
    async fn write_batch(&self, commands: Vec<Vec<String>>) -> Result<(), StoreError> {
        for c in commands {
            let Some(key) = c.get(1) else { continue };
            let args: Vec<&[u8]> = c.iter().map(|w| w.as_bytes()).collect();
            if let Reply::Error(e) = self.command_for(key, &args).await? {
                return Err(err(StoreErrorKind::Redis, e));
            }
        }
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let addr = self
            .masters()
            .into_iter()
            .next()
            .ok_or_else(|| err(StoreErrorKind::Connect, "no master known"))?;
        self.node(&addr).await?.ping().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirections_are_parsed() {
        let e = |m: &str| err(StoreErrorKind::Redis, m);
        assert!(matches!(
            redirect(&e("MOVED 3999 127.0.0.1:6381")),
            Some(Redirect::Moved(3999, a)) if a == "127.0.0.1:6381"
        ));
        assert!(matches!(
            redirect(&e("ASK 3999 127.0.0.1:6381")),
            Some(Redirect::Ask(a)) if a == "127.0.0.1:6381"
        ));
        assert!(matches!(
            redirect(&e(
                "TRYAGAIN Multiple keys request during rehashing of slot"
            )),
            Some(Redirect::Wait)
        ));
        assert!(redirect(&e("ERR floodgate: bad")).is_none());
        assert!(redirect(&err(StoreErrorKind::Connect, "MOVED 1 a:1")).is_none());
    }

    #[test]
    fn slot_map_replies_are_parsed_and_checked() {
        let bulk = |s: &str| Reply::Bulk(Some(s.as_bytes().to_vec()));
        let range = |s: i64, e: i64, host: &str, port: i64| {
            Reply::Array(Some(vec![
                Reply::Int(s),
                Reply::Int(e),
                Reply::Array(Some(vec![bulk(host), Reply::Int(port), bulk("id")])),
                Reply::Array(Some(vec![bulk(host), Reply::Int(port + 1), bulk("id2")])),
            ]))
        };
        let parsed = parse_slots(
            Reply::Array(Some(vec![
                range(0, 5460, "127.0.0.1", 7000),
                range(5461, 16383, "", 7002),
            ])),
            "10.0.0.1:7000",
        )
        .unwrap();
        assert_eq!(
            parsed,
            vec![
                (0, 5460, "127.0.0.1:7000".to_string()),
                (5461, 16383, "10.0.0.1:7002".to_string())
            ]
        );
        assert!(parse_slots(Reply::Array(Some(vec![range(5, 16384, "h", 1)])), "x:1").is_err());
        assert!(parse_slots(Reply::Array(Some(vec![range(9, 5, "h", 1)])), "x:1").is_err());
    }
}
