//! The dashboard's `GET /metrics`: the fleet's totals, from the per-minute stats
//! every edge (Workers included, which cannot be scraped) writes to Redis (read
//! through [`crate::stats::store::minutes`]), as Prometheus counters `floodgate_fleet_*` with the
//! same series as one native edge's (`floodgate_edge::metrics::StatsMetrics`).
//!
//! Counters count from the dashboard's start: each scrape re-reads the last
//! [`LOOKBACK_MINUTES`] minutes (an edge flushes each second, so a minute's hash
//! still grows for a moment after it ends) and adds what grew since the last read.
//! A scrape while Redis is unreachable still answers: the counters as last read,
//! `floodgate_fleet_store_up 0` and one more `floodgate_fleet_scrape_errors_total`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use floodgate_edge::metrics::{StatsMetrics, render};
use floodgate_edge::stats::StatsSink;
use floodgate_edge::store::NativeStore;
use floodgate_shared::stats::StatsField;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::stats;
use crate::stats::store::Fields;

/// Minutes re-read at each scrape (the current one included).
pub const LOOKBACK_MINUTES: i64 = 5;
/// The longest a scrape waits for Redis.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);

/// The fleet's counters and what was read of each recent minute.
#[derive(Debug)]
pub struct Fleet {
    registry: Registry,
    stats: Arc<StatsMetrics>,
    up: Gauge,
    errors: Counter,
    /// minute → field → the value already counted.
    seen: tokio::sync::Mutex<BTreeMap<i64, HashMap<String, u64>>>,
}

impl Default for Fleet {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("floodgate_fleet");
        let stats = StatsMetrics::register(&mut registry);
        let up = Gauge::default();
        let errors = Counter::default();
        registry.register(
            "store_up",
            "1 when the last scrape read the stats hashes from Redis, 0 when it could not",
            up.clone(),
        );
        registry.register(
            "scrape_errors",
            "Scrapes that could not read the stats hashes from Redis",
            errors.clone(),
        );
        Self {
            registry,
            stats,
            up,
            errors,
            seen: Default::default(),
        }
    }
}

impl Fleet {
    /// Reads the recent minutes (at `now_secs`) and answers the scrape's text.
    pub async fn scrape(&self, store: &NativeStore, now_secs: i64) -> String {
        let mut seen = self.seen.lock().await;
        let minute = now_secs.div_euclid(60);
        let minutes: Vec<i64> = (minute - LOOKBACK_MINUTES + 1..=minute).collect();
        let read =
            tokio::time::timeout(READ_DEADLINE, stats::store::minutes(store, &minutes)).await;
        match read {
            Ok(Ok(hashes)) => {
                for (m, fields) in minutes.iter().zip(hashes) {
                    self.count(seen.entry(*m).or_default(), fields);
                }
                seen.retain(|m, _| *m > minute - LOOKBACK_MINUTES);
                self.up.set(1);
            }
            _ => {
                self.up.set(0);
                self.errors.inc();
            }
        }
        drop(seen);
        render(&[&self.registry])
    }

    /// Adds what each field grew since it was last read.
    fn count(&self, seen: &mut HashMap<String, u64>, fields: Fields) {
        for (name, value) in fields {
            let Ok(field) = name.parse::<StatsField>() else {
                continue; // another version's field
            };
            let before = seen.entry(name).or_default();
            if value > *before {
                self.stats.add(&field, value - *before);
                *before = value;
            }
        }
    }
}
