//! docs/deploy.md, followed literally. The fenced blocks tagged `sh recipe=worker`,
//! `sh recipe=dashboard` and `sh recipe=native` are run in the document's order, as
//! written, in one `bash -euo pipefail`, against local stand-ins:
//!
//! - the `sh recipe=settings` block is not run: the test exports the same names
//!   (`UPSTASH_REDIS_REST_URL`/`_TOKEN`: a real redis-server behind floodgate-rest;
//!   `ORIGIN`: floodgate-demo-upstream; `API`: the local Worker's URL;
//!   `DASHBOARD_HOST`: Caddy's `localhost:<port>`), and `tests/recipe/standins.sh`
//!   defines `wrangler`, `systemctl` and `apt-get` (what each does instead is
//!   written there and in docs/deploy.md's "How these recipes are tested");
//! - the absolute paths the recipes install to (`/opt/floodgate`, `/etc/floodgate`,
//!   `/etc/systemd/system`, `/etc/caddy`), the well-known ports (`3000`, `8080`,
//!   `9000`) and `$PWD/dist/` are rewritten to a scratch directory and free
//!   loopback ports ([`substitutions`]): in the blocks here, and in the installed
//!   unit files and Caddyfile by the stand-ins (the same `map.sed`);
//! - `scripts/dist` packs the binaries this test runs (`FLOODGATE_DIST_BIN`)
//!   instead of making a release build; between the Worker and dashboard recipes
//!   the tarball is copied to the scratch "host" (for `scp`/`ssh`).
//!
//! Then: the checkout loop ends in 429 through the Worker (`wrangler dev`), the
//! dashboard — reached through Caddy over TLS, signed in with the password the
//! recipe wrote — counts the throttled checkout, and the native edge of the third
//! recipe answers with the key. A changed step that breaks the recipe fails here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use floodgate_tests::docs::repo_root;
use floodgate_tests::process::{Daemon, listening, workspace_binary};
use floodgate_tests::{RedisServer, free_port};
use serde_json::Value;

const TOKEN: &str = "recipe-rest-token";

/// The fenced blocks of `doc` whose info string is `sh recipe=<name>`, in order.
fn recipe_blocks(doc: &str, name: &str) -> Vec<String> {
    let open = format!("```sh recipe={name}");
    let mut blocks = vec![];
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if line.trim_end() == open {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            blocks.push(body.join("\n"));
        }
    }
    blocks
}

/// Scratch directories and ports of one run.
struct Run {
    scratch: PathBuf,
    root: PathBuf,
    api_port: u16,
    caddy_port: u16,
    caddy_http_port: u16,
    dash_port: u16,
    edge_port: u16,
    upstream_port: u16,
}

/// What the recipes name → what this run uses. Applied to the blocks, and by the
/// stand-ins (`map.sed`) to the files the recipes install.
fn substitutions(run: &Run) -> Vec<(String, String)> {
    let root = run.root.display();
    vec![
        (
            "/etc/systemd/system".into(),
            format!("{root}/etc/systemd/system"),
        ),
        ("/etc/floodgate".into(), format!("{root}/etc/floodgate")),
        ("/etc/caddy".into(), format!("{root}/etc/caddy")),
        ("/opt/floodgate".into(), format!("{root}/opt/floodgate")),
        (
            "0.0.0.0:8080".into(),
            format!("127.0.0.1:{}", run.edge_port),
        ),
        (
            "127.0.0.1:8080".into(),
            format!("127.0.0.1:{}", run.edge_port),
        ),
        (
            "127.0.0.1:3000".into(),
            format!("127.0.0.1:{}", run.dash_port),
        ),
        (
            "127.0.0.1:9000".into(),
            format!("127.0.0.1:{}", run.upstream_port),
        ),
        (
            "$PWD/dist/".into(),
            format!("{}/dist/", run.scratch.display()),
        ),
    ]
}

