//! `floodgate-cli`: check or show one bucket against a Redis server.
//!
//! ```text
//! floodgate-cli [--redis URL] check <bucket key> <limit>/<period> [cost]
//! floodgate-cli [--redis URL] show  <bucket key> <limit>/<period>
//! ```
//! `check` runs the token-bucket script once and prints the decision as the edge
//! would answer it (status and headers); `show` prints the bucket's stored state in
//! the reference layout (tokens, last_refill) without consuming anything.

use std::process::ExitCode;
use std::time::Duration;

use floodgate_edge::store::BucketStore;
use floodgate_edge::store::resp::RespStore;
use floodgate_shared::contract::Answer;
use floodgate_shared::policy::Quota;
use floodgate_shared::script::Check;

const USAGE: &str = "usage: floodgate-cli [--redis URL] check <bucket key> <limit>/<period> [cost]
       floodgate-cli [--redis URL] show  <bucket key> <limit>/<period>
URL defaults to $FLOODGATE_REDIS_URL or redis://127.0.0.1:6379/";

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut url =
        std::env::var("FLOODGATE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    if args.first().map(String::as_str) == Some("--redis") {
        if args.len() < 2 {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
        url = args.remove(1);
        args.remove(0);
    }
    match run(&url, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floodgate-cli: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(url: &str, args: &[String]) -> Result<(), String> {
    let (command, key, quota, cost) = match args {
        [c, k, q] => (c.as_str(), k, q, None),
        [c, k, q, cost] if c == "check" => (c.as_str(), k, q, Some(cost)),
        _ => return Err(USAGE.to_string()),
    };
    let quota = Quota::parse_short(quota).map_err(|e| e.to_string())?;
    let cost: u32 = match cost {
        Some(c) => c
            .parse()
            .map_err(|_| format!("cost must be a whole number, got {c:?}"))?,
        None if command == "show" => 0,
        None => 1,
    };
    if command != "check" && command != "show" {
        return Err(USAGE.to_string());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let store = RespStore::connect(url, Duration::from_secs(2))
            .await
            .map_err(|e| e.to_string())?;
        let verdict = store
            .check(
                &[Check {
                    key,
                    quota: &quota,
                    cost,
                }],
                None,
            )
            .await
            .map_err(|e| e.to_string())?;
        let d = verdict.decisions[0];
        if command == "show" {
            let view =
                floodgate_shared::BucketState { full_at: d.full_at }.view(&quota, verdict.now);
            println!("key:         {key}");
            println!("tokens:      {:.3} of {}", view.tokens, quota.capacity());
            println!(
                "last_refill: {} (µs since the Unix epoch, Redis TIME)",
                view.last_refill
            );
            println!(
                "full_at:     {} ({} µs from now)",
                d.full_at,
                (d.full_at - verdict.now).max(0)
            );
            return Ok(());
        }
        match Answer::for_decision(&d) {
            Answer::Forward { headers } => {
                println!("HTTP 200 (forwarded upstream)");
                for (k, v) in headers.pairs() {
                    println!("{k}: {v}");
                }
            }
            Answer::Reject {
                status,
                headers,
                content_type,
                body,
            } => {
                println!("HTTP {status} Too Many Requests");
                for (k, v) in headers.pairs() {
                    println!("{k}: {v}");
                }
                println!("Content-Type: {content_type}\n\n{body}");
            }
        }
        Ok(())
    })
}
