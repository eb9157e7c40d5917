//! Credits and calendar quotas at the edge, on BOTH hosts (the native host and
//! the Worker in workerd, real Redis, a real upstream): N credits admit exactly
//! N of 40 concurrent connections' requests over two edges, even beside a
//! bounded policy (credits take the exact path), and the credit denials spend no
//! token; a rate-limit denial spends no credit; the usage-limit 429's body and
//! headers; a credits-only plan; a monthly quota's reset headers name the 1st at
//! 00:00 UTC (Redis' own clock).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use floodgate_edge::admin;
use floodgate_edge::store::Store;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::calendar::{DAY, civil_from_days, day_window, month_window};
use floodgate_shared::credits::CreditState;
use floodgate_shared::keychanges::{CreditsInput, KeyChanges};
use floodgate_shared::keys::credits_key;
use floodgate_shared::policy::Policy;
use floodgate_shared::script::Check;
use floodgate_shared::time::MICROS_PER_SEC;
use floodgate_tests::upstream::RawUpstream;
use floodgate_tests::{
    EdgeInstance, EdgeKind, EdgeOptions, RedisServer, on_both_hosts, start_edge_with,
};
use reqwest::StatusCode;

on_both_hosts!(
    n_credits_admit_exactly_n_of_forty_connections_and_their_denials_spend_no_token,
    a_rate_limit_denial_spends_no_credit_and_a_spent_key_gets_the_usage_limit_answer,
    a_monthly_quota_resets_on_the_first_at_midnight_utc,
);

