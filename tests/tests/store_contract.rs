//! One storage contract, three stores: everything Floodgate does with Redis —
//! bucket checks, in-flight slots, leases, the audited configuration save, API
//! keys, the typed plain commands the dashboard reads with — behaves the same
//! over RESP (one server), Redis Cluster and the Upstash REST protocol, because
//! it is written once on the `Store` trait. The dashboard works over all three;
//! `floodgate-cli config set` is the dashboard's version-checked, audited save.

use std::time::Duration;

use floodgate_edge::admin::{self, AdminError, Basis};
use floodgate_edge::store::{NativeStore, SetOptions, Store, StoreOptions};
use floodgate_rest::EndpointConfig;
use floodgate_shared::apikeys::KeyStatus;
use floodgate_shared::lease::LeaseConfig;
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;
use floodgate_tests::cluster::RedisCluster;
use floodgate_tests::dash::{Operator, start_dashboard_over};
use floodgate_tests::{DEMO_CONFIG, Endpoint, RedisServer, unique_key};

const TOKEN: &str = "contract-token";

/// The same scenario, whatever the store.
async fn contract<S: Store>(store: &S, name: &str) {
    // the audited, version-checked save
    let (_, v1) = admin::replace_config(store, DEMO_CONFIG, Basis::Unversioned, "t", 1)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // the same text again is no conflict
    admin::replace_config(store, DEMO_CONFIG, Basis::Unversioned, "t", 2)
        .await
        .unwrap();
    let other = DEMO_CONFIG.replace("1000", "999");
    let e = admin::replace_config(store, &other, Basis::Unversioned, "t", 3)
        .await
        .unwrap_err();
    assert!(matches!(e, AdminError::Unversioned { .. }), "{name}: {e}");
    let e = admin::replace_config(store, &other, Basis::Version("stale".into()), "t", 4)
        .await
        .unwrap_err();
    assert!(matches!(e, AdminError::Conflict { .. }), "{name}: {e}");
    let (_, v2) = admin::replace_config(store, &other, Basis::Version(v1.clone()), "t", 5)
        .await
        .unwrap();
    assert_ne!(v1, v2);
    let (_, v3) = admin::replace_config(store, DEMO_CONFIG, Basis::Force, "t", 6)
        .await
        .unwrap();
    assert_eq!(v3, v1, "{name}: the version is the text's SHA-1");
    let audit = admin::audit_log(store, 10).await.unwrap();
    let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        ["config.force", "config.set", "config.set", "config.set"],
        "{name}: newest first, refusals write nothing"
    );
    assert!(
        audit[0].before.as_deref().unwrap().contains("999"),
        "{name}"
    );

    // keys
    let (record, secret) = admin::create_key(store, "acme", "free", 7).await.unwrap();
    assert!(!secret.is_empty());
    let (_, after) = admin::update_key(store, &record.id, |r| r.owner = "acme inc".into())
        .await
        .unwrap();
    assert_eq!(after.owner, "acme inc");
    admin::revoke_key(store, &record.id).await.unwrap();
    let listed = admin::list_keys(store).await.unwrap();
    assert_eq!(listed.len(), 1, "{name}");
    assert_eq!(listed[0].status, KeyStatus::Revoked, "{name}");

    // typed commands
    let k = unique_key(&format!("{name}-set"));
    assert!(store.set(&k, b"1", SetOptions::NX).await.unwrap());
    assert!(!store.set(&k, b"2", SetOptions::NX).await.unwrap());
    assert!(
        store
            .set(&k, b"3", SetOptions::XX.expire(Duration::from_secs(60)))
            .await
            .unwrap()
    );
    assert_eq!(store.get(&k).await.unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(store.del(&[&k]).await.unwrap(), 1);
    assert_eq!(store.get(&k).await.unwrap(), None);
    let h = unique_key(&format!("{name}-hash"));
    assert!(store.hsetnx(&h, "a", b"1").await.unwrap());
    assert!(!store.hsetnx(&h, "a", b"2").await.unwrap());
    assert_eq!(
        store.hget(&h, "a").await.unwrap().as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(store.hkeys(&h).await.unwrap(), [b"a".to_vec()]);
    let all = store
        .hgetall_many(&[h.clone(), unique_key("none")])
        .await
        .unwrap();
    assert_eq!(all, [vec![(b"a".to_vec(), b"1".to_vec())], vec![]]);
    let l = unique_key(&format!("{name}-list"));
    for i in 0..5 {
        store
            .push_capped(&l, i.to_string().as_bytes(), 3)
            .await
            .unwrap();
    }
    assert_eq!(
        store.lrange(&l, 0, -1).await.unwrap(),
        [b"4".to_vec(), b"3".to_vec(), b"2".to_vec()]
    );
    // a string read of a hash is no record (the edge's reading), not an error
    assert_eq!(store.get(&h).await.unwrap(), None);
    store.ping().await.unwrap();

    // buckets, in-flight slots, leases
    let q = Quota::per_minute(3).unwrap();
    let b = format!("fg:{{c:{name}}}:bucket");
    let admitted: Vec<bool> = {
        let mut v = vec![];
        for _ in 0..4 {
            v.push(
                store
                    .check(&[Check::new(&b, &q, 1)], None)
                    .await
                    .unwrap()
                    .admitted,
            );
        }
        v
    };
    assert_eq!(admitted, [true, true, true, false], "{name}");
    // a refund gives back what an admitted call took
    let r = format!("fg:{{c:{name}}}:refunded");
    let checks = [Check::new(&r, &q, 1)];
    let v = store.check(&checks, None).await.unwrap();
    assert_eq!(v.decisions[0].remaining, 2, "{name}");
    store
        .refund(&checks, None, &v.clone().into())
        .await
        .unwrap();
    let v = store.check(&checks, None).await.unwrap();
    assert_eq!(
        v.decisions[0].remaining, 2,
        "{name}: the refunded token is back"
    );
    reading(store, name, &q).await;
    let slots = format!("fg:{{c:{name}}}:bucket:inflight");
    assert!(
        store
            .acquire_slot(&slots, "a", 1, 60_000, None)
            .await
            .unwrap()
    );
    assert!(
        !store
            .acquire_slot(&slots, "b", 1, 60_000, None)
            .await
            .unwrap()
    );
    store.release_slot(&slots, "a").await.unwrap();
    assert!(
        store
            .acquire_slot(&slots, "b", 1, 60_000, None)
            .await
            .unwrap()
    );
}

/// A check that reads the request's key record in the same call (a key the edge
/// never read, `edge/src/pipeline/unseen.rs`): without the record nothing is
/// decided or written; with it, decided as a plain check and the record's bytes
/// returned. Refused, nothing sent, where keys span slots (Cluster).
async fn reading<S: Store>(store: &S, name: &str, q: &Quota) {
    use floodgate_shared::changes::REV_KEY;
    use floodgate_shared::script::{Call, CallReply};
    let b = format!("fg:{{r:{name}}}:bucket");
    let record = format!("fg:apikey:{name}-reading");
    let checks = [Check::new(&b, q, 1)];
    let call = Call {
        watch: Some(REV_KEY),
        record: Some(&record),
        ..Call::new(&checks, None)
    };
    let read = store.decide(call).await;
    if !store.one_slot() {
        assert!(read.is_err(), "{name}: {read:?}");
        assert_eq!(store.get(&b).await.unwrap(), None, "{name}");
        return;
    }
    assert_eq!(read.unwrap(), CallReply::NoRecord, "{name}");
    assert_eq!(store.get(&b).await.unwrap(), None, "{name}: nothing minted");
    let text = br#"{"id":"x"}"#;
    assert!(
        store
            .set(&record, text, SetOptions::default())
            .await
            .unwrap()
    );
    for (admitted, remaining) in [(true, 2), (true, 1), (true, 0), (false, 0)] {
        let CallReply::Done { each, record } = store.decide(call).await.unwrap() else {
            panic!("{name}: a record is there");
        };
        assert_eq!(record.as_deref(), Some(&text[..]), "{name}");
        let v = &each[0].verdict;
        assert_eq!(v.admitted, admitted, "{name}: the bucket is spent after 3");
        assert_eq!(v.decisions[0].remaining, remaining, "{name}");
    }
}

/// Leases over a store (what bounded policies run): requests decided exactly with
/// tokens leased alongside hand out exactly the bucket, the leases' outstanding
/// tokens are reported, and a return gives the unspent ones back.
async fn leases<S: Store>(store: &S, name: &str) {
    let q = Quota::new(20, 20, 3_600_000_000).unwrap();
    let cfg = LeaseConfig::default();
    let key = format!("fg:{{lease:{name}}}:p");
    let (burst, emission) = (q.burst_window(), q.emission_interval());
    let (mut handed_out, mut last) = (0, None);
    for i in 0..10 {
        let args = cfg.take_args(None, burst, emission, 1, 4, &format!("i{i}"), None);
        let t = store.take_lease(&key, &args).await.unwrap();
        if t.admitted {
            handed_out += 1 + t.leased;
            last = Some((i, t));
        }
    }
    assert_eq!(handed_out, 20, "{name}: the bucket, no more, no less");
    let (i, t) = last.unwrap();
    assert!(t.leased > 0 && t.outstanding >= t.leased, "{name}: {t:?}");
    // the last lease comes back unspent: the bucket admits again
    let args = [
        String::new(),
        emission.to_string(),
        t.member(&format!("i{i}"), emission),
        t.leased.to_string(),
    ];
    store.return_lease(&key, &args).await.unwrap();
    let args = cfg.take_args(None, burst, emission, 1, 0, "after", None);
    let after = store.take_lease(&key, &args).await.unwrap();
    assert!(
        after.admitted,
        "{name}: a returned lease refills the bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_holds_over_resp_rest_and_cluster() {
    let redis = RedisServer::start();
    let resp = NativeStore::connect(&StoreOptions::new(redis.url(), Duration::from_secs(2)))
        .await
        .unwrap();
    contract(&resp, "resp").await;
    leases(&resp, "resp").await;

    let behind_rest = RedisServer::start();
    let ep = Endpoint::start_with(EndpointConfig::new(behind_rest.url(), TOKEN)).await;
    let mut options = StoreOptions::new(ep.url.clone(), Duration::from_secs(2));
    options.rest_token = Some(TOKEN.into());
    let rest = NativeStore::connect(&options).await.unwrap();
    contract(&rest, "rest").await;
    leases(&rest, "rest").await;

    let cluster = RedisCluster::start(3, 0);
    let on_cluster =
        NativeStore::connect(&StoreOptions::new(cluster.url(), Duration::from_secs(2)))
            .await
            .unwrap();
    contract(&on_cluster, "cluster").await;
    leases(&on_cluster, "cluster").await;
}

/// The dashboard — sign-in (its own limiter), sessions, the configuration's
/// compare-and-set, keys, traffic — over REST and over a Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_over_rest_and_cluster() {
    let behind_rest = RedisServer::start();
    let ep = Endpoint::start_with(EndpointConfig::new(behind_rest.url(), TOKEN)).await;
    let mut over_rest = StoreOptions::new(ep.url.clone(), Duration::from_secs(2));
    over_rest.rest_token = Some(TOKEN.into());
    let cluster = RedisCluster::start(3, 0);
    let over_cluster = StoreOptions::new(cluster.url(), Duration::from_secs(2));
    for (name, options) in [("rest", over_rest), ("cluster", over_cluster)] {
        let dash = start_dashboard_over(&options, vec![]).await;
        let op = Operator::sign_in(&dash.url).await;
        let version = op.version().await;
        let v = op
            .json("create_key", &[("label", "acme"), ("plan", "free")])
            .await;
        assert!(v["secret"].is_string(), "{name}: {v}");
        let keys = op.json("keys", &[]).await;
        assert_eq!(keys.as_array().map(Vec::len), Some(1), "{name}: {keys}");
        let traffic = op.json("traffic", &[("minutes", "5")]).await;
        assert!(traffic.is_object(), "{name}: {traffic}");
        let audit = op.json("audit", &[]).await;
        assert!(
            audit
                .as_array()
                .is_some_and(|a| a.iter().any(|e| e["action"] == "create key")),
            "{name}: {audit}"
        );
        assert_eq!(
            op.version().await,
            version,
            "{name}: keys leave the configuration"
        );
        // the compare-and-set: a save on the version read, then one on the stale version
        let saved = op
            .json(
                "save_headers",
                &[
                    ("version", &version),
                    ("ietf", "on"),
                    ("retry_jitter_secs", "3"),
                ],
            )
            .await;
        assert!(saved["Ok"].is_string(), "{name}: {saved}");
        let (status, stale) = op
            .answer(
                "save_headers",
                &[
                    ("version", &version),
                    ("ietf", ""),
                    ("retry_jitter_secs", "0"),
                ],
            )
            .await;
        assert_eq!(status.as_u16(), 409, "{name}: {stale}");
        assert!(stale["Conflict"].is_string(), "{name}: {stale}");
        assert_ne!(op.version().await, version);
    }
}

/// `floodgate-cli config set` is the dashboard's save: with a configuration
/// stored it needs the version it replaces (or `--force`), and every save is in
/// the audit log with what it replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_saves_the_configuration_version_checked_and_audited() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("floodgate-cli-{}", redis.port()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.json"), dir.join("b.json"));
    std::fs::write(&a, DEMO_CONFIG).unwrap();
    std::fs::write(&b, DEMO_CONFIG.replace("1000", "500")).unwrap();
    let url = redis.url();
    let cli = |rest: Vec<String>| {
        let mut args = vec!["--redis".to_string(), url.clone()];
        args.extend(rest);
        floodgate_tests::cli(args)
    };
    let arg = |p: &std::path::Path| p.to_str().unwrap().to_string();
    cli(vec!["config".into(), "set".into(), arg(&a)])
        .await
        .unwrap();
    let store = NativeStore::connect(&StoreOptions::new(redis.url(), Duration::from_secs(2)))
        .await
        .unwrap();
    let (v1, _) = admin::load_config(&store).await.unwrap();
    // another writer: unversioned is refused, the right version is not
    let e = cli(vec!["config".into(), "set".into(), arg(&b)])
        .await
        .unwrap_err();
    assert!(e.contains("--based-on") && e.contains(&v1), "{e}");
    let e = cli(vec![
        "config".into(),
        "set".into(),
        arg(&b),
        "--based-on".into(),
        "0".repeat(40),
    ])
    .await
    .unwrap_err();
    assert!(e.contains("someone changed it"), "{e}");
    cli(vec![
        "config".into(),
        "set".into(),
        arg(&b),
        "--based-on".into(),
        v1.clone(),
    ])
    .await
    .unwrap();
    cli(vec![
        "config".into(),
        "set".into(),
        arg(&a),
        "--force".into(),
    ])
    .await
    .unwrap();
    let audit = admin::audit_log(&store, 10).await.unwrap();
    let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["config.force", "config.set", "config.set"]);
    assert!(
        audit.iter().all(|e| e.user.starts_with("cli:")),
        "{audit:?}"
    );
    assert!(
        audit[0].before.as_deref().unwrap().contains("500"),
        "the replaced text is kept"
    );
    let _ = std::fs::remove_dir_all(dir);
}
