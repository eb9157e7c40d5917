//! Managed Redis as it is deployed: TLS only, the default user off, one ACL user
//! (`rediss://user:password@host:port`, a private CA). The CLI, the native edge,
//! the REST endpoint and the dashboard all work through it with the CA file; a
//! wrong password, an untrusted certificate or a plain-text URL fail fast with a
//! clear error.

use std::time::{Duration, Instant};

use floodgate_edge::admin;
use floodgate_edge::demo_upstream::{self, Seen};
use floodgate_edge::store::rest::RestStore;
use floodgate_edge::store::{NativeStore, Store, StoreErrorKind, StoreOptions};
use floodgate_rest::EndpointConfig;
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;
use floodgate_tests::dash::{Operator, start_dashboard_over};
use floodgate_tests::tls::TlsRedis;
use floodgate_tests::{DEMO_CONFIG, Endpoint, cli, serve, start_native_edge};

const USER: &str = "fg-app";
const PASSWORD: &str = "Tls-Only-s3cret";
/// The store deadline of the refused attempts below, which also bounds their
/// connection (`connect_limit`): long, so that an attempt that waits it out
/// instead of failing on the server's refusal is far past [`FAST`].
const CONNECT_LIMIT: Duration = Duration::from_secs(30);
/// "Fast": each refusal comes in about 10 ms here (a TLS handshake and an AUTH);
/// this bound leaves a loaded machine's scheduling room and stays a tenth of the
/// wait it guards against (was: 1 s, 1 s and 3 s against a 2 s limit).
const FAST: Duration = Duration::from_secs(3);

