//! The admin HTTP API (`/api/v1/…`) end to end: the dashboard's real server over
//! a real Redis, called by a real HTTP client (reqwest) with tokens made by
//! `floodgate-cli token create` and the shared admin code. Every operation of
//! the OpenAPI document is called (checked against the document itself), the
//! document is valid OpenAPI 3.1 by `openapi-spec-validator`, tokens are scoped,
//! revocable and rate-limited per token, bad input is a 400 naming its field with
//! nothing stored, and concurrent changes through the API and the dashboard lose
//! nothing. Rotation at the edge (both hosts): both secrets work through the
//! overlap on the same bucket, the old one is refused after it.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use floodgate_dashboard::adminapi::OPENAPI;
use floodgate_edge::admin;
use floodgate_edge::store::{NativeStore, StoreOptions};
use floodgate_edge::tokens;
use floodgate_shared::adminapi::{Scope, token_rate_key};
use floodgate_shared::apikeys::check_secret;
use floodgate_tests::dash::{Operator, start_dashboard_configured};
use floodgate_tests::{EdgeKind, EdgeOptions, RedisServer, on_both_hosts, start_edge_with};

on_both_hosts!(rotation_keeps_both_secrets_on_one_bucket_at_the_edge_until_the_overlap_ends);
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// A client of the API with one token, remembering every operation it called
/// (method and the document's path template).
struct Api {
    url: String,
    http: reqwest::Client,
    token: String,
    called: &'static Mutex<BTreeSet<(String, String)>>,
}

