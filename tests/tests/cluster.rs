//! The native store against a real Redis Cluster on loopback (3 masters + 3
//! replicas, joined by `redis-cli --cluster create`): slots as Redis computes them,
//! routing, MOVED, ASK, and a slot migration under load.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_edge::store::cluster::ClusterStore;
use floodgate_edge::store::{Store, StoreErrorKind};
use floodgate_shared::keys::{Subject, bucket_key};
use floodgate_shared::policy::{Policy, Quota};
use floodgate_shared::script::Check;
use floodgate_shared::slot::{common_slot, key_slot};
use floodgate_tests::cluster::RedisCluster;
use rand::{Rng, SeedableRng};

fn check<'a>(key: &'a str, q: &'a Quota) -> Check<'a> {
    Check {
        key,
        quota: q,
        cost: 1,
        shadow: false,
    }
}

/// Our slot function agrees with `CLUSTER KEYSLOT`; checks reach the owning
/// master (and only it holds the bucket); one principal's buckets go in one call;
/// keys of two principals are refused; stale maps follow MOVED; a half-migrated
/// slot follows ASK; no bucket forgets what it admitted along the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_store_routes_by_slot_and_follows_moved_and_ask() {
    let cluster = RedisCluster::start(3, 1);
    let mut c = cluster.nodes[0].connection();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    for i in 0..300 {
        let key = match i % 3 {
            0 => format!("fg:{{k:{}}}:p", rng.random::<u32>()),
            1 => format!("plain-{}", rng.random::<u64>()),
            _ => format!("x{{}}{{{}}}", rng.random::<u16>()),
        };
        let redis_slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut c)
            .unwrap();
        assert_eq!(key_slot(&key), redis_slot, "{key}");
    }

    let store = ClusterStore::connect(&cluster.url(), Duration::from_secs(2))
        .await
        .unwrap();
    let q = Quota::per_minute(10).unwrap();

    // every algorithm, and shadow buckets, run on the cluster too (lua/limiter.lua,
    // routed like the token bucket): a fixed window of 3 with a shadow log of 1
    {
        use floodgate_shared::policy::Algorithm;
        let fixed = Quota::new(3, 3, 60_000_000)
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap();
        let log = Quota::new(1, 1, 60_000_000)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        let (a, b) = ("fg:{k:algos}:fixed", "fg:{k:algos}:log");
        let mut admitted = 0;
        let mut shadow_denials = 0;
        for _ in 0..5 {
            let v = store
                .check(
                    &[
                        check(a, &fixed),
                        Check {
                            shadow: true,
                            ..check(b, &log)
                        },
                    ],
                    None,
                )
                .await
                .unwrap();
            admitted += u32::from(v.admitted);
            shadow_denials += u32::from(v.admitted && v.shadow_denied());
        }
        assert_eq!((admitted, shadow_denials), (3, 2));
    }

    // 30 principals: each bucket lives on its slot's master only
    for i in 0..30 {
        let key = format!("fg:{{k:route{i}}}:p");
        assert!(
            store
                .check(&[check(&key, &q)], None)
                .await
                .unwrap()
                .admitted
        );
        let owner = cluster.owner(key_slot(&key));
        for (n, node) in cluster.nodes[..3].iter().enumerate() {
            let got: redis::RedisResult<Option<String>> =
                redis::cmd("GET").arg(&key).query(&mut node.connection());
            if n == owner {
                assert!(got.unwrap().is_some(), "{key} on its owner");
            } else {
                assert!(
                    got.is_err(),
                    "{key} answered by a non-owner: MOVED expected"
                );
            }
        }
    }

    // the demo configuration's per-key buckets share a slot; an IP policy does not
    let plan = Policy::from_json(r#"{"name":"default","dimensions":["api_key"],"quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed"}"#).unwrap();
    let route = Policy::from_json(r#"{"name":"search","dimensions":["api_key","endpoint"],"quota":{"capacity":100,"period":"1m"},"failure_mode":"fail_closed"}"#).unwrap();
    let per_ip = Policy::from_json(r#"{"name":"ip","dimensions":["client_ip"],"quota":{"capacity":100,"period":"1m"},"failure_mode":"fail_closed"}"#).unwrap();
    let subject = Subject {
        api_key_id: Some("acme"),
        route: Some("search"),
        client_ip: Some("203.0.113.9".parse().unwrap()),
    };
    let (k1, k2, k3) = (
        bucket_key(&plan, &subject).unwrap(),
        bucket_key(&route, &subject).unwrap(),
        bucket_key(&per_ip, &subject).unwrap(),
    );
    assert!(common_slot([k1.as_str(), k2.as_str()]).unwrap().is_some());
    let v = store
        .check(&[check(&k1, &q), check(&k2, &q)], None)
        .await
        .unwrap();
    assert!(v.admitted && v.decisions.len() == 2);
    assert_ne!(key_slot(&k1), key_slot(&k3), "pick an IP in another slot");
    let e = store
        .check(&[check(&k1, &q), check(&k3, &q)], None)
        .await
        .unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Protocol);
    assert!(e.message.contains("different Redis Cluster slots"), "{e}");
    // ...and the refused call consumed nothing
    let v = store.check(&[check(&k1, &q)], None).await.unwrap();
    assert_eq!(v.decisions[0].remaining, 10 - 2);

    // exactness through the cluster: 10 of 25 admitted
    let hot = "fg:{k:exact}:p".to_string();
    let mut admitted = 0;
    for _ in 0..25 {
        admitted += usize::from(
            store
                .check(&[check(&hot, &q)], None)
                .await
                .unwrap()
                .admitted,
        );
    }
    assert_eq!(admitted, 10);

    // MOVED: another client moves the slot; our map is stale and must follow
    let slot = key_slot(&hot);
    let from = cluster.owner(slot);
    let to = (from + 1) % 3;
    cluster.move_slot(slot, from, to);
    let before = cluster.errors_sent("MOVED");
    let v = store.check(&[check(&hot, &q)], None).await.unwrap();
    assert!(!v.admitted, "the bucket moved with its state");
    let after = cluster.errors_sent("MOVED");
    assert!(after > before, "the stale map met a MOVED");
    // the map was refreshed: the next call goes straight to the new owner
    store.check(&[check(&hot, &q)], None).await.unwrap();
    assert_eq!(cluster.errors_sent("MOVED"), after, "no second MOVED");

    // ASK: a slot half-way through a migration, our bucket already on the target
    let ask_key = "fg:{k:asking}:p".to_string();
    for _ in 0..3 {
        assert!(
            store
                .check(&[check(&ask_key, &q)], None)
                .await
                .unwrap()
                .admitted
        );
    }
    let slot = key_slot(&ask_key);
    let from = cluster.owner(slot);
    let to = (from + 1) % 3;
    cluster.begin_migration(slot, from, to);
    assert_eq!(cluster.migrate_keys(slot, from, to, 100), 1);
    let (ask_before, moved_before) = (cluster.errors_sent("ASK"), cluster.errors_sent("MOVED"));
    let v = store.check(&[check(&ask_key, &q)], None).await.unwrap();
    assert!(v.admitted);
    assert_eq!(v.decisions[0].remaining, 10 - 4, "state carried by MIGRATE");
    assert!(
        cluster.errors_sent("ASK") > ask_before,
        "the call followed an ASK"
    );
    assert_eq!(
        cluster.errors_sent("MOVED"),
        moved_before,
        "ASK is no MOVED"
    );
    cluster.finish_migration(slot, from, to);
    let v = store.check(&[check(&ask_key, &q)], None).await.unwrap();
    assert_eq!(v.decisions[0].remaining, 10 - 5);
}

/// Checks of 24 buckets of one principal (one slot), single- and two-bucket calls,
/// from 4 tasks while the slot migrates to another master key by key: nothing is
/// admitted past `capacity + refill × elapsed` in any bucket, and no call fails
/// (MOVED, ASK and TRYAGAIN are absorbed by the bounded retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_under_load_admits_nothing_above_quota() {
    let cluster = RedisCluster::start(3, 1);
    let store = ClusterStore::connect(&cluster.url(), Duration::from_secs(2))
        .await
        .unwrap();
    // 40 per bucket, refilling 40/h: over a 10 s bound at most 40 + 1 tokens
    let q = Arc::new(Quota::new(40, 40, 3_600_000_000).unwrap());
    let keys: Arc<Vec<String>> = Arc::new(
        (0..24)
            .map(|i| format!("fg:{{k:migrating}}:p{i}"))
            .collect(),
    );
    let total = "fg:{k:migrating}:total".to_string();
    let q_total = Arc::new(Quota::new(400, 400, 3_600_000_000).unwrap());
    let slot = key_slot(&total);
    // create every bucket before the migration starts
    for k in keys.iter() {
        assert!(store.check(&[check(k, &q)], None).await.unwrap().admitted);
    }
    let done = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = vec![];
    for t in 0..4u64 {
        let (store, q, q_total, keys, done, errors, total) = (
            store.clone(),
            q.clone(),
            q_total.clone(),
            keys.clone(),
            done.clone(),
            errors.clone(),
            total.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t);
            let mut admitted: HashMap<String, u64> = HashMap::new();
            let mut calls = 0u64;
            // bounded: at most 20,000 calls or 10 s per task
            while calls < 20_000 && started.elapsed() < Duration::from_secs(10) {
                if done.load(Ordering::Relaxed) && calls > 200 {
                    break;
                }
                calls += 1;
                let k = &keys[rng.random_range(0..keys.len())];
                let pair = rng.random_bool(0.5);
                let result = if pair {
                    let checks = [
                        check(k, &q),
                        Check {
                            key: &total,
                            quota: &q_total,
                            cost: 1,
                            shadow: false,
                        },
                    ];
                    store.check(&checks, None).await
                } else {
                    store.check(&[check(k, &q)], None).await
                };
                match result {
                    Ok(v) if v.admitted => {
                        *admitted.entry(k.clone()).or_default() += 1;
                        if pair {
                            *admitted.entry(total.clone()).or_default() += 1;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("call failed: {e}");
                    }
                }
            }
            (admitted, calls)
        }));
    }
    // migrate while the tasks run: 4 keys per MIGRATE, 5 ms apart
    tokio::time::sleep(Duration::from_millis(100)).await;
    let from = cluster.owner(slot);
    let to = (from + 1) % 3;
    let migrated = tokio::task::spawn_blocking({
        move || {
            cluster.begin_migration(slot, from, to);
            let mut moved = 0;
            loop {
                let n = cluster.migrate_keys(slot, from, to, 4);
                if n == 0 {
                    break;
                }
                moved += n;
                std::thread::sleep(Duration::from_millis(5));
            }
            cluster.finish_migration(slot, from, to);
            (cluster, moved)
        }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    done.store(true, Ordering::Relaxed);
    let mut admitted: HashMap<String, u64> = HashMap::new();
    let mut calls = 0;
    for t in tasks {
        let (a, c) = t.await.unwrap();
        calls += c;
        for (k, n) in a {
            *admitted.entry(k).or_default() += n;
        }
    }
    let elapsed = started.elapsed();
    let (cluster, moved) = migrated;
    let redirected = (
        cluster.errors_sent("MOVED"),
        cluster.errors_sent("ASK"),
        cluster.errors_sent("TRYAGAIN"),
    );
    eprintln!(
        "{calls} calls in {elapsed:?}; {moved} keys migrated; MOVED/ASK/TRYAGAIN sent {redirected:?}; errors {}",
        errors.load(Ordering::Relaxed)
    );
    assert_eq!(moved, 25, "every bucket moved");
    assert_eq!(cluster.owner(slot), to);
    assert!(
        redirected.0 + redirected.1 > 0,
        "the load saw the migration"
    );
    // the analytical maximum: capacity + refill over the run (+1 for the creation)
    let refill = |cap: u64| (cap as f64 * elapsed.as_secs_f64() / 3600.0).ceil() as u64;
    for k in keys.iter() {
        let got = admitted.get(k).copied().unwrap_or(0) + 1;
        assert!(got <= 40 + refill(40), "{k}: {got} admitted");
    }
    let total_admitted = admitted.get(&total).copied().unwrap_or(0);
    assert!(
        total_admitted <= 400 + refill(400),
        "total {total_admitted}"
    );
    // every bucket was drained: the load really hit the limit on both sides
    assert!(
        keys.iter()
            .all(|k| admitted.get(k).copied().unwrap_or(0) + 1 >= 40)
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0, "no call failed");
}

/// A cluster whose every node requires a password: the store authenticates to
/// every node it discovers (routing, MOVED to a node never named in the URL),
/// admin writes (the audited configuration save, keys) work on it, and a wrong
/// password fails fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_nodes_require_a_password_is_served_by_every_node() {
    use floodgate_edge::admin::{self, Basis};
    let cluster = RedisCluster::start_with_password(3, 0, "cluster-s3cret");
    let only_seed = cluster.url().split(',').next().unwrap().to_string();
    let e = ClusterStore::connect(
        &only_seed.replace("cluster-s3cret", "wrong"),
        Duration::from_secs(1),
    )
    .await
    .err()
    .expect("a wrong password is refused");
    assert_eq!(e.kind, StoreErrorKind::Auth, "{e}");
    // one seed only: the other masters are found, and authenticated to, by the client
    let store = ClusterStore::connect(&only_seed, Duration::from_secs(2))
        .await
        .unwrap();
    let q = Quota::per_minute(10).unwrap();
    let mut owners = std::collections::HashSet::new();
    for i in 0..30 {
        let key = format!("fg:{{k:auth{i}}}:p");
        assert!(
            store
                .check(&[check(&key, &q)], None)
                .await
                .unwrap()
                .admitted
        );
        owners.insert(cluster.owner(key_slot(&key)));
    }
    assert_eq!(owners.len(), 3, "every master served some");
    // a MOVED to another node, on the password cluster
    let hot = "fg:{k:auth0}:p";
    let slot = key_slot(hot);
    let from = cluster.owner(slot);
    cluster.move_slot(slot, from, (from + 1) % 3);
    let v = store.check(&[check(hot, &q)], None).await.unwrap();
    assert_eq!(v.decisions[0].remaining, 10 - 2, "state moved along");

    // the admin paths over the cluster
    let (config, version) = admin::replace_config(
        &store,
        floodgate_tests::DEMO_CONFIG,
        Basis::Unversioned,
        "test",
        1,
    )
    .await
    .unwrap();
    assert!(config.has_plan("free"));
    let (current, text) = admin::load_config(&store).await.unwrap();
    assert_eq!(current, version);
    assert!(text.is_some());
    let (record, _) = admin::create_key(&store, "acme", "free", 1).await.unwrap();
    assert_eq!(admin::list_keys(&store).await.unwrap()[0].id, record.id);
    admin::revoke_key(&store, &record.id).await.unwrap();
    assert_eq!(admin::audit_log(&store, 10).await.unwrap().len(), 1);
}
