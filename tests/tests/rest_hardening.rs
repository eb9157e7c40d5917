//! floodgate-rest under the defects found by driving it with clients nobody here
//! wrote and with hostile input (issue 14): dangerous commands, numbers, large
//! replies, Upstash's query-string arguments, slow and idle connections, and the
//! small ones (chunked bodies, oversized bodies, the bearer scheme's case, HEAD).
//! Each test failed against the endpoint before the fix (issue 14).

use std::io::Write;
use std::time::Duration;

use floodgate_rest::EndpointConfig;
use floodgate_tests::http::{closed_within, connect, exchange, read_response};
use floodgate_tests::{Endpoint, RedisServer, unique_key};
use serde_json::{Value, json};

const TOKEN: &str = "hardening-token-7Qv";

async fn post(ep: &Endpoint, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", ep.url))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap();
    let v = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "POST {path}: not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        )
    });
    (status, v)
}

fn redis_get(redis: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut redis.connection())
        .unwrap()
}

/// Administrative and dangerous commands are refused in every request form
/// (command in the body, pipeline, transaction, path style, any case), and
/// nothing of them reaches Redis.
#[tokio::test]
async fn administrative_commands_are_refused_by_default() {
    let redis = RedisServer::start();
    let ep = Endpoint::start(&redis, TOKEN).await;
    let keep = unique_key("keep");
    let _: () = redis::cmd("SET")
        .arg(&keep)
        .arg("1")
        .query(&mut redis.connection())
        .unwrap();
    let dangerous: Vec<Vec<&str>> = vec![
        vec!["CONFIG", "SET", "requirepass", "x"],
        vec!["config", "set", "appendonly", "yes"],
        vec!["CONFIG", "GET", "requirepass"],
        vec!["ACL", "SETUSER", "eve", "on", ">pw", "+@all", "~*"],
        vec!["acl", "deluser", "default"],
        vec!["ACL", "LIST"],
        vec!["MIGRATE", "127.0.0.1", "1", &keep, "0", "1000"],
        vec!["SAVE"],
        vec!["BGSAVE"],
        vec!["BGREWRITEAOF"],
        vec!["SWAPDB", "0", "1"],
        vec!["FLUSHALL"],
        vec!["FlushDb", "ASYNC"],
        vec!["SCRIPT", "FLUSH"],
        vec!["script", "kill"],
        vec!["FUNCTION", "FLUSH"],
        vec!["FUNCTION", "DELETE", "lib"],
        vec!["FUNCTION", "RESTORE", "x"],
        vec!["DEBUG", "SLEEP", "0"],
        vec!["SHUTDOWN", "NOSAVE"],
        vec!["REPLICAOF", "127.0.0.1", "1"],
        vec!["SLAVEOF", "NO", "ONE"],
        vec!["MODULE", "LOAD", "/tmp/x.so"],
        vec!["CLUSTER", "RESET"],
        vec!["CLUSTER", "ADDSLOTS", "1"],
        vec!["FAILOVER"],
    ];
    for cmd in &dangerous {
        let (status, v) = post(&ep, "", json!(cmd).to_string()).await;
        assert_eq!(status, 400, "{cmd:?}: {v}");
        assert!(
            v["error"]
                .as_str()
                .is_some_and(|e| e.contains("not allowed")),
            "{cmd:?}: {v}"
        );
        for path in ["/pipeline", "/multi-exec"] {
            let (status, v) = post(&ep, path, json!([["GET", &keep], cmd]).to_string()).await;
            assert_eq!(status, 400, "{path} {cmd:?}: {v}");
        }
        let path = format!(
            "/{}",
            cmd.iter()
                .map(|w| w.replace('/', "%2F"))
                .collect::<Vec<_>>()
                .join("/")
        );
        let (status, v) = post(&ep, &path, "").await;
        assert_eq!(status, 400, "{path}: {v}");
    }
    // nothing of it ran
    let mut c = redis.connection();
    let pass: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("requirepass")
        .query(&mut c)
        .unwrap();
    assert_eq!(pass[1], "", "requirepass untouched");
    let users: Vec<String> = redis::cmd("ACL").arg("USERS").query(&mut c).unwrap();
    assert_eq!(users, ["default"]);
    assert_eq!(
        redis_get(&redis, &keep).as_deref(),
        Some("1"),
        "no flush ran"
    );
    // the everyday script commands still work
    let (status, v) = post(&ep, "", r#"["SCRIPT","LOAD","return 1"]"#).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = post(&ep, "", json!(["EVAL", "return 7", 0]).to_string()).await;
    assert_eq!((status, &v["result"]), (200, &json!(7)));
}

/// JSON numbers reach Redis as the exact text the client sent, not re-formatted
/// floats: what Redis stores is what it stores for the same text over RESP.
#[tokio::test]
async fn json_numbers_reach_redis_as_their_exact_text() {
    let redis = RedisServer::start();
    let ep = Endpoint::start(&redis, TOKEN).await;
    for number in [
        "123456789.12345679",
        "18446744073709551616",
        "1e-07",
        "1E+5",
        "-0.0",
        "0.1",
        "-9007199254740993",
        "3.141592653589793238462643383279",
    ] {
        let k = unique_key("num");
        let (status, v) = post(&ep, "", format!(r#"["SET","{k}",{number}]"#)).await;
        assert_eq!(status, 200, "{number}: {v}");
        assert_eq!(redis_get(&redis, &k).as_deref(), Some(number));
    }
    // a score: the endpoint's ZADD equals ZADD of the same text over RESP
    let (ours, direct) = (unique_key("z"), unique_key("z"));
    let (status, _) = post(
        &ep,
        "",
        format!(r#"["ZADD","{ours}",123456789.12345679,"m"]"#),
    )
    .await;
    assert_eq!(status, 200);
    let mut c = redis.connection();
    let _: () = redis::cmd("ZADD")
        .arg(&direct)
        .arg("123456789.12345679")
        .arg("m")
        .query(&mut c)
        .unwrap();
    let score = |k: &str| -> String {
        redis::cmd("ZSCORE")
            .arg(k)
            .arg("m")
            .query(&mut redis.connection())
            .unwrap()
    };
    assert_eq!(score(&ours), score(&direct));
    // pipelines too
    let k = unique_key("num");
    let (status, v) = post(&ep, "/pipeline", format!(r#"[["SET","{k}",1e-07]]"#)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(redis_get(&redis, &k).as_deref(), Some("1e-07"));
}

/// Replies beyond the old fixed bounds (nesting 8, 1,048,576 elements, 16 MiB
/// strings) are valid Redis replies: they are served, and requests running
/// alongside them on the same Redis connections never fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_valid_replies_are_served_and_never_fail_other_requests() {
    let redis = RedisServer::start();
    let ep = std::sync::Arc::new(Endpoint::start(&redis, TOKEN).await);
    let big = unique_key("big");
    let size = 17 * 1024 * 1024;
    let _: () = redis::cmd("SETRANGE")
        .arg(&big)
        .arg(size - 1)
        .arg("z")
        .query(&mut redis.connection())
        .unwrap();
    // bystanders: PINGs all along
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut bystanders = vec![];
    for _ in 0..8 {
        let (ep, stop) = (ep.clone(), stop.clone());
        bystanders.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (status, v) = post(&ep, "", r#"["PING"]"#).await;
                assert_eq!(status, 200, "a bystander failed: {v}");
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            n
        }));
    }
    let nested = "return {{{{{{{{{{1}}}}}}}}}}";
    let (status, v) = post(&ep, "", json!(["EVAL", nested, 0]).to_string()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], json!([[[[[[[[[[1]]]]]]]]]]));
    let many = "local t = {} for i = 1, 1048577 do t[i] = i end return t";
    let (status, v) = post(&ep, "", json!(["EVAL", many, 0]).to_string()).await;
    assert_eq!(
        status,
        200,
        "{}",
        &v.to_string()[..200.min(v.to_string().len())]
    );
    let items = v["result"].as_array().expect("an array");
    assert_eq!(items.len(), 1_048_577);
    assert_eq!(items[1_048_576], json!(1_048_577));
    let resp = reqwest::Client::new()
        .post(&ep.url)
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(json!(["GET", &big]).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: Value = resp.json().await.unwrap();
    let s = v["result"].as_str().unwrap();
    assert_eq!(
        s.len(),
        size,
        "the 17 MiB string whole (not base64: none asked)"
    );
    assert!(s.ends_with('z'));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in bystanders {
        assert!(b.await.unwrap() > 0);
    }
}

/// Upstash's documented form: trailing arguments in the query string
/// (`POST /set/foo?EX=100` with the value as the body).
#[tokio::test]
async fn query_string_arguments_trail_the_command() {
    let redis = RedisServer::start();
    let ep = Endpoint::start(&redis, TOKEN).await;
    let k = unique_key("q");
    let (status, v) = post(&ep, &format!("/set/{k}?EX=100"), "bar").await;
    assert_eq!((status, &v["result"]), (200, &json!("OK")), "{v}");
    assert_eq!(redis_get(&redis, &k).as_deref(), Some("bar"));
    let ttl: i64 = redis::cmd("TTL")
        .arg(&k)
        .query(&mut redis.connection())
        .unwrap();
    assert!((1..=100).contains(&ttl), "the key expires: TTL {ttl}");
    // path values, then query arguments; the token in the query is not one
    let k2 = unique_key("q");
    let resp = reqwest::get(format!("{}/set/{k2}/v?PX=50000&NX&_token={TOKEN}", ep.url))
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&k2)
        .query(&mut redis.connection())
        .unwrap();
    assert!((1..=50_000).contains(&pttl), "PTTL {pttl}");
    // NX: a second SET with NX does not overwrite
    let resp = reqwest::get(format!("{}/set/{k2}/w?NX&_token={TOKEN}", ep.url))
        .await
        .unwrap();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["result"], Value::Null);
    assert_eq!(redis_get(&redis, &k2).as_deref(), Some("v"));
}

/// A connection that sends nothing, or only part of its headers, is closed by
/// the endpoint (header-read timeout) instead of holding a file descriptor forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_connections_are_closed() {
    let redis = RedisServer::start();
    let ep = Endpoint::start(&redis, TOKEN).await;
    let url = ep.url.clone();
    let limit = Duration::from_secs(15);
    let silent = {
        let url = url.clone();
        std::thread::spawn(move || closed_within(&mut connect(&url), limit))
    };
    let partial = std::thread::spawn(move || {
        let mut s = connect(&url);
        s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bea")
            .unwrap();
        closed_within(&mut s, limit)
    });
    let silent = tokio::task::spawn_blocking(move || silent.join().unwrap())
        .await
        .unwrap();
    let partial = tokio::task::spawn_blocking(move || partial.join().unwrap())
        .await
        .unwrap();
    assert!(
        silent.is_some(),
        "a connection that sends nothing stays open"
    );
    assert!(partial.is_some(), "a half-sent request stays open");
}

