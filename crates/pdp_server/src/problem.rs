//! What every HTTP answer and refusal of the decision point shares, whichever module makes it
//! (the routes, `crate::http`; the bearer-token guard, `crate::auth`; a wait or a decision log
//! that cannot answer): RFC 9457 problem details documents (`application/problem+json`), error
//! texts bounded for echoing, and whether a refused HTTP/1 request's unread body must close its
//! connection.

use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use axum::http::{HeaderValue, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use pdp_core::RequestError;
use serde_json::{Map, Value};

/// An RFC 9457 problem: `type`, `title`, `status`, `detail`, plus `field` (the request field at
/// fault) and `errors` (one entry per bad item of a batch) when they apply.
#[derive(Debug)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// Slug of the problem type; the `type` member is `urn:svc:problem:<slug>`.
    pub slug: &'static str,
    /// Short, fixed summary of the problem type.
    pub title: &'static str,
    /// What exactly was wrong with this request.
    pub detail: String,
    /// The request field at fault, dotted (`context.risk_score`, `evaluations[2].subject.type`).
    pub field: Option<String>,
}

impl Problem {
    /// A problem without a field.
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            field: None,
        }
    }

    /// `400 invalid-request` for a request the engine refused (names the field).
    pub fn request(e: &RequestError) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            slug: "invalid-request",
            title: "The request is not valid",
            detail: bounded(e.to_string()),
            field: Some(bounded(e.field.clone())),
        }
    }

    /// The problem document as JSON.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert(
            "type".into(),
            format!("urn:svc:problem:{}", self.slug).into(),
        );
        m.insert("title".into(), self.title.into());
        m.insert("status".into(), self.status.as_u16().into());
        m.insert("detail".into(), self.detail.clone().into());
        if let Some(f) = &self.field {
            m.insert("field".into(), f.clone().into());
        }
        Value::Object(m)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.to_json()).unwrap_or_default();
        (
            self.status,
            [(
                CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            )],
            body,
        )
            .into_response()
    }
}

/// Longest error text (bytes) echoed back: a request error may quote the request (a context,
/// an unknown type name), and on gRPC the text travels in `grpc-message` and the details
/// trailer, which clients cap (8 KiB of metadata in grpc-java, 16 KiB in grpc-core).
pub const MAX_ERROR_TEXT: usize = 1024;

/// `text` cut to [`MAX_ERROR_TEXT`] bytes (at a character boundary), saying how long it was.
pub fn bounded(text: String) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text;
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &text[..end], text.len())
}

/// Whether `req` is an HTTP/1 request with a body (chunked, or a non-zero `Content-Length`).
/// An answer that does not read the body (a refusal, 404, 405, 413, 415) closes such a
/// connection (`Connection: close`), since what is left of the body would be read as the next
/// request.
pub fn has_h1_body(req: &Request) -> bool {
    req.version() < Version::HTTP_2
        && (req.headers().contains_key(TRANSFER_ENCODING)
            || req
                .headers()
                .get(CONTENT_LENGTH)
                .is_some_and(|v| v.as_bytes() != b"0"))
}
