//! `floodgate-cli`: administer what the edge reads from Redis, and poke buckets.
//!
//! ```text
//! floodgate-cli [--redis URL] config set <file | ->     validate and store the configuration
//! floodgate-cli [--redis URL] config show
//! floodgate-cli [--redis URL] key create --plan <plan> [--owner <text>]   prints the secret ONCE
//! floodgate-cli [--redis URL] key list
//! floodgate-cli [--redis URL] key revoke <id>
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

const USAGE: &str = "usage: floodgate-cli [--redis URL] config set <file | ->
       floodgate-cli [--redis URL] config show
       floodgate-cli [--redis URL] key create --plan <plan> [--owner <text>]
       floodgate-cli [--redis URL] key list
       floodgate-cli [--redis URL] key revoke <id>
       floodgate-cli [--redis URL] check <bucket key> <limit>/<period> [cost]
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
    if matches!(args.first().map(String::as_str), Some("config" | "key")) {
        return admin(url, args);
    }
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
                    shadow: false,
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

fn admin(url: &str, args: &[String]) -> Result<(), String> {
    use floodgate_edge::admin;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let store = RespStore::connect(url, Duration::from_secs(5))
            .await
            .map_err(|e| e.to_string())?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match args.as_slice() {
            ["config", "set", file] => {
                let text = if *file == "-" {
                    let mut s = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                        .map_err(|e| e.to_string())?;
                    s
                } else {
                    std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?
                };
                let c = admin::set_config(&store, &text)
                    .await
                    .map_err(|e| e.to_string())?;
                println!(
                    "stored: {} policies, {} plans, {} routes",
                    c.spec().policies.len(),
                    c.spec().plans.len(),
                    c.spec().routes.len()
                );
            }
            ["config", "show"] => {
                match admin::get_config(&store).await.map_err(|e| e.to_string())? {
                    Some(c) => println!("{c}"),
                    None => return Err("no configuration is stored".into()),
                }
            }
            ["key", "create", rest @ ..] => {
                let (mut plan, mut owner) = (None, String::new());
                let mut it = rest.iter();
                while let Some(flag) = it.next() {
                    match (*flag, it.next()) {
                        ("--plan", Some(v)) => plan = Some(*v),
                        ("--owner", Some(v)) => owner = v.to_string(),
                        _ => return Err(USAGE.to_string()),
                    }
                }
                let plan = plan.ok_or("key create needs --plan")?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64);
                let (record, secret) = admin::create_key(&store, &owner, plan, now)
                    .await
                    .map_err(|e| e.to_string())?;
                eprintln!(
                    "created key {} (plan {}); the secret is shown this once:",
                    record.id, record.plan
                );
                println!("{secret}");
            }
            ["key", "list"] => {
                for r in admin::list_keys(&store).await.map_err(|e| e.to_string())? {
                    println!("{}\t{:?}\t{}\t{}", r.id, r.status, r.plan, r.owner);
                }
            }
            ["key", "revoke", id] => {
                let r = admin::revoke_key(&store, id)
                    .await
                    .map_err(|e| e.to_string())?;
                println!("revoked {}", r.id);
            }
            _ => return Err(USAGE.to_string()),
        }
        Ok(())
    })
}
