//! The dashboard in real headless Chromium (Debian's chromium + chromedriver), over
//! a real Redis, with the edge enforcing what the dashboard writes: sign in, create
//! a key and copy its secret, lower /v1/search's limit after a backtest, drive
//! traffic through the edge and read the charts (ranges, axes, hover values, the
//! numbers as text), watch usage update on its own, revoke after confirming, read
//! the audit log; the same pages without JavaScript; nobody else's guesses lock the
//! operator out; a session that ends and a store outage are told plainly. axe-core
//! checks every page in light and dark mode. Screenshots are saved under
//! target/test-artifacts/.

use std::net::IpAddr;
use std::time::Duration;

use floodgate_edge::demo_upstream::{self, Seen};
use floodgate_tests::dash::{
    ADMIN, ADMIN_PASSWORD, post_login_from, search_statuses, site_root, start_dashboard,
    start_empty_dashboard,
};
use floodgate_tests::webdriver::Browser;
use floodgate_tests::{EdgeKind, RedisServer, serve, start_edge};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// One browser at a time: three Chromiums on a 2-core machine make timings flaky.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bundle_is_built() {
    assert!(
        site_root().join("pkg/floodgate_dashboard_bg.wasm").exists(),
        "the dashboard's browser bundle is not built: run scripts/dashboard build (scripts/test does)"
    );
}

