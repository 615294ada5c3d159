//! The `idem-http-v1` request fingerprint (`docs/FORMAT.md`, "HTTP layer formats"): what of an
//! HTTP request binds its key. A stored format: any change to its input needs a new tag.

use http::header::{HeaderName, HeaderValue};
use http::request::Parts;

use super::layer::BodyFingerprint;
use crate::model::keys::Fingerprint;

/// The tag of the default fingerprint (the body as sent). Pinned: tests/http_formats_are_pinned.rs.
pub(super) const TAG_RAW: &[u8] = b"idem-http-v1";
/// The tag when the body part is its RFC 8785 canonical JSON.
pub(super) const TAG_CANONICAL_JSON: &[u8] = b"idem-http-v1+jcs";
/// The tag when the body part is what the caller's function picked.
pub(super) const TAG_CUSTOM: &[u8] = b"idem-http-v1+custom";

/// The body part of the fingerprint under `mode`, and its tag.
pub(super) fn body_part<'b>(
    mode: &BodyFingerprint,
    parts: &Parts,
    body: &'b [u8],
) -> (&'static [u8], std::borrow::Cow<'b, [u8]>) {
    use std::borrow::Cow;
    match mode {
        BodyFingerprint::Raw => (TAG_RAW, Cow::Borrowed(body)),
        BodyFingerprint::CanonicalJson => {
            let canonical = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| serde_jcs::to_vec(&v).ok());
            match canonical {
                Some(c) => (TAG_CANONICAL_JSON, Cow::Owned(c)),
                // Not JSON: the bytes as they are (under the default tag: a non-JSON request
                // fingerprints as it did before the option was turned on).
                None => (TAG_RAW, Cow::Borrowed(body)),
            }
        }
        BodyFingerprint::Custom(f) => (TAG_CUSTOM, Cow::Owned(f(parts, body))),
    }
}

/// The request fingerprint: method, operation, path and query, the selected headers and the
/// body, each length-prefixed (so no two different requests concatenate to the same bytes).
pub fn fingerprint(
    parts: &Parts,
    operation: &str,
    headers: &[HeaderName],
    body: &[u8],
) -> Fingerprint {
    fingerprint_tagged(TAG_RAW, parts, operation, headers, body)
}

/// [`fingerprint`] under `tag` (the body part's mode).
pub(super) fn fingerprint_tagged(
    tag: &[u8],
    parts: &Parts,
    operation: &str,
    headers: &[HeaderName],
    body: &[u8],
) -> Fingerprint {
    let mut buf = Vec::with_capacity(64 + body.len());
    let mut put = |b: &[u8]| {
        buf.extend_from_slice(&(b.len() as u64).to_be_bytes());
        buf.extend_from_slice(b);
    };
    put(tag);
    put(parts.method.as_str().as_bytes());
    put(operation.as_bytes());
    // The concrete target too: the operation is the route template, so without it the same
    // key on `/payments/1/refund` and `/payments/2/refund` would replay one for the other.
    put(parts
        .uri
        .path_and_query()
        .map_or(b"".as_slice(), |p| p.as_str().as_bytes()));
    for name in headers {
        put(name.as_str().as_bytes());
        let values: Vec<&HeaderValue> = parts.headers.get_all(name).iter().collect();
        put(&(values.len() as u64).to_be_bytes());
        for v in values {
            put(v.as_bytes());
        }
    }
    put(body);
    Fingerprint::of_bytes(&buf)
}
