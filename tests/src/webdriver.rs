//! A small W3C WebDriver client for Debian's chromedriver + headless Chromium: just
//! what the dashboard's browser tests need (navigate, find, type, click, read,
//! screenshot). Chromium runs with `--no-sandbox --disable-gpu
//! --disable-background-networking`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    http: reqwest::Client,
    base: String,
    /// chromedriver's port and the session id, to end the session on drop.
    port: u16,
    session: String,
    quit: bool,
    _driver: tokio::process::Child,
    artifacts: PathBuf,
}

impl Drop for Browser {
    /// A test that panics never reaches `quit`: end the session here (with a
    /// blocking request, bounded), so chromedriver closes Chromium before it is
    /// killed and no browser outlives the test.
    fn drop(&mut self) {
        if self.quit {
            return;
        }
        use std::io::{Read, Write};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        if let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let req = format!(
                "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                self.session, self.port
            );
            if s.write_all(req.as_bytes()).is_ok() {
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink);
            }
        }
    }
}

fn find_binary(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.push("/usr/lib/chromium".into());
    dirs.push("/usr/bin".into());
    names
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

impl Browser {
    /// Starts chromedriver on a free loopback port and opens a headless session.
    /// Screenshots go to `target/test-artifacts/<artifacts>/`.
    pub async fn start(artifacts: &str) -> Self {
        Self::start_with(artifacts, true).await
    }

    /// As [`Browser::start`], with JavaScript on or off (pages then work as plain
    /// HTML: links and form posts).
    pub async fn start_with(artifacts: &str, javascript: bool) -> Self {
        let driver_bin = find_binary(&["chromedriver"]).expect(
            "chromedriver is installed (apt-get install chromium-driver; scripts/test does)",
        );
        let chrome = find_binary(&["chromium", "chromium-browser", "chrome"])
            .expect("chromium is installed (apt-get install chromium; scripts/test does)");
        let port = crate::free_port();
        let driver = tokio::process::Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not answer in 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let prefs = if javascript {
            json!({})
        } else {
            json!({"profile.managed_default_content_settings.javascript": 2})
        };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": chrome,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-background-networking", "--disable-dev-shm-usage",
                         "--window-size=1280,1600", "--no-first-run"],
                "prefs": prefs
            }
        }}});
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("create a session")
            .json()
            .await
            .expect("session JSON");
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_string();
        let artifacts_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-artifacts")
            .join(artifacts);
        std::fs::create_dir_all(&artifacts_dir).expect("create the artifacts directory");
        Browser {
            http,
            base: format!("{base}/session/{session}"),
            port,
            session,
            quit: false,
            _driver: driver,
            artifacts: artifacts_dir,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req
            .send()
            .await
            .expect("webdriver call")
            .json()
            .await
            .expect("webdriver JSON");
        v["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        let v = self
            .call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
        assert!(v.is_null(), "navigate to {url}: {v}");
    }

    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The first element matching `css`, if any.
    pub async fn find(&self, css: &str) -> Option<String> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v[ELEMENT].as_str().map(str::to_string)
    }

    /// Waits (bounded) for an element matching `css`.
    pub async fn wait_for(&self, css: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.find(css).await {
                return e;
            }
            if Instant::now() > deadline {
                self.screenshot(&format!(
                    "timeout-{}",
                    css.replace(|c: char| !c.is_alphanumeric(), "_")
                ))
                .await;
                panic!(
                    "no element {css:?} within {timeout:?} on {}",
                    self.url().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns its value.
    pub async fn exec(&self, script: &str, args: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Runs `script` asynchronously: it gets its arguments and, last, a callback to
    /// call with its value.
    pub async fn exec_async(&self, script: &str, args: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/async",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Sends a Chrome DevTools Protocol command.
    pub async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            "/goog/cdp/execute",
            Some(json!({"cmd": cmd, "params": params})),
        )
        .await
    }

    /// The browser console's messages since the last call (`LEVEL message` lines).
    pub async fn console(&self) -> Vec<String> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({"type": "browser"})),
            )
            .await;
        v.as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| {
                        format!(
                            "{} {}",
                            e["level"].as_str().unwrap_or(""),
                            e["message"].as_str().unwrap_or("")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Lets pages of `origin` write (and the test read) the clipboard.
    pub async fn grant_clipboard(&self, origin: &str) {
        let v = self
            .cdp(
                "Browser.grantPermissions",
                json!({"origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]}),
            )
            .await;
        assert!(v.is_object() || v.is_null(), "grant the clipboard: {v}");
    }

    /// Runs axe-core (from `tests/node/node_modules`) on the current page and
    /// returns its serious and critical violations as `rule: target…` lines.
    pub async fn axe(&self) -> Vec<String> {
        let source =
            std::fs::read_to_string(crate::node_modules().join("node_modules/axe-core/axe.min.js"))
                .expect("axe-core is installed (cd tests/node && npm ci; scripts/test does)");
        let loaded = self
            .exec(&format!("{source}\n;return typeof axe;"), json!([]))
            .await;
        assert_eq!(loaded, "object", "axe-core loads into the page");
        let result = self
            .exec_async(
                "const done = arguments[arguments.length - 1];\
                 axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations\
                   .filter(v => v.impact === 'serious' || v.impact === 'critical')\
                   .map(v => v.id + ' (' + v.impact + '): ' + v.help + ' — ' +\
                        v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(' | '))))\
                 .catch(e => done(['axe failed: ' + e]));",
                json!([]),
            )
            .await;
        result
            .as_array()
            .unwrap_or_else(|| panic!("axe answered {result}"))
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Waits (bounded) until `script` returns true.
    pub async fn wait_until(&self, what: &str, script: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.exec(script, json!([])).await != Value::Bool(true) {
            if Instant::now() > deadline {
                self.screenshot(&format!("timeout-{}", what.replace(' ', "-")))
                    .await;
                panic!("{what}: not true within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn click(&self, element: &str) {
        let v = self
            .call(
                reqwest::Method::POST,
                &format!("/element/{element}/click"),
                Some(json!({})),
            )
            .await;
        assert!(v.is_null(), "click: {v}");
    }

    /// Replaces an input's text.
    pub async fn fill(&self, element: &str, text: &str) {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/clear"),
            Some(json!({})),
        )
        .await;
        let v = self
            .call(
                reqwest::Method::POST,
                &format!("/element/{element}/value"),
                Some(json!({ "text": text })),
            )
            .await;
        assert!(v.is_null(), "type: {v}");
    }

    pub async fn text(&self, element: &str) -> String {
        self.call(
            reqwest::Method::GET,
            &format!("/element/{element}/text"),
            None,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    pub async fn attr(&self, element: &str, name: &str) -> Option<String> {
        self.call(
            reqwest::Method::GET,
            &format!("/element/{element}/attribute/{name}"),
            None,
        )
        .await
        .as_str()
        .map(str::to_string)
    }

    /// Saves a PNG screenshot as a test artifact; returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine;
        let v = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap_or_default();
        let path = self.artifacts.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }

    /// Renders pages as with `prefers-color-scheme: dark` (or light).
    pub async fn color_scheme(&self, dark: bool) {
        let v = self
            .call(
                reqwest::Method::POST,
                "/goog/cdp/execute",
                Some(json!({"cmd": "Emulation.setEmulatedMedia", "params": {"features": [
                    {"name": "prefers-color-scheme", "value": if dark { "dark" } else { "light" }}
                ]}})),
            )
            .await;
        assert!(
            v.is_object() || v.is_null(),
            "emulate the color scheme: {v}"
        );
    }

    /// Ends the session (Chromium exits); chromedriver is killed on drop.
    pub async fn quit(mut self) {
        let _ = self.http.delete(&self.base).send().await;
        self.quit = true;
    }
}
