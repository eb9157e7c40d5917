//! The records' revision (issue 22, "bookkeeping at chunk cost"): cached records
//! are read again only when the revision says they changed — learned for free
//! from every exact decision, otherwise checked once per TTL — and what is read
//! again is what the change log names. A missing or corrupt revision means
//! "read everything again", never "nothing changed".

mod common;

use std::sync::atomic::Ordering;

use common::{MemStore, T0, advance, changed, head, mem, seed, set_key_status, settle, status};
use floodgate_edge::pipeline::{Pipeline, PipelineConfig};
use floodgate_shared::apikeys::KeyStatus;
use floodgate_shared::changes::{Change, REV_KEY};
use floodgate_shared::time::{FakeClock, MICROS_PER_SEC};

const CONFIG: &str = r#"{"policies":[
  {"name":"default","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed"},
  {"name":"bounded","dimensions":["api_key"],"quota":{"capacity":100000,"period":"1m"},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":200}],
  "plans":{"free":["default"],"bounded":["bounded"]}}"#;

fn settings() -> PipelineConfig {
    PipelineConfig {
        cache_ttl: MICROS_PER_SEC,
        ..PipelineConfig::default()
    }
}

fn reads(store: &MemStore) -> (usize, usize) {
    (
        store.gets.load(Ordering::SeqCst),
        store.rev_reads.load(Ordering::SeqCst),
    )
}

/// Before: every instance read its configuration and key records again every TTL
/// (a billed command each time). Now a busy instance learns the revision from its
/// decisions: a minute of steady traffic reads nothing again, and a revocation is
/// seen from the decision after the one that told of it.
#[tokio::test]
async fn a_busy_instance_reads_its_records_again_only_when_they_changed() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, settings());
    for _ in 0..600 {
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
        advance(&clock, store, 100_000);
    }
    assert_eq!(
        reads(store),
        (2, 1),
        "60 TTLs of traffic: the configuration and the key read once, with the revision"
    );
    set_key_status(store, KeyStatus::Revoked);
    let told = settle(p.gate(head(&auth)).await).await;
    assert_eq!(status(&told), 200, "this decision told of the change");
    assert_eq!(
        status(&p.gate(head(&auth)).await.gate),
        401,
        "the next one is refused"
    );
    assert_eq!(reads(store), (3, 1), "only the revoked key was read again");
}

/// An instance deciding from leases makes no store call: it checks the revision
/// once per TTL in the background, and sees a revocation within two TTLs.
#[tokio::test]
async fn a_leasing_instance_checks_the_revision_once_per_ttl() {
    let store = mem();
    let auth = seed(store, CONFIG, "bounded");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, settings());
    for _ in 0..100 {
        let _ = settle(p.gate(head(&auth)).await).await;
        advance(&clock, store, 50_000);
    }
    let (gets, checks) = reads(store);
    assert_eq!(gets, 2, "the records were read once");
    assert!(
        (4..=6).contains(&checks),
        "5 s of traffic at a 1 s TTL: about one check per TTL, got {checks}"
    );
    set_key_status(store, KeyStatus::Revoked);
    let mut refused_after = None;
    for i in 0..60 {
        if status(&settle(p.gate(head(&auth)).await).await) == 401 {
            refused_after = Some(i * 50_000);
            break;
        }
        advance(&clock, store, 50_000);
    }
    let after = refused_after.expect("the revocation was seen");
    assert!(after <= 2 * MICROS_PER_SEC, "seen after {after} µs");
}

/// A revision that is missing or not a number is never "unchanged": the
/// instance reads everything again, and starts the counter so the next check
/// can confirm.
#[tokio::test]
async fn a_missing_or_corrupt_revision_means_everything_is_read_again() {
    for corrupt in [None, Some(&b"not a number"[..])] {
        let store = mem();
        let auth = seed(store, CONFIG, "free");
        let clock = FakeClock::at(T0);
        let p = Pipeline::new(store, &clock, settings());
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
        {
            let mut records = store.records.lock().unwrap();
            match corrupt {
                None => records.remove(REV_KEY),
                Some(v) => records.insert(REV_KEY.into(), v.to_vec()),
            };
        }
        let (gets, _) = reads(store);
        assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
        assert_eq!(
            reads(store).0,
            gets + 2,
            "{corrupt:?}: the configuration and the key read again"
        );
        if corrupt.is_none() {
            let rev = store.records.lock().unwrap().get(REV_KEY).cloned();
            assert_eq!(rev.as_deref(), Some(&b"0"[..]), "the counter is started");
        }
    }
}

/// The change log names what changed: a configuration save reads the
/// configuration again, not the keys; a log that does not account for every
/// revision reads everything.
#[tokio::test]
async fn the_change_log_names_what_to_read_again() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(store, &clock, settings());
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    changed(store, Change::Config);
    let _ = settle(p.gate(head(&auth)).await).await;
    assert_eq!(reads(store).0, 3, "the configuration read again, alone");
    // two revisions, the log holding one: everything
    changed(store, Change::Config);
    changed(store, Change::Config);
    store.log.lock().unwrap().remove(1);
    let _ = settle(p.gate(head(&auth)).await).await;
    assert_eq!(reads(store).0, 5, "a gap in the log: both read again");
}

/// A writer that does not bump the revision (an older CLI) is still seen: a key
/// record is read again `records_max_age` after it was read, whatever the
/// revision says.
#[tokio::test]
async fn a_change_without_a_revision_is_seen_within_the_records_max_age() {
    let store = mem();
    let auth = seed(store, CONFIG, "free");
    let clock = FakeClock::at(T0);
    let p = Pipeline::new(
        store,
        &clock,
        PipelineConfig {
            records_max_age: 10 * MICROS_PER_SEC,
            ..settings()
        },
    );
    assert_eq!(status(&settle(p.gate(head(&auth)).await).await), 200);
    {
        // revoked behind the revision's back
        let mut records = store.records.lock().unwrap();
        let key = records
            .keys()
            .find(|k| k.starts_with("fg:apikey:"))
            .cloned()
            .unwrap();
        let text = String::from_utf8(records[&key].clone()).unwrap();
        records.insert(key, text.replace("\"active\"", "\"revoked\"").into_bytes());
    }
    let mut refused_at = None;
    for s in 0..15 {
        if status(&settle(p.gate(head(&auth)).await).await) == 401 {
            refused_at = Some(s);
            break;
        }
        advance(&clock, store, MICROS_PER_SEC);
    }
    let s = refused_at.expect("the revocation was seen");
    assert!((9..=12).contains(&s), "seen after {s} s");
}
