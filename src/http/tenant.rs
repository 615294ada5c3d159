//! The tenant rule of a tenant header ([`tenant_from_header`]) and the length check every tenant
//! passes, whatever its source.

use http::HeaderMap;
use http::header::HeaderName;

use super::key::trim_ows;

/// Why a tenant is refused ([`tenant_from_header`]; the layer answers `400`
/// [`problem::INVALID_TENANT`](super::problem::INVALID_TENANT) with this message, naming the header).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidTenant {
    /// The tenant header appears on this many field lines: two lines, or the one line an
    /// intermediary combines them into (`t1, t2`), never name one tenant.
    #[error("the tenant header has {0} field lines: send exactly one tenant")]
    Lines(usize),
    /// The value (without the whitespace around it) has a byte that is not visible ASCII, or
    /// is a comma.
    #[error(
        "the tenant has byte 0x{byte:02x} at offset {at}; a tenant is visible ASCII without \
         ',' or whitespace"
    )]
    BadByte {
        /// The byte.
        byte: u8,
        /// Its offset in the value.
        at: usize,
    },
    /// The tenant is empty.
    #[error("the tenant is empty")]
    Empty,
    /// The tenant is longer than the store's limit ([`crate::store::Limits::max_tenant_len`]).
    #[error("the tenant is {len} bytes, over the store's limit of {max} (Limits::max_tenant_len)")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// The tenant that the request header `name` names in `headers`, checked as
/// [`IdempotencyLayer::tenant_header`](super::IdempotencyLayer::tenant_header) checks it: exactly one field line, whose value (without
/// the whitespace around it) is 1 to `max_len` bytes of visible ASCII without `,`. `Ok(None)`:
/// the header is absent (the layer answers [`problem::MISSING_TENANT`](super::problem::MISSING_TENANT)).
///
/// For a service's own tenant extractor on the routes the layer does not cover (reads), so
/// that every route takes the same tenants; pass the store's
/// [`crate::store::Limits::max_tenant_len`] (`examples/edge_service/` does this).
pub fn tenant_from_header(
    headers: &HeaderMap,
    name: &HeaderName,
    max_len: usize,
) -> Result<Option<String>, InvalidTenant> {
    let mut lines = headers.get_all(name).iter();
    let Some(first) = lines.next() else {
        return Ok(None);
    };
    let more = lines.count();
    if more > 0 {
        return Err(InvalidTenant::Lines(more + 1));
    }
    let v = trim_ows(first.as_bytes());
    if let Some(at) = v
        .iter()
        .position(|&b| !matches!(b, 0x21..=0x7e) || b == b',')
    {
        return Err(InvalidTenant::BadByte { byte: v[at], at });
    }
    // Every byte is visible ASCII (checked above): the conversion cannot fail.
    let tenant =
        String::from_utf8(v.to_vec()).map_err(|_| InvalidTenant::BadByte { byte: 0, at: 0 })?;
    check_tenant_len(&tenant, max_len)?;
    Ok(Some(tenant))
}

/// A tenant from any source is 1 to `max` bytes.
pub(super) fn check_tenant_len(tenant: &str, max: usize) -> Result<(), InvalidTenant> {
    if tenant.is_empty() {
        return Err(InvalidTenant::Empty);
    }
    if tenant.len() > max {
        return Err(InvalidTenant::TooLong {
            len: tenant.len(),
            max,
        });
    }
    Ok(())
}