/// A roomy bounded policy (the leased path for keys without credits), a tight
/// exact one, a credits-only plan and a monthly quota.
const CONFIG: &str = r#"{
  "policies": [
    {"name": "roomy", "dimensions": ["api_key"], "quota": {"capacity": 1000, "refill": 1, "period": "1h"}, "failure_mode": "fail_open", "consistency": "bounded", "max_overshoot": 100},
    {"name": "tight", "dimensions": ["api_key"], "quota": {"capacity": 3, "refill": 1, "period": "1h"}, "failure_mode": "fail_open"},
    {"name": "monthly", "dimensions": ["api_key"], "quota": {"capacity": 2, "period": "month"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"bounded": ["roomy"], "tight": ["tight"], "bare": [], "monthly": ["monthly"]},
  "headers": {"ietf": true}
}"#;

struct Stack {
    redis: RedisServer,
    store: RespStore,
    upstream: RawUpstream,
    edge: EdgeInstance,
}

async fn stack(kind: EdgeKind) -> Stack {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&store, CONFIG).await.unwrap();
    let upstream = RawUpstream::start().await;
    let edge = start_edge_with(kind, &redis, &upstream.url, &EdgeOptions::default()).await;
    Stack {
        redis,
        store,
        upstream,
        edge,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Creates a key of `plan` with `credits` (JSON of the admin input); its id and secret.
async fn key(store: &RespStore, plan: &str, credits: Option<&str>) -> (String, String) {
    let new = KeyChanges {
        plan: Some(plan.into()),
        credits: credits.map(|c| Some(serde_json::from_str::<CreditsInput>(c).unwrap())),
        ..KeyChanges::default()
    };
    let (record, secret) = admin::create_key_with(store, &new, now_secs())
        .await
        .unwrap();
    (record.id, secret)
}

async fn get(c: &reqwest::Client, edge: &str, secret: &str) -> reqwest::Response {
    c.get(format!("{edge}/v1/items"))
        .bearer_auth(secret)
        .send()
        .await
        .unwrap()
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// The live count of a key's credits in Redis.
fn live(redis: &RedisServer, id: &str) -> Option<CreditState> {
    let raw: Option<String> = redis::cmd("GET")
        .arg(credits_key(id, None))
        .query(&mut redis.connection())
        .unwrap();
    raw.as_deref().and_then(CreditState::parse_stored)
}

/// 37 credits, 40 concurrent connections over two edges, 3 requests each: exactly
/// 37 admitted, although the key's plan is a bounded policy (whose leases would
/// hand tokens out ahead: credits take the exact path). The 83 refused spent no
/// token: the bucket holds exactly 1000 − 37. A key of the same plan without
/// credits leases as before.
async fn n_credits_admit_exactly_n_of_forty_connections_and_their_denials_spend_no_token(
    kind: EdgeKind,
) {
    let s = stack(kind).await;
    let (id, secret) = key(&s.store, "bounded", Some(r#"{"remaining": 37}"#)).await;
    let e2 = start_edge_with(kind, &s.redis, &s.upstream.url, &EdgeOptions::default()).await;
    let edges = [s.edge.url.clone(), e2.url.clone()];
    let admitted =
        floodgate_tests::admitted_across(client, &edges, std::slice::from_ref(&secret), 40, 3)
            .await;
    assert_eq!(admitted, 37, "120 attempts of a key with 37 credits");
    assert_eq!(live(&s.redis, &id).map(|c| c.remaining), Some(0));
    // no lease was taken for it: the bucket was decided exactly, 37 tokens
    let roomy = Policy::from_json(
        r#"{"name": "roomy", "dimensions": ["api_key"], "quota": {"capacity": 1000, "refill": 1, "period": "1h"}, "failure_mode": "fail_open"}"#,
    )
    .unwrap();
    let bucket = format!("fg:{{k:{id}}}:roomy");
    let peek = s
        .store
        .check(&[Check::new(&bucket, roomy.quota(), 0)], None)
        .await
        .unwrap();
    assert_eq!(
        peek.decisions[0].remaining,
        1000 - 37,
        "credit denials spend no token"
    );
    let mut in_slot: Vec<String> = redis::cmd("KEYS")
        .arg(format!("fg:{{k:{id}}}*"))
        .query(&mut s.redis.connection())
        .unwrap();
    in_slot.sort();
    assert_eq!(
        in_slot,
        [credits_key(&id, None), bucket.clone()],
        "the bucket and the credits, no lease or pool state"
    );
    // the spent key: the usage-limit 429, for good (no refill: no Retry-After)
    let r = get(&client(), &s.edge.url, &secret).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "x-floodgate-credits-remaining"), Some("0"));
    assert_eq!(header(&r, "x-floodgate-credits-reset"), None);
    assert_eq!(header(&r, "retry-after"), None);
    assert_eq!(header(&r, "x-ratelimit-remaining"), None, "not a rate");
    assert_eq!(
        r.text().await.unwrap(),
        r#"{"error":"Usage limit exceeded"}"#
    );
}

/// A policy of 3 per hour, credits of 10 refilled daily: 5 requests, 3 admitted
/// (credits 9, 8, 7), 2 rate limited spending none (7 left in Redis); then a key
/// with 1 credit refilled monthly: the second request is the usage-limit 429,
/// its Retry-After and reset at the next refill (the 1st, 00:00 UTC); and a
/// credits-only plan (no policy) spends its credits just the same.
async fn a_rate_limit_denial_spends_no_credit_and_a_spent_key_gets_the_usage_limit_answer(
    kind: EdgeKind,
) {
    let s = stack(kind).await;
    let c = client();
    let (id, secret) = key(
        &s.store,
        "tight",
        Some(r#"{"remaining": 10, "refill": {"amount": 10, "interval": "daily"}}"#),
    )
    .await;
    let midnight = day_window(now_secs() * MICROS_PER_SEC).reset / MICROS_PER_SEC;
    let mut seen = vec![];
    for _ in 0..5 {
        let r = get(&c, &s.edge.url, &secret).await;
        let remaining = header(&r, "x-floodgate-credits-remaining").map(str::to_string);
        let reset = header(&r, "x-floodgate-credits-reset").map(str::to_string);
        seen.push((r.status().as_u16(), remaining, reset));
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(
                r.text().await.unwrap(),
                r#"{"error":"Rate limit exceeded"}"#
            );
        }
    }
    let want = |status, left: &str| (status, Some(left.to_string()), Some(midnight.to_string()));
    assert_eq!(
        seen[..4],
        [
            want(200, "9"),
            want(200, "8"),
            want(200, "7"),
            want(429, "7")
        ],
        "a rate-limit denial spends no credit"
    );
    // the instance may answer a bucket it saw throttled from memory: no store
    // call, so no credit headers (and nothing spent)
    assert!(
        seen[4] == want(429, "7") || seen[4] == (429, None, None),
        "{:?}",
        seen[4]
    );
    assert_eq!(live(&s.redis, &id).map(|c| c.remaining), Some(7));

    let (_, one) = key(
        &s.store,
        "tight",
        Some(r#"{"remaining": 1, "refill": {"amount": 5, "interval": "monthly"}}"#),
    )
    .await;
    let first = get(&c, &s.edge.url, &one).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "x-floodgate-credits-remaining"), Some("0"));
    assert_eq!(header(&first, "x-ratelimit-remaining"), Some("2"));
    let r = get(&c, &s.edge.url, &one).await;
    let now = now_secs();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let first_of_next = month_window(now * MICROS_PER_SEC).reset / MICROS_PER_SEC;
    assert_eq!(
        header(&r, "x-floodgate-credits-reset"),
        Some(first_of_next.to_string().as_str())
    );
    let retry: i64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!(
        (first_of_next - now - 2..=first_of_next - now + 1).contains(&retry),
        "{retry} s to {first_of_next}"
    );
    assert_eq!(
        r.text().await.unwrap(),
        r#"{"error":"Usage limit exceeded"}"#
    );

    let (bare_id, bare) = key(&s.store, "bare", Some(r#"{"remaining": 2}"#)).await;
    let statuses: Vec<u16> = futures_statuses(&c, &s.edge.url, &bare, 4).await;
    assert_eq!(
        statuses,
        [200, 200, 429, 429],
        "a plan without policies spends credits too"
    );
    assert_eq!(live(&s.redis, &bare_id).map(|c| c.remaining), Some(0));
}

async fn futures_statuses(c: &reqwest::Client, edge: &str, secret: &str, n: usize) -> Vec<u16> {
    let mut out = vec![];
    for _ in 0..n {
        out.push(get(c, edge, secret).await.status().as_u16());
    }
    out
}

/// A quota of 2 per calendar month, decided by Redis' own clock: both admissions
/// and the 429 name the next month's 1st at 00:00 UTC in `X-RateLimit-Reset`, the
/// 429's `Retry-After` and the IETF `RateLimit` field's `t` count down to it.
async fn a_monthly_quota_resets_on_the_first_at_midnight_utc(kind: EdgeKind) {
    let s = stack(kind).await;
    let c = client();
    let (_, secret) = key(&s.store, "monthly", None).await;
    let reset = month_window(now_secs() * MICROS_PER_SEC).reset / MICROS_PER_SEC;
    let (y, m, d) = civil_from_days(reset * MICROS_PER_SEC / DAY);
    assert_eq!(
        (d, reset % 86_400),
        (1, 0),
        "{y}-{m}-{d}: the 1st, 00:00 UTC"
    );
    for left in ["1", "0"] {
        let r = get(&c, &s.edge.url, &secret).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("2"));
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some(left));
        assert_eq!(
            header(&r, "x-ratelimit-reset"),
            Some(reset.to_string().as_str())
        );
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"monthly\";q=2;w=2678400")
        );
    }
    let r = get(&c, &s.edge.url, &secret).await;
    let now = now_secs();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&r, "x-ratelimit-reset"),
        Some(reset.to_string().as_str())
    );
    let retry: i64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!(
        (reset - now - 2..=reset - now + 1).contains(&retry),
        "{retry} s to {reset}"
    );
    let field = header(&r, "ratelimit").unwrap().to_string();
    let t: i64 = field.rsplit("t=").next().unwrap().parse().unwrap();
    assert!((reset - now - 2..=reset - now + 1).contains(&t), "{field}");
    assert!(field.starts_with("\"monthly\";r=0;"), "{field}");
}

