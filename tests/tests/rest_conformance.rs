//! floodgate-rest against the official `@upstash/redis` client, the same cases
//! through our Rust REST client, and hostile HTTP input.

use std::time::Duration;

use floodgate_edge::store::rest::RestStore;
use floodgate_edge::store::{RedisErrorKind, Store, StoreErrorKind, Value};
use floodgate_rest::EndpointConfig;
use floodgate_shared::policy::Quota;
use floodgate_shared::script::{Check, TOKEN_BUCKET};
use floodgate_tests::{Endpoint, RedisServer, args, commands, node_modules, unique_key};

const TOKEN: &str = "test-token-Zx81";

/// An endpoint that lets `SCRIPT FLUSH` through: the suites flush the script
/// cache to prove the EVALSHA → EVAL fallback (refused by default).
async fn endpoint(redis: &RedisServer) -> Endpoint {
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    config.allow = vec!["SCRIPT FLUSH".into()];
    Endpoint::start_with(config).await
}

/// The token bucket script as the edge sends it (its `-- #include` prelude
/// expanded by `shared/build.rs`), written where the suites can read it.
fn lua_file() -> String {
    let path = std::env::temp_dir().join(format!(
        "floodgate-token-bucket-{}-{}.lua",
        std::process::id(),
        unique_key("lua")
    ));
    std::fs::write(&path, TOKEN_BUCKET.source).expect("write the script for the suites");
    path.display().to_string()
}

/// Runs an official SDK's conformance suite (`command`, in its own directory)
/// against a fresh endpoint and asserts it reported `passing` cases, none failed.
async fn sdk_suite(name: &str, mut command: tokio::process::Command, passing: &str) {
    let redis = RedisServer::start();
    let ep = endpoint(&redis).await;
    let out = command
        .env("FLOODGATE_REST_URL", &ep.url)
        .env("FLOODGATE_REST_TOKEN", &ep.token)
        .env("UPSTASH_REDIS_REST_URL", &ep.url)
        .env("UPSTASH_REDIS_REST_TOKEN", &ep.token)
        .env("FLOODGATE_SCRIPT", lua_file())
        .output()
        .await
        .unwrap_or_else(|e| panic!("{name} runs: {e}"));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    assert!(
        out.status.success(),
        "the {name} conformance suite failed:\n{report}"
    );
    assert!(
        report.contains(passing) && !report.contains("fail 1"),
        "expected {passing:?}:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_upstash_client_passes_against_the_endpoint() {
    let mut node = tokio::process::Command::new("node");
    node.args(["--test", "--test-reporter=spec", "conformance.test.mjs"])
        .current_dir(node_modules());
    sdk_suite("@upstash/redis", node, "pass 5").await;
}

/// Python's `upstash-redis` in its default settings (installed from PyPI into a
/// virtualenv under `target/` on first use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_passes_against_the_endpoint() {
    let python = tokio::task::spawn_blocking(floodgate_tests::python_env)
        .await
        .unwrap();
    let mut py = tokio::process::Command::new(python);
    py.arg(format!(
        "{}/python/conformance.py",
        env!("CARGO_MANIFEST_DIR")
    ));
    sdk_suite("upstash-redis (Python)", py, "pass 5").await;
}