/// A malformed chunked body is a bad request (400), not "too large" (413).
#[tokio::test]
async fn a_malformed_chunked_body_is_a_400() {
    let redis = RedisServer::start();
    let ep = Endpoint::start(&redis, TOKEN).await;
    let chunked = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    );
    let url = ep.url.clone();
    let r = tokio::task::spawn_blocking(move || exchange(&url, chunked.as_bytes()))
        .await
        .unwrap()
        .expect("an answer");
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
}

/// A body far over the limit is answered 413 and read out behind the answer:
/// the client sees the answer, not a reset while it is still sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_read_and_answered_413() {
    let redis = RedisServer::start();
    let ep = Endpoint::start(&redis, TOKEN).await;
    let url = ep.url.clone();
    let oversized = tokio::task::spawn_blocking(move || {
        let total = 20 * 1024 * 1024;
        let mut s = connect(&url);
        let head = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {total}\r\n\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        let chunk = vec![b'x'; 256 * 1024];
        let mut sent = 0;
        while sent < total {
            if let Err(e) = s.write_all(&chunk) {
                return Err(format!("write failed after {sent} bytes: {e}"));
            }
            sent += chunk.len();
        }
        read_response(&mut s).ok_or_else(|| "no response".to_string())
    })
    .await
    .unwrap();
    let r = oversized.expect("the whole body is accepted, then answered");
    assert_eq!(r.status, 413);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v["error"].as_str().unwrap().contains("larger than"), "{v}");
}

