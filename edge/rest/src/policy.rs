//! What the endpoint refuses to run: administrative and dangerous commands
//! (`CONFIG`, `ACL` but its read-only self-inspection, `MIGRATE`, `SAVE`,
//! `BGSAVE`, `BGREWRITEAOF`, `SWAPDB`, `FLUSHALL`, `FLUSHDB`, `SCRIPT FLUSH|KILL`,
//! `FUNCTION FLUSH|RESTORE|DELETE|KILL`, `DEBUG`, `SHUTDOWN`, `REPLICAOF`,
//! `SLAVEOF`, `FAILOVER`, `MODULE`, `CLUSTER` but its reads, `SENTINEL`) unless
//! the operator allows them (`--allow-command`); commands that would block or
//! change the state of the shared connections (`MULTI` outside `/multi-exec`,
//! `SELECT`, `SUBSCRIBE`, blocking pops, `CLIENT`...) always.

use std::collections::HashSet;

/// Why a request's command(s) will not run; `Display` is the `{"error"}` text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It would block or change the state of the shared Redis connections.
    #[error(
        "ERR command not allowed over REST: {command} (it would block or change the endpoint's shared Redis connections)"
    )]
    ConnectionState { command: String },
    /// Administrative or dangerous, and not on the allow list.
    #[error(
        "ERR command not allowed over REST: {command} (administrative; floodgate-rest --allow-command \"{command}\" enables it)"
    )]
    Administrative { command: String },
    /// Not a command this endpoint can read.
    #[error("ERR {0}")]
    Malformed(String),
    /// One command of a batch, by its index.
    #[error("{refusal} (command {index})")]
    InBatch { index: usize, refusal: Box<Refusal> },
}

/// What the endpoint refuses to run.
#[derive(Debug, Clone, Default)]
pub struct CommandPolicy {
    /// Upper-case `"CMD"` or `"CMD SUB"` entries allowed despite the default.
    allowed: HashSet<String>,
}

/// Commands that would block a shared connection or change its state: refused
/// always (no allow list can make them safe on a shared connection).
const CONNECTION_STATE: &[&str] = &[
    "AUTH",
    "HELLO",
    "SELECT",
    "QUIT",
    "RESET",
    "MULTI",
    "EXEC",
    "DISCARD",
    "WATCH",
    "UNWATCH",
    "SUBSCRIBE",
    "PSUBSCRIBE",
    "SSUBSCRIBE",
    "UNSUBSCRIBE",
    "PUNSUBSCRIBE",
    "SUNSUBSCRIBE",
    "MONITOR",
    "SYNC",
    "PSYNC",
    "REPLCONF",
    "BLPOP",
    "BRPOP",
    "BRPOPLPUSH",
    "BLMOVE",
    "BLMPOP",
    "BZPOPMIN",
    "BZPOPMAX",
    "BZMPOP",
    "WAIT",
    "WAITAOF",
    "CLIENT",
];

/// Which subcommands of an administrative command are refused by default.
enum Refused {
    Every,
    These(&'static [&'static str]),
    AllBut(&'static [&'static str]),
}

/// Administrative and dangerous commands, refused unless allowed: they change
/// the server for every user (`CONFIG SET requirepass` locks everyone out),
/// reach other hosts (`MIGRATE`), destroy data wholesale, or stop the server.
const ADMINISTRATIVE: &[(&str, Refused)] = &[
    ("CONFIG", Refused::Every),
    (
        "ACL",
        Refused::AllBut(&["WHOAMI", "CAT", "GENPASS", "HELP"]),
    ),
    ("MIGRATE", Refused::Every),
    ("SAVE", Refused::Every),
    ("BGSAVE", Refused::Every),
    ("BGREWRITEAOF", Refused::Every),
    ("SWAPDB", Refused::Every),
    ("FLUSHALL", Refused::Every),
    ("FLUSHDB", Refused::Every),
    ("SCRIPT", Refused::These(&["FLUSH", "KILL"])),
    (
        "FUNCTION",
        Refused::These(&["FLUSH", "RESTORE", "DELETE", "KILL"]),
    ),
    ("DEBUG", Refused::Every),
    ("SHUTDOWN", Refused::Every),
    ("REPLICAOF", Refused::Every),
    ("SLAVEOF", Refused::Every),
    ("FAILOVER", Refused::Every),
    ("MODULE", Refused::Every),
    (
        "CLUSTER",
        Refused::AllBut(&[
            "INFO",
            "KEYSLOT",
            "SLOTS",
            "SHARDS",
            "NODES",
            "MYID",
            "COUNTKEYSINSLOT",
            "GETKEYSINSLOT",
            "HELP",
        ]),
    ),
    ("SENTINEL", Refused::Every),
    ("PFDEBUG", Refused::Every),
    ("PFSELFTEST", Refused::Every),
];

impl CommandPolicy {
    /// The default policy, with `allow` entries (`"FLUSHDB"`, `"SCRIPT FLUSH"`)
    /// let through.
    pub fn new(allow: &[String]) -> Self {
        Self {
            allowed: allow
                .iter()
                .map(|a| {
                    a.split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                        .to_ascii_uppercase()
                })
                .collect(),
        }
    }

    /// Why the command may not run over this endpoint, if it may not.
    pub fn check(&self, args: &[Vec<u8>]) -> Result<(), Refusal> {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let sub = args
            .get(1)
            .map(|s| String::from_utf8_lossy(s).to_ascii_uppercase())
            .unwrap_or_default();
        let blocking_read = (name == "XREAD" || name == "XREADGROUP")
            && args.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK"));
        if CONNECTION_STATE.contains(&name.as_str()) || blocking_read {
            return Err(Refusal::ConnectionState { command: name });
        }
        let Some((_, refused)) = ADMINISTRATIVE.iter().find(|(n, _)| *n == name) else {
            return Ok(());
        };
        let hit = match refused {
            Refused::Every => true,
            Refused::These(subs) => subs.contains(&sub.as_str()),
            Refused::AllBut(subs) => !subs.contains(&sub.as_str()),
        };
        let full = if sub.is_empty() || matches!(refused, Refused::Every) {
            name.clone()
        } else {
            format!("{name} {sub}")
        };
        if !hit || self.allowed.contains(&name) || self.allowed.contains(&full) {
            return Ok(());
        }
        Err(Refusal::Administrative { command: full })
    }
}
