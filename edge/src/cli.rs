//! `floodgate-cli` (`src/bin/floodgate-cli.rs` runs [`Cli`] through [`execute`]):
//! administer what the edge reads from Redis, and poke buckets. `--help` lists
//! every command and flag; each flag can also be set by the environment variable
//! named there.
//!
//! ```text
//! floodgate-cli [STORE] config set <file | -> [--based-on VERSION | --force]
//! floodgate-cli [STORE] config show              the JSON on stdout, its version on stderr
//! floodgate-cli [STORE] key create --plan <plan> [--owner <text>]   prints the secret ONCE
//!                      [--expires-at <RFC 3339 | Unix s> | --expires-in <duration>]
//!                      [--identity <id>] [--name <label>] [--metadata <JSON object>]
//!                      [--credits <JSON: {"remaining": N, "refill": {...}}>]
//! floodgate-cli [STORE] key update <id> [--plan P] [--owner T] [--name N] [--identity I]
//!                      [--metadata JSON] [--expires-at T | --expires-in D] [--clear FIELD]...
//! floodgate-cli [STORE] key rotate <id> --overlap <duration>     prints the new secret ONCE
//! floodgate-cli [STORE] key list
//! floodgate-cli [STORE] key revoke <id>
//! floodgate-cli [STORE] token create --scope read|write --name <text>   the admin API's; prints it ONCE
//! floodgate-cli [STORE] token list
//! floodgate-cli [STORE] token revoke <id>
//! floodgate-cli [STORE] identity override <identity> [--plan P] [--policy NAME]...
//! floodgate-cli [STORE] identity clear|show <identity>
//! floodgate-cli [STORE] audit [count]            the newest audit records (UTC)
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
//! `$FLOODGATE_REDIS` or `redis://127.0.0.1:6379/`. The CA file defaults to
//! `$FLOODGATE_REDIS_CA_FILE`.
//!
//! `config set` is the dashboard's save: validated, version-checked and audited.
//! With nothing stored it stores; with a configuration stored it needs the
//! version it replaces (`--based-on`, printed by `config show`), or `--force`
//! (still audited, with what it replaced). `check` runs the token-bucket script
//! once and prints the decision as the edge would answer it; `show` prints the
//! bucket's stored state in the reference layout without consuming anything.

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::admin::{self, AdminError, Basis, DenyEdit};
use crate::args::StoreArgs;
use crate::store::{NativeStore, Store, StoreError};
use crate::{identities, tokens};
use floodgate_shared::adminapi::Scope;
use floodgate_shared::audit::AuditEntry;
use floodgate_shared::config::IdentityOverride;
use floodgate_shared::contract::Answer;
use floodgate_shared::deny::{DenyList, UnknownList};
use floodgate_shared::keychanges::{CreditsInput, KeyChanges};
use floodgate_shared::policy::{Period, PolicyError, Quota};
use floodgate_shared::script::Check;
use floodgate_shared::time::MICROS_PER_SEC;

