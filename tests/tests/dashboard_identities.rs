//! The dashboard's identities page over HTTP against a real Redis: every
//! identity a key holds with its keys and their usage together, its override set
//! and removed by the operator (the admin API's code: saved in the configuration,
//! audited as the operator), bad input refused naming the form's field with
//! nothing saved, and an identity no key holds refused.

use floodgate_edge::admin;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::keychanges::KeyChanges;
use floodgate_tests::RedisServer;
use floodgate_tests::dash::{ADMIN, Dashboard, Operator, start_dashboard};
use serde_json::Value;

async fn key_of(store: &RespStore, identity: &str, name: &str) -> String {
    let changes = KeyChanges {
        plan: Some("free".into()),
        identity: Some(Some(identity.into())),
        owner: Some(name.into()),
        ..KeyChanges::default()
    };
    admin::create_key_with(store, &changes, 1_764_000_000)
        .await
        .unwrap()
        .0
        .id
}

/// A Redis, the dashboard over it, a store on the same Redis and a signed-in
/// operator (the servers live as long as this does).
struct Signed {
    _redis: RedisServer,
    _dashboard: Dashboard,
    store: RespStore,
    op: Operator,
}

async fn signed_in() -> Signed {
    let redis = RedisServer::start();
    let dashboard = start_dashboard(&redis).await;
    let store = RespStore::connect(&redis.url(), std::time::Duration::from_secs(2))
        .await
        .unwrap();
    let op = Operator::sign_in(&dashboard.url).await;
    Signed {
        _redis: redis,
        _dashboard: dashboard,
        store,
        op,
    }
}

async fn stored_overrides(store: &RespStore) -> Value {
    let text = admin::get_config(store).await.unwrap().unwrap();
    serde_json::from_str::<Value>(&text).unwrap()["identity_overrides"].clone()
}

#[tokio::test]
async fn identities_are_listed_with_their_keys_and_their_overrides_edited_and_audited() {
    let Signed {
        _redis,
        _dashboard: d,
        store,
        op,
    } = signed_in().await;
    let (status, html) = op.page("/identities").await;
    assert_eq!(status, 200);
    assert!(html.contains("id=\"no-identities\""), "no key has one yet");
    let prod = key_of(&store, "cus_42", "production").await;
    let ci = key_of(&store, "cus_42", "CI").await;
    let other = key_of(&store, "cus_43", "staging").await;
    admin::create_key(&store, "no identity", "free", 1_764_000_000)
        .await
        .unwrap();

    let v = op.json("identities", &[]).await;
    let rows = v["identities"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["identity"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["cus_42", "cus_43"],
        "keys without an identity are not one"
    );
    let mut ids: Vec<&str> = rows[0]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    ids.sort();
    let mut want = vec![prod.as_str(), ci.as_str()];
    want.sort();
    assert_eq!(ids, want);
    assert_eq!(rows[1]["keys"][0]["id"], other.as_str());
    assert_eq!(
        (&rows[0]["plan"], &rows[0]["policies"]),
        (&Value::Null, &Value::Null)
    );

    let version = op.version().await;
    let set = |plan: &'static str, policies: &'static str, identity: &'static str| {
        vec![
            ("identity", identity),
            ("plan", plan),
            ("policies", policies),
        ]
    };
    for (fields, field) in [
        (set("gold", "", "cus_42"), "plan"),
        (set("", "search", "cus_42"), "policies"),
        (set("", "nope", "cus_42"), "policies"),
        (set("", "", "cus_42"), "(document)"),
        (set("free", "", "cus_99"), "identity"),
        (set("free", "", "two words"), "identity"),
    ] {
        let v = op.refused("save_identity_override", &fields).await;
        assert_eq!(v["Invalid"]["field"], field, "{fields:?}: {v}");
    }
    assert_eq!(op.version().await, version, "nothing saved");

    let saved = op
        .json("save_identity_override", &set("free", "default", "cus_42"))
        .await;
    assert!(saved["Ok"].as_str().unwrap().contains("cus_42"), "{saved}");
    assert_eq!(
        stored_overrides(&store).await,
        serde_json::json!({"cus_42": {"plan": "free", "policies": ["default"]}})
    );
    let (_, html) = op.page("/identities").await;
    assert!(html.contains("data-identity=\"cus_42\""), "{html}");
    assert!(
        html.contains("plan free, limits default"),
        "the override shown"
    );
    assert!(
        html.contains(&prod) && html.contains("production"),
        "its keys shown"
    );
    assert!(html.contains("Remove override"));

    op.json("delete_identity_override", &[("identity", "cus_42")])
        .await;
    assert_eq!(stored_overrides(&store).await, Value::Null);
    let v = op
        .refused("delete_identity_override", &[("identity", "cus_42")])
        .await;
    assert!(v.to_string().contains("no override for identity"), "{v}");

    // without JavaScript: a plain form post, its error back next to the field
    let plain_post = |plan: &'static str| {
        let op = &op;
        async move {
            op.http
                .post(format!("{}/api/save_identity_override", op.url))
                .header("origin", &op.url)
                .header("cookie", &op.cookie)
                .header("accept", "text/html")
                .header("referer", format!("{}/identities", op.url))
                .form(&[
                    ("csrf", op.csrf.as_str()),
                    ("identity", "cus_43"),
                    ("plan", plan),
                    ("policies", ""),
                ])
                .send()
                .await
                .unwrap()
        }
    };
    let res = plain_post("gold").await;
    assert!(res.status().is_redirection(), "{}", res.status());
    let back = res.headers()["location"].to_str().unwrap().to_string();
    assert!(
        back.contains("/identities?") && back.contains("__err="),
        "{back}"
    );
    let (_, html) = op.page(back.trim_start_matches(&d.url)).await;
    assert!(
        html.contains("data-field=\"plan\""),
        "next to its field: {html}"
    );
    assert_eq!(stored_overrides(&store).await, Value::Null, "nothing saved");
    assert!(plain_post("free").await.status().is_redirection());
    assert_eq!(
        stored_overrides(&store).await,
        serde_json::json!({"cus_43": {"plan": "free"}})
    );

    let log = admin::audit_log(&store, 10).await.unwrap();
    let mine: Vec<(&str, &str)> = log
        .iter()
        .filter(|e| e.user == ADMIN)
        .map(|e| (e.action.as_str(), e.target.as_str()))
        .collect();
    assert_eq!(
        mine[..3],
        [
            ("set identity override", "identity cus_43"),
            ("delete identity override", "identity cus_42"),
            ("set identity override", "identity cus_42")
        ],
        "{mine:?}"
    );
}