/// A body that grows past the limit is answered 413 as soon as it passes it, as
/// nginx does, not when it ends (issue 41: a chunked one waited, unanswered,
/// until the client ended it or the body timeout). What the client sends after
/// the answer is read and dropped, so it sees the answer and not a reset, and
/// the connection then closes cleanly. The same for a declared length over the
/// limit; with `Expect: 100-continue` the client is not asked to send it at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_limit_is_answered_413_before_it_ends() {
    let redis = RedisServer::start();
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    // the old answer, a 408, came at this timeout: the status tells them apart
    config.body_timeout = Duration::from_secs(4);
    let ep = Endpoint::start_with(config).await;
    let url = ep.url.clone();
    tokio::task::spawn_blocking(move || {
        let head = |framing: &str| {
            format!("POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n{framing}\r\n")
        };
        let chunk = [
            format!("{:x}\r\n", 64 * 1024).into_bytes(),
            vec![b'x'; 64 * 1024],
            b"\r\n".to_vec(),
        ]
        .concat();
        // chunked: 17 chunks of 64 KiB (past 1 MiB), and no end yet
        let mut s = connect(&url);
        let started = std::time::Instant::now();
        s.write_all(head("Transfer-Encoding: chunked\r\n").as_bytes())
            .unwrap();
        for _ in 0..17 {
            s.write_all(&chunk).unwrap();
        }
        let r = read_response(&mut s).expect("an answer before the body ends");
        eprintln!("chunked: {} after {:?}", r.status, started.elapsed());
        assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body));
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert!(v["error"].as_str().unwrap().contains("larger than"), "{v}");
        assert!(
            r.head.to_ascii_lowercase().contains("connection: close"),
            "{}",
            r.head
        );
        // the rest is read (and dropped), then the connection closes
        for _ in 0..8 {
            s.write_all(&chunk)
                .expect("the rest of the body is read, not reset");
        }
        s.write_all(b"0\r\n\r\n").unwrap();
        assert!(
            closed_within(&mut s, Duration::from_secs(10)).is_some(),
            "closed after the body"
        );
        // a declared length over the limit: answered before the body is sent
        let mut s = connect(&url);
        s.write_all(head(&format!("Content-Length: {}\r\n", 2 * 1024 * 1024)).as_bytes())
            .unwrap();
        s.write_all(&[b'x'; 64 * 1024]).unwrap();
        let r = read_response(&mut s).expect("an answer before the body ends");
        assert_eq!(
            r.status,
            413,
            "Content-Length: {}",
            String::from_utf8_lossy(&r.body)
        );
        // ... and with Expect: 100-continue, 413 instead of 100 Continue
        let mut s = connect(&url);
        let framing = format!(
            "Content-Length: {}\r\nExpect: 100-continue\r\n",
            2 * 1024 * 1024
        );
        s.write_all(head(&framing).as_bytes()).unwrap();
        let r = read_response(&mut s).expect("an answer to the head");
        assert_eq!(r.status, 413, "Expect: 100-continue: {}", r.head);
    })
    .await
    .unwrap();
}

