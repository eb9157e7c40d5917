//! The token every route but the health check needs, as Upstash takes it:
//! `Authorization: Bearer <token>` (the scheme in any case, RFC 9110) or the
//! `_token` query parameter. A middleware layer of the routes ([`RequireToken`]);
//! tokens are compared in constant time (`subtle`).

use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures_util::future::Either;
use subtle::ConstantTimeEq;
use tower::{Layer, Service};

use crate::Endpoint;
use crate::reply::error;

/// The query parameter that carries the token (`?_token=`): never a command's
/// argument.
pub const TOKEN_PARAMETER: &str = "_token";

/// The token clients must present.
pub(crate) struct Token(Vec<u8>);

impl Token {
    pub(crate) fn new(token: &str) -> Self {
        Self(token.as_bytes().to_vec())
    }

    /// Whether `presented` is the token, in time independent of where they differ.
    fn is(&self, presented: &[u8]) -> bool {
        self.0.ct_eq(presented).into()
    }

    /// Whether the request carries the token, in its `Authorization` header or
    /// in its query string.
    pub(crate) fn admits(&self, headers: &HeaderMap, query: Option<&str>) -> bool {
        let by_header = bearer(headers).is_some_and(|t| self.is(t));
        let by_query = || {
            form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .filter(|(name, _)| name == TOKEN_PARAMETER)
                .any(|(_, t)| self.is(t.as_bytes()))
        };
        by_header || by_query()
    }
}

/// The token of `Authorization: Bearer <token>`; the scheme in any case (RFC 9110).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii())
}

/// The routes' auth layer: a request without the token is answered 401 and goes
/// no further (whatever its method or body). A plain tower layer: nothing is
/// boxed per request on this path every request takes.
#[derive(Clone)]
pub(crate) struct RequireToken(pub(crate) Arc<Endpoint>);

impl<S> Layer<S> for RequireToken {
    type Service = TokenChecked<S>;

    fn layer(&self, inner: S) -> TokenChecked<S> {
        TokenChecked {
            ep: self.0.clone(),
            inner,
        }
    }
}

/// A route behind [`RequireToken`].
#[derive(Clone)]
pub(crate) struct TokenChecked<S> {
    ep: Arc<Endpoint>,
    inner: S,
}

impl<S: Service<Request, Response = Response>> Service<Request> for TokenChecked<S> {
    type Response = Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        if self.ep.token.admits(req.headers(), req.uri().query()) {
            Either::Left(self.inner.call(req))
        } else {
            Either::Right(ready(Ok(error(StatusCode::UNAUTHORIZED, "Unauthorized"))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let mut h = HeaderMap::new();
        for (v, want) in [
            ("Bearer abc", Some(&b"abc"[..])),
            ("bearer abc", Some(b"abc")),
            ("BEARER  abc ", Some(b"abc")),
            ("Basic abc", None),
            ("Bearerabc", None),
        ] {
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            assert_eq!(bearer(&h), want, "{v}");
        }
    }

    #[test]
    fn the_token_comes_from_the_header_or_the_query_parameter() {
        let token = Token::new("s3cr/t+x");
        let none = HeaderMap::new();
        let mut header = HeaderMap::new();
        header.insert(header::AUTHORIZATION, "Bearer s3cr/t+x".parse().unwrap());
        assert!(token.admits(&header, None));
        assert!(!token.admits(&none, None));
        for (query, admitted) in [
            // percent-decoded as a query parameter: `%2B` is `+`, `+` a space
            ("_token=s3cr%2Ft%2Bx", true),
            ("_token=s3cr/t%2Bx", true),
            ("EX=100&_token=s3cr/t%2Bx&NX", true),
            ("_token=wrong&_token=s3cr/t%2Bx", true),
            ("_token=s3cr/t+x", false),
            ("_token=s3cr/t", false),
            ("_token=", false),
            ("token=s3cr/t%2Bx", false),
            ("x_token=s3cr/t%2Bx", false),
            ("_token", false),
            ("", false),
        ] {
            assert_eq!(token.admits(&none, Some(query)), admitted, "{query}");
        }
        let mut wrong = HeaderMap::new();
        wrong.insert(header::AUTHORIZATION, "Bearer wrong".parse().unwrap());
        assert!(token.admits(&wrong, Some("_token=s3cr/t%2Bx")));
        assert!(!token.admits(&wrong, Some("_token=wrong")));
    }

    #[test]
    fn a_prefix_or_an_extension_of_the_token_is_not_the_token() {
        let token = Token::new("abcdef");
        assert!(token.is(b"abcdef"));
        for other in [&b"abcde"[..], b"abcdefg", b"", b"ABCDEF", b"abcdeg"] {
            assert!(!token.is(other), "{}", String::from_utf8_lossy(other));
        }
    }
}