/// Administer Floodgate's configuration, API keys and buckets in its store.
#[derive(Debug, Parser)]
#[command(name = "floodgate-cli", version)]
pub struct Cli {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The limits configuration (the edge's policies, plans and routes).
    #[command(subcommand)]
    Config(ConfigCommand),
    /// API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Tokens of the admin HTTP API (/api/v1/…, served by floodgate-dashboard).
    #[command(subcommand)]
    Token(TokenCommand),
    /// What replaces the plans of one identity's keys (the configuration's
    /// identity_overrides; the admin API's /identities/{identity}/overrides).
    #[command(subcommand)]
    Identity(IdentityCommand),
    /// Prints the newest audit records (time in UTC, who, action, target).
    Audit {
        /// How many records.
        #[arg(default_value_t = 20)]
        count: usize,
    },
    /// Deny lists: API key ids, IPs and CIDR ranges, countries, user agents
    /// (saved with the configuration: version-checked and audited).
    #[command(subcommand)]
    Deny(DenyCommand),
    /// Runs the token-bucket script once on a bucket and prints the edge's answer.
    Check {
        /// The bucket's Redis key.
        key: String,
        /// The quota, like 1000/1m or 10/s.
        #[arg(value_name = "LIMIT/PERIOD", value_parser = quota)]
        quota: Quota,
        /// Tokens the request costs.
        #[arg(default_value_t = 1)]
        cost: u32,
    },
    /// Prints a bucket's stored state without consuming anything.
    Show {
        /// The bucket's Redis key.
        key: String,
        /// The quota, like 1000/1m or 10/s.
        #[arg(value_name = "LIMIT/PERIOD", value_parser = quota)]
        quota: Quota,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validates and stores a configuration (JSON file, or - for stdin), version
    /// checked and audited like the dashboard's save.
    Set {
        /// The JSON file, or - for stdin.
        file: String,
        /// The version this configuration replaces (printed by `config show`).
        #[arg(long, value_name = "VERSION", conflicts_with = "force")]
        based_on: Option<String>,
        /// Replace whatever is stored (still audited, with what it replaced).
        #[arg(long)]
        force: bool,
    },
    /// Prints the stored configuration (its version on stderr).
    Show,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Creates an API key and prints its secret, once.
    Create {
        /// The plan the key is on.
        #[arg(long)]
        plan: String,
        /// Who the key is for (free text).
        #[arg(long, default_value = "")]
        owner: String,
        /// When the key stops working (401 "API key expired"): RFC 3339
        /// (2027-01-01T00:00:00Z) or Unix seconds; must be in the future.
        #[arg(long, value_name = "TIME", value_parser = instant, conflicts_with = "expires_in")]
        expires_at: Option<i64>,
        /// How long from now the key works: a duration like 90m, 12h or 30d.
        #[arg(long, value_name = "DURATION", value_parser = span)]
        expires_in: Option<i64>,
        /// The customer the key belongs to (your external id): its keys share
        /// the buckets of `identity` policies; sent upstream as X-Floodgate-Identity.
        #[arg(long, value_name = "ID")]
        identity: Option<String>,
        /// A label for the key ("production", "CI").
        #[arg(long)]
        name: Option<String>,
        /// A JSON object (at most 1 KB) sent upstream as X-Floodgate-Key-Meta.
        #[arg(long, value_name = "JSON", value_parser = json_value)]
        metadata: Option<serde_json::Value>,
        /// Remaining uses, spent one per request (429 "Usage limit exceeded" when
        /// none are left), optionally refilled at 00:00 UTC: {"remaining": 1000,
        /// "refill": {"amount": 1000, "interval": "monthly", "day": 1}}.
        #[arg(long, value_name = "JSON", value_parser = credits_input)]
        credits: Option<CreditsInput>,
    },
    /// Changes a key's fields (the admin API's update): each checked before
    /// anything is stored; a concurrent change of another field is kept.
    Update {
        /// The key's id.
        id: String,
        /// A plan of the stored configuration.
        #[arg(long)]
        plan: Option<String>,
        /// Who the key is for (free text).
        #[arg(long)]
        owner: Option<String>,
        /// A label for the key.
        #[arg(long)]
        name: Option<String>,
        /// The customer the key belongs to (your external id).
        #[arg(long, value_name = "ID")]
        identity: Option<String>,
        /// A JSON object (at most 1 KB) sent upstream as X-Floodgate-Key-Meta.
        #[arg(long, value_name = "JSON", value_parser = json_value)]
        metadata: Option<serde_json::Value>,
        /// When the key stops working: RFC 3339 or Unix seconds, in the future.
        #[arg(long, value_name = "TIME", value_parser = instant, conflicts_with = "expires_in")]
        expires_at: Option<i64>,
        /// How long from now the key works: a duration like 90m, 12h or 30d.
        #[arg(long, value_name = "DURATION", value_parser = span)]
        expires_in: Option<i64>,
        /// Removes a field: name, identity, metadata or expires_at (repeatable).
        #[arg(long, value_name = "FIELD", value_parser = ["name", "identity", "metadata", "expires_at"])]
        clear: Vec<String>,
    },
    /// Gives a key a new secret (printed once); the replaced one keeps working
    /// for the overlap. The key keeps its id, identity and buckets.
    Rotate {
        /// The key's id.
        id: String,
        /// How long the replaced secret keeps working: 0s to 30d, like 1h.
        #[arg(long, value_name = "DURATION", value_parser = span)]
        overlap: i64,
    },
    /// Lists the API keys (id, status, plan, created in UTC, owner).
    List,
    /// Revokes an API key.
    Revoke {
        /// The key's id.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Creates an admin API token and prints it, once.
    Create {
        /// read (get, list, verify keys) or write (everything).
        #[arg(long, value_parser = scope)]
        scope: Scope,
        /// What the token is for ("billing backend").
        #[arg(long)]
        name: String,
    },
    /// Lists the tokens (id, status, scope, created in UTC, name).
    List,
    /// Revokes a token: refused from its next request on.
    Revoke {
        /// The token's id.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum IdentityCommand {
    /// Sets (or replaces) an identity's override: a plan in place of each of its
    /// keys' own, and/or per-key policies in place of the plan's (a key's own
    /// override still comes first). The identity must be held by some key.
    /// Validated, version-checked and audited like every configuration save.
    Override {
        /// The identity (the operator's external id of the customer).
        identity: String,
        /// A plan of the configuration.
        #[arg(long)]
        plan: Option<String>,
        /// A policy keyed by api_key or identity (repeatable, in order).
        #[arg(long = "policy")]
        policies: Vec<String>,
    },
    /// Removes an identity's override: its keys are back on their own plans.
    Clear {
        /// The identity.
        identity: String,
    },
    /// Prints an identity's override (plan, policies) and its keys.
    Show {
        /// The identity.
        identity: String,
    },
}

fn scope(v: &str) -> Result<Scope, String> {
    v.parse()
}

#[derive(Debug, Subcommand)]
enum DenyCommand {
    /// Adds an entry to a list.
    Add {
        /// key_id, ip, country or user_agent.
        #[arg(value_parser = deny_list)]
        list: DenyList,
        /// The entry: a key id, an IP or CIDR range, an ISO 3166 code, a substring.
        value: String,
    },
    /// Removes an entry from a list.
    Remove {
        /// key_id, ip, country or user_agent.
        #[arg(value_parser = deny_list)]
        list: DenyList,
        value: String,
    },
    /// Prints the lists' entries, one `<list>\t<entry>` line each.
    List {
        /// Only this list.
        #[arg(value_parser = deny_list)]
        list: Option<DenyList>,
    },
}

fn deny_list(name: &str) -> Result<DenyList, String> {
    name.parse().map_err(|e: UnknownList| e.to_string())
}

fn quota(v: &str) -> Result<Quota, String> {
    Quota::parse_short(v).map_err(|e| format!("{e} (expected LIMIT/PERIOD, like 1000/1m)"))
}

/// An instant as `--expires-at` takes it: RFC 3339, or Unix seconds.
fn instant(v: &str) -> Result<i64, String> {
    if let Ok(secs) = v.parse::<i64>() {
        return Ok(secs);
    }
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.timestamp())
        .map_err(|e| format!("{e} (expected RFC 3339, like 2027-01-01T00:00:00Z, or Unix seconds)"))
}

/// JSON as `--metadata` takes it (whether it is an object within the bound is
/// the record's rule, checked with the other fields).
fn json_value(v: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(v).map_err(|e| format!("not JSON: {e}"))
}

/// Credits as `--credits` takes them (their bounds are the record's rules,
/// checked with the other fields).
fn credits_input(v: &str) -> Result<CreditsInput, String> {
    serde_json::from_str(v).map_err(|e| format!("not credits JSON: {e}"))
}

/// Whole seconds of a duration as `--expires-in` takes it (`90m`, `30d`).
fn span(v: &str) -> Result<i64, String> {
    let period = Period::parse(v)?;
    Ok(period.0.div_euclid(MICROS_PER_SEC))
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line does not parse (clap's message: the flag and the form).
    #[error("{0}")]
    Usage(String),
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

/// Parses one command line (without the program name) and runs it, printing what
/// the command prints. Starts its own runtime: call it outside any.
pub fn run(args: Vec<String>) -> Result<(), CliError> {
    let cli = Cli::try_parse_from(std::iter::once("floodgate-cli".to_string()).chain(args))
        .map_err(|e| CliError::Usage(e.to_string()))?;
    execute(cli)
}

/// Runs a parsed command line. Starts its own runtime: call it outside any.
pub fn execute(cli: Cli) -> Result<(), CliError> {
    let options = cli.store.options(Duration::from_secs(5));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Refused(e.to_string()))?;
    rt.block_on(async {
        let store = NativeStore::connect(&options).await?;
        match cli.command {
            Command::Config(c) => config_command(&store, c).await,
            Command::Key(k) => key_command(&store, k).await,
            Command::Token(t) => token_command(&store, t).await,
            Command::Identity(i) => identity_command(&store, i).await,
            Command::Audit { count } => audit_command(&store, count).await,
            Command::Deny(d) => deny_command(&store, d).await,
            Command::Check { key, quota, cost } => {
                bucket_command(&store, &key, &quota, cost, false).await
            }
            Command::Show { key, quota } => bucket_command(&store, &key, &quota, 0, true).await,
        }
    })
}

fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Who the audit log names for this command: `cli:<login>`.
fn who() -> String {
    let login = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("cli:{login}")
}

async fn config_command(store: &NativeStore, command: ConfigCommand) -> Result<(), CliError> {
    match command {
        ConfigCommand::Set {
            file,
            based_on,
            force,
        } => {
            let basis = match (based_on, force) {
                (Some(v), _) => Basis::Version(v),
                (None, true) => Basis::Force,
                (None, false) => Basis::Unversioned,
            };
            let text = if file == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|error| {
                    CliError::Read {
                        path: "stdin".into(),
                        error,
                    }
                })?;
                s
            } else {
                std::fs::read_to_string(&file).map_err(|error| CliError::Read {
                    path: file.clone(),
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
        ConfigCommand::Show => match admin::load_config(store).await? {
            (version, Some(text)) => {
                eprintln!("version: {version}");
                println!("{text}");
            }
            (_, None) => return Err(CliError::Refused("no configuration is stored".into())),
        },
    }
    Ok(())
}

async fn key_command(store: &NativeStore, command: KeyCommand) -> Result<(), CliError> {
    let (action, record) = match command {
        KeyCommand::Create {
            plan,
            owner,
            expires_at,
            expires_in,
            identity,
            name,
            metadata,
            credits,
        } => {
            let now = now_secs();
            let new = KeyChanges {
                owner: Some(owner),
                plan: Some(plan),
                expires_at: expires_at
                    .or(expires_in.map(|s| now.saturating_add(s)))
                    .map(Some),
                identity: identity.map(Some),
                name: name.map(Some),
                metadata: metadata.map(Some),
                credits: credits.map(Some),
            };
            let (record, secret) = admin::create_key_with(store, &new, now).await?;
            let expiry = record.expires_at.map(utc_seconds);
            let expiry = expiry.map(|t| format!(", expires {t}")).unwrap_or_default();
            eprintln!(
                "created key {} (plan {}{expiry}); the secret is shown this once:",
                record.id, record.plan
            );
            println!("{secret}");
            ("key.create", record)
        }
        KeyCommand::List => {
            for r in admin::list_keys(store).await? {
                println!(
                    "{}\t{:?}\t{}\t{}\t{}",
                    r.id,
                    r.status,
                    r.plan,
                    utc_seconds(r.created),
                    r.owner
                );
            }
            return Ok(());
        }
        KeyCommand::Revoke { id } => {
            let r = admin::revoke_key(store, &id).await?;
            println!("revoked {}", r.id);
            ("key.revoke", r)
        }
        KeyCommand::Update { .. } => return key_update(store, command).await,
        KeyCommand::Rotate { id, overlap } => {
            let (before, after, secret) =
                admin::rotate_key(store, &id, overlap, now_secs()).await?;
            let until = after.rotation.as_ref().map_or(0, |r| r.overlap_ends);
            eprintln!(
                "rotated key {id}; the replaced secret works until {}; the new one is shown this once:",
                utc_seconds(until)
            );
            println!("{secret}");
            return audit_key(store, "key.rotate", Some(&before), &after).await;
        }
    };
    audit_key(store, action, None, &record).await
}

/// The audit record of a key operation made from the command line.
async fn audit_key(
    store: &NativeStore,
    action: &str,
    before: Option<&floodgate_shared::apikeys::KeyRecord>,
    after: &floodgate_shared::apikeys::KeyRecord,
) -> Result<(), CliError> {
    admin::audit(
        store,
        &AuditEntry {
            at: now_secs(),
            user: who(),
            action: action.into(),
            target: after.id.clone(),
            before: before.map(|b| b.to_json()),
            after: Some(after.to_json()),
        },
    )
    .await?;
    Ok(())
}

/// `key update`: the flags as one [`KeyChanges`], applied by the admin API's code.
async fn key_update(store: &NativeStore, command: KeyCommand) -> Result<(), CliError> {
    let KeyCommand::Update {
        id,
        plan,
        owner,
        name,
        identity,
        metadata,
        expires_at,
        expires_in,
        clear,
    } = command
    else {
        unreachable!("called for key update only");
    };
    let now = now_secs();
    let cleared = |f: &str| clear.iter().any(|c| c == f);
    let changes = KeyChanges {
        owner,
        plan,
        name: name.map(Some).or(cleared("name").then_some(None)),
        identity: identity.map(Some).or(cleared("identity").then_some(None)),
        metadata: metadata.map(Some).or(cleared("metadata").then_some(None)),
        expires_at: expires_at
            .or(expires_in.map(|s| now.saturating_add(s)))
            .map(Some)
            .or(cleared("expires_at").then_some(None)),
        credits: None,
    };
    admin::check_plan(store, &changes).await?;
    let (before, after, _) = admin::change_key(store, &id, &changes, None, now).await?;
    println!("updated {}", after.id);
    audit_key(store, "key.update", Some(&before), &after).await
}

/// `token create|list|revoke` (audited by the shared code).
async fn token_command(store: &NativeStore, command: TokenCommand) -> Result<(), CliError> {
    match command {
        TokenCommand::Create { scope, name } => {
            let (t, secret) = tokens::create_token(store, &name, scope, &who(), now_secs()).await?;
            eprintln!(
                "created API token {} (scope {}); it is shown this once:",
                t.id,
                t.scope.name()
            );
            println!("{secret}");
        }
        TokenCommand::List => {
            for t in tokens::list_tokens(store).await? {
                println!(
                    "{}\t{:?}\t{}\t{}\t{}",
                    t.id,
                    t.status,
                    t.scope.name(),
                    utc_seconds(t.created),
                    t.name
                );
            }
        }
        TokenCommand::Revoke { id } => {
            let t = tokens::revoke_token(store, &id, &who(), now_secs()).await?;
            println!("revoked API token {}", t.id);
        }
    }
    Ok(())
}

/// `identity override|clear` (the admin API's code, [`crate::identities`]) and
/// `identity show`.
async fn identity_command(store: &NativeStore, command: IdentityCommand) -> Result<(), CliError> {
    let (identity, over) = match command {
        IdentityCommand::Override {
            identity,
            plan,
            policies,
        } => {
            let policies = (!policies.is_empty()).then_some(policies);
            let over = IdentityOverride { plan, policies };
            (identity, Some(over))
        }
        IdentityCommand::Clear { identity } => (identity, None),
        IdentityCommand::Show { identity } => {
            let over = identities::identity_override(store, &identity).await?;
            println!("{}", describe_override(over.as_ref()));
            let (keys, _) = admin::key_page(store, Some(&identity), None, usize::MAX).await?;
            for k in keys {
                let r = k.record;
                println!("{}\t{:?}\t{}", r.id, r.status, r.plan);
            }
            return Ok(());
        }
    };
    let cleared = over.is_none();
    let saved =
        identities::edit_identity_override(store, &identity, over, &who(), now_secs()).await?;
    let shown = if cleared { saved.before } else { saved.after };
    let verb = if cleared { "removed" } else { "set" };
    println!(
        "{identity}: {verb} {} (version {})",
        describe_override(shown.as_ref()),
        saved.version
    );
    Ok(())
}

/// An override as `identity show` prints it.
fn describe_override(over: Option<&IdentityOverride>) -> String {
    let Some(o) = over else {
        return "no override".into();
    };
    let plan = o.plan.as_deref().unwrap_or("(the key's)");
    let policies = o
        .policies
        .as_ref()
        .map_or("(the plan's)".to_string(), |l| l.join(","));
    format!("plan {plan}, policies {policies}")
}

/// `deny add|remove` (the audited, version-checked save) and `deny list`.
async fn deny_command(store: &NativeStore, command: DenyCommand) -> Result<(), CliError> {
    let (list, edit, value) = match command {
        DenyCommand::Add { list, value } => (list, DenyEdit::Add, value),
        DenyCommand::Remove { list, value } => (list, DenyEdit::Remove, value),
        DenyCommand::List { list } => {
            let text = admin::get_config(store)
                .await?
                .ok_or_else(|| CliError::Refused("no configuration is stored".into()))?;
            let config = floodgate_shared::config::EdgeConfig::from_json(&text)?;
            let lists = list.map_or(DenyList::ALL.to_vec(), |l| vec![l]);
            for list in lists {
                for entry in config.spec().deny.list(list) {
                    println!("{list}\t{entry}");
                }
            }
            return Ok(());
        }
    };
    let (c, version) = admin::edit_deny(store, list, edit, &value, &who(), now_secs()).await?;
    println!(
        "{list} list: {} entries (version {version})",
        c.spec().deny.list(list).len()
    );
    Ok(())
}

async fn audit_command(store: &NativeStore, count: usize) -> Result<(), CliError> {
    for e in admin::audit_log(store, count).await? {
        println!(
            "{}\t{}\t{}\t{}",
            utc_seconds(e.at),
            e.user,
            e.action,
            e.target
        );
    }
    Ok(())
}

/// Unix seconds as an RFC 3339 instant in UTC (`2026-11-30T20:15:00Z`).
pub fn utc_seconds(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0).map_or_else(
        || format!("{secs} (Unix seconds)"),
        |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

/// µs since the epoch as an RFC 3339 instant in UTC, to the µs.
pub fn utc_micros(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us).map_or_else(
        || format!("{us} µs"),
        |t| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
    )
}

async fn bucket_command(
    store: &NativeStore,
    key: &str,
    quota: &Quota,
    cost: u32,
    show: bool,
) -> Result<(), CliError> {
    let verdict = store.check(&[Check::new(key, quota, cost)], None).await?;
    let d = verdict.decisions[0];
    if show {
        let view = floodgate_shared::BucketState { full_at: d.full_at }.view(quota, verdict.now);
        println!("key:         {key}");
        println!("tokens:      {:.3} of {}", view.tokens, quota.capacity());
        println!(
            "last_refill: {} (µs since the Unix epoch, Redis TIME; {})",
            view.last_refill,
            utc_micros(view.last_refill)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_shown_in_utc_with_the_zone() {
        assert_eq!(utc_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_seconds(1_796_000_000), "2026-11-30T00:53:20Z");
        assert_eq!(utc_seconds(951_825_600), "2000-02-29T12:00:00Z");
        assert_eq!(
            utc_micros(1_796_000_000_000_001),
            "2026-11-30T00:53:20.000001Z"
        );
        assert!(utc_seconds(i64::MAX).contains("Unix seconds"));
    }

    #[test]
    fn bad_command_lines_name_the_flag_or_argument() {
        let err = |args: &[&str]| match run(args.iter().map(|a| a.to_string()).collect()) {
            Err(CliError::Usage(m)) => m,
            other => panic!("{args:?}: {other:?}"),
        };
        assert!(err(&["check", "k", "ten/1m"]).contains("LIMIT/PERIOD"));
        assert!(err(&["audit", "many"]).contains("[COUNT]"));
        assert!(err(&["key", "create"]).contains("--plan"));
        let scope = err(&["token", "create", "--scope", "admin", "--name", "x"]);
        assert!(
            scope.contains("--scope") && scope.contains("read or write"),
            "{scope}"
        );
        let both = err(&["config", "set", "f.json", "--force", "--based-on", "v"]);
        assert!(
            both.contains("--force") && both.contains("--based-on"),
            "{both}"
        );
        assert!(err(&["--bogus", "key", "list"]).contains("--bogus"));
    }
}