/// A read-only script that loops is stopped by the endpoint once it runs past
/// the endpoint's deadline (`SCRIPT KILL` on the endpoint's own connection):
/// its caller gets an error saying so, and Redis serves everyone again (issue
/// 41: the caller got a plain 504 and every other caller `BUSY`, until the
/// script ended by itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_past_the_deadline_is_killed_by_the_endpoint() {
    // Redis takes other clients' commands (SCRIPT KILL too) after this
    let redis = RedisServer::start_with(&["--busy-reply-threshold", "200"]);
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    config.redis.deadline = Duration::from_millis(1000);
    let ep = Endpoint::start_with(config).await;
    // bounded: it ends by itself after 30 s
    let endless = "local t = tonumber(redis.call('TIME')[1]) \
        while tonumber(redis.call('TIME')[1]) < t + 30 do end return 1";
    let (status, v) = post(&ep, "", json!(["EVAL", endless, 0]).to_string()).await;
    assert_eq!(status, 504, "{v}");
    let message = v["error"].as_str().unwrap_or_default();
    assert!(message.contains("SCRIPT KILL"), "{v}");
    assert!(message.contains("1000 ms"), "{v}");
    // Redis is free again at once: the script was stopped, not waited out
    let (status, v) = post(&ep, "", r#"["PING"]"#).await;
    assert_eq!((status, &v), (200, &json!({"result": "PONG"})));
    // in a pipeline too
    let k = unique_key("after-kill");
    let batch = json!([["SET", &k, "1"], ["EVAL", endless, 0]]).to_string();
    let (status, v) = post(&ep, "/pipeline", batch).await;
    assert_eq!(status, 504, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("SCRIPT KILL"),
        "{v}"
    );
    let (status, v) = post(&ep, "", json!(["GET", &k]).to_string()).await;
    assert_eq!((status, &v), (200, &json!({"result": "1"})));
}

