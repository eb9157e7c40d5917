//! Test harness: real `redis-server` processes on free loopback ports, started by
//! the tests themselves and killed when dropped. Nothing assumes a running Redis.

pub mod cluster;
pub mod dash;
pub mod docs;
pub mod faulty;
pub mod gateway;
pub mod http;
pub mod process;
pub mod scale;
pub mod silent;
pub mod tls;
pub mod upstream;
pub mod webdriver;

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` owned by a test.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    /// The default user's password (`--requirepass`), when set.
    password: Option<String>,
}

/// A port that was free a moment ago (the kernel's pick for an ephemeral bind).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("bind an ephemeral loopback port")
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    /// Starts a throwaway server: loopback only, no persistence.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--maxmemory", "1mb"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_pinned(None, extra)
    }

    /// Starts a server, optionally pinned to one CPU with `taskset` (benchmarks).
    pub fn start_pinned(cpu: Option<usize>, extra: &[&str]) -> Self {
        Self::launch(cpu, None, extra)
    }

    /// Starts a server on a given port (e.g. to restart one a client knows).
    pub fn start_on(port: u16, extra: &[&str]) -> Self {
        Self::launch(None, Some(port), extra)
    }

    fn launch(cpu: Option<usize>, fixed_port: Option<u16>, extra: &[&str]) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = fixed_port.unwrap_or_else(free_port);
            let dir =
                std::env::temp_dir().join(format!("floodgate-redis-{port}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create a scratch dir");
            let args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
            let password = args
                .iter()
                .position(|a| a == "--requirepass")
                .and_then(|i| args.get(i + 1))
                .cloned();
            let child = spawn_redis(cpu, port, &dir, &args);
            let mut server = RedisServer {
                child,
                port,
                dir,
                args,
                password,
            };
            if server.wait_ready(Duration::from_secs(10)) {
                return server;
            }
            last_error = format!("redis-server on port {port} did not become ready");
            drop(server);
        }
        panic!("{last_error}");
    }

    /// Sends a signal (`"KILL"`, `"STOP"`, `"CONT"`, `"TERM"`) to the server.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -{sig} {} failed", self.child.id());
    }

    /// Waits (bounded) for the process to exit, e.g. after `signal("KILL")`.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Starts the server again on the same port, in the same directory and with
    /// the same arguments (so an append-only file is replayed). The old process
    /// must have exited.
    pub fn restart(&mut self) {
        assert!(
            self.wait_exit(Duration::from_secs(10)),
            "the old redis-server is still running"
        );
        self.child = spawn_redis(None, self.port, &self.dir, &self.args);
        assert!(
            self.wait_ready(Duration::from_secs(10)),
            "redis-server did not restart on port {}",
            self.port
        );
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: most likely the port was taken meanwhile
            }
            if answers_ping(self.port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The scratch directory the server runs in (its unix socket can live here).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// `redis://127.0.0.1:port/`, with the password when the server requires one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}/", self.port),
            None => format!("redis://127.0.0.1:{}/", self.port),
        }
    }

    /// Starts a server whose default user requires `password` (replicas of it
    /// authenticate with the same one).
    pub fn start_with_password(password: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--requirepass", password, "--masterauth", password];
        args.extend_from_slice(extra);
        Self::start_with(&args)
    }

    /// A plain blocking connection for assertions.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .expect("connect to the test redis")
    }

    /// The OS process id (fault tests send it signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

fn spawn_redis(cpu: Option<usize>, port: u16, dir: &std::path::Path, extra: &[String]) -> Child {
    let mut cmd = match cpu {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", &c.to_string(), "redis-server"]);
            cmd
        }
        None => Command::new("redis-server"),
    };
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .args(["--dir", dir.to_str().unwrap(), "--protected-mode", "yes"])
    .args(extra)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            panic!("cannot start redis-server ({e}); the test command installs it (scripts/test)")
        }
    }
}

