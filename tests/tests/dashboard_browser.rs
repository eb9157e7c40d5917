//! The dashboard in real headless Chromium (Debian's chromium + chromedriver), over
//! a real Redis, with the edge enforcing what the dashboard writes: sign in, create
//! a key, lower /v1/search's limit, drive traffic through the edge, see the 429s
//! appear in the chart on their own, revoke the key and see 401s. Screenshots are
//! saved under target/test-artifacts/dashboard/.

use std::time::Duration;

use floodgate_edge::demo_upstream::{self, Seen};
use floodgate_tests::dash::{ADMIN, ADMIN_PASSWORD, site_root, start_dashboard};
use floodgate_tests::webdriver::Browser;
use floodgate_tests::{EdgeKind, RedisServer, serve, start_edge};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

async fn statuses(edge: &str, secret: &str, n: usize) -> Vec<u16> {
    let http = reqwest::Client::new();
    let mut out = vec![];
    for _ in 0..n {
        let res = http
            .get(format!("{edge}/v1/search?q=x"))
            .bearer_auth(secret)
            .send()
            .await
            .expect("the edge answers");
        out.push(res.status().as_u16());
    }
    out
}

/// Waits for the page's hydration, so forms submit through the server-function
/// client (the app marks `<body data-hydrated="1">`).
async fn hydrated(b: &Browser) {
    b.wait_until(
        "hydrated",
        "return document.body.dataset.hydrated === '1';",
        WAIT,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lowers_a_limit_and_watches_the_edge_enforce_it() {
    assert!(
        site_root().join("pkg/floodgate_dashboard_bg.wasm").exists(),
        "the dashboard's browser bundle is not built: run scripts/dashboard build (scripts/test does)"
    );
    let redis = RedisServer::start();
    let dash = start_dashboard(&redis).await;
    let seen = Seen::default();
    let (upstream, _stop_upstream) = serve(demo_upstream::router(seen.clone())).await;
    let edge = start_edge(EdgeKind::Native, &redis, &upstream, 200).await;
    let b = Browser::start("dashboard").await;

    // pages need a session: the browser lands on the sign-in page
    b.goto(&format!("{}/keys", dash.url)).await;
    assert!(b.url().await.ends_with("/login"), "{}", b.url().await);
    // wait for hydration, so the form submits through the server function client
    hydrated(&b).await;
    let user = b.wait_for("#login input[name=username]", WAIT).await;
    b.fill(&user, ADMIN).await;
    let pass = b.find("#login input[name=password]").await.unwrap();
    b.fill(&pass, "not the password").await;
    b.click(&b.find("#login button[type=submit]").await.unwrap())
        .await;
    let err = b.wait_for("p.error", WAIT).await;
    assert!(b.text(&err).await.contains("Wrong user name or password"));
    b.fill(&pass, ADMIN_PASSWORD).await;
    b.click(&b.find("#login button[type=submit]").await.unwrap())
        .await;
    b.wait_for("#user", WAIT).await;
    b.screenshot("01-signed-in").await;

    // create a key: the secret is shown once
    b.goto(&format!("{}/keys", dash.url)).await;
    hydrated(&b).await;
    let label = b.wait_for("#create-key input[name=label]", WAIT).await;
    b.fill(&label, "<b>browser</b> test").await;
    b.click(&b.find("#create-key button[type=submit]").await.unwrap())
        .await;
    b.wait_for("#new-secret .secret", WAIT).await;
    let secret = b
        .exec(
            "return document.querySelector('#new-secret .secret').dataset.secret;",
            json!([]),
        )
        .await
        .as_str()
        .expect("the secret")
        .to_string();
    assert!(secret.starts_with("fg_"), "{secret}");
    let key_id = secret[3..13].to_string();
    b.wait_for(&format!("tr[data-key='{key_id}']"), WAIT).await;
    let source = b.source().await;
    assert!(
        source.contains("&lt;b&gt;browser&lt;/b&gt; test") || !source.contains("<b>browser</b>"),
        "labels are escaped"
    );
    b.screenshot("02-key-created").await;

    // the key works at the edge with the demo limit (100/min on /v1/search)
    assert_eq!(statuses(&edge.url, &secret, 12).await, [200; 12]);

    // lower /v1/search's limit to 5 per hour
    b.goto(&format!("{}/policies", dash.url)).await;
    hydrated(&b).await;
    let edit = b
        .wait_for("tr[data-policy='search'] button[type=button]", WAIT)
        .await;
    b.click(&edit).await;
    b.wait_until(
        "the form shows the search policy",
        "return document.querySelector('#policy-form input[name=name]').value === 'search';",
        WAIT,
    )
    .await;
    // a bad number first: the message is next to the field, nothing is saved
    let cap = b.find("#policy-form input[name=capacity]").await.unwrap();
    b.fill(&cap, "five").await;
    b.click(&b.find("#policy-form button[type=submit]").await.unwrap())
        .await;
    b.wait_for(
        "#policy-form .field-error[data-field='quota.capacity']",
        WAIT,
    )
    .await;
    let msg = b
        .exec("return document.querySelector(\"#policy-form .field-error[data-field='quota.capacity']\").textContent;", json!([]))
        .await;
    assert!(
        msg.as_str().is_some_and(|m| m.contains("whole number")),
        "{msg}"
    );
    b.screenshot("03-invalid-capacity").await;
    let cap = b.find("#policy-form input[name=capacity]").await.unwrap();
    b.fill(&cap, "5").await;
    let period = b.find("#policy-form input[name=period]").await.unwrap();
    b.fill(&period, "1h").await;
    // backtest first: the edge's sample of the 12 searches replayed against 5/h
    // (the sample reaches Redis within the edge's 1 s flush)
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        b.click(&b.find("#backtest").await.unwrap()).await;
        b.wait_for("#backtest-result", WAIT).await;
        let sampled = b
            .exec(
                "return document.querySelector('#backtest-result').dataset.sampled;",
                json!([]),
            )
            .await;
        if sampled.as_str() == Some("12") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "sampled {sampled}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let would = b
        .exec(
            "return document.querySelector(\"#backtest-result tr[data-route='search'] td.would\").textContent;",
            json!([]),
        )
        .await;
    assert_eq!(
        would.as_str(),
        Some("would have returned 429 to 7 requests of 1 keys (of 1 seen)"),
        "{would}"
    );
    b.screenshot("04a-backtest").await;
    b.click(&b.find("#save-limit").await.unwrap()).await;
    b.wait_until(
        "the table shows the new limit",
        "const c = document.querySelector(\"tr[data-policy='search'] td.limit\"); return !!c && c.textContent === '5 / 1h';",
        WAIT,
    )
    .await;
    b.screenshot("04-limit-lowered").await;

    // the edge enforces it once its config cache (200 ms here) expires; the bucket
    // already holds the 12 earlier requests' debt at the old rate (7.2 s), so 4 fit
    tokio::time::sleep(Duration::from_millis(400)).await;
    let got = statuses(&edge.url, &secret, 10).await;
    let admitted = got.iter().filter(|s| **s == 200).count();
    let throttled = got.iter().filter(|s| **s == 429).count();
    assert_eq!(admitted + throttled, 10, "{got:?}");
    assert!(admitted <= 5, "the new limit (5) holds: {got:?}");
    assert!(throttled >= 5, "{got:?}");
    assert!(
        got.windows(2).all(|w| !(w[0] == 429 && w[1] == 200)),
        "no admit after a denial: {got:?}"
    );

    // the traffic page shows the 429s on its own (auto-refresh, no reload)
    b.goto(&format!("{}/", dash.url)).await;
    hydrated(&b).await;
    b.wait_until(
        "the search chart shows the 429s",
        &format!(
            "const s = document.querySelector(\"svg[data-route='search']\"); return !!s && Number(s.dataset.throttled) === {throttled};"
        ),
        WAIT,
    )
    .await;
    b.screenshot("05-traffic-429s").await;
    let more = statuses(&edge.url, &secret, 4).await;
    let more_throttled = more.iter().filter(|s| **s == 429).count();
    // the 12 requests made at the old rate (a token per 0.6 s) leave 7.2 s of debt
    // that repays one admission at most; the new rate adds none (a token per 12 min)
    let admitted_after = admitted + (4 - more_throttled);
    assert!(admitted_after <= 6, "{got:?} then {more:?}");
    assert!(more_throttled >= 3, "{more:?}");
    b.wait_until(
        "the chart refreshes by itself",
        &format!(
            "const s = document.querySelector(\"svg[data-route='search']\"); return !!s && Number(s.dataset.throttled) === {};",
            throttled + more_throttled
        ),
        WAIT,
    )
    .await;
    let top = b.wait_for("#top-throttled tbody tr", WAIT).await;
    assert!(b.text(&top).await.contains(&key_id));
    assert!(
        b.find("#latency line.budget").await.is_some(),
        "the 5 ms budget line"
    );
    b.screenshot("06-traffic-refreshed").await;
    // readable in dark mode too: the page follows prefers-color-scheme
    b.color_scheme(true).await;
    b.wait_until(
        "dark colors apply",
        "return getComputedStyle(document.body).backgroundColor === 'rgb(13, 17, 23)';",
        WAIT,
    )
    .await;
    b.screenshot("06-traffic-dark").await;
    b.color_scheme(false).await;

    // revoke the key: the edge answers 401 within its cache TTL
    b.goto(&format!("{}/keys", dash.url)).await;
    hydrated(&b).await;
    let revoke = b
        .wait_for(&format!("tr[data-key='{key_id}'] button.danger"), WAIT)
        .await;
    b.click(&revoke).await;
    b.wait_for(
        &format!("tr[data-key='{key_id}'][data-revoked='true']"),
        WAIT,
    )
    .await;
    b.screenshot("07-key-revoked").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(statuses(&edge.url, &secret, 2).await, [401, 401]);

    // the audit log names who did what
    b.goto(&format!("{}/audit", dash.url)).await;
    let audit = b.wait_for("#audit tbody", WAIT).await;
    let text = b.text(&audit).await;
    for action in ["revoke key", "edit policy", "create key"] {
        assert!(text.contains(action), "{action} in {text}");
    }
    b.screenshot("08-audit").await;

    // signing out ends the session: pages go back to the sign-in page
    b.goto(&format!("{}/keys", dash.url)).await;
    hydrated(&b).await;
    b.click(&b.wait_for("nav button[type=submit]", WAIT).await)
        .await;
    b.wait_until("signed out", "return location.pathname === '/login';", WAIT)
        .await;
    b.goto(&format!("{}/policies", dash.url)).await;
    assert!(b.url().await.ends_with("/login"));
    let _ = b.exec("return 1;", json!([])).await;
    b.quit().await;
}
