//! The audit log.

use leptos::prelude::*;

#[cfg(feature = "ssr")]
use super::ctx;
use crate::error::AppError;
use crate::wire::AuditRow;

/// The newest 200 audit records, each with the fields its change touched.
#[server(endpoint = "audit")]
pub async fn audit_entries() -> Result<Vec<AuditRow>, AppError> {
    ctx::session().await?;
    let core = ctx::core()?;
    let entries = floodgate_edge::admin::audit_log(&core.store, 200).await?;
    Ok(entries.into_iter().map(AuditRow::from).collect())
}
