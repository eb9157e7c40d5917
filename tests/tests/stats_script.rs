//! `lua/stats_flush.lua` in real Redis (issue 22: "the statistics flush is ONE
//! command … The statistics script refuses malformed deltas with `ERR floodgate:
//! …` and writes nothing"): what one call writes, what it refuses (nothing
//! written), the sample trimmed once per quarter of its size rather than per
//! flush, and the same flush on a Redis Cluster as one call per key.

use std::time::Duration;

use floodgate_edge::store::Store;
use floodgate_edge::store::cluster::ClusterStore;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::stats::{
    LAST_USED_KEY, MINUTE_TTL_SECS, MinuteWrite, SAMPLE_CHUNK, SAMPLE_KEEP, SAMPLE_KEY,
    SAMPLE_TRIM_AT, STATS_FLUSH, StatsWrite,
};
use floodgate_tests::RedisServer;
use floodgate_tests::cluster::RedisCluster;
use redis::Commands;

fn write(minutes: &[(&str, &str, bool)], sample: &[String], last: &[(&str, i64)]) -> StatsWrite {
    StatsWrite {
        field: "@0123abcd".into(),
        minutes: minutes
            .iter()
            .map(|(k, c, e)| MinuteWrite {
                key: k.to_string(),
                counts: c.to_string(),
                expire: *e,
            })
            .collect(),
        sample: sample.to_vec(),
        last_used: last.iter().map(|(k, s)| (k.to_string(), *s)).collect(),
    }
}

fn entry(i: usize) -> String {
    format!(
        "{}|k{}|free|unmatched|allowed",
        1_764_000_000_000u64 + i as u64,
        i % 7
    )
}

/// Runs one call of the script with these keys and arguments.
fn eval(c: &mut redis::Connection, keys: &[String], args: &[String]) -> redis::RedisResult<i64> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(STATS_FLUSH.source).arg(keys.len());
    for k in keys {
        cmd.arg(k);
    }
    for a in args {
        cmd.arg(a);
    }
    cmd.query(c)
}

fn commands_run(c: &mut redis::Connection, name: &str) -> u64 {
    floodgate_tests::scale::command_calls(c)
        .into_iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, n)| n)
}

#[test]
fn one_call_writes_the_minutes_the_sample_and_the_last_use() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let sample: Vec<String> = (0..3).map(entry).collect();
    let w = write(
        &[
            ("fg:stats:10", r#"{"minute":{"a":1}}"#, true),
            ("fg:stats:11", "{}", false),
        ],
        &sample,
        &[("k1", 60), ("k2", 120)],
    );
    let calls = w.calls(true);
    assert_eq!(calls.len(), 1, "ONE call per flush on one Redis");
    let (keys, args) = &calls[0];
    assert_eq!(eval(&mut c, keys, args).unwrap(), 3, "the sample's length");
    let field: String = c.hget("fg:stats:10", "@0123abcd").unwrap();
    assert_eq!(field, r#"{"minute":{"a":1}}"#, "the counts, byte for byte");
    let ttl: i64 = c.ttl("fg:stats:10").unwrap();
    assert!(
        (MINUTE_TTL_SECS as i64 - 5..=MINUTE_TTL_SECS as i64).contains(&ttl),
        "{ttl}"
    );
    assert_eq!(c.ttl::<_, i64>("fg:stats:11").unwrap(), -1, "no TTL asked");
    let list: Vec<String> = c.lrange(SAMPLE_KEY, 0, -1).unwrap();
    let newest_first: Vec<String> = sample.iter().rev().cloned().collect();
    assert_eq!(list, newest_first);
    let last: Vec<(String, i64)> = c.hgetall(LAST_USED_KEY).unwrap();
    assert_eq!(last.len(), 2);
    assert!(last.contains(&("k2".into(), 120)));
}

#[test]
fn malformed_input_is_refused_by_name_and_nothing_is_written() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let good = || write(&[("fg:stats:10", "{}", true)], &[entry(1)], &[("k1", 60)]);
    let (keys, args) = good().calls(true).remove(0);
    // each case: one argument (by index) or the keys changed
    let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
        ("counts not JSON", keys.clone(), set(&args, 6, "{nope")),
        ("counts a JSON array", keys.clone(), set(&args, 6, "[1,2]")),
        ("counts a JSON number", keys.clone(), set(&args, 6, "12")),
        ("a TTL flag of 2", keys.clone(), set(&args, 7, "2")),
        ("a sample entry", keys.clone(), set(&args, 8, "garbage")),
        ("a last use of -1", keys.clone(), set(&args, 10, "-1")),
        ("a last use of x", keys.clone(), set(&args, 10, "x")),
        ("an empty key id", keys.clone(), set(&args, 9, "")),
        ("a minute count of x", keys.clone(), set(&args, 3, "x")),
        ("a negative TTL", keys.clone(), set(&args, 1, "-5")),
        ("a bad field", keys.clone(), set(&args, 0, "instance")),
        ("a missing key", keys[..2].to_vec(), args.clone()),
        (
            "an extra argument",
            keys.clone(),
            [args.clone(), vec!["1".into()]].concat(),
        ),
        ("too few sample entries", keys.clone(), set(&args, 4, "2")),
    ];
    for (what, keys, args) in cases {
        let err = eval(&mut c, &keys, &args).expect_err(what);
        assert!(
            err.to_string().contains("floodgate: stats flush"),
            "{what}: {err}"
        );
        let n: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
        assert_eq!(n, 0, "{what}: nothing written");
    }
    // the good one writes
    assert_eq!(eval(&mut c, &keys, &args).unwrap(), 1);
    let n: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 3);
}

