//! `floodgate-cli` (`src/bin/floodgate-cli.rs` runs [`run`]): administer what the
//! edge reads from Redis, and poke buckets.
//!
//! ```text
//! floodgate-cli [STORE] config set <file | -> [--based-on VERSION | --force]
//! floodgate-cli [STORE] config show              the JSON on stdout, its version on stderr
//! floodgate-cli [STORE] key create --plan <plan> [--owner <text>]   prints the secret ONCE
//! floodgate-cli [STORE] key list
//! floodgate-cli [STORE] key revoke <id>
//! floodgate-cli [STORE] audit [count]            the newest audit records
//! floodgate-cli [STORE] deny add|remove <list> <value>   list: key_id, ip, country, user_agent
//! floodgate-cli [STORE] deny list [<list>]
//! floodgate-cli [STORE] check <bucket key> <limit>/<period> [cost]
//! floodgate-cli [STORE] show  <bucket key> <limit>/<period>
//!
//! STORE: [--redis URL] [--redis-ca-file PEM] (or --rest-url URL)
//! ```
//! The URL is any store URL (`redis://`, `rediss://user:password@host:port`,
//! `redis+sentinel://`, `redis+cluster://`, or the `https://` REST URL with its
//! token in `FLOODGATE_REST_TOKEN` or `UPSTASH_REDIS_REST_TOKEN`); it defaults to
//! `$FLOODGATE_REDIS_URL` or `redis://127.0.0.1:6379/`. The CA file defaults to
//! `$FLOODGATE_REDIS_CA_FILE`.
//!
//! `config set` is the dashboard's save: validated, version-checked and audited.
//! With nothing stored it stores; with a configuration stored it needs the
//! version it replaces (`--based-on`, printed by `config show`), or `--force`
//! (still audited, with what it replaced). `check` runs the token-bucket script
//! once and prints the decision as the edge would answer it; `show` prints the
//! bucket's stored state in the reference layout without consuming anything.

use std::path::PathBuf;
use std::time::Duration;

use crate::admin::{self, AdminError, Basis, DenyEdit};
use crate::store::{NativeStore, Store, StoreError, StoreOptions};
use floodgate_shared::audit::AuditEntry;
use floodgate_shared::contract::Answer;
use floodgate_shared::deny::{DenyList, UnknownList};
use floodgate_shared::policy::{PolicyError, Quota};
use floodgate_shared::script::Check;

pub const USAGE: &str =
    "usage: floodgate-cli [STORE] config set <file | -> [--based-on VERSION | --force]
       floodgate-cli [STORE] config show
       floodgate-cli [STORE] key create --plan <plan> [--owner <text>]
       floodgate-cli [STORE] key list
       floodgate-cli [STORE] key revoke <id>
       floodgate-cli [STORE] audit [count]
       floodgate-cli [STORE] deny add|remove <key_id|ip|country|user_agent> <value>
       floodgate-cli [STORE] deny list [key_id|ip|country|user_agent]
       floodgate-cli [STORE] check <bucket key> <limit>/<period> [cost]
       floodgate-cli [STORE] show  <bucket key> <limit>/<period>
STORE: [--redis URL | --rest-url URL] [--redis-ca-file PEM]
URL defaults to $FLOODGATE_REDIS_URL or redis://127.0.0.1:6379/; the CA file to
$FLOODGATE_REDIS_CA_FILE; a REST URL's token comes from $FLOODGATE_REST_TOKEN.";

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{USAGE}")]
    Usage,
    #[error("{0}")]
    Admin(#[from] AdminError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(#[from] PolicyError),
    #[error("{path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{0}")]
    Refused(String),
}

