//! The block lists (the configuration's `deny` lists of key ids, addresses,
//! countries and user agents): cached with the configuration, so checking them
//! costs no store call. A listed caller gets a 403 naming nothing, before any
//! bucket is checked; it is counted per list.

use floodgate_shared::apikeys::KeyRecord;
use floodgate_shared::config::EdgeConfig;
use floodgate_shared::deny::Visitor;
use floodgate_shared::time::Clock;

use super::{Pipeline, Reply, RequestHead};
use crate::stats::StatsField;
use crate::store::{MaybeSend, MaybeSync, Store};

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// A 403 when a block list names the caller.
    pub(super) fn blocked(
        &self,
        config: &EdgeConfig,
        record: &KeyRecord,
        req: &RequestHead<'_>,
    ) -> Result<(), Reply> {
        let visitor = Visitor {
            key_id: Some(&record.id),
            ip: req.client_ip,
            country: req.country,
            user_agent: req.user_agent,
        };
        match config.deny().matches(&visitor) {
            None => Ok(()),
            Some(list) => {
                self.stats
                    .bump(self.clock.now(), StatsField::Denied(list), 1);
                Err(Reply::json(403, "Forbidden", None))
            }
        }
    }
}
