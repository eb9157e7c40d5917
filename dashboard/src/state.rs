//! What every request handler shares (feature `ssr`): the store, the settings the
//! flags gave, and the fleet's counters. The router provides it to the server
//! functions (`use_context`) and hands it to the guard.

use floodgate_edge::store::NativeStore;
use floodgate_shared::policy::Quota;
use ipnet::IpNet;

use crate::fleet::Fleet;

pub struct Core {
    pub store: NativeStore,
    /// Adds `Secure` to the cookies (set behind TLS).
    pub secure_cookies: bool,
    /// Proxies whose `X-Forwarded-For` names the client (none by default: the
    /// client is the connection's peer).
    pub trusted_proxies: Vec<IpNet>,
    /// The fleet's totals served at `/metrics`.
    pub fleet: Fleet,
    /// The edge's address (`--edge-url`), for the pages' ready-to-paste requests.
    pub edge_url: Option<String>,
    /// Requests each admin API token may make (`--api-rate`), counted by
    /// Floodgate's own token-bucket script.
    pub api_quota: Quota,
}

/// The admin API's default rate per token.
pub const API_RATE: &str = "600/1m";

impl Core {
    /// A dashboard over `store`: cookies without `Secure`, no trusted proxy.
    pub fn new(store: NativeStore) -> Self {
        Core {
            store,
            secure_cookies: false,
            trusted_proxies: vec![],
            fleet: Fleet::default(),
            edge_url: None,
            api_quota: Quota::parse_short(API_RATE).expect("a valid quota"),
        }
    }
}
