//! The `idem-http-v1` request fingerprint (`docs/FORMAT.md`, "HTTP layer formats"): what of an
//! HTTP request binds its key. A stored format: any change to its input needs a new tag.

use http::header::{HeaderName, HeaderValue};
use http::request::Parts;

use crate::model::keys::Fingerprint;

/// The request fingerprint: method, operation, path and query, the selected headers and the
/// body, each length-prefixed (so no two different requests concatenate to the same bytes).
pub fn fingerprint(
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
    put(b"idem-http-v1");
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