fn options(redis: &TlsRedis) -> StoreOptions {
    let mut o = StoreOptions::new(redis.url(), Duration::from_secs(2));
    o.ca_file = Some(redis.ca_file());
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_edge_rest_endpoint_and_dashboard_work_over_tls_as_an_acl_user() {
    let redis = TlsRedis::start(USER, PASSWORD);
    let store_args = |rest: &[&str]| -> Vec<String> {
        [
            "--redis",
            &redis.url(),
            "--redis-ca-file",
            redis.ca_file().to_str().unwrap(),
        ]
        .iter()
        .chain(rest)
        .map(|s| s.to_string())
        .collect()
    };

    // the CLI: the audited save, then a key
    let file = std::env::temp_dir().join(format!("floodgate-tls-demo-{}.json", redis.port()));
    std::fs::write(&file, DEMO_CONFIG).unwrap();
    cli(store_args(&["config", "set", file.to_str().unwrap()]))
        .await
        .expect("config set over rediss://");
    cli(store_args(&[
        "key", "create", "--plan", "free", "--owner", "tls",
    ]))
    .await
    .expect("key create over rediss://");
    let store = NativeStore::connect(&options(&redis)).await.unwrap();
    let keys = admin::list_keys(&store).await.unwrap();
    assert_eq!(keys.len(), 1);
    let audit = admin::audit_log(&store, 10).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.action == "config.set" && e.user.starts_with("cli:")),
        "{audit:?}"
    );
    let (_, secret) = admin::create_key(&store, "edge", "free", 0).await.unwrap();

    // the native edge over the TLS store
    let seen = Seen::default();
    let (upstream, _stop) = serve(demo_upstream::router(seen.clone())).await;
    let edge = start_native_edge(
        NativeStore::connect(&options(&redis)).await.unwrap(),
        &upstream,
        5000,
    )
    .await;
    let res = reqwest::Client::new()
        .get(format!("{}/v1/items", edge.url))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers()["x-ratelimit-limit"], "1000");
    assert_eq!(seen.total(), 1);

    // the REST endpoint in front of the TLS server, and our REST client through it
    let mut config = EndpointConfig::new(redis.url(), "tls-rest-token");
    config.redis = options(&redis);
    let ep = Endpoint::start_with(config).await;
    let rest = RestStore::new(&ep.url, "tls-rest-token", Duration::from_secs(2)).unwrap();
    let q = Quota::per_minute(2).unwrap();
    let admitted: Vec<bool> = {
        let mut v = vec![];
        for _ in 0..3 {
            let verdict = rest
                .check(&[Check::new("fg:{k:tls}:p", &q, 1)], None)
                .await
                .unwrap();
            v.push(verdict.admitted);
        }
        v
    };
    assert_eq!(admitted, [true, true, false]);
    let health = reqwest::get(format!("{}/__floodgate/health", ep.url))
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);

    // the dashboard over the TLS store: sign in, read the configuration
    let dash = start_dashboard_over(&options(&redis), vec![]).await;
    let op = Operator::sign_in(&dash.url).await;
    let config = op.json("config", &[]).await;
    assert!(!op.version().await.is_empty(), "{config}");
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn wrong_credentials_an_untrusted_certificate_and_plain_text_fail_fast_and_clearly() {
    let redis = TlsRedis::start(USER, PASSWORD);
    let port = redis.port();
    let attempt = |url: String, ca: bool| {
        let mut o = StoreOptions::new(url, CONNECT_LIMIT);
        if ca {
            o.ca_file = Some(redis.ca_file());
        }
        async move {
            let started = Instant::now();
            let e = NativeStore::connect(&o).await.err().expect("refused");
            (e, started.elapsed())
        }
    };
    // a wrong password
    let (e, took) = attempt(format!("rediss://{USER}:wrong@127.0.0.1:{port}/"), true).await;
    assert_eq!(e.kind, StoreErrorKind::Auth, "{e}");
    assert!(e.message.contains("authentication failed"), "{e}");
    assert!(
        e.message
            .contains(&format!("rediss://{USER}:***@127.0.0.1:{port}")),
        "names where: {e}"
    );
    assert!(
        !e.message.contains("wrong@"),
        "the password is not echoed: {e}"
    );
    assert!(took < FAST, "{took:?}");
    // the default user is off
    let (e, _) = attempt(format!("rediss://:{PASSWORD}@127.0.0.1:{port}/"), true).await;
    assert_eq!(e.kind, StoreErrorKind::Auth, "{e}");
    // the test CA is not in the system roots
    let (e, took) = attempt(redis.url(), false).await;
    assert_eq!(e.kind, StoreErrorKind::Connect, "{e}");
    assert!(
        e.message.to_lowercase().contains("certificate"),
        "says why: {e}"
    );
    assert!(took < FAST, "{took:?}");
    // plain text to a TLS port
    let (e, took) = attempt(
        format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}/"),
        false,
    )
    .await;
    assert!(e.is_retryable(), "{e}");
    assert!(took < FAST, "{took:?}");
    // a CA file with a plain URL is a mistake said as such
    let (e, _) = attempt(format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}/"), true).await;
    assert_eq!(e.kind, StoreErrorKind::Protocol, "{e}");
    assert!(e.message.contains("not rediss://"), "{e}");
    // and the CLI says so too
    let err = cli(vec![
        "--redis".into(),
        format!("rediss://{USER}:wrong@127.0.0.1:{port}/"),
        "--redis-ca-file".into(),
        redis.ca_file().to_str().unwrap().into(),
        "config".into(),
        "show".into(),
    ])
    .await
    .unwrap_err();
    assert!(err.contains("authentication failed"), "{err}");
    // a CA file that is not one
    let not_pem = std::env::temp_dir().join(format!("floodgate-not-a-ca-{port}"));
    std::fs::write(&not_pem, "hello").unwrap();
    let mut o = options(&redis);
    o.ca_file = Some(not_pem.clone());
    let e = NativeStore::connect(&o).await.err().unwrap();
    assert_eq!(e.kind, StoreErrorKind::Protocol);
    assert!(e.message.contains("no PEM certificate"), "{e}");
    let _ = std::fs::remove_file(not_pem);
}
