//! The OpenAPI document is the contract: the answers every operation can
//! give whatever its handler (a bad body, a missing token, a store out of
//! reach, a bug) are written here once, from what the shared extractors and
//! [`ApiError`](super::error::ApiError) do, rather than on each handler.

use serde_json::json;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::schema::{
    AllOfBuilder, ArrayBuilder, KnownFormat, ObjectBuilder, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, OpenApi, Ref, RefOr, ResponseBuilder, Schema,
};

use super::error::PROBLEM_JSON;
use crate::auth::Access;
use crate::domain::input;

/// Completes every operation of the document.
pub(crate) fn complete(openapi: &mut OpenApi) {
    refine_bodies(openapi);
    document_admission(openapi);
    for (path, item) in openapi.paths.paths.iter_mut() {
        let api = path.starts_with("/v1/");
        for operation in operations(item) {
            constrain_parameters(operation);
            if api {
                document_failures(operation);
            }
        }
    }
}

/// The rules between fields of one body that a struct's fields alone cannot
/// say, written as JSON Schema beside the struct's own schema. `null` and a
/// field left out mean the same to the server, so "absent" is `type: null`.
fn refine_bodies(openapi: &mut OpenApi) {
    let components = openapi.components.get_or_insert_with(Default::default);
    let absent = json!({"type": "null"});
    let rules = [
        (
            "QuotaLimits",
            vec![input::schema::any_of([
                json!({"type": "object", "required": ["rate", "burst"], "properties": {
                    "rate": {"type": "number", "minimum": crate::domain::catalog::MIN_RATE, "maximum": crate::domain::catalog::MAX_RATE},
                    "burst": {"type": "number", "minimum": 1, "maximum": crate::domain::catalog::MAX_BURST}}}),
                json!({"type": "object", "properties": {"rate": absent, "burst": absent}}),
            ])],
        ),
        (
            "FlowBody",
            vec![
                input::schema::any_of([
                    json!({"type": "object", "properties": {"enforce_percent": absent}}),
                    json!({"type": "object", "required": ["mode"], "properties": {"mode": {"type": "string", "enum": ["enforce"]}}}),
                ]),
                input::schema::any_of([
                    json!({"type": "object", "required": ["quota"], "properties": {"quota": {"type": "string"}, "quotas": absent}}),
                    json!({"type": "object", "required": ["quotas"], "properties": {"quotas": {"type": "array"}, "quota": absent}}),
                ]),
            ],
        ),
        (
            "ReserveBody",
            vec![input::schema::any_of([
                json!({"type": "object", "properties": {"spend": absent}}),
                json!({"type": "object", "required": ["spend"], "properties": {
                    "spend": {"type": "object"},
                    "settle": {"type": ["boolean", "null"], "enum": [true, null]}}}),
            ])],
        ),
        (
            "ReleaseBody",
            vec![input::schema::any_of([
                json!({"type": "object", "properties": {"retry_in": absent}}),
                json!({"type": "object", "properties": {"retry_at": absent}}),
            ])],
        ),
        (
            "FeedbackBody",
            vec![
                input::schema::any_of([
                    json!({"type": "object", "required": ["flow"], "properties": {"flow": {"type": "string"}, "quota": absent}}),
                    json!({"type": "object", "required": ["quota"], "properties": {"quota": {"type": "string"}, "flow": absent}}),
                ]),
                input::schema::any_of([
                    json!({"type": "object", "required": ["status"], "properties": {"status": {"type": "integer"}}}),
                    json!({"type": "object", "required": ["lease_id"], "properties": {"lease_id": {"type": ["string", "integer"]}}}),
                    json!({"type": "object", "required": ["degraded"], "properties": {"degraded": {"type": "integer"}}}),
                ]),
                input::schema::any_of([
                    json!({"type": "object", "properties": {"bypassed": absent}}),
                    json!({"type": "object", "required": ["flow", "degraded", "bypassed"],
                        "properties": {"flow": {"type": "string"}, "degraded": {"type": "integer"}, "bypassed": {"type": "integer"}}}),
                ]),
                input::schema::any_of([
                    json!({"type": "object", "properties": {"status": {"type": ["integer", "null"], "minimum": 100}}}),
                    json!({"type": "object", "properties": {"status": {"type": "integer", "enum": [0]}}}),
                ]),
            ],
        ),
    ];
    for (name, rules) in rules {
        let Some(own) = components.schemas.remove(name) else {
            continue;
        };
        let all = rules
            .into_iter()
            .fold(AllOfBuilder::new().item(own), |all, rule| all.item(rule));
        components
            .schemas
            .insert(name.into(), Schema::from(all.build()).into());
    }
}

