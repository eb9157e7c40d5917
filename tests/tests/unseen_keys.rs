//! Issue 38: at fan-out an instance has seldom read a key's record, and exact
//! mode paid that read (one command, one more global round trip) on top of the
//! check's four commands. A key this instance never read is now decided in ONE
//! call that reads its record with its buckets (`edge/src/pipeline/unseen.rs`),
//! on the plan the records it read lately all had. Tried as a client sees it,
//! on both hosts: the bill of unseen keys, a key on another plan, a revoked
//! key and a key that does not exist, each after the guess holds.

use std::time::Duration;

use floodgate_edge::admin;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::keychanges::KeyChanges;
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{EdgeInstance, EdgeKind, EdgeOptions, RedisServer, on_both_hosts};

on_both_hosts!(
    an_unseen_exact_key_bills_one_call_with_its_record,
    a_key_off_the_guess_is_decided_on_its_own_plan_and_costs_the_guess_nothing,
    a_revoked_or_missing_key_after_the_guess_is_refused_and_mints_nothing,
);

const CONFIG: &str = r#"{"policies":[
    {"name":"default","dimensions":["api_key"],
     "quota":{"capacity":100000,"refill":100000,"period":"1m"},"failure_mode":"fail_closed"},
    {"name":"small","dimensions":["api_key"],
     "quota":{"capacity":7,"refill":7,"period":"1h"},"failure_mode":"fail_closed"}],
    "plans":{"free":["default"],"pro":["small"]}}"#;

/// Keys read before the guess holds (`records::GUESS_AFTER` is 8), and a few more.
const WARM: usize = 10;

struct Stack {
    redis: RedisServer,
    store: RespStore,
    edge: EdgeInstance,
    _upstream: RawUpstream,
    client: reqwest::Client,
}

impl Stack {
    /// One edge of `kind` over a Redis holding [`CONFIG`]; [`WARM`] keys of plan
    /// `free` each sent once, so the edge guesses `free`.
    async fn start(kind: EdgeKind) -> Stack {
        let redis = RedisServer::start();
        let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
            .await
            .unwrap();
        admin::set_config(&store, CONFIG).await.unwrap();
        let upstream = RawUpstream::start().await;
        let edge = floodgate_tests::start_edge_with(
            kind,
            &redis,
            &upstream.url,
            &EdgeOptions {
                stats_flush_ms: 60_000,
                ..EdgeOptions::default()
            },
        )
        .await;
        let stack = Stack {
            redis,
            store,
            edge,
            _upstream: upstream,
            client: reqwest::Client::new(),
        };
        for _ in 0..WARM {
            let secret = stack.key("free").await.1;
            assert_eq!(stack.get(&secret).await.status(), 200);
        }
        stack
    }

    /// A new key of `plan`: its id and secret.
    async fn key(&self, plan: &str) -> (String, String) {
        let new = KeyChanges {
            plan: Some(plan.into()),
            ..KeyChanges::default()
        };
        let (record, secret) = admin::create_key_with(&self.store, &new, 1_764_000_000)
            .await
            .unwrap();
        (record.id, secret)
    }

    async fn get(&self, secret: &str) -> reqwest::Response {
        self.client
            .get(format!("{}/v1/items", self.edge.url))
            .bearer_auth(secret)
            .send()
            .await
            .unwrap()
    }

    fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut self.redis.connection())
            .unwrap();
    }

    fn billed(&self) -> Vec<(String, u64)> {
        floodgate_tests::scale::billed_by_name(&mut self.redis.connection())
    }

    /// The Redis keys of `id`'s buckets (any policy).
    fn buckets_of(&self, id: &str) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(format!("fg:{{k:{id}}}:*"))
            .query(&mut self.redis.connection())
            .unwrap()
    }
}

fn calls(by_name: &[(String, u64)], name: &str) -> u64 {
    by_name
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, c)| *c)
}

/// Redis' clock, in µs.
fn redis_now(redis: &RedisServer) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut redis.connection()).unwrap();
    secs * 1_000_000 + micros
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()[name].to_str().unwrap().to_string()
}

