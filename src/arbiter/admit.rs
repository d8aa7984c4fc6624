//! Admission (design.md §11): one statement per admission, through the
//! shell (time limit, latency, outage vs failure), and the verdict the pure
//! rules in `crate::admission` draw from its answer.
//!
//! The statement runs in place: a caller that stops waiting drops it, and if
//! it committed all the same, a token and a slot were spent on an admission
//! nobody was told of: fewer admissions, never more.

use super::shell::{Operation, StoreError};
use super::Arbiter;
use crate::admission::{self, Caller, RouteClass, Verdict};

impl Arbiter {
    #[tracing::instrument(skip_all, fields(route_class = %class.name))]
    pub async fn admit(&self, class: &RouteClass, caller: &Caller) -> Result<Verdict, StoreError> {
        let key = caller.bucket_key(&class.name);
        let admitted = self
            .store
            .admit(key, &class.name, caller.tenant_group(), &class.settings);
        let admission = self.shell.run(Operation::Admit, admitted).await?;
        Ok(admission::verdict(&class.settings, &admission))
    }
}
