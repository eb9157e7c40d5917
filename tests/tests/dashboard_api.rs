//! The dashboard's server over HTTP, against a real Redis: sessions on every page
//! and server function, CSRF, the login limiter, bad input on every form, version
//! checks under concurrent saves, the audit log and escaping.

use floodgate_dashboard::error::AppError;
use floodgate_shared::stats::{Endpoint, Outcome, SAMPLE_KEY, SampleEntry};
use floodgate_tests::RedisServer;
use floodgate_tests::dash::{
    ADMIN, Operator, client, post_login, start_dashboard, start_empty_dashboard,
};
use serde_json::Value;

#[tokio::test]
async fn every_page_and_every_server_function_refuses_without_a_session() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let http = client();
    for page in [
        "/",
        "/policies",
        "/keys",
        "/identities",
        "/audit",
        "/no/such/page",
    ] {
        let res = http.get(format!("{}{page}", d.url)).send().await.unwrap();
        assert_eq!(res.status(), 303, "{page}");
        assert_eq!(res.headers()["location"], "/login", "{page}");
    }
    let login = http.get(format!("{}/login", d.url)).send().await.unwrap();
    assert_eq!(login.status(), 200);
    assert!(login.text().await.unwrap().contains("name=\"password\""));
    let paths = floodgate_dashboard::router::server_fn_paths();
    assert!(
        paths.len() >= 20,
        "the server functions are registered: {paths:?}"
    );
    let mut refused = 0;
    for (path, method) in &paths {
        if path == "/api/login" {
            continue;
        }
        let res = http
            .request(method.parse().unwrap(), format!("{}{path}", d.url))
            .header("origin", &d.url)
            .form(&[("csrf", "x"), ("version", "")])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 401, "{method} {path} without a session");
        // a cookie that names no session is no better
        let res = http
            .request(method.parse().unwrap(), format!("{}{path}", d.url))
            .header("origin", &d.url)
            .header("cookie", format!("fg_session={}", "ab".repeat(32)))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 401, "{method} {path} with a dead session");
        refused += 1;
    }
    assert_eq!(refused, paths.len() - 1);
    // the guard is not the only check: each server function refuses on its own
    // when called during rendering without a session (covered by the pages above,
    // which redirect before rendering).
}

#[tokio::test]
async fn mutations_need_the_same_origin_and_the_session_csrf_token() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let version = op.version().await;
    let form = |csrf: &str| {
        vec![
            ("csrf".to_string(), csrf.to_string()),
            ("version".to_string(), version.clone()),
            ("original".to_string(), String::new()),
            ("name".to_string(), "gold".to_string()),
            ("policies".to_string(), "default".to_string()),
        ]
    };
    let send = |origin: Option<&str>, csrf: &str| {
        let mut req = op
            .http
            .post(format!("{}/api/save_plan", d.url))
            .header("cookie", &op.cookie)
            .form(&form(csrf));
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    assert_eq!(
        send(Some("http://evil.example"), &op.csrf)
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(send(None, &op.csrf).await.unwrap().status(), 403);
    let stale = send(Some(&d.url), "not-the-token").await.unwrap();
    assert_eq!(stale.status(), 403);
    assert!(stale.text().await.unwrap().contains("CSRF"));
    assert_eq!(op.version().await, version, "nothing was written");
    let ok: Value = send(Some(&d.url), &op.csrf)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(ok["Ok"].is_string(), "{ok}");
    assert_ne!(op.version().await, version);
    // signing out ends the session for every later call
    let out = op.call("logout", &[]).await;
    assert!(out.status().is_success(), "{}", out.status());
    assert_eq!(op.call("config", &[]).await.status(), 401);
}

#[tokio::test]
async fn sign_in_fails_with_a_wrong_password_and_is_rate_limited() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let res = post_login(&d.url, ADMIN, "wrong password!").await;
    assert_eq!(res.status(), 401);
    assert!(res.headers().get("set-cookie").is_none());
    let res = post_login(&d.url, "nobody", "wrong password!").await;
    assert_eq!(res.status(), 401, "unknown users fail the same way");
    let res = post_login(&d.url, &"x".repeat(1 << 20), "p").await;
    assert_eq!(res.status(), 401, "a 1 MB user name is just wrong");
    let mut limited = 0;
    for _ in 0..12 {
        let res = post_login(&d.url, ADMIN, "wrong password!").await;
        if res.status() == 429 {
            let e: AppError = res.json().await.unwrap();
            assert!(
                matches!(e, AppError::TooManyAttempts { wait_secs } if (1..=60).contains(&wait_secs)),
                "{e:?}"
            );
            limited += 1;
        }
    }
    // 10 attempts per minute per address: 3 + 12 = 15 attempts, the last 5 refused
    assert_eq!(limited, 5);
    let res = post_login(&d.url, ADMIN, floodgate_tests::dash::ADMIN_PASSWORD).await;
    assert_eq!(
        res.status(),
        429,
        "the limiter answers before the password is checked"
    );
}