fn set(args: &[String], i: usize, value: &str) -> Vec<String> {
    let mut a = args.to_vec();
    a[i] = value.into();
    a
}

/// Flushes of 5,000 entries (each in calls of SAMPLE_CHUNK): the list grows past
/// SAMPLE_KEEP to SAMPLE_TRIM_AT without a trim, the next push trims it back,
/// once; readers' first SAMPLE_KEEP are the newest all along.
#[test]
fn the_sample_is_trimmed_once_per_quarter_of_its_size_not_per_flush() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let per_flush = 5_000;
    let mut pushed = 0;
    let mut lengths = vec![];
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
    for _ in 0..6 {
        let sample: Vec<String> = (pushed..pushed + per_flush).map(entry).collect();
        pushed += per_flush;
        let mut length = 0;
        for (keys, args) in write(&[], &sample, &[]).calls(true) {
            length = eval(&mut c, &keys, &args).unwrap() as usize;
        }
        lengths.push(length);
    }
    assert_eq!(SAMPLE_TRIM_AT, 25_000);
    // the sixth flush's first part found 26,000 and trimmed back; its other
    // four parts came after
    let after_trim = SAMPLE_KEEP + per_flush - SAMPLE_CHUNK;
    assert_eq!(
        lengths,
        [5_000, 10_000, 15_000, 20_000, 25_000, after_trim],
        "trimmed back once past {SAMPLE_TRIM_AT}"
    );
    assert_eq!(
        commands_run(&mut c, "ltrim"),
        1,
        "one LTRIM for 30,000 entries"
    );
    assert_eq!(commands_run(&mut c, "lpush"), 6 * 5, "in parts of 1,000");
    let len: usize = c.llen(SAMPLE_KEY).unwrap();
    assert_eq!(len, after_trim);
    let head: Vec<String> = c.lrange(SAMPLE_KEY, 0, 0).unwrap();
    assert_eq!(head, [entry(pushed - 1)], "the newest first");
    let tail: Vec<String> = c.lrange(SAMPLE_KEY, -1, -1).unwrap();
    assert_eq!(tail, [entry(pushed - after_trim)], "the oldest kept");
}

/// Long lists of last-use pairs go in parts too (Lua's unpack has a limit).
#[test]
fn ten_thousand_last_use_times_are_written_in_one_call() {
    let server = RedisServer::start();
    let mut c = server.connection();
    let ids: Vec<String> = (0..10_000).map(|i| format!("key{i}")).collect();
    let last: Vec<(&str, i64)> = ids.iter().map(|k| (k.as_str(), 7)).collect();
    let (keys, args) = write(&[], &[], &last).calls(true).remove(0);
    assert_eq!(eval(&mut c, &keys, &args).unwrap(), 0);
    let n: usize = c.hlen(LAST_USED_KEY).unwrap();
    assert_eq!(n, 10_000);
}

/// The edge's own store call: one script call on one Redis, and on a cluster one
/// per key, all written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_writes_a_flush_on_one_redis_and_on_a_cluster() {
    let w = write(
        &[
            ("fg:stats:20", r#"{"minute":{"b":2}}"#, true),
            ("fg:stats:21", "{}", true),
        ],
        &[entry(1), entry(2)],
        &[("k9", 600)],
    );
    let server = RedisServer::start();
    let store = RespStore::connect(&server.url(), Duration::from_secs(2))
        .await
        .unwrap();
    // the first call loads the script (EVALSHA answered NOSCRIPT, then EVAL)
    store
        .write_stats(&write(&[], &[entry(0)], &[]))
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.connection())
        .unwrap();
    store.write_stats(&w).await.unwrap();
    let mut c = server.connection();
    assert_eq!(
        commands_run(&mut c, "evalsha") + commands_run(&mut c, "eval"),
        1
    );
    assert_eq!(
        commands_run(&mut c, "hset"),
        3,
        "two minutes and the last use"
    );
    let bad = StatsWrite {
        sample: vec!["not an entry".into()],
        ..w.clone()
    };
    assert!(
        store.write_stats(&bad).await.is_err(),
        "a refusal is an error"
    );

    let cluster = RedisCluster::start(3, 0);
    let store = ClusterStore::connect(&cluster.url(), Duration::from_secs(2))
        .await
        .unwrap();
    store.write_stats(&w).await.unwrap();
    let field = store.hget("fg:stats:20", "@0123abcd").await.unwrap();
    assert_eq!(field.as_deref(), Some(br#"{"minute":{"b":2}}"#.as_slice()));
    assert!(
        store
            .hget("fg:stats:21", "@0123abcd")
            .await
            .unwrap()
            .is_some()
    );
    let sample = store.lrange(SAMPLE_KEY, 0, -1).await.unwrap();
    assert_eq!(sample.len(), 2);
    assert_eq!(w.calls(false).len(), 4, "one call per key");
    let last = store.hget(LAST_USED_KEY, "k9").await.unwrap();
    assert_eq!(last.as_deref(), Some(b"600".as_slice()));
}
