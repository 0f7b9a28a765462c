//! `GET /api-docs/openapi.json`: the document says what the running service does.
//!
//! Once an API key is needed, every caller operation requires the Bearer key. While the
//! service is open (`CHECKOUT_AUTH=off`, or `auto` on loopback with no key yet), the key
//! is optional: each such operation's `security` also lists the empty requirement `{}`,
//! as OpenAPI spells "no authentication needed". Both texts are rendered once.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use bytes::Bytes;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::SecurityRequirement;

use super::state::AppState;

pub const PATH: &str = "/api-docs/openapi.json";

#[derive(Clone)]
pub struct ApiDocs {
    required: Bytes,
    open: Bytes,
}

impl ApiDocs {
    pub fn new(required: OpenApi) -> ApiDocs {
        let json = |doc: &OpenApi| Bytes::from(doc.to_json().expect("the document serializes"));
        ApiDocs {
            open: json(&key_optional(required.clone())),
            required: json(&required),
        }
    }
}

/// `doc` with the API key optional wherever it is asked for.
pub fn key_optional(mut doc: OpenApi) -> OpenApi {
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
        ];
        for operation in operations.into_iter().flatten() {
            if let Some(security) = operation.security.as_mut() {
                security.push(SecurityRequirement::default());
            }
        }
    }
    doc
}

pub async fn serve(State((app, docs)): State<(AppState, ApiDocs)>) -> impl IntoResponse {
    let body = if app.gate().is_open() {
        docs.open
    } else {
        docs.required
    };
    ([(header::CONTENT_TYPE, "application/json")], body)
}