/// A script that has written cannot be stopped (Redis answers `UNKILLABLE`):
/// its caller is told so, and once it ends by itself Redis serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_wrote_is_reported_unkillable() {
    let redis = RedisServer::start_with(&["--busy-reply-threshold", "200"]);
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    config.redis.deadline = Duration::from_millis(1000);
    let ep = Endpoint::start_with(config).await;
    let k = unique_key("unkillable");
    // writes, then loops for 3 s
    let writer = "redis.call('SET', KEYS[1], '1') local t = tonumber(redis.call('TIME')[1]) \
        while tonumber(redis.call('TIME')[1]) < t + 3 do end return 1";
    let (status, v) = post(&ep, "", json!(["EVAL", writer, 1, &k]).to_string()).await;
    assert_eq!(status, 504, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("UNKILLABLE"),
        "{v}"
    );
    let mut served = None;
    for _ in 0..100 {
        let (status, v) = post(&ep, "", json!(["GET", &k]).to_string()).await;
        if status == 200 {
            served = Some(v);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        served,
        Some(json!({"result": "1"})),
        "served once the script ended"
    );
}

/// The auth scheme is case-insensitive (RFC 9110): `bearer`, `BEARER`, `Bearer`.
#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let redis = RedisServer::start();
    let ep = Endpoint::start(&redis, TOKEN).await;
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = reqwest::Client::new()
            .post(&ep.url)
            .header("Authorization", format!("{scheme} {TOKEN}"))
            .body(r#"["PING"]"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{scheme}");
    }
}

