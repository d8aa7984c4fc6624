//! Admission (design.md §11): the product that admits a gateway's callers. Every admission of one route class contends for
//! its window's row, so admissions are gathered (`gather.rs`): while one
//! statement for a class runs, the admissions that arrive queue; the next
//! statement decides them all, in arrival order, each all or nothing
//! (`admit_callers()`). A lone admission is a group of one. The statement runs
//! through the shell (time limit, latency, outage vs failure); the verdict is
//! the pure rules' in `crate::domain::admission`.
//!
//! A caller that stops waiting leaves its admission to the group: if it was
//! admitted, a token and a slot were spent on an admission nobody was told
//! of: fewer admissions, never more.

use crate::domain::admission::{self, Admission, Caller, RouteClass, Verdict};
use crate::shell::gather::{fail_all, Gather, Reply};
use crate::shell::{Operation, Shell};
use crate::store::{Store, StoreError};

struct Waiter {
    /// The caller's bucket key and tenant group.
    key: Vec<u8>,
    tenant: String,
    reply: Reply<(Admission, RouteClass)>,
}

/// Queues by route class; a group is decided by the class's settings as its
/// latest arrival saw them.
type Queues = Gather<String, RouteClass, Waiter>;

/// Admits callers to route classes, each class's admissions gathered.
#[derive(Clone)]
pub struct AdmissionDesk {
    store: Store,
    shell: Shell,
    queues: Queues,
}

impl AdmissionDesk {
    pub(crate) fn new(store: Store, shell: Shell) -> Self {
        Self {
            store,
            shell,
            queues: Queues::default(),
        }
    }

    // Debug level, as `decide`: a span per admission is paid for whether or
    // not anything is logged in it.
    #[tracing::instrument(level = "debug", skip_all, fields(route_class = %class.name))]
    pub(crate) async fn admit(
        &self,
        class: &RouteClass,
        caller: &Caller,
    ) -> Result<Verdict, StoreError> {
        let waiter = |reply| Waiter {
            key: caller.bucket_key(&class.name).to_vec(),
            tenant: caller.tenant_group().to_string(),
            reply,
        };
        let lead = |name| self.clone().lead_admissions(name);
        let (admission, decided_by) = self
            .queues
            .ask(class.name.clone(), class.clone(), waiter, lead)
            .await?;
        // The settings the statement used, which the verdict must explain.
        Ok(admission::verdict(&decided_by.settings, &admission))
    }

    /// Decides the class's queue, group after group, until nobody waits.
    #[tracing::instrument(skip(self), fields(route_class = %name))]
    async fn lead_admissions(self, name: String) {
        while let Some((class, group)) = self.queues.next_group(&name) {
            let n = group.len();
            let (mut keys, mut tenants, mut replies) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for waiter in group {
                keys.push(waiter.key);
                tenants.push(waiter.tenant);
                replies.push(waiter.reply);
            }
            let admitted = self
                .store
                .admit(&keys, &tenants, &class.name, &class.settings);
            match self.shell.run(Operation::Admit, admitted).await {
                Ok(admissions) => {
                    for (reply, admission) in replies.into_iter().zip(admissions) {
                        let _ = reply.send(Ok((admission, class.clone())));
                    }
                }
                Err(error) => fail_all(replies, &error),
            }
        }
    }
}