#[tokio::test]
async fn our_rest_client_passes_the_same_cases() {
    let redis = RedisServer::start();
    let ep = endpoint(&redis).await;
    let store = RestStore::new(&ep.url, TOKEN, Duration::from_secs(5)).unwrap();
    let k = unique_key("rest");
    let bytes = |s: &str| Value::Bulk(s.as_bytes().to_vec());

    // get/set, unicode, missing
    assert_eq!(
        store
            .command(&args(&["SET", &k, "héllo ✓ 🚦"]))
            .await
            .unwrap(),
        bytes("OK")
    );
    assert_eq!(
        store.command(&args(&["GET", &k])).await.unwrap(),
        bytes("héllo ✓ 🚦")
    );
    assert_eq!(
        store.command(&args(&["GET", "missing-key"])).await.unwrap(),
        Value::Nil
    );
    assert_eq!(
        store.command(&args(&["PING"])).await.unwrap(),
        bytes("PONG")
    );

    // pipeline: per-command errors
    let n = unique_key("n");
    let out = store
        .pipeline(&commands(&[
            &["SET", &n, "1"],
            &["INCR", &n],
            &["LPUSH", &n, "x"],
        ]))
        .await
        .unwrap();
    assert_eq!(out[0], bytes("OK"));
    assert_eq!(out[1], Value::Int(2));
    let Value::Error(e) = &out[2] else {
        panic!("{:?}", out[2])
    };
    assert_eq!(e.redis(), Some(RedisErrorKind::WrongType));
    assert!(e.message.starts_with("WRONGTYPE"), "{e}");

    // multi-exec: atomic; a discarded transaction is one error
    let t = unique_key("tx");
    let out = store
        .multi_exec(&commands(&[
            &["SET", &t, "10"],
            &["INCRBY", &t, "5"],
            &["GET", &t],
        ]))
        .await
        .unwrap();
    assert_eq!(out, vec![bytes("OK"), Value::Int(15), bytes("15")]);
    let e = store
        .multi_exec(&commands(&[&["SET", &t, "1"], &["NOSUCHCOMMAND"]]))
        .await
        .unwrap_err();
    assert_eq!(e.redis(), Some(RedisErrorKind::ExecAbort));
    assert!(e.message.contains("EXECABORT"), "{e}");
    assert_eq!(
        store.command(&args(&["GET", &t])).await.unwrap(),
        bytes("15"),
        "nothing of it ran"
    );

    // EVALSHA with the EVAL fallback after SCRIPT FLUSH, inside one check()
    store.command(&args(&["SCRIPT", "FLUSH"])).await.unwrap();
    let q = Quota::new(3, 3, 3_000_000).unwrap();
    let key = unique_key("bucket");
    let checks = [Check {
        key: &key,
        quota: &q,
        cost: 1,
        shadow: false,
    }];
    let admitted: Vec<bool> = {
        let mut v = vec![];
        for _ in 0..4 {
            v.push(store.check(&checks, None).await.unwrap().admitted);
        }
        v
    };
    assert_eq!(admitted, [true, true, true, false]);
    let exists = store
        .command(&args(&["SCRIPT", "EXISTS", TOKEN_BUCKET.sha1]))
        .await
        .unwrap();
    assert_eq!(exists, Value::Array(vec![Value::Int(1)]));

    // error shapes and bad tokens
    let e = store.command(&args(&["LPUSH", &k, "x"])).await.unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Redis(RedisErrorKind::WrongType));
    assert!(e.message.starts_with("WRONGTYPE"), "{e}");
    let intruder = RestStore::new(&ep.url, "wrong", Duration::from_secs(5)).unwrap();
    let e = intruder.command(&args(&["GET", &k])).await.unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Auth);
    assert!(!e.is_retryable());
    assert!(RestStore::new(&ep.url, "", Duration::from_secs(1)).is_err());
    assert!(RestStore::new("ftp://x", TOKEN, Duration::from_secs(1)).is_err());
}

#[tokio::test]
async fn rest_errors_say_whether_retrying_helps() {
    let redis = RedisServer::start();
    let ep = endpoint(&redis).await;
    let store = RestStore::new(&ep.url, TOKEN, Duration::from_millis(300)).unwrap();
    let q = Quota::per_minute(10).unwrap();
    let key = unique_key("rest-err");
    let checks = [Check {
        key: &key,
        quota: &q,
        cost: 1,
        shadow: false,
    }];
    // Redis hangs: the endpoint cannot answer within our deadline
    let pid = redis.pid().to_string();
    std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    let e = store.check(&checks, None).await.unwrap_err();
    std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap();
    assert_eq!(e.kind, StoreErrorKind::Timeout, "{e}");
    assert!(e.is_retryable());
    // nothing listens: connect error, retryable
    let gone = RestStore::new(
        &format!("http://127.0.0.1:{}", floodgate_tests::free_port()),
        TOKEN,
        Duration::from_secs(1),
    )
    .unwrap();
    let e = gone.check(&checks, None).await.unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Connect, "{e}");
    assert!(e.is_retryable());
}