/// What both forms of `/v1/admit` answer besides admitted (design.md §11),
/// and the caller's RateLimit fields on every answer about a route class.
fn document_admission(openapi: &mut OpenApi) {
    let Some(item) = openapi.paths.paths.get_mut("/v1/admit") else {
        return;
    };
    let text = || -> Schema { ObjectBuilder::new().schema_type(Type::String).into() };
    let seconds = || -> Schema {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1))
            .into()
    };
    let header = |schema: Schema, description: &str| {
        HeaderBuilder::new()
            .schema(schema)
            .description(Some(description))
            .build()
    };
    let policy = || {
        header(
            text(),
            "The caller's own bucket: \"<route class>\";q=<burst>;w=<seconds the rate takes to refill it>",
        )
    };
    let limit = |when: &str| {
        header(
            text(),
            &format!(
                "\"<route class>\";r=<requests it may send now>;t=<seconds until r grows>{when}"
            ),
        )
    };
    for operation in operations(item) {
        let responses = &mut operation.responses.responses;
        for (status, response) in responses.iter_mut() {
            if let (true, RefOr::T(response)) = (status.starts_with('2'), response) {
                response.headers.insert("RateLimit-Policy".into(), policy());
                response.headers.insert("RateLimit".into(), limit(""));
            }
        }
        let refusals = [
            ("404", "No such route class", vec![]),
            (
                "429",
                "caller-rate-limited: this caller's own bucket is empty",
                vec![
                    ("Retry-After", header(seconds(), "Seconds until this caller's next token: the RateLimit field's t")),
                    ("RateLimit-Policy", policy()),
                    ("RateLimit", limit("")),
                ],
            ),
            (
                "503",
                "capacity-exhausted: the tenant's share or the route class's capacity is taken for this \
                 window; or store-unavailable: nothing admitted (fail closed)",
                vec![
                    ("Retry-After", header(seconds(), "capacity-exhausted: seconds until the window ends; store-unavailable: 2")),
                    ("RateLimit-Policy", policy()),
                    ("RateLimit", limit(" (capacity-exhausted only: store-unavailable read no bucket)")),
                ],
            ),
        ];
        for (status, description, headers) in refusals {
            let mut response = ResponseBuilder::new().description(description);
            for (name, header) in headers {
                response = response.header(name, header);
            }
            responses.insert(status.to_string(), response.build().into());
        }
    }
}

/// The document's word for the least role an operation needs in `keys`
/// mode: `none`, `operator`, `worker` or `admin`.
pub(crate) const REQUIRED_ROLE: &str = "x-required-role";

/// Writes `access` on every operation of `openapi` ([`REQUIRED_ROLE`]).
pub(crate) fn require(openapi: &mut OpenApi, access: Access) {
    let role = match access {
        Access::Open => "none",
        Access::AtLeast(role) => role.as_str(),
    };
    for item in openapi.paths.paths.values_mut() {
        for operation in operations(item) {
            operation
                .extensions
                .get_or_insert_with(Default::default)
                .merge(
                    ExtensionsBuilder::new()
                        .add(REQUIRED_ROLE, serde_json::Value::from(role))
                        .build(),
                );
        }
    }
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
    ]
    .into_iter()
    .flatten()
}

/// Path and query parameters carry the rule of their kind of field.
fn constrain_parameters(operation: &mut Operation) {
    for parameter in operation.parameters.iter_mut().flatten() {
        let schema: Schema = match (parameter.name.as_str(), &parameter.parameter_in) {
            ("name" | "quota", _) => input::schema::name(),
            // Repeated: `?flow=a&flow=b`, at least one.
            ("flow", ParameterIn::Query) => {
                parameter.required = utoipa::openapi::Required::True;
                ArrayBuilder::new()
                    .items(RefOr::T(input::schema::name()))
                    .min_items(Some(1))
                    .max_items(Some(super::stream::MAX_FLOWS))
                    .into()
            }
            ("since", ParameterIn::Query) => input::schema::duration(),
            ("X-Quota-Route-Class", ParameterIn::Header) => input::schema::name(),
            ("X-Quota-Principal" | "X-Quota-Tenant", ParameterIn::Header) => {
                input::schema::header_identifier()
            }
            ("id", ParameterIn::Path) => ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::Integer))
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                .minimum(Some(i64::MIN))
                .maximum(Some(i64::MAX))
                .into(),
            _ => continue,
        };
        parameter.schema = Some(schema.into());
    }
}

/// Every failure of the JSON API is a problem document; the ones any
/// operation of its shape can answer are added where the handler's own
/// annotation did not name them.
fn document_failures(operation: &mut Operation) {
    let mut failures: Vec<(&str, &str)> = vec![
        ("500", "Internal error; the cause is logged with the request id"),
        (
            "503",
            "The quota store could not be reached in time; nothing was done, try again after Retry-After",
        ),
    ];
    if operation.request_body.is_some() {
        failures.extend([
            ("400", "The body is not JSON"),
            ("413", "The body is too large"),
            ("415", "The body is not application/json"),
            ("422", "A field breaks its rule; the detail names it"),
        ]);
    }
    let parameters = operation.parameters.as_deref().unwrap_or_default();
    if parameters
        .iter()
        .any(|p| matches!(p.parameter_in, ParameterIn::Path))
    {
        failures.push(("400", "A path parameter is not of its type"));
    }
    if !parameters.is_empty() {
        failures.push(("422", "A parameter breaks its rule; the detail names it"));
    }
    // Admin operations always; every other one with `QUOTA_AUTH=keys`.
    failures.extend([
        ("401", "Missing, unknown or revoked bearer token (admin operations; every operation with QUOTA_AUTH=keys)"),
        ("403", "The key's role is too low, another key's lease, or the admin API is disabled (no QUOTA_ADMIN_TOKEN)"),
    ]);
    let responses = &mut operation.responses.responses;
    for (status, description) in failures {
        responses.entry(status.to_string()).or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .build()
                .into()
        });
    }
    for (status, response) in responses.iter_mut() {
        let RefOr::T(response) = response else {
            continue;
        };
        if !status.starts_with(['4', '5']) {
            continue;
        }
        response.content.clear();
        response.content.insert(
            PROBLEM_JSON.to_string(),
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        );
        if status == "503" {
            let seconds: Schema = ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::Integer))
                .minimum(Some(0))
                .into();
            response.headers.insert(
                "Retry-After".to_string(),
                HeaderBuilder::new()
                    .schema(seconds)
                    .description(Some("Seconds to wait before asking again"))
                    .build(),
            );
        }
    }
}