/// `key create --credits` stores them; negative, fractional or too many credits
/// and a `day` with `daily` are refused naming the field, nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_keys_with_credits_and_refuses_bad_ones_naming_the_field() {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    let run = |credits: &str| {
        let args = [
            "--redis",
            &redis.url(),
            "key",
            "create",
            "--plan",
            "free",
            "--credits",
            credits,
        ];
        floodgate_tests::cli(args.iter().map(|s| s.to_string()).collect())
    };
    for (bad, field) in [
        (r#"{"remaining": -1}"#, "credits.remaining"),
        (r#"{"remaining": 1.5}"#, "credits.remaining"),
        (r#"{"remaining": 1000000000001}"#, "credits.remaining"),
        (
            r#"{"remaining": 1, "refill": {"amount": 0, "interval": "daily"}}"#,
            "credits.refill.amount",
        ),
        (
            r#"{"remaining": 1, "refill": {"amount": 2, "interval": "daily", "day": 3}}"#,
            "credits.refill.day",
        ),
        (
            r#"{"remaining": 1, "refill": {"amount": 2, "interval": "monthly", "day": 32}}"#,
            "credits.refill.day",
        ),
        (
            r#"{"remaining": 1, "refill": {"amount": 2, "interval": "weekly"}}"#,
            "not credits JSON",
        ),
    ] {
        let e = run(bad).await.unwrap_err();
        assert!(e.contains(field), "{bad}: {e}");
    }
    assert!(
        admin::list_keys(&store).await.unwrap().is_empty(),
        "nothing stored"
    );
    run(r#"{"remaining": 5, "refill": {"amount": 100, "interval": "monthly", "day": 31}}"#)
        .await
        .unwrap();
    let keys = admin::list_keys(&store).await.unwrap();
    let c = keys[0].credits.expect("credits stored");
    assert_eq!(
        (c.remaining, c.refill.map(|r| (r.amount, r.day))),
        (5, Some((100, Some(31))))
    );
}

/// An operator changing a key's credits starts its live count again from the
/// new count (in Redis' clock); removing them removes it, and the key is then
/// limited by its policies alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_a_keys_credits_starts_its_live_count_again() {
    let s = stack(EdgeKind::Native).await;
    let c = client();
    let (id, secret) = key(&s.store, "bare", Some(r#"{"remaining": 3}"#)).await;
    for left in ["2", "1"] {
        let r = get(&c, &s.edge.url, &secret).await;
        assert_eq!(header(&r, "x-floodgate-credits-remaining"), Some(left));
    }
    let monthly = floodgate_shared::credits::Credits {
        remaining: 10,
        refill: Some(floodgate_shared::credits::Refill {
            amount: 50,
            interval: floodgate_shared::credits::Interval::Monthly,
            day: None,
        }),
    };
    admin::update_key(&s.store, &id, |r| r.credits = Some(monthly))
        .await
        .unwrap();
    let state = live(&s.redis, &id).expect("a live count");
    assert_eq!(state.remaining, 10);
    assert!((now_secs() - 5..=now_secs()).contains(&(state.as_of / MICROS_PER_SEC)));
    let pttl: i64 = redis::cmd("PTTL")
        .arg(credits_key(&id, None))
        .query(&mut s.redis.connection())
        .unwrap();
    let to_refill = month_window(state.as_of).reset - state.as_of;
    assert!(
        (to_refill / 1000 - 5_000..=to_refill / 1000 + 1).contains(&pttl),
        "{pttl}"
    );
    let r = get(&c, &s.edge.url, &secret).await;
    assert_eq!(header(&r, "x-floodgate-credits-remaining"), Some("9"));
    // an unrelated change leaves the live count alone
    admin::update_key(&s.store, &id, |r| r.owner = "acme".into())
        .await
        .unwrap();
    assert_eq!(live(&s.redis, &id).map(|c| c.remaining), Some(9));
    admin::update_key(&s.store, &id, |r| r.credits = None)
        .await
        .unwrap();
    assert_eq!(live(&s.redis, &id), None, "no credits, no live count");
}