fn invalid_field(v: &Value) -> Option<&str> {
    v["Invalid"]["field"].as_str()
}

#[tokio::test]
async fn bad_input_on_every_form_gets_a_clear_error_and_writes_nothing() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let version = op.version().await;
    let mega = "9".repeat(1 << 20);
    let script = "<script>alert(1)</script>";
    let policy = |capacity: &'static str, name: &'static str, period: &'static str| {
        vec![
            ("original", ""),
            ("name", name),
            ("dimensions", "api_key"),
            ("capacity", capacity),
            ("period", period),
            ("refill", ""),
            ("cost", ""),
            ("failure_mode", "fail_closed"),
        ]
    };
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);
    let mut cases: Vec<Case> = vec![
        ("save_policy", policy("abc", "p1", "1m"), "quota.capacity"),
        ("save_policy", policy("0", "p1", "1m"), "quota.capacity"),
        ("save_policy", policy("-1", "p1", "1m"), "quota.capacity"),
        ("save_policy", policy("1e9", "p1", "1m"), "quota.capacity"),
        ("save_policy", policy("10", script, "1m"), "name"),
        ("save_policy", policy("10", "p1", "soon"), "quota.period"),
        (
            "save_plan",
            vec![("original", ""), ("name", script), ("policies", "default")],
            "name",
        ),
        (
            "save_plan",
            vec![("original", ""), ("name", "gold"), ("policies", "nope")],
            "policies",
        ),
        (
            "save_route",
            vec![
                ("original", ""),
                ("name", "r"),
                ("pattern", "/r"),
                ("policies", "default"),
            ],
            "policies",
        ),
        (
            "save_route",
            vec![
                ("original", ""),
                ("name", "x"),
                ("pattern", "no-slash"),
                ("policies", "search"),
            ],
            "pattern",
        ),
        (
            "save_override",
            vec![("key_id", script), ("policies", "default")],
            "key_id",
        ),
        (
            "save_ip_policies",
            vec![("policies", "default")],
            "policies",
        ),
    ];
    let mut big = policy("10", "p1", "1m");
    big[3] = ("capacity", mega.as_str());
    cases.push(("save_policy", big, "quota.capacity"));
    let big_name = "n".repeat(1 << 20);
    let mut big2 = policy("10", "p1", "1m");
    big2[1] = ("name", big_name.as_str());
    cases.push(("save_policy", big2, "name"));
    for (name, mut fields, field) in cases {
        fields.push(("version", &version));
        let (status, v) = op.answer(name, &fields).await;
        assert_eq!(status, 422, "{name}: {v}");
        let got = invalid_field(&v).unwrap_or_else(|| panic!("{name}: {v}"));
        assert_eq!(got, field, "{name}: {v}");
        assert!(!v["Invalid"]["message"].as_str().unwrap().is_empty());
        assert!(!v["Invalid"]["label"].as_str().unwrap().is_empty());
    }
    // key forms
    let v = op
        .refused("create_key", &[("label", "ok"), ("plan", "<b>gold</b>")])
        .await;
    assert_eq!(v["Invalid"]["field"], "plan", "{v}");
    let long = "l".repeat(1 << 20);
    let v = op
        .refused("create_key", &[("label", &long), ("plan", "free")])
        .await;
    assert_eq!(v["Invalid"]["field"], "label", "{v}");
    let v = op
        .refused("revoke_key", &[("id", script), ("confirm", "yes")])
        .await;
    assert_eq!(v["Invalid"]["field"], "id", "{v}");
    // malformed requests: a missing field is the client's error, named
    let (status, v) = op.answer("save_policy", &[("version", &version)]).await;
    assert_eq!(status, 400, "missing fields: {v}");
    assert!(
        v["BadRequest"].as_str().is_some_and(|m| m.contains("form")),
        "{v}"
    );
    let huge = "z".repeat(3 << 20);
    let res = op
        .call(
            "save_plan",
            &[
                ("version", &version),
                ("original", ""),
                ("name", &huge),
                ("policies", ""),
            ],
        )
        .await;
    assert_eq!(res.status(), 413, "a 3 MB body");
    assert_eq!(
        op.version().await,
        version,
        "nothing was written by any of them"
    );
    let keys = op.json("keys", &[]).await;
    assert_eq!(keys.as_array().unwrap().len(), 0, "no key was created");
    // HTML in a stored label is rendered escaped
    let v = op
        .json(
            "create_key",
            &[("label", "<img src=x onerror=alert(1)>"), ("plan", "free")],
        )
        .await;
    assert!(v["secret"].is_string(), "{v}");
    let (status, html) = op.page("/keys").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("&lt;img src=x onerror=alert(1)&gt;")
            || html.contains("&lt;img src=x onerror=alert(1)>"),
        "escaped"
    );
    assert!(!html.contains("<img src=x"), "never raw");
}

