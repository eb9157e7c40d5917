//! Forward-auth mode (`floodgate-edge --forward-auth`): an existing gateway (Caddy
//! `forward_auth`, Traefik `ForwardAuth`, Envoy `ext_authz` over HTTP, nginx
//! `auth_request`) asks the edge about each request before proxying it itself. The
//! edge decides from the ORIGINAL request the gateway describes, never from the
//! auth request's own method and path:
//!
//! - **Forwarded headers** (Caddy, Traefik, nginx as configured in the README):
//!   `X-Forwarded-Method` and `X-Forwarded-Uri` (path and query, origin form) are
//!   required; `X-Forwarded-Host`, when sent, must be a host.
//! - **Envoy's path prefix**: an auth request whose path starts with
//!   [`ForwardAuth::envoy_prefix`] carries the original path after it (Envoy's
//!   `path_prefix` + the original path), and the original method as its own.
//!
//! The client's address is the LAST `X-Forwarded-For` entry: the address the
//! gateway itself saw (every gateway above appends it). Without one, the request
//! has no client address (per-IP policies cannot apply to it).
//!
//! These headers are trusted, so the auth port must be reachable by the gateway
//! only. Missing or malformed ones get a 400 ([`ForwardError`]), and the request
//! is never counted.

use std::net::IpAddr;

use crate::pipeline::Reply;

/// How the edge reads the original request in forward-auth mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardAuth {
    /// Auth requests under this path follow Envoy's `path_prefix` convention.
    pub envoy_prefix: String,
}

/// The default Envoy `path_prefix`.
pub const ENVOY_PREFIX: &str = "/ext-authz";

impl Default for ForwardAuth {
    fn default() -> Self {
        Self {
            envoy_prefix: ENVOY_PREFIX.into(),
        }
    }
}

/// The request the gateway asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Original<'a> {
    pub method: &'a str,
    /// The path without its query.
    pub path: &'a str,
    pub client_ip: Option<IpAddr>,
}

/// Why an auth request does not describe an original request (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{header} is malformed: expected {expected}")]
    Malformed {
        header: &'static str,
        expected: &'static str,
    },
}

pub const FORWARDED_METHOD: &str = "x-forwarded-method";
pub const FORWARDED_URI: &str = "x-forwarded-uri";
pub const FORWARDED_HOST: &str = "x-forwarded-host";
pub const FORWARDED_FOR: &str = "x-forwarded-for";

impl ForwardError {
    /// `400 {"error": "Bad forward-auth request", "hint": <what is wrong>}`.
    pub fn answer(&self) -> Reply {
        Reply::json(400, "Bad forward-auth request", Some(&self.to_string()))
    }
}

/// An HTTP method: a token (RFC 9110 `tchar`s).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The path of an origin-form target (`/p?q`), without its query.
fn origin_path(target: &str) -> Option<&str> {
    let ok = target.starts_with('/') && target.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| target.split(['?', '#']).next().unwrap_or(target))
}

fn is_host(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
}