fn apply(text: &str, subs: &[(String, String)]) -> String {
    subs.iter().fold(text.to_string(), |t, (from, to)| {
        t.replace(from.as_str(), to)
    })
}

/// `subs` as a sed script (`s#from#to#g` per line; `$` and `.` escaped).
fn sed_script(subs: &[(String, String)]) -> String {
    subs.iter()
        .map(|(from, to)| {
            let from = from.replace('.', "\\.").replace('$', "\\$");
            format!("s#{from}#{to}#g\n")
        })
        .collect()
}

/// A process started in its own session (`setsid`): its group is ended, and the
/// process reaped, when dropped.
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

/// Ends every process group the stand-ins started, and removes the scratch dir.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(pids) = std::fs::read_to_string(self.0.join("pids")) {
            for pid in pids.lines() {
                let _ = Command::new("kill")
                    .args(["--", &format!("-{pid}")])
                    .status();
            }
        }
        if std::thread::panicking() || std::env::var_os("FLOODGATE_KEEP_RECIPE").is_some() {
            eprintln!(
                "the recipe's scratch directory is kept: {}",
                self.0.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// What a failure needs to be read: whether each process the stand-ins started
/// still runs, and the last lines of each log they wrote.
fn processes(scratch: &Path) -> String {
    let mut out = String::from("the stand-ins' processes:\n");
    for pid in std::fs::read_to_string(scratch.join("pids"))
        .unwrap_or_default()
        .lines()
    {
        let alive = Command::new("kill")
            .args(["-0", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let command = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .replace('\0', " ");
        out.push_str(&format!(
            "  group {pid}: {} {command}\n",
            if alive { "running" } else { "GONE" }
        ));
    }
    let mut logs: Vec<_> = std::fs::read_dir(scratch)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log") && !p.ends_with("recipe.log"));
    logs.sort();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!("--- the last lines of {}:\n", log.display()));
        for line in &lines[lines.len().saturating_sub(12)..] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The script: the stand-ins, the settings, then each recipe's blocks.
fn script(run: &Run, doc: &str, rest_url: &str, origin: &str) -> String {
    let subs = substitutions(run);
    let repo = repo_root();
    let mut s = format!(
        "export RECIPE_SCRATCH='{scratch}' RECIPE_ROOT='{root}' RECIPE_API_PORT={api} \
         RECIPE_CADDY_HTTP_PORT={http} RECIPE_REPO='{repo}'\n\
         . '{repo}/tests/recipe/standins.sh'\n\
         mkdir -p \"$RECIPE_ROOT/etc/systemd/system\" \"$RECIPE_ROOT/etc/caddy\"\n\
         export UPSTASH_REDIS_REST_URL='{rest_url}' UPSTASH_REDIS_REST_TOKEN='{TOKEN}'\n\
         export ORIGIN='{origin}' ROUTE='api.example.com/*' API='http://127.0.0.1:{api}'\n\
         export DASHBOARD_HOST='localhost:{caddy}'\n\
         export FLOODGATE_DIST_BIN='{bin}' FLOODGATE_DIST_DIR='{scratch}/dist'\n\
         cd '{repo}'\n",
        scratch = run.scratch.display(),
        root = run.root.display(),
        api = run.api_port,
        http = run.caddy_http_port,
        caddy = run.caddy_port,
        repo = repo.display(),
        bin = workspace_binary("floodgate-edge")
            .parent()
            .unwrap()
            .display(),
    );
    let mut recipes = 0;
    for (name, before) in [
        ("worker", ""),
        (
            "dashboard",
            "mkdir -p \"$RECIPE_SCRATCH/host\" && cp \"$RECIPE_SCRATCH\"/dist/floodgate-*.tar.gz \"$RECIPE_SCRATCH/host/\" && cd \"$RECIPE_SCRATCH/host\"\n",
        ),
        ("native", ""),
    ] {
        let blocks = recipe_blocks(doc, name);
        assert!(
            !blocks.is_empty(),
            "docs/deploy.md has no `sh recipe={name}` block"
        );
        s.push_str(before);
        for (i, block) in blocks.iter().enumerate() {
            s.push_str(&format!("echo '### recipe {name}, block {}'\n", i + 1));
            s.push_str(&apply(block, &subs));
            s.push('\n');
        }
        recipes += 1;
    }
    assert_eq!(recipes, 3);
    s
}

/// Runs `script` in bash (at most 15 minutes: the Worker may be built on the way);
/// its exit status and output (stdout and stderr, in order).
fn run_bash(script: &str, scratch: &Path) -> (bool, String) {
    let file = scratch.join("recipe.sh");
    std::fs::write(&file, script).unwrap();
    let log = scratch.join("recipe.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail"])
        .arg(&file)
        .env("WRANGLER_SEND_METRICS", "false")
        .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("bash runs");
    let deadline = Instant::now() + Duration::from_secs(900);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (
        status.success(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

/// The checkout loop's output: the 3-digit statuses ending a line (11 of them).
fn status_line(transcript: &str) -> Vec<u16> {
    transcript
        .lines()
        .map(|l| {
            let mut codes: Vec<u16> = l
                .split_whitespace()
                .rev()
                .map_while(|w| w.parse::<u16>().ok().filter(|_| w.len() == 3))
                .collect();
            codes.reverse();
            codes
        })
        .find(|codes| codes.len() == 11)
        .unwrap_or_default()
}

/// A client trusting Caddy's internal CA, as the recipe's `curl` does.
fn tls_client(ca: &Path) -> reqwest::Client {
    let pem = std::fs::read(ca).expect("Caddy's root certificate");
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("a PEM certificate"))
        .build()
        .unwrap()
}

/// Signs in to the dashboard at `url` as `user`: the session cookie and CSRF token.
async fn sign_in(
    http: &reqwest::Client,
    url: &str,
    user: &str,
    password: &str,
) -> (String, String) {
    let res = http
        .post(format!("{url}/api/login"))
        .header("origin", url)
        .form(&[("username", user), ("password", password)])
        .send()
        .await
        .expect("the sign-in form posts through Caddy");
    assert!(
        res.status().is_success() || res.status().is_redirection(),
        "sign-in answered {}",
        res.status()
    );
    let cookie = floodgate_tests::dash::set_cookie(&res, "fg_session").expect("a session cookie");
    let set: Vec<_> = res.headers().get_all("set-cookie").iter().collect();
    assert!(
        set.iter().any(|c| c.to_str().unwrap().contains("Secure")),
        "--secure-cookies: {set:?}"
    );
    let info: Value = http
        .post(format!("{url}/api/session"))
        .header("origin", url)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (
        cookie,
        info["csrf"].as_str().expect("a csrf token").to_string(),
    )
}

/// The throttled count of `endpoint` in the dashboard's traffic data.
fn throttled(traffic: &Value, endpoint: &str) -> u64 {
    traffic["endpoints"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e[0] == endpoint))
        .map_or(0, |e| {
            e[1]["throttled"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .sum()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_and_dashboard_recipes_reach_a_429_and_show_it() {
    let doc = std::fs::read_to_string(repo_root().join("docs/deploy.md")).unwrap();
    let redis = RedisServer::start();
    let (_rest, rest_addr): (Daemon, String) = listening(
        "floodgate-rest",
        &["--redis", &redis.url()],
        &[("FLOODGATE_REST_TOKEN", TOKEN)],
    );
    let (_upstream, upstream_addr) = listening("floodgate-demo-upstream", &[], &[]);
    let scratch = std::env::temp_dir().join(format!("floodgate-recipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let _cleanup = Cleanup(scratch.clone());
    let run = Run {
        root: scratch.join("root"),
        scratch: scratch.clone(),
        api_port: free_port(),
        caddy_port: free_port(),
        caddy_http_port: free_port(),
        dash_port: free_port(),
        edge_port: free_port(),
        upstream_port: upstream_addr.rsplit(':').next().unwrap().parse().unwrap(),
    };
    std::fs::write(scratch.join("map.sed"), sed_script(&substitutions(&run))).unwrap();
    let s = script(
        &run,
        &doc,
        &format!("http://{rest_addr}"),
        &format!("http://{upstream_addr}"),
    );
    let (ok, transcript) = run_bash(&s, &scratch);
    assert!(ok, "the recipes failed; their output:\n{transcript}");

    // the Worker recipe: ten checkouts admitted, the 11th refused, by the Worker
    let codes = status_line(&transcript);
    assert_eq!(
        codes.len(),
        11,
        "the checkout loop's statuses:\n{transcript}"
    );
    assert!(
        codes[..10].iter().all(|c| *c == 200) && codes[10] == 429,
        "ten checkouts admitted, the 11th refused: {codes:?}\n{}",
        processes(&scratch)
    );
    let bundle: Vec<_> = std::fs::read_dir(scratch.join("bundle"))
        .expect("wrangler deploy --dry-run wrote the bundle")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        bundle.iter().any(|f| f.ends_with(".wasm")),
        "the dry run bundled the Worker: {bundle:?}"
    );
    assert!(
        transcript.contains("(stand-in) wrangler tail"),
        "the tail step ran:\n{transcript}"
    );

    // the dashboard recipe: through Caddy over TLS, the first operator, the 429 counted
    let env = std::fs::read_to_string(run.root.join("etc/floodgate/dashboard.env")).unwrap();
    let password = env
        .lines()
        .find_map(|l| l.strip_prefix("FLOODGATE_ADMIN_PASSWORD="))
        .expect("the recipe wrote the first operator's password");
    let url = format!("https://localhost:{}", run.caddy_port);
    let http = tls_client(&scratch.join("caddy/pki/authorities/local/root.crt"));
    let (cookie, csrf) = sign_in(&http, &url, "admin", password).await;
    let api = format!("http://127.0.0.1:{}", run.api_port);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // the Worker flushes its counters when a request comes: one without a key
        let nudge = reqwest::get(format!("{api}/v1/search"))
            .await
            .unwrap_or_else(|e| panic!("the Worker: {e}\n{}", processes(&scratch)));
        assert_eq!(nudge.status(), 401);
        let traffic: Value = http
            .post(format!("{url}/api/traffic"))
            .header("origin", &url)
            .header("cookie", &cookie)
            .header("accept", "application/json")
            .form(&[
                ("range", "15m"),
                ("resolution", "10s"),
                ("csrf", csrf.as_str()),
            ])
            .send()
            .await
            .unwrap_or_else(|e| panic!("the dashboard through Caddy: {e}\n{}", processes(&scratch)))
            .json()
            .await
            .unwrap_or_else(|e| panic!("the dashboard's traffic: {e}\n{}", processes(&scratch)));
        if throttled(&traffic, "route:checkout") >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard never counted the Worker's 429: {traffic}\n{}",
            processes(&scratch)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // the native recipe: the same key through the native edge
    let key = transcript
        .lines()
        .find_map(|l| l.strip_prefix("the first API key: "))
        .expect("the Worker recipe printed the key");
    let res = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/v1/items", run.edge_port))
        .bearer_auth(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("the native edge: {e}\n{}", processes(&scratch)));
    assert_eq!(res.status(), 200, "{}", processes(&scratch));
    assert_eq!(res.headers()["x-ratelimit-limit"], "1000");
    assert!(
        transcript.contains("systemd-analyze verify floodgate-edge.service: clean")
            && transcript.contains("systemd-analyze verify floodgate-dashboard.service: clean"),
        "both units were verified:\n{transcript}"
    );
}

/// Every systemd unit in deploy/ passes `systemd-analyze verify` (its binaries
/// mapped to an existing file: verify checks that ExecStart exists), and
/// deploy/Caddyfile passes `caddy validate`.
#[test]
fn the_units_and_the_caddyfile_in_deploy_are_valid() {
    let dir = std::env::temp_dir().join(format!("floodgate-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut units = 0;
    for entry in std::fs::read_dir(repo_root().join("deploy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "service") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let bin = workspace_binary("floodgate-edge");
        let bin_dir = bin.parent().unwrap().display().to_string();
        let mapped = dir.join(path.file_name().unwrap());
        std::fs::write(&mapped, text.replace("/opt/floodgate/bin", &bin_dir)).unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&mapped)
            .output()
            .expect("systemd-analyze runs (Debian package systemd; scripts/test installs it)");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{}: {said}",
            path.display()
        );
        units += 1;
    }
    assert!(
        units >= 2,
        "deploy/ has the dashboard's and the edge's units"
    );
    let out = Command::new("caddy")
        .args(["validate", "--adapter", "caddyfile", "--config"])
        .arg(repo_root().join("deploy/Caddyfile"))
        .env("HOME", &dir)
        .env("XDG_DATA_HOME", &dir)
        .env("XDG_CONFIG_HOME", &dir)
        .output()
        .expect("caddy runs");
    assert!(
        out.status.success(),
        "deploy/Caddyfile: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scripts/worker dev` works out of the box against a local stack: it writes the
/// missing `.dev.vars` (here `FLOODGATE_DEV_VARS`, a scratch file) with the REST
/// endpoint's port and token, and wrangler dev then serves the Worker from it —
/// a key created in the stack's Redis is admitted, and its upstream is the local one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_worker_dev_serves_the_local_stack_from_dev_vars() {
    let scratch = std::env::temp_dir().join(format!("floodgate-worker-dev-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let _cleanup = Cleanup(scratch.clone());
    std::fs::write(scratch.join("rest-token"), TOKEN).unwrap();
    let redis = RedisServer::start();
    let seeded = floodgate_tests::seed(&redis, floodgate_tests::DEMO_CONFIG).await;
    let (_rest, rest_addr) = listening(
        "floodgate-rest",
        &["--redis", &redis.url()],
        &[("FLOODGATE_REST_TOKEN", TOKEN)],
    );
    let (_upstream, upstream_addr) = listening("floodgate-demo-upstream", &[], &[]);
    let port = free_port();
    let vars = scratch.join(".dev.vars");
    let log = std::fs::File::create(scratch.join("dev.log")).unwrap();
    let child = Command::new("setsid")
        .arg(repo_root().join("scripts/worker"))
        .args(["dev", &port.to_string()])
        .env("FLOODGATE_DEV_VARS", &vars)
        .env("FLOODGATE_REST_TOKEN_FILE", scratch.join("rest-token"))
        .env("FLOODGATE_REST_PORT", rest_addr.rsplit(':').next().unwrap())
        .env(
            "FLOODGATE_UPSTREAM_PORT",
            upstream_addr.rsplit(':').next().unwrap(),
        )
        .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("scripts/worker runs");
    let _dev = Group(child);
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(180);
    let res = loop {
        match reqwest::Client::new()
            .get(format!("{url}/v1/items"))
            .bearer_auth(&seeded.secret)
            .send()
            .await
        {
            Ok(r) => break r,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            Err(e) => panic!(
                "wrangler dev never answered ({e}):\n{}",
                std::fs::read_to_string(scratch.join("dev.log")).unwrap_or_default()
            ),
        }
    };
    let written = std::fs::read_to_string(&vars).expect("scripts/worker dev wrote .dev.vars");
    assert!(
        written.contains(&format!("UPSTASH_REDIS_REST_URL=\"http://{rest_addr}\"")),
        "{written}"
    );
    assert!(
        written.contains(&format!("UPSTASH_REDIS_REST_TOKEN=\"{TOKEN}\"")),
        "{written}"
    );
    assert_eq!(res.status(), 200, "the key of the local stack is admitted");
    assert_eq!(res.headers()["x-ratelimit-limit"], "1000");
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body["path"], "/v1/items",
        "the local demo upstream answered: {body}"
    );
}