/// A Redis Sentinel (`redis-server <conf> --sentinel`) on a free loopback port,
/// monitoring one primary as `master` with quorum 1. Killed when dropped.
pub struct Sentinel {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// The Sentinel's own password (`requirepass` in its config), when set.
    password: Option<String>,
}

impl Sentinel {
    /// `down_after_ms`: how long the primary must be silent to be judged down.
    pub fn start(master: &str, primary_port: u16, down_after_ms: u64) -> Self {
        Self::start_with_auth(master, primary_port, down_after_ms, None, None)
    }

    /// A Sentinel that talks to a primary requiring `primary_password`
    /// (`sentinel auth-pass`) and requires `own_password` of its clients.
    pub fn start_with_auth(
        master: &str,
        primary_port: u16,
        down_after_ms: u64,
        primary_password: Option<&str>,
        own_password: Option<&str>,
    ) -> Self {
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir()
                .join(format!("floodgate-sentinel-{port}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create a scratch dir");
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                     sentinel monitor {master} 127.0.0.1 {primary_port} 1\n\
                     sentinel down-after-milliseconds {master} {down_after_ms}\n\
                     sentinel failover-timeout {master} 5000\n\
                     sentinel parallel-syncs {master} 1\n{auth}{own}",
                    dir = dir.display(),
                    auth = primary_password
                        .map(|p| format!("sentinel auth-pass {master} {p}\n"))
                        .unwrap_or_default(),
                    own = own_password
                        .map(|p| format!("requirepass {p}\n"))
                        .unwrap_or_default(),
                ),
            )
            .expect("write sentinel.conf");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel starts");
            let mut s = Sentinel {
                child,
                port,
                dir,
                password: own_password.map(str::to_string),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = s.child.try_wait() {
                    break;
                }
                if answers_ping(port) {
                    return s;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(s);
        }
        panic!("redis-sentinel did not start");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The Sentinel's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default()
    }

    fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}/", self.port),
            None => format!("redis://127.0.0.1:{}/", self.port),
        }
    }

    /// The primary's port as this Sentinel reports it now.
    pub fn primary_port(&self, master: &str) -> Option<u16> {
        let mut c = redis::Client::open(self.url())
            .ok()?
            .get_connection()
            .ok()?;
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query(&mut c)
            .ok()?;
        addr.get(1)?.parse().ok()
    }

    /// How many replicas this Sentinel knows for `master`.
    pub fn replicas(&self, master: &str) -> usize {
        let Ok(client) = redis::Client::open(self.url()) else {
            return 0;
        };
        let Ok(mut c) = client.get_connection() else {
            return 0;
        };
        redis::cmd("SENTINEL")
            .arg("replicas")
            .arg(master)
            .query::<Vec<redis::Value>>(&mut c)
            .map(|v| v.len())
            .unwrap_or(0)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a RESP server answers `PING` on `port` at all (`+PONG`, or an error such
/// as `-NOAUTH` from a password-protected server: it is up either way).
fn answers_ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 64];
    s.write_all(b"PING\r\n").is_ok()
        && matches!(s.read(&mut buf), Ok(n) if n > 0 && (buf[0] == b'+' || buf[0] == b'-'))
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A key name unique within one test process.
pub fn unique_key(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("fg:{{t:{prefix}-{}}}:p", N.fetch_add(1, Ordering::Relaxed))
}

/// A `floodgate-rest` endpoint served in-process (on the calling tokio runtime) in
/// front of a test Redis, on a free loopback port. Stops when dropped.
pub struct Endpoint {
    pub url: String,
    pub token: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Endpoint {
    pub async fn start(redis: &RedisServer, token: &str) -> Self {
        Self::start_with(floodgate_rest::EndpointConfig::new(redis.url(), token)).await
    }

    pub async fn start_with(config: floodgate_rest::EndpointConfig) -> Self {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind loopback");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let router = floodgate_rest::router(&config)
            .await
            .expect("endpoint connects to redis");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = config.clone();
        tokio::spawn(async move {
            let stop = async {
                let _ = stopped.await;
            };
            floodgate_rest::serve(listener, router, &serving, stop)
                .await
                .expect("endpoint serves")
        });
        Endpoint {
            url,
            token: config.token,
            stop: Some(stop),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// `tests/node` with its npm packages installed (`npm ci` on first use).
pub fn node_modules() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("node");
    if !dir.join("node_modules/@upstash/redis").exists()
        || !dir.join("node_modules/axe-core").exists()
    {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .status()
            .expect("npm runs (Node.js is a prerequisite)");
        assert!(status.success(), "npm ci in {} failed", dir.display());
    }
    dir
}

/// A command's words as the byte slices `Store::command` takes.
pub fn args<'a>(words: &[&'a str]) -> Vec<&'a [u8]> {
    words.iter().map(|w| w.as_bytes()).collect()
}

/// Commands' words as `Store::pipeline` takes them.
pub fn commands(cmds: &[&[&str]]) -> Vec<Vec<Vec<u8>>> {
    cmds.iter()
        .map(|c| c.iter().map(|w| w.as_bytes().to_vec()).collect())
        .collect()
}

/// A Python with the packages of `tests/python/requirements.txt` (Python's
/// official Upstash SDK), in a virtualenv under `target/` made on first use, as
/// `npm ci` does for `tests/node`. Returns the virtualenv's `python`.
pub fn python_env() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    python_venv(
        &root.join("python/requirements.txt"),
        &root.join("../target/python-conformance"),
    )
}

