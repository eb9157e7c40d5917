//! `scripts/bench instructions`: the native edge's own instructions per request
//! (valgrind's callgrind), limiter on and off, under the edge section's load
//! (`wrk -c64`, the bench's one-policy configuration, the demo upstream). A meter
//! that does not move with the machine's speed: on a shared VM the throughput
//! ratios of the edge section move by ±0.1 from run to run, instructions by
//! ~1 %. It counts user-space instructions only (the kernel's share of a request,
//! ~40 % of the edge's CPU, is not in it) and runs the edge ~50× slower, so its
//! store calls batch more than at full speed: a ratio between builds, not a
//! time. The deadline floor is raised so that slowness never meets it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use floodgate_tests::RedisServer;

use super::{BENCH_CONFIG, Proc, demo_upstream, edge_args, on_cpu0, wait_port, wrk};

/// One edge under callgrind: instructions per request and requests measured.
struct Counted {
    per_request: f64,
    requests: f64,
    non_2xx: f64,
}

pub fn run(server: &RedisServer, rt: &tokio::runtime::Runtime, scale: usize) {
    let have = |tool: &str, arg: &str| Command::new(tool).arg(arg).output().is_ok();
    if !(have("valgrind", "--version") && have("callgrind_control", "--version")) {
        println!("\n## The edge's instructions per request: valgrind is not installed (skipped)");
        return;
    }
    if !have("wrk", "--version") {
        println!("\n## The edge's instructions per request: wrk is not installed (skipped)");
        return;
    }
    let secret = rt
        .block_on(floodgate_tests::seed(server, BENCH_CONFIG))
        .secret;
    let (upstream, _) = demo_upstream();
    let secs = if scale > 1 { 2.0 } else { 4.0 };
    println!(
        "\n## The edge's own instructions per request (callgrind, wrk -c64 for {secs} s after a 2 s warm-up)"
    );
    let on = count(&upstream.url, &server.url(), &secret, &[], secs);
    let off = count(&upstream.url, &server.url(), &secret, &["--no-limit"], secs);
    println!("| edge | instructions/request | ÷ limiter off | requests counted | non-2xx |");
    println!("|---|---|---|---|---|");
    for (name, c) in [("limiter on", &on), ("limiter off", &off)] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.0} | {:.0} |",
            c.per_request,
            c.per_request / off.per_request,
            c.requests,
            c.non_2xx
        );
    }
    println!(
        "| **the limiter's own** | **{:.0}** | | | |",
        on.per_request - off.per_request
    );
}

/// Starts the edge under callgrind (on CPU 0 when taskset is there), warms it up,
/// zeroes the counts, loads it for `secs` and reads the dump.
fn count(upstream: &str, redis: &str, secret: &str, extra: &[&str], secs: f64) -> Counted {
    let port = floodgate_tests::free_port();
    let dir = std::env::temp_dir().join(format!("floodgate-callgrind-{port}"));
    std::fs::create_dir_all(&dir).expect("a scratch dir");
    let edge = std::env::current_exe()
        .unwrap()
        .with_file_name("floodgate-edge");
    let listen = format!("127.0.0.1:{port}");
    let child = on_cpu0("valgrind")
        .arg("--tool=callgrind")
        .arg(format!(
            "--callgrind-out-file={}",
            dir.join("cg.out").display()
        ))
        .arg(&edge)
        .args(edge_args(&listen, upstream, redis))
        .args([
            "--deadline-floor-ms",
            "200",
            "--deadline-ceiling-ms",
            "2000",
            // polling while a call is out runs for as long as the reply takes: the
            // machine's speed, which this meter leaves out
            "--idle-poll-us",
            "0",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("valgrind runs floodgate-edge (scripts/bench builds it)");
    let proc = Proc(child);
    wait_port(port);
    let url = format!("http://127.0.0.1:{port}");
    wrk(&url, secret, 64, 2.0);
    control(proc.0.id(), "-z");
    let (rate, non_2xx) = wrk(&url, secret, 64, secs);
    control(proc.0.id(), "-d");
    // wrk's -d is whole seconds (ceil), its rate over what it measured
    let requests = rate * secs.ceil();
    let total = newest_total(&dir);
    drop(proc);
    let _ = std::fs::remove_dir_all(&dir);
    Counted {
        per_request: total / requests.max(1.0),
        requests,
        non_2xx,
    }
}

/// `callgrind_control <what> <pid>`: `-z` zeroes the counts, `-d` dumps them.
fn control(pid: u32, what: &str) {
    let ok = Command::new("callgrind_control")
        .args([what, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "callgrind_control {what} {pid} failed");
}

/// The instructions (`summary:`) of the newest dump in `dir` (a dump is written
/// as `cg.out.<n>`; wait for it a little).
fn newest_total(dir: &Path) -> f64 {
    for _ in 0..100 {
        let newest: Option<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("cg.out."))
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .map(|e| e.path());
        let summary = newest
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("summary:"))
                    .and_then(|n| n.trim().parse().ok())
            });
        if let Some(n) = summary {
            return n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("callgrind wrote no dump in {}", dir.display());
}