#[tokio::test]
async fn concurrent_saves_of_one_version_let_exactly_one_through_and_audit_it() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let version = op.version().await;
    let calls = (0..8).map(|i| {
        let op = &op;
        let version = version.clone();
        async move {
            let cap = (101 + i).to_string();
            op.answer(
                "save_policy",
                &[
                    ("version", &version),
                    ("original", "search"),
                    ("name", "search"),
                    ("dimensions", "api_key,endpoint"),
                    ("capacity", &cap),
                    ("period", "1m"),
                    ("refill", ""),
                    ("cost", ""),
                    ("failure_mode", "fail_closed"),
                ],
            )
            .await
        }
    });
    let answers = futures_join_all(calls).await;
    let ok = answers
        .iter()
        .filter(|(s, a)| *s == 200 && a["Ok"].is_string())
        .count();
    let conflicts = answers
        .iter()
        .filter(|(s, a)| *s == 409 && a["Conflict"].is_string())
        .count();
    assert_eq!((ok, conflicts), (1, 7), "{answers:?}");
    let audit = op.json("audit", &[]).await;
    let edits: Vec<&Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "edit policy")
        .collect();
    assert_eq!(edits.len(), 1);
    assert_eq!(edits[0]["user"], ADMIN);
    let config = op.json("config", &[]).await;
    let cap = config["spec"]["policies"][1]["quota"]["capacity"]
        .as_u64()
        .unwrap();
    // the record holds the item before and after; the log shows what changed
    assert_eq!(
        edits[0]["changes"],
        serde_json::json!([{"path": "quota.capacity", "before": "100", "after": cap.to_string()}]),
        "{audit}"
    );
    // a save based on the old version now conflicts
    let v = op
        .refused("delete_plan", &[("version", &version), ("name", "free")])
        .await;
    assert!(v["Conflict"].is_string(), "{v}");
    // deleting a policy still in use names what uses it, and writes nothing
    let current = op.version().await;
    let v = op
        .refused(
            "delete_policy",
            &[("version", &current), ("name", "default")],
        )
        .await;
    assert!(
        invalid_field(&v).is_some_and(|f| f.starts_with("plans.free")),
        "{v}"
    );
    assert_eq!(v["Invalid"]["label"], "Plan \"free\", limits", "{v}");
    assert_eq!(op.version().await, current);
}

/// Runs futures concurrently on this task.
async fn futures_join_all<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = fs.map(Box::pin).collect();
    let mut out = Vec::with_capacity(handles.len());
    let mut pending: Vec<_> = handles.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, f) in pending.iter_mut().enumerate() {
            if let Some(fut) = f {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *f = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(results.into_iter().map(Option::unwrap));
    out
}

#[tokio::test]
async fn keys_are_created_once_labelled_replanned_revoked_and_effective_limits_shown() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let v = op
        .json("create_key", &[("label", "acme"), ("plan", "free")])
        .await;
    let id = v["id"].as_str().unwrap().to_string();
    let secret = v["secret"].as_str().unwrap().to_string();
    let listed = op.json("keys", &[]).await;
    assert!(
        !listed.to_string().contains(&secret),
        "the secret is never listed"
    );
    let mut conn = redis.connection();
    let stored: Vec<String> = redis::cmd("KEYS")
        .arg("fg:apikey:*")
        .query(&mut conn)
        .unwrap();
    assert_eq!(stored.len(), 1);
    let record: String = redis::cmd("GET").arg(&stored[0]).query(&mut conn).unwrap();
    assert!(!record.contains(&secret), "stored hashed only");
    let version = op.version().await;
    let v = op
        .json(
            "save_override",
            &[
                ("version", &version),
                ("key_id", &id),
                ("policies", "default"),
            ],
        )
        .await;
    assert!(v["Ok"].is_string(), "{v}");
    let rows = op
        .json("effective", &[("key_id", &id), ("path", "/v1/SEARCH/")])
        .await;
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["source"], "KeyOverride");
    assert_eq!(rows[1]["source"]["Route"], "search");
    assert_eq!(rows[1]["limit"], "100 / 1m");
    let v = op
        .json(
            "update_key",
            &[("id", &id), ("label", "acme inc"), ("plan", "free")],
        )
        .await;
    assert!(v["Ok"].is_string(), "{v}");
    let v = op
        .json("revoke_key", &[("id", &id), ("confirm", "yes")])
        .await;
    assert!(v["Ok"].is_string(), "{v}");
    let listed = op.json("keys", &[]).await;
    assert_eq!(listed[0]["label"], "acme inc");
    assert_eq!(listed[0]["revoked"], true);
    let audit = op.json("audit", &[]).await;
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    // ...after the seeding's own audited save of the configuration
    assert_eq!(
        actions,
        [
            "revoke key",
            "edit key",
            "set key override",
            "create key",
            "config.force"
        ]
    );
}