/// A Python with `openapi-spec-validator` (`tests/python/openapi-requirements.txt`),
/// in a virtualenv under `~/.cache/floodgate/` (beside the other tools) made on
/// first use. Returns the virtualenv's `python`.
pub fn openapi_validator_env() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    python_venv(
        &root.join("python/openapi-requirements.txt"),
        &home.join(".cache/floodgate/openapi-validator"),
    )
}

/// A virtualenv at `venv` with the packages of `requirements`, made (or made
/// again) when its stamp does not hold those requirements. Returns its `python`.
pub fn python_venv(requirements: &std::path::Path, venv: &std::path::Path) -> PathBuf {
    let python = venv.join("bin/python");
    let stamp = venv.join("installed.txt");
    let wanted = std::fs::read_to_string(requirements)
        .unwrap_or_else(|e| panic!("{}: {e}", requirements.display()));
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) && python.exists() {
        return python;
    }
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(venv),
        "python3 -m venv (Debian: python3-venv; scripts/test installs it)",
    );
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(requirements),
        &format!("pip install -r {}", requirements.display()),
    );
    std::fs::write(&stamp, wanted).expect("write the stamp");
    python
}

/// Hex SHA-1, as Redis names scripts.
pub fn sha1_hex(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

/// The demo configuration of the edge tests and the run command: 1,000/min per key,
/// `/v1/search` 100/min and `/v1/checkout` 10/min per key (independent buckets).
pub const DEMO_CONFIG: &str = include_str!("../../config/demo.json");

/// Serves a router in-process on a free loopback port (with peer addresses), until
/// the returned guard is dropped. Returns the base URL.
pub async fn serve(router: axum::Router) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let app = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    });
    (url, stop)
}

/// Serves a native edge host in-process on a free loopback port until the returned
/// guard is dropped. Returns the base URL.
pub async fn serve_native(
    pipeline: floodgate_edge::pipeline::Pipeline<
        floodgate_edge::native_host::NativeStore,
        floodgate_shared::time::SystemClock,
    >,
    config: floodgate_edge::native_host::HostConfig,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let host = floodgate_edge::native_host::Host::new(pipeline, config).expect("a valid host");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = floodgate_edge::native_host::serve(listener, host, async {
            let _ = stopped.await;
        })
        .await;
    });
    (url, stop)
}