/// 20 keys the edge never read, one request each: 4 billed commands per
/// request (the script, its TIME, one MGET of the bucket, revision and record,
/// one SET), where reading the record first billed 5 and waited for two round
/// trips.
async fn an_unseen_exact_key_bills_one_call_with_its_record(kind: EdgeKind) {
    let s = Stack::start(kind).await;
    let mut secrets = vec![];
    for _ in 0..20 {
        secrets.push(s.key("free").await.1);
    }
    s.reset_stats();
    for secret in &secrets {
        let r = s.get(secret).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit"), "100000");
        assert_eq!(header(&r, "x-ratelimit-remaining"), "99999");
    }
    let by_name = s.billed();
    let total: u64 = by_name.iter().map(|(_, c)| c).sum();
    println!("{kind:?}: {total} billed for 20 unseen keys: {by_name:?}");
    assert_eq!(
        calls(&by_name, "evalsha") + calls(&by_name, "eval"),
        20,
        "{by_name:?}"
    );
    assert_eq!(
        calls(&by_name, "mget"),
        20,
        "no read besides the call's: {by_name:?}"
    );
    assert!(total <= 4 * 20 + 2, "{total} billed: {by_name:?}");
    // and each key's record is cached: its next request reads nothing more
    s.reset_stats();
    assert_eq!(s.get(&secrets[0]).await.status(), 200);
    let by_name = s.billed();
    assert_eq!(calls(&by_name, "mget"), 1, "{by_name:?}");
}

/// A key of plan `pro` (7 per hour) after the edge guessed `free`: answered on
/// its own plan, its own bucket spent once, and the guessed plan's bucket given
/// back (nothing of 100,000 spent on a policy that is not the key's).
async fn a_key_off_the_guess_is_decided_on_its_own_plan_and_costs_the_guess_nothing(
    kind: EdgeKind,
) {
    let s = Stack::start(kind).await;
    let (id, secret) = s.key("pro").await;
    let r = s.get(&secret).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit"), "7");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "6");
    // the guess's bucket (fg:{k:<id>}:default) was given back: the refund
    // runs in the background
    let guessed = format!("fg:{{k:{id}}}:default");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let full_at: Option<i64> = redis::cmd("GET")
            .arg(&guessed)
            .query(&mut s.redis.connection())
            .unwrap();
        let now = redis_now(&s.redis);
        if full_at.is_none_or(|f| f <= now) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the guessed bucket still owes {} µs",
            full_at.unwrap() - now
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // the key's own quota: 6 more, then 429
    for left in (0..6).rev() {
        let r = s.get(&secret).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-remaining"), left.to_string());
    }
    assert_eq!(s.get(&secret).await.status(), 429);
}

/// After the guess holds: a revoked key is refused (401) with its bucket
/// untouched, and a well-formed key that does not exist is refused (401) with no
/// bucket minted for it.
async fn a_revoked_or_missing_key_after_the_guess_is_refused_and_mints_nothing(kind: EdgeKind) {
    let s = Stack::start(kind).await;
    let (id, secret) = s.key("free").await;
    admin::revoke_key(&s.store, &id).await.unwrap();
    let r = s.get(&secret).await;
    assert_eq!(r.status(), 401);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = redis_now(&s.redis);
    for key in s.buckets_of(&id) {
        let full_at: Option<i64> = redis::cmd("GET")
            .arg(&key)
            .query(&mut s.redis.connection())
            .unwrap();
        assert!(
            full_at.is_none_or(|f| f <= now),
            "a revoked key's bucket {key} spent"
        );
    }
    // a key of the right shape and checksum that was never created
    let ghost_id = "Gh0stKey00";
    let ghost = floodgate_shared::apikeys::secret_for(ghost_id, &[b'a'; 32]);
    let r = s.get(&ghost).await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        s.buckets_of(ghost_id),
        Vec::<String>::new(),
        "a key that does not exist mints no bucket"
    );
}