#[tokio::test]
async fn a_backtest_replays_recent_requests_against_the_proposal_without_saving_it() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let version = op.version().await;
    // the edge's sample: 12 searches by one key and 3 by another within a second,
    // 4 checkouts, newest first as the edge pushes them
    let t0 = 1_764_000_000_000i64;
    let entry = |at_ms: i64, key: &str, route: &str| {
        SampleEntry {
            at_ms,
            key_id: key.into(),
            plan: "free".into(),
            endpoint: Endpoint::Route(route.into()),
            outcome: Outcome::Allowed,
        }
        .to_string()
    };
    let mut entries = vec![];
    for i in 0..12 {
        entries.push(entry(t0 + i, "Ab3dE5gH1j", "search"));
    }
    for i in 0..3 {
        entries.push(entry(t0 + 20 + i, "Zz3dE5gH1j", "search"));
    }
    for i in 0..4 {
        entries.push(entry(t0 + 40 + i, "Ab3dE5gH1j", "checkout"));
    }
    entries.push("garbage|<b>|x|y".to_string());
    let mut conn = redis.connection();
    // LPUSH in time order: the list ends newest first, as the edge leaves it
    let _: () = redis::cmd("LPUSH")
        .arg(SAMPLE_KEY)
        .arg(&entries)
        .query(&mut conn)
        .unwrap();
    let propose = |capacity: &'static str, algorithm: &'static str| {
        vec![
            ("version", version.as_str()),
            ("original", "search"),
            ("name", "search"),
            ("dimensions", "api_key,endpoint"),
            ("capacity", capacity),
            ("period", "1m"),
            ("refill", ""),
            ("cost", ""),
            ("failure_mode", "fail_closed"),
            ("algorithm", algorithm),
            ("preview", "1"),
        ]
    };
    let v = op.json("save_policy", &propose("5", "fixed_window")).await;
    let preview = &v["Preview"];
    assert_eq!(preview["sampled"], 19, "the garbage entry is skipped: {v}");
    let rows = preview["rows"].as_array().unwrap();
    let search = rows
        .iter()
        .find(|r| r["endpoint"] == "route:search")
        .unwrap();
    assert_eq!(search["requests"], 15);
    assert_eq!(search["throttled_now"], 0, "100/min today");
    assert_eq!(
        search["throttled"], 7,
        "12 - 5 from the busy key; the other fits"
    );
    assert_eq!(search["keys"], 1);
    assert_eq!(search["keys_seen"], 2);
    let checkout = rows
        .iter()
        .find(|r| r["endpoint"] == "route:checkout")
        .unwrap();
    assert_eq!(checkout["throttled"], 0, "checkout (10/min) is untouched");
    assert_eq!(op.version().await, version, "a backtest saves nothing");
    // an invalid proposal is refused as a save would be
    let v = op.refused("save_policy", &propose("0", "")).await;
    assert_eq!(v["Invalid"]["field"], "quota.capacity", "{v}");
    // the same form without preview saves
    let mut form = propose("5", "fixed_window");
    form.pop();
    let v = op.json("save_policy", &form).await;
    assert!(v["Ok"].is_string(), "{v}");
    assert_ne!(op.version().await, version);
    // and the response header options are switched from the dashboard too
    let current = op.version().await;
    let v = op
        .json(
            "save_headers",
            &[
                ("version", &current),
                ("ietf", "on"),
                ("retry_jitter_secs", "3"),
            ],
        )
        .await;
    assert!(v["Ok"].is_string(), "{v}");
    let config = op.json("config", &[]).await;
    assert_eq!(config["spec"]["headers"]["ietf"], true);
    assert_eq!(config["spec"]["headers"]["retry_jitter_secs"], 3);
}