/// Takes the store flags off the front of `args`.
fn store_options(args: &mut Vec<String>) -> Result<StoreOptions, CliError> {
    let url =
        std::env::var("FLOODGATE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let mut options = StoreOptions::from_env(url, Duration::from_secs(5));
    while let Some(flag) = args.first().cloned() {
        match flag.as_str() {
            "--redis" | "--rest-url" | "--redis-ca-file" => {
                if args.len() < 2 {
                    return Err(CliError::Usage);
                }
                let value = args.remove(1);
                args.remove(0);
                match flag.as_str() {
                    "--redis-ca-file" => options.ca_file = Some(PathBuf::from(value)),
                    _ => options.url = value,
                }
            }
            _ => break,
        }
    }
    Ok(options)
}

/// Runs one command line (without the program name), printing what the command
/// prints. Starts its own runtime: call it outside any.
pub fn run(mut args: Vec<String>) -> Result<(), CliError> {
    let options = store_options(&mut args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Refused(e.to_string()))?;
    rt.block_on(async {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if !matches!(
            args.first(),
            Some(&("config" | "key" | "audit" | "deny" | "check" | "show"))
        ) {
            return Err(CliError::Usage);
        }
        let store = NativeStore::connect(&options).await?;
        match args.as_slice() {
            ["config", ..] | ["key", ..] | ["audit", ..] => admin_command(&store, &args).await,
            ["deny", ..] => deny_command(&store, &args).await,
            _ => bucket_command(&store, &args).await,
        }
    })
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Who the audit log names for this command: `cli:<login>`.
fn who() -> String {
    let login = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("cli:{login}")
}

async fn admin_command(store: &NativeStore, args: &[&str]) -> Result<(), CliError> {
    match args {
        ["config", "set", file, flags @ ..] => {
            let basis = match flags {
                [] => Basis::Unversioned,
                ["--force"] => Basis::Force,
                ["--based-on", v] => Basis::Version(v.to_string()),
                _ => return Err(CliError::Usage),
            };
            let text = if *file == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|error| {
                    CliError::Read {
                        path: "stdin".into(),
                        error,
                    }
                })?;
                s
            } else {
                std::fs::read_to_string(file).map_err(|error| CliError::Read {
                    path: file.to_string(),
                    error,
                })?
            };
            let (c, version) =
                admin::replace_config(store, &text, basis, &who(), now_secs()).await?;
            println!(
                "stored: {} policies, {} plans, {} routes (version {version})",
                c.spec().policies.len(),
                c.spec().plans.len(),
                c.spec().routes.len()
            );
        }
        ["config", "show"] => match admin::load_config(store).await? {
            (version, Some(text)) => {
                eprintln!("version: {version}");
                println!("{text}");
            }
            (_, None) => return Err(CliError::Refused("no configuration is stored".into())),
        },
        ["key", "create", rest @ ..] => {
            let (mut plan, mut owner) = (None, String::new());
            let mut it = rest.iter();
            while let Some(flag) = it.next() {
                match (*flag, it.next()) {
                    ("--plan", Some(v)) => plan = Some(*v),
                    ("--owner", Some(v)) => owner = v.to_string(),
                    _ => return Err(CliError::Usage),
                }
            }
            let plan = plan.ok_or_else(|| CliError::Refused("key create needs --plan".into()))?;
            let (record, secret) = admin::create_key(store, &owner, plan, now_secs()).await?;
            admin::audit(
                store,
                &AuditEntry {
                    at: now_secs(),
                    user: who(),
                    action: "key.create".into(),
                    target: record.id.clone(),
                    before: None,
                    after: Some(record.to_json()),
                },
            )
            .await?;
            eprintln!(
                "created key {} (plan {}); the secret is shown this once:",
                record.id, record.plan
            );
            println!("{secret}");
        }
        ["key", "list"] => {
            for r in admin::list_keys(store).await? {
                println!("{}\t{:?}\t{}\t{}", r.id, r.status, r.plan, r.owner);
            }
        }
        ["key", "revoke", id] => {
            let r = admin::revoke_key(store, id).await?;
            admin::audit(
                store,
                &AuditEntry {
                    at: now_secs(),
                    user: who(),
                    action: "key.revoke".into(),
                    target: r.id.clone(),
                    before: None,
                    after: Some(r.to_json()),
                },
            )
            .await?;
            println!("revoked {}", r.id);
        }
        ["audit", rest @ ..] => {
            let count = match rest {
                [] => 20,
                [n] => n.parse().map_err(|_| CliError::Usage)?,
                _ => return Err(CliError::Usage),
            };
            for e in admin::audit_log(store, count).await? {
                println!("{}\t{}\t{}\t{}", e.at, e.user, e.action, e.target);
            }
        }
        _ => return Err(CliError::Usage),
    }
    Ok(())
}

fn deny_list(name: &str) -> Result<DenyList, CliError> {
    name.parse()
        .map_err(|e: UnknownList| CliError::Refused(e.to_string()))
}

/// `deny add|remove <list> <value>` (the audited, version-checked save) and
/// `deny list [<list>]` (one `<list>\t<entry>` line each).
async fn deny_command(store: &NativeStore, args: &[&str]) -> Result<(), CliError> {
    match args {
        ["deny", op @ ("add" | "remove"), list, value] => {
            let list = deny_list(list)?;
            let edit = if *op == "add" {
                DenyEdit::Add
            } else {
                DenyEdit::Remove
            };
            let (c, version) =
                admin::edit_deny(store, list, edit, value, &who(), now_secs()).await?;
            println!(
                "{} list: {} entries (version {version})",
                list,
                c.spec().deny.list(list).len()
            );
        }
        ["deny", "list", rest @ ..] => {
            let lists = match rest {
                [] => DenyList::ALL.to_vec(),
                [one] => vec![deny_list(one)?],
                _ => return Err(CliError::Usage),
            };
            let text = admin::get_config(store)
                .await?
                .ok_or_else(|| CliError::Refused("no configuration is stored".into()))?;
            let config = floodgate_shared::config::EdgeConfig::from_json(&text)?;
            for list in lists {
                for entry in config.spec().deny.list(list) {
                    println!("{list}\t{entry}");
                }
            }
        }
        _ => return Err(CliError::Usage),
    }
    Ok(())
}

async fn bucket_command(store: &NativeStore, args: &[&str]) -> Result<(), CliError> {
    let (command, key, quota, cost) = match args {
        [c @ ("check" | "show"), k, q] => (*c, *k, *q, None),
        ["check", k, q, cost] => ("check", *k, *q, Some(*cost)),
        _ => return Err(CliError::Usage),
    };
    let quota = Quota::parse_short(quota)?;
    let cost: u32 = match cost {
        Some(c) => c
            .parse()
            .map_err(|_| CliError::Refused(format!("cost must be a whole number, got {c:?}")))?,
        None if command == "show" => 0,
        None => 1,
    };
    let verdict = store.check(&[Check::new(key, &quota, cost)], None).await?;
    let d = verdict.decisions[0];
    if command == "show" {
        let view = floodgate_shared::BucketState { full_at: d.full_at }.view(&quota, verdict.now);
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
}