/// HEAD answers like GET without a body, and does not run the command.
#[tokio::test]
async fn head_does_not_run_the_command() {
    let redis = RedisServer::start();
    let ep = Endpoint::start(&redis, TOKEN).await;
    let k = unique_key("head");
    let r = reqwest::Client::new()
        .head(format!("{}/incr/{k}", ep.url))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(redis_get(&redis, &k), None, "HEAD ran INCR");
    let r = reqwest::Client::new()
        .head(format!("{}/incr/{k}", ep.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "HEAD still needs the token");
}

/// The command policy's allow list lets exactly what it names through.
#[tokio::test]
async fn the_allow_list_enables_what_it_names_and_nothing_else() {
    let redis = RedisServer::start();
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    config.allow = vec!["FLUSHDB".into(), "script flush".into()];
    let ep = Endpoint::start_with(config).await;
    for (cmd, status) in [
        (r#"["FLUSHDB"]"#, 200),
        (r#"["SCRIPT","FLUSH"]"#, 200),
        (r#"["SCRIPT","KILL"]"#, 400),
        (r#"["FLUSHALL"]"#, 400),
        (r#"["CONFIG","GET","maxmemory"]"#, 400),
        (r#"["MULTI"]"#, 400),
    ] {
        let (got, v) = post(&ep, "", cmd).await;
        assert_eq!(got, status, "{cmd}: {v}");
    }
}

/// A reply larger than the configured bound fails its own request (400, saying
/// so); requests alongside it and after it are served on the same connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_over_the_configured_bound_fails_alone() {
    let redis = RedisServer::start();
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    config.max_reply = 1024 * 1024;
    config.pool = 1;
    let ep = std::sync::Arc::new(Endpoint::start_with(config).await);
    let big = unique_key("big");
    let _: () = redis::cmd("SETRANGE")
        .arg(&big)
        .arg(2 * 1024 * 1024)
        .arg("z")
        .query(&mut redis.connection())
        .unwrap();
    let bystander = {
        let ep = ep.clone();
        tokio::spawn(async move {
            for _ in 0..50 {
                let (status, v) = post(&ep, "", r#"["PING"]"#).await;
                assert_eq!(status, 200, "{v}");
            }
        })
    };
    for _ in 0..5 {
        let (status, v) = post(&ep, "", json!(["GET", &big]).to_string()).await;
        assert_eq!(status, 400, "{v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("limit of 1048576 bytes"),
            "{v}"
        );
        let (status, v) = post(&ep, "", json!(["STRLEN", &big]).to_string()).await;
        assert_eq!((status, &v["result"]), (200, &json!(2 * 1024 * 1024 + 1)));
    }
    bystander.await.unwrap();
}

/// At most `max_connections` client connections are open at once; one more is
/// answered `503` with `Retry-After` at once (issue 41: it used to wait in the
/// listen backlog, unanswered), and once one closes a new client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_a_client_gets_a_503_at_once() {
    let redis = RedisServer::start();
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    config.max_connections = 8;
    config.header_timeout = Duration::from_secs(60);
    let ep = Endpoint::start_with(config).await;
    let url = ep.url.clone();
    let (while_full, after) = tokio::task::spawn_blocking(move || {
        let idle: Vec<_> = (0..8).map(|_| connect(&url)).collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut ninth = connect(&url);
        // generous: the answer is immediate; waiting in the backlog never ends
        ninth
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        ninth.write_all(ping().as_bytes()).unwrap();
        let while_full = read_response(&mut ninth);
        drop(idle); // room again, once the endpoint has seen them close
        let mut after = None;
        for _ in 0..50 {
            let mut next = connect(&url);
            next.write_all(ping().as_bytes()).unwrap();
            after = read_response(&mut next).map(|r| r.status);
            if after != Some(503) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (while_full, after)
    })
    .await
    .unwrap();
    let refused = while_full.expect("an answer while full, not a wait");
    assert_eq!(refused.status, 503, "{}", refused.head);
    assert!(
        refused.head.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        refused.head
    );
    assert_eq!(after, Some(200), "served once there is room");
}

fn ping() -> String {
    format!(
        "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 8\r\n\r\n[\"PING\"]"
    )
}

/// What one of many clients got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Got {
    Answer {
        status: u16,
        retry_after: bool,
    },
    /// No connection within the limit (backlog full: SYNs dropped).
    ConnectTimeout,
    ConnectFailed,
    /// Connected, sent, no answer within the limit.
    Hang,
    /// The connection closed or reset before a whole answer.
    Closed,
}

/// One client: connects, sends one `ECHO`, reads the answer; returns the
/// connection too, so it stays open (keep-alive) until every client is done.
async fn echo_once(addr: String, i: usize) -> (Got, Option<tokio::net::TcpStream>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let limit = Duration::from_secs(10);
    let mut s = match tokio::time::timeout(limit, tokio::net::TcpStream::connect(&addr)).await {
        Err(_) => return (Got::ConnectTimeout, None),
        Ok(Err(_)) => return (Got::ConnectFailed, None),
        Ok(Ok(s)) => s,
    };
    let body = format!(r#"["ECHO","{i}"]"#);
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).await.is_err() {
        return (Got::Closed, None);
    }
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let status = head.split_whitespace().nth(1)?.parse().ok()?;
                let retry_after = head.contains("\r\nretry-after:");
                return Some(Got::Answer {
                    status,
                    retry_after,
                });
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    match tokio::time::timeout(limit, read).await {
        Err(_) => (Got::Hang, Some(s)),
        Ok(None) => (Got::Closed, None),
        Ok(Some(got)) => (got, Some(s)),
    }
}

/// 2,000 clients at once, one `ECHO` each on a keep-alive connection each holds
/// until all are done (issue 41: 224 connect timeouts, the rest of those past
/// the cap unanswered): all connect and all are answered, `200` for as many as
/// the cap (512 by default) allows, a fast `503` with `Retry-After` past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_clients_at_once_are_all_answered() {
    let redis = RedisServer::start();
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    // no connection closes as idle while the clients hold theirs
    config.header_timeout = Duration::from_secs(60);
    let ep = Endpoint::start_with(config).await;
    let addr = floodgate_tests::http::authority(&ep.url).to_string();
    let started = std::time::Instant::now();
    let clients: Vec<_> = (0..2000)
        .map(|i| tokio::spawn(echo_once(addr.clone(), i)))
        .collect();
    let mut held = vec![];
    let mut outcomes = std::collections::BTreeMap::<Got, usize>::new();
    for c in clients {
        let (got, stream) = c.await.unwrap();
        *outcomes.entry(got).or_default() += 1;
        held.push(stream);
    }
    let took = started.elapsed();
    drop(held);
    eprintln!("2,000 clients at once, in {took:?}: {outcomes:?}");
    let ok = Got::Answer {
        status: 200,
        retry_after: false,
    };
    let refused = Got::Answer {
        status: 503,
        retry_after: true,
    };
    assert_eq!(outcomes.get(&ok), Some(&512), "{outcomes:?}");
    assert_eq!(outcomes.get(&refused), Some(&(2000 - 512)), "{outcomes:?}");
}

/// The endpoint's own health: whether its Redis answers, through the store.
#[tokio::test]
async fn the_health_route_reports_redis() {
    let redis = RedisServer::start();
    let mut config = EndpointConfig::new(redis.url(), TOKEN);
    config.redis.deadline = Duration::from_millis(300);
    let ep = Endpoint::start_with(config).await;
    let health = format!("{}/__floodgate/health", ep.url);
    let r = reqwest::get(&health).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"redis": "ok"}));
    drop(redis);
    let r = reqwest::get(&health).await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
}
