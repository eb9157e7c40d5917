//! Exactness under concurrency: 50 clients, each on its own Redis connection,
//! hammer one bucket. The admitted count must equal the analytical maximum exactly,
//! in every randomized run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate_edge::store::Store;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;
use floodgate_shared::time::MICROS_PER_SEC;
use floodgate_tests::{RedisServer, unique_key};
use rand::Rng;

const CLIENTS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_connections_admit_exactly_the_analytical_maximum() {
    let server = RedisServer::start();
    let mut stores = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        stores.push(Arc::new(
            RespStore::connect(&server.url(), Duration::from_secs(10))
                .await
                .unwrap(),
        ));
    }
    let mut rng = rand::rng();
    for run in 0..5 {
        // capacity around 1000, refill so slow (one token per 1-6 h) that the run
        // sees none: a refilled token would show in the bound below.
        let capacity = rng.random_range(900..=1100u64);
        let period = rng.random_range(1..=6i64) * 3_600 * MICROS_PER_SEC;
        let quota = Quota::new(capacity, 1, period).unwrap();
        let per_client =
            rng.random_range(capacity as usize / CLIENTS + 5..=capacity as usize / CLIENTS * 2);
        let key = unique_key("exact");
        let admitted = Arc::new(AtomicU64::new(0));
        let denied = Arc::new(AtomicU64::new(0));
        let first = stores[0]
            .check(
                &[Check {
                    key: "fg:{clock}:probe",
                    quota: &quota,
                    cost: 0,
                    shadow: false,
                }],
                None,
            )
            .await
            .unwrap()
            .now;

        let mut tasks = vec![];
        for store in &stores {
            let (store, key, admitted, denied) =
                (store.clone(), key.clone(), admitted.clone(), denied.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_client {
                    let v = store
                        .check(
                            &[Check {
                                key: &key,
                                quota: &quota,
                                cost: 1,
                                shadow: false,
                            }],
                            None,
                        )
                        .await
                        .unwrap();
                    if v.admitted { &admitted } else { &denied }.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let last = stores[0]
            .check(
                &[Check {
                    key: &key,
                    quota: &quota,
                    cost: 0,
                    shadow: false,
                }],
                None,
            )
            .await
            .unwrap();
        let elapsed = last.now - first;
        let attempts = (per_client * CLIENTS) as u64;
        let refilled = (elapsed / quota.emission_interval()) as u64;
        let maximum = attempts.min(capacity + refilled);
        let got = admitted.load(Ordering::Relaxed);
        assert_eq!(
            got, maximum,
            "run {run}: capacity {capacity}, {attempts} attempts over {elapsed} µs"
        );
        assert_eq!(got + denied.load(Ordering::Relaxed), attempts);
        assert_eq!(
            last.decisions[0].remaining, 0,
            "run {run}: the bucket ends empty"
        );
    }
}