/// What an API call answered.
struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Api {
    fn with_token(&self, token: &str) -> Api {
        Api {
            url: self.url.clone(),
            http: self.http.clone(),
            token: token.to_string(),
            called: self.called,
        }
    }

    /// Calls `method path` (`template` is the document's path for it) with a JSON
    /// body and extra headers.
    async fn send(
        &self,
        method: Method,
        template: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        self.called
            .lock()
            .unwrap()
            .insert((method.as_str().to_ascii_lowercase(), template.to_string()));
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if !self.token.is_empty() {
            req = req.bearer_auth(&self.token);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("the API answers");
        let (status, headers) = (res.status(), res.headers().clone());
        let text = res.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, template: &str, path: &str) -> Reply {
        self.send(Method::GET, template, path, None, &[]).await
    }

    async fn post(&self, template: &str, path: &str, body: Value) -> Reply {
        self.send(Method::POST, template, path, Some(body), &[])
            .await
    }

    async fn create(&self, body: Value) -> Reply {
        self.post("/api/v1/keys", "/api/v1/keys", body).await
    }

    async fn key(&self, id: &str) -> Reply {
        self.get("/api/v1/keys/{id}", &format!("/api/v1/keys/{id}"))
            .await
    }

    async fn patch(&self, id: &str, body: Value, if_match: Option<&str>) -> Reply {
        let quoted = if_match.map(|v| format!("\"{v}\""));
        let headers: Vec<(&str, &str)> = quoted.iter().map(|v| ("if-match", v.as_str())).collect();
        let path = format!("/api/v1/keys/{id}");
        self.send(
            Method::PATCH,
            "/api/v1/keys/{id}",
            &path,
            Some(body),
            &headers,
        )
        .await
    }

    async fn rotate(&self, id: &str, overlap: Value) -> Reply {
        let path = format!("/api/v1/keys/{id}/rotate");
        self.post(
            "/api/v1/keys/{id}/rotate",
            &path,
            json!({ "overlap_seconds": overlap }),
        )
        .await
    }

    async fn revoke(&self, id: &str) -> Reply {
        let path = format!("/api/v1/keys/{id}/revoke");
        self.send(Method::POST, "/api/v1/keys/{id}/revoke", &path, None, &[])
            .await
    }

    async fn verify(&self, secret: &str) -> Reply {
        self.post("/api/v1/verify", "/api/v1/verify", json!({ "key": secret }))
            .await
    }
}

struct Setup {
    called: &'static Mutex<BTreeSet<(String, String)>>,
    redis: RedisServer,
    store: NativeStore,
    url: String,
    _dashboard: floodgate_tests::dash::Dashboard,
}

/// Redis, the dashboard (demo configuration: plan `free`) with `api_rate` per
/// token, and a store client of the test's own.
async fn setup(api_rate: &str) -> Setup {
    let redis = RedisServer::start();
    let options = StoreOptions::new(redis.url(), Duration::from_secs(2));
    let quota = floodgate_shared::policy::Quota::parse_short(api_rate).unwrap();
    let dashboard = start_dashboard_configured(&options, |c| c.api_quota = quota).await;
    let store = NativeStore::connect(&options).await.unwrap();
    Setup {
        called: Box::leak(Box::default()),
        url: dashboard.url.clone(),
        redis,
        store,
        _dashboard: dashboard,
    }
}

impl Setup {
    /// A client with `token`; the clients of one setup share what they called.
    fn api(&self, token: &str) -> Api {
        Api {
            url: self.url.clone(),
            http: reqwest::Client::new(),
            token: token.to_string(),
            called: self.called,
        }
    }

    /// A token made by the shared admin code (`floodgate-cli token create`'s).
    async fn token(&self, scope: Scope, name: &str) -> (String, String) {
        let (t, secret) = tokens::create_token(&self.store, name, scope, "tests", 1_764_000_000)
            .await
            .unwrap();
        (t.id, secret)
    }
}

/// `floodgate-cli token create` through the built binary: its stdout is the token.
fn cli_token(redis: &RedisServer, scope: &str, name: &str) -> String {
    let url = redis.url();
    let args = [
        "--redis", &url, "token", "create", "--scope", scope, "--name", name,
    ];
    let out = floodgate_tests::process::run("floodgate-cli", &args, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Every (method, path) the OpenAPI document names.
fn documented_operations() -> BTreeSet<(String, String)> {
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if method != "parameters" {
                out.insert((method.clone(), path.clone()));
            }
        }
    }
    out
}

fn field(r: &Reply) -> &str {
    r.body["field"].as_str().unwrap_or("(none)")
}

/// The whole lifecycle through the API with a write token from the CLI, and a
/// read token beside it; the audit log names the token for every change.
#[tokio::test]
async fn every_documented_call_works_with_a_real_client_and_scoped_tokens() {
    let s = setup("600/1m").await;
    let write = s.api(&cli_token(&s.redis, "write", "billing backend"));
    let (read_id, read_secret) = s.token(Scope::Read, "reporting").await;
    let read = s.api(&read_secret);
    let doc = s
        .api("")
        .get("/api/v1/openapi.json", "/api/v1/openapi.json")
        .await;
    assert_eq!(doc.status, 200);
    assert_eq!(doc.body, serde_json::from_str::<Value>(OPENAPI).unwrap());

    let made = write
        .create(json!({"plan": "free", "identity": "cus_1", "name": "production", "metadata": {"tier": "gold"}}))
        .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let key = made.body["key"].clone();
    let (id, secret) = (
        key["id"].as_str().unwrap(),
        made.body["secret"].as_str().unwrap(),
    );
    assert!(check_secret(secret).is_ok(), "{secret}");
    assert_eq!(
        made.headers["etag"],
        format!("\"{}\"", key["version"].as_str().unwrap())
    );
    assert_eq!(made.headers["x-ratelimit-limit"], "600");
    for body in [
        json!({"plan": "free", "identity": "cus_1"}),
        json!({"plan": "free", "identity": "cus_2"}),
    ] {
        assert_eq!(write.create(body).await.status, 201);
    }
    let got = read.key(id).await;
    assert_eq!((got.status, &got.body), (StatusCode::OK, &key));

    // pages of one identity's keys
    let first = read
        .get("/api/v1/keys", "/api/v1/keys?identity=cus_1&limit=1")
        .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["keys"].as_array().unwrap().len(), 1);
    let cursor = first.body["next_cursor"].as_str().expect("a second page");
    let second = read
        .get(
            "/api/v1/keys",
            &format!("/api/v1/keys?identity=cus_1&limit=1&cursor={cursor}"),
        )
        .await;
    assert_eq!(second.body["keys"].as_array().unwrap().len(), 1);
    assert_eq!(second.body["next_cursor"], Value::Null);
    let ids: BTreeSet<&str> = [&first, &second]
        .iter()
        .map(|p| p.body["keys"][0]["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(id) && ids.len() == 2, "{ids:?}");
    let all = read.get("/api/v1/keys", "/api/v1/keys").await;
    assert_eq!(all.body["keys"].as_array().unwrap().len(), 3);

    // a version-checked change; the old version is refused afterwards
    let version = key["version"].as_str().unwrap();
    let changed = write
        .patch(id, json!({"name": "ci", "metadata": null}), Some(version))
        .await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert_eq!(
        (changed.body["name"].as_str(), &changed.body["metadata"]),
        (Some("ci"), &Value::Null)
    );
    assert_eq!(changed.body["identity"], "cus_1", "left out: unchanged");
    let stale = write
        .patch(id, json!({"name": "lost"}), Some(version))
        .await;
    assert_eq!(
        (stale.status, field(&stale)),
        (StatusCode::PRECONDITION_FAILED, "If-Match")
    );
    assert_eq!(read.key(id).await.body["name"], "ci", "nothing was written");

    // verification, then a rotation with an overlap: both secrets valid, one key
    let ok = read.verify(secret).await;
    assert_eq!(
        (ok.body["valid"].as_bool(), ok.body["key"]["id"].as_str()),
        (Some(true), Some(id))
    );
    let forged = format!(
        "{}{}",
        &secret[..secret.len() - 1],
        if secret.ends_with('0') { '1' } else { '0' }
    );
    assert_eq!(read.verify(&forged).await.body["reason"], "malformed");
    let rotated = write.rotate(id, json!(600)).await;
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    let new_secret = rotated.body["secret"].as_str().unwrap().to_string();
    assert_ne!(new_secret, secret);
    assert_eq!(rotated.body["key"]["id"], id);
    let until = rotated.body["key"]["previous_secret_expires_at"]
        .as_i64()
        .unwrap();
    assert!(
        (until - floodgate_dashboard::time::now_secs() - 600).abs() <= 2,
        "{until}"
    );
    for sec in [secret, new_secret.as_str()] {
        let v = read.verify(sec).await;
        assert_eq!(
            (v.body["valid"].as_bool(), v.body["key"]["id"].as_str()),
            (Some(true), Some(id)),
            "{sec}"
        );
    }
    // a rotation without overlap: the secret it replaced and the one before stop now
    let again = write.rotate(id, json!(0)).await;
    let newest = again.body["secret"].as_str().unwrap().to_string();
    for sec in [secret, new_secret.as_str()] {
        assert_eq!(read.verify(sec).await.body["reason"], "not_found", "{sec}");
    }
    assert_eq!(read.verify(&newest).await.body["valid"], true);

    let path = format!("/api/v1/keys/{id}/usage");
    let usage = read.get("/api/v1/keys/{id}/usage", &path).await;
    assert_eq!(usage.status, 200, "{}", usage.body);
    assert_eq!(
        (
            usage.body["allowed"].as_u64(),
            usage.body["minutes"].as_i64()
        ),
        (Some(0), Some(60)),
        "no edge ran"
    );

    let who = read
        .get("/api/v1/identities/{identity}", "/api/v1/identities/cus_1")
        .await;
    assert_eq!(who.status, 200, "{}", who.body);
    let their: BTreeSet<&str> = who.body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    assert_eq!(their, ids, "the identity's two keys");
    let nobody = read
        .get("/api/v1/identities/{identity}", "/api/v1/identities/cus_9")
        .await;
    assert_eq!(nobody.status, 404);

    identity_overrides_through_the_api(&read, &write, &s.store).await;

    let revoked = write.revoke(id).await;
    assert_eq!(
        (revoked.status, revoked.body["status"].as_str()),
        (StatusCode::OK, Some("revoked"))
    );
    assert_eq!(read.verify(&newest).await.body["reason"], "revoked");
    let twice = write.revoke(id).await;
    assert_eq!(
        (twice.status, field(&twice)),
        (StatusCode::BAD_REQUEST, "id")
    );
    let missing = read.key("NoSuchKey0").await;
    assert_eq!(missing.status, 404);

    // scopes, unknown and revoked tokens
    let denied = read.create(json!({"plan": "free"})).await;
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert!(
        denied.body["error"]
            .as_str()
            .unwrap()
            .contains("needs write")
    );
    let none = s.api("").get("/api/v1/keys", "/api/v1/keys").await;
    assert_eq!(none.status, 401);
    assert!(
        none.body["error"]
            .as_str()
            .unwrap()
            .starts_with("Missing API token")
    );
    let wrong = read.with_token("fga_0123456789_abcdefghijklmnopqrstuvwxyzABCDEF");
    assert_eq!(
        wrong.get("/api/v1/keys", "/api/v1/keys").await.body["error"],
        "Invalid API token"
    );
    tokens::revoke_token(&s.store, &read_id, "tests", 1_764_000_001)
        .await
        .unwrap();
    let gone = read.get("/api/v1/keys", "/api/v1/keys").await;
    assert_eq!(
        (gone.status, gone.body["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("API token revoked"))
    );
    assert_eq!(write.key(id).await.status, 200, "other tokens work on");
    let nowhere = write.get("/api/v1/nothing", "/api/v1/nothing").await;
    assert_eq!(nowhere.status, 404);

    // every change audited, naming the token
    let log = admin::audit_log(&s.store, 50).await.unwrap();
    let by_api: Vec<&str> = log
        .iter()
        .filter(|e| e.user == format!("api:billing backend ({})", &write.token[4..14]))
        .map(|e| e.action.as_str())
        .collect();
    for action in ["key.create", "key.update", "key.rotate", "key.revoke"] {
        assert!(by_api.contains(&action), "{action} in {by_api:?}");
    }
    for action in ["set identity override", "delete identity override"] {
        assert!(by_api.contains(&action), "{action} in {by_api:?}");
    }
    assert_eq!(by_api.iter().filter(|a| **a == "key.create").count(), 3);
    assert!(
        log.iter()
            .any(|e| e.action == "token.create" && e.user.starts_with("cli:"))
    );
    assert!(
        log.iter()
            .any(|e| e.action == "token.revoke" && e.target == format!("token {read_id}"))
    );

    let mut called = write.called.lock().unwrap().clone();
    called.remove(&("get".to_string(), "/api/v1/nothing".to_string()));
    assert_eq!(
        called,
        documented_operations(),
        "every documented call, and only those"
    );
}

impl Api {
    async fn identity_override(
        &self,
        method: Method,
        identity: &str,
        body: Option<Value>,
    ) -> Reply {
        let template = "/api/v1/identities/{identity}/overrides";
        let path = format!("/api/v1/identities/{identity}/overrides");
        self.send(method, template, &path, body, &[]).await
    }
}

/// An identity's override (cus_1 holds keys, cus_9 none) set, read, refused
/// naming the field with nothing stored, and removed; the stored configuration
/// holds exactly what the API answered.
async fn identity_overrides_through_the_api(read: &Api, write: &Api, store: &NativeStore) {
    let stored = || async {
        let text = admin::get_config(store).await.unwrap().unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        v["identity_overrides"].clone()
    };
    let none = read.identity_override(Method::GET, "cus_1", None).await;
    assert_eq!(none.status, 404, "{}", none.body);
    let set = write
        .identity_override(
            Method::PUT,
            "cus_1",
            Some(json!({"plan": "free", "policies": ["default"]})),
        )
        .await;
    assert_eq!(set.status, 200, "{}", set.body);
    assert_eq!(
        (
            &set.body["identity"],
            &set.body["plan"],
            &set.body["policies"]
        ),
        (&json!("cus_1"), &json!("free"), &json!(["default"]))
    );
    let version = admin::load_config(store).await.unwrap().0;
    assert_eq!(set.body["config_version"], version.as_str());
    assert_eq!(
        stored().await,
        json!({"cus_1": {"plan": "free", "policies": ["default"]}})
    );
    let got = read.identity_override(Method::GET, "cus_1", None).await;
    assert_eq!((got.status, &got.body), (StatusCode::OK, &set.body));
    for (identity, body, status, field_named) in [
        ("cus_9", json!({"plan": "free"}), 400, "identity"),
        ("two words", json!({"plan": "free"}), 400, "identity"),
        ("cus_1", json!({"plan": "gold"}), 400, "plan"),
        ("cus_1", json!({"policies": ["search"]}), 400, "policies[0]"),
        ("cus_1", json!({"policies": ["nope"]}), 400, "policies[0]"),
        ("cus_1", json!({"policies": []}), 400, "policies"),
        ("cus_1", json!({}), 400, "(document)"),
        ("cus_1", json!({"plan": "free", "limits": 1}), 400, "limits"),
        ("cus_1", json!({"plan": 7}), 400, "plan"),
    ] {
        let r = write
            .identity_override(Method::PUT, identity, Some(body.clone()))
            .await;
        assert_eq!(
            (r.status.as_u16(), field(&r)),
            (status, field_named),
            "{identity} {body}: {}",
            r.body
        );
    }
    assert!(
        read.identity_override(Method::PUT, "cus_1", Some(json!({"plan": "free"})))
            .await
            .body["error"]
            .as_str()
            .unwrap()
            .contains("needs write")
    );
    assert_eq!(
        admin::load_config(store).await.unwrap().0,
        version,
        "nothing stored"
    );
    let gone = write.identity_override(Method::DELETE, "cus_1", None).await;
    assert_eq!(
        (gone.status, &gone.body["plan"]),
        (StatusCode::OK, &json!("free"))
    );
    assert_eq!(stored().await, Value::Null, "no identity_overrides left");
    let again = write.identity_override(Method::DELETE, "cus_1", None).await;
    assert_eq!(again.status, 404, "{}", again.body);
}

/// Credits are enforced by the edge now (issue 23): the API creates a key with
/// credits and changes them, both stored on the record.
#[tokio::test]
async fn credits_are_created_and_changed_through_the_api() {
    let s = setup("600/1m").await;
    let api = s.api(&s.token(Scope::Write, "ops").await.1);
    let made = api
        .create(json!({"plan": "free", "credits": {"remaining": 5}}))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert_eq!(made.body["key"]["credits"]["remaining"], 5, "{}", made.body);
    let id = made.body["key"]["id"].as_str().unwrap().to_string();
    let r = api
        .patch(&id, json!({"credits": {"remaining": 9}}), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["credits"]["remaining"], 9, "{}", r.body);
}

/// Each bad value is a 400 naming its field; nothing is stored (no key created,
/// the key changed keeps its version).
#[tokio::test]
async fn bad_input_is_a_400_naming_the_field_and_stores_nothing() {
    let s = setup("600/1m").await;
    let api = s.api(&s.token(Scope::Write, "ops").await.1);
    let made = api.create(json!({"plan": "free"})).await;
    let id = made.body["key"]["id"].as_str().unwrap().to_string();
    let version = made.body["key"]["version"].as_str().unwrap().to_string();
    let big = "x".repeat(1100);
    let past = floodgate_dashboard::time::now_secs() - 10;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"plan": "free", "metadata": {"a": big}}), "metadata"),
        (json!({"plan": "free", "metadata": [1, 2]}), "metadata"),
        (json!({"plan": "free", "expires_at": past}), "expires_at"),
        (
            json!({"plan": "free", "credits": {"remaining": -1}}),
            "credits.remaining",
        ),
        (
            json!({"plan": "free", "credits": {"remaining": 2.5}}),
            "credits.remaining",
        ),
        (json!({"plan": "gold"}), "plan"),
        (json!({"plan": "free", "identity": "a b"}), "identity"),
        (json!({"plan": "free", "colour": "red"}), "colour"),
        (json!({"plan": "free", "name": 5}), "name"),
    ];
    for (body, want) in &cases {
        let r = api.create(body.clone()).await;
        assert_eq!(
            (r.status, field(&r)),
            (StatusCode::BAD_REQUEST, *want),
            "create {body}: {}",
            r.body
        );
        let mut change = body.clone();
        change.as_object_mut().unwrap().remove("plan");
        if change.as_object().unwrap().is_empty() {
            change = json!({"plan": "gold"});
        }
        let r = api.patch(&id, change.clone(), None).await;
        assert_eq!(
            (r.status, field(&r)),
            (StatusCode::BAD_REQUEST, *want),
            "update {change}: {}",
            r.body
        );
    }
    let raw = reqwest::Client::new()
        .post(format!("{}/api/v1/keys", s.url))
        .bearer_auth(&api.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let huge = reqwest::Client::new()
        .post(format!("{}/api/v1/keys", s.url))
        .bearer_auth(&api.token)
        .body(format!(
            r#"{{"plan":"free","name":"{}"}}"#,
            "n".repeat(20_000)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), 413, "bodies over 16 KB");
    for overlap in [json!(-1), json!(2_592_001), json!("1h")] {
        let r = api.rotate(&id, overlap.clone()).await;
        assert_eq!(
            (r.status, field(&r)),
            (StatusCode::BAD_REQUEST, "overlap_seconds"),
            "{overlap}"
        );
    }
    for query in ["limit=0", "limit=101", "limit=ten", "colour=red"] {
        let r = api
            .get("/api/v1/keys", &format!("/api/v1/keys?{query}"))
            .await;
        assert_eq!(r.status, 400, "{query}");
        assert_eq!(field(&r), query.split('=').next().unwrap());
    }
    for query in ["minutes=0", "minutes=1441", "minutes=1.5", "limit=5"] {
        let r = api
            .get(
                "/api/v1/keys/{id}/usage",
                &format!("/api/v1/keys/{id}/usage?{query}"),
            )
            .await;
        assert_eq!(
            (r.status, field(&r)),
            (StatusCode::BAD_REQUEST, query.split('=').next().unwrap()),
            "{query}"
        );
    }
    let r = api
        .get("/api/v1/keys/{id}/usage", "/api/v1/keys/NoSuchKey0/usage")
        .await;
    assert_eq!(r.status, 404);
    let r = api
        .post("/api/v1/verify", "/api/v1/verify", json!({"secret": "x"}))
        .await;
    assert_eq!(field(&r), "secret");
    let keys = admin::list_stored(&s.store).await.unwrap();
    assert_eq!(keys.len(), 1, "no key was created");
    assert_eq!(keys[0].version, version, "the key was not changed");
    // a revoked key is read-only and cannot be rotated
    assert_eq!(api.revoke(&id).await.status, 200);
    let r = api.rotate(&id, json!(60)).await;
    assert_eq!((r.status, field(&r)), (StatusCode::BAD_REQUEST, "status"));
    let r = api.patch(&id, json!({"name": "x"}), None).await;
    assert_eq!((r.status, field(&r)), (StatusCode::BAD_REQUEST, "id"));
}

/// Changes of different fields through the API and the dashboard's form, at
/// the same time, round after round: every one of them is kept. Two changes
/// based on the same version: exactly one is saved.
#[tokio::test]
async fn concurrent_changes_through_the_api_and_the_dashboard_lose_nothing() {
    let s = setup("600/1m").await;
    let api = s.api(&s.token(Scope::Write, "ops").await.1);
    let op = Operator::sign_in(&s.url).await;
    let made = api.create(json!({"plan": "free", "name": "n"})).await;
    let id = made.body["key"]["id"].as_str().unwrap().to_string();
    for round in 0..25 {
        let (name, label) = (format!("api-{round}"), format!("dash-{round}"));
        let form = [("id", id.as_str()), ("label", &label), ("plan", "free")];
        let (a, d) = tokio::join!(
            api.patch(&id, json!({ "name": name }), None),
            op.call("update_key", &form)
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(d.status().is_success(), "{}", d.status());
        let now = api.key(&id).await.body;
        assert_eq!(
            (now["name"].as_str(), now["owner"].as_str()),
            (Some(name.as_str()), Some(label.as_str())),
            "round {round}"
        );
    }
    let version = api.key(&id).await.body["version"]
        .as_str()
        .unwrap()
        .to_string();
    let (a, b) = tokio::join!(
        api.patch(&id, json!({"name": "a"}), Some(&version)),
        api.patch(&id, json!({"name": "b"}), Some(&version))
    );
    let mut statuses = [a.status.as_u16(), b.status.as_u16()];
    statuses.sort();
    assert_eq!(statuses, [200, 412]);
    let winner = if a.status == 200 { "a" } else { "b" };
    assert_eq!(api.key(&id).await.body["name"], winner);
}

/// Each token has its own bucket in Floodgate's token-bucket script: 5 a minute
/// here, the sixth call refused with 429 and Retry-After; another token's calls
/// are unaffected.
#[tokio::test]
async fn each_token_is_rate_limited_by_floodgates_own_script() {
    let s = setup("5/1m").await;
    let (id, secret) = s.token(Scope::Read, "busy").await;
    let (busy, calm) = (s.api(&secret), s.api(&s.token(Scope::Read, "calm").await.1));
    for left in (0..5).rev() {
        let r = busy.get("/api/v1/keys", "/api/v1/keys").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-ratelimit-remaining"], left.to_string());
    }
    let r = busy.get("/api/v1/keys", "/api/v1/keys").await;
    assert_eq!(r.status, 429, "{}", r.body);
    let wait: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=12).contains(&wait), "{wait}");
    assert!(
        r.body["error"]
            .as_str()
            .unwrap()
            .contains("too many requests")
    );
    assert_eq!(calm.get("/api/v1/keys", "/api/v1/keys").await.status, 200);
    let mut c = s.redis.connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg(token_rate_key(&id))
        .query(&mut c)
        .unwrap();
    assert!(exists, "the bucket is the token's, in Redis");
}