impl ForwardAuth {
    /// The original request of an auth request (`method` and `target`: its own;
    /// `header`: its headers by lower-case name).
    pub fn original<'a>(
        &self,
        method: &'a str,
        target: &'a str,
        header: impl Fn(&str) -> Option<&'a [u8]>,
    ) -> Result<Original<'a>, ForwardError> {
        let text = |name: &'static str| -> Result<Option<&'a str>, ForwardError> {
            header(name)
                .map(|v| {
                    std::str::from_utf8(v).map_err(|_| ForwardError::Malformed {
                        header: name,
                        expected: "ASCII text",
                    })
                })
                .transpose()
        };
        let client_ip = match text(FORWARDED_FOR)? {
            None => None,
            Some(v) => Some(
                v.rsplit(',')
                    .next()
                    .and_then(|last| last.trim().parse::<IpAddr>().ok())
                    .ok_or(ForwardError::Malformed {
                        header: FORWARDED_FOR,
                        expected: "a list of IP addresses ending with the client's",
                    })?,
            ),
        };
        let path = target.split(['?', '#']).next().unwrap_or(target);
        if let Some(rest) = path.strip_prefix(self.envoy_prefix.as_str())
            && (rest.is_empty() || rest.starts_with('/'))
        {
            // Envoy: the original path follows the prefix; the method is the original
            let rest = &target[self.envoy_prefix.len()..];
            let path = if rest.is_empty() || rest.starts_with('?') {
                "/"
            } else {
                origin_path(rest).ok_or(ForwardError::Malformed {
                    header: ":path",
                    expected: "the prefix followed by the original path",
                })?
            };
            return Ok(Original {
                method,
                path,
                client_ip,
            });
        }
        let method = text(FORWARDED_METHOD)?.ok_or(ForwardError::Missing(FORWARDED_METHOD))?;
        if !is_token(method) {
            return Err(ForwardError::Malformed {
                header: FORWARDED_METHOD,
                expected: "an HTTP method such as GET",
            });
        }
        let uri = text(FORWARDED_URI)?.ok_or(ForwardError::Missing(FORWARDED_URI))?;
        let path = origin_path(uri).ok_or(ForwardError::Malformed {
            header: FORWARDED_URI,
            expected: "the original path and query, starting with /",
        })?;
        if let Some(host) = text(FORWARDED_HOST)?
            && !is_host(host)
        {
            return Err(ForwardError::Malformed {
                header: FORWARDED_HOST,
                expected: "a host name or address, with an optional port",
            });
        }
        Ok(Original {
            method,
            path,
            client_ip,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask<'a>(
        method: &'a str,
        target: &'a str,
        headers: &'a [(&'a str, &'a str)],
    ) -> Result<Original<'a>, ForwardError> {
        ForwardAuth::default().original(method, target, |name| {
            headers
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.as_bytes())
        })
    }

    #[test]
    fn forwarded_headers_describe_the_original_request() {
        let o = ask(
            "GET",
            "/",
            &[
                ("x-forwarded-method", "POST"),
                ("x-forwarded-uri", "/v1/checkout?cart=7"),
                ("x-forwarded-host", "api.example.com:8443"),
                ("x-forwarded-for", "198.51.100.1, 203.0.113.9"),
            ],
        )
        .unwrap();
        assert_eq!(
            o,
            Original {
                method: "POST",
                path: "/v1/checkout",
                client_ip: Some("203.0.113.9".parse().unwrap()),
            }
        );
        let v6 = ask(
            "GET",
            "/auth",
            &[
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/"),
                ("x-forwarded-for", "2001:db8::7"),
            ],
        )
        .unwrap();
        assert_eq!(v6.client_ip, Some("2001:db8::7".parse().unwrap()));
        assert_eq!(v6.path, "/");
    }

    #[test]
    fn envoy_appends_the_original_path_to_its_prefix() {
        let o = ask("DELETE", "/ext-authz/v1/search?q=1", &[]).unwrap();
        assert_eq!(
            (o.method, o.path, o.client_ip),
            ("DELETE", "/v1/search", None)
        );
        assert_eq!(ask("GET", "/ext-authz", &[]).unwrap().path, "/");
        assert_eq!(ask("GET", "/ext-authz?x", &[]).unwrap().path, "/");
        // a path that merely shares the prefix's first letters is not Envoy's
        assert_eq!(
            ask("GET", "/ext-authzed", &[]),
            Err(ForwardError::Missing(FORWARDED_METHOD))
        );
    }

    #[test]
    fn missing_or_malformed_headers_name_the_header() {
        let uri = ("x-forwarded-uri", "/v1/x");
        let get = ("x-forwarded-method", "GET");
        for (headers, want) in [
            (vec![uri], ForwardError::Missing(FORWARDED_METHOD)),
            (vec![get], ForwardError::Missing(FORWARDED_URI)),
            (
                vec![("x-forwarded-method", "GE T"), uri],
                ForwardError::Malformed {
                    header: FORWARDED_METHOD,
                    expected: "an HTTP method such as GET",
                },
            ),
            (
                vec![get, ("x-forwarded-uri", "https://example.com/v1")],
                ForwardError::Malformed {
                    header: FORWARDED_URI,
                    expected: "the original path and query, starting with /",
                },
            ),
            (
                vec![get, uri, ("x-forwarded-host", "a b")],
                ForwardError::Malformed {
                    header: FORWARDED_HOST,
                    expected: "a host name or address, with an optional port",
                },
            ),
            (
                vec![get, uri, ("x-forwarded-for", "10.0.0.1, not-an-ip")],
                ForwardError::Malformed {
                    header: FORWARDED_FOR,
                    expected: "a list of IP addresses ending with the client's",
                },
            ),
        ] {
            let got = ask("GET", "/", &headers).unwrap_err();
            assert_eq!(got, want);
            let Reply { status, body, .. } = got.answer();
            assert_eq!(status, 400);
            assert!(body.contains(got.to_string().as_str()), "{body}");
        }
    }
}