/// A key's page shows its fields, its expiry, credits and a rotation's overlap;
/// its form changes the expiry and (confirmed) the credits of exactly the version
/// shown, each bad value refused naming its field, every change audited.
#[tokio::test]
async fn a_keys_page_shows_expiry_credits_and_rotation_and_changes_them() {
    let Signed {
        _redis,
        _dashboard,
        store,
        op,
    } = signed_in().await;
    let id = key_of(&store, "cus_42", "production").await;
    let now = floodgate_dashboard::time::now_secs();
    admin::rotate_key(&store, &id, 3600, now).await.unwrap();
    let (status, html) = op.page(&format!("/keys/{id}")).await;
    assert_eq!(status, 200);
    let until = floodgate_dashboard::time::utc(now + 3600);
    assert!(
        html.contains(&format!("the replaced secret works until {until}")),
        "{html}"
    );
    assert!(html.contains("never"), "no expiry yet");
    assert!(html.contains("cus_42"));

    let detail = op.json("key_detail", &[("id", &id)]).await;
    let version = detail["version"].as_str().unwrap().to_string();
    let save = |fields: Vec<(&'static str, String)>| {
        let op = &op;
        async move {
            let f: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            op.answer("save_key_detail", &f).await
        }
    };
    let fields = |expires: &str, credits: &str, confirm: &str, version: &str| {
        vec![
            ("id", id.clone()),
            ("version", version.to_string()),
            ("expires_at", expires.to_string()),
            ("credits", credits.to_string()),
            ("confirm_credits", confirm.to_string()),
        ]
    };
    for (expires, credits, confirm, field) in [
        ("2020-01-01T00:00:00Z", "", "", "expires_at"),
        ("tomorrow", "", "", "expires_at"),
        ("", r#"{"remaining": 5}"#, "", "confirm_credits"),
        ("", r#"{"remaining": -1}"#, "yes", "credits"),
        ("", r#"{"remaining": 5"#, "yes", "credits"),
    ] {
        let (status, v) = save(fields(expires, credits, confirm, &version)).await;
        assert_eq!(status, 422, "{expires} {credits}: {v}");
        let got = v["Invalid"]["field"].as_str().unwrap_or("(none)");
        assert!(got.starts_with(field), "{expires} {credits}: {v}");
    }
    assert_eq!(
        admin::stored_key(&store, &id).await.unwrap().version,
        version,
        "nothing written"
    );
    let (status, v) = save(fields(
        "2099-01-01T00:00:00Z",
        r#"{"remaining": 5, "refill": {"amount": 5, "interval": "daily"}}"#,
        "yes",
        &version,
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    let r = admin::key_by_id(&store, &id).await.unwrap();
    assert_eq!(r.expires_at, Some(4_070_908_800));
    assert_eq!(r.credits.as_ref().map(|c| c.remaining), Some(5));
    // the page's version is stale now: refused, nothing lost
    let (status, v) = save(fields("", "", "yes", &version)).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(
        admin::key_by_id(&store, &id).await.unwrap().expires_at,
        Some(4_070_908_800)
    );
    let (_, html) = op.page(&format!("/keys/{id}")).await;
    assert!(html.contains("2099-01-01"), "the expiry shown");
    assert!(
        html.contains("&quot;remaining&quot;:5") || html.contains("\"remaining\":5"),
        "the credits shown: {html}"
    );
    let log = admin::audit_log(&store, 5).await.unwrap();
    assert!(
        log.iter()
            .any(|e| e.user == ADMIN && e.action == "edit key" && e.target == id),
        "audited"
    );
}

/// A key's page rotates its secret: refused until confirmed and for a bad
/// overlap (naming the field, nothing changed), refused as a plain form post
/// (the secret would be lost in the redirect), then a new secret in the answer
/// with the old one still verifying through the overlap, the same key id, the
/// page showing the overlap, and the rotation audited as the operator.
#[tokio::test]
async fn a_keys_page_rotates_its_secret_with_the_overlap_confirmed() {
    let Signed {
        _redis,
        _dashboard,
        store,
        op,
    } = signed_in().await;
    let (created, old_secret) = admin::create_key(&store, "production", "free", 1_764_000_000)
        .await
        .unwrap();
    let id = created.id.clone();
    let (_, html) = op.page(&format!("/keys/{id}")).await;
    assert!(
        html.contains("id=\"rotate-key\"") && html.contains("name=\"confirm_rotate\""),
        "the rotation form, with its confirmation: {html}"
    );
    let fields = |overlap: &'static str, confirm: &'static str| {
        vec![
            ("id", id.clone()),
            ("overlap_seconds", overlap.to_string()),
            ("confirm_rotate", confirm.to_string()),
        ]
    };
    let call = |f: Vec<(&'static str, String)>| {
        let op = &op;
        async move {
            let f: Vec<(&str, &str)> = f.iter().map(|(k, v)| (*k, v.as_str())).collect();
            op.answer("rotate_key_secret", &f).await
        }
    };
    let before = admin::key_by_id(&store, &id).await.unwrap();
    for (f, field) in [
        (fields("3600", ""), "confirm_rotate"),
        (fields("an hour", "yes"), "overlap_seconds"),
        (fields("2592001", "yes"), "overlap_seconds"),
        (fields("-1", "yes"), "overlap_seconds"),
    ] {
        let (status, v) = call(f.clone()).await;
        assert_eq!(status, 422, "{f:?}: {v}");
        assert_eq!(v["Invalid"]["field"], field, "{f:?}: {v}");
    }
    // a plain form post (no JavaScript) is refused before anything changes
    let res = op
        .http
        .post(format!("{}/api/rotate_key_secret", op.url))
        .header("origin", &op.url)
        .header("cookie", &op.cookie)
        .header("accept", "text/html")
        .header("referer", format!("{}/keys/{id}", op.url))
        .form(&[
            ("csrf", op.csrf.as_str()),
            ("id", id.as_str()),
            ("overlap_seconds", "3600"),
            ("confirm_rotate", "yes"),
        ])
        .send()
        .await
        .unwrap();
    assert!(res.status().is_redirection(), "{}", res.status());
    assert_eq!(
        admin::key_by_id(&store, &id).await.unwrap(),
        before,
        "nothing changed by a refused rotation"
    );

    let (status, v) = call(fields("3600", "yes")).await;
    assert_eq!(status, 200, "{v}");
    let new_secret = v["secret"].as_str().unwrap().to_string();
    assert_eq!(v["id"], id.as_str(), "the same key");
    assert_ne!(new_secret, old_secret);
    let now = floodgate_dashboard::time::now_secs();
    for secret in [&old_secret, &new_secret] {
        let answer = admin::verify_key(&store, secret, now).await.unwrap();
        assert!(answer.valid, "{answer:?}");
        assert_eq!(answer.key.unwrap().id, id, "both secrets are the same key");
    }
    let later = admin::verify_key(&store, &old_secret, now + 3_601)
        .await
        .unwrap();
    assert!(!later.valid, "the replaced secret ends with the overlap");
    let (_, html) = op.page(&format!("/keys/{id}")).await;
    assert!(
        html.contains("the replaced secret works until"),
        "the overlap shown: {html}"
    );
    let log = admin::audit_log(&store, 5).await.unwrap();
    assert!(
        log.iter()
            .any(|e| e.user == ADMIN && e.action == "rotate key" && e.target == id),
        "audited: {log:?}"
    );
}

/// The key page's form changes the key's identity, name and metadata too (the
/// admin API's checks, each refusal naming its field with nothing written; a
/// field left out is unchanged, an empty one cleared), audited.
#[tokio::test]
async fn a_keys_page_changes_identity_name_and_metadata() {
    let Signed {
        _redis,
        _dashboard,
        store,
        op,
    } = signed_in().await;
    let id = key_of(&store, "cus_42", "production").await;
    let (_, html) = op.page(&format!("/keys/{id}")).await;
    for name in ["identity", "name", "metadata"] {
        assert!(html.contains(&format!("name=\"{name}\"")), "{name}: {html}");
    }
    let version = || async { admin::stored_key(&store, &id).await.unwrap().version };
    let save = |extra: Vec<(&'static str, String)>, version: String| {
        let op = &op;
        let id = id.clone();
        async move {
            let mut f = vec![("id", id), ("version", version)];
            f.extend(extra);
            let f: Vec<(&str, &str)> = f.iter().map(|(k, v)| (*k, v.as_str())).collect();
            op.answer("save_key_detail", &f).await
        }
    };
    let big = format!(r#"{{"note": "{}"}}"#, "x".repeat(1100));
    for (field, value) in [
        ("metadata", "[1, 2]".to_string()),
        ("metadata", "{\"a\": ".to_string()),
        ("metadata", big),
        ("identity", "two words".to_string()),
    ] {
        let before = version().await;
        let (status, v) = save(vec![(field, value.clone())], before.clone()).await;
        assert_eq!(status, 422, "{field} {value}: {v}");
        let got = v["Invalid"]["field"].as_str().unwrap_or("(none)");
        assert!(got.starts_with(field), "{field} {value}: {v}");
        assert_eq!(version().await, before, "nothing written");
    }
    let (status, v) = save(
        vec![
            ("identity", "cus_43".into()),
            ("name", "staging".into()),
            ("metadata", r#"{"tier": "gold"}"#.into()),
        ],
        version().await,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let r = admin::key_by_id(&store, &id).await.unwrap();
    assert_eq!(r.identity.as_deref(), Some("cus_43"));
    assert_eq!(r.name.as_deref(), Some("staging"));
    assert_eq!(
        r.metadata.map(serde_json::Value::Object),
        Some(serde_json::json!({"tier": "gold"}))
    );
    // identity left out: unchanged; name empty: cleared
    let (status, v) = save(vec![("name", String::new())], version().await).await;
    assert_eq!(status, 200, "{v}");
    let r = admin::key_by_id(&store, &id).await.unwrap();
    assert_eq!((r.identity.as_deref(), r.name), (Some("cus_43"), None));
    let log = admin::audit_log(&store, 5).await.unwrap();
    assert_eq!(
        log.iter()
            .filter(|e| e.user == ADMIN && e.action == "edit key" && e.target == id)
            .count(),
        2,
        "each change audited"
    );
}