#[tokio::test]
async fn deny_lists_are_saved_from_the_form_and_a_bad_entry_stores_nothing() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let version = op.version().await;
    let form = |ips: &'static str, countries: &'static str| {
        vec![
            ("key_ids", ""),
            ("ips", ips),
            ("countries", countries),
            ("user_agents", "BadBot\n"),
        ]
    };
    for (ips, countries, field, says) in [
        (
            "203.0.113.7\n10.0.0.0/40",
            "",
            "deny.ips",
            "line 2: \"10.0.0.0/40\" is not an IP address or CIDR range",
        ),
        ("10.1.2.3/8", "", "deny.ips", "did you mean 10.0.0.0/8"),
        ("", "DE\nUK1", "deny.countries", "line 2:"),
    ] {
        let mut fields = form(ips, countries);
        fields.push(("version", &version));
        let v = op.refused("save_deny", &fields).await;
        assert_eq!(invalid_field(&v), Some(field), "{v}");
        let message = v["Invalid"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    assert_eq!(op.version().await, version, "nothing was stored");
    let mut fields = form("203.0.113.7\n2001:db8::/32", "KP");
    fields.push(("version", &version));
    let v = op.json("save_deny", &fields).await;
    assert!(v["Ok"].is_string(), "{v}");
    let config = op.json("config", &[]).await;
    assert_eq!(
        config["spec"]["deny"],
        serde_json::json!({"ips": ["203.0.113.7", "2001:db8::/32"], "countries": ["KP"], "user_agents": ["BadBot"]})
    );
    let audit = op.json("audit", &[]).await;
    assert_eq!(audit[0]["action"], "set deny lists", "{audit}");
    // a save based on the old version is a conflict, not an overwrite
    let mut stale = form("", "");
    stale.push(("version", &version));
    let v = op.refused("save_deny", &stale).await;
    assert!(v["Conflict"].is_string(), "{v}");
    // the editor shows the lists and the counts
    let (status, html) = op.page("/policies").await;
    assert_eq!(status, 200);
    assert!(html.contains("2001:db8::/32") && html.contains("deny-counts"));
}

/// The stored configuration's text (what the edge reads), parsed.
fn stored_config(redis: &RedisServer) -> Value {
    let mut conn = redis.connection();
    let text: String = redis::cmd("GET")
        .arg(floodgate_shared::config::CONFIG_KEY)
        .query(&mut conn)
        .expect("a stored configuration");
    serde_json::from_str(&text).expect("JSON")
}

fn stored_policy(redis: &RedisServer, name: &str) -> Value {
    stored_config(redis)["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no policy {name}"))
}

/// The policy form of the demo's `search` limit (100 per minute), with `changes`.
fn search_form<'a>(version: &'a str, changes: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut form = vec![
        ("version", version),
        ("original", "search"),
        ("name", "search"),
        ("dimensions", "api_key,endpoint"),
        ("capacity", "100"),
        ("period", "1m"),
        ("refill", ""),
        ("cost", ""),
        ("failure_mode", "fail_closed"),
    ];
    for (k, v) in changes {
        match form.iter_mut().find(|slot| slot.0 == *k) {
            Some(slot) => slot.1 = v,
            None => form.push((k, v)),
        }
    }
    form
}

/// The `<input>` tag of the policy form's field `name` in `html`.
fn input_tag<'a>(html: &'a str, name: &str) -> &'a str {
    let at = html
        .find(&format!("name=\"{name}\""))
        .unwrap_or_else(|| panic!("no field {name}"));
    let start = html[..at].rfind('<').unwrap();
    let end = at + html[at..].find('>').unwrap();
    &html[start..=end]
}