/// serve.mjs and its workerd: stopped by closing stdin, then waited for briefly.
struct WorkerProcess(Option<tokio::process::Child>);

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        drop(child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.start_kill();
    }
}

/// Runs each listed case (an `async fn(EdgeKind)`) against the native host and
/// against the Worker, as `<case>::native` and `<case>::worker`.
#[macro_export]
macro_rules! on_both_hosts {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn native() {
                super::$case($crate::EdgeKind::Native).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn worker() {
                super::$case($crate::EdgeKind::Worker).await
            }
        }
    )*};
}

/// A configuration and one API key of plan `free`, stored in `redis`.
pub struct Seeded {
    pub secret: String,
    pub key_id: String,
}

/// Stores `config` in `redis` and creates one key of plan `free`.
pub async fn seed(redis: &RedisServer, config: &str) -> Seeded {
    let store =
        floodgate_edge::store::resp::RespStore::connect(&redis.url(), Duration::from_secs(2))
            .await
            .expect("connect to the test redis");
    floodgate_edge::admin::set_config(&store, config)
        .await
        .expect("a valid configuration");
    let (record, secret) =
        floodgate_edge::admin::create_key(&store, "tests", "free", 1_764_000_000)
            .await
            .expect("a key is created");
    Seeded {
        secret,
        key_id: record.id,
    }
}

/// The native host in-process over any store (`rediss://`, Cluster, REST), in
/// front of `upstream`.
pub async fn start_native_edge(
    store: floodgate_edge::store::NativeStore,
    upstream: &str,
    cache_ttl_ms: i64,
) -> EdgeInstance {
    use floodgate_edge::native_host::HostConfig;
    use floodgate_edge::pipeline::{Pipeline, PipelineConfig};
    let settings = PipelineConfig {
        cache_ttl: cache_ttl_ms * 1000,
        ..PipelineConfig::default()
    };
    let pipeline = Pipeline::new(store, floodgate_shared::time::SystemClock, settings);
    let (url, stop) = serve_native(pipeline, HostConfig::new(upstream)).await;
    EdgeInstance {
        url,
        _guards: vec![Box::new(stop)],
    }
}

/// What the edges counted in `field` over every statistics minute in `redis`
/// (every instance's counts added up, as the dashboard reads them).
pub fn stats_counted(redis: &RedisServer, field: &str) -> u64 {
    let mut c = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("fg:stats:*").query(&mut c).unwrap();
    keys.iter()
        .map(|k| {
            let pairs: Vec<(Vec<u8>, Vec<u8>)> =
                redis::cmd("HGETALL").arg(k).query(&mut c).unwrap();
            let minute = floodgate_shared::stats::Minute::read(pairs);
            minute.0.minute.get(field).copied().unwrap_or(0)
        })
        .sum()
}

/// Which host of the edge pipeline a test drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeKind {
    /// `floodgate_edge::native_host` in-process, over RESP.
    Native,
    /// The built Cloudflare Worker in workerd (Miniflare), over an in-process
    /// `floodgate-rest` endpoint: the production path.
    Worker,
}

/// A running edge; stops (and kills its processes) when dropped.
pub struct EdgeInstance {
    pub url: String,
    _guards: Vec<Box<dyn std::any::Any + Send>>,
}

/// How a test edge is set up (both hosts take the same knobs).
#[derive(Debug, Clone)]
pub struct EdgeOptions {
    pub cache_ttl_ms: i64,
    /// The store deadline (`--deadline-ms` / `DEADLINE_MS`); the host's default when
    /// `None`. Tests that are not about deadlines use 2 s, so a busy machine never
    /// turns a slow answer into a failure mode.
    pub deadline_ms: Option<u64>,
    /// How long the upstream may take to answer (`UPSTREAM_TIMEOUT_MS` in the Worker).
    pub upstream_timeout_ms: u64,
    /// More of the Worker's variables (serve.mjs binds them all).
    pub worker_env: Vec<(String, String)>,
    /// How often the edge writes its statistics (`--stats-flush-ms` /
    /// `STATS_FLUSH_MS`): tests read counts back within a second, the edge's
    /// default is 10 s.
    pub stats_flush_ms: u64,
}