/// The document is OpenAPI 3.1 by the reference validator, which refuses a
/// broken copy of it.
#[test]
fn the_openapi_document_is_valid_openapi_3_1() {
    let python = floodgate_tests::openapi_validator_env();
    let dir = std::env::temp_dir().join(format!("floodgate-openapi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("openapi.json");
    std::fs::write(&good, OPENAPI).unwrap();
    let mut broken: Value = serde_json::from_str(OPENAPI).unwrap();
    broken["paths"]["/api/v1/keys"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] =
        json!({"$ref": "#/components/schemas/NoSuchSchema"});
    let bad = dir.join("broken.json");
    std::fs::write(&bad, broken.to_string()).unwrap();
    let validate = |file: &std::path::Path| {
        std::process::Command::new(&python)
            .args(["-m", "openapi_spec_validator"])
            .arg(file)
            .output()
            .unwrap()
    };
    let out = validate(&good);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.contains("OK"), "{text}");
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(
        !validate(&bad).status.success(),
        "the validator refuses a dangling $ref"
    );
}

/// 100 per hour per key, so the bucket's count shows in every answer.
const EDGE_CONFIG: &str = r#"{
  "policies": [
    {"name": "default", "dimensions": ["api_key"], "quota": {"capacity": 100, "refill": 1, "period": "1h"}, "failure_mode": "fail_closed"}
  ],
  "plans": {"free": ["default"]}
}"#;