/// Issue 12, item 1 (the dashboard form): a bounded limit is saved with its bound,
/// reloaded into the form, edited without losing them, audited field by field; an
/// exact one is stored as before (no `consistency`).
#[tokio::test]
async fn a_bounded_limit_is_saved_reloaded_edited_and_audited_with_its_bound() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let version = op.version().await;
    let v = op
        .json(
            "save_policy",
            &search_form(
                &version,
                &[("consistency", "bounded"), ("max_overshoot", "20")],
            ),
        )
        .await;
    assert!(v["Ok"].is_string(), "{v}");
    let p = stored_policy(&redis, "search");
    assert_eq!(
        (&p["consistency"], &p["max_overshoot"]),
        (&Value::from("bounded"), &Value::from(20)),
        "{p}"
    );
    // the list says so, and the edit form is filled with both
    let (_, html) = op.page("/policies?edit=search").await;
    let row = &html[html.find("data-policy=\"search\"").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("bounded, at most 20 over"), "{row}");
    assert!(
        input_tag(&html, "max_overshoot").contains("value=\"20\""),
        "{}",
        input_tag(&html, "max_overshoot")
    );
    assert!(
        html.contains("<option value=\"bounded\" selected"),
        "bounded is chosen in the form"
    );
    // an edit of another field, as the reloaded form sends it, keeps them
    let version = op.version().await;
    let v = op
        .json(
            "save_policy",
            &search_form(
                &version,
                &[
                    ("capacity", "200"),
                    ("consistency", "bounded"),
                    ("max_overshoot", "20"),
                ],
            ),
        )
        .await;
    assert!(v["Ok"].is_string(), "{v}");
    let p = stored_policy(&redis, "search");
    assert_eq!(p["quota"]["capacity"], 200, "{p}");
    assert_eq!(
        (&p["consistency"], &p["max_overshoot"]),
        (&"bounded".into(), &20.into())
    );
    // auto, then back to exact: stored without consistency, as the edge writes it
    let version = op.version().await;
    let form = search_form(
        &version,
        &[
            ("capacity", "200"),
            ("consistency", "auto"),
            ("max_overshoot", "150"),
        ],
    );
    assert!(op.json("save_policy", &form).await["Ok"].is_string());
    assert_eq!(stored_policy(&redis, "search")["consistency"], "auto");
    let version = op.version().await;
    let form = search_form(
        &version,
        &[
            ("capacity", "200"),
            ("consistency", "exact"),
            ("max_overshoot", ""),
        ],
    );
    assert!(op.json("save_policy", &form).await["Ok"].is_string());
    let p = stored_policy(&redis, "search");
    let obj = p.as_object().unwrap();
    assert!(
        !obj.contains_key("consistency") && !obj.contains_key("max_overshoot"),
        "{p}"
    );
    // every step is in the audit log, field by field
    let (_, html) = op.page("/audit").await;
    let html = html.replace("<!>", "");
    for change in [
        "consistency</code>: exact → bounded",
        "max_overshoot</code>: (none) → 20",
        "consistency</code>: bounded → auto",
        "max_overshoot</code>: 20 → 150",
        "consistency</code>: auto → exact",
        "max_overshoot</code>: 150 → (none)",
    ] {
        assert!(html.contains(change), "{change} in the audit log");
    }
}

/// Issue 12, "Bad input and safety", through the dashboard: each bad bound or
/// combination is refused by the edge's own rules, next to its field, and nothing
/// is stored, also as a plain form post.
#[tokio::test]
async fn a_bad_bound_or_consistency_is_refused_next_to_its_field_and_stores_nothing() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let version = op.version().await;
    let before = stored_config(&redis);
    let bounded = |n: &'static str| vec![("consistency", "bounded"), ("max_overshoot", n)];
    let with = |mut c: Vec<(&'static str, &'static str)>, extra: (&'static str, &'static str)| {
        c.push(extra);
        c
    };
    type Fields = Vec<(&'static str, &'static str)>;
    let cases: Vec<(Fields, &str, &str)> = vec![
        (
            bounded("0"),
            "max_overshoot",
            "between 1 and quota.capacity (100)",
        ),
        (bounded("-1"), "max_overshoot", "whole number"),
        (bounded("1.5"), "max_overshoot", "whole number"),
        (bounded("101"), "max_overshoot", "got 101"),
        (bounded(""), "max_overshoot", "is required"),
        (
            vec![("consistency", "auto")],
            "max_overshoot",
            "is required",
        ),
        (
            with(bounded("5"), ("algorithm", "sliding_log")),
            "consistency",
            "cannot lease",
        ),
        (
            with(bounded("5"), ("algorithm", "fixed_window")),
            "consistency",
            "cannot lease",
        ),
        (
            with(bounded("5"), ("shadow", "on")),
            "consistency",
            "shadow",
        ),
        (
            with(bounded("5"), ("max_in_flight", "3")),
            "consistency",
            "max_in_flight",
        ),
        (
            vec![("consistency", "exact"), ("max_overshoot", "5")],
            "max_overshoot",
            "only applies",
        ),
        (
            vec![("max_overshoot", "5")],
            "max_overshoot",
            "only applies",
        ),
        (
            vec![("consistency", "eventual"), ("max_overshoot", "5")],
            "consistency",
            "unknown variant",
        ),
    ];
    for (changes, field, says) in cases {
        let form = search_form(&version, &changes);
        let (status, v) = op.answer("save_policy", &form).await;
        assert_eq!(status, 422, "{changes:?}: {v}");
        assert_eq!(invalid_field(&v), Some(field), "{changes:?}: {v}");
        let message = v["Invalid"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{changes:?}: {message}");
        // a new policy is refused the same way
        let mut new = form.clone();
        new[1] = ("original", "");
        new[2] = ("name", "fresh");
        assert_eq!(
            invalid_field(&op.refused("save_policy", &new).await),
            Some(field),
            "{changes:?} on a new policy"
        );
    }
    assert_eq!(op.version().await, version, "nothing was stored");
    assert_eq!(stored_config(&redis), before);
    // without JavaScript: the page comes back with the message next to the field
    let res = op
        .http
        .post(format!("{}/api/save_policy", op.url))
        .header("origin", &op.url)
        .header("cookie", &op.cookie)
        .header("accept", "text/html")
        .header("referer", format!("{}/policies?edit=search", op.url))
        .form(
            &[
                vec![("csrf", op.csrf.as_str())],
                search_form(&version, &bounded("101")),
            ]
            .concat(),
        )
        .send()
        .await
        .unwrap();
    assert!(res.status().is_redirection(), "{}", res.status());
    let back = res.headers()["location"].to_str().unwrap().to_string();
    let (status, html) = op.page(back.trim_start_matches(&d.url)).await;
    assert_eq!(status, 200);
    let at = html
        .find("data-field=\"max_overshoot\"")
        .unwrap_or_else(|| panic!("the error is next to the bound: {html}"));
    assert!(html[at..].contains("got 101"));
    assert_eq!(op.version().await, version);
}

