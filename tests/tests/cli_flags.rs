//! Every binary's command line, as an operator meets it (real processes): `--help`
//! lists each flag with its `FLOODGATE_*` variable, `--version` answers, an unknown
//! flag or a bad value is refused naming the flag and the expected form, the
//! environment sets flags, and `floodgate-edge --no-limit` needs no Redis.

use std::time::Duration;

use floodgate_tests::process::{Daemon, listening, run};
use floodgate_tests::{RedisServer, free_port};

const BINARIES: [&str; 5] = [
    "floodgate-edge",
    "floodgate-cli",
    "floodgate-rest",
    "floodgate-demo-upstream",
    "floodgate-dashboard",
];

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn every_binary_has_help_listing_its_environment_variables() {
    for bin in BINARIES {
        let out = run(bin, &["--help"], &[]);
        let help = text(&out.stdout);
        assert!(out.status.success(), "{bin} --help: {out:?}");
        assert!(help.contains("Usage:"), "{bin}:\n{help}");
        assert!(help.contains("[env: FLOODGATE_"), "{bin}:\n{help}");
        // every flag but --help/--version names its variable
        let blocks = flag_blocks(&help);
        assert!(blocks.len() >= 3, "{bin}:\n{help}");
        for (flag, block) in blocks {
            if matches!(flag.as_str(), "help" | "version") {
                continue;
            }
            assert!(
                block.contains("[env: FLOODGATE_"),
                "{bin} --{flag} has no environment variable:\n{block}"
            );
        }
    }
}

/// `--help`'s flags, each with its text (a flag line is indented at most 6).
fn flag_blocks(help: &str) -> Vec<(String, String)> {
    let mut blocks: Vec<(String, String)> = vec![];
    for l in help.lines() {
        let t = l.trim_start();
        let flag = t
            .strip_prefix("-h, --")
            .or_else(|| t.strip_prefix("-V, --"))
            .or_else(|| t.strip_prefix("--"))
            .filter(|_| l.len() - t.len() <= 6);
        match (flag, blocks.last_mut()) {
            (Some(f), _) => blocks.push((
                f.split([' ', '=']).next().unwrap_or_default().to_string(),
                format!("{l}\n"),
            )),
            (None, Some(b)) => {
                b.1.push_str(l);
                b.1.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

#[test]
fn every_binary_answers_version() {
    for bin in BINARIES {
        let out = run(bin, &["--version"], &[]);
        assert!(out.status.success(), "{bin} --version: {out:?}");
        assert_eq!(
            text(&out.stdout).trim(),
            format!("{bin} {}", env!("CARGO_PKG_VERSION")),
            "{bin}"
        );
    }
}

#[test]
fn an_unknown_flag_is_refused_by_name() {
    for bin in BINARIES {
        let out = run(bin, &["--colour", "blue"], &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin}: {err}");
        assert!(
            err.contains("unexpected argument '--colour'"),
            "{bin}: {err}"
        );
        assert!(err.contains("--help"), "{bin} points at --help: {err}");
    }
}

/// A bad value names the flag (or argument) and the form it expects.
#[test]
fn a_bad_value_names_the_flag_and_the_expected_form() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "floodgate-edge",
            &["--upstream", "localhost:9000"],
            &["--upstream", "http:// or https:// URL"],
        ),
        (
            "floodgate-edge",
            &["--upstream", "http://u", "--deadline-ms", "0"],
            &["--deadline-ms", "1.."],
        ),
        (
            "floodgate-edge",
            &["--upstream", "http://u", "--lease-lifetime-ms", "50"],
            &["--lease-lifetime-ms", "100..=60000"],
        ),
        (
            "floodgate-edge",
            &["--upstream", "http://u", "--log-format", "xml"],
            &["--log-format", "text", "json"],
        ),
        (
            "floodgate-rest",
            &["--pool", "none"],
            &["--pool", "invalid digit"],
        ),
        (
            "floodgate-rest",
            &["--listen", "8079"],
            &["--listen", "127.0.0.1:8080"],
        ),
        (
            "floodgate-dashboard",
            &["--trusted-proxy", "10.0.0.0/99"],
            &["--trusted-proxy", "CIDR"],
        ),
        (
            "floodgate-dashboard",
            &["--edge-url", "edge.example:8787"],
            &["--edge-url", "http:// or https:// URL"],
        ),
        (
            "floodgate-demo-upstream",
            &["--listen", "anywhere"],
            &["--listen", "address and port"],
        ),
        (
            "floodgate-cli",
            &["check", "fg:k", "ten/1m"],
            &["LIMIT/PERIOD", "1000/1m"],
        ),
        (
            "floodgate-cli",
            &["config", "set", "c.json", "--force", "--based-on", "v"],
            &["--force", "--based-on"],
        ),
        ("floodgate-cli", &["key", "create"], &["--plan"]),
    ];
    for (bin, args, expected) in cases {
        let out = run(bin, args, &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin} {args:?}: {err}");
        for e in *expected {
            assert!(
                err.contains(e),
                "{bin} {args:?} should mention {e:?}: {err}"
            );
        }
    }
}

/// Values from the environment are checked like flags, and named by their flag.
#[test]
fn the_environment_sets_flags() {
    let out = run(
        "floodgate-rest",
        &[],
        &[("FLOODGATE_REST_POOL", "0"), ("FLOODGATE_REST_TOKEN", "t")],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--pool"), "{err}");

    // a working one: the CLI reaches the Redis FLOODGATE_REDIS names
    let redis = RedisServer::start();
    let url = redis.url();
    let out = run(
        "floodgate-cli",
        &["key", "list"],
        &[("FLOODGATE_REDIS", &url)],
    );
    assert!(out.status.success(), "{out:?}");
    let out = run(
        "floodgate-cli",
        &["key", "list"],
        &[("FLOODGATE_REDIS", "redis://127.0.0.1:1/")],
    );
    assert!(!out.status.success(), "port 1 has no Redis: {out:?}");
    assert!(text(&out.stderr).contains("127.0.0.1:1"), "{out:?}");

    // and a listener: the demo upstream on the port its variable names
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let demo = Daemon::start(
        "floodgate-demo-upstream",
        &[],
        &[("FLOODGATE_DEMO_LISTEN", &listen)],
        port,
    );
    drop(demo);
}

/// The CLI's store flags go before or after the command.
#[test]
fn the_cli_takes_store_flags_anywhere() {
    let redis = RedisServer::start();
    let url = redis.url();
    for args in [
        vec!["--redis", url.as_str(), "key", "list"],
        vec!["key", "list", "--redis", url.as_str()],
    ] {
        let out = run("floodgate-cli", &args, &[]);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
}

/// `--no-limit` proxies without a store: nothing listens at the Redis URL, and
/// the edge starts and forwards anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_without_limits_needs_no_redis() {
    let (_upstream, up_listen) = listening("floodgate-demo-upstream", &[], &[]);
    let upstream = format!("http://{up_listen}");
    let (edge, listen) = listening(
        "floodgate-edge",
        &[
            "--upstream",
            &upstream,
            "--redis",
            "redis://127.0.0.1:1/",
            "--no-limit",
        ],
        &[],
    );
    let client = reqwest::Client::new();
    let r = client
        .get(format!("http://{listen}/v1/anything"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", edge.stderr());
    let echo: serde_json::Value = r.json().await.unwrap();
    assert_eq!(echo["path"], "/v1/anything", "{echo}");
    let log = edge.stop();
    assert!(log.contains("limiter OFF"), "{log}");
    assert!(!log.contains("127.0.0.1:1"), "no store is named: {log}");
}