/// The edge (both hosts) honours a rotated-out secret through the overlap, on
/// the key's one bucket (rotation does not reset the limits), and refuses it
/// from the overlap's end on, within the cache bound.
async fn rotation_keeps_both_secrets_on_one_bucket_at_the_edge_until_the_overlap_ends(
    kind: EdgeKind,
) {
    let redis = RedisServer::start();
    let seeded = floodgate_tests::seed(&redis, EDGE_CONFIG).await;
    let store = NativeStore::connect(&StoreOptions::new(redis.url(), Duration::from_secs(2)))
        .await
        .unwrap();
    let upstream = floodgate_tests::upstream::RawUpstream::start().await;
    let options = EdgeOptions {
        cache_ttl_ms: 300,
        ..EdgeOptions::default()
    };
    let edge = start_edge_with(kind, &redis, &upstream.url, &options).await;
    let http = reqwest::Client::new();
    let call = |secret: String| {
        let (http, url) = (http.clone(), edge.url.clone());
        async move {
            let r = http
                .get(format!("{url}/v1/items"))
                .bearer_auth(secret)
                .send()
                .await
                .unwrap();
            let left = r
                .headers()
                .get("x-ratelimit-remaining")
                .map(|v| v.to_str().unwrap().to_string());
            (r.status().as_u16(), left, r.text().await.unwrap())
        }
    };
    let old = seeded.secret.clone();
    for left in ["99", "98"] {
        assert_eq!(call(old.clone()).await.1.as_deref(), Some(left));
    }
    let now = floodgate_dashboard::time::now_secs();
    let (_, after, new) = admin::rotate_key(&store, &seeded.key_id, 3, now)
        .await
        .unwrap();
    assert_eq!(after.id, seeded.key_id);
    let ends = after.rotation.unwrap().overlap_ends;
    // both secrets, one bucket: the count goes on from 98
    let mut expect = 98;
    for secret in [&new, &old, &new, &old] {
        expect -= 1;
        let (status, left, body) = call(secret.clone()).await;
        assert_eq!((status, left), (200, Some(expect.to_string())), "{body}");
    }
    // the old secret stops at the overlap's end (plus the cache bound); the new works on
    while floodgate_dashboard::time::now_secs() < ends {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, _, body) = call(old.clone()).await;
    assert_eq!(
        (status, body.as_str()),
        (401, r#"{"error":"Invalid API key"}"#)
    );
    expect -= 1;
    assert_eq!(call(new.clone()).await.1, Some(expect.to_string()));
    // a revocation reaches the new secret
    // (a record read within two cache lifetimes may answer once more while it
    // is read again in the background)
    admin::revoke_key(&store, &seeded.key_id).await.unwrap();
    let mut last = (0, String::new());
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, _, body) = call(new.clone()).await;
        last = (status, body);
        if status == 401 {
            break;
        }
    }
    assert_eq!(
        (last.0, last.1.as_str()),
        (401, r#"{"error":"API key revoked"}"#)
    );
}