/// Hostile requests get the right status and a JSON error, and the endpoint keeps
/// serving afterwards.
#[tokio::test]
async fn hostile_requests_get_json_errors_and_the_endpoint_keeps_serving() {
    let redis = RedisServer::start();
    let ep = endpoint(&redis).await;
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");
    let ten_mb = vec![b'['; 10 * 1024 * 1024];
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, Vec<u8>, u16);
    let cases: Vec<Case> = vec![
        ("POST", "/", Some(&auth), b"{not json".to_vec(), 400),
        ("POST", "/", Some(&auth), b"".to_vec(), 400),
        ("POST", "/", Some(&auth), br#"{"cmd":"GET"}"#.to_vec(), 400),
        (
            "POST",
            "/",
            Some(&auth),
            br#"["GET",["nested"]]"#.to_vec(),
            400,
        ),
        (
            "POST",
            "/",
            Some(&auth),
            br#"["SET","k",true]"#.to_vec(),
            400,
        ),
        (
            "POST",
            "/",
            Some(&auth),
            br#"["SET","k",null]"#.to_vec(),
            400,
        ),
        ("POST", "/", Some(&auth), br#"[]"#.to_vec(), 400),
        ("POST", "/", Some(&auth), br#"["MULTI"]"#.to_vec(), 400),
        (
            "POST",
            "/",
            Some(&auth),
            br#"["BLPOP","k","0"]"#.to_vec(),
            400,
        ),
        (
            "POST",
            "/",
            Some(&auth),
            [&b"[\"GET\",\""[..], &[0xff, 0xfe], b"\"]"].concat(),
            400,
        ),
        (
            "POST",
            "/",
            Some(&auth),
            format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes(),
            400,
        ),
        (
            "POST",
            "/pipeline",
            Some(&auth),
            br#"["GET","k"]"#.to_vec(),
            400,
        ),
        ("POST", "/pipeline", Some(&auth), br#"[]"#.to_vec(), 400),
        (
            "POST",
            "/multi-exec",
            Some(&auth),
            br#"[["GET","k"],"x"]"#.to_vec(),
            400,
        ),
        ("POST", "/", Some(&auth), ten_mb, 413),
        ("GET", "/no/such/path", Some(&auth), vec![], 400),
        ("GET", "/select/1", Some(&auth), vec![], 400),
        ("DELETE", "/", Some(&auth), vec![], 405),
        ("POST", "/", None, br#"["GET","k"]"#.to_vec(), 401),
        (
            "POST",
            "/",
            Some("Bearer wrong"),
            br#"["GET","k"]"#.to_vec(),
            401,
        ),
        (
            "POST",
            "/",
            Some("Basic dGVzdA=="),
            br#"["GET","k"]"#.to_vec(),
            401,
        ),
        ("POST", "/pipeline", None, br#"[["GET","k"]]"#.to_vec(), 401),
        (
            "POST",
            "/multi-exec",
            None,
            br#"[["GET","k"]]"#.to_vec(),
            401,
        ),
        ("GET", "/get/k", None, vec![], 401),
        ("GET", "/get/k?_token=wrong", None, vec![], 401),
    ];
    for (method, path, auth, body, status) in cases {
        let mut req = http
            .request(method.parse().unwrap(), format!("{}{path}", ep.url))
            .body(body);
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(resp.status().as_u16(), status, "{method} {path}");
        let v: serde_json::Value = resp
            .json()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: body is not JSON: {e}"));
        assert!(
            v["error"].as_str().is_some_and(|s| !s.is_empty()),
            "{method} {path}: {v}"
        );
        // still serving
        let ok = http
            .post(&ep.url)
            .header("Authorization", format!("Bearer {TOKEN}"))
            .body(r#"["PING"]"#)
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status().as_u16(), 200, "after {method} {path}");
    }
    let via_query = http
        .get(format!("{}/ping?_token={TOKEN}", ep.url))
        .send()
        .await
        .unwrap();
    assert_eq!(via_query.status().as_u16(), 200);
}

/// Scripts with Upstash's own shebang flag (as @upstash/ratelimit sends them) run
/// on stock Redis, and EVALSHA / SCRIPT LOAD / SCRIPT EXISTS use the SHA-1 the client
/// computed.
#[tokio::test]
async fn upstash_only_script_flags_run_and_keep_the_clients_sha() {
    let redis = RedisServer::start();
    let ep = endpoint(&redis).await;
    let store = RestStore::new(&ep.url, TOKEN, Duration::from_secs(5)).unwrap();
    let script = "#!lua flags=allow-key-locking\nreturn redis.call('INCR', KEYS[1])";
    let sha = floodgate_tests::sha1_hex(script.as_bytes());
    let k = unique_key("flagged");
    let e = store
        .command(&args(&["EVALSHA", &sha, "1", &k]))
        .await
        .unwrap_err();
    assert!(e.message.starts_with("NOSCRIPT"), "{e}");
    assert_eq!(
        store
            .command(&args(&["EVAL", script, "1", &k]))
            .await
            .unwrap(),
        Value::Int(1)
    );
    assert_eq!(
        store
            .command(&args(&["EVALSHA", &sha, "1", &k]))
            .await
            .unwrap(),
        Value::Int(2)
    );
    let out = store
        .pipeline(&commands(&[
            &["EVALSHA", &sha, "1", &k],
            &["SCRIPT", "EXISTS", &sha],
        ]))
        .await
        .unwrap();
    assert_eq!(out, vec![Value::Int(3), Value::Array(vec![Value::Int(1)])]);
    let other = "#!lua flags=allow-key-locking\nreturn 42";
    let loaded = store
        .command(&args(&["SCRIPT", "LOAD", other]))
        .await
        .unwrap();
    assert_eq!(
        loaded.as_str(),
        Some(floodgate_tests::sha1_hex(other.as_bytes()).as_str())
    );
}

/// Concurrent checks are auto-pipelined; each still gets its own, correct decision,
/// also when the script is missing (the NOSCRIPT → EVAL retry happens per batch),
/// and a cancelled caller does not strand the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_are_pipelined_and_each_gets_its_own_decision() {
    let redis = RedisServer::start();
    let ep = endpoint(&redis).await;
    let store = RestStore::new(&ep.url, TOKEN, Duration::from_secs(5)).unwrap();
    let q = std::sync::Arc::new(Quota::per_minute(10).unwrap());
    for round in 0..3 {
        if round == 1 {
            store.command(&args(&["SCRIPT", "FLUSH"])).await.unwrap();
        }
        let mut tasks = vec![];
        for i in 0..200u32 {
            let (store, q) = (store.clone(), q.clone());
            tasks.push(tokio::spawn(async move {
                let key = unique_key("batch");
                let cost = 1 + i % 4;
                let v = store
                    .check(
                        &[Check {
                            key: &key,
                            quota: &q,
                            cost,
                            shadow: false,
                        }],
                        None,
                    )
                    .await
                    .unwrap();
                assert!(v.admitted);
                assert_eq!(
                    v.decisions[0].remaining,
                    10 - u64::from(cost),
                    "round {round}"
                );
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    // cancelled callers: whatever happens to them, later checks still complete
    for _ in 0..20 {
        let (store, q) = (store.clone(), q.clone());
        let call = tokio::spawn(async move {
            let key = unique_key("cancel");
            store
                .check(
                    &[Check {
                        key: &key,
                        quota: &q,
                        cost: 1,
                        shadow: false,
                    }],
                    None,
                )
                .await
        });
        tokio::task::yield_now().await;
        call.abort();
    }
    let key = unique_key("after");
    let v = tokio::time::timeout(
        Duration::from_secs(5),
        store.check(
            &[Check {
                key: &key,
                quota: &q,
                cost: 1,
                shadow: false,
            }],
            None,
        ),
    )
    .await
    .expect("no check is stranded behind a cancelled one")
    .unwrap();
    assert!(v.admitted);
}
