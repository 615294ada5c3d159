//! NOT PUBLIC API (feature `__internal_whitebox`): the parsers of request bytes the layer uses,
//! exactly as it calls them, for idem's own fuzz targets. Hidden from the docs, never stable.

use http::HeaderMap;

pub use super::key::KeyError;

/// The `Idempotency-Key` value parser of one field line ([`KeyError::Lines`] is the caller's).
pub fn parse_key(value: &[u8], max_len: usize) -> Result<String, KeyError> {
    super::key::parse_key(value, max_len)
}

/// Whether a `Content-Type` value is a media type naming JSON.
pub fn is_json_media_type(value: &[u8]) -> bool {
    super::json::is_json_media_type(value)
}

/// Whether a request's headers label its body JSON (exactly one `Content-Type` line naming it).
pub fn labelled_json(headers: &HeaderMap) -> bool {
    super::json::labelled_json(headers)
}

/// The RFC 8785 canonical form of a body, when it keeps everything of it.
pub fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    super::json::canonical(body)
}