/// `lua/key_cas.lua` against a real Redis: nothing is written over a missing
/// record or another version; the version it answers is `record_version`'s.
#[tokio::test]
async fn key_cas_saves_only_over_the_version_it_was_based_on() {
    use floodgate_edge::store::{Store, Value};
    use floodgate_shared::adminapi::KEY_CAS;
    let redis = RedisServer::start();
    let store = NativeStore::connect(&StoreOptions::new(redis.url(), Duration::from_secs(2)))
        .await
        .unwrap();
    let cas = |based_on: &str, text: &str| {
        let args = [based_on.to_string(), text.to_string()];
        let store = &store;
        async move { store.run(&KEY_CAS, &["fg:apikey:k"], &args).await.unwrap() }
    };
    let reply = |saved: i64, version: &str| {
        Value::Array(vec![
            Value::Int(saved),
            Value::Bulk(version.as_bytes().to_vec()),
        ])
    };
    assert_eq!(cas("", "{}").await, reply(0, ""), "never creates a record");
    assert_eq!(store.get("fg:apikey:k").await.unwrap(), None);
    store
        .set("fg:apikey:k", b"one", Default::default())
        .await
        .unwrap();
    let one = admin::record_version(b"one");
    assert_eq!(cas("stale", "two").await, reply(0, &one));
    assert_eq!(store.get("fg:apikey:k").await.unwrap().unwrap(), b"one");
    assert_eq!(
        cas(&one, "two").await,
        reply(1, &admin::record_version(b"two"))
    );
    assert_eq!(store.get("fg:apikey:k").await.unwrap().unwrap(), b"two");
}

