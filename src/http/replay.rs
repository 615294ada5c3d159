//! The HTTP answer of a stored response (a replay) or of a tombstone: what a retry gets
//! without the handler running.

use axum::body::Body;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, LOCATION};
use http::{HeaderMap, StatusCode};

use super::answers::{plain_response, problem_response};
use super::envelope::decode_envelope;
use super::problem;
use crate::Response;
use crate::model::response::Tombstone;

/// The response header set on every replayed answer (Stripe's convention).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The response header (`true`) on a replay whose body was not kept: the handler's answer was
/// over the store's `max_response_bytes`, so only its status, the replayed headers that do not
/// describe the body, and `Location` were recorded. The handler ran once; it does not run again.
pub const IDEMPOTENT_BODY_OMITTED: &str = "idempotent-body-omitted";

fn replayed(resp: &mut http::Response<Body>) {
    resp.headers_mut().insert(
        HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
}

/// The HTTP answer for a stored response: its status, body and recorded headers, plus
/// `Idempotent-Replayed: true`; for an answer whose body was not kept, an empty body,
/// [`IDEMPOTENT_BODY_OMITTED`]`: true` and the `Location` of the resource pointer.
pub fn replay(stored: &Response) -> http::Response<Body> {
    let Some(envelope) = decode_envelope(stored.body()) else {
        return problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::STORE_FAILED,
            "Stored answer unreadable",
            "the recorded answer for this key is damaged; an operator can inspect it with `idem get`",
        );
    };
    let status = StatusCode::from_u16(stored.status()).unwrap_or(StatusCode::OK);
    let mut resp = plain_response(status, envelope.headers, envelope.body);
    if envelope.body_omitted {
        resp.headers_mut().insert(
            HeaderName::from_static(IDEMPOTENT_BODY_OMITTED),
            HeaderValue::from_static("true"),
        );
        if !resp.headers().contains_key(LOCATION)
            && let Some(r) = stored.resource().filter(|r| r.kind == "location")
            && let Ok(v) = HeaderValue::from_str(&r.id)
        {
            resp.headers_mut().insert(LOCATION, v);
        }
    }
    replayed(&mut resp);
    resp
}

/// The HTTP answer for an intent that finished longer ago than the retention: the original
/// status and `Location` (when it had one), no body, `Idempotent-Replayed: true`. The handler
/// is not called.
pub fn expired(tombstone: &Tombstone) -> http::Response<Body> {
    let status = StatusCode::from_u16(tombstone.status()).unwrap_or(StatusCode::OK);
    let mut resp = plain_response(status, HeaderMap::new(), Bytes::new());
    if let Some(r) = tombstone.resource().filter(|r| r.kind == "location")
        && let Ok(v) = HeaderValue::from_str(&r.id)
    {
        resp.headers_mut().insert(LOCATION, v);
    }
    replayed(&mut resp);
    resp
}
