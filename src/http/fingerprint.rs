//! The `idem-http-v1` request fingerprint (`docs/FORMAT.md`, "HTTP layer formats"): what of an
//! HTTP request binds its key. A stored format: what goes into it, and which requests get which
//! tag, change only under the rules of docs/FORMAT.md, "Versioning".

use std::borrow::Cow;

use http::header::{HeaderName, HeaderValue};
use http::request::Parts;

use super::json::{canonical, labelled_json};
use super::layer::BodyFingerprint;
use crate::model::keys::Fingerprint;

/// The tag when the body part is the body as sent. Pinned: integration/tests/http/http_formats_are_pinned.rs.
pub(super) const TAG_RAW: &[u8] = b"idem-http-v1";
/// The tag when the body part is the body's RFC 8785 canonical JSON ([`canonical`]).
pub(super) const TAG_CANONICAL_JSON: &[u8] = b"idem-http-v1+jcs";
/// The tag when the body part is what the caller's function picked.
pub(super) const TAG_CUSTOM: &[u8] = b"idem-http-v1+custom";

/// The body part of the fingerprint under `mode`, and its tag. A body compared as JSON whose
/// canonical form would lose something of it (not JSON, a member name twice, a number a double
/// cannot hold: [`canonical`]) is the body as sent, under the raw tag.
pub(super) fn body_part<'b>(
    mode: &BodyFingerprint,
    parts: &Parts,
    body: &'b [u8],
) -> (&'static [u8], Cow<'b, [u8]>) {
    let as_json = match mode {
        BodyFingerprint::ByContentType => labelled_json(&parts.headers),
        BodyFingerprint::CanonicalJson => true,
        BodyFingerprint::Raw => false,
        BodyFingerprint::Custom(f) => return (TAG_CUSTOM, Cow::Owned(f(parts, body))),
    };
    match as_json.then(|| canonical(body)).flatten() {
        Some(c) => (TAG_CANONICAL_JSON, Cow::Owned(c)),
        None => (TAG_RAW, Cow::Borrowed(body)),
    }
}

/// The request fingerprint the layer stores under its default settings: method, operation,
/// path and query, the selected headers and the body, each length-prefixed (so no two different
/// requests concatenate to the same bytes). The body part is the body's RFC 8785 canonical JSON
/// when the request's `Content-Type` is `application/json` or `application/*+json` and the body
/// has such a form (tag `idem-http-v1+jcs`), else the body as sent (tag `idem-http-v1`):
/// `docs/FORMAT.md`, "Request fingerprint".
pub fn request_fingerprint(
    parts: &Parts,
    operation: &str,
    headers: &[HeaderName],
    body: &[u8],
) -> Fingerprint {
    let (tag, body) = body_part(&BodyFingerprint::default(), parts, body);
    fingerprint_tagged(tag, parts, operation, headers, &body)
}

/// [`request_fingerprint`] under `tag` (the body part's mode).
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