/// Waits for the page's hydration, so forms in islands submit through the
/// server-function client (the app marks `<body data-hydrated="1">` and counts
/// each hydrated island in `data-islands`).
async fn hydrated(b: &Browser) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let state = js(
            b,
            "return [document.body.dataset.hydrated || null, Number(document.body.dataset.islands || 0), document.querySelectorAll('leptos-island').length];",
        )
        .await;
        if state[0] == "1" && state[1].as_u64() >= state[2].as_u64() {
            return;
        }
        if std::time::Instant::now() > deadline {
            b.screenshot("timeout-hydrated").await;
            // e.g. "Could not find WASM function for the island ...": a bundle built
            // from other sources than the server (island names hash their source)
            let console = b.console().await;
            panic!(
                "not hydrated within {WAIT:?} on {}: [marker, islands hydrated, islands] = {state}; \
                 the browser's console: {console:#?}",
                b.url().await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn js(b: &Browser, script: &str) -> Value {
    b.exec(script, json!([])).await
}

async fn text_of(b: &Browser, css: &str) -> String {
    let e = b.wait_for(css, WAIT).await;
    b.text(&e).await
}

/// Signs in through the page's form.
async fn sign_in(b: &Browser, url: &str, password: &str) {
    b.goto(&format!("{url}/login")).await;
    hydrated(b).await;
    let user = b.wait_for("#login input[name=username]", WAIT).await;
    b.fill(&user, ADMIN).await;
    let pass = b.find("#login input[name=password]").await.unwrap();
    b.fill(&pass, password).await;
    b.click(&b.find("#login button[type=submit]").await.unwrap())
        .await;
}

/// axe-core finds no serious or critical violation on the current page, in light
/// and in dark mode.
async fn accessible(b: &Browser, page: &str) {
    for dark in [false, true] {
        b.color_scheme(dark).await;
        let violations = b.axe().await;
        assert!(
            violations.is_empty(),
            "{page} ({}): {violations:#?}",
            if dark { "dark" } else { "light" }
        );
    }
    b.color_scheme(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lowers_a_limit_and_watches_the_edge_enforce_it() {
    bundle_is_built();
    let _one = ONE_BROWSER.lock().await;
    let redis = RedisServer::start();
    let dash = start_dashboard(&redis).await;
    let seen = Seen::default();
    let (upstream, _stop_upstream) = serve(demo_upstream::router(seen.clone())).await;
    let edge = start_edge(EdgeKind::Native, &redis, &upstream, 200).await;
    let b = Browser::start("dashboard").await;

    // pages need a session: the browser lands on the sign-in page
    b.goto(&format!("{}/keys", dash.url)).await;
    assert!(b.url().await.ends_with("/login"), "{}", b.url().await);
    accessible(&b, "/login").await;
    sign_in(&b, &dash.url, "not the password").await;
    let err = b.wait_for("p.error", WAIT).await;
    assert!(b.text(&err).await.contains("Wrong user name or password"));
    sign_in(&b, &dash.url, ADMIN_PASSWORD).await;
    b.wait_for("#user", WAIT).await;
    b.screenshot("01-signed-in").await;

    // create a key: the secret is shown once, and copied with one click
    b.goto(&format!("{}/keys", dash.url)).await;
    hydrated(&b).await;
    b.grant_clipboard(&dash.url).await;
    let label = b.wait_for("#create-key input[name=label]", WAIT).await;
    b.fill(&label, "<b>browser</b> test").await;
    b.click(&b.find("#create-key button[type=submit]").await.unwrap())
        .await;
    b.wait_for("#new-secret .secret", WAIT).await;
    let secret = js(
        &b,
        "return document.querySelector('#new-secret .secret').dataset.secret;",
    )
    .await
    .as_str()
    .expect("the secret")
    .to_string();
    assert!(secret.starts_with("fg_"), "{secret}");
    b.click(&b.find("#copy-secret").await.unwrap()).await;
    b.wait_until(
        "the copy is confirmed",
        "return document.querySelector('#copy-status').textContent.includes('Copied');",
        WAIT,
    )
    .await;
    let clipboard = b
        .exec_async(
            "const done = arguments[arguments.length - 1]; navigator.clipboard.readText().then(done, e => done('error: ' + e));",
            json!([]),
        )
        .await;
    assert_eq!(clipboard.as_str(), Some(secret.as_str()), "the clipboard");
    let key_id = secret[3..13].to_string();
    let row = format!("tr[data-key='{key_id}']");
    b.wait_for(&row, WAIT).await;
    let source = b.source().await;
    assert!(
        source.contains("&lt;b&gt;browser&lt;/b&gt; test") || !source.contains("<b>browser</b>"),
        "labels are escaped"
    );
    // the label in its own column, the creation time, never used yet
    assert_eq!(
        text_of(&b, &format!("{row} td.label")).await,
        "<b>browser</b> test"
    );
    assert!(
        text_of(&b, &format!("{row} td.created"))
            .await
            .contains("UTC")
    );
    assert_eq!(text_of(&b, &format!("{row} td.last-used")).await, "never");
    b.screenshot("02-key-created").await;

    // the key works at the edge with the demo limit (100/min on /v1/search), and
    // the open page shows its usage on its own (no reload: the marker survives)
    js(&b, "window.__still_here = 1; return 1;").await;
    assert_eq!(search_statuses(&edge.url, &secret, 12).await, [200; 12]);
    b.wait_until(
        "usage updates live",
        &format!(
            "const u = document.querySelector(\"{row} td.usage\"); return window.__still_here === 1 && !!u && u.textContent.startsWith('12 allowed');"
        ),
        WAIT,
    )
    .await;
    let last = text_of(&b, &format!("{row} td.last-used")).await;
    assert!(
        (last.contains("ago") || last.starts_with("just now")) && last.ends_with("UTC)"),
        "last used, live: {last}"
    );
    accessible(&b, "/keys").await;

    // lower /v1/search's limit to 5 per hour
    b.goto(&format!("{}/policies", dash.url)).await;
    hydrated(&b).await;
    accessible(&b, "/policies").await;
    let edit = b.wait_for("tr[data-policy='search'] a.edit", WAIT).await;
    b.click(&edit).await;
    hydrated(&b).await;
    b.wait_until(
        "the form shows the search policy",
        "return document.querySelector('#policy-form input[name=name]').value === 'search';",
        WAIT,
    )
    .await;
    // a bad number first: the message is next to the field, nothing is saved
    let cap = b.find("#policy-form input[name=capacity]").await.unwrap();
    b.fill(&cap, "five").await;
    b.click(&b.find("#save-limit").await.unwrap()).await;
    b.wait_for(
        "#policy-form .field-error[data-field='quota.capacity']",
        WAIT,
    )
    .await;
    let msg = js(&b, "return document.querySelector(\"#policy-form .field-error[data-field='quota.capacity']\").textContent;").await;
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
        let sampled = js(
            &b,
            "return document.querySelector('#backtest-result').dataset.sampled;",
        )
        .await;
        if sampled.as_str() == Some("12") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "sampled {sampled}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let cells = js(
        &b,
        "const r = document.querySelector(\"#backtest-result tr[data-route='search']\"); return [r.querySelector('th').textContent, r.querySelector('.observed').textContent, r.querySelector('.now').textContent, r.querySelector('.would').textContent];",
    )
    .await;
    assert_eq!(
        cells,
        json!([
            "/v1/search (route search)",
            "0",
            "0",
            "would have returned 429 to 7 requests of 1 keys (of 1 seen)"
        ])
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
    let got = search_statuses(&edge.url, &secret, 10).await;
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
    let chart = "svg[data-route='search']";
    b.wait_until(
        "the search chart shows the 429s",
        &format!(
            "const s = document.querySelector(\"{chart}\"); return !!s && Number(s.dataset.throttled) === {throttled};"
        ),
        WAIT,
    )
    .await;
    b.screenshot("05-traffic-429s").await;
    // an operator can read it: the endpoint by pattern and route, a y axis with
    // its unit and gridlines, a time axis in UTC, stacked patterned bars, a value
    // on hover for each bar and the numbers as a table; full width
    let read = js(
        &b,
        &format!(
            "const s = document.querySelector(\"{chart}\"); const sec = s.closest('section');\
             const texts = [...s.querySelectorAll('text')].map(t => t.textContent);\
             const bars = [...s.querySelectorAll('g.bar')];\
             const hatched = s.querySelector('rect.throttled');\
             return {{ heading: sec.querySelector('h2').textContent, texts, grid: s.querySelectorAll('line.grid').length,\
               titles: bars.map(g => g.querySelector('title').textContent),\
               fill: hatched && getComputedStyle(hatched).fill,\
               rows: sec.querySelectorAll('details table tbody tr').length,\
               width: s.getBoundingClientRect().width, main: document.querySelector('main').clientWidth }};"
        ),
    )
    .await;
    assert_eq!(read["heading"], "/v1/search (route search)", "{read}");
    let texts: Vec<&str> = read["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(texts.contains(&"requests per 10 s"), "{texts:?}");
    assert!(texts.contains(&"time (UTC)"), "{texts:?}");
    assert!(texts.contains(&"0"), "{texts:?}");
    assert!(
        texts
            .iter()
            .filter(|t| t.len() == 5 && t.as_bytes()[2] == b':')
            .count()
            >= 4,
        "time labels: {texts:?}"
    );
    assert!(read["grid"].as_u64().unwrap() >= 3, "{read}");
    assert!(
        read["fill"]
            .as_str()
            .is_some_and(|f| f.contains("pat-throttled")),
        "throttled bars are hatched: {read}"
    );
    let titles: Vec<&str> = read["titles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let shown: u64 = titles
        .iter()
        .map(|t| {
            let n = t.split(" throttled (429)").next().unwrap();
            n.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(shown, throttled as u64, "hover values: {titles:?}");
    assert!(
        titles[0].contains("UTC:") && titles[0].contains("allowed"),
        "{titles:?}"
    );
    assert_eq!(read["rows"].as_u64(), Some(titles.len() as u64));
    let (width, main) = (
        read["width"].as_f64().unwrap(),
        read["main"].as_f64().unwrap(),
    );
    assert!(width >= main * 0.9, "full width: {width} of {main}");
    let more = search_statuses(&edge.url, &secret, 4).await;
    let more_throttled = more.iter().filter(|s| **s == 429).count();
    // the 12 requests made at the old rate (a token per 0.6 s) leave 7.2 s of debt
    // that repays one admission at most; the new rate adds none (a token per 12 min)
    let admitted_after = admitted + (4 - more_throttled);
    assert!(admitted_after <= 6, "{got:?} then {more:?}");
    assert!(more_throttled >= 3, "{more:?}");
    b.wait_until(
        "the chart refreshes by itself",
        &format!(
            "const s = document.querySelector(\"{chart}\"); return !!s && Number(s.dataset.throttled) === {};",
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
    accessible(&b, "/").await;
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
    // another range and resolution, by their links
    b.click(&b.find("nav.ranges a[href='/?range=1h']").await.unwrap())
        .await;
    b.wait_until(
        "1 hour per minute",
        &format!(
            "const s = document.querySelector(\"{chart}\"); return location.search === '?range=1h' && !!s && [...s.querySelectorAll('text')].some(t => t.textContent === 'requests per 1 min');"
        ),
        WAIT,
    )
    .await;
    b.click(
        &b.find("nav.ranges a[href='/?range=1h&res=10s']")
            .await
            .unwrap(),
    )
    .await;
    b.wait_until(
        "1 hour per 10 s",
        &format!(
            "const s = document.querySelector(\"{chart}\"); return !!s && [...s.querySelectorAll('text')].some(t => t.textContent === 'requests per 10 s') && Number(s.dataset.throttled) === {};",
            throttled + more_throttled
        ),
        WAIT,
    )
    .await;
    let current = js(
        &b,
        "return [...document.querySelectorAll('nav.ranges a[aria-current]')].map(a => a.textContent);",
    )
    .await;
    assert_eq!(current, json!(["1 hour", "10 s"]));
    b.screenshot("06b-traffic-1h-10s").await;

    // revoke the key, after confirming; it is read-only afterwards, and the edge
    // answers 401 within two cache TTLs
    b.goto(&format!("{}/keys", dash.url)).await;
    hydrated(&b).await;
    let revoke = b
        .wait_for(&format!("{row} details.revoke-key button.danger"), WAIT)
        .await;
    assert!(
        js(
            &b,
            &format!("return !document.querySelector(\"{row} details.revoke-key\").open;")
        )
        .await
            == json!(true),
        "the confirmation is folded away"
    );
    b.click(
        &b.find(&format!("{row} details.revoke-key summary"))
            .await
            .unwrap(),
    )
    .await;
    b.screenshot("07a-confirm-revoke").await;
    assert!(
        text_of(&b, &format!("{row} details.revoke-key p"))
            .await
            .contains("permanent")
    );
    b.click(&revoke).await;
    b.wait_for(&format!("{row}[data-revoked='true']"), WAIT)
        .await;
    assert!(
        b.find(&format!("{row} details.edit-key")).await.is_none(),
        "a revoked key cannot be edited"
    );
    assert_eq!(text_of(&b, &format!("{row} td.status")).await, "revoked");
    b.screenshot("07-key-revoked").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(search_statuses(&edge.url, &secret, 2).await, [401, 401]);

    // the audit log: who, what, when (UTC and local), and the fields changed; the
    // reader is in India (UTC+05:30)
    let tz = b
        .cdp(
            "Emulation.setTimezoneOverride",
            json!({"timezoneId": "Asia/Kolkata"}),
        )
        .await;
    assert!(tz.is_object() || tz.is_null(), "{tz}");
    b.goto(&format!("{}/audit", dash.url)).await;
    hydrated(&b).await;
    let audit = b.wait_for("#audit tbody", WAIT).await;
    let text = b.text(&audit).await;
    for action in ["revoke key", "edit policy", "create key", ADMIN] {
        assert!(text.contains(action), "{action} in {text}");
    }
    assert!(text.contains("quota.capacity: 100 → 5"), "{text}");
    assert!(text.contains("quota.period: 1m → 1h"), "{text}");
    assert!(text.contains("status: active → revoked"), "{text}");
    assert!(text.contains(" UTC"), "{text}");
    b.wait_until(
        "local times after hydration",
        "const l = document.querySelectorAll('#audit .local'); return l.length > 0 && [...l].every(e => e.textContent.endsWith('(UTC+05:30)'));",
        WAIT,
    )
    .await;
    assert!(!text.contains("{\""), "no raw JSON: {text}");
    b.screenshot("08-audit").await;
    accessible(&b, "/audit").await;

    // an error names the field as the page does
    b.goto(&format!("{}/policies", dash.url)).await;
    hydrated(&b).await;
    b.click(
        &b.wait_for("tr[data-policy='search'] button.danger", WAIT)
            .await,
    )
    .await;
    let err = text_of(&b, "#policies ~ p.error").await;
    assert_eq!(
        err, "Route \"search\", limits: still uses the limit \"search\": take it out there first",
        "the operator's words"
    );
    b.screenshot("09-error-in-words").await;

    // signing out ends the session: pages go back to the sign-in page
    b.click(&b.wait_for("nav button[type=submit]", WAIT).await)
        .await;
    b.wait_until("signed out", "return location.pathname === '/login';", WAIT)
        .await;
    b.goto(&format!("{}/policies", dash.url)).await;
    assert!(b.url().await.ends_with("/login"));
    b.quit().await;
}

/// Issue 16, item 3: with JavaScript off, every page reads and forms post.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_javascript_every_page_reads_and_forms_still_post() {
    let _one = ONE_BROWSER.lock().await;
    let redis = RedisServer::start();
    let dash = start_dashboard(&redis).await;
    let (upstream, _stop_upstream) = serve(demo_upstream::router(Seen::default())).await;
    let edge = start_edge(EdgeKind::Native, &redis, &upstream, 200).await;
    // a key (made over HTTP) and some traffic for the pages to show
    let op = floodgate_tests::dash::Operator::sign_in(&dash.url).await;
    let key = op
        .json("create_key", &[("label", "no script"), ("plan", "free")])
        .await;
    let secret = key["secret"].as_str().unwrap();
    let key_id = key["id"].as_str().unwrap().to_string();
    search_statuses(&edge.url, secret, 3).await;
    let b = Browser::start_with("dashboard-nojs", false).await;
    // sign-in is a plain form post; a wrong password comes back on the page
    b.goto(&format!("{}/login", dash.url)).await;
    let user = b.wait_for("#login input[name=username]", WAIT).await;
    b.fill(&user, ADMIN).await;
    let pass = b.find("#login input[name=password]").await.unwrap();
    b.fill(&pass, "not the password").await;
    b.click(&b.find("#login button[type=submit]").await.unwrap())
        .await;
    let err = text_of(&b, "p.error").await;
    assert!(err.contains("Wrong user name or password"), "{err}");
    let user = b.wait_for("#login input[name=username]", WAIT).await;
    b.fill(&user, ADMIN).await;
    let pass = b.find("#login input[name=password]").await.unwrap();
    b.fill(&pass, ADMIN_PASSWORD).await;
    b.click(&b.find("#login button[type=submit]").await.unwrap())
        .await;
    b.wait_for("#user", WAIT).await;
    assert!(
        b.find("body[data-hydrated]").await.is_none(),
        "no script ran"
    );
    // the traffic page: totals, charts, the numbers
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        b.goto(&format!("{}/", dash.url)).await;
        if b.find("svg[data-route='search']").await.is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no chart");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let totals = text_of(&b, "#totals").await;
    assert!(totals.contains("/v1/search (route search)"), "{totals}");
    assert!(
        b.find("svg[data-route='search'] g.bar title")
            .await
            .is_some()
    );
    // a range link is a plain link
    b.click(&b.find("nav.ranges a[href='/?range=24h']").await.unwrap())
        .await;
    b.wait_for("svg[data-route='search']", WAIT).await;
    assert!(b.url().await.ends_with("/?range=24h"));
    assert!(
        b.source().await.contains("requests per 10 min"),
        "24 hours per 10 minutes"
    );
    b.screenshot("01-traffic").await;
    // policies: the tables, and a form that posts and shows its error in place
    b.goto(&format!("{}/policies", dash.url)).await;
    b.wait_for("tr[data-policy='search']", WAIT).await;
    let name = b.find("#plan-form input[name=name]").await.unwrap();
    b.fill(&name, "Not A Name").await;
    let list = b.find("#plan-form input[name=policies]").await.unwrap();
    b.fill(&list, "default").await;
    b.click(&b.find("#plan-form button[type=submit]").await.unwrap())
        .await;
    let msg = text_of(&b, "#plan-form .field-error[data-field='name']").await;
    assert!(msg.contains("a-z"), "{msg}");
    b.screenshot("02-policies-error").await;
    let name = b.find("#plan-form input[name=name]").await.unwrap();
    b.fill(&name, "gold").await;
    let list = b.find("#plan-form input[name=policies]").await.unwrap();
    b.fill(&list, "default").await;
    b.click(&b.find("#plan-form button[type=submit]").await.unwrap())
        .await;
    b.wait_for("tr[data-plan='gold']", WAIT).await;
    // a limit made bounded: the style sheet shows the bound only once bounded is
    // chosen (WebDriver's text is empty for what is not displayed)
    b.goto(&format!("{}/policies?edit=search", dash.url)).await;
    let bound_label = b.wait_for("#policy-form label.bound", WAIT).await;
    assert_eq!(b.text(&bound_label).await, "", "hidden while exact");
    b.click(&b.find("#policy-form option[value=bounded]").await.unwrap())
        .await;
    assert!(
        b.text(&bound_label).await.contains("Overshoot bound"),
        "shown with bounded"
    );
    let bound = b
        .find("#policy-form input[name=max_overshoot]")
        .await
        .unwrap();
    b.fill(&bound, "20").await;
    b.click(&b.find("#save-limit").await.unwrap()).await;
    let deadline = std::time::Instant::now() + WAIT;
    while text_of(&b, "tr[data-policy='search'] td.consistency").await != "bounded, at most 20 over"
    {
        assert!(std::time::Instant::now() < deadline, "not saved");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    b.screenshot("02b-policies-bounded").await;
    // keys: the table reads; creating a key needs the page's script to show its
    // secret once, so without it the form says so and creates nothing
    b.goto(&format!("{}/keys", dash.url)).await;
    let row = text_of(&b, &format!("tr[data-key='{key_id}']")).await;
    assert!(row.contains("no script") && row.contains("UTC"), "{row}");
    let label = b.find("#create-key input[name=label]").await.unwrap();
    b.fill(&label, "lost secret").await;
    b.click(&b.find("#create-key button[type=submit]").await.unwrap())
        .await;
    let err = text_of(&b, "#create-key ~ p.error, #create-key p.error").await;
    assert!(err.contains("needs JavaScript"), "{err}");
    assert_eq!(
        op.json("keys", &[]).await.as_array().unwrap().len(),
        1,
        "no key whose secret nobody saw"
    );
    // revoking works as a plain post, after opening the confirmation
    b.click(
        &b.find(&format!(
            "tr[data-key='{key_id}'] details.revoke-key summary"
        ))
        .await
        .unwrap(),
    )
    .await;
    b.click(
        &b.find(&format!(
            "tr[data-key='{key_id}'] details.revoke-key button"
        ))
        .await
        .unwrap(),
    )
    .await;
    b.wait_for(
        &format!("tr[data-key='{key_id}'][data-revoked='true']"),
        WAIT,
    )
    .await;
    b.screenshot("03-keys").await;
    // the audit log
    b.goto(&format!("{}/audit", dash.url)).await;
    let audit = text_of(&b, "#audit tbody").await;
    assert!(
        audit.contains("create plan") && audit.contains("revoke key"),
        "{audit}"
    );
    b.screenshot("04-audit").await;
    b.quit().await;
}

/// Issue 16, items 1 and 4: an attacker elsewhere cannot lock the operator out;
/// a session that ends goes to sign-in with a message; an outage is a banner,
/// never raw JSON or deserializer text; the favicon is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_elses_guesses_lock_the_operator_out_and_endings_and_outages_are_told_plainly() {
    bundle_is_built();
    let _one = ONE_BROWSER.lock().await;
    let mut redis = RedisServer::start();
    let dash = start_dashboard(&redis).await;
    let b = Browser::start("dashboard-sessions").await;
    // the operator signed in before from this browser (at 127.0.0.1)
    sign_in(&b, &dash.url, ADMIN_PASSWORD).await;
    b.wait_for("#user", WAIT).await;
    let icon = b
        .exec_async(
            "const done = arguments[arguments.length - 1]; fetch('/favicon.ico').then(r => done([r.status, r.headers.get('content-type')]));",
            json!([]),
        )
        .await;
    assert_eq!(icon, json!([200, "image/x-icon"]));
    b.click(&b.wait_for("nav button[type=submit]", WAIT).await)
        .await;
    b.wait_until("signed out", "return location.pathname === '/login';", WAIT)
        .await;
    // attackers at 30 other addresses guess "admin"'s password
    let mut refused = 0;
    for n in 2..32u8 {
        for _ in 0..2 {
            let res = post_login_from(
                &dash.url,
                Some(IpAddr::from([127, 0, 0, n])),
                ADMIN,
                "guess-guess-guess",
                None,
            )
            .await;
            refused += usize::from(res.status() == 429);
        }
    }
    assert!(refused >= 40, "the guessing is throttled: {refused} of 60");
    // the operator signs in all the same
    sign_in(&b, &dash.url, ADMIN_PASSWORD).await;
    b.wait_for("#user", WAIT).await;
    b.screenshot("01-signed-in-under-attack").await;

    // the session ends while a page is open: the page goes to sign-in and says so
    b.goto(&format!("{}/", dash.url)).await;
    hydrated(&b).await;
    let mut conn = redis.connection();
    let sessions: Vec<String> = redis::cmd("KEYS")
        .arg("fg:dash:session:*")
        .query(&mut conn)
        .unwrap();
    assert_eq!(sessions.len(), 1);
    let _: () = redis::cmd("DEL").arg(&sessions).query(&mut conn).unwrap();
    b.wait_until(
        "the page went to sign-in",
        "return location.pathname === '/login' && location.search === '?session=ended';",
        WAIT,
    )
    .await;
    let said = text_of(&b, "#session-ended").await;
    assert_eq!(said, "Your session has ended; sign in again.");
    assert!(!b.source().await.contains("deserializ"));
    b.screenshot("02-session-ended").await;
    accessible(&b, "/login?session=ended").await;

    // the store goes away while a page is open: a banner, not garbage
    sign_in(&b, &dash.url, ADMIN_PASSWORD).await;
    b.wait_for("#user", WAIT).await;
    b.goto(&format!("{}/", dash.url)).await;
    hydrated(&b).await;
    redis.signal("KILL");
    assert!(redis.wait_exit(Duration::from_secs(10)));
    let banner = text_of(&b, "#outage").await;
    assert!(
        banner.contains("cannot reach its store (Redis)"),
        "{banner}"
    );
    let body = text_of(&b, "body").await;
    assert!(
        !body.contains("deserializ") && !body.contains("{\""),
        "{body}"
    );
    b.screenshot("03-outage-banner").await;
    // and a reload shows the outage page, not JSON
    b.goto(&format!("{}/keys", dash.url)).await;
    let banner = text_of(&b, "#outage").await;
    assert!(banner.contains("Store unavailable"), "{banner}");
    assert!(!text_of(&b, "body").await.contains("{\""));
    b.screenshot("04-outage-page").await;
    accessible(&b, "the outage page").await;
    redis.restart();
    b.quit().await;
}

/// Issue 12, item 6: the operator switches /v1/search's limit to bounded with a
/// bound (the bound's field appears only then), saves, sees it in the list, and
/// reads the limit's figures on the traffic page (the edges' counters seeded as
/// the edge writes them), as text; axe stays clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_makes_a_limit_bounded_and_reads_its_figures() {
    use floodgate_shared::stats::{Leasing, StatsField, minute_key};
    bundle_is_built();
    let _one = ONE_BROWSER.lock().await;
    let redis = RedisServer::start();
    let dash = start_dashboard(&redis).await;
    let b = Browser::start("dashboard-bounded").await;
    sign_in(&b, &dash.url, ADMIN_PASSWORD).await;
    b.wait_for("#user", WAIT).await;
    b.goto(&format!("{}/", dash.url)).await;
    hydrated(&b).await;
    assert!(
        text_of(&b, "#no-bounded")
            .await
            .starts_with("No bounded policies")
    );

    b.goto(&format!("{}/policies?edit=search#policy-form", dash.url))
        .await;
    hydrated(&b).await;
    // the style sheet hides the bound while exact is chosen
    let bound_hidden = "return getComputedStyle(document.querySelector('#policy-form input[name=max_overshoot]').closest('label')).display === 'none';";
    b.wait_until("exact hides the bound", bound_hidden, WAIT)
        .await;
    js(
        &b,
        "const s = document.querySelector('#policy-form select[name=consistency]'); s.value = 'bounded'; s.dispatchEvent(new Event('change', {bubbles: true})); return 1;",
    )
    .await;
    b.wait_until(
        "bounded shows the bound",
        &format!("return !(function() {{ {bound_hidden} }})();"),
        WAIT,
    )
    .await;
    let help = text_of(&b, "#consistency-help").await;
    assert!(
        help.contains("never over the limit") && help.contains("at most N tokens above"),
        "{help}"
    );
    let bound = b
        .find("#policy-form input[name=max_overshoot]")
        .await
        .unwrap();
    // above the capacity first: the edge's rule, next to the field
    b.fill(&bound, "101").await;
    b.click(&b.find("#save-limit").await.unwrap()).await;
    let msg = text_of(&b, "#policy-form .field-error[data-field='max_overshoot']").await;
    assert!(msg.contains("got 101"), "{msg}");
    b.fill(&bound, "20").await;
    accessible(&b, "/policies, bounded").await;
    b.screenshot("01-bounded-form").await;
    b.click(&b.find("#save-limit").await.unwrap()).await;
    b.wait_until(
        "the list shows the bound",
        "const c = document.querySelector(\"tr[data-policy='search'] td.consistency\"); return !!c && c.textContent === 'bounded, at most 20 over';",
        WAIT,
    )
    .await;
    b.screenshot("02-bounded-saved").await;

    // the edges' counters of this minute: 45 local, 5 exact, 3 refills holding 30
    let minute = floodgate_dashboard::time::now_secs().div_euclid(60);
    let mut conn = redis.connection();
    for (what, n) in Leasing::ALL.into_iter().zip([45u64, 5, 3, 30]) {
        let _: () = redis::cmd("HINCRBY")
            .arg(minute_key(minute))
            .arg(StatsField::Leasing("search".into(), what).to_string())
            .arg(n)
            .query(&mut conn)
            .unwrap();
    }
    b.goto(&format!("{}/", dash.url)).await;
    hydrated(&b).await;
    let row = "#consistency tr[data-policy='search']";
    b.wait_for(row, WAIT).await;
    let cells = js(
        &b,
        &format!(
            "const r = document.querySelector(\"{row}\"); return ['th', 'td.local', 'td.saved', 'td.budget'].map(c => r.querySelector(c).textContent);"
        ),
    )
    .await;
    assert_eq!(
        cells,
        json!([
            "search",
            "90.0 % (45 of 50 decisions)",
            "42 (45 local decisions, less 3 refills)",
            "10.0 of 20 tokens (50 %), the mean outstanding at 3 refills"
        ])
    );
    assert!(b.find("#no-bounded").await.is_none());
    b.screenshot("03-bounded-figures").await;
    accessible(&b, "/, bounded figures").await;

    // back to exact in one save: the bound is hidden and no longer sent
    b.goto(&format!("{}/policies?edit=search#policy-form", dash.url))
        .await;
    hydrated(&b).await;
    js(
        &b,
        "const s = document.querySelector('#policy-form select[name=consistency]'); s.value = 'exact'; s.dispatchEvent(new Event('change', {bubbles: true})); return 1;",
    )
    .await;
    b.wait_until("exact hides the bound again", bound_hidden, WAIT)
        .await;
    b.click(&b.find("#save-limit").await.unwrap()).await;
    b.wait_until(
        "the list shows exact",
        "const c = document.querySelector(\"tr[data-policy='search'] td.consistency\"); return !!c && c.textContent === 'exact';",
        WAIT,
    )
    .await;
    b.quit().await;
}

/// Issue 24, item 5: the first run in a browser: with nothing stored, the pages
/// say what to do next (axe-clean, light and dark); the first-run form stores a
/// configuration; the key just created comes with a request to paste, naming the
/// edge (`--edge-url`) and the key's secret, that the edge answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_run_is_told_what_to_do_next_page_by_page() {
    bundle_is_built();
    let _one = ONE_BROWSER.lock().await;
    let redis = RedisServer::start();
    let seen = Seen::default();
    let (upstream, _stop_upstream) = serve(demo_upstream::router(seen.clone())).await;
    let edge = start_edge(EdgeKind::Native, &redis, &upstream, 200).await;
    let dash = start_empty_dashboard(&redis, &edge.url).await;
    let b = Browser::start("dashboard-first-run").await;
    sign_in(&b, &dash.url, ADMIN_PASSWORD).await;
    b.wait_for("#user", WAIT).await;
    hydrated(&b).await;
    let empty = text_of(&b, "#no-traffic").await;
    assert!(
        empty.contains(&format!("Authorization: Bearer KEY\" {}/", edge.url))
            && empty.contains("429"),
        "{empty}"
    );
    accessible(&b, "/ (no traffic)").await;
    b.goto(&format!("{}/keys", dash.url)).await;
    hydrated(&b).await;
    b.wait_for("#no-plans", WAIT).await;
    accessible(&b, "/keys (no plan)").await;
    b.goto(&format!("{}/policies", dash.url)).await;
    hydrated(&b).await;
    assert!(
        text_of(&b, "#no-config")
            .await
            .contains("floodgate-cli config set")
    );
    accessible(&b, "/policies (no configuration)").await;
    b.click(&b.find("#start-form button[type=submit]").await.unwrap())
        .await;
    b.wait_for("tr[data-policy='default']", WAIT).await;
    b.screenshot("first-run-configured").await;
    b.goto(&format!("{}/keys", dash.url)).await;
    hydrated(&b).await;
    b.wait_for("#no-keys", WAIT).await;
    accessible(&b, "/keys (no key)").await;
    let label = b.wait_for("#create-key input[name=label]", WAIT).await;
    b.fill(&label, "first").await;
    b.click(&b.find("#create-key button[type=submit]").await.unwrap())
        .await;
    let line = text_of(&b, "#try-key").await;
    let secret = js(
        &b,
        "return document.querySelector('#new-secret .secret').dataset.secret;",
    )
    .await
    .as_str()
    .expect("the secret")
    .to_string();
    assert_eq!(
        line,
        format!(
            "curl -i -H \"Authorization: Bearer {secret}\" {}/",
            edge.url
        )
    );
    b.wait_until(
        "the key's row replaces the first-run note",
        "return !document.querySelector('#no-keys');",
        WAIT,
    )
    .await;
    accessible(&b, "/keys (a key just created)").await;
    b.screenshot("first-run-key").await;
    // what the line sends, the edge answers (the starter limit: 100 per minute),
    // once it has read the new configuration
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let answered = reqwest::Client::new()
            .get(format!("{}/", edge.url))
            .bearer_auth(&secret)
            .send()
            .await
            .expect("the edge answers");
        if answered.status() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the edge answers {}",
            answered.status()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    b.quit().await;
}

/// A key is rotated on its page: the overlap confirmed in the form, the new
/// secret shown once (the same key id), and at the edge both the new and the
/// replaced secret work through the overlap; the page passes axe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_rotates_a_key_on_its_page() {
    bundle_is_built();
    let _one = ONE_BROWSER.lock().await;
    let redis = RedisServer::start();
    let dash = start_dashboard(&redis).await;
    let (upstream, _stop_upstream) = serve(demo_upstream::router(Seen::default())).await;
    let edge = start_edge(EdgeKind::Native, &redis, &upstream, 200).await;
    let b = Browser::start("dashboard-rotate").await;
    sign_in(&b, &dash.url, ADMIN_PASSWORD).await;
    b.wait_for("#user", WAIT).await;
    let store = floodgate_edge::store::resp::RespStore::connect(&redis.url(), WAIT)
        .await
        .unwrap();
    let (key, old) = floodgate_edge::admin::create_key(&store, "rotated", "free", 1_764_000_000)
        .await
        .unwrap();
    assert_eq!(search_statuses(&edge.url, &old, 1).await, [200]);
    b.goto(&format!("{}/keys/{}", dash.url, key.id)).await;
    hydrated(&b).await;
    accessible(&b, "/keys/<id>").await;
    // submitted without the confirmation: refused next to it, nothing rotated
    b.click(&b.find("#rotate-key button[type=submit]").await.unwrap())
        .await;
    b.wait_for(
        "#rotate-key .field-error[data-field='confirm_rotate']",
        WAIT,
    )
    .await;
    js(
        &b,
        "document.querySelector('#rotate-key details').open = true; return 1;",
    )
    .await;
    b.click(
        &b.find("#rotate-key input[name=confirm_rotate]")
            .await
            .unwrap(),
    )
    .await;
    b.click(&b.find("#rotate-key button[type=submit]").await.unwrap())
        .await;
    b.wait_for("#new-secret .secret", WAIT).await;
    let new = js(
        &b,
        "return document.querySelector('#new-secret .secret').dataset.secret;",
    )
    .await
    .as_str()
    .expect("the new secret")
    .to_string();
    assert_ne!(new, old);
    assert_eq!(&new[3..13], key.id, "the same key id");
    b.screenshot("key-rotated").await;
    // the edge reads the rotated record once its cache (200 ms here) expires
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        search_statuses(&edge.url, &new, 1).await,
        [200],
        "the new secret"
    );
    assert_eq!(
        search_statuses(&edge.url, &old, 1).await,
        [200],
        "the replaced secret, through the overlap"
    );
}
