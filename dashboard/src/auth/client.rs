//! The client address the sign-in limiter counts.

use std::net::IpAddr;

use axum::http::HeaderMap;
use ipnet::IpNet;

/// The client's address: the connection's peer, or, when the peer is a trusted
/// proxy, the nearest address in `X-Forwarded-For` that is not one (each proxy
/// appends the address it saw, so only the right end can be believed).
pub fn client_address(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Option<IpAddr> {
    let peer = peer?;
    let is_proxy = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_proxy(&peer) {
        return Some(peer);
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut nearest = peer;
    for hop in hops.iter().rev() {
        match hop.parse::<IpAddr>() {
            Ok(ip) if is_proxy(&ip) => nearest = ip,
            Ok(ip) => return Some(ip),
            // not an address: whatever sent it is beyond the trusted proxies
            Err(_) => return Some(nearest),
        }
    }
    Some(nearest)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_headers as headers;
    #[test]
    fn the_client_is_the_peer_unless_a_trusted_proxy_says_otherwise() {
        let peer: IpAddr = "10.0.0.5".parse().unwrap();
        let proxies: Vec<IpNet> = vec!["10.0.0.0/24".parse().unwrap()];
        let xff = headers(&[("x-forwarded-for", "203.0.113.9, 198.51.100.7, 10.0.0.4")]);
        assert_eq!(
            client_address(Some(peer), &xff, &[]),
            Some(peer),
            "no trusted proxy: the header is ignored"
        );
        assert_eq!(
            client_address(Some(peer), &xff, &proxies),
            Some("198.51.100.7".parse().unwrap()),
            "the nearest untrusted hop, never the client-supplied left end"
        );
        let stranger: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            client_address(Some(stranger), &xff, &proxies),
            Some(stranger)
        );
        let garbage = headers(&[("x-forwarded-for", "not-an-ip, 10.0.0.4")]);
        assert_eq!(
            client_address(Some(peer), &garbage, &proxies),
            Some("10.0.0.4".parse().unwrap())
        );
        assert_eq!(
            client_address(Some(peer), &HeaderMap::new(), &proxies),
            Some(peer)
        );
    }
}
