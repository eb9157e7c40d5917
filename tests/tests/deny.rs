//! Deny lists end to end on BOTH hosts (the native host and the Worker in
//! workerd): a denied request gets a 403 naming nothing, never reaches the
//! upstream, costs no quota, and is counted per list in Redis. The lists are
//! edited the way floodgate-cli does it (`admin::edit_deny`: validated,
//! version-checked, audited).

use std::time::{Duration, Instant};

use floodgate_edge::admin::{self, AdminError, DenyEdit};
use floodgate_edge::demo_upstream::{self, Seen};
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::deny::DenyList;
use floodgate_tests::dash::client_from;
use floodgate_tests::{DEMO_CONFIG, EdgeKind, RedisServer, on_both_hosts, serve, start_edge};
use reqwest::StatusCode;

on_both_hosts!(denied_requests_get_403_cost_no_quota_and_are_counted_per_list);

/// The demo configuration (`/v1/checkout` 10 per key) refilling one token an hour,
/// with a user-agent and an address deny list.
fn config() -> String {
    let mut v: serde_json::Value = serde_json::from_str(
        &DEMO_CONFIG.replace(r#""period": "1m""#, r#""refill": 1, "period": "1h""#),
    )
    .unwrap();
    v["deny"] = serde_json::json!({
        "ips": ["198.51.100.0/24", "127.0.0.2"],
        "user_agents": ["BadBot"],
    });
    v.to_string()
}

/// The sum of `field` over every per-minute stats hash.
fn counted(redis: &RedisServer, field: &str) -> u64 {
    floodgate_tests::stats_counted(redis, field)
}

async fn denied_requests_get_403_cost_no_quota_and_are_counted_per_list(kind: EdgeKind) {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&store, &config()).await.unwrap();
    let (_, secret) = admin::create_key(&store, "ok", "free", 1_764_000_000)
        .await
        .unwrap();
    let (banned, banned_secret) = admin::create_key(&store, "banned", "free", 1_764_000_000)
        .await
        .unwrap();
    // the CLI's edit: a bad entry is refused naming it, and nothing is stored
    let (before, _) = admin::load_config(&store).await.unwrap();
    let bad = admin::edit_deny(
        &store,
        DenyList::Ip,
        DenyEdit::Add,
        "10.0.0.300/8",
        "cli:test",
        1,
    )
    .await
    .unwrap_err();
    let AdminError::Invalid(e) = bad else {
        panic!("{bad}")
    };
    assert_eq!(e.field, "deny.ips[2]");
    assert_eq!(admin::load_config(&store).await.unwrap().0, before);
    admin::edit_deny(
        &store,
        DenyList::KeyId,
        DenyEdit::Add,
        &banned.id,
        "cli:test",
        2,
    )
    .await
    .unwrap();
    let audit = admin::audit_log(&store, 1).await.unwrap();
    assert_eq!(
        (audit[0].action.as_str(), audit[0].target.as_str()),
        ("deny.add", "deny.key_id")
    );

    let seen = Seen::default();
    let (upstream, _stop) = serve(demo_upstream::router(seen.clone())).await;
    let edge = start_edge(kind, &redis, &upstream, 5_000).await;
    let url = format!("{}/v1/checkout", edge.url);
    let plain = reqwest::Client::new();
    let from_banned_ip = client_from("127.0.0.2".parse().unwrap());
    for _ in 0..12 {
        let answers = [
            plain
                .get(&url)
                .bearer_auth(&secret)
                .header("User-Agent", "Mozilla/5.0 (compatible; badbot/2.1)")
                .send()
                .await
                .unwrap(),
            // the Worker's client address is CF-Connecting-IP, the native host's the peer
            from_banned_ip
                .get(&url)
                .bearer_auth(&secret)
                .header("CF-Connecting-IP", "127.0.0.2")
                .send()
                .await
                .unwrap(),
            plain
                .get(&url)
                .bearer_auth(&banned_secret)
                .send()
                .await
                .unwrap(),
        ];
        for r in answers {
            assert_eq!(r.status(), StatusCode::FORBIDDEN);
            assert!(r.headers().get("x-ratelimit-remaining").is_none());
            assert!(r.headers().get("retry-after").is_none());
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body, serde_json::json!({"error": "Forbidden"}));
        }
    }
    assert_eq!(seen.total(), 0, "no denied request reached the upstream");
    // 36 denied requests cost no quota: the first admitted one leaves 9 of 10
    let r = plain.get(&url).bearer_auth(&secret).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["x-ratelimit-remaining"], "9");
    assert_eq!(seen.total(), 1);
    // counted per list (edges write their counters about once a second)
    let deadline = Instant::now() + Duration::from_secs(15);
    let lists = ["denied:user_agent", "denied:ip", "denied:key_id"];
    loop {
        let got: Vec<u64> = lists.iter().map(|f| counted(&redis, f)).collect();
        if got == [12, 12, 12] {
            break;
        }
        assert!(Instant::now() < deadline, "counted {got:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        // the Worker flushes after a response
        let _ = plain
            .get(format!("{}/v1/other", edge.url))
            .bearer_auth(&secret)
            .send()
            .await;
    }
    assert_eq!(counted(&redis, "denied:country"), 0);
}

