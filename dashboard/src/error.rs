//! [`AppError`]: the one error of the dashboard's server functions, its HTTP
//! status (the guard sets it) and its text for operators (pure; both builds).

use floodgate_shared::config::ConfigSpec;
use floodgate_shared::policy::PolicyError;
use serde::{Deserialize, Serialize};

/// Why a server function refused: the one error type of the dashboard's API, sent
/// as JSON with the HTTP status of [`AppError::status`] (the guard sets it, for the
/// guard's own refusals too), so the pages tell a session that ended from an outage
/// from a field error without reading text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AppError {
    /// No session, or it ended (expired, signed out): sign in again. 401.
    SignedOut,
    /// Wrong user name or password. 401.
    WrongCredentials,
    /// Too many sign-in attempts from here; try again after `wait_secs`. 429.
    TooManyAttempts { wait_secs: u64 },
    /// Refused: not from the dashboard's own pages, or the form's CSRF token is
    /// missing or stale. 403.
    Forbidden(String),
    /// A field of the form is invalid: `field` as the edge's validation names it
    /// (to place the message next to the form's field), `label` as an operator
    /// reads it. 422.
    Invalid {
        field: String,
        label: String,
        message: String,
    },
    /// Someone saved the configuration after this form was loaded. 409.
    Conflict(String),
    /// The dashboard's store (Redis) cannot be reached. 503.
    Unavailable(String),
    /// The request could not be read (a missing or malformed field). 400.
    BadRequest(String),
    /// The dashboard's server cannot be reached (seen in the browser only).
    Unreachable(String),
    /// Anything else. 500.
    Internal(String),
}

impl AppError {
    /// A field error whose label is the field itself.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        AppError::Invalid {
            label: crate::describe::describe_field(&field, None),
            field,
            message: message.into(),
        }
    }

    /// An error of the edge's validation: on the form field it is about (a list
    /// element's index is dropped, `policies[2]` → `policies`, since a form edits the
    /// list as one field), labelled for operators with the names `spec` gives the
    /// indexes (`routes[0].policies` → `Route "search", limits`).
    pub fn from_policy(e: PolicyError, spec: Option<&ConfigSpec>) -> Self {
        let label = crate::describe::describe_field(&e.field, spec);
        let field = crate::describe::strip_indexes(&e.field).to_string();
        AppError::Invalid {
            field,
            label,
            message: e.message,
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            AppError::SignedOut | AppError::WrongCredentials => 401,
            AppError::TooManyAttempts { .. } => 429,
            AppError::Forbidden(_) => 403,
            AppError::Invalid { .. } => 422,
            AppError::Conflict(_) => 409,
            AppError::Unavailable(_) => 503,
            AppError::BadRequest(_) => 400,
            AppError::Unreachable(_) => 502,
            AppError::Internal(_) => 500,
        }
    }

    /// The message for `field` of a form, if this error is about it.
    pub fn message_for(&self, field: &str) -> Option<String> {
        match self {
            AppError::Invalid {
                field: f, message, ..
            } if f == field => Some(message.clone()),
            _ => None,
        }
    }

    /// Whether the page should show this as an outage banner.
    pub fn is_outage(&self) -> bool {
        matches!(self, AppError::Unavailable(_) | AppError::Unreachable(_))
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::SignedOut => f.write_str("Your session has ended; sign in again."),
            AppError::WrongCredentials => f.write_str("Wrong user name or password"),
            AppError::TooManyAttempts { wait_secs } => {
                write!(f, "Too many sign-in attempts; try again in {wait_secs} s")
            }
            AppError::Invalid { label, message, .. } => write!(f, "{label}: {message}"),
            AppError::Forbidden(m) | AppError::Conflict(m) | AppError::BadRequest(m) => {
                f.write_str(m)
            }
            AppError::Unavailable(m) => write!(
                f,
                "The dashboard cannot reach its store (Redis): {m}. Nothing was changed; \
                 it retries on its own."
            ),
            AppError::Unreachable(m) => write!(
                f,
                "The dashboard's server cannot be reached ({m}); it retries on its own."
            ),
            AppError::Internal(m) => write!(f, "Internal error: {m}"),
        }
    }
}

impl std::error::Error for AppError {}

impl leptos::server_fn::error::FromServerFnError for AppError {
    type Encoder = leptos::server_fn::codec::JsonEncoding;

    fn from_server_fn_error(e: leptos::server_fn::error::ServerFnErrorErr) -> Self {
        use leptos::server_fn::error::ServerFnErrorErr as E;
        match e {
            E::Args(m) => AppError::BadRequest(format!("the form could not be read: {m}")),
            E::MissingArg(m) => AppError::BadRequest(format!("the form lacks the field {m}")),
            E::Request(m) => AppError::Unreachable(m),
            other => AppError::Internal(other.to_string()),
        }
    }
}
