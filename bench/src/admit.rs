//! `GET /v1/admit` arms: a gateway asking before each request of its callers,
//! on one route class whose limits never refuse (the arms measure decisions,
//! not refusals): one hot caller, and callers spread over many principals of
//! a few tenants, each request a random one.

use crate::drive::{Arm, Load, Stop};

/// Tenants the spread callers belong to.
const TENANTS: usize = 100;

/// Callers asking admission for `principal()` (of its tenant) on `class`
/// until the arm's time is up, each answer counted by its status.
pub async fn arm(
    load: &Load,
    name: &str,
    class: &str,
    principal: impl Fn() -> usize + Clone + Send + Sync + 'static,
) -> anyhow::Result<Arm> {
    let (client, class) = (load.client.clone(), class.to_string());
    load.drive(name, Stop::Elapsed, move |call| {
        let (client, class, who) = (client.clone(), class.clone(), principal());
        async move {
            let principal = format!("caller-{who}");
            let tenant = format!("tenant-{}", who % TENANTS);
            let headers = [
                ("X-Quota-Route-Class", class.as_str()),
                ("X-Quota-Principal", principal.as_str()),
                ("X-Quota-Tenant", tenant.as_str()),
            ];
            let response = client.get(call.caller, "/v1/admit", &headers).await?;
            Ok(Some(label(response.status)))
        }
    })
    .await
}

/// What an arm counts an admission answer as.
fn label(status: u16) -> &'static str {
    match status {
        204 => "admitted",
        429 => "caller rate limited",
        503 => "unavailable",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn answers_are_counted_by_status() {
        assert_eq!(label(204), "admitted");
        assert_eq!(label(429), "caller rate limited");
        assert_eq!(label(503), "unavailable");
        assert_eq!(label(404), "other");
    }
}