/// `floodgate-cli deny add|remove|list`: the audited save; errors name the entry,
/// the list, or the missing entry, and store nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_edits_deny_lists_through_the_audited_save() {
    let redis = RedisServer::start();
    let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
        .await
        .unwrap();
    admin::set_config(&store, DEMO_CONFIG).await.unwrap();
    let url = redis.url();
    let cli = |words: &[&str]| {
        let mut args = vec!["--redis".to_string(), url.clone()];
        args.extend(words.iter().map(|w| w.to_string()));
        floodgate_tests::cli(args)
    };
    let ips = |store: RespStore| async move {
        let text = admin::get_config(&store).await.unwrap().unwrap();
        let c = floodgate_shared::config::EdgeConfig::from_json(&text).unwrap();
        c.spec().deny.ips.clone()
    };
    cli(&["deny", "add", "ip", "203.0.113.0/24"]).await.unwrap();
    cli(&["deny", "add", "ip", "2001:db8::/32"]).await.unwrap();
    // adding what is there changes nothing
    cli(&["deny", "add", "ip", "2001:db8::/32"]).await.unwrap();
    assert_eq!(
        ips(store.clone()).await,
        ["203.0.113.0/24", "2001:db8::/32"]
    );
    let (version, _) = admin::load_config(&store).await.unwrap();
    for (words, says) in [
        (
            vec!["deny", "add", "country", "de"],
            "deny.countries[0]: \"de\" is not an ISO 3166-1 alpha-2 country code",
        ),
        (
            vec!["deny", "add", "ip", "203.0.113.9/24"],
            "did you mean 203.0.113.0/24",
        ),
        (
            vec!["deny", "add", "addresses", "1.2.3.4"],
            "\"addresses\" is not a deny list (key_id, ip, country, user_agent)",
        ),
        (
            vec!["deny", "remove", "ip", "1.2.3.4"],
            "\"1.2.3.4\" is not on the ip deny list",
        ),
        (vec!["deny", "add", "user_agent", " "], "must not be empty"),
    ] {
        let e = cli(&words).await.unwrap_err();
        assert!(e.contains(says), "{words:?}: {e}");
    }
    assert_eq!(admin::load_config(&store).await.unwrap().0, version);
    cli(&["deny", "remove", "ip", "203.0.113.0/24"])
        .await
        .unwrap();
    assert_eq!(ips(store.clone()).await, ["2001:db8::/32"]);
    cli(&["deny", "list"]).await.unwrap();
    // the repeated add saved nothing, so audited nothing
    let audit = admin::audit_log(&store, 4).await.unwrap();
    let actions: Vec<(&str, &str)> = audit
        .iter()
        .map(|e| (e.action.as_str(), e.target.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("deny.remove", "deny.ip"),
            ("deny.add", "deny.ip"),
            ("deny.add", "deny.ip"),
            ("config.force", "configuration")
        ]
    );
}

/// The native host reads the country from `--country-header` (here CF-IPCountry,
/// as behind Cloudflare); without the flag, country entries never match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_host_denies_countries_from_the_configured_header() {
    use floodgate_edge::native_host::{HostConfig, NativeStore};
    use floodgate_edge::pipeline::{Pipeline, PipelineConfig};
    let redis = RedisServer::start();
    let mut v: serde_json::Value = serde_json::from_str(DEMO_CONFIG).unwrap();
    v["deny"] = serde_json::json!({"countries": ["KP", "T1"]});
    let key = floodgate_tests::seed(&redis, &v.to_string()).await;
    let seen = Seen::default();
    let (upstream, _stop) = serve(demo_upstream::router(seen.clone())).await;
    let client = reqwest::Client::new();
    for header in [Some("cf-ipcountry"), None] {
        let store = RespStore::connect(&redis.url(), Duration::from_secs(2))
            .await
            .unwrap();
        let pipeline = Pipeline::new(
            NativeStore::Resp(store),
            floodgate_shared::time::SystemClock,
            PipelineConfig::default(),
        );
        let mut host = HostConfig::new(&upstream);
        host.country_header = header.map(str::to_string);
        let (url, _edge) = floodgate_tests::serve_native(pipeline, host).await;
        for (country, denied) in [("KP", true), ("kp", true), ("T1", true), ("DE", false)] {
            let r = client
                .get(format!("{url}/v1/items"))
                .bearer_auth(&key.secret)
                .header("CF-IPCountry", country)
                .send()
                .await
                .unwrap();
            let want = if denied && header.is_some() {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::OK
            };
            assert_eq!(r.status(), want, "{country} with {header:?}");
        }
    }
    // DE with the header, and all four without it
    assert_eq!(seen.total(), 5);
}