impl Default for EdgeOptions {
    fn default() -> Self {
        Self {
            cache_ttl_ms: 5_000,
            deadline_ms: Some(2_000),
            upstream_timeout_ms: 30_000,
            worker_env: vec![],
            stats_flush_ms: 250,
        }
    }
}

/// `clients` concurrent clients, each with its own `make()` client: client i
/// sends `each` GETs of `/v1/items/{i}/{j}` one after another to
/// `edges[i % edges.len()]` with `secrets[(i / edges.len()) % secrets.len()]`.
/// The answers that were 200, all clients together.
pub async fn admitted_across(
    make: fn() -> reqwest::Client,
    edges: &[String],
    secrets: &[String],
    clients: usize,
    each: usize,
) -> u32 {
    let mut tasks = vec![];
    for i in 0..clients {
        let edge = edges[i % edges.len()].clone();
        let secret = secrets[(i / edges.len()) % secrets.len()].clone();
        tasks.push(tokio::spawn(async move {
            let c = make();
            let mut ok = 0;
            for j in 0..each {
                let r = c
                    .get(format!("{edge}/v1/items/{i}/{j}"))
                    .bearer_auth(&secret)
                    .send()
                    .await
                    .unwrap();
                ok += u32::from(r.status() == reqwest::StatusCode::OK);
            }
            ok
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    admitted
}

/// Starts an edge of `kind` in front of `upstream`, reading config, keys and buckets
/// from `redis`.
pub async fn start_edge(
    kind: EdgeKind,
    redis: &RedisServer,
    upstream: &str,
    cache_ttl_ms: i64,
) -> EdgeInstance {
    let options = EdgeOptions {
        cache_ttl_ms,
        ..EdgeOptions::default()
    };
    start_edge_with(kind, redis, upstream, &options).await
}

/// Starts an edge of `kind` with `options`.
pub async fn start_edge_with(
    kind: EdgeKind,
    redis: &RedisServer,
    upstream: &str,
    options: &EdgeOptions,
) -> EdgeInstance {
    use floodgate_edge::native_host::{HostConfig, NativeStore};
    use floodgate_edge::pipeline::{Pipeline, PipelineConfig, store_deadline};
    use floodgate_edge::settings::{EdgeSettings, Protocol};
    match kind {
        EdgeKind::Native => {
            // the Worker's variables, parsed by the same code the Worker parses
            // them with: both hosts get the same settings from the same test
            let vars: serde_json::Value = serde_json::from_str(&worker_vars(options)).unwrap();
            let lookup = |name: &str| {
                let var = vars.get(name).and_then(|v| v.as_str()).map(str::to_string);
                var.or_else(|| (name == "CACHE_TTL_MS").then(|| options.cache_ttl_ms.to_string()))
            };
            let edge = EdgeSettings::from_lookup(lookup).expect("the edge's settings");
            let settings: PipelineConfig = edge.pipeline(Protocol::Resp);
            let deadline = settings.deadline;
            let store = floodgate_edge::store::resp::RespStore::connect(
                &redis.url(),
                store_deadline(Duration::from_micros(deadline.ceiling as u64)),
            )
            .await
            .expect("connect to redis");
            let pipeline = Pipeline::new(
                NativeStore::Resp(store),
                floodgate_shared::time::SystemClock,
                settings,
            );
            let mut host = HostConfig::new(upstream);
            host.rules = edge.rules(upstream);
            let (url, stop) = serve_native(pipeline, host).await;
            EdgeInstance {
                url,
                _guards: vec![Box::new(stop)],
            }
        }
        EdgeKind::Worker => {
            let token = "worker-test-token";
            let endpoint = Endpoint::start(redis, token).await;
            let worker = start_worker(&endpoint.url, token, upstream, options).await;
            EdgeInstance {
                url: worker.url.clone(),
                _guards: vec![Box::new(worker), Box::new(endpoint)],
            }
        }
    }
}

/// The Worker's optional variables of `options`, as serve.mjs takes them (one
/// JSON object).
fn worker_vars(options: &EdgeOptions) -> String {
    let mut vars = serde_json::Map::new();
    let upstream = options.upstream_timeout_ms.to_string();
    vars.insert("UPSTREAM_TIMEOUT_MS".into(), upstream.into());
    let flush = options.stats_flush_ms.to_string();
    vars.insert("STATS_FLUSH_MS".into(), flush.into());
    if let Some(ms) = options.deadline_ms {
        vars.insert("DEADLINE_MS".into(), ms.to_string().into());
    }
    for (k, v) in &options.worker_env {
        vars.insert(k.clone(), v.clone().into());
    }
    serde_json::Value::Object(vars).to_string()
}

/// The built Worker in workerd (serve.mjs), against the REST endpoint at `rest_url`;
/// stops when dropped.
pub struct WorkerInstance {
    pub url: String,
    /// Where the Worker's console lines (its JSON logs) are copied as they come.
    pub console: PathBuf,
    _process: WorkerProcess,
}

/// Starts the built Worker in workerd in front of `upstream`.
pub async fn start_worker(
    rest_url: &str,
    token: &str,
    upstream: &str,
    options: &EdgeOptions,
) -> WorkerInstance {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../edge/worker");
    assert!(
        dir.join("build/index.js").exists() && dir.join("node_modules/miniflare").exists(),
        "the Worker is not built: run scripts/worker build (scripts/test does)"
    );
    let port = free_port();
    // workerd logs every client disconnect as an error: keep its stderr in a file
    let log = std::env::temp_dir().join(format!("floodgate-workerd-{port}.log"));
    let log_file = std::fs::File::create(&log).expect("create the workerd log");
    let mut command = tokio::process::Command::new(dir.join("node_modules/.bin/node"));
    command
        .arg("serve.mjs")
        .current_dir(&dir)
        .env("PORT", port.to_string())
        .env("UPSTREAM_URL", upstream)
        .env("UPSTASH_REDIS_REST_URL", rest_url)
        .env("UPSTASH_REDIS_REST_TOKEN", token)
        .env("CACHE_TTL_MS", options.cache_ttl_ms.to_string())
        .env("WORKER_VARS", worker_vars(options))
        .env("STOP_ON_STDIN_EOF", "1");
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .expect("node runs serve.mjs");
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("workerd starts within 60 s")
        .expect("read serve.mjs output");
    assert!(
        ready.as_deref().is_some_and(|l| l.starts_with("ready")),
        "serve.mjs said {ready:?}; see {}",
        log.display()
    );
    // the Worker's console (breaker transitions) goes to stdout: keep reading it,
    // or node dies of EPIPE at the first line
    let console = log.with_extension("console.log");
    let console_path = console.clone();
    tokio::spawn(async move {
        let mut out = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            out.push_str(&line);
            out.push('\n');
            let _ = std::fs::write(&console, &out);
        }
    });
    // dropping the guard closes serve.mjs's stdin: it disposes workerd, then exits
    WorkerInstance {
        url: format!("http://127.0.0.1:{port}"),
        console: console_path,
        _process: WorkerProcess(Some(child)),
    }
}

/// Runs `floodgate-cli` with `args` through its library entry point, outside the
/// test's runtime (it starts its own): what the command returned, as text.
pub async fn cli(args: Vec<String>) -> Result<(), String> {
    tokio::task::spawn_blocking(move || floodgate_edge::cli::run(args).map_err(|e| e.to_string()))
        .await
        .expect("floodgate-cli ran to its end")
}
