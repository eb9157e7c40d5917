//! The workspace's binaries as real processes: found next to the test executable
//! (`cargo build --bins` builds them; `cargo test` builds only the tested
//! package's), run to completion ([`run`]) or kept running ([`Daemon`], killed
//! when dropped, its stderr kept in a file for the test to read).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A binary of this workspace, next to the test executable's directory.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let dir = if dir.ends_with("deps") {
        dir.parent().unwrap()
    } else {
        dir
    };
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build --bins -p floodgate-edge -p floodgate-dashboard --features floodgate-dashboard/ssr)",
        bin.display()
    );
    bin
}

/// `name` with the environment cleared of `FLOODGATE_*` (so the test's own
/// environment never leaks in) plus `env`.
pub fn command(name: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(workspace_binary(name));
    for (k, _) in std::env::vars() {
        if k.starts_with("FLOODGATE_") || k.starts_with("UPSTASH_") {
            c.env_remove(k);
        }
    }
    c.args(args).envs(env.iter().copied());
    c
}

/// Runs `name` to completion (at most 30 s, then it is killed).
pub fn run(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut child = command(name, args, env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name} runs: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{name} {args:?} did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// `name --listen 127.0.0.1:<a free port> args…`, running; the address it
/// listens on (`127.0.0.1:<port>`).
pub fn listening(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Daemon, String) {
    let port = crate::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec!["--listen", listen.as_str()];
    all.extend_from_slice(args);
    (Daemon::start(name, &all, env, port), listen)
}

/// A binary kept running; killed when dropped.
pub struct Daemon {
    child: Child,
    stderr: PathBuf,
}

impl Daemon {
    /// Starts `name` and waits until `port` on loopback accepts connections.
    pub fn start(name: &str, args: &[&str], env: &[(&str, &str)], port: u16) -> Self {
        let stderr = std::env::temp_dir().join(format!(
            "floodgate-{name}-{}-{port}.stderr",
            std::process::id()
        ));
        let file = std::fs::File::create(&stderr).unwrap();
        let mut child = command(name, args, env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("{name} runs: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "{name} exited ({status}) before listening on {port}:\n{}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "{name} listens on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon { child, stderr }
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Sends it `sig` (`TERM`, `KILL`, ...) without waiting.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {} failed", self.child.id());
    }

    /// Waits (bounded) for it to exit: its exit status, or `None` (still running).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops it with SIGTERM (a graceful stop), waits, and returns its stderr.
    pub fn stop(mut self) -> String {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stderr()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}