/// Writes `policy:<name>|<leasing>` counters into the per-minute hash of `minute`,
/// as the edge's `leased()` and `count_refill()` do.
fn seed_leasing(redis: &RedisServer, minute: i64, policy: &str, counts: [u64; 4]) {
    use floodgate_shared::stats::{Leasing, StatsField, minute_key};
    let mut conn = redis.connection();
    for (what, n) in Leasing::ALL.into_iter().zip(counts) {
        let field = StatsField::Leasing(policy.to_string(), what);
        let _: () = redis::cmd("HINCRBY")
            .arg(minute_key(minute))
            .arg(field.to_string())
            .arg(n)
            .query(&mut conn)
            .unwrap();
    }
}

fn leasing_row<'a>(t: &'a Value, policy: &str) -> &'a Value {
    t["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("no figures: {t}"))
        .iter()
        .find(|r| r["policy"] == policy)
        .unwrap_or_else(|| panic!("no row for {policy}: {t}"))
}

/// Issue 12, item 6: per bounded policy, the share of decisions taken locally,
/// the global calls saved and the overshoot budget in use, from the edges'
/// per-minute counters over the selected range, as text.
#[tokio::test]
async fn the_traffic_page_shows_each_bounded_limits_local_share_calls_saved_and_budget() {
    let redis = RedisServer::start();
    let d = start_dashboard(&redis).await;
    let op = Operator::sign_in(&d.url).await;
    let (_, html) = op.page("/").await;
    assert!(
        html.contains("id=\"no-bounded\""),
        "no bounded policies yet"
    );
    let version = op.version().await;
    let form = search_form(
        &version,
        &[("consistency", "bounded"), ("max_overshoot", "50")],
    );
    assert!(op.json("save_policy", &form).await["Ok"].is_string());
    let minute = floodgate_dashboard::time::now_secs().div_euclid(60);
    // local, exact, refills, outstanding: this minute and the one before
    seed_leasing(&redis, minute, "search", [90, 10, 4, 40]);
    seed_leasing(&redis, minute - 1, "search", [10, 0, 0, 0]);
    // an exact policy's counters (an edge of an older configuration) are not shown
    seed_leasing(&redis, minute, "checkout", [5, 5, 5, 5]);
    // long ago: outside the range
    seed_leasing(&redis, minute - 120, "search", [1000, 0, 0, 0]);
    for range in ["15m", "1h"] {
        let t = op.json("leasing", &[("range", range)]).await;
        assert_eq!(t["policies"].as_array().unwrap().len(), 1, "{t}");
        let s = leasing_row(&t, "search");
        let got: Vec<u64> = [
            "local",
            "exact",
            "refills",
            "outstanding",
            "bound",
            "leasable",
        ]
        .iter()
        .map(|k| s[k].as_u64().unwrap())
        .collect();
        assert_eq!(got, [100, 10, 4, 40, 50, 50], "{range}: {s}");
    }
    let t = op.json("leasing", &[("range", "24h")]).await;
    assert_eq!(leasing_row(&t, "search")["local"], 1100, "{t}");
    let (_, html) = op.page("/").await;
    let table = &html[html.find("id=\"consistency\"").expect("the figures")..];
    let row = &table[table.find("data-policy=\"search\"").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()].replace("<!>", "");
    for text in [
        "bounded, at most 50 over",
        "90.9 % (100 of 110 decisions)",
        "96 (100 local decisions, less 4 refills)",
        "10.0 of 50 tokens (20 %), the mean outstanding at 4 refills",
    ] {
        assert!(row.contains(text), "{text} in {row}");
    }
    assert!(!html.contains("id=\"no-bounded\""));
    // with two regions, each holds max_overshoot / 8 on credit: leases get 38
    let mut config = stored_config(&redis);
    config["regions"] = 2.into();
    let store = floodgate_edge::store::resp::RespStore::connect(
        &redis.url(),
        std::time::Duration::from_secs(2),
    )
    .await
    .unwrap();
    floodgate_edge::admin::set_config(&store, &config.to_string())
        .await
        .unwrap();
    let t = op.json("leasing", &[("range", "15m")]).await;
    assert_eq!(t["regions"], 2, "{t}");
    // 50 - 10 x 2 x 50/40: what the tallies' credit leaves
    assert_eq!(leasing_row(&t, "search")["leasable"], 30, "{t}");
    let (_, html) = op.page("/").await;
    let html = html.replace("<!>", "");
    assert!(html.contains("10.0 of 30 tokens (33 %)"), "{html}");
    assert!(html.contains("With 2 regions"));
    // refills that cost more than local decisions saved are explained
    seed_leasing(&redis, minute, "search", [0, 0, 200, 0]);
    let (_, html) = op.page("/").await;
    let html = html.replace("<!>", "");
    assert!(
        html.contains(
            "none: 204 refills cost 104 more global calls than the 100 local decisions saved"
        ),
        "{html}"
    );
}