/// `floodgate-cli key update` and `key rotate` make the admin API's changes
/// (each bad value refused naming its field, nothing stored), audited as the CLI.
#[tokio::test]
async fn the_cli_updates_and_rotates_keys_through_the_shared_code() {
    let redis = RedisServer::start();
    let seeded = floodgate_tests::seed(&redis, EDGE_CONFIG).await;
    let store = NativeStore::connect(&StoreOptions::new(redis.url(), Duration::from_secs(2)))
        .await
        .unwrap();
    let id = seeded.key_id.as_str();
    let cli = |args: &[&str]| {
        let url = redis.url();
        let mut all = vec!["--redis", url.as_str(), "key"];
        all.extend_from_slice(args);
        floodgate_tests::process::run("floodgate-cli", &all, &[])
    };
    let out = cli(&[
        "update",
        id,
        "--name",
        "ci",
        "--metadata",
        r#"{"tier":"gold"}"#,
        "--expires-in",
        "30d",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = admin::key_by_id(&store, id).await.unwrap();
    assert_eq!(r.name.as_deref(), Some("ci"));
    assert_eq!(r.metadata.unwrap()["tier"], "gold");
    assert!(r.expires_at.unwrap() > floodgate_dashboard::time::now_secs() + 29 * 86_400);
    let before = admin::stored_key(&store, id).await.unwrap().version;
    for (args, field) in [
        (vec!["update", id, "--metadata", "[1]"], "metadata"),
        (vec!["update", id, "--plan", "gold"], "plan"),
        (
            vec!["update", id, "--expires-at", "2001-01-01T00:00:00Z"],
            "expires_at",
        ),
        (vec!["rotate", id, "--overlap", "31d"], "overlap_seconds"),
    ] {
        let out = cli(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(field),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        admin::stored_key(&store, id).await.unwrap().version,
        before,
        "nothing stored"
    );
    let out = cli(&["update", id, "--clear", "name"]);
    assert!(out.status.success());
    assert_eq!(admin::key_by_id(&store, id).await.unwrap().name, None);
    let out = cli(&["rotate", id, "--overlap", "1h"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let now = floodgate_dashboard::time::now_secs();
    for s in [&seeded.secret, &secret] {
        let v = admin::verify_key(&store, s, now).await.unwrap();
        assert_eq!(v.key.map(|k| k.id), Some(seeded.key_id.clone()), "{s}");
    }
    let log = admin::audit_log(&store, 10).await.unwrap();
    let actions: Vec<&str> = log
        .iter()
        .filter(|e| e.user.starts_with("cli:"))
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(actions, ["key.rotate", "key.update", "key.update"]);
    admin::revoke_key(&store, id).await.unwrap();
    let out = cli(&["rotate", id, "--overlap", "0s"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("status"),
        "a revoked key is not rotated"
    );
}

/// The usage calls read what a real edge counted: 12 checkouts by one key (10 a
/// minute per key in the demo configuration) are 10 allowed and 2 throttled,
/// with the last use; with 2 more by another key of its identity, the identity's
/// are 12 allowed and 2 throttled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_what_the_edge_counted_for_the_key_and_its_identity() {
    let s = setup("600/1m").await;
    let api = s.api(&s.token(Scope::Read, "reporting").await.1);
    let write = s.api(&s.token(Scope::Write, "ops").await.1);
    let mut secrets = vec![];
    for _ in 0..2 {
        let made = write
            .create(json!({"plan": "free", "identity": "cus_7"}))
            .await;
        let key = (
            made.body["key"]["id"].as_str().unwrap().to_string(),
            made.body["secret"].as_str().unwrap().to_string(),
        );
        secrets.push(key);
    }
    let upstream = floodgate_tests::upstream::RawUpstream::start().await;
    let edge = start_edge_with(
        EdgeKind::Native,
        &s.redis,
        &upstream.url,
        &EdgeOptions::default(),
    )
    .await;
    let http = reqwest::Client::new();
    let send = |path: &'static str, secret: String| {
        let (http, url) = (http.clone(), edge.url.clone());
        async move {
            http.get(format!("{url}{path}"))
                .bearer_auth(secret)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let mut statuses = vec![];
    for _ in 0..12 {
        statuses.push(send("/v1/checkout", secrets[0].1.clone()).await);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        10,
        "{statuses:?}"
    );
    for _ in 0..2 {
        assert_eq!(send("/v1/items", secrets[1].1.clone()).await, 200);
    }
    let id = &secrets[0].0;
    let path = format!("/api/v1/keys/{id}/usage?minutes=5");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (usage, together) = loop {
        let u = api.get("/api/v1/keys/{id}/usage", &path).await.body;
        let t = api
            .get(
                "/api/v1/identities/{identity}",
                "/api/v1/identities/cus_7?minutes=5",
            )
            .await
            .body;
        if u["allowed"] == 10 && u["throttled"] == 2 && t["allowed"] == 12 {
            break (u, t);
        }
        assert!(std::time::Instant::now() < deadline, "{u} {t}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (usage["degraded"].as_u64(), usage["minutes"].as_i64()),
        (Some(0), Some(5))
    );
    let last = usage["last_used"].as_i64().expect("a last use");
    assert!(
        (last - floodgate_dashboard::time::now_secs()).abs() <= 20,
        "{usage}"
    );
    assert_eq!(
        (
            together["throttled"].as_u64(),
            together["keys"].as_array().unwrap().len()
        ),
        (Some(2), 2),
        "{together}"
    );
}
