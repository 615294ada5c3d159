//! The answers the layer makes itself: RFC 9457 problem responses (their `type`s are in
//! [`super::problem`]), the mapping of store errors to them, and `Retry-After`.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, StatusCode};

use super::problem;
use crate::Error;
use crate::error::Field;

/// The media type of every error the layer produces (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The parts of the terminal `500` recorded for a handler that failed after it started.
pub(super) fn handler_failed() -> (StatusCode, HeaderMap, Bytes) {
    problem_parts(
        StatusCode::INTERNAL_SERVER_ERROR,
        problem::HANDLER_FAILED,
        "Handler failed",
        "the handler failed after it started (it panicked, its response body failed, or the \
         service returned an error), so its effect is unknown; this answer is recorded and \
         this key will not run the request again: check the outcome, and use a new key for a \
         new attempt",
    )
}

pub(super) fn plain_response(
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
) -> http::Response<Body> {
    let mut resp = http::Response::new(Body::from(body));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// `500`: the tenant header name given to [`IdempotencyLayer::tenant_header`] is not a header
/// name.
pub(super) fn misconfigured(name: &str) -> http::Response<Body> {
    problem_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        problem::MISCONFIGURED,
        "Idempotency layer misconfigured",
        &format!(
            "the service built its idempotency layer with IdempotencyLayer::tenant_header \
             ({name:?}), which is not a valid HTTP header name; nothing ran and nothing was \
             recorded: the service's configuration must be fixed"
        ),
    )
}

fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0).max(u64::from(d.as_secs() == 0))
}

pub(super) fn in_flight(retry_after: Duration) -> http::Response<Body> {
    let mut resp = problem_response(
        StatusCode::CONFLICT,
        problem::IN_FLIGHT,
        "Request in flight",
        "another request with this idempotency key is being processed; retry after the delay",
    );
    resp.headers_mut().insert(
        RETRY_AFTER,
        HeaderValue::from(retry_after_secs(retry_after)),
    );
    resp
}

pub(super) fn retry_later(detail: &str) -> http::Response<Body> {
    let mut resp = problem_response(
        StatusCode::SERVICE_UNAVAILABLE,
        problem::RETRY,
        "Retry later",
        detail,
    );
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(1u64));
    resp
}

/// All `max` admission permits are taken: `503` at once.
pub(super) fn overloaded(max: usize) -> http::Response<Body> {
    retry_later(&format!(
        "the service is running its limit of {max} idempotency claims; nothing ran and nothing \
         was recorded: retry with the same key after the delay"
    ))
}

pub(super) fn invalid_key(detail: &str) -> http::Response<Body> {
    problem_response(
        StatusCode::BAD_REQUEST,
        problem::INVALID_KEY,
        "Invalid Idempotency-Key",
        detail,
    )
}

pub(super) fn invalid_tenant(detail: &str) -> http::Response<Body> {
    problem_response(
        StatusCode::BAD_REQUEST,
        problem::INVALID_TENANT,
        "Invalid tenant",
        detail,
    )
}

/// `500`: the service's own naming is over the limit; `400` when the request path stood in
/// for the route template (the client chose it).
pub(super) fn invalid_operation(from_path: bool, detail: &str) -> http::Response<Body> {
    let status = if from_path {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    problem_response(
        status,
        problem::INVALID_OPERATION,
        "Invalid operation",
        detail,
    )
}

/// The HTTP answer for a store error (RFC 9457 problem): `PayloadMismatch` → 422; `Empty` /
/// `TooLong` → 400 for the key or the tenant, 500 for the operation (the service's own name);
/// `Busy` / `Aborted` → 503 + `Retry-After: 1`; anything else → 500.
pub fn error_response(e: &Error) -> http::Response<Body> {
    match e {
        Error::PayloadMismatch { .. } => problem_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::KEY_REUSED,
            "Idempotency-Key reused with a different request",
            "this key was first used with a different method, route, headers or body: a new \
             intent needs a new key; a retry must resend the original request",
        ),
        Error::Empty { field } | Error::TooLong { field, .. } => match field {
            Field::Tenant => invalid_tenant(&e.to_string()),
            Field::Operation => invalid_operation(false, &e.to_string()),
            Field::Key => invalid_key(&e.to_string()),
        },
        Error::Busy { .. } | Error::Aborted { .. } => {
            retry_later("nothing was recorded; retry with the same key")
        }
        _ => problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::STORE_FAILED,
            "Idempotency store failed",
            "the outcome of this request may be unknown: retry with the same key",
        ),
    }
}

/// The parts of an RFC 9457 `application/problem+json` answer.
fn problem_parts(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
) -> (StatusCode, HeaderMap, Bytes) {
    let body = serde_json::json!({
        "type": kind,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    (status, headers, Bytes::from(body.to_string()))
}

/// An RFC 9457 `application/problem+json` response.
pub fn problem_response(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
) -> http::Response<Body> {
    let (status, headers, body) = problem_parts(status, kind, title, detail);
    plain_response(status, headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_retry_after() {
        assert_eq!(retry_after_secs(Duration::from_millis(0)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(300)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
    }
}