/// Issue 24, item 5: with nothing stored yet, each page says what to do next —
/// store a configuration (a form, or the CLI), create a key, send a request with
/// it (the edge's address from --edge-url), where the 429s will show — and the
/// first-run form stores a configuration the edge takes, once.
#[tokio::test]
async fn the_first_run_pages_say_what_to_do_next() {
    let redis = RedisServer::start();
    let d = start_empty_dashboard(&redis, "https://edge.example").await;
    let op = Operator::sign_in(&d.url).await;
    let (status, policies) = op.page("/policies").await;
    assert_eq!(status, 200);
    assert!(policies.contains("id=\"no-config\""), "{policies}");
    assert!(policies.contains("floodgate-cli config set"), "{policies}");
    assert!(policies.contains("id=\"start-form\""), "{policies}");
    let (_, keys) = op.page("/keys").await;
    assert!(keys.contains("id=\"no-plans\""), "{keys}");
    let (_, traffic) = op.page("/").await;
    assert!(traffic.contains("id=\"no-traffic\""), "{traffic}");
    assert!(
        traffic.contains("curl -i -H &quot;Authorization: Bearer KEY&quot; https://edge.example/")
            || traffic.contains("curl -i -H \"Authorization: Bearer KEY\" https://edge.example/"),
        "the request to send: {traffic}"
    );
    assert!(traffic.contains("429"), "where the 429s show: {traffic}");
    assert_eq!(
        op.json("session", &[]).await["edge_url"],
        "https://edge.example"
    );
    // the first-run form: a bad field is named, then a configuration is stored
    let v = op
        .refused(
            "start_config",
            &[
                ("version", ""),
                ("plan", "free"),
                ("capacity", "x"),
                ("period", "1m"),
            ],
        )
        .await;
    assert_eq!(invalid_field(&v), Some("quota.capacity"), "{v}");
    let form = [
        ("version", ""),
        ("plan", "free"),
        ("capacity", "100"),
        ("period", "1m"),
    ];
    assert!(op.json("start_config", &form).await["Ok"].is_string());
    let (_, policies) = op.page("/policies").await;
    assert!(!policies.contains("id=\"no-config\""));
    assert!(policies.contains("data-policy=\"default\""), "{policies}");
    let version = op.version().await;
    let again = [
        ("version", version.as_str()),
        ("plan", "pro"),
        ("capacity", "5"),
        ("period", "1m"),
    ];
    let v = op.refused("start_config", &again).await;
    assert!(v.to_string().contains("stored already"), "{v}");
    // a plan exists: the keys page asks for a key, and a key can be made on it
    let (_, keys) = op.page("/keys").await;
    assert!(
        keys.contains("id=\"no-keys\"") && !keys.contains("id=\"no-plans\""),
        "{keys}"
    );
    let key = op
        .json("create_key", &[("label", "first"), ("plan", "free")])
        .await;
    assert!(key["secret"].as_str().unwrap().starts_with("fg_"));
    let (_, keys) = op.page("/keys").await;
    assert!(!keys.contains("id=\"no-keys\""), "{keys}");
}
